"""LM-Steer on a causal language model over HTTP (``/v1/lm``): steer fit jobs, steered generation,
per-token evidence. The work is :mod:`service.ops.lm` (shared with ``vecbridge lm``).

The language model is a lazily loaded resource of the app: the first LM request (a fit: its job) calls the
provider ``app.state.lm_provider`` (default :func:`service.lm.model.load_lm`, SmolLM2 from its
wheel) and keeps the :class:`~service.ops.lm.LM` in ``app.state.lm``. Tests inject a tiny model by
setting ``app.state.lm_provider`` to a callable returning ``(model, tokenizer)``. Without torch /
transformers or the wheel every LM route answers 503.

LM steers are ``align.Steer`` objects of the model's hidden size ``d``, registered in the
registry's steer tables in the space ``lm.<model name>`` (``:`` is not allowed in space names).
One lock per LM serialises every use of the model: steering works through a forward hook on
the shared model, so two requests must not interleave.

Generate and analyze take their turn at the app's model :class:`~service.api.gate.Gate` first: one runs (in a
worker thread, where it may still wait for a fit's forward pass) while the others wait on the event loop,
holding no thread; beyond ``limits.lm_max_waiting`` waiting requests the answer is 429. A request whose
client goes away while it waits leaves the queue at once (499): it neither runs the model for nobody nor keeps
a place from a live client. Before, each waiting request held one of the shared worker threads, and a few
dozen of them behind a long fit left none for ``/readyz``, ``/v1/jobs`` or any other route.
Before their turn, and so before the first one loads the model, each is checked for all that needs no model
(its body, steer refs, eps, temperature, max_new_tokens; no LM to load): a bad request is refused at once, not
after the load (47 s on a cold server) or a fit's forward pass. With the model loaded, so are its token counts
(an empty prompt, one over ``limits.lm_max_tokens`` or the context, an analyze text of one token): the model's
check tokenizer counts them, not waiting behind a running generation. Before the load they wait for it.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from align.exceptions import InputError

from ...errors import PayloadTooLargeError
from ...limits import MAX_NEW_TOKENS
from ...ops import lm as ops
from ...ops.lm import LM, lm_space
from ..body_models import StrictRequestModel as _Strict
from ..codec import check_batch, parse_json, validate
from ..deps import JSONOnly, ReadScope, StateDep
from ..gate import Gate
from ..job_routes import job_route
from ..name_types import AliasName, Name
from ..openapi import json_body
from ..responses import FastJSONResponse
from ..schemas import Count, Real, Seed, error_responses

__all__ = [
    "MAX_NEW_TOKENS",
    "LMAnalyzeRequest",
    "LMFitRequest",
    "LMGenerateRequest",
    "get_lm",
    "lm_space",
    "router",
]

router = APIRouter(prefix="/v1/lm", tags=["lm"], responses=error_responses(401, 403, 404, 422, 503))


# --- schemas ------------------------------------------------------------------------------------
class LMFitRequest(_Strict):
    name: Name = Field(..., description="Steer name; the fit registers its next version in space `lm.<model>`.")
    texts: list[str] = Field(..., min_length=2, description="Training texts.")
    labels: list[Count] = Field(..., description="One per text: +1 wanted style, -1 opposite, 0 ignored.")
    rank: Count = Field(8, ge=1, le=ops.MAX_FIT_RANK, description="Rank r of W = P1 P2^T.")
    eps: Real = Field(1e-3, gt=0, le=ops.MAX_FIT_EPS, allow_inf_nan=False,
                      description="Training scale eps0 (folded into P1).")
    steps: Count = Field(200, ge=1, le=ops.MAX_FIT_STEPS, description="Adam steps.")
    lr: Real = Field(1e-2, gt=0, le=ops.MAX_FIT_LR, allow_inf_nan=False, description="Adam learning rate.")
    random_state: Count = Seed
    alias: AliasName | None = None
    description: str = ""


class LMGenerateRequest(_Strict):
    prompt: str = Field(..., min_length=1)
    steers: dict[str, Real] = Field(default_factory=dict, description=f"`{{steer ref: eps}}`, composed by summation "
                                                                     f"(|eps| at most {ops.MAX_LM_EPS:g}; refs to one "
                                                                     f"version count as one steer at their summed eps, "
                                                                     f"bounded alike).")
    max_new_tokens: Count = Field(30, ge=1, le=MAX_NEW_TOKENS)
    temperature: Real = Field(1.0, ge=0, le=10, allow_inf_nan=False,
                               description="Sampling temperature (default 1.0 with nucleus `top_p`: sampling is "
                                           "the documented default for steered text, greedy decoding repeats); "
                                           "0: greedy; sampling needs at least 0.01.")
    top_p: Real = Field(0.9, gt=0, le=1)
    random_state: Count = Seed


class LMGenerateResponse(BaseModel):
    model: str
    text: str = Field(..., description="The continuation only (the prompt is not repeated).")
    steers: list[dict] = Field(..., description="Steers used: name, version, eps.")


class LMAnalyzeRequest(_Strict):
    text: str = Field(..., min_length=1)
    steer: str = Field(..., description="Steer ref: name, name@alias or name:N.")
    eps: Real = Field(1.0, gt=0, le=ops.MAX_LM_EPS, allow_inf_nan=False,
                      description="Evidence compares +eps with -eps (1: the trained strength).")
    threshold: Real = Field(0.5, ge=0, allow_inf_nan=False, description="Minimum |score| of a span token.")


class TokenScore(BaseModel):
    token: str
    score: float = Field(..., description="log p_{+eps}(x_t | x_<t) - log p_{-eps}(x_t | x_<t).")


class LMAnalyzeResponse(BaseModel):
    model: str
    steer: str
    eps: float
    tokens: list[TokenScore] = Field(..., description="One per token after the first.")
    spans: list[dict] = Field(..., description="Runs of same-sign tokens with |score| >= threshold.")


# --- the model ---------------------------------------------------------------------------------
def get_lm(request: Request) -> LM:
    """The app's LM (``app.state.lm``), loaded on first use by ``app.state.lm_provider``; 503 when unavailable."""
    app_state = request.app.state
    return ops.get_lm(app_state, getattr(app_state, "lm_provider", None))


