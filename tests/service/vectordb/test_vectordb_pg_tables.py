"""pgvector tables as users make them, on a real PostgreSQL + pgvector (pgserver wheel).

Tables keyed by strings (``uuid``, ``text``, ``varchar``), as LangChain's PGVector table and many
hand-made ones are, migrate, resume and verify like integer-keyed ones; half-precision (``halfvec``) tables
stay half precision (the target was ``vector``, twice the storage the user chose).

Before, such a table was refused at the plan ("ids of type uuid; a migration keys rows by integer ids"), and a
vector column declared without a size (``embedding vector``, as LangChain declares it) was "no fixed-dimension
vector column".
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from _vectordb_servers import pg_url, small_migration  # noqa: F401  (module-scoped server fixture)
from _vectordb_servers import uuids as _uuids

from align.exceptions import InputError
from service.vectordb import (
    PgCheckpoint,
    UnsupportedFieldError,
    VectorDBError,
    check_rows,
    migrate,
    open_store,
)

pytest.importorskip("psycopg")


@pytest.fixture
def store(pg_url):  # noqa: F811
    s = open_store(pg_url)
    s.index = None  # exact search: results comparable with numpy
    yield s
    for t in ("s_src", "s_dst", "t_src", "t_dst", "odd", "bad_src", "bad_dst", "plain", "lc_embedding", "lc_e5",
              "h_src", "h_dst", "d_src", "d_dst", "lc_empty"):
        s.drop(t)
    s.close()


def _user_table(store, name: str, id_sql: str, X, ids) -> None:
    """A table made by hand as a user would, then filled through the store."""
    store.conn.execute(f"CREATE TABLE {name} (id {id_sql} PRIMARY KEY, embedding vector({X.shape[1]}), "
                       "text text, title text)")
    store.upsert(name, ids, X, [f"text {i}" for i in range(len(ids))], {"title": [f"t{i}" for i in range(len(ids))]})


def _id_type(store, name: str) -> str:
    return store.conn.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s::regclass "
                              "AND attname = 'id'", (name,)).fetchone()[0]


def test_a_uuid_keyed_table_migrates_resumes_and_verifies(store, pg_url):  # noqa: F811
    X, m = small_migration()
    ids = _uuids(len(X))
    _user_table(store, "s_src", "uuid", X, ids)
    ck = PgCheckpoint(pg_url, "s_src->s_dst")
    ck.clear()

    def crash(p):
        if p.done >= 60:
            raise RuntimeError("crash after the second batch")
    with pytest.raises(RuntimeError):
        migrate(store, "s_src", "s_dst", m, batch_size=30, checkpoint=ck, progress=crash)
    state = ck.load()  # a UUID as the resume point, through jsonb
    assert state["done"] == 60 and state["last_id"] in ids and store.count("s_dst") == 60
    rep = migrate(store, "s_src", "s_dst", m, batch_size=30, checkpoint=ck)
    assert rep.resumed_from == state["last_id"] and rep.rows_this_run == len(X) - 60 and rep.rows == len(X)
    assert _id_type(store, "s_dst") == "uuid"  # the target keys its rows as the source does
    ask = [i.upper() for i in ids[::-1]]  # any order, any case: PostgreSQL answers the canonical form
    b = store.fetch("s_dst", ask, with_fields=True)
    assert b.ids.tolist() == ids[::-1] and b.texts == [f"text {i}" for i in range(len(X))][::-1]
    assert b.fields["title"] == [f"t{i}" for i in range(len(X))][::-1]
    np.testing.assert_allclose(b.vectors, m.apply(X[::-1], output="raw"), rtol=1e-5, atol=1e-6)
    assert sorted(store.ids("s_dst").tolist()) == sorted(ids)
    assert check_rows(store, "s_src", "s_dst", m)["rows_ok"]
    _, I = store.search("s_dst", m.apply(X[:3], output="raw"), k=2)
    assert I[:, 0].tolist() == ids[:3]
    ck.clear()
    ck.close()


def test_text_ids_keep_their_type_and_odd_characters(store):
    X, m = small_migration()
    ids = [f"doc-{i}" for i in range(len(X) - 4)] + ['quote"d', "back\\slash", "é-ünïcode", "with space"]
    _user_table(store, "t_src", "varchar(64)", X, ids)
    migrate(store, "t_src", "t_dst", m, batch_size=37)  # batches end mid-way through the collation's order
    assert _id_type(store, "t_dst") == "character varying(64)"
    b = store.fetch("t_dst", ids[-4:])
    assert b.ids.tolist() == ids[-4:]
    np.testing.assert_allclose(b.vectors, m.apply(X[-4:], output="raw"), rtol=1e-5, atol=1e-6)
    store.upsert("t_dst", ["doc-7"], m.apply(X[8:9], output="raw"))  # a wrong vector
    store.upsert("t_dst", ["stray"], m.apply(X[:1], output="raw"))  # a row the source does not have
    store.conn.execute("DELETE FROM t_dst WHERE id = %s", ("back\\slash",))
    out = check_rows(store, "t_src", "t_dst", m)
    assert not out["rows_ok"] and out["wrong_ids"] == ["doc-7"] and out["extra_ids"] == ["stray"]
    assert out["missing_ids"] == ["back\\slash"]
    assert sorted(store.ids("t_src").tolist()) == sorted(ids)


def test_ids_of_the_wrong_kind_are_one_clear_error(store):
    X, _ = small_migration()
    _user_table(store, "s_src", "uuid", X[:4], _uuids(4, seed=1))
    with pytest.raises(InputError, match="keys rows by id uuid, got int ids"):
        store.upsert("s_src", [1], X[:1])
    with pytest.raises(InputError, match="'doc-1' is not a UUID"):
        store.upsert("s_src", ["doc-1"], X[:1])
    u = _uuids(1, seed=2)[0]
    with pytest.raises(InputError, match="two spellings of one UUID"):
        store.upsert("s_src", [u, u.upper()], X[:2])
    assert store.count("s_src") == 4  # nothing written by the refused calls
    store.create("plain", X.shape[1])  # bigint ids
    with pytest.raises(InputError, match="keys rows by id bigint, got str ids"):
        store.upsert("plain", ["doc-1"], X[:1])
    with pytest.raises(InputError, match="is not a UUID"):
        store.fetch("s_src", ["nope"])


def test_an_id_type_no_migration_can_key_by_is_refused_by_name(store):
    X, m = small_migration()
    store.conn.execute(f"CREATE TABLE odd (id numeric PRIMARY KEY, embedding vector({X.shape[1]}))")
    assert any(f.startswith("id (ids of type numeric") for f in store.unsupported_fields("odd"))
    with pytest.raises(UnsupportedFieldError, match="numeric"):
        migrate(store, "odd", "bad_dst", m, batch_size=10)
    assert not store.exists("bad_dst")


def test_a_langchain_shaped_table_migrates(store, pg_url):  # noqa: F811
    """langchain_postgres' layout: varchar ids, ``embedding vector`` without a size, ``document`` as the text,
    a uuid collection id and jsonb metadata as other columns."""
    from service.vectordb import PgVectorStore

    X, m = small_migration()
    store.conn.execute("CREATE TABLE lc_embedding (id varchar PRIMARY KEY, collection_id uuid, embedding vector, "
                       "document varchar, cmetadata jsonb)")
    coll = uuid.UUID(_uuids(1, seed=5)[0])
    with store.conn.cursor() as cur:
        cur.executemany("INSERT INTO lc_embedding VALUES (%s, %s, %s, %s, %s::jsonb)",
                        [(f"lc-{i}", coll, X[i], f"doc {i}", f'{{"page": {i}}}') for i in range(len(X))])
    lc = PgVectorStore(pg_url, index=None, text_field="document")
    assert lc.dim("lc_embedding") == X.shape[1] and lc.unsupported_fields("lc_embedding") == []
    migrate(lc, "lc_embedding", "lc_e5", m, batch_size=64)
    b = lc.fetch("lc_e5", ["lc-3", "lc-150"], with_fields=True)
    assert b.texts == ["doc 3", "doc 150"] and b.fields["cmetadata"] == [{"page": 3}, {"page": 150}]
    assert b.fields["collection_id"] == [coll, coll]
    np.testing.assert_allclose(b.vectors, m.apply(X[[3, 150]], output="raw"), rtol=1e-5, atol=1e-6)
    assert lc.dim("lc_e5") == m.target_dim and check_rows(lc, "lc_embedding", "lc_e5", m)["rows_ok"]
    lc.conn.execute("INSERT INTO lc_embedding (id, embedding) VALUES ('short', '[1,2,3]')")  # mixed sizes
    with pytest.raises(VectorDBError, match=r"1 stored vector\(s\) are not 24-d.*'short'.*3-d"):
        migrate(lc, "lc_embedding", "lc_e5", m, batch_size=64, overwrite=True)
    lc.close()


def test_a_half_precision_table_stays_half_precision(store):
    X, m = small_migration()
    store.conn.execute(f"CREATE TABLE h_src (id bigint PRIMARY KEY, embedding halfvec({X.shape[1]}), text text)")
    store.upsert("h_src", np.arange(len(X)), X)
    np.testing.assert_allclose(store.fetch("h_src", [5]).vectors, X[5:6].astype(np.float16), rtol=0)
    store.index = "hnsw"
    migrate(store, "h_src", "h_dst", m, batch_size=64)
    assert _id_type(store, "h_dst") == "bigint"
    vec = store.conn.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                             "'h_dst'::regclass AND attname = 'embedding'").fetchone()[0]
    idx = store.conn.execute("SELECT indexdef FROM pg_indexes WHERE tablename = 'h_dst' AND indexdef LIKE '%hnsw%'"
                             ).fetchone()[0]
    assert vec == f"halfvec({m.target_dim})" and "halfvec_cosine_ops" in idx
    Y = m.apply(store.fetch("h_src", np.arange(len(X))).vectors, output="raw")  # from the stored half precision
    np.testing.assert_allclose(store.fetch("h_dst", np.arange(len(X))).vectors, Y, rtol=2e-3, atol=2e-3)
    assert check_rows(store, "h_src", "h_dst", m)["rows_ok"]  # within the check's 1e-3 relative error
    _, I = store.search("h_dst", Y[:10], k=1)
    assert I[:, 0].tolist() == list(range(10))
    with pytest.raises(InputError, match=r"half-precision vectors.*1 row\(s\) exceed it \(first id 3\)"):
        store.upsert("h_dst", [2, 3], np.vstack([Y[:1], Y[:1] * 1e7]))
    assert store.count("h_dst") == len(X)


def _vector_indexes(store, table: str) -> list[str]:
    return [r[0] for r in store.conn.execute("SELECT indexdef FROM pg_indexes WHERE tablename = %s AND "
                                             "(indexdef LIKE '%%hnsw%%' OR indexdef LIKE '%%ivfflat%%')", (table,))]


_HNSW = ("hnsw", {"m": 16, "ef_construction": 64})  # pgvector's defaults, and the store's


@pytest.mark.parametrize("source_index, on_source, built, said", [
    ("USING hnsw (embedding vector_cosine_ops) WITH (m = 24, ef_construction = 80)",
     ("hnsw", {"m": 24, "ef_construction": 80}), ("hnsw", {"m": 24, "ef_construction": 80}),
     "hnsw m=24 ef_construction=80"),
    ("USING ivfflat (embedding vector_cosine_ops) WITH (lists = 7)", ("ivfflat", {"lists": 7}),
     ("ivfflat", {"lists": 7}), "ivfflat lists=7"),
    ("USING hnsw (embedding vector_cosine_ops)", _HNSW, _HNSW, "hnsw m=16 ef_construction=64"),
    (None, None, None, "none (exact scan)"),  # an exact-scan table
    # a halfvec copy of the column: the expression names the old dimension, so a plain HNSW instead
    ("USING hnsw ((embedding::halfvec(24)) halfvec_cosine_ops) WITH (m = 8)", None, _HNSW,
     "hnsw m=16 ef_construction=64 (the source indexes an expression of its vectors; a plain index instead)"),
])
def test_a_migration_target_gets_the_source_tables_index(store, pg_url, tmp_path,  # noqa: F811
                                                        source_index, on_source, built, said):
    """The target of a migration was always indexed HNSW m 16 / ef_construction 64 (or as ``--index`` said): a
    table tuned for recall (m 24) or built IVFFlat, or left for exact search, came out otherwise, silently. Now
    the CLI / HTTP default (``index`` not given: ``like``) copies the source's method and options; an explicit
    ``--index`` still wins, and the source may be an alias (its table's index)."""
    from service.ops.vectordb import run_migration

    X, m = small_migration()
    _user_table(store, "s_src", "bigint", X, np.arange(len(X)))
    if source_index is not None:
        store.conn.execute(f"CREATE INDEX s_src_vec ON s_src {source_index}")
    assert store.vector_index("s_src") == on_source
    store.set_alias("s_live", "s_src")
    try:
        rep = run_migration(store_url=pg_url, source="s_live", target="s_dst", map_ref=m,
                            checkpoint=tmp_path / "c.json", batch_size=64)
        assert rep.rows == len(X)
        assert store.vector_index("s_dst") == built
        assert rep.extra["target_index"] == said  # what the dry run and the report say
        got = _vector_indexes(store, "s_dst")
        assert len(got) == (built is not None) and all("vector_cosine_ops" in g for g in got), got
        _, I = store.search("s_dst", m.apply(X[:5], output="raw"), k=1)
        assert I[:, 0].tolist() == list(range(5))
        store.drop("s_dst")
        run_migration(store_url=pg_url, source="s_live", target="s_dst", map_ref=m, checkpoint=tmp_path / "d.json",
                      batch_size=64, index="hnsw")  # told: built as told, whatever the source has
        assert store.vector_index("s_dst") == ("hnsw", {"m": 16, "ef_construction": 64})
    finally:
        store.conn.execute("DROP VIEW IF EXISTS s_live")
        store.conn.execute("DELETE FROM vecbridge_aliases WHERE alias = 's_live'")


def test_a_mixed_case_table_is_itself_not_its_lower_case_twin(store):
    """``"Docs"`` (quoted, as ORMs make tables) was read as ``docs`` by ``%s::regclass``: "relation docs does not
    exist", or, beside a ``docs`` table, that table's columns (the target got them) and dimension."""
    X, m = small_migration()
    try:
        store.conn.execute('CREATE TABLE "Docs" (id bigint PRIMARY KEY, embedding vector(24), text text, title text)')
        store.conn.execute("CREATE TABLE docs (id bigint PRIMARY KEY, embedding vector(16), body text)")
        store.upsert("Docs", np.arange(10), X[:10], [f"t{i}" for i in range(10)],
                     {"title": [f"T{i}" for i in range(10)]})
        assert store.dim("Docs") == 24 and store.dim("docs") == 16
        store.set_space("Docs", "spa")
        assert store.get_space("Docs") == "spa" and store.get_space("docs") is None
        rep = migrate(store, "Docs", "Docs_e5", m, batch_size=4)
        assert rep.rows == 10 and rep.extra["fields"] == ["text", "title"]
        assert check_rows(store, "Docs", "Docs_e5", m)["rows_ok"]
        assert store.fetch("Docs_e5", [3], with_fields=True).fields == {"title": ["T3"]}
    finally:
        for t in ("Docs", "docs", "Docs_e5"):
            store.drop(t)


def test_json_values_travel_exactly_and_a_json_null_is_not_sql_null(store):
    """A ``jsonb`` / ``json`` JSON ``null`` arrived as SQL NULL, and a ``json`` text lost its repeated keys (parsed
    into a dict and dumped again); both are written back as the text they are now."""
    from psycopg.types.json import Json, Jsonb

    X, m = small_migration()
    store.conn.execute("CREATE TABLE t_src (id bigint PRIMARY KEY, embedding vector(24), j jsonb, js json, ja jsonb[])")
    vals = [(Jsonb({"a": [1, None, "✓"]}), '{"x": 1,  "x": 2}', [Jsonb({"k": 1}), Jsonb(None)]),
            (Jsonb(None), Json(None), None), (None, None, [None]), (Jsonb("s"), Json(3.5), [])]
    for i, v in enumerate(vals):
        store.conn.execute("INSERT INTO t_src VALUES (%s, %s, %s, %s, %s)", (i, X[i], *v))
    migrate(store, "t_src", "t_dst", m, batch_size=3)
    q = "SELECT id, j::text, js::text, ja::text, j IS NULL, js IS NULL FROM {} ORDER BY id"
    assert store.conn.execute(q.format("t_dst")).fetchall() == store.conn.execute(q.format("t_src")).fetchall()
    store.upsert("t_dst", [9], X[:1, :16], None, {"j": [{"u": "ü"}], "js": ["plain"]})  # Python values: as JSON
    assert store.conn.execute("SELECT j::text, js::text FROM t_dst WHERE id = 9").fetchone() == ('{"u": "ü"}',
                                                                                               '"plain"')


def test_a_read_only_role_can_dry_run_verify_and_search(store, pg_url):  # noqa: F811
    """Opening a store ran ``CREATE EXTENSION`` / ``CREATE TABLE IF NOT EXISTS vecbridge_aliases``, which check the
    privilege first: a role with SELECT only (or a standby) could not dry-run, verify or search at all."""
    X, m = small_migration()
    store.create("s_src", 24)
    store.upsert("s_src", np.arange(20), X[:20], [f"t{i}" for i in range(20)])
    migrate(store, "s_src", "s_dst", m, batch_size=8)
    store.conn.execute("CREATE ROLE vb_reader LOGIN")
    try:
        store.conn.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO vb_reader")
        ro = open_store(pg_url.replace("postgres:@", "vb_reader:@", 1) if "postgres:@" in pg_url
                        else pg_url.replace("postgres@", "vb_reader@", 1))
        try:
            rep = migrate(ro, "s_src", "t_dst", m, dry_run=True)
            assert rep.extra["dry_run"] and rep.extra["rows_to_write"] == 20
            assert check_rows(ro, "s_src", "s_dst", m)["rows_ok"]
            assert ro.search("s_dst", m.apply(X[:2], output="raw"), 1)[1][:, 0].tolist() == [0, 1]
        finally:
            ro.close()
    finally:
        store.conn.execute("DROP OWNED BY vb_reader")
        store.conn.execute("DROP ROLE vb_reader")


@pytest.mark.parametrize("value", ["infinity", "-infinity", "12000-01-01"])
@pytest.mark.parametrize("typ", ["date", "timestamp", "timestamptz"])
def test_a_date_python_cannot_hold_is_refused_by_column_before_anything_is_written(store, typ, value):
    """A ``valid_until timestamptz`` of 'infinity' stopped the scan with a raw psycopg DataError ("timestamp too large
    (after year 10K)") naming neither row nor column, after the target was created: refused at the plan instead."""
    X, m = small_migration()
    store.conn.execute(f"CREATE TABLE d_src (id bigint PRIMARY KEY, embedding vector(24), text text, until {typ})")
    store.upsert("d_src", np.arange(5), X[:5], None)
    store.conn.execute("UPDATE d_src SET until = '2030-01-01' WHERE id < 4")
    store.conn.execute(f"UPDATE d_src SET until = '{value}' WHERE id = 4")
    with pytest.raises(UnsupportedFieldError, match="until .holds 'infinity'"):
        migrate(store, "d_src", "d_dst", m, batch_size=2)
    assert not store.exists("d_dst")
    store.conn.execute("UPDATE d_src SET until = NULL WHERE id = 4")  # ordinary dates and NULLs travel
    migrate(store, "d_src", "d_dst", m, batch_size=2)
    q = "SELECT id, until FROM {} ORDER BY id"
    assert store.conn.execute(q.format("d_dst")).fetchall() == store.conn.execute(q.format("d_src")).fetchall()


def test_the_target_keeps_the_sources_column_rules_constraints_and_indexes(store, tmp_path):
    """The target got column names and types only: a btree on a filter column, a GIN on a jsonb field, NOT NULL,
    DEFAULT, UNIQUE and CHECK were gone after the alias switch (filtered queries became scans, inserts relying on a
    default got NULL), without a word. Now they travel, under the target's names; a rerun adds nothing twice."""
    X, m = small_migration()
    n = 50
    store.conn.execute(f"CREATE TABLE d_src (id bigint PRIMARY KEY, embedding vector({X.shape[1]}), text text, "
                       "tag text NOT NULL, score real DEFAULT 0, meta jsonb, code text, CONSTRAINT d_src_code_key "
                       "UNIQUE (code), CONSTRAINT score_ok CHECK (score >= 0), CONSTRAINT dims CHECK "
                       f"(vector_dims(embedding) = {X.shape[1]}))")  # the last: of the old vectors, not copied
    store.conn.execute("CREATE INDEX d_src_tag_idx ON d_src (tag)")
    store.conn.execute("CREATE INDEX meta_gin ON d_src USING gin (meta)")
    store.conn.execute("CREATE INDEX d_src_low ON d_src (lower(tag)) WHERE score > 0.5")
    store.upsert("d_src", np.arange(n), X[:n], [f"t{i}" for i in range(n)],
                 {"tag": [f"g{i % 3}" for i in range(n)], "score": [float(i) / n for i in range(n)],
                  "meta": [{"k": i} for i in range(n)], "code": [f"c{i}" for i in range(n)]})
    rep = migrate(store, "d_src", "d_dst", m, batch_size=16)
    assert rep.rows == n

    def indexes(t):
        return dict(store.conn.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s", (t,)))

    got = indexes("d_dst")
    assert {"d_dst_tag_idx", "d_dst_meta_gin", "d_dst_low", "d_dst_code_key", "d_dst_pkey"} <= set(got), got
    assert "USING gin (meta)" in got["d_dst_meta_gin"] and "WHERE (score > (0.5)::double precision)" in got[
        "d_dst_low"]
    cols = dict(store.conn.execute("SELECT column_name, is_nullable || ' ' || coalesce(column_default, '-') FROM "
                                   "information_schema.columns WHERE table_name = 'd_dst'"))
    assert cols["tag"] == "NO -" and cols["score"].startswith("YES 0"), cols
    cons = {r[0] for r in store.conn.execute("SELECT conname FROM pg_constraint WHERE conrelid = 'd_dst'::regclass")}
    assert {"d_dst_code_key", "d_dst_score_ok"} <= cons and "d_dst_dims" not in cons, cons
    with pytest.raises(Exception, match="check constraint|violates"):
        store.conn.execute("INSERT INTO d_dst (id, embedding, tag, score) VALUES (999, %s, 'x', -1)",
                           ("[" + ",".join(["0"] * m.target_dim) + "]",))
    store.finalize("d_dst", like="d_src")  # a rerun of the last step (a crash inside finalize): nothing twice
    assert indexes("d_dst") == got


def test_a_text_file_of_keep_ids_matches_text_ids_as_written(store, tmp_path):
    """Lines of digits were read as integers: "007" became "7", "+5" became "5", and those rows of a text-keyed
    table were written mapped, counted as "not in the source"."""
    from service.vectordb.keep import read_keep_ids

    X, m = small_migration()
    ids = ["007", "+5", "10"] + [f"d{i}" for i in range(len(X) - 3)]
    _user_table(store, "t_src", "text", X, ids)
    (tmp_path / "ids.txt").write_text("007\n+5\n10\n")
    Y = np.eye(3, m.target_dim, dtype=np.float32)
    rep = migrate(store, "t_src", "t_dst", m, batch_size=37, keep_ids=read_keep_ids(tmp_path / "ids.txt"),
                  keep_vectors=Y)
    assert rep.kept == 3 and rep.keep_not_found == 0
    np.testing.assert_allclose(store.fetch("t_dst", ["007", "+5", "10"]).vectors, Y, atol=1e-6)


def test_a_text_or_vector_column_the_table_lacks_is_refused_naming_the_option(store, pg_url, tmp_path):  # noqa: F811
    """``--text-field body`` on a table whose texts are in ``text`` migrated every row (exit 0) with the option
    ignored: no column ``body``, so the run read no texts and carried ``text`` as an ordinary column. A text, vector
    or id column the source lacks is refused before anything is written, naming the option and the columns there
    are (the check an HTTP request gets before its job exists)."""
    from service.ops.vectordb import run_migration

    X, m = small_migration()
    m.save(tmp_path / "m.npz")
    _user_table(store, "t_src", "bigint", X, np.arange(len(X)))
    for opts, words in (({"text_field": "body"}, "has no text field 'body'; it has columns id, embedding, text, title: "
                                                 "fix --text-field"),
                        ({"vector_field": "vec"}, "has no vector field 'vec'"),
                        ({"id_field": "pk"}, "has no id field 'pk'")):
        with pytest.raises(InputError, match=words):
            run_migration(store_url=pg_url, source="t_src", target="t_dst", map_ref=str(tmp_path / "m.npz"),
                          checkpoint=tmp_path / "c.json", **opts)
        assert not store.exists("t_dst") and not (tmp_path / "c.json").exists()


def test_an_empty_table_with_an_unsized_vector_column_is_a_422_naming_vector_field(
        store, pg_url, tmp_path):  # noqa: F811
    """Review: an empty LangChain-shaped source (``embedding vector``, no size, no rows: its width cannot be told)
    made ``POST /v1/migrations`` answer 503 without ``Retry-After`` ("a database fault") in the CLI's words, "name it
    with --vector-field". It is the request's to fix: a 422 naming ``vector_field`` (the CLI: exit 2, --vector-field),
    no job queued."""
    from _api_support import W, settings_for
    from _servers import seed_registry
    from fastapi.testclient import TestClient

    from service.api import create_app
    from service.ops.vectordb import run_migration

    seed_registry(tmp_path / "data")
    store.conn.execute("CREATE TABLE lc_empty (id bigint PRIMARY KEY, embedding vector, text text)")
    with TestClient(create_app(settings_for(tmp_path, vectordb_url=pg_url))) as c:
        r = c.post("/v1/migrations", json={"map": "a2b", "source": "lc_empty", "target": "lc_new",
                                           "source_space": "a"}, headers=W)
        msg = r.json()["error"]["message"]
        assert r.status_code == 422 and r.json()["error"]["type"] == "UnsupportedFieldError", r.text
        assert "'lc_empty' has no rows, and its vector column 'embedding' is declared without a size" in msg, msg
        assert "vector_field" in msg and "--vector-field" not in msg, msg
        assert c.get("/v1/jobs", headers=W).json()["data"] == []
    X, m = small_migration()
    m.save(tmp_path / "m.npz")
    with pytest.raises(UnsupportedFieldError, match="declared without a size.*--vector-field"):
        run_migration(store_url=pg_url, source="lc_empty", target="lc_new", map_ref=str(tmp_path / "m.npz"),
                      checkpoint=tmp_path / "c.json")


def test_get_collection_of_an_empty_unsized_table_answers_its_width_null(store, pg_url, tmp_path):  # noqa: F811
    """Review: ``GET /v1/collections/{name}`` of an empty table whose vector column has no size answered 422 in the
    CLI's words ("name a sized vector column with --vector-field"), a field that GET has not; and its answer's
    ``dim`` could not be null. It answers 200: ``dim`` null and a note why; the width once it holds a row."""
    from _api_support import W, settings_for
    from fastapi.testclient import TestClient

    from service.api import create_app

    store.conn.execute("CREATE TABLE lc_void (id bigint PRIMARY KEY, embedding vector, text text)")
    with TestClient(create_app(settings_for(tmp_path, vectordb_url=pg_url))) as c:
        r = c.get("/v1/collections/lc_void", headers=W)
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["dim"] is None and got["count"] == 0, got
        assert "has no rows and its vector field 'embedding' declares no width" in got["note"], got
        assert "--vector-field" not in r.text
        store.conn.execute("INSERT INTO lc_void VALUES (1, '[1,2,3]', 'a')")
        got = c.get("/v1/collections/lc_void", headers=W).json()
        assert got["dim"] == 3 and got["count"] == 1 and got.get("note") is None, got
