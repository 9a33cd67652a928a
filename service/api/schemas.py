"""Request and response schemas (pydantic), kept apart from the routes.

Vector fields are read by :mod:`.codec` straight from the body (JSON lists, base64 float32
or binary bodies) — pydantic would validate a 1024×384 list element by element, ~100× slower
than ``orjson`` + numpy. The models below still describe them for OpenAPI, and validate
every other field.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict, create_model, field_validator

from ..indexes import IndexInfo
from ..indexes.csls import CSLS_WEIGHT
from ..limits import (DEFAULT_LIMITS, MAX_CSLS_K, MAX_DESCRIPTION, MAX_DIM, MAX_EF_SEARCH, MAX_NPROBE, MAX_SEED,
                      MAX_STEER_EPS, check_json_depth)
from ..ops.plans import EVAL_MAX_QUERIES
from ..registry.models import SpaceInfo, SteerInfo, VersionInfo, display_fields
from ..registry.names import MAX_VERSION, check_text
from .body_models import RequestModel
from .body_models import StrictRequestModel as _Strict
from .error_schemas import ErrorBody, error_responses
from .embedding_schemas import EmbeddingsRequest, EmbeddingsResponse, ModelList
from .name_types import AliasName, IndexName, MapPath, Name, Ref
from .number_types import Count, Flag, Real, count

__all__ = [
    "MAX_VERSION", "ErrorBody",
    "SpaceCreate", "AliasSet", "AliasOut", "TagSet", "TransformOptions", "TransformJSON", "TransformResponse",
    "IndexCreate", "IndexAdd", "IndexDelete", "SearchRequest", "SearchResponse", "FitSide", "FitRequest", "PlanRequest",
    "EmbeddingsRequest", "vectors_schema", "error_responses", "Health",
    "Ready", "ServiceInfo",
    "SpaceOut", "SpaceList",
    "VersionOut", "VersionDeleted", "VersionList", "MapSummary", "MapList", "MapDetail", "IndexOut", "IndexList",
    "IndexAddResponse",
    "IndexDeleteResponse", "JobOut", "JobList", "ModelList", "EmbeddingsResponse",
    "SteerFitRequest", "SteerFitOptions", "SteerApplyRequest", "SteerApplyOptions", "SteerApplyResponse", "SteerOut",
    "SteerDeleted", "SteerList", "SteerLens", "SteerTransferRequest", "SteerTransferred", "SteerVersionList",
]


Description = Field("", max_length=MAX_DESCRIPTION, description=f"Free text, at most {MAX_DESCRIPTION} characters.")

#: A description's type: what the registry refuses (``check_text``: NUL, which PostgreSQL's TEXT cannot hold) is
#: refused at request time, before a fit runs, not after the work.
DescriptionText = Annotated[str, AfterValidator(lambda text: check_text(text, "description"))]
Dim = Field(None, description=f"Columns per row (1 .. {MAX_DIM}).")
DimCount = count(1, MAX_DIM)  # with Dim: `dim: DimCount | None = Dim`
Seed = Field(0, ge=0, le=MAX_SEED, description="Seed of every random step (0 .. 2**31-1).")
#: A steer's strength: a real number within [-MAX_STEER_EPS, MAX_STEER_EPS] (service.limits says why)
SteerEps = Annotated[Real, Field(ge=-MAX_STEER_EPS, le=MAX_STEER_EPS, allow_inf_nan=False)]
Ids = Field(None, description="One id per row, 0 .. 2**61-1 (default, up to 2**62-1: counting up from one past "
            "the largest id the index ever held; a deleted id is not used again).")


# --- spaces and maps ----------------------------------------------------------------------------
class SpaceCreate(_Strict):
    null_refused = frozenset({"description", "query_prefix", "passage_prefix"})  # kept by an upsert, never cleared
    name: Name
    dim: DimCount | None = Field(None, description=f"Columns (1 .. {MAX_DIM}); taken from the encoder "
                                                       "when omitted.")
    encoder: str | None = Field(None, description="Installed encoder that produces this space (GET /v1/models); "
                                "null: none, or on a space that exists its own, kept (it cannot be cleared).")
    query_prefix: str = Field("", max_length=1024, description=(
        "Record of the prefix this space's queries were embedded with (e.g. 'query: '), for whoever embeds vectors "
        "for it outside the service. Stored with the space, never added by the service: its encoders add their "
        "model's own prefixes (multilingual-e5-small: 'query: ' / 'passage: ')."))
    passage_prefix: str = Field("", max_length=1024, description="As query_prefix, for documents.")
    description: DescriptionText = Description


class AliasSet(_Strict):
    version: Count = Field(..., ge=1, le=MAX_VERSION)
    expected_version: count(0, MAX_VERSION) | None = Field(
        None, description="Compare-and-set: move the alias only while it points at this version "
        "(0: only while it is not set), else 409 naming where it points. Of deploy tools racing, one moves it. "
        "Or send the `If-Match` header (412 instead).")


class AliasOut(BaseModel):
    """An alias: the version it points at (its ``ETag`` is ``"v<version>"``; send it in ``If-Match``)."""

    name: str
    alias: str
    version: int


class TagSet(_Strict):
    value: Any = Field(..., description="Stored as text: a string as sent, another JSON value as its compact JSON, "
                       f"read back as text (`1` -> `\"1\"`); at most {DEFAULT_LIMITS.max_tag_bytes} bytes as JSON, "
                       f"{DEFAULT_LIMITS.max_json_depth} levels deep.")

    @field_validator("value")
    @classmethod
    def _bounded(cls, v):
        from .responses import dumps

        check_json_depth(v, DEFAULT_LIMITS.max_json_depth, "tag value")
        if len(dumps(v)) > DEFAULT_LIMITS.max_tag_bytes:
            raise ValueError(f"tag value is larger than {DEFAULT_LIMITS.max_tag_bytes} bytes as JSON")
        return v


# --- vectors ------------------------------------------------------------------------------------
class _Vectors(RequestModel):
    vectors: list[list[Annotated[float, Strict()]]] | None = Field(  # a JSON true is no number (lax: 1.0)
        None, description="Rows as JSON numbers, shape (n, d). Simple but slow for large batches.")
    vectors_b64: str | None = Field(
        None, description="Fast path in JSON: base64 of little-endian float32, row-major; needs `dim`.")
    dim: DimCount | None = Field(None, description="Columns per row for `vectors_b64`.")


#: the public spelling of :class:`_Vectors` for the other schema modules; the class keeps its name, which is the
#: OpenAPI component (``#/components/schemas/_Vectors``) clients already read
Vectors = _Vectors


def vectors_schema() -> dict:
    return _Vectors.model_json_schema()


class TransformOptions(_Strict):
    output: Literal["frame", "raw", "linear"] = Field(
        "raw", description="`raw`: comparable with raw target vectors (search an index of them); "
                           "`frame`: the centred target frame (evaluation); `linear`: `f_s(x) W + b`, where `f_s` "
                           "is the map's source frame (by default: unit rows, centred, unit rows again), without "
                           "the target frame or renormalisation (a cluster map: its routed clusters' blend).")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="Response vectors as JSON numbers or base64 float32 (`vectors_b64`).")
    dim: DimCount | None = Dim


class TransformJSON(_Vectors):
    output: Literal["frame", "raw", "linear"] = "raw"
    encoding_format: Literal["float", "base64"] = "float"


class TransformResponse(BaseModel):
    map: str
    version: int
    source_space: str
    target_space: str
    shape: list[int]
    vectors: list[list[float]] | None = None
    vectors_b64: str | None = None


# --- indexes ------------------------------------------------------------------------------------
class IndexCreateOptions(_Strict):
    name: IndexName
    space: Name = Field(..., description="Registered space whose vectors the index stores.")
    kind: Literal["auto", "flat", "hnsw", "ivf"] = Field(
        "auto", description="`auto`: exact flat below 50k rows, HNSW below 1M, IVF above.")
    metric: Literal["cosine", "ip"] = "cosine"
    params: dict[str, Any] = Field(default_factory=dict,
                                   description="Integers only. HNSW: `M` 2..256, `ef_construction` 1..4096, "
                                               "`ef_search` 1..32768; IVF: `nlist` 1..min(65536, rows), `nprobe` "
                                               "1..nlist, `train_rows` nlist..256·nlist (k-means sample, default "
                                               "64·nlist, at most every row); flat: none. Anything else is a 422. "
                                               "`random_state` here (as an index's info reports it) is the seed "
                                               "when the field beside `params` is not given, else must equal it.")
    random_state: Count = Seed
    description: DescriptionText = Description
    ids: list[Count] | None = Ids
    payloads: list[Any] | None = Field(None, description="One JSON value per row, returned with search hits.")
    texts: list[str] | None = Field(None, description="Embed these with the space's encoder (passage form) "
                                                      "instead of sending vectors.")
    store_texts: Flag = Field(True, description="With `texts`: keep each text as its payload unless payloads given.")
    dim: DimCount | None = Dim


class IndexCreate(IndexCreateOptions, _Vectors):
    pass


class IndexAddOptions(_Strict):
    space: Name | None = Field(None, description="The rows' space, as `index add --space`: the index's own skips the "
                                                "check of the rows' mean direction; another space is a 422 (map "
                                                "the rows first: `POST /v1/maps/{ref}/transform`).")
    ids: list[Count] | None = Ids
    payloads: list[Any] | None = None
    texts: list[str] | None = None
    store_texts: Flag = True
    dim: DimCount | None = Dim


class IndexAdd(IndexAddOptions, _Vectors):
    pass


class IndexDelete(_Strict):
    ids: list[Count] = Field(..., min_length=1, description="Ids to delete (unknown ids are ignored).")


class SearchOptions(_Strict):
    texts: list[str] | None = Field(None, description="Queries as texts, embedded with `space`'s encoder (query form).")
    space: Name | None = Field(None, description="Space of the queries (default: the index's). Any registered space "
                                                "with a path of maps to the index's space works.")
    map: MapPath | None = Field(
        None, description="Use this map (`name`, `name@alias`, `name:N`) instead of the registry's path, or a path of "
                          "them in order (a list: from `space` to the index's space), e.g. the `maps` of an earlier "
                          "answer as `name:version`: every batch of a large query set then goes through the same "
                          "versions, whatever aliases move meanwhile.")
    k: Count = Field(10, ge=1, json_schema_extra={"x-limit": "max_k"}, description=(  # max_k, no le: check_k
        f"Results per query: at most `limits.max_k` (default {DEFAULT_LIMITS.max_k}; the maximum here is this "
        f"service's); queries × k at most `max_hits` (default {DEFAULT_LIMITS.max_hits})."))
    csls: Flag = Field(False, description="Re-rank candidates by CSLS (reduces hubness of mapped queries).")
    csls_k: Count = Field(10, ge=1, le=MAX_CSLS_K)
    csls_weight: Real = Field(CSLS_WEIGHT, ge=0, le=2, allow_inf_nan=False,
                               description="Weight w of the document's hubness in the CSLS score 2 cos(q, d) - r(q) - "
                                           "w r(d): 1 is classic CSLS, 0 the cosine order. The default 0.5 kept more "
                                           "of the native recall than 1 on labelled retrieval in migrated indexes "
                                           "(benchmarks/results/migration_2026-12-01_csls*.md).")
    exact: Flag = Field(False, description="Scan every row (ignores the approximate structure).")
    ef_search: count(1, MAX_EF_SEARCH) | None = Field(
        None, description="HNSW breadth for this request (at most 32768); HNSW only (else, or with exact: 422).")
    nprobe: count(1, MAX_NPROBE) | None = Field(
        None, description=f"IVF lists probed for this request (at most {MAX_NPROBE}); IVF only (or 422).")
    include_payloads: Flag = True
    steers: dict[str, SteerEps] | None = Field(
        None, description="Steered search: `{steer ref: eps}` applied to the queries in the index's space (after "
                          f"translation), composed by summing `sum eps_i W_i` (|eps| at most {MAX_STEER_EPS:g}).")
    dim: DimCount | None = Dim


class SearchRequest(SearchOptions, _Vectors):
    pass


class Hit(BaseModel):
    id: int
    score: float
    payload: Any = None


class SearchResponse(BaseModel):
    index: str
    space: str
    query_space: str
    k: int
    scoring: Literal["cosine", "ip", "csls"]
    maps: list[dict]
    steers: list[dict] = Field(default_factory=list, description="Steers applied to the queries: name, version, eps.")
    note: str | None = Field(None, description="Only when some query got fewer than `k` hits: why (an index of "
                                               "fewer rows; an IVF index whose `nprobe` lists probed held fewer: "
                                               "raise `nprobe` or search with `exact`).")
    results: list[list[Hit]]


# --- fits ---------------------------------------------------------------------------------------
class FitSide(_Vectors):
    model_config = ConfigDict(extra="forbid")
    texts: list[str] | None = Field(None, description="Texts embedded with `encoder` (or the space's encoder).")
    encoder: str | None = None


class FitRequest(_Strict):
    name: Name = Field(..., description="Map name; the fit registers its next version.")
    source_space: Name
    target_space: Name
    source: FitSide
    target: FitSide
    method: str | None = Field(None, description="minivec2vec (unsupervised; the default unless `paired` is true, "
                                                 "which needs a method, as the CLI's --method), procrustes, ridge, "
                                                 "lowrank (align.fit_lowrank's rank-k map, `params.rank` required), "
                                                 "auto, contrastive, cluster (per-cluster maps, align.ClusterMap).")
    params: dict[str, Any] = Field(default_factory=dict, description="The method's, e.g. `alpha` (ridge, lowrank: "
                                   "0 .. 1e12; auto's, per pair: 0 .. 1e6), `rank` (lowrank); others are a 422.")
    paired: Flag | None = Field(None, description="Rows of source and target are pairs (row i <-> row i). Default, "
                                                  "as in the CLI: true for the paired methods (procrustes, ridge, "
                                                  "lowrank, auto, contrastive, cluster), false for minivec2vec; true "
                                                  "with no `method` is a 422 unless 2+ `seed_pairs` seed minivec2vec.")
    seed_pairs: list[tuple[Count, Count]] | None = Field(None, description="Known (source row, target row) pairs "
                                                                           "seeding an unsupervised fit.")
    unpaired_source: _Vectors | None = Field(None, description="More source-model vectors beside the pairs (e.g. the "
                                             "old corpus): align.fit_migration's unpaired_source (auto, contrastive, "
                                             "cluster only).")
    unpaired_target: _Vectors | None = Field(None, description="More target-model vectors beside the pairs (e.g. "
                                             "queries); both given, params.semi_supervised refines a procrustes map.")
    random_state: Count = Seed
    alias: AliasName | None = Field(None, description="Point this alias (e.g. prod) at the new version; not when the "
                                                      "fit is flagged unreliable (the job's `notes` say where it "
                                                      "stays).")
    description: DescriptionText = Description


class PlanRequest(_Strict):
    old: _Vectors = Field(..., description="The old corpus (old-model vectors of every row to migrate).")
    probe_source: _Vectors = Field(..., description="Old-model vectors of the probe texts (50+; 200-1,000 recommended).")
    probe_target: _Vectors = Field(..., description="New-model vectors of the same texts, row i <-> row i.")
    target_retention: Real = Field(0.95, gt=0, le=1, description="Retention the recommended K should reach.")
    random_state: Count = Seed
    queries: _Vectors | None = Field(None, description="Labelled queries (new-model vectors): the plan predicts their "
                                                       "labelled R@10 retention over the whole `old` corpus. Needs "
                                                       "`old_queries` and `relevant`.")
    old_queries: _Vectors | None = Field(None, description="The same queries under the old model.")
    relevant: list[Count] | None = Field(None, description="Each query's relevant document: its row in the probe.")
    k: count(1) | None = Field(None, description="`rows_to_embed` for this many rows, not the recommended K.")
    keep: Flag = Field(False, description="The migration keeps its K re-embedded rows' own new-model vectors "
                                          "(`vecbridge transform --keep-rows`, `migrate --keep-ids`): the "
                                          "recommendation reads each K's `kept` forecast instead of `retention` "
                                          "(`recommended.forecast` says which), never a larger K.")


class EvaluateRequest(_Strict):
    source: _Vectors = Field(..., description="Held-out documents under the map's source model (n rows).")
    target: _Vectors = Field(..., description="The same documents under its target model, row i <-> row i.")
    queries: _Vectors | None = Field(None, description="Labelled queries: target-model vectors (`side` target) or "
                                                       "source-model ones (`side` source).")
    relevant: list[Count] | None = Field(None, description="Each query's relevant document: its row in "
                                                                  "`source`/`target`.")
    old_queries: _Vectors | None = Field(None, description="The same queries under the old model: adds the baseline "
                                                           "of keeping it (`retrieval.labelled.old`, `beats_old`); "
                                                           "`old_corpus` needs them.")
    old_corpus: _Vectors | None = Field(None, description=(
        "The old model's vectors of the rest of the corpus: the labelled retention (and the gate) is then over the "
        "whole corpus, these rows mapped beside the held-out documents, as the plan forecasts it "
        "(`retrieval.corpus`, `retention_scope`); needs `queries`, `relevant`, `old_queries`, side `target`, "
        "no `csls`."))
    side: Literal["target", "source"] = Field("target", description="`target`: corpus-side migration (the map moves "
                                              "the documents); `source`: query-side (the map moves the queries).")
    min_retention: Real | None = Field(None, ge=0, le=1, description="PASS/FAIL gate on retention (labelled R@10 "
                                        "retention with queries, else nn_retention@10).")
    min_top1: Real | None = Field(None, ge=0, le=1, description="PASS/FAIL gate on top-1 of the pairs.")
    csls: Flag = Field(False, description="Also rank by CSLS: top-1 of the pairs, and with `queries` the labelled "
                                          "retention (and the gate) of CSLS search "
                                          "(`retrieval.labelled_plain`: plain).")
    csls_weight: Real = Field(CSLS_WEIGHT, ge=0, le=2, allow_inf_nan=False,
                               description="Weight of the document's hubness in that CSLS search.")
    max_queries: Count = Field(EVAL_MAX_QUERIES, ge=1, description=(
        "Rank at most this many held-out pairs (a sample drawn with `random_state`), each against all the held-out "
        "target rows; `n_queries` and `intervals` (95 %) say what the sample leaves. At or above the row count: "
        "every pair."))
    random_state: Count = Seed


# --- response bodies ----------------------------------------------------------------------------
# Responses are written by FastJSONResponse (orjson, numpy-native); these models document them
# (``response_model``) without FastAPI re-validating each body.
class Page(BaseModel):
    """A list route's answer: ``data`` (one page) and ``next`` (see :mod:`.pagination`)."""

    next: str | None = Field(None, description="Cursor of the next page (`?cursor=`); null on the last page.")


