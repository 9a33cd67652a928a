"""A PostgreSQL URL whose password holds an unescaped ``@``: libpq ends the user part at the first ``@``, so for
``alice:S3C@RET@127.0.0.1`` it connected to the host ``RET@127.0.0.1`` and its error ("failed to resolve host
'RET@127.0.0.1'") put the rest of the password in the unauthenticated /readyz, the logs and the CLI. Such a URL is
refused before libpq reads it (write ``@`` as ``%40``), and libpq's connect errors are scrubbed of the password."""

from __future__ import annotations

import subprocess
import sys

import pytest
from _servers import ROOT, env_for, free_port
from hypothesis import given, settings
from hypothesis import strategies as st

URL = "postgresql://alice:{}@127.0.0.1:1/vb"
#: passwords with raw "@"s, and the pieces of each that must never be shown
BAD = {"S3C@RET": ("S3C@RET", "RET@", "'RET", "S3C"), "a@b@c": ("a@b@c", "b@c", "'c@", "c@127"),
       "Xq7@Zk9@Wm2": ("Xq7", "Zk9", "Wm2")}


def _no_piece(text: str, password: str) -> None:
    for piece in BAD[password]:
        assert piece not in text, (piece, text)


@pytest.mark.parametrize("password", list(BAD))
def test_a_registry_url_with_a_raw_at_in_its_password_is_refused_without_any_piece_of_it(password, tmp_path,
                                                                                       capsys):
    from service.cli import main
    from service.config import ConfigError, load_settings
    from service.registry import open_registry
    from service.registry.errors import InvalidNameError

    url = URL.format(password)
    with pytest.raises(InvalidNameError, match="%40") as err:  # was RegistryUnavailableError naming host 'RET@...'
        open_registry(url, tmp_path / "a")
    _no_piece(str(err.value), password)
    with pytest.raises(ConfigError, match="VECBRIDGE_REGISTRY_URL.*%40") as err:
        load_settings(registry_url=url)
    _no_piece(str(err.value), password)
    assert main(["--data-dir", str(tmp_path / "v"), "--registry-url", url, "registry", "list"]) == 2
    got = capsys.readouterr()
    assert "%40" in got.err, got
    _no_piece(got.err + got.out, password)


def test_serve_with_such_a_registry_url_does_not_start(tmp_path):
    """It started and its /readyz, which answers without a key, said "failed to resolve host 'pw9@127.0.0.1'"."""
    port = free_port()
    env = env_for(tmp_path / "var", port)
    cmd = [sys.executable, "-m", "service.cli", "serve", "--registry-url", URL.format("S3C@RET"), "--port", str(port)]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 2 and "%40" in r.stderr, r
    _no_piece(r.stderr + r.stdout, "S3C@RET")


@pytest.mark.parametrize("password", list(BAD))
def test_a_vector_database_url_with_a_raw_at_in_its_password_is_refused_too(password):
    pytest.importorskip("psycopg")
    from align.exceptions import InputError
    from service.vectordb import PgVectorStore, open_store

    for opener in (open_store, PgVectorStore):  # was "pgvector: cannot connect: failed to resolve host 'RET@..."
        with pytest.raises(InputError, match="%40") as err:
            opener(URL.format(password))
        _no_piece(str(err.value), password)


@pytest.mark.parametrize("password", list(BAD))
def test_libpq_connect_errors_are_scrubbed_of_every_piece_of_the_password(password):
    """The second line of defence, on libpq's own message for such a URL (the checks above keep it from libpq)."""
    psycopg = pytest.importorskip("psycopg")
    from service.vectordb.base import redact

    url = URL.format(password)
    with pytest.raises(psycopg.OperationalError) as err:
        psycopg.connect(url, connect_timeout=5)
    assert password.split("@", 1)[1] + "@" in str(err.value)  # what libpq reads as the host: the leak
    _no_piece(redact(str(err.value), url), password)


def _with_password(pg_url: str) -> str:
    url = pg_url.replace("postgres@", "postgres:p%40ss@", 1)
    assert url != pg_url
    return url


