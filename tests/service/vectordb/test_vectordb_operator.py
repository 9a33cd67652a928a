"""An operator migrating a real database: the rows users really have (extreme ids, NULL vectors, ids that are
not integers), a second run beside the first, and ``verify`` as the gate after it.

PostgreSQL + pgvector (pgserver wheel, or ``VECBRIDGE_TEST_PGVECTOR_URL``) and Qdrant local mode; small
generated collections: these are about rows arriving or being refused, not quality
(``test_vectordb_engines.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
from _vectordb_servers import pg_url, small_migration  # noqa: F401  (pg_url: a module-scoped fixture)

from align.exceptions import NonFiniteError
from service.vectordb import VectorDBError, migrate, open_store


@pytest.fixture(scope="module")
def data():
    return small_migration()


@pytest.fixture
def pg(pg_url):  # noqa: F811
    """An open pgvector store and a ``table(sql_columns, rows)`` maker; this module's tables dropped afterwards."""
    from pgvector.psycopg import register_vector

    s = open_store(pg_url)
    register_vector(s.conn)
    names = ("o_src", "o_dst")

    def table(cols: str, rows) -> None:
        s.conn.execute(f"CREATE TABLE o_src ({cols})")
        with s.conn.cursor() as cur:
            cur.executemany("INSERT INTO o_src VALUES (%s, %s, %s)", rows)

    for n in names:
        s.drop(n)
    yield s, table
    for n in names:
        s.drop(n)
    s.close()


def test_pgvector_the_smallest_bigint_id_is_migrated(pg, data):
    s, table = pg
    X, m = data  # the first scan read `WHERE id > -2**63`: that row was left out, and the report said 2005 of 2006
    ids = [-(2**63), -5, 0, 2**31 + 7, 2**53 + 1, 2**63 - 1]
    table("id bigint PRIMARY KEY, embedding vector(24) NOT NULL, text text",
          [(i, X[j], f"t{j}") for j, i in enumerate(ids)])
    rep = migrate(s, "o_src", "o_dst", m, batch_size=4)
    assert rep.rows == rep.rows_this_run == 6
    np.testing.assert_array_equal(s.ids("o_dst"), sorted(ids))
    np.testing.assert_allclose(s.fetch("o_dst", [-(2**63)]).vectors, m.apply(X[:1], output="raw"), atol=1e-5)


def test_pgvector_a_null_vector_is_refused_naming_its_id(pg, data):
    s, table = pg
    X, m = data  # was "internal error: ValueError: all input arrays must have the same shape", exit 3
    table("id bigint PRIMARY KEY, embedding vector(24), text text",
          [(i, None if i in (6, 9) else X[i], f"t{i}") for i in range(12)])
    with pytest.raises(NonFiniteError, match=r"'o_src': 2 stored vector\(s\).*NULL.*ids \[6, 9\]"):
        migrate(s, "o_src", "o_dst", m, batch_size=5)
    assert s.count("o_dst") == 5  # the batch before them is written (a rerun resumes after id 4)


def test_pgvector_zero_vectors_are_refused_naming_their_ids(pg, data):
    from align.exceptions import DegenerateInputError

    s, table = pg
    X, m = data  # two all-zero rows ("no embedding" placeholders) became the map's mean direction, silently
    table("id bigint PRIMARY KEY, embedding vector(24), text text",
          [(i, np.zeros(24, np.float32) if i in (6, 9) else X[i], f"t{i}") for i in range(12)])
    with pytest.raises(DegenerateInputError, match=r"'o_src': 2 stored zero vector\(s\).*ids \[6, 9\]; a zero vector "
                                                   "has no direction"):
        migrate(s, "o_src", "o_dst", m, batch_size=5)
    assert s.count("o_dst") == 5  # the batch before them is written (a rerun resumes after id 4)
    s.conn.execute("UPDATE o_src SET embedding = %s WHERE id = 0", (np.zeros(24, np.float32),))
    with pytest.raises(DegenerateInputError, match=r"ids \[0\]"):  # a dry run checks the batch it reads too
        migrate(s, "o_src", "o_dst2", m, batch_size=5, dry_run=True)


def test_a_run_that_fails_after_its_last_batch_says_stopped_not_running(pg, data, tmp_path):
    """Only the scan loop recorded a stop: a run that failed in the finalize (or the space or the alias switch) after
    every row was written exited 3, and `migrate --status` then said "not finished, running, ETA 0s" with nothing
    running. Here the target goes (another client drops it) once the last batch is written: the finalize fails."""
    from service.ops.vectordb import checkpoint_status
    from service.vectordb import CollectionNotFoundError, FileCheckpoint

    s, table = pg
    X, m = data
    table("id bigint PRIMARY KEY, embedding vector(24), text text", [(i, X[i], f"t{i}") for i in range(12)])

    def progress(p):
        if p.done == p.total:
            s.drop("o_dst")

    with pytest.raises(CollectionNotFoundError, match="o_dst"):
        migrate(s, "o_src", "o_dst", m, batch_size=5, checkpoint=FileCheckpoint(tmp_path / "ck.json"),
                progress=progress)
    st = checkpoint_status(tmp_path / "ck.json")
    assert (st["done"], st["finished"], st["state"], st["eta_s"]) == (12, False, "stopped", None), st


