"""Operations: liveness, readiness, Prometheus metrics, service info."""

from __future__ import annotations

import asyncio
import platform
import time
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from ...errors import ServiceUnavailableError
from ...ops.demo import demo_status
from ...registry.elsewhere import VERDICT_S, aliased_missing, artifacts_elsewhere
from ...registry.entity import ALIAS_TABLES, VERSION_TABLES
from ...memory import heap_settings
from ...metrics import CONTENT_TYPE_LATEST
from ...urls import hide_endpoints
from ..deps import MetricsAccess, ReadScope, StateDep, jobs_per_key
from ..responses import FastJSONResponse
from ..schemas import ErrorBody, Health, Ready, ServiceInfo, error_responses

router = APIRouter(tags=["ops"])


@router.get("/healthz", summary="Liveness: the process answers", response_model=Health)
async def healthz():
    return FastJSONResponse({"status": "ok"})


@router.get("/readyz", summary="Readiness: registry reachable, indexes loaded, data dir writable with free space", response_model=Ready,
            responses={503: {"model": Ready, "description": "Not ready: `checks` says which part."}})
async def readyz(request: Request):
    state = getattr(request.app.state, "vb", None)
    checks: dict = {"registry": "missing", "indexes": "not loaded"}
    ok = False
    if state is not None:
        if state.registry is not None:
            checks["registry"] = await _registry_check(state)
            if checks["registry"] == "ok":
                checks["artifacts"] = await _artifacts_check(state)
                checks["aliases"] = await _aliases_check(state)  # informs, never gates readiness (as demo)
        elif state.registry_error:  # not open yet: its database was down at start-up, the app retries
            checks["registry"] = f"error: {hide_endpoints(state.registry_error)} (retrying" + (
                ", though no retry can help: refused for good, until the registry URL or its server is fixed)"
                if state.registry_for_good else ")")
        loaded = state.indexes.loaded  # read once: the checks and the answer agree
        checks["indexes"] = await _indexes_check(state, loaded)
        if (demo := demo_status(state)) is not None:
            checks["demo"] = demo  # preparing | ready | failed; informs, never gates readiness
        if state.preload.names:  # Settings.preload_encoders: not ready until each has loaded
            checks["encoders"] = state.preload.status()
        from ...storage import data_dir_status

        s = state.settings  # the folders it writes to, the artifact and report dirs set apart included
        folders = (s.resolved_artifact_dir(), s.resolved_report_dir(), Path(s.data_dir) / "indexes")
        try:  # one look at a time within READY_WAIT_S: a hung mount held a thread per probe (a review's find)
            checks["data_dir"] = await _within_wait(state, "data_dir_probe", lambda: data_dir_status(
                s.data_dir, s.min_free_bytes, state.opened_files(), folders))
        except TimeoutError as waited:
            checks["data_dir"] = f"error: no answer from the data dir's folders for {waited.args[0]:.1f} s"
        ok = (checks["registry"] == "ok" and checks.get("artifacts") == "ok" and loaded and checks["data_dir"] == "ok"
              and state.preload.ready)
    return FastJSONResponse({"status": "ready" if ok else "not ready", "checks": checks},
                            status_code=200 if ok else 503)


# HEAD of the probes (load balancers and monitors probe with it), as of every GET route: service.api.routing.with_head


async def _indexes_check(state, loaded: bool) -> dict:
    """``{"loaded", "loading", "failed", "errors"}`` (:meth:`~service.indexes.IndexStore.status`). While the start-up
    loads the indexes, from memory (a listing would load them itself and wait as long); then with what other
    processes wrote since (off the event loop: whole FAISS files)."""
    if not loaded:
        return state.indexes.status()
    n = len(await run_in_threadpool(state.indexes.list))
    return {**state.indexes.status(), "loaded": n}


#: Longest /readyz waits for the registry's answer (a healthy one answers in milliseconds)
READY_WAIT_S = 2.0


async def _within_wait(state, slot: str, call):
    """What ``call()`` (run in the thread pool) returns, or raises, within :data:`READY_WAIT_S`; TimeoutError with
    the seconds waited as its argument past that.

    One call at a time, however many probes ask (``state.<slot>`` holds it and its start): a registry that stops
    answering (a partition, a hung database) or an artifact folder that does (a hard NFS mount) holds one thread,
    where each probe used to hold one more until the shared thread pool was exhausted (45 threads after 45 probes)
    and /readyz, and every route that needs a pool thread, never answered.
    """
    probe, started = getattr(state, slot) or (None, 0.0)
    if probe is None or probe.done():
        probe, started = asyncio.ensure_future(run_in_threadpool(call)), time.monotonic()
        probe.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved even if every wait timed out
        setattr(state, slot, (probe, started))
    try:
        return await asyncio.wait_for(asyncio.shield(probe), READY_WAIT_S)
    except TimeoutError:
        raise TimeoutError(time.monotonic() - started) from None


async def _registry_check(state) -> str:
    """``"ok"``, or why the registry is not usable, within :data:`READY_WAIT_S` (one query at a time)."""
    try:
        await _within_wait(state, "registry_probe", state.registry.probe)
        return "ok"
    except TimeoutError as waited:
        return f"error: no answer from the registry for {waited.args[0]:.1f} s"
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return f"error: {type(exc).__name__}: {hide_endpoints(str(exc))}"  # unauthenticated: no host, no port


