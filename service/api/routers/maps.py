"""Spaces, maps, versions, aliases, tags, soft delete, artifacts, and the transform route."""

from __future__ import annotations

import contextlib
from typing import Annotated, get_args

import numpy as np
from fastapi import APIRouter, Body, Query, Request
from fastapi.responses import HTMLResponse, Response
from pydantic import WithJsonSchema
from starlette.concurrency import run_in_threadpool

from align.exceptions import DimensionMismatchError, InputError

from ...limits import MAX_DIM, parse_strict_int
from ...ops import maps as map_ops
from ...ops.transform import check_direction_rows, check_no_zero_rows
from ...registry import parse_ref
from ...registry.cache import LRUCache
from ..codec import (JSON, NPY, OCTET, b64_encode, check_query, may_hold_bools, media_type, npy_bytes, options_of,
                     parse_json, prefers_json, validate, vectors_from_binary, vectors_from_json)
from ..conditional import (IMMUTABLE, REVALIDATE, IfMatch, IfMatchVersion, IfNoneMatch, IfNoneMatchStar, alias_answer,
                           alias_write, answer, body_etag, not_modified, read_responses, version_check, write_responses)
from ..deps import JSONOnly, ReadScope, SettingsDep, StateDep, VersionPath, WriteScope
from ..name_types import AliasPath, NamePath, RefPath
from ..openapi import examples, json_body
from ..pagination import Page, list_route, paginate
from ..responses import FastJSONResponse, dumps
from ..routing import CodecRoute
from ..schemas import (AliasOut, AliasSet, MapDetail, MapList, SpaceCreate, SpaceList, SpaceOut, TagSet,
                       TransformJSON, TransformOptions, TransformResponse, VersionDeleted, VersionList, VersionOut,
                       error_responses)

#: rows of a transform request its space check reads (the first ones)
CHECK_ROWS = 128
router = APIRouter(prefix="/v1", tags=["spaces and maps"], responses=error_responses(401, 403, 404, 422, 503),
                   route_class=CodecRoute)

TRANSFORM_DOC = """Map vectors from the map's source space into its target space.

`ref` is `name` (its `prod` version when that alias is set, else its newest live version not flagged
unreliable: the version searches use; a 404 naming them when every live version is flagged), `name@alias` or
`name:N` (a flagged version too).

**Request formats** (pick by `Content-Type`):

| Content-Type | body | notes |
|---|---|---|
| `application/json` | `{"vectors": [[...], ...]}` | simplest; parsing JSON numbers dominates at large batches |
| `application/json` | `{"vectors_b64": "<base64 float32>", "dim": 384}` | JSON envelope, binary payload |
| `application/octet-stream` | raw little-endian float32, row-major | **fast path**; width from `?dim=` or `X-Vector-Dim` (default: the map's source dim) |
| `application/x-npy` | a `.npy` file (float16/32/64, 2-D) | as fast; self-describing |

**Responses** follow the request: JSON in → JSON out (`encoding_format=float|base64`);
octet-stream in → raw float32 out (`X-Shape: n,d`); `.npy` in → `.npy` out. Send
`Accept: application/json` to get JSON back for a binary request (q-values count: JSON when it ranks above the
request's type; a tie, `*/*` or no match answers the request's type; a JSON answer of numbers holds at most
`limits.max_response_values`, whatever the request's format). Every response names the version used
(`map`, `version` fields or `X-Map` / `X-Map-Version` headers).

`output`: `raw` (default; comparable with raw target vectors, e.g. to search an index or a
vector database of target embeddings), `frame` (the centred target frame used for
evaluation) or `linear` (`f_s(x) W + b` without output normalisation).

`output` and `encoding_format` may be query parameters (with any body); one the JSON body sets too must agree with
it, as `?dim=` and `X-Vector-Dim` must with the rows. Any other query parameter, or one given twice, is a 422.

Errors: unknown map 404; wrong width, NaN/Inf, empty or ragged input, an unknown or repeated query parameter 422;
more rows than `max_batch` or a body over `max_body_bytes` 413.
"""

TRANSFORM_QUERY = ("dim", "encoding_format", "output")  # any other query parameter, or one given twice: 422


