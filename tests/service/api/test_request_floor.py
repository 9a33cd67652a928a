"""The fixed work of one request (issue 11, the per-request floor).

A batch-1 search does ~0.2 ms of work; what every request did around it was several times that. Each test pins one
piece: what a search on the event loop reads from disk, how a large answer is serialised, what a request after the
first no longer looks up (its route, its metric series), and what an access-log line costs — with the behaviour
each piece must keep (a change by another process seen at the next request, the same bytes, the same counts, the
same log lines).
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
from pathlib import Path

import numpy as np
import pytest
from _api_support import R, W, served_world

from align import fit_procrustes
from service.api.routers import indexes as index_routes
from service.api.state import InMemory
from service.registry import open_registry

SEARCH = "/v1/indexes/ix/search"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with served_world(tmp_path_factory.mktemp("floor")) as (client, app, data):
        app.state.vb.indexes.create("ix", "b", data["Y"][:300], dim=16)
        yield client, app, data


def body(X, **extra) -> bytes:
    return json.dumps({"vectors_b64": base64.b64encode(np.ascontiguousarray(X, np.float32).tobytes()).decode(),
                       "dim": int(X.shape[1]), "space": "a", "k": 10, **extra}).encode()


def post(c, content: bytes):
    return c.post(SEARCH, content=content, headers={**R, "content-type": "application/json"})


def test_a_search_on_the_loop_reads_the_registry_file_once_and_builds_no_path(world, monkeypatch):
    """The fast path's search (``search_call`` with ``InMemory``, as on the event loop) read the registry's change
    token twice (space, then path of maps: two ``stat`` + ``pread``) and built ``<index>/meta.json`` anew for its
    ``stat``: now one read of the token per request and one ``stat`` of each of the two files."""
    c, app, data = world
    state = app.state.vb
    q = body(data["X"][:1])
    first = post(c, q)
    assert first.status_code == 200, first.text
    idx = state.indexes.in_memory("ix")
    tokens, stats, joins = [], [], []
    real_stat, real_join = os.stat, pathlib.PurePath.__truediv__
    with monkeypatch.context() as m:
        m.setattr(state.registry, "change_token", lambda real=state.registry.change_token: tokens.append(1) or real())
        m.setattr(os, "stat", lambda p, *a, **k: stats.append(Path(os.fspath(p)).name) or real_stat(p, *a, **k))
        m.setattr(pathlib.PurePath, "__truediv__", lambda self, key: joins.append(key) or real_join(self, key))
        _, response = index_routes.search_call(state, state.settings, idx, q, resolver=InMemory(state), wait=False)
    assert response.body == first.content
    assert len(tokens) == 1, tokens
    assert sorted(stats) == sorted(["meta.json", Path(state.registry.db.path).name]), stats
    assert joins == []


def test_a_search_on_the_loop_still_sees_another_processs_alias_move_at_once(world):
    """Read once per request, the token is still read at every request: a map moved by another process (another
    Registry on the same file) is the one the very next search uses."""
    c, app, data = world
    state = app.state.vb
    q = body(data["X"][:1])
    before = post(c, q).json()["maps"]
    assert [m["version"] for m in before] == [1]
    other = open_registry(state.settings.resolved_registry_url(), state.settings.resolved_artifact_dir())
    try:
        v2 = other.register_version("a2b", fit_procrustes(data["X"][:300] * 2.0, data["Y"][:300]), source_space="a",
                                    target_space="b", method="procrustes", params={}, alias="prod")
    finally:
        other.close()
    try:
        assert [m["version"] for m in post(c, q).json()["maps"]] == [v2.version]
        assert [m["version"] for m in post(c, body(data["X"][:1], map="a2b@prod")).json()["maps"]] == [v2.version]
    finally:
        assert c.put("/v1/maps/a2b/aliases/prod", json={"version": 1}, headers=W).status_code == 200
    assert [m["version"] for m in post(c, q).json()["maps"]] == [1]
