"""The default embedding steer: a *local discriminant* direction in LM-Steer's bilinear form.

Retrieval with a steered query ranks candidates ``c`` by ``q^T (I + eps W) c``. For ``W = u b^T``
(rank 1) the score of ``c`` moves by ``eps (q.u)(b.c)``: an item-side boost ``b.c`` gated by the
query's component along ``u``. Only differences *within a query's own neighbourhood* change its
top-k, so ``b`` is fitted to separate attribute items from the other items **among each query's
neighbours** (not across the whole corpus, where most variance is between topics and is
irrelevant to re-ranking). With training queries ``q`` (rows of ``X``), their ``K`` nearest rows
``N(q)``, neighbourhood-centred rows ``\\tilde c = c - \\bar c_{N(q)}`` and centred targets
``\\tilde y_c = y_c - \\bar y_{N(q)}`` (``y_c = 1`` for label ``+1``, ``-beta`` for ``-1``, else 0):

.. math::  b = \\arg\\min_b \\sum_q \\sum_{c \\in N(q)} (b^\\top \\tilde c - \\tilde y_c)^2
               + \\lambda\\, \\tfrac{\\operatorname{tr} S}{d} \\lVert b\\rVert^2
             = (S + \\lambda \\tfrac{\\operatorname{tr} S}{d} I)^{-1} r,

.. math::  S = \\sum_q \\sum_{c \\in N(q)} \\tilde c \\tilde c^\\top \\in \\mathbb R^{d\\times d}, \\qquad
           r = \\sum_q \\sum_{c \\in N(q)} \\tilde y_c\\, \\tilde c

(closed form, ``d x d``; never an ``n x n`` matrix). Compared with mean-shift
(``mean(X+) - mean(X-)``, the same boost for every query) the local scatter ``S`` discounts
directions along which neighbours differ for reasons unrelated to the attribute — the
relevance-preserving part — and the local cross-covariance ``r`` rewards exactly the attribute
items that compete inside a query's own top results (``ALGORITHMS.md`` §6).

The gate ``u = m / |m|^2`` (``m`` the mean training row) makes ``q.u ≈ 1`` for typical sentence
embeddings (they share a common component), so the boost is nearly query-independent, like a
mean shift, while keeping ``q' = (I + eps W)^T q`` linear (composable, transferable with
``H^T W H``, viewable with the lens).

Shrinkage toward mean-shift, chosen on held-out rows: the local estimate is noisy where the
attribute is rare or the neighbourhoods are small, and at large ``eps`` (the results saturate with
the items of largest ``b.c`` over the whole corpus) the global class-mean difference
``v = mean(X+) - mean(X-)`` can be the better direction. The fit therefore solves the ridge
problem with a *prior* ``b_0`` on the mean-shift line instead of zero,

.. math::  b(t) = \\arg\\min_b \\lVert \\tilde N b - \\tilde y\\rVert^2 + \\lambda \\bar s \\lVert b\\rVert^2
                  + t\\, \\bar s\\, \\lVert b - b_0\\rVert^2
             = (S + (\\lambda + t) \\bar s I)^{-1} (r + t \\bar s\\, b_0), \\qquad
           b_0 = v\\, \\frac{v^\\top r}{v^\\top S v}, \\quad \\bar s = \\operatorname{tr} S / d,

(``b_0`` is the best fit of the local problem restricted to the mean-shift line), a path from the
local direction (``t = 0``) to mean-shift's (``t -> inf``). ``t`` is chosen by ``n_folds``-fold
cross-validation of the same local loss: statistics ``(S_f, r_f)`` are gathered inside each fold
(its own queries and neighbourhoods), ``b(t)`` fitted on the other folds (its prior's mean-shift line
``v`` too: nothing label-dependent from fold ``f``) is scored on fold ``f`` by
``b^T S_f b - 2 b^T r_f + sum ytilde^2`` (closed form, one eigendecomposition per fold for every
``t``), and the ``t`` with the lowest total held-out loss is refitted on all rows. Rare attributes
(few attribute rows in any neighbourhood: a noisy ``r``) get pulled toward mean-shift; common ones
keep their local direction.

Scale (the ``eps`` schedule): ``b`` is rescaled so that ``eps = 1`` keeps on average half of the top-``k``
(``k = 10``) that a search over all training rows returns for each of ``CALIBRATION_QUERIES`` training queries
(itself left out). The bisection re-ranks a pool per query, its ``CALIBRATION_POOL`` nearest rows and as many rows
of largest gated boost (where a steered top-``k`` comes from; 512 rows reproduced the full searches' overlap
within 0.002 on WordNet), and one real search at the chosen scale checks it
(``calibration.searched_overlap_at_eps_1`` in the metadata). On fewer rows the pool is all of them and ``k`` at
most half their count (a top-``k`` of ``K`` rows keeps at least ``2k - K`` however they are reordered). ``eps``
then reads as "how much of the original result list to trade for the attribute". ``eps = 0`` is the identity.
"""

