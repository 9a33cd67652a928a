"""Per-cluster maps (align.ClusterMap) through the service: registry (SQLite), paths, HTTP, vector databases, bundles.

World: spaces ``a`` (16-d), ``b`` (16-d), ``c`` (12-d); ``a2b`` a cluster map fitted on piecewise-linear
pairs (one rotation per source cluster), ``b2c`` a ridge map, so the path a -> c mixes both kinds.
"""

from __future__ import annotations

import base64
import sqlite3

import numpy as np
import pytest
from fastapi.testclient import TestClient

import align
from align import ClusterMap, LinearMap, MapChain
from align.exceptions import InputError
from service.api import create_app
from service.registry import open_registry
from service.registry.errors import IntegrityError, InvalidNameError
from _api_support import R, W, assert_nonfinite_refused, settings_for

OCT = {"content-type": "application/octet-stream"}


def piecewise(n=1400, d=16, k=6, seed=0):
    """Rows around ``k`` centres, each cluster mapped by its own rotation: local maps beat one global map."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, d)) * 3.0
    lab = rng.integers(0, k, n)
    X = (centres[lab] + rng.normal(size=(n, d))).astype(np.float32)
    A = np.stack([np.linalg.qr(rng.normal(size=(d, d)))[0] for _ in range(k)])
    return X, np.einsum("nd,nde->ne", X, A[lab]).astype(np.float32)


@pytest.fixture(scope="module")
def maps():
    X, Y = piecewise()
    cm = align.fit_migration(X, Y, method="cluster", random_state=0)
    assert isinstance(cm, ClusterMap) and cm.n_clusters > 1
    Z = (Y @ np.random.default_rng(1).normal(size=(16, 12))).astype(np.float32)
    return {"X": X, "Y": Y, "Z": Z, "cm": cm, "lin": align.fit_ridge(Y, Z, alpha=1e-3)}


def _fill(reg, maps):
    reg.register_version("a2b", maps["cm"], source_space="a", target_space="b", method="cluster", params={},
                         alias="prod")
    reg.register_version("b2c", maps["lin"], source_space="b", target_space="c", method="ridge", params={})


@pytest.fixture
def reg(registry_url, tmp_path, maps):
    """The world's registry on each backend (SQLite; PostgreSQL when the test server is set, see conftest)."""
    r = open_registry(registry_url, tmp_path / "artifacts")
    _fill(r, maps)
    yield r
    r.close()


# --- registry ---------------------------------------------------------------------------------------
def test_registry_round_trip_records_the_kind_and_applies_the_same(reg, maps, tmp_path):
    v = reg.resolve("a2b@prod")
    assert (v.map_kind, v.n_clusters, v.source_dim, v.target_dim) == ("cluster", maps["cm"].n_clusters, 16, 16)
    assert reg.resolve("b2c").map_kind == "linear" and reg.resolve("b2c").n_clusters == 0
    m = reg.load_map(v)
    assert isinstance(m, ClusterMap)
    X = maps["X"][:50]
    for output in ("raw", "frame", "linear"):
        np.testing.assert_array_equal(m.apply(X, output=output), maps["cm"].apply(X, output=output))
    v2 = reg.register_version("a2b", maps["cm"], source_space="a", target_space="b", method="cluster", params={},
                              artifact_format="npz")
    assert v2.version == 2 and v2.map_kind == "cluster" and reg.resolve("a2b@prod").version == 1  # immutable, alias kept
    assert v2.to_dict()["map_kind"] == "cluster"
    with pytest.raises(InvalidNameError, match="chain"):
        reg.register_version("x", MapChain([maps["cm"], maps["lin"]]), source_space="a", target_space="c",
                             method="x", params={})


