"""Is the data directory usable for writes? Readiness and error classification for a read-only or full disk.

Two things go wrong when the disk under ``data_dir`` is remounted read-only, made immutable, or
fills up:

- **memory-mapped writable files crash the process.** A store page mapped ``MAP_SHARED`` whose
  first write the kernel cannot back (immutable file: ``page_mkwrite`` refuses; full disk: no
  block to allocate) is delivered as SIGBUS, which kills the process. SQLite's WAL mode maps its
  ``-shm`` wal-index this way, so the service runs SQLite with a rollback journal
  (``journal_mode=DELETE``, ``mmap_size=0``: plain ``write(2)`` calls that fail with an error),
  FAISS indexes are read into memory, and ``.npy`` outputs are preallocated with
  ``posix_fallocate`` before being mapped;
- **writes fail** with ``OSError`` (EROFS, ENOSPC, EDQUOT, EPERM, EACCES, EIO) or
  ``sqlite3.OperationalError`` ("readonly database", "database or disk is full", "disk I/O
  error", "unable to open database file"). :func:`is_storage_error` recognises them; the API
  answers 503 with :func:`storage_message`, the CLI exits 2 with one line.

:func:`data_dir_status` is the readiness probe: create, write and remove a small file in the
data dir, open the SQLite files for writing (without writing), and compare the free space with
``min_free_bytes``. Copies for backups (``link_or_copy``, ``sqlite_backup``) are :mod:`service.copies`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import os
import re
import shutil
import sqlite3
import stat
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.request import pathname2url

from align.exceptions import InputError

from .errors import exception_chain

__all__ = ["IN_PROGRESS", "STORAGE_ERRNOS", "atomic_write", "check_writable", "data_dir_status", "folder_aside",
           "fsync_dir", "hold", "keep_mode", "is_storage_error", "link_or_copy", "moved_databases", "OpenedFile",
           "no_space_message", "sqlite_backup", "storage_message", "quick_check_findings", "remove_marked",
           "check_sqlite_path", "sqlite_connect", "sqlite_damaged", "sweep_abandoned", "take_abandoned", "temp_name",
           "writing", "still_linked", "MAX_SQLITE_PATH", "STALE_TMP_S", "sweep_stale_tmp", "make_parent", "make_dir"]

STORAGE_ERRNOS = {errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EPERM, errno.EACCES, errno.EIO, errno.EFBIG}
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}  # errors of a write: one that names no file was writing
_SQLITE_MARKERS = ("readonly database", "disk is full", "disk i/o error", "unable to open database file",
                   "database or disk is full")


def is_storage_error(exc: BaseException) -> bool:
    """True for the errors a read-only, immutable or full data directory produces (see module docs)."""
    for e in exception_chain(exc):
        if isinstance(e, OSError) and e.errno in STORAGE_ERRNOS:
            return True
        if isinstance(e, sqlite3.OperationalError) and any(m in str(e).lower() for m in _SQLITE_MARKERS):
            return True
    return False


#: the longest database path (bytes, made absolute) SQLite opens: its unix VFS takes paths of up to 512 bytes, and
#: the rollback journal's name is 8 longer (``-journal``)
MAX_SQLITE_PATH = 504


def check_sqlite_path(path) -> None:
    """Refuse a database path too long for SQLite (InputError, one line): it failed as "unable to open database
    file", which read as a read-only or full data directory, and stopped ``serve``'s start-up with a traceback."""
    full = os.fsencode(os.path.abspath(path))
    if len(full) > MAX_SQLITE_PATH:
        shown = os.fsdecode(full)
        raise InputError(f"the database path {shown[:40]}...{shown[-40:]} is {len(full)} bytes long, and SQLite "
                         f"opens paths of at most {MAX_SQLITE_PATH}: use a data directory (or registry path) with "
                         "a shorter path")


#: SQLite's extended code for a write to a database file that was renamed or unlinked since it was opened
SQLITE_READONLY_DBMOVED = 1032
_MOVED = "database file replaced or removed since the service opened it: restart the service"


