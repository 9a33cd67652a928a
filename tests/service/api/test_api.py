"""Service over HTTP (TestClient): maps, transform in every wire format, auth, limits, errors, ops."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from service.api import create_app
from service.config import get_settings
from _api_support import KEYS, R, W, WONLY, assert_nonfinite_refused, populate, served_world, settings_for

OCT = {"content-type": "application/octet-stream"}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with served_world(tmp_path_factory.mktemp("api")) as world:
        yield world


# --- maps and spaces ----------------------------------------------------------------------------
def test_list_maps_contract(world):
    c, _, _ = world
    r = c.get("/v1/maps", headers=R)
    assert r.status_code == 200
    by_name = {m["name"]: m for m in r.json()["data"]}
    assert by_name["a2b"]["source_dim"] == 16 and by_name["a2b"]["target_dim"] == 16
    assert by_name["b2c"]["source_dim"] == 16 and by_name["b2c"]["target_dim"] == 12
    one = c.get("/v1/maps/b2c", headers=R).json()
    assert (one["source_dim"], one["target_dim"]) == (16, 12)
    assert one["resolved"]["version"] == 1 and one["resolved"]["method"] == "ridge"


def test_spaces_and_versions(world):
    c, _, _ = world
    names = {s["name"]: s["dim"] for s in c.get("/v1/spaces", headers=R).json()["data"]}
    assert names["a"] == 16 and names["c"] == 12
    assert c.get("/v1/spaces/nope", headers=R).status_code == 404
    r = c.post("/v1/spaces", json={"name": "d", "dim": 8}, headers=W)
    assert r.status_code == 201 and r.json()["dim"] == 8
    assert c.post("/v1/spaces", json={"name": "d2"}, headers=W).status_code == 422  # no dim, no encoder
    vs = c.get("/v1/maps/a2b/versions", headers=R).json()["data"]
    assert [v["version"] for v in vs] == [1] and "prod" in vs[0]["aliases"]
    # a space's encoder is how its texts embed: replacing it (201 before) made new texts another model's vectors
    assert c.post("/v1/spaces", json={"name": "txt", "encoder": "minilm"}, headers=W).status_code == 201
    r = c.post("/v1/spaces", json={"name": "txt", "encoder": "multilingual-e5-small"}, headers=W)
    assert r.status_code == 409 and "has encoder" in r.json()["error"]["message"], r.text
    r = c.post("/v1/spaces", json={"name": "txt", "encoder": "all-MiniLM-L6-v2", "description": "MiniLM"}, headers=W)
    assert r.status_code == 200 and r.json()["description"] == "MiniLM"  # the same model by another name: fine


# --- transform ----------------------------------------------------------------------------------
def test_transform_json_matches_in_process(world):
    c, _, d = world
    X = d["X"][:5]
    r = c.post("/v1/maps/a2b/transform", json={"vectors": X.tolist()}, headers=R)
    assert r.status_code == 200
    body = r.json()
    assert body["map"] == "a2b" and body["version"] == 1 and body["shape"] == [5, 16]
    np.testing.assert_allclose(np.array(body["vectors"], np.float32), d["a2b"].apply(X, output="raw"), atol=1e-6)
    r = c.post("/v1/maps/a2b@prod/transform", json={"vectors": X.tolist(), "output": "frame"}, headers=R)
    np.testing.assert_allclose(np.array(r.json()["vectors"]), d["a2b"].apply(X, output="frame"), atol=1e-6)


def test_transform_binary_forms_agree(world):
    c, _, d = world
    X = d["Y"][:7]
    ref = d["b2c"].apply(X, output="raw")
    # base64 in a JSON envelope, base64 out
    r = c.post("/v1/maps/b2c:1/transform", headers=R, json={
        "vectors_b64": base64.b64encode(X.tobytes()).decode(), "dim": 16, "encoding_format": "base64"})
    got = np.frombuffer(base64.b64decode(r.json()["vectors_b64"]), "<f4").reshape(7, 12)
    np.testing.assert_allclose(got, ref, atol=1e-6)
    # raw octet-stream (width defaults to the map's source dim)
    r = c.post("/v1/maps/b2c/transform", content=X.tobytes(), headers={**R, **OCT})
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
    assert r.headers["x-shape"] == "7,12" and r.headers["x-map-version"] == "1"
    np.testing.assert_allclose(np.frombuffer(r.content, "<f4").reshape(7, 12), ref, atol=1e-6)
    # .npy in, .npy out
    buf = io.BytesIO()
    np.save(buf, X.astype(np.float64))
    r = c.post("/v1/maps/b2c/transform", content=buf.getvalue(), headers={**R, "content-type": "application/x-npy"})
    np.testing.assert_allclose(np.load(io.BytesIO(r.content), allow_pickle=False), ref, atol=1e-5)
    # binary in, JSON out on request
    r = c.post("/v1/maps/b2c/transform?dim=16&output=frame", content=X.tobytes(),
               headers={**R, **OCT, "accept": "application/json"})
    np.testing.assert_allclose(np.array(r.json()["vectors"]), d["b2c"].apply(X, output="frame"), atol=1e-6)


@hsettings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 40), seed=st.integers(0, 2**31 - 1), scale=st.floats(1e-3, 1e3))
def test_transform_http_equals_apply_property(world, n, seed, scale):
    c, _, d = world
    X = (np.random.default_rng(seed).standard_normal((n, 16)) * scale).astype(np.float32)
    r = c.post("/v1/maps/a2b/transform", content=X.tobytes(), headers={**R, **OCT})
    assert r.status_code == 200
    np.testing.assert_allclose(np.frombuffer(r.content, "<f4").reshape(n, 16), d["a2b"].apply(X, output="raw"),
                               atol=1e-5)


@pytest.mark.parametrize("body,status,needle", [
    ({"vectors": [[1.0, 2.0]]}, 422, "expected 16 columns, got 2"),
    ({"vectors": []}, 422, "at least one row"),
    ({"vectors": [1.0, 2.0]}, 422, "2-D"),
    ({"vectors": [[1.0] * 16, [1.0] * 15]}, 422, "vectors"),
    ({"vectors": [["x"] * 16]}, 422, "numeric"),
    ({}, 422, "missing 'vectors'"),
    ({"vectors": [[0.0] * 16], "output": "weird"}, 422, "output"),
    ({"vectors": [[0.0] * 16], "bogus": 1}, 422, "bogus"),
    ({"vectors_b64": "!!!", "dim": 16}, 422, "base64"),
    ({"vectors_b64": base64.b64encode(b"\0" * 12).decode(), "dim": 16}, 422, "whole number of rows"),
])
def test_transform_bad_input(world, body, status, needle):
    c, _, _ = world
    r = c.post("/v1/maps/a2b/transform", json=body, headers=R)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["status"] == status and needle in err["message"]


def test_a_npy_body_of_objects_or_not_npy_at_all_is_refused_plainly(world):
    """A pickled object (or any non-.npy bytes) sent as application/npy was answered with numpy's "This file contains
    pickled (object) data. If you trust the file you can load it unsafely using allow_pickle=": advice to unpickle."""
    import pickle

    c, _, _ = world
    obj = io.BytesIO()
    np.save(obj, np.array([[1.0] * 15 + ["a"]], dtype=object), allow_pickle=True)
    for ct, body, says in (("application/npy", pickle.dumps([[1.0] * 16]), "body is not a .npy file (no NumPy header)"),
                           ("application/x-npy", b"not an array", "body is not a .npy file (no NumPy header)"),
                           ("application/x-npy", obj.getvalue(), "body holds Python objects (an object array)")):
        r = c.post("/v1/maps/a2b/transform", content=body, headers={**R, "content-type": ct})
        assert r.status_code == 422, r.text
        msg = r.json()["error"]["message"]
        assert msg.startswith(says) and "numpy.save" in msg and "allow_pickle" not in msg and "trust" not in msg, msg


