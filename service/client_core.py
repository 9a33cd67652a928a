"""What :class:`service.client.Client` and :class:`service.client.AsyncClient` share: every call written once.

Each call of the API (``transform``, ``search``, ``wait`` ...) is a generator ("sans-IO") that says what to do
and is told what happened; it never touches a socket or a clock's sleep itself. It yields

* :class:`Send` ``(method, path, kw)``: send one HTTP request; the driver sends back the ``httpx.Response``, or
  throws the ``httpx.RequestError`` (no answer) into the generator;
* :class:`Sleep` ``(seconds)``: wait (a retry's backoff, a job's poll interval);
* :class:`Await` ``(awaitable)``: what a caller's callback returned (an ``async def`` progress callback), to
  be awaited: only the async driver can; the sync one raises ``TypeError``;

and returns the call's result. Two small drivers run the same generator: :func:`run_sync` on ``httpx.Client``
and ``time.sleep``, :func:`run_async` on ``httpx.AsyncClient`` and ``asyncio.sleep``. Retries (which requests,
how long to wait, ``Retry-After``), batching (the service's limits, versions pinned after the first batch) and
pagination are therefore one piece of code for both clients.

A method of :class:`Calls` (or its mixins) marked :func:`call` is such a generator; a subclass declared with
``driver="sync"`` or ``driver="async"`` gets, under the same name, a method that runs it (a plain method
returning the result, or a coroutine function), with the generator's signature and docstring.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any, NamedTuple

import httpx

from .client_errors import (
    APIConnectionError,
    APIError,
    APITimeoutError,
    PayloadTooLargeError,
    UnexpectedResponseError,
    error_from_response,
    unexpected,
)
from .client_wire import dumps, spans

__all__ = ["IDEMPOTENT", "RETRY_STATUS", "Await", "Calls", "Send", "Sleep", "call", "run_async", "run_sync"]

IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
RETRY_STATUS = frozenset({429, 502, 503, 504})  # refused or not reached: nothing was done; try again later


class Send(NamedTuple):
    """One HTTP request for the driver: ``http.request(method, path, **kw)``."""

    method: str
    path: str
    kw: dict


class Sleep(NamedTuple):
    """Wait ``seconds`` before going on."""

    seconds: float


class Await(NamedTuple):
    """An awaitable a caller's callback returned, for the async driver to await."""

    awaitable: Any


Step = Send | Sleep | Await
Gen = Generator[Step, Any, Any]


def call(fn: Callable[..., Gen]) -> Callable[..., Gen]:
    """Mark the generator method ``fn`` as a call of the API: driven clients expose it under its name."""
    fn.__vecbridge_call__ = True
    return fn


