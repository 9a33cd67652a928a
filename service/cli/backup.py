"""``vecbridge backup DEST``: a restorable copy of the data dir, taken while the service runs.

Restore: start vecbridge on the copy (``vecbridge --data-dir DEST serve``, or move it where the data dir was);
``vecbridge --data-dir DEST registry verify`` checks it. A PostgreSQL registry is restored from its dump first,
then passed with ``--registry-url`` (the printed restore line says so). What is copied, and how, is in
:mod:`service.ops.backup`.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from ..ops.backup import PG_RESTORE, backup_data_dir
from ._common import Ctx, emit, json_opt, progress_bar, quiet_opt

__all__ = ["backup"]


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


@click.command()
@click.argument("dest", type=click.Path(path_type=Path))
@click.option("--link/--copy", "link", default=False, show_default=True,
              help="--link: files never changed in place (artifacts, reports, index files) become hard links "
                   "where DEST is on the data dir's file system (instant, no space, but the same disk blocks: a "
                   "snapshot to ship elsewhere, not a backup on its own); default --copy: every file copied.")
@click.option("--verify-indexes", is_flag=True,
              help="Load every copied index as the service would (~1 s per 200k rows); one that does not load fails "
                   "the backup.")
@json_opt
@quiet_opt
@click.pass_obj
def backup(obj: Ctx, dest, link, verify_indexes, as_json, quiet):
    """Copy the data dir (registry, job records, artifacts, reports, indexes) to the new folder DEST.

    Safe while `vecbridge serve` runs and writes: the SQLite files are copied at one commit, each index at
    one committed generation, every artifact the copied registry names is there. Writers are not blocked
    (the SQLite copies hold a read lock for milliseconds). DEST must not exist or be empty; a failed
    backup leaves no DEST (a killed one's temporary folder is removed by the next backup beside it). A
    PostgreSQL registry is pg_dump's job (the command says so).
    """
    progress, close = progress_bar(quiet=quiet, as_json=as_json)
    try:
        out = backup_data_dir(obj.settings, dest, link=link, progress=progress, verify_indexes=verify_indexes)
    finally:
        close()
    reg = out["registry"]
    what = (f"registry ({reg['backend']}: {reg['verify']['n_versions']} map versions, "
            f"{reg['verify']['n_steer_versions']} steer versions)" if reg["copied"]
            else f"registry ({reg['backend']}: not copied)")
    idx = ", ".join(f"{n} generation {i['generation']}" + (f" ({i['count']:,} rows, loads)" if "count" in i else "")
                    for n, i in out["indexes"].items()) or "none"
    dst = out["dest"]
    q = shlex.quote(str(dst))  # in the commands to paste: a path with a space stays one word
    jobs = "job records, " if out["jobs"] else ""
    text = [f"backup of {out['source']} written to {dst} in {out['seconds']:.1f}s",
            f"  {what}, {jobs}{out['artifacts']} artifacts, {out['reports']} reports, indexes: {idx}",
            f"  {out['files']} files, {_size(out['bytes'])} ({out['linked']} hard-linked to the data dir, "
            + f"{_size(out['copied_bytes'])} copied); the SQLite copies took "
            + f"{out['sqlite_copy_s'] * 1000:.0f} ms (the longest a writer's commit waited for them)",
            f"  restore: vecbridge --data-dir {q} serve   (check: vecbridge --data-dir {q} registry verify)"
            if reg["backend"] == "sqlite" else f"  restore: {PG_RESTORE.format(dest=q)}   (check: registry verify "
                                               f"in place of serve)"]
    if reg.get("verify") and not reg["verify"]["ok"]:
        text.append("  warning: the registry in the backup fails verify, as the data dir's does: run "
                    "`vecbridge registry verify` on the data dir")
    text += [f"  note: {n}" for n in out["notes"]]
    emit(out, as_json, "\n".join(text))
