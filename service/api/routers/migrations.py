"""Migration jobs: ``POST /v1/migrations`` moves a collection of the service's vector database through a map;
``POST /v1/verifications`` checks the result (``vecbridge verify``).

The job is the CLI's ``vecbridge migrate`` (:func:`service.ops.vectordb.run_migration`) on the store the service
is configured with (``VECBRIDGE_VECTORDB_URL`` and its key / CA settings): a client names collections and a
registry map, never a URL or a file, so the service reaches no database and reads no file a client chooses.
Progress is the job's (``GET /v1/jobs/{id}``: rows done / total); ``DELETE /v1/jobs/{id}`` stops it after the
batch in flight (or cancels the target's index build, pgvector), and the checkpoint
(``DATA_DIR/migrations/<source>-to-<target>.json``, the CLI's default)
lets the same request, or ``vecbridge migrate``, resume it.
"""

from __future__ import annotations

import shlex
from contextlib import contextmanager

from fastapi import APIRouter

from align.exceptions import InputError

from ...encoders import canonical_name
from ...urls import hide_endpoints
from ...ops.vectordb import (
    configured_url,
    default_checkpoint,
    kept_by_migration,
    list_checkpoints,
    open_store_for,
    run_migration,
)
from ...ops.migration_checks import (check_index, check_map_space, check_map_width, check_names, check_resume,
                                     check_source_fields, check_target, resume_options)
from ...ops.verify import check_encoder_space, run_verify, verify_verdict
from ...vectordb.base import VectorDBUnavailableError, check_name
from ...vectordb.lost import lost_as_unavailable
from ...vectordb.keep import check_keep, keep_set
from ..codec import parse_json, validate, vectors_from_json
from ..job_routes import job_route
from ..pagination import list_route
from ..schemas import error_responses
from ..vectordb_schemas import MigrationList, MigrationRequest, VerificationRequest

router = APIRouter(prefix="/v1", tags=["fits and jobs"], responses=error_responses(401, 403, 404, 422, 503))

MIGRATION_DOC = """Queue a migration of a collection in the service's vector database (`VECBRIDGE_VECTORDB_URL`:
Milvus, PostgreSQL + pgvector or Qdrant) through a registry map into a new collection, ids, texts and other
fields kept; the answer (202) carries the job id at once. `GET /v1/jobs/{id}` follows it (stage `migrate`,
fraction = rows written / rows in the source; on success `result.report`: rows, batches, seconds, fields, the
space check); `DELETE /v1/jobs/{id}` stops it after the batch in flight, or cancels the target's index build
(PostgreSQL). The checkpoint (`checkpoint` in the
result, the CLI's default place) makes the same request resume where it stopped; `vecbridge migrate --status`
reads it. `dry_run: true` makes every check a run makes, reads and maps one batch, and writes nothing. `keep`
(ids + vectors of the rows re-embedded to fit the map) writes those rows' own new-model vectors instead of mapped
ones; the report counts `kept` and `keep_not_found`.

Refused before a job exists: no vector database configured, or one not answering (503, with `Retry-After`), an
unknown map (404), a bad collection name
or `keep` set (vectors not of the map's target width, NaN, an id twice, ids and rows of different counts: 422),
`target` equal to `source`, an `index` kind other than `like` on a Milvus or Qdrant store (their targets take the
source's own index: 422); and, asking the database once, the source missing (404), an id, vector or (named) text
field it lacks (422, naming the field; a Qdrant text key no point's payload has), a map whose
input width is not the source's vectors' (422 naming `map`), keep ids of another kind than the source's (422), a
resume whose options differ from the unfinished run's (409, naming each field and its recorded value), a checkpoint
written with another `keep` set than the request's, or with one while the request sends none (or none while it sends
one: 409 naming `keep`), a map from another space than the one the source records (or `source_space` declares: 422
naming `map`), an existing target without `overwrite` (409 naming `overwrite`), a target an alias serves (even with
`overwrite`: 409) or that is an alias, an `alias` naming a collection (409). Refusals that need more of the database
(a source whose rows look like the map's target space, a field that cannot travel) end the job `failed` with the
message; nothing is written.
"""


