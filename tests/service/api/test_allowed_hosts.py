"""Host header checks: with auth off, a web page must not reach the service through DNS rebinding.

A rebinding page's requests reach 127.0.0.1 but carry the attacker's name in ``Host``; with no key to guard
the routes, the service answers only loopback names unless ``allowed_hosts`` says otherwise.
"""

from __future__ import annotations

import sys

import httpx
import pytest
from _api_support import W, settings_for
from _servers import env_for, serve_in_thread, start_on_free_port, stop
from pydantic import ValidationError

from service.api import create_app
from service.api.middleware import accepted_hosts, host_allowed, host_name
from service.config import Settings


@pytest.mark.parametrize("header, name", [
    (b"localhost:8000", "localhost"), (b"LOCALHOST", "localhost"), (b"[::1]:8000", "::1"), (b"[::1]", "::1"),
    (b"127.0.0.1:80", "127.0.0.1"), (b"localhost.:8000", "localhost"), (None, ""), (b"", ""),
    (b"evil.example", "evil.example"), (b"[::1]:", "::1"),
    # brackets around no IPv6 address, or never closed, were read as the name inside: loopback
    (b"[localhost]", "[localhost]"), (b"[localhost]:8000", "[localhost]:8000"), (b"[::1", "[::1"),
    (b"[127.0.0.1]", "[127.0.0.1]"), (b"[::1]evil", "[::1]evil"), (b"[::1]:80x", "[::1]:80x"), (b"[]", "[]"),
    # a port that is not digits was dropped, so "localhost:abc" passed as loopback (uvicorn never checks it)
    (b"localhost:abc", "localhost:abc"), (b"localhost:80x", "localhost:80x"), (b"localhost:", "localhost")])
def test_host_name(header, name):
    assert host_name(header) == name


def test_host_patterns():
    assert host_allowed("a.corp.example", ("*.corp.example",))
    assert host_allowed("x.a.corp.example", ("*.corp.example",))
    assert not host_allowed("corp.example", ("*.corp.example",))
    assert not host_allowed("evilcorp.example", ("*.corp.example",))
    assert not host_allowed("localhost.evil.example", ("localhost",))
    assert not host_allowed("", ("localhost",))


def test_accepted_hosts_defaults(tmp_path):
    assert accepted_hosts(settings_for(tmp_path)) is None  # keys on: the key guards the routes
    off = accepted_hosts(settings_for(tmp_path, api_keys={}, auth_disabled=True))
    assert set(off) == {"localhost", "127.0.0.1", "::1"}
    assert "10.0.0.5" in accepted_hosts(settings_for(tmp_path, api_keys={}, auth_disabled=True, host="10.0.0.5"))
    assert set(accepted_hosts(settings_for(tmp_path, api_keys={}, auth_disabled=True, host="0.0.0.0"))) == set(off)
    assert accepted_hosts(settings_for(tmp_path, auth_disabled=True, allowed_hosts=["*"])) is None
    assert accepted_hosts(settings_for(tmp_path, allowed_hosts=["Vecbridge.", "[::1]"])) == ("vecbridge", "::1")


@pytest.mark.parametrize("bad", ["", "a b", "http://x", "*x.example", "a.*.example", "x/y"])
def test_bad_allowed_hosts_refused(tmp_path, bad):
    with pytest.raises(ValidationError, match="allowed_hosts"):
        Settings(data_dir=tmp_path, allowed_hosts=[bad])


@pytest.mark.parametrize("bad, says", [
    ("localhost:18206", "without a port"), ("LOCALHOST.:8000", "without a port"), ("[::1]:8000", "without a port"),
    ("10.0.0.5:80", "without a port"),  # accepted before, and matched no request (every one a 400)
    ("*.", "names no domain"), ("*..", "names no domain")])  # accepted as "*": any host was answered
def test_allowed_hosts_that_would_match_nothing_or_anything_are_refused(tmp_path, bad, says):
    with pytest.raises(ValidationError, match="allowed_hosts") as err:
        Settings(data_dir=tmp_path, allowed_hosts=[bad])
    assert says in str(err.value)


def test_auth_off_answers_loopback_names_only(tmp_path):
    app = create_app(settings_for(tmp_path, api_keys={}, auth_disabled=True))
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as c:
        port = base.rsplit(":", 1)[1]
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost"):
            assert c.get("/v1/maps", headers={"Host": host}).status_code == 200, host
        for host in (f"rebind.evil.example:{port}", "evil.example", "127.0.0.1.evil.example"):
            r = c.get("/v1/maps", headers={"Host": host})
            assert r.status_code == 400, host
            err = r.json()["error"]
            assert err["type"] == "InvalidHostError" and "VECBRIDGE_ALLOWED_HOSTS" in err["message"]
            assert r.headers["x-content-type-options"] == "nosniff"
            # writes and the console are refused alike; nothing was created
            assert c.post("/v1/spaces", json={"name": "x", "dim": 3}, headers={"Host": host}).status_code == 400
            assert c.get("/ui", headers={"Host": host}).status_code == 400
        assert c.get("/v1/spaces").json()["data"] == []
        for probe in ("/healthz", "/readyz"):  # probes come by address from anywhere
            assert c.get(probe, headers={"Host": "10.1.2.3:8000"}).status_code == 200


