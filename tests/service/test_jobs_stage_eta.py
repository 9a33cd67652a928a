"""A stage's ETA counts the fraction done in this run (QA, session 53): a resumed migration reports done/total from
its checkpoint, and ``e (1 - f) / f`` took the checkpoint's rows for this run's work (20x too small at 75 %)."""

from __future__ import annotations

import threading

import pytest

from service.job_context import JobContext
from service.job_store import Job, JobStore


def test_the_eta_of_a_stage_that_began_past_zero_counts_from_where_it_began(tmp_path):
    job = Job(id="j1", kind="migration", state="running")
    job.started_at = job.now() - 10.0
    ctx = JobContext(job, threading.Lock())
    ctx.progress("connect", 0.0)
    ctx.progress("migrate", 0.75)  # the first batch of a resume: 15,000 of 20,000 rows were done before
    ctx.progress("migrate", 0.80)
    assert job.stage_from == 0.75
    clock = job.to_dict()["progress"]
    e = clock["stage_elapsed_seconds"]
    assert clock["stage_eta_seconds"] == pytest.approx(e * 0.20 / 0.05, rel=0.01, abs=0.01)  # not e * 0.2 / 0.8
    store = JobStore(tmp_path / "jobs.sqlite")  # the record keeps it: another process answers GET /v1/jobs/{id}
    store.insert(job)
    assert store.get("j1")[0].stage_from == 0.75
    store.close()


def test_a_stage_that_began_at_zero_keeps_its_eta():
    job = Job(id="j2", kind="fit", state="running")
    job.started_at = job.now() - 5.0
    ctx = JobContext(job, threading.Lock())
    ctx.progress("fit", 0.0)
    ctx.progress("fit", 0.25)
    clock = job.to_dict()["progress"]
    assert job.stage_from == 0.0
    assert clock["stage_eta_seconds"] == pytest.approx(clock["stage_elapsed_seconds"] * 3, rel=0.01, abs=0.01)
