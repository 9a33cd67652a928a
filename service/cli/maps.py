"""``vecbridge fit | eval | plan | transform``: maps between two spaces, from files.

Each command parses its options, calls one operation (:func:`service.ops.maps.run_fit`,
:func:`service.ops.plans.evaluate_map`, :func:`service.ops.plans.plan`,
:func:`service.ops.transform.transform_file`) and renders the result as text or ``--json``.
"""

from __future__ import annotations

import io
import os
import re
import sys
import warnings
from pathlib import Path

import click
import numpy as np

from align.exceptions import InputError, VecbridgeWarning
from align.plan import last_migrated

from ..indexes.csls import CSLS_WEIGHT
from ..io import check_not_input, count_rows, parse_rows, read_vectors, resolve_rows
from ..ops.fit_stream import pair_files
from ..ops.maps import SUPERVISED, run_fit, unreliable_note
from ..ops.transform import transform_file
from ..ops.plans import EVAL_MAX_QUERIES, check_old_corpus, evaluate_map, gate_zero_note, plan, retention_scope
from ..ops.unpaired import UNPAIRED, check_unpaired, check_unpaired_method
from ..encoders import canonical_name
from ..figures import train_cos_note
from ..registry.names import MAX_NAME, utf8_safe
from ..storage import atomic_write, check_writable
from ._common import (ROWS, Ctx, FiniteRange, check_text_encoder, description_opt, emit, exit_flagged, file_rows_opts,
                      input_opts, json_opt, option_given, parse_kv, progress_bar, quiet_opt, ray_logs, random_state_opt,
                      read_pair, read_relevant, read_seed_pairs, rows_record, version_record, warn)

__all__ = ["fit", "eval_cmd", "plan_cmd", "transform"]

_ref_opt = click.option("--map", "ref", required=True,
                        help="NAME (its prod version, else its newest reliable one), NAME@alias or NAME:version.")
_ray_help = ("Run on Ray — a local Ray, or the cluster at ADDRESS (e.g. ray://head:10001): supervised fits as a "
             "map-reduce of sufficient statistics, minivec2vec with its kNN/CSLS rounds as tasks over row blocks "
             "(the same map as in-process).")


@click.command()
@input_opts
@click.option("--pairs/--unpaired", "paired", default=None, help="Rows are paired (row i ↔ row i) or not.")
@click.option("--seed-pairs", type=click.Path(dir_okay=False), default=None,
              help="Known pairs (k, 2) of row indices: .npy, .json or text; minivec2vec only. Indices count "
                   "from the rows read (after --rows / --source-rows / --target-rows), not the file's.")
@click.option("--method", type=click.Choice(["minivec2vec", "procrustes", "ridge", "lowrank", "auto", "contrastive",
                                            "cluster"]), required=True,
              help="auto: every paired family fitted and chosen on held-out pairs (align.fit_migration), the "
                   "per-cluster family included; lowrank: the rank-k map of align.fit_lowrank (--param rank=N "
                   "required; not fit_migration's Procrustes-plus-residual candidate of that name); cluster: "
                   "per-cluster local maps (align.ClusterMap).")
@click.option("--param", "params", multiple=True, help="KEY=VALUE fitter parameter (JSON values), repeatable; "
              "e.g. alpha=0.01 (ridge / lowrank: 0 .. 1e12; auto's, per pair: 0 .. 1e6), rank=64 (lowrank).")
@click.option("--unpaired-source", type=click.Path(dir_okay=False), default=None,
              help="More source-model vectors beside the pairs (e.g. the whole old corpus; .npy, .npz, .fvecs, "
                   ".parquet): they shape the source frame, compete in auto's held-out selection, give contrastive "
                   "its hard negatives and cluster its routing (align.fit_migration's unpaired_source). --method "
                   "auto, contrastive or cluster.")
@click.option("--unpaired-source-rows", type=ROWS, default=None,
              help="START:STOP rows of --unpaired-source, or a rows file.")
@click.option("--unpaired-target", type=click.Path(dir_okay=False), default=None,
              help="More target-model vectors beside the pairs (e.g. new-model queries), as --unpaired-source. "
                   "Both given, --param semi_supervised=sinkhorn refines a procrustes (orthogonal) map with them; "
                   "an affine one auto chose is left as fitted, a note says so.")
@click.option("--unpaired-target-rows", type=ROWS, default=None,
              help="START:STOP rows of --unpaired-target, or a rows file.")
@click.option("--name", required=True, help="Map name, e.g. minilm->e5.")
@click.option("--source-space", default=None, help="Source space name (default: encoder or file stem).")
@click.option("--target-space", default=None, help="Target space name (default: encoder or file stem).")
@click.option("--alias", default=None, help="Point this alias (e.g. prod) at the new version (not when the fit "
              "is flagged unreliable: the alias stays where it was, a note says where).")
@random_state_opt
@description_opt
@click.option("--tag", "tags", multiple=True, help="KEY=VALUE tag, repeatable.")
@click.option("--format", "artifact_format", type=click.Choice(["safetensors", "npz"]), default=None)
@click.option("--report", "report_copy", type=click.Path(dir_okay=False), default=None,
              help="Also write the HTML report here (one that cannot be written once the version is registered, "
                   "e.g. on a full disk, is a warning: the version stays registered, exit 0).")
