"""Query-side translation: keep the old collection, translate new-model queries into its space.

For a collection of raw A vectors and a B→A map ``m`` (e.g. the inverse of the migration map),
a query ``q`` embedded by model B is searched as ``m.apply(q, output="raw")``:

.. math::  \\hat q = \\mathrm{raw}_A\\big(f_B(q)\\, W_{B\\to A} + b\\big)

No stored vector changes; the cost is one ``(nq, d_B) × (d_B, d_A)`` product per query batch.
"""

from __future__ import annotations

import numpy as np

from align.validation import as_matrix
from align.exceptions import DimensionMismatchError

from .base import VectorStore
from .migrate import resolve_map

__all__ = ["TranslatingSearcher"]


class TranslatingSearcher:
    """Search ``collection`` (space A) with queries from space B through a B→A map.

    Parameters
    ----------
    store : VectorStore
    collection : str
        Collection or alias holding raw A vectors (d_A = ``map_.target_dim``).
    map_ : LinearMap, ClusterMap, MapChain or str
        The B→A map, an artifact path, or a registry ref (with ``registry``).
    """

    def __init__(self, store: VectorStore, collection: str, map_, *, registry=None):
        self.store = store
        self.collection = collection
        self.map_ = resolve_map(map_, registry)
        d = store.dim(collection)
        if d != self.map_.target_dim:
            raise DimensionMismatchError(f"{collection!r} holds {d}-d vectors, the map outputs {self.map_.target_dim}-d")

    def translate(self, Q) -> np.ndarray:
        """Map B-space queries (nq, d_B) to raw A-space vectors (nq, d_A)."""
        return self.map_.apply(as_matrix(Q, name="queries", dim=self.map_.source_dim), output="raw")

    def search(self, Q, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` ``(S, I)`` in the old collection for B-space queries ``Q`` (nq, d_B)."""
        return self.store.search(self.collection, self.translate(Q), k)
