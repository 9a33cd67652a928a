"""LM-Steer style transforms in embedding space (Han et al., ACL 2024; ``ALGORITHMS.md`` §6).

A steer is a low-rank matrix :math:`W = P_1 P_2^\\top` (``P1, P2`` of shape ``(d, r)``) acting on
query rows ``q`` (shape ``(d,)``) as

.. math::  q' = (I + \\varepsilon W)^\\top q, \\qquad
           \\langle q', c\\rangle = q^\\top c + \\varepsilon\\, q^\\top W c ,

so retrieval scores keep the bilinear form of a language model's logits ``h E^T`` that LM-Steer
edits. ``eps = 0`` is exactly the identity, ``eps = 1`` the trained strength, negative values
reverse the attribute, and several steers compose by summing :math:`\\sum_i \\varepsilon_i W_i`.

Fitting (:func:`fit_steer`; the ``lm-steer`` method's objective and its L-BFGS fit live in
:mod:`align.steer_lm`) replaces the language model's vocabulary by a set of candidate
items ``C`` (rows of ``X``) and its contexts by queries drawn near each labelled item. For a
labelled item ``t`` with steer value ``s_t = labels[t]`` in ``{+1, -1}`` and a context ``q_t``
(one of the ``n_neighbors`` nearest context rows of ``t``), the objective is

.. math::  L(P_1, P_2) = -\\frac1B \\sum_t \\log
           \\frac{\\exp(q_t^\\top (I + s_t W) x_t / \\tau)}{\\sum_{c \\in C} \\exp(q_t^\\top (I + s_t W) c / \\tau)}
           + \\frac{\\lambda}{2} \\left(\\lVert P_1\\rVert_F^2 + \\lVert P_2\\rVert_F^2\\right)

(LM loss → softmax over candidates; weight decay λ as in LM-Steer's regulariser), minimised with
L-BFGS on the flattened factors and a hand-written gradient. Rows labelled ``0`` are neutral
contexts: they serve as queries and as distractor candidates, never as targets.

A linear query transform can only add ``eps (q.u_i) sigma_i v_i``: it steers every query the same
way when queries share a common component along ``u_i`` — true of sentence embeddings (they are
not centred; random texts have positive cosine) and of LM hidden states, but not of centred data.

Transfer (:func:`transfer_steer`) follows the paper's ``H^T W H`` form with
``H = pinv(M)^T`` for a map ``x_B = x_A M``; for an orthogonal square ``M`` this is ``M^T W M``,
i.e. map back → steer → map. The lens (:meth:`Steer.lens`) is the SVD of ``W`` with the corpus
rows at both ends of each singular direction. :class:`MeanShift` is the simple baseline
``q' = q + eps * |q| * (mean(X+) - mean(X-))``.

Artifacts are ``.npz`` with a JSON header (``allow_pickle=False``), like :class:`~align.LinearMap`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from . import linalg
from ._artifacts import ValueObject, check_header, pack_npz, read_file, save_atomic, unpack_npz
from .validation import (as_matrix, as_real_array, check_eps, check_labels, check_not_degenerate, check_random_state,
                         check_representable, check_row_scale)
from .frames import row_norms
from .options import check_batch_size, check_callable, check_number
from .steer_lm import fit_lm_steer, steer_objective  # steer_objective: re-exported
from .steer_local import fit_local, shift_line
from .steer_transfer import transfer_steer
from .exceptions import (
    DegenerateInputError,
    DimensionMismatchError,
    InputError,
    NotRepresentableError,
    PairCountError,
    SerializationError,
    ShapeError,
)

__all__ = [
    "Steer",
    "MeanShift",
    "fit_steer",
    "fit_mean_shift",
    "compose_steers",
    "apply_steers",
    "transfer_steer",
    "steer_objective",
    "STEER_FORMAT_VERSION",
    "STEER_METHODS",
    "check_steer_options",
]

STEER_FORMAT_VERSION = 1


# --------------------------------------------------------------------------------------------
# validation helpers (one place)
# --------------------------------------------------------------------------------------------
def _check_int(value, name: str, lo: int, hi: int | None = None) -> int:
    """A count in ``[lo, hi]`` (no upper bound when ``hi`` is None): :func:`~align.options.check_number`."""
    return check_number(name, value, lo, float("inf") if hi is None else hi, whole=True)


def _check_pos_float(value, name: str, *, allow_zero: bool = False, hi: float | None = None) -> float:
    """A finite number ``> 0`` (``>= 0`` with ``allow_zero``), at most ``hi``: :func:`~align.options.check_number`."""
    return check_number(name, value, 0.0, float("inf") if hi is None else hi, lo_open=not allow_zero)


def _check_prior(value):
    """``"auto"``, ``inf`` or a number >= 0 (the mean-shift prior weight of the local steer)."""
    if isinstance(value, str) and value == "auto" or isinstance(value, float) and value == float("inf"):
        return value
    return _check_pos_float(value, "prior_weight", allow_zero=True)


# --------------------------------------------------------------------------------------------
# the fitted object
# --------------------------------------------------------------------------------------------
@dataclass(eq=False, repr=False)  # == and a short repr: ValueObject's (a dataclass == raised on arrays)
class Steer(ValueObject):
    """A low-rank steer ``W = P1 P2^T`` in one embedding space.

    Parameters
    ----------
    P1, P2 : ndarray (d, r)
        Factors; ``W = P1 @ P2.T`` has shape (d, d) and rank <= r.
    metadata : dict
        JSON-serialisable facts (method, space, parameters, training loss, lineage...).
    """

    P1: np.ndarray
    P2: np.ndarray
    metadata: dict = field(default_factory=dict)

    def __post_init__(self):
        P1, P2 = np.asarray(self.P1), np.asarray(self.P2)
        if P1.ndim != 2 or P2.ndim != 2 or 0 in P1.shape or P1.shape != P2.shape:
            raise ShapeError(f"P1 and P2 must be non-empty 2-D arrays of one shape (d, r), got {P1.shape}, {P2.shape}")
        # real numbers only (a string array was a raw ValueError, a complex one lost its imaginary part), finite
        # in float32 (NonFiniteError otherwise)
        self.P1 = as_real_array(P1, name="steer factor P1", ndim=2)
        self.P2 = as_real_array(P2, name="steer factor P2", ndim=2)

    # --- shape facts ----------------------------------------------------------------------
    @property
    def dim(self) -> int:
        return int(self.P1.shape[0])

    @property
    def rank(self) -> int:
        return int(self.P1.shape[1])

    @property
    def W(self) -> np.ndarray:
        """The dense (d, d) matrix ``P1 P2^T`` (float64)."""
        return self.P1.astype(np.float64) @ self.P2.astype(np.float64).T

    # --- applying -------------------------------------------------------------------------
    def apply(self, Q, eps: float = 1.0, *, batch_size: int = 65536) -> np.ndarray:
        """Steered queries ``Q (I + eps W)`` (rows), i.e. ``q' = (I + eps W)^T q``.

        Parameters
        ----------
        Q : array-like (n, d)
        eps : float
            Steer strength; 0 returns ``Q`` as float32 (bit for bit for float32 input), 1 the trained strength,
            negative values reverse the attribute.

        Returns
        -------
        ndarray (n, d) float32; not renormalised (the scale of a query does not change its ranking).
        """
        Q = as_matrix(Q, name="Q", dim=self.dim)
        eps = check_eps(eps)
        return self._apply(Q, eps, batch_size=check_batch_size(batch_size))

    def _apply(self, Q: np.ndarray, eps: float, *, batch_size: int = 65536) -> np.ndarray:
        out = Q.copy()
        if eps == 0.0:
            return out
        for s in range(0, Q.shape[0], batch_size):
            part = Q[s : s + batch_size]
            with np.errstate(over="ignore", invalid="ignore"):
                out[s : s + batch_size] += (eps * ((part @ self.P1) @ self.P2.T)).astype(np.float32)
        return check_representable(out, "steered queries")

    __call__ = apply

    def bilinear(self, Q, C) -> np.ndarray:
        """The steer term ``q^T W c`` for every pair: (n, m). Only for small ``n x m``."""
        Q = as_matrix(Q, name="Q", dim=self.dim)
        C = as_matrix(C, name="C", dim=self.dim)
        return (Q.astype(np.float64) @ self.P1) @ (C.astype(np.float64) @ self.P2).T

    def scaled(self, eps: float) -> "Steer":
        """The steer ``eps W`` as a new object (``apply(Q, 1)`` then equals ``apply(Q, eps)``)."""
        eps = check_eps(eps)
        with np.errstate(over="ignore", invalid="ignore"):  # past float32 it blamed the stored steer ("P1 has NaN")
            P1 = check_representable((self.P1.astype(np.float64) * eps).astype(np.float32), f"P1 scaled by {eps:g}")
        return Steer(P1, self.P2.copy(), {**self.metadata, "scaled_by": eps})

    def transfer(self, linear_map, **kw) -> "Steer":
        """Shortcut for :func:`transfer_steer`."""
        return transfer_steer(self, linear_map, **kw)

    # --- lens -----------------------------------------------------------------------------
    def svd(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Thin SVD of ``W`` from the factors: ``U (d, r)``, ``sigma (r,)``, ``V (d, r)``.

        ``W = U diag(sigma) V^T``; computed via QR of both factors (never a d x d SVD). Each pair
        ``(u_i, v_i)`` is flipped together (``W`` unchanged) so that ``v_i``'s largest-``|.|`` coordinate is > 0.
        """
        Q1, R1 = linalg.qr(self.P1.astype(np.float64))
        Q2, R2 = linalg.qr(self.P2.astype(np.float64))
        u, s, vt = linalg.svd(R1 @ R2.T)
        U, V = Q1 @ u, Q2 @ vt.T
        sign = np.sign(V[np.abs(V).argmax(axis=0), np.arange(V.shape[1])])  # a unit column's largest entry is != 0
        return U * sign, s, V * sign

    def top(self, r: int) -> "Steer":
        """The best rank-``r`` steer: ``W_r = sum_{i<r} sigma_i u_i v_i^T`` (Eckart-Young:
        ``|W - W_r|_2 = sigma_r``), e.g. only the lens's first, attribute direction of an LM steer."""
        r = _check_int(r, "r", 1, self.rank)
        U, s, V = self.svd()
        return Steer(U[:, :r] * s[:r], V[:, :r], {**self.metadata, "kept_rank": r})

    def lens(self, X, texts: Sequence[str] | None = None, *, k: int = 5, n_directions: int | None = None,
             side: str = "output", queries=None) -> list[dict]:
        """Singular directions of ``W`` with the corpus rows at each extreme.

        For direction ``i`` (``W = sum_i sigma_i u_i v_i^T``) a query's score against a row ``c``
        moves by ``eps sigma_i (q.u_i)(v_i.c)``: ``side="output"`` ranks rows ``c`` of ``X`` by
        ``c.v_i`` (what the direction promotes for queries on the ``+u_i`` side and demotes on the
        ``-u_i`` side); ``side="input"`` ranks them by ``c.u_i`` (which queries trigger it).
        The sign of ``(u_i, v_i)`` is free; with ``queries`` each pair is signed so that their mean
        gate ``mean(Q u_i) >= 0``, so ``positive`` lists what ``eps > 0`` promotes for those queries
        (for an embedding steer, whose queries live among the corpus rows, pass ``queries=X``);
        without, the :meth:`svd` convention holds (``v_i``'s largest-``|.|`` coordinate > 0): deterministic, but
        which end is ``positive`` then says nothing about what ``eps > 0`` promotes.

        Parameters
        ----------
        X : array-like (n, d)
            Corpus rows.
        texts : sequence of str, optional
            ``texts[i]`` describes row i; included in the output when given.
        k : int
            Rows reported at each extreme.
        n_directions : int, optional
            Directions reported (largest singular values first); default all ``r``.
        queries : array-like (m, d), optional
            Typical queries, which orient each direction (see above).

        Returns
        -------
        list of dict ``{"direction", "sigma", "positive": [...], "negative": [...]}``; each item
        ``{"index", "score"[, "text"]}``, most extreme first.
        """
        X = as_matrix(X, name="X", dim=self.dim)
        if texts is not None and len(texts) != X.shape[0]:
            raise PairCountError(f"texts has {len(texts)} entries but X has {X.shape[0]} rows")
        if side not in ("output", "input"):
            raise InputError(f"side must be 'output' or 'input', got {side!r}")
        k = _check_int(k, "k", 1)
        nd = self.rank if n_directions is None else _check_int(n_directions, "n_directions", 1, self.rank)
        U, s, V = self.svd()
        if queries is not None:
            gate = as_matrix(queries, name="queries", dim=self.dim).mean(axis=0, dtype=np.float64) @ U
            flip = np.where(gate < 0, -1.0, 1.0)
            U, V = U * flip, V * flip
        D = (V if side == "output" else U)[:, :nd].astype(np.float32)
        return _extremes(X @ D, s[:nd], texts, k)  # (n, nd): one column per direction, never n x n

    # --- (de)serialisation ----------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """Serialise to ``.npz`` bytes (arrays + JSON header; no pickle)."""
        return pack_npz({"P1": self.P1, "P2": self.P2},
                       {"format": "vecbridge.Steer", "format_version": STEER_FORMAT_VERSION,
                        "metadata": self.metadata})

    @classmethod
    def from_bytes(cls, data: bytes) -> "Steer":
        arrays, header = _from_npz(data, "vecbridge.Steer")
        try:
            return cls(arrays["P1"], arrays["P2"], header.get("metadata", {}))
        except KeyError as exc:
            raise SerializationError(f"steer artifact is missing {exc}") from None

    def save(self, path) -> Path:
        return save_atomic(path, self.to_bytes())

    @classmethod
    def load(cls, path) -> "Steer":
        return read_file(path, cls.from_bytes)


