"""The HTTP contract read the same on every route (TestClient over the whole app, fast path included): one error
type and body for a request that fails validation, whoever validates it."""

from __future__ import annotations

import numpy as np
import pytest
from _api_support import R, W, served_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with served_world(tmp_path_factory.mktemp("contract")) as world:
        c, _, d = world
        r = c.post("/v1/indexes", headers=W, json={"name": "docs", "space": "b", "vectors": d["Y"][:50].tolist(),
                                                   "kind": "flat"})
        assert r.status_code == 201, r.text
        yield world


def _invalid(r, loc: list, field: str) -> dict:
    """The error of ``r``: a 422 InputError naming ``field``, its ``details`` holding ``loc``."""
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["type"] == "InputError" and err["status"] == 422, err
    assert err["message"].startswith("invalid request: ") and field in err["message"], err
    assert loc in [d["loc"] for d in err["details"]], err
    assert all(set(d) == {"loc", "msg", "type"} for d in err["details"]), err
    return err


def test_a_request_failing_validation_is_one_input_error_with_details_on_every_route(world):
    """Routes whose body FastAPI parsed answered ``RequestValidationError`` with ``details``; routes that read their
    own body (search, transform, index create, add, steers, fits, ...) ``InputError`` without them, for the same
    fault (an unknown field): a client had to know which route parsed what. Both are an InputError with details."""
    c, _, d = world
    row = d["X"][:1].tolist()
    parsed_by_fastapi = [
        ("POST", "/v1/spaces", {"name": "t1", "dim": 4, "zzz": 1}),
        ("PUT", "/v1/maps/a2b/aliases/canary", {"version": 1, "zzz": 1}),
        ("PUT", "/v1/maps/a2b/versions/1/tags/owner", {"value": "me", "zzz": 1}),
        ("POST", "/v1/indexes/docs/delete", {"ids": [1], "zzz": 1}),
    ]
    read_by_the_route = [
        ("POST", "/v1/maps/a2b/transform", {"vectors": row, "zzz": 3}),
        ("POST", "/v1/indexes/docs/search", {"vectors": d["Y"][:1].tolist(), "zzz": 3}),
        ("POST", "/v1/indexes", {"name": "docs2", "space": "b", "zzz": 1}),
        ("POST", "/v1/indexes/docs/vectors", {"vectors": d["Y"][:1].tolist(), "zzz": 1}),
        ("POST", "/v1/fits", {"name": "f", "source_space": "a", "target_space": "b", "zzz": 1,
                              "source": {"vectors": row}, "target": {"vectors": row}}),
    ]
    for method, url, body in parsed_by_fastapi + read_by_the_route:
        _invalid(c.request(method, url, json=body, headers=W), ["body", "zzz"], "zzz")
    # a query parameter FastAPI validates: the same type, located in the query
    err = _invalid(c.post("/v1/maps/a2b/transform?dim=0", json={"vectors": row}, headers=R), ["query", "dim"],
                   "query.dim")
    assert "greater than or equal to 1" in err["details"][0]["msg"]


def test_the_python_client_raises_validation_error_with_details_for_both_type_names(world):
    """The client maps an answer to its class by status, so a 422 is a ValidationError whatever its type says: the
    old ``RequestValidationError`` (an older service) and the ``InputError`` both, with their ``details``."""
    import httpx

    from service.client import ValidationError, error_from_response

    c, _, _ = world
    new = c.post("/v1/spaces", json={"name": "t1", "dim": 4, "zzz": 1}, headers=W)
    old_body = {"error": {**new.json()["error"], "type": "RequestValidationError"}}
    for r in (new, httpx.Response(422, json=old_body)):
        err = error_from_response(r)
        assert type(err) is ValidationError and err.details[0]["loc"] == ["body", "zzz"], err
    assert error_from_response(httpx.Response(422, json={"error": {"type": "ShapeError", "message": "m"}})).details \
        == []


