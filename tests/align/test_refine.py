"""Pseudo-pairs, published refinements, CSLS self-learning and the criterion (align.refine)."""

from __future__ import annotations

import numpy as np
import pytest

from align.exceptions import TooFewRowsError
from align.frames import unit_rows
from align.refine import (csls_nn, map_criterion, mutual_csls_pairs, procrustes_map, refine_clusters, refine_icp,
                          relative_representation, seed_relative_init, self_learning, soft_pseudo_targets)

from _synthetic import planted


def _unit(rng, n, d):
    return unit_rows(rng.normal(size=(n, d)).astype(np.float32))


def _rot(d, seed):
    return np.linalg.qr(np.random.default_rng(seed).normal(size=(d, d)))[0]


def test_relative_representation_brute_force():
    rng = np.random.default_rng(0)
    X, A = rng.normal(size=(30, 6)).astype(np.float32), rng.normal(size=(5, 6)).astype(np.float32)
    R = relative_representation(X, A, block=7)
    ref = unit_rows(unit_rows(X) @ unit_rows(A).T)
    np.testing.assert_allclose(R, ref, atol=1e-5)


def test_soft_pseudo_targets_brute_force():
    rng = np.random.default_rng(1)
    Rs, Rt, Y = _unit(rng, 40, 8), _unit(rng, 50, 8), rng.normal(size=(50, 3)).astype(np.float32)
    P = soft_pseudo_targets(Rs, Rt, Y, k=5, block=9)
    idx = np.argsort(-(Rs @ Rt.T), axis=1)[:, :5]
    np.testing.assert_allclose(P, Y[idx].mean(axis=1), atol=1e-5)


def test_procrustes_map_recovers_rotation_and_weights():
    rng = np.random.default_rng(2)
    X, Q = rng.normal(size=(100, 7)), _rot(7, 3)
    np.testing.assert_allclose(procrustes_map(X, X @ Q), Q, atol=1e-8)
    np.testing.assert_allclose(procrustes_map(X, X @ Q, weights=rng.uniform(0.1, 1, 100)), Q, atol=1e-8)


def _csls_brute(Q, D, k):
    S = Q @ D.T
    r_q = np.sort(S, axis=1)[:, -k:].mean(1)
    r_d = np.sort(S, axis=0)[-k:, :].mean(0)
    return 2 * S - r_q[:, None] - r_d[None, :]


def test_csls_nn_and_exact_mutual_pairs_match_brute_force():
    rng = np.random.default_rng(4)
    Q, D = _unit(rng, 60, 10), _unit(rng, 70, 10)
    C = _csls_brute(Q, D, 5)
    S, I = csls_nn(Q, D, k=1, csls_k=5)
    np.testing.assert_array_equal(I[:, 0], C.argmax(1))
    np.testing.assert_allclose(S[:, 0], C.max(1), atol=1e-5)
    iq, idd, _ = mutual_csls_pairs(Q, D, csls_k=5, exact=True)
    fwd, bwd = C.argmax(1), C.argmax(0)
    ref = np.nonzero(bwd[fwd] == np.arange(60))[0]
    np.testing.assert_array_equal(iq, ref)
    np.testing.assert_array_equal(idd, fwd[ref])
    # the two-search approximation agrees on nearly all pairs
    iq2, idd2, _ = mutual_csls_pairs(Q, D, csls_k=5)
    agree = len(set(zip(iq2, idd2)) & set(zip(iq, idd))) / max(1, len(iq))
    assert agree > 0.8


def test_self_learning_recovers_planted_rotation_from_a_rough_start():
    X, Y, Q, Xh, Yh = planted(16, n=1200)
    Xs, Yt = unit_rows(X), unit_rows(Y)
    start = procrustes_map(np.eye(16), Q + 0.25 * np.random.default_rng(0).normal(size=Q.shape))
    def err(W):
        return float(np.linalg.norm(Xh @ W - Yh) / np.linalg.norm(Yh))
    W, hist = self_learning(start, Xs, Yt, rounds=4, sample=600, final_rounds=2, random_state=0)
    assert err(W) < 0.5 * err(start)
    assert err(W) < 0.3
    np.testing.assert_allclose(W.T @ W, np.eye(16), atol=1e-6)  # exact Procrustes at the end
    assert hist[-1]["kind"] == "full" and hist[-1]["pairs"] <= hist[-1]["mutual"]



