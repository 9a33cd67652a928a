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
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException

from ..api.errors import allowed_methods
from ..config import Settings, app_settings
from ..reports import REPORT_CSS

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


def csp_hash(text: str) -> str:
    """The CSP hash source allowing an inline ``<script>`` or ``<style>`` whose content is exactly ``text``:
    ``'sha256-' + base64(SHA-256(UTF-8 text))``, quoted."""
    return f"'sha256-{base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()}'"


# Scripts only from /ui/static, never inline, and no eval (Alpine's CSP build interprets the x- attributes itself):
# markup that ever slipped into a page could not run, not even through an Alpine attribute. Styles only from
# /ui/static too, never a style attribute or an injected <style> (they could restyle the page: hide a warning,
# overlay a fake button); console.js sets its computed styles through the CSSOM (Alpine's :style with an
# object), which a policy does not govern. The one exception is the fit report's own <style> block, allowed by
# its hash: the report's srcdoc frame inherits this policy. data: images for the report's charts; requests to
# this origin only; no site may frame the console.
_POLICY = ("default-src 'self'; script-src 'self'{script}; style-src 'self'{style}; img-src 'self' data:; "
           "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
CONSOLE_CSP = _POLICY.format(script="", style=" " + csp_hash(REPORT_CSS))
# /docs: Swagger UI starts from one inline <script>, allowed by its hash (filled in per page)
DOCS_CSP = _POLICY.format(script=" {}", style="")

router = APIRouter(include_in_schema=False)


def _settings(request: Request) -> Settings:
    state = getattr(request.app.state, "vb", None)
    if state is not None:
        return state.settings
    return app_settings(request.app)


def _root(request: Request) -> str:
    """The path prefix a reverse proxy serves the service under (ASGI ``root_path``: ``Settings.root_path`` or the
    server's ``--root-path``), "" without one: every link, asset and API call of a page starts with it."""
    return request.scope.get("root_path", "").rstrip("/")


def _render(request: Request, template: str, title: str, status_code: int = 200, **extra) -> HTMLResponse:
    """A console page (``template`` over base.html) with its navigation, key bar and policy."""
    return templates.TemplateResponse(request, template, {
        "title": title, "pages": PAGES, "version": align.__version__, "current": title, "root": _root(request),
        "auth_required": not _settings(request).auth_disabled, "key_file": _settings(request).local_key_file,
        **extra}, status_code=status_code, headers={"Content-Security-Policy": CONSOLE_CSP})


def _page(template: str, title: str):
    async def page(request: Request) -> HTMLResponse:
        return _render(request, template, title)

    page.__name__ = f"ui_{template.split('.')[0]}"
    return page


for _path, _template, _title in PAGES:
    router.add_api_route("/ui" + _path, _page(_template, _title), methods=["GET"], response_class=HTMLResponse)


@router.get("/ui")
@router.get("/ui/")
async def ui_home(request: Request) -> RedirectResponse:
    return RedirectResponse(_root(request) + "/ui/registry", status_code=307)


#: after the /ui/static mount (routes match in order): any other address under /ui
fallback = APIRouter(include_in_schema=False)


@fallback.get("/ui/{rest:path}", response_model=None)
async def ui_not_found(request: Request, rest: str) -> HTMLResponse | RedirectResponse:
    """A /ui address that names no page (a typo, an old bookmark): a 404 console page linking every page, where a
    browser was shown the API's JSON error. A page's address with a trailing slash is redirected to the page, as
    Starlette did before this route caught it."""
    if any(rest.rstrip("/") == path.lstrip("/") for path, _, _ in PAGES) and rest.endswith("/"):
        return RedirectResponse(_root(request) + "/ui/" + rest.rstrip("/"), status_code=307)
    return _render(request, "not_found.html", "Page not found", status_code=404,
                   path=_root(request) + "/ui/" + rest)


@fallback.api_route("/ui/{rest:path}", methods=["DELETE", "OPTIONS", "PATCH", "POST", "PUT"], response_model=None)
async def ui_other_method(request: Request, rest: str) -> HTMLResponse | RedirectResponse:
    """Another method than GET / HEAD at a /ui address: a 405 (``Allow: GET, HEAD``) where the address is a page,
    else what GET answers there (the 404 page). It was a 405 for any address, one that names nothing too: the GET
    route above matched its path."""
    if allowed_methods(request):
        raise HTTPException(status_code=405)
    return await ui_not_found(request, rest)


# routes of no address in particular: allowed_methods (a 405's Allow) leaves them out
fallback.catch_all = ui_not_found.catch_all = ui_other_method.catch_all = True


class _Static(StaticFiles):
    """The console's assets; another method than GET / HEAD answers what GET does for a file that is not there (the
    404), and 405 for one that is: it was a 405 for any path."""

    async def get_response(self, path: str, scope) -> Response:
        if scope["method"] not in ("GET", "HEAD"):
            await super().get_response(path, {**scope, "method": "HEAD"})  # raises GET's 404
            raise HTTPException(status_code=405, headers={"Allow": "GET, HEAD"})
        return await super().get_response(path, scope)


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    root = _root(request)  # behind a proxy's prefix, the document and the assets are under it too
    page = get_swagger_ui_html(openapi_url=root + "/openapi.json", title="vecbridge - Swagger UI",
                               swagger_js_url=root + "/ui/static/swagger/swagger-ui-bundle.js",
                               swagger_css_url=root + "/ui/static/swagger/swagger-ui.css",
                               swagger_favicon_url=root + "/ui/static/swagger/favicon-32x32.png")
    hashes = " ".join(csp_hash(s) for s in re.findall(r"<script>(.*?)</script>", page.body.decode(), re.DOTALL))
    page.headers["Content-Security-Policy"] = DOCS_CSP.format(hashes)
    return page


def mount_console(app: FastAPI) -> None:
    """Add ``/ui``, ``/ui/static`` and a local ``/docs`` to ``app`` (built with ``docs_url=None``)."""
    from ..api.routing import with_head  # HEAD of every page, as of every API route

    app.include_router(with_head(router))
    app.mount("/ui/static", _Static(directory=str(STATIC_DIR)), name="ui-static")
    app.include_router(with_head(fallback))
