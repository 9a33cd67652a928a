"""``vecbridge steer fit | apply | alias | lens | transfer``: LM-Steer style transforms of one embedding space.

Each command parses, calls one operation of :mod:`service.ops.steers` (``embed_and_register``,
``steer_file``, ``describe_lens`` / ``steer_lens``, ``transfer_and_register``) and renders.
"""

from __future__ import annotations

from pathlib import Path

import click

from align.exceptions import InputError, PairCountError

from ..encoders import get_encoder
from ..io import STREAM_SUFFIXES, check_not_input, read_texts, read_vectors
from ..limits import MAX_LENS_DIRECTIONS, MAX_LENS_K
from ..ops.steers import (alias_held_back, bare_steer_ref, check_steer_eps, check_steer_fit, check_steer_rows,
                          delete_steer_alias, delete_steer_version, describe_lens, embed_and_register, set_steer_alias,
                          space_for_rows, steer_file, steer_lens, steer_text_encoder, transfer_and_register,
                          unreliable_steer_note)
from ..registry.names import parse_ref
from ..storage import check_writable
from ._common import (VERSION, Ctx, alias_command, echo_record, emit, emit_summaries, exit_flagged, file_rows_opts,
                      json_opt, parse_kv, progress_bar, quiet_opt, read_labels, register_opts, versions_summary, warn,
                      warn_aliases_left)
from .prune import prune_command

__all__ = ["steer"]

_ref_opt = click.option("--steer", "ref", required=True, help="NAME, NAME@alias or NAME:version.")
_allow_unreliable_opt = click.option(
    "--allow-unreliable", is_flag=True,
    help="Exit 0 even when the steer is flagged unreliable (registered either way, flagged in its metrics; a "
         "warning says so): its own held-out check found no gain from its labels, or it was carried through a map (or "
         "from a steer) flagged so. --alias is held back either way, as for a map: `steer alias` moves it by hand.")


def _registered(v, alias: str | None) -> tuple[dict, str]:
    """The JSON record and the tail of the result line of a steer registered with ``--alias``: the alias moved
    (`` as @prod``) or held back by the flag (said, not claimed: ``alias_held_back`` in --json too)."""
    held = alias_held_back(v, alias)
    tail = f"; alias {held} not moved (flagged)" if held else f" as @{alias}" if alias else ""
    return {**v.to_dict(), "alias_held_back": held}, tail


def _exit_if_unreliable(v, alias: str | None, allow: bool) -> None:
    """After a registration flagged unreliable: exit 1 (as ``vecbridge fit`` does for a map), its ``--alias`` not
    moved; with ``allow`` (``--allow-unreliable``) the flag is a warning and the command goes on (the alias still not
    moved, as a map fit's: ``steer alias`` moves it by hand)."""
    held = alias_held_back(v, alias)
    if not unreliable_steer_note(v, held):
        return
    if allow:
        warn(unreliable_steer_note(v, held))
        return
    exit_flagged(f"{v.ref} is flagged UNRELIABLE ({v.metrics.get('unreliable_reason')}): it stays in the registry "
                 f"for inspection, but may not move results toward its labels"
                 f"{f'; alias {held} not moved (flagged)' if held else ''}",
                 "accept")


@click.group()
def steer():
    """LM-Steer style transforms of one embedding space: fit, list, show, apply, alias, lens, transfer, delete."""


@steer.command("list")
@click.option("--json", "as_json", is_flag=True, help="Every steer with every version.")
@click.pass_obj
def steer_list(obj: Ctx, as_json):
    """Every steer: space, latest version, live/all versions, aliases, the version a bare name means, unreliable
    ones (GET /v1/steers)."""
    reg = obj.registry
    emit_summaries(reg.list_steers(), as_json, key="steers", versions=reg.list_steer_versions,
                   line=lambda s: f"{s['name']}  {s['space']}({s['dim']})  {versions_summary(s, 'bare')}")


