"""``registry gc``: give back the disk of deleted versions.

A delete is soft (:meth:`~.entity.VersionedStore.delete`): the row stays, for lineage, and so did the version's
artifact and HTML report, for good (~220 KB a 64-d fit, ~0.8 MB at 384-d: a registry that had deleted 148 of its 155
versions held 37 MB of them, and ``registry verify`` said nothing). :func:`collect_deleted` removes them:

- **which**: every deleted version (maps and steers) not collected yet, or only those deleted at least
  ``older_than_s`` ago (``deleted_at``; a deleted row without one, written by an older release, gets one now);
- **what**: its artifact, unless a version that is not collected names the same file (artifacts are
  content-addressed: identical bytes are one file for every version holding them), and its report; the row stays
  with ``collected_at`` set, so ``registry verify`` no longer looks for the files and a read of the version says
  they were collected (DeletedVersionError, 404);
- **safely**: under :meth:`.store.ArtifactStore.exclusive`, the lock every writer holds (shared) from storing its
  artifact to committing its row (:meth:`~.entity.VersionedStore.register`, bundle imports), and a bundle export or
  ``vecbridge backup`` from reading the rows to copying the last artifact: a writer that found the file there has
  committed before gc reads the rows (the file is kept), or waits for gc and writes the file again; an export or a
  backup copies the files of the rows it read. The rows are marked in one write transaction before a file is
  removed; a crash in between leaves files that only collected rows name, which the next gc removes (``verify``
  lists them as orphans meanwhile).
- **orphans**: a file no row names at all (a writer killed between storing its artifact and committing its row) is
  removed only on request (``orphans=True``, ``registry gc --orphans``), under the same lock, once untouched for
  ``store.STALE_TMP_S``; otherwise listed in ``orphans``. Not by default: opened on the wrong database (a mistyped
  registry URL, an empty one, another registry's) beside the right artifact folder, every file looks an orphan, and a
  routine gc would remove every artifact of the registry that names them. So ``orphans=True`` refuses
  (ConflictError, nothing changed) where files are there but no row names any of them; and only regular files are
  orphans, unlinked where they lie: a link is none (its target may be a live version's artifact, or not ours). The
  folder is walked before the rows are marked collected, and a plain gc that cannot walk it lists no orphans: nothing
  after the commit fails the run.
- **only its own reports**: a report is removed only when its file, every link followed, lies in the registry's
  report folder (``reg.report_dir``); a recorded ``report_path`` that is absolute, climbs out with ``..`` or is a
  link to elsewhere (``register_version(report_path=...)`` stores what its caller passes, ``run_fit(report_dir=)``
  outside that folder records an absolute path) is kept and listed in ``reports_kept``: it may be a user's own file.
  A map's folder of reports (``reports/<name>/``) that gc emptied, or an earlier gc left empty, is removed (only if
  empty: ``rmdir``; a link is not followed).
"""

from __future__ import annotations

import math
import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

from align.exceptions import InputError

from ..urls import safe_url
from .entity import now
from .errors import ConflictError
from .models import columns
from .store import STALE_TMP_S

__all__ = ["GC_WAIT_S", "collect_deleted"]

#: the longest ``registry gc`` waits for writers between storing an artifact and committing its row
GC_WAIT_S = 60.0


