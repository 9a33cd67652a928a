"""The console against a hostile registry, in Debian's headless Chromium: strings anyone with a write key
can store (tag keys and values, job error messages, search payloads, a fit report file) are shown as text on
every page and never run; no other site can frame the console; a fit report opened on its own runs nothing.

A small in-process world (uvicorn on loopback, keys on): spaces a, b (16-d) with map a2b fitted over the API
(its report), space e5 (the e5 encoder, so the search and steer pages can embed a query) with an index of
random vectors whose payloads are hostile, and a steer over it.
"""

from __future__ import annotations

import base64
import json
import time

import httpx
import numpy as np
import pytest
from _api_support import W, planted, populate, settings_for
from _browser import CHROMIUM, Page, launch
from _servers import serve_in_thread

from align.exceptions import InputError

READ_KEY = "rkey-123"
# each sets window.__pwned if it ever runs as script, in the page or in a frame of it
IMG = '<img src=x onerror="window.__pwned=1;parent.__pwned=1">'
SCRIPT = '"><script>window.__pwned=2;parent.__pwned=2</script>'
JS_URL = "javascript:window.__pwned=3"
SVG = "<svg onload=window.__pwned=4>"

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)")
pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium not installed")


def _b64(X: np.ndarray) -> dict:
    X = np.ascontiguousarray(X, dtype="<f4")
    return {"vectors_b64": base64.b64encode(X.tobytes()).decode(), "dim": int(X.shape[1])}


def _done(c: httpx.Client, job: str) -> dict:
    deadline = time.monotonic() + 300  # a count of polls (60 s) is short on a loaded machine
    while time.monotonic() < deadline:
        j = c.get(f"/v1/jobs/{job}", headers=W).json()
        if j["state"] not in ("queued", "running"):
            return j
        time.sleep(0.1)
    raise AssertionError(f"job {job} did not finish: {j}")


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    from service.api import create_app

    app = create_app(settings_for(tmp_path_factory.mktemp("hostile")))
    X, Y, _ = planted(300)
    E = np.random.default_rng(0).standard_normal((12, 384)).astype(np.float32)
    payloads = [{"text": IMG, "label": 1}, {"title": SCRIPT, "url": JS_URL, "label": -1}, SVG,
                {"text": {"html": IMG}, "label": 1}, {"url": JS_URL}, None] * 2
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=60.0) as c:
        for space in ({"name": "a", "dim": 16, "description": IMG}, {"name": "b", "dim": 16, "description": SCRIPT},
                      {"name": "e5", "encoder": "multilingual-e5-small"}):
            assert c.post("/v1/spaces", headers=W, json=space).status_code == 201
        fit = {"name": "a2b", "source_space": "a", "target_space": "b", "method": "procrustes", "paired": True,
               "source": _b64(X), "target": _b64(Y), "description": SCRIPT}
        assert _done(c, c.post("/v1/fits", headers=W, json=fit).json()["id"])["state"] == "succeeded"
        r = c.put(f"/v1/maps/a2b/versions/1/tags/{IMG}", headers=W, json={"value": {"s": SCRIPT, "u": JS_URL}})
        assert r.status_code == 200, r.text
        # a job that fails, its error message quoting a client's string. A bad fit parameter is a 422 now (checked
        # when the fit is requested), so the job is queued on the server's own job runner as a fit's would be.
        assert c.post("/v1/fits", headers=W, json={**fit, "params": {"center": IMG}}).status_code == 422

        def fails(ctx):
            raise InputError(f"center must be true or false, got {IMG!r}")

        bad, _ = app.state.vb.jobs.submit(fails, kind="fit", description=SCRIPT)
        assert IMG in _done(c, bad.id)["error"]["message"]
        r = c.post("/v1/indexes", headers=W, json={"name": "hostile", "space": "e5", "kind": "flat", **_b64(E),
                                                   "payloads": payloads})
        assert r.status_code == 201, r.text
        r = c.post("/v1/steers", headers=W, json={"name": "tone", "space": "e5", "labels": [1, -1] * 6,
                                                  "params": {"method": "mean-shift"}, **_b64(E)})
        assert _done(c, r.json()["id"])["state"] == "succeeded"
        yield base, app


