"""The order of the job records is the order the jobs were made, not the wall clock.

The store listed, paged and trimmed its records by ``created_at``: rows written while the clock was ahead (an NTP
step back, a VM restored from a snapshot) made every job after them look old. A fit submitted then was missing from
``GET /v1/jobs?order=newest&limit=50`` (the console's newest page), the next start-up's trim deleted it first (a 404
on its id) with its Idempotency-Key, and a client's retry ran the fit again: a duplicate version. The records carry
``seq`` (an insertion sequence that never goes back), by which they are listed, paged and trimmed.
"""

from __future__ import annotations

import base64
import json
import shutil
import sqlite3
import time
import uuid
from pathlib import Path

from _api_support import R, W, planted, populate, settings_for, walk_pages
from _jobs_support import wait_http_job
from fastapi.testclient import TestClient

from service.api import create_app
from service.jobs import Job, JobStore

#: the columns every release writes (a release before ``seq`` names these, the store fills in the sequence)
OLD_COLUMNS = ("id", "kind", "description", "state", "stage", "fraction", "created_at", "started_at", "finished_at",
               "stage_seconds", "result", "error", "idempotency_key", "request_hash", "cancel_requested", "owner")
OLD_STORE = Path(__file__).resolve().parents[1] / "fixtures" / "upgrade_a9b56d8" / "data" / "jobs.sqlite"
DAY = 86_400.0


def _write_rows(db: Path, n: int, created_at: float, *, state: str = "succeeded") -> list[str]:
    """``n`` job rows written straight into ``db`` as a process whose clock read ``created_at`` wrote them (1 s
    apart; another process's, long gone); their ids."""
    ids = [uuid.uuid4().hex for _ in range(n)]
    with sqlite3.connect(db) as c:
        for i, jid in enumerate(ids):
            t = created_at + i
            row = (jid, "fit", "clock ahead", state, "done", 1.0, t, t, t + 1, "{}", json.dumps({"i": i}), None, None,
                   None, 0, "0" * 32)  # in the order of OLD_COLUMNS
            c.execute(f"INSERT INTO jobs ({', '.join(OLD_COLUMNS)}) VALUES ({', '.join('?' * len(OLD_COLUMNS))})", row)
    return ids


def _ids(c: TestClient, **params) -> tuple[list[str], dict]:
    r = c.get("/v1/jobs", headers=R, params=params)
    assert r.status_code == 200, r.text
    return [j["id"] for j in r.json()["data"]], r.json()


def test_a_fit_made_after_a_clock_that_was_ahead_is_listed_newest_and_kept_with_its_key(tmp_path):
    settings = settings_for(tmp_path, job_history=100)
    X, Y, _ = planted(80)
    body = {"name": "after-clock", "source_space": "a", "target_space": "b", "method": "procrustes", "paired": True,
            "source": {"vectors": X.tolist()}, "target": {"vectors": Y.tolist()}}
    app = create_app(settings)
    with TestClient(app):
        populate(app.state.vb.registry)
    ahead = _write_rows(settings.data_dir / "jobs.sqlite", 120, time.time() + DAY)  # the clock was a day ahead
    with TestClient(create_app(settings)) as c:
        r = c.post("/v1/fits", headers={**W, "Idempotency-Key": "fit-after-clock"}, json=body)
        assert r.status_code == 202, r.text
        job = r.json()["id"]
        assert wait_http_job(c, job, headers=R)["state"] == "succeeded"
        got, page = _ids(c, order="newest", limit=50)
        assert got[0] == job, "the newest job is missing from the console's newest page"
        assert got[1:] == ahead[::-1][:49]
        assert page["data"][0]["seq"] > page["data"][1]["seq"]
        # oldest first: made last, listed last (this start-up's trim kept the newest 100 of the 120)
        assert _ids(c)[0] == [*ahead[20:], job] and _ids(c, limit=5)[0] == ahead[20:25]
    with TestClient(create_app(settings)) as c:  # a restart: its start-up trim keeps the 100 newest finished jobs
        r = c.get(f"/v1/jobs/{job}", headers=R)
        assert r.status_code == 200, "the start-up trim deleted the newest job"
        got, page = _ids(c, order="newest", limit=1000)
        assert got == [job, *ahead[::-1][:99]] and page["counts"]["succeeded"] == 100
        retry = c.post("/v1/fits", headers={**W, "Idempotency-Key": "fit-after-clock"}, json=body)
        assert retry.status_code == 200 and retry.json()["id"] == job, retry.text  # its key still names it
        versions = c.get("/v1/maps/after-clock/versions", headers=R).json()
        assert [v["version"] for v in versions["data"]] == [1], versions  # no second fit, no duplicate version


