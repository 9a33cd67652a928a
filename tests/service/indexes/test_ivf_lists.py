"""An IVF index holds each list at its size: every list is allocated once, for exactly its rows, when it is built.

FAISS keeps an IVF list's rows and ids in two vectors that grow by doubling; a build that added rows block by block
left each list between 1x and 2x its size (a 1M x 384 index held 2,036 MiB for 1,465 MiB of rows). A vector that is
exactly full moves (is copied into a larger buffer) when one more entry is added: these tests add one row to every
list straight through FAISS and check that every list moved. The lists are found in a first pass
(``kinds.plan_lists``), so the index must be the very one FAISS's own block-by-block add makes, byte for byte.
"""

from __future__ import annotations

import types

import faiss
import numpy as np
import pytest

from align.exceptions import InputError
from service.indexes import IndexStore, SpaceIndex
from service.indexes.room import IVF_ROOM
from service.ops import index_files
from service.ops import indexes as index_ops

DIM, N, NLIST, BLOCK = 32, 8192, 64, 1024


def _rows(seed: int = 0, n: int = N) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, DIM), dtype=np.float32)


def _not_full(index) -> list[int]:
    """The non-empty lists of the IVF ``index`` that had room for one more entry (rows or ids): adds one row to every
    list through FAISS (``add_core`` with each row's list given) and lists those whose storage did not move."""
    inv = index.invlists
    sizes = [inv.list_size(i) for i in range(index.nlist)]
    before = [(int(inv.get_codes(i)), int(inv.get_ids(i))) for i in range(index.nlist)]
    rows = np.zeros((index.nlist, DIM), np.float32)
    ids = np.arange(10**9, 10**9 + index.nlist, dtype=np.int64)
    lists = np.arange(index.nlist, dtype=np.int64)
    index.add_core(index.nlist, faiss.swig_ptr(rows), faiss.swig_ptr(ids), faiss.swig_ptr(lists))
    after = [(int(inv.get_codes(i)), int(inv.get_ids(i))) for i in range(index.nlist)]
    return [i for i in range(index.nlist) if sizes[i] and (before[i][0] == after[i][0] or before[i][1] == after[i][1])]


def _roomy(index) -> list[int]:
    """What :func:`_not_full` gives for an index with room in every list (``service.indexes.room.ivf_room``: one
    read from its snapshot, or whose snapshot this process wrote): every non-empty list, where this FAISS allows."""
    return [i for i in range(index.nlist) if index.invlists.list_size(i)] if IVF_ROOM else []


def _bytes(index) -> bytes:
    return faiss.serialize_index(index).tobytes()


def _blockwise(X: np.ndarray, **kw) -> SpaceIndex:
    """The index as built before lists were planned: FAISS's own add, block by block (a one-shot stream)."""
    return SpaceIndex.build("ref", "s", X[:BLOCK], more=((X[s:s + BLOCK], None, None) for s in range(BLOCK, N, BLOCK)),
                            train=X, kind="ivf", params={"nlist": NLIST}, **kw)


def _from_file(tmp_path, monkeypatch, X: np.ndarray, name: str = "f"):
    monkeypatch.setattr(index_files, "CHUNK_ROWS", BLOCK)  # 8 blocks
    np.save(tmp_path / f"{name}.npy", X)
    space = types.SimpleNamespace(name="s", dim=DIM)
    return index_files.create_from_file(None, IndexStore(tmp_path / "indexes"), name, space,
                                        index_files.FileRows(str(tmp_path / f"{name}.npy")), kind="ivf",
                                        params={"nlist": NLIST})


def test_an_ivf_index_created_from_a_file_of_many_blocks_holds_each_list_exactly_full(tmp_path, monkeypatch):
    """``vecbridge index create`` of a file: each list was left with room (up to as much again) by doubling. Now the
    lists are filled exactly full, then (once the snapshot is written) given room for the log, not resident."""
    X = _rows()
    idx = _from_file(tmp_path, monkeypatch, X)
    assert idx.count == N
    ref = _blockwise(X)
    assert _bytes(idx.index) == _bytes(ref.index)  # the same lists, rows in the same order, the same id map
    assert _not_full(idx.index) == _roomy(idx.index)
    assert len(_not_full(ref.index)) > NLIST // 2  # the plain add leaves most lists with room


@pytest.mark.parametrize("how", ["store", "blocks"])
def test_an_ivf_index_created_from_rows_in_memory_holds_each_list_exactly_full(how, tmp_path):
    """The HTTP face's create (``ops.indexes.create_index``: the rows of the request at once) and a build from blocks
    held in memory; the same index as FAISS's plain add."""
    X = _rows(1)
    if how == "store":
        space = types.SimpleNamespace(name="s", dim=DIM)
        idx = index_ops.create_index(None, IndexStore(tmp_path), "m", space, X, kind="ivf", params={"nlist": NLIST})
        # FAISS's plain add of all rows at once (what the create did before): ``more`` a one-shot stream, no plan
        ref = SpaceIndex.build("ref", "s", X, more=iter(()), kind="ivf", params={"nlist": NLIST})
    else:
        idx = SpaceIndex.build("m", "s", X[:BLOCK], more=[(X[s:s + BLOCK], None, None) for s in range(BLOCK, N, BLOCK)],
                               train=X, kind="ivf", params={"nlist": NLIST})
        ref = _blockwise(X)
    assert idx.count == N
    assert _bytes(idx.index) == _bytes(ref.index)
    assert _not_full(idx.index) == (_roomy(idx.index) if how == "store" else [])  # stored: room for its log


def test_a_loaded_ivf_index_and_later_adds(tmp_path, monkeypatch):
    """A loaded IVF index has room in every list for its share of the log (``service.indexes.room``: FAISS reads
    each list exactly full, and the first add to a list doubled it); searches find what was added."""
    X = _rows(2)
    _from_file(tmp_path, monkeypatch, X, "g")
    store = IndexStore(tmp_path / "indexes")
    loaded = IndexStore(tmp_path / "indexes").get("g")
    assert _not_full(loaded.index) == _roomy(loaded.index)
    idx = store.get("g")
    extra = _rows(3, 10)
    ids = idx.add(extra)
    assert idx.count == N + 10
    assert np.array_equal(idx.search(extra, 1, exact=True)[1][:, 0], ids)


def test_rows_that_change_between_the_two_passes_are_refused(tmp_path):
    """The lists are found in a first pass; rows that come back different (a file rewritten while it was read) would
    be stored in the wrong lists: the build refuses them, and nothing is created."""
    X = _rows(4)
    blocks = [(X[s:s + BLOCK], None, None) for s in range(BLOCK, N, BLOCK)]
    changed = X.copy()
    changed[5 * BLOCK + 7] += 1.0
    store = IndexStore(tmp_path)
    for again in (lambda: (changed[s:s + BLOCK] for s in range(0, N, BLOCK)),  # a row changed
                  lambda: (X[s:s + BLOCK] for s in range(0, N - BLOCK, BLOCK)),  # a block fewer
                  lambda: [*(X[s:s + BLOCK] for s in range(0, N, BLOCK)), X[:BLOCK]]):  # one more
        with pytest.raises(InputError, match="changed between the two passes"):
            store.create("x", "s", X[:BLOCK], more=iter(blocks), train=X, again=again, kind="ivf",
                         params={"nlist": NLIST})
    assert store.names() == []
