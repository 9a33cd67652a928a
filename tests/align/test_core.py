"""Core numerics: frames, LinearMap, supervised fits, sufficient statistics, blocked kNN, metrics."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import align
from align.exceptions import (DegenerateInputError, DimensionMismatchError, EmptyInputError, InputError,
                              NonFiniteError, PairCountError, SerializationError, ShapeError)
from align.metrics import ranks
from align.procrustes import PairStats, procrustes_from_stats


def random_orthogonal(rng, d):
    q, r = np.linalg.qr(rng.normal(size=(d, d)))
    return q * np.sign(np.diag(r))


# --- Procrustes: planted rotation, optimality, scale -----------------------------------------

@settings(max_examples=25, deadline=None)
@given(d=st.integers(2, 24), n_extra=st.integers(0, 50), seed=st.integers(0, 2**31 - 1))
def test_procrustes_recovers_planted_rotation(d, n_extra, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(d + 5 + n_extra, d))
    Q = random_orthogonal(rng, d)
    m = align.fit_procrustes(X, X @ Q, center=False, normalize=False)
    np.testing.assert_allclose(m.W, Q, atol=2e-4)
    assert m.is_orthogonal()


@settings(max_examples=25, deadline=None)
@given(d_s=st.integers(1, 16), d_t=st.integers(1, 16), seed=st.integers(0, 2**31 - 1))
def test_procrustes_is_orthogonal_any_dims(d_s, d_t, seed):
    rng = np.random.default_rng(seed)
    X, Y = rng.normal(size=(40, d_s)), rng.normal(size=(40, d_t))
    W = align.fit_procrustes(X, Y, center=False, normalize=False).W.astype(np.float64)
    G = W.T @ W if d_s >= d_t else W @ W.T
    np.testing.assert_allclose(G, np.eye(G.shape[0]), atol=1e-4)


def test_procrustes_beats_naive_map_on_noisy_input(rng):
    X = rng.normal(size=(300, 10))
    Q = random_orthogonal(rng, 10)
    Y = X @ Q + 0.3 * rng.normal(size=X.shape)
    W = align.fit_procrustes(X, Y, center=False, normalize=False).W
    err_fit = np.linalg.norm(X @ W - Y)
    for _ in range(20):  # any other orthogonal matrix does worse
        R = random_orthogonal(rng, 10)
        assert err_fit <= np.linalg.norm(X @ R - Y) + 1e-6
    assert err_fit < np.linalg.norm(X - Y)


def test_procrustes_scale_recovers_global_scale(rng):
    X = rng.normal(size=(100, 6))
    Q = random_orthogonal(rng, 6)
    m = align.fit_procrustes(X, 2.5 * X @ Q, scale=True, center=False, normalize=False)
    np.testing.assert_allclose(m.W, 2.5 * Q, atol=1e-3)


def test_ridge_recovers_affine_map_across_dims(rng):
    X = rng.normal(size=(500, 7))
    A, b = rng.normal(size=(7, 4)), rng.normal(size=4)
    m = align.fit_ridge(X, X @ A + b, alpha=1e-8, center=False, normalize=False)
    np.testing.assert_allclose(m.W, A, atol=1e-3)
    np.testing.assert_allclose(m.bias, b, atol=1e-3)
    np.testing.assert_allclose(m.apply(X[:5], output="linear"), X[:5] @ A + b, atol=1e-3)


def test_lowrank_has_requested_rank_and_fits_low_rank_truth(rng):
    X = rng.normal(size=(400, 12))
    A = rng.normal(size=(12, 2)) @ rng.normal(size=(2, 9))
    m = align.fit_lowrank(X, X @ A, rank=2, alpha=1e-8, center=False, normalize=False)
    assert np.linalg.matrix_rank(m.W.astype(np.float64), tol=1e-3) == 2
    np.testing.assert_allclose(m.W, A, atol=1e-2)


# --- sufficient statistics stream and merge exactly --------------------------------------------

@settings(max_examples=20, deadline=None)
@given(n=st.integers(12, 80), cut=st.floats(0.05, 0.95), seed=st.integers(0, 2**31 - 1))
def test_pair_stats_merge_equals_whole(n, cut, seed):
    rng = np.random.default_rng(seed)
    X, Y = rng.normal(size=(n, 5)), rng.normal(size=(n, 3))
    k = max(1, min(n - 1, int(cut * n)))
    whole = PairStats.from_arrays(X, Y)
    merged = PairStats.from_arrays(X[:k], Y[:k]) + PairStats.from_arrays(X[k:], Y[k:])
    for a, b in [(whole.xty, merged.xty), (whole.xtx, merged.xtx), (whole.sum_x, merged.sum_x), (whole.sum_y, merged.sum_y)]:
        np.testing.assert_allclose(a, b, atol=1e-10)
    assert whole.n == merged.n
    # full-rank XᵀY (n >= 12 > dims): the SVD solution is unique, so the maps agree
    np.testing.assert_allclose(procrustes_from_stats(whole)[0], procrustes_from_stats(merged)[0], atol=1e-6)


@pytest.mark.parametrize("X, Y, weights, error", [
    (np.where(np.eye(6, 4, dtype=bool), np.nan, 1.0), np.ones((6, 3)), None, NonFiniteError),  # not "no signal" later
    (np.ones((6, 4)), np.full((6, 3), np.inf), None, NonFiniteError),
    (np.ones((6, 4)), np.ones((5, 3)), None, PairCountError),
    (np.ones((2, 6, 4)), np.ones((6, 3)), None, ShapeError),
    (np.array([["a"] * 4] * 6), np.ones((6, 3)), None, InputError),
    (np.ones((6, 4)), np.ones((6, 3)), -np.ones(6), InputError),  # a negative weight makes XᵀX indefinite
    (np.ones((6, 4)), np.ones((6, 3)), np.ones(5), InputError),
    (np.ones((6, 4)), np.ones((6, 3)), np.array([1, 1, 1, 1, 1, np.nan]), InputError),
])
def test_pair_stats_refuse_bad_chunks(X, Y, weights, error):
    with pytest.raises(error):
        PairStats.from_arrays(X, Y, weights)
    stats = PairStats.zeros(4, 3)
    if weights is None:  # the streaming form checks the same way and leaves the statistics as they were
        with pytest.raises(error):
            stats.update(X, Y)
        assert stats.n == 0 and not stats.xtx.any()


def test_pair_stats_weights_are_row_multiplicities(rng):
    X, Y = rng.normal(size=(7, 4)), rng.normal(size=(7, 3))
    w = np.array([0, 1, 2, 1, 3, 1, 1])
    weighted = PairStats.from_arrays(X, Y, w)
    repeated = PairStats.from_arrays(np.repeat(X, w, axis=0), np.repeat(Y, w, axis=0))
    np.testing.assert_allclose(weighted.xtx, repeated.xtx, rtol=1e-6)
    np.testing.assert_allclose(weighted.xty, repeated.xty, rtol=1e-6)


def test_chunked_fit_equals_single_chunk(rng):
    X, Y = rng.normal(size=(1000, 8)), rng.normal(size=(1000, 8))
    a = align.fit_procrustes(X, Y, chunk_size=97)
    b = align.fit_procrustes(X, Y, chunk_size=10_000)
    np.testing.assert_allclose(a.W, b.W, atol=1e-5)


# --- LinearMap: apply, compose, inverse, round-trips -------------------------------------------

@settings(max_examples=15, deadline=None)
@given(d=st.integers(2, 12), seed=st.integers(0, 2**31 - 1), fmt=st.sampled_from(["npz", "safetensors"]))
def test_linear_map_bytes_round_trip(d, seed, fmt):
    rng = np.random.default_rng(seed)
    X, Y = rng.normal(size=(30, d)), rng.normal(size=(30, d + 1))
    m = align.fit_ridge(X, Y, alpha=0.5)
    m.metadata["note"] = {"seed": seed, "text": "ünïcode"}
    back = align.LinearMap.from_bytes(m.to_bytes(fmt))
    np.testing.assert_array_equal(back.W, m.W)
    np.testing.assert_array_equal(back.bias, m.bias)
    np.testing.assert_array_equal(back.source_frame.mean, m.source_frame.mean)
    assert back.metadata == m.metadata
    np.testing.assert_array_equal(back.apply(X), m.apply(X))


@pytest.mark.parametrize("dim, mean", [
    (4, np.array([np.nan, 0, 0, 0], np.float32)), (4, np.zeros(3, np.float32)), (4, np.full(4, np.inf, np.float32)),
    (0, None), (-2, None), (True, None), (4.0, None), (4, np.array(["a"] * 4)),
])
def test_frame_refuses_what_no_fit_produces(dim, mean):
    with pytest.raises(InputError):
        align.Frame(dim, mean)


@pytest.mark.parametrize("corrupt", ["nan_mean", "short_mean"])
def test_artifact_with_an_impossible_frame_is_refused_on_read(rng, corrupt):
    """A crafted or damaged artifact fails when read (a bundle import refuses it), not at its first transform."""
    import io

    m = align.fit_procrustes(rng.normal(size=(40, 4)), rng.normal(size=(40, 3)))
    with np.load(io.BytesIO(m.to_bytes("npz")), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    assert "target_mean" in arrays
    arrays["target_mean"] = (np.array([np.nan, 0, 0], np.float32) if corrupt == "nan_mean"
                             else np.zeros(2, np.float32))
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    with pytest.raises(InputError, match="frame"):
        align.map_from_bytes(buf.getvalue())


def test_save_load_files(tmp_path, rng):
    m = align.fit_procrustes(rng.normal(size=(50, 4)), rng.normal(size=(50, 4)))
    for name in ("m.npz", "m.safetensors"):
        p = m.save(tmp_path / name)
        back = align.LinearMap.load(p)
        np.testing.assert_array_equal(back.W, m.W)
    with pytest.raises(SerializationError):
        align.LinearMap.from_bytes(b"not an artifact at all")
    with pytest.raises(SerializationError):
        align.LinearMap.load(tmp_path / "missing.npz")


def test_npz_artifact_is_loadable_without_pickle(tmp_path, rng):
    m = align.fit_procrustes(rng.normal(size=(20, 3)), rng.normal(size=(20, 3)))
    p = m.save(tmp_path / "m.npz")
    with np.load(p, allow_pickle=False) as z:
        assert "W" in z.files


@settings(max_examples=15, deadline=None)
@given(d=st.integers(2, 10), seed=st.integers(0, 2**31 - 1))
def test_orthogonal_inverse_round_trip(d, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(60, d))
    Q = random_orthogonal(rng, d)
    m = align.fit_procrustes(X, X @ Q + 0.01 * rng.normal(size=X.shape))
    inv = m.inverse()
    Z = rng.normal(size=(7, d))
    framed = m.source_frame.apply(Z)
    back = inv.apply(m.apply(Z, output="raw"), output="frame")
    np.testing.assert_allclose(back, framed, atol=1e-4)


def test_pseudo_inverse_for_non_orthogonal(rng):
    X = rng.normal(size=(200, 6))
    A = rng.normal(size=(6, 9))
    m = align.fit_ridge(X, X @ A, alpha=1e-8, fit_intercept=False, center=False, normalize=False)
    inv = m.inverse()
    assert inv.metadata["exact"] is False
    np.testing.assert_allclose(inv.apply(m.apply(X[:5], output="linear"), output="linear"), X[:5], atol=1e-3)


def test_compose_orthogonal_maps_is_exact(rng):
    d = 8
    A = rng.normal(size=(500, d))
    Q1, Q2 = random_orthogonal(rng, d), random_orthogonal(rng, d)
    B, C = A @ Q1, A @ Q1 @ Q2
    ab, bc = align.fit_procrustes(A, B), align.fit_procrustes(B, C)
    ac = ab.compose(bc)
    assert ac.metadata["exact"]
    Z = rng.normal(size=(10, d))
    np.testing.assert_allclose(ac.apply(Z), bc.apply(ab.apply(Z, output="raw")), atol=1e-4)


def test_a_narrowing_orthogonal_map_is_not_called_exact(rng):
    """A 12 -> 4 Procrustes map has orthonormal columns (is_orthogonal) but loses norms: its inverse and its
    compositions were marked exact (a 384 -> 50 map's round trip kept a cosine of 0.67)."""
    X = rng.normal(size=(300, 12))
    narrow = align.fit_procrustes(X, X[:, :4] + 0.1 * rng.normal(size=(300, 4)))
    wide = align.fit_procrustes(X[:, :4], X + 0.1 * rng.normal(size=(300, 12)))
    assert narrow.is_orthogonal() and wide.is_orthogonal()
    assert narrow.inverse().metadata["exact"] is False and wide.inverse().metadata["exact"] is True
    assert narrow.compose(wide).metadata["exact"] is False


def test_compose_dimension_mismatch(rng):
    a = align.fit_ridge(rng.normal(size=(20, 3)), rng.normal(size=(20, 4)))
    b = align.fit_ridge(rng.normal(size=(20, 5)), rng.normal(size=(20, 2)))
    with pytest.raises(DimensionMismatchError):
        a.compose(b)


def test_apply_output_is_contiguous_float32_and_batched(rng):
    m = align.fit_procrustes(rng.normal(size=(50, 6)), rng.normal(size=(50, 6)))
    X = rng.normal(size=(103, 6))
    full = m.apply(X)
    assert full.dtype == np.float32 and full.flags["C_CONTIGUOUS"]
    np.testing.assert_allclose(m.apply(X, batch_size=10), full, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(full, axis=1), 1.0, atol=1e-5)


# --- blocked kNN vs brute force -----------------------------------------------------------------

@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 60), m=st.integers(1, 60), k=st.integers(1, 8), block=st.integers(1, 17),
       seed=st.integers(0, 2**31 - 1), use_faiss=st.booleans())
