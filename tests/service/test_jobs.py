"""Background jobs: states, progress, cancellation, bounded queue, idempotency; fit jobs over HTTP."""

from __future__ import annotations

import sqlite3
import threading
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.api import create_app
from align.exceptions import Cancelled
from service.jobs import IdempotencyConflictError, JobManager, JobNotFoundError, QueueFullError
from _jobs_support import http_job, slow_job, wait_job as wait
from _api_support import R, W, planted, populate, settings_for


def test_success_progress_and_timings():
    mgr = JobManager(workers=1, max_queued=4)

    def fn(ctx):
        ctx.progress("load", 0.1)
        ctx.progress("fit", 0.5)
        return {"answer": 42}

    job, created = mgr.submit(fn, kind="t")
    assert created
    wait(mgr.get, job.id)
    d = mgr.get(job.id).to_dict()
    assert d["state"] == "succeeded" and d["result"] == {"answer": 42}
    assert d["progress"] == {"stage": "done", "fraction": 1.0, "stage_elapsed_seconds": None, "stage_eta_seconds": None}
    assert {"load", "fit"} <= set(d["timings"]["stages"]) and d["timings"]["run_seconds"] >= 0
    mgr.shutdown(wait=True)


def test_a_manager_without_a_store_lists_by_state_and_kind_newest_first():
    # GET /v1/jobs?state=...&kind=...&order=newest: the console's polls ask for what may change, not every job
    mgr = JobManager(workers=1, max_queued=8)
    release = threading.Event()
    done = [mgr.submit(lambda ctx: {"i": 1}, kind=k)[0] for k in ("fit", "verify", "fit")]
    for j in done:
        wait(mgr.get, j.id)
    held, _ = mgr.submit(lambda ctx: release.wait(60) and None, kind="migration")
    queued, _ = mgr.submit(lambda ctx: None, kind="fit")
    try:
        assert [j.id for j in mgr.list(("queued", "running"))] == [held.id, queued.id]
        assert [j.id for j in mgr.list(kinds=("fit",))] == [done[0].id, done[2].id, queued.id]
        assert [j.id for j in mgr.page(2, newest=True)] == [queued.id, held.id]
        key = held.seq
        assert [j.id for j in mgr.page(5, key, newest=True, kinds=("fit", "verify"))] == [d.id for d in done[::-1]]
        assert [j.id for j in mgr.page(5, key, states=("queued",))] == [queued.id]
        assert mgr.list(states=()) == []
    finally:
        release.set()
        mgr.shutdown(wait=True)


def test_durations_stay_true_when_the_wall_clock_is_set_back(monkeypatch, tmp_path):
    """Before, run time, stage times and uptime were differences of the wall clock: set back an hour mid-job (NTP,
    a user), they read -3600 s. Now they are the monotonic clock's; timestamps stay epoch seconds."""
    mgr = JobManager(workers=1)
    go = threading.Event()

    def fn(ctx):
        ctx.progress("load", 0.1)
        go.wait(10)
        ctx.progress("fit", 0.5)
        return {}

    app = create_app(settings_for(tmp_path))
    with TestClient(app) as c:
        job, _ = mgr.submit(fn, kind="t")
        wait(mgr.get, job.id, states=("running",))
        wall = time.time
        monkeypatch.setattr(time, "time", lambda: wall() - 3600)
        go.set()
        wait(mgr.get, job.id)
        t = mgr.get(job.id).to_dict()["timings"]
        assert 0 <= t["run_seconds"] < 60 and t["stages"] and all(0 <= s < 60 for s in t["stages"].values())
        assert abs(t["finished_at"] - wall()) < 60  # still an epoch timestamp
        assert 0 <= c.get("/v1/info", headers=R).json()["uptime_seconds"] < 600
    mgr.shutdown(wait=True)


def test_failure_is_recorded():
    mgr = JobManager()

    def fn(ctx):
        raise ValueError("bad params: alpha must be > 0")

    job, _ = mgr.submit(fn, kind="t")
    wait(mgr.get, job.id)
    assert job.state == "failed" and job.error == {"type": "ValueError", "message": "bad params: alpha must be > 0"}
    with pytest.raises(JobNotFoundError):
        mgr.get("nope")
    mgr.shutdown(wait=True)


