"""A map's cached apply constants (built at its first apply) against the map's own state.

``m.W = W2`` (the documented way to change a map) while another thread applied the map for the first time left a
cache of part old ``W``, part new one, for good (206 of 300 tries of a probe; cosine 0.974-0.99 to the due rows while
``m.W is W2``). And the cache travelled with the map: an applied map pickled at twice its size and another
``joblib.hash``, so a ``joblib.Memory`` cache missed."""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest

import align


class _Gated(np.ndarray):
    """``W`` as the map reads it: the first ``astype`` (the apply's constants reading ``W``) signals ``reading`` and
    waits until the test's main thread has assigned the map's ``W`` (``assigned``), a thread switch at the worst
    moment made certain. Views and slices share the gate."""

    def __array_finalize__(self, obj):
        self.gate = getattr(obj, "gate", None)

    def astype(self, *args, **kwargs):
        gate = self.gate
        if gate is not None and not gate["fired"]:
            gate["fired"] = True
            gate["reading"].set()
            assert gate["assigned"].wait(30), "the main thread never assigned W"
        return np.asarray(self).astype(*args, **kwargs)


def _assign_during_first_apply(m, W2, x):
    """Apply ``m`` to ``x`` in a thread that reaches the build of the apply constants, assign ``m.W = W2`` right
    then, let the build go on; returns that first apply's output."""
    gate = {"fired": False, "reading": threading.Event(), "assigned": threading.Event()}
    gated = m.W.view(_Gated)
    gated.gate = gate
    m.W = gated
    got = []
    t = threading.Thread(target=lambda: got.append(m.apply(x)))
    t.start()
    try:
        assert gate["reading"].wait(30), "the apply never read W"
        m.W = W2
    finally:
        gate["assigned"].set()
        t.join(60)
    assert not t.is_alive(), "the first apply still runs 60 s after W was assigned"
    assert got, "the first apply raised"
    return got[0]


@pytest.fixture(scope="module")
def pairs():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((400, 16)).astype(np.float32)
    Y = (X @ np.linalg.qr(rng.standard_normal((16, 16)))[0] + 0.1 * rng.standard_normal((400, 16))).astype(np.float32)
    return X, Y


@pytest.fixture(scope="module")
def maps(pairs):
    X, Y = pairs
    proc, ridge = align.fit_procrustes(X, Y), align.fit_ridge(X, Y)
    return {"linear": proc, "affine": ridge, "cluster": align.fit_migration(X, Y, method="cluster", random_state=0),
            "chain": align.MapChain([proc, align.fit_procrustes(Y, X)])}


@pytest.mark.parametrize("kind", ["linear", "affine", "cluster"])
def test_w_assigned_while_another_thread_first_applies_takes_effect(maps, pairs, kind):
    X = pairs[0]
    x = X[:8]
    m = align.map_from_bytes(maps[kind].to_bytes())  # never applied
    old = align.map_from_bytes(m.to_bytes())
    rng = np.random.default_rng(1)
    W2 = np.ascontiguousarray(-m.W[..., rng.permutation(m.W.shape[-1])])
    new = align.map_from_bytes(m.to_bytes())
    new.W = W2.copy()
    first = _assign_during_first_apply(m, W2, x)
    assert m.W is W2
    for _ in range(2):  # later applies: the new W, whole (they gave a mix of both, for good)
        np.testing.assert_array_equal(m.apply(X), new.apply(X))
        np.testing.assert_array_equal(m.apply(X[:1]), new.apply(X[:1]))  # the one-row path reads the same cache
    # the apply that raced the assignment used one W throughout (the one it read)
    np.testing.assert_array_equal(first, old.apply(x))


@pytest.mark.parametrize("kind", ["linear", "cluster", "chain"])
def test_an_applied_map_pickles_and_hashes_as_before(maps, pairs, kind):
    X = pairs[0]
    m = align.map_from_bytes(maps[kind].to_bytes())
    before = pickle.dumps(m)
    want = m.apply(X)
    after = pickle.dumps(m)
    assert after == before, f"{len(before)} -> {len(after)} bytes once applied"
    back = pickle.loads(after)
    assert back == m
    np.testing.assert_array_equal(back.apply(X), want)
    joblib = pytest.importorskip("joblib")
    fresh = align.map_from_bytes(maps[kind].to_bytes())
    assert joblib.hash(m) == joblib.hash(fresh)
