"""The candidate families of :func:`align.fit_migration` (its module docstring describes them): the framed
:class:`Problem` every candidate is fitted in, and one fit per family on the pairs ``idx`` of it. Kept apart from
:mod:`align.migration` (the selection among them); :func:`align.plan_migration` fits its learning curve with the
same procrustes and ridge candidates."""

from __future__ import annotations

import functools

import numpy as np

from .cluster import ClusterMap, ClusterResiduals, route_centroids
from .contrastive import ContrastiveConfig, fit_contrastive_W, mine_hard_negatives
from .exceptions import InputError
from .frames import Frame, frame_sum, unit_rows
from .maps import LinearMap
from .options import check_number
from .procrustes import PairStats, lowrank_from_stats, procrustes_from_stats, ridge_from_stats

__all__ = ["Problem", "procrustes_candidate", "ridge_candidate", "lowrank_candidate", "contrastive_config",
           "contrastive_candidate", "cluster_parts", "cluster_candidate"]

_N_DISTRACTORS = 4096


def _frame_of(X: np.ndarray, U: np.ndarray | None) -> Frame:
    """The frame (unit, centre, unit) of the rows of ``X`` (n, d) and ``U`` (m, d) together, from the sums of
    each (:func:`frame_sum`, exact to add): no concatenated copy of both."""
    if U is None:
        return Frame.fit(X, validate=False)
    return Frame.from_sum(X.shape[1], X.shape[0] + U.shape[0], frame_sum(X) + frame_sum(U))


class Problem:
    """Framed views of the pairs and unpaired rows, shared by every candidate fit.

    Every family maps into the target's centred frame (unit → centre → unit), where shrinkage
    (ridge) only changes norms, not directions; ``apply(output="raw")`` adds the mean back.
    """

    def __init__(self, X, Y, Us, Ut, frame_rows=None):
        """``frame_rows``: the pairs the frames are fitted on (with the unpaired rows); ``None``: all of them."""
        fx, fy = (X, Y) if frame_rows is None else (X[frame_rows], Y[frame_rows])
        self.fs, self.ft = _frame_of(fx, Us), _frame_of(fy, Ut)
        self.X, self.Y, self.Us, self.Ut = X, Y, Us, Ut
        self.Xf = self.fs.apply(X, validate=False)
        self.Yc = self.ft.apply(Y, validate=False)
        self.T = unit_rows(Y)
        self.Us_sample = self.Ut_sample = None
        self.report = lambda stage, fraction: None  # fit_migration's progress(stage, fraction)
        self.n_scored = 0  # maps scored on the held-out pairs (align.migration counts them)

    @functools.cached_property
    def Uf(self) -> np.ndarray | None:
        """The unpaired source rows in the source frame (m, d_s), on first use: only the hard negatives and the
        cluster routing read them, and the migration plan's corpus (millions of rows) never needs a copy."""
        return None if self.Us is None else self.fs.apply(self.Us, validate=False)

    @functools.cached_property
    def Uc(self) -> np.ndarray | None:
        """The unpaired target rows in the target frame, on first use (as :attr:`Uf`)."""
        return None if self.Ut is None else self.ft.apply(self.Ut, validate=False)

    def distractors(self, rng, n: int = _N_DISTRACTORS) -> None:
        """Sample up to ``n`` unpaired rows per side to compete in held-out rankings."""
        if self.Us is not None:
            self.Us_sample = self.Us[np.sort(rng.permutation(self.Us.shape[0])[:n])]
        if self.Ut is not None:
            self.Ut_sample = unit_rows(self.Ut[np.sort(rng.permutation(self.Ut.shape[0])[:n])])

    def linear(self, W, b, meta: dict) -> LinearMap:
        return LinearMap(np.asarray(W, np.float32), None if b is None else np.asarray(b, np.float32),
                         self.fs, self.ft, meta)

    @staticmethod
    def affine(map_: LinearMap) -> tuple[np.ndarray, np.ndarray]:
        """``(W, b)`` float64 of a map (zero bias when it has none), for warm starts."""
        W = map_.W.astype(np.float64)
        return W, (np.zeros(W.shape[1]) if map_.bias is None else map_.bias.astype(np.float64))


def _stats(A, B, idx) -> PairStats:
    return PairStats.from_arrays(A[idx], B[idx])


def procrustes_candidate(P: Problem, idx, opts) -> LinearMap:
    W, _ = procrustes_from_stats(_stats(P.Xf, P.Yc, idx))
    return P.linear(W, None, {"method": "procrustes", "family": "orthogonal", "objective": "least squares",
                              "params": {}})


def ridge_candidate(P: Problem, idx, alpha_rel: float) -> LinearMap:
    W, b = ridge_from_stats(_stats(P.Xf, P.Yc, idx), alpha=alpha_rel * len(idx), fit_intercept=True)
    return P.linear(W, b, {"method": "ridge", "family": "affine", "objective": "least squares",
                           "params": {"alpha": alpha_rel}})


