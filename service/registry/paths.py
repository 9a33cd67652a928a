"""Chains of maps between spaces, for :meth:`Registry.find_path <service.registry.core.Registry.find_path>`.

- :func:`edge_versions` — every map's path version, grouped by the two spaces it joins, best first: three
  queries over the live versions in the caller's transaction (a transaction and several queries per map
  pair made a one-map path take 0.6 s on 5,000 maps).
- :func:`best_chain` — the best of the chains of a given number of maps: of the shortest (the breadth-first search
  kept the first it reached, in space-name order: a chain of held-out top-1 0.05 x 0.05 over one of 0.95 x 0.95,
  or over one the ``prod`` alias pinned), and of those one map longer, which :meth:`find_path` compares with it
  (:func:`longer_wins`); found without listing them: listing every chain walked every path from the source
  (4^12 of them through 12 layers of 4 model variants: 17 s per search).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import groupby

from .models import VersionInfo, columns, from_row

__all__ = ["best_chain", "edge_versions", "longer_wins", "path_choice"]

#: ``(every map pinned, lowest kind)`` of a chain, best first: the head of :meth:`Registry.chain_quality`
_CATEGORIES = ((True, 2), (True, 1), (True, 0), (False, 2), (False, 1), (False, 0))


def path_choice(pinned: int | None, newest_first: Iterable, version: Callable[[object], int],
                ok: Callable[[object], bool]) -> tuple[object, bool] | None:
    """The version a map contributes to paths, of its live versions ``newest_first``: the ``pinned`` one (the path
    alias's; True) when it is among them, else the newest that is ``ok`` (reliable; False); None when neither.
    The one rule behind :func:`edge_versions` (paths) and ``path_version`` (:meth:`Registry.list_maps`)."""
    if pinned is None:  # lazily: the newest reliable is usually the first
        return next(((item, False) for item in newest_first if ok(item)), None)
    fallback = None
    for item in newest_first:
        if version(item) == pinned:
            return item, True
        if fallback is None and ok(item):
            fallback = item, False
    return fallback


def edge_versions(reg, t, alias: str, pair: tuple[str, str] | None = None) -> dict[tuple[str, str], list]:
    """``{(source_space, target_space): [path version of each map joining them, best first]}`` (only ``pair``
    when given), read in transaction ``t``.

    A map's path version is its live ``alias`` version when there is one (pinned), else its newest live version
    that ``reg.is_reliable``; a map with neither is left out. Best first: pinned, then ``reg.quality``, then the
    newest (``created_at``), then the name (the order :meth:`Registry.path_candidates` documents).
    """
    where, args = ("", ()) if pair is None else (" AND v.source_space = ? AND v.target_space = ?", tuple(pair))
    live = f"JOIN versions v ON v.name = x.name AND v.version = x.version WHERE v.deleted = 0{where}"
    aliases: dict[tuple[str, int], list[str]] = {}
    pins: dict[str, int] = {}
    for r in t.q(f"SELECT x.name, x.version, x.alias FROM aliases x {live} ORDER BY x.alias", args):
        aliases.setdefault((r["name"], int(r["version"])), []).append(r["alias"])
        if r["alias"] == alias:
            pins[r["name"]] = int(r["version"])
    tags: dict[tuple[str, int], dict] = {}
    for r in t.q(f"SELECT x.name, x.version, x.key, x.value FROM tags x {live} ORDER BY x.key", args):
        tags.setdefault((r["name"], int(r["version"])), {})[r["key"]] = r["value"]
    cols = ", ".join(f"v.{c}" for c in columns(VersionInfo))
    rows = t.q(f"SELECT {cols} FROM versions v WHERE v.deleted = 0{where} ORDER BY v.name, v.version DESC", args)

    def decode(row) -> VersionInfo:
        key = (row["name"], int(row["version"]))
        return from_row(VersionInfo, row, aliases=aliases.get(key, []), tags=tags.get(key, {}))

    out: dict[tuple[str, str], list] = {}
    for name, group in groupby(rows, key=lambda r: r["name"]):  # newest first
        edge = path_choice(pins.get(name), map(decode, group), lambda v: v.version, reg.is_reliable)
        if edge is not None:
            out.setdefault((edge[0].source_space, edge[0].target_space), []).append(edge)
    return {p: [v for v, _ in sorted(c, key=lambda e: (e[1], reg.quality(e[0]), e[0].created_at, e[0].name),
                                     reverse=True)]
            for p, c in out.items()}


def longer_wins(longer: tuple, shortest: tuple) -> bool:
    """Whether a chain one map longer replaces the shortest, from their :meth:`Registry.chain_quality`: when all
    its maps are pinned and the shortest's are not, or (pinned alike) all its maps have held-out figures (kind 2)
    whose product beats the shortest chain's (none to beat when a map of the shortest has no held-out figure).
    A training top-1 never does (a map of few pairs memorises them): a longer chain at training top-1 0.02 x 0.02
    replaced a direct map with no figure."""

    def held_out(q: tuple) -> tuple:
        pinned, kind, product = q[:3]
        return pinned, kind == 2, product if kind == 2 else 0.0

    return held_out(longer) > held_out(shortest)


def best_chain(best: dict[str, list], source: str, target: str, hops: int,
               weigh: Callable[[object], tuple[bool, int, float]]) -> list | None:
    """The best chain of exactly ``hops`` maps from ``source`` to ``target`` over ``best`` (space -> its maps, each
    with ``source_space``, ``target_space``, ``created_at`` and ``name``); None if none. :meth:`Registry.find_path`
    takes it for the shortest length and for one map more.

    ``weigh(map)`` is ``(pinned, kind, score)`` with ``0 <= score <= 1``; a chain ranks by ``(every map pinned,
    lowest kind, product of its scores left to right when that kind > 0)``, as :meth:`Registry.chain_quality`
    (its last figure, the length, is the same for all). Of equals, the chain whose first map is the newest
    (``created_at``, then ``name``), then whose second map is, and so on; never space-name order (with no
    figures every chain is an equal, and the order of names chose one).

    Precondition: no chain is shorter than ``hops - 1`` maps (ValueError otherwise); then every walk of ``hops``
    maps that takes no map from a space to itself goes through distinct spaces (a repeated space cuts out a loop
    of two maps or more, leaving a chain shorter than ``hops - 1``), so walks are counted, not paths listed:
    for each ``(pinned, kind)`` class, best first, the spaces that reach ``target`` in exactly k maps (walking
    back), the best product reaching each space after h maps (walking forward; float products are monotone, so
    the best prefix gives the best chain), then the chain is built map by map, taking the newest map after which
    that best product is still reached. Work: at most ``6 * hops * E`` for the classes and ``hops * d * hops * E``
    for the choice (E maps, d the most maps out of one space), never the number of chains.
    """
    succ = {s: [(v.target_space, v, weigh(v)) for v in sorted(vs, key=lambda v: (v.created_at, v.name), reverse=True)
                if v.target_space != s] for s, vs in best.items()}
    pred: dict[str, list] = {}
    for s, edges in succ.items():
        for x, v, w in edges:
            pred.setdefault(x, []).append((s, w))

    def reach(ok: Callable[[tuple], bool]) -> list[set[str]]:
        """``out[k]``: the spaces from which ``k`` allowed maps reach ``target``, k = 0 .. hops."""
        out = [{target}]
        for _ in range(hops):
            out.append({s for x in out[-1] for s, w in pred.get(x, ()) if ok(w)})
        return out

    everything = reach(lambda w: True)
    if any(source in everything[k] for k in range(hops - 1)):
        raise ValueError(f"a chain shorter than {hops - 1} maps leads from {source!r} to {target!r}")
    if source not in everything[hops]:
        return None
    for pinned, kind in _CATEGORIES:
        def ok(w, pinned=pinned, kind=kind) -> bool:
            return (w[0] or not pinned) and w[1] >= kind
        back = everything if (pinned, kind) == (False, 0) else reach(ok)
        if source in back[hops]:
            return _choose(succ, back, ok, (lambda w: w[2]) if kind > 0 else (lambda w: 1.0), source, target, hops)
    return None  # unreachable: the last class allows every map


def _choose(succ: dict, back: list[set[str]], ok: Callable, score: Callable, source: str, target: str,
            hops: int) -> list:
    """The chain of ``hops`` allowed maps from ``source`` to ``target`` with the best product of scores; of equals,
    the one with the newest first map, then second map, ... (``succ`` lists each space's maps newest first)."""

    def options(space: str, left: int) -> Iterable[tuple]:
        """The allowed maps out of ``space`` after which ``left`` more reach ``target``, newest first."""
        return [e for e in succ.get(space, ()) if ok(e[2]) and e[0] in back[left]]

    def best_product(space: str, product: float, left: int) -> float:
        """The best product at ``target`` after ``left`` more maps from ``space``, reached with ``product``."""
        layer = {space: product}
        for k in range(left - 1, -1, -1):
            nxt: dict[str, float] = {}
            for s, p in layer.items():
                for x, _, w in options(s, k):
                    q = p * score(w)
                    if x not in nxt or q > nxt[x]:
                        nxt[x] = q
            layer = nxt
        return layer[target]

    goal = best_product(source, 1.0, hops)
    chain, space, product = [], source, 1.0
    for left in range(hops - 1, -1, -1):
        opts = options(space, left)
        for i, (x, v, w) in enumerate(opts):  # the last option needs no check: some chain from here reaches goal
            if i == len(opts) - 1 or best_product(x, product * score(w), left) == goal:
                chain.append(v)
                space, product = x, product * score(w)
                break
    return chain
