"""``as_matrix`` takes float32 rows (every decoded request, every map's output: three per search) by a shortcut,
and the row checks use numpy's reductions directly: the same answers and errors as the general path, without the
dtype inspection that was half of a batch-1 check's time (issue 11, the per-request floor)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from align.validation import as_matrix, check_no_zero_rows


def outcome(fn, *args, **kw):
    try:
        return "ok", fn(*args, **kw)
    except Exception as exc:  # noqa: BLE001 - the error itself is what is compared
        return type(exc).__name__, str(exc)


def same(a, b) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] != "ok":
        return a[1] == b[1]
    x, y = a[1], b[1]
    return (x.dtype == y.dtype == np.float32 and x.flags.c_contiguous and y.flags.c_contiguous
            and np.array_equal(x, y, equal_nan=True))


@st.composite
def float32_rows(draw):
    shape = draw(st.sampled_from([(1, 384), (3, 5), (0, 4), (4, 0), (7,), (2, 3, 4), (64, 16), (1, 1)]))
    X = np.random.default_rng(draw(st.integers(0, 2**16))).standard_normal(shape).astype(np.float32)
    if X.size:
        flat = X.reshape(-1)
        for _ in range(draw(st.integers(0, 3))):
            flat[draw(st.integers(0, X.size - 1))] = draw(st.sampled_from(
                [np.nan, np.inf, -np.inf, 0.0, -0.0, 3e38, 1e-45]))
        if X.ndim == 2 and draw(st.booleans()):
            X[draw(st.integers(0, X.shape[0] - 1))] = 0.0  # an all-zero row
    layout = draw(st.sampled_from(["C", "F", "strided"]))
    if layout == "F":
        X = np.asfortranarray(X)
    elif layout == "strided" and X.ndim == 2:
        X = np.repeat(X, 2, axis=1)[:, ::2]  # a view with a column stride: not C-contiguous
    return X


@settings(max_examples=300, deadline=None)
@given(X=float32_rows(), dim=st.sampled_from([None, 1, 5, 16, 384]), min_rows=st.sampled_from([1, 2, 5]),
       finite=st.booleans())
def test_float32_rows_get_the_answers_and_errors_of_the_general_path(X, dim, min_rows, finite):
    """float64 input takes the general path; float32 values in it are the same numbers, so every answer (the float32
    array) and every error (type and message: shape, width, row count, NaN/Inf) must be the same."""
    kw = {"name": "queries", "dim": dim, "min_rows": min_rows, "finite": finite}
    fast = outcome(as_matrix, X, **kw)
    general = outcome(as_matrix, X.astype(np.float64), **kw)
    assert same(fast, general), (fast, general)
    if fast[0] == "ok" and X.flags.c_contiguous:
        assert fast[1] is X  # no copy of rows already as needed


def test_float32_rows_skip_the_dtype_inspection(monkeypatch):
    """The shortcut itself: float32 passes every dtype test, so none is made (np.issubdtype, np.iscomplexobj,
    np.finfo, the underflow check of wider floats: ~4 µs of the ~8 µs a (1, 384) query took, three times a search)."""
    X = np.random.default_rng(0).standard_normal((1, 384)).astype(np.float32)

    def boom(*_a, **_k):
        raise AssertionError("a dtype test made for float32 rows")

    for name in ("issubdtype", "iscomplexobj", "finfo"):
        monkeypatch.setattr(np, name, boom)
    assert as_matrix(X, name="vectors", dim=384) is X
    X[0, 7] = np.nan
    with pytest.raises(Exception, match="vectors: 1 row"):
        as_matrix(X, name="vectors", dim=384)
    monkeypatch.undo()
    assert as_matrix(X.astype(np.float16), name="vectors", dim=384, finite=False).dtype == np.float32


@settings(max_examples=200, deadline=None)
@given(X=float32_rows())
def test_zero_rows_are_counted_as_before(X):
    """All-zero rows (``-0.0`` is zero, NaN is not) counted as ``~np.any(X != 0, axis=1)`` counts them."""
    if X.ndim != 2:
        return
    zero = int((~np.any(X != 0, axis=1)).sum())
    got = outcome(check_no_zero_rows, X, name="queries", why="no direction")
    if zero:
        assert got == ("DegenerateInputError", f"queries: {zero} all-zero row(s); no direction")
    else:
        assert got[0] == "ok" and got[1] is X


def test_zero_rows_use_no_python_level_any(monkeypatch):
    """``np.any`` / ``ndarray.any`` go through numpy's Python wrappers (~2 µs each, twice a search): not used."""
    monkeypatch.setattr(np, "any", lambda *a, **k: (_ for _ in ()).throw(AssertionError("np.any")))
    X = np.ones((2, 3), np.float32)
    assert check_no_zero_rows(X) is X


