"""``registry gc``: deleting a version (soft, kept for lineage) freed no disk; its artifact and HTML report stayed for
good (a soak that deleted 148 of 155 versions held 37 MB of them, and ``registry verify`` said ok). Run against SQLite
and (when VECBRIDGE_TEST_POSTGRES_URL is set) PostgreSQL."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

import align
from service.registry import (
    DeletedVersionError,
    IntegrityError,
    RegistryLockedError,
    open_registry,
)
from service.registry.gc import collect_deleted


def _map(seed: int) -> align.LinearMap:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(64, 8))
    return align.fit_procrustes(X, X @ rng.normal(size=(8, 8)))


def _register(reg, name: str, seed: int, report: bool = True):
    """A version of map ``name`` (bytes fixed by ``seed``: the same seed, the same artifact file) with a report."""
    n = len(reg.list_versions(name)) + 1 if name in {m["name"] for m in reg.list_maps()} else 1
    rel = f"{name}/v{n}-{seed}.html" if report else None
    v = reg.register_version(name, _map(seed), source_space="s", target_space="t", method="procrustes", params={},
                             report_path=rel)
    if report:
        (reg.report_dir / name).mkdir(parents=True, exist_ok=True)
        (reg.report_dir / rel).write_text("<html>" + "r" * 5000 * seed + "</html>")
    return v


def _size(path) -> int:
    return path.stat().st_size


def _deleted_at(reg, name: str, version: int) -> str | None:
    """When map ``name:version`` was deleted, as the registry recorded it for gc (not part of the record)."""
    with reg.db.tx() as t:
        return t.one("SELECT deleted_at FROM versions WHERE name = ? AND version = ?", (name, version))[0]


def test_gc_removes_deleted_versions_files_but_an_artifact_a_live_version_shares(reg, tmp_path):
    a1, b1, a2 = _register(reg, "a", 0), _register(reg, "b", 0), _register(reg, "a", 1)
    assert a1.artifact_path == b1.artifact_path  # content-addressed: one file for both
    steer = reg.register_steer("st", align.MeanShift(np.ones(8)), space="s")
    for name, version in (("a", 1), ("a", 2)):
        reg.delete_version(name, version)
    reg.delete_steer_version("st", 1)
    files = [reg.artifact_file(a2), reg.report_file(a1), reg.report_file(a2), reg.store.path(steer.artifact_path)]
    sizes = [_size(p) for p in files]
    assert _deleted_at(reg, "a", 1) is not None and reg.get_version("a", 1).collected_at is None

    planned = reg.gc(dry_run=True)
    assert planned["collected"] == {"maps": ["a:1", "a:2"], "steers": ["st:1"]}
    assert planned["shared"] == {"maps": ["a:1"], "steers": []}
    assert sorted(planned["artifacts"]) == sorted([a2.artifact_path, steer.artifact_path])
    assert planned["bytes_freed"] == sum(sizes) and planned["report_bytes"] == sizes[1] + sizes[2]
    assert all(p.exists() for p in files) and reg.get_version("a", 2).collected_at is None  # nothing removed

    done = reg.gc()
    assert {k: done[k] for k in ("collected", "shared", "bytes_freed")} == {
        k: planned[k] for k in ("collected", "shared", "bytes_freed")} and not done["dry_run"]
    assert not any(p.exists() for p in files)
    assert reg.artifact_file(b1).exists() and open_registry(reg.url, reg.store.root).load_map("b").W.shape == (8, 8)
    v = reg.get_version("a", 2)  # the record stays: lineage, metrics, the fact it existed
    assert v.deleted and v.collected_at and v.artifact_sha256 == a2.artifact_sha256
    with pytest.raises(DeletedVersionError, match="deleted and its files collected"):
        reg.resolve("a:2")
    with pytest.raises(DeletedVersionError, match="collected"):
        reg.load_map(v)
    checked = reg.verify()
    assert checked["ok"] and checked["bad_artifacts"] == [] and checked["orphan_artifacts"] == []
    assert (checked["n_collected"], checked["n_deleted"]) == (3, 0)
    assert reg.gc()["bytes_freed"] == 0  # nothing left to do

    reg.delete_version("b", 1)  # the shared file goes with its last holder
    assert reg.gc()["artifacts"] == [a1.artifact_path] and not reg.artifact_file(b1).exists()
    assert reg.verify()["ok"]


def test_gc_removes_the_report_folders_it_empties_and_no_other(reg, tmp_path):
    # gc left an empty reports/<name>/ for every map name it collected (302 empty folders after two runs of a QA
    # soak); it now removes a folder it emptied, never one still holding a file, nor a link, nor what it points at
    a1, a2, b1, b2, c1 = (_register(reg, n, s) for n, s in (("a", 1), ("a", 2), ("b", 1), ("b", 2), ("c", 1)))
    (reg.report_dir / "c" / "notes.txt").write_text("a user's own file")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "d").mkdir(parents=True)
    (reg.report_dir / "d").symlink_to(elsewhere / "d", target_is_directory=True)  # a folder kept on another disk
    d1 = reg.register_version("d", _map(3), source_space="s", target_space="t", method="procrustes", params={},
                              report_path="d/v1.html")
    (elsewhere / "d" / "v1.html").write_text("<html></html>")
    for v in (a1, a2, b1, c1, d1):
        reg.delete_version(v.name, v.version)
    done = reg.gc()
    assert done["collected"]["maps"] == ["a:1", "a:2", "b:1", "c:1", "d:1"]
    assert not (reg.report_dir / "a").exists()  # emptied: gone
    assert reg.report_file(b2).exists() and not reg.report_file(b1).exists()  # a live version's report: kept
    assert (reg.report_dir / "c" / "notes.txt").exists()  # not empty: kept
    assert (reg.report_dir / "d").is_symlink() and (elsewhere / "d" / "v1.html").exists()  # not ours: untouched
    (reg.report_dir / "a").mkdir()  # as a gc of an earlier release left it
    reg.gc()
    assert not (reg.report_dir / "a").exists() and (reg.report_dir / "b").is_dir()


def test_a_report_written_as_gc_removes_its_emptied_folder_is_written(reg, monkeypatch):
    """A fit writes its report after its version is committed: a gc that emptied the map's folder of reports and
    removed it between the writer's mkdir and its temporary file failed the write (the report lost, its route 404)."""
    from service import storage
    from service.reports import write_report

    made = storage.make_parent
    raced = []

    def gc_in_between(path):  # the writer made the folder; gc, which had just emptied it, removes it now
        made(path)
        if not raced:
            raced.append(path.parent)
            path.parent.rmdir()

    monkeypatch.setattr(storage, "make_parent", gc_in_between)
    path = reg.report_dir / "a" / "v9.html"
    write_report(path, "<html>new</html>")
    assert raced == [path.parent] and path.read_text() == "<html>new</html>"


