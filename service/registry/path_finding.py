"""Paths between spaces in the registry: how good a map version looks (:meth:`~PathFindingMixin.quality`), what a
bare name means and when a new version makes it mean a worse one, and the chain of maps :meth:`find_path` picks.

Mixed into :class:`~service.registry.core.Registry` (moved out of :mod:`.core` to give that module room): it reads
the Registry's ``db``, ``path_alias``, :meth:`resolve`, :meth:`alias_version` and :meth:`compose`. The chains
themselves are chosen by :mod:`.paths`, the figures read by :mod:`.quality`.
"""

from __future__ import annotations

import math

from align import LinearMap, MapChain

from .errors import ConflictError, NotFoundError, unknown
from .models import VersionInfo
from .names import check_name
from .paths import best_chain, edge_versions, longer_wins
from .quality import judged, quality_words, reliable, span

__all__ = ["PathFindingMixin"]


class PathFindingMixin:
    """``PATH_ALIAS`` / ``is_reliable`` / ``quality`` / ``quality_source`` / ``resolve_bare`` /
    ``default_change_note`` / ``path_candidates`` / ``find_path`` / ``chain_quality`` / ``compose_path``."""

    # --- paths between spaces ---------------------------------------------------------------
    PATH_ALIAS = "prod"  #: the default :attr:`path_alias`

    @staticmethod
    def is_reliable(v: VersionInfo) -> bool:
        """False when the fit flagged the version unreliable, or its held-out pairs do not beat chance
        (:func:`~service.registry.quality.reliable`: a verdict recorded before that test is judged again)."""
        return reliable(v.metrics, v.method)

    @staticmethod
    def quality(v: VersionInfo) -> tuple[int, float]:
        """How good a version is for path choice: ``(kind, score)``, higher first.

        kind 2: a held-out top-1 put on a pool of 1,000 candidates by :func:`align.metrics.top1_at`, so figures
        from pools of different sizes compare (a fifth of 500 pairs is an easier pool than a fifth of 5,000; 100
        eval rows an easier one than 2,000): the one the user recorded (``eval.top1`` among ``eval.n_candidates``,
        ``vecbridge eval --record``) when there is one, else the fit's own (``heldout_top1``: its held-out split or
        k-fold cross-validation). Recorded and fit figures rank together by score: recording an eval says how
        good a map is, it does not promote it over a better one. kind 1: training top-1 of a paired fit (a map
        of few pairs memorises them, so it ranks below any held-out figure); kind 0: none.
        """
        return PathFindingMixin._judged(v)[:2]

    @staticmethod
    def quality_source(v: VersionInfo) -> str:
        """Where :meth:`quality`'s figure comes from: ``"eval"`` (recorded), ``"fit"`` (the fit's held-out
        top-1), ``"train"`` (training top-1) or ``"none"``."""
        return PathFindingMixin._judged(v)[2]

    def resolve_bare(self, name: str) -> VersionInfo | None:
        """The version a bare ``name`` means now (:meth:`resolve`); None when no such map, no live version, or only
        versions flagged unreliable."""
        try:
            return self.resolve(name)
        except NotFoundError:
            return None

    def default_change_note(self, before: VersionInfo | None, new: VersionInfo) -> str | None:
        """A line for the user when registering ``new`` made a bare name mean a version that looks worse.

        With no ``prod`` alias a bare ``NAME`` means the newest reliable version, so a refit from fewer pairs
        (or of a weaker family) silently replaced a better map for every client transforming by name. When
        ``new`` is now what the name means (``before``: what it meant) and its :meth:`quality` (held-out top-1
        put on 1,000 candidates) is below ``before``'s by more than 0.05, the note says it looks worse and how to
        keep ``before``; when ``new`` has no figure of ``before``'s kind (no held-out figure where ``before`` had one)
        it cannot be compared, and the note says that instead ("looks worse" is a held-out figure lower by > 0.05).
        A figure measured among fewer than 1,000 candidates lies on 1,000 anywhere in its :func:`.quality.span`:
        "looks worse" only when the whole of new's lies more than 0.05 below before's, else the note says the two
        cannot be compared as recorded and how to measure them alike (a 500-pair refit, 0.78 among its 100-candidate
        folds, was put on 1,000 at 0.089 and said to look worse than 0.514; measured on 1,000 it was 0.559).
        """
        now = self.resolve_bare(new.name)
        if before is None or before.version == new.version or now is None or now.version != new.version:
            return None
        (kb, qb), (kn, qn) = self.quality(before), self.quality(new)
        if not (kn < kb or (kn == kb == 2 and qn < qb - 0.05)):
            return None
        (low_b, high_b), (low_n, high_n) = span(before), span(new)
        # worse beyond doubt: even new's best reading on 1,000 candidates is below before's worst. A figure from a
        # small pool converts to 1,000 only as a range, and its lower end alone called a better map worse
        worse = kn == kb and high_n < low_b - 0.05
        pin = self.path_alias
        try:  # an alias left on a deleted version does not resolve: "moved to it" only when it is on new
            at = self.alias_version(new.name, pin)
        except NotFoundError:
            at = None
        why = f"its {pin!r} alias was moved to it" if at == new.version else (f"its {pin!r} alias is on deleted "
              f"{new.name}:{at}" if at is not None else f"no {pin!r} alias") + ": its newest reliable version"
        if worse or kn < kb:
            return (f"{new.name!r} now means {new.ref} ({why}; {quality_words(new, converted=False)}), which "
                    f"{'looks worse than' if worse else 'cannot be compared with'} {before.ref}, which it meant until "
                    f"now ({quality_words(before, converted=False)}); keep "
                    f"{before.ref} with `vecbridge registry alias {new.name} {pin} {before.version}` "
                    f"(HTTP: PUT /v1/maps/{new.name}/aliases/{pin})")
        return (f"{new.name!r} now means {new.ref} ({why}; {quality_words(new, converted=False)}), which may be "
                f"worse than {before.ref}, which it meant until now ({quality_words(before, converted=False)}), or "
                f"not: on 1,000 candidates the two lie at {_range(low_n, high_n)} and {_range(low_b, high_b)} (a "
                f"figure measured among fewer candidates is at most what it was there and at least what the "
                f"independence model puts it at), so they cannot be compared as recorded; evaluate both on the same "
                f"held-out rows (`vecbridge eval --map {new.ref} ... --record`, and {before.ref}) to tell, or keep "
                f"{before.ref} with `vecbridge registry alias {new.name} {pin} {before.version}` "
                f"(HTTP: PUT /v1/maps/{new.name}/aliases/{pin})")

    @staticmethod
    def _judged(v: VersionInfo) -> tuple[int, float, str]:
        """``(kind, score, source)`` of :meth:`quality` and :meth:`quality_source`, read once."""
        return judged(v)[:3]

    def path_candidates(self, source_space: str, target_space: str, alias: str | None = None) -> list[VersionInfo]:
        """Every map's path version from ``source_space`` straight to ``target_space``, best first (see find_path)."""
        alias = alias or self.path_alias
        with self.db.tx() as t:
            return edge_versions(self, t, alias, (source_space, target_space)).get((source_space, target_space), [])

    def find_path(self, source_space: str, target_space: str, alias: str | None = None) -> list[VersionInfo]:
        """The chain of maps from ``source_space`` to ``target_space``: the best of the shortest chains, unless a
        chain one map longer is better (:func:`.paths.longer_wins`: all its maps pinned by the alias; else every map
        with a held-out figure and a higher product of them, never a training figure: a direct map of 200 glove->e5
        pairs, held-out top-1 0.05, used to win over glove->minilm->e5 at 0.65 x 0.98, and search through it found
        0.32 instead of 0.54 of the texts).

        Of several chains of the same length (through different spaces), the best by :meth:`chain_quality`: all
        its maps pinned, then the lowest kind of figure and the product; of equals, the one whose first map is the
        newest, then its second, ... (the breadth-first search kept the first chain it reached, in space-name
        order: a->b->d at held-out 0.05 x 0.05 over a->c->d at 0.95 x 0.95, or over a->c->d pinned by ``prod``).

        Each map contributes its ``alias`` (default :attr:`path_alias`) version when that alias exists and is live,
        else its newest live version not flagged unreliable; a map with neither is left out. Where several
        maps join the same two spaces, the choice is, in order: a map pinned by the alias; then by
        :meth:`quality`: the best held-out top-1 on a common pool (a recorded ``eval.top1``, else the fit's
        own), the training top-1; the newest.
        Never name order. Same space: ``[]``. No chain: NotFoundError.
        The versions are read in one transaction (:func:`.paths.edge_versions`) and the chains are chosen
        without listing them (:func:`.paths.best_chain`): listing them took 17 s through 12 layers of 4
        model variants (4^12 chains).
        """
        alias = alias or self.path_alias
        check_name(source_space, "source space")
        check_name(target_space, "target space")
        with self.db.tx() as t:
            for s in (source_space, target_space):
                if t.one("SELECT 1 FROM spaces WHERE name = ?", (s,)) is None:
                    raise unknown(t, "spaces", "space", s)
            if source_space == target_space:
                return []
            edges = edge_versions(self, t, pin := alias)
        best: dict[str, list[VersionInfo]] = {}
        for (source, _), cands in edges.items():
            best.setdefault(source, []).append(cands[0])
        seen, layer, hops = {source_space}, {source_space}, 0  # breadth-first: only the shortest length
        while layer and target_space not in layer:
            layer = {v.target_space for s in layer for v in best.get(s, [])} - seen
            seen |= layer
            hops += 1
        if layer:
            def weigh(v):
                return pin in (v.aliases or []), *self.quality(v)
            chain = best_chain(best, source_space, target_space, hops, weigh)
            longer = best_chain(best, source_space, target_space, hops + 1, weigh)
            better = longer and longer_wins(self.chain_quality(longer, alias), self.chain_quality(chain, alias))
            return longer if better else chain
        raise NotFoundError(f"no chain of maps leads from space {source_space!r} to {target_space!r} "
                            f"(unreliable versions are not used; pin one with a map reference)")

    @classmethod
    def chain_quality(cls, chain: list[VersionInfo], alias: str | None = None) -> tuple[bool, int, float, int]:
        """How good a chain of maps is for :meth:`find_path`, higher first: ``(every map pinned by alias, min
        kind, product of scores, -length)`` over its maps' :meth:`quality` (``alias`` default ``prod``). The
        product of held-out top-1 figures stands in for the composed map's (a query must survive every map); it
        counts only when every map has a figure (kind > 0), else the chain with figures wins, then the shorter.
        Between a chain and one a map longer only held-out figures count (:func:`.paths.longer_wins`)."""
        alias = alias or cls.PATH_ALIAS
        q = [cls.quality(v) for v in chain]
        kind = min(k for k, _ in q)
        pinned = all(alias in (v.aliases or []) for v in chain)
        return pinned, kind, math.prod(x for _, x in q) if kind > 0 else 0.0, -len(chain)

    def compose_path(self, source_space: str, target_space: str) -> LinearMap | MapChain:
        """The composed map along :meth:`find_path` (identity-free: same space raises ConflictError)."""
        chain = self.find_path(source_space, target_space)
        if not chain:
            raise ConflictError("source and target space are the same; no map needed")
        return self.compose(chain)


def _range(low: float, high: float) -> str:
    """``0.089-0.780``, or one figure when both ends are one."""
    return f"{low:.3f}" if abs(high - low) < 5e-4 else f"{low:.3f}-{high:.3f}"