@json_opt
@quiet_opt
@click.option("--allow-unreliable", is_flag=True,
              help="Exit 0 even when the fit is flagged unreliable (the version is registered either way, "
                   "flagged, never chosen for a path, and a bare NAME does not mean it: use NAME:N).")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help=_ray_help)
@click.option("--shard-rows", type=click.IntRange(1), default=262144, show_default=True,
              help="With --ray: rows per Ray task of a supervised fit (see SCALING.md for when Ray pays off).")
@click.option("--threads", type=click.IntRange(1), default=1, show_default=True,
              help="Threads of this process for the kNN / CSLS rounds of an unpaired or seeded minivec2vec fit "
                   "(the same map for any count; ~1.4-1.9x with 2 on 2 cores).")
@click.pass_obj
def fit(obj: Ctx, paired, seed_pairs, method, params, name, source_space, target_space, alias, random_state,
        description, tags, artifact_format, report_copy, as_json, quiet, allow_unreliable, ray_address, shard_rows,
        threads, **io_opts):
    """Fit a map from --source to --target and register it as a new version."""
    if paired is None:
        paired = method in SUPERVISED
    unpaired = _unpaired_options(method, io_opts)  # before any file is read (an old corpus can be large)
    if report_copy is not None:  # before the fit: a bad path after it failed the command with the version registered
        check_not_input(report_copy, "--report", io_opts["source"], io_opts["target"], seed_pairs,
                        *(path for path, _ in unpaired.values()))
        check_writable(report_copy, "--report")
    progress, close = progress_bar(quiet=quiet, as_json=as_json)
    notes: list[str] = _ignored_options(method, ray_address, threads)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", VecbridgeWarning)
        try:
            source_space, target_space = _space_names(io_opts, source_space, target_space)
            for side, space in (("source", source_space), ("target", target_space)):
                io_opts[f"{side}_encoder"] = check_text_encoder(obj.registry, io_opts[side], space,
                                                                io_opts[f"{side}_encoder"])
            # a closed-form fit of two float32 .npy files is streamed from them (the same map), not read whole
            stream = pair_files(io_opts, method=method, params=parse_kv(params), paired=paired, ray_address=ray_address)
            X, Y, inputs = read_pair(io_opts, progress, stream)
            rest = _read_unpaired(unpaired, X.shape[1], Y.shape[1], inputs)
            seeds = None
            if seed_pairs is not None:
                if method != "minivec2vec":
                    raise InputError("--seed-pairs applies to --method minivec2vec only")
                seeds = read_seed_pairs(seed_pairs)
                inputs["seed_pairs"] = {"path": str(Path(seed_pairs).resolve()), "n": int(seeds[0].size)}
            with ray_logs(quiet or as_json):
                v = run_fit(obj.registry, name=name, source=X, target=Y, method=method, params=parse_kv(params),
                            source_space=source_space, target_space=target_space,
                            paired=paired, seed_pairs=seeds, random_state=random_state, alias=alias,
                            progress=progress, description=description, tags=parse_kv(tags, "tag", raw=True),
                            inputs=inputs, artifact_format=artifact_format, report_copy=report_copy, ray_address=ray_address,
                            ray_shard_rows=shard_rows, threads=threads, notes=notes, stream=stream, **rest)
        finally:
            close()
    for w in caught:  # soft numerical trouble (e.g. an unreliable unsupervised fit): one line each
        if issubclass(w.category, VecbridgeWarning):
            warn(str(w.message).splitlines()[0])
    _render_fit(obj.registry, v, as_json)
    for note in notes:  # e.g. the bare name now means a version that looks worse than the one it replaced
        if note == unreliable_note(v):  # said below, with the exit code
            continue
        click.echo(f"vecbridge: note: {note}", err=True)
    if v.metrics.get("reliable") is False and not allow_unreliable:
        exit_flagged(f"{v.ref} is flagged UNRELIABLE: it stays in the registry for inspection but is never chosen for "
                     f"a path nor meant by a bare name (use {v.ref})")


def _space_name(path: str, encoder: str | None, given: str | None, side: str) -> str:
    if given:
        return given
    if encoder:
        return canonical_name(encoder)
    stem = re.sub(r"\.{2,}", ".", re.sub(r"[^A-Za-z0-9._-]", "_", Path(path).stem)).lstrip(".-")[:MAX_NAME]
    if not re.search(r"[A-Za-z0-9]", stem):  # `旧.npy` and `新.npy` were both space '_'
        raise InputError(f"--{side} {utf8_safe(path)}: its file name makes no space name; name the space with "
                         f"--{side}-space")
    return stem


def _space_names(o: dict, source_space: str | None, target_space: str | None) -> tuple[str, str]:
    """The spaces of a fit's :func:`input_opts` ``o``: as given, else the encoder's canonical name, else the file
    stem made a valid name (other characters as '_', no '..', at most 128 characters: `mini..lm.npy` was "source
    space 'mini..lm' is not allowed", and a 140-character stem too long). A default that names no space, or the same
    one as the other side's for another file, is an InputError (exit 2): `old/embeddings.npy -> new/embeddings.npy`
    registered `embeddings -> embeddings`, and a search from that space then applied no map (wrong rows)."""
    src, tgt = (_space_name(o[side], o[f"{side}_encoder"], given, side)
                for side, given in (("source", source_space), ("target", target_space)))
    if src == tgt and not (source_space and target_space) and not _same_file(o["source"], o["target"]):
        raise InputError(f"--source {utf8_safe(o['source'])} and --target {utf8_safe(o['target'])} would both be "
                         f"space {src!r}: name the spaces with --source-space / --target-space")
    return src, tgt


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one is missing: reading it says so
        return os.path.abspath(a) == os.path.abspath(b)


