"""OpenAI-shaped ``POST /v1/embeddings`` (plus ``target_space`` and ``map``) and ``GET /v1/models`` (``/{id}``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Request
from starlette.concurrency import run_in_threadpool

from align.exceptions import InputError

from ...errors import NotFoundError
from ...ops import embeddings as embed_ops
from ...registry.names import MAX_NAME
from ..codec import b64_encode, check_batch
from ..deps import JSONOnly, ReadScope, SettingsDep, StateDep
from ..openapi import examples
from ..responses import FastJSONResponse
from ..routing import CodecRoute
from ..schemas import EmbeddingsRequest, EmbeddingsResponse, ModelList, error_responses

router = APIRouter(prefix="/v1", tags=["embeddings"], responses=error_responses(401, 403, 422, 503),
                   route_class=CodecRoute)

EMB_DOC = """OpenAI-compatible embeddings with the installed encoders (`GET /v1/models`).

`encoding_format`: `float` (JSON numbers) or `base64` (little-endian float32, as OpenAI's
clients expect). `dimensions` is accepted only when it equals the model's dimension: these
models cannot be truncated without losing their geometry, so any other value is a 422.

Extensions: `target_space` returns the vectors translated into another registered space
through the registry's maps (the embedding model's space must be registered; its raw form,
comparable with raw vectors of that space), and `maps` in the answer names the versions used;
`map` (with `target_space`) pins them: one map (`name`, `name@alias`, `name:N`) or a path of them
in order, e.g. the earlier answer's `maps` as `name:version`, so every batch of a large text set
goes through the same versions whatever aliases move meanwhile (a path that does not lead from
the model's space to `target_space` is a 422); `input_type` = `passage` (default) or `query`.
`usage.prompt_tokens` (and `total_tokens`) counts the tokens the model read, word pieces and
specials included, as text-embeddings-inference counts them: a text cut at the model's limit
counts that many (MiniLM 256, mpnet 384); e5 reads all of a text, its `passage: ` / `query: `
prefix included.

A text longer than the model reads (`max_tokens` of `GET /v1/models`: MiniLM 256, mpnet 384
word pieces, specials included; e5 reads any length, in windows) is embedded from its start, the
rest unread, and counted in `usage.truncated`. With `truncate: false` (text-embeddings-inference's
flag) such a text is refused instead: a 422 naming the first (`input[i]`, its tokens, the limit;
`details[0].ctx` has them as numbers; a text over 50,000 characters is counted only as far as it
passes the limit: "at least" that many, `ctx.exact` false), nothing embedded. A long text is
tokenized for this count only as far as decides it. A 422, not TEI's 413: here 413 means a
body or batch over the service's limits, which the Python client answers by sending smaller
batches; a text too long is not fixed by that.
"""


def _list_models() -> list[dict]:
    try:
        from ...encoders import list_encoders
    except ImportError:
        return []
    out = []
    for e in list_encoders():
        if isinstance(e, str):
            out.append({"id": e, "object": "model", "owned_by": "vecbridge"})
        elif isinstance(e, dict):
            out.append({"id": e.get("name"), "object": "model", "owned_by": "vecbridge",
                        **{k: v for k, v in e.items() if k != "name"}})
        else:
            out.append({"id": getattr(e, "name", str(e)), "object": "model", "owned_by": "vecbridge",
                        "dim": getattr(e, "dim", None)})
    return out


@router.get("/models", dependencies=[ReadScope], summary="Installed encoders (OpenAI-shaped)",
            response_model=ModelList)
async def list_models():
    return FastJSONResponse({"object": "list", "data": await run_in_threadpool(_list_models)})


@router.get("/models/{model_id:path}", dependencies=[ReadScope], summary="One installed encoder (OpenAI-shaped)",
            response_model=dict[str, Any], responses=error_responses(404))
async def get_model(model_id: str):
    """The ``GET /v1/models`` entry of ``model_id`` (a name or a short alias such as ``minilm``, as
    ``POST /v1/embeddings`` takes); an unknown one is a 404 naming the known ones. OpenAI's clients call this route
    (``client.models.retrieve``) and got the router's bare 404."""
    from ...encoders import canonical_name

    if len(model_id) > MAX_NAME:  # the 404 below quotes the id: not a megabyte of it
        raise InputError(f"model id is longer than {MAX_NAME} characters")
    key = canonical_name(model_id)  # UnknownEncoderError: a 404 naming the known encoders
    entry = next((m for m in await run_in_threadpool(_list_models) if m["id"] == key), None)
    if entry is None:
        raise NotFoundError(f"no encoder {model_id!r}")
    return FastJSONResponse(entry)


@router.post("/embeddings", dependencies=[ReadScope, JSONOnly], summary="Create embeddings (OpenAI-shaped)",
             description=EMB_DOC, response_model=EmbeddingsResponse, responses=error_responses(404, 413, 415, 429))
async def embeddings(body: Annotated[EmbeddingsRequest, Body(openapi_examples=examples("embeddings"))], state: StateDep,
                     settings: SettingsDep, request: Request):
    texts = [body.input] if isinstance(body.input, str) else list(body.input)
    if not texts:
        raise InputError("input must be a non-empty string or list of strings")
    from ...encoders import check_texts

    check_texts(texts, "input", one=isinstance(body.input, str))  # before any model loads: " " embedded as the empty text, one vector for all
    check_batch(len(texts), settings.max_batch)

    X, tr, cut, tokens = await state.heavy.run(lambda: embed_ops.embed(state, body.model, texts, kind=body.input_type,
                                                                target_space=body.target_space,
                                                                dimensions=body.dimensions, map_ref=body.map,
                                                                truncate=body.truncate,
                                                                one=isinstance(body.input, str)),
                                       request)
    state.metrics.batch_rows.labels("embeddings").observe(len(texts))
    if tr is not None:
        for v in tr.versions:
            state.metrics.observe_map(v.name, len(texts))
    data = [{"object": "embedding", "index": i,
             "embedding": b64_encode(X[i : i + 1]) if body.encoding_format == "base64" else X[i]}
            for i in range(X.shape[0])]
    out = {"object": "list", "data": data, "model": body.model,
           "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "truncated": cut}}
    if tr is not None:
        out["target_space"] = body.target_space
        out["maps"] = tr.describe()
    return FastJSONResponse(out)
