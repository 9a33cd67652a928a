"""The supervisor of ``serve --workers N``: uvicorn's ``Multiprocess`` with its health checks and its stop changed.

uvicorn pings each worker in turn and waits up to ``timeout_worker_healthcheck`` for the answer, and it reads a
SIGTERM / SIGINT only between those checks. With ``worker_healthcheck_timeout_s`` at 60 s (a starting worker on a
busy host answers late), one silent worker (SIGSTOP, a frozen cgroup, a long call holding the GIL) held a SIGTERM
60 s, past an orchestrator's 30 s: a ``--workers 2`` stop took 60.1 s with a worker stopped (6.1 s at uvicorn's
5 s). Here:

- a check polls in short steps and gives up as soon as a stop is asked (SIGTERM or SIGINT queued, or
  ``should_exit``); other signals (SIGHUP, SIGTTIN...) wait for it, as before, so no answer is left unread;
- a worker gets the whole ``timeout_worker_healthcheck`` until it has answered that its server started (an INFO
  line "Child process [pid] is serving" says it has); after that each check waits ``min(timeout_worker_healthcheck,
  SERVING_CHECK_S)``: a serving worker's answer comes from a thread of its own within milliseconds, also on a loaded
  host, so a hung worker is replaced after 10 s, not 60 s;
- at the stop each worker is sent SIGTERM (graceful stop, up to ``shutdown_timeout_s``) and asked once more; one
  that neither answers nor ends within ``STOP_CHECK_S`` is killed (SIGKILL): a stopped worker does not act on a
  SIGTERM, and the supervisor waited for it for ever;
- a worker starts with SIGINT blocked until its server handles it (:class:`Worker`): a Ctrl-C while it was still
  importing wrote a plain-text KeyboardInterrupt traceback into the JSON log. Every path that starts one (the first
  start, a replacement, SIGHUP's restart, SIGTTIN's added worker) goes through :meth:`Supervisor.start_worker`:
  uvicorn's restart and SIGTTIN built its plain ``Process``, whose SIGINT was not blocked;
- SIGHUP's restart (as uvicorn's: each new worker serves before the old one is retired) reads every answer it asks
  for, gives up as soon as a stop is asked, and sees a new worker that ends while starting: uvicorn's left an unread
  answer per slow check in the pipe (a stopped worker's stale "yes" later spared it the stop's kill), and a SIGTERM
  during the restart waited for the new workers to start (up to ``timeout_worker_healthcheck`` each);
- its wait for an old worker's end gives up as soon as a stop is asked too (the stop then ends that worker with the
  others), and kills one still there ``RETIRE_MARGIN_S`` after ``shutdown_timeout_s``: uvicorn's waited with no limit,
  so a SIGTERM while an old worker finished its requests came 25 s late (50 s with both busy), and never with one
  stopped (SIGSTOP);
- its wait for the workers' end at the stop (uvicorn's ``join_all``) has the same bound: a worker still there
  ``RETIRE_MARGIN_S`` after ``shutdown_timeout_s`` (counted from its SIGTERM) is killed, with a WARNING line. uvicorn
  waited with no limit, so a worker that answered its last health check but never ended (its SIGTERM ignored, its
  stop hung) kept ``vecbridge serve`` from exiting.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import time
from multiprocessing import resource_tracker

from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors.multiprocess import Multiprocess, Process

__all__ = ["RETIRE_MARGIN_S", "SERVING_CHECK_S", "STOP_CHECK_S", "Supervisor", "Worker", "died"]

SERVING_CHECK_S = 10.0  # longest wait for a serving worker's answer (a starting one: timeout_worker_healthcheck)
STOP_CHECK_S = 2.0  # longest wait, at the stop, for a worker's last answer before it is killed
RETIRE_MARGIN_S = 5.0  # beyond shutdown_timeout_s: a worker still there after its SIGTERM (SIGHUP, stop) is killed
_STEP_S = 0.1  # a check looks for a stop this often
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_log = logging.getLogger("uvicorn.error")  # beside uvicorn's own supervisor lines


def died(pid: int, exitcode: int | None, hung: bool = False) -> str:
    """The supervisor's line for worker ``pid`` that ended with ``exitcode`` (multiprocessing's: ``-N`` for signal
    N), ``hung``: killed by the supervisor for not answering its health check. As gunicorn, a SIGKILL nobody here sent
    says it may have run out of memory."""
    if hung:
        why = "killed by the supervisor (no answer to its health check)"
    elif exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        why = f"killed by {name}" + (" (perhaps out of memory: see the kernel log, dmesg, or the container's OOM "
                                     "events)" if -exitcode == signal.SIGKILL else "")
    else:
        why = f"exited with code {exitcode}"
    return f"Child process [{pid}] died: {why}; starting a new one"


class Worker(Process):
    """uvicorn's worker process, started with SIGINT blocked (the mask passes through fork and exec) until its server
    handles it (:func:`service.api.app.worker_app` unblocks it): a Ctrl-C while it imported the service (a second
    or more) raised KeyboardInterrupt there, a plain-text traceback amid the JSON log lines. Now it waits, and the
    supervisor's SIGTERM (its stop) ends the worker quietly, or its server stops gracefully once loaded."""

    def start(self) -> None:
        if not hasattr(signal, "pthread_sigmask"):  # Windows
            super().start()
            return
        resource_tracker.ensure_running()  # its first start unblocks SIGINT (and SIGTERM) once it has started
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            super().start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # a Ctrl-C meanwhile reaches the supervisor now


