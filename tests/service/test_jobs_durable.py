"""Durable job records (service.jobs.JobStore): survive the process, dead owners' jobs fail, keys persist.

A "dead process" is simulated by a child process that claims an owner, writes rows and is
killed with SIGKILL (its flock is dropped by the kernel, exactly as for a killed server).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from _jobs_support import slow_job, wait_job as wait
from conftest import logged
from _servers import read_line
from service.jobs import (INTERRUPTED, TERMINAL, IdempotencyConflictError, JobManager, JobNotFoundError, JobStore,
                          QueueFullError)


CHILD = textwrap.dedent("""
    import sys, time
    from service.jobs import JobManager, JobStore
    mgr = JobManager(workers=1, max_queued=4, store=JobStore(sys.argv[1], progress_interval=0.0))
    mgr.open()
    gate = time.time() + 600
    def slow(ctx):
        while time.time() < gate:
            ctx.progress("fit", 0.25)
            time.sleep(0.01)
    kind = sys.argv[2]
    running, _ = mgr.submit(slow, kind=kind, idempotency_key="key-running", request_hash="h1")
    queued, _ = mgr.submit(lambda ctx: {}, kind=kind, idempotency_key="key-queued", request_hash="h2")
    while not any(j.id == running.id and j.stage == "fit" for j in mgr.store.list()):  # committed, not just in memory
        time.sleep(0.01)
    print(running.id, queued.id, flush=True)
    time.sleep(600)
""")


def _killed_child(db, kind: str = "fit") -> tuple[str, str]:
    """Run a process that holds one running and one queued job of ``kind``, then SIGKILL it; returns their ids."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(db), kind], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        line = read_line(proc).split()
        assert len(line) == 2, "child did not start its jobs"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    return line[0], line[1]


def test_killed_process_jobs_are_failed_on_restart(tmp_path):
    db = tmp_path / "jobs.sqlite"
    running_id, queued_id = _killed_child(db)
    store = JobStore(db)
    before = {j.id: j.state for j in store.list()}
    assert before == {running_id: "running", queued_id: "queued"}  # what the killed process last wrote
    mgr = JobManager(store=store)
    assert mgr.open() == 2
    assert [p.stem for p in store.owners_dir.glob("*.lock")] == [store.owner]  # the dead owner's lock is swept
    for jid, where in ((running_id, "during 'fit' at 25%"), (queued_id, "before it started")):
        j = mgr.get(jid).to_dict()  # the stage it died in is named (it was "interrupted by restart: ..." alone)
        assert j["state"] == "failed" and j["error"]["type"] == INTERRUPTED["type"]
        assert j["error"]["message"] == INTERRUPTED["message"].replace(":", f" {where}:", 1)
    run = mgr.get(running_id)
    assert run.stage == "interrupted" and run.started_at is not None and run.finished_at >= run.started_at
    assert run.stage_seconds == {"starting": pytest.approx(run.stage_seconds["starting"])}  # timings kept
    # idempotency keys outlive the process: same key + same body -> that job; another body -> conflict
    again, created = mgr.submit(lambda ctx: {}, kind="fit", idempotency_key="key-running", request_hash="h1")
    assert not created and again.id == running_id and again.state == "failed"
    with pytest.raises(IdempotencyConflictError):
        mgr.submit(lambda ctx: {}, kind="fit", idempotency_key="key-queued", request_hash="other")
    assert mgr.open() == 0  # nothing left to recover
    mgr.shutdown(wait=True)


def test_a_killed_job_does_not_count_the_downtime_as_its_run_time(tmp_path):
    """Before, a job a crash stopped got ``finished_at`` = the restart: killed 4 s into a fit and restarted 30 s
    later, it reported ``run_seconds`` 38.8. Now it ends at its last progress report before the kill."""
    db = tmp_path / "jobs.sqlite"
    running_id, queued_id = _killed_child(db)
    killed = time.time()
    time.sleep(1.5)  # the service is down
    mgr = JobManager(store=JobStore(db))
    assert mgr.open() == 2
    run, queued = mgr.get(running_id).to_dict()["timings"], mgr.get(queued_id).to_dict()["timings"]
    assert run["started_at"] <= run["finished_at"] <= killed and 0 <= run["run_seconds"] <= killed - run["started_at"]
    assert queued["finished_at"] <= killed and queued["run_seconds"] is None
    mgr.shutdown(wait=True)


