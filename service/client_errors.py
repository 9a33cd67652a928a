"""The errors of :mod:`service.client` (its docstring draws the tree): one class per HTTP status of an error
answer, built from the answer by :func:`error_from_response`; no answer, an answer that is not the API's, and
a job that did not succeed.

The client re-exports every name here; import them from ``service.client``.
"""

from __future__ import annotations

import math
import time
from email.utils import parsedate_to_datetime

import httpx

from align.exceptions import Cancelled, VecbridgeError

from .errors import HTTP_STATUS

__all__ = [
    "APIConnectionError", "APIError", "APITimeoutError", "AuthenticationError", "BadRequestError", "ClientClosedError",
    "ConflictError", "EventLoopError",
    "JobCancelledError", "JobError", "JobFailedError", "JobTimeoutError", "NotFoundError", "PayloadTooLargeError",
    "PermissionDeniedError", "PreconditionFailedError", "QueueFullError", "ServerError", "ServiceUnavailableError",
    "UnexpectedResponseError", "UnsupportedMediaTypeError", "ValidationError", "error_from_response", "redirected",
    "unexpected",
]


# --- errors -------------------------------------------------------------------------------------
def _rebuilt(cls: type, args: tuple, state: dict) -> BaseException:
    """An error ``cls`` with its ``args`` (the message as raised) and attributes, its ``__init__`` not run again."""
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err


class _Picklable:
    """Errors whose ``__init__`` takes other arguments than their ``args`` pickle whole (a
    ``ProcessPoolExecutor`` or ``multiprocessing`` worker sends what it raised to its parent by pickle):
    ``Exception``'s own pickling calls ``cls(*args)``, which fails in the parent and breaks the pool."""

    def __reduce__(self):
        return _rebuilt, (type(self), self.args, dict(self.__dict__))


class APIError(_Picklable, VecbridgeError):
    """An error answer of the API (``kind``: the kind of the status, as in ``service.errors``).

    Attributes
    ----------
    status : int
        The HTTP status.
    type : str
        The server's error kind (its exception class, e.g. ``DimensionMismatchError``).
    message : str
        The server's message: what went wrong and how to fix it.
    request_id : str or None
        ``X-Request-ID`` of the failed request (the server logs it).
    body : dict
        The decoded error body (``{"error": {...}}``), or ``{}`` when it was not JSON.
    details : list of dict
        The body's ``details``: a validation error's problems (``loc``, ``msg``, ``type``), else ``[]``.
    retry_after : float or None
        ``Retry-After`` seconds, when the answer had one (429).
    """

    def __init__(self, status: int, type: str, message: str, request_id: str | None, body: dict,
                 retry_after: float | None = None) -> None:
        self.status, self.type, self.message, self.request_id, self.body = status, type, message, request_id, body
        self.retry_after = retry_after
        rid = f" [request {request_id}]" if request_id else ""
        super().__init__(f"{status} {type}: {message}{rid}")

    @property
    def details(self) -> list[dict]:
        """The problems of a request that failed validation (``loc``, ``msg``, ``type`` each), ``[]`` otherwise."""
        err = self.body.get("error") if isinstance(self.body, dict) else None
        found = err.get("details") if isinstance(err, dict) else None
        return found if isinstance(found, list) else []


class BadRequestError(APIError):
    """400."""


class AuthenticationError(APIError):
    """401: no API key, or one the service does not know."""


class PermissionDeniedError(APIError):
    """403: the key lacks the scope (``read`` / ``write``) of the route."""


class NotFoundError(APIError):
    """404: unknown space, map, version, alias, index, job, steer or encoder."""


class ConflictError(APIError):
    """409: conflict with what is stored."""


class PreconditionFailedError(ConflictError):
    """412: an ``If-Match`` did not hold, nothing changed: an alias is not where the caller saw it (``expected=`` of
    :meth:`~service.client.Client.delete_alias`), or a version changed since its ETag was read (``etag=`` of
    :meth:`~service.client.Client.set_tag` / ``delete_tag``: another tag write came first). A :class:`ConflictError`,
    as the 409 of ``expected_version``."""


class PayloadTooLargeError(APIError):
    """413: body over ``max_body_bytes`` or more rows than ``max_batch``."""


class UnsupportedMediaTypeError(APIError):
    """415."""


class ValidationError(APIError):
    """422: invalid input (shape, dimension, NaN/Inf, empty, bad name or option).

    A request that failed validation has :attr:`type` ``InputError`` and its problems in :attr:`details`, on
    every route; services before that answered FastAPI's ``RequestValidationError`` on the routes taking a body
    model (spaces, aliases, tags, ...): both are this class, with ``details``. Branch on the class (or
    :attr:`status`), not on the type's text."""


class QueueFullError(APIError):
    """429: refused before any work, busy (the job queue or a key's share of it, the compute gate, plans running, the
    language model's queue); retry after :attr:`retry_after` seconds (the client does, up to ``max_retries``)."""


class ServerError(APIError):
    """5xx."""


class ServiceUnavailableError(ServerError):
    """503: a part the route needs (registry, language model) is not ready."""


