"""The batch-1 fast path (service/api/fastpath.py) answers exactly as the routes do, and sees registry changes.

Every request is sent twice to the same app: once as is (small bodies take the fast path) and once with
the fast path switched off (``FAST_MAX_BYTES = FAST_BINARY_MAX_BYTES = -1``: the FastAPI route answers); status, body and the
headers that describe the answer must be equal, for successes and for errors alike.
"""

from __future__ import annotations

import base64
import io
import json
import socket
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from align import fit_procrustes
from service.api import fastpath
from service.registry import open_registry
from _api_support import R, W, planted, populate, served_world, settings_for
from _servers import serve_in_thread

SAME_HEADERS = ("content-type", "content-length", "x-map", "x-map-version", "x-shape", "www-authenticate")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with served_world(tmp_path_factory.mktemp("fast")) as (client, app, data):
        app.state.vb.indexes.create("ix", "b", data["Y"][:200], dim=16)
        yield client, app, data


def both(c, monkeypatch, method: str, url: str, **kw):
    """(fast-path answer, route answer) of the same request."""
    fast = c.request(method, url, **kw)
    with monkeypatch.context() as m:
        m.setattr(fastpath, "FAST_MAX_BYTES", -1)
        m.setattr(fastpath, "FAST_BINARY_MAX_BYTES", -1)
        slow = c.request(method, url, **kw)
    return fast, slow


def assert_same(fast, slow):
    assert fast.status_code == slow.status_code, (fast.text[:300], slow.text[:300])
    assert fast.content == slow.content
    for h in SAME_HEADERS:
        assert fast.headers.get(h) == slow.headers.get(h), h


def octet(X, **headers):
    return {"content": np.ascontiguousarray(X, np.float32).tobytes(),
            "headers": {**R, "content-type": "application/octet-stream", **headers}}


def npy(X):
    buf = io.BytesIO()
    np.save(buf, np.asarray(X, np.float32))
    return {"content": buf.getvalue(), "headers": {**R, "content-type": "application/x-npy"}}


def js(obj):
    return {"content": json.dumps(obj).encode(), "headers": {**R, "content-type": "application/json"}}


def test_transform_answers_match_the_route(world, monkeypatch):
    c, _, data = world
    X = data["X"][:3]
    b64 = base64.b64encode(np.ascontiguousarray(X).tobytes()).decode()
    cases = [
        ("/v1/maps/a2b/transform", octet(X)),
        ("/v1/maps/a2b/transform", octet(X, accept="application/json")),
        ("/v1/maps/a2b/transform?output=frame", octet(X)),
        ("/v1/maps/a2b/transform?dim=16&output=linear", octet(X)),
        ("/v1/maps/a2b/transform", octet(X, **{"x-vector-dim": "16"})),
        ("/v1/maps/a2b/transform", npy(X)),
        ("/v1/maps/a2b@prod/transform", js({"vectors": X.tolist()})),
        ("/v1/maps/a2b:1/transform", js({"vectors": X.tolist(), "output": "frame"})),
        ("/v1/maps/a2b/transform?encoding_format=base64", js({"vectors_b64": b64, "dim": 16})),
        ("/v1/maps/b2c/transform", js({"vectors": X.tolist(), "encoding_format": "base64"})),
    ]
    for url, kw in cases:
        fast, slow = both(c, monkeypatch, "POST", url, **kw)
        assert fast.status_code == 200, (url, fast.text)
        assert_same(fast, slow)


@pytest.mark.parametrize("accept,body,answer", [
    ("application/octet-stream, application/json;q=0.5", "octet", "binary"),  # each was JSON: a substring test
    ("application/json;q=0", "octet", "binary"),
    ("application/x-npy, application/json;q=0.1", "npy", "binary"),
    ("application/npy;q=0.2, application/json;q=0.1", "npy", "binary"),
    ("application/json, */*;q=0.1", "octet", "json"),
    ("application/json;q=0.5", "npy", "json"),
    ("Application/JSON; charset=utf-8", "octet", "json"),
    ("application/octet-stream;q=0.4, application/json;q=0.5", "octet", "json"),
    ("application/octet-stream;q=0, */*", "octet", "json"),
    ("*/*", "octet", "binary"),  # a tie: the request's own type
    ("application/json, application/octet-stream", "octet", "binary"),
    ("text/html", "npy", "binary"),  # nothing offered is acceptable: as before, the request's type (no 406)
    (["application/octet-stream", "application/json;q=0.5"], "octet", "binary"),  # two headers: one list
])
def test_accept_q_values_choose_the_answer_on_the_fast_path_and_the_route(world, monkeypatch, accept, body, answer):
    """``Accept`` was matched by substring: ``application/json;q=0`` or a JSON range ranked below the binary type
    answered JSON. Now by q-value (RFC 9110 12.5.1): JSON only where it ranks above the request's binary type; the
    fast path and the route choose alike."""
    c, _, data = world
    X = data["X"][:3]
    kw = octet(X) if body == "octet" else npy(X)
    headers = [(k, v) for k, v in kw.pop("headers").items()]
    headers += [("accept", a) for a in ([accept] if isinstance(accept, str) else accept)]
    fast, slow = both(c, monkeypatch, "POST", "/v1/maps/a2b/transform", headers=headers, **kw)
    assert fast.status_code == 200, fast.text
    assert_same(fast, slow)
    want = "application/json" if answer == "json" else (
        "application/octet-stream" if body == "octet" else "application/x-npy")
    assert fast.headers["content-type"] == want, (accept, fast.headers["content-type"])