from __future__ import annotations

import numpy as np

from . import linalg
from .exceptions import DegenerateInputError
from .validation import seed_record

__all__ = ["local_discriminant_factors", "fit_local", "calibrate", "overlap_at", "shift_line", "PRIOR_WEIGHTS",
           "CALIBRATION_QUERIES", "CALIBRATION_POOL"]

#: eps = 1 is calibrated on what a search over all training rows returns for this many training queries (the
#: first of the fit's random draw); before, only each query's 50 nearest rows were re-ranked
#: and attribute rows from further away entered real searches: on WordNet (MiniLM, animal vs tool, 20,000
#: training rows) eps = 1 kept 0.06-0.13 of a search's top-10, not the documented 0.5 (and with a fit's K of 11 or
#: 16, calibrating among those K rows alone needed a boost 40-250x the default's: the reason for 50)
CALIBRATION_QUERIES = 1000

#: candidates per calibration query: its CALIBRATION_POOL nearest rows and as many rows of largest boost
CALIBRATION_POOL = 256

#: candidate prior weights ``t`` (relative to ``tr S / d``); ``inf`` is the mean-shift line itself
PRIOR_WEIGHTS = (0.0, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, float("inf"))


def _neighbourhood_stats(X: np.ndarray, y: np.ndarray, I: np.ndarray, block: int = 256):
    """``S`` (d, d) and ``r`` (d,) of the local ridge problem, accumulated block by block."""
    d = X.shape[1]
    S = np.zeros((d, d))
    r = np.zeros(d)
    for s in range(0, I.shape[0], block):
        idx = I[s : s + block]
        Nb = X[idx].astype(np.float64)                         # (b, K, d)
        Nb -= Nb.mean(axis=1, keepdims=True)
        yb = y[idx]
        yb = yb - yb.mean(axis=1, keepdims=True)
        flat = Nb.reshape(-1, d)
        S += flat.T @ flat
        r += flat.T @ yb.reshape(-1)
    return S, r


def overlap_at(scores: np.ndarray, boost: np.ndarray, eps: float, k: int) -> float:
    """Mean overlap@k between the top-k of ``scores`` and of ``scores + eps * boost`` (rows = queries)."""
    base = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    moved = np.argsort(-(scores + eps * boost), axis=1, kind="stable")[:, :k]
    hits = (base[:, :, None] == moved[:, None, :]).any(axis=2).sum(axis=1)
    return float(hits.mean() / k)


def calibrate(scores: np.ndarray, boost: np.ndarray, *, k: int, target: float = 0.5) -> tuple[float, float]:
    """``(t, overlap)``: the scale ``t`` with mean overlap@k(``scores + t * boost``) ≈ ``target`` (bisection on
    log t, within 1e±4 of ``t0``, the scale at which the boost's spread inside a neighbourhood equals the scores'
    own), and the overlap it keeps. Where no ``t`` in that range trades that much (the attribute rows already lead
    the neighbourhoods: tiny sets), the smallest ``t`` at which the overlap stops falling (the steer's saturation)
    and that overlap; before, the range's cap was returned, a steer far too strong with nothing said.
    DegenerateInputError when no ``t`` moves any result."""
    spread = float(np.std(boost, axis=1).mean())
    t0 = float(np.std(scores, axis=1).mean()) / spread if spread > 0 else 0.0
    lo, hi = t0 * 1e-4, t0 * 1e4
    floor = overlap_at(scores, boost, hi, k) if np.isfinite(t0) and t0 > 0 else 1.0
    if floor >= 1.0:
        raise DegenerateInputError(
            f"the steer cannot be calibrated: no boost changes any training query's top-{k} among its "
            f"{scores.shape[1]} neighbours (the attribute does not vary inside the neighbourhoods); use more rows, "
            f"more labelled rows, or method='mean-shift'")
    target = max(target, floor)
    for _ in range(40):
        mid = float(np.sqrt(lo * hi))
        if overlap_at(scores, boost, mid, k) > target:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1.01:
            break
    return float(np.sqrt(lo * hi)), float(target)