@pytest.mark.parametrize("id_type,make", [("text", lambda i: f"doc-{i}"),
                                          ("uuid", lambda i: f"00000000-0000-0000-0000-{i:012d}")])
def test_pgvector_ids_that_are_not_integers_migrate_keeping_their_type(pg, data, id_type, make):
    s, table = pg
    X, m = data  # was "internal error: UndefinedFunction: operator does not exist: text > bigint" (exit 3), then
    # refused by name; now string ids travel (tests/service/vectordb/test_vectordb_pg_string_ids.py)
    table(f"id {id_type} PRIMARY KEY, embedding vector(24) NOT NULL, text text",
          [(make(i), X[i], f"t{i}") for i in range(5)])
    rep = migrate(s, "o_src", "o_dst", m, batch_size=2)
    assert rep.rows == 5 and s.ids("o_dst").tolist() == [make(i) for i in range(5)]
    assert s.conn.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                          "'o_dst'::regclass AND attname = 'id'").fetchone()[0] == id_type


@pytest.mark.parametrize("url", ["qdrant://alice:s3cr@tPW@127.0.0.1:{port}", "mysql://alice:s3cr@tPW@db:3306/x"])
def test_a_password_in_the_store_url_is_never_printed(url, tmp_path, capsys):
    from _servers import free_port

    from service.cli import main

    url = url.format(port=free_port())  # the Qdrant refusal printed "cannot connect to http://alice:s3cr@tPW@..."
    assert main(["--data-dir", str(tmp_path), "spaces", "add", "a", "--dim", "4"]) == 0  # a registry to read "m" in
    capsys.readouterr()
    rc = main(["--data-dir", str(tmp_path), "migrate", "--store", url, "--source", "a", "--target", "b",
               "--map", "m"])
    err = capsys.readouterr().err
    said = "alice:***@" if url.startswith("mysql") else "takes no user or password (the URL is not repeated"
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "s3cr" not in err and "tPW" not in err, err
    assert said in err, err


def test_a_second_run_of_a_running_migration_is_refused_and_a_killed_one_resumes(
        pg, pg_url, data, tmp_path, capsys):  # noqa: F811
    import json
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from service.cli import main

    s, table = pg
    X, m = data  # a second run used to write every row again beside the first and race it for the checkpoint
    table("id bigint PRIMARY KEY, embedding vector(24) NOT NULL, text text", [(i, X[i], f"t{i}") for i in range(200)])
    m.save(tmp_path / "m.npz")
    ck = tmp_path / "ck.json"
    args = ["--data-dir", str(tmp_path), "migrate", "--store", pg_url, "--source", "o_src", "--target", "o_dst",
            "--map", str(tmp_path / "m.npz"), "--checkpoint", str(ck), "--batch-size", "20", "--quiet"]
    root = Path(__file__).resolve().parents[3]
    first = subprocess.Popen([sys.executable, "-m", "service.cli", *args, "--pause", "1.0"], cwd=root,
                             env={**os.environ, "PYTHONPATH": str(root)}, stderr=subprocess.PIPE)
    try:
        t0 = time.time()
        while not (ck.exists() and json.loads(ck.read_text())["done"] >= 40):
            if time.time() - t0 >= 60:
                first.kill()  # its stderr ends, so it can be read below
                first.wait(30)
            assert first.poll() is None, first.stderr.read() if first.stderr else ""
            time.sleep(0.05)
        # the first run must still hold its lock here: 8 batches x --pause 1.0 left (~8 s), not 8 x 0.3 (2.4 s, which a
        # loaded machine could spend between the check above and this second run reaching the lock); it is killed below
        assert main(args) == 2
        err = capsys.readouterr().err
        assert f"another run of this migration is writing now (pid {first.pid}" in err and len(err.splitlines()) == 1
    finally:
        first.send_signal(signal.SIGKILL)  # ... and the lock dies with it
        first.wait()
    assert main(args) == 0 and "resumed after id" in capsys.readouterr().out
    np.testing.assert_array_equal(s.ids("o_dst"), np.arange(200))


