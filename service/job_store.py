"""Durable job records: :class:`Job` and :class:`JobStore`, a small SQLite file shared by the processes of one
data dir (see :mod:`service.jobs` for the states, ownership and recovery they serve).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import uuid
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ServiceUnavailableError
from .logging import get_logger
from .storage import OpenedFile, hold, sqlite_connect, take_abandoned

__all__ = ["FIT_ADVICE", "INTERRUPTED", "TERMINAL", "Job", "JobStore", "JobStoreBusyError", "interrupted_in"]

TERMINAL = ("succeeded", "failed", "cancelled")
#: a fit stopped after its version's commit (its last stage) is recorded interrupted all the same: how to tell
FIT_ADVICE = ("a fit stopped in its 'register' stage may have registered its version: check the map's versions "
              "(GET /v1/maps/NAME/versions, `vecbridge registry list`) before resubmitting")
INTERRUPTED = {"type": "Interrupted",
               "message": "interrupted by restart: the process running this job stopped (killed, crashed or shut "
                          f"down) before the job finished; {FIT_ADVICE}"}
_log = get_logger("jobs")


#: what to do about an interrupted job of a kind other than a fit's (the advice after the message's last "; ", a
#: fit's, told a migration to check a map's versions): a migration resumes from its checkpoint
ADVICE = {"migration": "resubmitting the same migration resumes it from its checkpoint (every batch written so far "
                       "is kept; `vecbridge migrate --status` shows where it stopped)",
          "steer-fit": "a steer fit stopped in its 'register' stage may have registered its version: check the steer's "
                       "versions (GET /v1/steers/NAME, `vecbridge steer list`) before resubmitting",
          "verify": "a verification writes nothing: resubmit it"}
ADVICE["lm-steer-fit"] = ADVICE["steer-fit"]


def interrupted_in(state: str, stage: str, fraction: float, error: dict, kind: str | None = None) -> dict:
    """``error`` (an interruption's record) naming where a job in ``state`` / ``stage`` at ``fraction`` stopped:
    "interrupted by restart during 'fit' at 40%: ..." (its stage becomes "interrupted", its own is lost otherwise),
    with the :data:`ADVICE` for its ``kind`` where there is one."""
    where = "before it started" if state == "queued" else f"during {stage!r} at {round(100 * float(fraction))}%"
    head, sep, rest = error["message"].partition(":")
    if kind in ADVICE:
        rest = f"{rest.rpartition('; ')[0]}; {ADVICE[kind]}"
    return {**error, "message": f"{head} {where}{sep}{rest}"}


class JobStoreBusyError(ServiceUnavailableError):
    """The job store stayed locked by another connection (a sibling process, a backup) past its busy timeout:
    a 503 with ``Retry-After``, as the registry's database locked alike (not a 429: the client sent nothing
    too many)."""


@dataclass
class Job:
    id: str
    kind: str
    description: str = ""
    state: str = "queued"
    stage: str = "queued"
    fraction: float = 0.0
    created_at: float = field(default_factory=lambda: time.time())
    started_at: float | None = None
    finished_at: float | None = None
    stage_seconds: dict[str, float] = field(default_factory=dict)
    result: dict | None = None
    error: dict | None = None
    idempotency_key: str | None = None
    request_hash: str | None = None
    cancel_requested: bool = False
    # the running stage's fraction when it began (its first report): a resumed migration's starts at its checkpoint
    stage_from: float = 0.0
    # its place in the order jobs were made (the store's insertion sequence: increasing, never reused, whatever the
    # wall clock did); the order jobs are listed, paged and trimmed in. None until it is stored (or queued).
    seq: int | None = None
    # the wall clock read once, then moved on by the monotonic clock: the durations of a job are never negative
    _clock: tuple[float, float] = field(default_factory=lambda: (time.time(), time.monotonic()), repr=False,
                                        compare=False)

    def now(self) -> float:
        """An epoch timestamp for this job's records that never steps back (a clock set back by NTP or a user)."""
        return self._clock[0] + time.monotonic() - self._clock[1]

    def to_dict(self) -> dict:
        now = self.now()
        return {
            "id": self.id, "kind": self.kind, "description": self.description, "state": self.state,
            "progress": {"stage": self.stage, "fraction": round(float(self.fraction), 4), **self._stage_clock(now)},
            "timings": {
                "created_at": self.created_at, "started_at": self.started_at, "finished_at": self.finished_at,
                # a job that ended before it started (cancelled while queued, interrupted) waited until it ended
                "queued_seconds": max(0.0, (self.started_at or self.finished_at or now) - self.created_at),
                "run_seconds": (max(0.0, (self.finished_at or now) - self.started_at) if self.started_at else None),
                "stages": dict(self.stage_seconds),
            },
            "result": self.result, "error": self.error, "cancel_requested": self.cancel_requested, "seq": self.seq,
        }

    def _stage_clock(self, now: float) -> dict:
        """Seconds in the running stage and the stage's ETA (None unless running).

        The stages run back to back from ``started_at`` and ``stage_seconds`` holds the closed ones, so the
        running stage began at ``t_s = started_at + sum(stage_seconds)``: elapsed ``e = now - t_s``. At its rate
        so far, its remaining fraction ``1 - f`` takes ``e (1 - f) / (f - f0)`` seconds, ``f0`` the fraction it
        began at (``stage_from``: 0 for most; a resumed migration begins at its checkpoint, and ``e (1 - f) / f``
        promised 75 % of 20,000 rows in the time this run took for 1,000); None below 1 % done in this run.
        ``fraction`` is that stage's, so this is when the stage ends, not the job.
        """
        if self.state != "running" or self.started_at is None:
            return {"stage_elapsed_seconds": None, "stage_eta_seconds": None}
        elapsed = max(0.0, now - self.started_at - sum(self.stage_seconds.values()))
        f, done = float(self.fraction), float(self.fraction) - float(self.stage_from)
        eta = elapsed * (1.0 - f) / done if done >= 0.01 and f < 1.0 else (0.0 if f >= 1.0 else None)
        return {"stage_elapsed_seconds": round(elapsed, 3), "stage_eta_seconds": None if eta is None else round(eta, 3)}