@pytest.mark.postgres
def test_an_at_written_as_percent_40_reaches_the_server(pg_url, tmp_path):
    from service.registry import open_registry
    from service.registry.db import pg_conninfo

    url = _with_password(pg_url)
    assert pg_conninfo(url)["password"] == "p@ss"
    reg = open_registry(url, tmp_path / "a")
    try:
        assert reg.list_maps() == []
    finally:
        reg.close()


@pytest.mark.postgres
def test_an_at_written_as_percent_40_reaches_the_vector_database(pg_url):
    psycopg = pytest.importorskip("psycopg")
    pytest.importorskip("pgvector")
    from service.vectordb import open_store

    with psycopg.connect(pg_url) as c:
        if not c.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone():
            pytest.skip("the test server has no pgvector extension")
    with open_store(_with_password(pg_url)) as store:
        assert not store.exists("nothing_here")


#: passwords with a raw "/": libpq ends the host at the first "/", so "alice:S3C/RET@127.0.0.1" was the host "alice",
#: port "S3C", database "RET@127.0.0.1..." ("failed to resolve host 'alice'", or a connection to a host "alice")
SLASHED = {"S3C/RET": ("S3C", "RET"), "5432/Zk9": ("Zk9", "5432/"), "Xq7@Zk9/Wm2": ("Xq7", "Zk9", "Wm2")}


@pytest.mark.parametrize("password", list(SLASHED))
def test_a_url_with_a_raw_slash_in_its_password_is_refused_naming_the_escape(password, tmp_path, capsys):
    from align.exceptions import InputError
    from service.cli import main
    from service.config import ConfigError, load_settings
    from service.registry import open_registry
    from service.registry.errors import InvalidNameError
    from service.vectordb import open_store

    url = URL.format(password)
    errors = []
    with pytest.raises(InvalidNameError, match="%2F") as err:  # was RegistryUnavailableError: host 'alice'
        open_registry(url, tmp_path / "a")
    errors.append(str(err.value))
    with pytest.raises(ConfigError, match="VECBRIDGE_REGISTRY_URL.*%2F") as err:
        load_settings(registry_url=url)
    errors.append(str(err.value))
    if pytest.importorskip("psycopg"):
        with pytest.raises(InputError, match="%2F") as err:
            open_store(url)
        errors.append(str(err.value))
    assert main(["--data-dir", str(tmp_path / "v"), "--registry-url", url, "registry", "list"]) == 2
    got = capsys.readouterr()
    assert "%2F" in got.err and "host 'alice'" not in " ".join(errors) + got.err, (errors, got)
    for piece in SLASHED[password]:
        assert piece not in " ".join(errors) + got.err + got.out, piece


def test_escaped_slashes_and_query_parameters_with_an_at_are_still_accepted():
    from service.config import load_settings

    for url in ("postgresql://vb:p%2Fss@db/vb", "postgresql://vb@db/vb?application_name=a@b",
                "postgresql:///vb?host=/run/postgresql", "postgresql://db/vb"):
        assert load_settings(registry_url=url).registry_url == url


def test_the_client_key_password_is_hidden_as_the_password_is():
    """libpq's ``sslpassword=`` (it unlocks the client's TLS key) was left in the URL a resume command records and
    prints; it is hidden as ``password=`` is, and counted among the URL's secrets."""
    from service.urls import safe_url, url_secrets

    url = "postgresql://vb:pw@db/vb?sslmode=verify-full&sslpassword=k3y%21pw&sslkey=/k/client.key"
    shown = safe_url(url)
    assert "k3y" not in shown and "sslpassword=***" in shown and "sslkey=/k/client.key" in shown, shown
    assert {"k3y%21pw", "k3y!pw", "pw"} <= set(url_secrets(url))


