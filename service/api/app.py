"""The app factory: ``create_app(settings) -> FastAPI`` and ``serve(settings)``.

Heavy resources (registry connection, FAISS indexes, job workers) are opened in the lifespan,
not at import. Settings: an override of the ``get_settings`` dependency wins (tests), then an
explicit ``Settings`` passed here, then ``VECBRIDGE_*`` environment variables
(:func:`service.api.deps.current_settings`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import shlex
import signal
import sys
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool
from starlette.middleware.cors import CORSMiddleware

import align

from ..config import ConfigError, Settings, get_settings
from ..job_pool import Stop, join_stopped
from ..indexes.device import device_in_use, restore_device, use_device
from ..logging import configure_logging, get_logger
from ..metrics import MULTIPROC_ENV, ServiceMetrics
from ..memory import keep_heap
from ..threads import limit_native_threads, release_native_threads
from ..registry.cache import LRUCache
from ..ui import mount_console
from ..ui.pages import router as console_router
from .document import finish_document, serve_document
from .errors import install_error_handlers
from .deps import current_settings
from .fastpath import FastPathMiddleware
from .middleware import LOOPBACK_HOSTS, GuardMiddleware, ObserveMiddleware, RootPathMiddleware, accepted_hosts
from .responses import FastJSONResponse
from .routing import with_head
from .routers import collections, embeddings, fits, indexes, jobs, lm, maps, migrations, ops, plans, steers
from .state import AppState, freeze_heap

__all__ = ["create_app", "serve", "worker_app", "API_DESCRIPTION"]

_log = get_logger("app")

API_DESCRIPTION = """Linear maps between embedding spaces, over HTTP.

* **Spaces and maps** — `/v1/spaces`, `/v1/maps`: registered spaces, map versions, aliases.
* **Transform** — `POST /v1/maps/{ref}/transform`. **Fast path: binary bodies**
  (`application/octet-stream` raw float32 or `application/x-npy`), or `vectors_b64` inside JSON;
  JSON number lists are convenient but parsing them dominates at large batches.
* **Indexes** — `/v1/indexes`: FAISS per space; `POST /v1/indexes/{name}/search` takes queries from
  any space and maps them through the registry's maps.
* **Fits** — `POST /v1/fits` returns a job id at once; `GET /v1/jobs/{id}`.
* **Migrations** — `POST /v1/migrations`: a collection of the service's vector database through a map, as a
  job (progress, cancel, resume from its checkpoint); `POST /v1/verifications` checks it;
  `POST /v1/collections/{name}/search` searches one with queries of another space, unmigrated.
* **Steers** — `/v1/steers`: LM-Steer style transforms `q' = (I + eps W)^T q` per space (fit jobs,
  apply, lens); `"steers": {"name": eps}` in an index search steers its queries.
* **Embeddings** — OpenAI-shaped `POST /v1/embeddings` (+ `target_space`).
* **Ops** — `/healthz`, `/readyz`, `/metrics`, `/v1/info`.
* **Console** — `/ui` in a browser (same keys, entered once per browser session).

Examples: every request body has them ("Try it out"); the `toy` ones run top to bottom on an empty
service: create space, fit, alias, tag, transform, index, add, search, delete, steer, apply, inverse fit, steer
transfer.
Lists (`/v1/spaces`, `/v1/maps`, versions, `/v1/indexes`, `/v1/jobs`, `/v1/steers`) take `?limit=` and
answer `next`, the `?cursor=` of the following page (null on the last one); without `limit`, one page.
Python: `from service.client import Client` (or `AsyncClient` for asyncio) mirrors these routes (typed errors,
binary transform).