@job_route(router, "/migrations", kind="migration", summary="Queue a vector-database migration",
           description=MIGRATION_DOC, body_model=MigrationRequest, example="create_migration")
def create_migration(body: bytes, request, state, settings):
    obj = parse_json(body)
    opts = validate(MigrationRequest, obj)
    url = configured_url(settings)
    check_name(opts.source), check_name(opts.target)
    if opts.alias is not None:
        check_name(opts.alias, "alias")
    check_names(opts.source, opts.target, json_fields=True)
    check_index(url, opts.index, json_fields=True)
    v = state.registry.resolve(opts.map)  # 404 for an unknown map; pinned: an alias moving later changes nothing
    ref = f"{v.name}:{v.version}"
    # absolute, as GET /v1/migrations shows it (a relative data dir gave the job's result a relative one)
    checkpoint = default_checkpoint(settings.data_dir, opts.source, opts.target).resolve()
    keep_ids = keep_vectors = None
    if opts.keep is not None:  # its rows checked first: they need no database
        keep_ids, keep_vectors = _keep(obj, opts, v.target_dim)
    _check_store(url, settings, opts, checkpoint, v, None if opts.keep is None else (keep_ids, keep_vectors))

    def job(ctx):
        ctx.progress("connect", 0.0)

        def progress(p):  # raises Cancelled on DELETE /v1/jobs/{id}: the batch just written is checkpointed
            ctx.progress(p.stage, 0.0 if p.stage == "index" else p.done / p.total if p.total else 1.0)

        rep = run_migration(store_url=url, source=opts.source, target=opts.target, map_ref=ref,
                            checkpoint=checkpoint, registry=state.registry, alias=opts.alias,
                            batch_size=opts.batch_size, overwrite=opts.overwrite, pause=opts.pause,
                            index=opts.index, id_field=opts.id_field, vector_field=opts.vector_field,
                            text_field=opts.text_field, source_space=opts.source_space,
                            target_space=opts.target_space, progress=progress, api_key=settings.vectordb_api_key,
                            ca_file=settings.vectordb_ca_file, dry_run=opts.dry_run, space_option="source_space",
                            keep_ids=keep_ids, keep_vectors=keep_vectors, cancelled=ctx.cancel_asked,
                            data_dir=settings.data_dir, registry_url=settings.registry_url,
                            artifact_dir=settings.resolved_artifact_dir(),
                            index_wait_s=settings.vectordb_index_wait_s)
        return {"map": ref, "checkpoint": str(checkpoint), "report": rep.to_dict()}

    what = "dry run of a migration" if opts.dry_run else "migrate"
    return job, f"{what} {opts.source} -> {opts.target} through {ref}"


def _check_store(url: str, settings, opts, checkpoint, v, keep: tuple | None) -> None:
    """The refusals a migration makes at its start that the database answers at once, made now (as the CLI makes
    them): the source missing (404), a field it lacks (422), a map (version ``v``) of another space than the one
    the source records (422, naming ``map``) or whose input width is not the source's (422, naming ``map``), keep
    ids (``keep``: ids, vectors) of another kind than the source's (422), a resume whose options differ from the
    unfinished run's (409, naming the request's fields) or whose keep set differs from its checkpoint's (409, naming
    ``keep``), a fresh run's target that exists without ``overwrite`` or that an alias serves (409)."""
    fields = {"id_field": opts.id_field, "vector_field": opts.vector_field, "text_field": opts.text_field}
    with _checked_store(url, settings, fields, opts.index or "like", "no migration was queued") as store:
        check_source_fields(store, opts.source, fields, json_fields=True)
        check_map_space(store, opts.source, opts.source_space, v.ref, v.source_space, v.target_space,
                        json_fields=True)  # first: a map the wrong way round of another width is that
        check_map_width(store, opts.source, v.ref, v.source_dim, json_fields=True)
        kept = None if keep is None else keep_set(store, opts.source, *keep, v.target_dim)  # reads one row
        options = resume_options(alias=opts.alias, index=opts.index, **fields, source_space=opts.source_space,
                                 target_space=opts.target_space)
        check_resume(store, checkpoint, opts.source, options, map_target_space=v.target_space, keep=kept,
                     json_fields=True)
        check_target(store, opts.source, opts.target, alias=opts.alias, overwrite=opts.overwrite,
                     fresh=not checkpoint.exists(), json_fields=True)


