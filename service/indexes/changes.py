"""Adds and deletes of a :class:`~.space.SpaceIndex` (a mixin of it): change in memory, persist, show.

A change is applied to the index in memory under the write side of its :class:`~.locking.RWLock` (an HNSW add:
per chunk of rows), then persisted (:meth:`~.space.SpaceIndex._save`: a delta, or a snapshot of the whole index)
without it: the writer lock (threads, and ``flock`` across processes) keeps every other writer out, so the index
the snapshot reads does not change, and searches go on reading it. The rows of an add stay hidden from searches
until it is persisted (flat and HNSW: the slots from ``_shown`` on; IVF: a selector of their ids,
:func:`~.kinds.hidden_ids`), then are shown under the write side at once: a search sees all of an add or none of
it, and never a row whose generation could still fail. A delete leaves searches when it is applied (its rows
are removed from the index in memory: FAISS compacts flat and IVF storage), a write of its generation at most
before it is committed; a failed write reloads the persisted generation, rows included. Before, the snapshot was
written under the write side: an add of 30k rows to a 1.3M x 384 flat index held every search 5.6 s.

A snapshot-sized add to a flat or HNSW index first gets the storage room for its rows and the log after it
(:func:`~.room.grow_room`: copied off the write side, swapped in under it), and so does the index after any
other snapshot this process writes: no later add of its log reallocates the rows under the write side.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from contextlib import nullcontext, suppress
from typing import Any

import numpy as np

from .kinds import (
    TOMBSTONE_REBUILD,
    add_seed,
    hidden_ids,
    ids_array,
    live_slots,
    rebuild_hnsw,
)
from .persist import Delta, log_rows
from .room import grow_room

__all__ = ["Changes"]


class Changes:
    """Adds and deletes of :class:`~.space.SpaceIndex` (module docstring); the rest of the class is there."""

    def _write_adds(self: Any, blocks: Iterable[tuple[Any, Any, Any]], *, log: bool,
                    prepared: bool = False) -> np.ndarray:
        """Add ``blocks`` ``(X (m, dim), ids, payloads)`` as one generation, persisted: a delta when ``log`` and it
        fits the log (one block), else a snapshot; returns the ids. Caller holds the writer lock (:meth:`_writing`).

        Flat and IVF (fast adds) under the write side, HNSW per chunk of rows; the rows stay hidden from searches
        until the generation is persisted (off the write side), then shown under the write side."""
        blocks, hnsw, ids = deque(blocks), self.kind == "hnsw", []
        logged = log and len(blocks) == 1 and self._logs(len(blocks[0][0]))
        if not logged:
            self._make_room(sum(len(block[0]) for block in blocks))
        self._shown = int(self.index.ntotal)
        try:
            with nullcontext() if hnsw else self.lock.write(), self._undo_on_failure(len(blocks) > 1, not hnsw):
                while blocks:
                    X, ids_m, payloads_m = blocks.popleft()
                    seed = add_seed(self._log_seed, self.generation + 1) if logged else None
                    delta = self._add(X, ids_m, payloads_m, seed=seed,
                                      prepared=prepared, step=self.lock.write if hnsw else None)
                    ids.append(delta.ids)
                if self.kind == "ivf":
                    self._hidden = hidden_ids(np.concatenate(ids))
            with self._undo_on_failure(True, locked=False):
                self._save(delta if logged else None)
        finally:
            if self._shown == self.index.ntotal:  # nothing inserted (refused before any row)
                self._shown = self._hidden = None
        if self._shown is not None:  # committed: show the rows
            with self.lock.write():
                self._shown = self._hidden = None
                self._changed(self.updated_at)  # the time persisted (a new one went backwards on a reload)
            if self.observer is not None:
                self.observer.index_changed(self)
        return np.concatenate(ids)

    def _make_room(self: Any, rows: int) -> None:
        """Flat or HNSW: storage for ``rows`` more rows and the log of the snapshot they then make
        (:func:`~.room.grow_room`, off the write side: the process holds the rows twice meanwhile, as a reallocation
        would). Not an index never persisted (just built: its first snapshot would double the memory a create
        peaks at). Caller holds the writer lock."""
        if self.kind == "ivf" or self.path is None or self.generation == 0:
            return
        n = int(self.index.ntotal) + int(rows)
        with suppress(MemoryError):  # without the room the rows grow by doubling, as before
            grow_room(self.index, self.kind, n + log_rows(n), self.lock.write)

    def delete(self: Any, ids) -> int:
        """Delete ``ids``; returns how many were present. Unknown ids are ignored.

        HNSW marks the rows' slots dead (tombstones, filtered from searches); once they pass
        :data:`~.kinds.TOMBSTONE_REBUILD` of the stored rows the graph is rebuilt from the live rows, off the
        write side: searches go on meanwhile (seeing the rows until the new graph is saved and swapped in)."""
        ids_arr = ids_array(ids, merge_repeats=True)  # an id named twice is deleted once
        with self._writing():
            with self.lock.write(), self._undo_on_failure():
                present = ids_arr[self.has_ids(ids_arr)]
                if present.size == 0:
                    return 0
                logged = self._logs(present.size)
                rebuild = None
                if self.kind == "hnsw":
                    dead = self.tombstones | set(live_slots(self.index, present, self.tombstones).tolist())
                    if len(dead) > TOMBSTONE_REBUILD * max(1, self.index.ntotal):
                        rebuild = dead
                    else:
                        self.tombstones = dead  # a new set, never one changed in place (kinds.DeadSlots)
                else:
                    removed = self.index.remove_ids(present)
                    assert removed == present.size, (removed, present.size)
                if rebuild is None:
                    self._forget_rows(present)
            if rebuild is None:
                with self._undo_on_failure(True, locked=False):
                    self._save(Delta(self.generation + 1, "delete", present) if logged else None)
                return int(present.size)
            # only readers of this index meanwhile (this thread holds the writer lock): the rebuild reads it safely
            fresh = rebuild_hnsw(self.index, self.dim, self.params, rebuild)
            with self.lock.write(), self._undo_on_failure():
                self.index, self.tombstones = fresh, set()
                self._forget_rows(present)
            with self._undo_on_failure(True, locked=False):
                self._save()  # a new graph: only a snapshot holds it
            return int(present.size)

    def _forget_rows(self: Any, ids: np.ndarray) -> None:
        """The rows ``ids`` are deleted from the index: drop their payloads (caller holds the write side)."""
        for i in ids.tolist():
            self.payloads.pop(i, None)
        self._changed()