def _values_of(option: str) -> WithJsonSchema:
    """The OpenAPI schema of the transform's query parameter ``option``: the values TransformOptions takes. The
    route reads it as text and checks it with TransformOptions, as the fast path does, so both answer alike."""
    return WithJsonSchema({"type": "string", "enum": list(get_args(TransformOptions.model_fields[option].annotation))})


# bytes in the OpenAPI document (request bodies and answers), so generated clients read and send them as bytes:
# an answer's media type with no schema left them to guess (a string, or nothing at all)
_BINARY = {"type": "string", "format": "binary"}
_TRANSFORM_BODY = json_body(TransformJSON, "transform", extra_content={
    OCTET: {"schema": {**_BINARY, "description": "little-endian float32, row-major (n*d*4 bytes)"}},
    NPY: {"schema": {**_BINARY, "description": "a .npy array (n, d)"}},
})
_TRANSFORM_ANSWERS = {
    OCTET: {"schema": {**_BINARY, "description": "little-endian float32, row-major (`X-Shape: n,d`)"}},
    NPY: {"schema": {**_BINARY, "description": "a float32 .npy array (n, d)"}},
}
_TEXT = {"type": "string"}
#: the headers naming the version that answered (a transform, an artifact): what a binary answer has no field for
_MAP_HEADERS = {"X-Map": {"description": "The map's name.", "schema": _TEXT},
                "X-Map-Version": {"description": "The version that answered.", "schema": {"type": "integer"}}}
_TRANSFORM_HEADERS = {**_MAP_HEADERS, "X-Shape": {"description": "`n,d`: rows and columns of the answer (a raw float32 "
                                                                 "body holds no shape).", "schema": _TEXT}}


# --- spaces -------------------------------------------------------------------------------------
list_route(router, "/spaces", name="list_spaces", summary="List spaces", response_model=SpaceList,
           load=lambda state: [s.to_dict() for s in state.registry.list_spaces()])


@router.get("/spaces/{name}", dependencies=[ReadScope], summary="Get a space", response_model=SpaceOut)
async def get_space(name: NamePath, state: StateDep):
    return FastJSONResponse((await run_in_threadpool(state.registry.get_space, name)).to_dict())


@router.post("/spaces", dependencies=[WriteScope, JSONOnly], status_code=201, summary="Register (or update) a space",
             response_model=SpaceOut, responses={200: {"model": SpaceOut, "description": "The space existed; the "
                                                       "fields given were set on it."}, **error_responses(409, 415)})
async def create_space(body: Annotated[SpaceCreate, Body(openapi_examples=examples("create_space"))], state: StateDep):
    """An upsert: 201 with the new space, or 200 when a space of that name and `dim` existed, its `description`
    (and a prefix or encoder it had not set) replaced by those given (non-empty); `created_at` is kept. Another
    `dim`, or an encoder or prefix other than the one set, is a 409."""
    info, created = await run_in_threadpool(
        lambda: map_ops.create_space(state.registry, state.encoder, name=body.name, dim=body.dim, encoder=body.encoder,
                                     query_prefix=body.query_prefix, passage_prefix=body.passage_prefix,
                                     description=body.description))
    return FastJSONResponse(info.to_dict(), status_code=201 if created else 200)


@router.delete("/spaces/{name}", dependencies=[WriteScope], summary="Delete an unused space",
               response_model=SpaceOut, responses=error_responses(409))
async def delete_space(name: NamePath, state: StateDep):
    """The space as it was. 409 naming them while maps, steers or indexes are in it (maps and steers keep their
    records for lineage, so a space once used stays); 404 when unknown."""
    return FastJSONResponse(
        (await run_in_threadpool(map_ops.delete_space, state.registry, state.indexes, name)).to_dict())


# --- maps ---------------------------------------------------------------------------------------
list_route(router, "/maps", name="list_maps", summary="List maps", response_model=MapList,
           load_page=lambda state, after, limit: state.registry.list_maps(after=after, limit=limit))


@router.get("/maps/{ref}", dependencies=[ReadScope], summary="Get a map (and the version a reference resolves to)",
            response_model=MapDetail, responses=read_responses())
async def get_map(ref: RefPath, state: StateDep, if_none_match: IfNoneMatch = None):
    """`resolved`: the version `ref` resolves to; for a bare name whose live versions are all flagged unreliable
    (which a transform refuses, 404), the newest of them, to inspect (`path_version` null says so)."""
    return answer(if_none_match, FastJSONResponse(
        await run_in_threadpool(map_ops.describe_map, state.registry, state.resolve, ref)))