@contextmanager
def _checked_store(url: str, settings, fields: dict, index: str | None, nothing: str):
    """The service's store opened with a request's field names, for the checks made before a job exists, closed after.
    A database that does not answer now is a 503 with ``Retry-After`` saying ``nothing`` ("no migration was queued"),
    no job queued: it was a 202 whose job failed on the same connect moments later (VectorDBUnavailableError)."""
    try:
        store = open_store_for(url, index=index, **fields, api_key=settings.vectordb_api_key,
                               ca_file=settings.vectordb_ca_file)
    except VectorDBUnavailableError as exc:
        raise VectorDBUnavailableError(f"{exc}; {nothing}: send the request again later") from None
    try:
        with lost_as_unavailable(store, f"{nothing}: send the request again later"):
            yield store
    finally:
        store.close()


def _keep(obj: dict, opts, dim: int) -> tuple:
    """The body's ``keep`` set, its count, width (``dim``: the map's target) and NaN checked now (422 before a job
    exists); its ids against the source in the job. Not capped at ``max_batch`` rows: a keep set cannot be split
    (a resume must send the same one); the JSON body limit bounds it."""
    return check_keep(opts.keep.ids, vectors_from_json(obj["keep"], dim=None, max_batch=2**62, name="vectors",
                                                       finite=False), dim)


list_route(router, "/migrations", name="list_migrations", response_model=MigrationList,
           summary="Migrations recorded in this data dir (their checkpoints: CLI and HTTP runs)",
           load=lambda state: [_for_clients(m) for m in list_checkpoints(state.settings.data_dir,
                                                                             state.settings.vectordb_url)])


def _for_clients(status: dict) -> dict:
    """A migration's status as an HTTP client sees it: a registry URL other than a SQLite file's (host, port, user)
    in its resume command is ``REGISTRY``, as 503 bodies and /readyz hide the registry's endpoints; the note says
    what to give there. Its words (``why``, a damaged file's ``error``) hide a database's endpoints, as errors do."""
    status = {k: hide_endpoints(v) if k in ("why", "error") and isinstance(v, str) else v for k, v in status.items()}
    argv = shlex.split(status["resume"]) if status.get("resume") else []
    if "--registry-url" not in argv or argv[argv.index("--registry-url") + 1].startswith("sqlite:"):
        return status
    argv[argv.index("--registry-url") + 1] = "REGISTRY"
    note = ("REGISTRY: the service's registry URL (its VECBRIDGE_REGISTRY_URL), which the service does not show to "
            "clients")
    return {**status, "resume": shlex.join(argv), "resume_note": note}

VERIFY_DOC = """Queue a check of a migrated collection in the service's vector database (`vecbridge verify`); the
answer (202) carries the job id. `encoder`: re-embed a sample of the stored texts with that installed encoder
(the new model) and measure recall@k of the migrated vectors against the re-embedded ones, partner recall, and
the engine's own search (`min_recall` gates recall@k); `source` + `map`: check every row against map(source row)
(missing, extra and wrong rows, with the first ids), once the source's space is the map's: recorded, given as
`source_space`, or its first rows checked as a migration checks them (`space_check` in the result; a map the wrong
way round fails the job). Both may be given. The result carries the figures and
`verdict`: PASS / FAIL (null when nothing was gated). Held-out vector files are the CLI's (`--heldout-source`).
`keep` (with `source`: the migration's own `keep`, ids + vectors) checks the rows it kept as re-embedded against
their given vectors (`kept_checked`, `kept_wrong`); a bad set is a 422 before a job exists, as for a migration.
Also refused before a job exists, asking the database once (as a migration request is): `collection` or `source`
missing (404), or lacking the id or vector field or a `text_field` that was named (422 naming the field; a Qdrant
text key: no point's payload has it); a database not answering (503 with `Retry-After`).
"""


