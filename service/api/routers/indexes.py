"""FAISS indexes per space: create (vectors or texts), add, delete ids, search from any space.

Every route looks its index up (``state.indexes.get``) in a worker thread, never on the event loop: when
another process has written the index since, the lookup loads the new generation, which reads the whole
FAISS file (~0.2 s for 160k x 384 rows) and would stall every request of this process meanwhile. While
another thread loads the index (the start-up's loader), a route first waits for it on the event loop
(``state.after_loads``), holding no thread.

Writes from texts run on the compute gate's threads and stop, writing nothing, when their client leaves while the
texts are embedded (:func:`_texts_heavy`); a write whose client left while it waited for those threads never
begins. Once rows go into the index, the write finishes whatever the client does.
"""

from __future__ import annotations

import numpy as np
from typing import Annotated

from fastapi import APIRouter, Body, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from align.exceptions import DimensionMismatchError, InputError

from ...indexes import SpaceIndex
from ...limits import seed_of
from ...logging import get_logger
from ...ops import indexes as index_ops
from ...ops.indexes import unchecked_log
from ..codec import JSON, check_query, may_hold_bools, parse_options, parse_rows, texts_instead, vectors_from_json
from ..deps import JSONOnly, ReadScope, SettingsDep, StateDep, WriteScope
from ..name_types import IndexNamePath
from ..openapi import examples, json_body
from ..pagination import list_route
from ..responses import FastJSONResponse, dumps, dumps_plain
from ..routing import CodecRoute
from ..state import Heavier
from ..schemas import (IndexAdd, IndexAddOptions, IndexAddResponse, IndexCreate, IndexCreateOptions, IndexDelete,
                       IndexDeleteResponse, IndexList, IndexOut, SearchOptions, SearchRequest, SearchResponse,
                       error_responses)

log = get_logger("indexes")

router = APIRouter(prefix="/v1", tags=["indexes"], responses=error_responses(401, 403, 404, 422, 503),
                   route_class=CodecRoute)

SEARCH_DOC = """Search the index with queries from **any** registered space.

Queries are `vectors` (JSON rows), `vectors_b64` + `dim` (base64 float32: the fast path), or
`texts` (embedded with the query space's encoder in its query form). `space` names the
queries' space (default: the index's). When it differs from the index's space the service
finds the chain of maps in the registry (each map's `prod` alias, else its latest version;
composed when the chain is longer than one), maps the queries into the index's raw space
(`output="raw"`), and searches; `maps` in the response lists the versions used. `map` pins a
specific map instead, or a path of them (a list, in order). A client that sends one query set in
several requests passes the first answer's `maps` (`["name:version", ...]`) with the rest, so
that an alias moved meanwhile does not change the maps halfway (the Python client does; steers
likewise by `name:version`).

Per-request options (never shared state): `k`; `exact` (scan every row); `ef_search` (HNSW only);
`nprobe` (IVF only; either on an index of another kind, or with `exact`, is a 422 naming it, not dropped);
`csls` with `csls_k` and `csls_weight` (re-rank by CSLS to reduce hubness; scores are then
CSLS scores `2 cos(q, d) - r(q) - csls_weight r(d)`, `scoring="csls"`; the default weight 0.5 is half the
classic one: it kept more of native recall in migrated indexes, corpus- and query-side);
`steers` (`{"name@alias": eps, ...}`, |eps| at most 1000: steers of the index's space applied
to the queries after translation, composed by summation, refs to one version at their summed eps, bounded alike;
`steers` in the response lists them).
"""


def _info(idx: SpaceIndex) -> dict:
    return idx.info().to_dict()


list_route(router, "/indexes", name="list_indexes", summary="List indexes", response_model=IndexList,
           load=lambda state: [_info(i) for i in state.indexes.list()], ready=lambda state: state.after_loads())


