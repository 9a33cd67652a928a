"""Statistics of fewer pairs than source dimensions keep their rows: XᵀX is formed only when read, and ridge and
low-rank fits solve the n x n (dual) system, with the primal's answer.

Every cross-validation fold of :func:`align.fit_migration` (and every Procrustes fit) built ``PairStats`` whose
d_s x d_s ``XᵀX`` Procrustes never reads: 100 pairs of 2000-d rows allocated a 31 MiB matrix per fit. A ridge fit
of 1,000 pairs of 3072-d rows solved a 3072 x 3072 system (and the low-rank one a 3072 x 3072 eigenproblem).
Merged statistics (``+``, chunks, shards) are sums alone and take the primal: the two are compared on the same rows.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from _memory import MiB
from _memory import peak as _peak
from hypothesis import given, settings
from hypothesis import strategies as st

import align
from align.procrustes import (
    PairStats,
    lowrank_from_stats,
    procrustes_from_stats,
    ridge_from_stats,
)


def _pairs(n, d_s, d_t, seed, offset=0.0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d_s)) + offset
    Y = X[:, :1] * rng.standard_normal((1, d_t)) + rng.standard_normal((n, d_t))
    return X.astype(np.float32).astype(np.float64), Y.astype(np.float32).astype(np.float64)  # what the fits read


def test_procrustes_from_fewer_pairs_than_dimensions_forms_no_gram_matrix():
    """100 pairs of 2000-d rows to 16-d: a 2000 x 2000 float64 XᵀX is 31 MiB, formed by every fit's statistics."""
    X, Y = _pairs(100, 2000, 16, seed=3)
    m, peak = _peak(align.fit_procrustes, X.astype(np.float32), Y.astype(np.float32))
    assert m.W.shape == (2000, 16)
    assert peak < 12 * MiB, f"{peak / MiB:.1f} MiB allocated; a 2000 x 2000 float64 matrix is 31 MiB"


def test_migration_procrustes_from_fewer_pairs_than_dimensions_forms_no_gram_matrix():
    """fit_migration(method="procrustes") on those pairs: each selection fit's statistics formed XᵀX, and the
    selection fitted 4 ridge maps no candidate read (each solving a d_s x d_s system)."""
    X, Y = _pairs(100, 2000, 16, seed=3)
    m, peak = _peak(align.fit_migration, X.astype(np.float32), Y.astype(np.float32), method="procrustes")
    assert m.W.shape == (2000, 16)
    assert peak < 12 * MiB, f"{peak / MiB:.1f} MiB allocated; a 2000 x 2000 float64 matrix is 31 MiB"


def test_statistics_keeping_rows_read_merge_and_pickle_as_sums():
    """XᵀX read from kept rows is the sum's; a merge, an update and a pickle carry the sums alone (a shard's
    statistics sent to the driver are not its rows)."""
    X, Y = _pairs(20, 50, 7, seed=5)
    kept = PairStats.from_arrays(X, Y)
    np.testing.assert_allclose(kept.xtx, X.T @ X, rtol=1e-12)
    shipped = pickle.loads(pickle.dumps(PairStats.from_arrays(X, Y)))
    assert len(pickle.dumps(shipped)) > X.nbytes  # XᵀX (50 x 50) is there, formed before pickling
    for other, times in ((shipped, 1), (kept + PairStats.from_arrays(X, Y), 2)):
        np.testing.assert_allclose(other.xtx, (X.T @ X) * times, rtol=1e-12)
        assert other.n == 20 * times
    grown = PairStats.from_arrays(X[:10], Y[:10]).update(X[10:], Y[10:])
    np.testing.assert_allclose(ridge_from_stats(grown, alpha=1.0)[0], ridge_from_stats(kept, alpha=1.0)[0],
                               rtol=1e-9, atol=1e-12)
    W, s = procrustes_from_stats(kept, scale=True, center=True)
    Wp, sp = procrustes_from_stats(PairStats.zeros(50, 7) + kept, scale=True, center=True)
    np.testing.assert_allclose(W, Wp, rtol=1e-9, atol=1e-12)
    assert s == pytest.approx(sp, rel=1e-9)


def _summed(stats: PairStats, d_s: int, d_t: int) -> PairStats:
    """The same statistics as sums alone (what a chunked or sharded fit has): the primal path."""
    return PairStats.zeros(d_s, d_t) + stats


def _reference(X, Y, alpha, fit_intercept):
    """The ridge W written out: ``(X_cᵀ X_c + αI)⁻¹ X_cᵀ Y_c``."""
    if fit_intercept:
        X, Y = X - X.mean(0), Y - Y.mean(0)
    return np.linalg.solve(X.T @ X + alpha * np.eye(X.shape[1]), X.T @ Y)


def _close(a, b, rtol=1e-6):
    scale = max(np.abs(b).max(), 1e-300)
    assert np.abs(a - b).max() <= rtol * scale, f"max difference {np.abs(a - b).max() / scale:.2e} of the largest entry"


