"""Steers: fit jobs, listing, apply, lens (``/v1/steers``); steered search lives in the indexes router
and calls :func:`service.ops.steers.steer_queries`."""

from __future__ import annotations

import hashlib

import numpy as np
from typing import Annotated

from fastapi import APIRouter, Body, Header, Path, Query, Request
from starlette.concurrency import run_in_threadpool

from align.validation import as_matrix
from align.exceptions import DimensionMismatchError, InputError, PairCountError
from align.steer import Steer

from ...registry import ConflictError, NotFoundError
from ...ops import steers as steer_ops
from ...registry.names import check_alias, check_name
from ...steer_wiring import check_steer_params, fit_and_register
from ...steering import apply_steer_job
from ..codec import check_batch, parse_json, validate, vectors_from_json
from ..deps import JSONOnly, ReadScope, SettingsDep, StateDep, WriteScope
from ..openapi import examples, json_body
from ..pagination import Page, paginate
from ..responses import FastJSONResponse
from ..schemas import (AliasSet, JobOut, SteerApplyOptions, SteerApplyRequest, SteerApplyResponse, SteerFitOptions,
                       SteerFitRequest, SteerList, SteerLens, SteerOut, SteerTransferRequest, error_responses)
from ..state import AppState

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["steers"], responses=error_responses(401, 403, 404, 422, 503))

FIT_DOC = """Queue a steer fit (LM-Steer style `W = P1 P2^T` in one space, or the `mean-shift`
baseline); the answer (202) carries the job id. On success the job's `result` holds `ref` and the
registered `steer` version. Rows are `vectors`, `vectors_b64` + `dim`, or `texts` (embedded with
`encoder`, default the space's); `labels` give one value per row (+1 / -1 / 0 neutral).
The lens is stored with the version when the rows have names (`texts`, or `items` with vectors).
`Idempotency-Key` works as for map fits.
"""


def _split(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k not in ("vectors", "vectors_b64")}


def _check_fit(state: AppState, opts: SteerFitOptions) -> None:
    check_name(opts.name, "steer name")
    check_name(opts.space, "space")
    if opts.alias is not None:
        check_alias(opts.alias)
    check_steer_params(opts.params, opts.random_state)
    try:
        have = state.registry.list_steer_versions(opts.name)
    except NotFoundError:
        return
    if have and have[0].space != opts.space:
        raise ConflictError(f"steer {opts.name!r} lives in space {have[0].space!r}, not {opts.space!r}")


@router.post("/steers", dependencies=[WriteScope, JSONOnly], status_code=202, summary="Queue a steer fit job",
             description=FIT_DOC, response_model=JobOut, openapi_extra=json_body(SteerFitRequest, "create_steer"),
             responses={200: {"model": JobOut, "description": "Idempotent replay: the job this key first created."},
                        **error_responses(409, 413, 415, 429)})
async def create_steer(request: Request, state: StateDep, settings: SettingsDep,
                       idempotency_key: str | None = Header(None, alias="Idempotency-Key", max_length=200)):
    body = await request.body()

    def prepare():
        obj = parse_json(body)
        opts = validate(SteerFitOptions, _split(obj))
        _check_fit(state, opts)
        try:
            info = state.registry.get_space(opts.space)
        except NotFoundError:
            info = None
        if opts.texts is not None:
            if "vectors" in obj or "vectors_b64" in obj:
                raise InputError("give either vectors or texts, not both")
            if not opts.texts:
                raise InputError("texts must not be empty")
            check_batch(len(opts.texts), settings.max_batch)
            encoder = opts.encoder or (info.encoder if info else None)
            if not encoder:
                raise InputError(f"give an `encoder` for the texts (space {opts.space!r} has none registered)")
            state.encoder(encoder)  # 404 now for an unknown encoder
            n, X = len(opts.texts), None
        else:
            encoder = None
            X = vectors_from_json(obj, dim=info.dim if info else obj.get("dim"), max_batch=settings.max_batch)
            n = X.shape[0]
        if len(opts.labels) != n:
            raise PairCountError(f"{len(opts.labels)} labels for {n} rows")
        if opts.items is not None and len(opts.items) != n:
            raise PairCountError(f"{len(opts.items)} items for {n} rows")
        return opts, X, encoder, info

    opts, X, encoder, info = await run_in_threadpool(prepare)

    def job(ctx):
        Xj = X
        if Xj is None:
            enc = state.encoder(encoder)
            ctx.progress("encode", 0.0)
            Xj = as_matrix(np.asarray(enc.encode(opts.texts, kind="passage"), dtype=np.float32), name="embeddings")
        if info is None:
            try:
                state.registry.get_space(opts.space)
            except NotFoundError:
                state.registry.register_space(opts.space, int(Xj.shape[1]), encoder=encoder)
        elif Xj.shape[1] != info.dim:
            raise DimensionMismatchError(f"space {opts.space!r} is {info.dim}-d, the rows have {Xj.shape[1]}")
        v = fit_and_register(state.registry, name=opts.name, space=opts.space, X=Xj, labels=opts.labels,
                             params=opts.params, random_state=opts.random_state, alias=opts.alias,
                             items=opts.texts if opts.texts is not None else opts.items,
                             description=opts.description, progress=ctx.progress,
                             inputs={"via": "http", "rows": int(Xj.shape[0]),
                                     **({"encoder": encoder} if encoder else {})})
        return {"ref": v.ref, "steer": v.to_dict()}

    digest = hashlib.sha256(body).hexdigest()
    job_, created = state.jobs.submit(job, kind="steer-fit", description=f"steer fit {opts.name}",
                                      idempotency_key=idempotency_key, request_hash=digest)
    return FastJSONResponse(job_.to_dict(), status_code=202 if created else 200,
                            headers={"Location": f"/v1/jobs/{job_.id}"})


