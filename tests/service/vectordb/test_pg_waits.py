"""How long a migration's PostgreSQL connections may wait: a checkpoint or pgvector host that accepts and never
answers, another session's lock, two runs creating the checkpoint table at once (real PostgreSQL:
``eval "$(bash .ci/start_postgres.sh)"``). A cancel sent to a cut-off server: test_pgvector_cancel.py."""

from __future__ import annotations

import socket
import threading
import uuid

import pytest
from _servers import free_port

from service.errors import exit_code, retry_after_of
from service.vectordb import PgCheckpoint, VectorDBUnavailableError

psycopg = pytest.importorskip("psycopg")


@pytest.mark.postgres
def test_runs_making_the_checkpoint_table_at_once_all_open_it(pg_url, run_threads):
    """``CREATE TABLE IF NOT EXISTS`` in two sessions at once raised UniqueViolation (``pg_type``) in one of them:
    a migration and its ``--status``, or two migrations started together on a new table, failed. Eight at once,
    five new tables: every one opens (the first error is raised), and the table is there once."""
    for _ in range(5):
        table, start = f"ck_{uuid.uuid4().hex[:10]}", threading.Barrier(8)

        def open_at_once(i, table=table, start=start):
            start.wait(30)
            return PgCheckpoint(pg_url, f"m{i}", table=table)

        opened = run_threads(open_at_once, 8)
        try:
            opened[0].save({"done": 1})
            assert opened[0].load() == {"done": 1}
        finally:
            for ck in opened:
                ck.close()


@pytest.mark.postgres
def test_a_checkpoint_connection_waits_for_a_lock_no_longer_than_the_registrys_statement_timeout(pg_url, monkeypatch):
    """A checkpoint's read or write behind another session's lock on its table waited as long as that lasted;
    its connections now carry the registry's ``statement_timeout`` (30 s) where the session has none of its own.
    Set after connecting: the options the connection was given (``PGOPTIONS``'s ``search_path``, a review's find:
    passed as a keyword, the limit replaced them and the checkpoint went to another schema) are kept."""
    ck = PgCheckpoint(pg_url, "a->b")
    try:
        assert ck.conn.execute("SHOW statement_timeout").fetchone()[0] == "30s"
        assert int(ck.conn.info.get_parameters()["connect_timeout"]) == 10
        ck.conn.execute("CREATE SCHEMA mig")
    finally:
        ck.close()
    own = PgCheckpoint(pg_url + "?options=-c%20statement_timeout%3D5s", "a->b")
    try:
        assert own.conn.execute("SHOW statement_timeout").fetchone()[0] == "5s"  # the URL's, left as given
    finally:
        own.close()
    monkeypatch.setenv("PGOPTIONS", "-c search_path=mig")
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "7")
    env = PgCheckpoint(pg_url, "a->b")
    try:
        env.save({"done": 2})
        assert env.conn.execute("SELECT to_regclass('mig.vecbridge_migrations') IS NOT NULL").fetchone()[0]
        assert env.conn.execute("SHOW statement_timeout").fetchone()[0] == "30s"
        assert env.conn.info.get_parameters()["connect_timeout"] == "7"  # PGCONNECT_TIMEOUT's, left to libpq
    finally:
        env.close()


def test_a_database_host_that_never_answers_is_an_error_after_the_connect_timeout(monkeypatch):
    """A checkpoint, its lock probe (``migrate --status``) and a pgvector store on a host that accepts and never
    answers (a partition) waited for the OS's TCP timeout (~2 min), each; now the registry's connect timeout."""
    from service.registry import postgres
    from service.vectordb import PgVectorStore

    monkeypatch.setattr(postgres, "PG_CONNECT_TIMEOUT_S", 1)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # accepted by the kernel, never answered
    url = f"postgresql://vb@127.0.0.1:{silent.getsockname()[1]}/vb"
    outcome: dict = {}

    def connect():
        for name, make in (("checkpoint", lambda: PgCheckpoint(url, "a->b")),
                           ("store", lambda: PgVectorStore(url))):
            try:
                make()
                outcome[name] = "connected"
            except Exception as exc:  # noqa: BLE001 - the outcome is checked below
                outcome[name] = exc
        probe = object.__new__(PgCheckpoint)  # a status read's probe, without the run's own connection
        probe.url, probe.table, probe.key, probe.statement_timeout_s = url, "vecbridge_migrations", "a->b", 30
        outcome["probe"] = probe.lock_held()

    th = threading.Thread(target=connect, daemon=True)
    th.start()
    th.join(30)
    silent.close()
    assert not th.is_alive(), f"still connecting after 30 s: {outcome}"
    assert isinstance(outcome["checkpoint"], VectorDBUnavailableError), outcome
    assert "cannot connect" in str(outcome["store"]), outcome
    assert outcome["probe"] is None, outcome  # cannot be told


