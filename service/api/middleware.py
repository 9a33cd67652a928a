"""Pure-ASGI middleware: Host check, with auth off another site's web pages refused (:func:`cross_site`), key check,
body limit and body timeout before and while the body is read, and request id + latency metrics + access log
(every answer carries ``x-request-id`` and the security headers of ``SECURITY_HEADERS``; a 5xx, a 408 or a 413
also ``Connection: close``).

Pure ASGI (not ``BaseHTTPMiddleware``) keeps the per-request overhead to a few microseconds,
which matters for the binary transform fast path.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import time
from urllib.parse import urlsplit

from ..limits import whole_body_command
from ..logging import get_logger
from ..memory import TRIM_AFTER_BYTES, trim_after
from ..metrics import ServiceMetrics
from ..errors import (AuthenticationError, PayloadTooLargeError, PermissionDeniedError, RequestTimeoutError,
                      ServiceStoppingError)
from .responses import dumps
from .waits import within

__all__ = ["GuardMiddleware", "ObserveMiddleware", "RootPathMiddleware", "BODY_CLASS", "body_limit", "SECURITY_HEADERS",
           "accepted_hosts", "host_allowed", "host_name", "cross_site", "route_path", "new_request_id"]

_MATCHED_PATHS, _MATCHED_PATH = 4096, 256  # GuardMiddleware remembers the route of this many paths of this length
_access = get_logger("access")
_errors = get_logger("errors")
_QUIET = ("/healthz", "/readyz", "/metrics")
_FIXED = ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect")
# On every answer: no MIME sniffing, no framing by any site (clickjacking the console's buttons), no Referer
# from a page of the service; and, where the route set none (the console pages, /docs and fit reports set
# their own), a Content-Security-Policy under which nothing loads or runs: JSON opened in a tab stays inert.
SECURITY_HEADERS = ((b"x-content-type-options", b"nosniff"), (b"x-frame-options", b"DENY"),
                    (b"referrer-policy", b"no-referrer"))
_CSP = b"content-security-policy"
_CSP_NONE = (_CSP, b"default-src 'none'; frame-ancestors 'none'")
# a version-4 UUID's fixed bits (RFC 4122: version 4, variant 10), as uuid.UUID(version=4) sets them
_UUID4_KEEP = ~((0xF000 << 64) | (0xC000 << 48))
_UUID4_SET = (4 << 76) | (0x8000 << 48)


def new_request_id() -> str:
    """A request id: a random version-4 UUID as 32 hex digits, what ``uuid.uuid4().hex`` gives, without the ``UUID``
    object (its checks and conversions cost ~4 µs of every request; this ~1 µs)."""
    return "%032x" % (int.from_bytes(os.urandom(16), "big") & _UUID4_KEEP | _UUID4_SET)


def route_path(scope) -> str:
    """The request's path as the routes see it: without the proxy's prefix (``root_path``) that uvicorn's
    ``--root-path`` and :class:`RootPathMiddleware` put in front of it, as Starlette's router strips it."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    if root and path.startswith(root) and (len(path) == len(root) or path[len(root)] == "/"):
        return path[len(root):]
    return path


