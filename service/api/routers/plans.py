"""``POST /v1/plans``: a migration plan before the fit (alignability, expected retention vs K, rows to re-embed)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from ...ops.plans import plan
from ..codec import parse_json, validate, vectors_from_json
from ..deps import JSONOnly, ReadScope, SettingsDep
from ..openapi import json_body
from ..responses import FastJSONResponse
from ..schemas import PlanRequest, error_responses

router = APIRouter(prefix="/v1", tags=["migration"], responses=error_responses(401, 403, 413, 415, 422, 503))

PLAN_DOC = """Plan a migration from the old corpus (`old`) and a small paired probe (`probe_source`,
`probe_target`: the same texts under the old and the new model, 50+ pairs, 200–1,000 recommended).

Answers: `alignability` (kNN@10 overlap of the two spaces on the probe; unsupervised alignment has
only worked above ~0.4), `curve` (simulated retention of closed-form fits on probe subsamples),
`predicted` (retention per K with an interval; `extrapolated` beyond the probe), `recommended`
(method and K), `rows_to_embed` (k-means++ coverage rows of `old` for that K). Synchronous: seconds
for a probe of 1,000 pairs and an old corpus of 40,000 rows. Each side is `vectors` or
`vectors_b64` + `dim`.
"""


@router.post("/plans", dependencies=[ReadScope, JSONOnly], summary="Plan a migration", description=PLAN_DOC,
             openapi_extra=json_body(PlanRequest, "create_plan"))
async def create_plan(request: Request, settings: SettingsDep):
    body = await request.body()

    def work():
        raw = parse_json(body)
        opts = validate(PlanRequest, raw)
        old, a, b = (vectors_from_json(raw[k], dim=raw[k].get("dim"), max_batch=settings.max_batch)
                     for k in ("old", "probe_source", "probe_target"))
        return plan(old, a, b, random_state=opts.random_state, target_retention=opts.target_retention)

    return FastJSONResponse(await run_in_threadpool(work))
