"""An index read from its snapshot has room for its log: adds after a load copy no row.

FAISS holds a flat index's rows (an HNSW graph's storage and neighbour lists) in vectors that ``read_index``
reads exactly full, so the first add after a load reallocated them: every row copied into a buffer twice as
large while the old one was still held (a 10-row add to a 1M x 384 flat index just loaded: 3.3 GB for 1.5 GB
of rows). A vector that does not move was not copied: these tests watch the addresses of FAISS's own storage
while the writer adds and a reader replays the whole log a snapshot may have (``persist.log_rows``), and check
that what the processes hold is the very index ``read_index`` gives. An IVF index keeps one vector of rows (and
one of ids) per list: each was read exactly full, so an add doubled every list it touched.
"""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from service.indexes import IndexStore
from service.indexes.persist import log_rows, read_generation, read_meta
from service.indexes.room import IVF_ROOM, MAPPED_READ, give_lists_room

DIM = 24
BASE = 6000

mapped = pytest.mark.skipif(not MAPPED_READ, reason="this FAISS has no views (MaybeOwnedVector) or not Linux")
KINDS = [pytest.param("flat", marks=mapped), pytest.param("hnsw", marks=mapped),
         pytest.param("ivf", marks=pytest.mark.skipif(not IVF_ROOM, reason="IVF lists are read exactly full here"))]


