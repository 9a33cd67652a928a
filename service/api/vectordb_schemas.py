"""Request schemas of the vector-database routes (migrations, verifications, collection search), kept apart
from :mod:`.schemas` (whose building blocks they use)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from ..limits import MAX_MIGRATE_BATCH, MAX_MIGRATE_PAUSE, MAX_VERIFY_K, MAX_VERIFY_QUERIES, MAX_VERIFY_SAMPLE
from .body_models import StrictRequestModel as _Strict
from .name_types import Name, Ref
from .number_types import Flag, count
from .schemas import Count, Dim, DimCount, MapPath, Page, Real, Seed, Vectors

__all__ = ["CollectionSearchOptions", "CollectionSearchRequest", "CollectionSearchResponse", "KeepRows",
           "MigrationList", "MigrationRequest", "MigrationStatus", "VerificationRequest"]


class KeepRows(Vectors):
    model_config = ConfigDict(extra="forbid")
    ids: list[count(-2**63, 2**63 - 1) | Annotated[StrictStr, Field(min_length=1)]] = Field(
        ..., description="Ids of the rows re-embedded with the new model: integers, or strings (UUIDs, keys); one per "
                         "row of `vectors`, in their order, none twice.")


class MigrationRequest(_Strict):
    source: str = Field(..., description="Collection (or alias) of the old model's vectors in the service's vector "
                                         "database (`VECBRIDGE_VECTORDB_URL`).")
    target: str = Field(..., description="New collection for the mapped vectors (same ids and fields).")
    map: Ref = Field(..., description="Registry ref of the map (`name`, `name@alias`, `name:N`); pinned to its "
                                      "version when the request is accepted.")
    alias: str | None = Field(None, description="Switched to the target once every row is written.")
    batch_size: Count = Field(2000, ge=1, le=MAX_MIGRATE_BATCH,
                              description="Rows per read / map / write step (and checkpoint).")
    pause: Real = Field(0.0, ge=0, le=MAX_MIGRATE_PAUSE,
                        description="Seconds to sleep after each batch (spares a busy database).")
    overwrite: Flag = Field(False, description="Drop an existing target before a fresh start (never when resuming, "
                                               "never one an alias serves).")
    source_space: Name | None = Field(None, description="Space of the source vectors (checked against the map's).")
    target_space: Name | None = Field(None, description="Space recorded on the target (default: the map's).")
    index: Literal["hnsw", "ivfflat", "none", "like"] | None = Field(
        None, description="PostgreSQL: the target's index (default like: the source table's own, method and options). "
                          "Milvus and Qdrant targets take the source's own index: another kind is refused (422).")
    id_field: str | None = None
    vector_field: str | None = None
    text_field: str | None = None
    dry_run: Flag = Field(False, description="Every check a run makes, one batch read and mapped, nothing written.")
    keep: KeepRows | None = Field(
        None, description="The rows the migration re-embedded to fit its map, with their new-model vectors (width: the "
                          "map's target): written as given instead of mapped (`vecbridge migrate --keep-ids "
                          "--keep-vectors`). Held in memory; a resume must send the same set. The report counts `kept` "
                          "and `keep_not_found` (ids no source row has: not an error).")


class VerificationRequest(_Strict):
    collection: str = Field(..., description="The migrated collection (or its alias) in the service's vector database.")
    encoder: str | None = Field(None, description="Re-embed a sample of its stored texts with this installed encoder "
                                                  "(the new model) and measure recall@k / partner recall.")
    source: str | None = Field(None, description="The migration's source collection: check every row of "
                                                 "`collection` against map(source row) (missing, extra, wrong "
                                                 "vectors). Needs `map`.")
    map: Ref | None = Field(None, description="Registry ref of the migration's map (with `source`).")
    source_space: Name | None = Field(None, description="Space of `source`'s vectors when it records none (checked "
                                                        "against the map's; else its first rows are).")
    n_sample: Count = Field(2000, ge=2, le=MAX_VERIFY_SAMPLE, description="Rows sampled for the re-embedding check.")
    queries: Count = Field(200, ge=1, le=MAX_VERIFY_QUERIES, description="Queries of the engine-search check.")
    k: Count = Field(10, ge=1, le=MAX_VERIFY_K)
    random_state: Count = Seed
    min_recall: Real | None = Field(None, ge=0, le=1, description="PASS/FAIL gate on recall@k (with `encoder`).")
    keep: KeepRows | None = Field(
        None, description="With `source`: the rows the migration kept as re-embedded (its `keep`, `vecbridge migrate "
                          "--keep-ids --keep-vectors`), checked against these vectors instead of map(source row). "
                          "The result counts `kept_checked`, `kept_wrong` and `keep_not_found`.")
    id_field: str | None = None
    vector_field: str | None = None
    text_field: str | None = None


class CollectionSearchOptions(_Strict):
    texts: list[str] | None = Field(None, description="Queries as texts, embedded with `space`'s encoder (query form).")
    space: Name = Field(..., description="Space of the queries; mapped into the collection's space by the registry's "
                                        "path of maps.")
    map: MapPath | None = Field(None, description="Use this map (or path of maps, in order) instead of the registry's "
                                                  "path.")
    k: Count = Field(10, ge=1, json_schema_extra={"x-limit": "max_k"},  # max_k: document.py, check_k (no `le` here)
                     description="Results per query (at most `limits.max_k`).")
    collection_space: Name | None = Field(None, description="Space of the collection's vectors when it records none "
                                                           "(a migrated collection records its space); one that "
                                                           "contradicts the recorded space is refused (422).")
    dim: DimCount | None = Dim


class CollectionSearchRequest(CollectionSearchOptions, Vectors):
    pass


class CollectionHit(BaseModel):
    id: int | str = Field(..., description="The row's id as the database keeps it (an integer or a string).")
    score: float


class CollectionSearchResponse(BaseModel):
    collection: str
    collection_space: str = Field(..., description="The space of the collection's vectors.")
    space: str = Field(..., description="The queries' space.")
    maps: list[dict[str, Any]] = Field(..., description="The map versions the queries went through, in order "
                                                        "(empty when the spaces are the same).")
    results: list[list[CollectionHit]] = Field(..., description="Per query, its hits, best first.")


class CollectionOut(BaseModel):
    name: str
    space: str | None = Field(..., description="The embedding space the collection records (a migration records "
                                               "it); null when it records none.")
    dim: int | None = Field(..., description="The width of its vectors; null for an empty collection whose vector "
                                             "field declares none (pgvector's `vector` without a size): see `note`.")
    note: str | None = Field(None, description="Why `dim` is null, when it is.")
    count: int = Field(..., description="Rows in the collection.")
    metric: str = Field(..., description="How it ranks rows: `cosine`, `ip`, or the engine's own (`l2`).")


class MigrationStatus(BaseModel):
    name: str = Field(..., description="The checkpoint's name: `<source>-to-<target>`.")
    checkpoint: str
    source: str | None = None
    target: str | None = None
    done: int | None = Field(None, description="Rows written.")
    total: int | None = Field(None, description="Rows in the source when the migration started.")
    fraction: float | None = None
    batches: int | None = None
    last_id: Any = Field(None, description="The last id written (an integer or a string id): where a rerun resumes.")
    finished: bool | None = None
    state: Literal["running", "stopped", "interrupted", "finished"] | None = Field(None, description=(
        "`stopped`: its last run ended unfinished (interrupted, failed); `interrupted`: its last run recorded no end "
        "but its process is gone (killed: `why` names it); run it again to resume (`resume`)."))
    holder: dict[str, Any] | None = Field(None, description=(
        "The process the last run recorded as writing it: `pid`, `host`, `started` (its start time, Linux clock "
        "ticks since boot); null in a checkpoint of an older vecbridge."))
    why: str | None = Field(None, description="What `state` rests on: `process N is gone` (interrupted), or a run "
                                              "on another host that cannot be checked from this one.")
    engine: str | None = Field(None, description=(
        "The engine the migration ran on (`milvus`, `pgvector`, `qdrant`); null in a checkpoint of an older "
        "vecbridge."))
    resume: str | None = Field(None, description="The `vecbridge migrate` command that resumes it, with the options "
                                                 "its run recorded (`--alias`, `--index`, field names, spaces, "
                                                 "`--data-dir`, `--registry-url`; `STORE`: the same vector "
                                                 "database); null once finished.")
    resume_note: str | None = Field(None, description=(
        "What `resume` cannot say itself: the registry URL it names is shown without its password (`***`), and how "
        "to give that; null when there is nothing to add."))
    fields: list[str] | None = None
    rows_per_s: float | None = Field(None, description="Rows per second of the last run (its own rows and time).")
    eta_s: float | None = Field(None, description="Seconds left at that rate while it runs; null once stopped.")
    updated_at: float | None = None
    keep_rows: int | None = Field(None, description=(
        "The size of the keep set (`keep`: rows re-embedded to fit the map, written with their own vectors) the "
        "migration was given; 0: none. A resume must send the same set (another is refused)."))
    kept: int | None = Field(None, description="Rows written with their own vectors so far; null without a keep set.")
    keep_digest: str | None = Field(None, description=(
        "The first 12 hex digits of the keep set's sha256 (ids and vectors), as a refused resume names it; null "
        "without a keep set."))
    error: str | None = Field(None, description="Why the checkpoint could not be read (a damaged file).")


class MigrationList(Page):
    data: list[MigrationStatus]
