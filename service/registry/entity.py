"""The version lifecycle, written once for every kind of versioned entity (maps, steers).

A *kind* (:class:`Kind`) names its tables and its record class and says what is special about it:
the columns a name is bound to (a map's two spaces, a steer's space), whether versions carry
tags, and how its artifact bytes are parsed. :class:`VersionedStore` does the rest, the same for
every kind:

- **register**: one write transaction creates the name row if new, locks it (SQLite's write lock,
  PostgreSQL's ``FOR UPDATE``), checks the binding, allocates ``last_version + 1``, inserts the
  version row, its tags and alias (the artifact was stored content-addressed before);
- **resolve** ``name`` (latest live version), ``name@alias``, ``name:N``; soft-deleted versions do
  not resolve (DeletedVersionError);
- **aliases** (set / move / delete), **tags** (maps), **soft delete** (``deleted_at``; ``registry gc`` removes
  the files later: :mod:`.gc`), **list**, **summaries**;
- **load**: the artifact read through one LRU cache keyed by its sha256 (immutable), verified; the cache
  (:mod:`.cache`) is bounded by the bytes of the arrays it holds.

Rows are decoded by column name into the records of :mod:`.models`.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

from align.exceptions import InputError, SerializationError

from ..errors import did_you_mean, listed
from .cache import LRUCache
from .elsewhere import VERDICT_S, artifacts_elsewhere, refuse_elsewhere
from .errors import (
    AliasMovedError,
    ArtifactsElsewhereError,
    ConflictError,
    DeletedVersionError,
    IntegrityError,
    NotFoundError,
    unknown,
)
from .models import Record, SteerInfo, VersionInfo, columns, from_row, to_columns
from .names import (
    MAX_VERSION,
    check_alias,
    check_name,
    check_tag_count,
    check_tag_key,
    check_tag_value,
    parse_ref,
    utf8_safe,
)

__all__ = ["Kind", "MAPS", "STEERS", "KINDS", "VERSION_TABLES", "VersionedStore", "LRUCache", "artifacts_in_use",
           "collected", "now", "package_version"]


#: the most names :meth:`VersionedStore.among` lists in a statement (SQLite's oldest limit is 999 parameters)
_AMONG = 500


def now() -> str:
    """The current UTC time as ISO 8601 with microseconds (the registry's timestamps)."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def package_version() -> str:
    """Installed vecbridge version (``importlib.metadata``), or ``"unknown"``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vecbridge")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "unknown"


def _expected(expected) -> str | tuple[int, ...]:
    """``expected`` of a compare-and-set alias write: ``"*"`` or a tuple of versions (0: not set); InputError
    for anything else."""
    if isinstance(expected, str) and expected == "*":
        return "*"
    values = (expected,) if isinstance(expected, (int, str)) else tuple(expected)
    try:
        out = tuple(sorted({int(v) for v in values}))
    except (TypeError, ValueError):
        raise InputError(f"expected must be a version number, a collection of them or '*', got {expected!r}") from None
    if any(not 0 <= v <= MAX_VERSION for v in out) or (0 in out and len(out) > 1):
        raise InputError(f"expected versions must be 1 .. {MAX_VERSION} (or only 0: not set), got {expected!r}")
    return out


def _pointing(want) -> tuple[str, tuple]:
    """SQL condition (and its arguments) on an alias row's ``version`` for ``want`` (:func:`_expected`, not 0)."""
    if want == "*":
        return "", ()
    if not want:
        return " AND 1 = 0", ()
    return f" AND version IN ({', '.join('?' * len(want))})", tuple(want)


def _parse_map(data, rank: int):
    """A LinearMap or a ClusterMap, by the artifact's header (:func:`align.map_from_bytes`)."""
    from align import map_from_bytes

    return map_from_bytes(data)


def _parse_steer(data, rank: int):
    from align.steer import MeanShift, Steer

    return (Steer if rank > 0 else MeanShift).from_bytes(data)


@dataclass(frozen=True)
class Kind:
    """What distinguishes one kind of versioned entity; see the module docstring."""

    noun: str                           # "map", "steer": used in messages
    names: str                          # table with one row per name (binding, last_version)
    table: str                          # table of versions
    aliases: str                        # table of aliases
    tags: str | None                    # table of tags, None when the kind has none
    record: type                        # the record class (a models.Record)
    binding: tuple[str, ...]            # name-row columns every version of a name shares
    name_cols: tuple[str, ...]          # columns copied into the name row on first use
    verb: str                           # how a binding reads: "map 'x' connects a -> b"
    show: Callable[[dict], str]         # the binding's values as text
    parse: Callable[[bytes, int], object]  # artifact bytes or open file (and the recorded rank) -> object
    dims: tuple[str, ...]               # record fields the parsed artifact must match (attributes; absent = 0)
    #                                     (for maps also its kind and cluster count: a bundle cannot relabel them)


MAPS = Kind("map", "maps", "versions", "aliases", "tags", VersionInfo, ("source_space", "target_space"),
            ("source_space", "target_space", "source_dim", "target_dim"), "connects",
            lambda b: f"{b['source_space']} -> {b['target_space']}", _parse_map,
            ("source_dim", "target_dim", "map_kind", "n_clusters"))
STEERS = Kind("steer", "steer_names", "steers", "steer_aliases", None, SteerInfo, ("space",), ("space", "dim"),
              "lives in space", lambda b: repr(b["space"]), _parse_steer, ("dim", "rank"))
KINDS = {"maps": MAPS, "steers": STEERS}
#: the tables of every kind's versions (:func:`~service.registry.elsewhere.artifacts_elsewhere` samples them)
VERSION_TABLES = tuple(k.table for k in KINDS.values())
#: ``(noun, aliases table, versions table)`` of every kind (:func:`~service.registry.elsewhere.aliased_missing`)
ALIAS_TABLES = tuple((k.noun, k.aliases, k.table) for k in KINDS.values())


def collected(v) -> str:
    """What a message about deleted version ``v`` adds when ``registry gc`` removed its files."""
    return f" and its files collected (`vecbridge registry gc`, {v.collected_at[:19]})" if v.collected_at else ""


def artifacts_in_use(db) -> set[str]:
    """The artifact paths every committed version of every kind names (what :meth:`ArtifactStore.discard` keeps), but
    for versions whose files ``registry gc`` collected: the file such a row names is gone, and one a write stored
    again with its bytes (an import that does not restore the version, a failed fit) no longer belongs to it."""
    with db.tx() as t:
        return {r["artifact_path"] for k in KINDS.values()
                for r in t.q(f"SELECT artifact_path FROM {k.table} WHERE collected_at IS NULL")}


class VersionedStore:
    """The lifecycle of one kind's versions over a registry's database, writer and artifact store.

    ``write(fn)`` runs ``fn(t)`` in a retried write transaction; ``hook(point)`` is the crash-test
    hook called at each step of the write path.
    """

    def __init__(self, kind: Kind, db, store, cache: LRUCache, write: Callable, hook: Callable[[str], None]):
        self.kind, self.db, self.store, self.cache = kind, db, store, cache
        self._write, self._hook = write, hook
        self._cols = ", ".join(columns(kind.record))

    def check(self, name: str) -> str:
        return check_name(name, f"{self.kind.noun} name")

    # --- inside a transaction (also used by bundle import) ------------------------------------
    def bind(self, t, name: str, values: dict, *, created: str, here: str = "") -> None:
        """Create ``name``'s row if new and lock it; ConflictError when it is bound elsewhere.

        ``values`` holds at least the kind's ``name_cols``; ``here`` words the conflict message
        (`` here, the bundle says`` for imports).
        """
        k = self.kind
        cols = ("name", *k.name_cols, "created_at")
        t.q(f"INSERT INTO {k.names} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))}) "
            "ON CONFLICT (name) DO NOTHING", (name, *(values[c] for c in k.name_cols), created))
        have = t.one(f"SELECT {', '.join(k.binding)} FROM {k.names} WHERE name = ?" + self.db.for_update, (name,))
        if any(have[c] != values[c] for c in k.binding):
            raise ConflictError(f"{k.noun} {name!r} {k.verb} {k.show(have)}{here or ', not'} {k.show(values)}")

    def allocate(self, t, name: str) -> int:
        """``last_version + 1`` of ``name`` (row-locked by :meth:`bind`), stored.

        Call inside the write transaction that inserts the version row: the lock serialises
        writers of one name, so numbers never repeat.
        """
        r = t.one(f"SELECT last_version FROM {self.kind.names} WHERE name = ?" + self.db.for_update, (name,))
        version = int(r["last_version"]) + 1
        t.q(f"UPDATE {self.kind.names} SET last_version = ? WHERE name = ?", (version, name))
        self._hook("version_allocated")
        return version

    def claim(self, t, name: str, version: int) -> None:
        """Raise ``last_version`` to at least ``version`` (an imported version keeps its number)."""
        t.q(f"UPDATE {self.kind.names} SET last_version = ? WHERE name = ? AND last_version < ?",
            (version, name, version))

    def insert(self, t, name: str, version: int, values: dict, tags: dict | None = None) -> None:
        """Insert version row ``name:version`` from field values (encoded per :func:`.models.to_columns`)."""
        row = {**to_columns(self.kind.record, values), "name": name, "version": int(version)}
        if row.get("deleted") and not row.get("deleted_at"):  # imported deleted: ``registry gc``'s clock starts here
            row["deleted_at"] = now()
        t.q(f"INSERT INTO {self.kind.table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
            tuple(row.values()))
        for key, value in (tags or {}).items():
            t.q(f"INSERT INTO {self.kind.tags} (name, version, key, value) VALUES (?, ?, ?, ?)",
                (name, int(version), key, value))

    def sha_of(self, t, name: str, version: int) -> str | None:
        r = t.one(f"SELECT artifact_sha256 FROM {self.kind.table} WHERE name = ? AND version = ?", (name, version))
        return None if r is None else r["artifact_sha256"]

    def copy_of(self, t, name: str, sha: str, created_at: str) -> int | None:
        """The version of ``name`` with this artifact and creation time (a version imported before under
        another number), else None."""
        r = t.one(f"SELECT MIN(version) AS v FROM {self.kind.table} WHERE name = ? AND artifact_sha256 = ? "
                  "AND created_at = ?", (name, sha, created_at))
        return None if r is None or r["v"] is None else int(r["v"])

    def put_alias(self, t, name: str, alias: str, version: int, *, move: bool = True) -> bool:
        """Point ``name@alias`` at ``version``; with ``move=False`` an existing alias is kept. True if written.

        One statement either way: a check before the insert would let PostgreSQL (READ COMMITTED) overwrite an
        alias another transaction created meanwhile, the very alias ``move=False`` promised to keep.
        """
        a = self.kind.aliases
        if not move:
            row = t.one(f"INSERT INTO {a} (name, alias, version) VALUES (?, ?, ?) "
                        "ON CONFLICT (name, alias) DO NOTHING RETURNING version", (name, alias, int(version)))
            return row is not None
        t.q(f"INSERT INTO {a} (name, alias, version) VALUES (?, ?, ?) "
            "ON CONFLICT (name, alias) DO UPDATE SET version = excluded.version", (name, alias, int(version)))
        return True

    def decode(self, t, row) -> Record:
        """The record of a version row, with its current aliases (and tags)."""
        k, name, version = self.kind, row["name"], int(row["version"])
        extra = {"aliases": [a["alias"] for a in t.q(f"SELECT alias FROM {k.aliases} WHERE name = ? AND version = ? "
                                                     "ORDER BY alias", (name, version))]}
        if k.tags:
            extra["tags"] = {r["key"]: r["value"] for r in t.q(
                f"SELECT key, value FROM {k.tags} WHERE name = ? AND version = ? ORDER BY key", (name, version))}
        return from_row(k.record, row, **extra)

    def exists(self, t, name: str) -> bool:
        return t.one(f"SELECT 1 FROM {self.kind.names} WHERE name = ?", (name,)) is not None

    def _require(self, t, name: str) -> None:
        if not self.exists(t, name):
            raise unknown(t, self.kind.names, self.kind.noun, name)

    def get_in(self, t, name: str, version: int) -> Record:
        if not 1 <= int(version) <= MAX_VERSION:  # past the database's INTEGER: no such version, not an overflow
            self._require(t, name)
            raise NotFoundError(f"{self.kind.noun} {name!r} has no version {version}")
        r = t.one(f"SELECT {self._cols} FROM {self.kind.table} WHERE name = ? AND version = ?", (name, int(version)))
        if r is None:
            self._require(t, name)
            raise NotFoundError(f"{self.kind.noun} {name!r} has no version {version}")
        return self.decode(t, r)

    def rows(self, t, name: str, *, live: bool = False, newest_first: bool = False, cols: str | None = None) -> list:
        """``name``'s version rows (every column, or ``cols``), oldest first unless ``newest_first``."""
        live_only = " AND deleted = 0" if live else ""
        return t.q(f"SELECT {cols or self._cols} FROM {self.kind.table} WHERE name = ?{live_only} "
                   f"ORDER BY version{' DESC' if newest_first else ''}", (name,))

    def live_alias(self, t, name: str, alias: str) -> int | None:
        """The version ``name@alias`` points at when that version is live, else None."""
        k = self.kind
        r = t.one(f"SELECT a.version FROM {k.aliases} a JOIN {k.table} v ON v.name = a.name AND v.version = a.version "
                  "WHERE a.name = ? AND a.alias = ? AND v.deleted = 0", (name, alias))
        return None if r is None else int(r["version"])

    # --- register -----------------------------------------------------------------------------
    def register(self, name: str, values: dict, artifact: tuple[bytes, str], *, alias: str | None = None,
                 tags: dict | None = None, before: Callable | None = None) -> Record:
        """Store ``artifact`` (bytes, file extension), then the next version of ``name`` from field ``values``;
        atomic.

        ``before(t)`` runs first in the same transaction (e.g. creating the spaces). A write that fails removes the
        artifact it stored (:meth:`ArtifactStore.discard`: not one a committed version names or another writer holds).
        An error from the commit itself or from the read-back after it carries ``vecbridge_maybe_committed`` (the
        version may exist: :func:`service.registry.retry.may_have_committed`); one before the rows were written not.
        """
        created = values["created_at"]
        if "inputs" in values:  # a file name that is not UTF-8 (see utf8_safe): every answer naming it was a 500
            values = {**values, "inputs": utf8_safe(values["inputs"])}

        def fn(t):
            if before is not None:
                before(t)
            self.bind(t, name, values, created=created)
            version = self.allocate(t, name)
            self.insert(t, name, version, values, tags)
            if alias is not None:
                self.put_alias(t, name, alias, version)
            self._hook("version_inserted")
            written.append(version)  # from here an error may come with or after the commit
            return version

        stored: list[str] = []  # what put_new wrote, listed before its write: it may raise after the rename
        written: list[int] = []
        # an artifact no other replica can read, the alias moved to it: refused before anything is stored
        refuse_elsewhere(self.db, self.store, VERSION_TABLES, f"{self.kind.noun} {name!r} was not registered")
        try:
            with self.store.pinned():  # to the commit: a failed write never removes the artifact under this version
                sha, rel, _ = self.store.put_new(*artifact, written=stored)
                self._hook("artifact_stored")  # stored (or found there), not yet named by a row: gc keeps it (pinned)
                values = {**values, "artifact_sha256": sha, "artifact_path": rel}
                version = self._write(fn)
        except BaseException as exc:  # e.g. a full disk at the commit: the artifact it stored leaked, ~0.6 MB a retry
            if written:
                exc.vecbridge_maybe_committed = True
            if stored:
                with suppress(Exception):  # best effort (the database may be what failed): never hides the error
                    self.store.discard(stored, lambda: artifacts_in_use(self.db))
            raise
        try:
            self._hook("committed")
            return self.get(name, version)
        except Exception as exc:  # the version was committed: its answer is what was lost
            exc.vecbridge_maybe_committed = True
            raise

    # --- read ---------------------------------------------------------------------------------
    def get(self, name: str, version: int) -> Record:
        """The version record (deleted ones included, flagged)."""
        self.check(name)
        with self.db.tx() as t:
            return self.get_in(t, name, version)

    def list(self, name: str, include_deleted: bool = True) -> list[Record]:
        self.check(name)
        with self.db.tx() as t:
            self._require(t, name)
            out = [self.decode(t, r) for r in self.rows(t, name)]
        return [v for v in out if include_deleted or not v.deleted]

    def resolve(self, ref: str, *, pin: str | None = None) -> Record:
        """``name`` → its live ``pin`` alias's version when ``pin`` is given and set, else the latest live
        version; ``name@alias`` → the alias's version; ``name:N`` → version N.

        NotFoundError for unknown names/aliases/versions; DeletedVersionError (a NotFoundError)
        when the version, or the alias's version, was deleted.
        """
        noun = self.kind.noun
        name, alias, version = parse_ref(ref, noun)
        with self.db.tx() as t:
            if pin is not None and alias is None and version is None:
                version = self.live_alias(t, name, pin)
            self._require(t, name)
            if alias is not None:
                r = t.one(f"SELECT version FROM {self.kind.aliases} WHERE name = ? AND alias = ?", (name, alias))
                if r is None:
                    raise self._no_alias(t, name, alias)
                v = self.get_in(t, name, int(r["version"]))
                if v.deleted:
                    raise DeletedVersionError(f"alias {name}@{alias} points at version {v.version}, which was "
                                              f"deleted{collected(v)}")
                return v
            if version is None:
                r = t.one(f"SELECT MAX(version) AS latest FROM {self.kind.table} WHERE name = ? AND deleted = 0",
                          (name,))
                if r is None or r["latest"] is None:
                    raise NotFoundError(f"{noun} {name!r} has no live versions")
                version = int(r["latest"])
            v = self.get_in(t, name, version)
        if v.deleted:
            raise DeletedVersionError(f"version {version} of {noun} {name!r} was deleted{collected(v)}")
        return v

    def load(self, ref):
        """Resolve ``ref`` (or take a record) and return its artifact, read once per sha256 and verified."""
        v = ref if isinstance(ref, self.kind.record) else self.resolve(ref)
        if v.collected_at:  # its file may be gone (or another's again): never read, whatever is there
            raise DeletedVersionError(f"{self.kind.noun} {v.ref} was deleted{collected(v)}")

        def make():  # verified, then read from the open file: never the file's bytes beside the arrays
            try:
                with self.store.opened(v.artifact_path, v.artifact_sha256) as fh:
                    try:
                        return self.kind.parse(fh, getattr(v, "rank", 0))
                    except SerializationError as exc:
                        raise IntegrityError(f"artifact of {self.kind.noun} {v.ref} cannot be read: {exc}") from None
            except IntegrityError as exc:  # deleted and collected since it resolved (another process): gone
                now_v = self.get(v.name, v.version)
                if now_v.collected_at:
                    raise DeletedVersionError(f"{self.kind.noun} {v.ref} was deleted{collected(now_v)}") from None
                gone = self.store.size(v.artifact_path) is None  # the verdict is kept: not a query per transform
                if gone and (why := artifacts_elsewhere(self.db, self.store, VERSION_TABLES, max_age=VERDICT_S,
                                                        said=True)):  # raised below: the warning names the folder
                    raise ArtifactsElsewhereError(f"{exc}; {why}") from None
                raise

        return self.cache.get((self.kind.noun, v.artifact_sha256), make)

    def cached(self, v):
        """The artifact of record ``v`` if it is in memory (see :meth:`load`), else None; reads nothing."""
        return self.cache.peek((self.kind.noun, v.artifact_sha256))

    def summaries(self, t, *, after: str | None = None, limit: int | None = None,
                  name: str | None = None) -> list[dict]:
        """One dict per name: its name-row columns, latest live version, ``aliases`` {alias: version}, counts, and
        ``aliases_on_deleted``: the aliases left on a deleted version (they no longer resolve).

        In name order (code-point order, as Python sorts); only the names after ``after``, the first ``limit`` of
        them, or only ``name``: a keyset page is chosen before its summaries are built, by four queries whatever
        its size (one list of the whole registry per page cost a query or three per name)."""
        if name is not None and "\x00" in name:
            return []  # no name holds NUL (PostgreSQL refuses it in a text parameter: a 500)
        if after is not None:  # a crafted cursor: names after "a\x00b" are the names after "a" (none holds NUL)
            after = after.split("\x00", 1)[0]
        k, order = self.kind, self.db.byte_order
        where = [(f"name{order} > ?", after), ("name = ?", name)]
        cond = [(c, a) for c, a in where if a is not None]
        heads = t.q(f"SELECT name, {', '.join(k.name_cols)}, created_at FROM {k.names}"
                    + (" WHERE " + " AND ".join(c for c, _ in cond) if cond else "") + f" ORDER BY name{order}"
                    + ("" if limit is None else f" LIMIT {int(limit)}"), tuple(a for _, a in cond))
        names = [r["name"] for r in heads]
        counts = {r["name"]: r for r in self.among(
            t, names, f"SELECT name, COUNT(*) AS n_all, SUM(1 - deleted) AS n_live, MAX(CASE WHEN deleted = 0 THEN "
                      f"version END) AS latest FROM {k.table} WHERE {{}} GROUP BY name")}
        aliases: dict[str, list] = {}
        for a in self.among(t, names, f"SELECT a.name, a.alias, a.version, v.deleted FROM {k.aliases} a LEFT JOIN "
                                      f"{k.table} v ON v.name = a.name AND v.version = a.version WHERE {{}} "
                                      "ORDER BY a.name, a.alias", "a.name"):
            aliases.setdefault(a["name"], []).append(a)
        out = []
        for r in heads:
            n, rows = counts.get(r["name"]), aliases.get(r["name"], [])
            latest = None if n is None else n["latest"]
            out.append({"name": r["name"], **{c: r[c] for c in k.name_cols},
                        "latest_version": None if latest is None else int(latest),
                        "aliases": {a["alias"]: int(a["version"]) for a in rows},
                        "aliases_on_deleted": [a["alias"] for a in rows if a["deleted"]],
                        "n_versions": 0 if n is None else int(n["n_all"]),
                        "n_live_versions": 0 if n is None else int(n["n_live"] or 0), "created_at": r["created_at"]})
        return out

    def among(self, t, names: list[str], sql: str, column: str = "name") -> list:
        """The rows of ``sql`` (its ``{}`` a condition on ``column``) whose ``column`` is one of ``names``: the list
        in the statement for a page, else every row (filtered here), which is cheaper than a long list."""
        if len(names) <= _AMONG:
            return t.q(sql.format(f"{column} IN ({', '.join('?' * len(names))})"), tuple(names)) if names else []
        keep = set(names)
        return [r for r in t.q(sql.format("1 = 1")) if r[column.split(".")[-1]] in keep]

    # --- mutable annotations ------------------------------------------------------------------
    def set_alias(self, name: str, alias: str, version: int, *, expected=None) -> Record:
        """Point ``name@alias`` at ``version`` (moves an existing alias). Deleted version: ConflictError.

        ``expected`` (compare-and-set, for deploy tools that must not undo a move they did not see): move only
        while the alias points at version ``expected`` (``0``: only while it is not set; a collection of
        versions: at one of them; ``"*"``: while it is set, anywhere), else AliasMovedError (a ConflictError)
        naming where it points. One conditional statement, so of clients racing with the same ``expected``
        exactly one moves it, on PostgreSQL (READ COMMITTED) too.
        """
        self.check(name)
        check_alias(alias)
        want = None if expected is None else _expected(expected)
        a = self.kind.aliases

        def fn(t):  # the name row locked first, as a prune does: never an alias on a version it deletes
            self.lock_name(t, name)
            if self.get_in(t, name, int(version)).deleted:
                raise ConflictError(f"cannot point alias {alias!r} at deleted version {version} of "
                                    f"{self.kind.noun} {name!r}")
            if want is None:
                self.put_alias(t, name, alias, int(version))
                return
            if want == (0,):
                moved = t.one(f"INSERT INTO {a} (name, alias, version) VALUES (?, ?, ?) ON CONFLICT (name, alias) "
                              "DO NOTHING RETURNING version", (name, alias, int(version)))
            else:
                where, args = _pointing(want)
                moved = t.one(f"UPDATE {a} SET version = ? WHERE name = ? AND alias = ?{where} RETURNING version",
                              (int(version), name, alias, *args))
            if moved is None:
                raise self._moved(t, name, alias, want, "moved", to=int(version))

        self._write(fn)
        return self.get(name, int(version))

    def delete_alias(self, name: str, alias: str, *, expected=None) -> None:
        """Remove ``name@alias`` (NotFoundError when it is not set). ``expected`` (a version, a collection of
        them, or ``"*"``): remove it only while it points there, else AliasMovedError, as :meth:`set_alias`."""
        self.check(name)
        check_alias(alias)
        want = None if expected is None else _expected(expected)
        if want == (0,):
            raise InputError("an alias that must not be set cannot be removed (expected version 0)")
        a = self.kind.aliases

        def fn(t):  # one statement: of clients racing to remove it, exactly one removes it (READ COMMITTED too)
            where, args = ("", ()) if want is None else _pointing(want)
            if t.one(f"DELETE FROM {a} WHERE name = ? AND alias = ?{where} RETURNING version",
                      (name, alias, *args)) is None:
                self._require(t, name)  # an unknown name says so (it read "map 'nope' has no alias 'prod'")
                if want is None:
                    raise self._no_alias(t, name, alias)
                raise self._moved(t, name, alias, want, "removed")

        self._write(fn)

    def alias(self, name: str, alias: str) -> int:
        """The version ``name@alias`` points at (live or deleted); NotFoundError when it is not set."""
        self.check(name)
        check_alias(alias)
        with self.db.tx() as t:
            r = t.one(f"SELECT version FROM {self.kind.aliases} WHERE name = ? AND alias = ?", (name, alias))
            if r is None:
                self._require(t, name)
                raise self._no_alias(t, name, alias)
        return int(r["version"])

    def _no_alias(self, t, name: str, alias: str) -> NotFoundError:
        """``map 'minilm-e5' has no alias 'prd' (did you mean 'prod'?); its aliases: 'prod', 'staging'``."""
        have = [r["alias"] for r in t.q(f"SELECT alias FROM {self.kind.aliases} WHERE name = ? ORDER BY alias",
                                        (name,))]
        return NotFoundError(f"{self.kind.noun} {name!r} has no alias {alias!r}{did_you_mean(alias, have)}; its "
                             f"aliases: {listed(have)}")

    def _moved(self, t, name: str, alias: str, want, done: str, to: int | None = None) -> AliasMovedError:
        """The AliasMovedError of a compare-and-set that found ``name@alias`` elsewhere than ``want``; ``to``: the
        version a move asked for (found there already, it says so: a cron job's re-run was told "someone else
        moved it")."""
        now = t.one(f"SELECT version FROM {self.kind.aliases} WHERE name = ? AND alias = ?", (name, alias))
        current = None if now is None else int(now["version"])
        where = "is not set" if current is None else f"points at version {current}"
        if want == "*":
            wanted = "it to be set"
        elif want == (0,):
            wanted = "it not to be set"
        elif len(want) == 1:
            wanted = f"it to point at version {want[0]}"
        else:
            wanted = f"it to point at one of versions {', '.join(map(str, want)) or '(none)'}"
        why = ("it is where this move would put it: a move that went through already?" if current is not None
               and current == to else "someone else moved it; read it again and decide" if current is not None
               else "never set, or someone removed it; to set it only while it is unset, expect version 0")
        return AliasMovedError(f"{self.kind.noun} {name}@{alias} {where}, expected {wanted}: not {done} ({why})",
                               current)

    def _tagged(self, t, name: str, version: int, check) -> Record:
        """Before a tag write of ``name:version`` (NotFoundError when there is none): its row locked (PostgreSQL's
        ``FOR UPDATE``; SQLite has one writer anyway), so tag writes of a version run one after the other, and
        ``check(record)`` (a precondition: it raises to write nothing) on the record as it is now."""
        if 1 <= int(version) <= MAX_VERSION:  # else get_in says there is no such version
            t.one(f"SELECT version FROM {self.kind.table} WHERE name = ? AND version = ?" + self.db.for_update,
                  (name, int(version)))
        record = self.get_in(t, name, int(version))
        if check is not None:
            check(record)
        return record

    def set_tag(self, name: str, version: int, key: str, value, *, check=None) -> Record:
        """Set tag ``key`` of ``name:version`` to ``value`` as text; ``check``: see :meth:`_tagged`. Deleted version:
        ConflictError, as :meth:`set_alias` (removing a tag from one is allowed)."""
        self.check(name)
        check_tag_key(key)
        value = check_tag_value(value, key)

        def fn(t):
            if self._tagged(t, name, version, check).deleted:
                raise ConflictError(f"cannot set tag {key!r} on deleted version {int(version)} of {self.kind.noun} "
                                    f"{name!r}")
            others = t.one(f"SELECT count(*) FROM {self.kind.tags} WHERE name = ? AND version = ? AND key <> ?",
                           (name, int(version), key))[0]
            check_tag_count(int(others) + 1, f"{self.kind.noun} {name}:{int(version)}")
            t.q(f"INSERT INTO {self.kind.tags} (name, version, key, value) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (name, version, key) DO UPDATE SET value = excluded.value",
                (name, int(version), key, value))
            return self.get_in(t, name, int(version))  # as this write left it (a later one's state: another's ETag)

        return self._write(fn)

    def delete_tag(self, name: str, version: int, key: str, *, check=None, missing_ok: bool = False) -> Record:
        """Remove tag ``key`` of ``name:version``; the version as this write left it. ``check``: see :meth:`_tagged`.
        A tag that is not set: NotFoundError naming the tags that are (a mistyped key went unnoticed), unless
        ``missing_ok``."""
        self.check(name)
        if key not in (".", ".."):  # a dot key set before they were refused can still be removed
            check_tag_key(key)

        def fn(t):
            self._tagged(t, name, version, check)
            gone = t.one(f"DELETE FROM {self.kind.tags} WHERE name = ? AND version = ? AND key = ? RETURNING key",
                         (name, int(version), key))
            v = self.get_in(t, name, int(version))
            if gone is None and not missing_ok:
                raise NotFoundError(f"{self.kind.noun} {v.ref} has no tag {key!r}{did_you_mean(key, v.tags)}; its "
                                    f"tags: {listed(sorted(v.tags))} (nothing deleted)")
            return v

        return self._write(fn)

    def delete(self, name: str, version: int) -> Record:
        """Soft delete: the row and artifact stay (lineage), but the version no longer resolves; ``deleted_at`` is the
        first delete's time (``registry gc --older-than`` reads it; gc removes the files, the row stays)."""
        return self.delete_once(name, version)[0]

    def delete_once(self, name: str, version: int) -> tuple[Record, bool, str | None]:
        """:meth:`delete`, whether the version was deleted before (nothing written then), and ``deleted_at``, the
        first delete's time (None when not known: a row an older release deleted), so a repeated delete can say so."""
        self.check(name)

        def fn(t):
            if not (already := self.get_in(t, name, int(version)).deleted):
                self.mark_deleted(t, name, [int(version)])
            return already, t.one(f"SELECT deleted_at FROM {self.kind.table} WHERE name = ? AND version = ?",
                                  (name, int(version)))["deleted_at"]

        already, when = self._write(fn)
        return self.get(name, int(version)), already, when

    def lock_name(self, t, name: str) -> None:
        """Inside a write transaction: lock ``name``'s row (PostgreSQL ``FOR UPDATE``; SQLite has one writer), so
        fits, alias moves and prunes of one name run one after another."""
        t.one(f"SELECT name FROM {self.kind.names} WHERE name = ?" + self.db.for_update, (name,))

    def mark_deleted(self, t, name: str, versions: list[int]) -> None:
        """Inside a write transaction: soft-delete these versions of ``name`` (:meth:`delete`'s write; ``registry
        prune`` marks a map's versions in one transaction)."""
        for i in range(0, len(versions), _AMONG):
            part = [int(v) for v in versions[i:i + _AMONG]]
            t.q(f"UPDATE {self.kind.table} SET deleted = 1, deleted_at = COALESCE(deleted_at, ?) WHERE name = ? "
                f"AND version IN ({', '.join('?' * len(part))})", (now(), name, *part))
