"""Lloyd k-means over row blocks (exact sums, any executor).

.. math::  c_j \\leftarrow \\frac{\\sum_{x \\in S_j} x}{|S_j|},\\qquad
           S_j = \\{x : j = \\arg\\min_l \\|x - c_l\\|^2\\}

Each iteration maps :func:`assign_block` over the blocks (through an executor, see
:mod:`align.blocks`) and adds the per-block sums and counts in block order, so the iterates are
the same whether the blocks run here or on a cluster. Empty clusters keep their centroid.

A *block* is an array of rows (n_b, d), or anything an ``open_block(block) -> (n_b, d)`` callable
turns into one where the block's task runs (a file name, a row range of a memory-mapped file):
then only the small block descriptor travels to a worker, not the rows.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .validation import as_real_array, check_random_state
from .blocks import run_blocks
from .exceptions import DimensionMismatchError, EmptyInputError, InputError, NonFiniteError, TooFewRowsError

__all__ = ["assign_block", "kmeans", "lloyd", "init_rows", "row_blocks"]


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


def _assign_opened(block, C: np.ndarray, open_block: Callable | None) -> tuple[np.ndarray, np.ndarray, float]:
    """One block's Lloyd step (a task of the block executor): open the block where it runs, assign.

    DimensionMismatchError for a block that is not (n_b, d) with ``d`` the centroids' width;
    NonFiniteError for NaN/Inf rows (read off the block's inertia: no extra pass over the rows).
    """
    X = np.asarray(block) if open_block is None else open_block(block)
    if X.ndim != 2 or X.shape[1] != C.shape[1]:
        raise DimensionMismatchError(f"k-means block: expected rows of {C.shape[1]} columns, got shape {X.shape}")
    with np.errstate(invalid="ignore", over="ignore"):  # a non-finite result is raised just below
        out = assign_block(X, C)
    if not np.isfinite(out[2]):
        raise NonFiniteError("k-means block: rows contain NaN or Inf")
    return out


def init_rows(blocks: Sequence, k: int, *, random_state=None, open_block: Callable | None = None,
              pool_blocks: int = 4) -> np.ndarray:
    """``k`` distinct rows drawn uniformly (seeded) from the first ``pool_blocks`` blocks; (k, d) float64.

    Raises :class:`TooFewRowsError` when those blocks hold fewer than ``k`` rows.
    """
    rng = check_random_state(random_state)
    opened = [np.asarray(b) if open_block is None else open_block(b) for b in list(blocks)[: max(1, int(pool_blocks))]]
    if not opened:
        raise EmptyInputError("k-means over no blocks")
    if len({np.shape(b)[1:] for b in opened}) > 1 or np.ndim(opened[0]) != 2:
        shapes = [np.shape(b) for b in opened]
        raise DimensionMismatchError(f"k-means blocks must be (n_b, d) of one width, got {shapes}")
    pool = np.concatenate(opened)
    if pool.shape[0] < k:
        raise TooFewRowsError(f"k-means with {k} clusters needs at least {k} rows to initialise")
    C = pool[rng.choice(pool.shape[0], k, replace=False)].astype(np.float64)
    if not np.isfinite(C).all():
        raise NonFiniteError("k-means: rows drawn as starting centroids contain NaN or Inf")
    return C


def kmeans(blocks: Sequence, k: int, *, init=None, n_iter: int = 50, tol: float = 0.0, random_state=None,
           open_block: Callable | None = None, executor=None) -> tuple[np.ndarray, float, int]:
    """Lloyd k-means over row ``blocks``: ``(centroids (k, d) float32, inertia, iterations)``.

    ``init`` (k, d) starting centroids, or None: :func:`init_rows` with ``random_state``.
    ``open_block`` / ``executor``: how a block becomes rows and where its tasks run (module
    docstring); the result is the same bits for every executor.
    """
    k = int(k)
    if k < 1:
        raise InputError(f"k must be >= 1, got {k}")
    if init is None:
        C = init_rows(blocks, k, random_state=random_state, open_block=open_block)
    else:
        C = np.asarray(init, dtype=np.float64)
        if C.ndim != 2 or C.shape[0] != k:
            raise InputError(f"init must have shape ({k}, d), got {C.shape}")
    return lloyd(blocks, C, n_iter=n_iter, tol=tol, open_block=open_block, executor=executor)


def lloyd(blocks: Sequence, init, *, n_iter: int = 50, tol: float = 0.0,
          open_block: Callable | None = None, executor=None) -> tuple[np.ndarray, float, int]:
    """Lloyd iterations from ``init`` (k, d) over ``blocks``; returns ``(centroids (k, d) float32, inertia, iterations)``.

    ``blocks``: row blocks (arrays), or descriptors that ``open_block`` opens where the task
    runs. Stops after ``n_iter`` iterations or when the squared centroid shift is ``<= tol``.
    """
    as_real_array(init, name="init", ndim=2)  # real and finite (NaN centroids would attract no row or every row)
    C = np.asarray(init, dtype=np.float64)
    if C.ndim != 2 or C.shape[0] < 1:
        raise InputError(f"init must be a (k, d) array of centroids, got shape {C.shape}")
    blocks = list(blocks)
    if not blocks:
        raise EmptyInputError("k-means over no blocks")
    inertia, it = np.inf, 0
    for it in range(1, int(n_iter) + 1):
        parts = run_blocks(_assign_opened, [(b, C.astype(np.float32), open_block) for b in blocks], executor)
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
