"""Which rows of an old corpus to re-embed: :func:`select_rows_to_embed`, coverage sampling by k-means++ seeding
(D² sampling, Arthur & Vassilvitskii 2007) on unit rows, so the K re-embedded pairs cover the corpus's regions;
``"random"`` is the baseline. :func:`d2_sample` is also the k-means seeding of :mod:`align.cluster`.
:func:`keep_native_rows` puts the re-embedded rows' own new-model vectors back into the migrated corpus.

A corpus holds copies (one text stored twice, boilerplate): a copy of a chosen row is the same vector, so neither
method picks it again; with fewer distinct rows than asked for, every distinct row is returned (fewer than ``k``)
with a :class:`~align.exceptions.VecbridgeWarning`. Before, the selection filled up with copies silently (5
distinct rows of 100, k = 10: 10 rows, 5 vectors), K pairs to embed that held fewer than K texts.
"""

from __future__ import annotations

import warnings

import numpy as np

from . import linalg
from .exceptions import (
    DegenerateInputError,
    DimensionMismatchError,
    InputError,
    PairCountError,
    TooFewRowsError,
    VecbridgeWarning,
)
from .frames import unit_rows
from .options import check_number
from .validation import as_matrix, check_random_state, row_groups

__all__ = ["distinct_rows_to_embed", "keep_native_rows", "select_rows_to_embed", "d2_sample"]


def _first_of_each(rows: np.ndarray, group: np.ndarray) -> np.ndarray:
    """``rows`` (m,) without any whose ``group`` came earlier in it: one row per group, in their order."""
    _, first = np.unique(group[rows], return_index=True)
    return rows[np.sort(first)]


def d2_sample(Z: np.ndarray, k: int, rng: np.random.Generator, *, rounds: int = 32, block: int = 8192,
              group: np.ndarray | None = None) -> np.ndarray:
    """k-means++ style seeding in ``rounds`` batches: ``k`` distinct row indices of ``Z`` (n, d).

    Each round draws ``ceil(k / rounds)`` new rows without replacement with probability ∝ the
    squared distance to the nearest row chosen so far (D² sampling, k-means|| style batches so
    the distance update is one GEMM per round); the first row is uniform. O(n k d), memory O(n).

    ``group`` (n,): the copies of each row (:func:`align.validation.row_groups`). A copy of a chosen row is never
    drawn (its squared distance is float32 rounding, ~1e-7, not 0), nor two copies in one round; once every group
    is chosen, fewer than ``k`` rows come back. Without it (every row distinct) the draws are those of before.
    """
    n = Z.shape[0]
    per = max(1, int(np.ceil(k / rounds)))
    sq = np.einsum("ij,ij->i", Z, Z)
    d2 = np.full(n, np.inf)
    chosen = [int(rng.integers(n))]
    new = np.array(chosen)
    while True:
        C = Z[new]
        csq = np.einsum("ij,ij->i", C, C)
        for s in range(0, n, block):
            part = sq[s : s + block, None] - 2.0 * (Z[s : s + block] @ C.T) + csq[None, :]
            np.minimum(d2[s : s + block], np.maximum(part.min(axis=1), 0.0), out=d2[s : s + block])
        d2[np.asarray(chosen)] = 0.0
        if group is not None:
            d2[np.isin(group, group[new])] = 0.0
        want = min(per, k - len(chosen))
        if want <= 0:
            break
        positive = int((d2 > 0).sum())
        if group is not None and positive < want:  # rows of unchosen groups only: each draw adds one at least
            if positive == 0:
                break
            want = positive
        elif positive < want:  # fewer distinct rows than k: fill with unchosen rows at random
            rest = np.setdiff1d(np.arange(n), np.asarray(chosen))
            chosen.extend(rng.choice(rest, size=k - len(chosen), replace=False).tolist())
            break
        new = rng.choice(n, size=want, replace=False, p=d2 / d2.sum())
        if group is not None:
            new = _first_of_each(new, group)
        chosen.extend(new.tolist())
    return np.asarray(chosen[:k], dtype=np.int64)


def _reduce(X: np.ndarray, rng: np.random.Generator, dims: int = 64, sample: int = 8192,
            block: int = 8192) -> np.ndarray:
    """The unit rows of ``X`` (n, d), centred and projected on their top ``dims`` principal axes (from a sample
    of ``sample`` rows) when wider: (n, min(d, dims)) float32. Distances keep most of their variance and D²
    sampling costs ``dims / d`` as much. Rows go ``block`` at a time: the only copy of the corpus is the
    (n, dims) projection, never a unit or centred copy of all of it."""
    if X.shape[1] <= dims:
        return unit_rows(X)
    S = unit_rows(X[rng.permutation(X.shape[0])[:sample]])
    mu = S.mean(axis=0)
    _, _, Vt = linalg.svd(S - mu)
    P = Vt[:dims].T
    out = np.empty((X.shape[0], P.shape[1]), dtype=np.float32)
    for s in range(0, X.shape[0], block):
        out[s : s + block] = (unit_rows(X[s : s + block]) - mu) @ P
    return out


