"""The console shows the answer to what was last asked, labelled with what was asked, in Debian's headless Chromium
against an in-process uvicorn server (keys on): an older, slower answer arriving last, a dropdown changed after a
search, a service that stops answering, and a registry with many spaces reached by keyboard.

Requests are held or refused by the browser's own interception (Playwright's ``page.route``), the way a slow or
failing service looks to the page; everything else is the real service. No test waits a fixed time: each waits for
a DOM state, or for the held requests to end and the page to have handled them (a later request's answer).
"""

from __future__ import annotations

import contextlib
import threading
import time

import httpx
import numpy as np
import pytest
from _api_support import W, planted, settings_for, vectors_b64
from _browser import CHROMIUM, Page, launch
from _jobs_support import wait_http_job
from _servers import serve_in_thread

READ_KEY, WRITE_KEY = "rkey-123", "wkey-456"
FILLER = 40  # spaces listed in the registry, each with a Delete button

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)")
pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium not installed")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Spaces e5 (its encoder, so pages can embed a query), minilm (an encoder, never used here), a, b and FILLER
    more; map a2b; indexes idx-e5 and idx-e5b of random e5 vectors (payload text and a ±1 label); steer tone over
    idx-e5's rows; a job that runs until the module ends (the jobs page polls every second)."""
    from service.api import create_app

    app = create_app(settings_for(tmp_path_factory.mktemp("latest")))
    rng = np.random.default_rng(0)
    E = rng.standard_normal((40, 384)).astype(np.float32)
    labels = [1 if i % 3 == 0 else -1 for i in range(len(E))]
    X, Y, _ = planted(300)
    release = threading.Event()
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=120.0) as c:
        for space in ({"name": "e5", "encoder": "multilingual-e5-small"},
                      {"name": "minilm", "encoder": "all-MiniLM-L6-v2"}, {"name": "a", "dim": 16},
                      {"name": "b", "dim": 16}, *({"name": f"filler-{i:02d}", "dim": 4} for i in range(FILLER))):
            assert c.post("/v1/spaces", headers=W, json=space).status_code == 201, space
        fit = {"name": "a2b", "source_space": "a", "target_space": "b", "method": "procrustes", "paired": True,
               "source": vectors_b64(X), "target": vectors_b64(Y)}
        assert wait_http_job(c, c.post("/v1/fits", headers=W, json=fit).json()["id"], 300, W)["state"] == "succeeded"
        for name, rows in (("idx-e5", E), ("idx-e5b", E[::-1].copy())):
            r = c.post("/v1/indexes", headers=W, json={
                "name": name, "space": "e5", "kind": "flat", **vectors_b64(rows),
                "payloads": [{"text": f"{name} row {i}", "label": y} for i, y in enumerate(labels)]})
            assert r.status_code == 201, r.text
        r = c.post("/v1/steers", headers=W, json={"name": "tone", "space": "e5", "labels": labels,
                                                  "params": {"method": "mean-shift"}, **vectors_b64(E)})
        assert wait_http_job(c, r.json()["id"], 300, W)["state"] == "succeeded"
        app.state.vb.jobs.submit(lambda ctx: release.wait(600) and None, kind="fit", description="a long fit")
        try:
            yield base, c, app
        finally:
            release.set()


@pytest.fixture(scope="module")
def browser():
    yield from launch(sync_api)


def _steered_ids(c: httpx.Client, eps: float) -> list[int]:
    body = {"texts": ["anything"], "k": 10, "steers": {"tone": eps}}
    r = c.post("/v1/indexes/idx-e5/search", headers=W, json=body)
    assert r.status_code == 200, r.text
    return [h["id"] for h in r.json()["results"][0]]


