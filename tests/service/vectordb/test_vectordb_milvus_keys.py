"""Milvus collections keyed by VARCHAR (LlamaIndex's layout, and any collection keyed by document ids) migrate,
resume and verify like INT64-keyed ones, on Milvus Lite (embedded); a primary key not named ``id`` (LangChain's
``pk``) works with ``id_field`` and is refused by name without it (Milvus Lite as its own server).

Before, such a collection was refused at the plan ("primary key of type VARCHAR; need INT64"). Keys holding a
quote, a backslash or a newline are the hard part: pymilvus' own ``query_iterator`` and ``get`` put a key into
their filter expression unescaped, so this adapter pages and fetches with expressions it escapes itself.
"""

from __future__ import annotations

import numpy as np
import pytest
from _vectordb_servers import milvus_url, small_migration  # noqa: F401  (a module-scoped fixture)

from align.exceptions import InputError
from service.vectordb import (
    MemoryCheckpoint,
    MigrationInterrupted,
    check_rows,
    migrate,
    open_store,
)

pytest.importorskip("pymilvus")
pytest.importorskip("milvus_lite")

ODD = ['quote"d', "back\\slash", "new\nline", "tab\tbed", "é-ünïcode", "with space", "ctl\x01char", 'x\\"y']


@pytest.fixture
def store(tmp_path):
    s = open_store(f"milvus://{tmp_path}/m.db")
    yield s
    s.close()


def _keys(n: int) -> list[str]:
    rng = np.random.default_rng(0)  # written in a shuffled order: the key order is the engine's job
    return [ODD[i] if i < len(ODD) else f"doc-{i}" for i in rng.permutation(n)]


def _llamaindex_like(store, name: str, X, ids) -> None:
    """A collection as LlamaIndex's MilvusVectorStore makes one: ``id`` VARCHAR, ``embedding`` vectors,
    the text and metadata in the dynamic field."""
    store.client.create_collection(name, dimension=X.shape[1], primary_field_name="id", id_type="string",
                                   max_length=64, vector_field_name="embedding", auto_id=False,
                                   consistency_level="Strong")
    store.client.upsert(name, [{"id": i, "embedding": X[j].tolist(), "text": f"text {j}", "doc": j}
                               for j, i in enumerate(ids)])


def test_a_varchar_keyed_collection_migrates_resumes_and_verifies(tmp_path):
    X, m = small_migration()
    ids = _keys(len(X))
    with open_store(f"milvus://{tmp_path}/m.db", vector_field="embedding") as s:
        _llamaindex_like(s, "v_src", X, ids)
        assert s.unsupported_fields("v_src") == []
        assert s.ids("v_src").tolist() == sorted(ids)  # key order, past every odd key
        ck = MemoryCheckpoint()
        calls = {"n": 0}

        def stop():
            calls["n"] += 1
            return calls["n"] == 2

        with pytest.raises(MigrationInterrupted):
            migrate(s, "v_src", "v_dst", m, batch_size=30, checkpoint=ck, should_stop=stop)
        state = ck.load()
        assert state["done"] == 60 and state["last_id"] == sorted(ids)[59] and s.count("v_dst") == 60
        rep = migrate(s, "v_src", "v_dst", m, batch_size=30, checkpoint=ck)
        assert rep.resumed_from == state["last_id"] and rep.rows_this_run == len(X) - 60 and rep.rows == len(X)
        key = next(f for f in s.client.describe_collection("v_dst")["fields"] if f["name"] == "id")
        assert key["params"]["max_length"] == 64  # the target keys its rows as the source does
        b = s.fetch("v_dst", ODD[::-1], with_fields=True)
        at = [ids.index(i) for i in ODD[::-1]]
        assert b.ids.tolist() == ODD[::-1] and b.texts == [f"text {j}" for j in at] and b.fields["doc"] == at
        np.testing.assert_allclose(b.vectors, m.apply(X[at], output="raw"), rtol=1e-5, atol=1e-6)
        assert check_rows(s, "v_src", "v_dst", m)["rows_ok"]
        _, I = s.search("v_dst", m.apply(X[at[:3]], output="raw"), k=1)
        assert I[:, 0].tolist() == ODD[::-1][:3]


def test_check_rows_names_wrong_extra_and_missing_string_keys(store):
    X, m = small_migration()
    ids = _keys(len(X))
    store.client.create_collection("k_src", dimension=X.shape[1], primary_field_name="id", id_type="string",
                                   max_length=32, auto_id=False, consistency_level="Strong")
    store.upsert("k_src", ids, X, [f"t{i}" for i in range(len(X))])
    migrate(store, "k_src", "k_dst", m, batch_size=64)
    store.upsert("k_dst", ["back\\slash"], m.apply(X[:1], output="raw") * 2)  # a wrong vector
    store.upsert("k_dst", ['stray "one"'], m.apply(X[:1], output="raw"))  # a row the source does not have
    store.client.delete("k_dst", filter='id == "new\\nline"')
    out = check_rows(store, "k_src", "k_dst", m)
    assert out["wrong_ids"] == ["back\\slash"] and out["extra_ids"] == ['stray "one"']
    assert out["missing_ids"] == ["new\nline"] and not out["rows_ok"]


