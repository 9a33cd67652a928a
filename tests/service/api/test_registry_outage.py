"""A PostgreSQL registry that is down when `vecbridge serve` starts, and comes back: the service stays up, says
why it is not ready, and recovers without a restart (an orchestrator starts the service and its database at once,
and a crash-looping service behind a rebooting database was never ready until its next restart)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest
from _api_support import R, W
from _servers import damage_page, env_for, free_port, seed_registry, start, start_on_free_port, stop
from conftest import logged

pytest.importorskip("psycopg")


class Forwarder:
    """A TCP port that refuses connections until :meth:`open`, then forwards them to ``target`` (host, port):
    the registry's database as the service sees it -- down, back, cut off (``held``) -- without touching the
    shared server."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target, self.port = target, free_port()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = None

    held = False  # True: bytes stop flowing both ways (a partition); they flow again, late, once False

    async def _pipe(self, reader, writer) -> None:
        with contextlib.suppress(Exception):
            while data := await reader.read(65536):
                while self.held:
                    await asyncio.sleep(0.05)
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _client(self, reader, writer) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    def open(self) -> None:
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._client, "127.0.0.1", self.port), self.loop).result(10)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        self.loop.call_soon_threadsafe(self.loop.stop)


def _readyz(url: str) -> httpx.Response:
    return httpx.get(f"{url}/readyz", timeout=30)


def test_a_registry_down_at_start_up_leaves_the_service_up_and_saying_why(tmp_path):
    # the lifespan raised: exit 3 with a traceback, no /healthz, and nothing recovered once the database was back
    db_port = free_port()  # nothing listens on db_port
    registry_url = f"postgresql://vb:pw-8c1e@127.0.0.1:{db_port}/vb"
    proc, port = start_on_free_port(lambda port: ([sys.executable, "-m", "service.cli", "serve"], {
        **env_for(tmp_path / "data", port), "VECBRIDGE_REGISTRY_URL": registry_url}), tmp_path / "server.log")
    url = f"http://127.0.0.1:{port}"
    try:
        r = _readyz(url)
        assert r.status_code == 503, r.text
        registry = r.json()["checks"]["registry"]
        assert "cannot connect" in registry and "retrying" in registry and "pw-8c1e" not in r.text
        # unauthenticated, it showed where the database is: 'connection to server at "127.0.0.1", port N failed'
        assert "server at ***" in registry and str(db_port) not in r.text and "127.0.0.1" not in r.text, registry
        maps = httpx.get(f"{url}/v1/maps", headers=R, timeout=30)
        assert maps.status_code == 503 and "readyz" in maps.json()["error"]["message"]
        assert httpx.get(f"{url}/healthz", timeout=30).status_code == 200
    finally:
        stop(proc, 30)  # SIGTERM; SIGKILL after 30 s
        assert proc.returncode == 0
    log = (tmp_path / "server.log").read_text()
    assert "registry unavailable, retrying" in log and "pw-8c1e" not in log
    assert f'server at \\"127.0.0.1\\", port {db_port}' in log  # the operator's log keeps where it is
    # each 503 while the registry is down was an ERROR "request failed" with a whole traceback: a flood, for an
    # expected state; now one WARNING line with the request id
    assert "Traceback" not in log
    lines = [json.loads(line) for line in log.splitlines()]
    assert [r["msg"] for r in lines if r.get("request_id") == maps.headers["x-request-id"]] == [
        "service unavailable", "request"]


def test_a_503_for_an_unreachable_registry_names_no_host_or_port_to_the_client(tmp_path):
    """A request's 503 quoted libpq's 'connection to server at "127.0.0.1", port N failed' to the client; it now
    says 'server at ***', and the log line of the request keeps the host and port."""
    from starlette.requests import Request

    from service.api.errors import error_response
    from service.registry import RegistryUnavailableError, open_registry

    db_port = free_port()  # nothing listens there
    with pytest.raises(RegistryUnavailableError) as err:
        open_registry(f"postgresql://vb@127.0.0.1:{db_port}/vb", tmp_path / "artifacts")
    assert f"port {db_port}" in str(err.value)  # what the driver says (and the log keeps)
    request = Request({"type": "http", "method": "GET", "path": "/v1/maps", "headers": [], "query_string": b"",
                       "state": {"request_id": "rid-1"}})
    with logged("vecbridge.errors") as records:
        r = error_response(request, err.value)
    body = json.loads(r.body)["error"]
    assert r.status_code == 503 and "connection to server at *** failed" in body["message"], body
    assert str(db_port) not in body["message"] and "127.0.0.1" not in body["message"]
    assert any(f"port {db_port}" in str(getattr(rec, "fields", "")) for rec in records), records


