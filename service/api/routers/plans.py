"""``POST /v1/plans``: a migration plan before the fit (alignability, expected retention vs K, rows to re-embed);
``POST /v1/maps/{ref}/evaluate``: a fitted map on held-out pairs and labelled queries, with PASS/FAIL gates."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ...ops.plans import EVAL_MAX_QUERIES, evaluate_map, plan
from ..codec import body_dim, may_hold_bools, parse_json, validate, vectors_from_json
from ..deps import JSONOnly, ReadScope, SettingsDep, StateDep
from ..name_types import RefPath
from ..openapi import json_body
from ..plan_schemas import EvaluateResponse, PlanResponse
from ..responses import FastJSONResponse
from ..schemas import EvaluateRequest, PlanRequest, error_responses

router = APIRouter(prefix="/v1", tags=["migration"], responses=error_responses(401, 403, 413, 415, 422, 503))

def _vectors(raw: dict, key: str, settings, bools: bool = True):
    """The vector set ``raw[key]`` (``vectors`` or ``vectors_b64`` + ``dim``) as float32 rows; None when absent
    (the request model has already said which sets are required). ``bools``: :func:`~.codec.may_hold_bools` of the
    body."""
    obj = raw.get(key)
    return None if obj is None else vectors_from_json(obj, dim=body_dim(obj, f"{key}.dim"),
                                                      max_batch=settings.max_batch, bools=bools)


PLAN_DOC = """Plan a migration from the old corpus (`old`) and a small paired probe (`probe_source`,
`probe_target`: the same texts under the old and the new model, 50+ pairs, 200–1,000 recommended).

