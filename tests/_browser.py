"""The console's browser tests' tab (no tests here): Debian's Chromium driven by Playwright, every console
error, page error, Content-Security-Policy violation and request leaving the service collected."""

from __future__ import annotations

import os
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

# in every frame of every page: a blocked script, style, image or request is reported to the test (a srcdoc frame,
# such as the console's fit report, gets no init script: there Chromium's own console error reports it)
_REPORT_CSP = """document.addEventListener("securitypolicyviolation",
  e => window.__vbCsp(`${e.effectiveDirective} blocked ${e.blockedURI || "inline"} on ${e.documentURI}`));"""


class Page:
    """One browser tab with its console errors, CSP violations and off-loopback requests collected."""

    def __init__(self, browser, base: str, width: int = 1280, height: int = 800, **context):
        self.ctx = browser.new_context(viewport={"width": width, "height": height}, **context)
        self.page = self.ctx.new_page()
        self.page.set_default_timeout(60_000)
        self.base = base
        self.errors: list[str] = []
        self.offsite: list[str] = []
        self.urls: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", self._request)
        self.ctx.expose_function("__vbCsp", lambda s: self.errors.append("CSP violation: " + s))
        self.ctx.add_init_script(_REPORT_CSP)

    def _request(self, req) -> None:
        self.urls.append(req.url)
        if not (req.url.startswith(self.base) or req.url.startswith("data:") or req.url.startswith("about:")):
            self.offsite.append(req.url)

    @classmethod
    def open(cls, browser, base: str, path: str, key: str) -> Page:
        """A new tab on ``base + path``, logged in with ``key``."""
        t = cls(browser, base)
        t.goto(path)
        t.login(key)
        return t

    def goto(self, path: str) -> None:
        self.page.goto(self.base + path)

    def login(self, key: str) -> None:
        self.page.get_by_label("API key", exact=True).fill(key)
        self.page.get_by_role("button", name="Use key").click()
        self.page.locator("#key-state").wait_for(state="visible")

    def shot(self, name: str) -> None:
        out = os.environ.get("VECBRIDGE_CONSOLE_SHOTS")
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(Path(out) / f"console-{name}.png"))

    def close(self, expect_errors: tuple[str, ...] = ()) -> None:
        errs = [e for e in self.errors if not any(x in e for x in expect_errors)]
        self.ctx.close()
        assert self.offsite == [], f"requests left the service: {self.offsite}"
        assert errs == [], f"browser console errors: {errs}"


def launch(sync_api):
    """A headless Chromium for a module's tests (a generator for a module-scoped fixture: yields it, then closes)."""
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        yield b
        b.close()
