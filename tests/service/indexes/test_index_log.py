"""Index writes as a snapshot plus a log (``service.indexes.persist``).

Before, every add or delete wrote the whole index again (``index.<g>.faiss`` + all payloads): one row added
to an index of a million 384-d rows rewrote ~1.5 GB, and every other process (``--workers 2``, replicas on
one data dir) read all of it back. Now a small change writes ``delta.<g>.npz`` (its own rows only) and other
processes replay it onto what they hold; a snapshot is written when the log would pass a quarter of the
snapshot's rows (at least 1,024 rows, at most 64 files). What must hold, checked here on every kind:

* the index a process gets by replaying the log is the very index the writer holds (same FAISS bytes,
  payloads, tombstones), also for HNSW, whose levels FAISS draws from a generator it does not store;
* a reader that holds an older generation of the same snapshot catches up by reading only the deltas;
* the log is bounded (compaction into a snapshot), old files are collected, and a process reading an older
  meta finds its files;
* an index written before the log (format 2) loads and takes deltas after it.
"""

from __future__ import annotations

import json

import faiss
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.indexes import IndexStore
from service.indexes.kinds import add_rows, add_seed, hnsw_chunk
from service.indexes.persist import (
    LOG_MAX_FILES,
    LOG_MIN_ROWS,
    SEEDED_LOG,
    Delta,
    write_generation,
)

DIM = 12


