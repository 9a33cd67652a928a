"""The lock file of a migration's checkpoint: one run at a time, and no ``<checkpoint>.lock`` left behind."""

from __future__ import annotations

import fcntl
import os
import sys
import threading
import time

import pytest
from _vectordb_servers import small_migration

from service.vectordb import (
    CheckpointMismatchError,
    FileCheckpoint,
    MigrationRunningError,
    migrate,
)
from service.vectordb import checkpoint as checkpoint_module


def test_a_migration_leaves_its_checkpoint_and_no_lock_file(tmp_path):
    """``vecbridge migrate`` left ``migrations/<src>-to-<tgt>.json.lock`` for ever beside each checkpoint: 50
    migrations, 50 empty lock files. The checkpoint stays (``--status`` reads it); the lock file goes with its run."""
    pytest.importorskip("qdrant_client")
    from service.vectordb import QdrantStore

    X, m = small_migration()
    store = QdrantStore(path=":memory:")
    try:
        store.create("src", 24)
        store.upsert("src", list(range(200)), X, None)
        ck = FileCheckpoint(tmp_path / "src-to-dst.json")
        assert migrate(store, "src", "dst", m, batch_size=64, checkpoint=ck).rows == 200
    finally:
        store.close()
    assert ck.load()["done"] == 200
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src-to-dst.json"]


def test_a_second_run_is_refused_while_the_first_holds_the_lock_and_runs_after_it(tmp_path):
    first, second = FileCheckpoint(tmp_path / "m.json"), FileCheckpoint(tmp_path / "m.json")
    with first.lock():
        assert (tmp_path / "m.json.lock").read_text() == str(os.getpid())
        with pytest.raises(MigrationRunningError, match=r"another run of this migration is writing now \(pid "), \
                second.lock():
            pass
        assert (tmp_path / "m.json.lock").exists()  # the refused run removed nothing
    assert not (tmp_path / "m.json.lock").exists()
    with second.lock():
        pass
    assert not (tmp_path / "m.json.lock").exists()


def test_a_run_that_opened_the_lock_file_its_holder_then_removed_never_runs_beside_the_next(tmp_path, monkeypatch):
    """Removing a lock file breaks ``flock`` where a run opened the file before its holder removed it and locks it
    after: it holds a file no longer at the path, while the next run makes a new file there and locks that one, and
    both write. The run that finds its file gone locks the one at the path instead: refused while the next runs."""
    opened, go = threading.Event(), threading.Event()

    class _Fcntl:  # fcntl itself, but the thread named "late" stops between opening the lock file and locking it
        LOCK_EX, LOCK_NB = fcntl.LOCK_EX, fcntl.LOCK_NB

        @staticmethod
        def flock(fd, op):
            if threading.current_thread().name == "late" and not opened.is_set():
                opened.set()
                assert go.wait(10)
            return fcntl.flock(fd, op)

    monkeypatch.setattr(checkpoint_module, "fcntl", _Fcntl)
    ck = tmp_path / "m.json"
    outcome = {}

    def late():
        try:
            with FileCheckpoint(ck).lock():
                outcome["late"] = "ran"
        except MigrationRunningError as exc:
            outcome["late"] = exc

    first = FileCheckpoint(ck).lock()
    first.__enter__()
    thread = threading.Thread(target=late, name="late")
    thread.start()
    try:
        assert opened.wait(10)  # "late" has the first run's lock file open
    finally:
        first.__exit__(None, None, None)  # the first run ends (and removes its file)
    with FileCheckpoint(ck).lock():  # the next run starts
        go.set()  # ... and "late" locks the file it opened
        thread.join(10)
        assert isinstance(outcome.get("late"), MigrationRunningError), outcome
    assert not (tmp_path / "m.json.lock").exists()


def test_a_status_probe_tells_a_held_lock_from_a_free_one_and_never_makes_a_run_refused(tmp_path):
    """``migrate --status`` asks the run's lock (its pid means nothing from another pid namespace): held, free
    (a killed run leaves its file, unlocked), or no file. The probe never waits, and a run that starts while a
    probe holds the lock for its moment is not refused as if another run wrote: 300 runs start while status
    probes go on without a pause in another thread, and every one gets the lock."""
    ck = FileCheckpoint(tmp_path / "m.json")
    assert ck.lock_held() is None  # no lock file: no run started, or it ended
    with ck.lock():
        assert FileCheckpoint(tmp_path / "m.json").lock_held() is True  # at once: a blocking probe would hang
    (tmp_path / "m.json.lock").write_text("12345")  # what a run killed with kill -9 leaves
    assert ck.lock_held() is False

    stop, seen = threading.Event(), set()

    def probe():
        while not stop.is_set():
            seen.add(FileCheckpoint(tmp_path / "m.json").lock_held())

    thread = threading.Thread(target=probe)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the threads take turns often: the runs start while a probe holds the lock
    thread.start()
    try:
        for _ in range(300):
            with FileCheckpoint(tmp_path / "m.json").lock():
                time.sleep(0.001)  # the probing thread runs meanwhile (it has the GIL)
    finally:
        stop.set()
        thread.join(10)
        sys.setswitchinterval(switch)
    assert True in seen  # the probes did meet the runs' lock


def test_a_resume_may_add_what_the_run_left_unset_but_not_drop_or_change_what_it_recorded(tmp_path):
    """The options a checkpoint's unfinished run recorded: a resume giving another field name, or dropping its
    alias, is refused naming each (it finished without switching the alias); one adding an alias or a space the run
    left unset goes on, not one adding an index (unset means like, which the run may have built); a finished run's
    rerun (nothing to write) and a status read are not judged."""
    path = tmp_path / "run.json"
    first = {"alias": "live", "index": None, "id_field": None, "source_space": None, "data_dir": "/a"}
    FileCheckpoint(path, options=first).save({"source": "a", "target": "b", "map_fingerprint": "f", "last_id": 3,
                                              "finished": False})
    assert FileCheckpoint(path, options={**first, "data_dir": "/b", "source_space": "s"}).load()
    with pytest.raises(CheckpointMismatchError, match=r"--index None \(this run: 'hnsw'\)"):
        FileCheckpoint(path, options={**first, "index": "hnsw"}).load()
    with pytest.raises(CheckpointMismatchError, match=r"--alias 'live' \(this run: None\)"):
        FileCheckpoint(path, options={**first, "alias": None}).load()
    with pytest.raises(CheckpointMismatchError, match=r"--id-field None \(this run: 'pk'\)"):
        FileCheckpoint(path, options={**first, "id_field": "pk"}).load()
    assert FileCheckpoint(path).load()["last_id"] == 3  # a status read
    state = FileCheckpoint(path).load()
    FileCheckpoint(path).save({**state, "finished": True})
    assert FileCheckpoint(path, options={**first, "alias": None}).load()["finished"]
