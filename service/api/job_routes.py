"""The shape every job-creating route shares: ``POST`` → 202 with the job (200 on an idempotent replay).

A job route is one plain function ``plan(body, request, state, settings) -> (job_fn, description)``
that parses and checks the request body (run off the event loop; a bad request is a 4xx before any
job exists) and returns the job function ``job_fn(ctx)`` and a one-line description. A full job queue, or the
caller's key's full share of it, is a 429 before that (:meth:`service.jobs.JobManager.check_room`): the body is
dropped unparsed, unless the request's ``Idempotency-Key`` names a job, which a retry still gets.
:func:`job_route` registers it: the route's declaration (scopes, status, response model,
documented answers, body schema and examples), the ``Idempotency-Key`` header, and the answer
(:func:`service.ops.jobs.submit`, within the caller's key's share of the queue: ``max_queued_jobs_per_key``; then
the job record with ``Location: /v1/jobs/{id}``, behind the proxy's prefix
when there is one: ``root_path``).
"""

from __future__ import annotations

from typing import Annotated, Callable

from fastapi import APIRouter, Header, Request
from starlette.concurrency import run_in_threadpool

from ..jobs import QueueFullError
from ..ops import jobs as job_ops
from .deps import JSONOnly, SettingsDep, StateDep, WriteScope, job_owner
from .errors import error_response
from .openapi import json_body
from .responses import FastJSONResponse
from .schemas import JobOut, error_responses

__all__ = ["job_route"]

# an empty key (``-H "Idempotency-Key: $KEY"`` with KEY unset) is a 422: as a key, it made every later job of the
# same body a replay of the first (nothing new ran) and every other body a 409, for every client sending it
#: the header of a job's answers (202 and an idempotent replay's 200), in the OpenAPI document
LOCATION = {"Location": {"description": "The job's URL (`/v1/jobs/{id}`, behind the proxy's prefix): follow it "
                                        "with GET.", "schema": {"type": "string"}}}
IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", min_length=1, max_length=200)]


def job_route(router: APIRouter, path: str, *, kind: str, summary: str, description: str, body_model, example: str):
    """Register ``plan`` as ``POST path`` queueing a job of ``kind`` (JSON body of ``body_model``; one of
    :data:`service.ops.jobs.JOB_KINDS`, which ``GET /v1/jobs?kind=`` takes)."""
    if kind not in job_ops.JOB_KINDS:
        raise ValueError(f"job kind {kind!r} is not in service.ops.jobs.JOB_KINDS")

    def register(plan: Callable):
        async def endpoint(request: Request, state: StateDep, settings: SettingsDep,
                           idempotency_key: IdempotencyKey = None):
            owner, owner_limit = job_owner(request.headers.get("authorization"), settings)  # its share of the queue
            try:  # a full queue (or share) refuses before the body is parsed: a fit's can be 55 MB of vectors
                await run_in_threadpool(state.jobs.check_room, idempotency_key, owner, owner_limit)
            except QueueFullError as exc:
                return await _refused(request, exc)
            body = await request.body()
            fn, what = await run_in_threadpool(plan, body, request, state, settings)
            # the durable insert can wait for the job store's lock: never on the event loop
            job, created = await run_in_threadpool(job_ops.submit, state.jobs, fn, kind=kind, description=what,
                                                   request=body, idempotency_key=idempotency_key, owner=owner,
                                                   owner_limit=owner_limit,
                                                   request_id=request.scope.get("state", {}).get("request_id"))
            root = request.scope.get("root_path", "").rstrip("/")  # the proxy's path prefix, if any
            # read under the lock the worker writes it under (it may have started it already): not a torn record
            record = await run_in_threadpool(state.jobs.records, [job])
            return FastJSONResponse(record[0], status_code=202 if created else 200,
                                    headers={"Location": f"{root}/v1/jobs/{job.id}"})

        endpoint.__name__ = endpoint.__qualname__ = plan.__name__  # the OpenAPI operationId
        router.post(path, dependencies=[WriteScope, JSONOnly], status_code=202, summary=summary,
                    description=description, response_model=JobOut, openapi_extra=json_body(body_model, example),
                    responses={202: {"headers": LOCATION},
                               200: {"model": JobOut, "headers": LOCATION,
                                     "description": "Idempotent replay: the job this key first created."},
                               **error_responses(409, 413, 415, 429)})(endpoint)
        return plan

    return register


async def _refused(request: Request, exc: QueueFullError):
    """The 429 of a job refused before its body was read. The body is read and dropped, chunk by chunk (never held
    nor parsed; its size and time limits apply), so that a client that sends it all before it reads (http.client,
    requests, httpx) reads this answer, not a reset, on a connection it keeps; one that waits for "100 Continue"
    before sending it is answered at once and the connection closed (its body never comes)."""
    answer = error_response(request, exc)
    if request.headers.get("expect", "").lower() == "100-continue":
        answer.headers["Connection"] = "close"
    else:
        async for _ in request.stream():
            pass
    return answer
