"""A registry unavailable for a moment at the end of a fit (QA 4801: a PostgreSQL restart during a fit's register
step): the fit waits for it instead of throwing the map away, and a job that failed on such an error anyway does not
hold its Idempotency-Key (a resubmission starts a new job, as Stripe does).

The outage is real: another connection holds the SQLite registry file (``BEGIN EXCLUSIVE``, as a backup does) past
the registry's busy timeout, which is the RegistryLockedError (503, retry) a blip of PostgreSQL also is."""

from __future__ import annotations

import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from _api_support import planted
from _jobs_support import wait_job

from align.exceptions import Cancelled
from service.jobs import JobManager, JobStore
from service.ops.maps import run_fit
from service.ops.steers import fit_and_register
from service.registry import (
    RegistryLockedError,
    RegistryUnavailableError,
    open_registry,
)

WAITING = "register: waiting for the registry"  # the stage a fit reports between tries (what a client reads)


@pytest.fixture
def reg(tmp_path):
    r = open_registry(f"sqlite:///{tmp_path}/reg.sqlite", tmp_path / "artifacts")
    r.db.timeout = 0.2  # a connection made from now on (a new thread's) gives up on a locked file after 0.2 s
    return r


def _fit(reg, progress, **kw):
    """run_fit of a small paired map on a thread of its own (its registry connection waits 0.2 s on a locked file)."""
    X, Y, _ = planted(200)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run_fit, reg, name="a2b", source=X, target=Y, method="procrustes", paired=True,
                           source_space="a", target_space="b", progress=progress, **kw).result(timeout=120)


class _Holder:
    """Another process's hold on the registry file: ``take()`` locks it, ``free()`` lets it go."""

    def __init__(self, path):
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.held = False

    def take(self):
        self.conn.execute("BEGIN EXCLUSIVE")
        self.held = True

    def free(self):
        if self.held:
            self.conn.execute("ROLLBACK")
            self.held = False


def _away_at_register(fit, tmp_path):
    """``fit(progress)`` with the registry locked once the fit reaches its register step, and back while the fit waits
    for it: (what ``fit`` returned, the stages it reported)."""
    holder = _Holder(tmp_path / "reg.sqlite")
    seen = []

    def progress(stage, fraction):
        if stage == "register" and stage not in seen:  # the registry goes away once the fit is done ...
            holder.take()
        elif stage == WAITING:  # ... and is back while the fit waits for it
            holder.free()
        seen.append(stage)

    try:
        return fit(progress), seen
    finally:
        holder.free()


def test_a_fit_whose_registry_is_unavailable_at_register_waits_and_registers(reg, tmp_path):
    """The registry locked when the fit reaches its register step: RegistryUnavailableError threw the fitted map away.
    Now the step reports it waits for the registry, tries again, and the map is registered once it is back."""
    v, seen = _away_at_register(lambda progress: _fit(reg, progress), tmp_path)
    assert WAITING in seen and seen.index(WAITING) > seen.index("register")
    assert seen[-1] == "register"  # back from waiting once registered
    assert [x.version for x in reg.list_versions("a2b")] == [v.version] == [1]  # registered once
    assert reg.load_map("a2b:1").source_dim == planted(200)[0].shape[1]


