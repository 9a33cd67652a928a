"""Who holds a checkpoint kept in PostgreSQL (:class:`PgCheckpoint`): the run's advisory lock, probed from another
session, tells a live run from a killed one, as a file checkpoint's ``flock`` does (real PostgreSQL:
``eval "$(bash .ci/start_postgres.sh)"``)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _servers import read_line

from service.ops.vectordb import checkpoint_status
from service.vectordb import MigrationRunningError, PgCheckpoint

pytest.importorskip("psycopg")
pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[3]


def test_a_probe_tells_a_held_lock_from_a_free_one_from_another_session_and_takes_nothing(pg_url):
    """A session's advisory locks are its own to take again: a probe on the run's own connection read a held lock
    as free. The probe asks on a connection of its own, lets go at once, and a run after it gets the lock."""
    ck = PgCheckpoint(pg_url, "a->b")
    other = PgCheckpoint(pg_url, "a->b")
    try:
        assert ck.lock_held() is False
        with ck.lock():
            assert ck.lock_held() is True  # asked of the very object that holds it
            assert other.lock_held() is True
            with pytest.raises(MigrationRunningError), other.lock():
                pass
        assert other.lock_held() is False
        for _ in range(20):  # probes never leave the lock taken: a run after each gets it
            assert ck.lock_held() is False
            with other.lock():
                pass
        assert PgCheckpoint(pg_url, "a->c").lock_held() is False  # another key: another lock
    finally:
        ck.close()
        other.close()


_RUN = """
import sys, time
sys.path.insert(0, {tests!r})
from _vectordb_servers import small_migration
from service.vectordb import PgCheckpoint, QdrantStore, migrate
X, m = small_migration()
s = QdrantStore(path={qd!r})
s.create("src", 24)
s.upsert("src", list(range(200)), X, None)
def slow(p):
    print(p.done, flush=True)
    time.sleep(0.5)
migrate(s, "src", "dst", m, batch_size=20, checkpoint=PgCheckpoint({url!r}, "src->dst"), progress=slow)
"""


def test_the_status_of_a_postgresql_checkpoint_says_running_while_its_run_lives_and_interrupted_once_killed(
        pg_url, tmp_path):
    """``checkpoint_status`` read checkpoint files only: a migration whose checkpoint is in PostgreSQL had no status
    that could tell whether its run still wrote. It reads a :class:`PgCheckpoint` too, and judges the run by the
    advisory lock it holds: ``running`` (the holder's pid) while it runs, ``interrupted`` ("process N is gone") once
    it was killed with ``kill -9`` (which records no stop)."""
    pytest.importorskip("qdrant_client")
    err = tmp_path / "child.err"
    with err.open("w") as err_file:
        child = subprocess.Popen([sys.executable, "-c", _RUN.format(tests=str(ROOT / "tests"), qd=str(tmp_path / "qd"),
                                                                    url=pg_url)],
                                 cwd=ROOT, stdout=subprocess.PIPE, stderr=err_file, text=True)
    ck = None
    try:
        ck = PgCheckpoint(pg_url, "src->dst")
        first = read_line(child)
        assert int(first or 0) > 0, err.read_text()  # a batch written and checkpointed
        live = checkpoint_status(ck)
        assert live["state"] == "running" and live["why"] is None and live["holder"]["pid"] == child.pid, live
        assert live["checkpoint"] == "src->dst in vecbridge_migrations" and live["resume"] is None, live
        child.kill()
        child.communicate(timeout=60)
        deadline = time.monotonic() + 30  # the server sees the connection drop and releases the lock
        while ck.lock_held() and time.monotonic() < deadline:
            time.sleep(0.05)
        st = checkpoint_status(ck)
        assert st["state"] == "interrupted" and st["why"] == f"process {child.pid} is gone", st
        assert 0 < st["done"] < 200 and st["eta_s"] is None, st
    finally:
        child.kill()
        child.wait(timeout=30)
        if ck is not None:
            ck.close()


def test_a_run_recorded_by_another_host_is_judged_by_the_databases_lock(pg_url):
    """A file lock proves nothing from another host (its file system may not share ``flock``), so such a run stays
    "running, not checked from here". The database's lock is one for every host: held, the run lives; free, it is
    gone, wherever it ran."""
    ck = PgCheckpoint(pg_url, "x->y")
    try:
        state = {"source": "x", "target": "y", "map_fingerprint": "f", "first_id": 0, "last_id": 9, "done": 10,
                 "batches": 1, "total": 100, "finished": False, "started_at": time.time(), "stopped_at": None,
                 "holder": {"pid": 4242, "host": f"not-{socket.gethostname()}", "started": 1}}
        ck.save(state)
        with ck.lock():  # the run on the other host holds the lock
            st = checkpoint_status(PgCheckpoint(pg_url, "x->y"))
            assert st["state"] == "running" and st["why"] is None, st
        st = checkpoint_status(PgCheckpoint(pg_url, "x->y"))
        assert st["state"] == "interrupted" and st["why"] == "process 4242 is gone", st
    finally:
        ck.clear()
        ck.close()
