"""Locks of the index store: a readers–writer lock per index (threads of one process) and
exclusive ``fcntl.flock`` files (processes sharing one data dir).

One process: searches share the read side of :class:`RWLock` (FAISS releases the GIL, so they
run in parallel); the in-memory change and the save of an add / delete take the write side, so
a search never sees a half-applied batch (an HNSW add takes it per chunk of rows, which stay hidden
from searches until the add is persisted). The lock prefers writers, but readers that waited for a
writer go before the next one.

Several processes: a writer holds :func:`flock` on ``root/<name>/.lock`` for its whole
read-modify-persist; create and drop hold ``root/.store.lock``. :func:`stat_sig` is the cheap
change token readers compare before a search. ``flock`` needs a local file system (not NFS).
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from align.exceptions import VecbridgeError

from ..storage import still_linked

__all__ = ["RWLock", "WouldBlock", "flock", "still_linked", "stat_sig", "meta_sig"]


class WouldBlock(VecbridgeError):
    """A call made with ``wait=False`` would have to wait (a lock, a load, a query): run it where waiting is fine.

    A control-flow signal, not an error: the event-loop fast path (:mod:`service.api.fastpath`) tries
    a small search in memory and hands it to the thread pool when this is raised. Raised before any
    side effect. Kind ``busy``, should one ever escape to a client."""

    kind = "busy"


class RWLock:
    """Readers–writer lock (``with lock.read(): ...`` / ``with lock.write(): ...``) that prefers writers, but lets
    the readers waiting when a writer leaves in before the next writer.

    A reader arriving while a writer holds or waits for the lock waits; when the writer leaves, every reader waiting
    then goes first (their *turn*), and writers wait for them. Without the turn, a writer that takes the lock again
    at once (an HNSW add, chunk by chunk: :meth:`~.space.SpaceIndex.add`) would get it before the woken readers,
    which would then wait for its whole series of chunks.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._waiting_writers = 0
        self._waiting_readers = 0
        self._readers_turn = False

    def _readers_wait(self) -> bool:
        return self._writer or (self._waiting_writers > 0 and not self._readers_turn)

    @contextmanager
    def read(self, *, blocking: bool = True) -> Iterator[None]:
        """The read side; ``blocking=False`` raises :class:`WouldBlock` instead of waiting for a writer."""
        with self._cond:
            if self._readers_wait():
                if not blocking:
                    raise WouldBlock("the index is being written")
                self._waiting_readers += 1
                try:
                    while self._readers_wait():
                        self._cond.wait()
                finally:
                    self._waiting_readers -= 1
                    if not self._waiting_readers and self._readers_turn:  # the last of the turn is in
                        self._readers_turn = False
                        self._cond.notify_all()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._waiting_writers += 1
            try:
                while self._writer or self._readers or self._readers_turn:
                    self._cond.wait()
            finally:
                self._waiting_writers -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._readers_turn = self._waiting_readers > 0
                self._cond.notify_all()


@contextmanager
def flock(lock_path: Path, *, create_dir: bool = False) -> Iterator[int]:
    """Exclusive ``flock`` on ``lock_path`` (created if missing) for the ``with`` body.

    Raises ``FileNotFoundError`` when the folder does not exist (and ``create_dir`` is false).
    The kernel releases the lock when the descriptor closes, also when the process dies.
    """
    if create_dir:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)  # releases the lock


def stat_sig(path: Path | str) -> tuple[int, int, int, int] | None:
    """Cheap change token of a file (device, inode, size, mtime ns); ``None`` when missing.

    Every ``meta.json`` is a new file (renamed into place) stamped with a modification time no earlier meta
    of its index had (:func:`~.persist._write_meta`): its inode alone would not do, the file system reuses it.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


_META_FILES: dict[Path, str] = {}  # index folder -> its meta.json, as the string os.stat takes


def meta_sig(folder: Path) -> tuple[int, int, int, int] | None:
    """:func:`stat_sig` of ``folder / "meta.json"``, the generation of the index in ``folder``: read before every
    search (``SpaceIndex.is_current`` / ``refresh``), so the path is joined once per folder, not per request
    (building the ``Path`` cost about as much as the ``stat``)."""
    meta = _META_FILES.get(folder)
    if meta is None:
        if len(_META_FILES) > 4096:  # bounded: folders of indexes dropped and re-created under other names
            _META_FILES.clear()
        meta = _META_FILES[folder] = os.path.join(folder, "meta.json")
    return stat_sig(meta)