@settings(max_examples=60, deadline=None)
@given(n=st.integers(3, 40), d_s=st.integers(2, 40), d_t=st.integers(1, 30), seed=st.integers(0, 2**16),
       rel_alpha=st.floats(1e-3, 10.0), fit_intercept=st.booleans(), offset=st.sampled_from([0.0, 3.0]),
       weighted=st.booleans(), rank_frac=st.floats(0.0, 1.0))
def test_dual_ridge_and_lowrank_agree_with_the_primal(n, d_s, d_t, seed, rel_alpha, fit_intercept, offset, weighted,
                                                       rank_frac):
    """n < d_s, n = d_s and n > d_s; α on the data's scale (a fraction of trace(XᵀX) / d_s, as fit_migration's α × K
    is for unit rows: α is absolute here, in both forms); weights (per-row statistics: sums alone, the primal)."""
    X, Y = _pairs(n, d_s, d_t, seed, offset)
    w = np.random.default_rng(seed + 1).integers(1, 4, size=n) if weighted else None
    stats = PairStats.from_arrays(X, Y, w)
    Xc = X - X.mean(0) if fit_intercept else X
    alpha = rel_alpha * max(float((Xc * Xc).sum()) / d_s, 1e-3)
    rank = 1 + int(rank_frac * (min(d_s, d_t) - 1))
    W, b = ridge_from_stats(stats, alpha=alpha, fit_intercept=fit_intercept)
    Wp, bp = ridge_from_stats(_summed(stats, d_s, d_t), alpha=alpha, fit_intercept=fit_intercept)
    _close(W, Wp)
    if not weighted:
        _close(W, _reference(X, Y, alpha, fit_intercept))
    if fit_intercept:
        _close(b, bp)
    else:
        assert b is None and bp is None
    L, lb = lowrank_from_stats(stats, rank=rank, alpha=alpha, fit_intercept=fit_intercept)
    Lp, lbp = lowrank_from_stats(_summed(stats, d_s, d_t), rank=rank, alpha=alpha, fit_intercept=fit_intercept)
    _close(L, Lp, rtol=1e-5)  # a rank-r projection: as sensitive as the gap after the r-th singular value
    if fit_intercept:
        _close(lb, lbp, rtol=1e-5)
    # the low-rank map has rank <= r and is W projected: W_r = W P with P a projector of rank <= r
    assert np.linalg.matrix_rank(L, tol=1e-8 * max(np.abs(L).max(), 1e-300)) <= rank


@pytest.mark.parametrize("n", [30, 64, 100])
def test_fit_ridge_and_fit_lowrank_in_one_chunk_or_several_give_one_map(n):
    """The public fits: one chunk of n < d_s rows keeps them (the dual), chunks of n // 3 are summed (the primal)."""
    X, Y = _pairs(n, 64, 48, seed=n)
    for fit, kw in ((align.fit_ridge, {"alpha": 0.5}), (align.fit_ridge, {"alpha": 0.5, "fit_intercept": False}),
                    (align.fit_lowrank, {"rank": 8, "alpha": 0.5})):
        whole, parts = fit(X, Y, **kw), fit(X, Y, chunk_size=n // 3, **kw)
        _close(whole.W.astype(np.float64), parts.W.astype(np.float64), rtol=1e-5)  # float32 maps
        if whole.bias is not None:
            _close(whole.bias.astype(np.float64), parts.bias.astype(np.float64), rtol=1e-5)


@pytest.mark.parametrize("fit", [
    lambda X, Y: align.fit_ridge(X, Y),
    lambda X, Y: align.fit_lowrank(X, Y, rank=8),
    lambda X, Y: align.fit_migration(X, Y, method="ridge"),
    lambda X, Y: align.fit_migration(X, Y, method="lowrank"),
], ids=["fit_ridge", "fit_lowrank", "migration ridge", "migration lowrank"])
def test_ridge_fits_from_fewer_pairs_than_dimensions_solve_no_d_by_d_system(fit):
    """100 pairs of 2000-d rows to 16-d: a 2000 x 2000 float64 XᵀX is 31 MiB. The ridge fits solved it (its
    matrix, a copy with αI added and the solver's copy), the low-rank ones too."""
    X, Y = _pairs(100, 2000, 16, seed=3)
    X, Y = X.astype(np.float32), Y.astype(np.float32)
    m, peak = _peak(fit, X, Y)
    assert m.W.shape == (2000, 16)
    assert peak < 12 * MiB, f"{peak / MiB:.1f} MiB allocated; a 2000 x 2000 float64 matrix is 31 MiB"


def test_alpha_zero_with_fewer_pairs_than_dimensions_keeps_the_primal_answer():
    """α = 0 on n < d_s rows: XᵀX is singular and the dual's X Xᵀ (centred) too; the primal's answer is kept."""
    X, Y = _pairs(10, 30, 4, seed=7)
    stats = PairStats.from_arrays(X, Y)
    W, _ = ridge_from_stats(stats, alpha=0.0)
    Wp, _ = ridge_from_stats(_summed(stats, 30, 4), alpha=0.0)
    np.testing.assert_array_equal(W, Wp)