class OpenedFile:
    """The SQLite file the connections of one object (the registry's SQLite database, the job store) opened: its
    ``(st_dev, st_ino)`` at that object's first connection in this process, every link followed, as SQLite opens it.
    :meth:`moved`: its path now holds another file or none ("restore by moving the backup back", ``rm jobs.sqlite``
    under a running service): those connections keep the old, unlinked file, every write fails ("attempt to write a
    readonly database", SQLITE_READONLY_DBMOVED) and reads see the old data. Kept by its object, not by the process:
    an app shut down, its data dir made again and a new app opened on the same path read "replaced" for good."""

    def __init__(self, path) -> None:
        self.path = Path(path)
        self._opened: tuple[int, int, int] | None = None  # (pid, st_dev, st_ino)

    def note(self) -> None:
        """After a connection opened the file: what it opened, the first time in this process."""
        if self._opened is None or self._opened[0] != os.getpid():
            with contextlib.suppress(OSError):
                st = os.stat(self.path)
                self._opened = (os.getpid(), st.st_dev, st.st_ino)
                _LIVE.add(self)

    def forget(self) -> None:
        """Its object closed its connections: nothing of it is open any more."""
        self._opened = None
        _LIVE.discard(self)

    def moved(self) -> bool:
        o = self._opened
        if o is None or o[0] != os.getpid():
            return False
        try:
            st = os.stat(self.path)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != o[1:]


#: the files of the objects open in this process, for a caller that holds none of them (a job's, the CLI's error)
_LIVE: weakref.WeakSet[OpenedFile] = weakref.WeakSet()


def sqlite_connect(path, *, mode: str | None = None, **kwargs) -> sqlite3.Connection:
    """``sqlite3.connect(path, **kwargs)`` (opened with the URI's ``mode``, e.g. ``rw``, when given) for every SQLite
    database vecbridge opens, once :func:`check_sqlite_path` passes."""
    check_sqlite_path(path)
    if mode is not None:
        c = sqlite3.connect(f"file:{pathname2url(str(path))}?mode={mode}", uri=True, **kwargs)
    else:
        c = sqlite3.connect(path, **kwargs)
    return c


def moved_databases(files=None, folder=None) -> list[str]:
    """What each of ``files`` (:class:`OpenedFile`; None: those of the objects open in this process) that
    :meth:`~OpenedFile.moved` says: ``NAME: database file replaced ...``, the name alone for a file in ``folder``."""
    d = folder and os.path.realpath(folder)
    return [f"{f.path.name if d and os.path.realpath(f.path.parent) == d else f.path}: {_MOVED}"
            for f in (list(_LIVE) if files is None else files) if f is not None and f.moved()]


def db_moved(exc: BaseException) -> bool:
    """Whether ``exc`` (or its cause) is SQLite's SQLITE_READONLY_DBMOVED: the file was replaced, not the disk."""
    return any(isinstance(e, sqlite3.OperationalError) and getattr(e, "sqlite_errorcode", 0) == SQLITE_READONLY_DBMOVED
               for e in exception_chain(exc))


