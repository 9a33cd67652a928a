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


def _wait_until_waiting(watch, pid: int, thread: threading.Thread) -> None:
    """Until session ``pid`` waits on a lock (as ``watch`` sees it) or ``thread`` ends (no sleep-based timing)."""
    for _ in range(2000):
        if _waiting(watch, pid) or not thread.is_alive():
            break
        thread.join(0.01)


def _filled_target(pg, n: int = 200):
    """``ib_dst`` (8-d) holding ``n`` random rows, no index yet; the rows."""
    X = np.random.default_rng(0).standard_normal((n, 8)).astype(np.float32)
    pg.create("ib_dst", 8)
    pg.upsert("ib_dst", np.arange(len(X)), X)
    return X


def _left_building(dead) -> None:
    """``dead`` (an autocommit connection) builds ib_dst's index, uncommitted: a killed run's build left open."""
    dead.execute("BEGIN")
    dead.execute('CREATE INDEX "ib_dst_hnsw" ON "ib_dst" USING hnsw ("embedding" vector_cosine_ops) '
                 "WITH (m = 16, ef_construction = 64)")


def _finalize_in_thread(store) -> tuple[threading.Thread, list]:
    """``store.finalize("ib_dst")`` started in a daemon thread; the thread and the list its exception goes to."""
    errors: list[BaseException] = []

    def finalize():
        try:
            store.finalize("ib_dst")
        except BaseException as e:  # noqa: BLE001 - the test reads it
            errors.append(e)
    t = threading.Thread(target=finalize, daemon=True)
    t.start()
    return t, errors


def test_a_build_of_the_same_index_left_running_by_a_killed_run_is_waited_for_not_an_internal_error(
        pg, pg_url):  # noqa: F811
    X = _filled_target(pg)
    pid = pg.conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    with psycopg.connect(pg_url, autocommit=True) as dead, psycopg.connect(pg_url, autocommit=True) as watch:
        _left_building(dead)
        t, errors = _finalize_in_thread(pg)
        _wait_until_waiting(watch, pid, t)  # the rerun's CREATE INDEX waits on the other build's name
        dead.execute("COMMIT")
        t.join(60)
    assert not t.is_alive() and not errors, errors
    assert pg.vector_index("ib_dst") == ("hnsw", {"m": 16, "ef_construction": 64})
    _, ids = pg.search("ib_dst", X[:3], k=1)
    assert ids[:, 0].tolist() == [0, 1, 2]


def test_the_retry_after_the_other_build_commits_waits_for_the_table_as_boundedly(pg, pg_url):  # noqa: F811
    """Review: once the other session's build of the same index committed (our build: UniqueViolation on its name),
    the retried ``CREATE INDEX IF NOT EXISTS`` ran without the bounded wait: a writer that took the table as that
    build ended held the retry up as long as its transaction lasted. The retry waits ``index_wait_s`` as the first
    try does, then IndexBuildBusyError naming the writer."""
    from service.vectordb.pg_index import IndexBuildBusyError

    _filled_target(pg)
    pg.index_wait_s = 3.0
    pid = pg.conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    with psycopg.connect(pg_url, autocommit=True) as dead, psycopg.connect(pg_url, autocommit=True) as watch, \
            psycopg.connect(pg_url) as writer:
        _left_building(dead)

        def write():  # queued behind both builds' ShareLock; granted once ours rolls back, before its retry
            writer.execute("LOCK TABLE ib_dst IN ROW EXCLUSIVE MODE")

        t, errors = _finalize_in_thread(pg)
        _wait_until_waiting(watch, pid, t)  # our build waits on the other build's name
        w = threading.Thread(target=write)
        w.start()
        wpid = writer.info.backend_pid
        _wait_until_waiting(watch, wpid, w)  # the writer waits for the table
        dead.execute("COMMIT")
        t.join(30)  # (the old retry: held until the writer's transaction ends, below, then built nothing new)
        w.join(60)
        writer.rollback()
        t.join(60)
    assert len(errors) == 1 and isinstance(errors[0], IndexBuildBusyError), errors
    assert f"pid {wpid}" in str(errors[0]), errors[0]


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