_ATTEMPTS = (  # psycopg 3's message when several hosts (or addresses) were tried
    "connection failed: connection to server at \"10.0.0.5\", port 6543 failed: timeout expired\nMultiple connection "
    "attempts failed. All failures were:\n- host: 'db.internal', port: '6543', hostaddr: '10.0.0.5': connection "
    "failed: timeout expired\n- host: \"o'db\", port: None, hostaddr: None: connection timeout expired")


@pytest.mark.parametrize("said, secret, kept", [
    ("failed to resolve host 'no-such-host.invalid': [Errno -2] Name or service not known", "no-such-host",
     "failed to resolve host ***: [Errno -2] Name or service not known"),
    (_ATTEMPTS, "db",
     "- host: ***: connection failed: timeout expired\n- host: ***: connection timeout expired"),
], ids=["resolve", "attempts"])
def test_psycopg_3s_own_words_for_the_host_are_hidden_from_the_client(said, secret, kept):
    """psycopg 3 names the host in words of its own (a name that does not resolve, each of several attempts): the
    503 and /readyz quoted them to any client. They show *** now, as libpq's do."""
    from service.urls import hide_endpoints

    shown = hide_endpoints(said)
    assert "***" in shown and secret not in shown and "10.0.0.5" not in shown and "6543" not in shown, shown
    assert shown.endswith(kept), shown  # the rest of the message stays


def test_a_damaged_sqlite_registry_is_a_503_naming_it_and_readiness_says_so(tmp_path):
    # a page of registry.sqlite overwritten (a bad disk block): /readyz said the registry was ok (its probe read the
    # spaces, which were intact) while every map request answered 500 "DatabaseError"; now each is a 503 naming the
    # file, and the probe (a first row and key of every table: cheap at any size) finds it
    data = tmp_path / "data"
    seed_registry(data)
    damage_page(data / "registry.sqlite", "sqlite_autoindex_versions_1")
    proc, port = start_on_free_port(lambda port: ([sys.executable, "-m", "service.cli", "serve"], env_for(data, port)),
                                    tmp_path / "server.log")
    url = f"http://127.0.0.1:{port}"
    try:
        r = _readyz(url)
        assert r.status_code == 503 and "registry.sqlite is damaged" in r.json()["checks"]["registry"], r.text
        for route in ("/v1/maps", "/v1/maps/a2b/versions"):
            r = httpx.get(f"{url}{route}", headers=R, timeout=30)
            assert r.status_code == 503, r.text
            message = r.json()["error"]["message"]
            assert f"{data / 'registry.sqlite'} is damaged" in message and "registry verify" in message, message
            assert "retry-after" not in r.headers, r.headers  # no retry mends a damaged file: clients raise at once
    finally:
        stop(proc, 30)  # SIGTERM; SIGKILL after 30 s


@pytest.mark.postgres
def test_readiness_recovers_when_the_registry_comes_back(tmp_path, pg_url):
    u = urlsplit(pg_url)
    db = Forwarder((u.hostname, u.port))
    registry_url = u._replace(netloc=f"{u.username}@127.0.0.1:{db.port}").geturl()
    proc, port = start_on_free_port(lambda port: ([sys.executable, "-m", "service.cli", "serve"], {
        **env_for(tmp_path / "data", port), "VECBRIDGE_REGISTRY_URL": registry_url}), tmp_path / "server.log")
    url = f"http://127.0.0.1:{port}"
    try:
        assert _readyz(url).status_code == 503
        db.open()
        deadline = time.monotonic() + 30
        while _readyz(url).status_code != 200:
            assert time.monotonic() < deadline, _readyz(url).text
            time.sleep(0.2)
        r = httpx.post(f"{url}/v1/spaces", headers=W, json={"name": "after", "dim": 8}, timeout=30)
        assert r.status_code == 201, r.text
        assert [s["name"] for s in httpx.get(f"{url}/v1/spaces", headers=R, timeout=30).json()["data"]] == ["after"]
    finally:
        stop(proc, 30)  # SIGTERM; SIGKILL after 30 s
        db.close()
    assert "registry connected" in (tmp_path / "server.log").read_text()