def test_a_killed_job_of_a_release_without_saved_at_ends_after_its_stages(tmp_path):
    """A row written before the ``saved_at`` column (upgrading from such a release) has no last write: it was
    given ``finished_at`` = ``started_at``, ``run_seconds`` 0 beside 5 s of recorded stages. Now its closed stages'
    seconds after its start."""
    import json
    import sqlite3

    db = tmp_path / "jobs.sqlite"
    running_id, _ = _killed_child(db)
    with sqlite3.connect(db) as c:  # as an older release left it: no saved_at, two closed stages
        c.execute("UPDATE jobs SET saved_at = NULL, stage_seconds = ? WHERE id = ?",
                  (json.dumps({"validate": 0.25, "fit": 5.0}), running_id))
    mgr = JobManager(store=JobStore(db))
    assert mgr.open() == 2
    run = mgr.get(running_id).to_dict()["timings"]
    assert run["run_seconds"] == pytest.approx(5.25) and run["finished_at"] == pytest.approx(run["started_at"] + 5.25)
    mgr.shutdown(wait=True)


def test_finished_jobs_answer_after_restart(tmp_path):
    db = tmp_path / "jobs.sqlite"
    mgr = JobManager(store=JobStore(db))
    mgr.open()

    def fn(ctx):
        ctx.progress("load", 0.3)
        ctx.progress("fit", 0.6)
        return {"ref": "m:1"}

    ok, _ = mgr.submit(fn, kind="fit", description="fit m")
    bad, _ = mgr.submit(lambda ctx: 1 / 0, kind="fit")
    wait(mgr.get, ok.id)
    wait(mgr.get, bad.id)
    want_ok, want_bad = mgr.get(ok.id).to_dict(), mgr.get(bad.id).to_dict()
    mgr.shutdown(wait=True)

    fresh = JobManager(store=JobStore(db))  # a new process reading the same file
    assert fresh.open() == 0
    got_ok, got_bad = fresh.get(ok.id).to_dict(), fresh.get(bad.id).to_dict()
    assert got_ok["state"] == "succeeded" and got_ok["result"] == {"ref": "m:1"}
    assert got_ok["progress"] == want_ok["progress"] and got_ok["timings"] == want_ok["timings"]
    assert got_bad["state"] == "failed" and got_bad["error"] == want_bad["error"]
    assert [j.id for j in fresh.list()] == [ok.id, bad.id]
    with pytest.raises(JobNotFoundError):
        fresh.get("nope")
    fresh.shutdown(wait=True)


def test_live_sibling_jobs_are_not_failed_and_can_be_cancelled(tmp_path):
    """Two managers on one file (as two uvicorn workers): each sees the other's live job, none fails it."""
    db = tmp_path / "jobs.sqlite"
    a = JobManager(store=JobStore(db, progress_interval=0.0))
    a.open()
    slow, started = slow_job(20_000)
    job, _ = a.submit(slow, kind="t", idempotency_key="k", request_hash="h")
    assert started.wait(10)
    b = JobManager(store=JobStore(db))
    assert b.open() == 0  # a's owner lock is held: its job is alive
    seen = b.get(job.id)
    assert seen.state == "running"
    same, created = b.submit(lambda ctx: {}, kind="t", idempotency_key="k", request_hash="h")
    assert not created and same.id == job.id  # the key is shared across processes
    b.cancel(job.id)  # through the store; a notices at its next progress write
    assert wait(a.get, job.id).state == "cancelled"
    assert wait(b.get, job.id).state == "cancelled"
    a.shutdown(wait=True)
    b.shutdown(wait=True)


