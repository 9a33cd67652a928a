"""The one place where exceptions become HTTP status codes.

Domain code raises errors of the one tree rooted at :class:`align.exceptions.VecbridgeError`;
each carries a ``kind`` and :data:`service.errors.HTTP_STATUS` gives its status. The handlers
below turn them into::

    {"error": {"type": "DimensionMismatchError", "status": 422,
               "message": "vectors: expected 384 columns, got 768"}}

A request that fails validation (an unknown or ill-typed field of the body, a bad query parameter), whichever
part validated it, is ``{"type": "InputError", "status": 422, "message": "invalid request: k: ...",
"details": [{"loc": ["body", "k"], "msg": ..., "type": ...}, ...]}`` (FastAPI's validation answered as
``RequestValidationError`` before, the routes that read their own body as ``InputError`` without details).

Extras: 401 answers carry ``WWW-Authenticate: Bearer``, 429 and 503 ``Retry-After`` (not a 503 that no retry
can fix: :class:`service.errors.NotConfiguredError`); an OS or SQLite error from a read-only / immutable /
full data dir (``service.storage.is_storage_error``) is 503 without ``Retry-After`` (its operator must act); a
client that closed the connection before its answer (its body incomplete, or its heavy work queued or stopped
at a checkpoint: ``service.api.gate``) is a 499 (nobody reads it; no error logged);
any exception that is not ours is 500 with the request id, its text kept out of the answer and written to the
log.
"""

from __future__ import annotations

import sqlite3

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match, Mount

from align.exceptions import VecbridgeError

from ..errors import HTTP_STATUS, kind_of, retry_after_of
from ..logging import get_logger
from ..storage import is_storage_error, storage_message
from ..urls import hide_endpoints
from .codec import validation_error
from .responses import FastJSONResponse

__all__ = ["allowed_methods", "error_response", "install_error_handlers", "status_for"]

_log = get_logger("errors")


def status_for(exc: BaseException) -> int:
    """HTTP status of ``exc``: its kind's status, or 503 for a storage failure behind a 500."""
    status = HTTP_STATUS[kind_of(exc)]
    return 503 if status == 500 and is_storage_error(exc) else status


def _body(kind: str, status: int, message: str, **extra) -> dict:
    return {"error": {"type": kind, "status": status, "message": message, **extra}}


def _domain_handler(request: Request, exc: Exception) -> FastJSONResponse:
    status = status_for(exc)
    headers = {}
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    elif status in (429, 503) and (wait := retry_after_of(exc)) is not None:  # none: no retry helps (exit 2)
        headers["Retry-After"] = str(wait)
    message = str(exc) or type(exc).__name__
    if status == 503 and is_storage_error(exc):
        _log.warning("data dir not writable", extra={"fields": {"error": f"{type(exc).__name__}: {exc}",
                                                                 "path_template": _route(request)}})
        # no Retry-After: a read-only or full disk waits for its operator, and a client retrying would only stall
        state = getattr(request.app.state, "vb", None)  # name the databases of this app that were replaced
        files = None if state is None else state.opened_files()
        folder = None if state is None else state.settings.data_dir
        return FastJSONResponse(_body("StorageUnavailableError", 503, storage_message(exc, files=files, folder=folder)),
                                status_code=503)
    if status == 503 and not isinstance(exc, VecbridgeError):  # kind_of: a database kept locked by another process
        _log.warning("database locked", extra={"fields": {"error": str(exc), "path_template": _route(request)}})
        return FastJSONResponse(_body("DatabaseLockedError", 503, "a database of the data dir stayed locked by another "
                                      "process (a backup, a long write) past its busy timeout; nothing was changed: "
                                      "retry shortly"), status_code=503, headers=headers)
    rid = request.scope.get("state", {}).get("request_id")
    if status == 503 and isinstance(exc, VecbridgeError):  # a part not ready (registry down, LM missing): expected
        _log.warning("service unavailable", extra={"fields": {  # while it lasts, one line a request, no traceback
            "request_id": rid, "path_template": _route(request), "error": f"{type(exc).__name__}: {exc}"}})
    elif status >= 500:
        _log.error("request failed", exc_info=exc, extra={"fields": {"request_id": rid,
                                                                      "path_template": _route(request)}})
        if not isinstance(exc, VecbridgeError):
            message = f"internal error (request id {rid})"
    elif hide_endpoints(message) != message:  # a vector database refusing a wrong password: not a 503
        _log.warning("request refused", extra={"fields": {"request_id": rid, "path_template": _route(request),
                                                           "error": f"{type(exc).__name__}: {exc}"}})
    message = hide_endpoints(message)  # the log has the database's host and port, a client does not (any status)
    extra = {"details": exc.details} if isinstance(getattr(exc, "details", None), list) else {}
    return FastJSONResponse(_body(type(exc).__name__, status, message, **extra), status_code=status, headers=headers)


