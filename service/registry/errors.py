"""Typed errors raised by :mod:`service.registry`.

::

    RegistryError (VecbridgeError)     base of every registry error                     kind
    ├── NotFoundError                  unknown map, version, alias or space           not_found
    │   ├── DeletedVersionError        the version (or the alias's target) was deleted
    │   └── NoReliableVersionError     a bare map or steer name whose live versions are all flagged unreliable
    ├── ConflictError                  the request contradicts stored state            conflict
    │   └── AliasMovedError            a compare-and-set alias write found it elsewhere
    ├── InvalidNameError (ValueError)  a name or reference that is not allowed         invalid
    ├── IntegrityError                 an artifact is missing or its sha256 differs    integrity
    │   └── ArtifactsElsewhereError    this data dir lacks the registry's artifacts    unavailable
    └── RegistryUnavailableError       the registry's database server cannot be reached unavailable
        ├── RegistryLockedError        the SQLite file stayed locked past the busy timeout (retry later)
        └── DamagedDatabaseError       the SQLite file is damaged (restore a backup)

Each is also the service-wide class of its kind (``service.errors``), so a caller may catch
``service.errors.NotFoundError`` for any unknown thing, registry or not.
"""

from __future__ import annotations

from align.exceptions import InputError, VecbridgeError

from .. import errors as _errors

__all__ = [
    "RegistryError",
    "NotFoundError",
    "DeletedVersionError",
    "NoReliableVersionError",
    "ConflictError",
    "AliasMovedError",
    "InvalidNameError",
    "IntegrityError",
    "ArtifactsElsewhereError",
    "RegistryUnavailableError",
    "RegistryLockedError",
    "DamagedDatabaseError",
    "unknown",
]


class RegistryError(VecbridgeError):
    """Base class of registry errors (kind ``internal`` unless a subclass says otherwise)."""


class NotFoundError(RegistryError, _errors.NotFoundError):
    """An unknown map, version, alias or space."""


class DeletedVersionError(NotFoundError):
    """The referenced version exists but was (soft-)deleted."""


class NoReliableVersionError(NotFoundError):
    """A bare map (or steer) name whose live versions are all flagged unreliable (and no live ``prod`` pins one):
    the name means no version, as searches use none; ``NAME:N`` uses one anyway. ``versions``: the flagged ones,
    newest first."""

    def __init__(self, message: str, versions: list[int] | None = None) -> None:
        super().__init__(message)
        self.versions = list(versions or [])


class ConflictError(RegistryError, _errors.ConflictError):
    """The operation contradicts stored state (dims differ, alias on a deleted version, ...)."""


class AliasMovedError(ConflictError):
    """A compare-and-set alias write (``expected=``) found the alias elsewhere; nothing was written.

    ``current``: the version it points at now (None: not set), for a face to name it (HTTP: its ETag).
    """

    def __init__(self, message: str, current: int | None = None) -> None:
        super().__init__(message)
        self.current = current


class InvalidNameError(RegistryError, InputError):
    """A name, alias, tag key or reference that is not allowed."""


class IntegrityError(RegistryError):
    """A stored artifact is missing, unreadable, or does not match its recorded sha256."""

    kind = "integrity"


class ArtifactsElsewhereError(IntegrityError, _errors.NotConfiguredError):
    """An artifact is missing, and so are most of the newest versions' files: this data dir's artifact folder is not
    the one the registry's writers filled (a replica with its own data dir on a shared PostgreSQL registry). 503
    without ``Retry-After``, exit 2, until its operator points it at the shared folder; it was a 500 IntegrityError
    per request while /readyz said ready (QA 4801)."""

    kind = "unavailable"


class RegistryUnavailableError(RegistryError, _errors.ServiceUnavailableError):
    """The registry's database server refused the connection or dropped it mid-transaction (503 / exit 75: retry)."""


class RegistryLockedError(RegistryUnavailableError):
    """Another process (a backup, a long write) kept the SQLite registry file locked past the busy timeout: 503 /
    exit 75 (retry later) naming the file and the wait. It was SQLite's bare "database is locked", after a silent
    minute."""


class DamagedDatabaseError(RegistryUnavailableError):
    """SQLite found the registry file damaged (``database disk image is malformed``, ``file is not a database``):
    503 / exit 2 naming the file, until it is restored; no ``Retry-After`` (trying again cannot help)."""

    retry_after = None


def unknown(t, table: str, noun: str, name: str) -> NotFoundError:
    """``unknown map 'minilm-e6' (did you mean 'minilm-e5'?)``: the names of ``table`` (read in transaction ``t``)
    are read for the suggestion here, on the error only."""
    known = [r["name"] for r in t.q(f"SELECT name FROM {table}")]
    return NotFoundError(f"unknown {noun} {name!r}{_errors.did_you_mean(name, known)}")
