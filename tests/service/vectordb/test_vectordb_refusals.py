"""What a careful user runs into on the real engines, and the one clear error each gets.

Milvus Lite (its own server process), PostgreSQL + pgvector (pgserver wheel) and Qdrant local mode;
servers from ``tests/_vectordb_servers.py``. Small generated collections: these are refusals, not
quality checks (that is ``test_vectordb_engines.py``).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from _servers import free_port
from _vectordb_servers import milvus_url, pg_url, small_migration  # noqa: F401  (module-scoped fixtures)

from align.exceptions import NonFiniteError
from service.vectordb import (
    CollectionExistsError,
    UnsupportedFieldError,
    VectorDBError,
    migrate,
    open_store,
)
from service.vectordb.__main__ import main as vectordb_main
from service.vectordb.checkpoint import FileCheckpoint


@pytest.fixture(scope="module")
def data():
    return small_migration()


@pytest.mark.parametrize("url", ["milvus://127.0.0.1:{port}", "postgresql://postgres@127.0.0.1:{port}/postgres",
                                 "qdrant://127.0.0.1:{port}"])
def test_an_unreachable_server_is_one_error_of_its_kind(url, tmp_path, capsys):
    url = url.format(port=free_port())
    with pytest.raises(VectorDBError, match="cannot connect"):
        open_store(url)
    rc = vectordb_main(["migrate", "--store", url, "--source", "a", "--target", "b", "--map", "m.npz",
                        "--checkpoint", str(tmp_path / "ck.json")])
    # exit 75, retry later (as HTTP's 503 says with Retry-After): neither 2 (the command is right) nor 3 (a bug)
    assert rc == 75 and "cannot connect" in capsys.readouterr().err


def test_a_server_that_answers_but_is_no_qdrant_is_exit_2_not_retry_later(tmp_path, capsys):
    """A wrong port that answers (here a web server saying 404) is the user's to fix: it was exit 75 with
    Retry-After, like a Qdrant that is down, and a scheduler or the client retried it for ever."""
    pytest.importorskip("qdrant_client")
    import http.server
    import threading

    from service.errors import exit_code, retry_after_of
    from service.vectordb import VectorDBUnavailableError

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"qdrant://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(VectorDBError, match="cannot connect") as info:
            open_store(url)
        assert not isinstance(info.value, VectorDBUnavailableError), info.value
        assert exit_code(info.value) == 2 and retry_after_of(info.value) is None
    finally:
        server.shutdown()
        server.server_close()


def test_a_collection_search_on_an_unreachable_milvus_is_a_503_over_http(tmp_path):
    """An unreachable Milvus server's grpc error is its own ``__cause__``: the API's error handler walked that chain
    (is it a storage error?) forever, and the search never answered while its thread spun at 100% CPU. Real HTTP
    (uvicorn in a thread), so a hang is a client timeout here, not a test that never ends."""
    pytest.importorskip("pymilvus", reason="the Milvus client is an optional extra (vectordb-clients)")
    import httpx
    from _api_support import R, W, settings_for
    from _servers import serve_in_thread

    from service.api import create_app

    app = create_app(settings_for(tmp_path, vectordb_url=f"milvus://127.0.0.1:{free_port()}"))
    with serve_in_thread(app) as base:
        assert httpx.post(f"{base}/v1/spaces", json={"name": "a", "dim": 4}, headers=W, timeout=30).status_code == 201
        r = httpx.post(f"{base}/v1/collections/docs/search", json={"vectors": [[0.1, 0.9, 0, 0]], "space": "a", "k": 3},
                       headers=R, timeout=30)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["type"] == "VectorDBUnavailableError" and "cannot connect" in r.json()["error"]["message"]
    assert r.headers["retry-after"] == "5"  # a server down may come back: retry (CLI exit 75)


@pytest.mark.parametrize("url, module", [("qdrant://127.0.0.1:1", "qdrant_client"),
                                         ("milvus://127.0.0.1:1", "pymilvus"),
                                         ("postgresql://postgres@127.0.0.1:1/x", "pgvector")])
def test_a_store_whose_client_library_is_missing_is_a_503_naming_the_extra(url, module, tmp_path, capsys,
                                                                          monkeypatch):
    """The Docker image had no qdrant-client: the compose file's migration was exit 3 with a bare ImportError and
    a collection search an HTTP 500. (A module set to None in sys.modules is one Python cannot import.)"""
    import sys

    from service.errors import http_status

    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(VectorDBError, match=f"needs the Python package '{module}'.*vectordb-clients") as e:
        open_store(url)
    assert http_status(e.value) == 503
    rc = vectordb_main(["migrate", "--store", url, "--source", "a", "--target", "b", "--map", "m.npz",
                        "--checkpoint", str(tmp_path / "ck.json")])
    assert rc == 2 and "vectordb-clients" in capsys.readouterr().err  # installing it is the fix, not a retry


def test_status_reads_the_checkpoint_without_a_store(tmp_path, capsys, monkeypatch):
    """`python -m service.vectordb status --checkpoint FILE` crashed with a traceback (AttributeError: the status
    command has no --store, yet main() read args.store before looking at the command), with or without
    VECBRIDGE_VECTORDB_URL; it prints what the checkpoint says."""
    monkeypatch.delenv("VECBRIDGE_VECTORDB_URL", raising=False)
    ck = tmp_path / "ck.json"
    FileCheckpoint(ck).save({"source": "a", "target": "b", "map_fingerprint": "f", "done": 5, "total": 10,
                             "last_id": 4})
    assert vectordb_main(["status", "--checkpoint", str(ck)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["source"], out["done"], out["total"], out["fraction"]) == ("a", 5, 10, 0.5)
    assert vectordb_main(["status", "--checkpoint", str(tmp_path / "none.json")]) == 2
    assert "no checkpoint" in capsys.readouterr().err


def test_milvus_lite_file_in_a_new_folder_is_created(tmp_path):
    pytest.importorskip("milvus_lite")
    with open_store(f"milvus://{tmp_path}/new/docs.db") as s:  # the README's milvus:///tmp/vb-demo/docs.db
        assert not s.exists("docs")
    assert (tmp_path / "new" / "docs.db").exists()


ENGINES = ["milvus", "pgvector", "qdrant"]


@pytest.fixture
def store(request, tmp_path):
    """An open store of the engine ``request.param``, cleaned of this module's collections afterwards."""
    kind = request.param
    if kind == "milvus":
        s = open_store("milvus://" + request.getfixturevalue("milvus_url").split("://", 1)[1])
    elif kind == "pgvector":
        s = open_store(request.getfixturevalue("pg_url"))
    else:
        s = open_store(f"qdrant://{tmp_path}/qdrant")
    names = ("r_src", "r_a", "r_b", "r_live")
    for n in names:
        s.drop(n)
    yield s
    for n in names:
        s.drop(n)
    s.close()