def test_a_postgresql_checkpoint_is_held_by_one_run_at_a_time(pg_url):  # noqa: F811
    from service.vectordb import MigrationRunningError, PgCheckpoint

    a, b = PgCheckpoint(pg_url, "o_src->o_dst"), PgCheckpoint(pg_url, "o_src->o_dst")
    try:
        with a.lock(), pytest.raises(MigrationRunningError, match="another run"), b.lock():
            pass
        with b.lock():  # released when the first run ends
            pass
    finally:
        a.close(), b.close()


def test_verify_with_source_catches_missing_extra_and_wrong_rows(pg, pg_url, data, tmp_path, capsys):  # noqa: F811
    import json

    from service.cli import main

    s, table = pg
    X, m = data  # verify sampled the target only: 3 rows gone, 1 foreign, 1 vector replaced still said PASS
    table("id bigint PRIMARY KEY, embedding vector(24) NOT NULL, text text", [(i, X[i], f"t{i}") for i in range(200)])
    migrate(s, "o_src", "o_dst", m, batch_size=64)
    m.save(tmp_path / "m.npz")
    np.save(tmp_path / "hx.npy", X), np.save(tmp_path / "hy.npy", m.apply(X, output="raw"))
    args = ["--data-dir", str(tmp_path), "verify", "--store", pg_url, "--collection", "o_dst", "--source", "o_src",
            "--map", str(tmp_path / "m.npz"), "--heldout-source", str(tmp_path / "hx.npy"), "--heldout-target",
            str(tmp_path / "hy.npy"), "--n-sample", "100", "--min-recall", "0.5"]
    assert main(args) == 0 and "200/200 rows, 0 missing, 0 extra, 0 wrong vectors" in capsys.readouterr().out
    s.conn.execute("DELETE FROM o_dst WHERE id IN (0, 150, 199)")
    s.upsert("o_dst", [77, 1000], np.stack([m.apply(X[78:79], output="raw")[0]] * 2), ["t77", "t1000"])
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "198/200 rows, 3 missing (ids 0, 150, 199), 1 extra (ids 1000), 1 wrong vectors (ids 77)" in out
    assert "FAIL: rows differ from the source's; 1 wrong vector(s): may be re-embedded rows" in out  # no checkpoint
    assert main([*args, "--json"]) == 1
    got = json.loads(capsys.readouterr().out)
    assert (got["missing_rows"], got["extra_rows"], got["wrong_vectors"], got["verdict"]) == (3, 1, 1, "FAIL")
    assert got["mode"] == "heldout" and got["recall@10"] > 0.5  # the map itself is fine: the figures never saw it
    rows_only = [a for a in args if a not in ("--heldout-source", "--heldout-target", str(tmp_path / "hx.npy"),
                                              str(tmp_path / "hy.npy"))]
    assert main(rows_only) == 2  # --min-recall with nothing measuring recall: refused, never a vacuous PASS
    assert "--source alone checks rows, not recall" in capsys.readouterr().err
    assert main([a for a in rows_only if a not in ("--min-recall", "0.5")]) == 1  # the rows still fail


def test_verify_held_out_refuses_a_collection_that_is_missing_empty_or_of_another_size(pg, pg_url, data,  # noqa: F811
                                                                                         tmp_path, capsys):
    from service.cli import main

    s, _ = pg
    X, m = data  # the held-out figures never read the collection: a missing or empty one got exit 0 (and PASS)
    m.save(tmp_path / "m.npz")
    np.save(tmp_path / "hx.npy", X), np.save(tmp_path / "hy.npy", m.apply(X, output="raw"))
    base = ["--data-dir", str(tmp_path), "verify", "--store", pg_url, "--map", str(tmp_path / "m.npz"),
            "--heldout-source", str(tmp_path / "hx.npy"), "--heldout-target", str(tmp_path / "hy.npy"),
            "--min-recall", "0.5", "--collection"]
    assert main([*base, "o_dst"]) == 2 and "no table or alias 'o_dst'" in capsys.readouterr().err
    s.create("o_dst", 16)
    assert main([*base, "o_dst"]) == 2 and "'o_dst' holds no rows" in capsys.readouterr().err
    s.create("o_src", 24)
    s.upsert("o_src", [1], X[:1])
    assert main([*base, "o_src"]) == 2 and "24-d vectors, the map writes 16-d" in capsys.readouterr().err


@pytest.mark.parametrize("url", ["postgresql://bob:s3cr%zzet@127.0.0.1:1/db", "postgresql://bob:s3cret@[::1/db",
                                 "postgresql://bob@[::1/db?password=s3cret"])
def test_a_postgresql_url_libpq_cannot_parse_never_shows_its_password(url):
    pytest.importorskip("psycopg")
    with pytest.raises(VectorDBError) as e:  # before: psycopg.ProgrammingError quoting the password
        open_store(url)
    assert "s3cr" not in str(e.value) and "cannot connect" in str(e.value)