def _extremes(proj: np.ndarray, sigma, texts: Sequence[str] | None, k: int) -> list[dict]:
    """Per column ``i`` of ``proj`` (n, r), the ``k`` rows scoring highest (``positive``) and lowest (``negative``),
    most extreme first, as ``{"direction": i, "sigma": sigma[i], "positive": [{"index", "score"[, "text"]}],
    "negative": [...]}``."""
    k = min(k, proj.shape[0])
    out = []
    for i in range(proj.shape[1]):
        col = proj[:, i]
        order = np.argsort(-col, kind="stable")
        entry = {"direction": i, "sigma": float(sigma[i])}
        for name, idx in (("positive", order[:k]), ("negative", order[::-1][:k])):
            entry[name] = [{"index": int(j), "score": float(col[j]),
                            **({"text": texts[j]} if texts is not None else {})} for j in idx]
        out.append(entry)
    return out


@dataclass(eq=False, repr=False)  # as Steer
class MeanShift(ValueObject):
    """Baseline: ``q' = q + eps * |q| * v`` with ``v = mean(X[+1]) - mean(X[-1])``.

    Parameters
    ----------
    v : ndarray (d,)
    metadata : dict
    """

    v: np.ndarray
    metadata: dict = field(default_factory=dict)

    def __post_init__(self):
        v = as_real_array(self.v, name="mean-shift vector v", ndim=1)  # a (2, 3) array was read as 6-d
        if v.size == 0:
            raise InputError("mean-shift vector must be non-empty and finite")
        self.v = v

    @property
    def dim(self) -> int:
        return int(self.v.shape[0])

    def apply(self, Q, eps: float = 1.0) -> np.ndarray:
        """Shifted queries (n, d) float32; ``eps = 0`` returns ``Q`` as float32 (bit for bit for float32 input)."""
        Q = as_matrix(Q, name="Q", dim=self.dim)
        eps = check_eps(eps)
        if eps == 0.0:
            return Q.copy()
        norms = row_norms(Q)[:, None]
        with np.errstate(over="ignore", invalid="ignore"):
            out = (Q + eps * norms * self.v).astype(np.float32)
        return check_representable(out, "shifted queries")

    __call__ = apply

    def lens(self, X, texts: Sequence[str] | None = None, *, k: int = 5) -> list[dict]:
        """:meth:`Steer.lens` of the one direction a mean shift has: rows ``c`` of ``X`` (n, d) ranked by
        ``c.v / |v|``, ``positive`` the end that ``eps > 0`` moves queries toward (sigma ``|v|``)."""
        X = as_matrix(X, name="X", dim=self.dim)
        if texts is not None and len(texts) != X.shape[0]:
            raise PairCountError(f"texts has {len(texts)} entries but X has {X.shape[0]} rows")
        norm = float(np.linalg.norm(self.v))
        if norm == 0.0:
            return []
        return _extremes(X @ (self.v / norm).astype(np.float32)[:, None], [norm], texts, _check_int(k, "k", 1))

    def to_bytes(self) -> bytes:
        return pack_npz({"v": self.v}, {"format": "vecbridge.MeanShift", "format_version": STEER_FORMAT_VERSION,
                                       "metadata": self.metadata})

    @classmethod
    def from_bytes(cls, data: bytes) -> "MeanShift":
        arrays, header = _from_npz(data, "vecbridge.MeanShift")
        if "v" not in arrays:
            raise SerializationError("mean-shift artifact is missing 'v'")
        return cls(arrays["v"], header.get("metadata", {}))