@job_route(router, "/verifications", kind="verify", summary="Queue a check of a migrated collection",
           description=VERIFY_DOC, body_model=VerificationRequest, example="create_verification")
def create_verification(body: bytes, request, state, settings):
    obj = parse_json(body)
    opts = validate(VerificationRequest, obj)
    url = configured_url(settings)
    check_name(opts.collection)
    if opts.encoder is None and opts.source is None:
        raise InputError("give encoder (re-embed the stored texts) and/or source with map (check every row)")
    if (opts.source is None) != (opts.map is None):
        raise InputError("source and map go together: the rows are checked against map(source row)")
    if opts.source_space is not None and opts.source is None:
        raise InputError("source_space declares the space of the source collection's rows: give it with source")
    if opts.min_recall is not None and opts.encoder is None:
        raise InputError("min_recall gates the recall of the encoder check; source alone checks rows, not recall")
    encoder = None if opts.encoder is None else canonical_name(opts.encoder)  # 404 for an unknown encoder
    if encoder is not None and state.vectordb is not None:  # another model than the space's: 422 now (one read)
        check_encoder_space(state.registry, opts.collection, _recorded_space(state, opts.collection), encoder,
                            encoder_option="encoder")
    ref = None
    if opts.source is not None:
        check_name(opts.source)
        v = state.registry.resolve(opts.map)
        ref = f"{v.name}:{v.version}"
    keep_ids = keep_vectors = None
    if opts.keep is not None:
        if ref is None:
            raise InputError("keep names the rows a migration kept as re-embedded: give it with source and map")
        keep_ids, keep_vectors = _keep(obj, opts, state.registry.load_map(ref).target_dim)
    _check_fields(url, settings, opts)  # 404 / 422 naming the field, or 503: no job

    def job(ctx):
        ctx.progress("verify", 0.0)
        out = run_verify(store_url=url, collection=opts.collection, encoder=encoder, map_ref=ref,
                         registry=state.registry, progress=ctx.progress, cancelled=ctx.cancel_asked,
                         n_sample=opts.n_sample, n_queries=opts.queries,
                         k=opts.k, random_state=opts.random_state, id_field=opts.id_field,
                         vector_field=opts.vector_field, text_field=opts.text_field, source=opts.source,
                         source_space=opts.source_space, space_option="source_space", encoder_option="encoder",
                         api_key=settings.vectordb_api_key, ca_file=settings.vectordb_ca_file, keep_ids=keep_ids,
                         keep_vectors=keep_vectors)
        kept = None if opts.source is None else kept_by_migration(settings.data_dir, opts.source, opts.collection)
        out["verdict"], out["fails"] = verify_verdict(out, min_recall=opts.min_recall, source=opts.source,
                                                      kept_rows=kept)
        return out

    return job, f"verify {opts.collection}" + (f" against {opts.source} through {ref}" if ref else "")


def _check_fields(url: str, settings, opts) -> None:
    """A verification's refusals that the database answers at once, made before a job exists (as a migration request
    makes them, :func:`~service.ops.migration_checks.check_source_fields`): ``collection`` (and ``source``) missing
    (404), or lacking the id or vector field, or a text field that was named (422, naming ``id_field`` ...). They
    were the job's: 202, then a failed job. A database that does not answer: 503 with ``Retry-After``, no job."""
    fields = {"id_field": opts.id_field, "vector_field": opts.vector_field, "text_field": opts.text_field}
    with _checked_store(url, settings, fields, None, "no verification was queued") as store:
        check_source_fields(store, opts.collection, fields, json_fields=True, role="collection")
        if opts.source is not None:
            check_source_fields(store, opts.source, fields, json_fields=True)


def _recorded_space(state, collection: str) -> str | None:
    """The space ``collection`` records, read through the service's shared connection; None when it cannot be read
    now (a missing collection, the database down): the job meets that and says so, as it did."""
    from align.exceptions import VecbridgeError

    try:
        return state.vectordb.call(lambda store: store.get_space(collection))
    except VecbridgeError:
        return None
