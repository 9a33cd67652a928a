"""Blocked nearest-neighbour search by inner product; never an n × n matrix.

Queries ``Q`` (n, d) and database ``D`` (m, d) are float32 rows (unit rows make inner product
= cosine). Results follow FAISS naming: ``S`` (n, k) scores, ``I`` (n, k) indices, best first.
Uses ``faiss.knn`` (exact, inner product) when FAISS is importable, else numpy blocks of
``block_size × m`` scores — the largest block held is ``block_size * m * 4`` bytes.

CSLS (Conneau et al. 2018):

.. math::  \\mathrm{CSLS}(q, d) = 2\\cos(q, d) - r_D(q) - r_Q(d)

with ``r_D(q)`` the mean cosine of ``q`` to its ``k`` nearest rows of ``D`` (and vice versa).

A database too big for one place is searched in row blocks (:func:`knn_blocks`): each block's
top-``k`` (global ids = local id + the rows of the blocks before it), merged to the best ``k`` of
the ``k × n_blocks`` candidates — the same set as one search over the concatenation.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .validation import as_matrix, as_real_array, check_representable
from .blocks import run_blocks, serial
from .exceptions import DimensionMismatchError, InputError, ShapeError
from .options import check_flag, check_number

__all__ = ["knn", "knn_blocks", "merge_topk", "mean_topk", "csls_knn", "mutual_nn", "faiss_available", "check_count",
           "DEFAULT_BLOCK", "knn_unchecked"]

DEFAULT_BLOCK = 2048

try:  # optional accelerator
    import faiss  # type: ignore

    _HAVE_FAISS = True
except Exception:  # pragma: no cover - depends on the environment
    faiss = None
    _HAVE_FAISS = False


def faiss_available() -> bool:
    return _HAVE_FAISS


def check_count(name: str, value, lo: int = 1) -> int:
    """A neighbour count or block size: an int >= ``lo`` (InputError otherwise: ``k=2.5`` was read as 2, a
    ``block_size`` of 0 divided by zero, a negative ``csls_k`` reached FAISS as a negative array size)."""
    return check_number(name, value, lo, float("inf"), whole=True)


def _check(Q, D, k, block_size=DEFAULT_BLOCK):
    Q = as_matrix(Q, name="queries")
    D = as_matrix(D, name="database")
    if Q.shape[1] != D.shape[1]:
        raise DimensionMismatchError(f"queries have {Q.shape[1]} columns, database {D.shape[1]}")
    check_count("block_size", block_size)
    return Q, D, min(check_count("k", k), D.shape[0])


def _topk_block(S: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k of each row of a score block, sorted descending (ties: lower index first)."""
    if k >= S.shape[1]:
        idx = np.argsort(-S, axis=1, kind="stable")[:, :k]
    else:
        part = np.argpartition(-S, k - 1, axis=1)[:, :k]
        vals = np.take_along_axis(S, part, axis=1)
        # argpartition takes any members of a tie at the k-th score (duplicate rows: 20 of 50 self-queries got
        # the copy): rows with more such ties than taken get the lowest indices (one compare pass, ~1/d of the GEMM)
        kth = vals.min(axis=1)
        short = np.flatnonzero((S == kth[:, None]).sum(axis=1) > (vals == kth[:, None]).sum(axis=1))
        for r in short:
            above = np.flatnonzero(S[r] > kth[r])
            part[r] = np.concatenate([above, np.flatnonzero(S[r] == kth[r])[: k - above.size]])
        vals = np.take_along_axis(S, part, axis=1)
        order = np.lexsort((part, -vals), axis=1)
        idx = np.take_along_axis(part, order, axis=1)
    return np.take_along_axis(S, idx, axis=1), idx


def _knn_block(Q: np.ndarray, D: np.ndarray, k: int, bias_d: np.ndarray | None, use_faiss: bool):
    """Top-``k`` of one block of queries ``Q`` (b, d) against all of ``D`` (m, d): ``(S, I)`` (b, k)."""
    if use_faiss and bias_d is None:
        # FAISS's OpenMP part changes the last bits of the scores with the thread count; one OpenMP
        # thread gives the same bits in any process (FAISS's OpenBLAS is the OpenMP build, so its GEMM goes
        # serial too; numpy's pthread OpenBLAS is not: at d = 560 or 700 its Q @ D.T rounds differently
        # with 1 and 2 BLAS threads)
        prev = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(1)
        try:
            S, I = faiss.knn(np.ascontiguousarray(Q), np.ascontiguousarray(D), k, metric=faiss.METRIC_INNER_PRODUCT)
        finally:
            faiss.omp_set_num_threads(prev)
        order = np.lexsort((I, -S), axis=1)  # ties: lower index first, as the numpy path (FAISS put a copy first)
        return np.take_along_axis(S, order, axis=1), np.take_along_axis(I, order, axis=1).astype(np.int64, copy=False)
    S = Q @ D.T
    if bias_d is not None:
        S += bias_d
    return _topk_block(S, k)


