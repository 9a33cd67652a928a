"""The refusals a migration can make before it starts, shared by ``vecbridge migrate`` (:func:`service.ops.vectordb.
run_migration`) and ``POST /v1/migrations`` (the request, before a job exists).

A request answered 202 whose job then failed on a check the request could have made (a resume with other options,
the source as its own target, a field the source does not have, an ``index`` the engine ignores) told its client
only by polling. Each check names the CLI's flag (``json_fields`` False) or the request's JSON field (True):

- :func:`check_names`: the source is not the target;
- :func:`check_index`: ``--index`` / ``index`` other than ``like`` is a PostgreSQL target's only (Milvus and Qdrant
  targets take the source's own index: it was ignored there);
- :func:`check_source_fields`: the source exists and has the id / vector fields (and a text field that was named);
- :func:`check_resume`: a checkpoint of an unfinished run records the same options (what the CLI checked as it
  loaded the checkpoint; the HTTP job checked it minutes later, so the route answered 202 and the job failed), and
  a checkpoint of any run the store's engine (:func:`check_engine`, 409 naming both engines);
- :func:`check_target`: a fresh run's target does not exist unless ``overwrite`` (and no alias serves it even then),
  is no alias itself, and ``alias`` names no collection (409);
- :func:`check_map_space`: the space the source records (or ``source_space`` declares) is the one the map reads: a map
  the wrong way round is a 422 naming ``map``; made before the width check (a map the wrong way round between
  spaces of different widths is that, not "a map for another model");
- :func:`check_map_width`: the source's vectors are as wide as the map's input (a map for another model: 422 naming
  ``map``);
- :func:`check_keep_matches`: a checkpoint written with a keep set (the re-embedded rows, ``keep`` /
  ``--keep-ids``) is resumed with the same one, and one written without with none (409 naming ``keep``).

:func:`check_source_fields` serves ``POST /v1/verifications`` too (its ``collection`` and ``source``).

A request's job still makes every check (under the checkpoint's lock, :func:`service.vectordb.migrate`); these make
the ones the database answers at once (a schema, a record, one row) before a job exists.
"""

from __future__ import annotations

import inspect

from align.exceptions import DimensionMismatchError, InputError

from ..vectordb import (CheckpointMismatchError, CollectionExistsError, FileCheckpoint, SpaceMismatchError,
                        UnsupportedFieldError, VectorStore)
from ..vectordb.keep import KEEP_WORDS, KeepSet, check_keep_resume
from ..vectordb.migrate import is_artifact_path

__all__ = ["HTTP_CKPT", "check_engine", "check_index", "check_keep_matches", "check_map_space", "check_map_width",
           "check_names", "check_resume", "check_source_fields", "check_target", "compare_as_resolved",
           "engine_defaults", "is_postgres_url", "map_spaces", "option_name", "resume_options"]

#: the fields a store is opened with, as the CLI and a request name them
FIELDS = ("id_field", "vector_field", "text_field")


def option_name(key: str, json_fields: bool) -> str:
    """``--vector-field`` on the command line, ``vector_field`` in a request."""
    return key if json_fields else "--" + key.replace("_", "-")


def check_names(source: str, target: str, *, json_fields: bool = False) -> None:
    """InputError when ``target`` is ``source``: a migration writes a new collection beside the source."""
    if source == target:
        raise InputError(f"{option_name('target', json_fields)} {target!r} is the {option_name('source', json_fields)}:"
                         " a migration writes its rows into a new collection beside the source (then let "
                         f"{option_name('alias', json_fields)} switch readers to it); name another target")


def is_postgres_url(store_url) -> bool:
    """Whether ``store_url`` names a PostgreSQL store (the one engine whose target takes ``--index``)."""
    return str(store_url).lower().startswith(("postgresql://", "postgres://"))


def check_index(store_url: str, index: str | None, *, json_fields: bool = False) -> None:
    """InputError for an index kind (``hnsw``, ``ivfflat``, ``none``) given for a store that is not PostgreSQL: Milvus
    and Qdrant targets are made with the source's own index (its kind and build parameters), and the option was
    ignored there. Refused rather than honoured: the source's index is the recall / speed trade-off its owner chose,
    which the alias switch keeps; to change it, change the target's index after the migration."""
    if index in (None, "like") or is_postgres_url(store_url):
        return
    engine = str(store_url).split("://", 1)[0].split("+", 1)[0].lower()
    opt = option_name("index", json_fields)
    raise InputError(f"{opt} {index!r} is for a PostgreSQL target; a {engine} target is made with the source "
                     f"collection's own index (its kind and build parameters, e.g. HNSW M / efConstruction), so "
                     f"{opt} {index} would be ignored: leave {opt} out (or give like), and change the target's index "
                     "after the migration if you want another")


