"""Who runs a migration: the process a checkpoint records as writing it, and whether that run is still there.

A run records ``holder`` in its checkpoint as it starts (:func:`this_process`): the pid, the host name and the
process's start time (Linux: ``/proc/<pid>/stat`` field 22, clock ticks since boot; None elsewhere). A run stopped
by a signal it handles, or failed, records ``stopped_at``; one killed without a word (``kill -9``, an OOM kill, a
host that lost power) records nothing, and its checkpoint said "running" for ever. :func:`holder_gone` tells, from
the lock the run holds (:meth:`~service.vectordb.checkpoint.FileCheckpoint.lock_held`): held, it runs (whatever
its pid namespace: a pid of another container of the pod, or of ``docker run --network host`` with the host's
name, means nothing here); free, on the holder's host, it is gone. Without a lock file to ask, on the holder's
host a pid with no process, or one whose start time is not the recorded one (the pid was reused), is gone. On
another host a free lock proves nothing (its file system may not share ``flock``): None.
"""

from __future__ import annotations

import os
import socket

__all__ = ["holder_gone", "this_process"]


def _stat(pid: int) -> tuple[str, int] | None:
    """``(state letter, start time in clock ticks since boot)`` of process ``pid`` (Linux ``/proc``); None when
    unknown or no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    try:  # the name (field 2) may hold spaces and parentheses: count fields after its last ')'
        fields = stat[stat.rindex(")") + 2:].split()
        return fields[0], int(fields[19])
    except (ValueError, IndexError):
        return None


def _started(pid: int) -> int | None:
    st = _stat(pid)
    return None if st is None else st[1]


def this_process() -> dict:
    """``{"pid", "host", "started"}`` of this process, as a checkpoint records its holder."""
    pid = os.getpid()
    return {"pid": pid, "host": socket.gethostname(), "started": _started(pid)}


def holder_gone(holder, lock_held: bool | None = None) -> bool | None:
    """True when the run ``holder`` (:func:`this_process` of the run) no longer runs, False when it does, None
    when it cannot be told (another host, or no holder recorded: a checkpoint of an older vecbridge).
    ``lock_held``: what a probe of the run's lock said (None: no lock file to ask), which alone judges it."""
    if lock_held:
        return False
    if not isinstance(holder, dict) or not isinstance(holder.get("pid"), int):
        return None
    if holder.get("host") != socket.gethostname():
        return None
    if lock_held is False:
        return True
    pid = holder["pid"]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process: there is one, though maybe not the holder
        pass
    except OSError:
        return None
    now = _stat(pid)
    if now is None:  # no /proc (not Linux): the pid answers, so it runs
        return False
    return now[0] in ("Z", "X") or (holder.get("started") is not None and now[1] != holder["started"])
