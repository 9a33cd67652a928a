"""The service behind a reverse proxy that serves it under a path prefix and strips it (nginx
``location /vb/ { proxy_pass http://vecbridge:8000/; }``, an ingress rewrite): ``vecbridge serve --root-path /vb``
(``VECBRIDGE_ROOT_PATH``). A real server process, reached through a small stripping proxy written here: /docs loads
its OpenAPI document under the prefix, the document's ``servers`` is the prefix, redirects and ``Location`` headers
carry it, and the console (in Debian's headless Chromium) loads its assets and calls the API under it. Before, /docs
and the console asked for ``/openapi.json``, ``/ui/static/...`` and ``/v1/...``, which the proxy does not serve.

The same behind a proxy that keeps the prefix (passes ``/vb/v1/info`` on: an ingress without a rewrite, Traefik
without StripPrefix), with the prefix exactly once in every answer. Before, every request through it was a 404.
"""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest
from _api_support import R, W, planted, settings_for
from _browser import CHROMIUM, Page, launch
from _servers import ROOT, env_for, free_port, serve_in_thread, start, start_on_free_port, stop

from service.config import ConfigError, Settings, load_settings

PREFIX = "/vb"
READ_KEY = "rkey-123"
_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"content-encoding"}


def stripping_proxy(upstream: str, prefix: str = PREFIX, strip: bool = True):
    """An ASGI app passing ``prefix/...`` on to ``upstream/...`` (the prefix stripped; ``strip=False``: on to
    ``upstream/prefix/...``; Host, headers, body and the answer as they are, redirects not followed); anything
    outside the prefix is the proxy's own 404."""

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            return await send({"type": "lifespan.shutdown.complete"})
        path = scope["raw_path"].decode("latin-1")
        if not path.startswith(prefix + "/"):
            await send({"type": "http.response.start", "status": 404, "headers": [(b"content-type", b"text/plain")]})
            return await send({"type": "http.response.body", "body": b"not under the proxy's prefix"})
        body, more = b"", True
        while more:
            m = await receive()
            body, more = body + m.get("body", b""), m.get("more_body", False)
        query = "?" + scope["query_string"].decode("latin-1") if scope["query_string"] else ""
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP]
        async with httpx.AsyncClient(base_url=upstream, timeout=120.0) as c:
            r = await c.request(scope["method"], (path[len(prefix):] if strip else path) + query, headers=headers,
                                content=body)
        out = [(k, v) for k, v in r.headers.raw if k.lower() not in _HOP]
        await send({"type": "http.response.start", "status": r.status_code,
                    "headers": out + [(b"content-length", str(len(r.content)).encode())]})
        await send({"type": "http.response.body", "body": r.content})

    return app


def _fit(c: httpx.Client) -> httpx.Response:
    """Fit map a2b (spaces a, b) through ``c`` and wait for the job at its ``Location``; the 202 answer."""
    X, Y, _ = planted(200)
    r = c.post(f"{PREFIX}/v1/fits", headers=W, json={"name": "a2b", "source_space": "a", "target_space": "b",
                                                     "method": "procrustes", "paired": True,
                                                     "source": {"vectors": X.tolist()},
                                                     "target": {"vectors": Y.tolist()}})
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 120
    while (job := c.get(r.headers["location"], headers=R).json())["state"] in ("queued", "running"):
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    assert job["state"] == "succeeded", job
    return r


@pytest.fixture(scope="module", params=["serve", "uvicorn"])
def server(request, tmp_path_factory):
    """``vecbridge serve --root-path /vb`` or ``uvicorn --root-path /vb`` (keys on), with spaces a, b and map a2b
    (made through the stripping proxy); yields the server's base URL."""
    tmp = tmp_path_factory.mktemp("root-path")

    def make(port: int) -> tuple[list[str], dict]:
        cmd = {"serve": ["-m", "service.cli", "serve"],
               "uvicorn": ["-m", "uvicorn", "--factory", "service.api:create_app", "--port", str(port)]}[request.param]
        return [sys.executable, *cmd, "--root-path", PREFIX], env_for(tmp / "data", port)

    proc, port = start_on_free_port(make, tmp / "server.log")
    try:
        with (serve_in_thread(stripping_proxy(f"http://127.0.0.1:{port}")) as base,
              httpx.Client(base_url=base, timeout=120.0) as c):
            for name in ("a", "b"):
                r = c.post(f"{PREFIX}/v1/spaces", headers=W, json={"name": name, "dim": 16})
                assert r.status_code == 201, r.text
            _fit(c)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


