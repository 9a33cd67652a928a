"""The pgvector target's vector index as ``finalize`` builds it: beside another session's build of the same index.

QA: ``kill -9`` of ``vecbridge migrate`` during the HNSW build, then the same command at once: ``internal error:
UniqueViolation ... pg_class_relname_nsp_index`` (exit 3). The dead client's CREATE INDEX runs on in its server
backend; the rerun's CREATE INDEX IF NOT EXISTS did not see the uncommitted index, waited for it on the catalog's
unique name, then collided once it committed. Here the dead run's build is an open transaction of another connection.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from _vectordb_servers import pg_url  # noqa: F401  (module-scoped fixture)

from service.vectordb import open_store

psycopg = pytest.importorskip("psycopg")
pytest.importorskip("pgvector")


@pytest.fixture
def pg(pg_url):  # noqa: F811
    s = open_store(pg_url, index="hnsw")
    for n in ("ib_src", "ib_dst"):
        s.drop(n)
    yield s
    for n in ("ib_src", "ib_dst"):
        s.drop(n)
    s.close()


def _waiting(conn, pid: int) -> bool:
    return conn.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0]


def test_a_build_of_the_same_index_left_running_by_a_killed_run_is_waited_for_not_an_internal_error(
        pg, pg_url):  # noqa: F811
    X = np.random.default_rng(0).standard_normal((200, 8)).astype(np.float32)
    pg.create("ib_dst", 8)
    pg.upsert("ib_dst", np.arange(len(X)), X)
    pid = pg.conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    with psycopg.connect(pg_url, autocommit=True) as dead, psycopg.connect(pg_url, autocommit=True) as watch:
        dead.execute("BEGIN")
        dead.execute('CREATE INDEX "ib_dst_hnsw" ON "ib_dst" USING hnsw ("embedding" vector_cosine_ops) '
                     "WITH (m = 16, ef_construction = 64)")
        errors: list[BaseException] = []

        def run():
            try:
                pg.finalize("ib_dst")
            except BaseException as e:  # noqa: BLE001 - the test reads it
                errors.append(e)
        t = threading.Thread(target=run)
        t.start()
        for _ in range(2000):  # the rerun's CREATE INDEX waits on the other build's name (no sleep-based timing)
            if _waiting(watch, pid) or not t.is_alive():
                break
            t.join(0.01)
        dead.execute("COMMIT")
        t.join(60)
    assert not t.is_alive() and not errors, errors
    assert pg.vector_index("ib_dst") == ("hnsw", {"m": 16, "ef_construction": 64})
    _, ids = pg.search("ib_dst", X[:3], k=1)
    assert ids[:, 0].tolist() == [0, 1, 2]


def _opclasses(store, table: str) -> list[str]:
    """The operator class of each HNSW / IVFFlat index of ``table`` (pg_indexes' indexdef leaves a default one out)."""
    return [r[0] for r in store.conn.execute(
        "SELECT opc.opcname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am am ON am.oid = c.relam "
        "JOIN pg_opclass opc ON opc.oid = i.indclass[0] WHERE i.indrelid = %s::regclass "
        "AND am.amname IN ('hnsw', 'ivfflat')", (table,))]


@pytest.mark.parametrize("index_sql, metric, target_metric, kept, spec", [
    ("USING hnsw (embedding vector_ip_ops) WITH (m = 24)", "ip", "ip", "vector_ip_ops",
     ("hnsw", {"m": 24, "ef_construction": 64})),
    ("USING ivfflat (embedding vector_l2_ops) WITH (lists = 7)", "l2", "cosine", "vector_l2_ops",
     ("ivfflat", {"lists": 7})),
])
def test_a_user_tables_inner_product_or_l2_index_keeps_its_metric_and_operator_class(
        pg, pg_url, tmp_path, index_sql, metric, target_metric, kept, spec):  # noqa: F811
    """QA: a table made by hand (no vecbridge comment) indexed ``vector_ip_ops`` or ``vector_l2_ops`` was read as
    cosine (the metric came from the comment only) and its target got a cosine index: the source's ``<#>`` /
    ``<->`` queries lost their index after the alias switch, and an inner-product source an inner-product target.
    The index's operator class tells the metric; the target keeps it (an L2 source: a cosine target, as README
    says, whose index is still L2: on the unit rows a map writes, L2 ranks as cosine)."""
    from _vectordb_servers import small_migration

    from service.ops.vectordb import run_migration

    X, m = small_migration()
    pg.conn.execute(f"CREATE TABLE ib_src (id bigint PRIMARY KEY, embedding vector({X.shape[1]}), text text)")
    pg.upsert("ib_src", np.arange(len(X)), X, [f"t{i}" for i in range(len(X))])
    pg.conn.execute(f"CREATE INDEX ib_src_vec ON ib_src {index_sql}")
    assert pg.metric("ib_src") == metric
    _, ids = pg.search("ib_src", X[:3], k=1)  # searched by the distance its index serves
    assert ids[:, 0].tolist() == [0, 1, 2]
    rep = run_migration(store_url=pg_url, source="ib_src", target="ib_dst", map_ref=m,
                        checkpoint=tmp_path / "c.json", batch_size=64)
    assert rep.rows == len(X) and rep.extra["metric"] == target_metric and pg.metric("ib_dst") == target_metric
    assert pg.vector_index("ib_dst") == spec
    assert _opclasses(pg, "ib_dst") == [kept]
    assert any("norms" in w for w in rep.extra["warnings"]), rep.extra["warnings"]
    _, ids = pg.search("ib_dst", m.apply(X[:5], output="raw"), k=1)
    assert ids[:, 0].tolist() == list(range(5))


def test_the_index_build_is_a_stage_of_its_own_in_the_progress(pg):
    """QA: no progress during the pgvector index build: the bar sat at 100 % and a job's stage ``migrate`` at
    fraction 1.0 for ~12 s at 20,000 rows. A report of stage ``index`` now comes once every row is written, before
    the build begins."""
    from _vectordb_servers import small_migration

    from service.vectordb import migrate

    X, m = small_migration()
    pg.create("ib_src", X.shape[1])
    pg.upsert("ib_src", np.arange(len(X)), X)
    seen = []

    def progress(p):
        seen.append((p.stage, p.done, pg.vector_index("ib_dst")))

    migrate(pg, "ib_src", "ib_dst", m, batch_size=64, progress=progress)
    assert [s for s, _, _ in seen] == ["migrate"] * 4 + ["index"], seen
    assert seen[-1][1:] == (len(X), None), seen  # every row written, no index yet
    assert pg.vector_index("ib_dst") is not None


@pytest.mark.parametrize("index_sql, target_metric", [
    ("USING hnsw (embedding vector_l2_ops)", "cosine"),
    ("USING ivfflat (embedding vector_l2_ops) WITH (lists = 7)", "cosine"),
    ("USING hnsw (embedding vector_cosine_ops)", "cosine"),
    ("USING hnsw (embedding vector_ip_ops)", "ip"),
])
def test_a_migrated_target_is_searched_through_its_vector_index_whatever_its_operator_class(
        pg, pg_url, tmp_path, index_sql, target_metric):  # noqa: F811
    """QA: an L2-indexed source (``vector_l2_ops``) makes a cosine target that keeps its L2 index (its users' ``<->``
    queries keep it after the alias switch), but vecbridge's own search of that target (``verify``, the service's
    collection search) ordered by ``<=>``, which an L2 index cannot serve: every row scanned. The search orders by
    the operator the index serves now; on the unit rows a map writes that ranks as cosine does, and the scores are
    still the metric's (cosines of a cosine target)."""
    from _vectordb_servers import small_migration

    from service.ops.vectordb import run_migration

    X, m = small_migration()
    pg.conn.execute(f"CREATE TABLE ib_src (id bigint PRIMARY KEY, embedding vector({X.shape[1]}), text text)")
    pg.upsert("ib_src", np.arange(len(X)), X)
    pg.conn.execute(f"CREATE INDEX ib_src_vec ON ib_src {index_sql}")
    run_migration(store_url=pg_url, source="ib_src", target="ib_dst", map_ref=m, checkpoint=tmp_path / "c.json",
                  batch_size=64)
    assert pg.metric("ib_dst") == target_metric
    Y = m.apply(X[:5], output="raw")
    pg.conn.execute("SET enable_seqscan = off")  # 200 rows: the planner would rather scan, where it can
    method = index_sql.split()[1]
    plan = pg.search_plan("ib_dst", Y[0], k=3)
    assert any(f"Index Scan using ib_dst_{method} on ib_dst" in line for line in plan), plan
    S, ids = pg.search("ib_dst", Y, k=3)
    assert ids[:, 0].tolist() == list(range(5))
    V = pg.fetch("ib_dst", ids.ravel()).vectors.reshape(5, 3, -1)
    want = np.einsum("qd,qkd->qk", Y, V)  # the target's rows are unit: an inner product
    if target_metric == "cosine":
        want = want / np.linalg.norm(Y, axis=1, keepdims=True)
    np.testing.assert_allclose(S, want, rtol=1e-4, atol=1e-4)
    assert (np.diff(S, axis=1) <= 1e-5).all(), S  # best first
