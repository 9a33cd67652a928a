"""The fitted objects as a notebook user handles them: ``==`` (a loaded copy equals what was saved, another fit does
not, never numpy's "truth value of an array is ambiguous"), ``hash`` (refused with the normal TypeError: the objects
can change) and a short ``repr`` (the dataclass one printed every array: 13,739 characters for a 384-d map)."""

import numpy as np
import pytest

import align


@pytest.fixture(scope="module")
def pairs():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((400, 16)).astype(np.float32)
    Q = np.linalg.qr(rng.standard_normal((16, 16)))[0]
    Y = (X @ Q + 0.1 * rng.standard_normal((400, 16))).astype(np.float32)
    return X, Y


@pytest.fixture(scope="module")
def objects(pairs):
    """Two different objects of each kind: (name, a, b)."""
    X, Y = pairs
    labels = np.where(np.arange(400) % 2 == 0, 1, -1)
    proc, ridge = align.fit_procrustes(X, Y), align.fit_ridge(X, Y)
    cluster = align.fit_migration(X, Y, method="cluster", random_state=0)
    cluster2 = align.fit_migration(X, Y, method="cluster", random_state=1, n_clusters=3)
    return [
        ("LinearMap", proc, ridge),
        ("ClusterMap", cluster, cluster2),
        ("MapChain", align.MapChain([proc, ridge]), align.MapChain([ridge, proc])),
        ("Frame", proc.source_frame, align.Frame.fit(Y)),
        ("Steer", align.fit_steer(X, labels, rank=2, random_state=0), align.fit_steer(X, -labels, rank=2,
                                                                                       random_state=0)),
        ("MeanShift", align.fit_mean_shift(X, labels), align.fit_mean_shift(X, -labels)),
    ]


def _round_trip(obj):
    if isinstance(obj, align.Frame):  # stored inside a map: its metadata and its mean array
        return align.Frame.from_meta(obj.to_meta(), obj.mean)
    return type(obj).from_bytes(obj.to_bytes())


def test_equal_by_value(objects):
    for name, a, b in objects:
        loaded = _round_trip(a)
        assert loaded is not a
        assert loaded == a and a == loaded and (loaded != a) is False, name
        assert a in [b, loaded], name
        assert a != b and (a == b) is False, name
        assert b not in [a, loaded], name
        assert a != "a string" and a != a.__dict__, name


def test_equal_needs_same_arrays_dtype_and_metadata(pairs):
    X, Y = pairs
    m = align.fit_procrustes(X, Y)
    other = align.LinearMap(m.W.copy(), None, m.source_frame, m.target_frame, dict(m.metadata))
    assert other == m
    other.W = m.W.copy()
    other.W[0, 0] += 1e-3
    assert other != m
    assert align.LinearMap(m.W, None, m.source_frame, m.target_frame, {**m.metadata, "method": "x"}) != m
    assert align.LinearMap(m.W, np.zeros(16), m.source_frame, m.target_frame, m.metadata) != m  # a bias of zeros
    f = m.source_frame
    assert align.Frame(f.dim, f.mean.astype(np.float32), f.unit_in, f.unit_out, f.n_fit) == f
    assert align.Frame(f.dim, None, f.unit_in, f.unit_out, f.n_fit) != f
    # wall-clock entries are not written into an artifact, so they do not make a loaded map another one
    timed = align.fit_migration(X, Y, method="procrustes", random_state=0)
    assert "fit_seconds" in timed.metadata and align.LinearMap.from_bytes(timed.to_bytes()) == timed


def test_not_hashable(objects):
    for name, a, _ in objects:
        with pytest.raises(TypeError, match="unhashable type"):
            hash(a)
        with pytest.raises(TypeError, match="unhashable type"):
            {a}  # noqa: B018


def test_short_repr(objects, pairs):
    for name, a, _ in objects:
        r = repr(a)
        assert r.startswith(f"{name}(") and len(r) < 160, r
        assert "array" not in r and "\n" not in r, r
    m = align.fit_procrustes(*pairs)
    assert repr(m) == "LinearMap(16 -> 16, method='procrustes', n_pairs=400)"
    assert repr(m.source_frame) == "Frame(dim=16, centered=True, unit_in=True, unit_out=True, n_fit=400)"
    cluster = objects[1][1]
    assert repr(cluster).startswith(f"ClusterMap(16 -> 16, n_clusters={cluster.n_clusters}, blend={cluster.blend}")
    steer = objects[4][1]
    assert repr(steer).startswith(f"Steer(dim=16, rank={steer.rank}, method=")
