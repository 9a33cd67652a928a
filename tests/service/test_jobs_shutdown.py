"""What a job's record says once its process shuts down: the truth a user reads after the restart.

Real :class:`JobManager` on a real :class:`JobStore`; a job "deaf" to the shutdown blocks on an Event (work that
reports no progress, a native call) until the test lets it end.
"""

from __future__ import annotations

import threading
import time

import pytest
from _api_support import R, W, planted, populate, settings_for
from _jobs_support import slow_job
from fastapi.testclient import TestClient

from service.api import create_app
from service.errors import ServiceStoppingError
from service.jobs import INTERRUPTED, JobManager, JobStore


def _until(check, timeout: float = 30.0):
    """Poll ``check()`` until it returns something true; return it (AssertionError past ``timeout``)."""
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, "never came"
        time.sleep(0.02)
    return got


def _stored(db, job_id):
    return JobStore(db).get(job_id)[0]


@pytest.mark.parametrize("wait_for_jobs", [False, True])
@pytest.mark.parametrize("end", ["raises", "returns"])
def test_a_job_that_ends_on_its_own_after_a_shutdown_recorded_it_interrupted_says_how_it_ended(tmp_path, end,
                                                                                              wait_for_jobs):
    """A job still running when the shutdown recorded it "interrupted" (its process still alive, the job deaf to
    the stop) that then failed on its own error kept "interrupted", its error lost; one that succeeded kept the
    interruption's error beside its result. A user reading the job after the restart read a lie. The real end
    now replaces the provisional record, with the stage it ended in."""
    db = tmp_path / "jobs.sqlite"
    mgr = JobManager(workers=1, max_queued=4, store=JobStore(db))
    mgr.open()
    reported, release = threading.Event(), threading.Event()

    def deaf(ctx):
        ctx.progress("fit", 0.4)
        reported.set()
        release.wait(600)
        if end == "raises":
            raise ValueError("the fit's own failure")
        return {"version": 3}

    try:
        job, _ = mgr.submit(deaf, kind="fit")
        assert reported.wait(10)
        mgr.shutdown(wait=wait_for_jobs, timeout=0.2)  # the wait (if any) ends with the job still running
        provisional = _stored(db, job.id)
        assert (provisional.state, provisional.stage, provisional.error["type"]) == ("failed", "interrupted",
                                                                                     "Interrupted"), provisional
        release.set()
        if end == "raises":
            final = _until(lambda: (j := _stored(db, job.id)).error["type"] != "Interrupted" and j)
            want = ("failed", "fit", {"type": "ValueError", "message": "the fit's own failure"}, None)
        else:
            final = _until(lambda: (j := _stored(db, job.id)).state == "succeeded" and j)
            want = ("succeeded", "done", None, {"version": 3})
        after_restart = JobManager(store=JobStore(db))
        after_restart.open()
        for j in (final, mgr.get(job.id), after_restart.get(job.id)):
            assert (j.state, j.stage, j.error, j.result) == want, j
            assert not j.cancel_requested and "interrupted" not in j.stage_seconds, j
        after_restart.shutdown(wait=True)
    finally:
        release.set()


@pytest.mark.parametrize("wait_for_jobs", [False, True])
def test_a_shutdown_that_waits_records_what_one_that_does_not_records(tmp_path, wait_for_jobs):
    """``shutdown(wait=True)`` set ``cancel_requested`` on every job: one that stopped at it read "cancelled ...
    cancelled during loop", ``cancel_requested: true`` (no client had asked), the queued one "cancelled before it
    started"; ``wait=False`` records "interrupted", the flag as a client left it. Both now record the same."""
    db = tmp_path / "jobs.sqlite"
    mgr = JobManager(workers=1, max_queued=4, store=JobStore(db))
    mgr.open()
    slow, started = slow_job(100_000)
    running, _ = mgr.submit(slow, kind="fit")
    assert started.wait(10)
    queued, _ = mgr.submit(lambda ctx: {}, kind="fit")
    mgr.shutdown(wait=wait_for_jobs)
    mgr.shutdown(wait=True)  # again, waiting: the running job has ended at its next report and written what it makes
    for j, where in ((running, "during 'loop' at "), (queued, "before it started: ")):
        for got in (mgr.get(j.id), _stored(db, j.id)):
            assert (got.state, got.stage, got.error["type"], got.cancel_requested) == ("failed", "interrupted",
                                                                                     "Interrupted", False), got
            assert got.error["message"].startswith(f"interrupted {where}"), got.error