@steer.command("show")
@click.argument("ref")
@json_opt
@click.pass_obj
def steer_show(obj: Ctx, ref, as_json):
    """Show one steer version (NAME, NAME@alias, NAME:version; a deleted NAME:version too)."""
    name, _alias, version = parse_ref(ref)
    reg = obj.registry
    d = (reg.get_steer(name, version) if version is not None else reg.inspect_steer(ref)).to_dict()
    if as_json:
        emit(d, True)
        return
    echo_record(d, skip=("lens",))  # `steer lens` shows it


@steer.command("delete")
@click.argument("name")
@click.argument("version", type=VERSION)
@click.pass_obj
def steer_delete(obj: Ctx, name, version):
    """Soft-delete version VERSION of steer NAME (kept for lineage; no longer resolves): `steer delete formal 2`."""
    v, already, when = delete_steer_version(obj.registry, name, version)
    if already:  # as `registry delete`: no second "deleted", nor the alias warning again
        click.echo(f"steer {name}:{version} was already deleted{f' (at {when})' if when else ''}; nothing changed")
        return
    click.echo(f"deleted steer {name}:{version}")
    if v.aliases:  # the aliases stay on the deleted version (lineage); say what that changes for their users
        bare = bare_steer_ref(obj.registry, name)
        live = any(not x.deleted for x in obj.registry.list_steer_versions(name))
        now = (f"a bare {name!r} is now {bare}" if bare else
               f"a bare {name!r} means no version (its live versions are all flagged unreliable)" if live else
               f"{name!r} has no live version left")
        warn_aliases_left("steer", name, version, v.aliases, now)


prune_command(steer, "steers", "steer")


@steer.command("fit")
@click.option("--space", required=True, help="Space of the steer (created from the data when new).")
@click.option("--vectors", "vectors", type=click.Path(dir_okay=False), default=None, help="Rows (.npy, .fvecs, ...).")
@click.option("--texts", "texts", type=click.Path(dir_okay=False), default=None,
              help="Texts (.txt / .jsonl): embedded with --encoder unless --vectors are given; name the lens items.")
@click.option("--encoder", default=None,
              help="Encoder for --texts: the space's (the default; another model is refused), or the encoder of a "
                   "space that has none registered.")
@click.option("--text-field", default="text", show_default=True, help="JSONL field holding the text.")
@click.option("--labels", required=True, type=click.Path(dir_okay=False),
              help=".npy or .txt: +1 / -1 / 0 per row, at least one +1 and one -1. +1: the attribute; 0: neutral "
                   "context. What -1 does depends on --method: local (the default) scores -1 rows as it scores 0 rows "
                   "(not the attribute) and uses them only for the mean-shift line its prior shrinks toward (--param "
                   "opposite_weight=B > 0 also pushes them down, toward -B; --param prior_weight=0 leaves them "
                   "unused); lm-steer trains them as the opposite (favoured at eps < 0); mean-shift steers along "
                   "mean(+1 rows) - mean(-1 rows).")
@click.option("--name", required=True)
@click.option("--rank", type=int, default=None,
              help="Rank of W for --method lm-steer (default 16); a local steer is rank 1, a mean-shift has no W.")
@click.option("--method", type=click.Choice(["local", "lm-steer", "mean-shift"]), default=None,
              help="Fit method  [default: local]")