def error_response(request: Request, exc: Exception) -> FastJSONResponse:
    """The answer (and log line) the app gives for ``exc``, for a part that answers without it (the fast path)."""
    return _domain_handler(request, exc)


def _route(request: Request) -> str:
    route = request.scope.get("route")
    return getattr(route, "path", "unmatched")


def _validation_handler(request: Request, exc: RequestValidationError) -> FastJSONResponse:
    """FastAPI's own validation (a body model, a query parameter) answered as every route's: an InputError with
    ``details`` (:func:`~service.api.codec.validation_error`)."""
    return _domain_handler(request, validation_error(exc.errors()))


_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def _catch_all(route) -> bool:
    return any(getattr(getattr(route, a, None), "catch_all", False) for a in ("endpoint", "original_router"))


def allowed_methods(request: Request) -> list[str]:
    """Every method some route of the app takes at this request's path (Starlette's 405 names only the methods of
    the first route whose path matched: ``PATCH /v1/indexes/x`` said ``Allow: GET``, though DELETE is there too).
    Asked of the routes as the router asks them (included routers too); mounts take any method, so not them, nor a
    catch-all (a route or included router marked ``catch_all``: the console's 404 page takes any path under /ui)."""
    routes = [r for r in request.app.router.routes if not isinstance(r, Mount) and not _catch_all(r)]
    return [m for m in _METHODS if any(r.matches({**request.scope, "method": m})[0] == Match.FULL for r in routes)]


def _http_handler(request: Request, exc: StarletteHTTPException) -> FastJSONResponse:
    if exc.status_code == 405 and getattr(request.scope.get("endpoint"), "catch_all", False) \
            and not allowed_methods(request):
        exc = StarletteHTTPException(404)  # only a catch-all matched (TRACE /ui/typo): no route, as for GET there
    kind = {404: "NotFound", 405: "MethodNotAllowed"}.get(exc.status_code, "HTTPError")
    message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code == 404 and message == "Not Found":
        # behind a proxy's prefix: under it; inside a mount (/ui/static) its root_path has the mount's path too
        scope = request.scope
        docs = scope.get("app_root_path", scope.get("root_path", "")).rstrip("/") + "/docs"
        message = f"no route {request.method} {request.url.path}; see {docs}"
    headers = dict(getattr(exc, "headers", None) or {})
    if exc.status_code == 405 and (allowed := allowed_methods(request)):
        headers["Allow"] = ", ".join(allowed)  # RFC 9110: every method the resource supports
    return FastJSONResponse(_body(kind, exc.status_code, message), status_code=exc.status_code,
                            headers=headers or None)


def _disconnect_handler(request: Request, exc: ClientDisconnect) -> FastJSONResponse:
    """The client closed the connection before its answer (its body incomplete, or while its heavy work waited or
    ran: ``service.api.gate``): nobody reads this answer; it is a 499 (client closed request) in the access log and
    metrics, not a 500 with a traceback."""
    return FastJSONResponse(_body("ClientDisconnect", 499, "the client closed the connection before its answer"),
                            status_code=499)


def install_error_handlers(app: FastAPI) -> None:
    """Register every handler on ``app``."""
    for cls in (VecbridgeError, OSError, sqlite3.Error):  # storage errors: answered here (503), not re-raised by Starlette
        app.add_exception_handler(cls, _domain_handler)
    app.add_exception_handler(ClientDisconnect, _disconnect_handler)
    app.add_exception_handler(RequestValidationError, _validation_handler)
    app.add_exception_handler(StarletteHTTPException, _http_handler)
    app.add_exception_handler(Exception, _domain_handler)
