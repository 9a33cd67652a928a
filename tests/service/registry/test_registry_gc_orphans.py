"""``registry gc --orphans`` removes only the regular files of the artifact folder no version names, and only on the
registry of that folder. It followed links: a link in the folder to a live version's artifact, once 10 minutes old,
made gc remove the live artifact (the link's target); a link out of the folder made every plain ``registry gc`` exit
2 after it had marked its versions collected, their files left; and run on the wrong database (a mistyped data dir,
an empty PostgreSQL before its restore) it removed every artifact. Run against SQLite and (when
VECBRIDGE_TEST_POSTGRES_URL is set) PostgreSQL."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
from conftest import run_cli

import align
from service.registry import ConflictError, open_registry
from service.registry.store import STALE_TMP_S


def _register(reg, name: str, seed: int):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(64, 8))
    return reg.register_version(name, align.fit_procrustes(X, X @ rng.normal(size=(8, 8))), source_space="s",
                                target_space="t", method="procrustes", params={})


def _age(path) -> None:
    """Make the file at ``path`` (the link itself where it is one) look untouched for longer than STALE_TMP_S."""
    stale = time.time() - STALE_TMP_S - 3600
    os.utime(path, (stale, stale), follow_symlinks=False)


def test_gc_orphans_never_follows_a_link_to_a_live_artifact(reg):
    live = _register(reg, "a", 0)
    target = reg.artifact_file(live)
    (reg.store.root / "zz").mkdir()
    link = reg.store.root / "zz" / "old.safetensors"
    link.symlink_to(os.path.relpath(target, link.parent))
    _age(target)
    _age(link)

    assert reg.gc(orphans=True, dry_run=True)["orphans"] == []
    res = reg.gc(orphans=True)
    assert res["orphans"] == [] and res["orphan_bytes"] == 0
    assert target.is_file() and link.is_symlink() and reg.load_map("a").W.shape == (8, 8)
    assert reg.verify()["ok"]


def test_a_link_out_of_the_artifact_folder_does_not_fail_gc_after_its_commit(reg, tmp_path):
    _register(reg, "a", 0)
    dead = _register(reg, "a", 1)
    reg.delete_version("a", 2)
    outside = tmp_path / "outside.npz"
    outside.write_bytes(b"not ours")
    (reg.store.root / "zz").mkdir()
    (reg.store.root / "zz" / "stray.npz").symlink_to(outside)
    _age(outside)

    res = reg.gc()  # exit 2 (IntegrityError: "leaves the artifact folder") with a:2 marked collected, its file left
    assert res["collected"]["maps"] == ["a:2"] and res["orphans"] == []
    assert not reg.artifact_file(dead).exists() and reg.get_version("a", 2).collected_at
    assert reg.gc(orphans=True)["orphans"] == [] and outside.read_bytes() == b"not ours"


def test_gc_orphans_lists_and_removes_an_empty_file(reg):
    _register(reg, "a", 0)
    empty = reg.store.root / "ab" / ("ab" + "0" * 62 + ".npz")
    empty.parent.mkdir()
    empty.write_bytes(b"")
    _age(empty)
    rel = "ab/" + empty.name
    assert reg.gc(orphans=True, dry_run=True)["orphans"] == [rel] and empty.exists()
    assert reg.gc(orphans=True)["orphans"] == [rel] and not empty.exists()


def test_gc_orphans_refuses_a_database_that_names_none_of_the_files(registry_url, tmp_path):
    """Opened on an empty database (a PostgreSQL not restored yet) or another registry's, every file of the folder
    looked an orphan and went. It refuses (ConflictError, exit 2) and changes nothing, its own collection included."""
    prod = open_registry(f"sqlite:///{tmp_path}/prod/registry.sqlite", tmp_path / "prod" / "artifacts")
    files = [prod.artifact_file(_register(prod, "a", seed)) for seed in (0, 1)]
    prod.close()
    for f in files:
        _age(f)

    wrong = open_registry(registry_url, tmp_path / "prod" / "artifacts")  # empty: no version at all
    try:
        with pytest.raises(ConflictError, match="none of the 2 artifact file"):
            wrong.gc(orphans=True)
        with pytest.raises(ConflictError):
            wrong.gc(orphans=True, dry_run=True)
        assert all(f.exists() for f in files)
        assert wrong.gc()["orphans"] == sorted(f"{f.parent.name}/{f.name}" for f in files)  # counted, kept
    finally:
        wrong.close()
    own = open_registry(registry_url, tmp_path / "own-artifacts")  # versions of its own, in its own folder
    _register(own, "b", 7)
    own.delete_version("b", 1)
    own.close()
    wrong = open_registry(registry_url, tmp_path / "prod" / "artifacts")
    try:
        with pytest.raises(ConflictError):
            wrong.gc(orphans=True)
        assert all(f.exists() for f in files) and not wrong.get_version("b", 1).collected_at  # nothing committed
    finally:
        wrong.close()


def test_gc_orphans_on_the_wrong_data_dir_exits_2_in_one_line(tmp_path, capsys, monkeypatch):
    prod = tmp_path / "prod"
    reg = open_registry(f"sqlite:///{prod / 'registry.sqlite'}", prod / "artifacts")
    art = reg.artifact_file(_register(reg, "a", 0))
    reg.close()
    _age(art)
    other = open_registry(f"sqlite:///{tmp_path / 'other' / 'registry.sqlite'}", tmp_path / "other" / "artifacts")
    _register(other, "b", 7)
    other.close()
    monkeypatch.setenv("VECBRIDGE_ARTIFACT_DIR", str(prod / "artifacts"))
    code, out, err = run_cli(capsys, "--data-dir", tmp_path / "other", "registry", "gc", "--orphans")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "refused" in err, (code, out, err)
    assert art.exists()
    code, out, _ = run_cli(capsys, "--data-dir", prod, "registry", "gc", "--orphans", "--json")
    assert code == 0 and json.loads(out)["orphans"] == [] and art.exists()
