"""``LinearMap.apply``'s overflow check (issue 11: in-process apply vs GEMM at batch 1,024).

``output="linear"`` read its whole output again through ``check_representable`` (``np.isfinite(Y).all()``: a boolean
array of the output's size) after the GEMMs. Each block's rows are now bounded from the input side, from norms the
apply has already computed (``|y_ij| <= |[r x, factors]_i| max_j |Wa[:, j]|``, Cauchy-Schwarz); only a block past
the bound has its output checked. An output that overflowed is refused as before.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import align
import align.maps
from align.exceptions import NotRepresentableError


def _counting(monkeypatch):
    calls = []
    real = align.maps.check_representable
    monkeypatch.setattr(align.maps, "check_representable", lambda Y, what: calls.append(Y.shape) or real(Y, what))
    return calls


def test_linear_output_of_ordinary_rows_is_not_read_again(monkeypatch):
    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(3000, 32)).astype(np.float32), rng.normal(size=(3000, 24)).astype(np.float32)
    m = align.fit_ridge(X, Y)
    calls = _counting(monkeypatch)
    out = m.apply(X, output="linear")
    assert calls == []
    monkeypatch.undo()
    assert np.isfinite(out).all()


@pytest.mark.parametrize("n", [1, 3, 1500])
def test_linear_overflow_is_still_refused_with_the_rows_counted(n):
    """A map without frames (``x W`` as is): rows of 1e38 through 10 I overflow float32; 2 of every 3 rows do."""
    m = align.LinearMap(np.eye(4) * 10.0)
    X = np.ones((n, 4), np.float32)
    X[::3] = 1e38
    X[1::3, 1] = -1e38
    bad = len(range(0, n, 3)) + len(range(1, n, 3))
    with pytest.raises(NotRepresentableError, match=f"transform: {bad} row\\(s\\) overflow float32"):
        m.apply(X, output="linear")
    if n > 2:
        np.testing.assert_array_equal(m.apply(X[2::3], output="linear"), X[2::3] * 10.0)


@settings(max_examples=60, deadline=None)
@given(scale=st.floats(1e30, 3e38), gain=st.floats(0.5, 20.0), bias=st.booleans(), rows=st.integers(1, 40))
def test_linear_refuses_exactly_the_outputs_that_overflow(scale, gain, bias, rows):
    """Near float32's edge, the answer is the one the exact check gives: finite values, or NotRepresentableError
    when some value is not (the bound only ever sends a block to that check, never lets an overflow through)."""
    rng = np.random.default_rng(rows)
    W = np.linalg.qr(rng.normal(size=(6, 6)))[0] * gain
    m = align.LinearMap(W, bias=rng.normal(size=6) * scale * 0.1 if bias else None)
    X = (rng.uniform(-1, 1, size=(rows, 6)) * scale).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        exact = X @ m.W.astype(np.float32) + (m.bias if m.bias is not None else 0)
    try:
        out = m.apply(X, output="linear")
    except NotRepresentableError:
        assert not np.isfinite(exact).all() or np.abs(exact).max() > 3.0e38
        return
    assert np.isfinite(out).all()

