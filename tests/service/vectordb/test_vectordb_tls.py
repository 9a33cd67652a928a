"""Secured vector databases: TLS (``milvus+https://``, ``qdrant+https://``), API keys and a private CA.

Milvus: the real Milvus Lite server behind a TLS-terminating proxy in this process (a self-signed certificate
made with ``openssl``; the proxy offers ALPN ``h2`` as a TLS-terminating load balancer in front of Milvus does),
so a whole migration runs over TLS. Qdrant: no Qdrant server ships as a wheel, so an HTTPS endpoint here answers
as a Qdrant server with ``service.api_key`` set answers ``GET /collections`` (the adapter's first request): 401
without the right ``api-key`` header, the empty collection list with it. It checks what the adapter sends (the
key, over TLS, checked against the CA file), not Qdrant itself.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import numpy as np
import pytest
from _servers import ROOT
from _vectordb_servers import milvus_url, small_migration  # noqa: F401  (module-scoped fixture)

from align.exceptions import InputError
from service.vectordb import VectorDBError, migrate, open_store

KEY = "s3cret-key-0123456789"


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    """``(cert.pem, key.pem)``: a self-signed certificate for 127.0.0.1 and localhost."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl (the command) is needed to make a test certificate")
    d = tmp_path_factory.mktemp("tls")
    crt, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(crt),
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True, timeout=60)
    return crt, key


def _server_context(cert, alpn) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    ctx.set_alpn_protocols(alpn)
    return ctx


class TLSProxy:
    """Accepts TLS on a loopback port and forwards the decrypted bytes to ``upstream`` (host, port)."""

    def __init__(self, cert, upstream):
        self.upstream, self.handshakes = upstream, 0
        self.ctx = _server_context(cert, ["h2"])
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                raw, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw):
        try:
            conn = self.ctx.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError):  # a client that does not trust the certificate hangs up here
            raw.close()
            return
        self.handshakes += 1
        up = socket.create_connection(self.upstream)

        def pump(a, b):
            try:
                while data := a.recv(65536):
                    b.sendall(data)
            except OSError:
                pass
            finally:
                for s in (a, b):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        threading.Thread(target=pump, args=(up, conn), daemon=True).start()
        pump(conn, up)

    def close(self):
        self.sock.close()


@pytest.fixture(scope="module")
def milvus_tls(cert, milvus_url):  # noqa: F811
    host, port = milvus_url.split("://", 1)[1].rsplit(":", 1)
    proxy = TLSProxy(cert, (host, int(port)))
    yield proxy
    proxy.close()


def test_a_migration_runs_over_tls_to_milvus(milvus_tls, cert, tmp_path):
    X, m = small_migration()
    url = f"milvus+https://127.0.0.1:{milvus_tls.port}"
    with open_store(url, ca_file=cert[0]) as s:
        for name in ("tls_src", "tls_dst"):
            s.drop(name)
        s.create("tls_src", X.shape[1])
        s.upsert("tls_src", np.arange(len(X)), X)
        rep = migrate(s, "tls_src", "tls_dst", m, batch_size=64)
        assert rep.rows == len(X) and s.count("tls_dst") == len(X)
        got = s.fetch("tls_dst", [0, 199]).vectors
        want = m.apply(X[[0, 199]], output="raw")
        assert np.allclose(got / np.linalg.norm(got, axis=1, keepdims=True),
                           want / np.linalg.norm(want, axis=1, keepdims=True), atol=1e-5)
        s.drop("tls_src")
        s.drop("tls_dst")
    assert milvus_tls.handshakes >= 1  # the rows crossed the TLS proxy, not a plain connection


def test_milvus_over_tls_with_an_untrusted_certificate_is_one_error(milvus_tls):
    # no ca_file: the system CAs do not know the self-signed certificate, so gRPC never connects
    with pytest.raises(VectorDBError, match="cannot connect") as e:
        open_store(f"milvus+https://root:Pa55word@127.0.0.1:{milvus_tls.port}", timeout=5)
    assert "Pa55word" not in str(e.value)


class _QdrantAuth(BaseHTTPRequestHandler):
    """``GET /collections`` and ``/aliases`` as a Qdrant server with ``service.api_key`` and nothing stored answers
    them (401 without the key, 404 for other paths)."""

    seen: ClassVar[list] = []

    def do_GET(self):  # the http.server API names it
        type(self).seen.append((self.path, self.headers.get("api-key")))
        ok = self.headers.get("api-key") == KEY
        path = self.path.split("?")[0]
        result = {"/collections": {"collections": []}, "/aliases": {"aliases": []}}.get(path)
        if not ok:
            status, body = 401, "Must provide an API key or an Authorization bearer token"
        elif result is None:
            status, body = 404, json.dumps({"status": {"error": f"Not found: {path}"}, "time": 0.0})
        else:
            status, body = 200, json.dumps({"result": result, "status": "ok", "time": 0.0})
        body = body.encode()
        self.send_response(status)
        self.send_header("content-type", "text/plain" if status == 401 else "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def qdrant_tls(cert):
    pytest.importorskip("qdrant_client")
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _QdrantAuth)
    srv.socket = _server_context(cert, ["http/1.1"]).wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"qdrant+https://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_qdrant_over_tls_sends_the_api_key(qdrant_tls, cert):
    _QdrantAuth.seen.clear()
    with open_store(qdrant_tls, api_key=KEY, ca_file=cert[0]) as s:
        assert not s.exists("docs")
    assert _QdrantAuth.seen and all(k == KEY for _, k in _QdrantAuth.seen)


