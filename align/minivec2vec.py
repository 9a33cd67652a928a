"""MiniVec2Vec: unsupervised (or seeded) linear alignment of two embedding spaces.

Pipeline (ALGORITHMS.md §3), on each side's own frame (unit → centre → unit):

1. **Initial map** — pluggable (``init``). ``"anchors"``: k-means anchors matched by QAP
   (:mod:`align.anchors`), relative representations, soft top-``soft_k`` pseudo-pairs,
   Procrustes. ``"identity"``: ``W = I`` (padded), for spaces that already share coordinates.
   With ``seed_pairs`` (≥ 2 known pairs) the start comes from the seeds instead
   (:func:`align.refine.seed_relative_init`). New starts plug in with :func:`register_init`.
2. **Refinement** — the stages named in ``refine``, in order: ``"icp"`` (Refine-1, ICP-average),
   ``"clusters"`` (Refine-2), ``"self_learning"`` (mutual-NN CSLS Procrustes rounds over the full
   sets, then an exact Procrustes on confident pairs; :func:`align.refine.self_learning`).
3. **Selection** — ``n_restarts`` independent runs of 1–2; the one with the highest
   **unsupervised** criterion (:func:`align.refine.map_criterion`: share of mutual CSLS
   neighbours × their mean cosine on random samples of both sides; no labels) is kept.
4. **Seeded finish** (seeded mode, ``seeded_finish=True``) — the chosen map is refined once more
   by whitened sparse Sinkhorn soft matching over the training rows (the verdict rows stay out;
   :func:`align.semisup.sinkhorn_polish`), the seeds counting as ordinary pairs. Mutual-NN
   self-learning and the CSLS polish stop at a biased fixed point between different texts; the
   soft matching moves past it (minilm→e5, 100 seeds, 3 seeds of the benchmark: top-1 0.855 → 0.887,
   CSLS top-1 0.928 → 0.945; ``benchmarks/results/align_seeded_2026-12-01.md``).

``MiniVec2Vec.published()`` is the faithful published procedure (30 anchor runs of k=20 on
10,000-row samples, scipy 2-opt best of 30, soft top-50, Refine-1 100 × 1,000, Refine-2 k=500,
smoothing α=0.5, one run): the peer the benchmark compares against. Its smoothed ``W`` is only
approximately orthogonal, as published; the other refinements end with an exact Procrustes, so
``W`` is orthogonal (semi-orthogonal when ``d_s != d_t``).

Memory: O((n + m) · d) plus (n, 600) relative representations; all neighbour searches run
through :func:`align.knn` in blocks (FAISS when installed) — never an n × m matrix.
"""

from __future__ import annotations

import time
import warnings
from typing import Callable

import numpy as np

from .validation import as_matrix, check_not_degenerate, check_random_state, check_seed, row_groups, seed_record
from ._estimator import Estimator
from .anchors import QAP_METHODS, kmeans_anchors, short_kmeans
from .blocks import executing
from .exceptions import ConvergenceWarning, InputError, NotFittedError, PairCountError, TooFewRowsError
from .frames import Frame
from .maps import LinearMap
from .options import check_callable, check_flag, check_number
from .refine import (map_criterion, procrustes_map, refine_clusters, refine_icp, relative_representation,
                     seed_relative_init, self_learning, soft_pseudo_targets, bidirectional_polish)

__all__ = ["MiniVec2Vec", "register_init", "INITIALIZERS", "REFINE_STAGES"]

REFINE_STAGES = ("icp", "clusters", "self_learning", "polish", "sinkhorn")

#: The least criterion a map is called reliable at, whatever its null (which must also be positive). The criterion
#: is a mean CSLS score (``2 cos - r_T - r_S`` of unit rows), in units of cosine: float32 rounding moves it by about
#: 1e-6; on real spaces the null is ~0.037 and a right map's criterion 0.081 (minilm→paraphrase-L3 and minilm→e5,
#: 4,000 rows, default settings). 1e-3 is a thousand times the rounding and over 30 times below those nulls. Without it
#: a map of a few rows repeated (every CSLS score ~0: criterion 1.6e-9, null -1.2e-10) passed ``crit >= 1.6 * null``.
CRITERION_FLOOR = 1e-3

#: name -> callable(est, Xs, Yt, rng, progress) -> (W (d_s, d_t), info dict); Xs, Yt are framed rows.
INITIALIZERS: dict[str, Callable] = {}


def register_init(name: str, fn: Callable | None = None):
    """Register an initial-map strategy under ``name`` (usable as ``MiniVec2Vec(init=name)``).

    ``fn(est, Xs, Yt, rng, progress)`` receives the estimator (for its parameters), the framed
    source (n, d_s) and target (m, d_t) training rows, a numpy Generator and a
    ``progress(fraction)`` callable; it returns ``(W, info)`` with ``W`` (d_s, d_t) and a
    JSON-safe ``info`` dict. Usable as a decorator.
    """
    def deco(f):
        INITIALIZERS[name] = f
        return f
    return deco(fn) if fn is not None else deco


