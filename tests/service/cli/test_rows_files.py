"""``--rows FILE``: the rows ``plan --rows-out`` writes go straight into fit / eval / transform (and their kin), and
``plan --k`` (HTTP ``k``) gives the rows for a budget of the user's. Before, ``--rows`` took START:STOP only, so the
README's step 2 (re-embed the planned rows, fit on them) needed a hand-written numpy snippet, and the plan wrote
rows only for the K it recommended."""

from __future__ import annotations

import base64
import hashlib
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _api_support import R, settings_for
from conftest import run_cli as run
from fastapi.testclient import TestClient

import align
from service.api import create_app
from service.io import write_vectors


@pytest.fixture
def data(tmp_path):
    rng = np.random.default_rng(0)
    X = (rng.normal(size=(12, 16)) * 2)[rng.integers(0, 12, 900)] + rng.normal(size=(900, 16))
    Y = X @ rng.normal(size=(16, 12)) + 0.05 * rng.normal(size=(900, 12))
    write_vectors(tmp_path / "old.npy", X)
    write_vectors(tmp_path / "new.npy", Y)
    return tmp_path


def _plan(d, *extra):
    return ["--data-dir", d / "var", "plan", "--old", d / "old.npy", "--probe-source", d / "old.npy",
            "--probe-target", d / "new.npy", "--probe-rows", "0:300", "--quiet", *extra]


def test_plan_rows_file_feeds_fit_and_transform(capsys, data):
    d = data
    code, out, err = run(capsys, *_plan(d, "--k", "250", "--rows-out", d / "rows.npy", "--json"))
    assert code == 0, err
    res, rows = json.loads(out), np.load(d / "rows.npy")
    # --k: the rows for that budget, drawn where the plan draws its own (align.plan_migration's rows_k)
    assert res["rows_k"] == 250 and res["rows_to_embed"] == rows.tolist() and rows.size == 250
    old, new = np.load(d / "old.npy"), np.load(d / "new.npy")
    assert rows.tolist() == align.plan_migration(old, old[:300], new[:300], rows_k=250)["rows_to_embed"]
    write_vectors(d / "new_pairs.npy", np.load(d / "new.npy")[rows])  # "re-embedded" with the new model
    var = ["--data-dir", d / "var"]
    code, out, err = run(capsys, *var, "fit", "--source", d / "old.npy", "--source-rows", d / "rows.npy",
                         "--target", d / "new_pairs.npy", "--method", "ridge", "--name", "m", "--json", "--quiet")
    assert code == 0, err
    rec = json.loads(out)
    inputs = rec["inputs"]
    # the indices' sha256 (int64, listed order) too: a rows.npy overwritten after the fit is told from this one
    digest = hashlib.sha256(rows.astype(np.int64).tobytes()).hexdigest()
    assert inputs["source"]["rows"] == f"{d / 'rows.npy'} (250 rows, sha256 {digest})"
    assert inputs["source"]["shape"] == [250, 16]
    code, _, err = run(capsys, *var, "fit", "--source", d / "old.npy", "--target", d / "new.npy", "--rows",
                       "0:900", "--method", "ridge", "--name", "ref", "--quiet")
    assert code == 0, err
    # the same map as from the rows gathered by hand (the README's numpy snippet)
    write_vectors(d / "old_pairs.npy", np.load(d / "old.npy")[rows])
    assert run(capsys, *var, "fit", "--source", d / "old_pairs.npy", "--target", d / "new_pairs.npy", "--method",
               "ridge", "--name", "hand", "--quiet")[0] == 0
    for name in ("m", "hand"):
        code, _, err = run(capsys, *var, "transform", "--map", name, "--rows", d / "rows.npy", d / "old.npy",
                           d / f"{name}.npy", "--quiet", "--chunk-rows", "64")
        assert code == 0, err
    np.testing.assert_allclose(np.load(d / "m.npy"), np.load(d / "hand.npy"), atol=1e-5)
    assert np.load(d / "m.npy").shape == (250, 12)
    # listed order is kept, and a parquet's other columns travel with their rows
    order = np.array([5, 2, 700, 3])
    np.save(d / "order.npy", order)
    ids = np.arange(900) * 10
    pq.write_table(pa.table({"id": ids, "vector": np.load(d / "old.npy").tolist()}), d / "old.parquet")
    code, _, err = run(capsys, *var, "transform", "--map", "m", "--rows", d / "order.npy", d / "old.parquet",
                       d / "o.parquet", "--quiet", "--chunk-rows", "3")
    assert code == 0, err
    t = pq.read_table(d / "o.parquet")
    assert t.column("id").to_pylist() == (ids[order]).tolist()
    code, _, err = run(capsys, *var, "transform", "--map", "m", "--rows", d / "order.npy", d / "old.npy",
                       d / "o.npy", "--quiet")
    np.testing.assert_allclose(np.asarray(t.column("vector").to_pylist()), np.load(d / "o.npy"), atol=1e-6)
    # eval takes a rows file as well
    code, out, err = run(capsys, *var, "eval", "--map", "m", "--source", d / "old.npy", "--target", d / "new.npy",
                         "--rows", d / "order.npy", "--json")
    assert code == 0 and json.loads(out)["n_candidates"] == 4, err


