"""Jobs: ``/v1/jobs`` lists, follows and cancels the background jobs (fits, steer fits, demo setup)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool

from ...jobs import TERMINAL
from ...ops import jobs as job_ops
from ..deps import ReadScope, StateDep, WriteScope
from ..pagination import Page, decode_cursor, paginate
from ..responses import FastJSONResponse
from ..schemas import JobList, JobOut, error_responses

router = APIRouter(prefix="/v1", tags=["fits and jobs"], responses=error_responses(401, 403, 404, 422, 429, 503))


_STATES = Literal["queued", "running", "succeeded", "failed", "cancelled"]
_Order = Annotated[Literal["oldest", "newest"], Query(description="`newest`: newest first.")]
_StateFilter = Annotated[list[_STATES] | None, Query(alias="state", max_length=5,
                                                     description="Only jobs in these states (repeatable).")]
_KindFilter = Annotated[list[Literal[job_ops.JOB_KINDS]] | None, Query(  # type: ignore[valid-type]
    max_length=16, description=f"Only jobs of these kinds ({', '.join(f'`{k}`' for k in job_ops.JOB_KINDS)}; "
                               f"repeatable).")]


@router.get("/jobs", dependencies=[ReadScope], summary="List jobs (every process of this data dir)",
            description="Oldest first, in the order the jobs were made (`seq`, not the clock; `order=newest`: "
                        "newest first). Without `limit`: the newest 1000 jobs in one page. With `limit`: pages (follow "
                        "`next`, under the same `order`) that walk every stored job; `counts` counts every stored job. "
                        "`state` / `kind` (each repeatable) keep only the jobs in those states / of those kinds: "
                        "`?state=queued&state=running&order=newest&limit=20` is what may still change.",
            response_model=JobList)
async def list_jobs(state: StateDep, page: Page, order: _Order = "oldest", job_state: _StateFilter = None,
                    kind: _KindFilter = None):
    newest = order == "newest"
    after = None if page.cursor is None else decode_cursor(page.cursor)  # its shape and order: job_ops.list_jobs
    states = None if job_state is None else tuple(dict.fromkeys(job_state))
    kinds = None if kind is None else tuple(dict.fromkeys(kind))
    # one row past the page tells paginate whether a next page exists
    jobs, counts = await run_in_threadpool(job_ops.list_jobs, state.jobs,
                                           None if page.limit is None else page.limit + 1, after,
                                           newest=newest, states=states, kinds=kinds)
    return FastJSONResponse({**paginate(jobs, lambda r: job_ops.cursor_key(r, newest), page, descending=newest),
                             "counts": counts})


@router.get("/jobs/{job_id}", dependencies=[ReadScope], summary="Job state, progress, timings, result",
            response_model=JobOut)
async def get_job(job_id: str, state: StateDep):
    # another process's job is read from the job store (which can wait for its lock): off the event loop
    return FastJSONResponse(await run_in_threadpool(job_ops.get_job, state.jobs, job_id))


@router.delete("/jobs/{job_id}", dependencies=[WriteScope], status_code=202, summary="Cancel a job",
               description="202: the running job stops at its next progress report (follow it with GET). 200: the "
                           "record is final: a queued job cancelled at once, or a job that had already ended (its "
                           "state is unchanged).",
               response_model=JobOut, responses={200: {"model": JobOut, "description": "The job's final record."}})
async def cancel_job(job_id: str, state: StateDep):
    record = await run_in_threadpool(job_ops.cancel_job, state.jobs, job_id)
    return FastJSONResponse(record, status_code=200 if record["state"] in TERMINAL else 202)
