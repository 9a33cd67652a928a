"""The deadlines of :class:`service.api.protocol.SlowClientProtocol` (a request head's, a kept-alive connection's
idle one) without a timer per request.

Each kept-alive request made two timers and cancelled them (the head's at its first byte, uvicorn's keep-alive one
after its answer): ~10 µs each on uvloop, of a batch-1 request of ~0.5 ms. One pending check per deadline now
outlives the requests it finds done, and re-arms itself for a head (or an idle wait) that began after it was armed.
The protocol runs here on a plain asyncio loop in this process, whose timers can be counted; the same deadlines
against a real server: ``tests/reliability/test_hardening.py`` (heads) and ``test_http_protocol.py``.
"""

from __future__ import annotations

import asyncio

import pytest
import uvicorn
from uvicorn.server import ServerState

from service.api import protocol
from service.api.protocol import SlowClientProtocol

GET = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


async def _app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def _serve(keep_alive: float):
    config = uvicorn.Config(_app, http=SlowClientProtocol, timeout_keep_alive=keep_alive, log_level="warning",
                            lifespan="off")
    config.load()
    state = ServerState()
    server = await asyncio.get_running_loop().create_server(
        lambda: SlowClientProtocol(config=config, server_state=state, app_state={}), "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _answer(reader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    return head + await reader.readexactly(2)


@pytest.fixture
def loop_timers(monkeypatch):
    """A plain asyncio loop whose ``call_at`` / ``call_later`` calls are counted (the callbacks' names)."""
    monkeypatch.setitem(protocol._timeouts, "header", 0.6)
    monkeypatch.setitem(protocol._timeouts, "send", 5.0)
    loop = asyncio.new_event_loop()
    made = []
    real_at, real_later = loop.call_at, loop.call_later
    loop.call_at = lambda when, cb, *a, **k: made.append(cb.__name__) or real_at(when, cb, *a, **k)
    loop.call_later = lambda delay, cb, *a, **k: made.append(cb.__name__) or real_later(delay, cb, *a, **k)
    try:
        yield loop, made
    finally:
        loop.close()


def test_kept_alive_requests_make_no_timer_each(loop_timers):
    loop, made = loop_timers

    async def main():
        server, port = await _serve(keep_alive=5.0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        made.clear()  # from the connection on
        for _ in range(20):
            writer.write(GET)
            assert (await _answer(reader)).startswith(b"HTTP/1.1 200")
        writer.close()
        server.close()

    loop.run_until_complete(main())
    assert set(made) <= {"_head_check", "_keep_alive_check"}, made  # the head's was armed with the connection
    assert len(made) <= 4, made  # was 2 a request: 40


def test_an_idle_connection_still_closes_after_the_keep_alive_timeout(loop_timers):
    """Answers 0.4 s apart keep a connection with a 1 s keep-alive timeout open (each re-arms the pending check);
    once idle it is closed ~1 s after its last answer."""
    loop, _ = loop_timers

    async def main():
        server, port = await _serve(keep_alive=1.0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(5):  # 2 s of requests, each within the timeout of the one before
            writer.write(GET)
            assert (await _answer(reader)).startswith(b"HTTP/1.1 200")
            await asyncio.sleep(0.4)
        t0 = loop.time()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
        idle = loop.time() - t0 + 0.4
        writer.close()
        server.close()
        return idle

    idle = loop.run_until_complete(main())
    assert 0.9 < idle < 2.0, idle


def test_a_head_begun_after_a_pending_check_gets_its_own_deadline(loop_timers):
    """A connection's first head completes at once; a second one, begun 0.3 s later, never completes: the check
    armed for the first (due at 0.6 s) finds the second under way and waits for its own deadline (0.9 s)."""
    loop, _ = loop_timers

    async def main():
        server, port = await _serve(keep_alive=5.0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        t0 = loop.time()
        writer.write(GET)
        assert (await _answer(reader)).startswith(b"HTTP/1.1 200")
        await asyncio.sleep(0.3)
        writer.write(b"GET / HTTP/1.1\r\nHo")
        assert await asyncio.wait_for(reader.read(), 5) == b""
        took = loop.time() - t0
        writer.close()
        server.close()
        return took

    took = loop.run_until_complete(main())
    assert 0.85 < took < 2.0, took
