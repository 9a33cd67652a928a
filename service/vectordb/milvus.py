"""Milvus adapter (``pymilvus``): a Milvus server, or Milvus Lite embedded / as its own server.

``uri``:

- ``http://host:19530`` — a Milvus server, or ``milvus-lite server --data-dir DIR --port P``
  (Milvus Lite as a separate process: several clients, survives a client killed with -9);
- ``/path/file.db`` — Milvus Lite embedded in this process (one process per data folder).

A new collection has the quick-setup schema: ``id`` INT64 primary key (no auto id), ``vector``
FLOAT_VECTOR(d) with an AUTOINDEX of the chosen metric, and ``text`` plus every other field of a
row in the dynamic field (names configurable: ``id_field``, ``vector_field``, ``text_field``; a collection whose
primary key is not ``id_field``, as LangChain's ``pk``, is refused naming it before anything is read or written).
A migration target (``like=``) is the source's schema instead, with the dense vector's dimension the map's:
its primary key (INT64, or VARCHAR with its ``max_length``: LlamaIndex's, any collection keyed by
document ids), declared fields with their types, sparse vector fields, functions (a BM25 function fills
its sparse field from a text field, so full-text search works on the target), and the indexes of the
other fields; the dense vector gets the source's own index kind and build parameters (HNSW with its ``M`` /
``efConstruction``, IVF with its ``nlist``, ...; AUTOINDEX when the source has none) with the map's metric.
Function outputs are not read as fields: Milvus computes them again from the migrated text.
Scans page by primary key in ascending order: INT64 keys through ``query_iterator``; VARCHAR keys
through ``query`` with the iterator's ordering options and a cursor ``id > "<last>"`` escaped here
(pymilvus' iterator and ``get`` put a string key into the expression as it is, so a key holding
``"`` or ``\\`` broke them). With ``with_fields`` they ask for ``*`` (declared and dynamic fields).
The embedding space is the collection property ``vecbridge.space``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from align.exceptions import InputError

from .base import (MISSING, Batch, VectorDBError, VectorDBUnavailableError, VectorStore, as_ids, check_ca_file,
                   check_metric, check_name, close_quietly, id_key, none_if_all_none, pad_results, rows_in_order,
                   safe_url)

__all__ = ["MilvusStore"]

_METRIC = {"cosine": "COSINE", "ip": "IP"}
_SEARCH_BATCH = 256  # queries per gRPC search call
_EXPR_IDS = 4096  # ids per `id in [...]` expression
_ITER_BATCH = 16384  # the most rows query_iterator returns at a time (a larger batch_size is a ParamError)
_INDEX_META = {"field_name", "index_name", "index_type", "metric_type", "total_rows", "indexed_rows",
               "pending_index_rows", "state"}  # describe_index keys that are not the index's parameters
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _literal(s: str) -> str:
    """A Milvus expression string literal holding exactly ``s`` (other control characters may stand raw)."""
    return '"' + "".join(_ESCAPES.get(ch, ch) for ch in s) + '"'


def _index_params(described: dict) -> dict:
    """The build parameters in a ``describe_index`` answer (``M``, ``efConstruction``, ``nlist``, ...)."""
    return {k: v for k, v in described.items() if k not in _INDEX_META}


class MilvusStore(VectorStore):
    """A Milvus / Milvus Lite connection.

    Parameters
    ----------
    uri : str
        ``http://host:port`` or a local ``.db`` path (Milvus Lite embedded).
    token : str, optional
        ``user:password`` or an API key for a secured server.
    ca_file : path, optional
        A PEM file the server's TLS certificate is checked against (``https://`` URIs; a private CA or a
        self-signed certificate), else the system's trusted CAs.
    """

    engine = "milvus"
    native_aliases = True
    id_kinds = ("int", "str")
    text_as_field = True  # a scan with the fields carries the text key among them too (see VectorStore)

    def __init__(self, uri: str, *, token: str | None = None, ca_file=None, timeout: float | None = 60.0,
                 id_field: str = "id", vector_field: str = "vector", text_field: str = "text"):
        from pymilvus import MilvusClient
        from pymilvus.exceptions import MilvusException

        self.id_field = check_name(id_field, "id field")
        self.vector_field = check_name(vector_field, "vector field")
        self.text_field = check_name(text_field, "text field")
        self.uri = str(uri)
        self._timeout = timeout
        if self.uri.endswith(".db"):  # Milvus Lite creates the file, not its folder
            Path(self.uri).parent.mkdir(parents=True, exist_ok=True)
        # pymilvus pings every 10 s, idle or not; a server holding to gRPC's ping policy answers a ping that comes
        # early (a loaded machine's timer jitter) with GOAWAY "too_many_pings", and every call on the shared
        # connection then failed ("Fail connecting to server"): pings once a minute, only while calls run
        extra = {"grpc_options": {"grpc.keepalive_time_ms": 60_000, "grpc.keepalive_permit_without_calls": False}}
        if ca_file is not None:
            if not self.uri.startswith("https://"):
                raise InputError("milvus: a CA file is for an https:// server")
            extra["server_pem_path"] = str(check_ca_file(ca_file))
        try:
            self.client = MilvusClient(uri=self.uri, token=token or "", timeout=timeout, **extra)
        except MilvusException as exc:  # unreachable server: the user's to fix, not an internal error
            why = exc.message.replace(token, "***") if token else exc.message
            refused = any(w in why.lower() for w in ("auth", "unauthenticated", "permission"))  # a retry cannot help
            raise (VectorDBError if refused else VectorDBUnavailableError)(
                f"milvus: cannot connect to {safe_url(self.uri)}: {why}") from None
        self._dims: dict[str, int] = {}
        self._keys: dict[str, int | None] = {}  # name -> max_length of a VARCHAR primary key, None for INT64
        self._searchable: set[str] = set()  # names seen loaded by a search (see _search)

    # --- collections --------------------------------------------------------------------
    def exists(self, name: str) -> bool:
        # not has_collection: it answers True for an alias too, and drop_collection(alias) drops its collection
        return check_name(name) in self.client.list_collections()

    def create(self, name: str, dim: int, *, metric: str = "cosine", like: str | None = None) -> None:
        check_metric(metric)
        check_name(name)
        if like is None:
            self.client.create_collection(name, dimension=int(dim), metric_type=_METRIC[metric],
                                          primary_field_name=self.id_field, vector_field_name=self.vector_field,
                                          auto_id=False, consistency_level="Strong", id_type="int")
        else:
            self._create_like(name, int(dim), metric, like)
        self._keys.pop(name, None)

    def _create_like(self, name: str, dim: int, metric: str, like: str) -> None:
        """``name`` with the schema, functions and indexes of ``like``; the dense vector ``dim``-d, ``metric``."""
        from pymilvus import CollectionSchema

        source = self.resolve_alias(like) or like
        schema = CollectionSchema.construct_from_dict(self._describe(source))
        for f in schema.fields:
            if f.name == self.vector_field:
                f.params["dim"] = dim
        index = self.client.prepare_index_params()
        dense = None
        for x in self._indexes(source):
            params = _index_params(x) or None
            if x["field_name"] == self.vector_field:
                dense = (x.get("index_type") or "AUTOINDEX", params)
            else:
                index.add_index(x["field_name"], index_type=x.get("index_type", ""), index_name=x["index_name"],
                                **({"metric_type": x["metric_type"]} if x.get("metric_type") else {}), params=params)
        kind, params = dense or ("AUTOINDEX", None)  # the source's own kind and build parameters, the map's metric
        index.add_index(self.vector_field, index_type=kind, metric_type=_METRIC[metric], params=params)
        self.client.create_collection(name, schema=schema, index_params=index, consistency_level="Strong")

    def _indexes(self, name: str) -> list[dict]:
        """``describe_index`` of every index of collection ``name``."""
        return [self.client.describe_index(name, idx) for idx in self.client.list_indexes(name)]

    def target_index(self, like: str) -> str:
        for x in self._indexes(self.resolve_alias(like) or like):
            if x["field_name"] == self.vector_field:
                params = (f"{k}={v}" for k, v in _index_params(x).items())
                return " ".join([x.get("index_type") or "AUTOINDEX", *params])
        return "AUTOINDEX"

    def metric(self, name: str) -> str:
        self._require(name)
        found = [x.get("metric_type") for x in self._indexes(self.resolve_alias(name) or name)
                 if x["field_name"] == self.vector_field]
        word = str(found[0] if found and found[0] else "COSINE")
        return {"COSINE": "cosine", "IP": "ip"}.get(word.upper(), word.lower())

    def _generated(self, name: str) -> set[str]:
        """Fields a function of the collection fills (a BM25 sparse vector from a text field): never written."""
        return {o for fn in self._describe(name).get("functions") or [] for o in fn.get("output_field_names", [])}

    def _str_key(self, name: str) -> int | None:
        """The ``max_length`` of ``name``'s VARCHAR primary key, or None when it is INT64 (or absent); VectorDBError
        when the primary key is not ``id_field`` (every read keys its rows by that name: a scan or a search failed
        with KeyError: 'id' on LangChain's ``pk``, after a migration had created its target)."""
        if name not in self._keys:
            from pymilvus import DataType

            fields = self._describe(name)["fields"]
            key = next((f["name"] for f in fields if f.get("is_primary")), self.id_field)
            if key != self.id_field:
                raise VectorDBError(f"milvus: the primary key of {name!r} is {key!r}, not {self.id_field!r}; "
                                    f"pass --id-field {key}")
            self._keys[name] = next((int(f["params"]["max_length"]) for f in fields
                                     if f["name"] == self.id_field and f.get("type") == DataType.VARCHAR), None)
        return self._keys[name]

    def _check_keys(self, name: str, ids: np.ndarray) -> int | None:
        """InputError for ids the primary key of ``name`` cannot hold; returns :meth:`_str_key`."""
        strlen, got = self._str_key(name), "str" if ids.dtype.kind == "U" else "int"
        if ids.size and got != ("int" if strlen is None else "str"):
            raise InputError(f"milvus: {name!r} keys rows by {'INT64' if strlen is None else 'VARCHAR'}, got {got} "
                             f"ids (first: {id_key(ids[0])!r})")
        if strlen is not None:
            long = [str(i) for i in ids if len(str(i).encode()) > strlen]
            if long:
                raise InputError(f"milvus: {len(long)} id(s) longer than the key's max_length {strlen} bytes "
                                 f"(first: {long[0][:40]!r})")
        return strlen

    def _describe(self, name: str) -> dict:
        """``describe_collection`` of a collection or alias (one RPC; CollectionNotFoundError when neither)."""
        from pymilvus.exceptions import MilvusException

        # has_collection first (True for an alias too): describe_collection of a missing name logged pymilvus's
        # ~20-line traceback before the error, on every 404 for a missing source
        if not self.client.has_collection(check_name(name)):
            self._require(name)  # names what is missing
        try:
            return self.client.describe_collection(name)
        except MilvusException:
            self._require(name)  # names what is missing; a collection that exists re-raises below
            raise

    def get_space(self, name: str) -> str | None:
        return (self._describe(name).get("properties") or {}).get("vecbridge.space") or None

    def set_space(self, name: str, space: str) -> None:
        self._require(name)
        self.client.alter_collection_properties(self.resolve_alias(name) or name,
                                                properties={"vecbridge.space": str(space)})

    def unsupported_fields(self, name: str) -> list[str]:
        from pymilvus import DataType

        out = []
        described = self._describe(name)
        if not any(f.get("is_partition_key") for f in described["fields"]):  # a partition key's own partitions
            # are internal and come back with the schema; partitions a user made are not carried by the migration
            made = [p for p in self.client.list_partitions(self.resolve_alias(name) or name) if p != "_default"]
            if made:
                out.append(f"partition(s) {', '.join(made[:10])}{' ...' if len(made) > 10 else ''} (a migration "
                           "writes every row into the target's _default partition, so searches naming a partition "
                           "would find nothing; move their rows into _default, or key them by a field)")
        for f in described["fields"]:
            t = f.get("type")
            is_vector = "VECTOR" in getattr(t, "name", str(t))
            if f["name"] == self.vector_field and t != DataType.FLOAT_VECTOR:
                out.append(f"{f['name']} (a {getattr(t, 'name', t)} field; a migration maps FLOAT_VECTOR fields)")
            elif f["name"] != self.vector_field and is_vector and t != DataType.SPARSE_FLOAT_VECTOR:
                # sparse vectors (BM25 / SPLADE) do not depend on the dense model: they travel unchanged
                out.append(f"{f['name']} (another dense vector field: a migration maps {self.vector_field!r} only)")
            if f["name"] == self.id_field and t not in (DataType.INT64, DataType.VARCHAR):
                out.append(f"{f['name']} (primary key of type {getattr(t, 'name', t)}; need INT64 or VARCHAR)")
        return out

    def missing_fields(self, name: str) -> dict[str, str]:
        described = self._describe(name)
        names = [f["name"] for f in described["fields"]]
        have = f"fields {', '.join(names)}"
        key = next((f["name"] for f in described["fields"] if f.get("is_primary")), None)
        out = {"id_field": f"primary key {key!r}"} if key != self.id_field else {}
        if self.vector_field not in names:
            out["vector_field"] = have
        if self.text_field in names:
            return out
        if not described.get("enable_dynamic_field"):
            out["text_field"] = have + " (and no dynamic field)"
        elif (keys := self._dynamic_keys(name, names)) is not None and self.text_field not in keys:
            out["text_field"] = f"{have}; its first row's dynamic keys: {', '.join(sorted(keys)) or '(none)'}"
        return out

    def _dynamic_keys(self, name: str, declared: list[str]) -> set[str] | None:
        """The dynamic field's keys in one row of ``name`` (a key is per row: the first row read stands for the
        collection, as a schema would), None when it has no row. Every collection vecbridge makes has a dynamic
        field, so the schema alone never told a text field's name (the texts travelled under another key)."""
        self._loaded(name)
        rows = self.client.query(name, filter="", limit=1, output_fields=["*"])
        return None if not rows else set(rows[0]) - set(declared) - {"$meta"}

    def drop(self, name: str) -> None:
        if self.exists(name):
            self.client.drop_collection(name)
        self._dims.pop(name, None)
        self._keys.pop(name, None)
        self._searchable.discard(name)

    def dim(self, name: str) -> int:
        if name not in self._dims:
            self._require(name)
            info = self.client.describe_collection(name)
            self._str_key(name)  # refuses a primary key of another name than id_field
            for f in info["fields"]:
                if f["name"] == self.vector_field:
                    self._dims[name] = int(f["params"]["dim"])
                    break
            else:
                raise VectorDBError(f"milvus: collection {name!r} has no vector field {self.vector_field!r} "
                                    f"(fields: {', '.join(f['name'] for f in info['fields'])}); name it with "
                                    "--vector-field")
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
    def _upsert(self, name, ids, vectors, texts, fields=None) -> None:
        self._require(name)
        self._check_keys(name, ids)
        rows = []
        for j in range(ids.shape[0]):
            row = {self.id_field: id_key(ids[j]), self.vector_field: vectors[j]}
            if texts is not None and texts[j] is not None and self.text_field not in (fields or {}):
                row[self.text_field] = texts[j]  # the text key among the fields (a scan's): as it is there
            for k, v in (fields or {}).items():
                if v[j] is not MISSING:  # None: a null value
                    row[k] = v[j]
            rows.append(row)
        self.client.upsert(name, rows)

    def _outputs(self, with_texts: bool, with_fields: bool) -> list[str]:
        if with_fields:
            return ["*"]
        return [self.vector_field, self.text_field] if with_texts else [self.vector_field]

    def _pages(self, name: str, after: str | None, batch_size: int, outputs: list[str]) -> Iterator[list[dict]]:
        """Rows of a VARCHAR-keyed collection with key > ``after``, in key order, ``batch_size`` at a time."""
        n = min(int(batch_size), _ITER_BATCH)
        while True:
            expr = "" if after is None else f"{self.id_field} > {_literal(after)}"
            rows = self.client.query(name, filter=expr, limit=n, output_fields=outputs, iterator="True",
                                     reduce_stop_for_best="True")  # the query_iterator's options: key order
            if not rows:
                return
            yield rows
            after = str(rows[-1][self.id_field])

    def scan(self, name: str, *, after_id: int | str | None = None, batch_size: int = 1000,
             with_texts: bool = True, with_fields: bool = False) -> Iterator[Batch]:
        self._loaded(name)
        if self._str_key(name) is not None:
            after = None if after_id is None else str(after_id)
            skip = self._generated(name) if with_fields else set()
            for rows in self._pages(name, after, batch_size, self._outputs(with_texts, with_fields)):
                yield self._to_batch(rows, with_texts, with_fields, skip)
            return
        expr = "" if after_id is None else f"{self.id_field} > {int(after_id)}"
        skip = self._generated(name) if with_fields else set()
        it = self.client.query_iterator(name, batch_size=min(int(batch_size), _ITER_BATCH), filter=expr,
                                        output_fields=self._outputs(with_texts, with_fields))
        try:
            while True:
                rows = it.next()
                if not rows:
                    return
                yield self._to_batch(rows, with_texts, with_fields, skip)
        finally:
            it.close()

    def ids(self, name: str, *, batch_size: int = 10000) -> np.ndarray:
        self._loaded(name)
        if self._str_key(name) is not None:
            keys = [str(r[self.id_field]) for rows in self._pages(name, None, batch_size, [self.id_field])
                    for r in rows]
            return np.array(keys, dtype=str) if keys else np.empty(0, np.int64)
        it = self.client.query_iterator(name, batch_size=min(int(batch_size), _ITER_BATCH), filter="",
                                        output_fields=[self.id_field])
        parts = []
        try:
            while True:
                rows = it.next()
                if not rows:
                    break
                parts.append(np.fromiter((r[self.id_field] for r in rows), dtype=np.int64, count=len(rows)))
        finally:
            it.close()
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def fetch(self, name: str, ids, *, with_fields: bool = False) -> Batch:
        self._loaded(name)
        ids = as_ids(ids)
        self.check_id_kind(ids)
        strlen = self._check_keys(name, ids)
        got: dict = {}
        for s in range(0, ids.shape[0], _EXPR_IDS):
            part, out = ids[s : s + _EXPR_IDS], self._outputs(True, with_fields)
            if strlen is None:
                rows = self.client.get(name, ids=[int(i) for i in part], output_fields=out)
            else:  # not get(): it puts string keys into its expression unescaped
                rows = self.client.query(name, filter=f"{self.id_field} in [{', '.join(map(_literal, part))}]",
                                         output_fields=out)
            for r in rows:
                got[id_key(r[self.id_field])] = r
        skip = self._generated(name) if with_fields else set()
        return self._to_batch(rows_in_order(self.engine, name, ids, got), True, with_fields, skip)

    def _to_batch(self, rows: list[dict], with_texts: bool, with_fields: bool, skip: set = frozenset()) -> Batch:
        if rows and isinstance(rows[0][self.id_field], str):
            ids = np.array([r[self.id_field] for r in rows], dtype=str)
        else:
            ids = np.fromiter((r[self.id_field] for r in rows), dtype=np.int64, count=len(rows))
        V = np.asarray([r[self.vector_field] for r in rows], dtype=np.float32)
        texts = none_if_all_none([r.get(self.text_field) for r in rows]) if with_texts else None
        fields = None
        if with_fields:
            # the text key too, as it is: in the dynamic field it may be a number, an object or a null (str()-ed before)
            names = sorted({k for r in rows for k in r} - {self.id_field, self.vector_field} - skip)
            fields = {k: [r.get(k, MISSING) for r in rows] for k in names} or None
        return Batch(ids, V, texts, fields)

    def _search(self, name, Q, k):
        from pymilvus.exceptions import MilvusException

        if name not in self._searchable:  # checked once per collection: its load state is an RPC (~2.5 ms here)
            self._loaded(name)
            self._searchable.add(name)
        out: list[list[tuple[int, float]]] = []
        for s in range(0, Q.shape[0], _SEARCH_BATCH):
            data = [q for q in Q[s : s + _SEARCH_BATCH]]
            try:
                res = self.client.search(name, data=data, limit=k, output_fields=[])
            except MilvusException as exc:  # released (or dropped) by someone else since: check again, once
                self._searchable.discard(name)
                if "load" not in str(exc).lower():
                    raise
                self._loaded(name)
                res = self.client.search(name, data=data, limit=k, output_fields=[])
            for hits in res:
                # pymilvus >= 2.5 keys a hit by the primary key's name (2.4: "id")
                out.append([(id_key(h[self.id_field] if self.id_field in h else h["id"]), float(h["distance"]))
                            for h in hits])
        return pad_results(out, k)

    def finalize(self, name: str, *, like: str | None = None) -> None:
        self._require(name)
        try:
            self.client.flush(name)
        except Exception:  # Milvus Lite persists on write and may not implement flush
            pass
        self.client.load_collection(name)

    # --- aliases ------------------------------------------------------------------------
    def set_alias(self, alias: str, name: str) -> None:
        check_name(alias, "alias")
        self._require_collection(name)
        if self.resolve_alias(alias) is None:
            self.client.create_alias(name, alias)
        else:
            self.client.alter_alias(name, alias)
        self._dims.pop(alias, None)
        self._keys.pop(alias, None)
        self._searchable.discard(alias)

    def resolve_alias(self, alias: str) -> str | None:
        check_name(alias, "alias")
        for coll in self.client.list_collections():  # describe_alias logs an error for unknown aliases
            if alias in self.client.list_aliases(coll).get("aliases", []):
                return coll
        return None

    def aliases_of(self, name: str) -> list[str]:
        return sorted(self.client.list_aliases(check_name(name)).get("aliases", [])) if self.exists(name) else []

    def close(self) -> None:
        close_quietly(self.client)

