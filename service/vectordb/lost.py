"""A vector database lost in the middle of an operation (stopped, restarted, the network gone), told apart from a
refusal and from a bug.

:func:`unavailable_if_lost` turns a client's error that says the connection went away into a
:class:`~service.vectordb.base.VectorDBUnavailableError` (exit 75, HTTP 503 with ``Retry-After``), one line, where
it was an "internal error" (exit 3): psycopg's three-line "consuming input failed: server closed the connection
unexpectedly ...", pymilvus's "Fail connecting to server", or qdrant-client's ``ResponseHandlingException`` around
httpx's "Server disconnected without sending a response." / "Connection refused" / "Connection reset by peer" /
a timeout (a Qdrant server stopped, restarted or hanging under its REST client; gRPC's ``UNAVAILABLE`` under its
gRPC client, as Milvus's). :func:`quiet_client_logs` keeps pymilvus's own log lines (a traceback per failed call:
~150 lines on stderr when a server stops) out of a command's output, which says the error once, in one line.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

from align.exceptions import VecbridgeError

from ..errors import exception_chain
from .base import VectorDBUnavailableError

__all__ = ["lost_as_unavailable", "lost_connection", "quiet_client_logs", "unavailable_if_lost"]

#: SQLSTATEs of a server ending the session: admin_shutdown (a fast stop), crash_shutdown, cannot_connect_now
_PG_SHUTDOWN = ("57P01", "57P02", "57P03")
_MILVUS_CONNECT_FAILED = 2  # pymilvus' Status.CONNECT_FAILED; Milvus' own code 2 is "service unavailable"
#: a gateway's answers that the server behind it is not there (Qdrant Cloud's load balancer while a node restarts)
_GATEWAY_GONE = (502, 503, 504)
#: the loggers pymilvus configures at import with handlers of their own (the others propagate to "pymilvus")
_PYMILVUS_LOGGERS = ("pymilvus", "pymilvus.milvus_client", "pymilvus.bulk_writer")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _pg_lost(exc: BaseException, conn=None) -> str | None:
    psycopg = sys.modules.get("psycopg")  # an error of psycopg's means it is imported
    if psycopg is None or not isinstance(exc, psycopg.OperationalError):
        return None
    from ..registry.postgres import refused_for_good

    state, why = getattr(exc, "sqlstate", None) or "", _first_line(exc)
    if refused_for_good(exc, why):  # a password, a role, a database that does not exist: a retry gets the same
        return None
    if not state and isinstance(conn, psycopg.Connection) and not conn.broken:  # psycopg's "the connection is
        # closed" of one closed by our own code (a bug, not the server's doing): lost only when psycopg saw it break
        return None
    # no SQLSTATE: libpq's own error of the connection (closed by the server, reset, timed out); class 08: connection
    return why if not state or state.startswith("08") or state in _PG_SHUTDOWN else None


def _milvus_lost(exc: BaseException) -> str | None:
    errors, grpc = sys.modules.get("pymilvus.exceptions"), sys.modules.get("grpc")
    if errors is not None and isinstance(exc, errors.MilvusException):
        gone = exc.code == _MILVUS_CONNECT_FAILED or isinstance(exc, errors.MilvusUnavailableException)
        return _first_line(exc.message or exc) if gone else None
    if grpc is not None and isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None)):
        return _first_line(exc.details() or exc) if exc.code() == grpc.StatusCode.UNAVAILABLE else None
    return None


def _qdrant_lost(exc: BaseException, server: str | None) -> str | None:
    """A Qdrant server's REST connection gone: httpx's connect / read / write errors and "Server disconnected without
    sending a response" (qdrant-client raises them inside a ``ResponseHandlingException``, whose chain holds them), a
    timeout (connect, read, write, pool: a server that hangs is as gone as one that stopped, and was exit 3 / 500),
    or a gateway's 502 / 503 / 504 (qdrant-client's ``UnexpectedResponse``). Only for a store of a
    server (``server``: its URL; None for local mode, which has no connection to lose) and for a request to that
    server's host: httpx also carries other requests (a model's download by huggingface_hub). A certificate refused
    is not lost (a retry gets the same); any other answer of the server (a 4xx) is the server's word, not a loss."""
    httpx = sys.modules.get("httpx")
    if server is None or httpx is None:
        return None
    errors = sys.modules.get("qdrant_client.http.exceptions")
    if errors is not None and isinstance(exc, errors.UnexpectedResponse):
        return f"HTTP {exc.status_code} {exc.reason_phrase}".strip() if exc.status_code in _GATEWAY_GONE else None
    if not isinstance(exc, (httpx.NetworkError, httpx.RemoteProtocolError, httpx.TimeoutException)):
        return None
    try:
        host = exc.request.url.host
    except RuntimeError:  # an error raised without its request: the store's call raised it, so its server's
        host = None
    why = _first_line(exc)
    if isinstance(exc, httpx.TimeoutException):  # httpx says "timed out" alone: which step did
        why = f"{type(exc).__name__}: {why}"
    if (host is not None and host != urlsplit(server).hostname) or "CERTIFICATE_VERIFY_FAILED" in why:
        return None
    return why