def test_a_job_failed_by_a_full_disk_records_the_typed_storage_error(tmp_path):
    """A fit or steer job that failed on a full disk recorded ``OperationalError`` with SQLite's raw "database or
    disk is full", where a submit on that disk answers a typed 503 StorageUnavailableError. Now the record says the
    same type and message as that 503."""
    from service.storage import storage_message

    mgr = JobManager()
    raised = []

    def fn(ctx):  # a real SQLITE_FULL: the database may not grow past the pages it has
        db = sqlite3.connect(tmp_path / "d.sqlite")
        try:
            db.execute("CREATE TABLE t (x)")
            db.execute("PRAGMA max_page_count = 1")
            db.execute("INSERT INTO t VALUES (?)", (b"x" * 20000,))
        except sqlite3.OperationalError as exc:
            raised.append(exc)
            raise
        finally:
            db.close()

    job, _ = mgr.submit(fn, kind="fit")
    wait(mgr.get, job.id)
    assert "disk is full" in str(raised[0])
    assert job.state == "failed" and job.error == {"type": "StorageUnavailableError",
                                                   "message": storage_message(raised[0])}, job.error
    assert job.error["message"].startswith("the data directory cannot be written (read-only, immutable or full disk)")
    mgr.shutdown(wait=True)


def test_cancel_running_and_queued_and_queue_bound():
    mgr = JobManager(workers=1, max_queued=1)
    slow, started = slow_job(10_000)
    running, _ = mgr.submit(slow, kind="t")
    assert started.wait(10)
    queued, _ = mgr.submit(lambda ctx: {}, kind="t")
    assert queued.state == "queued"
    with pytest.raises(QueueFullError):
        mgr.submit(lambda ctx: {}, kind="t")
    mgr.cancel(queued.id)
    assert queued.state == "cancelled"
    mgr.cancel(running.id)
    wait(mgr.get, running.id)
    assert running.state == "cancelled" and running.fraction < 1.0
    assert mgr.counts()["cancelled"] == 2
    mgr.shutdown(wait=True)


def test_a_job_cancelled_while_queued_stops_counting_its_queued_seconds():
    """A job cancelled (or interrupted) before it started answered ``queued_seconds`` = now - created_at: a finished
    record whose wait kept growing on every GET, for ever (an hour-old cancel said it had waited an hour)."""
    mgr = JobManager(workers=1, max_queued=1)
    slow, started = slow_job(10_000)
    running, _ = mgr.submit(slow, kind="t")
    assert started.wait(10)
    queued, _ = mgr.submit(lambda ctx: {}, kind="t")
    mgr.cancel(queued.id)
    first = mgr.get(queued.id).to_dict()["timings"]
    time.sleep(0.3)
    later = mgr.get(queued.id).to_dict()["timings"]
    assert later == first
    assert first["queued_seconds"] == pytest.approx(first["finished_at"] - first["created_at"])
    mgr.cancel(running.id)
    mgr.shutdown(wait=True)


def test_idempotency_keys():
    mgr = JobManager()
    a, created_a = mgr.submit(lambda ctx: {"x": 1}, kind="t", idempotency_key="k1", request_hash="h1")
    b, created_b = mgr.submit(lambda ctx: {"x": 2}, kind="t", idempotency_key="k1", request_hash="h1")
    assert created_a and not created_b and a.id == b.id
    with pytest.raises(IdempotencyConflictError):
        mgr.submit(lambda ctx: {}, kind="t", idempotency_key="k1", request_hash="h2")
    c, created_c = mgr.submit(lambda ctx: {}, kind="t", idempotency_key="k2", request_hash="h1")
    assert created_c and c.id != a.id
    mgr.shutdown(wait=True)


def test_job_cancelled_exception_from_progress():
    mgr = JobManager()
    gate = threading.Event()

    def fn(ctx):
        gate.wait(10)
        try:
            ctx.progress("after-cancel", 0.5)
        except Cancelled:
            raise
        return {"should": "not happen"}

    job, _ = mgr.submit(fn, kind="t")
    wait(mgr.get, job.id, states=("running",))
    mgr.cancel(job.id)
    gate.set()
    wait(mgr.get, job.id)
    assert job.state == "cancelled" and job.result is None
    mgr.shutdown(wait=True)


# --- HTTP ---------------------------------------------------------------------------------------
def test_http_queue_full_is_429(tmp_path):
    app = create_app(settings_for(tmp_path, max_queued_jobs=0))
    with TestClient(app) as c:
        populate(app.state.vb.registry)
        slow, started = slow_job(10_000)  # the one job worker is busy: a fit would wait, and no job may
        busy, _ = app.state.vb.jobs.submit(slow, kind="t")
        assert started.wait(10)
        X, Y, _ = planted(50)
        r = c.post("/v1/fits", headers=W, json={"name": "f", "source_space": "a", "target_space": "b",
                                                "source": {"vectors": X.tolist()}, "target": {"vectors": Y.tolist()},
                                                "method": "procrustes", "paired": True})
        assert r.status_code == 429 and r.headers["retry-after"]
        assert "queue is full" in r.json()["error"]["message"]
        app.state.vb.jobs.cancel(busy.id)