def _texts_heavy(texts: list[str] | None, write):
    """A write from ``texts`` as a :class:`~service.api.state.Heavier`: its texts are embedded on the compute
    gate's threads, as ``/v1/embeddings`` does, where a client that leaves stops it at the encoder's next batch
    (:func:`~service.api.gate.run_unless_gone`: a 499, nothing written, no id drawn); rows as ``write()`` at once.
    On the shared pool, a client that posted 20,000 texts and left kept a thread embedding for minutes, then wrote
    the rows nobody would confirm. The write itself, once begun, finishes (``service.ops.indexes``)."""
    return write() if texts is None else Heavier(write)


@router.get("/indexes/{name}", dependencies=[ReadScope], summary="Get an index", response_model=IndexOut)
async def get_index(name: IndexNamePath, state: StateDep):
    await state.after_loads(name)
    return FastJSONResponse(_info(await run_in_threadpool(state.indexes.get, name)))


@router.post("/indexes", dependencies=[WriteScope, JSONOnly], status_code=201,
             summary="Create an index in a space", openapi_extra=json_body(IndexCreate, "create_index"), response_model=IndexOut,
             responses=error_responses(409, 413, 415, 429))
async def create_index(request: Request, state: StateDep, settings: SettingsDep):
    body = await request.body()

    def work():
        obj, opts = parse_options(body, IndexCreateOptions)
        space = state.registry.get_space(opts.space)
        if opts.dim is not None and opts.dim != space.dim:  # without rows it was ignored: an index of the space's
            raise DimensionMismatchError(f"dim={opts.dim}, but space {space.name!r} is {space.dim}-d: an index has "
                                         f"its space's width (omit dim, or name a {opts.dim}-d space)")
        X = None if texts_instead(obj, opts.texts, settings.max_batch) else vectors_from_json(
            obj, dim=space.dim, max_batch=settings.max_batch, required=False, bools=may_hold_bools(body))
        return _texts_heavy(opts.texts, lambda: index_ops.create_index(
            state, state.indexes, opts.name, space, X, texts=opts.texts, store_texts=opts.store_texts,
            payloads=opts.payloads, ids=opts.ids, kind=opts.kind, metric=opts.metric, params=opts.params,
            random_state=seed_of(opts.params, opts.random_state, "random_state" in opts.model_fields_set),
            description=opts.description))

    idx = await state.heavy.hop(work, len(body), request)
    return FastJSONResponse(_info(idx), status_code=201)


@router.delete("/indexes/{name}", dependencies=[WriteScope], status_code=204, summary="Drop an index")
async def drop_index(name: IndexNamePath, state: StateDep):
    await run_in_threadpool(state.indexes.delete, name)
    return Response(status_code=204)


@router.post("/indexes/{name}/vectors", dependencies=[WriteScope, JSONOnly],
             summary="Add rows (vectors or texts)", openapi_extra=json_body(IndexAdd, "add_vectors"),
             response_model=IndexAddResponse, responses=error_responses(409, 413, 415, 429))
async def add_vectors(name: IndexNamePath, request: Request, state: StateDep, settings: SettingsDep):
    body = await request.body()

    notes: list[str] = []

    def work():
        idx = state.indexes.get(name)
        opts, X = parse_rows(body, IndexAddOptions, settings.max_batch, lambda _: idx.dim)
        return _texts_heavy(opts.texts, lambda: (idx, index_ops.add_rows(
            state, idx, X, texts=opts.texts, store_texts=opts.store_texts, ids=opts.ids, payloads=opts.payloads,
            space=opts.space, warn=notes.append)))

    await state.after_loads(name)
    idx, ids = await state.heavy.hop(work, len(body), request)
    state.metrics.batch_rows.labels("index_add").observe(len(ids))
    if notes and unchecked_log.due(("add", name)):  # rows added unchecked or undecided: the client reads them,
        # the operator too, once a minute per index at most (a bulk load of one narrow topic has a note every request)
        log.warning("index add: rows check notes", extra={"fields": {"index": name, "rows": len(ids), "notes": notes}})
    return FastJSONResponse({"index": name, "ids": ids, "count": idx.count, "notes": notes})