class Health(BaseModel):
    status: str


class Ready(BaseModel):
    status: Literal["ready", "not ready"]
    checks: dict[str, Any] = Field(..., description="`registry`, `artifacts` (once the registry answers: `ok`, or "
                                                     "why this data dir's artifact folder is not the registry's), "
                                                     "`indexes` (counts `loaded`, `loading`: still being "
                                                     "loaded at start-up, not ready until 0, and `failed`; `errors`: "
                                                     "name -> why; failures never gate readiness), `data_dir` "
                                                     "(writable, free space above `min_free_bytes`), and `demo` "
                                                     "(`preparing` / `ready` / `failed`) when this run registers the "
                                                     "start-up demo; the demo never gates readiness. `encoders` "
                                                     "(name -> `loading` / `ready` / `failed: ...`) with "
                                                     "`preload_encoders`: not ready until all are ready.")


class ServiceInfo(BaseModel):
    service: str
    version: str
    python: str
    faiss: str
    registry_backend: str
    uptime_seconds: float
    limits: dict[str, int]
    auth: Literal["disabled", "api-keys"]
    native_threads: dict[str, Any] = Field(default_factory=dict, description=(
        "`setting` (Settings.blas_threads) and the BLAS / FAISS OpenMP thread counts in force (service/threads.py)."))
    heap: dict[str, Any] = Field(default_factory=dict, description=(
        "`setting_mb` (Settings.malloc_keep_mb) and the glibc thresholds `applied` in bytes, null where not "
        "set (service/memory.py)."))
    map_cache: dict[str, int | None] = Field(default_factory=dict, description=(
        "Loaded maps, steers and paths kept in memory: `setting_mb` (Settings.map_cache_mb), `max_bytes`, `bytes` "
        "(their arrays, measured now), `entries`, `max_entries` (service/registry/cache.py)."))
    search_device: str = Field("cpu", description=(
        "Where flat indexes are searched: `cpu` (FAISS) or the GPU, e.g. `cuda:0 (NVIDIA H200)` "
        "(Settings.search_device)."))
    counts: dict[str, Any]
    demo: Literal["preparing", "ready", "failed"] | None = Field(
        None, description="The start-up demo on an empty data dir: `preparing`, `ready`, `failed`; null: none.")
    encoders: dict[str, str] = Field(default_factory=dict, description=(
        "Encoders preloaded at start-up (`preload_encoders`) -> `pending`, `loading`, `ready` or `failed: <why>`; "
        "empty when none was asked for. /readyz is not ready until each is `ready`."))