Answers: `alignability` (kNN@10 overlap of the two spaces on the probe beyond the k / (p - 1) of chance, so
probes of any size compare; unsupervised alignment has only worked above 0.4; `knn_overlap`: the raw
overlap), `curve` (simulated retention of closed-form fits on probe subsamples, with up to 8,192 mapped rows of
`old` as distractors: not the `nn_retention@10` of an evaluation, which has none; above 1 where the mapped
distractors outrank native rows, and a note says so),
`predicted` (retention per K with an interval and the `method` it is of: within the probe's K the better
of the methods' curves there, beyond it the best at the probe's largest K; `extrapolated` beyond the probe; the K
of at least the size of `old` are one row at that size, retention 1, `whole_corpus`; `kept`: the same for a
migration that keeps its K re-embedded rows' own vectors, `share + (1 - share) x retention` with `share` = K / the
size of `old`),
`recommended` (`method` and K, at most the size of `old`: the smallest K whose `retention` reaches
`target_retention`, or with `keep` its `kept` forecast, for a migration that keeps the rows it re-embedded, never a
larger K; `forecast` says which it read; `whole_corpus`: no smaller K is predicted to do, re-embed it all,
and when no K that migrates reaches the target `migration_reaches_target` is false and `best_migrating` holds
the best K with its forecast, the notes setting re-embedding it all, migrating at that K and keeping the old
model side by side;
`forecast_method`: the method the forecast is of, a closed-form one, where from K = 1,000 `method` is `auto`, which
may fit a contrastive or cluster map: a note says the interval is then a floor for what `auto` fits, which
usually measures above it, not a prediction of it), `rows_to_embed` (k-means++ coverage rows of `old` for that K;
with `k`, for that many rows instead, and `rows_k` says so; every row of `old`, the whole corpus's K or `k` = its size,
is not listed: `rows_to_embed` empty, `rows_to_embed_all` true). With `whole_corpus`, `recommended.k` is the size of
`old` and nothing is fitted (`method` is the best migrating K's).
With labelled `queries` (new model), `old_queries` (the same queries, old model) and each one's `relevant` probe
row, the curve and the prediction are of their labelled R@10 retention over the whole `old` corpus (`metric` says
which), with `native` (their R@10: the new model's over the probe and estimated over the corpus, the old model's
measured over the corpus, i.e. what keeping it gives) and `r10` per K (the migrated index's predicted R@10); a note
says when keeping the old model is predicted to do as well. When their measured retention exceeds 1 (the native
estimate is too low, or the map beats the new model) the plan is the one without them, with their `labelled` curve
and `native` R@10 and a note why.
`probe_unpaired_share` estimates the share of probe pairs that are not one text (from 200 pairs; a probe partly out
of step passes the check below, and from 0.2 a note says its forecast is of the damaged probe).
Refused (422) rather than planned: a probe whose pairs look unpaired (its kNN@10 overlap at chance, e.g. one side's
rows shuffled), one too small for its learning curve to find anything (under one held-out hit per fit; the message
says how many pairs would do), and labelled queries none of which finds its `relevant` probe row with one of the
models (check `relevant` and the queries' order).
Synchronous (at most `max_heavy_requests` plans and evaluations at once; more: 429 with Retry-After):
seconds for a probe of 1,000 pairs and an old corpus of 40,000 rows (~40 s with labelled
queries, which map and search the whole corpus per curve point). Each side is `vectors` or
`vectors_b64` + `dim`.
"""


@router.post("/plans", dependencies=[ReadScope, JSONOnly], summary="Plan a migration", description=PLAN_DOC,
             openapi_extra=json_body(PlanRequest, "create_plan"), response_model=PlanResponse,
             responses=error_responses(429))
async def create_plan(request: Request, state: StateDep, settings: SettingsDep):
    body = await request.body()

    def work():
        raw = parse_json(body)
        opts = validate(PlanRequest, raw)
        bools = may_hold_bools(body)
        old, a, b, q, qo = (_vectors(raw, k, settings, bools) for k in ("old", "probe_source", "probe_target",
                                                                        "queries", "old_queries"))
        return plan(old, a, b, random_state=opts.random_state, target_retention=opts.target_retention, queries=q,
                    old_queries=qo, relevant=opts.relevant, k=opts.k, keep=opts.keep)

    async with state.heavy.slot("plan"):
        return FastJSONResponse(await state.heavy.run(work, request))


EVALUATE_DOC = f"""Evaluate the map `ref` (name, name@alias or name:version) on held-out documents embedded by
both models (`source`, `target`: row i is the same text) — what `vecbridge eval` prints with `--json`:
top-1, mean rank, cosine (`cos`: in the target's centred frame; `cos_raw`: of the raw output, what a transform
returns, with the native target rows) and recall@10 of the pairs, and `retrieval` (corpus- and query-side MRR,
overlap@10, the proxy `nn_retention@10`). With labelled `queries` and each one's `relevant` row,
`retrieval.labelled` holds R@1, R@10, nDCG@10 and MRR of those queries over the mapped and over the
native documents and their retention (`retention_interval`: the 95 % bootstrap interval of the R@10
retention over the queries; with a gate, `gate_within_interval` says the queries cannot decide it;
`native_hits`: the queries whose relevant document is in the native top 10, `chance_p`: how often a random top 10
has as many, `undecided`: why the R@10 retention decides no gate, else null)
(with `old_queries`, the same queries under the old model, also
`old`: keeping the old model, and `beats_old`), and `retention` is the labelled R@10 retention (`side`
`target`: corpus-side, the queries are target-model vectors; `source`: query-side, the queries are
source-model vectors the map moves into the target index). That retention is over the held-out documents alone
(`retention_scope` `held-out`), higher than over a whole corpus whose other rows compete: with `old_corpus` (the old
model's vectors of the rest of the corpus) and `old_queries`, `retrieval.corpus` holds the retention over the whole
corpus, those rows mapped (migrated R@10 exact, native R@10 estimated as the plan estimates it), and `retention`
and the gate are of it (`retention_scope` `corpus`, `retention_heldout` the other). `min_retention` / `min_top1` add
`result`: `PASS` or `FAIL` (still 200: the gate's verdict is data; `retention` is null when no query finds its
relevant document natively, and a `min_retention` gate on it is a 422; so is a gate on a labelled retention that
is `undecided` (native R@10 no better than chance, or fewer than 5 native hits), and a pass of an `nn_retention@10`
that a random map reaches at least 1 % of the time: at least 15 pairs for a perfect map; `retrieval.proxy` says so
without a gate too, with `chance_p` and `undecided` as `labelled` has them; a gate of 0, which no figure fails,
passes any defined one: 200 `PASS`, with a note when the figure is `undecided` that it says nothing of the map, and
`gate_within_interval` false). A labelled retention above 1 passes as 1 would, with a note why (none when it is
at chance). Each vector set is `vectors` or `vectors_b64` + `dim`. Above `max_queries` held-out pairs (default
{EVAL_MAX_QUERIES:,}) the pair figures rank a sample of that many (drawn with `random_state`) against all of
them: `n_queries` says how many, `intervals` (here and in `retrieval`) the 95 % interval of each share.
"""


@router.post("/maps/{ref}/evaluate", dependencies=[ReadScope, JSONOnly], summary="Evaluate a map (labelled gate)",
             description=EVALUATE_DOC, openapi_extra=json_body(EvaluateRequest, "evaluate_map"),
             response_model=EvaluateResponse, responses=error_responses(404, 429))
async def evaluate(ref: RefPath, request: Request, state: StateDep, settings: SettingsDep):
    body = await request.body()

    def work():
        raw = parse_json(body)
        opts = validate(EvaluateRequest, raw)
        bools = may_hold_bools(body)
        X, Y, Q, Qo, C = (_vectors(raw, k, settings, bools)
                          for k in ("source", "target", "queries", "old_queries", "old_corpus"))
        return evaluate_map(state.registry, ref, X, Y, csls=opts.csls, min_top1=opts.min_top1,
                            min_retention=opts.min_retention, queries=Q, relevant=opts.relevant, side=opts.side,
                            old_queries=Qo, csls_weight=opts.csls_weight, max_queries=opts.max_queries,
                            random_state=opts.random_state, old_corpus=C)

    async with state.heavy.slot("evaluate"):
        return FastJSONResponse(await state.heavy.run(work, request))