@register_init("anchors")
def _init_anchors(est, Xs, Yt, rng, progress):
    anchors = kmeans_anchors(Xs, Yt, n_runs=est.n_anchor_runs, sample=est.anchor_sample, n_clusters=est.n_clusters,
                             qap_method=est.qap_method, qap_restarts=est.qap_restarts, keep=est.anchor_keep, random_state=rng,
                             progress=progress, warn=False)  # _fit says it once, for every restart
    Rs = relative_representation(Xs, anchors.source)
    Rt = relative_representation(Yt, anchors.target)
    pseudo = soft_pseudo_targets(Rs, Rt, Yt, k=est.soft_k)
    W = procrustes_map(Xs, pseudo)
    return W, {"n_anchors": int(anchors.source.shape[0]), "anchor_runs": anchors.runs}


@register_init("identity")
def _init_identity(est, Xs, Yt, rng, progress):
    W = np.eye(Xs.shape[1], Yt.shape[1])
    return W, {}


def _framed(frame: Frame, A: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``frame`` applied to the rows ``rows`` (sorted, unique) of ``A``; a frame works row by row, so
    framing the needed rows of a million is the same as framing all and keeping them, at their cost."""
    return frame.apply(A if rows.size == A.shape[0] else A[rows], validate=False)


class MiniVec2Vec(Estimator):
    """Unsupervised linear alignment ``x ↦ f_s(x) W`` between two sets of unpaired embeddings.

    Parameters
    ----------
    init : str
        Initial-map strategy, a key of :data:`INITIALIZERS` (``"anchors"``, ``"identity"``, ...).
    n_restarts : int
        Independent runs (init + refinement); the best by the unsupervised criterion is kept.
    n_anchor_runs, anchor_sample, n_clusters : int
        Anchor stage: runs, rows sampled per side per run, k-means clusters (published 30, 10000, 20).
    anchor_keep : float
        Share of anchor runs kept, by normalised QAP score (published: 1.0, all runs).
    qap_restarts : int; qap_method : {"2opt", "faq", "faq+2opt"}
        QAP solver restarts per run (published 30, "2opt").
    soft_k : int
        Neighbours averaged for each soft pseudo-target (published 50).
    refine : tuple of str
        Refinement stages in order, from :data:`REFINE_STAGES`; ``"polish"`` is
        :func:`align.refine.bidirectional_polish` (all-row bidirectional CSLS dictionaries in a
        whitened metric; ``polish_rounds`` rounds, whitening power ``polish_whiten``); ``"sinkhorn"``
        is :func:`align.semisup.sinkhorn_polish` (whitened sparse Sinkhorn soft matching,
        ``sinkhorn_rounds`` rounds at ``sinkhorn_eps``). In seeded mode the same refinement runs by
        default once, after the restart is chosen (``seeded_finish``), stopping early once a round
        changes ``W`` by less than ``sinkhorn_tol`` (label-free). The default ``("icp", "self_learning")`` stops at
        self-learning's biased fixed point between different texts: minilm rows 0-3,999 against rows 4,000-7,999
        rotated by a planted ``Q``, top-1 1.0 but cosine 0.820 against 0.9998 for ``Q`` (whose label-free criterion
        is higher: 0.137 vs 0.108); adding ``"sinkhorn"`` raised it to 0.922 (minilm → paraphrase-L3 top-1 0.956 →
        0.972) for ~5-10 % of the fit time. It is not the default because it would also replace the tuned seeded
        finish in seeded mode. Defaults 10 rounds, eps 0.05, tol 0.1: minilm → e5
        from 100 seeds, held-out top-1 0.894 against 0.889 with the earlier 6 rounds at eps 0.1, tol 0.2, which
        stopped after ~3 (``benchmarks/results/seeded_rounds_2026-12-04.md``).
    seeded_finish : bool
        Seeded mode only: end with :func:`align.semisup.sinkhorn_polish` on the chosen map, over
        the training rows, seeds weighted as single pairs (skipped when ``"sinkhorn"`` already is a
        stage). The criterion and verdict are those of the final map.
    refine1_iters, refine1_sample, refine1_k : int
        Refine-1 iterations, rows per iteration, neighbours averaged (published 100, 1000, 50).
    alpha : float
        Smoothing of Refine-1/2 (published 0.5).
    refine2_clusters : int
        Refine-2 k-means clusters (published 500).
    self_learning_rounds, self_learning_sample, self_learning_final_rounds : int
        Rounds of mutual-NN CSLS Procrustes on fresh random samples of ``self_learning_sample``
        rows per side (None: all rows), then rounds over all rows (the last on confident pairs).
    csls_k : int
        Neighbourhood of CSLS (10).
    confident : float
        Share of mutual pairs (by CSLS score) kept for the final exact Procrustes.
    criterion_sample : int
        Rows per side for the unsupervised criterion.
    seed_weight : float
        Weight of each known seed pair in the Procrustes fits (semi-supervised mode).
    reliability_ratio : float
        The fit is flagged unreliable (``reliable_ = False`` and a ConvergenceWarning) when its
        criterion on the held-out rows is below this multiple of the criterion of the same map
        after random rotations of the source side, ``Q W`` (``null_criterion_``): the same target
        subspace, a random correspondence inside it. (Plain random maps are a weaker null when
        ``d_s < d_t``: a wrong glove (50-d) → minilm (384-d) map scored 1.65x them, 1.03x this one.)
        A ratio needs a scale: the null must also be positive and the criterion at least
        :data:`CRITERION_FLOOR` (1e-3, in units of cosine; rows that are a few rows repeated score ~0 for any map).
    holdout : float
        Share of each side's rows (at most ``criterion_sample``, never seed rows) withheld from the
        fit and used only to choose the restart and to judge the map. On the rows it was refined
        on, a wrong map scores ~5x a random map (self-learning makes its own pseudo-pairs mutual:
        minilm→e5, 4,000 rows, top-1 0.001, criterion 0.147 vs 0.029); on held-out rows it scores
        1.1–1.2x and a right map 2.3x. With fewer than 20 rows to hold out per side the criterion
        is taken on the training rows, which tells nothing, and the fit is flagged unreliable
        (``diagnostics_["verdict_rows"]["held_out"]`` False).
    fit_sample : int or None
        Most training rows per side the fit works on (default 50,000; None: all). Larger sets are
        subsampled once, at random (``random_state``), after the held-out rows are set aside and
        after the frames are fitted on all rows. The all-row stages (self-learning's final rounds,
        ``"polish"``, ``"sinkhorn"``, the seeded finish) search every source row against every
        target row, so their cost grows as ``n * m``: 91 s for three polish rounds at 36,864 rows
        per side on 2 cores, hours at 1M. A 384 x 384 map has 147k parameters; with the cap the fit
        costs the same at any size (1,024,000 rows per side of minilm -> paraphrase-L3: 11 minutes on
        2 cores, top-1 0.994 on real pairs; ``benchmarks/bench_ray.py``).
        ``diagnostics_["fit_rows"]`` records the rows used. Sets of at most ``fit_sample`` rows are
        not touched (the same map as without the cap, bit for bit).
    random_state : None, int, numpy Generator or np.random.RandomState
        Seeds every random step (same seed → same map).

    Attributes
    ----------
    map_ : LinearMap          the fitted map, frames included; ``metadata["diagnostics"]``, ``["params"]``
    criterion_ : float        unsupervised criterion of the chosen run (higher is better)
    criteria_ : list[float]   criterion of every restart
    best_restart_ : int
    n_iter_ : int             refinement iterations of the chosen run
    null_criterion_ : float   mean criterion of 5 randomly source-rotated copies ``Q W`` of the map on the same rows
    reliable_ : bool          ``criterion_ >= max(CRITERION_FLOOR, reliability_ratio * null_criterion_)`` and
                              ``null_criterion_ > 0`` (both on held-out rows)
    diagnostics_ : dict
    """

    def __init__(self, *, init: str = "anchors", n_restarts: int = 1, n_anchor_runs: int = 30,
                 anchor_sample: int = 10000, n_clusters: int = 20, anchor_keep: float = 1.0, qap_restarts: int = 30, qap_method: str = "2opt",
                 soft_k: int = 50, refine: tuple = ("icp", "self_learning"), refine1_iters: int = 100,
                 refine1_sample: int = 1000, refine1_k: int = 50, alpha: float = 0.5, refine2_clusters: int = 500,
                 self_learning_rounds: int = 30, self_learning_sample: int | None = 4096,
                 self_learning_final_rounds: int = 2, csls_k: int = 10,
                 confident: float = 0.8, criterion_sample: int = 4096, seed_weight: float = 1.0,
                 reliability_ratio: float = 1.6, holdout: float = 0.15, polish_rounds: int = 3,
                 polish_whiten: float = 0.5, sinkhorn_rounds: int = 10, sinkhorn_eps: float = 0.05,
                 sinkhorn_tol: float = 0.1, seeded_finish: bool = True, fit_sample: int | None = 50000,
                 random_state=None):
        self.holdout = holdout
        self.fit_sample = fit_sample
        self.polish_rounds = polish_rounds
        self.polish_whiten = polish_whiten
        self.sinkhorn_rounds = sinkhorn_rounds
        self.sinkhorn_eps = sinkhorn_eps
        self.sinkhorn_tol = sinkhorn_tol
        self.seeded_finish = seeded_finish
        self.init = init
        self.n_restarts = n_restarts
        self.n_anchor_runs = n_anchor_runs
        self.anchor_sample = anchor_sample
        self.n_clusters = n_clusters
        self.anchor_keep = anchor_keep
        self.qap_restarts = qap_restarts
        self.qap_method = qap_method
        self.soft_k = soft_k
        self.refine = tuple(refine) if isinstance(refine, (list, tuple)) else refine  # checked in fit
        self.refine1_iters = refine1_iters
        self.refine1_sample = refine1_sample
        self.refine1_k = refine1_k
        self.alpha = alpha
        self.refine2_clusters = refine2_clusters
        self.self_learning_rounds = self_learning_rounds
        self.self_learning_sample = self_learning_sample
        self.self_learning_final_rounds = self_learning_final_rounds
        self.csls_k = csls_k
        self.confident = confident
        self.criterion_sample = criterion_sample
        self.seed_weight = seed_weight
        self.reliability_ratio = reliability_ratio
        self.random_state = random_state

    _fitted_attrs = ("map_", "criterion_", "criteria_", "criterion_details_", "best_restart_", "n_iter_",
                     "null_criterion_", "reliable_", "diagnostics_")  # NotFittedError before fit (Estimator)

    # --- presets ------------------------------------------------------------------------------
    @classmethod
    def published(cls, random_state=None, **overrides) -> "MiniVec2Vec":
        """The published mini-vec2vec procedure with its defaults (the benchmark's peer).

        sklearn k-means, scipy 2-opt best of 30, 30 anchor runs × k=20 on 10,000-row samples,
        soft top-50 pseudo-pairs, Procrustes, Refine-1 100 × 1,000 (k=50, α=0.5), Refine-2 k=500,
        one run, no selection, no self-learning.
        """
        params = dict(init="anchors", n_restarts=1, n_anchor_runs=30, anchor_sample=10000, n_clusters=20, anchor_keep=1.0,
                      qap_restarts=30, qap_method="2opt", soft_k=50, refine=("icp", "clusters"), refine1_iters=100,
                      refine1_sample=1000, refine1_k=50, alpha=0.5, refine2_clusters=500)
        params.update(overrides)
        return cls(random_state=random_state, **params)

    @classmethod
    def fast(cls, random_state=None, **overrides) -> "MiniVec2Vec":
        """vecbridge's quick configuration (the benchmark's ``vecbridge`` row).

        10 anchor runs on 4,000-row samples, FAQ + 2-opt polishing best of 10, the better half of
        the runs kept by normalised QAP score, Refine-1 20 × 1,000, then CSLS self-learning and the
        bidirectional whitened polish;
        2 restarts selected by the unsupervised criterion.
        """
        params = dict(init="anchors", n_restarts=2, n_anchor_runs=10, anchor_sample=4000, n_clusters=20,
                      anchor_keep=0.5, qap_restarts=10, qap_method="faq+2opt", refine=("icp", "self_learning", "polish"),
                      refine1_iters=20, self_learning_rounds=20, self_learning_sample=4096,
                      self_learning_final_rounds=2)
        params.update(overrides)
        return cls(random_state=random_state, **params)

    # --- validation ----------------------------------------------------------------------------
    def check_params(self) -> None:
        """Every parameter's type and range (typed errors): :meth:`fit` calls it first, a service when a fit
        is requested."""
        if self.init not in INITIALIZERS:
            raise InputError(f"init must be one of {sorted(INITIALIZERS)}, got {self.init!r}")
        if self.qap_method not in QAP_METHODS:
            raise InputError(f"qap_method must be one of {QAP_METHODS}, got {self.qap_method!r}")
        if not isinstance(self.refine, (list, tuple)) or not all(isinstance(s, str) for s in self.refine):
            raise InputError(f"refine must be a list of stage names from {REFINE_STAGES}, got {self.refine!r}")
        bad = [s for s in self.refine if s not in REFINE_STAGES]
        if bad:
            raise InputError(f"unknown refinement stage(s) {bad}; choose from {REFINE_STAGES}")
        big = 1 << 31
        for name in ("n_restarts", "n_anchor_runs", "anchor_sample", "qap_restarts", "soft_k", "refine1_sample",
                     "refine1_k", "csls_k", "criterion_sample"):
            check_number(name, getattr(self, name), 1, big, whole=True)
        for name in ("refine1_iters", "self_learning_rounds", "self_learning_final_rounds", "polish_rounds",
                     "sinkhorn_rounds"):
            check_number(name, getattr(self, name), 0, big, whole=True)
        for name in ("n_clusters", "refine2_clusters"):
            check_number(name, getattr(self, name), 2, big, whole=True)
        # name: (lo, hi, lo_open, hi_open)
        for name, (lo, hi, lo_open, hi_open) in {
                "sinkhorn_eps": (0.0, 1e3, True, False), "sinkhorn_tol": (0.0, 1e6, False, False),
                "polish_whiten": (0.0, 1.0, False, False), "alpha": (0.0, 1.0, True, False),
                "anchor_keep": (0.0, 1.0, True, False), "holdout": (0.0, 0.5, False, True),
                "reliability_ratio": (0.0, 1e6, True, False), "confident": (0.0, 1.0, True, False),
                "seed_weight": (0.0, 1e12, True, False)}.items():
            check_number(name, getattr(self, name), lo, hi, lo_open=lo_open, hi_open=hi_open)
        for name, lo in (("self_learning_sample", 1), ("fit_sample", 1000)):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo):
                raise InputError(f"{name} must be None or an integer >= {lo}, got {v!r}")
        check_flag("seeded_finish", self.seeded_finish)  # "no" was truthy: the finish ran
        check_seed(self.random_state)  # drawing nothing: a RandomState is the fit's to consume

    def check_rows(self, n_src: int, n_tgt: int, seeded: bool = False) -> None:
        """The checks :meth:`fit` makes of the row counts (``seeded``: with at least 2 seed pairs), typed errors:
        a service makes them when a fit is requested, before the rows are embedded."""
        need, why = self._min_rows(seeded)
        for name, n in (("X_src", n_src), ("X_tgt", n_tgt)):
            if n < need:
                raise TooFewRowsError(f"{name}: {why} needs at least {need} rows, got {n}")
        if self.init == "anchors" and not seeded and self.anchor_sample < self.n_clusters:
            # each anchor run clusters min(anchor_sample, rows) rows: the job failed saying "needs at least 20 rows"
            raise InputError(f"anchor_sample={self.anchor_sample} is below n_clusters={self.n_clusters}: each "
                             f"k-means anchor run clusters anchor_sample rows into n_clusters clusters")

    def _min_rows(self, seeded: bool) -> tuple[int, str]:
        need, why = 2, "alignment"
        if self.init == "anchors" and not seeded and self.n_clusters > need:
            need, why = self.n_clusters, f"k-means anchors with n_clusters={self.n_clusters}"
        if "clusters" in self.refine and self.refine2_clusters > need:
            need, why = self.refine2_clusters, f"Refine-2 with refine2_clusters={self.refine2_clusters}"
        return need, why

    @staticmethod
    def _check_seeds(seed_pairs, n, m):
        if seed_pairs is None:
            return None
        try:
            i_s, i_t = seed_pairs
        except (TypeError, ValueError):
            raise InputError("seed_pairs must be a pair (i_src, i_tgt) of index arrays") from None
        i_s, i_t = np.asarray(i_s).reshape(-1), np.asarray(i_t).reshape(-1)
        if i_s.size != i_t.size:
            raise PairCountError(f"seed_pairs: {i_s.size} source indices but {i_t.size} target indices")
        if i_s.size and not (np.issubdtype(i_s.dtype, np.integer) and np.issubdtype(i_t.dtype, np.integer)):
            raise InputError("seed_pairs must hold integer row indices")
        if i_s.size and (i_s.min() < 0 or i_s.max() >= n or i_t.min() < 0 or i_t.max() >= m):
            raise InputError(f"seed_pairs indices out of range (source rows {n}, target rows {m})")
        return i_s.astype(np.int64), i_t.astype(np.int64)

    # --- fitting ---------------------------------------------------------------------------------
    def fit(self, X_src, X_tgt, progress: Callable[[str, float], None] | None = None, seed_pairs=None,
            executor=None):
        """Fit the map from unpaired source rows ``X_src`` (n, d_s) and target rows ``X_tgt`` (m, d_t).

        Parameters
        ----------
        X_src, X_tgt : array-like, raw embeddings (any dims)
        progress : callable(stage: str, fraction: float), optional
        seed_pairs : (i_src, i_tgt), optional
            Known pairs, row indices into ``X_src`` / ``X_tgt`` (semi-supervised mode; with ≥ 2
            pairs the initial map comes from the seeds, and they weigh in every Procrustes fit).
        executor : callable, optional
            Where the row-block kernels run (kNN / CSLS rounds, pseudo-targets; see
            :mod:`align.blocks`): default in this process; e.g. Ray tasks
            (``service.distributed.ray_executor``). The map is bit-for-bit the same either way.

        Raises
        ------
        InputError (and subclasses): bad arrays or parameters; TooFewRowsError when a side has
        fewer rows, or fewer distinct rows, than the clusters asked for.
        """
        with executing(executor):
            return self._fit(X_src, X_tgt, progress, seed_pairs)

    def _fit(self, X_src, X_tgt, progress, seed_pairs):
        self.check_params()
        t_start = time.perf_counter()
        X = as_matrix(X_src, name="X_src")
        Y = as_matrix(X_tgt, name="X_tgt")
        seeds = self._check_seeds(seed_pairs, X.shape[0], Y.shape[0])
        seeded = seeds is not None and seeds[0].size >= 2
        self.check_rows(X.shape[0], Y.shape[0], seeded)
        need, why = self._min_rows(seeded)
        groups = []  # copies of a row: a held-out copy of a training row judged the map on memory (25 x 40 copies)
        for name, A in (("X_src", X), ("X_tgt", Y)):
            check_not_degenerate(A, name=name)
            groups.append(row_groups(A))
            distinct = A.shape[0] if groups[-1] is None else groups[-1][0].size
            if distinct < need:  # 5 rows x 200 copies: every CSLS score ~0 and the wrong map was called reliable
                raise TooFewRowsError(f"{name}: {why} needs at least {need} distinct rows, got "
                                      f"{distinct} distinct among {A.shape[0]} (the others repeat them)")
        report = check_callable("progress", progress) or (lambda stage, frac: None)
        rng = check_random_state(self.random_state)
        timings: dict = {}

        t0 = time.perf_counter()
        # on all rows; below, only the rows the fit uses are framed
        fs, ft = Frame.fit(X, validate=False), Frame.fit(Y, validate=False)
        fit_s, judge_s = self._split(X.shape[0], seeds[0] if seeded else None, need, rng, groups[0])
        fit_t, judge_t = self._split(Y.shape[0], seeds[1] if seeded else None, need, rng, groups[1])
        if judge_s.size == 0 or judge_t.size == 0:  # too few rows to hold out: judged on the training rows
            fit_s, fit_t = np.arange(X.shape[0]), np.arange(Y.shape[0])
            judge_s, judge_t = fit_s, fit_t
        held_out = judge_s.size != X.shape[0]
        cap = self.fit_sample
        if cap is not None and fit_s.size > cap:  # the all-row stages cost n * m: a seeded sample per side
            fit_s = np.sort(rng.choice(fit_s, size=cap, replace=False))
        if cap is not None and fit_t.size > cap:
            fit_t = np.sort(rng.choice(fit_t, size=cap, replace=False))
        Xs, Yt = _framed(fs, X, fit_s), _framed(ft, Y, fit_t)
        Xj = Xs if judge_s is fit_s else _framed(fs, X, judge_s)
        Yj = Yt if judge_t is fit_t else _framed(ft, Y, judge_t)
        seed_rows = ((fs.apply(X[seeds[0]], validate=False), ft.apply(Y[seeds[1]], validate=False)) if seeded
                     else None)
        timings["frames"] = time.perf_counter() - t0

        runs = []
        for r in range(self.n_restarts):
            run_rng = np.random.default_rng(rng.integers(0, 2**63 - 1))
            runs.append(self._one_run(r, Xs, Yt, seed_rows, run_rng, report, Xj, Yj))
        crits = [run["criterion"]["criterion"] for run in runs]
        best = int(np.argmax(crits))
        chosen = runs[best]
        final_crit, final_details = crits[best], chosen["criterion"]
        W = chosen.pop("W")
        for run in runs:
            run.pop("W", None)
        timings["restarts"] = [run["timings"] for run in runs]
        self._warn_short_kmeans(runs)
        finish = None
        if seeded and self.seeded_finish and "sinkhorn" not in self.refine and self.sinkhorn_rounds > 0:
            W, finish, final_details = self._seeded_finish(W, Xs, Yt, seed_rows, Xj, Yj, rng, report, timings)
            finish["criterion_before"], final_crit = float(final_crit), final_details["criterion"]
        t0 = time.perf_counter()
        null = []
        for _ in range(5):  # the chosen map after a random rotation of the source: same target subspace, random
            Q = np.linalg.qr(rng.normal(size=(Xs.shape[1],) * 2))[0]  # correspondence inside it
            null.append(map_criterion(Q @ W, Xj, Yj, sample=self.criterion_sample, csls_k=self.csls_k,
                                      random_state=rng)["criterion"])
        timings["null_criterion"] = time.perf_counter() - t0
        timings["total"] = time.perf_counter() - t_start
        self.null_criterion_ = float(np.mean(null))
        floor, null_c = CRITERION_FLOOR, self.null_criterion_
        self.reliable_ = bool(held_out and null_c > 0 and final_crit >= max(floor, self.reliability_ratio * null_c))
        if not held_out:  # on its own refined rows a wrong map scores ~5x random: no verdict (was "reliable")
            reason = self._no_holdout(X, Y, seeds if seeded else None, need, groups)
            warnings.warn(f"MiniVec2Vec: no rows held out to judge the map ({reason}), so it is flagged unreliable",
                          ConvergenceWarning, stacklevel=3)
        elif not self.reliable_ and (null_c <= 0 or final_crit < floor):  # ratio of two ~0s: duplicated rows
            warnings.warn(f"MiniVec2Vec: criterion {final_crit:.3g} (random maps: {null_c:.3g}) is not above the floor "
                          f"{floor}: the rows show no neighbourhood structure to judge a map by (e.g. a few rows "
                          f"repeated); the map is probably wrong", ConvergenceWarning, stacklevel=3)
        elif not self.reliable_:
            warnings.warn(f"MiniVec2Vec: criterion {final_crit:.4f} is below {self.reliability_ratio} x the criterion "
                          f"of random maps ({null_c:.4f}); the map is probably wrong", ConvergenceWarning,
                          stacklevel=3)

        self.criteria_ = [float(c) for c in crits]
        self.best_restart_ = best
        self.criterion_ = float(final_crit)
        self.criterion_details_ = final_details
        self.n_iter_ = int(chosen["n_iter"])
        self.diagnostics_ = {
            "timings": timings, "runs": runs, "chosen_restart": best, "criteria": self.criteria_,
            "null_criterion": self.null_criterion_, "reliable": self.reliable_,
            "verdict_rows": {"held_out": bool(held_out), "source": int(judge_s.size), "target": int(judge_t.size)},
            "seeded": bool(seeded), "n_seed_pairs": 0 if seeds is None else int(seeds[0].size),
            "seeded_finish": finish,
            "n_src": int(X.shape[0]), "n_tgt": int(Y.shape[0]),
            "fit_rows": {"source": int(Xs.shape[0]), "target": int(Yt.shape[0])},
        }
        params = self.get_params()
        params["refine"] = list(params["refine"])
        params["random_state"] = seed_record(params["random_state"])
        self.map_ = LinearMap(W.astype(np.float32), None, fs, ft, {
            "method": "minivec2vec", "params": params, "diagnostics": self.diagnostics_,
            "criterion": self.criterion_,
        })
        report("done", 1.0)
        return self

    def _seeded_finish(self, W, Xs, Yt, seed_rows, Xj, Yj, rng, report, timings):
        """Whitened Sinkhorn soft matching on the chosen seeded map (class docstring, step 4).

        Returns ``(W, info, criterion dict of the final map on the verdict rows)``.
        """
        from .semisup import sinkhorn_polish

        t0 = time.perf_counter()
        p = seed_rows[0].shape[0]
        W, hist = sinkhorn_polish(W, Xs, Yt, rounds=self.sinkhorn_rounds, eps=self.sinkhorn_eps,
                                  whiten=self.polish_whiten, seed_pairs=seed_rows, seed_share=p / (Xs.shape[0] + p),
                                  tol=self.sinkhorn_tol, progress=lambda f: report("seeded_finish", f))
        crit = map_criterion(W, Xj, Yj, sample=self.criterion_sample, csls_k=self.csls_k, random_state=rng)
        timings["seeded_finish"] = time.perf_counter() - t0
        return W, {"method": "whitened sparse Sinkhorn", "eps": float(self.sinkhorn_eps),
                   "rounds": len(hist), "history": hist}, crit

    def _warn_short_kmeans(self, runs: list) -> None:
        """One ConvergenceWarning for every k-means of the fit (anchors, Refine-2) that found fewer clusters than asked:
        scikit-learn's own came once per k-means, 60 times in a default fit on repeated rows."""
        short = total = 0
        for run in runs:
            h = run["history"]
            short += short_kmeans(h["init"].get("anchor_runs", []), self.n_clusters)
            total += 2 * len(h["init"].get("anchor_runs", []))
            found = h.get("clusters", {}).get("clusters_found", [])
            short, total = short + sum(f < self.refine2_clusters for f in found), total + len(found)
        if short:
            asked = f"n_clusters={self.n_clusters}" + (f", refine2_clusters={self.refine2_clusters}"
                                                        if "clusters" in self.refine else "")
            warnings.warn(f"MiniVec2Vec: {short} of the fit's {total} k-means found fewer clusters than asked "
                          f"({asked}): their row samples held fewer distinct rows (rows repeat), so some centroids "
                          f"repeat and match nothing; the start is weaker. Fewer clusters, or more distinct rows, "
                          f"avoid it", ConvergenceWarning, stacklevel=4)

    def _no_holdout(self, X, Y, seeds, need: int, groups) -> str:
        """Why :meth:`_split` held no rows out: seed rows are never held out (all but a few rows seeds), or too few
        distinct rows."""
        sides = (("source", X, None if seeds is None else seeds[0], groups[0]),
                 ("target", Y, None if seeds is None else seeds[1], groups[1]))
        for side, A, keep, grp in sides:
            n = A.shape[0] if grp is None else grp[0].size
            free = n - (0 if keep is None else np.unique(keep if grp is None else grp[1][keep]).size)
            if free < 20 <= min(int(self.holdout * n), self.criterion_sample, n - need):
                return (f"seed rows are never held out, and only {free} of the {n} {'' if grp is None else 'distinct '}"
                        f"{side} rows are not seed rows: fewer than 20")
        distinct = [A.shape[0] if g is None else g[0].size for A, g in ((X, groups[0]), (Y, groups[1]))]
        copies = "" if distinct == [X.shape[0], Y.shape[0]] else f" ({distinct[0]} x {distinct[1]} distinct)"
        return f"holdout={self.holdout}, {X.shape[0]} x {Y.shape[0]} rows{copies}: fewer than 20 per side"

    def _split(self, n: int, keep, need: int, rng, groups=None) -> tuple[np.ndarray, np.ndarray]:
        """``(fit_rows, judge_rows)`` of ``n`` rows: ``holdout`` of them (≤ ``criterion_sample``, never a row
        in ``keep``) held out, as long as ``need`` rows stay for the fit; ``judge_rows`` is empty when fewer
        than 20 rows could be held out. ``groups`` (:func:`align.validation.row_groups`, rows that repeat): the
        distinct rows are split instead, one row of each held-out one judging and no copy of it fitting."""
        first, group = groups if groups is not None else (np.arange(n),) * 2  # every row its own group
        u = first.size
        free = np.setdiff1d(np.arange(u), group[keep]) if keep is not None else np.arange(u)
        k = min(int(self.holdout * u), self.criterion_sample, free.size, u - need)
        if k < 20:
            return np.arange(n), np.zeros(0, np.int64)
        held = np.sort(rng.choice(free, size=k, replace=False))
        return np.flatnonzero(~np.isin(group, held)), first[held]

    def _one_run(self, r: int, Xs, Yt, seed_rows, rng, report, Xj, Yj) -> dict:
        timings, history = {}, {}
        t0 = time.perf_counter()
        prefix = f"restart {r}: " if self.n_restarts > 1 else ""
        if seed_rows is not None:
            init_name = "seeds"
            W = seed_relative_init(Xs, Yt, *seed_rows, csls_k=self.csls_k)
            info = {"n_seed_pairs": int(seed_rows[0].shape[0])}
        else:
            init_name = self.init
            W, info = INITIALIZERS[self.init](self, Xs, Yt, rng, lambda f: report(prefix + "init", f))
        timings["init"] = time.perf_counter() - t0
        history["init"] = {"name": init_name, **info}
        n_iter = 0
        for stage in self.refine:
            t0 = time.perf_counter()
            if stage == "icp" and self.refine1_iters > 0:
                W, h = refine_icp(W, Xs, Yt, iters=self.refine1_iters, sample=self.refine1_sample, k=self.refine1_k,
                                  alpha=self.alpha, random_state=rng,
                                  progress=lambda f: report(prefix + "icp", f))
                n_iter += len(h)
            elif stage == "clusters":
                report(prefix + "clusters", 0.0)
                W, h = refine_clusters(W, Xs, Yt, n_clusters=self.refine2_clusters, alpha=self.alpha,
                                       random_state=rng)
                n_iter += 1
                report(prefix + "clusters", 1.0)
            elif stage == "self_learning":
                W, h = self_learning(W, Xs, Yt, rounds=self.self_learning_rounds, csls_k=self.csls_k,
                                     sample=self.self_learning_sample,
                                     final_rounds=self.self_learning_final_rounds, confident=self.confident,
                                     seed_pairs=seed_rows, seed_weight=self.seed_weight, random_state=rng,
                                     progress=lambda f: report(prefix + "self_learning", f))
                n_iter += len(h)
            elif stage == "polish" and self.polish_rounds > 0:
                W, h = bidirectional_polish(W, Xs, Yt, rounds=self.polish_rounds, csls_k=self.csls_k,
                                            whiten=self.polish_whiten, seed_pairs=seed_rows,
                                            progress=lambda f: report(prefix + "polish", f))
                n_iter += len(h)
            elif stage == "sinkhorn" and self.sinkhorn_rounds > 0:
                from .semisup import sinkhorn_polish

                W, h = sinkhorn_polish(W, Xs, Yt, rounds=self.sinkhorn_rounds, eps=self.sinkhorn_eps,
                                       whiten=self.polish_whiten, seed_pairs=seed_rows, seed_share=0.1,
                                       progress=lambda f: report(prefix + "sinkhorn", f))
                n_iter += len(h)
            else:
                continue
            timings[stage] = time.perf_counter() - t0
            history[stage] = h
        t0 = time.perf_counter()
        crit = map_criterion(W, Xj, Yj, sample=self.criterion_sample, csls_k=self.csls_k, random_state=rng)
        timings["criterion"] = time.perf_counter() - t0
        report(prefix + "criterion", 1.0)
        return {"W": W, "criterion": crit, "history": history, "timings": timings, "n_iter": n_iter}

    # --- applying ----------------------------------------------------------------------------------
    def transform(self, X, *, output: str = "raw") -> np.ndarray:
        """Map raw source rows (n, d_s) to (n, d_t) float32 (``output`` as in :meth:`LinearMap.apply`)."""
        if not hasattr(self, "map_"):
            raise NotFittedError("MiniVec2Vec is not fitted yet; call fit(X_src, X_tgt) first")
        return self.map_.apply(X, output=output)

    def fit_transform(self, X_src, X_tgt, **kw) -> np.ndarray:
        return self.fit(X_src, X_tgt, **kw).transform(X_src)