def test_a_fit_refused_for_a_full_queue_is_refused_before_its_body_is_parsed(tmp_path):
    """A fit refused because the job queue was full was refused only once its whole body (up to 64 MiB of vectors)
    had been read into memory and parsed, to be dropped: under load, when refusals come most. The 429 now comes
    before the parse: a body that is not even valid JSON at its end is a 429, not the parse's 422. A retry with the
    Idempotency-Key of a job already made still gets that job (200), full queue or not, and a client that waits for
    "100 Continue" is answered at once without sending its body. Real server, real fit in the queue."""
    import json
    import socket

    import httpx
    from _servers import serve_in_thread

    app = create_app(settings_for(tmp_path, job_workers=1, max_queued_jobs=1, max_batch=1_000_000))
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=60) as c:
        jobs = app.state.vb.jobs
        populate(app.state.vb.registry)
        slow, started = slow_job(100_000)
        busy, _ = jobs.submit(slow, kind="t")  # the one worker is busy
        assert started.wait(10)
        X, Y, _ = planted(50)
        body = {"name": "f", "source_space": "a", "target_space": "b", "method": "procrustes", "paired": True,
                "source": {"vectors": X.tolist()}, "target": {"vectors": Y.tolist()}}
        first = c.post("/v1/fits", headers={**W, "Idempotency-Key": "k1"}, json=body)
        assert first.status_code == 202, first.text  # queued: the queue (1 place) is full now
        rng = np.random.default_rng(0)
        big = rng.standard_normal((150_000, 16)).round(6).tolist()
        cut = json.dumps({**body, "source": {"vectors": big}, "target": {"vectors": big}})[:-1].encode()  # 50 MB
        assert len(cut) > 30e6
        for key in (None, "k2"):  # no key, or a key of no job
            r = c.post("/v1/fits", content=cut, headers={**W, "Content-Type": "application/json",
                                                         **({"Idempotency-Key": key} if key else {})})
            assert r.status_code == 429 and float(r.headers["retry-after"]) > 0, (r.status_code, r.text[:300])
            assert "job queue is full" in r.json()["error"]["message"]
        again = c.post("/v1/fits", headers={**W, "Idempotency-Key": "k1"}, json=body)  # a retry: its job
        assert again.status_code == 200 and again.json()["id"] == first.json()["id"], again.text
        other = c.post("/v1/fits", headers={**W, "Idempotency-Key": "k1"}, json={**body, "name": "g"})
        assert other.status_code == 409, other.text  # its key with another body: parsed and refused, as ever
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:  # waits for "100 Continue"
            s.sendall(f"POST /v1/fits HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {W['Authorization']}\r\n"
                      "Content-Type: application/json\r\nContent-Length: 40000000\r\nExpect: 100-continue\r\n\r\n"
                      .encode())
            head = s.recv(65536).split(b"\r\n\r\n")[0].lower()
        assert head.startswith(b"http/1.1 429") and b"connection: close" in head, head
        assert len(jobs.list()) == 2  # the slow job and the first fit: nothing else was queued
        jobs.cancel(first.json()["id"])
        jobs.cancel(busy.id)


def test_max_queued_zero_runs_jobs_on_idle_workers_and_refuses_only_those_that_would_wait():
    """``max_queued_jobs=0`` (the setting accepts it): no job waits. Before, every submit was refused, idle workers
    or not -- every fit a 429 "retry after a job finishes" that no retry could pass, and ``vecbridge serve`` on an
    empty data dir failed its start-up with a traceback (the demo job's submit raised QueueFullError)."""
    mgr = JobManager(workers=1, max_queued=0)
    slow, started = slow_job(10_000)
    running, _ = mgr.submit(slow, kind="t")  # an idle worker takes it at once
    assert started.wait(10)
    with pytest.raises(QueueFullError, match="0 waiting, limit 0"):
        mgr.submit(lambda ctx: {}, kind="t")  # it would wait
    mgr.cancel(running.id)
    wait(mgr.get, running.id)
    done, _ = mgr.submit(lambda ctx: {"ok": 1}, kind="t")  # the worker is free again
    assert wait(mgr.get, done.id).state == "succeeded"
    mgr.shutdown(wait=True)


def test_http_fit_of_a_paired_method_reads_the_rows_as_pairs_by_default(tmp_path):
    """The CLI reads rows as pairs for the paired methods unless told otherwise; HTTP defaulted to unpaired, so
    `{"method": "procrustes", ...}` without `"paired": true` was a 422 for every first try. Same default now."""
    app = create_app(settings_for(tmp_path))
    with TestClient(app) as c:
        X, Y, _ = planted(400)
        body = {"name": "p", "source_space": "a", "target_space": "b", "method": "procrustes",
                "source": {"vectors": X.tolist()}, "target": {"vectors": Y.tolist()}}
        r = c.post("/v1/fits", headers=W, json=body)
        assert r.status_code == 202, r.text
        job = wait(http_job(c, R), r.json()["id"])
        assert job["state"] == "succeeded", job
        out = np.asarray(c.post("/v1/maps/p/transform", headers=R, json={"vectors": X[:50].tolist()}).json()["vectors"])
        cos = np.sum(out * Y[:50], axis=1) / np.linalg.norm(out, axis=1) / np.linalg.norm(Y[:50], axis=1)
        assert cos.min() > 0.99  # the planted rotation, fitted from the pairs
        r = c.post("/v1/fits", headers=W, json={**body, "paired": False})  # said so: unpaired, and refused
        assert r.status_code == 422 and "needs paired rows" in r.json()["error"]["message"]