@pytest.fixture(scope="module")
def browser():
    yield from launch(sync_api)


def test_no_site_can_frame_the_console(hostile, browser):
    """Clickjacking: a page of another site puts the console (e.g. its Cancel and Move alias buttons) in an
    invisible frame. The browser refuses to render it there."""
    base, _ = hostile
    t = Page(browser, base)
    t.page.set_content(f"<iframe id=f src='{base}/ui/jobs'></iframe><iframe src='{base}/docs'></iframe>")
    t.page.wait_for_timeout(1500)
    framed = [f for f in t.page.frames if f != t.page.main_frame]
    assert len(framed) == 2
    for f in framed:  # Chromium's error page instead of the console or Swagger UI
        assert not f.url.startswith(base) and f.evaluate("document.querySelectorAll('#main, #swagger-ui').length") == 0
    t.close(expect_errors=("frame-ancestors",))


def test_a_report_opened_on_its_own_runs_no_script(hostile, browser):
    """A fit report is a file in the data dir (a fit writes it escaped; `registry import` copies other
    registries' files). Opened at its URL, a script in it must not run on the service's origin."""
    base, app = hostile
    reg = app.state.vb.registry
    path = reg.report_file(reg.get_version("a2b", 1))
    fitted = path.read_bytes()
    path.write_text(f"<!doctype html><title>r</title><h1>hostile report</h1>{IMG}{SVG}"
                    "<script>window.__pwned=5</script>")
    try:
        t = Page(browser, base, extra_http_headers={"Authorization": f"Bearer {READ_KEY}"})
        t.goto("/v1/maps/a2b/versions/1/report")
        t.page.locator("h1", has_text="hostile report").wait_for()
        t.page.wait_for_timeout(500)
        assert t.page.evaluate("window.__pwned") is None
        t.close(expect_errors=("sandbox", "Content Security Policy", "CSP violation", "/x"))
    finally:
        path.write_bytes(fitted)


def _inert(t: Page, where: str) -> None:
    """Nothing hostile ran or became an element in the page (or the report's frame)."""
    assert t.page.evaluate("window.__pwned") is None, where
    assert t.page.locator("main img, main svg, main script, main a[href^='javascript']").count() == 0, where


def test_hostile_strings_are_text_on_every_page(hostile, browser):
    base, _ = hostile
    t = Page.open(browser, base, "/ui/registry", READ_KEY)
    row = t.page.locator("#versions tbody tr").first
    row.wait_for()
    assert IMG in row.inner_text() and "<script>window.__pwned=2" in row.inner_text()  # tag key and value
    t.page.frame_locator("iframe.report").locator("h1").first.wait_for()
    _inert(t, "registry")

    t.goto("/ui/jobs")
    failed = t.page.locator("#jobs tbody tr", has_text="failed")
    failed.wait_for()
    assert IMG in failed.inner_text()  # the job's error message, as text
    _inert(t, "jobs")

    t.goto("/ui/search")
    t.page.get_by_label("index", exact=True).select_option("hostile")
    t.page.get_by_label("query's model (space)", exact=True).select_option("e5")
    t.page.get_by_label("query", exact=True).fill("anything")
    t.page.get_by_label("k", exact=True).fill("12")  # every row
    t.page.get_by_role("button", name="Search").click()
    t.page.locator("#native-hits li").nth(11).wait_for()
    hits = t.page.locator("#native-hits").inner_text()
    for s in (IMG, SCRIPT, SVG, JS_URL):
        assert s in hits, s
    _inert(t, "search")

    t.goto("/ui/steer")
    t.page.get_by_label("steer", exact=True).select_option("tone")
    t.page.get_by_label("query", exact=True).fill("anything")
    t.page.locator("#st-eps").fill("1")
    t.page.get_by_role("button", name="Search").click()
    t.page.locator("#steered-hits li").nth(9).wait_for()
    assert IMG in t.page.locator("#steered-hits").inner_text()
    _inert(t, "steer")

    t.goto("/ui/migrations")
    t.page.locator("#mig-indexes tbody tr").first.wait_for()
    _inert(t, "migrations")
    t.close()