def sqlite_damaged(exc: BaseException) -> bool:
    """True for SQLite's word that a database file is damaged: ``database disk image is malformed``
    (``SQLITE_CORRUPT``) or ``file is not a database`` (``SQLITE_NOTADB``)."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF if isinstance(exc, sqlite3.DatabaseError) else 0
    return code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def storage_message(exc: BaseException, *, hint: str = " — see /readyz", files=None, folder=None) -> str:
    """What a write refused by the data directory says (``hint``: where to look next; the service's /readyz;
    ``files``, ``folder``: the databases to name when one was replaced, see :func:`moved_databases`)."""
    if db_moved(exc):  # "readonly database" of a file moved away, not a read-only disk
        return f"{'; '.join(moved_databases(files, folder)) or 'a SQLite ' + _MOVED}; nothing was changed"
    if (why := _errno_words(exc)) is not None:
        return f"the data directory cannot be written: {why}; nothing was changed{hint}"
    return ("the data directory cannot be written (read-only, immutable or full disk); nothing was changed"
            f"{hint} ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")


def _errno_words(exc: BaseException) -> str | None:
    """What the first ``OSError`` with a file in ``exc``'s chain says by its errno: whose permission, a read-only file
    system, or no space, and where (None: no such error; the generic words). A chown of one subfolder read as
    "read-only, immutable or full disk" and sent its operator to the disk."""
    e = next((e for e in exception_chain(exc) if isinstance(e, OSError) and e.errno and e.filename), None)
    if e is None:
        return None
    where = os.fsdecode(e.filename)
    if e.errno in (errno.EACCES, errno.EPERM):
        return (f"permission denied on {where} (running as uid {os.getuid()}): give the folder to that user (chown), "
                "or clear its immutable flag (chattr -i)")
    if e.errno == errno.EROFS:
        return f"read-only file system holding {where}: remount it read-write"
    if e.errno in _NO_SPACE:
        return f"no space left on the device holding {where}: free some space there"
    if e.errno == errno.EISDIR:
        return f"{where} is a folder where a file belongs: move it aside"
    return None


@contextlib.contextmanager
def writing(path, aside=None) -> Iterator[None]:
    """A full disk's ``OSError`` in the body that names no file (``write(2)`` says only ``[Errno 28] No space left on
    device``, pyarrow its own words), and a storage error naming a file under ``aside`` (``path``'s temporary file
    or folder), name ``path`` instead: the CLI said that no space was left without a word of where."""
    try:
        yield
    except OSError as exc:
        if (exc.errno in _NO_SPACE and not exc.filename or exc.errno in STORAGE_ERRNOS and exc.filename
                and aside is not None and Path(os.fsdecode(exc.filename)).is_relative_to(aside)):
            exc.filename = str(path)
        raise


def no_space_message(exc: OSError) -> str:
    """What a write refused for want of space (ENOSPC, or a used-up quota: EDQUOT) says: where, and what to do."""
    where = f"the device holding {exc.filename}" if exc.filename else "a device this command writes to"
    what = "no space left" if exc.errno == errno.ENOSPC else "the disk quota is used up"
    return f"{what} on {where}: free some space there (or write elsewhere) and run the command again"


def data_dir_status(data_dir, min_free_bytes: int = 0, files=(), folders=None) -> str:
    """``"ok"``, or why the data directory cannot take writes now (not writable, or below ``min_free_bytes``, or one
    of the database ``files`` (:class:`OpenedFile`) was replaced or removed: :func:`moved_databases`). ``folders``:
    those it writes to, maybe elsewhere (the artifact and report dirs; None: its ``artifacts``, ``reports`` and
    ``indexes``), each probed with one access(2)."""
    d = Path(data_dir)
    if moved := moved_databases(files, d):
        return "; ".join(moved)
    for sub in (d / f for f in ("artifacts", "reports", "indexes")) if folders is None else map(Path, folders):
        if sub.is_dir() and not os.access(sub, os.W_OK | os.X_OK):  # a folder of its own owner, or mounted ro
            ro = os.statvfs(sub).f_flag & os.ST_RDONLY
            return f"not writable: {_errno_words(OSError(errno.EROFS if ro else errno.EACCES, '', str(sub)))}"
    for f in ("registry.sqlite", "jobs.sqlite"):
        if (d / f).is_dir():
            return f"not writable: {d / f} is a folder, not a SQLite database file: move it aside"
    probe = d / f".ready-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"1")
        finally:
            os.close(fd)
        probe.unlink()
        for f in sorted(d.glob("*.sqlite")):  # a file made immutable on its own (open for write, write nothing)
            os.close(os.open(f, os.O_WRONLY | os.O_APPEND))
    except OSError as exc:
        try:
            probe.unlink()
        except OSError:
            pass
        where = exc.filename if str(exc.filename).endswith(".sqlite") else d  # a database, or the folder itself
        why = exc.errno and _errno_words(OSError(exc.errno, "", str(where)))
        return f"not writable: {why or (os.strerror(exc.errno) if exc.errno else exc)}"
    st = os.statvfs(d)
    free = st.f_bavail * st.f_frsize
    if free < int(min_free_bytes):
        return f"nearly full: {free // 2**20} MiB free, below the {int(min_free_bytes) // 2**20} MiB threshold"
    return "ok"


def fsync_dir(path) -> None:
    """fsync a directory so a rename inside it survives a crash (no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: the most bytes of ``.NAME`` in a temporary's name (:func:`temp_name`): what follows (``.tmp-<pid>-<thread>-<hex>``
#: 42 at most, :func:`hold`'s ``.<hex>.new``) keeps every temporary's name within NAME_MAX (255)
_TEMP_HEAD = 200


def temp_name(name: str, tail: str) -> str:
    """``.NAME<tail>``, the name of a temporary beside ``NAME`` (hidden, same folder: renamed into place). A ``NAME``
    too long for that (``.NAME`` over 200 bytes) is cut to its first characters, ``~`` and 8 hex of its sha256, the
    same for the same ``NAME`` (a sweep finds a dead writer's temporaries by it): an output name of 238-255 bytes,
    valid itself, failed with "File name too long" on its temporary's."""
    if len(os.fsencode(name)) >= _TEMP_HEAD:
        import hashlib

        digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:8]
        while len(os.fsencode(name)) > _TEMP_HEAD - 11:  # '.', '~' and the digest
            name = name[:-1]
        name = f"{name}~{digest}"
    return f".{name}{tail}"


