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
from service.jobs import JobManager, JobStore


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
    queued. It is refused with ServiceStoppingError (503) and leaves no record; a submit after the shutdown too."""

    class GatedStore(JobStore):  # the submit's insert waits until the shutdown has happened
        entered, gate = threading.Event(), threading.Event()

        def insert(self, job):
            self.entered.set()
            assert self.gate.wait(30)
            return super().insert(job)

    db = tmp_path / "jobs.sqlite"
    mgr = JobManager(workers=1, max_queued=4, store=GatedStore(db))
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
    after_restart.open()
    assert mgr.list() == [] and JobStore(db).list() == [] and after_restart.list() == []
    after_restart.shutdown(wait=True)


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

