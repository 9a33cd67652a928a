"""The error body every 4xx / 5xx answer carries, and the OpenAPI ``responses`` entries that document it; kept
apart from :mod:`.schemas` (which re-exports them)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

__all__ = ["ErrorBody", "ErrorDetail", "error_responses"]


class ErrorDetail(BaseModel):
    type: str = Field(..., description="Exception class, e.g. `DimensionMismatchError`.")
    status: int = Field(..., description="The HTTP status, repeated.")
    message: str = Field(..., description="What went wrong and how to fix it (no stack trace).")
    details: list[dict[str, Any]] | None = Field(None, description="Request validation only (type `InputError`, "
                                                 "whichever part validated it): one entry per problem (`loc`: "
                                                 "`[\"body\" | \"query\" | \"path\", field, ...]`, `msg`, `type`).")


class ErrorBody(BaseModel):
    """Every 4xx/5xx body: ``{"error": {"type", "status", "message"}}``."""

    error: ErrorDetail


_ERROR_TEXT = {
    401: "Missing or unknown API key (`WWW-Authenticate: Bearer`).",
    403: "The API key lacks the scope this route needs.",
    404: "Unknown space, map, version, alias, index, job or encoder.",
    409: "Conflict with what is stored (deleted version, taken name, idempotency key reused with another body).",
    412: "Precondition failed: `If-Match` / `If-None-Match: *` did not hold (alias or version moved); nothing changed.",
    413: "Body over this route's limit (its description says which) or more rows than `max_batch`.",
    415: "Unsupported `Content-Type`.",
    422: "Invalid input: shape, dimension, NaN/Inf, empty, bad name, failed request validation.",
    429: "Busy: the job queue is full, `max_heavy_requests` plans / evaluations run already, `compute_max_waiting` "
         "requests wait for the compute threads, or `lm_max_waiting` for the language model (`Retry-After`).",
    503: "Registry not ready.",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries documenting :class:`ErrorBody` for ``codes``.

    Listing 422 also replaces FastAPI's default ``HTTPValidationError`` entry (the service
    answers validation errors with an ErrorBody too).
    """
    return {c: {"model": ErrorBody, "description": _ERROR_TEXT[c]} for c in codes}