def test_a_submit_that_races_a_shutdown_leaves_no_queued_job_behind(tmp_path):
    """A submit whose record was being written when the shutdown came was refused (a RuntimeError from the stopped
    pool, a 500) but its record stayed "queued" in the store until a restart: a job nobody would run, listed
    queued. It is refused with ServiceStoppingError (503) and its record says it ended, interrupted before it
    started (and is counted so in ``vecbridge_jobs_total``); a submit after the shutdown is refused before it writes
    one."""

    class GatedStore(JobStore):  # the submit's insert waits until the shutdown has happened
        entered, gate = threading.Event(), threading.Event()

        def insert(self, job):
            self.entered.set()
            assert self.gate.wait(30)
            return super().insert(job)

    from service.metrics import ServiceMetrics

    db = tmp_path / "jobs.sqlite"
    metrics = ServiceMetrics()
    mgr = JobManager(workers=1, max_queued=4, store=GatedStore(db), metrics=metrics)
    mgr.open()
    outcome = []

    def submit():
        try:
            outcome.append(mgr.submit(lambda ctx: {}, kind="fit"))
        except Exception as exc:  # noqa: BLE001 - what the submit raised is the finding
            outcome.append(exc)

    racer = threading.Thread(target=submit)
    racer.start()
    assert GatedStore.entered.wait(10)
    mgr.shutdown(wait=True)
    GatedStore.gate.set()
    racer.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], ServiceStoppingError), outcome
    with pytest.raises(ServiceStoppingError):
        mgr.submit(lambda ctx: {}, kind="fit")
    after_restart = JobManager(store=JobStore(db))
    assert after_restart.open() == 0  # nothing left queued to recover
    for jobs in (mgr.list(), JobStore(db).list(), after_restart.list()):
        assert [(j.state, j.stage, j.error["message"].split(":")[0]) for j in jobs] == [
            ("failed", "interrupted", "interrupted before it started")], jobs
    # /metrics counts its end, as the shutdown counts a queued job it ends (it was counted in no state at all)
    assert metrics.registry.get_sample_value("vecbridge_jobs_total", {"state": "failed"}) == 1
    after_restart.shutdown(wait=True)


def test_a_submit_refused_by_a_shutdown_leaves_an_outcome_for_the_id_a_sibling_answered(tmp_path):
    """Two processes on one data dir (``serve --workers 2``): a submit's record is written, its client retries with
    the same Idempotency-Key on the sibling, which answers that job (queued), then the first process shuts down
    and refuses the submit. The refused job's record was deleted: the id the client held answered 404. It now
    reads as ended, interrupted before it started, in every process."""

    class Gated(JobStore):  # the submit's record is written, then its submit is slow to go on
        inserted, gate = threading.Event(), threading.Event()

        def insert(self, job):
            first = super().insert(job)
            self.inserted.set()
            assert self.gate.wait(30)
            return first

    db = tmp_path / "jobs.sqlite"
    first_process, sibling = JobManager(store=Gated(db)), JobManager(store=JobStore(db))
    first_process.open()
    sibling.open()
    outcome = []

    def submit():
        try:
            outcome.append(first_process.submit(lambda ctx: {}, kind="fit", idempotency_key="K", request_hash="h"))
        except Exception as exc:  # noqa: BLE001 - what the submit raised is the finding
            outcome.append(exc)

    racer = threading.Thread(target=submit)
    racer.start()
    assert Gated.inserted.wait(10)
    replayed, created = sibling.submit(lambda ctx: {}, kind="fit", idempotency_key="K", request_hash="h")
    assert (replayed.state, created) == ("queued", False)
    first_process.shutdown(wait=False)
    Gated.gate.set()
    racer.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], ServiceStoppingError), outcome
    for mgr in (sibling, first_process):
        got = mgr.get(replayed.id)
        assert (got.state, got.stage, got.error["type"]) == ("failed", "interrupted", "Interrupted"), got
        assert got.error["message"].startswith("interrupted before it started"), got.error
        assert [j.state for j in mgr.list()] == ["failed"]
    again, created = sibling.submit(lambda ctx: {"again": True}, kind="fit", idempotency_key="K", request_hash="h")
    assert created and again.id != replayed.id  # the refused client's resubmission (as told) is a new job
    assert _until(lambda: (j := sibling.get(again.id)).state == "succeeded" and j).result == {"again": True}
    sibling.shutdown(wait=True)