def test_binary_without_a_content_type_is_told_json_was_assumed(world, monkeypatch):
    """Raw float32 rows sent with no Content-Type were answered "body is not valid JSON: str is not valid UTF-8:
    surrogates not allowed", no word of the header; now the message says JSON is assumed without one and names the
    binary types (fast path, route and a chunked body alike). An explicit application/json names the raw type."""
    c, _, data = world
    rows = np.ascontiguousarray(data["X"][:3], np.float32).tobytes()
    for body in (rows, b"{not json"):
        fast, slow = both(c, monkeypatch, "POST", URL, content=body, headers=R)
        assert_same(fast, slow)
        chunked = c.post(URL, content=iter([body]), headers=R)
        for r in (fast, chunked):
            msg = r.json()["error"]["message"]
            assert r.status_code == 422 and msg.startswith("body is not valid JSON ("), msg
            assert msg.endswith("without a Content-Type the body is read as JSON; send binary vectors with "
                                "Content-Type: application/octet-stream (raw float32) or application/x-npy"), msg
    typed = c.post(URL, content=rows, headers={**R, "content-type": "application/json"}).json()["error"]["message"]
    assert typed.startswith("body is not valid JSON: ") and "without a Content-Type" not in typed, typed
    assert c.post(URL, content=json.dumps({"vectors": data["X"][:1].tolist()}), headers=R).status_code == 200


def test_a_body_sent_under_the_other_type_is_told_which_type_it_looks_like(world, monkeypatch):
    """A JSON body sent as application/octet-stream read "body holds 1935 bytes, not a whole number of rows of 16
    float32" alone, and raw float32 sent as application/json "body is not valid JSON: str is not valid UTF-8": each
    now names the type the body looks like (fast path and route alike). A JSON body cut short keeps the plain
    message: it is JSON, sent as JSON."""
    c, _, data = world
    as_json = json.dumps({"vectors": data["X"][:2].tolist()}).encode()
    as_json += b" " * (-len(as_json) % 4 + 1)  # not a whole number of 16-float rows, nor of 4-byte floats
    for ct, body in (("application/octet-stream", as_json), ("application/octet-stream", b"  " + as_json[:-2]),
                     ("application/x-npy", as_json)):
        fast, slow = both(c, monkeypatch, "POST", URL, content=body, headers={**R, "content-type": ct})
        assert_same(fast, slow)
        msg = fast.json()["error"]["message"]
        assert fast.status_code == 422 and msg.endswith("it looks like JSON: send Content-Type: application/json"), msg
    rows = np.ascontiguousarray(data["X"][:3], np.float32).tobytes()
    fast, slow = both(c, monkeypatch, "POST", URL, content=rows, headers={**R, "content-type": "application/json"})
    assert_same(fast, slow)
    msg = fast.json()["error"]["message"]
    assert msg.startswith("body is not valid JSON: ") and msg.endswith(
        "; for raw float32 rows send Content-Type: application/octet-stream with ?dim=N"), msg
    cut = c.post(URL, content=as_json[:40], headers={**R, "content-type": "application/json"}).json()["error"]
    assert "octet-stream" not in cut["message"], cut
    odd = c.post(URL, content=rows[:-1], headers={**R, "content-type": "application/octet-stream"}).json()["error"]
    assert "looks like JSON" not in odd["message"], odd


def test_transform_errors_match_the_route(world, monkeypatch):
    c, _, data = world
    X = data["X"][:2]
    bad = X.copy()
    bad[1, 3] = np.nan
    cases = [
        ("/v1/maps/a2b/transform", octet(bad)),  # NaN: 422 before any numerics
        ("/v1/maps/a2b/transform", octet(np.full((1, 16), np.inf))),
        ("/v1/maps/a2b/transform", octet(X[:, :12])),  # 48 bytes: not whole rows of 16
        ("/v1/maps/a2b/transform?dim=12", octet(X[:, :12])),  # wrong width for the map
        ("/v1/maps/a2b/transform?dim=0", octet(X)),  # the route's query validation
        ("/v1/maps/a2b/transform?dim=", octet(X)),
        ("/v1/maps/a2b/transform?dim=99999999", octet(X)),
        ("/v1/maps/a2b/transform?output=sideways", octet(X)),
        ("/v1/maps/a2b/transform", octet(X, **{"x-vector-dim": "abc"})),
        ("/v1/maps/a2b/transform", {"content": b"", "headers": {**R, "content-type": "application/octet-stream"}}),
        ("/v1/maps/a2b/transform", {"content": b"x", "headers": {**R, "content-type": "text/plain"}}),
        ("/v1/maps/nope/transform", octet(X)),
        ("/v1/maps/a2b:99/transform", js({"vectors": X.tolist()})),
        ("/v1/maps/a2b/transform", js({"vectors": [[1.0, 2.0], [3.0]]})),
        ("/v1/maps/a2b/transform", js({"vectors": X.tolist(), "vectors_b64": "AAAA"})),
        ("/v1/maps/a2b/transform", {"content": b"{not json", "headers": {**R, "content-type": "application/json"}}),
        ("/v1/maps/a2b/transform", js({"vectors": [[1e39] * 16]})),
    ]
    for url, kw in cases:
        fast, slow = both(c, monkeypatch, "POST", url, **kw)
        assert 400 <= fast.status_code < 500, (url, fast.status_code, fast.text)
        assert_same(fast, slow)


