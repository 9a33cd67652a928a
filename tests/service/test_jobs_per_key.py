"""One API key's share of the job queue (``max_queued_jobs_per_key``): a key that submits back to back fills its
share, not the queue. Before, the queue was one FIFO for every key: key A's back-to-back fits took every place and
key B's next fit was a 429 "job queue is full" until A's had drained."""

from __future__ import annotations

import httpx
import pytest
from _api_support import planted, populate, settings_for
from _jobs_support import slow_job
from _jobs_support import wait_job as wait
from _servers import serve_in_thread

from service.api import create_app
from service.jobs import JobManager, QueueFullError
from service.ops.jobs import per_key_limit

A = {"Authorization": "Bearer key-a-111"}
B = {"Authorization": "Bearer key-b-222"}
READER = {"Authorization": "Bearer key-r-333"}
TWO_KEYS = {"key-a-111": ["read", "write"], "key-b-222": ["read", "write"], "key-r-333": ["read"]}


def _fit(name: str) -> dict:
    X, Y, _ = planted(50)
    return {"name": name, "source_space": "a", "target_space": "b", "method": "procrustes", "paired": True,
            "source": {"vectors": X.tolist()}, "target": {"vectors": Y.tolist()}}


def _busy(app):
    """Occupy the one job worker, so every job submitted from now on waits; its job."""
    slow, started = slow_job(10_000)
    job, _ = app.state.vb.jobs.submit(slow, kind="t")
    assert started.wait(10)
    return job


def test_one_key_fills_its_share_and_another_key_still_queues(tmp_path):
    """Two write keys, max_queued_jobs=4: each may have 2 (the default, half) waiting. Key A's third fit is a 429
    naming the per-key limit and its setting; key B still gets its 202; A's idempotent replay is never refused."""
    app = create_app(settings_for(tmp_path, api_keys=TWO_KEYS, max_queued_jobs=4))
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=60) as c:
        populate(app.state.vb.registry)
        busy = _busy(app)
        info = c.get("/v1/info", headers=READER).json()["limits"]
        assert info["max_queued_jobs_per_key"] == 2 and info["max_queued_jobs"] == 4
        first = c.post("/v1/fits", headers={**A, "Idempotency-Key": "a-1"}, json=_fit("a1"))
        assert first.status_code == 202, first.text
        assert c.post("/v1/fits", headers=A, json=_fit("a2")).status_code == 202
        extra = c.post("/v1/fits", headers=A, json=_fit("a3"))
        assert extra.status_code == 429 and extra.headers["retry-after"], extra.text
        msg = extra.json()["error"]["message"]
        assert "per-key limit 2" in msg and "max_queued_jobs_per_key" in msg and "2 of its jobs waiting" in msg, msg
        replay = c.post("/v1/fits", headers={**A, "Idempotency-Key": "a-1"}, json=_fit("a1"))
        assert replay.status_code == 200 and replay.json()["id"] == first.json()["id"], replay.text
        b = c.post("/v1/fits", headers=B, json=_fit("b1"))
        assert b.status_code == 202, b.text  # before: 429 "job queue is full" (A held the places)
        assert c.post("/v1/fits", headers=B, json=_fit("b2")).status_code == 202
        full = c.post("/v1/fits", headers=B, json=_fit("b3"))  # B's share is full too (and so is the queue)
        assert full.status_code == 429, full.text
        # a cancelled job leaves A's share: A queues again
        assert c.delete(f"/v1/jobs/{first.json()['id']}", headers=A).json()["state"] == "cancelled"
        assert c.post("/v1/fits", headers=A, json=_fit("a4")).status_code == 202
        app.state.vb.jobs.cancel(busy.id)


def test_a_fit_past_its_key_s_share_is_refused_before_its_body_is_parsed(tmp_path):
    """A fit refused for its key's share (max_queued_jobs_per_key) was refused only after its whole body (up to
    64 MiB) had been read and parsed, as the full queue's refusal was before it got its early check: a body cut
    short (not valid JSON) was the parse's 422, not the 429. Now the share is checked before the body: a 429 naming
    the per-key limit. A retry of a job A made still gets it (200); key B, with room, still gets the parse's 422."""
    import json

    app = create_app(settings_for(tmp_path, api_keys=TWO_KEYS, max_queued_jobs=4, max_batch=1_000_000))
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=60) as c:
        populate(app.state.vb.registry)
        busy = _busy(app)
        first = c.post("/v1/fits", headers={**A, "Idempotency-Key": "a-1"}, json=_fit("a1"))
        assert first.status_code == 202, first.text
        assert c.post("/v1/fits", headers=A, json=_fit("a2")).status_code == 202  # A's share (2) is full
        cut = json.dumps(_fit("a3"))[:-1].encode()
        json_type = {"Content-Type": "application/json"}
        for key in (None, "a-2"):  # no key, or a key of no job
            r = c.post("/v1/fits", content=cut, headers={**A, **json_type, **({"Idempotency-Key": key} if key else {})})
            assert r.status_code == 429 and float(r.headers["retry-after"]) > 0, (r.status_code, r.text[:300])
            assert "per-key limit 2" in r.json()["error"]["message"], r.text
        replay = c.post("/v1/fits", headers={**A, "Idempotency-Key": "a-1"}, json=_fit("a1"))
        assert replay.status_code == 200 and replay.json()["id"] == first.json()["id"], replay.text
        r = c.post("/v1/fits", content=cut, headers={**B, **json_type})
        assert r.status_code == 422, r.text  # B's share and the queue have room: parsed and refused, as ever
        assert len(app.state.vb.jobs.list()) == 3  # the slow job and A's two fits: nothing else was queued
        for job in (first.json()["id"], busy.id):
            app.state.vb.jobs.cancel(job)


