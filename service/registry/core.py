"""The registry: spaces, maps, immutable numbered versions, aliases, tags, lineage.

Write path of :meth:`Registry.register_version` (crash-safe at every step):

1. serialise the map; write the artifact to ``tmp/``, fsync, rename to its content address;
2. one database transaction: create the map row if new, lock it, allocate ``last_version + 1``,
   insert the version row (and the alias, if asked), commit.

A crash before the commit leaves the old state (plus, at worst, an unreferenced artifact or a
temporary file); after the commit, the new state. ``FAULT_HOOK`` is called with the name of each
step (``artifact_tmp_written``, ``artifact_renamed``, ``version_allocated``, ``version_inserted``,
``committed``) so tests can stop a writer exactly there.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict, deque
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from align import LinearMap
from align.exceptions import SerializationError

from ..limits import MAX_DESCRIPTION, MAX_DIM
from .db import open_db
from .errors import ConflictError, DeletedVersionError, IntegrityError, InvalidNameError, NotFoundError
from .models import SpaceInfo, VersionInfo
from .names import check_alias, check_name, check_tag_key, parse_ref
from .steers import SteerRegistryMixin
from .store import ArtifactStore

__all__ = ["Registry", "open_registry", "FAULT_HOOK", "package_version"]

FAULT_HOOK: Callable[[str], None] | None = None
ARTIFACT_FORMATS = {"npz": "npz", "safetensors": "safetensors"}
_VCOLS = ("name, version, source_space, target_space, source_dim, target_dim, method, params, random_state, "
          "data_hashes, package_version, created_at, metrics, artifact_sha256, artifact_path, artifact_format, "
          "deleted, description, report_path, inputs")


_BUMP_GENERATION = ("INSERT INTO vb_meta (key, value) VALUES ('generation', '1') ON CONFLICT (key) DO UPDATE "
                    "SET value = CAST(CAST(vb_meta.value AS BIGINT) + 1 AS TEXT)")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _hook(point: str) -> None:
    if FAULT_HOOK is not None:
        FAULT_HOOK(point)


def package_version() -> str:
    """Installed vecbridge version (``importlib.metadata``), or ``"unknown"``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vecbridge")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "unknown"


def _dumps(obj) -> str:
    return json.dumps(obj, sort_keys=True, default=_json_default)


def _json_default(obj):
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