def test_an_older_database_gains_the_kind_columns(registry_url, tmp_path, maps):
    from service.registry.db import SCHEMA

    old = [s.replace("\n        map_kind TEXT NOT NULL DEFAULT 'linear', n_clusters INTEGER NOT NULL DEFAULT 0,", "")
           for s in SCHEMA]  # the schema as it was: without map_kind / n_clusters
    assert sum("map_kind" in s for s in old) == 0
    if registry_url.startswith("sqlite:///"):
        con = sqlite3.connect(registry_url[len("sqlite:///"):])
        for stmt in old:
            con.execute(stmt)
        con.commit()
        con.close()
    else:
        import psycopg

        with psycopg.connect(registry_url, autocommit=True) as con:
            for stmt in old:
                con.execute(stmt)
    r = open_registry(registry_url, tmp_path / "artifacts")
    try:
        _fill(r, maps)
        assert r.resolve("a2b").map_kind == "cluster" and r.resolve("b2c").map_kind == "linear"
    finally:
        r.close()


def test_path_through_a_cluster_map_applies_the_steps_in_sequence(reg, maps):
    m = reg.compose_path("a", "c")
    assert isinstance(m, MapChain) and (m.source_dim, m.target_dim) == (16, 12)
    X = maps["X"][:64]
    mid = maps["cm"].apply(X, output="raw")
    for output in ("raw", "frame", "linear"):
        np.testing.assert_allclose(m.apply(X, output=output), maps["lin"].apply(mid, output=output), atol=1e-6)
    # a linear-only path folds into one LinearMap only where the fold is exact (orthogonal first step), bit for
    # bit LinearMap.compose
    d2 = align.fit_procrustes(maps["Z"], maps["Z"][:, ::-1].copy())
    e2 = align.fit_procrustes(maps["Z"][:, ::-1].copy(), maps["Z"])
    reg.register_version("c2d", d2, source_space="c", target_space="d", method="procrustes", params={})
    reg.register_version("d2e", e2, source_space="d", target_space="e", method="procrustes", params={})
    lin = reg.compose([reg.resolve("c2d"), reg.resolve("d2e")])
    assert isinstance(lin, LinearMap)
    np.testing.assert_array_equal(lin.W, d2.compose(e2).W)
    full = reg.compose_path("a", "d")
    assert isinstance(full, MapChain) and len(full) == 3


def test_path_with_a_non_orthogonal_step_answers_as_the_maps_applied_in_turn(reg, maps):
    """The registry folded every all-linear path into one matrix; after a non-orthogonal step the fold drops the
    renormalisation the next map applies to its input, so a search through ridge -> ridge answered differently
    from the same two versions applied one after the other (143 of 200 top-10 lists on WordNet)."""
    Z = maps["Z"]
    V = (np.tanh(Z @ np.random.default_rng(2).normal(size=(12, 10))) + 0.3).astype(np.float32)
    c2d = align.fit_ridge(Z, V, alpha=1e-3)  # an affine step: its bias makes the scale of its input matter
    reg.register_version("c2d", c2d, source_space="c", target_space="d", method="ridge", params={})
    path = reg.compose([reg.resolve("b2c"), reg.resolve("c2d")])
    Y = maps["Y"][:64]
    in_turn = c2d.apply(maps["lin"].apply(Y, output="raw"), output="raw")
    assert np.abs(maps["lin"].compose(c2d).apply(Y, output="raw") - in_turn).max() > 1e-3  # the fold is not it
    for output in ("raw", "frame", "linear"):
        np.testing.assert_allclose(path.apply(Y, output=output),
                                   c2d.apply(maps["lin"].apply(Y, output="raw"), output=output), atol=1e-5)


def test_chain_artifact_round_trip_and_flattening(maps):
    c = MapChain([MapChain([maps["cm"]]), maps["lin"]])
    assert len(c) == 2 and c.metadata["kinds"] == ["cluster", "linear"]
    back = align.map_from_bytes(c.to_bytes("safetensors"))
    np.testing.assert_array_equal(back.apply(maps["X"][:20]), c.apply(maps["X"][:20]))
    with pytest.raises(align.DimensionMismatchError):
        MapChain([maps["lin"], maps["cm"]])  # 12-d out, 16-d in


