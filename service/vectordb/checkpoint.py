"""Where a migration records how far it got: a JSON file or a PostgreSQL table.

The state is a small JSON object (see :class:`~service.vectordb.migrate.MigrationState`):
source, target, map fingerprint, the id range already written (``first_id`` … ``last_id``,
ascending scan order), rows and batches done, and whether it finished. It is written **after**
each batch's upsert, so a crash can only lose the record of the last batch, never rows: the
resumed run rewrites that batch, and the idempotent upsert keeps one row per id.

One run at a time: :func:`~service.vectordb.migrate` holds :meth:`Checkpoint.lock` for the whole run, so a
second run of the same migration (a retry started while the first still runs, a cron job overlapping the
operator's) is refused with :class:`MigrationRunningError` instead of writing every row again beside it and
racing it for the checkpoint. The lock is an ``flock`` on ``<file>.lock`` (the kernel drops it when the
process dies, ``kill -9`` included; the run removes the file as it ends) or a PostgreSQL advisory lock on the key
(dropped with the connection).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

from align.exceptions import InputError

from ..pgconn import check_statement_timeout
from ..storage import atomic_write, still_linked
from ..urls import check_pg_userinfo
from .base import (
    CheckpointMismatchError,
    MigrationRunningError,
    VectorDBError,
    check_name,
    pg_connect,
)

__all__ = ["Checkpoint", "FileCheckpoint", "PgCheckpoint", "MemoryCheckpoint"]

#: seconds a run starting while another process probes its lock (:meth:`FileCheckpoint.lock_held`: a status read)
#: tries again before it is refused: a probe lets the lock go at once, a run holds it for its whole length
PROBE_GRACE_S = 0.5


class Checkpoint:
    """Interface: ``load() -> dict | None``, ``save(state: dict)``, ``clear()``; ``lock()`` (a context manager
    held while a run writes: MigrationRunningError when another run holds it; by default no lock)."""

    def lock(self):
        return nullcontext()

    def lock_held(self) -> bool | None:
        """Whether a run holds :meth:`lock` now (True / False); None when it cannot be told (no lock to ask)."""
        return None

    #: True when :meth:`lock_held` answers for every host (a lock the database holds), not this host's only
    lock_seen_everywhere = False

    def resolve_options(self, **defaults) -> None:
        """What options left unset resolve to (``target_space``: the map's), for comparing a resume's options with
        the recorded ones; ignored by a checkpoint that records none."""

    def compare_recorded_as(self, **values) -> None:
        """What a recorded option is compared as, whatever the run recorded (``index`` on a Milvus or Qdrant
        store: ``like``, what a run of an older release that recorded ``hnsw`` there did); ignored by a checkpoint
        that records none."""

    def load(self) -> dict | None:  # pragma: no cover - interface
        raise NotImplementedError

    def save(self, state: dict) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def clear(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class MemoryCheckpoint(Checkpoint):
    """Keeps the state in memory (resume within one process; tests)."""

    def __init__(self):
        self.state: dict | None = None

    def load(self):
        return None if self.state is None else dict(self.state)

    def save(self, state):
        self.state = dict(state)

    def clear(self):
        self.state = None


class FileCheckpoint(Checkpoint):
    """A JSON file replaced atomically (write a temporary file, fsync, rename). ``options``: what the run was given
    that a resume must give again (``--alias``, ``--index``, the field names ...: ``migrate --status`` prints the
    command), saved as ``options`` with each state; None leaves the state's own."""

    #: options a resume may give that the first run did not (every other recorded option must be given again as it was;
    #: not ``index``: an unset one means ``like``, and the run may have built that index before it stopped)
    ADDABLE = frozenset({"alias", "source_space", "target_space"})

    def __init__(self, path, *, options: dict | None = None, json_fields: bool = False):
        self.path = Path(path)
        self.options = options
        self.defaults: dict = {}  # what an option left unset resolves to (index: like): :meth:`resolve_options`
        self.recorded_as: dict = {}  # what a recorded option is compared as: :meth:`compare_recorded_as`
        self.json_fields = json_fields  # a refusal names the HTTP request's fields, not the CLI's flags
        if self.path.is_dir():
            raise InputError(f"checkpoint {self.path} is a directory; give a file path, e.g. {self.path / 'run.json'}")
        if self.path.exists() and not self.path.is_file():
            raise InputError(f"checkpoint {self.path} is not a regular file")

    def load(self):
        try:
            state = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise CheckpointMismatchError(f"checkpoint {self.path} is not a migration checkpoint (not JSON); "
                                          "move it away to start afresh") from None
        if not isinstance(state, dict) or not {"source", "target", "map_fingerprint", "last_id"} <= set(state):
            raise CheckpointMismatchError(f"checkpoint {self.path} is not a migration checkpoint")
        if not state.get("finished"):  # a finished run's rerun writes nothing: its options change nothing either
            self._check_options(state.get("options"))
        return state

    def resolve_options(self, **defaults) -> None:
        self.defaults.update({k: v for k, v in defaults.items() if v is not None})

    def compare_recorded_as(self, **values) -> None:
        self.recorded_as.update(values)

    def _check_options(self, recorded) -> None:
        """CheckpointMismatchError when this run's options differ from the ones the checkpoint's run recorded (a
        review's find: a resume without the first run's ``--alias`` finished, said "finished", and never switched
        the alias; another ``--index`` built another index). What the first run left unset (:data:`ADDABLE`: an
        alias, a space declaration) a resume may add; the index and field names it may not change at all. Values
        are compared as they resolve (:attr:`defaults`): ``--index like`` recorded and a resume without ``--index``
        (whose default is ``like``) is no change. Where things are (:attr:`WHERE`: the data dir, the registry, the
        artifact folder, the keep set's files) is not compared (one folder may be named by several paths; a keep set
        is checked by its digest). The refusal names CLI flags, or with ``json_fields`` the fields
        of an HTTP request."""
        if self.options is None or not isinstance(recorded, dict):
            return  # a status read, or a checkpoint of a release that recorded none
        recorded = {**recorded, **{k: v for k, v in self.recorded_as.items() if k in recorded}}
        differ = [self._named(k, recorded.get(k), self.options.get(k))
                  for k in sorted(set(recorded) | set(self.options))
                  if k not in self.WHERE and not self._same(k, recorded.get(k), self.options.get(k))]
        if differ:
            how = ("send the same fields to resume it (GET /v1/migrations shows them in its `resume`)"
                   if self.json_fields else
                   "give the same ones to resume it (`vecbridge migrate --status` prints the command)")
            raise CheckpointMismatchError(f"checkpoint {self.path} was started with other options: "
                                          f"{'; '.join(differ)}; {how}, or move it away to start afresh")

    #: recorded options that say where things are, for the resume command; never compared (one folder may be named by
    #: several paths; a keep set is compared by its digest, not by its files' names)
    WHERE = frozenset({"data_dir", "registry_url", "artifact_dir", "keep_ids", "keep_vectors"})

    def _same(self, key: str, was, now) -> bool:
        """Whether option ``key`` recorded as ``was`` and given as ``now`` means the same (or may be added)."""
        if was == now or (key in self.ADDABLE and was is None):
            return True
        return (self.defaults.get(key) if was is None else was) == (self.defaults.get(key) if now is None else now)

    def _named(self, key: str, was, now) -> str:
        """``--index 'hnsw' (this run: None (default 'like'))``, or over HTTP ``index "hnsw" (this request: null
        (default "like"))``: an unset value with a default says what it stands for."""
        show = json.dumps if self.json_fields else repr
        default = self.defaults.get(key)

        def shown(v) -> str:
            return show(v) + (f" (default {show(default)})" if v is None and default is not None else "")

        if self.json_fields:
            return f"{key} {shown(was)} (this request: {shown(now)})"
        return f"--{key.replace('_', '-')} {shown(was)} (this run: {shown(now)})"

    def save(self, state):
        if self.options is not None:
            state = {**state, "options": self.options}
        atomic_write(self.path, json.dumps(state, sort_keys=True))

    @contextmanager
    def lock(self):
        """An exclusive ``flock`` on ``<file>.lock`` (holding the holder's pid, for the refusal's message).

        The run removes the file as it ends, still holding its lock (each migration left an empty ``.lock`` beside
        its checkpoint for ever). A run that opened the file before that removal and locks it after holds a file no
        longer at the path: it lets it go and locks the one there now, so two runs never hold the lock at once."""
        path = self.lock_path
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = self._take(path)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            yield self
        finally:
            try:
                if still_linked(fd, path):  # ours: no other run holds it (an operator's rm and a new run's file: kept)
                    path.unlink()
            except OSError:
                pass  # a read-only or vanished folder: the file stays, as before, harmless
            finally:
                os.close(fd)  # drops the flock

    def _take(self, path: Path) -> int:
        """A descriptor holding the ``flock`` of the file at ``path`` (made if missing); MigrationRunningError when
        another run holds it. Held for a moment only (:data:`PROBE_GRACE_S`: a status read's probe), it is asked
        again: a run started as ``--status`` looked was refused as if another run wrote, naming a dead one's pid."""
        deadline = time.monotonic() + PROBE_GRACE_S
        gone = 0  # files locked and found no longer at the path
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if still_linked(fd, path) or gone >= 100:  # 100 in a row: a file system whose stat and fstat
                    return fd  # never agree (the check cannot be made there), not runs ending
            except BlockingIOError:
                holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
                os.close(fd)
                if time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
                raise MigrationRunningError(f"another run of this migration is writing now (pid {holder}, "
                                            f"checkpoint {self.path}); wait for it, or stop it and run again "
                                            "to resume") from None
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # the run that held it ended and removed it after we opened it: take the one there now
            gone += 1

    @property
    def lock_path(self) -> Path:
        """``<checkpoint>.lock``: the file whose ``flock`` a run holds (:meth:`lock`)."""
        return self.path.with_name(self.path.name + ".lock")

    def lock_held(self) -> bool | None:
        """Whether a run holds :meth:`lock` now: True held, False free, None no lock file (a run removes it as it
        ends; one killed leaves it, free) or none that can be opened. The kernel's answer, so a run in another pid
        namespace (another container of the pod, ``unshare``) counts as one here, where its pid means nothing; on a
        shared file system that carries ``flock`` (NFS), a run of another host too. A shared, non-blocking
        ``flock`` let go at once: the probe never waits, two probes never see each other, and a run starting
        meanwhile asks again (:meth:`_take`)."""
        try:
            fd = os.open(self.lock_path, os.O_RDONLY)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:  # a file system without flock
            return None
        finally:
            os.close(fd)  # drops a lock taken
        return False

    def clear(self):
        self.path.unlink(missing_ok=True)


class PgCheckpoint(Checkpoint):
    """A row of ``vecbridge_migrations (key text primary key, state jsonb, updated_at)`` in PostgreSQL.

    ``key`` names the migration (default ``"<source>-><target>"`` chosen by the caller). A run holds a session
    advisory lock keyed from ``table:key`` (:meth:`lock`); :meth:`lock_held` probes it from another session, so a
    status read tells a live run from one killed on any host that shares the database.
    """

    lock_seen_everywhere = True  # the database holds the lock: its answer is the same from every host

    def __init__(self, url: str, key: str, *, table: str = "vecbridge_migrations",
                 statement_timeout_s: float | None = None):
        from ..registry.postgres import PG_STATEMENT_TIMEOUT_S

        statement_timeout_s = check_statement_timeout(statement_timeout_s)  # "30", True: as every number is checked
        # a raw "@" in the user part made libpq read part of the password as the host, which the error then named
        self.url = check_pg_userinfo(url, "checkpoint URL")
        self.key = key
        self.table = check_name(table, "table")
        #: the longest a read or write may wait (the registry's setting, ``registry_statement_timeout_s``: pass
        #: ``settings.registry_statement_timeout_s``; None: its default, 30 s; 0: no limit)
        self.statement_timeout_s = PG_STATEMENT_TIMEOUT_S if statement_timeout_s is None else statement_timeout_s
        self.conn = self._connect()
        try:  # refused (no CREATE privilege on the schema: PostgreSQL 15's default for public): not left open
            with self.conn.transaction():  # two runs or a run and a status read at once: CREATE TABLE IF NOT EXISTS
                # in both sessions raised UniqueViolation (pg_type) in one of them; serialised, the second finds it
                self.conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"vecbridge-ddl:{self.table}",))
                self.conn.execute(f"CREATE TABLE IF NOT EXISTS {self.table} (key text PRIMARY KEY, "
                                  "state jsonb NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())")
        except BaseException:
            self.conn.close()
            raise

    def _connect(self):
        """A connection with a connect timeout and, where the session has no ``statement_timeout`` of its own (from
        the URL, ``PGOPTIONS``, a service file, the role or database), :attr:`statement_timeout_s`: a read or write
        behind another session's lock on the table waited as long as that lasted. Set by ``SET`` after connecting,
        so the options the connection was given (a ``search_path``) are left as they were. A database that cannot
        be reached is VectorDBUnavailableError naming the URL (it was psycopg's OperationalError: exit 3)."""
        from ..registry.postgres import statement_timeout_ms

        conn = pg_connect(self.url, "migration checkpoint",
                          "start the checkpoint's database or fix the URL given to PgCheckpoint, then run the "
                          "migration again: it resumes from the checkpoint")
        try:
            if self.statement_timeout_s and conn.execute("SHOW statement_timeout").fetchone()[0] == "0":
                conn.execute(f"SET statement_timeout = {statement_timeout_ms(self.statement_timeout_s)}")
        except BaseException:  # the session ended meanwhile, ...: not left open
            conn.close()
            raise
        return conn

    def load(self):
        r = self.conn.execute(f"SELECT state FROM {self.table} WHERE key = %s", (self.key,)).fetchone()
        return None if r is None else dict(r[0])

    def save(self, state):
        from psycopg.types.json import Jsonb

        self.conn.execute(f"INSERT INTO {self.table} (key, state) VALUES (%s, %s) ON CONFLICT (key) "
                          "DO UPDATE SET state = EXCLUDED.state, updated_at = now()", (self.key, Jsonb(state)))

    def clear(self):
        self.conn.execute(f"DELETE FROM {self.table} WHERE key = %s", (self.key,))

    @property
    def lock_key(self) -> str:
        """What the advisory lock is keyed from (``hashtext`` of it): the table and the checkpoint's key."""
        return f"{self.table}:{self.key}"

    @contextmanager
    def lock(self):
        """A session advisory lock on ``hashtext(table:key)`` (dropped with the connection if the process dies).
        Held for a moment only (a status read's probe, :meth:`lock_held`), it is asked again for
        :data:`PROBE_GRACE_S`, as a file's is."""
        deadline = time.monotonic() + PROBE_GRACE_S
        while not self.conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (self.lock_key,)).fetchone()[0]:
            if time.monotonic() < deadline:
                time.sleep(0.01)
                continue
            raise MigrationRunningError(f"another run of this migration is writing now (checkpoint {self.key!r} "
                                        f"in {self.table}); wait for it, or stop it and run again to resume")
        try:
            yield self
        finally:
            self.conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (self.lock_key,))

    def lock_held(self) -> bool | None:
        """Whether a run holds :meth:`lock` now, asked on a connection of its own (a session's advisory locks are
        its own to take again: asked on :attr:`conn`, a lock this object holds read free): the lock taken and let
        go at once (False), or refused (True). None when the database cannot be reached to ask, or its session ends
        before it answers (terminated, the server restarting)."""
        import psycopg

        try:
            with self._connect() as probe:
                if not probe.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (self.lock_key,)).fetchone()[0]:
                    return True
                probe.execute("SELECT pg_advisory_unlock(hashtext(%s))", (self.lock_key,))
                return False
        except (VectorDBError, psycopg.OperationalError):  # cannot be reached, or the session ended mid-probe
            return None

    def close(self):
        self.conn.close()
