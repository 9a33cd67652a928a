"""The job workers: :class:`JobPool`, a ThreadPoolExecutor's ``submit`` / ``shutdown`` on daemon threads.

``concurrent.futures`` joins its pools' threads when the interpreter exits, whatever ``shutdown(wait=False)`` said:
a job whose work never sees its stop (a native call that reports no progress) kept a stopping server alive until it
ended, for as long as a fit takes, while its record already said "interrupted" (:meth:`JobManager.shutdown`).

At the interpreter's exit (an ``atexit`` handler: it runs before daemon threads are killed):

- a pool that was shut down gets a bounded grace: its running jobs were told to stop and normally reach their next
  progress report, or their end, well within it, so a fit inside its registration (artifact stored, row not yet
  committed) finishes it rather than leaving an orphan artifact and no version. The grace ends at the deadline the
  pool's server noted at its stop (:meth:`Stop.note`: ``shutdown_timeout_s`` after its first stop signal, now on a
  forced stop), else :data:`EXIT_GRACE` seconds after the exit began. A job thread still running after that dies
  with its process, as when the process is killed; the job store and the registry are built for that (their
  transactions roll back, the record says "interrupted");
- a pool never shut down (library use: a script that submits jobs and ends) runs its queued and running jobs to their
  end, as a ThreadPoolExecutor's exit does, as far as the interpreter lets them: a job that starts threads of its own
  through ``concurrent.futures`` then fails ("cannot schedule new futures after interpreter shutdown").

A server joins its stopped pools' threads itself too (:func:`join_stopped`, in its lifespan's shutdown), before the
same deadline: a ``serve --workers N`` worker ends by its stop signal's default action, which skips ``atexit``.

Each server (each app) has its own :class:`Stop`, handed to its pools: the deadline was one per process, the earliest
noted holding for good, so a second service in the process (a test run's, a program's) got the first one's deadline,
long past, and its job threads no grace; and one service's stop joined every stopped pool of the process.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future

from .logging import get_logger

__all__ = ["EXIT_GRACE", "JobPool", "Stop", "join_at_exit", "join_stopped"]

#: seconds the interpreter's exit waits, in all, for the job threads of pools that were shut down (read at the exit),
#: where no server's stop noted its deadline (:meth:`Stop.note`)
EXIT_GRACE = 30.0
_SLICE = 0.1  # seconds: how often a join re-reads the stop's deadline
_POOLS: weakref.WeakSet = weakref.WeakSet()  # every JobPool, for the exit's join
_log = get_logger("jobs")


class Stop:
    """One server's stop (one app's): the time (``time.monotonic()``) by which the threads of its pools that were
    shut down are waited for, once its first stop signal has noted it."""

    def __init__(self) -> None:
        self.deadline: float | None = None
        self.warned = False  # its threads left running were logged (once: the lifespan's join, then the exit's)
        self._lock = threading.Lock()

    def note(self, deadline: float) -> None:
        """The stop began: its pools' threads are waited for until ``deadline`` at most, by :func:`join_stopped` and
        at the exit. The earliest noted holds: a forced stop (a second Ctrl-C) notes ``now``, waiting for none."""
        with self._lock:
            self.deadline = deadline if self.deadline is None else min(deadline, self.deadline)


_LIBRARY = Stop()  # the stop of the pools no server made (library use, a script): never noted


class JobPool:
    """At most ``workers`` daemon threads (started as work comes) running what :meth:`submit` queues, in order;
    ``stop``: its server's (:class:`Stop`), none for library use."""

    def __init__(self, workers: int, name: str = "vecbridge-job", stop: Stop | None = None) -> None:
        self.workers, self.name = max(1, int(workers)), name
        self.stop = stop if stop is not None else _LIBRARY
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False
        _POOLS.add(self)

    def submit(self, fn: Callable, *args) -> Future:
        """Queue ``fn(*args)``; its future. RuntimeError after :meth:`shutdown` (as a ThreadPoolExecutor's)."""
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._work.put((future, fn, args))
            if len(self._threads) < self.workers:
                t = threading.Thread(target=self._serve, name=f"{self.name}_{len(self._threads)}", daemon=True)
                t.start()
                self._threads.append(t)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more work; ``cancel_futures``: cancel what has not started; ``wait``: join the threads once the work
        they have started is done."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        while cancel_futures:
            try:
                item = self._work.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in threads:
            self._work.put(None)  # one stop for each thread
        if wait:
            for t in threads:
                t.join()

    def _serve(self) -> None:
        while (item := self._work.get()) is not None:
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the future, as an executor does
                future.set_exception(exc)
            else:
                future.set_result(result)

    def _join_at_exit(self, deadline: float) -> list[str]:
        """Join the threads: those of a pool shut down until ``deadline`` (``time.monotonic()``); a pool never shut
        down is shut down behind its queued work and joined until that has run, whatever ``deadline``. The names of
        the threads still running."""
        with self._lock:
            open_, self._closed = not self._closed, True
            threads = list(self._threads)
        if open_:
            for _ in threads:
                self._work.put(None)  # behind the queued work, which runs first
        for t in threads:
            t.join(None if open_ else max(0.0, deadline - time.monotonic()))
        return [t.name for t in threads if t.is_alive()]


def join_stopped(stop: Stop) -> None:
    """Join the threads of ``stop``'s pools that were shut down until the deadline it noted; nothing to do where it
    noted none (no stop signal: a test's app, library use). Logs the threads still running then."""
    if stop.deadline is not None:  # a pool still open is not this stop's (nor joined: its work would run first)
        _join_stopped([pool for pool in list(_POOLS) if pool._closed and pool.stop is stop], stop, None)


def _join_stopped(pools: list[JobPool], stop: Stop, grace_end: float | None) -> None:
    """Join ``pools``' threads until ``stop``'s deadline, read again every :data:`_SLICE` s (a forced stop during
    the wait ends it), or until ``grace_end`` where it noted none."""
    began = time.monotonic()
    while True:
        deadline = stop.deadline if stop.deadline is not None else grace_end
        left = [name for pool in pools for name in pool._join_at_exit(min(deadline, time.monotonic() + _SLICE))]
        if not left or time.monotonic() >= deadline:
            break
    if left and not stop.warned:
        stop.warned = True
        _log.warning("job threads still running at exit are killed with the process", extra={"fields": {
            "threads": left, "waited_seconds": round(time.monotonic() - began, 3)}})


def join_at_exit() -> None:
    """At the interpreter's exit (or before an ``os._exit``, which skips ``atexit``): the pools never shut down run
    their work to its end, then the others' threads get until their stop's deadline (:meth:`Stop.note`), else
    :data:`EXIT_GRACE` seconds (see the module's docstring)."""
    pools = list(_POOLS)
    for pool in pools:
        if not pool._closed:
            pool._join_at_exit(0.0)  # never shut down: until its work is done (0.0 if it was shut down meanwhile)
    grace_end = time.monotonic() + EXIT_GRACE
    for stop in dict.fromkeys(pool.stop for pool in pools):  # one after the other: in all, until the latest
        _join_stopped([pool for pool in pools if pool.stop is stop], stop, grace_end)


atexit.register(join_at_exit)