def test_a_job_that_failed_on_a_retryable_error_lets_its_idempotency_key_go(reg, tmp_path):
    """A job failed on the registry being unavailable kept its Idempotency-Key: the same key was answered that failed
    job for as long as the record was kept (QA: a deploy script retrying "deploy-42" never fitted again). Now the key
    is free (in this process and in the store other processes read), and a resubmission runs a new job; a failure no
    retry can fix (bad input) keeps its key."""
    store_path = tmp_path / "jobs.sqlite"
    mgr = JobManager(workers=1, max_queued=4, store=JobStore(store_path))
    mgr.open()
    holder = _Holder(tmp_path / "reg.sqlite")

    def write(ctx):
        return {"space": reg.register_space("s", 4).name}

    holder.take()
    try:
        first, created = mgr.submit(write, kind="fit", idempotency_key="deploy-42", request_hash="h")
        assert created
        failed = wait_job(mgr.get, first.id)
    finally:
        holder.free()
    assert failed.state == "failed" and failed.error["type"] == "RegistryLockedError"
    assert "Idempotency-Key is free again" in failed.error["message"]
    assert JobStore(store_path).get(first.id)[0].idempotency_key is None  # what a sibling process reads

    again, created = mgr.submit(write, kind="fit", idempotency_key="deploy-42", request_hash="h")
    assert created and again.id != first.id
    assert wait_job(mgr.get, again.id).state == "succeeded"
    replay, created = mgr.submit(write, kind="fit", idempotency_key="deploy-42", request_hash="h")
    assert not created and replay.id == again.id  # a success keeps its key

    def bad(ctx):
        raise ValueError("bad input")

    broken, _ = mgr.submit(bad, kind="fit", idempotency_key="bad-1", request_hash="b")
    assert wait_job(mgr.get, broken.id).state == "failed"
    replay, created = mgr.submit(bad, kind="fit", idempotency_key="bad-1", request_hash="b")
    assert not created and replay.id == broken.id
    mgr.shutdown(wait=True)


def test_a_registry_unavailable_past_the_waits_fails_the_fit_with_its_error(reg, tmp_path, monkeypatch):
    """The waits are bounded: a registry that stays away fails the fit with its error (503 kind), after every try."""
    monkeypatch.setattr("service.registry.retry.REGISTER_WAITS", (0.01, 0.01))  # short waits: it is about their end
    holder = _Holder(tmp_path / "reg.sqlite")
    waits = []

    def progress(stage, fraction):
        if stage == "register" and not holder.held:
            holder.take()
        waits.append(stage)

    try:
        with pytest.raises(RegistryLockedError):
            _fit(reg, progress)
    finally:
        holder.free()
    assert WAITING in waits


def _first_try(mgr, fit, holder):
    """The job of ``fit`` under key "deploy-42", run to its end (the registry then let go): (job, its end)."""
    first, _ = mgr.submit(fit, kind="fit", idempotency_key="deploy-42", request_hash="h")
    failed = wait_job(mgr.get, first.id)
    holder.free()
    return first, failed


def _commit_then(monkeypatch, then):
    """The registry goes away right after a registration's commit, before its answer is read back (a PostgreSQL
    connection dropped there): ``then()`` runs at that point, once."""
    done = []

    def hook(point):
        if point == "committed" and not done:
            done.append(1)
            then()

    monkeypatch.setattr("service.registry.core.FAULT_HOOK", hook)


def _lost_answer():
    raise RegistryUnavailableError("lost the connection to the PostgreSQL registry (test)")


@pytest.mark.parametrize("kind", ["map", "steer"])
def test_a_job_whose_registration_may_have_been_committed_keeps_its_idempotency_key(reg, tmp_path, monkeypatch, kind):
    """A fit committed, the registry then stayed locked past every try: the job failed saying its Idempotency-Key was
    free again, and the same key started a job that registered the map a second time. Now the key is kept (no
    look-up could tell whether the version exists) and the error says how to proceed; a resubmission is that job.
    A steer fit the same: it did not wait for the registry at all (it registers through the same step now)."""
    monkeypatch.setattr("service.registry.retry.REGISTER_WAITS", (0.01, 0.01))
    holder = _Holder(tmp_path / "reg.sqlite")
    _commit_then(monkeypatch, holder.take)
    X, Y, _ = planted(200)
    S, y = _steer_rows()
    stages = []

    def fit(ctx):
        def progress(stage, fraction):
            stages.append(stage)
            ctx.progress(stage, fraction)

        if kind == "steer":
            return {"ref": fit_and_register(reg, name="a2b", space="toy", X=S, labels=y, progress=progress).ref}
        v = run_fit(reg, name="a2b", source=X, target=Y, method="procrustes", paired=True, source_space="a",
                    target_space="b", progress=progress, should_cancel=ctx.should_cancel)
        return {"ref": v.ref}

    mgr = JobManager(workers=1, max_queued=4, store=JobStore(tmp_path / "jobs.sqlite"))
    mgr.open()
    try:
        first, failed = _first_try(mgr, fit, holder)
        assert failed.state == "failed" and failed.error["type"] == "RegistryLockedError", failed.error
        assert "free again" not in failed.error["message"]
        message = failed.error["message"]
        assert "Idempotency-Key is kept" in message and f"/v1/{kind}s/NAME/versions" in message
        assert WAITING in stages  # it waited for the registry before giving up
        again, created = mgr.submit(fit, kind="fit", idempotency_key="deploy-42", request_hash="h")
        assert not created and again.id == first.id
        versions = reg.list_steer_versions if kind == "steer" else reg.list_versions
        assert [v.version for v in versions("a2b")] == [1]  # registered once
    finally:
        holder.free()
        mgr.shutdown(wait=True)