def knn_unchecked(Q: np.ndarray, D: np.ndarray, k: int, *, block_size: int = DEFAULT_BLOCK,
                  use_faiss: bool | None = None, bias_d: np.ndarray | None = None, executor=None):
    """Guts of :func:`knn` for valid float32 input, unchecked (the caller holds checked float32 rows).
    ``bias_d`` (m,) is added to every score.

    Queries go in blocks of at most ``8 * block_size`` rows with FAISS (``block_size`` without), all
    of one size (the last may be a few rows shorter), one :func:`_knn_block` call each, through
    ``executor`` (:mod:`align.blocks`; default serial). Equal blocks keep parallel executors busy to
    the end: 50,000 rows go as 4 x 12,500, not 3 x 16,384 + 848 (at most 1.5x on two workers).
    The split depends only on ``n`` and ``block_size``, never on the executor.
    """
    use_faiss = _HAVE_FAISS if use_faiss is None else (use_faiss and _HAVE_FAISS)
    n = Q.shape[0]
    step = block_size * 8 if (use_faiss and bias_d is None) else block_size
    step = max(1, -(-n // -(-n // step))) if n > step else step  # ceil(n / number of blocks)
    starts = range(0, n, step)
    parts = run_blocks(_knn_block, [(Q[s : s + step], D, k, bias_d, use_faiss) for s in starts], executor)
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return np.empty((0, k), np.float32), np.empty((0, k), np.int64)
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def knn(Q, D, k: int = 10, *, block_size: int = DEFAULT_BLOCK, use_faiss: bool | None = None, executor=None):
    """Exact top-``k`` inner-product neighbours of each query row in ``D``.

    Returns
    -------
    S : ndarray (n, min(k, m)) float32, scores best first (``m`` rows in ``D``: a ``k`` past ``m`` gives all ``m``)
    I : ndarray (n, min(k, m)) int64, row indices into ``D``
    """
    Q, D, k = _check(Q, D, k, block_size)
    if use_faiss is not None:
        check_flag("use_faiss", use_faiss)  # "no" is truthy: it chose FAISS
    with np.errstate(over="ignore", invalid="ignore"):
        S, I = knn_unchecked(Q, D, k, block_size=block_size, use_faiss=use_faiss, executor=executor)
    return _checked(S, "knn scores"), I


def _checked(S: np.ndarray, what: str) -> np.ndarray:
    """``S`` when every score is finite, else NotRepresentableError: finite rows near float32's range overflow
    in their inner products (FAISS then ranked an Inf first, numpy gave NaN scores with arbitrary ids)."""
    with np.errstate(invalid="ignore"):
        return check_representable(S, what)


def _db_block_topk(Q: np.ndarray, block, k: int, open_block: Callable | None):
    """Top-``k`` of ``Q`` in one database block (a task of the block executor): ``(S, I local, rows)``."""
    D = as_matrix(block if open_block is None else open_block(block), name="database block")
    if D.shape[1] != Q.shape[1]:
        raise DimensionMismatchError(f"queries have {Q.shape[1]} columns, a database block {D.shape[1]}")
    with np.errstate(over="ignore", invalid="ignore"):
        S, I = knn_unchecked(Q, D, min(k, D.shape[0]), executor=serial)
    return S, I, int(D.shape[0])


def merge_topk(parts: Sequence[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Best ``k`` of per-block candidates ``(S_b, I_b)`` (n, k_b) with global ids; ties: lower id first."""
    S = np.concatenate([p[0] for p in parts], axis=1)
    I = np.concatenate([p[1] for p in parts], axis=1)
    order = np.lexsort((I, -S), axis=1)[:, :k]
    return np.take_along_axis(S, order, axis=1), np.take_along_axis(I, order, axis=1)


def knn_blocks(Q, db_blocks: Sequence, k: int = 10, *, open_block: Callable | None = None, executor=None):
    """Exact top-``k`` of ``Q`` (n, d) over a database given as row blocks, one task per block.

    ``db_blocks``: arrays (m_b, d), or descriptors that ``open_block`` opens where the task runs
    (a file, a row range); ``executor``: where the tasks run (:mod:`align.blocks`). Returns
    ``(S, I)`` (n, min(k, m)) with ``I`` global row ids in the concatenation of the blocks — the
    same as :func:`knn` over the concatenation (ties towards the lower global id).
    """
    Q = as_matrix(Q, name="queries")
    k = check_count("k", k)
    parts = run_blocks(_db_block_topk, [(Q, b, int(k), open_block) for b in db_blocks], executor)
    if not parts:
        raise InputError("knn_blocks needs at least one database block")
    for S, _, _ in parts:
        _checked(S, "knn scores")
    offsets = np.cumsum([0] + [p[2] for p in parts[:-1]])
    return merge_topk([(S, I + off) for (S, I, _), off in zip(parts, offsets)], int(k))


def mean_topk(Q: np.ndarray, D: np.ndarray, k: int = 10, **kw) -> np.ndarray:
    """``r_D(q)``: mean of the ``k`` largest inner products of each query with ``D``; shape (n,)."""
    k = min(k, D.shape[0])
    return knn_unchecked(Q, D, k, **kw)[0].mean(axis=1)


def _radii(r, n: int, name: str) -> np.ndarray:
    """Caller-given CSLS radii ``r`` as a finite (n,) float32 array, else a typed InputError: one value was broadcast
    to every row (wrong scores), other lengths were raw numpy errors, NaN an overflow message."""
    r = as_real_array(r, name=name, ndim=1)  # real, finite, float32
    if r.shape != (n,):
        raise ShapeError(f"{name} must hold one value per row, shape ({n},), got {r.shape}")
    return r


def csls_knn(Q, D, k: int = 1, *, csls_k: int = 10, r_q: np.ndarray | None = None, r_d: np.ndarray | None = None,
             block_size: int = DEFAULT_BLOCK):
    """Top-``k`` neighbours by CSLS score; returns ``(S, I)`` with CSLS scores.

    ``r_q`` (n,) / ``r_d`` (m,) may be passed when already known (they are the mean top-``csls_k``
    similarities of each row to the other set).
    """
    Q, D, k = _check(Q, D, k, block_size)
    check_count("csls_k", csls_k)  # 0 made r_q, r_d the mean of nothing: NaN scores with arbitrary ids
    with np.errstate(over="ignore", invalid="ignore"):
        r_d = mean_topk(D, Q, csls_k, block_size=block_size) if r_d is None else _radii(r_d, D.shape[0], "r_d")
        r_q = mean_topk(Q, D, csls_k, block_size=block_size) if r_q is None else _radii(r_q, Q.shape[0], "r_q")
        S, I = knn_unchecked(Q * 2.0, D, k, block_size=block_size, bias_d=-np.asarray(r_d, np.float32))
        S = S - np.asarray(r_q, np.float32)[:, None]
    return _checked(S, "CSLS scores"), I


def mutual_nn(Q: np.ndarray, D: np.ndarray, *, csls_k: int = 0, block_size: int = DEFAULT_BLOCK):
    """Mutual nearest neighbours between rows of ``Q`` and ``D``.

    Returns ``(iq, id, score)``: index arrays of the mutual pairs and their scores (cosine, or
    CSLS when ``csls_k > 0``).
    """
    Q, D, _ = _check(Q, D, 1, block_size)
    with np.errstate(over="ignore", invalid="ignore"):
        return _mutual_nn(Q, D, check_count("csls_k", csls_k, lo=0), block_size)


def _mutual_nn(Q: np.ndarray, D: np.ndarray, csls_k: int, block_size: int):
    if csls_k > 0:
        r_q = check_representable(mean_topk(Q, D, csls_k, block_size=block_size), "CSLS radii")  # finite input:
        r_d = check_representable(mean_topk(D, Q, csls_k, block_size=block_size), "CSLS radii")  # overflow
        s_f, fwd = csls_knn(Q, D, 1, r_q=r_q, r_d=r_d, block_size=block_size)
        _, bwd = csls_knn(D, Q, 1, r_q=r_d, r_d=r_q, block_size=block_size)
    else:
        s_f, fwd = knn_unchecked(Q, D, 1, block_size=block_size)
        s_b, bwd = knn_unchecked(D, Q, 1, block_size=block_size)
        _checked(s_f, "knn scores"), _checked(s_b, "knn scores")
    fwd, bwd = fwd[:, 0], bwd[:, 0]
    iq = np.nonzero(bwd[fwd] == np.arange(Q.shape[0]))[0]
    return iq, fwd[iq], s_f[iq, 0]