def test_blocked_knn_matches_brute_force(n, m, k, block, seed, use_faiss):
    rng = np.random.default_rng(seed)
    Q, D = rng.normal(size=(n, 5)).astype(np.float32), rng.normal(size=(m, 5)).astype(np.float32)
    S, I = align.knn(Q, D, k, block_size=block, use_faiss=use_faiss)
    full = Q @ D.T
    kk = min(k, m)
    ref = -np.sort(-full, axis=1)[:, :kk]
    np.testing.assert_allclose(S, ref, atol=1e-5)
    np.testing.assert_allclose(np.take_along_axis(full, I, axis=1), ref, atol=1e-5)


@pytest.mark.parametrize("use_faiss", [False, True])
def test_knn_ties_go_to_the_lower_index_on_every_path(rng, use_faiss):
    """Duplicate database rows tie exactly: numpy's argpartition took any member of a tie at the k-th score (20 of
    50 self-queries found the copy, not the row) and FAISS put the copy first; the docs say lower index first."""
    A = rng.normal(size=(300, 16)).astype(np.float32)
    A /= np.linalg.norm(A, axis=1, keepdims=True)
    D = np.vstack([A, A[:100]])  # rows 300.. copy rows 0..99
    S, I = align.knn(A[:100], D, 1, use_faiss=use_faiss)
    assert I[:, 0].tolist() == list(range(100))
    S, I = align.knn(A[:100], D, 2, use_faiss=use_faiss, block_size=7)
    assert I.tolist() == [[i, 300 + i] for i in range(100)]
    from align.knn import knn_blocks

    Sb, Ib = knn_blocks(A[:100], [D[:150], D[150:]], 2)
    assert Ib.tolist() == I.tolist()


