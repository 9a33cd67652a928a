"""Hybrid collections (a dense vector beside sparse BM25 / SPLADE vectors) migrate: the dense vector through the
map, the sparse vectors unchanged (they do not depend on the dense model). Before, a sparse vector was refused at
the plan ("a sparse vector: a migration maps dense vectors only"), so no hybrid collection could move.

Qdrant in the client's local mode, in LangChain's layout (unnamed dense vector, ``langchain-sparse`` with the IDF
modifier, ``page_content`` / ``metadata`` payload) and LlamaIndex's (named ``text-dense`` / ``text-sparse``);
PostgreSQL + pgvector (pgserver wheel) with a ``sparsevec`` column; Milvus Lite with a BM25 function (full-text
search), a SPLADE-like sparse field and declared scalar fields, whose target is the source's schema.
"""

from __future__ import annotations

import numpy as np
import pytest
from _vectordb_servers import pg_url, small_migration  # noqa: F401  (module-scoped server fixture)

from align.exceptions import InputError
from service.vectordb import UnsupportedFieldError, check_rows, migrate, open_store

qdrant_client = pytest.importorskip("qdrant_client")
models = qdrant_client.models


def _sparse(i: int):
    return models.SparseVector(indices=[i % 7, 10 + i], values=[1.0 + i, 0.5])


@pytest.mark.parametrize("dense,sparse", [(None, "langchain-sparse"), ("text-dense", "text-sparse")])
def test_a_hybrid_qdrant_collection_keeps_its_sparse_vectors(tmp_path, dense, sparse):
    X, m = small_migration()
    s = open_store(f"qdrant://{tmp_path}/q", vector_field=dense, text_field="page_content")
    params = models.VectorParams(size=X.shape[1], distance=models.Distance.COSINE)
    s.client.create_collection("hy_src", vectors_config=params if dense is None else {dense: params},
                               sparse_vectors_config={sparse: models.SparseVectorParams(modifier=models.Modifier.IDF)})
    name = dense or ""
    s.client.upsert("hy_src", points=[
        models.PointStruct(id=i, vector={name: X[i].tolist(), **({sparse: _sparse(i)} if i % 10 else {})},
                           payload={"page_content": f"doc {i}", "metadata": {"n": i}}) for i in range(len(X))])
    assert s.unsupported_fields("hy_src") == []
    rep = migrate(s, "hy_src", "hy_dst", m, batch_size=64)
    assert rep.rows == len(X) and f"{sparse} (sparse vector)" in rep.extra["fields"]
    cfg = s.client.get_collection("hy_dst").config.params
    assert cfg.sparse_vectors[sparse].modifier == models.Modifier.IDF  # declared as the source declares it
    b = s.fetch("hy_dst", np.arange(len(X)), with_fields=True)
    np.testing.assert_allclose(b.vectors, m.apply(X, output="raw"), rtol=1e-5, atol=1e-6)
    assert b.texts[3] == "doc 3" and b.fields["metadata"][3] == {"n": 3}
    got = b.sparse[sparse]
    assert got[0] is None and got[10] is None  # rows without one stay without
    assert all(got[i].indices == _sparse(i).indices and got[i].values == _sparse(i).values
               for i in range(len(X)) if i % 10)
    assert check_rows(s, "hy_src", "hy_dst", m)["rows_ok"]
    hits = s.client.query_points("hy_dst", query=models.SparseVector(indices=[13], values=[1.0]), using=sparse,
                                limit=1).points
    assert hits[0].id == 3  # hybrid search's sparse side works on the target as it did on the source
    s.close()