def record_model(name: str, record) -> type[BaseModel]:
    """The response schema of a registry record, derived from its dataclass (:mod:`service.registry.models`).

    Same fields in the same order as the record's ``to_dict()``, same types; a field is required
    unless the dataclass gives it a default; ``metadata["doc"]`` becomes the field's description;
    the record's docstring the schema's.
    """
    hints = typing.get_type_hints(record)
    by_name = {f.name: f for f in dataclasses.fields(record)}
    spec = {}
    for n in display_fields(record):
        f = by_name[n]
        default = ... if f.default is dataclasses.MISSING else f.default
        if f.default_factory is not dataclasses.MISSING:
            default = Field(default_factory=f.default_factory)
        spec[n] = (hints[n], Field(default, description=f.metadata["doc"]) if "doc" in f.metadata else default)
    return create_model(name, __doc__=record.__doc__, **spec)


SpaceOut = record_model("SpaceOut", SpaceInfo)


class SpaceList(Page):
    data: list[SpaceOut]


VersionOut = record_model("VersionOut", VersionInfo)


class VersionDeleted(VersionOut):
    bare_ref: str | None = Field(None, description="`name:N`: what a bare NAME resolves to now (its live `prod` "
                                 "version, else the best reliable one); null when none (left, or reliable).")
    already_deleted: bool = Field(False, description="True when the version was deleted before this request "
                                  "(nothing changed: a repeated delete answers 200 too, without a second delete).")
    deleted_at: str | None = Field(None, description="When the version was deleted: the first delete's time (null "
                                   "when an older release deleted it without one).")