@pytest.mark.parametrize("name", ["pass%77ord", "%70assword", "ssl%70assword", "sslpass%77%6Frd"])
def test_a_password_parameter_whose_name_is_percent_encoded_is_hidden_too(name):
    """libpq decodes a parameter's name as it does its value: ``?pass%77ord=s3cr3t`` is sent as the password, but the
    URL was shown with it (a resume command, an error naming the URL), since only ``password=`` as written was
    hidden."""
    from psycopg.conninfo import conninfo_to_dict

    from service.urls import redact, safe_url, url_secrets

    url = f"postgresql://vb@db/vb?sslmode=require&{name}=s3cr3t%21&application_name=a"
    key = "sslpassword" if name.startswith("ssl") else "password"
    assert conninfo_to_dict(url)[key] == "s3cr3t!"  # what libpq is given
    assert safe_url(url) == f"postgresql://vb@db/vb?sslmode=require&{name}=***&application_name=a"
    assert {"s3cr3t%21", "s3cr3t!"} <= set(url_secrets(url))
    assert "s3cr3t" not in redact(f"invalid value 's3cr3t!' in {url}", url)


def test_a_password_parameter_with_a_question_mark_is_hidden_whole():
    """libpq takes ``password=s3?cr3t`` whole; the scanner stopped the value at the ``?``: the URL was shown as
    ``password=***?cr3t`` and only ``s3`` counted as a secret. A ``?password=`` inside another parameter's value
    is still found."""
    from psycopg.conninfo import conninfo_to_dict

    from service.urls import redact, safe_url, url_secrets

    url = "postgresql://vb@db/vb?password=s3?cr3t&sslmode=require"
    assert conninfo_to_dict(url)["password"] == "s3?cr3t"
    assert safe_url(url) == "postgresql://vb@db/vb?password=***&sslmode=require"
    assert url_secrets(url) == ["s3?cr3t"]
    assert "cr3t" not in redact(f"bad password 's3?cr3t' for {url}", url)
    nested = "postgresql://vb@db/vb?application_name=a?password=zz9&sslmode=require"
    assert safe_url(nested) == "postgresql://vb@db/vb?application_name=a?password=***&sslmode=require"
    assert url_secrets(nested) == ["zz9"]


@pytest.mark.parametrize("url, secret", [
    ("host=127.0.0.1 port={port} user=vb password=s3cr3t dbname=vb", "s3cr3t"),
    ("host=127.0.0.1 port={port} user=vb password='s3 cr3t' dbname=vb", "cr3t"),
    ("postgresql://vb:s3/cr3t@127.0.0.1:{port}/vb", "cr3t"),
])
def test_a_checkpoint_that_cannot_connect_names_its_target_without_the_password(url, secret):
    """``pg_connect``'s error named ``safe_url(url)``, which hid no password of a libpq conninfo string nor of a
    user part with a raw ``/`` (libpq reads ``vb:s3/cr3t@db`` as host ``vb``, port ``s3``): both were printed. It
    names user@host:port/dbname from libpq's parse now, with every password piece hidden."""
    from service.vectordb.base import VectorDBError, pg_connect

    url = url.format(port=free_port())  # nothing listens there
    with pytest.raises(VectorDBError) as err:
        pg_connect(url, "migration checkpoint", "start it")
    assert secret not in str(err.value) and "s3" not in str(err.value), err.value
    assert "127.0.0.1" in str(err.value) or "vb:***@" in str(err.value), err.value


def test_a_short_piece_of_a_password_is_hidden_as_a_word_not_inside_every_word():
    """A password with a raw ``/`` (``a/bcdefgh``) is split by libpq (the piece before it read as the port), so
    its pieces are secrets too; a one-letter piece was replaced inside every word of the message ("c***nnot
    connect", "inv***lid"). A short piece is hidden where it stands as a word of its own; long ones everywhere."""
    from service.urls import redact

    url = "postgresql://vb:a/bcdefgh@127.0.0.1:5432/vb"
    got = redact('cannot connect to vb@vb:a/bcdefgh@127.0.0.1: invalid port number "a"', url)
    assert got == 'cannot connect to vb@vb:***@127.0.0.1: invalid port number "***"', got
    assert redact("the wrong password for vbcdefghx", url) == "the wrong password for v***x"


