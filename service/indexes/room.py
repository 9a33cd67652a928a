"""Read a snapshot (flat, HNSW, IVF) into storage with room to grow, holding its rows once.

FAISS keeps a flat index's rows (and an HNSW graph's storage and neighbour lists) in ``std::vector``\\ s, and
``faiss.read_index`` reads each exactly full. The next add then reallocates: a vector past its capacity copies
every element into a buffer twice as large, so for a moment the process holds the index twice (a 10-row add to a
1M x 384 flat index just loaded: 1.5 GB of rows, a 3.3 GB peak, seconds under the index's write lock), and a
reader replaying a log of adds onto a snapshot pays the same copy.

:func:`read_with_room` maps the file read-only instead and reads it with FAISS's ``ZeroCopyIOReader``: the rows
and the graph's neighbour lists are then views of the mapping (page cache, not private memory). Each is copied
into a vector of the same element type with room for ``rows`` rows and swapped into the index, which owns it from
then on; the mapping is closed. The room is reserved without being touched (see :func:`_with_room`), so the
process holds the rows once, and adds up to ``rows`` rows in all (the whole log of the snapshot, :mod:`.persist`)
copy nothing. The bytes are those of the file: searches and an HNSW graph are exactly those ``read_index`` gives.

An IVF index keeps each list's rows and ids in a vector of their own, also read exactly full: an add doubled each
list it touched, and glibc served the larger buffers from freed resident ones, so a 1M x 384 index that took its
whole log held 1.45x its rows. It is read with ``read_index`` and each list given room for its share of the log
(:func:`ivf_room`: FAISS's ``resize``, the spare pages given back); so is an IVF index whose snapshot this process
wrote (created it, or its log filled: :class:`~.space.SpaceIndex`), for the log that starts then.

A flat or HNSW index whose snapshot this process writes gets the same room (:func:`grow_room`): before a
snapshot-sized add, for its rows and the log after it, and after any other snapshot (a delete, a create). Searches
read the storage meanwhile, so the vectors short of room (capacity from glibc's ``malloc_usable_size``) are copied
whole, nothing given back, and swapped in under the index's write side: the process briefly holds them twice, as a
reallocation would, but searches wait only for the swap.

Other structures, other systems, a FAISS without views (``MaybeOwnedVector``, ``ZeroCopyIOReader``: older
releases; flat and HNSW) and one newer than :data:`CHECKED_FAISS` are read as before.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, BinaryIO

import faiss
import numpy as np

from ..memory import trim_heap

__all__ = ["CHECKED_FAISS", "IVF_ROOM", "MAPPED_READ", "give_lists_room", "grow_room", "ivf_room",
           "list_room", "read_with_room"]

#: The newest FAISS whose ``MaybeOwnedVector`` internals (``owned_data`` swapped in, ``resize`` re-pointing the view)
#: and ``ArrayInvertedLists`` internals (``get_codes`` / ``get_ids`` pointing at each list's vectors, which ``resize``
#: sizes) this module was checked against (tests/service/indexes/test_index_room.py); a newer one reads plainly (2x
#: at the first add, as before) until checked: a changed internal here would be memory corruption, not an error.
CHECKED_FAISS = (1, 15)


def _faiss_version() -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in faiss.__version__.split(".")[:2])
    except (AttributeError, ValueError):
        return (0,)


MAPPED_READ = (sys.platform.startswith("linux") and hasattr(faiss, "ZeroCopyIOReader")
               and hasattr(faiss, "MaybeOwnedVectorUInt8") and _faiss_version() <= CHECKED_FAISS)
_COPY_BYTES = 4 << 20  # copied (and released from the source) per step
_MADV_DONTNEED = 4  # Linux
_PAGE = mmap.PAGESIZE
_madvise: Any = None
#: Whether IVF lists get room at load (:func:`give_lists_room`): Linux (``madvise``) and a checked FAISS.
IVF_ROOM = sys.platform.startswith("linux") and _faiss_version() <= CHECKED_FAISS


def _release(ptr: int, nbytes: int) -> None:
    """Give back the physical pages wholly inside ``[ptr, ptr + nbytes)`` (``madvise(MADV_DONTNEED)``).

    Anonymous memory reads back as zeros afterwards; a file mapping reads the file again. Only for memory
    whose contents are no longer needed.
    """
    global _madvise
    lo, hi = -(-ptr // _PAGE) * _PAGE, (ptr + nbytes) // _PAGE * _PAGE
    if hi <= lo:
        return
    if _madvise is None:
        _madvise = ctypes.CDLL(None, use_errno=True).madvise
        _madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    _madvise(lo, hi - lo, _MADV_DONTNEED)  # advice only: a refusal leaves the pages where they are


def _with_room(make, src, n: int, capacity: int, dtype, release: bool = True) -> Any:
    """A new vector (``make()``: a FAISS ``*Vector``) holding the ``n`` elements at ``src`` with capacity for at
    least ``capacity``, at most ``n`` elements resident at any time; ``src``'s pages are released as copied.

    ``std::vector`` has no ``reserve`` in FAISS's Python API, and ``resize(capacity)`` writes (so makes resident)
    every element. A vector grown past its capacity reallocates to ``max(2 x size, new size)`` and writes only
    the elements it keeps, so: ``resize(h)`` with ``h = ceil(capacity / 2)`` (capacity ``h``), give its pages
    back, ``resize(n)`` for ``h < n`` (capacity ``2h >= capacity``; the released elements read as the shared
    zero page and only the ``n`` kept are written), then copy the rows in. Below that (``capacity >= 2n``:
    small vectors) one ``resize(capacity)`` and the pages past ``n`` given back. ``release=False``: ``src`` is
    left whole (others read it meanwhile).
    """
    vec = make()
    half = -(-capacity // 2)
    if n > half:
        vec.resize(half)
        _release(int(vec.data()), half * dtype.itemsize)
        vec.resize(n)
    else:
        vec.resize(capacity)
        vec.resize(n)
        _release(int(vec.data()) + n * dtype.itemsize, (capacity - n) * dtype.itemsize)
    if n:
        dst, source = faiss.rev_swig_ptr(vec.data(), n), faiss.rev_swig_ptr(src, n)
        step = max(1, _COPY_BYTES // dtype.itemsize)
        for s in range(0, n, step):
            dst[s:s + step] = source[s:s + step]
            if release:
                _release(int(src) + s * dtype.itemsize, min(step, n - s) * dtype.itemsize)
    return vec


def _own(holder, field: str, make, make_view, capacity: int, dtype) -> None:
    """Replace ``holder.<field>`` (a FAISS ``MaybeOwnedVector``, a view of the mapped file or owned) by an owned
    copy with room for ``capacity`` elements."""
    old = getattr(holder, field)
    n = int(old.size())
    vec = _with_room(make, old.data(), n, capacity, dtype)
    setattr(holder, field, make_view())  # empty and owned: drops the view (and its hold on the mapping)
    new = getattr(holder, field)
    new.owned_data.swap(vec)
    new.resize(n)  # the same size: points the vector's cached data pointer and size at the swapped-in storage
    del vec


def _grow(vec, make, capacity: int, dtype) -> None:
    """Give a plain FAISS ``*Vector`` (owned, read exactly full) room for ``capacity`` elements, in place."""
    roomy = _with_room(make, vec.data(), int(vec.size()), capacity, dtype)
    vec.swap(roomy)
    del roomy


def _room_plan(index, kind: str, rows: int) -> list[tuple[Any, str, Any, Any, int, np.dtype]]:
    """``(holder, field, make, make_view, capacity, dtype)`` of each vector of a flat or HNSW ``IndexIDMap2`` that
    grows with its rows, sized for ``rows`` rows in all (``make_view``: ``None`` for a plain FAISS vector).

    Flat: the rows (``codes``, ``ntotal x d x 4`` bytes) and the id map. HNSW: also the graph's neighbour lists,
    its per-row ``offsets`` and ``levels``; the neighbour lists get the room of their present size scaled to
    ``rows`` (a row's lists have the same expected size whatever its place) plus, for the randomness of the levels
    drawn, the lists of 64 rows at the top level.
    """
    n = int(index.ntotal)
    rows = max(int(rows), n)
    inner = faiss.downcast_index(index.index)
    flat = faiss.downcast_index(inner.storage) if kind == "hnsw" else inner
    plan = [(flat, "codes", faiss.UInt8Vector, faiss.MaybeOwnedVectorUInt8, rows * int(flat.code_size),
             np.dtype(np.uint8))]
    if kind == "hnsw":
        hnsw = inner.hnsw
        links = int(hnsw.neighbors.size())
        top = int(faiss.rev_swig_ptr(hnsw.cum_nneighbor_per_level.data(), hnsw.cum_nneighbor_per_level.size())[-1])
        extra = -(-links * (rows - n) // max(n, 1)) + 64 * top if rows > n else 0
        plan += [(hnsw, "neighbors", faiss.Int32Vector, faiss.MaybeOwnedVectorInt32, links + extra,
                  np.dtype(np.int32)),
                 (hnsw, "offsets", faiss.UInt64Vector, None, rows + 1, np.dtype(np.uint64)),
                 (hnsw, "levels", faiss.Int32Vector, None, rows, np.dtype(np.int32))]
    return plan + [(index, "id_map", faiss.Int64Vector, None, rows, np.dtype(np.int64))]


def _give_room(index, kind: str, rows: int) -> None:
    """Own every view of a flat or HNSW ``IndexIDMap2`` read from a mapping, with room for ``rows`` rows in all
    (:func:`_room_plan`)."""
    for holder, name, make, make_view, capacity, dtype in _room_plan(index, kind, rows):
        if make_view is None:
            _grow(getattr(holder, name), make, capacity, dtype)
        else:
            _own(holder, name, make, make_view, capacity, dtype)


_usable: Any = None


def _capacity(vec, dtype: np.dtype) -> int | None:
    """Elements the owned FAISS vector ``vec`` holds without reallocating (glibc's ``malloc_usable_size`` of its
    storage, which ``std::vector`` allocates with ``malloc``); ``None`` for a view or without glibc."""
    global _usable
    if not getattr(vec, "is_owned", True):
        return None
    if _usable is None:
        _usable = getattr(ctypes.CDLL(None), "malloc_usable_size", False)
        if _usable:
            _usable.argtypes, _usable.restype = [ctypes.c_void_p], ctypes.c_size_t
    ptr = int(vec.data() or 0)  # None: empty
    return None if not _usable else _usable(ptr) // dtype.itemsize if ptr else 0


def grow_room(index, kind: str, rows: int, swap: Callable[[], AbstractContextManager]) -> bool:
    """Give a flat or HNSW ``IndexIDMap2`` room for ``rows`` rows in all while searches read it (module docstring).

    The caller is its only writer. Each vector short of its room (:func:`_room_plan`) is copied into a roomy one,
    its source untouched; then, inside ``with swap():`` (the write side), the copies replace them. Returns whether
    it could tell (a structure :func:`_mapped` knows, owned vectors, glibc, a checked FAISS): else nothing changes.
    """
    if not IVF_ROOM or _mapped(index, kind) is None:
        return False
    plan, copies = _room_plan(index, kind, rows), []
    for holder, name, make, make_view, capacity, dtype in plan:
        vec = getattr(holder, name)
        have = _capacity(vec, dtype)
        if have is None:
            return False
        if have < capacity:
            copies.append((holder, name, make_view, int(vec.size()),
                           _with_room(make, vec.data(), int(vec.size()), capacity, dtype, release=False)))
    if copies:
        with swap():
            for holder, name, make_view, n, vec in copies:
                if make_view is None:
                    getattr(holder, name).swap(vec)
                    continue
                setattr(holder, name, make_view())  # empty and owned: frees the old storage
                new = getattr(holder, name)
                new.owned_data.swap(vec)
                new.resize(n)  # points the cached data pointer and size at the swapped-in storage
    return True


def _mapped(index, kind: str) -> tuple[Any, ...] | None:
    """The FAISS objects holding vectors of a flat or HNSW ``IndexIDMap2`` of the structures :func:`_give_room`
    knows (``IndexFlatIP`` rows; ``IndexHNSWFlat`` over them), or ``None`` for any other."""
    inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap2) else None
    if kind == "flat" and isinstance(inner, faiss.IndexFlat):
        return index, inner
    if kind == "hnsw" and isinstance(inner, faiss.IndexHNSWFlat):
        storage = faiss.downcast_index(inner.storage)
        if isinstance(storage, faiss.IndexFlat):
            return index, inner, storage, inner.hnsw
    return None


def _views_left(objects: tuple[Any, ...]) -> bool:
    """Whether any vector of ``objects`` (from :func:`_mapped`) is still a view (not owned)."""
    names = ("codes", "id_map", "neighbors", "offsets", "levels", "assign_probas", "cum_nneighbor_per_level")
    return any(not getattr(getattr(o, n), "is_owned", True) for o in objects for n in names if hasattr(type(o), n))


def list_room(sizes: np.ndarray, extra: int) -> np.ndarray:
    """The capacity (rows) to give each IVF list of ``sizes`` (nlist,) so that ``extra`` rows more fit without one
    list growing: ``s + ceil(mu + 4 sqrt(mu) + 8)`` with ``mu = extra (s + 1) / (n + nlist)`` (``n = sum(sizes)``).

    A new row lands in list ``i`` about as often as the rows so far did (``mu``: its share of ``extra``, smoothed by
    one row so that empty lists and an empty index get some); the count a list receives varies like a Poisson
    count, so four standard deviations plus 8 rows cover every list of an index of thousands of lists unless the
    new rows come from elsewhere (a list outgrowing its room grows by doubling, as before).
    """
    sizes = np.asarray(sizes, np.int64)
    if extra <= 0:
        return sizes.copy()
    mu = extra * (sizes + 1) / float(sizes.sum() + sizes.shape[0])
    return sizes + np.ceil(mu + 4 * np.sqrt(mu) + 8).astype(np.int64)


def give_lists_room(index, capacities: np.ndarray, step: Callable[[], AbstractContextManager] = nullcontext) -> bool:
    """Give each list ``i`` of an IVF ``index`` (``ArrayInvertedLists``) room for ``capacities[i]`` rows (codes and
    ids) without making the room resident; the lists' contents do not change. Returns whether it was done (an
    IVF index on other inverted lists, another system or an unchecked FAISS: left as it is).

    Through FAISS's public API, one list at a time: its ``s`` rows and ids are copied out, ``invlists.resize(i, 0)``
    then ``resize(i, capacity)`` reallocates its two vectors from empty, so to exactly that capacity (libstdc++;
    at least that in any library), every element zeroed; ``resize(i, s)`` keeps the capacity (a ``std::vector``
    never reallocates to shrink), the pages wholly inside the spare part ``[s, capacity)`` are given back
    (:func:`_release`; ``get_codes`` / ``get_ids`` point at the vectors' storage: checked for
    :data:`CHECKED_FAISS`) and ``update_entries`` writes the rows back. (Growing the list in place instead would
    reallocate to ``max(2 s, capacity)``, whose part past ``capacity`` this could not give back: served from
    freed resident heap, it was held.) The old buffers go back to ``malloc``, which serves the next lists from
    them; ``malloc_trim(0)`` returns what is left to the system (glibc). Holds one list more at any time. A list
    that cannot get its room (``MemoryError``) is put back as it was (no allocation) and the error raised. Each
    list inside ``with step():`` (the index's write side, when searches read it meanwhile).
    """
    inv = faiss.downcast_InvertedLists(index.invlists) if isinstance(index, faiss.IndexIVF) else None
    if not isinstance(inv, faiss.ArrayInvertedLists) or not IVF_ROOM:
        return False
    width = int(inv.code_size)
    for i, cap in enumerate(np.asarray(capacities, np.int64).tolist()):
        if cap > int(inv.list_size(i)):
            with step():
                _list_room(inv, i, cap, width)
    trim_heap()
    return True


def _list_room(inv, i: int, cap: int, width: int) -> None:
    """List ``i`` of ``inv`` with room for ``cap`` rows, more than it holds (:func:`give_lists_room`)."""
    s = int(inv.list_size(i))
    codes = faiss.rev_swig_ptr(inv.get_codes(i), s * width).copy() if s else None
    ids = faiss.rev_swig_ptr(inv.get_ids(i), s).copy() if s else None
    inv.resize(i, 0)
    try:
        inv.resize(i, cap)
    except BaseException:  # MemoryError (bad_alloc): the vectors kept their buffers (capacity s): put them back
        inv.resize(i, s)
        if s:
            inv.update_entries(i, 0, s, faiss.swig_ptr(ids), faiss.swig_ptr(codes))
        raise
    inv.resize(i, s)
    _release(int(inv.get_codes(i)) + s * width, (cap - s) * width)
    _release(int(inv.get_ids(i)) + s * 8, (cap - s) * 8)
    if s:
        inv.update_entries(i, 0, s, faiss.swig_ptr(ids), faiss.swig_ptr(codes))


def ivf_room(index, rows: int, step: Callable[[], AbstractContextManager] = nullcontext) -> bool:
    """Give every list of the IVF ``index`` room for its share of ``rows`` rows more (:func:`list_room`,
    :func:`give_lists_room`): a snapshot just read, or one this process wrote (its log starts empty). Returns
    whether it was done (not IVF on ``ArrayInvertedLists``, or :data:`IVF_ROOM` off: nothing changes)."""
    if not isinstance(index, faiss.IndexIVF):
        return False
    sizes = np.array([index.invlists.list_size(i) for i in range(index.nlist)], np.int64)
    return give_lists_room(index, list_room(sizes, int(rows)), step)


def read_with_room(fh: BinaryIO, kind: str, room: Callable[[int], int]) -> Any:
    """The FAISS index in the open snapshot file ``fh``, with room for ``room(n)`` rows more than the ``n`` it holds.

    Flat and HNSW through a read-only mapping of the file (module docstring) where this FAISS and system
    allow, otherwise ``read_index``; IVF by ``read_index``, then room in each list (:func:`give_lists_room`).
    FAISS reads the mapping with ``ZeroCopyIOReader`` (every field but the views read with exact bounds, as from
    a file; FAISS's own mapped reader rounds a last partial item up and reads past the end of a file cut short).
    The mapping is this function's: it is closed before returning, once no view of it is left. Raises what FAISS
    raises for a damaged file (``RuntimeError``).
    """
    size = os.fstat(fh.fileno()).st_size
    if kind == "ivf":
        index = faiss.read_index(faiss.PyCallbackIOReader(fh.read))
        ivf_room(index, int(room(int(index.ntotal))))
        return index
    if kind not in ("flat", "hnsw") or not MAPPED_READ or size == 0:
        return faiss.read_index(faiss.PyCallbackIOReader(fh.read))
    index = None
    with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapping:
        data = np.frombuffer(mapping, np.uint8)
        try:
            index = faiss.read_index(faiss.ZeroCopyIOReader(faiss.swig_ptr(data), size))
            objects = _mapped(index, kind)
            if objects is not None:
                n = int(index.ntotal)
                _give_room(index, kind, n + int(room(n)))
            if objects is None or _views_left(objects):  # a structure this module does not know: read it plainly
                index = objects = None
        except BaseException:
            index = objects = None  # its views go before the mapping
            raise
        finally:
            del data
    if index is None:
        fh.seek(0)
        return faiss.read_index(faiss.PyCallbackIOReader(fh.read))
    return index
