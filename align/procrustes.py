"""Supervised fitting from paired rows, on additive sufficient statistics.

All fitters need only

.. math::  n,\\quad w,\\quad s_x = \\sum_i x_i,\\quad s_y = \\sum_i y_i,\\quad X^\\top Y,\\quad X^\\top X

(``X`` (n, d_s), ``Y`` (n, d_t) in their frames; ``w`` the total weight, = n unweighted, and each sum weighted
per row when weights are given), so a fit can stream over chunks and partial
statistics from many workers merge exactly (:meth:`PairStats.merge`, ``+``).

- **Orthogonal Procrustes**: :math:`\\min_{W^\\top W = I} \\|XW - Y\\|_F`, solved by
  :math:`W = U V^\\top` with :math:`U \\Sigma V^\\top = \\mathrm{svd}(X^\\top Y)`; rectangular
  ``W`` (semi-orthogonal) when dims differ, equivalent to zero-padding the smaller side.
  Optional global scale :math:`s = \\mathrm{tr}\\,\\Sigma / \\|X\\|_F^2`.
- **Ridge / affine**: :math:`W = (X_c^\\top X_c + \\lambda I)^{-1} X_c^\\top Y_c`, ``b = \\bar y - \\bar x W``.
  From fewer pairs than source dimensions, held as rows (:class:`PairStats`), the same ``W`` in its dual form
  :math:`X_c^\\top (X_c X_c^\\top + \\lambda I)^{-1} Y_c` (an n x n system, not a d_s x d_s one).
- **Low-rank**: reduced-rank ridge, ``W_r = W V_r V_r^\\top`` with ``V_r`` the top-r right singular
  vectors of the fitted values ``X W`` (from the n x n ``(X W)(X W)ᵀ`` in the dual).
"""

from __future__ import annotations

import inspect

import numpy as np

from . import linalg
from .validation import check_paired
from .exceptions import DegenerateInputError, DimensionMismatchError, InputError, TooFewRowsError
from .frames import Frame
from .maps import LinearMap
from .options import check_flag, check_number

__all__ = [
    "PairStats",
    "procrustes_W",
    "procrustes_from_stats",
    "ridge_from_stats",
    "lowrank_from_stats",
    "fit_procrustes",
    "fit_ridge",
    "fit_lowrank",
    "fit_frames",
    "pair_stats",
    "map_from_stats",
    "check_closed_form_params",
]


