"""Registry findings of a QA pass (session 56): the CLI and HTTP answered the same registry write differently.

Each test runs on SQLite and on PostgreSQL (the ``reg`` fixture), through the registry, the CLI and HTTP.
"""

from __future__ import annotations

import numpy as np
import pytest
from _api_support import W, settings_for
from conftest import run_cli
from fastapi.testclient import TestClient

import align
from service.api.app import create_app
from service.registry import ConflictError, NotFoundError


def _register(reg, seed: int, name: str = "a->b", **kw):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((64, 8))
    Q, _ = np.linalg.qr(rng.standard_normal((8, 8)))
    return reg.register_version(name, align.fit_procrustes(X, X @ Q), source_space="a", target_space="b",
                                method="procrustes", params={}, **kw)


def _cli(capsys, reg, tmp_path, *args):
    return run_cli(capsys, "--data-dir", tmp_path / "cli", "--registry-url", reg.url, "registry", *args)


@pytest.fixture
def http(reg, tmp_path):
    """A TestClient of an app on ``reg``'s database (each backend)."""
    app = create_app(settings_for(tmp_path, registry_url=reg.url))
    with TestClient(app) as c:
        yield c


def test_removing_a_tag_that_is_not_set_is_refused_alike_by_http_and_the_cli(reg, tmp_path, capsys, http):
    """``DELETE .../tags/{key}`` of a tag that is not set answered 200 (the version as it was) while ``registry tag
    ... --delete`` refused it (exit 2, its own check before the write): a mistyped key went unnoticed over HTTP. The
    registry refuses it now (NotFoundError naming the tag and the tags that are set), so HTTP says 404 and the CLI
    exits 2 with the same words; nothing is deleted."""
    _register(reg, 1)
    reg.set_tag("a->b", 1, "owner", "me")
    reg.set_tag("a->b", 1, "team", "search")
    with pytest.raises(NotFoundError) as e:
        reg.delete_tag("a->b", 1, "ownr")
    words = "map a->b:1 has no tag 'ownr' (did you mean 'owner'?); its tags: 'owner', 'team' (nothing deleted)"
    assert str(e.value) == words
    r = http.delete("/v1/maps/a->b/versions/1/tags/ownr", headers=W)
    assert r.status_code == 404 and r.json()["error"]["message"] == words, r.text
    rc, out, err = _cli(capsys, reg, tmp_path, "tag", "a->b", "1", "ownr", "--delete")
    assert rc == 2 and out == "" and words in err, (out, err)
    assert reg.get_version("a->b", 1).tags == {"owner": "me", "team": "search"}  # nothing deleted
    r = http.delete("/v1/maps/a->b/versions/1/tags/owner", headers=W)
    assert r.status_code == 200 and r.json()["tags"] == {"team": "search"}, r.text
    r = http.delete("/v1/maps/a->b/versions/1/tags/owner", headers=W)  # a retried delete: gone already
    assert r.status_code == 404 and "its tags: 'team'" in r.json()["error"]["message"], r.text
    assert reg.delete_tag("a->b", 1, "owner", missing_ok=True).tags == {"team": "search"}  # eval --record's way


def test_a_tag_is_not_set_on_a_deleted_version(reg, tmp_path, capsys, http):
    """An alias on a deleted version is refused (409 / exit 2) but a tag was set on one, over HTTP and by the CLI
    (``registry tag a->b 1 owner me`` answered ``a->b:1 owner=me``). Refused alike now, nothing written; a tag on
    it can still be removed (cleaning up is not annotating)."""
    _register(reg, 1)
    _register(reg, 2)
    reg.set_tag("a->b", 1, "old", "x")
    reg.delete_version("a->b", 1)
    with pytest.raises(ConflictError, match="cannot set tag 'owner' on deleted version 1 of map 'a->b'"):
        reg.set_tag("a->b", 1, "owner", "me")
    r = http.put("/v1/maps/a->b/versions/1/tags/owner", json={"value": "me"}, headers=W)
    assert r.status_code == 409 and "cannot set tag 'owner' on deleted version 1" in r.json()["error"]["message"]
    rc, out, err = _cli(capsys, reg, tmp_path, "tag", "a->b", "1", "owner", "me")
    assert rc == 2 and out == "" and "cannot set tag 'owner' on deleted version 1 of map 'a->b'" in err, (out, err)
    assert reg.get_version("a->b", 1).tags == {"old": "x"}
    doc = http.get("/openapi.json").json()
    assert "409" in doc["paths"]["/v1/maps/{name}/versions/{version}/tags/{key}"]["put"]["responses"]
    assert reg.delete_tag("a->b", 1, "old").tags == {}
    assert reg.set_tag("a->b", 2, "owner", "me").tags == {"owner": "me"}  # a live version: as before


def test_deleting_a_deleted_version_says_it_was_deleted_already(reg, tmp_path, capsys, http):
    """A second ``registry delete a->b 2`` said "deleted a->b:2" (exit 0) and warned again that its aliases no longer
    resolve; HTTP answered as for the first delete. Still idempotent (exit 0, 200), but it says the version was
    deleted already, and when (the first delete's time, kept), and warns of nothing."""
    _register(reg, 1)
    _register(reg, 2, alias="prod")
    rc, out, err = _cli(capsys, reg, tmp_path, "delete", "a->b", "2")
    assert rc == 0 and out == "deleted a->b:2\n" and "alias(es) prod still point at a->b:2" in err, (out, err)
    rc, out, err = _cli(capsys, reg, tmp_path, "delete", "a->b", "2")
    assert rc == 0 and out.startswith("a->b:2 was already deleted (at ") and err == "", (out, err)
    when = out.split("(at ")[1].split(")")[0]
    assert out == f"a->b:2 was already deleted (at {when}); nothing changed\n"
    r = http.delete("/v1/maps/a->b/versions/2", headers=W)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["deleted"] and body["already_deleted"] is True and body["deleted_at"] == when, body
    assert body["bare_ref"] == "a->b:1"
    r = http.delete("/v1/maps/a->b/versions/1", headers=W)  # a first delete says so too
    assert r.status_code == 200 and r.json()["already_deleted"] is False and r.json()["deleted_at"], r.text
    assert reg.delete_version_once("a->b", 1)[2] == r.json()["deleted_at"]  # the first delete's time stays


def test_deleting_a_deleted_steer_version_says_it_was_deleted_already(reg, tmp_path, capsys, http):
    """As for maps: a second ``steer delete`` said "deleted steer ..." and warned of its aliases again."""
    from align.steer import Steer

    rng = np.random.default_rng(0)
    for seed in (1, 2):
        reg.register_steer("pos", Steer(rng.normal(size=(8, 2)), rng.normal(size=(8, 2)), {"seed": seed}), space="b")
    reg.set_steer_alias("pos", "prod", 2)
    steer = ["--data-dir", tmp_path / "cli", "--registry-url", reg.url, "steer", "delete", "pos", "2"]
    rc, out, err = run_cli(capsys, *steer)
    assert rc == 0 and out == "deleted steer pos:2\n" and "alias(es) prod still point at steer pos:2" in err, err
    rc, out, err = run_cli(capsys, *steer)
    assert rc == 0 and out.startswith("steer pos:2 was already deleted (at ") and err == "", (out, err)
    when = out.split("(at ")[1].split(")")[0]
    r = http.delete("/v1/steers/pos/versions/2", headers=W)
    assert r.status_code == 200 and r.json()["already_deleted"] is True and r.json()["deleted_at"] == when, r.text
    assert r.json()["bare_ref"] == "pos:1"