def test_keys_the_collection_cannot_hold_are_one_clear_error(store):
    X, _ = small_migration()
    store.client.create_collection("k_src", dimension=X.shape[1], primary_field_name="id", id_type="string",
                                   max_length=8, auto_id=False, consistency_level="Strong")
    with pytest.raises(InputError, match="'k_src' keys rows by VARCHAR, got int ids"):
        store.upsert("k_src", [1, 2], X[:2])
    with pytest.raises(InputError, match=r"1 id\(s\) longer than the key's max_length 8 bytes.*'éééé-long'"):
        store.upsert("k_src", ["short", "éééé-long"], X[:2])
    with pytest.raises(InputError, match="keys rows by VARCHAR, got int ids"):
        store.fetch("k_src", [1])
    assert store.count("k_src") == 0


@pytest.mark.parametrize("kind, params", [("HNSW", {"M": 24, "efConstruction": 80}), ("IVF_FLAT", {"nlist": 7}),
                                          ("AUTOINDEX", {})])
def test_a_migration_target_gets_the_source_collections_dense_index_kind(tmp_path, kind, params):
    """The target's dense vector was always an AUTOINDEX (the server's choice, not the user's HNSW or IVF). Now it
    is built with the source's own index kind and build parameters, in the map's metric. (Milvus Lite keeps the
    kind but reports no build parameters, so only the kind can be checked here; a Milvus server returns them and
    they are passed on the same way.)"""
    from pymilvus import DataType

    X, m = small_migration()
    with open_store(f"milvus://{tmp_path}/m.db") as s:
        schema = s.client.create_schema(auto_id=False)
        schema.add_field("id", DataType.INT64, is_primary=True)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=X.shape[1])
        ip = s.client.prepare_index_params()
        ip.add_index("vector", index_type=kind, metric_type="COSINE", params=params)
        s.client.create_collection("k_src", schema=schema, index_params=ip, consistency_level="Strong")
        s.client.insert("k_src", [{"id": i, "vector": X[i].tolist()} for i in range(len(X))])
        rep = migrate(s, "k_src", "k_dst", m, batch_size=64)
        assert rep.extra["target_index"].split()[0] == kind
        src = s.client.describe_index("k_src", s.client.list_indexes("k_src")[0])
        (idx,) = [s.client.describe_index("k_dst", n) for n in s.client.list_indexes("k_dst")]
        assert src["index_type"] == kind and idx["index_type"] == kind and idx["field_name"] == "vector", idx
        assert idx["metric_type"] == "COSINE"
        _, I = s.search("k_dst", m.apply(X[:5], output="raw"), k=1)
        assert I[:, 0].tolist() == list(range(5))


def test_a_dynamic_text_key_that_is_not_a_string_travels_as_it_is(store):
    """The text key of a row lives in Milvus's dynamic field, where it may hold any JSON: a number, an object or a
    null arrived as ``str(value)`` (Python's repr: ``"{'nested': ...}"``) or absent; now it travels as it is, as
    every other dynamic key does (as in Qdrant's payloads)."""
    X, m = small_migration()
    texts = [{"nested": [1, {"a": None}]}, 12345, None, "plain", ["a", "b"]]
    store.create("t_src", 24)
    store.client.insert("t_src", [{"id": i, "vector": X[i].tolist(), "text": t, "k": i} for i, t in enumerate(texts)]
                        + [{"id": 5, "vector": X[5].tolist(), "k": 5}])
    store.finalize("t_src")
    rep = migrate(store, "t_src", "t_dst", m, batch_size=4)
    assert rep.rows == 6
    got = {r["id"]: r for r in store.client.query("t_dst", filter="id >= 0", output_fields=["*"])}
    assert [got[i].get("text", "absent") for i in range(6)] == texts + ["absent"]
    assert [got[i]["k"] for i in range(6)] == list(range(6))
    assert store.fetch("t_dst", [3]).texts == ["plain"]  # reads still see the text


def _langchain_like(s, name: str, X) -> None:
    """A collection as LangChain's Milvus store makes one: primary key ``pk``, ``vector``, the text in ``text``."""
    s.client.create_collection(name, dimension=X.shape[1], primary_field_name="pk", vector_field_name="vector",
                               auto_id=False, consistency_level="Strong")
    s.client.upsert(name, [{"pk": i, "vector": X[i].tolist(), "text": f"t{i}"} for i in range(len(X))])