class RootPathMiddleware:
    """Serve under ``root_path`` (``Settings.root_path``), the prefix a reverse proxy serves the service under: each
    request's scope gets it as uvicorn's ``--root-path`` gives it (``root_path`` set, ``path`` and ``raw_path``
    prefixed), so pages, redirects and the OpenAPI ``servers`` carry it, whatever server runs the app. Unless the
    server set one.

    The proxy may strip the prefix (nginx ``proxy_pass .../;``, an ingress rewrite) or pass the full path on (an
    ingress without a rewrite, Traefik without StripPrefix): a path that already starts with the prefix, at a
    segment boundary (``/vbx`` is not under ``/vb``), is taken as it is, so both give the same scope and answers.
    A server's own ``--root-path`` (uvicorn's) puts the prefix in front of every path, a full one too: that doubled
    prefix is taken once. Not where the prefix's first segment is one of the service's own (``own``: ``v1``, ``ui``,
    ...): a path under such a prefix is the service's own path, as a stripping proxy sends it."""

    def __init__(self, app, root_path: str = "", own: frozenset[str] = frozenset()) -> None:
        self.app, self.root, self._own = app, root_path, frozenset(own)

    def _under(self, path: str, root: str) -> bool:
        """Whether ``path`` (a full one) starts with the prefix ``root``, which is not one of the service's paths."""
        return (path.startswith(root) and (len(path) == len(root) or path[len(root)] == "/")
                and root.split("/", 2)[1] not in self._own)

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            root = scope.get("root_path")
            if root:  # the server's: it prefixed the path, doubling the prefix of a full one
                if self._under(scope["path"], root + root):
                    scope["path"] = scope["path"][len(root):]
                    raw, rb = scope.get("raw_path"), root.encode("ascii")
                    if raw is not None and raw.startswith(rb + rb):
                        scope["raw_path"] = raw[len(rb):]
            elif self.root:
                scope["root_path"] = self.root
                if not self._under(scope["path"], self.root):  # stripped by the proxy: put it back
                    scope["path"] = self.root + scope["path"]
                    if scope.get("raw_path") is not None:
                        scope["raw_path"] = self.root.encode("ascii") + scope["raw_path"]
        return await self.app(scope, receive, send)


def _fixed_route(path: str) -> str:
    """Label for requests that matched no API route: FastAPI's own pages by name, else 'unmatched'."""
    return path if path in _FIXED else "unmatched"


# Body class per route (method, template) that takes more than a small body: "binary" (the transform: JSON or a
# binary body), "json" (JSON only: anything else is a 415) or "texts". Every other route, and every route added
# without an entry here, gets the small limit: a new route never reads a bulk body by default.
BODY_CLASS: dict[tuple[str, str], str] = {
    ("POST", "/v1/maps/{ref}/transform"): "binary",
    **{("POST", path): "json" for path in (
        "/v1/indexes", "/v1/indexes/{name}/vectors", "/v1/indexes/{name}/search", "/v1/collections/{name}/search",
        "/v1/fits", "/v1/steers", "/v1/steers/{ref}/apply", "/v1/lm/steers", "/v1/plans", "/v1/maps/{ref}/evaluate",
        "/v1/migrations", "/v1/verifications")},  # their keep set: the re-embedded rows' vectors
    **{("POST", path): "texts" for path in (
        "/v1/indexes/{name}/delete", "/v1/embeddings", "/v1/lm/generate", "/v1/lm/analyze")},
}


def body_limit(settings, method: str, template: str | None, content_type: str | None = None) -> tuple[int, str]:
    """``(bytes, setting name)`` a request to ``method template`` may send (``template=None``: no route).

    The transform takes binary bodies (octet-stream, .npy) up to ``max_body_bytes``; JSON bodies of bulk routes
    hold ``limits.body_bytes_json``: one JSON parse holds the GIL (the event loop waits) for its whole run,
    about 3 ms per MB.
    """
    lim = settings.limits
    cls = BODY_CLASS.get((method, template or ""), "small")
    if cls in ("binary", "json"):
        json_body = (content_type or "application/json").split(";")[0].strip().lower() == "application/json"
        if lim.body_bytes_json < settings.max_body_bytes and (json_body or cls == "json"):
            return lim.body_bytes_json, "limits.body_bytes_json" + (
                "; binary bodies or vectors_b64 batches" if cls == "binary" else "")
        return settings.max_body_bytes, "max_body_bytes"
    if cls == "texts":
        return min(lim.body_bytes_texts, settings.max_body_bytes), "limits.body_bytes_texts"
    return min(lim.body_bytes_small, settings.max_body_bytes), "limits.body_bytes_small"


