"""Auth: 401 without a valid key, 403 without the scope, constant-time comparison, keys never
logged, CORS off by default."""

from __future__ import annotations

import inspect

import pytest
from pydantic import ValidationError
from fastapi.testclient import TestClient

from service.api import create_app, deps

from .helpers import KEYS, READ_KEY, WONLY_KEY, WRITE_KEY, R, W, WONLY, settings_for


def _routes(app):
    spec = app.openapi()
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            concrete = (path.replace("{ref}", "a2b").replace("{name}", "a2b").replace("{version}", "1")
                        .replace("{alias}", "prod").replace("{key}", "k").replace("{job_id}", "j"))
            yield method.upper(), path, concrete, op


WRITE_ROUTES = {("POST", "/v1/spaces"), ("DELETE", "/v1/maps/{name}/versions/{version}"),
                ("PUT", "/v1/maps/{name}/aliases/{alias}"), ("DELETE", "/v1/maps/{name}/aliases/{alias}"),
                ("PUT", "/v1/maps/{name}/versions/{version}/tags/{key}"), ("POST", "/v1/indexes"),
                ("DELETE", "/v1/indexes/{name}"), ("POST", "/v1/indexes/{name}/vectors"),
                ("POST", "/v1/indexes/{name}/delete"), ("POST", "/v1/fits"), ("DELETE", "/v1/jobs/{job_id}")}
OPEN_ROUTES = {"/healthz", "/readyz", "/metrics"}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    app = create_app(settings_for(tmp_path_factory.mktemp("auth"), log_level="DEBUG"))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c, app


def test_route_tables_cover_the_app(client):
    _, app = client
    routes = {(m, p) for m, p, _, _ in _routes(app)}
    assert WRITE_ROUTES <= routes
    assert len(routes) >= 25


def test_every_protected_route_refuses_a_missing_or_wrong_key(client):
    c, app = client
    n = 0
    for method, path, concrete, _ in _routes(app):
        if path in OPEN_ROUTES:
            continue
        for headers in ({}, {"Authorization": "Bearer not-a-key"}, {"Authorization": f"Basic {READ_KEY}"},
                        {"Authorization": f"Bearer {READ_KEY}x"}, {"Authorization": f"Bearer {READ_KEY[:-1]}"}):
            r = c.request(method, concrete, headers=headers, json={})
            assert r.status_code == 401, (method, path, headers, r.status_code, r.text[:200])
            assert r.headers.get("www-authenticate") == "Bearer"
            assert r.json()["error"]["type"] == "AuthenticationError"
            n += 1
    assert n >= 100


def test_read_key_on_write_routes_is_403_and_write_only_key_cannot_read(client):
    c, app = client
    for method, path, concrete, _ in _routes(app):
        if (method, path) in WRITE_ROUTES:
            r = c.request(method, concrete, headers=R, json={})
            assert r.status_code == 403, (method, path, r.status_code, r.text[:200])
            assert r.json()["error"]["type"] == "PermissionDeniedError"
        elif path not in OPEN_ROUTES and method == "GET":
            r = c.request(method, concrete, headers=WONLY)
            assert r.status_code == 403, (method, path, r.status_code)


def test_keys_are_compared_in_constant_time():
    src = inspect.getsource(deps.scopes_for_token)
    assert "hmac.compare_digest" in src or "secrets.compare_digest" in src
    assert "==" not in src.replace("compare_digest", "")  # no early-exit equality on the key
    # every configured key is compared (no early return on the first match)
    calls = []
    real = deps.hmac.compare_digest

    def spy(a, b):
        calls.append(1)
        return real(a, b)

    deps.hmac.compare_digest = spy
    try:
        deps.scopes_for_token(READ_KEY, KEYS)
    finally:
        deps.hmac.compare_digest = real
    assert len(calls) == len(KEYS)