def _plain(v):
    """JSON for what a job may put in its result beyond JSON's types: numpy numbers and arrays, else ``str``."""
    return v.tolist() if hasattr(v, "tolist") else str(v)


_COLS = ("id", "kind", "description", "state", "stage", "fraction", "created_at", "started_at", "finished_at",
         "stage_seconds", "result", "error", "idempotency_key", "request_hash", "cancel_requested", "owner",
         "stage_from")
_JSON_COLS = ("stage_seconds", "result", "error")
_READ = ", ".join((*_COLS, "seq"))  # what a read selects: the written columns and the insertion sequence
# ``seq`` aliases the rowid (stable under VACUUM) and AUTOINCREMENT never hands out a number again, even the newest
# one's after a trim deleted it: jobs are listed, paged and trimmed by it, not by the wall clock of created_at (a
# clock that was ahead made the jobs after it look old: missing from the newest page, the first to be trimmed)
_TABLE = """CREATE TABLE IF NOT EXISTS {name} (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, kind TEXT NOT NULL, description TEXT NOT NULL,
    state TEXT NOT NULL, stage TEXT NOT NULL, fraction REAL NOT NULL, created_at REAL NOT NULL, started_at REAL,
    finished_at REAL, stage_seconds TEXT NOT NULL, result TEXT, error TEXT, idempotency_key TEXT UNIQUE,
    request_hash TEXT, cancel_requested INTEGER NOT NULL DEFAULT 0, owner TEXT NOT NULL, saved_at REAL,
    stage_from REAL NOT NULL DEFAULT 0)"""


