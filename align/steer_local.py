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

Scale (the ``eps`` schedule): ``b`` is rescaled so that ``eps = 1`` keeps on average half of each
training query's top-``k`` (``k = 10``) among its ``K`` neighbours; ``eps`` then reads as
"how much of the original result list to trade for the attribute". ``eps = 0`` is the identity.
"""

from __future__ import annotations

import numpy as np

from .exceptions import DegenerateInputError

__all__ = ["local_discriminant_factors"]


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


def _overlap_at(scores: np.ndarray, boost: np.ndarray, eps: float, k: int) -> float:
    """Mean overlap@k between the top-k of ``scores`` and of ``scores + eps * boost`` (rows = queries)."""
    base = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    moved = np.argsort(-(scores + eps * boost), axis=1, kind="stable")[:, :k]
    hits = (base[:, :, None] == moved[:, None, :]).any(axis=2).sum(axis=1)
    return float(hits.mean() / k)


def _calibrate(scores: np.ndarray, boost: np.ndarray, *, k: int, target: float = 0.5) -> float:
    """Scale ``t`` with mean overlap@k(``scores + t * boost``) ≈ ``target`` (bisection on log t)."""
    lo, hi = 1e-4, 1e4
    if _overlap_at(scores, boost, hi, k) > target:
        return hi
    for _ in range(40):
        mid = float(np.sqrt(lo * hi))
        if _overlap_at(scores, boost, mid, k) > target:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1.01:
            break
    return float(np.sqrt(lo * hi))


def local_discriminant_factors(X: np.ndarray, labels: np.ndarray, *, n_queries: int, n_neighbors: int,
                               ridge: float, opposite_weight: float, rng: np.random.Generator,
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
    k : result-list length used for the ``eps = 1`` calibration

    Returns
    -------
    P1, P2 : (d, 1) float64; info : dict of fit facts
    """
    from .knn import _knn

    n, d = X.shape
    y = (labels == 1).astype(np.float64) - opposite_weight * (labels == -1)
    nq = min(n_queries, n)
    qi = rng.choice(n, size=nq, replace=False)
    kk = min(n_neighbors + 1, n)
    D, I = _knn(np.ascontiguousarray(X[qi]), X, kk)
    own = I == qi[:, None]                                     # drop the query itself when present
    keep = np.where(own.any(axis=1, keepdims=True), ~own, np.arange(kk)[None, :] < kk - 1)
    I = I[keep].reshape(nq, kk - 1)
    D = D[keep].reshape(nq, kk - 1).astype(np.float64)
    S, r = _neighbourhood_stats(X, y, I)
    lam = ridge * np.trace(S) / d
    b = np.linalg.solve(S + lam * np.eye(d), r)
    m = X.mean(axis=0, dtype=np.float64)
    mm = float(m @ m)
    if mm <= 1e-12 * max(1.0, float(np.mean(np.einsum("ij,ij->i", X[qi], X[qi])))):
        raise DegenerateInputError("the rows have no common component (centred data): a linear query steer "
                                   "cannot move every query the same way; use method='mean-shift'")
    u = m / mm
    gate = X[qi].astype(np.float64) @ u
    boost = gate[:, None] * (X[I].astype(np.float64) @ b)       # (nq, K)
    nb = float(np.linalg.norm(b))
    scale = _calibrate(D, boost, k=min(k, I.shape[1])) if nb > 0 else 1.0
    info = {"n_queries": int(nq), "n_neighbors": int(I.shape[1]), "ridge": float(ridge),
            "opposite_weight": float(opposite_weight), "calibration": {"k": int(min(k, I.shape[1])),
                                                                        "overlap_at_eps_1": 0.5,
                                                                        "scale": scale},
            "gate_mean": float(gate.mean()), "gate_std": float(gate.std())}
    return u[:, None], (b * scale)[:, None], info
