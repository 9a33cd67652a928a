"""Registry behaviour, run against SQLite and (when VECBRIDGE_TEST_POSTGRES_URL is set) PostgreSQL."""

from __future__ import annotations

import re
import sqlite3
import time
import uuid
import zipfile

import numpy as np
import pytest
from _servers import damage_page, start_until
from conftest import logged, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import align
from service.registry import (
    AliasMovedError,
    ConflictError,
    DeletedVersionError,
    IntegrityError,
    InvalidNameError,
    NotFoundError,
    Registry,
    RegistryUnavailableError,
    open_registry,
    parse_ref,
)


def rotation_map(d_s=8, d_t=8, seed=0, bias=False) -> align.LinearMap:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(64, d_s))
    Y = X @ rng.normal(size=(d_s, d_t))
    m = align.fit_ridge(X, Y, alpha=0.1) if bias else align.fit_procrustes(X, Y)
    m.metadata["diagnostics"] = {"criterion": [0.1, 0.5], "seed": seed}
    return m


def register(reg, name="a->b", seed=0, src="a", tgt="b", **kw):
    return reg.register_version(name, rotation_map(seed=seed), source_space=src, target_space=tgt,
                                method="procrustes", params={"scale": False}, **kw)


def assert_same_map(a: align.LinearMap, b: align.LinearMap):
    np.testing.assert_array_equal(a.W, b.W)
    assert (a.bias is None) == (b.bias is None)
    if a.bias is not None:
        np.testing.assert_array_equal(a.bias, b.bias)
    assert a.source_frame.same_as(b.source_frame, atol=0) and a.target_frame.same_as(b.target_frame, atol=0)
    assert a.metadata == b.metadata


# --- numbering, lineage, resolving -----------------------------------------------------------

def test_versions_are_numbered_and_carry_lineage(reg):
    v1 = reg.register_version("minilm->e5", rotation_map(seed=1), source_space="minilm", target_space="e5",
                              method="procrustes", params={"scale": False}, random_state=7,
                              data_hashes={"source": "ab" * 32}, metrics={"top1": 0.9}, description="first",
                              tags={"team": "search"}, alias="prod", inputs={"source": {"path": "x.npy"}})
    v2 = register(reg, "minilm->e5", seed=2, src="minilm", tgt="e5")
    assert (v1.version, v2.version) == (1, 2)
    assert v1.random_state == 7 and v1.metrics == {"top1": 0.9} and v1.tags == {"team": "search"}
    assert v1.data_hashes == {"source": "ab" * 32} and v1.inputs == {"source": {"path": "x.npy"}}
    assert v1.aliases == ["prod"] and v1.package_version and v1.created_at < v2.created_at
    assert len(v1.artifact_sha256) == 64 and v1.artifact_sha256 in v1.artifact_path
    assert (v1.source_dim, v1.target_dim) == (8, 8)
    assert reg.resolve("minilm->e5").version == 1  # a bare name: the prod version, as paths use it
    assert reg.resolve("minilm->e5@prod").version == 1
    assert reg.resolve("minilm->e5:1").to_dict() == reg.get_version("minilm->e5", 1).to_dict()
    assert [v.version for v in reg.list_versions("minilm->e5")] == [1, 2]
    (row,) = reg.list_maps()
    assert row["latest_version"] == 2 and row["aliases"] == {"prod": 1}
    assert (row["source_space"], row["target_space"], row["source_dim"]) == ("minilm", "e5", 8)


@pytest.mark.parametrize("fmt", ["npz", "safetensors"])
@pytest.mark.parametrize("bias", [False, True])
def test_artifact_round_trip_every_format(reg, fmt, bias):
    m = rotation_map(d_s=6, d_t=9, seed=3, bias=bias)
    v = reg.register_version("x->y", m, source_space="x", target_space="y", method="ridge" if bias else "procrustes",
                             params={}, artifact_format=fmt)
    assert v.artifact_format == fmt and v.artifact_path.endswith("." + fmt)
    fresh = Registry(reg.url, reg.store.root)  # no cache
    assert_same_map(fresh.load_map("x->y:1"), m)
    X = np.random.default_rng(0).normal(size=(5, 6))
    np.testing.assert_allclose(fresh.load_map("x->y").apply(X), m.apply(X), atol=1e-6)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(d_s=st.integers(1, 12), d_t=st.integers(1, 12), fmt=st.sampled_from(["npz", "safetensors"]),
       seed=st.integers(0, 2**31 - 1), bias=st.booleans())
def test_round_trip_property(tmp_path, d_s, d_t, fmt, seed, bias):
    rng = np.random.default_rng(seed)
    m = align.LinearMap(rng.normal(size=(d_s, d_t)), rng.normal(size=d_t) if bias else None,
                        metadata={"seed": seed, "nested": {"xs": [1.5, None, "s"]}})
    reg = open_registry(f"sqlite:///{tmp_path}/prop.sqlite", tmp_path / "prop-artifacts")
    v = reg.register_version(f"m-{uuid.uuid4().hex[:8]}", m, source_space=f"s{d_s}", target_space=f"t{d_t}", method="custom",
                             params={}, artifact_format=fmt)
    assert_same_map(Registry(reg.url, reg.store.root).load_map(v.ref), m)


def test_corrupt_artifact_is_detected(reg):
    v = register(reg)
    path = reg.artifact_file(v)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="corrupt"):
        Registry(reg.url, reg.store.root).load_map("a->b")
    assert not reg.verify()["ok"]
    path.unlink()
    with pytest.raises(IntegrityError, match="missing"):
        Registry(reg.url, reg.store.root).load_map("a->b:1")


@pytest.mark.parametrize("fmt", ["npz", "safetensors"])
def test_loading_a_version_holds_its_map_once(reg, fmt):
    """The registry read an artifact's whole file as bytes to hash it, then parsed the arrays beside them: the first
    transform by a 1.2 GB cluster map (HTTP, CLI) peaked at 2.25x its size, and ``verify`` held each file whole. The
    file is now hashed in chunks and the map read from it; a changed byte is still refused (above)."""
    import tracemalloc

    m = align.LinearMap(np.random.default_rng(0).standard_normal((1024, 2048), dtype=np.float32))  # 8 MiB
    v = reg.register_version("big", m, source_space="a", target_space="b", method="procrustes", params={},
                             artifact_format=fmt)
    fresh = Registry(reg.url, reg.store.root)
    tracemalloc.start()
    try:
        back = fresh.load_map(v.ref)
        loaded = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        assert fresh.verify()["ok"]
        verified = tracemalloc.get_traced_memory()[1] - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert loaded < m.W.nbytes + (2 << 20), f"loading held {loaded / m.W.nbytes:.2f} x W"
    assert verified < 2 << 20, f"verify held {verified / m.W.nbytes:.2f} x W"
    np.testing.assert_array_equal(back.W, m.W)


def test_a_registration_the_disk_cannot_commit_removes_the_artifact_it_stored(reg):
    """A fit or steer whose commit failed on a full disk (SQLite: "database or disk is full") left the artifact it
    had stored behind for good: ``registry verify --sweep`` listed it as an orphan, and each retry leaked another.
    Now the failed write removes it, and never an artifact that a committed version names (the same bytes again)."""
    if reg.backend != "sqlite":
        pytest.skip("SQLite's max_page_count stands in for a full disk")
    v1 = register(reg)
    stored = reg.store.all_relpaths()
    reg.db._conn().execute("PRAGMA max_page_count = 1")  # no page beyond those it has (this thread's connection)
    for seed in (1, 0):  # new bytes; then version 1's bytes again
        with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
            register(reg, seed=seed, description="x" * 20000)  # overflow pages: the database must grow
    assert reg.store.all_relpaths() == stored and reg.verify()["orphan_artifacts"] == []
    reg.db._conn().execute("PRAGMA max_page_count = 1073741823")
    assert register(reg, seed=0).artifact_path == v1.artifact_path and reg.load_map("a->b:1").W.shape == (8, 8)


def test_unknown_refs(reg):
    register(reg)
    for ref, msg in [("nope", "unknown map"), ("a->b:9", "no version 9"), ("a->b@prod", "no alias")]:
        with pytest.raises(NotFoundError, match=msg):
            reg.resolve(ref)
    with pytest.raises(NotFoundError):
        reg.get_space("zzz")