def test_a_fit_locked_out_at_every_try_lets_its_idempotency_key_go(reg, tmp_path, monkeypatch):
    """A review's find: a fit whose registry was locked from its register step on (no try wrote a row) was marked
    "may have been committed" because the last look-up could not answer either, so its key was kept and the same key
    answered the failed job (the deploy script stuck again). Only a try that failed at or after its commit marks it:
    this one says its key is free, and a resubmission runs a new job."""
    monkeypatch.setattr("service.registry.retry.REGISTER_WAITS", (0.01, 0.01))
    holder = _Holder(tmp_path / "reg.sqlite")
    X, Y, _ = planted(200)

    def fit(ctx):
        def progress(stage, fraction):
            if stage == "register" and not holder.held:
                holder.take()
            ctx.progress(stage, fraction)

        return {"ref": run_fit(reg, name="a2b", source=X, target=Y, method="procrustes", paired=True,
                               source_space="a", target_space="b", progress=progress).ref}

    mgr = JobManager(workers=1, max_queued=4, store=JobStore(tmp_path / "jobs.sqlite"))
    mgr.open()
    try:
        first, failed = _first_try(mgr, fit, holder)
        assert failed.state == "failed" and failed.error["type"] == "RegistryLockedError", failed.error
        assert "Idempotency-Key is free again" in failed.error["message"], failed.error["message"]
        assert reg.list_maps() == []  # nothing was registered
        again, created = mgr.submit(fit, kind="fit", idempotency_key="deploy-42", request_hash="h")
        assert created and again.id != first.id
    finally:
        holder.free()
        mgr.shutdown(wait=True)


def test_a_fit_committed_before_its_last_error_returns_its_version(reg, monkeypatch):
    """The last try's commit went through and only its answer was lost: the fit failed (a resubmission then
    registered the map twice). One more look before the last error finds the version: the fit returns it."""
    monkeypatch.setattr("service.registry.retry.REGISTER_WAITS", ())  # no retry: the last error comes at once
    _commit_then(monkeypatch, _lost_answer)
    v = _fit(reg, lambda stage, fraction: None)
    assert [x.version for x in reg.list_versions("a2b")] == [v.version] == [1]


def test_a_cancel_while_waiting_does_not_cancel_a_committed_fit(reg, monkeypatch):
    """A cancel (or a shutdown) during the waits marked the job cancelled although its version was committed (register
    is the last cancellation point: once registered, the fit has happened). Now the fit succeeds with that version."""
    monkeypatch.setattr("service.registry.retry.REGISTER_WAITS", (5.0,))
    _commit_then(monkeypatch, _lost_answer)
    cancel = threading.Event()

    def progress(stage, fraction):
        if stage == WAITING:
            cancel.set()

    v = _fit(reg, progress, should_cancel=cancel.is_set)
    assert cancel.is_set() and [x.version for x in reg.list_versions("a2b")] == [v.version] == [1]


def test_a_cancel_while_waiting_cancels_a_fit_not_registered(reg, tmp_path, monkeypatch):
    """... and a fit whose registration did not happen is cancelled, as before."""
    monkeypatch.setattr("service.registry.retry.REGISTER_WAITS", (5.0,))
    holder = _Holder(tmp_path / "reg.sqlite")
    cancel = threading.Event()

    def progress(stage, fraction):
        if stage == "register" and not holder.held:
            holder.take()
        elif stage == WAITING:
            holder.free()
            cancel.set()

    try:
        with pytest.raises(Cancelled):
            _fit(reg, progress, should_cancel=cancel.is_set)
    finally:
        holder.free()
    assert reg.list_maps() == [] or reg.list_versions("a2b") == []