@pytest.mark.parametrize(("url", "secret"), [
    ("postgresql://vb@db/vb?password=abc#SecretTail99&sslmode=require", "SecretTail99"),
    ("postgresql://vb@db/vb?sslpassword=k#ey2Tail", "ey2Tail"),
    ("postgresql://vb:S3cr/et?xyzTail@127.0.0.1:5432/vb", "xyzTail"),
])
def test_a_password_holding_a_hash_or_a_slash_then_a_question_mark_is_hidden_whole(url, secret):
    """libpq keeps a ``#`` inside a parameter's value (no fragments), and a user part with a raw ``/`` then ``?``
    runs to its ``@``: ``safe_url`` showed ``password=***#SecretTail99`` and the whole ``S3cr/et?xyz`` (the
    migration checkpoint records and prints the registry URL so)."""
    from service.pgconn import pg_target
    from service.urls import redact, safe_url

    assert secret not in safe_url(url) and secret not in pg_target(url), (safe_url(url), pg_target(url))
    assert secret not in redact(f"could not connect with {url}", url)


@pytest.mark.parametrize("conninfo", ["host=127.0.0.1 port=5432 password='abc defSecret99 dbname=vb",
                                      "host=127.0.0.1 port=5432 password=abc\\ defSecret99 dbname='vb"])
def test_a_connection_string_libpq_cannot_parse_is_not_shown(conninfo):
    """An unclosed quote or an escaped space: the password scanner found only its first word, and the error named
    the rest (``password=*** defSecret99``); a conninfo string that cannot be parsed is not shown at all."""
    from service.pgconn import pg_target

    assert "Secret99" not in pg_target(conninfo) and "not shown" in pg_target(conninfo), pg_target(conninfo)


def test_a_checkpoint_url_with_a_raw_at_in_its_user_part_is_refused_before_connecting():
    """``alice@corp:S3cretPw@host``: libpq read ``corp:S3cretPw@host`` as the host and the checkpoint's connect error
    named it, password and all; refused as the registry and the pgvector store refuse it, before any connection."""
    from align.exceptions import InputError
    from service.vectordb.checkpoint import PgCheckpoint

    with pytest.raises(InputError) as err:
        PgCheckpoint(f"postgresql://alice@corp:S3cretPw@127.0.0.1:{free_port()}/vb", "a->b")
    assert "S3cretPw" not in str(err.value) and "%40" in str(err.value), err.value


@pytest.mark.parametrize(("url", "password", "pieces"), [
    ("postgresql://vb:k9/Qz?x=7Lm@127.0.0.1:5432/vb", "k9/Qz?x=7Lm", ("k9", "Qz", "7Lm")),
    ("postgresql://:A/F?JNC=@db.internal", "A/F?JNC=", ("A/", "F?", "JNC")),
    ("postgresql://vb:pX@sY?wQ=rZ@127.0.0.1/vb", "pX@sY?wQ=rZ", ("X", "Y", "Q", "Z")),
    ("postgresql://alice@corp:Pa?ss=woRD@db/vb", "Pa?ss=woRD", ("Pa", "ss=", "RD")),
    ("postgresql://vb:PwQ@dbX.internal?application_name=aZ@b", "PwQ@dbX.internal?application_name=aZ", ("Q", "X", "Z")),
    ("postgresql://vb:S3C@RET@127.0.0.1:5432/vb?application_name=aZ@b", "S3C@RET@127.0.0.1:5432/vb?application_name=aZ",
     ("S3C", "RET", "Z")),
    ("postgresql://db:5433/vb?password=aQ@bZ", "aQ@bZ", ("Q", "Z")),
])
def test_an_at_after_the_password_hides_all_before_it_rather_than_a_piece_of_a_password(url, password, pieces):
    """Which ``@`` ends the user part cannot be told when a raw ``@``, ``/``, ``?`` or ``=`` may be the password's:
    ``vb:k9/Qz?x=7Lm@host`` (the user part could not cross ``?x=``) and ``:A/F?JNC=@db`` were shown whole,
    ``vb:pX@sY?w=rZ@host`` as ``vb:***@sY?w=rZ@host``, ``alice@corp:Pa?ss=woRD@db`` whole, and the tail of a
    ``password=aQ@bZ`` after its ``@``. The user part now runs to the last ``@``: the host may be hidden (it is, when
    a query parameter holds an ``@``: ``application_name=aZ@b``), never a piece of a password."""
    from service.pgconn import pg_target
    from service.urls import redact, safe_url, url_secrets

    assert password in url_secrets(url), url_secrets(url)
    for text in (safe_url(url), pg_target(url), redact(f"cannot connect with {url}", url), _libpq_said(url)):
        assert not any(piece in text for piece in pieces), text