def test_http_fit_of_paired_rows_needs_a_method_as_the_cli(tmp_path):
    """`"paired": true` with no method queued a minivec2vec fit, which the pairs only judged (an UNRELIABLE version).
    The CLI requires --method; HTTP refuses the body now (nothing queued). An unpaired body without a method is still
    the documented minivec2vec, and so is a paired one with seed pairs (they seed it); an empty method is unknown."""
    app = create_app(settings_for(tmp_path))
    with TestClient(app) as c:
        X, Y, _ = planted(400)
        body = {"name": "p", "source_space": "a", "target_space": "b", "paired": True,
                "source": {"vectors": X.tolist()}, "target": {"vectors": Y.tolist()}}
        for method in ({}, {"method": None}):
            r = c.post("/v1/fits", headers=W, json={**body, **method})
            assert r.status_code == 422, r.text
            assert "needs a method" in r.json()["error"]["message"] and "procrustes" in r.json()["error"]["message"]
        r = c.post("/v1/fits", headers=W, json={**body, "method": ""})
        assert r.status_code == 422 and "unknown method ''" in r.json()["error"]["message"], r.text
        assert c.get("/v1/jobs", headers=R).json()["data"] == []  # refused: no job
        r = c.post("/v1/fits", headers=W, json={**body, "seed_pairs": [[0, 0]]})  # one pair seeds nothing
        assert r.status_code == 422 and "needs a method" in r.text, r.text
        r = c.post("/v1/fits", headers=W, json={**body, "seed_pairs": [[i, i] for i in range(20)]})
        assert r.status_code == 202 and "(minivec2vec)" in r.json()["description"], r.text
        wait(http_job(c, R), r.json()["id"])
        r = c.post("/v1/fits", headers=W, json={**body, "paired": None})  # unpaired by default: minivec2vec
        assert r.status_code == 202, r.text
        assert r.json()["kind"] == "fit" and "(minivec2vec)" in r.json()["description"], r.json()
        assert wait(http_job(c, R), r.json()["id"])["state"] in ("succeeded", "failed")  # not left running


def test_http_fit_validation_before_queueing(tmp_path):
    app = create_app(settings_for(tmp_path))
    with TestClient(app) as c:
        populate(app.state.vb.registry)
        X, Y, Z = planted(50)
        base = {"name": "f", "source_space": "a", "target_space": "c", "method": "procrustes", "paired": True}
        r = c.post("/v1/fits", headers=W, json={**base, "source": {"vectors": X.tolist()},
                                                "target": {"vectors": Y.tolist()}})  # c is 12-d
        assert r.status_code == 422 and "space 'c' is 12-d" in r.json()["error"]["message"]
        r = c.post("/v1/fits", headers=W, json={**base, "source": {"vectors": X.tolist()},
                                                "target": {"vectors": Z[:10].tolist()}})
        assert r.status_code == 422 and r.json()["error"]["type"] == "PairCountError"
        r = c.post("/v1/fits", headers=W, json={**base, "source": {"texts": ["x"]}, "target": {"vectors": [[0.0]]}})
        assert r.status_code == 422 and "encoder" in r.json()["error"]["message"]
        r = c.post("/v1/fits", headers=W, json={**base, "paired": False, "source": {"vectors": X.tolist()},
                                                "target": {"vectors": X.tolist()}})
        assert r.status_code == 422 and "needs paired rows" in r.json()["error"]["message"]
        r = c.post("/v1/fits", headers=W, json={**base, "method": "magic", "source": {}, "target": {}})
        assert r.status_code == 422 and "unknown method 'magic'" in r.json()["error"]["message"]
        r = c.post("/v1/fits", headers=W, json={**base, "source": {"texts": ["x"], "encoder": "no-such-model"},
                                                "target": {"vectors": [[0.0] * 12]}})
        assert r.status_code == 404 and "unknown encoder" in r.json()["error"]["message"]
        # texts embedded by another model than the space's (same width): its vectors were taken for the space's
        app.state.vb.registry.register_space("txt", 384, encoder="all-MiniLM-L6-v2")
        r = c.post("/v1/fits", headers=W, json={**base, "source_space": "txt", "source": {
            "texts": ["x"], "encoder": "multilingual-e5-small"}, "target": {"vectors": [[0.0] * 12]}})
        assert r.status_code == 422 and "space 'txt' is embedded by 'all-MiniLM-L6-v2'" in r.json()["error"]["message"]
        r = c.post("/v1/fits", headers=W, json={**base, "source_space": "txt", "source": {
            "texts": ["a dog", "\u200b"]}, "target": {"vectors": [[0.0] * 12] * 2}})  # refused before a job
        assert r.status_code == 422 and "source texts[1] is empty" in r.json()["error"]["message"], r.text
        r = c.post("/v1/fits", headers=R, json={**base, "source": {}, "target": {}})
        assert r.status_code == 403
        # a steer's texts likewise: fitted on e5 vectors as the space's MiniLM ones, 202
        r = c.post("/v1/steers", headers=W, json={"name": "s", "space": "txt", "texts": ["a dog", "a cat"],
                                                  "labels": [1, -1], "encoder": "multilingual-e5-small"})
        assert r.status_code == 422 and "space 'txt' is embedded by 'all-MiniLM-L6-v2'" in r.text, r.text
        # a side with texts and vectors: the vectors were dropped without a word (202, fitted on the texts)
        r = c.post("/v1/fits", headers=W, json={**base, "source_space": "txt", "source": {
            "texts": ["a dog", "a cat"], "vectors": [[0.0] * 384] * 2}, "target": {"vectors": [[1.0] * 12] * 2}})
        assert r.status_code == 422 and "either texts or vectors, not both" in r.json()["error"]["message"], r.text
        # texts on one side, vectors on the other: the counts differ, known now (was a failed job after embedding)
        r = c.post("/v1/fits", headers=W, json={**base, "source_space": "txt", "source": {
            "texts": ["a dog", "a cat"]}, "target": {"vectors": [[1.0] * 12] * 3}})
        assert r.status_code == 422 and "2 source texts, 3 target rows" in r.json()["error"]["message"], r.text
        assert c.get("/v1/jobs", headers=R).json()["data"] == []
        assert c.get("/v1/jobs/nope", headers=R).status_code == 404
        for method in ("GET", "DELETE"):  # an id of any length was repeated in the 404 (60 KB answers)
            r = c.request(method, "/v1/jobs/" + "a" * 60_000, headers=W)
            assert r.status_code in (404, 422) and len(r.content) < 1000, (r.status_code, len(r.content))