def too_large(n: int | None, limit: int, setting: str, template: str | None) -> str:
    """The 413 message for a body of ``n`` bytes (None: counted as it came) over ``limit`` on route ``template``:
    what the client can do. A fit or plan cannot be split into batches (QA: a 1,000-pair 3072-d fit, 82 MB, was
    told "send smaller batches"): run it with the CLI on files or raise the setting; an index is created from part
    of its rows and the rest added in batches."""
    size = "request body" if n is None else f"request body of {n} bytes"
    head = f"{size} exceeds the limit of {limit} bytes ({setting})"
    env = "VECBRIDGE_" + setting.split(";")[0].upper().replace(".", "__")
    if (command := whole_body_command(template)) is not None:
        return f"{head}: this body is not split into batches; run it offline with `{command}` on files, or raise {env}"
    if template == "/v1/indexes":
        return (f"{head}: create the index from part of the rows and add the rest in batches "
                "(POST /v1/indexes/{name}/vectors), or build it offline with `vecbridge index create`")
    return f"{head}; send smaller batches"


LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
_PROBES = ("/healthz", "/readyz")


def accepted_hosts(settings) -> tuple[str, ...] | None:
    """The Host names ``settings`` answer (``None``: any): ``allowed_hosts`` when set; else any while keys are on,
    and with auth off the loopback names plus a specific (not wildcard) bind host (see ``Settings.allowed_hosts``)."""
    if settings.allowed_hosts:
        return None if "*" in settings.allowed_hosts else tuple(settings.allowed_hosts)
    if not settings.auth_disabled:
        return None
    bind = settings.host.strip("[]").lower()
    return LOOPBACK_HOSTS + (() if bind in ("", "0.0.0.0", "::") else (bind,))


def host_name(header: bytes | None) -> str:
    """The name in a Host header, lower case, without port, IPv6 brackets or a final dot ("" when absent). Brackets
    that hold no IPv6 address (``[localhost]``), or are not closed (``[::1``), and a port that is not digits
    (``localhost:abc``) are kept: a name no entry matches."""
    h = (header or b"").decode("latin-1").strip().lower()
    if h.startswith("["):
        inside, closed, port = h[1:].partition("]")
        if not closed or not _is_ipv6(inside) or (port and not re.fullmatch(r":[0-9]*", port)):
            return h
        return inside
    if h.count(":") == 1:
        name, _, port = h.partition(":")
        if not re.fullmatch(r"[0-9]*", port):  # "localhost:abc" is no Host a client sends: a name no entry matches
            return h
        h = name
    return h.rstrip(".")


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def host_allowed(name: str, accepted: tuple[str, ...]) -> bool:
    """``name`` equals an accepted entry, or ends with ``.domain`` of a ``*.domain`` entry."""
    return any(name == a or (a.startswith("*.") and name.endswith(a[1:])) for a in accepted)


_DEFAULT_PORT = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def _origin_key(origin: str) -> tuple[str, str, int | None] | None:
    """``(scheme, host, port)`` of an origin ``scheme://host[:port]`` (default port filled in), None if it is none."""
    try:
        p = urlsplit(origin.strip().lower())
        port = p.port
    except ValueError:
        return None
    if not p.scheme or not p.hostname or p.path not in ("", "/") or p.query or p.fragment or "@" in p.netloc:
        return None
    return p.scheme, p.hostname.rstrip("."), port if port is not None else _DEFAULT_PORT.get(p.scheme)