@st.composite
def float64_rows(draw):
    shape = draw(st.sampled_from([(1, 384), (3, 5), (64, 16), (1, 1), (2000, 80)]))  # the last: past one block
    X = np.random.default_rng(draw(st.integers(0, 2**16))).standard_normal(shape)
    flat = X.reshape(-1)
    for _ in range(draw(st.integers(0, 4))):
        flat[draw(st.integers(0, X.size - 1))] = draw(st.sampled_from(
            [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e39, -1e39, 3.4e38, 1e-46, 1e-300, 5e-324]))
    if draw(st.booleans()):
        X[draw(st.integers(0, X.shape[0] - 1))] = draw(st.sampled_from([0.0, 1e-300, -1e-50]))  # tiny or zero row
    return X


@settings(max_examples=200, deadline=None)
@given(X=float64_rows(), finite=st.booleans())
def test_wide_float_rows_are_checked_as_the_rules_say(X, finite):
    """float64 rows (every JSON request): values beyond float32's range, non-zero rows that float32 reads as zero,
    then NaN/Inf, each counted by rows and said in that order; else the float32 copy."""
    big = float(np.finfo(np.float32).max)
    huge = int((np.isfinite(X) & (np.abs(X) > big)).any(axis=1).sum())
    with np.errstate(over="ignore"):
        narrow = X.astype(np.float32)
    lost = int(((narrow == 0).all(axis=1) & (X != 0).any(axis=1)).sum())
    bad = int((~np.isfinite(narrow)).any(axis=1).sum())
    got = outcome(as_matrix, X, name="queries", finite=finite)
    def named(mask):  # the first ten rows named, as indices of the input
        at = np.flatnonzero(mask.any(axis=1))
        return f"(row{'s' if at.size > 1 else ''} {', '.join(map(str, at[:10].tolist()))}" + \
            (", ...)" if at.size > 10 else ")")

    if huge:
        assert got == ("NonFiniteError", f"queries: {huge} row(s) hold values beyond float32's range (±3.4e38) "
                                         f"{named(np.isfinite(X) & (np.abs(X) > big))}; scale them down")
    elif lost:
        why = f"{lost} non-zero row(s) have every value below float32's smallest (~1.4e-45)"
        assert got == ("NotRepresentableError", f"queries: {why} and would read as all-zero rows; scale them up")
    elif bad and finite:
        assert got == ("NonFiniteError", f"queries: {bad} row(s) contain NaN or Inf {named(~np.isfinite(narrow))}")
    else:
        assert got[0] == "ok" and same(got, ("ok", narrow)), got


def test_a_small_wide_float_batch_in_range_is_checked_without_a_count(monkeypatch):
    """Issue 11: a batch-1 JSON transform's (1, 384) float64 rows were checked by the block-by-block counts of the
    general case (an error-state context, a generator, ``np.any`` twice: ~8 µs of a ~15 µs check); one block whose
    largest magnitude fits float32 has nothing to count, and the underflow look uses the reductions directly."""
    X = np.random.default_rng(0).standard_normal((1, 384))

    def boom(*_a, **_k):
        raise AssertionError("a count made for rows that need none")

    for name in ("any", "errstate"):
        monkeypatch.setattr(np, name, boom)
    got = as_matrix(X, name="vectors", dim=384)
    assert got.dtype == np.float32 and np.array_equal(got, X.astype(np.float32))
    monkeypatch.undo()
    X[0, 3] = 1e39
    with pytest.raises(Exception, match="1 row"):
        as_matrix(X, name="vectors", dim=384)