def test_http_idempotency_key(tmp_path):
    app = create_app(settings_for(tmp_path, max_queued_jobs=4))
    with TestClient(app) as c:
        populate(app.state.vb.registry)
        X, Y, _ = planted(60)
        body = {"name": "fit-idem", "source_space": "a", "target_space": "b", "method": "procrustes",
                "paired": True, "source": {"vectors": X.tolist()}, "target": {"vectors": Y.tolist()}}
        # an empty key (a script's unset variable) was a key like any other: the next fit of the same body, days
        # later, answered the first job (200, nothing fitted) and a fit of any other body a 409
        r = c.post("/v1/fits", headers={**W, "Idempotency-Key": ""}, json=body)
        assert r.status_code == 422 and "Idempotency-Key" in r.text, (r.status_code, r.text[:300])
        assert c.get("/v1/jobs", headers=R).json()["data"] == []  # refused: no job
        r1 = c.post("/v1/fits", headers={**W, "Idempotency-Key": "abc"}, json=body)
        r2 = c.post("/v1/fits", headers={**W, "Idempotency-Key": "abc"}, json=body)
        assert r1.status_code == 202 and r2.status_code == 200 and r1.json()["id"] == r2.json()["id"]
        assert r1.headers["location"] == f"/v1/jobs/{r1.json()['id']}"
        r3 = c.post("/v1/fits", headers={**W, "Idempotency-Key": "abc"}, json={**body, "name": "other"})
        assert r3.status_code == 409
        assert len(c.get("/v1/jobs", headers=R).json()["data"]) == 1
        c.delete(f"/v1/jobs/{r1.json()['id']}", headers=W)


def test_http_fit_registers_a_version(tmp_path):
    pytest.importorskip("service.ops.maps")
    app = create_app(settings_for(tmp_path))
    with TestClient(app) as c:
        populate(app.state.vb.registry)
        X, Y, _ = planted(200, seed=3)
        r = c.post("/v1/fits", headers=W, json={
            "name": "a2b-http", "source_space": "a", "target_space": "b", "method": "procrustes", "paired": True,
            "source": {"vectors": X.tolist()}, "target": {"vectors": Y.tolist()}, "alias": "prod"})
        assert r.status_code == 202
        job = wait(http_job(c, R), r.json()["id"])
        assert job["state"] == "succeeded", job
        v = job["result"]["version"]
        assert v["name"] == "a2b-http" and v["version"] == 1 and v["source_dim"] == 16
        out = c.post("/v1/maps/a2b-http@prod/transform", headers=R, json={"vectors": X[:5].tolist(),
                                                                         "output": "frame"}).json()
        ref = app.state.vb.registry.load_map("a2b-http:1").apply(X[:5], output="frame")
        np.testing.assert_allclose(np.array(out["vectors"]), ref, atol=1e-6)
        # the planted rotation is recovered: mapped rows land on their partners
        Yf = app.state.vb.registry.load_map("a2b-http:1").target_frame.apply(Y[:5])
        assert np.all(np.sum(np.array(out["vectors"]) * Yf, axis=1) > 0.99)


