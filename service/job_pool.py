"""The job workers: :class:`JobPool`, a ThreadPoolExecutor's ``submit`` / ``shutdown`` on daemon threads.

``concurrent.futures`` joins its pools' threads when the interpreter exits, whatever ``shutdown(wait=False)`` said:
a job whose work never sees its stop (a native call that reports no progress) kept a stopping server alive until it
ended, for as long as a fit takes, while its record already said "interrupted" (:meth:`JobManager.shutdown`). A job
thread here dies with its process, as it does when the process is killed; the job store and the registry are built
for that (their transactions roll back, the next start reports the job interrupted).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future

__all__ = ["JobPool"]


class JobPool:
    """At most ``workers`` daemon threads (started as work comes) running what :meth:`submit` queues, in order."""

    def __init__(self, workers: int, name: str = "vecbridge-job") -> None:
        self.workers, self.name = max(1, int(workers)), name
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

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
