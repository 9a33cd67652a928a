"""Qdrant payloads and points a migration met badly (local mode, the client's embedded engine).

- a payload's text key holding a number, an object, a list or an explicit null arrived as ``str(value)`` (Python's
  repr: ``"{'a': 1}"``) or absent, while every other key travels as it is: now the text key does too;
- a point id above 2**63 - 1 (Qdrant's ids are unsigned 64-bit) was a bare ``OverflowError``;
- a multivector collection (ColBERT) had its target created, then failed with "expected a 2-D array".
"""

from __future__ import annotations

import pytest
from _vectordb_servers import qdrant_local, small_migration  # noqa: F401  (fixture)

from service.vectordb import UnsupportedFieldError, migrate

pytest.importorskip("qdrant_client")


@pytest.fixture
def store(qdrant_local):  # noqa: F811
    return qdrant_local


def test_a_text_key_that_is_not_a_string_travels_as_it_is(store):
    from qdrant_client import models

    X, m = small_migration()
    payloads = [{"text": {"nested": [1, {"a": None}]}}, {"text": 12345}, {"text": None, "k": 1}, {"text": ["a", "b"]},
                {"text": "plain", "u": "ünï✓"}, {"k": 2}]
    store.create("t_src", 24)
    store.client.upsert("t_src", points=models.Batch(ids=list(range(6)), vectors=X[:6].tolist(), payloads=payloads),
                        wait=True)
    rep = migrate(store, "t_src", "t_dst", m, batch_size=4)
    assert rep.rows == 6 and "text" in rep.extra["fields"]
    got = {p.id: p.payload for p in store.client.scroll("t_dst", limit=10, with_payload=True)[0]}
    assert [got[i] for i in range(6)] == payloads  # before: "{'nested': ...}", "12345", the null text absent
    assert store.fetch("t_dst", [4]).texts == ["plain"]  # reads still see the text


def test_a_point_id_above_int64_is_one_clear_error(store):
    from qdrant_client import models

    X, m = small_migration()
    store.create("b_src", 24)
    store.client.upsert("b_src", points=models.Batch(ids=[1, 2**63, 2**64 - 1], vectors=X[:3].tolist()), wait=True)
    with pytest.raises(UnsupportedFieldError, match="9223372036854775808"):  # before: OverflowError
        migrate(store, "b_src", "b_dst", m)


def test_a_multivector_collection_is_refused_before_anything_is_written(store):
    from qdrant_client import models

    X, m = small_migration()
    store.client.create_collection("mv", vectors_config=models.VectorParams(
        size=24, distance=models.Distance.COSINE,
        multivector_config=models.MultiVectorConfig(comparator=models.MultiVectorComparator.MAX_SIM)))
    store.client.upsert("mv", points=[models.PointStruct(id=i, vector=X[2 * i:2 * i + 2].tolist()) for i in range(3)])
    with pytest.raises(UnsupportedFieldError, match="multivector"):
        migrate(store, "mv", "mv_dst", m, dry_run=True)
    with pytest.raises(UnsupportedFieldError, match="multivector"):
        migrate(store, "mv", "mv_dst", m)
    assert not store.exists("mv_dst")  # before: created, then "expected a 2-D array ... 3-D shape (3, 2, 24)"


@pytest.mark.parametrize("path_alias", [None, "stable"])
def test_the_migrate_command_reads_a_bare_map_name_by_the_path_alias_setting(path_alias, tmp_path, monkeypatch,
                                                                              capsys):
    """``python -m service.vectordb migrate --map m --registry URL`` opened the registry with the default alias
    (``prod``) while search, transform and ``vecbridge`` follow ``VECBRIDGE_PATH_ALIAS``: with ``stable`` set, the
    collection was migrated through another version than searches use."""
    import numpy as np
    from qdrant_client import models

    import align
    from service.config import get_settings
    from service.registry import open_registry
    from service.vectordb import open_store
    from service.vectordb.__main__ import main as vectordb_main

    X, stable = small_migration()
    rng = np.random.default_rng(7)
    prod = align.fit_procrustes(X, (X @ np.linalg.qr(rng.normal(size=(24, 24)))[0][:, :16]).astype(np.float32))
    url, art = f"sqlite:///{tmp_path / 'r.sqlite'}", tmp_path / "art"
    reg = open_registry(url, art)
    reg.register_version("m", stable, source_space="a", target_space="b", method="procrustes", params={},
                         alias="stable")
    reg.register_version("m", prod, source_space="a", target_space="b", method="procrustes", params={}, alias="prod")
    reg.close()
    store = open_store(f"qdrant://{tmp_path}/q")
    store.create("src", 24)
    store.client.upsert("src", points=models.Batch(ids=list(range(6)), vectors=X[:6].tolist()), wait=True)
    store.close()
    if path_alias:
        monkeypatch.setenv("VECBRIDGE_PATH_ALIAS", path_alias)
    get_settings.cache_clear()  # the command reads the environment once per process
    try:
        rc = vectordb_main(["migrate", "--store", f"qdrant://{tmp_path}/q", "--source", "src", "--target", "dst",
                            "--map", "m", "--registry", url, "--artifact-dir", str(art),
                            "--checkpoint", str(tmp_path / "ck.json")])
    finally:
        get_settings.cache_clear()
    assert rc == 0, capsys.readouterr().err
    store = open_store(f"qdrant://{tmp_path}/q")
    try:
        got = store.fetch("dst", list(range(6))).vectors
    finally:
        store.close()
    want = (stable if path_alias else prod).apply(X[:6])
    np.testing.assert_allclose(got, want, atol=1e-5)
