"""Settings: one object, read from ``VECBRIDGE_*`` environment variables, injected everywhere.

No other module reads the environment. Tests build ``Settings(...)`` directly and override
the FastAPI dependency ``get_settings``.

The faces read the environment through :func:`load_settings`: a ``VECBRIDGE_*`` variable that names no
setting (``VECBRIDGE_PROT``, ``VECBRIDGE_LIMITS__MAX_KK``), a value that does not parse (``VECBRIDGE_PORT=abc``,
``VECBRIDGE_API_KEYS`` that is not JSON) or breaks a rule (an unknown key scope, an unknown log level) is a
:class:`ConfigError` naming the variable -- one line, never the value of a key -- instead of a default used in
silence or a traceback. An empty variable counts as unset (``VECBRIDGE_ARTIFACT_DIR=`` from an env file or an
unset compose variable put the artifacts in the working directory).

Secrets from files (Docker / Kubernetes secrets, as the postgres image's ``POSTGRES_PASSWORD_FILE``): any setting
``X`` may be given as ``VECBRIDGE_X_FILE=/run/secrets/...``, the file holding the value (trailing white space
dropped; JSON for list and object settings), so keys and database passwords stay out of the process environment
and ``docker inspect``. Giving both ``VECBRIDGE_X`` and ``VECBRIDGE_X_FILE`` is refused. The service re-reads an
``api_keys`` file when it changes (:func:`service.api.deps.current_keys`): keys are added or revoked without a
restart.
"""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict
from pydantic_settings import SettingsError as _EnvParseError

from align.exceptions import InputError

from .errors import did_you_mean
from .limits import Limits

__all__ = ["DEFAULT_ARTIFACTS", "LOG_LEVELS", "SCOPES", "ConfigError", "Settings", "check_api_keys", "check_option",
           "check_registry_url", "check_root_path", "get_settings", "load_settings", "read_setting_file"]

SCOPES = ("read", "write")
#: the data dir's own artifact folder, where ``artifact_dir`` is unset (:meth:`Settings.resolved_artifact_dir`)
DEFAULT_ARTIFACTS = "artifacts"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: ``VECBRIDGE_*`` names that are not settings: the Ray watcher's mark (service.distributed), the test suite's
#: and the benchmarks' own variables
_NOT_SETTINGS = ("VECBRIDGE_RAY_OWNER", "VECBRIDGE_TEST_", "VECBRIDGE_RUN_SLOW", "VECBRIDGE_CONSOLE_",
                 "VECBRIDGE_WORDNET_DIR", "VECBRIDGE_BENCH_CACHE")
# errors name the variable, never its keys or values (database URLs may hold passwords)
_SECRET_FIELDS = ("api_keys", "vectordb_api_key", "registry_url", "vectordb_url")
_REGISTRY_SCHEMES = ("sqlite:///", "postgresql://", "postgres://")  # what service.registry.db.open_db opens
_FILE = "_FILE"  # VECBRIDGE_<SETTING>_FILE: the setting's value is that file's content


class ConfigError(InputError):
    """A ``VECBRIDGE_*`` variable (or setting) that names no setting or holds a value the setting refuses."""