class Gate:
    """Holds the search requests made while ``closed``, lets the others through; ``release()`` lets the held ones
    go on (those the page gave up are gone already) and returns once each has ended in the browser."""

    def __init__(self, page, pattern: str):
        self.page, self.closed, self.held, self.ended, self.fail = page, False, [], set(), False
        page.on("requestfinished", lambda r: self.ended.add(r))
        page.on("requestfailed", lambda r: self.ended.add(r))
        page.route(pattern, self._route)

    def _route(self, route) -> None:
        if self.fail:
            route.fulfill(status=500, content_type="text/html", body="<html><h1>Internal Server Error</h1></html>")
        elif self.closed:
            self.held.append(route)
        else:
            route.continue_()

    def wait_held(self, n: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.held) < n:
            assert time.monotonic() < deadline, f"{len(self.held)} of {n} searches held after {timeout} s"
            self.page.wait_for_timeout(20)  # lets Playwright deliver the route events; no state is assumed

    def release(self, timeout: float = 60.0) -> None:
        for r in self.held:
            with contextlib.suppress(Exception):  # the page gave it up (aborted): nothing to continue
                r.continue_()
        deadline = time.monotonic() + timeout
        while not all(r.request in self.ended for r in self.held):
            ended = sum(r.request in self.ended for r in self.held)
            assert time.monotonic() < deadline, f"{ended} of {len(self.held)} released searches ended after {timeout} s"
            self.page.wait_for_timeout(20)
        # the page handled what arrived: a request made after those ended is answered after them
        self.page.evaluate("async () => { await fetch(location.href); await new Promise(r => setTimeout(r)); }")


def _asking(base: str, browser, path: str) -> tuple[Page, Gate]:
    """Page ``path`` (search or steer) on index idx-e5 with the query "anything", and a closed Gate on its
    searches: what it asks next is held."""
    t = Page.open(browser, base, path, READ_KEY)
    t.page.get_by_label("index", exact=True).select_option("idx-e5")
    t.page.get_by_label("query", exact=True).fill("anything")
    gate = Gate(t.page, "**/v1/indexes/*/search")
    gate.closed = True
    return t, gate


def _steer_run_held(base: str, browser) -> tuple[Page, Gate]:
    """The steer page with a query, its ε moved by one step (to 0.25) by keyboard: that run's two searches held."""
    t, gate = _asking(base, browser, "/ui/steer")
    t.page.locator("#st-eps").focus()
    t.page.keyboard.press("ArrowRight")
    gate.wait_held(2)
    return t, gate


def test_a_slow_older_steer_answer_never_replaces_the_latest(world, browser):
    """Each ε change re-runs the steered search; ε 0.25's slower answer, arriving after ε 3's, was shown under
    "ε = 3"; a failed re-run left the old hits under the new ε. Now the latest run's answer shows, labelled with
    the ε it searched, and a failed run clears the hits."""
    base, c, _ = world
    at3, at025 = _steered_ids(c, 3.0), _steered_ids(c, 0.25)
    assert at3 != at025  # else the test could not tell the answers apart
    t, gate = _steer_run_held(base, browser)
    pg = t.page
    gate.closed = False
    pg.keyboard.press("End")  # ε 3: answered at once
    pg.locator("#st-steered-h", has_text="ε = 3").wait_for()
    pg.locator("#steered-hits li").nth(9).wait_for()
    gate.release()  # ε 0.25's answers arrive last
    shown = [int(x.split()[-1]) for x in pg.locator("#steered-hits li > span:first-child").all_inner_texts()]
    assert shown == at3, (shown, at3, at025)
    assert pg.locator("#st-steered-h").inner_text() == "ε = 3"
    assert "at ε = 3 (steer tone, index idx-e5)" in pg.locator("#steer-summary").inner_text()

    gate.fail = True
    pg.keyboard.press("Home")  # ε -3: the service fails
    pg.locator("#steer-msg", has_text="500").wait_for()
    assert pg.locator("#steered-hits li").count() == 0 and pg.locator("#base-hits li").count() == 0
    assert not pg.locator("#steer-summary").is_visible()
    assert pg.locator("#st-steered-h").inner_text() == "steered"  # it read "ε =" with nothing
    t.close(expect_errors=("status of 500",))


