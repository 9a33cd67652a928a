"""Every status the service answers a route with is one the OpenAPI document declares for it.

Each route of the document is called, in a populated service, the ways every route of its kind can fail: with two
``Content-Type`` headers (400, the guard), without a key and with a key of the other scope (401 / 403), with a body
over its limit (413), and, where its path names things, with names nothing has (404, or what the route answers
first). Before, the document left out 400 everywhere, 413 on the small-body routes (spaces, aliases, tags, steer
transfers), 404 on ``POST /v1/maps/{ref}/evaluate``, and 401 / 403 / 404 on ``/metrics``; and the answers of
plans, evaluations and collection searches had the empty schema ``{}``.
"""

from __future__ import annotations

import re

import pytest
from _api_support import WONLY, R, W, populate, settings_for
from fastapi.testclient import TestClient

from service.api import create_app
from service.api.middleware import body_limit

#: what each path parameter is filled with: a name nothing has (a version and a key that would exist)
UNKNOWN = {"name": "nope", "ref": "nope", "alias": "prod", "version": "1", "key": "owner", "job_id": "nope",
           "model_id": "nope"}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    settings = settings_for(tmp_path_factory.mktemp("answers"), max_body_bytes=100_000)
    app = create_app(settings)
    with TestClient(app) as client:
        populate(app.state.vb.registry)
        yield client, app.openapi(), settings


def _operations(doc):
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            yield method.upper(), path, op


def _url(path: str, values: dict | None = None) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: (values or UNKNOWN)[m.group(1)], path)


def _declared(op) -> set[int]:
    return {int(c) for c in op["responses"]}


def _check(seen: list, method: str, path: str, op, status: int) -> None:
    seen.append((method, path, status, status in _declared(op)))


def _undeclared(seen):
    return [s[:3] for s in seen if not s[3]]


def test_the_guards_answers_are_declared_on_every_route(world):
    client, doc, settings = world
    seen = []
    for method, path, op in _operations(doc):
        url = _url(path)
        r = client.request(method, url, headers=[("authorization", W["Authorization"]),
                                                 ("content-type", "application/json"), ("content-type", "text/plain")])
        assert r.status_code == 400 and r.json()["error"]["type"] == "InvalidHeaderError", (method, path, r.text)
        _check(seen, method, path, op, r.status_code)
        if op.get("security") or path == "/metrics":
            for headers in ({}, R, WONLY):  # no key; each one-scope key: one of them lacks the route's scope
                _check(seen, method, path, op, client.request(method, url, headers=headers).status_code)
        if method not in ("GET", "HEAD", "DELETE"):
            limit, _ = body_limit(settings, method, path)
            r = client.request(method, url, content=b" " * (limit + 1),
                               headers={**W, "content-type": "application/json"})
            assert r.status_code == 413, (method, path, r.status_code, r.text[:200])
            _check(seen, method, path, op, r.status_code)
    statuses = {s[2] for s in seen}
    assert {400, 401, 403, 413} <= statuses
    assert not _undeclared(seen), _undeclared(seen)


def test_unknown_names_are_declared_answers(world):
    """Each route whose path names something, called with names nothing has (and its first example's body)."""
    client, doc, _ = world
    seen = []
    for method, path, op in _operations(doc):
        if "{" not in path:
            continue
        examples = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("examples", {})
        body = next(iter(examples.values()))["value"] if examples else None
        r = client.request(method, _url(path), json=body, headers=W)
        assert r.status_code < 500 or r.status_code == 503, (method, path, r.status_code, r.text[:300])
        _check(seen, method, path, op, r.status_code)
    assert ("POST", "/v1/maps/{ref}/evaluate", 404, True) in seen
    assert sum(s[2] == 404 for s in seen) > 20
    assert not _undeclared(seen), _undeclared(seen)


def test_the_metrics_answers_are_declared(world, tmp_path):
    client, doc, _ = world
    op = doc["paths"]["/metrics"]["get"]
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=WONLY).status_code == 403
    with TestClient(create_app(settings_for(tmp_path, metrics_access="off"))) as off:
        assert off.get("/metrics", headers=R).status_code == 404
    assert {401, 403, 404} <= _declared(op)


