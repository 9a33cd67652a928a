r"""Per-cluster local maps: k-means routing on the source side, one affine map per cluster, blended.

Rows live in the fitted frames of a migration (:mod:`align.migration`): framed source
``f = f_s(x)`` (unit → centre → unit, d_s) and framed target ``y`` (d_t). With ``k`` unit centroids
``c_j`` (d_s,) found by k-means on framed source rows (the pairs plus the unpaired old rows), and a
global affine map ``(W_g, b_g)`` (ridge on all pairs), each cluster gets its own map

.. math::  (W_j, b_j) = (W_g, b_g) + (\Delta W_j, \Delta b_j), \qquad
           [\Delta W_j; \Delta b_j] = (A_j^\top A_j + \lambda I)^{-1} A_j^\top R_j

where ``A_j = [F_j, 1]`` are the cluster's framed source pairs with a constant column and
``R_j = Y_j - (F_j W_g + b_g)`` the global map's residuals there: a ridge fit of the residual, so
a cluster with few pairs (``A_jᵀA_j`` small against ``λ``) stays near the global map and one with
many pairs gets its own. Applying blends the ``m`` nearest clusters by a softmax of the centroid
cosine at temperature ``τ``:

.. math::  \hat y(x) = \sum_{j \in \mathrm{top}_m(f)} w_j(f)\,(f W_j + b_j), \qquad
           w_j \propto \exp(f\cdot c_j / \tau)

then ``output="frame"`` is ``unit(ŷ)`` and ``output="raw"`` adds the target mean back
(:meth:`Frame.to_raw`), as for :class:`~align.LinearMap`. Cost per row: one routing product
``f Cᵀ`` (k d_s) plus ``m`` GEMM rows (m d_s d_t): about ``m`` times a plain GEMM (``m = 1``, hard
routing, is one). Shapes: ``centroids`` (k, d_s), ``W`` (k, d_s, d_t), ``bias`` (k, d_t).

Artifacts: ``.npz`` or ``.safetensors`` with a JSON header (``format = "vecbridge.ClusterMap"``),
never pickle; :func:`align.load_map` / :func:`align.map_from_bytes` read either kind of map.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from . import linalg
from ._artifacts import StoredMap, check_header, pack, stored_fields
from .chain import NonLinearAlgebra
from .validation import as_matrix, as_real_array, check_representable, copies_whole
from .exceptions import DimensionMismatchError, InputError, TooFewRowsError
from .frames import NORM_LO, SQ_HI, SQ_LO, Frame, tame_rows, unit_rows
from .maps import NU2_MIN, Scalars, raw_t
from .kmeans import lloyd
from .options import check_batch_size, check_number

__all__ = ["ClusterMap", "route_centroids", "ClusterResiduals", "FORMAT", "cluster_grid", "MAX_CLUSTER_MIB"]

FORMAT = "vecbridge.ClusterMap"
FORMAT_VERSION = 1
_BLOCK_ROWS = 4096
CLUSTER_COUNTS = (4, 8, 16, 32)  # tried when at least 8 training pairs per cluster (and within the byte budget)
CLUSTER_SHRINKS = (1.0, 3.0, 10.0, 30.0)  # λ of the residual ridge (absolute)
CLUSTER_BLENDS = ((3, 0.05), (1, 0.05), (3, 0.02), (3, 0.2))  # (blend, τ); the first is tried with every (k, λ)
#: MiB of ``W`` (k d_s d_t float32) a fitted cluster map may hold unless ``max_cluster_mib`` says otherwise: half the
#: service's default map cache (512 MiB), so a map of that size is kept there (its apply plan is small) rather than
#: read again at every request. 32 clusters at 3072 -> 3072 were a 1.2 GB artifact (7.7 GB RSS while fitted).
MAX_CLUSTER_MIB = 256


@dataclass(eq=False, repr=False)  # StoredMap's == and repr (align._artifacts.ValueObject)
class ClusterMap(NonLinearAlgebra, StoredMap):
    """Blended per-cluster affine maps (see the module docstring for the math).

    Parameters
    ----------
    centroids : (k, d_s) unit rows in the source frame (routing by cosine)
    W : (k, d_s, d_t) per-cluster maps; bias : (k, d_t)
    source_frame, target_frame : Frame
    blend : int, clusters blended per row (1 = hard routing); temperature : float, softmax τ
    metadata : JSON-safe facts (method, parameters, selection)
    """

    centroids: np.ndarray
    W: np.ndarray
    bias: np.ndarray
    source_frame: Frame
    target_frame: Frame
    blend: int = 2
    temperature: float = 0.05
    metadata: dict = field(default_factory=dict)

    map_kind = "cluster"  # class attribute (not a field); see align.chain.map_kind
    _repr_attrs = ("n_clusters", "blend", "temperature")

    def __post_init__(self):
        C = as_real_array(self.centroids, name="centroids (k, d_s)", ndim=2)
        W = as_real_array(self.W, name="W (k, d_s, d_t)", ndim=3)
        b = as_real_array(self.bias, name="bias (k, d_t)", ndim=2)
        k, d_s, d_t = W.shape
        if C.shape != (k, d_s) or b.shape != (k, d_t) or k < 1:
            raise DimensionMismatchError(f"centroids {C.shape}, W {W.shape} and bias {b.shape} disagree")
        if self.source_frame.dim != d_s or self.target_frame.dim != d_t:
            raise DimensionMismatchError(
                f"frames ({self.source_frame.dim}, {self.target_frame.dim}) do not match W {W.shape}")
        # NaN was a raw ValueError from int(), 2.7 was cut to 2 without a word
        blend = check_number("blend", self.blend, 1, 1 << 20, whole=True)
        temperature = check_number("temperature", self.temperature, 0.0, 1e3, lo_open=True)
        self.centroids, self.W, self.bias = C, W, b
        self.blend = int(min(blend, k))
        self.temperature = temperature

    @property
    def source_dim(self) -> int:
        return int(self.W.shape[1])

    @property
    def target_dim(self) -> int:
        return int(self.W.shape[2])

    @property
    def n_clusters(self) -> int:
        return int(self.W.shape[0])

    def planned_bytes(self) -> int:
        """Bytes of the arrays the fused apply plan (:meth:`_plan`: ``mu_s W_j`` and ``b_j`` per cluster, the routing
        products; ``W`` itself is used in place) will hold once the first apply builds it; 0 once built (they are
        then the map's own). Lets a cache count a map whole before it is applied."""
        if self.__dict__.get("_fused") is not None:
            return 0
        k, d_s, d_t = self.W.shape
        return k * 2 * d_t * 4 + d_s * (k + 1) * 4 + k * 8  # float32 E and Q, float64 mu_c

    # --- applying -------------------------------------------------------------------------
    def route(self, F: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For framed rows ``F`` (n, d_s): the ``blend`` nearest clusters (n, m) int and their weights (n, m)."""
        return self._route_scores(F @ self.centroids.T)

    def _route_scores(self, S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Top ``blend`` clusters and softmax weights from centroid cosines ``S`` (n, k)."""
        m = self.blend
        if m == 1:
            return S.argmax(axis=1)[:, None], np.ones((S.shape[0], 1), dtype=np.float32)
        top = np.argpartition(-S, m - 1, axis=1)[:, :m]
        s = np.take_along_axis(S, top, axis=1) / self.temperature
        w = np.exp(s - s.max(axis=1, keepdims=True))
        w /= w.sum(axis=1, keepdims=True)
        return top, w.astype(np.float32)

    def apply(self, X, *, output: str = "raw", batch_size: int = _BLOCK_ROWS, validate: bool = True,
              name: str = "X") -> np.ndarray:
        """Map raw source rows ``X`` (n, d_s) to (n, d_t) float32 (``output``, ``validate`` and ``name`` as in
        :meth:`LinearMap.apply`; ``validate=False`` expects a C-contiguous float32 (n, d_s) array already checked).
        Another dtype than float32 (a float16 memmap) is converted ``batch_size`` rows at a time, as there."""
        if validate and copies_whole(X):
            batch_size = check_batch_size(batch_size)
            out = self._apply_pieces(X, batch_size, output=output, batch_size=batch_size, name=name)
            if out is not None:
                return out
        if validate:
            X = as_matrix(X, name=name, dim=self.source_dim)
        batch_size = check_batch_size(batch_size)
        return self._apply(X, output=output, batch_size=batch_size)

    def _plan(self) -> dict:
        """Constants of the fused apply, computed once: ``E_j = [mu_s W_j; b_j]`` (k, 2, d_t) beside ``W`` (used in
        place), ``[mu_s, Cᵀ]`` for the input-side products and ``mu_s·c_j`` (``mu_s = 0`` without centring).

        ``mu_s W_j`` is summed in float64 a block of ``W``'s rows at a time: an ``einsum`` over
        ``W.astype(np.float64)`` and a stacked ``[W_j; mu_s W_j; b_j]`` copy held ~3 times ``W`` while it was
        built and ~2 times ``W`` for good (a 1.2 GB 3072-d map of 32 clusters: 5.8 GB at its first transform).

        Built from one read of the arrays and frames, which the plan holds (the apply reads them there), and kept
        only while they are still the map's (:meth:`StoredMap._keep_plan`, as :meth:`LinearMap._plan`)."""
        plan = self.__dict__.get("_fused")
        if plan is None:
            W, bias, C, fs, ft = self.W, self.bias, self.centroids, self.source_frame, self.target_frame
            k, d_s, d_t = W.shape
            mu = fs.mean.astype(np.float64) if fs.mean is not None else np.zeros(d_s)
            E = np.empty((k, 2, d_t), dtype=np.float32)
            step = max(1, (1 << 20) // d_t)  # rows of one cluster's W per float64 block (8 MiB)
            for j in range(k):
                acc = np.zeros(d_t)
                for a in range(0, d_s, step):
                    acc += mu[a : a + step] @ W[j, a : a + step].astype(np.float64)
                E[j, 0] = acc
            E[:, 1] = bias
            plan = {"folded": bool(fs.unit_in and fs.unit_out and fs.mean is not None), "E": E,
                    "W": W, "centroids": C, "fs": fs, "ft": ft,
                    "Q": np.ascontiguousarray(np.concatenate([mu[:, None], C.T.astype(np.float64)], 1),
                                              dtype=np.float32),
                    "mu_sq": float(mu @ mu), "mu_c": C.astype(np.float64) @ mu,
                    "mut_sq": float(ft.mean.astype(np.float64) @ ft.mean) if ft.mean is not None else 0.0}
            plan = self._keep_plan(plan, W=W, bias=bias, centroids=C, source_frame=fs, target_frame=ft)
        return plan

    def _apply(self, X: np.ndarray, *, output: str = "frame", batch_size: int = _BLOCK_ROWS) -> np.ndarray:
        """Apply on validated rows: route, one GEMM per cluster on its (row, slot) entries, blend, output frame.

        The standard source frame ``f = (x/|x| - mu_s)/s(x)``, ``s(x) = sqrt(1 - 2 x·mu_s/|x| + |mu_s|²)``,
        is folded in: ``f·c_j = (x·c_j/|x| - mu_s·c_j)/s`` (routing from one thin product on the raw
        rows) and ``f W_j + b_j = (x/(|x| s)) W_j + [-1/s, 1] E_j`` (``E_j = [mu_s W_j; b_j]``). Per block the
        ``n m`` (row, cluster) entries are sorted by cluster, their rows gathered once into ``r x`` and
        ``[-1/s, 1]``, each cluster's slice multiplied by its ``W_j`` in place (one GEMM per cluster) plus its
        ``E_j``, and the weighted results summed back per row. Other source frames are applied to a copy first."""
        if output not in ("frame", "raw", "linear"):
            raise InputError(f"output must be 'frame', 'raw' or 'linear', got {output!r}")
        p = self._plan()  # one plan for the whole call: arrays assigned meanwhile never mix into it
        d_t = p["W"].shape[2]
        out = np.empty((X.shape[0], d_t), dtype=np.float32)
        if X.shape[0] == 1 and self._apply_row(p, X[0], out, output):
            return check_representable(out, "transform")
        step = max(1, int(batch_size))
        for s in range(0, X.shape[0], step):
            if p["folded"]:
                x = tame_rows(X[s : s + step])
                n1 = np.maximum(np.sqrt(np.einsum("ij,ij->i", x, x).astype(np.float64)), NORM_LO)  # zero rows only
                K = (x @ p["Q"]).astype(np.float64)  # x·mu_s, x·c_j
                sc = np.sqrt(np.maximum(1.0 - 2.0 * K[:, 0] / n1 + p["mu_sq"], 1e-24))
                top, w = self._route_scores((K[:, 1:] / n1[:, None] - p["mu_c"]) / sc[:, None])
                r, shift = 1.0 / (n1 * sc), -1.0 / sc
            else:
                x = p["fs"].apply(X[s : s + step], validate=False)
                top, w = self._route_scores(x @ p["centroids"].T)
                r, shift = np.ones(x.shape[0]), np.zeros(x.shape[0])
            n, m = top.shape
            lab = top.reshape(-1)
            order = np.argsort(lab, kind="stable")
            bounds = np.searchsorted(lab[order], np.arange(p["W"].shape[0] + 1))
            rows = order // m
            G = np.take(x, rows, axis=0)
            G *= r[rows].astype(np.float32)[:, None]
            H = np.empty((n * m, 2), dtype=np.float32)
            H[:, 0] = shift[rows]
            H[:, 1] = 1.0
            P = np.empty((n * m, d_t), dtype=np.float32)
            for j in range(p["W"].shape[0]):
                a, b = bounds[j], bounds[j + 1]
                if b > a:
                    np.matmul(G[a:b], p["W"][j], out=P[a:b])
                    P[a:b] += H[a:b] @ p["E"][j]
            if m > 1:
                P *= w.reshape(-1)[order][:, None]
            Y = np.empty_like(P)
            Y[order] = P
            if m > 1:
                Y = Y.reshape(n, m, d_t).sum(axis=1)
            self._finish(p, Y, out[s : s + step], output)
        return check_representable(out, "transform")

    def _apply_row(self, p: dict, x: np.ndarray, y: np.ndarray, output: str) -> bool:
        """:meth:`_apply` for one row ``x`` (d_s,) into ``y`` (1, d_t): the same route, blend and output
        with the factors as Python floats and one GEMV per blended cluster (a batch of one spent
        ~0.3 ms in ~50 numpy calls on tiny arrays). False (the block form then does it) for other
        source frames, a norm outside the safe range or NaN/Inf."""
        sq = float(np.vdot(x, x))
        if not (p["folded"] and SQ_LO < sq < SQ_HI):
            return False
        n1 = math.sqrt(sq)
        K = (x @ p["Q"]).astype(np.float64)  # x·mu_s, x·c_j
        sc = math.sqrt(max(1.0 - 2.0 * float(K[0]) / n1 + p["mu_sq"], 1e-24))
        S = (K[1:] / n1 - p["mu_c"]) / sc  # f·c_j
        m = self.blend
        top = [int(S.argmax())] if m == 1 else [int(j) for j in np.argpartition(-S, m - 1)[:m]]
        top_s = [float(S[j]) for j in top]
        e = [math.exp((v - max(top_s)) / self.temperature) for v in top_s]  # softmax weights, as _route_scores
        xa = x * np.float32(1.0 / (n1 * sc))  # r x and [-1/s, 1], as the block form's rows of G and H
        h = np.array([-1.0 / sc, 1.0], dtype=np.float32)
        W, E = p["W"], p["E"]
        Y = xa @ W[top[0]]
        Y += h @ E[top[0]]
        if m > 1:
            total = sum(e)
            Y *= np.float32(e[0] / total)
            for j, ej in zip(top[1:], e[1:]):
                Yj = xa @ W[j]
                Yj += h @ E[j]
                Y += Yj * np.float32(ej / total)
        return self._finish_row(p, Y, y, output)

    @staticmethod
    def _finish_row(p: dict, Y: np.ndarray, dest: np.ndarray, output: str) -> bool:
        """:meth:`_finish` for one row ``Y`` (d_t,) into ``dest`` (1, d_t); False leaves it to :meth:`_finish`."""
        ft = p["ft"]
        if output == "linear" or (output == "frame" and not ft.unit_out):
            dest[0] = Y
            return True
        nu2 = float(np.vdot(Y, Y))
        if not SQ_LO < nu2 < math.inf:  # squares past float32's range, or a zero row: _finish decides
            return False
        nu = math.sqrt(nu2)
        if output == "frame":
            np.multiply(Y, np.float32(1.0 / nu), out=dest[0])
        elif ft.unit_in and ft.unit_out and ft.mean is not None:
            t = raw_t(float(Y @ ft.mean) / nu, p["mut_sq"], Scalars)
            np.multiply(Y, np.float32(t / nu), out=dest[0])
            dest += ft.mean
        else:
            return False
        return True

    @staticmethod
    def _finish(p: dict, Y: np.ndarray, dest: np.ndarray, output: str) -> None:
        """Write ``Y`` (the blended ``f W + b``) into ``dest`` as ``output``: ``raw`` in closed form for the
        standard target frame (``mu_t + t y/|y|``, :meth:`Frame.to_raw`), else through the frame."""
        ft = p["ft"]
        if output == "linear" or (output == "frame" and not ft.unit_out):
            dest[...] = Y
            return
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            sq = np.einsum("ij,ij->i", Y, Y).astype(np.float64)
        if not (np.isfinite(sq.sum()) and sq.min() > SQ_LO):  # squares past float32's range (rows ~1e19 or ~1e-16)
            sq = np.einsum("ij,ij->i", Y, Y, dtype=np.float64)  # Inf/NaN left in Y fail check_representable
        nu = np.sqrt(np.maximum(sq, NU2_MIN))
        if output == "frame":
            np.multiply(Y, (1.0 / nu).astype(np.float32)[:, None], out=dest)
        elif ft.unit_in and ft.unit_out and ft.mean is not None:
            mf = (Y @ ft.mean).astype(np.float64) / nu
            t = raw_t(mf, p["mut_sq"])
            np.multiply(Y, (t / nu).astype(np.float32)[:, None], out=dest)
            dest += ft.mean
        else:
            dest[...] = ft.to_raw(Y)

    __call__ = apply

    # --- (de)serialisation ----------------------------------------------------------------
    def to_bytes(self, format: str = "npz") -> bytes:
        """``"npz"`` or ``"safetensors"`` bytes: arrays plus a JSON header (no pickle)."""
        arrays = {"centroids": self.centroids, "W": self.W, "bias": self.bias}
        for side, fr in (("source", self.source_frame), ("target", self.target_frame)):
            if fr.mean is not None:
                arrays[f"{side}_mean"] = fr.mean
        header = {"format": FORMAT, "format_version": FORMAT_VERSION, "blend": self.blend,
                  "temperature": self.temperature, "source_frame": self.source_frame.to_meta(),
                  "target_frame": self.target_frame.to_meta(), "metadata": self.metadata}
        return pack(arrays, header, format)

    @classmethod
    def from_artifact(cls, arrays: dict, header: dict) -> "ClusterMap":
        """The map of an unpacked artifact's ``arrays`` and ``header`` (as :meth:`LinearMap.from_artifact`)."""
        check_header(header, FORMAT, FORMAT_VERSION, "ClusterMap")
        with stored_fields("ClusterMap"):
            return cls(centroids=arrays["centroids"], W=arrays["W"], bias=arrays["bias"],
                       source_frame=Frame.from_meta(header["source_frame"], arrays.get("source_mean")),
                       target_frame=Frame.from_meta(header["target_frame"], arrays.get("target_mean")),
                       blend=check_number("blend", header["blend"], 1, 1 << 20, whole=True),
                       temperature=float(header["temperature"]),
                       metadata=header.get("metadata", {}))


def route_centroids(F: np.ndarray, k: int, rng: np.random.Generator, *, n_iter: int = 15,
                    sample: int = 8192) -> np.ndarray:
    """``k`` unit centroids (k, d) of framed rows ``F`` (n, d): k-means++ seeding then Lloyd, on at most ``sample`` rows.

    Same ``rng`` state → same centroids. TooFewRowsError when ``k`` exceeds the rows.
    """
    from .coverage import d2_sample

    if k < 1 or k > F.shape[0]:
        raise TooFewRowsError(f"{k} clusters need at least {k} rows, got {F.shape[0]}")
    Z = F if F.shape[0] <= sample else F[np.sort(rng.permutation(F.shape[0])[:sample])]
    init = Z[d2_sample(Z, k, rng)]
    C, _, _ = lloyd([Z], init, n_iter=n_iter)
    return unit_rows(C)


def _thin_svd_parts(A: np.ndarray, R: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(V, s, Uᵀ R)`` of the thin SVD ``A = U diag(s) Vᵀ`` (n, p), from the eigen-decomposition of the
    smaller Gram matrix (``A Aᵀ`` when n ≤ p, else ``Aᵀ A``); directions with ``s² ≤ 1e-10 max s²`` are dropped."""
    if A.shape[0] <= A.shape[1]:
        e, U = linalg.eigh(A @ A.T)
        keep = e > 1e-10 * max(float(e.max()), 1e-300)
        sv, U = np.sqrt(e[keep]), U[:, keep]
        return (A.T @ U) / sv, sv, U.T @ R
    e, V = linalg.eigh(A.T @ A)
    keep = e > 1e-10 * max(float(e.max()), 1e-300)
    sv, V = np.sqrt(e[keep]), V[:, keep]
    return V, sv, (V.T @ (A.T @ R)) / sv[:, None]


class ClusterResiduals:
    """Per-cluster thin SVDs of the residual fit, so every ``λ`` costs one small product per cluster.

    ``F`` (n, d_s) framed source pairs, ``Y`` (n, d_t) framed target pairs, ``labels`` (n,) nearest
    centroid, global map ``(W_g, b_g)``. With ``A_j = [F_j, 1] = U S Vᵀ`` (thin, rank ``r ≤ n_j``)
    the residual ridge is ``V diag(s / (s² + λ)) Uᵀ R_j``: kept are ``V`` and ``Uᵀ R_j``, so a
    cluster with ``n_j`` pairs costs ``O(n_j d)`` per ``λ``-solve rather than a (d_s + 1)² system.
    """

    def __init__(self, F: np.ndarray, Y: np.ndarray, labels: np.ndarray, k: int, W_g: np.ndarray, b_g: np.ndarray):
        self.W_g, self.b_g = np.asarray(W_g, np.float64), np.asarray(b_g, np.float64)
        self.k = int(k)
        F64 = np.asarray(F, np.float64)
        R = np.asarray(Y, np.float64) - (F64 @ self.W_g + self.b_g)
        A = np.concatenate([F64, np.ones((F64.shape[0], 1))], axis=1)
        self.counts = np.bincount(labels, minlength=k)
        order = np.argsort(labels, kind="stable")
        bounds = np.searchsorted(labels[order], np.arange(k + 1))
        self.parts = []
        for j in range(k):
            rows = order[bounds[j] : bounds[j + 1]]
            if rows.size == 0:
                self.parts.append(None)
                continue
            self.parts.append(_thin_svd_parts(A[rows], R[rows]))

    def solve(self, lam: float) -> tuple[np.ndarray, np.ndarray]:
        """``(W (k, d_s, d_t), bias (k, d_t))`` float32 for shrinkage ``λ`` (> 0) toward the global map."""
        if not lam > 0:
            raise InputError(f"shrinkage must be > 0, got {lam}")
        d_s, d_t = self.W_g.shape
        W = np.empty((self.k, d_s, d_t), np.float32)
        b = np.empty((self.k, d_t), np.float32)
        for j, part in enumerate(self.parts):
            W[j], b[j] = self.W_g, self.b_g
            if part is not None:
                V, sv, UtR = part
                T = V @ ((sv / (sv * sv + lam))[:, None] * UtR)
                W[j] += T[:-1]
                b[j] += T[-1]
        return W, b


def cluster_grid(opts: dict, n_fit: int, *, dims: tuple[int, int] | None = None, strict: bool = False,
                 required: bool = True) -> tuple[tuple, tuple, tuple, dict]:
    """(cluster counts, shrinkages λ, (blend, τ) pairs, budget note) to try; an option given fixes its axis.

    ``strict``: more clusters than ``n_fit`` pairs is an error (else the count is capped, e.g. on the training
    split). ``dims`` (d_s, d_t): no count whose ``W`` (``k d_s d_t`` float32 bytes) is over ``max_cluster_mib``
    (:data:`MAX_CLUSTER_MIB`): a given ``n_clusters`` over it is an InputError naming the size and the option;
    the default counts over it are left out (the largest count within it, at least 2, when none is), and the
    note says so (``{}`` when nothing was left out). No count of at least 2 within it: an InputError when
    ``required`` (a cluster fit asked for), else no counts (``auto`` goes on without the family)."""
    budget = opts.get("max_cluster_mib", MAX_CLUSTER_MIB)
    per = 4 * dims[0] * dims[1] if dims is not None else 0
    k_max = int(budget * (1 << 20) // per) if per else None
    note: dict = {}
    if "n_clusters" in opts:
        k = opts["n_clusters"]
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise InputError(f"n_clusters must be an integer >= 1, got {k!r}")
        if strict and k > n_fit:
            raise TooFewRowsError(f"n_clusters={k} needs at least {k} pairs, got {n_fit}")
        if k_max is not None and k > k_max:
            raise InputError(f"n_clusters={k} at {dims[0]} -> {dims[1]} makes a {_mib(k * per)} MiB map (k x d_s x "
                             f"d_t float32), over the cluster map budget of {budget:g} MiB: give n_clusters <= "
                             f"{k_max} or raise max_cluster_mib")
        counts = (int(min(k, n_fit)),)
    else:
        counts = tuple(k for k in CLUSTER_COUNTS if 8 * k <= n_fit) or (min(2, n_fit),)
        if k_max is not None and max(counts) > k_max:
            kept = tuple(k for k in counts if k <= k_max) or ((k_max,) if k_max >= 2 else ())
            note = {"max_cluster_mib": budget, "max_clusters": k_max, "left_out": [k for k in counts if k > k_max]}
            if not kept and required:
                raise InputError(f"2 clusters at {dims[0]} -> {dims[1]} make a {_mib(2 * per)} MiB map "
                                 f"(k x d_s x d_t float32), over the cluster map budget of {budget:g} MiB: raise "
                                 "max_cluster_mib, or fit a linear family")
            counts = kept
    shrinks = (float(opts["shrink"]),) if "shrink" in opts else CLUSTER_SHRINKS
    if "blend" in opts or "cluster_temperature" in opts:
        blends = ((int(opts.get("blend", 3)), float(opts.get("cluster_temperature", 0.05))),)
    else:
        blends = CLUSTER_BLENDS
    return counts, shrinks, blends, note


def _mib(n_bytes: int) -> str:
    mib = n_bytes / (1 << 20)
    return f"{mib:,.0f}" if mib >= 10 else f"{mib:.3g}"
