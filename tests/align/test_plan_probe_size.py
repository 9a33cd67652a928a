"""The plan without queries from a small probe: its interval must hold what a larger probe forecasts.

QA (WordNet glove→minilm, corpus rows 0:-4,000): 250 / 500 / 1,000 probe pairs forecast 0.073 / 0.244 / 0.268 at
K = 1,000, the 250-pair interval [0, 0.087]. The curve's points at equal K agreed across probes within their
noise; what differed was that noise, each point scored on the probe's held-out half (125 queries from 250 pairs),
and the interval, ± 2 × (residual std + spread over map subsets) of five points, held none of it and was as wide
at K = 10,000 as inside the probe. It now also holds the forecasts of curves refitted to the points scored on
resamples of the held-out queries."""

from __future__ import annotations

import numpy as np
import pytest

import align
from align.learning_curve import fit_learning_curve, fit_learning_curves, query_bootstrap


def _task(seed, n=6000, d_s=24, d_t=16):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d_s)) + rng.normal(size=(30, d_s))[rng.integers(0, 30, n)] * 1.5
    Y = np.tanh(X @ rng.normal(size=(d_s, d_t)) / 4) + 0.15 * rng.normal(size=(n, d_t))
    return X.astype(np.float32), Y.astype(np.float32)


@pytest.mark.parametrize("seed", [0, 2])
def test_a_small_probes_interval_holds_the_larger_probes_forecast(seed):
    X, Y = _task(seed)
    ks = (100, 1000, 3000)
    big = align.plan_migration(X[:4000], X[4000:5000], Y[4000:5000], random_state=seed, select_rows=False,
                               target_ks=ks)
    for p in (120, 250):
        small = align.plan_migration(X[:4000], X[5000:5000 + p], Y[5000:5000 + p], random_state=seed,
                                     select_rows=False, target_ks=ks)
        for q, b in zip(small["predicted"], big["predicted"]):
            if q["extrapolated"]:  # beyond the small probe's pairs (inside it the figure also depends on the
                # held-out half's size: each query's relevant row is its nearest among fewer rows, farther away)
                assert q["low"] <= b["retention"] <= q["high"], (p, q, b["retention"])


def test_the_query_bootstrap_rescores_the_points_and_refits_their_curve():
    ks = [20, 50, 120, 300]
    rng = np.random.default_rng(0)
    rates = [0.2, 0.35, 0.5, 0.6]
    hits = [[(rng.random(400) < r, np.ones(400, bool)) for _ in range(2)] for r in rates]
    boot = query_bootstrap(ks, hits, [100, 3000], np.random.default_rng(1), n_boot=300)
    assert boot.shape == (300, 2) and ((0 <= boot) & (boot <= 1)).all()
    points = [np.mean([m.mean() for m, _ in maps]) for maps in hits]
    r_inf, c, beta, _ = fit_learning_curve(np.array(ks, float), np.array(points))
    at = np.clip(r_inf - c * np.array([100.0, 3000.0]) ** -beta, 0, 1)
    assert np.median(boot, axis=0) == pytest.approx(at, abs=0.05)  # centred on the curve of the points
    spread = np.percentile(boot, 97.5, axis=0) - np.percentile(boot, 2.5, axis=0)
    assert spread[1] > spread[0]  # extrapolating further spreads the forecast more
    # and the vectorised fit is the one-curve fit, row by row
    V = rng.random((5, 4))
    many = fit_learning_curves(np.array(ks, float), V)
    for i in range(5):
        one = fit_learning_curve(np.array(ks, float), V[i])
        assert np.allclose([many[0][i], many[1][i], many[2][i]], one[:3])


def test_a_curve_with_a_nan_point_is_nan_not_a_forecast_of_zero():
    """A NaN point gave (r_inf 0, c 0, beta 0, residual inf): a definite-looking forecast of 0, and in a batch of
    curves (the query bootstrap's) it did so for every curve of the batch."""
    ks = np.array([20, 50, 120, 300], float)
    one = fit_learning_curve(ks, np.array([0.2, np.nan, 0.5, 0.6]))
    assert all(np.isnan(v) for v in one)
    V = np.array([[0.2, 0.35, 0.5, 0.6], [0.2, 0.35, np.inf, 0.6]])
    many = fit_learning_curves(ks, V)
    assert all(np.isnan(a[1]) for a in many)
    # the other rows' curves are theirs still (lstsq solving them all at once made every one NaN, then 0)
    assert np.allclose([a[0] for a in many[:3]], fit_learning_curve(ks, V[0])[:3])
