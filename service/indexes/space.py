"""One FAISS index of one space (:class:`SpaceIndex`): build, add, delete, search, stay current.

An index holds rows of one space (``dim`` columns) under int64 ids, with an optional JSON payload per id. The FAISS
structure per kind is in :mod:`.kinds`, CSLS in :mod:`.csls`, the files in :mod:`.persist`, the locks in
:mod:`.locking`.

Writers (add / delete / save): one at a time per index across threads (a thread lock) and processes (``flock`` on
``<path>/.lock``) for the whole read-modify-persist. Inside the lock the writer first reloads the persisted
generation when it is newer than the in-memory one (so ids, ``next_id`` and conflicts are checked against every
acknowledged row), applies the change under the write side of the :class:`~.locking.RWLock`, and persists generation
``g + 1`` without it (searches go on meanwhile: :mod:`.changes`). A change that fails after touching the in-memory
index is undone by reloading the persisted state. An add hides its rows from searches until it is persisted, then
shows them under the write side at once; an HNSW add (graph insertion: seconds for tens of thousands of rows)
takes the write side per chunk of rows (:func:`~.kinds.add_rows`).

Readers: before a search one ``stat`` of ``meta.json`` (inode, size, mtime) tells whether another process persisted
since; only then is the meta read and, if its generation is newer, that generation loaded — without any writer lock
(generation files are immutable once a meta names them) — and swapped in under the write side. A reader never waits
for another process's writer. Each index has a ``uid``: a copy of a dropped (or dropped and re-created) index
answers :class:`IndexNotFoundError` instead of writing into the new one.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from align.exceptions import InputError
from align.validation import as_matrix, check_csls_weight

from ..limits import MAX_ID, check_dim, check_index_params
from .changes import Changes
from .csls import CSLS_WEIGHT, HubCache, csls_search
from .device import DeviceRows
from .errors import (
    IndexConflictError,
    NewerFormatError,
    UnreadableGenerationError,
    gone,
)
from .info import IndexInfo
from .kinds import (
    KINDS,
    METRICS,
    DeadSlots,
    ListPlan,
    add_rows,
    check_name,
    choose_kind,
    ids_array,
    live_ids,
    make_index,
    plan_lists,
    prep_rows,
    reserve,
    search_key,
    search_kind,
    search_work,
    tombstone_slots,
)
from .locking import RWLock, WouldBlock, flock, meta_sig, still_linked
from .persist import (
    FORMAT,
    FORMAT_VERSION,
    KEEP_OLD_GENERATIONS,
    LOAD_ATTEMPTS,
    LOCK_FILE,
    SEEDED_LOG,
    Delta,
    apply_delta,
    collect_generations,
    log_fits,
    log_of,
    log_rows,
    missed,
    not_read,
    params_of,
    read_current,
    read_deltas,
    read_generation,
    read_meta,
    seed_of_meta,
    snapshot_wanted,
    stored_params,
    uid_of,
    write_generation,
)
from .room import ivf_room

__all__ = ["SpaceIndex", "IndexInfo", "SMALL_SEARCH_WORK"]

#: Multiply-adds a search may cost to run on the event loop (``SpaceIndex.small_search``): a 1-query
#: search of a flat index of 8,192 x 384 rows (3.1 M) took ~0.15 ms with FAISS on one core here.
SMALL_SEARCH_WORK = 1 << 22


@dataclass
class SpaceIndex(Changes):
    """One FAISS index of one space, with ids, payloads and its own lock. Build with :meth:`build`."""

    name: str
    space: str
    dim: int
    kind: str
    metric: str
    params: dict
    index: Any
    payloads: dict[int, Any] = field(default_factory=dict)
    tombstones: set[int] = field(default_factory=set)  # HNSW: deleted slots of the graph (positions, not ids)
    next_id: int = 0
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    description: str = ""
    path: Path | None = None
    generation: int = 0
    uid: str = ""

    def __post_init__(self) -> None:
        self.lock = RWLock()
        self._hubs = HubCache()
        self._writer = threading.Lock()  # writers of this process queue here, then on the flock
        self._refresh_lock = threading.Lock()  # one loader of a newer generation at a time
        self._meta_sig: tuple | None = None  # stat_sig of the meta.json the in-memory copy matches
        self._unreadable_sig: tuple | None = None  # stat_sig of a meta.json whose generation could not be read
        self._base = 0  # the snapshot generation the in-memory state started from (persist: snapshot + log)
        self._log: list[tuple[int, int]] = []  # [(generation, rows)] replayed after it
        self._base_rows = 0  # rows of that snapshot (log_fits)
        self._recent_bases: list[int] = []  # snapshots of the last metas (collect_generations keeps them)
        self._seeded_log, self._log_seed = True, 0  # the log's HNSW adds: seeded with add_seed(_log_seed, g) or g
        self._committing = False  # this process's writer holds the flock (refresh: nothing newer to read)
        self._shown: int | None = None  # slots from here on belong to an add not committed yet (searches skip)
        self._hidden = None  # IVF: the selector of the rows an add not committed yet does not hold (kinds.hidden_ids)
        self._dead = DeadSlots()  # HNSW: the selector skipping self.tombstones, built once per set
        self._changes, self._device = 0, DeviceRows()  # counts changes of the rows in memory; their copy on a GPU
        self.observer = None  # told of each generation held and each catch-up (IndexStore's: the metrics)
        if not self.uid:
            self.uid = uuid.uuid4().hex

    # --- construction -----------------------------------------------------------------------
    @classmethod
    def build(cls, name: str, space: str, vectors, *, ids=None, payloads=None, kind: str = "auto",
              metric: str = "cosine", params: dict | None = None, random_state: int = 0,
              description: str = "", path: Path | None = None, dim: int | None = None,
              more: Iterable[tuple[Any, Any, Any]] = (), train=None, rows: int | None = None,
              again: Callable[[], Iterable[Any]] | None = None) -> SpaceIndex:
        """Create an index from ``vectors`` (n, d); ``kind="auto"`` chooses by ``n``.

        ``params``: ``{"M": 32, "ef_construction": 80, "ef_search": 64}`` for HNSW,
        ``{"nlist": .., "nprobe": .., "train_rows": 64 nlist}`` for IVF (``nprobe``:
        :func:`~service.limits.default_nprobe`, ~1,500 rows scanned, at least 16). ``dim`` allows an empty index (no
        vectors).
        ``more``: further blocks ``(X (m, d), ids or None, payloads or None)`` added in memory before the
        index is returned (a file streamed block by block; nothing is persisted per block). ``train``
        (t, d): the rows IVF's k-means trains on (default ``vectors``; a sample of the whole file when
        ``vectors`` is only its first block), or a function returning them (checked finite rows, made for this:
        called only when the index is made, scaled in place and freed once trained, so no caller holds them
        while the rows are added). ``rows``: how many rows ``vectors`` and ``more`` hold together,
        when known: the storage is sized for them once (:func:`~.kinds.reserve`) instead of doubling per block.
        IVF sizes each list once for its rows (:func:`~.kinds.plan_lists`) from a first pass over them: ``vectors``
        and ``more`` when ``more`` is a list or tuple, else ``again()`` (the rows of every block, ``X (m, d)``, once
        more, as ``more`` gives them: a file read again); neither (a one-shot stream): the lists double as they fill.
        """
        check_name(name)
        if metric not in METRICS:
            raise InputError(f"metric must be one of {METRICS}, got {metric!r}")
        if dim is not None:
            dim = check_dim(dim)
        if vectors is None or (hasattr(vectors, "__len__") and len(vectors) == 0 and dim is not None):
            X = np.zeros((0, int(dim)), np.float32)
        else:
            X = as_matrix(vectors, name="vectors", dim=dim)
        n, d = X.shape
        check_dim(d, "vectors: columns")
        if kind == "auto":
            kind = choose_kind(n)
        if kind not in KINDS:
            raise InputError(f"kind must be 'auto' or one of {KINDS}, got {kind!r}")
        own = callable(train)  # rows drawn for training only: scaled in place, dropped once trained
        T = X if train is None else as_matrix(train() if own else train, name="training rows", dim=d, finite=not own)
        params = check_index_params(kind, params, n_rows=T.shape[0], dim=d, random_state=random_state)
        random_state = int(random_state)  # checked above: a whole number (3.0 is 3)
        index = make_index(kind, T, metric, params, random_state, overwrite=own, n_rows=max(n, rows or 0))
        del T
        params["random_state"] = random_state
        obj = cls(name=name, space=space, dim=d, kind=kind, metric=metric, params=params, index=index,
                  description=description, path=path)
        if n:
            reserve(index, kind, rows or 0)
            plan = None
            if kind == "ivf" and (again is not None or isinstance(more, (list, tuple))):
                first = again() if again is not None else [X, *(block[0] for block in more)]  # in memory: twice
                plan = plan_lists(index, (obj._prepared(as_matrix(Xm, name="vectors", dim=d)) for Xm in first))
            obj._add(X, ids, payloads, plan=plan)
            for Xm, ids_m, payloads_m in more:
                obj._add(as_matrix(Xm, name="vectors", dim=d), ids_m, payloads_m, plan=plan)
            if plan is not None:
                plan.finish()
        elif (ids is not None and len(ids)) or (payloads is not None and len(payloads)):
            raise InputError("ids / payloads were given without vectors: an empty index has no rows for them "
                             "(send vectors or texts with them, or add them later)")
        return obj

    @classmethod
    def load(cls, path: Path) -> SpaceIndex:
        """Read the generation ``path/meta.json`` names (retrying when a writer moves on meanwhile)."""
        path = Path(path)
        meta, index, payloads, sig = read_current(path)
        obj = cls(name=meta["name"], space=meta["space"], dim=int(meta["dim"]), kind=meta["kind"],
                  metric=meta["metric"], params=params_of(meta), index=index, created_at=meta["created_at"],
                  path=path, uid=uid_of(meta))
        obj._adopt(meta, index, payloads, sig)
        return obj

    # --- facts ------------------------------------------------------------------------------
    @property
    def count(self) -> int:
        """Live rows searches see (not the rows of an add in progress)."""
        shown = self._shown
        return (int(self.index.ntotal) if shown is None else shown) - len(self.tombstones)

    @property
    def logged_deltas(self) -> int:
        """Deltas logged since the snapshot of the generation in memory (0: that generation is a snapshot)."""
        return len(self._log)

    def info(self) -> IndexInfo:
        return IndexInfo(self.name, self.space, self.dim, self.kind, self.metric, self.count,
                         {k: v for k, v in self.params.items()}, self.created_at, self.updated_at, self.description,
                         self.generation, self.logged_deltas)

    def _live_ids(self) -> np.ndarray:
        """Ids of every live row, an add in progress included (the writer's view: for clashes and deletes)."""
        return live_ids(self.index, self.kind, self.tombstones)

    def has_ids(self, ids: np.ndarray) -> np.ndarray:
        """Boolean mask: which of ``ids`` are stored (and not deleted)."""
        return np.isin(ids, self._live_ids())

    def get_payloads(self, ids: np.ndarray) -> list:
        return [self.payloads.get(int(i)) for i in ids]

    # --- writes (caller holds the write lock, or the object is not shared yet) ----------------
    def _prepared(self, X) -> np.ndarray:
        """Rows ``X`` (m, dim) checked and as stored (:func:`~.kinds.prep_rows`), in memory of their own (a block
        mapped from a ``.npy`` is read here, not later under the writer lock)."""
        return np.require(prep_rows(as_matrix(X, name="vectors", dim=self.dim), self.metric), np.float32, ["C", "O"])

    def _add(self, X: np.ndarray, ids, payloads, seed: int | None = None, plan: ListPlan | None = None,
             prepared: bool = False, step=None) -> Delta:
        """Add ``X`` (n, dim); returns the change as a :class:`~.persist.Delta` of the next generation. ``seed``
        (:func:`~.kinds.add_seed`): the add is logged, so it must be replayable; ``plan``: IVF lists found already,
        ``step``: HNSW chunks each inside ``with step():`` (:func:`~.kinds.add_rows`). ``prepared``: ``X`` is
        :meth:`_prepared`."""
        n = X.shape[0]
        if payloads is not None and (not isinstance(payloads, list) or len(payloads) != n):
            raise InputError(f"payloads: expected a list of {n} JSON values (one per vector)")
        rows = X if prepared else self._prepared(X)  # bad rows are told as such, before any id is drawn or checked
        if ids is None:
            if self.next_id + n > MAX_ID:
                raise InputError(f"index {self.name!r}: automatic ids would pass 2**62 (an id near 2**62 was stored "
                                 "before explicit ids stopped at 2**61); give explicit ids")
            ids_arr = np.arange(self.next_id, self.next_id + n, dtype=np.int64)
        else:
            ids_arr = ids_array(ids, n, explicit=True)
            clash = ids_arr[np.isin(ids_arr, self._live_ids())]
            if clash.size:
                raise IndexConflictError(
                    f"{clash.size} id(s) already in index {self.name!r} (first: {int(clash[0])}); delete them first")
        add_rows(self.index, self.kind, rows, ids_arr, seed, plan, step)
        added = {}
        if payloads is not None:
            added = {i: p for i, p in zip(ids_arr.tolist(), payloads) if p is not None}
            self.payloads.update(added)
        self.next_id = max(self.next_id, int(ids_arr.max()) + 1) if n else self.next_id
        self._changed()
        return Delta(self.generation + 1, "add", ids_arr, rows, added)

    def add(self, vectors, *, ids=None, payloads=None) -> np.ndarray:
        """Add ``vectors`` (n, dim) under ``ids`` (default: past any id ever held); returns the ids. Persisted before
        it returns; with a ``path``, checked and applied against the newest persisted generation under its lock."""
        X = as_matrix(vectors, name="vectors", dim=self.dim)
        with self._writing():
            return self._write_adds([(X, ids, payloads)], log=True)

    def add_blocks(self, blocks: Iterable[tuple[Any, Any, Any]]) -> np.ndarray:
        """Add every block ``(X (m, dim), ids or None, payloads or None)`` as ONE new generation (a snapshot);
        returns the ids of all rows.

        For a file streamed block by block. Every block is first read, checked and prepared (``prep_rows``: unit
        rows for cosine) without any lock, so other writers of the index (other processes too) and searches go on
        however slow the file or the encoder; a bad block (bad rows, the file cut short) is refused there and
        nothing is written. Then, under the writer lock, the rows are added to the newest generation (automatic
        ids drawn and explicit ones checked for clashes there: an add that landed meanwhile counts) and persisted
        once; a failure there leaves the index as it was. Memory: the prepared rows of all blocks (n x dim float32,
        private: not the file's pages), each freed once FAISS holds its copy, which the index keeps anyway.
        """
        staged = deque((self._prepared(X), ids_m, payloads_m) for X, ids_m, payloads_m in blocks)
        if not staged:
            return np.zeros(0, np.int64)
        with self._writing():
            return self._write_adds(staged, log=False, prepared=True)

    def _changed(self, updated_at: float | None = None) -> None:
        self.updated_at, self._changes = time.time() if updated_at is None else updated_at, self._changes + 1
        self._hubs.clear()

    # --- search -----------------------------------------------------------------------------
    def search(self, Q, k: int = 10, *, exact: bool = False, ef_search: int | None = None,
               nprobe: int | None = None, csls_k: int = 0, csls_weight: float = CSLS_WEIGHT, wait: bool = True,
               with_payloads: bool = False, finite: bool = False) -> tuple:
        """Top-``k`` rows for each query row of ``Q`` (n, dim; ``finite=True``: the caller has checked its values);
        ``csls_k > 0`` re-ranks by CSLS, the document term scaled by ``csls_weight`` in ``[0, 2]`` (0.5; :mod:`.csls`).

        ``wait=False`` (the event loop's fast path): raise :class:`~service.indexes.locking.WouldBlock`, before
        searching, unless the search is small (:meth:`small_search`), the index in memory is the newest generation
        and no writer holds or waits for the lock.

        Returns
        -------
        S : ndarray (n, k) float32 — cosine (or inner product), or CSLS score when ``csls_k > 0``; ``-inf`` padding
        I : ndarray (n, k) int64 — ids, ``-1`` where fewer than ``k`` rows exist (or are found)
        P : list (n) of lists (k) of payloads (``None`` where ``I`` is ``-1``), only with ``with_payloads``: read under
            the search's read lock (read after it, a write between paired its ids with another generation's payloads)
        """
        Q = as_matrix(Q, name="queries", dim=self.dim, finite=not finite)
        if not 1 <= int(k) <= 10_000:
            raise InputError(f"k must be between 1 and 10000, got {k}")
        if csls_k < 0 or csls_k > 1000:
            raise InputError(f"csls_k must be between 0 and 1000, got {csls_k}")
        csls_weight = check_csls_weight(csls_weight)
        Q = np.ascontiguousarray(prep_rows(Q, self.metric, "queries"))
        if wait:
            self.refresh()
        elif not (self.small_search(Q.shape[0], int(k), exact=exact, ef_search=ef_search, nprobe=nprobe,
                                    csls_k=csls_k) and self.is_current()):
            raise WouldBlock("not a small search of the current generation")
        with self.lock.read(blocking=wait):
            if csls_k > 0:
                def search(X, kk):
                    return self._search(X, kk, exact, ef_search, nprobe)

                settings = search_key(self.index, self.kind, self.params, exact, ef_search, nprobe)
                S, I = csls_search(Q, int(k), int(csls_k), self.count, search, self.index.reconstruct, self._hubs,
                                   weight=csls_weight, settings=settings)
            else:
                S, I = self._search(Q, int(k), exact, ef_search, nprobe)
                S[I < 0] = -np.inf  # FAISS pads with -FLT_MAX; CSLS and an empty index with -inf: -inf always
            if with_payloads:  # the generation the search ran on: no writer swaps or changes it meanwhile
                return S, I, [[self.payloads.get(i) if i >= 0 else None for i in row] for row in I.tolist()]
            return S, I

    def search_cost(self, n: int, k: int, *, exact: bool = False, ef_search: int | None = None,
                    nprobe: int | None = None, csls_k: int = 0) -> int:
        """Estimated multiply-adds of a search of ``n`` queries (:func:`~service.indexes.kinds.search_work`); with
        CSLS, its candidates' search and the ``r(d)`` neighbourhoods of up to ``n x`` candidates rows."""
        def work(m: int, kk: int) -> int:
            return search_work(self.index, self.kind, self.params, self.dim, m, kk, exact, ef_search, nprobe)

        if csls_k <= 0:
            return work(n, k)
        kc = max(4 * k, k + csls_k)  # as csls_search's candidates
        return work(n, kc) + work(min(n * kc, max(self.count, 1)), csls_k)

    def small_search(self, n: int, k: int, *, exact: bool = False, ef_search: int | None = None,
                     nprobe: int | None = None, csls_k: int = 0) -> bool:
        """Whether ``n`` queries cost at most :data:`SMALL_SEARCH_WORK` multiply-adds (~0.2 ms on one core;
        the estimate per kind: :func:`~service.indexes.kinds.search_work`). CSLS is never small."""
        if csls_k > 0 or n < 1:
            return False
        return self.search_cost(n, k, exact=exact, ef_search=ef_search, nprobe=nprobe) <= SMALL_SEARCH_WORK

    def is_current(self) -> bool:
        """Whether the generation in memory is the newest persisted one (one ``stat``; never loads)."""
        return self.path is None or self._committing or meta_sig(self.path) == self._meta_sig

    def _search(self, Q, k, exact, ef_search, nprobe):
        if self.kind == "flat" and self._shown is None and (
                found := self._device.search(self.index, self._changes, Q, k)) is not None:
            return found  # Settings.search_device: on a GPU (.device)
        return search_kind(self.index, self.kind, self.params, self._dead.selector(self.tombstones), Q, k, exact,
                           ef_search, nprobe, self._shown, self._hidden)

    # --- persistence and other processes -------------------------------------------------
    def save(self) -> None:
        """Persist the in-memory state as a new generation (under the cross-process writer lock)."""
        with self._writing():  # no other writer: searches read the index the snapshot reads
            self._save()

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """One writer at a time across threads and processes, starting from the newest generation; raises
        :class:`IndexNotFoundError` when another process dropped the index meanwhile."""
        with self._writer, ExitStack() as stack:
            if self.path is None:
                yield
                return
            fresh = self.generation == 0  # built here, never persisted: may create its folder
            lock_path = self.path / LOCK_FILE
            try:
                fd = stack.enter_context(flock(lock_path, create_dir=fresh))
            except FileNotFoundError:  # the folder is gone
                raise gone(self.name) from None
            if not still_linked(fd, lock_path):  # the folder was renamed away while we waited
                raise gone(self.name)
            with self._refresh_lock:
                if not (fresh and meta_sig(self.path) is None):
                    self._sync(force=True)  # a writer reads the meta itself, never trusting a signature alone
                # no other process writes while we hold the flock: the meta it renames is ours, and searches must
                # not queue on _refresh_lock behind the rest of the write (the room, old generations collected)
                self._committing = True
                try:
                    yield
                finally:
                    self._committing = False

    @contextmanager
    def _undo_on_failure(self, changed: bool = False, locked: bool = True) -> Iterator[None]:
        """If a change fails after touching the in-memory index, go back to the persisted state.

        Input and conflict errors are raised before anything changes, so they keep the copy, unless
        ``changed`` (a change of several blocks: an earlier block is in memory already). ``locked``: the caller
        holds the write side (else the persisted state is read without it and swapped in under it).
        """
        try:
            yield
        except (InputError, IndexConflictError):
            if changed:
                self._reload_persisted(locked)
            raise
        except BaseException:
            self._reload_persisted(locked)
            raise

    def _reload_persisted(self, locked: bool = True) -> None:
        """Go back to the persisted generation (after a failed change); a forced reload if it cannot be read."""
        if self.path is None:
            return
        try:
            meta = read_meta(self.path)
            if uid_of(meta) == self.uid:
                index, payloads = read_generation(self.path, meta)
                with nullcontext() if locked else self.lock.write():
                    self._adopt(meta, index, payloads, meta_sig(self.path))
        except Exception:  # noqa: BLE001 - keep the first error; force a reload on next access
            self._meta_sig = None
            self.generation = -1

    def refresh(self) -> bool:
        """Catch up with a generation another process persisted; ``True`` if one was loaded. Costs one ``stat`` when
        nothing changed. Raises :class:`IndexNotFoundError` when another process dropped (or re-created) the index."""
        if self.path is None or self._committing:  # this process's writer: memory holds what it commits
            return False
        sig = meta_sig(self.path)
        if sig is not None and sig in (self._meta_sig, self._unreadable_sig):  # the latter: said once, not re-read
            return False
        with self._refresh_lock:
            return self._sync()

    def _unreadable(self, sig, exc: BaseException) -> UnreadableGenerationError:
        """Remember that the generation ``meta.json`` (``sig``) names cannot be read; the error saying so."""
        self._unreadable_sig = sig
        return UnreadableGenerationError(
            f"index {self.name!r}: its newest generation on disk could not be read ({type(exc).__name__}: "
            f"{str(exc)[:200]}); generation {self.generation} is served until a readable one is written")

    def _sync(self, force: bool = False) -> bool:
        """Caller holds ``_refresh_lock``: load the persisted generation if it is newer.

        ``force``: read the meta even when its :func:`~.locking.stat_sig` is the one in memory (a writer about
        to build on the newest generation: a signature can repeat, see :func:`~.persist._write_meta`).
        """
        assert self.path is not None
        misses: set = set()
        for _ in range(LOAD_ATTEMPTS):
            sig = meta_sig(self.path)  # before reading: at worst one extra read later
            if sig is None:
                raise gone(self.name)
            if sig == self._meta_sig and not force:
                return False
            try:
                meta = read_meta(self.path)
            except FileNotFoundError:
                continue
            except NewerFormatError:  # never readable here: the generation in memory would be served for ever
                raise
            except Exception as exc:  # any unreadable meta: the caller decides (see _unreadable)
                raise self._unreadable(sig, exc) from exc
            if uid_of(meta) != self.uid:
                raise gone(self.name, "dropped and re-created by another process")
            if int(meta["generation"]) <= self.generation:
                self._meta_sig = sig
                return False
            t0 = time.perf_counter()
            try:
                if self._replays(meta):  # the same snapshot: read only the deltas after our generation
                    deltas = read_deltas(self.path, meta, self.generation)
                    with self.lock.write():
                        self._replay(meta, deltas, sig)
                    self._caught_up("replay", t0)
                    return True
                index, payloads = read_generation(self.path, meta)
            except FileNotFoundError as exc:  # collected after newer generations: read the meta again
                misses.add(missed(self.path, sig, exc))
                continue
            except Exception as exc:  # a file cut short or corrupt: FAISS, JSON or check errors
                raise self._unreadable(sig, exc) from exc
            with self.lock.write():
                self._adopt(meta, index, payloads, sig)
            self._caught_up("reload", t0)
            return True
        err = not_read(self.path, misses)
        if isinstance(err, UnreadableGenerationError):  # a file gone from the generation meta.json names
            raise self._unreadable(sig, err) from err
        raise err

    def _caught_up(self, how: str, t0: float) -> None:
        """Tell the observer of a catch-up (``replay``: deltas applied, ``reload``: a generation read whole) that
        began at ``perf_counter()`` ``t0``."""
        if self.observer is not None:
            self.observer.index_caught_up(self.name, how, time.perf_counter() - t0)

    def _replays(self, meta: dict) -> bool:
        """Whether the generation ``meta`` names is ours plus deltas: same snapshot, ours not older than it."""
        base, _ = log_of(meta)
        return self.generation > 0 and base == self._base and self.generation >= base

    def _replay(self, meta: dict, deltas: list[Delta], sig) -> None:
        """Apply ``deltas`` (read and checked) in place, then take ``meta`` (caller holds the write side); a failure
        part-way leaves a state no generation names: the next access reloads in full."""
        try:
            for delta in deltas:
                apply_delta(self.index, self.kind, self.payloads, delta, seed_of_meta(meta))
            self._take_meta(meta, sig)
        except BaseException:
            self._meta_sig = None
            self.generation = -1
            raise

    def _adopt(self, meta: dict, index, payloads: dict[int, Any], sig) -> None:
        """Replace the in-memory state by a persisted generation (caller holds the write side)."""
        self.index, self.payloads, self._shown, self._hidden = index, payloads, None, None
        self._take_meta(meta, sig)

    def _take_meta(self, meta: dict, sig) -> None:
        """The facts of ``meta`` for the index in memory, which holds its generation (caller holds the write side)."""
        self.tombstones = tombstone_slots(self.index, meta["kind"], meta)
        self.next_id = int(meta.get("next_id", 0))
        self.kind = meta["kind"]
        self.params = params_of(meta)
        self.description = meta.get("description", "")
        self._take_log(meta, sig)
        self._changed(meta["updated_at"])

    def _take_log(self, meta: dict, sig) -> None:
        """Which generation ``meta`` (read, or just written from this state) names, and its snapshot and log."""
        self.generation = int(meta["generation"])
        self._base, self._log = log_of(meta)
        self._base_rows = int(meta.get("base_rows", self.index.ntotal))
        self._recent_bases = [int(b) for b in meta.get("recent_bases") or [self._base]]
        self._seeded_log, self._log_seed = meta.get(SEEDED_LOG) is True, seed_of_meta(meta)  # persist.SEEDED_LOG
        self._meta_sig = sig
        if self.observer is not None:
            self.observer.index_changed(self)

    def _meta(self, gen: int) -> dict:
        return {
            "format": FORMAT, "format_version": FORMAT_VERSION, "generation": gen, "uid": self.uid,
            "name": self.name, "space": self.space, "dim": self.dim, "kind": self.kind, "metric": self.metric,
            **stored_params(self.params), "tombstone_slots": sorted(self.tombstones), "next_id": self.next_id,
            "created_at": self.created_at, "updated_at": self.updated_at, "description": self.description,
        }

    def _logs(self, rows: int) -> bool:
        """Whether a change of ``rows`` rows goes to the log (:func:`~.persist.log_fits`) rather than a snapshot."""
        if self.path is None or self.generation == 0 or snapshot_wanted(self.path):
            return False
        return log_fits(self._log, self._base_rows, self.kind, rows)

    def _save(self, delta: Delta | None = None) -> None:
        """Write generation ``g + 1`` (caller holds the writer lock, not the write side: searches go on reading the
        index meanwhile): ``delta`` appended to the log, or (``None``) a snapshot of the whole index, which then
        gets room for its log (:meth:`_make_room`; IVF: each list its share, the write side per list)."""
        if self.path is None:
            return
        gen, fresh = self.generation + 1, self.generation == 0  # fresh: built here (no room: _make_room)
        if delta is not None:
            assert delta.generation == gen, (delta.generation, gen)
            base, log, base_rows = self._base, [*self._log, (gen, int(delta.ids.size))], self._base_rows
        else:
            base, log, base_rows = gen, [], int(self.index.ntotal)
        meta = self._meta(gen)
        meta.update(base=base, log=log, base_rows=base_rows, **{SEEDED_LOG: delta is None or self._seeded_log},
                    recent_bases=[*self._recent_bases, base][-(KEEP_OLD_GENERATIONS + 1):])
        sig = write_generation(self.path, self.index, self.payloads, meta, delta)
        with self.lock.write():
            self._take_log(meta, sig)  # the rest of the meta was written from this state
        collect_generations(self.path, meta)
        if delta is None:  # the log starts empty: room for it
            with suppress(MemoryError):  # written already; without the room the rows grow by doubling
                ivf_room(self.index, log_rows(base_rows), self.lock.write)
            if not fresh:
                self._make_room(0)
