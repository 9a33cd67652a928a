"""Procrustes from fewer pairs than dimensions: the thin solution (no d x d SVD) and its completion.

``XᵀY`` has rank <= n; a full SVD of it (17 s at 3072-d, once per fit and per cross-validation fold) fixed ``W``
on span(X) and left the rest to whatever LAPACK returned. The thin path maps the rest by the orthogonal completion
closest to the identity.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import align
from align import linalg
from align.procrustes import PairStats, procrustes_from_stats


@pytest.fixture(autouse=True)
def thin_at_every_width(request, monkeypatch):
    """The thin path at these small widths (by default it starts above THIN_SVD_MIN_DIM, 1,024)."""
    if "below_the_width_threshold" not in request.node.name:
        monkeypatch.setattr(align.procrustes, "THIN_SVD_MIN_DIM", 0)


def test_below_the_width_threshold_few_pairs_keep_the_full_svd(rng):
    """At 384-d (the encoders the few-pairs figures were measured on) nothing changed: bit for bit the full SVD."""
    _, _, stats = _stats(rng, 100, 384, 384)
    W, _ = procrustes_from_stats(stats)
    U, _, Vt = linalg.svd(stats.xty)
    assert np.array_equal(W, U @ Vt)


def _stats(rng, n, d_s, d_t):
    X, Y = (rng.normal(size=(n, d)).astype(np.float32).astype(np.float64) for d in (d_s, d_t))  # rows are float32
    return X, Y, PairStats.from_arrays(X, Y)


@settings(max_examples=40, deadline=None)
@given(d_s=st.integers(2, 40), d_t=st.integers(2, 40), n=st.integers(1, 39), seed=st.integers(0, 2**31 - 1))
def test_few_pairs_give_an_orthogonal_maximiser(d_s, d_t, n, seed):
    rng = np.random.default_rng(seed)
    _, _, stats = _stats(rng, n, d_s, d_t)
    W, _ = procrustes_from_stats(stats)
    G = W.T @ W if d_s >= d_t else W @ W.T
    np.testing.assert_allclose(G, np.eye(min(d_s, d_t)), atol=1e-9)
    nuclear = np.linalg.svd(stats.xty, compute_uv=False).sum()
    assert np.trace(W.T @ stats.xty) == pytest.approx(nuclear, rel=1e-9, abs=1e-9)  # tr(WᵀXᵀY) is the maximum


@settings(max_examples=25, deadline=None)
@given(d_s=st.integers(4, 40), d_t=st.integers(4, 40), seed=st.integers(0, 2**31 - 1))
def test_directions_outside_both_spans_are_kept(d_s, d_t, seed):
    """The completion is the identity on what neither side's pairs span (both sides zero-padded to the wider):
    old, those directions went wherever LAPACK's vectors for the zero singular values sent them."""
    rng = np.random.default_rng(seed)
    n = max(1, min(d_s, d_t) // 2 - 1)
    X, Y, stats = _stats(rng, n, d_s, d_t)
    W, _ = procrustes_from_stats(stats)
    d = max(d_s, d_t)
    A = np.zeros((2 * n + d - d_s, d))  # x orthogonal to every X row and Y row, and zero past d_s (a source row)
    A[:n, :d_s], A[n:2 * n, :d_t] = X, Y
    A[2 * n:, d_s:] = np.eye(d - d_s)
    _, s, Vt = np.linalg.svd(A)
    free = Vt[int((s > 1e-9 * s[0]).sum()):]
    assert free.shape[0] > 0
    np.testing.assert_allclose(free[:, :d_s] @ W, free[:, :d_t], atol=1e-7)


def test_planted_rotation_on_the_span_with_few_pairs(rng):
    d, n = 60, 20
    Q = np.linalg.qr(rng.normal(size=(d, d)))[0]
    X = rng.normal(size=(n, d))
    m = align.fit_procrustes(X, X @ Q, center=False, normalize=False)
    np.testing.assert_allclose(X @ m.W, X @ Q, atol=1e-4)  # the pairs fix W on span(X) exactly
    assert m.is_orthogonal()


@pytest.mark.parametrize("d_t", [300, 150])
def test_no_square_svd_with_few_pairs(monkeypatch, rng, d_t):
    """With n < min(d_s, d_t) every SVD is of a matrix with a side <= n (old: XᵀY's, 300 x d_t)."""
    shapes = []
    real = linalg.svd

    def spy(M, full_matrices=False):
        shapes.append(np.shape(M))
        return real(M, full_matrices=full_matrices)

    monkeypatch.setattr(linalg, "svd", spy)
    n = 40
    X, _, stats = _stats(rng, n, 300, d_t)
    W, _ = procrustes_from_stats(stats)
    assert shapes and max(min(s) for s in shapes) <= n
    monkeypatch.setattr(linalg, "svd", real)
    U, _, Vt = real(stats.xty)
    np.testing.assert_allclose(X @ W, X @ (U @ Vt), atol=1e-9)  # the same map on the pairs' span


def test_enough_pairs_take_the_full_svd_unchanged(rng):
    _, _, stats = _stats(rng, 50, 30, 20)
    W, _ = procrustes_from_stats(stats)
    U, _, Vt = linalg.svd(stats.xty)
    assert np.array_equal(W, U @ Vt)  # bit for bit: n >= min(d) is not touched


def test_statistics_with_a_wrong_count_fall_back_to_the_full_svd(rng):
    """Hand-made statistics whose n is below XᵀY's rank: the range check sees it and the full SVD answers."""
    _, _, full = _stats(rng, 50, 30, 20)
    stats = PairStats(2, full.sum_x, full.sum_y, full.xty, full.xtx)
    W, _ = procrustes_from_stats(stats)
    U, _, Vt = linalg.svd(stats.xty)
    assert np.array_equal(W, U @ Vt)


def test_pairs_near_the_width_take_the_full_svd(rng):
    """From n ~ d/2 the thin path's d² n products cost more than the full SVD (2048-d, 1,900 pairs: 14.2 s vs 4.5 s):
    such statistics take the full SVD, bit for bit."""
    _, _, stats = _stats(rng, 30, 40, 40)
    W, _ = procrustes_from_stats(stats)
    U, _, Vt = linalg.svd(stats.xty)
    assert np.array_equal(W, U @ Vt)