def cross_site(scope, headers: dict, cors_origins) -> str | None:
    """Why a request with auth off comes from another site's web page (None: it does not). Such a page can send a
    request without a CORS preflight (``mode: "no-cors"``, a form post) and, with no key to check, write: refused
    are an ``Origin`` that is neither the service's own (``scheme://Host`` of the request: the console at /ui) nor
    one of ``cors_origins``, and ``Sec-Fetch-Site: cross-site`` but for a GET/HEAD navigation (a link followed).
    ``Sec-Fetch-Site: same-origin`` is the browser's own word (no page script can set a ``Sec-`` header) and passes:
    behind a proxy that ends TLS or rewrites Host, the request's ``scheme://Host`` is not the origin the browser saw,
    and the console's writes were refused."""
    site = headers.get(b"sec-fetch-site", b"").lower()
    if site == b"same-origin":
        return None
    origin = headers.get(b"origin")
    if origin is not None:
        shown = origin.decode("latin-1")
        key = _origin_key(shown)
        host = headers.get(b"host", b"").decode("latin-1")
        if key is not None and (key == _origin_key(f"{scope.get('scheme', 'http')}://{host}") or "*" in cors_origins
                                or any(key == _origin_key(o) for o in cors_origins)):
            return None
        return (f"a request from the web page origin {shown[:100]!r} is refused: with auth off "
                "(VECBRIDGE_AUTH_DISABLED) the service answers only its own pages (/ui) and the origins in "
                "VECBRIDGE_CORS_ORIGINS, so that another site's page cannot use it; add that origin to "
                "VECBRIDGE_CORS_ORIGINS, or turn API keys on")
    navigation = headers.get(b"sec-fetch-mode", b"").lower() == b"navigate" and scope["method"] in ("GET", "HEAD")
    if site == b"cross-site" and not navigation:
        return ("a request from another site's web page (Sec-Fetch-Site: cross-site) is refused: with auth off "
                "(VECBRIDGE_AUTH_DISABLED) the service answers only its own pages (/ui) and the origins in "
                "VECBRIDGE_CORS_ORIGINS; turn API keys on to be reached from other sites")
    return None


def _encoded_slash(scope) -> str | None:
    """The message refusing a request whose path writes a ``/`` as ``%2F`` (any case), else None.

    Starlette routes on the decoded path, so ``GET /v1/maps/toy-a2b%2Fversions`` answered the versions list
    (another route) instead of refusing the name ``toy-a2b/versions``: no name or reference holds a ``/``. Read
    from ``raw_path`` (the path as sent; a server that gives none is not checked)."""
    raw = scope.get("raw_path")
    if not raw or b"%2f" not in raw.lower():
        return None
    return (f"the path {raw.decode('latin-1')[:200]!r} writes a '/' as %2F: names and references never hold '/', "
            f"and the service does not route on an encoded one; send each name as one path segment")


_ONCE = (b"host", b"authorization", b"content-type")  # headers a request sends at most once (more: a 400)


def _header_counts(raw) -> dict[bytes, int]:
    """How many times each header of :data:`_ONCE` is among the request's ``raw`` headers, in one pass."""
    counts = dict.fromkeys(_ONCE, 0)
    for k, _ in raw:
        if k in counts:
            counts[k] += 1
    return counts


def _body_coding(raw) -> tuple[int, str, str] | None:
    """``(status, error type, message)`` refusing a body the service would misread, else None: a
    ``Content-Encoding`` other than identity (415; no route decodes one: a gzip JSON body was "not valid UTF-8", gzip
    bytes sent as octet-stream were read as float32 rows, and ``br`` on a plain body was ignored), or a
    ``Transfer-Encoding`` other than chunked (400: ``gzip, chunked`` was read as plain; RFC 9112 section 6.1 suggests
    a 501, but a 5xx says the service failed, and client input never makes one)."""
    content, transfer = [], []
    for k, v in raw:
        if k == b"content-encoding" or k == b"transfer-encoding":
            codings = [c.split(b";")[0].strip().lower() for c in v.split(b",")]
            (content if k == b"content-encoding" else transfer).extend(c for c in codings if c)
    if any(c != b"identity" for c in content):
        return 415, "UnsupportedMediaTypeError", (
            f"Content-Encoding {b', '.join(content).decode('latin-1')[:100]!r} is not supported: the service reads "
            "request bodies as sent; send the body uncompressed (no Content-Encoding, or identity)")
    if transfer and transfer != [b"chunked"]:
        return 400, "InvalidHeaderError", (
            f"Transfer-Encoding {b', '.join(transfer).decode('latin-1')[:100]!r} is not supported: send the body "
            "uncompressed, with Content-Length or Transfer-Encoding: chunked alone (RFC 9112 section 6.1)")
    return None