@router.post("/indexes/{name}/delete", dependencies=[WriteScope, JSONOnly], summary="Delete rows by id",
             response_model=IndexDeleteResponse, responses=error_responses(415))
async def delete_vectors(name: IndexNamePath,
                         body: Annotated[IndexDelete, Body(openapi_examples=examples("delete_vectors"))],
                         state: StateDep):
    def work():
        idx = state.indexes.get(name)
        return idx, idx.delete(body.ids)

    await state.after_loads(name)
    idx, n = await run_in_threadpool(work)
    return FastJSONResponse({"index": name, "deleted": n, "count": idx.count})


@router.post("/indexes/{name}/search", dependencies=[ReadScope, JSONOnly], summary="Search, from any space",
             description=SEARCH_DOC, openapi_extra=json_body(SearchRequest, "search"), response_model=SearchResponse,
             responses=error_responses(413, 415, 429))
async def search(name: IndexNamePath, request: Request, state: StateDep, settings: SettingsDep):
    check_query(request.query_params.multi_items(), ())  # ?k=5 was dropped silently: k=10 answered
    body = await request.body()
    await state.after_loads(name)
    found, response = await state.heavy.hop(
        lambda: search_call(state, settings, state.indexes.get(name), body, defer=True), len(body), request)
    search_observe(state, found)
    return response


#: Multiply-adds counted for embedding one query text (a short text through a small encoder is ~ms of a core)
EMBED_WORK_PER_TEXT = 1 << 25
#: Estimated multiply-adds past which a small-bodied search runs on the compute gate's threads, not the shared pool
#: (~50 ms of a core: a routine batch of 64 queries over 8,192 x 384 rows, 0.2 G, keeps its one hop; a texts search
#: of 8 texts or more, a large ``ef_search`` or CSLS over many rows does not)
HEAVY_SEARCH_WORK = 1 << 28


def search_call(state, settings, idx: SpaceIndex, body: bytes, *, resolver=None, wait: bool = True,
                defer: bool = False) -> tuple | Heavier:
    """``(found, response)``: the whole search of one request, in one call (one thread-pool hop).

    Shared by the route and the batch-1 fast path (:mod:`service.api.fastpath`), so both answer alike.
    The fast path's event-loop try passes ``resolver=InMemory(state), wait=False``: anything that would
    wait raises :class:`~service.indexes.locking.WouldBlock` before the search. ``defer=True`` (a
    :meth:`~service.api.state.HeavyGate.hop`): a search estimated over :data:`HEAVY_SEARCH_WORK`
    (:func:`search_estimate`) is parsed here and returned as a :class:`~service.api.state.Heavier`, the search
    itself then runs on the compute gate's threads, never the shared pool (a 41 KB body could ask for 11 s).
    """
    res = resolver or state
    opts, Q = parse_rows(body, SearchOptions, settings.max_batch,
                         lambda o: index_ops.query_dim(res, idx, o.space, o.map))
    index_ops.check_k(opts.k, settings.limits)  # before any estimate or text is embedded for it
    if defer and search_estimate(idx, opts, Q) > HEAVY_SEARCH_WORK:
        return Heavier(lambda: _search_answer(res, settings, idx, opts, Q, wait))
    return _search_answer(res, settings, idx, opts, Q, wait)


def search_estimate(idx: SpaceIndex, opts, Q) -> int:
    """Estimated multiply-adds of a parsed search: the index's search (CSLS, ``ef_search``, ``nprobe``, ``exact``:
    :meth:`~service.indexes.SpaceIndex.search_cost`) and the embedding of its texts."""
    n = len(opts.texts) if opts.texts is not None else (0 if Q is None else int(Q.shape[0]))
    work = idx.search_cost(n, max(int(opts.k), 1), exact=opts.exact, ef_search=opts.ef_search, nprobe=opts.nprobe,
                           csls_k=opts.csls_k if opts.csls else 0)
    return work + (len(opts.texts) * EMBED_WORK_PER_TEXT if opts.texts is not None else 0)


