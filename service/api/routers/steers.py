"""Steers: fit jobs, listing, apply, lens (``/v1/steers``); steered search lives in the indexes router
and calls :func:`service.ops.steers.steer_queries`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from align.exceptions import PairCountError
from align.validation import check_labels

from ...limits import MAX_LENS_DIRECTIONS, MAX_LENS_K
from ...ops import steers as steer_ops
from ..codec import body_dim, may_hold_bools, parse_options, texts_instead, vectors_from_json
from ..conditional import (IfMatch, IfNoneMatch, IfNoneMatchStar, alias_answer, alias_write, answer, read_responses,
                           write_responses)
from ..deps import JSONOnly, ReadScope, SettingsDep, StateDep, VersionPath, WriteScope
from ..job_routes import job_route
from ..name_types import AliasPath, NamePath, RefPath
from ..openapi import examples, json_body
from ..pagination import Page, list_route, paginate
from ..responses import FastJSONResponse
from ..routing import CodecRoute
from ..schemas import (AliasOut, AliasSet, SteerApplyOptions, SteerApplyRequest, SteerApplyResponse, SteerDeleted,
                       SteerFitOptions, SteerFitRequest, SteerList, SteerLens, SteerOut, SteerTransferred,
                       SteerTransferRequest, SteerVersionList, error_responses)

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["steers"], responses=error_responses(401, 403, 404, 422, 503),
                   route_class=CodecRoute)

FIT_DOC = """Queue a steer fit (LM-Steer style `W = P1 P2^T` in one space, or the `mean-shift`
baseline); the answer (202) carries the job id. On success the job's `result` holds `ref` and the
registered `steer` version. Rows are `vectors`, `vectors_b64` + `dim`, or `texts` (embedded with
`encoder`, default the space's); `labels` give one value per row (+1 / -1 / 0 neutral).
The lens is stored with the version when the rows have names (`texts`, or `items` with vectors).
A steer whose own held-out check finds no gain from its labels is registered flagged unreliable
(`metrics.reliable` false, `metrics.unreliable_reason`; the job's `notes` say so) and its `alias` is not
moved to it: the result's `alias_held_back` names it (null when the alias moved, or none was asked for).
`Idempotency-Key` works as for map fits.
"""


@job_route(router, "/steers", kind="steer-fit", summary="Queue a steer fit job", description=FIT_DOC,
           body_model=SteerFitRequest, example="create_steer")
def create_steer(body: bytes, request, state, settings):
    obj, opts = parse_options(body, SteerFitOptions)
    steer_ops.check_steer_fit(state.registry, name=opts.name, space=opts.space, alias=opts.alias,
                              params=opts.params, random_state=opts.random_state)
    texts = texts_instead(obj, opts.texts, settings.max_batch)
    dim, encoder = steer_ops.space_for_rows(state.registry, state.encoder, opts.space, texts=texts,
                                            encoder=opts.encoder)
    X = None if texts else vectors_from_json(obj, dim=dim or body_dim(obj), max_batch=settings.max_batch,
                                             bools=may_hold_bools(body))
    n = len(opts.texts) if texts else X.shape[0]
    # the rows' width (the space's, or the vectors') bounds lm-steer's rank: now, not in a failed job
    steer_ops.check_steer_params(opts.params, opts.random_state, dim=dim if X is None else X.shape[1])
    if len(opts.labels) != n:
        raise PairCountError(f"{len(opts.labels)} labels for {n} rows")
    check_labels(opts.labels, n)  # values in {-1, 0, +1}, both signs present: now, not in a failed job
    if opts.items is not None and len(opts.items) != n:
        raise PairCountError(f"{len(opts.items)} items for {n} rows")
    if X is not None:  # rows of another space: a 422 now, as POST /v1/maps/{ref}/transform, not a failed job
        steer_ops.check_steer_rows(state.registry, X, opts.space, use="fit", name="the vectors",
                                   references=lambda: state.space_references(X.shape[1]))

    def job(ctx):
        v = steer_ops.embed_and_register(
            state.registry, state.encoder, space=opts.space, X=X, texts=opts.texts, encoder=encoder,
            references=None if X is None else (lambda: state.space_references(X.shape[1])),
            items=opts.items, inputs={"via": "http"}, progress=ctx.progress, name=opts.name, labels=opts.labels,
            params=opts.params, random_state=opts.random_state, alias=opts.alias, description=opts.description)
        held = steer_ops.alias_held_back(v, opts.alias)  # a flagged fit's alias stays where it was: said, as the CLI
        note = steer_ops.unreliable_steer_note(v, held)  # registered either way; the job succeeds (as a map fit's)
        return {"ref": v.ref, "steer": v.to_dict(), "alias_held_back": held, "notes": [note] if note else []}

    return job, f"steer fit {opts.name}"


list_route(router, "/steers", name="list_steers", summary="List steers", response_model=SteerList,
           load_page=lambda state, after, limit: state.registry.list_steers(after=after, limit=limit))


@router.get("/steers/{name}/versions", dependencies=[ReadScope], summary="List a steer's versions",
            response_model=SteerVersionList)
async def list_steer_versions(name: NamePath, state: StateDep, page: Page, include_deleted: bool = True):
    """Every version, oldest first, paged as `/v1/maps/{name}/versions`: each as `GET /v1/steers/NAME:N` shows it,
    its `aliases` and its verdict (`metrics.reliable`, `metrics.unreliable_reason`, `metrics.heldout_loss_ratio`;
    none for a method with no held-out check). `include_deleted=false` leaves deleted versions out; 404 for an
    unknown name."""
    vs = await run_in_threadpool(state.registry.list_steer_versions, name, include_deleted)
    return FastJSONResponse(paginate([v.to_dict() for v in vs], lambda d: d["version"], page, cursor_type=int))


@router.get("/steers/{ref}", dependencies=[ReadScope], summary="Get a steer version (name, name@alias, name:N)",
            response_model=SteerOut, responses=read_responses())
async def get_steer(ref: RefPath, state: StateDep, if_none_match: IfNoneMatch = None):
    info = await run_in_threadpool(state.registry.inspect_steer, ref)  # a flagged-only name shows its newest
    return answer(if_none_match, FastJSONResponse(info.to_dict()))


@router.post("/steers/{ref}/apply", dependencies=[ReadScope, JSONOnly], summary="Steer vectors: Q (I + eps W)",
             response_model=SteerApplyResponse, openapi_extra=json_body(SteerApplyRequest, "apply_steer"),
             responses=error_responses(413, 415, 429))
async def apply_steer(ref: RefPath, request: Request, state: StateDep, settings: SettingsDep):
    body = await request.body()

    def work():
        obj, opts = parse_options(body, SteerApplyOptions)
        info, steer = state.resolve_steer(ref)
        Q = vectors_from_json(obj, dim=info.dim, max_batch=settings.max_batch, bools=may_hold_bools(body))
        steer_ops.check_steer_zero_rows(Q, "vectors")  # as POST /v1/maps/{ref}/transform refuses them
        steer_ops.check_steer_rows(state.registry, Q, info.space, use="apply", ref=info.ref, name="the vectors",
                                   references=lambda: state.space_references(info.dim))
        return info, opts, steer_ops.apply_steer_job(Q, [(steer, opts.eps)])

    info, opts, out = await state.heavy.hop(work, len(body), request)
    state.metrics.batch_rows.labels("steer_apply").observe(out.shape[0])
    return await run_in_threadpool(FastJSONResponse, {"steer": info.ref, "eps": opts.eps, "vectors": out})


@router.get("/steers/{name}/aliases/{alias}", dependencies=[ReadScope], summary="Get a steer alias (and its ETag)",
            response_model=AliasOut, responses=read_responses())
async def get_steer_alias(name: NamePath, alias: AliasPath, state: StateDep, if_none_match: IfNoneMatch = None):
    """The version the alias points at; its `ETag` (`"v<N>"`) is what `If-Match` on a write of the alias compares."""
    v = await run_in_threadpool(state.registry.steer_alias_version, name, alias)
    return alias_answer(v, {"name": name, "alias": alias, "version": v}, if_none_match)


@router.put("/steers/{name}/aliases/{alias}", dependencies=[WriteScope, JSONOnly],
            summary="Point a steer alias at a version", response_model=SteerOut,
            responses={**error_responses(409, 415), **write_responses()})
async def set_steer_alias(name: NamePath, alias: AliasPath,
                          body: Annotated[AliasSet, Body(openapi_examples=examples("set_alias"))], state: StateDep,
                          if_match: IfMatch = None, if_none_match: IfNoneMatchStar = None):
    """Compare-and-set as for map aliases: `If-Match` / `If-None-Match: *` (412) or `expected_version` (409)."""
    info = await run_in_threadpool(alias_write, lambda expected: steer_ops.set_steer_alias(
        state.registry, name, alias, body.version, expected=expected), name=name, alias=alias, if_match=if_match,
        if_none_match=if_none_match, body_expected=body.expected_version)
    return alias_answer(info.version, info.to_dict())


@router.delete("/steers/{name}/aliases/{alias}", dependencies=[WriteScope], status_code=204,
               summary="Remove a steer alias", responses=error_responses(412))
async def delete_steer_alias(name: NamePath, alias: AliasPath, state: StateDep, if_match: IfMatch = None):
    """`If-Match: "v<N>"` (or `*`): remove it only while it points there, else 412."""
    await run_in_threadpool(alias_write, lambda expected: steer_ops.delete_steer_alias(
        state.registry, name, alias, expected=expected), name=name, alias=alias, if_match=if_match, if_none_match=None)
    return Response(status_code=204)


@router.delete("/steers/{name}/versions/{version}", dependencies=[WriteScope], response_model=SteerDeleted,
               summary="Delete a steer version (soft: kept for lineage, no longer resolvable)")
async def delete_steer_version(name: NamePath, version: VersionPath, state: StateDep):
    """The deleted version, and `bare_ref`: what a bare NAME resolves to now. Aliases stay on the deleted version
    (they no longer resolve); when `prod` was one of them, the bare name falls to the newest live version not
    flagged unreliable (`bare_ref` null: none). A version deleted before: 200 too, `already_deleted` true."""
    def work():
        info, already, when = steer_ops.delete_steer_version(state.registry, name, version)
        return {**info.to_dict(), "bare_ref": steer_ops.bare_steer_ref(state.registry, name),
                "already_deleted": already, "deleted_at": when}

    return FastJSONResponse(await run_in_threadpool(work))


@router.post("/steers/{ref}/transfer", dependencies=[WriteScope, JSONOnly], status_code=201,
             response_model=SteerTransferred,
             summary="Carry a steer through a map (H^T W H) and register it in the map's target space",
             responses=error_responses(409, 415))
async def transfer_steer(ref: RefPath,
                         body: Annotated[SteerTransferRequest, Body(openapi_examples=examples("transfer_steer"))],
                         state: StateDep):
    """A steer carried through a map flagged unreliable, or from a steer flagged so, is registered flagged
    unreliable: `metrics.reliable` false, `metrics.unreliable_reason` saying which (`metrics.map_reliable`), and
    the `alias` asked for is not moved to it: `alias_held_back` names it (as the fit job's result does)."""
    info = await run_in_threadpool(steer_ops.transfer_and_register, state.registry, ref, body.map, name=body.name,
                                   alias=body.alias, description=body.description, load_map=state.resolve_map,
                                   load_steer=state.resolve_steer)
    return FastJSONResponse({**info.to_dict(), "alias_held_back": steer_ops.alias_held_back(info, body.alias)},
                            status_code=201)


@router.get("/steers/{ref}/lens", dependencies=[ReadScope], summary="Singular directions of a steer",
            response_model=SteerLens)
async def steer_lens(ref: RefPath, state: StateDep, k: int = Query(5, ge=1, le=MAX_LENS_K),
                     n_directions: int = Query(4, ge=1, le=MAX_LENS_DIRECTIONS)):
    info = await run_in_threadpool(state.registry.inspect_steer, ref)
    steer = await run_in_threadpool(state.registry.load_steer, info)
    return FastJSONResponse(steer_ops.describe_lens(info, steer, k=k, n_directions=n_directions))

