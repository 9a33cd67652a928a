"""The finishing pass of the OpenAPI document (``/openapi.json``), run once when it is first built.

FastAPI writes each operation from its route; what no single route knows is added here, from the document
and the service's settings:

* each operation's body limit, in its description (``body_limit``: the limit the guard enforces);
* the ``$defs`` of the request schemas that routes read themselves (:func:`service.api.openapi.json_body`),
  moved into ``components.schemas``, where their ``$ref`` (``#/components/schemas/...``) point: left inside an
  operation, ``#/$defs/...`` resolved from the document's root and found nothing;
* ``security`` (the bearer key) on exactly the operations that need a key under these settings: none with
  ``auth_disabled``, and ``/metrics`` only with ``metrics_access=key`` (a generated client sends the key where the
  document asks for it: ``/metrics`` asked for none and answered 401);
* the error answers every route of a kind can give (:data:`COMMON_ANSWERS`): 400 from the guard's Host and
  header checks on every route, 401 / 403 on every route that takes a key (and only there), 403
  ``CrossSiteRequestError`` on every route with auth off, 408 / 413 on every route that reads a body;
* the headers of those answers (:data:`STATUS_HEADERS`): ``WWW-Authenticate`` on a 401, ``Retry-After`` on a 429
  and a 503 (a generated client reads only the headers an answer declares);
* ``X-Request-ID`` on every answer of every operation (:data:`REQUEST_ID_HEADER`, once in ``components.headers``):
  :class:`~.middleware.ObserveMiddleware` adds it to every answer the app sends, and the document said nothing of it;
* the configured value of a limit where a schema says it stands for one (``x-limit``: the name of a
  ``limits`` setting, replaced by ``maximum`` = that setting's value: ``k`` of a search says this service's
  ``limits.max_k``, not the 10,000 no setting may exceed).

:func:`serve_document` serves it encoded once per root path, with an ``ETag``.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from .conditional import body_etag, not_modified
from .middleware import body_limit

__all__ = ["COMMON_ANSWERS", "CROSS_SITE", "ERROR_SCHEMA", "REQUEST_ID_HEADER", "STATUS_HEADERS", "finish_document",
           "hoist_defs", "serve_document"]

ERROR_SCHEMA = {"$ref": "#/components/schemas/ErrorBody"}

#: status -> (which operations can answer it, description). "all": every operation; "keyed": those that take an
#: API key (``security``); "body": those that read a request body (every method but GET, HEAD and DELETE)
COMMON_ANSWERS: dict[int, tuple[str, str]] = {
    400: ("all", ("`InvalidHostError`: a Host header not in `allowed_hosts` (the probes /healthz and /readyz answer "
                  "any); `InvalidHeaderError`: more than one `Content-Type`, `Host` or `Authorization` header.")),
    401: ("keyed", "Missing or unknown API key (`WWW-Authenticate: Bearer`)."),
    403: ("keyed", "The API key lacks the scope this route needs."),
    408: ("body", "The request body stalled: no bytes for `body_timeout_s`."),
    413: ("body", "Body over this route's limit (see the description) or more rows than `max_batch`."),
}
_RETRY_AFTER = {"description": "Seconds to wait before sending the request again: on every 429; on a 503 when a retry "
                               "can help (a part starting, a database busy, the service stopping), not when only its "
                               "operator can (a part not configured, a full or read-only data dir).",
                "schema": {"type": "integer", "minimum": 0}}
#: status -> the headers its answers carry, declared wherever the status is (:mod:`service.api.errors` sends them)
STATUS_HEADERS: dict[str, dict[str, dict]] = {
    "401": {"WWW-Authenticate": {"description": "`Bearer`: the scheme to send the key with.",
                                 "schema": {"type": "string"}}},
    "429": {"Retry-After": _RETRY_AFTER},
    "503": {"Retry-After": _RETRY_AFTER},
}
#: the header every answer carries (:class:`~.middleware.ObserveMiddleware`); each answer refers to it
REQUEST_ID_HEADER = {"description": "The request's id: the request's own `X-Request-ID` (its first 64 characters) "
                                    "when it sent one, else a new one (32 hex digits). The access log line and a "
                                    "500's message carry it: quote it when reporting a problem.",
                     "schema": {"type": "string", "minLength": 1, "maxLength": 64}}
_REQUEST_ID_REF = {"X-Request-ID": {"$ref": "#/components/headers/X-Request-ID"}}
#: the 403 of every route with auth off (``auth_disabled``), from the guard (:func:`.middleware.cross_site`)
CROSS_SITE = ("`CrossSiteRequestError`: auth is off and the request came from another site's web page (an `Origin` "
              "that is neither the service's own nor in `cors_origins`, or `Sec-Fetch-Site: cross-site`).")

_NO_BODY = ("get", "head", "delete")


def _takes_body(method: str) -> bool:
    return method.lower() not in _NO_BODY


def hoist_defs(spec: dict) -> None:
    """Move every ``$defs`` found under ``spec["paths"]`` into ``components.schemas`` (ValueError when a name is
    taken by another schema: two models of one name would then share one entry)."""
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for name, schema in node.pop("$defs", {}).items():
                walk(schema)
                if schemas.setdefault(name, schema) != schema:
                    raise ValueError(f"OpenAPI component {name!r} is defined twice, differently")
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(spec.get("paths", {}))


def _apply_limits(node: Any, limits) -> None:
    """``x-limit: NAME`` in a schema: its ``maximum`` becomes ``limits.NAME`` (the service's configured value)."""
    if isinstance(node, dict):
        name = node.pop("x-limit", None)
        if name is not None:
            node["maximum"] = getattr(limits, name)
        for value in node.values():
            _apply_limits(value, limits)
    elif isinstance(node, list):
        for value in node:
            _apply_limits(value, limits)


def _error(text: str) -> dict:
    return {"description": text, "content": {"application/json": {"schema": dict(ERROR_SCHEMA)}}}


def _key_needed(path: str, op: dict, settings) -> bool:
    """Whether a request to ``op`` must carry a key under ``settings``: a route that takes one (FastAPI declared its
    ``security``) while keys are on; ``/metrics`` only with ``metrics_access=key``."""
    if settings.auth_disabled or not op.get("security"):
        return False
    return path != "/metrics" or settings.metrics_access == "key"


def _declare_common(op: dict, method: str, settings) -> None:
    responses = op.setdefault("responses", {})
    if not op.get("security"):  # a router declares 401 / 403 for its routes: answered only where a key is needed
        responses.pop("401", None)
        responses.pop("403", None)
    if settings.auth_disabled:
        responses["403"] = _error(CROSS_SITE)
    for status, (which, text) in COMMON_ANSWERS.items():
        if which == "keyed" and not op.get("security"):
            continue
        if which == "body" and not _takes_body(method):
            continue
        responses.setdefault(str(status), _error(text))
    for status, answer in responses.items():
        headers = {**STATUS_HEADERS.get(status, {}), **_REQUEST_ID_REF, **answer.get("headers", {})}
        responses[status] = {**answer, "headers": headers}


def finish_document(spec: dict, settings) -> dict:
    """``spec`` (FastAPI's document) finished in place, as described in this module's docstring."""
    for path, ops in spec.get("paths", {}).items():
        for method, op in ops.items():
            if not isinstance(op, dict):
                continue
            if _takes_body(method):
                n, setting = body_limit(settings, method.upper(), path)
                nb, setting_b = body_limit(settings, method.upper(), path, "application/octet-stream")
                text = f"\n\nBody limit: {n} bytes (`{setting.split(';')[0]}`)"
                if nb != n:
                    text += f"; binary bodies {nb} bytes (`{setting_b}`)"
                op["description"] = (op.get("description") or "") + text + "."
            if not _key_needed(path, op, settings):
                op.pop("security", None)
            _declare_common(op, method, settings)
    if not any(op.get("security") for ops in spec.get("paths", {}).values() for op in ops.values()
               if isinstance(op, dict)):  # no operation takes a key: no scheme for a generated client to ask for
        spec.get("components", {}).pop("securitySchemes", None)
    spec.setdefault("components", {}).setdefault("headers", {})["X-Request-ID"] = REQUEST_ID_HEADER
    hoist_defs(spec)
    _apply_limits(spec, settings.limits)
    return spec


def serve_document(app) -> None:
    """Answer ``GET app.openapi_url`` (and HEAD) with the document's bytes, encoded once per root path, instead of
    FastAPI's route, which encoded the whole document again for every request (~240 KB: 2-8 ms each, and the
    console's /docs asks for it on every load). The bytes are those FastAPI sent (its ``JSONResponse``), ``servers``
    naming the request's root path (``--root-path``, :class:`~.middleware.RootPathMiddleware`) when it is not
    there already; the answer carries their ``ETag`` (a matching ``If-None-Match``: 304) and ``no-cache``, so a
    browser or proxy asks again after an upgrade. Encoded again when ``app.openapi()`` answers another document."""
    encoded: dict[str, tuple[dict, bytes, str]] = {}  # root path -> (the document, its bytes, their ETag)

    async def openapi_document(request: Request) -> Response:
        root = request.scope.get("root_path", "").rstrip("/")
        spec = app.openapi()
        hit = encoded.get(root)
        if hit is None or hit[0] is not spec:
            shown = spec
            if root and app.root_path_in_servers and root not in {s.get("url") for s in spec.get("servers", [])}:
                shown = {**spec, "servers": [{"url": root}, *spec.get("servers", [])]}
            body = json.dumps(shown, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()
            if len(encoded) >= 8:  # root paths are the server's settings, a few at most: never grows unbounded
                encoded.clear()
            encoded[root] = hit = (spec, body, body_etag(body))
        _, body, etag = hit
        headers = {"ETag": etag, "Cache-Control": "no-cache"}
        return not_modified(request.headers.get("if-none-match"), etag, "no-cache") or \
            Response(body, media_type="application/json", headers=headers)

    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) != app.openapi_url]
    app.add_route(app.openapi_url, openapi_document, include_in_schema=False)
