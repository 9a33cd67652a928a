"""Fit jobs: ``POST /v1/fits`` queues a fit and answers at once; ``/v1/jobs/{id}`` (routers/jobs.py) follows it."""

from __future__ import annotations

from fastapi import APIRouter

from align.exceptions import InputError

from ...ops import maps as map_ops
from ...ops.embeddings import check_new_side
from ...ops.unpaired import UNPAIRED, check_unpaired
from ...spaces import check_fit_spaces
from ..codec import (
    body_dim,
    check_batch,
    may_hold_bools,
    parse_json,
    validate,
    vectors_from_json,
)
from ..job_routes import job_route
from ..schemas import FitRequest, error_responses

router = APIRouter(prefix="/v1", tags=["fits and jobs"], responses=error_responses(401, 403, 404, 422, 503))

FIT_DOC = """Queue a fit; the answer (202) carries the job id at once. Follow it with
`GET /v1/jobs/{id}` (state, progress stage/fraction, timings, and on success the registered
version), cancel it with `DELETE /v1/jobs/{id}`.

Each side (`source`, `target`) is `vectors` (JSON rows), `vectors_b64` + `dim` (base64
float32), or `texts` embedded in the job with `encoder` (default: the space's encoder).
Unknown spaces are registered from the data (dimension of the vectors or of the encoder), unless the name is a
near miss of a registered space's (`minlm` for `minilm`) whose reference recognises the rows: a 422 naming it
(register the new space first, `POST /v1/spaces`, if it is one).
`paired=true` means row i of source and target are the same item (the paired methods:
procrustes, ridge, lowrank, auto, contrastive, cluster; the default for them, as in the CLI; with
`paired=true` name one in `method`, as the CLI's --method: a 422 without, unless two or more `seed_pairs` seed
minivec2vec); otherwise the sets are unpaired (`minivec2vec`, the default `method`), optionally seeded
with `seed_pairs`.
`unpaired_source` / `unpaired_target` (`vectors`, or `vectors_b64` + `dim`) are more rows of one model beside
the pairs (the old corpus, queries): `align.fit_migration`'s unpaired rows, for auto, contrastive and cluster.
Sides given as vectors are checked against their spaces with the request, as the CLI checks them (a 422): the
sides swapped, a side of another space's model, unpaired rows of the other side's model.

Send an `Idempotency-Key` header to make retries safe: the same key and body return the
first job (200 instead of 202); the same key with another body is a 409. A full queue is a
429 with `Retry-After`.
"""


def _side(state, side, space: str, label: str, max_batch: int, bools: bool = True) -> map_ops.FitSide:
    """Parse one side of the body (``vectors``, ``vectors_b64`` + ``dim``, or ``texts`` + ``encoder``); ``bools``:
    :func:`~service.api.codec.may_hold_bools` of the body."""
    if not isinstance(side, dict):
        raise InputError(f"{label} must be an object with vectors, vectors_b64 + dim, or texts")
    unknown = set(side) - {"vectors", "vectors_b64", "dim", "texts", "encoder"}
    if unknown:
        raise InputError(f"{label}: unknown field(s) {sorted(unknown)}")
    given = sorted(k for k in ("vectors", "vectors_b64", "texts") if side.get(k) is not None)
    if "texts" in given and len(given) > 1:  # the vectors were dropped without a word
        raise InputError(f"{label}: give either texts or vectors, not both ({' and '.join(given)})")
    if side.get("texts") is not None:
        texts = side["texts"]
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise InputError(f"{label}.texts must be a non-empty list of strings")
        return map_ops.fit_side(state.registry, state.encoder, space=space, label=label, texts=texts,
                                encoder=side.get("encoder"))
    dim = body_dim(side, f"{label}.dim")  # 16.0 is 16, as in the request model
    X = vectors_from_json(side, dim=dim if side.get("vectors_b64") else None, max_batch=max_batch, name="vectors",
                          bools=bools)
    return map_ops.fit_side(state.registry, state.encoder, space=space, label=label, X=X)


def _unpaired(state, obj: dict, src, tgt, max_batch: int, bools: bool) -> dict:
    """The body's unpaired sets, read and checked against the sides' widths (a texts side: its encoder's) and for
    NaN / Inf by :func:`check_unpaired`, whose errors name the set."""
    width = [s.X.shape[1] if s.X is not None else state.encoder(s.encoder).dim for s in (src, tgt)]
    arrays = {}
    for key in UNPAIRED:
        if (side := obj.get(key)) is None:
            continue
        if not isinstance(side, dict) or set(side) - {"vectors", "vectors_b64", "dim"}:
            raise InputError(f"{key} must be an object with vectors, or vectors_b64 + dim (no other field)")
        arrays[key] = vectors_from_json(side, dim=body_dim(side, f"{key}.dim") if side.get("vectors_b64") else None,
                                        max_batch=max_batch, name="vectors", bools=bools, finite=False)
    return check_unpaired(tuple(width), {k: f"{k}.vectors" for k in UNPAIRED}, **arrays)


