"""Fit jobs: ``POST /v1/fits`` queues a fit and answers at once; ``/v1/jobs/{id}`` follows it."""

from __future__ import annotations

import hashlib

import numpy as np
from fastapi import APIRouter, Header, Request
from starlette.concurrency import run_in_threadpool

from align.validation import as_matrix
from align.exceptions import DimensionMismatchError, InputError

from ...registry import ConflictError, NotFoundError
from ...registry.names import check_alias, check_name
from ..codec import check_batch, parse_json, validate, vectors_from_json
from ..deps import JSONOnly, ReadScope, SettingsDep, StateDep, WriteScope
from ..openapi import json_body
from ..pagination import Page, paginate
from ..responses import FastJSONResponse
from ..schemas import FitRequest, JobList, JobOut, error_responses
from ..state import AppState

router = APIRouter(prefix="/v1", tags=["fits and jobs"], responses=error_responses(401, 403, 404, 422, 503))

FIT_DOC = """Queue a fit; the answer (202) carries the job id at once. Follow it with
`GET /v1/jobs/{id}` (state, progress stage/fraction, timings, and on success the registered
version), cancel it with `DELETE /v1/jobs/{id}`.

Each side (`source`, `target`) is `vectors` (JSON rows), `vectors_b64` + `dim` (base64
float32), or `texts` embedded in the job with `encoder` (default: the space's encoder).
Unknown spaces are registered from the data (dimension of the vectors or of the encoder).
`paired=true` means row i of source and target are the same item (supervised methods:
procrustes, ridge, lowrank); otherwise the sets are unpaired (`minivec2vec`), optionally
seeded with `seed_pairs`.

Send an `Idempotency-Key` header to make retries safe: the same key and body return the
first job (200 instead of 202); the same key with another body is a 409. A full queue is a
429 with `Retry-After`.
"""


def _side(state: AppState, side: dict, space: str, label: str, max_batch: int) -> dict:
    if not isinstance(side, dict):
        raise InputError(f"{label} must be an object with vectors, vectors_b64 + dim, or texts")
    unknown = set(side) - {"vectors", "vectors_b64", "dim", "texts", "encoder"}
    if unknown:
        raise InputError(f"{label}: unknown field(s) {sorted(unknown)}")
    try:
        info = state.registry.get_space(space)
    except NotFoundError:
        info = None
    if side.get("texts") is not None:
        texts = side["texts"]
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise InputError(f"{label}.texts must be a non-empty list of strings")
        encoder = side.get("encoder") or (info.encoder if info else None)
        if not encoder:
            raise InputError(f"{label}: give an `encoder` for the texts (space {space!r} has none registered)")
        state.encoder(encoder)  # 404 now for an unknown encoder, rather than a failed job later
        return {"texts": texts, "encoder": encoder, "info": info}
    X = vectors_from_json(side, dim=side.get("dim") if side.get("vectors_b64") else None, max_batch=max_batch,
                          name="vectors")
    if info is not None and X.shape[1] != info.dim:
        raise DimensionMismatchError(f"{label}: space {space!r} is {info.dim}-d, the vectors have {X.shape[1]} columns")
    return {"X": X, "info": info}


def _check_names(state: AppState, opts: FitRequest) -> None:
    """Refuse at request time what the registry would refuse inside the job (422 / 409, not a failed job).

    Names and alias go through the registry's own validators; a map name already bound to other
    spaces is the ConflictError ``register_version`` would raise.
    """
    check_name(opts.name, "map name")
    check_name(opts.source_space, "source space")
    check_name(opts.target_space, "target space")
    if opts.alias is not None:
        check_alias(opts.alias)
    try:
        v = state.registry.get_version(opts.name, 1)  # one row; every version of a map shares its spaces
    except NotFoundError:
        try:  # an unknown map, or one whose numbering does not start at 1 (imported)
            vs = state.registry.list_versions(opts.name, True)
        except NotFoundError:
            return
        if not vs:
            return
        v = vs[0]
    if (v.source_space, v.target_space) != (opts.source_space, opts.target_space):
        raise ConflictError(f"map {opts.name!r} connects {v.source_space} -> {v.target_space}, not "
                            f"{opts.source_space} -> {opts.target_space}; choose another map name")


def _materialise(state: AppState, ctx, side: dict, space: str, label: str) -> np.ndarray:
    if "X" in side:
        X = side["X"]
    else:
        enc = state.encoder(side["encoder"])
        texts = side["texts"]
        parts, step = [], 256
        for s in range(0, len(texts), step):
            ctx.progress(f"encode {label}", s / len(texts))
            parts.append(np.asarray(enc.encode(texts[s : s + step], kind="passage"), dtype=np.float32))
        X = as_matrix(np.vstack(parts), name=f"{label} embeddings")
    if side["info"] is None:
        try:
            state.registry.get_space(space)
        except NotFoundError:
            state.registry.register_space(space, int(X.shape[1]), encoder=side.get("encoder"))
    return X


