"""FAISS indexes per embedding space: build, add, delete, search, persist; one writer each.

An index holds rows of one space (``dim`` columns) under int64 ids, with an optional JSON
payload per id; ``metric="cosine"`` (the default) scores by cosine. The package, by concern:

==============  ==================================================================================
module          holds
==============  ==================================================================================
``kinds``       FAISS structure per kind (flat / HNSW / IVF, :func:`choose_kind`), row preparation
                per metric, live ids, per-request search parameters
``csls``        CSLS re-ranking ``2 cos(q, d) - r(q) - r(d)`` and the ``r(d)`` cache
``persist``     the files: generations, ``meta.json`` as the commit point, crash-safe write, read
``room``        a flat / HNSW snapshot read with room for its log (no copy of the rows at the next add)
``locking``     the readers–writer lock (threads) and ``flock`` files (processes)
``space``       :class:`SpaceIndex`: one index, its writes, searches and catching up with others
``store``       :class:`IndexStore`: every index of a service; create / drop across processes
``info``        :class:`IndexInfo`: what an index answers about itself
==============  ==================================================================================

Concurrency in one sentence per case: threads of one process share an index under a
writer-preferring readers–writer lock (an HNSW add takes it per chunk of rows, hidden until
persisted, so searches go on); processes on one data dir (``uvicorn --workers N``)
each keep a copy and the files are the truth (writers hold ``flock``; readers catch up after one
``stat``); a crash leaves the previous generation readable. ``flock`` needs a local file
system (not NFS).
"""

from __future__ import annotations

from .errors import IndexConflictError, IndexNotFoundError
from .info import IndexInfo
from .kinds import FLAT_MAX, HNSW_MAX, check_name, choose_kind
from .locking import RWLock
from .space import SpaceIndex
from .store import IndexStore

__all__ = [
    "IndexStore", "SpaceIndex", "IndexInfo", "RWLock", "IndexNotFoundError", "IndexConflictError", "choose_kind",
    "check_name", "FLAT_MAX", "HNSW_MAX",
]