def run_sync(http: httpx.Client, gen: Gen) -> Any:
    """Run ``gen`` to its result on ``http`` and ``time.sleep``."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = gen.throw(error) if error is not None else gen.send(reply)
        except StopIteration as done:
            return done.value
        reply = error = None
        if isinstance(step, Sleep):
            time.sleep(step.seconds)
            continue
        if isinstance(step, Await):
            getattr(step.awaitable, "close", lambda: None)()  # a coroutine never run: no "never awaited" warning
            gen.close()
            raise TypeError("a callback returned an awaitable (an async def?): Client calls it without awaiting; "
                            "pass a plain function, or use AsyncClient")
        try:
            reply = http.request(step.method, step.path, **step.kw)
        except httpx.RequestError as e:
            error = e


async def run_async(http: httpx.AsyncClient, gen: Gen) -> Any:
    """Run ``gen`` to its result on ``http`` and ``asyncio.sleep`` (cancelling the task closes ``gen``)."""
    reply: Any = None
    error: BaseException | None = None
    try:
        while True:
            try:
                step = gen.throw(error) if error is not None else gen.send(reply)
            except StopIteration as done:
                return done.value
            reply = error = None
            if isinstance(step, Sleep):
                await asyncio.sleep(step.seconds)
                continue
            if isinstance(step, Await):
                reply = await step.awaitable
                continue
            try:
                reply = await http.request(step.method, step.path, **step.kw)
            except httpx.RequestError as e:
                error = e
    finally:
        gen.close()


def _sync_method(fn: Callable[..., Gen]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def method(self, *args, **kw):
        return run_sync(self._http, fn(self, *args, **kw))

    return method


def _async_method(fn: Callable[..., Gen]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def method(self, *args, **kw):
        return await run_async(self._http, fn(self, *args, **kw))

    return method


class Calls:
    """The calls of a vecbridge client as generators (module docstring), and the plumbing they share.

    ``class C(Calls, driver="sync" | "async")`` replaces every :func:`call` generator by its driven method;
    the subclass sets ``self._http`` (an ``httpx.Client`` or ``httpx.AsyncClient``) and calls :meth:`_setup`.
    """

    _http: Any

    def __init_subclass__(cls, driver: str | None = None, **kw) -> None:
        super().__init_subclass__(**kw)
        if driver is None:
            return
        wrap = {"sync": _sync_method, "async": _async_method}[driver]
        for name in dir(cls):
            fn = getattr(cls, name)
            if getattr(fn, "__vecbridge_call__", False) and inspect.isgeneratorfunction(fn):
                setattr(cls, name, wrap(fn))

    def _setup(self, *, page_size: int, max_retries: int, max_retry_wait: float, batch_size: int | None) -> None:
        self.page_size = int(page_size)
        self.batch_size = None if batch_size is None else max(1, int(batch_size))
        self._limits: tuple[int | None, int | None] | None = None  # (max_batch, max_body_bytes) once read
        self.max_retries, self.max_retry_wait = int(max_retries), float(max_retry_wait)

    @staticmethod
    def _headers(api_key: str | None, headers: dict | None) -> dict:
        h = dict(headers or {})
        if api_key:
            h["Authorization"] = f"Bearer {api_key}"
        return h

    @call
    def request(self, method: str, path: str, *, retry: bool | None = None, ok: Sequence[int] = (),
                **kw) -> httpx.Response:
        """Send one request; an error answer (status >= 400 and not in ``ok``) raises its :class:`APIError`
        subclass, no answer :class:`APIConnectionError` / :class:`APITimeoutError`.

        ``json=`` bodies may hold numpy numbers and arrays. ``retry``: whether sending the request twice is
        harmless (default: GET / HEAD / PUT / DELETE, or an ``Idempotency-Key`` header); such requests are
        retried as the module docstring of :mod:`service.client` says, others only when the connection was
        never made.
        """
        return (yield from self._request(method, path, retry=retry, ok=ok, **kw))

    def _request(self, method: str, path: str, *, retry: bool | None = None, ok: Sequence[int] = (), **kw) -> Gen:
        """:meth:`request` (the generator the public method runs)."""
        if "json" in kw:
            kw["content"] = dumps(kw.pop("json"))
            kw["headers"] = {"Content-Type": "application/json", **(kw.get("headers") or {})}
        if retry is None:
            retry = method.upper() in IDEMPOTENT or "Idempotency-Key" in (kw.get("headers") or {})
        attempt = 0
        while True:
            try:
                r = yield Send(method, path, kw)
            except httpx.RequestError as e:
                # never sent: safe to send whatever it is; a read timeout is not retried (the server may still
                # be computing it: a retry would queue the same work again)
                never_sent = isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout))
                timed_out = isinstance(e, httpx.TimeoutException) and not never_sent
                if (never_sent or (retry and not timed_out)) and attempt < self.max_retries:
                    yield Sleep(self._backoff(attempt))
                    attempt += 1
                    continue
                cls = APITimeoutError if isinstance(e, httpx.TimeoutException) else APIConnectionError
                raise cls(f"{method} {path}: no answer from {self._http.base_url} ({type(e).__name__}: {e})"
                          + (f" after {attempt + 1} tries" if attempt else "")) from e
            if r.status_code < 400 or r.status_code in ok:
                return r
            err = error_from_response(r)
            wait = self._backoff(attempt, err.retry_after)
            if not (retry and r.status_code in RETRY_STATUS and attempt < self.max_retries and wait is not None):
                raise err
            yield Sleep(wait)
            attempt += 1

    def _backoff(self, attempt: int, retry_after: float | None = None) -> float | None:
        """Seconds before retry ``attempt + 1``: ``Retry-After`` when given (None when over ``max_retry_wait``:
        do not wait that long), else 0.5 s doubling per attempt, capped at 8 s."""
        if retry_after is not None:
            return max(0.0, retry_after) if retry_after <= self.max_retry_wait else None
        return min(8.0, 0.5 * 2 ** attempt)

    def _json(self, method: str, path: str, **kw) -> Gen:
        """:meth:`request`, then the answer's JSON (None for an empty answer)."""
        r = yield from self._request(method, path, **kw)
        if r.status_code == 204 or not r.content:
            return None
        try:
            return r.json()
        except ValueError:
            raise unexpected(r, "an answer that is not JSON") from None

    def _batched(self, n: int, row_bytes, send: Callable[[slice], Gen]) -> Gen:
        """``send(rows)`` for consecutive batches of rows ``0..n`` within the service's limits; the answers in order.

        One request while the limits are unknown; after a 413 the limits are read from ``/v1/info`` and the
        call is sent again in batches (:func:`~service.client_wire.spans`; ``row_bytes``: each row's share of
        the body). Batches are separate requests: an error in batch ``j`` leaves batches ``< j`` done.
        """
        refused = None
        if self._limits is None and self.batch_size is None:
            try:
                return [(yield from send(slice(0, n)))]
            except PayloadTooLargeError as e:
                refused = e
                try:
                    lim = (yield from self._json("GET", "/v1/info"))["limits"]
                    self._limits = (int(lim["max_batch"]), int(lim["max_body_bytes"]))
                except (APIError, KeyError, TypeError, ValueError):
                    raise e from None
        max_rows, max_bytes = self._limits or (None, None)
        if self.batch_size is not None:
            max_rows = min(max_rows or self.batch_size, self.batch_size)
        parts = spans(n, row_bytes, max_rows=max_rows, max_bytes=max_bytes)
        if refused is not None and len(parts) == 1:
            raise refused
        answers = []
        for part in parts:
            answers.append((yield from send(part)))
        return answers

    def _pages(self, path: str, params: dict | None = None) -> Gen:
        """Every item of a paginated list, page after page (``limit`` / ``cursor`` / ``next``), as one list."""
        q = {**(params or {}), "limit": self.page_size}
        items: list = []
        while True:
            body = yield from self._json("GET", path, params=dict(q))
            if not isinstance(body, dict) or not isinstance(body.get("data"), list):
                raise UnexpectedResponseError(200, "UnexpectedResponse", f"GET {path}: not a page of a list", None,
                                              {})
            items.extend(body["data"])
            if not body.get("next"):
                return items
            if body["next"] == q.get("cursor"):
                raise UnexpectedResponseError(200, "UnexpectedResponse", f"GET {path}: the page's `next` is the "
                                              "cursor that asked for it (a list that never ends)", None, {})
            q["cursor"] = body["next"]