def test_csls_matches_brute_force(rng):
    Q, D = rng.normal(size=(40, 6)).astype(np.float32), rng.normal(size=(55, 6)).astype(np.float32)
    S, I = align.csls_knn(Q, D, 3, csls_k=5, block_size=7)
    full = Q @ D.T
    r_q = -np.sort(-full, axis=1)[:, :5].mean(1)
    r_d = -np.sort(-full.T, axis=1)[:, :5].mean(1)
    csls = 2 * full - r_q[:, None] - r_d[None, :]
    np.testing.assert_allclose(S, -np.sort(-csls, axis=1)[:, :3], atol=1e-4)


def test_mutual_nn_brute_force(rng):
    Q, D = rng.normal(size=(30, 4)).astype(np.float32), rng.normal(size=(25, 4)).astype(np.float32)
    iq, idd, _ = align.mutual_nn(Q, D)
    full = Q @ D.T
    fwd, bwd = full.argmax(1), full.argmax(0)
    ref = [i for i in range(30) if bwd[fwd[i]] == i]
    assert list(iq) == ref and list(idd) == [fwd[i] for i in ref]


# --- metrics ------------------------------------------------------------------------------------

def test_ranks_take_true_score_from_same_product():
    D = np.eye(4, dtype=np.float32)
    assert list(ranks(D.copy(), D, block_size=3)) == [1, 1, 1, 1]
    Q = np.roll(D, 1, axis=0)
    assert list(ranks(Q, D)) == [2, 2, 2, 2]


def test_evaluate_perfect_and_identity(rng):
    X = rng.normal(size=(200, 16))
    Q = random_orthogonal(rng, 16)
    m = align.fit_procrustes(X, X @ Q)
    res = align.evaluate(m, X, X @ Q)
    assert res["top1"] == 1.0 and res["mean_rank"] == 1.0 and res["n_candidates"] == 200
    assert res["cos"] > 0.999 and res["csls_top1"] == 1.0
    bad = align.evaluate(align.LinearMap(np.eye(16)), X, X @ Q)
    assert bad["top1"] < 0.5


def test_evaluate_on_wordnet_matches_supervised_ceiling(wordnet):
    A, B = np.asarray(wordnet["minilm"][:4000], np.float32), np.asarray(wordnet["e5"][:4000], np.float32)
    m = align.fit_procrustes(A[:3000], B[:3000])
    res = align.evaluate(m, A[3000:], B[3000:])
    assert res["top1"] > 0.9  # 1,000 candidates; identity is ~0.001
    ident = align.evaluate(align.LinearMap(np.eye(384)), A[3000:], B[3000:])
    assert ident["top1"] < 0.05


# --- bad input -----------------------------------------------------------------------------------

BAD = [
    (np.full((5, 3), np.nan), NonFiniteError),
    (np.array([[1.0, np.inf, 0.0]] * 5), NonFiniteError),
    (np.ones(3), ShapeError),
    (np.ones((2, 3, 4)), ShapeError),
    (np.zeros((0, 3)), EmptyInputError),
    (np.zeros((3, 0)), EmptyInputError),
    ([["a", "b"], ["c", "d"]], InputError),
    ([[1.0, 2.0], [3.0]], InputError),
]


@pytest.mark.parametrize("bad,err", BAD)
def test_bad_input_raises_typed_errors(bad, err, rng):
    good = rng.normal(size=(5, 3))
    for fn in (lambda a, b: align.fit_procrustes(a, b), lambda a, b: align.fit_ridge(a, b)):
        with pytest.raises(err):
            fn(bad, good)
    m = align.fit_procrustes(good, good)
    with pytest.raises(err):
        m.apply(bad)


def test_pair_count_and_dimension_errors(rng):
    with pytest.raises(PairCountError):
        align.fit_procrustes(rng.normal(size=(5, 3)), rng.normal(size=(6, 3)))
    m = align.fit_procrustes(rng.normal(size=(5, 3)), rng.normal(size=(5, 3)))
    with pytest.raises(DimensionMismatchError):
        m.apply(rng.normal(size=(2, 4)))
    with pytest.raises(DimensionMismatchError):
        align.evaluate(m, rng.normal(size=(4, 4)), rng.normal(size=(4, 3)))


def test_degenerate_pairs_raise(rng):
    X = np.ones((10, 4))
    with pytest.raises(DegenerateInputError):
        align.fit_procrustes(X, X)


def test_errors_are_value_errors_for_callers():
    assert issubclass(NonFiniteError, ValueError) and issubclass(NonFiniteError, align.VecbridgeError)


@settings(max_examples=20, deadline=None)
@given(d_s=st.integers(2, 12), d_t=st.integers(2, 12), seed=st.integers(0, 2**31 - 1), ridge=st.booleans())
@example(d_s=2, d_t=4, seed=2561663, ridge=False)  # a row near a 0.96 mean (below): always tried
def test_folded_apply_equals_stage_by_stage(d_s, d_t, seed, ridge):
    """apply() folds the source frame into one GEMM; it must equal frame → W → (+b) → output."""
    from align.frames import unit_rows

    rng = np.random.default_rng(seed)
    X = (rng.normal(size=(60, d_s)) + rng.normal(size=d_s)).astype(np.float32)
    Y = (rng.normal(size=(60, d_t)) + rng.normal(size=d_t)).astype(np.float32)
    m = align.fit_ridge(X, Y, alpha=0.1) if ridge else align.fit_procrustes(X, Y)
    Z = (rng.normal(size=(17, d_s)) * 3).astype(np.float32)
    lin = m.source_frame.apply(Z).astype(np.float64) @ m.W + (0 if m.bias is None else m.bias)
    # both sides centre in float32, whose rounding grows ~1/s for a row at s = |z/|z| - mu| from the frame's mean:
    # offset 2-d data puts |mu| up to ~0.98, and a row near it (s = 0.038) differed by 3.0e-5 (d_s=2, d_t=4,
    # seed=2561663, ridge=False; about 1 example in 10^4, so 1 CI run in 500 drew one). Observed: below 1.2e-6 / s.
    s = np.linalg.norm(unit_rows(Z) - m.source_frame.mean, axis=1)
    tol = np.maximum(2e-5, 2e-6 / s)[:, None]
    for output, want in (("linear", lin), ("frame", unit_rows(lin.astype(np.float32))),
                         ("raw", m.target_frame.to_raw(lin.astype(np.float32)))):
        err = np.abs(m.apply(Z, output=output) - want)
        assert (err <= tol).all(), (output, float(err.max()), float(s.min()))


