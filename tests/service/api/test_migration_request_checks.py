"""``POST /v1/migrations`` refuses, before a job exists, a target it would refuse at the job's start: an existing
target without ``overwrite`` (409 naming ``overwrite``), one an alias serves even with it, and a map of the wrong
direction for a collection that records its space (422 naming ``map``). Before, each answered 202 and the job failed
(the first in the CLI's words, "pass --overwrite (overwrite=True)"). The CLI's words are the flags, as they were.

A local-mode Qdrant folder is the service's database (no server to run)."""

from __future__ import annotations

import numpy as np
import pytest
from _api_support import W, settings_for
from fastapi.testclient import TestClient


@pytest.fixture
def world(tmp_path):
    """A service on a Qdrant folder holding ``src`` (space a, 40 rows), ``in_b`` (space b), ``taken`` (no space) and
    ``served`` (alias ``live`` points at it); registry map a2b (a -> b)."""
    pytest.importorskip("qdrant_client")
    from _servers import seed_registry

    from service.api import create_app
    from service.vectordb import open_store

    X, _, _ = seed_registry(tmp_path / "data")
    url = f"qdrant://{tmp_path / 'qd'}"
    with open_store(url) as s:
        for name, space in (("src", "a"), ("in_b", "b"), ("taken", None), ("served", None)):
            s.create(name, X.shape[1])
            if space:
                s.set_space(name, space)
            s.upsert(name, np.arange(40), X[:40])
        s.set_alias("live", "served")
    with TestClient(create_app(settings_for(tmp_path, vectordb_url=url))) as c:
        yield c


def _post(c, **body):
    return c.post("/v1/migrations", json={"map": "a2b", **body}, headers=W)


def test_an_existing_target_is_a_409_naming_overwrite_and_no_job(world):
    r = _post(world, source="src", target="taken")
    msg = r.json()["error"]["message"]
    assert r.status_code == 409 and "target 'taken' exists; send overwrite: true to drop it" in msg, r.text
    assert "--overwrite" not in msg and "overwrite=True" not in msg, msg  # the request's field, not the CLI's flag
    r = _post(world, source="src", target="served", overwrite=True)
    msg = r.json()["error"]["message"]
    assert r.status_code == 409 and "alias(es) live serve; overwrite would drop it" in msg, r.text
    r = _post(world, source="src", target="live", overwrite=True)
    assert r.status_code == 409 and "target 'live' is an alias (of 'served')" in r.json()["error"]["message"], r.text
    r = _post(world, source="src", target="new", alias="taken")
    assert r.status_code == 409 and "alias 'taken' names a collection" in r.json()["error"]["message"], r.text
    assert world.get("/v1/jobs", headers=W).json()["data"] == []  # nothing queued
    r = _post(world, source="src", target="taken", overwrite=True, dry_run=True)  # overwrite: accepted
    assert r.status_code == 202, r.text


def test_a_map_of_the_wrong_direction_is_a_422_naming_map(world):
    r = _post(world, source="in_b", target="new")
    msg = r.json()["error"]["message"]
    assert r.status_code == 422 and "'in_b' records space 'b' but map 'a2b:1' reads 'a'" in msg, r.text
    assert "the wrong way round" in msg and "give map a map from 'b'" in msg, msg
    r = _post(world, source="src", target="new", source_space="b")
    assert r.status_code == 422 and "source_space says 'b'" in r.json()["error"]["message"], r.text
    assert world.get("/v1/jobs", headers=W).json()["data"] == []
    r = _post(world, source="taken", target="new", dry_run=True)  # no recorded space: the job checks its rows
    assert r.status_code == 202, r.text


def test_a_text_field_none_of_the_first_points_has_is_a_422_naming_it_and_the_keys_seen(world, tmp_path):
    """Qdrant payloads have no schema: ``text_field`` went unchecked, and a request naming a key the points do not
    have (``body`` where the texts are under ``text``) ran a job that migrated every row without its text. The first
    points' payloads are read now: a key none of them has is a 422 naming ``text_field`` and the keys seen, no job;
    one they have is accepted, and the default ``text`` (no texts: a collection without them) still is."""
    from service.vectordb import open_store

    X = np.random.default_rng(0).standard_normal((20, 16)).astype(np.float32)
    with open_store(f"qdrant://{tmp_path / 'qd'}") as s:  # the service's folder: one client in this process
        s.create("texts", 16)
        s.set_space("texts", "a")
        s.upsert("texts", np.arange(20), X, [f"t{i}" for i in range(20)], {"lang": ["en"] * 20})
    r = _post(world, source="texts", target="new", text_field="body")
    msg = r.json()["error"]["message"]
    assert r.status_code == 422 and "source 'texts' has no text field 'body'" in msg, r.text
    assert "payload keys lang, text (none of the first 16 points has 'body'): fix text_field" in msg, msg
    assert world.get("/v1/jobs", headers=W).json()["data"] == []
    assert _post(world, source="texts", target="new", text_field="lang", dry_run=True).status_code == 202
    assert _post(world, source="src", target="new2", dry_run=True).status_code == 202  # no payloads, no text named


def test_the_checks_name_the_cli_flags_for_the_cli(tmp_path):
    """The same checks as ``vecbridge migrate`` words them (exit 2: typed errors)."""
    pytest.importorskip("qdrant_client")
    from service.ops.migration_checks import check_map_space, check_target
    from service.vectordb import CollectionExistsError, QdrantStore, SpaceMismatchError

    s = QdrantStore(path=":memory:")
    try:
        s.create("src", 4), s.create("dst", 4), s.set_space("src", "b")
        with pytest.raises(CollectionExistsError) as e:
            check_target(s, "src", "dst", alias=None, overwrite=False, fresh=True)
        assert "pass --overwrite (overwrite=True) to drop it, or choose another --target" in str(e.value)
        check_target(s, "src", "dst", alias=None, overwrite=False, fresh=False)  # a resume: its target exists
        with pytest.raises(SpaceMismatchError) as e:
            check_map_space(s, "src", None, "a2b", "a", "b")
        assert "but --map 'a2b' reads 'a'" in str(e.value) and "give --map a map from 'b'" in str(e.value)
        check_map_space(s, "dst", None, "a2b", "a", "b")  # nothing recorded: the run checks the rows
    finally:
        s.close()
