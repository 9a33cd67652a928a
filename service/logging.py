"""Structured JSON logs for the service.

One line per record on stderr::

    {"ts": "2025-01-01T12:00:00.123Z", "level": "INFO", "logger": "vecbridge.access",
     "msg": "request", "method": "POST", "route": "/v1/maps/{ref}/transform", "status": 200,
     "duration_ms": 1.92, "request_id": "..."}

Extra fields come from ``logger.info("msg", extra={"fields": {...}})``. Secrets never reach a
record: the access log is written from the route template and status only (no headers, no
query strings), and :func:`redact` masks anything that looks like a credential in a mapping.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from typing import Any

__all__ = ["Every", "JsonFormatter", "configure_logging", "get_logger", "redact"]

_SECRET_WORDS = ("key", "token", "secret", "password", "authorization")


_SECRET_KEYS: dict[str, bool] = {}  # field name -> whether it looks like a credential (the names are the code's own)


def _secret(key: str) -> bool:
    hit = _SECRET_KEYS.get(key)
    if hit is None:
        hit = any(w in key.lower() for w in _SECRET_WORDS)
        if len(_SECRET_KEYS) < 4096:  # bounded, should a caller ever log keys made from data
            _SECRET_KEYS[key] = hit
    return hit


def redact(fields: dict[str, Any]) -> dict[str, Any]:
    """Copy of ``fields`` with values of credential-like keys replaced by ``"***"``."""
    return {k: ("***" if _secret(k) else v) for k, v in fields.items()}


_ENCODE = json.JSONEncoder(default=str).encode  # json.dumps(out, default=str), without a new encoder per line


class JsonFormatter(logging.Formatter):
    """Format a record as one JSON object per line (the access log writes one per request: ~25 µs a line went to
    the per-field credential test, a new JSON encoder and ``strftime``; those are now made once)."""

    _second: tuple[int, str] = (-1, "")  # the last whole second formatted, and its text

    def format(self, record: logging.LogRecord) -> str:
        second, last = int(record.created), self._second  # one read: another thread may set it meanwhile
        if second != last[0]:
            last = self._second = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
        out: dict[str, Any] = {
            "ts": last[1] + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(redact(fields))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return _ENCODE(out)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at emit time (test capture, redirected streams)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def configure_logging(level: str = "INFO", *, server: bool = False) -> None:
    """Send the ``vecbridge`` logger tree to stderr as JSON lines (idempotent).

    ``server=True`` (a serving process, each ``--workers`` process too): uvicorn's own lines (start-up, shutdown,
    invalid requests, errors) go the same way; its access log stays off (the access logger writes one line per
    request, without headers or query strings). A worker process left them unconfigured: its INFO lines were
    lost and its warnings were plain text in the JSON stream.
    """
    root = logging.getLogger("vecbridge")
    root.setLevel(level.upper())
    if not any(getattr(h, "_vecbridge", False) for h in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(JsonFormatter())
        handler._vecbridge = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.propagate = False
    if server:
        uv = logging.getLogger("uvicorn")
        uv.handlers = list(root.handlers)
        uv.setLevel(level.upper())
        uv.propagate = False
        for name in ("uvicorn.error", "uvicorn.asgi"):  # children of "uvicorn": no handlers of their own
            logging.getLogger(name).handlers = []
            logging.getLogger(name).propagate = True


def get_logger(name: str) -> logging.Logger:
    """A child of the ``vecbridge`` logger (``get_logger("jobs")`` -> ``vecbridge.jobs``)."""
    return logging.getLogger(f"vecbridge.{name}")


class Every:
    """``due(key)``: True at most once per ``seconds`` for each key (a log line that would repeat per request)."""

    def __init__(self, seconds: float):
        self.seconds, self.last, self.lock = seconds, {}, threading.Lock()

    def due(self, key) -> bool:
        now = time.monotonic()
        with self.lock:
            if now - self.last.get(key, -self.seconds) < self.seconds:
                return False
            self.last[key] = now
            return True