def _rows(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def _params(kind: str) -> dict:
    return {"ivf": {"nlist": 4, "nprobe": 4}, "hnsw": {"M": 8, "ef_construction": 20}}.get(kind, {})


def _state(idx) -> tuple:
    """What a process holds: the FAISS index, payloads, HNSW tombstones, next free id.

    Flat and HNSW: the index's bytes. IVF: each list's ids and codes in order, and the row each id
    reconstructs to (FAISS writes IVF's id -> place hash table in its hashing order, which differs between
    equal tables built in different orders, so the file bytes do not compare).
    """
    if idx.kind != "ivf":
        faiss_state = faiss.serialize_index(idx.index).tobytes()
    else:
        inv = idx.index.invlists
        lists = []
        for li in range(idx.index.nlist):
            n = inv.list_size(li)
            ids = faiss.rev_swig_ptr(inv.get_ids(li), n).tobytes() if n else b""
            codes = faiss.rev_swig_ptr(inv.get_codes(li), n * inv.code_size).tobytes() if n else b""
            lists.append((ids, codes))
        live = np.sort(idx._live_ids())
        rows = np.stack([idx.index.reconstruct(int(i)) for i in live]) if live.size else None
        faiss_state = (lists, live.tobytes(), None if rows is None else rows.tobytes())
    return faiss_state, dict(idx.payloads), sorted(idx.tombstones), idx.next_id


def _files(path, prefix: str) -> list[int]:
    return sorted(int(p.name.split(".")[1]) for p in path.glob(f"{prefix}.*.*"))


def test_a_small_add_writes_its_rows_not_the_index(tmp_path):
    store = IndexStore(tmp_path)
    idx = store.create("docs", "s", _rows(0, 20_000))  # 20k x 12 floats: ~1 MB of FAISS file
    snapshot = (tmp_path / "docs" / "index.1.faiss").stat().st_size
    idx.add(_rows(1, 3), payloads=[{"t": "a"}, None, {"t": "c"}])
    assert _files(tmp_path / "docs", "index") == [1] and _files(tmp_path / "docs", "delta") == [2]
    delta = (tmp_path / "docs" / "delta.2.npz").stat().st_size
    assert delta < 2_000 < snapshot / 100, (delta, snapshot)
    meta = json.loads((tmp_path / "docs" / "meta.json").read_text())
    assert (meta["generation"], meta["base"], meta["log"], meta["format_version"]) == (2, 1, [[2, 3]], 3)
    fresh = IndexStore(tmp_path).get("docs")  # a process starting now: snapshot + log
    assert fresh.count == 20_003 and fresh.payloads[20_000] == {"t": "a"} and 20_001 not in fresh.payloads
    assert _state(fresh) == _state(idx)
    info = fresh.info().to_dict()  # what GET /v1/indexes/{name} and `vecbridge index show` answer
    assert (info["generation"], info["logged_deltas"]) == (2, 1)
    from service.api.schemas import IndexOut

    assert {"generation", "logged_deltas"} <= set(IndexOut.model_fields)


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_a_reader_replays_only_the_new_deltas_and_gets_the_writers_index(kind, tmp_path):
    writer, reader = IndexStore(tmp_path), IndexStore(tmp_path)  # two processes of one data dir
    w = writer.create("docs", "s", _rows(0, 400), kind=kind, params=_params(kind))
    r = reader.get("docs")
    faiss_object = r.index
    w.add(_rows(1, 30), payloads=[{"i": i} for i in range(30)])
    w.delete([3, 5, 401])
    w.add(_rows(2, 10), ids=list(range(5000, 5010)))
    r = reader.get("docs")
    assert r.index is faiss_object, "the reader loaded the whole index instead of replaying the deltas"
    assert r.generation == w.generation == 4
    assert _state(r) == _state(w)
    assert _state(IndexStore(tmp_path).get("docs")) == _state(w)  # and a process reading it all
    Q = _rows(3, 5)
    for exact in (True, False):
        np.testing.assert_array_equal(r.search(Q, 10, exact=exact)[1], w.search(Q, 10, exact=exact)[1])


def test_a_logged_hnsw_add_of_several_chunks_replays_to_the_writers_graph(tmp_path):
    """The writer inserts a large HNSW add chunk by chunk (searches run between chunks); FAISS orders each call's
    rows by level, so the chunks shape the graph: a replay cuts the same ones and gets the same bytes."""
    writer, reader = IndexStore(tmp_path), IndexStore(tmp_path)
    w = writer.create("docs", "s", _rows(0, 20_000), kind="hnsw", params=_params("hnsw"))
    reader.get("docs")
    n = hnsw_chunk(DIM) + 904  # two chunks, logged (a quarter of 20,000 rows fits)
    w.add(_rows(1, n), payloads=[{"i": i} for i in range(n)])
    assert json.loads((tmp_path / "docs" / "meta.json").read_text())["log"] == [[2, n]]
    assert _state(reader.get("docs")) == _state(w)
    assert _state(IndexStore(tmp_path).get("docs")) == _state(w)


def _levels(idx) -> np.ndarray:
    """The level FAISS drew for each row of an HNSW index (from its seeded generator)."""
    return faiss.vector_to_array(faiss.downcast_index(idx.index.index).hnsw.levels)


def test_an_hnsw_index_is_built_and_logged_with_its_own_seed(tmp_path):
    """The seed was recorded but never used: the build drew levels from FAISS's constant start and a logged add
    from its generation alone, so seeds 0 and 7 gave the same graph (the same hits at a small ef_search)."""
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)  # links inserted in parallel depend on thread timing (a snapshot carries them)
    try:
        X, Q, params = _rows(0, 2000), _rows(9, 200), {"M": 4, "ef_construction": 8, "ef_search": 4}
        built = {(seed, copy): IndexStore(tmp_path / f"{seed}-{copy}").create(
            "docs", "s", X, kind="hnsw", params=params, random_state=seed) for seed in (0, 7) for copy in (0, 1)}
        hits = {key: idx.search(Q, 5)[1] for key, idx in built.items()}
        np.testing.assert_array_equal(hits[0, 0], hits[0, 1])  # the same seed: the same graph
        np.testing.assert_array_equal(_levels(built[7, 0]), _levels(built[7, 1]))
        assert not np.array_equal(_levels(built[0, 0]), _levels(built[7, 0]))
        assert not np.array_equal(hits[0, 0], hits[7, 0])
        for idx in (built[0, 0], built[7, 0]):  # logged adds: seeded from (seed, generation), replayed alike
            idx.add(_rows(1, 300))
            assert idx.logged_deltas == 1 and _state(IndexStore(idx.path.parent).get("docs")) == _state(idx)
        assert not np.array_equal(_levels(built[0, 0])[-300:], _levels(built[7, 0])[-300:])
    finally:
        faiss.omp_set_num_threads(threads)
    assert [add_seed(0, g) for g in (1, 2, 99)] == [1, 2, 99]  # deltas logged before the seed took part replay so