def _rows(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def _addresses(idx) -> dict[str, int]:
    """Where FAISS keeps the rows, the ids and (HNSW) the graph of ``idx`` now; IVF: each list's rows and ids."""
    if idx.kind == "ivf":
        inv = idx.index.invlists
        return {f"{what}{i}": int(get(i)) for i in range(idx.index.nlist)
                for what, get in (("rows", inv.get_codes), ("ids", inv.get_ids))}
    inner = faiss.downcast_index(idx.index.index)
    flat = faiss.downcast_index(inner.storage) if idx.kind == "hnsw" else inner
    out = {"rows": int(flat.codes.data()), "ids": int(idx.index.id_map.data())}
    if idx.kind == "hnsw":
        h = inner.hnsw
        out.update(neighbors=int(h.neighbors.data()), offsets=int(h.offsets.data()), levels=int(h.levels.data()))
    return out


def _bytes(idx) -> bytes:
    return faiss.serialize_index(idx.index).tobytes()


@pytest.mark.parametrize("kind", KINDS)
def test_adds_and_replays_after_a_load_copy_no_row_up_to_a_full_log(kind, tmp_path):
    params = {"M": 8, "ef_construction": 16} if kind == "hnsw" else {"nlist": 16} if kind == "ivf" else None
    IndexStore(tmp_path).create("docs", "s", _rows(0, BASE), kind=kind, params=params)
    writer, reader = IndexStore(tmp_path).get("docs"), IndexStore(tmp_path).get("docs")  # both read the snapshot
    at_writer, at_reader = _addresses(writer), _addresses(reader)
    room, per, step = log_rows(BASE), 100, 0
    while writer.count + per <= BASE + room:  # HTTP-sized adds, each a delta of the log
        writer.add(_rows(step + 1, per), payloads=[{"step": step}] * per)
        step += 1
        assert writer.logged_deltas == step, "a snapshot was written: the test no longer measures the log"
        assert _addresses(writer) == at_writer, f"the writer's storage moved (copied) at add {step}"
    assert reader.search(_rows(99, 3), 5)[1].shape == (3, 5)  # catches up: replays every delta
    assert reader.generation == writer.generation
    assert _addresses(reader) == at_reader, "the reader's storage moved (copied) while replaying the log"
    assert _bytes(reader) == _bytes(writer)
    # what a process reading the files afresh holds: the same index, byte for byte, as FAISS's own reader gives
    path = tmp_path / "docs"
    meta = read_meta(path)
    with open(path / f"index.{meta['base']}.faiss", "rb") as fh:
        plain = faiss.read_index(faiss.PyCallbackIOReader(fh.read))
    snapshot, _ = read_generation(path, {**meta, "generation": meta["base"], "log": []})
    assert faiss.serialize_index(snapshot).tobytes() == faiss.serialize_index(plain).tobytes()
    Q = _rows(7, 20)
    assert all(np.array_equal(a, b) for a, b in zip(snapshot.search(Q, 10), plain.search(Q, 10), strict=True))
    fresh = IndexStore(tmp_path).get("docs")
    assert _bytes(fresh) == _bytes(writer)


@mapped
def test_a_loaded_index_does_not_keep_its_snapshot_file_mapped(tmp_path):
    """The rows are copied out of the mapping and it is closed: a snapshot a writer collects later frees its
    disk space, whatever process loaded it."""
    IndexStore(tmp_path).create("docs", "s", _rows(0, 2000), kind="flat")
    idx = IndexStore(tmp_path).get("docs")
    with open("/proc/self/maps") as fh:
        mapped = [line for line in fh if str(tmp_path) in line]
    assert mapped == [] and idx.count == 2000


@mapped
@pytest.mark.parametrize("kind", ["flat", "hnsw"])
@pytest.mark.parametrize("cut", [1, 7, 8, 4096])
def test_a_snapshot_cut_short_is_refused_not_read_past_its_end(kind, cut, tmp_path):
    """A file a few bytes short (a failing disk, a copy cut off) is a read error, as with FAISS's file reader;
    FAISS's mapped-file reader would round the last partial id up and read past the end of the file."""
    params = {"M": 8} if kind == "hnsw" else None
    IndexStore(tmp_path).create("docs", "s", _rows(0, 500), kind=kind, params=params)
    path = tmp_path / "docs"
    meta = read_meta(path)
    snap = path / f"index.{meta['base']}.faiss"
    snap.write_bytes(snap.read_bytes()[:-cut])
    with pytest.raises(RuntimeError):
        read_generation(path, meta)


@pytest.mark.skipif(not IVF_ROOM, reason="IVF lists are read exactly full here")
def test_an_ivf_index_a_process_wrote_takes_its_next_log_without_moving_a_list(tmp_path):
    """The writer that created an IVF index (HTTP create, ``vecbridge index create``), or wrote a snapshot when its
    log filled, keeps it in memory: its lists were exactly full there, so its next adds doubled them as before."""
    idx = IndexStore(tmp_path).create("docs", "s", _rows(0, BASE), kind="ivf", params={"nlist": 16})
    step = 0
    for _ in range(2):  # the log after the create, then the log after the snapshot the writer wrote itself
        at, start, per = _addresses(idx), idx.count, 100
        while idx.count + per <= start + log_rows(start):
            idx.add(_rows(100 + step, per))
            step += 1
            assert idx.logged_deltas > 0 and _addresses(idx) == at, f"a list moved (copied) at add {step}"
        idx.add(_rows(100 + step, per))  # past the log: a snapshot
        step += 1
        assert idx.logged_deltas == 0
    fresh = IndexStore(tmp_path).get("docs")  # the same lists (the serialized id hash map's order is its history's)
    for i in range(idx.index.nlist):
        a, b = idx.index.invlists, fresh.index.invlists
        n, width = a.list_size(i), a.code_size
        assert n == b.list_size(i)
        assert np.array_equal(faiss.rev_swig_ptr(a.get_ids(i), n), faiss.rev_swig_ptr(b.get_ids(i), n))
        assert np.array_equal(faiss.rev_swig_ptr(a.get_codes(i), n * width), faiss.rev_swig_ptr(b.get_codes(i), n * width))
    Q = _rows(7, 20)
    assert np.array_equal(fresh.search(Q, 10)[1], idx.search(Q, 10)[1])


@pytest.mark.skipif(not IVF_ROOM, reason="IVF lists are read exactly full here")
def test_an_ivf_list_that_cannot_get_its_room_is_kept_as_it_was(tmp_path):
    """Out of memory while a list is given room (it is emptied and regrown): the error is raised and no row is lost."""
    idx = IndexStore(tmp_path).create("docs", "s", _rows(0, 2000), kind="ivf", params={"nlist": 8})
    before = _bytes(idx)
    with pytest.raises(MemoryError):
        give_lists_room(idx.index, np.full(8, 1 << 42, np.int64))  # 4 T rows: the allocation fails
    assert _bytes(idx) == before
    Q = _rows(7, 5)
    assert np.array_equal(idx.search(Q, 3)[1], IndexStore(tmp_path).get("docs").search(Q, 3)[1])