def test_transform_non_finite_binary(world):
    c, _, _ = world
    X = np.zeros((3, 16), np.float32)
    X[1, 4] = np.nan
    r = c.post("/v1/maps/a2b/transform", content=X.tobytes(), headers={**R, **OCT})
    assert r.status_code == 422 and r.json()["error"]["type"] == "NonFiniteError"
    r = c.post("/v1/maps/a2b/transform?dim=15", content=np.zeros((2, 15), np.float32).tobytes(), headers={**R, **OCT})
    assert r.status_code == 422 and "expects 16 columns, got 15" in r.json()["error"]["message"]
    r = c.post("/v1/maps/a2b/transform", content=b"\0" * 10, headers={**R, **OCT})
    assert r.status_code == 422


def test_transform_refuses_each_non_finite_row_by_name(world):
    """The route decodes without a NaN/Inf pass of its own (the map's apply reads it off its row norms): every
    non-finite row is still a 422 that names the request's vectors, in any row, body kind and batch size."""
    c, _, data = world
    assert_nonfinite_refused(c, "/v1/maps/a2b/transform", data["X"][:600])


def test_transform_unknown_refs(world):
    c, _, _ = world
    for ref in ("nope", "a2b@staging", "a2b:9"):
        r = c.post(f"/v1/maps/{ref}/transform", json={"vectors": [[0.0] * 16]}, headers=R)
        assert r.status_code == 404, ref
        assert r.json()["error"]["type"] == "NotFoundError"