Auth: `Authorization: Bearer <key>`; keys carry `read` and/or `write` scopes (401 without a
valid key, 403 without the scope). Errors are `{"error": {"type", "status", "message"}}`.
"""



#: Answer headers a web page of an allowed origin (``cors_origins``) may read; browsers hide all but a safelisted
#: few: ``ETag`` (sent back in If-Match / If-None-Match), ``Retry-After`` (429 / 503), ``X-Request-ID`` (to quote in
#: a report), ``X-Map`` / ``X-Map-Version`` (which version answered a transform or artifact), ``X-Shape`` (of a
#: binary transform's body) and ``Location`` (a job's URL, on the 202 that queued it)
EXPOSED_HEADERS = ("ETag", "Retry-After", "X-Request-ID", "X-Map", "X-Map-Version", "X-Shape", "Location")


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the vecbridge FastAPI app (resources open when the app starts)."""
    metrics = ServiceMetrics()
    stop = Stop()  # this app's: the deadline its server's stop signal gives its job threads (_note_stop)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        s = current_settings(app)
        configure_logging(s.log_level)
        limit_native_threads(s.blas_threads)
        keep_heap(s.malloc_keep_mb)
        device_before = device_in_use()  # given back at the stop (a test run's own device, an enclosing app's)
        try:
            use_device(s.search_device)  # a GPU asked for and missing: the start-up fails, saying why
            state = AppState(s, metrics=metrics, stop=stop)
            await run_in_threadpool(state.open)
        except BaseException:  # a start that fails gives back what it took, as a stop does: the thread limit (held,
            # a later limit of one thread was a no-op, and a BLAS loaded after stayed at its default) and the device
            release_native_threads(s.blas_threads)
            restore_device(device_before)
            raise
        state.preload.start()  # Settings.preload_encoders, in the background: /readyz waits for them
        app.state.vb = state
        _log.info("service started", extra={"fields": {
            "data_dir": str(s.data_dir), "registry": state.registry.backend if state.registry else "unavailable",
            "indexes": len(state.indexes.names()),  # on disk; loading in the background (/readyz)
            "auth": "disabled" if s.auth_disabled else f"{len(s.api_keys)} key(s)"}})
        if s.auth_disabled and s.api_keys:  # both set: the keys are not checked, say so rather than look guarded
            _log.warning("auth_disabled is set: the configured API keys are ignored and every route is open",
                         extra={"fields": {"ignored": len(s.api_keys)}})
        retry = None
        if state.registry is None:  # its database is down: serve /healthz and a /readyz saying why, and retry
            retry = asyncio.create_task(_reconnect(state))
        else:
            _registry_ready(state)
        freeze_heap()  # everything loaded so far lives as long as the process
        try:
            yield
        finally:
            if retry is not None:
                retry.cancel()
            state.close()  # stops the index loader first: it freezes the heap once it is done
            # the job threads get what is left of the stop's shutdown_timeout_s (none on a forced stop; none waited
            # for without a stop signal): here, as both serve modes pass (a --workers worker skips atexit)
            join_stopped(stop)
            gc.unfreeze()
            app.state.vb = None
            release_native_threads(s.blas_threads)
            restore_device(device_before)  # was use_device("cpu"): the GPU test run lost its device at the first stop
            metrics.close()  # multiprocess: this worker's gauges leave the sums

    app = FastAPI(title="vecbridge", version=align.__version__, description=API_DESCRIPTION, lifespan=lifespan,
                  default_response_class=FastJSONResponse, docs_url=None, redoc_url=None)
    app.state.vb_settings = settings  # not a dependency override: see service.api.deps
    s = current_settings(app)
    app.state.vb = None
    app.state.metrics = metrics
    app.state.stop = stop
    # etag -> (byte length, stored file size) of each map artifact served (the newest 1,024): a HEAD of one served
    # before answers its Content-Length without loading and serialising it (64 MiB for a 4096 x 4096 map: 70-90 ms,
    # then dropped) while the file still has that size (routers.maps._still_served)
    app.state.artifact_lengths = LRUCache(1024)
    install_error_handlers(app)
    routers = (ops.router, maps.router, indexes.router, fits.router, jobs.router, embeddings.router, steers.router,
               lm.router, plans.router, migrations.router, collections.router)
    for r in routers:
        app.include_router(with_head(r))  # each carries its prefix (templates label metrics); HEAD twins of GETs
    mount_console(app)  # /ui console and /docs, from vendored assets (no CDN)
    _document_limits(app, s)
    app.add_middleware(FastPathMiddleware)  # inside the guard: small transform / search requests, see fastpath.py
    app.add_middleware(GuardMiddleware, routes=[route for r in routers for route in r.routes],
                       settings=lambda: current_settings(app))  # per request: tests override get_settings later
    if s.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=s.cors_origins, allow_methods=["*"],
                           allow_headers=["*"], expose_headers=list(EXPOSED_HEADERS))
    app.add_middleware(ObserveMiddleware, metrics=metrics)
    # behind a proxy's path prefix (this one's or the server's --root-path), stripped or not: outermost, so every
    # layer sees the scope uvicorn would give; the service's own first segments (v1, ui, ...) are never a prefix
    own = {route.path.split("/")[1] for r in (*routers, console_router) for route in r.routes} | {"openapi.json", "ui"}
    app.add_middleware(RootPathMiddleware, root_path=s.root_path, own=frozenset(own))
    return app


