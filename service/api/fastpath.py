"""A pure-ASGI shortcut for small transform and search requests (the per-request floor, issue 11).

A batch-1 transform does ~0.1 ms of work; FastAPI around it (dependency solving, routing again,
the exception and exit-stack layers) cost several times that. Requests that the guard middleware
has already let through (key checked, body within its limit) and whose body is small are
answered here by the same functions the routes call (:func:`~service.api.routers.maps.transform_call`,
:func:`~service.api.routers.indexes.search_call`: every input check, limit and NaN/Inf guard is
theirs), in one thread-pool hop, with the same ``Response`` object the route would return. Some need
no hop at all and run on the event loop: a transform of at most :data:`INLINE_MAX_BYTES` whose map is in
memory, and a search of at most that size that is small (``SpaceIndex.small_search``: ~0.2 ms of work
at most) of an index in memory at its newest generation, no writer on its lock, its path of maps or
``map`` already resolved and loaded (:class:`~service.api.state.InMemory`; anything else raises
``WouldBlock`` before the search and takes the hop). A larger transform by a linear map in memory runs on the
event loop too when its request is the only one the process is answering (``ServiceMetrics.active``) and the
product is at most :data:`ALONE_INLINE_WORK` multiply-adds: a client that sends its batches one after another (a
migration's loop) then skips the hop, ~0.7 ms of a 1,024-row transform here (the thread's wake-ups and the
body and answer crossing cores), and a request that arrives meanwhile waits at most that product (~5 ms).

Binary transforms (``application/octet-stream``, ``.npy``) of any size take the same shortcut (the guard has
already held the body to ``max_body_bytes``): FastAPI's layers cost 0.4-0.9 ms per request whatever the batch,
~10-15 % of a 1,024-row transform, and a failing binary body is cheap to check twice (its width checks need no
parsing; a NaN/Inf row is found by the apply block by block, so a failing body costs at most twice what it would
have cost to answer); bodies over 1 MiB take the heavy gate's threads
(:meth:`~service.api.state.HeavyGate.hop`), not the shared pool. JSON bodies keep the :data:`FAST_MAX_BYTES`
bound, since parsing a large one twice on failure is not.

Anything else goes to the app unchanged: a large JSON or chunked body, a query parameter this module does
not read exactly as FastAPI would, and **every failure** — the request is then replayed through the
app with the body already read, so errors (status, message, headers, logs) come from the one place
that makes them (:mod:`service.api.errors`). Failing requests thus run twice: JSON ones up to
:data:`FAST_MAX_BYTES`, binary ones as far as their checks (a pass over the bytes). The OpenAPI
document still comes from the routes.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl

from starlette.requests import ClientDisconnect, Request

from align import LinearMap
from align.exceptions import InputError

from ..errors import BusyError, ServiceUnavailableError, UnsupportedMediaTypeError
from ..indexes.locking import WouldBlock
from ..limits import MAX_DIM
from .codec import JSON, check_query, media_type
from .deps import current_settings
from .errors import error_response
from .routers import indexes as index_routes
from .routers import maps as map_routes
from .state import InMemory

__all__ = ["FastPathMiddleware", "FAST_MAX_BYTES", "FAST_BINARY_MAX_BYTES", "INLINE_MAX_BYTES", "ALONE_INLINE_WORK",
           "TRANSFORM", "SEARCH"]

FAST_MAX_BYTES = 256 * 1024  # JSON bodies up to this size take the shortcut
FAST_BINARY_MAX_BYTES: int | None = None  # binary transform bodies: no bound of its own (the guard's applies)
INLINE_MAX_BYTES = 16 * 1024  # transforms / small searches up to this size run on the event loop (in memory)
#: Multiply-adds (rows x d_in x d_out) of a linear map's transform run on the event loop when its request is the
#: process's only one: 1,024 x 384 -> 384 rows are 0.15 G (~2.6 ms on one core here); this bound is ~5 ms
ALONE_INLINE_WORK = 1 << 28
TRANSFORM = "/v1/maps/{ref}/transform"
SEARCH = "/v1/indexes/{name}/search"
_DIM = re.compile(r"[1-9][0-9]{0,5}")


def _transform_query(qs: bytes) -> tuple[dict, int | None] | None:
    """``(options, dim)`` from the query string; None unless read exactly as the route would (an unknown or repeated
    parameter: the route's 422)."""
    opts: dict = {}
    dim = None
    pairs = parse_qsl(qs.decode("latin-1"), keep_blank_values=True)
    try:
        check_query(pairs, map_routes.TRANSFORM_QUERY)  # the route's own check
    except InputError:
        return None
    for key, value in pairs:
        if key in ("output", "encoding_format"):
            if not value:
                return None
            opts[key] = value
        elif key == "dim":
            if not _DIM.fullmatch(value) or int(value) > MAX_DIM:
                return None
            dim = int(value)
    return opts, dim


async def _transform(state, settings, params: dict, headers: dict, body: bytes, qs: bytes, request: Request):
    query = _transform_query(qs)
    if query is None:
        return None
    opts, dim = query
    mt = media_type(ct := _text(headers.get(b"content-type")))
    args = (state, settings, params["ref"], mt, body)
    kw = {"query_opts": opts, "dim": dim, "header_dim": _text(headers.get(b"x-vector-dim")), "typed": bool(ct),
          "accept": ", ".join(v.decode("latin-1") for k, v in request.scope["headers"] if k == b"accept")}
    hit = state.resolve_map_cached(params["ref"])  # the map in memory, resolved with no I/O (else None)

    def call():
        return map_routes.transform_call(*args, resolve=None if hit is None else lambda _ref: hit, **kw)

    if hit is not None and _inline(state, hit[1], len(body)):  # on the event loop: pure CPU, no lock, query or read
        v, Y, response = call()
    else:  # in a thread: resolved there when not in memory (a registry query, an artifact read)
        v, Y, response = await _hop(state, call, len(body), request)
    return response, lambda: map_routes.transform_observe(state, v, Y)


def _inline(state, m, nbytes: int) -> bool:
    """Whether a transform of an ``nbytes`` body by map ``m`` (in memory) runs on the event loop: a few rows always;
    up to :data:`ALONE_INLINE_WORK` multiply-adds of a linear map (``nbytes / 4`` input values times ``d_out``; JSON
    counts more) while no other request is being answered by this process."""
    if nbytes <= INLINE_MAX_BYTES:
        return True
    return (state.metrics.active <= 1 and isinstance(m, LinearMap)
            and nbytes // 4 * m.target_dim <= ALONE_INLINE_WORK)


async def _search(state, settings, params: dict, headers: dict, body: bytes, qs: bytes, request: Request):
    ct = _text(headers.get(b"content-type"))
    if qs or (ct or JSON).split(";")[0].strip().lower() != JSON:
        return None  # the route's 422 (it takes no query string) or 415
    idx = state.indexes.in_memory(params["name"]) if len(body) <= INLINE_MAX_BYTES else None
    if idx is not None:  # on the event loop when small and all in memory: no lock wait, no load, no query
        try:
            found, response = index_routes.search_call(state, settings, idx, body, resolver=InMemory(state),
                                                       wait=False)
            return response, lambda: index_routes.search_observe(state, found)
        except WouldBlock:
            pass

    def call():
        return index_routes.search_call(state, settings, state.indexes.get(params["name"]), body, defer=True)

    await state.after_loads(params["name"])
    found, response = await _hop(state, call, len(body), request)
    return response, lambda: index_routes.search_observe(state, found)


async def _hop(state, fn, nbytes: int, request: Request):
    """The shortcut's one hop off the event loop: the shared pool, or the heavy gate's threads for a large body,
    where a request whose client leaves while it waits gives its turn up (ClientDisconnect, as the routes')."""
    return await state.heavy.hop(fn, nbytes, request)


_HANDLERS = {TRANSFORM: _transform, SEARCH: _search}


def _body_cap(template: str, content_type: bytes | None) -> int | None:
    """The largest body the shortcut reads for this route and ``Content-Type`` (None: no bound of its own)."""
    if template == TRANSFORM and content_type is not None:
        try:
            binary = media_type(content_type.decode("latin-1")) != JSON
        except UnsupportedMediaTypeError:  # the route's 415
            return FAST_MAX_BYTES
        if binary:
            return FAST_BINARY_MAX_BYTES
    return FAST_MAX_BYTES


def _text(value: bytes | None) -> str | None:
    return value.decode("latin-1") if value is not None else None


class FastPathMiddleware:
    """Answer small ``POST`` transform / search requests directly (see the module notes); sits just inside
    :class:`~service.api.middleware.GuardMiddleware`, which leaves the matched route and its path parameters in
    ``scope["vb_route"]`` and ``scope["vb_path_params"]``."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        route = scope.get("vb_route") if scope["type"] == "http" else None
        handler = _HANDLERS.get(getattr(route, "path", None)) if scope.get("method") == "POST" else None
        if handler is None:
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers", ()))
        app = scope.get("app")
        state = getattr(getattr(app, "state", None), "vb", None)
        cl = headers.get(b"content-length")
        cap = _body_cap(route.path, headers.get(b"content-type"))
        if (state is None or state.registry is None or cl is None or not cl.isdigit()
                or (cap is not None and int(cl) > cap)):
            return await self.app(scope, receive, send)
        chunks = []
        while True:
            msg = await receive()
            if msg["type"] != "http.request":  # the client went away: nothing to answer (499 of this route, not
                scope["route"] = route  # of "unmatched": metrics and the access log name the route template)
                return
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                break
        body = b"".join(chunks)
        del chunks  # a binary body may be up to max_body_bytes: hold it once, not twice, while it is served
        try:
            answer = await handler(state, current_settings(app), scope["vb_path_params"], headers, body,
                                   scope.get("query_string", b""), Request(scope, receive))
        except ClientDisconnect:  # gone while it waited for the heavy gate: nobody to answer, nothing computed (499)
            scope["route"] = route
            return
        except (ServiceUnavailableError, BusyError) as exc:  # a registry timeout (the route would wait again), or
            scope["route"] = route  # the heavy gate's queue full (the route would parse the body again to be refused)
            await error_response(Request(scope, receive), exc)(scope, receive, send)
            return
        except Exception:  # noqa: BLE001 - every failure is answered by the app itself, from the same body
            answer = None
        if answer is None:  # a request the route answers (odd parameters, or any error)
            return await self.app(scope, _replay(body, receive), send)
        response, observe = answer
        scope["route"] = route  # metrics and the access log name the route template
        observe()
        await response(scope, receive, send)


def _replay(body: bytes, receive):
    """A ``receive`` that hands the app the already-read body once, then the client's own messages."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
