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

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ._artifacts import META_KEY, header_text, pack_npz, read_bytes, save_atomic, unpack_npz
from ._validation import as_matrix
from .exceptions import DimensionMismatchError, InputError, SerializationError
from .frames import Frame, unit_rows

__all__ = ["LinearMap", "FORMAT_VERSION"]

FORMAT_VERSION = 1


@dataclass
class LinearMap:
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

    def __post_init__(self):
        W = np.asarray(self.W)
        if W.ndim != 2 or 0 in W.shape:
            raise InputError(f"W must be a non-empty 2-D array (d_s, d_t), got shape {W.shape}")
        self.W = np.ascontiguousarray(W, dtype=np.float32)
        if not np.isfinite(self.W).all():
            raise InputError("W contains NaN or Inf")
        if self.bias is not None:
            self.bias = np.ascontiguousarray(np.asarray(self.bias, dtype=np.float32).reshape(-1))
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
        G = W @ W.T if W.shape[0] <= W.shape[1] else W.T @ W
        return bool(np.allclose(G, np.eye(G.shape[0]), atol=atol))

    # --- applying -------------------------------------------------------------------------
    def apply(self, X, *, output: str = "frame", batch_size: int = 65536) -> np.ndarray:
        """Map raw source rows ``X`` (n, d_s) to (n, d_t) float32.

        ``output="frame"``: the target frame (centred, unit rows when the frame normalises).
        ``output="raw"``: target mean added back and renormalised (compare with raw target vectors).
        ``output="linear"``: ``f_s(X) W + b`` as is, without output normalisation.
        """
        X = as_matrix(X, name="X", dim=self.source_dim)
        return self._apply(X, output=output, batch_size=batch_size)

    def _apply(self, X: np.ndarray, *, output: str = "frame", batch_size: int = 65536) -> np.ndarray:
        if output not in ("frame", "raw", "linear"):
            raise InputError(f"output must be 'frame', 'raw' or 'linear', got {output!r}")
        out = np.empty((X.shape[0], self.target_dim), dtype=np.float32)
        for s in range(0, X.shape[0], batch_size):
            y = self._linear(X[s : s + batch_size], direction_only=output == "frame")
            if output == "frame" and self.target_frame.unit_out:
                y = unit_rows(y)
            elif output == "raw":
                y = self.target_frame.to_raw(y)
            out[s : s + batch_size] = y
        return out

    def _linear(self, x: np.ndarray, *, direction_only: bool = False) -> np.ndarray:
        """``f_s(x) W + b`` for one batch (n, d_s) → (n, d_t), folded into one GEMM.

        For the standard frame ``f_s(x) = (x/|x| - mu) / s(x)`` with
        ``s(x) = |x/|x| - mu| = sqrt(1 - 2 (x·mu)/|x| + |mu|^2)``, so

        .. math::  f_s(x) W = \\big(x W / |x| - mu W\\big) / s(x)

        needs ``x W`` (the GEMM), ``|x|`` and ``x·mu`` — no normalised copy of ``x``. With
        ``direction_only`` (the caller renormalises, no bias) the positive row scale is skipped:
        ``x W - |x| (mu W)``.
        """
        fs = self.source_frame
        if not (fs.unit_in and fs.unit_out and fs.mean is not None):
            y = fs._apply(x) @ self.W
            if self.bias is not None:
                y += self.bias
            return y
        if getattr(self, "_mu_W", None) is None:
            self._mu_W = (fs.mean @ self.W).astype(np.float32)
            self._mu_sq = float(fs.mean.astype(np.float64) @ fs.mean)
        z = x @ self.W
        n1 = np.sqrt(np.einsum("ij,ij->i", x, x))
        np.maximum(n1, 1e-12, out=n1)
        if direction_only and self.bias is None:
            z -= n1[:, None] * self._mu_W
            return z
        xm = (x @ fs.mean) / n1
        scale = 1.0 / np.sqrt(np.maximum(1.0 - 2.0 * xm + self._mu_sq, 1e-24))
        z *= (scale / n1)[:, None]
        z -= scale[:, None] * self._mu_W
        if self.bias is not None:
            z += self.bias
        return z

    __call__ = apply

    # --- algebra --------------------------------------------------------------------------
    def compose(self, other: "LinearMap") -> "LinearMap":
        """The map ``self`` then ``other`` (A→B then B→C gives A→C).

        Exact when the middle frames agree and ``self`` is orthogonal (norms survive, so the
        inner renormalisation is the identity); otherwise the inner frame change is folded in
        as an affine shift ``(mu_1 - mu_2) W_2`` and recorded as approximate in the metadata.
        """
        if self.target_dim != other.source_dim:
            raise DimensionMismatchError(
                f"cannot compose: first map outputs {self.target_dim}-d, second expects {other.source_dim}-d")
        W = self.W.astype(np.float64) @ other.W.astype(np.float64)
        bias = np.zeros(other.target_dim)
        if self.bias is not None:
            bias += self.bias.astype(np.float64) @ other.W
        exact = self.target_frame.same_as(other.source_frame) and self.is_orthogonal()
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
        if self.is_orthogonal():
            W_inv = self.W.T.copy()
            bias = None
            meta = {"method": "inverse", "of": self.metadata, "exact": True}
        else:
            W_inv = np.linalg.pinv(self.W.astype(np.float64))
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
    def _from_arrays(cls, arrays: dict, header: dict) -> "LinearMap":
        if header.get("format") != "vecbridge.LinearMap":
            raise SerializationError("not a vecbridge LinearMap artifact")
        if int(header.get("format_version", 0)) > FORMAT_VERSION:
            raise SerializationError(f"artifact format {header['format_version']} is newer than this vecbridge reads")
        try:
            return cls(
                W=arrays["W"],
                bias=arrays.get("bias"),
                source_frame=Frame.from_meta(header["source_frame"], arrays.get("source_mean")),
                target_frame=Frame.from_meta(header["target_frame"], arrays.get("target_mean")),
                metadata=header.get("metadata", {}),
            )
        except (KeyError, TypeError) as exc:
            raise SerializationError(f"artifact is missing a field: {exc}") from None

    def to_bytes(self, format: str = "npz") -> bytes:
        """Serialise to bytes: ``"npz"`` or ``"safetensors"``."""
        arrays, header = self._arrays_and_header()
        if format == "npz":
            return pack_npz(arrays, header)
        if format == "safetensors":
            from safetensors.numpy import save

            return save({k: np.ascontiguousarray(v) for k, v in arrays.items()},
                        metadata={META_KEY: header_text(header)})
        raise SerializationError(f"unknown format {format!r}; use 'npz' or 'safetensors'")

    @classmethod
    def from_bytes(cls, data: bytes) -> "LinearMap":
        """Read what :meth:`to_bytes` wrote (format detected from the bytes)."""
        try:
            if data[:2] == b"PK":  # zip container: npz
                arrays, header = unpack_npz(data)
            else:
                from safetensors import safe_open  # noqa: F401  (import check)
                from safetensors.numpy import load

                n = int.from_bytes(data[:8], "little")
                header_blob = json.loads(data[8 : 8 + n].decode("utf-8"))
                header = json.loads(header_blob["__metadata__"][META_KEY])
                arrays = load(data)
        except SerializationError:
            raise
        except Exception as exc:
            raise SerializationError(f"cannot read LinearMap artifact: {exc}") from None
        return cls._from_arrays(arrays, header)

    def save(self, path, format: str | None = None) -> Path:
        """Write atomically to ``path`` (format from the suffix unless given)."""
        path = Path(path)
        fmt = format or ("safetensors" if path.suffix == ".safetensors" else "npz")
        return save_atomic(path, self.to_bytes(fmt))

    @classmethod
    def load(cls, path) -> "LinearMap":
        """Read a map written by :meth:`save`."""
        return cls.from_bytes(read_bytes(path))

