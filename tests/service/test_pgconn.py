"""What vecbridge's PostgreSQL connections are given beside their URL (:mod:`service.pgconn`): its own settings after
the operator's options, which libpq takes from the URL, else a service file, else ``PGOPTIONS``; a connect timeout
unless one of those gives its own. Real sessions showing them: the registry's and the checkpoint's PostgreSQL
tests (test_pg_operations.py, test_pg_waits.py)."""

from __future__ import annotations

import pytest

from service.pgconn import option_settings, pg_connect_options
from service.registry import postgres

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
    assert pg_connect_options(URL) == {"connect_timeout": postgres.PG_CONNECT_TIMEOUT_S}
    assert pg_connect_options(URL + "?connect_timeout=4") == {}
    (tmp_path / "s.conf").write_text("[a]\nconnect_timeout=3\n[b]\nport=5433\n")
    monkeypatch.setenv("PGSERVICEFILE", str(tmp_path / "s.conf"))
    assert pg_connect_options(URL + "?service=a") == {}
    assert pg_connect_options(URL + "?service=b") == {"connect_timeout": postgres.PG_CONNECT_TIMEOUT_S}
    assert pg_connect_options(URL + "?service=unknown") == {}  # a file not read here may give one: libpq's to say
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "7")
    assert pg_connect_options(URL) == {}


def test_the_connect_timeout_is_the_registry_backends_one_setting(monkeypatch):
    """After the registry's db split the setting lived in postgres.py and was read through db.py's re-export: a
    change to postgres.PG_CONNECT_TIMEOUT_S (where the registry's other PostgreSQL settings are) never reached a
    connection. postgres.py is its one source."""
    monkeypatch.setattr(postgres, "PG_CONNECT_TIMEOUT_S", 3)
    assert pg_connect_options(URL) == {"connect_timeout": 3}


@pytest.mark.parametrize("value", ["", "10s", " "])
def test_a_connect_timeout_variable_libpq_cannot_read_is_not_taken_for_one(monkeypatch, value):
    """``PGCONNECT_TIMEOUT=`` or ``10s`` counted as given: no keyword was passed, libpq's parse of the variable
    failed (ProgrammingError, exit 3) where the registry opened before. Ours is passed (a keyword wins over it)."""
    monkeypatch.setenv("PGCONNECT_TIMEOUT", value)
    assert pg_connect_options(URL) == {"connect_timeout": postgres.PG_CONNECT_TIMEOUT_S}


def test_option_settings_reads_names_as_the_server_does():
    """``"statement_timeout" in options`` missed ``-c STATEMENT_TIMEOUT=4s`` / ``--statement-timeout=4s`` and
    counted ``-c application_name=statement_timeout_probe``: each setting's name, as the server reads it."""
    options = "-c STATEMENT_TIMEOUT=4s --statement-timeout=4s -cwork_mem=1MB -c application_name=statement_timeout -B 9"
    assert [name for name, _ in option_settings(options)] == [
        "statement_timeout", "statement_timeout", "work_mem", "application_name", None]  # -B takes "9"
    assert " ".join(text for _, text in option_settings(options)) == options


@pytest.mark.parametrize(("options", "read"), [
    ("-ec search_path=ops", [(None, "-e"), ("search_path", "-c search_path=ops")]),
    ("-eFcSEARCH_PATH=ops", [(None, "-e"), (None, "-F"), ("search_path", "-cSEARCH_PATH=ops")]),
    ("-e-search-path=ops", [(None, "-e"), ("search_path", "--search-path=ops")]),
    ("-S -c search_path=ops", [(None, "-S -c"), (None, "search_path=ops")]),  # -S takes the next word: refused
    ("-- -c search_path=ops", [(None, "--"), (None, "-c"), (None, "search_path=ops")]),  # "--" ends the switches
])
def test_option_settings_reads_bundled_switches_as_the_server_does(options, read):
    """The server reads ``options`` as a command line (getopt): ``-ec search_path=ops`` is ``-e`` then ``-c
    search_path=ops``, and a switch that takes a value takes the next word whatever it is. A bundled ``-c`` was not
    read as a setting: PGOPTIONS' search_path so written moved the registry to that schema, and a statement_timeout
    so written was overridden by the registry's. The server's own reading of each: test_pg_operations.py."""
    assert option_settings(options) == read


def test_a_bundled_search_path_is_left_out_and_the_switches_beside_it_kept(monkeypatch):
    monkeypatch.setenv("PGOPTIONS", "-ec search_path=ops -eS 4MB -clock_timeout=5s")
    assert pg_connect_options(URL, "-c x=1", drop=("search_path",))["options"] == (
        "-e -e -S 4MB -clock_timeout=5s -c x=1")


def test_the_operators_search_path_is_left_out_where_asked_and_the_rest_kept(monkeypatch):
    """The registry's schema comes from its ``?schema=`` only: an operator's search_path (however written) is left
    out, their other options kept; with nothing else of theirs or ours the keyword says "send nothing"."""
    monkeypatch.setenv("PGOPTIONS", "-c lock_timeout=5s --search-path=ops -cSEARCH_PATH=ops2")
    assert pg_connect_options(URL, "-c x=1", drop=("search_path",))["options"] == "-c lock_timeout=5s -c x=1"
    assert pg_connect_options(URL, "-c x=1")["options"] == (
        "-c lock_timeout=5s --search-path=ops -cSEARCH_PATH=ops2 -c x=1")
    monkeypatch.setenv("PGOPTIONS", "-c search_path=ops")
    assert pg_connect_options(URL, drop=("search_path",))["options"] == ""


def test_a_search_path_in_the_urls_own_options_is_the_callers_and_kept(monkeypatch):
    """A registry URL's ``options=-c search_path=vbs`` is where its schema is (as ``?schema=`` is): dropping it with
    PGOPTIONS' moved that registry to an empty ``public``. Only PGOPTIONS' and a service file's are left out."""
    monkeypatch.setenv("PGOPTIONS", "-c search_path=ops")
    url = URL + "?options=-c%20search_path%3Dvbs%20-c%20lock_timeout%3D5s"
    assert pg_connect_options(url, "-c x=1", drop=("search_path",))["options"] == (
        "-c search_path=vbs -c lock_timeout=5s -c x=1")


def test_a_name_of_backslashes_is_read_at_once():
    """``-c`` then a run of backslashes and no ``=``: the name pattern backtracked exponentially (0.9 s at 34 of them,
    ~7x per 4 more); read at once now, as no setting."""
    assert option_settings("-cx" + "\\" * 200) == [(None, "-cx" + "\\" * 200)]


def test_an_empty_options_sends_nothing_and_a_repeated_service_line_is_read_as_libpq_does(monkeypatch, tmp_path):
    """An empty ``options=`` (the URL's, the service entry's) is one given: libpq sends nothing, not PGOPTIONS;
    of a key written twice in a service entry libpq takes the first."""
    monkeypatch.setenv("PGOPTIONS", "-c lock_timeout=5s")
    assert pg_connect_options(URL + "?options=", "-c x=1")["options"] == "-c x=1"
    (tmp_path / "s.conf").write_text("[a]\noptions=\n[b]\noptions=-c work_mem=1MB\noptions=-c work_mem=2MB\n")
    monkeypatch.setenv("PGSERVICEFILE", str(tmp_path / "s.conf"))
    assert pg_connect_options(URL + "?service=a", "-c x=1")["options"] == "-c x=1"
    assert pg_connect_options(URL + "?service=b", "-c x=1")["options"] == "-c work_mem=1MB -c x=1"
