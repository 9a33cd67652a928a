"""Held-out pairs of a migration fit (:func:`align.fit_migration`): how many are held out, and which."""

from __future__ import annotations

import numpy as np

from .exceptions import InputError, TooFewRowsError

__all__ = ["check_holdout", "n_holdout", "split", "scored_by"]


def check_holdout(holdout, max_holdout) -> None:
    """InputError unless ``holdout`` is a fraction in (0, 1) and ``max_holdout`` an integer >= 2."""
    if isinstance(holdout, bool) or not isinstance(holdout, (int, float, np.number)) or not 0.0 < float(holdout) < 1.0:
        raise InputError(f"holdout must be a fraction in (0, 1), got {holdout!r}")
    if isinstance(max_holdout, bool) or not isinstance(max_holdout, (int, np.integer)) or max_holdout < 2:
        raise InputError(f"max_holdout must be an integer >= 2, got {max_holdout!r}")


def scored_by(method: str) -> str:
    """Who holds pairs out, for a message: auto's selection, or a single method's held-out score (from 20 pairs)."""
    return "auto selection" if method == "auto" else f"method={method!r} holds pairs out to score the fit: it"


def n_holdout(u: int, holdout, max_holdout, distinct: str = "", what: str = "auto selection") -> int:
    """How many of ``u`` distinct pairs are held out: ``holdout`` of them, 2 to ``max_holdout``; TooFewRowsError
    unless 2 are left to fit (a holdout of 0.99 of 100 pairs was refused as "needs at least 4 pairs, got 100").
    ``what`` names who holds them out (a procrustes fit said "auto selection needs ...")."""
    check_holdout(holdout, max_holdout)
    n_val = int(min(max_holdout, max(2, round(float(holdout) * u))))
    if u < 4:
        raise TooFewRowsError(f"{what} needs at least 4 distinct pairs (2 to fit, 2 held out), got {u}{distinct}")
    if u - n_val < 2:
        raise TooFewRowsError(f"holdout {holdout} of {u} pairs{distinct} holds out {n_val} and leaves {u - n_val} to "
                              f"fit; 2 must be left to fit: give a holdout of at most {int(100 * (u - 2) / u) / 100}")
    return n_val


def split(n: int, holdout, max_holdout, rng, groups=None,
          what: str = "auto selection") -> tuple[np.ndarray, np.ndarray]:
    """``(train, held-out)`` rows: ``holdout`` (a fraction in (0, 1)) of the pairs, 2 to ``max_holdout`` of them.

    ``groups`` (:func:`align.validation.pair_groups` of repeated pairs): the distinct pairs are split instead, every
    copy of a training pair trains and one row of each held-out pair is held out. A copy on both sides was scored
    as held out: a family that memorises its training pairs (the per-cluster maps) won on it."""
    u = n if groups is None else groups[0].size
    distinct = "" if groups is None else f" distinct ones ({n} rows, {n - u} repeating another pair)"
    n_val = n_holdout(u, holdout, max_holdout, distinct, what)
    perm = rng.permutation(u)
    if groups is None:
        return np.sort(perm[n_val:]), np.sort(perm[:n_val])
    first, group = groups
    return np.sort(np.flatnonzero(~np.isin(group, perm[:n_val]))), np.sort(first[perm[:n_val]])
