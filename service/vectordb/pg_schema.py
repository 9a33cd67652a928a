"""What a pgvector migration target takes from its source table besides its columns.

A migrated table serves the same queries as its source once an alias switches to it, so it keeps the source's
vector index, column rules and the structures those queries lean on:

- :func:`vector_indexes` / :func:`plain_index` — the HNSW / IVFFlat indexes of a table and the one of its vector
  column itself: ``(method, options)``, which :meth:`PgVectorStore.finalize` builds on the target alike.

- :func:`column_rules` — ``NOT NULL`` and ``DEFAULT`` of each extra column (in ``CREATE TABLE``); generated and
  identity columns keep only ``NOT NULL`` (their values are copied as they are).
- :func:`copy_structures` — after the rows are in (one build instead of one update per row): the source's
  ``UNIQUE``, ``CHECK``, ``FOREIGN KEY`` and exclusion constraints (not those on the vector column: they speak of
  the old vectors, e.g. their dimension), then its other indexes (a btree on a filter
  column, a GIN on a jsonb field, partial and expression indexes), each under a name of the target. The primary
  key and the vector column's own indexes are the store's (:meth:`PgVectorStore.create` / ``finalize``).

Names: an object called ``<source>_x`` becomes ``<target>_x``, any other ``<target>_<name>``; cut to PostgreSQL's
63 bytes. Every step is idempotent (a rerun after a crash inside ``finalize`` adds what is missing).
"""

from __future__ import annotations

import re

__all__ = ["DISTANCE_OPS", "INDEX_OPTIONS", "OPS_METRIC", "column_rules", "copy_structures", "kept_opclass",
           "plain_index", "plain_opclass", "vector_indexes"]

_CREATE_INDEX = re.compile(r"^(CREATE (?:UNIQUE )?INDEX) \S+ ON (?:ONLY )?\S+ (USING .*)$", re.DOTALL)
INDEX_OPTIONS = {"hnsw": ("m", "ef_construction"), "ivfflat": ("lists",)}  # the WITH options a target copies
#: an index's operator class (less its vector type): the metric it serves
OPS_METRIC = {"cosine_ops": "cosine", "ip_ops": "ip", "l2_ops": "l2", "l1_ops": "l1"}
#: metrics no vecbridge table records but a user's table's index can serve: the distance operator that searches them
DISTANCE_OPS = {"l2": "<->", "l1": "<+>"}
_PG_INDEX_DEFAULTS = {"m": 16, "ef_construction": 64, "lists": 100}  # pgvector's own, for an option not given


def vector_indexes(conn, table: str, vector_field: str) -> list[tuple[str, list | None, bool, str]]:
    """``(method, reloptions, plain, opclass)`` of every HNSW / IVFFlat index on ``table`` (in the current schema),
    ``plain`` when it indexes ``vector_field`` itself (not an expression of it, e.g. ``(embedding::halfvec(384))``),
    ``opclass`` its operator class (``vector_cosine_ops``, ``halfvec_ip_ops``, ``vector_l2_ops``: the distance it
    serves)."""
    return [(str(m), o, bool(plain), str(opc)) for m, o, plain, opc in conn.execute(
        "SELECT am.amname, c.reloptions, coalesce(i.indnatts = 1 AND a.attname = %s, false), "
        "(SELECT opc.opcname FROM pg_opclass opc WHERE opc.oid = i.indclass[0]) "
        "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am am ON am.oid = c.relam "
        "JOIN pg_class t ON t.oid = i.indrelid JOIN pg_namespace n ON n.oid = t.relnamespace "
        "LEFT JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = i.indkey[0] "
        "WHERE t.relname = %s AND n.nspname = current_schema() AND am.amname IN ('hnsw', 'ivfflat') "
        "ORDER BY c.relname", (vector_field, table))]


def plain_index(found: list[tuple[str, list | None, bool, str]]) -> tuple[str, dict[str, int]] | None:
    """The first index of the vector column itself among :func:`vector_indexes`' answer: ``(method, options)``, an
    option it was built without at pgvector's default; None when there is none."""
    for method, reloptions, plain, _ in found:
        if plain:
            opts = dict(o.split("=", 1) for o in reloptions or [] if "=" in o)
            return method, {k: int(opts[k]) if str(opts.get(k, "")).isdigit() else _PG_INDEX_DEFAULTS[k]
                            for k in INDEX_OPTIONS[method]}
    return None


