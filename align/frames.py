"""Per-side frames: the preprocessing every map is fitted and applied in.

A frame is fitted on one side's training rows ``X`` (shape ``(n, d)``) and applies

.. math::  f(x) = \\mathrm{unit}(\\mathrm{unit}(x) - \\mu), \\qquad \\mu = \\tfrac1n \\sum_i \\mathrm{unit}(x_i)

("unit → centre → unit", the robust variant from the cross-lingual literature). Each step can
be switched off. ``to_raw`` goes the other way for search: add the mean back and renormalise,
so a mapped query can be compared with raw (uncentred, unit) vectors stored in an index.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ._artifacts import ValueObject
from .exceptions import InputError, SerializationError
from .validation import as_matrix

__all__ = ["Frame", "frame_sum", "mean_sum", "unit_rows", "row_norms", "tame_rows", "SAME_SPACE_MIN_COSINE",
           "SAME_SPACE_CHECKED_COSINE", "MEAN_CHECK_MIN_ROWS", "MEAN_CHECK_MIN_NORM", "SQ_LO", "SQ_HI", "NORM_LO"]

#: :meth:`Frame.mean_cosine` below this: the frame does not recognise the rows: another model's, or rows of one narrow
#: topic of its own space, so a low figure alone proves nothing (a migration refuses only rows that the map's TARGET
#: frame recognises, above this and above their source figure: a map the wrong way round). Measured on WordNet
#: (384-d, 30,000 definitions, unit rows, frames of Procrustes fits on 8,000 other rows): rows of the frame's own space
#: give 0.84-1.00 for batches of 50-1,000 consecutive rows; one topic gives less for MiniLM and paraphrase-L3 (frame
#: means of norm 0.25), more than 0.4 for most of 20 k-means clusters but 0.20 for the narrowest (biographies), and
#: down to 0.09 for one of 100 clusters (~200 rows of one small topic); e5 (mean norm 0.90) gives 0.95-0.99 on any of
#: them. Rows of another model of the same width (MiniLM against an e5 frame, e5 against MiniLM or paraphrase-L3): at
#: most 0.11 for those batches, 0.18 for one topic. Related models (MiniLM against paraphrase-L3) give 0.25-0.39 for
#: batches (either frame, fitted on 500-8,000 rows) and 0.00-0.33 for one topic: above this, so this level alone does
#: not vouch for the rows (:data:`SAME_SPACE_CHECKED_COSINE` does).
SAME_SPACE_MIN_COSINE = 0.2
#: :meth:`Frame.mean_cosine` from this up: the rows are the frame's space ("checked"). Between
#: :data:`SAME_SPACE_MIN_COSINE` and this: they may be another (related) model's, or one narrow topic of the frame's
#: own: not checked, a warning. Measured on WordNet as above: batches of 50-1,000 rows of the frame's own space (any
#: subset disjoint from the frame's rows, frames of 500-8,000 rows) give at least 0.81, a related model's at most 0.39
#: (paraphrase-L3 against MiniLM: 0.37 let paraphrase-L3 rows through a minilm map as "checked", and e5 queries then
#: found their own row 17 % of the time); one topic of its own space gives 0.17-0.78 (a median of 0.47-0.55).
SAME_SPACE_CHECKED_COSINE = 0.5
#: fewer non-zero rows than this: :meth:`Frame.mean_cosine` measures nothing (a batch mean too noisy to judge)
MEAN_CHECK_MIN_ROWS = 50
#: a frame mean shorter than this has no common direction to compare with (isotropic or centred embeddings; MiniLM's
#: is 0.25, e5's 0.90)
MEAN_CHECK_MIN_NORM = 0.1

# Squared norms a float32 sum of squares holds exactly enough: below, squares underflow (rows of
# 1e-25 would read as 0); above, they overflow (rows of 1e20 would read as inf).
SQ_LO, SQ_HI = 1e-30, 1e36
NORM_LO = 1e-15  # sqrt(SQ_LO): the smallest norm of a non-zero row that a scale-free frame does not tame


def _sq_norms(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(|x_i|^2 as float64, mask of rows outside the safe float32 range)``; exact for those rows."""
    with np.errstate(over="ignore", under="ignore"):
        sq = np.einsum("ij,ij->i", X, X)
    bad = ~((sq > SQ_LO) & (sq < SQ_HI))
    sq = sq.astype(np.float64)
    if bad.any():
        Xb = X[bad].astype(np.float64)
        sq[bad] = np.einsum("ij,ij->i", Xb, Xb)
    return sq, bad