@pytest.mark.parametrize("rows, msg", [
    (np.array([1, -2]), "row index -2 is negative"),
    (np.array([1, 2, 2]), "row 2 is listed more than once"),
    (np.array([1.0, 2.0]), "must be a 1-d list of integers"),
    (np.zeros((2, 2), np.int64), "must be a 1-d list of integers"),
    (np.zeros(0, np.int64), "holds no row indices"),
    (np.array([1, 900]), "row index 900 is outside the file's 900 rows (listed in rows.npy)"),
    # a uint64 above int64's range wrapped: "row index -9223372036854775804 is outside ..."
    (np.array([1, 2**63 + 4], np.uint64), "row index 9223372036854775812 is past the rows of any file"),
    (None, "neither START:STOP nor a file of row indices: no such file"),
])
def test_a_bad_rows_file_is_one_line_and_exit_2(capsys, data, rows, msg):
    d = data
    path = d / "rows.npy"
    if rows is not None:
        np.save(path, rows)
    for args in (["fit", "--source", d / "old.npy", "--target", d / "new.npy", "--rows", path, "--method", "ridge",
                  "--name", "m"],
                 ["transform", "--map", "m", "--rows", path, d / "old.npy", d / "o.npy"],
                 ["plan", "--old", d / "old.npy", "--old-rows", path, "--probe-source", d / "old.npy",
                  "--probe-target", d / "new.npy", "--probe-rows", "0:300"]):
        if args[0] == "transform":
            assert run(capsys, "--data-dir", d / "var", "fit", "--source", d / "old.npy", "--target",
                       d / "new.npy", "--method", "ridge", "--name", "m", "--quiet")[0] == 0
        code, _, err = run(capsys, "--data-dir", d / "var", *args)
        assert code == 2 and msg in err and len(err.splitlines()) == 1, (args[0], err)
        assert not (d / "o.npy").exists()


def test_plan_old_rows_file_numbers_rows_of_old(capsys, data):
    d = data
    np.save(d / "sub.npy", np.arange(899, 199, -1))  # rows 899 down to 200: the plan's rows index old.npy itself
    code, out, err = run(capsys, *_plan(d, "--old-rows", d / "sub.npy", "--k", "50", "--json"))
    assert code == 0, err
    got = json.loads(out)["rows_to_embed"]
    old, new = np.load(d / "old.npy"), np.load(d / "new.npy")
    alone = align.plan_migration(old[np.arange(899, 199, -1)], old[:300], new[:300], rows_k=50)["rows_to_embed"]
    assert got == [899 - int(i) for i in alone] and min(got) >= 200


def test_http_plan_takes_k(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 16)).astype(np.float32)
    Y = (X @ rng.normal(size=(16, 12))).astype(np.float32)

    def b64(A):
        return {"vectors_b64": base64.b64encode(A.tobytes()).decode(), "dim": A.shape[1]}

    body = {"old": b64(X), "probe_source": b64(X[:200]), "probe_target": b64(Y[:200])}
    with TestClient(create_app(settings_for(tmp_path))) as c:
        r = c.post("/v1/plans", json={**body, "k": 37}, headers=R)
        assert r.status_code == 200, r.text
        assert r.json()["rows_k"] == 37
        assert r.json()["rows_to_embed"] == align.plan_migration(X, X[:200], Y[:200], rows_k=37)["rows_to_embed"]
        own = c.post("/v1/plans", json=body, headers=R).json()  # the recommended K asked for: the plan's own rows
        r = c.post("/v1/plans", json={**body, "k": own["recommended"]["k"]}, headers=R)
        assert r.json()["rows_to_embed"] == own["rows_to_embed"]
        r = c.post("/v1/plans", json={**body, "k": 401}, headers=R)
        assert r.status_code == 422 and "k 401 is more rows than old holds (400)" in r.text, r.text
        for bad in (0, 401, "a", True):
            r = c.post("/v1/plans", json={**body, "k": bad}, headers=R)
            assert r.status_code == 422 and r.json().get("detail") or r.json(), r.text