@router.get("/steers", dependencies=[ReadScope], summary="List steers", response_model=SteerList)
async def list_steers(state: StateDep, page: Page):
    return FastJSONResponse(paginate(await run_in_threadpool(state.registry.list_steers), lambda d: d["name"], page))


@router.get("/steers/{ref}", dependencies=[ReadScope], summary="Get a steer version (name, name@alias, name:N)",
            response_model=SteerOut)
async def get_steer(ref: str, state: StateDep):
    info, _ = await run_in_threadpool(state.resolve_steer, ref)
    return FastJSONResponse(info.to_dict())


@router.post("/steers/{ref}/apply", dependencies=[ReadScope, JSONOnly], summary="Steer vectors: Q (I + eps W)",
             response_model=SteerApplyResponse, openapi_extra=json_body(SteerApplyRequest, "apply_steer"),
             responses=error_responses(413, 415))
async def apply_steer(ref: str, request: Request, state: StateDep, settings: SettingsDep):
    body = await request.body()

    def work():
        obj = parse_json(body)
        opts = validate(SteerApplyOptions, _split(obj))
        info, steer = state.resolve_steer(ref)
        Q = vectors_from_json(obj, dim=info.dim, max_batch=settings.max_batch)
        return info, opts, apply_steer_job(Q, [(steer, opts.eps)])

    info, opts, out = await run_in_threadpool(work)
    state.metrics.batch_rows.labels("steer_apply").observe(out.shape[0])
    return await run_in_threadpool(FastJSONResponse, {"steer": info.ref, "eps": opts.eps, "vectors": out})


SteerVersion = Path(..., ge=1, le=2**31 - 1, description="Version number.")


@router.put("/steers/{name}/aliases/{alias}", dependencies=[WriteScope, JSONOnly],
            summary="Point a steer alias at a version", response_model=SteerOut, responses=error_responses(409, 415))
async def set_steer_alias(name: str, alias: str,
                          body: Annotated[AliasSet, Body(openapi_examples=examples("set_alias"))], state: StateDep):
    info = await run_in_threadpool(steer_ops.set_steer_alias, state.registry, name, alias, body.version)
    return FastJSONResponse(info.to_dict())


@router.delete("/steers/{name}/versions/{version}", dependencies=[WriteScope], response_model=SteerOut,
               summary="Delete a steer version (soft: kept for lineage, no longer resolvable)")
async def delete_steer_version(name: str, state: StateDep, version: int = SteerVersion):
    info = await run_in_threadpool(steer_ops.delete_steer_version, state.registry, name, version)
    return FastJSONResponse(info.to_dict())


@router.post("/steers/{ref}/transfer", dependencies=[WriteScope, JSONOnly], status_code=201, response_model=SteerOut,
             summary="Carry a steer through a map (H^T W H) and register it in the map's target space",
             responses=error_responses(409, 415))
async def transfer_steer(ref: str, body: Annotated[SteerTransferRequest, Body(openapi_examples=examples("transfer_steer"))],
                         state: StateDep):
    info = await run_in_threadpool(steer_ops.transfer_and_register, state.registry, ref, body.map, name=body.name,
                                   alias=body.alias, description=body.description, load_map=state.resolve_map,
                                   load_steer=state.resolve_steer)
    return FastJSONResponse(info.to_dict(), status_code=201)


@router.get("/steers/{ref}/lens", dependencies=[ReadScope], summary="Singular directions of a steer",
            response_model=SteerLens)
async def steer_lens(ref: str, state: StateDep, k: int = Query(5, ge=1, le=100),
                     n_directions: int = Query(4, ge=1, le=1024)):
    def work():
        info, steer = state.resolve_steer(ref)
        sigma = steer.svd()[1].tolist() if isinstance(steer, Steer) else [float(np.linalg.norm(steer.v))]
        dirs = [{**d, "positive": d.get("positive", [])[:k], "negative": d.get("negative", [])[:k]}
                for d in info.lens[:n_directions]]
        return {"steer": info.ref, "space": info.space, "sigma": sigma, "directions": dirs}

    return FastJSONResponse(await run_in_threadpool(work))