def test_unsupported_media_type(world):
    c, _, _ = world
    r = c.post("/v1/maps/a2b/transform", content=b"x", headers={**R, "content-type": "text/csv"})
    assert r.status_code == 415


def test_limits_413(world):
    c, _, _ = world
    too_many = np.zeros((1001, 16), np.float32)  # max_batch=1000
    r = c.post("/v1/maps/a2b/transform", content=too_many.tobytes(), headers={**R, **OCT})
    assert r.status_code == 413 and "1001 rows exceeds the limit of 1000" in r.json()["error"]["message"]
    huge = np.zeros((40_000, 16), np.float32)  # 2.56 MB > max_body_bytes=2 MB
    r = c.post("/v1/maps/a2b/transform", content=huge.tobytes(), headers={**R, **OCT})
    assert r.status_code == 413 and "max_body_bytes" in r.json()["error"]["message"]

    def chunks():  # no Content-Length: the limit is enforced while reading
        for _ in range(5):
            yield b"\0" * 500_000

    r = c.post("/v1/maps/a2b/transform", content=chunks(), headers={**R, **OCT})
    assert r.status_code == 413
    # a large body to a mistyped path: still refused unread, but the message names the path, not the batch
    r = c.post("/v1/maps/a2b/transfrom", content=huge.tobytes(), headers={**R, **OCT})
    assert r.status_code == 413 and "no route matches POST /v1/maps/a2b/transfrom" in r.json()["error"]["message"]
    r = c.post("/v1/maps/a2b/transfrom", content=b"\0" * 64, headers={**R, **OCT})  # a small one: 404 as before
    assert r.status_code == 404


def test_a_repeated_content_type_is_refused_before_the_body(tmp_path):
    """Two Content-Type headers: the guard sized the body by the last (octet-stream: max_body_bytes) while the route
    read the first (JSON), so an 18 KB JSON body passed a 2,000-byte limits.body_bytes_json (a 200)."""
    import httpx
    from _servers import serve_in_thread

    app = create_app(settings_for(tmp_path, limits={"body_bytes_json": 2000}))
    with TestClient(app):
        populate(app.state.vb.registry)
    rows = np.ones((60, 16), np.float32).tolist()  # ~18 KB of JSON
    twice = [*W.items(), ("content-type", "application/json"), ("content-type", "application/octet-stream")]
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as c:
        assert c.post("/v1/maps/a2b/transform", json={"vectors": rows}, headers=R).status_code == 413
        for path, body in (("/v1/maps/a2b/transform", {"vectors": rows}),  # the fast path's route
                           ("/v1/maps/a2b/transform?dim=16", {"vectors": rows[:1]}), ("/v1/spaces", {"name": "x"})):
            r = c.post(path, content=json.dumps(body).encode(), headers=twice)
            assert r.status_code == 400, (path, r.text)
            assert r.json()["error"] == {"type": "InvalidHeaderError", "status": 400, "message": (
                "the request has 2 Content-Type headers; send one, the type of its body")}
        assert c.post("/v1/maps/a2b/transform", json={"vectors": rows[:1]}, headers=R).status_code == 200