def test_a_log_an_earlier_release_wrote_replays_with_the_seeds_it_was_written_with(tmp_path):
    """Releases before the index's seed took part seeded a logged HNSW add with its generation alone. After the
    upgrade the delta of an index of theirs with seed 7 was replayed with add_seed(7, g): a restart or a new replica
    built another graph than the writer held. Their metas lack SEEDED_LOG: such a log replays, and takes adds, with
    the generation (as their processes replay it) until this release writes a snapshot, which starts a seeded log."""
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        path, params = tmp_path / "docs", {"M": 4, "ef_construction": 8, "ef_search": 4}
        IndexStore(tmp_path).create("docs", "s", _rows(0, 2000), kind="hnsw", metric="ip", params=params,
                                    random_state=7)
        meta = json.loads((path / "meta.json").read_text())
        del meta[SEEDED_LOG]  # the meta as an earlier release wrote it, and its logged add of 300 rows:
        writer, X, ids = faiss.read_index(str(path / "index.1.faiss")), _rows(1, 300), np.arange(2000, 2300)
        add_rows(writer, "hnsw", X, ids, seed=2)
        meta.update(generation=2, log=[[2, 300]], next_id=2300)
        write_generation(path, writer, {}, meta, Delta(2, "add", ids, X))
        idx = IndexStore(tmp_path).get("docs")  # a restart after the upgrade
        assert faiss.serialize_index(idx.index).tobytes() == faiss.serialize_index(writer).tobytes()
        add_rows(writer, "hnsw", _rows(2, 300), np.arange(2300, 2600), seed=3)  # an earlier release's replay
        idx.add(_rows(2, 300))  # an add after the upgrade: seeded as that release seeds and replays it
        assert idx.logged_deltas == 2 and json.loads((path / "meta.json").read_text())[SEEDED_LOG] is False
        assert faiss.serialize_index(idx.index).tobytes() == faiss.serialize_index(writer).tobytes()
        assert _state(IndexStore(tmp_path).get("docs")) == _state(idx)
        idx.save()  # a snapshot of this release: its log is seeded from the index's seed
        writer = faiss.read_index(str(path / f"index.{idx.generation}.faiss"))
        add_rows(writer, "hnsw", _rows(3, 300), np.arange(2600, 2900), seed=add_seed(7, idx.generation + 1))
        idx.add(_rows(3, 300))
        assert json.loads((path / "meta.json").read_text())[SEEDED_LOG] is True and idx.logged_deltas == 1
        assert faiss.serialize_index(idx.index).tobytes() == faiss.serialize_index(writer).tobytes()
        assert _state(IndexStore(tmp_path).get("docs")) == _state(idx)
    finally:
        faiss.omp_set_num_threads(threads)


def test_the_log_is_compacted_into_a_snapshot(tmp_path):
    store = IndexStore(tmp_path)
    idx = store.create("docs", "s", _rows(0, 100))
    idx.add(_rows(1, LOG_MIN_ROWS - 1))  # fits: at least LOG_MIN_ROWS rows may be logged
    assert _files(tmp_path / "docs", "delta") == [2]
    idx.add(_rows(2, 2))  # would pass the bound: a snapshot, and the log starts again
    meta = json.loads((tmp_path / "docs" / "meta.json").read_text())
    assert (meta["base"], meta["log"], meta["base_rows"]) == (3, [], 100 + LOG_MIN_ROWS + 1)
    for i in range(LOG_MAX_FILES + 1):  # many tiny adds: at most LOG_MAX_FILES deltas to replay
        idx.add(_rows(10 + i, 1))
    meta = json.loads((tmp_path / "docs" / "meta.json").read_text())
    assert len(meta["log"]) <= LOG_MAX_FILES and meta["base"] > 3
    assert IndexStore(tmp_path).get("docs").count == idx.count == 100 + LOG_MIN_ROWS + 1 + LOG_MAX_FILES + 1


