"""Whole numbers written as floats in JSON bodies (``service/api/number_types.py``): where they are the integer they
write, and where they are refused because they may be another integer rounded."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from _api_support import R, W, served_world

from align.exceptions import InputError
from service.api import fastpath

SAFE = 2**53 - 1  # JavaScript's Number.MAX_SAFE_INTEGER: the largest integer no other integer rounds to as a float


def test_a_whole_float_of_2_to_the_53_is_refused_as_the_integer_it_may_have_been_rounded_from(tmp_path):
    """``abs(value) > 2**53`` let 9007199254740992.0 through, the float 2**53 + 1 rounds to: deleting ids
    ``[9007199254740993.0]`` (as JSON a float writes it) deleted id 2**53, a row the user never named. A whole float
    is now taken below 2**53 only (up to 2**53 - 1); an integer literal stays exact at any 64-bit size."""
    with served_world(tmp_path) as (c, _, world):
        rows = world["Y"][:4].tolist()
        ids = [float(SAFE), 2**53, 2**53 + 1, 7]  # the first a whole float, the rest integer literals
        r = c.post("/v1/indexes", headers=W, json={"name": "big", "space": "b", "vectors": rows, "ids": ids})
        assert r.status_code == 201 and r.json()["count"] == 4, r.text
        for sent in (float(2**53), float(2**53 + 1), -float(2**53)):
            r = c.post("/v1/indexes/big/delete", headers=W, json={"ids": [sent]})
            assert r.status_code == 422 and "2**53 or more" in r.json()["error"]["message"], (sent, r.text)
        assert c.get("/v1/indexes/big", headers=W).json()["count"] == 4  # id 2**53 still there
        r = c.post("/v1/indexes/big/delete", headers=W, json={"ids": [2**53 + 1]})  # the literal: exactly that id
        assert r.status_code == 200 and r.json()["deleted"] == 1, r.text
        r = c.post("/v1/indexes/big/delete", headers=W, json={"ids": [float(SAFE)]})  # 2**53 - 1 as a float: taken
        assert r.status_code == 200 and r.json()["deleted"] == 1, r.text
        r = c.post("/v1/indexes/big/search", headers=W, json={"vectors": rows, "k": 4, "exact": True})
        assert r.status_code == 200, r.text
        assert {h["id"] for hits in r.json()["results"] for h in hits} == {2**53, 7}


def _b64(A) -> str:
    return base64.b64encode(np.ascontiguousarray(A, np.float32).tobytes()).decode()


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "app"])
def test_vectors_b64_takes_a_whole_float_dim_as_every_integer_field_does(tmp_path, monkeypatch, fast):
    """The options models took ``"dim": 16.0`` as 16, but the codec read ``dim`` from the raw JSON and refused
    the float: ``vectors_b64`` with ``"dim": 16.0`` was a 422 ``vectors_b64 needs "dim"`` on transform (fast path
    and route), index create and search, a fit side, a plan's sets and a steer fit. Each now reads it as 16; a
    fraction is still a 422 naming it."""
    if not fast:
        monkeypatch.setattr(fastpath, "FAST_MAX_BYTES", -1)
    with served_world(tmp_path) as (c, _, world):
        X, Y = world["X"], world["Y"]
        r = c.post("/v1/maps/a2b/transform?encoding_format=base64", headers=R,
                   json={"vectors_b64": _b64(X[:3]), "dim": 16.0})
        assert r.status_code == 200 and r.headers["x-shape"] == "3,16", r.text
        want = world["a2b"].apply(X[:3])
        np.testing.assert_allclose(np.frombuffer(base64.b64decode(r.json()["vectors_b64"]), "<f4").reshape(3, 16),
                                   want, atol=1e-5)
        r = c.post("/v1/indexes", headers=W,
                   json={"name": "ib", "space": "b", "vectors_b64": _b64(Y[:50]), "dim": 16.0})
        assert r.status_code == 201 and r.json()["count"] == 50, r.text
        r = c.post("/v1/indexes/ib/search", headers=R, json={"vectors_b64": _b64(Y[:2]), "dim": 16.0, "k": 1})
        assert r.status_code == 200 and [h[0]["id"] for h in r.json()["results"]] == [0, 1], r.text
        r = c.post("/v1/fits", headers=W, json={
            "name": "whole", "source_space": "a", "target_space": "b", "method": "procrustes",
            "source": {"vectors_b64": _b64(X[:100]), "dim": 16.0}, "target": {"vectors": Y[:100].tolist()}})
        assert r.status_code == 202, r.text
        r = c.post("/v1/steers", headers=W, json={"name": "st", "space": "b", "vectors_b64": _b64(Y[:20]),
                                                  "dim": 16.0, "labels": [1, -1] * 10,
                                                  "params": {"method": "mean-shift"}})
        assert r.status_code == 202, r.text
        r = c.post("/v1/plans", headers=R, json={"old": {"vectors_b64": _b64(Y[:200]), "dim": 16.0},
                                                 "probe_source": {"vectors_b64": _b64(X[:60]), "dim": 16.0},
                                                 "probe_target": {"vectors": Y[:60].tolist(), "dim": 16.0}})
        assert r.status_code == 200, r.text
        for url, body, says in (
                ("/v1/maps/a2b/transform", {"vectors_b64": _b64(X[:3]), "dim": 16.5}, "got 16.5"),
                ("/v1/indexes/ib/search", {"vectors_b64": _b64(Y[:2]), "dim": 16.5}, "got 16.5"),
                ("/v1/fits", {"name": "half", "source_space": "a", "target_space": "b", "method": "procrustes",
                              "source": {"vectors_b64": _b64(X[:100]), "dim": 16.5},
                              "target": {"vectors": Y[:100].tolist()}}, "source.dim must be an integer, got 16.5"),
                ("/v1/fits", {"name": "nan", "source_space": "a", "target_space": "b", "method": "procrustes",
                              "source": {"vectors_b64": _b64(X[:100]), "dim": float(2**53)},
                              "target": {"vectors": Y[:100].tolist()}}, "source.dim must be an integer")):
            r = c.post(url, headers=W, json=body)
            assert r.status_code == 422 and says in r.json()["error"]["message"], (url, r.text)
        assert c.get("/v1/maps/half", headers=R).status_code == 404


@pytest.mark.parametrize("sent", [1e300, float(2**53)], ids=["1e300", "2**53+0.0"])
def test_an_index_parameter_takes_whole_floats_by_the_same_rule(tmp_path, capsys, sent):
    """Index parameters (``params`` of an index create, ``--param`` of the CLI) read whole floats by their own rule,
    with no 2**53 bound: 1e300 was the integer 10**300-and-change, refused by its range with a 301-digit number the
    user never wrote, and 2**53 + 0.0 was 9007199254740992 exactly. They follow every integer field's rule now
    (``service.limits.whole_int``), each within its own range (a whole float below 2**53 is still its integer)."""
    from conftest import run_cli

    with served_world(tmp_path) as (c, _, world):
        rows = world["Y"][:50].tolist()
        for kind, key in (("hnsw", "M"), ("hnsw", "ef_search"), ("ivf", "nlist"), ("flat", "random_state")):
            r = c.post("/v1/indexes", headers=W, json={"name": "ix", "space": "b", "vectors": rows, "kind": kind,
                                                       "params": {key: sent}})
            message = r.json()["error"]["message"]
            assert r.status_code == 422 and f"index parameter {key} must be an integer" in message, (key, r.text)
            assert "2**53 or more" in message and len(message) < 300, (key, message)
        r = c.post("/v1/indexes", headers=W, json={"name": "ix", "space": "b", "vectors": rows, "kind": "hnsw",
                                                   "params": {"M": 16.0, "ef_search": float(2**15)}})
        assert r.status_code == 201 and r.json()["params"]["M"] == 16 and r.json()["params"]["ef_search"] == 2**15
    np.save(tmp_path / "x.npy", np.asarray(rows, np.float32))
    d = ["--data-dir", str(tmp_path / "cli")]
    assert run_cli(capsys, *d, "spaces", "add", "s", "--dim", "16")[0] == 0
    code, _, err = run_cli(capsys, *d, "index", "create", "ix", "--space", "s", str(tmp_path / "x.npy"), "--kind",
                           "hnsw", "--param", f"M={sent!r}", "--quiet")
    assert code == 2 and err.count("\n") == 1 and "index parameter M must be an integer" in err, err
    assert "2**53 or more" in err, err


@pytest.mark.parametrize("value", [np.float64(32.0), np.float32(32.0), 32.0, 32], ids=repr)
def test_an_index_parameter_given_as_a_numpy_float_is_its_integer(value):
    """``np.float64(32.0)`` (a parameter read from an array, or from a config NumPy parsed) was accepted as 32 when
    any ``float`` subclass with no fraction was, then refused "must be an integer, got np.float64(32.0)" once
    whole_int took ``float`` itself only; a NumPy float is read as the float it holds, by the same rule."""
    from service.limits import check_index_params, seed_of

    params = check_index_params("hnsw", {"M": value, "ef_search": value})
    assert params["M"] == 32 and type(params["M"]) is int and type(params["ef_search"]) is int, params
    assert seed_of(None, value, True) == 32 and type(seed_of(None, value, True)) is int
    with pytest.raises(InputError, match=r"M must be an integer, got 32\.5 \(a fraction is not rounded\)"):
        check_index_params("hnsw", {"M": np.float64(32.5)})
    with pytest.raises(InputError, match=r"2\*\*53 or more"):
        check_index_params("hnsw", {"M": np.float64(2.0**53)})


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), np.float64("nan"), np.float32("inf")],
                         ids=repr)
def test_a_non_finite_number_is_said_to_be_one_not_a_fraction(value):
    """NaN and infinity were refused "(a fraction is not rounded)": neither is a fraction."""
    from service.limits import check_index_params, whole_int

    with pytest.raises(InputError, match=r"M must be an integer, got -?(nan|inf) \(not a finite number\)$"):
        check_index_params("hnsw", {"M": value})
    if type(value) is float:
        with pytest.raises(ValueError, match=r"\(not a finite number\)$") as info:
            whole_int(value)
        assert "fraction" not in str(info.value)