def test_the_search_form_says_nothing_it_does_not_know_and_an_emptied_k_searches_ten(world, browser):
    """QA: before a search the headings read "Native ( model)" and the steer page's "ε =" with nothing; a search
    with k cleared sent k 0 (a 422) where an empty k is the default 10; an error stayed up after the browser
    refused an invalid k (its own bubble says why). Now the headings say only what is known, an empty k searches
    10, and a search the browser refuses clears the last search's error."""
    base, _, _ = world
    t = Page.open(browser, base, "/ui/steer", READ_KEY)
    t.page.locator("#st-steer option").first.wait_for(state="attached")
    assert t.page.locator("#st-steered-h").inner_text() == "steered"
    t.goto("/ui/search")
    pg = t.page
    pg.get_by_label("index", exact=True).select_option("idx-e5")
    assert (pg.locator("#native-h").inner_text(), pg.locator("#mapped-h").inner_text()) == (
        "Native", "Through the map")
    pg.get_by_role("button", name="Search").click()  # no query yet: the page's own refusal
    msg = pg.locator("#search-msg")
    msg.filter(has_text="type a query first").wait_for()
    pg.get_by_label("k", exact=True).fill("0")
    pg.get_by_role("button", name="Search").click()  # refused by the browser (min 1): no search, no old error
    msg.wait_for(state="hidden")
    pg.get_by_label("query's model (space)", exact=True).select_option("e5")
    pg.get_by_label("query", exact=True).fill("anything")
    pg.get_by_label("k", exact=True).fill("")
    with pg.expect_request("**/v1/indexes/idx-e5/search") as asked:
        pg.get_by_role("button", name="Search").click()
    assert asked.value.post_data_json["k"] == 10, asked.value.post_data_json
    pg.locator("#overlap").wait_for(state="visible")
    assert pg.locator("#overlap").inner_text().startswith("overlap@10: 10 / 10")
    assert pg.locator("#native-h").inner_text() == "Native (e5 model, index idx-e5)"
    t.close()


def test_search_results_keep_the_labels_of_the_search_that_found_them(world, browser):
    """Changing the query's model or the index after a search relabelled the old hits ("Through the map (minilm
    model)" over e5's hits); the overlap said overlap@10 for k = 3; a hit both lists hold was marked by a tint
    alone. Now the headings say what was searched, a changed input marks the results as the last search's, the
    overlap is @k and a shared hit says so in words."""
    base, _, _ = world
    t = Page.open(browser, base, "/ui/search", READ_KEY)
    pg = t.page
    pg.get_by_label("index", exact=True).select_option("idx-e5")
    pg.get_by_label("query's model (space)", exact=True).select_option("e5")
    pg.get_by_label("query", exact=True).fill("anything")
    pg.get_by_label("k", exact=True).fill("3")
    pg.get_by_role("button", name="Search").click()
    pg.locator("#overlap").wait_for(state="visible")
    assert pg.locator("#overlap").inner_text().startswith("overlap@3: 3 / 3")
    assert pg.locator("#mapped-hits li", has_text="found by both models").count() == 3
    mapped = pg.locator("#mapped-h").inner_text()
    assert "(e5 model)" in mapped and "idx-e5" in pg.locator("#native-h").inner_text()
    hits = pg.locator("#native-hits").inner_text()
    stale = pg.locator("#search-stale")
    assert not stale.is_visible()
    pg.get_by_label("query's model (space)", exact=True).select_option("minilm")  # no new search
    stale.wait_for()
    assert "query's model e5" in stale.inner_text() and "index idx-e5," in stale.inner_text()
    assert pg.locator("#mapped-h").inner_text() == mapped
    pg.get_by_label("index", exact=True).select_option("idx-e5b")
    assert "idx-e5)" in pg.locator("#native-h").inner_text() and pg.locator("#native-hits").inner_text() == hits
    pg.get_by_role("button", name="Search").click()  # the search asked for now: its own labels
    pg.locator("#native-h", has_text="idx-e5b").wait_for()
    stale.wait_for(state="hidden")
    t.close(expect_errors=("status of 404",))


