"""Helpers of the job tests: wait for a job's state (in process or over HTTP), a slow cancellable job."""

from __future__ import annotations

import threading
import time
from typing import Callable

from service.jobs import TERMINAL


def wait_job(get: Callable, job_id: str, states=TERMINAL, timeout: float = 60.0):
    """Poll ``get(job_id)`` (a Job, or a job's JSON dict) until its state is one of ``states``; return it."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        job = get(job_id)
        if (job["state"] if isinstance(job, dict) else job.state) in states:
            return job
        time.sleep(0.02)
    raise AssertionError(f"job {job_id} did not reach {states}")


def http_job(client, headers: dict) -> Callable[[str], dict]:
    """``get`` for :func:`wait_job` over HTTP: ``GET /v1/jobs/{id}``."""
    return lambda job_id: client.get(f"/v1/jobs/{job_id}", headers=headers).json()


def wait_http_job(client, job_id: str, timeout: float = 120.0, headers: dict | None = None) -> dict:
    """Poll ``GET /v1/jobs/{job_id}`` with ``client`` (an httpx/TestClient carrying its key) until the job
    ends; its JSON."""
    return wait_job(http_job(client, headers or {}), job_id, timeout=timeout)


def slow_job(steps: int = 10_000):
    """``(fn, started)``: a job that reports progress every millisecond for ``steps`` steps (a
    cancellation point each time); ``started`` is set once it runs."""
    started = threading.Event()

    def slow(ctx):
        started.set()
        for i in range(steps):
            ctx.progress("loop", i / steps)
            time.sleep(0.001)
        return {}

    return slow, started