def _migrated_from_a_user_table(pg, pg_url, tmp_path, index_sql: str):
    """``ib_src`` made by hand (no vecbridge comment) holding :func:`small_migration`'s rows, indexed ``index_sql``,
    migrated into ``ib_dst`` through its map; ``(X, m)``."""
    from _vectordb_servers import small_migration

    from service.ops.vectordb import run_migration

    X, m = small_migration()
    pg.conn.execute(f"CREATE TABLE ib_src (id bigint PRIMARY KEY, embedding vector({X.shape[1]}), text text)")
    pg.upsert("ib_src", np.arange(len(X)), X)
    pg.conn.execute(f"CREATE INDEX ib_src_vec ON ib_src {index_sql}")
    run_migration(store_url=pg_url, source="ib_src", target="ib_dst", map_ref=m, checkpoint=tmp_path / "c.json",
                  batch_size=64)
    return X, m


@pytest.mark.parametrize("index_sql, target_metric", [
    ("USING hnsw (embedding vector_cosine_ops)", "cosine"),
    ("USING hnsw (embedding vector_ip_ops)", "ip"),
])
def test_a_migrated_target_is_searched_through_a_vector_index_of_its_metric(
        pg, pg_url, tmp_path, index_sql, target_metric):  # noqa: F811
    """A target that keeps its source's cosine / inner-product index is searched through it (``Index Scan``), scored
    by its metric (cosines of a cosine target), best first."""
    X, m = _migrated_from_a_user_table(pg, pg_url, tmp_path, index_sql)
    assert pg.metric("ib_dst") == target_metric
    Y = m.apply(X[:5], output="raw")
    pg.conn.execute("SET enable_seqscan = off")  # 200 rows: the planner would rather scan, where it can
    plan = pg.search_plan("ib_dst", Y[0], k=3)
    assert any("Index Scan using ib_dst_hnsw on ib_dst" in line for line in plan), plan
    S, ids = pg.search("ib_dst", Y, k=3)
    assert ids[:, 0].tolist() == list(range(5))
    V = pg.fetch("ib_dst", ids.ravel()).vectors.reshape(5, 3, -1)
    want = np.einsum("qd,qkd->qk", Y, V)  # the target's rows are unit: an inner product
    if target_metric == "cosine":
        want = want / np.linalg.norm(Y, axis=1, keepdims=True)
    np.testing.assert_allclose(S, want, rtol=1e-4, atol=1e-4)
    assert (np.diff(S, axis=1) <= 1e-5).all(), S  # best first


def _cosine_top(X, Q, k):
    S = (Q / np.linalg.norm(Q, axis=1, keepdims=True)) @ (X / np.linalg.norm(X, axis=1, keepdims=True)).T
    return np.argsort(-S, axis=1, kind="stable")[:, :k], -np.sort(-S, axis=1)[:, :k]


@pytest.mark.parametrize("index_sql", ["USING hnsw (embedding vector_l2_ops)",
                                       "USING ivfflat (embedding vector_l2_ops) WITH (lists = 7)"])
