"""Block executors (align.blocks): any executor gives the same bits as the serial default."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import align
from align.blocks import executing, serial
from align.frames import unit_rows
from align.kmeans import lloyd, row_blocks

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


def test_lloyd_blocks_any_executor():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(2000, 6)).astype(np.float32)
    init = X[:5]
    a = lloyd(row_blocks(X, 300), init, n_iter=20)
    b = lloyd(row_blocks(X, 300), init, n_iter=20, executor=reversed_threads)
    np.testing.assert_array_equal(a[0], b[0])
    assert a[1:] == b[1:]


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
