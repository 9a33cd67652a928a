"""FAISS indexes: brute-force references, deletes, persistence, concurrency, and the HTTP surface."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings as hsettings, strategies as st

from align.exceptions import DimensionMismatchError, InputError
from align.frames import unit_rows
from service.api import create_app
from service.indexes import IndexConflictError, IndexNotFoundError, IndexStore, RWLock, SpaceIndex, choose_kind
from _api_support import R, W, populate, settings_for
from conftest import run_cli


def brute(D_ids, D, Q, k):
    """Reference: exact cosine top-k by full sort (small sizes only)."""
    S = unit_rows(Q) @ unit_rows(D).T
    order = np.argsort(-S, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(S, order, axis=1), D_ids[order]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((2000, 24)).astype(np.float32)
    return X, rng.standard_normal((30, 24)).astype(np.float32)


def test_choose_kind():
    assert choose_kind(10) == "flat" and choose_kind(49_999) == "flat"
    assert choose_kind(50_000) == "hnsw" and choose_kind(999_999) == "hnsw"
    assert choose_kind(1_000_000) == "ivf"


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_exact_search_matches_brute_force(kind, data):
    X, Q = data
    ids = np.arange(1000, 1000 + len(X))
    idx = SpaceIndex.build("t", "s", X, ids=ids, kind=kind)
    S, I = idx.search(Q, 5, exact=True)
    S_ref, I_ref = brute(ids, X, Q, 5)
    np.testing.assert_array_equal(I, I_ref)
    np.testing.assert_allclose(S, S_ref, atol=1e-5)
    # approximate search with generous parameters finds the true neighbour
    S2, I2 = idx.search(Q, 5, ef_search=256, nprobe=idx.params.get("nlist"))
    assert (I2[:, 0] == I_ref[:, 0]).mean() >= 0.95


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_delete_add_and_reload(kind, data, tmp_path):
    X, Q = data
    store = IndexStore(tmp_path)
    idx = store.create("del", "s", X, kind=kind, payloads=[{"row": i} for i in range(len(X))])
    _, I = idx.search(Q, 1, exact=True)
    gone = np.unique(I[:, 0])
    assert idx.delete(gone.tolist() + [10**9]) == len(gone)  # unknown ids ignored
    assert idx.count == len(X) - len(gone)
    _, I2 = idx.search(Q, 10, exact=True)
    assert not np.isin(I2, gone).any()
    _, I3 = idx.search(Q, 10)
    assert not np.isin(I3, gone).any()
    with pytest.raises(IndexConflictError):
        idx.add(X[:2], ids=[int(I2[0, 0]), 5_000_000])
    with pytest.raises(InputError, match="more than once in the request"):  # 422: nothing stored conflicts
        idx.add(X[:2], ids=[7_000_000, 7_000_000])
    assert idx.delete([7_000_001, 7_000_001]) == 0  # a delete naming an id twice deletes it once
    back = idx.add(X[gone], ids=gone, payloads=[{"back": int(g)} for g in gone])
    np.testing.assert_array_equal(back, gone)
    _, I4 = idx.search(Q, 1, exact=True)
    np.testing.assert_array_equal(I4, I)
    # reload from disk: same answers, payloads, counters
    again = IndexStore(tmp_path)
    assert again.load_all() == 1
    re = again.get("del")
    assert re.count == len(X) and re.kind == kind
    _, I5 = re.search(Q, 1, exact=True)
    np.testing.assert_array_equal(I5, I)
    assert re.payloads[int(gone[0])] == {"back": int(gone[0])}
    assert re.payloads[int(np.setdiff1d(np.arange(len(X)), gone)[0])]["row"] >= 0
    new = re.add(X[:1])
    assert new[0] == re.next_id - 1 >= len(X)


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_updated_at_in_memory_is_the_one_persisted(kind, data, tmp_path):
    """After an add (a logged delta, and a snapshot of several blocks) the writer's ``updated_at`` is the one a reload
    reads. HNSW stamped a new time when it showed the rows after saving, so once restarted the index said an earlier
    time: a client polling ``updated_at`` as a change marker saw it go backwards."""
    X, _ = data
    idx = IndexStore(tmp_path).create("u", "s", X[:500], kind=kind)
    for add, deltas in ((lambda: idx.add(X[500:510]), 1), (lambda: idx.add_blocks([(X[510:520], None, None)] * 2), 0)):
        add()
        assert idx.logged_deltas == deltas  # saved as a delta, then as a snapshot
        assert idx.info().updated_at == IndexStore(tmp_path).get("u").info().updated_at, deltas


def test_hnsw_tombstones_fold_in_on_rebuild(data):
    X, Q = data
    idx = SpaceIndex.build("h", "s", X, kind="hnsw")
    idx.delete(list(range(150)))  # 7.5 %: tombstones
    assert len(idx.tombstones) == 150 and idx.index.ntotal == len(X)
    idx.delete(list(range(150, 260)))  # past 10 %: rebuilt
    assert not idx.tombstones and idx.index.ntotal == len(X) - 260 == idx.count
    _, I = idx.search(Q, 10, exact=True)
    assert (I >= 260).all()


def test_hnsw_upsert_takes_a_new_slot_instead_of_a_rebuild(data, tmp_path):
    """Delete an id and add it again (the only way to update a row) on HNSW.

    Before: tombstones were ids, so re-adding a deleted id rebuilt the whole graph under the write lock:
    13 s for one row of a 50k x 384 index, every search of it waiting meanwhile. Now tombstones are slots:
    the row takes a new slot, the old one stays dead until the 10 % fold-in, and every search sees the new row.
    """
    X, _ = data
    store = IndexStore(tmp_path)
    idx = store.create("up", "s", X, kind="hnsw", payloads=[{"row": i} for i in range(len(X))])
    v = -X[5:6]  # the new row of id 5: far from the old one
    assert idx.delete([5, 6]) == 2
    idx.add(v, ids=[5], payloads=[{"row": "new"}])
    assert idx.index.ntotal == len(X) + 1 and idx.count == len(X) - 1  # no rebuild
    live = idx._live_ids()
    assert np.unique(live).size == live.size == len(X) - 1 and 5 in live and 6 not in live
    for reopened in (idx, IndexStore(tmp_path).get("up")):  # in memory, and read back from disk
        for kw in ({"exact": True}, {"ef_search": 256}, {"csls_k": 5}):
            assert reopened.search(v, 1, **kw)[1][0, 0] == 5, kw
            I_old = reopened.search(X[5:6], 3, **kw)[1]  # the old row is gone: id 5 is far away now
            assert 5 not in I_old[0] and 6 not in I_old[0], kw
        np.testing.assert_allclose(reopened.search(v, 1, exact=True)[0][0, 0], 1.0, atol=1e-5)
        assert reopened.get_payloads(np.array([5])) == [{"row": "new"}]
    assert idx.delete([5]) == 1 and idx.count == len(X) - 2
    _, I = idx.search(np.vstack([v, X[5:6]]), 5, exact=True)
    assert 5 not in I


@hsettings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_hnsw_deletes_and_re_adds_match_a_model_property(seed, tmp_path_factory):
    """Random deletes and (re-)adds of ids, with reloads from disk: exact search equals brute force over the
    rows a dict model holds, and every live id reconstructs to its newest row (what CSLS reads)."""
    rng = np.random.default_rng(seed)
    root = tmp_path_factory.mktemp("hm")
    X0 = rng.standard_normal((60, 6)).astype(np.float32)
    idx = IndexStore(root).create("m", "s", X0, kind="hnsw")
    model = {i: X0[i] for i in range(60)}
    for step in range(40):
        free = [i for i in range(90) if i not in model]
        if rng.integers(2) and len(model) > 8 or len(free) < 4:
            ids = rng.choice(sorted(model), size=int(rng.integers(1, 5)), replace=False)
            assert idx.delete(ids.tolist()) == ids.size
            for i in ids.tolist():
                model.pop(i)
        else:
            ids = rng.choice(free, size=int(rng.integers(1, 4)), replace=False)
            V = rng.standard_normal((ids.size, 6)).astype(np.float32)
            idx.add(V, ids=ids.tolist())
            model.update(zip(ids.tolist(), V))
        if step % 10 == 9:
            idx = IndexStore(root).get("m")
        assert idx.count == len(model)
    ids = np.array(sorted(model))
    D = np.stack([model[i] for i in ids.tolist()])
    Q = rng.standard_normal((10, 6)).astype(np.float32)
    _, I_ref = brute(ids, D, Q, 5)
    np.testing.assert_array_equal(idx.search(Q, 5, exact=True)[1], I_ref)
    rows = np.stack([idx.index.reconstruct(int(i)) for i in ids])
    np.testing.assert_allclose(rows, unit_rows(D), atol=1e-5)


def test_hnsw_tombstones_of_an_older_meta_are_ids(data, tmp_path):
    """A meta of format 1 (tombstones as ids) loads with the same live rows; a slot outside the index is refused."""
    import json

    X, _ = data
    store = IndexStore(tmp_path)
    idx = store.create("old", "s", X, kind="hnsw")
    idx.delete([3, 4, 10])
    expected = sorted(idx._live_ids().tolist())
    meta_path = tmp_path / "old" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["format_version"] = 1
    meta["tombstones"] = [3, 4, 10]
    del meta["tombstone_slots"]
    meta_path.write_text(json.dumps(meta))
    old = SpaceIndex.load(tmp_path / "old")
    assert sorted(old._live_ids().tolist()) == expected and old.count == len(X) - 3
    assert not {3, 4, 10} & set(old.search(X[[3, 4, 10]], 5, exact=True)[1].ravel().tolist())
    meta.update(format_version=2, tombstone_slots=[len(X) + 7])
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(InputError, match="tombstone slots outside"):
        SpaceIndex.load(tmp_path / "old")


def test_bad_input(data):
    X, Q = data
    idx = SpaceIndex.build("b", "s", X[:50])
    with pytest.raises(DimensionMismatchError):
        idx.search(Q[:, :10], 3)
    with pytest.raises(InputError):
        idx.search(Q, 0)
    with pytest.raises(InputError):
        SpaceIndex.build("bad name", "s", X)
    with pytest.raises(InputError):
        SpaceIndex.build("x", "s", X, kind="lsh")
    with pytest.raises(InputError):
        idx.add(X[:3], payloads=[1])
    Xn = X[:3].copy()
    Xn[0, 0] = np.inf
    with pytest.raises(InputError):
        idx.add(Xn)
    with pytest.raises(IndexNotFoundError):
        IndexStore(__import__("pathlib").Path("/tmp/nonexistent-vb")).get("x")


def test_bad_rows_and_payloads_are_told_before_the_automatic_ids_run_out(data):
    """Past an id at the top of the range automatic ids are refused; a bad add said only that, so the user who
    followed its advice (explicit ids) met a second, different error. The add's own fault comes first. (Explicit ids
    stop at 2**61 now; an index that stored 2**62 - 1 before that, as its ``next_id`` records, is in this state.)"""
    X, _ = data
    idx = SpaceIndex.build("top", "s", X[:5])
    with pytest.raises(InputError, match=r"past the explicit ids' range 0 \.\. 2\*\*61 - 1"):
        idx.add(X[5:6], ids=[2**62 - 1])
    idx.add(X[5:6], ids=[2**61 - 1])
    idx.next_id = 2**62  # the next_id an index that stored 2**62 - 1 before the ceiling persisted
    with pytest.raises(InputError, match="payloads: expected a list of 1"):
        idx.add(X[6:7], payloads=[1, 2])
    with pytest.raises(InputError, match="zero"):
        idx.add(np.zeros((1, X.shape[1]), np.float32))
    with pytest.raises(InputError, match="automatic ids would pass"):
        idx.add(X[6:7])
    assert idx.count == 6


def test_fewer_rows_than_k(data):
    X, Q = data
    idx = SpaceIndex.build("few", "s", X[:3])
    S, I = idx.search(Q[:2], 5)
    assert (I[:, :3] >= 0).all() and (I[:, 3:] == -1).all()
    S, I = idx.search(Q[:2], 5, csls_k=2)
    assert (I[:, 3:] == -1).all()
    empty = SpaceIndex.build("e", "s", None, dim=24)
    assert (empty.search(Q[:1], 2)[1] == -1).all()


def csls_reference(D, Q, k, ck, weight):
    """Reference CSLS top-k ``(S, I)`` (row numbers of ``D``): ``2 cos(q, d) - r(q) - weight r(d)`` with exact
    ``r`` (mean of the ``ck`` best cosines, ``d`` itself left out), re-ranking the top ``max(4k, k + ck)``
    cosine candidates as the index does."""
    Qn, Dn = unit_rows(Q), unit_rows(D)
    C = Qn @ Dn.T
    r_q = np.sort(C, axis=1)[:, ::-1][:, :ck].mean(1)
    DD = Dn @ Dn.T
    np.fill_diagonal(DD, -np.inf)
    r_d = np.sort(DD, axis=1)[:, ::-1][:, :ck].mean(1)
    full = 2 * C - r_q[:, None] - weight * r_d[None, :]
    cand = np.argsort(-C, axis=1)[:, : max(4 * k, k + ck)]
    ref_I = np.take_along_axis(cand, np.argsort(-np.take_along_axis(full, cand, 1), axis=1)[:, :k], 1)
    return np.take_along_axis(full, ref_I, 1), ref_I


@pytest.mark.parametrize("weight", [None, 1.0, 0.0, 2.0])
def test_csls_matches_formula(data, weight):
    X, Q = data
    D = X[:300]
    idx = SpaceIndex.build("c", "s", D)
    k, ck = 5, 7
    if weight is None:  # the default: half the classic weight of r(d)
        S, I = idx.search(Q, k, csls_k=ck)
        weight = 0.5
    else:
        S, I = idx.search(Q, k, csls_k=ck, csls_weight=weight)
    S_ref, I_ref = csls_reference(D, Q, k, ck, weight)
    np.testing.assert_array_equal(I, I_ref)
    np.testing.assert_allclose(S, S_ref, atol=1e-5)
    if weight == 0.0:  # no document term: the cosine order
        np.testing.assert_array_equal(I, idx.search(Q, k, exact=True)[1])
    else:              # the document term moves some rows (this data has hubs)
        assert (I != idx.search(Q, k, exact=True)[1]).any()


@pytest.mark.parametrize("kind, approximate", [("ivf", {"nprobe": 1}), ("hnsw", {"ef_search": 1})])
def test_exact_csls_matches_formula_after_an_approximate_one(kind, approximate, data):
    """``r(d)`` cached by an approximate CSLS search must not serve an exact one (nor other settings).

    Before: the cache kept ``r(d)`` per (id, csls_k) only, so after one ``nprobe=1`` CSLS search of an IVF
    index an ``exact=True`` CSLS search re-ranked with the approximate ``r(d)``: other ids than the formula's,
    depending on which request came first.
    """
    X, Q = data
    params = {"nlist": 64} if kind == "ivf" else {"M": 4, "ef_construction": 8}
    idx = SpaceIndex.build("ca", "s", X, kind=kind, params=params)
    k, ck = 5, 10
    idx.search(Q, k, csls_k=ck, **approximate)
    S, I = idx.search(Q, k, csls_k=ck, exact=True)
    S_ref, I_ref = csls_reference(X, Q, k, ck, 0.5)
    np.testing.assert_array_equal(I, I_ref)
    np.testing.assert_allclose(S, S_ref, atol=1e-5)


def test_csls_cache_stays_bounded_by_the_index(data):
    """Requests varying csls_k (or ef_search / nprobe) each cache r(d) of their own; the cache stays within
    ``HUB_CACHE_PER_ROW x rows + HUB_CACHE_FLOOR`` values and answers stay those of the formula.

    Before: unbounded; 40 CSLS searches (k=1000, csls_k 1..40) of a 20k-row flat index cached 160,000
    values (+40 MiB RSS), and csls_k alone goes to 1000, every ef_search / nprobe multiplying that.
    """
    from service.indexes.csls import HUB_CACHE_FLOOR, HUB_CACHE_PER_ROW

    X, Q = data
    D = X[:300]
    idx = SpaceIndex.build("hc", "s", D)
    bound = HUB_CACHE_PER_ROW * len(D) + HUB_CACHE_FLOOR
    for ck in range(1, 101):  # k = 75: 300 candidates, r(d) of every row for each csls_k (30,000 uncapped)
        idx.search(Q[:1], 75, csls_k=ck)
        assert len(idx._hubs) <= bound
    S, I = idx.search(Q, 5, csls_k=7)
    S_ref, I_ref = csls_reference(D, Q, 5, 7, 0.5)
    np.testing.assert_array_equal(I, I_ref)
    np.testing.assert_allclose(S, S_ref, atol=1e-5)


def test_csls_cache_keeps_values_in_arrays_not_a_dict_per_value():
    """The r(d) cache holds its values in arrays: ~12 bytes a value plus a bounded dict of recent ones, and gives
    back exactly what it computed. Before: one dict entry per value (a tuple key of Python ints, a float; ~160
    bytes), ~320 MB at the bound of a 1M-row index. Measured with tracemalloc (numpy's buffers are traced too)."""
    import tracemalloc

    import faiss

    from service.indexes.csls import HubCache

    rng = np.random.default_rng(0)
    n, d, ck = 20_000, 8, 3
    X = rng.normal(size=(n, d)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    flat = faiss.IndexFlatIP(d)
    flat.add(X)
    hubs = HubCache()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        got = np.concatenate([hubs.hubness(np.arange(i, i + 500), ck, flat.search, flat.reconstruct)
                              for i in range(0, n, 500)])
        held = tracemalloc.get_traced_memory()[0] - base - got.nbytes
    finally:
        tracemalloc.stop()
    assert len(hubs) == n
    assert held / n < 40, f"{held / n:.0f} bytes per cached value"
    S, I = flat.search(X, ck + 1)
    ref = np.array([s[i != j][:ck].mean() for j, (s, i) in enumerate(zip(S, I))], np.float32)
    np.testing.assert_allclose(got, ref, atol=1e-6)
    some = rng.permutation(n)[:3000]
    again = hubs.hubness(some, ck, lambda *a: pytest.fail("recomputed a cached value"), flat.reconstruct)
    np.testing.assert_array_equal(again, got[some])
    assert len(hubs) == n


@pytest.mark.parametrize("bad", [-0.1, 2.5, float("nan"), float("inf"), True, "1", None])
def test_csls_weight_out_of_range_is_refused(data, bad):
    X, Q = data
    idx = SpaceIndex.build("cw", "s", X[:50])
    with pytest.raises(InputError, match="csls_weight"):
        idx.search(Q[:2], 3, csls_k=4, csls_weight=bad)


@hsettings(max_examples=10, deadline=None)
@given(n=st.integers(1, 60), k=st.integers(1, 8), seed=st.integers(0, 10_000))
def test_flat_is_exact_property(n, k, seed):
    rng = np.random.default_rng(seed)
    D = rng.standard_normal((n, 8)).astype(np.float32)
    Q = rng.standard_normal((4, 8)).astype(np.float32)
    idx = SpaceIndex.build("p", "s", D)
    S, I = idx.search(Q, k)
    kk = min(k, n)
    S_ref, _ = brute(np.arange(n), D, Q, kk)
    np.testing.assert_allclose(S[:, :kk], S_ref, atol=1e-5)  # scores (ids may swap on exact ties)


def test_rwlock_writer_excludes_readers():
    lock = RWLock()
    inside = {"r": 0, "w": 0, "bad": 0}
    guard = threading.Lock()

    def reader():
        for _ in range(200):
            with lock.read():
                with guard:
                    inside["r"] += 1
                    inside["bad"] += inside["w"] > 0
                with guard:
                    inside["r"] -= 1

    def writer():
        for _ in range(100):
            with lock.write():
                with guard:
                    inside["w"] += 1
                    inside["bad"] += inside["r"] > 0 or inside["w"] > 1
                with guard:
                    inside["w"] -= 1

    ts = [threading.Thread(target=reader) for _ in range(4)] + [threading.Thread(target=writer) for _ in range(2)]
    [t.start() for t in ts]
    [t.join(120) for t in ts]
    assert not [t for t in ts if t.is_alive()], "a thread still runs after 120 s"
    assert inside["bad"] == 0


def test_concurrent_search_during_writes(data):
    X, Q = data
    idx = SpaceIndex.build("cc", "s", X[:1000])
    ref = idx.search(Q, 3)[1]
    errors = []

    def searcher():
        try:
            for _ in range(30):
                S, I = idx.search(Q, 3)
                # rows added later (ids >= 1000) may outrank, never a torn or invalid answer
                assert (I >= 0).all() and np.isfinite(S).all()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def writer():
        for s in range(1000, 2000, 100):
            idx.add(X[s : s + 100], ids=np.arange(s, s + 100))
            idx.delete(list(range(s, s + 10)))

    ts = [threading.Thread(target=searcher) for _ in range(3)] + [threading.Thread(target=writer)]
    [t.start() for t in ts]
    [t.join(120) for t in ts]
    assert not [t for t in ts if t.is_alive()], "a thread still runs after 120 s"
    assert not errors
    assert idx.count == 2000 - 100
    S, I = idx.search(Q, 3, exact=True)
    S_ref, I_ref = brute(idx._live_ids(), np.vstack([X[:1000]] + [X[s + 10 : s + 100] for s in range(1000, 2000, 100)]),
                         Q, 3)
    np.testing.assert_array_equal(I, I_ref)
    assert ref.shape == I.shape


# --- HTTP ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def api(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("idx")
    app = create_app(settings_for(tmp))
    with TestClient(app) as c:
        d = populate(app.state.vb.registry)
        yield c, app, d, tmp


def test_http_index_lifecycle_and_cross_model_search(api):
    c, app, d, _ = api
    Z = d["Z"]
    r = c.post("/v1/indexes", headers=W, json={"name": "zc", "space": "c", "vectors": Z.tolist(),
                                               "ids": list(range(100, 100 + len(Z))),
                                               "payloads": [{"row": i} for i in range(len(Z))]})
    assert r.status_code == 201 and r.json()["count"] == len(Z) and r.json()["kind"] == "flat"
    assert c.post("/v1/indexes", headers=W, json={"name": "zc", "space": "c", "vectors": Z.tolist()}).status_code == 409
    assert c.get("/v1/indexes", headers=R).json()["data"][0]["name"] == "zc"
    # native search in c
    r = c.post("/v1/indexes/zc/search", headers=R, json={"vectors": Z[:4].tolist(), "k": 3})
    body = r.json()
    assert body["maps"] == [] and [h[0]["id"] for h in body["results"]] == [100, 101, 102, 103]
    assert body["results"][0][0]["payload"] == {"row": 0}
    # from space a: path a2b (prod) then b2c, composed
    X = d["X"][:20]
    r = c.post("/v1/indexes/zc/search", headers=R, json={"vectors": X.tolist(), "space": "a", "k": 5})
    body = r.json()
    assert [(m["name"], m["version"]) for m in body["maps"]] == [("a2b", 1), ("b2c", 1)]
    composed = d["a2b"].compose(d["b2c"])
    _, I_ref = brute(np.arange(100, 100 + len(Z)), Z, composed.apply(X, output="raw"), 5)
    assert [[h["id"] for h in row] for row in body["results"]] == I_ref.tolist()
    assert np.mean([row[0]["id"] == 100 + i for i, row in enumerate(body["results"])]) >= 0.9
    # pinned map with the wrong endpoints
    r = c.post("/v1/indexes/zc/search", headers=R, json={"vectors": X.tolist(), "space": "a", "map": "a2b"})
    assert r.status_code == 422 and "goes a -> b" in r.json()["error"]["message"]
    # space without a path, dims from the query space
    c.post("/v1/spaces", headers=W, json={"name": "island", "dim": 12})
    r = c.post("/v1/indexes/zc/search", headers=R, json={"vectors": [[0.1] * 12], "space": "island"})
    assert r.status_code == 404 and "no chain" in r.json()["error"]["message"]
    r = c.post("/v1/indexes/zc/search", headers=R, json={"vectors": [[0.1] * 12], "space": "a"})
    assert r.status_code == 422
    # base64 queries, CSLS, exact
    import base64

    r = c.post("/v1/indexes/zc/search", headers=R, json={
        "vectors_b64": base64.b64encode(X.tobytes()).decode(), "dim": 16, "space": "a", "k": 2, "csls": True,
        "exact": True, "include_payloads": False})
    body = r.json()
    assert body["scoring"] == "csls" and "payload" not in body["results"][0][0]
    for bad in (2.5, -1, "NaN", "x"):  # the document term's weight reaches the scoring: bounded, finite
        r = c.post("/v1/indexes/zc/search", headers=R, json={"vectors": X[:1].tolist(), "space": "a", "csls": True,
                                                              "csls_weight": bad})
        assert r.status_code == 422 and "csls_weight" in r.text, (bad, r.text)
    scores = {}
    for w in (None, 0.5, 1.0):
        extra = {} if w is None else {"csls_weight": w}
        got = c.post("/v1/indexes/zc/search", headers=R, json={"vectors": X.tolist(), "space": "a", "k": 3,
                                                                "csls": True, "exact": True, **extra}).json()
        assert got["scoring"] == "csls" and len(got["results"]) == len(X)
        scores[w] = [[h["score"] for h in row] for row in got["results"]]
    assert scores[None] == scores[0.5] != scores[1.0]      # the default is the half weight
    # add, delete, search again
    r = c.post("/v1/indexes/zc/vectors", headers=W, json={"vectors": Z[:2].tolist(), "payloads": ["x", "y"]})
    new_ids = r.json()["ids"]
    assert new_ids == [100 + len(Z), 101 + len(Z)]
    r = c.post("/v1/indexes/zc/delete", headers=W, json={"ids": [100, 101]})
    assert r.json()["deleted"] == 2 and r.json()["count"] == len(Z)
    hits = c.post("/v1/indexes/zc/search", headers=R, json={"vectors": Z[:1].tolist(), "k": 1}).json()["results"]
    assert hits[0][0]["id"] == new_ids[0] and hits[0][0]["payload"] == "x"
    assert c.post("/v1/indexes/zc/delete", headers=R, json={"ids": [1]}).status_code == 403
    assert c.post("/v1/indexes/nope/search", headers=R, json={"vectors": [[0.0] * 12]}).status_code == 404
    assert 'vecbridge_index_vectors{index="zc"}' in c.get("/metrics", headers=R).text


def test_http_index_reload_on_start(tmp_path):
    s = settings_for(tmp_path)
    app = create_app(s)
    with TestClient(app) as c:
        d = populate(app.state.vb.registry)
        c.post("/v1/indexes", headers=W, json={"name": "yb", "space": "b", "vectors": d["Y"].tolist(),
                                               "kind": "hnsw", "params": {"M": 16}})
        before = c.post("/v1/indexes/yb/search", headers=R, json={"vectors": d["X"][:5].tolist(), "space": "a"}).json()
    app2 = create_app(s)
    with TestClient(app2) as c:
        info = c.get("/v1/indexes/yb", headers=R).json()
        assert info["kind"] == "hnsw" and info["params"]["M"] == 16 and info["count"] == len(d["Y"])
        after = c.post("/v1/indexes/yb/search", headers=R, json={"vectors": d["X"][:5].tolist(), "space": "a"}).json()
        assert after["results"] == before["results"]
        assert c.get("/readyz").json()["checks"]["indexes"]["loaded"] == 1
        assert c.delete("/v1/indexes/yb", headers=W).status_code == 204
        assert c.get("/v1/indexes/yb", headers=R).status_code == 404
        assert not (tmp_path / "data" / "indexes" / "yb").exists()


def test_http_index_validation(api):
    c, _, d, _ = api
    r = c.post("/v1/indexes", headers=W, json={"name": "v1", "space": "c", "vectors": d["X"][:3].tolist()})
    assert r.status_code == 422 and "expected 12 columns" in r.json()["error"]["message"]
    r = c.post("/v1/indexes", headers=W, json={"name": "v2", "space": "nowhere", "vectors": [[0.0]]})
    assert r.status_code == 404
    r = c.post("/v1/indexes", headers=W, json={"name": "v3", "space": "c", "texts": ["hello"]})
    assert r.status_code == 404 and "no encoder" in r.json()["error"]["message"]
    r = c.post("/v1/indexes", headers=W, json={"name": "v 4", "space": "c", "vectors": [[0.0] * 12]})
    assert r.status_code == 422
    r = c.post("/v1/indexes", headers=W, json={"name": "v5", "space": "c", "vectors": [[0.0] * 12], "k": 3})
    assert r.status_code == 422 and "k" in r.json()["error"]["message"]
    for extra in ({"ids": [1, 2]}, {"payloads": [{"a": 1}]}):  # before: 201, an empty index, the ids dropped
        r = c.post("/v1/indexes", headers=W, json={"name": "v6", "space": "c", **extra})
        assert r.status_code == 422 and "without vectors" in r.json()["error"]["message"], r.text
        assert c.get("/v1/indexes/v6", headers=R).status_code == 404
    r = c.post("/v1/indexes", headers=W, json={"name": "v6", "space": "c", "ids": []})  # nothing to name: fine
    assert r.status_code == 201 and r.json()["count"] == 0, r.text
    # a seed in params was taken (201), then replaced by the top-level random_state (0): k-means ran with seed 0.
    # Now params' seed (where an index's info reports it) is the seed when random_state is not given, and two
    # seeds that differ are a 422
    ivf = {"name": "v7", "space": "c", "kind": "ivf", "vectors": d["Z"].tolist()}
    for top in (0, 3):
        body = {**ivf, "params": {"nlist": 4, "random_state": 7}, "random_state": top}
        r = c.post("/v1/indexes", headers=W, json=body)
        assert r.status_code == 422 and f"differs from the index's random_state ({top})" in r.text, r.text
        assert c.get("/v1/indexes/v7", headers=R).status_code == 404
    r = c.post("/v1/indexes", headers=W, json={**ivf, "params": {"nlist": 4}, "random_state": 7})
    assert r.status_code == 201 and r.json()["params"]["random_state"] == 7, r.text
    info = r.json()  # its params sent back as they are: the same index, seed 7 (before: a 422)
    r = c.post("/v1/indexes", headers=W, json={**ivf, "name": "v8", "params": info["params"]})
    assert r.status_code == 201 and r.json()["params"] == info["params"], r.text
    same = {"vectors": d["Z"][:3].tolist(), "k": 5, "nprobe": 1}
    assert (c.post("/v1/indexes/v7/search", headers=R, json=same).json()["results"]
            == c.post("/v1/indexes/v8/search", headers=R, json=same).json()["results"])


def test_a_search_option_the_index_kind_has_no_use_for_is_refused_naming_it(api):
    """``ef_search`` on a flat or IVF index, ``nprobe`` on a flat or HNSW one, and either with ``exact`` were
    dropped silently (200, the same hits): a client tuning recall saw no change and no word why. Each is a 422
    naming the option and the index's kind; the option of the index's own kind still works."""
    c, _, d, _ = api
    Z = d["Z"]
    for name, kind, params in (("kf", "flat", {}), ("kh", "hnsw", {"M": 8}), ("ki", "ivf", {"nlist": 4})):
        r = c.post("/v1/indexes", headers=W, json={"name": name, "space": "c", "kind": kind, "params": params,
                                                   "vectors": Z.tolist()})
        assert r.status_code == 201, r.text
    q = {"vectors": Z[:2].tolist(), "k": 3}
    refused = [("kf", {"ef_search": 64}, "ef_search is an HNSW index's search option; index 'kf' is flat (it scores "
                                         "every row: no option tunes it): leave ef_search out"),
               ("kf", {"nprobe": 2}, "nprobe is an IVF index's search option; index 'kf' is flat"),
               ("ki", {"ef_search": 64}, "index 'ki' is ivf (its search option is nprobe)"),
               ("kh", {"nprobe": 2}, "index 'kh' is hnsw (its search option is ef_search)"),
               ("kh", {"ef_search": 64, "exact": True}, "ef_search has no effect with exact"),
               ("ki", {"nprobe": 2, "exact": True}, "nprobe has no effect with exact")]
    for name, extra, words in refused:
        r = c.post(f"/v1/indexes/{name}/search", headers=R, json={**q, **extra})
        assert r.status_code == 422 and words in r.json()["error"]["message"], (name, extra, r.text)
    for name, extra in (("kh", {"ef_search": 64}), ("ki", {"nprobe": 2}), ("kf", {"exact": True}), ("kf", {})):
        r = c.post(f"/v1/indexes/{name}/search", headers=R, json={**q, **extra})
        assert r.status_code == 200 and len(r.json()["results"]) == 2, (name, extra, r.text)


def test_automatic_ids_count_up_past_a_deleted_largest_id_as_documented(api, capsys):
    """Automatic ids start one past the largest id the index ever held, so a deleted id is never handed out again
    (as in other vector databases: a client's stale id cannot name a new row). The OpenAPI schema and ``--help``
    said "the next free" ids, which a deleted largest id is."""
    c, _, d, _ = api
    Z = d["Z"]
    r = c.post("/v1/indexes", headers=W, json={"name": "auto", "space": "c", "vectors": Z[:3].tolist()})
    assert r.status_code == 201, r.text
    assert c.post("/v1/indexes/auto/delete", headers=W, json={"ids": [2]}).json()["deleted"] == 1
    assert c.post("/v1/indexes/auto/vectors", headers=W, json={"vectors": Z[3:4].tolist()}).json()["ids"] == [3]
    said = "one past the largest id the index ever held; a deleted id is not used again"
    paths = c.get("/openapi.json").json()["paths"]
    for path in ("/v1/indexes", "/v1/indexes/{name}/vectors"):  # create and add
        body = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert said in body["properties"]["ids"]["description"], path
    for command in ("create", "add"):
        assert said in " ".join(run_cli(capsys, "index", command, "--help")[1].split()), command


def test_http_rows_and_queries_as_texts(tmp_path):
    """Texts in, through the space's real encoder: passages stored with their text, queries embedded in query form."""
    app = create_app(settings_for(tmp_path))
    with TestClient(app) as c:
        app.state.vb.registry.register_space("minilm", 384, encoder="all-MiniLM-L6-v2")
        docs = ["a cat sleeps on the sofa", "stock markets fell sharply today"]
        r = c.post("/v1/indexes", headers=W, json={"name": "tx", "space": "minilm", "texts": docs})
        assert r.status_code == 201 and r.json()["count"] == 2, r.text
        r = c.post("/v1/indexes/tx/vectors", headers=W, json={"texts": ["the dog barked at the mailman"],
                                                              "store_texts": False})
        assert r.status_code == 200 and r.json()["ids"] == [2], r.text
        for path, body in (("/v1/indexes", {"name": "tx2", "space": "minilm", "texts": []}),
                           ("/v1/indexes/tx/vectors", {"texts": ["x"], "vectors": [[1.0] * 384]}),
                           ("/v1/indexes/tx/search", {"texts": ["x"], "vectors": [[1.0] * 384]})):
            assert c.post(path, headers=W, json=body).status_code == 422, path
        r = c.post("/v1/indexes/tx/search", headers=R, json={"texts": ["a kitten napping on a couch",
                                                                     "shares dropped on wall street"], "k": 3})
        hits = r.json()["results"]
        assert [h[0]["id"] for h in hits] == [0, 1], hits
        assert hits[0][0]["payload"] == {"text": docs[0]} and all(h["id"] != 2 or h["payload"] is None for h in hits[0])


def test_small_search_counts_the_work_of_each_kind():
    from service.indexes import space as sp
    from service.indexes.locking import RWLock, WouldBlock

    rng = np.random.default_rng(0)
    X = rng.standard_normal((400, 16)).astype(np.float32)
    flat = SpaceIndex.build("f", "s", X, kind="flat")
    hnsw = SpaceIndex.build("h", "s", X, kind="hnsw", params={"M": 8, "ef_search": 64})
    ivf = SpaceIndex.build("i", "s", X, kind="ivf", params={"nlist": 4, "nprobe": 2})
    budget = sp.SMALL_SEARCH_WORK
    assert flat.small_search(budget // (400 * 16), 10) and not flat.small_search(budget // (400 * 16) + 1, 10)
    assert hnsw.small_search(budget // (64 * 32 * 16), 10)
    assert not hnsw.small_search(1, 10, ef_search=budget)  # a huge ef is not small
    assert not hnsw.small_search(budget // (400 * 16) + 1, 10, exact=True)  # exact counts as flat
    per_query = 2 * 100 * 16  # nprobe x rows per list x dim
    assert ivf.small_search(budget // per_query, 10) and not ivf.small_search(budget // per_query + 1, 10)
    assert not flat.small_search(1, 10, csls_k=5) and not flat.small_search(0, 10)
    # wait=False: a search that is not small, or a writer on the lock, raises before searching
    with pytest.raises(WouldBlock):
        flat.search(np.repeat(X[:1], budget // (400 * 16) + 1, axis=0), 3, wait=False)
    S, I = flat.search(X[:2], 3, wait=False)
    assert I[:, 0].tolist() == [0, 1]
    lock = RWLock()
    with lock.write():
        with pytest.raises(WouldBlock):
            with lock.read(blocking=False):
                pass
    with lock.read(blocking=False):  # free again: no wait, no error
        pass


def test_an_id_named_twice_is_a_bad_request_for_adds_and_deleted_once(tmp_path):
    """Repeats within one request were a 409 conflict, which clients read as "someone else got there first";
    nothing stored conflicts with them. An add naming an id twice is now a 422, a delete deletes it once."""
    X = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    idx = IndexStore(tmp_path).create("dup", "s", X, ids=[1, 2, 3, 4])
    with pytest.raises(InputError, match="more than once"):
        idx.add(X[:2], ids=[9, 9])
    assert idx.delete([2, 2, 3]) == 2 and idx.count == 2
    assert set(IndexStore(tmp_path).get("dup")._live_ids().tolist()) == {1, 4}


_KILLED_CREATE = r"""
import os, signal, sys
import numpy as np
from pathlib import Path
from service.indexes import IndexStore, SpaceIndex
save = SpaceIndex.save
def save_then_die(self):  # the whole index written in the private folder, then kill -9 before it is renamed in
    save(self)
    os.kill(os.getpid(), signal.SIGKILL)
SpaceIndex.save = save_then_die
IndexStore(Path(sys.argv[1])).create("big", "s", np.ones((500, 8), np.float32), kind="flat")
"""


def test_a_killed_create_leaves_nothing_once_swept_and_a_live_one_is_kept(tmp_path):
    """A create builds the index in ``root/.create-*`` and renames it in. A process killed before the rename left
    the folder, the index's files whole, for a day (the sweep went by age only), across restarts: every killed
    ``vecbridge index create`` of a large index (OOM, a deploy) held its size again. The creator now holds a lock
    in the folder; the sweep (a server start) removes a folder whose creator is dead and keeps a live one's."""
    import subprocess
    import sys

    for _ in range(2):  # each create removes what the killed ones before it left (a CLI never runs sweep())
        r = subprocess.run([sys.executable, "-c", _KILLED_CREATE, str(tmp_path)], capture_output=True, check=False,
                           timeout=120)
        assert r.returncode == -9, r.stderr
        left = [d for d in tmp_path.iterdir() if d.name.startswith(".create-")]
        assert len(left) == 1 and any(left[0].glob("index.*.faiss"))
    # a live create in another thread (as another process would be): the sweep meanwhile keeps its folder
    store, building, go = IndexStore(tmp_path), threading.Event(), threading.Event()
    build = SpaceIndex.build

    def slow_build(*a, **kw):
        building.set()
        assert go.wait(30)
        return build(*a, **kw)

    def create():
        with pytest.MonkeyPatch.context() as m:
            m.setattr(SpaceIndex, "build", slow_build)
            store.create("live", "s", np.ones((10, 8), np.float32))

    t = threading.Thread(target=create)
    t.start()
    try:
        assert building.wait(30)
        IndexStore(tmp_path).sweep()
        assert [d.name for d in tmp_path.iterdir() if d.name.startswith(".create-")] == \
            [d.name for d in tmp_path.iterdir() if d.name.startswith(".create-live-")]  # the dead one removed
    finally:
        go.set()
        t.join(60)
    assert not t.is_alive(), "the create still runs 60 s after it was let go on"
    assert IndexStore(tmp_path).get("live").count == 10
    assert not [d for d in tmp_path.iterdir() if d.name.startswith(".create-")]
    assert not (tmp_path / "live" / ".creating").exists()
    r = subprocess.run([sys.executable, "-c", _KILLED_CREATE, str(tmp_path)], capture_output=True, check=False,
                       timeout=120)
    assert r.returncode == -9 and len(list(tmp_path.glob(".create-*"))) == 1
    IndexStore(tmp_path).create("other", "s", np.ones((10, 8), np.float32))
    assert not list(tmp_path.glob(".create-*"))
    # killed at the rename itself (the marker was removed just before it: the folder was kept for a day)
    at_rename = _KILLED_CREATE.replace("SpaceIndex.save = save_then_die", (
        "rename = os.rename\nos.rename = lambda a, b: os.kill(os.getpid(), signal.SIGKILL) "
        "if Path(a).name.startswith('.create-') else rename(a, b)"))
    r = subprocess.run([sys.executable, "-c", at_rename, str(tmp_path)], capture_output=True, check=False,
                       timeout=120)
    assert r.returncode == -9 and len(list(tmp_path.glob(".create-*"))) == 1, r.stderr
    IndexStore(tmp_path).create("third", "s", np.ones((10, 8), np.float32))
    assert not list(tmp_path.glob(".create-*"))


def test_opening_the_store_sweeps_a_killed_writers_temporary_snapshot(tmp_path, capsys):
    # `kill -9` during `vecbridge index add` left .index.N.faiss.tmp-* (175 MB in QA) that only the next write to that
    # index removed; a server's start and a CLI's open now remove one untouched for STALE_TMP_S: a younger one may be
    # a running writer's, and a link (or what it points at) is never removed
    import os
    import time

    from service.registry.store import STALE_TMP_S

    root = tmp_path / "var" / "indexes"
    X = unit_rows(np.random.default_rng(0).normal(size=(50, 8)).astype(np.float32))
    IndexStore(root).create("docs", "s", X)
    folder, old = root / "docs", time.time() - STALE_TMP_S - 60

    def plant() -> tuple:
        dead, live = folder / ".index.2.faiss.tmp-99-1-0badf00d", folder / ".payloads.2.json.tmp-99-1-0badf00d"
        dead.write_bytes(b"x" * 4096)
        live.write_bytes(b"x")  # a writer's, this instant
        os.utime(dead, (old, old))
        return dead, live

    outside = tmp_path / "not-ours.bin"
    outside.write_bytes(b"keep")
    os.utime(outside, (old, old))
    link = folder / ".index.3.faiss.tmp-1-1-feedf00d"
    link.symlink_to(outside)
    os.utime(link, (old, old), follow_symlinks=False)
    dead, live = plant()
    assert IndexStore(root).load_all() == 1  # as a server's start sweeps (load_in_background sweeps the same)
    assert not dead.exists() and live.exists() and link.is_symlink() and outside.read_bytes() == b"keep"
    dead, live = plant()
    code, out, _ = run_cli(capsys, "--data-dir", tmp_path / "var", "index", "list")
    assert code == 0 and "docs" in out
    assert not dead.exists() and live.exists() and link.is_symlink()
    assert IndexStore(root).get("docs").count == 50


def test_an_hnsw_search_with_nothing_to_skip_shares_its_parameters_and_finds_what_the_graph_finds(data, monkeypatch):
    """Issue 11 (the per-request floor): an HNSW search with no tombstones nor uncommitted rows made its FAISS
    parameters and the graph's downcast per search (~15 µs of a ~0.1 ms batch-1 search); it now searches through
    the id map with parameters made once per ``ef_search``. Same hits as the graph searched by slot (the path with
    a selector), ids mapped."""
    import faiss

    from service.indexes import kinds

    X, Q = data
    ids = np.arange(len(X)) * 7 + 5  # ids that are not slots
    idx = SpaceIndex.build("h", "s", X, kind="hnsw", ids=ids)
    made: list[int] = []
    real = faiss.SearchParametersHNSW
    monkeypatch.setattr(faiss, "SearchParametersHNSW", lambda **kw: made.append(kw["efSearch"]) or real(**kw))
    monkeypatch.setattr(kinds, "_HNSW_PARAMS", {}, raising=False)  # none made yet
    for ef in (None, 16, None, 16, 300):
        S, I = idx.search(Q, 10, ef_search=ef)
        graph = faiss.downcast_index(idx.index.index)
        S0, slots = graph.search(unit_rows(Q), 10, params=real(efSearch=max(ef or 64, 10)))
        assert np.array_equal(I, ids[slots]) and np.array_equal(S, S0)
    assert made == [64, 16, 300]  # once per ef_search, not once per search
    idx.delete(ids[:3].tolist())  # tombstones: the search by slot that skips them, as before
    S, I = idx.search(X[:3], 1)
    assert not np.isin(I, ids[:3]).any()
