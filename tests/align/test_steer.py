"""align.steer: invariants of apply / compose / transfer, fitting on a planted attribute, errors, I/O."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from align import LinearMap
from align.exceptions import (DegenerateInputError, DimensionMismatchError, InputError, NonFiniteError,
                              NotRepresentableError, PairCountError, SerializationError, ShapeError)
from align.knn import knn
from align.steer import (
    MeanShift,
    Steer,
    apply_steers,
    compose_steers,
    fit_mean_shift,
    fit_steer,
    steer_objective,
    transfer_steer,
)

from _synthetic import planted_attribute


def random_steer(d=8, r=3, seed=0):
    rng = np.random.default_rng(seed)
    return Steer(rng.normal(size=(d, r)), rng.normal(size=(d, r)), {"space": "test"})


def planted(n=1200, d=24, offset=3.0, seed=0):
    return planted_attribute(n, d, n_queries=150, offset=offset, seed=seed)


@pytest.fixture(scope="module")
def fitted():
    X, labels, Q = planted()
    return X, labels, Q, fit_steer(X, labels, rank=4, method="lm-steer", max_iter=60, max_pairs=600, n_candidates=1200, random_state=0)


# --- apply -------------------------------------------------------------------------------
def test_eps_zero_is_exact_identity():
    s = random_steer()
    Q = np.random.default_rng(1).normal(size=(5, 8)).astype(np.float32)
    assert np.array_equal(s.apply(Q, 0.0), Q)


def test_apply_matches_dense_formula():
    s = random_steer()
    Q = np.random.default_rng(1).normal(size=(5, 8))
    expect = ((np.eye(8) + 0.7 * s.W).T @ Q.T).T  # q' = (I + eps W)^T q
    np.testing.assert_allclose(s.apply(Q, 0.7), expect, rtol=1e-4, atol=1e-4)


@settings(max_examples=30, deadline=None)
@given(e1=st.floats(-3, 3), e2=st.floats(-3, 3), seed=st.integers(0, 1000))
def test_apply_is_affine_in_eps_and_compose_is_additive(e1, e2, seed):
    a, b = random_steer(seed=seed), random_steer(r=2, seed=seed + 1)
    Q = np.random.default_rng(seed).normal(size=(4, 8)).astype(np.float32)
    # affine in eps: Q(e1) + Q(e2) - Q(0) == Q(e1 + e2)
    np.testing.assert_allclose(a.apply(Q, e1) + a.apply(Q, e2) - Q, a.apply(Q, e1 + e2), atol=1e-3, rtol=1e-4)
    # composition: Q (I + e1 Wa + e2 Wb)
    both = compose_steers([(a, e1), (b, e2)])
    assert both.rank == a.rank + b.rank
    expect = Q.astype(np.float64) @ (np.eye(8) + e1 * a.W + e2 * b.W)
    np.testing.assert_allclose(both.apply(Q, 1.0), expect, atol=1e-3, rtol=1e-4)
    np.testing.assert_allclose(apply_steers(Q, [(a, e1), (b, e2)]), expect, atol=1e-3, rtol=1e-4)


def test_a_large_eps_steers_as_steer_apply_does_or_names_eps():
    """apply_steers (the service's apply and steered search) scaled the factors by eps first: eps 1e37 on a steer
    with large P1 and small P2 overflowed eps P1 and failed with "steer factor P1 contains NaN or Inf" (blaming the
    stored steer) where Steer.apply gives finite queries; eps 1e300 said the same instead of naming the overflow.
    (eps is bounded by 1000 now; factors of 1e36 overflow the same way within it.)"""
    s = Steer(np.full((4, 1), 1e36), np.full((4, 1), 1e-3))
    Q = np.eye(4, dtype=np.float32)
    np.testing.assert_allclose(apply_steers(Q, [(s, 1000.0)]), s.apply(Q, 1000.0), rtol=1e-6)
    assert np.array_equal(apply_steers(Q, [(s, 0.0)]), Q)
    with pytest.raises(NotRepresentableError, match="steered queries"):
        apply_steers(Q, [(Steer(np.full((4, 1), 1e36), np.full((4, 1), 1e3)), 1000.0), (s, 1.0)])
    with pytest.raises(NotRepresentableError, match="eps 1000 times"):
        compose_steers([(s, 1.0), (s, 1000.0)])


def test_eps_beyond_the_bound_is_refused_by_the_library_as_by_the_service():
    """The README says |eps| <= 1000 "as everywhere", but only the CLI and HTTP enforced it: the library applied eps
    1e30 (vectors of 1e29, the steer's direction alone). check_eps holds the one bound; the service reads it."""
    s = random_steer()
    Q = np.eye(8, dtype=np.float32)
    for eps in (1000.0, -1000.0):
        assert np.isfinite(s.apply(Q, eps)).all()
    calls = (lambda e: s.apply(Q, e), s.scaled, lambda e: apply_steers(Q, [(s, e)]),
             lambda e: compose_steers([(s, 1.0), (s, e)]), lambda e: MeanShift(np.ones(8)).apply(Q, e))
    for eps in (1000.5, -1e30):
        for call in calls:
            with pytest.raises(InputError, match=r"eps must be in \[-1000, 1000\]"):
                call(eps)
    from align.validation import MAX_EPS
    from service.limits import MAX_STEER_EPS

    assert MAX_STEER_EPS == MAX_EPS == 1000.0


def test_compose_rejects_mixed_dims_and_garbage():
    with pytest.raises(DimensionMismatchError):
        compose_steers([(random_steer(d=8), 1.0), (random_steer(d=6), 1.0)])
    with pytest.raises(InputError):
        compose_steers([])
    with pytest.raises(InputError):
        compose_steers([("not a steer", 1.0)])


# --- transfer ----------------------------------------------------------------------------
def test_transfer_orthogonal_equals_map_steer_map_back():
    rng = np.random.default_rng(3)
    s = random_steer(d=8)
    M = np.linalg.qr(rng.normal(size=(8, 8)))[0]
    t = transfer_steer(s, LinearMap(M))
    np.testing.assert_allclose(t.W, M.T @ s.W @ M, atol=1e-4)
    QB = rng.normal(size=(6, 8))
    roundtrip = s.apply(QB @ M.T, 0.9).astype(np.float64) @ M  # map back, steer, map
    np.testing.assert_allclose(t.apply(QB, 0.9), roundtrip, atol=1e-4)


@settings(max_examples=20, deadline=None)
@given(dA=st.integers(2, 6), extra=st.integers(0, 5), seed=st.integers(0, 1000))
def test_transfer_with_exact_map_keeps_bilinear_scores(dA, extra, seed):
    rng = np.random.default_rng(seed)
    dB = dA + extra
    M = rng.normal(size=(dA, dB)) + 2 * np.eye(dA, dB)  # full row rank
    s = random_steer(d=dA, r=2, seed=seed)
    QA, CA = rng.normal(size=(5, dA)), rng.normal(size=(7, dA))
    t = transfer_steer(s, LinearMap(M))
    assert t.dim == dB and t.rank == s.rank
    np.testing.assert_allclose(t.bilinear(QA @ M, CA @ M), s.bilinear(QA, CA), atol=1e-3, rtol=1e-3)


def test_transfer_to_smaller_space_and_dim_check():
    rng = np.random.default_rng(0)
    s = random_steer(d=8)
    t = transfer_steer(s, LinearMap(rng.normal(size=(8, 5))))
    assert t.dim == 5 and np.isfinite(t.P1).all()
    with pytest.raises(DimensionMismatchError):
        transfer_steer(s, LinearMap(rng.normal(size=(6, 5))))


# --- fitting -----------------------------------------------------------------------------
def test_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    d, r, B, m, tau, wd = 6, 2, 5, 9, 0.5, 0.01
    Qp, C = rng.normal(size=(B, d)), rng.normal(size=(m, d))
    t, s = rng.integers(0, m, B), rng.choice([-1.0, 1.0], B)
    args = (Qp @ C.T / tau, Qp, C, t, s, r, tau, wd)
    theta = rng.normal(size=2 * d * r) * 0.3
    _, g = steer_objective(theta, *args)
    h = 1e-6
    num = np.array([(steer_objective(theta + e, *args)[0] - steer_objective(theta - e, *args)[0]) / (2 * h)
                    for e in np.eye(theta.size) * h])
    np.testing.assert_allclose(g, num, atol=1e-6)


def _precision(Q, X, labels, cls, k=10):
    _, I = knn(Q, X, k)
    return float((labels[I] == cls).mean())


def test_fit_raises_the_attribute_monotonically(fitted):
    X, labels, Q, s = fitted
    assert s.metadata["loss_final"] < s.metadata["loss_initial"]
    prec = [_precision(s.apply(Q, e), X, labels, 1) for e in (0.0, 0.5, 1.0, 2.0)]
    assert all(b >= a for a, b in zip(prec, prec[1:])), prec
    assert prec[2] > prec[0] + 0.3
    # negative eps reverses: the opposite attribute rises
    assert _precision(s.apply(Q, -1.0), X, labels, -1) > _precision(Q, X, labels, -1) + 0.3


def test_fit_is_deterministic_with_random_state():
    X, labels, _ = planted(n=300, d=8)
    for method in ("local", "lm-steer"):
        a = fit_steer(X, labels, rank=2, method=method, max_iter=15, random_state=7)
        b = fit_steer(X, labels, rank=2, method=method, max_iter=15, random_state=7)
        np.testing.assert_array_equal(a.P1, b.P1)
        np.testing.assert_array_equal(a.P2, b.P2)
    a = fit_steer(X, labels, rank=2, method="lm-steer", max_iter=15, random_state=7)
    b = fit_steer(X, labels, rank=2, method="lm-steer", max_iter=15, random_state=7)
    np.testing.assert_array_equal(a.P1, b.P1)
    np.testing.assert_array_equal(a.P2, b.P2)


def test_the_seed_is_recorded_as_an_int_for_numpy_integers_too():
    """A numpy integer seed (from np.arange, an array of seeds) was recorded as "generator"."""
    X, labels, _ = planted(n=300, d=8)
    for method in ("local", "lm-steer"):
        seen = [fit_steer(X, labels, rank=2, method=method, max_iter=5, random_state=s).metadata["params"]
                ["random_state"] for s in (np.int64(3), np.uint8(3), 3, None, np.random.default_rng(3))]
        assert seen == [3, 3, 3, None, "generator"] and type(seen[0]) is int, (method, seen)


def test_fit_reports_progress():
    X, labels, _ = planted(n=200, d=8)
    seen = []
    fit_steer(X, labels, rank=2, method="lm-steer", max_iter=5, random_state=0, callback=lambda i, loss: seen.append((i, loss)))
    assert seen and seen[0][0] == 1 and all(np.isfinite(v) for _, v in seen)


def test_mean_shift_baseline(fitted):
    X, labels, Q, _ = fitted
    ms = fit_mean_shift(X, labels)
    assert np.array_equal(ms.apply(Q, 0.0), Q)
    assert _precision(ms.apply(Q, 2.0), X, labels, 1) > _precision(Q, X, labels, 1)
    back = MeanShift.from_bytes(ms.to_bytes())
    np.testing.assert_array_equal(back.v, ms.v)


# --- errors ------------------------------------------------------------------------------
@pytest.mark.parametrize("labels, err", [
    ([1, -1, 2, 0], InputError),
    ([1, 1, 0, 0], DegenerateInputError),
    ([-1, -1, -1, 0], DegenerateInputError),
    ([1, -1, 0], PairCountError),
    ([[1, -1, 0, 0]], ShapeError),
    ([1, -1, np.nan, 0], NonFiniteError),
    (["a", "b", "c", "d"], InputError),
])
def test_bad_labels(labels, err):
    X = np.random.default_rng(0).normal(size=(4, 3))
    with pytest.raises(err):
        fit_steer(X, labels, rank=1)


def test_bad_arrays_and_params():
    X = np.random.default_rng(0).normal(size=(6, 3))
    y = [1, -1, 0, 0, 1, -1]
    bad = X.copy()
    bad[2, 1] = np.nan
    with pytest.raises(NonFiniteError):
        fit_steer(bad, y)
    with pytest.raises(ShapeError):
        fit_steer(X[0], y)
    with pytest.raises(InputError):
        fit_steer(X, y, rank=4, method="lm-steer")  # rank > d
    with pytest.raises(InputError):
        fit_steer(X, y, rank=1, temperature=0)
    s = random_steer(d=3, r=1)
    with pytest.raises(DimensionMismatchError):
        s.apply(np.zeros((2, 4)))
    with pytest.raises(NonFiniteError):
        s.apply(np.zeros((2, 3)), eps=float("inf"))
    with pytest.raises(ShapeError):
        Steer(np.zeros((3, 2)), np.zeros((3, 1)))


@pytest.mark.parametrize("method", ["local", "lm-steer"])
def test_a_row_far_out_of_scale_is_named_not_followed(method):
    """One row of norm 1e30 among rows of norm ~4 (corrupt data): before, the local steer said "the rows have no
    common component (centred data)" (its float32 squares overflowed), and from 1e15 it fitted a steer that followed
    that one row; lm-steer fitted one with an abnormal L-BFGS stop. Now both name the row; rows a few thousand
    times longer than the others still fit."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 16)).astype(np.float32)
    y = np.where(X[:, 0] > 0, 1, -1)
    kw = {"rank": 4, "random_state": 0, "method": method, **({"max_iter": 20} if method == "lm-steer" else {})}
    for scale in (1e30, 1e15, 1e7):
        bad = X.copy()
        bad[3] *= scale
        with pytest.raises(DegenerateInputError, match=r"1 row\(s\) have a norm over 1e\+06 times the median row "
                                                        r"norm \([0-9.]+\), e\.g\. row 3 with"):
            fit_steer(bad, y, **kw)
    ok = X.copy()
    ok[3] *= 1e3
    assert isinstance(fit_steer(ok, y, **kw), Steer)


# --- lens and I/O ------------------------------------------------------------------------
def test_svd_and_lens(fitted):
    X, labels, _, s = fitted
    U, sig, V = s.svd()
    np.testing.assert_allclose((U * sig) @ V.T, s.W, atol=1e-4)
    assert np.all(np.diff(sig) <= 1e-9)
    texts = [f"item {i}" for i in range(X.shape[0])]
    lens = s.lens(X, texts, k=5, n_directions=2)
    assert len(lens) == 2 and lens[0]["sigma"] >= lens[1]["sigma"]
    top = lens[0]
    scores = [it["score"] for it in top["positive"]]
    assert scores == sorted(scores, reverse=True)
    assert top["positive"][0]["text"] == texts[top["positive"][0]["index"]]
    assert top["positive"][0]["score"] >= top["negative"][0]["score"]
    # the leading direction separates the planted attribute: its ends are mostly +1 on one side, -1 on the other
    pos_end = np.array([labels[it["index"]] for it in top["positive"]])
    neg_end = np.array([labels[it["index"]] for it in top["negative"]])
    assert abs(pos_end.mean() - neg_end.mean()) >= 1.0
    with pytest.raises(PairCountError):
        s.lens(X, texts[:3])


def test_svd_signs_each_pair_by_the_largest_coordinate_of_v():
    """``svd`` promised ``u_i . v_i >= 0`` but multiplied U and V by the same sign, a no-op (``u.v`` is a property of
    ``W``: ``W = u (-u)^T`` kept ``u.v = -1``), so the lens without queries oriented its ends however LAPACK did.
    Each pair is now flipped together so that ``v_i``'s largest-|.| coordinate is positive; ``W`` is unchanged."""
    u = np.zeros((4, 1))
    u[0] = 1
    U, s, V = Steer(u, -u).svd()
    assert V[0, 0] == pytest.approx(1.0) and U[0, 0] == pytest.approx(-1.0)
    for seed in range(6):
        st_ = random_steer(d=9, r=4, seed=seed)
        U, s, V = st_.svd()
        assert np.all(V[np.abs(V).argmax(axis=0), np.arange(V.shape[1])] > 0)
        np.testing.assert_allclose((U * s) @ V.T, st_.W, atol=1e-10)
        for a, b in zip((U, s, V), st_.svd()):
            np.testing.assert_array_equal(a, b)
        # flipping the factors' signs (the same W) gives the same decomposition
        U2, _, V2 = Steer(-st_.P1, -st_.P2).svd()
        np.testing.assert_allclose(U2, U, atol=1e-10)
        np.testing.assert_allclose(V2, V, atol=1e-10)


def test_lens_is_signed_by_its_queries():
    """With ``queries`` the free sign of each singular pair follows their mean gate ``mean(Q u_i) >= 0``: reversed
    queries swap the ends of every direction, and ``positive`` holds the rows whose score the steer raises most for
    those queries (brute force: ``eps (Q W c)`` summed over the queries)."""
    s = random_steer(d=8, r=1, seed=4)
    rng = np.random.default_rng(5)
    X, Q = rng.normal(size=(60, 8)), rng.normal(size=(30, 8)) + 2.0
    for q in (Q, -Q):
        top = s.lens(X, k=3, queries=q)[0]
        rise = q.sum(axis=0) @ s.W @ X.T                      # how much eps > 0 raises each row, summed over q
        assert [it["index"] for it in top["positive"]] == np.argsort(-rise)[:3].tolist()
        assert [it["index"] for it in top["negative"]] == np.argsort(rise)[:3].tolist()
    with pytest.raises(DimensionMismatchError):
        s.lens(X, queries=Q[:, :5])


def test_bytes_roundtrip_and_corrupt(tmp_path):
    s = random_steer()
    back = Steer.from_bytes(s.to_bytes())
    np.testing.assert_array_equal(back.P1, s.P1)
    np.testing.assert_array_equal(back.P2, s.P2)
    assert back.metadata == s.metadata
    path = s.save(tmp_path / "s.npz")
    np.testing.assert_array_equal(Steer.load(path).W, s.W)
    with pytest.raises(SerializationError):
        Steer.from_bytes(b"not an artifact")
    with pytest.raises(SerializationError):
        Steer.from_bytes(MeanShift(np.ones(3)).to_bytes())
    with pytest.raises(SerializationError):
        Steer.load(tmp_path / "missing.npz")


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), d=st.integers(2, 12), rank=st.integers(1, 5), data=st.data())
def test_top_r_is_the_best_rank_r_steer(seed, d, rank, data):
    """Steer.top(r): W_r from the SVD; |W - W_r|_2 = sigma_r (Eckart-Young), top(rank) is W itself, eps 0 still exact."""
    rank = min(rank, d)
    r = data.draw(st.integers(1, rank))
    rng = np.random.default_rng(seed)
    s = Steer(rng.normal(size=(d, rank)), rng.normal(size=(d, rank)))
    t = s.top(r)
    sig = np.linalg.svd(s.W, compute_uv=False)
    assert t.rank == r and t.metadata["kept_rank"] == r
    gap = np.linalg.norm(s.W - t.W, 2)
    expected = sig[r] if r < len(sig) else 0.0
    assert abs(gap - expected) <= 1e-4 * (1 + sig[0])
    np.testing.assert_allclose(s.top(rank).W, s.W, atol=1e-4 * (1 + sig[0]))
    Q = rng.normal(size=(3, d)).astype(np.float32)
    assert np.array_equal(t.apply(Q, 0.0), Q)


