"""Background jobs (fits, demo setup) with progress, cancellation, a bounded queue and idempotency.

A job is a function ``fn(ctx) -> dict`` run on a worker thread (numpy, FAISS and the encoders
release the GIL, so request handling keeps going). ``ctx.progress(stage, fraction)`` records
progress and raises :class:`align.exceptions.Cancelled` once a cancel was asked for, so any long loop that
reports progress is also a cancellation point; ``ctx.should_cancel()`` can be polled too.

States::

    queued ──> running ──> succeeded
      │           ├──────> failed
      └───────────┴──────> cancelled

``submit`` refuses with :class:`QueueFullError` when ``max_queued`` jobs already wait for a
worker (HTTP 429), or when the submitting ``owner`` (an API key) already has ``owner_limit`` of them waiting: one
key submitting back to back took every place and every other key got a 429 until they drained. An idempotency key
maps to the job it first created: the same key with the same request returns that job again; with a different
request it is a conflict.

Durability: with a :class:`~service.job_store.JobStore` (the service keeps one at ``data_dir/jobs.sqlite``) every
job record — state, progress, timings, result, error, idempotency key — is written at submit,
start, finish, cancel, and at most every ``JobStore.progress_interval`` seconds of progress.
Each process owns the rows it creates and holds an exclusive ``flock`` on
``jobs.owners/<owner>.lock`` for its lifetime; the kernel drops that lock when the process
dies, however it dies. At start-up (and when a foreign unfinished row is read) rows of owners
whose lock can be taken are marked ``failed`` with error ``Interrupted`` ("interrupted by
restart"): a killed process's jobs are reported, never silently lost. Processes sharing a data
dir (``uvicorn --workers N``) see each other's jobs and idempotency keys. Without a store,
records live in memory only (tests, library use).
"""

from __future__ import annotations

import itertools
import sqlite3
import threading
import traceback
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable
from concurrent.futures import wait as wait_futures
from dataclasses import replace

from align.exceptions import Cancelled

from .errors import BusyError, ConflictError, NotFoundError, ServiceStoppingError
from .job_context import JobContext
from .job_ends import NOT_STARTED, failure, interrupted
from .job_pool import JobPool, Stop
from .job_store import INTERRUPTED, TERMINAL, Job, JobStore, JobStoreBusyError
from .logging import get_logger
from .progress import run_waking

__all__ = [
    "INTERRUPTED",
    "TERMINAL",
    "Cancelled",
    "IdempotencyConflictError",
    "Job",
    "JobContext",
    "JobManager",
    "JobNotFoundError",
    "JobStore",
    "JobStoreBusyError",
    "QueueFullError",
]

#: seconds ``JobManager.shutdown(wait=True)`` waits for running jobs to stop, by default
SHUTDOWN_WAIT = 60.0
_log = get_logger("jobs")


class QueueFullError(BusyError):
    """Too many jobs wait for a worker; retry later."""


class JobNotFoundError(NotFoundError):
    """No job with that id (never submitted, or trimmed from the kept history)."""


class IdempotencyConflictError(ConflictError):
    """The idempotency key was already used for a different request."""


def _wanted(job: Job, states: tuple[str, ...] | None, kinds: tuple[str, ...] | None) -> bool:
    """Whether ``job`` passes a list's filters (None: any state / kind)."""
    return (states is None or job.state in states) and (kinds is None or job.kind in kinds)