def collect_deleted(reg, *, older_than_s: float | None = None, dry_run: bool = False,
                    wait_s: float = GC_WAIT_S, orphans: bool = False) -> dict:
    """Remove the files of deleted versions (see the module docstring); ``dry_run``: only say what would go.

    Returns ``{"dry_run", "older_than_s", "collected": {"maps": [refs], "steers": [refs]}, "artifacts": [paths
    relative to the artifact folder], "reports": [paths], "artifact_bytes", "report_bytes", "bytes_freed",
    "shared": {"maps": [refs], "steers": [refs]}, "artifacts_kept": [paths], "younger": N, "reports_kept": [paths]}``.
    ``shared``: versions collected whose artifact stays (a version not collected, live or deleted and left by
    ``older_than_s``, holds the same bytes), ``artifacts_kept`` those files, each once; ``younger``: deleted versions
    ``older_than_s`` left; ``reports_kept``: reports of collected versions left in place, outside
    ``reg.report_dir`` (see the module docstring); ``orphans``: artifact files no row names, untouched for
    ``STALE_TMP_S``, and ``orphan_bytes`` (in ``bytes_freed``): those removed with ``orphans=True`` (left, and 0,
    without). Files already gone count 0 bytes; a dry run's bytes are those it would free.
    """
    if older_than_s is not None and not (math.isfinite(older_than_s) and older_than_s >= 0):
        raise InputError(f"older_than_s must be a number of seconds >= 0, got {older_than_s!r}")
    stamp = now()
    try:
        cutoff = None if older_than_s is None else datetime.now(UTC) - timedelta(seconds=older_than_s)
    except OverflowError:  # before the first year datetime knows: no deletion is that old
        cutoff = datetime.min.replace(tzinfo=UTC)

    def due(deleted_at) -> bool:
        if cutoff is None:
            return True
        try:
            return deleted_at is not None and datetime.fromisoformat(deleted_at) <= cutoff
        except (TypeError, ValueError):  # not a time this registry wrote: not known to be old enough
            return False

    def plan(t, write: bool) -> dict:
        go, younger, keep, dead = [], 0, (set(), set()), (set(), set())  # (artifacts, reports) kept / that may go
        fresh = set()  # reports of the versions collected now (an earlier gc listed those it kept)
        for key, store in reg.entities.items():
            k = store.kind
            report = ", report_path" if "report_path" in columns(k.record) else ""
            if write:  # deleted by a release that kept no time: the clock starts now
                t.q(f"UPDATE {k.table} SET deleted_at = ? WHERE deleted = 1 AND deleted_at IS NULL", (stamp,))
            for r in t.q(f"SELECT name, version, artifact_path, deleted, deleted_at, collected_at{report} "
                         f"FROM {k.table} ORDER BY name, version"):
                now_due = r["collected_at"] is None and bool(r["deleted"]) and due(r["deleted_at"])
                younger += r["collected_at"] is None and bool(r["deleted"]) and not now_due
                into = dead if now_due or r["collected_at"] is not None else keep
                into[0].add(r["artifact_path"])
                if report and r["report_path"]:
                    into[1].add(_real(reg.report_path_of(r["report_path"])))
                    if now_due:
                        fresh.add(_real(reg.report_path_of(r["report_path"])))
                if now_due:
                    go.append((key, k.table, r["name"], int(r["version"]), r["artifact_path"]))
        if write:
            for _, table, name, version, _ in go:
                t.q(f"UPDATE {table} SET collected_at = ? WHERE name = ? AND version = ?", (stamp, name, version))
        reports = dead[1] - keep[1]
        ours = {r for r in reports if r.is_relative_to(_real(reg.report_dir))}
        return {"go": go, "artifacts": sorted(dead[0] - keep[0]), "reports": sorted(ours), "named": dead[0] | keep[0],
                "reports_kept": sorted(r for r in (reports - ours) & fresh if _size(r)),
                "shared": [(key, f"{name}:{version}") for key, _, name, version, art in go if art in keep[0]],
                "kept": sorted({art for *_, art in go if art in keep[0]}),
                "younger": younger}

    def walked(t, write: bool) -> dict:  # the folder is walked before the rows are marked: a failure undoes them
        p = plan(t, write)
        p["lost"] = _orphans(reg, p["named"], orphans)
        return p

    if dry_run:
        with reg.db.tx() as t:
            p = walked(t, False)
        lost = [a for a, _ in p["lost"]]
        sizes = ([reg.store.size(a) or 0 for a in p["artifacts"]], [_size(r) for r in p["reports"]],
                 [n if orphans else 0 for _, n in p["lost"]])
    else:
        with reg.store.exclusive(wait_s):  # no writer between storing an artifact and committing its row, to the end
            p = reg._write(lambda t: walked(t, True))  # rows read under the lock: none can name the orphans meanwhile
            lost = [a for a, _ in p["lost"]]
            sizes = ([_remove(reg.store.path(a)) for a in p["artifacts"]], [_remove(r) for r in p["reports"]],
                     [_remove_orphan(reg.store.root / a) if orphans else 0 for a in lost])
            _remove_emptied({r.parent for r in p["reports"]}, _real(reg.report_dir))  # an earlier gc's left too
    collected = {key: [f"{name}:{version}" for k, _, name, version, _ in p["go"] if k == key] for key in reg.entities}
    shared = {key: [ref for k, ref in p["shared"] if k == key] for key in reg.entities}
    ab, rb, ob = sum(sizes[0]), sum(sizes[1]), sum(n or 0 for n in sizes[2])
    return {"dry_run": dry_run, "older_than_s": older_than_s, "collected": collected,
            "artifacts": [a for a, n in zip(p["artifacts"], sizes[0]) if n],
            "reports": [str(r) for r, n in zip(p["reports"], sizes[1]) if n],
            "orphans": [a for a, n in zip(lost, sizes[2]) if n is not None], "orphan_bytes": ob,
            "artifact_bytes": ab, "report_bytes": rb, "bytes_freed": ab + rb + ob, "shared": shared,
            "artifacts_kept": p["kept"], "younger": p["younger"], "reports_kept": [str(r) for r in p["reports_kept"]]}


