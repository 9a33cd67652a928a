"""Whole numbers written as floats in JSON bodies (``service/api/number_types.py``): where they are the integer they
write, and where they are refused because they may be another integer rounded."""

from __future__ import annotations

from _api_support import W, served_world

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