def test_an_input_changed_while_the_search_runs_marks_its_answer_as_the_last_searchs(world, browser):
    """The form changed while the search was on its way: the answer came unmarked, under the old index's headings,
    beside a form asking for another index and query."""
    base, _, _ = world
    t, gate = _asking(base, browser, "/ui/search")
    pg = t.page
    pg.get_by_role("button", name="Search").click()
    gate.wait_held(2)
    pg.get_by_label("query", exact=True).fill("something else entirely")
    pg.get_by_label("index", exact=True).select_option("idx-e5b")
    gate.closed = False
    gate.release()
    pg.locator("#native-h", has_text="idx-e5").wait_for()
    stale = pg.locator("#search-stale")
    stale.wait_for()
    assert "index idx-e5," in stale.inner_text()
    t.close(expect_errors=("status of 404",))


def test_a_service_that_stops_answering_is_said_and_polled_one_request_at_a_time(world, browser):
    """A hung service: the jobs page showed its last "running" row as live, with no word, and started a new poll
    each second while none had answered. Now a poll waits for the last one, gives up after VB.timeoutSeconds and
    says so, and the page goes on polling: it recovers when the service answers again."""
    base, _, _ = world
    t = Page.open(browser, base, "/ui/jobs", READ_KEY)
    pg = t.page
    pg.locator("#jobs tbody tr", has_text="running").first.wait_for()
    pg.evaluate("VB.timeoutSeconds = 2")
    flight = {"now": 0, "most": 0}

    def began(r):
        if "/v1/jobs" in r.url:
            flight["now"] += 1
            flight["most"] = max(flight["most"], flight["now"])

    def ended(r):
        if "/v1/jobs" in r.url:
            flight["now"] -= 1

    pg.on("request", began)
    pg.on("requestfinished", ended)
    pg.on("requestfailed", ended)
    held = []
    pg.route("**/v1/jobs?*", lambda route: held.append(route))  # the service stops answering
    alert = pg.locator("main [role=alert]", has_text="the service did not answer in 2 s")
    alert.wait_for(timeout=30_000)
    while len(held) < 2:  # it went on polling after giving the first poll up
        pg.wait_for_timeout(50)
    assert flight["most"] == 1, flight
    pg.unroute("**/v1/jobs?*")  # answering again
    alert.wait_for(state="hidden")
    assert pg.locator("#jobs tbody tr", has_text="running").count() >= 1
    t.close(expect_errors=("ERR_", "net::"))


def test_a_map_opened_by_keyboard_takes_focus_to_its_versions_past_every_space(world, browser):
    """With many spaces, each one's Delete button came before the versions in tab order (1,016 Tab presses to
    "Move alias" with 1,000 spaces), and Enter on a map's name said nothing. Now focus moves to the versions'
    heading, a polite live region says they loaded, and the alias form is a few Tabs on, whatever the spaces."""
    base, _, _ = world
    t = Page.open(browser, base, "/ui/registry", READ_KEY)
    pg = t.page
    pg.locator("#spaces tbody tr").nth(FILLER).wait_for()
    pg.get_by_role("button", name="a2b").focus()
    pg.keyboard.press("Enter")
    pg.locator("#registry-announce", has_text="versions of a2b loaded: 1 version").wait_for()
    assert pg.evaluate("document.activeElement.id") == "versions-h"
    presses = 0
    while pg.evaluate("document.activeElement.textContent.trim()") != "Move alias" and presses < 3 * FILLER:
        pg.keyboard.press("Tab")
        presses += 1
    assert presses <= 5, presses
    t.close()


