"""Background jobs as an operator meets them, against a real ``vecbridge serve`` process: a job store locked
by another process, listing every stored job page by page, retrying an interrupted job with its key."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest
from _api_support import R, W, planted, walk_pages
from _servers import env_for, read_line, seed_registry, start, start_on_free_port, stop

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
    proc, port = start_on_free_port(lambda port: ([sys.executable, "-m", "service.cli", "serve"], env_for(data, port)),
                                    tmp_path / "server.log")
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
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(data / "jobs.sqlite"), "60"],  # killed below
                              stdout=subprocess.PIPE, text=True)
    try:
        assert read_line(holder).strip() == "locked"
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
        assert r.status_code == 503 and r.headers.get("Retry-After"), (r.status_code, r.text)  # as a locked registry
        assert r.json()["error"]["type"] == "JobStoreBusyError" and "jobs.sqlite" in r.text, r.text
    finally:
        holder.kill()
        holder.wait()
    r = httpx.post(f"{url}/v1/fits", headers=W, json=body, timeout=60)
    assert r.status_code == 202, r.text


def test_pages_of_the_job_list_reach_every_stored_job(server):
    # with 1,200 stored jobs, walking GET /v1/jobs?limit=100 page by page ended after the newest 1,000
    # while `counts` said 1,200: the oldest 200 could only be reached by an id nobody could list
    from service.jobs import Job, JobStore

    url, data = server
    store = JobStore(data / "jobs.sqlite")
    t0 = time.time() - 10_000
    ids = []
    for i in range(1200):  # a long history, as earlier runs leave it
        job = Job(id=f"{i:04d}" + "0" * 28, kind="fit", state="succeeded", stage="done", fraction=1.0,
                  created_at=t0 + i, started_at=t0 + i, finished_at=t0 + i + 0.5, result={"i": i})
        assert store.insert(job) is None
        ids.append(job.id)
    store.close()
    seen = []
    for page in walk_pages(lambda cursor: httpx.get(f"{url}/v1/jobs", headers=R, timeout=60, params={
            "limit": 100, **({"cursor": cursor} if cursor else {})}).json()):
        seen += [j["id"] for j in page["data"]]
    assert page["counts"]["succeeded"] == 1200
    assert seen == ids  # every job once, oldest first
    newest = httpx.get(f"{url}/v1/jobs", headers=R, timeout=60).json()
    assert [j["id"] for j in newest["data"]] == ids[-1000:] and newest["next"] is None  # unpaged: the newest 1000
    bad = httpx.get(f"{url}/v1/jobs", headers=R, params={"limit": 10, "cursor": "WzEsMiwzXQ"}, timeout=60)
    assert bad.status_code == 422 and "cursor" in bad.text, bad.text


def test_the_newest_jobs_and_those_that_may_change_are_asked_for_without_the_whole_history(server):
    # the console polled a bare GET /v1/jobs: the newest 1,000 records with their results (1.38 MB at 1,000 fits,
    # 4.3 MB with 384-d auto fits), every second while a job ran; it can now ask for the newest page
    # (order=newest&limit=N), for the jobs that may still change (state=queued&state=running) and for a page's kinds
    from service.jobs import Job, JobStore

    url, data = server
    store = JobStore(data / "jobs.sqlite")  # held open to the end: its owner (this process) stays alive
    t0 = time.time() - 10_000
    kinds, made = ("fit", "steer-fit", "migration", "verify"), []
    for i in range(240):
        live = i % 37 == 5
        job = Job(id=f"{i:04d}" + "0" * 28, kind=kinds[i % 4], state="running" if live else "succeeded",
                  stage="fit" if live else "done", fraction=0.5 if live else 1.0, created_at=t0 + i, started_at=t0 + i,
                  finished_at=None if live else t0 + i + 0.5, result=None if live else {"i": i, "pad": "x" * 2000})
        assert store.insert(job) is None
        made.append(job)

    def ids(**params) -> tuple[list[str], dict]:
        page = httpx.get(f"{url}/v1/jobs", headers=R, params=params, timeout=60)
        assert page.status_code == 200, page.text
        return [j["id"] for j in page.json()["data"]], page.json()

    newest = [j.id for j in reversed(made)]
    got, page = ids(order="newest", limit=20)
    assert got == newest[:20] and page["counts"]["succeeded"] + page["counts"]["running"] == 240
    rest = walk_pages(lambda cursor: ids(order="newest", limit=50, cursor=cursor)[1], page["next"])
    seen = got + [j["id"] for p in rest for j in p["data"]]  # the newest-first pages walk back to the oldest, each once
    assert seen == newest
    assert ids(order="newest")[0] == newest  # no limit: the newest 1000 in one page, in the order asked for
    from service.client import Client

    with Client(url, R["Authorization"].split()[1], page_size=7) as vb:  # the Python client asks the same
        running = [j.id for j in reversed(made) if j.state == "running" and j.kind in ("fit", "verify")]
        assert [j["id"] for j in vb.list_jobs(state="running", kind=["fit", "verify"], newest=True)] == running
        assert [j["id"] for j in vb.list_jobs(kind="migration")] == [j.id for j in made if j.kind == "migration"]
    live = [j.id for j in reversed(made) if j.state == "running"]
    got, page = ids(state=["queued", "running"], order="newest", limit=100)
    assert got == live and len(live) == 7 and page["counts"]["running"] == 7
    assert all(j["result"] is None for j in page["data"])  # a few hundred bytes, not the fits' results
    got, _ = ids(kind=["migration", "verify"], order="newest", limit=10)
    assert got == [j.id for j in reversed(made) if j.kind in ("migration", "verify")][:10]
    got, _ = ids(kind="fit", state="running")  # unpaged, oldest first, as before
    assert got == [j.id for j in made if j.kind == "fit" and j.state == "running"] and got
    assert ids(limit=5)[0] == [j.id for j in made[:5]]  # without order: oldest first, as before
    # a cursor names its order: one made under order=oldest, sent with order=newest, answered the jobs before it (the
    # walk turned round) without a word; each order now refuses the other's cursor, saying which it was made under
    for made_under, sent in (("oldest", "newest"), ("newest", "oldest")):
        cursor = ids(order=made_under, limit=5)[1]["next"]
        assert ids(order=made_under, limit=5, cursor=cursor)[0]  # its own order takes it
        bad = httpx.get(f"{url}/v1/jobs", headers=R, params={"order": sent, "limit": 5, "cursor": cursor}, timeout=60)
        assert bad.status_code == 422 and f"made under order={made_under}" in bad.text, bad.text[:300]
    from service.api.pagination import encode_cursor

    foreign = encode_cursor(["x", 1])  # another list's key: not this list's, not "made under order=oldest"
    bad = httpx.get(f"{url}/v1/jobs", headers=R, params={"order": "newest", "limit": 5, "cursor": foreign}, timeout=60)
    assert bad.status_code == 422 and "does not belong to this list" in bad.text, bad.text[:300]
    bad = httpx.get(f"{url}/v1/jobs", headers=R, params={"state": "done"}, timeout=60)
    assert bad.status_code == 422 and "state" in bad.text, bad.text
    store.close()


def test_the_finished_jobs_a_data_dir_keeps_is_a_setting(tmp_path):
    # JobStore(keep_finished=10_000) was hard-coded: 10,000 finished records (~2-4.3 KB each for 384-d fits) whatever
    # the operator wanted; VECBRIDGE_JOB_HISTORY sets it, and a server trims to it at start
    from service.jobs import Job, JobStore

    data = tmp_path / "data"
    seed_registry(data)
    store = JobStore(data / "jobs.sqlite")
    t0 = time.time() - 10_000
    for i in range(250):
        assert store.insert(Job(id=f"{i:04d}" + "0" * 28, kind="fit", state="succeeded", stage="done", fraction=1.0,
                                created_at=t0 + i, started_at=t0 + i, finished_at=t0 + i + 1)) is None
    store.close()
    proc, port = start_on_free_port(lambda port: ([sys.executable, "-m", "service.cli", "serve"], {
        **env_for(data, port), "VECBRIDGE_JOB_HISTORY": "120"}), tmp_path / "server.log")
    try:
        page = httpx.get(f"http://127.0.0.1:{port}/v1/jobs", headers=R, params={"limit": 1000}, timeout=60).json()
    finally:
        stop(proc)
    assert page["counts"]["succeeded"] == 120 and page["data"][0]["id"].startswith("0130")  # the newest 120 kept


def test_a_server_stopped_mid_job_records_the_job_interrupted(tmp_path):
    # SIGTERM with a fit running: uvicorn stops the process before the job's next progress report, so its
    # record stayed "running" until a restart (or a sibling's GET) repaired it; shutdown now writes it.
    # (a job whose next progress report came before the process ended then rewrote it "cancelled", a cancel nobody
    # had asked for: test_jobs_durable.py::test_a_job_a_shutdown_interrupted_stays_interrupted_...)
    import sqlite3

    import numpy as np

    data = tmp_path / "data"
    seed_registry(data)
    proc, port = start_on_free_port(lambda port: ([sys.executable, "-m", "service.cli", "serve"], env_for(data, port)),
                                    tmp_path / "server.log")
    url = f"http://127.0.0.1:{port}"
    try:
        rng = np.random.default_rng(0)
        X = rng.standard_normal((1000, 16))
        jid = httpx.post(f"{url}/v1/fits", headers=W, timeout=30, json={
            "name": "long", "source_space": "a", "target_space": "b", "method": "contrastive", "paired": True,
            "source": {"vectors": X.tolist()}, "target": {"vectors": X.tolist()},
            "params": {"epochs": 10_000, "batch_size": 64}}).json()["id"]
        for _ in range(400):
            if httpx.get(f"{url}/v1/jobs/{jid}", headers=R, timeout=30).json()["state"] == "running":
                break
            time.sleep(0.05)
    finally:
        stop(proc)
    with sqlite3.connect(data / "jobs.sqlite") as c:
        state, error = c.execute("SELECT state, error FROM jobs WHERE id = ?", (jid,)).fetchone()
    assert proc.returncode == 0
    assert state == "failed" and "Interrupted" in error, (state, error)


def _long_fit_body(name: str) -> dict:
    import numpy as np

    X = np.random.default_rng(0).standard_normal((1000, 16))
    return {"name": name, "source_space": "a", "target_space": "b", "method": "contrastive", "paired": True,
            "source": {"vectors": X.tolist()}, "target": {"vectors": X.tolist()},
            "params": {"epochs": 10_000, "batch_size": 64}}


def test_cancelled_jobs_say_why_queued_or_running_and_free_the_worker(server):
    # a queued job cancelled by DELETE ended with "error": null (a running one, or one cancelled through
    # another process, said "JobCancelled"): the schema's "on failure or cancel: type, message" did not hold,
    # and Client.wait raised JobCancelledError("job ... cancelled:") with nothing after the colon
    url, _ = server
    c = httpx.Client(base_url=url, headers=W, timeout=60)
    running = c.post("/v1/fits", json=_long_fit_body("long1")).json()["id"]
    queued = c.post("/v1/fits", json=_long_fit_body("long2")).json()  # one job worker: it waits
    assert queued["state"] == "queued", queued
    r = c.delete(f"/v1/jobs/{queued['id']}")
    assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
    assert r.json()["error"]["type"] == "JobCancelled" and "before it started" in r.json()["error"]["message"]
    t0 = time.monotonic()
    assert c.delete(f"/v1/jobs/{running}").status_code in (200, 202)
    while (job := c.get(f"/v1/jobs/{running}").json())["state"] == "running":
        assert time.monotonic() - t0 < 10, job
        time.sleep(0.05)
    assert job["state"] == "cancelled" and job["error"]["type"] == "JobCancelled", job
    assert time.monotonic() - t0 < 5  # stops at its next epoch
    assert c.get("/v1/maps/long1").status_code == 404 and c.get("/v1/maps/long2").status_code == 404
    quick = c.post("/v1/fits", json=_fit_body("quick")).json()["id"]  # the worker is free again
    t0 = time.monotonic()
    while (job := c.get(f"/v1/jobs/{quick}").json())["state"] in ("queued", "running"):
        assert time.monotonic() - t0 < 30, job
        time.sleep(0.05)
    assert job["state"] == "succeeded" and job["result"]["ref"] == "quick:1", job


def test_a_running_fit_reports_how_long_its_stage_has_run_and_when_it_ends(server, wordnet):
    # the job record held a stage and that stage's fraction (0 -> 1, again for each stage) and the whole run's
    # seconds; the console divided the run's seconds by the stage's fraction: 17 s into a WordNet minivec2vec fit,
    # at "restart 1: init" 20 %, it showed an ETA of 68 s, then ~0 s at the end of each stage
    import base64

    import numpy as np

    url, _ = server
    c = httpx.Client(base_url=url, headers=W, timeout=60)

    def side(name):
        A = np.ascontiguousarray(wordnet[name][:3000], dtype=np.float32)
        return {"vectors_b64": base64.b64encode(A.tobytes()).decode(), "dim": A.shape[1]}

    jid = c.post("/v1/fits", json={"name": "wn", "method": "minivec2vec", "source_space": "minilm",
                                   "target_space": "e5", "source": side("minilm"), "target": side("e5")}).json()["id"]
    seen = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < 120:
        job = c.get(f"/v1/jobs/{jid}").json()
        p = job["progress"]
        if job["state"] == "queued":
            time.sleep(0.1)
            continue
        if job["state"] != "running":
            break
        seen.append({**p, "run_seconds": job["timings"]["run_seconds"]})
        if sum(1 for q in seen if q["stage"] == p["stage"] and 0.01 <= q["fraction"] < 1
               and q["stage_eta_seconds"] is not None) >= 3:
            break  # three looks with an ETA inside one stage
        time.sleep(0.1)
    c.delete(f"/v1/jobs/{jid}")
    stage = [q for q in seen if q["stage"] == seen[-1]["stage"] and 0.01 <= q["fraction"] < 1]
    # no ETA until 1 % of the stage is done since its clock started; after the first look with one, every look has one
    with_eta = [q["stage_eta_seconds"] is not None for q in stage]
    assert True in with_eta and all(with_eta[with_eta.index(True):]), stage
    inside = [q for q in stage if q["stage_eta_seconds"] is not None]
    assert len(inside) >= 3, seen
    # the ETA is e (1 - f) / (f - f0): f0 the fraction the stage stood at when its clock started (its first report,
    # not always 0; a resumed migration's checkpoint). f0 is not in the record, so read it back from each look: one
    # stage, one rate, so every look gives the same f0, within what the rounding (elapsed and ETA to 1 ms, fraction
    # to 1e-4) carries through the formula, and f0 lies in [0, the least fraction seen]
    starts = []
    for q in inside:
        f, e, eta = q["fraction"], q["stage_elapsed_seconds"], q["stage_eta_seconds"]
        assert eta is not None and eta > 0, q
        f0 = f - e * (1 - f) / eta
        slack = 0.0001 + (f - f0) * (0.0005 / max(e, 0.001) + 0.0005 / max(eta, 0.001)) + 0.001
        starts.append((f0, slack))
    first = starts[0][0]
    assert -starts[0][1] <= first <= min(q["fraction"] for q in inside) + starts[0][1], (starts, inside)
    for f0, slack in starts[1:]:
        assert f0 == pytest.approx(first, abs=slack + starts[0][1]), (starts, inside)
    assert [q["stage_elapsed_seconds"] for q in inside] == sorted(q["stage_elapsed_seconds"] for q in inside)
    assert all(q["stage_elapsed_seconds"] < q["run_seconds"] - 0.2 for q in inside), inside  # not the run's seconds
    done = c.get(f"/v1/jobs/{jid}").json()
    while done["state"] == "running":
        time.sleep(0.1)
        done = c.get(f"/v1/jobs/{jid}").json()
    assert done["progress"]["stage_elapsed_seconds"] is None and done["progress"]["stage_eta_seconds"] is None


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


_SPAWNER = textwrap.dedent("""
    import multiprocessing, os, sys, time

    def worker(marker, wait):
        time.sleep(wait)  # the parent is gone by now (or not)
        from service.api.app import _stop_with_parent
        _stop_with_parent()
        time.sleep(0.5)
        open(marker, "w").write("served on")

    if __name__ == "__main__":
        marker, parent_alive = sys.argv[1], sys.argv[2] == "1"
        p = multiprocessing.get_context("spawn").Process(target=worker, args=(marker, 0 if parent_alive else 3))
        p.start()
        if parent_alive:
            p.join(60)
        os._exit(0)  # not alive: gone before the worker arms its death signal
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("parent_alive", [True, False])
def test_a_worker_whose_parent_died_before_it_armed_the_death_signal_stops(tmp_path, parent_alive):
    """A worker uvicorn (re)started as ``serve --workers N`` was killed compared its parent after arming
    PR_SET_PDEATHSIG with the parent it read just before, already the reaper: it served on as an orphan (seen under
    load: "workers ... outlived their parent"). It compares with the process that spawned it, as multiprocessing
    recorded it."""
    marker, script = tmp_path / "marker", tmp_path / "spawner.py"
    script.write_text(_SPAWNER)
    subprocess.run([sys.executable, str(script), str(marker), "1" if parent_alive else "0"], timeout=120, check=True)
    t0 = time.monotonic()
    while not marker.exists() and time.monotonic() - t0 < (60 if parent_alive else 20):
        time.sleep(0.2)
    assert marker.exists() == parent_alive


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_stop_and_record_their_jobs_interrupted_when_the_serve_parent_is_killed(tmp_path):
    """``kill -9`` of ``serve --workers 2`` (an OOM kill, a supervisor's KILL) left both workers serving the port: the
    running fit stayed "running", and the restart failed with "address already in use"."""
    import os
    import signal
    import sqlite3

    data = tmp_path / "data"
    seed_registry(data)
    proc, port = start_on_free_port(lambda port: ([sys.executable, "-m", "service.cli", "serve", "--workers", "2"],
                                                  env_for(data, port)), tmp_path / "server.log")
    url = f"http://127.0.0.1:{port}"
    children: list[int] = []
    try:
        jid = httpx.post(f"{url}/v1/fits", headers=W, json=_long_fit_body("orphan"), timeout=60).json()["id"]
        t0 = time.monotonic()
        while httpx.get(f"{url}/v1/jobs/{jid}", headers=R, timeout=60).json()["state"] != "running":
            assert time.monotonic() - t0 < 60
            time.sleep(0.05)
        children = [int(c) for t in Path(f"/proc/{proc.pid}/task").iterdir()  # no pgrep on a slim machine
                    for c in (t / "children").read_text().split()]
        assert len(children) >= 2, children
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        t0 = time.monotonic()
        while any(_alive(p) for p in children):
            # a worker's SIGTERM shutdown records its running job first: 30 s were not enough at load 6 on 2 cores
            assert time.monotonic() - t0 < 90, f"workers {children} outlived their parent"
            time.sleep(0.1)
        with sqlite3.connect(data / "jobs.sqlite") as c:
            state, error = c.execute("SELECT state, error FROM jobs WHERE id = ?", (jid,)).fetchone()
        assert state == "failed" and "Interrupted" in error, (state, error)
        again = start([sys.executable, "-m", "service.cli", "serve"], env_for(data, port), port,  # the same port
                      tmp_path / "server2.log")
        try:
            assert again.poll() is None  # it holds the port: not "address already in use"
            assert httpx.get(f"{url}/v1/jobs/{jid}", headers=R, timeout=60).json()["state"] == "failed"
        finally:
            stop(again)
    finally:
        if proc.poll() is None:
            stop(proc)
        for p in children:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