def test_the_json_answer_limit_holds_whenever_the_answer_is_json(tmp_path):
    """limits.max_response_values held only for JSON bodies: a binary body with Accept: application/json was answered
    with every number as JSON, past the limit (fast path and route alike)."""
    X = np.ones((100, 16), np.float32)  # 1,600 numbers > 1,000
    with served_world(tmp_path, limits={"max_response_values": 1000}) as (c, _, _):
        r = c.post("/v1/maps/a2b/transform", json={"vectors": X.tolist()}, headers=R)
        assert r.status_code == 422 and "exceed the JSON answer limit of 1000" in r.json()["error"]["message"]
        as_json = {**R, **OCT, "accept": "application/json"}
        for body in (X.tobytes(), iter([X.tobytes()])):  # with a Content-Length (the fast path), chunked (the route)
            r = c.post("/v1/maps/a2b/transform", content=body, headers=as_json)
            assert r.status_code == 422, r.text[:200]
            assert "100 x 16 numbers exceed the JSON answer limit of 1000" in r.json()["error"]["message"]
        r = c.post("/v1/maps/a2b/transform?encoding_format=base64", content=X.tobytes(), headers=as_json)
        assert r.status_code == 200 and r.json()["shape"] == [100, 16]
        r = c.post("/v1/maps/a2b/transform", content=X.tobytes(), headers={**R, **OCT})
        assert r.status_code == 200 and len(r.content) == X.nbytes


def test_metadata_routes_get_the_small_body_limit(tmp_path):
    """The steer alias PUT and a steer transfer read bodies up to 64 MiB (every route not listed was "bulk"), where the
    map alias PUT reads 64 KiB; now a route is small unless its class says otherwise. /openapi.json offered binary
    bodies of max_body_bytes to every bulk route, where only the transform takes them (the others answer 415)."""
    from service.api.middleware import BODY_CLASS

    big = b'{"description": "' + b"a" * 100_000 + b'"}'
    with served_world(tmp_path, limits={"body_bytes_json": 1_000_000}) as (c, _, _):  # under max_body_bytes (2 MB)
        for method, path in (("PUT", "/v1/steers/s/aliases/prod"), ("POST", "/v1/steers/s/transfer"),
                             ("PUT", "/v1/maps/a2b/aliases/x")):
            r = c.request(method, path, content=big, headers={**W, "content-type": "application/json"})
            assert r.status_code == 413, (path, r.text[:200])
            assert "(limits.body_bytes_small)" in r.json()["error"]["message"], path
        ops = c.get("/openapi.json").json()["paths"]
    templates = {(m.upper(), path) for path, op in ops.items() for m in op}
    assert set(BODY_CLASS) <= templates, set(BODY_CLASS) - templates  # no entry names a route that is gone
    assert ("Body limit: 1000000 bytes (`limits.body_bytes_json`); binary bodies 2000000 bytes (`max_body_bytes`)."
            in ops["/v1/maps/{ref}/transform"]["post"]["description"])
    for path in ("/v1/indexes/{name}/search", "/v1/fits", "/v1/plans", "/v1/migrations",
                 "/v1/steers/{name}/aliases/{alias}"):
        (op,) = [op for m, op in ops[path].items() if m in ("post", "put")]
        assert "Body limit: " in op["description"] and "binary bodies" not in op["description"], path
    assert ops["/v1/plans"]["post"]["description"].endswith("Body limit: 1000000 bytes (`limits.body_bytes_json`).")
    assert "(`limits.body_bytes_small`)" in ops["/v1/steers/{name}/aliases/{alias}"]["put"]["description"]
    # a migration's body may carry its keep set (the re-embedded rows' vectors): a bulk JSON body
    assert ops["/v1/migrations"]["post"]["description"].endswith(
        "Body limit: 1000000 bytes (`limits.body_bytes_json`).")
    assert ops["/v1/verifications"]["post"]["description"].endswith(  # the same keep set, to check those rows
        "Body limit: 1000000 bytes (`limits.body_bytes_json`).")