def test_search_hits_say_what_their_payload_holds(hostile, browser):
    """A payload whose `text` is not a string, a plain-string payload and no payload at all: the hit shows the
    payload as JSON, the string, the id; before, "[object Object]", the string in quotes and "{}"."""
    base, _ = hostile
    t = Page.open(browser, base, "/ui/search", READ_KEY)
    t.page.get_by_label("index", exact=True).select_option("hostile")
    t.page.get_by_label("query", exact=True).fill("anything")
    t.page.get_by_label("k", exact=True).fill("12")
    t.page.get_by_role("button", name="Search").click()
    t.page.locator("#native-hits li").nth(11).wait_for()
    labels = t.page.locator("#native-hits li > span:first-child").all_inner_texts()
    assert "[object Object]" not in labels and "{}" not in labels
    assert SVG in labels and json.dumps({"text": {"html": IMG}, "label": 1}, separators=(",", ":")) in labels
    assert {"#5", "#11"} <= set(labels)  # rows 5 and 11 have no payload
    t.close()


def test_forget_key_leaves_nothing_on_screen(hostile, browser):
    """"Forget key" on a shared screen: before, every map, tag and the fit report stayed on the page (only an
    error line was added) until someone reloaded it."""
    base, _ = hostile
    t = Page.open(browser, base, "/ui/registry", READ_KEY)
    t.page.locator("#versions tbody tr").first.wait_for()
    t.page.get_by_role("button", name="Forget key").click()
    t.page.locator("#unauthorized").wait_for()
    assert t.page.locator("#maps tbody tr, #versions tbody tr").count() == 0
    assert "a2b" not in t.page.locator("main").inner_text() and not t.page.locator("iframe.report").is_visible()
    assert t.page.evaluate("sessionStorage.getItem('vecbridge.key')") is None
    t.close()


@pytest.fixture(scope="module")
def empty(tmp_path_factory):
    """A service with nothing in it yet (a new user's first look)."""
    from service.api import create_app

    with serve_in_thread(create_app(settings_for(tmp_path_factory.mktemp("empty")))) as base:
        yield base


def test_a_key_with_a_typographic_dash_is_named_not_sent(empty, browser):
    """A key pasted from a document where the word processor made '-' a '–': the browser cannot send it in a
    header, which the console reported as "NetworkError: the service did not answer". Now it says why."""
    t = Page(browser, empty)
    t.goto("/ui/registry")
    t.page.get_by_label("API key", exact=True).fill("rkey\u2013123")
    t.page.get_by_role("button", name="Use key").click()
    msg = t.page.locator("#key-error")
    msg.wait_for(timeout=5_000)
    assert "U+2013" in msg.inner_text() and "character 5" in msg.inner_text()
    assert "NetworkError" not in t.page.locator("main").inner_text()
    assert t.page.evaluate("sessionStorage.getItem('vecbridge.key')") is None
    t.login(READ_KEY)  # the right key still works, and the message goes
    assert not msg.is_visible()
    t.close()


def test_a_refused_key_can_be_replaced_in_place(empty, browser):
    """A mistyped, revoked or rotated key: the 401 panel said "Enter an API key ... above" but the key field was
    hidden as long as a key was set, so nothing above could take one (only "Forget key", which reloads, did)."""
    t = Page(browser, empty)
    t.goto("/ui/registry")
    t.login("not-a-key")
    t.page.locator("#unauthorized", has_text="invalid API key").wait_for()
    field = t.page.get_by_label("API key", exact=True)
    assert field.is_visible()
    t.login(READ_KEY)  # typed over the refused key: the panel goes and the page loads
    t.page.locator("#unauthorized").wait_for(state="hidden")
    assert not field.is_visible()
    assert t.page.evaluate("sessionStorage.getItem('vecbridge.key')") == READ_KEY
    t.page.get_by_text("No maps yet").wait_for()
    t.close(expect_errors=("status of 401",))