# --- routes -------------------------------------------------------------------------------------
FIT_DOC = """Queue an LM-Steer fit on the service's language model (body frozen): `texts` with `labels`
(+1 / -1 / 0). The answer (202) carries the job id; on success the job's `result` holds `ref` and the
registered `steer` (space `lm.<model>`, lens = vocabulary words at the ends of W's singular directions).
The first fit on a fresh server answers at once too: its job loads the model (stage `loading model`), and the
checks that need the model (`rank` above its hidden size, texts of one token) fail that job instead of a 422;
a `name` of a steer in an embedding space (409), or of one whose LM space is narrower than `rank` (422), is
refused with the request.
"""


@job_route(router, "/steers", kind="lm-steer-fit", summary="Queue an LM steer fit job", description=FIT_DOC,
           body_model=LMFitRequest, example="lm_fit")
def create_lm_steer(body: bytes, request, state, settings):
    opts = validate(LMFitRequest, parse_json(body))
    spec = ops.check_fit(ops.LMFit(**opts.model_dump(), inputs={"via": "http", "n_texts": len(opts.texts)}))
    check_batch(len(opts.texts), settings.max_batch)
    if len(opts.texts) > settings.limits.lm_max_fit_texts:
        raise PayloadTooLargeError(f"{len(opts.texts)} texts exceed the limit of {settings.limits.lm_max_fit_texts} "
                                   f"per LM steer fit (limits.lm_max_fit_texts)")
    app_state = request.app.state
    provider = getattr(app_state, "lm_provider", None)
    loaded = _loaded_or_available(request)  # no LM here at all: a 503 now, without loading one
    if loaded is not None:  # the checks that need the model (rank, one-token sides, the steer's space): now
        spec = ops.prepare_fit(state.registry, loaded, spec)
    else:  # those that need the registry only (a steer name in an embedding space, a rank above its LM space's)
        spec = ops.check_fit_steer(state.registry, spec)

    def job(ctx):
        lm = loaded
        if lm is None:  # the first fit loads the model in its job (~70 s for SmolLM2), not before its 202
            ctx.progress("loading model", 0.0)
            lm = ops.get_lm(app_state, provider)
            ctx.progress("loading model", 1.0)
            ops.prepare_fit(state.registry, lm, spec)
        v = ops.run_fit(state.registry, lm, spec, progress=ctx.progress)
        return {"ref": v.ref, "steer": v.to_dict()}

    return job, f"LM steer fit {spec.name}"


def _gate(app, max_waiting: int) -> Gate:
    """The app's queue of model requests: one runs, ``max_waiting`` wait (``limits.lm_max_waiting``)."""
    gate = getattr(app.state, "lm_gate", None)
    if gate is None:  # on the event loop: no other task runs between the check and the set
        gate = app.state.lm_gate = Gate(1, max_waiting, waiting_gauge=app.state.metrics.lm_waiting,
                                        running_gauge=app.state.metrics.lm_running,
                                        busy="the language model is busy and {waiting} requests are waiting for "
                                             "it (limits.lm_max_waiting); retry later")
    return gate


