"""Weighted pair statistics fit the weighted problem: weights are row multiplicities.

``PairStats.from_arrays(X, Y, weights=w)`` summed ``w_i x_i`` etc. but kept ``n`` = the row count, and every mean
(the centring of ridge / low-rank / centred Procrustes, the intercept) was ``sum / n``: half the rows at weight 0
fitted a ridge W 0.27 and a bias 2.07 away from the fit without them (low-rank 0.75 / 3.13), and all weights 2 at
α = 2 was 0.30 away from the unweighted fit at α = 1. The means divide by the total weight now, and ``n`` (the
``n_pairs`` of the map, the at-least-2-pairs check) counts the rows of positive weight.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import align
from align.exceptions import TooFewRowsError
from align.procrustes import PairStats, map_from_stats, procrustes_from_stats

FITS = [("procrustes", {}), ("ridge", {"fit_intercept": True}), ("ridge", {"fit_intercept": False}),
        ("lowrank", {"fit_intercept": True}), ("lowrank", {"fit_intercept": False})]


def _pairs(n, d_s, d_t, seed):
    """Rows off the origin (so a wrong mean shows), Y a noisy linear function of X."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d_s)) + 1.5
    Y = X @ rng.standard_normal((d_s, d_t)) + 0.5 * rng.standard_normal((n, d_t)) + 2.0
    return X, Y


def _fit(stats, d_s, d_t, method, params, alpha, rank):
    frames = (align.Frame.identity(d_s), align.Frame.identity(d_t))
    extra = {} if method == "procrustes" else {"alpha": alpha}
    if method == "lowrank":
        extra["rank"] = rank
    return map_from_stats(stats, frames, method, **params, **extra)


def _close(a, b, rtol):
    scale = max(np.abs(b).max(), 1e-12)
    assert np.abs(a - b).max() <= rtol * scale, f"max difference {np.abs(a - b).max() / scale:.2e} of the largest entry"


def _same_map(a, b, rtol=1e-6):
    _close(a.W, b.W, rtol)
    if b.bias is None:
        assert a.bias is None
    else:
        _close(a.bias, b.bias, rtol)


def _alpha(X, rel_alpha):
    """α on the data's scale (a fraction of the centred trace(XᵀX) / d_s), as in test_pair_stats_rows."""
    Xc = X - X.mean(0)
    return rel_alpha * float((Xc * Xc).sum()) / X.shape[1]


_CASES = {"d_s": st.integers(2, 9), "d_t": st.integers(2, 7), "seed": st.integers(0, 2**16),
          "rel_alpha": st.floats(1e-2, 5.0), "fit": st.sampled_from(FITS), "rank_frac": st.floats(0.0, 1.0)}


@settings(max_examples=60, deadline=None)
@given(n_kept=st.integers(12, 40), n_dropped=st.integers(1, 30), **_CASES)
def test_zero_weights_fit_as_if_those_rows_were_dropped(n_kept, n_dropped, d_s, d_t, seed, rel_alpha, fit,
                                                        rank_frac):
    X, Y = _pairs(n_kept + n_dropped, d_s, d_t, seed)
    order = np.random.default_rng(seed + 1).permutation(len(X))
    w = np.ones(len(X))
    w[order[:n_dropped]] = 0.0
    keep = w > 0
    method, params = fit
    alpha, rank = _alpha(X[keep], rel_alpha), 1 + int(rank_frac * (min(d_s, d_t) - 1))
    weighted = _fit(PairStats.from_arrays(X, Y, weights=w), d_s, d_t, method, params, alpha, rank)
    dropped = _fit(PairStats.from_arrays(X[keep], Y[keep]), d_s, d_t, method, params, alpha, rank)
    _same_map(weighted, dropped, rtol=1e-5 if method == "lowrank" else 1e-6)
    assert weighted.metadata["n_pairs"] == dropped.metadata["n_pairs"] == n_kept


