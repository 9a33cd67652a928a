"""What vecbridge's PostgreSQL connections are given beside their URL (:mod:`service.pgconn`): its own settings after
the operator's options, which libpq takes from the URL, else a service file, else ``PGOPTIONS``; a connect timeout
unless one of those gives its own. Real sessions showing them: the registry's and the checkpoint's PostgreSQL
tests (test_pg_operations.py, test_pg_waits.py)."""

from __future__ import annotations

import pytest

from service.pgconn import pg_connect_options
from service.registry import db

pytest.importorskip("psycopg")

URL = "postgresql://vb@db.example:5432/vb"


@pytest.fixture(autouse=True)
def _no_operator_settings(monkeypatch, tmp_path):
    for name in ("PGOPTIONS", "PGSERVICE", "PGSYSCONFDIR", "PGCONNECT_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PGSERVICEFILE", str(tmp_path / "none.conf"))


def test_our_settings_follow_the_operators_options_wherever_libpq_would_have_read_them(monkeypatch, tmp_path):
    """An options keyword replaces the URL's, a service file's and PGOPTIONS': each is sent first, ours after."""
    ours = ("-c search_path=vbs", "-c statement_timeout=30000")
    assert pg_connect_options(URL, *ours)["options"] == " ".join(ours)
    assert "options" not in pg_connect_options(URL)  # nothing of ours: libpq's own choice is left alone
    monkeypatch.setenv("PGOPTIONS", "-c lock_timeout=5s")
    assert pg_connect_options(URL, *ours)["options"] == "-c lock_timeout=5s " + " ".join(ours)
    (tmp_path / "s.conf").write_text("[a]\noptions=-c work_mem=64MB\n\n[b]\nconnect_timeout=3\n")
    monkeypatch.setenv("PGSERVICEFILE", str(tmp_path / "s.conf"))
    assert pg_connect_options(URL + "?service=a", ours[0])["options"] == "-c work_mem=64MB " + ours[0]
    assert pg_connect_options(URL + "?service=b", ours[0])["options"] == "-c lock_timeout=5s " + ours[0]
    monkeypatch.setenv("PGSERVICE", "a")
    assert pg_connect_options(URL + "?options=-c%20geqo%3Doff", ours[0])["options"] == "-c geqo=off " + ours[0]


def test_the_connect_timeout_is_left_to_whatever_gives_one(monkeypatch, tmp_path):
    assert pg_connect_options(URL) == {"connect_timeout": db.PG_CONNECT_TIMEOUT_S}
    assert pg_connect_options(URL + "?connect_timeout=4") == {}
    (tmp_path / "s.conf").write_text("[a]\nconnect_timeout=3\n[b]\nport=5433\n")
    monkeypatch.setenv("PGSERVICEFILE", str(tmp_path / "s.conf"))
    assert pg_connect_options(URL + "?service=a") == {}
    assert pg_connect_options(URL + "?service=b") == {"connect_timeout": db.PG_CONNECT_TIMEOUT_S}
    assert pg_connect_options(URL + "?service=unknown") == {}  # a file not read here may give one: libpq's to say
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "7")
    assert pg_connect_options(URL) == {}
