"""A PostgreSQL registry in a database shared with other applications: its own schema (``?schema=``), and
tables of the same names that vecbridge did not create are refused, never written to.

The registry's tables have plain names (``spaces``, ``maps``, ``versions``, ``tags``...). In a database where
another application already had a ``versions`` table, ``CREATE TABLE IF NOT EXISTS`` kept that table and
the registry failed later with a raw SQL error on its first write (or read someone else's rows).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_cli

import align
from service.errors import exit_code, http_status
from service.registry import ConflictError, InvalidNameError, open_registry

pytestmark = pytest.mark.postgres


def _tables(pg_url: str, schema: str) -> set[str]:
    import psycopg

    with psycopg.connect(pg_url) as c:
        return {r[0] for r in c.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,))}


def test_schema_in_the_url_keeps_registries_apart(pg_url, tmp_path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 4)).astype(np.float32)
    a = open_registry(pg_url + "?schema=team_a", tmp_path / "a")
    b = open_registry(pg_url + "?schema=team_b&connect_timeout=10", tmp_path / "b")  # other parameters pass
    a.register_space("s", 4)
    a.register_space("t", 4)
    a.register_version("m", align.fit_procrustes(X, X), source_space="s", target_space="t", method="procrustes",
                       params={})
    assert [s.name for s in a.list_spaces()] == ["s", "t"] and b.list_spaces() == []
    assert [m["name"] for m in a.list_maps()] == ["m"] and b.list_maps() == []
    a.close()
    b.close()
    assert {"spaces", "maps", "versions", "aliases", "tags"} <= _tables(pg_url, "team_a")
    assert "versions" not in _tables(pg_url, "public")  # nothing in the default schema
    again = open_registry(pg_url + "?schema=team_a", tmp_path / "a")  # the schema exists now: reopened as is
    assert [m["name"] for m in again.list_maps()] == ["m"]
    again.close()


@pytest.mark.parametrize("bad", ["Team", "a-b", "x;drop", "", "a" * 64])
def test_bad_schema_names_are_refused(pg_url, tmp_path, bad):
    with pytest.raises(InvalidNameError, match="schema"):
        open_registry(f"{pg_url}?schema={bad}", tmp_path / "a")


def test_tables_another_application_made_are_refused(pg_url, tmp_path, capsys):
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute("CREATE TABLE versions (id SERIAL PRIMARY KEY, release TEXT NOT NULL)")
        c.execute("INSERT INTO versions (release) VALUES ('2.4.1')")
    with pytest.raises(ConflictError, match=r"versions.*\?schema=") as exc:
        open_registry(pg_url, tmp_path / "a")
    assert http_status(exc.value) == 409 and exit_code(exc.value) != 3  # a user error, not an internal one
    assert _tables(pg_url, "public") == {"versions"}  # nothing created beside it, its row untouched
    with psycopg.connect(pg_url) as c:
        assert c.execute("SELECT release FROM versions").fetchall() == [("2.4.1",)]
    code, _, err = run_cli(capsys, "--data-dir", tmp_path / "d", "--registry-url", pg_url, "registry", "list")
    assert code not in (0, 3) and "?schema=" in err and "Traceback" not in err
    reg = open_registry(pg_url + "?schema=vecbridge", tmp_path / "a")  # what the message says works
    reg.register_space("s", 4)
    reg.close()
