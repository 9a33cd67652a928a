"""The tests' servers start on a port another process takes between :func:`free_port` (which finds it free) and the
server's bind: the start failed with EADDRINUSE ("[Errno 98]"), a failure of whatever test ran it. They try another
port now (tests/_servers.py), within ``VB_TEST_PORTS`` where that is set."""

from __future__ import annotations

import socket

import _servers
import httpx
from _servers import env_for, seed_registry, serve_command, serve_in_thread, start_on_free_port, stop


def _take(port: int, held: list) -> None:
    """Another process's listening socket on ``port`` (a server's bind there is refused, SO_REUSEADDR or not)."""
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    held.append(s)


def _racing(free_port, tried: list, held: list):
    """``free_port`` whose first port another process takes (:func:`_take`) before the server binds it; every port
    it gives is appended to ``tried``."""
    def racing_free_port() -> int:
        port = free_port()
        if not tried:
            _take(port, held)
        tried.append(port)
        return port
    return racing_free_port


def test_a_server_whose_port_is_taken_before_it_binds_starts_on_another(tmp_path):
    data = tmp_path / "data"
    seed_registry(data)
    tried, held = [], []

    def make(port: int):
        if not tried:
            _take(port, held)  # taken between the look and the bind
        tried.append(port)
        return serve_command(), env_for(data, port)

    try:
        proc, port = start_on_free_port(make, tmp_path / "server.log")
        try:
            assert len(tried) == 2 and port == tried[1] != tried[0], tried
            assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=30).status_code == 200
        finally:
            stop(proc)
    finally:
        for s in held:
            s.close()


def test_an_app_served_in_a_thread_whose_port_is_taken_starts_on_another(monkeypatch):
    from fastapi import FastAPI

    app = FastAPI()
    app.get("/ping")(lambda: {"ok": True})
    tried, held = [], []
    monkeypatch.setattr(_servers, "free_port", _racing(_servers.free_port, tried, held))
    try:
        with serve_in_thread(app) as url:
            assert len(tried) == 2 and url.endswith(f":{tried[1]}"), (tried, url)
            assert httpx.get(f"{url}/ping", timeout=30).json() == {"ok": True}
    finally:
        for s in held:
            s.close()


def test_a_reliability_server_whose_port_is_taken_before_it_binds_starts_on_another(tmp_path, monkeypatch):
    """The reliability tests' :class:`Server` (its own start, waiting for /readyz) tries another port too."""
    from reliability import helpers

    tried, held = [], []
    monkeypatch.setattr(helpers, "free_port", _racing(helpers.free_port, tried, held))
    server = helpers.Server(tmp_path / "data", log_path=tmp_path / "server.log")
    try:
        with server:
            assert len(tried) == 2 and server.port == tried[1] != tried[0], tried
            assert httpx.get(f"{server.url}/healthz", timeout=30).status_code == 200
    finally:
        for s in held:
            s.close()