# --- aliases and soft delete --------------------------------------------------------------------
def test_alias_and_soft_delete(tmp_path):
    app = create_app(settings_for(tmp_path))
    with TestClient(app) as c:
        d = populate(app.state.vb.registry)
        reg = app.state.vb.registry
        reg.register_version("a2b", d["a2b"], source_space="a", target_space="b", method="procrustes", params={})
        assert c.put("/v1/maps/a2b/aliases/canary", json={"version": 2}, headers=W).status_code == 200
        r = c.post("/v1/maps/a2b@canary/transform", json={"vectors": [[0.5] * 16]}, headers=R)
        assert r.json()["version"] == 2
        assert c.put("/v1/maps/a2b/aliases/canary", json={"version": 7}, headers=W).status_code == 404
        assert c.delete("/v1/maps/a2b/versions/2", headers=R).status_code == 403
        r = c.delete("/v1/maps/a2b/versions/2", headers=W)
        assert r.status_code == 200 and r.json()["deleted"] is True
        assert r.json()["bare_ref"] == "a2b:1"  # what a bare a2b means now, as a steer delete says
        assert c.post("/v1/maps/a2b:2/transform", json={"vectors": [[0.5] * 16]}, headers=R).status_code == 404
        assert c.post("/v1/maps/a2b/transform", json={"vectors": [[0.5] * 16]}, headers=R).json()["version"] == 1
        assert c.delete("/v1/maps/a2b/aliases/prod", headers=W).status_code == 204
        assert c.post("/v1/maps/a2b@prod/transform", json={"vectors": [[0.5] * 16]}, headers=R).status_code == 404
        assert c.put("/v1/maps/a2b/versions/1/tags/owner", json={"value": "search"}, headers=W).json()["tags"] == {
            "owner": "search"}
        r = c.get("/v1/maps/a2b:1/artifact?format=npz", headers=R)
        from align import LinearMap

        np.testing.assert_allclose(LinearMap.from_bytes(r.content).W, d["a2b"].W)


def test_tag_values_are_stored_as_json_text(world):
    """A tag value that is not a string comes back as its JSON text, not Python's repr (True, None, {'a': 1})."""
    c, _, _ = world
    for value, text in ((True, "true"), (None, "null"), ({"a": [1, None]}, '{"a":[1,null]}'), ([1.5, "x"], '[1.5,"x"]'),
                        (7, "7"), (0.25, "0.25"), ("as sent", "as sent")):
        r = c.put("/v1/maps/b2c/versions/1/tags/t", json={"value": value}, headers=W)
        assert r.status_code == 200 and r.json()["tags"]["t"] == text, (value, r.text[:200])
    assert c.get("/v1/maps/b2c/versions/1", headers=R).json()["tags"]["t"] == "as sent"


