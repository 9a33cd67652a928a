"""The small interface every vector-database adapter implements, and the adapters' errors.

A *store* holds named collections of rows ``(id: int64, vector: float32[d], text: str | None,
**fields)``: any other scalar/JSON fields a row carries (Milvus dynamic or declared fields,
PostgreSQL columns, Qdrant payload keys) travel with it in :attr:`Batch.fields`. The names of the
id, vector and text fields are per store (``id_field``, ``vector_field``, ``text_field``). A
collection may record the embedding **space** its vectors live in (``get_space`` / ``set_space``:
a Milvus collection property, a PostgreSQL table comment, Qdrant collection metadata), which a
migration checks against the map's source space.

The migration engine only needs what is below; each engine maps it onto its own API:

========================  ==================  ======================  ==========================
operation                 Milvus (Lite)       PostgreSQL + pgvector   Qdrant
========================  ==================  ======================  ==========================
collection                collection          table                   collection
``scan`` (ascending id)   query iterator      ``ORDER BY id LIMIT``   ``scroll`` from an offset
``upsert`` (idempotent)   ``upsert``          ``ON CONFLICT DO ..``   ``upsert``
alias                     alias               view                    alias
========================  ==================  ======================  ==========================

``upsert`` must be idempotent (writing a batch twice leaves one row per id): a migration killed
between writing a batch and recording its checkpoint rewrites that batch on resume.

Errors::

    VecbridgeError
    └── VectorDBError                   a vector-database operation failed or was refused
        ├── CollectionNotFoundError     (also LookupError) no such collection / table / alias
        ├── CollectionExistsError       the target of a fresh migration already exists
        ├── CheckpointMismatchError     a checkpoint belongs to another migration (map, source, target)
        ├── MigrationRunningError       another run holds this migration's checkpoint (running now)
        ├── SpaceMismatchError          the map's source space is not the collection's recorded space
        ├── UnsupportedFieldError       a field a migration could not carry over (named in the message)
        └── BadNameError (ValueError)   a collection or alias name the adapter refuses
"""

from __future__ import annotations

import re
import ssl
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from align.validation import as_matrix
from align.exceptions import InputError, PairCountError, VecbridgeError

from .. import spaces
from ..errors import ConflictError, NotFoundError, shown
from ..pgconn import pg_connect_options, pg_target
from ..urls import redact, safe_url

__all__ = [
    "Batch", "VectorStore", "VectorDBError", "VectorDBUnavailableError", "CollectionNotFoundError",
    "CollectionExistsError", "CheckpointMismatchError", "MigrationRunningError", "SpaceMismatchError",
    "UnsupportedFieldError", "BadNameError",
    "check_name", "as_ids", "id_key",
    "check_fields", "check_metric", "METRICS", "MISSING", "safe_url", "redact", "check_ca_file", "tls_context",
]


def pg_connect(url: str, what: str, todo: str, *settings: str):
    """``psycopg.connect(url)`` in autocommit, with :func:`~service.pgconn.pg_connect_options` (``settings`` after
    the operator's options). A failure is VectorDBUnavailableError (a server down, restarting or unreachable: exit
    75, 503 with Retry-After) or VectorDBError (a wrong password, role, database or URL: exit 2), naming ``what``,
    where it connects (:func:`~service.pgconn.pg_target`: never its password) and ``todo``; libpq's words are
    redacted (its parse errors quote the URL or a piece of it: a password with a stray "%"). A checkpoint's was
    psycopg's own OperationalError (exit 3)."""
    import psycopg

    from ..registry.postgres import refused_for_good

    try:
        return psycopg.connect(url, autocommit=True, **pg_connect_options(url, *settings))
    except psycopg.Error as exc:
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        down = isinstance(exc, psycopg.OperationalError) and not refused_for_good(exc, why)
        err = VectorDBUnavailableError if down else VectorDBError
        raise err(f"{what}: cannot connect to {pg_target(url)}: {redact(why, url)}; "
                  f"{todo if down else 'check the URL, its user and password, and that the database exists'}"
                  ) from None


METRICS = ("cosine", "ip")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


