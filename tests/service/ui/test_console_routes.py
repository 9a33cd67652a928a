"""The console's server side without a browser: the fit-report route, the offline /docs, the /ui shells
(no data in them: everything comes from the public API with the user's key) and the package data."""

from __future__ import annotations

import base64
import hashlib
import re
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from service.api import create_app
from service.ops.maps import run_fit
from service.ui import STATIC_DIR
from service.ui.pages import PAGES
from _api_support import R, W, planted, settings_for
from _servers import serve_in_thread

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Map a2b: version 1 fitted with its HTML report, version 2 registered without one."""
    app = create_app(settings_for(tmp_path_factory.mktemp("console")))
    with TestClient(app) as c:
        reg = app.state.vb.registry
        X, Y, _ = planted(300)
        reg.register_space("a", 16)
        reg.register_space("b", 16)
        v1 = run_fit(reg, name="a2b", source=X, target=Y, method="procrustes", paired=True, source_space="a",
                     target_space="b")
        m = app.state.vb.resolve_map("a2b:1")[1]
        reg.register_version("a2b", m, source_space="a", target_space="b", method="procrustes", params={})
        yield c, reg, v1


def test_report_route_serves_the_fit_report(world):
    c, reg, v1 = world
    r = c.get("/v1/maps/a2b/versions/1/report", headers=R)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.content == reg.report_file(v1).read_bytes()
    assert "<h1>vecbridge fit: a2b</h1>" in r.text and "data:image/png;base64," in r.text


def test_report_route_errors(world):
    c, reg, v1 = world
    assert c.get("/v1/maps/a2b/versions/1/report").status_code == 401
    r = c.get("/v1/maps/a2b/versions/2/report", headers=R)
    assert r.status_code == 404 and "has no fit report" in r.json()["error"]["message"]
    assert c.get("/v1/maps/a2b/versions/9/report", headers=R).status_code == 404
    assert c.get("/v1/maps/nope/versions/1/report", headers=R).status_code == 404
    assert c.get("/v1/maps/a2b/versions/0/report", headers=R).status_code == 422
    path = reg.report_file(v1)
    moved = path.with_suffix(".bak")
    path.rename(moved)
    try:
        r = c.get("/v1/maps/a2b/versions/1/report", headers=R)
        assert r.status_code == 404 and "missing from the data dir" in r.json()["error"]["message"]
    finally:
        moved.rename(path)


def _local_assets(html: str) -> list[str]:
    return re.findall(r'(?:src|href)="([^"#]+)"', html)


def test_docs_is_offline(world):
    c, _, _ = world
    r = c.get("/docs")
    assert r.status_code == 200
    assert "cdn" not in r.text.lower() and "https://" not in r.text
    refs = [u for u in _local_assets(r.text) if u.startswith("/")]
    assert {"/ui/static/swagger/swagger-ui-bundle.js", "/ui/static/swagger/swagger-ui.css"} <= set(refs)
    for u in refs:
        assert c.get(u).status_code == 200, u
    assert c.get("/redoc").status_code == 404  # redoc would need a CDN: not offered


def test_ui_pages_are_shells_over_the_public_api(world):
    c, _, _ = world
    r = c.get("/ui", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "/ui/registry"
    for path, _, title in PAGES:
        r = c.get("/ui" + path)  # no key: a shell without data, the browser asks the API with the key
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert f"<h1>{title}</h1>" in r.text and "a2b" not in r.text
        assert 'data-auth-required="true"' in r.text
        for u in _local_assets(r.text):
            assert u.startswith("/") or u.startswith("data:"), f"{path}: non-local asset {u}"
            if u.startswith("/ui/static/"):
                assert c.get(u).status_code == 200, u
    js = c.get("/ui/static/console.js").text
    assert "sessionStorage" in js and "localStorage" not in js and "document.cookie" not in js
    assert "/v1/" in js and "console.log" not in js  # the key is never logged


def test_an_unknown_console_address_gets_the_consoles_404_page(world):
    """/ui/<a typo> answered the API's JSON error in the browser: now a 404 console page, under the console's policy,
    links every page; the address is shown escaped; /ui/static and the pages are as they were."""
    c, _, _ = world
    for path in ("/ui/registy", "/ui/jobs/extra", "/ui/<script>alert(1)</script>"):
        r = c.get(path)
        assert r.status_code == 404 and r.headers["content-type"].startswith("text/html"), path
        assert _csp(r)["script-src"] == "'self'" and "<script>alert" not in r.text
        assert all(f'href="/ui{p}"' in r.text for p, _, _ in PAGES)
    assert "<code>/ui/registy</code>" in c.get("/ui/registy").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in c.get("/ui/<script>alert(1)</script>").text
    assert c.head("/ui/registy").status_code == 404
    assert c.get("/ui/static/console.js").status_code == 200 and c.get("/ui/static/nope.js").status_code == 404
    assert c.get("/ui/static/nope.js").headers["content-type"].startswith("application/json")
    assert c.get("/ui/registry").status_code == 200
    for path, _, _ in PAGES:  # a page's address with a trailing slash is redirected to it, as before the 404 page
        r = c.get(f"/ui{path}/", follow_redirects=False)
        assert r.status_code == 307 and r.headers["location"] == f"/ui{path}", path
    assert c.get("/ui/registry/x").status_code == 404


def test_any_method_at_an_unknown_console_address_gets_what_get_gets(tmp_path):
    """POST / PUT / DELETE / PATCH / OPTIONS of /ui/<a typo> answered 405 (Allow: GET, HEAD), as if the address
    were a page, where GET answers the console's 404 page; /ui/static/<missing> likewise answered 405 where GET
    answers the API's JSON 404. Now the same 404 (page or JSON) for every method, over a real server; a page, the
    /ui/ redirect and an asset that exists still answer 405 naming GET and HEAD only, and HEAD is unchanged."""
    with serve_in_thread(create_app(settings_for(tmp_path))) as base, httpx.Client(base_url=base) as c:
        for path in ("/ui/registy", "/ui/jobs/extra", "/ui/static/nope.js"):
            want = c.get(path)
            assert want.status_code == 404, path
            for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
                r = c.request(method, path, json={"x": 1})
                assert r.status_code == 404, (method, path, r.status_code, r.text[:200])
                assert r.headers["content-type"] == want.headers["content-type"], (method, path)
                if path.startswith("/ui/static/"):
                    assert r.json()["error"]["message"] == f"no route {method} {path}; see /docs"
                else:
                    assert r.text == want.text and _csp(r) == _csp(want) and "allow" not in r.headers
            head = c.head(path)
            assert head.status_code == 404 and head.content == b"", path
            r = c.request("TRACE", path)  # a method no route lists: 404 too, not a 405 naming GET alone
            assert r.status_code == 404 and "allow" not in r.headers, (path, r.status_code, r.headers)
        for path in [*(f"/ui{p}" for p, _, _ in PAGES), "/ui/", "/ui", "/ui/static/console.js", "/docs"]:
            for method in ("POST", "PUT", "DELETE"):
                r = c.request(method, path)
                assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD", (method, path, r.headers)
            assert c.head(path).status_code in (200, 307), path
        r = c.post("/ui/registry/", follow_redirects=False)  # a page's address with a trailing slash: to the page
        assert r.status_code == 307 and r.headers["location"] == "/ui/registry"


def test_ui_says_when_auth_is_off(tmp_path):
    app = create_app(settings_for(tmp_path, api_keys={}, auth_disabled=True))
    with TestClient(app, base_url="http://localhost") as c:  # with auth off, only loopback Host names
        assert 'data-auth-required="false"' in c.get("/ui/jobs").text


def test_console_files_are_package_data():
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["service.ui"]
    ui = STATIC_DIR.parent
    files = [p.relative_to(ui).as_posix() for p in ui.rglob("*") if p.is_file() and p.suffix != ".py"
             and "__pycache__" not in p.parts]
    assert files and all(any(fnmatch(f, g) and f.count("/") == g.count("/") for g in globs) for f in files), files
    for lic in ("vendor/LICENSE.alpinejs.txt", "vendor/LICENSE.vue.txt", "vendor/LICENSE.uPlot.txt", "swagger/LICENSE"):
        assert (STATIC_DIR / lic).is_file()


def test_vendored_files_match_their_recorded_sha256():
    """Each vendored file is the one its README row names (package, version, sha256), and every script and style
    sheet under static/vendor and static/swagger has a row."""
    vendor = STATIC_DIR / "vendor"
    rows = re.findall(r"^\| ([^|]+?) \|.*\| ([0-9a-f]{64}) \|$", (vendor / "README.md").read_text(),
                      re.MULTILINE)
    recorded = {(vendor / f).resolve(): sha for f, sha in rows}
    for f, sha in recorded.items():
        assert hashlib.sha256(f.read_bytes()).hexdigest() == sha, f
    shipped = {p.resolve() for d in ("vendor", "swagger") for p in (STATIC_DIR / d).iterdir()
               if p.suffix in (".js", ".css")}
    assert shipped <= set(recorded), shipped - set(recorded)


def _csp(r) -> dict[str, str]:
    return {d.split()[0]: d.partition(" ")[2] for d in r.headers["content-security-policy"].split("; ")}


def test_security_headers(world):
    """No sniffing, framing or Referer anywhere; the console and /docs run only their own scripts (no inline
    script but Swagger UI's own, by hash); a fit report opened on its own runs nothing; JSON loads nothing."""
    c, _, _ = world
    pages = {"/ui" + path: c.get("/ui" + path) for path, _, _ in PAGES}
    docs = c.get("/docs")
    report = c.get("/v1/maps/a2b/versions/1/report", headers=R)
    rest = [c.get("/v1/maps", headers=R), c.get("/v1/maps"), c.get("/ui/static/console.js"), c.get("/openapi.json"),
            c.get("/v1/nope", headers=R)]
    for r in [*pages.values(), docs, report, *rest]:
        assert r.headers["x-content-type-options"] == "nosniff", r.url
        assert r.headers["x-frame-options"] == "DENY" and r.headers["referrer-policy"] == "no-referrer", r.url
        assert _csp(r)["frame-ancestors"] == "'none'", r.url
    for r in pages.values():
        assert _csp(r)["script-src"] == "'self'" and "<script>" not in r.text  # no eval: Alpine's CSP build
        assert _csp(r)["default-src"] == "'self'" and _csp(r)["object-src"] == "'none'"
    inline = re.findall(r"<script>(.*?)</script>", docs.text, re.DOTALL)
    assert len(inline) == 1
    digest = base64.b64encode(hashlib.sha256(inline[0].encode()).digest()).decode()
    assert _csp(docs)["script-src"] == f"'self' 'sha256-{digest}'"
    assert "sandbox" in _csp(report) and "script-src" not in _csp(report) and _csp(report)["default-src"] == "'none'"
    for r in rest:
        assert _csp(r)["default-src"] == "'none'", r.url



def test_console_styles_have_no_unsafe_inline(world):
    """A security review: the console's style-src allowed 'unsafe-inline', so markup slipped into a page could
    restyle it (hide a warning, lay a fake button over a real one). Now styles come from the service's files,
    plus the one <style> block every fit report carries (the report's srcdoc frame inherits the console's
    policy), allowed by its hash; style attributes are never allowed (the console sets styles through the CSSOM)."""
    c, _, _ = world
    report = c.get("/v1/maps/a2b/versions/1/report", headers=R)
    blocks = re.findall(r"<style>(.*?)</style>", report.text, re.DOTALL)
    assert len(blocks) == 1
    digest = base64.b64encode(hashlib.sha256(blocks[0].encode()).digest()).decode()
    for path, _, _ in PAGES:
        csp = _csp(c.get("/ui" + path))
        assert csp["style-src"] == f"'self' 'sha256-{digest}'", (path, csp)
        assert "unsafe-inline" not in " ".join(csp.values()) and "unsafe-hashes" not in csp["style-src"], path

# What Alpine's CSP build is given on the console's pages: property paths and method calls of the page's component
# (arguments: paths or literals), `item in list` / `(item, i) in list` in x-for, a registered component's name in
# x-data. No operators, template strings, arrow functions or globals: those are computed in console.js.
_NAME = r"[A-Za-z_$][\w$]*"
_ARG = rf"(?:{_NAME}(?:\.{_NAME})*|-?\d+(?:\.\d+)?|'[^']*')"
_STEP = rf"{_NAME}(?:\((?:{_ARG}(?:, {_ARG})*)?\))?"
_EXPR = rf"{_STEP}(?:\.{_STEP})*"
_GLOBALS = {"VB", "JSON", "Object", "Array", "Number", "String", "Math", "window", "document", "location", "console"}


def test_console_templates_give_alpine_only_paths_and_calls(world):
    """The console runs under a policy without 'unsafe-eval' (Alpine's CSP build): an attribute the build cannot
    evaluate breaks the page only when that branch renders, so every attribute of every page is checked here."""
    c, _, _ = world
    js = c.get("/ui/static/console.js").text
    components = re.search(r"const components = \{([^}]*)\};\s+for \(.*\) window\.Alpine\.data\(", js)
    registered = {n.strip() for n in components.group(1).split(",")} if components else set()  # Alpine.data(...)
    seen = 0
    for path, _, _ in PAGES:
        html = c.get("/ui" + path).text
        for name, value in re.findall(r'\s((?:x-[\w.:-]+|[:@][\w.:-]+))="([^"]*)"', html):
            if name in ("x-ref", "x-cloak"):
                continue
            seen += 1
            if name == "x-data":
                assert value in registered, (path, name, value)
                continue
            if name == "x-for":
                m = re.fullmatch(rf"(?:{_NAME}|\({_NAME}, {_NAME}\)) in ({_EXPR})", value)
                assert m, (path, name, value)
                value = m.group(1)
            assert re.fullmatch(_EXPR, value), f"{path}: {name}={value!r} is not a path or a call"
            assert value.split(".")[0].split("(")[0] not in _GLOBALS, f"{path}: {name}={value!r} names a global"
    assert seen > 100


def test_chart_axis_labels_fit_the_chart():
    """The steer page's sweep chart said "share of top-k with the attribute" along its y-axis, which the 220 px
    chart cut to "share of top-k with the attri" (~29 characters fit beside the plot). Every chart's y-label is
    short enough to show whole."""
    js = (STATIC_DIR / "console.js").read_text()
    assert re.search(r"height: 220\b", js)                # the height the bound below was read at
    labels = re.findall(r'ylabel: "([^"]*)"', js)
    assert labels and all(len(label) <= 24 for label in labels), labels


def test_the_readme_claims_versions_only_where_the_registry_page_shows_them():
    """The README's console table said the registry page offers "versions with aliases, tags, lineage, ... move an
    alias" after "spaces, maps, steers", but a steer's row opens nothing (no versions panel for steers)."""
    html = (ROOT / "service" / "ui" / "templates" / "registry.html").read_text()
    steers = html[html.index('id="steers"'):]
    steers = steers[: steers.index("</table>")]
    row = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| Registry |"))
    assert "@click" in steers or "a map's versions" in row, row