# --------------------------------------------------------------------------------------------
# algebra
# --------------------------------------------------------------------------------------------
def compose_steers(steers: Iterable[tuple[Steer, float]]) -> Steer:
    """One steer equal to ``sum_i eps_i W_i`` (exact: the factors are stacked, rank ``sum r_i``).

    Parameters
    ----------
    steers : iterable of (Steer, eps) pairs

    Returns
    -------
    Steer whose ``apply(Q, 1)`` equals ``Q + sum_i eps_i Q W_i``.
    """
    pairs, eps = _steer_pairs(steers)
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = [s.P1 * e for (s, _), e in zip(pairs, eps)]
    for i, (P, e) in enumerate(zip(scaled, eps)):
        if not np.isfinite(P).all():  # an eps of 1e300 was "steer factor P1 contains NaN or Inf": the steer is fine
            raise NotRepresentableError(f"eps {e:g} times steer {i}'s factors overflows float32 (values beyond "
                                        f"±3.4e38); use a smaller eps")
    P1 = np.concatenate(scaled, axis=1)
    P2 = np.concatenate([s.P2 for s, _ in pairs], axis=1)
    meta = {"method": "compose", "parts": [{"eps": e, "metadata": s.metadata} for (s, _), e in zip(pairs, eps)]}
    return Steer(P1, P2, meta)