def _libpq_said(url: str) -> str:
    """libpq's parse error for ``url``, as :func:`service.urls.redact` shows it ("" when libpq takes it): libpq
    names what it cannot read (``invalid URI query parameter: "w"`` for ``vb:p@ss?w=rd@db``, a piece of the
    password)."""
    from psycopg.conninfo import conninfo_to_dict

    from service.urls import redact

    try:
        conninfo_to_dict(url)
    except Exception as exc:  # noqa: BLE001 - psycopg's ProgrammingError
        return redact(str(exc), url)
    return ""


@pytest.mark.parametrize("url", ["postgresql://vb:k9/Qz?x=7Lm@127.0.0.1:5432/vb", "postgresql://:A/F?JNC=@db",
                                 "postgresql://alice@corp:Pa?ss=word@127.0.0.1:5432/vb"])
def test_a_url_whose_port_is_a_piece_of_the_password_is_refused_before_connecting(url):
    """libpq reads ``vb:k9/Qz?x=7Lm@host`` as the host ``vb``, port ``k9``, then a query, and ``alice@corp:Pa?ss=..``
    as the host ``corp``, port ``Pa``: a port that is no number, with an ``@`` after it, is a raw ``/`` or ``@`` in the
    user part (libpq refuses such a port anyway, quoting it); refused naming the escape, as the other shapes are."""
    from align.exceptions import InputError
    from service.urls import check_pg_userinfo

    with pytest.raises(InputError, match="%2F|%40"):
        check_pg_userinfo(url)
    for fine in ("postgresql://db.internal:5433/vb?application_name=a@b", "postgresql://[::1]:5432,h2/vb?x=a@b",
                 "postgresql://vb:pw@db:5432?application_name=a@b"):
        assert check_pg_userinfo(fine) == fine


def test_a_conninfo_string_with_a_url_in_a_value_hides_its_password():
    """A ``://`` anywhere (``application_name=http://x``) made it a URL: its ``password=`` was shown, and an ``@``
    after it was refused as a raw ``@`` in a user part it has not."""
    from service.urls import check_pg_userinfo, redact, safe_url, url_secrets

    conninfo = "host=db application_name=http://x password=S3cretPw"
    assert safe_url(conninfo) == "host=db application_name=http://x password=***"
    assert url_secrets(conninfo) == ["S3cretPw"]
    assert "S3cretPw" not in redact(f"failed: {conninfo}", conninfo)
    at = "host=db application_name=http://a@b@c password=S3cretPw"
    assert check_pg_userinfo(at) == at and safe_url(at) == "host=db application_name=http://a@b@c password=***"


#: a password's alphabet: what ends a user part, host, port or query for libpq, and letters nothing else in the URLs
#: below nor libpq's messages hold: any of them shown is a piece of the password
_LETTERS = "QXZJKW"
_HOSTILE = "@:/?#=%&" + _LETTERS


@settings(max_examples=300, deadline=None)
@given(password=st.text(_HOSTILE, min_size=1, max_size=12).filter(lambda p: any(c in _LETTERS for c in p)),
       user=st.sampled_from(["postgresql://vb", "postgresql://alice@corp"]),
       query=st.sampled_from(["", "?sslmode=disable", "?application_name=a@b"]))
def test_no_password_is_ever_shown_even_in_part(password, user, query):
    """Nor by libpq's own parse error, where it refuses the URL."""
    from service.pgconn import pg_target
    from service.urls import redact, safe_url

    url = f"{user}:{password}@db.internal:5432/vb{query}"
    for text in (safe_url(url), pg_target(url), redact(f"cannot connect with {url}", url), _libpq_said(url)):
        assert not any(c in _LETTERS for c in text), text


