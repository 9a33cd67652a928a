"""Errors of the index store (both derive from the service's one error root)."""

from __future__ import annotations

from ..errors import ConflictError, NotFoundError

__all__ = ["IndexNotFoundError", "IndexConflictError", "gone"]


class IndexNotFoundError(NotFoundError):
    """No index with that name."""


class IndexConflictError(ConflictError):
    """The index or one of the ids already exists."""


def gone(name: str, why: str = "dropped") -> IndexNotFoundError:
    """The 404 for index ``name``, saying why it is missing."""
    return IndexNotFoundError(f"index {name!r} not found ({why}); GET /v1/indexes lists the existing ones")