def test_a_cosine_target_that_kept_an_l2_index_ranks_by_cosine_a_row_written_later_of_another_norm(
        pg, pg_url, tmp_path, index_sql):  # noqa: F811
    """Review: an L2-indexed source makes a cosine target that keeps its L2 index, and vecbridge's search of it
    ordered by ``<->`` (the index's operator: cosine's order on unit rows). A row the application writes after the
    switch, ``3 * q`` (its model's raw output), is at L2 distance 2 from ``q``, as far as any row can be: a search
    for ``q`` missed it though its cosine is 1. The search orders by ``<=>`` (every row read: an L2 index cannot
    serve it) and its results are the exact cosine ranking."""
    X, m = _migrated_from_a_user_table(pg, pg_url, tmp_path, index_sql)
    assert pg.metric("ib_dst") == "cosine" and _opclasses(pg, "ib_dst") == ["vector_l2_ops"]
    Y = m.apply(X[:5], output="raw")
    q = Y[0] / np.linalg.norm(Y[0])
    pg.upsert("ib_dst", np.array([10_000]), (3 * q)[None])
    pg.conn.execute("SET enable_seqscan = off")
    S, ids = pg.search("ib_dst", q[None], k=5)
    assert set(ids[0, :2].tolist()) == {0, 10_000}, (ids, S)  # q's own row and 3 * q: cosine 1 both
    np.testing.assert_allclose(S[0, :2], 1.0, atol=1e-4)
    rows = pg.fetch("ib_dst", pg.ids("ib_dst"))
    want, wS = _cosine_top(rows.vectors, Y, 5)
    S, ids = pg.search("ib_dst", Y, k=5)
    assert ids[1:].tolist() == rows.ids[want[1:]].tolist()  # (the first query's top two tie)
    np.testing.assert_allclose(S, wS, atol=1e-4)
    plan = pg.search_plan("ib_dst", q, k=5)
    assert not any("Index Scan" in line for line in plan), plan  # the L2 index cannot serve a cosine order


