"""Steers in the registry: named, immutable numbered versions with lineage and aliases.

Mixed into :class:`~service.registry.core.Registry`; the write path is the one of map versions
(artifact written atomically to the content-addressed store first, then one transaction that
creates the name row if new, locks it, allocates ``last_version + 1`` with the shared
:meth:`Registry._allocate_version`, inserts the row and the alias). Names and references follow
:mod:`.names` (``name``, ``name@alias``, ``name:N``). Artifacts are ``align.Steer`` /
``align.MeanShift`` ``.npz`` bytes (no pickle), verified by sha256 on every read.
"""

from __future__ import annotations

import json

from align.exceptions import SerializationError
from align.steer import MeanShift, Steer

from .errors import ConflictError, DeletedVersionError, IntegrityError, InvalidNameError, NotFoundError
from .models import SteerInfo
from .names import check_alias, check_name, parse_ref

__all__ = ["SteerRegistryMixin"]

_SCOLS = ("name, version, space, dim, rank, method, params, random_state, data_hashes, package_version, created_at, "
          "metrics, artifact_sha256, artifact_path, deleted, description, lens, inputs")


class SteerRegistryMixin:
    """``register_steer`` / ``resolve_steer`` / ``load_steer`` / ``list_steers`` / ``set_steer_alias`` /
    ``delete_steer_version`` (needs the Registry's ``db``, ``store``, ``_write`` and ``_ensure_space``)."""

    def register_steer(self, name: str, steer, *, space: str, params: dict | None = None, random_state=None,
                       data_hashes: dict | None = None, metrics: dict | None = None, alias: str | None = None,
                       description: str = "", lens: list | None = None, inputs: dict | None = None) -> SteerInfo:
        """Store ``steer`` as the next version of steer ``name`` in ``space`` (auto-numbered, atomic).

        The space is created on first use (dim from the steer); another dim, or a steer name
        already bound to another space, raises ConflictError.
        """
        from .core import _dumps, _hook, _now, package_version

        check_name(name, "steer name")
        check_name(space, "space")
        if alias is not None:
            check_alias(alias)
        if not isinstance(steer, (Steer, MeanShift)):
            raise InvalidNameError("steer must be an align.Steer or align.MeanShift")
        rank = steer.rank if isinstance(steer, Steer) else 0
        method = str(steer.metadata.get("method") or ("lm-steer" if rank else "mean-shift"))
        sha, rel = self.store.put(steer.to_bytes(), "npz")
        created = _now()
        row = dict(space=space, dim=steer.dim, rank=rank, method=method, params=_dumps(params or {}),
                   random_state=None if random_state is None else int(random_state),
                   data_hashes=_dumps(data_hashes or {}), package_version=package_version(), created_at=created,
                   metrics=_dumps(metrics or {}), artifact_sha256=sha, artifact_path=rel, deleted=0,
                   description=description or "", lens=_dumps(lens or []), inputs=_dumps(inputs or {}))

        def fn(t):
            self._ensure_space(t, space, steer.dim)
            t.q("INSERT INTO steer_names (name, space, dim, created_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (name) DO NOTHING", (name, space, steer.dim, created))
            have = t.one("SELECT space FROM steer_names WHERE name = ?" + self.db.for_update, (name,))[0]
            if have != space:
                raise ConflictError(f"steer {name!r} lives in space {have!r}, not {space!r}")
            version = self._allocate_version(t, "steer_names", name)
            cols = ["name", "version", *row]
            t.q(f"INSERT INTO steers ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                (name, version, *row.values()))
            if alias is not None:
                self._upsert_steer_alias(t, name, alias, version)
            _hook("version_inserted")
            return version

        version = self._write(fn)
        _hook("committed")
        return self.get_steer(name, version)

    # --- reading ----------------------------------------------------------------------------
    def _steer_from_row(self, t, r) -> SteerInfo:
        name, version = r[0], int(r[1])
        aliases = [a[0] for a in t.q("SELECT alias FROM steer_aliases WHERE name = ? AND version = ? ORDER BY alias",
                                     (name, version))]
        return SteerInfo(name=name, version=version, space=r[2], dim=int(r[3]), rank=int(r[4]), method=r[5],
                         params=json.loads(r[6]), random_state=None if r[7] is None else int(r[7]),
                         data_hashes=json.loads(r[8]), package_version=r[9], created_at=r[10],
                         metrics=json.loads(r[11]), artifact_sha256=r[12], artifact_path=r[13], deleted=bool(r[14]),
                         description=r[15], lens=json.loads(r[16]), inputs=json.loads(r[17]), aliases=aliases)

    def _get_steer(self, t, name: str, version: int) -> SteerInfo:
        r = t.one(f"SELECT {_SCOLS} FROM steers WHERE name = ? AND version = ?", (name, int(version)))
        if r is None:
            if t.one("SELECT 1 FROM steer_names WHERE name = ?", (name,)) is None:
                raise NotFoundError(f"unknown steer {name!r}")
            raise NotFoundError(f"steer {name!r} has no version {version}")
        return self._steer_from_row(t, r)

    def get_steer(self, name: str, version: int) -> SteerInfo:
        check_name(name, "steer name")
        with self.db.tx() as t:
            return self._get_steer(t, name, version)

    def resolve_steer(self, ref: str) -> SteerInfo:
        """``name`` → latest live version; ``name@alias``; ``name:N`` (NotFoundError / DeletedVersionError)."""
        name, alias, version = parse_ref(ref)
        with self.db.tx() as t:
            if t.one("SELECT 1 FROM steer_names WHERE name = ?", (name,)) is None:
                raise NotFoundError(f"unknown steer {name!r}")
            if alias is not None:
                r = t.one("SELECT version FROM steer_aliases WHERE name = ? AND alias = ?", (name, alias))
                if r is None:
                    raise NotFoundError(f"steer {name!r} has no alias {alias!r}")
                version = int(r[0])
            elif version is None:
                r = t.one("SELECT MAX(version) FROM steers WHERE name = ? AND deleted = 0", (name,))
                if r is None or r[0] is None:
                    raise NotFoundError(f"steer {name!r} has no live versions")
                version = int(r[0])
            s = self._get_steer(t, name, version)
        if s.deleted:
            raise DeletedVersionError(f"version {s.version} of steer {name!r} was deleted")
        return s

    def load_steer(self, ref) -> Steer | MeanShift:
        """Resolve ``ref`` (or take a SteerInfo) and read its artifact, verifying the sha256."""
        s = ref if isinstance(ref, SteerInfo) else self.resolve_steer(ref)
        data = self.store.get(s.artifact_path, s.artifact_sha256)
        cls = Steer if s.rank > 0 else MeanShift
        try:
            return cls.from_bytes(data)
        except SerializationError as exc:
            raise IntegrityError(f"artifact of steer {s.ref} cannot be read: {exc}") from None

    def list_steer_versions(self, name: str) -> list[SteerInfo]:
        check_name(name, "steer name")
        with self.db.tx() as t:
            if t.one("SELECT 1 FROM steer_names WHERE name = ?", (name,)) is None:
                raise NotFoundError(f"unknown steer {name!r}")
            return [self._steer_from_row(t, r)
                    for r in t.q(f"SELECT {_SCOLS} FROM steers WHERE name = ? ORDER BY version", (name,))]

    def list_steers(self) -> list[dict]:
        """One dict per steer name: space, dim, latest live version, ``aliases`` {alias: version}, counts."""
        out = []
        with self.db.tx() as t:
            for name, space, dim, created in t.q("SELECT name, space, dim, created_at FROM steer_names ORDER BY name"):
                latest = t.one("SELECT MAX(version) FROM steers WHERE name = ? AND deleted = 0", (name,))[0]
                n_all, n_live = t.one("SELECT COUNT(*), SUM(1 - deleted) FROM steers WHERE name = ?", (name,))
                aliases = dict(t.q("SELECT alias, version FROM steer_aliases WHERE name = ? ORDER BY alias", (name,)))
                out.append({"name": name, "space": space, "dim": int(dim),
                            "latest_version": None if latest is None else int(latest),
                            "aliases": {k: int(v) for k, v in aliases.items()}, "n_versions": int(n_all),
                            "n_live_versions": int(n_live or 0), "created_at": created})
        return out

    # --- annotations ------------------------------------------------------------------------
    @staticmethod
    def _upsert_steer_alias(t, name, alias, version):
        t.q("INSERT INTO steer_aliases (name, alias, version) VALUES (?, ?, ?) "
            "ON CONFLICT (name, alias) DO UPDATE SET version = excluded.version", (name, alias, int(version)))

    def set_steer_alias(self, name: str, alias: str, version: int) -> SteerInfo:
        """Point ``name@alias`` at ``version`` (moves an existing alias). Deleted version: ConflictError."""
        check_name(name, "steer name")
        check_alias(alias)

        def fn(t):
            if self._get_steer(t, name, int(version)).deleted:
                raise ConflictError(f"cannot point alias {alias!r} at deleted version {version} of steer {name!r}")
            self._upsert_steer_alias(t, name, alias, int(version))

        self._write(fn)
        return self.get_steer(name, int(version))

    def delete_steer_version(self, name: str, version: int) -> SteerInfo:
        """Soft delete: the row and artifact stay (lineage), the version no longer resolves."""
        check_name(name, "steer name")

        def fn(t):
            self._get_steer(t, name, int(version))
            t.q("UPDATE steers SET deleted = 1 WHERE name = ? AND version = ?", (name, int(version)))

        self._write(fn)
        return self.get_steer(name, int(version))
