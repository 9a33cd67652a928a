"""The one place where input arrays are checked and converted.

Public functions call these helpers once; private ``_guts`` functions assume valid input
(float32, C-contiguous, 2-D, finite).
"""

from __future__ import annotations

import numpy as np

from .exceptions import (
    NotRepresentableError,
    DegenerateInputError,
    DimensionMismatchError,
    EmptyInputError,
    InputError,
    NonFiniteError,
    PairCountError,
    ShapeError,
    TooFewRowsError,
)

__all__ = ["as_matrix", "copies_whole", "as_real_array", "check_paired", "check_random_state", "check_seed",
           "check_not_degenerate", "check_no_underflow", "check_no_zero_rows", "check_rankable", "check_representable",
           "check_eps", "check_labels", "check_labelled_queries", "check_same_queries", "check_csls_weight",
           "collapsed", "check_not_collapsed", "seed_record", "count_distinct_rows", "row_groups", "MAX_EPS",
           "nonfinite_error"]

#: Bound of a steer's strength ``|eps|`` (1: the trained strength) wherever a steer moves vectors: the library
#: (:func:`check_eps`), the CLI and HTTP (``service.limits.MAX_STEER_EPS`` is this number). Strength sweeps saturate
#: below 100; past the bound the answer is the steer's direction alone (``service.limits`` says why).
MAX_EPS = 1000.0

_CHECK_BYTES = 1 << 20  # the masks of a check cover about this many bytes of rows at a time
_F32 = np.dtype(np.float32)
_all_true, _any_true = np.logical_and.reduce, np.logical_or.reduce  # ndarray.all / np.any without their wrappers


