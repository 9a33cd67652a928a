"""Host header checks: with auth off, a web page must not reach the service through DNS rebinding.

A rebinding page's requests reach 127.0.0.1 but carry the attacker's name in ``Host``; with no key to guard
the routes, the service answers only loopback names unless ``allowed_hosts`` says otherwise.
"""

from __future__ import annotations

import sys

import httpx
import pytest
from _api_support import W, settings_for
from _servers import env_for, free_port, serve_in_thread, start, stop
from pydantic import ValidationError

from service.api import create_app
from service.api.middleware import accepted_hosts, host_allowed, host_name
from service.config import Settings


@pytest.mark.parametrize("header, name", [
    (b"localhost:8000", "localhost"), (b"LOCALHOST", "localhost"), (b"[::1]:8000", "::1"), (b"[::1]", "::1"),
    (b"127.0.0.1:80", "127.0.0.1"), (b"localhost.:8000", "localhost"), (None, ""), (b"", ""),
    (b"evil.example", "evil.example")])
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
    port = free_port()
    env = env_for(tmp_path / "d", port)
    env.update({"VECBRIDGE_API_KEYS": "{}", "VECBRIDGE_AUTH_DISABLED": "true", "VECBRIDGE_HOST": "0.0.0.0"})
    log = tmp_path / "serve.log"
    proc = start([sys.executable, "-c", "from service.cli import main; main()", "serve"], env, port, log)
    try:
        with httpx.Client(timeout=30) as c:
            assert c.get(f"http://127.0.0.1:{port}/v1/maps").status_code == 200
            assert c.get(f"http://127.0.0.1:{port}/v1/maps", headers={"Host": "my-host"}).status_code == 400
    finally:
        stop(proc)
    assert "VECBRIDGE_ALLOWED_HOSTS" in log.read_text()