@router.get("/maps/{name}/versions", dependencies=[ReadScope], summary="List a map's versions",
            response_model=VersionList)
async def list_versions(name: NamePath, state: StateDep, page: Page, include_deleted: bool = True):
    vs = await run_in_threadpool(state.registry.list_versions, name, include_deleted)
    return FastJSONResponse(paginate([v.to_dict() for v in vs], lambda d: d["version"], page, cursor_type=int))


@router.get("/maps/{name}/versions/{version}", dependencies=[ReadScope], summary="Get one version",
            response_model=VersionOut, responses=read_responses())
async def get_version(name: NamePath, version: VersionPath, state: StateDep, if_none_match: IfNoneMatch = None):
    v = await run_in_threadpool(state.registry.get_version, name, version)
    return answer(if_none_match, FastJSONResponse(v.to_dict()))


@router.delete("/maps/{name}/versions/{version}", dependencies=[WriteScope],
               summary="Delete a version (soft: kept for lineage, no longer resolvable)", response_model=VersionDeleted)
async def delete_version(name: NamePath, version: VersionPath, state: StateDep):
    """The deleted version, and `bare_ref`: what a bare NAME resolves to now (aliases stay on the deleted version and
    no longer resolve; when `prod` was one of them, the bare name falls to the best live version), as steers say.
    A version deleted before: 200 too, `already_deleted` true and `deleted_at` the first delete's time."""
    def work():
        v, already, when = state.registry.delete_version_once(name, version)
        bare = state.registry.resolve_bare(name)
        if bare is None and state.metrics.multiprocess is None:  # no version left to use: the name's counters leave
            with contextlib.suppress(Exception):  # /metrics (they stayed for every name ever used); the delete stands
                if not state.registry.live_map_names([name]):
                    state.metrics.map_dropped(name)
        return {**v.to_dict(), "bare_ref": bare.ref if bare is not None else None, "already_deleted": already,
                "deleted_at": when}

    return FastJSONResponse(await run_in_threadpool(work))


@router.get("/maps/{name}/aliases/{alias}", dependencies=[ReadScope], summary="Get an alias (and its ETag)",
            response_model=AliasOut, responses=read_responses())
async def get_alias(name: NamePath, alias: AliasPath, state: StateDep, if_none_match: IfNoneMatch = None):
    """The version the alias points at (also a deleted one); its `ETag` (`"v<N>"`) is what `If-Match` on a
    `PUT` / `DELETE` of the alias compares with."""
    v = await run_in_threadpool(state.registry.alias_version, name, alias)
    return alias_answer(v, {"name": name, "alias": alias, "version": v}, if_none_match)


@router.put("/maps/{name}/aliases/{alias}", dependencies=[WriteScope, JSONOnly],
            summary="Point an alias at a version", response_model=VersionOut,
            responses={**error_responses(409, 415), **write_responses()})
async def set_alias(name: NamePath, alias: AliasPath,
                    body: Annotated[AliasSet, Body(openapi_examples=examples("set_alias"))],
                    state: StateDep, if_match: IfMatch = None, if_none_match: IfNoneMatchStar = None):
    """Compare-and-set: `If-Match: "v<N>"` (the alias's `ETag`; `*`: while it is set) or `If-None-Match: *`
    (only while it is not set), else 412; or `expected_version` in the body (409). The answer carries the
    alias's new `ETag`."""
    v = await run_in_threadpool(alias_write, lambda expected: state.registry.set_alias(
        name, alias, body.version, expected=expected), name=name, alias=alias, if_match=if_match,
        if_none_match=if_none_match, body_expected=body.expected_version)
    return alias_answer(v.version, v.to_dict())


@router.delete("/maps/{name}/aliases/{alias}", dependencies=[WriteScope], status_code=204, summary="Remove an alias",
               responses=error_responses(412))
async def delete_alias(name: NamePath, alias: AliasPath, state: StateDep, if_match: IfMatch = None):
    """`If-Match: "v<N>"` (or `*`): remove it only while it points there, else 412 (an alias that is not set: 412)."""
    await run_in_threadpool(alias_write, lambda expected: state.registry.delete_alias(name, alias, expected=expected),
                            name=name, alias=alias, if_match=if_match, if_none_match=None)
    return Response(status_code=204)


