"""Peak memory of align's whole-input paths stays bounded by a block, not by the data (or the data squared).

tracemalloc sees numpy's allocations, so each test measures the peak of one call and compares it with the
size of its input: a path that copies the whole input (or builds a block of every candidate) fails.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from _memory import MiB
from _memory import peak as _peak

import align
from align.metrics import ranks
from align.retrieval import relevant_ranks
from align.validation import as_matrix


def _rows(n: int, d: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, d), dtype=np.float32)


def _unit(X: np.ndarray) -> np.ndarray:
    return (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)


def test_as_matrix_checks_finiteness_without_a_mask_of_the_whole_input():
    # a (n, d) boolean mask is a quarter of the float32 input: 390 MB at 1M x 384
    X = _rows(200_000, 64)  # 51 MB
    out, peak = _peak(as_matrix, X)
    assert out is X  # no copy of a checked float32 C-contiguous input
    assert peak < 2 * MiB, f"as_matrix allocated {peak / MiB:.1f} MiB for a {X.nbytes / MiB:.0f} MiB input"
    X[123_456, 7] = np.nan
    with pytest.raises(align.exceptions.NonFiniteError, match="1 row"):
        as_matrix(X)


def test_as_matrix_of_float64_rows_copies_once():
    X = _rows(100_000, 64).astype(np.float64)  # 51 MB; the float32 copy is 26 MB
    out, peak = _peak(as_matrix, X)
    assert out.dtype == np.float32
    assert peak < out.nbytes + 4 * MiB, f"{peak / MiB:.1f} MiB for a {out.nbytes / MiB:.0f} MiB result"


@pytest.mark.parametrize("fn", ["ranks", "relevant_ranks"])
def test_rank_kernels_hold_a_bounded_score_block(fn):
    # the score block was block_size (2,048 / 1,024) x all candidates: 8 GB at 1M candidates
    if fn == "ranks":
        D = _unit(_rows(30_000, 8, 2))  # 1 MB of rows; the old block of scores: 245 MB
        r, peak = _peak(ranks, D, D)
        assert (r == 1).all()
    else:
        D = _unit(_rows(100_000, 16, 2))  # 6.4 MB of rows; the old block: 410 MB of scores + 100 MB of flags
        Q = D[:3000] + 0.01 * _rows(3000, 16, 1)
        r, peak = _peak(relevant_ranks, Q, D, np.arange(3000))
        assert (r == 1).mean() > 0.99
    assert peak < 80 * MiB, f"{fn} held {peak / MiB:.0f} MiB of scores for {D.shape[0]} candidates"


def test_ranks_same_with_any_block():
    rng = np.random.default_rng(3)
    D = _unit(rng.standard_normal((500, 8)).astype(np.float32))
    Q = D + 0.3 * rng.standard_normal(D.shape).astype(np.float32)
    ref = ranks(Q, D, block_size=500)
    assert (ranks(Q, D, block_size=7) == ref).all()
    r_q, r_d = rng.random(500).astype(np.float32), rng.random(500).astype(np.float32)
    csls = ranks(Q, D, r_q=r_q, r_d=r_d, block_size=7)
    S = 2.0 * (Q @ D.T) - r_d[None, :] - r_q[:, None]
    assert (csls == 1 + (S > np.diag(S)[:, None]).sum(axis=1)).all()


def test_plan_migration_does_not_copy_the_old_corpus():
    # the plan framed the whole corpus (a concatenated copy and a framed copy, never used) and projected
    # a unit copy of it for the rows to re-embed: 4.2x the corpus at its peak (1M x 384 rows: 6.4 GB)
    rng = np.random.default_rng(0)
    d = 128  # wider than the 64 axes the rows to re-embed are drawn on
    R = np.linalg.qr(rng.standard_normal((d, d)))[0].astype(np.float32)
    X_old = _rows(150_000, d, 4)  # 77 MB
    A = X_old[:400] + 0.05 * _rows(400, d, 5)
    B = A @ R
    # a target K = 1,000 reaches: the k-means++ rows of a migration (none reaching it recommends every row)
    res, peak = _peak(align.plan_migration, X_old, A, B, random_state=0, target_ks=(100, 1000), target_retention=0.5)
    assert res["rows_to_embed"] and len(res["rows_to_embed"]) <= 1000
    assert peak < X_old.nbytes, f"plan held {peak / MiB:.0f} MiB for a {X_old.nbytes / MiB:.0f} MiB corpus"


def test_a_cluster_maps_first_apply_allocates_less_than_its_W():
    # the apply plan was an einsum over W.astype(float64) (2x W) and [W_j; mu_s W_j; b_j] stacked (1x W more), so
    # the first transform by a 1.2 GB 3072-d map of 32 clusters took RSS from 1.2 to 5.8 GB, and the plan kept
    # a second copy of W for good; W is now used in place
    k, d = 16, 384
    fs, ft = (align.Frame.fit(_rows(500, d, s) + 0.5) for s in (1, 2))
    cm = align.ClusterMap(_unit(_rows(k, d, 3)), _rows(k * d, d, 4).reshape(k, d, d) / np.float32(np.sqrt(d)),
                          0.01 * _rows(k, d, 5), fs, ft, blend=3, temperature=0.05)
    X = _rows(64, d, 6) + 0.5
    tracemalloc.start()
    try:
        out = cm.apply(X[:1], output="linear")  # builds the plan
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < cm.W.nbytes / 2, f"first apply peaked at {peak / cm.W.nbytes:.2f} x W"
    assert held < cm.W.nbytes / 8, f"the plan holds {held / cm.W.nbytes:.2f} x W"
    F = fs.apply(X).astype(np.float64)  # stage by stage: route, each cluster's affine map, blend
    top, w = cm.route(F.astype(np.float32))
    ref = sum(w[:, i, None] * (np.einsum("nd,nde->ne", F, cm.W[top[:, i]].astype(np.float64)) + cm.bias[top[:, i]])
              for i in range(top.shape[1]))
    np.testing.assert_allclose(out[0], ref[0], rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(cm.apply(X, output="linear"), ref, rtol=1e-5, atol=2e-6)


def _big_maps() -> dict:
    """A 2048 x 2048 linear map (16 MiB of W) and a cluster map of 4 x 1024 x 1024 (16 MiB), with frames and bias."""
    d = 1024
    fs, ft = (align.Frame.fit(_rows(200, d, s) + 0.5) for s in (1, 2))
    return {"linear": align.LinearMap(_rows(2048, 2048, 3), _rows(1, 2048, 4)[0]),
            "cluster": align.ClusterMap(_unit(_rows(4, d, 5)), _rows(4 * d, d, 6).reshape(4, d, d), _rows(4, d, 7),
                                        fs, ft)}


@pytest.mark.parametrize("fmt", ["npz", "safetensors"])
@pytest.mark.parametrize("kind", ["linear", "cluster"])
def test_loading_a_map_file_holds_its_arrays_once(tmp_path, kind, fmt):
    # load_map read the whole file as bytes, parsed the arrays beside them and checked W's finiteness with a mask of
    # W's size: a 1.2 GB cluster map peaked at 2.25x its size in a server's first transform and in the CLI; the
    # arrays are now read from the file into place and checked block by block
    m = _big_maps()[kind]
    path = m.save(tmp_path / f"m.{fmt}")
    arrays = sum(a.nbytes for a in (m.W, getattr(m, "bias", None), getattr(m, "centroids", None),
                                    m.source_frame.mean, m.target_frame.mean) if a is not None)
    back, peak = _peak(align.load_map, path)
    assert peak < arrays + 2 * MiB, f"loading held {peak / MiB:.1f} MiB for {arrays / MiB:.1f} MiB of arrays"
    np.testing.assert_array_equal(back.W, m.W)
    X = _rows(3, m.source_dim, 8)
    np.testing.assert_array_equal(back.apply(X), m.apply(X))
    np.testing.assert_array_equal(align.map_from_bytes(path.read_bytes()).apply(X), m.apply(X))


def test_a_maps_arrays_are_checked_finite_without_a_mask_of_them():
    W = _rows(2048, 2048)  # 16 MiB; a mask of it is 4 MiB
    out, peak = _peak(align.LinearMap, W)
    assert out.W is W and peak < 2 * MiB, f"{peak / MiB:.1f} MiB to check a {W.nbytes / MiB:.0f} MiB W"
    W[2047, 2047] = np.inf
    with pytest.raises(align.exceptions.NonFiniteError, match="W contains NaN or Inf"):
        align.LinearMap(W)
    with pytest.raises(align.exceptions.NonFiniteError, match="W .k, d_s, d_t. contains"):
        align.ClusterMap(np.eye(2, 2048, dtype=np.float32), np.stack([W[:, -4:], W[:, -4:]]), np.zeros((2, 4)),
                         align.Frame.identity(2048), align.Frame.identity(4))


@pytest.mark.parametrize("orthonormal", [True, False])
def test_a_linear_maps_first_apply_holds_about_two_W(orthonormal):
    # the apply plan held W in float64 (2x W), W W^T - I and its copies (3 x 2x W at 3072 x 3072: d_s x d_s float64
    # each) and [W; mu_s W; mu_t; b] stacked twice in float64: the first transform by a 3072 x 3072 map (36 MiB)
    # over HTTP peaked at +288 MiB; the Gram is now checked a block of rows at a time and the float64 W freed first
    d = 1024
    rng = np.random.default_rng(0)
    W = np.linalg.qr(rng.standard_normal((d, d)))[0].astype(np.float32) if orthonormal else _rows(d, d, 1) / 32
    fs, ft = (align.Frame.fit(_rows(200, d, s) + 0.5) for s in (2, 3))
    m = align.LinearMap(W, 0.01 * _rows(1, d, 4)[0], fs, ft)
    X = _rows(4, d, 5) + 0.5
    _, peak = _peak(m.apply, X)
    assert m._plan()["orth"] is orthonormal
    assert peak < 2.5 * W.nbytes, f"first apply peaked at {peak / W.nbytes:.2f} x W"
    G = W.astype(np.float64) @ W.T.astype(np.float64)  # the check the plan and is_orthogonal made on the whole Gram
    assert m._plan()["orth"] is bool(np.abs(G - np.eye(d)).max() <= 1e-5)
    assert align.LinearMap(W).is_orthogonal() is bool(np.allclose(G, np.eye(d), atol=1e-4)) is orthonormal
    assert align.LinearMap(W[:, :700]).is_orthogonal() is orthonormal  # orthonormal columns: W^T W = I


@pytest.mark.parametrize("kind", ["linear", "cluster", "chain"])
def test_a_float16_memmap_is_converted_a_batch_at_a_time(tmp_path, kind):
    """A float16 memmap (how a big .npy of embeddings is often kept) was converted to float32 whole before the
    apply's blocks: 61 MB beside the output for 40,000 x 384, whatever ``batch_size``. Each piece of ``batch_size``
    rows is converted on its own now, and the output has the bits of one call on the float32 rows."""
    d, n = 64, 120_001  # an odd tail: the last piece takes it (one row alone would take the one-row form)
    fs, ft = (align.Frame.fit(_rows(500, d, s) + 0.5) for s in (1, 2))
    m = {"linear": align.LinearMap(_rows(d, d, 3), _rows(1, d, 4)[0], fs, ft),
         "cluster": align.ClusterMap(_unit(_rows(4, d, 5)), _rows(4 * d, d, 6).reshape(4, d, d), _rows(4, d, 7),
                                     fs, ft),
         # a chain was converted whole before its first step; its pieces are whole blocks of both steps
         "chain": align.MapChain([align.LinearMap(_rows(d, d, 3), _rows(1, d, 4)[0], fs, ft),
                                  align.ClusterMap(_unit(_rows(4, d, 5)), _rows(4 * d, d, 6).reshape(4, d, d),
                                                   _rows(4, d, 7), ft, fs)])}[kind]
    path = tmp_path / "x16.npy"
    np.save(path, (_rows(n, d, 8) + 0.5).astype(np.float16))
    X = np.load(path, mmap_mode="r")
    m.apply(np.asarray(X[:2], dtype=np.float32))  # the apply plan, built before the measure
    out, peak = _peak(m.apply, X, batch_size=2048)
    converted = n * d * 4  # 29 MiB: the float32 copy of the whole input; a piece's (and its blocks'), ~5 MiB
    assert peak < out.nbytes + converted / 3, f"{(peak - out.nbytes) / MiB:.1f} MiB beside the output"
    np.testing.assert_array_equal(out, m.apply(np.asarray(X, dtype=np.float32), batch_size=2048))
    if kind == "chain":  # the same bits as each step applied to the whole input in one call
        X32 = np.asarray(X, dtype=np.float32)
        np.testing.assert_array_equal(out, m.steps[1].apply(m.steps[0].apply(X32, batch_size=2048), batch_size=2048))
    np.testing.assert_array_equal(m.apply(X[:3000], output="linear", batch_size=1000),
                                  m.apply(np.asarray(X[:3000], dtype=np.float32), output="linear", batch_size=1000))


@pytest.mark.parametrize("kind", ["linear", "cluster", "chain"])
def test_nan_in_a_float16_memmap_is_counted_over_the_whole_input(tmp_path, kind):
    """Applied a piece at a time, NaN rows in three pieces were reported as the first piece's count ("X: 1 row(s)
    contain NaN or Inf"); the count is the input's, as one call on its float32 rows says, and the kind is the same."""
    d = 16
    fs, ft = (align.Frame.fit(_rows(500, d, s) + 0.5) for s in (1, 2))
    lin = align.LinearMap(_rows(d, d, 3), _rows(1, d, 4)[0], fs, ft)
    m = {"linear": lin, "cluster": align.ClusterMap(_unit(_rows(4, d, 5)), _rows(4 * d, d, 6).reshape(4, d, d),
                                                    _rows(4, d, 7), fs, ft),
         "chain": align.MapChain([lin, lin])}[kind]
    X = (_rows(10_000, d, 8) + 0.5).astype(np.float16)
    X[[5, 4_100, 9_000]] = np.nan
    X[7_000, 3] = np.inf
    with pytest.raises(align.NonFiniteError, match=r"^X: 4 row\(s\) contain NaN or Inf \(rows 5, 4100, 7000, 9000\)$"):
        m.apply(X, batch_size=1024)
    with pytest.raises(align.NonFiniteError, match=r"^X: 4 row\(s\) contain NaN or Inf \(rows 5, 4100, 7000, 9000\)$"):
        m.apply(X.astype(np.float32), batch_size=1024)  # one call on the same rows: the message it matches
