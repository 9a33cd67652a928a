"""Indexes shared by several processes on one data dir (what ``uvicorn --workers N`` does).

Real processes (``multiprocessing`` with ``spawn``), real FAISS, real files and ``flock``:

* writers adding concurrently (explicit id ranges, and next-free ids) lose nothing: every
  acknowledged id is stored exactly once, in every process's view and on disk;
* a reader searching in a loop meanwhile never errors and only sees persisted generations:
  count = base + batch x (generation - 1), never going down, and an exact search returns
  whole batches only;
* an index created in one process is listed and searchable in another; one dropped in one
  process answers not-found in the others, also to a writer holding a stale copy, and a
  re-created one of the same name is a different index.
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
from pathlib import Path

import numpy as np
import pytest

from service.indexes import IndexNotFoundError, IndexStore

DIM = 8
BATCH = 8
BATCHES = 10
BASE = 16
BASE_ID = 1_000_000  # explicit ids of the writers stay below, next-free ids start above
EXPLICIT_WRITERS = 2
AUTO_WRITERS = 1
K_ALL = 512  # more than the final count: an exact search returns every live row


def _vectors(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def _writer(root: str, w: int, auto: bool, start, done_writing, out) -> None:
    try:
        store = IndexStore(Path(root))
        store.load_all()
        start.wait(60)
        acked = []
        for b in range(BATCHES):
            ids = None if auto else (1000 * (w + 1) + b * BATCH + np.arange(BATCH)).tolist()
            got = store.get("mp").add(_vectors(100 * w + b, BATCH), ids=ids,
                                      payloads=[{"w": w, "b": b, "j": j} for j in range(BATCH)])
            acked.extend(int(i) for i in got)
        out.put(("acked", w, acked))
        done_writing.wait(60)  # every writer finished: this process's view must now hold all rows
        idx = store.get("mp")
        _, I = idx.search(_vectors(7, 3), K_ALL, exact=True)
        out.put(("view", w, sorted(idx._live_ids().tolist()), sorted(int(i) for i in I[0] if i >= 0), idx.count))
    except BaseException:
        out.put(("error", w, traceback.format_exc()))


def _reader(root: str, start, stop, out) -> None:
    try:
        store = IndexStore(Path(root))
        store.load_all()
        start.wait(60)
        seen = []  # (generation, count, rows returned by an exact search)
        Q = _vectors(5, 2)
        while not stop.is_set():
            idx = store.get("mp")
            with idx.lock.read():  # a consistent (generation, count) pair
                gen, count = idx.generation, idx.count
            _, I = idx.search(Q, K_ALL, exact=True)
            ids = I[0][I[0] >= 0]
            assert np.unique(ids).size == ids.size, "an id twice in one answer"
            seen.append((gen, count, int(ids.size)))
        out.put(("seen", -1, seen))
    except BaseException:
        out.put(("error", -1, traceback.format_exc()))


def _collect(out, n_messages: int, procs) -> list:
    msgs = []
    for _ in range(n_messages):
        msgs.append(out.get(timeout=120))
    for p in procs:
        p.join(60)
        assert p.exitcode == 0, f"{p.name} exited {p.exitcode}"
    errors = [m[2] for m in msgs if m[0] == "error"]
    assert not errors, "\n".join(errors)
    return msgs


def test_concurrent_writers_keep_every_acknowledged_row_and_readers_see_whole_generations(tmp_path):
    root = tmp_path / "indexes"
    base_ids = BASE_ID + np.arange(BASE)
    mine = IndexStore(root)
    mine.create("mp", "s", _vectors(0, BASE), ids=base_ids.tolist(), kind="flat")
    assert mine.get("mp").next_id == BASE_ID + BASE

    ctx = mp.get_context("spawn")
    n_writers = EXPLICIT_WRITERS + AUTO_WRITERS
    start, done_writing = ctx.Barrier(n_writers + 2), ctx.Barrier(n_writers)
    stop, out = ctx.Event(), ctx.Queue()
    writers = [ctx.Process(target=_writer, args=(str(root), w, w >= EXPLICIT_WRITERS, start, done_writing, out),
                           name=f"writer-{w}") for w in range(n_writers)]
    reader = ctx.Process(target=_reader, args=(str(root), start, stop, out), name="reader")
    for p in writers + [reader]:
        p.start()
    start.wait(120)  # everyone has loaded the index: from here on they race
    acked_msgs, view_msgs = [], []
    while len(acked_msgs) + len(view_msgs) < 2 * n_writers:
        m = out.get(timeout=120)
        assert m[0] != "error", m[2]
        (acked_msgs if m[0] == "acked" else view_msgs).append(m)
    stop.set()
    seen = _collect(out, 1, writers + [reader])[0][2]

    acked = [i for m in acked_msgs for i in m[2]]
    total = BASE + n_writers * BATCHES * BATCH
    assert len(acked) == len(set(acked)) == n_writers * BATCHES * BATCH, "an id acknowledged twice"
    auto = [i for m in acked_msgs if m[1] >= EXPLICIT_WRITERS for i in m[2]]
    assert min(auto) >= BASE_ID + BASE  # next-free ids never reuse one another process took
    expected = sorted(set(acked) | set(base_ids.tolist()))
    assert len(expected) == total

    # every process's view: each writer's, the parent's stale copy caught up, and a fresh load
    for _, w, live, searched, count in view_msgs:
        assert live == expected and searched == expected and count == total, f"writer {w}"
    idx = mine.get("mp")
    assert sorted(idx._live_ids().tolist()) == expected and idx.count == total
    assert idx.generation == 1 + n_writers * BATCHES
    again = IndexStore(root)
    assert again.load_all() == 1
    fresh = again.get("mp")
    assert sorted(fresh._live_ids().tolist()) == expected
    for m in acked_msgs:  # payloads travelled with their rows
        w = m[1]
        for pos, i in enumerate(m[2]):
            assert fresh.payloads[i] == {"w": w, "b": pos // BATCH, "j": pos % BATCH}
    _, I = fresh.search(_vectors(9, 1), K_ALL, exact=True)
    assert sorted(I[0][I[0] >= 0].tolist()) == expected

    # the reader: persisted generations only, never going back, whole batches only
    assert len(seen) >= 3
    gens = [g for g, _, _ in seen]
    assert gens == sorted(gens) and gens[0] >= 1
    for gen, count, returned in seen:
        assert count == BASE + BATCH * (gen - 1), (gen, count)
        assert returned >= count or returned == K_ALL
        assert (returned - BASE) % BATCH == 0
    returned = [r for _, _, r in seen]
    assert returned == sorted(returned)


def _create_elsewhere(root: str, out) -> None:
    try:
        store = IndexStore(Path(root))
        store.load_all()
        idx = store.create("elsewhere", "s", _vectors(1, 20), kind="flat", payloads=[{"r": i} for i in range(20)])
        idx.delete([0, 1, 2])
        idx.add(_vectors(2, 4), ids=[100, 101, 102, 103])
        out.put(("done", 0, idx.count))
    except BaseException:
        out.put(("error", 0, traceback.format_exc()))


def test_create_and_drop_are_seen_by_other_processes(tmp_path):
    root = tmp_path / "indexes"
    a, b = IndexStore(root), IndexStore(root)  # two in-memory views, like two workers
    assert a.load_all() == 0 and b.load_all() == 0

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_create_elsewhere, args=(str(root), out), name="creator")
    p.start()
    msg = _collect(out, 1, [p])[0]
    assert msg[2] == 21

    # created in another process: listed, readable and searchable here
    assert [i.name for i in a.list()] == ["elsewhere"]
    ia = a.get("elsewhere")
    assert ia.count == 21 and ia.payloads[5] == {"r": 5}
    X = _vectors(1, 20)
    _, I = ia.search(X[3:6], 1, exact=True)
    assert I[:, 0].tolist() == [3, 4, 5]
    ib = b.get("elsewhere")
    assert sorted(ib._live_ids().tolist()) == sorted(ia._live_ids().tolist())

    # a write through one view is checked against and seen by the other
    ib.add(_vectors(3, 2), ids=[200, 201])
    with pytest.raises(Exception, match="already in index"):
        ia.add(_vectors(3, 1), ids=[200])
    assert ia.count == 23 and a.get("elsewhere").count == 23

    # dropped in one view: not found in the other, for get, list, search and a stale writer
    b.delete("elsewhere")
    assert not (root / "elsewhere").exists()
    with pytest.raises(IndexNotFoundError):
        a.get("elsewhere")
    with pytest.raises(IndexNotFoundError):
        ia.search(X[:1], 1)
    with pytest.raises(IndexNotFoundError):
        ia.add(X[:1], ids=[999])
    assert a.list() == []
    with pytest.raises(IndexNotFoundError):
        a.delete("elsewhere")

    # re-created under the same name: a different index, the stale copy does not write into it
    ia2 = b.create("elsewhere", "s", _vectors(4, 5), kind="flat")
    with pytest.raises(IndexNotFoundError):
        ia.add(X[:1], ids=[999])
    assert ia2.count == 5 and a.get("elsewhere").count == 5
    assert not any(n.startswith(".") and n not in (".store.lock",) for n in (q.name for q in root.iterdir()))
