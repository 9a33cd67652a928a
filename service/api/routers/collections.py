"""``GET /v1/collections/{name}``: a collection's recorded space, width, rows and metric;
``POST /v1/collections/{name}/search``: search a collection of the service's vector database with queries of
another space — the query-side migration (Drift-Adapter): the collection keeps its old-model vectors, each query
is mapped into their space through the registry's maps, the database answers.
"""

from __future__ import annotations

import anyio
from fastapi import APIRouter, Request

from ...ops import indexes as index_ops
from ...ops.vectordb import configured_url, describe_collection, search_collection
from ...vectordb.base import check_name
from ..codec import parse_rows
from ..deps import JSONOnly, ReadScope, SettingsDep, StateDep
from ..openapi import json_body
from ..responses import FastJSONResponse
from ..schemas import error_responses
from ..vectordb_schemas import (
    CollectionOut,
    CollectionSearchOptions,
    CollectionSearchRequest,
    CollectionSearchResponse,
)

router = APIRouter(prefix="/v1", tags=["vector database"], responses=error_responses(401, 403, 404, 422, 503))

SEARCH_DOC = """Search a collection of the service's vector database (`VECBRIDGE_VECTORDB_URL`) with queries of
**any** registered space, without migrating it: the queries (`vectors`, `vectors_b64` + `dim`, or `texts`
embedded with `space`'s encoder in its query form) are mapped into the collection's space (the one it records,
as a migration does, or `collection_space`) through the registry's path of maps (`map` pins one or a path), in
its raw form, and the database searches. The answer lists `maps` (the versions used) and per query its hits
`{"id", "score"}` (ids as the database keeps them: integers or strings). One connection serves the requests one
at a time, on one thread (the others wait their turn without holding a thread).
"""


@router.post("/collections/{name}/search", dependencies=[ReadScope, JSONOnly],
             summary="Search a vector-database collection with queries of another space", description=SEARCH_DOC,
             openapi_extra=json_body(CollectionSearchRequest, "search_collection"),
             response_model=CollectionSearchResponse, responses=error_responses(413, 415))
async def search_collection_route(name: str, request: Request, state: StateDep, settings: SettingsDep):
    body = await request.body()

    def work():
        configured_url(settings)
        check_name(name)
        opts, Q = parse_rows(body, CollectionSearchOptions, settings.max_batch,
                             lambda o: state.registry.get_space(o.space).dim)
        index_ops.check_k(opts.k, settings.limits)  # before texts are embedded for it
        if Q is None:
            Q = index_ops.embed_texts(state, opts.space, opts.texts, "query")
        index_ops.check_hits(Q.shape[0], opts.k, settings.limits)
        return state.vectordb.call(lambda store: search_collection(
            store, state, name, Q, space=opts.space, map_ref=opts.map, k=opts.k,
            collection_space=opts.collection_space))

    return FastJSONResponse(await anyio.to_thread.run_sync(work, limiter=state.vectordb_turns))


@router.get("/collections/{name}", dependencies=[ReadScope], summary="A collection of the vector database",
            response_model=CollectionOut)
async def get_collection(name: str, state: StateDep, settings: SettingsDep):
    """The space a collection of the service's vector database records (null: none), its width, rows and metric:
    what picking a map for a migration of it needs (a map from that space). 404 for an unknown name."""
    def work():
        configured_url(settings)
        check_name(name)
        return state.vectordb.call(lambda store: describe_collection(store, name))

    return FastJSONResponse(await anyio.to_thread.run_sync(work, limiter=state.vectordb_turns))