def test_a_registry_host_that_does_not_answer_is_unavailable_after_the_connect_timeout(monkeypatch):
    # a database host that accepts no answer (a partition, a stopped server behind a proxy) held the connection
    # for the OS's TCP timeout (~2 min): start-up hung, SIGTERM could not stop it, each /readyz held a thread
    import socket

    from service.registry import RegistryUnavailableError, postgres

    monkeypatch.setattr(postgres, "PG_CONNECT_TIMEOUT_S", 1)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # accepted by the kernel, never answered
    outcome = []

    def connect():
        try:
            postgres.PostgresDB(f"postgresql://vb@127.0.0.1:{silent.getsockname()[1]}/vb")
        except Exception as exc:  # noqa: BLE001 - the outcome is checked below
            outcome.append(exc)

    t0 = time.monotonic()
    th = threading.Thread(target=connect, daemon=True)
    th.start()
    th.join(15)
    silent.close()
    assert not th.is_alive(), "still connecting after 15 s"
    assert isinstance(outcome[0], RegistryUnavailableError) and time.monotonic() - t0 < 10, outcome


@pytest.mark.postgres
def test_readiness_answers_in_time_and_holds_one_thread_while_the_registry_does_not_answer(tmp_path, pg_url):
    # each /readyz ran the registry query in a thread of the shared pool and waited for it: with the database cut
    # off, every probe held one more thread (45 after 45 probes, the pool's 40 exhausted) and none answered
    u = urlsplit(pg_url)
    db = Forwarder((u.hostname, u.port))
    db.open()
    registry_url = u._replace(netloc=f"{u.username}@127.0.0.1:{db.port}").geturl()
    proc, port = start_on_free_port(lambda port: ([sys.executable, "-m", "service.cli", "serve"], {
        **env_for(tmp_path / "data", port), "VECBRIDGE_REGISTRY_URL": registry_url}), tmp_path / "server.log")
    url = f"http://127.0.0.1:{port}"
    threads = f"/proc/{proc.pid}/task"
    try:
        assert _readyz(url).status_code == 200
        before = len(os.listdir(threads))
        db.held = True
        for _ in range(8):
            t0 = time.monotonic()
            r = httpx.get(f"{url}/readyz", timeout=10)
            assert r.status_code == 503 and "no answer from the registry" in r.json()["checks"]["registry"], r.text
            assert time.monotonic() - t0 < 5
        assert len(os.listdir(threads)) <= before + 2
        db.held = False
        deadline = time.monotonic() + 30
        while _readyz(url).status_code != 200:
            assert time.monotonic() < deadline, _readyz(url).text
            time.sleep(0.2)
    finally:
        db.held = False
        stop(proc, 30)  # SIGTERM; SIGKILL after 30 s
        db.close()


