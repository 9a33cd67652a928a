"""Searches go on while deletes rebuild an HNSW graph.

HNSW deletes mark slots dead; once they pass 10 % of the stored rows the graph is rebuilt from the live rows.
Before, the rebuild ran under the write side of the index's lock, so every search of the index waited for it
(minutes for a graph of millions of rows). Now it runs off the write side; the new graph is saved and swapped in
under it. The rebuild is held here by a gate around the real ``rebuild_hnsw`` (events, never timing): a search
issued meanwhile must answer, still seeing the rows (the delete is not done), and afterwards no search nor a
process loading the index sees them. A rebuild that fails leaves the index as it was.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from service.indexes import IndexStore
from service.indexes import changes as space_mod

DIM, N = 32, 2000


@pytest.fixture
def hnsw(tmp_path):
    rows = np.random.default_rng(0).standard_normal((N, DIM)).astype(np.float32)
    idx = IndexStore(tmp_path).create("h", "s", rows, kind="hnsw", payloads=[{"i": i} for i in range(N)])
    return tmp_path, idx, rows


def _top1(idx, rows) -> list[int]:
    return idx.search(rows, 1, exact=True)[1][:, 0].tolist()


def test_a_search_answers_while_a_delete_rebuilds_the_graph(hnsw, monkeypatch):
    root, idx, rows = hnsw
    started, go = threading.Event(), threading.Event()
    real = space_mod.rebuild_hnsw

    def held(*args, **kw):
        started.set()
        assert go.wait(30), "the test never let the rebuild go"
        return real(*args, **kw)

    monkeypatch.setattr(space_mod, "rebuild_hnsw", held)
    doomed = np.arange(0, 300)  # 15 % of the rows: past the rebuild share
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("n", idx.delete(doomed)))
    t.start()
    try:
        assert started.wait(30)
        answered: list = []
        s = threading.Thread(target=lambda: answered.append(_top1(idx, rows[:400])))
        s.start()
        s.join(20)  # before: waited on the write side for the whole rebuild (here: until the test let it go)
        assert answered == [list(range(400))], "a search waited for the rebuild"
        assert idx.count == N and "n" not in out  # the delete is not done: its rows are still served
    finally:
        go.set()
        t.join(30)
    assert out["n"] == 300 and idx.count == N - 300 and not idx.tombstones
    hits = _top1(idx, rows[:400])
    assert not set(hits) & set(doomed.tolist()) and hits[300:] == list(range(300, 400))
    again = IndexStore(root).get("h")  # another process: the rebuilt graph, as a snapshot
    assert again.count == N - 300 and not again.tombstones and again.logged_deltas == 0
    assert _top1(again, rows[300:310]) == list(range(300, 310))
    assert again.get_payloads(np.array([0, 305])) == [None, {"i": 305}]


def test_a_rebuild_that_fails_leaves_the_index_as_it_was(hnsw, monkeypatch):
    root, idx, rows = hnsw

    def fails(*_a, **_kw):
        raise MemoryError("no room for the new graph")

    monkeypatch.setattr(space_mod, "rebuild_hnsw", fails)
    with pytest.raises(MemoryError):
        idx.delete(np.arange(0, 300))
    assert idx.count == N and not idx.tombstones and _top1(idx, rows[:5]) == [0, 1, 2, 3, 4]
    assert idx.get_payloads(np.array([0])) == [{"i": 0}]
    again = IndexStore(root).get("h")
    assert again.count == N and again.generation == idx.generation
    monkeypatch.undo()
    assert idx.delete(np.arange(0, 300)) == 300 and idx.count == N - 300  # and it can be deleted afterwards