def _route_scope(route) -> str | None:
    """The key scope a route's dependencies require (``require_scope`` marks its checks), or None."""
    stack = list(getattr(getattr(route, "dependant", None), "dependencies", []))
    while stack:
        dep = stack.pop()
        scope = getattr(dep.call, "vb_scope", None)
        if scope:
            return scope
        stack.extend(dep.dependencies)
    return None


class GuardMiddleware:
    """Before the route reads one body byte: the Host header (400, :func:`accepted_hosts`), the API key (401/403)
    and the route's body limit (413); while it reads: the limit again, and ``body_timeout_s`` between the body's
    messages (408: a client that stalls mid-upload would otherwise hold its connection, and the bytes buffered so
    far, until it goes away).

    FastAPI reads and parses a typed body before it runs the route's dependencies, so a key check
    in a dependency alone lets anyone make the server read and parse a large body. This
    middleware finds the route (the same matching Starlette does), checks the key against the
    scope the route's dependencies declare (:func:`service.api.deps.authorize`, the one key check)
    and enforces the route's body limit from ``Content-Length`` and while streaming. The route's
    own dependency still runs (and documents the scope in OpenAPI).
    """

    def __init__(self, app, routes, settings) -> None:
        from .deps import authorize  # the one key check (deps imports the app's state: not at this module's import)

        self.app = app
        self.settings = settings  # a callable returning the current Settings
        self._authorize = authorize
        self._hosts_of, self._hosts = None, None  # accepted_hosts() of the last Settings seen
        # (regex, methods, template, scope) of every API route (APIRoute: path already prefixed)
        self._table = [(r.path_regex, r.methods or set(), r, _route_scope(r)) for r in routes
                       if hasattr(r, "path_regex")]
        self._matched: dict[tuple[str, str], tuple] = {}  # (method, path) -> (route, scope, path params) found

    def _match(self, scope) -> tuple[object | None, str | None]:
        path, method = route_path(scope), scope["method"]  # behind a proxy prefix: match as the router does
        hit = self._matched.get((method, path))
        if hit is None:  # a path seen before skips the scan of every route's pattern (the search's is the 30th)
            for regex, methods, route, need in self._table:
                if method in methods and (m := regex.match(path)):
                    hit = (route, need, m.groupdict())
                    if len(path) <= _MATCHED_PATH:  # bounded memory: any client (no key checked yet) picks paths
                        if len(self._matched) >= _MATCHED_PATHS:
                            self._matched.clear()
                        self._matched[(method, path)] = hit
                    break
            else:
                return None, None
        route, need, params = hit
        scope["vb_route"], scope["vb_path_params"] = route, dict(params)  # for the fast path
        return route, need

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        route, need = self._match(scope)
        template = getattr(route, "path", None)
        settings = self.settings()
        headers = dict(scope.get("headers", ()))
        counts = _header_counts(scope.get("headers", ()))
        for name, what in ((b"host", "Host"), (b"authorization", "Authorization")):
            if (n := counts[name]) > 1:  # only the last one was checked
                scope["route"] = route
                return await _send_error(send, 400, "InvalidHeaderError", (
                    f"the request has {n} {what} headers; send one (a request names one host and one set of "
                    "credentials: RFC 9112 section 3.2, RFC 9110 section 11.6.2)"))
        if settings is not self._hosts_of:
            self._hosts_of, self._hosts = settings, accepted_hosts(settings)
        if self._hosts is not None and route_path(scope) not in _PROBES:
            name = host_name(headers.get(b"host"))
            if not host_allowed(name, self._hosts):
                scope["route"] = route
                why = ("add the names clients use to VECBRIDGE_ALLOWED_HOSTS (allowed_hosts)" if settings.allowed_hosts
                       else "set VECBRIDGE_ALLOWED_HOSTS to the names clients use; with auth off only loopback names "
                            "are answered by default, so that web pages cannot reach the service through DNS rebinding")
                return await _send_error(send, 400, "InvalidHostError", (
                    f"Host {name[:100]!r} is not one this service answers ({', '.join(self._hosts)[:300]}): {why}"))
        if settings.auth_disabled and (refused := cross_site(scope, headers, settings.cors_origins)):
            scope["route"] = route
            return await _send_error(send, 403, "CrossSiteRequestError", refused)
        if need is not None:
            try:
                auth = headers.get(b"authorization")
                self._authorize(auth.decode("latin-1") if auth is not None else None, need, settings)
            except (AuthenticationError, PermissionDeniedError) as exc:
                scope["route"] = route  # the access log and metrics name the route, not "unmatched"
                status = 401 if isinstance(exc, AuthenticationError) else 403
                return await _send_error(send, status, type(exc).__name__, str(exc),
                                         [(b"www-authenticate", b"Bearer")] if status == 401 else [])
        if (why := _encoded_slash(scope)) is not None:  # after the key check, as every answer about the request is;
            # the route stays unset (metrics and the log say "unmatched"): the route matched is not the one meant
            return await _send_error(send, 422, "InputError", why)
        if (n := counts[b"content-type"]) > 1:  # the limit would be sized by one and the route read the other
            scope["route"] = route
            return await _send_error(send, 400, "InvalidHeaderError", (
                f"the request has {n} Content-Type headers; send one, the type of its body"))
        # before the limit, which sizes plain bytes; most requests send neither header, and skip the pass
        if (b"content-encoding" in headers or b"transfer-encoding" in headers) and (
                refused := _body_coding(scope.get("headers", ()))) is not None:
            scope["route"] = route
            return await _send_error(send, *refused)
        ct = headers.get(b"content-type")  # the one sent, if any
        limit, setting = body_limit(settings, scope["method"], template, ct.decode("latin-1") if ct else None)
        cl = headers.get(b"content-length")
        if cl is not None:
            try:
                n = int(cl)
            except ValueError:
                n = 0
            if n > limit:
                scope["route"] = route
                # a size some route takes, sent to a route whose key was checked: read it, so that a client still
                # sending reads this 413, not a reset (no answer). Not for an unmatched path (no key checked), nor
                # when the client waits for "100 Continue" before sending (reading would ask it for the body)
                if (n <= settings.max_body_bytes and need is not None
                        and headers.get(b"expect", b"").lower() != b"100-continue"):
                    await _drain(receive, settings.body_timeout_s, settings.body_min_rate_bytes_s)
                # no route: most often a mistyped path, so the message says so, not only "send smaller batches"
                return await _send_413(send, n, limit, setting, template,
                                       unmatched=None if route else f"{scope['method']} {scope.get('path', '')}")
        seen, done, wait, rate, t0 = 0, False, settings.body_timeout_s, settings.body_min_rate_bytes_s, None

        async def limited_receive():
            nonlocal seen, done, t0
            if done:  # the body is complete: later calls wait for a disconnect, for as long as it takes
                return await receive()
            if t0 is None:
                t0 = time.monotonic()
            left, last = body_wait(t0, seen, wait, rate), time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError
                msg = await within(receive(), left)  # no timer when the body has arrived (nearly every small one)
            except TimeoutError:
                raise RequestTimeoutError(_body_timeout_message(t0, last, seen, wait, rate)) from None
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    raise PayloadTooLargeError(too_large(None, limit, setting, template))
                done = not msg.get("more_body", False)
            return msg

        try:
            return await self.app(scope, limited_receive, send)
        except RequestTimeoutError as exc:  # raised in a middleware's own body read (the fast path's)
            scope["route"] = route
            return await _send_error(send, 408, type(exc).__name__, str(exc))