def _steer_pairs(steers) -> tuple[list, list[float]]:
    """``(pairs, eps)`` of a non-empty list of ``(Steer, eps)`` pairs of one dimension (typed errors)."""
    pairs = list(steers)
    if not pairs or not all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], Steer) for p in pairs):
        raise InputError("compose_steers needs a non-empty list of (Steer, eps) pairs")
    dims = {s.dim for s, _ in pairs}
    if len(dims) != 1:
        raise DimensionMismatchError(f"steers live in spaces of different dimension: {sorted(dims)}")
    return pairs, [check_eps(e) for _, e in pairs]


def apply_steers(Q, steers: Iterable[tuple[Steer, float]], *, batch_size: int = 65536) -> np.ndarray:
    """``Q (I + sum_i eps_i W_i)``: several steers at once (n, d) float32; as :meth:`Steer.apply` for one steer.

    Computed as ``Q + sum_i eps_i (Q P1_i) P2_i^T``, never through ``eps_i P1_i``: a large ``eps`` overflowed those
    factors (a NonFiniteError blaming the stored steer) where the steered queries were representable, as
    ``Steer.apply`` gives them; queries that overflow float32 are a NotRepresentableError.
    """
    batch_size = check_batch_size(batch_size)
    pairs = list(steers)
    if not pairs:
        return as_matrix(Q, name="Q").copy()
    pairs, eps = _steer_pairs(pairs)
    Q = as_matrix(Q, name="Q", dim=pairs[0][0].dim)
    live = [(s, e) for (s, _), e in zip(pairs, eps) if e != 0.0]
    out = Q.copy()
    for start in range(0, Q.shape[0], batch_size) if live else ():
        part = Q[start : start + batch_size]
        with np.errstate(over="ignore", invalid="ignore"):
            delta = sum(e * ((part @ s.P1) @ s.P2.T) for s, e in live)
            out[start : start + batch_size] += delta.astype(np.float32)
    return check_representable(out, "steered queries")