class VersionList(Page):
    data: list[VersionOut]


class MapSummary(BaseModel):
    name: str
    source_space: str
    target_space: str
    source_dim: int
    target_dim: int
    latest_version: int | None = Field(None, description="Latest live (not deleted) version; null when none.")
    aliases: dict[str, int]
    aliases_on_deleted: list[str] = Field(default_factory=list, description=(
        "Aliases left on a deleted version: kept for lineage, they no longer resolve."))
    n_versions: int
    n_live_versions: int
    created_at: str
    unreliable_versions: list[int] = Field(default_factory=list, description=(
        "Live versions whose fit flagged them unreliable (metrics.reliable false): kept for inspection, "
        "never chosen for a path."))
    path_version: int | None = Field(None, description=(
        "The version this map contributes to paths between spaces: its prod alias, else its newest "
        "reliable live version; null when none qualifies."))


class MapList(Page):
    data: list[MapSummary]


MapDetail = create_model(
    "MapDetail", __doc__="A map's summary and the version a reference to it resolves to.",
    **{n: (f.annotation | None, Field(None, description=f.description)) for n, f in MapSummary.model_fields.items()},
    resolved=(VersionOut, Field(..., description="The version the reference resolves to.")))


IndexOut = record_model("IndexOut", IndexInfo)