def test_search_answers_and_errors_match_the_route(world, monkeypatch):
    c, _, data = world
    X = data["X"][:2]
    b64 = base64.b64encode(np.ascontiguousarray(X).tobytes()).decode()
    url = "/v1/indexes/ix/search"
    cases = [
        (url, js({"vectors_b64": b64, "dim": 16, "space": "a", "k": 5}), 200),
        (url, js({"vectors": X.tolist(), "space": "a", "k": 3, "include_payloads": False}), 200),
        (url, js({"vectors": data["Y"][:1].tolist(), "k": 4, "csls": True, "csls_k": 3}), 200),
        (url, js({"vectors": X.tolist(), "space": "a", "k": 0}), 422),
        (url, js({"vectors": X.tolist(), "space": "a", "k": 10**9}), 422),
        (url, js({"vectors": [[float("nan")] * 16], "space": "a"}), 422),
        (url, js({"vectors": X[:, :8].tolist(), "space": "a"}), 422),
        (url, js({"vectors": X.tolist(), "space": "nowhere"}), 404),
        ("/v1/indexes/none/search", js({"vectors": X.tolist()}), 404),
        (url, {"content": b"{}", "headers": {**R, "content-type": "application/octet-stream"}}, 415),
    ]
    for u, kw, status in cases:
        fast, slow = both(c, monkeypatch, "POST", u, **kw)
        assert fast.status_code == status, (kw, fast.text)
        assert_same(fast, slow)


def test_guard_still_runs_before_the_fast_path(world):
    c, _, data = world
    body = octet(data["X"][:1])
    assert c.post("/v1/maps/a2b/transform", content=body["content"],
                  headers={"content-type": "application/octet-stream"}).status_code == 401
    r = c.post("/v1/maps/a2b/transform", content=body["content"],
               headers={"content-type": "application/octet-stream", "Authorization": "Bearer wonly-789"})
    assert r.status_code == 403


def _count_hops(monkeypatch) -> tuple[list, list]:
    hops, replays = [], []
    real_hop = fastpath._hop

    async def counting_hop(state, fn, nbytes, request):
        hops.append(nbytes)  # the body size of each hop
        return await real_hop(state, fn, nbytes, request)

    monkeypatch.setattr(fastpath, "_hop", counting_hop)
    real_replay = fastpath._replay  # counted, and still replayed: a request the app must answer never hangs
    monkeypatch.setattr(fastpath, "_replay", lambda body, receive: replays.append(1) or real_replay(body, receive))
    return hops, replays


def test_binary_transforms_of_any_size_take_the_shortcut_json_only_when_small(world, monkeypatch):
    """Binary bodies above FAST_MAX_BYTES still skip FastAPI (one hop) and answer as the route does, errors too;
    a JSON body above it goes to the route."""
    c, _, data = world
    monkeypatch.setattr(fastpath, "FAST_MAX_BYTES", 1024)  # 1,000 rows of 16 floats (the world's max_batch) fit
    monkeypatch.setattr(fastpath, "ALONE_INLINE_WORK", 0)  # its hop shows the shortcut ran (alone it is inline: below)
    X = np.random.default_rng(3).standard_normal((900, 16)).astype(np.float32)
    bad = X.copy()
    bad[-1, -1] = np.inf  # the last value of a 57.6 kB body
    url = "/v1/maps/a2b/transform"
    cases = [(octet(X), 200), (npy(X), 200), (octet(X, accept="application/json"), 200), (octet(bad), 422),
             (octet(np.vstack([X, X])), 413), (octet(X[:, :15]), 422)]
    for kw, status in cases:
        hops, replays = _count_hops(monkeypatch)
        fast = c.post(url, **kw)
        assert fast.status_code == status, fast.text[:200]
        assert len(hops) == 1 and len(replays) == (status != 200)  # the shortcut ran; failures replayed
        monkeypatch.undo()
        monkeypatch.setattr(fastpath, "FAST_MAX_BYTES", 1024)
        monkeypatch.setattr(fastpath, "ALONE_INLINE_WORK", 0)
        _, slow = both(c, monkeypatch, "POST", url, **kw)
        assert_same(fast, slow)
    hops, replays = _count_hops(monkeypatch)
    r = c.post(url, **js({"vectors": X.tolist()}))
    assert r.status_code == 200 and hops == [] and replays == []  # a large JSON body: the route answered
    np.testing.assert_array_equal(np.asarray(r.json()["vectors"], np.float32),
                                  np.frombuffer(c.post(url, **octet(X)).content, "<f4").reshape(900, 16))