def test_a_cosine_table_of_rows_of_any_norm_is_searched_through_its_cosine_index_not_an_l2_one_named_first(pg):
    """Review: a user's cosine table (rows of norms 0.1 to 10) indexed ``vector_l2_ops`` was searched by ``<->``:
    no top-5 of 20 queries was the cosine one; with a cosine index beside it, the first index by name (the L2 one)
    still chose the operator. The search orders by ``<=>`` and PostgreSQL walks the cosine index."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((300, 8)).astype("f4") * rng.uniform(0.1, 10, (300, 1)).astype("f4")
    Q = rng.standard_normal((20, 8)).astype("f4")
    pg.create("ib_dst", 8, metric="cosine")
    pg.upsert("ib_dst", np.arange(len(X)), X)
    pg.conn.execute("CREATE INDEX ib_dst_a_l2 ON ib_dst USING hnsw (embedding vector_l2_ops)")
    pg.conn.execute("CREATE INDEX ib_dst_cos ON ib_dst USING hnsw (embedding vector_cosine_ops)")
    pg.conn.execute("SET enable_seqscan = off")
    pg.conn.execute("SET hnsw.ef_search = 300")  # 300 rows: the walk finds every one, so the order is exact
    plan = pg.search_plan("ib_dst", Q[0], k=5)
    assert any("Index Scan using ib_dst_cos on ib_dst" in line for line in plan), plan
    want, wS = _cosine_top(X, Q, 5)
    S, ids = pg.search("ib_dst", Q, k=5)
    assert ids.tolist() == want.tolist()
    np.testing.assert_allclose(S, wS, atol=1e-4)


def _gated_build(conn, gate, table: str, name: str) -> threading.Thread:
    """A CREATE INDEX ``name`` on ``table`` running in ``conn`` (in a thread) until ``gate`` releases advisory lock
    4242: a build as a killed run leaves it running on the server (its row in pg_stat_progress_create_index)."""
    conn.execute("CREATE OR REPLACE FUNCTION ib_gate(i bigint) RETURNS bigint LANGUAGE plpgsql IMMUTABLE AS $$ "
                 "BEGIN PERFORM pg_advisory_lock_shared(4242); PERFORM pg_advisory_unlock_shared(4242); RETURN i; "
                 "END $$")
    gate.execute("SELECT pg_advisory_lock(4242)")
    t = threading.Thread(target=conn.execute, args=(f'CREATE INDEX "{name}" ON "{table}" ((ib_gate(id)))',),
                         daemon=True)
    t.start()
    pid = conn.info.backend_pid
    for _ in range(3000):
        if gate.execute("SELECT 1 FROM pg_stat_progress_create_index WHERE pid = %s", (pid,)).fetchone():
            return t
        t.join(0.01)
    raise AssertionError("the gated build never started")


@pytest.mark.parametrize("left", ["running", "uncommitted"])
def test_a_build_another_session_left_is_waited_for_a_bounded_time_then_exit_75_naming_its_pid(
        pg_url, left):  # noqa: F811
    """QA: after ``kill -9`` during the target's index build, the rerun waited for the dead client's CREATE INDEX on
    the server however long it took (hours on a big table), silently. It waits ``index_wait_s`` now, then stops
    with IndexBuildBusyError (exit 75, retry later) naming the build's pid (or the session holding the table:
    a build left uncommitted); once that build is done, the next finalize keeps its index."""
    from service.errors import exit_code
    from service.vectordb import IndexBuildBusyError

    store = open_store(pg_url, index="hnsw", index_wait_s=0.5)
    store.drop("ib_dst")
    _filled_target(store, 50)
    with psycopg.connect(pg_url, autocommit=True) as dead, psycopg.connect(pg_url, autocommit=True) as gate:
        build = None
        try:
            if left == "running":
                build = _gated_build(dead, gate, "ib_dst", "ib_dst_hnsw")
            else:
                dead.execute("BEGIN")
                dead.execute('CREATE INDEX "ib_dst_hnsw" ON "ib_dst" USING hnsw ("embedding" vector_cosine_ops)')
            t, errors = _finalize_in_thread(store)
            t.join(60)  # the old code waited until the other build ended: here, until the finally below
            alive = t.is_alive()
        finally:
            if build is not None:
                gate.execute("SELECT pg_advisory_unlock(4242)")
                build.join(60)
            else:
                dead.execute("COMMIT")
        assert not alive and len(errors) == 1 and isinstance(errors[0], IndexBuildBusyError), errors
        message, pid = str(errors[0]), dead.info.backend_pid
        assert exit_code(errors[0]) == 75 and f"pid {pid}" in message and "waited 0.5 s" in message, message
        if left == "running":
            assert "is building an index on 'ib_dst'" in message and f"pg_cancel_backend({pid})" in message, message
        else:
            assert "idle in transaction) holds 'ib_dst'" in message, message
    store.finalize("ib_dst")  # that build done: kept (its name is the index's)
    assert store.conn.execute("SELECT count(*) FROM pg_indexes WHERE indexname = 'ib_dst_hnsw'").fetchone()[0] == 1
    store.drop("ib_dst")
    store.close()


def test_a_rerun_of_vecbridge_migrate_beside_a_killed_runs_build_exits_75_naming_it_then_resumes(
        pg_url, tmp_path, monkeypatch, capsys):  # noqa: F811
    """The CLI face of the above: the run stopped once every row was written (as ``kill -9`` during its build leaves
    it), the killed run's build still open on the server; ``vecbridge migrate`` again waits
    ``VECBRIDGE_VECTORDB_INDEX_WAIT_S`` (documented setting), then exits 75 in one line naming that session's pid;
    once it has committed, the same command finishes and keeps its index."""
    from _vectordb_servers import small_migration

    from service.cli import main
    from service.ops.vectordb import run_migration
    from service.vectordb import MigrationInterrupted
    from align.exceptions import Cancelled

    X, m = small_migration()
    data = tmp_path / "d"
    with open_store(pg_url) as s:
        for n in ("ib_src", "ib_dst"):
            s.drop(n)
        s.create("ib_src", X.shape[1])
        s.upsert("ib_src", np.arange(len(X)), X)
        s.finalize("ib_src")
    m.save(tmp_path / "m.npz")
    ckpt = tmp_path / "c.json"

    def stop_at_the_build(p):
        if p.stage == "index":
            raise Cancelled("killed")
    with pytest.raises(MigrationInterrupted):
        run_migration(store_url=pg_url, source="ib_src", target="ib_dst", map_ref=str(tmp_path / "m.npz"),
                      checkpoint=ckpt, batch_size=64, progress=stop_at_the_build, data_dir=data,
                      artifact_dir=data / "artifacts")
    monkeypatch.setenv("VECBRIDGE_VECTORDB_INDEX_WAIT_S", "0.5")
    args = ["--data-dir", str(data), "migrate", "--store", pg_url, "--source", "ib_src", "--target", "ib_dst",
            "--map", str(tmp_path / "m.npz"), "--checkpoint", str(ckpt), "--quiet"]
    got: list = []
    with psycopg.connect(pg_url, autocommit=True) as dead:
        _left_building(dead)
        capsys.readouterr()
        t = threading.Thread(target=lambda: got.append(main(args)), daemon=True)
        try:
            t.start()
            t.join(60)  # the old code waited for the dead build: here, until the commit below
        finally:
            dead.execute("COMMIT")
            t.join(60)
        err, pid = capsys.readouterr().err, dead.info.backend_pid
    assert got == [75], (got, err)
    assert len(err.strip().splitlines()) == 1 and f"pid {pid}" in err, err
    assert main(args) == 0 and f"migrated {len(X)} rows" in capsys.readouterr().out
    with open_store(pg_url) as s:
        assert s.vector_index("ib_dst") == ("hnsw", {"m": 16, "ef_construction": 64})
        for n in ("ib_src", "ib_dst"):
            s.drop(n)


def test_a_migration_job_beside_a_session_holding_its_target_fails_naming_it(pg_url, tmp_path):  # noqa: F811
    """``POST /v1/migrations``: the job's index build behind another session's hold on the target (a killed run's
    build left open) waited as long as that lasted, the job ``running`` all along; it waits the service's
    ``vectordb_index_wait_s`` now, then fails with the message naming that session's pid."""
    from _api_support import W, settings_for
    from _jobs_support import wait_http_job
    from _servers import seed_registry
    from fastapi.testclient import TestClient

    from service.api import create_app

    X, _, _ = seed_registry(tmp_path / "data")
    with open_store(pg_url) as s:
        for n in ("ib_src", "ib_dst"):
            s.drop(n)
        s.create("ib_src", X.shape[1])
        s.set_space("ib_src", "a")
        s.upsert("ib_src", np.arange(len(X)), X)
    body = {"source": "ib_src", "target": "ib_dst", "map": "a2b", "index": "hnsw", "batch_size": 50, "pause": 0.3}
    locker = psycopg.connect(pg_url)
    try:
        with TestClient(create_app(settings_for(tmp_path, vectordb_url=pg_url, vectordb_index_wait_s=0.5))) as c, \
                psycopg.connect(pg_url, autocommit=True) as watch:
            jid = c.post("/v1/migrations", json=body, headers=W).json()["id"]
            for _ in range(6000):  # rows go in for ~2 s (pause 0.3 after each of 6 batches)
                if watch.execute("SELECT to_regclass('ib_dst')").fetchone()[0]:
                    break
                job = c.get(f"/v1/jobs/{jid}", headers=W).json()  # queued until a worker takes it, then running
                assert job["state"] in ("queued", "running"), job
                watch.execute("SELECT pg_sleep(0.01)")
            locker.execute("LOCK TABLE ib_dst IN ROW EXCLUSIVE MODE")  # rows still go in; the index cannot be built
            try:
                job = wait_http_job(c, jid, timeout=60, headers=W)  # the old code: running until the rollback
            except AssertionError as exc:
                job = {"state": f"not ended in 60 s: {exc}"}
            pid = locker.info.backend_pid
            locker.rollback()
    finally:
        locker.close()
    assert job["state"] == "failed", job
    assert f"pid {pid}" in job["error"]["message"] and "holds 'ib_dst'" in job["error"]["message"], job
    with open_store(pg_url) as s:
        for n in ("ib_src", "ib_dst"):
            s.drop(n)
