"""Background jobs (fits, demo setup) with progress, cancellation, a bounded queue and idempotency.

A job is a function ``fn(ctx) -> dict`` run on a worker thread (numpy, FAISS and the encoders
release the GIL, so request handling keeps going). ``ctx.progress(stage, fraction)`` records
progress and raises :class:`JobCancelled` once a cancel was asked for, so any long loop that
reports progress is also a cancellation point; ``ctx.should_cancel()`` can be polled too.

States::

    queued ──> running ──> succeeded
      │           ├──────> failed
      └───────────┴──────> cancelled

``submit`` refuses with :class:`QueueFullError` when ``max_queued`` jobs already wait for a
worker (HTTP 429). An idempotency key maps to the job it first created: the same key with
the same request returns that job again; with a different request it is a conflict.

Jobs live in this process's memory (the registered versions they produce are durable; the
job records are not): a restart forgets finished jobs, and replicas do not share them.
"""

from __future__ import annotations

import threading
import time
import traceback
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from .logging import get_logger

__all__ = ["Job", "JobContext", "JobManager", "JobCancelled", "QueueFullError", "JobNotFoundError",
           "IdempotencyConflictError", "TERMINAL"]

TERMINAL = ("succeeded", "failed", "cancelled")
_log = get_logger("jobs")


class QueueFullError(Exception):
    """Too many jobs wait for a worker; retry later."""


class JobNotFoundError(LookupError):
    """No job with that id (finished jobs are forgotten on restart)."""


class IdempotencyConflictError(Exception):
    """The idempotency key was already used for a different request."""


class JobCancelled(Exception):
    """Raised inside a job when a cancel was requested."""


@dataclass
class Job:
    id: str
    kind: str
    description: str = ""
    state: str = "queued"
    stage: str = "queued"
    fraction: float = 0.0
    created_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    stage_seconds: dict[str, float] = field(default_factory=dict)
    result: dict | None = None
    error: dict | None = None
    idempotency_key: str | None = None
    request_hash: str | None = None
    cancel_requested: bool = False

    def to_dict(self) -> dict:
        now = time.time()
        return {
            "id": self.id, "kind": self.kind, "description": self.description, "state": self.state,
            "progress": {"stage": self.stage, "fraction": round(float(self.fraction), 4)},
            "timings": {
                "created_at": self.created_at, "started_at": self.started_at, "finished_at": self.finished_at,
                "queued_seconds": ((self.started_at or now) - self.created_at),
                "run_seconds": (((self.finished_at or now) - self.started_at) if self.started_at else None),
                "stages": dict(self.stage_seconds),
            },
            "result": self.result, "error": self.error, "cancel_requested": self.cancel_requested,
        }


class JobContext:
    """Handed to a job function: progress reporting and cancellation checks."""

    def __init__(self, job: Job, lock: threading.Lock) -> None:
        self._job = job
        self._lock = lock
        self._stage_started = time.time()

    @property
    def job_id(self) -> str:
        return self._job.id

    def should_cancel(self) -> bool:
        return self._job.cancel_requested

    def progress(self, stage: str, fraction: float | None = None) -> None:
        """Record ``stage`` and overall ``fraction`` in [0, 1]; raise JobCancelled when asked to stop."""
        with self._lock:
            now = time.time()
            if stage != self._job.stage:
                prev = self._job.stage
                self._job.stage_seconds[prev] = self._job.stage_seconds.get(prev, 0.0) + now - self._stage_started
                self._stage_started = now
                self._job.stage = stage
            if fraction is not None:
                self._job.fraction = min(1.0, max(0.0, float(fraction)))
        if self._job.cancel_requested:
            raise JobCancelled(f"job {self._job.id} cancelled during {stage}")

    def _close_stage(self) -> None:
        with self._lock:
            st = self._job.stage
            self._job.stage_seconds[st] = self._job.stage_seconds.get(st, 0.0) + time.time() - self._stage_started


