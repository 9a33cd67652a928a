"""FAISS indexes per embedding space: build, add, delete, search, persist; one writer each.

An index holds rows of one space (``dim`` columns) under int64 ids, with an optional JSON
payload per id. With ``metric="cosine"`` (the default) rows and queries are scaled to unit
length and scored by inner product, so scores are cosines.

Kinds (``kind="auto"`` picks by the number of rows at creation):

=========  ===================  =============================================================
kind       chosen when          structure
=========  ===================  =============================================================
flat       n < 50,000           ``IndexIDMap2(IndexFlatIP)``: exact; delete compacts
hnsw       50,000 ≤ n < 10⁶     ``IndexIDMap2(IndexHNSWFlat)``: approximate, ``ef_search``
                                per request; deletes are tombstones filtered with an
                                ``IDSelector`` and folded in by a rebuild past 10 %
ivf        n ≥ 10⁶              ``IndexIVFFlat`` with native ids (``IndexIDMap2`` cannot
                                compact IVF lists), ``nprobe`` per request; k-means seeded
=========  ===================  =============================================================

Search parameters travel with each call as ``faiss.SearchParameters*`` objects, never set
on the shared index, so concurrent searches with different settings do not interfere.
``exact=True`` scans every live row (for IVF: ``nprobe = nlist``; for HNSW: the flat
storage under the graph).

CSLS re-ranking (``csls_k > 0``) fetches ``max(4k, k + csls_k)`` candidates by cosine and
re-scores them as

.. math::  \\mathrm{CSLS}(q, d) = 2\\cos(q, d) - r(q) - r(d)

where ``r(q)`` is the mean of the query's top ``csls_k`` cosines (exact: they are the first
candidates) and ``r(d)`` is the mean cosine of ``d`` to its ``csls_k`` nearest *stored* rows
(a density proxy for hubness: the population of mapped queries is not known to the index).
``r(d)`` is computed on demand and cached until the next write.

Concurrency, one process: a writer-preferring readers–writer lock per index. Searches share
the read side (FAISS releases the GIL, so they run in parallel); the in-memory change and the
save of an add / delete take the write side, so a search never sees a half-applied batch.

Concurrency, several processes on one data dir (``uvicorn --workers N``): every process keeps
its own in-memory copy, and the files are the truth.

* Writers: an add / delete / create / drop holds an exclusive ``fcntl.flock`` on
  ``root/<name>/.lock`` for its whole read-modify-persist. Inside the lock it first reloads the
  persisted generation when that is newer than the in-memory one (so ids, ``next_id`` and
  conflicts are checked against every acknowledged row), applies the change and persists
  generation ``g + 1``. Writers of one process also queue on a thread lock, so a process holds
  one descriptor per index.
* Readers: before a search (and on every :meth:`IndexStore.get`) one ``stat`` of ``meta.json``
  (inode, size, mtime) tells whether another process persisted since; only then is the meta
  read and, if its generation is newer, that generation loaded — without any writer lock,
  which is safe because generation files are immutable once a meta names them — and swapped
  in under the write side. A reader never waits for another process's writer.
* Create builds the index in ``root/.create-*`` and renames the folder into place under
  ``root/.store.lock``; drop renames the folder away (``root/.trash-*``) under both locks and
  then removes it, so other processes see an index appear or vanish atomically. Each index has
  a ``uid`` in its meta: a process holding a copy of a dropped (or dropped and re-created) index
  answers :class:`IndexNotFoundError` instead of writing into the new one.
* ``flock`` needs a local file system (not NFS).

Persistence: ``root/<name>/meta.json`` names the current generation; ``index.<gen>.faiss``
and ``payloads.<gen>.json`` are written to temporary names, fsynced and renamed first, and
``meta.json`` is replaced atomically last (then the folder is fsynced), so a crash leaves the
previous generation readable. The two generations before the current one are kept for
readers that read an older meta and are still loading; older ones are removed by the next
writer. Nothing is pickled.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import threading
import time
import uuid
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import faiss
import numpy as np

from align.validation import as_matrix
from align.exceptions import DegenerateInputError, InputError, NotRepresentableError

from align.frames import row_norms, unit_rows

from .errors import ConflictError, NotFoundError

from .storage import atomic_write, fsync_dir
from .limits import MAX_ID, check_dim, check_index_params, default_nlist

__all__ = [
    "IndexStore", "SpaceIndex", "RWLock", "IndexNotFoundError", "IndexConflictError", "choose_kind",
    "FLAT_MAX", "HNSW_MAX",
]

FLAT_MAX = 50_000
HNSW_MAX = 1_000_000
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # always fullmatch: no trailing newline
_IP_MAX_NORM = 1e19  # metric="ip": |x|, |q| below sqrt(float32 max) so q·x cannot overflow
_LOAD_LOCK_STRIPES = 64
_KINDS = ("flat", "hnsw", "ivf")
_METRICS = ("cosine", "ip")
_TOMBSTONE_REBUILD = 0.10
_KEEP_OLD_GENERATIONS = 2  # kept for readers that read an older meta and are still loading
_LOAD_ATTEMPTS = 8
_LOCK_FILE = ".lock"
_STORE_LOCK = ".store.lock"
_STALE_CREATE_S = 24 * 3600


class IndexNotFoundError(NotFoundError):
    """No index with that name."""


class IndexConflictError(ConflictError):
    """The index or one of the ids already exists."""


def choose_kind(n: int) -> str:
    """Index kind for ``n`` rows: flat below 50k, HNSW below 1M, IVF above."""
    if n < FLAT_MAX:
        return "flat"
    return "hnsw" if n < HNSW_MAX else "ivf"


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise InputError(
            f"index name {name!r} is invalid: expected 1-128 characters from [A-Za-z0-9._-], starting alphanumeric")
    return name


def _gone(name: str, why: str = "dropped") -> IndexNotFoundError:
    return IndexNotFoundError(f"index {name!r} not found ({why}); GET /v1/indexes lists the existing ones")


@contextmanager
def _flock(lock_path: Path, *, create_dir: bool = False) -> Iterator[int]:
    """Exclusive ``flock`` on ``lock_path`` (created if missing) for the ``with`` body.

    Raises ``FileNotFoundError`` when the folder does not exist (and ``create_dir`` is false).
    The kernel releases the lock when the descriptor closes, also when the process dies.
    """
    if create_dir:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)  # releases the lock


def _still_linked(fd: int, lock_path: Path) -> bool:
    """Whether the locked file is still the one at ``lock_path`` (false once its folder was renamed away)."""
    try:
        st = os.stat(lock_path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _stat_sig(path: Path) -> tuple[int, int, int, int] | None:
    """Cheap change token of a file (device, inode, size, mtime ns); ``None`` when missing.

    ``meta.json`` is always replaced by a rename, so a new meta has a new inode.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _uid_of(meta: dict) -> str:
    """Identity of one index's life (a dropped and re-created index has another); older metas lack ``uid``."""
    return str(meta.get("uid") or f"created:{meta['created_at']!r}")


