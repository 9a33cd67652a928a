"""One progress convention for the service: ``progress(stage, fraction)``.

``stage`` names the step in plain words (``"fit"``, ``"fit: icp"``, ``"encode source"``);
``fraction`` in [0, 1] is how far that step has got. Every long operation of the service takes a
:data:`Progress`: a job's :meth:`service.job_context.JobContext.progress` is one (it records the stage
and raises :class:`align.exceptions.Cancelled` when the job is cancelled), the CLI's progress bar
is one, and :meth:`align.MiniVec2Vec.fit` takes one (align's inner kernels report a bare
``progress(fraction)``, which MiniVec2Vec names by stage).

A vector-database migration is the one exception: its callback takes a per-batch record
(:class:`service.vectordb.MigrationProgress`: rows done of total, rate, last id) because its faces
draw a row counter and print resumable checkpoints; ``record.fraction`` is the same fraction.

:class:`Stages` runs the named stages of one operation: it reports ``(stage, 0.0)`` on entry and
``(stage, 1.0)`` on exit, times each stage, and checks ``should_cancel`` at every report.

Work that nobody may wait for any more (the HTTP face's text embeddings, plans and evaluations, and index writes
from texts while their texts are embedded, whose client can disconnect) runs under :func:`run_stoppable`:
:func:`checkpoint` then raises :class:`Abandoned` once its ``should_stop()`` says so. The encoders call it between
batches (:meth:`service.encoders.Encoder.encode`) and :func:`stoppable` makes a :data:`Progress` call it at every
report; elsewhere (the CLI, jobs, the library) no ``should_stop`` is set and it does nothing. A write, once begun,
runs :func:`unstoppable`: stopped halfway it would leave half a write.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

from align.exceptions import Cancelled

__all__ = ["Progress", "silent", "Stages", "Abandoned", "checkpoint", "run_stoppable", "stoppable", "unstoppable",
           "run_waking", "pause"]

#: ``progress(stage, fraction)``: ``stage`` a short name, ``fraction`` in [0, 1] of that stage.
Progress = Callable[[str, float], None]


def silent(stage: str, fraction: float) -> None:
    """The :data:`Progress` that reports nowhere."""


class Abandoned(Cancelled):
    """Work stopped at a :func:`checkpoint` because nobody waits for its answer any more (the HTTP client that asked
    for it disconnected: the HTTP face answers nothing, a 499 in its metrics)."""


#: the ``should_stop()`` of the work running in this context (:func:`run_stoppable`); None: it never stops
_should_stop: ContextVar[Callable[[], bool] | None] = ContextVar("vecbridge_should_stop", default=None)


def run_stoppable(should_stop: Callable[[], bool], fn: Callable):
    """``fn()``, during which :func:`checkpoint` raises :class:`Abandoned` once ``should_stop()`` is true
    (``should_stop`` is called from this thread: a ``threading.Event().is_set`` set by another one)."""
    token = _should_stop.set(should_stop)
    try:
        return fn()
    finally:
        _should_stop.reset(token)


def checkpoint() -> None:
    """A point where long work can stop: :class:`Abandoned` when it runs under :func:`run_stoppable` and was told to
    stop, else nothing (cheap: one context-variable read)."""
    should_stop = _should_stop.get()
    if should_stop is not None and should_stop():
        raise Abandoned("stopped: nobody waits for the answer any more")


#: the event a stop of the work running in this context sets (a job's cancel or shutdown: :func:`run_waking`)
_wake: ContextVar[threading.Event | None] = ContextVar("vecbridge_wake", default=None)


def run_waking(event: threading.Event, fn: Callable):
    """``fn()``, during which :func:`pause` returns as soon as ``event`` is set (the jobs set it on a cancel)."""
    token = _wake.set(event)
    try:
        return fn()
    finally:
        _wake.reset(token)


def pause(seconds: float) -> bool:
    """Sleep up to ``seconds``: True at once when the work running this was told to stop (:func:`run_waking`'s
    event, a job cancelled or shut down), else False once they have passed (outside :func:`run_waking`: a sleep)."""
    event = _wake.get()
    if event is None:
        time.sleep(max(0.0, seconds))
        return False
    return event.wait(max(0.0, seconds))


@contextmanager
def unstoppable() -> Iterator[None]:
    """The ``with`` body runs to its end even under :func:`run_stoppable`: a :func:`checkpoint` in it does nothing.
    For a write once begun (an index's rows going into FAISS and its log): it finishes, or fails and rolls back as
    any failure does, never stops halfway for a client that left."""
    token = _should_stop.set(None)
    try:
        yield
    finally:
        _should_stop.reset(token)


def stoppable(progress: Progress | None) -> Progress | None:
    """``progress``, calling :func:`checkpoint` first at each report when this work can be stopped
    (:func:`run_stoppable`); ``progress`` itself otherwise."""
    if _should_stop.get() is None:
        return progress
    inner = progress or silent

    def report(stage: str, fraction: float) -> None:
        checkpoint()
        inner(stage, fraction)

    return report


class Stages:
    """The stages of one operation: progress at entry and exit, a timer, cancellation checks.

    Parameters
    ----------
    progress : Progress, optional      where reports go
    should_cancel : callable() -> bool, optional   polled at every report; True raises Cancelled
    what : str                         names the operation in the Cancelled message

    ``timings`` maps each stage's timing key to its seconds (in the order the stages ran).

    >>> seen = []
    >>> st = Stages(lambda s, f: seen.append((s, f)))
    >>> with st.stage("fit"):
    ...     st.sub("fit")("restart 0", 0.5)
    >>> seen
    [('fit', 0.0), ('fit: restart 0', 0.5), ('fit', 1.0)]
    >>> list(st.timings)
    ['fit']
    """

    def __init__(self, progress: Progress | None = None, should_cancel: Callable[[], bool] | None = None,
                 what: str = "operation") -> None:
        self._progress = progress or silent
        self._should_cancel = should_cancel
        self._what = what
        self.timings: dict[str, float] = {}

    def tick(self, stage: str, fraction: float) -> None:
        """Report ``(stage, fraction)``; raise Cancelled first when a cancel was asked for."""
        if self._should_cancel is not None and self._should_cancel():
            raise Cancelled(f"{self._what} cancelled during {stage}")
        self._progress(stage, float(fraction))

    @contextmanager
    def stage(self, name: str, timing: str | None = None) -> Iterator[None]:
        """Run the ``with`` body as stage ``name``; its seconds go to ``timings[timing or name]``."""
        self.tick(name, 0.0)
        t0 = time.perf_counter()
        yield
        self.timings[timing or name] = time.perf_counter() - t0
        self.tick(name, 1.0)

    def sub(self, prefix: str) -> Progress:
        """A :data:`Progress` for an inner step whose stages read ``"<prefix>: <stage>"``."""
        return lambda stage, fraction: self.tick(f"{prefix}: {stage}", fraction)
