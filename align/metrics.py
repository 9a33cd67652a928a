"""Evaluation on held-out pairs (ALGORITHMS.md §4).

Row ``i`` of ``X_src`` (n, d_s) and row ``i`` of ``Y_tgt`` (n, d_t) embed the same text. The
source rows are mapped into the target frame; for each, all ``n`` framed target rows are the
candidate pool, ranked by cosine (or CSLS). The true partner's score comes from the **same**
block product as the other candidates' scores (a separate dot product differs by ~1e-7 and
turns ties into rank 2); rank = 1 + number of candidates scoring higher by more than
:data:`TIE_TOL` (relative): even within one product, BLAS gives two identical candidate columns
scores that differ in the last bits, so an exact ``>`` ranked a duplicate of the true partner above it.
"""

from __future__ import annotations

import warnings
from statistics import NormalDist

import numpy as np

from .validation import (check_no_zero_rows, check_paired, check_random_state, check_rankable, check_seed,
                         distinct_pairs, pair_groups)
from .exceptions import DimensionMismatchError, InputError, ShapeError, TooFewRowsError, VecbridgeWarning
from .frames import unit_rows
from .blocks import rows_per_block
from .knn import DEFAULT_BLOCK, check_count, mean_topk
from .options import check_callable, check_flag, check_number
from .chain import MapChain, check_map
from .cluster import ClusterMap
from .maps import LinearMap

__all__ = ["INTERVAL_LEVEL", "TIE_TOL", "count_above", "cross_val_top1", "evaluate", "proportion_interval",
           "query_sample", "ranks", "retention", "top1_at", "undefined_recall"]

#: coverage of the intervals put on figures measured on a sample of the query rows
INTERVAL_LEVEL = 0.95

#: scores within this share of the true partner's (at least this much in absolute terms) tie with it: float32
#: products of 384-d unit rows carry rounding errors of ~1e-6, so a duplicate candidate must not beat the partner
TIE_TOL = 1e-5


#: why a mapped row of zeros is refused (a map with W = 0 scored top-1 1.0 on any pairs)
_ZERO_MAPPED = ("the map sends them to zero: nothing to rank (every candidate would tie with the partner and count "
                "as a hit)")


def count_above(S: np.ndarray, true: np.ndarray) -> np.ndarray:
    """For each row ``i`` of scores ``S`` (b, m), how many exceed ``true[i]`` (b,) by more than :data:`TIE_TOL`
    (relative, at least absolute): (b,) int64."""
    true = np.asarray(true)
    return (S > (true + TIE_TOL * np.maximum(1.0, np.abs(true)))[:, None]).sum(axis=1)