class Supervisor(Multiprocess):
    """uvicorn's supervisor whose health checks never hold a stop (module doc), and which closes its copy of the
    listening socket before it signals the workers to stop (so a new connection is refused at once)."""

    def __init__(self, config, sockets) -> None:
        super().__init__(config, sockets)
        self._serving: set[Process] = set()  # answered once that their server started
        self._owed: set[Process] = set()  # sent a ping whose answer was not read (a check cut short by a stop)
        self._stop_sent = 0.0  # time.monotonic() of the stop's SIGTERMs (terminate_all), join_all's deadline's start

    def _stopping(self) -> bool:
        return self.should_exit.is_set() or any(sig in self.signal_queue for sig in _STOP_SIGNALS)

    def _ask(self, process: Process, timeout: float) -> bool | None:
        """True: ``process`` answered within ``timeout`` s; False: it did not (it ended, or its pipe is broken); None:
        a stop was asked first (the answer, if one comes, is left in the pipe: the stop's own check reads it)."""
        conn = process.parent_conn
        deadline = time.monotonic() + timeout
        try:
            conn.send(b"ping")
            self._owed.add(process)
            while not conn.poll(max(0.0, min(_STEP_S, deadline - time.monotonic()))):
                if time.monotonic() >= deadline:
                    return False
                if self._stopping():
                    return None
                if not process.process.is_alive() and not conn.poll():  # it ended without answering
                    return False
            started = conn.recv()
        except (OSError, EOFError, pickle.UnpicklingError):
            return False
        self._owed.discard(process)
        if started and process not in self._serving:
            self._serving.add(process)  # its checks wait SERVING_CHECK_S from now: say so (a test waits for it too)
            _log.info(f"Child process [{process.pid}] is serving")
        return True

    def start_worker(self) -> Worker:
        """A new worker, started: every path that starts one comes here (uvicorn's built its own ``Process``)."""
        process = Worker(self.config, self.sockets)
        process.start()
        return process

    def init_processes(self) -> None:
        self.processes.extend(self.start_worker() for _ in range(self.processes_num))

    def handle_ttin(self) -> None:  # as uvicorn 0.55's, the worker from start_worker
        _log.info("Received SIGTTIN, increasing the number of processes.")
        self.processes_num += 1
        self.processes.append(self.start_worker())

    def restart_all(self) -> None:
        """SIGHUP: as uvicorn 0.55's ``Multiprocess.restart_all`` (each worker's replacement serves before the old
        one is retired; one not started in time is killed and the restart ends), with :meth:`start_worker` and
        :meth:`_started`'s wait."""
        for idx, old in enumerate(self.processes):
            if self._stopping():
                return
            new = self.start_worker()
            if not self._started(new):
                ended = new.exitcode is not None
                new.kill()
                new.join()
                if not self._stopping():
                    why = f"ended while starting (exit code {new.exitcode})" if ended else "was not ready in time"
                    _log.error(f"New child process [{new.pid}] {why}; keeping worker [{old.pid}] and aborting the "
                               "restart.")
                return
            self.processes[idx] = new
            if not self._retire(old):
                self.processes.append(old)  # a stop came first: terminate_all asks it once more, kills it if silent
                return

    def _retire(self, old: Process) -> bool:
        """SIGTERM to ``old`` (its open requests get up to ``shutdown_timeout_s``), then a wait for its end, in short
        joins; it is killed once ``RETIRE_MARGIN_S`` past that (a stopped worker never acts on the SIGTERM). False: a
        stop was asked first, ``old`` still there with its pipe open. uvicorn's ``terminate(); join()`` had no limit
        and read no stop: a SIGTERM during it waited for the old worker's requests, then for the next one's (50 s),
        and for ever for a stopped one."""
        if old.process.exitcode is None:  # one that ended (and was reaped by a start()) has no pid to signal
            with contextlib.suppress(ProcessLookupError):
                os.kill(old.pid, signal.SIGTERM)
        _log.info(f"Terminated child process [{old.pid}]")
        _log.info(f"Waiting for child process [{old.pid}]")
        limit = self._end_limit()
        deadline = time.monotonic() + limit
        while old.process.is_alive():
            if self._stopping():
                return False
            if time.monotonic() >= deadline:
                _log.warning(f"Child process [{old.pid}] did not end within {limit:g} s of its SIGTERM: killed")
                old.process.kill()
                deadline = float("inf")  # a killed process ends
            old.process.join(_STEP_S)
        old.parent_conn.close()
        old.child_conn.close()
        return True

    def _end_limit(self) -> float:
        """Seconds after its SIGTERM that a worker still there is killed: its graceful shutdown's limit
        (``shutdown_timeout_s``, which bounds its job threads too) and ``RETIRE_MARGIN_S`` for the rest of its end."""
        return (self.config.timeout_graceful_shutdown or 0.0) + RETIRE_MARGIN_S

    def _started(self, process: Process) -> bool:
        """Whether ``process`` answers that its server started within ``timeout_worker_healthcheck``; False as soon
        as it ends or a stop is asked. Each ping's answer is read before the next is sent (uvicorn's wait sent one a
        second, and left the answers it stopped waiting for in the pipe)."""
        deadline = time.monotonic() + self.config.timeout_worker_healthcheck
        while process not in self._serving:
            if self._stopping() or not self._ask(process, deadline - time.monotonic()):
                return False
            if process not in self._serving:
                time.sleep(_STEP_S)  # answered "not yet": its app is loading
        return True

    def keep_subprocess_alive(self) -> None:
        current = set(self.processes)
        self._serving &= current
        self._owed &= current
        for idx, process in enumerate(self.processes):
            if self._stopping():
                return  # the stop comes first; terminate_all asks each worker once more
            wait = self.config.timeout_worker_healthcheck
            if process in self._serving:
                wait = min(wait, SERVING_CHECK_S)
            hung = process.process.is_alive()
            if hung:
                answered = self._ask(process, wait)
                if answered is None:
                    return
                if answered:
                    continue
                # killed while it was asked (SIGKILL by the OOM killer): its signal is the cause, not the supervisor
                hung = process.process.is_alive()
            if hung:
                _log.warning(f"Child process [{process.pid}] did not answer its health check within {wait:g} s")
            # from here as uvicorn's Multiprocess.keep_subprocess_alive
            process.kill()
            process.join()
            if process.exitcode == STARTUP_FAILURE:  # the app, TLS or the socket is broken: every restart fails
                _log.error(f"Child process [{process.pid}] failed to start, stopping the parent process.")
                self.should_exit.set()
                return
            if self.should_exit.is_set():
                return
            # was INFO "Child process [pid] died" whatever ended it: a worker the kernel's OOM killer took was not told
            # from a clean exit, and a log alert on ERROR never fired
            _log.log(logging.WARNING if hung else logging.ERROR, died(process.pid, process.exitcode, hung))
            self.processes[idx] = self.start_worker()

    def terminate_all(self) -> None:
        for sock in self.sockets:
            sock.close()
        self._stop_sent = time.monotonic()
        deadline = time.monotonic() + min(STOP_CHECK_S, self.config.timeout_worker_healthcheck)
        waiting = []
        for process in self.processes:  # as uvicorn's Process.terminate, the pipe kept open for the last answer
            if not process.process.is_alive():
                continue
            try:
                if process not in self._owed:
                    process.parent_conn.send(b"ping")
                waiting.append(process)
            except OSError:  # its pipe is closed: the worker is ending
                pass
            os.kill(process.pid, signal.SIGTERM)  # graceful; a worker still importing ends at once
            _log.info(f"Terminated child process [{process.pid}]")
        while waiting:
            for process in list(waiting):
                try:
                    answered = process.parent_conn.poll()
                except OSError:
                    answered = True
                if answered or not process.process.is_alive():
                    waiting.remove(process)  # answered: stopping gracefully (up to shutdown_timeout_s)
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        for process in waiting:  # silent and still there: a stopped (SIGSTOP, frozen) worker never acts on SIGTERM
            _log.warning(f"Child process [{process.pid}] did not answer its last health check: killed")
            process.kill()
        for process in self.processes:
            process.parent_conn.close()
            process.child_conn.close()

    def join_all(self) -> None:
        """Wait for each worker's end until :meth:`_end_limit` after the stop's SIGTERM (:meth:`terminate_all`), then
        kill the ones still there, each with a WARNING line. uvicorn's ``join()`` of each had no limit."""
        limit = self._end_limit()
        deadline = (self._stop_sent or time.monotonic()) + limit
        for process in self.processes:
            _log.info(f"Waiting for child process [{process.pid}]")
            process.process.join(max(0.0, deadline - time.monotonic()))
            if process.process.exitcode is None:
                _log.warning(f"Child process [{process.pid}] did not end within {limit:g} s of its SIGTERM: killed")
                process.process.kill()
                process.process.join(STOP_CHECK_S)  # a killed process ends (one in uninterruptible sleep is left)
