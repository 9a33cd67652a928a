"""SQL backends: SQLite (rollback journal, ``BEGIN IMMEDIATE``) and PostgreSQL (psycopg 3, row locks).

Both expose the same tiny interface: ``with db.tx(write=True) as t: t.q(sql, params)``. SQL is
written once with ``?`` placeholders; the PostgreSQL backend rewrites them to ``%s``. Write
transactions are serialised per map by the database: SQLite takes its single write lock at
``BEGIN IMMEDIATE``; PostgreSQL locks the map's row (``SELECT ... FOR UPDATE``), and a unique
key on ``(name, version)`` backs both up. Transient conflicts are retried by the caller.
"""

from __future__ import annotations

import os
import re
import select
import sqlite3
import threading
import time
from contextlib import contextmanager, nullcontext, suppress
from datetime import UTC, datetime
from pathlib import Path

from align.exceptions import InputError

from .. import pgconn
from ..copies import quick_check_findings
from ..pgconn import operator_options, option_settings, pg_connect_options
from ..storage import OpenedFile, sqlite_connect, sqlite_damaged
from ..urls import check_pg_userinfo, redact
from .errors import (
    ConflictError,
    DamagedDatabaseError,
    IntegrityError,
    InvalidNameError,
    RegistryError,
    RegistryLockedError,
    RegistryUnavailableError,
)

