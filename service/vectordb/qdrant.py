"""Qdrant adapter (``qdrant-client``): a Qdrant server by URL, or the client's local mode.

Local mode (``path=`` on disk, or ``path=":memory:"``) is the client's embedded engine; on disk it
commits every point separately (~30 ms a point here), so use it for small sets and a server for
real ones.

Points have unsigned integer ids (so integer ids must be >= 0) or UUIDs (str ids here, in Qdrant's
canonical lower-case form; a collection whose ids mix both kinds cannot be scanned), one vector
(unnamed, or the named vector ``vector_field``), the text in the payload key ``text_field``, and every
other payload key as the row's extra fields. Named sparse vectors (a hybrid collection's BM25 / SPLADE
side, e.g. LangChain's ``langchain-sparse``) do not depend on the dense model: a migration carries them
over unchanged (:attr:`~.base.Batch.sparse`), and a target made ``like`` the source declares them alike.
The embedding space is the collection metadata ``vecbridge.space``. ``scroll`` pages through ids in
Qdrant's order from an offset id (inclusive), which is what the resumable scan needs (it resumes at the
last id written and skips it). Aliases are native (``update_collection_aliases``, atomic).
"""

from __future__ import annotations

import os
import re
import threading
import uuid
import weakref
from typing import ClassVar, Iterator
from urllib.parse import urlsplit

import numpy as np

from align.exceptions import InputError

from .base import (MISSING, BadNameError, Batch, UnsupportedFieldError, VectorDBError, VectorDBUnavailableError,
                   VectorStore, as_ids, id_key, check_metric, check_name, close_quietly, none_if_all_none,
                   pad_results, rows_in_order, safe_url, tls_context)

__all__ = ["QdrantStore"]

_SEARCH_BATCH = 64
#: the points whose payload keys a missing text field's refusal names (payloads have no schema; whether any point
#: has the field is counted)
PAYLOAD_SAMPLE = 16
_INT64_MAX = 2**63 - 1
_VECTOR_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")  # Qdrant's names: LlamaIndex's "text-dense" too


