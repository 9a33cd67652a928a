"""The one error root of the service, and the two tables that read it.

Every error raised on purpose derives from :class:`align.exceptions.VecbridgeError` and carries a
``kind`` (see :data:`align.exceptions.KINDS`). The faces never list exception classes: HTTP reads
:data:`HTTP_STATUS`, the CLIs read :data:`EXIT_CODE`, both through :func:`kind_of`.

::

    VecbridgeError (align)                         kind
    ├── InputError, NotFittedError (align)         invalid
    ├── Cancelled (align)                          cancelled
    ├── NotFoundError (also LookupError)           not_found   registry refs, indexes, jobs, encoders
    ├── ConflictError                              conflict    stored state contradicts the request
    ├── PreconditionFailedError                    precondition  an If-Match / If-None-Match did not hold
    ├── AuthenticationError                        unauthenticated
    ├── PermissionDeniedError                      forbidden
    ├── PayloadTooLargeError                       too_large
    ├── UnsupportedMediaTypeError                  unsupported_media
    ├── RequestTimeoutError                        timeout     a request body stalled mid-way
    ├── BusyError                                  busy        a full queue: retry later
    ├── ServiceUnavailableError                           unavailable a part (registry, LM) is not ready
    │   ├── NotConfiguredError                     unavailable a part not configured or installed
    │   └── ServiceStoppingError                   unavailable the server stopped before the request ended
    └── IntegrityError-like, SerializationError    integrity / internal

Any other exception is ``internal`` (HTTP 500, exit 3), except an ``OSError`` (``io``: exit 2, and
HTTP 503 when it is a read-only or full data dir) and SQLite's "database is locked" past the busy timeout
(``unavailable``: 503, exit 75).

Exit 75 (sysexits' ``EX_TEMPFAIL``: what mail agents and job schedulers read as "temporary failure, retry") is a
failure a retry can fix: ``busy``, ``timeout``, and ``unavailable`` where HTTP would send ``Retry-After`` (its
``retry_after`` is not None). An ``unavailable`` that waits for its operator (:class:`NotConfiguredError`, a damaged
file, a role without the grants) is exit 2, as bad input is.
"""

from __future__ import annotations

import collections
import difflib
import signal
import sqlite3
from collections.abc import Iterator
from types import EllipsisType

from align.exceptions import Cancelled, VecbridgeError

__all__ = [
    "VecbridgeError", "Cancelled", "NotFoundError", "ConflictError", "PreconditionFailedError", "AuthenticationError",
    "PermissionDeniedError", "PayloadTooLargeError", "UnsupportedMediaTypeError", "RequestTimeoutError", "BusyError",
    "ServiceUnavailableError", "NotConfiguredError", "ServiceStoppingError",
    "HTTP_STATUS", "EXIT_CODE", "EX_TEMPFAIL", "SIGNAL_WORDS", "kind_of", "http_status", "exit_code", "retry_after_of",
    "exception_chain", "shown", "did_you_mean", "listed",
]


class NotFoundError(VecbridgeError, LookupError):
    """An unknown name, id or reference."""

    kind = "not_found"


class ConflictError(VecbridgeError):
    """The request contradicts stored state."""

    kind = "conflict"


class PreconditionFailedError(VecbridgeError):
    """A conditional request's precondition (``If-Match``, ``If-None-Match: *`` on a write) is false: the
    resource is not in the state the client saw, so nothing was changed (HTTP 412)."""

    kind = "precondition"


class AuthenticationError(VecbridgeError):
    """No credentials, or credentials that match no key."""

    kind = "unauthenticated"


class PermissionDeniedError(VecbridgeError):
    """A valid key without the scope the route needs."""

    kind = "forbidden"


class PayloadTooLargeError(VecbridgeError):
    """Request body or batch beyond the configured limits."""

    kind = "too_large"


class UnsupportedMediaTypeError(VecbridgeError):
    """A Content-Type the route does not read."""

    kind = "unsupported_media"


class RequestTimeoutError(VecbridgeError):
    """The client stopped sending its request body (no bytes for ``body_timeout_s``)."""

    kind = "timeout"


class BusyError(VecbridgeError):
    """Too much work queued: retry later."""

    kind = "busy"


class ServiceUnavailableError(VecbridgeError):
    """A needed part (registry, indexes, a language model) is not ready or not installed.

    ``retry_after``: the seconds the HTTP answer's ``Retry-After`` asks a client to wait before trying again (a
    part starting, a database busy); None where no retry can help (:class:`NotConfiguredError`)."""

    kind = "unavailable"
    retry_after: int | None = 5

    def __init__(self, *args, retry_after: int | None | EllipsisType = ...) -> None:
        """``retry_after``: this error's own, where it differs from its class's (a Ray worker lost: retry)."""
        super().__init__(*args)
        if retry_after is not ...:
            self.retry_after = retry_after