def test_files_of_the_last_three_metas_stay_and_older_ones_go(tmp_path):
    store = IndexStore(tmp_path)
    idx = store.create("docs", "s", _rows(0, 100))
    metas = []
    for i in range(12):
        idx.add(_rows(1 + i, 400 if i % 4 == 3 else 1))  # every fourth add is large: a snapshot
        metas.append(json.loads((tmp_path / "docs" / "meta.json").read_text()))
    for meta in metas[-3:]:  # a reader that read one of these metas and is still loading finds its files
        base = meta["base"]
        assert (tmp_path / "docs" / f"index.{base}.faiss").exists()
        assert all((tmp_path / "docs" / f"delta.{g}.npz").exists() for g, _ in meta["log"])
    oldest = min(m["base"] for m in metas[-3:])
    assert min(_files(tmp_path / "docs", "index")) == oldest
    assert all(g > oldest for g in _files(tmp_path / "docs", "delta"))


_KILLED_COMPACT = r"""
import os, signal, sys
from pathlib import Path
import service.indexes.persist as P
def die(*a, **k):  # the snapshot's files written, killed before the meta names them
    os.kill(os.getpid(), signal.SIGKILL)
P._write_meta = die
from service.indexes import IndexStore
IndexStore(Path(sys.argv[1])).get("docs").save()  # what `vecbridge index compact docs` does
"""


def test_the_files_of_a_generation_never_committed_are_collected(tmp_path):
    """A writer killed after writing a snapshot's files but before its meta (``index compact``, a snapshot-sized add)
    left ``index.<g>.faiss`` and ``payloads.<g>.json``, a whole copy of the index, that no meta names. The
    collection removed only files older than the oldest kept snapshot: with the log going on (later generations
    are deltas on the older snapshot) each killed snapshot stayed until the next snapshot and two metas after it."""
    import subprocess
    import sys

    store = IndexStore(tmp_path)
    idx = store.create("docs", "s", _rows(0, 300))
    idx.add(_rows(1, 2))  # logged: the compact below has a log to fold
    for i in range(3):
        r = subprocess.run([sys.executable, "-c", _KILLED_COMPACT, str(tmp_path)], capture_output=True, check=False)
        assert r.returncode == -9, r.stderr
        assert max(_files(tmp_path / "docs", "index")) == idx.generation + 1  # the orphan is there
        idx.add(_rows(2 + i, 2))  # the next write (a delta): collects it
        meta = json.loads((tmp_path / "docs" / "meta.json").read_text())
        assert meta["log"] and _files(tmp_path / "docs", "index") == sorted(set(meta["recent_bases"]))
        assert _files(tmp_path / "docs", "payloads") == sorted(set(meta["recent_bases"]))
    assert IndexStore(tmp_path).get("docs").count == 308


def test_an_index_written_before_the_log_loads_and_logs_after_it(tmp_path):
    idx = IndexStore(tmp_path).create("docs", "s", _rows(0, 50), kind="hnsw", params=_params("hnsw"))
    idx.delete([7])
    idx.save()  # a snapshot at generation 3; now rewrite its meta as format 2 wrote it
    meta_path = tmp_path / "docs" / "meta.json"
    meta = json.loads(meta_path.read_text())
    for key in ("base", "log", "base_rows", "recent_bases"):
        meta.pop(key)
    meta["format_version"] = 2
    meta_path.write_text(json.dumps(meta))
    old = IndexStore(tmp_path).get("docs")
    assert old.count == 49 and old.generation == 3
    old.add(_rows(1, 2))
    meta = json.loads(meta_path.read_text())
    assert (meta["base"], meta["log"], meta["format_version"]) == (3, [[4, 2]], 3)
    assert _state(IndexStore(tmp_path).get("docs")) == _state(old)