def _registry_ready(state: AppState) -> None:
    """What waits for the registry: the demo on an empty data dir."""
    if state.settings.demo_on_empty:
        from ..ops.demo import maybe_start_demo

        state.demo_job_id = maybe_start_demo(state)


async def _reconnect(state: AppState, first_wait: float = 0.5, longest_wait: float = 5.0) -> None:
    """Open the registry again, waiting ``first_wait`` seconds, doubling up to ``longest_wait``, until it opens."""
    wait = first_wait
    _log.warning("registry unavailable, retrying", extra={"fields": {"error": state.registry_error}})
    while True:
        await asyncio.sleep(wait)
        if await run_in_threadpool(state.open_registry):
            _log.info("registry connected", extra={"fields": {"registry": state.registry.backend}})
            _registry_ready(state)
            return
        wait = min(2 * wait, longest_wait)


def _document_limits(app: FastAPI, s: Settings) -> None:
    """The limits table in the API description; the rest of the document's finishing pass (each route's body limit,
    the request schemas' components, ...) is :func:`service.api.document.finish_document`."""
    from ..limits import limits_markdown
    from .protocol import MAX_HEAD_BYTES, MAX_URL_BYTES

    hosts = accepted_hosts(s)
    extra = (("Request line and headers: time from the connection's opening (`header_timeout_s`)",
              f"{s.header_timeout_s:g} s", "connection closed"),
             ("Request line and headers: bytes", f"{MAX_HEAD_BYTES} (1 MiB)", "431, connection closed"),
             ("Request target (path and query string): bytes", MAX_URL_BYTES, "414, connection closed"),
             ("A client that stops reading an answer (`send_timeout_s`)", f"{s.send_timeout_s:g} s",
              "connection dropped"),
             ("An idle kept-alive connection between requests (`keep_alive_timeout_s`)",
              f"{s.keep_alive_timeout_s:g} s", "connection closed"),
             ("Average rate of a request body after its first `body_timeout_s` (`body_min_rate_bytes_s`)",
              f"{s.body_min_rate_bytes_s:g} bytes/s" if s.body_min_rate_bytes_s else "none", "408"),
             ("Connections or requests in flight per process (`max_connections`)", s.max_connections or "none",
              "503, connection closed"),
             ("Plans and evaluations running at once per process (`max_heavy_requests`)", s.max_heavy_requests,
              "429 + Retry-After"),
             ("Requests waiting for the compute threads per process (`compute_max_waiting`)", s.compute_max_waiting,
              "429 + Retry-After"),
             ("Background jobs waiting per process (`max_queued_jobs`)", s.max_queued_jobs, "429 + Retry-After"),
             ("Background jobs of one API key waiting per process (`max_queued_jobs_per_key`)",
              s.max_queued_jobs_per_key if s.max_queued_jobs_per_key is not None else
              f"{max(1, s.max_queued_jobs // 2)} with two or more write keys, else none", "429 + Retry-After"),
             ("Host header (`allowed_hosts`)", "any" if hosts is None else ", ".join(hosts), "400"))
    app.description = (API_DESCRIPTION + "\n**Limits** (settings; 413 for bodies and rows, 408 for a stalled body, "
                                         "422 for the rest):\n\n"
                       + limits_markdown(s.limits, s.max_batch, s.max_body_bytes, s.body_timeout_s, extra))
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = finish_document(build(), s)
        return app.openapi_schema

    app.openapi = openapi
    serve_document(app)  # encoded once per root path, with an ETag