@pytest.mark.parametrize(("url", "pieces"), [
    ("postgresql://alice@corp:S3cretPw@127.0.0.1:5432/vb", ("S3cretPw",)),
    ("postgresql://vb:s3/cr@3tTail@127.0.0.1:5432/vb", ("cr@", "3tTail")),
    ("postgresql://vb:S3C@R?TailX@127.0.0.1:5432/vb", ("R?T", "TailX")),
])
def test_a_raw_at_in_the_user_part_is_still_never_half_shown(url, pieces):
    """A raw ``@`` in the user name (``alice@corp:S3cretPw@host``) showed the whole password, and one after a raw
    ``/`` in it (``s3/cr@3tTail``) its tail: the user part runs to the last ``@`` before the host libpq reads, past
    a ``?`` that starts no parameter (``R?TailX``): the host after the last ``@`` is still shown."""
    from service.pgconn import pg_target
    from service.urls import redact, safe_url

    for text in (safe_url(url), pg_target(url), redact(f"cannot connect with {url}", url)):
        assert "127.0.0.1" in text and not any(piece in text for piece in pieces), text


@pytest.mark.parametrize("url", ["postgresql://pg.example.com:5432/vb?user=alice@corp&sslmode=require",
                                 "postgresql://db.internal:5433/vb?application_name=a@b",
                                 "postgresql://[::1]:5432/vb?application_name=a@b",
                                 "postgresql://h1:5432,h2:5433/vb?application_name=x@y"])
def test_a_url_with_no_user_part_is_shown_as_it_is_though_its_query_holds_an_at(url):
    """The last-``@`` rule hid parts of URLs that hold no password at all (an ``@`` in a ``user=`` or
    ``application_name=`` parameter): ``pg.example.com:5432/vb?user=alice@corp`` was shown as
    ``pg.example.com:***@corp``, and a migration checkpoint recorded that as its resume command's registry. A URL
    whose authority is hosts with numeric ports, with no ``@`` before its query, and which libpq parses, has no user
    part: it is shown as it is."""
    from service.urls import safe_url, url_secrets

    assert safe_url(url) == url and url_secrets(url) == []


@pytest.mark.parametrize("url", ["postgresql://vb:ab@[Longpiece?Secret@[::1]:5432/vb",
                                 "postgresql://vb:ab@[SecretPart@[::1]:5432/vb"])
def test_a_bracket_in_a_password_is_refused_before_libpq_quotes_a_piece_of_it(url):
    """libpq reads a bracketed host to its ``]`` whatever is inside: ``vb:ab@[Longpiece?Secret@[::1]`` connected to
    the host ``Longpiece?Secret@[::1`` and its error quoted it (a piece of the password, with ``ab``). Such a URL is
    refused, naming the fix, without repeating the URL; a real IPv6 host is not."""
    from align.exceptions import InputError
    from service.urls import check_pg_userinfo

    with pytest.raises(InputError, match="%5B") as err:
        check_pg_userinfo(url)
    assert "Secret" not in str(err.value)
    for ok in ("postgresql://u:p@[fe80::1%25eth0]:5432/vb", "postgresql://u:p@[::1]:5432,[::2]:5433/vb"):
        assert check_pg_userinfo(ok) == ok


def test_a_conninfo_password_with_an_escaped_space_is_hidden_whole():
    """libpq reads ``password=abc\\ defSecret`` as ``abc defSecret``: the value stopped at the space, so
    ``safe_url`` showed ``password=*** defSecret`` and ``redact`` hid only ``abc\\``."""
    from psycopg.conninfo import conninfo_to_dict

    from service.urls import redact, safe_url

    conninfo = r"host=db password=abc\ defSecret dbname=vb"
    assert conninfo_to_dict(conninfo)["password"] == "abc defSecret"
    assert safe_url(conninfo) == "host=db password=*** dbname=vb"
    assert "defSecret" not in redact("authentication failed for password abc defSecret", conninfo)