class Settings(BaseSettings):
    """Service, CLI and registry settings (environment prefix ``VECBRIDGE_``)."""

    model_config = SettingsConfigDict(env_prefix="VECBRIDGE_", env_nested_delimiter="__", extra="ignore",
                                      env_ignore_empty=True)

    data_dir: Path = Field(Path("./var"), description="Registry database, artifacts, indexes and reports live here.")
    registry_url: str | None = Field(
        None, description="sqlite:///path or postgresql://...; default: SQLite under data_dir.")
    registry_pool_size: int = Field(8, ge=1, le=1024, description=(
        "PostgreSQL registry: connections each serving process (each worker of --workers N) keeps at most, shared "
        "by its threads; more concurrent requests wait for one. Replicas x workers x this must stay below the "
        "server's max_connections (default 100)."))
    registry_statement_timeout_s: float = Field(30.0, ge=0, le=3600, description=(
        "PostgreSQL registry: longest a query may run or wait for another session's lock (a migration, an open "
        "psql transaction) before the request is a 503; also the longest wait for a free pooled connection. "
        "0: no limit (for both); else at least 0.001 (PostgreSQL counts whole milliseconds)."))
    artifact_dir: Path | None = Field(None, description="Artifact folder; default data_dir/artifacts.")
    report_dir: Path | None = Field(None, description=(
        "Fit reports (HTML). Default: data_dir/reports; with artifact_dir set, artifact_dir/reports (on the "
        "artifacts' volume, which replicas share), or artifact_dir/../reports where reports already are (the "
        "layout before this setting). The CLI and the service use the same folder."))
    vectordb_url: str | None = Field(
        None, description="The vector database beside the service (qdrant://host:port, milvus://..., "
                          "postgresql://...): the default store of migrations and query-side translation.")
    vectordb_api_key: str | None = Field(None, description=(
        "API key of a secured Qdrant (sent as its api-key header) or Milvus / Zilliz Cloud (the token) server: "
        "VECBRIDGE_VECTORDB_API_KEY_FILE=/run/secrets/... keeps it out of the environment. Use it with "
        "qdrant+https:// or milvus+https:// URLs (TLS), so the key does not cross the network in clear."))
    vectordb_ca_file: Path | None = Field(None, description=(
        "PEM file of the certificate authority (or the self-signed certificate) that a qdrant+https:// or "
        "milvus+https:// server's certificate is checked against; default: the system's trusted CAs."))
    vectordb_index_wait_s: float = Field(60.0, ge=0, le=86400, description=(
        "PostgreSQL vector database: longest a migration's index build of its target waits for another session's "
        "lock on it (the build a run killed during it left running on the server) before the run stops with exit "
        "75 (a job: failed), naming that session's pid; the next run keeps that build's index. 0: no limit."))
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535, description="TCP port of the HTTP service.")
    root_path: str = Field("", description=(
        "The path prefix a reverse proxy serves the service under, stripped before passing requests on "
        "(nginx `location /vb/ { proxy_pass http://vecbridge:8000/; }`, an ingress rewrite) or not (an ingress "
        "without a rewrite, Traefik without StripPrefix; a prefix named as a path of the service, /v1, /ui..., "
        "must be stripped): e.g. /vb. /docs, the "
        "console, the OpenAPI document's `servers` and redirects then carry it (the ASGI root_path, as uvicorn's "
        "--root-path). Empty (default): served at /. Starts with '/' and does not end with one."))
    # {"key": ["read", "write"], ...}; empty and auth_disabled=False means every request is refused.
    api_keys: dict[str, list[str]] = Field(default_factory=dict)
    auth_disabled: bool = Field(False, description="Turn API keys off (local use only; must be explicit).")
    local_key: bool = Field(True, description=(
        "`vecbridge serve` with no api_keys and auth on: create one read+write key in <data_dir>/local-key "
        "(mode 0600, kept across restarts) and say where it is, so a first run is usable at once."))
    cors_origins: list[str] = Field(default_factory=list)
    allowed_hosts: list[str] = Field(default_factory=list, description=(
        "Host header names the service answers, as Django's ALLOWED_HOSTS (e.g. [\"vecbridge\", \"10.0.0.5\", "
        "\"*.internal.example\"]): exact names or addresses (no port), '*.domain' for its subdomains, '*' for any; "
        "other hosts get a 400. Empty (default): any host while API keys are on (the key guards every route); with "
        "auth_disabled, only loopback names (localhost, 127.0.0.1, ::1) and a specific bind host, so a web page "
        "cannot reach a key-less service through DNS rebinding. /healthz and /readyz answer any host (probes)."))
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1)
    max_batch: int = Field(65536, ge=1)
    header_timeout_s: float = Field(30.0, gt=0, le=3600, description=(
        "Longest wait for a request's line and headers, from the connection's opening (or the first byte of the "
        "next request on a kept-alive one): a connection that sends nothing, or its headers a byte at a time, "
        "is closed (without it, such connections were held for ever, before any key check)."))
    send_timeout_s: float = Field(60.0, gt=0, le=3600, description=(
        "Longest wait for a client to read more of an answer that fills the connection's buffers (as nginx's "
        "send_timeout): a client that stops reading has its connection dropped and the buffered answer freed."))
    keep_alive_timeout_s: float = Field(75.0, gt=0, le=3600, description=(
        "Longest an idle kept-alive connection stays open between requests (uvicorn's timeout_keep_alive; "
        "nginx's keepalive_timeout): above the idle timeout of a proxy in front (nginx upstream keepalive and "
        "ALB: 60 s), so the proxy closes first. uvicorn's 5 s closed connections a proxy was about to reuse: "
        "sporadic 502s, and nginx does not retry a POST."))
    body_timeout_s: float = Field(60.0, gt=0, le=3600, description=(
        "Longest wait for the next bytes of a request body that has begun (as nginx's client_body_timeout): "
        "a client that stalls mid-upload gets a 408 and its connection and buffered bytes are released."))
    body_min_rate_bytes_s: float = Field(4096.0, ge=0, le=1 << 30, description=(
        "Slowest average rate (bytes/s, since its reading began) of a request body once it has been sent for "
        "body_timeout_s: slower is a 408 and the connection closed (as Apache's mod_reqtimeout MinRate). 4 KiB/s "
        "is slower than any real link (32 kbit/s) yet cuts a client sending a byte just inside each "
        "body_timeout_s, which body_timeout_s alone let hold its connection for ever. 0: no minimum."))
    max_connections: int = Field(4096, ge=0, le=1 << 20, description=(
        "Connections (or requests in flight) per serving process beyond which a new request is answered 503 and "
        "its connection closed (uvicorn's limit_concurrency): keeps the process's file descriptors short of "
        "its open-files limit, where every request, /healthz included, failed. 0: no limit."))
    shutdown_timeout_s: float = Field(25.0, gt=0, le=3600, description=(
        "Longest wait, after SIGTERM / SIGINT, for the requests in flight to finish before they are cancelled "
        "(answered 503 ServiceStoppingError) and the shutdown completes (running jobs recorded interrupted, the "
        "'service stopped' line): below an orchestrator's kill deadline (Kubernetes: 30 s; raise Docker's 10 s with "
        "--stop-timeout). Without it a request that kept going (a stalled upload, a long plan) held the stop until "
        "the SIGKILL."))
    worker_healthcheck_timeout_s: float = Field(60.0, ge=1, le=3600, description=(
        "serve --workers N: longest the supervisor waits for a starting worker's answer to its health check "
        "(uvicorn's timeout_worker_healthcheck) before it kills the worker and starts another. A worker answers "
        "once it has imported the app (FastAPI, FAISS, the service): on the 2-core development machine 3-5 s at "
        "load 7, up to 13 s (2 workers) and 19 s (4 workers) at load 8 and 30 s at load 17, so uvicorn's 5 s killed "
        "starting workers in a loop and the service never served. Once its server has started, a worker answers "
        "from a thread of its own (at most 0.5 s at load 17), so a hung one is replaced after min(this, 10 s). A "
        "SIGTERM / SIGINT never waits for a check: a worker that neither answers nor ends within 2 s of it is "
        "killed."))
    limits: Limits = Field(default_factory=Limits, description="Every other size limit (service/limits.py); "
                                                               "e.g. VECBRIDGE_LIMITS__MAX_K=500.")
    metrics_access: Literal["open", "key", "off"] = Field(
        "key", description="/metrics: open to anyone, a key with the read scope, or off (404).")
    max_queued_jobs: int = Field(8, ge=0, description=(
        "Background jobs (fits, steer fits) waiting to run, per serving process (with --workers N, up to N times "
        "as many in the data dir); more are a 429 with Retry-After. A job a free worker takes at once does not "
        "wait: 0 runs jobs only on idle workers."))
    max_queued_jobs_per_key: int | None = Field(None, ge=0, description=(
        "Background jobs one API key may have waiting, per serving process, counted as max_queued_jobs counts; "
        "more of that key's are a 429 with Retry-After while other keys still queue theirs (one key submitting "
        "back to back took every place). Unset (the default): half of max_queued_jobs, at least 1, once two or "
        "more keys have the write scope; with one such key, or auth off (every caller is then one key), no bound "
        "of its own: the one user has the whole queue. A number applies to every key (auth off: to all callers "
        "together); 0 runs a key's jobs only on idle workers; max_queued_jobs or more: no per-key bound."))
    job_workers: int = Field(1, ge=1, le=256, description="Background jobs running at once, per serving process.")
    job_history: int = Field(10_000, ge=100, le=1_000_000, description=(
        "Finished job records kept in the data dir's jobs.sqlite (every process of it), the newest first; older "
        "ones are deleted at start-up and every 100 new jobs, and their idempotency keys are free again. A 384-d "
        "fit's record takes ~2-4.3 KB (an auto fit's selection table the most): 10,000, up to ~43 MB."))
    max_heavy_requests: int = Field(2, ge=1, le=256, description=(
        "Synchronous requests that compute for seconds (POST /v1/plans, /v1/maps/{ref}/evaluate) running at once "
        "in a serving process; more are a 429 with Retry-After at once. Unbounded, 45 concurrent plans on 2 "
        "cores held the thread pool and starved the event loop: /healthz took 8 s."))
    compute_threads: int = Field(default_factory=lambda: max(2, os.cpu_count() or 2), ge=1, le=256, description=(
        "Threads for the CPU-heavy work of requests (text embeddings, plans, evaluations, and transforms, searches "
        "and index writes whose body is over 1 MiB), apart from the thread pool of every other route: more such "
        "requests wait their turn. Default: the CPU count (at least 2). Sharing the pool, 45 concurrent embedding "
        "requests held all its threads and GET /v1/maps waited 32 s."))
    compute_max_waiting: int = Field(64, ge=0, le=100_000, description=(
        "Requests waiting for a turn on the compute_threads per serving process, each holding its parsed body; more "
        "are a 429 with Retry-After at once. Unbounded, a burst of large transforms, searches or embeddings all "
        "waited, their bodies held in memory, instead of being told to retry. 0: none waits."))
    blas_threads: int = Field(1, ge=0, le=256, description=(
        "Threads of the BLAS and of FAISS's OpenMP in a serving process (service/threads.py): 1 keeps small "
        "requests from stalling on spinning thread teams when the host is busy; 0 leaves the libraries' "
        "defaults (every core, faster fits over HTTP on an idle host)."))
    malloc_keep_mb: int = Field(64, ge=0, le=1024, description=(
        "Freed C heap a serving process keeps per malloc arena instead of returning it to the kernel after "
        "each request (glibc's trim threshold, service/memory.py): large binary requests then reuse their "
        "pages instead of faulting them in again. 0 leaves glibc's defaults."))
    map_cache_mb: int = Field(512, ge=1, le=1 << 20, description=(
        "Memory (MiB) a serving process gives the loaded maps, steers and paths of maps it keeps for the next "
        "requests, measured by their arrays (service/registry/cache.py; /v1/info shows it and what is held): the "
        "least recently used leave first. A map larger than this (its arrays with the apply plan it builds, about "
        "twice W) is served but read again at each use: 512 MiB keeps about four 4,096-d linear maps."))
    min_free_bytes: int = Field(100 * 1024 * 1024, ge=0,
                                description="/readyz is not ready while data_dir has less free space than this.")
    search_device: str = Field("cpu", description=(
        "Where flat indexes are searched: 'cpu' (FAISS) or 'cuda' / 'cuda:N' (exact inner product and top-k with "
        "torch on that GPU, the same ids as FAISS; service/indexes/device.py). HNSW and IVF indexes stay on the "
        "CPU. A server asked for a GPU it cannot use refuses to start."))
    demo_on_empty: bool = True
    preload_encoders: list[str] = Field(default_factory=list, description=(
        "Encoders (names or short aliases such as minilm, e5) a serving process loads at start-up, so no text "
        "request waits for one; /readyz is not ready until each has embedded a first text (service/ops/preload.py). "
        "An unknown name fails the start-up. Environment: a JSON list, e.g. '[\"minilm\"]'."))
    path_alias: str = Field("prod", description=(
        "Alias that pins a map's version for paths between spaces (search, embeddings) and for a bare map or steer "
        "NAME (transform, /v1/maps path_version, `registry path`); without it a map contributes its newest reliable "
        "version, and parallel maps rank by held-out top-1."))
    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING, ERROR or CRITICAL (any case).")
    #: {setting name: file} of the settings read from ``VECBRIDGE_<NAME>_FILE`` (:func:`load_settings`)
    _files: dict[str, str] = PrivateAttr(default_factory=dict)
    #: the ``<data_dir>/local-key`` file the only key came from (``service.api.app.ensure_local_key``); never a setting
    _local_key_file: Path | None = PrivateAttr(None)

    @field_validator("registry_statement_timeout_s")
    @classmethod
    def _check_statement_timeout(cls, s: float) -> float:
        if 0 < s < 0.001:  # PostgreSQL counts whole ms: it was rounded to 0, no limit at all
            raise ValueError(f"must be 0 (no limit) or at least 0.001 (1 ms), got {s:g}")
        return s

    @field_validator("data_dir", "artifact_dir", "report_dir", "vectordb_ca_file")
    @classmethod
    def _expand_home(cls, path: Path | None) -> Path | None:  # `~/vb` (not expanded by the shell: `--data-dir=~/vb`,
        return None if path is None else path.expanduser()    # an env file) was a folder named '~' in the cwd

    @field_validator("root_path")
    @classmethod
    def _check_root_path(cls, root: str) -> str:
        return check_root_path(root)

    @field_validator("path_alias")
    @classmethod
    def _check_path_alias(cls, alias: str) -> str:
        from .registry.names import check_alias

        return check_alias(alias)

    @field_validator("search_device")
    @classmethod
    def _check_search_device(cls, name: str) -> str:
        from .indexes.device import check_device

        return check_device(name)

    @field_validator("preload_encoders")
    @classmethod
    def _check_encoders(cls, names: list[str]) -> list[str]:
        from .encoders import (  # names only: no model code is imported
            UnknownEncoderError,
            canonical_names,
        )

        try:
            return canonical_names(names)
        except UnknownEncoderError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("registry_url")
    @classmethod
    def _check_registry_url(cls, url: str | None) -> str | None:
        return check_registry_url(url)

    @field_validator("vectordb_url")
    @classmethod
    def _check_vectordb_url(cls, url: str | None) -> str | None:
        """A scheme :func:`service.vectordb.open_store` opens. Before, a typo (``qdrnat://``) was accepted, /readyz said
        ready, and every migration or collection search was a 503 naming the URL."""
        if url is None:
            return url
        from .vectordb import SCHEMES

        scheme, sep, _ = url.partition("://")
        if not sep or scheme.lower() not in SCHEMES:
            raise ValueError(f"unknown vector-database URL scheme {scheme[:20] if sep else 'none'!r} (the rest is not "
                             f"shown): use one of {', '.join(s + '://' for s in SCHEMES)}")
        return url

    @model_validator(mode="after")
    def _check_vectordb_access(self) -> Settings:
        """The vector database's URL with its API key and CA file, checked as :func:`service.vectordb.open_store`
        checks them before it connects (:func:`service.vectordb.check_store_url`, one code for both). A PostgreSQL
        URL with an API key, or a Qdrant URL with a user and password, made a service that started and then
        answered every migration, verify and collection search with a 422 InputError, blaming its clients."""
        if self.vectordb_url is None:
            return self
        from align.exceptions import VecbridgeError

        from .vectordb import check_store_url

        try:
            check_store_url(self.vectordb_url, api_key=self.vectordb_api_key, ca_file=self.vectordb_ca_file)
        except VecbridgeError as exc:  # its messages never hold the password or the key
            raise ValueError(f"VECBRIDGE_VECTORDB_URL (with VECBRIDGE_VECTORDB_API_KEY and _CA_FILE as set): "
                             f"{exc}") from None
        return self

    @field_validator("api_keys")
    @classmethod
    def _check_keys(cls, keys: dict[str, list[str]]) -> dict[str, list[str]]:
        return check_api_keys(keys)

    @field_validator("log_level")
    @classmethod
    def _check_level(cls, level: str) -> str:
        if level.strip().upper() not in LOG_LEVELS:
            raise ValueError(f"give one of {', '.join(LOG_LEVELS)}")
        return level.strip().upper()

    @field_validator("cors_origins")
    @classmethod
    def _check_origins(cls, origins: list[str]) -> list[str]:
        """Each entry as a browser sends its ``Origin`` (the CORS middleware compares exactly): scheme and host in
        lower case, no trailing ``/``, no default port; an entry that is no origin (no scheme, a path) is refused.
        Before, ``https://app.example/`` or ``app.example`` was accepted and matched no request, in silence."""
        out = []
        for o in origins:
            o = o.strip()
            if o == "*":
                out.append(o)
                continue
            try:
                p = urlsplit(o)
                port = p.port
            except ValueError:
                p, port = None, None
            if p is None or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", p.scheme or "") or not p.hostname \
                    or p.path not in ("", "/") or p.query or p.fragment or "@" in p.netloc or "?" in o or "#" in o:
                raise ValueError(f"cors_origins entry {o[:60]!r}: give an origin as a browser sends it, "
                                 "scheme://host[:port] with no path (e.g. https://app.example), or '*'")
            scheme, host = p.scheme.lower(), p.hostname.lower()
            if ":" in host:  # an IPv6 literal
                host = f"[{host}]"
            default = {"http": 80, "https": 443}.get(scheme)
            out.append(f"{scheme}://{host}" + (f":{port}" if port is not None and port != default else ""))
        return out

    @field_validator("allowed_hosts")
    @classmethod
    def _check_hosts(cls, hosts: list[str]) -> list[str]:
        out = []
        for raw in hosts:
            h = raw.strip().lower().rstrip(".")
            if h.startswith("[") and h.endswith("]"):  # an IPv6 literal as written in a URL
                h = h[1:-1]
            if not h or len(h) > 255 or any(c.isspace() or c in "/@?#" for c in h) or "*" in h[1:] \
                    or (h.startswith("*") and h != "*" and not h.startswith("*.")):
                raise ValueError(f"allowed_hosts entry {h[:60]!r}: give a host name or address, '*.domain' or '*'")
            if h.count(":") == 1 or "[" in h or "]" in h:  # the Host check drops the port: it would match nothing
                raise ValueError(f"allowed_hosts entry {raw.strip()[:60]!r}: give the name without a port "
                                 f"(the Host check compares names only, any port is answered), e.g. 'localhost'")
            if h == "*" and raw.strip() != "*":  # "*." became "*": any host
                raise ValueError(f"allowed_hosts entry {raw.strip()[:60]!r} names no domain: give '*.domain', "
                                 f"or '*' to answer any host")
            out.append(h)
        return out

    # The two private attributes are read from pydantic's own dict of them: ``self._files`` fails the plain lookup
    # first (an AttributeError made, its message formatted, then caught by pydantic's __getattr__), ~6 µs where this
    # is ~0.2 µs; every authenticated request reads ``files`` (the keys file, :func:`service.api.keyfile.current_keys`)
    @property
    def files(self) -> dict[str, str]:
        """``{setting name: file}`` of the settings whose value came from ``VECBRIDGE_<NAME>_FILE`` (read only)."""
        return self.__pydantic_private__["_files"]

    @property
    def local_key_file(self) -> Path | None:
        """The file of the key ``vecbridge serve`` made because none was configured (None: keys are configured, or
        auth is off): where a 401 and the console tell a user to look. Read only; no variable sets it."""
        return self.__pydantic_private__["_local_key_file"]

    def to_env(self) -> dict[str, str]:
        """These settings as ``VECBRIDGE_*`` variables, so worker processes read the same :class:`Settings`; a
        setting read from a file is passed on as its ``_FILE`` variable (the secret stays out of the environment,
        and every worker re-reads a changed keys file)."""
        out = {}
        for name, value in self.model_dump(mode="json").items():
            if name in self._files:
                out[f"VECBRIDGE_{name.upper()}{_FILE}"] = self._files[name]
            elif value is not None:
                out[f"VECBRIDGE_{name.upper()}"] = value if isinstance(value, str) else json.dumps(value)
        return out

    def resolved_registry_url(self) -> str:
        if self.registry_url:
            return self.registry_url
        return f"sqlite:///{(self.data_dir / 'registry.sqlite').resolve()}"

    def registry_options(self) -> dict:
        """The keyword arguments of :func:`service.registry.open_registry` that come from these settings."""
        return {"report_dir": self.resolved_report_dir(), "pool_size": self.registry_pool_size,
                "statement_timeout_s": self.registry_statement_timeout_s, "cache_bytes": self.map_cache_mb << 20,
                "path_alias": self.path_alias}

    def resolved_artifact_dir(self) -> Path:
        return (self.artifact_dir or self.data_dir / DEFAULT_ARTIFACTS).resolve()

    def resolved_report_dir(self) -> Path:
        """Where fit reports are written and read (the registry records them relative to it); see ``report_dir``.

        Before, the CLI used data_dir/reports and the service artifact_dir/../reports: with ``artifact_dir`` set
        (docker-compose's shared /artifacts) a report the CLI wrote was a 404 over HTTP, and the service wrote
        to /reports, outside any volume (not writable by the image's user: every report was lost).
        """
        if self.report_dir is not None:
            return self.report_dir.resolve()
        if self.artifact_dir is None:
            return (self.data_dir / "reports").resolve()
        art = self.resolved_artifact_dir()
        legacy = art.parent / "reports"
        return legacy if legacy.is_dir() else art / "reports"


