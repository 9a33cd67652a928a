"""Lloyd k-means over row blocks (exact sums, any executor).

.. math::  c_j \\leftarrow \\frac{\\sum_{x \\in S_j} x}{|S_j|},\\qquad
           S_j = \\{x : j = \\arg\\min_l \\|x - c_l\\|^2\\}

Each iteration maps :func:`assign_block` over the blocks (through an executor, see
:mod:`align.blocks`) and adds the per-block sums and counts in block order, so the iterates are
the same whether the blocks run here or on a cluster. Empty clusters keep their centroid.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .blocks import run_blocks
from .exceptions import InputError

__all__ = ["assign_block", "lloyd", "row_blocks"]


def assign_block(X: np.ndarray, C: np.ndarray, block: int = 8192) -> tuple[np.ndarray, np.ndarray, float]:
    """Nearest centroid (squared Euclidean) of every row of ``X`` (n, d) among ``C`` (k, d).

    Returns per-centroid sums (k, d) float64, counts (k,) int64 and the inertia
    ``Σ min_j |x - c_j|²`` of the block. Never holds more than ``block × k`` distances.
    """
    k, d = C.shape
    Cd = np.asarray(C, dtype=np.float64)
    c2 = (Cd * Cd).sum(1)
    sums = np.zeros((k, d))
    counts = np.zeros(k, dtype=np.int64)
    inertia = 0.0
    for s in range(0, X.shape[0], block):
        xb = np.asarray(X[s : s + block], dtype=np.float64)
        D = c2[None, :] - 2.0 * (xb @ Cd.T)  # |x - c|² - |x|²
        lab = D.argmin(axis=1)
        inertia += float(D[np.arange(lab.shape[0]), lab].sum() + (xb * xb).sum())
        cnt = np.bincount(lab, minlength=k)
        order = np.argsort(lab, kind="stable")  # rows grouped by centroid: one reduceat instead of np.add.at
        nz = np.flatnonzero(cnt)
        starts = np.concatenate([[0], np.cumsum(cnt)[:-1]])[nz]
        sums[nz] += np.add.reduceat(xb[order], starts, axis=0)
        counts += cnt
    return sums, counts, inertia


def row_blocks(X: np.ndarray, rows: int = 65536) -> list[np.ndarray]:
    """``X`` split into consecutive row blocks (views) of ``rows`` rows."""
    return [X[s : s + rows] for s in range(0, X.shape[0], int(rows))]


def lloyd(blocks: Sequence, init, *, n_iter: int = 50, tol: float = 0.0,
          block_fn: Callable = assign_block, executor=None) -> tuple[np.ndarray, float, int]:
    """Lloyd iterations from ``init`` (k, d) over ``blocks``; returns ``(centroids (k, d) float32, inertia, iterations)``.

    ``blocks``: row blocks (arrays), or anything ``block_fn(block, C)`` turns into
    :func:`assign_block`'s result (e.g. a file shard opened where the task runs). Stops after
    ``n_iter`` iterations or when the squared centroid shift is ``<= tol``.
    """
    C = np.asarray(init, dtype=np.float64)
    if C.ndim != 2 or C.shape[0] < 1:
        raise InputError(f"init must be a (k, d) array of centroids, got shape {C.shape}")
    inertia, it = np.inf, 0
    for it in range(1, int(n_iter) + 1):
        parts = run_blocks(block_fn, [(b, C.astype(np.float32)) for b in blocks], executor)
        sums = sum(p[0] for p in parts)
        counts = sum(p[1] for p in parts)
        inertia = sum(p[2] for p in parts)
        C_new = C.copy()
        nz = counts > 0
        C_new[nz] = sums[nz] / counts[nz, None]
        shift = float(((C_new - C) ** 2).sum())
        C = C_new
        if shift <= tol:
            break
    return C.astype(np.float32), float(inertia), it