def body_wait(t0: float, seen: int, silence: float, rate: float) -> float:
    """Seconds the next bytes of a request body whose reading began at ``t0`` (``time.monotonic``), ``seen`` bytes so
    far, may take: ``silence`` (``body_timeout_s``), and no later than the moment its average rate since ``t0`` falls
    below ``rate`` bytes/s (``body_min_rate_bytes_s``; 0: no such bound), counted only after the first ``silence``
    seconds. Without the rate, a client sending a byte just inside each ``silence`` held the connection for ever."""
    if rate <= 0:
        return silence
    return min(silence, t0 + max(silence, seen / rate) - time.monotonic())


def _body_timeout_message(t0: float, last: float, seen: int, silence: float, rate: float) -> str:
    """Why a body's wait ran out: ``last`` is when its last bytes came (or its reading began)."""
    now = time.monotonic()
    took = now - t0
    if now - last < silence * 0.99:
        return (f"the request body came at {seen / took:.0f} bytes/s ({seen} bytes in {took:.0f} s), below the "
                f"minimum of {rate:g} bytes/s (body_min_rate_bytes_s); send the body without pauses")
    return (f"no request body bytes for {silence:g} s after {seen} bytes (body_timeout_s); "
            f"send the body without pauses")


async def _drain(receive, wait: float, rate: float = 0) -> None:
    """Read and drop a request's body (until its end, a disconnect, ``wait`` seconds without bytes, or its rate
    below ``rate``: :func:`body_wait`)."""
    t0, seen = time.monotonic(), 0
    try:
        while True:
            if (left := body_wait(t0, seen, wait, rate)) <= 0:
                return
            async with asyncio.timeout(left):
                msg = await receive()
            seen += len(msg.get("body", b""))
            if msg["type"] != "http.request" or not msg.get("more_body", False):
                return
    except TimeoutError:
        return