def test_a_fit_submitted_over_http_after_the_job_service_shut_down_is_a_503_and_no_job(tmp_path):
    """Over HTTP the refused submit was a 500 and ``GET /v1/jobs`` listed the job "queued" until a restart."""
    app = create_app(settings_for(tmp_path))
    with TestClient(app) as c:
        populate(app.state.vb.registry)
        app.state.vb.jobs.shutdown(wait=True)
        X, Y, _ = planted(50)
        r = c.post("/v1/fits", headers=W, json={"name": "f", "source_space": "a", "target_space": "b",
                                                "source": {"vectors": X.tolist()}, "target": {"vectors": Y.tolist()},
                                                "method": "procrustes", "paired": True})
        assert r.status_code == 503 and r.json()["error"]["type"] == "ServiceStoppingError", r.text
        assert c.get("/v1/jobs", headers=R).json()["data"] == []



class _WatchedLock:
    """The manager's lock, with a look at a job's record each time it is let go: what any other thread (a GET, a
    store write) can read. A real lock; only the look is added."""

    def __init__(self):
        self._lock, self.job, self.seen = threading.Lock(), None, []

    def acquire(self, *args, **kwargs):
        return self._lock.acquire(*args, **kwargs)

    def release(self):
        if self.job is not None:
            self.seen.append((self.job.state, self.job.stage, self.job.error))
        self._lock.release()

    __enter__ = acquire

    def __exit__(self, *exc):
        self.release()


@pytest.mark.parametrize("end", ["raises", "returns"])
def test_a_job_ending_after_a_shutdown_never_reads_failed_without_an_error(tmp_path, end):
    """A job recorded interrupted by a shutdown that then ended on its own: its error was cleared (and its stage
    given back) in one hold of the lock and its real end written in a later one, so a reader in between (a GET, a
    record written by another thread) read "failed" with no error. Each state any reader can see is whole now."""
    db = tmp_path / "jobs.sqlite"
    mgr = JobManager(workers=1, store=JobStore(db))
    mgr.open()
    mgr._lock = watched = _WatchedLock()  # before any job: every context is handed this one
    reported, release = threading.Event(), threading.Event()

    def deaf(ctx):
        ctx.progress("fit", 0.4)
        reported.set()
        assert release.wait(60)
        if end == "raises":
            raise ValueError("the fit's own failure")
        return {"version": 3}

    job, _ = mgr.submit(deaf, kind="fit")
    assert reported.wait(10)
    watched.job = job
    mgr.shutdown(wait=False)
    release.set()
    final = _until(lambda: (j := _stored(db, job.id)).stage != "interrupted" and j)  # its real end, written
    assert (final.state, final.stage) == (("failed", "fit") if end == "raises" else ("succeeded", "done")), final
    assert ("failed", "interrupted", INTERRUPTED["type"]) in [(s[0], s[1], (s[2] or {}).get("type"))
                                                             for s in watched.seen], watched.seen
    for state, stage, error in watched.seen:
        assert (error is None) == (state in ("queued", "running", "succeeded")), (state, stage, error)
    mgr.shutdown(wait=True)



