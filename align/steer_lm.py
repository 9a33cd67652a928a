"""The ``lm-steer`` method of :func:`align.fit_steer`: LM-Steer's contrastive softmax objective over candidate items
(:mod:`align.steer`'s docstring), its loss and hand-written gradient (:func:`steer_objective`), the training pairs it
is minimised on, and the L-BFGS fit of the factors ``P1, P2`` (:func:`fit_lm_steer`, on checked arguments)."""

from __future__ import annotations

import warnings
from typing import Callable

import numpy as np

from .exceptions import ConvergenceWarning
from .validation import seed_record

__all__ = ["steer_objective", "fit_lm_steer"]


def steer_objective(theta: np.ndarray, base: np.ndarray, Qp: np.ndarray, C: np.ndarray, target: np.ndarray,
                    s: np.ndarray, rank: int, temperature: float, weight_decay: float) -> tuple[float, np.ndarray]:
    """Loss and gradient of the LM-Steer objective for flattened factors ``theta = [P1, P2]``.

    Parameters
    ----------
    theta : (2 d r,) float64
    base : (B, m) float64, ``Qp C^T / tau`` (constant)
    Qp : (B, d) contexts; C : (m, d) candidates; target : (B,) int candidate index of each pair;
    s : (B,) steer value of each pair (+1 / -1)

    Returns
    -------
    loss : float, grad : (2 d r,) float64
    """
    d = Qp.shape[1]
    P1 = theta[: d * rank].reshape(d, rank)
    P2 = theta[d * rank :].reshape(d, rank)
    A = Qp @ P1                      # (B, r)
    Bc = C @ P2                      # (m, r)
    logits = base + (s[:, None] / temperature) * (A @ Bc.T)
    logits -= logits.max(axis=1, keepdims=True)
    np.exp(logits, out=logits)
    Z = logits.sum(axis=1)
    rows = np.arange(Qp.shape[0])
    p_t = logits[rows, target] / Z
    loss = float(-np.mean(np.log(np.maximum(p_t, 1e-300))))
    G = logits / Z[:, None]          # softmax
    G[rows, target] -= 1.0
    G *= (s / (temperature * Qp.shape[0]))[:, None]
    dP1 = Qp.T @ (G @ Bc)
    dP2 = C.T @ (G.T @ A)
    loss += 0.5 * weight_decay * float(theta @ theta)
    grad = np.concatenate([dP1.ravel(), dP2.ravel()]) + weight_decay * theta
    return loss, grad


def _training_pairs(X: np.ndarray, labels: np.ndarray, *, max_pairs: int, n_candidates: int, n_neighbors: int,
                    rng: np.random.Generator):
    """Contexts, candidates, targets and steer values for :func:`fit_steer` (see module docstring)."""
    from .knn import knn_unchecked

    pos, neg = np.flatnonzero(labels == 1), np.flatnonzero(labels == -1)
    neu = np.flatnonzero(labels == 0)
    half = max(1, max_pairs // 2)
    pos = rng.permutation(pos)[:half]
    neg = rng.permutation(neg)[:half]
    targets = np.concatenate([pos, neg])
    s = np.concatenate([np.ones(len(pos)), -np.ones(len(neg))])
    contexts = neu if len(neu) >= n_neighbors + 1 else np.arange(X.shape[0])
    kk = min(n_neighbors + 1, len(contexts))
    _, I = knn_unchecked(X[targets], np.ascontiguousarray(X[contexts]), kk)
    ctx_rows = contexts[I]                                   # (B, kk) row ids
    ok = ctx_rows != targets[:, None]                         # never the item itself
    pick = np.empty(len(targets), dtype=np.int64)
    for i in range(len(targets)):
        choices = ctx_rows[i][ok[i]][:n_neighbors]
        pick[i] = choices[rng.integers(len(choices))] if len(choices) else targets[i]
    others = np.setdiff1d(np.arange(X.shape[0]), targets, assume_unique=False)
    n_extra = max(0, min(len(others), n_candidates - len(targets)))
    cand = np.concatenate([targets, rng.choice(others, size=n_extra, replace=False)]) if n_extra else targets
    target_pos = np.arange(len(targets))                      # targets come first in ``cand``
    return X[pick].astype(np.float64), X[cand].astype(np.float64), target_pos, s


def fit_lm_steer(X: np.ndarray, labels: np.ndarray, *, rank: int, temperature: float, weight_decay: float,
                 max_iter: int, max_pairs: int, n_candidates: int, n_neighbors: int, init_scale: float, tol: float,
                 rng: np.random.Generator, random_state, callback: Callable[[int, float], None] | None):
    """:func:`align.fit_steer` ``method="lm-steer"`` on validated arguments (``rng`` drawn from ``random_state``): a
    rank-``rank`` :class:`~align.Steer` minimising :func:`steer_objective` with L-BFGS."""
    from scipy.optimize import minimize

    from .steer import Steer

    d = X.shape[1]
    Qp, C, target, s = _training_pairs(X, labels, max_pairs=max_pairs, n_candidates=n_candidates,
                                       n_neighbors=n_neighbors, rng=rng)
    base = (Qp @ C.T) / temperature
    theta0 = rng.normal(scale=init_scale, size=2 * d * rank)
    args = (base, Qp, C, target, s, rank, temperature, weight_decay)
    loss0 = steer_objective(theta0, *args)[0]
    state = {"it": 0, "last": loss0}

    def fun(theta):
        val, grad = steer_objective(theta, *args)
        state["last"] = val
        return val, grad

    def cb(xk):
        state["it"] += 1
        if callback is not None:
            callback(state["it"], float(state["last"]))

    res = minimize(fun, theta0, jac=True, method="L-BFGS-B", callback=cb,
                   options={"maxiter": max_iter, "gtol": tol, "maxcor": 20})
    if res.status == 2 or not np.isfinite(res.fun):
        warnings.warn(f"fit_steer: L-BFGS stopped abnormally ({res.message})", ConvergenceWarning, stacklevel=3)
    P1 = res.x[: d * rank].reshape(d, rank)
    P2 = res.x[d * rank :].reshape(d, rank)
    meta = {
        "method": "lm-steer-embedding",
        "params": {"rank": rank, "temperature": temperature, "weight_decay": weight_decay, "max_iter": max_iter,
                   "max_pairs": max_pairs, "n_candidates": n_candidates, "n_neighbors": n_neighbors,
                   "init_scale": init_scale,
                   "random_state": seed_record(random_state)},
        "n_pos": int((labels == 1).sum()), "n_neg": int((labels == -1).sum()), "n_neutral": int((labels == 0).sum()),
        "n_pairs": int(len(target)), "n_candidates_used": int(C.shape[0]), "dim": d, "loss_initial": float(loss0),
        "loss_final": float(res.fun), "n_iter": int(res.nit), "converged": bool(res.status == 0)}
    return Steer(P1, P2, meta)
