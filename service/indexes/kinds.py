"""FAISS structures per index kind: construction, row preparation per metric, live ids, search.

Kinds (``kind="auto"`` picks by the number of rows at creation, :func:`choose_kind`):

=========  ===================  =============================================================
kind       chosen when          structure
=========  ===================  =============================================================
flat       n < 50,000           ``IndexIDMap2(IndexFlatIP)``: exact; delete compacts
hnsw       50,000 ≤ n < 10⁶     ``IndexIDMap2(IndexHNSWFlat)``: approximate, ``ef_search``
                                per request; deletes are tombstones (slots of the graph)
                                filtered with an ``IDSelector`` and folded in by a rebuild
                                past 10 %; a deleted id added again takes a new slot
ivf        n ≥ 10⁶              ``IndexIVFFlat`` with native ids (``IndexIDMap2`` cannot
                                compact IVF lists), ``nprobe`` per request; k-means seeded
=========  ===================  =============================================================

With ``metric="cosine"`` rows and queries are scaled to unit length and scored by inner
product, so scores are cosines; ``metric="ip"`` keeps them as they are.

Search parameters travel with each call as ``faiss.SearchParameters*`` objects, never set
on the shared index, so concurrent searches with different settings do not interfere.
``exact=True`` scans every live row (for IVF: ``nprobe = nlist``; for HNSW: the flat
storage under the graph). These functions hold no locks: the caller does.
"""

from __future__ import annotations

import re
import threading
import zlib
from collections import deque
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import faiss
import numpy as np

from align.exceptions import InputError, NotRepresentableError
from align.frames import row_norms, unit_rows
from align.validation import check_no_zero_rows

from ..errors import shown as quoted
from ..limits import MAX_EF_SEARCH, MAX_EXPLICIT_ID, MAX_ID, default_nprobe, ivf_training
from ..threads import pin_thread

__all__ = ["FLAT_MAX", "HNSW_MAX", "KINDS", "METRICS", "NAME_RE", "TOMBSTONE_REBUILD", "ListPlan", "choose_kind",
           "check_name", "ids_array", "make_index", "prep_rows", "hnsw_chunk", "add_seed", "add_rows", "reserve",
           "plan_lists", "live_ids", "live_slots", "tombstone_slots", "rebuild_hnsw", "search_key", "search_kind",
           "search_work", "DeadSlots", "hidden_ids"]

FLAT_MAX = 50_000
HNSW_MAX = 1_000_000
KINDS = ("flat", "hnsw", "ivf")
METRICS = ("cosine", "ip")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # always fullmatch: no trailing newline
TOMBSTONE_REBUILD = 0.10  # HNSW: rebuild once tombstones pass this share of the stored rows
_TRAIN_BLOCK = 4096  # IVF training rows scaled per step (make_index): temporaries of one block only
HNSW_CHUNK_FLOATS, HNSW_CHUNK_MIN, HNSW_CHUNK_MAX = 1 << 18, 64, 4096  # rows per HNSW insertion call: hnsw_chunk
_IP_MAX_NORM = 1e19  # metric="ip": |x|, |q| below sqrt(float32 max) so q·x cannot overflow


def choose_kind(n: int) -> str:
    """Index kind for ``n`` rows: flat below 50k, HNSW below 1M, IVF above."""
    if n < FLAT_MAX:
        return "flat"
    return "hnsw" if n < HNSW_MAX else "ivf"