def test_a_queued_job_cancelled_through_a_sibling_is_cancelled_at_once_everywhere(tmp_path):
    """``serve --workers 2``: DELETE of a queued job that the other worker owns answered 202 "queued" and the job
    stayed queued (its owner even answered ``cancel_requested: false``) until the fit ahead of it ended, maybe
    hours later, holding a place in that worker's queue all the while; the documented answer is a 200 "cancelled"."""
    db = tmp_path / "jobs.sqlite"
    a = JobManager(workers=1, max_queued=2, store=JobStore(db, progress_interval=0.0))
    a.open()
    slow, started = slow_job(20_000)
    running, _ = a.submit(slow, kind="t")
    assert started.wait(10)
    ran = threading.Event()
    queued, _ = a.submit(lambda ctx: ran.set(), kind="t")
    unasked, _ = a.submit(lambda ctx: ran.set(), kind="t")  # its owner is not asked about it before its turn
    b = JobManager(store=JobStore(db))
    b.open()
    got = b.cancel(queued.id)
    assert got.state == "cancelled" and got.error["message"] == "cancelled before it started", got
    mine = a.get(queued.id)  # the owner answers the same record, and its queue has room again
    assert mine.state == "cancelled" and mine.cancel_requested and mine.started_at is None, mine
    assert mine.to_dict() == b.get(queued.id).to_dict()  # one record, whichever process answers
    assert a.local_counts()["queued"] == 1 and a.counts()["queued"] == 1
    assert b.cancel(queued.id).state == "cancelled"  # again: idempotent
    assert b.cancel(unasked.id).state == "cancelled"
    told = b.get(unasked.id).to_dict()
    a.cancel(running.id)
    assert wait(a.get, running.id).state == "cancelled"
    time.sleep(0.5)  # the worker reaches the unasked one, finds it cancelled and takes that record
    other, _ = a.submit(lambda ctx: {}, kind="t")
    assert wait(a.get, other.id).state == "succeeded"  # after the worker passed the cancelled ones
    assert not ran.is_set()  # neither ran
    assert b.get(unasked.id).to_dict() == told == a.get(unasked.id).to_dict()  # never "running" in between
    assert [j.state for j in a.list()] == ["cancelled", "cancelled", "cancelled", "succeeded"]
    a.shutdown(wait=True)
    b.shutdown(wait=True)


def test_a_retry_with_its_key_gets_its_job_even_when_the_queue_is_full(tmp_path):
    """A retried POST whose Idempotency-Key made a job before a restart (or on the sibling worker) was a 429 "job queue
    is full" while this process's queue was full, and a reused key with another body a 429 instead of the 409: the
    replay is answered from the store as when the queue has room."""
    db = tmp_path / "jobs.sqlite"
    before = JobManager(store=JobStore(db))
    before.open()
    first, _ = before.submit(lambda ctx: {"ref": "m:1"}, kind="fit", idempotency_key="k", request_hash="h")
    wait(before.get, first.id)
    before.shutdown(wait=True)
    mgr = JobManager(workers=1, max_queued=0, store=JobStore(db))  # after the restart: one worker, busy
    mgr.open()
    slow, started = slow_job(20_000)
    busy, _ = mgr.submit(slow, kind="t")
    assert started.wait(10)
    with pytest.raises(QueueFullError):
        mgr.submit(lambda ctx: {}, kind="t", idempotency_key="new", request_hash="h")
    for key in (None, "new"):  # what a face asks before it reads the body: refused, as the submit would be
        with pytest.raises(QueueFullError, match="job queue is full"):
            mgr.check_room(key)
    mgr.check_room("k")  # the store's key: not refused, the submit answers its job
    again, created = mgr.submit(lambda ctx: {}, kind="fit", idempotency_key="k", request_hash="h")
    assert not created and again.id == first.id and again.result == {"ref": "m:1"}
    with pytest.raises(IdempotencyConflictError):
        mgr.submit(lambda ctx: {}, kind="fit", idempotency_key="k", request_hash="other")
    mgr.cancel(busy.id)
    mgr.shutdown(wait=True)


