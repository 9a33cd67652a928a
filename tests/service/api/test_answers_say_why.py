"""What a QA pass of the HTTP API found answered without a word, or in Python's words (session 55):

- an IVF search whose probed lists held fewer than k rows answered short lists with no note;
- POST /v1/steers/{ref}/apply (and `vecbridge steer apply`) of an all-zero row answered zeros, where a transform
  refuses zero rows;
- a .npy body whose header claims a huge shape was allocated per the header ("Unable to allocate 140. TiB");
- GET /v1/jobs?kind=bogus answered an empty 200 (state=bogus is a 422); a foreign cursor on an empty list answered
  200 where a list with items answers 422; "body must be a JSON object, got NoneType" named a Python type.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from _api_support import R, W, served_world, vectors_b64
from conftest import run_cli

from align.steer import MeanShift


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("say_why")
    with served_world(tmp) as (client, app, data):
        yield client, app, {**data, "tmp": tmp}


def test_an_ivf_search_that_got_fewer_than_k_hits_says_why(world):
    c, _, data = world
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 16)).astype(np.float32)
    r = c.post("/v1/indexes", headers=W, json={"name": "sparse", "space": "a", "kind": "ivf",
                                               "params": {"nlist": 16, "nprobe": 1}, **vectors_b64(X)})
    assert r.status_code == 201, r.text
    body = {"k": 50, **vectors_b64(X[:4])}
    r = c.post("/v1/indexes/sparse/search", headers=R, json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert any(len(hits) < 50 for hits in out["results"])
    assert "got fewer than k=50 hits" in out["note"] and "raise nprobe (at most 16)" in out["note"], out["note"]
    for more in ({"nprobe": 16}, {"exact": True}):  # every list probed, or every row scored: k hits, no note
        r = c.post("/v1/indexes/sparse/search", headers=R, json={**body, **more})
        assert r.status_code == 200 and all(len(h) == 50 for h in r.json()["results"]), r.text
        assert "note" not in r.json(), r.json()["note"]
    r = c.post("/v1/indexes/sparse/search", headers=R, json={"k": 201, "exact": True, **vectors_b64(X[:1])})
    assert r.status_code == 200 and r.json()["note"].endswith("the index holds 200 rows"), r.text


def test_a_steer_refuses_an_all_zero_row_in_the_words_of_a_transform(world, capsys):
    c, app, data = world
    app.state.vb.registry.register_steer("lift", MeanShift(np.ones(16, np.float32)), space="a")
    Q = np.array(data["X"][:3])
    Q[1] = 0.0
    for url in ("/v1/steers/lift/apply", "/v1/maps/a2b/transform"):
        r = c.post(url, headers=R, json={"vectors": Q.tolist(), **({"eps": 1.0} if "steers" in url else {})})
        assert r.status_code == 422, (url, r.text)
        msg = r.json()["error"]["message"]
        assert msg.startswith("vectors: 1 all-zero row(s) (row 1); a zero row has no direction"), (url, msg)
    r = c.post("/v1/steers/lift/apply", headers=R, json={"vectors": data["X"][:3].tolist(), "eps": 1.0})
    assert r.status_code == 200, r.text
    # `vecbridge steer apply` as well, naming the row of the file (--rows 2:5: the file's row 3)
    rows = np.array(data["X"][:6])
    rows[3] = 0.0
    np.save(data["tmp"] / "q.npy", rows)
    base = ("--data-dir", data["tmp"] / "data", "steer", "apply", "--steer", "lift", "--eps", "1")
    code, _, err = run_cli(capsys, *base, data["tmp"] / "q.npy", data["tmp"] / "out.npy", "--rows", "2:5")
    assert code == 2 and "q.npy: 1 all-zero row(s) in the first 3 rows read (input row 3); a zero row has no " \
                          "direction, and steering it answers zeros" in err, err
    assert not (data["tmp"] / "out.npy").exists()
    code, _, err = run_cli(capsys, *base, data["tmp"] / "q.npy", data["tmp"] / "out.npy", "--rows", "0:3")
    assert code == 0 and (data["tmp"] / "out.npy").exists(), err


def _npy(shape, payload: bytes) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return buf.getvalue() + payload


def test_a_npy_header_is_checked_against_the_body_before_anything_is_allocated(world):
    c, _, _ = world
    hdr = {**R, "content-type": "application/x-npy"}
    url = "/v1/maps/a2b/transform"
    r = c.post(url, headers=hdr, content=_npy((10**7, 10**6), b"\0" * 64))
    assert r.status_code == 422, r.text
    msg = r.json()["error"]["message"]
    assert "claims a 10000000 x 1000000 array of float32 (40000000000000 bytes)" in msg and "64 bytes" in msg, msg
    assert "allocate" not in msg
    r = c.post(url, headers=hdr, content=_npy((2000, 16), b"\0" * (2000 * 16 * 4)))  # whole, over max_batch
    assert r.status_code == 413 and "2000 rows" in r.text, r.text
    r = c.post(url, headers=hdr, content=_npy((3, 16), np.ones((3, 16), "<f4").tobytes()))
    assert r.status_code == 200 and r.headers["X-Shape"] == "3,16", r.headers


def test_unknown_job_kinds_foreign_cursors_and_json_types_are_refused_in_the_clients_words(world):
    c, _, _ = world
    r = c.get("/v1/jobs?kind=bogus", headers=R)
    assert r.status_code == 422 and "'fit'" in r.text and "'migration'" in r.text, r.text
    r = c.get("/v1/jobs?kind=fit&kind=verify", headers=R)
    assert r.status_code == 200, r.text
    foreign = "eyJhIjoxfQ"  # {"a": 1}: a cursor, of no list
    for url in ("/v1/migrations", "/v1/maps", "/v1/maps/a2b/versions"):  # /v1/migrations is empty here
        r = c.get(f"{url}?cursor={foreign}", headers=R)
        assert r.status_code == 422 and "cursor does not belong to this list" in r.text, (url, r.text)
    for body, said in ((b"null", "null"), (b"[1]", "array"), (b'"s"', "string"), (b"3", "number"),
                       (b"true", "boolean")):
        r = c.post("/v1/fits", headers={**W, "content-type": "application/json"}, content=body)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["message"] == f"body must be a JSON object, got {said}", r.text