def test_plan_k_of_the_recommended_k_gives_the_plans_own_rows(capsys, data):
    """--k re-drew the rows with a fresh seed, while the plan draws its own from its partly used generator: asking
    for the recommended K gave other rows than the plan's own (27 of 100 shared)."""
    d = data
    code, out, err = run(capsys, *_plan(d, "--json"))
    assert code == 0, err
    own = json.loads(out)
    code, out, err = run(capsys, *_plan(d, "--k", str(own["recommended"]["k"]), "--json"))
    assert code == 0, err
    assert json.loads(out)["rows_to_embed"] == own["rows_to_embed"]


def test_plan_k_past_the_old_rows_is_refused_before_the_plan_runs(capsys, data):
    """--k 901 of 900 rows ran the whole plan first and then said "cannot select 901 rows out of 900", naming no
    option. A probe too small to plan from shows the order: the --k error comes first."""
    d = data
    small = [a if a != "0:300" else "0:10" for a in _plan(d)]
    code, _, err = run(capsys, *small, "--k", "901")
    assert code == 2 and "--k 901 is more rows than --old holds (900)" in err and len(err.splitlines()) == 1, err
    code, _, err = run(capsys, *small, "--k", "900")
    assert code == 2 and "--k" not in err and "probe" in err, err  # 900 is allowed: the plan's own error


def test_index_and_verify_rows_options_take_a_rows_file(capsys, data, tmp_path):
    """README: "any --rows option takes START:STOP or such a file"; index create / add / search --rows and verify
    --heldout-rows took START:STOP only ("rows must look like START:STOP, got 'rows.npy'"). The listed rows go in
    the order listed, and --ids (one per row) follows them."""
    d = data
    var = ["--data-dir", d / "var"]
    order = np.array([7, 3, 500, 11])
    np.save(d / "order.npy", order)
    np.save(d / "ids.npy", np.array([70, 30, 5000, 110]))
    assert run(capsys, *var, "spaces", "add", "o", "--dim", "16")[0] == 0
    code, _, err = run(capsys, *var, "index", "create", "ix", "--space", "o", d / "old.npy", "--rows", d / "order.npy",
                       "--ids", d / "ids.npy", "--kind", "flat", "--quiet")
    assert code == 0, err
    assert run(capsys, *var, "index", "add", "ix", d / "old.npy", "--rows", "20:22", "--quiet")[0] == 0
    np.save(d / "q.npy", np.array([500, 3]))
    code, out, err = run(capsys, *var, "index", "search", "ix", d / "old.npy", "--rows", d / "q.npy", "--k", "1",
                         "--json")
    assert code == 0, err
    assert [r[0]["id"] for r in json.loads(out)["results"]] == [5000, 30]  # each query its own row, listed order
    np.save(d / "far.npy", np.array([1, 900]))
    code, _, err = run(capsys, *var, "verify", "--store", f"qdrant://{tmp_path}/q", "--collection", "c",
                       "--heldout-source", d / "old.npy", "--heldout-target", d / "new.npy", "--map", "m",
                       "--heldout-rows", d / "far.npy")
    assert code == 2 and "row index 900 is outside the file's 900 rows" in err, err  # read as rows, not START:STOP


def test_every_rows_option_is_of_the_rows_type():
    """The README's "any --rows option takes START:STOP or such a file", checked on the source: every option named
    --rows or --*-rows that selects rows (not a count: --chunk-rows, --shard-rows) is of the ROWS type."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[3] / "service"
    found = []
    for p in [*root.glob("cli/*.py"), root / "vectordb" / "__main__.py"]:
        for m in re.finditer(r'option\(\s*"(--(?:[a-z-]+-)?rows)"([^)]*)', p.read_text()):
            if m.group(1) not in ("--chunk-rows", "--shard-rows"):
                found.append((p.name, m.group(1), "type=ROWS" in m.group(2)))
    assert len(found) >= 8 and all(ok for *_, ok in found), found
