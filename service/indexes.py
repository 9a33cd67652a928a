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

Concurrency: a writer-preferring readers–writer lock per index. Searches share the read
side (FAISS releases the GIL, so they run in parallel); add / delete / rebuild / save take
the write side, so each index has one writer at a time.

Persistence: ``root/<name>/meta.json`` names the current generation; ``index.<gen>.faiss``
and ``payloads.<gen>.json`` are written first and ``meta.json`` is replaced atomically last,
so a crash leaves the previous generation readable. Nothing is pickled.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import faiss
import numpy as np

from align._validation import as_matrix
from align.exceptions import InputError
from align.frames import unit_rows

__all__ = [
    "IndexStore", "SpaceIndex", "RWLock", "IndexNotFoundError", "IndexConflictError", "choose_kind",
    "FLAT_MAX", "HNSW_MAX",
]

FLAT_MAX = 50_000
HNSW_MAX = 1_000_000
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_KINDS = ("flat", "hnsw", "ivf")
_METRICS = ("cosine", "ip")
_TOMBSTONE_REBUILD = 0.10


class IndexNotFoundError(LookupError):
    """No index with that name."""


class IndexConflictError(Exception):
    """The index or one of the ids already exists."""


def choose_kind(n: int) -> str:
    """Index kind for ``n`` rows: flat below 50k, HNSW below 1M, IVF above."""
    if n < FLAT_MAX:
        return "flat"
    return "hnsw" if n < HNSW_MAX else "ivf"


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise InputError(
            f"index name {name!r} is invalid: expected 1-128 characters from [A-Za-z0-9._-], starting alphanumeric")
    return name


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
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise InputError(f"{name}: expected a flat list of integers, got dtype {arr.dtype} shape {arr.shape}")
    arr = arr.astype(np.int64)
    if n is not None and arr.shape[0] != n:
        raise InputError(f"{name}: expected {n} ids (one per vector), got {arr.shape[0]}")
    if arr.size and arr.min() < 0:
        raise InputError(f"{name}: ids must be non-negative")
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

    def __post_init__(self) -> None:
        self.lock = RWLock()
        self._hub_cache: dict[tuple[int, int], float] = {}
        self._hub_lock = threading.Lock()

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
        if vectors is None or (hasattr(vectors, "__len__") and len(vectors) == 0 and dim is not None):
            X = np.zeros((0, int(dim)), np.float32)
        else:
            X = as_matrix(vectors, name="vectors", dim=dim)
        n, d = X.shape
        if kind == "auto":
            kind = choose_kind(n)
        if kind not in _KINDS:
            raise InputError(f"kind must be 'auto' or one of {_KINDS}, got {kind!r}")
        params = dict(params or {})
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
            nlist = int(params.get("nlist") or max(1, min(int(4 * math.sqrt(n)), n // 39 or 1)))
            params["nlist"] = nlist
            params.setdefault("nprobe", min(16, nlist))
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

    def _prep(self, X: np.ndarray) -> np.ndarray:
        return unit_rows(X) if self.metric == "cosine" else X

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
        """Add rows ``vectors`` (n, dim) under ``ids`` (default: the next free ids); returns the ids."""
        X = as_matrix(vectors, name="vectors", dim=self.dim)
        with self.lock.write():
            out = self._add(X, ids, payloads)
            self._save()
        return out

    def delete(self, ids) -> int:
        """Delete ``ids``; returns how many were present. Unknown ids are ignored."""
        ids_arr = _ids_array(ids)
        with self.lock.write():
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
        Q = np.ascontiguousarray(self._prep(Q))
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

    # --- persistence ------------------------------------------------------------------------
    def save(self) -> None:
        with self.lock.write():
            self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        gen = self.generation + 1
        faiss.write_index(self.index, str(self.path / f"index.{gen}.faiss"))
        _write_json(self.path / f"payloads.{gen}.json", [[i, p] for i, p in self.payloads.items()])
        meta = {
            "format": "vecbridge.SpaceIndex", "format_version": 1, "generation": gen,
            "name": self.name, "space": self.space, "dim": self.dim, "kind": self.kind, "metric": self.metric,
            "params": self.params, "tombstones": sorted(self.tombstones), "next_id": self.next_id,
            "created_at": self.created_at, "updated_at": self.updated_at, "description": self.description,
        }
        _write_json(self.path / "meta.json", meta)
        self.generation = gen
        for old in self.path.glob("*.*.*"):
            parts = old.name.split(".")
            if len(parts) == 3 and parts[1].isdigit() and int(parts[1]) != gen:
                old.unlink(missing_ok=True)

    @classmethod
    def load(cls, path: Path) -> "SpaceIndex":
        meta = json.loads((path / "meta.json").read_text())
        if meta.get("format") != "vecbridge.SpaceIndex":
            raise InputError(f"{path} is not a vecbridge index")
        gen = int(meta["generation"])
        index = faiss.read_index(str(path / f"index.{gen}.faiss"))
        payloads = {int(i): p for i, p in json.loads((path / f"payloads.{gen}.json").read_text())}
        return cls(name=meta["name"], space=meta["space"], dim=int(meta["dim"]), kind=meta["kind"],
                   metric=meta["metric"], params=meta["params"], index=index, payloads=payloads,
                   tombstones=set(meta.get("tombstones", [])), next_id=int(meta.get("next_id", 0)),
                   created_at=meta["created_at"], updated_at=meta["updated_at"],
                   description=meta.get("description", ""), path=path, generation=gen)


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    with open(tmp, "w") as fh:
        json.dump(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class IndexStore:
    """All indexes of one service, persisted under ``root`` (``data_dir/indexes``)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._indexes: dict[str, SpaceIndex] = {}
        self._lock = threading.Lock()
        self.loaded = False
        self.load_errors: dict[str, str] = {}

    def load_all(self) -> int:
        """Read every persisted index; returns how many loaded (failures go to ``load_errors``)."""
        self.root.mkdir(parents=True, exist_ok=True)
        n = 0
        for sub in sorted(self.root.iterdir()):
            if not (sub / "meta.json").exists():
                continue
            try:
                idx = SpaceIndex.load(sub)
            except Exception as exc:  # keep serving the others; readyz reports it
                self.load_errors[sub.name] = f"{type(exc).__name__}: {exc}"
                continue
            with self._lock:
                self._indexes[idx.name] = idx
            n += 1
        self.loaded = True
        return n

    def create(self, name: str, space: str, vectors, **kw) -> SpaceIndex:
        check_name(name)
        with self._lock:
            if name in self._indexes:
                raise IndexConflictError(f"index {name!r} already exists")
            self._indexes[name] = None  # type: ignore[assignment]  # reserve the name while building
        try:
            idx = SpaceIndex.build(name, space, vectors, path=self.root / name, **kw)
            idx.save()
        except BaseException:
            with self._lock:
                self._indexes.pop(name, None)
            raise
        with self._lock:
            self._indexes[name] = idx
        return idx

    def get(self, name: str) -> SpaceIndex:
        with self._lock:
            idx = self._indexes.get(name)
        if idx is None:
            raise IndexNotFoundError(f"index {name!r} not found; GET /v1/indexes lists the existing ones")
        return idx

    def list(self) -> list[SpaceIndex]:
        with self._lock:
            return [i for i in self._indexes.values() if i is not None]

    def delete(self, name: str) -> None:
        idx = self.get(name)
        with idx.lock.write():
            with self._lock:
                self._indexes.pop(name, None)
            if idx.path is not None and idx.path.exists():
                shutil.rmtree(idx.path)
