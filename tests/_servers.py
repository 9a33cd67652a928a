"""Real servers for the tests (and the service benchmarks; no tests here): a free loopback port, waiting
for a server process to answer, stopping it, its resident memory, and an app served by uvicorn in a
thread of this process."""

from __future__ import annotations

import json
import os
import queue
import random
import resource
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from contextlib import closing, contextmanager, suppress
from pathlib import Path
from typing import Iterator

import httpx

ROOT = Path(__file__).resolve().parents[1]


class PortTaken(AssertionError):
    """A server could not bind its port (EADDRINUSE): another process took it between :func:`free_port` and the
    server's bind. :func:`start_on_free_port` and :func:`serve_in_thread` try another port on it."""


#: how many ports a server start tries before its EADDRINUSE is the test's failure
PORT_TRIES = 5


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now: one of ``VB_TEST_PORTS`` (``LOW-HIGH``, e.g.
    ``19700-19799``) where that is set (a run that must keep its servers on ports of its own), else the kernel's.
    Free when looked at, not held: a server started on it may find it taken (:class:`PortTaken`); start it with
    :func:`start_on_free_port`, which tries another one then."""
    spec = os.environ.get("VB_TEST_PORTS")
    if spec:
        low, high = (int(p) for p in spec.split("-"))
        ports = list(range(low, high + 1))
        random.shuffle(ports)  # two test processes seldom try the same one
        for port in ports:
            with socket.socket() as s, suppress(OSError):
                s.bind(("127.0.0.1", port))
                return port
        raise AssertionError(f"no free port in VB_TEST_PORTS={spec}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def on_a_free_port(attempt):
    """``attempt()``: a server's start on a :func:`free_port` it takes itself, :class:`PortTaken` where another process
    took that port before the server bound it; tried again (up to :data:`PORT_TRIES` in all) on that, its answer
    returned. The one retry of :func:`start_on_free_port`, :func:`serve_in_thread` and the reliability ``Server``."""
    for tries_left in range(PORT_TRIES - 1, -1, -1):
        try:
            return attempt()
        except PortTaken:
            if not tries_left:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def wait_ready(url: str, *, proc: subprocess.Popen | None = None, path: str = "/readyz", timeout: float = 60.0,
               log: Path | None = None) -> None:
    """Poll ``url + path`` until it answers 200; AssertionError (with the tail of ``log``) when ``proc`` exits
    first or ``timeout`` seconds pass."""

    def tail() -> str:
        try:
            return Path(log).read_text(errors="replace")[-2000:] if log else ""
        except OSError:
            return ""

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode} before answering {url}{path}: {tail()}")
        try:
            if httpx.get(url + path, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url}{path} did not answer 200 within {timeout}s: {tail()}")


def start_until(argv: list[str], marker: Path, timeout: float = 120.0) -> subprocess.Popen:
    """Start ``argv`` (stderr piped) and return it once it has made the file ``marker`` (a script that holds a lock
    or a file open says so by touching it); AssertionError with its stderr when it exits or ``timeout`` s pass
    first."""
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + timeout
    while not marker.exists():
        if proc.poll() is None and time.time() >= deadline:
            proc.kill()  # so its stderr ends and can be read
            proc.wait(timeout=30)
            raise AssertionError(f"{marker} not made within {timeout} s: {proc.stderr.read()}")
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    return proc


def read_line(proc: subprocess.Popen, timeout: float = 120.0, pipe=None) -> str:
    """One line from ``proc``'s stdout (or ``pipe``, e.g. ``proc.stderr``), "" at its end; AssertionError when no
    line comes within ``timeout`` s (``proc`` is killed first, so the reading thread ends with its pipe)."""
    pipe = proc.stdout if pipe is None else pipe
    got: queue.Queue = queue.Queue()

    def read() -> None:
        try:
            got.put(pipe.readline())
        except Exception as e:  # noqa: BLE001 - handed to the caller
            got.put(e)

    threading.Thread(target=read, daemon=True).start()
    try:
        line = got.get(timeout=timeout)
    except queue.Empty:
        proc.kill()
        proc.wait(timeout=30)
        raise AssertionError(f"pid {proc.pid} wrote no line within {timeout} s (killed)") from None
    if isinstance(line, Exception):
        raise line
    return line


def stop(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """SIGTERM ``proc``, wait up to ``timeout`` s for it to exit, else SIGKILL it (and reap it)."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def file_size_limit(n_bytes: int) -> Iterator[None]:
    """Lower this process's soft ``RLIMIT_FSIZE`` for the ``with`` body (a server started inside inherits it; Python
    ignores SIGXFSZ, so a write past the limit fails with EFBIG, as a write to a full disk fails with ENOSPC)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (n_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def children(pid: int) -> list[int]:
    """The process ids of ``pid``'s direct children (Linux /proc)."""
    return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]


