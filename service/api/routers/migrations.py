"""Migration jobs: ``POST /v1/migrations`` moves a collection of the service's vector database through a map.

The job is the CLI's ``vecbridge migrate`` (:func:`service.ops.vectordb.run_migration`) on the store the service
is configured with (``VECBRIDGE_VECTORDB_URL`` and its key / CA settings): a client names collections and a
registry map, never a URL or a file, so the service reaches no database and reads no file a client chooses.
Progress is the job's (``GET /v1/jobs/{id}``: rows done / total); ``DELETE /v1/jobs/{id}`` stops it after the
batch in flight, and the checkpoint (``DATA_DIR/migrations/<source>-to-<target>.json``, the CLI's default)
lets the same request, or ``vecbridge migrate``, resume it.
"""

from __future__ import annotations

from fastapi import APIRouter

from ...errors import ServiceUnavailableError
from ...ops.vectordb import default_checkpoint, run_migration
from ...vectordb.base import check_name
from ..codec import parse_json, validate
from ..job_routes import job_route
from ..schemas import MigrationRequest, error_responses

router = APIRouter(prefix="/v1", tags=["fits and jobs"], responses=error_responses(401, 403, 404, 422, 503))

MIGRATION_DOC = """Queue a migration of a collection in the service's vector database (`VECBRIDGE_VECTORDB_URL`:
Milvus, PostgreSQL + pgvector or Qdrant) through a registry map into a new collection, ids, texts and other
fields kept; the answer (202) carries the job id at once. `GET /v1/jobs/{id}` follows it (stage `migrate`,
fraction = rows written / rows in the source; on success `result.report`: rows, batches, seconds, fields, the
space check); `DELETE /v1/jobs/{id}` stops it after the batch in flight. The checkpoint (`checkpoint` in the
result, the CLI's default place) makes the same request resume where it stopped; `vecbridge migrate --status`
reads it. `dry_run: true` makes every check a run makes, reads and maps one batch, and writes nothing.

Refused before a job exists: no vector database configured (503), an unknown map (404), a bad collection name
(422). Refusals that need the database (the source missing, an existing target without `overwrite`, a map of
another space or dimension, a field that cannot travel) end the job `failed` with the message; nothing is
written.
"""


@job_route(router, "/migrations", kind="migration", summary="Queue a vector-database migration",
           description=MIGRATION_DOC, body_model=MigrationRequest, example="create_migration")
def create_migration(body: bytes, request, state, settings):
    opts = validate(MigrationRequest, parse_json(body))
    if not settings.vectordb_url:
        raise ServiceUnavailableError("this service has no vector database configured: set VECBRIDGE_VECTORDB_URL "
                                      "(or run `vecbridge migrate --store URL` where the database is reachable)")
    check_name(opts.source), check_name(opts.target)
    if opts.alias is not None:
        check_name(opts.alias, "alias")
    v = state.registry.resolve(opts.map)  # 404 for an unknown map; pinned: an alias moving later changes nothing
    ref = f"{v.name}:{v.version}"
    checkpoint = default_checkpoint(settings.data_dir, opts.source, opts.target)

    def job(ctx):
        ctx.progress("connect", 0.0)

        def progress(p):  # raises Cancelled on DELETE /v1/jobs/{id}: the batch just written is checkpointed
            ctx.progress("migrate", p.done / p.total if p.total else 1.0)

        rep = run_migration(store_url=settings.vectordb_url, source=opts.source, target=opts.target, map_ref=ref,
                            checkpoint=checkpoint, registry=state.registry, alias=opts.alias,
                            batch_size=opts.batch_size, overwrite=opts.overwrite, pause=opts.pause,
                            index=opts.index, id_field=opts.id_field, vector_field=opts.vector_field,
                            text_field=opts.text_field, source_space=opts.source_space,
                            target_space=opts.target_space, progress=progress, api_key=settings.vectordb_api_key,
                            ca_file=settings.vectordb_ca_file, dry_run=opts.dry_run)
        return {"map": ref, "checkpoint": str(checkpoint), "report": rep.to_dict()}

    what = "dry run of a migration" if opts.dry_run else "migrate"
    return job, f"{what} {opts.source} -> {opts.target} through {ref}"
