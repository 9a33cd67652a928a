"""Background jobs as an operator meets them, against a real ``vecbridge serve`` process: a job store locked
by another process, listing every stored job page by page, retrying an interrupted job with its key."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import httpx
import pytest
from _api_support import W, planted
from _servers import env_for, free_port, seed_registry, start, stop

HOLD_LOCK = textwrap.dedent("""
    import sqlite3, sys, time
    c = sqlite3.connect(sys.argv[1], isolation_level=None)
    c.execute("BEGIN IMMEDIATE")
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
    c.execute("ROLLBACK")
""")


@pytest.fixture
def server(tmp_path):
    """A real single-process server over a data dir whose registry holds spaces a and b; ``(url, data_dir)``."""
    data = tmp_path / "data"
    seed_registry(data)
    port = free_port()
    proc = start([sys.executable, "-m", "service.cli", "serve"], env_for(data, port), port, tmp_path / "server.log")
    try:
        yield f"http://127.0.0.1:{port}", data
    finally:
        stop(proc)


def _fit_body(name: str = "f") -> dict:
    X, Y, _ = planted(80)
    return {"name": name, "source_space": "a", "target_space": "b", "method": "procrustes", "paired": True,
            "source": {"vectors": X.tolist()}, "target": {"vectors": Y.tolist()}}


def test_a_locked_job_store_neither_stalls_the_server_nor_answers_500(server):
    # another process held jobs.sqlite's write lock (a backup, a sibling's long transaction): POST /v1/fits
    # waited for SQLite's busy timeout on the event loop — /healthz took 9.6 s — and then answered a 500
    # "internal error"; the wait is now off the event loop and ends in a 429 with Retry-After
    url, data = server
    body = _fit_body()
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(data / "jobs.sqlite"), "12"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        answer = {}
        post = threading.Thread(target=lambda: answer.update(r=httpx.post(f"{url}/v1/fits", headers=W, json=body,
                                                                          timeout=60)))
        post.start()
        time.sleep(0.5)
        t0 = time.monotonic()
        assert httpx.get(f"{url}/healthz", timeout=60).status_code == 200
        assert time.monotonic() - t0 < 3.0, "the server stalled while the job store was locked"
        post.join(60)
        r = answer["r"]
        assert r.status_code == 429 and r.headers.get("Retry-After"), (r.status_code, r.text)
        assert r.json()["error"]["type"] == "JobStoreBusyError" and "jobs.sqlite" in r.text, r.text
    finally:
        holder.kill()
        holder.wait()
    r = httpx.post(f"{url}/v1/fits", headers=W, json=body, timeout=60)
    assert r.status_code == 202, r.text
