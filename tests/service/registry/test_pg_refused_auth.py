"""A PostgreSQL registry that asks for a password the URL lacks, or refuses the one given (QA, session 54).

libpq's "fe_sendauth: no password supplied" comes with no SQLSTATE: it was taken for a server that may come back (exit
75, "retry later", for ever under a scheduler), where a wrong password was exit 2. A stand-in server on localhost
speaks the protocol's first steps (no SSL, then a request for a password, then a refusal), so no server is needed.
"""

from __future__ import annotations

import socket
import struct
import threading

import pytest
from fastapi.testclient import TestClient

from _api_support import settings_for
from conftest import run_cli
from service.api import create_app

pytest.importorskip("psycopg")


def _handle(c: socket.socket, refuse: bool) -> None:
    with c:
        while True:
            head = c.recv(8)
            if len(head) < 8:
                return
            n, code = struct.unpack("!ii", head)
            if code in (80877103, 80877104):  # SSLRequest, GSSENCRequest: not here
                c.sendall(b"N")
                continue
            left = n - 8
            while left > 0:  # the startup packet
                left -= len(c.recv(left) or b"x" * left)
            break
        c.sendall(b"R" + struct.pack("!ii", 8, 3))  # AuthenticationCleartextPassword
        if refuse and c.recv(1024):  # the password message, then 28P01 as a server says it
            body = b"SFATAL\x00VFATAL\x00C28P01\x00Mpassword authentication failed for user \"vb\"\x00\x00"
            c.sendall(b"E" + struct.pack("!i", len(body) + 4) + body)
        c.recv(1024)


@pytest.fixture
def asking_server():
    """``start(refuse)`` -> the port of a server that asks each connection for a password (and, ``refuse``, refuses
    the one sent)."""
    servers = []

    def start(refuse: bool) -> int:
        srv = socket.create_server(("127.0.0.1", 0))
        servers.append(srv)

        def loop():
            while True:
                try:
                    c, _ = srv.accept()
                except OSError:
                    return
                threading.Thread(target=_handle, args=(c, refuse), daemon=True).start()

        threading.Thread(target=loop, daemon=True).start()
        return srv.getsockname()[1]

    yield start
    for srv in servers:
        srv.close()


@pytest.fixture(autouse=True)
def _no_password_files(monkeypatch, tmp_path):
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "no-pgpass"))


@pytest.mark.parametrize("password", ["", ":wrong"])
def test_a_url_without_a_password_is_exit_2_as_a_wrong_password(asking_server, tmp_path, capsys, password):
    port = asking_server(refuse=bool(password))
    url = f"postgresql://vb{password}@127.0.0.1:{port}/vb?sslmode=disable"
    code, _, err = run_cli(capsys, "--data-dir", tmp_path / "d", "--registry-url", url, "registry", "list")
    said = "password authentication failed" if password else "no password supplied"
    assert code == 2 and said in err, (code, err)
    assert "wrong" not in err  # the password itself is never shown


def test_readyz_of_a_replica_whose_password_is_refused_says_no_retry_helps(asking_server, tmp_path):
    """``serve`` with a wrong password stays "not ready" and keeps trying (fine), but said only "(retrying)", as for a
    server that is down; it names the refused password and says no retry can help."""
    port = asking_server(refuse=True)
    url = f"postgresql://vb:wrong@127.0.0.1:{port}/vb?sslmode=disable"
    with TestClient(create_app(settings_for(tmp_path, registry_url=url))) as c:
        r = c.get("/readyz")
        said = r.json()["checks"]["registry"]
        assert r.status_code == 503 and "password authentication failed" in said, said
        assert said.endswith("(retrying, though no retry can help: refused for good, until the registry URL or its "
                             "server is fixed)"), said
        assert "wrong" not in said and str(port) not in said
