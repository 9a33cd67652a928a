"""K-means anchors matched across two spaces by quadratic assignment (ALGORITHMS.md §3, step 1).

For each anchor run, ``sample`` rows are drawn from each side (framed, unit rows), k-means with
``k`` clusters gives centroids ``C_A`` (k, d_s) and ``C_B`` (k, d_t), and each side's centred
Gram matrix of the raw centroids

.. math::  K = H C C^\\top H, \\qquad H = I_k - \\tfrac1k \\mathbf 1 \\mathbf 1^\\top

is built. The two centroid sets are matched by the permutation ``P`` solving the quadratic
assignment problem (graph matching)

.. math::  \\max_{P \\in \\mathcal P_k} \\operatorname{tr}(K_A P K_B P^\\top).

Solvers (``method``):

- ``"2opt"``: scipy's 2-opt from a random permutation, best of ``restarts`` (the published
  procedure: 30 restarts).
- ``"faq+2opt"``: scipy's FAQ (Frank-Wolfe on the doubly-stochastic relaxation) from a random
  doubly-stochastic start, then 2-opt polishing started at the FAQ solution; best of
  ``restarts``. Never worse than its own FAQ start, and in practice reaches the best objective
  of many 2-opt restarts with fewer restarts.

Notes
-----
The QAP objective is a *proxy*: when the two spaces' cluster structures do not correspond (e.g.
minilm vs e5), the optimum of this objective can score higher than the true correspondence, so
a better solver does not help there. The objective value of every restart is kept (``history``)
so callers can judge how peaked the solution landscape is.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from .validation import check_random_state
from .exceptions import ConvergenceWarning, InputError, TooFewRowsError

__all__ = ["AnchorSet", "QAPResult", "centered_gram", "kmeans_centroids", "solve_qap", "match_centroids",
           "kmeans_anchors", "short_kmeans", "QAP_METHODS"]

QAP_METHODS = ("2opt", "faq", "faq+2opt")


@dataclass
class QAPResult:
    """Best permutation found: ``col_ind`` (k,) maps node ``i`` of A to node ``col_ind[i]`` of B.

    ``score`` is ``tr(K_A P K_B Pᵀ)``; ``history`` the score of every restart (in order).
    """

    col_ind: np.ndarray
    score: float
    history: list = field(default_factory=list)
    best_restart: int = 0


@dataclass
class AnchorSet:
    """Matched anchors: row ``i`` of ``source`` (r, d_s) corresponds to row ``i`` of ``target`` (r, d_t).

    ``runs`` holds per-run diagnostics (QAP score, restart scores, seconds).
    """

    source: np.ndarray
    target: np.ndarray
    runs: list = field(default_factory=list)


def centered_gram(C: np.ndarray) -> np.ndarray:
    """``H C Cᵀ H`` for centroids ``C`` (k, d); float64 (k, k)."""
    C = np.asarray(C, dtype=np.float64)
    G = C @ C.T
    return G - G.mean(axis=0, keepdims=True) - G.mean(axis=1, keepdims=True) + G.mean()


def _seed(rng: np.random.Generator) -> int:
    return int(rng.integers(0, 2**31 - 1))


def _gen(rng: np.random.Generator) -> np.random.Generator:
    return np.random.default_rng(_seed(rng))


def kmeans_centroids(X: np.ndarray, k: int, *, rng: np.random.Generator, init="k-means++", n_init="auto",
                     max_iter: int = 300) -> np.ndarray:
    """Centroids (k, d) of scikit-learn ``KMeans`` on rows ``X`` (n, d), seeded from ``rng``; a
    :class:`ConvergenceWarning` when fewer than ``k`` rows are distinct (some centroids then repeat)."""
    C, found = _kmeans(X, k, rng, init, n_init, max_iter)
    if found < k:
        warnings.warn(_few_clusters(k, 1, 1), ConvergenceWarning, stacklevel=2)
    return C


def _kmeans(X, k, rng, init="k-means++", n_init="auto", max_iter=300) -> tuple[np.ndarray, int]:
    """``(centroids (k, d), clusters found)``; scikit-learn's own warning about the latter is silenced (it came
    once per k-means, 60 times in one default fit on repeated rows): callers say it once, in their words."""
    from sklearn.cluster import KMeans
    from sklearn.exceptions import ConvergenceWarning as SklearnConvergenceWarning

    if X.shape[0] < k:
        raise TooFewRowsError(f"k-means with {k} clusters needs at least {k} rows, got {X.shape[0]}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=RuntimeWarning)
        warnings.simplefilter("ignore", category=SklearnConvergenceWarning)
        km = KMeans(n_clusters=k, init=init, n_init=n_init if isinstance(init, str) else 1, max_iter=max_iter,
                    random_state=_seed(rng)).fit(X)
    return km.cluster_centers_.astype(np.float32), int(np.unique(km.labels_).size)


def _few_clusters(k: int, short: int, total: int) -> str:
    return (f"k-means found fewer than {k} distinct clusters in {short} of {total} row samples: a sample held fewer "
            f"than {k} distinct rows (rows repeat), so some centroids repeat and the anchors they give carry no "
            f"correspondence; use fewer clusters or more distinct rows")


def _score(KA: np.ndarray, KB: np.ndarray, col: np.ndarray) -> float:
    return float((KA * KB[np.ix_(col, col)]).sum())


def solve_qap(KA: np.ndarray, KB: np.ndarray, *, method: str = "2opt", restarts: int = 30,
              random_state=None, progress=None) -> QAPResult:
    """Maximise ``tr(K_A P K_B Pᵀ)`` over permutations; best of ``restarts`` random starts.

    Parameters
    ----------
    KA, KB : ndarray (k, k), symmetric
    method : {"2opt", "faq", "faq+2opt"}
    restarts : int >= 1
    random_state : None, int, numpy Generator or np.random.RandomState
    progress : callable(fraction) or None, called after each restart (what it raises stops the search)

    Returns
    -------
    QAPResult
    """
    from scipy.optimize import quadratic_assignment

    if method not in QAP_METHODS:
        raise InputError(f"qap method must be one of {QAP_METHODS}, got {method!r}")
    if restarts < 1:
        raise InputError(f"restarts must be >= 1, got {restarts}")
    KA = np.asarray(KA, dtype=np.float64)
    KB = np.asarray(KB, dtype=np.float64)
    rng = check_random_state(random_state)
    best, history, best_i = None, [], 0
    k = KA.shape[0]
    for r in range(restarts):
        if method == "2opt":
            res = quadratic_assignment(KA, KB, method="2opt", options={"maximize": True, "rng": _gen(rng)})
            col = np.asarray(res.col_ind)
        else:
            res = quadratic_assignment(KA, KB, method="faq",
                                       options={"maximize": True, "P0": "randomized", "rng": _gen(rng)})
            col = np.asarray(res.col_ind)
            if method == "faq+2opt":
                guess = np.column_stack([np.arange(k), col])
                res2 = quadratic_assignment(KA, KB, method="2opt",
                                            options={"maximize": True, "partial_guess": guess, "rng": _gen(rng)})
                col2 = np.asarray(res2.col_ind)
                if _score(KA, KB, col2) >= _score(KA, KB, col):
                    col = col2
        s = _score(KA, KB, col)
        history.append(s)
        if best is None or s > best[1]:
            best, best_i = (col.copy(), s), r
        if progress is not None:  # qap_restarts=10**9 ran for days, at 0 %, deaf to a cancel
            progress((r + 1) / restarts)
    return QAPResult(col_ind=best[0], score=best[1], history=history, best_restart=best_i)


def match_centroids(CA: np.ndarray, CB: np.ndarray, *, method: str = "2opt", restarts: int = 30,
                    random_state=None, progress=None) -> QAPResult:
    """Match centroid sets ``CA`` (k, d_s) and ``CB`` (k, d_t) via QAP on their centred Gram matrices
    (``progress`` as in :func:`solve_qap`)."""
    if CA.shape[0] != CB.shape[0]:
        raise InputError(f"both sides need the same number of centroids, got {CA.shape[0]} and {CB.shape[0]}")
    return solve_qap(centered_gram(CA), centered_gram(CB), method=method, restarts=restarts,
                     random_state=random_state, progress=progress)


def short_kmeans(runs: list, n_clusters: int) -> int:
    """How many k-means of the anchor ``runs`` (:attr:`AnchorSet.runs`) found fewer than ``n_clusters`` clusters."""
    return sum(int(f < n_clusters) for run in runs for f in run.get("clusters_found", ()))


def kmeans_anchors(Xs: np.ndarray, Yt: np.ndarray, *, n_runs: int = 30, sample: int = 10000, n_clusters: int = 20,
                   qap_method: str = "2opt", qap_restarts: int = 30, keep: float = 1.0, random_state=None,
                   progress=None, warn: bool = True) -> AnchorSet:
    """Stack ``n_runs`` matched centroid sets into ``n_runs * n_clusters`` anchor pairs.

    Parameters
    ----------
    Xs : ndarray (n, d_s), framed source rows;  Yt : ndarray (m, d_t), framed target rows
    n_runs, sample, n_clusters, qap_method, qap_restarts : published defaults 30, 10000, 20, "2opt", 30
    keep : float in (0, 1]
        Share of runs kept, those with the highest *normalised* QAP score
        ``tr(K_A P K_B Pᵀ) / (‖K_A‖_F ‖K_B‖_F)`` (1.0 = all runs, as published). Runs whose
        k-means landed in a poor local optimum match worse and score lower.
    random_state : None, int or Generator (draws the subsamples, k-means seeds and QAP starts)
    progress : callable(fraction) or None
    warn : bool
        One :class:`ConvergenceWarning` when some k-means found fewer than ``n_clusters`` clusters (each run's
        ``clusters_found`` says how many, source and target); False leaves the warning to the caller.

    Raises
    ------
    TooFewRowsError
        When either side has fewer rows than ``n_clusters``.
    """
    if n_runs < 1:
        raise InputError(f"n_anchor_runs must be >= 1, got {n_runs}")
    if n_clusters < 2:
        raise InputError(f"n_clusters must be >= 2, got {n_clusters}")
    for name, A in (("X_src", Xs), ("X_tgt", Yt)):
        if A.shape[0] < n_clusters:
            raise TooFewRowsError(f"{name}: k-means anchors with {n_clusters} clusters need at least "
                                  f"{n_clusters} rows, got {A.shape[0]}")
    rng = check_random_state(random_state)
    src, tgt, runs = [], [], []
    for r in range(n_runs):
        t0 = time.perf_counter()
        ia = rng.permutation(Xs.shape[0])[: min(sample, Xs.shape[0])]
        ib = rng.permutation(Yt.shape[0])[: min(sample, Yt.shape[0])]
        CA, found_a = _kmeans(Xs[ia], n_clusters, rng)
        CB, found_b = _kmeans(Yt[ib], n_clusters, rng)
        # reported after each QAP restart (the last one: run r done), so a cancel stops a long restart loop
        within = None if progress is None else (lambda f, r=r: progress((r + f) / n_runs))
        res = match_centroids(CA, CB, method=qap_method, restarts=qap_restarts, random_state=rng, progress=within)
        norm = float(np.linalg.norm(centered_gram(CA)) * np.linalg.norm(centered_gram(CB))) or 1.0
        src.append(CA)
        tgt.append(CB[res.col_ind])
        runs.append({"qap_score": res.score, "qap_score_normalised": res.score / norm,
                     "qap_restart_scores": [round(h, 6) for h in res.history],
                     "best_restart": res.best_restart, "clusters_found": [found_a, found_b],
                     "seconds": time.perf_counter() - t0})
    if not 0.0 < keep <= 1.0:
        raise InputError(f"keep must be in (0, 1], got {keep}")
    short = short_kmeans(runs, n_clusters)
    if warn and short:
        warnings.warn(_few_clusters(n_clusters, short, 2 * n_runs), ConvergenceWarning, stacklevel=2)
    n_keep = max(1, int(np.ceil(keep * n_runs)))
    order = np.argsort([-run["qap_score_normalised"] for run in runs], kind="stable")[:n_keep]
    order = np.sort(order)
    for i, run in enumerate(runs):
        run["kept"] = bool(i in set(order.tolist()))
    return AnchorSet(np.concatenate([src[i] for i in order]).astype(np.float32),
                     np.concatenate([tgt[i] for i in order]).astype(np.float32), runs)
