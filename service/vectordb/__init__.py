"""Vector-database adapters: migrate stored vectors through a map, translate queries, verify.

>>> from service.vectordb import MilvusStore, migrate, FileCheckpoint, verify_migration   # doctest: +SKIP
>>> store = MilvusStore("http://127.0.0.1:19530")
>>> rep = migrate(store, "docs_minilm", "docs_e5", "minilm->e5@prod", registry=reg, alias="docs",
...               checkpoint=FileCheckpoint("docs.ckpt.json"), progress=print)
>>> verify_migration(store, "docs", embed=e5.passage)

Engines (optional extras; imported lazily): :class:`MilvusStore` (``pymilvus``, ``milvus-lite``),
:class:`PgVectorStore` (``psycopg``, ``pgvector``), :class:`QdrantStore` (``qdrant-client``).
"""

from __future__ import annotations

from .base import (Batch, BadNameError, CheckpointMismatchError, CollectionExistsError, CollectionNotFoundError,
                   MigrationRunningError, SpaceMismatchError, UnsupportedFieldError, VectorDBError, VectorStore)
from .checkpoint import Checkpoint, FileCheckpoint, MemoryCheckpoint, PgCheckpoint
from .migrate import (
    MigrationInterrupted,
    MigrationProgress,
    MigrationReport,
    map_fingerprint,
    map_spaces,
    migrate,
    resolve_map,
)
from .query import TranslatingSearcher
from .verify import check_rows, compare_to_reference, verify_migration

__all__ = [
    "VectorStore", "Batch", "MilvusStore", "PgVectorStore", "QdrantStore", "open_store",
    "migrate", "resolve_map", "map_spaces", "map_fingerprint", "MigrationProgress", "MigrationReport",
    "MigrationInterrupted", "MigrationRunningError", "SpaceMismatchError", "UnsupportedFieldError",
    "Checkpoint", "FileCheckpoint", "PgCheckpoint", "MemoryCheckpoint",
    "TranslatingSearcher", "verify_migration", "compare_to_reference", "check_rows",
    "VectorDBError", "CollectionNotFoundError", "CollectionExistsError", "CheckpointMismatchError", "BadNameError",
]

_LAZY = {"MilvusStore": ".milvus", "PgVectorStore": ".pgvector", "QdrantStore": ".qdrant"}


def __getattr__(name):  # engine modules import their client libraries only when used
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(name)


def open_store(url: str, **kw) -> VectorStore:
    """Open a store from a URL: ``milvus://host:port`` / ``milvus:///path.db``, ``postgresql://...``,
    ``qdrant://host:port`` / ``qdrant:///local/path``."""
    from .base import VectorDBError as _E
    from .base import safe_url

    if url.startswith(("postgresql://", "postgres://")):
        from .pgvector import PgVectorStore

        return PgVectorStore(url, **kw)
    if url.startswith("milvus://"):
        from .milvus import MilvusStore

        rest = url[len("milvus://"):]
        return MilvusStore(rest if rest.startswith("/") else f"http://{rest}", **kw)
    if url.startswith("qdrant://"):
        from .qdrant import QdrantStore

        rest = url[len("qdrant://"):]
        return QdrantStore(path=rest, **kw) if rest.startswith("/") else QdrantStore(url=f"http://{rest}", **kw)
    raise _E(f"unknown vector-database URL {safe_url(url)!r} (milvus://, postgresql://, qdrant://)")