@settings(max_examples=60, deadline=None)
@given(n=st.integers(3, 30), **_CASES)
def test_integer_weights_fit_as_repeated_rows(n, d_s, d_t, seed, rel_alpha, fit, rank_frac):
    """Weights 0-4: rows repeated that many times (a few rows against many dimensions included: n ≥ 3)."""
    X, Y = _pairs(n, d_s, d_t, seed)
    w = np.random.default_rng(seed + 2).integers(0, 5, size=n)
    w[:2] = [1, 3]  # at least two pairs
    Xr, Yr = np.repeat(X, w, axis=0), np.repeat(Y, w, axis=0)
    method, params = fit
    if method == "procrustes" and int((w > 0).sum()) <= d_s + 1:
        return  # XᵀY of rank < d_s: the orthogonal W is not unique, any SVD's answer is right
    alpha, rank = _alpha(Xr, rel_alpha), 1 + int(rank_frac * (min(d_s, d_t) - 1))
    weighted = _fit(PairStats.from_arrays(X, Y, weights=w), d_s, d_t, method, params, alpha, rank)
    repeated = _fit(PairStats.from_arrays(Xr, Yr), d_s, d_t, method, params, alpha, rank)
    _same_map(weighted, repeated, rtol=1e-5 if method == "lowrank" else 1e-6)
    assert weighted.metadata["n_pairs"] == int((w > 0).sum())  # pairs, not copies


@settings(max_examples=60, deadline=None)
@given(n=st.integers(4, 30), c=st.floats(0.05, 20.0), **_CASES)
def test_a_uniform_weight_scales_the_penalty_alone(n, c, d_s, d_t, seed, rel_alpha, fit, rank_frac):
    """Every weight c: XᵀX and XᵀY scale by c, the means do not, so α·c fits as the unweighted α (Procrustes: the
    same map)."""
    X, Y = _pairs(n, d_s, d_t, seed)
    method, params = fit
    if method == "procrustes" and n <= d_s + 1:
        return
    alpha, rank = _alpha(X, rel_alpha), 1 + int(rank_frac * (min(d_s, d_t) - 1))
    weighted = _fit(PairStats.from_arrays(X, Y, weights=np.full(n, c)), d_s, d_t, method, params, alpha * c, rank)
    plain = _fit(PairStats.from_arrays(X, Y), d_s, d_t, method, params, alpha, rank)
    _same_map(weighted, plain, rtol=1e-5 if method == "lowrank" else 1e-6)
    assert weighted.metadata["n_pairs"] == n


@settings(max_examples=40, deadline=None)
@given(n=st.integers(12, 40), d_s=st.integers(2, 9), d_t=st.integers(2, 7), seed=st.integers(0, 2**16),
       c=st.floats(0.05, 20.0), scale=st.booleans())
def test_centred_procrustes_centres_on_the_weighted_means(n, d_s, d_t, seed, c, scale):
    """procrustes_from_stats(center=True): zero weights drop rows, a uniform weight changes neither W nor the
    scale."""
    X, Y = _pairs(n + 5, d_s, d_t, seed)
    w = np.r_[np.full(n, c), np.zeros(5)]
    W, s = procrustes_from_stats(PairStats.from_arrays(X, Y, weights=w), center=True, scale=scale)
    W0, s0 = procrustes_from_stats(PairStats.from_arrays(X[:n], Y[:n]), center=True, scale=scale)
    _close(W, W0, 1e-6)
    assert s == pytest.approx(s0, rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(6, 40), cut=st.floats(0.1, 0.9), d_s=st.integers(2, 9), d_t=st.integers(2, 7),
       seed=st.integers(0, 2**16), fit=st.sampled_from(FITS))