def test_memory_only_manager_still_works_without_a_store():
    mgr = JobManager()
    assert mgr.open() == 0
    job, _ = mgr.submit(lambda ctx: {"x": 1}, kind="t")
    assert wait(mgr.get, job.id).result == {"x": 1}
    mgr.shutdown(wait=True)


def test_http_job_answers_after_app_restart(tmp_path):
    """A fit job over HTTP, then a fresh app on the same data dir: GET /v1/jobs/{id} still answers."""
    from fastapi.testclient import TestClient

    from service.api import create_app
    from _api_support import R, W, planted, populate, settings_for

    X, Y, _ = planted(80)
    body = {"name": "f", "source_space": "a", "target_space": "b", "method": "procrustes", "paired": True,
            "source": {"vectors": X.tolist()}, "target": {"vectors": Y.tolist()}}
    app = create_app(settings_for(tmp_path))
    with TestClient(app) as c:
        populate(app.state.vb.registry)
        r = c.post("/v1/fits", headers={**W, "Idempotency-Key": "fit-f-1"}, json=body)
        assert r.status_code == 202, r.text
        jid = r.json()["id"]
        while c.get(f"/v1/jobs/{jid}", headers=R).json()["state"] not in TERMINAL:
            time.sleep(0.05)
        first = c.get(f"/v1/jobs/{jid}", headers=R).json()
    assert first["state"] == "succeeded", first
    app2 = create_app(settings_for(tmp_path))
    with TestClient(app2) as c:
        again = c.get(f"/v1/jobs/{jid}", headers=R)
        assert again.status_code == 200 and again.json() == first
        assert jid in [j["id"] for j in c.get("/v1/jobs", headers=R).json()["data"]]
        replay = c.post("/v1/fits", headers={**W, "Idempotency-Key": "fit-f-1"}, json=body)
        assert replay.status_code == 200 and replay.json()["id"] == jid  # no second fit after a restart
        other = c.post("/v1/fits", headers={**W, "Idempotency-Key": "fit-f-1"}, json={**body, "name": "g"})
        assert other.status_code == 409


def test_counts_come_from_the_store_not_the_process(tmp_path):
    """A restarted process (or another replica) lists the stored jobs and counts them too."""
    db = tmp_path / "jobs.sqlite"
    first = JobManager(workers=1, max_queued=4, store=JobStore(db))
    first.open()
    done = [first.submit(lambda ctx: {"ok": True}, kind="fit")[0] for _ in range(2)]
    for j in done:
        wait(first.get, j.id)
    failed, _ = first.submit(lambda ctx: 1 / 0, kind="fit")
    wait(first.get, failed.id)
    first.shutdown(wait=True)
    second = JobManager(workers=1, max_queued=4, store=JobStore(db))
    second.open()
    listed = second.list()
    counts = second.counts()
    assert len(listed) == 3 and counts["succeeded"] == 2 and counts["failed"] == 1
    assert counts == {s: sum(j.state == s for j in listed) for s in counts}
    assert second.local_counts()["succeeded"] == 0  # this process ran none: its own gauges stay 0
    second.shutdown(wait=True)


def test_a_numpy_result_and_a_huge_error_are_stored_as_their_process_sees_them(tmp_path):
    # a result holding numpy numbers could not be written as JSON: the write was skipped with a warning, so
    # the stored row said "running" for good (every sibling process answered that, and after a restart it
    # became "interrupted" though the job had succeeded); a 1 MB error message was stored, listed and logged
    import numpy as np

    db = tmp_path / "jobs.sqlite"
    mgr = JobManager(workers=1, max_queued=4, store=JobStore(db))
    mgr.open()
    ok, _ = mgr.submit(lambda ctx: {"score": np.float32(0.5), "n": np.int64(3), "row": np.arange(2.0)}, kind="t")

    def boom(ctx):
        raise ValueError("x" * 1_000_000)

    bad, _ = mgr.submit(boom, kind="t")
    wait(mgr.get, ok.id)
    wait(mgr.get, bad.id)
    mgr.shutdown(wait=True)  # the worker has written its record: memory says an end just before the row does
    sibling = JobStore(db)  # what another process of the data dir reads
    stored_ok, _ = sibling.get(ok.id)
    assert stored_ok.state == "succeeded" and stored_ok.result == {"score": 0.5, "n": 3, "row": [0.0, 1.0]}
    stored_bad, _ = sibling.get(bad.id)
    assert stored_bad.state == "failed" and stored_bad.error["type"] == "ValueError"
    assert stored_bad.error["message"].startswith("xxx") and len(stored_bad.error["message"]) < 5000
    assert "more characters" in stored_bad.error["message"]


