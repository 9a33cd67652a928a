"""Back up a data dir while the service keeps running and writing (``vecbridge backup DEST``); restore is starting
vecbridge on the copy (``--data-dir DEST``).

What a data dir holds, and how each part is copied so that the copy is one the service could have left:

- ``registry.sqlite`` and ``jobs.sqlite``: SQLite's online backup API (:func:`service.copies.sqlite_backup`), each
  consistent at one commit. A PostgreSQL registry is not copied: its database is ``pg_dump``'s job (see
  :data:`PG_NOTE`); everything else still is.
- ``artifacts/`` (content-addressed, never changed, never removed once a committed row names it but by ``registry
  gc``, which waits for the copy) after the registry: every artifact the copied registry names exists by then.
  ``reports/`` alike (a report is written just after its version commits: one registered in that instant may lack
  it, as in the data dir itself for that instant).
- ``indexes/<name>/``: the files of one committed generation, read by the index readers' own protocol
  (:func:`service.indexes.persist.with_current`: open every file the meta names, read the meta again when a
  writer collected one first), then ``meta.json`` written last. Writers never wait for a backup.
- ``migrations/*.json`` (vector-DB migration checkpoints) and ``local-key`` (the key ``vecbridge serve`` made).

Not copied: locks, ``jobs.owners/`` (restored jobs that were running are then failed "interrupted by restart", as
after a crash), temporary files, dropped-index trash. Files never changed in place (artifacts, reports, index
generations, checkpoints, the key) are hard links with ``link=True`` (``vecbridge backup --link``) when ``DEST`` is
on the data dir's file system, copies by default; the SQLite files are always copies.

Everything goes to ``DEST``'s sibling ``.DEST.tmp-*``, renamed to ``DEST`` once complete and fsynced: a failed
or interrupted backup leaves no ``DEST`` (and removes its temporary folder). While it runs, the temporary folder
holds :data:`IN_PROGRESS`, ``flock``-ed by the backup: after ``kill -9`` (or a power cut) the kernel drops the
lock, and the next backup into the same parent folder removes that folder (:func:`sweep_abandoned`) and says so.
``DEST/backup.json`` says what the copy holds.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

from ..config import Settings
from ..copies import link_or_copy, sqlite_backup
from ..errors import ConflictError, NotFoundError
from ..indexes import IndexStore
from ..indexes.errors import UnreadableGenerationError
from ..indexes.persist import with_current
from ..progress import Progress, silent
from ..registry import open_registry, package_version
from ..registry.db import sqlite_path
from ..registry.store import ArtifactStore
from ..storage import IN_PROGRESS, atomic_write, folder_aside, sweep_abandoned

__all__ = ["BACKUP_FORMAT", "IN_PROGRESS", "MANIFEST", "PG_NOTE", "PG_RESTORE", "backup_data_dir", "refuse_pg_backup",
           "sweep_abandoned"]

BACKUP_FORMAT = "vecbridge.backup"
MANIFEST = "backup.json"
PG_NOTE = ("the registry database is PostgreSQL: back it up with pg_dump, before this backup (an artifact a live "
           "version names is never removed, so every one a dump taken earlier names is in this one, unless a "
           "`vecbridge registry gc` ran in between: it removes deleted versions' files, so run it before the dump or "
           "after this backup); restore it with pg_restore and start vecbridge with --data-dir on this backup and "
           "VECBRIDGE_REGISTRY_URL on the restored database")
#: how a backup of a data dir with a PostgreSQL registry is restored (the URL is the user's: it may hold a password)
PG_RESTORE = ("load the pg_dump taken before this backup into a new database (pg_restore, or psql for a plain dump), "
              "then: vecbridge --data-dir {dest} --registry-url postgresql://USER@HOST/RESTORED_DB serve")


def refuse_pg_backup(settings: Settings) -> None:
    """ConflictError when the data dir is a backup whose registry was PostgreSQL (its :data:`MANIFEST` says so) and the
    registry URL names a SQLite file that is not there: opening it would create an empty registry in the backup (and
    ``serve`` its demo) instead of using the restored database."""
    db = sqlite_path(settings.resolved_registry_url())
    manifest = Path(settings.data_dir) / MANIFEST
    if db is None or db.exists() or not manifest.is_file():
        return
    try:
        backend = json.loads(manifest.read_text())["registry"]["backend"]
    except (OSError, ValueError, KeyError, TypeError):  # not one of ours: nothing to say about it
        return
    if backend == "postgresql":
        raise ConflictError(f"{settings.data_dir} is a vecbridge backup of a data dir whose registry is PostgreSQL "
                            f"(its {MANIFEST} says so) and holds no registry of its own: "
                            + PG_RESTORE.format(dest=settings.data_dir) + " (or VECBRIDGE_REGISTRY_URL)")


class _Copier:
    """Files into the backup: linked or copied (:func:`link_or_copy`), counted."""

    def __init__(self, link: bool):
        self.link = link
        self.files = self.linked = self.bytes = self.copied_bytes = 0

    def put(self, fh, src: Path, dst: Path, on_bytes=None) -> None:
        dst.parent.mkdir(parents=True, exist_ok=True)
        size = os.fstat(fh.fileno()).st_size
        if not link_or_copy(fh, src, dst, link=self.link, on_bytes=on_bytes):
            self.copied_bytes += size
        else:
            self.linked += 1
        self.files += 1
        self.bytes += size

    def tree(self, src: Path, dst: Path, *, skip=lambda rel: False) -> int:
        """Every regular file under ``src`` (links and temporary ``.*.tmp-*`` files left out) to ``dst``."""
        n = 0
        for f in sorted(src.rglob("*")) if src.is_dir() else []:
            rel = f.relative_to(src)
            if f.is_symlink() or not f.is_file() or ".tmp-" in f.name or skip(rel):
                continue
            try:
                with open(f, "rb") as fh:
                    self.put(fh, f, dst / rel)
            except FileNotFoundError:  # removed meanwhile (a checkpoint replaced by its next version)
                continue
            n += 1
        return n


def _check(data: Path, dest: Path) -> None:
    if not data.is_dir():
        raise NotFoundError(f"data dir {data} does not exist (give --data-dir or VECBRIDGE_DATA_DIR)")
    if dest == data or data in dest.parents:
        raise ConflictError(f"backup folder {dest} is inside the data dir {data}: a backup must survive losing it")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ConflictError(f"backup folder {dest} already exists and is not empty: give a new (or empty) folder")


def _index(src: Path, dst: Path, copier: _Copier, progress: Progress) -> dict:
    """Copy one committed generation of the index at ``src`` into ``dst`` (meta last); its summary."""
    stage = f"index {src.name}"

    def copy(meta: dict, files: dict) -> dict:
        dst.mkdir(parents=True, exist_ok=True)
        sizes = {name: os.fstat(fh.fileno()).st_size for name, fh in files.items()}
        total, done = sum(sizes.values()) or 1, 0

        def on_bytes(n: int) -> None:
            nonlocal done
            done += n
            progress(stage, done / total)

        for name, fh in files.items():
            before = done
            copier.put(fh, src / name, dst / name, on_bytes)
            done = before + sizes[name]  # a linked file counts whole
            progress(stage, done / total)
        return meta

    _, meta, _ = with_current(src, copy)
    atomic_write(dst / "meta.json", json.dumps(meta))  # the commit point, last (as a writer writes it)
    copier.files += 1
    return {"generation": int(meta["generation"]), "kind": meta["kind"], "files": len(list(dst.iterdir()))}


def _verify_index(path: Path, summary: dict) -> None:
    """Load the copied index at ``path`` as the service would (every delta's checks, the snapshot read whole) and
    add its live ``count`` to ``summary``; UnreadableGenerationError naming it when it does not load."""
    from ..indexes import SpaceIndex

    try:
        idx = SpaceIndex.load(path)
    except Exception as exc:  # noqa: BLE001 - whatever the load raises, the copy is not one to restore
        raise UnreadableGenerationError(f"index {path.name!r} was copied but does not load: {type(exc).__name__}: "
                                        f"{exc} (the data dir's copy is damaged too: `vecbridge index show "
                                        f"{path.name}`)") from None
    summary["count"] = int(idx.count)


def backup_data_dir(settings: Settings, dest, *, link: bool = False, progress: Progress | None = None,
                    verify_indexes: bool = False) -> dict:
    """Write a restorable copy of ``settings.data_dir`` (and its registry) to the new folder ``dest``.

    Returns the summary written to ``dest/backup.json``: ``registry`` (backend, whether copied, its
    ``verify`` on the copy), ``jobs``, ``artifacts`` / ``reports`` (files), ``indexes`` ({name: generation,
    kind, files}), ``files``, ``bytes`` (in the backup), ``linked`` (files shared with the data dir),
    ``copied_bytes``, ``seconds``, ``sqlite_copy_s`` (seconds in SQLite's online backup, waits for a writer's
    commit included: the longest a writer's commit could have waited for the copies), ``notes``.
    ``NotFoundError`` when the data dir does not exist (or holds nothing of vecbridge's), ``ConflictError``
    when ``dest`` exists and is not empty (or lies inside the data dir). ``verify_indexes``: load every copied
    index as the service would (~1 s per 200k rows of 384 floats) and record its ``count``; one that does not load
    fails the backup (no ``dest``).
    """
    progress = progress or silent
    t0 = time.perf_counter()
    data = Path(settings.data_dir).resolve()
    dest = Path(dest).resolve()
    _check(data, dest)
    db = sqlite_path(settings.resolved_registry_url())
    if not any(p.exists() for p in (data / "indexes", data / "jobs.sqlite", settings.resolved_artifact_dir(),
                                    *([db] if db is not None else []))):
        raise NotFoundError(f"{data} is not a vecbridge data dir (no registry, artifacts, indexes or job records): "
                            f"give --data-dir or VECBRIDGE_DATA_DIR")
    with folder_aside(dest) as (tmp, swept):
        summary = _backup(settings, data, tmp, _Copier(link), progress, verify_indexes)
        summary["notes"] += [f"removed {dest.parent / name}, the temporary folder of a backup that was killed"
                             for name in swept]
        summary["seconds"] = round(time.perf_counter() - t0, 3)
        atomic_write(tmp / MANIFEST, json.dumps(summary, indent=1, sort_keys=True))
    summary["dest"] = str(dest)
    return summary


def _backup(settings: Settings, data: Path, tmp: Path, copier: _Copier, progress: Progress,
            verify_indexes: bool = False) -> dict:
    notes: list[str] = []
    out: dict = {"format": BACKUP_FORMAT, "format_version": 1, "package_version": package_version(),
                 "created_at": datetime.now(UTC).isoformat(timespec="seconds"), "source": str(data)}
    lock_s = 0.0
    art = settings.resolved_artifact_dir()
    with ExitStack() as pinned:  # held as writers hold it (none waits); `registry gc` waits, so no file a deleted
        if art.is_dir():  # version of the copied registry names is removed before the artifacts are copied
            pinned.enter_context(ArtifactStore(art).pinned())
        # 1. the registry first: every artifact it names is then in the folder copied after it
        progress("registry", 0.0)
        db = sqlite_path(settings.resolved_registry_url())
        registry = {"backend": "sqlite" if db is not None else "postgresql", "copied": False}
        if db is None:
            notes.append(PG_NOTE)
        elif db.exists():
            lock_s += sqlite_backup(db, tmp / "registry.sqlite")
            registry["copied"] = True
            if db.resolve() != data / "registry.sqlite":
                notes.append(f"the registry {db} is outside the data dir: the backup holds it as registry.sqlite; "
                             f"start the restored service without VECBRIDGE_REGISTRY_URL")
        progress("registry", 1.0)
        jobs = data / "jobs.sqlite"
        if jobs.exists():
            lock_s += sqlite_backup(jobs, tmp / "jobs.sqlite")
        # 2. artifacts and reports: immutable, content-addressed / uniquely named
        progress("artifacts", 0.0)
        out["artifacts"] = copier.tree(art, tmp / "artifacts", skip=lambda rel: rel.parts[0] in ("tmp", "reports"))
        if art != data / "artifacts":
            notes.append(f"artifacts from {art} are in the backup's artifacts/: start the restored service "
                         f"without --artifact-dir / VECBRIDGE_ARTIFACT_DIR")
        # where reports are now (Settings.resolved_report_dir), and where the CLI and the service wrote them before
        report_dirs = dict.fromkeys([settings.resolved_report_dir(), data / "reports", art.parent / "reports"])
        out["reports"] = sum(copier.tree(r, tmp / "reports") for r in report_dirs)
        progress("artifacts", 1.0)
    # 3. each index at one committed generation
    out["indexes"] = {}
    root = data / "indexes"
    for name in IndexStore(root).names():
        try:
            out["indexes"][name] = _index(root / name, tmp / "indexes" / name, copier, progress)
            if verify_indexes:
                _verify_index(tmp / "indexes" / name, out["indexes"][name])
        except FileNotFoundError:  # dropped while being copied: as if the backup had come after the drop
            shutil.rmtree(tmp / "indexes" / name, ignore_errors=True)
            notes.append(f"index {name} was dropped during the backup and is not in it")
        except ValueError as exc:  # a meta.json that is not one (InputError, JSONDecodeError): not served either
            raise UnreadableGenerationError(f"index {name!r} cannot be backed up: {exc} (the service cannot load "
                                            f"it either: `vecbridge index drop {name}` or restore it)") from None
    # 4. small files: migration checkpoints, the local key
    copier.tree(data / "migrations", tmp / "migrations", skip=lambda rel: rel.suffix != ".json")
    key = data / "local-key"
    if key.is_file() and not key.is_symlink():
        with open(key, "rb") as fh:
            copier.put(fh, key, tmp / "local-key")
    # 5. the copied registry checked as `vecbridge registry verify` would check it
    if registry["copied"]:
        progress("verify", 0.0)
        reg = open_registry(f"sqlite:///{tmp / 'registry.sqlite'}", tmp / "artifacts", report_dir=tmp / "reports")
        try:
            checked = reg.verify()
            registry["verify"] = {k: checked[k] for k in ("ok", "n_versions", "n_steer_versions", "bad_artifacts",
                                                          "dangling_aliases", "version_gaps")}
        finally:
            reg.close()
        shutil.rmtree(tmp / "artifacts" / "tmp", ignore_errors=True)
        progress("verify", 1.0)
    sqlite = [p.stat().st_size for p in tmp.glob("*.sqlite")]  # always copies
    out.update(registry=registry, jobs=jobs.exists(), files=copier.files + len(sqlite),
               bytes=copier.bytes + sum(sqlite), linked=copier.linked, copied_bytes=copier.copied_bytes + sum(sqlite),
               sqlite_copy_s=round(lock_s, 4), notes=notes)
    return out
