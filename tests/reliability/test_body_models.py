"""Routes whose JSON body FastAPI parses into a pydantic model (spaces, aliases, tags, index deletes,
embeddings, steer transfers), against a real ``vecbridge serve``.

Found by an audit of the HTTP service: FastAPI read these bodies with ``json.loads``, which takes
``NaN``, ``Infinity`` and lone surrogates that every other route refuses (a tag ``NaN`` was stored as
``"nan"``; a lone surrogate in a tag, an embeddings input or a steer transfer's description was a 500
from orjson, the tokenizer or SQLite), and it answered a chunked body over the route's limit with a
400 "There was an error parsing the body" instead of the 413 of the body limit.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest

import align
from service.config import Settings
from service.registry import open_registry

from .helpers import Server, W, populate_data_dir


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real server over the populated registry (maps a2b, b2c; steers ``shift`` and ``up`` in space b)."""
    d = tmp_path_factory.mktemp("body-models") / "data"
    Y = populate_data_dir(d)["Y"]
    s = Settings(data_dir=d)
    reg = open_registry(s.resolved_registry_url(), s.resolved_artifact_dir())
    try:  # a steer that transfers through b2c (the mean-shift ``shift`` does not)
        reg.register_steer("up", align.fit_steer(Y[:60], np.where(Y[:60, 0] > 0, 1, -1), rank=2), space="b")
    finally:
        reg.close()
    srv = Server(d, env={"VECBRIDGE_LIMITS__BODY_BYTES_JSON": str(4 * 1024 * 1024)}).start()
    try:
        yield srv
    finally:
        srv.stop()


def _alive(srv: Server) -> None:
    assert srv.proc.poll() is None, srv.log()[-1500:]
    assert httpx.get(srv.url + "/healthz", timeout=10).status_code == 200


def _state(c: httpx.Client) -> tuple:
    return (c.get("/v1/maps/a2b/versions").json(), c.get("/v1/spaces").json(), c.get("/v1/steers").json())


NOT_JSON = [
    ("PUT", "/v1/maps/a2b/versions/1/tags/t", '{"value": NaN}'),
    ("PUT", "/v1/maps/a2b/versions/1/tags/t", '{"value": -Infinity}'),
    ("PUT", "/v1/maps/a2b/versions/1/tags/t", '{"value": "\\ud800"}'),
    ("PUT", "/v1/maps/a2b/versions/1/tags/t", '{"value": {"a": ["x\\udc00"]}}'),
    ("POST", "/v1/spaces", '{"name": "s", "dim": 4, "description": "\\ud800"}'),
    ("POST", "/v1/embeddings", '{"input": "\\ud800", "model": "all-MiniLM-L6-v2"}'),
    ("POST", "/v1/embeddings", '{"input": ["ok", "\\udfff"], "model": "all-MiniLM-L6-v2"}'),
    ("POST", "/v1/steers/up/transfer", '{"map": "b2c", "name": "up-c", "description": "\\ud800"}'),
    ("PUT", "/v1/maps/a2b/aliases/x", '{"version": NaN}'),
    ("POST", "/v1/indexes/none/delete", '{"ids": [Infinity]}'),
]


@pytest.mark.parametrize("method,path,body", NOT_JSON, ids=[f"{m} {p} {b}" for m, p, b in NOT_JSON])
def test_body_model_routes_refuse_what_is_not_json(server, method, path, body):
    """NaN, Infinity and lone surrogates are not JSON: 422 "body is not valid JSON", as on every other route,
    and nothing is stored."""
    with server.client(W) as c:
        before = _state(c)
        r = c.request(method, path, content=body.encode(), headers={"content-type": "application/json"})
        assert r.status_code == 422, (r.status_code, r.text[:300])
        err = r.json()["error"]
        assert err["status"] == 422 and "not valid JSON" in err["message"], err
        assert _state(c) == before
    _alive(server)


LIMITED = [("PUT", "/v1/maps/a2b/versions/1/tags/t"), ("POST", "/v1/spaces"), ("PUT", "/v1/maps/a2b/aliases/x"),
           ("POST", "/v1/indexes/none/delete"), ("POST", "/v1/embeddings"), ("POST", "/v1/steers/up/transfer"),
           ("POST", "/v1/indexes/none/search")]


@pytest.mark.parametrize("method,path", LIMITED, ids=[f"{m} {p}" for m, p in LIMITED])
def test_chunked_body_over_the_limit_is_a_413(server, method, path):
    """A chunked body (no Content-Length) that passes the route's limit while streaming is a 413 on every route."""
    def chunks():
        for _ in range(100):
            yield b" " * 100_000  # 10 MB: past the small (64 KiB), texts and JSON (4 MiB) limits

    with server.client(W) as c:
        r = c.request(method, path, content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413, (r.status_code, r.text[:300])
    assert r.json()["error"]["type"] == "PayloadTooLargeError"
    _alive(server)


def test_steer_transfer_description_is_bounded(server):
    """A steer transfer's description has the limit of every other description (4,096 characters: 422)."""
    with server.client(W) as c:
        before = _state(c)
        r = c.post("/v1/steers/up/transfer", json={"map": "b2c", "name": "up-c", "description": "x" * 5000})
        assert r.status_code == 422, (r.status_code, r.text[:300])
        assert "description" in r.json()["error"]["message"]
        assert _state(c) == before
        ok = c.post("/v1/steers/up/transfer", json={"map": "b2c", "name": "up-c", "description": "x" * 4096})
        assert ok.status_code == 201, ok.text[:300]
