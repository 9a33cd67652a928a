"""Steers in the registry: named, immutable numbered versions with lineage and aliases.

Mixed into :class:`~service.registry.core.Registry`. The lifecycle (write path, resolve, aliases,
soft delete, list) is the one every versioned entity shares (:mod:`.entity`, kind ``STEERS``);
this module adds what is special to steers: the artifact (``align.Steer`` / ``align.MeanShift``
``.npz`` bytes, no pickle, verified by sha256 on every read), its rank, and the lens. Names and
references follow :mod:`.names` (``name``, ``name@alias``, ``name:N``).
"""

from __future__ import annotations

import json

from align.steer import MeanShift, Steer

from .entity import now, package_version
from .errors import InvalidNameError, NoReliableVersionError
from .models import SteerInfo
from .names import check_alias, check_name, check_seed, check_text, parse_ref
from .paths import path_choice

__all__ = ["SteerRegistryMixin"]


def _reliable(row) -> bool:
    """Whether a stored steer version's row (its ``metrics`` JSON) may be reached by a bare name: not flagged
    ``reliable: false`` (older versions, with no verdict, count as reliable). One rule for resolving and listing."""
    return json.loads(row["metrics"] or "{}").get("reliable") is not False


class SteerRegistryMixin:
    """``register_steer`` / ``resolve_steer`` / ``load_steer`` / ``list_steers`` / ``set_steer_alias`` /
    ``delete_steer_alias`` / ``delete_steer_version`` over the Registry's ``entities["steers"]`` store (and
    ``_ensure_space``)."""

    def register_steer(self, name: str, steer, *, space: str, params: dict | None = None, random_state=None,
                       data_hashes: dict | None = None, metrics: dict | None = None, alias: str | None = None,
                       description: str = "", lens: list | None = None, inputs: dict | None = None,
                       encoder: str | None = None) -> SteerInfo:
        """Store ``steer`` as the next version of steer ``name`` in ``space`` (auto-numbered, atomic).

        The space is created on first use (dim from the steer; ``encoder`` recorded on it then), in the same
        transaction as the version; another dim, or a steer name already bound to another space, raises
        ConflictError.
        """
        check_name(name, "steer name")
        check_name(space, "space")
        if alias is not None:
            check_alias(alias)
        if not isinstance(steer, (Steer, MeanShift)):
            raise InvalidNameError("steer must be an align.Steer or align.MeanShift")
        check_text(description, "steer description")
        if encoder is not None:
            check_text(encoder, "space encoder")
        rank = steer.rank if isinstance(steer, Steer) else 0
        values = dict(space=space, dim=steer.dim, rank=rank,
                      method=str(steer.metadata.get("method") or ("lm-steer" if rank else "mean-shift")),
                      params=params or {}, random_state=check_seed(random_state),
                      data_hashes=data_hashes or {}, package_version=package_version(), created_at=now(),
                      metrics=metrics or {}, deleted=False,
                      description=description or "", lens=lens or [], inputs=inputs or {})
        return self.entities["steers"].register(name, values, (steer.to_bytes(), "npz"), alias=alias,
                                                before=lambda t: self._new_space(t, space, steer.dim, encoder))

    def get_steer(self, name: str, version: int) -> SteerInfo:
        return self.entities["steers"].get(name, version)

    def resolve_steer(self, ref: str) -> SteerInfo:
        """``name`` → its ``prod`` (:attr:`path_alias`) version when that alias is set and live, else its newest
        live version not flagged unreliable (as a bare map name: a refit reaches searches and applies only when
        ``prod`` moves, and a flagged refit never); ``name@alias``; ``name:N`` (NotFoundError /
        DeletedVersionError; NoReliableVersionError for a bare name whose live versions are all flagged)."""
        st = self.entities["steers"]
        name, alias, version = parse_ref(ref, "steer")
        if alias is None and version is None:
            flagged = []
            with self.db.tx() as t:
                if st.live_alias(t, name, self.path_alias) is None:
                    for r in st.rows(t, name, live=True, newest_first=True, cols="version, metrics"):
                        if _reliable(r):
                            return st.get_in(t, name, int(r["version"]))
                        flagged.append(int(r["version"]))
            if flagged:
                refs = ", ".join(f"{name}:{v}" for v in flagged)
                raise NoReliableVersionError(
                    f"steer {name!r} has no version a bare name may use: its live version(s) {refs} are flagged "
                    f"unreliable; name one to use it anyway, e.g. {name}:{flagged[0]}", flagged)
        return st.resolve(ref, pin=self.path_alias)

    def inspect_steer(self, ref: str) -> SteerInfo:
        """The version to show for ``ref``: :meth:`resolve_steer`'s, except that a bare name whose live versions
        are all flagged unreliable shows the newest of them (as :meth:`inspect` for maps): for what only displays
        a steer (``steer show``, ``GET /v1/steers/{ref}``, its lens), never for what applies one."""
        try:
            return self.resolve_steer(ref)
        except NoReliableVersionError:
            return self.entities["steers"].resolve(ref, pin=self.path_alias)

    def load_steer(self, ref) -> Steer | MeanShift:
        """Resolve ``ref`` (:meth:`resolve_steer`; or take a SteerInfo) and read its artifact, verifying the sha256
        (cached)."""
        return self.entities["steers"].load(self.resolve_steer(ref) if isinstance(ref, str) else ref)

    def list_steer_versions(self, name: str, include_deleted: bool = True) -> list[SteerInfo]:
        """Every version of steer ``name``, oldest first, each with its aliases (NotFoundError for an unknown name),
        as :meth:`~.core.Registry.list_versions` for a map."""
        return self.entities["steers"].list(name, include_deleted)

    def list_steers(self, *, after: str | None = None, limit: int | None = None,
                    name: str | None = None) -> list[dict]:
        """One dict per steer name: space, dim, latest live version, ``aliases`` {alias: version}, counts,
        ``unreliable_versions`` (live, flagged) and ``bare_version``: what a bare name resolves to
        (:meth:`resolve_steer`: the live ``prod`` version, else the newest live one not flagged; None: none, as
        ``path_version`` for a map). In name order, only the names after ``after``, the first ``limit``, or only
        ``name`` (:meth:`~.entity.VersionedStore.summaries`)."""
        st = self.entities["steers"]
        with self.db.tx() as t:
            out = st.summaries(t, after=after, limit=limit, name=name)
            live: dict[str, list] = {}
            for r in st.among(t, [s["name"] for s in out], f"SELECT name, version, metrics FROM {st.kind.table} "
                              "WHERE deleted = 0 AND {} ORDER BY name, version"):
                live.setdefault(r["name"], []).append(r)
        for s in out:  # resolve_steer's rule on the same rows (paths.path_choice, as a map's path_version)
            ok = {int(r["version"]): _reliable(r) for r in live.get(s["name"], [])}
            s["unreliable_versions"] = [v for v, good in ok.items() if not good]
            bare = path_choice(s["aliases"].get(self.path_alias), sorted(ok, reverse=True), int, ok.__getitem__)
            s["bare_version"] = None if bare is None else bare[0]
        return out

    def set_steer_alias(self, name: str, alias: str, version: int, *, expected=None) -> SteerInfo:
        """Point ``name@alias`` at ``version`` (moves an existing alias). Deleted version: ConflictError.
        ``expected``: compare-and-set, as for maps."""
        return self.entities["steers"].set_alias(name, alias, version, expected=expected)

    def steer_alias_version(self, name: str, alias: str) -> int:
        """The version steer ``name@alias`` points at (NotFoundError when it is not set)."""
        return self.entities["steers"].alias(name, alias)

    def delete_steer_alias(self, name: str, alias: str, *, expected=None) -> None:
        """Remove ``name@alias`` (NotFoundError when it is not set); a bare name then means the latest live version
        if the alias was ``prod``. ``expected``: compare-and-delete, as for maps."""
        self.entities["steers"].delete_alias(name, alias, expected=expected)

    def delete_steer_version(self, name: str, version: int) -> SteerInfo:
        """Soft delete: the row and artifact stay (lineage), the version no longer resolves."""
        return self.entities["steers"].delete(name, version)

    def delete_steer_version_once(self, name: str, version: int) -> tuple[SteerInfo, bool, str | None]:
        """:meth:`delete_steer_version`, whether it was deleted before (nothing written) and when, as for maps."""
        return self.entities["steers"].delete_once(name, version)
