"""A stopped migration's resume: the options it must give again, compared as they resolve; the command that resumes
it naming the registry the run used; a refusal over HTTP naming the request's fields."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _api_support import W, settings_for
from _jobs_support import wait_http_job
from _servers import read_line
from _vectordb_servers import migrate_world, qdrant_migration_world, rewrite_checkpoint

from align.exceptions import InputError
from service.ops.vectordb import checkpoint_status, default_checkpoint
from service.registry import open_registry
from service.vectordb import CheckpointMismatchError, MigrationInterrupted, open_store

pytest.importorskip("qdrant_client")

ROOT = Path(__file__).resolve().parents[3]
N = 120


@pytest.fixture
def world(tmp_path):
    """A registry (spaces a, b; map a2b) in ``data`` and a local Qdrant folder holding ``src`` (N rows, space a; their
    payloads have a ``body`` key beside ``text``: a text field a resume may name, that the source has)."""
    with qdrant_migration_world(tmp_path, {"body": [f"b{i}" for i in range(N)]}, n=N) as w:
        yield w


_migrate = migrate_world


def test_a_resume_leaving_out_what_the_run_gave_as_the_default_goes_on_and_a_real_change_is_refused(world):
    """A run started with ``--index like`` (what no ``--index`` means), the store's own text field and the map's own
    target space, then stopped: its resume without those flags was refused as "started with other options:
    --index 'like' (this run: None)", although it changes nothing. Values are compared as they resolve; another
    index or field is still refused, naming it, the checkpoint untouched."""
    ck = world["tmp"] / "run.json"
    with pytest.raises(MigrationInterrupted):
        _migrate(world, ck, stop=True, index="like", text_field="text", target_space="b")
    done = json.loads(ck.read_text())["done"]
    assert 0 < done < N
    with pytest.raises(InputError, match=r"--index 'hnsw' is for a PostgreSQL target; a qdrant target"):
        _migrate(world, ck, index="hnsw", text_field="text", target_space="b")  # refused first (ignored before)
    with pytest.raises(CheckpointMismatchError, match=r"--text-field 'text' \(this run: 'body'\)"):
        _migrate(world, ck, text_field="body")
    assert json.loads(ck.read_text())["done"] == done  # the refusals wrote nothing
    rep = _migrate(world, ck)  # no --index, --text-field, --target-space: their defaults, the recorded values
    assert rep.rows == N and rep.resumed_from is not None and rep.rows_this_run == N - done, rep
    with open_store(world["url"]) as s:
        assert s.get_space("dst") == "b"


def test_a_resume_may_not_change_the_index_a_run_left_unset_and_may_give_its_default(tmp_path):
    """No ``--index`` means ``like``, yet a run started without one resumed with ``--index hnsw`` (an unset option
    could be added) while one started with ``--index like`` was refused the same change (the run may have built its
    index already). Compared as it resolves: ``hnsw`` is refused naming the default, ``like`` is no change. (A
    PostgreSQL target's option: Qdrant and Milvus refuse any kind but like before a checkpoint is read.)"""
    from service.ops.migration_checks import resume_options
    from service.vectordb import FileCheckpoint

    path = tmp_path / "c.json"
    FileCheckpoint(path, options=resume_options()).save(
        {"source": "s", "target": "t", "map_fingerprint": "f", "last_id": 3, "finished": False})
    for given, refused in (("hnsw", True), ("like", False)):
        ck = FileCheckpoint(path, options=resume_options(index=given))
        ck.resolve_options(index="like")
        if refused:
            with pytest.raises(CheckpointMismatchError, match=r"--index None \(default 'like'\) \(this run: 'hnsw'\)"):
                ck.load()
        else:
            assert ck.load()["last_id"] == 3


@pytest.mark.parametrize(("option", "other", "default", "added"), [("text_field", "body", "text", {"alias": "live"})])
def test_a_resume_may_not_change_what_an_option_the_first_run_left_unset_means(world, option, other, default, added):
    """A run that gave no field names, stopped, then resumed with ``--text-field body``: the default was read from the
    store opened for the resume (opened with ``body``), so recorded None resolved to ``body`` and the change went
    through, recorded in the checkpoint. The engine's own default (``text``) is what None means.

    No ``--index`` means ``like``, yet a run started without one resumed with ``--index hnsw`` (an unset option
    could be added) while one started with ``--index like`` was refused the same change. The run may have built its
    index already (stopped in its finalize; the checkpoint cannot tell), and another kind builds a second one.

    Both are refused, naming the option and the default it stands for, the checkpoint untouched; giving that default
    explicitly is no change (and an alias may still be added)."""
    ck = world["tmp"] / f"unset_{option}.json"
    with pytest.raises(MigrationInterrupted):
        _migrate(world, ck, stop=True)
    before = ck.read_text()
    flag = "--" + option.replace("_", "-")
    with pytest.raises(CheckpointMismatchError, match=rf"{flag} None \(default '{default}'\) \(this run: '{other}'\)"):
        _migrate(world, ck, **{option: other})
    assert ck.read_text() == before
    rep = _migrate(world, ck, **{option: default}, **added)
    assert rep.rows == N and rep.resumed_from is not None and rep.alias == added.get("alias", rep.alias), rep


def _recorded_by_an_older_release(ck: Path, index: str = "hnsw") -> dict:
    """Checkpoint ``ck`` as a release that took ``--index`` on any store recorded it (the kind it was given, which
    it ignored on Milvus and Qdrant): its state, rewritten."""
    return rewrite_checkpoint(ck, options={"index": index}, engine=None)  # such a release recorded no engine: the
    # store is known only where the caller says it


def test_a_refused_resume_over_http_is_a_409_naming_the_requests_fields(world):
    """A resume whose options differ is refused (CheckpointMismatchError: a conflict). Over HTTP the route answered
    202 and the job failed, although README promised a 409; and the message named the CLI's flags (``--alias 'live'
    (this run: None)``), which an HTTP client never sends. The request is answered 409 before a job exists, naming
    the request's JSON fields and values; the same request with the run's options is accepted.

    The run recorded ``index: hnsw``, as an older release did on a Qdrant store (where it was ignored): that is not
    a difference (a Qdrant target takes the source's index), and the listing's resume command leaves it out; it
    was a 409 naming ``index "hnsw"`` for every request, and ``index: "hnsw"`` a 422, so the run could not go on."""
    from fastapi.testclient import TestClient

    from service.api.app import create_app

    ck = default_checkpoint(world["data"], "src", "dst")
    with pytest.raises(MigrationInterrupted):
        _migrate(world, ck, stop=True, alias="live", text_field="text", space_option="source_space")
    _recorded_by_an_older_release(ck)
    body = {"source": "src", "target": "dst", "map": "a2b", "batch_size": 40}
    with TestClient(create_app(settings_for(world["tmp"], vectordb_url=world["url"]))) as c:
        r = c.post("/v1/migrations", json={**body, "text_field": "body"}, headers=W)
        assert r.status_code == 409 and r.json()["error"]["type"] == "CheckpointMismatchError", r.text
        assert c.get("/v1/jobs", headers=W).json()["data"] == []  # refused before a job exists
        msg = r.json()["error"]["message"]
        listed = c.get("/v1/migrations", headers=W).json()["data"][0]
        r = c.post("/v1/migrations", json={**body, "alias": "live"}, headers=W)  # the run's options: accepted
        assert r.status_code == 202, r.text
        assert wait_http_job(c, r.json()["id"], headers=W)["state"] == "succeeded"
    assert 'alias "live" (this request: null)' in msg, msg
    assert 'text_field "text" (this request: "body")' in msg, msg
    assert "index" not in msg, msg
    assert "--" not in msg.split(" was started with other options: ", 1)[1], msg  # no CLI flag, no CLI command
    assert "GET /v1/migrations" in msg, msg
    argv = shlex.split(listed["resume"])
    assert "--index" not in argv and argv[argv.index("--alias") + 1] == "live", argv
    assert "index" not in (listed["resume_note"] or ""), listed


def test_an_older_releases_run_recording_an_index_on_qdrant_resumes_by_its_printed_command(world, tmp_path,
                                                                                           monkeypatch, capsys):
    """A stopped run whose checkpoint records ``--index hnsw`` on a Qdrant store (an older release took the option
    there and ignored it): ``--status`` printed a resume command with ``--index hnsw``, refused (exit 2, "for a
    PostgreSQL target"), and without it, or with ``--index like``, exit 2 "started with other options". The command
    leaves it out where the store is known (``--store``, VECBRIDGE_VECTORDB_URL) and runs as printed; where it is
    not, the note says to leave it out on Milvus or Qdrant. A PostgreSQL store still compares it."""
    from service.cli import main
    from service.vectordb import FileCheckpoint

    ck = tmp_path / "old.json"
    with pytest.raises(MigrationInterrupted):
        _migrate(world, ck, stop=True, target="dst")
    state = _recorded_by_an_older_release(ck)
    assert "--index hnsw" in checkpoint_status(ck)["resume"]  # no store known: as recorded, with a note
    assert "--index hnsw is for a PostgreSQL STORE" in checkpoint_status(ck)["resume_note"]
    _migrate(world, ck, index="like", dry_run=True)  # compared as like: not refused
    monkeypatch.delenv("VECBRIDGE_VECTORDB_URL", raising=False)
    capsys.readouterr()
    assert main(["--data-dir", str(world["data"]), "migrate", "--store", world["url"], "--source", "src",
                 "--target", "dst", "--map", "a2b", "--checkpoint", str(ck), "--status", "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert "--index" not in st["resume"] and st["resume_note"] is None, st
    pg = FileCheckpoint(ck, options={**state["options"], "index": None})  # PostgreSQL's comparison: unchanged
    pg.resolve_options(index="like")
    with pytest.raises(CheckpointMismatchError, match=r"--index 'hnsw' \(this run: None \(default 'like'\)\)"):
        pg.load()
    world["registry"].close()
    rep = _resume_elsewhere(shlex.split(st["resume"]), world, tmp_path, monkeypatch, capsys)
    assert rep["rows"] == N and rep["resumed_from"] is not None, rep
    assert json.loads(ck.read_text())["options"]["index"] is None  # the resume recorded its own options


def test_a_resume_over_http_with_another_keep_set_is_refused_naming_the_requests_field(world):
    """A migration started over HTTP with a ``keep`` set, stopped, then sent again with another set (or none): the
    refusal said "Pass the same --keep-ids / --keep-vectors", flags an HTTP client never sends. It names the
    request's ``keep`` field and "this request"; the CLI's refusal names its flags (test_vectordb_keep). It was a 202
    whose job failed: it is a 409 before a job exists, as a resume with other options is; the same set resumes."""
    from fastapi.testclient import TestClient

    from service.api.app import create_app

    Y = np.random.default_rng(0).normal(size=(3, 16)).astype(np.float32)
    with pytest.raises(MigrationInterrupted):
        _migrate(world, default_checkpoint(world["data"], "src", "dst"), stop=True, keep_ids=[3, 50, 99],
                 keep_vectors=Y, space_option="source_space")
    body = {"source": "src", "target": "dst", "map": "a2b", "batch_size": 40}
    with TestClient(create_app(settings_for(world["tmp"], vectordb_url=world["url"]))) as c:
        msgs = []
        for keep in ({"ids": [3, 50, 99], "vectors": (-Y).tolist()}, None):
            r = c.post("/v1/migrations", json={**body, **({} if keep is None else {"keep": keep})}, headers=W)
            assert r.status_code == 409 and r.json()["error"]["type"] == "CheckpointMismatchError", r.text
            msgs.append(r.json()["error"]["message"])
        assert c.get("/v1/jobs", headers=W).json()["data"] == []  # refused before a job exists
        r = c.post("/v1/migrations", json={**body, "keep": {"ids": [99, 3, 50], "vectors": Y[[2, 0, 1]].tolist()}},
                   headers=W)  # the same set, listed in another order: resumed
        assert r.status_code == 202, r.text
        job = wait_http_job(c, r.json()["id"], headers=W)
        assert job["state"] == "succeeded" and job["result"]["report"]["resumed_from"] is not None, job
    assert "keeping 3 re-embedded rows" in msgs[0] and "; this request keeps 3 (digest " in msgs[0], msgs
    assert "; this request keeps none" in msgs[1], msgs
    for msg in msgs:
        assert "Give the same `keep` (ids and vectors) to resume" in msg and "--" not in msg, msg


def test_the_registry_url_is_recorded_without_its_password_and_the_status_says_how_to_give_it(world):
    """A run on a registry with a password in its URL: the checkpoint records the URL as the project shows URLs
    (``user:***@host``), never the password, the resume command gives it to ``--registry-url``, and the status
    says the password is to be given (PGPASSWORD, or VECBRIDGE_REGISTRY_URL)."""
    ck = world["tmp"] / "pw.json"
    with pytest.raises(MigrationInterrupted):
        _migrate(world, ck, stop=True, registry_url="postgresql://alice:s3cr%40t@db.example:5432/vb")
    assert "s3cr" not in ck.read_text()
    st = checkpoint_status(ck)
    argv = shlex.split(st["resume"])
    assert argv[argv.index("--registry-url") + 1] == "postgresql://alice:***@db.example:5432/vb", argv
    assert argv.index("--registry-url") < argv.index("migrate"), argv  # a group option
    assert "PGPASSWORD" in st["resume_note"] and "VECBRIDGE_REGISTRY_URL" in st["resume_note"], st
    plain = world["tmp"] / "plain.json"
    with pytest.raises(MigrationInterrupted):
        _migrate(world, plain, stop=True, target="dst2")
    st = checkpoint_status(plain)
    assert "--registry-url" not in st["resume"] and st["resume_note"] is None, st


def test_the_http_listing_shows_no_registry_endpoint_in_the_resume_command(world):
    """GET /v1/migrations gave any client with a read key the registry's host, port and user inside the resume
    command (503 bodies and /readyz hide them): there the URL is ``REGISTRY`` and the note says what that is; a SQLite
    file's URL, and the CLI's status, stay as they were."""
    from fastapi.testclient import TestClient

    from service.api.app import create_app

    secret = "postgresql://alice:s3cr%40t@db.example:5432/vb"
    with pytest.raises(MigrationInterrupted):
        _migrate(world, default_checkpoint(world["data"], "src", "dst"), stop=True, registry_url=secret)
    lite = f"sqlite:///{(world['data'] / 'registry.sqlite').resolve()}"
    with pytest.raises(MigrationInterrupted):
        _migrate(world, default_checkpoint(world["data"], "src", "dst2"), stop=True, target="dst2", registry_url=lite)
    with TestClient(create_app(settings_for(world["tmp"], vectordb_url=world["url"]))) as c:
        r = c.get("/v1/migrations", headers=W)
    assert r.status_code == 200, r.text
    by_name = {m["name"]: m for m in r.json()["data"]}
    pg, lite_seen = by_name["src-to-dst"], by_name["src-to-dst2"]
    argv = shlex.split(pg["resume"])
    assert argv[argv.index("--registry-url") + 1] == "REGISTRY" and "db.example" not in r.text, pg
    assert "alice" not in r.text and "REGISTRY" in pg["resume_note"], pg
    argv = shlex.split(lite_seen["resume"])
    assert argv[argv.index("--registry-url") + 1] == lite and lite_seen["resume_note"] is None, lite_seen
    st = checkpoint_status(default_checkpoint(world["data"], "src", "dst"))  # the CLI's --status: the URL, no password
    assert "alice:***@db.example" in st["resume"], st


_CLI = [sys.executable, "-m", "service.cli"]


def test_the_printed_resume_command_of_a_run_on_another_registry_resumes_it_there(world, tmp_path, monkeypatch,
                                                                                    capsys):
    """A ``vecbridge --registry-url sqlite:///data/other.sqlite migrate ...`` stopped by SIGTERM: ``--status``
    printed a resume command without ``--registry-url``; run as shown it looked for the map in the data dir's
    default registry (none there: refused). The command names the run's registry (its path made absolute) and, run
    as printed from another directory, finishes the migration."""
    from service.cli import main

    world["registry"].close()
    data = world["data"]
    other = data / "other.sqlite"
    (data / "registry.sqlite").rename(other)
    reg = f"sqlite:///{other.resolve()}"
    common = ["migrate", "--store", world["url"], "--source", "src", "--target", "dst", "--map", "a2b"]
    _stopped_after_a_batch([*_CLI, "--data-dir", "data", "--registry-url", "sqlite:///data/other.sqlite", *common,
                            "--batch-size", "20", "--pause", "1.0", "--json"], world["tmp"])
    capsys.readouterr()
    assert main(["--data-dir", str(data), "--registry-url", reg, *common, "--status"]) == 0
    line = capsys.readouterr().out.strip()
    assert "not finished, stopped" in line and "; resume: " in line, line
    argv = shlex.split(line.split("; resume: ", 1)[1].replace("--store STORE", "--store " + shlex.quote(world["url"])))
    assert argv[argv.index("--registry-url") + 1] == reg, argv  # the relative path made absolute
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    rc = main([*argv[1:], "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    rep = json.loads(out.out.strip().splitlines()[-1])
    assert rep["rows"] == N and rep["resumed_from"] is not None, rep


def test_the_module_commands_run_records_its_registry_for_the_resume_command(world, capsys):
    """``python -m service.vectordb migrate --registry URL`` stopped by SIGTERM: its status printed a resume command
    naming no registry (the run did not record it, as ``vecbridge migrate`` does), so the command looked for the
    map in the default one. It names the run's registry now, the relative SQLite path made absolute."""

    world["registry"].close()
    other = world["data"] / "other.sqlite"
    (world["data"] / "registry.sqlite").rename(other)
    st = _module_run_status(world, capsys, "sqlite:///data/other.sqlite", "data/artifacts")
    assert st["state"] == "stopped", st
    argv = shlex.split(st["resume"])
    assert argv[argv.index("--registry-url") + 1] == f"sqlite:///{other.resolve()}", argv
    assert argv.index("--registry-url") < argv.index("migrate"), argv


def _stopped_after_a_batch(cmd: list, cwd) -> str:
    """Run the migration ``cmd`` (JSON progress lines) in ``cwd``; SIGTERM it once a batch is written and
    checkpointed, so it stops after the batch in flight (exit 143). Returns its stderr."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "done" in json.loads(read_line(child) or "{}")
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 143, err
    return err

def _resume_elsewhere(argv: list, world, tmp_path, monkeypatch, capsys) -> dict:
    """Run a printed resume command (``argv``, its ``STORE`` given: the CLI's ``--status`` names the store) from a
    directory of its own: its report."""
    from service.cli import main

    if "STORE" in argv:
        argv[argv.index("STORE")] = world["url"]
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    capsys.readouterr()
    rc = main([*argv[1:], "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out.strip().splitlines()[-1])


def _module_run_status(world, capsys, registry: str, artifact_dir: str) -> dict:
    """``python -m service.vectordb migrate`` on ``registry`` / ``artifact_dir``, stopped after a batch: its status."""
    from service.vectordb.__main__ import main as vectordb_main

    _stopped_after_a_batch([sys.executable, "-m", "service.vectordb", "migrate", "--store", world["url"],
                            "--source", "src", "--target", "dst", "--map", "a2b", "--checkpoint", "ck.json",
                            "--registry", registry, "--artifact-dir", artifact_dir,
                            "--batch-size", "20", "--pause", "1.0"], world["tmp"])
    capsys.readouterr()
    assert vectordb_main(["status", "--checkpoint", str(world["tmp"] / "ck.json")]) == 0
    return json.loads(capsys.readouterr().out)



def test_the_resume_command_of_a_run_with_its_own_artifact_folder_finds_the_map_there(world, tmp_path, monkeypatch,
                                                                                       capsys):
    """``python -m service.vectordb migrate --registry URL --artifact-dir DIR`` stopped by SIGTERM: the resume
    command its status printed could not say DIR (``vecbridge`` had no such option, and the run recorded none), so,
    run as printed elsewhere without VECBRIDGE_ARTIFACT_DIR, it looked for the map's file in ./var/artifacts and
    failed. The run records the folder (absolute) and the command gives it to ``vecbridge --artifact-dir``."""

    world["registry"].close()
    (world["data"] / "artifacts").rename(world["tmp"] / "maps")  # the registry's files in a folder of their own
    monkeypatch.delenv("VECBRIDGE_ARTIFACT_DIR", raising=False)
    argv = shlex.split(_module_run_status(world, capsys, "sqlite:///data/registry.sqlite", "maps")["resume"])
    assert argv[argv.index("--artifact-dir") + 1] == str((world["tmp"] / "maps").resolve()), argv
    assert argv.index("--artifact-dir") < argv.index("migrate"), argv  # a group option, as --data-dir
    rep = _resume_elsewhere(argv, world, tmp_path, monkeypatch, capsys)
    assert rep["rows"] == N and rep["resumed_from"] is not None, rep


def test_the_printed_resume_command_gives_the_checkpoint_and_the_map_file_as_absolute_paths(world, tmp_path,
                                                                                           monkeypatch, capsys):
    """``vecbridge migrate --map maps/a2b.safetensors --checkpoint ck.json``, stopped, then ``--status`` in the same
    directory: the resume command gave both paths as typed, so run from another directory it started a new
    checkpoint there (refused: the target exists) with a map it could not find. Both are absolute now, as is the
    checkpoint the stop's line and the report name."""
    from service.cli import main

    (world["tmp"] / "maps").mkdir()
    world["registry"].load_map("a2b").save(world["tmp"] / "maps" / "a2b.safetensors")
    run = [*_CLI, "--data-dir", "data", "migrate", "--store", world["url"], "--source", "src", "--target", "dst",
           "--map", "maps/a2b.safetensors", "--checkpoint", "ck.json"]
    err = _stopped_after_a_batch([*run, "--batch-size", "20", "--pause", "1.0", "--json"], world["tmp"])
    ck = (world["tmp"] / "ck.json").resolve()
    assert f"(checkpoint {ck})" in err, err
    monkeypatch.chdir(world["tmp"])
    capsys.readouterr()
    assert main(["--data-dir", "data", "migrate", "--source", "src", "--target", "dst", "--map", "x",
                 "--checkpoint", "ck.json", "--status", "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["checkpoint"] == str(ck), st
    argv = shlex.split(st["resume"])
    assert argv[argv.index("--checkpoint") + 1] == str(ck), argv
    assert argv[argv.index("--map") + 1] == str((world["tmp"] / "maps" / "a2b.safetensors").resolve()), argv
    rep = _resume_elsewhere(argv, world, tmp_path, monkeypatch, capsys)
    assert rep["rows"] == N and rep["resumed_from"] is not None and rep["checkpoint"] == str(ck), rep


def test_the_module_command_without_artifact_dir_uses_the_settings_folder(world):
    """``python -m service.vectordb migrate --registry URL`` without ``--artifact-dir`` ended with exit 3 and
    ``TypeError: expected str, bytes or os.PathLike object, not NoneType``; it reads the map from the settings'
    artifact folder (VECBRIDGE_ARTIFACT_DIR here) as ``vecbridge`` does."""
    world["registry"].close()
    (world["data"] / "artifacts").rename(world["tmp"] / "maps")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "VECBRIDGE_ARTIFACT_DIR": str(world["tmp"] / "maps")}
    r = subprocess.run([sys.executable, "-m", "service.vectordb", "migrate", "--store", world["url"], "--source",
                        "src", "--target", "dst", "--map", "a2b", "--checkpoint", "ck.json", "--registry",
                        "sqlite:///data/registry.sqlite"], cwd=world["tmp"], env=env, capture_output=True, text=True,
                       timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["report"]["rows"] == N, r.stdout


def test_the_python_api_names_its_own_parameters_in_a_keep_set_refusal(world):
    """``service.vectordb.migrate`` called from Python, resumed with another keep set (or with one only half given,
    or a ``target_space`` the map does not write): the refusal named the CLI's ``--keep-ids / --keep-vectors`` and
    ``--target-space``, which a Python caller never passes. It names the parameters and "this call"; the CLI's
    words stay the CLI's (``run_migration`` from the command line)."""
    from service.vectordb import FileCheckpoint, SpaceMismatchError, migrate

    ids, vecs = np.arange(5), np.random.default_rng(0).standard_normal((5, 16))
    ck = world["tmp"] / "py.json"
    with open_store(world["url"]) as s:
        with pytest.raises(MigrationInterrupted):
            migrate(s, "src", "dst", "a2b", registry=world["registry"], batch_size=40, should_stop=lambda: True,
                    checkpoint=FileCheckpoint(ck), keep_ids=ids, keep_vectors=vecs)
        with pytest.raises(CheckpointMismatchError) as refused:
            migrate(s, "src", "dst", "a2b", registry=world["registry"], checkpoint=FileCheckpoint(ck))
        assert "this call keeps none" in str(refused.value) and "same keep_ids / keep_vectors" in str(refused.value)
        assert "--keep" not in str(refused.value) and "this run" not in str(refused.value), refused.value
        with pytest.raises(InputError, match=r"\(keep_ids / keep_vectors\)$"):
            migrate(s, "src", "dst", "a2b", registry=world["registry"], checkpoint=FileCheckpoint(ck), keep_ids=ids)
        with pytest.raises(SpaceMismatchError, match=r"^target_space says 'c'.*leave target_space out"):
            migrate(s, "src", "dst", "a2b", registry=world["registry"], checkpoint=FileCheckpoint(ck),
                    target_space="c")
    with pytest.raises(CheckpointMismatchError, match=r"this run keeps none.*same --keep-ids / --keep-vectors"):
        _migrate(world, ck)


def test_the_resume_command_of_a_run_that_kept_rows_gives_its_keep_files(world, tmp_path, monkeypatch, capsys):
    """A run given ``--keep-ids ids.json --keep-vectors new.npy``, stopped: the resume command said ``--keep-ids IDS
    --keep-vectors VECTORS``, so it could not be run as printed. It names the run's files (absolute); run as printed
    from another directory it finishes, the kept rows written as given."""

    (world["tmp"] / "ids.json").write_text(json.dumps([3, 50, 100]))
    new = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    np.save(world["tmp"] / "new.npy", new)
    monkeypatch.chdir(world["tmp"])
    ck = world["tmp"] / "keep.json"
    with pytest.raises(MigrationInterrupted):
        _migrate(world, ck, stop=True, keep_ids="ids.json", keep_vectors="new.npy")
    argv = shlex.split(checkpoint_status(ck)["resume"])
    assert argv[argv.index("--keep-ids") + 1] == str(world["tmp"] / "ids.json"), argv
    assert argv[argv.index("--keep-vectors") + 1] == str(world["tmp"] / "new.npy"), argv
    world["registry"].close()
    rep = _resume_elsewhere(argv, world, tmp_path, monkeypatch, capsys)
    assert rep["rows"] == N and rep["resumed_from"] is not None and rep["kept"] == 3, rep


def _stopped_on_own_folder(world, tmp_path) -> tuple[Path, list]:
    """A run through ``a2b`` whose registry's files are in ``tmp_path/maps`` (``vecbridge --artifact-dir``), stopped
    after a batch; ``(checkpoint, its printed resume command as argv with the store's URL)``."""
    world["registry"].close()
    maps = tmp_path / "maps"
    (world["data"] / "artifacts").rename(maps)
    world["registry"] = open_registry(f"sqlite:///{(world['data'] / 'registry.sqlite').resolve()}", maps.resolve())
    ck = tmp_path / "ck.json"
    with pytest.raises(MigrationInterrupted):
        _migrate(world, ck, stop=True, artifact_dir=maps)
    world["registry"].close()
    argv = shlex.split(checkpoint_status(ck)["resume"])
    argv[argv.index("STORE")] = world["url"]
    return ck, argv


def test_a_resume_whose_artifact_folder_moved_names_the_folder_and_creates_none(world, tmp_path, monkeypatch,
                                                                                  capsys):
    """A stopped run's artifact folder moved, then its printed resume command run: exit 2, "artifact 59/59d8...
    safetensors is missing or unreadable", naming neither the folder it read nor how to name another, and an empty
    folder (with tmp/) made at the old place. The refusal names the folder and --artifact-dir, makes nothing; the
    command with the new place finishes the run."""
    from service.cli import main

    monkeypatch.delenv("VECBRIDGE_ARTIFACT_DIR", raising=False)
    _, argv = _stopped_on_own_folder(world, tmp_path)
    old = Path(argv[argv.index("--artifact-dir") + 1])
    old.rename(tmp_path / "moved")
    assert main([*argv[1:], "--json"]) == 2
    err = capsys.readouterr().err
    assert str(old) in err and "--artifact-dir" in err and "VECBRIDGE_ARTIFACT_DIR" in err, err
    assert not old.exists()  # nothing made at the folder's old place
    argv[argv.index("--artifact-dir") + 1] = str(tmp_path / "moved")
    assert main([*argv[1:], "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"] == N


def test_a_map_file_missing_from_the_artifact_folder_names_the_folder_read(world, tmp_path, monkeypatch, capsys):
    """The resume given a folder that exists but lacks the map's file (another folder, or one an earlier resume made
    empty): the error named the file only. It names the folder it read and how to name another."""
    from service.cli import main

    monkeypatch.delenv("VECBRIDGE_ARTIFACT_DIR", raising=False)
    _, argv = _stopped_on_own_folder(world, tmp_path)
    (tmp_path / "empty").mkdir()
    argv[argv.index("--artifact-dir") + 1] = str(tmp_path / "empty")
    assert main([*argv[1:], "--json"]) == 2
    err = capsys.readouterr().err
    assert "is missing or unreadable" in err and f"artifact folder {(tmp_path / 'empty').resolve()}" in err, err
    assert "--artifact-dir" in err, err


def test_a_run_on_the_data_dirs_own_artifact_folder_records_none_that_an_older_release_would_refuse(
        world, tmp_path, monkeypatch, capsys):
    """A checkpoint written by a run on the data dir's own artifact folder recorded it (``artifact_dir``), and a
    release before ``--artifact-dir`` (which compares every option it does not know) refused to resume it: replicas
    of two releases on one data dir during an upgrade. The data dir's own folder is recorded as None (what that
    release compares as equal to its unset option); the resume command still names the folder and resumes the run,
    even where VECBRIDGE_ARTIFACT_DIR names another."""
    from service.cli import main
    from service.vectordb import FileCheckpoint

    ck = tmp_path / "ck.json"
    with pytest.raises(MigrationInterrupted):
        _migrate(world, ck, stop=True, artifact_dir=world["data"] / "artifacts")
    world["registry"].close()
    recorded = json.loads(ck.read_text())["options"]
    assert recorded["artifact_dir"] is None and recorded["data_dir"] == str(world["data"].resolve()), recorded

    class PreviousRelease(FileCheckpoint):  # its options and the places it does not compare
        WHERE = frozenset({"data_dir", "registry_url"})

    before = {k: v for k, v in recorded.items() if k != "artifact_dir"}
    assert PreviousRelease(ck, options=before).load()["last_id"] == 39  # not refused
    argv = shlex.split(checkpoint_status(ck)["resume"])
    assert argv[argv.index("--artifact-dir") + 1] == str(world["data"].resolve() / "artifacts"), argv
    argv[argv.index("STORE")] = world["url"]
    (tmp_path / "other").mkdir()
    monkeypatch.setenv("VECBRIDGE_ARTIFACT_DIR", str(tmp_path / "other"))
    assert main([*argv[1:], "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"] == N


def test_the_http_jobs_checkpoint_is_absolute_as_the_listing_shows_it(world, monkeypatch):
    """A server whose data dir is relative: the migration job's result gave ``checkpoint`` relative
    (``data/migrations/src-to-dst.json``) while GET /v1/migrations gave it absolute. Both are absolute, the same."""
    from fastapi.testclient import TestClient

    from service.api.app import create_app

    world["registry"].close()
    monkeypatch.chdir(world["tmp"])
    with TestClient(create_app(settings_for(Path("."), vectordb_url=world["url"]))) as c:
        r = c.post("/v1/migrations", json={"source": "src", "target": "dst", "map": "a2b", "batch_size": 40},
                   headers=W)
        assert r.status_code == 202, r.text
        job = wait_http_job(c, r.json()["id"], headers=W)
        listed = c.get("/v1/migrations", headers=W).json()["data"]
    assert job["state"] == "succeeded", job
    got = job["result"]["checkpoint"]
    assert Path(got).is_absolute() and got == listed[0]["checkpoint"], (got, listed)
    assert got == str(default_checkpoint(world["data"].resolve(), "src", "dst")), got


def test_the_status_resume_command_names_the_store_it_was_given_with_its_password_hidden(world):
    """QA (session 55): ``migrate --status --store URL`` printed a resume command with a literal ``--store STORE``,
    a word to replace by hand. Given the store (``store_in_command``, as the CLI's ``--status``), the command names
    it, a password as ``***`` with a note on how to give it; without one (HTTP, which hides a server's endpoints),
    ``STORE``."""
    ck = world["tmp"] / "run.json"
    with pytest.raises(MigrationInterrupted):
        _migrate(world, ck, stop=True)
    argv = shlex.split(checkpoint_status(ck, world["url"], store_in_command=True)["resume"])
    assert argv[argv.index("--store") + 1] == world["url"] and "STORE" not in argv, argv
    st = checkpoint_status(ck, "postgresql://vb:s3cr3t@db:5432/vb", store_in_command=True)
    argv = shlex.split(st["resume"])
    assert argv[argv.index("--store") + 1] == "postgresql://vb:***@db:5432/vb" and "s3cr3t" not in st["resume"], argv
    assert "store URL's password is not shown (***)" in st["resume_note"] and "s3cr3t" not in st["resume_note"], st
    assert "--store STORE " in checkpoint_status(ck, world["url"])["resume"]  # HTTP's: the server's store hidden
