"""`vecbridge serve --workers N`: how long uvicorn's supervisor waits for a worker's answer to its health check
(``worker_healthcheck_timeout_s``, ``--worker-healthcheck-timeout``) before it kills the worker and starts another.

uvicorn's own 5 s was shorter than a worker's start on a busy host (the 2-core development machine at load 8: up to
13 s with 2 workers): the workers were killed and restarted in a loop and the service never answered. The supervisor
is real here (a ``serve --workers 2`` process); a worker stopped with SIGSTOP is one that does not answer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from _api_support import R
from _servers import env_for, free_port, seed_registry, start, stop


def _workers(pid: int) -> list[int]:
    """The worker processes of the supervisor ``pid`` (spawned by multiprocessing)."""
    out = subprocess.run(["pgrep", "-P", str(pid)], check=False, capture_output=True, text=True).stdout.split()
    found = []
    for p in map(int, out):
        try:
            if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes():
                found.append(p)
        except OSError:  # gone meanwhile
            pass
    return found


def _serve_two(tmp_path, *args, env=None) -> tuple[subprocess.Popen, int, list[int]]:
    data = tmp_path / "data"
    seed_registry(data)
    port = free_port()
    proc = start([sys.executable, "-m", "service.cli", "serve", "--workers", "2", *args],
                 {**env_for(data, port), **(env or {})}, port, tmp_path / "server.log")
    deadline = time.monotonic() + 60
    while len(workers := _workers(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(workers) == 2, workers
    return proc, port, workers


def _died(tmp_path, pid: int) -> bool:
    """The supervisor logged that it killed ``pid`` (uvicorn: "Child process [pid] died")."""
    msgs = [json.loads(line).get("msg", "") for line in (tmp_path / "server.log").read_text().splitlines()
            if line.startswith("{")]
    return f"Child process [{pid}] died" in msgs


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_worker_that_answers_its_health_check_after_uvicorns_5_s_is_kept(tmp_path):
    # a worker still starting on a busy host answered after uvicorn's 5 s: killed and started again, in a loop
    proc, port, (w, other) = _serve_two(tmp_path)
    try:
        os.kill(w, signal.SIGSTOP)  # answers nothing, as a worker still importing on a loaded host
        try:
            time.sleep(8)
            assert _alive(w) and not _died(tmp_path, w), "the worker was killed within 8 s"
        finally:
            if _alive(w):
                os.kill(w, signal.SIGCONT)
        time.sleep(1)
        assert sorted(_workers(proc.pid)) == sorted([w, other])
        assert httpx.get(f"http://127.0.0.1:{port}/v1/maps", headers=R, timeout=30).status_code == 200
    finally:
        stop(proc)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_option_sets_the_supervisors_wait_and_wins_over_the_variable(tmp_path):
    # 20 s: above a worker's start on a loaded host (this test must start), under the default 60 s
    proc, port, (w, other) = _serve_two(tmp_path, "--worker-healthcheck-timeout", "20",
                                        env={"VECBRIDGE_WORKER_HEALTHCHECK_TIMEOUT_S": "3600"})
    try:
        stopped = time.monotonic()
        os.kill(w, signal.SIGSTOP)
        time.sleep(8)
        assert _alive(w), "killed long before the option's 20 s"
        while _alive(w) and time.monotonic() - stopped < 45:
            time.sleep(0.2)
        waited = time.monotonic() - stopped
        assert not _alive(w) and 19 < waited < 45, waited  # killed after ~20 s: neither 3600 nor the default 60
        deadline = time.monotonic() + 60  # and replaced, the service still answering
        while _died(tmp_path, w) is False and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _died(tmp_path, w)
        assert httpx.get(f"http://127.0.0.1:{port}/v1/maps", headers=R, timeout=30).status_code == 200
        while len(_workers(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert other in _workers(proc.pid) and len(_workers(proc.pid)) == 2
    finally:
        if _alive(w):
            os.kill(w, signal.SIGCONT)
        stop(proc)


_LOW, _HIGH = "greater than or equal to 1", "less than or equal to 3600"


@pytest.mark.parametrize(("value", "why"), [("0", _LOW), ("-5", _LOW), ("0.5", _LOW), ("abc", "valid"), ("nan", _HIGH),
                                          ("4000", _HIGH)])
def test_a_bad_health_check_wait_is_one_line_and_exit_2(capsys, monkeypatch, tmp_path, value, why):
    from conftest import run_cli

    monkeypatch.setenv("VECBRIDGE_DATA_DIR", str(tmp_path))
    code, out, err = run_cli(capsys, "serve", "--workers", "2", "--worker-healthcheck-timeout", value)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "--worker-healthcheck-timeout" in err and why in err and value in err, err
    monkeypatch.setenv("VECBRIDGE_WORKER_HEALTHCHECK_TIMEOUT_S", value)
    code, out, err = run_cli(capsys, "serve", "--workers", "2")
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "setting VECBRIDGE_WORKER_HEALTHCHECK_TIMEOUT_S" in err and why in err and "Traceback" not in err, err
