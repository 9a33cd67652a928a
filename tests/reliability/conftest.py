"""Fixtures of the reliability suite: an in-process app with a populated registry, PostgreSQL databases."""

from __future__ import annotations


import pytest
from fastapi.testclient import TestClient

from service.api import create_app

from .helpers import W, planted, populate, settings_for

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(client, app, data): TestClient over a populated registry with a 16-d flat index ``ix`` in space b."""
    tmp = tmp_path_factory.mktemp("rel")
    app = create_app(settings_for(tmp, max_batch=500, max_body_bytes=400_000, max_queued_jobs=4))
    with TestClient(app, raise_server_exceptions=False) as client:
        data = populate(app.state.vb.registry)
        _, Y, _ = planted()
        r = client.post("/v1/indexes", headers=W, json={"name": "ix", "space": "b", "vectors": Y[:100].tolist()})
        assert r.status_code == 201, r.text
        yield client, app, data