def check_source_fields(store: VectorStore, source: str, given: dict, *, json_fields: bool = False,
                        role: str = "source") -> None:
    """The source exists (CollectionNotFoundError) and has the id and vector fields ``store`` was opened with, and the
    text field where one was named (``given``: the options as the caller gave them; a default text field the source
    lacks is a collection without texts): InputError naming the option and the fields the source has. A payload key
    (Qdrant's text field, a Milvus dynamic key) is looked for in the source's first rows
    (:meth:`~service.vectordb.VectorStore.missing_fields`). ``role``: what the collection is to the caller, for
    the message (a migration's ``source``; a verification's ``collection`` or ``source``)."""
    missing = store.missing_fields(source)
    for key in FIELDS:
        if key not in missing or (key == "text_field" and given.get(key) is None):
            continue
        value = getattr(store, key)
        what = key.replace("_", " ")
        how = (f"name it with {option_name(key, json_fields)}" if given.get(key) is None else
               f"fix {option_name(key, json_fields)}")
        raise InputError(f"{store.engine}: {role} {source!r} has no {what} {value!r}"
                         f"{' (the default)' if given.get(key) is None else ''}; it has {missing[key]}: {how}")


def engine_defaults(store: VectorStore) -> dict:
    """The field names ``store``'s engine uses when none is given (its constructor's defaults)."""
    params = inspect.signature(type(store).__init__).parameters
    return {k: params[k].default if k in params else getattr(type(store), k, None) for k in FIELDS}


def compare_as_resolved(ckpt, store: VectorStore) -> None:
    """Have checkpoint ``ckpt`` compare a resume's options with the recorded ones as they resolve on ``store``'s
    engine: an unset index is ``like``, an unset field the engine's default (its constructor's, not this store's:
    those are the resume's own options where it gave them). On Milvus and Qdrant a recorded index is ``like``: a
    run of an older release recorded the ``--index hnsw`` it was given there and ignored it (the target took the
    source's index), and its resume, refused any kind but ``like`` now (:func:`check_index`), had no way on."""
    ckpt.resolve_options(index="like", **engine_defaults(store))
    if store.engine != "pgvector":
        ckpt.compare_recorded_as(index="like")


def resume_options(*, alias=None, index=None, id_field=None, vector_field=None, text_field=None, source_space=None,
                   target_space=None) -> dict:
    """The options a run records in its checkpoint that a resume must give again (compared by
    :meth:`~service.vectordb.FileCheckpoint.load`)."""
    return {"alias": alias, "index": index, "id_field": id_field, "vector_field": vector_field,
            "text_field": text_field, "source_space": source_space, "target_space": target_space}


def check_resume(store: VectorStore, checkpoint, source: str, options: dict, *, map_target_space: str | None,
                 keep: KeepSet | None = None, json_fields: bool = False) -> None:
    """CheckpointMismatchError (409, exit 2) when the checkpoint file ``checkpoint`` is of an unfinished run given
    other ``options`` (:func:`resume_options`), each compared as it resolves: an unset index is ``like``, an unset
    field the engine's default, an unset space the map's target / the source's recorded one (as the run compares
    them); or of any run (finished too, as the run compares it) on another engine than ``store``'s
    (:func:`check_engine`, first) or given another keep set than ``keep`` (:func:`check_keep_matches`). No
    checkpoint: nothing to compare."""
    ckpt = FileCheckpoint(checkpoint, options=options, json_fields=json_fields)
    if not ckpt.path.exists():
        return
    check_engine(FileCheckpoint(checkpoint).load(), store, json_fields=json_fields)  # before its options are read
    compare_as_resolved(ckpt, store)
    ckpt.resolve_options(target_space=map_target_space, source_space=store.get_space(source))
    check_keep_matches(ckpt.load(), keep, json_fields=json_fields)


#: what an HTTP client does where the CLI passes ``--checkpoint FILE``: a request's checkpoint is the data dir's default
HTTP_CKPT = ("migrate into another target name (a request's checkpoint is always the data dir's "
             "migrations/SOURCE-to-TARGET.json)")


def check_engine(state: dict | None, store: VectorStore, *, json_fields: bool = False) -> None:
    """CheckpointMismatchError (409, exit 2) when checkpoint ``state`` records a run on another engine than
    ``store``'s (the default checkpoint is named by collections only: the same names migrated in another store), as
    the run refuses it (:func:`service.vectordb.migrate`; a request answered 202 and its job failed). A checkpoint
    of a release that recorded no engine: nothing to compare."""
    engine = (state or {}).get("engine")
    if engine is None or engine == store.engine:
        return
    how = HTTP_CKPT if json_fields else "pass --checkpoint FILE for this one"
    raise CheckpointMismatchError(
        f"checkpoint records a migration on {engine}, and this store is {store.engine}: a migration of the same "
        f"collection names elsewhere (the default checkpoint is named by collections only)? {how}, or remove that "
        "checkpoint if its run is of no use")


def check_keep_matches(state: dict | None, keep: KeepSet | None, *, json_fields: bool = False) -> None:
    """CheckpointMismatchError (409, exit 2) when checkpoint ``state`` was written with another keep set than
    ``keep`` (:func:`service.vectordb.keep.keep_set` of the ids and vectors given), with one while ``keep`` is
    None, or without one while ``keep`` is given: the run refused it under its lock (a request answered 202 and its
    job failed). Named as the face names the set (``keep`` over HTTP, ``--keep-ids / --keep-vectors``)."""
    check_keep_resume(state, keep, *KEEP_WORDS["http" if json_fields else "cli"])