def ensure_local_key(s: Settings) -> tuple[Settings, "Path | None"]:
    """With no keys configured (and auth on, ``local_key`` on): the settings with one read+write key read
    from ``<data_dir>/local-key``, created (32 random bytes, hex, mode 0600) on the first run; else unchanged.
    A link, another user's file or one open to others is refused (:func:`.keyfile.read_local_key`).

    The key itself is never logged or printed; the caller tells the user where the file is.
    """
    from .keyfile import read_local_key

    if s.api_keys or "api_keys" in s.files or s.auth_disabled or not s.local_key:  # a keys file counts, even empty
        return s, None
    path = Path(s.data_dir) / "local-key"
    path.parent.mkdir(parents=True, exist_ok=True)
    key = read_local_key(path)
    if len(key) < 32 or any(c.isspace() or not " " <= c <= "~" for c in key):  # no header could send it
        raise ConfigError(f"{path} holds no usable key; delete it to make a new one")
    out = s.model_copy(update={"api_keys": {key: ["read", "write"]}})
    out._local_key_file = path  # where a 401 and the console say the key is (the path; never the key)
    return out, path


def connection_limit(wanted: int) -> int | None:
    """uvicorn's ``limit_concurrency`` for ``max_connections`` ``wanted`` (0: none), kept 64 below the process's
    open-files limit: each connection holds a descriptor, and past the limit every accept fails (/healthz too)
    before a 503 would start; with the common default of 1,024 files the 4,096 default was a bound never met."""
    if not wanted:
        return None
    try:
        import resource

        files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):  # not on this platform: the setting as given
        return wanted
    return min(wanted, files - 64) if files != resource.RLIM_INFINITY and files > 128 else wanted


