"""A PostgreSQL registry as an operator runs it: several processes on one database, beside ``pg_dump`` and psql
sessions. Opening the registry must not lock its tables, a statement stuck behind another session's lock must end,
and a process must keep a bounded number of connections however many threads it runs."""

from __future__ import annotations

import threading
import time
from urllib.parse import urlsplit

import numpy as np
import pytest

import align
from service.registry import open_registry

pytestmark = pytest.mark.postgres
psycopg = pytest.importorskip("psycopg")


def _world(url: str, tmp_path):
    reg = open_registry(url, tmp_path / "artifacts")
    X = np.random.default_rng(0).standard_normal((40, 4)).astype(np.float32)
    reg.register_version("m", align.fit_procrustes(X, X), source_space="s", target_space="t", method="procrustes",
                         params={})
    return reg


def _in_thread(fn) -> tuple[threading.Thread, list]:
    out: list = []
    th = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    th.start()
    return th, out


def test_opening_the_registry_during_a_dump_neither_waits_nor_stalls_the_other_replicas(pg_url, tmp_path):
    # every open ran ALTER TABLE versions ADD COLUMN IF NOT EXISTS, which takes ACCESS EXCLUSIVE even when the
    # column exists: a replica, a worker or any CLI command started while pg_dump held its lock waited for the
    # whole dump, and its queued lock stopped every other replica's reads of versions meanwhile
    reg = _world(pg_url, tmp_path)
    dump = psycopg.connect(pg_url)  # what pg_dump does: one long transaction that has read the tables
    try:
        dump.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        dump.execute("SELECT count(*) FROM versions").fetchone()
        opener, opened = _in_thread(lambda: open_registry(pg_url, tmp_path / "artifacts"))
        opener.join(10)
        reader, read = _in_thread(lambda: reg.resolve("m").version)
        reader.join(10)
        assert opened and read == [1], "opening the registry waited for the dump, or made a replica wait"
        opened[0].close()
    finally:
        dump.rollback()
        dump.close()
        reg.close()


def test_a_registry_of_a_release_without_the_newer_columns_gets_them_on_open(pg_url, tmp_path):
    _world(pg_url, tmp_path).close()
    with psycopg.connect(pg_url, autocommit=True) as c:  # the tables as the release before map_kind made them
        c.execute("ALTER TABLE versions DROP COLUMN map_kind, DROP COLUMN n_clusters")
    reg = open_registry(pg_url, tmp_path / "artifacts")
    try:
        v = reg.get_version("m", 1)
        assert (v.map_kind, v.n_clusters) == ("linear", 0)
        assert type(reg.load_map("m:1")).__name__ == "LinearMap"
    finally:
        reg.close()


def _connections(pg_url: str) -> int:
    """Client sessions on ``pg_url``'s database now, this one and the earlier ones of this function left out (a
    closed session's backend can still be listed for a moment: on a busy machine the watcher counted its own). The
    server's own backends are not clients: an autovacuum worker of the database after the tag writes is listed under
    its name (a peak of 4 beside a pool of 3, seen in CI and by a helper's full registry run)."""
    with psycopg.connect(pg_url, autocommit=True, application_name="vb-test-watch") as c:
        return c.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                         "AND application_name <> 'vb-test-watch' AND backend_type = 'client backend'").fetchone()[0]