def test_top_refuses_bad_ranks():
    s = Steer(np.ones((4, 2)), np.ones((4, 2)))
    for bad in (0, 3, 1.5):
        with pytest.raises(InputError):
            s.top(bad)


def _spread_space(G: np.ndarray, mean_dir: np.ndarray, a: float) -> np.ndarray:
    """Unit rows ``unit(a * mean_dir + unit(g))``: a larger ``a`` crowds every row around the common direction."""
    X = a * mean_dir + G / np.linalg.norm(G, axis=1, keepdims=True)
    return (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("spread_a,spread_b", [(0.3, 2.0), (2.0, 0.3)])
def test_transfer_keeps_the_meaning_of_eps_between_spaces_of_different_spread(spread_a, spread_b):
    """Between a space whose rows spread out (|mu| ~ 0.3) and one where they crowd around their mean (|mu| ~ 0.9,
    as e5's do), either way, the transferred steer moves each query's top-10 as far at a given eps as the
    original does; the same map without its frames (the bare H^T W H) does not. The two corrections are
    scalars on W: the ranking over an eps sweep is the bare one's."""
    from align import fit_procrustes
    from align.knn import knn

    rng = np.random.default_rng(7)
    d, n = 24, 4000
    G = rng.normal(size=(n, d)) * np.linspace(2.0, 0.5, d)
    labels = np.where(G[:, 0] > 1.5, 1, np.where(G[:, 0] < -1.5, -1, 0))
    R = np.linalg.qr(rng.normal(size=(d, d)))[0]
    XA = _spread_space(G, np.eye(d)[d - 1], spread_a)
    XB = _spread_space(G @ R, R[d - 1], spread_b)
    m = fit_procrustes(XA[:2000], XB[:2000])
    steer = fit_steer(XA[:2000], labels[:2000], random_state=0)
    moved = transfer_steer(steer, m)
    bare = transfer_steer(steer, LinearMap(m.W))
    mu_a, mu_b = m.source_frame.mean.astype(np.float64), m.target_frame.mean.astype(np.float64)
    assert sorted([np.linalg.norm(mu_a), np.linalg.norm(mu_b)])[0] < 0.5 < 0.85 < max(np.linalg.norm(mu_a),
                                                                                      np.linalg.norm(mu_b))
    meta = moved.metadata
    assert meta["spread_ratio"] == pytest.approx(np.sqrt((1 - mu_a @ mu_a) / (1 - mu_b @ mu_b)), rel=1e-6)
    def rms_gate(mu, P):  # RMS of q P over rows mu + rho f, f isotropic
        return np.sqrt(np.sum((mu @ P) ** 2) + (1 - mu @ mu) * np.sum(P * P) / mu.size)

    assert meta["gate_scale"] == pytest.approx(rms_gate(mu_a, steer.P1) / rms_gate(mu_b, bare.P1), rel=1e-4)
    assert bare.metadata["eps_scale"] == 1.0 and moved.rank == steer.rank == 1
    np.testing.assert_allclose(moved.W, bare.W * meta["eps_scale"], rtol=1e-4, atol=1e-7)  # one scalar on W

    def overlap(s, X, eps):
        Q, C = X[2000:2300], X[2300:]
        _, I0 = knn(Q, C, 10)
        _, I1 = knn(s.apply(Q, eps), C, 10)
        return float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(I0.tolist(), I1.tolist())]))

    for eps in (0.25, 0.5, 1.0):
        a, b, c = overlap(steer, XA, eps), overlap(moved, XB, eps), overlap(bare, XB, eps)
        # the rows here are anisotropic, the rms gate assumes isotropic ones: close, not exact
        assert abs(b - a) < 0.1 and abs(c - a) > abs(b - a) + 0.04, (eps, a, b, c)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), na=st.floats(0.0, 0.999), nb=st.floats(0.0, 0.999), r=st.integers(1, 4),
       extra=st.integers(0, 3))
