"""Vector-database adapters: migrate stored vectors through a map, translate queries, verify, e.g.::

    from service.vectordb import MilvusStore, migrate, FileCheckpoint, verify_migration
    store = MilvusStore("http://127.0.0.1:19530")
    rep = migrate(store, "docs_minilm", "docs_e5", "minilm->e5@prod", registry=reg, alias="docs",
                  checkpoint=FileCheckpoint("docs.ckpt.json"), progress=print)
    verify_migration(store, "docs", embed=e5.passage)

Engines (optional extras; imported lazily): :class:`MilvusStore` (``pymilvus``, ``milvus-lite``),
:class:`PgVectorStore` (``psycopg``, ``pgvector``), :class:`QdrantStore` (``qdrant-client``).
"""

from __future__ import annotations

from align.exceptions import InputError

from ..urls import check_pg_userinfo
from .base import (Batch, BadNameError, CheckpointMismatchError, CollectionExistsError, CollectionNotFoundError,
                   MigrationRunningError, SpaceMismatchError, UnsupportedFieldError, VectorDBError,
                   VectorDBUnavailableError, VectorStore, check_ca_file, safe_url)
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
    "VectorStore", "Batch", "MilvusStore", "PgVectorStore", "QdrantStore", "open_store", "check_store_url",
    "migrate", "resolve_map", "map_spaces", "map_fingerprint", "MigrationProgress", "MigrationReport",
    "MigrationInterrupted", "MigrationRunningError", "SpaceMismatchError", "UnsupportedFieldError",
    "Checkpoint", "FileCheckpoint", "PgCheckpoint", "MemoryCheckpoint",
    "TranslatingSearcher", "verify_migration", "compare_to_reference", "check_rows",
    "VectorDBError", "VectorDBUnavailableError", "CollectionNotFoundError", "CollectionExistsError",
    "CheckpointMismatchError", "BadNameError", "IndexBuildBusyError",
]

_LAZY = {"MilvusStore": ".milvus", "PgVectorStore": ".pgvector", "QdrantStore": ".qdrant",
         "IndexBuildBusyError": ".pg_index"}


def __getattr__(name):  # engine modules import their client libraries only when used
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(name)


def open_store(url: str, *, api_key: str | None = None, ca_file=None, **kw) -> VectorStore:
    """Open a store from a URL.

    - ``milvus://host:port`` (plain gRPC), ``milvus+https://host:port`` (TLS), ``milvus:///path.db`` (Milvus
      Lite embedded); a secured server takes ``milvus+https://user:password@host:port`` or ``api_key`` (a
      Zilliz Cloud API key), not both;
    - ``postgresql://...`` (libpq URL; its password, ``sslmode`` and ``sslrootcert`` as libpq reads them);
    - ``qdrant://host:port`` (HTTP), ``qdrant+https://host:port`` (TLS), ``qdrant:///local/path``; a secured
      server takes ``api_key`` (sent as Qdrant's ``api-key`` header).

    ``ca_file``: a PEM file of the certificate authority (or the self-signed certificate) a TLS server's
    certificate is checked against, when it is not one the system trusts. Errors name the URL without a
    password and never the key.
    """
    scheme, rest = check_store_url(url, api_key=api_key, ca_file=ca_file)
    _need_client(scheme)
    if scheme.startswith("postgres"):  # libpq reads the whole URL (a socket URL's rest starts with "/" too)
        from .pgvector import PgVectorStore

        return PgVectorStore(url, **kw)
    tls, local = scheme.endswith("+https"), rest.startswith("/")
    if scheme.startswith("milvus"):
        from .milvus import MilvusStore

        if local:
            return MilvusStore(rest, **kw)
        hostport, token = _split_userinfo(rest, url)
        if hostport.lower().endswith(".db"):  # pymilvus opens any URI ending in .db as a Milvus Lite file (host
            hostport += "/"  # milvus.db, or database x.db): a "/" keeps the server, its default port, the database
        return MilvusStore(f"{'https' if tls else 'http'}://{hostport}", token=token or api_key, ca_file=ca_file,
                           **kw)
    from .qdrant import QdrantStore

    if local:
        return QdrantStore(path=rest, **kw)
    hostport, _ = _split_userinfo(rest, url)
    return QdrantStore(url=f"{'https' if tls else 'http'}://{hostport}", api_key=api_key, ca_file=ca_file, **kw)