def test_a_fit_found_after_a_lost_answer_keeps_the_worse_default_note(reg, monkeypatch):
    """The found version (its answer lost, found on the retry) lost the note a registration gives when the bare
    name now means a worse map: it said nothing. Now it says what the normal path says."""
    X, Y, _ = planted(1000)
    Y = Y + 0.6 * np.random.default_rng(5).standard_normal(Y.shape).astype(np.float32)
    kw = {"name": "a2b", "method": "ridge", "paired": True, "source_space": "a", "target_space": "b"}
    run_fit(reg, source=X, target=Y, **kw)
    monkeypatch.setattr("service.registry.retry.REGISTER_WAITS", (0.01,))
    _commit_then(monkeypatch, _lost_answer)
    notes: list[str] = []
    few = run_fit(reg, source=X[:20], target=Y[:20], notes=notes, **kw)  # held-out ~0: worse
    assert few.version == 2 and [x.version for x in reg.list_versions("a2b")] == [1, 2]
    assert notes and "a2b:1" in notes[-1] and "worse" in notes[-1], notes


def _fit_job(reg, progress=None):
    """A job function fitting "a2b" whose progress goes through ``progress(ctx, stage, fraction)`` (else the job's)."""
    X, Y, _ = planted(200)

    def fit(ctx):
        def report(stage, fraction):
            if progress is None:
                ctx.progress(stage, fraction)
            else:
                progress(ctx, stage, fraction)

        return {"ref": run_fit(reg, name="a2b", source=X, target=Y, method="procrustes", paired=True,
                               source_space="a", target_space="b", progress=report,
                               should_cancel=ctx.should_cancel).ref}

    return fit


def test_a_cancel_during_the_last_sleep_of_a_wait_stops_the_job_before_its_next_try(reg, tmp_path, monkeypatch):
    """A cancel that came after a wait's last progress report was looked for only after the next try: that try
    blocked for the registry's whole timeout, and once the registry was back it registered the map of a job cancelled
    seconds before. The wait sleeps on the job's cancel now: the job ends cancelled before any other try, its error
    says the map was not registered and how long the registry was away, and nothing is registered."""
    monkeypatch.setattr("service.registry.retry.REGISTER_WAITS", (0.3,))  # one sleep: no progress report after it
    holder = _Holder(tmp_path / "reg.sqlite")
    mgr = JobManager(workers=1, max_queued=4, store=JobStore(tmp_path / "jobs.sqlite"))
    mgr.open()
    asked = []

    def progress(ctx, stage, fraction):
        if stage == "register" and not asked and not holder.held:
            holder.take()
        ctx.progress(stage, fraction)
        if stage == WAITING and not asked:  # the report went through; the cancel comes during the sleep after it
            holder.free()  # and the registry is back: the next try would register
            asked.append(mgr.cancel(ctx.job_id).state)

    try:
        job, _ = mgr.submit(_fit_job(reg, progress), kind="fit")
        done = wait_job(mgr.get, job.id)
    finally:
        holder.free()
        mgr.shutdown(wait=True)
    assert asked == ["running"]
    assert done.state == "cancelled", (done.state, done.error, done.result)
    stored = JobStore(tmp_path / "jobs.sqlite").get(job.id)[0]
    assert stored.state == "cancelled" and stored.error["type"] == "JobCancelled"
    message = stored.error["message"]
    assert "while waiting for the registry" in message and "map 'a2b' was not registered" in message, message
    assert "stayed locked" in message  # the registry's error, which the wait was for
    assert reg.list_maps() == [] or reg.list_versions("a2b") == []