def test_check_room_counts_the_owner_s_share():
    """The early check refuses what submit would refuse for the owner's share, and never a replay of its key."""
    mgr = JobManager(workers=1, max_queued=8)
    slow, started = slow_job(10_000)
    running, _ = mgr.submit(slow, kind="t")
    assert started.wait(10)
    waiting, _ = mgr.submit(lambda ctx: {}, kind="t", idempotency_key="k1", owner="k", owner_limit=1)
    with pytest.raises(QueueFullError, match="1 of its jobs waiting, per-key limit 1"):
        mgr.check_room(None, "k", 1)
    with pytest.raises(QueueFullError, match="per-key limit 1"):
        mgr.check_room("k2", "k", 1)
    mgr.check_room("k1", "k", 1)  # its job: submit answers it
    mgr.check_room(None, "other", 1)
    mgr.check_room(None, "k", None)  # no bound of its own
    mgr.check_room()
    for job in (waiting, running):
        mgr.cancel(job.id)
    mgr.shutdown(wait=True)


@pytest.mark.parametrize("settings", [{"api_keys": {"solo-key-1": ["read", "write"], "reader-2": ["read"]}},
                                      {"api_keys": {}, "auth_disabled": True}], ids=["one-key", "auth-off"])
def test_a_lone_user_keeps_the_whole_queue(tmp_path, settings):
    """One write key (or auth off, where every caller is one key): no bound of its own by default, so the lone
    user queues max_queued_jobs jobs as before; the next is the queue's own 429."""
    app = create_app(settings_for(tmp_path, max_queued_jobs=3, **settings))
    headers = {} if settings.get("auth_disabled") else {"Authorization": "Bearer solo-key-1"}
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=60) as c:
        populate(app.state.vb.registry)
        busy = _busy(app)
        for i in range(3):
            r = c.post("/v1/fits", headers=headers, json=_fit(f"s{i}"))
            assert r.status_code == 202, (i, r.text)
        r = c.post("/v1/fits", headers=headers, json=_fit("s3"))
        assert r.status_code == 429 and "job queue is full (3 waiting, limit 3)" in r.json()["error"]["message"]
        app.state.vb.jobs.cancel(busy.id)


def test_an_explicit_per_key_bound_applies_with_auth_off(tmp_path):
    """Set, the bound holds for every key; with auth off all callers are that one key."""
    app = create_app(settings_for(tmp_path, api_keys={}, auth_disabled=True, max_queued_jobs=4,
                                  max_queued_jobs_per_key=1))
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=60) as c:
        populate(app.state.vb.registry)
        busy = _busy(app)
        assert c.post("/v1/fits", json=_fit("x1")).status_code == 202
        r = c.post("/v1/fits", json=_fit("x2"))
        assert r.status_code == 429 and "per-key limit 1" in r.json()["error"]["message"], r.text
        app.state.vb.jobs.cancel(busy.id)


def test_the_default_share():
    assert per_key_limit(None, 8, 2) == 4 and per_key_limit(None, 1, 5) == 1 and per_key_limit(None, 0, 3) == 1
    assert per_key_limit(None, 8, 1) is None and per_key_limit(None, 8, 0) is None
    assert per_key_limit(0, 8, 1) == 0 and per_key_limit(9, 8, 2) == 9


def test_a_zero_share_runs_a_key_s_jobs_only_on_idle_workers():
    """0, as max_queued_jobs=0: a job a free worker takes at once does not wait, so it is accepted."""
    mgr = JobManager(workers=1, max_queued=8)
    slow, started = slow_job(10_000)
    running, _ = mgr.submit(slow, kind="t", owner="k", owner_limit=0)  # the idle worker takes it
    assert started.wait(10)
    with pytest.raises(QueueFullError, match="0 of its jobs waiting, per-key limit 0"):
        mgr.submit(lambda ctx: {}, kind="t", owner="k", owner_limit=0)
    other, _ = mgr.submit(lambda ctx: {}, kind="t", owner="other", owner_limit=1)
    assert other.state == "queued"
    mgr.cancel(running.id)
    assert wait(mgr.get, other.id).state == "succeeded"
    done, _ = mgr.submit(lambda ctx: {"ok": 1}, kind="t", owner="k", owner_limit=0)
    assert wait(mgr.get, done.id).state == "succeeded"
    mgr.shutdown(wait=True)