async def _send_error(send, status: int, kind: str, message: str, extra: list | None = None) -> None:
    body = dumps({"error": {"type": kind, "status": status, "message": message}})
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *(extra or [])]})
    await send({"type": "http.response.body", "body": body})


async def _send_413(send, n: int, limit: int, setting: str = "max_body_bytes", template: str | None = None,
                    unmatched: str | None = None) -> None:
    """413 for a body of ``n`` bytes over ``limit`` on route ``template``; ``unmatched``: the ``METHOD path`` no route
    matched."""
    if unmatched:
        msg = (f"no route matches {unmatched}; a request body to a path no route matches may hold at most {limit} "
               f"bytes ({setting}), this one has {n}")
    else:
        msg = too_large(n, limit, setting, template)
    await _send_error(send, 413, "PayloadTooLargeError", msg)


async def _send_stopping(send, rid: str, gone: bool, forced: bool = False) -> None:
    """The answer to a request the stopping server cancelled: a 503 ``ServiceStoppingError`` (``Retry-After``; none
    when the client has gone), one WARNING line without a traceback: a stop, not a fault of the service. ``forced``:
    cut by a second Ctrl-C (``app.state.stop_forced``), not by ``shutdown_timeout_s`` running out."""
    _errors.warning("request cancelled by the shutdown",
                    extra={"fields": {"request_id": rid, "client_gone": gone, "forced": forced}})
    why = ("was stopped at once by a second stop signal (Ctrl-C) and ended this request" if forced else
           "is stopping and ended this request, still open shutdown_timeout_s after the stop signal")
    if not gone:
        await _send_error(send, 503, ServiceStoppingError.__name__, (
            f"the service {why}; it may have been applied: send it again if it is idempotent (request id {rid})"),
            [(b"retry-after", str(ServiceStoppingError.retry_after).encode())])