def test_gc_older_than_leaves_recent_deletes(reg):
    v = _register(reg, "a", 0, report=False)
    _register(reg, "a", 1, report=False)
    reg.delete_version("a", 1)
    first = _deleted_at(reg, "a", 1)
    reg.delete_version("a", 1)  # deleted again: the first delete's time stays
    assert _deleted_at(reg, "a", 1) == first
    res = reg.gc(older_than_s=3600)
    assert res["collected"]["maps"] == [] and res["younger"] == 1 and reg.artifact_file(v).exists()
    with reg.db.tx(write=True) as t:  # deleted two hours ago
        t.q("UPDATE versions SET deleted_at = ? WHERE name = 'a' AND version = 1", ("2000-01-01T00:00:00+00:00",))
    res = reg.gc(older_than_s=3600)
    assert res["collected"]["maps"] == ["a:1"] and res["younger"] == 0 and not reg.artifact_file(v).exists()
    # a version an older release deleted has no deletion time: --older-than counts from now, not "long ago"
    reg.delete_version("a", 2)
    with reg.db.tx(write=True) as t:
        t.q("UPDATE versions SET deleted_at = NULL WHERE name = 'a' AND version = 2")
    assert reg.gc(older_than_s=0.5, dry_run=True)["younger"] == 1
    assert reg.gc(older_than_s=0.5)["collected"]["maps"] == [] and _deleted_at(reg, "a", 2)
    time.sleep(0.6)
    assert reg.gc(older_than_s=0.5)["collected"]["maps"] == ["a:2"]


def test_a_registration_of_the_same_bytes_while_gc_runs_keeps_its_artifact(reg, monkeypatch):
    """A fit storing the bytes of a deleted version finds the file there (no write) and commits moments later; a gc
    reading the rows in between removed the file under it, and the new live version's artifact was gone. gc now takes
    the lock a writer holds from storing its artifact to its commit: it waits, then sees the new version."""
    from service.registry import core

    old = _register(reg, "a", 0, report=False)
    reg.delete_version("a", 1)
    stored, go = threading.Event(), threading.Event()

    def hook(point):
        if point == "artifact_stored" and threading.current_thread().name == "writer":
            stored.set()
            assert go.wait(30)

    monkeypatch.setattr(core, "FAULT_HOOK", hook)
    out = {}
    writer = threading.Thread(target=lambda: out.update(new=_register(reg, "b", 0, report=False)), name="writer")
    writer.start()
    assert stored.wait(30)
    gc = threading.Thread(target=lambda: out.update(gc=reg.gc()), name="gc")
    gc.start()
    gc.join(0.5)
    assert gc.is_alive()  # waiting for the writer's commit
    go.set()
    writer.join(30)
    gc.join(30)
    assert out["new"].artifact_path == old.artifact_path
    assert out["gc"]["collected"]["maps"] == ["a:1"] and out["gc"]["artifacts"] == []
    assert out["gc"]["shared"]["maps"] == ["a:1"]
    assert open_registry(reg.url, reg.store.root).load_map("b:1").W.shape == (8, 8) and reg.verify()["ok"]


def test_gc_waits_for_a_writer_or_backup_holding_the_artifact_folder(reg):
    v = _register(reg, "a", 0, report=False)
    reg.delete_version("a", 1)
    with reg.store.pinned() as held:  # what a writer (and `vecbridge backup`) holds
        assert held
        with pytest.raises(RegistryLockedError, match="nothing was removed"):
            collect_deleted(reg, wait_s=0.2)
    assert reg.artifact_file(v).exists() and reg.get_version("a", 1).collected_at is None
    assert reg.gc()["collected"]["maps"] == ["a:1"]