def check_registry_url(url: str | None) -> str | None:
    """``url`` when the registry can open it (``sqlite:///...``, ``postgresql://...``) or None; else ValueError naming
    its scheme only (the rest may hold a password). Before, another URL was accepted by the settings and the start-up
    of ``vecbridge serve`` failed later, a traceback in a JSON log line (exit 3) that quoted the URL's password."""
    if url == "":
        raise ValueError("empty registry URL: use sqlite:///path or postgresql://user@host:port/db")
    if url is not None and not url.startswith(_REGISTRY_SCHEMES):
        scheme = url.partition("://")[0][:20] if "://" in url else "none"
        raise ValueError(f"unsupported registry URL (scheme {scheme!r}; the rest is not shown): use "
                         "sqlite:///path or postgresql://user@host:port/db")
    if url is not None and url.startswith("postgres"):  # parsed now, as the registry will: a bad %-escape failed
        from .registry.postgres import pg_conninfo  # the start-up later, a traceback (exit 3)

        try:  # InvalidNameError (a ValueError) without the URL's text
            pg_conninfo(url.split("?schema=")[0].split("&schema=")[0])
        except ImportError:  # no psycopg: said where the registry opens
            pass
    return url


def check_root_path(root: str) -> str:
    """``root`` when it can prefix the service's paths ("" or "/a/b"); else ValueError saying what to write."""
    if root and (not root.startswith("/") or root.endswith("/") or "//" in root
                 or not all(c.isalnum() or c in "/-._~" for c in root)):
        raise ValueError(f"a path prefix starts with '/', does not end with one and holds letters, digits and "
                         f"'-._~' between single slashes, e.g. /vecbridge (or empty: served at /); got {root[:80]!r}")
    return root


