"""What :class:`service.client.Client` and :class:`service.client.AsyncClient` share: every call written once.

Each call of the API (``transform``, ``search``, ``wait`` ...) is a generator ("sans-IO") that says what to do
and is told what happened; it never touches a socket or a clock's sleep itself. It yields

* :class:`Send` ``(method, path, kw)``: send one HTTP request; the driver sends back the ``httpx.Response``, or
  throws the ``httpx.RequestError`` (no answer) into the generator, and so a Ctrl-C or a task's cancel that came
  while it waited (a sleep too): the call may say what it had done (``add``'s ``added_ids``) before it goes on;
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
import os
import re
import time
from collections.abc import Callable, Coroutine, Generator, Sequence
from typing import (
    Any,
    Concatenate,
    Generic,
    NamedTuple,
    ParamSpec,
    Self,
    TypeVar,
    cast,
    overload,
)

import httpx
import numpy as np
import orjson

from align.exceptions import InputError

from .client_errors import (
    APIConnectionError,
    APIError,
    APITimeoutError,
    AuthenticationError,
    ClientClosedError,
    EventLoopError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    UnexpectedResponseError,
    ValidationError,
    error_from_response,
    redirected,
    unexpected,
)
from .client_wire import as_count, as_seconds, as_version, dumps, spans
from .limits import whole_body_command

__all__ = ["IDEMPOTENT", "LIMIT_KEYS", "LOOK_FIRST_BYTES", "LOOK_FIRST_HITS", "RETRY_STATUS", "AsyncDriven", "Await",
           "Calls", "Driven", "Send", "Sleep", "SyncDriven", "call", "in_batch", "noted", "partly_added", "retriable",
           "run_async", "run_sync"]

IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
RETRY_STATUS = frozenset({429, 502, 503, 504})  # refused or not reached: nothing was done; try again later
LOOK_FIRST_BYTES = 1 << 20  # rows of a call beyond this: read the limits before sending (not the rows, then a 413)
LOOK_FIRST_HITS = 10_000  # search queries x k beyond this: read the limits (max_hits: 422) before sending
LIMIT_KEYS = ("max_batch", "max_body_bytes", "body_bytes_json", "body_bytes_texts", "max_hits")  # of /v1/info


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


def retriable(err: APIError) -> bool:
    """Whether the error answer ``err`` may pass when its request is sent again: a 429 / 502 / 503 / 504, except
    the service's own 503 without ``Retry-After``, a part it lacks until its operator acts (no vector database
    configured, a package not installed, a read-only disk), which no retry fixes."""
    lacking = err.status == 503 and err.retry_after is None and isinstance(err.body.get("error"), dict)
    return err.status in RETRY_STATUS and not lacking


def in_batch(message: str, part: slice) -> str:
    """What an error of the batch ``part`` adds to the service's ``message``: the rows it held, and which row of
    the call's input the first row index in ``message`` (``texts[7]``, ``row 7``) is."""
    where = f"sent in the batch of rows {part.start}-{part.stop - 1} of the call's input"
    if m := re.search(r"\[(\d+)\]|\brow (\d+)\b", message):
        i = int(m.group(1) or m.group(2))
        where += f"; row {i} of the batch is row {part.start + i} of the input"
    return where


def noted(err: BaseException, note: str) -> None:
    """Add ``(note)`` to the message of ``err`` (to its ``message``, before the request id, for an
    :class:`APIError`)."""
    text = str(err.args[0]) if err.args else ""
    if isinstance(err, APIError) and err.message and err.message in text:
        old, err.message = err.message, f"{err.message} ({note})"
        err.args = (text.replace(old, err.message, 1), *err.args[1:])
    else:
        err.args = (f"{text} ({note})", *err.args[1:])


def partly_added(err: BaseException, added: list) -> None:
    """Mark what ended an ``add`` sent in batches part-way: ``added_ids`` (the rows of the batches answered), and
    what was added. An error answer below 500 refused the batch in flight: the rest were not added. Anything else
    came before its answer (no answer, a 5xx of a proxy, a Ctrl-C, a cancel; a Ctrl-C while the answer was read):
    that batch may be added too. In the message of an :class:`APIError` / :class:`APIConnectionError`; a note
    (``add_note``) on anything else, whose text and ``args`` stay its own (a bare ``KeyboardInterrupt`` read
    " (60 rows ... were added ...; the rest were not)", false when the answer was being read)."""
    err.added_ids = list(added)
    note = f"{len(added)} rows of the earlier batches were added, ids in .added_ids; "
    if isinstance(err, APIError) and err.status < 500:
        note += "the rest were not"
    else:  # one id a row: the rows answered are the first len(added) of the input
        note += (f"the batch in flight (its rows from row {len(added)} of the call's input) may have been added "
                 "too: its answer never came")
    if not isinstance(err, (APIError, APIConnectionError)):
        err.add_note(f"vecbridge Client.add: {note}")
    elif added:
        noted(err, note)