class IndexList(Page):
    data: list[IndexOut]


class IndexAddResponse(BaseModel):
    index: str
    ids: list[int]
    count: int
    notes: list[str] = Field(default_factory=list, description="What the rows check could not tell: rows no known "
                                                               "space recognises, or rows added unchecked because the "
                                                               "registry did not answer.")


class IndexDeleteResponse(BaseModel):
    index: str
    deleted: int
    count: int


class JobProgress(BaseModel):
    stage: str = Field(..., description="The step running now (e.g. `fit: restart 1: self_learning`); `done` at the "
                                        "end, `interrupted` or `cancelled` when it stopped early.")
    fraction: float = Field(..., description="How far the current stage has got, in [0, 1]: it rises within a stage "
                                             "and starts again at the next one (not the whole job's fraction).")
    stage_elapsed_seconds: float | None = Field(None, description="Seconds in the current stage (running jobs).")
    stage_eta_seconds: float | None = Field(None, description=(
        "Seconds until the current stage ends at its rate so far: `elapsed * (1 - fraction) / fraction`; null "
        "below 1 % or when not running. Later stages are not included: no estimate of the whole job exists."))


class JobTimings(BaseModel):
    created_at: float
    started_at: float | None = None
    finished_at: float | None = Field(None, description=(
        "When it ended; for a job a crash or kill interrupted, its last progress report before that (the time the "
        "service was down is not counted as run time)."))
    queued_seconds: float
    run_seconds: float | None = None
    stages: dict[str, float]


