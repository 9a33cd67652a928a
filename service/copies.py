"""Copies for backups: :func:`link_or_copy` (a hard link where the file system allows one, else a copy read from
the open file, fsynced) and :func:`sqlite_backup` (SQLite's online backup API: a copy as of one commit, checked with
``PRAGMA quick_check``; a damaged source is a NotConfiguredError naming it), and :func:`quick_check_findings`.
Moved out of :mod:`service.storage` (whose old names still import) to give that module room.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from .errors import NotConfiguredError
from .storage import sqlite_connect, sqlite_damaged

__all__ = ["link_or_copy", "quick_check_findings", "sqlite_backup"]

_COPY_CHUNK = 8 * 2**20


def link_or_copy(fh: BinaryIO, src: Path, dst: Path, *, link: bool = True,
                 on_bytes: Callable[[int], None] | None = None) -> bool:
    """Put the file ``fh`` (open, read from its start; found at ``src``) at the new path ``dst``; True when linked.

    With ``link``, a hard link to ``src`` when the file system allows one (same device) and ``src`` still
    is the open file (not removed and replaced meanwhile); else a copy read from ``fh`` (so a file removed
    after it was opened is still copied whole) with ``fh``'s permission bits, fsynced. Only for files that
    are never changed in place (content-addressed artifacts, index generations): a link shares the file.
    ``on_bytes(n)`` is called as bytes are copied.
    """
    mine = os.fstat(fh.fileno())
    if link:
        try:
            os.link(src, dst)
            st = os.stat(dst)
            if (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino):
                return True
            dst.unlink()  # src was replaced by another file after fh was opened: copy the one we hold
        except OSError:  # another file system (EXDEV), links refused (EPERM), src removed since (ENOENT)
            pass
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IMODE(mine.st_mode))
    with open(fd, "wb") as out:
        while chunk := fh.read(_COPY_CHUNK):
            out.write(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
        out.flush()
        os.fsync(out.fileno())
    return False


def sqlite_backup(src: Path, dst: Path, *, timeout: float = 60.0) -> float:
    """Copy the SQLite database ``src`` to the new file ``dst`` as it was at one commit; returns the seconds it took.

    SQLite's online backup API in one step: the copy holds a shared lock on ``src`` for its duration, so it
    never sees a transaction half written, and a writer's commit waits those milliseconds (within its busy
    timeout) instead of failing. A busy ``src`` (a writer committing) is waited for up to ``timeout`` s. The
    copy is checked (``PRAGMA quick_check``) and fsynced. ``src`` is opened read-write (a hot journal left by a
    crashed writer is rolled back first, as any reader would) and never created. A damaged ``src`` (the copy
    fails ``quick_check``, or SQLite finds it malformed) is a NotConfiguredError naming it (exit 2; 503 without
    ``Retry-After``); a full disk under ``dst`` is an ``OSError`` (ENOSPC) naming ``dst``.
    """
    try:
        took = _sqlite_copy(src, dst, timeout)
    except sqlite3.DatabaseError as exc:
        if "disk is full" in str(exc):  # only the copy is written: its disk is full (the CLI blamed the data dir)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst)) from exc
        if not sqlite_damaged(exc):
            raise
        bad = str(exc)
    else:
        if not (bad := _quick_check(dst)):
            fd = os.open(dst, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            return took
    raise NotConfiguredError(f"{src} is damaged (SQLite: {bad}), so a copy of it would be too: restore it from an "
                             f"earlier backup (in a registry, `vecbridge registry verify` lists what is wrong)"
                             ) from None


def _sqlite_copy(src: Path, dst: Path, timeout: float) -> float:
    """SQLite's online backup of ``src`` into ``dst`` (see :func:`sqlite_backup`); the seconds it took."""
    source = sqlite_connect(src, mode="rw", timeout=timeout, isolation_level=None)
    try:
        source.execute("PRAGMA mmap_size=0")
        target = sqlite_connect(dst, isolation_level=None)
        try:
            t0 = time.perf_counter()
            source.backup(target, pages=-1, sleep=0.005)  # busy: retry soon
            return time.perf_counter() - t0
        finally:
            target.close()
    finally:
        source.close()


def quick_check_findings(rows) -> list[str]:
    """The lines of ``PRAGMA quick_check``'s result ``rows`` that say what is wrong (none for its ``ok``), less
    SQLite's ``*** in database main ***`` headings."""
    return [line for r in rows if r[0] != "ok" for line in r[0].splitlines() if not line.startswith("*** in database")]


def _quick_check(path: Path) -> str:
    """The first line of what ``PRAGMA quick_check`` finds wrong in the SQLite file ``path``; "" when sound."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        bad = quick_check_findings(db.execute("PRAGMA quick_check").fetchall())
    except sqlite3.DatabaseError as exc:
        if not sqlite_damaged(exc):
            raise
        bad = [str(exc)]
    finally:
        db.close()
    return bad[0] if bad else ""
