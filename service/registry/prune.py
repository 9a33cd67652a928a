"""``registry prune`` / ``steer prune``: keep the newest N live versions of each name, soft-delete the rest.

Every refit keeps its version (and, until ``registry gc``, its artifact and report) for good; a deployment that refits
weekly deleted hundreds of versions one ``registry delete`` at a time. :func:`prune_versions` deletes, per name, the
live versions beyond the newest ``keep_last``, by the same soft delete as ``registry delete``
(:meth:`~.entity.VersionedStore.mark_deleted`: the rows stay for lineage, ``registry gc`` frees the files later), but
never one of these, each kept with its reason:

- ``newest``: one of the newest ``keep_last`` live versions (deleted ones do not count);
- ``alias NAME``: a version an alias points at (``prod`` and any other: deleting it would break ``NAME@alias``);
- ``bare name``: the version a bare name means (a map's live ``prod`` version, else its newest reliable one, which
  may be older than ``keep_last`` unreliable refits; a steer's ``prod`` version, else its newest);
- ``younger``: with ``older_than_s``, one created less than that long ago.

Each name is planned and marked in one write transaction that first locks the name's row (PostgreSQL's ``FOR
UPDATE``; SQLite has one writer): a fit registering a version and an alias being set on one (which takes the same
lock) run before or after it, never in between, so no alias ever lands on a version the prune deletes.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

from align.exceptions import InputError

from .errors import unknown
from .quality import reliable

__all__ = ["prune_versions"]


def prune_versions(reg, key: str, names: list[str] | None, *, keep_last: int, older_than_s: float | None = None,
                   dry_run: bool = False) -> dict:
    """Prune the versions of ``names`` (every name of the kind when empty or None) of kind ``key`` (``"maps"``,
    ``"steers"``); see the module docstring. ``dry_run``: plan only, delete nothing.

    Returns ``{"kind", "keep_last", "older_than_s", "dry_run", "deleted": [refs], "names": [{"name", "deleted":
    [versions], "kept": [{"version", "why": [reasons]}]}]}``. An unknown name is a NotFoundError (with a suggestion)
    before anything is deleted; ``keep_last`` below 1 an InputError (prune never deletes every version).
    """
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
        raise InputError(f"keep_last must be a whole number of at least 1, got {keep_last!r} (prune never deletes "
                         "every live version: `registry delete` deletes one)")
    if older_than_s is not None and not (math.isfinite(older_than_s) and older_than_s >= 0):
        raise InputError(f"older_than_s must be a number of seconds >= 0, got {older_than_s!r}")
    store = reg.entities[key]
    k = store.kind
    with reg.db.tx() as t:
        if names:
            for name in names:
                store.check(name)
                if not store.exists(t, name):
                    raise unknown(t, k.names, k.noun, name)
        else:
            names = [r["name"] for r in t.q(f"SELECT name FROM {k.names} ORDER BY name{reg.db.byte_order}")]
    try:
        cutoff = None if older_than_s is None else datetime.now(UTC) - timedelta(seconds=older_than_s)
    except OverflowError:  # before the first year datetime knows: no version is that old
        cutoff = datetime.min.replace(tzinfo=UTC)
    out = []
    for name in dict.fromkeys(names):  # a name given twice is pruned once
        with reg.db.tx() as t:  # read first, no lock: a dry run works for a read-only role (or a standby)
            plan = _plan(reg, store, t, name, keep_last, cutoff, write=False)
        if plan["deleted"] and not dry_run:  # planned again under the name's lock, and marked: a name with nothing
            # to delete is not written (a nightly prune of N maps was N writes, N cache invalidations)
            plan = reg._write(lambda t, n=name: _plan(reg, store, t, n, keep_last, cutoff, write=True))
        out.append(plan)
    return {"kind": key, "keep_last": keep_last, "older_than_s": older_than_s, "dry_run": dry_run,
            "deleted": [f"{p['name']}:{v}" for p in out for v in p["deleted"]], "names": out}


def _plan(reg, store, t, name: str, keep_last: int, cutoff, *, write: bool) -> dict:
    """What to delete of ``name`` and why the rest stays (read, and with ``write`` marked, in transaction ``t``)."""
    k = store.kind
    if write:  # fits and alias moves on the name wait (a read needs no lock, nor the UPDATE grant FOR UPDATE takes)
        store.lock_name(t, name)
    rows = store.rows(t, name, live=True, newest_first=True, cols="version, created_at, metrics, method")
    aliases: dict[int, list[str]] = {}
    for r in t.q(f"SELECT alias, version FROM {k.aliases} WHERE name = ? ORDER BY alias", (name,)):
        aliases.setdefault(int(r["version"]), []).append(r["alias"])
    live = [int(r["version"]) for r in rows]
    pinned = next((v for v in live if reg.path_alias in aliases.get(v, ())), None)
    good = [int(r["version"]) for r in rows  # a bare steer name skips a flagged version too (resolve_steer)
            if (reliable(json.loads(r["metrics"] or "{}"), r["method"]) if k.noun == "map"
                else json.loads(r["metrics"] or "{}").get("reliable") is not False)]
    bare = pinned if pinned is not None else next(iter(good), None)
    kept, deleted = [], []
    for i, r in enumerate(rows):
        v = live[i]
        why = (["newest"] if i < keep_last else []) + [f"alias {a}" for a in aliases.get(v, ())]
        why += ["bare name"] if v == bare else []
        if not why and cutoff is not None and not _older(r["created_at"], cutoff):
            why.append("younger")
        if why:
            kept.append({"version": v, "why": why})
        else:
            deleted.append(v)
    if write and deleted:
        store._hook("prune_planned")  # crash and race tests stop the prune here
        store.mark_deleted(t, name, deleted)
    return {"name": name, "deleted": sorted(deleted), "kept": kept}


def _older(created_at, cutoff) -> bool:
    """True when ``created_at`` (an ISO time this registry wrote) is at or before ``cutoff``; a time it cannot read
    is not known to be old enough (as ``registry gc --older-than`` reads ``deleted_at``)."""
    try:
        when = datetime.fromisoformat(created_at)
    except (TypeError, ValueError):
        return False
    return (when if when.tzinfo else when.replace(tzinfo=UTC)) <= cutoff
