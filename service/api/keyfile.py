"""API keys read from a file (``VECBRIDGE_API_KEYS_FILE``), re-read when the file changes.

A key that leaked is revoked, and a new one added, by rewriting the file (best by writing a new file and renaming
it over the old one, as Kubernetes updates a mounted secret): every serving process sees the change within
:data:`CHECK_EVERY_S` of its next authenticated request, without a restart. The file is checked by its stat
signature (device, inode, size, mtime), at most once per :data:`CHECK_EVERY_S` per file, so a request costs no
file read. A file that cannot be read or does not hold valid keys keeps the keys last read (an error is logged
once per change of the file): a half-written or mistyped file never locks every client out, nor lets one in.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from ..config import Settings, check_api_keys, read_setting_file
from ..indexes.locking import stat_sig

__all__ = ["CHECK_EVERY_S", "current_keys"]

CHECK_EVERY_S = 1.0
_log = logging.getLogger("vecbridge.auth")


class _KeyFile:
    """The keys last read from one file, and when it was last looked at."""

    def __init__(self, path: str, keys: dict[str, list[str]]):
        self.path, self.keys = path, keys  # as the settings read them, maybe long before the first request
        self.sig = None  # unknown: the first request reads the file again (it may have changed since the settings)
        self.checked = float("-inf")
        self.lock = threading.Lock()

    def current(self) -> dict[str, list[str]]:
        now = time.monotonic()
        if now - self.checked < CHECK_EVERY_S or not self.lock.acquire(blocking=False):
            return self.keys  # checked recently, or another thread is checking now
        try:
            self.checked = now
            sig = stat_sig(Path(self.path))  # follows links (a Kubernetes secret)
            if sig != self.sig:
                self.sig = sig
                self._reload()
        finally:
            self.lock.release()
        return self.keys

    def _reload(self) -> None:
        try:  # read and checked as at start-up; the messages never hold the file's content
            keys = check_api_keys(read_setting_file("api_keys", self.path))
        except ValueError as exc:  # ConfigError: unreadable, not JSON; ValueError: a key or scope refused
            _log.error("API keys file not reloaded: %s (%s); the keys read before stay in use", self.path, exc)
            return
        if keys == self.keys:
            return
        added, removed = len(keys.keys() - self.keys.keys()), len(self.keys.keys() - keys.keys())
        self.keys = keys
        _log.info("API keys reloaded from %s: %d key(s), %d added, %d removed", self.path, len(keys), added, removed)


_files: dict[str, _KeyFile] = {}
_files_lock = threading.Lock()


def current_keys(settings: Settings) -> dict[str, list[str]]:
    """The API keys in force: ``settings.api_keys``, or the latest valid content of its keys file when the keys came
    from ``VECBRIDGE_API_KEYS_FILE``."""
    path = settings.files.get("api_keys")
    if path is None:
        return settings.api_keys
    kf = _files.get(path)
    if kf is None:
        with _files_lock:
            kf = _files.setdefault(path, _KeyFile(path, settings.api_keys))
    return kf.current()
