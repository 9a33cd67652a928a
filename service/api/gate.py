"""Admission of request work: :class:`Gate`, the one queue primitive of the HTTP face.

A gate lets ``running`` calls hold it at once; up to ``waiting`` more wait their turn on the event loop, holding
no thread, and any more are refused at once (:class:`~service.errors.BusyError`: 429 with ``Retry-After``). A
call made for a ``request`` whose client disconnects while it waits leaves the queue at once
(:class:`~starlette.requests.ClientDisconnect`: 499 in the metrics), so it neither computes for nobody when its
turn comes nor keeps a place from a live client. Work already running on a thread for such a request
(:func:`run_unless_gone`) is told to stop: its next checkpoint (:func:`service.progress.checkpoint`, between
batches of texts, at a plan's progress reports; an index write from texts only before it writes) raises, the
same 499, and the thread is free for the next caller rather than computing to the end for nobody. Used by
:class:`~service.api.state.HeavyGate` (plans and evaluations: ``max_heavy_requests`` running, none waiting; its
threads: ``compute_threads`` running, ``compute_max_waiting`` waiting) and the LM routes (one running,
``limits.lm_max_waiting`` waiting). Used only on the event loop, so the checks and counts need no lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import asynccontextmanager

import anyio
import anyio.to_thread
from starlette.requests import ClientDisconnect

from ..errors import BusyError
from ..progress import Abandoned, run_stoppable

__all__ = ["Gate", "run_unless_gone"]


async def _disconnected(request) -> None:
    """Return once ``request``'s client has disconnected. Its body is read by now, so the next message can only be
    ``http.disconnect``; waiting for it also keeps uvicorn reading the socket (:meth:`Gate._acquire_unless_gone`)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def run_unless_gone(fn: Callable, request, limiter: anyio.CapacityLimiter):
    """``fn()`` on a thread of ``limiter`` while listening for the disconnect of ``request``'s client (its body read
    by now); the client gone, ``fn``'s next :func:`~service.progress.checkpoint` raises and this raises
    :class:`ClientDisconnect` (a 499: nobody reads the answer), so the thread is free again within one batch of the
    work. Work that ends without reaching a checkpoint after the disconnect returns as it would have."""
    gone = threading.Event()
    out = failed = None
    async with anyio.create_task_group() as tg:
        async def watch():
            await _disconnected(request)
            gone.set()

        tg.start_soon(watch)
        try:
            out = await anyio.to_thread.run_sync(run_stoppable, gone.is_set, fn, limiter=limiter)
        except Exception as exc:  # noqa: BLE001 - raised below, outside the group (which would wrap it in a group)
            failed = exc
        finally:
            tg.cancel_scope.cancel()
    if isinstance(failed, Abandoned):
        raise ClientDisconnect() from None
    if failed is not None:
        raise failed
    return out


class _NoGauge:
    def inc(self) -> None:
        pass

    def dec(self) -> None:
        pass


class Gate:
    """At most ``running`` holders at once and ``waiting`` waiters (None: no bound); the rest are refused.

    ``busy`` is the refusal's message, a :meth:`str.format` template with the fields ``what`` (the caller's
    label), ``running`` and ``waiting`` (the counts when it was refused); ``on_refused(what)`` is called then
    too. The gauges (``inc`` / ``dec``) follow the calls waiting and holding the gate.
    """

    def __init__(self, running: int, waiting: int | None = None, *, busy: str = "{what}: busy; retry later",
                 waiting_gauge=None, running_gauge=None, on_refused: Callable[[str], None] | None = None) -> None:
        self.limiter = anyio.CapacityLimiter(int(running))
        self.max_waiting = waiting
        self.waiting = 0
        self.busy = busy
        self._waiting_gauge = waiting_gauge or _NoGauge()
        self._running_gauge = running_gauge or _NoGauge()
        self._on_refused = on_refused

    @property
    def running(self) -> int:
        return self.limiter.borrowed_tokens

    @asynccontextmanager
    async def turn(self, request=None, what: str = ""):
        """Hold one of the gate's places for the body of the ``async with``: at once when one is free, else after
        waiting for it (when fewer than ``waiting`` others wait; BusyError otherwise). With the ``request`` whose
        work it is (its body read by now): its client gone before the turn is a :class:`ClientDisconnect` (the
        place is given back)."""
        me = object()  # the borrower of the place: a turn, not a task (one task may hold turns of two callers)
        try:
            self.limiter.acquire_on_behalf_of_nowait(me)
        except anyio.WouldBlock:
            if self.max_waiting is not None and self.waiting >= self.max_waiting:
                if self._on_refused is not None:
                    self._on_refused(what)
                raise BusyError(self.busy.format(what=what, running=self.running, waiting=self.waiting)) from None
            await self._wait(me, request)
        try:
            if request is not None and await request.is_disconnected():  # left while its body was parsed
                raise ClientDisconnect()
            self._running_gauge.inc()
            try:
                yield
            finally:
                self._running_gauge.dec()
        finally:
            self.limiter.release_on_behalf_of(me)

    async def _wait(self, me: object, request) -> None:
        self.waiting += 1
        self._waiting_gauge.inc()
        try:
            if request is None:
                await self.limiter.acquire_on_behalf_of(me)
            else:
                await self._acquire_unless_gone(me, request)
        finally:
            self.waiting -= 1
            self._waiting_gauge.dec()

    async def _acquire_unless_gone(self, me: object, request) -> None:
        """Take a place while listening for the client's disconnect (its body is read by now, so the next message
        can only be ``http.disconnect``); the client gone first: :class:`ClientDisconnect`, out of the queue at
        once rather than when its turn comes. A check at the turn is not enough: a body of over 64 KiB arriving
        in one read leaves uvicorn's reading paused (flow control) until the app waits for a message again, so a
        closed socket goes unnoticed and ``request.is_disconnected()``, which does not wait, says False."""
        gone = False
        async with anyio.create_task_group() as tg:
            async def watch():
                nonlocal gone
                await _disconnected(request)
                gone = True
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            try:
                await self.limiter.acquire_on_behalf_of(me)
            finally:
                tg.cancel_scope.cancel()
        if gone:
            try:
                self.limiter.release_on_behalf_of(me)  # the turn may have come in the same step as the disconnect
            except RuntimeError:
                pass
            raise ClientDisconnect()