def test_probes_answer_any_host_behind_a_root_path(tmp_path):
    """Behind a proxy's path prefix (uvicorn --root-path puts it in front of each path) the probes still answer any
    Host, and FastAPI's own pages keep their metrics label. The Host check compared the prefixed path with
    /healthz: with auth off, a kubelet's probe by pod address was a 400 and the pod never became ready."""
    from fastapi.testclient import TestClient

    app = create_app(settings_for(tmp_path, api_keys={}, auth_disabled=True, metrics_access="open"))
    with TestClient(app, root_path="/vb", base_url="http://10.1.2.3:8000") as c:
        for probe in ("/vb/healthz", "/vb/readyz"):
            assert c.get(probe).status_code == 200, probe
        assert c.get("/vb/v1/spaces").status_code == 400  # the Host check still applies to the rest
    with TestClient(app, root_path="/vb", base_url="http://localhost") as c:
        assert c.get("/vb/openapi.json").status_code == 200
        assert 'route="/openapi.json"' in c.get("/vb/metrics").text


def test_allowed_hosts_with_keys(tmp_path):
    app = create_app(settings_for(tmp_path, allowed_hosts=["*.corp.example", "vecbridge"]))
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as c:
        assert c.get("/v1/maps", headers={**W, "Host": "search.corp.example:8000"}).status_code == 200
        assert c.get("/v1/maps", headers={**W, "Host": "vecbridge"}).status_code == 200
        assert c.get("/v1/maps", headers={"Host": "vecbridge"}).status_code == 401  # the key still counts
        for host in ("corp.example", "evil.example", "127.0.0.1"):
            r = c.get("/v1/maps", headers={**W, "Host": host})
            assert r.status_code == 400, host
            # the names set are what applies here, not the auth-off default it used to explain
            assert r.json()["error"]["message"] == (
                f"Host {host!r} is not one this service answers (*.corp.example, vecbridge): add the names clients "
                f"use to VECBRIDGE_ALLOWED_HOSTS (allowed_hosts)")


def test_serve_says_which_hosts_it_answers(tmp_path):
    log = tmp_path / "serve.log"
    cmd = [sys.executable, "-c", "from service.cli import main; main()", "serve"]
    proc, port = start_on_free_port(lambda port: (cmd, {
        **env_for(tmp_path / "d", port), "VECBRIDGE_API_KEYS": "{}", "VECBRIDGE_AUTH_DISABLED": "true",
        "VECBRIDGE_HOST": "0.0.0.0"}), log)
    try:
        with httpx.Client(timeout=30) as c:
            assert c.get(f"http://127.0.0.1:{port}/v1/maps").status_code == 200
            assert c.get(f"http://127.0.0.1:{port}/v1/maps", headers={"Host": "my-host"}).status_code == 400
    finally:
        stop(proc)
    assert "VECBRIDGE_ALLOWED_HOSTS" in log.read_text()