def test_a_key_check_hashes_the_sent_key_once_and_each_configured_key_once_per_table(client, monkeypatch):
    """Each request hashed every configured key again, and the sent one, with OpenSSL's SHA-256 (~10 µs each in a
    server: its algorithm is fetched per call): the configured keys' digests are made once per key table now, the
    sent key's with CPython's BLAKE2b, and no SHA-256 is made. A table changed in place, or a new one (a keys file
    read again), is hashed again: a key removed stops working at once, an added one works."""
    import hashlib

    c, _ = client
    assert c.get("/v1/maps", headers=R).status_code == 200  # this table's digests made
    made = {"sha256": 0, "blake2b": 0}
    real_sha, real_blake = hashlib.sha256, hashlib.blake2b

    def sha(*a, **k):
        made["sha256"] += 1
        return real_sha(*a, **k)

    def blake(*a, **k):
        made["blake2b"] += 1
        return real_blake(*a, **k)

    monkeypatch.setattr(deps.hashlib, "sha256", sha)
    monkeypatch.setattr(deps.hashlib, "blake2b", blake)
    for _ in range(5):
        assert c.get("/v1/maps", headers=R).status_code == 200
    assert made == {"sha256": 0, "blake2b": 10}  # two checks a request (the guard's, the route's): the sent key each
    keys = dict(KEYS)
    assert deps.scopes_for_token(READ_KEY, keys) == ["read"]
    assert made["blake2b"] == 11 + len(KEYS)  # a new table: its keys hashed once
    keys.pop(READ_KEY)
    assert deps.scopes_for_token(READ_KEY, keys) is None  # changed in place: read again
    keys["new-key-7c1d"] = ["read"]
    assert deps.scopes_for_token("new-key-7c1d", keys) == ["read"]
    assert deps.scopes_for_token(WRITE_KEY, keys) == KEYS[WRITE_KEY]


def test_keys_never_reach_the_logs(client, capfd):
    """The service logs JSON lines to stderr (DEBUG here); no key may appear, not even one sent in a query."""
    c, _ = client
    capfd.readouterr()
    for key in (READ_KEY, WRITE_KEY, WONLY_KEY, "wrong-key-3b9f"):
        h = {"Authorization": f"Bearer {key}"}
        c.get("/v1/maps", headers=h)
        c.post("/v1/maps/nope/transform", headers=h, json={"vectors": [[1.0]]})
        c.post("/v1/fits", headers=h, content=b"{")
        c.get(f"/v1/maps?api_key={key}", headers=h)
    out, err = capfd.readouterr()
    logs = out + err
    assert '"route"' in logs or "request" in logs, "no request was logged at DEBUG: the check would be empty"
    for key in (READ_KEY, WRITE_KEY, WONLY_KEY, "wrong-key-3b9f"):
        assert key not in logs


def test_cors_is_off_by_default(client):
    c, _ = client
    r = c.get("/v1/maps", headers={**R, "Origin": "https://evil.example"})
    assert r.status_code == 200
    assert "access-control-allow-origin" not in {k.lower() for k in r.headers}
    pre = c.options("/v1/maps", headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "GET",
                                         "Access-Control-Request-Headers": "authorization"})
    assert "access-control-allow-origin" not in {k.lower() for k in pre.headers}
    assert pre.status_code >= 400


def test_cors_allows_only_the_configured_origin(tmp_path):
    app = create_app(settings_for(tmp_path, cors_origins=["https://app.example"]))
    with TestClient(app) as c:
        ok = c.get("/v1/maps", headers={**R, "Origin": "https://app.example"})
        assert ok.headers.get("access-control-allow-origin") == "https://app.example"
        bad = c.get("/v1/maps", headers={**R, "Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in {k.lower() for k in bad.headers}


def test_cors_origins_are_written_as_browsers_send_them_or_refused(tmp_path):
    """The middleware compares the Origin header exactly: ``https://app.example/`` (a trailing slash), upper case or
    an explicit default port was accepted and matched no browser's request; ``app.example`` (no scheme) likewise."""
    s = settings_for(tmp_path, cors_origins=["HTTPS://App.Example/", "http://localhost:80", "http://[::1]:8080"])
    assert s.cors_origins == ["https://app.example", "http://localhost", "http://[::1]:8080"]
    with TestClient(create_app(s)) as c:
        ok = c.get("/v1/maps", headers={**R, "Origin": "https://app.example"})
        assert ok.headers.get("access-control-allow-origin") == "https://app.example"
    for bad in ("app.example", "https://app.example/ui", "https://app.example?x", "https://user@app.example", ""):
        with pytest.raises(ValidationError, match="give an origin as a browser sends it"):
            settings_for(tmp_path, cors_origins=[bad])


def test_auth_disabled_needs_to_be_explicit(tmp_path):
    app = create_app(settings_for(tmp_path, api_keys={}))
    with TestClient(app) as c:
        assert c.get("/v1/maps").status_code == 401
        assert c.get("/v1/maps", headers=W).status_code == 401