def test_weighted_chunks_merge_as_one_weighted_chunk(n, cut, d_s, d_t, seed, fit):
    """``+``, ``update(weights=)`` and a pickled chunk (a Ray shard's statistics) carry the total weight."""
    X, Y = _pairs(n, d_s, d_t, seed)
    w = np.random.default_rng(seed + 3).uniform(0.0, 3.0, size=n)
    w[np.random.default_rng(seed + 4).random(n) < 0.2] = 0.0
    w[:2] = [0.5, 2.0]
    k = max(1, min(n - 1, int(cut * n)))
    whole = PairStats.from_arrays(X, Y, weights=w)
    head = PairStats.from_arrays(X[:k], Y[:k], weights=w[:k])
    tail = pickle.loads(pickle.dumps(PairStats.from_arrays(X[k:], Y[k:], weights=w[k:])))
    streamed = PairStats.zeros(d_s, d_t).update(X[:k], Y[:k], weights=w[:k]).update(X[k:], Y[k:], weights=w[k:])
    method, params = fit
    if method == "procrustes" and int((w > 0).sum()) <= d_s + 1:
        return
    alpha, rank = _alpha(X, 0.5), min(d_s, d_t) - 1 or 1
    reference = _fit(whole, d_s, d_t, method, params, alpha, rank)
    for merged in (head + tail, streamed):
        assert merged.n == whole.n == int((w > 0).sum())
        assert merged.weight == pytest.approx(whole.weight, rel=1e-12) and whole.weight == pytest.approx(w.sum())
        _same_map(_fit(merged, d_s, d_t, method, params, alpha, rank), reference,
                  rtol=1e-5 if method == "lowrank" else 1e-8)


def test_fewer_than_two_weighted_pairs_are_refused():
    """Weights leaving one pair (or none) are too few pairs, as one row is: not a fit of the zero-weight rows."""
    X, Y = _pairs(10, 4, 3, seed=0)
    frames = (align.Frame.identity(4), align.Frame.identity(3))
    one = PairStats.from_arrays(X, Y, weights=np.r_[2.0, np.zeros(9)])
    for method, extra in (("procrustes", {}), ("ridge", {}), ("lowrank", {"rank": 1})):
        with pytest.raises(TooFewRowsError, match="at least 2 pairs, got 1"):
            map_from_stats(one, frames, method, **extra)
    with pytest.raises(TooFewRowsError):
        procrustes_from_stats(PairStats.from_arrays(X, Y, weights=np.zeros(10)), center=True)


def test_statistics_built_by_hand_keep_their_count_as_weight():
    """The constructor's positional form is unchanged: ``weight`` defaults to ``n`` (unweighted sums), also for
    statistics pickled before it existed."""
    X, Y = _pairs(30, 4, 3, seed=1)
    s = PairStats.from_arrays(X, Y)
    hand = PairStats(s.n, s.sum_x, s.sum_y, s.xty, s.xtx, s.sq_x, s.sq_y)
    assert hand.weight == s.weight == 30
    old = PairStats.__new__(PairStats)
    old.__setstate__({k: v for k, v in s.__getstate__().items() if k != "weight"})
    for other in (hand, old):
        np.testing.assert_allclose(other.centered()[0], s.centered()[0], rtol=1e-12)


def test_statistics_a_release_before_the_kept_rows_pickled_still_fit():
    """Before the kept rows, PairStats was a dataclass: its pickle's state is its seven fields, ``xtx`` among them
    (a property over ``_xtx`` now). Such statistics loaded, then failed every fit with AttributeError ('_rows')."""
    X, Y = _pairs(30, 4, 3, seed=2)
    s = PairStats.from_arrays(X, Y)
    old_state = {"n": s.n, "sum_x": s.sum_x, "sum_y": s.sum_y, "xty": s.xty, "xtx": s.xtx, "sq_x": s.sq_x,
                 "sq_y": s.sq_y}  # the dataclass's __dict__: what pickle stored for it
    old = PairStats.__new__(PairStats)
    old.__setstate__(old_state)  # what pickle.loads does with it
    frames = (align.Frame.identity(4), align.Frame.identity(3))
    for method, extra in (("procrustes", {}), ("ridge", {}), ("lowrank", {"rank": 2})):
        np.testing.assert_allclose(map_from_stats(old, frames, method, **extra).W,
                                   map_from_stats(s, frames, method, **extra).W, rtol=1e-9, atol=1e-12)
    assert (old + s).n == 60 and old.weight == 30