def test_unknown_names_and_aliases_suggest_a_close_one(reg):
    """`unknown map 'minilm-e6'` and `map 'minilm-e5' has no alias 'prd'` said nothing more: a typo had to be found
    by listing. A close name is suggested (as the settings do), and an alias error lists the name's aliases."""
    register(reg, "minilm-e5", src="minilm", tgt="e5", alias="prod")
    reg.set_alias("minilm-e5", "staging", 1)
    reg.register_steer("tone", align.MeanShift(np.ones(8)), space="s")
    for call, msg in [(lambda: reg.resolve("minilm-e6"), "unknown map 'minilm-e6' (did you mean 'minilm-e5'?)"),
                      (lambda: reg.resolve("minilm-e5@prd"),
                       "map 'minilm-e5' has no alias 'prd' (did you mean 'prod'?); its aliases: 'prod', 'staging'"),
                      (lambda: reg.delete_alias("minilm-e5", "prd"), "has no alias 'prd' (did you mean 'prod'?)"),
                      (lambda: reg.get_space("minilm-e6"), "unknown space 'minilm-e6' (did you mean 'minilm'?)"),
                      (lambda: reg.find_path("minilmm", "e5"), "unknown space 'minilmm' (did you mean 'minilm'?)"),
                      (lambda: reg.resolve_steer("tones"), "unknown steer 'tones' (did you mean 'tone'?)")]:
        with pytest.raises(NotFoundError) as e:
            call()
        assert msg in str(e.value), str(e.value)
    with pytest.raises(NotFoundError) as e:  # nothing close: no suggestion
        reg.resolve("zzzzzz")
    assert str(e.value) == "unknown map 'zzzzzz'"
    for a in range(12):
        reg.set_alias("minilm-e5", f"a{a:02d}", 1)
    with pytest.raises(NotFoundError, match=r"its aliases: 'a00', .*'a09', \.\.\. \(14 in all\)$"):
        reg.resolve("minilm-e5@zzzz")


@pytest.mark.parametrize("bad", ["", "../etc", "a/b", "a\\b", "a\x00b", "x" * 200, ".hidden", "a..b", "a b",
                                 "-x", "a@b@", "é"])
def test_bad_names_are_refused(reg, bad):
    with pytest.raises(InvalidNameError):
        register(reg, name=bad)
    with pytest.raises(InvalidNameError):
        reg.register_space(bad, 3)


def test_a_name_with_a_non_ascii_letter_is_refused_saying_the_letters_are_ascii(reg):
    """'café' was refused with "use letters, digits, ...": é is a letter, so the message contradicted itself."""
    with pytest.raises(InvalidNameError, match=r"'café' is not allowed: use ASCII letters"):
        register(reg, name="café")
    with pytest.raises(InvalidNameError, match=r"ASCII letters"):
        reg.set_alias("minilm-e5", "prodé", 1)


def test_ref_parsing():
    assert parse_ref("minilm->e5") == ("minilm->e5", None, None)
    assert parse_ref("a.b_c-1@candidate") == ("a.b_c-1", "candidate", None)
    assert parse_ref("a:12") == ("a", None, 12)
    for bad in ["a:0", "a:-1", "a:x", "a@", "a@1", "@prod", "../a:1"]:
        with pytest.raises(InvalidNameError):
            parse_ref(bad)


# --- aliases, tags, deletion -------------------------------------------------------------------

def test_aliases_move_and_delete(reg):
    register(reg, seed=1, alias="prod")
    register(reg, seed=2)
    assert reg.set_alias("a->b", "prod", 2).aliases == ["prod"]
    reg.set_alias("a->b", "candidate", 1)
    assert reg.resolve("a->b@prod").version == 2 and reg.resolve("a->b@candidate").version == 1
    reg.delete_alias("a->b", "candidate")
    with pytest.raises(NotFoundError):
        reg.resolve("a->b@candidate")
    with pytest.raises(NotFoundError):
        reg.delete_alias("a->b", "candidate")
    with pytest.raises(NotFoundError):
        reg.set_alias("a->b", "prod", 7)


def test_tags(reg):
    register(reg)
    reg.set_tag("a->b", 1, "reviewed", "yes")
    assert reg.set_tag("a->b", 1, "reviewed", "no").tags == {"reviewed": "no"}
    reg.delete_tag("a->b", 1, "reviewed")
    assert reg.get_version("a->b", 1).tags == {}
    with pytest.raises(NotFoundError):
        reg.set_tag("a->b", 2, "k", "v")



def test_a_tag_writes_check_holds_until_the_tag_is_written(reg):
    """A tag write's ``check`` (HTTP's ``If-Match`` on a tag) runs on the version inside the write's transaction, its
    row locked: another tag write of the version waits until it commits, so what the check saw is what the write
    changes (a check read before the write let a racing writer change the version in between). A check that raises
    writes nothing."""
    import threading

    register(reg)
    waited, others = [], []

    def other(value):
        reg.set_tag("a->b", 1, "owner", value)

    def check(record):
        assert record.tags == ({} if not others else {"owner": "other"}), record.tags
        t = threading.Thread(target=other, args=(f"other{len(others)}",))
        t.start()
        t.join(0.5)
        waited.append(t.is_alive())  # blocked by this transaction
        others.append(t)

    assert reg.set_tag("a->b", 1, "owner", "mine", check=check).tags == {"owner": "mine"}
    others[0].join(60)
    assert waited == [True] and reg.get_version("a->b", 1).tags == {"owner": "other0"}
    reg.set_tag("a->b", 1, "owner", "other")
    reg.delete_tag("a->b", 1, "owner", check=check)
    others[1].join(60)
    assert waited == [True, True] and reg.get_version("a->b", 1).tags == {"owner": "other1"}

    def refuse(record):
        raise ConflictError("no")

    for write in (lambda: reg.set_tag("a->b", 1, "k", "v", check=refuse),
                  lambda: reg.delete_tag("a->b", 1, "owner", check=refuse)):
        with pytest.raises(ConflictError):
            write()
    assert reg.get_version("a->b", 1).tags == {"owner": "other1"}
    with pytest.raises(NotFoundError):
        reg.set_tag("a->b", 2**40, "k", "v", check=refuse)


def test_an_alias_too_long_is_told_the_limit(reg):
    """A 65-character alias was refused with "must start with a letter", which it did: the message now gives the
    64-character limit."""
    register(reg)
    with pytest.raises(InvalidNameError, match="1-64 ASCII letters"):
        reg.set_alias("a->b", "p" * 65, 1)
    assert reg.set_alias("a->b", "p" * 64, 1).aliases == ["p" * 64]


def test_dot_tag_keys_are_refused_as_the_client_refuses_them(reg):
    """Tag keys '.' and '..' were stored (CLI, HTTP body of a fit, a bundle), but no URL can name them (a URL
    resolves dot segments away) and the client refuses them, so they could be neither set nor removed over HTTP. Now
    every writer refuses them; a dot key stored before can still be deleted."""
    register(reg)
    for key in (".", ".."):
        with pytest.raises(InvalidNameError, match="not '.' or '..'"):
            reg.set_tag("a->b", 1, key, "v")
        with pytest.raises(InvalidNameError, match="not '.' or '..'"):
            register(reg, seed=1, tags={key: "v"})
    assert reg.get_version("a->b", 1).tags == {} and [v.version for v in reg.list_versions("a->b")] == [1]
    reg.set_tag("a->b", 1, ".x", "v")  # a key that only starts with a dot is a segment like any other
    with pytest.raises(NotFoundError, match="has no tag '.'"):  # past the key check: a stored one would be removed
        reg.delete_tag("a->b", 1, ".")
    assert reg.get_version("a->b", 1).tags == {".x": "v"}


def test_text_with_nul_is_refused_alike_on_both_backends(reg):
    """PostgreSQL's TEXT cannot hold NUL: a tag value, description or space text with one was a psycopg
    DataError (HTTP 500) there and stored as is on SQLite; now an InvalidNameError (422) on both, nothing written."""
    register(reg)
    gen = reg.generation()
    for write in (lambda: reg.set_tag("a->b", 1, "k", "a\x00b"),
                  lambda: register(reg, seed=1, description="d\x00"),
                  lambda: register(reg, seed=1, tags={"k": "\x00"}),
                  lambda: reg.register_space("s", 4, description="x\x00"),
                  lambda: reg.register_space("s", 4, encoder="e\x00")):
        with pytest.raises(InvalidNameError, match="NUL"):
            write()
    assert reg.generation() == gen and [v.version for v in reg.list_versions("a->b")] == [1]
    assert reg.get_version("a->b", 1).tags == {} and [s.name for s in reg.list_spaces()] == ["a", "b"]

def test_soft_delete(reg):
    register(reg, seed=1)
    register(reg, seed=2, alias="prod")
    v = reg.delete_version("a->b", 2)
    assert v.deleted and reg.artifact_file(v).exists()  # lineage and artifact stay
    assert reg.resolve("a->b").version == 1  # latest live
    with pytest.raises(DeletedVersionError, match="deleted"):
        reg.resolve("a->b@prod")
    with pytest.raises(DeletedVersionError):
        reg.resolve("a->b:2")
    with pytest.raises(ConflictError):
        reg.set_alias("a->b", "candidate", 2)
    assert [x.deleted for x in reg.list_versions("a->b")] == [False, True]
    assert [x.version for x in reg.list_versions("a->b", include_deleted=False)] == [1]
    assert register(reg, seed=3).version == 3  # numbers are never reused
    reg.delete_version("a->b", 1)
    reg.delete_version("a->b", 3)
    with pytest.raises(NotFoundError, match="no live versions"):
        reg.resolve("a->b")
    assert reg.list_maps()[0]["latest_version"] is None