class PairStats:
    """Additive statistics of paired rows (float64).

    Attributes: ``n`` (the pairs: rows of positive weight); ``weight`` (their total weight, the divisor of the pair
    means: = ``n`` unweighted); ``sum_x`` (d_s,); ``sum_y`` (d_t,); ``xty`` (d_s, d_t); ``xtx`` (d_s, d_s);
    ``sq_x`` = ‖X‖²_F; ``sq_y`` = ‖Y‖²_F (each weighted per row when weights are given). Weights are row
    multiplicities: an integer weight k fits as k copies of the row, a zero weight as no row.

    One unweighted chunk of fewer rows than source dimensions (:meth:`from_arrays`) keeps its rows instead of
    ``XᵀX``: they are smaller, and ``xtx`` is formed from them on first read (a Procrustes fit, e.g. each
    cross-validation fold's in :func:`align.fit_migration`, never reads it); a ridge or low-rank fit solves the
    n x n (dual) system on them instead of the d_s x d_s one. Statistics merged, updated or pickled are the sums
    alone.
    """

    def __init__(self, n: int, sum_x: np.ndarray, sum_y: np.ndarray, xty: np.ndarray, xtx: np.ndarray,
                 sq_x: float = 0.0, sq_y: float = 0.0, weight: float | None = None):
        self.n, self.sum_x, self.sum_y, self.xty, self.sq_x, self.sq_y = n, sum_x, sum_y, xty, sq_x, sq_y
        self.weight = float(n if weight is None else weight)
        self._xtx = xtx
        self._rows: tuple[np.ndarray, np.ndarray] | None = None  # (X, Y) float64 while xtx is not formed

    @property
    def xtx(self) -> np.ndarray:
        if self._xtx is None:
            X = self._rows[0]
            self._xtx = X.T @ X
        return self._xtx

    @xtx.setter
    def xtx(self, value: np.ndarray) -> None:
        self._xtx, self._rows = value, None  # no longer the statistics of the kept rows

    def __repr__(self) -> str:
        w = "" if self.weight == self.n else f", weight={self.weight:g}"
        return f"PairStats(n={self.n}{w}, d_s={self.sum_x.shape[0]}, d_t={self.sum_y.shape[0]})"

    def __getstate__(self) -> dict:
        """Pickled (a shard's statistics sent to the process that merges them): the sums, ``XᵀX`` formed."""
        return {**self.__dict__, "_xtx": self.xtx, "_rows": None}

    def __setstate__(self, state: dict) -> None:
        """Also statistics pickled by releases before ``weight`` (unweighted) and before the kept rows (a dataclass
        whose ``xtx`` was a field: here a property over ``_xtx``)."""
        state = {"weight": float(state["n"]), "_rows": None, **state}
        if "xtx" in state:
            state["_xtx"] = state.pop("xtx")
        self.__dict__.update(state)

    @classmethod
    def zeros(cls, d_s: int, d_t: int) -> "PairStats":
        return cls(0, np.zeros(d_s), np.zeros(d_t), np.zeros((d_s, d_t)), np.zeros((d_s, d_s)))

    @classmethod
    def from_arrays(cls, X: np.ndarray, Y: np.ndarray, weights: np.ndarray | None = None) -> "PairStats":
        """Statistics of one chunk of framed, paired rows (optionally weighted per row).

        ``X`` (n, d_s) and ``Y`` (n, d_t) are checked as every paired input is (2-D, numeric, finite, same row
        count: typed errors, so a NaN does not surface later as "no signal"); ``weights`` (n,) finite and ≥ 0.
        Sums are accumulated in float64; ``n`` counts the rows of positive weight, ``weight`` sums the weights.
        Unweighted, with n < d_s, the statistics keep (a float64 copy of) the
        rows rather than form ``XᵀX`` (see the class).
        """
        X, Y = check_paired(X, Y, names=("X", "Y"))
        X, Y = X.astype(np.float64), Y.astype(np.float64)
        if weights is not None:
            w = np.asarray(weights)
            if w.dtype.kind not in "biuf" or w.shape != (X.shape[0],) or not np.isfinite(w).all() or (w < 0).any():
                raise InputError(f"weights must be {X.shape[0]} finite non-negative numbers, one per pair")
            w = w.astype(np.float64).reshape(-1, 1)
            Xw = X * w
            return cls(int((w > 0).sum()), Xw.sum(0), (Y * w).sum(0), Xw.T @ Y, Xw.T @ X,
                       float((Xw * X).sum()), float((Y * Y * w).sum()), weight=float(w.sum()))
        keep = X.shape[0] < X.shape[1]  # n < d_s: the rows are no larger than XᵀX and XᵀY, and the dual is n x n
        out = cls(int(X.shape[0]), X.sum(0), Y.sum(0), X.T @ Y, None if keep else X.T @ X, float((X * X).sum()),
                  float((Y * Y).sum()))
        if keep:
            out._rows = (X, Y)
        return out

    def update(self, X, Y, weights=None) -> "PairStats":
        """Add a chunk (optionally weighted per row, as :meth:`from_arrays`) in place and return self."""
        other = PairStats.from_arrays(X, Y, weights)
        self._add(other)
        return self

    def _add(self, other: "PairStats") -> None:
        if self.xty.shape != other.xty.shape:
            raise DimensionMismatchError(f"cannot merge statistics of shapes {self.xty.shape} and {other.xty.shape}")
        self.xtx = self.xtx + other.xtx
        self.n += other.n
        self.weight += other.weight
        self.sum_x = self.sum_x + other.sum_x
        self.sum_y = self.sum_y + other.sum_y
        self.xty = self.xty + other.xty
        self.sq_x += other.sq_x
        self.sq_y += other.sq_y

    def merge(self, other: "PairStats") -> "PairStats":
        """Return the statistics of the union of both chunks (exact)."""
        out = PairStats(self.n, self.sum_x.copy(), self.sum_y.copy(), self.xty.copy(), self.xtx.copy(), self.sq_x,
                        self.sq_y, weight=self.weight)
        out._add(other)
        return out

    __add__ = merge

    def centered(self) -> tuple[np.ndarray, np.ndarray]:
        """``(X_cᵀ Y_c, X_cᵀ X_c)``: the cross and Gram matrices about the (weighted) pair means."""
        return self._cross(True), self._gram(True)

    def _cross(self, center: bool) -> np.ndarray:
        """``XᵀY``, about the pair means when ``center``."""
        if not center:
            return self.xty
        return self.xty - self.weight * np.outer(*self._means())

    def _gram(self, center: bool) -> np.ndarray:
        """``XᵀX``, about the pair means when ``center``."""
        if not center:
            return self.xtx
        mx = self._means()[0]
        return self.xtx - self.weight * np.outer(mx, mx)

    def _means(self) -> tuple[np.ndarray, np.ndarray]:
        """The (weighted) pair means of X and Y: each sum over the total weight."""
        if self.n == 0 or not self.weight > 0:
            raise TooFewRowsError("no pairs accumulated")
        return self.sum_x / self.weight, self.sum_y / self.weight

    def _dual_rows(self, center: bool) -> tuple[np.ndarray, np.ndarray] | None:
        """The kept rows ``(X, Y)`` (about the pair means when ``center``), or None when only sums are kept."""
        if self._rows is None:
            return None
        X, Y = self._rows
        if not center:
            return X, Y
        mx, my = self._means()
        return X - mx, Y - my


