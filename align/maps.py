"""LinearMap: a fitted map between two embedding spaces, with its frames.

For raw source rows ``X`` (n, d_s) the map computes

.. math::  \\hat Y = f_s(X)\\, W + b

with ``f_s`` the source :class:`~align.frames.Frame`, ``W`` of shape (d_s, d_t) and optional bias
``b`` (d_t,). The result lives in the target frame ``f_t`` (centred, unit space), which is where
evaluation happens; ``apply(X, output="raw")`` adds the target mean back and renormalises, for
searching an index of raw target vectors.

Artifacts are ``.npz`` (arrays + a JSON header stored as bytes, loaded with ``allow_pickle=False``)
or ``.safetensors`` (arrays + the JSON header in its string metadata). Never pickle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from . import linalg
from ._artifacts import StoredMap, check_header, pack, read_file, stored_fields, unpack
from .validation import as_matrix, as_real_array, check_representable, copies_whole
from .exceptions import DimensionMismatchError, InputError, NotRepresentableError
from .frames import NORM_LO, SQ_HI, SQ_LO, Frame, tame_rows
from .options import check_batch_size

__all__ = ["LinearMap", "FORMAT_VERSION", "map_from_bytes", "load_map", "NU2_MIN", "raw_t", "Scalars"]

FORMAT_VERSION = 1
_BLOCK_ROWS = 1024  # rows per fused block: output block (1024 x d_t float32) stays in L2/L3
NU2_MIN = 1e-60  # floor of an output's squared norm (zero rows only): its 1/|u| stays finite in float32
#: an output row whose values are bounded below this (Cauchy-Schwarz on the GEMM's two sides) cannot have overflowed:
#: float32 holds up to 3.4e38, and the GEMM's rounding moves a bound by a factor ~(1 + d eps), far below 30
_OUT_BOUND = 1e37


def raw_t(mf, mu_sq: float, xp=np):
    """``t > 0`` with ``|mu + t f| = 1`` for unit ``f`` and ``mf = mu·f``: ``sqrt(mf^2 + 1 - |mu|^2) - mf``."""
    return xp.maximum(xp.sqrt(xp.maximum(mf * mf + 1.0 - mu_sq, 0.0)) - mf, 1e-12)


def _orthonormal(W: np.ndarray, atol: float, diag_atol: float | None = None) -> bool:
    """Whether the rows of ``W`` (float64) are orthonormal: ``|W Wᵀ - I|`` at most ``atol`` off the diagonal and
    ``diag_atol`` (default ``atol``) on it. The Gram is computed a sixteenth of its rows at a time, only on and right
    of the diagonal (it is symmetric), and stops at the first block past the tolerance: about W's bytes / 16 where
    ``W Wᵀ - I`` and its copies held 3 d_s x d_s float64 arrays."""
    d = W.shape[0]
    block = max(64, -(-d // 16))
    for i in range(0, d, block):
        G = W[i : i + block] @ W[i:].T  # rows i.. of the Gram, from column i: G[k, k] is the diagonal
        k = np.arange(G.shape[0])
        diag = G[k, k] - 1.0
        G[k, k] = 0.0
        if np.abs(G, out=G).max() > atol or np.abs(diag).max() > (atol if diag_atol is None else diag_atol):
            return False
        del G  # before the next block's
    return True


class Scalars:
    """The few functions :meth:`LinearMap._terms` needs, on Python floats: a single row's factors cost
    ~0.1 µs per operation this way against ~1-3 µs per numpy call on one-element arrays."""

    sqrt = staticmethod(math.sqrt)
    maximum = staticmethod(max)  # finite arguments only (the caller has checked the row)
    minimum = staticmethod(min)

    @staticmethod
    def full(m: int, value: float) -> float:
        return value


class _Arrays:
    sqrt = staticmethod(np.sqrt)
    maximum = staticmethod(np.maximum)
    minimum = staticmethod(np.minimum)

    @staticmethod
    def full(m: int, value: float) -> np.ndarray:
        return np.full(m, value)


@dataclass(eq=False, repr=False)  # StoredMap's == and repr (align._artifacts.ValueObject)
class LinearMap(StoredMap):
    """A linear (affine) map ``x -> f_s(x) W + b`` between two spaces.

    Parameters
    ----------
    W : ndarray (d_s, d_t)
    bias : ndarray (d_t,) or None
    source_frame, target_frame : Frame or None
        ``None`` means the identity frame of the right dimension.
    metadata : dict
        JSON-serialisable facts (method, parameters, diagnostics, spaces...).
    """

    W: np.ndarray
    bias: np.ndarray | None = None
    source_frame: Frame | None = None
    target_frame: Frame | None = None
    metadata: dict = field(default_factory=dict)

    map_kind = "linear"  # class attribute (not a field): the registry records it; see align.chain.map_kind

    def __post_init__(self):
        given, self.W = self.W, as_real_array(self.W, name="W", ndim=2)
        if not self.W.any() and np.any(given):  # a constant map (np.eye * 1e-30 composed with itself, ridge alpha=1e50)
            raise NotRepresentableError("W: every entry is below float32's smallest value (~1.4e-45) and would be "
                                        "stored as 0, a map that sends every row to the same point; scale the map "
                                        "(a ridge fit: lower alpha)")
        if 0 in self.W.shape:
            raise InputError(f"W must be a non-empty 2-D array (d_s, d_t), got shape {self.W.shape}")
        if self.bias is not None:
            self.bias = as_real_array(self.bias, name="bias").reshape(-1)
            if self.bias.shape[0] != self.W.shape[1]:
                raise DimensionMismatchError(f"bias has {self.bias.shape[0]} entries, W has {self.W.shape[1]} columns")
        if self.source_frame is None:
            self.source_frame = Frame.identity(self.W.shape[0])
        if self.target_frame is None:
            self.target_frame = Frame.identity(self.W.shape[1])
        if self.source_frame.dim != self.W.shape[0] or self.target_frame.dim != self.W.shape[1]:
            raise DimensionMismatchError(
                f"frames ({self.source_frame.dim}, {self.target_frame.dim}) do not match W {self.W.shape}")

    # --- shape facts ----------------------------------------------------------------------
    @property
    def source_dim(self) -> int:
        return int(self.W.shape[0])

    @property
    def target_dim(self) -> int:
        return int(self.W.shape[1])

    def is_orthogonal(self, atol: float = 1e-4) -> bool:
        """True when ``W`` has orthonormal rows or columns (padding counts) and no bias."""
        if self.bias is not None and np.abs(self.bias).max() > atol:
            return False
        W = self.W.astype(np.float64)
        return _orthonormal(W if W.shape[0] <= W.shape[1] else W.T, atol, atol + 1e-5)  # np.allclose's tolerances

    def planned_bytes(self) -> int:
        """Bytes of the arrays the fused apply plan (:meth:`_plan`, about ``W`` again) will hold once the first apply
        builds it; 0 once built (they are then the map's own). Lets a cache count a map whole before it is applied."""
        if self.__dict__.get("_fused") is not None:
            return 0
        d_s, d_t = self.W.shape
        return ((d_s + 3) * d_t + 3 * d_s) * 4  # float32 Wa, q_mu, q_mut, q_b

    # --- applying -------------------------------------------------------------------------
    def apply(self, X, *, output: str = "raw", batch_size: int = 65536, validate: bool = True,
              name: str = "X") -> np.ndarray:
        """Map raw source rows ``X`` (n, d_s) to (n, d_t) float32.

        ``output="raw"`` (default, as in the CLI and over HTTP): target mean added back and
        renormalised — comparable by cosine with the target model's own vectors (what a migrated
        index needs). ``output="frame"``: the target frame (centred, unit rows when the frame
        normalises), where evaluation happens. ``output="linear"``: ``f_s(X) W + b`` as is.

        ``validate=False`` skips the input check (:func:`align.validation.as_matrix`) for callers
        that already hold a checked float32 C-contiguous (n, d_s) array, e.g. a request decoded once.
        With ``validate=True`` finiteness is checked on the fly, from the row norms the apply computes anyway,
        so a caller that has only decoded ``X`` (shape and dtype, not its values) should leave it on rather than
        make a pass of its own. ``name``: what the error messages call ``X``. An array of another dtype than float32
        (a float16 memmap) is converted ``batch_size`` rows at a time (:meth:`StoredMap._apply_pieces`).

        An all-zero row has no direction: its unit row is taken as zero (:meth:`Frame.apply`), so it maps to the
        image of the source frame's origin, one and the same row for every zero input; a defined value, not a
        meaningful vector. ``vecbridge transform`` and ``POST /v1/maps/{ref}/transform`` refuse zero rows, as
        a search through a map and a migration do.
        """
        if validate and copies_whole(X):
            batch_size = check_batch_size(batch_size)
            out = self._apply_pieces(X, self._block_rows(batch_size), output=output, batch_size=batch_size, name=name)
            if out is not None:
                return out
        if validate:
            X = as_matrix(X, name=name, dim=self.source_dim, finite=False)
        batch_size = check_batch_size(batch_size)  # NaN or "a" was a raw ValueError, 0 or -5 read as 1
        return self._apply(X, output=output, batch_size=batch_size, checked=not validate, name=name)

    def _block_rows(self, batch_size: int) -> int:
        """Rows of the fused blocks of :meth:`_apply` with ``batch_size``: at most :data:`_BLOCK_ROWS`."""
        return min(int(batch_size), _BLOCK_ROWS)

    def _apply(self, X: np.ndarray, *, output: str = "frame", batch_size: int = 65536,
               checked: bool = True, name: str = "X") -> np.ndarray:
        """Fused apply on ``X`` (n, d_s) float32 C-contiguous: one GEMM per block of rows, output scaled in place.

        Every output is a positive row scale of one affine form (constants in :meth:`_plan`)

        .. math::  u = x W + \\beta\\,(\\mu_s W) + \\gamma\\, b, \\qquad
                   \\text{linear} = \\alpha u,\\quad \\text{frame} = u/|u|,\\quad
                   \\text{raw} = \\mu_t + t\\, u/|u|

        with per-row ``alpha, beta, gamma, t`` from ``|x|`` and ``x·q`` for a few fixed vectors ``q``
        (one GEMV each, only those the output reads). The input block, its row scale and the low-rank
        coefficients are written side by side into one buffer ``[r x | r beta | r shift | r gamma]`` (the factors
        the output uses: :meth:`_width`) and multiplied by ``[W; mu_s W; mu_t; b]`` in **one** GEMM, which leaves
        the finished output when the rows of ``W`` are orthonormal (``|u|`` is then known from the input side);
        otherwise the output is read once to measure ``|u|`` and scaled in place. Rows go in blocks of
        ``min(batch_size, 1024)`` that stay in cache.

        Passes over the data are the cost beside the GEMM, so each is made to serve twice: the
        squared row norms ``|x|²`` (needed for the frame) also tell whether a block holds NaN/Inf
        (``checked=False``: raise :class:`~align.exceptions.NonFiniteError` then) or rows whose
        squares leave float32's range (brought to unit length when the source frame is
        scale-free); the output is checked for overflow only where it is not bounded by
        construction (``linear`` output, non-unit target frames) or from the norms read anyway.
        """
        if output not in ("frame", "raw", "linear"):
            raise InputError(f"output must be 'frame', 'raw' or 'linear', got {output!r}")
        p = self._plan()  # one plan for the whole call: a W assigned meanwhile never mixes into it
        out = np.empty((X.shape[0], p["Wa"].shape[1]), dtype=np.float32)
        if X.shape[0] == 1 and self._apply_row(p, X[0], out, output):
            return out
        block = max(1, min(int(batch_size), _BLOCK_ROWS))
        scale_free = p["fs"].unit_in  # f_s(c x) = f_s(x): extreme rows can be brought to unit length
        verified = True
        for s in range(0, X.shape[0], block):
            x = X[s : s + block]
            with np.errstate(over="ignore", under="ignore", invalid="ignore"):
                sq = np.einsum("ij,ij->i", x, x)
            if not (SQ_LO < sq.min() and sq.max() < SQ_HI):  # NaN fails both comparisons
                if not checked:
                    as_matrix(X, name=name)  # raises NonFiniteError naming the bad row count
                    checked = True
                tamed = tame_rows(x) if scale_free else x
                if tamed is not x:
                    x, sq = tamed, np.einsum("ij,ij->i", tamed, tamed)
            verified &= self._apply_block(p, x, out[s : s + block], output, sq)
        return out if verified else check_representable(out, "transform")

    def _plan(self) -> dict:
        """Per-map constants of the fused apply, computed once (a fitted map is not modified).

        Standard source frame ``f_s(x) = (x/|x| - mu_s)/s(x)``, ``s(x) = sqrt(1 - 2 (x·mu_s)/|x| + |mu_s|^2)``:
        ``f_s(x) W + b = alpha u`` with ``alpha = 1/(|x| s)``, ``beta = -|x|``, ``gamma = |x| s``.
        Other source frames are applied to a copy first (``alpha = gamma = 1``, ``beta = 0``).
        ``q_mu, q_mut, q_b`` (d_s,) = ``mu_s, W mu_t, W b`` give the input-side products ``x·q`` (one
        GEMV each, only those the output needs); with
        orthonormal rows of ``W`` (``W Wᵀ = I``) ``|x W| = |x|``, so ``|u|`` needs no pass over the output.

        Built from one read of ``W``, ``bias`` and the frames (the plan keeps the frames it used); kept only while
        they are still the map's (:meth:`StoredMap._keep_plan`): ``m.W = W2`` from another thread during the build
        left a plan of part old ``W``, part new one, for good.
        """
        plan = self.__dict__.get("_fused")
        if plan is not None:
            return plan
        W, bias, fs, ft = self.W, self.bias, self.source_frame, self.target_frame
        d_s, d_t = W.shape
        folded = bool(fs.unit_in and fs.unit_out and fs.mean is not None)
        mu_s = fs.mean.astype(np.float64) if folded else np.zeros(d_s)
        mu_t = ft.mean.astype(np.float64) if ft.mean is not None else np.zeros(d_t)
        b = bias.astype(np.float64) if bias is not None else np.zeros(d_t)
        # W in float64 (2x W's bytes) only while the float64 products below read it, freed before Wa is made: the
        # first apply peaked at 8x W (+288 MiB at 3072 x 3072) with W W^T, its copies and [W; ...] stacked twice
        W64 = W.astype(np.float64)
        muW, q_mut, q_b = mu_s @ W64, (W64 @ mu_t).astype(np.float32), (W64 @ b).astype(np.float32)
        orth = d_s <= d_t and _orthonormal(W64, 1e-5)
        col_sq = np.einsum("ij,ij->j", W64, W64)  # squared column norms of W (Wa_col)
        del W64
        Wa = np.empty((d_s + 3, d_t), np.float32)
        Wa[:d_s], Wa[d_s], Wa[d_s + 1], Wa[d_s + 2] = W, muW, mu_t, b
        plan = {
            "fs": fs, "ft": ft,
            "folded": folded,
            "copy_frame": not folded and (fs.unit_in or fs.unit_out or fs.mean is not None),
            "orth": orth,
            "has_bias": bias is not None,
            "raw_closed": bool(ft.unit_in and ft.unit_out and ft.mean is not None),
            # [W; mu_s W; mu_t; b]: one GEMM adds the low-rank terms; an output takes the rows its factors use
            # (_width): each extra row of K = d_s + k cost ~10 µs a 1024 x 384 block, a padding to 4 included
            "Wa": Wa,
            # the largest column norm of Wa: bounds every output value from the input side (_apply_block)
            "Wa_col": float(np.sqrt(col_sq + muW * muW + mu_t * mu_t + b * b).max()),
            # input-side products x·q, one GEMV each: a (d_s, 4) GEMM costs ~2.3 GEMVs on this shape, and a (d_s, 2)
            # one, 24 µs against 45, gives most rows other bits in another block of rows (a parquet streamed in chunks
            # of 512 no longer matched its .npy output bit for bit); GEMVs differ in up to 3 tail rows (README)
            "q_mu": mu_s.astype(np.float32), "q_mut": q_mut, "q_b": q_b,
            "mu_sq": float(mu_s @ mu_s), "muW_sq": float(muW @ muW), "b_sq": float(b @ b), "muW_b": float(muW @ b),
            "muW_mut": float(muW @ mu_t), "b_mut": float(b @ mu_t), "mut_sq": float(mu_t @ mu_t),
        }
        return self._keep_plan(plan, W=W, bias=bias, source_frame=fs, target_frame=ft)

    @staticmethod
    def _closed(p: dict, output: str) -> tuple[bool, bool]:
        """``(unit, closed_raw)``: whether ``output`` is unit rows of the target frame, or raw rows in the closed
        form ``mu_t + t u/|u|`` (standard target frame); both are normalised from ``|u|``."""
        return output == "frame" and p["ft"].unit_out, output == "raw" and p["raw_closed"]

    def _terms(self, p: dict, n1, dot, m: int, output: str, xp) -> tuple:
        """Per-row factors of the fused form, on arrays of ``m`` rows (``xp=_Arrays``) or one row's floats
        (``Scalars``): ``(r, beta, gamma, shift, alpha, u_mut)``; ``r`` is None when the output is scaled
        after the GEMM (then ``alpha``/``u_mut`` finish it), else the row scale applied before it.

        ``n1`` = ``|x|``; ``dot(name)`` = ``x·q`` (float64) for the plan vector ``q = plan[name]``, called only for
        those this output reads. The maths is :meth:`_apply`'s docstring; :meth:`_plan` holds the constants.
        """
        ft = p["ft"]
        if p["folded"]:
            # |unit(x)|^2: 1, and 0 for a zero row (unit(0) = 0, framed as -mu / |mu| as Frame.apply has it; taken
            # as 1, its output was off the frame's, norm 0.25 where a unit row was due)
            one = xp.minimum(n1 / NORM_LO, 1.0)
            n1 = xp.maximum(n1, NORM_LO)  # only zero rows are below it (smaller ones were tamed)
            s = xp.sqrt(xp.maximum(one - 2.0 * dot("q_mu") / n1 + p["mu_sq"], 1e-24))
            ns = n1 * s
            alpha, beta, gamma = 1.0 / ns, -n1, ns
        else:
            alpha, beta, gamma = xp.full(m, 1.0), xp.full(m, 0.0), xp.full(m, 1.0)
        if not p["has_bias"]:
            gamma = xp.full(m, 0.0)
        # u·mu_t = x·(W mu_t) + beta (mu_s W)·mu_t + gamma b·mu_t, needed by raw outputs only
        u_mut = None
        if output == "raw":
            u_mut = dot("q_mut") + beta * p["muW_mut"] if p["folded"] else dot("q_mut")
            if p["has_bias"]:
                u_mut = u_mut + gamma * p["b_mut"]
        unit, closed_raw = self._closed(p, output)
        r, shift = None, xp.full(m, 0.0)  # shift: coefficient of mu_t (before the row scale)
        if output == "linear" or (output == "frame" and not ft.unit_out):
            r = alpha
        elif p["orth"] and (unit or closed_raw):
            if p["folded"]:  # u = |x| s (f W + b) with |f W| = |f| = 1: no difference of large terms
                nu = ns
                if p["has_bias"]:
                    g = (dot("q_b") / n1 - p["muW_b"]) / s
                    nu = ns * xp.sqrt(xp.maximum(1.0 + 2.0 * g + p["b_sq"], 1e-24))
            else:  # u = x' W + b
                xb = dot("q_b") if p["has_bias"] else 0.0  # (xW)·b
                nu = xp.sqrt(xp.maximum(n1 * n1 + 2.0 * gamma * xb + gamma * gamma * p["b_sq"], NU2_MIN))
            if unit:
                r = 1.0 / nu
            else:
                t = raw_t(u_mut / nu, p["mut_sq"], xp)
                r, shift = t / nu, nu / t
        return r, beta, gamma, shift, alpha, u_mut

    @staticmethod
    def _width(p: dict, output: str) -> int:
        """How many factor columns ``[beta | shift | gamma]`` the GEMM of ``output`` takes: gamma (the bias's) only
        with a bias, shift (``mu_t``'s) only for raw output, beta always (0 where the source frame is not folded)."""
        return 3 if p["has_bias"] else 2 if output == "raw" else 1

    def _apply_block(self, p: dict, x: np.ndarray, y: np.ndarray, output: str, sq: np.ndarray) -> bool:
        """Write ``output`` for finite rows ``x`` (m, d_s) into ``y`` (m, d_t), both C-contiguous float32.

        ``sq`` (m,): the squared row norms of ``x``. Returns True when ``y`` is known to be finite
        (bounded by construction, or its norms were read and found finite); False leaves the check
        to the caller.
        """
        ft = p["ft"]
        if p["copy_frame"]:
            x = p["fs"].apply(x, validate=False)
            sq = np.einsum("ij,ij->i", x, x)
        m = x.shape[0]
        scale, beta, gamma, shift, alpha, u_mut = self._terms(p,
            np.sqrt(sq.astype(np.float64)), lambda q: (x @ p[q]).astype(np.float64), m, output, _Arrays)
        unit, closed_raw = self._closed(p, output)
        d_s = x.shape[1]
        k = self._width(p, output)
        xa = np.empty((m, d_s + k), dtype=np.float32)  # [r x | r beta | r shift | r gamma][:, :d_s + k]
        if scale is None:  # scaled after the GEMM: a plain copy
            r = np.ones(m)
            np.copyto(xa[:, :d_s], x)
        else:  # einsum writes the scaled rows into the strided buffer in 76 µs (1024 x 384), np.multiply in 116
            r = scale
            np.einsum("ij,i->ij", x, r.astype(np.float32), out=xa[:, :d_s])
        for j, f in enumerate((beta, shift, gamma)[:k]):  # column by column: a stack of tiny arrays cost ~20 µs
            xa[:, d_s + j] = f * r
        np.matmul(xa, p["Wa"][: d_s + k], out=y)
        if scale is not None:  # unit/raw rows of a closed form are bounded when their factors are finite
            if unit or closed_raw:
                return math.isfinite(float(r.sum()) + float(xa[:, d_s:].sum()))
            # linear rows (or a frame's that does not normalise): |y_ij| <= |xa_i| max_j |Wa[:, j]| with
            # |xa_i|^2 = r_i^2 |x_i|^2 + its factors squared, from the norms read anyway (no pass over y);
            # NaN/Inf fail the test. Past the bound the caller checks the output itself
            tail = xa[:, d_s:].astype(np.float64)
            with np.errstate(over="ignore", invalid="ignore"):
                top = float(np.max(r * r * sq + np.einsum("ij,ij->i", tail, tail)))
            return math.sqrt(top) * p["Wa_col"] < _OUT_BOUND
        if unit or closed_raw:  # W without orthonormal rows: measure |u| on the output, scale in place
            with np.errstate(over="ignore", invalid="ignore", under="ignore"):
                nu2 = np.einsum("ij,ij->i", y, y).astype(np.float64)
            if not (np.isfinite(nu2.sum()) and nu2.min() > SQ_LO):  # squares past float32's range either way
                nu2 = np.einsum("ij,ij->i", y, y, dtype=np.float64)  # exact for any finite float32 y
                if not np.isfinite(nu2.sum()):  # y itself not finite
                    return False
            nu = np.sqrt(np.maximum(nu2, NU2_MIN))
            y *= ((1.0 / nu) if unit else raw_t(u_mut / nu, p["mut_sq"]) / nu).astype(np.float32)[:, None]
            if closed_raw:
                y += ft.mean
            return True
        y *= alpha.astype(np.float32)[:, None]  # raw output through any other target frame
        y[...] = ft.to_raw(y)
        return bool(np.isfinite(y).all())  # this block, while in cache: no pass over the whole output after

    def _apply_row(self, p: dict, x: np.ndarray, y: np.ndarray, output: str) -> bool:
        """:meth:`_apply_block` for one row ``x`` (d_s,) into ``y`` (1, d_t), its factors as Python floats.

        A batch-1 call (a query) is a GEMV beside ~25 tiny numpy operations in the block form, which
        cost several times the GEMV; here the same factors take ~0.1 µs each. Returns False for rows
        the block form handles (a norm outside the safe range, NaN/Inf, non-standard frames, outputs
        that are not unit or closed raw rows, squares past float32's range); the caller then computes
        ``y`` again by that form.
        """
        ft = p["ft"]
        unit, closed_raw = self._closed(p, output)
        if p["copy_frame"] or not (unit or closed_raw):
            return False
        sq = float(np.vdot(x, x))  # float32 like the block's einsum; Inf/NaN fail the range test (vdot: no FP warning)
        if not SQ_LO < sq < SQ_HI:
            return False
        scale, beta, gamma, shift, _, u_mut = self._terms(p,
            math.sqrt(sq), lambda k: float(x @ p[k]), 1, output, Scalars)
        d_s = x.shape[0]
        k = self._width(p, output)
        xa = np.empty((1, d_s + k), dtype=np.float32)
        r = 1.0 if scale is None else scale
        if scale is None:
            np.copyto(xa[0, :d_s], x)
        else:
            np.multiply(x, np.float32(r), out=xa[0, :d_s])
        xa[0, d_s:] = (beta * r, shift * r, gamma * r)[:k]
        np.matmul(xa, p["Wa"][: d_s + k], out=y)
        if scale is not None:
            return math.isfinite(r + beta * r + gamma * r + shift * r)
        nu2 = float(np.vdot(y[0], y[0]))
        if not SQ_LO < nu2 < math.inf:  # squares past float32's range, a zero or overflowed row: the block decides
            return False
        nu = math.sqrt(nu2)
        y *= np.float32(1.0 / nu if unit else raw_t(u_mut / nu, p["mut_sq"], Scalars) / nu)
        if closed_raw:
            y += ft.mean
        return True

    __call__ = apply

    # --- algebra --------------------------------------------------------------------------
    def compose(self, other: "LinearMap") -> "LinearMap":
        """The map ``self`` then ``other`` (A→B then B→C gives A→C).

        Exact when the middle frames agree and ``self`` is orthogonal (norms survive, so the
        inner renormalisation is the identity); otherwise the inner frame change is folded in
        as an affine shift ``(mu_1 - mu_2) W_2`` and recorded as approximate in the metadata.
        """
        if not isinstance(other, LinearMap):  # a ClusterMap was a raw broadcast error, a MapChain an AttributeError
            raise InputError(f"compose takes a LinearMap, got {type(other).__name__}: chain other maps with "
                             "align.MapChain([first, second])")
        if self.target_dim != other.source_dim:
            raise DimensionMismatchError(
                f"cannot compose: first map outputs {self.target_dim}-d, second expects {other.source_dim}-d")
        W = self.W.astype(np.float64) @ other.W.astype(np.float64)
        bias = np.zeros(other.target_dim)
        if self.bias is not None:
            bias += self.bias.astype(np.float64) @ other.W
        # norms survive only when W W^T = I: orthonormal rows (d_s <= d_t); a 384 -> 50 projection has orthonormal
        # columns, is_orthogonal() too, and was called exact
        exact = self.target_frame.same_as(other.source_frame) and self.is_orthogonal() and self.W.shape[0] <= \
            self.W.shape[1]
        if not self.target_frame.same_as(other.source_frame):
            m1 = self.target_frame.mean if self.target_frame.mean is not None else 0.0
            m2 = other.source_frame.mean if other.source_frame.mean is not None else 0.0
            bias += (np.asarray(m1, np.float64) - m2) @ other.W
        if other.bias is not None:
            bias += other.bias
        meta = {"method": "compose", "parts": [self.metadata, other.metadata], "exact": bool(exact)}
        return LinearMap(W, bias if np.abs(bias).max() > 0 else None, self.source_frame, other.target_frame, meta)

    def inverse(self) -> "LinearMap":
        """The map back: ``Wᵀ`` when orthogonal, else the Moore–Penrose pseudo-inverse."""
        if self.is_orthogonal():  # exact when W W^T = I (d_s <= d_t); Wᵀ of a projection is its pseudo-inverse
            W_inv = self.W.T.copy()
            bias = None
            meta = {"method": "inverse", "of": self.metadata, "exact": self.W.shape[0] <= self.W.shape[1]}
            if not meta["exact"]:
                meta["kind"] = "pseudo-inverse"
        else:
            W_inv = linalg.pinv(self.W.astype(np.float64))
            bias = None if self.bias is None else -(self.bias.astype(np.float64) @ W_inv)
            meta = {"method": "inverse", "of": self.metadata, "exact": False, "kind": "pseudo-inverse"}
        return LinearMap(W_inv, bias, self.target_frame, self.source_frame, meta)

    # --- (de)serialisation ----------------------------------------------------------------
    def _arrays_and_header(self) -> tuple[dict, dict]:
        arrays = {"W": self.W}
        if self.bias is not None:
            arrays["bias"] = self.bias
        if self.source_frame.mean is not None:
            arrays["source_mean"] = self.source_frame.mean
        if self.target_frame.mean is not None:
            arrays["target_mean"] = self.target_frame.mean
        header = {
            "format": "vecbridge.LinearMap",
            "format_version": FORMAT_VERSION,
            "source_frame": self.source_frame.to_meta(),
            "target_frame": self.target_frame.to_meta(),
            "metadata": self.metadata,
        }
        return arrays, header

    @classmethod
    def from_artifact(cls, arrays: dict, header: dict) -> "LinearMap":
        """The map of an unpacked artifact's ``arrays`` and ``header`` (:meth:`from_bytes`, :func:`map_from_bytes`)."""
        check_header(header, "vecbridge.LinearMap", FORMAT_VERSION, "LinearMap")
        with stored_fields("LinearMap"):
            return cls(
                W=arrays["W"],
                bias=arrays.get("bias"),
                source_frame=Frame.from_meta(header["source_frame"], arrays.get("source_mean")),
                target_frame=Frame.from_meta(header["target_frame"], arrays.get("target_mean")),
                metadata=header.get("metadata", {}),
            )

    def to_bytes(self, format: str = "npz") -> bytes:
        """Serialise to bytes: ``"npz"`` or ``"safetensors"``."""
        return pack(*self._arrays_and_header(), format)




def map_from_bytes(data):
    """A stored map of any kind by the artifact's header: :class:`LinearMap`, :class:`align.ClusterMap` or
    :class:`align.MapChain`. ``data``: the artifact's bytes, or a binary file open on them (seekable), whose arrays
    are then read straight into place (the file's bytes are never held beside them)."""
    from .chain import FORMAT as CHAIN_FORMAT, MapChain
    from .cluster import FORMAT as CLUSTER_FORMAT, ClusterMap

    arrays, header = unpack(data, "map artifact")
    if header.get("format") == CLUSTER_FORMAT:
        return ClusterMap.from_artifact(arrays, header)
    if header.get("format") == CHAIN_FORMAT:
        return MapChain.from_artifact(arrays, header)
    return LinearMap.from_artifact(arrays, header)


def load_map(path):
    """:func:`map_from_bytes` of the file at ``path`` (read from the file: about the map's size in memory)."""
    return read_file(path, map_from_bytes)