def test_bundle_round_trip_keeps_cluster_maps(reg, maps, tmp_path):
    from service.registry.bundle import export_bundle, import_bundle

    out = export_bundle(reg, tmp_path / "b.zip")
    other = open_registry(f"sqlite:///{tmp_path / 'other.sqlite'}", tmp_path / "other-art")
    try:
        counts = import_bundle(other, out)
        assert counts["imported"] == 2
        v = other.resolve("a2b@prod")
        assert (v.map_kind, v.n_clusters) == ("cluster", maps["cm"].n_clusters)
        np.testing.assert_array_equal(other.load_map(v).apply(maps["X"][:30]), maps["cm"].apply(maps["X"][:30]))
        assert import_bundle(other, out)["skipped"] == 2  # twice: a no-op
    finally:
        other.close()


def test_bundle_that_relabels_a_cluster_map_is_refused(reg, tmp_path):
    import json

    from service.registry.bundle import export_bundle, import_bundle

    folder = export_bundle(reg, tmp_path / "bundle-dir")
    man = json.loads((folder / "manifest.json").read_text())
    for m in man["maps"]:
        for v in m["versions"]:
            if v["map_kind"] == "cluster":
                v["map_kind"], v["n_clusters"] = "linear", 0
    (folder / "manifest.json").write_text(json.dumps(man))
    other = open_registry(f"sqlite:///{tmp_path / 'o.sqlite'}", tmp_path / "o-art")
    try:
        with pytest.raises(IntegrityError, match="cluster"):
            import_bundle(other, folder)
        assert other.list_maps() == []
    finally:
        other.close()


# --- HTTP -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def world(tmp_path_factory, maps):
    app = create_app(settings_for(tmp_path_factory.mktemp("cl")))
    with TestClient(app) as client:
        reg = app.state.vb.registry
        _fill(reg, maps)
        reg.register_steer("attr", align.Steer(np.eye(16)[:, :2], np.eye(16)[:, 2:4]), space="a")
        yield client


def test_http_transform_json_and_octet_equal_in_process(world, maps):
    X = maps["X"][:9]
    r = world.post("/v1/maps/a2b@prod/transform", json={"vectors": X.tolist(), "output": "frame"}, headers=R)
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(np.array(r.json()["vectors"], np.float32), maps["cm"].apply(X, output="frame"),
                               atol=1e-6)
    r = world.post("/v1/maps/a2b/transform", content=X.tobytes(), headers={**R, **OCT})
    assert r.status_code == 200 and r.headers["x-shape"] == "9,16"
    np.testing.assert_allclose(np.frombuffer(r.content, "<f4").reshape(9, 16), maps["cm"].apply(X), atol=1e-6)
    r = world.post("/v1/maps/a2b/transform", json={"vectors_b64": base64.b64encode(X.tobytes()).decode(), "dim": 16},
                   headers=R)
    assert r.status_code == 200
    v = world.get("/v1/maps/a2b/versions", headers=R).json()["data"][0]
    assert v["map_kind"] == "cluster" and v["n_clusters"] == maps["cm"].n_clusters
    art = world.get("/v1/maps/a2b/artifact?format=npz", headers=R)
    assert art.status_code == 200
    np.testing.assert_array_equal(align.map_from_bytes(art.content).apply(X), maps["cm"].apply(X))


def test_http_transform_refuses_non_finite_rows_for_a_cluster_map(world, maps):
    assert_nonfinite_refused(world, "/v1/maps/a2b/transform", maps["X"][:600])  # the cluster map's apply checks them


def test_http_mapped_search_through_a_path_with_a_cluster_map(world, maps):
    Z = maps["lin"].apply(maps["cm"].apply(maps["X"][:200]))  # the index holds what the path produces
    r = world.post("/v1/indexes", headers=W, json={"name": "zc", "space": "c", "vectors": Z.tolist()})
    assert r.status_code in (200, 201), r.text
    r = world.post("/v1/indexes/zc/search", headers=R, json={"vectors": maps["X"][:20].tolist(), "space": "a",
                                                             "k": 1})
    assert r.status_code == 200, r.text
    hits = [res[0]["id"] for res in r.json()["results"]]
    assert hits == list(range(20))
    assert [m["name"] for m in r.json()["maps"]] == ["a2b", "b2c"]