def _settled(pg_url: str, timeout: float = 10.0) -> int:
    """:func:`_connections` once it reaches 0 (or after ``timeout`` s): a closed session's backend can be listed a
    moment after the close; one that stays open is still counted and fails the caller."""
    deadline = time.monotonic() + timeout
    while (n := _connections(pg_url)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return n


def test_a_busy_process_keeps_at_most_pool_size_connections(pg_url, tmp_path):
    # one connection per thread, kept for the thread's life: 60 clients on 3 replicas x 2 workers held 130
    # sessions (PostgreSQL's default max_connections is 100) and never gave them back; with max_connections 20,
    # 1,286 of 1,800 requests were 503 "too many clients" that 6 connections would have served
    from concurrent.futures import ThreadPoolExecutor

    reg = _world(pg_url, tmp_path)
    reg.close()
    assert _settled(pg_url) == 0  # CI counted one of the closed sessions beside the pool's 3 (peak 4)
    reg = open_registry(pg_url, tmp_path / "artifacts", pool_size=3)
    peak, stop = [0], threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], _connections(pg_url))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()

    def work(i):
        for j in range(15):
            reg.set_tag("m", 1, f"k{i}", str(j)) if j % 3 == 0 else reg.resolve("m")
        return i

    try:
        with ThreadPoolExecutor(24) as ex:
            assert sorted(ex.map(work, range(24))) == list(range(24))
    finally:
        stop.set()
        watcher.join(10)
    assert 1 <= peak[0] <= 3, peak
    assert reg.get_version("m", 1).tags == {f"k{i}": "12" for i in range(24)}
    reg.close()
    assert _settled(pg_url) == 0  # close() ends them all, not only the calling thread's


def test_too_many_clients_names_the_pool_size(pg_url, tmp_path):
    import uuid

    from service.registry import RegistryUnavailableError

    role = f"vb_limited_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 1")
        c.execute(f"GRANT ALL ON SCHEMA public TO {role}")
    u = urlsplit(pg_url)
    url = u._replace(netloc=f"{role}@{u.hostname}:{u.port}").geturl()
    try:
        # the one connection the role may have, taken by someone else
        with psycopg.connect(url), pytest.raises(RegistryUnavailableError, match="VECBRIDGE_REGISTRY_POOL_SIZE"):
            open_registry(url, tmp_path / "artifacts")
    finally:
        with psycopg.connect(pg_url, autocommit=True) as c:
            c.execute(f"REVOKE ALL ON SCHEMA public FROM {role}")
            c.execute(f"DROP ROLE {role}")


@pytest.mark.parametrize(("query", "kw", "want", "pool_wait"), [
    ("", {}, "30s", 30.0), ("", {"statement_timeout_s": 0}, "0", None),
    ("", {"statement_timeout_s": 2.5}, "2500ms", 2.5), ("?options=-c%20statement_timeout%3D1500", {}, "1500ms", 30.0)])
def test_the_statement_timeout_comes_from_the_setting_or_the_url(pg_url, tmp_path, query, kw, want, pool_wait):
    """0 is no limit for the pool's wait too (it waited 30 s for a free connection)."""
    reg = open_registry(pg_url + query, tmp_path / "artifacts", **kw)
    try:
        with reg.db.tx() as t:
            assert t.one("SHOW statement_timeout")[0] == want
        assert reg.db._pool.wait_s == pool_wait
    finally:
        reg.close()


def test_a_statement_timeout_under_a_millisecond_is_not_no_limit():
    """0.0004 s was sent as statement_timeout=0 (PostgreSQL counts whole ms): no limit at all."""
    from service.registry.db import statement_timeout_ms

    assert [statement_timeout_ms(s) for s in (0, 0.0004, 0.001, 2.5)] == [0, 1, 1, 2500]