class UnexpectedResponseError(APIError):
    """An answer the API does not give: not JSON where JSON was due (a proxy's or load balancer's page), a
    binary body without ``X-Shape`` or of another length than it says, a redirect (3xx: the client follows none,
    so nothing was done). :attr:`status` is the answer's."""

    kind = "internal"


class APIConnectionError(VecbridgeError, httpx.TransportError):
    """No answer: the connection was refused or reset, or the server went away mid-request.

    Also an ``httpx.TransportError`` (what this client raised before), with the original as ``__cause__``.
    ``idempotency_key``: the ``Idempotency-Key`` the request carried (a fit's, made by the client unless given),
    or None; sending the request again with it returns the job the lost request may have created.
    """

    kind = "unavailable"
    idempotency_key: str | None = None


class APITimeoutError(APIConnectionError):
    """No answer within the client's ``timeout`` (the server may still be working on the request)."""

    kind = "timeout"


class ClientClosedError(APIConnectionError):
    """A request on a client after its :meth:`~service.client.Client.close`: nothing sent, never retried (a closed
    client stays closed: open a new one)."""


class EventLoopError(VecbridgeError, RuntimeError):
    """An :class:`~service.client.AsyncClient` called from an event loop while the loop it serves still runs
    (another thread): its connections belong to that loop; open one AsyncClient inside each running loop. (Once
    that loop has stopped, as after ``asyncio.run``, the client opens new connections in the calling loop.)"""

    kind = "invalid"


_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequestError, 401: AuthenticationError, 403: PermissionDeniedError, 404: NotFoundError,
    409: ConflictError, 412: PreconditionFailedError, 413: PayloadTooLargeError, 415: UnsupportedMediaTypeError,
    422: ValidationError,
    429: QueueFullError, 503: ServiceUnavailableError,
}
_KIND_OF_STATUS = {status: kind for kind, status in reversed(HTTP_STATUS.items())} | {400: "invalid", 500: "internal"}
for _status, _cls in _BY_STATUS.items():  # each class's kind, as the service's one table says
    _cls.kind = _KIND_OF_STATUS[_status]


class JobError(_Picklable, VecbridgeError):
    """A job ended without success; :attr:`job` is its last record (``error`` says why)."""

    def __init__(self, job: dict) -> None:
        self.job = job
        err = job.get("error") or {}
        super().__init__(f"job {job.get('id')} {job.get('state')}: {err.get('type', '')} {err.get('message', '')}"
                         .rstrip())


class JobFailedError(JobError):
    """The job failed."""


class JobCancelledError(JobError, Cancelled):
    """The job was cancelled."""


class JobTimeoutError(JobError, TimeoutError):
    """:meth:`Client.wait` gave up: the job was still queued or running (it keeps going; :meth:`Client.cancel`
    stops it). :attr:`job` is its last record seen."""

    kind = "timeout"

    def __init__(self, job: dict, timeout: float) -> None:
        self.job = job
        VecbridgeError.__init__(self, f"job {job.get('id')} still {job.get('state')} after {timeout:g} s")


def error_from_response(r: httpx.Response) -> APIError:
    """The :class:`APIError` subclass for an error answer ``r`` (status >= 400)."""
    try:
        body = r.json()
    except ValueError:
        body = {}
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        err = {"type": "HTTPError", "message": r.text[:500] or r.reason_phrase}
    cls = _BY_STATUS.get(r.status_code) or (ServerError if r.status_code >= 500 else APIError)
    return cls(r.status_code, str(err.get("type", "HTTPError")), str(err.get("message", "")),
               r.headers.get("x-request-id"), body if isinstance(body, dict) else {},
               _retry_after(r.headers.get("retry-after")))


def _retry_after(value: str | None) -> float | None:
    """Seconds a ``Retry-After`` header asks for (delta-seconds or an HTTP date); None when absent or unreadable."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    return max(0.0, seconds) if math.isfinite(seconds) else None


def unexpected(r: httpx.Response, what: str) -> UnexpectedResponseError:
    """:class:`UnexpectedResponseError` for answer ``r`` holding ``what`` (its start quoted)."""
    head = r.text[:200] if r.content else ""
    return UnexpectedResponseError(r.status_code, "UnexpectedResponse",
                                   f"{r.request.method} {r.request.url.path}: {what} "
                                   f"(Content-Type {r.headers.get('content-type')!r}): {head!r}",
                                   r.headers.get("x-request-id"), {})


def redirected(r: httpx.Response) -> UnexpectedResponseError:
    """:class:`UnexpectedResponseError` for the redirect ``r`` (3xx), which the client does not follow: the service
    never answers one, so a front (http -> https, a moved host or path) sent it and nothing was done."""
    where = r.headers.get("location")
    try:  # a password in the Location stays out of the message
        where = repr(str(httpx.URL(where).copy_with(userinfo=b""))) if where else "no Location"
    except httpx.InvalidURL:
        where = "an invalid Location"
    return UnexpectedResponseError(r.status_code, "UnexpectedResponse",
                                   f"{r.request.method} {r.request.url.path}: redirected to {where}; not followed "
                                   f"and nothing was done: make base_url the address the service answers at",
                                   r.headers.get("x-request-id"), {})