def check_option(name: str, value, option: str):
    """``value`` of the setting ``name`` given as the command-line ``option``, checked as the setting is (the CLI
    puts options in with ``model_copy``, which does not validate); else a :class:`ConfigError` naming the option."""
    field = Settings.model_fields[name]
    try:
        return TypeAdapter(Annotated[field.annotation, field]).validate_python(value)
    except ValidationError as exc:
        raise ConfigError(f"{option}: {exc.errors()[0]['msg']}, got {str(value)[:80]!r}") from None


def check_api_keys(keys: dict[str, list[str]]) -> dict[str, list[str]]:
    """``keys`` ({key: scopes}) when every key can be sent in a header and every scope is known; else ValueError
    (naming the key by its position, never its text)."""
    if not isinstance(keys, dict) or not all(isinstance(k, str) and isinstance(v, list) and
                                             all(isinstance(x, str) for x in v) for k, v in keys.items()):
        raise ValueError("give an object of keys and their scopes, e.g. {\"KEY\": [\"read\", \"write\"]}")
    for n, (key, scopes) in enumerate(keys.items(), 1):
        if not key or key != key.strip() or any(c.isspace() for c in key):
            raise ValueError(f"key {n} is empty or holds white space, so no Authorization header can send it")
        if not all(" " < c <= "~" for c in key):  # a header carries ASCII: the key could never authenticate
            raise ValueError(f"key {n} holds a character that is not printable ASCII, so no Authorization header "
                             f"can send it; use letters, digits and punctuation (e.g. openssl rand -hex 32)")
        unknown = sorted(set(scopes) - set(SCOPES))
        if unknown or not scopes:
            raise ValueError(f"key {n} has scopes {list(scopes)}: give 'read' and/or "
                             f"'write' (unknown: {unknown})")
    return keys


