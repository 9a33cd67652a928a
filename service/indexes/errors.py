"""Errors of the index store (both derive from the service's one error root)."""

from __future__ import annotations

from ..errors import ConflictError, NotFoundError, ServiceUnavailableError, did_you_mean

__all__ = ["IndexConflictError", "IndexNotFoundError", "NewerFormatError", "UnreadableGenerationError", "gone",
           "unreadable"]


class IndexNotFoundError(NotFoundError):
    """No index with that name."""


class IndexConflictError(ConflictError):
    """The index or one of the ids already exists."""


class UnreadableGenerationError(ServiceUnavailableError):
    """The newest generation of an index on disk cannot be read (a file cut short, a failing disk): a write
    waits for it to be readable (503); reads keep the generation in memory (:meth:`IndexStore.get`). No
    Retry-After and exit 2, not 75: a damaged file stays damaged until its operator restores or rewrites it."""

    retry_after = None


class NewerFormatError(ServiceUnavailableError):
    """An index on disk was written by a newer vecbridge (a ``format_version`` this one does not read): every
    request of it is a 503, also in a process that holds an older generation in memory, since serving that one
    would answer without the newer process's changes for as long as it runs (503 until every process of the
    data dir runs the newer release): no Retry-After, a retry cannot help."""

    retry_after = None


def gone(name: str, why: str = "dropped", *, known=(), listing: str = "GET /v1/indexes") -> IndexNotFoundError:
    """The 404 for index ``name``, saying why it is missing; ``known``: the names on disk, for a close one to be
    suggested; ``listing``: what lists the indexes in the face that asks (:class:`~service.indexes.IndexStore`'s
    ``listing``: the CLI's said ``GET /v1/indexes``)."""
    return IndexNotFoundError(f"index {name!r} not found ({why}){did_you_mean(name, known)}; {listing} lists the "
                              "existing ones")


def unreadable(name: str, why: str) -> IndexNotFoundError:
    """The 404 for index ``name`` whose files are there but cannot be loaded (it read "not found")."""
    return IndexNotFoundError(f"index {name!r} is there but could not be loaded ({why}): its files are damaged or "
                              "were written by a newer vecbridge; drop it and create it again, or restore them")
