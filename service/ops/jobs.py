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

__all__ = ["submit", "per_key_limit", "list_jobs", "get_job", "cancel_job"]


def submit(jobs: JobManager, fn: Callable[[JobContext], dict | None], *, kind: str, description: str,
           request: bytes, idempotency_key: str | None = None, owner: str | None = None,
           owner_limit: int | None = None) -> tuple[Job, bool]:
    """Queue ``fn`` as a job of ``kind``; ``(job, created)``.

    ``request`` (the raw request body) is hashed: the same ``idempotency_key`` with the same body
    returns the first job (``created`` False), with another body it is an IdempotencyConflictError.
    ``owner`` (who submits: an API key's digest) may have ``owner_limit`` jobs waiting (:func:`per_key_limit`).
    """
    return jobs.submit(fn, kind=kind, description=description, idempotency_key=idempotency_key,
                       request_hash=hashlib.sha256(request).hexdigest(), owner=owner, owner_limit=owner_limit)


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
    the first ``limit`` jobs past ``after`` (a ``(created_at, id)`` key; ``newest``: newest first, the jobs before
    it), so a walk of pages reaches every stored job; a key of another shape is an InputError. ``states`` /
    ``kinds``: only the jobs in one of those states / of one of those kinds (the counts still count every job).
    """
    if after is not None:
        after = _cursor_key(after, newest)
    if limit is None:
        return [j.to_dict() for j in jobs.list(states, kinds)], jobs.counts()
    return [j.to_dict() for j in jobs.page(limit, after, newest=newest, states=states, kinds=kinds)], jobs.counts()


def _cursor_key(after, newest: bool) -> tuple[float, str]:
    """The ``(created_at, id)`` of a decoded cursor: ``(created_at, id)`` made under ``order=oldest``, with a third
    element ``"newest"`` under ``order=newest``. Made under the other order: an InputError saying which (it would walk
    the other way); of another shape: an InputError, not this list's."""
    made_newest = isinstance(after, tuple) and len(after) == 3 and after[2] == "newest"
    key = after[:2] if made_newest else after
    ours = (isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], str)
            and isinstance(key[0], (int, float)) and not isinstance(key[0], bool))
    if newest != made_newest and (made_newest or ours):
        made, sent = ("newest", "oldest") if made_newest else ("oldest", "newest")
        raise InputError(f"cursor was made under order={made} and sent with order={sent}; send it with "
                         f"order={made}, or drop the cursor to start the order={sent} list again")
    if not ours:
        raise InputError("cursor does not belong to this list; send the `next` value of the previous page")
    return float(key[0]), key[1]  # created_at is a REAL: an integer past 64 bits would overflow the SQLite binding


def get_job(jobs: JobManager, job_id: str) -> dict:
    """One job's record; JobNotFoundError (404) when unknown."""
    return jobs.get(job_id).to_dict()


def cancel_job(jobs: JobManager, job_id: str) -> dict:
    """Ask a job to stop (queued: at once; running: at its next progress report); its record."""
    return jobs.cancel(job_id).to_dict()