def test_a_url_that_cannot_be_parsed_or_a_lock_timeout_is_a_clear_error_without_the_password(pg_url, tmp_path,
                                                                                              capsys):
    """A bad %-escape in the URL was "internal error: ProgrammingError: invalid percent-encoded token:
    "p%zzSECRET1"" (exit 3, the password printed; `serve` logged it in a traceback); a URL's lock_timeout expiring
    was "internal error: LockNotAvailable" (exit 3) where a statement_timeout is "registry unavailable"."""
    from service.cli import main
    from service.registry.errors import InvalidNameError, RegistryUnavailableError

    bad = "postgresql://postgres:p%zzSECRET1@127.0.0.1:1/x"
    with pytest.raises(InvalidNameError, match="cannot be parsed") as err:
        open_registry(bad, tmp_path / "a")
    assert "SECRET1" not in str(err.value)
    for args in (["--registry-url", bad, "registry", "list"], ["--data-dir", str(tmp_path / "v"), "serve",
                                                               "--registry-url", bad, "--port", "1"]):
        assert main(args) == 2
        got = capsys.readouterr()
        assert "cannot be parsed" in got.err and "SECRET1" not in got.err + got.out, got
    reg = _world(pg_url + "?options=-c%20lock_timeout%3D300", tmp_path)
    try:
        with psycopg.connect(pg_url) as c:  # another session holds the table (a migration, say)
            c.execute("LOCK TABLE aliases IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(RegistryUnavailableError, match="retry"):
                reg.set_alias("m", "prod", 1)
            c.rollback()
        assert reg.set_alias("m", "prod", 1).version == 1  # nothing was half written
    finally:
        reg.close()


def test_the_operators_pgoptions_and_service_file_options_reach_the_registrys_sessions(pg_url, tmp_path, monkeypatch):
    """The registry sent its search_path and statement_timeout as libpq's ``options`` keyword, which replaces
    ``PGOPTIONS`` and a service file's options: an operator's ``-c lock_timeout=5s`` or ``application_name`` never
    reached the server. Now they go first, the registry's after them; a statement_timeout of theirs wins, as the
    URL's does."""
    def shown(url: str, *names: str) -> list:
        reg = open_registry(url, tmp_path / "artifacts")
        try:
            with reg.db.tx() as t:
                return [t.one(f"SHOW {name}")[0] for name in names]
        finally:
            reg.close()

    monkeypatch.setenv("PGOPTIONS", "-c lock_timeout=5s -c application_name=ops-app")
    assert shown(pg_url + "?schema=vbs", "lock_timeout", "application_name", "search_path", "statement_timeout") == [
        "5s", "ops-app", "vbs", "30s"]
    monkeypatch.setenv("PGOPTIONS", "-c statement_timeout=4s")
    assert shown(pg_url, "statement_timeout") == ["4s"]
    monkeypatch.delenv("PGOPTIONS")
    (tmp_path / "services.conf").write_text("[other]\noptions=-c lock_timeout=1s\n[vbops]\n# ours\n"
                                            "options=-c lock_timeout=7s -c application_name=svc-app\n")
    monkeypatch.setenv("PGSERVICEFILE", str(tmp_path / "services.conf"))
    assert shown(pg_url + "?service=vbops&schema=vbs", "lock_timeout", "application_name", "search_path") == [
        "7s", "svc-app", "vbs"]
    assert shown(pg_url + "?service=vbops&options=-c%20lock_timeout%3D9s", "lock_timeout", "application_name",
                 "statement_timeout") == ["9s", "", "30s"]  # the URL's options, as libpq reads them: not the file's


def test_the_operators_search_path_never_moves_the_registry_but_their_other_settings_count(pg_url, tmp_path,
                                                                                          monkeypatch):
    """With ``PGOPTIONS="-c search_path=ops"`` (or a service file's) and no ``?schema=``, the registry worked in
    ``ops``: one kept in ``public`` looked empty after an upgrade. Its schema comes from ``?schema=`` only; the
    operator's other settings still reach it, and a statement_timeout of theirs is found however it is written
    (``-cSTATEMENT_TIMEOUT=``, ``--statement-timeout=``), never in another setting's value. An empty or bad
    ``PGCONNECT_TIMEOUT`` is not taken for one given (libpq failed to parse it: the registry did not open)."""
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute("CREATE SCHEMA ops")
    _world(pg_url, tmp_path).close()  # a registry in public, as before the upgrade

    def shown(url: str, *names: str) -> list:
        reg = open_registry(url, tmp_path / "artifacts")
        try:
            assert [m["name"] for m in reg.list_maps()] == ["m"]  # the registry kept in public
            with reg.db.tx() as t:
                return [t.one(f"SHOW {name}")[0] for name in names]
        finally:
            reg.close()

    monkeypatch.setenv("PGOPTIONS", "-c search_path=ops -c lock_timeout=5s -c application_name=statement_timeout_x")
    assert shown(pg_url, "lock_timeout", "application_name", "statement_timeout") == [
        "5s", "statement_timeout_x", "30s"]
    monkeypatch.setenv("PGOPTIONS", "--search-path=ops -cSTATEMENT_TIMEOUT=4s")
    assert shown(pg_url, "statement_timeout") == ["4s"]
    monkeypatch.setenv("PGOPTIONS", "--statement-timeout=3s -c search_path=ops")
    assert shown(pg_url, "statement_timeout") == ["3s"]
    monkeypatch.setenv("PGOPTIONS", "-ec search_path=ops -eS 2MB -ecSTATEMENT_TIMEOUT=2s")  # bundled switches: were
    assert shown(pg_url, "statement_timeout", "datestyle", "work_mem") == ["2s", "ISO, DMY", "2MB"]  # not read
    monkeypatch.delenv("PGOPTIONS")
    (tmp_path / "services.conf").write_text("[vbops]\noptions=-c search_path=ops -c lock_timeout=7s\n")
    monkeypatch.setenv("PGSERVICEFILE", str(tmp_path / "services.conf"))
    assert shown(pg_url + "?service=vbops", "lock_timeout") == ["7s"]
    for bad in ("", "10s"):
        monkeypatch.setenv("PGCONNECT_TIMEOUT", bad)
        assert shown(pg_url, "statement_timeout") == ["30s"]


@pytest.mark.parametrize("refusal", ["client_encoding", "no_create"])
def test_a_connection_refused_after_it_connects_is_not_left_open(pg_url, tmp_path, refusal):
    """A session that connects and then fails: its first statement (the checkpoint's ``SHOW statement_timeout``,
    the registry's schema creation) cannot be sent (the role's ``client_encoding`` is one psycopg has no codec
    for), or its ``CREATE TABLE`` is refused (no CREATE on the schema: PostgreSQL 15's default for ``public``).
    The registry's pool and the checkpoint's table creation kept that connection: an idle session on the server
    for as long as the error was referenced (a job's record, a traceback). None is left in pg_stat_activity."""
    import uuid

    from service.vectordb.checkpoint import PgCheckpoint

    role = f"vb_refused_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute(f"CREATE ROLE {role} LOGIN")
        c.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")  # PostgreSQL before 15 granted it
        if refusal == "client_encoding":
            c.execute(f"ALTER ROLE {role} SET client_encoding = 'EUC_TW'")  # the server converts; psycopg cannot
    u = urlsplit(pg_url)
    url = u._replace(netloc=f"{role}@{u.hostname}:{u.port}").geturl()
    try:
        assert _settled(pg_url) == 0
        for opener in (lambda: PgCheckpoint(url, "a->b"), lambda: open_registry(url, tmp_path / "artifacts")):
            with pytest.raises(Exception) as err:  # psycopg's or the registry's: either is refused
                opener()
            assert "EUC_TW" in str(err.value) or "permission denied" in str(err.value), err.value
            assert _settled(pg_url) == 0, (opener, err.value)  # err still referenced: nothing closes it but us
    finally:
        with psycopg.connect(pg_url, autocommit=True) as c:
            c.execute(f"DROP ROLE {role}")


def test_an_artifact_folder_under_a_file_is_refused_with_no_connection_left_open(pg_url, tmp_path):
    """``open_registry(url, "/x/afile/artifacts")`` with ``afile`` a file: the database's pool was opened first and
    the store's bare ``NotADirectoryError`` left it open (a session on the server for as long as the error was
    referenced); the store is made first now, and says which part of its folder is a file."""
    from service.registry.errors import InvalidNameError

    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    assert _settled(pg_url) == 0
    for artifacts in (afile / "artifacts", afile):
        with pytest.raises(InvalidNameError, match="afile is a file, not a folder") as err:
            open_registry(pg_url, artifacts)
        assert _settled(pg_url) == 0, err.value  # err still referenced, as a job's record or a traceback keeps it
