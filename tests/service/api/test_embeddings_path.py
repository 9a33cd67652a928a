"""/v1/embeddings with target_space: the map path is resolved before any text is encoded."""

from __future__ import annotations

from fastapi.testclient import TestClient

from service.api import create_app
from _api_support import R, settings_for


def test_unknown_target_space_or_path_is_a_404_before_the_encoder_loads(tmp_path, monkeypatch):
    import service.encoders

    asked = []
    monkeypatch.setattr(service.encoders, "get_encoder", lambda name: asked.append(name))  # the one encoder loader
    app = create_app(settings_for(tmp_path))
    with TestClient(app) as c:
        state = app.state.vb
        state.registry.register_space("minilm", 384, encoder="all-MiniLM-L6-v2")
        state.registry.register_space("e5", 384, encoder="multilingual-e5-small")
        for target, why in (("nowhere", "unknown space"), ("e5", "no chain of maps")):
            r = c.post("/v1/embeddings", headers=R, json={"model": "minilm", "input": ["a dog"], "target_space": target})
            assert r.status_code == 404 and why in r.json()["error"]["message"], r.text
        assert asked == []  # no encoder was asked for, so nothing was loaded or encoded
