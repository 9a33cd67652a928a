"""The PostgreSQL registry backend (psycopg 3, row locks; :mod:`service.registry.db` opens it): its URL's
parsing (``?schema=``), connect and statement timeouts, a pool of connections per process."""

from __future__ import annotations

import os
import re
import select
import threading
from contextlib import contextmanager, nullcontext, suppress

from align.exceptions import InputError

from .. import pgconn
from ..pgconn import operator_options, option_settings, pg_connect_options
from ..urls import check_pg_userinfo, redact
from .backend import BaseDB, Tx
from .errors import ConflictError, InvalidNameError, RegistryError, RegistryUnavailableError
from .schema import SCHEMA, UPGRADES, add_column, expected_columns

__all__ = ["PostgresDB", "pg_conninfo", "refused_for_good", "statement_timeout_ms", "PG_CONNECT_TIMEOUT_S",
           "PG_POOL_SIZE", "PG_STATEMENT_TIMEOUT_S"]

#: libpq's words for a connection the server refused for good: a retry without its operator acting gets the same
#: ("no password supplied": a URL without a password on a server asking for one, libpq's own words, no SQLSTATE)
_REFUSED_FOR_GOOD = ("authentication failed", "no pg_hba.conf entry", "does not exist", "no password supplied")


def refused_for_good(exc: Exception, why: str) -> bool:
    """Whether a failed PostgreSQL connect is one its operator must fix (a password, a role, a database that does
    not exist: SQLSTATE class 28 or 3D000, or libpq's words for them), not a server that may come back."""
    state = getattr(exc, "sqlstate", None) or ""
    return state.startswith("28") or state == "3D000" or any(w in why for w in _REFUSED_FOR_GOOD)


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


class PostgresDB(BaseDB):
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
                        add_column(t, table, col, decl, "IF NOT EXISTS ")
        except BaseException:
            self.close()
            raise

    def _refuse_foreign_tables(self, t) -> dict[str, set[str]]:
        """The columns of each table now in the registry's schema; ConflictError for tables vecbridge did not make."""
        have: dict[str, set[str]] = {}
        for r in t.q("SELECT table_name, column_name FROM information_schema.columns "
                     "WHERE table_schema = current_schema()"):
            have.setdefault(r[0], set()).add(r[1])
        foreign = [name for name, cols in expected_columns().items() if name in have and not cols <= have[name]]
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
                    yield Tx(cur, lambda s: s.replace("?", "%s"), named=False)
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