# --- auth ---------------------------------------------------------------------------------------
def test_auth_scopes(world):
    c, _, _ = world
    body = {"vectors": [[0.0] * 16]}
    r = c.post("/v1/maps/a2b/transform", json=body)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert c.post("/v1/maps/a2b/transform", json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert c.post("/v1/maps/a2b/transform", json=body, headers={"Authorization": "Basic cmtleQ=="}).status_code == 401
    assert c.post("/v1/maps/a2b/transform", json=body, headers={"Authorization": "Bearer rkey-12"}).status_code == 401
    assert c.post("/v1/maps/a2b/transform", json=body, headers=WONLY).status_code == 403  # write-only key
    assert c.post("/v1/spaces", json={"name": "zz", "dim": 3}, headers=R).status_code == 403
    assert c.post("/v1/spaces", json={"name": "zz", "dim": 3}, headers=WONLY).status_code == 201
    assert c.get("/metrics").status_code == 401 and c.get("/metrics", headers=R).status_code == 200  # metrics_access=key
    for path in ("/healthz", "/readyz", "/openapi.json", "/docs"):
        assert c.get(path).status_code == 200, path
    assert c.get("/v1/info").status_code == 401


def test_auth_disabled_only_when_explicit(tmp_path):
    app = create_app(settings_for(tmp_path, api_keys={}))
    with TestClient(app) as c:
        assert c.get("/v1/maps").status_code == 401  # no keys and auth on: everything refused
        assert c.get("/v1/maps", headers={"Authorization": "Bearer "}).status_code == 401
    app = create_app(settings_for(tmp_path, api_keys={}, auth_disabled=True))
    with TestClient(app, base_url="http://localhost") as c:  # with auth off, only loopback Host names
        assert c.get("/v1/maps").status_code == 200


def test_settings_dependency_override(tmp_path):
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings_for(tmp_path, api_keys={"other": ["read"]})
    with TestClient(app) as c:
        assert c.get("/v1/maps", headers={"Authorization": "Bearer other"}).status_code == 200
        assert c.get("/v1/maps", headers=R).status_code == 401
        assert (tmp_path / "data" / "registry.sqlite").exists()


# --- ops ----------------------------------------------------------------------------------------
def test_ops_endpoints(world):
    c, _, _ = world
    assert c.get("/healthz").json() == {"status": "ok"}
    ready = c.get("/readyz").json()
    assert ready["status"] == "ready" and ready["checks"]["registry"] == "ok"
    info = c.get("/v1/info", headers=R).json()
    assert info["registry_backend"] == "sqlite" and info["limits"]["max_batch"] == 1000
    c.post("/v1/maps/a2b/transform", json={"vectors": [[0.0] * 16] * 3}, headers=R)
    text = c.get("/metrics", headers=R).text
    assert 'vecbridge_request_duration_seconds_bucket{le="0.005",method="POST",route="/v1/maps/{ref}/transform"' in text
    assert 'vecbridge_map_use_total{map="a2b"}' in text
    cache = c.get("/v1/info", headers=R).json()["map_cache"]  # the map just used is held, within map_cache_mb
    assert cache["setting_mb"] == 512 and cache["max_bytes"] == 512 << 20 and cache["max_entries"] == 64
    assert cache["entries"] >= 1 and 16 * 16 * 4 <= cache["bytes"] <= cache["max_bytes"], cache
    assert "vecbridge_batch_rows_bucket" in text and "vecbridge_jobs_queued" in text
    assert "rkey-123" not in text


def test_openapi_documents_binary_fast_path(world):
    c, _, _ = world
    spec = c.get("/openapi.json").json()
    op = spec["paths"]["/v1/maps/{ref}/transform"]["post"]
    content = op["requestBody"]["content"]
    assert {"application/json", "application/octet-stream", "application/x-npy"} <= set(content)
    assert "fast path" in op["description"]
    assert "bearer" in str(spec["components"]["securitySchemes"]).lower()
    for path in ("/v1/embeddings", "/v1/fits", "/v1/jobs/{job_id}", "/v1/indexes", "/v1/indexes/{name}/search"):
        assert path in spec["paths"], path


def test_openapi_limits_table_names_every_bound_a_client_meets(world):
    """The table listed the body and row limits but not the timeouts, head size, concurrency and Host bounds a
    client can run into (they were only in RELIABILITY.md)."""
    from service.limits import Limits

    c, _, _ = world
    text = c.get("/openapi.json").json()["info"]["description"].split("**Limits**")[1]
    for name in ("max_body_bytes", "max_batch", "body_timeout_s", "header_timeout_s", "send_timeout_s",
                 "keep_alive_timeout_s", "max_heavy_requests", "compute_max_waiting", "max_queued_jobs",
                 "max_queued_jobs_per_key",
                 "allowed_hosts", *Limits.model_fields):
        assert f"(`{name}`)" in text, name
    assert "431" in text and "1 MiB" in text
    assert "| Request target (path and query string): bytes | 65535 | 414, connection closed |" in text


def test_unknown_route_and_method(world):
    c, _, _ = world
    r = c.get("/v1/nothing", headers=R)
    assert r.status_code == 404 and r.json()["error"]["status"] == 404
    assert c.get("/v1/maps/a2b/transform", headers=R).status_code == 405


def test_registry_name_errors_are_422(world):
    c, _, _ = world
    r = c.post("/v1/spaces", json={"name": "bad name!", "dim": 3}, headers=W)
    assert r.status_code == 422 and r.json()["error"]["type"] == "InvalidNameError"
    r = c.post("/v1/spaces", json={"name": "a", "dim": 99}, headers=W)
    assert r.status_code == 409, r.text


def test_a_version_path_segment_takes_ascii_digits_only(world):
    """``{version}`` was a FastAPI ``int``: '1_0' read as 10 ("no version 10"), and '1.0', '+1', ' 1' and a
    fullwidth '１' as 1, so those URLs named version 1. Now the segment is read as a reference's ``:N`` is: a 422."""
    c, _, _ = world
    assert c.get("/v1/maps/a2b/versions/1", headers=R).status_code == 200
    for seg in ("1_0", "1.0", "+1", "%201", "%EF%BC%91", "01x"):
        for method, url, kw in (("GET", f"/v1/maps/a2b/versions/{seg}", {}),
                                ("GET", f"/v1/maps/a2b/versions/{seg}/report", {}),
                                ("PUT", f"/v1/maps/a2b/versions/{seg}/tags/k", {"json": {"value": "x"}}),
                                ("DELETE", f"/v1/steers/s/versions/{seg}", {})):
            r = c.request(method, url, headers=W if method != "GET" else R, **kw)
            assert r.status_code == 422 and "in ASCII digits" in r.json()["error"]["message"], (method, url, r.text)
    assert c.get("/v1/maps/a2b/versions/1", headers=R).json()["tags"] == {}
    spec = c.get("/openapi.json").json()["paths"]["/v1/maps/{name}/versions/{version}"]["get"]["parameters"]
    schema = next(p["schema"] for p in spec if p["name"] == "version")  # the bounds stay standard JSON Schema
    assert (schema["type"], schema["minimum"], schema["maximum"]) == ("integer", 1, 2**31 - 1), schema


def test_keys_never_in_logs(tmp_path, capfd):
    app = create_app(settings_for(tmp_path, log_level="INFO"))
    with TestClient(app) as c:
        c.get("/v1/maps", headers=R)
        c.get("/v1/maps", headers={"Authorization": "Bearer not-a-key-secret"})
    err = capfd.readouterr().err
    assert '"route": "/v1/maps"' in err  # the access log is on
    for k in (*KEYS, "not-a-key-secret"):
        assert k not in err


def test_a_replica_without_the_registrys_artifacts_is_not_ready_and_says_why(tmp_path):
    """QA 4801: a replica with a data dir of its own on a shared registry (PostgreSQL in production; here one SQLite
    file that two data dirs name) said /readyz ready, then answered every transform with a 500 IntegrityError
    "artifact ... is missing". It is not ready, and a transform is a 503 naming the cause; one file lost from the
    shared folder is not that (the replicas stay ready)."""
    import align

    url = f"sqlite:///{(tmp_path / 'shared.sqlite').resolve()}"
    with served_world(tmp_path / "writer", registry_url=url) as (c, app, data):
        reg = app.state.vb.registry
        reg.store.path(reg.register_steer("up", align.MeanShift(np.ones(16, np.float32)), space="a").artifact_path
                       ).unlink()
        assert c.get("/readyz").json()["checks"]["artifacts"] == "ok"  # 1 of 3 missing: a lost file
    with TestClient(create_app(settings_for(tmp_path / "replica", registry_url=url))) as c:
        ready = c.get("/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "not ready", ready.text
        assert "does not hold the registry's artifacts (3 of the 3 newest" in ready.json()["checks"]["artifacts"]
        r = c.post("/v1/maps/a2b@prod/transform", json={"vectors": data["X"][:2].tolist()}, headers=R)
        assert r.status_code == 503 and "retry-after" not in r.headers, r.text
        assert "replicas of one registry must share its artifact folder" in r.json()["error"]["message"]
        assert r.json()["error"]["message"].startswith("artifact ")  # which file, then why
        assert str(tmp_path) not in ready.text + r.text  # the folder's path: in the log only (no key for /readyz)


def test_a_replica_whose_artifact_folder_is_put_right_is_ready_at_the_next_probe(tmp_path):
    """/readyz kept its "not the registry's artifacts" answer for 30 s in a copy of its own, beside the registry
    store's: a replica whose folder was put right (the shared mount back) stayed "not ready" for 30 s more, and took
    no traffic meanwhile. The next probe is ready now, and its transforms answer."""
    import shutil

    url = f"sqlite:///{(tmp_path / 'shared.sqlite').resolve()}"
    with served_world(tmp_path / "writer", registry_url=url) as (c, app, data):
        import align

        app.state.vb.registry.register_steer("up", align.MeanShift(np.ones(16, np.float32)), space="a")  # 3 versions
        shared = app.state.vb.registry.store.root
    with TestClient(create_app(settings_for(tmp_path / "replica", registry_url=url))) as c:
        app = c.app
        ready = c.get("/readyz")
        assert ready.status_code == 503 and "does not hold the registry's" in ready.json()["checks"]["artifacts"]
        shutil.copytree(shared, app.state.vb.registry.store.root, dirs_exist_ok=True)  # the folder put right
        ready = c.get("/readyz")
        assert ready.status_code == 200 and ready.json()["checks"]["artifacts"] == "ok", ready.text
        r = c.post("/v1/maps/a2b@prod/transform", json={"vectors": data["X"][:2].tolist()}, headers=R)
        assert r.status_code == 200, r.text


def test_one_lost_file_of_a_registry_of_two_versions_leaves_the_replicas_ready(tmp_path):
    """QA 4803: 1 of 2 newest files missing was "half or more": every replica not ready, and that map's 500 a 503
    "replicas must share ...". Fewer than 3 missing is a lost file: ready, and the integrity error it always was."""
    with served_world(tmp_path) as (c, app, data):
        reg = app.state.vb.registry
        assert len(reg.list_versions("b2c")) + len(reg.list_versions("a2b")) == 2
        reg.store.path(reg.resolve("b2c:1").artifact_path).unlink()
        app.state.vb.registry.store.elsewhere_seen = None  # as 30 s later
        assert c.get("/readyz").json()["checks"]["artifacts"] == "ok"
        assert c.post("/v1/maps/a2b@prod/transform", json={"vectors": data["X"][:2].tolist()}, headers=R).is_success
        r = c.post("/v1/maps/b2c:1/transform", json={"vectors": data["Y"][:2].tolist()}, headers=R)
        assert r.status_code == 500 and r.json()["error"]["type"] == "IntegrityError", r.text


def _probe_while_hung(app, *, arm, release, looks: list, check: str, says: str, probes: int, setup=None, then=None):
    """``probes`` concurrent /readyz of ``app`` once ``arm()`` has hung its ``check`` (each look appends to ``looks``
    and waits for ``release``): every answer is a 503 whose ``check`` starts with ``says``, one look served them all,
    and the pool still serves a route; ``setup(state)`` runs before the first (healthy) probe, ``await then(client)``
    after the asserts, and ``release`` is set at the end whatever happened."""
    import asyncio

    import httpx

    async def main():
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            if setup is not None:
                setup(app.state.vb)
            assert (await c.get("/readyz")).status_code == 200
            arm()
            try:
                answers = await asyncio.gather(*(c.get("/readyz") for _ in range(probes)))
                assert {a.status_code for a in answers} == {503}
                assert {a.json()["checks"][check][:len(says)] for a in answers} == {says}, answers[0].text
                assert len(looks) == 1  # one thread for every probe
                assert (await c.get("/v1/maps", headers=R)).status_code == 200  # the pool still has threads
                if then is not None:
                    await then(c)
            finally:
                release.set()

    asyncio.run(main())


def test_readiness_looks_at_a_hung_data_dir_with_one_thread_and_answers_in_time(tmp_path, monkeypatch):
    """A review's find: the artifact check was one look at a time, but /readyz's look at the folders it writes to
    (``data_dir_status``: is_dir, access, statvfs of the data, artifact and report dirs) still ran in a new pool thread
    per probe, without a time limit: a hung mount held one more thread per probe. Now one look at a time, answered
    within READY_WAIT_S as "no answer"."""
    import threading

    from service import storage

    hung, release, looks = threading.Event(), threading.Event(), []
    real = storage.data_dir_status

    def status(*args, **kw):
        if hung.is_set():
            looks.append(1)
            release.wait(20)
        return real(*args, **kw)

    def arm():
        monkeypatch.setattr(storage, "data_dir_status", status)
        hung.set()

    _probe_while_hung(create_app(settings_for(tmp_path)), arm=arm, release=release, looks=looks, check="data_dir",
                      says="error: no answer from the data dir's folders ", probes=30)


def test_readiness_looks_at_a_hung_artifact_folder_with_one_thread_and_answers_in_time(tmp_path, monkeypatch):
    """QA 4803: /readyz's artifact check ran a query and 8 ``stat``s in a new pool thread per probe, without a time
    limit: an artifact folder that stops answering (a hard NFS mount) held one more thread per probe until the pool
    was exhausted and every route that needs one stalled. One look at a time, answered within READY_WAIT_S as "no
    answer", and that answer kept like any other."""
    import threading

    from service.registry import core

    hung, release, looks = threading.Event(), threading.Event(), []
    app = create_app(settings_for(tmp_path))

    def hang(point):
        if point == "artifacts_sampled" and hung.is_set():
            looks.append(point)
            release.wait(20)

    def arm():
        monkeypatch.setattr(core, "FAULT_HOOK", hang)
        hung.set()
        app.state.vb.registry.store.elsewhere_seen = None  # as 30 s later

    async def again(c):
        again = await c.get("/readyz")  # kept: no second look while the first still hangs
        assert again.status_code == 503 and len(looks) == 1

    _probe_while_hung(app, arm=arm, release=release, looks=looks, check="artifacts",
                      says="error: no answer from this data dir's artifact folder f", probes=45,
                      setup=lambda state: populate(state.registry), then=again)
