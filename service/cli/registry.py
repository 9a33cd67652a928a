"""``vecbridge registry ...`` and ``vecbridge spaces``: inspect and edit the registry."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..encoders import get_encoder
from ..figures import TRAINING_PAIRS, labelled_selection, train_cos_text
from ..ops.maps import create_space, delete_space
from ..registry import NoReliableVersionError, NotFoundError
from ..registry.gc import GC_WAIT_S
from ..registry.names import parse_ref
from ._common import (
    VERSION,
    Ctx,
    FiniteRange,
    alias_command,
    echo_record,
    emit,
    emit_summaries,
    json_opt,
    version_record,
    versions_summary,
    warn,
    warn_aliases_left,
)
from .prune import Duration, prune_command

__all__ = ["registry", "spaces"]


@click.group()
def registry():
    """Inspect and edit the registry."""


@registry.command("list")
@click.option("--json", "as_json", is_flag=True, help="Every map with every version and its lineage.")
@click.pass_obj
def registry_list(obj: Ctx, as_json):
    """Every map: spaces, latest version, live/all versions, aliases, the version paths use, unreliable ones."""
    reg = obj.registry

    def line(m):
        return (f"{m['name']}  {m['source_space']}({m['source_dim']}) -> {m['target_space']}({m['target_dim']})  "
                f"{versions_summary(m, 'path')}")

    emit_summaries(reg.list_maps(), as_json, key="maps", versions=reg.list_versions, line=line,
                   extra={"spaces": [s.to_dict() for s in reg.list_spaces()]} if as_json else None)


@registry.command("show")
@click.argument("ref")
@json_opt
@click.pass_obj
def registry_show(obj: Ctx, ref, as_json):
    """Show one version (NAME, NAME@alias, NAME:version)."""
    reg = obj.registry
    name, _alias, version = parse_ref(ref)
    d = version_record(reg, reg.get_version(name, version) if version is not None else reg.inspect(ref))
    if as_json:
        emit(d, True)
        return
    # the figures as the fit's own line labels them: a bare `train_cos` told neither its frame nor that it is of the
    # training pairs; an old auto fit's candidates' raw `cos` is shown as cos_raw, as new records name it
    metrics = d["metrics"] = {**d["metrics"], **({"selection": labelled_selection(d["metrics"]["selection"])}
                                                 if "selection" in d["metrics"] else {})}
    keys = list(d)
    at = keys.index("metrics") + 1
    echo_record({k: d[k] for k in keys[:at]})
    cos = train_cos_text(metrics, d.get("params"))
    if cos:  # under the metrics it labels
        click.echo(f"{'train_cos':16} {cos} {TRAINING_PAIRS}")
    echo_record({k: d[k] for k in keys[at:]})


alias_command(registry, "Point NAME@ALIAS at VERSION (or --delete it); a bare NAME means its prod version while "
                        "prod is set.", lambda reg, *a, **kw: reg.set_alias(*a, **kw),
              lambda reg, *a, **kw: reg.delete_alias(*a, **kw))


@registry.command("tag")
@click.argument("name")
@click.argument("version", type=VERSION)
@click.argument("key")
@click.argument("value", required=False)
@click.option("--delete", is_flag=True)
@click.pass_obj
def registry_tag(obj: Ctx, name, version, key, value, delete):
    """Set tag KEY of map NAME's version VERSION to VALUE (or --delete it): `registry tag minilm-e5 2 owner me`."""
    if delete:  # a tag that is not set: NotFoundError naming those that are (exit 2; HTTP: the same 404)
        obj.registry.delete_tag(name, version, key)
        click.echo(f"deleted tag {key} of {name}:{version}")
        return
    if value is None:
        raise click.UsageError("give a VALUE (or --delete)")
    obj.registry.set_tag(name, version, key, value)
    click.echo(f"{name}:{version} {key}={value}")


@registry.command("delete")
@click.argument("name")
@click.argument("version", type=VERSION)
@click.pass_obj
def registry_delete(obj: Ctx, name, version):
    """Soft-delete version VERSION of map NAME (kept for lineage; no longer resolves; `registry gc` frees its files):
    `registry delete minilm-e5 2`. `registry prune` deletes every version beyond the newest N at once."""
    v, already, when = obj.registry.delete_version_once(name, version)
    if already:  # said "deleted" again, and warned of its aliases again: as if this delete had changed something
        click.echo(f"{name}:{version} was already deleted{f' (at {when})' if when else ''}; nothing changed")
        return
    click.echo(f"deleted {name}:{version}")
    if v.aliases:  # the aliases stay on the deleted version (lineage); say what that changes for their users
        try:
            now = f"a bare {name!r} is now {name}:{obj.registry.resolve(name).version}"
        except NoReliableVersionError:
            now = f"a bare {name!r} means no version (its live versions are all flagged unreliable)"
        except NotFoundError:
            now = f"{name!r} has no live version left"
        warn_aliases_left("registry", name, version, v.aliases, now)