class JobOut(BaseModel):
    id: str
    kind: str
    description: str
    state: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    progress: JobProgress
    timings: JobTimings
    result: dict[str, Any] | None = Field(None, description="On success; fits: `ref` and the registered `version`.")
    error: dict[str, Any] | None = Field(None, description="On failure or cancel: `type`, `message`.")
    cancel_requested: bool
    seq: int | None = Field(None, description="The job's place in the order the data dir's jobs were made (increasing, "
                                              "never reused; not the wall clock): the order of the list.")


class JobList(Page):
    data: list[JobOut]
    counts: dict[str, int] = Field(..., description="Jobs by state, counted in the durable job store shared by "
                                                    "every process of the data dir (not just the answering one).")


# --- steers -------------------------------------------------------------------------------------
class SteerFitOptions(_Strict):
    name: Name = Field(..., description="Steer name; the fit registers its next version.")
    space: Name = Field(..., description="Embedding space of the steer (created from the data when new).")
    labels: list[Count] = Field(..., description="One per row: +1 wanted attribute, 0 neutral context, -1 (at "
                                "least one, as +1): the local method (the default) scores -1 rows as 0 rows and uses "
                                "them only for the mean-shift line its prior shrinks toward (`opposite_weight` B > 0 "
                                "also pushes them down, toward -B); lm-steer trains them as the opposite; mean-shift "
                                "steers along mean(+1) - mean(-1).")
    texts: list[str] | None = Field(None, description="Rows as texts, embedded with `encoder` (default: the "
                                                      "space's encoder); they also name the items of the lens.")
    encoder: str | None = None
    items: list[str] | None = Field(None, description="With vectors: a name per row, shown in the lens.")
    params: dict[str, Any] = Field(default_factory=dict, description="`method` (local, the default: closed-form "
                                 "local discriminant, rank 1, eps 1 keeps ~half the top-10 | lm-steer | mean-shift, "
                                 "which takes no other), `rank` (lm-steer), `n_neighbors`, `ridge`, `temperature`, "
                                 "`max_iter`, ... (the seed is `random_state` below, not a parameter)")
    random_state: Count = Seed
    alias: AliasName | None = None
    description: DescriptionText = Description
    dim: DimCount | None = Dim


