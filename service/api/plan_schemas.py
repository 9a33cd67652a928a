"""Answer schemas of ``POST /v1/plans`` and ``POST /v1/maps/{ref}/evaluate`` (what :func:`align.plan_migration` and
:func:`service.ops.plans.evaluate_map` return), kept apart from :mod:`.schemas`.

Each names the keys every answer has; the figures that depend on the request (labelled queries, a gate, a sample
of the pairs) are listed as optional, and any other key of align's result passes (``extra="allow"``): the
schema documents the answer, it does not cut it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["EvaluateResponse", "PlanResponse"]

Share = float | None  # a retention or recall; null where it is undefined (no query finds its document natively)


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class CurvePoint(_Open):
    k: int = Field(..., description="Pairs fitted.")
    mean: float = Field(..., description="Mean retention of the repeats at this K.")
    spread: float


class Forecast(_Open):
    k: int
    method: str
    retention: float
    low: float
    high: float
    extrapolated: bool = Field(..., description="Beyond the probe's largest K.")
    whole_corpus: bool = Field(False, description="K reaches the size of `old`: re-embed all of it.")
    r10: float | None = Field(None, description="With labelled queries: the migrated index's predicted R@10.")
    kept: dict[str, float] | None = Field(
        None, description="The forecast (`share`, `retention`, `low`, `high`; labelled: `r10`) for a migration that "
                          "keeps its K re-embedded rows' own new-model vectors (`vecbridge transform --keep-rows`): "
                          "the share K / n of queries whose documents they are find them as natively.")


class Recommendation(_Open):
    method: str = Field(..., description="The method to fit: the forecast's at K < 1,000, `auto` from 1,000 on "
                                         "(`whole_corpus`: nothing is fitted; the best migrating K's method).")
    forecast_method: str = Field(..., description="The closed-form method the forecast and its interval are of; "
                                                  "`auto` may fit another family, which usually measures above it.")
    k: int = Field(..., description="Rows of `old` to re-embed; with `whole_corpus` its size n: re-embed every row "
                                    "with the new model, no map to fit.")
    whole_corpus: bool
    forecast: Literal["retention", "kept"] = Field(
        ..., description="The forecast the recommendation read: `retention` (every row mapped), or with `keep` "
                         "`kept` (the re-embedded rows keep their own vectors).")
    migration_reaches_target: bool = Field(
        True, description="False when no K that migrates is predicted to reach `target_retention`: the "
                          "recommendation is then the whole corpus (`whole_corpus`), re-embedded.")
    best_migrating: dict[str, Any] | None = Field(
        None, description="When no K that migrates reaches the target: the best one (`k`, `method`, and the "
                          "forecast read, `retention`, `low`, `high`), the alternative to re-embedding every row.")


class PlanResponse(_Open):
    alignability: float = Field(..., description="kNN@10 overlap of the two spaces on the probe beyond chance.")
    unsupervised_feasible: bool
    knn_overlap: float = Field(..., description="The raw kNN@10 overlap.")
    n_probe: int
    n_probe_repeated: int
    n_probe_holdout: int
    n_distractors: int | None = Field(None, description="Mapped rows of `old` competing in each curve point's search "
                                      "(up to 8,192 without queries; with them the whole corpus): the figure falls "
                                      "as they grow.")
    probe_unpaired_share: float | None = Field(None, description="Estimated share of the probe's pairs that are not "
                                               "one text (maps fitted on the rest of the probe rank their partner "
                                               "as they would a random row); from 200 pairs, a note from 0.2.")
    metric: str = Field(..., description="What the curve and the forecast are of.")
    curve: dict[str, list[CurvePoint]] = Field(..., description="Per method, the simulated retention per K.")
    best_method: str
    fit: dict[str, Any]
    fits: dict[str, dict[str, Any]]
    predicted: list[Forecast]
    target_retention: float
    recommended: Recommendation
    rows_to_embed: list[int] = Field(..., description="Rows of `old` to re-embed for the recommended K (for `k`); "
                                                      "empty when they are every row (`rows_to_embed_all`).")
    rows_to_embed_all: bool = Field(False, description="The rows to re-embed are every row of `old`, 0..n-1 (the "
                                                       "whole corpus, or `k` = n): not listed in `rows_to_embed`.")
    rows_k: int | None = Field(None, description="The `k` asked for: `rows_to_embed` holds that many rows "
                                                 "(fewer when the old corpus has fewer distinct rows: `notes` say so).")
    notes: list[str]
    n_queries: int | None = None
    n_corpus: int | None = None
    native: dict[str, Any] | None = Field(None, description="With labelled queries: their R@10 under each model.")
    labelled: dict[str, Any] | None = None


class Retrieval(_Open):
    n_pairs: int
    retention: Share = Field(..., description="Labelled R@10 retention with queries, else `nn_retention@10`.")
    retention_metric: str
    labelled: dict[str, Any] | None = Field(None, description="R@1, R@10, nDCG@10 and MRR of the labelled queries "
                                                              "over the mapped and the native documents.")
    proxy: dict[str, Any] | None = Field(None, description="The `nn_retention@10` proxy against a random map's: "
                                         "`kept` of `n_queries` rows, `candidates` per query, `chance_p` (how often "
                                         "a random map keeps as many) and `undecided` (why its pass says nothing: "
                                         "undefined, or `chance_p` at least 0.01; else null).")
    retention_interval: list[float] | None = None
    min_retention: float | None = None
    passed: bool | None = None
    result: Literal["PASS", "FAIL"] | None = None
    gate_within_interval: bool | None = None


class EvaluateResponse(_Open):
    map: str = Field(..., description="The version evaluated, `name:N`.")
    n_candidates: int
    n_queries: int
    top1: float
    mean_rank: float
    cos: float = Field(..., description="Mean cosine to the true partner in the target's centred frame.")
    cos_raw: float = Field(..., description="The same of the raw output, what a transform returns.")
    retrieval: Retrieval
    retention: Share
    intervals: dict[str, Any] | None = Field(None, description="When a sample of the pairs was ranked: the 95 % "
                                                               "interval of each share.")
    top1_chance: dict[str, Any] | None = Field(None, description="`top1` against a random map's: `hits` of "
                                               "`n_queries` rows, `candidates` per row, `chance_p` (how often a random "
                                               "map finds as many) and `undecided` (why its pass says nothing: "
                                               "`chance_p` at least 0.01, and a `min_top1` it reaches is a 422; else "
                                               "null).")
    min_top1: float | None = None
    min_retention: float | None = None
    result: Literal["PASS", "FAIL"] | None = Field(None, description="With a gate: PASS only when each gate passes.")
    notes: list[str] = Field(default_factory=list, description="What the check of the rows against the map's two "
                                                               "sides could not tell (pairs the wrong way round are "
                                                               "a 422), and why a labelled retention is above 1.")