def ranks(Q: np.ndarray, D: np.ndarray, *, cols=None, r_q=None, r_d=None,
          block_size: int = DEFAULT_BLOCK) -> np.ndarray:
    """1-based rank of ``D[cols[i]]`` among all rows of ``D`` (m, d) for query ``Q[i]`` (q, d); (q,) int64.

    ``cols`` (q,) int: each query's true partner in ``D``; ``None``: ``Q[i]`` pairs with ``D[i]`` (q = m).
    With ``r_q`` (q,) / ``r_d`` (m,) given, scores are CSLS ``2 q·d - r_q - r_d`` instead of ``q·d``. Queries go
    in blocks of at most ``block_size`` rows and :data:`align.blocks.SCORE_BLOCK_BYTES` of scores (``rows x m``).
    Cost: ``q · m · d`` multiply-adds.
    """
    n = Q.shape[0]
    cols = np.arange(n) if cols is None else np.asarray(cols, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    step = rows_per_block(D.shape[0], block_size)
    for s in range(0, n, step):
        S = Q[s : s + step] @ D.T
        if r_d is not None:  # in place: one block of scores, not three
            S *= 2.0
            S -= r_d[None, :]
            S -= r_q[s : s + step, None]
        rows = np.arange(S.shape[0])
        true = S[rows, cols[s : s + step]]
        out[s : s + step] = 1 + count_above(S, true)
    return out


def query_sample(n: int, max_queries, random_state=0) -> np.ndarray | None:
    """The rows of ``n`` held-out pairs that act as queries when at most ``max_queries`` may.

    ``None`` (every row) when ``max_queries`` is ``None`` or ``>= n``; else ``max_queries`` distinct rows drawn
    uniformly without replacement with ``random_state``, sorted: (max_queries,) int64. Every row stays a
    candidate; only the queries are sampled, so rank-based figures keep their meaning (the pool is all ``n``)
    and cost ``max_queries · n · d`` instead of ``n² · d``. InputError unless ``max_queries`` is an int >= 1.
    """
    check_seed(random_state)  # checked when unused too (-1 passed until a sample was asked for), drawing nothing
    if max_queries is None:
        return None
    max_queries = check_count("max_queries", max_queries)
    if max_queries >= n:
        return None
    return np.sort(check_random_state(random_state).choice(n, size=max_queries, replace=False)).astype(np.int64)


def proportion_interval(hits: int, sampled: int, population: int, *, level: float = INTERVAL_LEVEL) -> list[float]:
    """Interval of a proportion measured as ``hits`` of ``sampled`` rows drawn without replacement from ``population``.

    Wilson score interval at ``level`` with the sample size scaled by the finite-population correction:
    ``n_eff = s (N - 1) / (N - s)`` for ``s`` of ``N`` rows (the variance of a share drawn without replacement is
    ``(N - s) / (N - 1)`` times the binomial one), so the interval closes to the measured share when ``s = N``.
    With ``p = hits / s``, ``z`` the normal quantile: ``(p + z²/2n_eff ± z sqrt(p(1-p)/n_eff + z²/4n_eff²))
    / (1 + z²/n_eff)``. Returns ``[low, high]`` in [0, 1].
    """
    s, N = int(sampled), int(population)
    if s < 1 or N < s or not 0 <= int(hits) <= s:
        raise InputError(f"a proportion needs 0 <= hits <= sampled <= population, sampled >= 1; got {hits}, {s}, {N}")
    level = check_number("level", level, 0.0, 1.0, lo_open=True, hi_open=True)
    p = int(hits) / s
    if s == N:
        return [p, p]
    z = NormalDist().inv_cdf(0.5 + level / 2.0)
    n_eff = s * (N - 1) / (N - s)
    den = 1.0 + z * z / n_eff
    centre = (p + z * z / (2.0 * n_eff)) / den
    half = z * np.sqrt(p * (1.0 - p) / n_eff + z * z / (4.0 * n_eff * n_eff)) / den
    return [float(max(0.0, centre - half)), float(min(1.0, centre + half))]


def undefined_recall(ks, n: int, what: str) -> None:
    """A :class:`~align.exceptions.VecbridgeWarning` from ``what`` (the caller's name) naming the cut-offs of ``ks``
    with ``k >= n``: among ``n`` candidates recall@k is 1.0 for any map there, so the caller reports NaN."""
    bad = sorted({int(k) for k in ks if k >= n})
    if bad:
        warnings.warn(f"{what}: recall@{', recall@'.join(map(str, bad))} undefined (NaN) on {n} distinct pairs: among "
                      f"{n} candidates every partner is within the top {bad[0]}, for any map; recall@k needs more "
                      "than k pairs", VecbridgeWarning, stacklevel=3)


def _intervals(r: np.ndarray, n: int, cuts: dict) -> dict:
    """``{name: proportion_interval}`` of the shares ``r <= cut`` of ranks ``r`` (s,) sampled from ``n`` rows."""
    return {name: proportion_interval(int((r <= cut).sum()), r.size, n) for name, cut in cuts.items()}


def evaluate(map_: LinearMap | ClusterMap | MapChain, X_src, Y_tgt, *, ks=(1, 5, 10), csls: bool = True,
             csls_k: int = 10, block_size: int = DEFAULT_BLOCK, max_queries: int | None = None, random_state=0) -> dict:
    """Top-1, mean rank, mean cosine and recall@k of a map on held-out pairs.

    Parameters
    ----------
    map_ : LinearMap, ClusterMap or MapChain
        Any map (what :func:`align.map_from_bytes` returns).
    X_src : array (n, d_s) raw source rows; Y_tgt : array (n, d_t) raw target rows, paired by row.
    max_queries : int or None
        Rank at most this many mapped rows (:func:`query_sample`, drawn with ``random_state``), each against all
        ``n`` target rows: ``max_queries · n · d`` work instead of ``n² · d``. ``None`` or ``>= n``: every row,
        the exact figures. The CSLS hubness of each candidate is still over all ``n`` mapped rows (one ``n²``
        pass: CSLS is defined by it).

    Returns
    -------
    dict with ``n_candidates`` (the pool size: the n distinct pairs; ``n_repeated`` rows repeating one are scored
    once, :func:`align.validation.distinct_pairs`), ``n_queries`` (rows ranked), ``top1``, ``mean_rank``,
    ``median_rank``, ``cos`` (mean cosine to the true partner over all n pairs, both in the target's centred
    frame: the raw output's cosine with the raw target rows differs), ``recall@k`` for each k, and with
    ``csls=True`` ``csls_top1`` / ``csls_mean_rank``. When the queries are a sample, ``intervals``: the
    :func:`proportion_interval` (``interval_level``) of ``top1``, each ``recall@k`` (and ``csls_top1``).

    Figures that cannot tell maps apart are not given as scores: TooFewRowsError below 2 distinct pairs (among one
    candidate every map ranks its partner first: top-1 1.0), and ``recall@k`` is NaN, with a
    :class:`~align.exceptions.VecbridgeWarning`, when ``k >= n`` (every partner is within the top ``k`` of ``n``
    candidates: 8 random pairs scored recall@10 1.0), as :func:`align.score_map` gives NaN below ``k + 1`` pairs.
    """
    check_map(map_, "evaluate needs a map")  # None was an AttributeError
    X, Y = check_paired(X_src, Y_tgt, names=("X_src", "Y_tgt"))
    check_rankable(X, name="X_src")
    check_rankable(Y, name="Y_tgt")
    block_size = check_count("block_size", block_size)
    if check_flag("csls", csls):
        csls_k = check_count("csls_k", csls_k)  # 0 made every CSLS score NaN: csls_top1 1.0 for any map
    if isinstance(ks, (str, bytes)) or not isinstance(ks, (list, tuple, np.ndarray, range)):
        raise InputError(f"ks must be a list of cut-offs (ints >= 1), got {ks!r}")
    ks = [check_count("each of ks", k) for k in ks]
    if X.shape[1] != map_.source_dim or Y.shape[1] != map_.target_dim:
        raise DimensionMismatchError(
            f"map is {map_.source_dim}->{map_.target_dim}, held-out pairs are {X.shape[1]}->{Y.shape[1]}")
    X, Y, repeated = distinct_pairs(X, Y)  # a copy of another pair is a distractor tied with its partner
    n = X.shape[0]
    if n < 2:  # one pair scored top-1, recall@k and csls_top1 1.0 for any map
        raise TooFewRowsError(f"evaluate needs at least 2 distinct held-out pairs, got {n}: among one candidate "
                              "every map ranks its partner first (top-1 1.0)")
    rows = query_sample(n, max_queries, random_state)
    Q_all = check_no_zero_rows(unit_rows(map_.apply(X, output="linear", validate=False)), name="mapped X_src",
                               why=_ZERO_MAPPED)
    D = unit_rows(map_.target_frame.apply(Y, validate=False))
    Q = Q_all if rows is None else Q_all[rows]
    r = ranks(Q, D, cols=rows, block_size=block_size)
    out = {
        "n_candidates": int(n),
        "n_repeated": repeated,
        "n_queries": int(r.size),
        "top1": float((r == 1).mean()),
        "mean_rank": float(r.mean()),
        "median_rank": float(np.median(r)),
        "cos": float(np.einsum("ij,ij->i", Q_all, D).mean()),
    }
    defined = [k for k in ks if k < n]
    for k in ks:
        out[f"recall@{k}"] = float((r <= k).mean()) if k < n else float("nan")
    undefined_recall(ks, n, "evaluate")
    if rows is not None:
        out["interval_level"] = INTERVAL_LEVEL
        out["intervals"] = _intervals(r, n, {"top1": 1, **{f"recall@{k}": k for k in defined}})
    if csls:
        r_q = mean_topk(Q, D, csls_k, block_size=block_size)
        r_d = mean_topk(D, Q_all, csls_k, block_size=block_size)
        rc = ranks(Q, D, cols=rows, r_q=r_q, r_d=r_d, block_size=block_size)
        out["csls_top1"] = float((rc == 1).mean())
        out["csls_mean_rank"] = float(rc.mean())
        if rows is not None:
            out["intervals"]["csls_top1"] = _intervals(rc, n, {"csls_top1": 1})["csls_top1"]
    return out


def retention(I_mapped: np.ndarray, I_native: np.ndarray) -> float:
    """Mean overlap@k between two result lists (n, k): |mapped ∩ native| / k averaged over queries."""
    I_mapped, I_native = np.asarray(I_mapped), np.asarray(I_native)
    if I_mapped.ndim != 2 or I_mapped.shape != I_native.shape or 0 in I_native.shape:  # 0 rows: a NaN mean
        raise ShapeError(f"retention compares two (n, k) id arrays of one shape with n, k >= 1, got "
                         f"{I_mapped.shape} and {I_native.shape}")
    k = I_native.shape[1]
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(I_mapped, I_native)]))