def test_a_large_binary_body_is_held_once_while_it_is_served(tmp_path):
    """The shortcut joins the body's chunks and lets them go: peak memory of a 9.6 MB transform stays near
    body + answer (the chunks kept alive beside the joined body made it body x 2 + answer)."""
    import asyncio
    import tracemalloc

    with served_world(tmp_path, max_batch=200_000, max_body_bytes=20_000_000) as (_, app, data):
        X = np.random.default_rng(0).standard_normal((150_000, 16)).astype(np.float32)
        raw = X.tobytes()
        step = 256_000
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
                 "path": "/v1/maps/a2b/transform", "raw_path": b"/v1/maps/a2b/transform", "query_string": b"",
                 "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2), "state": {},
                 "headers": [(b"host", b"x"), (b"authorization", R["Authorization"].encode()),
                             (b"content-type", b"application/octet-stream"),
                             (b"content-length", str(len(raw)).encode())]}

        async def serve():
            offsets = iter(range(0, len(raw), step))
            sent = []

            async def receive():
                s = next(offsets, None)
                if s is None:
                    await asyncio.sleep(3600)
                # a fresh bytes object per message, as the server hands them over
                return {"type": "http.request", "body": bytes(bytearray(raw[s : s + step])),
                        "more_body": s + step < len(raw)}

            async def send(msg):
                sent.append(msg)

            await app(scope, receive, send)
            return sent

        tracemalloc.start()
        try:
            sent = asyncio.run(serve())
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert sent[0]["status"] == 200
    body = b"".join(bytes(m.get("body", b"")) for m in sent[1:])
    np.testing.assert_allclose(np.frombuffer(body, "<f4").reshape(X.shape), data["a2b"].apply(X), atol=1e-6)
    assert peak < 2.5 * len(raw), (peak, len(raw))


def test_small_transform_runs_on_the_loop_without_io_and_sees_every_registry_change(world, monkeypatch, tmp_path):
    c, app, data = world
    state = app.state.vb
    X = data["X"][:1]
    hops, replays = _count_hops(monkeypatch)
    url = "/v1/maps/a2b@prod/transform"
    first = c.post(url, **octet(X))
    assert first.status_code == 200
    hops.clear()
    queries = []
    monkeypatch.setattr(state.registry, "generation_token",
                        lambda real=state.registry.generation_token: queries.append(1) or real())
    again = c.post(url, **octet(X))
    assert again.status_code == 200 and again.content == first.content
    assert hops == [] and queries == [] and replays == []  # answered on the loop: no thread, no query

    # another process (another Registry on the same file) moves the alias: the very next request sees it
    m2 = fit_procrustes(data["X"][:300] * 2.0, data["Y"][:300])
    other = open_registry(state.settings.resolved_registry_url(), state.settings.resolved_artifact_dir())
    try:
        v2 = other.register_version("a2b", m2, source_space="a", target_space="b", method="procrustes", params={},
                                    alias="prod")
    finally:
        other.close()
    moved = c.post(url, **octet(X))
    assert moved.status_code == 200 and moved.headers["x-map-version"] == str(v2.version)
    assert queries and replays == []  # the change token moved, so the registry was asked again
    back = c.put("/v1/maps/a2b/aliases/prod", json={"version": 1}, headers=W)
    assert back.status_code == 200
    assert c.post(url, **octet(X)).headers["x-map-version"] == "1"


def test_change_token_moves_with_every_commit_and_only_then(tmp_path):
    reg = open_registry(f"sqlite:///{(tmp_path / 'r.sqlite').resolve()}", tmp_path / "art")
    other = open_registry(f"sqlite:///{(tmp_path / 'r.sqlite').resolve()}", tmp_path / "art")
    try:
        t0 = reg.change_token()
        assert t0 is not None and reg.generation_token() == ((reg.generation(), ""), t0)  # no write yet: no id
        reg.list_spaces()
        reg.generation()
        assert reg.change_token() == t0  # reads change nothing
        other.register_space("a", 16)  # a write through another connection
        t1 = reg.change_token()
        assert t1 != t0 and reg.generation_token()[1] == t1
        X, Y, _ = planted(100)
        other.register_version("m", fit_procrustes(X, Y), source_space="a", target_space="a", method="p", params={})
        assert reg.change_token() != t1
    finally:
        reg.close()
        other.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 40), output=st.sampled_from([None, "raw", "frame", "linear"]),
       fmt=st.sampled_from(["octet", "npy", "json", "b64"]), seed=st.integers(0, 2**16))
def test_fast_path_equals_route_for_any_batch(world, monkeypatch, n, output, fmt, seed):
    c, _, _ = world
    X = np.random.default_rng(seed).standard_normal((n, 16)).astype(np.float32)
    url = "/v1/maps/a2b/transform" + (f"?output={output}" if output else "")
    if fmt == "octet":
        kw = octet(X)
    elif fmt == "npy":
        kw = npy(X)
    elif fmt == "json":
        kw = js({"vectors": X.tolist()})
    else:
        kw = js({"vectors_b64": base64.b64encode(X.tobytes()).decode(), "dim": 16, "encoding_format": "base64"})
    fast, slow = both(c, monkeypatch, "POST", url, **kw)
    assert fast.status_code == 200, fast.text
    assert_same(fast, slow)


