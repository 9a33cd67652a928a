"""The HTTP protocol ``vecbridge serve`` runs: uvicorn's httptools protocol with deadlines for slow clients.

uvicorn bounds the silence between a response and the next request (``timeout_keep_alive``) but not the wait for
a request's line and headers: a connection that sends nothing, or its headers a byte at a time, was held for
ever — before any key check, so anyone who can reach the port could hold connections (and descriptors) until
the process runs out. :class:`SlowClientProtocol` closes a connection whose request head is not complete
``Settings.header_timeout_s`` after the connection opened, or after the first byte of the next request on a
kept-alive one. The body has its own bound (``body_timeout_s``, :class:`~service.api.middleware.GuardMiddleware`).

A head's size is bounded too: httptools keeps a header however long it grows, so one request of 200 MB of
headers took 200 MB of the server's memory and kept it. Past :data:`MAX_HEAD_BYTES` received while a head is
incomplete the answer is a 431 and the connection is closed.

The other way round, a client that stops reading an answer larger than the connection's buffers held the
request (and the unsent part of the answer, up to the largest answer the limits allow) for ever: uvicorn waits
for the transport to drain. Once the transport says its buffer is full (``pause_writing``), the client has
``Settings.send_timeout_s`` to read some of it (``resume_writing``), else the connection is dropped (``abort``:
the buffered bytes are freed at once; the request sees a disconnected client).

A request the parser refuses (a duplicate Content-Length, Content-Length with Transfer-Encoding, a bad chunk size,
a request target past :data:`MAX_URL_BYTES`, ...) was uvicorn's plain-text ``400 Invalid HTTP request received.``
where every other error is the JSON error body: it is that body now, a 414 for the too-long target.

An answer that ends the connection before the request's body has all arrived (a 413 sized from Content-Length,
a 408, a 400 / 414 / 431 of the parser) closed the socket with the client still sending: the kernel answers the
unread bytes with a reset, and a client that writes its whole body before it reads (Python's http.client,
requests, httpx, browsers) got ``ConnectionResetError`` / ``BrokenPipeError``, never the JSON error. Such a close
now lingers, as nginx's ``lingering_close``: the answer is sent and the write side shut (FIN), then what the client
still sends is read and dropped until it closes its end, for at most :data:`LINGER_S` and :data:`LINGER_BYTES`
(then the connection is dropped, as before). A close after a request that arrived whole is immediate, as before.
"""

from __future__ import annotations

import json
import sys

from httptools import HttpParserCallbackError, HttpParserInvalidURLError
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["LINGER_BYTES", "LINGER_S", "MAX_HEAD_BYTES", "MAX_URL_BYTES", "SlowClientProtocol", "set_timeouts"]

#: Bytes a connection may send while its request head is incomplete (a head of a few KB, plus the read that
#: completes it: uvloop reads up to 256 KiB at once); nginx's default takes 4 buffers of 8 KB.
MAX_HEAD_BYTES = 1 << 20
_TOO_LARGE = (b'{"error": {"type": "HeaderTooLargeError", "status": 431, "message": "the request line and headers '
              b'exceed 1048576 bytes"}}')
#: Bytes of a request target (path and query) httptools parses; a longer one is a 414.
MAX_URL_BYTES = 65535
#: Longest a connection lingers after such an answer: a whole 77 MB body takes 0.03 s on loopback, 0.7 s over a
#: gigabit link (a slower link past 5 s gets the reset, as before); nginx waits 5 s for each read
#: (``lingering_timeout``), 30 s in all. Bounded in time and bytes, a lingering connection holds a socket and no
#: request memory (a stalled head or body holds one 30 / 60 s).
LINGER_S = 5.0
#: Most bytes dropped while lingering: four times the largest body any route takes by default (``max_body_bytes``,
#: 64 MiB), so a body well over the limit is read to its end; past it the client is cut off (reading and dropping
#: 256 MiB costs the event loop about 0.1 s).
LINGER_BYTES = 256 << 20
_REASON = {400: b"Bad Request", 414: b"URI Too Long", 431: b"Request Header Fields Too Large"}

_timeouts: dict[str, float] = {}  # set by serve(); worker processes read their settings (VECBRIDGE_* variables)


def set_timeouts(header_s: float, send_s: float) -> None:
    """The deadlines of every connection in this process (``serve`` calls it)."""
    _timeouts.update(header=float(header_s), send=float(send_s))


