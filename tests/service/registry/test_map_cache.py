"""The registry's cache of loaded maps is bounded by bytes, not only by a count.

Before, it kept 64 entries whatever their size (``MAP_CACHE_SIZE``): 64 maps of 4,096-d are 4.3 GB, cluster maps
more, and no setting changed it. Now ``cache_bytes`` (``Settings.map_cache_mb`` in a server) bounds the bytes of
the arrays the entries hold, a linear map's apply plan (built at its first apply, after it was stored) included.
"""

from __future__ import annotations

import numpy as np
import pytest

import align
from service.registry import Registry
from service.registry.cache import held_bytes

D = 64


@pytest.fixture
def maps(tmp_path):
    """Six 64 x 64 maps registered (``(versions, fitted maps)``) and a fresh registry's url and artifacts."""
    reg = Registry(f"sqlite:///{tmp_path / 'reg.sqlite'}", tmp_path / "artifacts")
    versions, fitted = [], []
    for seed in range(6):
        rng = np.random.default_rng(seed)
        X = rng.normal(size=(128, D))
        m = align.fit_procrustes(X, X @ rng.normal(size=(D, D)))
        versions.append(reg.register_version(f"m{seed}", m, source_space="a", target_space="b",
                                             method="procrustes", params={}))
        fitted.append(m)
    reg.close()
    return versions, fitted, (reg.url, reg.store.root)


def _used_size(m) -> int:
    """Bytes one loaded map holds once it has been applied (its apply plan built)."""
    m.apply(np.zeros((1, D), np.float32))
    return held_bytes(m)


def test_loading_maps_past_the_byte_budget_evicts_the_least_recently_used(maps):
    versions, fitted, (url, root) = maps
    probe = Registry(url, root, cache_bytes=None)
    per = _used_size(probe.load_map(versions[0]))
    assert per > 2 * D * D * 4 - 1  # the weights and the float32 plan the first apply builds
    budget = int(3.4 * per)
    reg = Registry(url, root, cache_size=64, cache_bytes=budget)
    X = np.random.default_rng(9).normal(size=(5, D)).astype(np.float32)

    def held() -> list[int]:
        return [i for i, v in enumerate(versions) if reg.cached_map(v) is not None]

    for i, v in enumerate(versions):
        m = reg.load_map(v)
        np.testing.assert_allclose(m.apply(X), fitted[i].apply(X), rtol=1e-5, atol=1e-5)
        stats = reg.cache.stats()
        assert stats["bytes"] <= budget and stats["max_bytes"] == budget, stats
    assert held() == [3, 4, 5]  # three fit in 3.4 maps' bytes; the count bound (64) was never reached
    reg.load_map(versions[3])  # now the most recently used
    np.testing.assert_allclose(reg.load_map(versions[0]).apply(X), fitted[0].apply(X), rtol=1e-5, atol=1e-5)
    # 0's apply plan, built after it was stored, is counted when the cache is next measured (a store, /v1/info)
    assert reg.cache.stats() == {"entries": 3, "max_entries": 64, "bytes": 3 * per, "max_bytes": budget}
    assert held() == [0, 3, 5]  # 4 was the least recently used


def test_a_map_larger_than_the_budget_is_served_but_not_kept(maps):
    versions, fitted, (url, root) = maps
    reg = Registry(url, root, cache_bytes=1000)  # less than one 64 x 64 float32 matrix
    X = np.random.default_rng(9).normal(size=(5, D)).astype(np.float32)
    for _ in range(2):
        np.testing.assert_allclose(reg.load_map(versions[1]).apply(X), fitted[1].apply(X), rtol=1e-5, atol=1e-5)
    assert reg.cached_map(versions[1]) is None
    assert reg.cache.stats()["entries"] == 0 and reg.cache.stats()["bytes"] == 0


def test_held_bytes_counts_each_array_once_through_chains_and_frames():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(64, 8))
    m = align.fit_procrustes(X, X @ rng.normal(size=(8, 8)))
    one = held_bytes(m)
    assert one >= m.W.nbytes
    assert held_bytes(align.MapChain([m, m])) == one  # the same map twice: its arrays once
    assert held_bytes([m, {"again": m.W}]) == one