def _model_route(path: str, *, summary: str, body_model, response_model, example: str, check):
    """``POST /v1/lm{path}`` (read scope, JSON body of ``body_model``) answering ``fn(opts, request, state)``,
    run off the event loop (the model is slow and holds its lock) once the app's model :class:`~service.api.gate.Gate`
    gives it its turn. ``check(opts, request, state)`` runs first, before the turn and without the model: what a
    request can be refused for without it is refused at once, not after waiting for a fit's forward pass or the
    first request's load of the model (47 s on a cold server). What it returns (the LM that counted the request's
    tokens, or None) is ``fn``'s ``checked``: ``fn(opts, request, state, checked)``."""
    def register(fn):
        async def endpoint(request: Request, state: StateDep):
            body = await request.body()
            opts, checked = await run_in_threadpool(_checked, body_model, check, body, request, state)
            async with _gate(request.app, state.settings.limits.lm_max_waiting).turn(request):
                return FastJSONResponse(await run_in_threadpool(fn, opts, request, state, checked))

        endpoint.__name__ = endpoint.__qualname__ = fn.__name__  # the OpenAPI operationId
        router.post(path, dependencies=[ReadScope, JSONOnly], summary=summary, response_model=response_model,
                    openapi_extra=json_body(body_model, example),
                    responses=error_responses(413, 415, 429))(endpoint)
        return fn

    return register


def _checked(body_model, check, body: bytes, request: Request, state):
    """``(opts, checked)``: the request's body validated as ``body_model``, then ``check``-ed (:func:`_model_route`)."""
    opts = validate(body_model, parse_json(body))
    return opts, check(opts, request, state)


def _loaded_or_available(request: Request) -> LM | None:
    """The app's LM when loaded (its name in messages), else None after a 503 now when there is none to load (the
    default model's runtime or file missing: :func:`~service.ops.lm.check_lm_available`, without loading)."""
    app_state = request.app.state
    ops.check_lm_available(app_state, getattr(app_state, "lm_provider", None))
    return getattr(app_state, "lm", None)


def _new_tokens(opts: LMGenerateRequest, limits) -> int:
    """The tokens to generate: as asked, at most ``limits.lm_max_new_tokens`` (InputError beyond); by default the
    default or the limit, whichever is fewer."""
    if "max_new_tokens" not in opts.model_fields_set:
        return min(opts.max_new_tokens, limits.lm_max_new_tokens)  # a default never exceeds the operator's limit
    if opts.max_new_tokens > limits.lm_max_new_tokens:
        raise InputError(f"max_new_tokens={opts.max_new_tokens} exceeds the limit of {limits.lm_max_new_tokens} "
                         f"(limits.lm_max_new_tokens)")
    return opts.max_new_tokens


def _check_generate(opts: LMGenerateRequest, request: Request, state) -> LM | None:
    """What a generate request is refused for without the model: max_new_tokens beyond the operator's limit, a
    sampling temperature too small, a steer ref that does not resolve or is an embedding space's, an eps out of
    range (each, and the summed eps of refs to one version); then no LM to load (503). The prompt's tokens are
    counted too when the model is loaded (:func:`~service.ops.lm.check_length_now`: the LM returned), else after
    the load."""
    limits = state.settings.limits
    new_tokens = _new_tokens(opts, limits)
    ops.check_sampling(opts.temperature)
    lm = getattr(request.app.state, "lm", None)
    ops.check_steers(state.registry, list(opts.steers), state.resolve_steer, list(opts.steers.values()), lm)
    lm = _loaded_or_available(request)
    return ops.check_length_now(lm, opts.prompt, "prompt", limits.lm_max_tokens, new_tokens)


def _check_analyze(opts: LMAnalyzeRequest, request: Request, state) -> LM | None:
    """What an analyze request is refused for without the model: its steer ref not resolving or an embedding
    space's (eps is bounded by the request model); then no LM to load (503). The text's tokens (at least two, at
    most ``limits.lm_max_tokens``) are counted too when the model is loaded (the LM returned), else after the load."""
    ops.check_steers(state.registry, [opts.steer], state.resolve_steer, lm=getattr(request.app.state, "lm", None))
    lm = _loaded_or_available(request)
    return ops.check_length_now(lm, opts.text, "text", state.settings.limits.lm_max_tokens, min_tokens=2)


@_model_route("/generate", summary="Continue a prompt under steers", body_model=LMGenerateRequest,
              response_model=LMGenerateResponse, example="lm_generate", check=_check_generate)
def lm_generate(opts: LMGenerateRequest, request: Request, state, checked: LM | None) -> dict:
    limits = state.settings.limits
    # the model loaded (by the first request) only once the steers resolved again: one deleted meanwhile is a 404
    return ops.generate(state.registry, lambda: get_lm(request), opts.prompt, opts.steers,
                        max_new_tokens=_new_tokens(opts, limits), temperature=opts.temperature, top_p=opts.top_p,
                        random_state=opts.random_state, load_steer=state.resolve_steer,
                        max_tokens=limits.lm_max_tokens, checked=checked)


@_model_route("/analyze", summary="Per-token evidence of a steer in a text", body_model=LMAnalyzeRequest,
              response_model=LMAnalyzeResponse, example="lm_analyze", check=_check_analyze)
def lm_analyze(opts: LMAnalyzeRequest, request: Request, state, checked: LM | None) -> dict:
    return ops.analyze(state.registry, lambda: get_lm(request), opts.text, opts.steer, eps=opts.eps,
                       threshold=opts.threshold, load_steer=state.resolve_steer,
                       max_tokens=state.settings.limits.lm_max_tokens, checked=checked)