class ObserveMiddleware:
    """Request id (``X-Request-ID``, echoed or generated), latency histogram per route template,
    and one JSON access-log line per request (no headers, no query strings: keys never leak)."""

    def __init__(self, app, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        rid = None
        for k, v in scope.get("headers", ()):
            if k == b"x-request-id":
                rid = v.decode("latin-1")[:64]
                break
        rid = rid or new_request_id()
        scope.setdefault("state", {})["request_id"] = rid
        status = 500
        started = False
        in_flight = self.metrics.in_flight
        in_flight.inc()
        self.metrics.active += 1
        moved = 0  # body bytes in and out: a large request is followed by a heap trim (service/memory.py)

        async def send_wrapper(msg):
            nonlocal status, started, moved
            if msg["type"] == "http.response.body":
                moved += len(msg.get("body", b""))
            if msg["type"] == "http.response.start":
                status, started = msg["status"], True
                extra = [(b"x-request-id", rid.encode("latin-1")), *SECURITY_HEADERS]
                if not any(k == _CSP for k, _ in msg.get("headers", ())):
                    extra.append(_CSP_NONE)
                # after a server error, a stalled body or one over the limit (a 413 raised while a chunked body was
                # still coming) the connection's state is unknown and the rest of a body may still come: uvicorn kept
                # the connection and read (and dropped) the rest, GBs of it, while the client went on sending
                close = status >= 500 or status in (408, 413)
                if close:  # do not reuse it
                    extra.append((b"connection", b"close"))
                msg["headers"] = [h for h in msg.get("headers", []) if not (close and h[0] == b"connection")]
                msg["headers"] += extra
            await send(msg)

        gone = False

        async def receive_wrapper():
            nonlocal gone, moved
            msg = await receive()
            gone = gone or msg["type"] == "http.disconnect"
            moved += len(msg.get("body", b""))
            return msg

        try:
            await self.app(scope, receive_wrapper, send_wrapper)
            if not started and gone:  # the client went away before its body was complete: nobody to answer
                status = 499
        except asyncio.CancelledError:  # the graceful shutdown ran out (shutdown_timeout_s), or a second Ctrl-C
            # came (app._answer_cut): the server cancelled us
            if started:  # part of the answer is out: nothing to add (uvicorn closes the connection)
                raise
            # answered here, and not raised on: uvicorn logged any exception out of the app as an ERROR traceback
            # ("Exception in ASGI application") and sent a text/plain 500 without the request id
            scope.setdefault("route", scope.get("vb_route"))  # cut while the fast path read the body: name the route
            # a second Ctrl-C cut it 1 s after the first, and the answer said shutdown_timeout_s (30 s) had run out
            forced = bool(getattr(getattr(scope.get("app"), "state", None), "stop_forced", False))
            await _send_stopping(send_wrapper, rid, gone, forced)
            status = 499 if gone else 503
        except Exception as exc:  # escaped every handler: answer here, so the 500 keeps the request id
            status = 500
            _errors.error("request failed", exc_info=exc, extra={"fields": {"request_id": rid}})
            if not started:
                await _send_error(send, 500, type(exc).__name__, f"internal error (request id {rid})",
                                  [(b"x-request-id", rid.encode("latin-1")), *SECURITY_HEADERS, _CSP_NONE])
        finally:
            in_flight.dec()
            self.metrics.active -= 1
            if moved > TRIM_AFTER_BYTES:
                trim_after(moved)
            dt = time.perf_counter() - t0
            route = getattr(scope.get("route"), "path", None) or _fixed_route(route_path(scope))
            self.metrics.observe_request(scope["method"], route, status, dt)
            fields = {"method": scope["method"], "route": route, "status": status,
                      "duration_ms": round(dt * 1000, 3), "request_id": rid}
            if route in _QUIET:
                _access.debug("request", extra={"fields": fields})
            else:
                _access.info("request", extra={"fields": fields})