def test_a_store_without_sparse_vectors_refuses_them_by_name(tmp_path):
    X, _ = small_migration()
    pytest.importorskip("milvus_lite")
    with open_store(f"milvus://{tmp_path}/m.db") as mv:
        mv.create("plain", X.shape[1])
        with pytest.raises(UnsupportedFieldError, match=r"rows here carry no sparse vectors \(\['sp'\]\)"):
            mv.upsert("plain", [1], X[:1], sparse={"sp": [None]})
    with open_store(f"qdrant://{tmp_path}/q2") as q:
        q.create("plain", X.shape[1])
        with pytest.raises(InputError, match="sparse vector 'sp': 2 values for 1 rows"):
            q.upsert("plain", [1], X[:1], sparse={"sp": [None, None]})


def test_a_pgvector_sparsevec_column_travels_unchanged(pg_url):  # noqa: F811
    X, m = small_migration()
    s = open_store(pg_url)
    s.index = None
    for t in ("sv_src", "sv_dst"):
        s.drop(t)
    s.conn.execute(f"CREATE TABLE sv_src (id bigint PRIMARY KEY, embedding vector({X.shape[1]}), text text, "
                   "bm25 sparsevec(1000))")
    with s.conn.cursor() as cur:
        cur.executemany("INSERT INTO sv_src VALUES (%s, %s, %s, %s::sparsevec)",
                        [(i, X[i], f"t{i}", f"{{{i % 7 + 1}:{1.0 + i},{20 + i}:0.5}}/1000") for i in range(len(X))])
    assert s.unsupported_fields("sv_src") == []
    migrate(s, "sv_src", "sv_dst", m, batch_size=64)
    same = s.conn.execute("SELECT count(*) FROM sv_src a JOIN sv_dst b USING (id) WHERE a.bm25 = b.bm25").fetchone()
    assert same[0] == len(X)
    assert check_rows(s, "sv_src", "sv_dst", m)["rows_ok"]
    for t in ("sv_src", "sv_dst"):
        s.drop(t)
    s.close()


