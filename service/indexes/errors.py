"""Errors of the index store (both derive from the service's one error root)."""

from __future__ import annotations

from ..errors import ConflictError, NotFoundError, ServiceUnavailableError

__all__ = ["IndexNotFoundError", "IndexConflictError", "UnreadableGenerationError", "gone"]


class IndexNotFoundError(NotFoundError):
    """No index with that name."""


class IndexConflictError(ConflictError):
    """The index or one of the ids already exists."""


class UnreadableGenerationError(ServiceUnavailableError):
    """The newest generation of an index on disk cannot be read (a file cut short, a failing disk): a write
    waits for it to be readable (503); reads keep the generation in memory (:meth:`IndexStore.get`)."""


def gone(name: str, why: str = "dropped") -> IndexNotFoundError:
    """The 404 for index ``name``, saying why it is missing."""
    return IndexNotFoundError(f"index {name!r} not found ({why}); GET /v1/indexes lists the existing ones")
