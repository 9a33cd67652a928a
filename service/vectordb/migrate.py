"""Migrate a stored collection from space A to space B through a linear map, resumably.

For every stored row ``x`` (raw A vector) the new collection gets

.. math::  y = \\mathrm{raw}_B\\big(f_A(x)\\, W + b\\big)

i.e. ``map_.apply(X, output="raw")``: comparable with raw B vectors, so new-model queries search
it directly. Rows are read in ascending id order, ``batch_size`` at a time, transformed, and
upserted into ``target`` under the same ids with **every other field** of the row (text and any
extra field; a field that cannot travel — another vector field, a column type without a binary
copy — makes the migration refuse at the start, naming it); after each batch the checkpoint
records the id range done.

Spaces: when the source collection records its embedding space, or the caller declares it
(``source_space``), it must be the map's source space (from the registry version, or the map's
metadata), else :class:`SpaceMismatchError` — a same-dimension map the wrong way round (e5→minilm
on a MiniLM collection) is refused. When neither is known (a collection vecbridge did not make records no space,
and no ``source_space`` was given), the first rows are checked instead (:func:`check_rows_space`), before anything
is written: their mean direction against the map's source frame mean (:meth:`align.Frame.mean_cosine`), and when
that is below :data:`align.frames.SAME_SPACE_CHECKED_COSINE`, against its target frame's: rows that look like the map's
target space are refused (a map the wrong way round); rows neither side recognises (one narrow topic, another
model) pass, "unchecked by rows" in the report (from :data:`align.frames.SAME_SPACE_MIN_COSINE` up: "may be from
another model", as a related model's rows score). The target records the map's target space.

Metric: the target ranks as the source does (``metric=None``): an inner-product (``ip``) collection gives an ``ip``
target, so searches that name the metric keep working after the alias switch; a metric the adapters cannot create
(L2 / Euclid) gives a cosine target. The map writes unit rows either way: the row norms an ``ip`` or L2 source ranks
by are not carried, so the target ranks its rows as cosine would. The report (and a dry run) says so in ``warnings``
whenever the source's metric is not cosine; ``extra["metric"]`` is the target's.

Stopping: ``should_stop()`` is polled after each checkpointed batch; when it answers True the
run ends with :class:`MigrationInterrupted` (rows so far are written and recorded; run again to
resume). A resumed run continues after ``last_id``; a batch written but not
yet recorded is rewritten, and the idempotent upsert keeps one row per id. At the end the target
is finalised (flush / index / load) and, when ``alias`` is given, the alias is switched to it
(natively in Milvus and Qdrant; a view in PostgreSQL).

Kept rows: ``keep_ids`` / ``keep_vectors`` name the rows the migration re-embedded (to fit its map) and their
new-model vectors; those rows are written with their own vectors, not mapped ones (:mod:`.keep`). The checkpoint
records the set's digest: a resume with another set is refused.

Memory: one batch of ``batch_size × (d_A + d_B)`` floats; with a keep set, that set too (K ids and K × d_B floats).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from align.exceptions import Cancelled, DimensionMismatchError, InputError
from align.chain import MapChain
from align.cluster import ClusterMap
from align.frames import MEAN_CHECK_MIN_NORM, MEAN_CHECK_MIN_ROWS, SAME_SPACE_CHECKED_COSINE, SAME_SPACE_MIN_COSINE
from align.maps import LinearMap, load_map

from .base import (METRICS, CheckpointMismatchError, CollectionExistsError, CollectionNotFoundError,
                   SpaceMismatchError, UnsupportedFieldError, VectorDBError, VectorStore, check_metric, check_name,
                   id_key)
from ..spaces import SPACE_SAMPLE_ROWS, Reference, judge_rows
from .checkpoint import Checkpoint, MemoryCheckpoint
from .holder import this_process
from .keep import KEEP_WORDS, KeepSet, check_keep_resume, keep_set
from .migrate_notes import (LOCAL_QDRANT_SLOW, NULLS_DROPPED_BEFORE, SOURCE_CHANGED, SOURCE_CHANGED_SINCE,
                            check_vectors, metric_notes)

__all__ = ["migrate", "resolve_map", "map_spaces", "map_source_dim", "is_artifact_path", "map_fingerprint",
           "MigrationProgress", "MigrationReport", "MigrationInterrupted"]

MAP_TYPES = (LinearMap, ClusterMap, MapChain)  # anything with apply(X, output=...), source_dim, target_dim


class MigrationInterrupted(Cancelled, VectorDBError):
    """The run was asked to stop (Ctrl-C); every batch so far is written and checkpointed."""

    def __init__(self, message: str, done: int, total: int):
        super().__init__(message)
        self.done, self.total = done, total


def resolve_map(map_or_ref, registry=None) -> LinearMap | ClusterMap | MapChain:
    """A map (LinearMap, ClusterMap or MapChain) from a map, an artifact path (``.npz`` / ``.safetensors``,
    read by its header: :func:`align.load_map`) or a registry ref.

    ``registry`` is anything with ``load_map(ref)`` (``service.registry.open_registry(...)``; its
    ``resolve(ref)`` also gives the map's spaces, see :func:`map_spaces`).
    """
    if isinstance(map_or_ref, MAP_TYPES):
        return map_or_ref
    if isinstance(map_or_ref, (str, Path)):
        p = Path(map_or_ref)
        if is_artifact_path(p):
            return load_map(p)
        if registry is not None:
            return registry.load_map(str(map_or_ref))
        raise InputError(f"{map_or_ref!r} is neither a map artifact on disk nor resolvable without a registry")
    raise InputError(f"expected a map (LinearMap, ClusterMap, MapChain), an artifact path or a registry ref, "
                     f"got {type(map_or_ref).__name__}")


def is_artifact_path(map_or_ref) -> bool:
    return isinstance(map_or_ref, (str, Path)) and Path(map_or_ref).suffix in (".npz", ".safetensors") \
        and Path(map_or_ref).exists()


def map_label(map_or_ref, registry=None) -> str | None:
    """What a checkpoint records of the map besides its fingerprint: the registry version a ref means now
    (``NAME:N``), an artifact's path (made absolute: the resume command may run in another directory), or None for
    a map object."""
    if hasattr(registry, "resolve") and isinstance(map_or_ref, str) and not is_artifact_path(map_or_ref):
        return registry.resolve(map_or_ref).ref
    if is_artifact_path(map_or_ref):
        return str(Path(map_or_ref).resolve())
    return str(map_or_ref) if isinstance(map_or_ref, (str, Path)) else None


def map_spaces(map_or_ref, registry=None) -> tuple[str | None, str | None]:
    """``(source space, target space)`` of a map: from its registry version, or its metadata; None when unknown."""
    if hasattr(registry, "resolve") and isinstance(map_or_ref, str) and not is_artifact_path(map_or_ref):
        v = registry.resolve(map_or_ref)
        return v.source_space, v.target_space
    if isinstance(map_or_ref, MAP_TYPES):
        md = map_or_ref.metadata or {}
        return md.get("source_space"), md.get("target_space")
    return None, None


def map_source_dim(map_or_ref, registry=None) -> int | None:
    """The width of the rows a map reads: its registry version's (read without its artifact), a map object's, or an
    artifact file's; None where it cannot be told before the run resolves the map (which refuses what it cannot)."""
    if hasattr(registry, "resolve") and isinstance(map_or_ref, str) and not is_artifact_path(map_or_ref):
        return int(registry.resolve(map_or_ref).source_dim)
    if isinstance(map_or_ref, MAP_TYPES):
        return int(map_or_ref.source_dim)
    return int(load_map(Path(map_or_ref)).source_dim) if is_artifact_path(map_or_ref) else None


def check_spaces(store: VectorStore, source: str, declared: str | None, map_src: str | None, map_=None,
                 option: str = "--source-space") -> str:
    """Refuse a map whose source space is not the collection's; returns how the check went (for the report).

    With ``map_``, a collection that records no space, when none is ``declared``, has its first rows checked
    (:func:`check_rows_space`). ``option``: how the caller declares the space, for the messages."""
    recorded = store.get_space(source)
    have = [(f"{source!r} records space", recorded), (f"{option} says", declared), ("the map reads", map_src)]
    known = [(w, v) for w, v in have if v]
    for (w1, v1), (w2, v2) in zip(known, known[1:]):
        if v1 != v2:
            raise SpaceMismatchError(f"{w1} {v1!r} but {w2} {v2!r}: a map the wrong way round or for another "
                                     "model; use the map from that space"
                                     + (f" (or fix {option})" if declared else ""))
    if recorded and map_src:
        return f"checked: {recorded}"
    if declared and map_src:
        return f"checked against {option}: {declared}"
    if recorded or declared:  # the collection's side is known: it is the map that names no space
        return f"unchecked: the map names no source space ({known[0][0]} {known[0][1]!r})"
    if map_src:  # the map's side is known: it is the collection that records none (and no --source-space)
        unchecked = f"unchecked: {source!r} records no space and no {option} was given (the map reads {map_src!r})"
    else:
        unchecked = "unchecked: neither the collection nor the map names its space"
    return unchecked if map_ is None else check_rows_space(store, source, map_, map_src, unchecked, option)


def check_rows_space(store: VectorStore, source: str, map_, map_src: str | None, unchecked: str,
                     option: str = "--source-space") -> str:
    """The direction check of a collection that records no space (and no ``source_space``): its first
    :data:`SPACE_SAMPLE_ROWS` rows (finite ones) against the map's frames, by :func:`service.spaces.judge_rows`.

    Rows of the map's source space give a cosine ``c_src`` of about 0.9 with its source frame, but rows of one narrow
    topic (a collection whose first rows are one or two documents) can give less than
    :data:`align.frames.SAME_SPACE_MIN_COSINE`, as rows of another model do, so a low ``c_src`` alone refuses
    nothing. A map the wrong way round is told by its other side: when the map's target frame has the source's width,
    rows that look like the map's TARGET space (``c_tgt = target_frame.mean_cosine(rows)`` above both ``c_src`` and
    the threshold, while ``c_src`` is below it) are a SpaceMismatchError whose hint names ``option`` (the caller's
    way to declare the space: ``--source-space`` on the command line, ``source_space`` over HTTP). A map whose
    widths differ cannot be the wrong way round here (the dimension check refuses it first). Any other low ``c_src``
    (a narrow topic, another model: neither frame recognises the rows) is "unchecked by rows: ..." in the report, as
    is ``unchecked`` (what the names left) when the rows cannot tell at all; "checked by rows: ..." otherwise."""
    what = f"like space {map_src!r} the map reads" if map_src else "like the rows the map was fitted on"
    scan = store.scan(source, batch_size=SPACE_SAMPLE_ROWS, with_texts=False)
    try:
        batch = next(scan, None)
    finally:
        scan.close()
    V = np.empty((0, map_.source_dim), np.float32) if batch is None else batch.vectors
    V = V[np.isfinite(V).all(axis=1)]  # a NaN row is refused by name when its batch is migrated
    tgt = map_.target_frame
    verdict = judge_rows(V, [map_.source_frame], [Reference(None, tgt, "its target side")] if len(V) else [],
                         name=f"{source!r} rows")
    cos = verdict.own
    if cos is None:
        mean = map_.source_frame.mean
        why = (f"fewer than {MEAN_CHECK_MIN_ROWS} rows to compare"
               if mean is not None and float(np.linalg.norm(mean)) >= MEAN_CHECK_MIN_NORM else
               "the map's training rows share no common direction to compare with")
        return f"{unchecked}; its rows cannot tell either: {why}"
    side = f"source {map_src!r}" if map_src else "training rows"
    if verdict.checked:
        return f"checked by rows: mean direction cosine {cos:.2f} with the map's {side}"
    space = map_src or "SPACE"
    if verdict.other is not None:
        raise SpaceMismatchError(
            f"the rows of {source!r} do not look {what}: their mean direction has cosine {cos:.2f} with the map's "
            f"training rows but {verdict.other_cos:.2f} with those of its target side (rows of a space give about 0.9 "
            f"with its own): a map the wrong way round? Use the map in the other direction; if the collection really "
            f"is in {map_src or 'the space the map reads'}, say so with {option} {space}")
    c_tgt = verdict.seen[0][1] if verdict.seen else None
    tgt_fig = f" and {c_tgt:.2f} with its target side" if c_tgt is not None else ""
    if verdict.maybe_other_model:  # a related model's rows score here (paraphrase-L3 through a MiniLM map: 0.37)
        return (f"unchecked by rows: the rows may be from another model: mean direction cosine {cos:.2f} with the "
                f"map's {side}{tgt_fig}, where rows of that space give ~0.9 (below {SAME_SPACE_CHECKED_COSINE}: a "
                f"related model, or one narrow topic; {option} {space} declares the space); "
                f"{unchecked.removeprefix('unchecked: ')}")
    return (f"unchecked by rows: mean direction cosine {cos:.2f} with the map's {side}{tgt_fig}"
            + f" (below {SAME_SPACE_MIN_COSINE}: rows of one narrow topic, or of another model; {option} {space} "
            f"declares the space); {unchecked.removeprefix('unchecked: ')}")


def map_fingerprint(map_) -> str:
    """sha256 of everything that changes the map's output: W, bias, both frames (a LinearMap; unchanged for
    checkpoints written before other kinds existed), plus centroids, blend and temperature (a ClusterMap);
    for a MapChain, the sequence of its steps' fingerprints."""
    if isinstance(map_, MapChain):
        return hashlib.sha256(("chain:" + ",".join(map_fingerprint(s) for s in map_.steps)).encode()).hexdigest()
    if not isinstance(map_, (LinearMap, ClusterMap)):
        raise InputError(f"cannot fingerprint a {type(map_).__name__}")
    h = hashlib.sha256()
    for arr in (map_.W, map_.bias, map_.source_frame.mean, map_.target_frame.mean):
        h.update(b"-" if arr is None else np.ascontiguousarray(arr, np.float32).tobytes())
    h.update(json.dumps([map_.source_frame.to_meta(), map_.target_frame.to_meta()], sort_keys=True).encode())
    if isinstance(map_, ClusterMap):
        h.update(np.ascontiguousarray(map_.centroids, np.float32).tobytes())
        h.update(json.dumps({"kind": "cluster", "blend": map_.blend, "temperature": map_.temperature}).encode())
    return h.hexdigest()


@dataclass
class MigrationProgress:
    """Handed to the progress callback after each batch."""

    source: str
    target: str
    done: int            # rows written so far (all runs together)
    total: int           # rows in the source at the start of this run
    batches: int
    last_id: int | str | None  # str: a UUID point id (Qdrant)
    elapsed_s: float     # this run
    rows_per_s: float    # this run
    stage: str = "migrate"  # "index": every row written, the target's index being built (no fraction to tell)

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 1.0


@dataclass
class MigrationReport:
    """What a call to :func:`migrate` did."""

    engine: str
    source: str
    target: str
    alias: str | None
    rows: int                 # rows in the target after the run
    rows_this_run: int
    resumed_from: int | str | None  # last_id found in the checkpoint, None for a fresh start
    batches: int
    seconds: float
    map_fingerprint: str
    already_finished: bool = False
    extra: dict = field(default_factory=dict)
    kept: int | None = None            # rows written with their own new-model vectors (all runs); None: no keep set
    keep_not_found: int | None = None  # ids of the keep set no row of the source had (at the end), None: no keep set

    def to_dict(self) -> dict:
        return asdict(self)


def _fresh_state(source, target, fp, total, label: str | None = None, engine: str | None = None) -> dict:
    """A new run's checkpoint state; ``engine``: the store's (``milvus``, ``pgvector``, ``qdrant``), recorded so that
    ``migrate --status`` and ``GET /v1/migrations`` tell a PostgreSQL run's ``--index`` from an older release's
    ignored one without being told the store."""
    return {"source": source, "target": target, "map_fingerprint": fp, "first_id": None, "last_id": None,
            "done": 0, "batches": 0, "total": int(total), "finished": False, "started_at": time.time(),
            "nulls": "kept", **({"map": label} if label else {}), **({"engine": engine} if engine else {})}


def migrate(store: VectorStore, source: str, target: str, map_, *, alias: str | None = None,
            batch_size: int = 2000, checkpoint: Checkpoint | None = None,
            progress: Callable[[MigrationProgress], None] | None = None, metric: str | None = None,
            overwrite: bool = False, registry=None, source_space: str | None = None,
            target_space: str | None = None, should_stop: Callable[[], bool] | None = None,
            dry_run: bool = False, space_option: str = "source_space", keep_ids=None,
            keep_vectors=None, keep_words: tuple[str, str] = KEEP_WORDS["python"]) -> MigrationReport:
    """Write ``map_(source)`` into a new collection ``target`` (same ids and texts), then switch ``alias``.

    Parameters
    ----------
    store : VectorStore
        An engine adapter (Milvus, pgvector, Qdrant).
    source, target : str
        Collection names; ``source`` holds raw A vectors (d_A = ``map_.source_dim``).
    map_ : LinearMap, ClusterMap, MapChain or str
        The A→B map, an artifact path, or a registry ref (with ``registry``).
    alias : str, optional
        Switched to ``target`` once every row is written and the target is finalised.
    batch_size : int
        Rows per read/transform/upsert step (and per checkpoint).
    checkpoint : Checkpoint, optional
        Where progress is recorded (:class:`FileCheckpoint`, :class:`PgCheckpoint`); without one
        the migration cannot resume after a crash.
    progress : callable, optional
        Called with a :class:`MigrationProgress` after every batch.
    metric : str, optional
        The new target's metric (cosine or ip); default the source's (cosine for one adapters cannot create, as L2).
        See the module docs: a source that does not rank by cosine gets a warning in the report.
    overwrite : bool
        Drop an existing ``target`` before a fresh start (never when resuming).
    source_space, target_space : str, optional
        Declared spaces (checked against the collection's record and the map's; the target space
        is recorded on ``target``). Default: the map's, when it comes from the registry.
    should_stop : callable, optional
        Polled after each checkpointed batch; True ends the run with MigrationInterrupted.
    dry_run : bool
        Make every check a run makes (the same refusals), read and map one batch, and write nothing: no
        target, no checkpoint, no alias. The report's ``extra`` says what a run would do (``start``: create,
        drop (``overwrite``), resume or finished), ``rows_to_write``, and the sample's read and map times.
    space_option : str
        How the caller declares ``source_space`` (this parameter's name by default; ``--source-space`` on the command
        line), named in the space check's refusals and report (and ``target_space`` as that face names it).
    keep_ids, keep_vectors : array-like, optional
        Both or neither: the ids (K,) of rows re-embedded with the new model and their vectors (K, d_B), in the ids'
        order. Those rows get their own vectors instead of mapped ones (:mod:`service.vectordb.keep`: checked before
        anything is written; held in memory, fine for K up to ~1e6). ``report.kept`` counts them;
        ``report.keep_not_found`` the ids no source row had (deleted since?), which is no error.
    keep_words : (str, str)
        How the caller names the keep set and the run, in a refusal (:data:`service.vectordb.keep.KEEP_WORDS`): these
        parameters and "this call" by default; the CLI passes its flags, the HTTP service its request's field.

    Raises
    ------
    CollectionNotFoundError, CollectionExistsError, CheckpointMismatchError, DimensionMismatchError,
    SpaceMismatchError, UnsupportedFieldError, MigrationInterrupted, MigrationRunningError (another run of the
    same checkpoint is writing now)
    """
    checkpoint = checkpoint if checkpoint is not None else MemoryCheckpoint()
    kw = {"alias": alias, "batch_size": batch_size, "checkpoint": checkpoint, "progress": progress, "metric": metric,
          "overwrite": overwrite, "registry": registry, "source_space": source_space, "target_space": target_space,
          "should_stop": should_stop, "dry_run": dry_run, "space_option": space_option, "keep_words": keep_words,
          "keep": None if keep_ids is None and keep_vectors is None else (keep_ids, keep_vectors)}
    if dry_run:  # writes nothing, so it neither waits for nor blocks a run of the same checkpoint
        return _migrate(store, source, target, map_, **kw)
    with checkpoint.lock():
        return _migrate(store, source, target, map_, **kw)


def _start(store: VectorStore, state: dict | None, source: str, target: str, fp: str, overwrite: bool,
           label: str | None = None) -> str:
    """What a run does first: ``"resume"`` or ``"finished"`` (a checkpoint), ``"drop"`` (an existing target,
    ``overwrite``) or ``"create"``; raises the refusals (a checkpoint of another migration, a target that exists
    or that an alias serves, a finished target holding fewer rows than the checkpoint wrote)."""
    if state is not None:
        for key, want in (("source", source), ("target", target)):
            if state.get(key) != want:
                raise CheckpointMismatchError(
                    f"checkpoint is for {key}={state.get(key)!r}, this migration has {want!r}; clear it or use another")
        if state.get("map_fingerprint") != fp:
            was = f"map {state['map']}" if state.get("map") else "another map"
            now = f"this run's map ({label})" if label else "this run's map"
            raise CheckpointMismatchError(
                f"the checkpoint was written with {was}; {now} differs (a name or alias that moved since?): pass "
                f"{state['map'] if state.get('map') else 'that map'} to resume, or remove the checkpoint to start over")
        engine = state.get("engine")  # None: a checkpoint of a release that did not record it
        if engine is not None and engine != store.engine:
            raise CheckpointMismatchError(
                f"checkpoint records a migration on {engine}, and this store is {store.engine}: a migration of the "
                "same collection names elsewhere (the default checkpoint is named by collections only)? pass "
                "--checkpoint FILE for this one, or remove that checkpoint if its run is of no use")
        if not store.exists(target):  # e.g. the same names migrated in another store before: the default
            # checkpoint is named by collections only, and --overwrite cannot help (the checkpoint, not the target)
            raise CheckpointMismatchError(
                f"checkpoint records progress into {target!r}, which does not exist in this store: a migration of "
                "the same collection names elsewhere (the default checkpoint is named by collections only)? pass "
                "--checkpoint FILE for this one, or remove that checkpoint if its target was dropped")
        held = store.count(target) if state["finished"] else None
        if held is not None and held < int(state["done"]):
            raise CheckpointMismatchError(
                f"checkpoint records {int(state['done'])} rows written into {target!r}, which holds "
                f"{held}: the checkpoint is of a migration in another store (the default checkpoint "
                f"is named by collections only: pass --checkpoint), or the target lost rows; nothing was switched")
        return "finished" if state["finished"] else "resume"
    if not store.exists(target):
        return "create"
    if not overwrite:
        raise CollectionExistsError(f"{store.engine}: target {target!r} exists; pass --overwrite "
                                    "(overwrite=True) to drop it, or choose another --target")
    serving = store.aliases_of(target)
    if serving:
        raise CollectionExistsError(f"{store.engine}: target {target!r} is what alias(es) "
                                    f"{', '.join(serving)} serve; --overwrite would drop it and them "
                                    "with it: migrate into another --target and let --alias switch")
    return "drop"


def _fields_of(store: VectorStore, batch) -> set[str]:
    """The names a batch carries besides ids and vectors: fields, the text field, ``<name> (sparse vector)``."""
    return (set(batch.fields or ()) | ({store.text_field} if batch.texts is not None else set())
            | {f"{k} (sparse vector)" for k in batch.sparse or ()})


def _dry_run(store: VectorStore, source: str, target: str, map_, *, state, start: str, alias, batch_size: int,
             fp: str, extra: dict, t0: float) -> MigrationReport:
    """The report of :func:`migrate` ``dry_run=True``: one batch read and mapped (timed), nothing written."""
    total = store.count(source)
    after = state["last_id"] if state is not None else None
    t = time.perf_counter()
    scan = store.scan(source, after_id=after, batch_size=batch_size, with_fields=True)
    try:
        batch = None if start == "finished" else next(scan, None)
    finally:
        scan.close()
    read_s, map_s, n = time.perf_counter() - t, 0.0, 0
    if batch is not None:
        check_vectors(source, batch)
        t = time.perf_counter()
        map_.apply(batch.vectors, output="raw")
        map_s, n = time.perf_counter() - t, len(batch)
        extra["fields"] = sorted(_fields_of(store, batch))
    todo = 0 if start == "finished" else max(0, total - (int(state["done"]) if state is not None else 0))
    if store.engine == "qdrant" and getattr(store, "server_url", "") is None and todo:  # local mode
        extra["warnings"] = [*extra["warnings"], LOCAL_QDRANT_SLOW]
    extra.update(dry_run=True, start=start, rows_to_write=todo, sample_rows=n, sample_read_s=read_s,
                 sample_map_s=map_s, read_map_estimate_s=(read_s + map_s) * todo / n if n else 0.0)
    rows = store.count(target) if start in ("resume", "finished") else 0
    return MigrationReport(store.engine, source, target, alias, rows, 0, after,
                           int(state["batches"]) if state is not None else 0, time.perf_counter() - t0, fp,
                           already_finished=start == "finished", extra=extra)


def _migrate(store: VectorStore, source: str, target: str, map_, *, alias, batch_size, checkpoint: Checkpoint,
             progress, metric, overwrite, registry, source_space, target_space, should_stop,
             dry_run, space_option, keep, keep_words) -> MigrationReport:
    """:func:`migrate` (under the checkpoint's lock unless ``dry_run``)."""
    label = map_label(map_, registry)
    if isinstance(map_, str) and label:  # a registry ref pinned once: spaces, map and checkpoint of one version
        map_ = label
    map_src, map_tgt = map_spaces(map_, registry)
    map_ = resolve_map(map_, registry)
    map_src = map_src or (map_.metadata or {}).get("source_space")
    map_tgt = map_tgt or (map_.metadata or {}).get("target_space")
    if target_space and map_tgt and target_space != map_tgt:  # the target would record a space its rows are not in
        option = "--target-space" if space_option.startswith("--") else "target_space"
        raise SpaceMismatchError(f"{option} says {target_space!r} but the map writes {map_tgt!r}: the target would "
                                 "record a space its vectors are not in (query-side searches would skip the map); "
                                 f"leave {option} out or use the map into that space")
    map_tgt, maps_tgt = target_space or map_tgt, map_tgt
    check_name(source), check_name(target)
    if source == target:
        raise InputError("source and target must differ")
    if int(batch_size) < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    if metric is not None:
        check_metric(metric)
    behind = store.resolve_alias(target)
    if behind is not None:
        raise CollectionExistsError(f"{store.engine}: target {target!r} is an alias (of {behind!r}); migrate into "
                                    f"a new collection and pass --alias {target} to switch it")
    if alias is not None and (check_name(alias, "alias") in (source, target) or store.exists(alias)):
        raise CollectionExistsError(f"{store.engine}: alias {alias!r} names a collection (or this migration's "
                                    "source or target), so it cannot be switched to the target; "
                                    "choose another --alias")
    if not store.exists(source) and store.resolve_alias(source) is None:
        raise CollectionNotFoundError(f"{store.engine}: no source collection {source!r}")
    d_src = store.dim(source)
    if d_src != map_.source_dim:
        raise DimensionMismatchError(f"{source!r} holds {d_src}-d vectors, the map expects {map_.source_dim}-d")
    if keep is not None and (keep[0] is None or keep[1] is None):
        raise InputError(f"keeping re-embedded rows needs both their ids and their new-model vectors ({keep_words[0]})")
    keep = None if keep is None else keep_set(store, source, keep[0], keep[1], map_.target_dim)
    lost = store.unsupported_fields(source)
    if lost:
        raise UnsupportedFieldError(f"{store.engine}: {source!r} has field(s) a migration cannot carry over: "
                                    + "; ".join(lost))
    # may read rows: fields checked first
    space_check = check_spaces(store, source, source_space, map_src, map_, space_option)
    fp = map_fingerprint(map_)
    notes: list[str] = []
    # a resume that leaves out a space the first run gave as its default (the map's, the collection's) changes nothing
    checkpoint.resolve_options(target_space=maps_tgt, source_space=store.get_space(source))
    state = checkpoint.load()
    t0 = time.perf_counter()
    start = _start(store, state, source, target, fp, overwrite, label)
    check_keep_resume(state, keep, *keep_words)
    if state is not None and state.get("nulls") != "kept" and state["last_id"] is not None:
        notes = [NULLS_DROPPED_BEFORE.format(last=state["last_id"])]
    src_metric = store.metric(source)
    if start in ("resume", "finished"):  # the target the run that began it made
        metric = store.metric(target)
    elif metric is None:
        metric = src_metric if src_metric in METRICS else "cosine"
    notes += metric_notes(source, target, src_metric, metric)
    extra = {"space_check": space_check, "fields": sorted((state or {}).get("fields", [])), "warnings": notes,
             "target_index": store.target_index(source), "metric": metric,
             **({} if keep is None else {"keep_rows": len(keep)})}
    if dry_run:
        return _dry_run(store, source, target, map_, state=state, start=start, alias=alias, batch_size=batch_size,
                        fp=fp, extra={**extra, "target_space": map_tgt}, t0=t0)

    if state is not None:
        resumed_from = state["last_id"]
    else:
        if start == "drop":
            store.drop(target)
        store.create(target, map_.target_dim, metric=metric, like=source)
        state = _fresh_state(source, target, fp, store.count(source), label, store.engine)
        if keep is not None:  # the set's identity, as the map's: a resume with another set is refused
            state.update(keep_digest=keep.digest, keep_rows=len(keep), kept=0)
        checkpoint.save(state)
        resumed_from = None

    if state["finished"]:
        n_src, n_tgt = store.count(source), store.count(target)
        if n_src != n_tgt:  # the source changed after the migration finished: its new rows are not in the target
            changed = SOURCE_CHANGED_SINCE.format(source=source, n_src=n_src, target=target, n_tgt=n_tgt)
            if alias:
                raise CheckpointMismatchError(f"{changed}; alias {alias!r} was not switched: migrate again into a "
                                              "new --target and let --alias switch to it")
            notes.append(changed)
        if alias:
            store.set_alias(alias, target)
        # n_tgt as counted above: a pgvector count(*) is a scan of the table
        return MigrationReport(store.engine, source, target, alias, n_tgt, 0, resumed_from,
                               int(state["batches"]), time.perf_counter() - t0, fp, already_finished=True,
                               extra=extra, **_kept(state, keep))

    total = store.count(source)
    rows_run = 0
    fields_seen = set(state.get("fields", []))
    # this run's start, for --status's rate and ETA (not the first run's: time between runs is no work); holder: who
    # writes it, so that --status tells a run killed with kill -9 (it records no stop) from one still running
    state.update(run_started_at=time.time(), run_done_at_start=int(state["done"]), stopped_at=None,
                 holder=this_process(), engine=store.engine)  # engine: a checkpoint of a release before it, resumed
    checkpoint.save(state)
    try:
        for batch in store.scan(source, after_id=state["last_id"], batch_size=batch_size, with_fields=True):
            check_vectors(source, batch)
            Y = map_.apply(batch.vectors, output="raw")
            n_kept = 0
            if keep is not None:  # the re-embedded rows as they are
                Y, n_kept = keep.apply(batch.ids, Y)
            store.upsert(target, batch.ids, Y, batch.texts, batch.fields, sparse=batch.sparse)
            # counted once the batch is written, with it: a failed write (its state saved on the way out, exit 75)
            # counted its kept rows, and the resume counted them again
            if keep is not None:
                state["kept"] = int(state.get("kept", 0)) + n_kept
            rows_run += len(batch)
            fields_seen |= _fields_of(store, batch)
            state["fields"] = sorted(fields_seen)
            if state["first_id"] is None:
                state["first_id"] = id_key(batch.ids[0])
            state["last_id"] = id_key(batch.ids[-1])
            state["done"] += len(batch)
            state["batches"] += 1
            state["updated_at"] = time.time()
            checkpoint.save(state)
            stopped = MigrationInterrupted(f"stopped after {state['done']} of {total} rows (checkpointed at id "
                                           f"{state['last_id']}); run the same command again to resume",
                                           int(state["done"]), int(total))
            if progress is not None:
                el = time.perf_counter() - t0
                try:  # a job's progress raises Cancelled on a cancel: the same words as a stop seen below
                    progress(MigrationProgress(source, target, int(state["done"]), int(total), int(state["batches"]),
                                               state["last_id"], el, rows_run / el if el > 0 else 0.0))
                except Cancelled as exc:
                    raise stopped from exc
            if should_stop is not None and should_stop():
                raise stopped
        el = time.perf_counter() - t0
        _finalize(store, source, target, should_stop, int(state["done"]), int(total), None if progress is None else
                  lambda: progress(MigrationProgress(source, target, int(state["done"]), int(total),
                                                     int(state["batches"]), state["last_id"], el,
                                                     rows_run / el if el > 0 else 0.0, stage="index")))
        n_src, n_tgt = store.count(source), store.count(target)
        if n_src != n_tgt:  # the scan resumes after the last id written: a row written to the source meanwhile at an id
            # already passed (a random UUID lands there about as often as not), or one deleted from it, did not travel
            notes.append(SOURCE_CHANGED.format(source=source, n_src=n_src, target=target, n_tgt=n_tgt))
        if map_tgt:
            store.set_space(target, map_tgt)
        state["finished"] = True
        state["finished_at"] = time.time()
        checkpoint.save(state)
        if alias:
            store.set_alias(alias, target)
        rows = store.count(target)
    except BaseException:  # stopped (Ctrl-C, an error; in the scan, or in the finalize, space or alias switch after
        # it, which left --status saying "running, ETA 0s" with nothing running): --status says so, with no ETA
        state["stopped_at"] = time.time()
        with contextlib.suppress(Exception):
            checkpoint.save(state)
        raise
    extra["fields"] = sorted(fields_seen)
    extra["target_space"] = map_tgt
    return MigrationReport(store.engine, source, target, alias, rows, rows_run, resumed_from,
                           int(state["batches"]), time.perf_counter() - t0, fp, extra=extra, **_kept(state, keep))


def _finalize(store, source: str, target: str, should_stop, done: int, total: int,
              announce: Callable[[], None] | None = None) -> None:
    """``store.finalize`` (the index build: ~85% of a pgvector migration's time), stopped by a stop asked meanwhile:
    MigrationInterrupted, also when the engine could not cancel it (it ran to its end). A Ctrl-C there exited 0.
    ``announce()``: the progress report of stage "index" before it (the bar sat at 100 % through the build)."""
    stopped = MigrationInterrupted(f"stopped while building the index of {target} (all {done} of {total} rows "
                                   "written and checkpointed); run the same command again to build it", done, total)
    if should_stop is not None and should_stop():  # asked before the build began: none is started
        raise stopped
    if announce is not None:
        try:  # a job's progress raises Cancelled on a cancel
            announce()
        except Cancelled as exc:
            raise stopped from exc
    store.finalizing = True
    try:
        store.finalize(target, like=source)
    except Exception as exc:
        if should_stop is None or not should_stop():
            raise
        raise stopped from exc  # the build the stop cancelled
    finally:
        store.finalizing = False
    if should_stop is not None and should_stop():
        raise stopped


def _kept(state: dict, keep: KeepSet | None) -> dict:
    """The report's ``kept`` (rows written with their own vectors, every run) and ``keep_not_found`` (ids of the
    set no source row had): none without a keep set."""
    if keep is None:
        return {}
    kept = int(state.get("kept", 0))
    return {"kept": kept, "keep_not_found": max(len(keep) - kept, 0)}