def _gc_registry(reg) -> None:
    """Maps a (1: the bytes of b:1, 2, 3 @prod, 4) and b, steer st (1, 2 @prod); gc collects a:1 (its file stays:
    b:1 holds it), a:2 and st:1; a:4 is deleted after the gc (its files stay). Report on a:3."""
    for name, seed in (("a", 0), ("a", 1), ("a", 2), ("a", 3), ("b", 0)):
        _register(reg, name, seed, report=(name, seed) == ("a", 2))
    reg.set_alias("a", "prod", 3)
    reg.register_steer("st", align.MeanShift(np.ones(8)), space="s")
    reg.register_steer("st", align.MeanShift(np.arange(8.0)), space="s", alias="prod")
    reg.delete_version("a", 1)
    reg.delete_version("a", 2)
    reg.delete_steer_version("st", 1)
    assert reg.gc()["collected"] == {"maps": ["a:1", "a:2"], "steers": ["st:1"]}
    reg.delete_version("a", 4)


def _records(bundle) -> dict:
    """A bundle's spaces, maps and steers as its manifest records them, less the report file names (an import
    names a report anew, as it always did)."""
    if bundle.suffix == ".zip":
        with zipfile.ZipFile(bundle) as z:
            m = json.loads(z.read("manifest.json"))
    else:
        m = json.loads((bundle / "manifest.json").read_text())
    for key in ("maps", "steers"):
        for entry in m[key]:
            for d in entry["versions"]:
                d.pop("report_path", None)
                d.pop("bundle_report", None)
    return {k: m[k] for k in ("spaces", "maps", "steers")}


def _same_registry(src, dst) -> None:
    """``dst``, imported from a bundle of ``src`` (:func:`_gc_registry`), holds the same versions: the live ones
    load and transform identically, the collected ones are deleted with their files collected, as in ``src``."""
    for name in ("a", "b"):
        want = [{k: x for k, x in v.to_dict().items() if k != "report_path"} for v in src.list_versions(name)]
        assert [{k: x for k, x in v.to_dict().items() if k != "report_path"} for v in dst.list_versions(name)] == want
    assert [v.to_dict() for v in dst.list_steer_versions("st")] == [v.to_dict() for v in src.list_steer_versions("st")]
    assert [(v.version, v.deleted, bool(v.collected_at)) for v in dst.list_versions("a")] == [
        (1, True, True), (2, True, True), (3, False, False), (4, True, False)]
    X = np.random.default_rng(5).normal(size=(6, 8))
    for ref in ("a@prod", "a:3", "b", "b:1"):
        np.testing.assert_array_equal(dst.load_map(ref).apply(X), src.load_map(ref).apply(X))
    np.testing.assert_array_equal(dst.load_steer("st@prod").apply(X, 1.0), src.load_steer("st:2").apply(X, 1.0))
    assert dst.report_file("a:3").read_text() == src.report_file("a:3").read_text()
    for ref in ("a:1", "a:2"):
        with pytest.raises(DeletedVersionError, match=r"deleted and its files collected \(`vecbridge registry gc`"):
            dst.resolve(ref)
        with pytest.raises(DeletedVersionError, match="collected"):
            dst.load_map(dst.get_version("a", int(ref[-1])))
    with pytest.raises(DeletedVersionError, match="deleted and its files collected"):
        dst.load_steer("st:1")
    checked = dst.verify()
    assert checked["ok"] and checked["orphan_artifacts"] == [] and checked["bad_artifacts"] == [], checked
    assert (checked["n_collected"], checked["n_deleted"], checked["version_gaps"]) == (3, 1, [])
    # a gc there removes a:4's file (deleted here, not collected), never b:1's, which collected a:1 names too
    assert dst.gc()["collected"] == {"maps": ["a:4"], "steers": []}
    np.testing.assert_array_equal(dst.load_map("b:1").apply(X), src.load_map("b:1").apply(X))
    assert dst.verify()["ok"]


def test_after_gc_an_export_carries_the_collected_versions_records(reg, tmp_path):
    """A bundle carries every version's artifact, so after `registry gc` `registry export` refused every bundle
    holding a collected version (all.zip, and --name of any map that ever had a version collected): the live versions
    of those maps could no longer be moved or backed up by bundle. A collected version now travels as its record."""
    _gc_registry(reg)
    bundle = reg.export(tmp_path / "all.zip")
    with zipfile.ZipFile(bundle) as z:
        entries = set(z.namelist())
    versions = {f"{e['name']}:{d['version']}": d for key in ("maps", "steers") for e in json.loads(
        zipfile.ZipFile(bundle).read("manifest.json"))[key] for d in e["versions"]}
    for ref in ("a:1", "a:2", "st:1"):  # the record, without the files gc removed
        d = versions[ref]
        assert d["deleted"] and d["collected_at"] and "bundle_artifact" not in d and "bundle_report" not in d, ref
    assert f"artifacts/{versions['a:2']['artifact_path']}" not in entries
    assert {f"artifacts/{versions[r]['artifact_path']}" for r in ("a:3", "a:4", "b:1", "st:2")} <= entries

    other = open_registry(f"sqlite:///{tmp_path}/other.sqlite", tmp_path / "other-artifacts")
    assert other.import_(bundle) == {"imported": 5, "skipped": 0, "renumbered": 0, "aliases": 1, "steers": 2,
                                     "steer_aliases": 1}
    assert _records(other.export(tmp_path / "again.zip")) == _records(bundle)  # export -> import -> export
    assert other.import_(bundle)["skipped"] == 5  # importing twice is still a no-op
    _same_registry(reg, other)
    only_a = reg.export(tmp_path / "only-a", ["a"])  # a map that had versions collected, by name
    third = open_registry(f"sqlite:///{tmp_path}/third.sqlite", tmp_path / "third-artifacts")
    assert third.import_(only_a)["imported"] == 4 and [v.collected_at for v in third.list_versions("a")] == [
        v.collected_at for v in reg.list_versions("a")]
    assert third.load_map("a@prod").W.tobytes() == reg.load_map("a@prod").W.tobytes() and third.verify()["ok"]


