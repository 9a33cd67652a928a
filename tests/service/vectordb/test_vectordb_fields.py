"""Every field of a row arrives after a migration, on the real engines (issue 15 finding 11, issue 14).

Milvus Lite (own server process) and PostgreSQL + pgvector (pgserver wheel), URLs from
``.ci/start_vectordbs.sh`` or started here (the fixtures of ``test_vectordb_engines``). Before,
Milvus rows ``{id, vector, text, category, lang}`` arrived as ``{id, text}`` and a PostgreSQL
``category`` column was dropped while the report said success; the vector column had to be
``vector`` / ``embedding``. Now the fields travel (PostgreSQL: same column types), the field names
are options, and a field that cannot travel (a second vector column) is refused by name.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

import align
from service.ops.vectordb import open_store_for, run_migration
from service.vectordb import UnsupportedFieldError

from _vectordb_servers import milvus_url, pg_url  # noqa: F401  (module-scoped server fixtures)

N, D = 300, 16


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((N + 300, D)).astype(np.float32)
    Q = np.linalg.qr(rng.standard_normal((D, D)))[0]
    m = align.fit_procrustes(X[N:], X[N:] @ Q)
    m.metadata.update(source_space="spa", target_space="spb")
    return X[:N], m, np.arange(N, dtype=np.int64) * 7 + 1


def _migrate_and_compare(url, names, fields, X, m, ids, tmp_path, *, expect_fields):
    src, dst = "fsrc", "fdst"
    store = open_store_for(url, **names)
    try:
        rep = run_migration(store_url=url, source=src, target=dst, map_ref=m, checkpoint=tmp_path / "c.json",
                            batch_size=128, **names)
        assert rep.rows == N and rep.extra["fields"] == expect_fields
        assert rep.extra["space_check"] == "checked: spa"
        b = store.fetch(dst, ids, with_fields=True)
        assert b.texts == [f"text {i}" for i in range(N)]
        for k, want in fields.items():
            assert b.fields[k] == want, k
        np.testing.assert_allclose(b.vectors, m.apply(X, output="raw"), rtol=1e-5, atol=1e-6)
        assert store.get_space(dst) == "spb"
        return rep
    finally:
        for c in (src, dst):
            store.drop(c)
        store.close()


def test_milvus_dynamic_fields_and_custom_names_arrive(milvus_url, data, tmp_path):  # noqa: F811
    X, m, ids = data
    url = "milvus://" + milvus_url.split("://", 1)[1]
    names = {"id_field": "pk", "vector_field": "emb", "text_field": "body"}
    fields = {"category": [f"c{i % 5}" for i in range(N)], "lang": ["en" if i % 2 else "de" for i in range(N)],
              "score": [i / 7 for i in range(N)], "meta": [{"page": i, "ok": bool(i % 3)} for i in range(N)]}
    store = open_store_for(url, **names)
    for c in ("fsrc", "fdst"):
        store.drop(c)
    store.create("fsrc", D)
    store.upsert("fsrc", ids, X, [f"text {i}" for i in range(N)], fields)
    store.set_space("fsrc", "spa")
    store.close()
    _migrate_and_compare(url, names, fields, X, m, ids, tmp_path,
                         expect_fields=["body", "category", "lang", "meta", "score"])


def _pg_source(url, sql_cols: str, rows):
    import psycopg
    from pgvector.psycopg import register_vector

    with psycopg.connect(url, autocommit=True) as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS vector")
        register_vector(c)
        c.execute("DROP TABLE IF EXISTS fsrc CASCADE")
        c.execute("DROP TABLE IF EXISTS fdst CASCADE")
        c.execute(f"CREATE TABLE fsrc ({sql_cols})")
        with c.cursor() as cur:
            cur.executemany(f"INSERT INTO fsrc VALUES ({', '.join(['%s'] * len(rows[0]))})", rows)


def test_pgvector_user_table_columns_arrive_with_their_types(pg_url, data, tmp_path):  # noqa: F811
    from psycopg.types.json import Jsonb

    X, m, ids = data
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    fields = {"category": [f"c{i % 5}" for i in range(N)], "tags": [["x", str(i)] for i in range(N)],
              "meta": [{"page": i} for i in range(N)], "ts": [t0 + dt.timedelta(minutes=i) for i in range(N)],
              "score": [float(np.float32(i / 8)) for i in range(N)]}
    rows = [(int(ids[i]), X[i], f"text {i}", fields["category"][i], fields["tags"][i], Jsonb(fields["meta"][i]),
             fields["ts"][i], fields["score"][i]) for i in range(N)]
    _pg_source(pg_url, "pk bigint PRIMARY KEY, emb vector(16) NOT NULL, body text, category varchar(20), "
                       "tags text[], meta jsonb, ts timestamptz, score real", rows)
    names = {"id_field": "pk", "vector_field": "emb", "text_field": "body"}
    store = open_store_for(pg_url, **names)
    store.set_space("fsrc", "spa")
    types_src = {c: t for c, t, _ in store._columns("fsrc")}
    store.close()
    _migrate_and_compare(pg_url, names, fields, X, m, ids, tmp_path,
                         expect_fields=["body", "category", "meta", "score", "tags", "ts"])
    # (the target was dropped by the helper; its column types were checked through the values; check the DDL too)
    _pg_source(pg_url, "pk bigint PRIMARY KEY, emb vector(16) NOT NULL, body text, category varchar(20), "
                       "tags text[], meta jsonb, ts timestamptz, score real", rows[:10])
    store = open_store_for(pg_url, **names)
    try:
        store.set_space("fsrc", "spa")
        run_migration(store_url=pg_url, source="fsrc", target="fdst", map_ref=m, checkpoint=tmp_path / "d.json",
                      **names)
        types_dst = {c: t for c, t, _ in store._columns("fdst")}
        assert {c: t for c, t in types_dst.items() if c != "emb"} == {c: t for c, t in types_src.items() if c != "emb"}
    finally:
        store.drop("fsrc"), store.drop("fdst")
        store.close()


def test_pgvector_second_vector_column_is_refused_by_name(pg_url, data, tmp_path):  # noqa: F811
    X, m, ids = data
    rows = [(int(ids[i]), X[i], f"text {i}", X[i][:4]) for i in range(20)]
    _pg_source(pg_url, "id bigint PRIMARY KEY, embedding vector(16) NOT NULL, text text, thumb vector(4)", rows)
    with pytest.raises(UnsupportedFieldError, match="thumb"):
        run_migration(store_url=pg_url, source="fsrc", target="fdst", map_ref=m, checkpoint=tmp_path / "e.json")
    store = open_store_for(pg_url)
    try:
        assert not store.exists("fdst"), "a refused migration created its target"
    finally:
        store.drop("fsrc")
        store.close()


def _null_and_absent_rows(n: int) -> dict:
    """Field ``tag``: a value on even rows, an explicit null on rows 1 mod 4, absent on rows 3 mod 4."""
    from service.vectordb.base import MISSING

    return {"tag": [f"t{i}" if i % 2 == 0 else (None if i % 4 == 1 else MISSING) for i in range(n)]}


def _keys_and_nulls(batch) -> list:
    from service.vectordb.base import MISSING

    return [v if v is not MISSING else "<absent>" for v in batch.fields["tag"]]


@pytest.mark.parametrize("engine", ["qdrant", "milvus"])
def test_an_explicit_null_stays_null_and_an_absent_field_stays_absent(engine, request, data, tmp_path):
    """Qdrant payloads and Milvus dynamic fields tell a null value from a missing key (``is_null`` vs
    ``is_empty`` filters). Before, a migration read both as ``None`` and wrote neither: every explicit null
    of the source was gone in the target."""
    X, m, ids = data
    if engine == "qdrant":
        pytest.importorskip("qdrant_client")
        url, names = f"qdrant://{tmp_path / 'qdrant'}", {}
    else:
        url = "milvus://" + request.getfixturevalue("milvus_url").split("://", 1)[1]
        names = {"id_field": "pk", "vector_field": "emb", "text_field": "body"}
    fields, want = _null_and_absent_rows(N), None
    store = open_store_for(url, **names)  # (Qdrant local: one client at a time on its folder)
    try:
        for c in ("nsrc", "ndst"):
            store.drop(c)
        store.create("nsrc", D)
        store.upsert("nsrc", ids, X, [f"text {i}" for i in range(N)], fields)
        store.set_space("nsrc", "spa")
        want = _keys_and_nulls(store.fetch("nsrc", ids, with_fields=True))
        assert want == _keys_and_nulls(type("B", (), {"fields": fields}))
    finally:
        store.close()
    run_migration(store_url=url, source="nsrc", target="ndst", map_ref=m, checkpoint=tmp_path / "n.json",
                  batch_size=64, **names)
    store = open_store_for(url, **names)
    try:
        assert _keys_and_nulls(store.fetch("ndst", ids, with_fields=True)) == want
    finally:
        for c in ("nsrc", "ndst"):
            store.drop(c)
        store.close()
