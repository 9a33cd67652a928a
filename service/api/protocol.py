"""The HTTP protocol ``vecbridge serve`` runs: uvicorn's httptools protocol with a deadline for request heads.

uvicorn bounds the silence between a response and the next request (``timeout_keep_alive``) but not the wait for
a request's line and headers: a connection that sends nothing, or its headers a byte at a time, was held for
ever — before any key check, so anyone who can reach the port could hold connections (and descriptors) until
the process runs out. :class:`HeadTimeoutProtocol` closes a connection whose request head is not complete
``Settings.header_timeout_s`` after the connection opened, or after the first byte of the next request on a
kept-alive one. The body has its own bound (``body_timeout_s``, :class:`~service.api.middleware.GuardMiddleware`).
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["HeadTimeoutProtocol", "set_header_timeout"]

_timeout: float | None = None  # set by serve(); worker processes read their settings (VECBRIDGE_* variables)


def set_header_timeout(seconds: float) -> None:
    """The deadline of every connection's request head in this process (``serve`` calls it)."""
    global _timeout
    _timeout = float(seconds)


def _header_timeout() -> float:
    global _timeout
    if _timeout is None:
        from ..config import get_settings

        _timeout = float(get_settings().header_timeout_s)
    return _timeout


class HeadTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol; a request head must be complete within :func:`_header_timeout` seconds."""

    _head_timer = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_head()  # kept armed from the connection's opening, or armed for the next request's head

    def on_headers_complete(self) -> None:
        self._disarm_head()
        super().on_headers_complete()

    def connection_lost(self, exc) -> None:
        self._disarm_head()
        super().connection_lost(exc)

    def _arm_head(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(_header_timeout(), self._head_timed_out)

    def _disarm_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()