# A report opened on its own (the console shows it in a script-less sandboxed frame) is inert too: inline styles
# and data: images only, in a sandbox (no script, opaque origin), whoever wrote the file in the data dir.
REPORT_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; frame-ancestors 'none'; sandbox"


@router.get("/maps/{name}/versions/{version}/report", dependencies=[ReadScope], summary="The version's HTML fit report",
            response_class=Response, responses=read_responses(
                {"content": {"text/html": {"schema": {"type": "string"}}}, "description": "The report."}))
async def get_report(name: NamePath, version: VersionPath, state: StateDep, if_none_match: IfNoneMatch = None):
    """The self-contained HTML report written by the fit (charts inline), read from the data dir; 404 when the
    version has none (registered without a report, or the file is gone)."""
    return answer(if_none_match, HTMLResponse(await run_in_threadpool(map_ops.report_html, state.registry, name,
                                                                      version),
                                              headers={"Content-Security-Policy": REPORT_CSP}))


def _tagged(v) -> Response:
    """The version after a tag write, with its new ``ETag`` (the next conditional write's ``If-Match``)."""
    out = FastJSONResponse(v.to_dict())
    out.headers["ETag"] = body_etag(out.body)
    return out


@router.put("/maps/{name}/versions/{version}/tags/{key}", dependencies=[WriteScope, JSONOnly],
            summary="Set a tag", response_model=VersionOut,
            responses={**error_responses(409, 415), **write_responses("version")})
async def set_tag(name: NamePath, version: VersionPath, key: str,
                  body: Annotated[TagSet, Body(openapi_examples=examples("set_tag"))], state: StateDep,
                  if_match: IfMatchVersion = None):
    """Tags are text: a string is stored as sent, any other JSON value as its compact JSON (`true`, `null`,
    `{"a":1}`, `0.5`). `If-Match` with the version's `ETag`: only while the version is as read, else 412. A deleted
    version: 409 (as for an alias)."""
    value = body.value if isinstance(body.value, str) else dumps(body.value).decode()
    check = version_check(if_match, name, version)
    return _tagged(await run_in_threadpool(lambda: state.registry.set_tag(name, version, key, value, check=check)))


@router.delete("/maps/{name}/versions/{version}/tags/{key}", dependencies=[WriteScope], summary="Remove a tag",
               response_model=VersionOut, responses=write_responses("version"))
async def delete_tag(name: NamePath, version: VersionPath, key: str, state: StateDep,
                     if_match: IfMatchVersion = None):
    """The version without tag `key`. A tag that is not set: 404 naming the tags that are (nothing deleted), as
    `registry tag --delete` refuses it. `If-Match` as for `PUT`."""
    return _tagged(await run_in_threadpool(lambda: state.registry.delete_tag(
        name, version, key, check=version_check(if_match, name, version))))


@router.get("/maps/{ref}/artifact", dependencies=[ReadScope], summary="Download the map artifact",
            response_class=Response, responses=read_responses({"content": {OCTET: {"schema": {
                **_BINARY, "description": "the artifact as `format` (safetensors or npz)"}}}}, _MAP_HEADERS))