def serve(settings: Settings | None = None, *, workers: int = 1) -> None:
    """Run the service with uvicorn on ``settings.host:settings.port`` (blocks).

    ``workers > 1``: that many processes share the socket (uvicorn's supervisor); each builds its
    own app from the same settings (passed on as ``VECBRIDGE_*`` variables). They share the
    registry, indexes (single writer, reloaded on change) and job records through ``data_dir``.
    """
    import uvicorn

    s = settings or get_settings()
    _check_data_dir(s)
    plain = s
    s, key_file = ensure_local_key(s)
    if key_file is not None:
        mode = os.stat(key_file, follow_symlinks=False).st_mode & 0o777  # 0600 unless made stricter by hand
        # behind a proxy's prefix the console is the proxy's (its pages ask for root_path/...): the server's own
        # /ui, printed before, redirected to a root_path/ui/... it does not serve itself, a 404
        console = (f"http://{s.host}:{s.port}/ui" if not s.root_path else
                   f"https://<your proxy>{s.root_path}/ui (the proxy that serves it under {s.root_path})")
        print(f"vecbridge: no API keys configured, so a local read+write key is in {key_file} (mode {mode:04o}, kept "
              f"across restarts).\n  curl -H \"Authorization: Bearer $(cat {shlex.quote(str(key_file))})\" "
              f"http://{s.host}:{s.port}/v1/info\n  console: {console} (paste the key once); "
              f"set VECBRIDGE_API_KEYS for real deployments", file=sys.stderr, flush=True)
    if accepted_hosts(s) == LOOPBACK_HOSTS:  # auth off, no allowed_hosts, a wildcard bind
        print(f"vecbridge: auth is off and the service listens on every interface ({s.host}), so it answers only "
              f"Host names {', '.join(LOOPBACK_HOSTS)}: set VECBRIDGE_ALLOWED_HOSTS to the names other "
              f"clients use", file=sys.stderr, flush=True)
    configure_logging(s.log_level, server=True)  # uvicorn's lines too, as JSON (worker_app: the same per worker)
    from .protocol import SlowClientProtocol, set_timeouts

    set_timeouts(s.header_timeout_s, s.send_timeout_s)
    server = {"host": s.host, "port": s.port, "log_level": s.log_level.lower(), "access_log": False,  # 1 or N
              "log_config": None, "http": SlowClientProtocol, "timeout_graceful_shutdown": s.shutdown_timeout_s,
              "timeout_keep_alive": s.keep_alive_timeout_s, "limit_concurrency": connection_limit(s.max_connections)}
    if workers > 1:
        _pass_to_workers(plain)  # not the local key: each worker reads it from its file, it stays out of environments
        get_settings.cache_clear()
        with _metrics_folder():
            _run_workers(uvicorn.Config("service.api.app:worker_app", factory=True, workers=workers,
                                        timeout_worker_healthcheck=s.worker_healthcheck_timeout_s, **server))
        _log.info("service stopped", extra={"fields": {"workers": workers}})
        return
    started, stop_signal = _run(uvicorn.Config(create_app(s), **server))
    if not started:  # the lifespan failed (logged); uvicorn's start-up failure status
        sys.exit(3)
    _log.info("service stopped", extra={"fields": {"signal": stop_signal}})
    if stop_signal is not None:
        # Stopped on request, after the graceful shutdown (requests answered, running jobs recorded interrupted):
        # end now with status 0, as a worker process ends, once the job threads had what is left of the stop's
        # shutdown_timeout_s to reach their next report or end (the lifespan joined them; os._exit skips atexit).
        from service.job_pool import join_at_exit

        join_at_exit()
        for h in logging.getLogger("vecbridge").handlers:
            h.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _run_workers(config) -> None:
    """uvicorn's supervisor of ``config.workers`` processes on one listening socket (what ``uvicorn.run`` does), with
    the changes of :class:`service.api.supervisor.Supervisor`: it closes its copy of the socket before it signals the
    workers to stop, and its health checks never hold a stop.

    Each worker closes its copy at its stop; the supervisor kept its own until every worker had ended (up to
    ``shutdown_timeout_s``), so the kernel still completed connections into the backlog that nobody would accept:
    after a SIGTERM a client connected, waited ~25 s and was reset with no answer (a POST could not tell whether it
    applied), where one process refuses at once. Now, once the supervisor and the workers have closed their copies,
    a new connection is refused while the requests in flight are answered."""
    from .supervisor import Supervisor

    Supervisor(config, sockets=[config.bind_socket()]).run()


def _pass_to_workers(s: Settings) -> None:
    """Put ``s`` into this process's environment, which the workers of ``--workers N`` read (:meth:`Settings.to_env`).

    A ``VECBRIDGE_<NAME>_FILE`` whose setting no longer comes from that file (a command-line option such as
    ``--registry-url`` replaced it) is removed, and so is a spelling of a variable in another case: left there, the
    workers read the file's value instead of the option's (``serve --workers 2 --registry-url B`` with
    ``VECBRIDGE_REGISTRY_URL_FILE`` naming A served registry A while the parent said B)."""
    env = s.to_env()
    wanted = {k.upper(): k for k in env}
    for var in list(os.environ):
        up = var.upper()
        stale_file = (up.startswith("VECBRIDGE_") and up.endswith("_FILE") and up not in wanted
                      and up[len("VECBRIDGE_"):-len("_FILE")].lower() in Settings.model_fields)
        if stale_file or (up in wanted and var != wanted[up]):
            del os.environ[var]
    os.environ.update(env)