class NotConfiguredError(ServiceUnavailableError):
    """A part this service lacks until its operator acts: a setting (no vector database configured), a package
    that is not installed. HTTP 503 without ``Retry-After``: trying again cannot help, so clients do not."""

    retry_after = None


class ServiceStoppingError(ServiceUnavailableError):
    """The server is stopping (SIGTERM): HTTP 503 with ``Retry-After``. Either it cancelled a request still open
    ``shutdown_timeout_s`` after the signal (a stalled upload, a long plan), which may have been applied, so only an
    idempotent one may be sent again; or its job service refused a job submit, which started nothing (any record
    the submit wrote says the job was interrupted before it started, its Idempotency-Key let go), so it may be sent
    again as it was. Either way to another replica, or to this service once it is back."""


#: kind -> HTTP status (``io`` is decided by :func:`service.storage.is_storage_error`: 503 or 500).
HTTP_STATUS: dict[str, int] = {
    "invalid": 422, "not_found": 404, "conflict": 409, "precondition": 412, "unauthenticated": 401,
    "forbidden": 403, "too_large": 413, "unsupported_media": 415, "timeout": 408, "busy": 429, "unavailable": 503,
    "cancelled": 409, "integrity": 500, "internal": 500, "io": 500,
}

#: the exit code of a failure a retry can fix (sysexits.h: "temporary failure ... the user is invited to retry")
EX_TEMPFAIL = 75

#: kind -> process exit code of the CLIs: 2 for anything the user can act on, 75 for "retry later" (a full queue, a
#: timeout, a part not ready: see :func:`exit_code`), 130 when stopped on request (as for Ctrl-C), 3 for a bug.
#: A script could not tell a registry locked by a backup (retry in a minute) from bad input: both were 2.
EXIT_CODE: dict[str, int] = {**{k: 2 for k in HTTP_STATUS}, "cancelled": 130, "internal": 3,
                             "busy": EX_TEMPFAIL, "timeout": EX_TEMPFAIL, "unavailable": EX_TEMPFAIL}
EXIT_CODE["integrity"] = 2  # a broken artifact or registry: the message says which; not a bug of ours


#: the word a command a signal stopped says, beside its exit code 128 + the signal (Ctrl-C: "interrupted", 130)
SIGNAL_WORDS = {signal.SIGTERM: "terminated", signal.SIGHUP: "hung up"}


def kind_of(exc: BaseException) -> str:
    """The kind of any exception: ``exc.kind`` for ours, ``io`` for OS errors, ``unavailable`` for a SQLite
    database another process kept locked past the busy timeout (a backup, a long writer: retry later), else
    ``internal``."""
    if isinstance(exc, VecbridgeError):
        return exc.kind
    if isinstance(exc, KeyboardInterrupt):
        return "cancelled"
    if isinstance(exc, OSError):
        return "io"
    if isinstance(exc, sqlite3.OperationalError) and "database is locked" in str(exc):
        return "unavailable"
    return "internal"


def http_status(exc: BaseException) -> int:
    """The HTTP status for ``exc`` by :data:`HTTP_STATUS` (storage errors are refined by the API layer)."""
    return HTTP_STATUS[kind_of(exc)]


def retry_after_of(exc: BaseException) -> int | float | None:
    """The seconds HTTP's ``Retry-After`` asks a client to wait before sending ``exc``'s request again, None where the
    answer has no ``Retry-After``. ``busy``: 5. ``unavailable``: an error of ours says by its ``retry_after``, and one
    without it (a vector database's error) has none: no retry helps; SQLite's lock past the busy timeout: 5. Any
    other kind: None. The HTTP handler and :func:`exit_code` both read this, so exit 75 and ``Retry-After`` agree."""
    kind = kind_of(exc)
    if kind == "busy":
        return 5
    if kind == "unavailable":
        return getattr(exc, "retry_after", None) if isinstance(exc, VecbridgeError) else 5
    return None


def exit_code(exc: BaseException) -> int:
    """The CLI exit code for ``exc`` by :data:`EXIT_CODE`; a ``busy`` or ``unavailable`` error is 75 exactly when HTTP
    answers it with ``Retry-After`` (:func:`retry_after_of`): one without (a part not configured, a damaged file, a
    missing grant, a vector database refusing; no retry helps) is 2, so a scheduler does not retry it for ever.
    ``timeout`` is 75: HTTP's 408 itself says the request may be sent again."""
    kind = kind_of(exc)
    if kind in ("busy", "unavailable"):
        return EX_TEMPFAIL if retry_after_of(exc) is not None else 2
    return EXIT_CODE[kind]