def _cursor(key) -> str:
    return base64.urlsafe_b64encode(json.dumps(key).encode()).decode().rstrip("=")


def test_pages_walk_each_job_once_while_jobs_are_made_and_the_clock_steps_back(tmp_path):
    """Between two pages, another process makes jobs whose clocks read a day back and a day ahead: an oldest-first
    walk ends with them, once each, after every job it started with; a newest-first walk sees each job it started
    with once, and none of the new ones (they come before its first page). By created_at, the walk skipped the
    jobs dated back and met the ones dated ahead twice over the two walks' turns."""
    settings = settings_for(tmp_path)
    with TestClient(create_app(settings)) as c:
        store = JobStore(settings.data_dir / "jobs.sqlite")  # another process of the data dir

        def make(n: int, when: float) -> list[str]:
            jobs = [Job(id=uuid.uuid4().hex, kind="verify", state="succeeded", stage="done", fraction=1.0,
                        created_at=when + i, started_at=when + i, finished_at=when + i) for i in range(n)]
            assert all(store.insert(j) is None for j in jobs)
            return [j.id for j in jobs]

        start = make(30, time.time())
        for order in ("oldest", "newest"):
            made, seen = list(start), []
            for page in walk_pages(lambda cursor, order=order: _ids(c, order=order, limit=4,
                                                                    **({"cursor": cursor} if cursor else {}))[1]):
                seen += [j["id"] for j in page["data"]]
                if page["next"] is not None:
                    made += make(2, time.time() - DAY) + make(1, time.time() + DAY)
            assert len(seen) == len(set(seen)), "a job was sent twice"
            if order == "oldest":
                assert seen == made  # every job once, in the order made: the new ones too, as the walk reached them
            else:
                assert seen == start[::-1]  # those made during the walk are newer than its first page
            start = made
        store.close()
        # a cursor of the release that paged by (created_at, id): refused with a word, not read as a place
        for key, order in (([time.time(), start[0]], "oldest"), ([time.time(), start[0], "newest"], "newest")):
            r = c.get("/v1/jobs", headers=R, params={"order": order, "limit": 4, "cursor": _cursor(key)})
            assert r.status_code == 422 and "earlier release" in r.text, (r.status_code, r.text[:300])
        r = c.get("/v1/jobs", headers=R, params={"limit": 4, "cursor": _cursor(["seq", 2**63])})
        assert r.status_code == 422 and "does not belong to this list" in r.text, (r.status_code, r.text[:300])


def test_a_store_of_the_previous_release_is_upgraded_in_place(tmp_path):
    """The upgrade fixture's jobs.sqlite (written by release a9b56d8: no seq, no saved_at), with rows of a clock a
    day ahead and a day back added as that release would write them: opened, its rows are numbered in their
    created_at order (all it knew), and every job made after them is newer, listed and kept so; a process of the
    old release still writes to the upgraded table (its rows numbered too)."""
    db = tmp_path / "jobs.sqlite"
    shutil.copyfile(OLD_STORE, db)
    with sqlite3.connect(db) as c:
        assert "seq" not in {r[1] for r in c.execute("PRAGMA table_info(jobs)")}
        old = [jid for jid, in c.execute("SELECT id FROM jobs ORDER BY created_at, id")]
    ahead = _write_rows(db, 120, time.time() + DAY)
    back = _write_rows(db, 3, time.time() - 300 * DAY)
    store = JobStore(db, keep_finished=100)
    stored = store.list(1000)
    assert [j.id for j in stored] == [*back, *old, *ahead]  # numbered in created_at order
    new = Job(id=uuid.uuid4().hex, kind="fit", state="succeeded", stage="done", fraction=1.0, finished_at=time.time())
    assert store.insert(new) is None
    by_old_release = _write_rows(db, 1, time.time() - DAY)  # an INSERT naming the old columns only
    assert [j.id for j in store.list(2, newest=True)] == [*by_old_release, new.id]
    store.trim()
    kept = [j.id for j in store.list(1000)]
    assert kept[-2:] == [new.id, *by_old_release] and len(kept) == 100 and set(kept[:-2]) <= set(ahead)
    assert store.get(new.id) is not None
    assert [j.seq for j in stored] == list(range(1, len(stored) + 1)) and new.seq == len(stored) + 1
    store.close()
    again = JobStore(db)  # opened again: no second upgrade, the numbers stay
    assert [(j.id, j.seq) for j in again.list(1000)] == [(j.id, j.seq) for j in store.list(1000)]
    again.close()