class VectorDBError(VecbridgeError):
    """A vector-database operation failed or was refused: a table without the named column, a missing client package,
    a wrong key. HTTP 503 without ``Retry-After``, exit 2: its operator or user must act, a retry cannot help."""

    kind = "unavailable"
    retry_after: int | None = None


class VectorDBUnavailableError(VectorDBError):
    """The vector database did not answer (down, restarting, unreachable): 503 with ``Retry-After``, exit 75."""

    retry_after = 5


class CollectionNotFoundError(NotFoundError, VectorDBError):
    """No collection, table or alias of that name."""


class CollectionExistsError(ConflictError, VectorDBError):
    """A fresh migration would write into a collection that already exists."""


class CheckpointMismatchError(ConflictError, VectorDBError):
    """The checkpoint on file belongs to a different migration (source, target or map differ)."""


class MigrationRunningError(ConflictError, VectorDBError):
    """Another process is running the migration of this checkpoint (it holds the checkpoint's lock)."""


class SpaceMismatchError(spaces.SpaceMismatchError, VectorDBError):
    """The collection records another embedding space than the one the map reads (e.g. a map the wrong way), or its
    rows look like the map's target space (:func:`service.spaces.judge_rows`)."""


class UnsupportedFieldError(InputError, VectorDBError):
    """A row field a migration cannot carry over (another vector field, a type without a binary copy)."""


class UnknownWidthError(UnsupportedFieldError):
    """A collection whose vector field declares no width (pgvector's ``vector`` without a size) and that holds no
    row to tell it by: a migration cannot size its target; ``GET /v1/collections/{name}`` answers its width null."""


class BadNameError(InputError, VectorDBError):
    """A collection or alias name outside ``[A-Za-z_][A-Za-z0-9_]{0,62}``."""


def check_ca_file(path) -> Path:
    """``path`` as a readable PEM file of certificates, else InputError (before any connection is tried)."""
    p = Path(path).expanduser()
    try:
        head = p.read_bytes()[:65536]
    except OSError as exc:
        raise InputError(f"CA file {p}: {exc.strerror or exc}") from None
    if b"-----BEGIN CERTIFICATE-----" not in head:
        raise InputError(f"CA file {p}: no PEM certificate in it (-----BEGIN CERTIFICATE-----)")
    return p


def tls_context(ca_file) -> ssl.SSLContext:
    """A client TLS context that checks servers against the certificates in ``ca_file`` (PEM)."""
    p = check_ca_file(ca_file)
    try:
        return ssl.create_default_context(cafile=str(p))
    except ssl.SSLError as exc:
        raise InputError(f"CA file {p}: not a usable certificate ({exc.reason or exc})") from None