def lowrank_candidate(P: Problem, idx, rank: int, alpha_rel: float, base: LinearMap) -> LinearMap:
    W0, b0 = P.affine(base)
    R = P.Yc[idx] - (P.Xf[idx] @ W0 + b0)
    stats = PairStats.from_arrays(P.Xf[idx], R)
    rank = int(min(rank, *stats.xty.shape))
    Wr, br = lowrank_from_stats(stats, rank=rank, alpha=alpha_rel * len(idx), fit_intercept=True)
    return P.linear(W0 + Wr, b0 + br, {"method": "lowrank", "family": "orthogonal + low-rank residual",
                          "objective": "least squares", "params": {"rank": rank, "alpha": alpha_rel}})


def contrastive_config(opts: dict) -> ContrastiveConfig:
    cfg = dict(opts.get("contrastive") or {})
    for key in ("epochs", "temperature", "reg", "hard_negatives", "batch_size", "lr"):
        if key in opts:
            cfg[key] = opts[key]
    try:
        config = ContrastiveConfig(**cfg)
    except TypeError as exc:
        raise InputError(f"bad contrastive option: {exc}") from None
    for key, (lo, hi) in _CONTRASTIVE_RANGES.items():
        value = getattr(config, key)
        if key == "reg" and value is None:
            continue
        whole = key in ("epochs", "batch_size", "hard_negatives")
        check_number(f"contrastive option {key}", value, lo, hi, whole=whole)
    return config


#: Legal ranges of the contrastive options (below a temperature of 1e-3 the softmax is a hard arg-max and the
#: gradient scales with 1 / tau; 0.01-0.1 is the useful range).
_CONTRASTIVE_RANGES = {"epochs": (1, 10_000), "temperature": (1e-3, 10.0), "batch_size": (2, 1 << 20),
                       "lr": (1e-8, 10.0), "reg": (0.0, 1e6), "hard_negatives": (0, 64)}


def _hard_negatives(P: Problem, idx, h: int):
    """Hard negatives for the pairs ``idx``: near target rows (row term) and near source rows (column term).

    Pools are the unpaired rows when given, else the training pairs themselves (own row excluded).
    """
    if h <= 0:
        return None, None, None, None
    pool_t, self_t = (P.Uc, False) if P.Uc is not None else (P.Yc[idx], True)
    pool_x, self_x = (P.Uf, False) if P.Uf is not None else (P.Xf[idx], True)
    hard_t = mine_hard_negatives(P.Yc[idx], pool_t, h, self_pool=self_t)
    hard_x = mine_hard_negatives(P.Xf[idx], pool_x, h, self_pool=self_x)
    return hard_x, pool_x, hard_t, pool_t


def contrastive_candidate(P: Problem, idx, cfg: ContrastiveConfig, warm: LinearMap, rng, callback=None) -> LinearMap:
    W0, b0 = P.affine(warm)
    hard_x, pool_x, hard_t, pool_t = _hard_negatives(P, idx, cfg.hard_negatives)
    W, b, hist = fit_contrastive_W(P.Xf[idx], P.Yc[idx], W0, b0, config=cfg, hard_x=hard_x, pool_x=pool_x,
                                   hard_t=hard_t, pool_t=pool_t, rng=rng, callback=callback)
    params = {"temperature": cfg.temperature, "epochs": cfg.epochs, "batch_size": cfg.batch_size, "lr": cfg.lr,
              "reg": cfg.resolved_reg(len(idx)), "hard_negatives": cfg.hard_negatives,
              "warm_start": warm.metadata.get("method")}
    return P.linear(W, b, {"method": "contrastive", "family": "affine", "objective": "symmetric InfoNCE",
                          "params": params, "loss": [h["loss"] for h in hist]})


def cluster_parts(P: Problem, idx, k: int, base: LinearMap, rng) -> tuple[np.ndarray, ClusterResiduals]:
    """Routing centroids (on the pairs ``idx`` plus the unpaired source rows) and the residual equations."""
    F = P.Xf[idx] if P.Uf is None else np.concatenate([P.Xf[idx], P.Uf])
    C = route_centroids(F, k, rng)
    labels = (P.Xf[idx] @ C.T).argmax(axis=1)
    return C, ClusterResiduals(P.Xf[idx], P.Yc[idx], labels, k, *P.affine(base))


def cluster_candidate(P: Problem, C, res: ClusterResiduals, lam: float, blend: int, tau: float,
                      alpha: float) -> ClusterMap:
    W, b = res.solve(lam)
    params = {"n_clusters": int(C.shape[0]), "shrink": lam, "blend": int(blend), "temperature": tau,
              "alpha": alpha, "pairs_per_cluster": res.counts.tolist()}
    return ClusterMap(C, W, b, P.fs, P.ft, blend=blend, temperature=tau,
                      metadata={"method": "cluster", "family": "per-cluster affine (blended)",
                                "objective": "least squares, shrunk toward the global ridge map", "params": params})