def test_http_steer_transfer_through_a_cluster_map_is_a_422(world):
    r = world.post("/v1/steers/attr/transfer", headers=W, json={"map": "a2b", "name": "attr_b"})
    assert r.status_code == 422, r.text
    assert "single linear map" in r.text and "ClusterMap" in r.text


def test_transfer_steer_refuses_cluster_maps_in_align(maps):
    with pytest.raises(InputError, match="single linear map"):
        align.transfer_steer(align.Steer(np.eye(16)[:, :1], np.eye(16)[:, 1:2]), maps["cm"])


# --- vector databases, files, gates -----------------------------------------------------------------
def test_vectordb_migrate_verify_and_query_with_a_cluster_map(maps, reg):
    pytest.importorskip("qdrant_client")
    from service.vectordb import QdrantStore, TranslatingSearcher, map_fingerprint, migrate, verify_migration

    s = QdrantStore(path=":memory:")
    try:
        X, Y = maps["X"][:300], maps["Y"][:300]
        s.create("src", 16)
        s.upsert("src", np.arange(300), X, None)
        rep = migrate(s, "src", "dst", "a2b@prod", registry=reg)
        assert rep.map_fingerprint == map_fingerprint(maps["cm"]) != map_fingerprint(maps["lin"])
        got = s.fetch("dst", np.arange(300))
        np.testing.assert_allclose(np.asarray(got.vectors), align.frames.unit_rows(maps["cm"].apply(X)), atol=1e-5)
        h = verify_migration(s, "dst", heldout=(maps["X"][300:600], maps["Y"][300:600]), map_="a2b", registry=reg,
                             n_sample=300, n_queries=50)
        assert h["mode"] == "heldout" and h["partner_top1"] > 0.9
        s.create("old_b", 16)
        s.upsert("old_b", np.arange(300), Y)
        S, I = TranslatingSearcher(s, "old_b", "a2b", registry=reg).search(X[:50], 1)  # a-queries into b vectors
        assert (I[:, 0] == np.arange(50)).mean() > 0.9
    finally:
        s.close()


def test_transform_files_without_ray_equal_apply(maps, tmp_path):
    from service.distributed import transform_files_ray

    np.save(tmp_path / "x.npy", maps["X"][:100])
    out = transform_files_ray(maps["cm"], [tmp_path / "x.npy"], tmp_path / "o", use_ray=False)
    np.testing.assert_allclose(np.load(out[0]["output"]), maps["cm"].apply(maps["X"][:100]), atol=1e-6)
    assert len(np.load(out[0]["output"])) == 100


def test_retention_gate_and_fit_method_cluster(maps):
    from service.ops.maps import fit_map
    from service.ops.plans import retention_gate

    m = fit_map(maps["X"][:1000], maps["Y"][:1000], method="cluster", params={}, paired=True, random_state=0)
    assert isinstance(m, ClusterMap)
    res = retention_gate(m, maps["X"][1000:], maps["Y"][1000:], min_retention=0.5)
    assert res["result"] == "PASS"


def test_http_fit_with_method_cluster_registers_a_cluster_version(world, maps):
    import time

    def b64(a):
        return {"vectors_b64": base64.b64encode(np.ascontiguousarray(a, np.float32).tobytes()).decode(),
                "dim": int(a.shape[1])}

    body = {"name": "a2b-fit", "source_space": "a", "target_space": "b", "method": "cluster", "paired": True,
            "source": b64(maps["X"][:800]), "target": b64(maps["Y"][:800]), "random_state": 0}
    r = world.post("/v1/fits", headers=W, json=body)
    assert r.status_code == 202, r.text
    end, job = time.time() + 120, {}
    while time.time() < end:
        job = world.get(f"/v1/jobs/{r.json()['id']}", headers=W).json()
        if job["state"] in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.2)
    assert job["state"] == "succeeded", job
    v = world.get("/v1/maps/a2b-fit/versions", headers=R).json()["data"][0]
    assert v["map_kind"] == "cluster" and v["method"] == "cluster"
    X = maps["X"][800:810]
    r = world.post("/v1/maps/a2b-fit/transform", json={"vectors": X.tolist()}, headers=R)
    assert r.status_code == 200 and np.array(r.json()["vectors"]).shape == (10, 16)