@pytest.fixture(scope="module", params=["strips", "keeps"])
def proxied(request, server):
    """``server`` behind a proxy that strips the prefix or keeps it; yields the proxy's base URL."""
    with serve_in_thread(stripping_proxy(server, strip=request.param == "strips")) as base:
        yield base


def test_docs_and_openapi_under_the_prefix(proxied):
    with httpx.Client(base_url=proxied, timeout=60.0) as c:
        html = c.get(f"{PREFIX}/docs").text
        assert f"'{PREFIX}/openapi.json'" in html and f'src="{PREFIX}/ui/static/swagger/swagger-ui-bundle.js"' in html
        spec = c.get(f"{PREFIX}/openapi.json").json()
        assert spec["servers"] == [{"url": PREFIX}]
        assert "/v1/spaces" in spec["paths"]  # paths stay relative to the server
        assert c.get("/openapi.json").status_code == 404  # only the prefix reaches the service


def test_api_redirects_and_location_carry_the_prefix(proxied):
    with httpx.Client(base_url=proxied, timeout=120.0) as c:
        r = _fit(c)  # version 2; the job was followed at its Location
        assert r.headers["location"] == f"{PREFIX}/v1/jobs/{r.json()['id']}"
        r = c.get(f"{PREFIX}/ui")
        assert r.status_code == 307 and r.headers["location"] == f"{PREFIX}/ui/registry"
        r = c.get(f"{PREFIX}/ui/jobs/")  # a page with a trailing slash, and the console's 404 page, under the prefix
        assert r.status_code == 307 and r.headers["location"] == f"{PREFIX}/ui/jobs"
        r = c.get(f"{PREFIX}/ui/nope")
        assert r.status_code == 404 and f"<code>{PREFIX}/ui/nope</code>" in r.text
        r = c.get(f"{PREFIX}/v1/spaces/", headers=R)  # the router's trailing-slash redirect
        assert r.status_code == 307 and r.headers["location"] == f"{proxied}{PREFIX}/v1/spaces"
        assert c.get(f"{PREFIX}/v1/spaces", headers=R).json()["data"][0]["name"] == "a"
        r = c.get(f"{PREFIX}/v1/nothing", headers=R)
        assert r.status_code == 404 and f"see {PREFIX}/docs" in r.json()["error"]["message"]
    from service.client import Client

    with Client(proxied + PREFIX, READ_KEY) as client:  # the Python client, given the proxy's address
        assert [m["name"] for m in client.list_maps()] == ["a2b"]


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)")
    if not CHROMIUM.exists():
        pytest.skip("Debian chromium not installed (apt-get install chromium)")
    yield from launch(sync_api)


def test_console_and_docs_in_a_browser_under_the_prefix(proxied, browser):
    t = Page.open(browser, proxied, f"{PREFIX}/ui/registry", READ_KEY)  # the key bar runs: console.js and Alpine
    t.page.get_by_role("button", name="a2b").wait_for()  # loaded, and the first API calls answered
    for asset in ("console.js", "console.css", "vendor/alpine-csp-3.17.4.min.js", "vendor/uPlot-1.6.32.min.css"):
        assert f"{proxied}{PREFIX}/ui/static/{asset}" in t.urls, asset
    for call in ("spaces", "maps", "steers", "info"):
        assert f"{proxied}{PREFIX}/v1/{call}" in t.urls, call
    t.page.get_by_role("link", name="Jobs").click()
    t.page.wait_for_url(f"{proxied}{PREFIX}/ui/jobs")
    t.page.get_by_text("a2b").first.wait_for()  # the fit job, listed from /vb/v1/jobs
    t.page.get_by_role("link", name="API docs").click()
    t.page.wait_for_url(f"{proxied}{PREFIX}/docs")
    t.page.get_by_text("/v1/spaces/{name}").first.wait_for()  # Swagger UI read the document through the prefix
    assert f"{proxied}{PREFIX}/openapi.json" in t.urls
    outside = [u for u in t.urls if u.startswith(proxied) and not u.startswith(proxied + PREFIX + "/")]
    assert outside == [], outside
    twice = [u for u in t.urls if PREFIX + PREFIX + "/" in u]
    assert twice == [], twice
    t.close()  # no console error: nothing failed to load