def _complex(name: str) -> bool:
    """Whether the setting ``name`` takes JSON in the environment (a list, an object or a nested model)."""
    ann = Settings.model_fields[name].annotation
    origin = getattr(ann, "__origin__", None)
    return origin in (list, dict) or (isinstance(ann, type) and issubclass(ann, BaseModel))


def read_setting_file(name: str, path: str):
    """The value of setting ``name`` held in the file ``path``: its text with trailing white space dropped, parsed
    as JSON for list and object settings. ConfigError naming ``VECBRIDGE_<NAME>_FILE`` (never the content) when the
    file cannot be read or does not parse."""
    var = f"VECBRIDGE_{name.upper()}{_FILE}"
    try:
        text = Path(path).read_text(encoding="utf-8").rstrip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"setting {var}: cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not _complex(name):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"setting {var}: {path} is not valid JSON (line {exc.lineno}, column {exc.colno})") \
            from None


def _setting_files(environ, overrides: dict) -> dict[str, str]:
    """``{setting name: file}`` from the ``VECBRIDGE_<NAME>_FILE`` variables set (non-empty); ConfigError when the
    setting is also given directly. Settings given as ``overrides`` (command-line options) win over both."""
    top = {n.upper(): n for n in Settings.model_fields}
    out = {}
    for var, value in environ.items():
        up = var.upper()
        if not (up.startswith("VECBRIDGE_") and up.endswith(_FILE)) or not value:
            continue
        name = top.get(up[len("VECBRIDGE_"):-len(_FILE)])
        if name is None or name in overrides:
            continue
        # any case, as pydantic reads them: `vecbridge_cors_origins` beside VECBRIDGE_CORS_ORIGINS_FILE was ignored
        direct = next((k for k, v in environ.items() if v and k.upper() == f"VECBRIDGE_{name.upper()}"), None)
        if direct is not None:
            raise ConfigError(f"settings {direct} and {var} are both set: give one of them")
        out[name] = value
    return out