# --- small searches on the event loop ------------------------------------------------------------
@pytest.fixture(scope="module")
def loop_index(world):
    c, app, data = world
    app.state.vb.indexes.create("loop", "b", data["Y"][:300], dim=16)
    return "/v1/indexes/loop/search"


def test_small_search_runs_on_the_loop_without_io(world, loop_index, monkeypatch):
    c, app, data = world
    state = app.state.vb
    X = data["X"][:1]
    bodies = [js({"vectors": X.tolist(), "space": "a", "k": 5}),  # through the path of maps a -> b
              js({"vectors": X.tolist(), "space": "a", "map": "a2b@prod", "k": 5}),  # a named map
              js({"vectors": X.tolist(), "space": "a", "map": ["a2b:1"], "k": 5}),  # a pinned path (a list)
              js({"vectors": data["Y"][:2].tolist(), "k": 3})]  # the index's own space
    firsts = [c.post(loop_index, **b) for b in bodies]  # resolve and load once
    assert all(r.status_code == 200 for r in firsts)
    hops, replays = _count_hops(monkeypatch)
    queries = []
    monkeypatch.setattr(state.registry, "generation_token",
                        lambda real=state.registry.generation_token: queries.append(1) or real())
    for body, first in zip(bodies, firsts):
        again = c.post(loop_index, **body)
        assert again.status_code == 200 and again.content == first.content
        fast, slow = both(c, monkeypatch, "POST", loop_index, **body)
        assert_same(fast, slow)
    assert hops == [] and queries == [] and replays == []  # on the loop: no thread, no query, no replay


@pytest.mark.parametrize("extra", [{"csls": True, "csls_k": 3}, {"exact": True}, {"k": 300}])
def test_searches_that_are_not_small_take_the_thread_pool(world, loop_index, monkeypatch, extra):
    c, _, data = world
    body = js({"vectors": data["X"][:1].tolist(), "space": "a", "k": 5, **extra})
    c.post(loop_index, **body)
    hops, replays = _count_hops(monkeypatch)
    if "csls" not in extra:  # exact / larger k are small on 300 rows: shrink the budget instead
        monkeypatch.setattr("service.indexes.space.SMALL_SEARCH_WORK", 300 * 16 - 1)
    fast, slow = both(c, monkeypatch, "POST", loop_index, **body)
    assert fast.status_code == 200, fast.text
    assert_same(fast, slow)
    assert len(hops) == 1 and replays == []


def test_a_search_waits_for_a_writer_in_the_pool_never_on_the_loop(world, loop_index, monkeypatch):
    import threading

    c, app, data = world
    idx = app.state.vb.indexes.get("loop")
    body = js({"vectors": data["Y"][:1].tolist(), "k": 3})
    expected = c.post(loop_index, **body)
    hops, _ = _count_hops(monkeypatch)
    answer = {}
    with idx.lock.write():  # a writer holds the index
        t = threading.Thread(target=lambda: answer.setdefault("r", c.post(loop_index, **body)))
        t.start()
        _until(lambda: hops, "the search to be handed to the pool")
        assert len(hops) == 1  # handed to the pool instead of waiting on the loop ...
        assert c.get("/healthz").status_code == 200  # ... which keeps answering meanwhile
        assert "r" not in answer  # the search itself waits for the writer
    t.join(10)
    assert answer["r"].status_code == 200 and answer["r"].content == expected.content


def test_search_sees_rows_another_process_added(world, loop_index, monkeypatch):
    from service.indexes import IndexStore

    c, app, data = world
    new = np.zeros((1, 16), np.float32)
    new[0, 7] = 1.0  # unlike any planted row
    body = js({"vectors": new.tolist(), "k": 1})
    before = c.post(loop_index, **body).json()["results"][0][0]["id"]
    other = IndexStore(app.state.vb.indexes.root)  # another process's view of the same data dir
    (added,) = other.get("loop").add(new).tolist()
    assert added != before
    hops, _ = _count_hops(monkeypatch)
    after = c.post(loop_index, **body).json()["results"][0][0]
    assert after["id"] == added and after["score"] == pytest.approx(1.0, abs=1e-6)
    assert len(hops) == 1  # a newer generation on disk: loaded in the pool, not on the loop
    hops.clear()
    assert c.post(loop_index, **body).json()["results"][0][0]["id"] == added and hops == []