def test_a_bundle_with_collected_versions_imports_into_each_backend(reg, tmp_path):
    src = open_registry(f"sqlite:///{tmp_path}/src.sqlite", tmp_path / "src-artifacts")
    _gc_registry(src)
    bundle = src.export(tmp_path / "all")
    assert reg.import_(bundle)["imported"] == 5
    assert _records(reg.export(tmp_path / "again.zip")) == _records(bundle)
    _same_registry(src, reg)


def test_only_a_deleted_and_collected_version_may_travel_without_its_artifact(reg, tmp_path):
    """The import takes a version without its artifact only when it is deleted and collected: a hand-edited bundle
    that drops a live (or a deleted, not collected) version's artifact, or marks a live one collected, is refused and
    changes nothing."""
    src = open_registry(f"sqlite:///{tmp_path}/src.sqlite", tmp_path / "src-artifacts")
    _gc_registry(src)
    bundle = src.export(tmp_path / "all")
    manifest = (bundle / "manifest.json").read_text()

    def edited(ref: str, **change):
        m = json.loads(manifest)
        d = next(d for key in ("maps", "steers") for e in m[key] for d in e["versions"]
                 if f"{e['name']}:{d['version']}" == ref)
        for k, value in change.items():
            d.pop(k) if value is None else d.update({k: value})
        (bundle / "manifest.json").write_text(json.dumps(m))
        return bundle

    live = "map 'a' version 3 has no bundle_artifact: only a version deleted and collected"
    at = "2026-01-01T00:00:00+00:00"
    cases = [("a:3", {"bundle_artifact": None}, live),
             ("a:4", {"bundle_artifact": None}, "has no bundle_artifact"),
             ("st:2", {"bundle_artifact": None}, "steer 'st' version 2 has no bundle_artifact"),
             ("b:1", {"bundle_artifact": None, "collected_at": at}, "is not deleted"),
             ("b:1", {"collected_at": at}, "is not deleted"),
             ("a:2", {"collected_at": "yesterday"}, "must be an ISO 8601 time"),
             ("a:2", {"collected_at": ""}, "must be an ISO 8601 time"),
             ("a:2", {"collected_at": None}, "map 'a' version 2 has no bundle_artifact")]
    for ref, change, match in cases:
        with pytest.raises(IntegrityError, match=match):
            reg.import_(edited(ref, **change))
        assert reg.list_maps() == [] and reg.list_steers() == [] and reg.store.all_relpaths() == set(), (ref, change)
    (bundle / "manifest.json").write_text(manifest)
    assert reg.import_(bundle)["imported"] == 5 and reg.verify()["ok"]


def test_an_export_keeps_the_files_of_the_versions_it_listed_while_gc_runs(reg, tmp_path, monkeypatch):
    """An export lists a map's versions, then reads their artifacts: a gc in between removed the files of a deleted
    version it had listed as not collected, and the export failed ("artifact ... is missing or unreadable"). The
    export holds the artifact folder's writer lock (shared) throughout; gc waits for it."""
    _register(reg, "a", 0, report=False)
    gone = _register(reg, "a", 1, report=False)
    reg.delete_version("a", 2)
    real_get, out = reg.store.get, {}

    def get(rel, sha):  # a:1's artifact is read; a:2's is next
        if "gc" not in out:
            out["gc"] = threading.Thread(target=lambda: out.update(done=reg.gc()))
            out["gc"].start()
            out["gc"].join(0.5)
        return real_get(rel, sha)

    monkeypatch.setattr(reg.store, "get", get)
    bundle = reg.export(tmp_path / "all.zip")
    out["gc"].join(30)
    assert out["done"]["collected"]["maps"] == ["a:2"] and not reg.artifact_file(gone).exists()
    other = open_registry(f"sqlite:///{tmp_path}/other.sqlite", tmp_path / "other-artifacts")
    assert other.import_(bundle)["imported"] == 2 and other.verify()["ok"]
    assert other.get_version("a", 2).deleted and other.get_version("a", 2).collected_at is None  # exported before gc


def test_an_upgraded_registry_dates_its_old_deletes(tmp_path):
    """A registry from before deletion times were kept: its deleted versions count as deleted at the upgrade."""
    url = f"sqlite:///{tmp_path}/registry.sqlite"
    reg = open_registry(url, tmp_path / "artifacts")
    _register(reg, "a", 0, report=False)
    _register(reg, "a", 1, report=False)
    reg.delete_version("a", 1)
    reg.close()
    with sqlite3.connect(tmp_path / "registry.sqlite") as c:  # the tables as the release before wrote them
        for table in ("versions", "steers"):
            for col in ("deleted_at", "collected_at"):
                c.execute(f"ALTER TABLE {table} DROP COLUMN {col}")
    reg = open_registry(url, tmp_path / "artifacts")
    assert _deleted_at(reg, "a", 1) and _deleted_at(reg, "a", 2) is None
    assert reg.gc(older_than_s=3600)["younger"] == 1 and reg.gc()["collected"]["maps"] == ["a:1"]