def test_metrics_before_the_start_up_is_a_declared_503(world, tmp_path):
    """Called before the app's start-up has made its state (an ASGI server that runs no lifespan, a request raced
    ahead of it), /metrics was an undeclared 500 (AttributeError) where every other route says 503."""
    _, doc, _ = world
    c = TestClient(create_app(settings_for(tmp_path)), raise_server_exceptions=False)  # no `with`: no start-up
    r = c.get("/metrics", headers=R)
    assert r.status_code == 503, (r.status_code, r.text)
    err = r.json()["error"]
    assert err["type"] == "ServiceUnavailableError" and "starting" in err["message"], err
    assert 503 in _declared(doc["paths"]["/metrics"]["get"])
    assert c.get("/v1/info", headers=R).status_code == 503  # as the other routes answer then


def test_every_json_answer_has_a_schema(world):
    _, doc, _ = world
    empty = [(method, path, status) for method, path, op in _operations(doc) for status, resp in op["responses"].items()
             if resp.get("content", {}).get("application/json", {"schema": {"x": 1}}).get("schema") == {}]
    assert not empty, empty
    plans = doc["paths"]["/v1/plans"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert plans == {"$ref": "#/components/schemas/PlanResponse"}


def test_every_answer_declares_the_request_id_it_carries(world):
    """Every answer carries ``X-Request-ID`` (the request's own, cut to 64 characters, or a new one), but no answer
    of the document declared it, so a generated client had no accessor for the id to quote. Each operation is called
    (names nothing has), with an id, with a longer one and with none: the header is there, is the declared one of
    that operation and status, and fits the declared schema."""
    jsonschema = pytest.importorskip("jsonschema")
    client, _, _ = world
    doc = client.get("/openapi.json", headers=R).json()
    assert doc["components"]["headers"]["X-Request-ID"]["schema"]["maxLength"] == 64
    schema = doc["components"]["headers"]["X-Request-ID"]["schema"]
    ref = {"$ref": "#/components/headers/X-Request-ID"}
    seen = set()
    for method, path, op in _operations(doc):
        for n, sent in enumerate((f"{method}-{path}"[:64], "x" * 100, None)):
            headers = {**W, **({"X-Request-ID": sent} if sent else {})}
            r = client.request(method, _url(path), headers=headers)
            got = r.headers.get("x-request-id")
            assert got, (method, path, r.status_code)
            jsonschema.validate(got, schema)
            assert got == sent[:64] if sent else re.fullmatch("[0-9a-f]{32}", got), (method, path, sent, got)
            declared = op["responses"].get(str(r.status_code), {}).get("headers", {})
            assert declared.get("X-Request-ID") == ref, (method, path, r.status_code, declared)
            seen.add(r.status_code)
    assert {200, 404, 422} <= seen, seen
    undeclared = [(method, path, status) for method, path, op in _operations(doc)
                  for status, answer in op["responses"].items() if answer.get("headers", {}).get("X-Request-ID") != ref]
    assert not undeclared, undeclared


def test_a_405_allows_every_method_of_the_path(world):
    """``Allow`` named only the methods of the first route whose path matched (``PATCH /v1/indexes/x``: ``GET``, though
    ``DELETE /v1/indexes/{name}`` exists); RFC 9110 asks for every method the resource takes: here, every operation
    the document has at a path the URL matches (and HEAD where a route takes it outside the document)."""
    client, doc, _ = world
    templates = {re.compile("^" + re.sub(r"\\{\w+\\}", "[^/]+", re.escape(p)) + "$"): p for p in doc["paths"]}
    several = 0
    for path in doc["paths"]:
        url = _url(path)
        documented = {m.upper() for rx, p in templates.items() if rx.match(url) for m in doc["paths"][p]}
        r = client.request("PATCH", url, headers=W)
        assert r.status_code == 405 and r.json()["error"]["type"] == "MethodNotAllowed", (url, r.text)
        allow = set(r.headers["allow"].split(", "))
        # HEAD exactly where GET is (RFC 9110 9.1): kept out of the document, named by Allow
        assert allow == documented | ({"HEAD"} if "GET" in documented else set()), (url, allow, documented)
        several += len(documented) > 1
    assert several >= 10
    assert client.request("PATCH", "/v1/indexes/x", headers=W).headers["allow"] == "DELETE, GET, HEAD"
    assert client.request("PUT", "/v1/spaces", headers=W).headers["allow"] == "GET, HEAD, POST"
    assert client.request("HEAD", "/v1/fits", headers=W).headers["allow"] == "POST"  # no GET: no HEAD


def test_every_get_route_answers_head(world):
    """HEAD of every GET route but the probes was a 405 (allow: GET): RFC 9110 9.1 asks a general-purpose server for
    HEAD, and caches and monitors probe artifacts' ETags with it. Every GET of the document now answers HEAD with its
    status and headers (here with names that exist, names nothing has, and no key: auth applies alike), and the
    document gains no HEAD operation."""
    client, doc, _ = world
    known = {**UNKNOWN, "ref": "a2b", "name": "a2b"}
    gets = [path for path in doc["paths"] if "get" in doc["paths"][path]]
    assert len(gets) >= 20 and not [p for p in doc["paths"] if "head" in doc["paths"][p]]
    for path in gets:
        for values, headers in ((known, R), (UNKNOWN, R), (known, {})):
            url = _url(path, values)
            get, head = client.get(url, headers=headers), client.head(url, headers=headers)
            assert head.status_code == get.status_code != 405, (url, headers, head.status_code, get.status_code)
            same = ("content-type", "etag", "cache-control", "www-authenticate")
            assert [head.headers.get(h) for h in same] == [get.headers.get(h) for h in same], url
            if get.status_code != 200 or path not in ("/metrics", "/v1/info"):  # counters and uptime: lengths move
                assert head.headers.get("content-length") == get.headers.get("content-length"), url


def test_an_undecidable_gate_answers_what_the_readme_says(world):
    """README said an undecidable retention gate is an HTTP 400; the service answers 422 (InputError), as for
    any other input that cannot be judged."""
    from pathlib import Path

    from _api_support import planted

    client, _, _ = world
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8")
    (claim,) = re.findall(r"can be neither passed nor failed: `eval` exits 2 \(HTTP (\d{3})\)", readme)
    X, Y, _ = planted()  # the rows of a2b (populate)
    relevant = list(range(0, 60, 3))
    r = client.post("/v1/maps/a2b/evaluate", headers=R, json={
        "source": {"vectors": X[:64].tolist()}, "target": {"vectors": Y[:64].tolist()},
        "queries": {"vectors": (-Y[relevant]).tolist()}, "relevant": relevant, "min_retention": 0.5})
    assert r.status_code == int(claim) == 422, r.text  # each query's relevant document is its farthest
    assert r.json()["error"]["type"] == "InputError" and "cannot be decided" in r.json()["error"]["message"]


@pytest.mark.parametrize("config", [{}, {"metrics_access": "open"}, {"metrics_access": "off"},
                                    {"auth_disabled": True}])
def test_security_is_declared_exactly_where_a_key_is_needed(tmp_path, config):
    """A generated client sends the key where the document's ``security`` asks for it: ``/metrics`` answered 401
    without a key (``metrics_access=key``, the default) but declared no ``security``, so openapi-generator's
    ``metricsMetricsGet`` never sent one; with auth off every route still declared the key. Each operation, called
    without a key under each setting, answers 401 exactly when it declares ``security`` (and declares 401 / 403 only
    then); with auth off every route answers another site's page 403 ``CrossSiteRequestError``, declared."""
    app = create_app(settings_for(tmp_path, **config))
    with TestClient(app, base_url="http://localhost") as client:  # auth off answers loopback Host names only
        doc = client.get("/openapi.json").json()
        keyed, seen = set(), []
        for method, path, op in _operations(doc):
            r = client.request(method, _url(path))
            if r.status_code == 401:
                keyed.add((method, path))
            assert bool(op.get("security")) == (r.status_code == 401), (config, method, path, r.status_code)
            assert {401, 403} <= _declared(op) if op.get("security") else 401 not in _declared(op), (method, path)
            if config.get("auth_disabled"):
                r = client.request(method, _url(path), headers={"Origin": "https://elsewhere.example"})
                assert r.status_code == 403 and r.json()["error"]["type"] == "CrossSiteRequestError", (path, r.text)
                _check(seen, method, path, op, r.status_code)
            elif not op.get("security"):
                assert 403 not in _declared(op), (method, path)
        assert not _undeclared(seen), _undeclared(seen)
    metrics = ("GET", "/metrics")
    if config.get("auth_disabled"):
        assert not keyed and "securitySchemes" not in doc["components"] and len(seen) > 50
    else:
        assert len(keyed) > 50 and (metrics in keyed) == (config.get("metrics_access", "key") == "key"), config
        assert ("GET", "/healthz") not in keyed and "HTTPBearer" in doc["components"]["securitySchemes"]


def test_the_headers_a_client_reads_are_declared_with_their_answers(tmp_path):
    """``Location`` (a job's 202 and replay), ``Retry-After`` (429 / 503), ``X-Shape`` / ``X-Map`` / ``X-Map-Version``
    (a transform, an artifact) and ``WWW-Authenticate`` (401) were sent but declared on no answer, so a generated
    client had no accessor for them; and a browser page could not read ``Location`` (not in the CORS exposed
    headers). Each such header a real answer carries is declared for its operation and status."""
    import numpy as np
    from _api_support import served_world

    from service.api.app import EXPOSED_HEADERS

    watched = {h.lower() for h in EXPOSED_HEADERS} | {"www-authenticate", "location"}
    seen = []

    def check(doc, method, path, r):
        op = doc["paths"][path][method.lower()]
        declared = {h.lower() for h in op["responses"].get(str(r.status_code), {}).get("headers", {})}
        carried = {h for h in r.headers if h in watched}
        assert carried <= declared, (method, path, r.status_code, carried - declared)
        seen.append((r.status_code, *sorted(carried)))

    with served_world(tmp_path, cors_origins=["https://app.example"]) as (c, app, data):
        doc = app.openapi()
        fit = {"name": "hdr", "source_space": "a", "target_space": "b", "method": "procrustes", "paired": True,
               "source": {"vectors": data["X"][:40].tolist()}, "target": {"vectors": data["Y"][:40].tolist()}}
        for _ in range(2):  # 202, then the idempotent replay's 200
            check(doc, "POST", "/v1/fits", c.post("/v1/fits", json=fit, headers={**W, "Idempotency-Key": "h1"}))
        rows = np.ascontiguousarray(data["X"][:3], dtype="<f4").tobytes()
        r = c.post("/v1/maps/a2b/transform", content=rows, headers={**R, "content-type": "application/octet-stream"})
        assert r.headers["x-shape"] == "3,16"
        check(doc, "POST", "/v1/maps/{ref}/transform", r)
        check(doc, "POST", "/v1/maps/{ref}/transform", c.post("/v1/maps/a2b/transform", headers=R,
                                                               json={"vectors": data["X"][:1].tolist()}))
        r = c.get("/v1/maps/a2b/artifact", headers=R)
        check(doc, "GET", "/v1/maps/{ref}/artifact", r)
        check(doc, "GET", "/v1/maps/{ref}/artifact",
              c.get("/v1/maps/a2b/artifact", headers={**R, "If-None-Match": r.headers["etag"]}))
        check(doc, "GET", "/metrics", c.get("/metrics"))
        r = c.post("/v1/fits", json=fit, headers={**W, "Origin": "https://app.example"})
        assert "location" in {h.strip().lower() for h in r.headers["access-control-expose-headers"].split(",")}
    cold = TestClient(create_app(settings_for(tmp_path / "cold")), raise_server_exceptions=False)  # no start-up
    check(doc, "GET", "/v1/info", cold.get("/v1/info", headers=R))
    assert {s[0] for s in seen} == {200, 202, 304, 401, 503}, seen
    assert {"location", "x-shape", "x-map", "retry-after", "www-authenticate"} <= {h for s in seen for h in s[1:]}
    for path, ops in doc["paths"].items():  # the 429 / 503 of every operation, wherever a route can give one
        for method, op in ops.items():
            for status in ("429", "503"):
                if status in op["responses"]:
                    assert "Retry-After" in op["responses"][status].get("headers", {}), (method, path, status)