def _read_meta(path: Path) -> dict:
    meta = json.loads((path / "meta.json").read_text())
    if meta.get("format") != "vecbridge.SpaceIndex":
        raise InputError(f"{path} is not a vecbridge index")
    return meta


def _read_generation(path: Path, meta: dict) -> tuple[Any, dict[int, Any]]:
    """The FAISS index and payloads of the generation ``meta`` names.

    Raises ``FileNotFoundError`` when the generation was already garbage-collected (a newer
    meta exists: read it again). Both files are opened before either is read, so a removal
    during the read does not matter.
    """
    gen = int(meta["generation"])
    with open(path / f"index.{gen}.faiss", "rb") as fi, open(path / f"payloads.{gen}.json", "rb") as fp:
        index = faiss.read_index(faiss.PyCallbackIOReader(fi.read))
        payloads = {int(i): p for i, p in json.loads(fp.read())}
    return index, payloads


class RWLock:
    """Writer-preferring readers–writer lock (``with lock.read(): ...`` / ``with lock.write(): ...``)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._waiting_writers = 0

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            while self._writer or self._waiting_writers:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._waiting_writers += 1
            try:
                while self._writer or self._readers:
                    self._cond.wait()
            finally:
                self._waiting_writers -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


@dataclass
class IndexInfo:
    name: str
    space: str
    dim: int
    kind: str
    metric: str
    count: int
    params: dict
    created_at: float
    updated_at: float
    description: str = ""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _ids_array(ids, n: int | None = None, *, name: str = "ids") -> np.ndarray:
    try:
        arr = np.asarray(ids)
    except Exception:
        raise InputError(f"{name}: expected a list of integers") from None
    if arr.dtype == np.uint64 or arr.dtype == object:  # past int64: json gives Python ints numpy cannot hold
        raise InputError(f"{name}: ids must be integers between 0 and 2**62 - 1")
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise InputError(f"{name}: expected a flat list of integers, got dtype {arr.dtype} shape {arr.shape}")
    arr = arr.astype(np.int64)
    if n is not None and arr.shape[0] != n:
        raise InputError(f"{name}: expected {n} ids (one per vector), got {arr.shape[0]}")
    if arr.size and (arr.min() < 0 or arr.max() >= MAX_ID):
        raise InputError(f"{name}: ids must be between 0 and 2**62 - 1")
    if np.unique(arr).shape[0] != arr.shape[0]:
        raise IndexConflictError(f"{name}: the same id appears more than once in the request")
    return arr


@dataclass
class SpaceIndex:
    """One FAISS index of one space, with ids, payloads and its own lock. Build with :meth:`build`."""

    name: str
    space: str
    dim: int
    kind: str
    metric: str
    params: dict
    index: Any
    payloads: dict[int, Any] = field(default_factory=dict)
    tombstones: set[int] = field(default_factory=set)
    next_id: int = 0
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    description: str = ""
    path: Path | None = None
    generation: int = 0
    uid: str = ""

    def __post_init__(self) -> None:
        self.lock = RWLock()
        self._hub_cache: dict[tuple[int, int], float] = {}
        self._hub_lock = threading.Lock()
        self._writer = threading.Lock()  # writers of this process queue here, then on the flock
        self._refresh_lock = threading.Lock()  # one loader of a newer generation at a time
        self._meta_sig: tuple | None = None  # _stat_sig of the meta.json the in-memory copy matches
        if not self.uid:
            self.uid = uuid.uuid4().hex

    # --- construction -----------------------------------------------------------------------
    @classmethod
    def build(cls, name: str, space: str, vectors, *, ids=None, payloads=None, kind: str = "auto",
              metric: str = "cosine", params: dict | None = None, random_state: int = 0,
              description: str = "", path: Path | None = None, dim: int | None = None) -> "SpaceIndex":
        """Create an index from ``vectors`` (n, d); ``kind="auto"`` chooses by ``n``.

        ``params``: ``{"M": 32, "ef_construction": 80, "ef_search": 64}`` for HNSW,
        ``{"nlist": .., "nprobe": 16}`` for IVF. ``dim`` allows an empty index (no vectors).
        """
        check_name(name)
        if metric not in _METRICS:
            raise InputError(f"metric must be one of {_METRICS}, got {metric!r}")
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
        if kind not in _KINDS:
            raise InputError(f"kind must be 'auto' or one of {_KINDS}, got {kind!r}")
        params = check_index_params(kind, params, n_rows=n, dim=d, random_state=random_state)
        if kind == "flat":
            index = faiss.IndexIDMap2(faiss.IndexFlatIP(d))
        elif kind == "hnsw":
            params.setdefault("M", 32)
            params.setdefault("ef_construction", 80)
            params.setdefault("ef_search", 64)
            inner = faiss.IndexHNSWFlat(d, int(params["M"]), faiss.METRIC_INNER_PRODUCT)
            inner.hnsw.efConstruction = int(params["ef_construction"])
            index = faiss.IndexIDMap2(inner)
        else:
            if n == 0:
                raise InputError("an IVF index needs training vectors at creation")
            nlist = int(params.get("nlist") or default_nlist(n))
            params["nlist"] = nlist
            params.setdefault("nprobe", min(16, nlist))
            if params["nprobe"] > nlist:
                raise InputError(f"index parameter nprobe={params['nprobe']} exceeds nlist={nlist}")
            quantizer = faiss.IndexFlatIP(d)
            index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
            index.cp.seed = int(random_state)
            train = X if metric == "ip" else unit_rows(X)
            rng = np.random.default_rng(random_state)
            cap = 256 * nlist
            if train.shape[0] > cap:
                train = train[np.sort(rng.choice(train.shape[0], cap, replace=False))]
            index.train(np.ascontiguousarray(train))
            index.set_direct_map_type(faiss.DirectMap.Hashtable)
        params["random_state"] = int(random_state)
        obj = cls(name=name, space=space, dim=d, kind=kind, metric=metric, params=params, index=index,
                  description=description, path=path)
        if n:
            obj._add(X, ids, payloads)
        return obj

    # --- facts ------------------------------------------------------------------------------
    @property
    def count(self) -> int:
        return int(self.index.ntotal) - len(self.tombstones)

    def info(self) -> IndexInfo:
        return IndexInfo(self.name, self.space, self.dim, self.kind, self.metric, self.count,
                         {k: v for k, v in self.params.items()}, self.created_at, self.updated_at, self.description)

    def _prep(self, X: np.ndarray, what: str = "vectors") -> np.ndarray:
        """Rows as stored / searched: unit rows (cosine; exact at any finite scale) or as is (ip).

        Cosine refuses all-zero rows (no direction); ``metric="ip"`` refuses rows with ``|x| > 1e19``: a score ``q·x`` of two of them would
        overflow float32 and the row could never be found again.
        """
        if self.metric == "cosine":
            U = unit_rows(X)
            zero = ~U.any(axis=1)
            if zero.any():  # no direction: stored, it would score 0 against every query and never be found
                raise DegenerateInputError(f"{what}: {int(zero.sum())} all-zero row(s); a cosine index needs a "
                                           f"direction (use metric='ip' to store zero rows)")
            return U
        big = row_norms(X) > _IP_MAX_NORM
        if big.any():
            raise NotRepresentableError(
                f"{what}: {int(big.sum())} row(s) have a norm above {_IP_MAX_NORM:g}; inner products of such rows "
                f"overflow float32 (scale them down, or use metric='cosine')")
        return X

    def _live_ids(self) -> np.ndarray:
        if self.kind == "ivf":
            inv = self.index.invlists
            parts = [faiss.rev_swig_ptr(inv.get_ids(i), inv.list_size(i)).copy()
                     for i in range(self.index.nlist) if inv.list_size(i)]
            return np.concatenate(parts) if parts else np.zeros(0, np.int64)
        ids = faiss.vector_to_array(self.index.id_map).astype(np.int64)
        if self.tombstones:
            ids = ids[~np.isin(ids, np.fromiter(self.tombstones, np.int64))]
        return ids

    def has_ids(self, ids: np.ndarray) -> np.ndarray:
        """Boolean mask: which of ``ids`` are stored (and not deleted)."""
        return np.isin(ids, self._live_ids())

    # --- writes (caller holds the write lock, or the object is not shared yet) ----------------
    def _add(self, X: np.ndarray, ids, payloads) -> np.ndarray:
        n = X.shape[0]
        if ids is None:
            if self.next_id + n > MAX_ID:
                raise InputError(f"index {self.name!r}: automatic ids would pass 2**62; give explicit ids")
            ids_arr = np.arange(self.next_id, self.next_id + n, dtype=np.int64)
        else:
            ids_arr = _ids_array(ids, n)
            live = self._live_ids()
            clash = ids_arr[np.isin(ids_arr, live)]
            if clash.size:
                raise IndexConflictError(
                    f"{clash.size} id(s) already in index {self.name!r} (first: {int(clash[0])}); delete them first")
        if payloads is not None:
            if not isinstance(payloads, list) or len(payloads) != n:
                raise InputError(f"payloads: expected a list of {n} JSON values (one per vector)")
        if self.kind == "hnsw" and self.tombstones and np.isin(ids_arr, np.fromiter(self.tombstones, np.int64)).any():
            self._rebuild()
        self.index.add_with_ids(np.ascontiguousarray(self._prep(X)), ids_arr)
        if payloads is not None:
            for i, p in zip(ids_arr.tolist(), payloads):
                if p is not None:
                    self.payloads[i] = p
        self.next_id = max(self.next_id, int(ids_arr.max()) + 1) if n else self.next_id
        self._changed()
        return ids_arr

    def add(self, vectors, *, ids=None, payloads=None) -> np.ndarray:
        """Add rows ``vectors`` (n, dim) under ``ids`` (default: the next free ids); returns the ids.

        Persisted before it returns; with a ``path``, checked and applied against the newest
        persisted generation under the cross-process writer lock.
        """
        X = as_matrix(vectors, name="vectors", dim=self.dim)
        with self._writing():
            with self.lock.write(), self._undo_on_failure():
                out = self._add(X, ids, payloads)
                self._save()
        return out

    def delete(self, ids) -> int:
        """Delete ``ids``; returns how many were present. Unknown ids are ignored."""
        ids_arr = _ids_array(ids)
        with self._writing():
            with self.lock.write(), self._undo_on_failure():
                present = ids_arr[self.has_ids(ids_arr)]
                if present.size == 0:
                    return 0
                if self.kind == "hnsw":
                    self.tombstones.update(present.tolist())
                    if len(self.tombstones) > _TOMBSTONE_REBUILD * max(1, self.index.ntotal):
                        self._rebuild()
                else:
                    removed = self.index.remove_ids(present)
                    assert removed == present.size, (removed, present.size)
                for i in present.tolist():
                    self.payloads.pop(i, None)
                self._changed()
                self._save()
                return int(present.size)

    def _rebuild(self) -> None:
        """HNSW only: rebuild the graph from live rows, dropping tombstones."""
        inner = faiss.downcast_index(self.index.index)
        storage = faiss.downcast_index(inner.storage)
        xb = faiss.rev_swig_ptr(storage.get_xb(), storage.ntotal * self.dim).reshape(-1, self.dim)
        ids = faiss.vector_to_array(self.index.id_map).astype(np.int64)
        keep = ~np.isin(ids, np.fromiter(self.tombstones, np.int64)) if self.tombstones else np.ones(ids.shape, bool)
        X, ids = np.ascontiguousarray(xb[keep]), ids[keep]
        fresh = faiss.IndexHNSWFlat(self.dim, int(self.params["M"]), faiss.METRIC_INNER_PRODUCT)
        fresh.hnsw.efConstruction = int(self.params["ef_construction"])
        index = faiss.IndexIDMap2(fresh)
        if ids.size:
            index.add_with_ids(X, ids)
        self.index = index
        self.tombstones = set()

    def _changed(self) -> None:
        self.updated_at = time.time()
        with self._hub_lock:
            self._hub_cache.clear()

    # --- search -----------------------------------------------------------------------------
    def search(self, Q, k: int = 10, *, exact: bool = False, ef_search: int | None = None,
               nprobe: int | None = None, csls_k: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` rows for each query row of ``Q`` (n, dim).

        Returns
        -------
        S : ndarray (n, k) float32 — cosine (or inner product), or CSLS score when ``csls_k > 0``
        I : ndarray (n, k) int64 — ids, ``-1`` where fewer than ``k`` rows exist
        """
        Q = as_matrix(Q, name="queries", dim=self.dim)
        if not 1 <= int(k) <= 10_000:
            raise InputError(f"k must be between 1 and 10000, got {k}")
        if csls_k < 0 or csls_k > 1000:
            raise InputError(f"csls_k must be between 0 and 1000, got {csls_k}")
        Q = np.ascontiguousarray(self._prep(Q, "queries"))
        self.refresh()
        with self.lock.read():
            if csls_k > 0:
                return self._search_csls(Q, int(k), int(csls_k), exact, ef_search, nprobe)
            return self._search(Q, int(k), exact, ef_search, nprobe)

    def _search(self, Q, k, exact, ef_search, nprobe):
        if self.index.ntotal == 0:
            return np.full((Q.shape[0], k), -np.inf, np.float32), np.full((Q.shape[0], k), -1, np.int64)
        if self.kind == "flat":
            return self.index.search(Q, k)
        if self.kind == "ivf":
            nlist = int(self.index.nlist)
            probe = nlist if exact else int(nprobe or self.params.get("nprobe", 16))
            if not 1 <= probe <= nlist:
                raise InputError(f"nprobe must be between 1 and nlist={nlist}, got {probe}")
            return self.index.search(Q, k, params=faiss.SearchParametersIVF(nprobe=probe))
        # hnsw
        sel = None
        if self.tombstones:
            sel = faiss.IDSelectorNot(faiss.IDSelectorBatch(np.fromiter(self.tombstones, np.int64)))
        if exact:
            inner = faiss.downcast_index(self.index.index)
            storage = faiss.downcast_index(inner.storage)
            id_map = faiss.vector_to_array(self.index.id_map).astype(np.int64)
            params = None
            if self.tombstones:
                dead = np.nonzero(np.isin(id_map, np.fromiter(self.tombstones, np.int64)))[0].astype(np.int64)
                inner_sel = faiss.IDSelectorNot(faiss.IDSelectorBatch(dead))
                params = faiss.SearchParameters(sel=inner_sel)
            S, I = storage.search(Q, k, params=params)
            return S, np.where(I >= 0, id_map[np.maximum(I, 0)], -1)
        ef = int(ef_search or self.params.get("ef_search", 64))
        if not 1 <= ef <= 100_000:
            raise InputError(f"ef_search must be between 1 and 100000, got {ef}")
        return self.index.search(Q, k, params=faiss.SearchParametersHNSW(efSearch=max(ef, k), sel=sel))

    def _hubness(self, ids: np.ndarray, csls_k: int, exact, ef_search, nprobe) -> np.ndarray:
        """``r(d)`` for each id: mean cosine to its ``csls_k`` nearest other stored rows."""
        out = np.empty(ids.shape[0], np.float32)
        missing = []
        with self._hub_lock:
            for j, i in enumerate(ids.tolist()):
                v = self._hub_cache.get((i, csls_k))
                if v is None:
                    missing.append(j)
                else:
                    out[j] = v
        if missing:
            todo = ids[missing]
            X = np.vstack([self.index.reconstruct(int(i)) for i in todo]).astype(np.float32)
            S, I = self._search(np.ascontiguousarray(X), csls_k + 1, exact, ef_search, nprobe)
            valid = (I >= 0) & (I != todo[:, None])
            r = np.empty(todo.shape[0], np.float32)
            for j in range(todo.shape[0]):
                s = S[j][valid[j]][:csls_k]
                r[j] = float(s.mean()) if s.size else 0.0
            out[missing] = r
            with self._hub_lock:
                for i, v in zip(todo.tolist(), r.tolist()):
                    self._hub_cache[(i, csls_k)] = v
        return out

    def _search_csls(self, Q, k, csls_k, exact, ef_search, nprobe):
        n_live = max(1, self.count)
        kc = min(n_live, max(4 * k, k + csls_k))
        S, I = self._search(Q, kc, exact, ef_search, nprobe)
        r_q = np.array([s[i >= 0][:csls_k].mean() if (i >= 0).any() else 0.0 for s, i in zip(S, I)], np.float32)
        flat = I[I >= 0]
        uniq = np.unique(flat)
        r_map = dict(zip(uniq.tolist(), self._hubness(uniq, csls_k, exact, ef_search, nprobe).tolist()))
        r_d = np.vectorize(lambda i: r_map.get(int(i), 0.0), otypes=[np.float32])(I) if I.size else I.astype(np.float32)
        C = np.where(I >= 0, 2.0 * S - r_q[:, None] - r_d, -np.inf).astype(np.float32)
        order = np.argsort(-C, axis=1, kind="stable")[:, :k]
        S_out = np.take_along_axis(C, order, axis=1)
        I_out = np.take_along_axis(I, order, axis=1)
        if S_out.shape[1] < k:
            pad = k - S_out.shape[1]
            S_out = np.pad(S_out, ((0, 0), (0, pad)), constant_values=-np.inf)
            I_out = np.pad(I_out, ((0, 0), (0, pad)), constant_values=-1)
        return S_out, I_out

    def get_payloads(self, ids: np.ndarray) -> list:
        return [self.payloads.get(int(i)) for i in ids]

    # --- persistence and other processes -------------------------------------------------
    def save(self) -> None:
        """Persist the in-memory state as a new generation (under the cross-process writer lock)."""
        with self._writing():
            with self.lock.write():
                self._save()

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """One writer at a time across threads and processes, starting from the newest generation.

        Raises :class:`IndexNotFoundError` when another process dropped the index meanwhile.
        """
        with self._writer, ExitStack() as stack:
            if self.path is None:
                yield
                return
            fresh = self.generation == 0  # built here, never persisted: may create its folder
            lock_path = self.path / _LOCK_FILE
            try:
                fd = stack.enter_context(_flock(lock_path, create_dir=fresh))
            except FileNotFoundError:  # the folder is gone
                raise _gone(self.name) from None
            if not _still_linked(fd, lock_path):  # the folder was renamed away while we waited
                raise _gone(self.name)
            with self._refresh_lock:
                if not (fresh and _stat_sig(self.path / "meta.json") is None):
                    self._sync()
                yield

    @contextmanager
    def _undo_on_failure(self) -> Iterator[None]:
        """If a change fails after touching the in-memory index, go back to the persisted state.

        Input and conflict errors are raised before anything changes, so they keep the copy.
        """
        try:
            yield
        except (InputError, IndexConflictError):
            raise
        except BaseException:
            if self.path is not None:
                try:
                    meta = _read_meta(self.path)
                    if _uid_of(meta) == self.uid:
                        index, payloads = _read_generation(self.path, meta)
                        self._adopt(meta, index, payloads, _stat_sig(self.path / "meta.json"))
                except Exception:  # noqa: BLE001 - keep the first error; force a reload on next access
                    self._meta_sig = None
                    self.generation = -1
            raise

    def refresh(self) -> bool:
        """Catch up with a generation another process persisted; ``True`` if one was loaded.

        Costs one ``stat`` when nothing changed. Raises :class:`IndexNotFoundError` when the
        index was dropped (or dropped and re-created) by another process.
        """
        if self.path is None:
            return False
        sig = _stat_sig(self.path / "meta.json")
        if sig is not None and sig == self._meta_sig:
            return False
        with self._refresh_lock:
            return self._sync()

    def _sync(self) -> bool:
        """Caller holds ``_refresh_lock``: load the persisted generation if it is newer."""
        assert self.path is not None
        for _ in range(_LOAD_ATTEMPTS):
            sig = _stat_sig(self.path / "meta.json")  # before reading: at worst one extra read later
            if sig is None:
                raise _gone(self.name)
            if sig == self._meta_sig:
                return False
            try:
                meta = _read_meta(self.path)
            except FileNotFoundError:
                continue
            if _uid_of(meta) != self.uid:
                raise _gone(self.name, "dropped and re-created by another process")
            if int(meta["generation"]) <= self.generation:
                self._meta_sig = sig
                return False
            try:
                index, payloads = _read_generation(self.path, meta)
            except FileNotFoundError:  # collected after newer generations: read the meta again
                continue
            with self.lock.write():
                self._adopt(meta, index, payloads, sig)
            return True
        raise RuntimeError(f"index {self.name!r}: generations changed faster than they could be read")

    def _adopt(self, meta: dict, index, payloads: dict[int, Any], sig) -> None:
        """Replace the in-memory state by a persisted generation (caller holds the write side)."""
        self.index = index
        self.payloads = payloads
        self.tombstones = set(int(t) for t in meta.get("tombstones", []))
        self.next_id = int(meta.get("next_id", 0))
        self.kind = meta["kind"]
        self.params = meta["params"]
        self.updated_at = meta["updated_at"]
        self.description = meta.get("description", "")
        self.generation = int(meta["generation"])
        self._meta_sig = sig
        with self._hub_lock:
            self._hub_cache.clear()

    def _meta(self, gen: int) -> dict:
        return {
            "format": "vecbridge.SpaceIndex", "format_version": 1, "generation": gen, "uid": self.uid,
            "name": self.name, "space": self.space, "dim": self.dim, "kind": self.kind, "metric": self.metric,
            "params": self.params, "tombstones": sorted(self.tombstones), "next_id": self.next_id,
            "created_at": self.created_at, "updated_at": self.updated_at, "description": self.description,
        }

    def _save(self) -> None:
        """Write generation ``g + 1`` (caller holds the writer lock and the write side)."""
        if self.path is None:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        gen = self.generation + 1
        for stale in self.path.glob(".*.tmp-*"):  # left by a writer that died; we hold the writer lock
            stale.unlink(missing_ok=True)
        atomic_write(self.path / f"index.{gen}.faiss", lambda tmp: faiss.write_index(self.index, str(tmp)))
        _write_json(self.path / f"payloads.{gen}.json", [[i, p] for i, p in self.payloads.items()])
        _write_json(self.path / "meta.json", self._meta(gen))  # the commit point
        fsync_dir(self.path)
        self.generation = gen
        self._meta_sig = _stat_sig(self.path / "meta.json")
        for old in self.path.glob("*.*.*"):
            parts = old.name.split(".")
            if len(parts) == 3 and parts[1].isdigit() and int(parts[1]) < gen - _KEEP_OLD_GENERATIONS:
                old.unlink(missing_ok=True)

    @classmethod
    def load(cls, path: Path) -> "SpaceIndex":
        """Read the generation ``path/meta.json`` names (retrying when a writer moves on meanwhile)."""
        path = Path(path)
        for _ in range(_LOAD_ATTEMPTS):
            sig = _stat_sig(path / "meta.json")
            meta = _read_meta(path)
            try:
                index, payloads = _read_generation(path, meta)
            except FileNotFoundError:
                continue
            _check_meta(path, meta, index)
            obj = cls(name=meta["name"], space=meta["space"], dim=int(meta["dim"]), kind=meta["kind"],
                      metric=meta["metric"], params=meta["params"], index=index, payloads=payloads,
                      tombstones=set(int(t) for t in meta.get("tombstones", [])),
                      next_id=int(meta.get("next_id", 0)), created_at=meta["created_at"],
                      updated_at=meta["updated_at"], description=meta.get("description", ""), path=path,
                      generation=int(meta["generation"]), uid=_uid_of(meta))
            obj._meta_sig = sig
            return obj
        raise RuntimeError(f"index at {path}: generations changed faster than they could be read")


