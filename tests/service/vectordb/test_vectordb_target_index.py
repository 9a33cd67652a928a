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
from _vectordb_servers import small_migration

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
