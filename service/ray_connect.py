"""Ray sessions for :mod:`service.distributed` (optional extra ``ray``): connecting, or starting a local Ray.

:func:`ray_session` connects to ``address`` (``"auto"``, ``"head:6379"``, ``"ray://head:10001"``) or starts a local
instance (``num_cpus``); a session already initialised by the caller is reused and left running. An address that
does not answer within ``connect_timeout`` seconds (a TCP connect, then the gRPC handshake and, under
``RAY_AUTH_MODE=token``, the token), or Ray not being installed, is a :class:`RayUnavailableError` (HTTP 503,
exit 2). A local Ray started here is watched by a small process that ends Ray's processes if this one dies
without shutting it down (``kill -9``). :func:`ray_log_level` sets how much a session started meanwhile logs.
Moved out of :mod:`service.distributed` (which re-exports every name) to give that module room.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
from pathlib import Path

from align.exceptions import InputError

from .errors import NotConfiguredError

__all__ = ["CONNECT_TIMEOUT_S", "RayUnavailableError", "ray_log_level", "ray_session"]

#: seconds a Ray address may take to answer before :func:`ray_session` gives up (``ray.init`` alone retries a
#: dead address ~20 times, ~40 s each)
CONNECT_TIMEOUT_S = 20.0


class RayUnavailableError(NotConfiguredError):
    """Ray is not installed here, or no Ray cluster answers at the address given: its operator acts (exit 2)."""


def _ray():
    try:
        import ray
    except ImportError:
        raise RayUnavailableError("Ray is not installed here: pip install 'vecbridge[ray]' (or run without --ray; "
                                  "in Python, the *_local functions)") from None
    return ray


def _probe(address: str, timeout: float) -> None:
    """Return once a gRPC server (a Ray GCS at ``HOST:PORT``, a Ray Client server at ``ray://HOST:PORT``) answers
    at ``address`` within ``timeout`` seconds; else RayUnavailableError (InputError: not such an address).

    ``ray.init`` has no bound of its own: it retries a dead address for many minutes. A TCP connect names
    a refused port or an unknown host at once; the gRPC handshake catches a port that is open but not Ray.
    """
    import socket

    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        raise InputError(f"a Ray address is HOST:PORT, ray://HOST:PORT or auto; got {address!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise RayUnavailableError(f"no Ray cluster at {address}: {exc or type(exc).__name__}") from None
    try:
        import grpc
    except ImportError:  # not part of a minimal `pip install ray`: the TCP check is what there is
        return
    channel = grpc.insecure_channel(target)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        if not address.startswith("ray://"):
            _check_token(grpc, channel, address, timeout)
    except grpc.FutureTimeoutError:
        raise RayUnavailableError(f"no Ray cluster at {address}: the port is open but did not answer as Ray "
                                  f"within {timeout:g} s") from None
    finally:
        channel.close()


_TOKEN_HELP = "the cluster's token in RAY_AUTH_TOKEN, a file named by RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token"


def _ray_token() -> str | None:
    """The token Ray's token authentication would send from this process (RAY_AUTH_TOKEN, the file
    RAY_AUTH_TOKEN_PATH names, or ~/.ray/auth_token), or None."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip()
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _check_token(grpc, channel, address: str, timeout: float) -> None:
    """RayUnavailableError naming what to set when the GCS at ``address`` refuses this process's credentials.

    One unary call (``GetClusterId``, what a driver asks first) with the token Ray would send. Without this, a
    cluster started with ``RAY_AUTH_MODE=token`` made ``ray.init`` print a warning a second for ~20 s and end with
    only "Failed to connect to Ray cluster". Any other answer (success, a Ray without that call) goes on to
    ``ray.init``.
    """
    token = _ray_token() if os.environ.get("RAY_AUTH_MODE", "").lower() == "token" else None
    call = channel.unary_unary("/ray.rpc.NodeInfoGcsService/GetClusterId", request_serializer=lambda b: b,
                               response_deserializer=lambda b: b)
    try:
        call(b"", timeout=timeout, metadata=[("authorization", f"Bearer {token}")] if token else None)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.UNAUTHENTICATED:
            return
        if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
            raise RayUnavailableError(f"the Ray cluster at {address} requires token authentication: set "
                                      f"RAY_AUTH_MODE=token, with {_TOKEN_HELP}") from None
        why = "refused the token given" if token else "requires a token and none is set"
        raise RayUnavailableError(f"the Ray cluster at {address} {why} (RAY_AUTH_MODE=token): give "
                                  f"{_TOKEN_HELP}") from None