def _what(side: dict) -> str:
    return f"{len(side['texts'])} texts via {side['encoder']}" if "texts" in side else f"{side['X'].shape[0]} vectors"


@router.post("/fits", dependencies=[WriteScope, JSONOnly], status_code=202, summary="Queue a fit job",
             description=FIT_DOC, response_model=JobOut,
             responses={200: {"model": JobOut, "description": "Idempotent replay: the job this key first created."},
                        **error_responses(409, 413, 415, 429)},
             openapi_extra=json_body(FitRequest, "create_fit"))
async def create_fit(request: Request, state: StateDep, settings: SettingsDep,
                     idempotency_key: str | None = Header(None, alias="Idempotency-Key", max_length=200)):
    body = await request.body()

    def prepare():
        obj = parse_json(body)
        sides = {k: obj.get(k) for k in ("source", "target")}
        opts = validate(FitRequest, {**obj, "source": {}, "target": {}})
        _check_names(state, opts)
        from ...fitting import METHODS, SUPERVISED

        if opts.method not in METHODS:
            raise InputError(f"unknown method {opts.method!r}; choose from {', '.join(METHODS)}")
        if opts.method in SUPERVISED and not opts.paired:
            raise InputError(f"method {opts.method!r} needs paired rows (\"paired\": true); "
                             f"use minivec2vec for unpaired sets")
        src = _side(state, sides["source"], opts.source_space, "source", settings.max_batch)
        tgt = _side(state, sides["target"], opts.target_space, "target", settings.max_batch)
        if opts.paired and "X" in src and "X" in tgt and src["X"].shape[0] != tgt["X"].shape[0]:
            from align.exceptions import PairCountError

            raise PairCountError(f"paired fit: source has {src['X'].shape[0]} rows, target {tgt['X'].shape[0]}")
        if opts.paired and "texts" in src and "texts" in tgt and len(src["texts"]) != len(tgt["texts"]):
            from align.exceptions import PairCountError

            raise PairCountError(f"paired fit: {len(src['texts'])} source texts, {len(tgt['texts'])} target texts")
        return opts, src, tgt

    opts, src, tgt = await run_in_threadpool(prepare)
    n_rows = sum(s["X"].shape[0] if "X" in s else len(s["texts"]) for s in (src, tgt))
    check_batch(max(s["X"].shape[0] if "X" in s else len(s["texts"]) for s in (src, tgt)), settings.max_batch)
    state.metrics.batch_rows.labels("fit").observe(n_rows)

    def job(ctx):
        from ...fitting import run_fit

        Xs = _materialise(state, ctx, src, opts.source_space, "source")
        Xt = _materialise(state, ctx, tgt, opts.target_space, "target")
        seed = None
        if opts.seed_pairs:
            pairs = np.asarray(opts.seed_pairs, dtype=np.int64).reshape(-1, 2)
            seed = (pairs[:, 0], pairs[:, 1])  # (source rows, target rows), as align.MiniVec2Vec takes them
        v = run_fit(state.registry, name=opts.name, source=Xs, target=Xt, method=opts.method, params=opts.params,
                    source_space=opts.source_space, target_space=opts.target_space, paired=opts.paired,
                    seed_pairs=seed, random_state=opts.random_state, alias=opts.alias, progress=ctx.progress,
                    report_dir=state.registry.report_dir, should_cancel=ctx.should_cancel,
                    description=opts.description, inputs={"via": "http", "source": _what(src), "target": _what(tgt)})
        return {"ref": v.ref, "version": v.to_dict()}

    digest = hashlib.sha256(body).hexdigest()
    job_, created = state.jobs.submit(job, kind="fit", description=f"fit {opts.name} ({opts.method})",
                                      idempotency_key=idempotency_key, request_hash=digest)
    return FastJSONResponse(job_.to_dict(), status_code=202 if created else 200,
                            headers={"Location": f"/v1/jobs/{job_.id}"})


@router.get("/jobs", dependencies=[ReadScope], summary="List jobs (every process of this data dir)",
            response_model=JobList)
async def list_jobs(state: StateDep, page: Page):
    jobs = [j.to_dict() for j in await run_in_threadpool(state.jobs.list)]
    counts = await run_in_threadpool(state.jobs.counts)
    return FastJSONResponse({**paginate(jobs, lambda d: (d["timings"]["created_at"], d["id"]), page),
                             "counts": counts})


@router.get("/jobs/{job_id}", dependencies=[ReadScope], summary="Job state, progress, timings, result",
            response_model=JobOut)
async def get_job(job_id: str, state: StateDep):
    return FastJSONResponse(state.jobs.get(job_id).to_dict())


@router.delete("/jobs/{job_id}", dependencies=[WriteScope], status_code=202, summary="Cancel a job",
               response_model=JobOut)
async def cancel_job(job_id: str, state: StateDep):
    return FastJSONResponse(state.jobs.cancel(job_id).to_dict(), status_code=202)