async def get_artifact(request: Request, ref: RefPath, state: StateDep, if_none_match: IfNoneMatch = None,
                       format: str = Query("safetensors", pattern="^(npz|safetensors)$")):
    """The artifact as `format`. `ETag`: `"<artifact sha256>.<format>"`; `If-None-Match` with it → 304 (nothing
    read). `Cache-Control`: immutable for `name:N`, revalidate for an alias or a bare name (they move)."""
    v = await run_in_threadpool(state.resolve, ref)
    cache = IMMUTABLE if parse_ref(ref)[2] is not None else REVALIDATE
    headers = {"X-Map": v.name, "X-Map-Version": str(v.version)}
    etag = f'"{v.artifact_sha256}.{format}"'
    hit = not_modified(if_none_match, etag, cache, headers)
    if hit is not None:
        return hit
    # a HEAD of an artifact served before: its length, without loading and serialising it (the ETag's sha256 and
    # format fix the bytes, so one length per ETag), while the GET would still answer it (_still_served)
    lengths: LRUCache = request.app.state.artifact_lengths
    known = lengths.peek(etag) if request.method == "HEAD" else None
    length = known[0] if known is not None and _still_served(state.registry, v, known[1]) else None
    if length is None:
        def load() -> tuple[bytes, int | None]:
            """The body, and the size of the file when this load read it and checked its sha256 (None when the map
            was in memory: a file damaged since would be remembered as the good one)."""
            read = state.registry.cached_map(v) is None
            body = state.load_version(v).to_bytes(format)
            return body, (state.registry.store.size(v.artifact_path) if read else None)

        data, size = await run_in_threadpool(load)
        if size is not None or lengths.peek(etag) is None:  # a checked file's size replaces an unchecked one
            lengths.put(etag, (len(data), size))
    out = answer(None, Response(data if length is None else b"", media_type="application/octet-stream", headers={
        "Content-Disposition": f'attachment; filename="{v.name}-{v.version}.{format}"', **headers}),
        etag=etag, cache_control=cache)
    if length is not None:
        out.headers["Content-Length"] = str(length)
    return out


def _still_served(registry, v, stored: int | None) -> bool:
    """Whether a GET of version ``v``'s artifact would answer it as when its length was remembered, the stored file
    then ``stored`` bytes: the map is in memory (the GET reads no file), or its file is there with that size (one
    ``stat``, on the event loop as the registry's change token is). A file removed or truncated since answered a
    HEAD 200 from memory while the GET failed (500); now the HEAD takes the GET's path and fails alike. A file
    damaged in place at the same size is found only by the GET's sha256 check, which reads it all."""
    return registry.cached_map(v) is not None or (stored is not None and registry.store.size(v.artifact_path) == stored)


# --- transform ----------------------------------------------------------------------------------
@router.post("/maps/{ref}/transform", dependencies=[ReadScope], summary="Transform vectors (JSON or binary)",
             description=TRANSFORM_DOC, openapi_extra=_TRANSFORM_BODY, response_model=TransformResponse,
             responses={200: {"content": _TRANSFORM_ANSWERS, "headers": _TRANSFORM_HEADERS},
                        **error_responses(413, 415, 429)})
async def transform(ref: RefPath, request: Request, state: StateDep, settings: SettingsDep,
                    output: Annotated[str | None, Query(description="raw | frame | linear (binary requests)"),
                                      _values_of("output")] = None,
                    encoding_format: Annotated[str | None, Query(description="float | base64 (JSON responses)"),
                                               _values_of("encoding_format")] = None,
                    dim: int | None = Query(None, ge=1, le=MAX_DIM, description="row width of an octet-stream body")):
    check_query(request.query_params.multi_items(), TRANSFORM_QUERY)
    mt = media_type(ct := request.headers.get("content-type"))
    body = await request.body()
    query_opts = {k: v for k, v in (("output", output), ("encoding_format", encoding_format)) if v is not None}
    accept = ", ".join(request.headers.getlist("accept"))  # several Accept headers are one list (RFC 9110 5.3)
    v, Y, response = await state.heavy.hop(lambda: transform_call(
        state, settings, ref, mt, body, query_opts=query_opts, dim=dim,
        header_dim=request.headers.get("x-vector-dim"), accept=accept, typed=bool(ct)), len(body), request)
    transform_observe(state, v, Y)
    return response