# --------------------------------------------------------------------------------------------
# fitting
# --------------------------------------------------------------------------------------------
STEER_METHODS = ("local", "lm-steer")


def check_steer_options(*, rank=16, method="local", temperature=0.05, weight_decay=1e-3, max_iter=200,
                        max_pairs=2048, n_candidates=4096, n_neighbors=None, init_scale=1e-2, n_queries=4000,
                        ridge=0.1, opposite_weight=0.0, prior_weight="auto", n_folds=2, dim=None) -> dict:
    """The options of :func:`fit_steer` checked and normalised (typed errors), before any row is read: a service
    calls it when a steer fit is requested. ``dim`` (the rows' width) bounds ``lm-steer``'s rank; without it the
    bound waits for the rows. ``n_neighbors`` None becomes the method's default (50 local, 10 lm-steer)."""
    if method not in STEER_METHODS:
        raise InputError(f"unknown steer method {method!r}; use one of {list(STEER_METHODS)}")
    local = method == "local"
    return {"rank": _check_int(rank, "rank", 1, dim if method == "lm-steer" else None),
            "temperature": _check_pos_float(temperature, "temperature"),
            "weight_decay": _check_pos_float(weight_decay, "weight_decay", allow_zero=True),
            "max_iter": _check_int(max_iter, "max_iter", 1), "max_pairs": _check_int(max_pairs, "max_pairs", 2),
            "n_candidates": _check_int(n_candidates, "n_candidates", 2),
            "init_scale": _check_pos_float(init_scale, "init_scale", hi=10.0),  # 1e308 overflowed the first step
            "n_neighbors": _check_int((50 if local else 10) if n_neighbors is None else n_neighbors, "n_neighbors",
                                      2 if local else 1),
            "n_queries": _check_int(n_queries, "n_queries", 1),
            "ridge": _check_pos_float(ridge, "ridge", allow_zero=True),
            "opposite_weight": _check_pos_float(opposite_weight, "opposite_weight", allow_zero=True, hi=100.0),
            "prior_weight": _check_prior(prior_weight), "n_folds": _check_int(n_folds, "n_folds", 0)}