def _check_meta(path: Path, meta: dict, index) -> None:
    """Refuse a persisted index whose parameters FAISS would crash on (written by an older version, or edited).

    The same rules as at creation (:func:`service.limits.check_index_params`); raises InputError.
    """
    try:
        check_name(meta["name"])
        if meta["metric"] not in _METRICS:
            raise InputError(f"metric {meta['metric']!r} is not one of {_METRICS}")
        dim = check_dim(meta["dim"])
        params = dict(meta["params"])
        check_index_params(meta["kind"], params, dim=dim, random_state=params.pop("random_state", 0))
        if int(index.d) != dim:
            raise InputError(f"the FAISS file holds {index.d}-d rows, the meta says {dim}")
        next_id = int(meta.get("next_id", 0))
        if not 0 <= next_id <= MAX_ID:
            raise InputError(f"next_id {next_id} is outside 0..2**62")
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"index at {path} refused: {exc}") from None


def _write_json(path: Path, obj) -> None:
    atomic_write(path, json.dumps(obj))


class IndexStore:
    """All indexes of one service, persisted under ``root`` (``data_dir/indexes``).

    Several stores (processes) may share ``root``: :meth:`get` and :meth:`list` see indexes
    created, changed and dropped by the others (see the module notes).
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._indexes: dict[str, SpaceIndex] = {}
        self._lock = threading.Lock()
        self._creating: set[str] = set()
        # one loader per name without a lock per name ever looked up (unknown names would leak): striped
        self._load_locks = [threading.Lock() for _ in range(_LOAD_LOCK_STRIPES)]
        self._failed: dict[str, tuple | None] = {}  # name -> meta sig that failed to load
        self.loaded = False
        self.load_errors: dict[str, str] = {}

    def load_all(self) -> int:
        """Read every persisted index; returns how many loaded (failures go to ``load_errors``).

        Also removes what a dead process left behind: dropped folders still being removed and
        index folders being created more than a day ago.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        now = time.time()
        for sub in self.root.iterdir():
            if sub.name.startswith(".trash-"):
                shutil.rmtree(sub, ignore_errors=True)
            elif sub.name.startswith(".create-"):
                try:
                    if now - sub.stat().st_mtime > _STALE_CREATE_S:
                        shutil.rmtree(sub, ignore_errors=True)
                except FileNotFoundError:
                    pass
        n = len(self.list())
        self.loaded = True
        return n

    def _names_on_disk(self) -> list[str]:
        try:
            subs = sorted(self.root.iterdir())
        except FileNotFoundError:
            return []
        return [d.name for d in subs if _NAME_RE.fullmatch(d.name) and (d / "meta.json").exists()]

    def create(self, name: str, space: str, vectors, **kw) -> SpaceIndex:
        """Build and persist a new index; :class:`IndexConflictError` if the name exists (in any process)."""
        check_name(name)
        final = self.root / name
        with self._lock:
            if name in self._creating or (final / "meta.json").exists():
                raise IndexConflictError(f"index {name!r} already exists")
            self._creating.add(name)  # reserve the name in this process while building
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = self.root / f".create-{name}-{uuid.uuid4().hex}"
            try:
                idx = SpaceIndex.build(name, space, vectors, path=tmp, **kw)
                idx.save()  # generation 1 in the private folder
                sig = idx._meta_sig  # renaming the folder keeps the file's inode and mtime
                with _flock(self.root / _STORE_LOCK):
                    if (final / "meta.json").exists():
                        raise IndexConflictError(f"index {name!r} already exists")
                    if final.exists():  # a folder without meta: left by a crash before this format
                        os.rename(final, self.root / f".trash-{name}-{uuid.uuid4().hex}")
                    os.rename(tmp, final)
                    fsync_dir(self.root)
                idx.path, idx._meta_sig = final, sig
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        finally:
            with self._lock:
                self._creating.discard(name)
        with self._lock:
            self._indexes[name] = idx
            self._failed.pop(name, None)
            self.load_errors.pop(name, None)
        return idx

    def get(self, name: str) -> SpaceIndex:
        """The index ``name``, caught up with what other processes persisted."""
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise _gone(name, "no such index")
        with self._lock:
            idx = self._indexes.get(name)
        if idx is not None:
            try:
                idx.refresh()
                return idx
            except IndexNotFoundError:
                self._forget(name, idx)
        return self._load(name)

    def _forget(self, name: str, idx: SpaceIndex) -> None:
        with self._lock:
            if self._indexes.get(name) is idx:
                del self._indexes[name]

    def _load(self, name: str) -> SpaceIndex:
        path = self.root / name
        load_lock = self._load_locks[hash(name) % _LOAD_LOCK_STRIPES]
        with load_lock:  # one loader per name; other names load in parallel
            with self._lock:
                idx = self._indexes.get(name)
            if idx is not None:  # another thread loaded it meanwhile
                return idx
            sig = _stat_sig(path / "meta.json")
            if sig is None:
                raise _gone(name, "no such index")
            if name in self._failed and self._failed[name] == sig:
                raise _gone(name, f"it could not be loaded: {self.load_errors.get(name)}")
            try:
                idx = SpaceIndex.load(path)
            except FileNotFoundError:  # dropped while loading
                raise _gone(name) from None
            except Exception as exc:  # keep serving the others; readyz reports it
                with self._lock:
                    self._failed[name] = sig
                    self.load_errors[name] = f"{type(exc).__name__}: {exc}"
                raise _gone(name, f"it could not be loaded: {type(exc).__name__}: {exc}") from exc
            with self._lock:
                self._indexes[name] = idx
                self._failed.pop(name, None)
                self.load_errors.pop(name, None)
            return idx

    def list(self) -> list[SpaceIndex]:
        """Every index on disk (loaded or caught up as needed), by name."""
        names = self._names_on_disk()
        out = []
        for name in names:
            try:
                out.append(self.get(name))
            except IndexNotFoundError:
                pass
        keep = set(names)
        with self._lock:
            for name in [n for n in self._indexes if n not in keep]:
                del self._indexes[name]
            for name in [n for n in self.load_errors if n not in keep]:
                del self.load_errors[name]
                self._failed.pop(name, None)
        return out

    def delete(self, name: str) -> None:
        """Drop ``name``: atomically invisible to every process, then removed from disk."""
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise _gone(name, "no such index")
        final = self.root / name
        trash = self.root / f".trash-{name}-{uuid.uuid4().hex}"
        try:
            with _flock(self.root / _STORE_LOCK, create_dir=True):
                if not (final / "meta.json").exists():
                    raise _gone(name, "no such index")
                with _flock(final / _LOCK_FILE):  # let a writer in flight finish
                    os.rename(final, trash)
                fsync_dir(self.root)
        finally:
            with self._lock:
                self._indexes.pop(name, None)
                self._failed.pop(name, None)
                self.load_errors.pop(name, None)
        shutil.rmtree(trash, ignore_errors=True)