P = ParamSpec("P")
R = TypeVar("R")


class Driven(Generic[P, R]):
    """What a type checker sees of a :func:`call` ``def f(self, *args) -> R`` (its annotation is the call's result,
    what a driver returns): on a :class:`Client <service.client.Client>`, a method returning ``R``; on an
    :class:`AsyncClient <service.client.AsyncClient>`, a coroutine function returning ``R``; on the calls' class
    itself, the generator. Never made at run time: :func:`call` returns the generator function, which
    ``Calls.__init_subclass__`` replaces by its driven method."""

    @overload
    def __get__(self, obj: AsyncDriven, owner: Any) -> Callable[P, Coroutine[Any, Any, R]]: ...
    @overload
    def __get__(self, obj: SyncDriven, owner: Any) -> Callable[P, R]: ...
    @overload
    def __get__(self, obj: None, owner: type[AsyncDriven]) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]: ...
    @overload
    def __get__(self, obj: None, owner: type[SyncDriven]) -> Callable[Concatenate[Any, P], R]: ...
    @overload
    def __get__(self, obj: None, owner: Any) -> Callable[Concatenate[Any, P], Gen]: ...
    @overload
    def __get__(self, obj: object, owner: Any) -> Callable[P, Gen]: ...

    def __get__(self, obj: Any, owner: Any) -> Any:
        raise NotImplementedError  # never made (class docstring)


def call(fn: Callable[Concatenate[Any, P], R]) -> Driven[P, R]:
    """Mark the generator method ``fn`` as a call of the API: driven clients expose it under its name (its
    return annotation says what they return: :class:`Driven`)."""
    fn.__vecbridge_call__ = True  # type: ignore[attr-defined]
    return cast(Any, fn)


def _closed(http, step, exc: RuntimeError) -> APIConnectionError:
    """The typed error of a request on a closed client (any other RuntimeError is raised as it was)."""
    if not http.is_closed:
        raise exc
    return ClientClosedError(f"{step.method} {step.path}: not sent, this client was closed (open a new one)")


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
        if isinstance(step, Await):
            getattr(step.awaitable, "close", lambda: None)()  # a coroutine never run: no "never awaited" warning
            gen.close()
            raise TypeError("a callback returned an awaitable (an async def?): Client calls it without awaiting; "
                            "pass a plain function, or use AsyncClient")
        try:
            if isinstance(step, Sleep):
                time.sleep(step.seconds)
            else:
                reply = http.request(step.method, step.path, **step.kw)
        except httpx.RequestError as e:
            error = e
        except RuntimeError as e:  # httpx's untyped "Cannot send a request, as the client has been closed"
            error = _closed(http, step, e)
        except BaseException as e:  # noqa: BLE001 - a Ctrl-C while waiting: thrown into the call, which raises it on
            error = e  # (an add in batches says first which rows are in: its added_ids; it closed the call unsaid)


async def run_async(http: httpx.AsyncClient, gen: Gen) -> Any:
    """Run ``gen`` to its result on ``http`` and ``asyncio.sleep`` (cancelling the task throws its CancelledError
    into ``gen``, which raises it on, then closes it)."""
    reply: Any = None
    error: BaseException | None = None
    try:
        while True:
            try:
                step = gen.throw(error) if error is not None else gen.send(reply)
            except StopIteration as done:
                return done.value
            reply = error = None
            if isinstance(step, Await):
                reply = await step.awaitable
                continue
            try:
                if isinstance(step, Sleep):
                    await asyncio.sleep(step.seconds)
                else:
                    reply = await http.request(step.method, step.path, **step.kw)
            except httpx.RequestError as e:
                error = e
            except RuntimeError as e:
                error = _closed(http, step, e)
            except BaseException as e:  # noqa: BLE001 - cancelled while waiting: thrown into the call (as run_sync)
                error = e
    finally:
        gen.close()