def test_registry_gc_command(tmp_path, capsys):
    data = tmp_path / "data"
    reg = open_registry(f"sqlite:///{data / 'registry.sqlite'}", data / "artifacts")
    v1, _ = _register(reg, "a", 3), _register(reg, "a", 1)
    reg.delete_version("a", 1)
    report, artifact = reg.report_file(v1), reg.artifact_file(v1)
    freed = _size(report) + _size(artifact)
    reg.close()
    base = ("--data-dir", data, "registry")
    code, out, err = run_cli(capsys, *base, "gc", "--dry-run", "--json")
    assert code == 0 and json.loads(out)["bytes_freed"] == freed and report.exists() and artifact.exists(), err
    code, out, _ = run_cli(capsys, *base, "gc", "--older-than", "1d")
    assert code == 0 and "collected 0 deleted version(s)" in out and "1 deleted version(s) younger" in out
    code, out, _ = run_cli(capsys, *base, "gc")
    assert code == 0 and "collected 1 deleted version(s): map a:1" in out and "freed" in out
    assert not report.exists() and not artifact.exists()
    code, out, _ = run_cli(capsys, *base, "verify")
    assert code == 0 and json.loads(out)["ok"] and json.loads(out)["n_collected"] == 1
    code, out, _ = run_cli(capsys, *base, "show", "a:1", "--json")
    shown = json.loads(out)
    assert code == 0 and shown["collected_at"] and shown["artifact_file"] is None and shown["report_file"] is None
    code, out, err = run_cli(capsys, *base, "gc", "--older-than", "3 fortnights")
    assert code == 2 and "is not a duration" in err and len(err.strip().splitlines()) == 1
    for digits in ("\u0661d", "\uff11d"):  # Arabic-Indic and fullwidth 1: `\\d` took them, 1 day
        code, out, err = run_cli(capsys, *base, "gc", "--older-than", digits, "--dry-run")
        assert code == 2 and "is not a duration" in err, (digits, err)
    for huge in ("1000000d", "99999999999999999999w", "1" * 400 + "s"):  # were OverflowError / a C int error, exit 3
        code, out, err = run_cli(capsys, *base, "gc", "--older-than", huge, "--dry-run")
        assert code == 2 and "more than 100 years" in err and len(err.strip().splitlines()) == 1, (huge, err)


def test_registry_gc_waits_wait_seconds_for_a_backup_then_exits_75(tmp_path, capsys):
    """The help and README said gc "waits for a running backup": it waited 60 s (exports and writers too), then exit
    75, and nothing said so or let a script choose; --wait SECONDS says how long."""
    data = tmp_path / "data"
    reg = open_registry(f"sqlite:///{data / 'registry.sqlite'}", data / "artifacts")
    v = _register(reg, "a", 0, report=False)
    reg.delete_version("a", 1)
    base = ("--data-dir", data, "registry", "gc")
    with reg.store.pinned() as held:  # what a backup holds while it copies the artifacts
        assert held
        start = time.monotonic()
        code, out, err = run_cli(capsys, *base, "--wait", "0.3")
        assert code == 75 and "nothing was removed" in err and len(err.strip().splitlines()) == 1, err
        assert 0.3 <= time.monotonic() - start < 30 and reg.artifact_file(v).exists()
    code, out, err = run_cli(capsys, *base, "--wait", "-1")
    assert code == 2 and "--wait" in err
    for bad in ("nan", "inf"):  # a NaN passed click's bounds: `--wait nan` was accepted, and waited for ever
        code, out, err = run_cli(capsys, *base, "--wait", bad)
        assert code == 2 and "--wait" in err and reg.artifact_file(v).exists(), err
        assert bad == "inf" or "'nan' is not a finite number" in err, err
    code, out, _ = run_cli(capsys, *base, "--wait", "0")
    assert code == 0 and "collected 1 deleted version(s)" in out and not reg.artifact_file(v).exists()
    reg.close()


def test_gc_older_than_before_year_one_collects_nothing(reg):
    """An older_than_s past what a date can hold (the Python API takes seconds as they come) was an OverflowError."""
    _register(reg, "a", 0, report=False)
    reg.delete_version("a", 1)
    for seconds in (1e12, 1e300):
        res = reg.gc(older_than_s=seconds)
        assert res["collected"]["maps"] == [] and res["younger"] == 1


def test_http_says_a_collected_version_is_gone(tmp_path):
    from _api_support import R, settings_for
    from fastapi.testclient import TestClient

    from service.api import create_app

    app = create_app(settings_for(tmp_path))
    with TestClient(app) as client:
        reg = app.state.vb.registry
        _register(reg, "a", 2)
        _register(reg, "a", 1)
        reg.delete_version("a", 1)
        assert client.get("/v1/maps/a/versions/1/report", headers=R).status_code == 200
        reg.gc()
        for url in ("/v1/maps/a/versions/1/report", "/v1/maps/a:1/artifact"):
            r = client.get(url, headers=R)
            assert r.status_code == 404 and "deleted and its files collected" in r.json()["error"]["message"], url
        assert client.get("/v1/maps/a/versions/1", headers=R).json()["collected_at"] is not None
        assert client.get("/v1/maps/a/versions/2", headers=R).json()["collected_at"] is None