def test_a_primary_key_not_named_id_searches_migrates_and_verifies_with_id_field(milvus_url, tmp_path):  # noqa: F811
    """Search read every hit's ``h["id"]``; pymilvus keys a hit by the primary key's name, so a collection keyed by
    ``pk`` (LangChain's) failed with KeyError: 'id' (exit 3) even with --id-field pk, in search and in verify."""
    from service.vectordb import verify_migration

    X, m = small_migration()
    with open_store("milvus://" + milvus_url.split("://", 1)[1], id_field="pk") as s:
        for n in ("lc_src", "lc_dst"):
            s.drop(n)
        try:
            _langchain_like(s, "lc_src", X)
            _, I = s.search("lc_src", X[:5], k=1)
            assert I[:, 0].tolist() == list(range(5))
            assert migrate(s, "lc_src", "lc_dst", m, batch_size=64).rows == len(X)
            Y = m.apply(X, output="raw")
            v = verify_migration(s, "lc_dst", embed=lambda ts: Y[[int(t[1:]) for t in ts]], n_sample=100,
                                 n_queries=20, db_queries=20, k=5)
            assert v["db_partner_recall@5"] == 1.0
        finally:
            for n in ("lc_src", "lc_dst"):
                s.drop(n)


def test_a_primary_key_not_named_id_is_refused_before_anything_is_written(milvus_url, tmp_path, capsys):  # noqa: F811
    """Without --id-field pk the run created the target and its checkpoint, then failed with KeyError: 'id' (exit 3;
    --dry-run too). Now one line naming the key, exit 2, nothing written; search and reads say the same."""
    from service.cli import main
    from service.vectordb import VectorDBError

    X, m = small_migration()
    m.save(tmp_path / "m.npz")
    url = "milvus://" + milvus_url.split("://", 1)[1]
    with open_store(url) as s:
        for n in ("lc_src", "lc_dst"):
            s.drop(n)
        try:
            _langchain_like(s, "lc_src", X)
            for read in (lambda: s.search("lc_src", X[:2], k=1), lambda: s.ids("lc_src"),
                         lambda: s.fetch("lc_src", [1]), lambda: migrate(s, "lc_src", "lc_dst", m, dry_run=True)):
                with pytest.raises(VectorDBError, match="key of 'lc_src' is 'pk', not 'id'; pass --id-field pk"):
                    read()
            base = ["--data-dir", str(tmp_path), "migrate", "--store", url, "--source", "lc_src", "--target", "lc_dst",
                    "--map", str(tmp_path / "m.npz"), "--quiet"]
            for extra in (["--dry-run"], []):
                assert main(base + extra) == 2
                err = capsys.readouterr().err
                assert err == "vecbridge: error: milvus: source 'lc_src' has no id field 'id' (the default); it " \
                              "has primary key 'pk': name it with --id-field\n", err  # as a request's refusal
            assert not s.exists("lc_dst") and not (tmp_path / "migrations" / "lc_src-to-lc_dst.json").exists()
            assert main(base + ["--id-field", "pk"]) == 0
            assert s.count("lc_dst") == len(X)
        finally:
            for n in ("lc_src", "lc_dst"):
                s.drop(n)


def test_a_text_key_the_dynamic_field_lacks_is_refused_and_a_missing_source_logs_nothing(tmp_path, caplog):
    """Every collection vecbridge makes has a dynamic field, so its schema never told a text field's name:
    ``--text-field body`` on rows whose texts are under ``text`` migrated every row (exit 0), the texts travelling
    as ``text`` and ``body`` absent. The first row's dynamic keys are read: refused before anything is written,
    naming the option and the keys there are; the right name still runs. A missing source (a 404 over HTTP) logged
    pymilvus's describe_collection traceback (~20 lines, ERROR) before the one-line refusal: nothing is logged."""
    from service.ops.vectordb import run_migration
    from service.vectordb import CollectionNotFoundError

    X, m = small_migration()
    m.save(tmp_path / "m.npz")
    url = f"milvus://{tmp_path}/m.db"
    with open_store(url) as s:
        s.create("msrc", X.shape[1])
        s.upsert("msrc", np.arange(len(X)), X, [f"t{i}" for i in range(len(X))], {"n": list(range(len(X)))})
        s.finalize("msrc")
    run = {"store_url": url, "source": "msrc", "map_ref": str(tmp_path / "m.npz"), "checkpoint": tmp_path / "c.json"}
    with pytest.raises(InputError, match=r"milvus: source 'msrc' has no text field 'body'; it has fields id, vector; "
                                         r"its first row's dynamic keys: n, text: fix --text-field"):
        run_migration(**run, target="mt_body", text_field="body")
    assert not (tmp_path / "c.json").exists()
    caplog.clear()
    with pytest.raises(CollectionNotFoundError, match="no collection or alias 'nope'"):
        run_migration(**{**run, "source": "nope"}, target="mt_none")
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "WARNING")], caplog.text
    assert run_migration(**run, target="mt_text", text_field="text").rows == len(X)
    with open_store(url) as s:
        assert not s.exists("mt_body") and s.fetch("mt_text", [3]).texts == ["t3"]