class JobStore:
    """Job records in a small SQLite file (rollback journal), shared by the processes of one data dir.

    Parameters
    ----------
    path : path
        The database file (its folder is created); owner locks live next to it in
        ``<stem>.owners/``.
    keep_finished : int
        Finished records kept; older ones are deleted at start-up and every ``trim_every`` new jobs
        (their idempotency keys become free again).
    progress_interval : float
        Least seconds between two progress writes of one job (state changes are always written).
    busy_timeout : float
        Seconds a read or write waits for a lock held by another connection before it gives up with
        :class:`JobStoreBusyError` (HTTP 503 with ``Retry-After``).
    trim_every : int
        New jobs between two trims of the finished records beyond ``keep_finished``.
    """

    def __init__(self, path, *, keep_finished: int = 10_000, progress_interval: float = 0.5,
                 busy_timeout: float = 10.0, trim_every: int = 100) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.opened = OpenedFile(self.path)  # what its connections opened: moved() when replaced under them
        self.owners_dir = self.path.parent / f"{self.path.stem}.owners"
        self.keep_finished = int(keep_finished)
        self.progress_interval = float(progress_interval)
        self.busy_timeout = float(busy_timeout)
        self.trim_every, self._inserted = max(1, int(trim_every)), 0
        self.owner: str | None = None
        self._owner_fd: int | None = None
        self._local = threading.local()
        with self._tx() as c:
            c.execute(_TABLE.format(name="jobs"))
            have = {r[1] for r in c.execute("PRAGMA table_info(jobs)")}
            if "saved_at" not in have:  # a store of 0.x: add it
                c.execute("ALTER TABLE jobs ADD COLUMN saved_at REAL")  # the last write: when a crash stopped a job
            if "stage_from" not in have:  # a store of a release before it (which still writes it: names no column)
                c.execute("ALTER TABLE jobs ADD COLUMN stage_from REAL NOT NULL DEFAULT 0")
            if "seq" not in have:
                self._add_seq(c)
            c.execute("CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state, owner)")

    @staticmethod
    def _add_seq(c: sqlite3.Connection) -> None:
        """Upgrade a store written before ``seq`` in place (in the caller's transaction): its rows copied into a table
        with the sequence, numbered in their ``created_at`` order (all they had), the jobs made from now on after them.
        Releases before it still read and write the table: they name every column but ``seq``, which fills itself."""
        cols = ", ".join((*_COLS, "saved_at"))
        c.execute("DROP TABLE IF EXISTS jobs_upgrading")  # not left by a crash (DDL is transactional): by a hand
        c.execute(_TABLE.format(name="jobs_upgrading"))
        c.execute(f"INSERT INTO jobs_upgrading (seq, {cols}) SELECT ROW_NUMBER() OVER (ORDER BY created_at, id), "
                  f"{cols} FROM jobs")
        c.execute("DROP TABLE jobs")  # and its index
        c.execute("ALTER TABLE jobs_upgrading RENAME TO jobs")

    # --- connection -------------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        c = getattr(self._local, "conn", None)
        if c is None or getattr(self._local, "pid", None) != os.getpid():
            c = sqlite_connect(self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False)
            self.opened.note()
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
        self.owners_dir.mkdir(parents=True, exist_ok=True)
        owner = uuid.uuid4().hex
        fd = hold(self.owners_dir / f"{owner}.lock", create=True)
        self.owner, self._owner_fd, self._owner_pid = owner, fd, os.getpid()
        return owner

    def owner_alive(self, owner: str) -> bool:
        """Whether the process that owns ``owner``'s rows still runs (it holds the owner's lock)."""
        if owner == self.owner:
            return True
        lock = self.owners_dir / f"{owner}.lock"
        fd = take_abandoned(lock)
        if fd is None:  # held by a live process; or gone, and its owner with it
            return lock.exists()
        os.close(fd)  # closing drops the lock we took
        return False

    def recover(self, owners: list[str] | None = None) -> int:
        """Mark unfinished rows of dead owners (all, or those in ``owners``) failed; returns how many. Their
        ``finished_at`` is their last write (the last progress report), not now: the time the service was down
        is neither run nor queue time. A row a release before ``saved_at`` wrote ends after its closed stages
        (``started_at`` + their seconds; it showed ``run_seconds`` 0 beside 5 s of stages)."""
        with self._tx() as c:
            rows = c.execute("SELECT DISTINCT owner FROM jobs WHERE state IN ('queued', 'running')").fetchall()
        candidates = {o for (o,) in rows if owners is None or o in owners}
        if owners is None and self.owners_dir.is_dir():  # also sweep lock files of finished processes
            candidates |= {p.stem for p in self.owners_dir.glob("*.lock")}
        dead = [o for o in sorted(candidates) if not self.owner_alive(o)]
        n = 0
        for o in dead:
            with self._tx() as c:
                # a row of a release before saved_at (none recorded): its closed stages' seconds after its start
                # (summed here, not by SQLite's JSON functions, which a build may lack)
                old = c.execute("SELECT id, started_at, stage_seconds FROM jobs WHERE owner = ? AND state IN "
                                "('queued', 'running') AND saved_at IS NULL AND started_at IS NOT NULL", (o,))
                for jid, started, stages in old.fetchall():
                    with suppress(ValueError, TypeError, AttributeError):  # unreadable stages: ends at its start
                        c.execute("UPDATE jobs SET saved_at = ? WHERE id = ?",
                                  (started + sum(float(v) for v in json.loads(stages).values()), jid))
                lost = c.execute("SELECT id, state, stage, fraction, kind FROM jobs WHERE owner = ? AND state IN "
                                 "('queued', 'running')", (o,)).fetchall()
                for jid, state, stage, fraction, kind in lost:  # the stage it died in goes into the message, as on
                    # shutdown
                    n += c.execute("UPDATE jobs SET state = 'failed', stage = 'interrupted', error = ?, finished_at = "
                                   "MAX(COALESCE(saved_at, 0), COALESCE(started_at, created_at)) WHERE id = ?",
                                   (json.dumps(interrupted_in(state, stage, fraction, INTERRUPTED, kind)),
                                    jid)).rowcount
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
                      "'cancelled') ORDER BY seq DESC LIMIT -1 OFFSET ?)", (self.keep_finished,))

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
        """The job of a row of :data:`_READ`."""
        d = dict(zip((*_COLS, "seq"), row))
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
                r = c.execute(f"SELECT {_READ} FROM jobs WHERE idempotency_key = ?",
                              (job.idempotency_key,)).fetchone()
                if r is not None:
                    return self._job(r)
            job.seq = c.execute(f"INSERT INTO jobs ({', '.join(_COLS)}) VALUES ({', '.join('?' * len(_COLS))})",
                                self._row(job, owner)).lastrowid
        self._inserted += 1
        if self._inserted % self.trim_every == 0:  # a server that runs for months keeps its history bounded too
            try:
                self.trim()
            except (sqlite3.Error, JobStoreBusyError) as exc:  # the next turn trims; the job is written
                _log.warning("job records not trimmed", extra={"fields": {"error": repr(exc)}})
        return None

    def by_key(self, key: str) -> Job | None:
        """The job an idempotency key created, or None."""
        with self._busy():
            r = self._conn().execute(f"SELECT {_READ} FROM jobs WHERE idempotency_key = ?",
                                     (key,)).fetchone()
        return None if r is None else self._job(r)

    def save(self, job: Job, *, was: str | None = None) -> bool:
        """Write the job's current record (with ``was``: only over a record in that state); returns whether a cancel
        was asked through another process. A record that is not final never replaces a final one: a write taken
        before the job ended (a progress report, another process's stale copy) that landed after its final write
        left the store saying "running" for ever (every other process, and recovery, believed it)."""
        row = self._row(job, self.claim_owner())
        sets = ", ".join(f"{k} = ?" for k in _COLS[1:] if k not in ("cancel_requested", "owner"))
        vals = [v for k, v in zip(_COLS[1:], row[1:]) if k not in ("cancel_requested", "owner")]
        where = "id = ?" if was is None else "id = ? AND state = ?"
        if job.state not in TERMINAL:
            where += f" AND state NOT IN {TERMINAL}"
        with self._tx() as c:
            c.execute(f"UPDATE jobs SET {sets}, saved_at = ?, cancel_requested = MAX(cancel_requested, ?) "
                      f"WHERE {where}", (*vals, job.now(), int(job.cancel_requested), job.id,
                                         *(() if was is None else (was,))))
            r = c.execute("SELECT cancel_requested FROM jobs WHERE id = ?", (job.id,)).fetchone()
        return bool(r and r[0])

    def cancel_queued(self, job_id: str, error: dict) -> bool:
        """Cancel another process's job that has not started yet (its owner adopts the record: see
        :meth:`ended`); returns whether it was still queued."""
        with self._tx() as c:
            return c.execute("UPDATE jobs SET state = 'cancelled', stage = 'cancelled', finished_at = ?, error = ?, "
                             "cancel_requested = 1 WHERE id = ? AND state = 'queued'",
                             (time.time(), json.dumps(error), job_id)).rowcount > 0

    def ended(self, ids: list[str]) -> dict[str, Job]:
        """The records among ``ids`` that are final, by id."""
        if not ids:
            return {}
        with self._busy():
            rows = self._conn().execute(f"SELECT {_READ} FROM jobs WHERE id IN ({', '.join('?' * len(ids))}) AND "
                                        f"state IN {TERMINAL}", list(ids)).fetchall()
        return {r[0]: self._job(r) for r in rows}

    def request_cancel(self, job_id: str) -> None:
        """Ask a job to stop, writing the flag alone (never the rest of a record read before: the job may end
        meanwhile); another process's job sees it at its next write."""
        with self._tx() as c:
            c.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ? AND state IN ('queued', 'running')", (job_id,))

    def get(self, job_id: str) -> tuple[Job, str] | None:
        """``(job, owner)``, or None."""
        with self._busy():
            r = self._conn().execute(f"SELECT {_READ} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if r is None else (self._job(r), r[_COLS.index("owner")])

    def list(self, limit: int = 1000, after: int | None = None, *, newest: bool = False,
             states: tuple[str, ...] | None = None, kinds: tuple[str, ...] | None = None) -> list[Job]:
        """The newest ``limit`` records oldest first (in ``seq`` order: as they were made); with ``after`` (a ``seq``)
        the first ``limit`` records past it, so pages walk every record. ``newest``: newest first, ``after`` then the
        ``seq`` the records come before. Only records in one of ``states`` / of one of ``kinds`` when given."""
        where, args = [], []
        for col, values in (("state", states), ("kind", kinds)):
            if values is not None:
                where.append(f"{col} IN ({', '.join('?' * len(values))})" if values else "0")
                args += list(values)
        if after is not None:
            where.append(f"seq {'<' if newest else '>'} ?")
            args.append(int(after))
        sql = f"SELECT {_READ} FROM jobs {'WHERE ' + ' AND '.join(where) if where else ''} ORDER BY seq"
        desc = newest or after is None  # no key, oldest first: the newest `limit`, turned round
        sql += " DESC LIMIT ?" if desc else " LIMIT ?"
        with self._busy():
            rows = self._conn().execute(sql, (*args, int(limit))).fetchall()
        return [self._job(r) for r in (rows[::-1] if desc and not newest else rows)]

    def counts(self) -> dict[str, int]:
        """Stored jobs by state (every process of the data dir, every record not yet trimmed)."""
        with self._busy():
            rows = self._conn().execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()
        return {state: int(n) for state, n in rows}

    def moved(self) -> bool:
        """Its file was replaced or removed since it opened it (:class:`~service.storage.OpenedFile`)."""
        return self.opened.moved()

    def close(self) -> None:
        self.opened.forget()
        c = getattr(self._local, "conn", None)
        if c is not None:
            c.close()
            self._local.conn = None