def test_a_backup_keeps_the_files_of_the_registry_it_copied_while_gc_runs(tmp_path):
    """`vecbridge backup` copies the registry, then the artifacts: a gc in between removed the files of a version the
    copy still held deleted but not collected, and the backup's own `registry verify` failed on it. The backup holds
    the artifact folder's writer lock (shared: writers do not wait) from the one copy to the other; gc waits."""
    from service.config import Settings
    from service.ops.backup import backup_data_dir

    data = tmp_path / "data"
    reg = open_registry(f"sqlite:///{data / 'registry.sqlite'}", data / "artifacts")
    v = _register(reg, "a", 0)
    _register(reg, "a", 1)
    reg.delete_version("a", 1)
    out = {}

    def progress(stage, fraction):
        if (stage, fraction) == ("artifacts", 0.0):  # the registry is copied; its artifacts are not yet
            gc = threading.Thread(target=lambda: out.update(gc=reg.gc()))
            gc.start()
            gc.join(0.5)
            out["thread"] = gc

    summary = backup_data_dir(Settings(data_dir=data), tmp_path / "backup", progress=progress)
    out["thread"].join(30)
    assert summary["registry"]["verify"]["ok"], summary["registry"]["verify"]
    assert out["gc"]["collected"]["maps"] == ["a:1"] and not reg.artifact_file(v).exists()
    copy = open_registry(f"sqlite:///{tmp_path / 'backup' / 'registry.sqlite'}", tmp_path / "backup" / "artifacts")
    assert copy.verify()["ok"] and copy.gc()["collected"]["maps"] == ["a:1"]  # the copy is whole, and collectable


def test_gc_removes_only_reports_in_the_report_folder(reg, tmp_path):
    """gc unlinked any .html a deleted version's row named as its report: an absolute path, one climbing out with
    ``..``, or a link out of the report folder (register_version stores the report_path its caller passes) — a
    user's own file was deleted. Now such a report stays, listed in ``reports_kept``; the folder's own still goes."""
    mine = tmp_path / "mine"
    mine.mkdir()
    own = [mine / f"{n}.html" for n in ("abs", "dotdot", "linked")]
    for p in own:
        p.write_text("<html>the user's own page</html>")
    reg.report_dir.mkdir(parents=True, exist_ok=True)
    (reg.report_dir / "link.html").symlink_to(own[2])
    paths = [str(own[0]), str(Path("..") / own[1].relative_to(tmp_path)), "link.html"]
    assert reg.report_path_of(paths[1]) == own[1]  # the report folder is tmp_path/reports
    for i, rp in enumerate(paths):
        reg.register_version("u", _map(i), source_space="s", target_space="t", method="procrustes", params={},
                             report_path=rp)
        reg.delete_version("u", i + 1)
    ours = _register(reg, "a", 1)
    reg.delete_version("a", 1)
    ours_file = reg.report_file(ours)
    planned = reg.gc(dry_run=True)
    assert planned["reports"] == [str(ours_file)] and sorted(planned["reports_kept"]) == sorted(map(str, own))
    assert planned["report_bytes"] == _size(ours_file)
    done = reg.gc()
    assert done["collected"]["maps"] == ["a:1", "u:1", "u:2", "u:3"]
    assert all(p.read_text() == "<html>the user's own page</html>" for p in own) and not ours_file.exists()
    assert sorted(done["reports_kept"]) == sorted(map(str, own)) and done["reports"] == [str(ours_file)]
    again = reg.gc()
    assert again["reports_kept"] == [] and all(p.exists() for p in own)  # said once, when collected


def test_a_version_collected_between_resolve_and_read_is_deleted_not_corrupt(reg):
    """Another process resolved a version while it was live; before it read the file (cold cache) the version was
    deleted and gc removed it. The read said IntegrityError 'artifact ... is missing or unreadable' (a corrupt
    registry, 500); it is a DeletedVersionError naming the collection (404)."""
    _register(reg, "a", 0, report=False)
    reg.register_steer("st", align.MeanShift(np.ones(8)), space="s")
    reader = open_registry(reg.url, reg.store.root)
    try:
        v, s = reader.resolve("a"), reader.resolve_steer("st")
        reg.delete_version("a", 1)
        reg.delete_steer_version("st", 1)
        assert reg.gc()["collected"] == {"maps": ["a:1"], "steers": ["st:1"]}
        with pytest.raises(DeletedVersionError, match=r"map a:1 was deleted and its files collected"):
            reader.load_map(v)
        with pytest.raises(DeletedVersionError, match=r"steer st:1 was deleted and its files collected"):
            reader.load_steer(s)
        reg.register_version("b", _map(5), source_space="s", target_space="t", method="procrustes", params={})
        reg.store.path(reg.resolve("b").artifact_path).unlink()  # live and missing: one lost file, 1 of 1 newest
        with pytest.raises(IntegrityError, match="missing or unreadable") as e:  # too few to say "another folder"
            reader.load_map("b")
        assert type(e.value) is IntegrityError, e.value
    finally:
        reader.close()