def _await_job(client, job_id: str) -> dict:
    import time

    end, job = time.time() + 120, {}
    while time.time() < end:
        job = client.get(f"/v1/jobs/{job_id}", headers=W).json()
        if job["state"] in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.2)
    return job


def test_http_cluster_fit_records_the_cluster_count_it_used_and_says_it_was_capped(world, maps):
    """300 pairs with n_clusters 300: the count is chosen on the 240 training pairs of the held-out split, so the
    map has 240 clusters, but params.n_clusters (and the report) said 300, and nothing said it had been capped."""
    X, Y = maps["X"][:300], maps["Y"][:300]
    body = {"name": "capped", "source_space": "a", "target_space": "b", "method": "cluster", "paired": True,
            "source": {"vectors": X.tolist()}, "target": {"vectors": Y.tolist()}, "random_state": 0,
            "params": {"n_clusters": 300}}
    r = world.post("/v1/fits", headers=W, json=body)
    assert r.status_code == 202, r.text
    job = _await_job(world, r.json()["id"])
    assert job["state"] == "succeeded", job
    note = "n_clusters=300 capped at 240: the count is chosen on the 240 training pairs (60 of 300 held out"
    assert any(n.startswith(note) for n in job["result"]["notes"]), job["result"]
    v = world.get("/v1/maps/capped/versions", headers=R).json()["data"][0]
    assert v["params"]["n_clusters"] == 240 and v["metrics"]["selection"]["note"].startswith(note)
    assert world.app.state.vb.registry.load_map("capped").n_clusters == 240
    report = world.get(f"/v1/maps/capped/versions/{v['version']}/report", headers=R).text
    assert "<p>Note: " + note in report


def _wide_pairs(n=40, d=1536):
    rng = np.random.default_rng(3)
    return rng.normal(size=(n, d)).astype(np.float32), rng.normal(size=(n, d)).astype(np.float32)


def test_http_fit_of_a_cluster_map_over_the_map_budget_is_a_422_at_submit(world):
    """A fit job of 30 clusters at 1536 -> 1536 (a 270 MiB map; 32 at 3072-d: 1.2 GB, 7.9 GB of server RSS) was
    accepted and run; it is refused when submitted, naming the size and the parameter, unless that raises the budget."""
    X, Y = _wide_pairs()
    body = {"name": "wide", "source_space": "wide-s", "target_space": "wide-t", "method": "cluster", "paired": True,
            "source": {"vectors_b64": base64.b64encode(X.tobytes()).decode(), "dim": 1536},
            "target": {"vectors_b64": base64.b64encode(Y.tobytes()).decode(), "dim": 1536},
            "params": {"n_clusters": 30}}
    r = world.post("/v1/fits", headers=W, json=body)
    assert r.status_code == 422, r.text
    assert "270 MiB" in r.text and "n_clusters <= 28" in r.text and "max_cluster_mib" in r.text
    r = world.post("/v1/fits", headers=W, json={**body, "params": {"n_clusters": 30, "max_cluster_mib": "x"}})
    assert r.status_code == 422 and "max_cluster_mib" in r.text


def test_cli_fit_of_a_cluster_map_over_the_map_budget_exits_2_in_one_line(capsys, tmp_path):
    from conftest import run_cli

    X, Y = _wide_pairs()
    np.save(tmp_path / "src.npy", X)
    np.save(tmp_path / "tgt.npy", Y)
    code, _, err = run_cli(capsys, "--data-dir", tmp_path / "var", "fit", "--pairs", "--quiet", "--source",
                           tmp_path / "src.npy", "--target", tmp_path / "tgt.npy", "--method", "cluster", "--param",
                           "n_clusters=30", "--name", "wide")
    assert code == 2 and "max_cluster_mib" in err and len(err.strip().splitlines()) == 1, err
