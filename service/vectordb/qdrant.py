"""Qdrant adapter (``qdrant-client``): a Qdrant server by URL, or the client's local mode.

Local mode (``path=`` on disk, or ``path=":memory:"``) is the client's embedded engine; on disk it
commits every point separately (~30 ms a point here), so use it for small sets and a server for
real ones.

Points have unsigned integer ids (so ids must be >= 0), one unnamed vector, and the text in the
payload. ``scroll`` pages through integer ids in ascending order from an offset, which is what
the resumable scan needs. Aliases are native (``update_collection_aliases``, atomic).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from align.exceptions import InputError

from .base import (
    Batch,
    CollectionNotFoundError,
    METRICS,
    VectorStore,
    _pad_results,
    as_ids,
    check_name,
)

__all__ = ["QdrantStore"]

_SEARCH_BATCH = 64


class QdrantStore(VectorStore):
    """A Qdrant connection: ``QdrantStore(url="http://host:6333")`` or ``QdrantStore(path="/dir")`` (local mode)."""

    engine = "qdrant"
    native_aliases = True

    def __init__(self, *, url: str | None = None, path: str | None = None, api_key: str | None = None,
                 prefer_grpc: bool = False):
        from qdrant_client import QdrantClient

        if (url is None) == (path is None):
            raise InputError("give exactly one of url= (a Qdrant server) or path= (local mode)")
        if url:
            self.client = QdrantClient(url=url, api_key=api_key, prefer_grpc=prefer_grpc)
        elif str(path) == ":memory:":
            self.client = QdrantClient(location=":memory:")
        else:
            self.client = QdrantClient(path=str(path))

    def exists(self, name: str) -> bool:
        return bool(self.client.collection_exists(check_name(name)))

    def _require(self, name: str) -> str:
        check_name(name)
        if not self.client.collection_exists(name) and self.resolve_alias(name) is None:
            raise CollectionNotFoundError(f"qdrant: no collection or alias {name!r}")
        return name

    def create(self, name: str, dim: int, *, metric: str = "cosine") -> None:
        from qdrant_client import models

        if metric not in METRICS:
            raise InputError(f"metric must be one of {METRICS}, got {metric!r}")
        dist = models.Distance.COSINE if metric == "cosine" else models.Distance.DOT
        self.client.create_collection(check_name(name), vectors_config=models.VectorParams(size=int(dim), distance=dist))

    def drop(self, name: str) -> None:
        if self.exists(name):
            self.client.delete_collection(name)

    def dim(self, name: str) -> int:
        self._require(name)
        return int(self.client.get_collection(name).config.params.vectors.size)

    def count(self, name: str) -> int:
        self._require(name)
        return int(self.client.count(name, exact=True).count)

    def _upsert(self, name, ids, vectors, texts) -> None:
        from qdrant_client import models

        self._require(name)
        if ids.size and ids.min() < 0:
            raise InputError("qdrant: point ids must be >= 0")
        payloads = None if texts is None else [{"text": t} for t in texts]
        self.client.upsert(name, points=models.Batch(ids=[int(i) for i in ids], vectors=vectors.tolist(),
                                                     payloads=payloads), wait=True)

    def scan(self, name: str, *, after_id: int | None = None, batch_size: int = 1000,
             with_texts: bool = True) -> Iterator[Batch]:
        self._require(name)
        offset = None if after_id is None else int(after_id) + 1
        while True:
            points, nxt = self.client.scroll(name, limit=int(batch_size), offset=offset, with_vectors=True,
                                             with_payload=["text"] if with_texts else False)
            if points:
                yield _to_batch(points, with_texts)
            if nxt is None or not points:
                return
            offset = nxt

    def fetch(self, name: str, ids) -> Batch:
        self._require(name)
        ids = as_ids(ids)
        pts = self.client.retrieve(name, ids=[int(i) for i in ids], with_vectors=True, with_payload=["text"])
        got = {int(p.id): p for p in pts}
        missing = [int(i) for i in ids if int(i) not in got]
        if missing:
            raise InputError(f"qdrant: {len(missing)} ids not in {name!r} (first: {missing[:5]})")
        return _to_batch([got[int(i)] for i in ids], True)

    def _search(self, name, Q, k):
        from qdrant_client import models

        out = []
        for s in range(0, Q.shape[0], _SEARCH_BATCH):
            reqs = [models.QueryRequest(query=q.tolist(), limit=k) for q in Q[s : s + _SEARCH_BATCH]]
            for res in self.client.query_batch_points(name, requests=reqs):
                out.append([(int(p.id), float(p.score)) for p in res.points])
        return _pad_results(out, k)

    def set_alias(self, alias: str, name: str) -> None:
        from qdrant_client import models

        check_name(alias, "alias")
        if not self.exists(name):
            raise CollectionNotFoundError(f"qdrant: no collection {name!r}")
        ops = []
        if self.resolve_alias(alias) is not None:
            ops.append(models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=alias)))
        ops.append(models.CreateAliasOperation(create_alias=models.CreateAlias(collection_name=name, alias_name=alias)))
        self.client.update_collection_aliases(change_aliases_operations=ops)

    def resolve_alias(self, alias: str) -> str | None:
        check_name(alias, "alias")
        for a in self.client.get_aliases().aliases:
            if a.alias_name == alias:
                return a.collection_name
        return None

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:
            pass


def _to_batch(points, with_texts: bool) -> Batch:
    ids = np.fromiter((int(p.id) for p in points), dtype=np.int64, count=len(points))
    V = np.asarray([p.vector for p in points], dtype=np.float32)
    texts = [(p.payload or {}).get("text") for p in points] if with_texts else None
    if texts is not None and all(t is None for t in texts):
        texts = None
    return Batch(ids, V, texts)
