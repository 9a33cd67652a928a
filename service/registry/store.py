"""Content-addressed artifact folder.

An artifact is written to ``tmp/`` first, flushed and fsync'ed, then renamed to
``<sha[:2]>/<sha>.<ext>`` (rename is atomic on POSIX) and the directory fsync'ed. A crash leaves
at worst a stray temporary file (swept by :meth:`ArtifactStore.sweep_tmp`) or an artifact that no
database row references yet (harmless: content-addressed, reused by the next identical write).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Callable

from ..storage import atomic_write
from .errors import IntegrityError

__all__ = ["STALE_TMP_S", "ArtifactStore", "sha256_bytes"]

STALE_TMP_S = 600.0  # a temporary artifact file untouched this long has no live writer: verify --sweep removes it


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ArtifactStore:
    """Files under ``root`` named by their sha256."""

    def __init__(self, root, hook: Callable[[str], None] | None = None):
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "tmp").mkdir(exist_ok=True)
        self._hook = hook or (lambda point: None)

    def relpath_for(self, sha: str, ext: str) -> str:
        return f"{sha[:2]}/{sha}.{ext}"

    def put(self, data: bytes, ext: str) -> tuple[str, str]:
        """Store ``data``; return ``(sha256, relative path)``. Idempotent for identical bytes."""
        sha = sha256_bytes(data)
        rel = self.relpath_for(sha, ext)
        final = self.root / rel
        if final.exists() and sha256_bytes(final.read_bytes()) == sha:
            return sha, rel
        atomic_write(final, data, tmp_dir=self.root / "tmp", before_replace=lambda: self._hook("artifact_tmp_written"))
        self._hook("artifact_renamed")
        return sha, rel

    def path(self, rel: str) -> Path:
        """Absolute path of a stored artifact; refuses paths that leave the store."""
        p = (self.root / rel).resolve()
        if self.root not in p.parents:
            raise IntegrityError(f"artifact path {rel!r} leaves the artifact folder")
        return p

    def get(self, rel: str, sha: str) -> bytes:
        """Read an artifact and verify its sha256."""
        p = self.path(rel)
        try:
            data = p.read_bytes()
        except OSError as exc:
            raise IntegrityError(f"artifact {rel} is missing or unreadable: {exc.strerror}") from None
        got = sha256_bytes(data)
        if got != sha:
            raise IntegrityError(f"artifact {rel} is corrupt: sha256 {got[:12]}… != recorded {sha[:12]}…")
        return data

    def all_relpaths(self) -> set[str]:
        out = set()
        for sub in self.root.iterdir():
            if sub.is_dir() and len(sub.name) == 2:
                out.update(f"{sub.name}/{f.name}" for f in sub.iterdir() if f.is_file())
        return out

    def tmp_files(self) -> list[Path]:
        """Temporary files in ``tmp/``, named as :func:`service.storage.atomic_write` names them."""
        return sorted((self.root / "tmp").glob(".*.tmp-*"))

    def sweep_tmp(self, min_age_s: float = STALE_TMP_S) -> int:
        """Remove leftover temporary files (from crashed writers) untouched for ``min_age_s``; returns how many.

        A younger file may belong to a writer that is still running (here, or on another host sharing the
        folder): removing it would fail that register. Artifacts are written in seconds.
        """
        n, cutoff = 0, time.time() - min_age_s
        for f in self.tmp_files():
            try:
                if f.stat().st_mtime <= cutoff:
                    f.unlink()
                    n += 1
            except OSError:  # pragma: no cover - raced with its writer's rename or another sweeper
                pass
        return n