def test_transfer_through_centring_frames_is_finite_and_only_rescales(seed, na, nb, r, extra):
    """Any centring frames (|mu| from 0 to 0.999) give finite factors, and the transfer is the bare one times a
    positive scalar: the ranking over an eps sweep cannot change, only the eps it takes."""
    from align.frames import Frame

    rng = np.random.default_rng(seed)
    dA = 6
    dB = dA + extra
    s = random_steer(d=dA, r=r, seed=seed)
    M = rng.normal(size=(dA, dB)) + 2 * np.eye(dA, dB)

    def frame(d, norm):
        v = rng.normal(size=d)
        return Frame(d, (v / np.linalg.norm(v) * norm).astype(np.float32))

    moved = transfer_steer(s, LinearMap(M, None, frame(dA, na), frame(dB, nb)))
    U, _, Vt = np.linalg.svd(M, full_matrices=False)
    bare = transfer_steer(s, LinearMap(U @ Vt))  # a fitted map is carried by its polar factor
    k = moved.metadata["eps_scale"]
    assert np.isfinite(k) and k > 0 and np.isfinite(moved.P1).all() and np.isfinite(moved.P2).all()
    np.testing.assert_allclose(moved.W, k * bare.W, rtol=1e-4, atol=1e-6 * max(1.0, k) * np.abs(bare.W).max())