# A watchdog for a local Ray this process starts: Ray's agents (DashboardAgent, RuntimeEnvAgent)
# outlive a driver killed with -9. The watchdog records the driver's descendants every 0.2 s, and at the
# end every process carrying the driver's VECBRIDGE_RAY_OWNER variable (started after the last look);
# when the driver is gone it terminates (then kills) every recorded process still running and
# their children, a few rounds (psutil's ``is_running`` compares start times: a reused pid is
# never hit).
_REAPER = """
import os, sys, time
import psutil
me, parent = os.getpid(), psutil.Process(int(sys.argv[1]))
known = {}
while True:
    try:
        if not parent.is_running() or parent.status() == psutil.STATUS_ZOMBIE:
            break
        for c in parent.children(recursive=True):
            if c.pid != me:
                known[c.pid] = c
    except psutil.Error:
        break
    time.sleep(0.2)
owner = str(parent.pid)
for p in psutil.process_iter():  # also those started after the last look and already re-parented:
    try:                          # every Ray process inherits the driver's VECBRIDGE_RAY_OWNER
        if p.pid != me and p.environ().get("VECBRIDGE_RAY_OWNER") == owner:
            known.setdefault(p.pid, p)
    except psutil.Error:
        pass
for _ in range(5):  # the orphans, and whatever they start meanwhile
    procs = []
    for p in list(known.values()):
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                procs.append(p)
                for c in p.children(recursive=True):
                    known.setdefault(c.pid, c)
                    procs.append(c)
        except psutil.Error:
            pass
    if not procs:
        break
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    for p in psutil.wait_procs(procs, timeout=3)[1]:
        try:
            p.kill()
        except psutil.Error:
            pass
"""


def _start_reaper():
    """Start the watchdog above for this process (None when psutil is missing: Ray then cleans up as before)."""
    import subprocess
    import sys

    try:
        import psutil  # noqa: F401
    except ImportError:  # pragma: no cover - psutil comes with the ray extra
        return None
    return subprocess.Popen([sys.executable, "-c", _REAPER, str(os.getpid())], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


_RAY_LOG_LEVEL: contextvars.ContextVar[int] = contextvars.ContextVar("ray_log_level", default=logging.INFO)


@contextlib.contextmanager
def ray_log_level(level: int):
    """Within the ``with`` body, a Ray session :func:`ray_session` starts logs to the console at ``level`` (its
    ``INFO`` lines, "Started a local Ray instance", and warnings, by default): ``logging.ERROR`` for a CLI command
    run with ``--quiet`` or ``--json``."""
    token = _RAY_LOG_LEVEL.set(level)
    try:
        yield
    finally:
        _RAY_LOG_LEVEL.reset(token)


@contextlib.contextmanager
def ray_session(address: str | None = None, *, num_cpus: int | None = None,
                connect_timeout: float = CONNECT_TIMEOUT_S):
    """Use the running Ray session, or connect to ``address`` (or ``RAY_ADDRESS``), or start a local one with
    ``num_cpus``; ``"auto"`` joins the cluster ``ray start`` started on this machine.

    A session this function started is shut down on exit; one found running is left alone. A
    local Ray started here is watched by a small process that ends Ray's processes if this one
    dies without shutting it down (``kill -9``). An address (or ``RAY_ADDRESS``) that does not
    answer within ``connect_timeout`` seconds, or a failed ``ray.init``, is a RayUnavailableError.
    """
    ray = _ray()
    if ray.is_initialized():
        yield ray
        return
    target = address or os.environ.get("RAY_ADDRESS")  # ray.init() without an address connects to RAY_ADDRESS
    target = None if target == "local" else target
    if target and target != "auto":
        _probe(target, connect_timeout)
    # no address: a new local Ray. ray.init() alone would join whatever cluster the machine's last `ray start`
    # recorded (/tmp/ray/ray_current_cluster), even one stopped since (minutes of retries) or another user's
    kw = {"address": target} if target else {"address": "local", "num_cpus": num_cpus}
    if not target:  # inherited by the raylet and its agents: the watchdog finds them even once re-parented
        os.environ["VECBRIDGE_RAY_OWNER"] = str(os.getpid())
    reaper = None if target else _start_reaper()
    try:
        try:
            ray.init(include_dashboard=False, log_to_driver=False, ignore_reinit_error=True,
                     logging_level=_RAY_LOG_LEVEL.get(), **kw)
        except (ConnectionError, TimeoutError, RuntimeError) as exc:  # "auto" with no cluster, a GCS gone meanwhile
            where = f"connect to Ray at {target}" if target else "start a local Ray"
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RayUnavailableError(f"could not {where}: {why}") from None
        try:
            yield ray
        finally:
            ray.shutdown()
    finally:
        if reaper is not None:
            reaper.terminate()
            reaper.wait(timeout=30)