def select_rows_to_embed(X_old, k: int, *, method: str = "kmeans++", random_state=0) -> np.ndarray:
    """Indices (k,) of the rows of ``X_old`` (n, d) to re-embed with the new model, sorted.

    ``method="kmeans++"``: D² sampling on the unit rows (cosine geometry; coverage of the corpus),
    projected on their top 64 principal axes when wider;
    ``"random"``: uniform without replacement. Same ``random_state`` → same rows.

    Never two copies of one row (bitwise-equal rows: the same vector): with fewer than ``k`` distinct rows, one row
    of each (fewer than ``k`` indices) and a VecbridgeWarning. With copies, ``"random"`` takes the first ``k``
    distinct rows of a random order (a row with more copies is likelier, as uniform sampling weighs it).
    """
    idx, distinct = distinct_rows_to_embed(X_old, k, method=method, random_state=random_state)
    if idx.size < k:
        warnings.warn(f"select_rows_to_embed: X_old holds {distinct} distinct rows of {np.shape(X_old)[0]} (the "
                      f"others are copies), fewer than the {k} asked for: {distinct} rows returned, one of each",
                      VecbridgeWarning, stacklevel=2)
    return idx


def distinct_rows_to_embed(X_old, k: int, *, method: str = "kmeans++", random_state=0) -> tuple[np.ndarray, int]:
    """:func:`select_rows_to_embed`'s rows, without its warning, and the number of distinct rows of ``X_old``: a
    caller that says it otherwise (the plan's notes) reads ``idx.size < k``."""
    X = as_matrix(X_old, name="X_old")
    # an int: "abc", None, NaN were a raw ValueError / TypeError, 2.5 and True were read as 2 and 1
    k = check_number("k", k, -float("inf"), float("inf"), whole=True)
    if not 1 <= k <= X.shape[0]:
        raise TooFewRowsError(f"cannot select {k} rows out of {X.shape[0]}")
    rng = check_random_state(random_state)
    if method not in ("kmeans++", "random"):
        raise InputError(f"method must be 'kmeans++' or 'random', got {method!r}")
    groups = row_groups(X)
    group = None if groups is None else groups[1]
    distinct = X.shape[0] if groups is None else int(groups[0].size)
    if method == "random":
        if group is None:
            return np.sort(rng.choice(X.shape[0], size=int(k), replace=False)), distinct
        return np.sort(_first_of_each(rng.permutation(X.shape[0]), group)[:k]), distinct
    return np.sort(d2_sample(_reduce(X, rng), int(k), rng, group=group)), distinct


def keep_native_rows(migrated, rows, Y_new, *, copy: bool = True, unit: bool = True) -> np.ndarray:
    """The migrated corpus with each re-embedded row's own new-model vector in place of its mapped one.

    ``migrated`` (n, d_t): the old corpus mapped into the new space (``m.apply(X_old, output="raw")``);
    ``rows`` (K,): distinct indices in [0, n) of the rows whose texts were re-embedded (e.g.
    :func:`select_rows_to_embed`'s, the map's fit pairs); ``Y_new`` (K, d_t): their new-model vectors, in ``rows``'
    order. Returns (n, d_t) float32 with ``out[rows[i]] = Y_new[i] / |Y_new[i]|`` (``unit=False``: ``Y_new[i]`` as
    given) and every other row as in ``migrated``: a map's raw output is unit rows (default frames), and a kept row
    of another length would outrank or trail the mapped ones in an inner-product or L2 index (cosine is the same
    either way). ``copy=False`` writes into ``migrated`` when it already is a writable float32 C-contiguous array
    (as sklearn's ``copy``: not guaranteed, use the returned array).

    Those rows are the migration's own pairs: a query whose relevant document is one of them then finds it as the
    new model does (WordNet reverse dictionary minilm→e5, 8,192 rows, ridge / Procrustes / auto from K = 300-3,000:
    retention of those queries 0.95-1.10 kept, 0.76-1.00 mapped; the other queries' −0.03…+0.004, native rows
    outranking a few mapped ones as their share grows), so the corpus's retention rises by about the share K / n of
    the queries times what mapping lost on them (+0.01-0.03 at K = 1,000, +0.03-0.09 at 3,000).
    """
    out = as_matrix(migrated, name="migrated")
    if (copy and isinstance(migrated, np.ndarray) and np.may_share_memory(out, migrated)) or not out.flags.writeable:
        out = out.copy()  # a float32 C-contiguous array (or a view of one, e.g. a memmap) comes back as itself
    idx = np.asarray(rows)
    if idx.ndim != 1 or idx.dtype == np.bool_ or not np.issubdtype(idx.dtype, np.integer):
        raise InputError(f"rows must be a 1-d array of integer row indices, got shape {idx.shape} dtype {idx.dtype}")
    Y = as_matrix(Y_new, name="Y_new")
    if Y.shape[0] != idx.size:
        raise PairCountError(f"Y_new holds {Y.shape[0]} rows but rows lists {idx.size}: one new-model vector per "
                             f"re-embedded row, in rows' order")
    if Y.shape[1] != out.shape[1]:
        raise DimensionMismatchError(f"Y_new has {Y.shape[1]} columns but migrated has {out.shape[1]}: both are the "
                                     f"new model's vectors")
    if idx.size and (idx.min() < 0 or idx.max() >= out.shape[0]):
        raise InputError(f"rows must be in [0, {out.shape[0]}) (migrated's rows), got [{int(idx.min())}, "
                         f"{int(idx.max())}]")
    if np.unique(idx).size != idx.size:
        raise InputError("rows lists a row more than once: each re-embedded row has one new-model vector")
    if unit:
        zero = ~Y.any(axis=1)
        if zero.any():
            raise DegenerateInputError(f"Y_new holds {int(zero.sum())} all-zero row(s) (e.g. row "
                                       f"{int(np.flatnonzero(zero)[0])}): a zero vector has no direction")
        Y = unit_rows(Y)
    out[idx] = Y
    return out