def row_norms(X: np.ndarray) -> np.ndarray:
    """L2 norm of each row of ``X`` (n, d) as float64 (n,), without overflow or underflow.

    The sum of squares runs in float32 (fast path) and again in float64 for the rows whose
    float32 sum leaves ``(1e-30, 1e36)``: any finite float32 row gets its true norm
    (``d · (3.4e38)^2`` and ``(1e-45)^2`` are both inside float64's range).
    """
    return np.sqrt(_sq_norms(np.asarray(X))[0])


def unit_rows(X: np.ndarray) -> np.ndarray:
    """Scale rows of ``X`` (n, d) to unit L2 norm at any finite scale; zero rows stay zero.

    ``x / |x|`` with ``|x|`` from :func:`row_norms`; rows whose ``1/|x|`` float32 cannot hold
    (below ~1e-37 or above ~1e37) are divided in float64, so rows of 1e-25 or 1e20 come out as
    unit rows, never as zeros or NaN.
    """
    X = np.asarray(X)
    if X.ndim == 2 and X.shape[0] == 1 and X.dtype == np.float32:  # one query: ~10 numpy calls fewer
        sq1 = float(np.vdot(X, X))
        if SQ_LO < sq1 < SQ_HI:  # NaN/Inf and extreme rows take the general path
            return X * np.float32(1.0 / math.sqrt(sq1))
    sq, bad = _sq_norms(X)
    norms = np.sqrt(sq)
    inv = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
    out = (X * np.where(bad, 0.0, inv).astype(np.float32)[:, None]).astype(np.float32, copy=False)
    if bad.any():
        out[bad] = (X[bad].astype(np.float64) * inv[bad, None]).astype(np.float32)
    return out


def tame_rows(X: np.ndarray) -> np.ndarray:
    """``X`` with every row whose squared norm leaves float32's safe range scaled to unit length.

    For scale-invariant consumers (a frame that normalises its input first) this changes
    nothing but keeps ``x W`` and ``|x|`` finite and non-zero. Returns ``X`` itself when no row
    needs it (the common case costs one pass of ``einsum``).
    """
    with np.errstate(over="ignore", under="ignore"):
        sq = np.einsum("ij,ij->i", X, X)
    if sq.size and SQ_LO < sq.min() and sq.max() < SQ_HI:  # the common case in two reductions
        return X
    bad = ~((sq > SQ_LO) & (sq < SQ_HI)) & (sq != 0)
    zero = sq == 0
    if zero.any():  # a float32 zero can hide tiny non-zero rows (squares underflowed)
        bad |= zero & np.any(X != 0, axis=1)
    if not bad.any():
        return X
    out = X.copy()
    out[bad] = unit_rows(X[bad])
    return out


def frame_sum(X: np.ndarray, *, unit_in: bool = True, block: int = 65536) -> np.ndarray:
    """``Σ_i unit(x_i)`` (or ``Σ_i x_i`` without ``unit_in``) of rows ``X`` (n, d), in float64 (d,), by blocks."""
    acc = np.zeros(X.shape[1], dtype=np.float64)
    for s in range(0, X.shape[0], block):
        part = X[s : s + block]
        acc += (unit_rows(part) if unit_in else part).sum(axis=0, dtype=np.float64)
    return acc