def workers_of(pid: int) -> list[int]:
    """The worker processes the supervisor ``pid`` spawned (not multiprocessing's resource tracker, its child too);
    [] once it is gone (Linux /proc)."""
    out = []
    with suppress(OSError):  # ended meanwhile
        for c in children(pid):
            with suppress(OSError):
                if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes():
                    out.append(c)
    return out


def proc_state(pid: int) -> str:
    """The state letter of ``pid`` in /proc ("T": stopped, "Z": ended); "" once it is gone."""
    with suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    return ""


def unread_bytes(pid: int) -> int:
    """Bytes waiting, unread, in the receive queues of ``pid``'s Unix sockets (Linux: its /proc fds and the kernel's
    sock_diag, as ``ss -x`` reads them): a ``Pipe`` message sent to a stopped process that it has not read."""
    import struct

    mine = set()
    with suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with suppress(OSError):
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    mine.add(int(link[8:-1]))
    # nlmsghdr (SOCK_DIAG_BY_FAMILY, REQUEST | DUMP) + unix_diag_req (AF_UNIX, every state, UDIAG_SHOW_RQLEN)
    req = struct.pack("=BBHIIIII", socket.AF_UNIX, 0, 0, 0xFFFFFFFF, 0, 0x10, 0xFFFFFFFF, 0xFFFFFFFF)
    total = 0
    with closing(socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4)) as nl:  # NETLINK_SOCK_DIAG
        nl.sendto(struct.pack("=IHHII", 16 + len(req), 20, 0x301, 1, 0) + req, (0, 0))
        while True:
            data = nl.recv(1 << 20)
            at = 0
            while at < len(data):
                length, kind = struct.unpack_from("=IH", data, at)
                if kind in (2, 3):  # NLMSG_ERROR, NLMSG_DONE
                    return total
                ino = struct.unpack_from("=I", data, at + 20)[0]  # unix_diag_msg's udiag_ino
                attr = at + 16 + 16
                while attr + 4 <= at + length:
                    alen, atype = struct.unpack_from("=HH", data, attr)
                    if atype == 4 and ino in mine:  # UNIX_DIAG_RQLEN: (rqueue, wqueue)
                        total += struct.unpack_from("=I", data, attr + 4)[0]
                    attr += (alen + 3) & ~3
                at += (length + 3) & ~3


def alive(pid: int) -> bool:
    """Whether ``pid`` is still there and has not ended (a zombie has)."""
    return proc_state(pid) not in ("", "Z")


