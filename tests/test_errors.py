"""One error root: every exception class vecbridge defines derives from VecbridgeError and has a kind
that both faces' tables know."""

import importlib
import inspect
import pkgutil
import sqlite3

import pytest

import align
import service
from align.exceptions import KINDS, Cancelled, VecbridgeError
from service.errors import EXIT_CODE, HTTP_STATUS, exit_code, http_status, kind_of


def _modules():
    for pkg in (align, service):
        yield pkg
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if info.name.endswith("__main__") or ".ui." in info.name:
                continue
            try:
                yield importlib.import_module(info.name)
            except ImportError:  # an optional extra (ray, pymilvus, ...) absent here
                continue


def _defined_errors():
    seen = {}
    for mod in _modules():
        for _, obj in inspect.getmembers(mod, inspect.isclass):
            if issubclass(obj, Exception) and not issubclass(obj, Warning) and obj.__module__ == mod.__name__:
                seen[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return seen


def test_every_error_class_is_under_the_one_root_with_a_known_kind():
    errors = _defined_errors()
    assert len(errors) > 30, sorted(errors)  # the walk really found the tree
    outside = [n for n, c in errors.items() if not issubclass(c, VecbridgeError)]
    assert outside == []
    bad_kind = {n: c.kind for n, c in errors.items() if c.kind not in KINDS}
    assert bad_kind == {}


def test_both_tables_cover_every_kind():
    assert set(KINDS) <= set(HTTP_STATUS) and set(KINDS) <= set(EXIT_CODE)
    assert all(400 <= s < 600 for s in HTTP_STATUS.values())
    assert all(0 < c < 256 for c in EXIT_CODE.values())


def test_one_cancelled():
    names = [n for n, c in _defined_errors().items() if "ancel" in n.rsplit(".", 1)[-1]]
    assert all(issubclass(_defined_errors()[n], Cancelled) for n in names), names
    assert kind_of(Cancelled("x")) == "cancelled" and exit_code(Cancelled("x")) == 130


@pytest.mark.parametrize("exc, status, code", [
    (align.exceptions.NonFiniteError("nan"), 422, 2),
    (ValueError("a bug"), 500, 3),
    (OSError(5, "io"), 500, 2),
    (KeyboardInterrupt(), 409, 130),
    (sqlite3.OperationalError("database is locked"), 503, 75),
    (sqlite3.OperationalError("no such table: maps"), 500, 3),
])
def test_kind_lookup(exc, status, code):
    assert http_status(exc) == status and exit_code(exc) == code


def _retry_cases():
    from service.distributed import RayUnavailableError
    from service.errors import (
        BusyError,
        NotConfiguredError,
        RequestTimeoutError,
        ServiceStoppingError,
        ServiceUnavailableError,
    )
    from service.indexes.errors import NewerFormatError
    from service.job_store import JobStoreBusyError
    from service.registry import (
        IntegrityError,
        RegistryLockedError,
        RegistryUnavailableError,
    )
    from service.registry.errors import DamagedDatabaseError
    from service.vectordb.base import VectorDBError

    return [  # (error, exit code): 75 exactly where HTTP's answer says Retry-After
        (RegistryLockedError("the registry database stayed locked"), 75), (JobStoreBusyError("locked"), 75),
        (RegistryUnavailableError("cannot connect to PostgreSQL registry"), 75), (BusyError("queue full"), 75),
        (RequestTimeoutError("stalled"), 75), (ServiceUnavailableError("starting"), 75),
        (ServiceStoppingError("stopping"), 75), (RayUnavailableError("a Ray node was lost", retry_after=5), 75),
        (NotConfiguredError("no vector database configured"), 2), (DamagedDatabaseError("malformed"), 2),
        (NewerFormatError("format 9"), 2), (RayUnavailableError("Ray is not installed here"), 2),
        (VectorDBError("unknown vector-database URL"), 2), (IntegrityError("sha256 differs"), 2),
        (align.exceptions.InputError("bad"), 2),
    ]


def test_a_failure_a_retry_can_fix_exits_75_and_nothing_else_does():
    """Every user-facing kind was exit 2: a script or scheduler could not tell a registry a backup kept locked
    (retry in a minute) from bad input (retrying is useless). 75 is sysexits' EX_TEMPFAIL ("temporary failure,
    retry"); an ``unavailable`` that waits for its operator (no Retry-After over HTTP) stays 2."""
    from service.api.errors import status_for
    from service.errors import ServiceUnavailableError

    for exc, code in _retry_cases():
        assert exit_code(exc) == code, (type(exc).__name__, exit_code(exc))
        if isinstance(exc, ServiceUnavailableError):  # the CLI's 75 and HTTP's Retry-After read the same attribute
            assert status_for(exc) == 503 and (code == 75) == (exc.retry_after is not None), type(exc).__name__


def _http_answer(exc: BaseException):
    """The status and headers of the API's answer to ``exc`` raised by a route."""
    from starlette.requests import Request

    from service.api.errors import error_response

    r = error_response(Request({"type": "http", "method": "GET", "path": "/x", "headers": [], "query_string": b""}),
                       exc)
    return r.status_code, r.headers


def _bare(cls):
    """An instance of ``cls`` made without its ``__init__`` (constructors differ: a job record, an HTTP answer)."""
    exc = cls.__new__(cls)
    Exception.__init__(exc, "x")
    return exc


def test_exit_75_exactly_when_http_says_retry_after_for_every_error_class():
    """The CLI's 75 read ``retry_after`` as None when absent, the HTTP handler as 5: a vector database that was down
    (VectorDBError, no ``retry_after``) was exit 2 from ``vecbridge migrate`` but 503 + Retry-After: 5 over HTTP, and
    its schema errors and a missing client package asked HTTP clients to retry in vain. Both read one helper now,
    and a vector database's error is no retry unless it did not answer. ``timeout`` is 408, which says "send it
    again" by itself (RFC 9110): exit 75 without Retry-After."""
    from service.errors import retry_after_of

    retry_kinds = {"unavailable", "busy", "timeout"}
    classes = {n: c for n, c in _defined_errors().items() if c.kind in retry_kinds}
    assert {"service.vectordb.base.VectorDBError", "service.vectordb.base.VectorDBUnavailableError",
            "service.indexes.errors.UnreadableGenerationError", "service.errors.BusyError"} <= set(classes)
    cases = [(n, _bare(c)) for n, c in classes.items()] + [(n, e) for n, e in [
        ("an instance's own retry_after", _retry_cases()[7][0]), ("sqlite locked", sqlite3.OperationalError(
            "database is locked"))]]
    wrong = {}
    for name, exc in cases:
        status, headers = _http_answer(exc)
        retry_signal = "retry-after" in headers or status == 408
        if (exit_code(exc) == 75) != retry_signal or (retry_after_of(exc) is None) == ("retry-after" in headers):
            wrong[name] = (exit_code(exc), status, headers.get("retry-after"))
    assert wrong == {}
    from service.indexes.errors import UnreadableGenerationError
    from service.vectordb.base import VectorDBError, VectorDBUnavailableError

    assert [exit_code(_bare(c)) for c in (VectorDBError, VectorDBUnavailableError, UnreadableGenerationError)] == [
        2, 75, 2]


def test_a_cli_command_on_a_registry_another_process_keeps_locked_exits_75(tmp_path, capsys, monkeypatch):
    """A cron job's ``vecbridge registry list`` beside a backup holding the registry: one line saying retry later,
    and exit 75, not the 2 of a typo in its arguments."""
    from conftest import run_cli

    from service.registry.db import SQLiteDB

    assert run_cli(capsys, "--data-dir", tmp_path, "spaces")[0] == 0  # the registry exists
    monkeypatch.setattr(SQLiteDB.__init__, "__defaults__", (0.3,))  # the busy timeout: 0.3 s, not 60
    holder = sqlite3.connect(tmp_path / "registry.sqlite", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # as a backup or another process's long write would
    try:
        code, out, err = run_cli(capsys, "--data-dir", tmp_path, "registry", "list", "--json")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert code == 75 and out == "" and err.count("\n") == 1, (code, out, err)
    assert err.startswith("vecbridge: error: the registry database") and "retry later" in err
    assert run_cli(capsys, "--data-dir", tmp_path, "registry", "list", "--nope")[0] == 2  # bad input: still 2


def test_a_database_another_process_keeps_locked_is_a_503_to_retry(tmp_path):
    """SQLite's "database is locked" past the busy timeout (a backup or a long writer holding the registry or the
    job store) was an internal error: HTTP 500 with a traceback logged, CLI exit 3. It is a 503 with Retry-After
    (exit 2): nothing was changed and a retry will do."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from service.api.errors import install_error_handlers

    db = tmp_path / "r.sqlite"
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")  # as a backup or another process's long write would
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/read")
    def read():
        with sqlite3.connect(db, timeout=0.1) as c:
            return c.execute("SELECT * FROM t").fetchall()

    try:
        r = TestClient(app, raise_server_exceptions=False).get("/read")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert r.status_code == 503 and r.headers["retry-after"] == "5", (r.status_code, r.text)
    assert r.json()["error"]["type"] == "DatabaseLockedError" and "retry" in r.json()["error"]["message"]


def test_same_idea_same_kind_across_stores():
    from service.encoders import UnknownEncoderError
    from service.indexes import IndexNotFoundError
    from service.jobs import JobNotFoundError
    from service.registry.errors import NotFoundError
    from service.vectordb.base import CollectionNotFoundError

    assert {c.kind for c in (UnknownEncoderError, IndexNotFoundError, JobNotFoundError, NotFoundError,
                             CollectionNotFoundError)} == {"not_found"}


def test_a_503_no_retry_can_fix_carries_no_retry_after():
    """Every 503 carried ``Retry-After`` (5 s; 30 s for a read-only or full data dir), also the ones only an
    operator can fix, so clients waited and retried in vain (10 s, 60 s) before raising. Transient ones keep it."""
    import errno

    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from service.api.errors import install_error_handlers
    from service.errors import NotConfiguredError, ServiceUnavailableError
    from service.lm.model import LMUnavailableError

    app = FastAPI()
    install_error_handlers(app)
    raised = {"starting": ServiceUnavailableError("the registry is starting"),
              "no-db": NotConfiguredError("no vector database configured"),
              "no-lm": LMUnavailableError("the LM extra is not installed"),
              "read-only": OSError(errno.EROFS, "Read-only file system")}

    @app.get("/{what}")
    def fail(what: str):
        raise raised[what]

    c = TestClient(app, raise_server_exceptions=False)
    got = {what: c.get(f"/{what}") for what in raised}
    assert {w: r.status_code for w, r in got.items()} == dict.fromkeys(raised, 503)
    assert got["starting"].headers["retry-after"] == "5"
    assert [w for w, r in got.items() if "retry-after" in r.headers] == ["starting"]
    assert got["read-only"].json()["error"]["type"] == "StorageUnavailableError"


def _cycles():
    """A self-cycle (grpc's ``_InactiveRpcError`` is its own ``__cause__``) and a 2-cycle (two ``__context__``s)
    below an error of ours raised ``from None`` (as the Milvus adapter does), and a bare 2-cycle holding a read-only
    disk's OSError."""
    import errno

    from service.vectordb.base import VectorDBError

    own = RuntimeError("rpc failed")
    own.__cause__ = own
    a, b = ValueError("a"), OSError(errno.EROFS, "Read-only file system")
    a.__context__, b.__context__ = b, a
    c, d = ValueError("c"), KeyError("d")
    c.__context__, d.__context__ = d, c
    out = {"two-with-erofs": a}
    for name, inner in (("self", own), ("two", c)):
        top = VectorDBError("milvus: cannot connect")
        top.__context__, top.__suppress_context__ = inner, True
        out[name] = top
    return out


def _in_time(fn, *args, seconds: float = 10.0):
    """``fn(*args)`` in a daemon thread: the value, or a failure when it has not returned in ``seconds`` (a walk of
    a looping chain never returns; this way the test fails instead of hanging)."""
    import threading

    got = []
    th = threading.Thread(target=lambda: got.append(fn(*args)), daemon=True)
    th.start()
    th.join(seconds)
    assert got, f"{fn.__name__} did not return in {seconds} s: a loop in the exception chain"
    return got[0]


def test_a_chain_that_loops_is_walked_once_and_ends():
    """``is_storage_error`` walked ``exc = exc.__cause__ or exc.__context__`` with no guard: on a chain that loops (an
    unreachable Milvus server's grpc error is its own cause) it never returned, and every error answer of the API
    runs it, so the request hung at 100% CPU. One walker gives each exception once and stops at a repeat."""
    from service.errors import exception_chain
    from service.storage import is_storage_error

    chains = _cycles()
    names = {k: [type(e).__name__ for e in _in_time(lambda x: list(exception_chain(x)), top)]
             for k, top in chains.items()}
    assert names == {"self": ["VectorDBError", "RuntimeError"],
                     "two-with-erofs": ["ValueError", "OSError"],
                     "two": ["VectorDBError", "ValueError", "KeyError"]}
    assert list(exception_chain(None)) == []
    assert {k: _in_time(is_storage_error, top) for k, top in chains.items()} == {
        "self": False, "two-with-erofs": True, "two": False}

    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from service.api.errors import install_error_handlers

    app = FastAPI()
    install_error_handlers(app)

    @app.get("/{what}")
    def fail(what: str):
        raise chains[what]

    c = TestClient(app, raise_server_exceptions=False)
    got = {k: _in_time(c.get, f"/{k}").json()["error"] for k in chains}
    assert {k: (e["status"], e["type"]) for k, e in got.items()} == {
        "self": (503, "VectorDBError"), "two-with-erofs": (503, "StorageUnavailableError"),
        "two": (503, "VectorDBError")}
    assert got["self"]["message"] == "milvus: cannot connect"


def test_the_architecture_table_names_every_kind_with_its_status():
    """ARCHITECTURE.md's list of kinds had left out `precondition` (412), `timeout` (408) and `io`: its table now
    holds every kind of HTTP_STATUS with that status, and no other."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text.split("## Errors", 1)[1].split("\n## ", 1)[0]
    table = {kind: int(status) for kind, status in re.findall(r"^\| `(\w+)` \| (\d{3}) \|", section, re.MULTILINE)}
    assert table == HTTP_STATUS


def test_a_registry_kept_locked_says_which_file_how_long_and_what_to_do(tmp_path):
    """The CLI printed SQLite's bare "database is locked" after a silent minute (QA, a cron job beside a backup):
    no file, no wait, no advice. A RegistryLockedError (503 / exit 75) names them; registry writes still retry it."""
    from service.registry import RegistryLockedError
    from service.registry.db import SQLiteDB

    path = tmp_path / "registry.sqlite"
    db = SQLiteDB(path, timeout=0.2)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # as a backup or another process's long write would
    try:
        with (pytest.raises(RegistryLockedError, match=r"registry database .*registry\.sqlite stayed locked by "
                                                       r"another process for 0\.2 s .*retry later") as err,
              db.tx(write=True) as t):
            t.q("SELECT 1")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    # it waited the busy timeout already: registry writes do not wait it 20 times more (20 minutes at 60 s)
    assert not db.is_retryable(err.value) and exit_code(err.value) == 75 and http_status(err.value) == 503
    with db.tx(write=True) as t:  # released: the same call goes through
        t.q("SELECT 1")


def test_a_registry_write_against_a_locked_file_waits_the_busy_timeout_once(tmp_path):
    """Each of the write's 20 tries waited the busy timeout (20 minutes of silence at 60 s) before saying it waited
    60 s; the timeout is the wait, so a locked file ends the write after it."""
    import threading
    import time

    from service.registry import RegistryLockedError, open_registry

    reg = open_registry(f"sqlite:///{tmp_path / 'registry.sqlite'}", tmp_path / "artifacts")
    reg.db.timeout = 0.3  # a connection made from now on (the thread's below) waits 0.3 s
    holder = sqlite3.connect(tmp_path / "registry.sqlite", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    got = {}

    def write():
        t0 = time.monotonic()
        try:
            reg.register_space("s", 4)
        except RegistryLockedError as exc:
            got["exc"] = exc
        got["s"] = time.monotonic() - t0

    try:
        t = threading.Thread(target=write)
        t.start()
        t.join(60)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert "stayed locked by another process for 0.3 s" in str(got.get("exc")) and got["s"] < 3.0, got