def test_the_transform_query_string_is_read_whole_not_in_part(world):
    """A misspelt parameter was ignored (``?ouptut=frame`` with a binary body: the raw default came back, 200); a
    query ``output`` that the JSON body contradicts lost silently; ``X-Vector-Dim`` beside a JSON body was ignored
    where ``?dim=`` was refused; a repeated ``?dim=`` took the last. Each is a 422 naming what to fix, on the fast
    path (small bodies) and the route alike."""
    c, _, d = world
    X = d["X"][:3]
    octet = {**R, "content-type": "application/octet-stream"}
    for rows in (X[:1], np.tile(X, (100, 1))):  # a fast-path body, and one of over 16 KiB
        err = _invalid(c.post("/v1/maps/a2b/transform?ouptut=frame", content=rows.tobytes(), headers=octet),
                       ["query", "ouptut"], "ouptut")
        assert "this route takes dim, encoding_format, output" in err["message"]
        err = _invalid(c.post("/v1/maps/a2b/transform?dim=16&dim=384", content=rows.tobytes(), headers=octet),
                       ["query", "dim"], "query.dim")
        assert "given more than once" in err["message"]
    _invalid(c.post("/v1/maps/a2b/transform?output=raw&output=raw", json={"vectors": X.tolist()}, headers=R),
             ["query", "output"], "given more than once")
    r = c.post("/v1/maps/a2b/transform?output=frame", json={"vectors": X.tolist(), "output": "raw"}, headers=R)
    assert r.status_code == 422 and "?output=frame" in r.text and "disagree" in r.text, r.text
    r = c.post("/v1/maps/a2b/transform", json={"vectors": X.tolist()}, headers={**R, "X-Vector-Dim": "3"})
    assert r.status_code == 422 and r.json()["error"]["type"] == "DimensionMismatchError", r.text
    assert "X-Vector-Dim says 3" in r.json()["error"]["message"]
    r = c.post("/v1/maps/a2b/transform?dim=3", json={"vectors": X.tolist()}, headers=R)  # as ?dim= already was
    assert r.status_code == 422 and r.json()["error"]["type"] == "DimensionMismatchError", r.text
    # what agrees is served: the query's option with a JSON body, the same option twice over, the right width
    frame = d["a2b"].apply(X, output="frame")
    for url, body, headers in (("?output=frame", {"vectors": X.tolist()}, {**R, "X-Vector-Dim": "16"}),
                               ("?output=frame&dim=16", {"vectors": X.tolist(), "output": "frame"}, R)):
        r = c.post("/v1/maps/a2b/transform" + url, json=body, headers=headers)
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(np.array(r.json()["vectors"]), frame, atol=1e-5)
    r = c.post("/v1/maps/a2b/transform?output=frame&dim=16", content=X.tobytes(), headers=octet)
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(np.frombuffer(r.content, "<f4").reshape(3, 16), frame, atol=1e-5)


def test_the_search_route_refuses_a_query_string_it_would_ignore(world):
    """``POST /v1/indexes/docs/search?k=2`` answered 10 hits (the body's default k): the route takes no query
    parameters and dropped them unread. It is a 422 naming the parameter, on the fast path and the route alike."""
    c, _, d = world
    for rows in (d["Y"][:1], np.tile(d["Y"][:1], (200, 1))):  # a fast-path body, and one of over 16 KiB
        err = _invalid(c.post("/v1/indexes/docs/search?k=2", json={"vectors": rows.tolist()}, headers=R),
                       ["query", "k"], "query.k")
        assert "this route takes none: its options go in the JSON body" in err["message"], err
    r = c.post("/v1/indexes/docs/search", json={"vectors": d["Y"][:1].tolist(), "k": 2}, headers=R)
    assert r.status_code == 200 and len(r.json()["results"][0]) == 2, r.text


def test_a_slash_written_as_percent_2f_in_the_path_is_refused_not_routed(world):
    """Starlette routes on the decoded path: ``GET /v1/maps/a2b%2Fversions`` answered a2b's versions (200) and
    ``POST /v1/maps/a2b%2Ftransform`` transformed, where the name ``a2b/versions`` should have been refused (README:
    a ``/`` in a name is an InputError, never another route). Any case of ``%2F`` in the path is a 422 now; one in
    the query string is not the path's."""
    c, _, d = world
    for path in ("/v1/maps/a2b%2Fversions", "/v1/maps/a2b%2fversions", "/v1/spaces/a%2F..%2Fb"):
        r = c.get(path, headers=R)
        assert r.status_code == 422 and r.json()["error"]["type"] == "InputError", (path, r.text)
        assert "%2F" in r.json()["error"]["message"], r.text
    r = c.post("/v1/maps/a2b%2Ftransform", json={"vectors": d["X"][:1].tolist()}, headers=R)
    assert r.status_code == 422 and "%2F" in r.json()["error"]["message"], r.text
    assert c.get("/v1/maps/a2b/versions", headers=R).status_code == 200
    assert c.get("/v1/maps?note=a%2Fb", headers=R).status_code == 200
    assert c.get("/v1/maps/a2b%2Fversions").status_code == 401  # the key is checked first, as for any request


def test_registering_a_space_again_answers_200_not_201(world):
    """``POST /v1/spaces`` on a space that exists updates its description (an upsert) and answered 201 Created as if
    it were new; a client could not tell a typo'd name that made a space from one that changed another's text. 201
    now only when the space was made, 200 when it existed (``created_at`` kept)."""
    c, _, _ = world
    made = c.post("/v1/spaces", json={"name": "upsert", "dim": 4}, headers=W)
    assert made.status_code == 201 and made.json()["description"] == "", made.text
    again = c.post("/v1/spaces", json={"name": "upsert", "dim": 4, "description": "four columns"}, headers=W)
    assert again.status_code == 200, again.text
    assert again.json()["description"] == "four columns" and again.json()["created_at"] == made.json()["created_at"]
    same = c.post("/v1/spaces", json={"name": "upsert", "dim": 4}, headers=W)
    assert same.status_code == 200 and same.json()["description"] == "four columns", same.text
    assert c.post("/v1/spaces", json={"name": "upsert", "dim": 5}, headers=W).status_code == 409
    doc = c.get("/openapi.json", headers=R).json()["paths"]["/v1/spaces"]["post"]
    assert {"200", "201"} <= set(doc["responses"]) and "upsert" in doc["description"]