@registry.command("export")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--name", "names", multiple=True, help="Only these maps and steers (repeatable).")
@click.pass_obj
def registry_export(obj: Ctx, path, names):
    """Write a bundle (PATH.zip, or a folder) with records, artifacts and reports."""
    obj.registry.export(path, list(names) or None)
    click.echo(f"exported to {path}")


LISTS = ("deleted_here", "aliases_kept", "lineage_elsewhere")  # an import's lists, said apart from its counts


@registry.command("import")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--renumber", is_flag=True, help="Add colliding versions as new versions instead of failing.")
@json_opt
@click.pass_obj
def registry_import(obj: Ctx, path, renumber, as_json):
    """Load a bundle written by `registry export`. A version deleted here stays deleted: one the bundle has live is
    listed as "present here deleted; not restored"."""
    counts = obj.registry.import_(path, on_conflict="renumber" if renumber else "error")
    gone, kept = counts.get("deleted_here", []), counts.get("aliases_kept", [])
    emit(counts, as_json, " ".join(f"{k}={v}" for k, v in counts.items() if k not in LISTS)
         + (f"\n{len(gone)} version(s) present here deleted; not restored: {', '.join(gone[:10])}"
            f"{' ...' if len(gone) > 10 else ''}" if gone else ""))
    if kept and not as_json:  # an import never moves an alias: a replica synced this way kept serving its old version
        warn(f"{len(kept)} alias(es) here differ from the bundle's (an import never moves an alias, nor sets one on a "
             "version deleted here): "
             f"{'; '.join(kept[:10])}{' ...' if len(kept) > 10 else ''}; to follow the bundle, move them with "
             "`vecbridge registry alias NAME ALIAS VERSION` (`vecbridge steer alias` for a steer)")
    if (far := counts.get("lineage_elsewhere", [])) and not as_json:
        warn(f"{len(far)} lineage reference(s) name a version the bundle lacks and no version here matches (kept with "
             f"its artifact's sha256 in inputs): {'; '.join(far[:10])}{' ...' if len(far) > 10 else ''}")


@registry.command("verify")
@click.option("--sweep", is_flag=True,
              help="Delete temporary files left by crashed writers (untouched for 10 minutes).")
@click.option("--json", "as_json", is_flag=True,
              help="Accepted and ignored: the report is JSON either way (scripts pass --json to every command).")
@click.pass_obj
def registry_verify(obj: Ctx, sweep, as_json):
    """Check the database file (SQLite: PRAGMA quick_check), every artifact's sha256 and every alias; print the JSON
    report; exit 2 when something is wrong (a damaged database is listed under "database": restore it from a
    backup). Orphan artifacts (files no version names) are listed, not a failure: `registry gc --orphans` removes
    them once 10 minutes old."""
    res = obj.registry.verify(sweep=sweep)
    emit(res, True)
    if gone := res["missing_reports"]:  # not a failure: the maps serve, their reports are 404s
        warn(f"{len(gone)} map version(s) lack their fit report: {', '.join(x.split(': ')[0] for x in gone[:10])}"
             f"{' ...' if len(gone) > 10 else ''}")
    if not res["ok"]:
        sys.exit(2)


@registry.command("gc")
@click.option("--dry-run", is_flag=True, help="Say what would be removed (and the bytes); remove nothing.")
@click.option("--older-than", "older_than", type=Duration(), default=None, metavar="DURATION",
              help="Only versions deleted at least this long ago (30d, 12h, 90m) [default: every deleted version].")
@click.option("--wait", "wait_s", type=FiniteRange(0, 86400), default=GC_WAIT_S, show_default=True,
              metavar="SECONDS", help="How long to wait for fits, imports, exports and backups holding the artifact "
              "folder; then exit 75, nothing removed.")
@click.option("--orphans", is_flag=True, help="Also remove artifact files no version names (a writer killed before "
              "its commit), untouched for 10 minutes; without it they are only counted. Refused (exit 2) where no "
              "version names any file there: the wrong database (a mistyped URL or data dir, one not restored yet).")
@json_opt
@click.pass_obj
def registry_gc(obj: Ctx, dry_run, older_than, wait_s, orphans, as_json):
    """Give back the disk of deleted versions: remove each one's artifact (kept while a live version, or a deleted
    one left by --older-than, holds the same bytes) and its fit report. The records stay, for lineage, marked
    collected (`collected_at`). Safe while the service runs and fits register: a fit or import committing, a
    `registry export` and a `vecbridge backup` copying files hold the artifact folder; gc waits for them up to
    --wait seconds (60), then exits 75 having removed nothing (retry later). --dry-run waits for nothing."""
    res = obj.registry.gc(older_than_s=older_than, dry_run=dry_run, wait_s=wait_s, orphans=orphans)
    lost = len(res["orphans"])
    refs = [f"{noun} {ref}" for key, noun in (("maps", "map"), ("steers", "steer")) for ref in res["collected"][key]]
    kept = len(res["artifacts_kept"])  # files: versions sharing one counted it once each
    text = (f"{'would collect' if dry_run else 'collected'} {len(refs)} deleted version(s)"
            f"{': ' + ', '.join(refs[:10]) + (' ...' if len(refs) > 10 else '') if refs else ''}\n"
            f"{'would remove' if dry_run else 'removed'} {len(res['artifacts'])} artifact(s) "
            f"({_kb(res['artifact_bytes'])}) and {len(res['reports'])} report(s) ({_kb(res['report_bytes'])}): "
            f"{_kb(res['bytes_freed'])} {'to free' if dry_run else 'freed'}"
            + (f"\n{kept} artifact(s) kept: a live version, or a deleted one younger than --older-than, holds the "
               "same bytes" if kept else "")
            + (f"\n{len(res['reports_kept'])} report(s) kept: outside the report folder (remove them yourself): "
               f"{', '.join(res['reports_kept'][:3])}{' ...' if len(res['reports_kept']) > 3 else ''}"
               if res["reports_kept"] else "")
            + (f"\n{res['younger']} deleted version(s) younger than --older-than left" if res["younger"] else "")
            + ("" if not lost else f"\n{'would remove' if dry_run else 'removed'} {lost} orphan artifact(s) no "
               f"version names ({_kb(res['orphan_bytes'])})" if orphans else f"\n{lost} orphan artifact(s) no "
               "version names left (a writer killed before its commit): --orphans removes them"))
    emit(res, as_json, text)


