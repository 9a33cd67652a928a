"""API keys read from a file (``VECBRIDGE_API_KEYS_FILE``), re-read when the file changes.

A key that leaked is revoked, and a new one added, by rewriting the file (best by writing a new file and renaming
it over the old one, as Kubernetes updates a mounted secret): every serving process sees the change within
:data:`CHECK_EVERY_S` of its next authenticated request, without a restart. The file is checked by its stat
signature (device, inode, size, mtime), at most once per :data:`CHECK_EVERY_S` per file, so a request costs no
file read. A file that cannot be read or does not hold valid keys keeps the keys last read (an error is logged
once per change of the file): a half-written or mistyped file never locks every client out, nor lets one in.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import shlex
import stat
import threading
import time
from pathlib import Path

from ..config import ConfigError, Settings, check_api_keys, read_setting_file
from ..indexes.locking import stat_sig

__all__ = ["CHECK_EVERY_S", "current_keys", "read_local_key"]

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


def read_local_key(path: Path) -> str:
    """The key in ``path`` (``vecbridge serve``'s local key), made when missing: 32 random bytes, hex, mode 0600.

    The file is opened without following a symbolic link (``O_NOFOLLOW``) and checked on the open descriptor
    (``fstat``: what is checked is what is read). ConfigError (one line, exit 2) naming the file when it is a link,
    not a plain file, another user's, or open to other users in any way -- refused as sshd refuses such a private
    key, rather than put right in silence: a key others could read may have been read, and only its owner can say
    whether it must be replaced. One open to its group alone is made 0600 with a warning (:func:`_check_private`).
    Before, a 0644 or symlinked ``local-key`` was used as it was while the start-up line said "mode 0600", and a
    dangling link was "[Errno 17] File exists".
    """
    for _ in range(2):  # a second look when another process made the file meanwhile (serve --workers, a 2nd serve)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)  # NONBLOCK: a FIFO
        except FileNotFoundError:
            try:  # O_EXCL does not follow a link either: a dangling one is EEXIST, and the next look names it
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except FileExistsError:
                continue
            key = secrets.token_hex(32)
            with os.fdopen(fd, "w") as f:
                f.write(key + "\n")
                f.flush()
                os.fsync(f.fileno())
            return key
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ConfigError(f"{path} is a symbolic link: the local key must be a plain file in the data dir, "
                                  f"not followed elsewhere; remove the link (a new key is made) or set "
                                  f"VECBRIDGE_API_KEYS") from None
            raise ConfigError(f"{path} cannot be read as the local key ({exc.strerror or exc}); delete it to make "
                              f"a new one, or set VECBRIDGE_API_KEYS") from None
        with os.fdopen(fd, "rb") as f:
            _check_private(path, os.fstat(f.fileno()), f.fileno())
            raw = f.read(4096)
        try:
            return raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise ConfigError(f"{path} holds no usable key; delete it to make a new one") from None
    raise ConfigError(f"{path} kept changing while it was read as the local key; start again")


def _check_private(path: Path, st: os.stat_result, fd: int) -> None:
    """ConfigError unless ``st`` (of the open ``fd``) is a plain file of this user's that no other user may read or
    write. Bits of its group alone are taken away (``fchmod`` 0600, a warning): Kubernetes' ``fsGroup`` adds them to
    every file of a volume at each mount, so a refusal stopped every later start of a pod."""
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{path} cannot be read as the local key (not a plain file); delete it to make a new one, "
                          f"or set VECBRIDGE_API_KEYS")
    if st.st_uid != os.geteuid():
        raise ConfigError(f"{path} belongs to another user (uid {st.st_uid}, this process runs as uid "
                          f"{os.geteuid()}): the local key must be this user's own file; delete it to make a new one")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o070 and not mode & 0o007:
        os.fchmod(fd, mode & ~0o077)
        _log.warning("local key was open to its group: made private", extra={"fields": {
            "file": str(path), "mode_was": f"{mode:04o}", "mode": f"{mode & ~0o077:04o}"}})
        return
    if mode & 0o077:
        raise ConfigError(f"{path} is open to other users (mode {mode:04o}): the local key must be readable by its "
                          f"owner only; run `chmod 600 {shlex.quote(str(path))}` (or delete it to make a new key, if "
                          f"others may have read it)")