async def _artifacts_check(state) -> str:
    """``"ok"``, or why this data dir's artifact folder is not the registry's
    (:func:`~service.registry.elsewhere.artifacts_elsewhere`: most of the newest versions' files are missing here),
    within :data:`READY_WAIT_S`, one look at a time. Such a replica said ready, then answered every transform with a
    500 "artifact ... is missing" (QA 4801). An "ok" verdict is reused for :data:`~service.registry.elsewhere.VERDICT_S`
    (30 s); a "not the registry's" one is looked at again at each probe, from the registry store's one kept verdict
    (a copy kept here said "not ready" for 30 s after the folder was put right). A hung folder is looked at by one
    thread however many probes ask, each answered "no answer" within READY_WAIT_S (it was a new thread per probe, no
    time limit, until the pool was exhausted)."""
    reg = state.registry
    return await _folder_look(state, "artifacts_probe", lambda: artifacts_elsewhere(
        reg.db, reg.store, VERSION_TABLES, max_age=VERDICT_S, keep_foreign=False))


async def _aliases_check(state) -> str:
    """``"ok"``, or ``"error: ..."`` while the file of a version an alias points at is missing here, however few are
    (:func:`~service.registry.elsewhere.aliased_missing`; the names go to the log): ``m@prod`` answered 500s while
    /readyz said nothing (QA s54). It informs and does not gate readiness: the folder is shared, so one lost file
    would take every replica out of its load balancer, every other map with it (the folder-wide case is
    ``artifacts``, which does gate)."""
    reg = state.registry
    return await _folder_look(state, "aliases_probe", lambda: aliased_missing(
        reg.db, reg.store, ALIAS_TABLES, max_age=VERDICT_S))


async def _folder_look(state, key: str, look) -> str:
    """``look()`` (None: all well, else why) within :data:`READY_WAIT_S`, one at a time per ``key``, as a check."""
    try:
        why = await _within_wait(state, key, look)
        return "ok" if why is None else f"error: {why}"
    except TimeoutError as waited:
        return f"error: no answer from this data dir's artifact folder for {waited.args[0]:.1f} s"
    except OSError as exc:  # its message may name the folder: unauthenticated, so the reason only
        return f"error: {type(exc).__name__}: {exc.strerror}"
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return f"error: {type(exc).__name__}: {hide_endpoints(str(exc))}"


@router.get("/metrics", summary="Prometheus metrics", response_class=Response, dependencies=[MetricsAccess],
            description="Access per `metrics_access`: `key` (default: a key with the `read` scope), `open`, or "
                        "`off` (404). Shows map and index names.",
            responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
                             "description": "Prometheus text exposition format."},
                       **error_responses(401, 403, 503),  # metrics_access=key; 503: not started (or stopped)
                       404: {"model": ErrorBody, "description": "Metrics are off (`metrics_access=off`)."}})
async def metrics(request: Request):
    state = request.app.state.vb
    if state is None:  # before the start-up has made it (or after the shutdown): was an AttributeError, a 500
        raise ServiceUnavailableError("the service is starting or stopping; metrics answer once it has started, "
                                      "see /readyz")
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/info", dependencies=[ReadScope], summary="Service facts", response_model=ServiceInfo,
            responses=error_responses(401, 403, 503))
async def info(state: StateDep):
    import faiss

    import align
    from ...indexes.device import search_device
    from ...threads import native_threads

    s = state.settings
    if state.indexes.loaded:
        n_indexes = len(await run_in_threadpool(state.indexes.list))  # loads what other processes wrote: off the loop
    else:  # the start-up is loading them: count them without waiting for it
        n_indexes = (st := state.indexes.status())["loaded"] + st["loading"]
    per_key = jobs_per_key(s)
    per_key = s.max_queued_jobs if per_key is None else per_key  # no bound of its own: a key may fill the queue
    return FastJSONResponse({
        "service": "vecbridge", "version": align.__version__, "python": platform.python_version(),
        "faiss": getattr(faiss, "__version__", "?"), "registry_backend": state.registry.backend,
        "uptime_seconds": round(time.monotonic() - state.started_at, 3),
        "limits": {"max_body_bytes": s.max_body_bytes, "max_batch": s.max_batch,
                   "max_queued_jobs": s.max_queued_jobs, "job_workers": s.job_workers,
                   "max_queued_jobs_per_key": min(s.max_queued_jobs, per_key), **s.limits.model_dump()},
        "auth": "disabled" if s.auth_disabled else "api-keys",
        "native_threads": {"setting": s.blas_threads, **native_threads()},
        "heap": {"setting_mb": s.malloc_keep_mb, "applied": heap_settings()},
        "map_cache": {"setting_mb": s.map_cache_mb, **state.registry.cache.stats()},
        "search_device": search_device(),
        "counts": {"indexes": n_indexes, "jobs": state.jobs.counts()},
        "demo": demo_status(state),
        "encoders": state.preload.status(),
    })