def test_verify_lists_a_deleted_versions_missing_files_apart_not_as_a_failure(reg, tmp_path, capsys):
    """A PostgreSQL registry restored from a dump taken before a `registry gc`, beside a backup of the artifacts taken
    after it, holds deleted (not collected) versions whose files gc removed: `registry verify` called each "missing or
    unreadable", ok false, exit 2, though nothing reads a deleted version's files. They are listed apart now, with
    what to do; a live version's missing file, or a deleted version's corrupt one, is still a failure."""
    _register(reg, "a", 0, report=False)
    gone = _register(reg, "a", 1, report=False)
    corrupt = _register(reg, "a", 2, report=False)
    for version in (2, 3):
        reg.delete_version("a", version)
    reg.artifact_file(gone).unlink()  # what the restored dump and the later backup disagree on
    checked = reg.verify()
    assert checked["ok"] and checked["bad_artifacts"] == [] and checked["n_deleted"] == 2
    assert checked["deleted_files_gone"] == [
        "a:2: deleted version whose files are gone: `vecbridge registry gc` records it as collected"]
    data = tmp_path / "cli"  # the command answers it the same way: exit 0
    cli_reg = open_registry(f"sqlite:///{data / 'registry.sqlite'}", data / "artifacts")
    _register(cli_reg, "a", 0, report=False)
    cli_reg.artifact_file(_register(cli_reg, "a", 1, report=False)).unlink()
    cli_reg.delete_version("a", 2)
    cli_reg.close()
    code, out, _ = run_cli(capsys, "--data-dir", data, "registry", "verify")
    assert code == 0 and json.loads(out)["deleted_files_gone"][0].startswith("a:2: deleted version"), out

    path = reg.artifact_file(corrupt)
    path.chmod(0o644)
    path.write_bytes(path.read_bytes()[:-4] + b"oops")
    checked = reg.verify()
    assert not checked["ok"] and [b.split(":")[:2] for b in checked["bad_artifacts"]] == [["a", "3"]]
    assert len(checked["deleted_files_gone"]) == 1
    assert reg.gc()["collected"]["maps"] == ["a:2", "a:3"]  # as the hint says
    checked = reg.verify()
    assert checked["ok"] and checked["deleted_files_gone"] == [] and checked["n_collected"] == 2
    reg.artifact_file(reg.get_version("a", 1)).unlink()  # a live version's file: a failure, as before
    checked = reg.verify()
    assert not checked["ok"] and "a:1: " in checked["bad_artifacts"][0] and checked["deleted_files_gone"] == []


def test_a_bundle_taken_before_a_delete_and_gc_says_what_it_did_not_restore_and_leaves_no_file(reg, tmp_path,
                                                                                               capsys):
    """A bundle exported before versions were deleted (and gc'd) here: the import answered "imported: 0, skipped: N",
    which reads "already here", though nothing was restored (an import never undeletes), and it had stored the
    collected versions' artifacts, which no row named: orphans `registry verify` listed and no gc ever removed. Such
    versions are listed apart now ("present here deleted; not restored") and the files go again after the commit."""
    _register(reg, "a", 0, report=False)
    _register(reg, "a", 1, report=False)
    _register(reg, "a", 2, report=False)
    reg.register_steer("st", align.MeanShift(np.ones(8)), space="s")
    bundle = reg.export(tmp_path / "before.zip")
    reg.delete_version("a", 2)
    reg.delete_steer_version("st", 1)
    assert reg.gc()["collected"] == {"maps": ["a:2"], "steers": ["st:1"]}
    reg.delete_version("a", 3)  # deleted, files still here
    files = reg.store.all_relpaths()
    assert len(files) == 2

    for how in ("error", "renumber"):
        counts = reg.import_(bundle, on_conflict=how)
        assert counts == {"imported": 0, "skipped": 1, "renumbered": 0, "aliases": 0, "steers": 0, "steer_aliases": 0,
                          "deleted_here": ["map a:2", "map a:3", "steer st:1"]}, (how, counts)
        assert reg.store.all_relpaths() == files, how  # no file no row names
        checked = reg.verify()
        assert checked["ok"] and checked["orphan_artifacts"] == [] and checked["n_collected"] == 2, how
        assert reg.get_version("a", 2).collected_at and reg.get_version("a", 3).deleted
    assert reg.import_(reg.export(tmp_path / "now.zip")) == {  # deleted in the bundle too: skipped, as before
        "imported": 0, "skipped": 3, "renumbered": 0, "aliases": 0, "steers": 0, "steer_aliases": 0}

    data = tmp_path / "cli"  # the command says it in words
    cli_reg = open_registry(f"sqlite:///{data / 'registry.sqlite'}", data / "artifacts")
    cli_reg.import_(bundle)
    cli_reg.delete_version("a", 2)
    cli_reg.gc()
    cli_reg.close()
    code, out, err = run_cli(capsys, "--data-dir", data, "registry", "import", tmp_path / "before.zip")
    assert code == 0 and "skipped=2" in out and "deleted_here" not in out, out + err
    assert "1 version(s) present here deleted; not restored: map a:2" in out and "steer" not in out.split("\n")[1]
    code, out, _ = run_cli(capsys, "--data-dir", data, "registry", "import", tmp_path / "before.zip", "--json")
    assert code == 0 and json.loads(out)["deleted_here"] == ["map a:2"]