def _real(path) -> Path:
    """``path`` with every link followed (``os.path.realpath``): what a removal would remove."""
    return Path(os.path.realpath(path))


_ARTIFACT = (".npz", ".safetensors")


def _orphans(reg, named: set[str], removing: bool) -> list[tuple[str, int]]:
    """``(path, bytes)`` of the artifact files (``.npz``, ``.safetensors``) no row names (``named``), untouched for
    ``STALE_TMP_S``: regular files only, as :meth:`~.store.ArtifactStore.artifact_files` lists them (a link is never
    one: its target may be a live version's artifact). ``removing`` (``orphans=True``): ConflictError when files are
    there but no row names any of them (the wrong database, or one not restored yet); otherwise a folder that cannot
    be walked lists none (the count is a note, never a reason for a gc to fail)."""
    try:
        files = reg.store.artifact_files(_ARTIFACT)
    except OSError:
        if removing:
            raise
        return []
    if removing and files and not named & files.keys():
        raise ConflictError(
            f"registry gc --orphans refused: none of the {len(files)} artifact file(s) in {reg.store.root} is named by "
            f"a version of this registry ({safe_url(reg.url)}): is it the registry of that folder (a mistyped URL or "
            "data dir, a database not restored yet)? Nothing was removed")
    cutoff = datetime.now(UTC).timestamp() - STALE_TMP_S
    return [(rel, st.st_size) for rel, st in sorted(files.items()) if rel not in named and st.st_mtime <= cutoff]


def _size(path, suffixes=(".html",)) -> int:
    """Bytes of the regular file at ``path`` (a report: only an ``.html`` one), 0 when there is none."""
    try:
        return path.stat().st_size if path.suffix in suffixes and path.is_file() else 0
    except OSError:
        return 0


def _remove(path) -> int:
    """Remove the file at ``path`` (an artifact, or an ``.html`` report); the bytes it held (0: it was not there)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if not path.is_file() or (path.suffix not in (".html", ".npz", ".safetensors")):
        return 0
    path.unlink(missing_ok=True)
    return size


def _remove_emptied(folders: set[Path], root: Path) -> None:
    """Remove each of ``folders`` (a map's folder of reports, of the collected versions) that is left empty: only
    a real folder (no link) strictly inside ``root``; ``rmdir`` removes an empty one alone, so a report a writer put
    there meanwhile keeps its folder (and a writer that made the folder just before is helped by
    :func:`service.reports.write_report`, which makes it again)."""
    for folder in sorted(folders):
        try:
            if folder != root and folder.is_relative_to(root) and stat.S_ISDIR(folder.lstat().st_mode):
                os.rmdir(folder)
        except OSError:  # not empty, gone, or not ours to remove: left as it is
            pass


def _remove_orphan(path: Path) -> int | None:
    """Unlink the orphan at ``path`` (in the artifact folder, no link followed) if it is still a regular file; the
    bytes it held, None when it is gone (or no longer a regular file)."""
    try:
        st = path.lstat()
        if not stat.S_ISREG(st.st_mode):
            return None
        path.unlink()
    except FileNotFoundError:
        return None
    return st.st_size
