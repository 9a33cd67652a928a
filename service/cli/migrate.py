"""``vecbridge migrate | verify``: move a vector-database collection through a map, and check the result.

Both call one operation of :mod:`service.ops.vectordb` (shared with ``python -m service.vectordb``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from tqdm import tqdm

from align.exceptions import InputError

from ..limits import MAX_MIGRATE_BATCH, MAX_MIGRATE_PAUSE, MAX_VERIFY_K, MAX_VERIFY_QUERIES, MAX_VERIFY_SAMPLE
from ..ops.vectordb import (check_artifact_folder, checkpoint_status, default_checkpoint, kept_by_migration,
                              needs_registry, progress_record, run_migration, stopped_by)
from ..ops.verify import run_verify, verify_verdict
from ..vectordb import MigrationInterrupted
from ..vectordb.lost import quiet_client_logs
from . import check_stop
from ._common import (ROWS, Ctx, FiniteRange, emit, json_opt, progress_bar, quiet_opt, random_state_opt,
                      registry_exists, stderr_is_terminal, store_opts, warn)

__all__ = ["migrate", "verify"]


@click.command()
@store_opts
@click.option("--source", required=True, help="Collection (or alias) holding the old model's vectors.")
@click.option("--target", required=True, help="New collection for the mapped vectors (same ids and fields).")
@click.option("--map", "map_ref", required=True, help="Map: registry ref (name, name@alias, name:N) or an artifact file.")
@click.option("--checkpoint", type=click.Path(), default=None,
              help="Progress file (default: DATA_DIR/migrations/SOURCE-to-TARGET.json); rerun to resume.")
@click.option("--alias", default=None, help="Switch this alias to the target when every row is written.")
@click.option("--batch-size", type=click.IntRange(1, MAX_MIGRATE_BATCH), default=2000, show_default=True)
@click.option("--pause", type=FiniteRange(0, MAX_MIGRATE_PAUSE), default=0.0, help="Seconds to sleep after each batch.")
@click.option("--index", type=click.Choice(["hnsw", "ivfflat", "none", "like"]), default=None,
              help="PostgreSQL: index built on the target (default like: the source table's own index, its "
                   "method and options, or none when the source has none). Milvus and Qdrant targets take the "
                   "source's own index: only like is accepted there.")
@click.option("--overwrite", is_flag=True,
              help="Drop an existing target before a fresh start (never when resuming, never one an alias serves).")
@click.option("--source-space", default=None, help="Space of the source vectors (checked against the map's).")
@click.option("--target-space", default=None, help="Space recorded on the target (default: the map's).")
@click.option("--status", "status_only", is_flag=True, help="Only show what the checkpoint says, then exit.")
@click.option("--dry-run", is_flag=True,
              help="Make every check a run makes, read and map one batch, write nothing (no target, no checkpoint).")
@click.option("--keep-ids", type=click.Path(dir_okay=False), default=None,
              help="Ids of the rows you re-embedded with the new model (.npy of integers; .json list or one id per "
                   "line, for string / UUID ids): the target holds their own vectors (--keep-vectors), not mapped "
                   "ones.")
@click.option("--keep-vectors", type=click.Path(dir_okay=False), default=None,
              help="The new-model vectors of --keep-ids, in its order (the pairs the map was fitted on).")
@click.option("--json", "as_json", is_flag=True, help="JSON lines (progress, then the report) instead of a bar.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.pass_obj
def migrate(obj: Ctx, store, text_field, vector_field, id_field, source, target, map_ref, checkpoint, alias,
            batch_size, pause, index, overwrite, source_space, target_space, status_only, dry_run, keep_ids,
            keep_vectors, as_json, quiet):
    """Map every vector of a collection into a new one (ids, texts and other fields kept), resumably.

    Exit codes: 0 done, 2 bad input or refused (one line), 75 retry later (the registry locked or not answering, the
    database not answering or lost mid-run: the rows so far are checkpointed), 130 interrupted (Ctrl-C; 143
    SIGTERM, 129 SIGHUP: the batch in flight is finished and checkpointed, or the index build at the end cancelled
    (pgvector); run the same command again to resume).

    --keep-ids/--keep-vectors: the rows re-embedded to fit the map keep their own new-model vectors (held in
    memory: fine up to ~1e6 rows); a resume must give the same ones. Ids no source row has are counted, not refused.
    """
    # absolute, as printed (the report, a stop's line): a path relative to this directory is lost from any other
    ckpt = (Path(checkpoint) if checkpoint else default_checkpoint(obj.settings.data_dir, source, target)).resolve()
    if status_only:
        # nothing is opened; the resume command names the store given (it printed "--store STORE")
        st = checkpoint_status(ckpt, store or obj.settings.vectordb_url, store_in_command=True)
        eta = f", ETA {st['eta_s']:.0f}s at {st['rows_per_s']} rows/s" if st["eta_s"] is not None else ""
        on = f" on {st['engine']}" if st.get("engine") else ""  # a checkpoint of an older release records none
        emit(st, as_json, f"{st['source']} -> {st['target']}{on}: {st['done']}/{st['total']} rows "
                          f"({100 * st['fraction']:.1f}%), last id {st['last_id']}, "
                          f"{'finished' if st['finished'] else 'not finished, ' + st['state']}"
                          f"{' (' + st['why'] + ')' if st['why'] else ''}{eta}" + _keep_status_line(st)
                          + (f"; resume: {st['resume']}" if st["state"] in ("interrupted", "stopped") else "")
                          + (f" ({st['resume_note']})" if st["resume_note"] and st["state"] != "running" else ""))
        return
    store = obj.store_url(store)
    # before the registry opens: that makes the folder
    check_artifact_folder(obj.settings.resolved_artifact_dir(), map_ref, obj.settings.resolved_registry_url())
    quiet_client_logs(store)  # pymilvus logged ~150 lines of tracebacks before the one error line
    progress = _MigrationProgress(f"migrate {source}->{target}", as_json, quiet)
    try:
        rep = run_migration(store_url=store, source=source, target=target, map_ref=map_ref, checkpoint=ckpt,
                            **obj.store_auth(),
                            registry=obj.registry if needs_registry(map_ref) else None, alias=alias,
                            batch_size=batch_size, overwrite=overwrite, pause=pause, index=index, id_field=id_field,
                            vector_field=vector_field, text_field=text_field, source_space=source_space,
                            target_space=target_space, progress=progress, dry_run=dry_run, keep_ids=keep_ids,
                            keep_vectors=keep_vectors, data_dir=obj.settings.data_dir,
                            registry_url=obj.settings.registry_url,
                            artifact_dir=obj.settings.resolved_artifact_dir(),
                            index_wait_s=obj.settings.vectordb_index_wait_s)
    except MigrationInterrupted as exc:
        progress.close()
        word, code = stopped_by(exc)  # 128 + the signal, as every other command exits (143 SIGTERM)
        click.echo(f"vecbridge: {word}: {exc} (checkpoint {ckpt})", err=True)
        sys.exit(code)
    finally:
        progress.close()
    d = rep.to_dict()
    d["checkpoint"] = str(ckpt)
    space = str(rep.extra.get("space_check", ""))
    for warning in rep.extra.get("warnings", []) + ([f"space {space}"] if space.startswith("unchecked") else []):
        warn(warning)
    if as_json:  # JSON lines: the progress lines, then the report on one line
        click.echo(json.dumps(d, sort_keys=True, default=str))
        return
    if dry_run:
        emit(d, False, _dry_run_line(rep, source, target, alias))
        return
    if rep.already_finished:
        run = "already finished: nothing written this run"
    else:
        run = f"{rep.rows_this_run} this run" + (f", resumed after id {rep.resumed_from}"
                                                 if rep.resumed_from is not None else "")
    emit(d, False, f"migrated {rep.rows} rows {source} -> {target} ({run}) "
                   f"in {rep.seconds:.1f}s; fields: {', '.join(rep.extra.get('fields', [])) or '(none)'}; "
                   f"space {rep.extra.get('space_check')}"
                   f"{'; alias ' + alias + ' -> ' + target if alias else ''}{_kept_line(rep, source)}")


def _keep_status_line(st: dict) -> str:
    """``; keeping N re-embedded rows as given (digest D, M written): ...``, or nothing when the checkpoint was
    written without a keep set: a person resuming it learns to pass the same files (another set is refused)."""
    if not st.get("keep_digest"):
        return ""
    return (f"; keeping {st['keep_rows']} re-embedded rows as given (keep set digest {st['keep_digest']}, "
            f"{st['kept']} written so far): resume with the same --keep-ids/--keep-vectors")


def _kept_line(rep, source: str) -> str:
    """``; N re-embedded rows kept as given (M of the keep ids not in SOURCE)``, or nothing without a keep set."""
    if rep.kept is None:
        return ""
    return (f"; {rep.kept} re-embedded rows kept as given"
            + (f" ({rep.keep_not_found} of the keep ids not in {source})" if rep.keep_not_found else ""))


_STARTS = {"create": "would create {target} and write {n} rows",
           "drop": "would drop the existing {target} (--overwrite), create it again and write {n} rows",
           "resume": "would resume into {target} after id {last} and write {n} more rows",
           "finished": "the checkpoint says {target} is finished: nothing to write"}


def _dry_run_line(rep, source: str, target: str, alias: str | None) -> str:
    """One line saying what ``migrate`` would do (its ``--dry-run``)."""
    x = rep.extra
    line = (f"dry run, nothing written: {source} -> "
            + _STARTS[x["start"]].format(target=target, n=x["rows_to_write"], last=rep.resumed_from)
            + f"; space {x['space_check']}; fields: {', '.join(x['fields']) or '(none)'}"
            + f"; target index: {x['target_index']}"
            + (f"; keeping the own vectors of {x['keep_rows']} re-embedded rows" if "keep_rows" in x else ""))
    if x["sample_rows"]:
        line += (f"; a {x['sample_rows']}-row batch read in {x['sample_read_s']:.2f}s and mapped in "
                 f"{x['sample_map_s']:.2f}s (reads and mapping of every row: ~{x['read_map_estimate_s']:.0f}s; "
                 "writes come on top)")
    return line + (f"; then alias {alias} -> {target}" if alias else "")


class _MigrationProgress:
    """Renders :class:`~service.vectordb.MigrationProgress`: a JSON line each (``--json``), else a bar. Each
    report (after a checkpointed batch) first raises a Ctrl-C / SIGTERM the CLI's own handler took before the
    migration installed its handler, if that first raise was lost (:func:`~service.cli.check_stop`, as every
    command's progress does); signals during the run reach the migration's handler (``run_migration``)."""

    def __init__(self, desc: str, as_json: bool, quiet: bool):
        self.desc, self.as_json, self.quiet, self.bar = desc, as_json, quiet, None

    def __call__(self, p) -> None:
        check_stop()
        if self.as_json:
            click.echo(json.dumps(progress_record(p)))
        elif not self.quiet and stderr_is_terminal():  # no bar into a log file or pipe, nor without a stderr
            if self.bar is None:
                before = max(p.done - int(round(p.rows_per_s * p.elapsed_s)), 0)  # rows of earlier runs
                self.bar = tqdm(total=p.total, initial=before, unit="rows", desc=self.desc, file=sys.stderr,
                                dynamic_ncols=True)
            self.bar.update(p.done - self.bar.n)
            if p.stage == "index":  # every row written: the bar at 100 % says what the wait is
                self.bar.set_description(f"{self.desc}: building the index", refresh=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


@click.command()
@store_opts
@click.option("--collection", required=True, help="The migrated collection (or its alias).")
@click.option("--encoder", default=None, help="Re-embed the stored texts with this encoder (the new model).")
@click.option("--heldout-source", type=click.Path(dir_okay=False), default=None,
              help="Old-model vectors of held-out items (with --heldout-target and --map).")
@click.option("--heldout-target", type=click.Path(dir_okay=False), default=None,
              help="New-model vectors of the same items.")
@click.option("--heldout-rows", type=ROWS, default=None,
              help="START:STOP rows of both held-out files, or a file of row indices (the same rows of each).")
@click.option("--map", "map_ref", default=None, help="The migration's map (held-out mode, --source).")
@click.option("--source", default=None,
              help="The migrated collection's source: check every row against map(source row) "
                   "(missing, extra, wrong vectors; FAIL, exit 1, on any). Reads both collections once.")
@click.option("--source-space", default=None,
              help="Space of --source's vectors when it records none (checked against the map's; else its first "
                   "rows are, as migrate checks them).")
@click.option("--keep-ids", type=click.Path(dir_okay=False), default=None,
              help="With --source: the ids the migration kept as re-embedded (migrate --keep-ids); those rows are "
                   "checked against --keep-vectors, not map(source row).")
@click.option("--keep-vectors", type=click.Path(dir_okay=False), default=None,
              help="The new-model vectors of --keep-ids, in its order (migrate --keep-vectors).")
@click.option("--n-sample", type=click.IntRange(2, MAX_VERIFY_SAMPLE), default=2000, show_default=True,
              help="Rows sampled from the collection (re-embedded, or of the held-out pairs).")
@click.option("--queries", "n_queries", type=click.IntRange(1, MAX_VERIFY_QUERIES), default=200, show_default=True,
              help="How many of the sampled rows act as queries (a count; `eval --queries` is a file).")
@click.option("--k", type=click.IntRange(1, MAX_VERIFY_K), default=10, show_default=True, help="Cut-off of recall@k.")
@random_state_opt
@click.option("--min-recall", type=FiniteRange(0, 1), default=None,
              help="PASS/FAIL gate on recall@k: exit 1 when below.")
@json_opt
@quiet_opt
@click.pass_obj
def verify(obj: Ctx, store, text_field, vector_field, id_field, collection, encoder, heldout_source, heldout_target,
           heldout_rows, map_ref, source, source_space, keep_ids, keep_vectors, n_sample, n_queries, k, random_state,
           min_recall, as_json, quiet):
    """Check a migrated collection: does searching it find what re-embedding would (--encoder, or a held-out
    sample), and (--source) does it hold every source row, mapped?

    Exit codes: 0 done (PASS), 1 FAIL (recall below --min-recall; with --source any missing, extra or wrong
    row), 2 bad input, 75 retry later (the database not answering, or lost mid-run).

    A migration that kept its re-embedded rows (migrate --keep-ids/--keep-vectors): give verify the same two files,
    and those rows are right when they hold their given vectors.
    """
    if (heldout_source is None) != (heldout_target is None):
        raise InputError("give both --heldout-source and --heldout-target")
    heldout = (heldout_source, heldout_target) if heldout_source else None
    if min_recall is not None and encoder is None and heldout is None:  # --source alone measures no recall
        raise InputError("--min-recall gates the recall of --encoder or --heldout-source/--heldout-target; "
                         "--source alone checks rows, not recall")
    store = obj.store_url(store)
    quiet_client_logs(store)
    # the registry: a map's, and the space's encoder an --encoder must be (another model's texts never match): read
    # only when the collection records a space and there is a registry (a re-embed check never needed one)
    progress, close = progress_bar(quiet=quiet, as_json=as_json)
    try:
        out = run_verify(store_url=store, **obj.store_auth(), collection=collection, encoder=encoder,
                         heldout=heldout, heldout_rows=heldout_rows, map_ref=map_ref,
                         registry=obj.registry if map_ref and needs_registry(map_ref) else None,
                         spaces=(lambda: obj.registry) if encoder and registry_exists(obj.settings) else None,
                         n_sample=n_sample, n_queries=n_queries, k=k, random_state=random_state, id_field=id_field,
                         vector_field=vector_field, text_field=text_field, source=source, source_space=source_space,
                         keep_ids=keep_ids, keep_vectors=keep_vectors, progress=progress)
    finally:
        close()
    verdict, fails = verify_verdict(out, min_recall=min_recall, source=source, kept_rows=None if source is None else
                                    kept_by_migration(obj.settings.data_dir, source, collection))
    out["verdict"], out["fails"] = verdict, fails  # as the HTTP job's result: why it failed
    space = str(out.get("space_check", ""))
    if space.startswith("unchecked"):  # as migrate warns: the rows were compared through a map nothing vouched for
        warn(f"space {space}")
    text = []
    if "n_sample" in out:
        figures = ", ".join(f"{key}={val:.4f}" for key, val in out.items()
                            if isinstance(val, float) and key != "max_rel_error")
        text.append(f"{collection} ({out['mode']}, {out['n_sample']} rows sampled): {figures}")
    if source is not None:
        text.append(f"{collection} against {source}: {out['rows_target']}/{out['rows_source']} rows, "
                    + ", ".join(f"{out[n]} {what}{_ids(out[i], out[n])}" for n, i, what in (
                        ("missing_rows", "missing_ids", "missing"), ("extra_rows", "extra_ids", "extra"),
                        ("wrong_vectors", "wrong_ids", "wrong vectors"),
                        ("wrong_fields", "wrong_fields_ids", "with another text or field")))
                    + _kept_checked(out, source)
                    + f" (max relative error {out['max_rel_error']:.2g}); space {out['space_check']}")
    if verdict:
        text[-1] += f"; {verdict}{': ' + '; '.join(fails) if fails else ''}"
    if not as_json:
        for note in out.get("notes", []):
            click.echo(f"vecbridge: note: {note}", err=True)
    emit(out, as_json, "\n".join(text))
    if verdict == "FAIL":
        sys.exit(1)


def _kept_checked(out: dict, source: str) -> str:
    """``, N kept rows checked against their given vectors (W wrong; M of the keep ids not in SOURCE)``, or nothing
    without a keep set."""
    if "kept_checked" not in out:
        return ""
    return (f", {out['kept_checked']} kept rows checked against their given vectors ({out['kept_wrong']} wrong"
            + (f"; {out['keep_not_found']} of the keep ids not in {source}" if out["keep_not_found"] else "") + ")")


def _ids(ids: list, n: int) -> str:
    """`` (ids 3, 7, ...)``: the ids a fault names (the first few of ``n``)."""
    return f" (ids {', '.join(map(str, ids))}{', ...' if n > len(ids) else ''})" if ids else ""