class JobManager:
    """Runs jobs on ``workers`` threads; at most ``max_queued`` wait at a time."""

    def __init__(self, workers: int = 1, max_queued: int = 8, *, metrics=None, keep_finished: int = 1000) -> None:
        self.workers = max(1, int(workers))
        self.max_queued = max(0, int(max_queued))
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="vecbridge-job")
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._idem: dict[str, str] = {}
        self._lock = threading.Lock()
        self._metrics = metrics
        self._keep = keep_finished

    # --- queries ----------------------------------------------------------------------------
    def get(self, job_id: str) -> Job:
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            raise JobNotFoundError(f"job {job_id!r} not found (job records are kept in memory until restart)")
        return job

    def list(self) -> list[Job]:
        with self._lock:
            return list(self._jobs.values())

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in ("queued", "running", *TERMINAL)}
        for j in self.list():
            out[j.state] += 1
        return out

    # --- submit / cancel --------------------------------------------------------------------
    def submit(self, fn: Callable[[JobContext], dict | None], *, kind: str, description: str = "",
               idempotency_key: str | None = None, request_hash: str | None = None) -> tuple[Job, bool]:
        """Queue ``fn``; returns ``(job, created)`` — ``created`` is False for an idempotent replay."""
        with self._lock:
            if idempotency_key is not None and idempotency_key in self._idem:
                job = self._jobs.get(self._idem[idempotency_key])
                if job is not None:
                    if job.request_hash != request_hash:
                        raise IdempotencyConflictError(
                            f"Idempotency-Key {idempotency_key!r} was used for a different request (job {job.id})")
                    return job, False
            queued = sum(1 for j in self._jobs.values() if j.state == "queued")
            if queued >= self.max_queued:
                raise QueueFullError(
                    f"job queue is full ({queued} waiting, limit {self.max_queued}); retry after a job finishes")
            job = Job(id=uuid.uuid4().hex, kind=kind, description=description,
                      idempotency_key=idempotency_key, request_hash=request_hash)
            self._jobs[job.id] = job
            if idempotency_key is not None:
                self._idem[idempotency_key] = job.id
            self._trim()
        self._count("queued")
        self._pool.submit(self._run, job, fn)
        return job, True

    def cancel(self, job_id: str) -> Job:
        """Ask a job to stop: a queued job is cancelled at once, a running one at its next progress call."""
        job = self.get(job_id)
        with self._lock:
            if job.state in TERMINAL:
                return job
            job.cancel_requested = True
            if job.state == "queued":
                job.state = job.stage = "cancelled"
                job.finished_at = time.time()
                cancelled_now = True
            else:
                cancelled_now = False
        if cancelled_now:
            self._count("cancelled")
        return job

    def shutdown(self, wait: bool = False) -> None:
        for j in self.list():
            if j.state not in TERMINAL:
                j.cancel_requested = True
        self._pool.shutdown(wait=wait, cancel_futures=True)

    # --- internals --------------------------------------------------------------------------
    def _run(self, job: Job, fn) -> None:
        with self._lock:
            if job.state != "queued":  # cancelled while waiting
                return
            job.state = "running"
            job.stage = "starting"
            job.started_at = time.time()
        self._gauges()
        ctx = JobContext(job, self._lock)
        try:
            result = fn(ctx)
        except BaseException as exc:  # noqa: BLE001 - a job must never kill its worker
            ctx._close_stage()
            with self._lock:
                job.finished_at = time.time()
                if job.cancel_requested or isinstance(exc, JobCancelled):
                    job.state = "cancelled"
                    job.error = {"type": "JobCancelled", "message": str(exc) or "cancelled"}
                else:
                    job.state = "failed"
                    job.error = {"type": type(exc).__name__, "message": str(exc)}
            if job.state == "failed":
                _log.warning("job failed", extra={"fields": {
                    "job_id": job.id, "kind": job.kind, "error": job.error,
                    "trace": traceback.format_exc(limit=8)}})
            self._count(job.state)
            return
        ctx._close_stage()
        with self._lock:
            job.finished_at = time.time()
            job.state = "succeeded"
            job.stage = "done"
            job.fraction = 1.0
            job.result = result or {}
        _log.info("job succeeded", extra={"fields": {"job_id": job.id, "kind": job.kind,
                                                     "seconds": round(job.finished_at - job.started_at, 3)}})
        self._count("succeeded")

    def _trim(self) -> None:
        finished = [k for k, j in self._jobs.items() if j.state in TERMINAL]
        for k in finished[: max(0, len(finished) - self._keep)]:
            j = self._jobs.pop(k)
            if j.idempotency_key is not None:
                self._idem.pop(j.idempotency_key, None)

    def _count(self, state: str) -> None:
        if self._metrics is not None:
            self._metrics.jobs_total.labels(state).inc()
        self._gauges()

    def _gauges(self) -> None:
        if self._metrics is not None:
            c = self.counts()
            self._metrics.jobs_queued.set(c["queued"])
            self._metrics.jobs_running.set(c["running"])
