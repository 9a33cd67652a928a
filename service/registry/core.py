"""The registry: spaces, maps, immutable numbered versions, aliases, tags, lineage.

Maps and steers share one version lifecycle (:mod:`.entity`); this module adds what is special
to maps (spaces, paths between spaces, verification, bundles). Write path of
:meth:`Registry.register_version` (crash-safe at every step):

1. serialise the map; write the artifact to ``tmp/``, fsync, rename to its content address;
2. one database transaction: create the map row if new, lock it, allocate ``last_version + 1``,
   insert the version row (and the alias, if asked), commit.

A crash before the commit leaves the old state (plus, at worst, an unreferenced artifact or a
temporary file); after the commit, the new state. ``FAULT_HOOK`` is called with the name of each
step (``artifact_tmp_written``, ``artifact_renamed``, ``artifact_stored``, ``version_allocated``,
``version_inserted``, ``committed``) so tests can stop a writer exactly there (and ``artifacts_sampled``: a
look at whether the artifact folder is the registry's, ``elsewhere.py``).

Imports point one way: ``core`` -> ``steers``, ``path_finding``, ``verify``, ``gc``, ``bundle`` -> ``entity`` ->
``models``, ``names``. Paths between spaces (``find_path``, ``quality``): :mod:`.path_finding`, mixed in.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Callable

from align import ClusterMap, LinearMap, MapChain

from ..limits import MAX_DESCRIPTION, MAX_DIM
from .bundle import export_bundle, import_bundle
from .db import open_db
from .entity import MAPS, STEERS, LRUCache, VersionedStore, now, package_version
from .errors import (
    ConflictError,
    InvalidNameError,
    NoReliableVersionError,
    NotFoundError,
    unknown,
)
from .gc import GC_WAIT_S, collect_deleted
from .models import SpaceInfo, VersionInfo
from .names import (
    check_alias,
    check_name,
    check_seed,
    check_tags,
    check_text,
    parse_ref,
)
from .paths import path_choice
from .quality import reliable
from .path_finding import PathFindingMixin
from .steers import SteerRegistryMixin
from .store import ArtifactStore
from .verify import verify_registry

__all__ = ["Registry", "open_registry", "FAULT_HOOK", "package_version"]

FAULT_HOOK: Callable[[str], None] | None = None
ARTIFACT_FORMATS = {"npz": "npz", "safetensors": "safetensors"}

_BUMP_GENERATION = ("INSERT INTO vb_meta (key, value) VALUES ('generation', '1') ON CONFLICT (key) DO UPDATE "
                    "SET value = CAST(CAST(vb_meta.value AS BIGINT) + 1 AS TEXT)")
#: each write's random id next to the counter (never repeated, unlike the counter of a rolled-back registry)
_NEW_GENERATION_ID = "INSERT INTO vb_meta VALUES ('generation_id', ?) ON CONFLICT (key) DO UPDATE SET value = ?"
_READ_STAMP = "SELECT key, value FROM vb_meta WHERE key IN ('generation', 'generation_id')"


def _hook(point: str) -> None:
    if FAULT_HOOK is not None:
        FAULT_HOOK(point)


class Registry(SteerRegistryMixin, PathFindingMixin):
    """Versions of linear maps (and steers) stored in SQL (SQLite or PostgreSQL) plus a content-addressed folder.

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
    cache_size, cache_bytes : int
        Loaded artifacts (maps, steers, maps composed along a path) kept in memory: at most that many,
        holding at most that many bytes of arrays (None: no byte bound), least recently used dropped first;
        one larger than ``cache_bytes`` is read again at each use (:class:`~.cache.LRUCache`). They are
        immutable (keyed by sha256), so never stale.
    pool_size, statement_timeout_s : optional
        PostgreSQL: connections this process keeps at most, and the longest a statement may run or wait
        for a lock (0: no limit); see :data:`~.postgres.PG_POOL_SIZE`, :data:`~.postgres.PG_STATEMENT_TIMEOUT_S`.
    path_alias : str
        The alias that pins a map's (and a steer's) version for paths and bare names (default :attr:`PATH_ALIAS`,
        ``prod``; the ``path_alias`` setting): :meth:`resolve`, :meth:`find_path`, ``path_version`` all read it.
    """

    def __init__(self, url: str, artifact_dir, *, artifact_format: str = "safetensors", cache_size: int = 16,
                 cache_bytes: int | None = 512 << 20, report_dir=None, pool_size: int | None = None,
                 statement_timeout_s: float | None = None, path_alias: str = "prod"):
        if artifact_format not in ARTIFACT_FORMATS:
            raise InvalidNameError(f"artifact_format must be one of {sorted(ARTIFACT_FORMATS)}")
        self.url = url
        self.path_alias = check_alias(path_alias)
        self.store = ArtifactStore(artifact_dir, hook=_hook)  # first: a failing one left the database's pool open
        self.db = open_db(url, pool_size=pool_size, statement_timeout_s=statement_timeout_s)  # the last that may fail
        self.artifact_format = artifact_format
        self.report_dir = Path(report_dir).resolve() if report_dir else self.store.root.parent / "reports"
        self.cache = LRUCache(cache_size, cache_bytes)
        self.entities = {key: VersionedStore(kind, self.db, self.store, self.cache, self._write, _hook)
                         for key, kind in (("maps", MAPS), ("steers", STEERS))}
        self._maps = self.entities["maps"]

    @property
    def backend(self) -> str:
        return self.db.kind

    def close(self) -> None:
        self.db.close()

    def probe(self) -> None:
        """Raise what a request would when the registry cannot answer (readiness; cheap at any size)."""
        self.db.probe()

    # --- retries ----------------------------------------------------------------------------
    def _write(self, fn, attempts: int = 20):
        """Run ``fn(t)`` in a write transaction (retried on transient conflicts); bumps :meth:`generation`."""
        for i in range(attempts):
            try:
                with self.db.tx(write=True) as t:
                    out = fn(t)
                    t.q(_BUMP_GENERATION)
                    t.q(_NEW_GENERATION_ID, (secrets.token_hex(8),) * 2)
                    return out
            except Exception as exc:  # noqa: BLE001 - filtered right below
                if i + 1 < attempts and self.db.is_retryable(exc):
                    time.sleep(min(0.01 * 2**i, 0.5))
                    continue
                raise

    def change_token(self) -> int | None:
        """A value that changes whenever a write committed (SQLite: the file change counter), read without a
        query or a lock; None when the backend cannot tell (PostgreSQL: only :meth:`generation` tells).

        Compare it with the token of :meth:`generation_token`: equal means that generation still holds.
        """
        return self.db.change_counter()

    def generation_token(self) -> tuple[tuple[int, str], int | None]:
        """``((generation, its random id), change token)`` read in one transaction: the token is read while the read
        lock holds the file still, so it belongs to exactly that generation (never to a commit half written). Caches
        compare the pair: a rolled-back registry written again repeats the counter (ABA), not the id."""
        with self.db.tx() as t:
            meta = {r["key"]: r["value"] for r in t.q(_READ_STAMP)}
            token = self.db.change_counter()
        return (int(meta.get("generation", 0)), meta.get("generation_id", "")), token

    def cached_map(self, v: VersionInfo) -> LinearMap | ClusterMap | None:
        """The loaded artifact of version ``v`` when it is in memory, else None (reads nothing)."""
        return self._maps.cached(v)

    def generation(self) -> int:
        """A counter every registry write increments (in the same transaction), seen by all processes.

        Readers that cache what they resolved (aliases, versions, paths, spaces) compare it, with the random id
        the same write stored (:meth:`generation_token`), on each use: one primary-key read instead of the lookups
        it stands for; a write anywhere — another worker, another replica — invalidates their caches at once.
        """
        return self.generation_token()[0][0]

    # --- spaces -----------------------------------------------------------------------------
    def register_space(self, name: str, dim: int, encoder: str | None = None, query_prefix: str = "",
                       passage_prefix: str = "", description: str = "") -> SpaceInfo:
        """Create a space, or return it unchanged when it exists with the same dim (idempotent).

        A different ``dim`` raises ConflictError; other fields of an existing space are updated
        only when given (non-empty) and different.
        """
        return self.upsert_space(name, dim, encoder, query_prefix, passage_prefix, description)[0]

    def upsert_space(self, name: str, dim: int, encoder: str | None = None, query_prefix: str = "",
                     passage_prefix: str = "", description: str = "") -> tuple[SpaceInfo, bool]:
        """:meth:`register_space`, and whether this call created the space (False: it existed, and the fields
        given were set on it), decided in the write's transaction."""
        check_name(name, "space name")
        if not isinstance(dim, int) or isinstance(dim, bool) or not 1 <= dim <= MAX_DIM:
            raise InvalidNameError(f"space dim must be an integer 1 .. {MAX_DIM}, got {str(dim)[:40]}")
        for what, text, cap in (("description", description, MAX_DESCRIPTION), ("query_prefix", query_prefix, 1024),
                                ("passage_prefix", passage_prefix, 1024)):
            if text and len(text) > cap:
                raise InvalidNameError(f"space {what} is longer than {cap} characters")
            check_text(text, f"space {what}")
        check_text(encoder, "space encoder")

        def fn(t):
            made = self._put_space(t, dict(name=name, dim=dim, encoder=encoder, query_prefix=query_prefix,
                                           passage_prefix=passage_prefix, description=description))
            return self._space_row(t, name), made

        return self._write(fn)

    def _ensure_space(self, t, name: str, dim: int, created: str | None = None) -> bool:
        """Space ``name`` of width ``dim``, made now (or at ``created``: an imported space keeps its time) unless
        it exists; ConflictError when it exists at another width. Whether this call made it."""
        for _ in range(2):  # the row is held (KEY SHARE) until commit: a concurrent delete_space waits, then sees the
            # map or steer this transaction adds (PostgreSQL's READ COMMITTED let it delete the space under them)
            made = bool(t.q("INSERT INTO spaces (name, dim, created_at) VALUES (?, ?, ?) ON CONFLICT (name) "
                            "DO NOTHING RETURNING name", (name, dim, created or now())))
            row = t.one("SELECT dim FROM spaces WHERE name = ?" + self.db.key_share, (name,))
            if row is not None:  # else deleted between the two statements: made again
                break
        else:
            raise ConflictError(f"space {name!r} was deleted while this write ran; try again")
        have = row["dim"]
        if int(have) != int(dim):
            raise ConflictError(f"space {name!r} is {have}-d, not {dim}-d")
        return made

    def _new_space(self, t, name: str, dim: int, encoder: str | None) -> None:
        """:meth:`_ensure_space`, recording ``encoder`` on the space when this transaction creates it."""
        if self._ensure_space(t, name, dim) and encoder:
            t.q("UPDATE spaces SET encoder = ? WHERE name = ?", (encoder, name))

    def _put_space(self, t, s: dict, *, keep: bool = False) -> bool:
        """Ensure space ``s["name"]`` (``s["dim"]``) and set the descriptive fields ``s`` gives (non-empty);
        ``keep``: only those the space has not set (a bundle import never changes how a space here embeds).
        Whether the space was made here."""
        made = self._ensure_space(t, s["name"], s["dim"], s.get("created_at"))
        for col in ("encoder", "query_prefix", "passage_prefix", "description"):
            if s.get(col):
                unset = f" AND ({col} IS NULL OR {col} = '')" if keep else ""
                t.q(f"UPDATE spaces SET {col} = ? WHERE name = ?{unset}", (s[col], s["name"]))
        return made

    def _space_row(self, t, name: str) -> SpaceInfo:
        r = t.one("SELECT name, dim, encoder, query_prefix, passage_prefix, description, created_at "
                  "FROM spaces WHERE name = ?", (name,))
        if r is None:
            raise unknown(t, "spaces", "space", name)
        return SpaceInfo(**{**dict(r), "dim": int(r["dim"])})

    def get_space(self, name: str) -> SpaceInfo:
        check_name(name, "space name")
        with self.db.tx() as t:
            return self._space_row(t, name)

    def delete_space(self, name: str, *, held_by: list[str] | tuple[str, ...] = ()) -> SpaceInfo:
        """Remove space ``name`` (a typo, a model given up before use); returns what it was.

        Refused with ConflictError naming them while maps (as source or target) or steers are in the space, or
        ``held_by`` names users the caller found outside the registry (``"index 'docs'"``: indexes are not the
        registry's, :func:`service.ops.maps.delete_space` looks). Map and steer records stay for lineage, deleted
        versions too, so a space once used stays. NotFoundError when unknown.
        """
        check_name(name, "space name")

        def fn(t):
            t.q("SELECT name FROM spaces WHERE name = ?" + self.db.for_update, (name,))  # waits for a write using it
            info = self._space_row(t, name)
            users = [f"map {r['name']!r}" for r in t.q(
                "SELECT name FROM maps WHERE source_space = ? OR target_space = ? ORDER BY name LIMIT 5", (name, name))]
            users += [f"steer {r['name']!r}" for r in t.q(
                "SELECT name FROM steer_names WHERE space = ? ORDER BY name LIMIT 5", (name,))]
            users += list(held_by)
            if users:
                raise ConflictError(f"space {name!r} is used by {', '.join(users[:5])}"
                                    f"{' and more' if len(users) > 5 else ''} (maps and steers stay for lineage; "
                                    f"an index can be dropped)")
            t.q("DELETE FROM spaces WHERE name = ?", (name,))
            return info

        return self._write(fn)

    def list_spaces(self) -> list[SpaceInfo]:
        with self.db.tx() as t:
            names = [r["name"] for r in t.q("SELECT name FROM spaces ORDER BY name")]
            return [self._space_row(t, n) for n in names]

    # --- versions ---------------------------------------------------------------------------
    def register_version(self, name: str, map_: LinearMap | ClusterMap, *, source_space: str, target_space: str, method: str,
                         params: dict, random_state=None, data_hashes: dict | None = None,
                         metrics: dict | None = None, description: str = "", tags: dict | None = None,
                         alias: str | None = None, report_path: str | None = None, inputs: dict | None = None,
                         artifact_format: str | None = None, encoders: dict | None = None) -> VersionInfo:
        """Store ``map_`` as the next version of ``name`` (auto-numbered, atomic).

        Spaces are created on first use (dims from the map; ``encoders`` ``{space: encoder}`` recorded on the ones
        this call creates: the texts the fit embedded); an existing space with another dim,
        or a map name already bound to other spaces, raises ConflictError. ``map_`` is an
        :class:`align.LinearMap` or an :class:`align.ClusterMap` (recorded as ``map_kind``).
        """
        check_name(name, "map name")
        check_name(source_space, "source space")
        check_name(target_space, "target space")
        if alias is not None:
            check_alias(alias)
        tags = check_tags(tags, f"map {name}")
        for what, text in (("method", str(method)), ("description", description), ("report_path", report_path)):
            check_text(text, what)
        fmt = artifact_format or self.artifact_format
        if fmt not in ARTIFACT_FORMATS:
            raise InvalidNameError(f"artifact_format must be one of {sorted(ARTIFACT_FORMATS)}")
        if not isinstance(map_, (LinearMap, ClusterMap)):
            raise InvalidNameError(f"map_ must be an align.LinearMap or align.ClusterMap, got {type(map_).__name__}"
                                   + (" (register the maps of a chain one by one)" if isinstance(map_, MapChain) else ""))
        values = dict(source_space=source_space, target_space=target_space, source_dim=map_.source_dim,
                      target_dim=map_.target_dim, method=str(method), params=params or {},
                      random_state=check_seed(random_state),
                      data_hashes=data_hashes or {}, package_version=package_version(), created_at=now(),
                      metrics=metrics or {}, artifact_format=fmt,
                      deleted=False, description=description or "", report_path=report_path, inputs=inputs or {},
                      map_kind=map_.map_kind, n_clusters=int(getattr(map_, "n_clusters", 0)))

        encoders = encoders or {}  # {space: encoder}: recorded on a space this registration creates (as steers do)
        for enc in encoders.values():
            check_text(enc, "space encoder")

        def spaces(t):
            self._new_space(t, source_space, map_.source_dim, encoders.get(source_space))
            self._new_space(t, target_space, map_.target_dim, encoders.get(target_space))

        return self._maps.register(name, values, (map_.to_bytes(fmt), ARTIFACT_FORMATS[fmt]), alias=alias, tags=tags,
                                   before=spaces)

    def get_version(self, name: str, version: int) -> VersionInfo:
        """The version record (deleted ones included, flagged)."""
        return self._maps.get(name, version)

    def list_versions(self, name: str, include_deleted: bool = True) -> list[VersionInfo]:
        return self._maps.list(name, include_deleted)

    def resolve(self, ref: str) -> VersionInfo:
        """``name`` → the version the map contributes to paths: its live :attr:`path_alias` (``prod``) version
        when that alias is set, else its newest live version not flagged unreliable; ``name@alias`` → the alias's
        version; ``name:N`` → version N. A bare name so never lands on a failed refit that the paths skip, nor
        on a refit newer than the pinned version that searches use: a client transforming by name and a
        search through the same map get the same version.

        Raises NotFoundError for unknown names/aliases/versions, DeletedVersionError (a NotFoundError) when the
        version, or the alias's version, was deleted, and NoReliableVersionError (a NotFoundError naming them)
        for a bare name whose live versions are all flagged unreliable: it resolved to the newest of them, so a
        transform by name answered with a map searches never use, and no sign of it; ``name:N`` uses one anyway.
        What only displays a map uses :meth:`inspect`.
        """
        name, alias, version = parse_ref(ref)
        if alias is None and version is None:
            with self.db.tx() as t:
                pinned = self._maps.live_alias(t, name, self.path_alias)
                if pinned is not None:
                    return self._maps.get_in(t, name, pinned)
                flagged = []
                for r in self._maps.rows(t, name, live=True, newest_first=True, cols="version, metrics, method"):
                    if reliable(json.loads(r["metrics"] or "{}"), r["method"]):
                        return self._maps.get_in(t, name, int(r["version"]))
                    flagged.append(int(r["version"]))
            if flagged:
                refs = ", ".join(f"{name}:{v}" for v in flagged)
                raise NoReliableVersionError(
                    f"map {name!r} has no version a bare name may use: its live version(s) {refs} are flagged "
                    f"unreliable (searches use none either); name one to use it anyway, e.g. {name}:{flagged[0]}",
                    flagged)
        return self._maps.resolve(ref)

    def inspect(self, ref: str) -> VersionInfo:
        """The version to show for ``ref``: :meth:`resolve`'s, except that a bare name whose live versions are all
        flagged unreliable shows the newest of them (flagged in its metrics) instead of refusing; for what only
        displays a map (``registry show``, ``GET /v1/maps/{ref}``), never for what applies one."""
        try:
            return self.resolve(ref)
        except NoReliableVersionError:
            return self._maps.resolve(ref)

    def load_map(self, ref) -> LinearMap | ClusterMap:
        """Resolve ``ref`` (or take a VersionInfo) and read its artifact, verifying the sha256 (cached)."""
        return self._maps.load(self.resolve(ref) if isinstance(ref, str) else ref)

    def compose(self, chain: list[VersionInfo]) -> LinearMap | ClusterMap | MapChain:
        """The map ``chain[0]`` then ``chain[1]`` ... composed (one non-empty chain; cached by the shas).

        Linear maps whose fold is exact (:meth:`align.LinearMap.compose` says so: each step but the last
        orthogonal, frames agreeing): one folded :class:`align.LinearMap`. Anything else (a cluster map, or a
        non-orthogonal step whose output the next map renormalises): an :class:`align.MapChain` that applies the
        maps in sequence, so a path answers exactly as the same versions applied in turn.
        """

        def make():
            maps = [self.load_map(v) for v in chain]
            if not all(isinstance(m, LinearMap) for m in maps):
                return MapChain(maps)
            m = maps[0]
            for nxt in maps[1:]:
                m = m.compose(nxt)
                if not m.metadata.get("exact"):  # the fold drops the inner renormalisation: not the same answers
                    return MapChain(maps)
            return m

        if len(chain) == 1:
            return self.load_map(chain[0])
        return self.cache.get(_chain_key(chain), make)

    def cached_compose(self, chain: list[VersionInfo]) -> LinearMap | ClusterMap | MapChain | None:
        """:meth:`compose` of ``chain`` when it is in memory, else None (reads nothing, computes nothing)."""
        if len(chain) == 1:
            return self.cached_map(chain[0])
        return self.cache.peek(_chain_key(chain))

    def artifact_file(self, ref) -> Path:
        v = ref if isinstance(ref, VersionInfo) else self.resolve(ref)
        return self.store.path(v.artifact_path)

    def report_file(self, ref) -> Path | None:
        """Absolute path of a version's HTML report (relative paths are under ``report_dir``), or None."""
        v = ref if isinstance(ref, VersionInfo) else self.resolve(ref)
        return self.report_path_of(v.report_path) if v.report_path else None

    def report_path_of(self, report_path: str) -> Path:
        """Absolute path of a recorded ``report_path`` (a relative one is under ``report_dir``)."""
        p = Path(report_path)
        return p if p.is_absolute() else (self.report_dir / p).resolve()

    def list_maps(self, *, after: str | None = None, limit: int | None = None, name: str | None = None) -> list[dict]:
        """One dict per map name: spaces, dims, latest live version, ``aliases`` {alias: version}, counts,
        ``unreliable_versions`` and the ``path_version`` (see :meth:`find_path`). In name order; only the names
        after ``after``, the first ``limit``, or only ``name`` (:meth:`~.entity.VersionedStore.summaries`)."""
        with self.db.tx() as t:
            out = self._maps.summaries(t, after=after, limit=limit, name=name)
            live: dict[str, list] = {}
            for r in self._maps.among(t, [m["name"] for m in out], "SELECT name, version, metrics, method FROM "
                                      "versions WHERE deleted = 0 AND {} ORDER BY name, version"):
                live.setdefault(r["name"], []).append(r)
        for m in out:  # find_path's rule (paths.path_choice) on the same rows: the live alias, else newest reliable
            ok = {int(r["version"]): reliable(json.loads(r["metrics"] or "{}"), r["method"])
                  for r in live.get(m["name"], [])}
            m["unreliable_versions"] = [v for v, good in ok.items() if not good]
            edge = path_choice(m["aliases"].get(self.path_alias), sorted(ok, reverse=True), int, ok.__getitem__)
            m["path_version"] = None if edge is None else edge[0]
        return out

    def live_map_names(self, names: list[str]) -> set[str]:
        """The names among ``names`` that have a live (not deleted) version: one query (``/metrics`` shows the
        counters of these alone)."""
        with self.db.tx() as t:
            rows = self._maps.among(t, list(names), "SELECT DISTINCT name FROM versions WHERE deleted = 0 AND {}")
        return {r["name"] for r in rows}

    # --- mutable annotations ----------------------------------------------------------------
    def set_alias(self, name: str, alias: str, version: int, *, expected=None) -> VersionInfo:
        """Point ``name@alias`` at ``version`` (moves an existing alias). Deleted version: ConflictError.
        ``expected``: compare-and-set (:meth:`~.entity.VersionedStore.set_alias`)."""
        return self._maps.set_alias(name, alias, version, expected=expected)

    def alias_version(self, name: str, alias: str) -> int:
        """The version ``name@alias`` points at (NotFoundError when it is not set)."""
        return self._maps.alias(name, alias)

    def delete_alias(self, name: str, alias: str, *, expected=None) -> None:
        """Remove ``name@alias``; ``expected``: compare-and-delete (:meth:`~.entity.VersionedStore.delete_alias`)."""
        self._maps.delete_alias(name, alias, expected=expected)

    def set_tag(self, name: str, version: int, key: str, value, *, check=None) -> VersionInfo:
        """``check(record)``: a precondition on the version as it is in the write's transaction (raises: nothing
        written); for ``delete_tag`` too. A deleted version: ConflictError."""
        return self._maps.set_tag(name, version, key, value, check=check)

    def delete_tag(self, name: str, version: int, key: str, *, check=None, missing_ok: bool = False) -> VersionInfo:
        """A tag that is not set: NotFoundError naming those that are, unless ``missing_ok``."""
        return self._maps.delete_tag(name, version, key, check=check, missing_ok=missing_ok)

    def delete_version(self, name: str, version: int) -> VersionInfo:
        """Soft delete: the row and artifact stay (lineage), but the version no longer resolves; :meth:`gc` removes
        the files of deleted versions."""
        return self._maps.delete(name, version)

    def delete_version_once(self, name: str, version: int) -> tuple[VersionInfo, bool, str | None]:
        """:meth:`delete_version`, and whether it was deleted before (and when): see
        :meth:`~.entity.VersionedStore.delete_once`."""
        return self._maps.delete_once(name, version)

    # --- maintenance ------------------------------------------------------------------------
    def verify(self, sweep: bool = False) -> dict:
        """:func:`.verify.verify_registry`: the database file, every artifact and alias, version numbers."""
        return verify_registry(self, sweep)

    def gc(self, *, older_than_s: float | None = None, dry_run: bool = False, wait_s: float = GC_WAIT_S,
           orphans: bool = False) -> dict:
        """:func:`.gc.collect_deleted`: remove deleted versions' artifacts (unless shared) and reports; rows stay."""
        return collect_deleted(self, older_than_s=older_than_s, dry_run=dry_run, wait_s=wait_s, orphans=orphans)

    # --- bundles ----------------------------------------------------------------------------
    def export(self, path, names: list[str] | None = None) -> Path:
        """:func:`.bundle.export_bundle` (a version whose files ``registry gc`` collected travels as its record)."""
        return export_bundle(self, Path(path), names)

    def import_(self, path, *, on_conflict: str = "error") -> dict:
        return import_bundle(self, Path(path), on_conflict=on_conflict)


def open_registry(url: str, artifact_dir, **kw) -> Registry:
    """Open (creating if needed) the registry at ``url`` with artifacts under ``artifact_dir``."""
    return Registry(url, artifact_dir, **kw)


def _chain_key(chain: list[VersionInfo]) -> tuple:
    """The artifact cache key of a composed chain of maps (immutable: by the versions' sha256)."""
    return ("chain", *(v.artifact_sha256 for v in chain))
