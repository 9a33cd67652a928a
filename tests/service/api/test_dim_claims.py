"""A `dim` that contradicts the rows is refused, not ignored (an HTTP QA pass: a JSON search with `"dim": 100` beside
384-wide rows, a JSON transform with `?dim=100`, and `?dim=384` against `X-Vector-Dim: 192` all answered 200)."""

from __future__ import annotations

import numpy as np

from _api_support import R, W, served_world


def test_a_dim_the_rows_contradict_is_a_422(tmp_path):
    with served_world(tmp_path) as (c, app, world):
        X = world["X"][:3]
        rows = X.tolist()
        r = c.post("/v1/maps/a2b/transform", headers=R, json={"vectors": rows, "dim": 100})
        assert r.status_code == 422 and "the rows have 16 columns, but dim=100 says otherwise" in r.text, r.text
        r = c.post("/v1/maps/a2b/transform?dim=100", headers=R, json={"vectors": rows})
        assert r.status_code == 422 and "?dim= says 100" in r.text, r.text
        body = np.ascontiguousarray(X, dtype="<f4").tobytes()
        r = c.post("/v1/maps/a2b/transform?dim=16", headers={**R, "content-type": "application/octet-stream",
                                                              "x-vector-dim": "8"}, content=body)
        assert r.status_code == 422 and "disagree" in r.text, r.text
        for ok in ({"vectors": rows, "dim": 16}, {"vectors": rows}):   # a dim that agrees, or none: as before
            assert c.post("/v1/maps/a2b/transform", headers=R, json=ok).status_code == 200
        r = c.post("/v1/maps/a2b/transform?dim=16", headers={**R, "content-type": "application/octet-stream",
                                                              "x-vector-dim": "16"}, content=body)
        assert r.status_code == 200 and len(r.content) == 3 * 16 * 4
        r = c.post("/v1/indexes", headers=W, json={"name": "ib", "space": "b", "vectors": world["Y"][:50].tolist()})
        assert r.status_code == 201, r.text
        r = c.post("/v1/indexes/ib/search", headers=R, json={"vectors": world["Y"][:2].tolist(), "dim": 100})
        assert r.status_code == 422 and "dim=100 says otherwise" in r.text, r.text
        r = c.post("/v1/indexes/ib/search", headers=R, json={"vectors": world["Y"][:2].tolist(), "dim": 16})
        assert r.status_code == 200, r.text


def test_an_index_create_with_a_dim_its_space_contradicts_is_a_422(tmp_path):
    """``POST /v1/indexes`` with no rows and a ``dim`` other than its space's answered 201 with an index of the
    space's width (the dim ignored); with rows the same claim was already refused."""
    with served_world(tmp_path) as (c, _, world):
        for body in ({"dim": 9}, {"dim": 9, "vectors": world["Y"][:5].tolist()}):
            r = c.post("/v1/indexes", headers=W, json={"name": "emp", "space": "b", **body})
            assert r.status_code == 422 and "dim=9" in r.text, r.text
            assert c.get("/v1/indexes/emp", headers=R).status_code == 404
        r = c.post("/v1/indexes", headers=W, json={"name": "emp", "space": "b", "dim": 9})
        assert "space 'b' is 16-d" in r.json()["error"]["message"]
        r = c.post("/v1/indexes", headers=W, json={"name": "emp", "space": "b", "dim": 16})  # it agrees: as before
        assert r.status_code == 201 and (r.json()["dim"], r.json()["count"]) == (16, 0), r.text
