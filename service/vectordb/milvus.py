"""Milvus adapter (``pymilvus``): a Milvus server, or Milvus Lite embedded / as its own server.

``uri``:

- ``http://host:19530`` — a Milvus server, or ``milvus-lite server --data-dir DIR --port P``
  (Milvus Lite as a separate process: several clients, survives a client killed with -9);
- ``/path/file.db`` — Milvus Lite embedded in this process (one process per data folder).

Collections use the quick-setup schema: ``id`` INT64 primary key (no auto id), ``vector``
FLOAT_VECTOR(d) with an AUTOINDEX of the chosen metric, and ``text`` in the dynamic field.
Scans go through ``query_iterator``, which pages by primary key in ascending order.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from align.exceptions import InputError

from .base import (
    Batch,
    CollectionNotFoundError,
    METRICS,
    VectorDBError,
    VectorStore,
    _pad_results,
    as_ids,
    check_name,
)

__all__ = ["MilvusStore"]

_METRIC = {"cosine": "COSINE", "ip": "IP"}
_SEARCH_BATCH = 256  # queries per gRPC search call
_EXPR_IDS = 4096  # ids per `id in [...]` expression


class MilvusStore(VectorStore):
    """A Milvus / Milvus Lite connection.

    Parameters
    ----------
    uri : str
        ``http://host:port`` or a local ``.db`` path (Milvus Lite embedded).
    token : str, optional
        ``user:password`` or an API key for a secured server.
    """

    engine = "milvus"
    native_aliases = True

    def __init__(self, uri: str, *, token: str | None = None, timeout: float | None = 60.0):
        from pymilvus import MilvusClient

        self.uri = str(uri)
        self._timeout = timeout
        self.client = MilvusClient(uri=self.uri, token=token or "", timeout=timeout)
        self._dims: dict[str, int] = {}

    # --- collections --------------------------------------------------------------------
    def exists(self, name: str) -> bool:
        return bool(self.client.has_collection(check_name(name)))

    def _require(self, name: str) -> str:
        check_name(name)
        if not self.client.has_collection(name) and self.resolve_alias(name) is None:
            raise CollectionNotFoundError(f"milvus: no collection or alias {name!r}")
        return name

    def create(self, name: str, dim: int, *, metric: str = "cosine") -> None:
        if metric not in METRICS:
            raise InputError(f"metric must be one of {METRICS}, got {metric!r}")
        self.client.create_collection(check_name(name), dimension=int(dim), metric_type=_METRIC[metric],
                                      primary_field_name="id", vector_field_name="vector", id_type="int",
                                      auto_id=False, consistency_level="Strong")

    def drop(self, name: str) -> None:
        if self.exists(name):
            self.client.drop_collection(name)
        self._dims.pop(name, None)

    def dim(self, name: str) -> int:
        if name not in self._dims:
            self._require(name)
            info = self.client.describe_collection(name)
            for f in info["fields"]:
                if f["name"] == "vector":
                    self._dims[name] = int(f["params"]["dim"])
                    break
            else:
                raise VectorDBError(f"milvus: collection {name!r} has no 'vector' field")
        return self._dims[name]

    def count(self, name: str) -> int:
        self._loaded(name)
        res = self.client.query(name, filter="", output_fields=["count(*)"])
        return int(res[0]["count(*)"])

    def _loaded(self, name: str) -> None:
        self._require(name)
        try:
            state = self.client.get_load_state(name).get("state")
            loaded = "Loaded" in str(state)
        except Exception:  # aliases or older servers: just load
            loaded = False
        if not loaded:
            self.client.load_collection(name)

    # --- rows ---------------------------------------------------------------------------
    def _upsert(self, name, ids, vectors, texts) -> None:
        self._require(name)
        rows = []
        for j in range(ids.shape[0]):
            row = {"id": int(ids[j]), "vector": vectors[j]}
            if texts is not None:
                row["text"] = texts[j]
            rows.append(row)
        self.client.upsert(name, rows)

    def scan(self, name: str, *, after_id: int | None = None, batch_size: int = 1000,
             with_texts: bool = True) -> Iterator[Batch]:
        self._loaded(name)
        fields = ["vector", "text"] if with_texts else ["vector"]
        expr = "" if after_id is None else f"id > {int(after_id)}"
        it = self.client.query_iterator(name, batch_size=int(batch_size), filter=expr, output_fields=fields)
        try:
            while True:
                rows = it.next()
                if not rows:
                    return
                yield _to_batch(rows, with_texts)
        finally:
            it.close()

    def ids(self, name: str, *, batch_size: int = 10000) -> np.ndarray:
        self._loaded(name)
        it = self.client.query_iterator(name, batch_size=int(batch_size), filter="", output_fields=["id"])
        parts = []
        try:
            while True:
                rows = it.next()
                if not rows:
                    break
                parts.append(np.fromiter((r["id"] for r in rows), dtype=np.int64, count=len(rows)))
        finally:
            it.close()
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def fetch(self, name: str, ids) -> Batch:
        self._loaded(name)
        ids = as_ids(ids)
        got: dict[int, dict] = {}
        for s in range(0, ids.shape[0], _EXPR_IDS):
            for r in self.client.get(name, ids=[int(i) for i in ids[s : s + _EXPR_IDS]],
                                     output_fields=["vector", "text"]):
                got[int(r["id"])] = r
        missing = [int(i) for i in ids if int(i) not in got]
        if missing:
            raise InputError(f"milvus: {len(missing)} ids not in {name!r} (first: {missing[:5]})")
        return _to_batch([got[int(i)] for i in ids], True)

    def _search(self, name, Q, k):
        self._loaded(name)
        out: list[list[tuple[int, float]]] = []
        for s in range(0, Q.shape[0], _SEARCH_BATCH):
            res = self.client.search(name, data=[q for q in Q[s : s + _SEARCH_BATCH]], limit=k, output_fields=[])
            for hits in res:
                out.append([(int(h["id"]), float(h["distance"])) for h in hits])
        return _pad_results(out, k)

    def finalize(self, name: str) -> None:
        self._require(name)
        try:
            self.client.flush(name)
        except Exception:  # Milvus Lite persists on write and may not implement flush
            pass
        self.client.load_collection(name)

    # --- aliases ------------------------------------------------------------------------
    def set_alias(self, alias: str, name: str) -> None:
        check_name(alias, "alias")
        if not self.exists(name):
            raise CollectionNotFoundError(f"milvus: no collection {name!r}")
        if self.resolve_alias(alias) is None:
            self.client.create_alias(name, alias)
        else:
            self.client.alter_alias(name, alias)
        self._dims.pop(alias, None)

    def resolve_alias(self, alias: str) -> str | None:
        check_name(alias, "alias")
        for coll in self.client.list_collections():  # describe_alias logs an error for unknown aliases
            if alias in self.client.list_aliases(coll).get("aliases", []):
                return coll
        return None

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:
            pass


def _to_batch(rows: list[dict], with_texts: bool) -> Batch:
    ids = np.fromiter((r["id"] for r in rows), dtype=np.int64, count=len(rows))
    V = np.asarray([r["vector"] for r in rows], dtype=np.float32)
    texts = [r.get("text") for r in rows] if with_texts else None
    if texts is not None and all(t is None for t in texts):
        texts = None
    return Batch(ids, V, texts)