def mean_sum(X: np.ndarray, *, unit_in: bool = True) -> tuple[np.ndarray, int]:
    """``(m, n)``: what :meth:`Frame.mean_cosine` averages over rows ``X`` (n, d; finite), made once for any number
    of frames (:meth:`Frame.sum_cosine`): ``m`` = :func:`frame_sum` (float64 (d,)), ``n`` its non-zero rows.

    float32 rows whose squared norms all lie in float32's safe range (the usual case) take one pass of norms and one
    float32 GEMV ``(1/|x_i|) @ X`` (``unit_in``): no unit copy of ``X`` (a 128 x 384 block: ~25 us where
    :func:`frame_sum` and the non-zero count took ~80); any other rows take :func:`frame_sum`."""
    if unit_in and X.dtype == np.float32 and X.ndim == 2 and X.shape[0]:
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            sq = np.einsum("ij,ij->i", X, X)
        if SQ_LO < sq.min() and sq.max() < SQ_HI:  # no zero, tiny, huge or non-finite row: all n are non-zero
            return (np.float32(1.0) / np.sqrt(sq) @ X).astype(np.float64), X.shape[0]
    return frame_sum(X, unit_in=unit_in), int(np.count_nonzero(np.any(X != 0, axis=1)))


@dataclass(eq=False, repr=False)  # == and a short repr: ValueObject's (a dataclass == raised on arrays)
class Frame(ValueObject):
    """One side's preprocessing: ``unit -> centre -> unit``.

    Attributes
    ----------
    dim : int
        Number of columns the frame accepts.
    mean : ndarray of shape (dim,) or None
        Training mean of the unit-normalised rows (``None``: no centring).
    unit_in, unit_out : bool
        Normalise rows before centring / after centring.
    """

    dim: int
    mean: np.ndarray | None = None
    unit_in: bool = True
    unit_out: bool = True
    n_fit: int = 0
    extra: dict = field(default_factory=dict)

    _repr_attrs = ("centered", "unit_in", "unit_out", "n_fit")

    def __post_init__(self) -> None:
        """Refuse a frame no transform can use (a crafted or corrupted artifact; a hand-built frame): ``dim``
        an int >= 1; ``mean`` finite, shape (dim,). A NaN mean used to pass here and surface at the first
        transform as "overflow"."""
        if isinstance(self.dim, bool) or not isinstance(self.dim, (int, np.integer)) or self.dim < 1:
            raise InputError(f"a frame's dim must be an int >= 1, got {self.dim!r}")
        if self.mean is None:
            return
        mean = np.asarray(self.mean)
        numeric = mean.dtype.kind in "fiu"
        finite = numeric and bool(np.isfinite(mean).all())
        if mean.shape != (self.dim,) or not finite:
            raise InputError(f"a frame's mean must be {self.dim} finite numbers, got shape {mean.shape}, "
                             f"dtype {mean.dtype}" + (", with NaN/Inf" if numeric and not finite else ""))
        if mean.dtype != np.float32 or mean is not self.mean:  # stored as every fitted frame holds it: a list
            # failed at the first apply, a float64 mean did not round-trip save/load exactly
            with np.errstate(over="ignore"):
                mean32 = mean.astype(np.float32)
            if not np.isfinite(mean32).all():
                raise InputError(f"a frame's mean must be finite in float32, got values up to {np.abs(mean).max():g}")
            self.mean = mean32

    @property
    def centered(self) -> bool:
        """Whether the frame subtracts a training mean."""
        return self.mean is not None

    @classmethod
    def fit(cls, X, *, center: bool = True, unit_in: bool = True, unit_out: bool = True, name: str = "X",
            validate: bool = True) -> "Frame":
        """Fit a frame on training rows ``X`` of shape (n, d).

        ``validate=False`` skips :func:`align.validation.as_matrix` for callers that already hold a checked
        float32 C-contiguous (n, d) array (as :meth:`apply`)."""
        if validate:
            X = as_matrix(X, name=name)
        total = frame_sum(X, unit_in=unit_in) if center else None
        return cls.from_sum(X.shape[1], X.shape[0], total, unit_in=unit_in, unit_out=unit_out)

    @classmethod
    def from_sum(cls, dim: int, n: int, total: np.ndarray | None, *, unit_in: bool = True,
                 unit_out: bool = True) -> "Frame":
        """The frame of ``n`` rows whose :func:`frame_sum` is ``total`` (d,) (None: no centring).

        Sums of row blocks add up, so a frame over shards is ``from_sum(d, Σ n_b, Σ total_b)``.
        """
        mean = None if total is None else (np.asarray(total, dtype=np.float64) / n).astype(np.float32)
        return cls(dim=int(dim), mean=mean, unit_in=unit_in, unit_out=unit_out, n_fit=int(n))

    @classmethod
    def identity(cls, dim: int) -> "Frame":
        """A frame that leaves rows untouched."""
        return cls(dim=dim, mean=None, unit_in=False, unit_out=False)

    def apply(self, X, *, name: str = "X", validate: bool = True) -> np.ndarray:
        """Map raw rows (n, dim) into this frame; returns float32 (n, dim).

        ``validate=False`` skips :func:`align.validation.as_matrix` for callers that already hold a
        checked float32 C-contiguous (n, dim) array (a hot path that validated once upstream).
        """
        return self._apply(as_matrix(X, name=name, dim=self.dim) if validate else X)

    def _apply(self, X: np.ndarray) -> np.ndarray:
        out = unit_rows(X) if self.unit_in else X.astype(np.float32, copy=True)
        if self.mean is not None:
            out = out - self.mean
        if self.unit_out:
            out = unit_rows(out)
        return np.ascontiguousarray(out, dtype=np.float32)

    def to_raw(self, Y: np.ndarray) -> np.ndarray:
        """Inverse of the frame, for search against raw (unit) vectors; (n, dim) float32.

        With ``unit_in`` and centring, a framed row ``f`` comes from the unit vector
        ``u = mu + t f`` with ``t > 0`` solving ``|mu + t f| = 1``, i.e.
        ``t = -(mu·f) + sqrt((mu·f)^2 + 1 - |mu|^2)`` (``|f| = 1``, ``|mu| < 1``), so
        ``apply(to_raw(f)) == f`` exactly up to rounding.
        """
        f = unit_rows(Y) if self.unit_out else np.asarray(Y, dtype=np.float32)
        if self.mean is None:
            return np.ascontiguousarray(f, dtype=np.float32)
        if not self.unit_in:
            return np.ascontiguousarray(f + self.mean, dtype=np.float32)
        if not self.unit_out:
            f = unit_rows(f)
        mu = self.mean
        b = f @ mu  # (n,)
        t = np.sqrt(np.maximum(b * b + np.float32(1.0 - float(mu @ mu)), 0.0)) - b
        out = f * t[:, None]
        out += mu  # |mu + t f| = 1 by construction: no renormalisation pass
        return out

    def mean_cosine(self, X, *, name: str = "X") -> float | None:
        """How much rows ``X`` (n, dim) look like the rows this frame was fitted on: the cosine between their
        mean direction and the frame's mean.

        .. math::  c = \\frac{m \\cdot \\mu}{|m|\\,|\\mu|}, \\qquad m = \\tfrac1{n'} \\sum_i \\mathrm{unit}(x_i)

        over the ``n'`` non-zero rows (raw rows, not unit ones, for a frame without ``unit_in``: what its mean
        averages), ``mu`` the frame's training mean (dim,). Embedding models share a common direction among their
        rows (a mean of norm 0.25 for MiniLM, 0.90 for e5) that a batch of the same model's rows points along and
        another model's does not: :data:`SAME_SPACE_MIN_COSINE` tells them apart (its figures). A float in [-1, 1],
        or None when nothing can be said: no mean (an uncentred frame) or one shorter than
        :data:`MEAN_CHECK_MIN_NORM` (no common direction), or fewer than :data:`MEAN_CHECK_MIN_ROWS` non-zero rows.
        O(n dim) time, one block of unit rows of memory.

        Raises the errors of :func:`align.validation.as_matrix` (shape, width, NaN / Inf).
        """
        X = as_matrix(X, name=name, dim=self.dim)
        if self.mean is None:
            return None
        return self.sum_cosine(*mean_sum(X, unit_in=self.unit_in))

    def sum_cosine(self, m: np.ndarray, n: int) -> float | None:
        """:meth:`mean_cosine` of rows whose :func:`mean_sum` is ``(m, n)``: ``m``'s cosine with the frame's mean, or
        None (no mean, one shorter than :data:`MEAN_CHECK_MIN_NORM`, fewer than :data:`MEAN_CHECK_MIN_ROWS`
        non-zero rows). One sum of a block of rows serves every frame that judges it."""
        if self.mean is None:
            return None
        mu = self.mean.astype(np.float64)
        mu_norm = math.sqrt(mu @ mu)
        if mu_norm < MEAN_CHECK_MIN_NORM or n < MEAN_CHECK_MIN_ROWS:
            return None
        m_norm = math.sqrt(m @ m)  # zero rows add nothing to m; m's length does not enter the cosine
        if m_norm == 0.0:  # rows that cancel out exactly have no direction: none of the frame's either
            return 0.0
        return min(max(float(m @ mu) / (m_norm * mu_norm), -1.0), 1.0)

    def same_as(self, other: "Frame", atol: float = 1e-5) -> bool:
        """True when both frames transform rows identically."""
        if (self.dim, self.unit_in, self.unit_out) != (other.dim, other.unit_in, other.unit_out):
            return False
        if (self.mean is None) != (other.mean is None):
            return False
        return self.mean is None or bool(np.allclose(self.mean, other.mean, atol=atol))

    # --- (de)serialisation helpers used by LinearMap -------------------------------------
    def to_meta(self) -> dict:
        """JSON-safe description (the mean travels separately as an array)."""
        return {"dim": self.dim, "centered": self.centered, "unit_in": self.unit_in,
                "unit_out": self.unit_out, "n_fit": self.n_fit}

    @classmethod
    def from_meta(cls, meta: dict, mean: np.ndarray | None) -> "Frame":
        """The frame :meth:`to_meta` described, with its stored ``mean`` (d,) or None.

        SerializationError when the description is not what :meth:`to_meta` writes: ``unit_in`` / ``unit_out``
        not JSON booleans (``bool("false")`` is True), or ``centered`` disagreeing with the stored mean (a lost
        ``*_mean`` array would silently give an uncentred frame: another map); a bad ``dim`` or mean is
        the constructor's InputError.
        """
        if not isinstance(meta, dict):
            raise SerializationError(f"a frame must be stored as a JSON object, got {type(meta).__name__}")
        flags = {key: meta[key] for key in ("unit_in", "unit_out")}
        if not all(isinstance(v, bool) for v in flags.values()):
            raise SerializationError(f"a stored frame's unit_in / unit_out must be true or false, got {flags}")
        if "centered" in meta and meta["centered"] is not (mean is not None):
            raise SerializationError(f"a stored frame says centered={meta['centered']!r} but its mean is "
                                     f"{'missing' if mean is None else 'present'}: the artifact is incomplete")
        if mean is not None:
            mean = np.asarray(mean)
            if mean.dtype.kind in "fiu":  # anything else (strings, complex) is refused by the constructor
                with np.errstate(over="ignore"):
                    mean = mean.astype(np.float32)
        return cls(dim=meta["dim"], mean=mean, unit_in=flags["unit_in"], unit_out=flags["unit_out"],
                   n_fit=int(meta.get("n_fit", 0)))