def test_focus_and_words_a_keyboard_or_screen_reader_user_had_lost(world, browser):
    """Focus fell to <body> after "Use key" (its form hides) and after Cancel on the jobs page; a job's full id was
    only in a hover title; an armed Delete stayed armed whatever the user did next; the 401 panel named
    VECBRIDGE_API_KEYS alone, though keys may come from the file VECBRIDGE_API_KEYS_FILE names."""
    base, _, app = world
    t = Page(browser, base)
    t.goto("/ui/registry")
    assert "VECBRIDGE_API_KEYS_FILE" in t.page.locator("#unauthorized").inner_text()
    t.login(READ_KEY)
    t.page.wait_for_function("() => document.activeElement.id === 'main'")
    delete = t.page.get_by_role("button", name="Delete space filler-00")
    delete.click()
    armed = t.page.get_by_role("button", name="Confirm delete space filler-00")
    armed.wait_for()
    t.page.keyboard.press("Escape")
    delete.wait_for()
    assert armed.count() == 0
    t.close()

    release = threading.Event()
    job, _ = app.state.vb.jobs.submit(lambda ctx: release.wait(600) and None, kind="fit", description="to cancel")
    try:
        t = Page.open(browser, base, "/ui/jobs", WRITE_KEY)
        row = t.page.locator(f"tr[data-job='{job.id}']")
        row.wait_for()
        assert job.id in row.inner_text()  # the whole id, not only its first 8 characters
        row.get_by_role("button", name=f"cancel job {job.id[:8]}").click()
        t.page.locator("#cancel-msg", has_text="cancel requested").wait_for()
        t.page.wait_for_function("() => document.activeElement.id === 'cancel-msg'")
        t.close()
    finally:
        release.set()



def test_a_steer_run_given_up_for_one_refused_at_once_leaves_the_button_ready(world, browser):
    """A steered search still unanswered when an ε change starts one refused at once (a blank query): the page gave
    the first up, and the Search button must not stay busy ("Searching…", disabled) waiting for it."""
    base, _, _ = world
    t, gate = _steer_run_held(base, browser)
    pg = t.page
    button = pg.locator("#steer-form button[type=submit]")
    assert button.inner_text() == "Searching…" and button.get_attribute("aria-busy") == "true"
    pg.get_by_label("query", exact=True).fill("   ")
    pg.locator("#st-eps").focus()
    pg.keyboard.press("ArrowRight")
    pg.locator("#steer-msg", has_text="type a query first").wait_for()
    gate.release()
    assert button.is_enabled() and button.inner_text() == "Search"
    t.close()


def test_a_sweep_given_up_for_a_newer_search_never_draws_and_a_drawn_one_says_what_it_answers(world, browser):
    """Moving ε while a sweep ran re-enabled "Sweep ε" mid-sweep, and the sweep's chart landed later under the newer
    question, saying nothing of which. Now a newer search gives the sweep up (its chart is never drawn) and a
    drawn chart names its steer, index and query."""
    base, _, _ = world
    t, gate = _asking(base, browser, "/ui/steer")
    pg = t.page
    sweep_button = pg.get_by_role("button", name="Sweep ε")
    sweep_button.click()
    gate.wait_held(7)
    assert sweep_button.is_disabled()
    gate.closed = False
    pg.locator("#st-eps").focus()
    pg.keyboard.press("ArrowRight")  # a steered search at ε 0.25: answered at once
    pg.locator("#st-steered-h", has_text="ε = 0.25").wait_for()
    gate.release()  # the sweep's answers, had it not been given up
    assert pg.locator("[x-ref=sweep] canvas").count() == 0
    assert pg.locator("#sweep-of").inner_text() == "Attribute share vs ε"

    pg.get_by_label("query", exact=True).fill("something else")
    sweep_button.click()
    pg.locator("[x-ref=sweep] canvas").first.wait_for()
    said = pg.locator("#sweep-of").inner_text()
    assert said == 'Attribute share vs ε (steer tone, index idx-e5, query "something else")'
    t.close(expect_errors=("status of 404",))


def test_the_search_page_offers_only_spaces_that_can_embed_its_text_query(world, browser):
    """The query model's list held every space, those without an encoder too (a, b, the fillers): picking one
    answered "has no encoder" after the search. Now it lists the spaces with an encoder."""
    base, _, _ = world
    t = Page.open(browser, base, "/ui/search", READ_KEY)
    options = t.page.locator("#s-space option")
    options.nth(1).wait_for(state="attached")
    assert sorted(options.evaluate_all("os => os.map(o => o.value)")) == ["e5", "minilm"]
    t.close()
