"""HTTP/1.1 on the wire, against a real ``vecbridge serve`` and raw sockets: how long an idle kept-alive connection
lasts, what a request whose body is encoded (``Content-Encoding``, ``Transfer-Encoding``) gets, how a body over the
limit sent chunked ends its connection, the answer to a request the HTTP parser itself refuses, and how a client
still sending the body of a request already refused reads that answer (the lingering close) within bounds."""

from __future__ import annotations

import gzip
import http.client
import json
import signal
import socket
import sys
import time

import numpy as np
import pytest
from _api_support import W
from _servers import env_for, seed_registry, start, start_on_free_port, stop

KEY = b"Authorization: " + W["Authorization"].encode()


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wire")
    seed_registry(tmp / "data")
    proc, p = start_on_free_port(lambda p: ([sys.executable, "-m", "service.cli", "serve"], env_for(tmp / "data", p)),
                                 tmp / "server.log")
    try:
        yield p
    finally:
        stop(proc)


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=15)


def _answer(s: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (lower-case names) and body of the next answer on ``s`` (framed by Content-Length);
    ``(0, {}, b"")`` when the server closed the connection instead."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            return 0, {}, b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    n = int(headers.get("content-length", 0))
    while len(body) < n:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split(" ", 2)[1]), headers, body


def _get(path: str = "/healthz") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


def test_an_idle_kept_alive_connection_outlasts_a_proxys_idle_timeout(port, tmp_path):
    """uvicorn closed a connection idle for 5 s (its default ``timeout_keep_alive``): nginx or an ALB in front
    (60 s idle) reused it and got a reset, a sporadic 502 (nginx does not retry a POST). Now it stays open
    ``keep_alive_timeout_s`` (75 s), one process or ``--workers 2``."""
    seed_registry(tmp_path / "data")
    workers, p2 = start_on_free_port(lambda p2: ([sys.executable, "-m", "service.cli", "serve", "--workers", "2"],
                                                 env_for(tmp_path / "data", p2)), tmp_path / "server.log")
    try:
        conns = [_connect(p) for p in (port, p2)]
        for s in conns:
            s.sendall(_get())
            assert _answer(s)[0] == 200
        time.sleep(6.5)
        for s in conns:
            s.sendall(_get())
            assert _answer(s)[0] == 200, "the server closed the idle connection"
            s.close()
    finally:
        stop(workers)


def test_the_keep_alive_timeout_is_a_checked_setting():
    from pydantic import ValidationError

    from service.config import Settings

    assert Settings().keep_alive_timeout_s == 75
    for bad in (0, -1, 3601):
        with pytest.raises(ValidationError):
            Settings(keep_alive_timeout_s=bad)