def test_a_get_while_a_job_ends_reads_its_record_whole(tmp_path):
    """GET /v1/jobs/{id} read the live job without the lock its end is written under: a job recorded interrupted
    by a shutdown that then failed on its own error read, mid-end, "failed" with no error (a review's reader saw it
    in 151 of 300 tries). Here the GET has the job and begins its answer (the job's clock read) before the end takes
    the lock, and goes on once the end is inside it (its error's message being read): the read waits for the lock
    now, and reads a whole record, before or after the end."""
    from service.ops.jobs import get_job

    mgr = JobManager(workers=1, store=JobStore(tmp_path / "jobs.sqlite"))
    mgr.open()
    reported, release, in_read, mid_end, read = (threading.Event() for _ in range(5))
    answers = []

    class SlowToSay(ValueError):  # its message is read inside the end's hold of the lock
        def __str__(self):
            if not mid_end.is_set():
                mid_end.set()
                read.wait(2)  # the GET's read, which comes now where it does not wait for the lock
            return "the fit's own failure"

    def deaf(ctx):
        ctx.progress("fit", 0.4)
        reported.set()
        assert release.wait(60)
        raise SlowToSay()

    job, _ = mgr.submit(deaf, kind="fit")
    assert reported.wait(10)
    mgr.shutdown(wait=False)
    clock = job.now

    def now():  # the GET's answer begins by reading the job's clock: it goes on once the end is under way
        if threading.current_thread() is reader:
            in_read.set()
            mid_end.wait(2)  # (given up on where the GET holds the lock: the end cannot begin)
        return clock()

    job.now = now
    reader = threading.Thread(target=lambda: answers.append(get_job(mgr, job.id)))
    reader.start()
    assert in_read.wait(10)
    release.set()
    reader.join(30)
    read.set()
    got = answers[0]
    assert (got["state"], (got["error"] or {}).get("type")) in [("failed", "Interrupted"), ("failed", "SlowToSay")], got
    assert _until(lambda: (j := mgr.get(job.id)).stage == "fit" and j).error["type"] == "SlowToSay"
    mgr.shutdown(wait=True)


class _OwnedLock:
    """The manager's lock, knowing which thread holds it. A real lock; only the owner is added."""

    def __init__(self):
        self._lock, self.owner = threading.Lock(), None

    def acquire(self, *args, **kwargs):
        got = self._lock.acquire(*args, **kwargs)
        if got:
            self.owner = threading.get_ident()
        return got

    def release(self):
        self.owner = None
        self._lock.release()

    __enter__ = acquire

    def __exit__(self, *exc):
        self.release()


def test_the_answer_to_a_job_post_reads_the_job_under_its_lock(tmp_path, monkeypatch):
    """The 202 of ``POST /v1/fits`` read ``job.to_dict()`` without the lock the job's worker writes its progress and
    end under: a job already running could be answered with a record torn between two of its writes. Every read of a
    job's record, the answer's included, now holds that lock."""
    from service.job_store import Job

    app = create_app(settings_for(tmp_path))
    unlocked = []
    with TestClient(app) as c:
        populate(app.state.vb.registry)
        owned = app.state.vb.jobs._lock = _OwnedLock()  # before any job: every context is handed this one
        to_dict = Job.to_dict

        def watched(job):
            if owned.owner != threading.get_ident():
                unlocked.append(threading.current_thread().name)
            return to_dict(job)

        monkeypatch.setattr(Job, "to_dict", watched)
        X, Y, _ = planted(50)
        r = c.post("/v1/fits", headers=W, json={"name": "f", "source_space": "a", "target_space": "b",
                                                "source": {"vectors": X.tolist()}, "target": {"vectors": Y.tolist()},
                                                "method": "procrustes", "paired": True})
        assert r.status_code == 202, r.text
        assert r.json()["id"] and r.headers["Location"].endswith(r.json()["id"])
        _until(lambda: c.get(f"/v1/jobs/{r.json()['id']}", headers=R).json()["state"] == "succeeded")
    assert unlocked == [], unlocked
