"""All indexes of one service (:class:`IndexStore`), persisted under ``data_dir/indexes``.

Several processes (``uvicorn --workers N``) may share the folder: every process keeps its own
in-memory copies and the files are the truth. Create builds the index in ``root/.create-*``
and renames the folder into place under ``root/.store.lock``; drop renames the folder away
(``root/.trash-*``) under both that lock and the index's writer lock, then removes it, so other
processes see an index appear or vanish atomically. :meth:`IndexStore.get` catches a copy up
with what other processes persisted (one ``stat`` when nothing changed).

A server loads the indexes on disk in the background (:meth:`IndexStore.load_in_background`), so it answers
at once however large they are; a request for an index not loaded yet loads it itself or waits for the
loader (one loader per name: never read twice).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..logging import get_logger
from ..storage import fsync_dir, hold, sweep_stale_tmp, take_abandoned
from .errors import (
    IndexConflictError,
    IndexNotFoundError,
    NewerFormatError,
    UnreadableGenerationError,
    gone,
    unreadable,
)
from .kinds import NAME_RE, check_name
from .locking import flock, stat_sig
from .persist import LOCK_FILE, STORE_LOCK, uid_of
from .space import SpaceIndex

_log = get_logger("indexes")

__all__ = ["IndexStore"]

_STALE_CREATE_S = 24 * 3600  # a create folder without CREATING (made by an older release): removed after this
CREATING = ".creating"  # root/.create-*/.creating: flock-ed by the process building that index (storage.hold)


class IndexStore:
    """All indexes of one service, persisted under ``root`` (``data_dir/indexes``).

    Several stores (processes) may share ``root``: :meth:`get` and :meth:`list` see indexes
    created, changed and dropped by the others (see the module notes).
    """

    def __init__(self, root: Path, observer=None, *, listing: str = "GET /v1/indexes") -> None:
        self.root = Path(root)
        self.listing = listing  # what lists the indexes, for the 404 of an unknown one (the CLI: its command)
        #: told of each index's generations, catch-ups and drops (:class:`~service.metrics.ServiceMetrics`):
        #: ``index_changed(idx)``, ``index_caught_up(name, how, seconds)``, ``index_dropped(name)``
        self.observer = observer
        self._indexes: dict[str, SpaceIndex] = {}
        self._lock = threading.Lock()
        self._creating: set[str] = set()
        # one loader per name: name -> [lock, threads holding or waiting for it, callbacks of when_loaded], dropped
        # when no thread is (a lock per name ever looked up would leak; one shared by names would make one wait for
        # another's slow load)
        self._load_locks: dict[str, list] = {}
        self._failed: dict[str, tuple | None] = {}  # name -> meta sig that failed to load
        #: True once every index on disk at start-up was loaded or failed (:meth:`load_all`, the background loader)
        self.loaded = False
        self.load_errors: dict[str, str] = {}
        self._pending: set[str] = set()  # names the background loader has not loaded (nor failed) yet
        self._stop = threading.Event()
        self._done_lock = threading.Lock()  # the loader's end vs stop_loading
        self._lives: dict[str, tuple] = {}  # name -> (meta stat_sig, uid): lives() reads a meta once it changed

    def load_all(self) -> int:
        """Read every persisted index now; returns how many loaded (failures go to ``load_errors``).

        Sweeps first (:meth:`sweep`). A server uses :meth:`load_in_background` instead.
        """
        self.sweep()
        n = len(self.list())
        self.loaded = True
        return n

    def load_in_background(self, on_done: Callable[[], None] | None = None) -> None:
        """Sweep now (:meth:`sweep`), then load every index on disk in one daemon thread, smallest first.

        Smallest first (bytes of the index's folder): most indexes are served soonest and one large index delays
        none of the small ones. Until the thread is done :attr:`loaded` is False and :meth:`status` counts the
        indexes still loading; a request for one of them meanwhile loads it (or waits for the thread's load of
        it). A failure is what it is for :meth:`get` (``load_errors``, a 404 naming it) and keeps nothing
        waiting. ``on_done()`` runs in the thread at the end.
        """
        self.sweep()
        names = sorted(self._names_on_disk(), key=lambda n: (_folder_bytes(self.root / n), n))
        with self._lock:
            self._pending = set(names)
        self._count_pending()
        threading.Thread(target=self._load_pending, args=(names, on_done), name="vecbridge-index-load",
                         daemon=True).start()

    def stop_loading(self) -> None:
        """Have the background loader stop before its next index (the app is closing); once this returns, the
        loader's ``on_done`` does not run any more (it ran already, or never will)."""
        with self._done_lock:
            self._stop.set()

    def _load_pending(self, names: list[str], on_done: Callable[[], None] | None) -> None:
        started = time.perf_counter()
        for name in names:
            if self._stop.is_set():
                return
            with self._lock:
                if name not in self._pending:  # loaded by a request, or dropped, meanwhile
                    continue
            try:
                self.get(name)
            except (IndexNotFoundError, NewerFormatError):  # load_errors says why (/readyz)
                pass
            except Exception as exc:  # noqa: BLE001 - never raised in a thread: reported as a failed load
                with self._lock:
                    self.load_errors[name] = f"{type(exc).__name__}: {exc}"
            finally:
                self._settled(name)
        with self._done_lock:  # not after stop_loading: the app that asked for on_done may be closed already
            if self._stop.is_set():
                return
            self.loaded = True
            s = self.status()
            _log.info("indexes loaded", extra={"fields": {"loaded": s["loaded"], "failed": s["failed"],
                                                          "seconds": round(time.perf_counter() - started, 2)}})
            if on_done is not None:
                on_done()

    def _settled(self, name: str) -> None:
        """``name`` is loaded, failed or gone: no longer waited for."""
        with self._lock:
            if name not in self._pending:
                return
            self._pending.discard(name)
        self._count_pending()

    def _count_pending(self) -> None:
        if self.observer is not None:
            self.observer.indexes_loading(len(self._pending))

    def status(self) -> dict:
        """``{"loaded", "loading", "failed", "errors"}``: indexes in memory, indexes the start-up has yet to load,
        and those that could not be loaded (``errors``: name -> why, also for an index in memory whose newer
        generation cannot be read). From memory: no file is read."""
        with self._lock:
            failed = sum(1 for n in self.load_errors if n not in self._indexes)
            return {"loaded": len(self._indexes), "loading": len(self._pending), "failed": failed,
                    "errors": dict(self.load_errors)}

    def sweep(self) -> None:
        """Create ``root``; remove what a dead process left behind: dropped folders still being removed,
        index folders whose creating process died (its lock on :data:`CREATING` gone: ``kill -9`` included; a
        folder without the marker, from an older release, after a day), and an index's temporary files untouched
        for ``STALE_TMP_S`` (a writer killed mid-snapshot left ``.index.N.faiss.tmp-*``, 175 MB, that only the next
        write to that index removed)."""
        self.root.mkdir(parents=True, exist_ok=True)
        now = time.time()
        for sub in self.root.iterdir():
            if sub.name.startswith(".trash-"):
                shutil.rmtree(sub, ignore_errors=True)
            elif sub.name.startswith(".create-"):
                _sweep_create(sub, now)
        self.sweep_tmp()

    def sweep_tmp(self) -> None:
        """Remove the temporary files of dead writers in each index's folder (:func:`~service.storage.sweep_stale_tmp`:
        untouched for ``STALE_TMP_S``, regular files only; an index folder that is a link is left alone)."""
        stale = []
        try:
            subs = list(self.root.iterdir())
        except OSError:
            return
        for sub in subs:
            if NAME_RE.fullmatch(sub.name) and sub.is_dir() and not sub.is_symlink():
                stale += sweep_stale_tmp(sub)
        if stale:
            _log.warning("stale temporary index files removed", extra={"fields": {
                "files": [str(p.relative_to(self.root)) for p, _ in stale], "bytes": sum(n for _, n in stale)}})

    def names(self) -> list[str]:
        """Names of the indexes on disk, sorted (loaded or not; one ``listdir``)."""
        return self._names_on_disk()

    def lives(self) -> dict[str, str]:
        """``{name: uid}`` of every index on disk (:func:`~.persist.uid_of`: a dropped and re-created index has
        another): one ``stat`` an index, its ``meta.json`` read only when it changed. A meta that cannot be read is
        left out."""
        out, seen = {}, {}
        for name in self._names_on_disk():
            meta = self.root / name / "meta.json"
            sig, got = stat_sig(meta), self._lives.get(name)
            if sig is None or got is None or got[0] != sig:
                try:
                    got = (sig, uid_of(json.loads(meta.read_text())))
                except (OSError, ValueError, KeyError, TypeError):
                    continue
            seen[name], out[name] = got, got[1]
        self._lives = seen  # one dict replaced: a concurrent call reads the old one or the new
        return out

    def spaces(self) -> dict[str, str]:
        """``{index name: its space}`` for every index on disk, from each ``meta.json`` alone: no vectors are
        read, and an index that cannot be loaded (a damaged generation, a newer format) still names its space. A
        ``meta.json`` that is not JSON with a ``space`` is left out."""
        out = {}
        for name in self._names_on_disk():
            try:
                space = json.loads((self.root / name / "meta.json").read_text())["space"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if isinstance(space, str):
                out[name] = space
        return out

    @contextmanager
    def held_spaces(self) -> Iterator[dict[str, str]]:
        """:meth:`spaces`, read under the store lock and held while the caller acts on it: no index commits
        meanwhile (``create``'s ``before_commit`` runs under the same lock)."""
        with flock(self.root / STORE_LOCK, create_dir=True):
            yield self.spaces()

    def _names_on_disk(self) -> list[str]:
        try:
            subs = sorted(self.root.iterdir())
        except FileNotFoundError:
            return []
        return [d.name for d in subs if NAME_RE.fullmatch(d.name) and (d / "meta.json").exists()]

    def create(self, name: str, space: str, vectors, *, before_commit: Callable[[], None] | None = None,
               **kw) -> SpaceIndex:
        """Build and persist a new index; :class:`IndexConflictError` if the name exists (in any process).

        ``before_commit()`` runs under the store lock just before the index becomes visible; what it raises
        refuses the index (nothing is left). :meth:`held_spaces` takes the same lock, so a space deleted while the
        index was built is seen by one of the two (a build takes minutes: the space was deleted and the index then
        appeared in it)."""
        check_name(name)
        final = self.root / name
        with self._lock:
            if name in self._creating or (final / "meta.json").exists():
                raise IndexConflictError(f"index {name!r} already exists")
            self._creating.add(name)  # reserve the name in this process while building
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            now = time.time()
            for dead in self.root.glob(".create-*"):  # left by killed creates (a CLI never runs sweep())
                _sweep_create(dead, now)
            tmp = self.root / f".create-{name}-{uuid.uuid4().hex}"
            tmp.mkdir()
            held = None
            try:
                held = hold(tmp / CREATING, create=True)  # alive while this process builds: sweep() keeps it
                idx = SpaceIndex.build(name, space, vectors, path=tmp, **kw)
                idx.save()  # generation 1 in the private folder
                sig = idx._meta_sig  # renaming the folder keeps the file's inode and mtime
                with flock(self.root / STORE_LOCK):
                    if (final / "meta.json").exists():
                        raise IndexConflictError(f"index {name!r} already exists")
                    if before_commit is not None:
                        before_commit()
                    if final.exists():  # a folder without meta: left by a crash before this format
                        os.rename(final, self.root / f".trash-{name}-{uuid.uuid4().hex}")
                    os.rename(tmp, final)
                    # the marker goes after the rename: removed before it, a kill between left an unmarked copy
                    # of the whole index for a day; a kill here leaves an empty marker in the index folder
                    (final / CREATING).unlink()
                    fsync_dir(self.root)
                idx.path, idx._meta_sig = final, sig
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
                if held is not None:
                    os.close(held)
        finally:
            with self._lock:
                self._creating.discard(name)
        with self._lock:
            self._indexes[name] = idx
            self._failed.pop(name, None)
            self.load_errors.pop(name, None)
        return self._attach(idx)

    def _attach(self, idx: SpaceIndex) -> SpaceIndex:
        """``idx``, now telling :attr:`observer` of its changes (told of the generation it holds now)."""
        if self.observer is not None:
            idx.observer = self.observer
            self.observer.index_changed(idx)
        return idx

    def _missing(self, name: str) -> IndexNotFoundError:
        """The 404 of an index that is not there, suggesting a close name (the folder is listed on this error only)."""
        return gone(name, "no such index", known=self._names_on_disk(), listing=self.listing)

    def _dropped(self, name: str) -> None:
        if self.observer is not None:
            self.observer.index_dropped(name)

    def get(self, name: str) -> SpaceIndex:
        """The index ``name``, caught up with what other processes persisted."""
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise self._missing(name)
        with self._lock:
            idx = self._indexes.get(name)
        if idx is not None:
            try:
                idx.refresh()
            except IndexNotFoundError:
                if self._forget(name, idx):  # only the thread that forgot it: another may have loaded the new one,
                    self._dropped(name)  # whose gauges a second drop removed (its scrape showed no index)
                return self._load(name)
            except UnreadableGenerationError as exc:  # keep serving the whole generation in memory; readyz says why
                _log.warning("index generation unreadable", extra={"fields": {"index": name, "error": str(exc)}})
                with self._lock:
                    self.load_errors[name] = str(exc)
                return idx
            except NewerFormatError as exc:  # 503: what is in memory lacks the newer process's changes
                self._newer(name, exc)
                raise
            if name in self.load_errors and idx.is_current():
                with self._lock:
                    self.load_errors.pop(name, None)
            return idx
        return self._load(name)

    def _newer(self, name: str, exc: NewerFormatError) -> None:
        """Note in ``load_errors`` (``/readyz``) and, once, in the log that a newer vecbridge wrote ``name``."""
        with self._lock:
            said, self.load_errors[name] = self.load_errors.get(name), str(exc)
        if said != str(exc):
            _log.warning("index written by a newer vecbridge", extra={"fields": {"index": name, "error": str(exc)}})

    def in_memory(self, name: str) -> SpaceIndex | None:
        """The index ``name`` when it is in memory (any generation), else None; never loads or waits."""
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            return None
        with self._lock:
            return self._indexes.get(name)

    def _forget(self, name: str, idx: SpaceIndex) -> bool:
        """Drop ``idx`` from memory if it is still what ``name`` holds; whether it was."""
        with self._lock:
            if self._indexes.get(name) is idx:
                del self._indexes[name]
                return True
        return False

    def when_loaded(self, name: str, callback: Callable[[], None]) -> bool:
        """True when a thread is loading ``name`` now: ``callback()`` is then called (in that thread, once) when
        its load ends, loaded or not. False when there is nothing to wait for (:meth:`get` finds the index in
        memory, or loads it itself). Lets an async caller wait for another thread's load without a thread."""
        with self._lock:
            entry = self._load_locks.get(name)
            if entry is None or name in self._indexes:
                return False
            entry[2].append(callback)
            return True

    def pending(self, name: str) -> bool:
        """Whether ``name`` is one the start-up has yet to load (neither loaded nor failed yet)."""
        with self._lock:
            return name in self._pending and name not in self._indexes

    def loading(self) -> list[str]:
        """Names some thread is loading (or waiting to load) now."""
        with self._lock:
            return [n for n in self._load_locks if n not in self._indexes]

    def _load(self, name: str) -> SpaceIndex:
        with self._lock:
            entry = self._load_locks.setdefault(name, [threading.Lock(), 0, []])
            entry[1] += 1
        try:
            with entry[0]:  # one loader per name; other names load in parallel, never waiting for this one
                try:
                    return self._load_locked(name)
                finally:
                    self._settled(name)
        finally:
            with self._lock:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._load_locks[name]
                told, entry[2] = entry[2], []
            for callback in told:
                try:
                    callback()
                except Exception:  # noqa: BLE001 - a waiter's trouble never fails this load
                    _log.exception("index load callback failed")

    def _load_locked(self, name: str) -> SpaceIndex:
        path = self.root / name
        with self._lock:
            idx = self._indexes.get(name)
        if idx is not None:  # another thread loaded it meanwhile
            return idx
        sig = stat_sig(path / "meta.json")
        if sig is None:
            raise self._missing(name)
        if name in self._failed and self._failed[name] == sig:
            raise unreadable(name, str(self.load_errors.get(name)))
        started = time.perf_counter()
        try:
            idx = SpaceIndex.load(path)
        except FileNotFoundError:  # dropped while loading
            raise gone(name, listing=self.listing) from None
        except NewerFormatError as exc:  # there, not readable here: 503 (read again at each request)
            self._newer(name, exc)
            raise
        except Exception as exc:  # keep serving the others; readyz reports it
            with self._lock:
                self._failed[name] = sig
                self.load_errors[name] = f"{type(exc).__name__}: {exc}"
            raise unreadable(name, f"{type(exc).__name__}: {exc}") from exc
        with self._lock:
            self._indexes[name] = idx
            self._failed.pop(name, None)
            self.load_errors.pop(name, None)
        _log.info("index loaded", extra={"fields": {"index": name, "vectors": idx.count,
                                                    "seconds": round(time.perf_counter() - started, 2)}})
        return self._attach(idx)

    def list(self) -> list[SpaceIndex]:
        """Every index on disk (loaded or caught up as needed), by name."""
        names = self._names_on_disk()
        out = []
        for name in names:
            try:
                out.append(self.get(name))
            except (IndexNotFoundError, NewerFormatError):  # load_errors says why (/readyz)
                pass
        keep = set(names)
        with self._lock:
            gone_now = [n for n in self._indexes if n not in keep]
            for name in gone_now:
                del self._indexes[name]
            for name in [n for n in self.load_errors if n not in keep]:
                del self.load_errors[name]
                self._failed.pop(name, None)
        for name in gone_now:
            self._dropped(name)
        return out

    def delete(self, name: str) -> None:
        """Drop ``name``: atomically invisible to every process, then removed from disk."""
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise self._missing(name)
        final = self.root / name
        trash = self.root / f".trash-{name}-{uuid.uuid4().hex}"
        try:
            with flock(self.root / STORE_LOCK, create_dir=True):
                if not (final / "meta.json").exists():
                    raise self._missing(name)
                with flock(final / LOCK_FILE):  # let a writer in flight finish
                    os.rename(final, trash)
                fsync_dir(self.root)
        finally:
            with self._lock:
                self._indexes.pop(name, None)
                self._failed.pop(name, None)
                self.load_errors.pop(name, None)
            self._settled(name)
        self._dropped(name)
        shutil.rmtree(trash, ignore_errors=True)


def _sweep_create(sub: Path, now: float) -> None:
    """Remove the create folder ``sub`` when its creator is dead: no process holds its :data:`CREATING` (``kill -9``
    included), or it has none (an older release's, or one made this instant) and is more than a day old."""
    fd = take_abandoned(sub / CREATING)
    if fd is not None:  # a whole index's files, kept for nothing
        try:
            shutil.rmtree(sub, ignore_errors=True)
        finally:
            os.close(fd)
        return
    try:
        if not (sub / CREATING).exists() and now - sub.stat().st_mtime > _STALE_CREATE_S:
            shutil.rmtree(sub, ignore_errors=True)
    except FileNotFoundError:
        pass


def _folder_bytes(folder: Path) -> int:
    """Bytes of the files in ``folder`` (what loading its index reads, roughly: older generations kept for
    readers count too); 0 when it is gone."""
    try:
        return sum(e.stat().st_size for e in os.scandir(folder) if e.is_file())
    except OSError:
        return 0