def _search_answer(res, settings, idx: SpaceIndex, opts, Q, wait: bool) -> tuple:
    found = index_ops.search(res, idx, Q, texts=opts.texts, space=opts.space, map_ref=opts.map, k=opts.k,
                             exact=opts.exact, ef_search=opts.ef_search, nprobe=opts.nprobe,
                             csls_k=opts.csls_k if opts.csls else 0, csls_weight=opts.csls_weight,
                             steers=opts.steers, limits=settings.limits,
                             wait=wait, with_payloads=opts.include_payloads, finite=True)  # parse_rows checked
    head = found.describe()
    if note := index_ops.short_note(found, exact=opts.exact, nprobe=opts.nprobe):
        head["note"] = note  # some query got fewer than k hits: why (a sparse IVF index's nprobe, few rows)
    answer = _search_body(head, idx, found.S, found.I, opts.include_payloads, settings.limits.max_response_bytes,
                          found.P)
    return found, Response(answer, media_type=JSON)


def search_observe(state, found) -> None:
    """The metrics of one answered search (route and fast path)."""
    state.metrics.observe_rows("search", found.S.shape[0])
    if found.translation is not None:
        for v in found.translation.versions:
            state.metrics.observe_map(v.name, found.S.shape[0])


#: JSON bytes and hits serialised per call: the answer is written a block of rows at a time, each block sized from
#: the rows before it (the first block is one row; each at most 4x the one before), so that only a block's hit dicts
#: exist at once and a block passes ``max_response_bytes`` by little
_BLOCK_BYTES, _BLOCK_HITS = 64 * 1024, 4096


def _search_body(head: dict, idx: SpaceIndex, S: np.ndarray, I: np.ndarray, with_payloads: bool,
                 max_bytes: int, P: list | None = None) -> bytes:
    """The JSON answer ``{**head, "results": [[hit, ...], ...]}``, serialised a block of query rows at a time (about
    :data:`_BLOCK_BYTES` each; the same bytes as one row at a time, which cost a search of 64 queries ~0.1 ms in 64
    calls).

    Only one block of hit dicts exists at once (not n x k), and the answer stops at ``max_bytes``
    (``limits.max_response_bytes``; payloads can make hits large) with a 422 naming the first query past it.
    """
    parts = [dumps(head)[:-1], b',"results":[']
    size = sum(map(len, parts))
    rows_i, rows_s = I.tolist(), S.tolist()
    encode = dumps if with_payloads else dumps_plain  # hits without payloads hold only ints and floats
    r, step = 0, 1
    while r < len(rows_i):
        rows = [index_ops.hits(idx, row_i, row_s, with_payloads, P[j] if P is not None else None)
                for j, row_i, row_s in zip(range(r, r + step), rows_i[r : r + step], rows_s[r : r + step])]
        chunk = encode(rows)[1:-1]  # the rows' own JSON, comma-separated
        if size + len(chunk) + 1 > max_bytes:  # some row of the block passes it: which one (one comma per row)
            for j, row in enumerate(rows):
                size += len(dumps(row)) + 1
                if size > max_bytes:
                    raise InputError(f"the answer passes {max_bytes} bytes (limits.max_response_bytes) at query "
                                     f"{r + j}; send fewer queries, a smaller k, or include_payloads=false")
        size += len(chunk) + 1
        if r:
            parts.append(b",")
        parts.append(chunk)
        r += len(rows)
        step = max(1, min(4 * len(rows), _BLOCK_HITS // max(1, I.shape[1]), _BLOCK_BYTES * len(rows) // len(chunk)))
    parts.append(b"]}")
    return b"".join(parts)