def test_search_with_no_index_yet_says_so(empty, browser):
    """Before, the console posted to /v1/indexes//search and showed two "404 NotFound: no route" messages."""
    t = Page.open(browser, empty, "/ui/search", READ_KEY)
    t.page.get_by_label("query", exact=True).fill("a query")
    t.page.get_by_role("button", name="Search").click()
    msg = t.page.locator("#search-msg")
    msg.wait_for()
    assert "no index to search yet" in msg.inner_text() and "404" not in msg.inner_text()
    t.close()


def test_error_hints_do_not_contradict_the_server(empty, browser):
    """A write-only key on a page that reads: the server said "lacks the 'read' scope", the console's hint added
    "use a key with the 'write' scope"; and every 429 was "the job queue is full", also the language model's
    queue (the steer page's Generate), which is no job."""
    t = Page.open(browser, empty, "/ui/registry", "wonly-789")
    err = t.page.locator("main p.error").first
    err.wait_for()
    assert "lacks the 'read' scope" in err.inner_text() and "'write' scope" not in err.inner_text()
    busy = {"status": 429, "type": "BusyError", "message": "the language model is busy and 16 requests are waiting "
            "for it (limits.lm_max_waiting); retry later"}
    assert "job queue" not in t.page.evaluate("e => VB.say(e)", busy)
    t.close(expect_errors=("status of 403",))


def _no_errors(t: Page, where: str, allow: tuple[str, ...] = ()) -> None:
    """No console error, page error or CSP violation on the page so far (an Alpine expression the build cannot
    evaluate is a page error); the list starts empty for the next page."""
    errs = [e for e in t.errors if not any(x in e for x in allow)]
    assert errs == [], f"{where}: {errs}"
    t.errors.clear()