def _unpaired_options(method: str, io_opts: dict) -> dict[str, tuple]:
    """``{"unpaired_source": (FILE, ROWS), ...}`` of the sets given (popped from ``io_opts``); a method that cannot
    use them, or rows without their file, is an InputError (exit 2)."""
    out = {}
    for key in UNPAIRED:
        path, rows = io_opts.pop(key), io_opts.pop(f"{key}_rows")
        opt = "--" + key.replace("_", "-")
        if path is None and rows is not None:
            raise InputError(f"{opt}-rows selects rows of {opt}: give {opt} FILE too")
        if path is not None:
            out[key] = (path, rows)
    check_unpaired_method(method, ["--" + k.replace("_", "-") for k in out], method_label="--method")
    return out


def _read_unpaired(unpaired: dict[str, tuple], d_s: int, d_t: int, inputs: dict) -> dict:
    """The unpaired sets read and checked against the pairs' widths (``run_fit``'s keyword arguments); each is
    recorded in ``inputs`` (path, rows, shape)."""
    arrays, names = {}, {}
    for key, (path, rows) in unpaired.items():
        names[key] = f"--unpaired-{key.split('_')[1]} {Path(path).name}"
        arrays[key] = read_vectors(path, rows=rows, encoder_option=None, key_option=None)
    out = check_unpaired((d_s, d_t), names, **arrays)
    for key, (path, rows) in unpaired.items():
        inputs[key] = {"path": str(Path(path).resolve()), "rows": rows_record(rows), "shape": list(out[key].shape)}
    return out


def _ignored_options(method: str, ray_address: str | None, threads: int) -> list[str]:
    """Notes for options given on the command line that this fit does not use (they were ignored silently)."""
    out = []
    if option_given("threads") and threads > 1 and (method in SUPERVISED or ray_address is not None):
        out.append("--threads applies to an in-process minivec2vec fit (unpaired or seeded); ignored here")
    if option_given("shard_rows") and (ray_address is None or method not in ("procrustes", "ridge", "lowrank")):
        out.append("--shard-rows applies to --ray fits of procrustes, ridge or lowrank; ignored here")
    return out


def _render_fit(reg, v, as_json: bool) -> None:
    d = version_record(reg, v)
    m = v.metrics
    headline = ", ".join(f"{k}={m[k]:.4f}" + (f" {train_cos_note(m, v.params)}" if k == "train_cos" else "")
                         for k in ("train_top1", "train_cos", "criterion", "null_criterion", "mnn_frac", "mnn_mean_cos")
                         if isinstance(m.get(k), (int, float)) and not isinstance(m.get(k), bool))
    if m.get("reliable") is False:
        headline += f", UNRELIABLE ({m.get('unreliable_reason') or 'criterion close to random maps'})"
    chosen = (m.get("selection") or {}).get("chosen")  # `--method auto` said "auto", never the family it chose
    method = f"{v.method} -> {chosen}" if chosen and chosen != v.method else v.method
    report = d["report_file"]  # a full data dir: the version is registered, its report file is not there
    report = report if not report or Path(report).is_file() else f"none ({report} could not be written)"
    emit(d, as_json, f"registered {v.ref} ({v.source_space} {v.source_dim}-d -> {v.target_space} "
                     f"{v.target_dim}-d, {method}, fit {m.get('timings', {}).get('fit', 0):.1f}s)"
                     f"{'; ' + headline if headline else ''}\nreport: {report}")


def _retention(value, why: str = "no query finds its relevant document natively") -> str:
    """A figure as the eval text shows it; None or NaN (a labelled ratio with no native hit among the queries, the
    @10 proxies on fewer than 12 pairs) is undefined, not 0."""
    return f"undefined ({why})" if value is None or not np.isfinite(value) else f"{value:.4f}"


def _corpus_line(r: dict) -> str:
    """The corpus-wide labelled retention beside the held-out one (``r``: the gate's ``retrieval``), or nothing."""
    c = r.get("corpus")
    if c is None:
        return ""
    ret = "undefined" if c["retention"] is None else f"{c['retention']:.4f}"
    iv = c["retention_interval"]
    nat = "undefined" if c["native_r10"] is None else f"{c['native_r10']:.4f}"
    return (f"\n  over the whole corpus ({c['n_documents']:,} documents: {c['n_heldout']:,} held out + "
            f"{c['n_documents'] - c['n_heldout']:,} --old-corpus rows mapped): R@10 {c['migrated_r10']:.4f} migrated "
            f"(exact) / {nat} native (estimated: {c['native_r10_heldout']:.4f} over the held-out documents, scaled as "
            f"the old model's falls, {c['old_r10_heldout']:.4f} -> {c['old_r10_corpus']:.4f}, slope ratio "
            f"{c['slope_ratio']:.2f})  retention R@10 {ret}"
            + (f" (95% interval {iv[0]:.4f}-{iv[1]:.4f})" if iv else "")
            + f"; over the {c['n_heldout']:,} held-out documents alone {_retention(r['retention_heldout'])}"
            + f"; keeping the old model: R@10 {c['old_r10_corpus']:.4f} over the corpus")