def lost_connection(exc: BaseException, conn=None, server: str | None = None) -> str | None:
    """The client's words (one line) when ``exc``, or an exception it came from, says the connection to the database
    was lost or cannot be made again: psycopg's ``OperationalError`` without a SQLSTATE (libpq's "server closed the
    connection unexpectedly"; with ``conn``, the store's psycopg connection, only once psycopg marked it ``broken``:
    "the connection is closed" of a connection our code closed is a bug), of class 08, or of the server shutting down;
    pymilvus's code 2 or gRPC ``UNAVAILABLE`` (Milvus, Qdrant's gRPC client); with ``server``, a Qdrant store's
    server URL, httpx's errors of the connection to it (:func:`_qdrant_lost`). None for anything else: errors of
    ours, a refusal for good (a wrong password, a database that does not exist), an answer of a live server (a 4xx),
    bad input, a bug."""
    if isinstance(exc, VecbridgeError):
        return None
    for e in exception_chain(exc):
        why = _pg_lost(e, conn) or _milvus_lost(e) or _qdrant_lost(e, server)
        if why:
            return why
    return None


def unavailable_if_lost(store, exc: BaseException, then: str) -> VectorDBUnavailableError | None:
    """A :class:`VectorDBUnavailableError` saying ``store``'s connection was lost and what to do (``then``) when
    :func:`lost_connection` says so of ``exc`` (the store's connection tells a broken one from one closed on our
    side; a Qdrant store's ``server_url``, None in local mode, the requests to its server from others); None
    otherwise (the caller raises ``exc`` as it is)."""
    why = lost_connection(exc, getattr(store, "conn", None), getattr(store, "server_url", None))
    if why is None:
        return None
    return VectorDBUnavailableError(f"{store.engine}: the connection to the database was lost ({why}); {then} (a failure "
                                    "that repeats at the same point is not a passing one: an administrator ending the "
                                    "session, as pg_terminate_backend does, or a server that fails there)")


@contextmanager
def lost_as_unavailable(store, then: str) -> Iterator[None]:
    """Raise an error inside that says ``store``'s connection was lost as :func:`unavailable_if_lost`'s
    VectorDBUnavailableError (``then``: what to do; exit 75, 503), any other as it is: what a migration, a verify
    and the service's shared store each did with its own try."""
    try:
        yield
    except Exception as exc:
        lost = unavailable_if_lost(store, exc, then)
        if lost is None:
            raise
        raise lost from exc


def quiet_client_logs(url: str) -> None:
    """Silence pymilvus's loggers when ``url`` is a Milvus one and pymilvus is installed (it is imported here: its
    import configures those loggers, so levels set before it would be undone). For the command-line faces, whose
    one error line already says what failed; a service keeps the client's logs."""
    if not str(url).startswith("milvus"):
        return
    try:
        import pymilvus  # noqa: F401  - configures the loggers silenced below
    except ImportError:  # open_store names the missing extra
        return
    for name in _PYMILVUS_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)
