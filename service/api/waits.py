"""A bounded wait that arms its deadline only when it waits.

``async with asyncio.timeout(s): await receive()`` makes and cancels a timer on every call: ~15 µs on uvloop
(the ``Timeout`` object, ``call_at``, the handle's cancel and close), paid by every request whose body is read,
though a small body has nearly always arrived with the request's head and ``receive()`` returns without waiting.
:func:`within` first runs the awaitable up to its first wait: one that finishes there needed no deadline; one that
waits is resumed under ``asyncio.timeout``, where it runs on exactly as ``await`` would have run it (every value the
task sends or throws in is passed on, :class:`_Resumed`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

__all__ = ["within"]


async def within(coro: Coroutine, seconds: float) -> Any:
    """``await coro``, raising TimeoutError when it has not finished ``seconds`` after it began to wait (as
    ``asyncio.timeout(seconds)`` around it; ``seconds`` > 0). Nothing is timed when it finishes without waiting.
    An awaitable that is not a coroutine (a future) is awaited under the deadline as it is."""
    if not isinstance(coro, Coroutine):
        async with asyncio.timeout(seconds):
            return await coro
    try:
        waiting_on = coro.send(None)
    except StopIteration as done:
        return done.value
    async with asyncio.timeout(seconds):
        return await _Resumed(coro, waiting_on)


class _Resumed:
    """The rest of coroutine ``coro``, whose first step (``send(None)``) yielded ``waiting_on`` (the future it waits
    for, as ``await`` yields it to the task): awaiting this yields that to the task, then passes what the task sends
    or throws in on to ``coro``, until it returns or raises (PEP 380's ``yield from``, from its second step)."""

    __slots__ = ("coro", "waiting_on")

    def __init__(self, coro: Coroutine, waiting_on: Any) -> None:
        self.coro, self.waiting_on = coro, waiting_on

    def __await__(self):
        coro, out = self.coro, self.waiting_on
        while True:
            try:
                sent = yield out
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # noqa: BLE001 - a cancellation (the deadline's), passed on as await would
                try:
                    out = coro.throw(exc)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    out = coro.send(sent)
                except StopIteration as done:
                    return done.value