def test_a_job_whose_wait_for_the_registry_ended_is_back_in_its_register_stage(reg, tmp_path):
    """Once a try after a wait registered the map, the job's record still said "register: waiting for the registry"
    (to a client polling GET /v1/jobs/{id}, and in its stage timings) until the job ended. It is back in "register"
    as soon as the map is registered, in the record other processes read."""
    holder = _Holder(tmp_path / "reg.sqlite")
    store_path = tmp_path / "jobs.sqlite"
    mgr = JobManager(workers=1, max_queued=4, store=JobStore(store_path))
    mgr.open()
    seen = []

    def progress(ctx, stage, fraction):
        if stage == "register" and stage not in seen:
            holder.take()
        elif stage == WAITING:
            holder.free()
        seen.append(stage)
        ctx.progress(stage, fraction)

    fit = _fit_job(reg, progress)

    def fit_then_look(ctx):
        out = fit(ctx)
        return {**out, "stage": JobStore(store_path).get(ctx.job_id)[0].stage}  # the registered map's record

    try:
        job, _ = mgr.submit(fit_then_look, kind="fit")
        done = wait_job(mgr.get, job.id)
    finally:
        holder.free()
        mgr.shutdown(wait=True)
    assert done.state == "succeeded" and WAITING in seen, (done.state, done.error)
    assert done.result["stage"] == "register", done.result
    assert done.stage == "done" and WAITING in done.stage_seconds


def test_the_seconds_waited_for_the_registry_count_its_connect_timeouts(reg, tmp_path, monkeypatch):
    """A registry that does not answer (a PostgreSQL host gone: each try ends at its connect timeout) was waited for
    for as long as the tries took, but only the sleeps between them were counted (0.0 s of them here). The error a
    job ends with (and the log) counts from the first try's start."""
    import re
    import time

    monkeypatch.setattr("service.registry.retry.REGISTER_WAITS", (0.0,))
    tries = []

    def timeout(point):
        if point == "artifact_stored":  # before the transaction: where a connection to the registry is made
            t0 = time.monotonic()
            time.sleep(0.25)
            tries.append(time.monotonic() - t0)
            raise RegistryUnavailableError("cannot connect to PostgreSQL registry: timeout expired (test)")

    monkeypatch.setattr("service.registry.core.FAULT_HOOK", timeout)
    mgr = JobManager(workers=1, max_queued=4, store=JobStore(tmp_path / "jobs.sqlite"))
    mgr.open()
    try:
        job, _ = mgr.submit(_fit_job(reg), kind="fit")
        failed = wait_job(mgr.get, job.id)
    finally:
        mgr.shutdown(wait=True)
    assert failed.state == "failed" and failed.error["type"] == "RegistryUnavailableError", failed.error
    said = re.search(r"map 'a2b' waited ([0-9.]+) s for the registry, 2 tries", failed.error["message"])
    assert said is not None and len(tries) == 2, failed.error["message"]
    assert float(said.group(1)) + 0.05 >= sum(tries), (said.group(0), tries)  # shown to 0.1 s