@pytest.fixture
def fit_client(tmp_path):
    """An HTTP client of a fresh app whose registry holds spaces ``a`` and ``b``."""
    pytest.importorskip("service.ops.maps")
    app = create_app(settings_for(tmp_path))
    with TestClient(app) as c:
        populate(app.state.vb.registry)
        yield c


def test_http_cancel_stops_a_contrastive_fit_between_epochs(fit_client):
    # the supervised migration families used to run without progress: a long contrastive fit could not be
    # cancelled (its job stayed "running" at 0 %); each epoch now reports, and a cancel stops it there
    c = fit_client
    rng = np.random.default_rng(1)
    X = rng.standard_normal((1000, 16))
    Y = X @ np.linalg.qr(rng.standard_normal((16, 16)))[0] + 0.1 * rng.standard_normal((1000, 16))
    body = {"name": "long", "source_space": "a", "target_space": "b", "method": "contrastive", "paired": True,
            "source": {"vectors": X.tolist()}, "target": {"vectors": Y.tolist()},
            "params": {"epochs": 10_000, "batch_size": 64}}
    jid = c.post("/v1/fits", headers=W, json=body).json()["id"]
    for _ in range(400):  # until it is inside the epochs
        job = c.get(f"/v1/jobs/{jid}", headers=R).json()
        if "contrastive" in str(job["progress"].get("stage")):
            break
        time.sleep(0.05)
    assert "contrastive" in str(job["progress"].get("stage")), job
    r = c.delete(f"/v1/jobs/{jid}", headers=W)  # 202; 200 when the job already stopped before the answer
    assert r.status_code == (200 if r.json()["state"] == "cancelled" else 202), (r.status_code, r.text[:300])
    job = wait(http_job(c, R), jid)
    assert job["state"] == "cancelled" and c.get("/v1/maps/long", headers=R).status_code == 404
    bad = c.post("/v1/fits", headers=W, json={**body, "name": "bad", "params": {"epochs": 10**9}})
    if bad.status_code == 202:  # checked in the job: it fails with the option named
        bad = wait(http_job(c, R), bad.json()["id"])
        assert bad["state"] == "failed" and "contrastive option epochs" in str(bad["error"]), bad
    else:
        assert bad.status_code == 422 and "contrastive option epochs" in bad.text


def test_http_cancel_stops_the_alpha_grid_and_a_longer_grid_is_refused(fit_client):
    """The ridge-penalty grid of a migration fit reported no progress and could not be cancelled: 100,000 ``alphas``
    (a 1 MB request) kept the job at "fit: select", 0 %, for minutes after its cancel; now the grid reports each
    alpha, a cancel stops it there, and more than ``MAX_ALPHAS`` values are a 422."""
    from align.options import MAX_ALPHAS

    c = fit_client
    rng = np.random.default_rng(1)
    X = rng.standard_normal((1000, 16))
    Y = X @ np.linalg.qr(rng.standard_normal((16, 16)))[0]
    body = {"name": "grid", "source_space": "a", "target_space": "b", "method": "auto", "paired": True,
            "source": {"vectors": X.tolist()}, "target": {"vectors": Y.tolist()},
            "params": {"candidates": ["ridge"], "alphas": [0.1] * MAX_ALPHAS}}
    r = c.post("/v1/fits", headers=W, json={**body, "params": {"alphas": [0.1] * (MAX_ALPHAS + 1)}})
    assert r.status_code == 422 and f"alphas: at most {MAX_ALPHAS} values" in r.text, (r.status_code, r.text[:300])
    _cancel_inside(c, c.post("/v1/fits", headers=W, json=body).json()["id"], "select: ridge")