def _fields_of(model: type[BaseModel], prefix: str) -> dict[str, type[BaseModel] | None]:
    """``{VARIABLE NAME: nested model or None}`` of every field of ``model`` (names upper case)."""
    out = {}
    for name, info in model.model_fields.items():
        nested = info.annotation if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel) \
            else None
        out[f"{prefix}{name.upper()}"] = nested
    return out


def unknown_variables(environ) -> list[str]:
    """The ``VECBRIDGE_*`` names in ``environ`` that name no setting (nor a field of a nested one, such as
    ``VECBRIDGE_LIMITS__MAX_K``), except the non-settings of :data:`_NOT_SETTINGS`; any case, as pydantic reads."""
    top = _fields_of(Settings, "VECBRIDGE_")
    out = []
    for name in environ:
        up = name.upper()
        if not up.startswith("VECBRIDGE_") or up.startswith(_NOT_SETTINGS):
            continue
        if up.endswith(_FILE) and "__" not in up and up[:-len(_FILE)] in top:  # VECBRIDGE_<SETTING>_FILE
            continue
        head, _, rest = up.partition("__")
        if head not in top or (rest and (top[head] is None or f"{head}__{rest}" not in _fields_of(top[head],
                                                                                                 f"{head}__"))):
            out.append(name)
    return out