def test_auth_off_refuses_other_sites_web_pages(tmp_path):
    """With auth off a web page of any site wrote to the service: ``fetch(..., {method: "POST", mode: "no-cors",
    body: new Blob([json])})`` sends no Content-Type (no CORS preflight), a missing Content-Type reads as JSON, and
    the index was created (201). An ``Origin`` that is not the service's own (nor a configured CORS origin) and
    ``Sec-Fetch-Site: cross-site`` are a 403 now; the service's own pages, and clients that are no browser, are not
    concerned."""
    import json

    app = create_app(settings_for(tmp_path, api_keys={}, auth_disabled=True))
    body = json.dumps({"name": "ix", "space": "s", "vectors": [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]}).encode()
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as c:
        port = base.rsplit(":", 1)[1]
        assert c.post("/v1/spaces", json={"name": "s", "dim": 3}).status_code == 201  # no Origin: curl, the client
        for origin in ("https://evil.example", f"http://localhost.evil.example:{port}", "null",
                       "http://localhost:3000", f"https://127.0.0.1:{port}", "not an origin"):
            r = c.post("/v1/indexes", content=body, headers={"Origin": origin})  # what no-cors fetch sends
            assert r.status_code == 403, (origin, r.text)
            err = r.json()["error"]
            assert err["type"] == "CrossSiteRequestError" and "VECBRIDGE_CORS_ORIGINS" in err["message"], err
            assert repr(origin) in err["message"]
        for h in ({"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"},  # an older browser's no Origin
                  {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}):  # a cross-site form's post
            r = c.post("/v1/indexes", content=body, headers=h)
            assert r.status_code == 403 and r.json()["error"]["type"] == "CrossSiteRequestError", r.text
        assert c.get("/v1/spaces", headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors"}
                     ).status_code == 403
        assert c.get("/v1/indexes").json()["data"] == []  # nothing was created
        # a link to the console followed from another site opens it
        assert c.get("/ui", headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"},
                     follow_redirects=True).status_code == 200
        # the service's own pages: its origin (any loopback name it answers, default port or not), same-site, none
        assert c.post("/v1/indexes", content=body, headers={"Origin": f"http://127.0.0.1:{port}",
                                                            "Sec-Fetch-Site": "same-origin"}).status_code == 201
        assert c.get("/v1/indexes/ix", headers={"Origin": f"HTTP://LOCALHOST:{port}/",
                                                "Host": f"localhost:{port}"}).status_code == 200
        assert c.get("/v1/spaces", headers={"Origin": "http://localhost", "Host": "localhost:80"}).status_code == 200
        for site in ("same-origin", "same-site", "none"):
            assert c.get("/v1/spaces", headers={"Sec-Fetch-Site": site}).status_code == 200, site
        # the console behind a proxy that ends TLS (or rewrites Host): the browser's Origin is https://, the request
        # it forwards http://; the browser says same-origin (no page script can set a Sec- header), and that holds
        r = c.post("/v1/spaces", json={"name": "s2", "dim": 3},
                   headers={"Origin": f"https://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"})
        assert r.status_code == 201, r.text

    app = create_app(settings_for(tmp_path / "cors", api_keys={}, auth_disabled=True,
                                  cors_origins=["http://localhost:3000"]))
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as c:
        r = c.get("/v1/spaces", headers={"Origin": "http://localhost:3000", "Sec-Fetch-Site": "same-site"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert c.get("/v1/spaces", headers={"Origin": "http://localhost:3001"}).status_code == 403

    app = create_app(settings_for(tmp_path / "keys"))  # keys on: a page cannot send the key without a preflight
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as c:
        assert c.get("/v1/spaces", headers={**W, "Origin": "https://evil.example"}).status_code == 200


def _raw(base: str, head: str) -> tuple[int, dict]:
    """Status and JSON body of a request sent as written (``head``: request line and headers, CRLF-joined later), so
    that a header can come twice: HTTP clients merge or refuse that."""
    import json
    import socket

    host, port = base.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head.strip().replace("\n", "\r\n").encode() + b"\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    top, _, body = data.partition(b"\r\n\r\n")
    return int(top.split()[1]), json.loads(body) if body.startswith(b"{") else {}


def test_a_second_host_or_authorization_header_is_a_400(tmp_path):
    """``Host: evil.example`` then ``Host: localhost`` was answered 200 by an auth-off server: only the last Host was
    checked (RFC 9112 section 3.2: more than one Host is a 400); two Authorization headers, likewise only the last.
    And ``[localhost]`` or an unclosed ``[::1`` passed as loopback names."""
    app = create_app(settings_for(tmp_path, api_keys={}, auth_disabled=True))
    with serve_in_thread(app) as base:
        assert _raw(base, "GET /v1/maps HTTP/1.1\nHost: localhost")[0] == 200
        for hosts in (("evil.example", "localhost"), ("localhost", "evil.example"), ("localhost", "localhost")):
            status, body = _raw(base, "GET /v1/maps HTTP/1.1\n" + "\n".join(f"Host: {h}" for h in hosts))
            assert status == 400 and body["error"]["type"] == "InvalidHeaderError", (hosts, body)
            assert "2 Host headers" in body["error"]["message"]
        status, body = _raw(base, "POST /v1/spaces HTTP/1.1\nHost: evil.example\nHost: localhost\n"
                                  "Content-Type: application/json\nContent-Length: 2\n\n{}")
        assert status == 400, body
        for host in ("[localhost]", "[localhost]:8000", "[::1", "[127.0.0.1]", "[::1]evil"):
            status, body = _raw(base, f"GET /v1/maps HTTP/1.1\nHost: {host}")
            assert status == 400 and body["error"]["type"] == "InvalidHostError", (host, body)
        assert _raw(base, "GET /v1/maps HTTP/1.1\nHost: [::1]:8000")[0] == 200

    app = create_app(settings_for(tmp_path / "keys"))
    with serve_in_thread(app) as base:
        auth = "\n".join(f"Authorization: {v}" for v in (W["Authorization"], "Bearer nope"))
        assert _raw(base, f"GET /v1/maps HTTP/1.1\nHost: localhost\nAuthorization: {W['Authorization']}")[0] == 200
        for two in (auth, "\n".join(reversed(auth.split("\n")))):
            status, body = _raw(base, f"GET /v1/maps HTTP/1.1\nHost: localhost\n{two}")
            assert status == 400 and "2 Authorization headers" in body["error"]["message"], body