@pytest.mark.parametrize("sample, final_rounds", [(None, 2), (4096, 2), (None, 0)])
def test_full_self_learning_rounds_stop_once_the_pairs_stop_changing(sample, final_rounds):
    """Rounds over all rows (sample None, or a sample as large as the sets: MiniVec2Vec's default on <= 4,096 rows)
    ran all ``rounds`` after the pair set had stopped changing (minilm -> paraphrase-L3: 19.1 s against 6 s). They
    stop like sampled rounds; the map is the same, bit for bit, as running every round (tol=0)."""
    X, Y, Q, _, _ = planted(16, n=1200)
    Xs, Yt = unit_rows(X), unit_rows(Y)
    start = procrustes_map(np.eye(16), Q + 0.25 * np.random.default_rng(0).normal(size=Q.shape))
    kw = {"rounds": 30, "sample": sample, "final_rounds": final_rounds, "random_state": 0}
    W_all, h_all = self_learning(start, Xs, Yt, tol=0.0, **kw)
    W, hist = self_learning(start, Xs, Yt, **kw)
    assert len(h_all) == 30 + final_rounds and len(hist) < len(h_all)
    assert W.tobytes() == W_all.tobytes()
    assert [h["kind"] for h in hist] == ["full"] * len(hist) and hist[-1]["round"] == 29 + final_rounds
    stop = next(i for i, h in enumerate(hist) if h["change"] < 1e-3)
    assert hist[stop]["change"] == 0.0 and len(hist) == stop + 1 + max(final_rounds, 1)

def test_criterion_prefers_the_true_map_over_a_random_one():
    X, Y, Q, _, _ = planted(16, n=1000)
    Xs, Yt = unit_rows(X), unit_rows(Y)
    good = map_criterion(Q, Xs, Yt, sample=800, random_state=0)
    bad = [map_criterion(_rot(16, s), Xs, Yt, sample=800, random_state=0)["criterion"] for s in range(3)]
    assert good["criterion"] > 1.5 * max(bad)
    assert 0 < good["mutual_frac"] <= 1


def test_refine_icp_improves_and_refine_clusters_runs():
    X, Y, Q, Xh, Yh = planted(16, n=1200)
    Xs, Yt = unit_rows(X), unit_rows(Y)
    start = procrustes_map(np.eye(16), Q + 0.2 * np.random.default_rng(1).normal(size=Q.shape))
    W, hist = refine_icp(start, Xs, Yt, iters=15, sample=300, k=5, random_state=0)
    assert len(hist) == 15
    cos = lambda W: float((unit_rows((Xh @ W).astype(np.float32)) * unit_rows(Yh)).sum(1).mean())  # noqa: E731
    assert cos(W) > cos(start)
    W2, info = refine_clusters(W, Xs, Yt, n_clusters=20, random_state=0)
    assert W2.shape == (16, 16) and -1 <= info["self_consistency"] <= 1
    with pytest.raises(TooFewRowsError):
        refine_clusters(W, Xs[:10], Yt, n_clusters=20)


def test_seed_relative_init_beats_seeds_alone():
    X, Y, Q, Xh, Yh = planted(16, n=1200)
    Xs, Yt = unit_rows(X), unit_rows(Y)
    Xseed = unit_rows(X[:8])
    Yseed = unit_rows((X[:8] @ Q).astype(np.float32))
    W = seed_relative_init(Xs, Yt, Xseed, Yseed)
    W_seeds = procrustes_map(Xseed, Yseed)
    err = lambda W: float(np.linalg.norm(Xh @ W - Yh) / np.linalg.norm(Yh))  # noqa: E731
    assert err(W) < err(W_seeds)
    with pytest.raises(TooFewRowsError):
        seed_relative_init(Xs, Yt, Xseed[:1], Yseed[:1])


def test_bidirectional_polish_recovers_planted_rotation_and_keeps_it():
    """From a perturbed start on paired-by-distribution data, the polish moves toward the planted map."""
    from align.procrustes import procrustes_W
    from align.refine import bidirectional_polish

    rng = np.random.default_rng(0)
    d, n = 12, 1500
    centers = rng.normal(size=(30, d)) * 3
    X = centers[rng.integers(0, 30, n)] + rng.normal(size=(n, d))
    Q = np.linalg.qr(rng.normal(size=(d, d)))[0]
    Y = (centers[rng.integers(0, 30, n)] + rng.normal(size=(n, d))) @ Q  # different samples, same distribution
    X = (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)
    Y = (Y / np.linalg.norm(Y, axis=1, keepdims=True)).astype(np.float32)
    W0 = procrustes_W(Q + 0.4 * rng.normal(size=(d, d)))
    W, hist = bidirectional_polish(W0, X, Y, rounds=4, csls_k=5)
    assert np.linalg.norm(W - Q) < np.linalg.norm(W0 - Q)
    np.testing.assert_allclose(W.T @ W, np.eye(d), atol=1e-6)
    assert len(hist) == 4 and all(h["pairs"] == 2 * n for h in hist)
    # seeds pull toward the truth too, and a start at the truth stays near it
    Wt, _ = bidirectional_polish(Q, X, Y, rounds=2, csls_k=5, seed_pairs=(X[:5], (X[:5] @ Q).astype(np.float32)))
    assert np.linalg.norm(Wt - Q) < 0.5 * np.linalg.norm(W0 - Q)