def fit_steer(X, labels, *, rank: int = 16, method: str = "local", temperature: float = 0.05,
              weight_decay: float = 1e-3, max_iter: int = 200, max_pairs: int = 2048, n_candidates: int = 4096,
              n_neighbors: int | None = None, init_scale: float = 1e-2, tol: float = 1e-6, n_queries: int = 4000,
              ridge: float = 0.1, opposite_weight: float = 0.0, prior_weight="auto", n_folds: int = 2,
              random_state=None,
              callback: Callable[[int, float], None] | None = None) -> Steer:
    """Fit an LM-Steer style query transform ``W = P1 P2^T`` from labelled rows.

    ``method="local"`` (default) is the closed-form local discriminant of
    :mod:`align.steer_local`: a rank-1 ``W = u b^T`` whose item-side direction ``b`` separates
    attribute rows from the other rows *inside each training query's neighbourhood*, shrunk toward
    the mean-shift line by a weight chosen on held-out rows, scaled so that ``eps = 1`` keeps about
    half of a query's top-10 (``rank`` is an upper bound, unused). It is at or above the mean-shift
    baseline on the precision / relevance-kept trade-off (``benchmarks/results/steer_pareto_*.md``). ``method="lm-steer"`` is the contrastive
    softmax objective of the module docstring (rank ``r``, L-BFGS).

    Parameters
    ----------
    X : array-like (n, d)
        Item embeddings (typically unit rows).
    labels : array-like (n,)
        ``+1`` wanted attribute, ``-1`` opposite, ``0`` neutral context.
    rank : int
        ``r``, the rank of ``W = P1 P2^T`` (``lm-steer``; ``local`` is rank 1).
    method : {"local", "lm-steer"}
    n_queries, ridge, opposite_weight, prior_weight, n_folds : ``local`` only
        Training queries drawn from ``X``; ridge ``lambda`` relative to the mean eigenvalue of the
        local scatter; target of ``-1`` rows (0: they count as any non-attribute row); weight ``t``
        of the mean-shift prior (``"auto"``: by ``n_folds``-fold cross-validation of the local loss;
        ``0`` pure local; ``float("inf")`` the mean-shift line).
    temperature : float
        Softmax temperature ``tau`` over candidate scores.
    weight_decay : float
        ``lambda`` on ``|P1|^2 + |P2|^2``.
    max_iter : int
        L-BFGS iterations.
    max_pairs : int
        At most ``max_pairs // 2`` positive and as many negative targets are used.
    n_candidates : int
        Size of the candidate set (all targets plus random other rows).
    n_neighbors : int, optional
        ``local``: neighbourhood size ``K`` (default 50); ``lm-steer``: each target's context is
        drawn from its ``n_neighbors`` nearest context rows (default 10).
    init_scale : float
        Standard deviation of the random initial factors.
    random_state : None, int, numpy Generator or np.random.RandomState
    callback : callable ``(iteration, loss)``, optional
        Called after every L-BFGS iteration (progress reporting).

    Returns
    -------
    Steer

    Raises
    ------
    NonFiniteError, ShapeError, PairCountError, InputError, DegenerateInputError
    """
    X = check_row_scale(as_matrix(X, name="X", min_rows=2), name="X")
    labels = check_labels(labels, X.shape[0])
    check_callable("callback", callback)
    tol = check_number("tol", tol, 0.0, float("inf"))  # "x" failed inside scipy; NaN and -1 were taken
    check_not_degenerate(X, name="X")  # all rows identical: a zero (no-op) steer came back silently
    n, d = X.shape
    o = check_steer_options(rank=rank, method=method, temperature=temperature, weight_decay=weight_decay,
                            max_iter=max_iter, max_pairs=max_pairs, n_candidates=n_candidates, n_neighbors=n_neighbors,
                            init_scale=init_scale, n_queries=n_queries, ridge=ridge, opposite_weight=opposite_weight,
                            prior_weight=prior_weight, n_folds=n_folds, dim=d)
    rng = check_random_state(random_state)
    if method == "local":
        return fit_local(X, labels, n_queries=o["n_queries"], n_neighbors=o["n_neighbors"], ridge=o["ridge"],
                         opposite_weight=o["opposite_weight"], prior_weight=o["prior_weight"], n_folds=o["n_folds"],
                         rng=rng, random_state=random_state, callback=callback)
    return fit_lm_steer(X, labels, rank=o["rank"], temperature=o["temperature"], weight_decay=o["weight_decay"],
                        max_iter=o["max_iter"], max_pairs=o["max_pairs"], n_candidates=o["n_candidates"],
                        n_neighbors=o["n_neighbors"], init_scale=o["init_scale"], tol=tol, rng=rng,
                        random_state=random_state, callback=callback)


