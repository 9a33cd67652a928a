"""``POST /v1/migrations`` refuses, before a job exists, a target it would refuse at the job's start: an existing
target without ``overwrite`` (409 naming ``overwrite``), one an alias serves even with it, a map of the wrong
direction for a collection that records its space, or one of another width than its vectors (422 naming ``map``),
and keep ids of another kind than the source's (422). Before, each answered 202 and the job failed (the first in the
CLI's words, "pass --overwrite (overwrite=True)"). The CLI's words are the flags, as they were.
``POST /v1/verifications`` checks its collections' fields as a migration request does (422 / 404, no job).

A local-mode Qdrant folder is the service's database (no server to run)."""

from __future__ import annotations

import numpy as np
import pytest
from _api_support import W, settings_for
from fastapi.testclient import TestClient


@pytest.fixture
def world(tmp_path):
    """A service on a Qdrant folder holding ``src`` (space a, 40 rows), ``in_b`` (space b), ``taken`` (no space),
    ``served`` (alias ``live`` points at it) and ``narrow`` (8-d rows, no space); registry map a2b (a -> b, 16-d)."""
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
        s.create("narrow", 8)
        s.upsert("narrow", np.arange(40), X[:40, :8])
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
    assert "payload keys lang, text on its first 16 points (no point has 'body'): fix text_field" in msg, msg
    assert world.get("/v1/jobs", headers=W).json()["data"] == []
    assert _post(world, source="texts", target="new", text_field="lang", dry_run=True).status_code == 202
    assert _post(world, source="src", target="new2", dry_run=True).status_code == 202  # no payloads, no text named


def test_a_text_field_only_points_past_the_first_ones_have_is_accepted(world, tmp_path):
    """Review: the check read the first 16 points' payloads only, so a collection whose first points (by id) carry
    no text (images, section headers) and whose later ones do was refused its text field (exit 2 / 422), though
    migrating it carries every text there is. Qdrant counts the points having the key: refused only at none."""
    from qdrant_client import models

    from service.vectordb import open_store

    X = np.random.default_rng(0).standard_normal((100, 16)).astype(np.float32)
    with open_store(f"qdrant://{tmp_path / 'qd'}") as s:  # the service's folder: one client in this process
        s.create("sparse", 16)
        s.set_space("sparse", "a")
        s.client.upsert("sparse", points=[models.PointStruct(
            id=i, vector=X[i].tolist(), payload={"kind": "image"} if i < 20 else {"kind": "doc", "body": f"t{i}"})
            for i in range(100)])
    r = _post(world, source="sparse", target="new", text_field="body", dry_run=True)
    assert r.status_code == 202, r.text
    r = _post(world, source="sparse", target="new", text_field="caption")
    msg = r.json()["error"]["message"]
    assert r.status_code == 422 and "payload keys kind on its first 16 points (no point has 'caption')" in msg, msg


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


def test_a_map_of_another_width_is_a_422_naming_map_and_no_job(world, tmp_path):
    """A map whose input is 16-d for a collection of 8-d vectors (a map for another model, and no space recorded to
    tell it by): 202, then a job that failed with "'narrow' holds 8-d vectors, the map expects 16-d". Refused as the
    request comes, naming ``map``; no job, no target, no checkpoint."""
    r = _post(world, source="narrow", target="new")
    msg = r.json()["error"]["message"]
    assert r.status_code == 422 and r.json()["error"]["type"] == "DimensionMismatchError", r.text
    assert "source 'narrow' holds 8-d vectors but map 'a2b:1' reads 16-d rows" in msg, msg
    assert "give map a map from the source's 8-d space" in msg and "--map" not in msg, msg
    r = _post(world, source="narrow", target="new", dry_run=True)  # a dry run makes the run's checks: the same
    assert r.status_code == 422, r.text
    assert world.get("/v1/jobs", headers=W).json()["data"] == []
    assert not list((tmp_path / "data").glob("migrations/*.json"))


def test_keep_ids_of_another_kind_than_the_sources_are_a_422_and_no_job(world):
    """``src`` keys its rows by integers: keep ids that are not integers were refused by the job (202, then failed);
    the request reads the source's first row and refuses them itself."""
    keep = {"ids": ["a", "b"], "vectors": [[0.1] * 16, [0.2] * 16]}
    r = _post(world, source="src", target="new", keep=keep)
    msg = r.json()["error"]["message"]
    assert r.status_code == 422 and "'src' keys its rows by integers, but the keep ids hold 2 that are not" in msg, \
        r.text
    assert world.get("/v1/jobs", headers=W).json()["data"] == []
    r = _post(world, source="src", target="new", keep={**keep, "ids": ["3", "7"]}, dry_run=True)  # decimal strings
    assert r.status_code == 202, r.text


def test_a_verification_with_a_field_its_collections_lack_is_refused_before_a_job_exists(world):
    """``POST /v1/verifications`` named a field the collection lacks (or a collection that does not exist): 202, then
    a job that failed. Refused as the request comes, with the check a migration request makes (the field named as
    the request names it, the collection as the request's ``collection`` or ``source``); no job."""
    base = {"collection": "src", "source": "src", "map": "a2b"}
    r = world.post("/v1/verifications", json={**base, "vector_field": "emb"}, headers=W)
    msg = r.json()["error"]["message"]
    assert r.status_code == 422, r.text
    assert "collection 'src' has no vector field 'emb'; it has one unnamed vector" in msg and "fix vector_field" in msg
    assert "--vector-field" not in msg, msg
    r = world.post("/v1/verifications", json={**base, "collection": "nope"}, headers=W)
    assert r.status_code == 404 and "nope" in r.json()["error"]["message"], r.text
    r = world.post("/v1/verifications", json={**base, "source": "gone"}, headers=W)
    assert r.status_code == 404 and "gone" in r.json()["error"]["message"], r.text
    assert world.get("/v1/jobs", headers=W).json()["data"] == []
    r = world.post("/v1/verifications", json=base, headers=W)  # fields the collections have: queued
    assert r.status_code == 202, r.text