class SteerFitRequest(SteerFitOptions, _Vectors):
    pass


class SteerApplyOptions(_Strict):
    eps: SteerEps = Field(1.0, description="Strength: 0 is the identity, 1 the trained strength, negative reverses "
                                           "(away from the +1 attribute; toward the -1 rows only as far as the fit "
                                           f"learnt them: see `labels`) (|eps| at most {MAX_STEER_EPS:g}).")
    dim: DimCount | None = Dim


class SteerApplyRequest(SteerApplyOptions, _Vectors):
    pass


class SteerApplyResponse(BaseModel):
    steer: str = Field(..., description="`name:version` applied.")
    eps: float
    vectors: list[list[float]]


SteerOut = record_model("SteerOut", SteerInfo)


class SteerVersionList(Page):
    data: list[SteerOut]


class SteerDeleted(SteerOut):
    bare_ref: str | None = Field(None, description="`name:N`: what a bare NAME resolves to now (its live `prod` "
                                 "version, else its newest live one not flagged unreliable); null when it means "
                                 "none (no live version left, or only flagged ones).")
    already_deleted: bool = Field(False, description=VersionDeleted.model_fields["already_deleted"].description)
    deleted_at: str | None = Field(None, description=VersionDeleted.model_fields["deleted_at"].description)


