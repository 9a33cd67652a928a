"""The one place where exceptions become HTTP status codes.

Domain code raises typed errors (``align.exceptions``, ``service.registry.errors``,
``service.indexes``, ``service.jobs``, and the few API-level errors defined here); the
handlers below turn them into::

    {"error": {"type": "DimensionMismatchError", "status": 422,
               "message": "vectors: expected 384 columns, got 768"}}

=============================================  ======
exception                                      status
=============================================  ======
AuthenticationError                            401  (with ``WWW-Authenticate: Bearer``)
PermissionDeniedError                          403
NotFoundError, IndexNotFoundError,             404
JobNotFoundError, UnknownEncoderError
ConflictError, IndexConflictError,             409
IdempotencyConflictError
PayloadTooLargeError                           413
UnsupportedMediaTypeError                      415
align InputError (NaN, shape, dimension,       422
empty, ...), InvalidNameError,
request validation
QueueFullError                                 429  (with ``Retry-After``)
ServiceUnavailableError                        503
a read-only / immutable / full data dir        503  (``service.storage.is_storage_error``: OSError
                                                    EROFS/ENOSPC/EPERM..., SQLite "readonly", "disk is full")
anything else                                  500  (logged with the request id)
=============================================  ======
"""

from __future__ import annotations

import sqlite3

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from align.exceptions import InputError, NotFittedError, SerializationError

from ..indexes import IndexConflictError, IndexNotFoundError
from ..jobs import IdempotencyConflictError, JobNotFoundError, QueueFullError
from ..logging import get_logger
from ..storage import is_storage_error, storage_message
from ..registry.errors import ConflictError, InvalidNameError, NotFoundError, RegistryError
from .responses import FastJSONResponse

__all__ = [
    "AuthenticationError", "PermissionDeniedError", "PayloadTooLargeError", "UnsupportedMediaTypeError",
    "UnknownEncoderError", "ServiceUnavailableError", "install_error_handlers", "status_for", "STATUS_TABLE",
]

_log = get_logger("errors")


class AuthenticationError(Exception):
    """No credentials, or credentials that match no key."""


class PermissionDeniedError(Exception):
    """A valid key without the scope the route needs."""


class PayloadTooLargeError(Exception):
    """Request body or batch beyond the configured limits."""


class UnsupportedMediaTypeError(Exception):
    """A Content-Type the route does not read."""


class UnknownEncoderError(LookupError):
    """No installed encoder by that name."""


class ServiceUnavailableError(Exception):
    """A needed part (registry, indexes) is not ready."""


# Order matters: the first matching class wins (subclasses before their bases).
STATUS_TABLE: list[tuple[type[BaseException], int]] = [
    (AuthenticationError, 401),
    (PermissionDeniedError, 403),
    (NotFoundError, 404),
    (IndexNotFoundError, 404),
    (JobNotFoundError, 404),
    (UnknownEncoderError, 404),
    (ConflictError, 409),
    (IndexConflictError, 409),
    (IdempotencyConflictError, 409),
    (PayloadTooLargeError, 413),
    (UnsupportedMediaTypeError, 415),
    (InvalidNameError, 422),
    (InputError, 422),
    (NotFittedError, 422),
    (QueueFullError, 429),
    (ServiceUnavailableError, 503),
    (SerializationError, 500),
    (RegistryError, 500),
]


def status_for(exc: BaseException) -> int:
    for cls, status in STATUS_TABLE:
        if isinstance(exc, cls):
            return 503 if status == 500 and is_storage_error(exc) else status
    return 503 if is_storage_error(exc) else 500


def _body(kind: str, status: int, message: str, **extra) -> dict:
    return {"error": {"type": kind, "status": status, "message": message, **extra}}


def _domain_handler(request: Request, exc: Exception) -> FastJSONResponse:
    status = status_for(exc)
    headers = {}
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    elif status == 429:
        headers["Retry-After"] = "5"
    message = str(exc) or type(exc).__name__
    if status == 503 and is_storage_error(exc):
        _log.warning("data dir not writable", extra={"fields": {"error": f"{type(exc).__name__}: {exc}",
                                                                 "path_template": _route(request)}})
        return FastJSONResponse(_body("StorageUnavailableError", 503, storage_message(exc)), status_code=503,
                                headers={"Retry-After": "30"})
    if status >= 500:
        _log.error("request failed", exc_info=exc, extra={"fields": {
            "request_id": request.scope.get("state", {}).get("request_id"), "path_template": _route(request)}})
        if not isinstance(exc, (SerializationError, RegistryError, ServiceUnavailableError)):
            message = f"internal error (request id {request.scope.get('state', {}).get('request_id')})"
    return FastJSONResponse(_body(type(exc).__name__, status, message), status_code=status, headers=headers)


def _route(request: Request) -> str:
    route = request.scope.get("route")
    return getattr(route, "path", "unmatched")


def _validation_handler(request: Request, exc: RequestValidationError) -> FastJSONResponse:
    problems = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        problems.append(f"{loc or 'body'}: {err.get('msg')}")
    message = "invalid request: " + "; ".join(problems)
    return FastJSONResponse(_body("RequestValidationError", 422, message,
                                  details=[{k: v for k, v in e.items() if k in ("loc", "msg", "type")}
                                           for e in exc.errors()]), status_code=422)


def _http_handler(request: Request, exc: StarletteHTTPException) -> FastJSONResponse:
    kind = {404: "NotFound", 405: "MethodNotAllowed"}.get(exc.status_code, "HTTPError")
    message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code == 404 and message == "Not Found":
        message = f"no route {request.method} {request.url.path}; see /docs"
    return FastJSONResponse(_body(kind, exc.status_code, message), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))


def install_error_handlers(app: FastAPI) -> None:
    """Register every handler on ``app``."""
    for cls, _ in STATUS_TABLE:
        app.add_exception_handler(cls, _domain_handler)
    for cls in (OSError, sqlite3.Error):  # storage errors: answered here (503), not re-raised by Starlette
        app.add_exception_handler(cls, _domain_handler)
    app.add_exception_handler(RequestValidationError, _validation_handler)
    app.add_exception_handler(StarletteHTTPException, _http_handler)
    app.add_exception_handler(Exception, _domain_handler)
