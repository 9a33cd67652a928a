"""``service.api.waits.within``: a body read bounded by ``body_timeout_s`` that makes no timer when the body is there.

The guard middleware's read of each body message was ``async with asyncio.timeout(left): await receive()``: a
timer made and cancelled per request (~15 µs on uvloop) though a small body has nearly always arrived with the head.
``within`` must still time out a wait, pass a cancellation from outside on as a cancellation, and run the awaited
coroutine to its end exactly as ``await`` would (its values, its exceptions, its ``finally``).
"""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from service.api import waits


def _run(coro):
    return uvloop.run(coro)


@pytest.fixture
def timers(monkeypatch):
    """The deadlines ``within`` arms (its ``asyncio.timeout`` calls)."""
    made = []
    real = asyncio.timeout

    def counting(seconds):
        made.append(seconds)
        return real(seconds)

    monkeypatch.setattr(waits.asyncio, "timeout", counting)
    return made


def test_an_awaitable_that_does_not_wait_arms_no_deadline(timers):
    async def ready():
        return {"type": "http.request", "body": b"x"}

    async def main():
        return await waits.within(ready(), 5.0)

    assert _run(main()) == {"type": "http.request", "body": b"x"}
    assert timers == []


def test_one_that_waits_runs_to_its_end_under_the_deadline(timers):
    steps = []

    async def slow():
        steps.append("start")
        await asyncio.sleep(0)  # a bare yield to the loop
        fut = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.01, fut.set_result, 7)
        got = await fut  # a future's result, sent back in
        steps.append(got)
        await asyncio.sleep(0.01)
        return got * 6

    async def main():
        return await waits.within(slow(), 5.0)

    assert _run(main()) == 42
    assert steps == ["start", 7]
    assert timers == [5.0]


def test_an_exception_inside_comes_out_as_it_would_from_await():
    async def fails_later():
        await asyncio.sleep(0.01)
        raise KeyError("inner")

    async def fails_at_once():
        raise ValueError("at once")

    async def main(coro):
        return await waits.within(coro, 5.0)

    with pytest.raises(KeyError, match="inner"):
        _run(main(fails_later()))
    with pytest.raises(ValueError, match="at once"):
        _run(main(fails_at_once()))


def test_a_wait_past_the_deadline_is_a_timeout_and_the_awaited_one_is_cancelled():
    seen = []

    async def stalls():
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        finally:
            seen.append("finally")

    async def main():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(TimeoutError):
            await waits.within(stalls(), 0.05)
        return loop.time() - t0

    took = _run(main())
    assert 0.04 < took < 2, took
    assert seen == ["cancelled", "finally"]


def test_a_cancellation_from_outside_stays_a_cancellation():
    seen = []

    async def stalls():
        try:
            await asyncio.sleep(10)
        finally:
            seen.append("finally")

    async def main():
        task = asyncio.ensure_future(waits.within(stalls(), 5.0))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return task.cancelled()

    assert _run(main()) is True
    assert seen == ["finally"]


def test_an_awaitable_that_is_no_coroutine_is_awaited_under_the_deadline(timers):
    async def main():
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        loop.call_later(0.01, done.set_result, "late")
        got = await waits.within(done, 5.0)
        with pytest.raises(TimeoutError):
            await waits.within(loop.create_future(), 0.02)
        return got

    assert _run(main()) == "late"
    assert timers == [5.0, 0.02]