def _versus_old(lab: dict) -> str:
    """How the migration compares with keeping the old model (``beats_old`` is migrated R@10 >= old R@10): a tie
    (R@10 1.0 and 1.0) read "beats it"."""
    if not lab["beats_old"]:
        return "does NOT beat it: keep the old model or re-embed"
    return "matches it" if lab["migrated"]["R@10"] == lab["old"]["R@10"] else "beats it"


@click.command("eval")
@_ref_opt
@input_opts
@click.option("--min-top1", type=click.FloatRange(0, 1), default=None,
              help="PASS/FAIL gate: exit 1 when top-1 is below; a pass that a random map would match 1% of the "
                   "time or more exits 2 (a perfect map needs at least 4 held-out pairs).")
@click.option("--min-retention", type=click.FloatRange(0, 1), default=None,
              help="PASS/FAIL gate on retention: exit 1 when below. With --queries/--relevant, the retention of "
                   "labelled retrieval (R@10 migrated / native over the held-out documents, or with --old-corpus "
                   "over the whole corpus; when no query finds its relevant document natively, native R@10 is no "
                   "better than chance, or fewer than 5 queries find it, the gate exits 2); otherwise the proxy "
                   "nn_retention@10 (each native target row's nearest native row must stay in the top 10 of the "
                   "mapped source rows; share kept; needs at least 12 distinct held-out pairs, exit 2 on fewer; a "
                   "pass that a random map would match 1% of the time or more exits 2 too: at least 15 pairs for a "
                   "perfect map). A gate of 0 passes any defined retention. "
                   "That is among the held-out rows alone, without distractors: not the nn_retention@10 of "
                   "`vecbridge plan`, a ratio to native search with up to 8,192 mapped rows of the old corpus beside "
                   "them, which differs for the same map.")
@click.option("--queries", "queries_path", type=click.Path(dir_okay=False), default=None,
              help="Labelled queries (.npy, .npz, .fvecs, .parquet): new-model query vectors (--side target) or "
                   "source-model ones (--side source).")
@click.option("--queries-rows", type=ROWS, default=None,
              help="START:STOP rows of --queries (and --old-queries), or a file of row indices.")
@click.option("--old-queries", "old_queries_path", type=click.Path(dir_okay=False), default=None,
              help="The same queries under the old model: adds the baseline of keeping the old model (its R@10 over "
                   "the old documents) and whether the migration beats it; --old-corpus needs them.")
@click.option("--relevant", "relevant_path", type=click.Path(dir_okay=False), default=None,
              help="Each query's relevant document: its row in the held-out pairs (.npy ints, .json list, or one "
                   "index per line); one per row of --queries (sliced by --queries-rows) or per selected query.")
@click.option("--old-corpus", "old_corpus_path", type=click.Path(dir_okay=False), default=None,
              help="The old model's vectors of the rest of the corpus (`vecbridge plan --old`): the labelled retention "
                   "is then over the whole corpus, those rows mapped beside the held-out documents (the figure "
                   "`vecbridge plan --queries` forecasts; native R@10 estimated from --old-queries), and the gate "
                   "uses it. Without it the retention is over the held-out documents alone, higher than a corpus's. "
                   "Needs --queries, --relevant, --old-queries; corpus-side, plain search.")
@click.option("--old-corpus-rows", type=ROWS, default=None,
              help="START:STOP rows of --old-corpus, or a file of row indices (leave the held-out documents out; "
                   "rows repeating one are left out anyway).")
@click.option("--side", type=click.Choice(["target", "source"]), default="target", show_default=True,
              help="target: corpus-side migration (the map moves the documents; queries are target vectors); "
                   "source: query-side (the map moves the queries into the target index).")
@click.option("--csls/--no-csls", default=False,
              help="Also rank by CSLS: top-1 of the pairs, and with --queries the labelled retention (and the gate) of "
                   "the migrated index searched as the service's csls search does (plain cosine kept beside it).")
@click.option("--csls-weight", type=FiniteRange(0, 2), default=CSLS_WEIGHT, show_default=True,
              help="Weight of the document's hubness in labelled CSLS search (the search route's csls_weight).")
@click.option("--max-queries", type=click.IntRange(min=1), default=EVAL_MAX_QUERIES, show_default=True,
              help="Rank at most this many held-out pairs (a sample drawn with --random-state), each against ALL the "
                   "held-out target rows: time grows as max-queries x rows instead of rows squared. The sampled "
                   "shares come with their 95% intervals; give the row count (or more) to rank every pair.")