@pytest.mark.parametrize("method, params, message", [
    ("contrastive", {"epochs": 10**9}, "contrastive option epochs"), ("auto", {"alphas": 0.5}, "alphas"),
    ("cluster", {"blend": 1.5}, "blend"), ("auto", {"candidates": "ridge,nope"}, "candidates"),
    ("auto", {"bogus": 1}, "unknown option"), ("minivec2vec", {"n_clusters": "x"}, "n_clusters"),
    ("minivec2vec", {"bogus": 1}, "bad parameter for minivec2vec"), ("ridge", {"bogus": 1}, "bad parameter for ridge"),
    ("lowrank", {}, "needs a rank: params.rank"), ("lowrank", {"rank": "x"}, "rank must be an integer"),
])
def test_http_fit_with_bad_params_is_refused_when_asked_not_by_a_failed_job(fit_client, method, params, message):
    # these were a 202 and a job that failed seconds (or, after the rows were embedded, minutes) later
    rng = np.random.default_rng(2)
    X = rng.standard_normal((60, 16))
    body = {"name": "badp", "source_space": "a", "target_space": "b", "method": method,
            "paired": method != "minivec2vec", "source": {"vectors": X.tolist()}, "target": {"vectors": X.tolist()},
            "params": params}
    r = fit_client.post("/v1/fits", headers=W, json=body)
    assert r.status_code == 422 and message in r.text, (r.status_code, r.text[:300])
    ok = fit_client.post("/v1/fits", headers=W, json={**body, "params": {"rank": 4} if method == "lowrank" else {}})
    assert ok.status_code == 202, ok.text


@pytest.mark.parametrize("method, params, rows, extra, message", [
    ("ridge", {"alpha": -1}, 60, {}, "alpha must be a number"),
    ("ridge", {"fit_intercept": "yes"}, 60, {}, "fit_intercept must be true or false"),
    ("lowrank", {"rank": 0}, 60, {}, "rank must be an integer"),
    ("lowrank", {"rank": 100}, 60, {}, "rank must be in [1, 16]"),
    ("auto", {"rank": 100}, 60, {}, "rank must be in [1, 16]"),  # was cut to 16 and recorded as 100
    ("procrustes", {"scale": "x"}, 60, {}, "scale must be true or false"),
    ("procrustes", {"chunk_size": 0}, 60, {}, "chunk_size must be an integer"),
    ("procrustes", {}, 1, {}, "at least 2 pairs, got 1"),
    ("auto", {}, 3, {}, "at least 4 distinct pairs"),
    ("auto", {"holdout": 0.99}, 60, {}, "holdout 0.99 of 60 pairs holds out 59 and leaves 1 to fit"),
    ("auto", {"semi_supervised": "sinkhorn"}, 60, {}, "this fit is not given both (it would never run)"),
    ("cluster", {"n_clusters": 100}, 60, {}, "n_clusters=100 needs at least 100 pairs, got 60"),
    ("procrustes", {}, 60, {"seed_pairs": [[0, 0]]}, "seed pairs apply to minivec2vec only"),
    ("minivec2vec", {}, 10, {}, "n_clusters=20 needs at least 20 rows, got 10"),
    ("minivec2vec", {"refine": ["clusters"], "refine2_clusters": 500}, 60, {}, "needs at least 500 rows"),
    ("minivec2vec", {"anchor_sample": 10}, 60, {}, "anchor_sample=10 is below n_clusters=20"),
    ("minivec2vec", {"seeded_finish": "no"}, 60, {}, "seeded_finish must be true or false"),
])
def test_http_fit_refuses_bad_values_and_too_few_rows_when_asked_not_by_a_failed_job(fit_client, method, params,
                                                                                     rows, extra, message):
    """The closed-form fits' parameter values (only their names were checked) and every check of the row counts
    (too few rows or pairs, more clusters than pairs, a lowrank rank above the width, seed pairs with a paired
    method) were a 202 and a failed job; ``seeded_finish="no"`` was taken as true and the fit ran."""
    X = np.random.default_rng(2).standard_normal((rows, 16))
    body = {"name": "badr", "source_space": "a", "target_space": "b", "method": method,
            "paired": method != "minivec2vec", "source": {"vectors": X.tolist()}, "target": {"vectors": X.tolist()},
            "params": params, **extra}
    r = fit_client.post("/v1/fits", headers=W, json=body)
    assert r.status_code == 422 and message in r.json()["error"]["message"], (r.status_code, r.text[:300])
    assert fit_client.get("/v1/jobs", headers=R).json()["counts"].get("failed", 0) == 0


def test_a_description_the_registry_refuses_is_refused_before_the_fit(fit_client):
    # a NUL in a fit's description was a 202 and a job that failed after the fit, at registration
    X = np.random.default_rng(3).standard_normal((60, 16))
    body = {"name": "nul", "source_space": "a", "target_space": "b", "method": "procrustes", "paired": True,
            "source": {"vectors": X.tolist()}, "target": {"vectors": X.tolist()}, "description": "a\u0000b"}
    r = fit_client.post("/v1/fits", headers=W, json=body)
    assert r.status_code == 422 and "must not contain NUL" in r.text, (r.status_code, r.text[:300])
    r = fit_client.post("/v1/spaces", headers=W, json={"name": "nulspace", "dim": 4, "description": "x\u0000"})
    assert r.status_code == 422 and "must not contain NUL" in r.text, (r.status_code, r.text[:300])
    assert fit_client.post("/v1/fits", headers=W, json={**body, "description": "ab"}).status_code == 202