def test_the_width_keep_and_field_checks_name_the_cli_flags_for_the_cli(tmp_path):
    """The checks as ``vecbridge migrate`` / ``verify`` word them (exit 2: typed errors): ``--map``, the keep set's
    flags, ``--vector-field``."""
    pytest.importorskip("qdrant_client")
    from align.exceptions import DimensionMismatchError, InputError
    from service.ops.migration_checks import check_keep_matches, check_map_width, check_source_fields
    from service.vectordb import CheckpointMismatchError, QdrantStore

    s = QdrantStore(path=str(tmp_path / "qd"))
    try:
        s.create("src", 4)
        with pytest.raises(DimensionMismatchError) as e:
            check_map_width(s, "src", "a2b", 6)
        assert "source 'src' holds 4-d vectors but --map 'a2b' reads 6-d rows" in str(e.value), e.value
        check_map_width(s, "src", "a2b", 4)
        check_map_width(s, "src", "a2b", None)  # not known before the run: its own check
        with pytest.raises(CheckpointMismatchError, match="Give the same --keep-ids / --keep-vectors"):
            check_keep_matches({"keep_digest": "ab" * 32, "keep_rows": 3}, None)
        check_keep_matches({"keep_digest": None}, None)
        check_keep_matches(None, None)  # no checkpoint
    finally:
        s.close()
    named = QdrantStore(path=str(tmp_path / "qd"), vector_field="emb")
    try:
        with pytest.raises(InputError, match="collection 'src' has no vector field 'emb'.*fix --vector-field"):
            check_source_fields(named, "src", {"vector_field": "emb"}, role="collection")
    finally:
        named.close()


def test_a_map_the_wrong_way_round_between_spaces_of_different_widths_is_called_that_on_both_faces(tmp_path):
    """Review: the width check ran before the space check, so a map a -> c (16-d -> 8-d) given for a collection that
    records space c (8-d rows) was "a map for another model" over HTTP and in ``vecbridge migrate``, where the space
    the collection records tells that it is the map the wrong way round."""
    pytest.importorskip("qdrant_client")
    from _servers import seed_registry

    from align import fit_ridge
    from service.api import create_app
    from service.ops.vectordb import run_migration
    from service.registry import open_registry
    from service.vectordb import SpaceMismatchError, open_store

    X, _, _ = seed_registry(tmp_path / "data")
    Z = np.random.default_rng(0).standard_normal((len(X), 8)).astype(np.float32)
    reg = open_registry(f"sqlite:///{(tmp_path / 'data' / 'registry.sqlite').resolve()}",
                        (tmp_path / "data" / "artifacts").resolve())
    reg.register_space("c", 8)
    reg.register_version("a2c", fit_ridge(X, Z), source_space="a", target_space="c", method="ridge", params={})
    url = f"qdrant://{tmp_path / 'qd'}"
    with open_store(url) as s:
        s.create("in_c", 8)
        s.set_space("in_c", "c")
        s.upsert("in_c", np.arange(40), Z[:40])
    with pytest.raises(SpaceMismatchError) as e:
        run_migration(store_url=url, source="in_c", target="new", map_ref="a2c", registry=reg,
                      checkpoint=tmp_path / "c.json")
    assert "'in_c' records space 'c' but --map 'a2c' reads 'a': the map the wrong way round (it maps 'a' to " \
           "'c'); give --map a map from 'c'" in str(e.value), str(e.value)
    reg.close()
    with TestClient(create_app(settings_for(tmp_path, vectordb_url=url))) as c:
        r = c.post("/v1/migrations", json={"map": "a2c", "source": "in_c", "target": "new"}, headers=W)
    msg = r.json()["error"]["message"]
    assert r.status_code == 422 and r.json()["error"]["type"] == "SpaceMismatchError", r.text
    assert "the map the wrong way round (it maps 'a' to 'c'); give map a map from 'c'" in msg, msg


def test_a_collection_says_the_space_it_records_so_a_map_from_it_can_be_picked(world):
    """The console's migration form offered the first map by name whatever the collection held: nothing said a
    collection's space. ``GET /v1/collections/{name}`` does (null when it records none), for an alias too."""
    got = {name: world.get(f"/v1/collections/{name}", headers=W) for name in ("src", "taken", "live", "nope")}
    assert got["src"].status_code == 200 and got["src"].json() == {
        "name": "src", "space": "a", "dim": 16, "count": 40, "metric": "cosine"}, got["src"].text
    assert got["taken"].status_code == 200 and got["taken"].json()["space"] is None, got["taken"].text
    assert got["live"].status_code == 200 and got["live"].json()["count"] == 40, got["live"].text
    assert got["nope"].status_code == 404 and "no collection or alias 'nope'" in got["nope"].text, got["nope"].text
