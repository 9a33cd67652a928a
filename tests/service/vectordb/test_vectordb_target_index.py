"""A migration's target keeps the source's own vector index and storage settings: Qdrant here (the client's local
mode); pgvector's and Milvus' cases stand beside their other table / collection tests
(``test_vectordb_pg_tables.py``, ``test_vectordb_milvus_keys.py``).

Before, a Qdrant target got Qdrant's defaults: a source built for recall (HNSW ``m`` 32, ``ef_construct`` 200),
for memory (int8 scalar quantization, vectors on disk) or stored as float16 came out as a default float32 HNSW
collection, silently.
"""

from __future__ import annotations

import numpy as np
import pytest
from _vectordb_servers import pg_url, small_migration  # noqa: F401  (module-scoped fixture)

from service.vectordb import migrate, open_store

qdrant_client = pytest.importorskip("qdrant_client")
models = qdrant_client.models


@pytest.mark.parametrize("named", [None, "text-dense"])
def test_a_qdrant_target_keeps_the_source_vectors_index_quantization_and_storage(tmp_path, named):
    X, m = small_migration()
    s = open_store(f"qdrant://{tmp_path}/q", vector_field=named)
    params = models.VectorParams(
        size=X.shape[1], distance=models.Distance.COSINE, on_disk=True, datatype=models.Datatype.FLOAT16,
        hnsw_config=models.HnswConfigDiff(m=32, ef_construct=200),
        quantization_config=models.ScalarQuantization(scalar=models.ScalarQuantizationConfig(
            type=models.ScalarType.INT8, quantile=0.99, always_ram=True)))
    s.client.create_collection("ix_src", vectors_config=params if named is None else {named: params})
    s.upsert("ix_src", np.arange(len(X)), X)
    rep = migrate(s, "ix_src", "ix_dst", m, batch_size=64)
    assert rep.extra["target_index"] == "hnsw m=32 ef_construct=200 ScalarQuantization on_disk"
    vectors = s.client.get_collection("ix_dst").config.params.vectors
    got = vectors if named is None else vectors[named]
    assert got.size == m.target_dim and got.distance == models.Distance.COSINE
    assert (got.hnsw_config.m, got.hnsw_config.ef_construct) == (32, 200)
    scalar = got.quantization_config.scalar
    assert scalar.type == models.ScalarType.INT8 and scalar.quantile == 0.99
    assert got.on_disk is True and got.datatype == models.Datatype.FLOAT16
    Y = m.apply(X, output="raw")
    np.testing.assert_allclose(s.fetch("ix_dst", np.arange(len(X))).vectors, Y, rtol=2e-3, atol=2e-3)  # float16
    _, I = s.search("ix_dst", Y[:5], k=1)
    assert I[:, 0].tolist() == list(range(5))
    s.close()


def test_a_plain_qdrant_source_gives_a_plain_target(tmp_path):
    """Nothing set on the source: nothing set on the target (Qdrant's defaults, float32 in memory)."""
    X, m = small_migration()
    with open_store(f"qdrant://{tmp_path}/q") as s:
        s.create("p_src", X.shape[1])
        s.upsert("p_src", np.arange(len(X)), X)
        migrate(s, "p_src", "p_dst", m, batch_size=64)
        got = s.client.get_collection("p_dst").config.params.vectors
        assert got.size == m.target_dim and got.hnsw_config is None and got.quantization_config is None
        assert not got.on_disk and got.datatype in (None, models.Datatype.FLOAT32)


def _store_url(engine: str, tmp_path, request) -> str:
    if engine == "pgvector":
        return request.getfixturevalue("pg_url")
    if engine == "milvus":
        pytest.importorskip("pymilvus")
        pytest.importorskip("milvus_lite")
        return f"milvus://{tmp_path}/m.db"  # Milvus Lite embedded
    return f"qdrant://{tmp_path}/q"


@pytest.mark.parametrize("engine", ["qdrant", "milvus", "pgvector"])
def test_an_inner_product_source_gives_an_ip_target_and_says_its_norms_are_not_carried(engine, tmp_path, request):
    """A collection created with metric ip was migrated into a cosine target (``migrate``'s default, which
    ``run_migration`` never overrode), and the report's warnings were empty: the row norms it ranks by were dropped
    (the map writes unit rows) and searches naming IP no longer matched the target, without a word."""
    from service.ops.vectordb import run_migration

    X, m = small_migration()
    url = _store_url(engine, tmp_path, request)
    with open_store(url) as s:
        for name in ("ip_src", "ip_dst", "cos_src", "cos_dst"):
            s.drop(name)
        s.create("ip_src", X.shape[1], metric="ip")
        s.upsert("ip_src", np.arange(len(X)), X * np.linspace(0.5, 3.0, len(X))[:, None].astype(np.float32))
        s.create("cos_src", X.shape[1])
        s.upsert("cos_src", np.arange(len(X)), X)
        for name in ("ip_src", "cos_src"):
            s.finalize(name)
        assert (s.metric("ip_src"), s.metric("cos_src")) == ("ip", "cosine")
        dry = migrate(s, "ip_src", "ip_dst", m, dry_run=True)
        assert dry.extra["metric"] == "ip" and not s.exists("ip_dst")
        said = [w for w in dry.extra["warnings"] if "Qdrant local mode" not in w]  # a local folder's: its own test
        assert len(said) == 1 and "inner product" in said[0] and "norms are not carried" in said[0]
        quiet = migrate(s, "cos_src", "cos_dst", m)
        assert quiet.extra["warnings"] == [] and s.metric("cos_dst") == "cosine"
    rep = run_migration(store_url=url, source="ip_src", target="ip_dst", map_ref=m, checkpoint=tmp_path / "ck.json",
                        batch_size=64)
    assert rep.extra["metric"] == "ip" and rep.extra["warnings"] == said
    with open_store(url) as s:
        assert s.metric("ip_dst") == "ip"
        Y = m.apply(X, output="raw")
        S, I = s.search("ip_dst", 2 * Y[:5], k=1)  # an inner product: twice a unit row's own score
        assert I[:, 0].tolist() == list(range(5))
        np.testing.assert_allclose(S[:, 0], 2.0, rtol=1e-3)
        for name in ("ip_src", "ip_dst", "cos_src", "cos_dst"):
            s.drop(name)


def test_an_l2_qdrant_source_is_reported_as_such_and_its_cosine_target_named(tmp_path):
    X, m = small_migration()
    with open_store(f"qdrant://{tmp_path}/q") as s:
        s.client.create_collection("l2_src", vectors_config=models.VectorParams(size=X.shape[1],
                                                                                distance=models.Distance.EUCLID))
        s.upsert("l2_src", np.arange(len(X)), X)
        assert s.metric("l2_src") == "l2"
        rep = migrate(s, "l2_src", "l2_dst", m, batch_size=64)
        assert rep.extra["metric"] == "cosine" and s.metric("l2_dst") == "cosine"
        (warning,) = rep.extra["warnings"]
        assert "L2 distance (l2)" in warning and "its metric is cosine, not the source's l2" in warning