def hold(path: Path, *, create: bool = False, mode: int = 0o600) -> int:
    """A descriptor holding an exclusive ``flock`` on ``path`` (created with ``create``, ``mode`` less the umask) for
    as long as it is open: the mark of a temporary file or folder whose writer is alive. The kernel drops the lock
    when the process dies (``kill -9`` included), which :func:`take_abandoned` detects.

    ``create``: the file is made and locked under a private name, then renamed to ``path``, so that ``path`` is never
    there unlocked: a sweep in another process between the creation and the lock took it for a dead writer's and
    removed what it marked (two workers creating the same index at once answered 500, FileNotFoundError). ``path``
    must not exist (FileExistsError).
    """
    path = Path(path)
    if create and os.path.lexists(path):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))
    # create: a private name first, matched by no sweep's pattern
    opened = path.with_name(temp_name(path.name, f".{uuid.uuid4().hex[:8]}.new")) if create else path
    fd = os.open(opened, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if create:
            os.rename(opened, path)
    except BaseException:
        os.close(fd)
        if create:
            with contextlib.suppress(OSError):
                os.unlink(opened)
        raise
    return fd


def take_abandoned(path: Path) -> int | None:
    """``path``'s ``flock`` when no process holds it (its :func:`hold`-er died, or never held it): a descriptor to
    close once what it marks is removed; None when a live process holds it, or ``path`` cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # BlockingIOError: held by a live writer
        os.close(fd)
        return None
    return fd


def make_parent(path: Path) -> None:
    """Create ``path``'s folder: :func:`make_dir` naming ``path`` (mkdir's ``File exists: 'out'`` did not)."""
    make_dir(path.parent, f"cannot write {path}")


def make_dir(folder: Path, what: str) -> None:
    """Create ``folder`` and its parents; a file in the way is a NotADirectoryError "{what}: {file} is a file..."."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in [*reversed(folder.parents), folder] if p.exists() and not p.is_dir()), folder)
        raise NotADirectoryError(f"{what}: {blocker} is a file, not a folder") from None