def check_name(name: str, what: str = "collection") -> str:
    """Return ``name`` when it is a safe identifier for every engine, else raise BadNameError."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):  # fullmatch: "$" would let a trailing newline in
        raise BadNameError(f"{what} name must match [A-Za-z_][A-Za-z0-9_]{{0,62}}, got {shown(name)}")
    return name


def as_ids(ids, n: int | None = None) -> np.ndarray:
    """Ids as a 1-D int64 array, or a 1-D str array for string ids (UUIDs, keys; checked against ``n`` rows when
    given). Which kind a store takes is :attr:`VectorStore.id_kinds`."""
    arr = np.asarray(ids)
    if arr.dtype == object and arr.ndim == 1 and arr.size and all(isinstance(x, str) for x in arr):
        arr = arr.astype(str)
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or arr.dtype.kind == "U" or arr.size == 0):
        raise InputError(f"ids must be a 1-D array of integers or strings, got dtype {arr.dtype} shape {arr.shape}")
    if arr.dtype.kind == "U":
        if arr.size and not all(arr):
            raise InputError("a string id must not be empty")
    else:
        arr = arr.astype(np.int64, copy=False)
    if n is not None and arr.shape[0] != n:
        raise PairCountError(f"{arr.shape[0]} ids for {n} vectors")
    return arr


def id_key(i):
    """One id as a plain Python ``int`` or ``str`` (a dict key, a JSON value): numpy scalars unwrapped."""
    return i if isinstance(i, str) else int(i)


def check_fields(fields, n: int) -> dict[str, list] | None:
    """Extra fields as ``{name: list of n values}`` (or None); PairCountError on a length mismatch."""
    if not fields:
        return None
    if not isinstance(fields, dict):
        raise InputError("fields must be a mapping {name: list of values}")
    out = {}
    for k, v in fields.items():
        v = list(v)
        if len(v) != n:
            raise PairCountError(f"field {k!r} has {len(v)} values for {n} rows")
        out[str(k)] = v
    return out


def check_metric(metric: str) -> str:
    """Return ``metric`` when it is one of :data:`METRICS`, else raise InputError."""
    if metric not in METRICS:
        raise InputError(f"metric must be one of {METRICS}, got {metric!r}")
    return metric


def none_if_all_none(values: list | None) -> list | None:
    """``values``, or None when there are none or every one is None (a column nobody filled)."""
    return None if values is None or all(v is None for v in values) else values


def rows_in_order(engine: str, name: str, ids, got: dict) -> list:
    """The rows ``got[i]`` for each id of ``ids`` in that order; InputError naming the missing ids."""
    keys = [id_key(i) for i in ids]
    missing = [i for i in keys if i not in got]
    if missing:
        raise InputError(f"{engine}: {len(missing)} ids not in {name!r} (first: {missing[:5]})")
    return [got[i] for i in keys]


def close_quietly(conn) -> None:
    """Close a client or connection, ignoring errors (it may already be closed)."""
    try:
        conn.close()
    except Exception:
        pass


class Sentinel:
    """A named marker value that is falsy and compared by identity (:data:`MISSING`, pgvector's ``JSON_NULL``)."""

    def __init__(self, name: str):
        self._name = name

    def __repr__(self) -> str:
        return self._name

    def __bool__(self) -> bool:
        return False


#: In :attr:`Batch.fields`, a field the row does not have, where ``None`` is a field holding null: Qdrant
#: payloads and Milvus dynamic fields tell the two apart (a filter ``is_null`` / ``is_empty`` does), so a
#: migration writes the key with null for ``None`` and no key for ``MISSING``. Columns (PostgreSQL) always exist.
MISSING = Sentinel("MISSING")


@dataclass
class Batch:
    """Rows read from a store: ``ids`` (n,) int64, ``vectors`` (n, d) float32, ``texts`` list or None,
    ``fields`` ``{name: list of n values}`` of every other field (when the scan asked for them), or None;
    a row without a field has :data:`MISSING` there (``None`` is a null value); ``sparse`` ``{name: list of n
    sparse vectors or None}``: the rows' sparse vectors (Qdrant), which a migration carries over unchanged."""

    ids: np.ndarray
    vectors: np.ndarray
    texts: list | None = None
    fields: dict | None = None
    sparse: dict | None = None

    def __len__(self) -> int:
        return int(self.ids.shape[0])


class VectorStore(ABC):
    """One connection to one vector database (see the module docstring for the mapping)."""

    engine: str = "abstract"
    #: True when ``set_alias`` is a native, atomic alias switch of the engine.
    native_aliases: bool = False
    id_field: str = "id"
    vector_field: str | None = "vector"
    text_field: str = "text"
    #: the kinds of id a store keeps: ``"int"`` (int64), ``"str"`` (UUIDs in Qdrant)
    id_kinds: tuple[str, ...] = ("int",)
    #: True when rows may carry named sparse vectors (:attr:`Batch.sparse`) beside the dense one
    sparse_vectors: bool = False
    #: True when the text may also travel among the fields (``fields[text_field]``, which then wins over ``texts``): a
    #: schemaless payload (Qdrant, Milvus's dynamic field), whose text key may hold any JSON value or null, which a
    #: migration keeps as it is
    text_as_field: bool = False

    def check_id_kind(self, ids: np.ndarray) -> None:
        """InputError when ``ids`` (from :func:`as_ids`) are of a kind this store does not keep."""
        kind = "str" if ids.dtype.kind == "U" else "int"
        if ids.size and kind not in self.id_kinds:
            raise InputError(f"{self.engine}: ids must be {' or '.join(self.id_kinds)}, got {kind} ids "
                             f"(first: {ids[0]!r})")

    # --- collections --------------------------------------------------------------------
    @abstractmethod
    def exists(self, name: str) -> bool:
        """True when a collection (not an alias) called ``name`` exists."""

    @abstractmethod
    def create(self, name: str, dim: int, *, metric: str = "cosine", like: str | None = None) -> None:
        """Create an empty collection of ``dim``-dimensional vectors (``metric``: cosine or ip).

        ``like``: a collection whose other fields the new one declares too (same names and types),
        so :meth:`upsert` can carry them over.
        """

    def _require(self, name: str) -> str:
        """``name`` when a collection or alias of that name exists, else CollectionNotFoundError."""
        if not self.exists(name) and self.resolve_alias(name) is None:
            raise CollectionNotFoundError(f"{self.engine}: no collection or alias {name!r}")
        return name

    def _require_collection(self, name: str) -> str:
        """``name`` when a collection (not an alias) of that name exists, else CollectionNotFoundError."""
        if not self.exists(name):
            raise CollectionNotFoundError(f"{self.engine}: no collection {name!r}")
        return name

    def get_space(self, name: str) -> str | None:
        """The embedding space recorded on a collection (or alias), or None."""
        return None

    def set_space(self, name: str, space: str) -> None:
        """Record the embedding space of a collection's vectors."""

    def metric(self, name: str) -> str:
        """How a collection (or alias) ranks its rows: ``"cosine"``, ``"ip"`` (inner product: the rows' norms
        count), or another engine's metric as the engine names it, lower case (``"l2"``)."""
        return "cosine"

    def unsupported_fields(self, name: str) -> list[str]:
        """Fields of ``name`` a migration could not carry over (each with the reason); [] when all travel."""
        return []

    def missing_fields(self, name: str) -> dict[str, str]:
        """Which of the field names this store was opened with (``id_field``, ``vector_field``, ``text_field``)
        collection ``name`` lacks, each with what it has instead (for a refusal); CollectionNotFoundError when there
        is no such collection. A schemaless payload key (Qdrant's, a Milvus dynamic field's) is looked for in the
        collection's first rows, none of which has it when listed; an empty collection's is never listed."""
        self._require(name)
        return {}

    @abstractmethod
    def drop(self, name: str) -> None:
        """Drop a collection if it exists."""

    @abstractmethod
    def dim(self, name: str) -> int:
        """Vector dimension of a collection (or alias)."""

    @abstractmethod
    def count(self, name: str) -> int:
        """Number of rows (exact)."""

    # --- rows ---------------------------------------------------------------------------
    @abstractmethod
    def _upsert(self, name: str, ids: np.ndarray, vectors: np.ndarray, texts: list | None,
                fields: dict | None = None) -> None:
        ...

    def upsert(self, name: str, ids, vectors, texts=None, fields=None, sparse=None) -> None:
        """Insert or replace rows ``ids`` (n,) with ``vectors`` (n, d), optional ``texts`` (n) and
        ``fields`` ``{name: n values}`` (other fields of the rows; :data:`MISSING` leaves a row without the field,
        ``None`` writes a null), and ``sparse`` ``{name: n sparse vectors or None}`` where the store keeps them."""
        V = as_matrix(vectors, name="vectors")
        ids = as_ids(ids, V.shape[0])
        self.check_id_kind(ids)
        if texts is not None and len(texts) != V.shape[0]:
            raise PairCountError(f"{len(texts)} texts for {V.shape[0]} vectors")
        if np.unique(ids).shape[0] != ids.shape[0]:
            raise InputError("ids within one upsert must be distinct")
        fields = check_fields(fields, V.shape[0])
        core = {self.id_field, self.vector_field} | (set() if self.text_as_field else {self.text_field})
        clash = core & set(fields or ())
        if clash:
            raise InputError(f"fields {sorted(clash)} are the id, vector or text field of this store")
        texts = None if texts is None else [None if t is None else str(t) for t in texts]
        if not sparse:
            self._upsert(name, ids, V, texts, fields)
            return
        if not self.sparse_vectors:
            raise UnsupportedFieldError(f"{self.engine}: rows here carry no sparse vectors ({sorted(sparse)})")
        bad = [k for k, v in sparse.items() if len(v) != V.shape[0]]
        if bad:
            raise PairCountError(f"sparse vector {bad[0]!r}: {len(sparse[bad[0]])} values for {V.shape[0]} rows")
        self._upsert(name, ids, V, texts, fields, sparse=sparse)

    @abstractmethod
    def scan(self, name: str, *, after_id: int | None = None, batch_size: int = 1000,
             with_texts: bool = True, with_fields: bool = False) -> Iterator[Batch]:
        """Yield every row with ``id > after_id`` in ascending id order, ``batch_size`` at a time
        (``with_fields``: every other field of the rows in :attr:`Batch.fields`)."""

    def ids(self, name: str, *, batch_size: int = 10000) -> np.ndarray:
        """All ids of a collection, ascending (reads ids in batches)."""
        parts = [b.ids for b in self.scan(name, batch_size=batch_size, with_texts=False)]
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    @abstractmethod
    def fetch(self, name: str, ids, *, with_fields: bool = False) -> Batch:
        """Rows for ``ids``, in the order given; CollectionNotFoundError / InputError if any is missing."""

    @abstractmethod
    def _search(self, name: str, Q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        ...

    def search(self, name: str, Q, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` rows for each query row of ``Q`` (nq, d): scores ``S`` (nq, k), ids ``I`` (nq, k).

        Scores are cosine similarities (metric cosine) or inner products; missing slots are
        ``-inf`` / ``-1``.
        """
        Q = as_matrix(Q, name="queries", dim=self.dim(name))
        if int(k) < 1:
            raise InputError(f"k must be >= 1, got {k}")
        return self._search(name, Q, int(k))

    def target_index(self, like: str) -> str:
        """In words, the vector index a migration from ``like`` gives its target (what :meth:`create` /
        :meth:`finalize` build from ``like``'s own), e.g. ``"hnsw m=24 ef_construction=80"``."""
        return "the engine's default"

    def finalize(self, name: str, *, like: str | None = None) -> None:
        """Make a freshly written collection durable and searchable (flush, index, load); ``like``: the collection it
        was migrated from, whose vector index an engine that builds one here copies (pgvector)."""

    #: True while a migration's :meth:`finalize` runs (set by the migration): a stop asked meanwhile calls
    #: :meth:`interrupt`
    finalizing = False

    def interrupt(self) -> bool:
        """Cancel the :meth:`finalize` in progress (an index build), from a signal handler: True when it was asked to
        stop (it raises soon after), False when this engine cannot cancel it (it runs to its end)."""
        return False

    # --- aliases ------------------------------------------------------------------------
    @abstractmethod
    def set_alias(self, alias: str, name: str) -> None:
        """Point ``alias`` at collection ``name`` (create or switch)."""

    @abstractmethod
    def resolve_alias(self, alias: str) -> str | None:
        """The collection ``alias`` points at, or None."""

    def aliases_of(self, name: str) -> list[str]:
        """The aliases that point at collection ``name`` (dropping it would take them down with it)."""
        return []

    def close(self) -> None:
        """Release connections."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def pad_results(rows: list[list[tuple[int, float]]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Turn per-query ``[(id, score), ...]`` lists into padded ``S`` (nq, k) float32 and ``I`` (nq, k): int64, or
    an object array when some id is a string; missing slots are ``-inf`` / ``-1``."""
    S = np.full((len(rows), k), -np.inf, dtype=np.float32)
    strings = any(isinstance(i, str) for hits in rows for i, _ in hits)
    I = np.full((len(rows), k), -1, dtype=object if strings else np.int64)
    for r, hits in enumerate(rows):
        for c, (i, s) in enumerate(hits[:k]):
            I[r, c] = i
            S[r, c] = s
    return S, I