def test_qdrant_wrong_or_missing_key_and_untrusted_certificate(qdrant_tls, cert):
    with pytest.raises(VectorDBError, match=r"refused the request \(401\): a wrong API key") as e:
        open_store(qdrant_tls, api_key="not-" + KEY, ca_file=cert[0])
    assert KEY not in str(e.value)
    with pytest.raises(VectorDBError, match="it needs an API key"):
        open_store(qdrant_tls, ca_file=cert[0])
    with pytest.raises(VectorDBError, match="cannot connect") as e:  # the system CAs do not know the certificate
        open_store(qdrant_tls, api_key=KEY)
    assert KEY not in str(e.value)


def test_the_cli_reads_the_key_and_ca_from_settings(qdrant_tls, cert, tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("not-" + KEY + "\n")
    env = {**os.environ, "VECBRIDGE_DATA_DIR": str(tmp_path / "var"), "VECBRIDGE_VECTORDB_URL": qdrant_tls,
           "VECBRIDGE_VECTORDB_API_KEY_FILE": str(key_file), "VECBRIDGE_VECTORDB_CA_FILE": str(cert[0])}
    env.pop("VECBRIDGE_VECTORDB_API_KEY", None)
    small_migration()[1].save(tmp_path / "m.npz")
    cmd = [sys.executable, "-m", "service.cli", "verify", "--collection", "docs", "--source", "docs_old",
           "--map", str(tmp_path / "m.npz")]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                       check=False)
    assert r.returncode == 2, r.stderr
    assert "refused the request (401): a wrong API key" in r.stderr and KEY not in r.stderr + r.stdout
    key_file.write_text(KEY + "\n")
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                       check=False)
    # the key got through: now the collection is what is missing
    assert r.returncode == 2 and "no collection or alias 'docs'" in r.stderr, r.stderr


@pytest.mark.parametrize("url, kw, match", [
    ("qdrant://user:pw@127.0.0.1:6333", {}, "takes no user or password"),
    ("qdrant+https:///tmp/q", {}, "local qdrant store takes no TLS"),
    ("milvus:///tmp/x.db", {"api_key": KEY}, "local milvus store takes no TLS, API key"),
    ("milvus+https://u:p@127.0.0.1:1", {"api_key": KEY}, "not both"),
    ("postgresql://u@127.0.0.1/db", {"api_key": KEY}, "sslmode"),
    ("qdrant://127.0.0.1:1", {"ca_file": "ca.pem"}, r"use qdrant\+https://"),
    ("milvus://127.0.0.1:1", {"ca_file": "ca.pem"}, r"use milvus\+https://"),
])
def test_store_urls_that_cannot_work_are_refused_before_connecting(url, kw, match):
    with pytest.raises(InputError, match=match) as e:
        open_store(url, **kw)
    assert KEY not in str(e.value)


def test_a_ca_file_that_is_missing_or_not_pem_is_named(tmp_path):
    pytest.importorskip("qdrant_client")
    with pytest.raises(InputError, match="CA file .*missing.pem"):
        open_store("qdrant+https://127.0.0.1:1", ca_file=tmp_path / "missing.pem")
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    with pytest.raises(InputError, match="no PEM certificate"):
        open_store("qdrant+https://127.0.0.1:1", ca_file=bad)


def test_unknown_schemes_list_the_secured_ones():
    with pytest.raises(VectorDBError, match=r"qdrant\+https://"):
        open_store("qdrants://127.0.0.1:6333")


def test_the_api_key_setting_is_a_secret(monkeypatch, tmp_path):
    from service.config import ConfigError, load_settings

    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    monkeypatch.setenv("VECBRIDGE_VECTORDB_API_KEY_FILE", str(key_file))
    assert load_settings().vectordb_api_key == KEY  # a Docker / Kubernetes secret file, trailing newline dropped
    monkeypatch.setenv("VECBRIDGE_VECTORDB_API_KEY", KEY)
    with pytest.raises(ConfigError, match="VECBRIDGE_VECTORDB_API_KEY") as e:  # both given: refused
        load_settings()
    assert KEY not in str(e.value)
