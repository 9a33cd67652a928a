"""SQL backends: SQLite (rollback journal, ``BEGIN IMMEDIATE``) and PostgreSQL (psycopg 3, row locks).

Both expose the same tiny interface: ``with db.tx(write=True) as t: t.q(sql, params)``. SQL is
written once with ``?`` placeholders; the PostgreSQL backend rewrites them to ``%s``. Write
transactions are serialised per map by the database: SQLite takes its single write lock at
``BEGIN IMMEDIATE``; PostgreSQL locks the map's row (``SELECT ... FOR UPDATE``), and a unique
key on ``(name, version)`` backs both up. Transient conflicts are retried by the caller.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from ..copies import quick_check_findings
from ..storage import OpenedFile, sqlite_connect, sqlite_damaged
from .backend import BaseDB, Row, Tx
from .errors import DamagedDatabaseError, IntegrityError, InvalidNameError, RegistryLockedError
from .postgres import (  # re-exported; the PostgreSQL settings (PG_*_S, PG_POOL_SIZE) are read from postgres.py only
    PostgresDB,
    pg_conninfo,
    statement_timeout_ms,
)
from .schema import SCHEMA, UPGRADES, add_column

__all__ = ["open_db", "pg_conninfo", "sqlite_path", "SQLiteDB", "PostgresDB", "SCHEMA", "UPGRADES", "Row", "Tx",
           "BaseDB", "statement_timeout_ms"]

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


class SQLiteDB(BaseDB):
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
                        add_column(t, table, col, decl)
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
                yield Tx(cur, lambda s: s, named=True)
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
    apply to PostgreSQL (None: :data:`~.postgres.PG_POOL_SIZE`, :data:`~.postgres.PG_STATEMENT_TIMEOUT_S`)."""
    from ..config import check_registry_url

    try:  # the settings' own check: it names the scheme only, never the rest (it may hold a password)
        check_registry_url(url)
    except ValueError as exc:
        raise InvalidNameError(str(exc)) from None
    path = sqlite_path(url)
    if path is not None:
        return SQLiteDB(path)
    return PostgresDB(url, pool_size=pool_size, statement_timeout_s=statement_timeout_s)
