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
worker (HTTP 429). An idempotency key maps to the job it first created: the same key with
the same request returns that job again; with a different request it is a conflict.

Durability: with a :class:`JobStore` (the service keeps one at ``data_dir/jobs.sqlite``) every
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

import json
import os
import sqlite3
import threading
import time
import traceback
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from align.exceptions import Cancelled

from .errors import BusyError, ConflictError, NotFoundError
from .logging import get_logger

__all__ = ["Job", "JobContext", "JobManager", "JobStore", "Cancelled", "QueueFullError", "JobNotFoundError",
           "IdempotencyConflictError", "JobStoreBusyError", "TERMINAL", "INTERRUPTED"]

TERMINAL = ("succeeded", "failed", "cancelled")
INTERRUPTED = {"type": "Interrupted",
               "message": "interrupted by restart: the process running this job stopped (killed, crashed or shut "
                          "down) before the job finished; a fit may still have registered its version, check the "
                          "map's versions before resubmitting"}
_SHUT_DOWN = {**INTERRUPTED, "message": "interrupted: the process serving this job shut down before it finished; "
                                       "check the map's versions before resubmitting"}
_log = get_logger("jobs")


class QueueFullError(BusyError):
    """Too many jobs wait for a worker; retry later."""


class JobStoreBusyError(BusyError):
    """The job store stayed locked by another connection (a sibling process, a backup) past its busy timeout."""


class JobNotFoundError(NotFoundError):
    """No job with that id (never submitted, or trimmed from the kept history)."""


class IdempotencyConflictError(ConflictError):
    """The idempotency key was already used for a different request."""


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

    def __init__(self, job: Job, lock: threading.Lock, persist: Callable[[Job], None] | None = None,
                 interval: float = 0.5) -> None:
        self._job = job
        self._lock = lock
        self._stage_started = time.time()
        self._persist = persist
        self._interval = interval
        self._persisted_at = 0.0

    @property
    def job_id(self) -> str:
        return self._job.id

    def should_cancel(self) -> bool:
        return self._job.cancel_requested

    def progress(self, stage: str, fraction: float | None = None) -> None:
        """Record ``stage`` and overall ``fraction`` in [0, 1]; raise Cancelled when asked to stop."""
        with self._lock:
            now = time.time()
            changed = stage != self._job.stage
            if changed:
                prev = self._job.stage
                self._job.stage_seconds[prev] = self._job.stage_seconds.get(prev, 0.0) + now - self._stage_started
                self._stage_started = now
                self._job.stage = stage
            if fraction is not None:
                self._job.fraction = min(1.0, max(0.0, float(fraction)))
        if self._persist is not None and (changed or now - self._persisted_at >= self._interval):
            self._persisted_at = now
            self._persist(self._job)  # also picks up a cancel asked through another process
        if self._job.cancel_requested:
            raise Cancelled(f"job {self._job.id} cancelled during {stage}")

    def _close_stage(self) -> None:
        with self._lock:
            st = self._job.stage
            self._job.stage_seconds[st] = self._job.stage_seconds.get(st, 0.0) + time.time() - self._stage_started


MAX_ERROR_CHARS = 4000


def _plain(v):
    """JSON for what a job may put in its result beyond JSON's types: numpy numbers and arrays, else ``str``."""
    return v.tolist() if hasattr(v, "tolist") else str(v)


def _error(kind: str, exc: BaseException, default: str = "") -> dict:
    """A job's ``error``: the exception's message, cut to :data:`MAX_ERROR_CHARS` (it is stored and listed)."""
    msg = str(exc) or default
    if len(msg) > MAX_ERROR_CHARS:
        msg = f"{msg[:MAX_ERROR_CHARS]}… ({len(msg) - MAX_ERROR_CHARS} more characters)"
    return {"type": kind, "message": msg}


_COLS = ("id", "kind", "description", "state", "stage", "fraction", "created_at", "started_at", "finished_at",
         "stage_seconds", "result", "error", "idempotency_key", "request_hash", "cancel_requested", "owner")