def _neighbours(X: np.ndarray, qi: np.ndarray, n_neighbors: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores (float64) and ids of the ``min(n_neighbors, n - 1)`` nearest rows of ``X`` to each row ``qi``,
    the query itself left out: (nq, K) each."""
    from .knn import knn_unchecked

    kk = min(n_neighbors + 1, X.shape[0])
    D, I = knn_unchecked(np.ascontiguousarray(X[qi]), X, kk)
    own = I == qi[:, None]                                     # drop the query itself when present
    keep = np.where(own.any(axis=1, keepdims=True), ~own, np.arange(kk)[None, :] < kk - 1)
    return D[keep].reshape(len(qi), kk - 1).astype(np.float64), I[keep].reshape(len(qi), kk - 1)


def _calibration_pool(X: np.ndarray, qi: np.ndarray, u: np.ndarray, b: np.ndarray,
                      pool: int = CALIBRATION_POOL) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What a search over all rows of ``X`` ranks for each calibration query ``qi`` under ``q + t (q.u) b``:
    scores ``D``, gated boosts ``(q.u)(b.c)`` and ids (nq, 2P) of a pool of candidates ``c``, the query's ``P``
    nearest rows (first, best first) and the ``P`` rows of largest ``(q.u)(b.c)`` among the others: where a
    steered top-k comes from (:func:`_searched_overlap` checks the result with a real search). With at most
    ``2P + 1`` rows the pool is every row but the query itself. Costs one top-``P`` search (FAISS or blocked) and
    ``X b``; never an ``n x n`` matrix."""
    n = X.shape[0]
    Q = X[qi]
    gate = Q.astype(np.float64) @ u
    bx = np.concatenate([X[s : s + 65536].astype(np.float64) @ b for s in range(0, n, 65536)])  # (n,) item sides
    D, I = _neighbours(X, qi, pool if n - 1 > 2 * pool else n - 1)
    if n - 1 <= 2 * pool:
        return D, gate[:, None] * bx[I], I
    width = 2 * pool + 1                                      # P taken by the nearest rows, one by the query
    tops = (np.argsort(-bx, kind="stable")[:width], np.argsort(bx, kind="stable")[:width])
    extra = np.empty((len(qi), pool), dtype=np.int64)
    for j in range(len(qi)):
        cand = tops[0 if gate[j] >= 0 else 1]
        extra[j] = cand[~np.isin(cand, I[j]) & (cand != qi[j])][:pool]
    step = max(1, (1 << 22) // (pool * X.shape[1]))          # pool rows of ``step`` queries: 16 MiB at a time
    De = np.concatenate([np.einsum("qd,qpd->qp", Q[s : s + step], X[extra[s : s + step]])
                         for s in range(0, len(qi), step)])
    ids = np.concatenate([I, extra], axis=1)
    return np.concatenate([D, De.astype(np.float64)], axis=1), gate[:, None] * bx[ids], ids


def _searched_overlap(X: np.ndarray, qi: np.ndarray, u: np.ndarray, b: np.ndarray, base: np.ndarray) -> float:
    """Mean overlap of ``base`` (nq, k: each query's unsteered top-k, itself left out) with the top-k of a search
    over all rows of ``X`` by the steered queries ``q + (q.u) b``: what ``eps = 1`` does to a search."""
    Q = X[qi].astype(np.float64)
    Qs = (Q + (Q @ u)[:, None] * b[None, :]).astype(np.float32)
    k = base.shape[1]
    from .knn import knn_unchecked

    _, I = knn_unchecked(np.ascontiguousarray(Qs), X, min(k + 1, X.shape[0]))
    hits = [len(set(row[row != q][:k].tolist()) & set(b0.tolist())) for row, q, b0 in zip(I, qi, base)]
    return float(np.mean(hits) / k)


def _fold_stats(X: np.ndarray, y: np.ndarray, rows: np.ndarray, *, n_queries: int, n_neighbors: int,
                rng: np.random.Generator):
    """Local statistics on ``X[rows]`` (queries and neighbours inside ``rows``): ``S`` (d, d), ``r`` (d,),
    ``c = sum ytilde^2``, the query ids, their neighbour ids ``I`` (nq, K) and scores ``D`` (ids into ``X``)."""
    n = len(rows)
    Xr = np.ascontiguousarray(X[rows])
    nq = min(n_queries, n)
    qi = rng.choice(n, size=nq, replace=False)
    D, I = _neighbours(Xr, qi, n_neighbors)
    yr = y[rows]
    S, r = _neighbourhood_stats(Xr, yr, I)
    yt = yr[I] - yr[I].mean(axis=1, keepdims=True)
    return S, r, float((yt * yt).sum()), rows[qi], rows[I], D


def _solver(S: np.ndarray, r: np.ndarray, v: np.ndarray, ridge: float, d: int):
    """``t -> b(t) = (S + (lambda + t) sbar I)^{-1} (r + t sbar b0)`` with ``b0`` on the mean-shift line."""
    sbar = max(float(np.trace(S)) / d, 1e-300)
    vSv = float(v @ S @ v)
    b0 = v * (float(v @ r) / vSv) if vSv > 0 else np.zeros(d)
    w, V = linalg.eigh(S)                                   # one factorisation for every t

    def solve(t: float) -> np.ndarray:
        if np.isinf(t):
            return b0
        if t > 1.0:  # divided through by t: t * sbar overflowed for t near 1e308 (inf / inf: a NaN steer)
            return V @ ((V.T @ (r / t + sbar * b0)) / (w / t + (ridge / t + 1.0) * sbar))
        return V @ ((V.T @ (r + t * sbar * b0)) / (w + (ridge + t) * sbar))

    return solve


def shift_line(X: np.ndarray, labels: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """The mean-shift line ``v = mean(X+) - mean(X-)`` (d,) float64 of ``rows`` (all when None); zero when a side
    has no row there (no line to shrink toward: ``b0 = 0``)."""
    lab = labels if rows is None else labels[rows]
    Xr = X if rows is None else X[rows]
    if not ((lab == 1).any() and (lab == -1).any()):
        return np.zeros(X.shape[1])
    return Xr[lab == 1].mean(axis=0, dtype=np.float64) - Xr[lab == -1].mean(axis=0, dtype=np.float64)


def _choose_prior(X, y, labels, rng, *, n_folds, n_queries, n_neighbors, ridge) -> tuple[float, dict]:
    """Pick ``t`` from :data:`PRIOR_WEIGHTS` by ``n_folds``-fold cross-validation of the local loss.

    The rows are split into folds; each fold's statistics ``(S_f, r_f, c_f)`` come from its own
    queries and neighbourhoods (inside the fold). ``b_{-f}(t)`` is fitted on the other folds, its
    prior's mean-shift line ``v_{-f}`` included (:func:`shift_line` of their rows), and scored on
    fold ``f`` by its held-out local loss ``b^T S_f b - 2 b^T r_f + c_f`` (closed form), so the
    chosen shrinkage is the one that best predicts which neighbours carry the attribute in
    neighbourhoods it has not seen. Before, ``v`` was the line of every row, the held-out fold's
    labels included: the score was optimistic (shuffled labels on 300-3,000 WordNet rows scored
    0.76-0.98 of no steer's loss and passed :func:`service.ops.steers.fit_verdict`;
    ``benchmarks/results/steer_flag_2026-12-06.md``). Returns ``(t, report)``.
    """
    n = X.shape[0]
    if n_folds < 2 or n // n_folds < n_neighbors + 2:
        return 0.0, {"skipped": "fewer than 2 folds, or too few rows per fold"}
    folds = np.array_split(rng.permutation(n), n_folds)
    stats = []
    for f in folds:
        rows = np.sort(f)
        S, r, c, *_ = _fold_stats(X, y, rows, n_queries=max(1, n_queries // n_folds), n_neighbors=n_neighbors,
                                  rng=rng)
        stats.append((S, r, c))
    d = X.shape[1]
    loss = {t: 0.0 for t in PRIOR_WEIGHTS}
    for f, (Sf, rf, cf) in enumerate(stats):
        S = sum(st[0] for g, st in enumerate(stats) if g != f)
        r = sum(st[1] for g, st in enumerate(stats) if g != f)
        rest = np.concatenate([g for j, g in enumerate(folds) if j != f])
        solve = _solver(S, r, shift_line(X, labels, rest), ridge, d)
        for t in PRIOR_WEIGHTS:
            b = solve(t)
            loss[t] += float(b @ Sf @ b - 2.0 * b @ rf + cf)
    base = sum(st[2] for st in stats)                       # loss of b = 0 (no steer)
    best = min(loss, key=lambda t: (loss[t], t))
    return best, {"folds": int(n_folds), "heldout_loss_ratio": {("inf" if np.isinf(t) else f"{t:g}"):
                                                                  loss[t] / base if base > 0 else 1.0
                                                                  for t in PRIOR_WEIGHTS}}


def local_discriminant_factors(X: np.ndarray, labels: np.ndarray, *, n_queries: int, n_neighbors: int,
                               ridge: float, opposite_weight: float, rng: np.random.Generator,
                               prior_weight: float | str = "auto", n_folds: int = 2,
                               k: int = 10) -> tuple[np.ndarray, np.ndarray, dict]:
    """Factors ``P1 = u`` (d, 1) and ``P2 = b`` (d, 1) of the local-discriminant steer (module docstring).

    Parameters
    ----------
    X : (n, d) float32, validated; labels : (n,) int8 in {-1, 0, +1}, validated
    n_queries : training queries drawn from the rows of ``X``
    n_neighbors : ``K``, neighbourhood size (the query itself excluded)
    ridge : ``lambda`` (relative to the mean eigenvalue ``tr S / d``)
    opposite_weight : ``beta``, target of ``-1`` rows (0: they count as any other non-attribute row)
    rng : numpy Generator
    prior_weight : ``t`` >= 0 (``inf``: the mean-shift line) or ``"auto"`` (cross-validated)
    n_folds : folds of the cross-validation of ``t`` (``"auto"`` only)
    k : result-list length used for the ``eps = 1`` calibration

    Returns
    -------
    P1, P2 : (d, 1) float64; info : dict of fit facts
    """
    n = X.shape[0]
    y = (labels == 1).astype(np.float64) - opposite_weight * (labels == -1)
    m = X.mean(axis=0, dtype=np.float64)
    mm = float(m @ m)
    if mm <= 1e-12 * max(1.0, float(np.mean(np.einsum("ij,ij->i", X, X, dtype=np.float64)))):  # float32 overflows
        raise DegenerateInputError("the rows have no common component (centred data): a linear query steer "
                                   "cannot move every query the same way; use method='mean-shift'")
    u = m / mm
    v = shift_line(X, labels)
    report: dict = {}
    if prior_weight == "auto":
        t, report = _choose_prior(X, y, labels, rng, n_folds=n_folds, n_queries=n_queries, n_neighbors=n_neighbors,
                                  ridge=ridge)
    else:
        t = float(prior_weight)
    S, r, _, qi, I, _ = _fold_stats(X, y, np.arange(n), n_queries=n_queries, n_neighbors=n_neighbors, rng=rng)
    solve = _solver(S, r, v, ridge, X.shape[1])
    b = solve(t)
    if not np.any(b):
        b = solve(0.0)
    gate = X[qi].astype(np.float64) @ u
    nb = float(np.linalg.norm(b))
    cal = qi[:CALIBRATION_QUERIES]                           # qi is a random draw already: its head is one too
    D, boost, ids = _calibration_pool(X, cal, u, b)
    k_cal = max(1, min(k, D.shape[1] // 2))                  # a half of it can leave the top (module docstring)
    scale, kept = calibrate(D, boost, k=k_cal) if nb > 0 else (1.0, 1.0)
    searched = _searched_overlap(X, cal, u, b * scale, ids[:, :k_cal]) if nb > 0 else 1.0
    info = {"n_queries": int(len(qi)), "n_neighbors": int(I.shape[1]), "ridge": float(ridge),
            "opposite_weight": float(opposite_weight),
            "prior_weight": "inf" if np.isinf(t) else float(t), "prior_selection": report,
            "calibration": {"k": int(k_cal), "overlap_at_eps_1": kept, "scale": scale, "queries": len(cal),
                            "pool": D.shape[1], "searched_overlap_at_eps_1": searched},
            "gate_mean": float(gate.mean()), "gate_std": float(gate.std())}
    return u[:, None], (b * scale)[:, None], info


def fit_local(X: np.ndarray, labels: np.ndarray, *, n_queries: int, n_neighbors: int, ridge: float,
              opposite_weight: float, prior_weight, n_folds: int, rng: np.random.Generator,
              random_state, callback):
    """:func:`align.fit_steer` ``method="local"`` on validated arguments: a rank-1 :class:`~align.Steer`."""
    from .steer import Steer

    P1, P2, info = local_discriminant_factors(X, labels, n_queries=n_queries, n_neighbors=n_neighbors, ridge=ridge,
                                              opposite_weight=opposite_weight, rng=rng, prior_weight=prior_weight,
                                              n_folds=n_folds)
    if callback is not None:
        callback(1, 0.0)
    meta = {"method": "local-discriminant",
            "params": {"n_queries": n_queries, "n_neighbors": n_neighbors, "ridge": ridge,
                       "opposite_weight": opposite_weight, "n_folds": n_folds,
                       "prior_weight": "inf" if prior_weight == float("inf") else prior_weight,
                       "random_state": seed_record(random_state)},
            "n_pos": int((labels == 1).sum()), "n_neg": int((labels == -1).sum()),
            "n_neutral": int((labels == 0).sum()), "dim": int(X.shape[1]), **info}
    return Steer(P1, P2, meta)
