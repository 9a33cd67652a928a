"""What a QA pass of the HTTP API found answered without a word, or in Python's words (session 55):

- an IVF search whose probed lists held fewer than k rows answered short lists with no note;
"""

from __future__ import annotations

import numpy as np
import pytest
from _api_support import R, W, served_world, vectors_b64


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