def _row_step(arr: np.ndarray) -> int:
    """Rows per block of a check of ``arr`` (n, d): a mask of the whole input would be n*d bytes."""
    return max(1, _CHECK_BYTES // max(1, arr.shape[1] * arr.itemsize))


def _rows_where(arr: np.ndarray, test) -> int:
    """How many rows of ``arr`` (n, d) have ``test(block)`` (a (b, d) mask) true somewhere; block by block."""
    step = _row_step(arr)
    return sum(int(test(arr[s : s + step]).any(axis=1).sum()) for s in range(0, arr.shape[0], step))


def _nonfinite_rows(arr: np.ndarray) -> int:
    """Rows of ``arr`` (n, d) holding NaN or Inf, one block's mask at a time (rows counted only on a miss)."""
    if arr.nbytes <= _CHECK_BYTES and _all_true(np.isfinite(arr), axis=None):  # one block, all finite: the usual
        return 0  # answer to a request, without the loop's calls (a batch-1 query: half of this check's time)
    step, bad = _row_step(arr), 0
    for s in range(0, arr.shape[0], step):
        if not np.isfinite(arr[s : s + step]).all():
            bad += _rows_where(arr[s : s + step], lambda b: ~np.isfinite(b))
    return bad


def _rows_hit(arr: np.ndarray, test, limit: int = 10) -> tuple[int, np.ndarray]:
    """``(count, first)``: how many rows of ``arr`` (n, d) have ``test(block)`` (a (b, d) mask) true somewhere, and
    the first ``limit`` of them (indices into ``arr``); block by block."""
    step, count, first = _row_step(arr), 0, []
    for s in range(0, arr.shape[0], step):
        hit = np.flatnonzero(test(arr[s : s + step]).any(axis=1))
        count += hit.size
        first.extend((hit[: max(0, limit - len(first))] + s).tolist())
    return count, np.asarray(first, dtype=np.int64)


def _rows_error(name: str, test, arr: np.ndarray, what: str, rows_at, fix: str = "") -> NonFiniteError:
    """The NonFiniteError naming the rows of ``arr`` where ``test`` holds (``what`` they hold; ``fix``: what to do,
    after the rows). ``rows_at``: None (``arr`` is the whole input: its rows counted and the first named by index),
    or ``arr`` is a block of a file read block by block: the file row of its first row (int) or of each of its rows
    (array); the first are named as those input rows, and the count is a floor (later rows were not read)."""
    count, first = _rows_hit(arr, test)
    more = ", ..." if count > first.size else ""
    if rows_at is None:
        at, where = first, f"{count} row(s) {what} (row{'s' if count > 1 else ''} "
    else:
        at = first + rows_at if isinstance(rows_at, (int, np.integer)) else np.asarray(rows_at)[first]
        where = f"at least {count} row(s) {what} (input row{'s' if count > 1 else ''} "
    return NonFiniteError(f"{name}: {where}{', '.join(map(str, at.tolist()))}{more}){fix}")


_ZERO_QUERY = "no direction to rank by (it would tie with every document and count as a hit)"


def check_representable(Y: np.ndarray, what: str) -> np.ndarray:
    """Return ``Y`` if every value is finite; else :class:`NotRepresentableError`.

    For results computed from finite input: an Inf/NaN there means float32 overflowed, and
    returning it would give JSON ``null``, Inf in binary answers, or scores of 0 with arbitrary ids.
    """
    if not np.isfinite(Y).all():
        bad = int((~np.isfinite(Y)).any(axis=1).sum()) if Y.ndim == 2 else int((~np.isfinite(Y)).sum())
        raise NotRepresentableError(
            f"{what}: {bad} row(s) overflow float32 (values beyond ±3.4e38); scale the input or the strength down")
    return Y


def check_no_underflow(wide: np.ndarray, narrow: np.ndarray, name: str) -> None:
    """:class:`NotRepresentableError` when a non-zero row of ``wide`` (n, d), e.g. float64, reads as an all-zero row
    in ``narrow``, its float32 copy: every value below float32's smallest subnormal (~1.4e-45). Nothing to check
    for a ``wide`` of float32 or narrower, or not of floats."""
    if wide.dtype.kind != "f" or wide.dtype.itemsize <= 4:
        return
    step, lost = _row_step(wide), 0
    for s in range(0, wide.shape[0], step):
        zero = ~_any_true(narrow[s : s + step], axis=1)  # a float read as a truth: non-zero (NaN too, as != 0)
        if _any_true(zero, axis=None):
            lost += int(_any_true(wide[s : s + step][zero], axis=1).sum())
    if lost:
        raise NotRepresentableError(f"{name}: {lost} non-zero row(s) have every value below float32's smallest "
                                    f"(~1.4e-45) and would read as all-zero rows; scale them up")


def copies_whole(X) -> bool:
    """Whether :func:`as_matrix` would copy ``X`` whole into a new float32 array: a 2-D numpy array (a memmap too) of
    real numbers other than C-contiguous float32 (float16, float64, ints, Fortran order). A map's apply converts
    such an array a piece of rows at a time (:meth:`align._artifacts.StoredMap._apply_pieces`)."""
    return (isinstance(X, np.ndarray) and not np.ma.isMaskedArray(X) and X.ndim == 2 and X.dtype.kind in "fiu"
            and not (X.dtype == _F32 and X.flags.c_contiguous))


def _beyond_float32(arr: np.ndarray, name: str, rows_at=None) -> NonFiniteError | None:
    """The NonFiniteError for the rows of ``arr`` (wider floats) holding finite values float32 cannot hold (they
    would become Inf), counted block by block (``rows_at`` as :func:`_rows_error`); None when there are none or
    ``arr`` is not of wider floats."""
    if arr.dtype.kind != "f" or arr.dtype.itemsize <= 4:
        return None
    f32max = np.finfo(np.float32).max
    # one block whose largest magnitude fits (NaN and Inf fail the test): none to count, without the count's calls
    # (a JSON request: half of as_matrix's time for a batch-1 transform)
    if arr.nbytes <= _CHECK_BYTES and float(np.abs(arr).max(initial=0.0)) <= float(f32max):
        return None
    def huge(b):
        return np.isfinite(b) & (np.abs(b) > f32max)

    with np.errstate(invalid="ignore"):
        if not _rows_where(arr, huge):
            return None
        return _rows_error(name, huge, arr, "hold values beyond float32's range (±3.4e38)", rows_at,
                           "; scale them down")


def _nonfinite(b: np.ndarray) -> np.ndarray:
    return ~np.isfinite(b)


def nonfinite_error(X: np.ndarray, name: str, rows_at=None) -> NonFiniteError:
    """The NonFiniteError :func:`as_matrix` raises for ``X`` (n, d) whole (``rows_at`` as there), counted a block of
    rows at a time without converting ``X``: for an apply that met it in one piece of ``X`` (that piece's count was
    not the input's)."""
    return _beyond_float32(X, name, rows_at) or _rows_error(name, _nonfinite, X, "contain NaN or Inf", rows_at)


def _where_text(X) -> str:
    """Where the first string of the rows ``X`` (lists) is, as the start of a message ("" if not found)."""
    rows = X if isinstance(X, (list, tuple)) else ()
    for i, row in enumerate(rows):
        for j, value in enumerate(row if isinstance(row, (list, tuple)) else (row,)):
            if isinstance(value, (str, bytes)):
                shown = value if len(value) <= 40 else value[:40] + "..."
                return f"row {i}, column {j} holds the string {shown!r}: " if row is not value else \
                    f"row {i} is the string {shown!r}: "
    return ""


def as_matrix(
    X,
    *,
    name: str = "X",
    dim: int | None = None,
    min_rows: int = 1,
    what: str = "rows",
    finite: bool = True,
    rows_at: int | np.ndarray | None = None,
) -> np.ndarray:
    """Return ``X`` as a finite, 2-D, C-contiguous float32 array.

    Parameters
    ----------
    X : array-like, shape (n, d)
        Real numbers (float, int). Booleans are refused (a mask passed by mistake; ``X.astype(np.float32)``
        passes 0/1 on purpose), and so is a masked array with any masked entry (the mask would be dropped).
    name : str
        Used in error messages.
    dim : int, optional
        Required number of columns ``d``.
    min_rows : int
        Required minimum number of rows ``n``.
    what : str
        What the rows are needed for, for the TooFewRowsError message.
    finite : bool
        Check that every value is finite (one pass). ``False`` is for callers that check it
        themselves on the way, from a reduction they compute anyway (e.g. row norms).
    rows_at : int or array, optional
        ``X`` is a block of a file read block by block: the file row of its first row, or of each of its rows
        (rows listed). A NaN / Inf or float32 overflow error names the first such rows as those input rows and
        counts them as a floor (the file's later rows were not read). None: ``X`` is the whole input.

    Raises
    ------
    ShapeError, EmptyInputError, DimensionMismatchError, TooFewRowsError, NonFiniteError, InputError
    """
    f32 = type(X) is np.ndarray and X.dtype == _F32  # the usual input (a decoded request, a map's output): float32
    if f32:  # passes every dtype check, and its conversion below is a no-op (a copy only when not C-contiguous)
        arr = X
    else:
        try:
            arr = np.asarray(X)
        except Exception as exc:  # ragged lists and the like
            raise InputError(f"{name}: cannot be read as a numeric array ({exc})") from None
        if arr.dtype == np.bool_:  # read as 0/1 without a word; far more often a mask (X > 0) than an embedding
            raise InputError(f"{name}: a boolean array (dtype bool, a mask?) is not vectors; to pass 0/1 on purpose, "
                             f"convert it: X.astype(np.float32)")
        if arr.dtype.kind in "US":  # a string among numbers made every value a string: say which one, and why
            raise InputError(f"{name}: {_where_text(X)}strings are not numbers (expected a numeric array, got dtype "
                             f"{arr.dtype}); send numbers, unquoted")
        if arr.dtype == object or arr.dtype.kind in "mM" or not np.issubdtype(arr.dtype, np.number):
            column = arr.dtype == object and arr.ndim == 1 and arr.size and isinstance(arr[0], (np.ndarray, list))
            raise InputError(f"{name}: expected a numeric array, got dtype {arr.dtype}"  # timedelta64 is a number
                             + ("; a column of vectors (a pandas Series of arrays) is one array once stacked: "
                                "np.stack(column)" if column else ""))
        if np.ma.isMaskedArray(X) and np.ma.getmaskarray(X).any():  # np.asarray drops the mask without a word
            raise InputError(f"{name}: a masked array with masked entries; their hidden values would be read as "
                             f"numbers (fill them, X.filled(...), or drop those rows)")
        if np.iscomplexobj(arr):
            raise InputError(f"{name}: complex values are not supported")
    if arr.ndim != 2:
        raise ShapeError(f"{name}: expected a 2-D array of shape (n_rows, dim), got {arr.ndim}-D shape {arr.shape}"
                         + ("; one vector is one row: x.reshape(1, -1)" if arr.ndim == 1 else ""))
    n, d = arr.shape
    if n == 0 or d == 0:
        raise EmptyInputError(f"{name}: expected at least one row and one column, got shape {arr.shape}")
    if dim is not None and d != dim:
        raise DimensionMismatchError(f"{name}: expected {dim} columns, got {d}")
    if n < min_rows:
        raise TooFewRowsError(f"{name}: {what} needs at least {min_rows} rows, got {n}")
    if f32:
        arr = np.ascontiguousarray(arr)
    else:
        huge = _beyond_float32(arr, name, rows_at)  # finite values float32 cannot hold would become Inf
        if huge is not None:
            raise huge
        wide, arr = arr, np.ascontiguousarray(arr, dtype=np.float32)
        check_no_underflow(wide, arr, name)
    if finite:  # block by block: a mask of the whole input was a quarter of its float32 size
        if _nonfinite_rows(arr):
            raise _rows_error(name, _nonfinite, arr, "contain NaN or Inf", rows_at)
    return arr


def as_real_array(value, *, name: str, ndim: int | None = None) -> np.ndarray:
    """``value`` as a C-contiguous float32 array of finite real numbers (``ndim`` dimensions unless None).

    For the arrays a map is made of (``W``, a bias, centroids), handed in or read from an artifact:
    InputError for anything but real numbers (strings, objects; complex values would lose their
    imaginary part), ShapeError for the wrong ``ndim``, NonFiniteError for NaN/Inf or values beyond
    float32's range (they would become Inf).
    """
    arr = np.asarray(value)
    if arr.dtype.kind not in "biuf":
        raise InputError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    if ndim is not None and arr.ndim != ndim:
        raise ShapeError(f"{name} must be a {ndim}-D array, got shape {arr.shape}")
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.ascontiguousarray(arr, dtype=np.float32)
    if _nonfinite_rows(out.reshape(-1, 1)):  # a view, checked a block's mask at a time, never the whole's
        raise NonFiniteError(f"{name} contains NaN or Inf (or values beyond float32's range)")
    return out


def check_paired(X, Y, *, names=("X", "Y"), min_rows: int = 1):
    """Validate two arrays whose rows are paired (same row count)."""
    X = as_matrix(X, name=names[0], min_rows=min_rows, what="a paired fit")
    Y = as_matrix(Y, name=names[1], min_rows=min_rows, what="a paired fit")
    if X.shape[0] != Y.shape[0]:
        raise PairCountError(
            f"{names[0]} and {names[1]} must have the same number of rows (paired), "
            f"got {X.shape[0]} and {Y.shape[0]}"
        )
    return X, Y


def pair_groups(X: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Exact duplicate pairs of ``X`` (n, d_s) / ``Y`` (n, d_t), row i with row i: ``(first, group)`` with
    ``first`` the sorted rows that open a distinct pair and ``group`` (n,) the index into ``first`` of each
    row's pair; None when every pair is distinct. A held-out split that leaves a copy of a training pair on
    the other side scores memorisation: callers split the distinct pairs instead."""
    def _ids(A: np.ndarray) -> np.ndarray:
        rows = np.ascontiguousarray(A).view(np.dtype((np.void, A.dtype.itemsize * A.shape[1]))).ravel()
        return np.unique(rows, return_inverse=True)[1].ravel()

    gx, gy = _ids(X), _ids(Y)
    return _groups_of(gx.astype(np.int64) * (int(gy.max()) + 1) + gy)


def row_groups(X: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Bitwise-equal rows of ``X`` (n, d), as :func:`pair_groups` gives them for pairs: ``(first, group)``, or None
    when every row is distinct. Rows are compared by the 64-bit hashes of :func:`count_distinct_rows` (O(n d) time,
    8 bytes a row); a rare false match only joins two rows in one group."""
    return _groups_of(np.concatenate(list(_row_hash_blocks(X))))


def _groups_of(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``(first, group)`` of the equal values of ``keys`` (n,), groups numbered by their first row; None if all
    differ."""
    _, first, group = np.unique(keys, return_index=True, return_inverse=True)
    if first.size == keys.shape[0]:
        return None
    order = np.argsort(first)
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return first[order], rank[group.ravel()]


def distinct_pairs(X: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """``(X', Y', repeated)``: the distinct pairs of ``X`` (n, d_s) / ``Y`` (n, d_t), each at its first row
    (:func:`pair_groups`), and how many rows repeated one. Held-out scores are of these: a copy of a pair is its own
    nearest native row, so ``nn_retention`` found it through the map by memory (a tenth of the pairs twice: 0.74 read
    0.78) and the copy of another pair pushed ranks down."""
    groups = pair_groups(X, Y)
    if groups is None:
        return X, Y, 0
    return X[groups[0]], Y[groups[0]], int(X.shape[0] - groups[0].size)


def check_not_degenerate(X: np.ndarray, *, name: str = "X", tol: float = 1e-6) -> None:
    """Raise DegenerateInputError when all rows of ``X`` are (numerically) identical."""
    if X.shape[0] < 2:
        return
    spread = float(np.abs(X - X[:1]).max())
    scale = float(np.abs(X).max()) or 1.0
    if spread <= tol * scale:
        raise DegenerateInputError(f"{name}: all {X.shape[0]} rows are identical; nothing to align")


def count_distinct_rows(X: np.ndarray, *, stop_at: int | None = None) -> int:
    """How many distinct rows ``X`` (n, d) holds (bitwise-equal rows count once), or ``stop_at`` as soon as that many
    are found. Each row is hashed to 64 bits (a random linear hash of its 32-bit words, block by block) and the
    hashes are counted: O(n d) time, 8 bytes per row, never an n x n comparison; two different rows share a hash
    with probability about 2^-32, which can only undercount."""
    A = np.ascontiguousarray(X)
    if A.ndim != 2 or A.shape[0] < 2:
        return int(A.shape[0]) if A.ndim >= 1 else 1
    if stop_at is None:
        return int(np.unique(np.concatenate(list(_row_hash_blocks(A)))).size)
    seen = np.zeros(0, np.uint64)
    for hashes in _row_hash_blocks(A):  # fewer than stop_at distinct so far: a short array to merge with
        seen = np.unique(np.concatenate([seen, hashes]))
        if seen.size >= stop_at:
            return int(stop_at)
    return int(seen.size)


def _row_hash_blocks(X: np.ndarray):
    """The hashes of the rows of ``X`` (n, d), block by block: the 64-bit hash of each row (see
    :func:`count_distinct_rows`), a block of about ``_CHECK_BYTES`` of words at a time."""
    A = np.ascontiguousarray(X)
    words = A.reshape(A.shape[0], -1).view(np.uint8)
    if words.shape[1] % 4 == 0:
        words = words.view(np.uint32)
    coef = np.random.default_rng(0x5EED).integers(1, 2**63, size=words.shape[1], dtype=np.uint64) | np.uint64(1)
    step = max(1, _CHECK_BYTES // (8 * max(1, words.shape[1])))
    for s in range(0, words.shape[0], step):
        with np.errstate(over="ignore"):  # the hash wraps modulo 2^64 on purpose
            yield (words[s : s + step].astype(np.uint64) * coef).sum(axis=1, dtype=np.uint64)


def check_no_zero_rows(X: np.ndarray, *, name: str = "X", why: str = "no direction") -> np.ndarray:
    """``X`` unchanged, or DegenerateInputError when a row is all zeros (``why`` says what it would break:
    a zero row ties with every document, or scores 0 against every query)."""
    if X.ndim == 2 and X.shape[0] == 1 and np.count_nonzero(X):  # one query: one C call, not a mask and two reduces
        return X
    nonzero = _any_true(X != 0, axis=1)
    if not _all_true(nonzero):
        raise DegenerateInputError(f"{name}: {int((~nonzero).sum())} all-zero row(s); {why}")
    return X


#: A row whose norm is this many times the median row norm is not a row of the same embedding space (norms of
#: one model's rows stay within an order or two of each other): see :func:`check_row_scale`
ROW_SCALE_RATIO = 1e6


def check_row_scale(X: np.ndarray, *, name: str = "X") -> np.ndarray:
    """``X`` unchanged, or DegenerateInputError naming the rows whose norm is over :data:`ROW_SCALE_RATIO` times
    the median nonzero row norm: a fit that averages rows (a steer's mean direction) would follow that one row,
    silently; its squares may also overflow float32. Norms are computed in float64."""
    norms = np.sqrt(np.einsum("ij,ij->i", X, X, dtype=np.float64))
    nonzero = norms[norms > 0]
    if nonzero.size == 0:
        return X
    med = float(np.median(nonzero))
    far = np.flatnonzero(norms > ROW_SCALE_RATIO * med)
    if far.size:
        raise DegenerateInputError(
            f"{name}: {far.size} row(s) have a norm over {ROW_SCALE_RATIO:g} times the median row norm ({med:.3g}), "
            f"e.g. row {int(far[0])} with {norms[far[0]]:.3g}; rows of one embedding space have norms of one "
            f"order: check those rows (corrupt, or from another space), or normalise the rows")
    return X


def check_rankable(X: np.ndarray, *, name: str) -> np.ndarray:
    """``X`` unchanged, or DegenerateInputError when its rows cannot be ranked against each other: an all-zero
    row (no direction), or every row the same. Held-out metrics count a tie with the true partner as a hit
    (duplicate texts must not count against a map), so either would score a map perfect on data that says
    nothing; an evaluation gate must fail instead."""
    check_no_zero_rows(X, name=name, why="no direction to rank by (it would tie with every row and count as a hit)")
    try:
        check_not_degenerate(X, name=name)
    except DegenerateInputError:
        raise DegenerateInputError(f"{name}: all {X.shape[0]} rows are identical; nothing to rank (each would tie "
                                   f"with its partner and count as a hit)") from None
    return X


#: mapped rows whose every coordinate is within this share of the largest of one row are one point to a ranking:
#: every score ties within :data:`align.metrics.TIE_TOL` (1e-5), and a tie with the true partner counts as a hit
COLLAPSE_TOL = 1e-5


def collapsed(M: np.ndarray) -> bool:
    """Whether the rows of ``M`` (n, d), n >= 2, are all (numerically) one vector or all zero: a map's output that
    ranks every candidate equal, so a tie-counts-as-hit metric would score it perfect."""
    if M.shape[0] < 2:
        return not np.any(M != 0)
    scale = float(np.abs(M).max())
    return scale == 0.0 or float(np.abs(M - M[:1]).max()) <= COLLAPSE_TOL * scale


def check_not_collapsed(M: np.ndarray, *, name: str) -> np.ndarray:
    """``M`` unchanged, or DegenerateInputError when a map sent every row to one vector (or to zero rows): each
    candidate would tie with the true partner and count as a hit, scoring a map that says nothing perfect."""
    zero = ~np.any(M != 0, axis=1)
    if zero.any() or collapsed(M):
        what = f"{int(zero.sum())} all-zero row(s)" if zero.any() else f"all {M.shape[0]} rows one vector"
        raise DegenerateInputError(f"{name}: the map's output has {what}; nothing to rank (every candidate "
                                   f"would tie with the true one and count as a hit)")
    return M


def check_labelled_queries(queries, relevant, n_docs: int, *, dim: int, rows: str = "document"
                           ) -> tuple[np.ndarray, np.ndarray]:
    """Labelled queries: ``(Q (q, dim) float32, rel (q,) int64)``, each ``rel[i]`` the row in ``[0, n_docs)`` of
    query ``i``'s relevant document (``rows`` names those rows in messages); typed errors otherwise, an
    all-zero query included (it would tie with every document)."""
    Q = check_no_zero_rows(as_matrix(queries, name="queries", dim=dim), name="queries", why=_ZERO_QUERY)
    rel = np.asarray(relevant)
    if rel.ndim != 1 or rel.size != Q.shape[0]:
        raise PairCountError(f"relevant must hold one {rows} row per query ({Q.shape[0]}), got shape {rel.shape}")
    if rel.dtype == np.bool_ or not np.issubdtype(rel.dtype, np.integer):
        raise InputError(f"relevant must be integer {rows} rows, got dtype {rel.dtype}")
    if rel.min() < 0 or rel.max() >= n_docs:
        raise InputError(f"relevant rows must be in [0, {n_docs}), got [{int(rel.min())}, {int(rel.max())}]")
    return Q, rel.astype(np.int64)


def check_same_queries(old_queries, n_queries: int, *, dim: int) -> np.ndarray:
    """The labelled queries under the old model: (n_queries, dim) float32, no all-zero row; typed errors otherwise."""
    Qo = check_no_zero_rows(as_matrix(old_queries, name="old_queries", dim=dim), name="old_queries", why=_ZERO_QUERY)
    if Qo.shape[0] != n_queries:
        raise PairCountError(f"old_queries must be the same {n_queries} queries under the old model, "
                             f"got {Qo.shape[0]} rows")
    return Qo


def check_csls_weight(weight) -> float:
    """The CSLS weight of the document term, a number in [0, 2] (NaN and bools refused), as a float."""
    if isinstance(weight, bool) or not isinstance(weight, (int, float, np.integer, np.floating)) \
            or not 0.0 <= float(weight) <= 2.0:
        raise InputError(f"csls_weight must be a number between 0 and 2, got {weight!r}")
    return float(weight)


def check_random_state(random_state) -> np.random.Generator:
    """Turn ``None`` / int ≥ 0 / Generator / legacy ``np.random.RandomState`` into a numpy Generator (InputError for
    anything else). A RandomState seeds a new Generator with a number drawn from it, so it is consumed as
    scikit-learn consumes one: the same state gives the same result, and the next call another."""
    check_seed(random_state)
    if isinstance(random_state, np.random.Generator):
        return random_state
    if isinstance(random_state, np.random.RandomState):  # refused before: sklearn-style code passes one
        return np.random.default_rng(int(random_state.randint(0, 2**31 - 1)))
    return np.random.default_rng(random_state)


def check_seed(random_state) -> None:
    """:func:`check_random_state`'s refusal alone, drawing nothing: a check made before the fit (``check_params``,
    a sample not taken) does not consume a RandomState, so the fit after it draws as a fit alone would."""
    if isinstance(random_state, (np.random.Generator, np.random.RandomState)) or random_state is None or (
            isinstance(random_state, (int, np.integer)) and not isinstance(random_state, (bool, np.bool_))
            and random_state >= 0):
        return
    raise InputError(f"random_state must be None, an int >= 0, a numpy Generator (np.random.default_rng(seed)) or "
                     f"a np.random.RandomState, got {random_state!r}")


def seed_record(random_state) -> int | str | None:
    """``random_state`` as a fit's metadata records it (JSON): an int for an int or a numpy integer, None for None,
    ``"generator"`` for a numpy Generator or RandomState (its state is not a seed to record)."""
    if isinstance(random_state, (int, np.integer)) and not isinstance(random_state, (bool, np.bool_)):
        return int(random_state)
    return None if random_state is None else "generator"


def check_eps(eps) -> float:
    """The steering strength ``eps`` as a finite float with ``|eps| <=`` :data:`MAX_EPS` (NonFiniteError for NaN /
    inf, InputError otherwise: the README's "|eps| <= 1000 as everywhere" held for the CLI and HTTP only)."""
    if isinstance(eps, (str, bytes, bool, np.bool_)):  # float("1") and float(True) read them as numbers
        raise InputError(f"eps must be a real number, got {eps!r}")
    try:
        value = float(eps)
    except (TypeError, ValueError):
        raise InputError(f"eps must be a real number, got {eps!r}") from None
    if not np.isfinite(value):
        raise NonFiniteError(f"eps must be finite, got {value}")
    if abs(value) > MAX_EPS:
        raise InputError(f"eps must be in [-{MAX_EPS:g}, {MAX_EPS:g}] (1 is the trained strength), got {value:g}")
    return value


def check_labels(labels, n: int) -> np.ndarray:
    """Labels as an int8 array of shape (n,) with values in {-1, 0, +1}."""
    try:
        arr = np.asarray(labels)
    except Exception as exc:
        raise InputError(f"labels: cannot be read as an array ({exc})") from None
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise InputError(f"labels: expected numbers in {{-1, 0, 1}}, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ShapeError(f"labels: expected a 1-D array of shape (n,), got shape {arr.shape}")
    if arr.shape[0] != n:
        raise PairCountError(f"labels has {arr.shape[0]} entries but X has {n} rows")
    arr = arr.astype(np.float64)
    if not np.isfinite(arr).all():
        raise NonFiniteError("labels contain NaN or Inf")
    bad = ~np.isin(arr, (-1.0, 0.0, 1.0))
    if bad.any():
        raise InputError(f"labels must be -1, 0 or +1; found {np.unique(arr[bad])[:5].tolist()}")
    out = arr.astype(np.int8)
    if not (out == 1).any() or not (out == -1).any():
        zero = int((out == 0).sum())  # 0/1 labels: 0 is neutral here, not the negative class
        raise DegenerateInputError(
            f"a steer needs both +1 and -1 examples; got {int((out == 1).sum())} positive, "
            f"{int((out == -1).sum())} negative" + (f", {zero} neutral (0 is neutral, -1 the negative label: 0/1 "
                                                    f"labels become +1/-1 with 2 * labels - 1)" if zero else ""))
    return out