def fit_mean_shift(X, labels) -> MeanShift:
    """Baseline steer: ``v = mean(X[labels == +1]) - mean(X[labels == -1])`` (d,)."""
    X = as_matrix(X, name="X", min_rows=2)
    labels = check_labels(labels, X.shape[0])
    v = shift_line(X, labels)  # the line the local steer's prior shrinks toward (align.steer_local)
    if not np.any(v):  # identical rows (or class means): the steer would be a no-op, returned silently before
        raise DegenerateInputError("X: the rows labelled +1 and -1 have the same mean; there is no direction to "
                                   "steer along")
    return MeanShift(v, {"method": "mean-shift", "n_pos": int((labels == 1).sum()),
                         "n_neg": int((labels == -1).sum()), "dim": int(X.shape[1])})


# --------------------------------------------------------------------------------------------
# artifact I/O (npz + JSON header, no pickle)
# --------------------------------------------------------------------------------------------
def _from_npz(data, fmt: str) -> tuple[dict, dict]:
    """Read a steer artifact of kind ``fmt`` (npz + JSON layout of :mod:`align._artifacts`; bytes or a binary file)."""
    arrays, header = unpack_npz(data, f"{fmt.rsplit('.', 1)[-1]} artifact")
    check_header(header, fmt, STEER_FORMAT_VERSION, fmt.rsplit(".", 1)[-1])
    return arrays, header
