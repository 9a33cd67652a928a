"""Job use cases for every face: submit a background job (idempotently), list, follow, cancel.

A face turns a request into a job function ``fn(ctx)`` (``ctx.progress(stage, fraction)`` is a
:data:`service.progress.Progress` that also raises Cancelled) and calls :func:`submit`; the job
itself runs in :class:`service.jobs.JobManager`'s pool (HTTP answers 202 with the job record:
:mod:`service.api.job_routes`).
"""

from __future__ import annotations

import hashlib
from typing import Callable

from align.exceptions import InputError

from ..jobs import Job, JobContext, JobManager

__all__ = ["JOB_KINDS", "submit", "per_key_limit", "list_jobs", "cursor_key", "get_job", "cancel_job"]

#: every kind of job the service makes: the job routes' (service.api.job_routes checks theirs are here) and the
#: demo's; ``GET /v1/jobs?kind=`` takes these (another answered an empty 200, where an unknown state is a 422)
JOB_KINDS = ("fit", "steer-fit", "lm-steer-fit", "migration", "verify", "demo")


def submit(jobs: JobManager, fn: Callable[[JobContext], dict | None], *, kind: str, description: str,
           request: bytes, idempotency_key: str | None = None, owner: str | None = None,
           owner_limit: int | None = None, request_id: str | None = None) -> tuple[Job, bool]:
    """Queue ``fn`` as a job of ``kind``; ``(job, created)``. ``request_id``: the submitting request's (the job's
    log lines name it).

    ``request`` (the raw request body) is hashed: the same ``idempotency_key`` with the same body
    returns the first job (``created`` False), with another body it is an IdempotencyConflictError.
    ``owner`` (who submits: an API key's digest) may have ``owner_limit`` jobs waiting (:func:`per_key_limit`).
    """
    return jobs.submit(fn, kind=kind, description=description, idempotency_key=idempotency_key,
                       request_hash=hashlib.sha256(request).hexdigest(), owner=owner, owner_limit=owner_limit,
                       request_id=request_id)


def per_key_limit(setting: int | None, max_queued: int, writers: int) -> int | None:
    """The jobs one key may have waiting (``Settings.max_queued_jobs_per_key``): ``setting`` when given; unset,
    half of ``max_queued`` (at least 1) when ``writers`` (keys that can submit jobs) are two or more, else None (no
    bound of its own): a lone user (one key, or auth off, where every caller is one key) keeps the whole queue.

    >>> per_key_limit(None, 8, 3), per_key_limit(None, 8, 1), per_key_limit(None, 1, 2), per_key_limit(0, 8, 1)
    (4, None, 1, 0)
    """
    if setting is not None:
        return setting
    return max(1, max_queued // 2) if writers >= 2 else None


def list_jobs(jobs: JobManager, limit: int | None = None, after=None, *, newest: bool = False,
              states: tuple[str, ...] | None = None, kinds: tuple[str, ...] | None = None) -> tuple[list[dict], dict]:
    """Jobs this data dir knows (``to_dict`` records) and the count per state (every stored record).

    Without ``limit``: the newest ones the manager keeps in view (``keep_finished``, 1000). With ``limit``:
    the first ``limit`` jobs past ``after`` (a decoded cursor, :func:`cursor_key`; ``newest``: newest first, the jobs
    before it), so a walk of pages reaches every stored job; a key of another shape is an InputError. ``states`` /
    ``kinds``: only the jobs in one of those states / of one of those kinds (the counts still count every job).
    """
    if after is not None:
        after = _cursor_seq(after, newest)
    # each record read under the jobs' lock (as get_job's), the store's read before it, outside
    if limit is None:
        return jobs.records(jobs.list(states, kinds)), jobs.counts()
    return jobs.records(jobs.page(limit, after, newest=newest, states=states, kinds=kinds)), jobs.counts()


def cursor_key(record: dict, newest: bool) -> tuple:
    """A job's place in the list, as its cursor holds it: ``("seq", seq)``, with a third element ``"newest"`` under
    ``order=newest`` (the same place walks the other way under ``order=oldest``: the jobs after it, not before).
    ``seq`` is the order jobs were made in: unique, never changing, and never going back with the wall clock
    (``created_at`` did: a clock that had been ahead put the jobs made after it behind the old ones). The tag
    first: a release before it, rolled back to, refuses such a cursor (422) instead of reading it as a time."""
    return ("seq", record["seq"], "newest") if newest else ("seq", record["seq"])


def _cursor_seq(after, newest: bool) -> int:
    """The ``seq`` of a decoded cursor (:func:`cursor_key`). Made under the other order: an InputError saying which
    (it would walk the other way); made by a release that paged by ``(created_at, id)``, or of another shape: an
    InputError, not this list's."""
    made_newest = isinstance(after, tuple) and len(after) == 3 and after[2] == "newest"
    key = after[:2] if made_newest else after
    ours = (isinstance(key, tuple) and len(key) == 2 and key[0] == "seq" and isinstance(key[1], int)
            and not isinstance(key[1], bool) and 0 <= key[1] < 2**63)  # a larger one overflows SQLite's binding
    old = (isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], float) and isinstance(key[1], str))
    if newest != made_newest and (made_newest or ours):
        made, sent = ("newest", "oldest") if made_newest else ("oldest", "newest")
        raise InputError(f"cursor was made under order={made} and sent with order={sent}; send it with "
                         f"order={made}, or drop the cursor to start the order={sent} list again")
    if old:
        raise InputError("cursor was made by an earlier release, which paged jobs by their creation time; jobs are "
                         "now listed in the order they were made: drop the cursor to start the list again")
    if not ours:
        raise InputError("cursor does not belong to this list; send the `next` value of the previous page")
    return key[1]


def get_job(jobs: JobManager, job_id: str) -> dict:
    """One job's record; JobNotFoundError (404) when unknown."""
    return jobs.record(job_id)  # read under the jobs' lock: never a job half-way through its end


def cancel_job(jobs: JobManager, job_id: str) -> dict:
    """Ask a job to stop (queued: at once; running: at its next progress report); its record."""
    return jobs.records([jobs.cancel(job_id)])[0]  # under the jobs' lock: the job goes on reporting meanwhile