def test_registry_url_typos_are_clear_errors(tmp_path, capsys):
    """A SQLite URL naming a folder (or nothing) was 'internal error: OperationalError: unable to open database
    file', exit 3; an unknown scheme exit 3 as well: both are the user's to fix (InvalidNameError, exit 2)."""
    for url in (f"sqlite:///{tmp_path}", f"sqlite:///{tmp_path}/", "sqlite:///", "sqlite://r.sqlite"):
        with pytest.raises(InvalidNameError, match="folder|unsupported"):
            open_registry(url, tmp_path / "artifacts")
    code, _, err = run_cli(capsys, "--data-dir", tmp_path / "d", "--registry-url", f"sqlite:///{tmp_path}",
                           "registry", "list")
    assert code == 2 and "names a folder, not a database file" in err


def test_a_file_that_is_no_database_is_named(tmp_path, capsys):
    """A registry URL naming some other file was 'internal error: DatabaseError: file is not a database', exit 3."""
    not_db = tmp_path / "notes.txt"
    not_db.write_text("hello")
    with pytest.raises(IntegrityError, match="is not a SQLite registry database"):
        open_registry(f"sqlite:///{not_db}", tmp_path / "artifacts")
    code, _, err = run_cli(capsys, "--data-dir", tmp_path / "d", "--registry-url", f"sqlite:///{not_db}",
                           "registry", "list")
    assert code == 2 and "notes.txt is not a SQLite registry database" in err
    assert not_db.read_text() == "hello"


def damaged_registry(tmp_path, name: str):
    """A data dir whose registry (spaces a, b; map a->b:1) has the page of ``name`` damaged."""
    data = tmp_path / "d"
    reg = open_registry(f"sqlite:///{data / 'registry.sqlite'}", data / "artifacts")
    register(reg)
    reg.close()
    damage_page(data / "registry.sqlite", name)
    return data


def test_a_damaged_sqlite_file_is_an_unavailable_registry_naming_it(tmp_path, capsys):
    """A damaged page of registry.sqlite made every command that read it "internal error: DatabaseError: database
    disk image is malformed" (exit 3); now one line naming the file and what to do, exit 2."""
    from service.errors import http_status

    data = damaged_registry(tmp_path, "sqlite_autoindex_versions_1")
    code, _, err = run_cli(capsys, "--data-dir", data, "registry", "list")
    assert code == 2 and f"{data / 'registry.sqlite'} is damaged" in err and "registry verify" in err, err
    reg = open_registry(f"sqlite:///{data / 'registry.sqlite'}", data / "artifacts")
    with pytest.raises(RegistryUnavailableError, match="is damaged") as caught:
        reg.probe()
    assert http_status(caught.value) == 503
    reg.close()


@pytest.mark.parametrize("name", ["spaces", "sqlite_autoindex_versions_1"])
def test_verify_reports_a_damaged_sqlite_file(tmp_path, capsys, name):
    """A damaged page of registry.sqlite: `registry verify` said "ok": true when the page was one it does not read
    (the spaces table), and crashed with "internal error: DatabaseError: database disk image is malformed" (exit 3)
    when it read it (the versions' key). It runs PRAGMA quick_check first: ok false, the findings under "database"
    naming the file, exit 2."""
    import json

    data = damaged_registry(tmp_path, name)
    code, out, err = run_cli(capsys, "--data-dir", data, "registry", "verify")
    assert code == 2, out + err
    res = json.loads(out)
    assert res["ok"] is False and res["n_versions"] is None
    assert res["database"] and all(str(data / "registry.sqlite") in line for line in res["database"])