@pytest.mark.postgres
def test_a_request_stuck_behind_another_sessions_lock_is_a_503_after_the_statement_timeout(tmp_path, pg_url):
    # a psql session holding a lock on versions (a migration, an open transaction) held every request that read
    # it, each in a thread of the pool, for as long as the lock lasted: no timeout, no answer, no log line
    import numpy as np
    import psycopg

    import align
    from service.registry import open_registry

    reg = open_registry(pg_url, tmp_path / "data" / "artifacts")
    X = np.random.default_rng(0).standard_normal((40, 4)).astype(np.float32)
    reg.register_version("m", align.fit_procrustes(X, X), source_space="s", target_space="t", method="procrustes",
                         params={})
    reg.close()
    proc, port = start_on_free_port(lambda port: ([sys.executable, "-m", "service.cli", "serve"], {
        **env_for(tmp_path / "data", port), "VECBRIDGE_REGISTRY_URL": pg_url,
        "VECBRIDGE_REGISTRY_STATEMENT_TIMEOUT_S": "3"}), tmp_path / "server.log")
    url = f"http://127.0.0.1:{port}"
    locker = psycopg.connect(pg_url)
    try:
        assert httpx.get(f"{url}/v1/maps/m/versions", headers=R, timeout=30).status_code == 200
        locker.execute("SET lock_timeout = '10s'")  # an error, not a hang, if another session holds versions
        locker.execute("LOCK TABLE versions IN ACCESS EXCLUSIVE MODE")
        t0 = time.monotonic()
        r = httpx.put(f"{url}/v1/maps/m/aliases/prod", headers=W, json={"version": 1}, timeout=30)
        assert r.status_code == 503 and time.monotonic() - t0 < 10, r.text
        assert "did not answer within 3 s" in r.json()["error"]["message"] and r.headers["retry-after"]
        # a small transform tries the shortcut first (service/api/fastpath.py), which handed any failure to the
        # route to answer -- and the route ran it again: 6 s, twice the timeout (20 s for a host that never answers)
        t0 = time.monotonic()
        r = httpx.post(f"{url}/v1/maps/m/transform", headers=R, json={"vectors": X[:2].tolist()}, timeout=30)
        assert r.status_code == 503 and "did not answer within 3 s" in r.text, r.text
        assert time.monotonic() - t0 < 5.9  # one statement timeout and a loaded machine's overhead; run twice: >= 6 s
        locker.rollback()
        r = httpx.put(f"{url}/v1/maps/m/aliases/prod", headers=W, json={"version": 1}, timeout=30)
        assert r.status_code == 200, r.text
    finally:
        locker.close()
        stop(proc, 30)  # SIGTERM; SIGKILL after 30 s
    assert "Traceback" not in (tmp_path / "server.log").read_text()


def test_rows_added_while_the_registry_does_not_answer_say_they_went_in_unchecked(tmp_path):
    # rows of an index's space need no registry, so POST /v1/indexes/{name}/vectors adds them when the registry is
    # down or damaged; but the rows check (do they look like another space's?) was skipped without a word: 90 rows
    # of another model could go in, answered 200 like any other. The answer's notes now say so, and the log
    from _api_support import planted

    from service.indexes import IndexStore

    data = tmp_path / "data"
    seed_registry(data)
    _, Y, _ = planted(300)
    IndexStore(data / "indexes").create("docs", "b", Y[:200], dim=16)
    damage_page(data / "registry.sqlite", "sqlite_autoindex_versions_1")  # its maps cannot be read: 503s
    proc, port = start_on_free_port(lambda port: ([sys.executable, "-m", "service.cli", "serve"], env_for(data, port)),
                                    tmp_path / "server.log")
    url = f"http://127.0.0.1:{port}"
    try:
        r = httpx.post(f"{url}/v1/indexes/docs/vectors", headers=W, json={"vectors": Y[200:210].tolist()}, timeout=30)
        assert r.status_code == 200 and r.json()["notes"] == [], r.text  # 10 rows are never checked
        r = httpx.post(f"{url}/v1/indexes/docs/vectors", headers=W, json={"vectors": Y[210:300].tolist()}, timeout=30)
        assert r.status_code == 200 and len(r.json()["ids"]) == 90 and r.json()["count"] == 300, r.text
        [note] = r.json()["notes"]
        assert note.startswith("the vectors are unchecked by rows: the registry did not answer (") and \
            "registry.sqlite is damaged" in note and "taken as 'b' rows" in note, note
        from service.client import Client

        with Client(url, "wkey-456", batch_size=100) as vb:  # batches of 100 and 40: the note is the first's
            got = vb.add("docs", Y[:140])
        assert len(got["ids"]) == 140 and got["notes"] and "the registry did not answer" in got["notes"][0], got
        for _ in range(3):  # searches of 50+ queries have no notes to answer: the log says it, once a minute
            r = httpx.post(f"{url}/v1/indexes/docs/search", headers=W, json={"vectors": Y[:60].tolist(), "k": 1},
                           timeout=30)
            assert r.status_code == 200, r.text
    finally:
        stop(proc, 30)  # SIGTERM; SIGKILL after 30 s
    lines = [json.loads(line) for line in (tmp_path / "server.log").read_text().splitlines()]
    [logged] = [x for x in lines if x["msg"] == "index add: rows check notes"]
    assert logged["level"] == "WARNING" and logged["index"] == "docs" and logged["notes"] == [note], logged
    [searched] = [x for x in lines if x["msg"] == "rows unchecked: registry unavailable"]
    assert searched["level"] == "WARNING" and searched["rows"] == 60, searched