class SteerTransferred(SteerOut):
    alias_held_back: str | None = Field(None, description="The `alias` asked for when the new version did not take "
                                        "it (flagged unreliable: the alias stays where it was, as a map fit's); "
                                        "null when it moved or none was asked for.")


class SteerTransferRequest(_Strict):
    map: Ref = Field(..., description="Map ref (NAME, NAME@alias, NAME:N) whose source space is the steer's space.")
    name: Name | None = Field(None, description="Name of the transferred steer (default: "
                                    "`{steer's name}-{target space}`; 422 if that is over 128 characters).")
    alias: AliasName | None = None
    description: DescriptionText = Description


class SteerSummary(BaseModel):
    name: str
    space: str
    dim: int
    latest_version: int | None = None
    aliases: dict[str, int]
    aliases_on_deleted: list[str] = Field(default_factory=list, description=(
        "Aliases left on a deleted version: kept for lineage, they no longer resolve."))
    n_versions: int
    n_live_versions: int
    created_at: str
    unreliable_versions: list[int] = Field(default_factory=list, description=(
        "Live versions whose fit flagged them unreliable (metrics.reliable false): a bare name never resolves to "
        "one unless `prod` points at it; `NAME:N` or another alias reaches it."))
    bare_version: int | None = Field(None, description=(
        "The version a bare NAME applies: its live `prod` version, else its newest live version not flagged "
        "unreliable; null when none (no live version, or only flagged ones: a bare NAME is then a 404)."))


class SteerList(Page):
    data: list[SteerSummary]


class SteerLens(BaseModel):
    steer: str
    space: str
    sigma: list[float] = Field(..., description="Singular values of W (largest first).")
    directions: list[dict[str, Any]] = Field(..., description="Per direction: `sigma`, `positive` / `negative` "
                                                              "extreme items of the fitting corpus; empty when the "
                                                              "items had no names.")