class Registry(SteerRegistryMixin):
    """Versions of linear maps stored in SQL (SQLite or PostgreSQL) plus a content-addressed folder.

    Parameters
    ----------
    url : str
        ``sqlite:///path`` (``sqlite:////abs/path``) or ``postgresql://...``.
    artifact_dir : path
        Folder of artifacts (shared by every replica using the same database).
    report_dir : path, optional
        Folder of HTML fit reports (default: ``artifact_dir/../reports``); relative
        ``report_path`` values are resolved against it.
    artifact_format : {"safetensors", "npz"}
        Format of newly written artifacts; both are always readable.
    """

    def __init__(self, url: str, artifact_dir, *, artifact_format: str = "safetensors", cache_size: int = 16,
                 report_dir=None):
        if artifact_format not in ARTIFACT_FORMATS:
            raise InvalidNameError(f"artifact_format must be one of {sorted(ARTIFACT_FORMATS)}")
        self.url = url
        self.db = open_db(url)
        self.store = ArtifactStore(artifact_dir, hook=_hook)
        self.artifact_format = artifact_format
        self.report_dir = Path(report_dir).resolve() if report_dir else self.store.root.parent / "reports"
        self._cache: OrderedDict[str, LinearMap] = OrderedDict()
        self._cache_size = cache_size

    @property
    def backend(self) -> str:
        return self.db.kind

    def close(self) -> None:
        self.db.close()

    # --- retries ----------------------------------------------------------------------------
    def _write(self, fn, attempts: int = 20):
        """Run ``fn(t)`` in a write transaction (retried on transient conflicts); bumps :meth:`generation`."""
        for i in range(attempts):
            try:
                with self.db.tx(write=True) as t:
                    out = fn(t)
                    t.q(_BUMP_GENERATION)
                    return out
            except Exception as exc:  # noqa: BLE001 - filtered right below
                if i + 1 < attempts and self.db.is_retryable(exc):
                    time.sleep(min(0.01 * 2**i, 0.5))
                    continue
                raise

    def generation(self) -> int:
        """A counter every registry write increments (in the same transaction), seen by all processes.

        Readers that cache what they resolved (aliases, versions, paths, spaces) compare it on each
        use: one primary-key read instead of the lookups it stands for; a write anywhere — another
        worker, another replica — invalidates their caches at once.
        """
        with self.db.tx() as t:
            r = t.one("SELECT value FROM vb_meta WHERE key = 'generation'")
        return int(r[0]) if r else 0

    # --- spaces -----------------------------------------------------------------------------
    def register_space(self, name: str, dim: int, encoder: str | None = None, query_prefix: str = "",
                       passage_prefix: str = "", description: str = "") -> SpaceInfo:
        """Create a space, or return it unchanged when it exists with the same dim (idempotent).

        A different ``dim`` raises ConflictError; other fields of an existing space are updated
        only when given (non-empty) and different.
        """
        check_name(name, "space name")
        if not isinstance(dim, int) or isinstance(dim, bool) or not 1 <= dim <= MAX_DIM:
            raise InvalidNameError(f"space dim must be an integer 1 .. {MAX_DIM}, got {str(dim)[:40]}")
        for what, text, cap in (("description", description, MAX_DESCRIPTION), ("query_prefix", query_prefix, 1024),
                                ("passage_prefix", passage_prefix, 1024)):
            if text and len(text) > cap:
                raise InvalidNameError(f"space {what} is longer than {cap} characters")

        def fn(t):
            self._ensure_space(t, name, dim)
            for col, val in (("encoder", encoder), ("query_prefix", query_prefix),
                             ("passage_prefix", passage_prefix), ("description", description)):
                if val:
                    t.q(f"UPDATE spaces SET {col} = ? WHERE name = ?", (val, name))
            return self._space_row(t, name)

        return self._write(fn)

    def _ensure_space(self, t, name: str, dim: int) -> None:
        t.q("INSERT INTO spaces (name, dim, created_at) VALUES (?, ?, ?) ON CONFLICT (name) DO NOTHING",
            (name, dim, _now()))
        have = t.one("SELECT dim FROM spaces WHERE name = ?", (name,))[0]
        if int(have) != int(dim):
            raise ConflictError(f"space {name!r} is {have}-d, not {dim}-d")

    def _space_row(self, t, name: str) -> SpaceInfo:
        r = t.one("SELECT name, dim, encoder, query_prefix, passage_prefix, description, created_at "
                  "FROM spaces WHERE name = ?", (name,))
        if r is None:
            raise NotFoundError(f"unknown space {name!r}")
        return SpaceInfo(r[0], int(r[1]), r[2], r[3], r[4], r[5], r[6])

    def get_space(self, name: str) -> SpaceInfo:
        check_name(name, "space name")
        with self.db.tx() as t:
            return self._space_row(t, name)

    def list_spaces(self) -> list[SpaceInfo]:
        with self.db.tx() as t:
            names = [r[0] for r in t.q("SELECT name FROM spaces ORDER BY name")]
            return [self._space_row(t, n) for n in names]

    # --- versions ---------------------------------------------------------------------------
    def register_version(self, name: str, map_: LinearMap, *, source_space: str, target_space: str, method: str,
                         params: dict, random_state=None, data_hashes: dict | None = None,
                         metrics: dict | None = None, description: str = "", tags: dict | None = None,
                         alias: str | None = None, report_path: str | None = None, inputs: dict | None = None,
                         artifact_format: str | None = None) -> VersionInfo:
        """Store ``map_`` as the next version of ``name`` (auto-numbered, atomic).

        Spaces are created on first use (dims from the map); an existing space with another dim,
        or a map name already bound to other spaces, raises ConflictError.
        """
        check_name(name, "map name")
        check_name(source_space, "source space")
        check_name(target_space, "target space")
        if alias is not None:
            check_alias(alias)
        tags = {check_tag_key(k): str(v) for k, v in (tags or {}).items()}
        fmt = artifact_format or self.artifact_format
        if fmt not in ARTIFACT_FORMATS:
            raise InvalidNameError(f"artifact_format must be one of {sorted(ARTIFACT_FORMATS)}")
        if not isinstance(map_, LinearMap):
            raise InvalidNameError("map_ must be an align.LinearMap")
        data = map_.to_bytes(fmt)
        sha, rel = self.store.put(data, ARTIFACT_FORMATS[fmt])
        created = _now()
        row = dict(source_space=source_space, target_space=target_space, source_dim=map_.source_dim,
                   target_dim=map_.target_dim, method=str(method), params=_dumps(params or {}),
                   random_state=None if random_state is None else int(random_state),
                   data_hashes=_dumps(data_hashes or {}), package_version=package_version(), created_at=created,
                   metrics=_dumps(metrics or {}), artifact_sha256=sha, artifact_path=rel, artifact_format=fmt,
                   deleted=0, description=description or "", report_path=report_path,
                   inputs=_dumps(inputs or {}))

        def fn(t):
            self._ensure_space(t, source_space, map_.source_dim)
            self._ensure_space(t, target_space, map_.target_dim)
            t.q("INSERT INTO maps (name, source_space, target_space, source_dim, target_dim, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING",
                (name, source_space, target_space, map_.source_dim, map_.target_dim, created))
            m = t.one("SELECT source_space, target_space FROM maps WHERE name = ?" + self.db.for_update, (name,))
            if (m[0], m[1]) != (source_space, target_space):
                raise ConflictError(f"map {name!r} connects {m[0]} -> {m[1]}, not {source_space} -> {target_space}")
            version = self._allocate_version(t, "maps", name)
            self._insert_version(t, name, version, row)
            for k, v in tags.items():
                t.q("INSERT INTO tags (name, version, key, value) VALUES (?, ?, ?, ?)", (name, version, k, v))
            if alias is not None:
                self._upsert_alias(t, name, alias, version)
            _hook("version_inserted")
            return version

        version = self._write(fn)
        _hook("committed")
        return self.get_version(name, version)

    def _allocate_version(self, t, table: str, name: str) -> int:
        """``last_version + 1`` of row ``name`` in ``table`` (``maps`` or ``steer_names``), row-locked, stored.

        Call inside the write transaction that inserts the version row: the lock (SQLite's write
        lock, PostgreSQL's ``FOR UPDATE``) serialises writers of one name, so numbers never repeat.
        """
        r = t.one(f"SELECT last_version FROM {table} WHERE name = ?" + self.db.for_update, (name,))
        version = int(r[0]) + 1
        t.q(f"UPDATE {table} SET last_version = ? WHERE name = ?", (version, name))
        _hook("version_allocated")
        return version

    @staticmethod
    def _insert_version(t, name, version, row):
        cols = ["name", "version", *row.keys()]
        t.q(f"INSERT INTO versions ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
            (name, version, *row.values()))

    def _version_from_row(self, t, r) -> VersionInfo:
        name, version = r[0], int(r[1])
        aliases = [a[0] for a in t.q("SELECT alias FROM aliases WHERE name = ? AND version = ? ORDER BY alias",
                                     (name, version))]
        tags = dict(t.q("SELECT key, value FROM tags WHERE name = ? AND version = ? ORDER BY key", (name, version)))
        return VersionInfo(
            name=name, version=version, source_space=r[2], target_space=r[3], source_dim=int(r[4]),
            target_dim=int(r[5]), method=r[6], params=json.loads(r[7]),
            random_state=None if r[8] is None else int(r[8]), data_hashes=json.loads(r[9]),
            package_version=r[10], created_at=r[11], metrics=json.loads(r[12]), artifact_sha256=r[13],
            artifact_path=r[14], artifact_format=r[15], deleted=bool(r[16]), description=r[17], report_path=r[18],
            inputs=json.loads(r[19]), aliases=aliases, tags=tags)

    def _get_version(self, t, name: str, version: int) -> VersionInfo:
        r = t.one(f"SELECT {_VCOLS} FROM versions WHERE name = ? AND version = ?", (name, int(version)))
        if r is None:
            if t.one("SELECT 1 FROM maps WHERE name = ?", (name,)) is None:
                raise NotFoundError(f"unknown map {name!r}")
            raise NotFoundError(f"map {name!r} has no version {version}")
        return self._version_from_row(t, r)

    def get_version(self, name: str, version: int) -> VersionInfo:
        """The version record (deleted ones included, flagged)."""
        check_name(name, "map name")
        with self.db.tx() as t:
            return self._get_version(t, name, version)

    def list_versions(self, name: str, include_deleted: bool = True) -> list[VersionInfo]:
        check_name(name, "map name")
        with self.db.tx() as t:
            if t.one("SELECT 1 FROM maps WHERE name = ?", (name,)) is None:
                raise NotFoundError(f"unknown map {name!r}")
            rows = t.q(f"SELECT {_VCOLS} FROM versions WHERE name = ? ORDER BY version", (name,))
            out = [self._version_from_row(t, r) for r in rows]
        return [v for v in out if include_deleted or not v.deleted]

    def resolve(self, ref: str) -> VersionInfo:
        """``name`` → latest live version; ``name@alias`` → the alias's version; ``name:N`` → version N.

        Raises NotFoundError for unknown names/aliases/versions and DeletedVersionError (a
        NotFoundError) when the version, or the alias's version, was deleted.
        """
        name, alias, version = parse_ref(ref)
        with self.db.tx() as t:
            if t.one("SELECT 1 FROM maps WHERE name = ?", (name,)) is None:
                raise NotFoundError(f"unknown map {name!r}")
            if alias is not None:
                r = t.one("SELECT version FROM aliases WHERE name = ? AND alias = ?", (name, alias))
                if r is None:
                    raise NotFoundError(f"map {name!r} has no alias {alias!r}")
                v = self._get_version(t, name, int(r[0]))
                if v.deleted:
                    raise DeletedVersionError(f"alias {name}@{alias} points at version {v.version}, which was deleted")
                return v
            if version is None:
                r = t.one("SELECT MAX(version) FROM versions WHERE name = ? AND deleted = 0", (name,))
                if r is None or r[0] is None:
                    raise NotFoundError(f"map {name!r} has no live versions")
                version = int(r[0])
            v = self._get_version(t, name, version)
            if v.deleted:
                raise DeletedVersionError(f"version {version} of map {name!r} was deleted")
            return v

    def load_map(self, ref) -> LinearMap:
        """Resolve ``ref`` (or take a VersionInfo) and read its artifact, verifying the sha256."""
        v = ref if isinstance(ref, VersionInfo) else self.resolve(ref)
        if v.artifact_sha256 in self._cache:
            self._cache.move_to_end(v.artifact_sha256)
            return self._cache[v.artifact_sha256]
        data = self.store.get(v.artifact_path, v.artifact_sha256)
        try:
            m = LinearMap.from_bytes(data)
        except SerializationError as exc:
            raise IntegrityError(f"artifact of {v.ref} cannot be read: {exc}") from None
        self._cache[v.artifact_sha256] = m
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return m

    def artifact_file(self, ref) -> Path:
        v = ref if isinstance(ref, VersionInfo) else self.resolve(ref)
        return self.store.path(v.artifact_path)

    def report_file(self, ref) -> Path | None:
        """Absolute path of a version's HTML report (relative paths are under ``report_dir``), or None."""
        v = ref if isinstance(ref, VersionInfo) else self.resolve(ref)
        if not v.report_path:
            return None
        p = Path(v.report_path)
        return p if p.is_absolute() else (self.report_dir / p).resolve()

    def list_maps(self) -> list[dict]:
        """One dict per map name: spaces, dims, latest live version, ``aliases`` {alias: version}, counts."""
        out = []
        with self.db.tx() as t:
            for name, src, tgt, sd, td, created in t.q(
                    "SELECT name, source_space, target_space, source_dim, target_dim, created_at FROM maps ORDER BY name"):
                latest = t.one("SELECT MAX(version) FROM versions WHERE name = ? AND deleted = 0", (name,))[0]
                n_all, n_live = t.one("SELECT COUNT(*), SUM(1 - deleted) FROM versions WHERE name = ?", (name,))
                aliases = dict(t.q("SELECT alias, version FROM aliases WHERE name = ? ORDER BY alias", (name,)))
                unreliable = [int(v) for v, m in t.q("SELECT version, metrics FROM versions WHERE name = ? "
                                                     "AND deleted = 0 ORDER BY version", (name,))
                              if (json.loads(m) if isinstance(m, str) else (m or {})).get("reliable") is False]
                edge = self._edge_version(t, name, self.PATH_ALIAS)
                out.append({"name": name, "source_space": src, "target_space": tgt, "source_dim": int(sd),
                            "target_dim": int(td), "latest_version": None if latest is None else int(latest),
                            "aliases": {k: int(v) for k, v in aliases.items()}, "n_versions": int(n_all),
                            "n_live_versions": int(n_live or 0), "created_at": created,
                            "unreliable_versions": unreliable,
                            "path_version": None if edge is None else edge[0].version})
        return out

    # --- mutable annotations ----------------------------------------------------------------
    def _upsert_alias(self, t, name, alias, version):
        t.q("INSERT INTO aliases (name, alias, version) VALUES (?, ?, ?) "
            "ON CONFLICT (name, alias) DO UPDATE SET version = excluded.version", (name, alias, int(version)))

    def set_alias(self, name: str, alias: str, version: int) -> VersionInfo:
        """Point ``name@alias`` at ``version`` (moves an existing alias). Deleted version: ConflictError."""
        check_name(name, "map name")
        check_alias(alias)

        def fn(t):
            v = self._get_version(t, name, int(version))
            if v.deleted:
                raise ConflictError(f"cannot point alias {alias!r} at deleted version {version} of {name!r}")
            self._upsert_alias(t, name, alias, int(version))

        self._write(fn)
        return self.get_version(name, int(version))

    def delete_alias(self, name: str, alias: str) -> None:
        check_name(name, "map name")
        check_alias(alias)

        def fn(t):
            if t.one("SELECT 1 FROM aliases WHERE name = ? AND alias = ?", (name, alias)) is None:
                raise NotFoundError(f"map {name!r} has no alias {alias!r}")
            t.q("DELETE FROM aliases WHERE name = ? AND alias = ?", (name, alias))

        self._write(fn)

    def set_tag(self, name: str, version: int, key: str, value) -> VersionInfo:
        check_name(name, "map name")
        check_tag_key(key)

        def fn(t):
            self._get_version(t, name, int(version))
            t.q("INSERT INTO tags (name, version, key, value) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (name, version, key) DO UPDATE SET value = excluded.value",
                (name, int(version), key, str(value)))

        self._write(fn)
        return self.get_version(name, int(version))

    def delete_tag(self, name: str, version: int, key: str) -> None:
        check_name(name, "map name")

        def fn(t):
            self._get_version(t, name, int(version))
            t.q("DELETE FROM tags WHERE name = ? AND version = ? AND key = ?", (name, int(version), key))

        self._write(fn)

    def delete_version(self, name: str, version: int) -> VersionInfo:
        """Soft delete: the row and artifact stay (lineage), but the version no longer resolves."""
        check_name(name, "map name")

        def fn(t):
            self._get_version(t, name, int(version))
            t.q("UPDATE versions SET deleted = 1 WHERE name = ? AND version = ?", (name, int(version)))

        self._write(fn)
        return self.get_version(name, int(version))

    # --- paths between spaces ---------------------------------------------------------------
    PATH_ALIAS = "prod"

    @staticmethod
    def is_reliable(v: VersionInfo) -> bool:
        """False when the fit flagged the version unreliable (``metrics["reliable"] is False``)."""
        return (v.metrics or {}).get("reliable") is not False

    @staticmethod
    def quality(v: VersionInfo) -> tuple[int, float]:
        """How good a version is for path choice: ``(kind, score)``, higher first.

        kind 2: a held-out top-1 (``eval.top1`` recorded by ``vecbridge eval --record``, or a fit's
        ``heldout_top1``); kind 1: training top-1 of a paired fit; kind 0: no figure.
        """
        m, tags = v.metrics or {}, v.tags or {}
        for key, src in (("eval.top1", tags), ("heldout_top1", m)):
            try:
                return 2, float(src[key])
            except (KeyError, TypeError, ValueError):
                pass
        if isinstance(m.get("train_top1"), (int, float)):
            return 1, float(m["train_top1"])
        return 0, 0.0

    def _edge_version(self, t, name: str, alias: str) -> tuple[VersionInfo, bool] | None:
        """The version a map contributes to paths: its live ``alias`` version (pinned, True) if any, else
        its newest live version that is not flagged unreliable (False); None when it has neither."""
        r = t.one("SELECT a.version FROM aliases a JOIN versions v ON v.name = a.name AND v.version = a.version "
                  "WHERE a.name = ? AND a.alias = ? AND v.deleted = 0", (name, alias))
        if r is not None:
            return self._get_version(t, name, int(r[0])), True
        rows = t.q(f"SELECT {_VCOLS} FROM versions WHERE name = ? AND deleted = 0 ORDER BY version DESC", (name,))
        for row in rows:
            v = self._version_from_row(t, row)
            if self.is_reliable(v):
                return v, False
        return None

    def path_candidates(self, source_space: str, target_space: str, alias: str | None = None) -> list[VersionInfo]:
        """Every map's path version from ``source_space`` straight to ``target_space``, best first (see find_path)."""
        alias = alias or self.PATH_ALIAS
        with self.db.tx() as t:
            cands = []
            for (name,) in t.q("SELECT name FROM maps WHERE source_space = ? AND target_space = ?",
                               (source_space, target_space)):
                e = self._edge_version(t, name, alias)
                if e is not None:
                    cands.append(e)
        cands.sort(key=lambda e: (e[1], self.quality(e[0]), e[0].created_at, e[0].name), reverse=True)
        return [v for v, _ in cands]

    def find_path(self, source_space: str, target_space: str, alias: str | None = None) -> list[VersionInfo]:
        """Shortest chain of maps from ``source_space`` to ``target_space`` (breadth-first over spaces).

        Each map contributes its ``alias`` (default ``prod``) version when that alias exists and is live,
        else its newest live version not flagged unreliable; a map with neither is left out. Where several
        maps join the same two spaces, the choice is, in order: a map pinned by the alias; the best
        held-out top-1 (``eval.top1`` tag, ``heldout_top1`` metric); the best training top-1; the newest.
        Never name order. Same space: ``[]``. No chain: NotFoundError.
        """
        check_name(source_space, "source space")
        check_name(target_space, "target space")
        with self.db.tx() as t:
            for s in (source_space, target_space):
                if t.one("SELECT 1 FROM spaces WHERE name = ?", (s,)) is None:
                    raise NotFoundError(f"unknown space {s!r}")
            if source_space == target_space:
                return []
            pairs = t.q("SELECT DISTINCT source_space, target_space FROM maps")
        best: dict[str, list[VersionInfo]] = {}
        for s, tg in pairs:
            cands = self.path_candidates(s, tg, alias)
            if cands:
                best.setdefault(s, []).append(cands[0])
        prev: dict[str, VersionInfo | None] = {source_space: None}
        queue = deque([source_space])
        while queue:
            s = queue.popleft()
            for v in sorted(best.get(s, []), key=lambda v: v.target_space):
                if v.target_space in prev:
                    continue
                prev[v.target_space] = v
                if v.target_space == target_space:
                    chain = []
                    node = target_space
                    while prev[node] is not None:
                        chain.append(prev[node])
                        node = prev[node].source_space
                    return chain[::-1]
                queue.append(v.target_space)
        raise NotFoundError(f"no chain of maps leads from space {source_space!r} to {target_space!r} "
                            f"(unreliable versions are not used; pin one with a map reference)")

    def compose_path(self, source_space: str, target_space: str) -> LinearMap:
        """The composed map along :meth:`find_path` (identity-free: same space raises ConflictError)."""
        chain = self.find_path(source_space, target_space)
        if not chain:
            raise ConflictError("source and target space are the same; no map needed")
        m = self.load_map(chain[0])
        for v in chain[1:]:
            m = m.compose(self.load_map(v))
        return m

    # --- maintenance ------------------------------------------------------------------------
    def verify(self, sweep: bool = False) -> dict:
        """Check every version's artifact (exists, sha256 matches) and every alias's target.

        Returns ``{"ok": bool, "bad_artifacts": [...], "dangling_aliases": [...],
        "orphan_artifacts": [...], "tmp_files": n}``; ``sweep=True`` deletes temporary files.
        """
        bad, dangling, used = [], [], set()
        with self.db.tx() as t:
            rows = t.q("SELECT name, version, artifact_path, artifact_sha256 FROM versions")
            steer_rows = t.q("SELECT name, version, artifact_path, artifact_sha256 FROM steers")
            for name, alias, version in t.q("SELECT name, alias, version FROM aliases"):
                if t.one("SELECT 1 FROM versions WHERE name = ? AND version = ?", (name, version)) is None:
                    dangling.append(f"{name}@{alias}")
            gaps = []
            for name, last in t.q("SELECT name, last_version FROM maps"):  # numbers 1..last, each once
                n, lo, hi = t.one("SELECT COUNT(DISTINCT version), MIN(version), MAX(version) FROM versions "
                                  "WHERE name = ?", (name,))
                if (int(n or 0), lo, hi) != (int(last), 1 if int(last) else None, int(last) if int(last) else None):
                    gaps.append(name)
        for name, version, rel, sha in [*rows, *steer_rows]:
            used.add(rel)
            try:
                self.store.get(rel, sha)
            except IntegrityError as exc:
                bad.append(f"{name}:{version}: {exc}")
        tmp = len(self.store.tmp_files())
        if sweep:
            self.store.sweep_tmp()
        orphans = sorted(self.store.all_relpaths() - used)
        return {"ok": not bad and not dangling and not gaps, "bad_artifacts": bad, "dangling_aliases": dangling,
                "version_gaps": gaps, "orphan_artifacts": orphans, "tmp_files": tmp, "n_versions": len(rows)}

    # --- bundles ----------------------------------------------------------------------------
    def export(self, path, names: list[str] | None = None) -> Path:
        from .bundle import export_bundle

        return export_bundle(self, Path(path), names)

    def import_(self, path, *, on_conflict: str = "error") -> dict:
        from .bundle import import_bundle

        return import_bundle(self, Path(path), on_conflict=on_conflict)


def open_registry(url: str, artifact_dir, **kw) -> Registry:
    """Open (creating if needed) the registry at ``url`` with artifacts under ``artifact_dir``."""
    return Registry(url, artifact_dir, **kw)