def _post(path: str, body: bytes, *headers: bytes, chunked: bool = False) -> bytes:
    """A POST of ``body`` with ``headers``: ``chunked``: in one chunk (``Transfer-Encoding: chunked`` unless
    ``headers`` name a Transfer-Encoding), else with its Content-Length."""
    head = [f"POST {path} HTTP/1.1".encode(), b"Host: 127.0.0.1", KEY, *headers]
    if chunked:
        if not any(h.lower().startswith(b"transfer-encoding:") for h in headers):
            head.append(b"Transfer-Encoding: chunked")
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    else:
        head.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def _exchange(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    with _connect(port) as s:
        s.sendall(request)
        return _answer(s)


def _error(answer, status: int, kind: str, *words: str) -> None:
    got, headers, body = answer
    assert got == status, (got, body[:300])
    assert headers["content-type"] == "application/json"
    err = json.loads(body)["error"]
    assert err["type"] == kind and err["status"] == status, err
    assert all(w in err["message"] for w in words), err["message"]


def test_an_encoded_request_body_is_refused_not_misread(port):
    """No route decodes a request body: ``Content-Encoding: gzip`` on JSON was a 422 "not valid UTF-8", gzip bytes
    sent as octet-stream were read as float32 rows (a 200 of garbage when the bytes happened to be finite), ``br``
    on a plain body was ignored (200), and ``Transfer-Encoding: gzip, chunked`` was read as plain. Now a
    Content-Encoding other than identity is a 415 and a Transfer-Encoding other than chunked a 400, small bodies
    (the transform's fast path) and large (the routes) alike, before the body is read."""
    X = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
    small = json.dumps({"vectors": X.tolist()}).encode()
    large = json.dumps({"vectors": np.repeat(X, 200, axis=0).tolist()}).encode()  # past the fast path's 16 KiB
    assert len(large) > 64 * 1024
    js, octet = b"Content-Type: application/json", b"Content-Type: application/octet-stream"
    transform = "/v1/maps/a2b/transform"
    for request in (_post(transform, gzip.compress(small), js, b"Content-Encoding: gzip"),
                    _post(transform, gzip.compress(X.tobytes()), octet, b"X-Vector-Dim: 16", b"Content-Encoding: gzip"),
                    _post(transform, small, js, b"Content-Encoding: br"),
                    _post(transform, large, js, b"Content-Encoding: identity, gzip"),
                    _post(transform, large, js, b"Content-Encoding: identity", b"Content-Encoding: deflate"),
                    _post(transform, small, js, b"Content-Encoding: gzip", chunked=True),
                    _post("/v1/spaces", gzip.compress(b'{"name": "z", "dim": 4}'), js, b"Content-Encoding: gzip")):
        _error(_exchange(port, request), 415, "UnsupportedMediaTypeError", "Content-Encoding", "uncompressed")
    for request in (_post(transform, small, js, b"Transfer-Encoding: gzip, chunked", chunked=True),
                    _post(transform, large, js, b"Transfer-Encoding: gzip", b"Transfer-Encoding: chunked",
                          chunked=True),
                    _post("/v1/spaces", b'{"name": "z", "dim": 4}', js, b"Transfer-Encoding: br, chunked",
                          chunked=True)):
        _error(_exchange(port, request), 400, "InvalidHeaderError", "Transfer-Encoding", "chunked")
    # identity, plain chunked and no coding at all are read as before (fast path and route)
    for request in (_post(transform, small, js, b"Content-Encoding: identity"), _post(transform, small, js),
                    _post(transform, large, js, b"Content-Encoding: Identity"),
                    _post(transform, small, js, chunked=True),
                    _post(transform, X.tobytes(), octet, b"X-Vector-Dim: 16", b"Content-Encoding: identity")):
        status, _, body = _exchange(port, request)
        assert status == 200, body[:300]


def test_a_chunked_body_over_the_limit_gets_a_413_that_closes_the_connection(port):
    """A body over the limit with a Content-Length got a 413 with ``Connection: close``; sent chunked, the 413 came
    mid-stream but the connection stayed open and the server read (and dropped) whatever the client went on
    sending, GBs of it. Now that 413 closes the connection too, so the client stops."""
    chunk = b"%x\r\n%s\r\n" % (64 * 1024, b" " * 64 * 1024)
    with _connect(port) as s:
        s.sendall(b"POST /v1/spaces HTTP/1.1\r\nHost: 127.0.0.1\r\n" + KEY + b"\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n" + chunk * 3)  # the route's limit: 64 KiB
        status, headers, body = _answer(s)
        assert status == 413, body[:300]
        assert json.loads(body)["error"]["type"] == "PayloadTooLargeError"
        assert headers.get("connection") == "close"
        s.settimeout(5)
        try:
            for _ in range(100):  # a client that goes on sending: the server has closed, so this ends
                s.sendall(chunk)
                time.sleep(0.01)
            closed = s.recv(1) == b""
        except TimeoutError:  # no answer, no end: still open
            closed = False
        except OSError:  # reset (the server closed with our bytes unread) or a failed send: closed
            closed = True
        assert closed, "the connection stayed open after the 413"


def test_a_request_the_parser_refuses_gets_the_json_error_body(port):
    """Requests httptools refuses got uvicorn's plain-text ``400 Invalid HTTP request received.`` where every other
    error is a JSON body, and a request target past 65,535 bytes got that 400 too, though the limits table allows
    a 1 MiB head. Now: the JSON error body naming the parser's reason, and a 414 for the long target."""
    def refused(request: bytes, status: int, kind: str, *words: str) -> None:
        with _connect(port) as s:
            s.sendall(request)
            answer = _answer(s)
            _error(answer, status, kind, *words)
            assert answer[1]["connection"] == "close"
            assert s.recv(1) == b""  # and closed

    post = (b"POST /v1/maps/a2b/transform HTTP/1.1\r\nHost: 127.0.0.1\r\n" + KEY
            + b"\r\nContent-Type: application/json\r\n")
    refused(post + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400, "InvalidRequestError",
            "Duplicate Content-Length", "not valid HTTP/1.1")
    refused(post + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, "InvalidRequestError",
            "Content-Length")
    refused(post + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", 400, "InvalidRequestError", "chunk size")
    refused(b"GARBAGE\r\n\r\n", 400, "InvalidRequestError", "method")
    refused(_get("/v1/maps?x=" + "a" * 70_000), 414, "URITooLongError", "70011 bytes", "65535")
    status, _, body = _exchange(port, _get("/healthz?x=" + "a" * 65_000))  # a target of 65,535 bytes or less is read
    assert status == 200, body


def _http_client(port: int, method: str, path: str, body=None, headers=None, **kw) -> tuple[int, dict, bytes]:
    """The answer as Python's http.client reads it: it writes the whole request before it reads."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request(method, path, body=body, headers={**W, **(headers or {})}, **kw)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def test_a_413_says_what_the_route_can_do_about_it(port):
    """A fit or a plan is one body: a 1,000-pair 3072-d fit (82 MB) was told "send smaller batches", which no client
    can do with it. Now it names the CLI command and the setting; an index create names create-then-add."""
    says = {"/v1/fits": "`vecbridge fit` on files, or raise VECBRIDGE_", "/v1/plans": "`vecbridge plan`",
            "/v1/maps/m/evaluate": "`vecbridge eval`", "/v1/indexes": "add the rest in batches",
            "/v1/indexes/idx/search": "send smaller batches"}
    for path, text in says.items():
        with _connect(port) as s:  # asks first (Expect: 100-continue), so the 413 comes from the head alone
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode() + KEY + b"\r\nContent-Type: "
                      b"application/json\r\nContent-Length: 80000000\r\nExpect: 100-continue\r\n\r\n")
            _error(_answer(s), 413, "PayloadTooLargeError", "80000000 bytes", text)
    chunks = (b" " * (1 << 20) for _ in range(80))  # 80 MiB chunked: counted as it comes, the same advice
    _error(_http_client(port, "POST", "/v1/plans", chunks, {"Content-Type": "application/json"}, encode_chunked=True),
           413, "PayloadTooLargeError", "`vecbridge plan` on files")


def test_a_client_still_sending_a_refused_body_reads_the_answer_not_a_reset(port):
    """A body over the limit (a 77 MB ``vectors_b64`` against the 64 MiB one) got its 413 from the Content-Length
    before it was read, and the connection was closed with the client still sending: the kernel reset it, and
    http.client (requests, httpx, browsers) raised ConnectionResetError / BrokenPipeError, never the JSON error.
    The same for a chunked body's 413 and a 431 head. Now the server lingers, reading and dropping the rest, so the
    client reads its answer; a client that waits for "100 Continue" gets the 413 without sending the body."""
    big = b'{"vectors_b64": "' + b"A" * 77_000_000 + b'"}'
    for _ in range(3):
        _error(_http_client(port, "POST", "/v1/indexes/idx/vectors", big, {"Content-Type": "application/json"}),
               413, "PayloadTooLargeError", "77000019 bytes", "max_body_bytes")
    del big
    chunks = (b" " * (1 << 16) for _ in range(128))  # 8 MiB, chunked: the 413 comes when 64 KiB have been read
    answer = _http_client(port, "POST", "/v1/spaces", chunks, {"Content-Type": "application/json"}, encode_chunked=True)
    _error(answer, 413, "PayloadTooLargeError", "65536 bytes")
    _error(_http_client(port, "GET", "/v1/maps", headers={"X-Big": "a" * 8_000_000}), 431, "HeaderTooLargeError")
    with _connect(port) as s:  # as curl: a client that asks first is answered at once and sends nothing
        s.sendall(b"POST /v1/spaces HTTP/1.1\r\nHost: 127.0.0.1\r\n" + KEY + b"\r\nContent-Type: application/json"
                  b"\r\nContent-Length: 80000000\r\nExpect: 100-continue\r\n\r\n")
        answer = _answer(s)
        _error(answer, 413, "PayloadTooLargeError", "80000000 bytes")
        assert answer[1]["connection"] == "close" and s.recv(1) == b""
    status, headers, _ = _http_client(port, "GET", "/healthz")  # a request that arrived whole: closed at once, as ever
    assert status == 200 and "connection" not in headers


def _refused_then_sending(port: int, head: bytes, status: int) -> socket.socket:
    """A connection whose request ``head`` (and maybe the start of its body) got an error ``status``, answered
    while the client has more of the body to send."""
    s = _connect(port)
    s.sendall(head)
    got = _answer(s)
    assert got[0] == status, got
    return s


def _sending_until_cut(s: socket.socket, chunk: bytes, pause: float, limit: float = 20.0) -> tuple[float, int]:
    """Send ``chunk`` every ``pause`` s until the server drops the connection: (seconds, bytes sent)."""
    t, sent = time.monotonic(), 0
    try:
        while time.monotonic() - t < limit:
            s.sendall(chunk)
            sent += len(chunk)
            time.sleep(pause)
    except OSError:
        return time.monotonic() - t, sent
    finally:
        s.close()
    raise AssertionError(f"the server still read after {limit} s and {sent} bytes")


def test_a_lingering_connection_is_bounded_in_time_and_bytes_and_by_the_shutdown(tmp_path):
    """The lingering close that lets a client read its 413 must not let one hold the connection: a client that goes
    on sending is dropped after ``LINGER_BYTES`` (a fast one) or ``LINGER_S`` (a slow one), and SIGTERM ends a
    lingering connection at once instead of waiting for it (uvicorn logged "Waiting for connections to close")."""
    from service.api.protocol import LINGER_BYTES, LINGER_S

    seed_registry(tmp_path / "data")
    proc, p = start_on_free_port(lambda p: ([sys.executable, "-m", "service.cli", "serve"],
                                            env_for(tmp_path / "data", p)), tmp_path / "log")
    try:
        endless = (b"POST /v1/spaces HTTP/1.1\r\nHost: 127.0.0.1\r\n" + KEY + b"\r\nContent-Type: application/json"
                   b"\r\nContent-Length: 100000000000\r\n\r\n")
        took, sent = _sending_until_cut(_refused_then_sending(p, endless, 413), b" " * (1 << 20), 0)
        assert LINGER_BYTES <= sent <= LINGER_BYTES + (64 << 20) and took < LINGER_S, (took, sent)
        took, sent = _sending_until_cut(_refused_then_sending(p, endless, 413), b" " * 1000, 0.05)
        assert LINGER_S - 0.5 <= took <= LINGER_S + 3, took
        # a 400 while the route reads a chunked body (the request's answer is not complete), then SIGTERM
        s = _refused_then_sending(p, b"POST /v1/maps/a2b/transform HTTP/1.1\r\nHost: 127.0.0.1\r\n" + KEY
                                  + b"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                                    b"5\r\n[1,2,\r\nzz\r\n", 400)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        took, _ = _sending_until_cut(s, b" " * 1000, 0.05)
        assert took < 2, took
        assert proc.wait(timeout=20) == 0
    finally:
        stop(proc)
    assert "Waiting for connections to close" not in (tmp_path / "log").read_text()


def test_the_connection_bound_stays_below_the_open_files_limit(monkeypatch):
    """With the common default of 1,024 open files, the 4,096 max_connections default was a bound never reached:
    descriptors ran out first and every accept failed, /healthz included. The bound uvicorn gets stays 64 below
    the soft limit; 0 is still no bound, and a higher limit leaves the setting as it is."""
    import resource

    from service.api.app import connection_limit

    for soft, wanted, got in ((1024, 4096, 960), (1 << 20, 4096, 4096), (1024, 100, 100), (1024, 0, None),
                              (resource.RLIM_INFINITY, 4096, 4096)):
        monkeypatch.setattr(resource, "getrlimit", lambda _which, soft=soft: (soft, soft))
        assert connection_limit(wanted) == got, (soft, wanted)