def test_a_server_keeps_its_maps_within_vecbridge_map_cache_mb(tmp_path, monkeypatch):
    """Four 256-d maps (~0.5 MB each once applied) through the HTTP transform with VECBRIDGE_MAP_CACHE_MB=1: every
    answer right, /v1/info shows the budget and at most 1 MiB held (before: all four, for as long as 64 fit)."""
    from _api_support import R, served_world

    monkeypatch.setenv("VECBRIDGE_MAP_CACHE_MB", "1")
    d = 256
    with served_world(tmp_path) as (client, app, _):
        reg = app.state.vb.registry
        reg.register_space("p", d)
        reg.register_space("q", d)
        rng = np.random.default_rng(0)
        X = rng.normal(size=(4, d)).astype(np.float32)
        for i in range(4):
            S = rng.normal(size=(2 * d, d))
            m = align.fit_procrustes(S, S @ rng.normal(size=(d, d)))
            reg.register_version(f"big{i}", m, source_space="p", target_space="q", method="procrustes", params={})
            r = client.post(f"/v1/maps/big{i}/transform", json={"vectors": X.tolist()}, headers=R)
            assert r.status_code == 200, r.text
            np.testing.assert_allclose(np.array(r.json()["vectors"]), m.apply(X), rtol=1e-4, atol=1e-4)
        cache = client.get("/v1/info", headers=R).json()["map_cache"]
    assert cache["setting_mb"] == 1 and cache["max_bytes"] == 1 << 20, cache
    assert 1 <= cache["entries"] <= 2 and 2 * d * d * 4 <= cache["bytes"] <= 1 << 20, cache


def test_a_map_is_sized_with_its_apply_plan_before_it_builds_it(maps):
    """A map was measured without the apply plan its first apply builds (about its W again): two maps whose W fit the
    budget together were stored, grew once applied, and evicted each other at every later miss (each then read from
    disk again). The plan is now counted when the map is stored, so two that fit stay."""
    versions, _, (url, root) = maps
    probe = Registry(url, root, cache_bytes=None)
    fresh = probe.load_map(versions[0])
    before = held_bytes(fresh)
    assert before == _used_size(fresh)
    reg = Registry(url, root, cache_size=64, cache_bytes=int(2.5 * before))
    X = np.ones((1, D), np.float32)
    for _ in range(4):  # used in turn, as two clients would
        for v in versions[:2]:
            reg.load_map(v).apply(X)
    assert [reg.cached_map(v) is not None for v in versions[:2]] == [True, True]
    assert reg.cache.stats()["bytes"] <= int(2.5 * before)


def _cluster_map(seed: int, d: int = 24, k: int = 6) -> align.ClusterMap:
    """A cluster map fitted on piecewise-linear pairs (one rotation per source cluster)."""
    rng = np.random.default_rng(seed)
    lab = rng.integers(0, k, 1200)
    X = rng.normal(size=(k, d))[lab] * 3.0 + rng.normal(size=(1200, d))
    A = np.stack([np.linalg.qr(rng.normal(size=(d, d)))[0] for _ in range(k)])
    m = align.fit_migration(X, np.einsum("nd,nde->ne", X, A[lab]), method="cluster", random_state=0)
    assert isinstance(m, align.ClusterMap) and m.n_clusters > 1
    return m


def test_a_cluster_map_is_sized_with_its_apply_plan_before_it_builds_it(tmp_path):
    """Only a linear map's plan was counted up front: a cluster map's (its W again, built at the first apply) was
    measured at the next miss or /v1/info, so while requests only hit the cache held about twice ``map_cache_mb``
    (QA: 4 cluster maps in a 20 MB cache held 38 MB), and when measured it evicted and read maps again. Now three
    cluster maps in a budget of 2.5 applied maps: at most two are kept, and what the cache holds stays within it."""
    reg = Registry(f"sqlite:///{tmp_path / 'reg.sqlite'}", tmp_path / "artifacts")
    versions = [reg.register_version(f"c{s}", _cluster_map(s), source_space="a", target_space="b", method="cluster",
                                     params={}) for s in range(3)]
    reg.close()
    probe = Registry(reg.url, reg.store.root, cache_bytes=None)
    fresh = probe.load_map(versions[0])
    before = held_bytes(fresh)
    fresh.apply(np.ones((1, fresh.source_dim), np.float32))
    assert before == held_bytes(fresh) > fresh.W.nbytes  # the plan counted before it was built
    assert before < 1.5 * fresh.W.nbytes  # and small: W is applied in place (the plan was a second W)
    assert fresh.planned_bytes() == 0
    budget = int(2.5 * before)
    cache = Registry(reg.url, reg.store.root, cache_size=64, cache_bytes=budget)
    X = np.random.default_rng(9).normal(size=(3, fresh.source_dim)).astype(np.float32)
    for _ in range(3):  # requests in turn; each map applied as soon as it is loaded
        for v in versions:
            cache.load_map(v).apply(X)
            held = [m for m in (cache.cached_map(u) for u in versions) if m is not None]
            assert len(held) <= 2 and sum(held_bytes(m) for m in held) <= budget  # what is held, measured now
