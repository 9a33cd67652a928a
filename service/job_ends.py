"""How a job's record says it ended when it did not succeed: its error (cut to a bounded size), whether a retry may
succeed (its Idempotency-Key let go), and the records of a shutdown (see :mod:`service.jobs`)."""

from __future__ import annotations

from align.exceptions import Cancelled

from .errors import http_status, kind_of, retry_after_of
from .job_store import FIT_ADVICE, INTERRUPTED, Job, interrupted_in
from .registry.retry import may_have_committed
from .storage import is_storage_error, storage_message
from .urls import hide_endpoints

__all__ = ["KEPT", "MAX_ERROR_CHARS", "NOT_STARTED", "RELEASED", "SHUT_DOWN", "error_of", "failure", "interrupted",
           "retryable"]

SHUT_DOWN = {**INTERRUPTED, "message": "interrupted: the process serving this job shut down before it finished; "
                                      + FIT_ADVICE}
NOT_STARTED = {"type": "JobCancelled", "message": "cancelled before it started"}
MAX_ERROR_CHARS = 4000

#: what the error of a job that failed on a retryable error adds (its Idempotency-Key was let go)
RELEASED = " (a retry may succeed: its Idempotency-Key is free again, so submitting it again starts a new job)"
#: ... and that of one whose registration may have been committed before the registry went away (its key is kept)
KEPT = (" (the registry went away when the version may already have been registered: its Idempotency-Key is kept, "
        "so submitting it again cannot register it twice; once the registry is back, look for it (GET "
        "/v1/maps/NAME/versions or /v1/steers/NAME/versions, `vecbridge registry list` or `steer list`) and submit "
        "with a new key only if it is not there)")


def interrupted(job: Job) -> dict:
    """:data:`SHUT_DOWN`, naming the stage ``job`` was in and how far it had got (its stage becomes "interrupted",
    and the fraction it keeps was of a stage named nowhere else), with the advice for its kind."""
    return interrupted_in(job.state, job.stage, job.fraction, SHUT_DOWN, job.kind)


def retryable(exc: BaseException) -> bool:
    """Whether a job that failed with ``exc`` may succeed when submitted again as it was: a part unavailable for a
    while (the registry restarting or locked by a backup), a full queue; not a part missing for good, nor bad input."""
    return kind_of(exc) in ("unavailable", "busy") and retry_after_of(exc) is not None


def error_of(kind: str, exc: BaseException, default: str = "") -> dict:
    """A job's ``error``: the exception's message, cut to :data:`MAX_ERROR_CHARS` (it is stored and listed)."""
    msg = hide_endpoints(str(exc) or default)  # a client reads it: the log has the database's host and port
    if len(msg) > MAX_ERROR_CHARS:
        msg = f"{msg[:MAX_ERROR_CHARS]}… ({len(msg) - MAX_ERROR_CHARS} more characters)"
    return {"type": kind, "message": msg}


def failure(job: Job, exc: BaseException) -> tuple[str, dict, bool]:
    """``(state, error, release)`` of ``job`` ended by ``exc``: cancelled (asked for, or it raised Cancelled) or
    failed; ``release``: let its Idempotency-Key go, a retry may succeed."""
    if job.cancel_requested or isinstance(exc, Cancelled):
        return "cancelled", error_of("JobCancelled", exc, "cancelled"), False
    error = error_of(type(exc).__name__, exc)
    if http_status(exc) == 500 and is_storage_error(exc):  # a full or read-only data dir: the typed
        # 503 a submit gets then (the record said OperationalError in SQLite's raw words)
        return "failed", {"type": "StorageUnavailableError", "message": storage_message(exc)}, False
    if job.idempotency_key is not None and may_have_committed(exc):  # a resubmission: a duplicate
        return "failed", {**error, "message": error["message"] + KEPT}, False
    if job.idempotency_key is not None and retryable(exc):  # as Stripe: a failure a retry can fix keeps no key. The
        # registry down for a moment failed the job, and every resubmission with its key was answered that failed job,
        # for as long as the record was kept
        return "failed", {**error, "message": error["message"] + RELEASED}, True
    return "failed", error, False
