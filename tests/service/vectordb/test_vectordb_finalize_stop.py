"""A stop asked while a migration builds its target's vector index (the finalize: ~85% of a 40,960-row pgvector
migration's time) stops it. Before, a Ctrl-C or SIGTERM there was noted and the build ran on to its end: exit 0,
"migrated ...", though ``migrate --help`` promises 130 / 143.

The build is held by a lock this test takes on the target (CREATE INDEX waits for it), so the child is in its
finalize for as long as the test needs, however fast or slow the machine."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _vectordb_servers import pg_url, small_migration  # noqa: F401  (module-scoped server fixture)

from service.vectordb import open_store

psycopg = pytest.importorskip("psycopg")
ROOT = Path(__file__).resolve().parents[3]
#: ``python -m service.cli`` with Ctrl-C as Python's default whatever the parent left (as test_migrate_cli.py)
_CLI = [sys.executable, "-c", ("import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
                               "runpy.run_module('service.cli', run_name='__main__', alter_sys=True)")]


def _until(what, child, timeout: float = 120.0):
    """Poll ``what()`` until it is truthy (the child still running); its value."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        got = what()
        if got:
            return got
        assert child.poll() is None, child.communicate(timeout=60)
        time.sleep(0.02)
    raise AssertionError(f"not seen in {timeout}s")


def _locks_wait(url: str) -> str:
    """``url`` whose sessions wait at most 30 s for a lock (then fail): a drop or a LOCK TABLE that a leftover
    session blocks ends the test with an error instead of hanging it."""
    return url + ("&" if "?" in url else "?") + "options=-c%20lock_timeout%3D30s"


def _drop(url: str, *tables: str) -> None:
    with open_store(_locks_wait(url)) as s:
        for t in tables:
            s.drop(t)


def _vector_indexes(conn, table: str) -> list[str]:
    return [r[0] for r in conn.execute("SELECT indexdef FROM pg_indexes WHERE tablename = %s AND indexdef LIKE "
                                       "'%%USING hnsw%%'", (table,)).fetchall()]


@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"),
                                            (signal.SIGTERM, 143, "terminated")])
def test_a_stop_during_the_index_build_cancels_it_and_a_rerun_builds_it(pg_url, tmp_path, sig, code,  # noqa: F811
                                                                        word):
    X, m = small_migration()
    src, dst = f"fs_src_{code}", f"fs_dst_{code}"
    _drop(pg_url, src, dst)
    with open_store(pg_url) as s:
        s.create(src, X.shape[1])
        s.upsert(src, np.arange(len(X)), X)
    m.save(tmp_path / "m.npz")
    cmd = [*_CLI, "--data-dir", str(tmp_path / "d"), "migrate", "--store", pg_url, "--source", src, "--target", dst,
           "--map", str(tmp_path / "m.npz"), "--index", "hnsw", "--checkpoint", str(tmp_path / "c.json"), "--quiet"]
    locker = psycopg.connect(_locks_wait(pg_url))  # a transaction holding the target: the index build waits for it
    watch = psycopg.connect(pg_url, autocommit=True)
    child = subprocess.Popen([*cmd, "--batch-size", "20", "--pause", "0.5"], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        try:
            _until(lambda: watch.execute("SELECT to_regclass(%s)", (dst,)).fetchone()[0], child)
            locker.execute(f"LOCK TABLE {dst} IN ROW EXCLUSIVE MODE")  # rows still go in; the index cannot be built
            _until(lambda: watch.execute("SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query "
                                         "LIKE 'CREATE INDEX%%' AND query LIKE %s", (f"%{dst}%",)).fetchone(), child)
            child.send_signal(sig)
            try:
                child.wait(timeout=60)  # the old code waited on until the lock went, then exited 0
            except subprocess.TimeoutExpired:
                pass
        finally:
            locker.rollback()
            locker.close()
        out, err = child.communicate(timeout=120)
    finally:  # a failure above leaves no child migrating (and holding the tables) behind
        child.kill()
        child.wait(timeout=30)
    assert child.returncode == code, (child.returncode, out, err)
    assert "Traceback" not in err and f"vecbridge: {word}" in err and "building the index" in err, err
    assert "run the same command again" in err, err
    assert _vector_indexes(watch, dst) == [], "a cancelled build leaves no index"
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert again.returncode == 0 and f"migrated {len(X)} rows" in again.stdout, again.stderr
    assert len(_vector_indexes(watch, dst)) == 1, "the rerun builds the index"
    _drop(pg_url, src, dst)
    watch.close()


def test_a_job_cancelled_during_the_index_build_cancels_it_and_the_same_request_builds_it(pg_url,  # noqa: F811
                                                                                         tmp_path):
    """``DELETE /v1/jobs/{id}`` of a migration job (the server's ``POST /v1/migrations``) while the target's index
    builds: the CLI's Ctrl-C cancelled the build since it was fixed, but a job's cancel was read only after each
    batch, so the build ran to its end (here: for as long as the lock is held) and the job then succeeded."""
    import httpx
    from _api_support import W
    from _jobs_support import wait_http_job
    from _servers import seeded_uvicorn

    dst = "fs_job_dst"
    locker = psycopg.connect(_locks_wait(pg_url))
    watch = psycopg.connect(pg_url, autocommit=True)
    with seeded_uvicorn(tmp_path, {"VECBRIDGE_VECTORDB_URL": pg_url}) as (base, (X, _, _m)):
        _drop(pg_url, "fs_job_src", dst)
        with open_store(pg_url) as s:
            s.create("fs_job_src", X.shape[1])
            s.set_space("fs_job_src", "a")
            s.upsert("fs_job_src", np.arange(len(X)), X)
        body = {"source": "fs_job_src", "target": dst, "map": "a2b", "index": "hnsw", "batch_size": 50,
                "pause": 0.3}
        with httpx.Client(base_url=base, headers=W, timeout=60) as c:
            jid = c.post("/v1/migrations", json=body).json()["id"]
            try:
                deadline = time.monotonic() + 120
                while not watch.execute("SELECT to_regclass(%s)", (dst,)).fetchone()[0]:
                    assert time.monotonic() < deadline and c.get(f"/v1/jobs/{jid}").json()["state"] == "running"
                    time.sleep(0.02)
                locker.execute(f"LOCK TABLE {dst} IN ROW EXCLUSIVE MODE")  # rows go in; the index waits for it
                while not watch.execute("SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query "
                                        "LIKE 'CREATE INDEX%%' AND query LIKE %s", (f"%{dst}%",)).fetchone():
                    assert time.monotonic() < deadline and c.get(f"/v1/jobs/{jid}").json()["state"] == "running"
                    time.sleep(0.02)
                assert c.delete(f"/v1/jobs/{jid}").status_code in (200, 202)
                try:  # the old code waited on until the lock went (then succeeded)
                    job = wait_http_job(c, jid, timeout=60)
                except AssertionError as exc:
                    job = {"state": f"not ended 60 s after the cancel: {exc}"}
            finally:
                locker.rollback()
                locker.close()
            assert job["state"] == "cancelled", job
            assert "building the index" in job["error"]["message"], job
            assert _vector_indexes(watch, dst) == [], "a cancelled build leaves no index"
            again = wait_http_job(c, c.post("/v1/migrations", json=body).json()["id"], timeout=300)
            assert again["state"] == "succeeded" and again["result"]["report"]["rows_this_run"] == 0, again
            assert len(_vector_indexes(watch, dst)) == 1, "the same request builds the index"
    _drop(pg_url, "fs_job_src", dst)
    watch.close()