def procrustes_W(M: np.ndarray) -> np.ndarray:
    """The orthogonal (semi-orthogonal) maximiser of ``tr(Wᵀ M)``: ``U Vᵀ`` of ``svd(M)``. M: (d_s, d_t)."""
    U, _, Vt = linalg.svd(np.asarray(M, dtype=np.float64))
    return U @ Vt


#: Procrustes from fewer pairs than dimensions takes the thin path (:func:`procrustes_from_stats`) only above this
#: width: below it a full SVD costs under a second, and its answer (with which the few-pairs figures and the plan's
#: curves were measured; the thin path's completion held out 0.006 lower top-1 at 100 WordNet pairs) is kept.
THIN_SVD_MIN_DIM = 1024


def _thin_polar(M: np.ndarray, rank_bound: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Procrustes ``W`` and the singular values of ``M`` (d_s, d_t) of rank <= ``rank_bound`` < min(d_s, d_t),
    without a d x d SVD (17 s at 3072-d, once per fit and per cross-validation fold).

    ``M = U S Vᵀ`` from a range finder (``M Ω``, Ω a fixed Gaussian d_t x rank_bound: exact for a rank <= the
    bound) and the SVD of ``Qᵀ M``. ``U Vᵀ`` fixes ``W`` on span(U) only; a full SVD left the rest to LAPACK's
    vectors for the zero singular values. Here the complement of span(U) goes to the complement of span(V) by the
    orthogonal completion closest to the identity (both sides zero-padded to d = max(d_s, d_t)): the identity
    off span(U) + span(V); in the plane of each pair of principal vectors u', v' (cosine c) the unit vector
    orthogonal to u' goes to the one orthogonal to v' nearest it. In closed form, with no division by a sine::

        W = I + U (V - U)ᵀ + (U' c - V') diag(1 / (1 + c)) (U' + V')ᵀ,   U' = U a, V' = V b, Uᵀ V = a diag(c) bᵀ

    So ``W`` maximises tr(Wᵀ M), is orthogonal (semi-orthogonal when d_s != d_t: its first d_s rows, d_t columns)
    and is the same for any Ω up to rounding. O(d² k) for k = rank_bound. ``None`` when the range check fails
    (the caller takes the full SVD).
    """
    d_s, d_t = M.shape
    omega = np.random.default_rng(0).standard_normal((d_t, int(rank_bound)))
    Q, _ = linalg.qr(M @ omega)
    Ub, S, Vt = linalg.svd(Q.T @ M)
    keep = S > S[0] * max(d_s, d_t) * np.finfo(np.float64).eps
    U, S, V = Q @ Ub[:, keep], S[keep], Vt[keep].T
    g = np.random.default_rng(1).standard_normal(d_t)  # M g must lie in span(U): else the rank bound was wrong
    if np.linalg.norm(M @ g - U @ (S * (V.T @ g))) > 1e-9 * S[0] * np.linalg.norm(g):
        return None
    m = min(d_s, d_t)
    a, c, bt = linalg.svd(U[:m].T @ V[:m])  # principal vectors of span(U), span(V) in the padded space
    c = np.clip(c, 0.0, 1.0)
    Up, Vp = U @ a, V @ bt.T
    r, d = S.size, max(d_s, d_t)
    L, R = np.zeros((d, 2 * r)), np.zeros((d, 2 * r))  # W = I + L Rᵀ in the padded space
    L[:d_s, :r] = U
    L[:d_s, r:] = Up * c
    L[:d_t, r:] -= Vp
    L[:, r:] /= 1.0 + c
    R[:d_t, :r] = V
    R[:d_s, :r] -= U
    R[:d_s, r:] = Up
    R[:d_t, r:] += Vp
    return np.eye(d_s, d_t) + L[:d_s] @ R[:d_t].T, S


def procrustes_from_stats(stats: PairStats, *, scale: bool = False, center: bool = False) -> tuple[np.ndarray, float]:
    """Orthogonal Procrustes ``W`` (d_s, d_t) and scale from statistics.

    ``center=True`` uses the statistics about the pair means (the frames already centre each
    side on its own training mean, so the default is ``False``).
    """
    if stats.n < 1:
        raise TooFewRowsError("Procrustes needs at least one pair")
    M = stats._cross(center)
    if not np.isfinite(M).all() or np.abs(M).max() == 0:
        raise DegenerateInputError("the cross-covariance XᵀY is zero: the pairs carry no signal")
    # thin only where it pays: its products cost ~d² n each, so from n ~ d/2 the full SVD is faster (2048-d: 1,000
    # pairs thin 3.6 s vs full 8.1 s, 1,900 pairs 14.2 s vs 4.5 s)
    thin = _thin_polar(M, stats.n) if 2 * stats.n <= min(M.shape) and min(M.shape) > THIN_SVD_MIN_DIM else None
    if thin is not None:
        W, S = thin
    else:
        U, S, Vt = linalg.svd(M)
        W = U @ Vt
    s = 1.0
    if scale:
        sq = stats.centered()[1].trace() if center else stats.sq_x
        s = float(S.sum() / sq) if sq > 0 else 1.0
    return W, s


def ridge_from_stats(stats: PairStats, *, alpha: float = 1.0, fit_intercept: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """Ridge solution ``W = (XᵀX + αI)⁻¹ XᵀY`` (centred when fitting an intercept) and bias.

    From statistics that kept their n < d_s rows (:class:`PairStats`) and α > 0, the same ``W`` in its dual form
    ``Xᵀ (X Xᵀ + αI)⁻¹ Y``: an n x n system (fit_ridge of 1,000 pairs of 3072-d rows: 10.3 s -> 4.5 s and
    744 -> 493 MiB peak on a busy 2-core machine). α = 0 keeps the primal (singular in both forms)."""
    W, _ = _ridge(stats, alpha, fit_intercept)
    return W, _bias(stats, W, fit_intercept)


def _ridge(stats: PairStats, alpha: float, fit_intercept: bool) -> tuple[np.ndarray, tuple | None]:
    """``(W, dual)``: the ridge ``W`` and, when it was solved in the dual, ``(K, Z)`` with ``K = X Xᵀ`` (n, n) and
    ``W = Xᵀ Z`` (the rows about their means when ``fit_intercept``), so the fitted values ``X W`` are ``K Z``."""
    if alpha < 0:
        raise InputError(f"alpha must be >= 0, got {alpha}")
    xty = stats._cross(fit_intercept)
    if not np.isfinite(xty).all() or np.abs(xty).max() == 0:  # W = 0: every row mapped to the bias (all-identical
        # rows on either side) — a constant map, returned silently before; Procrustes refused the same pairs
        raise DegenerateInputError("the cross-covariance XᵀY is zero: the pairs carry no signal (are all rows of one "
                                   "side identical?)")
    rows = stats._dual_rows(fit_intercept) if alpha > 0 else None  # alpha 0: singular either way, primal kept
    if rows is None:
        xtx = stats._gram(fit_intercept)
        return _solve(xtx + alpha * np.eye(xtx.shape[0]), xty), None
    X, Y = rows
    K = X @ X.T
    Z = _solve(K + alpha * np.eye(K.shape[0]), Y)
    return X.T @ Z, (K, Z)


def _solve(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    try:
        return linalg.solve(A, B)
    except np.linalg.LinAlgError:
        return linalg.lstsq(A, B)


def _bias(stats: PairStats, W: np.ndarray, fit_intercept: bool) -> np.ndarray | None:
    if not fit_intercept:
        return None
    mx, my = stats._means()
    return my - mx @ W


def lowrank_from_stats(stats: PairStats, *, rank: int, alpha: float = 1.0, fit_intercept: bool = True):
    """Reduced-rank ridge: ``W V_r V_rᵀ`` with ``V_r`` the top-``rank`` eigenvectors of ``Wᵀ XᵀX W`` (the top right
    singular vectors of the fitted values ``X W``; from a dual ridge (:func:`ridge_from_stats`) through the n x n
    ``(X W)(X W)ᵀ``, no d x d eigenproblem)."""
    if not 1 <= rank <= min(stats.xty.shape):
        raise InputError(f"rank must be in [1, {min(stats.xty.shape)}], got {rank}")
    W, dual = _ridge(stats, alpha, fit_intercept)
    if dual is None:
        C = W.T @ stats._gram(fit_intercept) @ W
        evals, evecs = linalg.eigh((C + C.T) / 2)
        V = evecs[:, np.argsort(evals)[::-1][:rank]]
    else:
        K, Z = dual
        F = K @ Z  # the fitted values X W (n, d_t): Wᵀ XᵀX W = Fᵀ F
        G = F @ F.T
        evals, evecs = linalg.eigh((G + G.T) / 2)
        top = np.argsort(evals)[::-1][:rank]
        # F's top right singular vectors span Fᵀ u of its top left ones u; directions of F at rounding level (a rank
        # over F's) are left out: X W v = 0 puts W v in null(X) and row(X) (W = Xᵀ Z) at once, so W v = 0
        top = top[evals[top] > evals.max() * F.shape[0] * np.finfo(np.float64).eps]
        V = linalg.qr(F.T @ evecs[:, top])[0]
    W_r = (W @ V) @ V.T
    return W_r, _bias(stats, W_r, fit_intercept)


# --- front ends: raw paired arrays -> LinearMap ---------------------------------------------

def fit_frames(X, Y, *, center: bool = True, normalize: bool = True) -> tuple[Frame, Frame]:
    """Fit each side's own frame (unit → centre → unit) on its training rows."""
    return (Frame.fit(X, center=center, unit_in=normalize, unit_out=normalize, validate=False),
            Frame.fit(Y, center=center, unit_in=normalize, unit_out=normalize, validate=False))


def pair_stats(X: np.ndarray, Y: np.ndarray, frames: tuple[Frame, Frame], *, chunk_size: int = 65536) -> PairStats:
    """:class:`PairStats` of raw rows ``X`` (n, d_s), ``Y`` (n, d_t) put in ``frames``, ``chunk_size`` rows at a time.

    Statistics of row blocks (shards) merge exactly with ``+``. Rows in one chunk are kept when fewer than d_s
    (:class:`PairStats`: the fit solves the dual).
    """
    fs, ft = frames
    chunk_size = check_number("chunk_size", chunk_size, 1, 1 << 31, whole=True)
    if X.shape[1] != fs.dim or Y.shape[1] != ft.dim:
        raise DimensionMismatchError(f"rows are {X.shape[1]}->{Y.shape[1]}, the frames {fs.dim}->{ft.dim}")
    stats = None
    for s in range(0, X.shape[0], chunk_size):
        part = PairStats.from_arrays(fs.apply(X[s : s + chunk_size], validate=False),
                                    ft.apply(Y[s : s + chunk_size], validate=False))
        if stats is None:
            stats = part
        else:
            stats._add(part)
    return PairStats.zeros(fs.dim, ft.dim) if stats is None else stats


def _solve_procrustes(stats, scale: bool = False):
    W, s = procrustes_from_stats(stats, scale=scale)
    return W * s, None, {"scale": scale}, {"scale": s}


def _solve_ridge(stats, alpha: float = 1.0, fit_intercept: bool = True):
    W, bias = ridge_from_stats(stats, alpha=alpha, fit_intercept=fit_intercept)
    return W, bias, {"alpha": alpha, "fit_intercept": fit_intercept}, {}


def _solve_lowrank(stats, rank: int, alpha: float = 1.0, fit_intercept: bool = True):
    W, bias = lowrank_from_stats(stats, rank=rank, alpha=alpha, fit_intercept=fit_intercept)
    return W, bias, {"rank": rank, "alpha": alpha, "fit_intercept": fit_intercept}, {}


_SOLVERS = {"procrustes": _solve_procrustes, "ridge": _solve_ridge, "lowrank": _solve_lowrank}


def map_from_stats(stats: PairStats, frames: tuple[Frame, Frame], method: str = "procrustes", *,
                   center: bool = True, normalize: bool = True, **params) -> LinearMap:
    """The :class:`LinearMap` of ``method`` from merged statistics of framed pairs.

    ``method``: ``procrustes`` (``scale``), ``ridge`` (``alpha``, ``fit_intercept``) or ``lowrank``
    (``rank``, ``alpha``, ``fit_intercept``); ``center`` / ``normalize`` only record how ``frames``
    were fitted. :func:`fit_procrustes` & co. are this on one machine's rows; a sharded fit calls it on
    the sum of its shards' :func:`pair_stats`.
    """
    solve = _SOLVERS.get(method)
    if solve is None:
        raise InputError(f"method must be procrustes, ridge or lowrank, got {method!r}")
    if method == "lowrank" and params.get("rank") is None:
        raise InputError("method='lowrank' needs rank=")
    params.update(_check_values(params))
    if stats.n < 2:
        raise TooFewRowsError(f"a fit needs at least 2 pairs, got {stats.n}")
    try:
        inspect.signature(solve).bind(stats, **params)
    except TypeError as exc:
        raise InputError(f"bad parameter for {method}: {exc}") from None
    W, bias, used, extra = solve(stats, **params)
    meta = {"method": method, "params": {**used, "center": center, "normalize": normalize},
            "n_pairs": int(stats.n), **extra}
    return LinearMap(W, bias, frames[0], frames[1], meta)


#: The largest ridge ``alpha`` (absolute: the penalty on the squared weights beside the pairs' XᵀX, whose trace is
#: the pair count for unit rows). Any finite value was taken: 1e308 was accepted and the fit failed late, W stored
#: as 0 ("scale the map"). Far below 1e12 a penalty already swamps XᵀY of any pair count: W is XᵀY / alpha.
MAX_RIDGE_ALPHA = 1e12


def _check_values(params: dict) -> dict:
    """The flags, ``alpha``, ``rank`` and ``chunk_size`` among ``params`` checked (typed errors); returns the
    whole numbers as ``int``."""
    for key in ("scale", "fit_intercept", "center", "normalize"):
        if key in params:
            check_flag(key, params[key])
    if "alpha" in params:
        check_number("alpha", params["alpha"], 0.0, MAX_RIDGE_ALPHA)
    return {key: check_number(key, params[key], 1, hi, whole=True)
            for key, hi in (("rank", 1 << 20), ("chunk_size", 1 << 31)) if key in params}


def check_closed_form_params(method: str, params: dict, *, dims: tuple[int, int] | None = None) -> None:
    """Every check :func:`fit_procrustes`, :func:`fit_ridge` or :func:`fit_lowrank` (``method``) makes on its
    keyword ``params`` before it reads a row: their names, the flags, ``alpha``, ``rank`` (needed by lowrank;
    at most ``min(dims)`` when the widths ``dims`` = (d_s, d_t) are known) and ``chunk_size``. A service calls
    it when a fit is requested, so a bad value is refused then (``alpha=-1`` was a failed job)."""
    fit = {"procrustes": fit_procrustes, "ridge": fit_ridge, "lowrank": fit_lowrank}.get(method)
    if fit is None:
        raise InputError(f"method must be procrustes, ridge or lowrank, got {method!r}")
    try:
        inspect.signature(fit).bind(None, None, **params)
    except TypeError as exc:
        raise InputError(f"bad parameter for {method}: {exc}") from None
    rank = _check_values(params).get("rank")
    if method == "lowrank" and dims is not None and rank is not None and rank > min(dims):
        raise InputError(f"rank must be in [1, {min(dims)}] (the narrower side is {min(dims)}-d), got {rank}")


def _prepare(X, Y, center, normalize, min_rows=2):
    check_flag("center", center)
    check_flag("normalize", normalize)
    X, Y = check_paired(X, Y, names=("X", "Y"), min_rows=min_rows)
    frames = fit_frames(X, Y, center=center, normalize=normalize)
    return X, Y, frames


def fit_procrustes(X, Y, *, scale: bool = False, center: bool = True, normalize: bool = True,
                   chunk_size: int = 65536) -> LinearMap:
    """Orthogonal Procrustes map from paired raw rows ``X`` (n, d_s) → ``Y`` (n, d_t).

    Each side is put in its own frame first; the returned map includes both frames.

    Parameters
    ----------
    X, Y : array (n, d_s), array (n, d_t)
        Raw rows, paired by row (row i of both embeds one text); at least 2 pairs.
    scale : bool
        Also fit a global scale ``s`` (``W = s Q``, ``metadata["scale"]``); False: ``s = 1``.
    center, normalize : bool
        How each side's frame is fitted (:class:`~align.frames.Frame`): subtract its training mean; bring rows to
        unit length before and after centring.
    chunk_size : int
        Rows put in the frames and summed into the pair statistics at a time (memory, not the result).

    >>> import numpy as np, align
    >>> rng = np.random.default_rng(0); X = rng.normal(size=(200, 8))
    >>> Q = np.linalg.qr(rng.normal(size=(8, 8)))[0]
    >>> m = align.fit_procrustes(X, X @ Q, center=False, normalize=False)
    >>> bool(np.allclose(m.W, Q, atol=1e-4))
    True
    """
    X, Y, frames = _prepare(X, Y, center, normalize)
    return map_from_stats(pair_stats(X, Y, frames, chunk_size=chunk_size), frames, "procrustes", center=center,
                          normalize=normalize, scale=scale)


def fit_ridge(X, Y, *, alpha: float = 1.0, fit_intercept: bool = True, center: bool = True,
              normalize: bool = True, chunk_size: int = 65536) -> LinearMap:
    """Ridge / affine map ``W = (XᵀX + αI)⁻¹ XᵀY`` (and a bias) from paired raw rows ``X`` (n, d_s) → ``Y`` (n, d_t),
    any dimensions; each side in its own frame first, as :func:`fit_procrustes`.

    Parameters
    ----------
    alpha : float >= 0
        Ridge penalty, on the framed rows' statistics (unit rows: ``XᵀX`` grows with n, so a fixed α weighs less
        the more pairs there are); 0 is least squares.
    fit_intercept : bool
        Fit a bias ``b`` (d_t,) on the pairs' means (``W`` from the centred statistics).
    center, normalize, chunk_size
        As in :func:`fit_procrustes`.
    """
    X, Y, frames = _prepare(X, Y, center, normalize)
    return map_from_stats(pair_stats(X, Y, frames, chunk_size=chunk_size), frames, "ridge", center=center,
                          normalize=normalize, alpha=alpha, fit_intercept=fit_intercept)


def fit_lowrank(X, Y, *, rank: int, alpha: float = 1.0, fit_intercept: bool = True, center: bool = True,
                normalize: bool = True, chunk_size: int = 65536) -> LinearMap:
    """Reduced-rank ridge map from paired raw rows ``X`` (n, d_s) → ``Y`` (n, d_t): the ridge ``W`` of
    :func:`fit_ridge` projected on the top ``rank`` directions of its fitted values (:func:`lowrank_from_stats`).

    Parameters
    ----------
    rank : int in [1, min(d_s, d_t)]
        Rank of ``W`` (required).
    alpha, fit_intercept
        As in :func:`fit_ridge`.
    center, normalize, chunk_size
        As in :func:`fit_procrustes`.
    """
    X, Y, frames = _prepare(X, Y, center, normalize)
    return map_from_stats(pair_stats(X, Y, frames, chunk_size=chunk_size), frames, "lowrank", center=center,
                          normalize=normalize, rank=rank, alpha=alpha, fit_intercept=fit_intercept)