def transform_call(state, settings, ref: str, mt: str, body: bytes, *, query_opts: dict, dim: int | None,
                   header_dim: str | None, accept: str, resolve=None, typed: bool = True) -> tuple:
    """``(version, Y, response)``: the whole transform of one request, in one call (one thread-pool hop).

    Shared by the route and the batch-1 fast path (:mod:`service.api.fastpath`), so both answer alike.
    Every check that guards the numerics is here: width, NaN/Inf (made by the map's apply), batch and answer limits.
    ``resolve(ref) -> (version, map)`` defaults to ``state.resolve_map``.
    """
    v, m = (resolve or state.resolve_map)(ref)
    hd = parse_strict_int(header_dim, "X-Vector-Dim", 1, MAX_DIM) if header_dim else None
    if dim and hd and dim != hd:  # the query's won silently
        raise InputError(f"?dim={dim} and X-Vector-Dim: {hd} disagree; send one row width")
    # the query's options; none beside a JSON body: the body's own, with no query model made nor merged
    opts = validate(TransformOptions, query_opts, "query") if query_opts or mt != JSON else None
    if mt == JSON:
        obj = parse_json(body, untyped=not typed, reads_binary=True)  # the message names the binary types
        body_opts = validate(TransformOptions, options_of(obj))
        opts = body_opts if opts is None else _with_query(body_opts, opts, query_opts)
        X = vectors_from_json(obj, dim=m.source_dim, max_batch=settings.max_batch, finite=False,
                              bools=may_hold_bools(body))
        if (dim or hd) and (dim or hd) != X.shape[1]:  # ?dim= or X-Vector-Dim beside a JSON body: it was ignored
            said = f"?dim= says {dim}" if dim else f"X-Vector-Dim says {hd}"
            raise DimensionMismatchError(f"vectors: the rows have {X.shape[1]} columns, but {said}")
    else:
        d = dim or hd or m.source_dim
        X = vectors_from_binary(body, mt, dim=d, max_batch=settings.max_batch, finite=False)
        if d != m.source_dim:
            raise DimensionMismatchError(f"vectors: map {v.ref} expects {m.source_dim} columns, got {d}")
    # rows of the map's target space (a map the wrong way round): refused as `vecbridge transform` refuses them;
    # fewer than MEAN_CHECK_MIN_ROWS rows (the batch-1 fast path) are not read, and only the first CHECK_ROWS are:
    # their mean direction decides as 1,000 rows' do (WordNet minilm vs e5: 40 of 40 batches of 128 each way), at
    # ~0.12 ms where 1,000 rows cost ~0.9 ms of a 1,024-row request (in-process apply ~2.4 ms)
    check_direction_rows(v, m, X[:CHECK_ROWS], name="the vectors", how="POST /v1/maps/MAP/transform")
    # NaN/Inf: checked by the apply (a linear map reads it off the row norms it computes anyway: no pass of its own)
    Y = m.apply(X, output=opts.output, name="vectors")
    check_no_zero_rows(X, "vectors")  # after the apply's NaN check: a search through a map refuses them too
    json_answer = mt == JSON or prefers_json(accept, mt)
    if json_answer and opts.encoding_format == "float" and Y.size > settings.limits.max_response_values:
        raise InputError(f"{Y.shape[0]} x {Y.shape[1]} numbers exceed the JSON answer limit of "
                         f"{settings.limits.max_response_values} (limits.max_response_values); use "
                         f"encoding_format=base64 or a binary answer (a binary body whose Accept does not prefer "
                         f"application/json), or send smaller batches")
    headers = {"X-Map": v.name, "X-Map-Version": str(v.version), "X-Shape": f"{Y.shape[0]},{Y.shape[1]}"}
    if not json_answer:
        if mt == NPY:
            return v, Y, Response(npy_bytes(Y), media_type=NPY, headers=headers)
        # the array's own buffer (no copy of n d floats): Y is a fresh C-contiguous float32 array
        return v, Y, Response(memoryview(np.ascontiguousarray(Y, dtype="<f4")), media_type=OCTET, headers=headers)
    out = {"map": v.name, "version": v.version, "source_space": v.source_space, "target_space": v.target_space,
           "shape": list(Y.shape)}
    if opts.encoding_format == "base64":
        out["vectors_b64"] = b64_encode(Y)
    else:
        out["vectors"] = Y
    return v, Y, FastJSONResponse(out, headers=headers)


def _with_query(body_opts: TransformOptions, query: TransformOptions, given: dict) -> TransformOptions:
    """The body's options with those the query string ``given``; an option both set to different values is an
    InputError (``?output=frame`` with ``"output": "raw"`` in the body answered raw, the query unread)."""
    for key in given:
        if key in body_opts.model_fields_set and getattr(body_opts, key) != getattr(query, key):
            raise InputError(f"?{key}={getattr(query, key)} and the body's \"{key}\": \"{getattr(body_opts, key)}\" "
                             f"disagree; send one")
    return body_opts.model_copy(update={k: getattr(query, k) for k in given})


def transform_observe(state, v, Y) -> None:
    """The metrics of one answered transform (route and fast path)."""
    state.metrics.observe_rows("transform", Y.shape[0])
    state.metrics.observe_map(v.name, Y.shape[0])