@settings(max_examples=40, deadline=None)
@given(d_s=st.integers(2, 10), d_t=st.integers(2, 10), seed=st.integers(0, 2**31 - 1),
       orth=st.booleans(), bias=st.booleans(), fs_kind=st.sampled_from(["std", "identity", "unit", "centre"]),
       ft_kind=st.sampled_from(["std", "identity", "unit", "centre"]), n=st.integers(1, 2100))
def test_fused_apply_any_frames_equals_stage_by_stage(d_s, d_t, seed, orth, bias, fs_kind, ft_kind, n):
    """The fused blocked apply equals frame → W → (+b) → output for every frame kind, W and batch size."""
    from align import LinearMap
    from align.frames import Frame, unit_rows

    rng = np.random.default_rng(seed)

    def frame(kind, d):
        v = rng.normal(size=d)  # a mean of unit rows: norm below 1
        mean = (v / np.linalg.norm(v) * rng.uniform(0.0, 0.8)).astype(np.float32)
        return {"std": Frame(d, mean), "identity": Frame.identity(d), "unit": Frame(d, None, True, True),
                "centre": Frame(d, mean, unit_in=False, unit_out=False)}[kind]

    if orth and d_s <= d_t:
        W = np.linalg.qr(rng.normal(size=(d_t, d_s)))[0].T  # orthonormal rows
    else:
        W = rng.normal(size=(d_s, d_t)) / np.sqrt(d_s)
    b = rng.normal(size=d_t) * 0.3 if bias else None
    m = LinearMap(W, b, frame(fs_kind, d_s), frame(ft_kind, d_t))
    Z = (rng.normal(size=(n, d_s)) * 2 + rng.normal(size=d_s)).astype(np.float32)
    lin = (m.source_frame.apply(Z).astype(np.float64) @ m.W + (0 if m.bias is None else m.bias)).astype(np.float32)
    # frames here go to |mu| = 0.8 in 2-d, where float32 rounding of the folded algebra (and of the
    # stage-by-stage reference) is amplified ~1/s(x)^2; realistic frames meet 2e-5 (test above)
    tol = dict(atol=1e-4, rtol=1e-5)
    np.testing.assert_allclose(m.apply(Z, output="linear"), lin, **tol)
    np.testing.assert_allclose(m.apply(Z, output="frame"), unit_rows(lin) if m.target_frame.unit_out else lin, **tol)
    np.testing.assert_allclose(m.apply(Z, output="raw"), m.target_frame.to_raw(lin), **tol)
    np.testing.assert_array_equal(m.apply(Z), m.apply(Z, output="raw"))  # the default: comparable with raw targets


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 2600), bad=st.sampled_from([np.nan, np.inf, -np.inf]),
       orth=st.booleans(), fs_kind=st.sampled_from(["std", "identity", "unit"]),
       output=st.sampled_from(["raw", "frame", "linear"]))
def test_apply_finds_non_finite_input_in_any_block(seed, n, bad, orth, fs_kind, output):
    """apply() checks finiteness on the way (from the row norms it needs anyway), not in a separate
    pass: one NaN/Inf anywhere in a multi-block batch still raises NonFiniteError, never a result."""
    from align import LinearMap
    from align.frames import Frame

    rng = np.random.default_rng(seed)
    d = 6
    W = np.linalg.qr(rng.normal(size=(d, d)))[0] if orth else rng.normal(size=(d, d))
    mean = (rng.normal(size=d) * 0.1).astype(np.float32)
    fs = {"std": Frame(d, mean), "identity": Frame.identity(d), "unit": Frame(d, None, True, True)}[fs_kind]
    m = LinearMap(W, rng.normal(size=d) * 0.1, fs, Frame(d, mean))
    Z = rng.normal(size=(n, d)).astype(np.float32)
    Z[rng.integers(n), rng.integers(d)] = bad
    with pytest.raises(NonFiniteError, match="1 row"):
        m.apply(Z, output=output)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), scale=st.sampled_from([1e-25, 1e-19, 1e19, 1e30]))