def test_console_runs_without_unsafe_eval(hostile, browser):
    """A security review: the console's policy allowed 'unsafe-eval' (Alpine's standard build compiles every x-
    attribute with Function()), so markup injected into a console page could run script through an Alpine
    attribute. Now the console runs on Alpine's CSP build: no eval in its policy, and every page does its work in
    the browser with no CSP violation, console error or Alpine expression error."""
    from service.ui.pages import PAGES

    base, _ = hostile
    visited = ["/registry", "/jobs", "/search", "/steer", "/migrations"]  # below, in this order
    assert sorted(visited) == sorted(path for path, _, _ in PAGES)
    for path in visited:
        csp = httpx.get(base + "/ui" + path).headers["content-security-policy"]
        assert "unsafe-eval" not in csp and "script-src 'self';" in csp, (path, csp)
    t = Page(browser, base)
    t.goto("/ui/registry")
    t.page.locator("#unauthorized", has_text="no API key").wait_for()  # the key bar's 401 panel, before a key
    t.login(READ_KEY)
    t.page.locator("#maps tbody tr", has_text="a → b").wait_for()
    row = t.page.locator("#versions tbody tr").first
    row.wait_for()
    assert "procrustes" in row.inner_text() and "reliable" in row.locator(".badge").inner_text()
    t.page.get_by_role("button", name="show version 1").click()
    assert t.page.get_by_role("button", name="show version 1").get_attribute("aria-pressed") == "true"
    assert "train_top1" in t.page.locator("#metrics").inner_text()
    assert "a (16-d) → b (16-d)" in t.page.locator("#lineage").inner_text()
    t.page.frame_locator("iframe.report").locator("h1", has_text="vecbridge fit: a2b").wait_for()
    t.page.locator("[x-ref=recall] canvas").first.wait_for()
    t.page.get_by_label("alias", exact=True).fill("prod")
    t.page.get_by_role("button", name="Move alias").click()
    t.page.locator("#alias-msg", has_text="403").wait_for()  # a read key: refused, in words
    _no_errors(t, "registry", allow=("status of 403",))

    t.goto("/ui/jobs")
    t.page.locator("#jobs tbody tr", has_text="failed").wait_for()
    counts = t.page.locator("#job-counts").inner_text()
    assert "succeeded" in counts and "failed" in counts
    assert t.page.locator("#jobs progress").first.get_attribute("aria-label").startswith("progress of job ")
    _no_errors(t, "jobs")

    t.goto("/ui/search")
    t.page.get_by_label("index", exact=True).select_option("hostile")
    assert "hostile (e5, 12 rows)" in t.page.get_by_label("index", exact=True).inner_text()
    t.page.get_by_label("query", exact=True).fill("anything")
    t.page.get_by_role("button", name="Search").click()
    t.page.locator("#overlap").wait_for(state="visible")
    assert "10 / 10" in t.page.locator("#overlap").inner_text()
    assert "none (same space)" in t.page.locator("#map-path").inner_text()
    assert t.page.locator("#native-hits li.shared").count() == 10
    _no_errors(t, "search")

    t.goto("/ui/steer")
    t.page.get_by_label("steer", exact=True).select_option("tone")
    t.page.get_by_label("query", exact=True).fill("anything")
    t.page.locator("#st-eps").fill("1")
    assert t.page.locator("output[for=st-eps]").inner_text() == "1.00"
    t.page.get_by_role("button", name="Search").click()
    t.page.locator("#steer-summary").wait_for(state="visible")
    assert "results changed at ε = 1" in t.page.locator("#steer-summary").inner_text()
    t.page.get_by_role("button", name="Sweep ε").click()
    t.page.locator("[x-ref=sweep] canvas").first.wait_for()
    _no_errors(t, "steer")

    t.goto("/ui/migrations")
    t.page.locator("#mig-indexes tbody tr", has_text="hostile").wait_for()
    _no_errors(t, "migrations")

    t.page.get_by_role("button", name="Forget key").click()
    t.page.locator("#unauthorized").wait_for()
    _no_errors(t, "forget key")
    # a string compiled as script on a console page (what Alpine's standard build does) is refused, and the
    # refusal is reported, so the checks above would have seen one
    t.page.evaluate("() => setTimeout('window.__evaluated = 1', 0)")
    t.page.wait_for_timeout(300)
    assert t.page.evaluate("window.__evaluated") is None
    assert any("script-src blocked eval" in e for e in t.errors), t.errors
    t.close(expect_errors=("script-src blocked eval", "Evaluating a string as JavaScript"))


# markup slipped into a page to redress it: a fake button over the page (style attribute), a rule hiding the key
# bar (<style> element)
REDRESS = ('<p id="redress" style="position:fixed;top:0;left:0;z-index:9">Click here</p>'
           '<style>header{display:none}</style>')


def test_console_applies_no_injected_style(hostile, browser):
    """UI redress: the console's style-src allowed 'unsafe-inline', so markup slipped into a page (or into the
    fit report's frame, which inherits the page's policy) could restyle it: hide a warning, overlay a fake
    button. Now such styles are refused and reported, in the page and in the report's frame, while the
    report's own <style> (allowed by its hash) still lays the report out."""
    base, _ = hostile
    t = Page.open(browser, base, "/ui/registry", READ_KEY)
    frame = t.page.frame_locator("iframe.report")
    frame.locator("h1", has_text="vecbridge fit: a2b").wait_for()
    assert frame.locator("body").evaluate("b => getComputedStyle(b).maxWidth") == "1100px"  # the report's CSS
    _no_errors(t, "registry")
    for where, body in (("page", t.page.locator("main")), ("report frame", frame.locator("body"))):
        body.evaluate("(b, html) => b.insertAdjacentHTML('beforeend', html)", REDRESS)
        t.page.wait_for_timeout(300)
        redress = body.locator("#redress")
        assert redress.evaluate("e => getComputedStyle(e).position") == "static", where
        assert redress.evaluate("e => getComputedStyle(e.ownerDocument.querySelector('header') "
                                "|| e.ownerDocument.body).display") != "none", where
    for directive in ("style-src-attr", "style-src-elem"):  # the page's listener (a srcdoc frame gets none)
        assert any(f"CSP violation: {directive} blocked inline" in e for e in t.errors), (directive, t.errors)
    assert sum("Applying inline style violates" in e for e in t.errors) >= 4, t.errors  # Chromium: page and frame
    # (the report frame, sandboxed without scripts, also logs that it refuses the script Playwright evaluates in it)
    t.close(expect_errors=("CSP violation: style-src", "Applying inline style violates",
                           "Blocked script execution in 'about:srcdoc'"))