def _source(store, X, n=200):
    store.create("r_src", X.shape[1])
    store.upsert("r_src", np.arange(n), X[:n], [f"t{i}" for i in range(n)])


@pytest.mark.parametrize("store", ENGINES, indirect=True)
def test_a_target_named_like_an_alias_is_refused_and_the_live_collection_kept(store, data):
    # Milvus' has_collection says yes for an alias, and drop_collection(alias) drops its collection:
    # `--target docs --overwrite` with docs -> docs_e5 used to drop the live docs_e5
    X, m = data
    _source(store, X)
    migrate(store, "r_src", "r_a", m, alias="r_live")
    with pytest.raises(CollectionExistsError, match="is an alias"):
        migrate(store, "r_src", "r_live", m, overwrite=True)
    assert store.resolve_alias("r_live") == "r_a" and store.count("r_a") == 200
    assert not store.exists("r_live")  # exists(): a collection, not an alias (as the interface says)


@pytest.mark.parametrize("store", ENGINES, indirect=True)
def test_an_alias_that_names_a_collection_is_refused_before_any_row_is_written(store, data):
    X, m = data  # used to write every row, then fail at the switch (pgvector, Milvus' and Qdrant's errors)
    _source(store, X)
    for alias in ("r_src", "r_b"):  # the source; the target itself
        with pytest.raises(CollectionExistsError, match="choose another --alias"):
            migrate(store, "r_src", "r_b", m, alias=alias)
        assert not store.exists("r_b")


@pytest.mark.parametrize("store", ENGINES, indirect=True)
def test_overwrite_of_the_collection_an_alias_serves_is_refused(store, data):
    X, m = data  # dropping it took the alias down with it until (and unless) the new run switched it back
    _source(store, X)
    migrate(store, "r_src", "r_a", m, alias="r_live")
    with pytest.raises(CollectionExistsError, match="r_live"):
        migrate(store, "r_src", "r_a", m, overwrite=True)
    assert store.resolve_alias("r_live") == "r_a" and store.count("r_live") == 200
    migrate(store, "r_src", "r_b", m, alias="r_live")  # the way to redo it: a new collection, then the switch
    assert store.resolve_alias("r_live") == "r_b" and store.aliases_of("r_a") == []
    migrate(store, "r_src", "r_a", m, overwrite=True)  # no alias serves it any more


