"""Writes from a data dir whose artifact folder is not the registry's (QA, session 54).

A fit from a replica (or a CLI) with a data dir of its own on a shared registry wrote its artifact there, committed the
version and moved the alias: every other replica answered that alias with a 500 "artifact missing", and /readyz stayed
ready (2 of the 8 newest files missing is under the "another folder" threshold). Registration (maps, steers, bundle
imports) is now refused before anything is stored, the fit before it reads a row, and /readyz's ``aliases`` check
says when an aliased version's file is missing, however few are.
"""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

import align
from _api_support import R, W, served_world, settings_for
from conftest import run_cli
from service.api import create_app
from service.registry import ArtifactsElsewhereError, open_registry


def _rotation(seed: int, d: int = 8) -> align.LinearMap:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((64, d))
    Q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    return align.fit_procrustes(X, X @ Q)


def _register(reg, seed: int, **kw):
    return reg.register_version("a->b", _rotation(seed), source_space="a", target_space="b", method="procrustes",
                                params={}, **kw)


def test_one_lost_file_that_three_identical_fits_share_does_not_refuse_writes(registry_url, tmp_path):
    """A review: identical fits store one file; losing it read as "3 of the 3 newest versions' files are not in it",
    so every fit, steer and the bundle import that would have restored the file were refused on a plain one-folder
    registry. Files are counted once: one lost file stays a lost file."""
    reg = open_registry(registry_url, tmp_path / "artifacts")
    try:
        for _ in range(3):
            _register(reg, 0)
        paths = {v.artifact_path for v in reg.list_versions("a->b")}
        assert len(paths) == 1, paths  # one file shared by the three
        bundle = reg.export(tmp_path / "bundle.zip")
        reg.store.path(paths.pop()).unlink()
        assert _register(reg, 1).version == 4  # not refused
        reg.register_steer("st", align.MeanShift(np.ones(8)), space="a")
        reg.import_(bundle)  # the repair path: identical versions skipped, the lost file written back
        assert reg.load_map("a->b:1") is not None
    finally:
        reg.close()


def test_a_registration_into_another_folder_is_refused_before_anything_is_written(registry_url, tmp_path):
    """The first registrations into an empty registry pass; once the registry has 3 live versions, a registry whose
    folder holds none of them refuses to register a map (its alias unmoved), a steer and a bundle import: nothing is
    committed and no file is stored in its folder."""
    a = open_registry(registry_url, tmp_path / "shared")
    b = open_registry(registry_url, tmp_path / "elsewhere" / "artifacts")
    try:
        _register(a, 0, alias="prod")
        _register(a, 1)
        _register(a, 2)
        bundle = a.export(tmp_path / "bundle.zip")
        with pytest.raises(ArtifactsElsewhereError) as e:
            _register(b, 3, alias="prod")
        said = str(e.value)
        assert said.startswith("map 'a->b' was not registered: this data dir's artifact folder does not hold"), said
        assert "VECBRIDGE_ARTIFACT_DIR" in said and str(tmp_path) not in said
        with pytest.raises(ArtifactsElsewhereError, match="steer 'st' was not registered"):
            b.register_steer("st", align.MeanShift(np.ones(8)), space="a")
        with pytest.raises(ArtifactsElsewhereError, match="the bundle was not imported"):
            b.import_(bundle, on_conflict="renumber")
        assert [v.version for v in a.list_versions("a->b")] == [1, 2, 3]
        assert a.alias_version("a->b", "prod") == 1
        assert a.list_steers() == []
        assert b.store.all_relpaths() == set()
        assert _register(a, 3, alias="prod").version == 4  # the registry's own folder still registers
    finally:
        a.close()
        b.close()