# --- steer fits: the same register step (service.registry.retry.until_registered) ------------------------------
def _steer_rows(n=300, d=8, seed=0):
    """Rows and labels of a small local steer (+1 / -1 at the ends of the first axis, 0 between)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = np.where(X[:, 0] > 1, 1, np.where(X[:, 0] < -1, -1, 0))
    return (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32), y


def _steer_fit(reg, progress, name="tone"):
    """fit_and_register of a small steer on a thread of its own (its registry connection waits 0.2 s when locked)."""
    X, y = _steer_rows()
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fit_and_register, reg, name=name, space="toy", X=X, labels=y,
                           progress=progress).result(timeout=120)


def test_a_steer_fit_whose_registry_is_unavailable_at_register_waits_and_registers(reg, tmp_path):
    """A steer fit failed with RegistryLockedError when the registry was locked at its register step (a map fit
    waited for it): the fitted steer was thrown away. Now it waits as a map fit does, and registers once back."""
    v, seen = _away_at_register(lambda progress: _steer_fit(reg, progress), tmp_path)
    assert WAITING in seen and seen.index(WAITING) > seen.index("register")
    assert [x.version for x in reg.list_steer_versions("tone")] == [v.version] == [1]  # registered once
    assert reg.load_steer(v).dim == 8


def test_a_steer_job_committed_before_its_answer_was_lost_succeeds_with_that_version(reg, tmp_path, monkeypatch):
    """The steer's commit went through and only its answer was lost: the job failed (keeping its key, as the
    version might exist), though the steer was registered. One look before the error finds it: the job succeeds
    with it, registered once; an earlier version of the same rows and labels is not taken for it."""
    X, y = _steer_rows()
    assert fit_and_register(reg, name="tone", space="toy", X=X, labels=y).version == 1  # the same data, fitted before
    monkeypatch.setattr("service.registry.retry.REGISTER_WAITS", ())  # no retry: only the look before the error
    _commit_then(monkeypatch, _lost_answer)

    def fit(ctx):
        return {"ref": fit_and_register(reg, name="tone", space="toy", X=X, labels=y, progress=ctx.progress).ref}

    mgr = JobManager(workers=1, max_queued=4, store=JobStore(tmp_path / "jobs.sqlite"))
    mgr.open()
    try:
        job, _ = mgr.submit(fit, kind="steer-fit", idempotency_key="steer-7", request_hash="h")
        done = wait_job(mgr.get, job.id)
        assert done.state == "succeeded", done.error
        assert done.result == {"ref": "tone:2"}
        assert [v.version for v in reg.list_steer_versions("tone")] == [1, 2]  # registered once more, not twice
    finally:
        mgr.shutdown(wait=True)


@pytest.mark.parametrize("lost_at_commit", [True, False])
def test_a_cancel_while_the_registry_cannot_say_whether_a_try_committed_says_it_may_be_registered(lost_at_commit):
    """A try whose answer was lost at its commit, then a cancel during the wait while the registry is still away: the
    error said "was not registered" although it may have been, and a client trusting it fitted again with a new key
    (a duplicate version). It says the map may have been registered and where to look; a try refused before its
    commit (nothing written) still says it was not registered."""
    from service.progress import run_waking
    from service.registry.retry import until_registered

    tries = []

    def register():
        tries.append(1)
        exc = RegistryUnavailableError("server closed the connection unexpectedly (test)")
        exc.vecbridge_maybe_committed = lost_at_commit  # the registration's own mark: failed at or after its commit
        raise exc

    def found():
        raise RegistryUnavailableError("still away (test)")  # the look-up cannot answer

    wake = threading.Event()
    timer = threading.Timer(0.2, wake.set)  # the job's cancel, during the wait
    timer.start()
    with pytest.raises(Cancelled) as err:
        run_waking(wake, lambda: until_registered(register, lambda stage, f: None, what="map 'a2b'", found=found,
                                                  waits=(30.0,)))
    timer.cancel()
    message = str(err.value)
    assert tries == [1] and "cancelled while waiting for the registry" in message, message
    if lost_at_commit:
        assert "may have been registered" in message and "/v1/maps/NAME/versions" in message, message
        assert "was not registered" not in message
    else:
        assert "map 'a2b' was not registered" in message, message


@pytest.mark.parametrize("other_seed", [7, 3])
def test_a_steer_fit_does_not_take_a_concurrent_fit_of_other_options_for_its_own(reg, monkeypatch, other_seed):
    """Two fits of the same rows and labels with other options (another seed; or the same seed, another alias), the
    registry away at register: the look before a retry took the other job's version for this one (same rows, labels,
    description), so this fit's steer was never registered and its alias never moved. It registers its own."""
    from service.registry import Registry

    X, y = _steer_rows()
    real = Registry.register_steer
    calls = []

    def other_job_first(self, name, steer, **kw):
        calls.append(kw.get("random_state"))
        if len(calls) == 1:  # the other job registers in between, then this try is refused (nothing written)
            fit_and_register(reg, name="tone", space="toy", X=X, labels=y, random_state=other_seed, alias="b-alias")
            raise RegistryUnavailableError("registry away (test)")
        return real(self, name, steer, **kw)

    monkeypatch.setattr("service.registry.retry.REGISTER_WAITS", (0.01,))
    monkeypatch.setattr(Registry, "register_steer", other_job_first)
    mine = fit_and_register(reg, name="tone", space="toy", X=X, labels=y, random_state=3, alias="a-alias")
    assert mine.version == 2 and mine.random_state == 3, mine
    assert {v.version: v.random_state for v in reg.list_steer_versions("tone")} == {1: other_seed, 2: 3}
    assert reg.resolve_steer("tone@a-alias").version == 2 and reg.resolve_steer("tone@b-alias").version == 1