__all__ = ["open_db", "pg_conninfo", "sqlite_path", "SQLiteDB", "PostgresDB", "SCHEMA", "UPGRADES", "Row"]

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS vb_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS spaces (
        name TEXT PRIMARY KEY, dim INTEGER NOT NULL, encoder TEXT,
        query_prefix TEXT NOT NULL DEFAULT '', passage_prefix TEXT NOT NULL DEFAULT '',
        description TEXT NOT NULL DEFAULT '', created_at TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS maps (
        name TEXT PRIMARY KEY, source_space TEXT NOT NULL, target_space TEXT NOT NULL,
        source_dim INTEGER NOT NULL, target_dim INTEGER NOT NULL,
        created_at TEXT NOT NULL, last_version INTEGER NOT NULL DEFAULT 0)""",
    """CREATE TABLE IF NOT EXISTS versions (
        name TEXT NOT NULL REFERENCES maps(name), version INTEGER NOT NULL,
        source_space TEXT NOT NULL, target_space TEXT NOT NULL,
        source_dim INTEGER NOT NULL, target_dim INTEGER NOT NULL, method TEXT NOT NULL,
        params TEXT NOT NULL, random_state BIGINT, data_hashes TEXT NOT NULL, package_version TEXT NOT NULL,
        created_at TEXT NOT NULL, metrics TEXT NOT NULL, artifact_sha256 TEXT NOT NULL,
        artifact_path TEXT NOT NULL, artifact_format TEXT NOT NULL, deleted INTEGER NOT NULL DEFAULT 0,
        description TEXT NOT NULL DEFAULT '', report_path TEXT, inputs TEXT NOT NULL DEFAULT '{}',
        map_kind TEXT NOT NULL DEFAULT 'linear', n_clusters INTEGER NOT NULL DEFAULT 0,
        deleted_at TEXT, collected_at TEXT,
        PRIMARY KEY (name, version))""",
    """CREATE TABLE IF NOT EXISTS aliases (
        name TEXT NOT NULL, alias TEXT NOT NULL, version INTEGER NOT NULL,
        PRIMARY KEY (name, alias), FOREIGN KEY (name, version) REFERENCES versions(name, version))""",
    """CREATE TABLE IF NOT EXISTS tags (
        name TEXT NOT NULL, version INTEGER NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
        PRIMARY KEY (name, version, key), FOREIGN KEY (name, version) REFERENCES versions(name, version))""",
    # steers (LM-Steer style transforms in one space): names, immutable numbered versions, aliases
    """CREATE TABLE IF NOT EXISTS steer_names (
        name TEXT PRIMARY KEY, space TEXT NOT NULL, dim INTEGER NOT NULL,
        created_at TEXT NOT NULL, last_version INTEGER NOT NULL DEFAULT 0)""",
    """CREATE TABLE IF NOT EXISTS steers (
        name TEXT NOT NULL REFERENCES steer_names(name), version INTEGER NOT NULL,
        space TEXT NOT NULL, dim INTEGER NOT NULL, rank INTEGER NOT NULL, method TEXT NOT NULL,
        params TEXT NOT NULL, random_state BIGINT, data_hashes TEXT NOT NULL, package_version TEXT NOT NULL,
        created_at TEXT NOT NULL, metrics TEXT NOT NULL, artifact_sha256 TEXT NOT NULL,
        artifact_path TEXT NOT NULL, deleted INTEGER NOT NULL DEFAULT 0, description TEXT NOT NULL DEFAULT '',
        lens TEXT NOT NULL DEFAULT '[]', inputs TEXT NOT NULL DEFAULT '{}', deleted_at TEXT, collected_at TEXT,
        PRIMARY KEY (name, version))""",
    """CREATE TABLE IF NOT EXISTS steer_aliases (
        name TEXT NOT NULL, alias TEXT NOT NULL, version INTEGER NOT NULL,
        PRIMARY KEY (name, alias), FOREIGN KEY (name, version) REFERENCES steers(name, version))""",
]

# columns added after the first release: (table, column, declaration), added to an older database on open
UPGRADES = [
    ("versions", "map_kind", "TEXT NOT NULL DEFAULT 'linear'"),
    ("versions", "n_clusters", "INTEGER NOT NULL DEFAULT 0"),
    ("versions", "deleted_at", "TEXT"), ("versions", "collected_at", "TEXT"),
    ("steers", "deleted_at", "TEXT"), ("steers", "collected_at", "TEXT"),
]

#: what fills a column of :data:`UPGRADES` in the rows it finds (``?``: the time of the upgrade): a version deleted
#: before deletion times were kept counts as deleted when the registry was upgraded (``registry gc --older-than``)
BACKFILLS = {(t, "deleted_at"): f"UPDATE {t} SET deleted_at = ? WHERE deleted = 1" for t in ("versions", "steers")}


def _upgrade(t, table: str, col: str, decl: str, exists: str = "") -> None:
    """Add column ``col`` to ``table`` (``exists``: PostgreSQL's ``IF NOT EXISTS``) and fill it (:data:`BACKFILLS`)."""
    t.q(f"ALTER TABLE {table} ADD COLUMN {exists}{col} {decl}")
    if (table, col) in BACKFILLS:
        t.q(BACKFILLS[table, col], (datetime.now(UTC).isoformat(timespec="microseconds"),))


def _table_columns(stmt: str) -> tuple[str, list[str]]:
    """``(table, its columns in order)`` of a ``CREATE TABLE`` statement of :data:`SCHEMA`."""
    table, body = re.match(r"CREATE TABLE IF NOT EXISTS (\w+) \((.*)\)$", stmt, re.DOTALL).groups()
    parts = re.split(r",(?![^()]*\))", body)  # commas outside parentheses
    return table, [p.split()[0] for p in parts if p.split()[0] not in ("PRIMARY", "FOREIGN", "UNIQUE")]


#: the readiness probe: every table's first key (its primary-key index) and a first row (a column no index holds),
#: one statement reading root and first leaf pages only, so it costs the same on any registry
PROBE_SQL = "SELECT " + ", ".join(f"(SELECT MIN({cols[0]}) FROM {table}), (SELECT {cols[-1]} FROM {table} LIMIT 1)"
                                  for table, cols in map(_table_columns, SCHEMA))

#: libpq's words for a connection the server refused for good: a retry without its operator acting gets the same
#: ("no password supplied": a URL without a password on a server asking for one, libpq's own words, no SQLSTATE)
_REFUSED_FOR_GOOD = ("authentication failed", "no pg_hba.conf entry", "does not exist", "no password supplied")


def refused_for_good(exc: Exception, why: str) -> bool:
    """Whether a failed PostgreSQL connect is one its operator must fix (a password, a role, a database that does
    not exist: SQLSTATE class 28 or 3D000, or libpq's words for them), not a server that may come back."""
    state = getattr(exc, "sqlstate", None) or ""
    return state.startswith("28") or state == "3D000" or any(w in why for w in _REFUSED_FOR_GOOD)


class Row(tuple):
    """A PostgreSQL result row that reads like SQLite's ``sqlite3.Row`` (what the SQLite backend returns):
    by column name (``r["version"]``, ``dict(r)``, ``keys()``) or by position (``r[0]``, unpacking)."""

    def __new__(cls, values, index: dict[str, int]):
        r = super().__new__(cls, values)
        r._index = index
        return r

    def __getitem__(self, key):
        return tuple.__getitem__(self, self._index[key] if isinstance(key, str) else key)

    def keys(self):
        return self._index.keys()


class _Tx:
    """One transaction's queries; rows come back readable by column name on both backends."""

    def __init__(self, cur, convert, named: bool):
        self._cur = cur
        self._convert = convert
        self._named = named  # the cursor already returns rows by name (sqlite3.Row)

    def q(self, sql: str, params=()) -> list:
        self._cur.execute(self._convert(sql), tuple(params))
        if self._cur.description is None:
            return []
        if self._named:
            return self._cur.fetchall()
        index = {d[0]: i for i, d in enumerate(self._cur.description)}
        return [Row(r, index) for r in self._cur.fetchall()]

    def one(self, sql: str, params=()):
        rows = self.q(sql, params)
        return rows[0] if rows else None


class _Base:
    kind = "base"
    for_update = ""
    byte_order = ""  # ORDER BY / compare a name in code-point order, as Python does (SQLite's default, BINARY)
    key_share = ""  # a row read this way cannot be deleted before the transaction ends (SQLite: one writer anyway)

    opened: OpenedFile | None = None  # SQLite: the file its connections opened

    def __init__(self):
        self._local = threading.local()

    def moved(self) -> bool:
        """SQLite: its file was replaced or removed since it opened it (:class:`~service.storage.OpenedFile`)."""
        return self.opened is not None and self.opened.moved()

    def _conn(self):
        c = getattr(self._local, "conn", None)
        if c is None or getattr(self._local, "pid", None) != os.getpid():
            c = self._connect()
            self._local.conn, self._local.pid = c, os.getpid()
        return c

    def change_counter(self) -> int | None:
        """A number that changes whenever a commit changed the database, read without a query, or None when
        the backend has none (then only a query tells)."""
        return None

    def probe(self) -> None:
        """The readiness check: one cheap statement touching every table and its key (:data:`PROBE_SQL`); raises
        what a request would when the database does not answer or (SQLite) those pages are damaged."""
        with self.tx() as t:
            t.q(PROBE_SQL)

    def damage(self) -> list[str]:
        """What is wrong with the database's own storage (SQLite: ``PRAGMA quick_check``); empty when sound or when
        the backend checks its own (a server)."""
        return []

    def close(self):
        c = getattr(self._local, "conn", None)
        if self.opened is not None:
            self.opened.forget()
        if c is not None:
            try:
                c.close()
            finally:
                self._local.conn = None


_HEADER_FDS: dict[tuple[str, int], tuple[int, int, int]] = {}  # (path, pid) -> (fd, st_dev, st_ino)
_HEADER_LOCK = threading.Lock()


def _header_fd(path: Path) -> int:
    """A read-only descriptor of the database file now at ``path``, one per file and process, never closed.

    Never closed on purpose: SQLite's locks are POSIX record locks, which belong to the process, and
    closing *any* descriptor of the file drops all of them — including those of a transaction running
    in another thread. A file replaced at the same path (another inode) gets a new descriptor.
    """
    st = os.stat(path)
    key = (str(path), os.getpid())
    hit = _HEADER_FDS.get(key)
    if hit is not None and hit[1:] == (st.st_dev, st.st_ino):
        return hit[0]
    with _HEADER_LOCK:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        fs = os.fstat(fd)
        _HEADER_FDS[key] = (fd, fs.st_dev, fs.st_ino)
    return fd


class SQLiteDB(_Base):
    """SQLite with a rollback journal; one connection per thread; writers serialise on ``BEGIN IMMEDIATE``.

    Not WAL: WAL memory-maps its ``-shm`` index, and a mapped page the disk cannot back (immutable
    or full data dir) kills the process with SIGBUS; a rollback journal fails with an error
    instead (see :mod:`service.storage`).
    """

    kind = "sqlite"

    def __init__(self, path: Path, timeout: float = 60.0):
        super().__init__()
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.timeout, self.opened = timeout, OpenedFile(self.path)
        try:
            with self.tx(write=True) as t:
                for stmt in SCHEMA:
                    t.q(stmt)
                for table, col, decl in UPGRADES:
                    if col not in {r["name"] for r in t.q(f"PRAGMA table_info({table})")}:
                        _upgrade(t, table, col, decl)
        except (sqlite3.DatabaseError, DamagedDatabaseError) as exc:
            if isinstance(exc, sqlite3.OperationalError):  # locked, read-only or full: service.storage says which
                raise
            self.close()
            why = exc.__context__ if isinstance(exc, DamagedDatabaseError) else exc  # SQLite's own words
            raise IntegrityError(f"{self.path} is not a SQLite registry database ({why})") from None

    def change_counter(self) -> int | None:
        """The file change counter of the database header (bytes 24-27), read with one ``pread``: no lock, no query.

        SQLite increments it whenever the file is unlocked after a transaction modified it (rollback
        journal; the documented way for several processes to notice each other's changes), so an
        unchanged counter means no commit happened since it was read. None in WAL mode (bytes 18-19
        are 2; the counter is not kept there) or when the header cannot be read.
        """
        try:
            head = os.pread(_header_fd(self.path), 28, 0)
        except OSError:
            return None
        if len(head) < 28 or head[18] != 1 or head[19] != 1:
            return None
        return int.from_bytes(head[24:28], "big")

    def damage(self) -> list[str]:
        """``PRAGMA quick_check``'s findings on the file (pages, records, index order): it reads the whole file, so
        it is for ``registry verify``, never per request."""
        try:
            with self.tx() as t:
                return [f"{self.path}: {line}" for line in quick_check_findings(t.q("PRAGMA quick_check"))]
        except DamagedDatabaseError as exc:
            return [str(exc)]

    def _connect(self):
        c = sqlite_connect(self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False)
        self.opened.note()
        c.execute("PRAGMA journal_mode=DELETE")  # no memory-mapped wal-index: no SIGBUS on a bad disk
        c.execute("PRAGMA mmap_size=0")
        c.execute("PRAGMA synchronous=FULL")
        c.execute("PRAGMA foreign_keys=ON")
        c.execute(f"PRAGMA busy_timeout={int(self.timeout * 1000)}")
        c.row_factory = sqlite3.Row
        return c

    @contextmanager
    def tx(self, write: bool = False):
        """A transaction; DamagedDatabaseError (503, exit 2) naming the file when SQLite finds it damaged (was a raw
        DatabaseError: HTTP 500, exit 3, while /readyz said ok)."""
        t0 = time.monotonic()
        try:
            cur = self._conn().cursor()  # a new thread's connection sets its PRAGMAs: locked there too
            cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield _Tx(cur, lambda s: s, named=True)
            except BaseException:
                try:
                    cur.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                raise
            cur.execute("COMMIT")
        except sqlite3.DatabaseError as exc:
            # locked after the whole busy timeout: say so (a quick one, SQLite's deadlock guard, is retried as is)
            if (isinstance(exc, sqlite3.OperationalError) and "database is locked" in str(exc)
                    and time.monotonic() - t0 >= 0.9 * self.timeout):
                raise RegistryLockedError(
                    f"the registry database {self.path} stayed locked by another process for {self.timeout:g} s "
                    "(a backup or a long write holds it): retry later") from exc
            if not sqlite_damaged(exc):
                raise
            raise DamagedDatabaseError(
                f"the registry database {self.path} is damaged ({exc}): `vecbridge registry verify` lists what "
                f"is wrong; restore the file from a backup (one `vecbridge backup` made)") from None

    @staticmethod
    def is_retryable(exc: BaseException) -> bool:
        # not a RegistryLockedError: it waited the busy timeout already (20 more tries were 20 minutes of silence)
        return isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)

    @staticmethod
    def is_unique_violation(exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.IntegrityError) and "UNIQUE" in str(exc)


def _expected_columns() -> dict[str, set[str]]:
    """Table -> the columns :data:`SCHEMA` gives it, less those :data:`UPGRADES` adds to older registries."""
    out = {}
    for table, cols in map(_table_columns, SCHEMA):
        out[table] = set(cols) - {c for t, c, _ in UPGRADES if t == table}
    return out


#: a PostgreSQL URL psycopg cannot parse: its message quotes the text (a password), so this one says nothing of it
_UNPARSABLE = ("the PostgreSQL registry URL cannot be parsed (check its %-escapes, port and options; the URL is not "
               "repeated here: it may hold a password)")


def pg_conninfo(url: str) -> dict:
    """psycopg's ``conninfo_to_dict`` of a PostgreSQL URL (without ``?schema=``); InvalidNameError without the URL's
    text when it cannot be parsed (a bad %-escape was "internal error: ... "p%zzSECRET1"", exit 3) or has an
    unescaped ``@`` in its password (:func:`service.urls.check_pg_userinfo`). ImportError without psycopg."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        check_pg_userinfo(url, "PostgreSQL registry URL")  # libpq would connect to "RET@host" for "S3C@RET@host"
        return conninfo_to_dict(url)
    except InputError as exc:
        raise InvalidNameError(str(exc)) from None
    except (psycopg.ProgrammingError, ValueError):
        raise InvalidNameError(_UNPARSABLE) from None


def _pg_schema(url: str) -> tuple[str, str | None]:
    """``(url without ?schema=, schema or None)``; InvalidNameError for a schema that is not a plain identifier."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schemas = [v for k, v in query if k == "schema"]
    if not schemas:
        return url, None
    schema = schemas[-1]
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", schema):
        raise InvalidNameError(f"registry URL: schema={schema[:70]!r} must be a lower-case identifier "
                               f"(letters, digits, _; at most 63)")
    if any(k == "options" for k, _ in query):
        raise InvalidNameError("registry URL: give the schema as ?schema= or inside options, not both")
    rest = urlencode([(k, v) for k, v in query if k != "schema"])
    return urlunsplit(parts._replace(query=rest)), schema


#: Seconds a PostgreSQL registry may take to accept a connection (the URL's own ``connect_timeout`` wins): a host
#: that does not answer (a partition, a stopped server) is a RegistryUnavailableError after this, instead of
#: holding a thread -- and a service's start-up, where SIGTERM could not stop it -- for the OS's ~2 min TCP timeout
PG_CONNECT_TIMEOUT_S = 10

#: Connections one process keeps to a PostgreSQL registry at most (``VECBRIDGE_REGISTRY_POOL_SIZE``), shared by its
#: threads; a transaction waits for a free one. Its transactions last milliseconds, so a few serve 40 threads; one
#: connection per thread, kept for the thread's life, took 130 sessions for 60 clients on 3 replicas x 2 workers
PG_POOL_SIZE = 8

#: Longest a statement may run or wait for a lock (``VECBRIDGE_REGISTRY_STATEMENT_TIMEOUT_S``; 0: no limit; a
#: ``-c statement_timeout=...`` in the URL's options, a service file's or ``PGOPTIONS`` wins): a request behind
#: another session's lock (a migration, an open psql transaction) is then a 503 instead of holding its thread for as
#: long as the lock lasts
PG_STATEMENT_TIMEOUT_S = 30.0


def statement_timeout_ms(seconds: float) -> int:
    """PostgreSQL's ``statement_timeout`` (ms) for ``seconds``: 0 (no limit) for 0, else at least 1 ms (0.0004 s
    was rounded to 0: no limit at all)."""
    return 0 if seconds == 0 else max(1, round(seconds * 1000))


class _Pool:
    """At most ``size`` connections of one process, lent to one thread for a transaction at a time.

    A thread waits up to ``wait_s`` (None: no limit) for a free connection (RegistryUnavailableError after). An idle
    connection the server has ended (:func:`_dropped`: a restart, a failover) is replaced when lent, a broken
    one dropped when given back. In a forked child the parent's connections are forgotten, never closed (closing
    would end the parent's sessions).
    """

    def __init__(self, connect, size: int, wait_s: float | None):
        self._connect, self.size, self.wait_s = connect, size, wait_s
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._slots = threading.BoundedSemaphore(self.size)
        self._idle: list = []
        self._lock = threading.Lock()

    @contextmanager
    def lease(self):
        if self._pid != os.getpid():
            self._reset()
        if not self._slots.acquire(timeout=self.wait_s):
            raise RegistryUnavailableError(
                f"all {self.size} connections of this process to the PostgreSQL registry stayed busy for "
                f"{self.wait_s:g} s (VECBRIDGE_REGISTRY_POOL_SIZE)")
        c = None
        try:
            with self._lock:
                c = self._idle.pop() if self._idle else None
            if c is not None and (c.closed or c.broken or _dropped(c)):
                _close_quietly(c)
                c = None
            c = c or self._connect()
            yield c
        finally:
            if c is not None:
                if c.closed or c.broken:
                    _close_quietly(c)
                else:
                    with self._lock:
                        self._idle.append(c)
            self._slots.release()

    def close(self) -> None:
        """Close the idle connections (one lent meanwhile is kept by its transaction and closed when given back)."""
        if self._pid != os.getpid():
            return self._reset()
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            _close_quietly(c)


def _close_quietly(conn) -> None:
    with suppress(Exception):  # a connection already gone is what we wanted
        conn.close()


class PostgresDB(_Base):
    """PostgreSQL through psycopg 3; one connection per thread; map rows locked ``FOR UPDATE``.

    The tables live in the connection's current schema (``public`` unless the server or the URL says
    otherwise), or in ``?schema=NAME`` of the URL (created when missing): a database shared with other
    applications gets a schema of its own. Tables of the same names that vecbridge did not create (other
    columns) are refused at open instead of written to.
    """

    kind = "postgresql"
    for_update = " FOR UPDATE"
    byte_order = ' COLLATE "C"'  # not the database's locale: a keyset page must agree with Python's sort
    key_share = " FOR KEY SHARE"

    def __init__(self, url: str, *, pool_size: int | None = None, statement_timeout_s: float | None = None):
        super().__init__()
        try:
            import psycopg  # noqa: F401
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise RegistryError("PostgreSQL registry needs psycopg: pip install 'psycopg[binary]'") from exc
        try:
            self.url, self.schema = _pg_schema(url)
        except InvalidNameError:  # _pg_schema's own (a bad schema name): said as it is
            raise
        except ValueError:  # urlsplit's (e.g. "[::1:port"): the URL is not quoted either
            raise InvalidNameError(_UNPARSABLE) from None
        self._given = pg_conninfo(self.url)
        statement_timeout_s = pgconn.check_statement_timeout(statement_timeout_s)  # "30" was a TypeError, True 1 s
        self.statement_timeout_s = PG_STATEMENT_TIMEOUT_S if statement_timeout_s is None else statement_timeout_s
        if "statement_timeout" in {name for name, _ in option_settings(operator_options(self._given))}:
            self.statement_timeout_s = None  # the URL's, a service file's or PGOPTIONS' own, left to the server
        wait = PG_STATEMENT_TIMEOUT_S if self.statement_timeout_s is None else self.statement_timeout_s
        self._pool = _Pool(self._connect, PG_POOL_SIZE if pool_size is None else pool_size,
                           wait or None)  # 0: no limit here too (the pool waited 30 s)
        try:  # refused after connecting (no CREATE privilege, foreign tables, a client encoding psycopg cannot
            # read): the pool's connection was left open, an idle session on the server, until collected
            with self.tx(write=True) as t:
                t.q("SELECT pg_advisory_xact_lock(74207312)")  # serialise concurrent schema creation
                if self.schema and not t.q("SELECT 1 FROM pg_namespace WHERE nspname = ?", (self.schema,)):
                    t.q(f'CREATE SCHEMA "{self.schema}"')
                have = self._refuse_foreign_tables(t)
                # only what is missing: DDL on an existing table (even ADD COLUMN IF NOT EXISTS) takes ACCESS EXCLUSIVE,
                # which waits for a running pg_dump and meanwhile stops every other replica's reads of that table
                for stmt in SCHEMA:
                    table = re.match(r"CREATE TABLE IF NOT EXISTS (\w+)", stmt)
                    if table is None or table.group(1) not in have:  # any other statement: as written
                        t.q(stmt)
                for table, col, decl in UPGRADES:
                    if col not in have.get(table, ()):
                        _upgrade(t, table, col, decl, "IF NOT EXISTS ")
        except BaseException:
            self.close()
            raise

    def _refuse_foreign_tables(self, t) -> dict[str, set[str]]:
        """The columns of each table now in the registry's schema; ConflictError for tables vecbridge did not make."""
        have: dict[str, set[str]] = {}
        for r in t.q("SELECT table_name, column_name FROM information_schema.columns "
                     "WHERE table_schema = current_schema()"):
            have.setdefault(r[0], set()).add(r[1])
        foreign = [name for name, cols in _expected_columns().items() if name in have and not cols <= have[name]]
        if foreign:
            where = t.one("SELECT current_schema()")[0]
            raise ConflictError(
                f"PostgreSQL schema {where!r} already has tables named {', '.join(foreign)} that vecbridge did not "
                f"create (other columns): give the registry a schema of its own, e.g. add ?schema=vecbridge to "
                f"the registry URL")
        return have

    def _connect(self):
        import psycopg

        ours = [f"-c search_path={self.schema}"] if self.schema else []
        if self.statement_timeout_s is not None:
            ours.append(f"-c statement_timeout={statement_timeout_ms(self.statement_timeout_s)}")
        try:  # after the operator's options (PGOPTIONS, the URL's): an options keyword alone replaced them
            return psycopg.connect(self.url, autocommit=True,  # the schema is the URL's: not PGOPTIONS' search_path
                                   **pg_connect_options(self.url, *ours, drop=("search_path",)))
        except psycopg.OperationalError as exc:
            why = redact(str(exc).strip().splitlines()[0], self.url)  # libpq may quote a piece of the URL
            if "too many" in why:  # "too many clients already", "too many connections for role ..."
                why += (f" (each serving process keeps up to {self._pool.size} connections: lower "
                        f"VECBRIDGE_REGISTRY_POOL_SIZE, or raise the server's max_connections)")
            err = RegistryUnavailableError(f"cannot connect to PostgreSQL registry: {why}")
            if refused_for_good(exc, why):  # a wrong password, role or database: no retry helps (exit 2, no
                err.retry_after = None      # Retry-After), unlike a server down or restarting (exit 75, 503)
            raise err from None

    @contextmanager
    def tx(self, write: bool = False):
        """A transaction on a connection of the pool; one opened inside another on the same thread joins it
        (a savepoint on the same connection: never a second connection, so a full pool cannot deadlock it)."""
        import psycopg

        held = getattr(self._local, "held", None)
        with nullcontext(held) if held is not None else self._pool.lease() as c:
            self._local.held = c
            try:
                with c.transaction(), c.cursor() as cur:
                    yield _Tx(cur, lambda s: s.replace("?", "%s"), named=False)
            except (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable,
                    psycopg.errors.IdleInTransactionSessionTimeout) as exc:  # a URL's lock_timeout: was exit 3
                raise RegistryUnavailableError(
                    f"the PostgreSQL registry did not answer "
                    f"{f'within {self.statement_timeout_s:g} s' if self.statement_timeout_s else 'in time'} "
                    f"({str(exc).strip().splitlines()[0]}): a lock held by another session (a migration, an open "
                    f"transaction) or an overloaded server; retry") from None
            except (psycopg.errors.InsufficientPrivilege, psycopg.errors.ReadOnlySqlTransaction) as exc:
                err = RegistryUnavailableError(  # a read-only role or a standby: was "internal error", exit 3 / 500
                    f"the PostgreSQL registry refused this as user {self._given.get('user') or '(default)'!r}: "
                    f"{str(exc).strip().splitlines()[0]} (the registry's role needs SELECT, INSERT, UPDATE and DELETE "
                    f"on its tables, and CREATE on its schema until they exist; a standby server takes no writes)")
                err.retry_after = None  # the role's grants: no retry helps (no Retry-After)
                raise err from None
            except psycopg.OperationalError as exc:
                if not c.broken:
                    raise
                raise RegistryUnavailableError(  # the pool drops the connection: the next transaction connects afresh
                    f"lost the connection to the PostgreSQL registry: {str(exc).strip().splitlines()[0]}") from None
            finally:
                self._local.held = held

    def close(self) -> None:
        """Close this process's idle connections to the registry."""
        self._pool.close()

    @staticmethod
    def is_retryable(exc: BaseException) -> bool:
        import psycopg.errors as e

        return isinstance(exc, (e.SerializationFailure, e.DeadlockDetected, e.UniqueViolation))

    @staticmethod
    def is_unique_violation(exc: BaseException) -> bool:
        import psycopg.errors as e

        return isinstance(exc, e.UniqueViolation)


def _dropped(conn) -> bool:
    """Whether the server has spoken on an idle connection: with autocommit and no LISTEN it only does so to
    end it (a restart, a failover, ``pg_terminate_backend``), and the next query would fail. One ``select``, no
    round trip; reconnecting on a stray message instead is harmless."""
    try:
        return bool(select.select([conn.fileno()], [], [], 0)[0])
    except (OSError, ValueError):
        return True


def sqlite_path(url: str) -> Path | None:
    """The database file of a ``sqlite:///`` registry URL (None for any other URL); InvalidNameError when it
    names a folder."""
    if not url.startswith("sqlite:///"):
        return None
    path = url[len("sqlite:///"):]
    if not path or path.endswith("/") or Path(path).is_dir():
        raise InvalidNameError(f"registry URL {url[:60]!r} names a folder, not a database file: "
                               "use sqlite:///relative/registry.sqlite or sqlite:////absolute/registry.sqlite")
    return Path(path).expanduser()  # sqlite:///~/vb.sqlite: the home folder's, as for --data-dir


def open_db(url: str, *, pool_size: int | None = None, statement_timeout_s: float | None = None):
    """``sqlite:///relative/path.sqlite``, ``sqlite:////abs/path.sqlite`` or ``postgresql://user@host:port/db``;
    InvalidNameError for any other URL, or one that names a folder. ``pool_size`` and ``statement_timeout_s``
    apply to PostgreSQL (None: :data:`PG_POOL_SIZE`, :data:`PG_STATEMENT_TIMEOUT_S`)."""
    from ..config import check_registry_url

    try:  # the settings' own check: it names the scheme only, never the rest (it may hold a password)
        check_registry_url(url)
    except ValueError as exc:
        raise InvalidNameError(str(exc)) from None
    path = sqlite_path(url)
    if path is not None:
        return SQLiteDB(path)
    return PostgresDB(url, pool_size=pool_size, statement_timeout_s=statement_timeout_s)
