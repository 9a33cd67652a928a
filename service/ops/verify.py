"""Check a migrated collection for every face (``vecbridge verify``, ``POST /v1/verifications``): :func:`run_verify`
runs :func:`service.vectordb.verify_migration` and / or :func:`service.vectordb.check_rows` on a store URL, and
:func:`verify_verdict` is the PASS/FAIL rule of both faces.

Progress: ``progress(stage, fraction)`` (:data:`service.progress.Progress`) per stage: ``sample`` (rows read),
``embed`` (texts re-embedded, per block), ``search`` (the engine's own search), ``rows`` (source rows checked, per
batch); ``cancelled()`` (a job's cancel) is polled at each report and stops the check there (Cancelled: a check
writes nothing, so nothing is left half done). A job's progress (it raises Cancelled itself) and the CLI's bar are
both such callbacks.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from align.exceptions import Cancelled, InputError

from ..encoders import canonical_name, space_encoder
from ..errors import NotFoundError
from ..vectordb.lost import lost_as_unavailable
from .migration_checks import check_source_fields
from .vectordb import open_store_for, read_keep

__all__ = ["check_encoder_space", "run_verify", "verify_verdict"]


def check_encoder_space(registry, collection: str, recorded: str | None, encoder: str, *,
                        encoder_option: str = "--encoder") -> None:
    """InputError (422, exit 2) when ``collection`` records a space (``recorded``) whose registered encoder is not
    ``encoder`` (:func:`service.encoders.space_encoder`, the check of every face): its texts re-embedded by another
    model are compared with vectors they can never match, and the check said FAIL, blaming the migration (cosine
    0.003). ``encoder_option``: how the face names the encoder (``--encoder``, HTTP's ``encoder``), for the
    message. Nothing is known (no record, no registry, a space the registry lacks, one with no encoder or with one
    this release does not know): the check runs as asked. ``registry`` may be a callable that opens it, called only
    when ``collection`` records a space (the CLI's: a re-embed check never needed a registry, and a data dir
    without one was refused, exit 2). A registry that cannot be read (its database down) is its error
    (RegistryUnavailableError: 503, exit 75), not a skipped check."""
    if not recorded or registry is None:
        return
    if callable(registry):
        registry = registry()
        if registry is None:
            return
    try:
        registered = registry.get_space(recorded).encoder
        if registered:
            registered = canonical_name(registered)  # an alias or a hub id: the name --encoder takes
    except NotFoundError:  # the space, or its encoder's name (UnknownEncoderError: a model this release does not know)
        return
    said = (f"{encoder_option} {registered}" if encoder_option.startswith("--")
            else f'"{encoder_option}": {json.dumps(registered)}')  # a CLI flag, or an HTTP request's field
    space_encoder(recorded, registered, encoder, collection=collection,
                  remedy=f"every check would fail, whatever the migration did; verify with the space's encoder: "
                         f"{said}")


def _reporter(progress: Callable[[str, float], None] | None, cancelled: Callable[[], bool] | None):
    """``report(stage, fraction)``: ``progress``'s, after a stop asked through ``cancelled`` (Cancelled)."""
    def report(stage: str, fraction: float) -> None:
        if cancelled is not None and cancelled():
            raise Cancelled(f"verification stopped during {stage!r} (a check writes nothing: send it again to "
                            "run it)")
        if progress is not None:
            progress(stage, fraction)

    return report


def run_verify(*, store_url: str, collection: str, encoder: str | None = None, heldout: tuple | None = None,
               heldout_rows: str | None = None, map_ref=None, registry=None, n_sample: int = 2000,
               n_queries: int = 200, k: int = 10,
               random_state: int = 0, id_field: str | None = None, vector_field: str | None = None,
               text_field: str | None = None, source: str | None = None, api_key: str | None = None,
               ca_file=None, source_space: str | None = None, space_option: str = "--source-space",
               encoder_option: str = "--encoder", keep_ids=None,
               keep_vectors=None, spaces=None, progress: Callable[[str, float], None] | None = None,
               cancelled: Callable[[], bool] | None = None) -> dict:
    """Verify a migrated collection: re-embed its stored texts with ``encoder``, or compare a held-out
    paired sample ``heldout = (old-model vectors path, new-model vectors path)`` (rows ``heldout_rows``,
    ``"START:STOP"``) through ``map_ref``; with ``source`` (and ``map_ref``) also check every row of the
    collection against ``map_ref(source row)`` (:func:`service.vectordb.check_rows`: missing, extra, wrong),
    once ``source``'s space is the map's (recorded, ``source_space``, or its rows: as a migration checks it;
    ``space_option``: how the face declares ``source_space``, for the messages; ``encoder_option``: how it names
    ``encoder``). ``keep_ids`` / ``keep_vectors`` (with ``source``; files or arrays, as :func:`run_migration`
    takes them): the rows that migration kept as re-embedded, checked against their given vectors instead of the
    map's. ``registry``: also where the space the collection records names its encoder (:func:`check_encoder_space`:
    another ``encoder`` is refused), unless ``spaces`` gives that one (a registry, or a callable opening it only
    when the collection records a space).
    ``progress`` / ``cancelled``: see the module docs."""
    from ..vectordb import check_rows, verify_migration

    if encoder is not None and heldout is not None:
        raise InputError("give either --encoder (re-embed the stored texts) or --heldout-source/--heldout-target")
    if encoder is None and heldout is None and source is None:
        raise InputError("give --encoder (re-embed the stored texts), --heldout-source/--heldout-target, or "
                         "--source with --map (check every row against its source row)")
    if source is not None and map_ref is None:
        raise InputError("--source needs --map (the migration's map)")
    if source_space is not None and source is None:
        raise InputError(f"{space_option} declares the space of the source collection's rows: give it with the "
                         "source (and its map)")
    if (keep_ids is not None or keep_vectors is not None) and source is None:
        raise InputError("--keep-ids/--keep-vectors name the rows a migration kept as re-embedded: give them with "
                         "--source and --map (the rows check)")
    keep_ids, keep_vectors = read_keep(keep_ids, keep_vectors, "checking kept re-embedded rows")
    embed = X_Y = None
    if encoder is not None:
        from ..encoders import get_encoder

        canonical_name(encoder)  # an unknown name fails now; the model loads once the collection has been read

        def embed(texts):
            return get_encoder(encoder).encode(texts, kind="passage")
    elif heldout is not None:
        from ..io import read_vectors

        if map_ref is None:
            raise InputError("a held-out check needs --map")
        X_Y = tuple(read_vectors(p, rows=heldout_rows, encoder_option=None, key_option=None) for p in heldout)
    store = open_store_for(store_url, id_field=id_field, vector_field=vector_field, text_field=text_field,
                           api_key=api_key, ca_file=ca_file)
    report = _reporter(progress, cancelled)
    try:
        with lost_as_unavailable(store, "run the same command again"):
            # the fields named (or the engine's defaults) before any work: as POST /v1/verifications checks them
            fields = {"id_field": id_field, "vector_field": vector_field, "text_field": text_field}
            json_fields = not space_option.startswith("--")
            check_source_fields(store, collection, fields, json_fields=json_fields, role="collection")
            if source is not None:
                check_source_fields(store, source, fields, json_fields=json_fields)
            out = {"mode": "rows"}
            if embed is not None:
                check_encoder_space(registry if spaces is None else spaces, collection, store.get_space(collection),
                                    encoder, encoder_option=encoder_option)
            if embed is not None or X_Y is not None:
                out = verify_migration(store, collection, embed=embed, heldout=X_Y, map_=map_ref, registry=registry,
                                       n_sample=n_sample, n_queries=n_queries, db_queries=n_queries, k=k,
                                       random_state=random_state, progress=report)
            if source is not None:
                out["source"] = source
                out.update(check_rows(store, source, collection, map_ref, registry=registry,
                                      source_space=source_space, space_option=space_option, keep_ids=keep_ids,
                                      keep_vectors=keep_vectors, progress=report))
    finally:
        store.close()
    out["collection"] = collection
    return out


def verify_verdict(out: dict, *, min_recall: float | None, source: str | None,
                   kept_rows: int | None = None) -> tuple[str | None, list[str]]:
    """``(verdict, why)`` of :func:`run_verify`'s figures: ``"FAIL"`` when recall@k is below ``min_recall`` or (with
    ``source``) a row is missing, extra or wrong, ``"PASS"`` otherwise, None when nothing was gated. ``kept_rows``
    (:func:`kept_by_migration`): the size of the migration's keep set, for the reason of wrong vectors checked
    without it (0: it kept none, no such reason; None: unknown, they may be kept rows)."""
    fails = []
    if min_recall is not None and out[f"recall@{out['k']}"] < min_recall:
        fails.append(f"recall@{out['k']} below {min_recall}")
    if source is not None and not out["rows_ok"]:
        fails.append("rows differ from the source's")
        wrong = out.get("wrong_vectors") or 0
        if wrong and wrong == out.get("rows_target"):  # every one: another map?
            fails.append("every vector differs from map(source row): was the collection migrated with another "
                         "version of the map (its checkpoint records it as NAME:N)?")
        elif wrong and "kept_checked" not in out and kept_rows != 0:  # kept rows hold their own vectors
            said = (f"its checkpoint records a keep set of {kept_rows} re-embedded rows (migrate --keep-ids)"
                    if kept_rows else "may be re-embedded rows the migration kept (migrate --keep-ids)")
            fails.append(f"{wrong} wrong vector(s): {said}; give verify the same --keep-ids/--keep-vectors (`keep` "
                         "over HTTP) to check them against their given vectors")
    return (None if min_recall is None and source is None else ("FAIL" if fails else "PASS")), fails