prune_command(registry, "maps", "map")


def _kb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


@registry.command("path")
@click.argument("source_space")
@click.argument("target_space")
@click.option("--alias", default=None,
              help="The alias that pins a map's version for paths [default: the path_alias setting, prod].")
@click.option("--candidates", is_flag=True, help="Also list every direct map between the two spaces, best first.")
@json_opt
@click.pass_obj
def registry_path(obj: Ctx, source_space, target_space, alias, candidates, as_json):
    """The chain of maps that search and embeddings use from SOURCE_SPACE to TARGET_SPACE.

    Per map: its prod (path_alias setting, or --alias) version, else its newest version not flagged unreliable.
    Between the same two spaces: the alias-pinned map first, then the best held-out top-1 on a common pool of
    1,000 (per map the one recorded by `eval --record`, else the fit's own: its held-out split or 5-fold
    cross-validation), then the best training top-1, then the newest; never name order. Of chains with the fewest
    maps, the one all pinned, else the best product of held-out figures, then the newest maps; one map longer wins
    only all pinned, or with held-out figures whose product beats. Pin another map in requests with `map`.
    """
    reg = obj.registry
    chain = reg.find_path(source_space, target_space, alias)
    out = {"path": [v.ref for v in chain]}
    text = " -> ".join([source_space] + [f"[{v.ref}] {v.target_space}" for v in chain])
    if candidates:
        cands = reg.path_candidates(source_space, target_space, alias)
        out["candidates"] = [{"ref": v.ref, "aliases": v.aliases, "quality": list(reg.quality(v)),
                              "quality_source": reg.quality_source(v)} for v in cands]
        from ..registry.quality import quality_words

        by = {"eval": " (eval --record)", "fit": " (fit)"}  # a small pool's figure is given as measured too
        text += "".join(f"\n  {i + 1}. {v.ref}  aliases {','.join(v.aliases) or '-'}  {quality_words(v)}"
                        f"{by.get(reg.quality_source(v), '')}" for i, v in enumerate(cands))
    emit(out, as_json, text)


@click.group(invoke_without_command=True)
@json_opt
@click.pass_context
def spaces(ctx, as_json):
    """List spaces (or `spaces add` / `spaces delete`)."""
    if ctx.invoked_subcommand is None:
        items = [s.to_dict() for s in ctx.obj.registry.list_spaces()]
        if as_json:
            emit(items, True)
        else:
            for s in items:
                click.echo(f"{s['name']}  {s['dim']}-d  encoder={s['encoder'] or '-'}")
            if not items:
                click.echo("(no spaces)")


@spaces.command("delete")
@click.argument("name")
@click.pass_obj
def spaces_delete(obj: Ctx, name):
    """Remove space NAME while no map, steer or index uses it (the same operation as DELETE /v1/spaces/NAME)."""
    from ..indexes import IndexStore  # FAISS: loaded only here

    s = delete_space(obj.registry, IndexStore(obj.settings.data_dir / "indexes"), name)
    click.echo(f"space {s.name} ({s.dim}-d) deleted")


@spaces.command("add")
@click.argument("name")
@click.option("--dim", type=int, default=None, help="Width of the vectors (default: the encoder's).")
@click.option("--encoder", default=None, help="Encoder that embeds texts into this space (checked against --dim).")
@click.option("--query-prefix", default="", help="Record of the prefix queries of this space are embedded with, for "
              "those who embed outside vecbridge; stored, never added (the encoders add their model's own).")
@click.option("--passage-prefix", default="", help="As --query-prefix, for documents.")
@click.option("--description", default="")
@click.pass_obj
def spaces_add(obj: Ctx, name, dim, encoder, query_prefix, passage_prefix, description):
    """Register space NAME (the same operation as POST /v1/spaces)."""
    s, _ = create_space(obj.registry, get_encoder, name=name, dim=dim, encoder=encoder, query_prefix=query_prefix,
                        passage_prefix=passage_prefix, description=description)
    click.echo(f"space {s.name} ({s.dim}-d)")