def exception_chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc``, then its ``__cause__`` (else ``__context__``), and so on: each exception once. A chain can loop (grpc's
    ``_InactiveRpcError`` is its own ``__cause__``): the walk stops at the first exception it has already given, as
    :mod:`traceback` does. Walking ``exc = exc.__cause__ or exc.__context__`` by hand never ended on such a chain and
    held a request thread at 100% CPU; every walk of a chain goes through here."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def shown(text, limit: int = 40) -> str:
    """A name (or other text) from a request as an error message quotes it: its first ``limit`` characters, and its
    length when it is longer (an invalid index name of 10,000 characters was repeated whole: a 10 KB 422 answer)."""
    text = text if isinstance(text, str) else str(text)
    return f"{text[:limit]!r}" + (f"... ({len(text)} characters)" if len(text) > limit else "")


#: up to this many names, :func:`did_you_mean` is difflib's own loop; beyond, :func:`_closest` (the same answer)
_DIFFLIB_NAMES = 1000


def did_you_mean(name, known, *, cutoff: float = 0.75, show=shown) -> str:
    """``" (did you mean 'minilm-e5'?)"`` when one of ``known`` is close to ``name`` (difflib), else ``""``: the one
    suggestion of an unknown setting, map, steer, space, index or alias. ``show`` writes the suggestion (quoted and
    cut as :func:`shown`). Call it on the error only: ``known`` is read for it.

    Beyond :data:`_DIFFLIB_NAMES` names, :func:`_closest` gives difflib's answer without scoring every name
    (difflib over 100,000 names took about a second, inside a registry transaction for some callers)."""
    word, names = str(name), [str(k) for k in known]
    if len(names) > _DIFFLIB_NAMES:
        close = _closest(word, names, cutoff)
    else:
        close = difflib.get_close_matches(word, names, n=1, cutoff=cutoff)
    return f" (did you mean {show(close[0])}?)" if close else ""


def _closest(word: str, names: list[str], cutoff: float) -> list[str]:
    """``difflib.get_close_matches(word, names, n=1, cutoff=cutoff)``, the same answer: the name of the highest
    ratio at least ``cutoff``, ties to the greatest name. Each name's difflib upper bound (``quick_ratio``: the
    characters it shares with ``word``, counted as multisets) is computed at once in numpy over the names' code
    points, for the characters of ``word`` only; exact ratios are then computed best bound first, and stop once a
    bound falls below the best ratio found (no name left can reach it)."""
    import numpy as np

    lens = np.fromiter(map(len, names), dtype=np.int64, count=len(names))
    total = lens + len(word)
    # difflib's real_quick_ratio first (lengths alone): a 10,000-character word is compared with no name at all
    keep = np.flatnonzero(np.where(total > 0, 2.0 * np.minimum(lens, len(word)) / np.maximum(total, 1), 1.0) >= cutoff)
    names, lens, total = [names[i] for i in keep.tolist()], lens[keep], total[keep]
    codes = np.frombuffer("".join(names).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    owner = np.repeat(np.arange(len(names)), lens)
    shared = np.zeros(len(names), dtype=np.int64)
    for ch, n_word in collections.Counter(word).items():
        shared += np.minimum(np.bincount(owner[codes == ord(ch)], minlength=len(names)), n_word)
    bound = np.where(total > 0, 2.0 * shared / np.maximum(total, 1), 1.0)  # difflib's formula: the same floats
    order = np.flatnonzero(bound >= cutoff)
    order = order[np.argsort(-bound[order], kind="stable")]
    best: tuple[float, str] | None = None
    s = difflib.SequenceMatcher()
    s.set_seq2(word)
    for i in order.tolist():
        if best is not None and bound[i] < best[0]:
            break
        s.set_seq1(names[i])
        r = s.ratio()
        if r >= cutoff and (best is None or (r, names[i]) > best):
            best = (r, names[i])
    return [best[1]] if best is not None else []


def listed(names, limit: int = 10) -> str:
    """Names as a message lists them: quoted and cut (:func:`shown`), the first ``limit`` and how many in all."""
    names = list(names)
    head = ", ".join(shown(n) for n in names[:limit])
    return head + (f", ... ({len(names)} in all)" if len(names) > limit else "") if names else "none"
