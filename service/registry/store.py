"""Content-addressed artifact folder.

An artifact is written to ``tmp/`` first, flushed and fsync'ed, then renamed to
``<sha[:2]>/<sha>.<ext>`` (rename is atomic on POSIX) and the directory fsync'ed. A crash leaves
at worst a stray temporary file (swept by :meth:`ArtifactStore.sweep_tmp`) or an artifact that no
database row references yet (harmless: content-addressed, reused by the next identical write).

A writer holds :meth:`ArtifactStore.pinned` from storing its artifact to its commit; a write that failed removes
the artifacts it stored (:meth:`ArtifactStore.discard`) only while no writer holds it, and only those no committed
row names: an artifact another writer is about to commit is never removed under it. ``registry gc`` (:mod:`.gc`)
removes deleted versions' artifacts under the same lock (:meth:`ArtifactStore.exclusive`), which bundle exports and
``vecbridge backup`` hold shared too, from listing the versions to copying the last artifact.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import BinaryIO, Callable

from ..storage import STALE_TMP_S, atomic_write, make_dir, sweep_stale_tmp
from .errors import IntegrityError, InvalidNameError, RegistryLockedError

__all__ = ["STALE_TMP_S", "ArtifactStore", "sha256_bytes"]

# STALE_TMP_S (service.storage): a temporary artifact file untouched this long has no live writer: verify --sweep
# removes it


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ArtifactStore:
    """Files under ``root`` named by their sha256."""

    def __init__(self, root, hook: Callable[[str], None] | None = None):
        self.root = Path(root).resolve()
        try:  # a file on its path was the bare errno ("[Errno 17] File exists") for every command
            make_dir(self.root / "tmp", f"the artifact folder {self.root} cannot be made (move the file, or name "
                                        f"another: --artifact-dir / VECBRIDGE_ARTIFACT_DIR)")
        except NotADirectoryError as e:
            raise InvalidNameError(str(e)) from None
        except PermissionError as e:  # a data dir this user cannot write: the folder named, not the bare errno
            raise InvalidNameError(f"the artifact folder {self.root} cannot be made: this user may not write in "
                                   f"{Path(e.filename or self.root).parent}") from None
        self._hook = hook or (lambda point: None)
        self.elsewhere_seen: tuple[float, str | None] | None = None  # (monotonic time, verdict): elsewhere.py
        self.aliased_seen: tuple[float, str | None] | None = None  # the same, of aliased_missing

    def relpath_for(self, sha: str, ext: str) -> str:
        return f"{sha[:2]}/{sha}.{ext}"

    def put(self, data: bytes, ext: str) -> tuple[str, str]:
        """Store ``data``; return ``(sha256, relative path)``. Idempotent for identical bytes."""
        return self.put_new(data, ext)[:2]

    def put_new(self, data: bytes, ext: str, written: list[str] | None = None) -> tuple[str, str, bool]:
        """:meth:`put`, and whether this call wrote the file (False: the same bytes were there already). ``written``:
        the relative path is appended to it before the write, so that a caller removing what it stored when it
        fails (:meth:`discard`) also removes a file this call renamed into place before raising (a Ctrl-C in the
        folder's fsync left an orphan: the caller never learnt of the file)."""
        sha = sha256_bytes(data)
        rel = self.relpath_for(sha, ext)
        final = self.root / rel
        if final.exists() and self._digest(final) == sha:
            return sha, rel, False
        if written is not None:
            written.append(rel)
        atomic_write(final, data, tmp_dir=self.root / "tmp", before_replace=lambda: self._hook("artifact_tmp_written"))
        self._hook("artifact_renamed")
        return sha, rel, True

    @staticmethod
    def _digest(path: Path) -> str:
        """sha256 of the file at ``path``, read in chunks (not the whole file at once)."""
        with path.open("rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()

    @contextmanager
    def pinned(self, how: int = fcntl.LOCK_SH) -> Iterator[bool]:
        """Hold an ``flock`` on the ``tmp/`` folder (shared: a writer between storing an artifact and committing the
        row that names it; ``LOCK_EX | LOCK_NB``: :meth:`discard`); yields whether it is held (False: another holds
        it, or the file system has no ``flock``: then nothing is discarded)."""
        (self.root / "tmp").mkdir(exist_ok=True)
        fd = os.open(self.root / "tmp", os.O_RDONLY | os.O_CLOEXEC)
        try:
            try:
                fcntl.flock(fd, how)
                held = True
            except OSError:  # BlockingIOError (LOCK_NB), or no flock here
                held = False
            yield held
        finally:
            os.close(fd)  # the lock goes with it

    @contextmanager
    def exclusive(self, wait_s: float) -> Iterator[None]:
        """Hold :meth:`pinned` alone (``registry gc``): no writer is then between storing an artifact and committing the
        row that names it, and a new one waits; RegistryLockedError (exit 75) when writers held it for ``wait_s``."""
        deadline = time.monotonic() + wait_s
        while True:
            with self.pinned(fcntl.LOCK_EX | fcntl.LOCK_NB) as held:
                if held:
                    yield
                    return
            if time.monotonic() >= deadline:
                raise RegistryLockedError(f"writers (fits, imports), an export or a backup held the artifact folder "
                                          f"{self.root} for {wait_s:g} s (or its file system has no flock): nothing "
                                          "was removed; retry later")
            time.sleep(0.05)

    def discard(self, rels, in_use: Callable[[], set[str]]) -> int:
        """Remove the artifacts ``rels`` a failed write stored, less those ``in_use()`` (committed rows) names, when no
        writer holds :meth:`pinned` (else they stay, as orphans ``registry verify`` lists); how many were removed."""
        if not rels:
            return 0
        with self.pinned(fcntl.LOCK_EX | fcntl.LOCK_NB) as held:
            if not held:
                return 0
            gone = set(rels) - in_use()
            for rel in gone:
                self.path(rel).unlink(missing_ok=True)
        return len(gone)

    def path(self, rel: str) -> Path:
        """Absolute path of a stored artifact; refuses paths that leave the store."""
        p = (self.root / rel).resolve()
        if self.root not in p.parents:
            raise IntegrityError(f"artifact path {rel!r} leaves the artifact folder")
        return p

    def size(self, rel: str) -> int | None:
        """Bytes of a stored artifact as it is on disk now (one ``stat``; nothing read or verified), or None when it
        is missing or unreadable."""
        try:
            return self.path(rel).stat().st_size
        except OSError:
            return None

    def get(self, rel: str, sha: str) -> bytes:
        """Read an artifact and verify its sha256 (its bytes: a bundle's copy; a loader reads :meth:`opened`)."""
        p = self.path(rel)
        try:
            data = p.read_bytes()
        except OSError as exc:
            raise IntegrityError(f"artifact {rel} is missing or unreadable: {exc.strerror}") from None
        got = sha256_bytes(data)
        if got != sha:
            raise IntegrityError(f"artifact {rel} is corrupt: sha256 {got[:12]}… != recorded {sha[:12]}…")
        self._read()
        return data

    @contextmanager
    def opened(self, rel: str, sha: str) -> Iterator[BinaryIO]:
        """An artifact open for reading at its start once its sha256 is verified, hashed in chunks: a reader takes its
        arrays from the file (:func:`align.map_from_bytes`), never a copy of the whole file beside them. One open file
        for both: a content-addressed file is replaced by a rename, never rewritten in place, so the file read is the
        one hashed. IntegrityError when it is missing, unreadable or corrupt."""
        with ExitStack() as stack:
            try:
                fh = stack.enter_context(self.path(rel).open("rb"))
                got = hashlib.file_digest(fh, "sha256").hexdigest()
            except OSError as exc:
                raise IntegrityError(f"artifact {rel} is missing or unreadable: {exc.strerror}") from None
            if got != sha:
                raise IntegrityError(f"artifact {rel} is corrupt: sha256 {got[:12]}… != recorded {sha[:12]}…")
            self._read()
            fh.seek(0)
            yield fh

    def _read(self) -> None:
        """An artifact was read whole and verified: a kept verdict "this folder is not the registry's" is dropped, the
        next miss looks again (elsewhere.py). It stayed 30 s after the folder was put right: a file lost meanwhile
        was a 503 "replicas must share ..." instead of the 500 a lost file is."""
        if self.elsewhere_seen is not None and self.elsewhere_seen[1] is not None:
            self.elsewhere_seen = None

    def all_relpaths(self) -> set[str]:
        """Relative paths of the files in the ``<sha[:2]>/`` folders (:meth:`artifact_files`, any name)."""
        return set(self.artifact_files())

    def artifact_files(self, suffixes: tuple[str, ...] = ("",)) -> dict[str, os.stat_result]:
        """``{relative path: lstat}`` of the regular files named with one of ``suffixes`` in the ``<sha[:2]>/``
        folders; no link followed: a link (a folder's or a file's) is no stored artifact, and removing what it points
        at would remove another file, maybe a live version's."""
        out = {}
        with os.scandir(self.root) as subs:
            for sub in subs:
                if len(sub.name) == 2 and sub.is_dir(follow_symlinks=False):
                    with os.scandir(sub.path) as files:
                        out.update((f"{sub.name}/{f.name}", f.stat(follow_symlinks=False)) for f in files
                                   if f.name.endswith(suffixes) and f.is_file(follow_symlinks=False))
        return out

    def tmp_files(self) -> list[Path]:
        """Temporary files in ``tmp/``, named as :func:`service.storage.atomic_write` names them."""
        return sorted((self.root / "tmp").glob(".*.tmp-*"))

    def sweep_tmp(self, min_age_s: float = STALE_TMP_S) -> int:
        """Remove leftover temporary files (from crashed writers) untouched for ``min_age_s``; returns how many.

        A younger file may belong to a writer that is still running (here, or on another host sharing the
        folder): removing it would fail that register. Artifacts are written in seconds.
        """
        return len(sweep_stale_tmp(self.root / "tmp", min_age_s))
