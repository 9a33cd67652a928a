"""Riding out a short registry outage at the end of a long job (a PostgreSQL restart, a failover, a backup holding
the SQLite file).

A fit that took minutes failed with RegistryUnavailableError when the registry was unreachable for the few seconds its
registration took, and the fitted map (or steer: both register through here) was thrown away.
:func:`until_registered` retries the registration while the error is one a retry can help
(:func:`service.errors.retry_after_of`: not a wrong password, a missing grant, a damaged file), waiting
:data:`REGISTER_WAITS` between tries, reporting the stage :data:`WAITING` meanwhile.

How long a fit may wait: the waits sum to 45 s, but each try (7) and the last look-up may first block for as long
as the registry takes to give up: SQLite's busy timeout (60 s by default), PostgreSQL's connect timeout (10 s, a
server that is down) or statement timeout (30 s, behind a lock). A registry that stays away holds a fit up to about
45 s + 8 of those: 8.75 min on a locked SQLite file, 2 min with PostgreSQL down, 4.75 min behind a PostgreSQL lock.

The answer of a try can be lost after its commit went through (the connection dropped between the commit and the
read-back). ``found()`` is asked before each retry and once more before the last error is raised; when it cannot
answer then either (the registry still away) and a try failed at or after its commit (not at connect or at the lock:
those never wrote), the registration may have happened: the error is marked (:func:`may_have_committed`) and a job
failed with it keeps its Idempotency-Key, since a resubmission could register the map twice. A cancel (or a
shutdown) during a wait is honoured only when ``found()`` does not find the version: a fit whose version was
committed succeeds with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import suppress
from typing import TypeVar

from align.exceptions import Cancelled

from ..errors import retry_after_of
from ..logging import get_logger
from ..progress import pause
from .errors import RegistryUnavailableError

__all__ = ["REGISTER_WAITS", "WAITING", "may_have_committed", "until_registered"]

T = TypeVar("T")

#: seconds waited before each retry of a registration the registry was unavailable for (45 s of sleep in all; each
#: try may also block for the registry's busy, connect or statement timeout: the module doc gives the whole bound)
REGISTER_WAITS: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 15.0, 15.0)

#: the progress stage of a job waiting between tries
WAITING = "register: waiting for the registry"

#: longest sleep between two progress reports while waiting (a cancel is seen within it)
_SLICE_S = 0.5

_log = get_logger("registry")


def _back(done: T, progress: Callable[[str, float], None], stage: str) -> T:
    """``done``, once ``progress`` reports ``stage`` again (done): a cancel it raises comes too late, the version is
    registered."""
    with suppress(Exception):  # a cancel or a shutdown after the commit: the fit has happened
        progress(stage, 1.0)
    return done


def may_have_committed(exc: BaseException) -> bool:
    """Whether ``exc``, raised by :func:`until_registered`, may have come after the registration was committed (no
    look-up could tell): submitting the same work again could register it twice."""
    return bool(getattr(exc, "vecbridge_maybe_committed", False))


def _look(found: Callable[[], T | None] | None) -> tuple[T | None, bool]:
    """(what ``found()`` returns, whether it could answer): an unavailable registry (or no ``found``) cannot."""
    if found is None:
        return None, False
    try:
        return found(), True
    except Exception:  # noqa: BLE001 - the registry still away (or worse): the caller's own error is the one to raise
        return None, False


def until_registered(register: Callable[[], T], progress: Callable[[str, float], None], *, what: str,
                     found: Callable[[], T | None] | None = None,
                     waits: tuple[float, ...] | None = None, stage: str = "register") -> T:
    """``register()``, tried again after each of ``waits`` seconds while it raises a RegistryUnavailableError a retry
    can help; the last error is raised once they are spent. Between tries ``progress(WAITING, fraction of the wait
    spent)`` (which may raise Cancelled) and a warning naming ``what``. ``found()``, asked before each retry and before
    the last error or a cancel is raised, returns what an earlier try registered after all (its commit went through,
    the answer was lost), else None: that is returned instead of registering twice or failing. The last error is
    marked :func:`may_have_committed` when ``found()`` could not answer and some try failed at or after its commit
    (the registration's own mark: a try refused at connect or at the lock never wrote). ``waits`` None:
    :data:`REGISTER_WAITS` as it is now.

    A sleep between tries wakes at once on the job's cancel (:func:`service.progress.pause`), and a cancel is looked
    for once more after it, before the next try (a try may block for a whole registry timeout): the Cancelled says
    what was not registered (or may have been: a try failed at or after its commit and ``found()`` cannot answer)
    and how long the registry was away. The seconds reported (that error, the last error
    after several tries, the log) run from the first try's start: the tries' own timeouts count. Once a try that
    followed a wait succeeds, the stage goes back to ``stage`` (it stayed "waiting" to the job's end)."""
    waits = REGISTER_WAITS if waits is None else waits
    total = sum(waits) or 1.0
    spent = 0.0
    maybe = False  # some try failed at or after its commit
    started = time.monotonic()  # the tries count too: a connect timeout is most of the wait (the sleeps were 0.0 s)
    for attempt, wait in enumerate((*waits, None), start=1):
        try:
            if attempt > 1 and found is not None and (done := found()) is not None:
                return _back(done, progress, stage)
            done = register()
            return done if attempt == 1 else _back(done, progress, stage)
        except RegistryUnavailableError as exc:
            maybe = maybe or may_have_committed(exc)
            waited = time.monotonic() - started
            if wait is None or retry_after_of(exc) is None:
                done, answered = _look(found)  # a commit may have gone through before the error: not a failure then
                if done is not None:
                    return _back(done, progress, stage)
                # the registry still away and a try reached its commit: it may have happened (a duplicate is worse);
                # found() answered "no", or no try wrote: it did not
                exc.vecbridge_maybe_committed = maybe and not answered
                if attempt > 1 and len(exc.args) == 1 and isinstance(exc.args[0], str):
                    exc.args = (f"{exc.args[0]} ({what} waited {waited:.1f} s for the registry, {attempt} tries)",)
                raise
            _log.warning("registry unavailable: retrying the registration", extra={"fields": {
                "what": what, "attempt": attempt, "retry_in_s": wait, "waited_s": round(waited, 3),
                "error": str(exc)}})
            end = time.monotonic() + wait
            try:
                while (left := end - time.monotonic()) > 0:
                    progress(WAITING, min(1.0, (spent + wait - left) / total))
                    if pause(min(_SLICE_S, left)):  # the job's cancel (or shutdown) wakes it at once
                        raise Cancelled("cancelled")
                progress(WAITING, min(1.0, (spent + wait) / total))  # a cancel in the last sleep: not after a try
            except Exception as stop:  # a cancel, a shutdown: not when the version was committed (the fit has happened)
                done, answered = _look(found)
                if done is not None:
                    return _back(done, progress, stage)
                if isinstance(stop, Cancelled):
                    away = (f"the registry unavailable for {time.monotonic() - started:.1f} s, {attempt} "
                            f"{'try' if attempt == 1 else 'tries'}: {exc}")
                    if maybe and not answered:  # a try reached its commit and the registry cannot say: it may exist
                        raise Cancelled(f"cancelled while waiting for the registry: {what} may have been registered "
                                        f"({away}); once the registry is back, look for it (GET /v1/maps/NAME/versions"
                                        " or /v1/steers/NAME/versions, `vecbridge registry list` or `steer list`) "
                                        "before fitting it again") from None
                    raise Cancelled(f"cancelled while waiting for the registry: {what} was not registered "
                                    f"({away})") from None
                raise
            spent += wait
    raise AssertionError("unreachable")  # the last try returns or raises