def test_gc_counts_the_artifact_files_it_kept_and_says_who_holds_them(tmp_path, capsys):
    """"N artifact(s) kept: a live version holds the same bytes" counted the versions collected whose file stayed, not
    the files (two versions of one file: "2 artifact(s) kept"), and blamed a live version where the holder may be a
    deleted one --older-than left."""
    data = tmp_path / "data"
    reg = open_registry(f"sqlite:///{data / 'registry.sqlite'}", data / "artifacts")
    for name, seed in (("a", 0), ("a", 0), ("b", 0), ("d", 7), ("d", 7)):  # a:1, a:2 and b:1 are one file
        _register(reg, name, seed, report=False)
    for name, version in (("a", 1), ("a", 2), ("d", 1), ("d", 2)):
        reg.delete_version(name, version)
    with reg.db.tx(write=True) as t:  # only d:1 is old enough: d:2, deleted just now, holds its file
        t.q("UPDATE versions SET deleted_at = ? WHERE deleted = 1 AND NOT (name = 'd' AND version = 2)",
            ("2000-01-01T00:00:00+00:00",))
    reg.close()
    base = ("--data-dir", data, "registry", "gc", "--older-than", "1h")
    code, out, _ = run_cli(capsys, *base, "--dry-run", "--json")
    res = json.loads(out)
    assert code == 0 and res["shared"]["maps"] == ["a:1", "a:2", "d:1"] and len(res["artifacts_kept"]) == 2
    code, out, _ = run_cli(capsys, *base)
    assert code == 0 and "collected 3 deleted version(s)" in out and "removed 0 artifact(s)" in out, out
    assert ("2 artifact(s) kept: a live version, or a deleted one younger than --older-than, holds the same bytes"
            in out), out


def test_gc_orphans_removes_old_files_no_version_names_under_its_lock(reg, tmp_path, capsys):
    """A writer killed between storing its artifact and committing its row leaves a file no row names: `registry
    verify` listed it and said the next gc removes it, but no command ever did. `gc --orphans` removes such files once
    untouched for STALE_TMP_S (a younger one may be a running writer's), under gc's exclusive lock; a plain gc counts
    them (opened on the wrong database, every file would look an orphan)."""
    import os

    from service.registry.store import STALE_TMP_S

    live = _register(reg, "a", 0, report=False)
    other = open_registry(f"sqlite:///{tmp_path}/other.sqlite", tmp_path / "other-artifacts")
    old, young = (other.store.get(v.artifact_path, v.artifact_sha256) for v in (
        _register(other, "x", 1, report=False), _register(other, "x", 2, report=False)))
    old_rel, young_rel = reg.store.put(old, "safetensors")[1], reg.store.put(young, "safetensors")[1]  # no row
    stale = time.time() - STALE_TMP_S - 60
    os.utime(reg.store.path(old_rel), (stale, stale))
    os.utime(reg.artifact_file(live), (stale, stale))
    assert sorted(reg.verify()["orphan_artifacts"]) == sorted([old_rel, young_rel])
    size = _size(reg.store.path(old_rel))

    res = reg.gc()
    assert res["orphans"] == [old_rel] and res["orphan_bytes"] == 0 and reg.store.path(old_rel).exists()
    res = reg.gc(dry_run=True, orphans=True)
    assert res["orphans"] == [old_rel] and res["orphan_bytes"] == res["bytes_freed"] == size
    assert reg.store.path(old_rel).exists()
    with reg.store.pinned(), pytest.raises(RegistryLockedError):  # a writer between storing and committing
        reg.gc(orphans=True, wait_s=0.2)  # gc waits, then removes nothing
    assert reg.store.path(old_rel).exists()
    res = reg.gc(orphans=True)
    assert res["orphans"] == [old_rel] and res["orphan_bytes"] == res["bytes_freed"] == size
    assert not reg.store.path(old_rel).exists() and reg.store.path(young_rel).exists()
    assert reg.artifact_file(live).exists() and reg.load_map("a").W.shape == (8, 8)  # a named file, old, stays
    checked = reg.verify()
    assert checked["ok"] and checked["orphan_artifacts"] == [young_rel]

    data = tmp_path / "cli"  # the command
    cli_reg = open_registry(f"sqlite:///{data / 'registry.sqlite'}", data / "artifacts")
    _register(cli_reg, "a", 0, report=False)  # one file this registry names: it is the registry of that folder
    rel = cli_reg.store.put(old, "safetensors")[1]
    os.utime(cli_reg.store.path(rel), (stale, stale))
    cli_reg.close()
    base = ("--data-dir", data, "registry", "gc")
    code, out, _ = run_cli(capsys, *base)
    assert code == 0 and "1 orphan artifact(s) no version names left" in out and "--orphans removes" in out, out
    code, out, _ = run_cli(capsys, *base, "--orphans", "--dry-run")
    assert code == 0 and "would remove 1 orphan artifact(s)" in out and (data / "artifacts" / rel).exists(), out
    code, out, _ = run_cli(capsys, *base, "--orphans")
    assert code == 0 and "removed 1 orphan artifact(s)" in out and not (data / "artifacts" / rel).exists(), out