@pytest.mark.postgres
def test_a_checkpoints_statement_timeout_is_the_one_it_is_given(pg_url):
    """The checkpoint's limit was the registry's default (30 s) whatever the operator set as
    ``registry_statement_timeout_s``; it is given as ``statement_timeout_s`` (0: no limit), still only where the
    session has none of its own."""
    for given, shown in ((2.5, "2500ms"), (0, "0")):
        ck = PgCheckpoint(pg_url, "a->b", statement_timeout_s=given)
        try:
            assert ck.conn.execute("SHOW statement_timeout").fetchone()[0] == shown
            with ck._connect() as probe:  # the lock probe's connection too
                assert probe.execute("SHOW statement_timeout").fetchone()[0] == shown
        finally:
            ck.close()
    own = PgCheckpoint(pg_url + "?options=-c%20statement_timeout%3D5s", "a->b", statement_timeout_s=2.5)
    try:
        assert own.conn.execute("SHOW statement_timeout").fetchone()[0] == "5s"
    finally:
        own.close()


def test_a_checkpoint_database_nobody_listens_on_is_a_vecbridge_error_naming_it_without_its_password():
    """A migration whose checkpoint database was down failed with psycopg's own OperationalError (exit 3, "internal
    error"; a job's 500). Now VectorDBUnavailableError: exit 75 and 503 with Retry-After (the rows so far are
    checkpointed), where it connects (user@host:port/dbname, never the password) and what to do; the lock probe
    cannot tell (None)."""
    url = f"postgresql://vb:s3cr3t@127.0.0.1:{free_port()}/vb"
    with pytest.raises(VectorDBUnavailableError) as err:
        PgCheckpoint(url, "a->b")
    message = str(err.value)
    assert f"migration checkpoint: cannot connect to vb@127.0.0.1:{url.rsplit(':', 1)[1]}" in message
    assert "s3cr3t" not in message and "run the migration again" in message, message
    assert exit_code(err.value) == 75 and retry_after_of(err.value) == 5
    probe = object.__new__(PgCheckpoint)
    probe.url, probe.table, probe.key, probe.statement_timeout_s = url, "vecbridge_migrations", "a->b", 30
    assert probe.lock_held() is None


@pytest.mark.parametrize("given", [-1, float("nan"), float("inf"), 3e6, "30", True])
def test_a_checkpoint_statement_timeout_postgresql_cannot_take_is_refused_before_connecting(given, tmp_path):
    """``statement_timeout_s=-1`` (or nan, inf, more than PostgreSQL's 2^31-1 ms) went on to connect and fail there
    (a SET error, a connection left open, or here the unreachable database's error): an InputError naming the range,
    before connecting (nothing listens on this port). ``"30"`` was a TypeError (the registry's too), ``True`` a 1 s
    limit: checked as every number is (:func:`align.options.check_number`), by the registry as well."""
    from align.exceptions import InputError
    from service.registry import open_registry

    url = f"postgresql://vb@127.0.0.1:{free_port()}/vb"
    with pytest.raises(InputError, match="statement_timeout_s must be 0"):
        PgCheckpoint(url, "a->b", statement_timeout_s=given)
    with pytest.raises(InputError, match="statement_timeout_s must be 0"):
        open_registry(url, tmp_path / "a", statement_timeout_s=given)


@pytest.mark.postgres
def test_a_lock_probe_whose_session_ends_mid_probe_cannot_tell(pg_url, monkeypatch):
    """The probe caught only VectorDBError (a connect failure): a session terminated while it asked (an admin's
    pg_terminate_backend, a server restart) raised psycopg's OperationalError out of a status read. None: cannot
    be told. The probe's session here ends itself: its search_path finds a ``hashtext`` that terminates it."""
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute("CREATE SCHEMA ends")
        c.execute("CREATE FUNCTION ends.hashtext(text) RETURNS int LANGUAGE sql AS "
                  "'SELECT pg_terminate_backend(pg_backend_pid())::int'")
    ck = PgCheckpoint(pg_url, "a->b")
    try:
        assert ck.lock_held() is False
        monkeypatch.setenv("PGOPTIONS", "-c search_path=ends,pg_catalog")  # the probe's session only: made after
        assert ck.lock_held() is None
        monkeypatch.delenv("PGOPTIONS")
        assert ck.lock_held() is False
    finally:
        ck.close()