def test_scale_free_apply_ignores_extreme_row_magnitudes(seed, scale):
    """A source frame that normalises rows makes apply scale-free: rows whose squares leave float32's
    range give the same output as the same rows at unit length (no Inf, no 0/0)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(300, 8)).astype(np.float32)
    m = align.fit_ridge(X, X @ rng.normal(size=(8, 5)).astype(np.float32), alpha=0.1)
    Z = rng.normal(size=(1500, 8)).astype(np.float32)
    Z /= np.linalg.norm(Z, axis=1, keepdims=True)
    big = Z.copy()
    big[::7] *= np.float32(scale)
    for output in ("raw", "frame", "linear"):
        np.testing.assert_allclose(m.apply(big, output=output), m.apply(Z, output=output), atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(d_s=st.integers(2, 10), d_t=st.integers(2, 10), seed=st.integers(0, 2**31 - 1),
       orth=st.booleans(), bias=st.booleans(), fs_kind=st.sampled_from(["std", "identity", "unit", "centre"]),
       ft_kind=st.sampled_from(["std", "identity", "unit", "centre"]), output=st.sampled_from(["raw", "frame", "linear"]),
       scale=st.sampled_from([1.0, 1e-20, 1e15, 1e19]))
def test_single_row_apply_equals_its_row_of_a_batch(d_s, d_t, seed, orth, bias, fs_kind, ft_kind, output, scale):
    """A batch of one (a query) takes its own path (factors as Python floats); each row must come out as
    it does inside a batch, for every frame kind, W, bias, output and row magnitude."""
    from align import LinearMap
    from align.frames import Frame

    rng = np.random.default_rng(seed)
    def mean(d):
        return (rng.normal(size=d) / np.sqrt(d) * 0.5).astype(np.float32)

    frames = {"std": lambda d: Frame(d, mean(d)), "identity": Frame.identity, "unit": lambda d: Frame(d, None, True, True),
              "centre": lambda d: Frame(d, mean(d), unit_in=False, unit_out=False)}
    W = (np.linalg.qr(rng.normal(size=(d_t, d_s)))[0].T if orth and d_s <= d_t
         else rng.normal(size=(d_s, d_t)) / np.sqrt(d_s))
    m = LinearMap(W, rng.normal(size=d_t) * 0.3 if bias else None, frames[fs_kind](d_s), frames[ft_kind](d_t))
    Z = (rng.normal(size=(9, d_s)) + rng.normal(size=d_s)).astype(np.float32)
    if m.source_frame.unit_in:  # magnitudes matter only where the frame normalises them away
        Z *= np.float32(scale)
    batch = m.apply(Z, output=output)
    rows = np.vstack([m.apply(Z[i : i + 1], output=output) for i in range(len(Z))])
    np.testing.assert_allclose(rows, batch, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(batch).max())))


@pytest.mark.parametrize("n", [1, 5])
def test_unit_outputs_stay_unit_when_squares_pass_float32(n, rng):
    """A map with large W (|f W + b| ~ 1e3) on rows of norm ~1e17 (inside the range the frame handles
    without taming them): the output's squared norms pass float32's range before it is scaled. They were
    left unscaled (entries ~1e19, no error); the norms are now summed in float64 and the rows come out
    as the same rows at unit length do."""
    from align import LinearMap
    from align.frames import Frame

    d = 8
    X = rng.normal(size=(200, d)).astype(np.float32)
    m0 = align.fit_ridge(X, X @ rng.normal(size=(d, d)).astype(np.float32), alpha=0.1)
    m = LinearMap(m0.W * 1000, m0.bias * 1000, m0.source_frame, Frame(d, m0.target_frame.mean))
    Z = rng.normal(size=(n, d)).astype(np.float32)
    Z /= np.linalg.norm(Z, axis=1, keepdims=True)
    for output in ("raw", "frame"):
        big = m.apply(Z * np.float32(5e17), output=output)
        np.testing.assert_allclose(big, m.apply(Z, output=output), atol=1e-5)
        np.testing.assert_allclose(np.linalg.norm(big, axis=1), 1.0, atol=1e-5)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), d=st.integers(1, 40), scale=st.sampled_from([1.0, 1e-25, 1e-19, 1e18, 1e30]),
       special=st.sampled_from([None, "zero", "nan"]))
def test_unit_rows_of_one_row_equals_its_row_of_a_batch(seed, d, scale, special):
    """``unit_rows`` of a single float32 row (a query) takes a shortcut; it must give what the batch gives:
    unit rows at any finite scale, zero rows kept zero, NaN rows NaN."""
    from align.frames import unit_rows

    rng = np.random.default_rng(seed)
    X = (rng.normal(size=(4, d)) * scale).astype(np.float32)
    if special == "zero":
        X[1] = 0.0
    elif special == "nan":
        X[2, 0] = np.nan
    batch = unit_rows(X)
    rows = np.vstack([unit_rows(X[i : i + 1]) for i in range(4)])
    np.testing.assert_allclose(rows, batch, atol=1e-6)  # NaN in the same places (assert_allclose: equal_nan)
    finite = np.isfinite(X).all(axis=1) & (np.abs(X).max(axis=1) > 0)
    np.testing.assert_allclose(np.linalg.norm(rows[finite], axis=1), 1.0, atol=1e-5)


def test_finite_values_beyond_float32_are_named_not_turned_into_inf(rng):
    """A float64 value float32 cannot hold (1e39) used to become Inf in the cast (with a RuntimeWarning) and be
    reported as "NaN or Inf"; it is now refused before the cast with a message that says what is wrong."""
    import warnings

    from align.validation import as_matrix

    X = rng.normal(size=(6, 4))
    X[2, 1] = 1e39
    m = align.fit_procrustes(rng.normal(size=(50, 4)).astype(np.float32), rng.normal(size=(50, 4)).astype(np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for call in (lambda: as_matrix(X), lambda: as_matrix(X, finite=False), lambda: m.apply(X),
                     lambda: m.apply(X[2:3])):
            with pytest.raises(NonFiniteError, match="1 row.*beyond float32's range"):
                call()
    Y = X.copy()
    Y[2, 1] = np.inf  # a true Inf keeps its own message
    with pytest.raises(NonFiniteError, match="NaN or Inf"):
        as_matrix(Y)


@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.parametrize("kind", ["linear", "cluster"])
def test_rows_of_tiny_norm_map_like_unit_rows(n, kind, rng):
    """A scale-free (standard) source frame gives rows of norm 1e-13 the same image as the same rows at unit
    norm. Norms below 1e-12 were clamped to 1e-12 in the folded algebra (the row's scale then no longer
    cancelled: outputs off by up to ~1 at 1e-13); only zero rows need a floor, since rows with squares under
    1e-30 are brought to unit length first."""
    X = rng.normal(size=(300, 6)).astype(np.float32)
    Y = (X @ rng.normal(size=(6, 5)) + 0.3).astype(np.float32)
    m = align.fit_migration(X, Y, method="ridge" if kind == "linear" else "cluster", random_state=0,
                            **({} if kind == "linear" else {"n_clusters": 3}))
    Z = rng.normal(size=(n, 6)).astype(np.float32)
    Z /= np.linalg.norm(Z, axis=1, keepdims=True)
    for output in ("raw", "frame", "linear"):
        np.testing.assert_allclose(m.apply(Z * np.float32(1e-13), output=output), m.apply(Z, output=output),
                                   atol=1e-4)


@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.parametrize("orth", [True, False])
def test_tiny_outputs_still_come_out_as_unit_rows(n, orth, rng):
    """Through an identity source frame (no scaling on the way in), rows of norm 1e-14 give outputs of norm
    ~1e-14; their normalisation floored |u| at 1e-12, so frame rows came out with norm ~0.01 and raw rows
    short of the unit sphere. The floor now only catches zero rows."""
    from align import LinearMap
    from align.frames import Frame

    d = 6
    W = np.linalg.qr(rng.normal(size=(d, d)))[0] if orth else rng.normal(size=(d, d))
    mean = (rng.normal(size=d) * 0.1).astype(np.float32)
    m = LinearMap(W, None, Frame.identity(d), Frame(d, mean))
    Z = rng.normal(size=(n, d)).astype(np.float32)
    for output in ("frame", "raw"):
        tiny, ref = m.apply(Z * np.float32(1e-14), output=output), m.apply(Z, output=output)
        np.testing.assert_allclose(np.linalg.norm(tiny, axis=1), 1.0, atol=1e-5)
        np.testing.assert_allclose(tiny, ref, atol=1e-4)  # linear in x: the direction does not change


@pytest.mark.parametrize("bad", [-1, np.int64(-5), True, 1.5, "0"])
def test_random_state_rejects_negative_bool_and_non_int_seeds(bad):
    # numpy raises a bare ValueError for a negative seed; callers (HTTP, CLI) need the typed error
    X = np.random.default_rng(0).normal(size=(60, 4))
    with pytest.raises(InputError, match="random_state"):
        align.plan_migration(X, X, X, random_state=bad, select_rows=False)
    a = align.plan_migration(X, X, X, random_state=np.uint8(3), select_rows=False)
    assert a["predicted"] == align.plan_migration(X, X, X, random_state=3, select_rows=False)["predicted"]


@pytest.mark.parametrize("option", [
    {"target_retention": float("nan")}, {"target_retention": 1.5}, {"target_retention": 0}, {"target_retention": "x"},
    {"target_ks": ()}, {"target_ks": (100, -5)}, {"target_ks": (100.5,)}, {"target_ks": ("a",)},
    {"repeats": 0}, {"repeats": 1.5}, {"distractors": 0}, {"methods": ()},
])
def test_plan_refuses_bad_options(option):
    # a NaN target or zero repeats used to give a plan of NaNs; an empty target_ks a bare max() error
    X = np.random.default_rng(0).normal(size=(60, 4))
    with pytest.raises(InputError):
        align.plan_migration(X, X, X, select_rows=False, **option)


def test_forecast_beyond_the_probe_of_a_curve_that_did_not_rise_runs_to_one():
    """A learning curve flat at 0 (every probe K far below the dimension) or falling (noise) was extrapolated as it
    was: retention 0.000 with the interval [0.000, 0.000] up to K = 10,000, where a fitted map keeps a quarter of
    the neighbours or more. Such a curve says nothing of larger K: beyond the probe its interval runs to 1; inside
    the probe, and for a rising curve anywhere, the forecast is unchanged."""
    from align.plan import forecast, forecast_per_k

    noiseless = {"residual_std": 0.0, "spread": 0.0}
    for flat in ({"r_inf": 0.0, "c": 0.0, "beta": 0.1, **noiseless}, {"r_inf": -0.01, "c": -2.6, "beta": 1.5,
                                                                      "residual_std": 0.01, "spread": 0.005}):
        rising = {"r_inf": 0.9, "c": 5.0, "beta": 0.5, **noiseless}
        got = forecast_per_k({"procrustes": flat, "ridge": rising}, "procrustes", (40, 100, 3000), top=50)
        assert [q["extrapolated"] for q in got] == [False, True, True]
        assert got[0]["method"] == "ridge" and got[0]["high"] == pytest.approx(float(forecast(rising, [40])[2][0]))
        assert [(q["method"], q["high"]) for q in got[1:]] == [("procrustes", 1.0), ("procrustes", 1.0)]
        assert all(q["retention"] == float(forecast(flat, [q["k"]])[0][0]) for q in got[1:])
        kept = forecast_per_k({"procrustes": flat, "ridge": rising}, "ridge", (3000,), top=50)[0]
        assert kept["high"] == pytest.approx(float(forecast(rising, [3000])[2][0])) and kept["high"] < 1.0


def test_forecast_beyond_a_probe_smaller_than_the_dimension_runs_to_one():
    """WordNet minilm -> e5 (384-d): a 200-pair probe (maps from <= 100 pairs) forecast 0.38 [0.29, 0.47] at K = 3,000
    and a 1,000-pair probe 0.62 [0.38, 0.86]: below the dimension the curve has not yet taken the shape it has past
    K = d, so beyond such a probe only the lower end is read (the interval runs to 1). At top >= dim, unchanged."""
    from align.plan import forecast, forecast_per_k

    rising = {"r_inf": 0.9, "c": 5.0, "beta": 0.5, "residual_std": 0.01, "spread": 0.01}
    small = forecast_per_k({"ridge": rising}, "ridge", (50, 1000, 3000), top=100, dim=384)
    assert [(q["extrapolated"], q["high"]) for q in small][1:] == [(True, 1.0), (True, 1.0)]
    assert small[0]["high"] == pytest.approx(float(forecast(rising, [50])[2][0])) and small[0]["high"] < 1.0
    assert [q["low"] for q in small] == [pytest.approx(float(forecast(rising, [q["k"]])[1][0])) for q in small]
    large = forecast_per_k({"ridge": rising}, "ridge", (1000, 3000), top=500, dim=384)
    assert all(q["extrapolated"] and q["high"] < 1.0 for q in large)


def test_plan_with_a_probe_below_the_dimension_says_so():
    rng = np.random.default_rng(0)
    d = 96
    Q = np.linalg.qr(rng.normal(size=(d, d)))[0]
    X = rng.normal(size=(3000, d)).astype(np.float32)
    Y = (X @ Q + 0.3 * rng.normal(size=X.shape)).astype(np.float32)
    small = align.plan_migration(X, X[:120], Y[:120], random_state=0, select_rows=False, target_ks=(1000,))
    assert small["predicted"][0]["high"] == 1.0
    assert any("at most 60 pairs, fewer than the old space's 96 dimensions" in n for n in small["notes"])
    big = align.plan_migration(X, X[:300], Y[:300], random_state=0, select_rows=False, target_ks=(1000,))
    assert not any("fewer than the old space" in n for n in big["notes"])


@pytest.mark.parametrize("k", [0, -3, 2.5, True])
def test_knn_overlap_refuses_bad_k(k):  # k=0 was a ZeroDivisionError
    X = np.random.default_rng(0).normal(size=(30, 4))
    with pytest.raises(InputError, match="k must be"):
        align.knn_overlap(X, X, k=k)


def test_plan_target_ks_any_order_gives_sorted_forecasts():
    X = np.random.default_rng(0).normal(size=(60, 4))
    a = align.plan_migration(X, X, X, select_rows=False, target_ks=[30, 10, 30])  # inside the 60-row corpus
    assert [p["k"] for p in a["predicted"]] == [10, 30]
    assert all(np.isfinite(p["retention"]) for p in a["predicted"])


def test_plan_never_recommends_more_rows_than_the_old_corpus_has():
    """A 400-row corpus and the default K grid up to 10,000: no K reached the target, so the largest was
    recommended, `vecbridge plan` printed "K = 10000 rows to re-embed" and wrote all 400 rows. Re-embedding the
    whole corpus loses nothing (no map), so it is the smallest K that reaches any target: the recommended K is the
    corpus size, flagged `whole_corpus`, with a note to re-embed instead of migrating."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 16)).astype(np.float32)
    Y = (np.tanh(X) @ rng.normal(size=(16, 16)) + rng.normal(size=(400, 16))).astype(np.float32)
    p = align.plan_migration(X, X[:200], Y[:200], target_retention=0.99)
    assert max(q["retention"] for q in p["predicted"] if q["k"] < 400) < 0.99
    assert p["recommended"]["k"] == 400 and p["recommended"]["whole_corpus"]
    assert p["rows_to_embed"] == [] and p["rows_to_embed_all"] is True  # every row: said, not listed
    assert p["recommended"]["migration_reaches_target"] is False  # and the note sets the choices side by side
    assert any("no K that migrates" in n and "re-embed every row (400;" in n for n in p["notes"])
    q = align.plan_migration(X, X[:200], Y[:200], target_retention=0.05)  # reached well inside the corpus
    assert q["recommended"]["k"] == 100 and not q["recommended"]["whole_corpus"]


