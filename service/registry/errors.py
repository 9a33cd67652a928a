"""Typed errors raised by :mod:`service.registry`.

::

    RegistryError                      base of every registry error
    ├── NotFoundError                  unknown map, version, alias or space   (HTTP 404)
    │   └── DeletedVersionError        the version (or the alias's target) was deleted
    ├── ConflictError                  the request contradicts stored state    (HTTP 409)
    ├── InvalidNameError (ValueError)  a name or reference that is not allowed (HTTP 422)
    └── IntegrityError                 an artifact is missing or its sha256 does not match
"""

from __future__ import annotations

__all__ = [
    "RegistryError",
    "NotFoundError",
    "DeletedVersionError",
    "ConflictError",
    "InvalidNameError",
    "IntegrityError",
]


class RegistryError(Exception):
    """Base class of registry errors."""


class NotFoundError(RegistryError, LookupError):
    """An unknown map, version, alias or space."""


class DeletedVersionError(NotFoundError):
    """The referenced version exists but was (soft-)deleted."""


class ConflictError(RegistryError):
    """The operation contradicts stored state (dims differ, alias on a deleted version, ...)."""


class InvalidNameError(RegistryError, ValueError):
    """A name, alias, tag key or reference that is not allowed."""


class IntegrityError(RegistryError):
    """A stored artifact is missing, unreadable, or does not match its recorded sha256."""