@contextlib.contextmanager
def _metrics_folder():
    """The folder the workers of one ``serve --workers N`` share their metrics in (prometheus_client's multiprocess
    mode, see :mod:`service.metrics`): ``PROMETHEUS_MULTIPROC_DIR`` when the operator set it (kept), else a new
    private temporary folder, removed when the service stops, or after a ``kill -9`` by the next service's start,
    which finds the folder's ``.owner`` lock free. Before, each worker answered ``/metrics`` with its own counters:
    a scrape saw one worker's, so counters went up and down between scrapes."""
    import shutil
    import tempfile

    from ..storage import hold, take_abandoned

    if os.environ.get(MULTIPROC_ENV):
        yield os.environ[MULTIPROC_ENV]
        return
    for old in Path(tempfile.gettempdir()).glob("vecbridge-metrics-*/.owner"):  # left by a parent killed (-9, OOM)
        if (fd := take_abandoned(old)) is not None:
            shutil.rmtree(old.parent, ignore_errors=True)
            os.close(fd)
    path = tempfile.mkdtemp(prefix="vecbridge-metrics-")  # mode 0700: label values name maps and indexes
    owner = hold(Path(path) / ".owner", create=True)  # flock'd while this process lives (not inherited)
    os.environ[MULTIPROC_ENV] = path  # the workers are spawned: they import prometheus_client with it set
    try:
        yield path
    finally:
        del os.environ[MULTIPROC_ENV]
        shutil.rmtree(path, ignore_errors=True)
        os.close(owner)


def _check_data_dir(s: Settings) -> None:
    """Refuse to serve on a data dir this user cannot create or write (NotConfiguredError: one line, exit 2, not
    75: a retry cannot help until its operator acts): the app's start-up failed on it later with a traceback inside
    a JSON line and exit 3. A nearly full disk is no refusal: the service starts and /readyz says so."""
    from ..errors import NotConfiguredError
    from ..registry.db import sqlite_path
    from ..storage import check_sqlite_path, data_dir_status

    # a database path too long for SQLite: one line here, not a start-up failed with a traceback
    for db in (Path(s.data_dir) / "jobs.sqlite", sqlite_path(s.resolved_registry_url())):
        if db is not None:
            check_sqlite_path(db)
    folders = [("data dir", Path(s.data_dir).resolve(), "--data-dir / VECBRIDGE_DATA_DIR")]
    # set apart from the data dir, they were not checked: the start-up failed on them with a traceback, exit 3
    if s.artifact_dir is not None:
        folders.append(("artifact dir", s.resolved_artifact_dir(), "--artifact-dir / VECBRIDGE_ARTIFACT_DIR"))
    if s.report_dir is not None:
        folders.append(("report dir", s.resolved_report_dir(), "VECBRIDGE_REPORT_DIR"))
    for what, path, setting in folders:
        try:
            path.mkdir(parents=True, exist_ok=True)
            status = data_dir_status(path)
        except OSError as exc:
            status = f"not writable: {exc.strerror or exc}"
        if status.startswith("not writable"):  # the words of its errno say what to do; only bare ones get advice
            advice = "" if ":" in status.partition(": ")[2] else (f" for uid {os.getuid()}: give the folder to that "
                                                                  "user (chown)")
            raise NotConfiguredError(f"{what} {path} ({setting}) is {status}{advice}; or choose a writable one")


def worker_app() -> FastAPI:
    """The app of one ``serve --workers N`` process (uvicorn's factory): JSON logs for uvicorn's lines in this
    process too, then :func:`create_app` with the settings the parent passed on as ``VECBRIDGE_*`` variables (and the
    local key, read from its file as the parent did: a secret kept out of the environment, as a ``_FILE`` setting)."""
    _stop_with_parent()
    if hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread():
        # its server's handler is set: a Ctrl-C (one that came while it started too) stops it now
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked while it started: supervisor.Worker
    s, key_file = ensure_local_key(get_settings())  # the parent made the file; without one: the environment's
    configure_logging(s.log_level, server=True)
    app = create_app(s if key_file is not None else None)
    _note_forced_stop(app)
    return app