def check_store_url(url: str, *, api_key: str | None = None, ca_file=None) -> tuple[str, str]:
    """``(scheme, rest)`` of a URL :func:`open_store` takes with this API key and CA file: VectorDBError for an
    unknown scheme, InputError for what cannot work (an API key or CA file for PostgreSQL, an unescaped ``@`` in a
    PostgreSQL password, a user or password in a Qdrant URL, TLS for a local store, a CA file that is missing or
    holds no PEM certificate, ...), never naming the password or the key. Reads the CA file; connects to nothing
    and needs no client library: the settings run it at start-up, so a service configured so does not start (it
    started, and answered every migration or search with a 422 InputError)."""
    scheme, sep, rest = str(url).partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in SCHEMES:
        raise VectorDBError(f"unknown vector-database URL {safe_url(url)!r} (milvus://, milvus+https://, "
                            "postgresql://, qdrant://, qdrant+https://)")
    if scheme.startswith("postgres"):
        if api_key or ca_file:
            raise InputError("postgresql: give the password in the URL or PGPASSWORD, and TLS as libpq's "
                             "sslmode / sslrootcert URL parameters (no API key or CA file setting)")
        check_pg_userinfo(url, "PostgreSQL vector-database URL")
        return scheme, rest
    tls = scheme.endswith("+https")
    local = rest.startswith("/")
    if local and (tls or api_key or ca_file):
        raise InputError(f"{safe_url(url)}: a local {scheme.split('+')[0]} store takes no TLS, API key or CA file")
    if ca_file is not None and not tls:
        raise InputError(f"a CA file is for TLS: use {scheme}+https:// (got {safe_url(url)!r})")
    if ca_file is not None:
        check_ca_file(ca_file)  # a missing or non-PEM file: every migration and search of the store failed (422)
    if not local:
        _check_not_a_path(scheme, rest, url)
        _, userinfo = _split_userinfo(rest, url)
        if userinfo and api_key and scheme.startswith("milvus"):
            raise InputError("milvus: give user:password in the URL or an API key, not both")
        if userinfo and scheme.startswith("qdrant"):
            raise InputError("qdrant: a URL takes no user or password (the URL is not repeated here: its user part "
                             "may be a secret); give the API key as VECBRIDGE_VECTORDB_API_KEY (or api_key=)")
    return scheme, rest


SCHEMES = ("milvus", "milvus+https", "postgresql", "postgres", "qdrant", "qdrant+https")
#: the client libraries of each kind of store (the ``vectordb-clients`` extra)
_CLIENTS = {"milvus": ("pymilvus",), "postgres": ("psycopg", "pgvector"), "qdrant": ("qdrant_client",)}


def _need_client(scheme: str) -> None:
    """VectorDBError (503 without Retry-After, exit 2: installing it is the fix, not a retry) naming the extra when
    the store's client library is not installed: it was an ImportError (HTTP 500, exit 3) from inside the store,
    e.g. in a Docker image built without it."""
    import importlib

    for module in _CLIENTS[scheme.split("+")[0].replace("postgresql", "postgres")]:
        try:
            importlib.import_module(module)
        except ImportError:
            raise VectorDBError(f"a {scheme.split('+')[0]} store needs the Python package {module!r}, which is not "
                                "installed here: pip install 'vecbridge[vectordb-clients]'") from None


def _check_not_a_path(scheme: str, rest: str, url: str) -> None:
    """InputError for a URL after ``://`` that is clearly a local path written with two slashes: no port, and it
    starts with ``./``, ``../`` or ``~/`` (``qdrant://./q``), or is a ``.db`` file in a folder
    (``milvus://data/docs.db``), or a ``.db`` file that exists here (``milvus://docs.db`` beside ``./docs.db``).
    It was taken for a server at host ``docs.db``, and Milvus Lite then made ``./http:/docs.db/`` in the working
    directory (even on a dry run) and answered "no source collection". A server's host may end in ``.db`` (a
    Kubernetes service ``milvus.db`` in namespace ``db``): ``milvus://milvus.db`` is one unless ``./milvus.db``
    exists, and a port always marks a server, with any path after it (Milvus: the database; Qdrant: the prefix
    behind a proxy). ``qdrant://data/q`` (a path, no port, no TLS) is refused naming both forms: it was taken for
    the server ``data:6333`` with the prefix ``/q`` ("cannot connect", exit 75) where a relative folder was meant;
    ``qdrant+https://host/prefix`` stays a server (TLS has no local form). Refusing every name ending in ``.db``
    stopped a service configured with such a host from starting (the settings check the URL at start-up)."""
    import os

    where = _split_userinfo(rest.partition("?")[0].partition("#")[0].rstrip("/"), url)[0]
    host, _, tail = where.partition("/")
    if ":" in host or host.startswith("["):  # a port (or an IPv6 address): a server
        return
    db = where.lower().endswith(".db")
    here = db and not tail and os.path.exists(where)
    engine = scheme.split("+")[0]
    local = ("a local Milvus Lite file is milvus:///ABSOLUTE/path.db" if engine == "milvus"
             else "a local Qdrant folder is qdrant:///ABSOLUTE/path")
    if scheme == "qdrant" and tail and host not in (".", "..", "~"):  # qdrant://data/q: a folder or a prefix? (no
        # user part in the message: a Qdrant URL's may be a secret)
        raise InputError(f"'qdrant://{where}' has a path but no port: it is neither a documented Qdrant server nor a "
                         f"folder; {local} (three slashes), and a server behind a proxy takes its port before the "
                         f"prefix: qdrant://{host}:6333/{tail}")
    if not (host in (".", "..", "~") or (db and tail) or here):
        return
    raise InputError(f"{safe_url(url)!r} names a file{f' (./{where} exists here)' if here else ''}, not a {engine} "
                     f"server: {local} (three slashes); a server is {engine}://host:port (its port marks it as one)")


def _split_userinfo(rest: str, url: str) -> tuple[str, str | None]:
    """``"user:pw@host:port/..."`` → ``("host:port/...", "user:pw")``, percent-decoded; no ``@``: ``(rest, None)``."""
    from urllib.parse import unquote

    head, _, tail = rest.partition("/")
    if "@" not in head:
        return rest, None
    info, _, host = head.rpartition("@")
    if not host:
        raise InputError(f"no host after the user part of the {str(url).partition('://')[0]}:// URL (the URL is not "
                         "repeated here: it may hold a password)")
    user, _, pw = info.partition(":")
    return host + ("/" + tail if tail else ""), f"{unquote(user)}:{unquote(pw)}" if pw else unquote(user)