def test_a_shrunk_fitted_map_carries_a_steer_as_its_rotation_does():
    """A ridge-like map (the rotation R with singular values shrunk to 1 .. 0.01, as a regularised fit leaves
    directions its pairs say little about) between centred frames: the transfer through M^+ blew those directions
    up and the carried steer replaced every result at any eps; through M's polar factor it moves results as the
    transfer through R itself does."""
    from align.frames import Frame
    from align.knn import knn

    rng = np.random.default_rng(3)
    d, n = 16, 3000
    X = rng.normal(size=(n, d)) + 3 * np.eye(d)[0]
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    labels = np.where(X[:, 1] > 0.25, 1, np.where(X[:, 1] < -0.25, -1, 0))
    R = np.linalg.qr(rng.normal(size=(d, d)))[0]
    U, _, Vt = np.linalg.svd(R)
    shrunk = U @ np.diag(np.geomspace(1.0, 0.01, d)) @ Vt
    mu_a = X.mean(axis=0).astype(np.float32)
    mu_b = (X @ R).mean(axis=0).astype(np.float32)
    steer = fit_steer(X[:2000], labels[:2000], random_state=0)
    via_r = transfer_steer(steer, LinearMap(R, None, Frame(d, mu_a), Frame(d, mu_b)))
    via_shrunk = transfer_steer(steer, LinearMap(shrunk, None, Frame(d, mu_a), Frame(d, mu_b)))
    Y = (X @ R).astype(np.float32)
    Q, C = Y[2000:2200], Y[2000:]

    def overlap(s, eps):
        _, I0 = knn(Q, C, 10)
        _, I1 = knn(s.apply(Q, eps), C, 10)
        return float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(I0.tolist(), I1.tolist())]))

    for eps in (0.25, 0.5, 1.0):
        assert abs(overlap(via_shrunk, eps) - overlap(via_r, eps)) < 0.05, eps
    assert overlap(via_shrunk, 0.5) > 0.2
    np.testing.assert_allclose(via_shrunk.W, via_r.W, rtol=1e-4, atol=1e-6 * np.abs(via_r.W).max())