def _note_forced_stop(app) -> None:
    """A worker's second Ctrl-C marks ``app`` stopped at once (``app.state.stop_forced``), as :func:`_run`'s server
    does for one process: the 503 of a request it cuts says "stopped at once by a second stop signal". A worker runs
    uvicorn's own server, so its cut requests said they were "still open shutdown_timeout_s after the stop signal".
    And that server's shutdown is followed by :func:`_answer_cut`, as :func:`_run`'s is; on a forced stop, a SIGTERM
    it caught (its supervisor's) is then what ends it.
    Called while that server loads the app, inside its signal handling: its SIGINT handler is chained."""
    if threading.current_thread() is not threading.main_thread():
        return
    handler = signal.getsignal(signal.SIGINT)
    server = getattr(handler, "__self__", None)  # the uvicorn server whose handle_exit it is
    if not hasattr(server, "force_exit"):
        return

    def on_int(signum, frame):
        handler(signum, frame)
        _mark_forced(server, app)

    signal.signal(signal.SIGINT, on_int)
    term = signal.getsignal(signal.SIGTERM)
    if getattr(term, "__self__", None) is server:  # the supervisor's stop: the job threads' deadline starts now

        def on_term(signum, frame):
            term(signum, frame)
            _note_stop(server, app)

        signal.signal(signal.SIGTERM, on_term)
    shutdown = server.shutdown

    async def shutdown_then_answer(sockets=None) -> None:
        await shutdown(sockets=sockets)
        await _answer_cut(server)
        caught = getattr(server, "_captured_signals", [])
        if server.force_exit and signal.SIGTERM in caught:
            # uvicorn raises what it caught again, the last first: a third Ctrl-C during _answer_cut's wait came
            # before the supervisor's SIGTERM, and two SIGINTs in a row are asyncio.run's KeyboardInterrupt, whose
            # end waits for tasks that ignore their cancel and for job threads without limit. The SIGTERM ends the
            # worker at once (its default action), whatever else came
            caught[:] = [signal.SIGTERM]

    server.shutdown = shutdown_then_answer


_CUT_ANSWER_S = 5.0  # longest wait, after a second Ctrl-C, for the answers of the requests it cut


async def _answer_cut(server) -> None:
    """Once ``server`` (uvicorn's) has shut down at once on a second Ctrl-C: cancel the requests still open and wait
    (up to ``_CUT_ANSWER_S``) for their answers, the middleware's 503 that says so; then stop the app (its lifespan's
    shutdown), which uvicorn skips on a forced stop: waited for up to ``_CUT_ANSWER_S`` only where it awaits, since
    the app's ``state.close()`` runs on the loop (a hung registry or mount holds it; it did before too, at
    ``asyncio.run``'s end).

    uvicorn leaves them to ``asyncio.run``'s end, after it has raised the stop signals it caught again, the last one
    first. A worker of ``serve --workers N`` had caught its supervisor's SIGTERM too (Ctrl-C reaches the supervisor,
    which then stops its workers): raised again, its default action ended the worker before any was answered, and
    the client's connection closed with no answer at all. Ctrl-C twice, the second after the supervisor's turn (as
    a person presses it), did so every time."""
    if not server.force_exit:
        return
    cut = [t for t in server.server_state.tasks if not t.done()]
    for task in cut:
        if not task.cancelling():  # one cancelled by shutdown_timeout_s already is answering
            task.cancel()
    if cut:
        await asyncio.wait(cut, timeout=_CUT_ANSWER_S)
    # then the app's own stop (jobs recorded interrupted, indexes, registry), which uvicorn skips on a forced stop: its
    # lifespan task was left waiting, and asyncio.run's end cancelled it, an ERROR "Exception in 'lifespan' protocol"
    # CancelledError traceback on every double Ctrl-C. A stop that fails or hangs still logs an ERROR
    lifespan = getattr(server, "lifespan", None)
    ended = getattr(lifespan, "shutdown_event", None)  # set once it ended (uvicorn stopped it: no second call)
    if ended is not None and not ended.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(lifespan.shutdown(), _CUT_ANSWER_S)


