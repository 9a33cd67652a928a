"""What both registry backends (:mod:`service.registry.db`) share: the tiny interface
``with db.tx(write=True) as t: t.q(sql, params)``, its rows readable by column name, and the per-thread
connection of :class:`BaseDB`."""

from __future__ import annotations

import os
import threading

from ..storage import OpenedFile
from .schema import PROBE_SQL

__all__ = ["Row", "Tx", "BaseDB"]


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


class Tx:
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


class BaseDB:
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