@pytest.fixture(scope="module")
def loop_indexes(world, loop_index):
    """A flat (``loop``), an HNSW and an IVF index of 300 rows: each kind's search options (``ef_search`` HNSW's,
    ``nprobe`` IVF's) are refused on the others, so a flat index alone made every ef / nprobe example a 422."""
    c, app, data = world
    for kind in ("hnsw", "ivf"):
        app.state.vb.indexes.create(f"loop_{kind}", "b", data["Y"][:300], dim=16, kind=kind)
    return {"flat": loop_index, "hnsw": "/v1/indexes/loop_hnsw/search", "ivf": "/v1/indexes/loop_ivf/search"}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["flat", "hnsw", "ivf"]), k=st.integers(-3, 400), exact=st.booleans(),
       csls=st.booleans(), ef=st.one_of(st.none(), st.integers(-5, 200_000), st.integers(1, 64)),
       nprobe=st.one_of(st.none(), st.integers(-5, 70_000), st.integers(1, 16)),
       scale=st.sampled_from([1.0, 1e-30, 1e30, 0.0]), n=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_search_on_the_loop_equals_the_route_for_any_parameters(world, loop_indexes, monkeypatch, kind, k, exact,
                                                                 csls, ef, nprobe, scale, n, seed):
    """Same answer on the loop and through the route, for a flat, an HNSW and an IVF index (each kind's own
    ``ef_search`` / ``nprobe`` reach its search; the others are 422 on both paths)."""
    c, _, data = world
    url = loop_indexes[kind]
    X = np.random.default_rng(seed).standard_normal((n, 16)) * scale
    body = {"vectors": X.tolist(), "space": "a", "k": k, "exact": exact, "csls": csls}
    body.update({key: v for key, v in (("ef_search", ef), ("nprobe", nprobe)) if v is not None})
    c.post(url, **js(body))  # resolved and loaded: the next try is on the loop where it is small
    fast, slow = both(c, monkeypatch, "POST", url, **js(body))
    assert fast.status_code in (200, 422), fast.text
    assert_same(fast, slow)


def test_the_loop_search_property_reaches_each_kinds_own_option(world, loop_indexes, monkeypatch):
    """The property above covers a search that uses ``ef_search`` / ``nprobe`` (200 on both paths), not refusals
    only: one example of each, answered on the loop and by the route alike."""
    c, _, data = world
    for kind, knob in (("hnsw", {"ef_search": 40}), ("ivf", {"nprobe": 4})):
        body = js({"vectors": data["X"][:2].tolist(), "space": "a", "k": 5, **knob})
        c.post(loop_indexes[kind], **body)
        fast, slow = both(c, monkeypatch, "POST", loop_indexes[kind], **body)
        assert fast.status_code == 200, fast.text
        assert_same(fast, slow)


# --- a large transform on the loop only while its request is the process's only one (ALONE_INLINE_WORK) ----------
# A client that sends its batches one after another (a migration's loop) skips the thread hop; as soon as another
# request is being answered (here one whose body is still arriving on another connection) the same transform hops,
# and the answer is the same bytes. The count behind it (ServiceMetrics.active) must come back to zero after every
# kind of ending, or the shortcut would silently stop. Real uvicorn, real sockets.
URL = "/v1/maps/a2b/transform"


@pytest.fixture
def server(tmp_path):
    import httpx

    from service.api import create_app

    app = create_app(settings_for(tmp_path, max_batch=1000, max_body_bytes=2_000_000))
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client, app, url, populate(app.state.vb.registry)


