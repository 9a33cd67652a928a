"""Qdrant collections keyed by UUIDs (what LangChain's and LlamaIndex's Qdrant stores write by default) migrate,
resume and verify like integer-keyed ones, on Qdrant's local mode (the client's embedded engine).

Before, the first UUID was an UnsupportedFieldError: such a collection could not be migrated at all.
"""

from __future__ import annotations

import numpy as np
import pytest
from _servers import read_line
from _vectordb_servers import qdrant_local, small_migration  # noqa: F401  (fixture)
from _vectordb_servers import uuids as _uuids

from align.exceptions import InputError
from service.vectordb import (
    MemoryCheckpoint,
    MigrationInterrupted,
    UnsupportedFieldError,
    check_rows,
    migrate,
    open_store,
)

pytest.importorskip("qdrant_client")


@pytest.fixture
def store(qdrant_local):  # noqa: F811
    return qdrant_local


def _source(s, X, ids):
    s.create("u_src", X.shape[1])
    s.set_space("u_src", "spa")
    s.upsert("u_src", ids, X, [f"text {i}" for i in range(len(ids))],
             {"n": list(range(len(ids)))})


def test_a_uuid_keyed_collection_migrates_resumes_and_verifies(store):
    X, m = small_migration()
    ids = _uuids(len(X))
    _source(store, X, ids)
    ck = MemoryCheckpoint()
    calls = {"n": 0}

    def stop():
        calls["n"] += 1
        return calls["n"] == 2  # interrupted after the second batch, as Ctrl-C would

    with pytest.raises(MigrationInterrupted):
        migrate(store, "u_src", "u_dst", m, batch_size=30, checkpoint=ck, should_stop=stop)
    state = ck.load()
    assert state["done"] == 60 and state["last_id"] in ids and store.count("u_dst") == 60
    rep = migrate(store, "u_src", "u_dst", m, batch_size=30, checkpoint=ck)
    assert rep.resumed_from == state["last_id"] and rep.rows_this_run == len(X) - 60 and rep.rows == len(X)
    b = store.fetch("u_dst", ids[::-1], with_fields=True)  # any order, by UUID
    assert b.ids.tolist() == ids[::-1] and b.texts == [f"text {i}" for i in range(len(X))][::-1]
    assert b.fields["n"] == list(range(len(X)))[::-1]
    np.testing.assert_allclose(b.vectors, m.apply(X[::-1], output="raw"), rtol=1e-5, atol=1e-6)
    assert sorted(store.ids("u_dst").tolist()) == sorted(ids)

    assert check_rows(store, "u_src", "u_dst", m)["rows_ok"]
    _, I = store.search("u_dst", m.apply(X[:3], output="raw"), k=2)
    assert I[:, 0].tolist() == [i for i in ids[:3]]  # the engine's search answers UUIDs too


def test_check_rows_names_missing_and_wrong_uuid_rows(store):
    X, m = small_migration()
    ids = _uuids(len(X), seed=1)
    _source(store, X, ids)
    migrate(store, "u_src", "u_dst", m, batch_size=64)
    store.upsert("u_dst", [ids[7]], m.apply(X[8:9], output="raw"))  # a wrong vector
    extra = _uuids(1, seed=2)
    store.upsert("u_dst", extra, m.apply(X[:1], output="raw"))  # a row the source does not have
    out = check_rows(store, "u_src", "u_dst", m)
    assert not out["rows_ok"] and out["wrong_ids"] == [ids[7]] and out["extra_ids"] == extra
    assert out["missing_rows"] == 0


def test_ids_in_another_case_are_the_same_point(store):
    X, _ = small_migration()
    ids = _uuids(4, seed=3)
    store.create("u_case", X.shape[1])
    store.upsert("u_case", [i.upper() for i in ids], X[:4])
    assert store.fetch("u_case", ids).ids.tolist() == ids  # Qdrant keeps the canonical lower-case form


def test_mixed_integer_and_uuid_ids_are_refused_by_name(store):
    X, m = small_migration()
    uid = _uuids(1, seed=4)[0]
    store.create("mixed", X.shape[1])
    store.upsert("mixed", [0, 1, 2, 3], X[:4])
    store.upsert("mixed", [uid], X[4:5])
    with pytest.raises(UnsupportedFieldError, match=f"mix integers and UUIDs.*{uid}"):
        migrate(store, "mixed", "mixed_t", m, batch_size=10)


def test_string_ids_that_a_store_cannot_keep_are_refused(store, tmp_path):
    X, _ = small_migration()
    store.create("u_bad", X.shape[1])
    with pytest.raises(InputError, match="must be a UUID"):
        store.upsert("u_bad", ["doc-1"], X[:1])
    with pytest.raises(InputError, match="must not be empty"):
        store.upsert("u_bad", [""], X[:1])
    pytest.importorskip("milvus_lite")
    with open_store(f"milvus://{tmp_path}/m.db") as mv:  # an INT64 primary key (VARCHAR: test_vectordb_milvus_keys)
        mv.create("u_bad", X.shape[1])
        with pytest.raises(InputError, match="milvus: 'u_bad' keys rows by INT64, got str ids"):
            mv.upsert("u_bad", _uuids(1), X[:1])


def test_stores_of_one_local_folder_share_its_client_and_another_process_is_one_clear_error(tmp_path):
    """Qdrant's local mode locks its folder; a second client of it, even in this process (a migration job while
    the service's collection search holds it), was refused. Now every store of the folder in this process shares
    one client, calls one at a time (two threads writing at once lose nothing), and the last close (or a store
    dropped unclosed) frees the folder; another process holding it is a VectorDBError (503 over HTTP) saying so,
    not Qdrant's bare RuntimeError."""
    import gc
    import subprocess
    import sys
    import threading

    from service.vectordb import VectorDBError

    X, _ = small_migration()
    a, b = open_store(f"qdrant://{tmp_path}/q"), open_store(f"qdrant://{tmp_path}/q")
    a.create("shared", X.shape[1])
    errors = []

    def write(store, lo):
        try:
            for i in range(lo, lo + 50, 10):
                store.upsert("shared", np.arange(i, i + 10), X[i:i + 10])
                store.search("shared", X[i:i + 1], k=1)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(st, lo)) for st, lo in ((a, 0), (b, 50))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not [t for t in threads if t.is_alive()], "a writer still runs after 120 s"
    assert errors == [] and b.count("shared") == 100
    a.close()
    a.close()  # twice: nothing more
    assert b.fetch("shared", [7]).ids.tolist() == [7]  # the other store still works
    del b  # dropped without close: its share is given back all the same
    gc.collect()
    code = ("import sys; from service.vectordb import open_store; "
            f"s = open_store('qdrant://{tmp_path}/q'); print('open', flush=True); sys.stdin.read(); s.close()")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert read_line(holder).strip() == "open"  # the folder was free: the last close released it
        with pytest.raises(VectorDBError, match="open in another process.*one process at a time"):
            open_store(f"qdrant://{tmp_path}/q")
    finally:
        holder.communicate("", timeout=60)
    with open_store(f"qdrant://{tmp_path}/q") as s:  # free again once the other process closed it
        assert s.count("shared") == 100