def test_finished_records_are_trimmed_while_the_process_runs(tmp_path):
    """Old finished records were deleted only at start-up: a server that ran for months kept every one."""
    store = JobStore(tmp_path / "jobs.sqlite", keep_finished=5, trim_every=10)
    mgr = JobManager(workers=1, max_queued=100, store=store)
    mgr.open()
    ids = []
    for _ in range(40):
        job, _ = mgr.submit(lambda ctx: {"ok": 1}, kind="fit")
        ids.append(job.id)
        wait(mgr.get, job.id)
    kept = [j.id for j in JobStore(tmp_path / "jobs.sqlite").list()]
    assert 5 <= len(kept) <= 5 + 10  # at most one turn of new records past the bound
    assert set(kept) <= set(ids[-15:])  # the newest are kept
    mgr.shutdown(wait=True)


def test_a_final_record_that_could_not_be_written_is_written_later(tmp_path):
    """A job that ended while the store was locked (a backup, a sibling) or its disk full stayed "running" in
    the store for ever: every other process, and this one after a restart, reported it running. The next
    write of any job of the process now writes it."""
    import sqlite3
    import threading

    db = tmp_path / "jobs.sqlite"
    mgr = JobManager(workers=1, max_queued=4, store=JobStore(db, busy_timeout=0.2))
    mgr.open()
    go = threading.Event()
    first, _ = mgr.submit(lambda ctx: go.wait(30) and {"done": 1}, kind="fit")
    other = JobStore(db)  # what another process reads
    while other.get(first.id)[0].state != "running":
        time.sleep(0.01)
    locker = sqlite3.connect(db, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")  # a backup holds the file while the job ends
    go.set()
    wait(mgr.get, first.id)  # done in this process; its final write fails (the store is locked)
    deadline = time.monotonic() + 30  # the write gives up after busy_timeout (0.2 s): not a fixed sleep, which a
    while first.id not in mgr._unsaved:  # loaded machine outran, so the write landed after the COMMIT
        assert time.monotonic() < deadline, "the final write never failed"
        time.sleep(0.01)
    locker.execute("COMMIT")
    locker.close()
    assert other.get(first.id)[0].state == "running"
    second, _ = mgr.submit(lambda ctx: {"done": 2}, kind="fit")
    wait(mgr.get, second.id)
    # the second job's state is final in memory a moment before its record (and the first's, written again on the
    # way) reaches the store: wait for the store, not for the manager (1 run in 8 read it in between)
    deadline = time.monotonic() + 30
    while other.get(second.id)[0].state != "succeeded":
        assert time.monotonic() < deadline, "the second job's final record never reached the store"
        time.sleep(0.01)
    done = other.get(first.id)[0]
    assert done.state == "succeeded" and done.result == {"done": 1}
    mgr.shutdown(wait=True)


def _shut_down_mid_fit(db, stage: str, fraction: float, *, queue_another: bool = False, kind: str = "fit"):
    """A manager on ``db`` running a fit that reports ``(stage, fraction)`` over and over (and, with
    ``queue_another``, a second job waiting behind it), shut down as a server stopping does once the fit runs.
    Returns ``(manager, fit job, queued job or None)`` once the fit has reached its next progress report and its
    worker has had time to write what it makes of that."""
    mgr = JobManager(workers=1, max_queued=4, store=JobStore(db))
    mgr.open()
    started, stopped = threading.Event(), threading.Event()

    def fit(ctx):
        try:
            ctx.progress(stage, fraction)
            started.set()
            while True:
                ctx.progress(stage, fraction)
                time.sleep(0.001)
        finally:
            stopped.set()

    job, _ = mgr.submit(fit, kind=kind)
    queued = mgr.submit(lambda ctx: {}, kind=kind)[0] if queue_another else None
    assert started.wait(10)
    mgr.shutdown(wait=False)  # a server stopping
    assert stopped.wait(10)  # the job reached its next progress report before the process ended
    time.sleep(0.5)  # its worker writes what it makes of that
    return mgr, job, queued


def test_a_job_a_shutdown_interrupted_stays_interrupted_when_it_reaches_its_next_progress_report(tmp_path):
    """SIGTERM with a fit running: shutdown recorded the job "failed, interrupted", then the job's next progress
    report raised Cancelled and its worker rewrote the record "cancelled ... cancelled during <stage>": a
    cancel nobody asked for, and ``Client.wait`` raised JobCancelledError instead of JobFailedError."""
    db = tmp_path / "jobs.sqlite"
    mgr, job, _ = _shut_down_mid_fit(db, "fit", 0.5)
    stored, _ = JobStore(db).get(job.id)
    assert (stored.state, stored.stage, stored.error["type"]) == ("failed", "interrupted", "Interrupted"), stored
    assert mgr.get(job.id).state == "failed"


def test_a_shutdown_is_no_cancel_and_names_the_stage_it_interrupted(tmp_path):
    """A server restart mid-fit left ``cancel_requested: true`` on the job though no client had cancelled it, and its
    progress (0.7) belonged to a stage named nowhere (the stage read "interrupted"). The interruption stays apart
    from a cancel, and the error says which stage it stopped in and how far it had got."""
    db = tmp_path / "jobs.sqlite"
    mgr, job, queued = _shut_down_mid_fit(db, "fit: restart 0: icp", 0.7, queue_another=True)
    after_restart = JobManager(store=JobStore(db))
    after_restart.open()
    try:
        for j in (after_restart.get(job.id).to_dict(), mgr.get(job.id).to_dict()):
            assert (j["state"], j["cancel_requested"], j["error"]["type"]) == ("failed", False, "Interrupted"), j
            assert j["error"]["message"].startswith("interrupted during 'fit: restart 0: icp' at 70%: the process "
                                                    "serving this job shut down"), j["error"]
        q = after_restart.get(queued.id).to_dict()
        assert q["cancel_requested"] is False and q["error"]["message"].startswith("interrupted before it started:")
    finally:
        after_restart.shutdown(wait=True)


def test_concurrent_submits_never_queue_more_than_the_limit(tmp_path):
    """The queue bound held only for submits one at a time: the check ran under the lock, but the job joined the
    queue after the store's insert (an SQLite commit, outside the lock), so submits arriving together all saw the
    queue empty: twelve at once with a bound of 2 queued all twelve (CI: the overload of 10 fits got 202 for all)."""
    mgr = JobManager(workers=1, max_queued=2, store=JobStore(tmp_path / "jobs.sqlite"))
    mgr.open()
    release, started = threading.Event(), threading.Event()

    def hold(ctx):
        started.set()
        release.wait(30)

    mgr.submit(hold, kind="t")
    assert started.wait(10)  # the worker is busy: every later job waits in the queue
    go = threading.Barrier(12)
    outcomes = []

    def one():
        go.wait(timeout=60)  # broken (BrokenBarrierError) if a thread never comes: no thread left waiting for good
        try:
            outcomes.append(mgr.submit(lambda ctx: {}, kind="t")[0].state)
        except QueueFullError:
            outcomes.append("refused")

    threads = [threading.Thread(target=one) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert sorted(outcomes) == ["queued"] * 2 + ["refused"] * 10, outcomes
        assert mgr.local_counts()["queued"] == 2
    finally:
        release.set()
        mgr.shutdown(wait=True)


@pytest.mark.parametrize("wait_for_jobs", [False, True])
def test_a_final_record_that_could_not_be_written_is_written_at_shutdown(tmp_path, wait_for_jobs):
    """A job's final write failed (the store locked, its disk full) and no other job wrote after it: only another
    job's write retried it, shutdown wrote only unfinished jobs (none with wait=True), so the store kept "running"
    and the next start said "interrupted by restart" for a job that had succeeded. shutdown now writes it."""
    import sqlite3

    class Flaky(JobStore):
        failed = 0

        def save(self, job, *, was=None):
            if job.state in TERMINAL and not self.failed:
                self.failed += 1
                raise sqlite3.OperationalError("database is locked")
            return super().save(job, was=was)

    db = tmp_path / "jobs.sqlite"
    store = Flaky(db)
    mgr = JobManager(workers=1, max_queued=4, store=store)
    mgr.open()
    job, _ = mgr.submit(lambda ctx: {"done": 1}, kind="fit")
    wait(mgr.get, job.id)
    deadline = time.monotonic() + 30
    while job.id not in mgr._unsaved:  # the failed final write is kept for a retry once _persist returns
        assert time.monotonic() < deadline, "the final write never failed"
        time.sleep(0.01)
    assert store.failed == 1 and JobStore(db).get(job.id)[0].state == "running"
    mgr.shutdown(wait=wait_for_jobs)
    stored = JobStore(db).get(job.id)[0]
    assert (stored.state, stored.result) == ("succeeded", {"done": 1}) and not mgr._unsaved


def test_a_filtered_page_is_full_when_this_process_knows_a_stored_record_is_stale(tmp_path):
    """A job ended in this process but its final write failed (the store locked, its disk full): the store still says
    "running". A page of running jobs took `limit` stored rows and then dropped that job by its true state, so
    `?state=running&order=newest&limit=2` held one job and no `next` while two more were running. It is refilled."""
    import sqlite3

    class Stale(JobStore):
        def save(self, job, *, was=None):
            if job.state in TERMINAL and job.kind == "stale":
                raise sqlite3.OperationalError("database or disk is full")
            return super().save(job, was=was)

    db = tmp_path / "jobs.sqlite"
    mgr = JobManager(workers=4, max_queued=8, store=Stale(db))
    mgr.open()
    release = threading.Event()
    try:
        held = [mgr.submit(lambda ctx: release.wait(60) and None, kind="fit")[0] for _ in range(3)]
        for j in held:
            wait(mgr.get, j.id, states=("running",))
        stale, _ = mgr.submit(lambda ctx: {"done": 1}, kind="stale")  # the newest job
        wait(mgr.get, stale.id)
        assert JobStore(db).get(stale.id)[0].state == "running"  # the store's record is behind this process's
        newest_running = [j.id for j in held[::-1]]
        assert [j.id for j in mgr.page(2, newest=True, states=("running",))] == newest_running[:2]
        assert [j.id for j in mgr.page(3, newest=True, states=("running",))] == newest_running
        assert [j.id for j in mgr.page(5, states=("running",))] == newest_running[::-1]
        assert [j.id for j in mgr.page(2, newest=True, states=("succeeded",))] == []
    finally:
        release.set()
        mgr.shutdown(wait=True)


def test_an_interrupted_migration_says_resubmitting_resumes_it_not_to_check_a_maps_versions(tmp_path):
    """A migration job stopped by a shutdown or a crash said "check the map's versions before resubmitting", a
    fit's advice: its checkpoint makes the same request resume where it stopped, which it now says. A fit's advice
    names how to tell whether its version was registered (stopped in 'register', after the commit, it may be)."""
    killed = tmp_path / "killed.sqlite"
    running_id, queued_id = _killed_child(killed, "migration")
    mgr = JobManager(store=JobStore(killed))
    assert mgr.open() == 2
    stopped = tmp_path / "stopped.sqlite"
    _, job, _ = _shut_down_mid_fit(stopped, "migrate", 0.5, kind="migration")
    said = [mgr.get(running_id).error["message"], mgr.get(queued_id).error["message"],
            JobStore(stopped).get(job.id)[0].error["message"]]
    for msg in said:
        assert "resumes it from its checkpoint" in msg and "versions" not in msg, msg
    assert said[0].startswith("interrupted by restart during 'fit' at 25%: ") and said[2].startswith(
        "interrupted during 'migrate' at 50%: the process serving this job shut down before it finished; "), said
    mgr.shutdown(wait=True)
    fit_id, _ = _killed_child(tmp_path / "fit.sqlite")  # a fit's advice stays
    fits = JobManager(store=JobStore(tmp_path / "fit.sqlite"))
    assert fits.open() == 2
    fit_said = fits.get(fit_id).error["message"]  # and it names how to tell whether the version was registered
    assert "may have registered its version" in fit_said and "GET /v1/maps/NAME/versions" in fit_said, fit_said
    fits.shutdown(wait=True)


def test_a_shutdown_that_waits_gives_up_on_a_job_deaf_to_its_cancel_and_records_it(tmp_path):
    """``shutdown(wait=True)`` waited with no limit for a job whose work never reports progress (so never sees its
    cancel), and the job queued behind it stayed "queued" for ever. Now the wait ends at its ``timeout``: the job
    still running is recorded interrupted (in memory, in the store a restart reads) and logged, the queued one
    interrupted before it started, as ``wait=False`` records them (no cancel: nobody asked for one); the deaf job's
    work, when it ends later, still writes its end."""
    from service.metrics import ServiceMetrics

    db = tmp_path / "jobs.sqlite"
    metrics = ServiceMetrics()
    mgr = JobManager(workers=1, max_queued=4, store=JobStore(db), metrics=metrics)
    mgr.open()
    reported, release = threading.Event(), threading.Event()

    def deaf(ctx):  # one report, then work that reports nothing (a native call): it never sees a cancel
        ctx.progress("fit", 0.4)
        reported.set()
        release.wait(600)
        return {"done": 1}

    try:
        stuck, _ = mgr.submit(deaf, kind="fit")
        assert reported.wait(10)
        queued, _ = mgr.submit(lambda ctx: {}, kind="fit")
        with logged("vecbridge.jobs") as seen:
            mgr.shutdown(wait=True, timeout=0.5)
        after_restart = JobManager(store=JobStore(db))
        after_restart.open()
        for j in (mgr.get(stuck.id), JobStore(db).get(stuck.id)[0], after_restart.get(stuck.id)):
            assert (j.state, j.stage, j.error["type"], j.cancel_requested) == ("failed", "interrupted", "Interrupted",
                                                                              False), j
            assert j.error["message"].startswith("interrupted during 'fit' at 40%: the process serving this job "
                                                 "shut down"), j.error
        for j in (mgr.get(queued.id), after_restart.get(queued.id)):
            assert (j.state, j.cancel_requested) == ("failed", False), j
            assert j.error["message"].startswith("interrupted before it started: the process serving"), j.error
        [line] = [r for r in seen if r.getMessage() == "jobs still running at shutdown recorded interrupted"]
        assert line.fields["jobs"] == [stuck.id]
        # /metrics agrees: the queued job counted once (it never runs), nothing left queued or running
        sample = metrics.registry.get_sample_value
        assert sample("vecbridge_jobs_total", {"state": "failed"}) == 1
        assert (sample("vecbridge_jobs_queued"), sample("vecbridge_jobs_running")) == (0, 0)
        release.set()
        for get in (mgr.get, lambda i: JobStore(db).get(i)[0]):  # its own end, no interruption's error beside it
            done = wait(get, stuck.id, states=("succeeded",))
            assert (done.result, done.error, done.stage) == ({"done": 1}, None, "done"), done
        after_restart.shutdown(wait=True)
    finally:
        release.set()
