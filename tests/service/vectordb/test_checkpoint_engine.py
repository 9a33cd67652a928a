"""A migration's checkpoint records the engine it ran on (``milvus``, ``pgvector``, ``qdrant``).

It did not: ``migrate --status`` and ``GET /v1/migrations`` could tell a PostgreSQL run's ``--index hnsw`` (a real
option, kept in the resume command) from an older release's ignored one on Milvus / Qdrant (left out) only when the
caller named the store; without it the command kept the index and a note asked the reader to judge. The recorded
engine answers that without the caller's store, a checkpoint of an older release gets one when it is resumed, and a
checkpoint of another engine's run (the default checkpoint is named by collections only) is refused as such."""

from __future__ import annotations

import json
import shlex

import numpy as np
import pytest
from _api_support import W, settings_for
from _vectordb_servers import (  # noqa: F401  (pg_url: module-scoped fixture)
    migrate_world, pg_url, qdrant_migration_world, rewrite_checkpoint, small_migration)

from service.ops.vectordb import checkpoint_status, default_checkpoint, run_migration
from service.vectordb import CheckpointMismatchError, MigrationInterrupted, open_store

pytest.importorskip("qdrant_client")

N = 120


@pytest.fixture
def world(tmp_path):
    """A registry (spaces a, b; map a2b) in ``data`` and a local Qdrant folder holding ``src`` (N rows, space a)."""
    with qdrant_migration_world(tmp_path, n=N) as w:
        yield w


_migrate = migrate_world
_rewritten = rewrite_checkpoint


def test_a_run_records_its_engine_and_the_status_and_listing_show_it(world):
    ck = default_checkpoint(world["data"], "src", "dst")
    with pytest.raises(MigrationInterrupted):
        _migrate(world, ck, stop=True, space_option="source_space")
    assert json.loads(ck.read_text())["engine"] == "qdrant"
    assert checkpoint_status(ck)["engine"] == "qdrant"  # no store given: the checkpoint says it
    from fastapi.testclient import TestClient

    from service.api.app import create_app

    with TestClient(create_app(settings_for(world["tmp"], vectordb_url=world["url"]))) as c:
        listed = c.get("/v1/migrations", headers=W).json()["data"]
    assert [m["engine"] for m in listed] == ["qdrant"], listed