def test_auth_off_checks_and_probes_behind_the_prefix(tmp_path):
    """With auth off, the Host and Origin checks hold under the prefix, and the probes still answer any Host
    (requests sent as the stripping proxy sends them)."""
    from service.api import create_app

    app = create_app(settings_for(tmp_path, api_keys={}, auth_disabled=True, root_path=PREFIX))
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=60.0) as c:
        own = {"Host": base.removeprefix("http://")}
        assert f"'{PREFIX}/openapi.json'" in c.get("/docs", headers=own).text
        assert f"'{PREFIX}/openapi.json'" in c.get(f"{PREFIX}/docs", headers=own).text  # a proxy that keeps it
        assert c.get(f"{PREFIX}/healthz", headers={"Host": "10.1.2.3:8000"}).status_code == 200
        r = c.get("/v1/spaces", headers={"Host": "evil.example"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "InvalidHostError"
        assert c.get("/healthz", headers={"Host": "10.1.2.3:8000"}).status_code == 200  # a kubelet's probe
        r = c.post("/v1/spaces", json={"name": "x", "dim": 4}, headers={**own, "Origin": "http://evil.example"})
        assert r.status_code == 403 and r.json()["error"]["type"] == "CrossSiteRequestError"
        r = c.post("/v1/spaces", json={"name": "x", "dim": 4}, headers={**own, "Origin": base})
        assert r.status_code == 201, r.text


def test_the_server_answers_paths_with_or_without_the_prefix(server):
    """The prefix on a segment boundary only; the doubled one that uvicorn's --root-path makes of a full path
    is taken once."""
    with httpx.Client(base_url=server, timeout=60.0) as c:
        for path in ("/v1/maps", f"{PREFIX}/v1/maps"):
            r = c.get(path, headers=R)
            assert r.status_code == 200 and r.json()["data"][0]["name"] == "a2b", (path, r.text)
        assert c.get(f"{PREFIX}x/v1/maps", headers=R).status_code == 404  # /vbx is not under /vb
        assert c.get(f"{PREFIX}{PREFIX}/v1/maps", headers=R).status_code == 404  # nor twice under it
        r = c.get(f"{PREFIX}/ui")
        assert r.status_code == 307 and r.headers["location"] == f"{PREFIX}/ui/registry"


@pytest.mark.parametrize("prefix", ["/v1", "/ui"])
def test_a_prefix_named_as_a_path_of_the_service_is_only_stripped(prefix, tmp_path):
    """Under a prefix that is one of the service's own first segments, a path that starts with it is the
    service's own path (as a stripping proxy sends it), never its remainder."""
    from service.api import create_app

    app = create_app(settings_for(tmp_path, root_path=prefix))
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=60.0) as c:
        assert c.get("/v1/info", headers=R).status_code == 200
        r = c.get("/ui/registry")
        assert r.status_code == 200 and f'src="{prefix}/ui/static/console.js"' in r.text


@pytest.mark.parametrize("bad", ["vb", "/vb/", "/", "/a//b", "/a b", "/a?x=1", "/a%2F"])
def test_root_path_is_checked(bad, monkeypatch):
    with pytest.raises(ValueError):
        Settings(root_path=bad)
    monkeypatch.setenv("VECBRIDGE_ROOT_PATH", bad)
    with pytest.raises(ConfigError, match="VECBRIDGE_ROOT_PATH"):
        load_settings()


def test_root_path_accepts_prefixes_and_none():
    for good in ("", "/vb", "/tools/vecbridge-1.0_x~"):
        assert Settings(root_path=good).root_path == good


def test_serve_option_is_checked_in_one_line(tmp_path):
    port = free_port()
    r = subprocess.run([sys.executable, "-m", "service.cli", "serve", "--root-path", "vb/"], cwd=ROOT,
                       env=env_for(tmp_path / "data", port), capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "--root-path" in r.stderr and "/vecbridge" in r.stderr, r.stderr
