"""Riding out a short registry outage at the end of a long job (a PostgreSQL restart, a failover, a backup holding
the SQLite file).

A fit that took minutes failed with RegistryUnavailableError when the registry was unreachable for the few seconds its
registration took, and the fitted map was thrown away. :func:`until_registered` retries the registration while the
error is one a retry can help (:func:`service.errors.retry_after_of`: not a wrong password, a missing grant, a damaged
file), waiting :data:`REGISTER_WAITS` between tries (about 45 s in all), reporting the stage :data:`WAITING` meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from ..errors import retry_after_of
from ..logging import get_logger
from .errors import RegistryUnavailableError

__all__ = ["REGISTER_WAITS", "WAITING", "until_registered"]

T = TypeVar("T")

#: seconds waited before each retry of a registration the registry was unavailable for (45 s in all)
REGISTER_WAITS: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 15.0, 15.0)

#: the progress stage of a job waiting between tries
WAITING = "register: waiting for the registry"

#: longest sleep between two progress reports while waiting (a cancel is seen within it)
_SLICE_S = 0.5

_log = get_logger("registry")


def until_registered(register: Callable[[], T], progress: Callable[[str, float], None], *, what: str,
                     found: Callable[[], T | None] | None = None,
                     waits: tuple[float, ...] | None = None) -> T:
    """``register()``, tried again after each of ``waits`` seconds while it raises a RegistryUnavailableError a retry
    can help; the last error is raised once they are spent. Between tries ``progress(WAITING, fraction of the wait
    spent)`` (which may raise Cancelled) and a warning naming ``what``. ``found()``, asked before each retry, returns
    what an earlier try registered after all (its commit went through, the answer was lost), else None: that is
    returned instead of registering twice. ``waits`` None: :data:`REGISTER_WAITS` as it is now."""
    waits = REGISTER_WAITS if waits is None else waits
    total = sum(waits) or 1.0
    spent = 0.0
    for attempt, wait in enumerate((*waits, None), start=1):
        try:
            if attempt > 1 and found is not None and (done := found()) is not None:
                return done
            return register()
        except RegistryUnavailableError as exc:
            if wait is None or retry_after_of(exc) is None:
                raise
            _log.warning("registry unavailable: retrying the registration", extra={"fields": {
                "what": what, "attempt": attempt, "retry_in_s": wait, "error": str(exc)}})
            end = time.monotonic() + wait
            while (left := end - time.monotonic()) > 0:
                progress(WAITING, min(1.0, (spent + wait - left) / total))
                time.sleep(min(_SLICE_S, left))
            spent += wait
    raise AssertionError("unreachable")  # the last try returns or raises
