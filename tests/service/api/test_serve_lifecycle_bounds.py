"""The bounds of a stop: whose deadline a server's job threads get, and how long `serve --workers N`'s supervisor
waits for its workers, at the stop and in SIGHUP's restart (service/job_pool.py, service/api/supervisor.py). The
servers are real: uvicorn servers in a child process, `vecbridge serve` processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from _api_support import R
from _servers import ROOT, alive, env_for, free_port, read_line, workers_of
from test_serve_lifecycle import _end_group, _new_worker, _records, _wait_for_log, _workers_serve

# two services, one after the other, in one process (as a test run or a program embedding the service serves them):
# each runs until this process's SIGTERM (its signal handling is the server's); the first stops with a
# shutdown_timeout_s of 0.5 s, the second (an hour) while a job of its own finishes what it began, a second after
# its record said "interrupted". Prints whether the second stop waited for that job.
TWO_SERVICES = """
import os, pathlib, signal, sys, threading, time
import httpx, uvicorn
from service.api.app import _run, create_app
from service.config import Settings
from service.job_pool import join_at_exit
base, ports = pathlib.Path(sys.argv[1]), [int(p) for p in sys.argv[2:4]]
stopped = []
def serve(name, port, limit, then=lambda app: None):
    app = create_app(Settings(data_dir=base / name, demo_on_empty=False))
    def drive():
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
        then(app)
        stopped.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)
    threading.Thread(target=drive, daemon=True).start()
    return _run(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, timeout_graceful_shutdown=limit))
assert serve("first", ports[0], 0.5) == (True, "SIGTERM")
finished = base / "finished"
def registering(ctx):  # deaf to the stop: it finishes what it began, a second after its record said interrupted
    ctx.progress("register", 0.5)
    while not ctx.should_cancel():
        time.sleep(0.01)
    time.sleep(1.0)
    finished.touch()
def with_a_job(app):
    app.state.vb.jobs.submit(registering, kind="fit")
    while time.monotonic() < stopped[0] + 1.0:  # the first service's deadline has passed
        time.sleep(0.05)
assert serve("second", ports[1], 3600, with_a_job) == (True, "SIGTERM")
join_at_exit()  # as serve() does before its os._exit
print("waited" if finished.exists() else "cut", flush=True)
os._exit(0)
"""


def test_a_services_stop_deadline_is_its_own_not_that_of_another_service_in_the_process(tmp_path):
    """The deadline a stop gives the job threads was one per process, the earliest noted holding for good: a service
    stopped after another in the same process got that one's deadline, long past, and its job threads none of its
    own hour (the job finishing its registration was cut, as by kill -9); and one service's stop joined every stopped
    pool of the process, another's too. Each app has its own deadline now: the second stop waits for its job."""
    ports = [str(free_port()), str(free_port())]
    proc = subprocess.Popen([sys.executable, "-c", TWO_SERVICES, str(tmp_path), *ports], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**env_for(tmp_path, int(ports[0])), "VECBRIDGE_LOG_LEVEL": "WARNING"})
    try:
        line = read_line(proc).strip()
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert (proc.returncode, line) == (0, "waited"), err[-3000:]
    assert "job threads still running at exit are killed with the process" not in err, err[-3000:]


# a sitecustomize (on the server's PYTHONPATH, so each spawned worker runs it): a `--workers` worker (not the
# supervisor) ignores SIGTERM, whoever sets a handler for it later (uvicorn's server does), as a worker whose stop
# hangs does; it still answers the supervisor's health checks (from a thread of its own)
DEAF_WORKERS = """
import signal
from pathlib import Path
if b"spawn_main" in Path("/proc/self/cmdline").read_bytes():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _set = signal.signal
    signal.signal = lambda sig, handler: _set(sig, signal.SIG_IGN if sig == signal.SIGTERM else handler)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_deaf_to_the_stop_are_killed_once_it_is_past_shutdown_timeout_s_and_the_service_exits(tmp_path):
    """The supervisor's wait for its workers at the stop (uvicorn's ``join_all``) had no limit: a worker that did not
    act on its SIGTERM yet answered its last health check (not a stopped one, which is killed) kept `serve` from
    exiting for ever. Now each is killed ``RETIRE_MARGIN_S`` (5 s) past ``shutdown_timeout_s`` (1 s here) after its
    SIGTERM, with a WARNING line, and the service exits 0."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(DEAF_WORKERS)
    path = os.pathsep.join(p for p in (str(hooks), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    proc, _port = _workers_serve(tmp_path, env={"PYTHONPATH": path, "VECBRIDGE_SHUTDOWN_TIMEOUT_S": "1"})
    workers = workers_of(proc.pid)
    try:
        assert len(workers) == 2, workers
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(60)  # a bound, not a speed
        except subprocess.TimeoutExpired:
            code = None  # before: the supervisor waited for them for ever
        assert code == 0, code
        assert not [w for w in workers if alive(w)]
    finally:
        _end_group(proc)
    records = _records(tmp_path)
    warnings = [r["msg"] for r in records if r.get("level") == "WARNING"]
    assert sorted(warnings) == sorted(f"Child process [{w}] did not end within 6 s of its SIGTERM: killed"
                                      for w in workers), warnings
    assert "service stopped" in [r["msg"] for r in records]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_sighup_restart_goes_on_past_old_workers_that_died_meanwhile(tmp_path):
    """SIGHUP's restart sent each old worker its SIGTERM once the worker's replacement served; an old worker that had
    died meanwhile (the OOM killer) and been reaped by the next replacement's start had no pid left to signal: the
    ProcessLookupError ended the supervisor's loop, the service gone mid-restart (its workers with it). Here both old
    workers are killed as the first replacement starts: the restart completes, the two new workers serve, and the
    service stops with 0."""
    proc, port = _workers_serve(tmp_path)
    try:
        old = set(workers_of(proc.pid))
        os.kill(proc.pid, signal.SIGHUP)
        _new_worker(proc, old)  # the first replacement is started: the second's start reaps the old ones
        for p in old:
            os.kill(p, signal.SIGKILL)
        _wait_for_log(tmp_path, "Application startup complete.", 4, seconds=90)
        deadline = time.monotonic() + 60
        while len(workers_of(proc.pid)) != 2 or set(workers_of(proc.pid)) & old:
            assert proc.poll() is None and time.monotonic() < deadline, (workers_of(proc.pid), old)
            time.sleep(0.05)
        assert httpx.get(f"http://127.0.0.1:{port}/v1/maps", headers=R, timeout=30).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        _end_group(proc)
    log = (tmp_path / "server.log").read_text()
    assert "Traceback" not in log, log[-3000:]
    assert not [r for r in _records(tmp_path) if r.get("level") == "ERROR"], log[-3000:]