def _suggest(name: str) -> str:
    up = name.upper()
    known = list(_fields_of(Settings, "VECBRIDGE_")) + [n for h, m in _fields_of(Settings, "VECBRIDGE_").items()
                                                        if m is not None for n in _fields_of(m, f"{h}__")]
    return did_you_mean(up, known, show=str)


def _variable(loc: tuple) -> tuple[str, bool]:
    """``(VECBRIDGE_NAME, secret)`` of a validation error's location; a secret field's keys are not named."""
    head = str(loc[0]) if loc else "?"
    secret = head in _SECRET_FIELDS
    parts = [head] if secret else [str(x) for x in loc if not isinstance(x, int)]
    return "VECBRIDGE_" + "__".join(parts).upper(), secret


def load_settings(**overrides) -> Settings:
    """:class:`Settings` from the ``VECBRIDGE_*`` environment, with ``overrides`` (e.g. command-line options) on
    top; any refusal is a :class:`ConfigError` whose one-line message names the variable (see the module)."""
    unknown = unknown_variables(os.environ)
    if unknown:
        raise ConfigError(f"unknown setting {unknown[0]}{_suggest(unknown[0])}: no setting has that name, so it "
                          f"would be ignored; rename or unset it (settings: service/config.py)")
    files = _setting_files(os.environ, overrides)
    from_files = {name: read_setting_file(name, path) for name, path in files.items()}
    try:
        settings = Settings(**from_files, **overrides)
        settings._files = files
        return settings
    except ValidationError as exc:
        e = exc.errors()[0]
        if not e["loc"]:  # a rule across settings (a model validator): its message names them; its input is all of
            raise ConfigError(f"setting {str(e['msg']).removeprefix('Value error, ')}") from None  # them: not shown
        var, secret = _variable(tuple(e["loc"]))
        if e["loc"] and e["loc"][0] in files:  # the value came from a file: name that variable, not its content
            var, secret = f"VECBRIDGE_{str(e['loc'][0]).upper()}{_FILE}", True
        msg = str(e["msg"]).removeprefix("Value error, ")
        got = "" if secret or "input" not in e else f", got {str(e['input'])[:80]!r}"
        raise ConfigError(f"setting {var}: {msg}{got}") from None
    except _EnvParseError as exc:  # a list / object setting whose value is not JSON (the value is not shown)
        m = re.search(r'field "(\w+)"', str(exc))
        field = m.group(1) if m else "?"
        cause = exc.__cause__ or exc.__context__
        shape = "an object, e.g. '{\"KEY\": [\"read\", \"write\"]}'" if field == "api_keys" else \
            "JSON: a list such as '[\"a\", \"b\"]' or an object"
        raise ConfigError(f"setting VECBRIDGE_{field.upper()}: not valid JSON ({cause}); give {shape}") from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return load_settings()


def app_settings(app) -> Settings:
    """The settings of a vecbridge app: an override of :func:`get_settings` in ``app.dependency_overrides``
    (tests), else the ``Settings`` given to ``create_app`` (``app.state.vb_settings``), else the environment's.
    One resolver for the API (``service.api.deps``) and the console pages."""
    override = app.dependency_overrides.get(get_settings)
    if override is not None:
        return override()
    explicit = getattr(app.state, "vb_settings", None)
    return explicit if explicit is not None else get_settings()
