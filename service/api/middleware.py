"""Pure-ASGI middleware: request size limit, and request id + latency metrics + access log.

Pure ASGI (not ``BaseHTTPMiddleware``) keeps the per-request overhead to a few microseconds,
which matters for the binary transform fast path.
"""

from __future__ import annotations

import time
import uuid

from ..logging import get_logger
from ..metrics import ServiceMetrics
from .errors import PayloadTooLargeError
from .responses import dumps

__all__ = ["BodyLimitMiddleware", "ObserveMiddleware"]

_access = get_logger("access")
_QUIET = ("/healthz", "/readyz", "/metrics")
_FIXED = ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect")


def _fixed_route(path: str) -> str:
    """Label for requests that matched no API route: FastAPI's own pages by name, else 'unmatched'."""
    return path if path in _FIXED else "unmatched"


class BodyLimitMiddleware:
    """Refuse bodies over ``max_bytes`` with 413: early from ``Content-Length``, else while reading."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = int(max_bytes)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for k, v in scope.get("headers", ()):
            if k == b"content-length":
                try:
                    n = int(v)
                except ValueError:
                    n = 0
                if n > self.max_bytes:
                    return await _send_413(send, n, self.max_bytes)
                break
        seen = 0
        limit = self.max_bytes

        async def limited_receive():
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    raise PayloadTooLargeError(
                        f"request body exceeds the limit of {limit} bytes (max_body_bytes); send smaller batches")
            return msg

        return await self.app(scope, limited_receive, send)


async def _send_413(send, n: int, limit: int) -> None:
    body = dumps({"error": {"type": "PayloadTooLargeError", "status": 413,
                            "message": f"request body of {n} bytes exceeds the limit of {limit} bytes "
                                       f"(max_body_bytes); send smaller batches"}})
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


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
        rid = rid or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        status = 500

        async def send_wrapper(msg):
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
                msg.setdefault("headers", [])
                msg["headers"] = list(msg["headers"]) + [(b"x-request-id", rid.encode("latin-1"))]
            await send(msg)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            dt = time.perf_counter() - t0
            route = getattr(scope.get("route"), "path", None) or _fixed_route(scope.get("path", ""))
            self.metrics.request_duration.labels(scope["method"], route, str(status)).observe(dt)
            fields = {"method": scope["method"], "route": route, "status": status,
                      "duration_ms": round(dt * 1000, 3), "request_id": rid}
            if route in _QUIET:
                _access.debug("request", extra={"fields": fields})
            else:
                _access.info("request", extra={"fields": fields})