def _milvus_hybrid(client, name: str, X, words: list[str]) -> None:
    """Milvus full-text + hybrid layout: declared ``text`` (analyzer) feeding a BM25 function into ``bm25``, a
    SPLADE-like ``splade`` sparse field, a declared ``year`` with an INVERTED index, the dense ``vector``."""
    from pymilvus import DataType, Function, FunctionType, MilvusClient

    sc = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=True)
    sc.add_field("id", DataType.INT64, is_primary=True)
    sc.add_field("vector", DataType.FLOAT_VECTOR, dim=X.shape[1])
    sc.add_field("text", DataType.VARCHAR, max_length=200, enable_analyzer=True)
    sc.add_field("bm25", DataType.SPARSE_FLOAT_VECTOR)
    sc.add_field("splade", DataType.SPARSE_FLOAT_VECTOR)
    sc.add_field("year", DataType.INT64)
    sc.add_function(Function(name="text_bm25", function_type=FunctionType.BM25, input_field_names=["text"],
                             output_field_names=["bm25"]))
    ip = client.prepare_index_params()
    ip.add_index("vector", index_type="AUTOINDEX", metric_type="COSINE")
    ip.add_index("bm25", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25")
    ip.add_index("splade", index_type="SPARSE_INVERTED_INDEX", metric_type="IP",
                 params={"inverted_index_algo": "DAAT_MAXSCORE"})
    ip.add_index("year", index_type="INVERTED")
    client.create_collection(name, schema=sc, index_params=ip, consistency_level="Strong")
    client.upsert(name, [{"id": i, "vector": X[i].tolist(), "text": f"{words[i]} document", "year": 1900 + i,
                          "splade": {i + 1: 1.0, 1000: 0.25}, "lang": "en"} for i in range(len(X))])


def test_a_milvus_hybrid_collection_keeps_its_schema_sparse_fields_and_full_text_search(tmp_path):
    pytest.importorskip("milvus_lite")
    X, m = small_migration()
    words = [f"w{i}x" for i in range(len(X))]
    with open_store(f"milvus://{tmp_path}/m.db") as s:
        _milvus_hybrid(s.client, "mh_src", X, words)
        assert s.unsupported_fields("mh_src") == []
        rep = migrate(s, "mh_src", "mh_dst", m, batch_size=64)
        assert rep.rows == len(X) and rep.extra["fields"] == ["lang", "splade", "text", "year"]  # bm25: computed
        d = {f["name"]: f for f in s.client.describe_collection("mh_dst")["fields"]}
        assert d["vector"]["params"]["dim"] == m.target_dim and str(d["year"]["type"]) == str(d["id"]["type"])
        assert d["bm25"].get("is_function_output") and d["text"]["params"]["enable_analyzer"] in (True, "true")
        idx = {i: s.client.describe_index("mh_dst", i) for i in s.client.list_indexes("mh_dst")}
        by_field = {x["field_name"]: x for x in idx.values()}
        assert by_field["year"]["index_type"] == "INVERTED" and by_field["splade"]["metric_type"] == "IP"
        assert by_field["vector"]["metric_type"] == "COSINE"
        b = s.fetch("mh_dst", [3, 150], with_fields=True)
        np.testing.assert_allclose(b.vectors, m.apply(X[[3, 150]], output="raw"), rtol=1e-5, atol=1e-6)
        assert b.texts == ["w3x document", "w150x document"] and b.fields["year"] == [1903, 2050]
        assert b.fields["splade"][0] == {4: 1.0, 1000: 0.25} and "bm25" not in b.fields
        hit = s.client.search("mh_dst", data=["w150x"], anns_field="bm25", limit=1)[0][0]
        assert hit["id"] == 150  # full-text search works on the target: its BM25 function filled bm25
        hit = s.client.search("mh_dst", data=[{151: 1.0}], anns_field="splade", limit=1)[0][0]
        assert hit["id"] == 150
        assert check_rows(s, "mh_src", "mh_dst", m)["rows_ok"]



def test_a_milvus_auto_id_collection_keeps_its_ids_and_its_auto_id(tmp_path):
    """LangChain's Milvus store makes an auto-id collection; the target keeps auto_id (the application's later
    inserts without ids keep working) and every row keeps its id (upsert by primary key)."""
    pytest.importorskip("milvus_lite")
    X, m = small_migration()
    with open_store(f"milvus://{tmp_path}/m.db") as s:
        s.client.create_collection("auto_src", dimension=X.shape[1], auto_id=True, consistency_level="Strong")
        s.client.insert("auto_src", [{"vector": x.tolist(), "text": f"t{i}"} for i, x in enumerate(X)])
        migrate(s, "auto_src", "auto_dst", m, batch_size=64)
        assert s.client.describe_collection("auto_dst")["auto_id"]
        assert s.ids("auto_dst").tolist() == s.ids("auto_src").tolist()
        assert check_rows(s, "auto_src", "auto_dst", m)["rows_ok"]


def test_another_dense_vector_is_never_read_as_a_sparse_one(tmp_path):
    X, m = small_migration()
    s = open_store(f"qdrant://{tmp_path}/q", vector_field="text-dense")
    params = models.VectorParams(size=X.shape[1], distance=models.Distance.COSINE)
    s.client.create_collection("two", vectors_config={"text-dense": params, "title-dense": params},
                               sparse_vectors_config={"text-sparse": models.SparseVectorParams()})
    s.client.upsert("two", points=[models.PointStruct(id=i, vector={"text-dense": X[i].tolist(),
                                                                   "title-dense": X[i + 1].tolist(),
                                                                   "text-sparse": _sparse(i)}) for i in range(3)])
    b = s.fetch("two", [0, 1, 2], with_fields=True)
    assert list(b.sparse) == ["text-sparse"]  # title-dense is a dense vector: not carried as a sparse one
    assert s.unsupported_fields("two") == ["title-dense (another named vector: a migration maps 'text-dense' only)"]
    with pytest.raises(UnsupportedFieldError, match="title-dense"):
        migrate(s, "two", "two_dst", m)
    s.close()