def check_target(store: VectorStore, source: str, target: str, *, alias: str | None, overwrite: bool,
                 fresh: bool, json_fields: bool = False) -> None:
    """CollectionExistsError (409, exit 2) for what a run refuses at its start about ``target`` and ``alias`` (as
    :func:`service.vectordb.migrate` does): ``target`` an alias (of a collection); ``alias`` a collection's name (or
    the source's or target's); and, for a ``fresh`` run (no checkpoint to resume), an existing ``target`` without
    ``overwrite``, or one an alias serves even with it (the drop would take the alias down with it)."""
    def opt(key: str) -> str:
        return option_name(key, json_fields)

    behind = store.resolve_alias(target)
    if behind is not None:
        raise CollectionExistsError(f"{store.engine}: {opt('target')} {target!r} is an alias (of {behind!r}); migrate "
                                    f"into a new collection and give {opt('alias')} {target} to switch it")
    if alias is not None and (alias in (source, target) or store.exists(alias)):
        raise CollectionExistsError(f"{store.engine}: {opt('alias')} {alias!r} names a collection (or this "
                                    "migration's source or target), so it cannot be switched to the target; "
                                    f"choose another {opt('alias')}")
    if not fresh or not store.exists(target):
        return
    if not overwrite:
        how = "pass --overwrite (overwrite=True)" if not json_fields else "send overwrite: true"
        raise CollectionExistsError(f"{store.engine}: {opt('target')} {target!r} exists; {how} to drop it, or "
                                    f"choose another {opt('target')}")
    serving = store.aliases_of(target)
    if serving:
        raise CollectionExistsError(f"{store.engine}: {opt('target')} {target!r} is what alias(es) "
                                    f"{', '.join(serving)} serve; {opt('overwrite')} would drop it and them with it: "
                                    f"migrate into another {opt('target')} and let {opt('alias')} switch")


def check_map_space(store: VectorStore, source: str, declared: str | None, map_ref: str, map_src: str | None,
                    map_tgt: str | None, *, json_fields: bool = False) -> None:
    """SpaceMismatchError (422, exit 2) when the space ``source`` records, or the one ``declared``
    (``--source-space`` / ``source_space``), is not ``map_src``, the space map ``map_ref`` reads (a map the wrong way
    round when it is the map's target ``map_tgt``), or when the two disagree. Where none of them is known it is the
    run's to check (its first rows, :func:`service.vectordb.migrate.check_rows_space`)."""
    recorded = store.get_space(source)
    declared_opt, map_opt = option_name("source_space", json_fields), option_name("map", json_fields)
    if recorded and declared and recorded != declared:
        raise SpaceMismatchError(f"{source!r} records space {recorded!r} but {declared_opt} says {declared!r}: fix "
                                 f"{declared_opt} (or leave it out)")
    have, said = (recorded, f"{source!r} records space") if recorded else (declared, f"{declared_opt} says")
    if not have or not map_src or have == map_src:
        return
    way = (f"the map the wrong way round (it maps {map_src!r} to {map_tgt!r})" if have == map_tgt else
           "a map for another model")
    raise SpaceMismatchError(f"{said} {have!r} but {map_opt} {map_ref!r} reads {map_src!r}: {way}; give "
                             f"{map_opt} a map from {have!r}")


def map_spaces(map_ref, registry) -> tuple[str | None, str | None]:
    """``(source space, target space)`` of a registry map ``map_ref`` (its version's record, no artifact read);
    ``(None, None)`` for a map object or an artifact file (the run checks what it can of those)."""
    if not hasattr(registry, "resolve") or not isinstance(map_ref, str) or is_artifact_path(map_ref):
        return None, None
    v = registry.resolve(map_ref)
    return v.source_space, v.target_space


def check_map_width(store: VectorStore, source: str, map_ref, map_dim: int | None, *,
                    json_fields: bool = False) -> None:
    """DimensionMismatchError (422, exit 2) when the vectors of ``source`` (its vector field, as ``store`` was opened)
    are not ``map_dim`` wide, the rows map ``map_ref`` reads: a map for another model (the run refused it under its
    lock, a request's in a job that failed). ``map_dim`` None (not known yet): the run checks it. A source whose
    width cannot be told (an empty table's vector column declared without a size): UnsupportedFieldError (422,
    exit 2) naming ``vector_field`` / ``--vector-field``."""
    if map_dim is None:
        return
    try:
        have = store.dim(source)
    except UnsupportedFieldError as exc:  # its width untold (an empty table's unsized column): named as the face does
        if not json_fields:
            raise
        raise UnsupportedFieldError(str(exc).replace("--vector-field", "vector_field")) from None
    if have == int(map_dim):
        return
    opt = option_name("map", json_fields)
    field = f" (vector field {store.vector_field!r})" if store.vector_field else ""
    raise DimensionMismatchError(f"{store.engine}: source {source!r} holds {have}-d vectors{field} but {opt} "
                                 f"{str(map_ref)!r} reads {int(map_dim)}-d rows: a map for another model; give {opt} "
                                 f"a map from the source's {have}-d space")