def _sync_method(fn: Callable[..., Gen]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def method(self, *args, **kw):
        return run_sync(self._live(), fn(self, *args, **kw))

    return method


def _async_method(fn: Callable[..., Gen]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def method(self, *args, **kw):
        return await run_async(self._live(), fn(self, *args, **kw))

    return method


class Calls:
    """The calls of a vecbridge client as generators (module docstring), and the plumbing they share.

    ``class C(Calls, driver="sync" | "async")`` replaces every :func:`call` generator by its driven method;
    the subclass calls :meth:`_setup`, which keeps its settings and opens ``self._http`` (an ``httpx.Client`` or
    ``httpx.AsyncClient``, its class's ``_HTTP``).
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

    _ver = staticmethod(as_version)  # a version number argument: InputError unless an integer (2.7 was sent as 2)

    @staticmethod
    def _expected(version) -> int | None:
        """An ``expected=`` version (None: no condition)."""
        return None if version is None else as_version(version, "expected")

    _HTTP: Callable[..., Any]  # httpx.Client or httpx.AsyncClient: what _open makes

    def _setup(self, base_url: str, api_key: str | None, *, timeout, page_size: int, max_retries: int,
               max_retry_wait: float, batch_size: int | None, headers: dict | None, transport) -> None:
        """Check the client's settings, keep them (:meth:`__reduce__`) and open its ``httpx`` client."""
        self.page_size = as_count(page_size, "page_size", 1)
        self.batch_size = None if batch_size is None else max(1, int(batch_size))
        self._limits: dict[str, int] | None = None  # LIMIT_KEYS of /v1/info once read ({}: this key may not)
        self.max_retries = as_count(max_retries, "max_retries", 0)
        self.max_retry_wait = as_seconds(max_retry_wait, "max_retry_wait", zero=True, inf=True)
        self._opens = {"base_url": self._base(base_url), "headers": self._headers(api_key, headers),
                       "timeout": self._timeout(timeout), "transport": transport}
        self._given = {"api_key": api_key, "headers": dict(headers or {})}
        self._inherited: Any = None
        self._http = self._open()

    def _open(self) -> Any:
        """A new ``httpx`` client of this client's settings (no connection yet), for this process."""
        self._pid = os.getpid()
        return self._HTTP(**self._opens)

    def _live(self) -> Any:
        """The ``httpx`` client to send on. In a process forked after this client was made (a ``fork``
        multiprocessing pool), the one inherited holds the parent's pooled connections: sharing one interleaved two
        processes' requests on one socket (a 400 "not valid HTTP/1.1", or another's answer); the child opens its
        own, and leaves the inherited one unclosed (its sockets are the parent's too), as redis-py does."""
        if self._pid != os.getpid():
            if self._http.is_closed:
                self._pid = os.getpid()
            else:
                self._inherited, self._http = self._http, self._open()
        return self._http

    def __reduce__(self) -> tuple:
        """Pickle (and ``copy``) as the client's settings, rebuilt with connections of its own: a client may go
        to a ``spawn`` process pool, or into an object ``copy.deepcopy`` / ``sklearn.clone`` copies. The pickle
        holds the API key (as the client does): keep it where the key may be. A closed client comes back open;
        a ``transport=`` is pickled (copied) with it."""
        kw = {**self._given, "base_url": self._opens["base_url"], "timeout": self._opens["timeout"],
              "transport": self._opens["transport"], "page_size": self.page_size, "max_retries": self.max_retries,
              "max_retry_wait": self.max_retry_wait, "batch_size": self.batch_size}
        return _reopened, (type(self), kw)

    @staticmethod
    def _wait_times(poll, timeout) -> tuple[float, float | None]:
        """``wait``'s ``poll`` (> 0) and ``timeout`` (>= 0; None: none); :class:`InputError` for others (a NaN,
        0 or negative poll busy-looped; a NaN timeout never came)."""
        return as_seconds(poll, "poll"), None if timeout is None else as_seconds(timeout, "timeout", zero=True)

    @staticmethod
    def _timeout(timeout):
        """The client's ``timeout``: seconds > 0 and finite, None (no limit) or an ``httpx.Timeout``; else
        :class:`InputError` (infinity raised a bare OverflowError, -1 a ValueError, 0 timed every request out)."""
        return timeout if timeout is None or isinstance(timeout, httpx.Timeout) else as_seconds(timeout, "timeout")

    @staticmethod
    def _base(base_url: str) -> str:
        """``base_url`` without its final ``/``; :class:`InputError` unless it is an ``http(s)://`` URL (a bare
        "127.0.0.1:8000" was retried three times as "no answer")."""
        if not isinstance(base_url, str) or not base_url.lower().startswith(("http://", "https://")):
            raise InputError(f"base_url must start with http:// or https://, e.g. http://127.0.0.1:8000; got a "
                             f"{'string' if isinstance(base_url, str) else type(base_url).__name__} without one")
        return base_url.rstrip("/")

    @staticmethod
    def _headers(api_key: str | None, headers: dict | None) -> dict:
        """The client's headers; an ``api_key`` no HTTP header can carry is :class:`InputError` (never shown)."""
        h = dict(headers or {})
        if api_key:
            if any(not " " <= c <= "~" for c in api_key):
                raise InputError("api_key holds a character an HTTP header cannot carry (a newline, a control or "
                                 "non-ASCII character; a key read from a file keeps its final newline: strip() "
                                 "it); the key is not shown")
            h["Authorization"] = f"Bearer {api_key}"
        return h

    @call
    def request(self, method: str, path: str, *, retry: bool | None = None, ok: Sequence[int] = (),
                **kw) -> httpx.Response:
        """Send one request; an error answer (status >= 400 and not in ``ok``) raises its :class:`APIError`
        subclass, no answer :class:`APIConnectionError` / :class:`APITimeoutError`, a redirect (3xx not in ``ok``:
        never followed) :class:`UnexpectedResponseError` naming its ``Location``.

        ``json=`` bodies may hold numpy numbers and arrays. ``retry``: whether sending the request twice is
        harmless (default: GET / HEAD / PUT / DELETE, or an ``Idempotency-Key`` header); such requests are
        retried as the module docstring of :mod:`service.client` says, others only when the connection was
        never made or the answer is a 429 (refused before any work).
        """
        return (yield from self._request(method, path, retry=retry, ok=ok, **kw))

    def _request(self, method: str, path: str, *, retry: bool | None = None, ok: Sequence[int] = (), **kw) -> Gen:
        """:meth:`request` (the generator the public method runs)."""
        if "json" in kw:
            kw["content"] = dumps(kw.pop("json"))
            kw["headers"] = {"Content-Type": "application/json", **(kw.get("headers") or {})}
        key = next((str(v) for h, v in (kw.get("headers") or {}).items()  # header names are case-insensitive
                    if str(h).lower() == "idempotency-key"), None)
        if retry is None:
            retry = method.upper() in IDEMPOTENT or key is not None
        unsure = yield from self._fits_max_body(method, path, kw.get("content"))
        attempt = 0
        while True:
            try:
                r = yield Send(method, path, kw)
            except ClientClosedError:  # closed stays closed: no retry can pass
                raise
            except httpx.LocalProtocolError:  # h11's message quotes the header value (a key): never shown
                raise InputError(f"{method} {path}: not sent, the request is not valid HTTP (a header value with a "
                                 "newline or control character? values are not shown)") from None
            except httpx.RequestError as e:
                # never sent: safe to send whatever it is; a read timeout is retried only under an Idempotency-Key
                # (the service answers the replay with the job the first try made); others may still be computing
                never_sent = isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout))
                timed_out = isinstance(e, httpx.TimeoutException) and not never_sent
                again = retry and (not timed_out or key is not None) and not unsure
                if (never_sent or again) and attempt < self.max_retries:
                    yield Sleep(self._backoff(attempt))
                    attempt += 1
                    continue
                cls = APITimeoutError if isinstance(e, httpx.TimeoutException) else APIConnectionError
                where = self._http.base_url.copy_with(userinfo=b"")  # a password in the URL stays out of the message
                err = cls(f"{method} {path}: no answer from {where} ({type(e).__name__}: {e})"
                          + (f" after {attempt + 1} tries" if attempt else "")
                          + (f"; its body of {unsure} bytes may be over the service's max_body_bytes (unknown: "
                             "/v1/info was not readable), which the service refuses by closing the connection: "
                             "not sent again"
                             if unsure and not never_sent else "")
                          + (f"; it carried Idempotency-Key {key!r}: send it again with that key (e.g. "
                             f"idempotency_key={key!r}) to get the job it may have made, not a second one"
                             if key is not None and not never_sent else ""))
                err.idempotency_key = key
                raise err from e
            if r.status_code in ok or r.status_code < 300:
                return r
            if r.status_code < 400:  # not followed: nothing was done (a POST may not be re-sent elsewhere as a GET)
                raise redirected(r)
            err = error_from_response(r)
            wait, busy = self._backoff(attempt, err.retry_after), retriable(err)
            # a 429 is a refusal before any work (a full queue or gate): sent again whatever it asked; before, a large
            # index add or create refused by the compute gate (compute_max_waiting) raised "could act twice"
            again = retry or r.status_code == 429
            if again and busy and attempt < self.max_retries and wait is not None:
                yield Sleep(wait)
                attempt += 1
                continue
            why = ""  # a busy answer says why it ends here: the caller decides whether to try again later
            if busy and not again:
                why = f"not retried: {method} {path} could act twice"
            elif busy and wait is None:
                why = f"Retry-After {err.retry_after:g} s is over max_retry_wait {self.max_retry_wait:g} s"
            elif busy and attempt:
                why = f"gave up after {attempt + 1} tries"
            if why:
                err.args = (f"{err.args[0]} ({why})",)
            raise err

    def _fits_max_body(self, method: str, path: str, content) -> Gen:
        """:class:`PayloadTooLargeError`, nothing sent, for a body over the service's ``max_body_bytes`` (read from
        ``/v1/info`` once, for bodies over :data:`LOOK_FIRST_BYTES`): the service answers such a body at once and
        closes the connection, which an ``httpx.AsyncClient`` still sending it saw as a reset (no answer), and
        sent the body again. Returns the body's size where the limit is unknown (such a body is not sent twice),
        else 0."""
        n = len(content) if isinstance(content, (bytes, bytearray)) else 0
        if n <= LOOK_FIRST_BYTES:
            return 0
        if self._limits is None:
            yield from self._read_limits()
        cap = (self._limits or {}).get("max_body_bytes")
        if not cap:
            return n
        if n > cap:
            command = whole_body_command(path.split("?")[0])
            raise PayloadTooLargeError(413, "PayloadTooLargeError", (
                f"{method} {path}: not sent, its body of {n} bytes exceeds the service's limit of {cap} bytes "
                "(max_body_bytes, from /v1/info); " + (
                    f"this body is not split into batches: run it with `{command}` on files, or raise the service's "
                    "VECBRIDGE_MAX_BODY_BYTES" if command else
                    "create the index from part of the rows, then add the rest (Client.add batches them)"
                    if path == "/v1/indexes" else "send smaller batches (or fewer rows)")), None, {})
        return 0

    def _backoff(self, attempt: int, retry_after: float | None = None) -> float | None:
        """Seconds before retry ``attempt + 1``: ``Retry-After`` when given (None when over ``max_retry_wait``:
        do not wait that long), else 0.5 s doubling per attempt, capped at 8 s."""
        if retry_after is not None:
            return max(0.0, retry_after) if retry_after <= self.max_retry_wait else None
        return min(8.0, 0.5 * 2 ** attempt)

    def _json(self, method: str, path: str, **kw) -> Gen:
        """:meth:`request`, then the answer's JSON (None for an empty answer)."""
        return self._decoded((yield from self._request(method, path, **kw)))

    @staticmethod
    def _decoded(r: httpx.Response) -> Any:
        """The JSON of the answer ``r`` (None for an empty answer); :class:`UnexpectedResponseError` if not JSON."""
        if r.status_code == 204 or not r.content:
            return None
        try:  # orjson: a 2 MB vectors_b64 answer parses in ~1 ms where json.loads took ~6 (JSON is UTF-8, RFC 8259)
            return orjson.loads(r.content)
        except ValueError:
            raise unexpected(r, "an answer that is not JSON") from None

    def _batched(self, n: int, row_bytes, send: Callable[[slice], Gen], *, body: str = "json", hits: int = 0) -> Gen:
        """``send(rows)`` for consecutive batches of rows ``0..n`` within the service's limits; the answers in order.

        ``row_bytes``: each row's share of the body (one int, or (n,) ints); ``body``: what the rows travel in,
        ``"binary"`` (``max_body_bytes``), ``"json"`` (also ``limits.body_bytes_json``) or ``"texts"`` (also
        ``limits.body_bytes_texts``); ``hits``: answers per row (a search's k: ``rows x k <= limits.max_hits``).
        A call over :data:`LOOK_FIRST_BYTES` of rows or :data:`LOOK_FIRST_HITS` hits reads the limits from
        ``/v1/info`` before sending (once per client). A smaller one goes as one request while the limits are
        unknown; after a 413 they are read and the call is sent again in batches (:func:`~service.client_wire.spans`).
        Batches are separate requests: an error in batch ``j`` leaves batches ``< j`` done.
        """
        total = int(row_bytes) * n if isinstance(row_bytes, (int, np.integer)) else int(np.sum(row_bytes))
        if self._limits is None and (total > LOOK_FIRST_BYTES or n * hits > LOOK_FIRST_HITS
                                     or (hits and self.batch_size is not None)):  # batch_size alone never split
            yield from self._read_limits()  # a search by max_hits (a 422 with a smaller server limit)
        refused = None
        if self._limits is None and self.batch_size is None:
            try:
                return [(yield from send(slice(0, n)))]
            except (PayloadTooLargeError, ValidationError) as e:
                # a 413, or a search over the server's max_hits (422; it was raised, never split)
                if isinstance(e, ValidationError) and not (hits and "limits.max_hits" in str(e)):
                    raise
                refused = e
                if not (yield from self._read_limits()):
                    raise e from None
        parts = spans(n, row_bytes, **self._caps(body, hits))
        if refused is not None and len(parts) == 1:
            raise refused
        answers = []
        for part in parts:
            try:
                answers.append((yield from send(part)))
            except APIError as e:
                if part.start:  # the service counts rows from the batch's first: name the caller's row
                    noted(e, in_batch(str(e.message), part))
                raise
        return answers

    def _read_limits(self) -> Gen:
        """Read the service's limits from ``/v1/info`` into ``self._limits``; whether they are known now. A key
        that may not read them (401 / 403) or a service without the route (404) is not asked again."""
        try:
            lim = (yield from self._json("GET", "/v1/info"))["limits"]
            self._limits = {k: int(lim[k]) for k in LIMIT_KEYS if isinstance(lim.get(k), int) and lim[k] > 0}
        except (AuthenticationError, PermissionDeniedError, NotFoundError):
            self._limits = {}
        except (APIError, KeyError, TypeError, ValueError):
            pass
        return bool(self._limits)

    def _caps(self, body: str, hits: int) -> dict:
        """``spans``' ``max_rows`` / ``max_bytes`` for rows sent as ``body`` with ``hits`` answers each."""
        lim = self._limits or {}
        rows = [lim.get("max_batch"), self.batch_size]
        if hits and lim.get("max_hits"):
            rows.append(max(1, lim["max_hits"] // hits))
        sizes = [lim.get("max_body_bytes"), lim.get({"json": "body_bytes_json", "texts": "body_bytes_texts"}.get(body))]
        return {"max_rows": min((v for v in rows if v), default=None),
                "max_bytes": min((v for v in sizes if v), default=None)}

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


def _reopened(cls: type, kw: dict) -> Any:
    """A client of class ``cls`` made from the settings ``kw`` (unpickling: :meth:`Calls.__reduce__`)."""
    return cls(**kw)


class SyncDriven(Calls):
    """A client whose calls block (``httpx.Client``): :class:`service.client.Client`."""

    _HTTP = httpx.Client

    def close(self) -> None:
        """Release the client's connections (in a forked child, its own: the parent's stay the parent's)."""
        self._live().close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncDriven(Calls):
    """A client whose calls are coroutines (``httpx.AsyncClient``): :class:`service.client.AsyncClient`. Its
    connections belong to the event loop they were made in: once that loop has stopped (a second
    ``asyncio.run``), the client opens new ones in the loop that calls it (with a ``transport=`` of the caller's,
    it goes on with that transport); while it still runs (another thread), a call from another loop is
    :class:`EventLoopError`."""

    _HTTP = httpx.AsyncClient
    _loop: asyncio.AbstractEventLoop | None = None

    def _live(self) -> Any:
        loop, http = asyncio.get_running_loop(), super()._live()
        if self._loop is not None and self._loop is not loop and not http.is_closed:
            if self._loop.is_running():
                raise EventLoopError("this AsyncClient serves another event loop, which still runs (another thread): "
                                     "open one AsyncClient inside each running loop (e.g. `async with "
                                     "AsyncClient(...) as vb:` in the coroutine the loop runs)")
            if self._opens["transport"] is None:  # a transport= of the caller's is theirs to mind, as before
                self._inherited, http = http, self._open()  # the stopped loop's connections: not closable here
                self._http = http
        self._loop = loop
        return http

    async def close(self) -> None:
        """Release the client's connections (``aclose`` too)."""
        await self._live().aclose()

    aclose = close

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