def test_a_map_that_cannot_be_loaded_says_so(browser, tmp_path):
    """A click on another map while the service did not answer (restarting, network down, a 503): the heading
    named the new map over the old map's versions and lineage, and nothing said that the request failed (an
    uncaught promise rejection in the browser's console)."""
    from service.api import create_app

    app = create_app(settings_for(tmp_path))
    with serve_in_thread(app) as base:
        populate(app.state.vb.registry)  # maps a2b (a -> b) and b2c (b -> c)
        t = Page.open(browser, base, "/ui/registry", READ_KEY)
        t.page.locator("#lineage", has_text="a (16-d) → b (16-d)").wait_for()
    t.page.get_by_role("button", name="b2c").click()  # the service is gone
    t.page.locator("main p.error", has_text="NetworkError").wait_for(timeout=10_000)
    assert t.page.locator("#versions-h").inner_text() == "Versions of a2b"
    assert "a (16-d) → b (16-d)" in t.page.locator("#lineage").inner_text()
    t.close(expect_errors=("ERR_CONNECTION_REFUSED",))


def test_with_auth_off_the_console_writes_and_no_other_site_does(browser, tmp_path):
    """With auth off any web page wrote to the service: a ``fetch(..., {method: "POST", mode: "no-cors"})`` of a Blob
    sends no Content-Type, so no CORS preflight, and the index was created (201). The page cannot read the answer,
    but it did not need to. Now such a request is refused (its ``Origin`` is not the service's), while the console,
    served by the service itself, still deletes a space."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from service.api import create_app

    app = create_app(settings_for(tmp_path, api_keys={}, auth_disabled=True))
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as c:
        for name in ("keep", "typo-space"):
            assert c.post("/v1/spaces", json={"name": name, "dim": 3}).status_code == 201
        attack = ("<script>window.sent = Promise.all(['/v1/indexes', '/v1/spaces'].map(p => fetch('" + base
                  + "' + p, {method: 'POST', mode: 'no-cors', body: new Blob([JSON.stringify({name: 'pwned', "
                  "space: 'keep', dim: 3, vectors: [[1, 0, 0]]})])}))).then(() => 'sent', e => String(e));</script>")

        class Attacker(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                self.wfile.write(attack.encode())

            def log_message(self, *args):
                pass

        evil = ThreadingHTTPServer(("127.0.0.1", 0), Attacker)
        threading.Thread(target=evil.serve_forever, daemon=True).start()
        try:  # another site (localhost is not 127.0.0.1), and the same site on another port
            for page in (f"http://localhost:{evil.server_port}/", f"http://127.0.0.1:{evil.server_port}/"):
                t = Page(browser, page)
                t.page.goto(page)
                assert t.page.evaluate("window.sent") == "sent", page
                t.ctx.close()
        finally:
            evil.shutdown()
            evil.server_close()
        assert c.get("/v1/indexes").json()["data"] == []
        assert [s["name"] for s in c.get("/v1/spaces").json()["data"]] == ["keep", "typo-space"]

        t = Page(browser, base)  # the console: no key asked for, and its writes are answered
        t.goto("/ui/registry")
        t.page.get_by_role("button", name="Delete space typo-space").click()
        t.page.get_by_role("button", name="Confirm delete space typo-space").click()
        t.page.locator("#space-msg").filter(has_text="space typo-space deleted").wait_for()
        t.close()
        assert [s["name"] for s in c.get("/v1/spaces").json()["data"]] == ["keep"]
