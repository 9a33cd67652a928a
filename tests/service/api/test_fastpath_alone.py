"""A large transform runs on the event loop only while its request is the only one the process answers.

``service.api.fastpath.ALONE_INLINE_WORK``: a client that sends its batches one after another (a migration's loop)
skips the thread hop; as soon as another request is being answered — here one whose body is still arriving on
another connection — the same transform hops to a thread, and the answer is the same bytes. The count behind it
(``ServiceMetrics.active``) must come back to zero after every kind of ending, or the shortcut would silently stop.
Real uvicorn, real sockets.
"""

from __future__ import annotations

import socket
import time

import httpx
import numpy as np
import pytest
from _api_support import R, populate, settings_for
from _servers import serve_in_thread

from service.api import create_app, fastpath

URL = "/v1/maps/a2b/transform"
OCTET = {**R, "content-type": "application/octet-stream"}


@pytest.fixture
def server(tmp_path):
    app = create_app(settings_for(tmp_path, max_batch=1000, max_body_bytes=2_000_000))
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client, app, url, populate(app.state.vb.registry)


@pytest.fixture
def hops(monkeypatch) -> list:
    """The fast path's hops off the event loop, counted (each still runs)."""
    seen: list = []
    real = fastpath._hop

    async def counting(state, fn, nbytes, request):
        seen.append(nbytes)
        return await real(state, fn, nbytes, request)

    monkeypatch.setattr(fastpath, "_hop", counting)
    return seen


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


def test_alone_on_the_loop_beside_another_request_on_a_thread_same_answer(server, hops):
    client, app, url, data = server
    metrics = app.state.vb.metrics
    X = np.random.default_rng(0).standard_normal((900, 16)).astype(np.float32)  # 57.6 kB: over INLINE_MAX_BYTES
    assert X.nbytes > fastpath.INLINE_MAX_BYTES

    assert client.post(URL, content=X[:1].tobytes(), headers=OCTET).status_code == 200  # the map is loaded
    hops.clear()
    alone = client.post(URL, content=X.tobytes(), headers=OCTET)
    assert alone.status_code == 200 and hops == []
    np.testing.assert_allclose(np.frombuffer(alone.content, "<f4").reshape(900, 16), data["a2b"].apply(X),
                               rtol=1e-6, atol=1e-6)

    held = _held(url, X.tobytes())
    try:
        _until(lambda: metrics.active == 1, "the held request is being answered")
        busy = client.post(URL, content=X.tobytes(), headers=OCTET)
        assert busy.status_code == 200 and hops == [X.nbytes]  # not alone: one hop to a thread
        assert busy.content == alone.content
        held.sendall(X.tobytes()[X.nbytes // 2:])
        held.settimeout(30)
        status = held.makefile("rb").readline()
        assert status.startswith(b"HTTP/1.1 200"), status[:100]
    finally:
        held.close()
    _until(lambda: metrics.active == 0, "every request ended")

    again = client.post(URL, content=X.tobytes(), headers=OCTET)  # alone again: back on the loop
    assert again.content == alone.content and hops == [X.nbytes]


def test_over_the_bound_or_another_map_family_it_hops_even_alone(server, hops, monkeypatch):
    client, app, _, data = server
    X = np.random.default_rng(1).standard_normal((900, 16)).astype(np.float32)
    assert client.post(URL, content=X[:1].tobytes(), headers=OCTET).status_code == 200  # the map is loaded
    hops.clear()
    monkeypatch.setattr(fastpath, "ALONE_INLINE_WORK", X.size * 16 - 1)  # one multiply-add short
    r = client.post(URL, content=X.tobytes(), headers=OCTET)
    assert r.status_code == 200 and hops == [X.nbytes]
    monkeypatch.setattr(fastpath, "ALONE_INLINE_WORK", X.size * 16)
    assert client.post(URL, content=X.tobytes(), headers=OCTET).content == r.content and hops == [X.nbytes]

    state = app.state.vb
    m = state.resolve_map("a2b")[1]
    assert fastpath._inline(state, m, X.nbytes)
    assert not fastpath._inline(state, object(), X.nbytes)  # not a LinearMap (a cluster map): its cost is not known
    assert fastpath._inline(state, object(), fastpath.INLINE_MAX_BYTES)  # a few rows: always


def test_the_count_comes_back_to_zero_after_errors_and_clients_that_leave(server, hops):
    client, app, url, _ = server
    metrics = app.state.vb.metrics
    X = np.random.default_rng(2).standard_normal((900, 16)).astype(np.float32)
    bad = X.copy()
    bad[5, 3] = np.nan
    assert client.post(URL, content=bad.tobytes(), headers=OCTET).status_code == 422
    assert client.post(URL, content=X[:, :15].tobytes(), headers=OCTET).status_code == 422
    assert client.post("/v1/maps/nope/transform", content=X.tobytes(), headers=OCTET).status_code == 404
    assert client.post(URL, content=X.tobytes(), headers={"content-type": "application/octet-stream"}
                       ).status_code == 401
    gone = _held(url, X.tobytes())  # leaves with half its body sent
    _until(lambda: metrics.active == 1, "the request that will leave is being answered")
    gone.close()
    _until(lambda: metrics.active == 0, "every request ended, the one whose client left too")
    before = len(hops)
    assert client.post(URL, content=X.tobytes(), headers=OCTET).status_code == 200
    assert len(hops) == before  # still alone after all that: the shortcut did not stop