def test_a_cli_fit_from_another_data_dir_exits_2_naming_the_artifact_folder(tmp_path, capsys, caplog, monkeypatch):
    """``vecbridge fit ... --alias prod`` with only VECBRIDGE_REGISTRY_URL set, from another folder: it printed
    ``registered m:4`` and exited 0, the artifact in ./var/artifacts and prod moved to it. Exit 2 now, before the fit,
    naming --artifact-dir / VECBRIDGE_ARTIFACT_DIR; the registry unchanged."""
    url = f"sqlite:///{tmp_path}/shared.sqlite"
    reg = open_registry(url, tmp_path / "served" / "artifacts")
    try:
        for seed in range(3):
            _register(reg, seed, alias="prod")
        rng = np.random.default_rng(5)
        X = rng.standard_normal((200, 8)).astype(np.float32)
        np.save(tmp_path / "src.npy", X)
        np.save(tmp_path / "tgt.npy", X @ np.linalg.qr(rng.standard_normal((8, 8)))[0].astype(np.float32))
        monkeypatch.setenv("VECBRIDGE_REGISTRY_URL", url)
        code, out, err = run_cli(capsys, "--data-dir", tmp_path / "var", "fit", "--pairs", "--source",
                                 tmp_path / "src.npy", "--target", tmp_path / "tgt.npy", "--source-space", "a",
                                 "--target-space", "b", "--method", "procrustes", "--name", "a->b", "--alias", "prod",
                                 "--quiet")
        assert code == 2 and "registered" not in out, (out, err)
        assert "was not fitted" in err and "--artifact-dir or VECBRIDGE_ARTIFACT_DIR" in err, err
        # said once: the warning logged (to stderr) before the error line repeated its whole text; it names the
        # folder only, which the error line never does
        logged = [r.getMessage() for r in caplog.records if r.name.startswith("vecbridge")]
        assert err.count("must share its artifact folder") == 1, err
        assert not [m for m in logged if "must share its artifact folder" in m], logged
        assert [m for m in logged if str(tmp_path / "var" / "artifacts") in m], logged
        assert [v.version for v in reg.list_versions("a->b")] == [1, 2, 3]
        assert reg.alias_version("a->b", "prod") == 3
    finally:
        reg.close()


def test_a_replica_with_an_empty_folder_refuses_a_fit_at_request_time(tmp_path):
    """POST /v1/fits to a replica whose artifact folder is not the registry's ("not ready") queued a fit that
    registered a version no other replica could read. Now a 503 naming the cause, and no job."""
    url = f"sqlite:///{(tmp_path / 'shared.sqlite').resolve()}"
    with served_world(tmp_path / "writer", registry_url=url) as (c, app, data):
        app.state.vb.registry.register_steer("up", align.MeanShift(np.ones(16, np.float32)), space="a")  # 3 live
    with TestClient(create_app(settings_for(tmp_path / "replica", registry_url=url))) as c:
        body = {"name": "a2b", "source_space": "a", "target_space": "b", "method": "procrustes", "paired": True,
                "alias": "prod", "source": {"vectors": data["X"][:100].tolist()},
                "target": {"vectors": data["Y"][:100].tolist()}}
        r = c.post("/v1/fits", json=body, headers=W)
        assert r.status_code == 503, r.text
        assert "map 'a2b' was not fitted" in r.json()["error"]["message"]
        assert "must share its artifact folder" in r.json()["error"]["message"]
        assert c.get("/v1/jobs", headers=W).json()["data"] == []
        assert [v["version"] for v in c.get("/v1/maps/a2b/versions", headers=R).json()["data"]] == [1]


def test_readyz_says_when_an_aliased_versions_file_is_missing(tmp_path):
    """a2b@prod's file missing (1 of the 2 live versions: under the "another folder" threshold) answered every
    transform of a2b@prod with a 500 while /readyz said nothing. /readyz's ``aliases`` check says so now, without
    naming the map (no key needed), and ok again once the file is back; it does not gate readiness (the folder is
    shared: one lost file would take every replica out, every other map with it)."""
    import shutil

    with served_world(tmp_path) as (c, app, data):
        reg = app.state.vb.registry
        assert c.get("/readyz").status_code == 200
        path = reg.store.path(reg.resolve("a2b@prod").artifact_path)
        shutil.move(path, tmp_path / "aside")
        reg.store.aliased_seen = reg.store.elsewhere_seen = None  # as 30 s later
        ready = c.get("/readyz")
        assert ready.status_code == 200, ready.text  # informs: the other maps still serve
        said = ready.json()["checks"]["aliases"]
        assert ready.json()["checks"]["artifacts"] == "ok"
        assert said.startswith("error: the files of 1 of the 1 aliased versions are not in this data dir's"), said
        assert "a2b" not in said and str(tmp_path) not in said
        assert c.get("/readyz").json()["checks"]["aliases"] == said  # looked at again, not kept "ok"
        shutil.move(tmp_path / "aside", path)
        assert c.get("/readyz").json()["checks"]["aliases"] == "ok"