def _until(cond, what: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(0.01)


def _held(url: str, body: bytes) -> socket.socket:
    """A transform request whose headers and first half of the body are sent, the rest held back."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)))
    head = (f"POST {URL} HTTP/1.1\r\nhost: {host}\r\nauthorization: {R['Authorization']}\r\n"
            f"content-type: application/octet-stream\r\ncontent-length: {len(body)}\r\n\r\n").encode()
    s.sendall(head + body[: len(body) // 2])
    return s


def test_alone_on_the_loop_beside_another_request_on_a_thread_same_answer(server, monkeypatch):
    client, app, url, data = server
    metrics = app.state.vb.metrics
    X = np.random.default_rng(0).standard_normal((900, 16)).astype(np.float32)  # 57.6 kB: over INLINE_MAX_BYTES
    assert X.nbytes > fastpath.INLINE_MAX_BYTES

    assert client.post(URL, **octet(X[:1])).status_code == 200  # the map is loaded
    hops, _ = _count_hops(monkeypatch)
    alone = client.post(URL, **octet(X))
    assert alone.status_code == 200 and hops == []
    np.testing.assert_allclose(np.frombuffer(alone.content, "<f4").reshape(900, 16), data["a2b"].apply(X),
                               rtol=1e-6, atol=1e-6)

    held = _held(url, X.tobytes())
    try:
        _until(lambda: metrics.active == 1, "the held request is being answered")
        busy = client.post(URL, **octet(X))
        assert busy.status_code == 200 and hops == [X.nbytes]  # not alone: one hop to a thread
        assert busy.content == alone.content
        held.sendall(X.tobytes()[X.nbytes // 2:])
        held.settimeout(30)
        status = held.makefile("rb").readline()
        assert status.startswith(b"HTTP/1.1 200"), status[:100]
    finally:
        held.close()
    _until(lambda: metrics.active == 0, "every request ended")

    again = client.post(URL, **octet(X))  # alone again: back on the loop
    assert again.content == alone.content and hops == [X.nbytes]


def test_over_the_bound_or_another_map_family_it_hops_even_alone(server, monkeypatch):
    client, app, _, _ = server
    X = np.random.default_rng(1).standard_normal((900, 16)).astype(np.float32)
    assert client.post(URL, **octet(X[:1])).status_code == 200  # the map is loaded
    hops, _ = _count_hops(monkeypatch)
    monkeypatch.setattr(fastpath, "ALONE_INLINE_WORK", X.size * 16 - 1)  # one multiply-add short
    r = client.post(URL, **octet(X))
    assert r.status_code == 200 and hops == [X.nbytes]
    monkeypatch.setattr(fastpath, "ALONE_INLINE_WORK", X.size * 16)
    assert client.post(URL, **octet(X)).content == r.content and hops == [X.nbytes]

    state = app.state.vb
    m = state.resolve_map("a2b")[1]
    assert fastpath._inline(state, m, X.nbytes)
    assert not fastpath._inline(state, object(), X.nbytes)  # not a LinearMap (a cluster map): its cost is not known
    assert fastpath._inline(state, object(), fastpath.INLINE_MAX_BYTES)  # a few rows: always


def test_the_count_comes_back_to_zero_after_errors_and_clients_that_leave(server, monkeypatch):
    client, app, url, _ = server
    metrics = app.state.vb.metrics
    hops, _ = _count_hops(monkeypatch)
    X = np.random.default_rng(2).standard_normal((900, 16)).astype(np.float32)
    bad = X.copy()
    bad[5, 3] = np.nan
    assert client.post(URL, **octet(bad)).status_code == 422
    assert client.post(URL, **octet(X[:, :15])).status_code == 422
    assert client.post("/v1/maps/nope/transform", **octet(X)).status_code == 404
    assert client.post(URL, content=X.tobytes(), headers={"content-type": "application/octet-stream"}
                       ).status_code == 401
    gone = _held(url, X.tobytes())  # leaves with half its body sent
    _until(lambda: metrics.active == 1, "the request that will leave is being answered")
    gone.close()
    _until(lambda: metrics.active == 0, "every request ended, the one whose client left too")
    before = len(hops)
    assert client.post(URL, **octet(X)).status_code == 200
    assert len(hops) == before  # still alone after all that: the shortcut did not stop


def test_search_payloads_are_those_of_the_generation_searched(world, monkeypatch):
    """The payloads of a search's hits are read under the same read lock as the search. They were read after it, so
    a delete (or a newer generation another process wrote) landing between the search and the answer's serialisation
    gave a hit the search found with ``"payload": null`` (fuzzed: ~1 hit in 1,200 with a writer deleting and adding
    rows while 300-query searches ran). Here the writer lands in that instant on every search."""
    c, app, data = world
    idx = app.state.vb.indexes.create("pay", "b", data["Y"][:50], dim=16, payloads=[{"row": i} for i in range(50)])
    search = idx.search

    def search_then_delete(*a, **kw):  # a writer that takes the lock the moment the search lets it go
        out = search(*a, **kw)
        I = out[1]
        idx.delete(np.unique(I[I >= 0]))
        return out

    monkeypatch.setattr(idx, "search", search_then_delete)
    for body in (js({"vectors": data["Y"][:1].tolist(), "k": 3}),  # small: the fast path
                 js({"vectors": data["Y"][1:40].tolist(), "k": 5})):  # the route, in the thread pool
        r = c.post("/v1/indexes/pay/search", **body)
        assert r.status_code == 200, r.text
        hits = [h for row in r.json()["results"] for h in row]
        assert hits and all(h["payload"] == {"row": h["id"]} for h in hits), hits[:5]
    assert idx.count < 50  # the rows were deleted, after the searches that found them


def test_a_client_that_leaves_mid_upload_is_a_499_of_its_route(server):
    """A client that closed the connection while the fast path read its body was counted in /metrics (and the access
    log) as route "unmatched", status 499: the shortcut returned without naming the route. Now the route's 499."""
    from _api_support import answered

    client, app, url, data = server
    metrics = app.state.vb.metrics
    app.state.vb.indexes.create("ix", "b", data["Y"][:50], dim=16)
    X = data["X"][:40]
    cases = [(URL, "application/octet-stream", X.tobytes()),
             (URL, "application/json", json.dumps({"vectors": X.tolist()}).encode()),
             ("/v1/indexes/ix/search", "application/json", json.dumps({"vectors": X.tolist(), "space": "a"}).encode())]
    host, port = url.removeprefix("http://").split(":")
    for path, ct, body in cases:
        assert len(body) <= fastpath.FAST_MAX_BYTES  # the shortcut reads it
        with socket.create_connection((host, int(port))) as s:
            s.sendall(f"POST {path} HTTP/1.1\r\nhost: {host}\r\nauthorization: {R['Authorization']}\r\ncontent-type: "
                      f"{ct}\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body[: len(body) // 2])
            _until(lambda: metrics.active == 1, f"{path} ({ct}) is being read")
        _until(lambda: metrics.active == 0, f"{path} ({ct}): the request whose client left ended")
    template = "/v1/maps/{ref}/transform"
    assert (answered(client, template, 499), answered(client, "/v1/indexes/{name}/search", 499),
            answered(client, "unmatched", 499)) == (2, 1, 0)


@pytest.mark.parametrize("ef, status", [(32_768, 200), (32_769, 422), (100_000, 422)])
def test_a_searchs_ef_search_has_the_index_parameters_bound(world, hnsw_index, monkeypatch, ef, status):
    """The request allowed ef_search up to 100,000 while the index parameter (and the docs) stop at 32,768. (An HNSW
    index's: a flat one refuses any ef_search, test_indexes.)"""
    c, _, data = world
    fast, slow = both(c, monkeypatch, "POST", hnsw_index, **js({"vectors": data["Y"][:1].tolist(), "ef_search": ef}))
    assert fast.status_code == status, fast.text
    assert_same(fast, slow)


# --- which threads a search takes: a small body asking for heavy work goes to the compute gate -------------------
def _count_gate_turns(monkeypatch, state) -> list:
    turns = []
    real_run = state.heavy.run

    async def counting_run(fn, request=None):
        turns.append(1)
        return await real_run(fn, request)

    monkeypatch.setattr(state.heavy, "run", counting_run)
    return turns


@pytest.fixture(scope="module")
def hnsw_index(world):
    _, app, data = world
    app.state.vb.indexes.create("wide", "b", data["Y"][:300], dim=16, kind="hnsw")
    return "/v1/indexes/wide/search"


@pytest.mark.parametrize("extra, heavy", [({}, False), ({"ef_search": 32_768}, True), ({"ef_search": 64}, False),
                                          ({"csls": True, "csls_k": 1000}, True)])
def test_a_small_body_asking_for_heavy_search_work_takes_the_compute_gate(world, hnsw_index, monkeypatch, extra,
                                                                          heavy):
    """QA: 45 searches of 41 KB with k=1000, ef_search=100000 (11.5 s each) ran on the shared pool, since only
    bodies over 1 MiB went to the compute gate: GET /v1/maps then timed out. The estimate of the search decides."""
    from service.api.routers import indexes as index_routes
    from service.indexes.space import SMALL_SEARCH_WORK

    c, app, data = world
    # this index is tiny: the bound scaled down to it (the estimate's test below checks it at its real size)
    monkeypatch.setattr(index_routes, "HEAVY_SEARCH_WORK", SMALL_SEARCH_WORK)
    body = js({"vectors": data["Y"][:20].tolist(), "k": 5, **extra})
    c.post(hnsw_index, **body)
    turns = _count_gate_turns(monkeypatch, app.state.vb)
    fast, slow = both(c, monkeypatch, "POST", hnsw_index, **body)
    assert fast.status_code == 200, fast.text
    assert_same(fast, slow)
    assert len(turns) == (2 if heavy else 0)  # the fast path's and the route's search, or neither


def test_the_estimate_counts_texts_csls_and_ef_search(world, hnsw_index):
    from service.api.routers import indexes as index_routes
    from service.api.schemas import SearchOptions
    from service.indexes.space import SMALL_SEARCH_WORK

    _, app, data = world
    idx = app.state.vb.indexes.get("wide")
    Q = data["Y"][:1]

    def estimate(**kw):
        return index_routes.search_estimate(idx, SearchOptions(**kw), None if "texts" in kw else Q)

    assert estimate(k=5) <= SMALL_SEARCH_WORK
    assert estimate(k=5, texts=["one query"]) > SMALL_SEARCH_WORK
    assert estimate(k=5, texts=["q"] * 5000) > estimate(k=5, texts=["q"])
    assert estimate(k=5, ef_search=32_768) > SMALL_SEARCH_WORK
    assert estimate(k=5, csls=True, csls_k=1000) > estimate(k=5, csls=True, csls_k=10) > estimate(k=5)
    # at the real bound: one query text keeps its one hop, a batch of them takes the compute gate
    assert estimate(k=5, texts=["q"]) <= index_routes.HEAVY_SEARCH_WORK < estimate(k=5, texts=["q"] * 8)


def test_a_small_searchs_answer_bytes_are_pinned(world, monkeypatch):
    """The exact bytes of a batch search answer, on the event loop's shortcut and on the route: key order, no
    spaces, ints as ints, scores as JSON floats, one list of hits per query (what clients parse byte for byte)."""
    c, app, _ = world
    E = np.eye(16, dtype=np.float32)[:8]  # unit rows: each query below finds its own row with a score of exactly 1
    app.state.vb.indexes.create("pin", "b", E, dim=16, payloads=[{"row": i} for i in range(8)])
    Q = 2 * E[[3, 5]]
    head = b'{"index":"pin","space":"b","query_space":"b","k":1,"scoring":"cosine","maps":[],"steers":[],'
    plain = head + b'"results":[[{"id":3,"score":1.0}],[{"id":5,"score":1.0}]]}'
    with_payloads = head + (b'"results":[[{"id":3,"score":1.0,"payload":{"row":3}}],'
                            b'[{"id":5,"score":1.0,"payload":{"row":5}}]]}')
    b64 = base64.b64encode(Q.tobytes()).decode()
    for body, want in [({"vectors": Q.tolist(), "space": "b", "k": 1, "include_payloads": False}, plain),
                       ({"vectors_b64": b64, "dim": 16, "space": "b", "k": 1, "include_payloads": False}, plain),
                       ({"vectors": Q.tolist(), "space": "b", "k": 1, "include_payloads": True}, with_payloads)]:
        fast, slow = both(c, monkeypatch, "POST", "/v1/indexes/pin/search", **js(body))
        assert fast.status_code == 200, fast.text
        assert fast.content == want, fast.content
        assert slow.content == want, slow.content
        assert fast.headers["content-type"] == slow.headers["content-type"] == "application/json"
        assert fast.headers["content-length"] == str(len(want))
