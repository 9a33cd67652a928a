"""Job records that two threads (or two processes) write: the last write must be the job's latest record.

The gaps are stretched with a real :class:`JobStore` that pauses one thread's write between taking the job's record
and writing it, until another thread has written the job's final record: the order a busy machine can produce.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from _jobs_support import slow_job
from _jobs_support import wait_job as wait

from service.jobs import TERMINAL, Job, JobManager, JobStore


class _PausingStore(JobStore):
    """A store whose writes from the thread ``paused`` (a thread id) stop after they took the job's record, until a
    final record was written by another thread (or ``patience`` seconds pass); ``on_pause`` runs as they stop."""

    def __init__(self, path, **kw):
        super().__init__(path, **kw)
        self.paused: int | None = None
        self.patience = 10.0
        self.on_pause = lambda: None
        self.final_written = threading.Event()

    def _row(self, job, owner):
        row = JobStore._row(job, owner)
        if threading.get_ident() == self.paused:
            self.on_pause()
            self.final_written.wait(self.patience)
        return row

    def save(self, job, *, was=None):
        out = super().save(job, was=was)
        if job.state in TERMINAL and threading.get_ident() != self.paused:
            self.final_written.set()
        return out


def test_a_running_job_cancelled_is_cancelled_in_the_store_too(tmp_path):
    """QA soak, 2 of 54 cancelled fits: DELETE of a running job wrote the whole record it had read (state
    "running") after the job's own final write, so the store said "running" for ever while the owning process
    answered "cancelled": /v1/info and /v1/jobs counted it running, the other worker answered "running"
    (Client.wait polled to its timeout), the next start failed it "interrupted by restart", and trim never
    removed it. A cancel writes the flag alone now."""
    db = tmp_path / "jobs.sqlite"
    store = _PausingStore(db, progress_interval=0.0)
    mgr = JobManager(store=store)
    mgr.open()
    slow, started = slow_job(20_000)
    job, _ = mgr.submit(slow, kind="fit")
    assert started.wait(10)
    try:
        store.paused = threading.get_ident()  # the request thread's writes wait for the job's final one
        mgr.cancel(job.id)
        assert wait(mgr.get, job.id).state == "cancelled"
        assert store.final_written.wait(10)
        time.sleep(0.2)  # a write of the request thread, had it been waiting, lands now
        sibling = JobStore(db)  # what another worker process reads
        assert sibling.get(job.id)[0].state == "cancelled"
        assert sibling.get(job.id)[0].cancel_requested
        assert (mgr.counts()["running"], mgr.counts()["cancelled"]) == (0, 1)
    finally:
        mgr.shutdown(wait=True)


def test_a_stale_record_never_replaces_a_final_one(tmp_path):
    """Another process's copy of a running job, written after the job ended (a write it took before), turned the
    final record back into "running"; a final record still replaces a running one, and a running one a running
    one."""
    db = tmp_path / "jobs.sqlite"
    owner, other = JobStore(db), JobStore(db)  # two processes of one data dir
    job = Job(id="j1", kind="fit", state="running", stage="fit", fraction=0.5, started_at=time.time())
    owner.insert(job)
    stale = replace(job, fraction=0.6)
    assert not other.save(stale)  # a running record over a running one: written
    assert owner.get("j1")[0].fraction == 0.6
    job.state, job.stage, job.finished_at = "cancelled", "cancelled", time.time()
    job.error = {"type": "JobCancelled", "message": "cancelled during fit"}
    owner.save(job)
    other.save(replace(stale, fraction=0.7))
    got = JobStore(db).get("j1")[0]
    assert (got.state, got.stage, got.fraction, got.error) == ("cancelled", "cancelled", 0.5, job.error), got
    assert JobStore(db).counts() == {"cancelled": 1}
    done = replace(job, state="failed", error={"type": "Interrupted", "message": "m"})
    other.save(done)  # a final record over a final one: written (a job a shutdown interrupted that then ended)
    assert JobStore(db).get("j1")[0].state == "failed"


def test_a_job_that_ends_while_a_shutdown_records_it_is_stored_as_its_process_answers(tmp_path):
    """SIGTERM as a fit ended: the shutdown took the record "failed, interrupted", the fit's own "succeeded" was
    written, then the shutdown's landed over it. The process answered "succeeded", the store (the other worker,
    the next start) "failed: interrupted" for a fit that had finished and registered its version. Writes of one
    process now go one at a time, each of the job as it is when its turn comes."""
    db = tmp_path / "jobs.sqlite"
    store = _PausingStore(db, progress_interval=0.0)
    store.patience = 3.0  # fixed, the shutdown's write holds the fit's back until it gives up waiting for it
    mgr = JobManager(store=store)
    mgr.open()
    started, go = threading.Event(), threading.Event()

    def fit(ctx):
        started.set()
        go.wait(30)
        return {"version": 1}

    job, _ = mgr.submit(fit, kind="fit")
    assert started.wait(10)
    store.on_pause = go.set  # the fit ends while the shutdown's record is on its way to the store
    store.paused = threading.get_ident()
    mgr.shutdown(wait=False)
    answered = wait(mgr.get, job.id, states=("succeeded",))
    assert answered.result == {"version": 1}
    sibling, deadline = JobStore(db), time.monotonic() + 10
    while sibling.get(job.id)[0].state != "succeeded" and time.monotonic() < deadline:
        time.sleep(0.05)
    stored = sibling.get(job.id)[0]
    assert (stored.state, stored.result) == ("succeeded", {"version": 1}), stored



def _whole(record: dict) -> str | None:
    """What is torn in ``record`` of a :func:`_reporting` job (None: nothing): its stage ``step-<i>`` goes with
    fraction ``(i % 100) / 100`` and follows the closed stages ``step-0 .. step-<i-1>``."""
    stage, stages = record["progress"]["stage"], record["timings"]["stages"]
    if record["state"] != "running" or not stage.startswith("step-"):
        return None
    i = int(stage[5:])
    if record["progress"]["fraction"] != round((i % 100) / 100, 4):
        return f"stage {stage} with fraction {record['progress']['fraction']}"
    if stage in stages or (i and f"step-{i - 1}" not in stages):
        return f"stage {stage} beside the closed stages of another moment ({len(stages)})"
    return None


def _reporting(park: threading.Event, go: threading.Event, mid_report: threading.Event, read: threading.Event):
    """A job reporting a new stage in a tight loop (each report closes a stage) until it is cancelled. Once ``park``
    is set it waits between two reports (``park`` cleared) for ``go``; its next report then stops inside the lock it
    is written under (its stage changed, its fraction being read: ``mid_report``) until ``read`` is set."""

    class Fraction:
        def __init__(self, i: int) -> None:
            self.value = (i % 100) / 100

        def __float__(self) -> float:
            if go.is_set() and not mid_report.is_set():
                mid_report.set()
                read.wait(10)
            return self.value

    def fn(ctx):
        i = 0
        while True:
            ctx.progress(f"step-{i}", Fraction(i))
            i += 1
            if park.is_set():
                park.clear()
                go.wait(60)

    return fn


@pytest.mark.parametrize("face", ["list", "cancel"])
def test_the_job_list_and_a_cancel_read_a_reporting_jobs_record_whole(tmp_path, face):
    """``GET /v1/jobs`` and ``DELETE /v1/jobs/{id}`` serialised the live records outside the lock their progress is
    written under (``GET /v1/jobs/{id}`` takes it): a job reporting meanwhile gave a record of two moments, its new
    stage with the last one's fraction. Here a job reports in a tight loop while another thread lists (or cancels)
    it; that read, once begun (the job's clock read), lets the job's next report begin and goes on once the report
    is inside the lock (its stage changed, its fraction not yet): the read waits for the lock now (given up on after
    2 s where it holds it: the report cannot begin), and its record is whole."""
    from service.ops.jobs import cancel_job, list_jobs

    mgr = JobManager(workers=1, store=JobStore(tmp_path / "jobs.sqlite"))
    mgr.open()
    park, go, mid_report, read = (threading.Event() for _ in range(4))
    job, _ = mgr.submit(_reporting(park, go, mid_report, read), kind="fit")
    deadline = time.monotonic() + 60
    while not job.stage.startswith("step-"):  # its first report is made
        assert time.monotonic() < deadline, job
        time.sleep(0.01)
    park.set()
    while park.is_set():  # it waits between two reports (a cancel's read must not follow its own report)
        assert time.monotonic() < deadline, job
        time.sleep(0.01)
    clock = job.now

    def now():  # the read begins with the job's clock: it lets the job's next report begin, and goes on inside it
        if threading.current_thread() is reader:
            go.set()
            mid_report.wait(2)  # (given up on where the read holds the lock: the report cannot begin)
        return clock()

    job.now = now
    got: list[dict] = []
    read_it = {"list": lambda: got.extend(r for r in list_jobs(mgr)[0] if r["id"] == job.id),
               "cancel": lambda: got.append(cancel_job(mgr, job.id))}[face]
    reader = threading.Thread(target=read_it)
    reader.start()
    reader.join(30)
    read.set()
    try:
        assert len(got) == 1 and got[0]["state"] == "running", got
        assert _whole(got[0]) is None, _whole(got[0])
    finally:
        mgr.cancel(job.id)
        wait(mgr.get, job.id)
        mgr.shutdown(wait=True)


class _LateEndStore(JobStore):
    """A store whose final writes from job workers wait until ``gate`` opens: a job's end is already answered by
    GET (it is in memory) while its record still holds its Idempotency-Key (for ``hold`` seconds at most: the fix's
    own write of the record waits for the worker's)."""

    def __init__(self, path, **kw):
        super().__init__(path, **kw)
        self.gate = threading.Event()
        self.hold = 2.0
        self.test_thread = threading.get_ident()

    def save(self, job, *, was=None):
        if job.state in TERMINAL and threading.get_ident() != self.test_thread:
            self.gate.wait(self.hold)
        return super().save(job, was=was)


@pytest.mark.parametrize("queue", ["room", "full"])
def test_a_key_a_failed_job_let_go_is_free_before_its_end_is_written(tmp_path, queue):
    """CI under load: a fit that failed on a retryable error said "its Idempotency-Key is free again", yet a
    resubmission with the key sent right away was answered the failed job: its worker had not yet written the record
    that lets the key go. The key is free from the moment the end says so, with room in the queue or not."""
    from service.registry.errors import RegistryLockedError

    def locked(ctx):
        raise RegistryLockedError("the registry database stayed locked (test)")

    store = _LateEndStore(tmp_path / "jobs.sqlite")
    mgr = JobManager(workers=1, max_queued=0 if queue == "full" else 4, store=store)
    mgr.open()
    try:
        first, _ = mgr.submit(locked, kind="fit", idempotency_key="deploy-42", request_hash="h")
        failed = wait(mgr.get, first.id)
        assert "free again" in failed.error["message"], failed.error
        assert store.by_key("deploy-42") is not None  # the worker's write is held: the store still has the key
        if queue == "full":
            blocker = threading.Event()
            busy, _ = mgr.submit(lambda ctx: blocker.wait(10), kind="fit")
            try:
                with pytest.raises(Exception, match="queue"):  # no room: a 429, not the failed job
                    mgr.submit(locked, kind="fit", idempotency_key="deploy-42", request_hash="h")
            finally:
                blocker.set()
        else:
            again, created = mgr.submit(locked, kind="fit", idempotency_key="deploy-42", request_hash="h")
            assert created and again.id != first.id
    finally:
        store.gate.set()
        mgr.shutdown(wait=True)