_JSON_COLS = ("stage_seconds", "result", "error")


class JobStore:
    """Job records in a small SQLite file (rollback journal), shared by the processes of one data dir.

    Parameters
    ----------
    path : path
        The database file (its folder is created); owner locks live next to it in
        ``<stem>.owners/``.
    keep_finished : int
        Finished records kept; older ones are deleted at start-up (their idempotency keys
        become free again).
    progress_interval : float
        Least seconds between two progress writes of one job (state changes are always written).
    busy_timeout : float
        Seconds a read or write waits for a lock held by another connection before it gives up with
        :class:`JobStoreBusyError` (HTTP 429 with ``Retry-After``).
    """

    def __init__(self, path, *, keep_finished: int = 10_000, progress_interval: float = 0.5,
                 busy_timeout: float = 10.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.owners_dir = self.path.parent / f"{self.path.stem}.owners"
        self.keep_finished = int(keep_finished)
        self.progress_interval = float(progress_interval)
        self.busy_timeout = float(busy_timeout)
        self.owner: str | None = None
        self._owner_fd: int | None = None
        self._local = threading.local()
        with self._tx() as c:
            c.execute("""CREATE TABLE IF NOT EXISTS jobs (
                id TEXT PRIMARY KEY, kind TEXT NOT NULL, description TEXT NOT NULL, state TEXT NOT NULL,
                stage TEXT NOT NULL, fraction REAL NOT NULL, created_at REAL NOT NULL, started_at REAL,
                finished_at REAL, stage_seconds TEXT NOT NULL, result TEXT, error TEXT,
                idempotency_key TEXT UNIQUE, request_hash TEXT, cancel_requested INTEGER NOT NULL DEFAULT 0,
                owner TEXT NOT NULL)""")
            c.execute("CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state, owner)")

    # --- connection -------------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        c = getattr(self._local, "conn", None)
        if c is None or getattr(self._local, "pid", None) != os.getpid():
            c = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False)
            c.execute("PRAGMA journal_mode=DELETE")  # not WAL: its mapped -shm SIGBUSes on an immutable/full disk
            c.execute("PRAGMA mmap_size=0")
            c.execute("PRAGMA synchronous=NORMAL")
            self._local.conn, self._local.pid = c, os.getpid()
        return c

    def _tx(self):
        store = self

        class _T:
            def __enter__(self):
                self.c = store._conn()
                with store._busy():
                    self.c.execute("BEGIN IMMEDIATE")
                return self.c

            def __exit__(self, et, ev, tb):
                if et is None:
                    try:
                        with store._busy():
                            self.c.execute("COMMIT")
                        return False
                    except BaseException:
                        if self.c.in_transaction:  # a COMMIT that timed out leaves the transaction open
                            self.c.execute("ROLLBACK")
                        raise
                if self.c.in_transaction:
                    self.c.execute("ROLLBACK")
                return False

        return _T()

    @contextmanager
    def _busy(self):
        """Turn SQLite's "database is locked" (held past the busy timeout) into :class:`JobStoreBusyError`."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            raise JobStoreBusyError(f"the job store {self.path.name} stayed locked by another process for "
                                    f"{self.busy_timeout:g} s ({exc}); retry shortly") from exc

    # --- owners -----------------------------------------------------------------------------
    def claim_owner(self) -> str:
        """This process's owner id, holding its lock file (call after any fork)."""
        if self.owner is not None and getattr(self, "_owner_pid", None) == os.getpid():
            return self.owner
        import fcntl

        self.owners_dir.mkdir(parents=True, exist_ok=True)
        owner = uuid.uuid4().hex
        fd = os.open(self.owners_dir / f"{owner}.lock", os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.owner, self._owner_fd, self._owner_pid = owner, fd, os.getpid()
        return owner

    def owner_alive(self, owner: str) -> bool:
        """Whether the process that owns ``owner``'s rows still runs (it holds the owner's lock)."""
        if owner == self.owner:
            return True
        import fcntl

        lock = self.owners_dir / f"{owner}.lock"
        try:
            fd = os.open(lock, os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing drops the lock if we took it
        return False

    def recover(self, owners: list[str] | None = None) -> int:
        """Mark unfinished rows of dead owners (all, or those in ``owners``) failed; returns how many."""
        with self._tx() as c:
            rows = c.execute("SELECT DISTINCT owner FROM jobs WHERE state IN ('queued', 'running')").fetchall()
        candidates = {o for (o,) in rows if owners is None or o in owners}
        if owners is None and self.owners_dir.is_dir():  # also sweep lock files of finished processes
            candidates |= {p.stem for p in self.owners_dir.glob("*.lock")}
        dead = [o for o in sorted(candidates) if not self.owner_alive(o)]
        n = 0
        now = time.time()
        for o in dead:
            with self._tx() as c:
                n += c.execute("UPDATE jobs SET state = 'failed', stage = 'interrupted', finished_at = ?, error = ? "
                               "WHERE owner = ? AND state IN ('queued', 'running')",
                               (now, json.dumps(INTERRUPTED), o)).rowcount
            try:
                (self.owners_dir / f"{o}.lock").unlink()
            except OSError:
                pass
        if n:
            _log.warning("jobs interrupted by a restart marked failed", extra={"fields": {"jobs": n}})
        return n

    def trim(self) -> None:
        with self._tx() as c:
            c.execute("DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE state IN ('succeeded', 'failed', "
                      "'cancelled') ORDER BY created_at DESC LIMIT -1 OFFSET ?)", (self.keep_finished,))

    # --- rows -------------------------------------------------------------------------------
    @staticmethod
    def _row(job: Job, owner: str) -> tuple:
        vals = []
        for k in _COLS:
            v = owner if k == "owner" else getattr(job, k)
            if k in _JSON_COLS:
                v = None if v is None else json.dumps(v, default=_plain)
            elif k == "cancel_requested":
                v = int(bool(v))
            vals.append(v)
        return tuple(vals)

    @staticmethod
    def _job(row) -> Job:
        d = dict(zip(_COLS, row))
        for k in _JSON_COLS:
            d[k] = None if d[k] is None else json.loads(d[k])
        d["stage_seconds"] = d["stage_seconds"] or {}
        d["cancel_requested"] = bool(d["cancel_requested"])
        d.pop("owner")
        return Job(**d)

    def insert(self, job: Job) -> Job | None:
        """Write a new job; if its idempotency key is taken, write nothing and return that key's job."""
        owner = self.claim_owner()
        with self._tx() as c:
            if job.idempotency_key is not None:
                r = c.execute(f"SELECT {', '.join(_COLS)} FROM jobs WHERE idempotency_key = ?",
                              (job.idempotency_key,)).fetchone()
                if r is not None:
                    return self._job(r)
            c.execute(f"INSERT INTO jobs ({', '.join(_COLS)}) VALUES ({', '.join('?' * len(_COLS))})",
                      self._row(job, owner))
        return None

    def save(self, job: Job) -> bool:
        """Write the job's current record; returns whether a cancel was asked through another process."""
        row = self._row(job, self.claim_owner())
        sets = ", ".join(f"{k} = ?" for k in _COLS[1:] if k not in ("cancel_requested", "owner"))
        vals = [v for k, v in zip(_COLS[1:], row[1:]) if k not in ("cancel_requested", "owner")]
        with self._tx() as c:
            c.execute(f"UPDATE jobs SET {sets}, cancel_requested = MAX(cancel_requested, ?) WHERE id = ?",
                      (*vals, int(job.cancel_requested), job.id))
            r = c.execute("SELECT cancel_requested FROM jobs WHERE id = ?", (job.id,)).fetchone()
        return bool(r and r[0])

    def request_cancel(self, job_id: str) -> None:
        """Ask another process's job to stop; its owner sees the flag at the job's next write."""
        with self._tx() as c:
            c.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ? AND state IN ('queued', 'running')", (job_id,))

    def get(self, job_id: str) -> tuple[Job, str] | None:
        """``(job, owner)``, or None."""
        with self._busy():
            r = self._conn().execute(f"SELECT {', '.join(_COLS)} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if r is None else (self._job(r), r[-1])

    def list(self, limit: int = 1000, after: tuple[float, str] | None = None) -> list[Job]:
        """The newest ``limit`` records oldest first; with ``after`` (a ``(created_at, id)`` key) the first
        ``limit`` records past it, so pages walk every record."""
        cols = ", ".join(_COLS)
        with self._busy():
            if after is None:
                rows = self._conn().execute(f"SELECT {cols} FROM jobs ORDER BY created_at DESC, id DESC LIMIT ?",
                                            (int(limit),)).fetchall()[::-1]
            else:
                rows = self._conn().execute(f"SELECT {cols} FROM jobs WHERE (created_at, id) > (?, ?) "
                                            "ORDER BY created_at, id LIMIT ?", (*after, int(limit))).fetchall()
        return [self._job(r) for r in rows]

    def counts(self) -> dict[str, int]:
        """Stored jobs by state (every process of the data dir, every record not yet trimmed)."""
        with self._busy():
            rows = self._conn().execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()
        return {state: int(n) for state, n in rows}

    def close(self) -> None:
        c = getattr(self._local, "conn", None)
        if c is not None:
            c.close()
            self._local.conn = None


class JobManager:
    """Runs jobs on ``workers`` threads; at most ``max_queued`` wait at a time.

    With ``store`` (a :class:`JobStore`) records outlive the process; call :meth:`open` once the
    process runs (after any fork) to claim an owner and fail the jobs of dead owners.
    """

    def __init__(self, workers: int = 1, max_queued: int = 8, *, metrics=None, keep_finished: int = 1000,
                 store: JobStore | None = None) -> None:
        self.workers = max(1, int(workers))
        self.max_queued = max(0, int(max_queued))
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="vecbridge-job")
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._idem: dict[str, str] = {}
        self._lock = threading.Lock()
        self._metrics = metrics
        self._keep = keep_finished
        self.store = store

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
    def get(self, job_id: str) -> Job:
        """The job: this process's live record, else the stored one (another process's, or an earlier run's)."""
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None and self.store is not None:
            got = self.store.get(job_id)
            if got is not None:
                job, owner = got
                if job.state not in TERMINAL and self.store.recover([owner]):
                    job, _ = self.store.get(job_id)
        if job is None:
            raise JobNotFoundError(f"job {job_id!r} not found")
        return job

    def list(self) -> list[Job]:
        """Known jobs, oldest first: stored records (all processes of the data dir) or this process's."""
        with self._lock:
            mine = dict(self._jobs)
        if self.store is None:
            return list(mine.values())
        out = [mine.pop(j.id, j) for j in self.store.list(self._keep)]
        return out + list(mine.values())

    def page(self, limit: int, after: tuple[float, str] | None = None) -> list[Job]:
        """The first ``limit`` jobs past ``after`` in ``(created_at, id)`` order: unlike :meth:`list` (the newest
        ``keep_finished``), successive pages reach every stored record."""
        with self._lock:
            mine = dict(self._jobs)
        if self.store is None:
            jobs = sorted(mine.values(), key=lambda j: (j.created_at, j.id))
            return [j for j in jobs if after is None or (j.created_at, j.id) > after][:limit]
        return [mine.get(j.id, j) for j in self.store.list(limit, after if after is not None else (-1.0, ""))]

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
        if self.store is not None:  # durable before it is acknowledged; the store settles key races
            first = self.store.insert(job)
            if first is not None:
                if first.request_hash != request_hash:
                    raise IdempotencyConflictError(
                        f"Idempotency-Key {idempotency_key!r} was used for a different request (job {first.id})")
                with self._lock:
                    return self._jobs.get(first.id, first), False
        with self._lock:
            self._jobs[job.id] = job
            if idempotency_key is not None:
                self._idem[idempotency_key] = job.id
            self._trim()
        self._count("queued")
        self._pool.submit(self._run, job, fn)
        return job, True

    def cancel(self, job_id: str) -> Job:
        """Ask a job to stop: a queued job is cancelled at once, a running one at its next progress call.

        Another process's job gets the request through the store; its owner acts on it at the
        job's next write.
        """
        with self._lock:
            mine = job_id in self._jobs
        if not mine:
            job = self.get(job_id)
            if self.store is not None and job.state not in TERMINAL:
                self.store.request_cancel(job_id)
                job = self.get(job_id)
            return job
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
        self._persist(job)
        if cancelled_now:
            self._count("cancelled")
        return job

    def shutdown(self, wait: bool = False) -> None:
        """Stop taking jobs; ``wait=False`` (a server stopping): record this process's unfinished jobs interrupted
        now, as the process may be gone before their next progress report (one that ends still writes its end)."""
        with self._lock:
            jobs = [j for j in self._jobs.values() if j.state not in TERMINAL]
            for j in jobs:
                j.cancel_requested = True
                if not wait:
                    j.state, j.stage, j.finished_at, j.error = "failed", "interrupted", time.time(), _SHUT_DOWN
        for j in jobs if not wait else ():
            self._persist(j)
        self._pool.shutdown(wait=wait, cancel_futures=True)

    # --- internals --------------------------------------------------------------------------
    def _run(self, job: Job, fn) -> None:
        with self._lock:
            if job.state != "queued":  # cancelled while waiting
                return
            job.state = "running"
            job.stage = "starting"
            job.started_at = time.time()
        self._persist(job)
        if job.cancel_requested:  # asked through another process while the job waited
            with self._lock:
                job.state = job.stage = "cancelled"
                job.finished_at = time.time()
                job.error = {"type": "JobCancelled", "message": "cancelled before it started"}
            self._persist(job)
            self._count("cancelled")
            return
        self._gauges()
        ctx = JobContext(job, self._lock, self._persist if self.store is not None else None,
                         self.store.progress_interval if self.store is not None else 0.5)
        try:
            result = fn(ctx)
        except BaseException as exc:  # noqa: BLE001 - a job must never kill its worker
            ctx._close_stage()
            with self._lock:
                job.finished_at = time.time()
                if job.cancel_requested or isinstance(exc, Cancelled):
                    job.state = "cancelled"
                    job.error = _error("JobCancelled", exc, "cancelled")
                else:
                    job.state = "failed"
                    job.error = _error(type(exc).__name__, exc)
            self._persist(job)
            if job.state == "failed":
                _log.warning("job failed", extra={"fields": {
                    "job_id": job.id, "kind": job.kind, "error": job.error,
                    "trace": "".join(traceback.format_tb(exc.__traceback__, limit=8))}})
            self._count(job.state)
            return
        ctx._close_stage()
        with self._lock:
            job.finished_at = time.time()
            job.state = "succeeded"
            job.stage = "done"
            job.fraction = 1.0
            job.result = result or {}
        self._persist(job)
        _log.info("job succeeded", extra={"fields": {"job_id": job.id, "kind": job.kind,
                                                     "seconds": round(job.finished_at - job.started_at, 3)}})
        self._count("succeeded")

    def _persist(self, job: Job) -> None:
        """Write the record (no-op without a store); a failed write is logged, the job goes on."""
        if self.store is None:
            return
        try:
            if self.store.save(job):
                job.cancel_requested = True
        except Exception as exc:  # noqa: BLE001 - a job record write must not kill the job
            _log.warning("job record not written", extra={"fields": {"job_id": job.id, "error": repr(exc)}})

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
            c = self.local_counts()
            self._metrics.jobs_queued.set(c["queued"])
            self._metrics.jobs_running.set(c["running"])
