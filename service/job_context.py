"""What a job function is handed: :class:`JobContext`, its progress reports and cancellation checks (see
:mod:`service.jobs` for the jobs themselves)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from align.exceptions import Cancelled

from .job_store import TERMINAL, Job

__all__ = ["JobContext"]


class JobContext:
    """Handed to a job function: progress reporting and cancellation checks."""

    def __init__(self, job: Job, lock: threading.Lock, persist: Callable[[Job], None] | None = None,
                 interval: float = 0.5) -> None:
        self._job = job
        self._lock = lock
        self._stage_started = time.monotonic()
        self._persist = persist
        self._interval = interval
        self._persisted_at = 0.0
        #: set when the job is to stop (a cancel, a shutdown): :func:`service.progress.pause` wakes on it
        self.wake = threading.Event()

    @property
    def job_id(self) -> str:
        return self._job.id

    def should_cancel(self) -> bool:
        """Whether to stop now: a cancel was asked for, or a shutdown recorded the job interrupted (no cancel)."""
        return self._job.cancel_requested or self._job.state in TERMINAL

    def cancel_asked(self) -> bool:
        """:meth:`should_cancel` for a watcher polling beside work that reports no progress (an index build): it
        also picks up a cancel asked through another process, writing the record as :meth:`progress` does (at most
        every ``interval`` s); from any thread."""
        now = time.monotonic()
        if self._persist is not None and now - self._persisted_at >= self._interval:
            self._persisted_at = now
            self._persist(self._job)
        return self.should_cancel()

    def progress(self, stage: str, fraction: float | None = None) -> None:
        """Record ``stage`` and how far it has got, ``fraction`` in [0, 1] (of that stage, as every
        :data:`service.progress.Progress`); raise Cancelled when asked to stop."""
        with self._lock:
            if self._job.state in TERMINAL:  # recorded interrupted by a shutdown: that record stays
                raise Cancelled(f"job {self._job.id} interrupted during {self._job.stage}")
            now = time.monotonic()
            changed = stage != self._job.stage
            if changed:
                prev = self._job.stage
                self._job.stage_seconds[prev] = self._job.stage_seconds.get(prev, 0.0) + now - self._stage_started
                self._stage_started = now
                self._job.stage = stage
            if fraction is not None:
                self._job.fraction = min(1.0, max(0.0, float(fraction)))
            if changed:  # where this stage began: its ETA counts the fraction done since (Job._stage_clock)
                self._job.stage_from = self._job.fraction
        if self._persist is not None and (changed or now - self._persisted_at >= self._interval):
            self._persisted_at = now
            self._persist(self._job)  # also picks up a cancel asked through another process
        if self._job.cancel_requested:
            raise Cancelled(f"job {self._job.id} cancelled during {stage}")

    def _close_stage(self) -> None:
        """Add the current stage's seconds to the record; the caller holds the lock (it writes the job's end in the
        same hold: :meth:`service.jobs.JobManager._end`)."""
        st = self._job.stage
        self._job.stage_seconds[st] = self._job.stage_seconds.get(st, 0.0) + time.monotonic() - self._stage_started
