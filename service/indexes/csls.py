"""CSLS re-ranking of index candidates (cross-domain similarity local scaling, against hubness).

``csls_k > 0`` fetches ``max(4k, k + csls_k)`` candidates by cosine and re-scores them as

.. math::  \\mathrm{CSLS}(q, d) = 2\\cos(q, d) - r(q) - r(d)

where ``r(q)`` is the mean of the query's top ``csls_k`` cosines (exact: they are the first
candidates) and ``r(d)`` is the mean cosine of ``d`` to its ``csls_k`` nearest *stored* rows
(a density proxy for hubness: the population of mapped queries is not known to the index).
``r(d)`` is computed on demand with the request's search settings (``exact``, ``nprobe``, ``ef_search``) and
cached per those settings (:class:`HubCache`) until the next write, at most
``HUB_CACHE_PER_ROW x rows + HUB_CACHE_FLOOR`` values (past that the cache starts over).

``weight`` ``w`` scales the document term: ``2 cos(q, d) - r(q) - w r(d)`` (``w = 1``: classic CSLS; ``w = 0``:
the cosine order of the candidates). For a query, ranking by it is ranking by ``cos(q, d) - (w / 2) r(d)``.
The default is :data:`CSLS_WEIGHT` = 0.5, from labelled retrieval in migrated indexes
(``benchmarks/results/migration_2026-12-01_csls*.md``, 4 encoder pairs x K x map family, corpus- and
query-side, 220 cells): against plain cosine search, half the classic weight kept more of the native
recall in 204 cells and less in 12 (at most -0.025); the classic weight lost in 44 (down to -0.074),
mostly corpus-side, where it demotes right documents along with the hubs. Native indexes: 0.5 was
within ±0.01 of plain search on all four, the classic weight never above it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

__all__ = ["CSLS_WEIGHT", "HUB_CACHE_FLOOR", "HUB_CACHE_PER_ROW", "HubCache", "csls_search"]

CSLS_WEIGHT = 0.5  # default weight of the document's hubness r(d) (see the module notes)
# Cached r(d) values, all csls_k and search settings together: at most HUB_CACHE_PER_ROW per stored row plus
# HUB_CACHE_FLOOR (~12 bytes each, see _Table). Every csls_k (1..1000) and ef_search / nprobe is a key of its own,
# so without a bound, requests varying them would grow the cache to many times the index.
HUB_CACHE_PER_ROW = 2
HUB_CACHE_FLOOR = 1 << 14

Search = Callable[[np.ndarray, int], "tuple[np.ndarray, np.ndarray]"]


class _Table:
    """Cached ``r(d)`` of one ``(csls_k, settings)``: sorted ``ids`` (int64) with their ``values`` (float32), 12
    bytes a value, plus a small dict of values not merged in yet (merged once it passes an eighth of the arrays).

    A dict entry per value (a tuple key, a float) cost ~160 bytes: ~320 MB at the bound of a 1M-row index.
    """

    __slots__ = ("ids", "pending", "values")

    def __init__(self) -> None:
        self.ids = np.empty(0, np.int64)
        self.values = np.empty(0, np.float32)
        self.pending: dict[int, float] = {}

    def __len__(self) -> int:
        return self.ids.shape[0] + len(self.pending)

    def get(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(values, found)`` for ``ids`` (m,): float32 values (0 where not found) and the bool mask of found."""
        out = np.zeros(ids.shape[0], np.float32)
        found = np.zeros(ids.shape[0], bool)
        if self.ids.shape[0]:
            pos = np.minimum(np.searchsorted(self.ids, ids), self.ids.shape[0] - 1)
            found = self.ids[pos] == ids
            out[found] = self.values[pos[found]]
        if self.pending:
            for j in np.flatnonzero(~found).tolist():
                v = self.pending.get(int(ids[j]))
                if v is not None:
                    out[j], found[j] = v, True
        return out, found

    def put(self, ids: np.ndarray, values: np.ndarray) -> None:
        self.pending.update(zip(ids.tolist(), values.tolist()))
        if len(self.pending) > max(4096, self.ids.shape[0] // 8):
            new_ids = np.fromiter(self.pending.keys(), np.int64, len(self.pending))
            new_values = np.fromiter(self.pending.values(), np.float32, len(self.pending))
            all_ids = np.concatenate([new_ids, self.ids])  # pending first: np.unique keeps the first of a repeat
            uniq, first = np.unique(all_ids, return_index=True)
            self.ids, self.values = uniq, np.concatenate([new_values, self.values])[first]
            self.pending = {}


class HubCache:
    """``r(d)`` per ``(id, csls_k, search settings)``; thread-safe; :meth:`clear` on every change of the index.

    The settings are part of the key because an approximate search (IVF ``nprobe`` < ``nlist``, HNSW) finds
    other neighbours, so other ``r(d)``: a value cached by one request must not serve another's settings.
    Values are kept in arrays per ``(csls_k, settings)`` (:class:`_Table`, ~12 bytes a value).
    """

    def __init__(self) -> None:
        self._tables: dict[tuple[int, tuple], _Table] = {}
        self._n = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._n

    def clear(self) -> None:
        with self._lock:
            self._tables.clear()
            self._n = 0

    def hubness(self, ids: np.ndarray, csls_k: int, search: Search, reconstruct: Callable[[int], np.ndarray],
                settings: tuple = (), max_values: int | None = None) -> np.ndarray:
        """``r(d)`` for each of ``ids`` (m,) int64: mean score to its ``csls_k`` nearest *other* stored rows.

        ``search(X, k) -> (S, I)`` searches the index, ``reconstruct(id)`` returns a stored row, ``settings``
        names what ``search`` runs with (:func:`~.kinds.search_key`). Missing values are computed in one
        batched search of the stored rows and cached under ``(id, csls_k, settings)``; when that would pass
        ``max_values`` the cache is emptied first.
        """
        ids = np.asarray(ids, np.int64)
        key = (csls_k, settings)
        with self._lock:
            table = self._tables.get(key)
            out, found = table.get(ids) if table is not None else (np.zeros(ids.shape[0], np.float32),
                                                                   np.zeros(ids.shape[0], bool))
        missing = np.flatnonzero(~found)
        if missing.size:
            todo = ids[missing]
            X = np.vstack([reconstruct(int(i)) for i in todo]).astype(np.float32)
            S, I = search(np.ascontiguousarray(X), csls_k + 1)
            valid = (I >= 0) & (I != todo[:, None])
            r = np.empty(todo.shape[0], np.float32)
            for j in range(todo.shape[0]):
                s = S[j][valid[j]][:csls_k]
                r[j] = float(s.mean()) if s.size else 0.0
            out[missing] = r
            with self._lock:
                if max_values is not None and self._n + len(todo) > max_values:
                    self._tables.clear()
                    self._n = 0
                table = self._tables.setdefault(key, _Table())
                before = len(table)
                table.put(todo, r)
                self._n += len(table) - before
        return out


def csls_search(Q: np.ndarray, k: int, csls_k: int, n_live: int, search: Search,
                reconstruct: Callable[[int], np.ndarray], hubs: HubCache, weight: float = CSLS_WEIGHT,
                settings: tuple = ()) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` by CSLS (document term scaled by ``weight``) for prepared queries ``Q`` (n, d) over an index
    of ``n_live`` rows; ``search`` runs with ``settings`` (the key of cached ``r(d)``, :meth:`HubCache.hubness`).

    Returns ``S`` (n, k) float32 CSLS scores (``-inf`` padding) and ``I`` (n, k) int64 ids (``-1``
    padding), best first; ties keep the cosine order.
    """
    kc = min(max(1, n_live), max(4 * k, k + csls_k))
    S, I = search(Q, kc)
    r_q = np.array([s[i >= 0][:csls_k].mean() if (i >= 0).any() else 0.0 for s, i in zip(S, I)], np.float32)
    uniq = np.unique(I[I >= 0])
    limit = HUB_CACHE_PER_ROW * n_live + HUB_CACHE_FLOOR
    r_d = np.zeros(I.shape, np.float32)
    if uniq.size:
        hub = hubs.hubness(uniq, csls_k, search, reconstruct, settings, limit)
        r_d[I >= 0] = hub[np.searchsorted(uniq, I[I >= 0])]
    # the padding's scores (FAISS's -FLT_MAX) are never doubled: 2 S over them overflowed to -inf, a RuntimeWarning
    # in the server's log, though np.where then dropped them; only the found rows' scores are computed (same values)
    live = I >= 0
    C = np.full(I.shape, -np.inf, np.float32)
    C[live] = 2.0 * S[live] - np.broadcast_to(r_q[:, None], I.shape)[live] - np.float32(weight) * r_d[live]
    order = np.argsort(-C, axis=1, kind="stable")[:, :k]
    S_out = np.take_along_axis(C, order, axis=1)
    I_out = np.take_along_axis(I, order, axis=1)
    if S_out.shape[1] < k:
        pad = k - S_out.shape[1]
        S_out = np.pad(S_out, ((0, 0), (0, pad)), constant_values=-np.inf)
        I_out = np.pad(I_out, ((0, 0), (0, pad)), constant_values=-1)
    return S_out, I_out
