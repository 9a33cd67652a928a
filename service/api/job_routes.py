"""The shape every job-creating route shares: ``POST`` → 202 with the job (200 on an idempotent replay).

:func:`job_route` is the route decorator (scopes, status, response model, documented answers,
request-body schema and examples); :func:`accept` submits the job through
:func:`service.ops.jobs.submit` and renders the answer. A route then only parses its body and
builds the job function.
"""

from __future__ import annotations

from typing import Annotated, Callable

from fastapi import APIRouter, Header

from ..ops import jobs as job_ops
from .deps import JSONOnly, WriteScope
from .openapi import json_body
from .responses import FastJSONResponse
from .schemas import JobOut, error_responses

__all__ = ["job_route", "accept", "IdempotencyKey"]

IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", max_length=200)]


def job_route(router: APIRouter, path: str, *, summary: str, description: str, body_model, example: str):
    """``@router.post(path, ...)`` for a route that queues a job (JSON body of ``body_model``)."""
    return router.post(path, dependencies=[WriteScope, JSONOnly], status_code=202, summary=summary,
                       description=description, response_model=JobOut, openapi_extra=json_body(body_model, example),
                       responses={200: {"model": JobOut, "description": "Idempotent replay: the job this key first created."},
                                  **error_responses(409, 413, 415, 429)})


def accept(state, fn: Callable, *, kind: str, description: str, request: bytes,
           idempotency_key: str | None) -> FastJSONResponse:
    """Queue ``fn`` in ``state.jobs`` and answer 202 (200 for a replay) with ``Location: /v1/jobs/{id}``."""
    job, created = job_ops.submit(state.jobs, fn, kind=kind, description=description, request=request,
                                  idempotency_key=idempotency_key)
    return FastJSONResponse(job.to_dict(), status_code=202 if created else 200,
                            headers={"Location": f"/v1/jobs/{job.id}"})
