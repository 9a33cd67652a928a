"""A store URL with two slashes is a local path only when it clearly is one; a server's host may end in ".db".

The two-slash refusal rejected every URL whose part after ``://`` ended in ``.db``: ``milvus://milvus.db``,
``qdrant://qdrant.db``, ``milvus+https://milvus.db`` (a Kubernetes service ``milvus`` in namespace ``db``) were
"names a file", and since the settings check the URL at start-up, a service configured so did not start. Now a
path is refused when it starts with ./ ../ ~/, is a .db file in a folder, or is a .db file that exists here; a
port always marks a server. Such a Milvus host is opened as a server, never as a Milvus Lite file (pymilvus takes
any URI ending in .db for one and made ./http:/milvus.db/)."""

from __future__ import annotations

import pytest

from align.exceptions import InputError
from service.vectordb import VectorDBError, check_store_url, open_store

SERVERS = ["milvus://milvus.db", "qdrant://qdrant.db", "milvus+https://milvus.db", "milvus://user:pw@milvus.db",
           "milvus://docs.db", "milvus://db.example.com:19530/mydb", "qdrant+https://example.com/qdrant",
           "milvus://h:1", "milvus://h:19530/x.db", "qdrant://[::1]"]


@pytest.mark.parametrize("url", SERVERS)
def test_a_server_host_ending_in_db_is_a_server(url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert check_store_url(url)[0] == url.partition("://")[0]


@pytest.mark.parametrize("url", ["milvus://data/docs.db", "milvus+https://./docs.db", "qdrant://./q", "qdrant://../q",
                                 "qdrant://~/q", "milvus://u:p@data/docs.db"])
def test_a_clear_path_with_two_slashes_is_refused_naming_the_port(url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match="three slashes") as e:
        check_store_url(url)
    assert "host:port (its port marks it as one)" in str(e.value) and "u:p" not in str(e.value)


def test_a_bare_db_name_is_a_file_only_when_it_exists_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check_store_url("milvus://docs.db")
    (tmp_path / "docs.db").touch()
    with pytest.raises(InputError, match=r"names a file \(\./docs\.db exists here\)"):
        check_store_url("milvus://docs.db")
    check_store_url("milvus://docs.db:19530")  # a port: the server, file or not


@pytest.mark.parametrize("url", ["qdrant://data/q", "qdrant://data/q/", "qdrant://key-1@qdrant/prefix"])
def test_a_qdrant_host_and_path_without_a_port_is_refused_naming_both_forms(url, tmp_path, monkeypatch):
    """`qdrant://data/q` (meant: the folder ./data/q) was taken for the server data:6333 with the prefix /q, and
    answered "cannot connect to http://data/q" (exit 75: retry); the README documents qdrant://host:port and
    qdrant:///dir only. It is refused, naming the folder's form and the server's (a prefix after host:port), without
    the URL's user part; with a port, or TLS (no local form), it stays a server, and a Milvus path is its database."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match="has a path but no port") as e:
        check_store_url(url)
    host, _, prefix = url.rstrip("/").rpartition("@")[-1].removeprefix("qdrant://").partition("/")
    assert "qdrant:///ABSOLUTE/path (three slashes)" in str(e.value), str(e.value)
    assert f"qdrant://{host}:6333/{prefix}" in str(e.value) and "key-1" not in str(e.value), str(e.value)
    for server in ("qdrant://data:6333/q", "qdrant+https://example.com/qdrant", "qdrant://data", "milvus://data/q",
                   "milvus://data/docs"):
        check_store_url(server)


def test_a_milvus_host_ending_in_db_is_connected_to_not_made_a_lite_file(tmp_path, monkeypatch):
    pytest.importorskip("pymilvus")
    monkeypatch.chdir(tmp_path)
    for url, uri in (("milvus://milvus.db", "http://milvus.db/"),
                     ("milvus://127.0.0.1:19590/x.db", "http://127.0.0.1:19590/x.db/")):  # nothing listens there
        with pytest.raises(VectorDBError, match="cannot connect to " + uri.replace(".", r"\.")):
            open_store(url, timeout=2)
    assert list(tmp_path.iterdir()) == []  # was ./http:/milvus.db/ and ./http:/127.0.0.1:19590/ (Milvus Lite)
