"""The job workers: :class:`JobPool`, a ThreadPoolExecutor's ``submit`` / ``shutdown`` on daemon threads.

``concurrent.futures`` joins its pools' threads when the interpreter exits, whatever ``shutdown(wait=False)`` said:
a job whose work never sees its stop (a native call that reports no progress) kept a stopping server alive until it
ended, for as long as a fit takes, while its record already said "interrupted" (:meth:`JobManager.shutdown`).

At the interpreter's exit (an ``atexit`` handler: it runs before daemon threads are killed):

- a pool that was shut down gets a bounded grace, :data:`EXIT_GRACE` seconds in all: its running jobs were told to
  stop and normally reach their next progress report, or their end, well within it, so a fit inside its registration
  (artifact stored, row not yet committed) finishes it rather than leaving an orphan artifact and no version. A job
  thread still running after that dies with its process, as when the process is killed; the job store and the
  registry are built for that (their transactions roll back, the record says "interrupted");
- a pool never shut down (library use: a script that submits jobs and ends) runs its queued and running jobs to their
  end, as a ThreadPoolExecutor's exit does.
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

__all__ = ["EXIT_GRACE", "JobPool", "join_at_exit"]

#: seconds the interpreter's exit waits, in all, for the job threads of pools that were shut down (read at the exit)
EXIT_GRACE = 30.0
_POOLS: weakref.WeakSet = weakref.WeakSet()  # every JobPool, for the exit's join
_log = get_logger("jobs")


class JobPool:
    """At most ``workers`` daemon threads (started as work comes) running what :meth:`submit` queues, in order."""

    def __init__(self, workers: int, name: str = "vecbridge-job") -> None:
        self.workers, self.name = max(1, int(workers)), name
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


def join_at_exit() -> None:
    """At the interpreter's exit (or before an ``os._exit``, which skips ``atexit``): the pools never shut down run their work to its end, then the others' threads get
    :data:`EXIT_GRACE` seconds in all (see the module's docstring)."""
    pools = list(_POOLS)
    for pool in pools:
        if not pool._closed:
            pool._join_at_exit(0.0)  # never shut down: until its work is done (0.0 if it was shut down meanwhile)
    deadline = time.monotonic() + EXIT_GRACE
    left = [name for pool in pools for name in pool._join_at_exit(deadline)]
    if left:
        _log.warning("job threads still running at exit are killed with the process", extra={"fields": {
            "threads": left, "waited_seconds": EXIT_GRACE}})


atexit.register(join_at_exit)
