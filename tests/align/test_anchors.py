"""k-means anchors and QAP matching (align.anchors)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from align.anchors import centered_gram, kmeans_anchors, match_centroids, solve_qap
from align.exceptions import InputError, TooFewRowsError
from align.frames import unit_rows

from _synthetic import planted


def test_centered_gram_matches_definition():
    C = np.random.default_rng(0).normal(size=(7, 5))
    H = np.eye(7) - np.ones((7, 7)) / 7
    np.testing.assert_allclose(centered_gram(C), H @ C @ C.T @ H, atol=1e-10)


@pytest.mark.parametrize("method", ["2opt", "faq+2opt"])
def test_qap_recovers_planted_permutation(method):
    rng = np.random.default_rng(1)
    KA = centered_gram(rng.normal(size=(12, 6)))
    perm = rng.permutation(12)
    KB = KA[np.ix_(perm, perm)]
    res = solve_qap(KA, KB, method=method, restarts=8, random_state=0)
    # the optimum equals ||K_A||^2 (Cauchy-Schwarz) and is reached by the inverse permutation
    assert res.score == pytest.approx(float((KA * KA).sum()), rel=1e-9)
    np.testing.assert_array_equal(perm[res.col_ind], np.arange(12))
    assert len(res.history) == 8 and res.score == max(res.history)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 10_000))
def test_qap_best_is_max_of_restarts_and_a_permutation(seed):
    rng = np.random.default_rng(seed)
    KA, KB = centered_gram(rng.normal(size=(8, 4))), centered_gram(rng.normal(size=(8, 4)))
    res = solve_qap(KA, KB, method="faq+2opt", restarts=3, random_state=seed)
    assert sorted(res.col_ind.tolist()) == list(range(8))
    assert res.score == pytest.approx(float((KA * KB[np.ix_(res.col_ind, res.col_ind)]).sum()))
    assert res.score == max(res.history)


def test_qap_deterministic_and_bad_method():
    rng = np.random.default_rng(2)
    KA, KB = centered_gram(rng.normal(size=(10, 4))), centered_gram(rng.normal(size=(10, 4)))
    a = solve_qap(KA, KB, restarts=3, random_state=5)
    b = solve_qap(KA, KB, restarts=3, random_state=5)
    np.testing.assert_array_equal(a.col_ind, b.col_ind)
    assert a.history == b.history
    with pytest.raises(InputError):
        solve_qap(KA, KB, method="simplex")
    with pytest.raises(InputError):
        solve_qap(KA, KB, restarts=0)
    with pytest.raises(InputError):
        match_centroids(rng.normal(size=(5, 3)), rng.normal(size=(6, 3)))


def test_kmeans_anchors_shapes_keep_and_planted_match():
    X, Y, Q, _, _ = planted(16, 24, n=800)
    Xs, Yt = unit_rows(X), unit_rows(Y)
    a = kmeans_anchors(Xs, Yt, n_runs=4, sample=600, n_clusters=12, qap_restarts=4, keep=0.25, random_state=0)
    assert a.source.shape == (12, 16) and a.target.shape == (12, 24)
    assert sum(r["kept"] for r in a.runs) == 1
    kept = [r["qap_score_normalised"] for r in a.runs if r["kept"]]
    dropped = [r["qap_score_normalised"] for r in a.runs if not r["kept"]]
    assert min(kept) >= max(dropped)
    # the best-scoring run matches centroids that correspond under the planted map
    cos = (unit_rows((a.source @ Q).astype(np.float32)) * unit_rows(a.target)).sum(1)
    assert np.median(cos) > 0.95


def test_kmeans_anchors_too_few_rows_and_bad_args():
    X = np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32)
    with pytest.raises(TooFewRowsError):
        kmeans_anchors(X, X, n_clusters=20, n_runs=1, qap_restarts=1)
    with pytest.raises(InputError):
        kmeans_anchors(X, X, n_clusters=3, n_runs=0)
    with pytest.raises(InputError):
        kmeans_anchors(X, X, n_clusters=3, n_runs=1, qap_restarts=1, keep=0.0)


def test_kmeans_anchors_reports_each_qap_restart_and_stops_when_progress_raises():
    """Progress came once per anchor run, after all its QAP restarts: ``qap_restarts=10**9`` ran for days at 0 %
    and a fit job's cancel (raised from progress) could not stop it."""
    from align.exceptions import Cancelled

    rng = np.random.default_rng(3)
    X, Y = rng.normal(size=(60, 4)), rng.normal(size=(60, 4))
    seen = []
    kmeans_anchors(X, Y, n_runs=2, sample=60, n_clusters=4, qap_restarts=4, random_state=0, progress=seen.append)
    assert seen == [0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0]

    calls = []

    def stop(fraction):
        calls.append(fraction)
        if len(calls) == 3:
            raise Cancelled("asked to stop")

    with pytest.raises(Cancelled, match="asked to stop"):
        kmeans_anchors(X, Y, n_runs=1, sample=60, n_clusters=4, qap_restarts=10**9, random_state=0, progress=stop)
    assert calls == [1e-9, 2e-9, 3e-9]