def cross_val_top1(X_src, Y_tgt, fit, *, folds: int = 5, max_pool: int = 1000, max_rows: int = 20000,
                   random_state=0, groups=None, fit_rows: bool = False) -> dict:
    """Held-out top-1 of the maps ``fit(X, Y) -> map`` makes, by ``folds``-fold cross-validation.

    ``X_src`` (n, d_s) / ``Y_tgt`` (n, d_t) paired rows; at most ``max_rows`` of them (a random sample) take part.
    Each fold's rows are mapped by the map fitted on the other folds, and each mapped row ranks its partner
    among the targets of its own fold, in chunks of at most ``max_pool`` (cosine in the map's target frame, as
    :func:`evaluate`). So every row's pool is its 1/``folds`` share of the pairs, capped at ``max_pool``: the pool
    of :func:`align.fit_migration`'s held-out split (a fifth of the pairs, at most 1,000), and the two figures
    measure the same thing. Unlike the training top-1 it does not reward a map that memorises its pairs: the
    folds split the distinct pairs, every copy of a pair on one side (:func:`align.validation.pair_groups`).

    Pairs too many to copy (rows memory-mapped from files, each checked once as it was read): ``groups`` is their
    :func:`~align.validation.pair_groups` found upstream (``(first, group)``; ``(np.arange(n), None)``: all
    distinct), and ``X_src`` / ``Y_tgt`` are then taken as checked (float32, finite, paired) and read at the
    held-out rows only, never whole; ``fit_rows``: ``fit(rows)`` is given the sorted indices of a fold's training
    pairs and fits them itself (reading them in blocks), instead of ``fit(X_src[rows], Y_tgt[rows])``. The same
    folds, so the same figure for the same maps.

    Returns ``{"top1", "n_candidates" (mean pool size), "folds", "n_rows"}``; TooFewRowsError below
    ``2 * folds`` rows. Same ``random_state``, same folds.
    """
    check_callable("fit", fit, optional=False)
    check_flag("fit_rows", fit_rows)
    folds = check_count("folds", folds, lo=2)  # 1 left no rows to fit on, 0 reached np.array_split
    max_pool, max_rows = check_count("max_pool", max_pool), check_count("max_rows", max_rows, lo=2 * folds)
    if groups is None:
        X, Y = check_paired(X_src, Y_tgt, names=("X_src", "Y_tgt"))
        # distinct pairs are split (pair_groups): a held-out copy of a training pair scored memorisation (ridge of
        # 1e-6 on 300 pairs, half of them twice: 0.86, against 0.29 on 450 distinct pairs); each group's first row
        # is ranked
        groups = pair_groups(X, Y)
        first, group = (np.arange(X.shape[0]), None) if groups is None else groups
    else:
        X, Y = X_src, Y_tgt
        first, group = _given_groups(groups, X, Y)
    if first.size < 2 * folds:
        raise TooFewRowsError(f"{folds}-fold cross-validation needs at least {2 * folds} distinct pairs, got "
                              f"{first.size}")
    rng = check_random_state(random_state)
    rows = first[rng.permutation(first.size)[:max_rows]]
    hits, pools = 0, []
    for part in np.array_split(rows, folds):
        train = np.setdiff1d(rows, part)
        if group is not None:  # every copy of a training pair, as the data weighs it
            train = np.flatnonzero(np.isin(group, group[train]))
        m = fit(train) if fit_rows else fit(X[train], Y[train])
        check_map(m, "fit must return a map")  # None was an AttributeError
        for chunk in np.array_split(part, -(-part.size // max_pool)):
            Q = check_no_zero_rows(unit_rows(m.apply(X[chunk], output="linear", validate=False)), name="mapped X_src",
                                   why=_ZERO_MAPPED)
            D = unit_rows(m.target_frame.apply(Y[chunk], validate=False))
            hits += int((ranks(Q, D) == 1).sum())
            pools += [chunk.size] * chunk.size
    return {"top1": hits / rows.size, "n_candidates": round(float(np.mean(pools))), "folds": int(folds),
            "n_rows": int(rows.size)}


def _given_groups(groups, X, Y) -> tuple[np.ndarray, np.ndarray | None]:
    """``(first, group)`` given to :func:`cross_val_top1` for the paired rows ``X`` / ``Y`` (shapes only read), checked
    as :func:`~align.validation.pair_groups` gives them."""
    shapes = [getattr(A, "shape", ()) for A in (X, Y)]
    if any(len(sh) != 2 for sh in shapes) or shapes[0][0] != shapes[1][0]:
        raise ShapeError(f"X_src and Y_tgt must be paired 2-D rows, got shapes {shapes[0]} and {shapes[1]}")
    n = shapes[0][0]
    try:
        first, group = groups
    except (TypeError, ValueError):
        raise InputError("groups must be (first, group), as align.validation.pair_groups gives them") from None
    first = np.asarray(first)
    ok = first.ndim == 1 and first.dtype.kind in "iu" and (first.size == 0 or 0 <= first.min() <= first.max() < n)
    if group is not None:
        group = np.asarray(group)
        ok = (ok and group.shape == (n,) and group.dtype.kind in "iu"
              and (n == 0 or 0 <= group.min() <= group.max() < first.size))
    if not ok:
        raise InputError(f"groups must be (first, group) of {n} paired rows, as align.validation.pair_groups gives "
                         f"them")
    return first, group


def top1_at(top1: float, pool: int, reference: int = 1000, n_queries: int | None = None) -> float:
    """Top-1 measured among ``pool`` candidates over ``n_queries`` queries (default ``pool``), put on a pool of
    ``reference``.

    A smaller pool (``pool < reference``): with ``p`` the chance that one distractor beats the partner
    (distractors taken as independent), ``top1 = (1 - p)^(pool - 1)``, so ``top1^((reference - 1) / (pool - 1))``.
    A share above 1/2 is first taken as ``(hits + 1/2) / (n_queries + 1)`` (Jeffreys' estimate; never raised, so a
    map at chance stays there): a perfect score on few queries is not certainty, and read as one it stayed 1.000
    at any pool (10 pairs, 2 per fold: 1.000 among 2, put on 1,000 as 1.000, and chosen for the path over a
    3,000-pair map; measured among 1,000 it is 0.015).
    Held-out top-1 falls as the pool grows, so figures from pools of different sizes only compare on a common
    one. On WordNet minilm→e5 (held out among 1,000): 0.989 among 400 → 0.970 (measured 0.972); 0.987 among 600
    → 0.977 (0.989); 0.975 among 200 → 0.870 (0.931): the order is kept. A map at chance stays at chance or below
    (``p = (1 - top1) / (pool - 1)``, the first-order form used before, put one at chance among 800 at 0.287).

    A larger pool (``pool >= reference``): the measured figure, a lower bound (fewer distractors only help). The
    independence model does not extrapolate upward: queries differ in difficulty, so a weak map's few hits do not
    spread over the others (WordNet minilm→e5, a 20-pair ridge map: 0.017 among 8,192, measured 0.078 among 1,000,
    extrapolated 0.887; a map at chance among 8,192 was put at 0.885 and chosen for the path over a real one).
    """
    top1 = min(max(float(top1), 0.0), 1.0)
    if pool <= 1 or pool >= reference:
        return top1
    n = max(int(n_queries or pool), 1)
    return float(min(top1, (top1 * n + 0.5) / (n + 1)) ** ((reference - 1) / (pool - 1)))