def test_plan_forecasts_k_beyond_the_corpus_as_one_whole_corpus_row_keeping_everything():
    """An 8,000-row corpus showed `10000 ridge 0.696 [0.476, 0.916]` beside "re-embed all 8,000": a K of at least the
    corpus re-embeds every row (retention 1). Those K are now one row at the corpus size, retention 1, whole_corpus;
    a fit report's plan of a sample (old_is_sample) keeps its K."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 16)).astype(np.float32)
    Y = (np.tanh(X) @ rng.normal(size=(16, 16)) + rng.normal(size=(400, 16))).astype(np.float32)
    p = align.plan_migration(X, X[:200], Y[:200], target_ks=(100, 300, 1000, 3000), select_rows=False)
    assert [q["k"] for q in p["predicted"]] == [100, 300, 400]
    whole = p["predicted"][-1]
    assert (whole["retention"], whole["low"], whole["high"], whole["whole_corpus"]) == (1.0, 1.0, 1.0, True)
    assert not any(q.get("whole_corpus") for q in p["predicted"][:-1]) and p["predicted"][1]["retention"] < 1.0
    s = align.plan_migration(X, X[:200], Y[:200], target_ks=(100, 3000), select_rows=False, old_is_sample=True)
    assert [q["k"] for q in s["predicted"]] == [100, 3000] and s["predicted"][-1]["retention"] < 1.0


@pytest.mark.parametrize("fit, options", [
    (align.fit_procrustes, {"chunk_size": 0}), (align.fit_procrustes, {"chunk_size": 1.5}),
    (align.fit_procrustes, {"scale": "false"}), (align.fit_procrustes, {"center": None}),
    (align.fit_ridge, {"alpha": "x"}), (align.fit_ridge, {"alpha": None}), (align.fit_ridge, {"alpha": float("nan")}),
    (align.fit_ridge, {"fit_intercept": 1}), (align.fit_ridge, {"normalize": "yes"}),
    (align.fit_lowrank, {"rank": 1.5}), (align.fit_lowrank, {"rank": "x"}),
    (align.fit_lowrank, {"rank": 2, "alpha": np.inf}),
])
def test_supervised_fit_options_are_checked(fit, options):
    # were range() / '<' / slice TypeErrors, "Eigenvalues did not converge", or (a string flag) silently truthy
    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(50, 6)), rng.normal(size=(50, 4))
    options = {"rank": 2, **options} if fit is align.fit_lowrank else options
    with pytest.raises(InputError):
        fit(X, Y, **options)


@pytest.mark.parametrize("case", ["zero_targets", "identical_targets", "identical_both", "zero_sources"])
def test_held_out_metrics_refuse_rows_that_cannot_be_ranked(rng, case):
    # every row tied with its partner and counted as a hit: top-1 and labelled R@10 of 1.0 on data that says
    # nothing, so an evaluation gate passed
    X = rng.normal(size=(300, 8))
    m = align.fit_procrustes(X, X @ rng.normal(size=(8, 6)))
    A, B = X[:50], (X @ rng.normal(size=(8, 6)))[:50]
    A, B = {"zero_targets": (A, np.zeros_like(B)), "identical_targets": (A, np.tile(B[:1], (50, 1))),
            "identical_both": (np.tile(A[:1], (50, 1)), np.tile(B[:1], (50, 1))),
            "zero_sources": (np.zeros_like(A), B)}[case]
    with pytest.raises(DegenerateInputError):
        align.evaluate(m, A, B)
    with pytest.raises(DegenerateInputError):
        align.labelled_retention(m, A, B, rng.normal(size=(10, 6)), np.arange(10))


def test_cross_val_top1_scores_held_out_rows_not_memorised_ones(rng):
    d = 24
    Q = np.linalg.qr(rng.normal(size=(d, d)))[0]
    X = rng.normal(size=(600, d))
    Y = X @ Q + 1.0 * rng.normal(size=X.shape)
    def ridge(a, b):
        return align.fit_ridge(a, b, alpha=1e-6)
    small = align.cross_val_top1(X[:60], Y[:60], ridge)
    assert small["n_rows"] == 60 and small["n_candidates"] == 12 and small["folds"] == 5
    assert align.evaluate(ridge(X[:60], Y[:60]), X[:60], Y[:60], csls=False)["top1"] == 1.0  # memorised
    assert small["top1"] < 0.9
    planted = align.cross_val_top1(X, Y, lambda a, b: align.fit_procrustes(a, b), random_state=1)
    assert planted["top1"] > 0.9 and planted["n_candidates"] == 120
    assert planted == align.cross_val_top1(X, Y, lambda a, b: align.fit_procrustes(a, b), random_state=1)
    noise = align.cross_val_top1(X, rng.normal(size=Y.shape), lambda a, b: align.fit_procrustes(a, b))
    assert noise["top1"] < 5 / 120  # chance is 1 / 120
    capped = align.cross_val_top1(X, Y, lambda a, b: align.fit_procrustes(a, b), max_pool=50, max_rows=400)
    assert capped["n_rows"] == 400 and capped["n_candidates"] <= 50
    with pytest.raises(align.exceptions.TooFewRowsError):
        align.cross_val_top1(X[:9], Y[:9], ridge)
    # repeated pairs: a held-out copy of a training pair scored what the map memorised (0.86 against 0.29 on
    # distinct pairs); the folds split distinct pairs, so repeats change the figure only by their weight in the fit
    wide = np.random.default_rng(1)  # 128-d, 300 pairs: room to memorise (held-out copies scored 0.72, not 0.40)
    Xw = wide.normal(size=(300, 128))
    Yw = Xw @ np.linalg.qr(wide.normal(size=(128, 128)))[0] + 2.0 * wide.normal(size=Xw.shape)
    twice = align.cross_val_top1(np.vstack([Xw, Xw[:150]]), np.vstack([Yw, Yw[:150]]), ridge)
    distinct = align.cross_val_top1(Xw, Yw, ridge)
    assert twice["n_rows"] == 300 and twice["top1"] <= distinct["top1"] + 0.05, (twice, distinct)
    with pytest.raises(align.exceptions.TooFewRowsError, match="distinct pairs, got 5"):
        align.cross_val_top1(np.vstack([X[:5]] * 4), np.vstack([Y[:5]] * 4), ridge)


def test_cross_val_top1_of_rows_it_does_not_copy_is_the_same_figure(rng):
    """Pairs too many to copy (memory-mapped files): ``groups`` found upstream and ``fit_rows`` (the fold's training
    rows fitted by the caller from its files) give the folds and the figure of the default, with repeated pairs
    too; the held-out rows alone are read (``X_src[rows]``: a 2-D float32 array is all it needs). Before, the
    whole rows were checked, grouped (np.unique of every row) and each fold's training rows copied."""
    d = 24
    X = rng.normal(size=(400, d)).astype(np.float32)
    Y = (X @ np.linalg.qr(rng.normal(size=(d, d)))[0] + 0.8 * rng.normal(size=X.shape)).astype(np.float32)
    X, Y = np.vstack([X, X[:120]]), np.vstack([Y, Y[:120]])  # 120 pairs twice

    class Rows:  # rows read when indexed, and counted: never whole
        def __init__(self, A):
            self.A, self.shape, self.read = A, A.shape, []

        def __getitem__(self, rows):
            self.read.append(len(rows))
            return self.A[rows]

    want = align.cross_val_top1(X, Y, align.fit_procrustes, random_state=3)
    fitted = []

    def fit(rows):
        fitted.append(rows)
        return align.fit_procrustes(X[rows], Y[rows])

    R, S = Rows(X), Rows(Y)
    got = align.cross_val_top1(R, S, fit, random_state=3, groups=align.validation.pair_groups(X, Y), fit_rows=True)
    assert got == want and len(fitted) == 5 and sum(R.read) == sum(S.read) == want["n_rows"]
    assert all(np.all(np.diff(rows) > 0) for rows in fitted)  # sorted training rows, every copy of a pair
    first = np.arange(400)
    plain = align.cross_val_top1(X[:400], Y[:400], align.fit_procrustes, random_state=3)
    assert plain == align.cross_val_top1(X[:400], Y[:400], lambda rows: align.fit_procrustes(X[rows], Y[rows]),
                                         random_state=3, groups=(first, None), fit_rows=True)
    for bad in ((first,), (first + 400, None), (first, np.zeros(3, int)), "groups"):
        with pytest.raises(InputError, match="groups must be"):
            align.cross_val_top1(X[:400], Y[:400], align.fit_procrustes, groups=bad)
    with pytest.raises(InputError, match="fit_rows"):
        align.cross_val_top1(X[:400], Y[:400], align.fit_procrustes, fit_rows="yes")


