"""Statistics of fewer pairs than source dimensions keep their rows and form XᵀX only when it is read.

Every cross-validation fold of :func:`align.fit_migration` (and every Procrustes fit) built ``PairStats`` whose
d_s x d_s ``XᵀX`` Procrustes never reads: 100 pairs of 2000-d rows allocated a 31 MiB matrix per fit.
"""

from __future__ import annotations

import pickle
import tracemalloc

import numpy as np
import pytest

import align
from align.procrustes import PairStats, procrustes_from_stats, ridge_from_stats

MiB = 1 << 20


def _peak(fn, *args, **kw):
    """``(result, peak bytes numpy allocated during fn)``."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        out = fn(*args, **kw)
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _pairs(n, d_s, d_t, seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d_s))
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
