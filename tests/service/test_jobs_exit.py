"""What becomes of a process's job threads when its interpreter exits (service.job_pool): a child process runs real
jobs on a real :class:`JobManager` (and a real SQLite registry) and ends; the records and files it leaves are read.

The job threads are daemon threads so that a job deaf to the stop cannot keep a stopping process alive; at the exit,
a pool that was shut down gets ``EXIT_GRACE`` seconds for its jobs, one never shut down runs its jobs to their end.
"""

from __future__ import annotations

import os
import subprocess
import sys

from _servers import read_line

from service.jobs import JobManager, JobStore
from service.registry.core import open_registry

# set in each child as its interpreter's exit begins (an atexit handler registered after service.jobs's, so it runs
# before the pool's join): its jobs wait for it, so they are still running when the exit comes
AT_EXIT = """
import atexit, sys, threading, pathlib
from service.jobs import JobManager, JobStore
exiting = threading.Event()
atexit.register(exiting.set)
"""


def _child(code: str, *args) -> tuple[int, str, str]:
    """Run ``AT_EXIT + code`` in a child interpreter; ``(exit status, its first line, its stderr)``."""
    proc = subprocess.Popen([sys.executable, "-c", AT_EXIT + code, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        line = read_line(proc).strip()
        _, err = proc.communicate(timeout=120)  # a bound, not a speed: a child that never exits fails here
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    return proc.returncode, line, err


REGISTERING_CHILD = """
import time
import numpy as np
from align import LinearMap
import service.registry.core as core
d = pathlib.Path(sys.argv[1])
reg = core.open_registry(f"sqlite:///{d}/registry.sqlite", d / "artifacts")
mgr = JobManager(store=JobStore(d / "jobs.sqlite"))
mgr.open()
stored = threading.Event()
def hook(point):  # the commit of the version's row comes once the process has begun to exit
    if point == "artifact_stored" and threading.current_thread().name.startswith("vecbridge-job"):
        stored.set()
        exiting.wait(60)
        time.sleep(0.3)  # the row's commit a moment into the exit, as a slow disk's
core.FAULT_HOOK = hook
def fit(ctx):
    ctx.progress("register", 0.0)
    v = reg.register_version("a2b", LinearMap(np.eye(8, dtype=np.float32)), source_space="a", target_space="b",
                             method="procrustes", params={})
    return {"version": v.version}
job, _ = mgr.submit(fit, kind="fit")
assert stored.wait(60)
mgr.shutdown(wait=False)  # what a server's stop does (state.close()), then the process exits
reg.close()
print(job.id, flush=True)
"""


def test_a_fit_registering_its_version_when_its_server_stops_registers_it(tmp_path):
    """A stop (``shutdown(wait=False)``, then the exit) while a fit was inside its registration, its artifact stored
    and its row not yet committed: the job thread was killed at the exit, leaving no version, an orphan artifact and
    "failed, interrupted during 'register'", where the executor's threads, joined at the exit, had registered it and
    said succeeded. The exit gives such a job its grace: the version is registered and the job says so."""
    rc, job_id, err = _child(REGISTERING_CHILD, tmp_path)
    assert rc == 0, err
    reg = open_registry(f"sqlite:///{tmp_path}/registry.sqlite", tmp_path / "artifacts")
    try:
        versions = reg.list_versions("a2b")
        assert [v.version for v in versions] == [1], err
        stored = sorted(p.relative_to(tmp_path / "artifacts").as_posix()
                        for p in (tmp_path / "artifacts").rglob("*.safetensors"))
        assert stored == [reg.artifact_file(versions[0]).relative_to(tmp_path / "artifacts").as_posix()]
    finally:
        reg.close()
    after_restart = JobManager(store=JobStore(tmp_path / "jobs.sqlite"))
    assert after_restart.open() == 0
    got = after_restart.get(job_id)
    assert (got.state, got.stage, got.error, got.result) == ("succeeded", "done", None, {"version": 1}), got
    after_restart.shutdown(wait=True)


LIBRARY_CHILD = """
out = pathlib.Path(sys.argv[1])
mgr = JobManager(workers=1)
def job(i):
    exiting.wait(60)  # still running (the first) and queued (the second) when the script ends
    out.joinpath(f"done{i}").write_text("x")
    return {}
for i in range(2):
    mgr.submit(lambda ctx, i=i: job(i), kind="demo")
print("submitted", flush=True)
"""  # and the script ends, without a shutdown


def test_a_script_that_submits_jobs_and_ends_without_a_shutdown_runs_them_to_their_end(tmp_path):
    """Library use: jobs submitted by a script that then ends ran to their end (a ThreadPoolExecutor's threads are
    joined at the exit); on daemon threads they were killed, the queued one never run. They run again."""
    rc, line, err = _child(LIBRARY_CHILD, tmp_path)
    assert (rc, line) == (0, "submitted"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done0", "done1"], err


DEAF_CHILD = """
import service.job_pool
service.job_pool.EXIT_GRACE = 0.5  # the grace, short here (the job never ends: it is spent whole)
mgr = JobManager(store=JobStore(sys.argv[1]))
mgr.open()
started = threading.Event()
def deaf(ctx):  # one report, then work that never reports again and never ends (a native call that hangs)
    ctx.progress("fit", 0.5)
    started.set()
    threading.Event().wait()
job, _ = mgr.submit(deaf, kind="fit")
assert started.wait(60)
mgr.shutdown(wait=False)  # as a server stopping: the job is recorded interrupted, the process goes on to exit
print(job.id, flush=True)
"""


def test_a_job_deaf_to_the_shutdown_does_not_keep_its_process_from_exiting(tmp_path):
    """The pool's threads were joined at interpreter exit whatever ``shutdown(wait=False)`` said: a stopping server
    whose job ignored the stop stayed alive until the job ended (for ever here), its record already "interrupted".
    The process exits once the grace is spent, says so, and the record it leaves says what happened."""
    db = tmp_path / "jobs.sqlite"
    rc, job_id, err = _child(DEAF_CHILD, db)
    assert rc == 0, err
    assert "job threads still running at exit are killed with the process" in err, err
    after_restart = JobManager(store=JobStore(db))
    assert after_restart.open() == 0  # nothing left to recover: the shutdown wrote the job's end
    got = after_restart.get(job_id)
    assert (got.state, got.stage, got.cancel_requested) == ("failed", "interrupted", False), got
    assert got.error["message"].startswith("interrupted during 'fit' at 50%: the process serving"), got.error
    after_restart.shutdown(wait=True)


FORCED_CHILD = """
import time
import service.job_pool
service.job_pool.EXIT_GRACE = 3600.0  # where no stop is noted, the exit would wait an hour for the job
stop = service.job_pool.Stop()  # its server's
mgr = JobManager(store=JobStore(sys.argv[1]), stop=stop)
mgr.open()
started = threading.Event()
def deaf(ctx):
    ctx.progress("fit", 0.5)
    started.set()
    threading.Event().wait()
job, _ = mgr.submit(deaf, kind="fit")
assert started.wait(60)
stop.note(time.monotonic() + 3600)  # a server's stop signal (its shutdown_timeout_s: an hour)
mgr.shutdown(wait=False)  # its app's stop
stop.note(time.monotonic())  # a second Ctrl-C: a forced stop
service.job_pool.join_stopped(stop)  # the app's stop joins the job threads, as the exit does after it
print(job.id, flush=True)
"""


def test_a_stop_gives_the_job_threads_one_deadline_and_a_forced_stop_none(tmp_path):
    """A stopping server's job threads got ``EXIT_GRACE`` (30 s) at the exit on top of the ``shutdown_timeout_s``
    its stop had taken, whatever the stop: a job deaf to the stop held a forced stop (a second Ctrl-C) too. The
    stop's deadline is noted now (the earliest holds: a forced stop's is "now"), and the app's own join and the
    exit's wait for no more; the threads left are logged once."""
    db = tmp_path / "jobs.sqlite"
    rc, job_id, err = _child(FORCED_CHILD, db)
    assert rc == 0, err
    assert err.count("job threads still running at exit are killed with the process") == 1, err
    after_restart = JobManager(store=JobStore(db))
    assert after_restart.open() == 0
    got = after_restart.get(job_id)
    assert (got.state, got.stage) == ("failed", "interrupted"), got
    after_restart.shutdown(wait=True)
