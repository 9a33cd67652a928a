"""``registry prune`` / ``steer prune``: every refit kept its version (and, until gc, ~1 MB of artifact and report at
384-d) for good, and the only remedy was ``registry delete NAME VERSION`` once per version (a deployment scripted 477
of them to keep the newest 10 per map). Prune soft-deletes, per name, the live versions beyond the newest N, never one
an alias points at nor the one a bare name means. Run against SQLite and (when VECBRIDGE_TEST_POSTGRES_URL is set)
PostgreSQL."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from conftest import run_cli

import align
from align.exceptions import InputError
from service.registry import DeletedVersionError, NotFoundError, open_registry
from service.registry.prune import prune_versions

UNRELIABLE = {"reliable": False}


def _map(seed: int) -> align.LinearMap:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(64, 8))
    return align.fit_procrustes(X, X @ rng.normal(size=(8, 8)))


def _versions(reg, name: str, n: int, *, seed0: int = 0, report: bool = False, **kw) -> list:
    """``n`` versions of map ``name``, each with its own artifact (and, with ``report``, its own report file)."""
    out = []
    for i in range(n):
        rel = f"{name}/v{i}.html" if report else None
        out.append(reg.register_version(name, _map(seed0 + i), source_space="s", target_space="t",
                                        method="procrustes", params={}, report_path=rel, **kw))
        if report:
            (reg.report_dir / name).mkdir(parents=True, exist_ok=True)
            (reg.report_dir / rel).write_text("<html>" + "r" * 4000 + "</html>")
    return out


def _live(reg, name: str) -> list[int]:
    return [v.version for v in reg.list_versions(name, include_deleted=False)]


def test_prune_keeps_the_newest_live_versions_and_every_aliased_one(reg):
    _versions(reg, "a", 7)
    _versions(reg, "b", 3, seed0=50)
    reg.set_alias("a", "prod", 2)
    reg.set_alias("a", "staging", 3)
    reg.delete_version("a", 6)  # deleted: not one of the newest live
    res = prune_versions(reg, "maps", ["a"], keep_last=2)
    assert res["deleted"] == ["a:1", "a:4"] and not res["dry_run"]
    assert res["names"] == [{"name": "a", "deleted": [1, 4], "kept": [
        {"version": 7, "why": ["newest"]}, {"version": 5, "why": ["newest"]},
        {"version": 3, "why": ["alias staging"]}, {"version": 2, "why": ["alias prod", "bare name"]}]}]
    assert _live(reg, "a") == [2, 3, 5, 7] and _live(reg, "b") == [1, 2, 3]  # only the maps named
    assert reg.resolve("a").version == 2 and reg.load_map("a@staging").W.shape == (8, 8)
    with pytest.raises(DeletedVersionError):
        reg.resolve("a:4")
    v1 = reg.get_version("a", 1)  # the same soft delete as `registry delete`: the record stays for lineage
    assert v1.deleted and v1.artifact_sha256 and v1.collected_at is None

    every = prune_versions(reg, "maps", None, keep_last=1)  # no name: every map
    assert every["deleted"] == ["a:5", "b:1", "b:2"] and [p["name"] for p in every["names"]] == ["a", "b"]
    assert _live(reg, "a") == [2, 3, 7] and _live(reg, "b") == [3]
    assert prune_versions(reg, "maps", ["a", "a"], keep_last=1)["deleted"] == []  # idempotent, a name once


def test_the_version_a_bare_name_means_is_kept_even_when_older(reg):
    """No prod alias: a bare name means the newest reliable version, here older than the two unreliable refits."""
    _versions(reg, "m", 2)
    _versions(reg, "m", 2, seed0=10, metrics=UNRELIABLE)
    assert reg.resolve("m").version == 2
    res = prune_versions(reg, "maps", ["m"], keep_last=1)
    assert res["names"][0]["kept"] == [{"version": 4, "why": ["newest"]}, {"version": 2, "why": ["bare name"]}]
    assert _live(reg, "m") == [2, 4] and reg.resolve("m").version == 2  # transforms by name still get version 2


def test_dry_run_deletes_nothing_and_plans_what_the_run_does(reg):
    _versions(reg, "a", 5)
    reg.set_alias("a", "prod", 1)
    planned = prune_versions(reg, "maps", ["a"], keep_last=2, dry_run=True)
    assert planned["dry_run"] and planned["deleted"] == ["a:2", "a:3"]
    assert _live(reg, "a") == [1, 2, 3, 4, 5]
    done = prune_versions(reg, "maps", ["a"], keep_last=2)
    assert done["names"] == planned["names"] and _live(reg, "a") == [1, 4, 5]


def test_a_prune_with_nothing_to_delete_writes_nothing(reg):
    """A nightly prune of maps already within N wrote once per map (generation bumped, caches invalidated)."""
    _versions(reg, "a", 3)
    before = reg.generation()
    assert prune_versions(reg, "maps", None, keep_last=5)["deleted"] == []
    assert reg.generation() == before
    assert prune_versions(reg, "maps", None, keep_last=2)["deleted"] == ["a:1"] and reg.generation() != before


def test_a_dry_run_needs_only_the_read_grant(pg_url, tmp_path):
    """``--dry-run`` locked each name FOR UPDATE, which a SELECT-only role (a reporting replica's) may not: it failed
    'permission denied' where ``registry gc --dry-run`` works under the same role."""
    import uuid

    import psycopg

    reg = open_registry(pg_url, tmp_path / "artifacts")
    _versions(reg, f"ro_{uuid.uuid4().hex[:6]}", 3)
    reg.close()
    role = f"ro_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
    try:
        ro = open_registry(pg_url.replace("postgres@", f"{role}@", 1), tmp_path / "artifacts")
        try:
            planned = prune_versions(ro, "maps", None, keep_last=1, dry_run=True)
            assert planned["dry_run"] and len(planned["deleted"]) >= 2, planned
        finally:
            ro.close()
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


def test_older_than_deletes_only_versions_created_that_long_ago(reg):
    _versions(reg, "a", 4)
    res = prune_versions(reg, "maps", ["a"], keep_last=1, older_than_s=3600)
    assert res["deleted"] == [] and [k["why"] for k in res["names"][0]["kept"]] == [["newest", "bare name"]] + [
        ["younger"]] * 3
    assert prune_versions(reg, "maps", ["a"], keep_last=1, older_than_s=0)["deleted"] == ["a:1", "a:2", "a:3"]


def test_an_unknown_name_is_refused_before_anything_is_deleted(reg):
    _versions(reg, "minilm-e5", 3)
    with pytest.raises(NotFoundError, match=r"unknown map 'minilm-e6' \(did you mean 'minilm-e5'\?\)"):
        prune_versions(reg, "maps", ["minilm-e5", "minilm-e6"], keep_last=1)
    assert _live(reg, "minilm-e5") == [1, 2, 3]
    for bad in (0, -1, True, 1.5):
        with pytest.raises(InputError, match="keep_last"):
            prune_versions(reg, "maps", ["minilm-e5"], keep_last=bad)
    assert _live(reg, "minilm-e5") == [1, 2, 3]


def test_steers_are_pruned_by_the_same_rules(reg):
    for i in range(5):
        reg.register_steer("formal", align.MeanShift(np.full(8, float(i + 1))), space="s")
    reg.set_steer_alias("formal", "prod", 1)
    reg.set_steer_alias("formal", "canary", 2)
    res = prune_versions(reg, "steers", ["formal"], keep_last=1)
    assert res["deleted"] == ["formal:3", "formal:4"]
    assert [v.version for v in reg.list_steer_versions("formal") if not v.deleted] == [1, 2, 5]
    assert reg.resolve_steer("formal").version == 1 and reg.load_steer("formal@canary").dim == 8
    with pytest.raises(NotFoundError, match="unknown steer 'formall'"):
        prune_versions(reg, "steers", ["formall"], keep_last=1)


def test_registry_prune_command_then_gc_frees_the_files_and_aliased_versions_still_transform(tmp_path, capsys):
    data = tmp_path / "data"
    reg = open_registry(f"sqlite:///{data / 'registry.sqlite'}", data / "artifacts")
    vs = _versions(reg, "docs", 6, report=True)
    reg.set_alias("docs", "prod", 1)
    gone = [vs[i] for i in (1, 2, 3)]
    files = [reg.artifact_file(v) for v in gone] + [reg.report_file(v) for v in gone]
    assert all(p.exists() for p in files)
    reg.close()
    base = ("--data-dir", data, "registry")

    code, out, err = run_cli(capsys, *base, "prune", "--keep-last", "2", "--dry-run")
    assert code == 0, err
    plan = "map docs: would delete 3 version(s): 2, 3, 4; kept 3: 6, 5 (newest); 1 (alias prod, bare name)"
    assert out.splitlines() == [plan, "would delete 3 version(s) of 1 map(s) (nothing deleted: --dry-run)"]
    code, out, err = run_cli(capsys, *base, "prune", "docs", "--keep-last", "2", "--json")
    res = json.loads(out)
    assert code == 0 and res["deleted"] == ["docs:2", "docs:3", "docs:4"] and not res["dry_run"], err
    assert all(p.exists() for p in files)  # a soft delete: gc frees the files
    code, out, err = run_cli(capsys, *base, "gc")
    assert code == 0 and "collected 3 deleted version(s)" in out, err
    assert not any(p.exists() for p in files)

    x = np.random.default_rng(1).normal(size=(5, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    for ref in ("docs@prod", "docs", "docs:6"):
        code, _, err = run_cli(capsys, "--data-dir", data, "transform", "--map", ref, tmp_path / "x.npy",
                               tmp_path / "y.npy")
        assert code == 0 and np.load(tmp_path / "y.npy").shape == (5, 8), (ref, err)
    code, _, err = run_cli(capsys, "--data-dir", data, "transform", "--map", "docs:3", tmp_path / "x.npy",
                           tmp_path / "y.npy")
    assert code == 2 and "deleted" in err

    code, _, err = run_cli(capsys, *base, "prune", "b", "--keep-last", "1")
    assert code == 2 and "unknown map 'b'" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(capsys, *base, "prune", "doc", "--keep-last", "1")
    assert code == 2 and "did you mean 'docs'" in err
    for n in ("0", "-3"):
        code, _, err = run_cli(capsys, *base, "prune", "--keep-last", n)
        assert code == 2 and "--keep-last" in err
    code, _, err = run_cli(capsys, *base, "prune")
    assert code == 2 and "--keep-last" in err
    code, out, err = run_cli(capsys, "--data-dir", data, "steer", "prune", "--keep-last", "1", "--json")
    assert code == 0 and json.loads(out)["deleted"] == [] and json.loads(out)["kind"] == "steers", err


def test_an_alias_set_while_a_prune_runs_never_lands_on_a_version_it_deletes(reg, registry_url, tmp_path,
                                                                              monkeypatch):
    """The prune reads the aliases, then marks; an alias set on a version in between (PostgreSQL, READ COMMITTED)
    pointed at a deleted version. ``set_alias`` now takes the name's row lock the prune holds: it waits, then finds
    the version deleted (409)."""
    import threading

    from service.registry import ConflictError, core

    _versions(reg, "a", 3)
    other = open_registry(registry_url, tmp_path / "artifacts")
    got: list = []

    def set_canary():
        try:
            got.append(other.set_alias("a", "canary", 1))
        except ConflictError as exc:
            got.append(exc)

    def waiting() -> bool:  # the alias write waits on a lock (PostgreSQL; SQLite's writers wait in BEGIN IMMEDIATE)
        with reg.db.tx() as t:
            return t.one("SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
                         "AND wait_event_type = 'Lock'")["n"] > 0

    def hook(point):
        if point != "prune_planned":
            return
        th = threading.Thread(target=set_canary)
        th.start()
        hook.thread = th
        deadline = time.monotonic() + 60
        while reg.backend == "postgresql" and th.is_alive() and not waiting():
            assert time.monotonic() < deadline, "the alias write neither waited on a lock nor ended within 60 s"
            th.join(0.01)

    monkeypatch.setattr(core, "FAULT_HOOK", hook)
    res = prune_versions(reg, "maps", ["a"], keep_last=1)
    monkeypatch.setattr(core, "FAULT_HOOK", None)
    hook.thread.join(60)
    assert not hook.thread.is_alive(), "the alias write still runs 60 s after the prune"
    other.close()
    assert res["deleted"] == ["a:1", "a:2"] and len(got) == 1
    assert isinstance(got[0], ConflictError) and "deleted version 1" in str(got[0])
    with reg.db.tx() as t:
        assert t.q("SELECT alias FROM aliases WHERE name = 'a'") == []


def test_a_steer_prune_keeps_the_version_a_bare_name_uses_past_a_flagged_newer_one(reg):
    """A review's find: a bare steer name skips a version flagged unreliable (as a map's), but prune took every
    steer version for a reliable one: with t:2 flagged and --keep-last 1 it deleted t:1, the bare name's version,
    and said t:2 was kept as the bare name's."""
    from align.steer import fit_mean_shift

    X = np.random.default_rng(0).normal(size=(20, 6))
    s = fit_mean_shift(X, np.array([1] * 10 + [-1] * 10))
    reg.register_steer("t", s, space="six", metrics={"reliable": True})
    reg.register_steer("t", s, space="six", metrics={"reliable": False, "unreliable_reason": "shuffled"})
    assert reg.resolve_steer("t").version == 1
    res = prune_versions(reg, "steers", ["t"], keep_last=1)
    assert res["deleted"] == [], res
    kept = {k["version"]: k["why"] for k in res["names"][0]["kept"]}
    assert kept == {2: ["newest"], 1: ["bare name"]}, kept
    assert reg.resolve_steer("t").version == 1


def test_an_interrupted_steer_fit_or_verification_is_told_what_to_check(tmp_path):
    """The advice after an interruption named a map's versions for every kind but a migration: a steer fit is told
    to check the steer's versions, a verification that resubmitting is safe."""
    from service.job_store import INTERRUPTED, interrupted_in

    steer = interrupted_in("running", "register", 1.0, INTERRUPTED, "steer-fit")["message"]
    assert "check the steer's versions (GET /v1/steers/NAME" in steer and "/v1/maps" not in steer, steer
    assert "resubmit it" in interrupted_in("running", "verify", 0.5, INTERRUPTED, "verify")["message"]
    assert "GET /v1/maps/NAME/versions" in interrupted_in("running", "register", 1.0, INTERRUPTED, "fit")["message"]