def test_a_damaged_log_is_an_unreadable_generation_not_wrong_rows(tmp_path):
    idx = IndexStore(tmp_path).create("docs", "s", _rows(0, 50))
    idx.add(_rows(1, 2))
    meta_path = tmp_path / "docs" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["log"] = [[2, 3]]  # the meta and its delta disagree on the rows
    meta_path.write_text(json.dumps(meta))
    fresh = IndexStore(tmp_path)
    assert fresh.load_all() == 0 and "docs" in fresh.load_errors and "damaged" in fresh.load_errors["docs"]
    meta["log"] = [[1, 2]]  # a log that does not lead to the meta's generation
    meta_path.write_text(json.dumps(meta))
    fresh = IndexStore(tmp_path)
    assert fresh.load_all() == 0 and "does not lead to generation" in fresh.load_errors["docs"]
    meta["log"], meta["format_version"] = [[2, 2]], 4  # a later format this version cannot read
    meta_path.write_text(json.dumps(meta))
    fresh = IndexStore(tmp_path)
    assert fresh.load_all() == 0 and "written by a newer vecbridge" in fresh.load_errors["docs"]


def test_a_missing_delta_is_an_unreadable_generation_naming_it(tmp_path):
    """A delta removed while meta.json still names it read as "generations changed faster than they could be
    read" (a RuntimeError: an internal error) to a loading process and to one catching up. Now the typed
    UnreadableGenerationError (exit 2, 503) naming the file; the process holding a generation keeps serving it."""
    from service.indexes.errors import UnreadableGenerationError
    from service.indexes.persist import read_current

    writer = IndexStore(tmp_path)
    w = writer.create("docs", "s", _rows(0, 50))
    follower = IndexStore(tmp_path)
    assert follower.get("docs").generation == 1
    w.add(_rows(1, 2))
    (tmp_path / "docs" / "delta.2.npz").unlink()
    with pytest.raises(UnreadableGenerationError, match=r"its file delta\.2\.npz is missing"):
        read_current(tmp_path / "docs")
    fresh = IndexStore(tmp_path)
    assert fresh.load_all() == 0 and "delta.2.npz is missing" in fresh.load_errors["docs"]
    held = follower.get("docs")  # the generation in memory is served; load_errors (/readyz) says why
    assert held.generation == 1 and "delta.2.npz is missing" in follower.load_errors["docs"]


_OPS = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(1, 40), st.booleans()),
    st.tuples(st.just("delete"), st.integers(0, 2**31), st.integers(1, 8)),
    st.tuples(st.just("save"), st.just(0), st.just(False)),
), min_size=1, max_size=12)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["flat", "hnsw", "ivf"]), ops=_OPS)
def test_any_history_replays_to_the_writers_index(kind, ops, tmp_path_factory):
    """Property: after any sequence of adds (explicit or next-free ids, payloads), deletes and saves, a reader
    that followed every step and a process that reads everything at the end both hold the writer's index."""
    root = tmp_path_factory.mktemp("log")
    writer, follower = IndexStore(root), IndexStore(root)
    w = writer.create("docs", "s", _rows(0, 200), kind=kind, params=_params(kind))
    follower.get("docs")
    for step, (op, a, b) in enumerate(ops):
        if op == "add":
            ids = (10_000 + 100 * step + np.arange(a)).tolist() if b else None
            w.add(_rows(step + 1, a), ids=ids, payloads=[{"s": step, "j": j} if j % 2 else None for j in range(a)])
        elif op == "delete":
            live = np.sort(w._live_ids())
            if live.size:
                w.delete(np.random.default_rng(a).choice(live, min(b, live.size), replace=False).tolist())
        else:
            w.save()
        assert _state(follower.get("docs")) == _state(w), (step, op)
    assert _state(IndexStore(root).get("docs")) == _state(w)
