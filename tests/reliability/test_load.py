"""Short bounded load on loopback (the long figures come from benchmarks/load_test.py).

A real ``vecbridge serve``; transform and cross-space search from several clients, each phase
capped at ``MAX_REQUESTS`` requests and ``MAX_SECONDS`` seconds: error rate 0 and RSS bounded.
Overload: more fit jobs at once than the queue holds get 429 with Retry-After quickly — never a
timeout, never a 5xx — and the accepted ones finish.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import httpx
import pytest

_spec = importlib.util.spec_from_file_location(
    "vb_load_test", Path(__file__).resolve().parents[2] / "benchmarks" / "load_test.py")
load_test = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(load_test)

MAX_REQUESTS = 400
MAX_SECONDS = 5.0
RSS_GROWTH_LIMIT_MIB = 150


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    proc, url = load_test.start_server(tmp_path_factory.mktemp("load") / "data", max_queued_jobs=2)
    try:
        world = load_test.prepare(url, dim=64, index_rows=4000, fit_rows=500)
        yield proc, url, world
    finally:
        import os
        import signal

        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_transform_and_search_hold_load_without_errors(served):
    proc, url, world = served
    rss0 = load_test.rss_kib(proc.pid)
    figures = []
    for name, req, rows in (("transform", load_test.transform_request(world["X"], 16), 16),
                            ("search", load_test.search_request(world["X"], 4), 4)):
        s = load_test.run_load(url, req, concurrency=4, max_requests=MAX_REQUESTS, max_seconds=MAX_SECONDS, rows=rows)
        assert s["requests"] >= 20, s
        assert s["errors"] == 0 and s["statuses"] == {200: s["requests"]}, s
        assert s["requests"] <= MAX_REQUESTS
        figures.append(f"{name}: {s['requests']} req, {s['rps']:.0f} req/s, p50 {s['p50_ms']:.1f} ms, "
                       f"p99 {s['p99_ms']:.1f} ms")
    rss1 = load_test.rss_kib(proc.pid)
    assert rss0 > 0 and (rss1 - rss0) / 1024 < RSS_GROWTH_LIMIT_MIB, (rss0, rss1)
    print("\nload: " + "; ".join(figures) + f"; RSS {rss0 // 1024} -> {rss1 // 1024} MiB")


def test_overload_gets_429_not_timeouts(served):
    proc, url, _ = served
    ov = load_test.overload(url, n_fits=10, dim=64, rows=4000)
    codes = ov["statuses"]
    assert set(codes) <= {202, 429}, codes  # no timeouts (exception names), no 5xx
    assert codes.get(429, 0) >= 1 and codes.get(202, 0) >= 1, codes
    assert ov["retry_after_on_429"]
    assert ov["max_response_s"] < 25  # an answer, not a client timeout (30 s)
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {load_test.KEY}"}, timeout=30) as c:
        for jid in ov["accepted_jobs"]:
            assert load_test.wait_job(c, jid, timeout=180)["state"] == "succeeded"
        assert c.get("/healthz").status_code == 200
    print(f"\noverload: {ov['sent']} fits at once -> {codes}, slowest answer {ov['max_response_s']:.2f}s")
