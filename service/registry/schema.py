"""The registry's tables, written once for both backends (:mod:`service.registry.db`): :data:`SCHEMA`, the
columns :data:`UPGRADES` adds to an older registry on open, and the readiness probe's statement."""

from __future__ import annotations

import re
from datetime import UTC, datetime

__all__ = ["SCHEMA", "UPGRADES", "BACKFILLS", "PROBE_SQL", "add_column", "table_columns", "expected_columns"]

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


def add_column(t, table: str, col: str, decl: str, exists: str = "") -> None:
    """Add column ``col`` to ``table`` (``exists``: PostgreSQL's ``IF NOT EXISTS``) and fill it (:data:`BACKFILLS`)."""
    t.q(f"ALTER TABLE {table} ADD COLUMN {exists}{col} {decl}")
    if (table, col) in BACKFILLS:
        t.q(BACKFILLS[table, col], (datetime.now(UTC).isoformat(timespec="microseconds"),))


def table_columns(stmt: str) -> tuple[str, list[str]]:
    """``(table, its columns in order)`` of a ``CREATE TABLE`` statement of :data:`SCHEMA`."""
    table, body = re.match(r"CREATE TABLE IF NOT EXISTS (\w+) \((.*)\)$", stmt, re.DOTALL).groups()
    parts = re.split(r",(?![^()]*\))", body)  # commas outside parentheses
    return table, [p.split()[0] for p in parts if p.split()[0] not in ("PRIMARY", "FOREIGN", "UNIQUE")]


#: the readiness probe: every table's first key (its primary-key index) and a first row (a column no index holds),
#: one statement reading root and first leaf pages only, so it costs the same on any registry
PROBE_SQL = "SELECT " + ", ".join(f"(SELECT MIN({cols[0]}) FROM {table}), (SELECT {cols[-1]} FROM {table} LIMIT 1)"
                                  for table, cols in map(table_columns, SCHEMA))


def expected_columns() -> dict[str, set[str]]:
    """Table -> the columns :data:`SCHEMA` gives it, less those :data:`UPGRADES` adds to older registries."""
    out = {}
    for table, cols in map(table_columns, SCHEMA):
        out[table] = set(cols) - {c for t, c, _ in UPGRADES if t == table}
    return out