class JobManager:
    """Runs jobs on ``workers`` threads; at most ``max_queued`` wait at a time.

    With ``store`` (a :class:`JobStore`) records outlive the process; call :meth:`open` once the
    process runs (after any fork) to claim an owner and fail the jobs of dead owners.
    """

    def __init__(self, workers: int = 1, max_queued: int = 8, *, metrics=None, keep_finished: int = 1000,
                 store: JobStore | None = None, stop: Stop | None = None) -> None:
        self.workers = max(1, int(workers))
        self.max_queued = max(0, int(max_queued))
        # daemon threads: a job deaf to the stop does not hold the exit; ``stop``: its server's (none: library use)
        self._pool = JobPool(self.workers, stop=stop)
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._idem: dict[str, str] = {}
        self._lock = threading.Lock()
        self._metrics = metrics
        self._keep = keep_finished
        self.store = store
        self._writing = threading.Lock()  # one record write at a time (see _persist)
        self._unsaved: dict[str, Job] = {}  # finished jobs whose final record is still to be written
        self._joining = 0  # submits past the queue check whose job is not in _jobs yet (their store insert runs)
        self._owners: dict[str, str] = {}  # job id -> who submitted it (submit's owner), for the per-owner bound
        self._requests: dict[str, str] = {}  # job id -> the id of the request that submitted it (its log lines)
        self._joining_by: Counter[str] = Counter()  # _joining, per owner
        self._seq = itertools.count(1)  # the order of this process's jobs without a store (Job.seq)
        self._wakes: dict[str, threading.Event] = {}  # running job id -> its context's wake (set on a cancel)
        self._futures: dict = {}  # the pool's futures not done yet -> job id: what shutdown(wait=True) waits for
        self._stopped_in: dict[str, str] = {}  # job id -> the stage a shutdown recorded it interrupted in
        self._closed = False  # shut down: no more jobs

    def open(self) -> int:
        """Claim this process's owner lock, fail the unfinished jobs of dead processes, trim old records.

        Returns the number of jobs marked failed (0 without a store).
        """
        if self.store is None:
            return 0
        self.store.claim_owner()
        n = self.store.recover()
        self.store.trim()
        return n

    # --- queries ----------------------------------------------------------------------------
    def get(self, job_id: str, *, adopt: bool = True) -> Job:
        """The job: this process's live record, else the stored one (another process's, or an earlier run's).

        A queued job of this process is checked against the store (another process may have cancelled it) unless
        ``adopt`` is False (a caller on the event loop that must not wait for the store's lock)."""
        with self._lock:
            job = self._jobs.get(job_id)
        if adopt and job is not None and job.state == "queued":
            self._adopt_cancels([job])
        if job is None and self.store is not None:
            got = self.store.get(job_id)
            if got is not None:
                job, owner = got
                if job.state not in TERMINAL and self.store.recover([owner]):
                    job, _ = self.store.get(job_id)
        if job is None:
            shown = job_id if len(job_id) <= 80 else f"{job_id[:40]}… ({len(job_id)} characters)"
            raise JobNotFoundError(f"job {shown!r} not found")  # quoted whole, a 60 KB id made a 60 KB answer
        return job

    def record(self, job_id: str) -> dict:
        """:meth:`get`'s job as a dict, read under the lock its ends are written under: a live job read while it
        ended (its state written, its error not yet) said "failed" with no error."""
        return self.records([self.get(job_id)])[0]

    def records(self, jobs: list[Job]) -> list[dict]:
        """``jobs`` as dicts, each read under the lock its progress and end are written under (taken per job: a
        report waits for one record, never for a whole list): a live job read while it reported gave its new stage
        with the last one's fraction."""
        out = []
        for job in jobs:
            with self._lock:
                out.append(job.to_dict())
        return out

    def list(self, states: tuple[str, ...] | None = None, kinds: tuple[str, ...] | None = None) -> list[Job]:
        """Known jobs, oldest first: stored records (all processes of the data dir) or this process's; only those
        in one of ``states`` / of one of ``kinds`` when given."""
        self._adopt_cancels()
        with self._lock:
            mine = dict(self._jobs)
        if self.store is None:
            return [j for j in mine.values() if _wanted(j, states, kinds)]
        out = [mine.pop(j.id, j) for j in self.store.list(self._keep, states=states, kinds=kinds)]
        return [j for j in out + list(mine.values()) if _wanted(j, states, kinds)]

    def page(self, limit: int, after: int | None = None, *, newest: bool = False,
             states: tuple[str, ...] | None = None, kinds: tuple[str, ...] | None = None) -> list[Job]:
        """The first ``limit`` jobs past the ``seq`` ``after`` in the order they were made (``newest``: the reverse
        order, the first ``limit`` before ``after``): unlike :meth:`list` (the newest ``keep_finished``), successive
        pages reach every stored record. Filtered as :meth:`list`."""
        self._adopt_cancels()
        with self._lock:
            mine = dict(self._jobs)
        if self.store is None:
            jobs = sorted(mine.values(), key=lambda j: j.seq, reverse=newest)
            return [j for j in jobs if _wanted(j, states, kinds) and (
                after is None or (j.seq < after if newest else j.seq > after))][:limit]
        if after is None and not newest:
            after = 0  # the store's seq starts at 1
        # this process's record of a job is newer than the stored one (its state the same but for a moment; for
        # good when its final write failed): one that no longer matches leaves a gap, refilled from the rows past
        # the batch, so a page never ends early
        out: list[Job] = []
        while True:
            batch = self.store.list(limit, after, newest=newest, states=states, kinds=kinds)
            out += [j for j in (mine.get(s.id, s) for s in batch) if _wanted(j, states, kinds)]
            if len(out) >= limit or len(batch) < limit:
                return out[:limit]
            after = batch[-1].seq

    def counts(self) -> dict[str, int]:
        """Jobs by state, as :meth:`list` sees them: the durable store's records (every process of the
        data dir), else this process's jobs."""
        out = {s: 0 for s in ("queued", "running", *TERMINAL)}
        if self.store is not None:
            try:
                for state, n in self.store.counts().items():
                    out[state] = out.get(state, 0) + n
                return out
            except (sqlite3.Error, JobStoreBusyError) as exc:  # the store is unreadable: say what this process knows
                _log.warning("job counts from this process only", extra={"fields": {"error": repr(exc)}})
        return {**out, **self.local_counts()}

    def local_counts(self) -> dict[str, int]:
        """Jobs of this process by state (the queue gauges of this process's metrics)."""
        out = {s: 0 for s in ("queued", "running", *TERMINAL)}
        with self._lock:
            jobs = list(self._jobs.values())
        for j in jobs:
            out[j.state] += 1
        return out

    # --- submit / cancel --------------------------------------------------------------------
    def check_room(self, idempotency_key: str | None = None, owner: str | None = None,
                   owner_limit: int | None = None) -> None:
        """QueueFullError when a :meth:`submit` made now would be refused for a full queue, or for ``owner``'s full
        share of it (``owner_limit``, as :meth:`submit` takes them), whatever its request: the queue or the share is
        full and ``idempotency_key`` names no job (of this process, or in the store: a retry gets its job, full queue
        or not). A face asks before it reads and parses a request (a fit's body can be 55 MB of vectors), so that one
        to be refused is refused first; a submit after it may still be refused (the queue filled meanwhile). May
        read the store: not on an event loop."""
        with self._lock:
            full, _, free = self._room()
            full = full or self._owner_full(owner, owner_limit, free)[0]
        if not full:
            return
        self._adopt_cancels()  # as submit does: a job another process cancelled holds no place
        with self._lock:
            full, queued, free = self._room()
            owner_full, mine = (False, 0) if full else self._owner_full(owner, owner_limit, free)
            known = idempotency_key in self._idem and self._idem[idempotency_key] in self._jobs
        if not (full or owner_full) or known or (idempotency_key is not None and self.store is not None
                                                 and self.store.by_key(idempotency_key) is not None):
            return
        raise QueueFullError(self._owner_message(mine, free, owner_limit) if owner_full
                             else self._full_message(queued, free))

    def _owner_full(self, owner: str | None, owner_limit: int | None, free: int) -> tuple[bool, int]:
        """``(full, waiting)``: whether one more job of ``owner`` would be past its ``owner_limit`` (None: no bound),
        and its jobs waiting (queued, and submits past the check), counted as :meth:`_room` counts. Under the lock."""
        if owner is None or owner_limit is None:
            return False, 0
        mine = self._joining_by[owner] + sum(1 for j in self._jobs.values()
                                             if j.state == "queued" and self._owners.get(j.id) == owner)
        return mine + 1 - free > owner_limit, mine

    def _room(self) -> tuple[bool, int, int]:
        """``(full, queued, free)`` for one more job: queued jobs (and submits past the check), free workers. Under
        the lock. A job that a free worker takes at once does not wait: only the jobs beyond the free workers count
        against max_queued (before, max_queued=0 refused every job, even with every worker idle: each fit a 429
        "retry after a job finishes" for ever, and the demo's submit failed the start-up)."""
        states = Counter(j.state for j in self._jobs.values())
        queued = states["queued"] + self._joining
        free = max(0, self.workers - states["running"])
        return queued + 1 - free > self.max_queued, queued, free

    def _full_message(self, queued: int, free: int) -> str:
        return (f"job queue is full ({max(0, queued - free)} waiting, limit {self.max_queued}); "
                "retry after a job finishes")

    @staticmethod
    def _owner_message(mine: int, free: int, owner_limit: int | None) -> str:
        return (f"job queue is full for this API key ({max(0, mine - free)} of its jobs waiting, per-key limit "
                f"{owner_limit}: max_queued_jobs_per_key); other keys can still queue jobs; retry after one of "
                "its jobs finishes")

    def submit(self, fn: Callable[[JobContext], dict | None], *, kind: str, description: str = "",
               idempotency_key: str | None = None, request_hash: str | None = None, owner: str | None = None,
               owner_limit: int | None = None, request_id: str | None = None) -> tuple[Job, bool]:
        """Queue ``fn``; returns ``(job, created)`` — ``created`` is False for an idempotent replay. ``request_id``:
        the submitting request's, named by the job's log lines with its ``description``.

        ``owner`` (an opaque id of who submits, e.g. a digest of the API key) may have at most ``owner_limit`` jobs
        waiting, counted as ``max_queued`` counts (a job a free worker takes at once does not wait); None: no bound
        of its own. A replay of an idempotency key is answered its job whatever the bounds."""
        self._adopt_cancels()  # a job another process cancelled does not hold a place in the queue
        with self._lock:
            self._refuse_if_closed()
            if idempotency_key is not None and idempotency_key in self._idem:
                job = self._jobs.get(self._idem[idempotency_key])
                if job is not None:
                    if job.request_hash != request_hash:
                        raise IdempotencyConflictError(
                            f"Idempotency-Key {idempotency_key!r} was used for a different request (job {job.id})")
                    return job, False
            # the slot is held from this check until the job is in _jobs: the store's insert runs outside the lock,
            # and without the hold, submits arriving together all passed the check on the same empty queue
            full, queued, free = self._room()
            owner_full, mine = (False, 0) if full else self._owner_full(owner, owner_limit, free)
            full = full or owner_full
            if not full:
                self._joining += 1
                if owner is not None:
                    self._joining_by[owner] += 1
                job = Job(id=uuid.uuid4().hex, kind=kind, description=description, seq=next(self._seq),
                          idempotency_key=idempotency_key, request_hash=request_hash)  # a store numbers it anew
        if full:
            # a retry whose key created a job of another process (a sibling worker, or before a restart) is answered
            # that job (or its conflict) as when the queue has room; before, it was a 429 until the queue emptied
            first = None if idempotency_key is None or self.store is None else self.store.by_key(idempotency_key)
            if self._let_go_here(first):
                first = None
            if first is None and owner_full:
                raise QueueFullError(self._owner_message(mine, free, owner_limit))
            if first is None:
                raise QueueFullError(self._full_message(queued, free))
            if first.request_hash != request_hash:
                raise IdempotencyConflictError(
                    f"Idempotency-Key {idempotency_key!r} was used for a different request (job {first.id})")
            return self.get(first.id), False
        try:  # durable before it is acknowledged; the store settles key races
            first = self.store.insert(job) if self.store is not None else None
            if self._let_go_here(first):
                first = self.store.insert(job)
        except BaseException:
            with self._lock:
                self._left_joining(owner)
            raise
        with self._lock:
            self._left_joining(owner)
            closed = self._closed and first is None
            if first is None and not closed:
                self._jobs[job.id] = job
                if owner is not None:
                    self._owners[job.id] = owner
                if request_id is not None:
                    self._requests[job.id] = request_id
                if idempotency_key is not None:
                    self._idem[idempotency_key] = job.id
                self._trim()
                # under the lock: a shutdown sees the job and its future, or this submit sees the shutdown
                future = self._pool.submit(self._run, job, fn)
                self._futures[future] = job.id
                future.add_done_callback(lambda f: self._futures.pop(f, None))
            elif first is not None and first.request_hash == request_hash:
                return self._jobs.get(first.id, first), False
        if closed:  # a shutdown came while its record was written: it never runs (before, the pool refused it with a
            # RuntimeError and the store kept it "queued" until a restart: a phantom in /v1/jobs)
            self._end_refused(job)
            self._refuse_if_closed()
        if first is not None:
            raise IdempotencyConflictError(
                f"Idempotency-Key {idempotency_key!r} was used for a different request (job {first.id})")
        self._count("queued")
        return job, True

    def _let_go_here(self, stored: Job | None) -> bool:
        """Whether ``stored`` (the store's job of a key) is this process's job that let its key go before its end
        was written; it is written now. A resubmission in that gap got the failed job its message called free."""
        if stored is None:
            return False
        with self._lock:
            live = self._jobs.get(stored.id)
        if live is None or live.idempotency_key is not None:
            return False
        self._persist(live)
        return True

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise ServiceStoppingError("the job service is shutting down and takes no more jobs; submit it again "
                                       "once the service is back (to another replica meanwhile)")

    def _end_refused(self, job: Job) -> None:
        """Record a job refused after its record was written (a shutdown came meanwhile) interrupted before it
        started, as the shutdown records its queued jobs, unless another process ended it first (a cancel). Its
        record was deleted: a sibling process (``--workers N``) that had already answered its id to a same-key retry
        then answered 404 for it, a job its client was told was queued; every id handed out has an outcome now. Its
        Idempotency-Key is let go, as the deletion did: the refusal says to submit again, and a resubmission with the
        key starts a new job (not a replay of this one)."""
        with self._lock:
            self._interrupt(job)
            job.idempotency_key = None
        self._persist(job, was="queued")
        self._count(job.state)  # it ended here, never counted queued (submit's count comes after)

    def cancel(self, job_id: str) -> Job:
        """Ask a job to stop: a queued job is cancelled at once, a running one at its next progress call.

        Another process's job is cancelled through the store: a queued one at once (its owner adopts the record
        and never starts it), a running one at its next write, when its owner sees the request.
        """
        with self._lock:
            mine = job_id in self._jobs
        if not mine:
            job = self.get(job_id)
            if self.store is not None and job.state not in TERMINAL:
                # before, a queued job stayed "queued" (a 202) until its owner's worker reached it: behind a long fit,
                # for hours, holding a place in that process's queue
                if not (job.state == "queued" and self.store.cancel_queued(job_id, NOT_STARTED)):
                    self.store.request_cancel(job_id)
                job = self.get(job_id)
            return job
        job = self.get(job_id)
        with self._lock:
            if job.state in TERMINAL:
                return job
            job.cancel_requested = True
            self._wake(job)
            if job.state == "queued":
                job.state = job.stage = "cancelled"
                job.finished_at = job.now()
                job.error = dict(NOT_STARTED)
                cancelled_now = True
            else:
                cancelled_now = False
        if cancelled_now:
            self._persist(job)
            self._count("cancelled")
        elif self.store is not None:  # running: the flag alone. The whole record read here, written after the job's
            try:  # own final write, left the store "running" for ever (other workers, counts, recovery believed it)
                self.store.request_cancel(job.id)
            except Exception as exc:  # noqa: BLE001 - the job stops all the same: it reads its flag in memory
                _log.warning("job cancel not written", extra={"fields": {"job_id": job.id, "error": repr(exc)}})
        return job

    def shutdown(self, wait: bool = False, timeout: float | None = SHUTDOWN_WAIT) -> None:
        """Stop taking jobs (a submit is refused with ServiceStoppingError, a 503) and record this process's
        unfinished jobs interrupted now, as the process may be gone before their next progress report, their error
        naming the stage they were in; a queued one never starts. That is no cancel: ``cancel_requested`` stays as a
        client left it (``wait=True`` set it, and the record said a cancel nobody had asked for). A running job
        stops at its next report, which keeps that record; one that ends otherwise first (it succeeds, or fails on
        its own error) writes its own end over it: the truth, while the process lives to write it.

        ``wait=True`` then waits for the running jobs to end, at most ``timeout`` seconds (None: until they end); one
        still running then (its work reports no progress) is logged and left to end on its own.

        Either way, last, the final records whose write failed (the store locked or its disk full) are written
        again: only another job's write retried them, and with none to come the store said "running" and the next
        start "interrupted by restart" for a job that had ended (succeeded)."""
        with self._lock:
            self._closed = True
            jobs = [j for j in self._jobs.values() if j.state not in TERMINAL]
            for j in jobs:
                self._wake(j)
                self._interrupt(j)
        self._pool.shutdown(wait=False, cancel_futures=True)  # the queued ones' futures never run (nor end: not waited)
        futures = dict(self._futures)
        for j in jobs:
            self._persist(j)
            if j.started_at is None:  # it never runs: counted once, here
                self._count(j.state)
        self._gauges()  # queued / running now: the jobs ended here were still counted there
        if wait:
            pending = wait_futures(futures, timeout).not_done
            if pending:
                _log.warning("jobs still running at shutdown recorded interrupted", extra={"fields": {
                    "jobs": sorted(futures[f] for f in pending), "waited_seconds": timeout}})
            else:
                self._pool.shutdown(wait=True)
        if self.store is not None:
            with self._writing:
                self._retry_unsaved()
            if self._unsaved:
                _log.warning("job records not written at shutdown", extra={"fields": {"jobs": sorted(self._unsaved)}})

    def _interrupt(self, job: Job) -> None:
        """Record ``job`` interrupted by this process's shutdown (no cancel: see :meth:`shutdown`). Under the lock."""
        job.error = interrupted(job)
        if job.started_at is not None:  # its own stage, should it end on its own after all
            self._stopped_in[job.id] = job.stage
        job.state, job.stage, job.finished_at = "failed", "interrupted", job.now()

    # --- internals --------------------------------------------------------------------------
    def _run(self, job: Job, fn) -> None:
        with self._lock:
            if job.state != "queued":  # cancelled while waiting
                return
            job.state = "running"
            job.stage = "starting"
            job.started_at = job.now()
        self._persist(job, was="queued")  # not over the record of a cancel another process made while it waited
        if job.cancel_requested:  # asked through another process while the job waited
            final = self._final_record(job)
            with self._lock:
                if final is not None:  # that process's record (cancelled at once): this one answers the same
                    job.state, job.stage, job.finished_at, job.error = (final.state, final.stage, final.finished_at,
                                                                        final.error)
                else:
                    job.state = job.stage = "cancelled"
                    job.finished_at, job.error = job.now(), dict(NOT_STARTED)
                job.started_at = None
            if final is None:
                self._persist(job)
            self._count(job.state)
            return
        self._gauges()
        ctx = JobContext(job, self._lock, self._persist if self.store is not None else None,
                         self.store.progress_interval if self.store is not None else 0.5)
        self._wakes[job.id] = ctx.wake
        if job.cancel_requested:  # asked between the start and here: no _wake found it
            ctx.wake.set()
        try:
            result = run_waking(ctx.wake, lambda: fn(ctx))  # a registry wait (pause) wakes on a cancel at once
        except BaseException as exc:  # noqa: BLE001 - a job must never kill its worker
            self._wakes.pop(job.id, None)
            if not self._end(job, ctx, exc):
                self._persist(job)  # again: a progress write of this thread may have landed after the shutdown's
                self._count(job.state)
                return
            self._persist(job)
            if job.state == "failed":
                _log.warning("job failed", extra={"fields": {  # which map or steer, asked by which request: the
                    "job_id": job.id, "kind": job.kind, "what": job.description,  # line named neither
                    "request_id": self._requests.get(job.id), "error": job.error,
                    "exception": f"{type(exc).__name__}: {exc}",  # whole: the error a client reads hides endpoints
                    "trace": "".join(traceback.format_tb(exc.__traceback__, limit=8))}})
            self._count(job.state)
            return
        self._wakes.pop(job.id, None)
        self._end(job, ctx, None, result)
        self._persist(job)
        _log.info("job succeeded", extra={"fields": {"job_id": job.id, "kind": job.kind, "what": job.description,
                                                     "request_id": self._requests.get(job.id),
                                                     "seconds": round(job.finished_at - job.started_at, 3)}})
        self._count("succeeded")

    def _end(self, job: Job, ctx: JobContext, exc: BaseException | None, result: dict | None = None) -> bool:
        """Record how ``job`` ended (``exc``; None: it returned ``result``), the decision and the record in one hold
        of the lock; whether it wrote its end: not when a shutdown recorded it interrupted and it stopped at that
        (Cancelled, no cancel asked). A real end replaces that provisional record, the stage the shutdown took given
        back: before, a job that then failed on its own error still read "interrupted" without its error, and one
        that succeeded kept the interruption's error beside its result. (The stage given back and the error cleared
        in one hold, the end written in the next, a reader in between read "failed" with no error.)"""
        with self._lock:
            stage = self._stopped_in.pop(job.id, None)
            if stage is not None:
                if isinstance(exc, Cancelled) and not job.cancel_requested:
                    return False
                job.stage, job.error = stage, None
            ctx._close_stage()
            job.finished_at = job.now()
            if exc is None:
                job.state, job.stage, job.fraction, job.result = "succeeded", "done", 1.0, result or {}
                return True
            job.state, job.error, release = failure(job, exc)
            if release:
                self._idem.pop(job.idempotency_key, None)
                job.idempotency_key = None
        return True

    def _adopt_cancels(self, jobs: list[Job] | None = None) -> None:
        """Jobs of this process still queued here (``jobs``, else all) whose stored record another process made
        final (:meth:`JobStore.cancel_queued`): take that record, so this process answers it and never starts them."""
        if self.store is None:
            return
        with self._lock:
            queued = [j for j in (self._jobs.values() if jobs is None else jobs) if j.state == "queued"]
        if not queued:
            return
        ended = self.store.ended([j.id for j in queued])
        for job in queued:
            rec = ended.get(job.id)
            with self._lock:
                if rec is None or job.state != "queued":
                    continue
                job.state, job.stage, job.finished_at, job.error = rec.state, rec.stage, rec.finished_at, rec.error
                job.cancel_requested = True
            self._count(job.state)

    def _final_record(self, job: Job) -> Job | None:
        """The job's stored record if it is final, else None (also when the store cannot be read now)."""
        if self.store is None:
            return None
        try:
            return self.store.ended([job.id]).get(job.id)
        except Exception as exc:  # noqa: BLE001 - the caller writes its own record instead
            _log.warning("job record not read", extra={"fields": {"job_id": job.id, "error": repr(exc)}})
            return None

    def _persist(self, job: Job, was: str | None = None) -> None:
        """Write the record (no-op without a store); a failed write is logged, the job goes on. A final record
        that could not be written (the store locked or its disk full) is written again by the next write of
        any job of this process, else the store would say "running" for ever to every other process.

        Writes go one at a time, each copying the job when its turn comes: two threads' writes of one job (a progress
        report, a shutdown's record) land in the order of what they copied, the last one the job's latest."""
        if self.store is None:
            return
        with self._writing:
            self._retry_unsaved(but=job)
            if self._save(job, was):
                self._unsaved.pop(job.id, None)
            elif job.state in TERMINAL:
                self._unsaved[job.id] = job

    def _retry_unsaved(self, but: Job | None = None) -> None:
        """Write again the final records whose write failed (all but ``but``'s); the caller holds ``_writing``."""
        for late in list(self._unsaved.values()):
            if late is not but and self._save(late):
                self._unsaved.pop(late.id, None)

    def _save(self, job: Job, was: str | None = None) -> bool:
        with self._lock:  # a whole record: no field of one moment beside another of the next
            record = replace(job, stage_seconds=dict(job.stage_seconds))
        try:
            if self.store.save(record, was=was):
                job.cancel_requested = True  # asked through another process
                self._wake(job)
            return True
        except Exception as exc:  # noqa: BLE001 - a job record write must not kill the job
            _log.warning("job record not written", extra={"fields": {"job_id": job.id, "error": repr(exc)}})
            return False

    def _wake(self, job: Job) -> None:
        """Wake ``job``'s waits (:func:`service.progress.pause`) if it runs here: it is to stop."""
        if (event := self._wakes.get(job.id)) is not None:
            event.set()

    def _left_joining(self, owner: str | None) -> None:
        self._joining -= 1
        if owner is not None:
            self._joining_by[owner] -= 1
            if self._joining_by[owner] <= 0:
                del self._joining_by[owner]

    def _trim(self) -> None:
        finished = [k for k, j in self._jobs.items() if j.state in TERMINAL]
        for k in finished[: max(0, len(finished) - self._keep)]:
            j = self._jobs.pop(k)
            self._owners.pop(k, None)
            self._requests.pop(k, None)
            if j.idempotency_key is not None:
                self._idem.pop(j.idempotency_key, None)

    def _count(self, state: str) -> None:
        if self._metrics is not None:
            self._metrics.jobs_total.labels(state).inc()
        self._gauges()

    def _gauges(self) -> None:
        if self._metrics is not None:
            c = self.local_counts()
            self._metrics.jobs_queued.set(c["queued"])
            self._metrics.jobs_running.set(c["running"])
