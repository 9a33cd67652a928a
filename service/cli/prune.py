"""``vecbridge registry prune`` and ``vecbridge steer prune`` (one command shape for maps and steers, as ``alias``), and
the DURATION type they share with ``registry gc --older-than``."""

from __future__ import annotations

import re
from typing import ClassVar

import click

from ._common import Ctx, emit, json_opt

__all__ = ["Duration", "prune_command"]


class Duration(click.ParamType):
    """A length of time: a number and its unit, ``s``, ``m``, ``h``, ``d`` or ``w`` (``30d``, ``12h``, ``1.5w``), at
    most 100 years (``1000000d`` was an OverflowError, exit 3)."""

    name = "duration"
    UNITS: ClassVar[dict[str, int]] = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    MAX_S = 100 * 365 * 86400

    def convert(self, value, param, ctx):
        m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([smhdw])", str(value).strip().lower())  # not \d: "١d" was 1 day
        if m is None:
            self.fail(f"{value!r} is not a duration: a number and a unit, s m h d or w (30d, 12h)", param, ctx)
        seconds = float(m[1]) * self.UNITS[m[2]]
        if not seconds <= self.MAX_S:  # inf too (a number of 400 digits)
            self.fail(f"{value!r} is more than 100 years ({self.MAX_S // 86400}d)", param, ctx)
        return seconds


def prune_command(group, key: str, noun: str) -> None:
    """Register ``GROUP prune [NAME ...] --keep-last N [--older-than DURATION] [--dry-run] [--json]`` on ``group``
    for kind ``key`` (``"maps"``, ``"steers"``): :func:`service.registry.prune.prune_versions`."""

    @group.command("prune", help=f"Soft-delete the versions of each {noun} NAME (every {noun} when none is given) "
                   f"beyond its newest N live ones, as `{group.name} delete` does one (records kept for lineage), "
                   "keeping every version an alias points at (prod and any other) and the one a bare NAME means, even "
                   "when older; says what it kept and why. `vecbridge registry gc` then frees the deleted versions' "
                   "files. "
                   f"`{group.name} prune --keep-last 10 --dry-run`.")
    @click.argument("names", nargs=-1, metavar="[NAME]...")
    @click.option("--keep-last", "keep_last", type=click.IntRange(min=1), required=True, metavar="N",
                  help="Live versions to keep per name, newest first (at least 1).")
    @click.option("--older-than", "older_than", type=Duration(), default=None, metavar="DURATION",
                  help="Only delete versions created at least this long ago (30d, 12h) [default: any age].")
    @click.option("--dry-run", is_flag=True, help="Say what would be deleted and kept; delete nothing.")
    @json_opt
    @click.pass_obj
    def prune_cmd(obj: Ctx, names, keep_last, older_than, dry_run, as_json):
        from ..registry.prune import prune_versions

        res = prune_versions(obj.registry, key, list(names), keep_last=keep_last, older_than_s=older_than,
                             dry_run=dry_run)
        emit(res, as_json, _text(res, noun))


def _text(res: dict, noun: str) -> str:
    """One line per name (what went, what stayed grouped by why), then the total and what frees the files."""
    verb = "would delete" if res["dry_run"] else "deleted"
    lines = []
    for p in res["names"]:
        groups: dict[tuple, list[int]] = {}
        for k in p["kept"]:
            groups.setdefault(tuple(k["why"]), []).append(k["version"])
        kept = "; ".join(f"{_few(vs)} ({', '.join(why)})" for why, vs in groups.items())
        gone = f": {_few(p['deleted'])}" if p["deleted"] else ""
        lines.append(f"{noun} {p['name']}: {verb} {len(p['deleted'])} version(s){gone}; kept {len(p['kept'])}"
                     f"{': ' + kept if kept else ''}")
    n = len(res["deleted"])
    lines.append(f"{verb} {n} version(s) of {len(res['names'])} {noun}(s)"
                 + ("" if not n else " (nothing deleted: --dry-run)" if res["dry_run"]
                    else "; `vecbridge registry gc` frees their files"))
    return "\n".join(lines)


def _few(versions: list[int], limit: int = 12) -> str:
    return ", ".join(map(str, versions[:limit])) + (f", ... ({len(versions)} in all)" if len(versions) > limit else "")