@click.option("--param", "params", multiple=True, help="KEY=VALUE fit parameter (JSON values), repeatable.")
@register_opts
@_allow_unreliable_opt
@click.pass_obj
def steer_fit(obj: Ctx, space, vectors, texts, encoder, text_field, labels, name, rank, method, params, random_state,
              alias, description, as_json, quiet, allow_unreliable):
    """Fit a steer and register it as the next version of NAME."""
    if not vectors and not texts:
        raise click.UsageError("give --vectors or --texts")
    reg = obj.registry
    items = read_texts(texts, text_field=text_field) if texts else None
    X = read_vectors(vectors, encoder_option=None, key_option=None) if vectors else None
    _, encoder = space_for_rows(reg, get_encoder, space, texts=X is None, encoder=encoder)
    n = len(items) if X is None else X.shape[0]
    if items is not None and len(items) != n:
        raise PairCountError(f"{len(items)} texts for {n} vectors")
    y = read_labels(labels, n)
    params = parse_kv(params)
    # --method's default replaced a `--param method=...` without a word (a mean-shift asked for, a local steer fitted)
    for key, opt in (("method", method), ("rank", rank)):
        if opt is not None and key in params and params[key] != opt:
            raise click.UsageError(f"--{key} {opt} and --param {key}={params[key]} disagree; give it once")
    params = {**params, "method": method or params.get("method", "local"),
              **({"rank": rank} if rank is not None else {})}
    # before the texts are embedded and the steer fitted: a name that lives in another space (or a bad parameter)
    # was refused only once the fit was done, as the HTTP route refuses it when asked
    check_steer_fit(reg, name=name, space=space, alias=alias, params=params, random_state=random_state)
    progress, close = progress_bar(quiet=quiet, as_json=as_json)
    try:
        v = embed_and_register(reg, get_encoder, space=space, X=X, texts=items if X is None else None, encoder=encoder,
                               items=items, progress=progress, name=name, labels=y, params=params,
                               random_state=random_state, alias=alias, description=description, warn=warn,
                               inputs={"via": "cli", "vectors": vectors and str(Path(vectors).resolve()),
                                       "texts": texts and str(Path(texts).resolve()),
                                       "labels": str(Path(labels).resolve())})
    finally:
        close()
    record, tail = _registered(v, alias)
    emit(record, as_json, f"registered steer {v.ref} ({v.method}, rank {v.rank}, space {v.space}){tail}")
    _exit_if_unreliable(v, alias, allow_unreliable)


@steer.command("apply")
@_ref_opt
@click.option("--eps", type=float, default=1.0, show_default=True,
              help="Strength (0 = identity, 1 the trained strength; negative reverses: away from the +1 attribute, "
                   "which favours the -1 rows only as far as the fit learnt them: see the labels of `steer fit "
                   "--help`).")