def plain_opclass(found: list[tuple[str, list | None, bool, str]]) -> str | None:
    """The operator class of :func:`plain_index`'s index less its vector type (``cosine_ops``, ``ip_ops``,
    ``l2_ops``, ``l1_ops``), None when there is none."""
    return next((opc.split("_", 1)[1] for _, _, plain, opc in found if plain and "_" in opc), None)


def kept_opclass(found: list[tuple[str, list | None, bool, str]], spec, metric: str) -> str | None:
    """The operator class (less its vector type) of the source index :func:`plain_index` reads from ``found`` when a
    target of ``metric`` built as ``spec`` keeps it: ``spec`` is that index and it serves ``metric`` or a distance no
    table records (``l2_ops``, ``l1_ops``: on the unit rows a map writes L2 ranks as cosine does, and the source's
    ``<->`` queries keep their index; vecbridge's own cosine search of it reads every row); None: the target's
    metric's own."""
    src = plain_opclass(found) if spec is not None and plain_index(found) == spec else None
    return src if src is not None and OPS_METRIC.get(src) in (metric, *DISTANCE_OPS) else None


def _regclass(table: str) -> str:
    return f'"{table}"'  # the caller checked the name (no quote can be in it)


def _renamed(name: str, source: str, target: str) -> str:
    """``name`` of an object of ``source`` as the same object of ``target`` is called."""
    rest = name[len(source) + 1:] if name.startswith(source + "_") else name
    return f"{target}_{rest}".encode()[:63].decode(errors="ignore")


def column_rules(conn, table: str, columns: list[str]) -> dict[str, str]:
    """``{column: " NOT NULL DEFAULT expr"}`` (either part may be absent; ``""`` for neither) of ``columns`` of
    ``table``, as SQL to append to the column's type."""
    rows = conn.execute(
        "SELECT a.attname, a.attnotnull, a.attgenerated, a.attidentity, pg_get_expr(d.adbin, d.adrelid) "
        "FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
        "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped", (_regclass(table),)).fetchall()
    out = {}
    for col, notnull, generated, identity, default in rows:
        if col in columns:
            plain = not generated and not identity  # a generated value or identity is copied as a plain value
            out[col] = (" NOT NULL" if notnull else "") + (f" DEFAULT {default}" if default and plain else "")
    return out


def copy_structures(conn, source: str, target: str, vector_field: str) -> list[str]:
    """Add ``source``'s constraints and secondary indexes to ``target`` (see the module docs); the names added."""
    added = []
    vec = conn.execute("SELECT attnum FROM pg_attribute WHERE attrelid = %s::regclass AND attname = %s",
                       (_regclass(source), vector_field)).fetchone()
    vec = None if vec is None else int(vec[0])
    have = {r[0] for r in conn.execute("SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass",
                                       (_regclass(target),))}
    for name, definition, keys in conn.execute(
            "SELECT conname, pg_get_constraintdef(oid), conkey::int2[] FROM pg_constraint WHERE conrelid = "
            "%s::regclass AND contype IN ('u', 'c', 'f', 'x') ORDER BY conname", (_regclass(source),)).fetchall():
        new = _renamed(name, source, target)
        if vec in (keys or []) or new in have:  # a rule on the old vectors (CHECK (vector_dims(...) = 384)) would
            continue  # refuse the new ones
        conn.execute(f'ALTER TABLE "{target}" ADD CONSTRAINT "{new}" {definition}')
        added.append(new)
    for name, definition, keys in conn.execute(
            "SELECT c.relname, pg_get_indexdef(i.indexrelid), i.indkey::int2[] FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am m ON m.oid = c.relam "
            "WHERE i.indrelid = %s::regclass AND NOT i.indisprimary AND m.amname NOT IN ('hnsw', 'ivfflat') "
            "AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid) ORDER BY c.relname",
            (_regclass(source),)).fetchall():
        if vec in (keys or []):  # an index of the vector column: the store builds its own
            continue
        m = _CREATE_INDEX.match(definition)
        if m is None:  # not a shape pg_get_indexdef gives; left out rather than guessed at
            continue
        new = _renamed(name, source, target)
        conn.execute(f'{m.group(1).replace("INDEX", "INDEX IF NOT EXISTS", 1)} "{new}" ON "{target}" {m.group(2)}')
        added.append(new)
    return added
