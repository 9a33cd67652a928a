"""HTTP/1.1 on the wire, against a real ``vecbridge serve`` and raw sockets: how long an idle kept-alive connection
lasts, what a request whose body is encoded (``Content-Encoding``, ``Transfer-Encoding``) gets, how a body over the
limit sent chunked ends its connection, and the answer to a request the HTTP parser itself refuses."""

from __future__ import annotations

import socket
import sys
import time

import pytest
from _api_support import R
from _servers import env_for, free_port, seed_registry, start, stop

KEY = R["Authorization"].encode()


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wire")
    seed_registry(tmp / "data")
    p = free_port()
    proc = start([sys.executable, "-m", "service.cli", "serve"], env_for(tmp / "data", p), p, tmp / "server.log")
    try:
        yield p
    finally:
        stop(proc)


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=15)


def _answer(s: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (lower-case names) and body of the next answer on ``s`` (framed by Content-Length);
    ``(0, {}, b"")`` when the server closed the connection instead."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            return 0, {}, b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    n = int(headers.get("content-length", 0))
    while len(body) < n:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split(" ", 2)[1]), headers, body


def _get(path: str = "/healthz") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


def test_an_idle_kept_alive_connection_outlasts_a_proxys_idle_timeout(port, tmp_path):
    """uvicorn closed a connection idle for 5 s (its default ``timeout_keep_alive``): nginx or an ALB in front
    (60 s idle) reused it and got a reset, a sporadic 502 (nginx does not retry a POST). Now it stays open
    ``keep_alive_timeout_s`` (75 s), one process or ``--workers 2``."""
    seed_registry(tmp_path / "data")
    p2 = free_port()
    workers = start([sys.executable, "-m", "service.cli", "serve", "--workers", "2"], env_for(tmp_path / "data", p2),
                    p2, tmp_path / "server.log")
    try:
        conns = [_connect(p) for p in (port, p2)]
        for s in conns:
            s.sendall(_get())
            assert _answer(s)[0] == 200
        time.sleep(6.5)
        for s in conns:
            s.sendall(_get())
            assert _answer(s)[0] == 200, "the server closed the idle connection"
            s.close()
    finally:
        stop(workers)


def test_the_keep_alive_timeout_is_a_checked_setting():
    from pydantic import ValidationError

    from service.config import Settings

    assert Settings().keep_alive_timeout_s == 75
    for bad in (0, -1, 3601):
        with pytest.raises(ValidationError):
            Settings(keep_alive_timeout_s=bad)