def _check_seed_pairs(pairs, n_src: int, n_tgt: int) -> None:
    """Seed pairs are rows of the two sides (known now): out of range is a 422, not a failed job (and an index
    past 64 bits, which numpy cannot hold, not an OverflowError in it)."""
    for i, j in pairs or ():
        if not (0 <= i < n_src and 0 <= j < n_tgt):
            raise InputError(f"seed_pairs: [{i}, {j}] is out of range (source rows {n_src}, target rows {n_tgt})")


def _method(method: str | None, paired: bool | None, seeded: bool) -> str:
    """The fit's method: as given (an empty one is an unknown method, refused later), else minivec2vec, the
    documented default. Paired rows with no method and no seed pairs are refused (the CLI requires --method):
    minivec2vec never fits from the pairs, which would only judge its map; two or more seed pairs seed it."""
    if method is None and paired and not seeded:
        raise InputError(f"\"paired\": true needs a method: one of {', '.join(map_ops.SUPERVISED)} fits from the "
                         f"pairs (minivec2vec, the default for unpaired sets, would fit without them)")
    return "minivec2vec" if method is None else method


@job_route(router, "/fits", kind="fit", summary="Queue a fit job", description=FIT_DOC, body_model=FitRequest,
           example="create_fit")
def create_fit(body: bytes, request, state, settings):
    obj = parse_json(body)
    given = [k for k in UNPAIRED if obj.get(k) is not None]  # vectors are read below, not by the model (slow)
    opts = validate(FitRequest, {**obj, "source": {}, "target": {}, **{k: {} for k in given}})
    method = _method(opts.method, opts.paired, len(opts.seed_pairs or ()) >= 2)  # minivec2vec's seeded mode
    paired = opts.paired if opts.paired is not None else method in map_ops.SUPERVISED  # as the CLI decides
    map_ops.check_fit_request(state.registry, name=opts.name, method=method, paired=paired,
                              source_space=opts.source_space, target_space=opts.target_space, alias=opts.alias,
                              params=opts.params, random_state=opts.random_state, unpaired=given)
    bools = may_hold_bools(body)
    src = _side(state, obj.get("source"), opts.source_space, "source", settings.max_batch, bools)
    tgt = _side(state, obj.get("target"), opts.target_space, "target", settings.max_batch, bools)
    map_ops.check_pairs(src, tgt, paired)
    rest = _unpaired(state, obj, src, tgt, settings.max_batch, bools)
    check_batch(max(src.rows, tgt.rows), settings.max_batch)
    _check_seed_pairs(opts.seed_pairs, src.rows, tgt.rows)
    map_ops.check_fit_rows(method, opts.params, src, tgt, seed_pairs=opts.seed_pairs,
                           random_state=opts.random_state)  # rows too few for the params: now, not a failed job
    if src.X is not None and tgt.X is not None:  # the rows are here: swapped sides, unpaired rows of the other
        # side's model and a new space misspelling a registered one are a 422 now, as the CLI refuses them, not a
        # failed job (which checks again: the registry may have changed; its unrecognised-rows warnings are notes)
        check_fit_spaces(state.registry, src.X, tgt.X, opts.source_space, opts.target_space, unpaired=rest)
    else:  # one side is texts (checked in the job, once embedded): the vector side's new space now
        for side in (src, tgt):
            check_new_side(state.registry, side, references=lambda s=side: state.space_references(s.X.shape[1]))
    state.metrics.batch_rows.labels("fit").observe(src.rows + tgt.rows)

    def job(ctx):
        notes: list[str] = []
        v = map_ops.fit_sides(state.registry, state.encoder, src, tgt, progress=ctx.progress,
                              should_cancel=ctx.should_cancel, seed_pairs=opts.seed_pairs, name=opts.name,
                              inputs={"via": "http", **{k: f"{U.shape[0]} vectors" for k, U in rest.items()}},
                              method=method, params=opts.params, paired=paired, random_state=opts.random_state,
                              alias=opts.alias, description=opts.description, notes=notes, **rest)
        return {"ref": v.ref, "version": v.to_dict(), "notes": notes}

    return job, f"fit {opts.name} ({method})"