def _timeout(which: str) -> float:
    if which not in _timeouts:
        from ..config import get_settings

        s = get_settings()
        set_timeouts(s.header_timeout_s, s.send_timeout_s)
    return _timeouts[which]


class _AnswerTransport:
    """The transport as a request's cycle (uvicorn's ``RequestResponseCycle``) sees it: the close that follows an
    answer lingers when the request has not all arrived (:meth:`SlowClientProtocol._close_after_answer`)."""

    __slots__ = ("_protocol",)

    def __init__(self, protocol: SlowClientProtocol) -> None:
        self._protocol = protocol

    def __getattr__(self, name: str):
        return getattr(self._protocol.transport, name)

    def close(self) -> None:
        self._protocol._close_after_answer(lingering=not self._protocol._request_whole)

    def is_closing(self) -> bool:  # lingering counts as closing: no "100 Continue", no next request
        return self._protocol._linger_timer is not None or self._protocol.transport.is_closing()


class SlowClientProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol; a request head must be complete within ``header_timeout_s``, a client
    whose reading stalls an answer for ``send_timeout_s`` is dropped, and an answer that ends the connection
    before the request has all arrived is followed by a bounded lingering close."""

    _idle_since = None  # loop time the last answer of a kept-alive connection ended; None while not idle
    _head_since = None  # loop time a request head began to be awaited; None while no head is awaited or under way
    _head_timer = None  # the pending check of that deadline: kept from one request to the next, not made per request
    _send_timer = None
    _head_bytes = 0
    _linger_timer = None
    _stopping = False  # shutdown() was called: an answer that ends the connection closes it at once
    _linger_left = 0
    _request_whole = True  # the last request's message has all arrived

    def data_received(self, data: bytes) -> None:
        if self._linger_timer is not None:  # the answer is out: drop what the client still sends, up to a bound
            self._linger_left -= len(data)
            if self._linger_left < 0:
                self._linger_over()
            return
        if self.transport.is_closing():
            return
        if self._head_since is not None:  # a request head is awaited or under way
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._disarm_head()
                self._send_error(431, _TOO_LARGE)
                return
        super().data_received(data)

    def send_400_response(self, msg: str) -> None:
        """The answer to a request the parser refused (uvicorn calls it while it handles the parser's error): the
        JSON error body, naming the parser's reason, instead of uvicorn's plain text; a target past
        :data:`MAX_URL_BYTES` is a 414 (the limits table promised a 1 MiB head, and such a URL got the plain 400)."""
        exc = sys.exc_info()[1]
        if isinstance(exc, HttpParserCallbackError) and exc.__context__ is not None:  # raised by uvicorn's callback
            exc = exc.__context__  # (the target's parse in on_headers_complete): its own reason
        if isinstance(exc, HttpParserInvalidURLError) and len(self.url) > MAX_URL_BYTES:
            status, kind = 414, "URITooLongError"
            message = (f"the request target (path and query) has {len(self.url)} bytes, more than {MAX_URL_BYTES}; "
                       f"send long inputs in a request body")
        else:
            status, kind = 400, "InvalidRequestError"
            why = str(exc)[:200] if exc is not None else msg
            message = (f"the request is not valid HTTP/1.1 ({why}), so the connection is closed; send a well-formed "
                       f"request line, headers and chunks, with one Content-Length or Transfer-Encoding: chunked, "
                       f"not both (RFC 9112)")
        self._send_error(status, json.dumps({"error": {"type": kind, "status": status, "message": message}}).encode())

    def _send_error(self, status: int, body: bytes) -> None:
        """Write an error answer ``status`` with the JSON ``body`` and close the connection."""
        head = [b"HTTP/1.1 %d %s\r\n" % (status, _REASON[status])]
        head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
        self.transport.write(b"".join(head) + b"content-type: application/json\r\nconnection: close\r\n"
                                              b"content-length: %d\r\n\r\n%s" % (len(body), body))
        self._close_after_answer(lingering=True)  # the request is broken or cut short: more of it may come

    def _close_after_answer(self, lingering: bool) -> None:
        """Close the connection after the answer written to it; ``lingering`` (the request has not all arrived):
        first shut the write side and read and drop what the client still sends, until it closes its end, for at
        most :data:`LINGER_S` and :data:`LINGER_BYTES`, so that it reads the answer instead of a reset."""
        transport = self.transport
        if self._linger_timer is not None or transport.is_closing():
            return
        if not lingering or self._stopping or not transport.can_write_eof():  # (TLS cannot half-close)
            transport.close()
            return
        self._disarm_head()
        self._unset_keepalive_if_required()
        if self.cycle is not None and not self.cycle.response_complete:  # a parser error while the app reads: it
            self.cycle.disconnected = True  # sees a client that left, as when the connection was closed at once
            self.cycle.message_event.set()
        transport.write_eof()  # a FIN after the answer: the client reads the answer to its end
        self._linger_left = LINGER_BYTES
        self._linger_timer = self.loop.call_later(LINGER_S, self._linger_over)
        self.flow.resume_reading()  # uvicorn pauses reading while a body nobody reads piles up

    def _linger_over(self) -> None:
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        if not self.transport.is_closing():
            self.transport.abort()

    def on_response_complete(self) -> None:
        self.server_state.total_requests += 1
        if self._linger_timer is not None or self.transport.is_closing():  # the connection ends: no keep-alive wait
            return
        # uvicorn's (HttpToolsProtocol.on_response_complete), its keep-alive deadline checked lazily as the head's:
        # the next request's first read no longer cancels a timer made by this answer (~10 µs a request)
        self._idle_since = None
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_since = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_at(self._idle_since + self.timeout_keep_alive,
                                                             self._keep_alive_check)

    def _unset_keepalive_if_required(self) -> None:  # uvicorn's name: a read (or an answer) ends the idle wait
        self._idle_since = None

    def _keep_alive_check(self) -> None:
        self.timeout_keep_alive_task = None
        if self._idle_since is None:  # not idle now: the next answer arms a check
            return
        due = self._idle_since + self.timeout_keep_alive
        if self.loop.time() < due:  # idle since a later answer than the one this check was armed after
            self.timeout_keep_alive_task = self.loop.call_at(due, self._keep_alive_check)
            return
        self._idle_since = None
        self.timeout_keep_alive_handler()

    def shutdown(self) -> None:
        self._stopping = True  # an answer still to come closes at once: no linger to outlast the server's grace
        if self._linger_timer is not None:  # the server stops: a lingering connection ends now
            self._linger_over()
        else:
            super().shutdown()

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._answer_transport = _AnswerTransport(self)
        self._arm_head()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._request_whole = False
        self._arm_head()  # kept armed from the connection's opening, or armed for the next request's head

    def on_headers_complete(self) -> None:
        self._disarm_head()
        super().on_headers_complete()
        if self.cycle is not None:  # its close after the answer comes to _close_after_answer
            self.cycle.transport = self._answer_transport

    def on_message_complete(self) -> None:
        self._request_whole = True
        super().on_message_complete()

    def connection_lost(self, exc) -> None:
        self._disarm_head()
        for name in ("_head_timer", "timeout_keep_alive_task"):  # pending checks: not kept until they are due
            if (timer := getattr(self, name)) is not None:
                timer.cancel()
                setattr(self, name, None)
        self._idle_since = None
        self._disarm_send()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(_timeout("send"), self._send_timed_out)

    def resume_writing(self) -> None:
        self._disarm_send()
        super().resume_writing()

    def _disarm_send(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _send_timed_out(self) -> None:
        self._send_timer = None
        if not self.transport.is_closing():
            self.transport.abort()

    # The head's deadline is checked by one timer per connection that outlives the heads it finds complete: a timer
    # armed at each request's first byte and cancelled at its last header cost ~10 µs of every request (uvloop's
    # call_later, cancel and handle close), where a kept-alive client's requests each complete their head in
    # microseconds. A head that began after the pending check was armed gets its own deadline when the check runs.
    def _arm_head(self) -> None:
        if self._head_since is None:
            self._head_bytes = 0
            self._head_since = self.loop.time()
            if self._head_timer is None:
                self._head_timer = self.loop.call_at(self._head_since + _timeout("header"), self._head_check)

    def _disarm_head(self) -> None:
        self._head_since = None

    def _head_check(self) -> None:
        self._head_timer = None
        if self._head_since is None:  # no head under way: the next one arms a check
            return
        due = self._head_since + _timeout("header")
        if self.loop.time() < due:  # this head began after the check was armed (for an earlier one)
            self._head_timer = self.loop.call_at(due, self._head_check)
            return
        self._head_since = None
        if not self.transport.is_closing():
            self.transport.close()