def _note_stop(server, app) -> None:
    """A stop signal reached ``server`` (uvicorn's), serving ``app``: its job threads are waited for until
    ``shutdown_timeout_s`` (the graceful shutdown's limit) after the first one at most, and not at all after a forced
    stop, so the whole stop stays within that bound (:meth:`service.job_pool.Stop.note`: ``app``'s own, not another
    app's of the same process). Nothing for an app that is not :func:`create_app`'s."""
    stop = getattr(getattr(app, "state", None), "stop", None)
    if isinstance(stop, Stop):
        limit = server.config.timeout_graceful_shutdown
        stop.note(time.monotonic() + (0.0 if server.force_exit or limit is None else limit))


def _mark_forced(server, app) -> None:
    """``app.state.stop_forced`` once ``server`` (uvicorn's) force-exits: a second Ctrl-C cuts the open requests."""
    _note_stop(server, app)
    if server.force_exit:
        with contextlib.suppress(AttributeError):  # an app without a state (not create_app's)
            app.state.stop_forced = True


def _stop_with_parent() -> None:
    """Linux: SIGTERM this worker when its ``serve --workers N`` parent dies, however it dies (PR_SET_PDEATHSIG).

    A ``kill -9`` (or an OOM kill) of the parent left its workers serving the port and running their jobs: every
    restart of the service failed with "address already in use" while the orphans, on the old code and settings,
    answered and reported their jobs "running". Now each worker shuts down as on a SIGTERM (running jobs recorded
    interrupted) and frees the port."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    # the process that started this one, as multiprocessing recorded it when it did (uvicorn's workers are spawned):
    # a worker (re)started as its parent died read its new parent (init, a subreaper) from getppid here, compared it
    # with itself after the prctl, and served on as an orphan
    import multiprocessing

    spawner = multiprocessing.parent_process()
    parent = spawner.pid if spawner is not None else os.getppid()
    try:
        if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0) != 0:  # 1: PR_SET_PDEATHSIG
            return
    except (OSError, AttributeError):  # no prctl in this libc
        return
    if os.getppid() != parent:  # the parent died before the prctl: it will not signal
        os.kill(os.getpid(), signal.SIGTERM)


def _run(config) -> tuple[bool, str | None]:
    """Run uvicorn's server with ``config`` until it stops: ``(started, name of the stopping signal or None)``.

    uvicorn raises a stopping SIGTERM / SIGINT again once it has shut down, so ``docker stop`` of a healthy
    single-process service ended with status 143 (-15) where ``serve --workers N`` ended with 0; here the
    signal is reported instead and :meth:`run` returns.
    """
    import uvicorn

    class Server(uvicorn.Server):
        stop_signal: str | None = None

        def handle_exit(self, sig, frame):
            super().handle_exit(sig, frame)
            _mark_forced(self, self.config.app)  # a second Ctrl-C: the requests still open are cut now (503 says so)

        async def shutdown(self, sockets=None):
            await super().shutdown(sockets=sockets)
            await _answer_cut(self)

        @contextlib.contextmanager
        def capture_signals(self):
            # SIGHUP (the terminal closed) shuts down as SIGTERM does; uvicorn catches only INT and TERM, so the
            # CLI's SIGHUP handler raised inside the event loop (a traceback, no graceful shutdown). Left alone
            # when ignored (nohup) or off the main thread.
            hup = None
            if threading.current_thread() is threading.main_thread() and \
                    signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
                hup = signal.signal(signal.SIGHUP, self.handle_exit)
            try:
                with super().capture_signals():
                    try:
                        yield
                    finally:
                        caught = getattr(self, "_captured_signals", [])
                        if caught:
                            self.stop_signal = signal.Signals(caught[0]).name
                        caught.clear()  # nothing for uvicorn to raise again
            finally:
                if hup is not None:
                    signal.signal(signal.SIGHUP, hup)

    server = Server(config)
    server.run()
    return server.started, server.stop_signal
