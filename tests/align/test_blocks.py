"""Block executors (align.blocks): any executor gives the same bits as the serial default."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from hypothesis import given, settings
from hypothesis import strategies as st

import numpy as np
import pytest

import align
from align.blocks import executing, serial
from align.frames import unit_rows
from align.exceptions import EmptyInputError, InputError, TooFewRowsError
from align.kmeans import init_rows, kmeans, lloyd, row_blocks
from align.knn import faiss_available, knn_blocks

CALLS: list[int] = []


def reversed_threads(fn, arg_lists):
    """Runs the blocks on threads, last block first, and records how many blocks it saw."""
    CALLS.append(len(arg_lists))
    with ThreadPoolExecutor(2) as pool:
        futs = [pool.submit(fn, *a) for a in reversed(arg_lists)]
    return [f.result() for f in reversed(futs)]


def test_knn_blocks_through_any_executor_give_the_same_bits():
    rng = np.random.default_rng(0)
    Q, D = unit_rows(rng.normal(size=(300, 12)).astype(np.float32)), unit_rows(rng.normal(size=(500, 12)).astype(np.float32))
    CALLS.clear()
    for use_faiss in (True, False):
        S0, I0 = align.knn(Q, D, 5, block_size=16, use_faiss=use_faiss)
        S1, I1 = align.knn(Q, D, 5, block_size=16, use_faiss=use_faiss, executor=reversed_threads)
        np.testing.assert_array_equal(I0, I1)
        np.testing.assert_array_equal(S0, S1)
    assert CALLS and all(n > 1 for n in CALLS)  # really split into several blocks


@pytest.mark.parametrize("n, block, use_faiss", [(300, 16, False), (300, 16, True), (1000, 64, True), (129, 64, False),
                                                 (64, 64, False), (5, 64, True)])
def test_knn_query_blocks_are_of_equal_size(n, block, use_faiss):
    """Query blocks are all one size (the last a few rows shorter), never over the block size (8x with FAISS),
    and cover every query once in order: a parallel executor is not left waiting on one long block beside a
    short one (50,000 rows went as 3 x 16,384 + 848)."""
    sizes: list[list[int]] = []

    def recording(fn, arg_lists):
        sizes.append([a[0].shape[0] for a in arg_lists])
        return serial(fn, arg_lists)

    rng = np.random.default_rng(n)
    Q, D = rng.normal(size=(n, 8)).astype(np.float32), rng.normal(size=(40, 8)).astype(np.float32)
    S, I = align.knn(Q, D, 3, block_size=block, use_faiss=use_faiss, executor=recording)
    (got,) = sizes
    step = block * 8 if (use_faiss and faiss_available()) else block
    n_blocks = -(-n // step)  # as few blocks as the size allows ...
    assert len(got) == n_blocks and sum(got) == n and max(got) <= step
    assert len(set(got[:-1])) <= 1 and got[0] - n_blocks < got[-1] <= got[0]  # ... all one size, the last a few short
    np.testing.assert_array_equal(I, align.knn(Q, D, 3, use_faiss=use_faiss)[1])


def test_lloyd_blocks_any_executor():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(2000, 6)).astype(np.float32)
    init = X[:5]
    a = lloyd(row_blocks(X, 300), init, n_iter=20)
    b = lloyd(row_blocks(X, 300), init, n_iter=20, executor=reversed_threads)
    np.testing.assert_array_equal(a[0], b[0])
    assert a[1:] == b[1:]


def test_kmeans_seeded_init_through_any_executor_gives_the_same_bits():
    rng = np.random.default_rng(4)
    X = (rng.normal(scale=3.0, size=(5, 6))[rng.integers(0, 5, 1500)] + rng.normal(size=(1500, 6))).astype(np.float32)
    blocks = row_blocks(X, 400)
    CALLS.clear()
    a = kmeans(blocks, 5, random_state=9, n_iter=15)
    b = kmeans(blocks, 5, random_state=9, n_iter=15, executor=reversed_threads)
    assert CALLS and all(n == 4 for n in CALLS)  # one task per block and iteration
    np.testing.assert_array_equal(a[0], b[0])
    assert a[1:] == b[1:]
    # the seeded start is k distinct data rows; the same seed draws the same rows, another seed others
    C0 = init_rows(blocks, 5, random_state=9)
    assert all(any((row == x).all() for x in X.astype(np.float64)) for row in C0)
    np.testing.assert_array_equal(C0, init_rows(blocks, 5, random_state=9))
    assert not np.array_equal(C0, init_rows(blocks, 5, random_state=10))
    np.testing.assert_array_equal(a[0], lloyd(blocks, C0, n_iter=15)[0])
    # blocks opened where the task runs: descriptors (row ranges) in, the same bits out
    ranges = [(s, min(s + 400, 1500)) for s in range(0, 1500, 400)]
    c = kmeans(ranges, 5, random_state=9, n_iter=15, open_block=lambda r: X[r[0]:r[1]], executor=reversed_threads)
    np.testing.assert_array_equal(a[0], c[0])


def test_kmeans_bad_input_raises_typed_errors():
    X = np.zeros((10, 3), np.float32)
    with pytest.raises(TooFewRowsError):
        kmeans([X], 11)
    with pytest.raises(EmptyInputError):
        kmeans([], 2)
    with pytest.raises(InputError):
        kmeans([X], 2, init=np.zeros((3, 3)))
    with pytest.raises(InputError):
        kmeans([X], 0)


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 200), k=st.integers(1, 12), cuts=st.lists(st.integers(1, 199), max_size=4),
       seed=st.integers(0, 2**16))
def test_knn_over_database_blocks_equals_one_search(m, k, cuts, seed):
    rng = np.random.default_rng(seed)
    D = unit_rows(rng.normal(size=(m, 5)).astype(np.float32))
    Q = unit_rows(rng.normal(size=(17, 5)).astype(np.float32))
    edges = [0, *sorted({c for c in cuts if c < m}), m]
    blocks = [D[a:b] for a, b in zip(edges[:-1], edges[1:])]
    S, I = knn_blocks(Q, blocks, k, executor=reversed_threads)
    S_ref, I_ref = align.knn(Q, D, k)
    assert I.shape == I_ref.shape == (17, min(k, m))
    np.testing.assert_allclose(S, S_ref, atol=1e-6)
    # the same neighbours up to ties: every returned id scores what the reference's k-th best allows
    np.testing.assert_allclose(np.take_along_axis(Q @ D.T, I, axis=1), S_ref, atol=1e-5)


def test_refinements_take_an_executor_and_give_the_serial_bits():
    from align.refine import bidirectional_polish, refine_icp, self_learning
    from align.semisup import sinkhorn_polish

    rng = np.random.default_rng(5)
    X = unit_rows(rng.normal(size=(1200, 10)).astype(np.float32))
    R = np.linalg.qr(rng.normal(size=(10, 10)))[0]
    Y = unit_rows((X @ R + 0.1 * rng.normal(size=X.shape)).astype(np.float32))[rng.permutation(1200)]
    W0 = np.eye(10)
    runs = [(refine_icp, dict(iters=3, sample=300, k=5, random_state=1)),
            (self_learning, dict(rounds=2, sample=500, final_rounds=1, random_state=1)),
            (bidirectional_polish, dict(rounds=2)), (sinkhorn_polish, dict(rounds=2))]
    for fn, kw in runs:
        CALLS.clear()
        W_a, h_a = fn(W0, X, Y, **kw)
        assert not CALLS
        W_b, h_b = fn(W0, X, Y, executor=reversed_threads, **kw)
        assert CALLS, fn.__name__  # the kernel's blocks went through the executor
        np.testing.assert_array_equal(W_a, W_b)
        assert [{k: v for k, v in h.items() if k != "seconds"} if isinstance(h, dict) else h for h in h_a] == \
               [{k: v for k, v in h.items() if k != "seconds"} if isinstance(h, dict) else h for h in h_b]


@pytest.mark.filterwarnings("ignore::align.exceptions.ConvergenceWarning")  # noise data: equality is the point
def test_minivec2vec_with_an_executor_is_bit_for_bit_the_serial_fit():
    rng = np.random.default_rng(2)
    d = 16
    X = rng.normal(size=(800, d)).astype(np.float32)
    R = np.linalg.qr(rng.normal(size=(d, d)))[0]
    Y = (X @ R + 0.05 * rng.normal(size=X.shape)).astype(np.float32)[rng.permutation(800)]  # unpaired
    kw = dict(random_state=3, n_anchor_runs=2, qap_restarts=2, refine1_iters=3, self_learning_rounds=2,
              n_clusters=10, anchor_sample=800)
    CALLS.clear()
    a = align.MiniVec2Vec(**kw).fit(X, Y)
    assert not CALLS
    b = align.MiniVec2Vec(**kw).fit(X, Y, executor=reversed_threads)
    assert CALLS  # the executor ran the kernels' blocks
    np.testing.assert_array_equal(a.map_.W, b.map_.W)
    with executing(serial):
        c = align.MiniVec2Vec(**kw).fit(X, Y)
    np.testing.assert_array_equal(a.map_.W, c.map_.W)


@pytest.mark.filterwarnings("ignore::align.exceptions.ConvergenceWarning")  # noise data: equality is the point
def test_thread_pool_executor_gives_the_serial_bits_and_checks_its_size():
    from align.blocks import thread_pool

    rng = np.random.default_rng(4)
    Q, D = unit_rows(rng.normal(size=(900, 12)).astype(np.float32)), unit_rows(rng.normal(size=(400, 12)).astype(np.float32))
    for workers in (1, 2, 3):
        ex = thread_pool(workers)
        for use_faiss in (True, False):
            S0, I0 = align.knn(Q, D, 7, block_size=16, use_faiss=use_faiss)
            S1, I1 = align.knn(Q, D, 7, block_size=16, use_faiss=use_faiss, executor=ex)
            np.testing.assert_array_equal(I0, I1)
            np.testing.assert_array_equal(S0, S1)
    X = rng.normal(size=(600, 10)).astype(np.float32)
    Y = (X @ np.linalg.qr(rng.normal(size=(10, 10)))[0]).astype(np.float32)[rng.permutation(600)]
    kw = dict(random_state=1, n_anchor_runs=2, qap_restarts=2, refine1_iters=3, self_learning_rounds=2,
              n_clusters=8, anchor_sample=600)
    a = align.MiniVec2Vec(**kw).fit(X, Y)
    b = align.MiniVec2Vec(**kw).fit(X, Y, executor=thread_pool(2))
    np.testing.assert_array_equal(a.map_.W, b.map_.W)
    for bad in (0, -1):
        with pytest.raises(InputError):
            thread_pool(bad)