class _LocalClient:
    """The local-mode client of one folder, shared by every :class:`QdrantStore` of that folder in this process.

    The client holds the folder's lock, so a second client of it, even in the same process, was refused: the
    service's collection search and a migration or verification job on the same local store excluded each other.
    One client serves them all now, one call at a time (its engine is plain Python over SQLite, not meant for
    concurrent calls); the last store closed closes it. Another *process* is still refused (a clear
    VectorDBError); a Qdrant server has no such limit.
    """

    _open: ClassVar[dict[str, _LocalClient]] = {}
    _guard = threading.Lock()

    def __init__(self, key: str, client) -> None:
        self.key, self.client, self.users, self.lock = key, client, 0, threading.RLock()

    @classmethod
    def acquire(cls, path: str) -> _LocalClient:
        from qdrant_client import QdrantClient

        key = os.path.realpath(path)
        with cls._guard:
            shared = cls._open.get(key)
            if shared is None:
                shared = cls._open[key] = cls(key, QdrantClient(path=str(path)))
            shared.users += 1
            return shared

    def release(self) -> None:
        with self._guard:
            self.users -= 1
            if self.users == 0:
                del self._open[self.key]
                close_quietly(self.client)

    def __getattr__(self, name: str):
        """The client's attribute; a method runs under the folder's lock."""
        attr = getattr(self.client, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            with self.lock:
                return attr(*args, **kwargs)

        return call


def _vector_name(name: str) -> str:
    """A named vector's name (letters, digits, ``_ . -``), else BadNameError."""
    if not isinstance(name, str) or not _VECTOR_NAME.fullmatch(name):
        raise BadNameError(f"vector field name must match [A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}, got {name!r}")
    return name


class QdrantStore(VectorStore):
    """A Qdrant connection: ``QdrantStore(url="http://host:6333")`` or ``QdrantStore(path="/dir")`` (local mode).

    ``url="https://..."`` talks TLS; ``api_key`` is sent as the ``api-key`` header (Qdrant Cloud, or a server
    with ``service.api_key`` set); ``ca_file``: a PEM file the server's certificate is checked against
    (a private CA or a self-signed certificate), else the system's trusted CAs."""

    engine = "qdrant"
    native_aliases = True
    id_kinds = ("int", "str")
    sparse_vectors = True
    text_as_field = True  # a scan with the fields carries the text key among them too, as it is (any JSON, null)

    def __init__(self, *, url: str | None = None, path: str | None = None, api_key: str | None = None,
                 ca_file=None, prefer_grpc: bool = False, id_field: str = "id", vector_field: str | None = None,
                 text_field: str = "text"):
        from qdrant_client import QdrantClient

        if id_field != "id":
            raise InputError("qdrant: rows are identified by their point ids; an id field does not apply")
        self.vector_field = None if vector_field is None else _vector_name(vector_field)
        self.text_field = check_name(text_field, "text field")
        if (url is None) == (path is None):
            raise InputError("give exactly one of url= (a Qdrant server) or path= (local mode)")
        self._release = None  # local mode on disk: gives this store's share of the folder's client back, once
        self.server_url = url  # None in local mode: lost.py tells a lost connection to the server by it
        if url:
            extra = {} if ca_file is None else {"verify": tls_context(ca_file)}
            self.client = QdrantClient(url=url, api_key=api_key or None, prefer_grpc=prefer_grpc, **extra)
            try:  # the client connects lazily: ask once, so an unreachable server is one clear error here
                self.client.get_collections()
            except Exception as exc:  # noqa: BLE001 - httpx / grpc / qdrant errors alike
                close_quietly(self.client)
                status = getattr(exc, "status_code", None)
                if status in (401, 403):  # the server answered: the key is missing or wrong, not the network
                    raise VectorDBError(f"qdrant: {safe_url(url)} refused the request ({status}): "
                                        f"{'a wrong API key' if api_key else 'it needs an API key'}; give it as "
                                        "VECBRIDGE_VECTORDB_API_KEY") from None
                why = str(exc)
                for secret in (urlsplit(url).password, api_key):
                    why = why.replace(secret, "***") if secret else why
                # no answer (down, restarting): retry later (75); an answer (404: not Qdrant there) or a certificate
                # refused is the user's to fix, no retry helps (2)
                down = status is None and "CERTIFICATE_VERIFY_FAILED" not in why
                raise (VectorDBUnavailableError if down else VectorDBError)(
                    f"qdrant: cannot connect to {safe_url(url)}: {why}") from None
        elif api_key or ca_file is not None:
            raise InputError("qdrant: local mode takes no API key or CA file")
        elif str(path) == ":memory:":
            self.client = QdrantClient(location=":memory:")
        else:
            try:
                self.client = _LocalClient.acquire(str(path))
                self._release = weakref.finalize(self, self.client.release)  # also when dropped unclosed
            except RuntimeError as exc:  # the folder's lock: local mode serves one process at a time
                if "already accessed" not in str(exc):
                    raise
                raise VectorDBUnavailableError(f"qdrant: the local store {path} is open in another process: local mode "
                                    "serves one process at a time; wait for it, or use a Qdrant server "
                                    "(qdrant://host:6333)") from None

    def exists(self, name: str) -> bool:
        # not collection_exists: it answers True for an alias too
        return check_name(name) in {c.name for c in self.client.get_collections().collections}

    def create(self, name: str, dim: int, *, metric: str = "cosine", like: str | None = None) -> None:
        """A collection of ``dim``-d vectors (``metric``). ``like``: the migration's source, whose sparse vectors
        the new one declares alike and whose dense vector's own index and storage settings (its HNSW ``m`` /
        ``ef_construct``, quantization, ``on_disk``, float16 storage) it keeps; payloads are schemaless, every key
        travels as it is."""
        from qdrant_client import models

        check_metric(metric)
        dist = models.Distance.COSINE if metric == "cosine" else models.Distance.DOT
        keep, sparse = {}, None
        if like is not None:
            vectors, sparse = self._vectors_config(like)  # sparse vectors travel unchanged
            src = self._dense_params(vectors)
            if src is not None:
                keep = {k: getattr(src, k, None) for k in ("hnsw_config", "quantization_config", "on_disk")}
                if getattr(src, "datatype", None) == models.Datatype.FLOAT16:  # half precision stays half precision
                    keep["datatype"] = src.datatype
        params = models.VectorParams(size=int(dim), distance=dist, **{k: v for k, v in keep.items() if v is not None})
        self.client.create_collection(check_name(name), vectors_config=params if self.vector_field is None
                                      else {self.vector_field: params}, sparse_vectors_config=sparse or None)

    def _dense_params(self, vectors):
        """This store's dense vector's ``VectorParams`` in a collection's ``vectors`` config (None: not there)."""
        return vectors.get(self.vector_field) if isinstance(vectors, dict) else vectors

    def target_index(self, like: str) -> str:
        src = self._dense_params(self._vectors_config(like)[0])
        hnsw = getattr(src, "hnsw_config", None)
        words = ["hnsw"] + [f"{k}={v}" for k, v in (("m", getattr(hnsw, "m", None)),
                                                    ("ef_construct", getattr(hnsw, "ef_construct", None)))
                            if v is not None]
        quant = getattr(src, "quantization_config", None)
        return " ".join(words + ([type(quant).__name__] if quant is not None else [])
                        + (["on_disk"] if getattr(src, "on_disk", None) else []))

    def drop(self, name: str) -> None:
        if self.exists(name):
            self.client.delete_collection(name)

    def _vectors_config(self, name: str):
        self._require(name)
        cfg = self.client.get_collection(name).config
        return cfg.params.vectors, cfg.params.sparse_vectors

    def dim(self, name: str) -> int:
        vectors, _ = self._vectors_config(name)
        if isinstance(vectors, dict):
            if self.vector_field not in vectors:
                raise VectorDBError(f"qdrant: collection {name!r} has named vectors {sorted(vectors)}; name the one "
                                    "to migrate with --vector-field")
            return int(vectors[self.vector_field].size)
        if self.vector_field is not None:
            raise VectorDBError(f"qdrant: collection {name!r} has one unnamed vector, not {self.vector_field!r}")
        return int(vectors.size)

    def missing_fields(self, name: str) -> dict[str, str]:
        """The vector field from the collection's config; the text field, a payload key (payloads have no schema),
        missing when no point has it: the first :data:`PAYLOAD_SAMPLE` points' payloads are read (their keys name
        what it has instead), and where none of them has it, Qdrant counts the points that do (an exact count with
        a filter: points without it can come first, e.g. images or section headers). An empty collection tells
        nothing."""
        vectors, _ = self._vectors_config(name)
        out = {}
        if isinstance(vectors, dict):
            if self.vector_field not in vectors:
                out["vector_field"] = f"named vectors {', '.join(sorted(vectors))}"
        elif self.vector_field is not None:
            out["vector_field"] = "one unnamed vector (leave the vector field out)"
        points, _ = self.client.scroll(name, limit=PAYLOAD_SAMPLE, with_payload=True, with_vectors=False)
        keys = {k for p in points for k in (p.payload or {})}
        if points and self.text_field not in keys and not self._has_payload_key(name, self.text_field):
            out["text_field"] = (f"payload keys {', '.join(sorted(keys)) or '(none)'} on its first {len(points)} "
                                 f"points (no point has {self.text_field!r})")
        return out

    def _has_payload_key(self, name: str, key: str) -> bool:
        """Whether a point of ``name`` has the payload key ``key`` (not null, not ``[]``; a field name has no dot,
        so Qdrant reads it as the top-level key)."""
        from qdrant_client import models

        present = models.Filter(must_not=[models.IsEmptyCondition(is_empty=models.PayloadField(key=key))])
        return self.client.count(name, count_filter=present, exact=True).count > 0

    def unsupported_fields(self, name: str) -> list[str]:
        vectors, _ = self._vectors_config(name)
        out = [f"{k} (another named vector: a migration maps {self.vector_field!r} only)"
               for k in (vectors if isinstance(vectors, dict) else {}) if k != self.vector_field]
        dense = self._dense_params(vectors)
        if getattr(dense, "multivector_config", None) is not None:  # read as (n, k, d): "expected a 2-D array"
            out.append(f"{self.vector_field or '(the unnamed vector)'} (a multivector: several vectors a point, as "
                       "ColBERT's; a migration maps one vector a point)")
        return out

    def metric(self, name: str) -> str:
        dist = getattr(self._dense_params(self._vectors_config(name)[0]), "distance", None)
        word = str(getattr(dist, "value", dist) or "Cosine")
        return {"Cosine": "cosine", "Dot": "ip", "Euclid": "l2"}.get(word, word.lower())

    def get_space(self, name: str) -> str | None:
        self._require(name)
        meta = getattr(self.client.get_collection(self.resolve_alias(name) or name).config, "metadata", None) or {}
        return meta.get("vecbridge.space") or None

    def set_space(self, name: str, space: str) -> None:
        self._require(name)
        self.client.update_collection(self.resolve_alias(name) or name, metadata={"vecbridge.space": str(space)})

    def count(self, name: str) -> int:
        self._require(name)
        return int(self.client.count(name, exact=True).count)

    def _upsert(self, name, ids, vectors, texts, fields=None, sparse=None) -> None:
        from qdrant_client import models

        self._require(name)
        if ids.dtype.kind != "U" and ids.size and ids.min() < 0:
            raise InputError("qdrant: point ids must be >= 0")
        payloads = None
        if texts is not None or fields:
            payloads = []
            for j in range(ids.shape[0]):
                p = {k: v[j] for k, v in (fields or {}).items() if v[j] is not MISSING}  # None: a null value
                if texts is not None and texts[j] is not None and self.text_field not in (fields or {}):
                    p[self.text_field] = texts[j]  # the text key among the fields (a scan's): as it is there
                payloads.append(p)
        if sparse:  # a point may lack a sparse vector: one PointStruct each, naming only those it has
            dense = self.vector_field or ""
            pts = [models.PointStruct(id=i, vector={dense: vectors[j].tolist(),
                                                    **{k: v[j] for k, v in sparse.items() if v[j] is not None}},
                                      payload=None if payloads is None else payloads[j])
                   for j, i in enumerate(_point_ids(ids))]
            self.client.upsert(name, points=pts, wait=True)
            return
        vecs = vectors.tolist() if self.vector_field is None else {self.vector_field: vectors.tolist()}
        self.client.upsert(name, points=models.Batch(ids=_point_ids(ids), vectors=vecs, payloads=payloads),
                           wait=True)

    def _payload(self, with_texts: bool, with_fields: bool):
        return True if with_fields else ([self.text_field] if with_texts else False)

    def _vectors(self, with_fields: bool = False):
        """``with_vectors`` of a read: the dense vector, and every sparse one with the fields."""
        return True if self.vector_field is None or with_fields else [self.vector_field]

    def scan(self, name: str, *, after_id: int | None = None, batch_size: int = 1000,
             with_texts: bool = True, with_fields: bool = False) -> Iterator[Batch]:
        self._require(name)
        # the offset is inclusive: an integer resumes at after_id + 1; a UUID has no successor to compute, so the
        # scan starts at after_id itself and drops it
        skip = _uuid(after_id) if isinstance(after_id, str) else None
        offset = skip if skip is not None else (None if after_id is None else int(after_id) + 1)
        kind = None
        while True:
            points, nxt = self.client.scroll(name, limit=int(batch_size) + (skip is not None), offset=offset,
                                             with_vectors=self._vectors(with_fields),
                                             with_payload=self._payload(with_texts, with_fields))
            if skip is not None:
                points = [p for p in points if p.id != skip]
                skip = None
            if points:
                batch = self._to_batch(points, with_texts, with_fields)
                kind = kind or batch.ids.dtype.kind
                if batch.ids.dtype.kind != kind:  # integers first, UUIDs later: one kind per collection
                    _mixed(points[0].id)
                yield batch
            if nxt is None or not points:
                return
            offset = nxt

    def fetch(self, name: str, ids, *, with_fields: bool = False) -> Batch:
        self._require(name)
        keys = _point_ids(as_ids(ids))
        pts = self.client.retrieve(name, ids=keys, with_vectors=self._vectors(with_fields),
                                   with_payload=self._payload(True, with_fields))
        got = {id_key(p.id): p for p in pts}
        return self._to_batch(rows_in_order(self.engine, name, keys, got), True, with_fields)

    def _to_batch(self, points, with_texts: bool, with_fields: bool) -> Batch:
        ids = _ids_of(points)
        dense = self.vector_field or ""  # the unnamed vector is "" beside named (sparse) ones

        def vec(p):
            return p.vector.get(dense) if isinstance(p.vector, dict) else p.vector
        V = np.asarray([vec(p) for p in points], dtype=np.float32)
        sparse = None
        if with_fields:
            names = sorted({k for p in points if isinstance(p.vector, dict) for k, v in p.vector.items()
                            if not isinstance(v, list)} - {dense})  # sparse ones: another dense vector is a list
            sparse = {k: [p.vector.get(k) if isinstance(p.vector, dict) else None for p in points]
                      for k in names} or None
        texts = none_if_all_none([(p.payload or {}).get(self.text_field) for p in points]) if with_texts else None
        fields = None
        if with_fields:  # the text key too, as it is: a number, an object or a null stays one (a text: str(value))
            names = sorted({k for p in points for k in (p.payload or {})})
            fields = {k: [(p.payload or {}).get(k, MISSING) for p in points] for k in names} or None
        return Batch(ids, V, texts, fields, sparse)

    def _search(self, name, Q, k):
        from qdrant_client import models

        out = []
        for s in range(0, Q.shape[0], _SEARCH_BATCH):
            reqs = [models.QueryRequest(query=q.tolist(), limit=k, using=self.vector_field)
                    for q in Q[s : s + _SEARCH_BATCH]]
            for res in self.client.query_batch_points(name, requests=reqs):
                out.append([(id_key(p.id), float(p.score)) for p in res.points])
        return pad_results(out, k)

    def set_alias(self, alias: str, name: str) -> None:
        from qdrant_client import models

        check_name(alias, "alias")
        self._require_collection(name)
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

    def aliases_of(self, name: str) -> list[str]:
        return sorted(a.alias_name for a in self.client.get_collection_aliases(check_name(name)).aliases)

    def close(self) -> None:
        if self._release is None:
            close_quietly(self.client)
        else:  # shared by this process's stores of the folder: the last one closes it (a second call: nothing)
            self._release()


def _ids_of(points) -> np.ndarray:
    """The points' ids: int64 when all are integers, str (canonical UUIDs) when all are UUIDs;
    UnsupportedFieldError for a mix (the ids of one collection must be of one kind to be scanned in order)."""
    ints = [isinstance(p.id, int) for p in points]
    if all(ints):
        big = [p.id for p in points if p.id > _INT64_MAX]
        if big:  # Qdrant's ids are unsigned 64-bit; rows here are keyed by int64 (np.fromiter: a bare OverflowError)
            raise UnsupportedFieldError(f"qdrant: point id {big[0]} is above 2**63 - 1 ({len(big)} in this batch); "
                                        "integer ids up to 9223372036854775807 can be migrated or verified")
        return np.fromiter((p.id for p in points), dtype=np.int64, count=len(points))
    if not any(ints):
        return np.asarray([str(p.id) for p in points])
    _mixed(next(p.id for p, i in zip(points, ints) if not i))


def _mixed(example):
    raise UnsupportedFieldError(f"qdrant: the point ids mix integers and UUIDs (e.g. {example!r}); a collection can "
                                "be migrated or verified when its ids are all integers or all UUIDs")


def _point_ids(ids: np.ndarray) -> list:
    """Ids (from :func:`as_ids`) as Qdrant takes them: ints, or UUIDs in their canonical form."""
    return [_uuid(i) for i in ids] if ids.dtype.kind == "U" else [int(i) for i in ids]


def _uuid(i) -> str:
    """A string id as Qdrant's canonical UUID (lower case, hyphens), else InputError."""
    try:
        return str(uuid.UUID(str(i)))
    except ValueError:
        raise InputError(f"qdrant: a string point id must be a UUID, got {str(i)[:80]!r}") from None