def check_name(name: str) -> str:
    """``name`` when it is a valid index name; else InputError showing at most its first 40 characters (and its
    length): a 10,000-character name was repeated whole, a 10 KB 422 answer."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise InputError(f"index name {quoted(name)} is invalid: expected 1-128 characters from [A-Za-z0-9._-], "
                         "starting alphanumeric")
    return name


def ids_array(ids, n: int | None = None, *, name: str = "ids", merge_repeats: bool = False,
              explicit: bool = False) -> np.ndarray:
    """``ids`` as a flat int64 array in ``0 .. 2**62 - 1`` (``n`` of them when given); ``explicit``: ids a client
    gives rows (an add's), in ``0 .. 2**61 - 1`` (:data:`~service.limits.MAX_EXPLICIT_ID` says why).

    An id given twice is an :class:`InputError` (422: the request contradicts itself; nothing stored conflicts
    with it), or with ``merge_repeats`` (deletes) counted once: the sorted unique ids.
    """
    try:
        arr = np.asarray(ids)
    except Exception:
        raise InputError(f"{name}: expected a list of integers") from None
    span = "2**61 - 1 (ids from 2**61 up are left to automatic ids)" if explicit else "2**62 - 1"
    if arr.dtype == np.uint64 or arr.dtype == object or arr.dtype.kind == "f":  # past int64: json gives Python ints
        # numpy cannot hold (uint64, object; or float64 beside smaller ints: [5, 2**64 - 1] said "got dtype float64")
        items = ids if isinstance(ids, list) else arr.ravel().tolist()
        bad = [x for x in items if type(x) is int and not 0 <= x < MAX_ID][:1]
        if arr.dtype.kind != "f" or bad:
            raise InputError(f"{name}: ids must be integers between 0 and {span}"
                             + "".join(f"; {x} is not" for x in bad))
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise InputError(f"{name}: expected a flat list of integers, got dtype {arr.dtype} shape {arr.shape}")
    arr = arr.astype(np.int64)
    if n is not None and arr.shape[0] != n:
        raise InputError(f"{name}: expected {n} ids (one per vector), got {arr.shape[0]}")
    if arr.size and (arr.min() < 0 or arr.max() >= MAX_ID):
        raise InputError(f"{name}: ids must be between 0 and {span}; {int(arr.min() if arr.min() < 0 else arr.max())} "
                         "is not")
    if explicit and arr.size and arr.max() >= MAX_EXPLICIT_ID:
        raise InputError(f"{name}: {int(arr.max())} is past the explicit ids' range 0 .. 2**61 - 1 (ids from 2**61 up "
                         "are left to automatic ids, which count past the largest id ever held: an explicit id there "
                         "would leave them none)")
    unique = np.unique(arr)
    if merge_repeats:
        return unique
    if unique.shape[0] != arr.shape[0]:
        raise InputError(f"{name}: the same id appears more than once in the request")
    return arr


def _hnsw(d: int, params: dict, random_state: int):
    """An empty HNSW graph whose level generator starts from ``random_state`` (FAISS's own start is a constant)."""
    inner = faiss.IndexHNSWFlat(d, int(params["M"]), faiss.METRIC_INNER_PRODUCT)
    inner.hnsw.efConstruction = int(params["ef_construction"])
    inner.hnsw.rng = faiss.RandomGenerator(int(random_state) & 0x7FFFFFFF)
    return faiss.IndexIDMap2(inner)


def add_seed(random_state: int, generation: int) -> int:
    """The seed of the HNSW level generator for a logged add that becomes ``generation`` of an index seeded with
    ``random_state`` (:func:`add_rows`): the writer and every replay derive it alike. Seed 0 gives ``generation``,
    the seed such adds had before the index's seed took part: a log written so (a meta without
    :data:`~.persist.SEEDED_LOG`) is replayed and extended with 0 (:func:`~.persist.seed_of_meta`), as written."""
    return (int(random_state) * 0x9E3779B1 + int(generation)) & 0x7FFFFFFF


def make_index(kind: str, X: np.ndarray, metric: str, params: dict, random_state: int, *, overwrite: bool = False,
               n_rows: int | None = None):
    """An empty FAISS index of ``kind`` for rows like ``X`` (n, d); IVF is trained on ``X`` here.

    Fills ``params`` (checked by :func:`service.limits.check_index_params`) with the defaults
    used: ``M=32, ef_construction=80, ef_search=64`` (HNSW; each row's level drawn from ``random_state``), ``nlist``,
    ``nprobe`` (:func:`service.limits.default_nprobe` of the rows ``nlist`` is sized for: the index's ``n_rows``
    when ``params`` give ``nlist``, else ``n``; 16, more below ~140k rows), ``train_rows`` (IVF:
    :func:`service.limits.ivf_training`, default ``64 * nlist``, at most ``n``).
    IVF's k-means trains on ``train_rows`` rows drawn with ``random_state`` (every row when ``n`` is not larger),
    scaled to unit length (cosine) block by block into one array of the rows trained on: in ``X`` itself with
    ``overwrite`` (a sample the caller made for this), so training on ``t`` rows holds ``t x d`` floats once.
    ``X`` may be that sample already (a file's, drawn by the caller): ``n_rows`` is then the index's row count.
    """
    n, d = X.shape
    if kind == "flat":
        return faiss.IndexIDMap2(faiss.IndexFlatIP(d))
    if kind == "hnsw":
        params.setdefault("M", 32)
        params.setdefault("ef_construction", 80)
        params.setdefault("ef_search", 64)
        return _hnsw(d, params, random_state)
    if n == 0:
        raise InputError("an IVF index needs training vectors at creation")
    sized = bool(params.get("nlist"))  # by the caller (from every row of a file), not from these rows here
    nlist, cap = ivf_training(n, params)
    params["nlist"], params["train_rows"] = nlist, cap
    # of the rows nlist was sized for: the index's (n_rows) when the caller sized it (a file's nlist, from all its
    # rows), else the rows at hand (a text file's first block trains, and sizes, its lists: 26 for 1,024 texts)
    params.setdefault("nprobe", default_nprobe(max(n, n_rows or 0) if sized else n, nlist))
    if params["nprobe"] > nlist:
        raise InputError(f"index parameter nprobe={params['nprobe']} exceeds nlist={nlist}")
    if cap < nlist:
        raise InputError(f"index parameter train_rows={cap} is below nlist={nlist}: k-means needs a row per list")
    quantizer = faiss.IndexFlatIP(d)
    index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
    index.cp.seed = int(random_state)
    rng = np.random.default_rng(random_state)
    if n > cap:
        X, overwrite = X[np.sort(rng.choice(n, cap, replace=False))], True  # a copy of the rows drawn: ours
    if metric == "cosine":
        train = X if overwrite else np.empty_like(X, dtype=np.float32)
        for s in range(0, X.shape[0], _TRAIN_BLOCK):
            train[s:s + _TRAIN_BLOCK] = unit_rows(X[s:s + _TRAIN_BLOCK])  # row by row: the same rows as at once
        X = train
    index.train(np.ascontiguousarray(X, dtype=np.float32))
    index.set_direct_map_type(faiss.DirectMap.Hashtable)
    return index


#: Why a cosine index refuses an all-zero row, stored or searched (:func:`prep_rows`)
NO_DIRECTION = "a cosine index needs a direction (use metric='ip' to store zero rows)"


def prep_rows(X: np.ndarray, metric: str, what: str = "vectors", why: str = NO_DIRECTION) -> np.ndarray:
    """Rows as stored / searched: unit rows (cosine; exact at any finite scale) or as is (ip).

    Cosine refuses all-zero rows (no direction; ``why`` says so in the error); ``metric="ip"`` refuses rows with
    ``|x| > 1e19``: a score ``q·x`` of two of them would overflow float32 and the row could never be found again.
    """
    if metric == "cosine":
        # no direction: stored, it would score 0 against every query and never be found
        return check_no_zero_rows(unit_rows(X), name=what, why=why)
    if X.shape[0] == 1 and float(np.vdot(X, X)) < (_IP_MAX_NORM / 10) ** 2:  # one query, far below it (NaN is not):
        return X  # no exact norm needed (row_norms cost ~10 µs of a ~100 µs request)
    big = row_norms(X) > _IP_MAX_NORM
    if big.any():
        raise NotRepresentableError(
            f"{what}: {int(big.sum())} row(s) have a norm above {_IP_MAX_NORM:g}; inner products of such rows "
            f"overflow float32 (scale them down, or use metric='cosine')")
    return X


def slot_ids(index) -> np.ndarray:
    """The external id of each slot of an ``IndexIDMap2`` (ntotal,) int64: a view, valid while the index is
    not changed (the caller holds its lock)."""
    n = int(index.id_map.size())
    return faiss.rev_swig_ptr(index.id_map.data(), n) if n else np.zeros(0, np.int64)


def _slots(tombstones: set[int]) -> np.ndarray:
    return np.fromiter(tombstones, np.int64, len(tombstones))


def live_ids(index, kind: str, tombstones: set[int]) -> np.ndarray:
    """Ids stored in ``index`` and not deleted (int64, unordered; HNSW ``tombstones`` are slots)."""
    if kind == "ivf":
        inv = index.invlists
        parts = [faiss.rev_swig_ptr(inv.get_ids(i), inv.list_size(i)).copy()
                 for i in range(index.nlist) if inv.list_size(i)]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)
    ids = slot_ids(index).copy()
    return np.delete(ids, _slots(tombstones)) if tombstones else ids


def hnsw_chunk(dim: int) -> int:
    """Rows of ``dim`` columns an HNSW add inserts per FAISS call (:func:`add_rows`): 2**18 floats, 64 to 4,096 rows
    (682 rows of 384-d: ~0.1 s on one core into a 200k-row graph)."""
    return min(HNSW_CHUNK_MAX, max(HNSW_CHUNK_MIN, HNSW_CHUNK_FLOATS // max(int(dim), 1)))


def add_rows(index, kind: str, rows: np.ndarray, ids: np.ndarray, seed: int | None = None,
             plan: ListPlan | None = None, step: Callable[[], AbstractContextManager] | None = None) -> None:
    """Add prepared ``rows`` (n, d) float32 under ``ids`` (n,); with ``seed``, the same call gives the same index
    in any process. ``plan`` (IVF, :func:`plan_lists`): the rows' lists were found (and the lists sized) already.

    The persisted log of an index (:mod:`.persist`) is replayed by every other process onto the same
    snapshot, so a logged add must not depend on the history of the process that made it. Flat and IVF
    adds are deterministic already; an HNSW add draws each row's level from the graph's random
    generator, which FAISS does not store with the index (a loaded graph restarts it), and inserts rows
    in parallel with OpenMP. So with ``seed`` (:func:`add_seed` of the index's seed and the generation the add
    becomes) the HNSW generator is reseeded and the insertion runs on one OpenMP thread: a replay builds the very
    graph the writer built.
    Without it (adds persisted as a whole snapshot) the insertion keeps FAISS's threads.

    HNSW with ``seed`` or ``step`` inserts :func:`hnsw_chunk` rows per FAISS call (a call orders its rows by
    level, so the chunks are part of the graph a seeded add builds: a replay, which has no ``step``, cuts the same
    ones), each inside ``with step():`` when given: the writer takes the index's write side per chunk, so searches
    run between chunks instead of waiting for the whole insertion.
    """
    if plan is not None:  # FAISS's add without its search for the lists: the plan's (n,) int64, found on these rows
        lists, ids = plan.take(rows), np.ascontiguousarray(ids, dtype=np.int64)
        index.add_core(rows.shape[0], faiss.swig_ptr(rows), faiss.swig_ptr(ids), faiss.swig_ptr(lists))
        return
    if kind != "hnsw" or (seed is None and step is None):
        index.add_with_ids(rows, ids)
        return
    before = faiss.omp_get_max_threads()
    if seed is not None:
        faiss.downcast_index(index.index).hnsw.rng = faiss.RandomGenerator(int(seed) & 0x7FFFFFFF)
        faiss.omp_set_num_threads(1)
    chunk = hnsw_chunk(rows.shape[1])
    try:
        for s in range(0, rows.shape[0], chunk):
            with (step or nullcontext)():
                index.add_with_ids(rows[s:s + chunk], ids[s:s + chunk])
    finally:
        faiss.omp_set_num_threads(before)


def reserve(index, kind: str, rows: int) -> None:
    """Size the flat storage of an empty ``index`` (flat; HNSW's storage under the graph) and its id map for
    ``rows`` rows, so that adding them block by block reallocates neither.

    FAISS holds those rows in one ``std::vector`` of ``ntotal x d x 4`` bytes that grows by doubling: a block
    added past its capacity copies every row so far into a buffer twice as large, so at that moment the process
    holds the old buffer and the copy (up to twice the rows; a 1M x 384 flat index built from 16 blocks peaked
    at 1,814 MiB for 1,465 MiB of rows). Resizing to the final size and back keeps that capacity (a vector
    never gives capacity back when it shrinks). Only for an empty index: growing a full one of ``S`` rows by
    ``m`` this way holds ``2S + m`` at once, more than doubling does unless ``m`` is large and unlucky. IVF keeps
    one vector per list: :func:`plan_lists` sizes them.
    """
    if rows <= 0 or kind == "ivf" or index.ntotal:
        return
    inner = faiss.downcast_index(index.index)
    storage = faiss.downcast_index(inner.storage) if kind == "hnsw" else inner
    for vec, width in ((storage.codes, storage.code_size), (index.id_map, 1)):
        vec.resize(int(rows) * width)
        vec.resize(0)


_CHANGED = ("the rows changed between the two passes over them (a file written while it was read?): "
            "nothing was stored")


class ListPlan:
    """The IVF list of each row of a build, found block by block before any row is added (:func:`plan_lists`) and
    taken back by :func:`add_rows` in the same order; each block is known again by the CRC-32 of its rows."""

    def __init__(self) -> None:
        self._blocks: deque[tuple[int, np.ndarray]] = deque()

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The lists (n,) int64 of the next block, which must be ``rows`` (n, d) again (InputError otherwise)."""
        if not self._blocks or self._blocks[0][0] != zlib.crc32(rows) or self._blocks[0][1].shape[0] != len(rows):
            raise InputError(_CHANGED)
        return self._blocks.popleft()[1]

    def finish(self) -> None:
        """Every planned block was added (InputError: fewer blocks came the second time)."""
        if self._blocks:
            raise InputError(_CHANGED)


def plan_lists(index, blocks: Iterable[np.ndarray]) -> ListPlan:
    """Find the list of every row an empty, trained IVF ``index`` is about to get, and allocate each list once for
    exactly its rows.

    ``blocks``: the prepared rows (m, d) float32 (:func:`prep_rows`), block by block as they will be added. A
    row's list is its nearest centroid (``quantizer.assign``: what FAISS's add computes, on the same blocks, so
    the same lists). FAISS keeps a list's rows and ids in ``std::vector``\\ s that grow by doubling: added row by
    row, a list ends between 1x and 2x its size (~1.4x on average, held; a 1M x 384 index 2,036 MiB for
    1,465 MiB of rows) and copies itself at each doubling. A vector resized from empty gets exactly the capacity
    asked, and keeps it when resized back to 0: ``invlists.resize(list, count)`` then ``resize(list, 0)`` per list
    (public FAISS API; the ``count x d x 4`` bytes are written once, as the adds would). The adds that follow
    (:func:`add_rows` with the plan: ``add_core``, no second search) fill each list without reallocating it, in the
    same order as before: the index is the same byte for byte. Costs one more pass over the rows (the search
    moves here; the plan keeps 8 bytes per row). Later adds grow the lists they touch by doubling, as before.
    """
    if index.ntotal:
        raise ValueError("plan_lists sizes the lists of an empty index")
    nlist = int(index.nlist)
    plan, counts = ListPlan(), np.zeros(nlist, np.int64)
    for rows in blocks:
        lists = np.ascontiguousarray(index.quantizer.assign(rows, 1).reshape(-1), dtype=np.int64)
        counts += np.bincount(lists[lists >= 0], minlength=nlist)
        plan._blocks.append((zlib.crc32(rows), lists))
    inv = index.invlists
    for i in np.flatnonzero(counts).tolist():
        inv.resize(i, int(counts[i]))  # from empty: capacity exactly counts[i] rows and ids
        inv.resize(i, 0)  # size 0, the capacity stays
    return plan


def live_slots(index, ids: np.ndarray, tombstones: set[int]) -> np.ndarray:
    """HNSW: the slots holding the live rows of ``ids`` (a deleted id added again also has dead slots)."""
    id_map = slot_ids(index)
    live = np.isin(id_map, ids)
    live[_slots(tombstones)] = False
    return np.nonzero(live)[0]


def tombstone_slots(index, kind: str, meta: dict) -> set[int]:
    """The tombstones a persisted ``meta`` names, as slots of ``index``.

    ``format_version`` 1 stored HNSW tombstones as ids (each stored once then, as a re-added id forced a
    rebuild); 2 stores slots. Raises ``ValueError`` for a slot outside the index.
    """
    if kind != "hnsw":
        return set()
    if int(meta.get("format_version", 1)) < 2:
        dead = np.nonzero(np.isin(slot_ids(index), np.asarray(meta.get("tombstones", []), np.int64)))[0]
    else:
        dead = np.asarray(meta.get("tombstone_slots", []), np.int64)
    if dead.size and not (0 <= dead.min() and dead.max() < index.ntotal):
        raise ValueError(f"tombstone slots outside 0..{index.ntotal - 1}")
    return set(dead.tolist())


def rebuild_hnsw(index, dim: int, params: dict, tombstones: set[int]):
    """A new HNSW index (``IndexIDMap2``) holding the live rows of ``index``: tombstoned slots dropped."""
    inner = faiss.downcast_index(index.index)
    storage = faiss.downcast_index(inner.storage)
    xb = faiss.rev_swig_ptr(storage.get_xb(), storage.ntotal * dim).reshape(-1, dim)
    ids = slot_ids(index)
    keep = np.ones(ids.shape, bool)
    keep[_slots(tombstones)] = False
    X, ids = np.ascontiguousarray(xb[keep]), ids[keep]
    fresh = _hnsw(dim, params, params.get("random_state", 0))
    if ids.size:
        fresh.add_with_ids(X, ids)
    return fresh


def _nprobe(params: dict, nprobe: int | None) -> int:
    """IVF lists probed: the request's ``nprobe``, else the index's (16 for one recorded without it)."""
    return int(nprobe or params.get("nprobe", 16))


def _ef(params: dict, ef_search: int | None) -> int:
    """HNSW search breadth: the request's ``ef_search``, else the index's (default 64)."""
    return int(ef_search or params.get("ef_search", 64))


def search_key(index, kind: str, params: dict, exact: bool, ef_search: int | None, nprobe: int | None) -> tuple:
    """The settings a search of ``kind`` effectively runs with: equal keys, equal results on the same rows.

    Flat: ``()`` (always exact); IVF: the lists probed (``nlist`` when exact); HNSW: ``("exact",)`` or the
    request's ``ef_search`` (else the index's). Caches of values computed by searches (CSLS ``r(d)``) key by it.
    """
    if kind == "flat":
        return ()
    if kind == "ivf":
        return ("nprobe", int(index.nlist) if exact else _nprobe(params, nprobe))
    return ("exact",) if exact else ("ef_search", _ef(params, ef_search))


def search_work(index, kind: str, params: dict, dim: int, n: int, k: int, exact: bool, ef_search: int | None,
                nprobe: int | None) -> int:
    """Estimated multiply-adds of :func:`search_kind` for ``n`` queries of width ``dim``.

    Flat: ``n x rows x dim``; IVF: ``n x nprobe x rows/nlist x dim``; HNSW: ``n x max(ef, k) x 32 x dim``
    (about 32 distances per visited node). Exact HNSW / IVF searches count as flat.
    """
    rows = max(int(index.ntotal), 1)
    if kind == "flat" or exact:
        return n * rows * dim
    if kind == "ivf":
        nlist = max(int(index.nlist), 1)
        return n * min(_nprobe(params, nprobe), nlist) * -(-rows // nlist) * dim
    return n * max(_ef(params, ef_search), k) * 32 * dim


class DeadSlots:
    """HNSW: the FAISS selector that skips one set of tombstoned slots, built once per set and shared by the
    searches (they run at once under the read side).

    A set of tombstones is replaced, never changed in place (:class:`~.space.SpaceIndex`), so the set object is the
    key; the selector is a bitmap of the dead slots (one bit a slot: 125 kB at 1M) behind ``IDSelectorNot``, a bit
    test per visited node. Built per search before, it cost a Python set copied and hashed: 15 ms per search at
    100k tombstones, for a graph search of ~1 ms. ``builds`` counts the selectors made.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cached: tuple[Any, ...] | None = None  # (tombstones, selector, its parts: kept alive with it)
        self.builds = 0

    def selector(self, tombstones: set[int]):
        """The selector of the slots not in ``tombstones`` (``None`` when it is empty)."""
        if not tombstones:
            return None
        cached = self._cached
        if cached is None or cached[0] is not tombstones:
            with self._lock:
                cached = self._cached
                if cached is None or cached[0] is not tombstones:
                    dead = np.zeros(max(tombstones) + 1, bool)
                    dead[_slots(tombstones)] = True
                    bits = np.packbits(dead, bitorder="little")
                    inner = faiss.IDSelectorBitmap(bits)
                    cached = self._cached = (tombstones, faiss.IDSelectorNot(inner), inner, bits)
                    self.builds += 1
        return cached[1]


def hidden_ids(ids: np.ndarray):
    """IVF: the selector of the rows whose ids are not ``ids`` (an add not committed yet: searches skip it)."""
    return faiss.IDSelectorNot(faiss.IDSelectorBatch(np.ascontiguousarray(ids, np.int64)))


def search_kind(index, kind: str, params: dict, dead, Q: np.ndarray, k: int, exact: bool,
                ef_search: int | None, nprobe: int | None, shown: int | None = None, hidden=None) -> tuple[Any, Any]:
    """Top-``k`` of prepared queries ``Q`` (n, d): ``S`` (n, k) float32 scores, ``I`` (n, k) int64 ids (-1: none).

    Rows of an add not committed yet never appear: flat and HNSW slots ``>= shown``, IVF rows ``hidden`` lets
    through (:func:`hidden_ids`); nor HNSW slots ``dead`` skips (:meth:`DeadSlots.selector`: the tombstones).
    ``nprobe`` / ``ef_search`` default to the index's params.
    """
    if index.ntotal == 0:
        return np.full((Q.shape[0], k), -np.inf, np.float32), np.full((Q.shape[0], k), -1, np.int64)
    pin_thread()  # OpenMP's thread count is per calling thread: set it in the request's worker thread
    hiding = kind != "ivf" and shown is not None and shown < index.ntotal
    committed = faiss.IDSelectorRange(0, int(shown)) if hiding else None
    if kind == "flat" and committed is None:
        return index.search(Q, k)
    if kind == "ivf":
        nlist = int(index.nlist)
        probe = nlist if exact else _nprobe(params, nprobe)
        if not 1 <= probe <= nlist:
            raise InputError(f"nprobe must be between 1 and nlist={nlist}, got {probe}")
        ivf = faiss.SearchParametersIVF(nprobe=probe) if hidden is None else faiss.SearchParametersIVF(
            nprobe=probe, sel=hidden)
        return index.search(Q, k, params=ivf)
    # flat (an add not committed), hnsw: search the rows (or the graph) by slot, skipping tombstoned and hidden
    # slots; slots -> ids
    sel = committed if dead is None else dead if committed is None else faiss.IDSelectorAnd(committed, dead)
    if not (exact or kind == "flat"):
        ef = _ef(params, ef_search)
        if not 1 <= ef <= MAX_EF_SEARCH:  # the bound HTTP's ef_search and the CLI's --ef-search have
            raise InputError(f"ef_search must be between 1 and {MAX_EF_SEARCH}, got {ef}")
        if sel is None:  # nothing to skip: the id map's own search (slots -> ids in FAISS, as below)
            return index.search(Q, k, params=_hnsw_params(max(ef, k)))
    inner = faiss.downcast_index(index.index)
    if exact or kind == "flat":
        sp = faiss.SearchParameters(sel=sel) if sel is not None else None
        S, I = (inner if kind == "flat" else faiss.downcast_index(inner.storage)).search(Q, k, params=sp)
    else:
        S, I = inner.search(Q, k, params=faiss.SearchParametersHNSW(efSearch=max(ef, k), sel=sel))
    return S, np.where(I >= 0, slot_ids(index)[np.maximum(I, 0)], -1)


_HNSW_PARAMS: dict[int, Any] = {}


def _hnsw_params(ef: int):
    """``SearchParametersHNSW(efSearch=ef)`` without a selector, made once per ``ef`` and shared (FAISS only reads
    it): made per search, it and the downcast of the graph cost ~15 µs of a batch-1 search of ~0.1 ms."""
    sp = _HNSW_PARAMS.get(ef)
    if sp is None:
        if len(_HNSW_PARAMS) >= 256:  # bounded: ef_search comes with requests
            _HNSW_PARAMS.clear()
        sp = _HNSW_PARAMS[ef] = faiss.SearchParametersHNSW(efSearch=ef)
    return sp