def test_top1_at_puts_pools_of_any_size_on_one_scale():
    assert align.metrics.top1_at(0.97, 1000) == pytest.approx(0.97, abs=1e-3)
    assert align.metrics.top1_at(1.0, 1000) == 1.0 and align.metrics.top1_at(0.0, 2) == 0.0
    # a perfect score on a handful of queries is not certainty (it stayed 1.000 at any pool)
    assert align.metrics.top1_at(1.0, 2, n_queries=10) < 1e-6 < align.metrics.top1_at(1.0, 10, n_queries=50) < 0.5
    assert align.metrics.top1_at(1.0, 200, n_queries=5000) > 0.99
    # the same per-distractor error: a smaller pool reads higher raw, the same on the common scale (many queries)
    p, n = 1e-4, 10**6
    assert align.metrics.top1_at((1 - p) ** 199, 200, n_queries=n) == pytest.approx(
        align.metrics.top1_at((1 - p) ** 799, 800, n_queries=n), abs=5e-3)
    assert align.metrics.top1_at(0.99, 400) < align.metrics.top1_at(0.99, 800)


def test_top1_at_keeps_a_map_at_chance_at_chance_and_never_extrapolates_a_large_pool_upward():
    # a map at chance among 800 (5-fold CV of 4,000 shuffled pairs) read 0.287 on the 1,000 scale, and one at
    # chance among 8,192 (`eval --record` on the held-out rows) 0.885: it was chosen for the path over a real map
    top1_at = align.metrics.top1_at
    for pool in (200, 800, 999):
        assert top1_at(1.0 / pool, pool) <= 1.0 / 1000 + 1e-12
    for pool in (1000, 2000, 8192):
        assert top1_at(1.0 / pool, pool) == pytest.approx(1.0 / pool)
        assert top1_at(0.0172, pool) == pytest.approx(0.0172)  # a 20-pair map: 0.078 measured among 1,000
    assert top1_at(0.989, 400) == pytest.approx(0.970, abs=2e-3)  # the docstring's WordNet figures still hold
    assert top1_at(0.001, 8192) < top1_at(0.5, 800) < top1_at(0.6, 8192)


