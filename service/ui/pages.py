"""Console routes: one Jinja2 shell per page under ``/ui``, the vendored assets under ``/ui/static``,
and Swagger UI at ``/docs`` from those assets (FastAPI's default page loads it from a CDN).

Both send a Content-Security-Policy (the other security headers come with every answer, see
:data:`service.api.middleware.SECURITY_HEADERS`)."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

import align
from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from ..config import Settings, app_settings

__all__ = ["mount_console", "STATIC_DIR", "PAGES", "CONSOLE_CSP", "DOCS_CSP"]

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
templates = Jinja2Templates(directory=str(HERE / "templates"))

# (path under /ui, template, title in the navigation)
PAGES = (
    ("/registry", "registry.html", "Registry"),
    ("/jobs", "jobs.html", "Jobs"),
    ("/search", "search.html", "Search"),
    ("/steer", "steer.html", "Steer"),
    ("/migrations", "migrations.html", "Migrations"),
)

# Scripts only from /ui/static, never inline, and no eval (Alpine's CSP build interprets the x- attributes itself):
# markup that ever slipped into a page could not run, not even through an Alpine attribute. Inline styles for
# Alpine's :style and the fit report's <style>, data: images for its charts (the report's srcdoc frame inherits
# this policy); requests to this origin only; no site may frame the console.
_POLICY = ("default-src 'self'; script-src 'self'{}; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
           "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
CONSOLE_CSP = _POLICY.format("")
# /docs: Swagger UI starts from one inline <script>, allowed by its hash (filled in per page)
DOCS_CSP = _POLICY.format(" {}")

router = APIRouter(include_in_schema=False)


def _settings(request: Request) -> Settings:
    state = getattr(request.app.state, "vb", None)
    if state is not None:
        return state.settings
    return app_settings(request.app)


def _page(template: str, title: str):
    async def page(request: Request) -> HTMLResponse:
        return templates.TemplateResponse(request, template, {
            "title": title, "pages": PAGES, "version": align.__version__, "current": title,
            "auth_required": not _settings(request).auth_disabled}, headers={"Content-Security-Policy": CONSOLE_CSP})

    page.__name__ = f"ui_{template.split('.')[0]}"
    return page


for _path, _template, _title in PAGES:
    router.add_api_route("/ui" + _path, _page(_template, _title), methods=["GET"], response_class=HTMLResponse)


@router.get("/ui")
@router.get("/ui/")
async def ui_home() -> RedirectResponse:
    return RedirectResponse("/ui/registry", status_code=307)


@router.get("/docs")
async def swagger_ui() -> HTMLResponse:
    page = get_swagger_ui_html(openapi_url="/openapi.json", title="vecbridge - Swagger UI",
                               swagger_js_url="/ui/static/swagger/swagger-ui-bundle.js",
                               swagger_css_url="/ui/static/swagger/swagger-ui.css",
                               swagger_favicon_url="/ui/static/swagger/favicon-32x32.png")
    inline = re.findall(r"<script>(.*?)</script>", page.body.decode(), re.DOTALL)
    hashes = " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()}'" for s in inline)
    page.headers["Content-Security-Policy"] = DOCS_CSP.format(hashes)
    return page


def mount_console(app: FastAPI) -> None:
    """Add ``/ui``, ``/ui/static`` and a local ``/docs`` to ``app`` (built with ``docs_url=None``)."""
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=str(STATIC_DIR)), name="ui-static")