@pytest.mark.parametrize("store", ENGINES, indirect=True)
def test_the_largest_batch_size_the_cli_takes_works_on_every_engine(store, data):
    X, m = data  # Milvus' query_iterator refuses batch_size > 16384: was a ParamError, exit 3
    _source(store, X)
    rep = migrate(store, "r_src", "r_a", m, batch_size=1_000_000)
    assert rep.rows == 200 and rep.batches == 1
    np.testing.assert_array_equal(store.ids("r_a", batch_size=1_000_000), np.arange(200))


def test_qdrant_ids_that_mix_integers_and_uuids_are_refused_by_name(tmp_path, data):
    from qdrant_client import models

    X, m = data  # int() of a UUID string was a ValueError: 'internal error', exit 3; UUID-only ids now migrate
    s = open_store(f"qdrant://{tmp_path}/q")
    s.create("mixed", X.shape[1])
    uid = "5c56c793-69f3-4fbf-87e6-c4bf54c28c26"
    s.client.upsert("mixed", points=[models.PointStruct(id=i, vector=X[i].tolist()) for i in range(4)]
                    + [models.PointStruct(id=uid, vector=X[4].tolist())])
    with pytest.raises(UnsupportedFieldError, match=uid):  # the UUID comes in a batch of its own
        migrate(s, "mixed", "mixed_t", m, batch_size=2)
    with pytest.raises(UnsupportedFieldError, match="mix integers and UUIDs"):
        s.ids("mixed")
    s.close()


def test_nan_vectors_stored_in_milvus_are_refused_naming_their_ids(milvus_url, data):  # noqa: F811
    X, m = data  # pgvector and Qdrant refuse NaN on insert; Milvus stores it
    s = open_store("milvus://" + milvus_url.split("://", 1)[1])
    for n in ("r_nan", "r_nan_t"):
        s.drop(n)
    s.create("r_nan", X.shape[1])
    V = X[:10].tolist()
    V[7][3] = float("nan")
    s.client.upsert("r_nan", [{"id": i, "vector": V[i]} for i in range(10)])
    try:
        with pytest.raises(NonFiniteError, match=r"'r_nan'.*ids \[7\]"):  # was "X: 1 row(s) contain NaN or Inf"
            migrate(s, "r_nan", "r_nan_t", m, batch_size=4)
        assert s.count("r_nan_t") == 4  # the batch before it is written; nothing of the bad batch
    finally:
        for n in ("r_nan", "r_nan_t"):
            s.drop(n)
        s.close()


def test_milvus_partitions_a_user_made_are_refused_before_anything_is_written(milvus_url, data):  # noqa: F811
    """A collection with partitions tenant_a / tenant_b migrated into one _default partition: searches naming a
    partition found nothing behind the alias, and verify said PASS. Refused now, naming them, nothing written; a
    partition-key collection (Milvus' own partitions) still migrates."""
    from pymilvus import DataType, MilvusClient

    X, m = data
    s = open_store("milvus://" + milvus_url.split("://", 1)[1])
    names = ("r_parts", "r_parts_t", "r_pk", "r_pk_t")
    for n in names:
        s.drop(n)
    try:
        s.create("r_parts", X.shape[1])
        for p in ("tenant_a", "tenant_b"):
            s.client.create_partition("r_parts", p)
            s.client.upsert("r_parts", [{"id": i, "vector": X[i].tolist()} for i in range(p == "tenant_b", 20, 2)],
                            partition_name=p)
        with pytest.raises(UnsupportedFieldError, match="partition.s. tenant_a, tenant_b"):
            migrate(s, "r_parts", "r_parts_t", m)
        assert not s.exists("r_parts_t")
        schema = MilvusClient.create_schema(auto_id=False)
        schema.add_field("id", DataType.INT64, is_primary=True)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=X.shape[1])
        schema.add_field("tenant", DataType.VARCHAR, max_length=20, is_partition_key=True)
        index = s.client.prepare_index_params()
        index.add_index("vector", metric_type="COSINE", index_type="AUTOINDEX")
        s.client.create_collection("r_pk", schema=schema, index_params=index, num_partitions=4)
        s.client.upsert("r_pk", [{"id": i, "vector": X[i].tolist(), "tenant": f"t{i % 3}"} for i in range(20)])
        assert migrate(s, "r_pk", "r_pk_t", m).rows == 20
    finally:
        for n in names:
            s.drop(n)
        s.close()