@pytest.mark.parametrize("family", ["procrustes", "ridge"])
def test_an_all_zero_row_maps_as_its_framed_row_does(family):
    """The fused apply took ``|unit(x)| = 1`` for every row; a zero row (an empty text's embedding) has unit(x) = 0,
    which the source frame turns into ``-mu/|mu|``. Through an orthogonal map its raw output had norm 0.21 and its
    frame output 0.50 (due: unit rows, the framed row's image); a ridge map's linear output was off the same way.
    Reference: the framed rows through the same W, b and target frame with an identity source frame."""
    from align.frames import Frame

    rng = np.random.default_rng(0)
    X = rng.normal(size=(500, 24)).astype(np.float32) + 0.7
    Q = np.linalg.qr(rng.normal(size=(24, 24)))[0]
    Y = (X @ Q + 0.3 + 0.05 * rng.normal(size=X.shape)).astype(np.float32)
    m = align.fit_procrustes(X[4:], Y[4:]) if family == "procrustes" else align.fit_ridge(X[4:], Y[4:], alpha=1.0)
    X[3] = 0.0
    ref = align.LinearMap(m.W, m.bias, Frame.identity(24), m.target_frame)
    framed = m.source_frame.apply(X)
    for output in ("raw", "frame", "linear"):
        want = ref.apply(framed, output=output)
        np.testing.assert_allclose(m.apply(X, output=output), want, atol=1e-5)
        np.testing.assert_allclose(m.apply(X[3:4], output=output), want[3:4], atol=1e-5)  # the one-row path


def _planted_plan_pairs(n=1500, d_t=12, noise=0.3, seed=0):
    """An affine map from 16-d into ``d_t``-d plus noise: at ``d_t`` = 32 the new space has 16 dimensions the old one
    does not predict, so mapped rows lack that noise and, as stand-in distractors, outrank native rows."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 16)) + rng.normal(size=(12, 16))[rng.integers(0, 12, n)] * 2
    Y = X @ rng.normal(size=(16, d_t)) + noise * rng.normal(size=(n, d_t))
    return X.astype(np.float32), Y.astype(np.float32)


def test_a_plan_recommending_auto_names_the_method_its_forecast_is_of():
    """QA: from K = 1,000 the plan recommended ``{"method": "auto"}`` beside a forecast and interval of procrustes or
    ridge, and auto then fitted a cluster or contrastive map measuring far outside it (WordNet glove->minilm, K =
    10,000: procrustes 0.211 [0.149, 0.272], auto's cluster map 0.69). ``recommended.forecast_method`` now names the
    forecast's method, and a note says the interval is of it, not of what auto fits; below 1,000 the two agree."""
    from align.plan import AUTO_NOTE

    X, Y = _planted_plan_pairs()
    kw = {"random_state": 0, "select_rows": False, "target_ks": (100, 1000)}
    at = [q["retention"] for q in align.plan_migration(X, X[:300], Y[:300], target_retention=0.05, **kw)["predicted"]]
    assert at[0] < at[1]  # K = 1,000 reaches what K = 100 does not (no K reaching it recommends the whole corpus)
    big = align.plan_migration(X, X[:300], Y[:300], target_retention=at[1], **kw)
    rec = big["recommended"]
    assert (rec["method"], rec["k"], rec["whole_corpus"]) == ("auto", 1000, False)
    assert rec["forecast_method"] == big["predicted"][-1]["method"] in ("procrustes", "ridge")
    assert AUTO_NOTE.format(m=rec["forecast_method"], k=1000) in big["notes"]
    assert "usually measures above that interval" in AUTO_NOTE and "not a prediction of what auto fits" in AUTO_NOTE
    small = align.plan_migration(X, X[:300], Y[:300], random_state=0, select_rows=False, target_ks=(100, 1000),
                                 target_retention=0.05)
    rec = small["recommended"]
    assert rec["k"] == 100 and rec["method"] == rec["forecast_method"] == small["predicted"][0]["method"]
    assert not any("auto" in n for n in small["notes"])
    whole = align.plan_migration(X[:1200], X[:300], Y[:300], random_state=0, select_rows=False,
                                 target_ks=(100, 3000), target_retention=1.0)  # re-embed it all: no map to forecast
    assert whole["recommended"]["whole_corpus"] and not any("(forecast_method)" in n for n in whole["notes"])


def test_a_plan_whose_proxy_curve_exceeds_one_says_what_that_means():
    """QA: nn_retention with mapped distractors ran 1.12-1.14 (WordNet minilm->paraphrase-L3) with no word of it; the
    forecast is clipped to 1. The statistic is unchanged; a note now says a curve point exceeded 1 and what that
    means, and only then."""
    from align.plan import OVER_ONE_NOTE
    from align.retrieval import nn_retention

    X, Y = _planted_plan_pairs(d_t=32)
    over = align.plan_migration(X, X[:300], Y[:300], random_state=0, select_rows=False, target_ks=(100,))
    peak = max(((m, q) for m, c in over["curve"].items() for q in c), key=lambda mq: mq[1]["mean"])
    assert peak[1]["mean"] > 1.05 and all(q["retention"] <= 1.0 for q in over["predicted"])
    assert OVER_ONE_NOTE.format(r=peak[1]["mean"], m=peak[0], k=peak[1]["k"]) in over["notes"]
    assert "can exceed 1" in nn_retention.__doc__
    X, Y = _planted_plan_pairs(d_t=12)
    under = align.plan_migration(X, X[:300], Y[:300], random_state=0, select_rows=False, target_ks=(100,))
    assert max(q["mean"] for c in under["curve"].values() for q in c) <= 1.0
    assert not any("> 1" in n for n in under["notes"])