def serve_command(*args: str, own_group: bool = False, sighup_default: bool = False,
                  sigint_raises: bool = False) -> list[str]:
    """The command of a ``vecbridge serve *args`` process (the CLI run as ``python -m service.cli`` runs it), which
    first, where asked: ``own_group``: makes a process group of its own (a SIGKILL or a Ctrl-C sent to ``-pid``
    reaches its workers too, as a terminal's reaches a foreground job); ``sighup_default``: sets SIGHUP to its default
    action (a test run under ``nohup`` hands it down ignored); ``sigint_raises``: sets SIGINT to raise
    KeyboardInterrupt (a shell's background job starts with it ignored)."""
    import sys

    first = (["os.setpgid(0, 0)"] if own_group else []) + (
        ["signal.signal(signal.SIGHUP, signal.SIG_DFL)"] if sighup_default else []) + (
        ["signal.signal(signal.SIGINT, signal.default_int_handler)"] if sigint_raises else [])
    launch = "; ".join(["import os, runpy, signal", *first,
                        "runpy.run_module('service.cli', run_name='__main__', alter_sys=True)"])
    return [sys.executable, "-c", launch, "serve", *args]


def serve_workers(tmp: Path, *args: str, env: dict | None = None, ready: bool = True) -> tuple[subprocess.Popen, int]:
    """``serve --workers 2 *args`` (a real supervisor) on a data dir under ``tmp`` seeded by :func:`seed_registry`,
    with extra environment ``env`` and its log in ``tmp / "server.log"``: in a process group of its own (a SIGKILL to
    ``-proc.pid`` ends its workers too), SIGHUP at its default (not as ``nohup`` left it). Returns ``(proc, port)``
    once ``/healthz`` answers, or at once without ``ready``."""
    data = tmp / "data"
    seed_registry(data)
    cmd = serve_command("--workers", "2", *args, own_group=True, sighup_default=True)
    if ready:
        return start_on_free_port(lambda port: (cmd, {**env_for(data, port), **(env or {})}), tmp / "server.log")
    port = free_port()
    env = {**env_for(data, port), **(env or {})}
    with open(tmp / "server.log", "wb") as log:  # the server writes to its own copy
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), port


def rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` plus its direct children (e.g. uvicorn workers), KiB (Linux /proc)."""
    pids = [pid]
    try:
        pids += [int(p) for p in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                                                text=True).stdout.split()]
    except FileNotFoundError:  # pragma: no cover
        pass
    total = 0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def _run_quietly(srv) -> None:
    """``srv.run()``; a failed start's ``sys.exit`` (uvicorn's, e.g. on EADDRINUSE) just ends the thread."""
    with suppress(SystemExit):
        srv.run()


@contextmanager
def serve_in_thread(app) -> Iterator[str]:
    """Serve the ASGI ``app`` with uvicorn on a free loopback port in a daemon thread; yield its base URL.

    In process, so the test can reach into ``app.state`` (e.g. swap the LM provider) before serving.
    """
    import uvicorn

    def attempt():
        port = free_port()
        srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        th = threading.Thread(target=_run_quietly, args=(srv,), daemon=True)
        th.start()
        deadline = time.monotonic() + 60
        while not srv.started and th.is_alive() and time.monotonic() < deadline:
            th.join(0.05)
        if not srv.started and not th.is_alive():  # uvicorn's bind failed (EADDRINUSE: the port was taken meanwhile)
            raise PortTaken(f"in-process uvicorn did not start: port {port} was taken before it bound it?")
        return srv, th, port

    srv, th, port = on_a_free_port(attempt)
    assert srv.started, "in-process uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        th.join(30)


def tiny_lm_app(data_dir: Path, **settings):
    """The service app over ``data_dir`` (``settings``: more :class:`~service.config.Settings` fields) whose LM is the
    tiny random Llama of the LM tests."""
    from _tiny_lm import tiny_lm
    from service.api import create_app
    from _api_support import settings_for

    model, tok = tiny_lm()
    app = create_app(settings_for(data_dir, **settings))
    app.state.lm_provider = lambda: (model, tok)
    return app


def seed_registry(data_dir: Path):
    """Register spaces a, b and map a2b before the server starts (it reads the same SQLite file)."""
    from align import fit_procrustes
    from service.registry import open_registry
    from _api_support import planted

    data_dir.mkdir(parents=True, exist_ok=True)
    X, Y, _ = planted(300)
    reg = open_registry(f"sqlite:///{(data_dir / 'registry.sqlite').resolve()}", (data_dir / "artifacts").resolve())
    reg.register_space("a", 16)
    reg.register_space("b", 16)
    m = fit_procrustes(X, Y)
    reg.register_version("a2b", m, source_space="a", target_space="b", method="procrustes", params={})
    reg.close()
    return X, Y, m


def damage_page(db, name: str) -> None:
    """Overwrite the root page of table or index ``name`` of the SQLite file ``db`` with 0x41 bytes past its first 8
    (a bad disk block, a copy cut short): the file still opens, reads of that page fail."""
    import sqlite3

    with closing(sqlite3.connect(db)) as c:
        page = c.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (name,)).fetchone()[0]
        size = c.execute("PRAGMA page_size").fetchone()[0]
    with open(db, "r+b") as fh:
        fh.seek((page - 1) * size + 8)
        fh.write(b"A" * (size - 8))


@contextmanager
def scratch_dir(prefix: str, keep: bool = False) -> Iterator[Path]:
    """A fresh folder under the temporary directory for a benchmark's server data, removed afterwards (also on
    failure) unless ``keep``: then kept and its path printed (for debugging)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        if keep:
            print(f"data dir kept: {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)


def start(cmd: list[str], env: dict, port: int, log: Path) -> subprocess.Popen:
    """Run ``cmd`` (a server on ``port``) with its output in ``log``; return once ``/healthz`` answers 200.
    :class:`PortTaken` when it exits because ``port`` is taken (see :func:`start_on_free_port`)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc=proc, path="/healthz", timeout=60, log=log)
    except AssertionError as exc:
        stop(proc)
        if proc.returncode is not None and "[Errno 98]" in Path(log).read_text(errors="replace"):
            raise PortTaken(f"port {port} was taken before the server bound it: {exc}") from None
        raise
    return proc


def start_on_free_port(make, log: Path) -> tuple[subprocess.Popen, int]:
    """:func:`start` of the server ``make(port)`` (``(cmd, env)``) on a :func:`free_port`, and on another one (up to
    :data:`PORT_TRIES` in all) where another process took that port before the server bound it; ``(proc, port)``."""
    def attempt():
        port = free_port()
        cmd, env = make(port)
        return start(cmd, env, port, log), port

    return on_a_free_port(attempt)


def env_for(data_dir: Path, port: int) -> dict:
    """The environment of a server process on ``data_dir`` and ``port`` with the test keys (no demo)."""
    from _api_support import KEYS

    env = {k: v for k, v in os.environ.items() if not k.startswith("VECBRIDGE_")}
    env.update({"VECBRIDGE_DATA_DIR": str(data_dir), "VECBRIDGE_API_KEYS": json.dumps(KEYS),
                "VECBRIDGE_DEMO_ON_EMPTY": "false", "VECBRIDGE_PORT": str(port), "OMP_NUM_THREADS": "1",
                "VECBRIDGE_LOG_LEVEL": "INFO"})
    return env


@contextmanager
def seeded_uvicorn(tmp: Path, env: dict | None = None) -> Iterator[tuple[str, tuple]]:
    """A real ``uvicorn`` server process on a data dir under ``tmp`` seeded by :func:`seed_registry` (spaces a, b and
    map a2b), with extra environment ``env`` (e.g. tighter limits); yields ``(url, (X, Y, map))``."""
    import sys

    data = tmp / "data"
    seeded = seed_registry(data)

    def make(port: int) -> tuple[list[str], dict]:
        cmd = [sys.executable, "-m", "uvicorn", "--factory", "service.api:create_app", "--host", "127.0.0.1",
               "--port", str(port), "--no-access-log"]
        return cmd, {**env_for(data, port), **(env or {})}

    proc, port = start_on_free_port(make, tmp / "server.log")
    try:
        yield f"http://127.0.0.1:{port}", seeded
    finally:
        stop(proc)