def test_http_cancel_job(fit_client):
    c = fit_client
    rng = np.random.default_rng(0)
    Xs, Xt = rng.standard_normal((1000, 16)), rng.standard_normal((1000, 16))
    r = c.post("/v1/fits", headers=W, json={
        "name": "slow", "source_space": "a", "target_space": "b", "method": "minivec2vec",
        "source": {"vectors": Xs.tolist()}, "target": {"vectors": Xt.tolist()}})
    jid = r.json()["id"]
    assert c.delete(f"/v1/jobs/{jid}", headers=R).status_code == 403
    r = c.delete(f"/v1/jobs/{jid}", headers=W)  # 202 while it runs; 200 if it was still queued (cancelled at once)
    assert r.status_code == (200 if r.json()["state"] == "cancelled" else 202), (r.status_code, r.json()["state"])
    job = wait(http_job(c, R), jid)
    assert job["state"] == "cancelled" and job["cancel_requested"]
    assert c.get("/v1/maps/slow", headers=R).status_code == 404
    again = c.delete(f"/v1/jobs/{jid}", headers=W)
    assert again.status_code == 200 and again.json()["state"] == "cancelled"


def _cancel_inside(c, jid: str, stage: str) -> None:
    """Wait until job ``jid`` reports progress in ``stage``, cancel it, and check that it stops within 10 s (the
    stage reports often: one slow step between checks would take minutes)."""
    for _ in range(400):
        job = c.get(f"/v1/jobs/{jid}", headers=R).json()
        if stage in str(job["progress"].get("stage")) or job["state"] != "running":
            break
        time.sleep(0.05)
    assert stage in str(job["progress"].get("stage")), job
    c.delete(f"/v1/jobs/{jid}", headers=W)
    t0 = time.monotonic()
    job = wait(http_job(c, R), jid, timeout=120)
    assert job["state"] == "cancelled" and time.monotonic() - t0 < 10, (job["state"], time.monotonic() - t0)


def test_http_cancel_stops_a_minivec2vec_fit_inside_its_qap_restarts(fit_client):
    """Progress came once per anchor run, after all its QAP restarts: with ``qap_restarts`` large the job sat at
    "fit", 0 %, and its cancel waited for the whole run (``qap_restarts=10**9``: days, the job queue blocked)."""
    X = np.random.default_rng(5).standard_normal((300, 16))
    body = {"name": "qap", "source_space": "a", "target_space": "b", "method": "minivec2vec",
            "source": {"vectors": X.tolist()}, "target": {"vectors": X.tolist()},
            "params": {"n_anchor_runs": 1, "qap_restarts": 3000}}
    _cancel_inside(fit_client, fit_client.post("/v1/fits", headers=W, json=body).json()["id"], "init")


def test_http_cancel_of_a_finished_job_is_a_200_that_changes_nothing(fit_client):
    # it answered 202 ("accepted"), as if the job would still stop
    X = np.random.default_rng(4).standard_normal((60, 16))
    jid = fit_client.post("/v1/fits", headers=W, json={
        "name": "done", "source_space": "a", "target_space": "b", "method": "procrustes", "paired": True,
        "source": {"vectors": X.tolist()}, "target": {"vectors": X.tolist()}}).json()["id"]
    assert wait(http_job(fit_client, R), jid)["state"] == "succeeded"
    r = fit_client.delete(f"/v1/jobs/{jid}", headers=W)
    assert r.status_code == 200 and r.json()["state"] == "succeeded" and not r.json()["cancel_requested"], r.text
    assert fit_client.get("/v1/maps/done", headers=R).status_code == 200


def test_http_fit_that_comes_out_unreliable_says_so_in_its_notes(tmp_path):
    """A fit job whose map is flagged unreliable (a ridge alpha so large the map is constant) succeeded with
    ``notes: []``: over HTTP nothing said what the CLI says ("flagged UNRELIABLE", exit 1). The job still succeeds
    (the version is registered, for inspection), and its notes say the map is unreliable and never a path."""
    app = create_app(settings_for(tmp_path))
    with TestClient(app) as c:
        X, Y, _ = planted(300)
        body = {"name": "http-bad", "source_space": "a", "target_space": "b", "method": "ridge",
                "params": {"alpha": 1e9}, "source": {"vectors": X.tolist()}, "target": {"vectors": Y.tolist()}}
        r = c.post("/v1/fits", headers=W, json=body)
        assert r.status_code == 202, r.text
        job = wait(http_job(c, R), r.json()["id"])
    assert job["state"] == "succeeded" and job["result"]["version"]["metrics"]["reliable"] is False, job
    notes = job["result"]["notes"]
    assert len(notes) == 1 and notes[0].startswith("http-bad:1 is flagged unreliable (top-1 on its own training pairs")
    assert notes[0].endswith("): kept for inspection, never chosen for a path"), notes