@click.argument("inp", type=click.Path(dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--chunk-rows", type=click.IntRange(1), default=65536, show_default=True,
              help="Rows read, steered and written at a time (one chunk is held in memory).")
@file_rows_opts
@click.option("--encoder", default=None,
              help="For a text INP (.txt / .jsonl / .json, embedded as queries): the steer's space's encoder (the "
                   "default; another model is refused), or the encoder of a space that has none registered.")
@click.option("--text-field", default="text", show_default=True, help="JSONL field holding the text.")
@json_opt
@quiet_opt
@click.pass_obj
def steer_apply(obj: Ctx, ref, eps, inp, out, chunk_rows, rows, key, column, encoder, text_field, as_json, quiet):
    """Steer the rows of IN with Q (I + eps W) and write OUT (.npy, .fvecs or .parquet), in chunks, as `vecbridge
    transform` does: a .parquet INP into a .parquet OUT keeps every other column (ids, payloads) row for row;
    another OUT holds the vectors only (a note on stderr, or `note` in --json, names the columns left behind)."""
    check_steer_eps(eps)  # before the input is read (texts: embedded)
    check_not_input(out, "OUT", inp)
    if Path(out).suffix.lower() not in STREAM_SUFFIXES:  # before the input is read (texts: embedded) and steered
        raise InputError(f"OUT {out}: write {', '.join(STREAM_SUFFIXES)}")
    check_writable(out, "OUT")
    progress, close = progress_bar(quiet=quiet, as_json=as_json)
    try:
        res = steer_file(obj.registry, ref, eps, inp, out, chunk_rows=chunk_rows, rows=rows, key=key, column=column,
                         encoder=encoder, text_field=text_field, progress=progress, warn=warn)
    finally:
        close()
    if res["note"] and not as_json:  # a .parquet's other columns, which a .npy / .fvecs output cannot hold
        click.echo(f"vecbridge: note: {res['note']}", err=True)
    emit(res, as_json, f"wrote {res['rows']} rows steered by {res['steer']} (eps {eps:g}) to {out}")


@steer.command("transfer")
@_ref_opt
@click.option("--map", "map_ref", required=True, help="Map from the steer's space: NAME, NAME@alias or NAME:version.")
@click.option("--name", default=None,
              help="Name in the map's target space (default: STEER-TARGETSPACE, e.g. formal-e5).")
@click.option("--alias", default=None, help="Point this alias at the new version.")
@click.option("--description", default="", help="Free text kept with the version.")
@json_opt
@_allow_unreliable_opt
@click.pass_obj
def steer_transfer(obj: Ctx, ref, map_ref, name, alias, description, as_json, allow_unreliable):
    """Carry a steer through a map into the map's target space and register it there.

    W_B = H^T W_A H (H = pinv(M)^T), with the map's frames folded in so that eps moves results about
    as far in the new space as in the old (align.transfer_steer)."""
    v = transfer_and_register(obj.registry, ref, map_ref, name=name, alias=alias, description=description)
    record, tail = _registered(v, alias)
    emit(record, as_json, f"registered steer {v.ref} in space {v.space} (carried from "
                          f"{v.params.get('steer', ref)} through {v.params.get('map', map_ref)}; eps scale "
                          f"{v.metrics.get('eps_scale', 1.0):.3g}){tail}")
    _exit_if_unreliable(v, alias, allow_unreliable)


alias_command(steer, "Point steer NAME@ALIAS at VERSION (or --delete it); a bare NAME means its prod version "
                     "while prod is set.", set_steer_alias, delete_steer_alias)


@steer.command("lens")
@_ref_opt
@click.option("--texts", type=click.Path(dir_okay=False), default=None,
              help="Rank these texts along each direction (embedded with --encoder or the space's).")
@click.option("--vectors", type=click.Path(dir_okay=False), default=None, help="Embeddings of --texts, if at hand.")
@click.option("--encoder", default=None)
@click.option("-k", "--k", "k", type=click.IntRange(1, MAX_LENS_K), default=5, show_default=True,
              help="Items at each extreme.")
@click.option("--directions", type=click.IntRange(1, MAX_LENS_DIRECTIONS), default=4, show_default=True)
@json_opt
@click.pass_obj
def steer_lens_cmd(obj: Ctx, ref, texts, vectors, encoder, k, directions, as_json):
    """Singular directions of a steer with the extreme items (stored at fit time, or over --texts)."""
    reg = obj.registry
    info = reg.inspect_steer(ref)
    s = reg.load_steer(info)
    out = describe_lens(info, s, k=k, n_directions=directions, stored=not texts)  # the lens stored at fit time
    if texts:
        items = read_texts(texts)
        registered = reg.get_space(info.space).encoder
        if vectors:
            X = read_vectors(vectors, encoder_option=None, key_option=None)
        else:
            X = read_vectors(texts, encoder=(encoder := steer_text_encoder(reg, info.space, encoder)))
        if vectors or not registered:  # the space's own encoder embeds its rows; vectors, another may be anyone's
            check_steer_rows(reg, X, info.space, use="lens", ref=info.ref, warn=warn,
                             name=f"the rows of {Path(vectors).name}" if vectors else
                             f"the texts of {Path(texts).name} embedded by {encoder}")
        out["directions"] = steer_lens(s, X, items, k=k, n_directions=directions)
    lines = [f"steer {info.ref}: sigma " + " ".join(f"{x:.3g}" for x in out["sigma"])]
    for d in out["directions"]:
        lines.append(f"  direction {d['direction']} (sigma {d['sigma']:.3g})")
        lines.append("    + " + " | ".join(_item_name(it) for it in d["positive"]))
        lines.append("    - " + " | ".join(_item_name(it) for it in d["negative"]))
    if not out["directions"]:
        lines.append("  (no named items: fit with --texts, or pass --texts here)")
    emit(out, as_json, "\n".join(lines))


def _item_name(item: dict) -> str:
    return item.get("text", str(item["index"]))