def keep_mode(tmp: Path, path: Path) -> None:
    """Give ``tmp`` the permission bits of the file ``path`` it is about to replace (a ``chmod 600`` output came
    back 0644 after a rewrite: a private file made readable by all); nothing when ``path`` does not exist."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return
    os.chmod(tmp, mode)


def atomic_write(path, data: bytes | str | Callable[[Path], None], *, tmp_dir=None,
                 before_replace: Callable[[], None] | None = None, held: bool = False) -> Path:
    """Write ``path`` so readers see the old file or the whole new one, never a part, even after a crash.

    ``data`` is bytes, text (UTF-8), or a callable that writes a given temporary path (e.g.
    ``service.indexes.persist`` streams a FAISS index through ``open(p, 'wb')``); it must raise ``OSError``
    when a write fails. The temporary file is named
    ``.<name>.tmp-<pid>-<thread>-<uuid>`` in ``tmp_dir`` (default: beside ``path``; it must be on
    the same file system), fsync'ed, renamed over ``path`` (atomic on POSIX), and the directory
    fsync'ed. ``before_replace`` runs between the fsync and the rename (crash-test hook). On any
    error the temporary file is removed and the old ``path`` is untouched. ``held``: the temporary is locked
    (:func:`hold`) while it is written, and ``path``'s temporaries no live process locks (a ``kill -9``'s) are removed
    first: a large output a person writes again at once (a zip bundle's was left for good).
    """
    path = Path(path)
    make_parent(path)
    where = Path(tmp_dir) if tmp_dir is not None else path.parent
    tmp = where / temp_name(path.name, f".tmp-{os.getpid()}-{threading.get_ident()}-{uuid.uuid4().hex[:8]}")
    lock = None
    with writing(path, tmp):
        try:
            if held:
                for e in where.glob(glob.escape(temp_name(path.name, ".tmp-")) + "*"):
                    with contextlib.suppress(OSError):  # best effort: another user's (sticky folder), a folder
                        if (fd := take_abandoned(e)) is not None:  # a dead writer's
                            try:
                                if not e.is_symlink():
                                    e.unlink(missing_ok=True)
                            finally:
                                os.close(fd)
                lock = hold(tmp, create=True, mode=0o666)  # less the umask, as open() makes it
            if callable(data):
                data(tmp)
                fd = os.open(tmp, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            else:
                with open(tmp, "wb") as fh:
                    fh.write(data.encode("utf-8") if isinstance(data, str) else data)
                    fh.flush()
                    os.fsync(fh.fileno())
            if before_replace is not None:
                before_replace()
            keep_mode(tmp, path)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        finally:
            if lock is not None:
                os.close(lock)
    fsync_dir(path.parent)
    return path


#: a temporary file of :func:`atomic_write` untouched this long has no live writer: a sweep removes it
STALE_TMP_S = 600.0
_TMP_FILE_RE = re.compile(r"\..+\.tmp-.+")


def sweep_stale_tmp(folder: Path, min_age_s: float = STALE_TMP_S) -> list[tuple[Path, int]]:
    """Remove the temporary files of :func:`atomic_write` (``.NAME.tmp-*``) in ``folder`` untouched for ``min_age_s``:
    a writer killed before its rename left them (``kill -9``). Regular files only, no link followed or removed; a
    younger one may be a running writer's (here, or a process on another host sharing the folder). Returns
    ``(path, bytes)`` of those removed; a folder that is not there has none."""
    out, cutoff = [], time.time() - min_age_s
    try:
        with os.scandir(folder) as it:
            entries = [e for e in it if _TMP_FILE_RE.fullmatch(e.name)]
    except (FileNotFoundError, NotADirectoryError):
        return out
    for e in entries:
        try:
            st = e.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_mtime <= cutoff:
                os.unlink(e.path)
                out.append((Path(e.path), st.st_size))
        except OSError:  # raced with its writer's rename or another sweeper
            pass
    return out


#: in a folder written aside (:func:`folder_aside`), locked by the process writing it (the name backups gave it first)
IN_PROGRESS = ".vecbridge-backup-in-progress"
_TMP_RE = re.compile(r"\..+\.tmp-[0-9a-f]{8}")


def sweep_abandoned(parent: Path) -> list[str]:
    """Remove the temporary folders of dead :func:`folder_aside` writers (a backup, a bundle export) in ``parent``;
    the names removed.

    A folder counts only when its name is such a temporary name (``.NAME.tmp-<8 hex>``) and it holds
    :data:`IN_PROGRESS` that no process has locked: a running writer holds the lock (kept), a killed one lost it
    with its process. Folders without the marker (not ours, or one being created this instant) are kept.
    """
    removed = []
    try:
        subs = sorted(parent.iterdir())
    except FileNotFoundError:
        return removed
    for sub in subs:
        if not (_TMP_RE.fullmatch(sub.name) and sub.is_dir() and not sub.is_symlink()):
            continue
        fd = take_abandoned(sub / IN_PROGRESS)
        if fd is None:  # a live writer holds it; or no marker: not ours, or one that has not made it yet
            continue
        try:
            remove_marked(sub)
        finally:
            os.close(fd)
        removed.append(sub.name)
    return removed


def remove_marked(folder: Path) -> None:
    """Remove a folder marked :data:`IN_PROGRESS`, the marker last: a removal killed part-way leaves the rest still
    marked, so the next :func:`sweep_abandoned` finishes it (``rmtree`` reached the marker early, and the partial
    copy it left unmarked was kept forever)."""
    try:
        children = list(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return
    for child in children:
        if child.name == IN_PROGRESS:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def folder_aside(dest: Path) -> Iterator[tuple[Path, list[str]]]:
    """Write the new folder ``dest`` whole or not at all: yields ``(tmp, swept)``, a private folder beside ``dest``
    to fill (marked :data:`IN_PROGRESS` and locked while this process lives) and the names
    :func:`sweep_abandoned` removed from ``dest``'s parent first. When the body returns, every entry is made durable
    and ``tmp`` renamed to ``dest`` (which replaces an empty ``dest``, and fails, changing nothing, if a non-empty
    one appeared meanwhile); when it raises, ``tmp`` is removed. Used by backups and folder bundle exports."""
    make_parent(dest)
    swept = sweep_abandoned(dest.parent)
    tmp = dest.parent / temp_name(dest.name, f".tmp-{uuid.uuid4().hex[:8]}")
    with writing(dest, tmp):  # a full disk's error names DEST, not the hidden folder beside it
        tmp.mkdir()
        held = None
        try:
            held = hold(tmp / IN_PROGRESS, create=True)
            yield tmp, swept
            for d in sorted({p.parent for p in tmp.rglob("*")} | {tmp}, key=lambda p: -len(p.parts)):
                fsync_dir(d)  # every entry durable before the rename makes the folder visible
            os.rename(tmp, dest)
            # the marker goes only now: removed before the rename, a kill in the fsyncs above left a whole unmarked
            # copy (the local key too) that no sweep took; a kill here leaves an empty marker in the finished folder
            (dest / IN_PROGRESS).unlink()
            fsync_dir(dest)
            fsync_dir(dest.parent)
        except BaseException:
            remove_marked(tmp)
            raise
        finally:
            if held is not None:
                os.close(held)


def check_writable(path, what: str) -> None:
    """Refuse now an output ``path`` that :func:`atomic_write` could not write later: its folder (created as
    atomic_write creates it) must take a new file. Commands that compute for minutes before writing (a fit's
    ``--report``, ``plan --rows-out``, ``index search --out``, a transform's output) call it first, so a typo or a
    read-only folder is one line before the work, not after it (and not after a fit was registered).
    Raises InputError naming ``what`` (the option) and the path; a full disk can still fail the write itself."""
    path = Path(path)
    probe = path.parent / temp_name(path.name, f".probe-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        make_parent(path)
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        probe.unlink()
    except OSError as exc:
        why = (exc.strerror or str(exc)).lower()
        if isinstance(exc, (FileExistsError, NotADirectoryError)):
            blocker = next((p for p in reversed(path.parents) if p.exists() and not p.is_dir()), None)
            why = f"{blocker} is a file, not a folder" if blocker else "a file is in the way of its folder"
        raise InputError(f"{what} {path}: cannot be written ({why})") from None


def still_linked(fd: int, path: Path) -> bool:
    """Whether the file open as ``fd`` (a lock file) is still the one at ``path``: not removed, nor replaced, nor
    its folder renamed away (a lock taken on such a file excludes nobody)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


_IN_COPIES = ("link_or_copy", "quick_check_findings", "sqlite_backup")  # moved to service.copies (it imports this)


def __getattr__(name: str):
    """The names moved to :mod:`service.copies`, still importable from here."""
    if name in _IN_COPIES:
        from . import copies

        return getattr(copies, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