def test_the_plain_status_line_names_the_engine(world, capsys):
    """Review: README says the engine is in ``--status``, but only ``--status --json`` showed it."""
    from service.cli import main

    ck = world["tmp"] / "run.json"
    with pytest.raises(MigrationInterrupted):
        _migrate(world, ck, stop=True)
    capsys.readouterr()
    assert main(["--data-dir", str(world["data"]), "migrate", "--source", "src", "--target", "dst", "--map", "a2b",
                 "--checkpoint", str(ck), "--status"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"src -> dst on qdrant: 40/{N} rows"), line
    _rewritten(ck, engine=None)  # an older release's checkpoint: no engine to name
    assert main(["--data-dir", str(world["data"]), "migrate", "--source", "src", "--target", "dst", "--map", "a2b",
                 "--checkpoint", str(ck), "--status"]) == 0
    assert capsys.readouterr().out.startswith(f"src -> dst: 40/{N} rows")


@pytest.mark.parametrize(("engine", "kept", "noted"), [("pgvector", True, False), ("qdrant", False, False),
                                                       ("milvus", False, False), (None, True, True)])
def test_the_resume_command_reads_the_recorded_engine_where_no_store_is_given(world, engine, kept, noted):
    """A stopped run whose checkpoint records ``index: hnsw``, read with no store known: a PostgreSQL run's command
    keeps ``--index hnsw`` with no note (it is that target's option; the note told the reader to leave it out on
    Milvus or Qdrant), a Milvus or Qdrant run's (an older release's option, resumed since) leaves it out. A checkpoint
    that records no engine reads as before: kept, with the note."""
    ck = world["tmp"] / "run.json"
    with pytest.raises(MigrationInterrupted):
        _migrate(world, ck, stop=True)
    state = _rewritten(ck, engine=engine)
    state["options"]["index"] = "hnsw"
    ck.write_text(json.dumps(state))
    st = checkpoint_status(ck)
    assert st["engine"] == engine
    argv = shlex.split(st["resume"])
    assert (argv[argv.index("--index") + 1] == "hnsw") if kept else "--index" not in argv, argv
    assert ("--index hnsw is for a PostgreSQL STORE" in (st["resume_note"] or "")) == noted, st
    if engine is not None:  # the recorded engine wins over a store the caller names (another one, misnamed)
        other = "postgresql://h/db" if engine != "pgvector" else world["url"]
        assert shlex.split(checkpoint_status(ck, other)["resume"]) == argv


def test_a_checkpoint_of_an_older_release_records_its_engine_once_resumed(world):
    ck = world["tmp"] / "old.json"
    with pytest.raises(MigrationInterrupted):
        _migrate(world, ck, stop=True)
    _rewritten(ck, engine=None)
    assert checkpoint_status(ck)["engine"] is None
    with pytest.raises(MigrationInterrupted):
        _migrate(world, ck, stop=True)
    state = json.loads(ck.read_text())
    assert state["engine"] == "qdrant" and state["done"] == 80, state
    assert _migrate(world, ck).rows == N


def test_a_checkpoint_of_a_run_on_another_engine_is_refused_naming_both(world):
    """The default checkpoint is named by collections only: a run of the same names on another database was taken
    for this one's (refused only if the target was missing here; resumed into a same-named one). The engines tell."""
    ck = world["tmp"] / "run.json"
    with pytest.raises(MigrationInterrupted):
        _migrate(world, ck, stop=True)
    _rewritten(ck, engine="milvus")
    before = ck.read_text()
    with pytest.raises(CheckpointMismatchError, match="checkpoint records a migration on milvus, and this store is "
                                                      "qdrant.*pass --checkpoint FILE for this one"):
        _migrate(world, ck)
    assert ck.read_text() == before
    with pytest.raises(CheckpointMismatchError, match="on milvus.*migrate into another target name"):
        _migrate(world, ck, space_option="source_space")  # an HTTP job's words: no CLI flag


def test_a_request_resuming_a_checkpoint_of_another_engine_is_a_409_naming_it_and_no_job(world):
    """Review: over HTTP the engine was compared only inside the job (202, then a failed job), and a keep set given
    with the request was compared first (409 naming ``keep``, the engine unsaid). The request compares the engine
    before the options and the keep set: 409 naming both engines in the request's words, no job queued."""
    from fastapi.testclient import TestClient

    from service.api.app import create_app

    ck = default_checkpoint(world["data"], "src", "dst")
    with pytest.raises(MigrationInterrupted):
        _migrate(world, ck, stop=True, space_option="source_space")
    _rewritten(ck, engine="pgvector")
    before = ck.read_text()
    keep = {"ids": [0], "vectors": [[0.25] * 16]}  # a keep set the checkpoint was written without
    with TestClient(create_app(settings_for(world["tmp"], vectordb_url=world["url"]))) as c:
        for extra in ({}, {"keep": keep}):
            r = c.post("/v1/migrations", json={"map": "a2b", "source": "src", "target": "dst", **extra}, headers=W)
            assert r.status_code == 409 and r.json()["error"]["type"] == "CheckpointMismatchError", (extra, r.text)
            msg = r.json()["error"]["message"]
            assert "checkpoint records a migration on pgvector, and this store is qdrant" in msg, msg
            assert "migrate into another target name" in msg and "--checkpoint" not in msg, msg
        assert c.get("/v1/jobs", headers=W).json()["data"] == []
    assert ck.read_text() == before


def test_a_postgresql_runs_status_keeps_its_index_without_a_store_given(pg_url, tmp_path):  # noqa: F811
    """A real pgvector run given ``--index hnsw``, stopped: read with no store named (``--status`` without
    ``--store`` or VECBRIDGE_VECTORDB_URL), its resume command gave ``--index hnsw`` with a note telling the reader to
    leave it out on Milvus or Qdrant. The checkpoint says the run is PostgreSQL's: the option stays, no note."""
    X, m = small_migration()
    m.save(tmp_path / "m.safetensors")
    with open_store(pg_url) as s:
        s.drop("eng_src"), s.drop("eng_dst")
        s.create("eng_src", X.shape[1])
        s.upsert("eng_src", np.arange(len(X)), X)
    ck = tmp_path / "pg.json"
    with pytest.raises(MigrationInterrupted):
        run_migration(store_url=pg_url, source="eng_src", target="eng_dst", map_ref=str(tmp_path / "m.safetensors"),
                      checkpoint=ck, index="hnsw", batch_size=50, cancelled=lambda: True)
    st = checkpoint_status(ck)
    argv = shlex.split(st["resume"])
    assert st["engine"] == "pgvector" and argv[argv.index("--index") + 1] == "hnsw", st
    assert st["resume_note"] is None, st
    with open_store(pg_url) as s:
        s.drop("eng_src"), s.drop("eng_dst")