@random_state_opt
@click.option("--record", is_flag=True, help="Store the results as tags eval.* on the version.")
@json_opt
@quiet_opt
@click.pass_obj
def eval_cmd(obj: Ctx, ref, min_top1, min_retention, queries_path, queries_rows, old_queries_path, relevant_path,
             old_corpus_path, old_corpus_rows, side, csls, csls_weight, max_queries, random_state, record, as_json,
             quiet, **io_opts):
    """Evaluate a registered map on held-out pairs: top-1, mean rank, cosine, recall@10, retrieval retention
    (of labelled queries when given)."""
    if (queries_path is None) != (relevant_path is None):
        raise InputError("--queries and --relevant go together (labelled queries and their relevant rows)")
    v = obj.registry.resolve(ref)  # texts embed with the map's spaces' models (swapped ones ran: top-1 0.003)
    for end, space in (("source", v.source_space), ("target", v.target_space)):  # not `side`: that is --side
        io_opts[f"{end}_encoder"] = check_text_encoder(obj.registry, io_opts[end], space, io_opts[f"{end}_encoder"])
    progress, close = progress_bar(quiet=quiet, as_json=as_json)  # text inputs are embedded: as fit shows it
    try:
        X, Y, _ = read_pair(io_opts, progress)
    finally:
        close()
    sides = tuple(_read_as(io_opts[end], io_opts["rows"] if io_opts[f"{end}_rows"] is None else io_opts[f"{end}_rows"])
                  for end in ("source", "target"))  # the error of unequal row counts names the files and rows read
    Q = rel = Qo = None
    if queries_path is not None:
        Q = read_vectors(queries_path, rows=queries_rows, encoder_option=None, key_option=None)
        rel = read_relevant(relevant_path, Q.shape[0], queries=queries_path, rows=queries_rows)
    if old_queries_path is not None:
        if Q is None:
            raise InputError("--old-queries is the baseline of labelled queries: give --queries and --relevant too")
        Qo = read_vectors(old_queries_path, rows=queries_rows, encoder_option=None, key_option=None)
    C = None
    if old_corpus_path is not None:  # checked before the corpus is read: its needs are the other options'
        check_old_corpus(old_corpus_path, Q, Qo, side, csls_weight if csls else None,
                         ("--old-corpus", "--queries", "--relevant", "--old-queries", "--side", "--csls"))
        C = read_vectors(old_corpus_path, rows=old_corpus_rows, encoder_option=None, key_option=None)
    elif old_corpus_rows is not None:
        raise InputError("--old-corpus-rows selects rows of --old-corpus: give --old-corpus too")
    with warnings.catch_warnings(record=True) as caught:  # align's warnings as vecbridge: warning: lines
        warnings.simplefilter("always", VecbridgeWarning)
        res = evaluate_map(obj.registry, ref, X, Y, csls=csls, min_top1=min_top1, min_retention=min_retention,
                           record=record, queries=Q, relevant=rel, side=side, old_queries=Qo,
                           csls_weight=csls_weight, max_queries=max_queries, random_state=random_state,
                           old_corpus=C, sides=sides, old_corpus_name="--old-corpus")
    for line in dict.fromkeys(str(w.message).splitlines()[0] for w in caught
                              if issubclass(w.category, VecbridgeWarning)
                              and "undefined (NaN)" not in str(w.message)):  # the figures below say "undefined"
        warn(line)
    for w in caught:  # any other warning goes on as it came (numpy's, a library's)
        if not issubclass(w.category, VecbridgeWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    zero = gate_zero_note(res["retrieval"], record)  # said under the PASS line, not as a warning
    for note in res["notes"]:  # rows neither side of the map recognises: the figures may be of another model's
        if note not in zero:
            warn(note)
    r = res["retrieval"]
    # top-1 ranks in the target's centred frame; a search ranks raw outputs (query-side recall@1), which can be
    # lower (WordNet minilm -> glove, 384 -> 50: 0.733 centred, 0.637 raw): both are shown
    text = (f"{res['map']}: top-1 {res['top1']:.4f} (centred; raw, as a search ranks: {r['query_recall@1']:.4f})  "
            f"mean rank {res['mean_rank']:.2f}  cos {res['cos']:.4f} (centred; raw {res['cos_raw']:.4f})  "
            f"recall@10 {_retention(res['recall@10'], 'at most 10 pairs')}  (candidates {res['n_candidates']}"
            + (f"; {res['n_repeated']} repeated pairs scored once" if res.get("n_repeated") else "") + ")\n"
            f"  retrieval: nn_retention@10 {_retention(r['nn_retention@10'], 'fewer than 12 pairs')}  "
            f"corpus-side MRR {r['corpus_mrr']:.4f}  query-side MRR {r['query_mrr']:.4f}  "
            f"overlap@10 {_retention(r['overlap@10'], 'fewer than 11 pairs')}")
    if "intervals" in res:
        iv = {**res["intervals"], **r["intervals"]}
        text += (f"\n  sampled: {res['n_queries']} of {res['n_candidates']} pairs ranked (--max-queries, "
                 f"--random-state {random_state}), each against all {res['n_candidates']}; 95% intervals: "
                 + "  ".join(f"{m} {iv[m][0]:.4f}-{iv[m][1]:.4f}" for m in ("top1", "recall@10", "nn_retention@10")
                             if m in iv))
    if "labelled" not in r and r["proxy"]["undecided"] and min_retention is None:  # as the labelled one's, below
        text += f"\n  this nn_retention@10 passes no gate (a gate above it fails): {r['proxy']['undecided']}"
    if "labelled" in r:
        lab = r["labelled"]
        text += (f"\n  labelled ({lab['n_queries']} queries, {lab['n_documents']} documents, "
                 f"{'query' if side == 'source' else 'corpus'}-side): "
                 + "  ".join(f"{m} {lab['migrated'][m]:.4f}/{lab['native'][m]:.4f}" for m in lab["migrated"])
                 + f"  (migrated/native)  retention R@10 {_retention(lab['retention']['R@10'])}"  # held-out
                 + (f" (95% interval {liv[0]:.4f}-{liv[1]:.4f})" if (liv := lab["retention_interval"]["R@10"]) else ""))
        if lab.get("undecided") and min_retention is None:  # a gate: exit 2 with this reason (0: a PASS, below)
            kept = (" and is not recorded (an earlier eval.labelled_retention is removed: the eval.* tags are this "
                    "run's)")
            text += (f"\n  this retention decides no gate{kept if record else ''}: "
                     f"{lab['undecided']}")
        text += _corpus_line(r)
        if "labelled_plain" in r:
            plain = r["labelled_plain"]
            text += (f"\n  with CSLS search (w {lab['csls_weight']:g}); plain cosine search: R@10 "
                     f"{plain['migrated']['R@10']:.4f}, retention {_retention(plain['retention']['R@10'])}")
        if "old" in lab:
            text += (f"\n  keeping the old model{' (the held-out documents)' if 'corpus' in r else ''}: R@10 "
                     f"{lab['old']['R@10']:.4f} (retention "
                     f"{_retention(lab['old_retention']['R@10'])}); the migration "
                     + _versus_old(lab))
    if csls:
        text += f"\n  CSLS: top-1 {res['csls_top1']:.4f}  mean rank {res['csls_mean_rank']:.2f}"
    if min_top1 is not None:
        text += f"\n{'PASS' if res['top1'] >= min_top1 else 'FAIL'}: top-1 (centred) {res['top1']:.4f} vs {min_top1}"
    if min_retention is not None:
        if "labelled" in r:  # which figure the gate reads (said above the verdict, which stays its last line)
            text += f"\n  the gate reads the retention over {retention_scope(r)}"
            if "corpus" not in r and side == "target":
                text += (": a migrated corpus's other rows compete too, and its retention is lower (give --old-corpus "
                         "and --old-queries for that figure, the one `vecbridge plan --queries` forecasts)")
        iv = r.get("retention_interval")
        text += f"\n{r['result']}: {r['retention_metric']} {r['retention']:.4f}"
        text += (f" (95% interval {iv[0]:.4f}-{iv[1]:.4f} over {r['labelled']['n_queries']} queries)"
                 if iv is not None else "") + f" vs {min_retention}"
        for note in zero:  # passed, as a gate of 0 passes any figure; the figure itself says nothing
            text += f"\n  {note}"
        if r.get("gate_within_interval"):  # never at a gate of 0, which any defined figure decides
            text += "\n  the gate lies inside the interval: these queries cannot decide it; more labelled queries can"
    emit(res, as_json, text)
    if res.get("result") == "FAIL":
        sys.exit(1)


def _read_as(path, rows) -> str:
    """``x.npy``, ``x.npy rows 0:40`` or ``x.npy rows listed in rows.npy``: a file and its rows as an error names
    them."""
    name = Path(path).name
    if rows is None:
        return name
    if isinstance(rows, str):
        return f"{name} rows {rows}"
    source = getattr(rows, "source", None)  # the rows file ROWS read
    return f"{name} rows listed in {Path(source).name}" if source else f"{name}, listed rows"


@click.command("plan")
@click.option("--old", "old", required=True, type=click.Path(dir_okay=False), help="Old-model corpus vectors.")
@click.option("--old-rows", type=ROWS, default=None, help="START:STOP rows of --old, or a file of row indices.")
@click.option("--probe-source", required=True, type=click.Path(dir_okay=False),
              help="Old-model vectors of the probe texts (200-1,000 rows).")
@click.option("--probe-target", required=True, type=click.Path(dir_okay=False),
              help="New-model vectors of the same texts, row i <-> row i.")
@click.option("--probe-rows", type=ROWS, default=None,
              help="START:STOP rows of both probe files, or a file of row indices.")
@click.option("--target-retention", type=FiniteRange(0, 1, min_open=True), default=0.95, show_default=True)
@random_state_opt
@click.option("--rows-out", type=click.Path(dir_okay=False), default=None,
              help="Write the recommended rows to re-embed (.npy int64 indices into --old; --json lists them as "
                   "rows_to_embed either way, except every row of --old: rows_to_embed_all, written here only): "
                   "`fit --source-rows` and `transform --rows` take the file.")
@click.option("--k", "rows_k", type=click.IntRange(1), default=None,
              help="Give the rows to re-embed (--rows-out, rows_to_embed) for this many rows, a budget of yours, "
                   "instead of for the recommended K (drawn as the plan draws its own, with --random-state).")
@click.option("--keep", is_flag=True, default=False,
              help="You will keep the re-embedded rows' own new-model vectors in the migrated corpus (`transform "
                   "--keep-rows`, `migrate --keep-ids`): the recommended K is the smallest whose 'rows kept' forecast "
                   "reaches --target-retention, not its every-row-mapped retention (never a larger K).")
@click.option("--queries", "queries_path", type=click.Path(dir_okay=False), default=None,
              help="Labelled queries, new-model vectors: the plan then predicts their labelled R@10 retention over "
                   "the whole --old corpus (the figure `vecbridge eval --queries --old-corpus` measures; without that "
                   "option eval scores the held-out documents alone, a higher figure) instead of a proxy. Needs "
                   "--old-queries and --relevant.")
@click.option("--old-queries", "old_queries_path", type=click.Path(dir_okay=False), default=None,
              help="The same queries under the old model (they scale native recall from the probe to the corpus).")
@click.option("--relevant", "relevant_path", type=click.Path(dir_okay=False), default=None,
              help="Each query's relevant document: its row in the probe (.npy ints, .json list, or one per line).")
@json_opt
@quiet_opt
@click.pass_obj
def plan_cmd(obj: Ctx, old, old_rows, probe_source, probe_target, probe_rows, target_retention, random_state,
             rows_out, rows_k, keep, queries_path, old_queries_path, relevant_path, as_json, quiet):
    """Before a migration: alignability, expected retention vs K, recommended method and K, rows to re-embed.

    Without --queries the retention is nn_retention@10 of the probe's held-out half among up to 8,192 mapped rows
    of --old as distractors, over the same search among the native rows: a ratio (it can exceed 1; a note says
    so), not the figure `vecbridge eval --min-retention` gates on without queries (the held-out rows alone, no
    distractors). From K = 1,000 the recommended method is auto, while the forecast is of a closed-form method
    (forecast_method in --json), usually a floor for what auto fits. With --keep the recommended K reads the 'rows
    kept' column (recommended.forecast in --json: kept) for a migration that keeps the rows it re-embedded."""
    given = [x is not None for x in (queries_path, old_queries_path, relevant_path)]
    if any(given) and not all(given):
        raise InputError("--queries, --old-queries and --relevant go together (labelled queries over the probe)")
    if rows_out is not None and Path(rows_out).suffix.lower() != ".npy":  # np.save would write ROWS_OUT.npy
        raise InputError(f"--rows-out {rows_out}: the rows are written as .npy (int64 indices); name a .npy file")
    if rows_out is not None:
        check_not_input(rows_out, "--rows-out", old, probe_source, probe_target, queries_path, old_queries_path,
                        relevant_path)
        check_writable(rows_out, "--rows-out")
    X_old = read_vectors(old, rows=old_rows, encoder_option=None, key_option=None)
    A = read_vectors(probe_source, rows=probe_rows, encoder_option=None, key_option=None)
    B = read_vectors(probe_target, rows=probe_rows, encoder_option=None, key_option=None)
    Q = Qo = rel = None
    if all(given):
        Q, Qo = (read_vectors(p, encoder_option=None, key_option=None) for p in (queries_path, old_queries_path))
        rel = read_relevant(relevant_path, Q.shape[0])
    progress, close = progress_bar(quiet=quiet, as_json=as_json)
    try:
        res = plan(X_old, A, B, random_state=random_state, target_retention=target_retention, queries=Q,
                   old_queries=Qo, relevant=rel, progress=progress, names=("--old", "--probe-source", "--probe-target"),
                   k=rows_k, k_name="--k", keep=keep)
    finally:
        close()
    picked = np.arange(X_old.shape[0])
    if old_rows is not None:  # the plan numbers the rows it was given: rows_to_embed index --old itself (as
        # --rows-out says); --old-rows a START:STOP range or a file of row indices alike
        picked = np.arange(n := count_rows(old, key_option=None))[resolve_rows(parse_rows(old_rows), n, old)]
        res["rows_to_embed"] = [int(picked[i]) for i in res["rows_to_embed"]]
    # every row of the plan's corpus: not listed in the JSON (1M rows made 7.9 MB), written by --rows-out only
    rows = picked if res.get("rows_to_embed_all") else res["rows_to_embed"]
    if rows_out is not None:
        buf = io.BytesIO()
        np.save(buf, np.asarray(rows, dtype=np.int64), allow_pickle=False)
        atomic_write(rows_out, buf.getvalue())  # a crash or a full disk never leaves half a rows file
        res["rows_out"] = str(Path(rows_out).resolve())
    lines = [f"alignability (kNN@10 overlap on {res['n_probe']} probe pairs, beyond chance): {res['alignability']:.3f}"
             f" (raw {res['knn_overlap']:.3f})"
             f"  -> unsupervised {'possible' if res['unsupervised_feasible'] else 'not expected to work'}",
             f"expected retention ({res['metric']}"
             + (f"; {res['n_queries']} queries over {res['n_corpus']} documents" if "n_queries" in res else "")
             + "):",
             f"  {'K':>7}  {'method':>10}  {'retention':>9}  {'interval':>15}  {'rows kept':>9}"]
    for q in res["predicted"]:
        lines.append(f"  {q['k']:>7}  {q['method']:>10}  {q['retention']:>9.3f}  "
                     f"[{q['low']:.3f}, {q['high']:.3f}]  {q['kept']['retention']:>9.3f}"
                     f"{'  (extrapolated)' if q['extrapolated'] else ''}"
                     + ("  (the whole corpus, re-embedded)" if q.get("whole_corpus") else ""))
    lines.append("  (rows kept: with the re-embedded rows' own vectors in the migrated corpus, `transform --keep-rows "
                 "ROWS --keep-vectors NEW`)")
    nat, rec = res.get("native"), res["recommended"]
    if nat:
        last = last_migrated(res["predicted"])
        lines.append(f"R@10 of your queries: new model {nat['new_probe']:.3f} over the probe -> ~"
                     f"{nat['new_corpus_estimate']:.3f} over the corpus (estimated); old model {nat['old_probe']:.3f}"
                     f" -> {nat['old_corpus']:.3f} (measured: keeping it); migrated at K = {last['k']}: "
                     + (f"~{last['kept']['r10']:.3f} (rows kept)" if keep else f"~{last['r10']:.3f}"))
    best = rec.get("best_migrating")  # none that migrates reaches the target: say so on the line, not only a note
    lines.append((f"recommended: re-embed every row (K = {rec['k']}, the whole corpus) instead of migrating"
                  if rec["whole_corpus"] else f"recommended: method {rec['method']}, K = {rec['k']} rows to re-embed")
                 + (" (read from the rows kept forecast: --keep)" if rec["forecast"] == "kept" else "")
                 + (f"; no K that migrates is predicted to reach {res['target_retention']:g}: the best, K = "
                    f"{best['k']}, {best['retention']:.3f} [{best['low']:.3f}, {best['high']:.3f}] (see the notes)"
                    if best else "")
                 + (f" (written to {res['rows_out']})" if rows_out and rows_k is None else "")
                 + (f"; the forecast is of {rec['forecast_method']}, not of auto (see the notes)"
                    if rec["method"] != rec["forecast_method"] and not rec["whole_corpus"] else ""))
    if rows_k is not None:
        lines.append(f"rows to re-embed for --k {rows_k}: {len(rows)}"
                     + (" (every row of --old)" if res.get("rows_to_embed_all") else "")
                     + (f" (written to {res['rows_out']})" if rows_out else
                        "" if res.get("rows_to_embed_all") else " (rows_to_embed in --json)"))
    lines += [f"note: {n}" for n in res["notes"]]
    emit(res, as_json, "\n".join(lines))  # rows_to_embed: the indices (as POST /v1/plans), with --rows-out too


@click.command()
@_ref_opt
@click.argument("inp", type=click.Path(dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--chunk-rows", type=click.IntRange(1), default=65536, show_default=True,
              help="Rows read, mapped and written at a time (one chunk is held in memory).")
@click.option("--output", "output", type=click.Choice(["raw", "frame", "linear"]), default="raw", show_default=True,
              help="raw: comparable by cosine with the target model's own vectors (what a migration needs; the "
                   "HTTP and Python default too); frame: the target's centred unit frame; linear: f_s(x) W + b, "
                   "where f_s is the map's source frame (by default: unit rows, centred, unit rows again), without "
                   "the target frame or renormalisation (a cluster map: its routed clusters' blend).")
@file_rows_opts
@click.option("--text-field", default="text", show_default=True, help="JSONL field holding the text.")
@click.option("--encoder", default=None,
              help="For a text INP: the map's source space's encoder (the default; another model is refused), or "
                   "the encoder of a space that has none registered.")
@json_opt
@quiet_opt
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="Stream the chunks through Ray workers (a local Ray, or the cluster at ADDRESS); the same output to "
                   "float32 rounding.")
@click.option("--keep-rows", type=ROWS, default=None,
              help="Rows of INP you re-embedded with the new model (the rows file `plan --rows-out` wrote, or "
                   "START:STOP): OUT holds their own new-model vectors (--keep-vectors), not mapped ones.")
@click.option("--keep-vectors", type=click.Path(dir_okay=False), default=None,
              help="The new-model vectors of --keep-rows, in its order (the pairs the map was fitted on).")
@click.pass_obj
def transform(obj: Ctx, ref, inp, out, chunk_rows, output, rows, key, column, text_field, encoder, as_json, quiet,
              ray_address, keep_rows, keep_vectors):
    """Map the rows of INP (.npy, .npz, .fvecs, .parquet; texts .txt / .jsonl / .json embedded with the source
    space's encoder) into OUT (.npy, .fvecs or .parquet), in chunks: files may exceed memory.

    A .parquet INP into a .parquet OUT keeps every other column (ids, payloads), unchanged and row for row; the
    vector column keeps its name and position and holds the mapped rows: fixed_size_list<float32>[target dim],
    whatever list type or float width INP held. Another OUT holds the vectors only (a note on stderr, or `note`
    in --json, names the columns left behind); a non-parquet INP gives a .parquet OUT one column, `vector`.

    A migration re-embeds some rows to fit its map: --keep-rows/--keep-vectors write those rows' own new-model
    vectors into OUT (--output raw), so queries looking for them find them as the new model does."""
    progress, close = progress_bar(quiet=quiet, as_json=as_json)
    try:
        with ray_logs(quiet or as_json):
            res = transform_file(obj.registry, ref, inp, out, chunk_rows=chunk_rows, output=output, rows=rows,
                                 key=key, column=column, encoder=encoder, ray_address=ray_address, progress=progress,
                                 text_field=text_field, warn=warn, keep_rows=keep_rows, keep_vectors=keep_vectors)
    finally:
        close()
    if res["note"] and not as_json:  # a .parquet's other columns, which a .npy / .fvecs output cannot hold
        click.echo(f"vecbridge: note: {res['note']}", err=True)
    emit(res, as_json, f"wrote {res['rows']} rows ({res['dim']}-d, {output}) to {out} with {res['map']}"
         + (f"; {res['kept']} of them re-embedded, kept as given" if "kept" in res else ""))