def test_postgres_connection_dropped_by_the_server_is_replaced_and_a_dead_server_is_a_503(pg_url, tmp_path, capsys):
    """A PostgreSQL restart or failover ends every idle connection: the next read of each replica failed once
    with a raw AdminShutdown (HTTP 500) before the broken connection was replaced. Now an idle connection the
    server ended is replaced before use, a connection lost mid-transaction is a RegistryUnavailableError (503,
    the next call reconnects), and a server that cannot be reached is the same error (exit 2), not an
    internal error (exit 3)."""
    import time

    import psycopg

    from service.errors import exit_code, http_status
    from service.registry import RegistryUnavailableError

    reg = open_registry(pg_url, tmp_path / "artifacts")
    try:
        name = f"sp{uuid.uuid4().hex[:8]}"
        reg.register_space(name, 4)

        def backend_pid():  # one thread at a time: the pool lends it the same connection each time
            with reg.db.tx() as t:
                return t.one("SELECT pg_backend_pid()")[0]

        def end_backend():
            pid = backend_pid()
            with psycopg.connect(pg_url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            time.sleep(0.3)  # the server's message reaches the client's socket
            return pid

        old = end_backend()
        assert reg.get_space(name).dim == 4  # idle connection ended: replaced, no error
        assert backend_pid() != old
        with pytest.raises(RegistryUnavailableError, match="lost the connection"), reg.db.tx() as t:
            with psycopg.connect(pg_url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (t.one("SELECT pg_backend_pid()")[0],))
            time.sleep(0.3)
            t.q("SELECT 1")
        assert reg.get_space(name).dim == 4
    finally:
        reg.close()
    with pytest.raises(RegistryUnavailableError, match="cannot connect") as info:
        open_registry("postgresql://postgres@127.0.0.1:1/none", tmp_path / "a2")
    assert http_status(info.value) == 503 and exit_code(info.value) == 75  # retry later (sysexits EX_TEMPFAIL)
    code, _, err = run_cli(capsys, "--data-dir", tmp_path / "d", "--registry-url",
                           "postgresql://postgres@127.0.0.1:1/x", "registry", "list")
    assert code == 75 and "cannot connect to PostgreSQL registry" in err


@pytest.mark.parametrize("what", ["database", "role"])
def test_a_postgres_server_that_refuses_a_role_or_database_for_good_is_exit_2_not_retry_later(pg_url, tmp_path, capsys,
                                                                                              what):
    """A database or role that does not exist (or a wrong password) is no "retry later": a scheduler reading 75
    would retry it for ever. It was 75 / Retry-After like a server that was down."""
    from service.errors import exit_code

    url = (pg_url.rsplit("/", 1)[0] + "/no_such_db_42" if what == "database"
           else re.sub(r"//[^@/]*@", "//no_such_role_42@", pg_url, count=1))
    assert url != pg_url
    with pytest.raises(RegistryUnavailableError, match=f"{what}.*does not exist") as info:
        open_registry(url, tmp_path / "a")
    assert exit_code(info.value) == 2 and info.value.retry_after is None
    code, _, err = run_cli(capsys, "--data-dir", tmp_path / "d", "--registry-url", url, "registry", "list")
    assert code == 2 and "does not exist" in err, err


def test_a_postgres_role_that_may_only_read_gets_a_503_naming_the_privilege_not_an_internal_error(pg_url, tmp_path,
                                                                                                 capsys):
    """A read-only role (a reporting replica's) or a role without CREATE on a fresh schema: every write, and the
    first start's CREATE TABLE, was ``internal error: InsufficientPrivilege`` (HTTP 500, exit 3)."""
    import psycopg

    from service.errors import exit_code, http_status
    from service.registry import RegistryUnavailableError

    role = f"ro_{uuid.uuid4().hex[:8]}"
    reg = open_registry(pg_url, tmp_path / "artifacts")
    reg.register_space("a", 4)
    reg.close()
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
    ro_url = pg_url.replace("postgres@", f"{role}@", 1)
    try:
        ro = open_registry(ro_url, tmp_path / "artifacts")
        try:
            assert [s.name for s in ro.list_spaces()] == ["a"]  # reads work
            with pytest.raises(RegistryUnavailableError, match=f"as user '{role}': permission denied") as e:
                ro.register_space("b", 4)
            assert http_status(e.value) == 503 and exit_code(e.value) == 2
        finally:
            ro.close()
        code, _, err = run_cli(capsys, "--data-dir", tmp_path / "d", "--registry-url", ro_url + "?schema=fresh",
                               "spaces")  # its tables do not exist and it may not create them
        assert code == 2 and "permission denied for database" in err and "internal error" not in err
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


def test_tags_have_one_bound_for_every_writer_so_an_export_always_imports(reg, tmp_path):
    """The CLI and a fit's tags stored 100 KB values and a version took any number of tags, while a bundle import
    refused values past 4,096 characters or more than 256 tags: an export of such a registry could not be imported.
    A key with '/' could be set but no route could name it."""
    from service.registry.names import MAX_TAG_BYTES, MAX_TAGS

    reg.register_space("a", 4)
    reg.register_space("b", 4)
    m = align.LinearMap(np.eye(4, dtype=np.float32))
    v = reg.register_version("m", m, source_space="a", target_space="b", method="procrustes", params={},
                             tags={"big": "é" * (MAX_TAG_BYTES // 2)})  # at the bound in UTF-8 bytes
    with pytest.raises(InvalidNameError, match="longer than"):
        reg.set_tag("m", v.version, "huge", "y" * (MAX_TAG_BYTES + 1))
    with pytest.raises(InvalidNameError, match="not allowed"):
        reg.set_tag("m", v.version, "a/b", "x")
    with pytest.raises(InvalidNameError, match=f"at most {MAX_TAGS}"):
        reg.register_version("m", m, source_space="a", target_space="b", method="procrustes", params={},
                             tags={f"k{i}": "x" for i in range(MAX_TAGS + 1)})
    for i in range(MAX_TAGS - 1):
        reg.set_tag("m", v.version, f"k{i}", "x")
    reg.set_tag("m", v.version, "k0", "again")  # replacing one is not one more
    with pytest.raises(InvalidNameError, match=f"at most {MAX_TAGS}"):
        reg.set_tag("m", v.version, "one-more", "x")
    reg.export(tmp_path / "b.zip", names=["m"])
    other = open_registry(f"sqlite:///{tmp_path / 'other.sqlite'}", tmp_path / "other-artifacts")
    try:
        other.import_(tmp_path / "b.zip")
        tags = other.get_version("m", 1).tags
        assert len(tags) == MAX_TAGS and tags["big"] == "é" * (MAX_TAG_BYTES // 2)
    finally:
        other.close()


# --- spaces and paths -------------------------------------------------------------------------

def test_spaces(reg):
    s = reg.register_space("minilm", 384, encoder="all-MiniLM-L6-v2", description="MiniLM")
    assert reg.register_space("minilm", 384) == s  # idempotent
    with pytest.raises(ConflictError):
        reg.register_space("minilm", 768)
    with pytest.raises(InvalidNameError):
        reg.register_space("bad", 0)
    register(reg)  # creates spaces a and b, 8-d
    assert [x.name for x in reg.list_spaces()] == ["a", "b", "minilm"]
    assert reg.get_space("a").dim == 8
    with pytest.raises(ConflictError, match="8-d"):
        reg.register_version("a->c", rotation_map(d_s=4, d_t=4), source_space="a", target_space="c",
                             method="procrustes", params={})
    with pytest.raises(ConflictError, match="connects"):
        register(reg, name="a->b", src="b", tgt="a")


def test_a_space_is_deleted_only_while_nothing_is_in_it(reg):
    """A typo'd space can go; one a map or a steer names stays (their records are lineage, deleted versions too)."""
    reg.register_space("e5-smal", 384, description="typo")
    register(reg)  # spaces a and b, map a->b
    reg.delete_version("a->b", 1)
    for name in ("a", "b"):
        with pytest.raises(ConflictError, match=f"space '{name}' is used by map 'a->b'"):
            reg.delete_space(name)
    shift = align.fit_mean_shift(np.random.default_rng(0).normal(size=(20, 8)), np.repeat([1, -1], 10))
    reg.register_steer("tone", shift, space="s")  # registers space s (8-d)
    with pytest.raises(ConflictError, match="space 's' is used by steer 'tone'"):
        reg.delete_space("s")
    before = reg.generation()
    assert reg.delete_space("e5-smal").description == "typo"
    assert reg.generation() > before  # replicas see it at their next request
    assert [x.name for x in reg.list_spaces()] == ["a", "b", "s"]
    for bad, err in (("e5-smal", NotFoundError), ("no/such", InvalidNameError)):
        with pytest.raises(err):
            reg.delete_space(bad)
    assert reg.register_space("e5-smal", 768).dim == 768  # the name is free again, at any width


def test_a_page_after_a_cursor_holding_nul_is_the_page_after_its_prefix(reg):
    """A crafted page cursor holding NUL went to SQL as is: PostgreSQL refuses NUL in a text parameter, so
    ``GET /v1/maps?cursor=...`` answered 500 (SQLite and the older Python paging, 200). No name holds NUL, so the
    names after ``"a->b\\x00zz"`` are those after ``"a->b"``; a name asked for with NUL is no name."""
    for name in ("a->b", "b->c", "c->d"):
        register(reg, name)
    assert [m["name"] for m in reg.list_maps(after="a->b\x00zz")] == ["b->c", "c->d"]
    assert [m["name"] for m in reg.list_maps(after="\x00", limit=1)] == ["a->b"]
    assert reg.list_maps(name="a->b\x00") == []


def test_find_path_and_compose(reg):
    ab = register(reg, "a->b", seed=1)
    register(reg, "b->c", seed=2, src="b", tgt="c")
    prod_bc = register(reg, "b->c", seed=3, src="b", tgt="c", alias="prod")
    register(reg, "b->c", seed=4, src="b", tgt="c")  # latest, but prod wins
    register(reg, "a->c-direct-then-deleted", seed=5, src="a", tgt="c")
    reg.delete_version("a->c-direct-then-deleted", 1)
    chain = reg.find_path("a", "c")
    assert [v.ref for v in chain] == [ab.ref, prod_bc.ref]
    assert reg.find_path("a", "a") == []
    with pytest.raises(NotFoundError):
        reg.find_path("c", "a")
    composed = reg.compose_path("a", "c")
    m1, m2 = reg.load_map(ab.ref), reg.load_map(prod_bc.ref)
    X = np.random.default_rng(0).normal(size=(20, composed.source_dim)).astype(np.float32)
    np.testing.assert_allclose(composed.apply(X), m2.apply(m1.apply(X)), atol=1e-5)  # the two maps in turn
    assert (composed.source_dim, composed.target_dim) == (m1.source_dim, m2.target_dim)
    register(reg, "a->c", seed=6, src="a", tgt="c")
    assert [v.name for v in reg.find_path("a", "c")] == ["a->c"]


# --- bundles ----------------------------------------------------------------------------------

def test_a_folder_export_needs_a_new_or_empty_folder_and_appears_whole(reg, tmp_path):
    """`registry export d` wrote manifest.json and the artifacts into the data dir itself, and into any non-empty
    folder, without a word; to an existing file it printed a raw "[Errno 17] File exists". Now refused, and the
    folder appears whole (written aside, renamed)."""
    register(reg, seed=1)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    (tmp_path / "afile").write_text("x")
    for bad in ("full", "afile"):
        with pytest.raises(ConflictError, match="not an empty folder"):
            reg.export(tmp_path / bad)
    assert sorted(p.name for p in (tmp_path / "full").iterdir()) == ["keep.txt"]
    (tmp_path / "empty").mkdir()
    for ok in ("empty", "new/deeper"):
        out = reg.export(tmp_path / ok)
        assert (out / "manifest.json").is_file()
    assert not list(tmp_path.rglob(".*.tmp-*"))  # the folder written aside is gone once renamed


_ZIP_WRITER = """
import os, signal, sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from service.storage import atomic_write

out, how = Path(sys.argv[1]), sys.argv[2]


def write(tmp):  # as a zip export writes its bundle: atomic_write(..., held=True)
    Path(tmp).write_bytes(b"PK half a bundle")
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    (out.parent / "writing").touch()
    while not (out.parent / "release").exists():
        time.sleep(0.05)


atomic_write(out, write, **({{"held": True}} if how == "hold" else {{}}))  # killed: as any release's (no lock left)
"""


def test_a_killed_zip_exports_temporary_is_removed_by_the_next_export_and_a_live_ones_kept(reg, tmp_path):
    """`kill -9` of `registry export X.zip` left ``.X.zip.tmp-*`` beside it for good: the next export to that path
    did not remove it (a killed folder export's temporary folder is removed by the rerun). Now it is, while the
    temporary of an export still running (its flock held) is kept."""
    import subprocess
    import sys
    from pathlib import Path

    register(reg, seed=1)
    script = tmp_path / "writer.py"
    script.write_text(_ZIP_WRITER.format(root=str(Path(__file__).resolve().parents[3])))
    out = tmp_path / "o" / "b.zip"
    r = subprocess.run([sys.executable, str(script), str(out), "kill"], capture_output=True, text=True, timeout=120,
                       check=False)
    assert r.returncode == -9, r.stderr
    dead = list(out.parent.glob(".b.zip.tmp-*"))
    assert len(dead) == 1
    reg.export(out)
    assert not dead[0].exists(), "the killed export's temporary is removed by the next export"
    assert zipfile.ZipFile(out).namelist()  # the export itself is whole
    out.unlink()
    live = start_until([sys.executable, str(script), str(out), "hold"], out.parent / "writing")
    try:
        running = list(out.parent.glob(".b.zip.tmp-*"))
        reg.export(out)
        assert len(running) == 1 and running[0].exists()  # kept: its writer is alive
        assert zipfile.ZipFile(out).namelist()
    finally:
        live.kill()
        live.wait(timeout=60)
    # the clean-up is best effort: an entry it cannot remove (a folder here; another user's file in a shared sticky
    # folder, EPERM) failed the export (a review's find), now it is left as it is
    out.unlink()
    stale = out.parent / ".b.zip.tmp-1-1-dir"
    stale.mkdir()
    reg.export(out)
    assert zipfile.ZipFile(out).namelist() and stale.is_dir()


@pytest.mark.parametrize("suffix", [".zip", ""])
def test_export_import_round_trip(reg, tmp_path, suffix):
    reg.register_space("a", 8, encoder="enc", passage_prefix="passage: ")
    register(reg, seed=1, tags={"k": "v"})
    register(reg, seed=2, alias="prod")
    reg.delete_version("a->b", 1)
    bundle = reg.export(tmp_path / f"bundle{suffix}")
    if suffix == ".zip":
        assert "manifest.json" in zipfile.ZipFile(bundle).namelist()
    other = open_registry(f"sqlite:///{tmp_path}/other.sqlite", tmp_path / "other-artifacts")
    assert other.import_(bundle) == {"imported": 2, "skipped": 0, "renumbered": 0, "aliases": 1}
    assert other.import_(bundle)["skipped"] == 2  # idempotent
    for v_old, v_new in zip(reg.list_versions("a->b"), other.list_versions("a->b")):
        a, b = v_old.to_dict(), v_new.to_dict()
        assert a == b
    assert other.get_space("a").passage_prefix == "passage: "
    assert_same_map(other.load_map("a->b@prod"), reg.load_map("a->b@prod"))
    # a registry with a different version 1 of the same map: conflict, or renumber on request
    third = open_registry(f"sqlite:///{tmp_path}/third.sqlite", tmp_path / "third-artifacts")
    register(third, seed=99)
    with pytest.raises(ConflictError):
        third.import_(bundle)
    third = open_registry(f"sqlite:///{tmp_path}/third2.sqlite", tmp_path / "third2-artifacts")
    register(third, seed=99)
    counts = third.import_(bundle, on_conflict="renumber")
    assert counts == {"imported": 0, "skipped": 0, "renumbered": 2, "aliases": 1}  # both collide with v1/v2 here
    assert [(v.version, v.deleted, v.tags.get("imported_from")) for v in third.list_versions("a->b")] == [
        (1, False, None), (2, True, "a->b:1"), (3, False, "a->b:2")]
    assert third.resolve("a->b@prod").version == 3  # the alias follows its version to its new number
    # importing the same bundle again (renumbering or not) adds nothing: it added v2, v3 as v4, v5 again
    assert third.import_(bundle, on_conflict="renumber") == {"imported": 0, "skipped": 2, "renumbered": 0,
                                                             "aliases": 0}
    assert [v.version for v in third.list_versions("a->b")] == [1, 2, 3]
    assert third.verify()["ok"]



def test_renumbering_import_keeps_bundle_versions_that_share_an_artifact(reg, tmp_path):
    """Bundle versions 1 and 2 with the same artifact (a map registered twice, other metrics) into a registry with
    another version 1: version 1 was renumbered to 2, then version 2 found "its" number holding its artifact and
    was skipped as imported before: its record was lost and its alias landed on version 1's copy."""
    src = open_registry(f"sqlite:///{tmp_path}/src.sqlite", tmp_path / "src-artifacts")
    register(src, seed=1)
    register(src, seed=1, metrics={"heldout_top1": 0.9}, alias="prod")
    bundle = src.export(tmp_path / "bundle.zip")
    register(reg, seed=99)
    assert reg.import_(bundle, on_conflict="renumber") == {"imported": 0, "skipped": 0, "renumbered": 2,
                                                             "aliases": 1}
    assert [(v.version, v.metrics, v.tags.get("imported_from"), v.aliases) for v in reg.list_versions("a->b")] == [
        (1, {}, None, []), (2, {}, "a->b:1", []), (3, {"heldout_top1": 0.9}, "a->b:2", ["prod"])]
    assert reg.import_(bundle, on_conflict="renumber") == {"imported": 0, "skipped": 2, "renumbered": 0,
                                                             "aliases": 0}  # again: a no-op
    assert len(reg.list_versions("a->b")) == 3 and reg.verify()["ok"]


def test_import_keeps_the_encoder_and_prefixes_of_a_space_here(reg, tmp_path):
    """A bundle whose space ``a`` names another encoder and prefixes: the import replaced this registry's (how its
    texts are embedded for every search and fit) without a word. Now only fields left empty here are filled."""
    src = open_registry(f"sqlite:///{tmp_path}/src.sqlite", tmp_path / "src-artifacts")
    src.register_space("a", 8, encoder="theirs", query_prefix="q: ", description="theirs")
    src.register_space("b", 8, encoder="their-b", passage_prefix="p: ")
    register(src, seed=1)
    bundle = src.export(tmp_path / "bundle.zip")
    reg.register_space("a", 8, encoder="mine", query_prefix="query: ")
    reg.register_space("b", 8)
    assert reg.import_(bundle)["imported"] == 1
    a, b = reg.get_space("a"), reg.get_space("b")
    assert (a.encoder, a.query_prefix, a.description) == ("mine", "query: ", "theirs")
    assert (b.encoder, b.passage_prefix) == ("their-b", "p: ")


def test_failed_import_keeps_the_reports_of_earlier_imports(reg, tmp_path):
    """A failed import removes the reports it wrote, but it also removed the one an earlier import of the same
    version had stored (same content, same file name): a->b:1 lost its report to an unrelated conflict."""
    src = open_registry(f"sqlite:///{tmp_path}/src.sqlite", tmp_path / "src" / "artifacts")
    (src.report_dir / "r").mkdir(parents=True)
    (src.report_dir / "r" / "fit.html").write_text("<html>fit report</html>")
    register(src, report_path="r/fit.html")
    register(src, "c->d", seed=1, src="c", tgt="d")
    only_ab, both = src.export(tmp_path / "ab.zip", ["a->b"]), src.export(tmp_path / "all.zip")
    assert reg.import_(only_ab)["imported"] == 1
    report = reg.report_file("a->b:1")
    assert report.read_text() == "<html>fit report</html>"
    register(reg, "c->d", seed=2, src="c", tgt="d")  # another c->d:1 here: the full bundle conflicts
    with pytest.raises(ConflictError, match="c->d:1"):
        reg.import_(both)
    assert report.read_text() == "<html>fit report</html>"


def test_a_nan_metric_does_not_make_the_bundle_unimportable(reg, tmp_path):
    """A version with a NaN metric (an undefined score) was exported as 'NaN' in the manifest, which the import
    refuses: the registry's own bundle could not be imported anywhere. NaN / Inf are exported as null."""
    register(reg, metrics={"top1": 0.5, "r2": float("nan"), "curve": [1.0, float("inf")]})
    bundle = reg.export(tmp_path / "nan.zip")
    other = open_registry(f"sqlite:///{tmp_path}/other.sqlite", tmp_path / "other-artifacts")
    assert other.import_(bundle)["imported"] == 1
    assert other.get_version("a->b", 1).metrics == {"top1": 0.5, "r2": None, "curve": [1.0, None]}

def test_import_rejects_tampered_bundle(reg, tmp_path):
    register(reg)
    folder = reg.export(tmp_path / "bundle")
    art = next((folder / "artifacts").rglob("*.safetensors"))
    art.write_bytes(art.read_bytes()[:-1] + b"\x00")
    other = open_registry(f"sqlite:///{tmp_path}/o.sqlite", tmp_path / "o-art")
    with pytest.raises(IntegrityError):
        other.import_(folder)
    with pytest.raises(NotFoundError):
        other.import_(tmp_path / "missing.zip")


# --- concurrency inside one process ------------------------------------------------------------

def test_threads_share_one_registry(reg, run_threads):
    got = run_threads(lambda seed: [register(reg, seed=seed * 10 + i).version for i in range(4)], 4)
    assert sorted(v for vs in got for v in vs) == list(range(1, 17))
    assert reg.verify()["ok"]


def test_generation_moves_with_every_write_and_is_shared(registry_url, tmp_path):
    """Two handles on one registry (two workers/replicas): each write bumps the shared generation,
    and an AppState cache stamped with it answers the new alias target at the next call."""
    from service.api.state import AppState
    from service.config import Settings

    a = open_registry(registry_url, tmp_path / "artifacts")
    b = open_registry(registry_url, tmp_path / "artifacts")
    try:
        g0 = b.generation()
        register(a, alias="prod")
        g1 = b.generation()
        assert g1 > g0
        state = AppState(Settings(data_dir=tmp_path / "state", demo_on_empty=False))
        state.registry = b
        assert state.resolve("a->b@prod").version == 1
        assert state.resolve("a->b@prod").version == 1 and b.generation() == g1  # cached, nothing written
        register(a, seed=1)
        a.set_alias("a->b", "prod", 2)
        assert b.generation() > g1
        assert state.resolve("a->b@prod").version == 2 and state.resolve("a->b").version == 2
        a.delete_version("a->b", 2)
        assert state.resolve("a->b").version == 1
    finally:
        a.close()
        b.close()


def _roll_back_to(reg, snapshot) -> None:
    """Put the registry back to ``snapshot`` the way an operator restores one, bypassing vecbridge's writes: SQLite's
    own in-place restore (the backup API from an older copy of the file: ``sqlite3 registry.sqlite ".restore
    old.sqlite"``); PostgreSQL: the rows of ``vb_meta`` and ``aliases`` as a dump taken then holds (pg_restore)."""
    if reg.backend == "sqlite":
        src, dst = sqlite3.connect(snapshot), sqlite3.connect(reg.db.path)
        try:
            src.backup(dst)
        finally:
            src.close()
            dst.close()
        return
    with reg.db.tx(write=True) as t:
        for table, rows in snapshot.items():
            t.q(f"DELETE FROM {table}")
            for r in rows:
                t.q(f"INSERT INTO {table} VALUES ({', '.join('?' * len(r))})", tuple(r))


def test_a_rolled_back_registry_never_serves_what_was_cached_after_the_snapshot(registry_url, tmp_path):
    """A registry restored to an older state (pg_restore, point-in-time recovery, failover to a standby that was
    behind, an older SQLite file restored in place) and written once reaches the generation it had before the
    restore again, with other contents: replicas that cached under that generation kept answering the moved alias's
    old target, with no error, until the next write (QA 4801). The stamp a cache compares cannot repeat."""
    from service.api.state import AppState
    from service.config import Settings

    a = open_registry(registry_url, tmp_path / "artifacts")
    b = open_registry(registry_url, tmp_path / "artifacts")
    try:
        for seed in range(4):
            register(a, seed=seed)
        a.set_alias("a->b", "prod", 4)
        if a.backend == "sqlite":
            snapshot = tmp_path / "older.sqlite"
            snapshot.write_bytes(a.db.path.read_bytes())
        else:
            with a.db.tx() as t:
                snapshot = {table: [tuple(r) for r in t.q(f"SELECT * FROM {table}")]
                            for table in ("vb_meta", "aliases")}
        state = AppState(Settings(data_dir=tmp_path / "state", demo_on_empty=False))
        state.registry = b
        a.set_alias("a->b", "prod", 2)
        assert state.resolve("a->b@prod").version == 2  # a replica caches what the registry said after the snapshot
        _roll_back_to(a, snapshot)
        assert b.resolve("a->b@prod").version == 4
        a.set_alias("a->b", "prod", 3)  # one write: the generation is back where the replica cached
        assert b.resolve("a->b@prod").version == 3
        assert state.resolve("a->b@prod").version == 3  # was 2, from the cache
    finally:
        a.close()
        b.close()


def test_an_alias_removed_by_many_threads_at_once_is_removed_once(reg, run_threads):
    """Clients racing to remove one alias: one is told it removed it, the others that it is not there (404), as
    if they had run one after the other; on PostgreSQL every one of them used to be told it removed it."""
    import threading

    register(reg)
    n = 6
    for _ in range(5):
        reg.set_alias("a->b", "prod", 1)
        barrier = threading.Barrier(n)

        def remove(_):
            barrier.wait(30)
            try:
                reg.delete_alias("a->b", "prod")
                return "removed"
            except NotFoundError as exc:
                assert "has no alias 'prod'" in str(exc)
                return "absent"

        got = run_threads(remove, n)
        assert sorted(got) == ["absent"] * (n - 1) + ["removed"], got
    assert reg.verify()["ok"]


def test_compare_and_set_takes_a_set_of_versions_or_star_and_guards_a_removal(reg):
    """What HTTP's ``If-Match`` needs, in the same one conditional statement: ``expected`` as a collection of
    versions (a list of ETags), ``"*"`` (the alias must be set), and on ``delete_alias`` too (a removal could not
    be guarded: it removed the alias wherever it pointed). The error carries where it points (``current``)."""
    for _ in range(3):
        register(reg)  # versions 1, 2, 3
    with pytest.raises(AliasMovedError, match="is not set, expected it to be set") as err:
        reg.set_alias("a->b", "prod", 1, expected="*")
    assert err.value.current is None and isinstance(err.value, ConflictError)
    reg.set_alias("a->b", "prod", 1, expected=0)
    with pytest.raises(AliasMovedError, match="points at version 1, expected it to point at one of versions 2, 3"):
        reg.set_alias("a->b", "prod", 2, expected=[3, 2])
    assert reg.set_alias("a->b", "prod", 2, expected=[3, 1]).version == 2
    assert reg.set_alias("a->b", "prod", 3, expected="*").version == 3 == reg.alias_version("a->b", "prod")
    with pytest.raises(AliasMovedError, match="expected it to point at version 2: not removed") as err:
        reg.delete_alias("a->b", "prod", expected=2)
    assert err.value.current == 3 and reg.alias_version("a->b", "prod") == 3
    with pytest.raises(AliasMovedError):
        reg.delete_alias("a->b", "prod", expected=[])
    with pytest.raises(NotFoundError):
        reg.delete_alias("nope", "prod", expected=3)  # an unknown map stays a 404
    reg.delete_alias("a->b", "prod", expected=3)
    with pytest.raises(AliasMovedError, match="is not set, expected it to be set: not removed"):
        reg.delete_alias("a->b", "prod", expected="*")
    with pytest.raises(NotFoundError):
        reg.alias_version("a->b", "prod")
    for bad in (-1, 2**31, [0, 1], "x"):
        with pytest.raises(align.exceptions.InputError):
            reg.set_alias("a->b", "prod", 1, expected=bad)


def test_compare_and_set_aliases_let_one_of_racing_deploys_move_prod(reg, run_threads):
    """Deploy tools moving ``prod`` with ``expected``: of clients racing from the same version exactly one moves
    it and the others get a ConflictError naming where it points (last-writer-wins undid moves nobody saw); a
    move from a stale version, or creating an alias that exists (``expected=0``), is refused and changes nothing.
    One conditional statement, so PostgreSQL (READ COMMITTED) serialises it too; steers share the code."""
    import threading

    for _ in range(3):
        register(reg)  # versions 1, 2, 3
    with pytest.raises(ConflictError, match="is not set, expected it to point at version 1"):
        reg.set_alias("a->b", "prod", 2, expected=1)
    assert reg.set_alias("a->b", "prod", 1, expected=0).version == 1
    with pytest.raises(ConflictError, match="points at version 1, expected it not to be set") as err:
        reg.set_alias("a->b", "prod", 2, expected=0)
    assert "someone else moved it" in str(err.value)
    with pytest.raises(ConflictError, match=r"points at version 1, expected it not to be set: not moved \(it is "
                                            "where this move would put it"):
        reg.set_alias("a->b", "prod", 1, expected=0)  # a cron job's re-run: not "someone else moved it"
    n = 6
    barrier = threading.Barrier(n)

    def move(i):
        barrier.wait(30)
        try:
            reg.set_alias("a->b", "prod", 2 + i % 2, expected=1)
            return "moved"
        except ConflictError as exc:
            assert "expected it to point at version 1: not moved" in str(exc)
            return "refused"

    got = run_threads(move, n)
    assert sorted(got) == ["moved"] + ["refused"] * (n - 1), got
    now = reg.resolve("a->b@prod").version
    assert now in (2, 3)
    with pytest.raises(ConflictError, match=f"points at version {now}, expected"):
        reg.set_alias("a->b", "prod", 1, expected=1)
    assert reg.resolve("a->b@prod").version == now and reg.verify()["ok"]
    reg.set_alias("a->b", "prod", 1)  # without expected: moves whatever it points at, as before
    assert reg.resolve("a->b@prod").version == 1


@pytest.mark.postgres
def test_keeping_an_alias_holds_against_a_concurrent_writer_under_postgresql(pg_url, tmp_path, run_threads):
    """``put_alias(move=False)`` (a bundle import keeps the aliases it finds) while another transaction creates the
    same alias: under READ COMMITTED its check saw no alias, then its upsert waited for the other's row and
    overwrote it, moving an alias it had promised to keep. Now one ``INSERT ... ON CONFLICT DO NOTHING``: the
    other writer's alias stays and the call says it wrote nothing."""
    import threading

    import psycopg

    reg = open_registry(pg_url, tmp_path / "artifacts")
    try:
        register(reg)
        register(reg)  # versions 1 and 2
        other = psycopg.connect(pg_url)  # a transaction, not autocommit: holds its row until commit
        other.execute("INSERT INTO aliases (name, alias, version) VALUES ('a->b', 'prod', 2)")
        pid = other.info.backend_pid
        done = threading.Event()

        def keep(i):
            if i == 0:
                try:
                    return reg._write(lambda t: reg.entities["maps"].put_alias(t, "a->b", "prod", 1, move=False))
                finally:
                    done.set()
            with psycopg.connect(pg_url, autocommit=True) as watch:  # until the keeper waits on the row lock
                for _ in range(600):
                    if done.is_set() or watch.execute(
                            "SELECT count(*) FROM pg_locks l JOIN pg_locks h ON h.transactionid = l.transactionid "
                            "AND h.granted AND NOT l.granted WHERE h.pid = %s", (pid,)).fetchone()[0]:
                        break
                    time.sleep(0.05)
            other.commit()
            return None

        wrote, _ = run_threads(keep, 2)
        other.close()
        assert wrote is False
        assert reg.resolve("a->b@prod").version == 2
    finally:
        reg.close()


@pytest.mark.postgres
def test_verify_reports_no_gap_for_a_version_committed_while_it_reads(pg_url, tmp_path, monkeypatch):
    """``verify`` on PostgreSQL while another replica registers: it read each name's ``last_version``, then counted
    its versions in another statement (READ COMMITTED: another snapshot), so a version committed in between looked
    like a gap and a healthy registry failed verify (exit 2). Now one statement reads both."""
    from service.registry import db as registry_db

    reg, other = (open_registry(pg_url, tmp_path / "artifacts") for _ in range(2))
    try:
        register(reg)
        q, fired = registry_db.Tx.q, []

        def q_then_commit_elsewhere(self, sql, params=()):
            out = q(self, sql, params)
            if "last_version" in sql and not fired:  # a version of a->b commits right after this statement
                fired.append(True)
                register(other, seed=1)
            return out

        monkeypatch.setattr(registry_db.Tx, "q", q_then_commit_elsewhere)
        res = reg.verify()
        monkeypatch.undo()
        assert fired and res["version_gaps"] == [] and res["ok"], res
        assert reg.verify()["ok"]
    finally:
        reg.close()
        other.close()


@pytest.mark.parametrize("kind", ["map", "steer"])
def test_a_space_cannot_be_deleted_under_a_registration_in_flight(registry_url, tmp_path, kind):
    """PostgreSQL (READ COMMITTED): `spaces delete` checked for users with a plain read, saw no map or steer in a
    registration still in flight, deleted the space, and the registration then committed a map (or steer) of a
    space that no longer existed; `registry verify` said ok. The registration now holds the space row, so the
    delete waits for it and refuses (SQLite already did: one writer at a time)."""
    import threading

    from service.registry import core, open_registry
    from service.registry.errors import ConflictError

    reg = open_registry(registry_url, tmp_path / "artifacts")
    other = open_registry(registry_url, tmp_path / "artifacts")
    reg.register_space("lonely", 4)
    paused, go = threading.Event(), threading.Event()
    writer = threading.current_thread()
    results: dict = {}

    def hook(point):
        if point == "version_inserted" and threading.current_thread() is not writer and not paused.is_set():
            paused.set()
            go.wait(30)

    def register():
        try:
            if kind == "map":
                reg.register_version("x", align.LinearMap(np.eye(4)), source_space="lonely", target_space="d",
                                     method="identity", params={})
            else:
                reg.register_steer("st", align.Steer(np.eye(4)[:, :1], np.ones((4, 1))), space="lonely")
            results["registered"] = True
        except Exception as exc:  # noqa: BLE001 - reported below
            results["registered"] = exc

    def delete():
        try:
            other.delete_space("lonely")
            results["deleted"] = True
        except Exception as exc:  # noqa: BLE001
            results["deleted"] = exc

    core.FAULT_HOOK = hook
    try:
        a = threading.Thread(target=register)
        a.start()
        assert paused.wait(30)
        b = threading.Thread(target=delete)
        b.start()
        time.sleep(0.5)  # the delete is now waiting for the registration
        go.set()
        a.join(60)
        b.join(60)
    finally:
        core.FAULT_HOOK = None
    assert results["registered"] is True, results
    assert isinstance(results["deleted"], ConflictError) and "lonely" in str(results["deleted"]), results
    assert reg.get_space("lonely").dim == 4
    other.close()
    reg.close()


def test_an_input_path_that_is_not_utf8_is_stored_escaped_on_both_backends(reg):
    """The file names a version records come from the file system: one that is not UTF-8 reaches the registry with
    surrogate escapes (os.fsdecode), which both backends stored as they came, for every JSON answer naming the
    version to fail on (HTTP 500). Both store its bytes as \\xNN now, for maps and steers alike."""
    import os

    bad = os.fsdecode(b"/data/bad\xff.npy")
    m = align.LinearMap(np.eye(4))
    v = reg.register_version("s", m, source_space="p", target_space="q", method="identity", params={},
                             inputs={"source": {"path": bad}, "half": ["x\ud800"]})
    want = {"source": {"path": "/data/bad\\xff.npy"}, "half": ["x\\ud800"]}
    assert v.inputs == want and reg.get_version("s", 1).inputs == want
    st = reg.register_steer("t", align.MeanShift(np.ones(4, dtype=np.float32)), space="p", inputs={"vectors": bad})
    assert reg.get_steer("t", 1).inputs == {"vectors": "/data/bad\\xff.npy"} == st.inputs


def test_a_seed_past_64_bits_and_a_lone_surrogate_are_refused_alike_on_both_backends(reg):
    """random_state >= 2**63 was a raw OverflowError on SQLite and NumericValueOutOfRange on PostgreSQL; a lone
    surrogate in a description or tag a raw UnicodeEncodeError. Both are InvalidNameError now, nothing written."""
    from service.registry.errors import InvalidNameError

    m = align.LinearMap(np.eye(4))
    for kw in ({"random_state": 2**64}, {"random_state": -(2**63) - 1}, {"random_state": 1.5},
               {"description": "caf\ud800"}, {"tags": {"k": "\udcff"}}):
        with pytest.raises(InvalidNameError):
            reg.register_version("s", m, source_space="p", target_space="q", method="identity", params={}, **kw)
    assert reg.list_maps() == []
    assert reg.register_version("s", m, source_space="p", target_space="q", method="identity", params={},
                                random_state=np.int64(2**62)).random_state == 2**62


def test_a_verdict_recorded_before_the_held_out_test_is_judged_again(reg):
    """A fit recorded before 2026-12-05 kept "reliable" when its held-out hits were at chance (a map of shuffled
    pairs: 2 of 20 among 20), so after an upgrade the bare name and the path still went through it while the same
    fit today is flagged. Path choice judges the recorded figures again; a flag the fit set is never lifted, and
    minivec2vec (which never fits on its pairs) keeps its own verdict."""
    good = {"reliable": True, "heldout_top1": 0.9, "heldout_n_candidates": 200, "heldout_n_queries": 200}
    chance = {"reliable": True, "heldout_top1": 0.1, "heldout_n_candidates": 20, "heldout_n_queries": 20}
    register(reg, seed=1, metrics=good)
    register(reg, seed=2, metrics=chance)  # newer, recorded reliable
    assert reg.resolve("a->b").version == 1
    assert [v.version for v in reg.find_path("a", "b")] == [1]
    assert not reg.is_reliable(reg.get_version("a->b", 2)) and reg.is_reliable(reg.get_version("a->b", 1))
    assert next(m for m in reg.list_maps() if m["name"] == "a->b")["unreliable_versions"] == [2]
    # without a query count (older records): one split's are its pool (17 of 20 among 20 beats chance, 2 does not);
    # a cross-validated record's were every pair, not kept, so its figure is not judged again
    split = {"heldout_n_candidates": 20, "heldout_source": "held-out split of the fit"}
    assert reg.is_reliable(register(reg, seed=3, metrics={**split, "heldout_top1": 0.85}))
    assert not reg.is_reliable(register(reg, seed=6, metrics={**split, "heldout_top1": 0.1}))
    cv = {"heldout_top1": 0.08, "heldout_n_candidates": 60, "heldout_source": "5-fold cross-validation"}
    assert reg.is_reliable(register(reg, seed=7, metrics=cv))
    assert not reg.is_reliable(register(reg, seed=4, metrics={**good, "reliable": False}))
    v = reg.register_version("u", rotation_map(seed=5), source_space="a", target_space="b", method="minivec2vec",
                             params={}, metrics=chance)
    assert reg.is_reliable(v)


def test_a_refit_with_no_held_out_figure_cannot_be_compared_rather_than_looks_worse(reg):
    """After `eval --record` on m:1, a refit with no held-out figure (an unsupervised minivec2vec) made the note
    say m:2 "looks worse than" m:1; "looks worse" is a held-out top-1 lower by more than 0.05, and a version with
    no figure is not worse, only not comparable. The note says that; a lower held-out figure still looks worse."""
    v1 = register(reg, seed=1)
    for tag, value in (("eval.top1", "0.323"), ("eval.n_candidates", "1000"), ("eval.n_queries", "1000")):
        reg.set_tag(v1.name, v1.version, tag, value)
    before = reg.resolve_bare("a->b")
    v2 = reg.register_version("a->b", rotation_map(seed=2), source_space="a", target_space="b",
                              method="minivec2vec", params={}, metrics={"reliable": True})
    note = reg.default_change_note(before, v2)
    assert note.startswith("'a->b' now means a->b:2 (no 'prod' alias: its newest reliable version; no held-out "
                           "figure), which cannot be compared with a->b:1, which it meant until now (held-out top-1 "
                           "on 1,000 candidates 0.323)"), note
    assert "looks worse" not in note
    v3 = register(reg, seed=3, metrics={"heldout_top1": 0.5, "heldout_n_candidates": 1000, "heldout_n_queries": 1000})
    v4 = register(reg, seed=4, metrics={"heldout_top1": 0.3, "heldout_n_candidates": 1000, "heldout_n_queries": 1000})
    assert "which looks worse than a->b:3" in reg.default_change_note(v3, v4)


def test_a_refit_judged_among_fewer_candidates_is_not_called_worse_by_its_converted_figure(reg):
    """QA: a 500-pair refit scored 0.78 held out among its 100-candidate folds, put on 1,000 by the independence
    model at 0.089, and the note said it "looks worse than" the version before (0.514 on 1,000); measured on 1,000
    it was 0.559. On 1,000 a figure from 100 candidates lies between that model's 0.089 and the measured 0.78: the
    note says the two cannot be compared as recorded and how to compare them; a figure whose every reading is
    lower still looks worse."""
    on_1000 = {"heldout_n_candidates": 1000, "heldout_n_queries": 1000}
    before = register(reg, seed=1, metrics={"heldout_top1": 0.514, **on_1000})
    folds = {"heldout_n_candidates": 100, "heldout_n_queries": 500}
    new = register(reg, seed=2, metrics={"heldout_top1": 0.78, **folds})
    assert reg.quality(new)[1] < 0.1  # the converted figure the note read
    note = reg.default_change_note(before, new)
    assert "looks worse" not in note and "put on 1,000" not in note, note
    assert "held-out top-1 0.780 among 100 candidates), which may be worse than a->b:1" in note, note
    assert "lie at 0.0" in note and "-0.780 and 0.514" in note and "cannot be compared as recorded" in note, note
    assert "vecbridge eval --map a->b:2 ... --record" in note and "vecbridge registry alias a->b prod 1" in note
    worse = register(reg, seed=3, metrics={"heldout_top1": 0.40, **folds})  # at most 0.40 on 1,000: below 0.464
    note = reg.default_change_note(before, worse)
    assert note is not None and "which looks worse than a->b:1" in note, note


@pytest.mark.parametrize("how", ["register", "import"])
def test_a_stop_right_after_an_artifact_is_renamed_into_place_leaves_no_orphan(reg, tmp_path, monkeypatch, how):
    """A Ctrl-C during the artifact folder's fsync (after the rename, before ``put_new`` returned) left the file it
    had just written: the caller lists what it stored for removal only once ``put_new`` returns. Now it is listed
    before the write, and removed with the rest."""
    from service.registry import core

    bundle = None
    if how == "import":
        src = open_registry(f"sqlite:///{tmp_path}/src.sqlite", tmp_path / "src-artifacts")
        register(src, seed=3)
        bundle = src.export(tmp_path / "bundle.zip")

    def stop(point):
        if point == "artifact_renamed":
            raise KeyboardInterrupt  # as the Ctrl-C in atomic_write's fsync_dir, the file already in place

    monkeypatch.setattr(core, "FAULT_HOOK", stop)
    with pytest.raises(KeyboardInterrupt):
        if how == "import":
            reg.import_(bundle)
        else:
            register(reg, seed=3)
    monkeypatch.setattr(core, "FAULT_HOOK", None)
    report = reg.verify()
    assert report["orphan_artifacts"] == [] and reg.store.all_relpaths() == set(), report


def test_a_replica_reading_another_artifact_folder_is_told_apart_from_a_lost_file(registry_url, tmp_path):
    """QA 4801: a replica with a data dir of its own on a shared registry reads versions whose files are in another
    folder: an ArtifactsElsewhereError (503) naming the cause, where it was a bare IntegrityError (500). One file lost
    from the shared folder stays an IntegrityError, and the folder still counts as the registry's."""
    from service.registry import ArtifactsElsewhereError
    from service.registry.entity import VERSION_TABLES, artifacts_elsewhere

    a = open_registry(registry_url, tmp_path / "artifacts")
    b = open_registry(registry_url, tmp_path / "replica" / "artifacts")
    try:
        for seed in range(3):
            register(a, seed=seed)
        a.register_steer("st", align.MeanShift(np.ones(8)), space="a")
        assert artifacts_elsewhere(a.db, a.store, VERSION_TABLES) is None
        assert "(4 of the 4 newest live versions' artifact files are not in" in artifacts_elsewhere(b.db, b.store,
                                                                                       VERSION_TABLES)
        with pytest.raises(ArtifactsElsewhereError, match="must share its artifact folder") as e:
            b.load_map("a->b:1")
        assert isinstance(e.value, IntegrityError) and str(e.value).startswith("artifact ")
        with pytest.raises(ArtifactsElsewhereError):
            b.load_steer("st")
        a.store.path(a.get_version("a->b", 2).artifact_path).unlink()  # lost: 1 of 4
        assert artifacts_elsewhere(a.db, a.store, VERSION_TABLES) is None
        with pytest.raises(IntegrityError, match="missing or unreadable") as e:
            a.load_map("a->b:2")
        assert not isinstance(e.value, ArtifactsElsewhereError)
    finally:
        a.close()
        b.close()


def test_a_foreign_folder_is_logged_when_the_verdict_turns_not_at_every_look(registry_url, tmp_path):
    """/readyz looks again at every probe while the folder is not the registry's; each look logged the same warning
    (a line every few seconds per replica under k8s probes). It is logged once when the verdict turns, and again
    after the folder was the registry's in between."""
    import shutil

    from service.registry.entity import VERSION_TABLES, artifacts_elsewhere

    a = open_registry(registry_url, tmp_path / "artifacts")
    b = open_registry(registry_url, tmp_path / "replica" / "artifacts")
    try:
        for seed in range(3):
            register(a, seed=seed)
        with logged("vecbridge.registry") as records:
            for _ in range(4):
                assert artifacts_elsewhere(b.db, b.store, VERSION_TABLES, keep_foreign=False) is not None
            shutil.copytree(a.store.root, b.store.root, dirs_exist_ok=True)
            assert artifacts_elsewhere(b.db, b.store, VERSION_TABLES, keep_foreign=False) is None
            shutil.rmtree(b.store.root)
            assert artifacts_elsewhere(b.db, b.store, VERSION_TABLES, keep_foreign=False) is not None
        said = [r.getMessage() for r in records if "does not hold the registry's artifacts" in r.getMessage()]
        assert len(said) == 2, said
    finally:
        a.close()
        b.close()


def test_a_read_artifact_ends_a_kept_foreign_folder_verdict(registry_url, tmp_path):
    """The verdict "this folder is not the registry's" was kept 30 s whatever happened: once the folder was put right,
    a file truly lost meanwhile was a 503 "replicas must share its artifact folder" (ArtifactsElsewhereError) instead
    of the 500 integrity error a lost file is. A successful read of an artifact ends the kept verdict at once."""
    import shutil

    from service.registry import ArtifactsElsewhereError

    a = open_registry(registry_url, tmp_path / "artifacts")
    b = open_registry(registry_url, tmp_path / "replica" / "artifacts")
    try:
        for seed in range(4):
            register(a, seed=seed)
        with pytest.raises(ArtifactsElsewhereError):
            b.load_map("a->b:1")  # the verdict is kept (VERDICT_S)
        shutil.copytree(a.store.root, b.store.root, dirs_exist_ok=True)  # the folder put right ...
        b.store.path(b.get_version("a->b", 4).artifact_path).unlink()  # ... but for one file, lost
        assert b.load_map("a->b:1").source_dim == 8  # read: the folder holds the registry's artifacts after all
        with pytest.raises(IntegrityError, match="missing or unreadable") as e:
            b.load_map("a->b:4")
        assert not isinstance(e.value, ArtifactsElsewhereError), e.value
    finally:
        a.close()
        b.close()


def test_a_lost_file_of_a_small_registry_stays_an_integrity_error_and_the_verdict_is_kept(registry_url, tmp_path):
    """QA 4803: "half or more of the newest missing" called one lost file of a registry of one or two live versions a
    foreign folder (/readyz 503 on every replica, its map's 500 a 503 "replicas must share"); it takes 3 missing now.
    A transform whose file is missing ran the sample query each time: the verdict is kept for 30 s (VERDICT_S), and
    the folder's path goes to the log, not into the message."""
    from service.registry import ArtifactsElsewhereError
    from service.registry.elsewhere import VERDICT_S, artifacts_elsewhere
    from service.registry.entity import VERSION_TABLES

    reg = open_registry(registry_url, tmp_path / "artifacts")
    try:
        register(reg, seed=0)
        reg.register_steer("st", align.MeanShift(np.ones(8)), space="a")
        reg.store.path(reg.get_version("a->b", 1).artifact_path).unlink()  # lost: 1 of the 2 live versions' files
        assert artifacts_elsewhere(reg.db, reg.store, VERSION_TABLES) is None
        with pytest.raises(IntegrityError, match="missing or unreadable") as e:
            reg.load_map("a->b:1")
        assert type(e.value) is IntegrityError, e.value
        reg.store.path(reg.get_steer("st", 1).artifact_path).unlink()  # 2 of 2: still too few to tell
        assert artifacts_elsewhere(reg.db, reg.store, VERSION_TABLES) is None
        register(reg, seed=1)
        reg.store.path(reg.get_version("a->b", 2).artifact_path).unlink()  # 3 of 3: the folder is not the registry's
        with pytest.raises(IntegrityError) as e:  # within VERDICT_S of the last look: the kept verdict, no query
            reg.load_map("a->b:2")
        assert type(e.value) is IntegrityError, e.value
        why = artifacts_elsewhere(reg.db, reg.store, VERSION_TABLES, max_age=VERDICT_S)
        assert why is None  # the kept one
        why = artifacts_elsewhere(reg.db, reg.store, VERSION_TABLES)  # a fresh look
        assert why.startswith("this data dir's artifact folder does not hold") and "(3 of the 3 newest" in why
        assert str(tmp_path) not in why
        with pytest.raises(ArtifactsElsewhereError) as e:  # the fresh verdict is the one kept now
            reg.load_map("a->b:1")
        assert str(tmp_path) not in str(e.value)
    finally:
        reg.close()
