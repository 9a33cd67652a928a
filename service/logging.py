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
import os
import sys
import threading
import time
import warnings
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
    lost and its warnings were plain text in the JSON stream. Python warnings (``VecbridgeWarning``, scikit-learn's
    ``ConvergenceWarning``...) become records of the ``py.warnings`` logger, JSON lines too, and tqdm progress bars
    (the language model's loader draws some) are off (:func:`_server_streams`): process-wide changes, so made only
    here, by ``serve`` and each ``--workers`` process (never at an import, nor by an app's lifespan, which tests run
    in their own process).
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
        _server_streams(root.handlers)
        uv = logging.getLogger("uvicorn")
        uv.handlers = list(root.handlers)
        uv.setLevel(level.upper())
        uv.propagate = False
        for name in ("uvicorn.error", "uvicorn.asgi"):  # children of "uvicorn": no handlers of their own
            logging.getLogger(name).handlers = []
            logging.getLogger(name).propagate = True


def _server_streams(handlers) -> None:
    """A serving process's stderr holds JSON lines only, from Python at least: warnings through ``handlers`` (the
    ``vecbridge`` tree's) as ``py.warnings`` records, and tqdm bars disabled (they drew plain text into the stream:
    the language model's GGUF loader draws one). FAISS's C++ code writes to the stderr file descriptor itself
    ("WARNING clustering ..."): that cannot be routed, README's serve lines say so. Idempotent."""
    pw = logging.getLogger("py.warnings")  # the logger logging.captureWarnings uses
    pw.handlers = list(handlers)
    pw.propagate = False
    if not getattr(warnings.showwarning, "_vecbridge", False):
        warnings.showwarning = _json_showwarning(warnings.showwarning)
    os.environ["TQDM_DISABLE"] = "1"  # a tqdm imported after this (tqdm reads it at import), a process started here
    try:
        from tqdm import std
    except ImportError:  # pragma: no cover - tqdm comes with the CLI's dependencies
        return
    if not getattr(std.tqdm.__init__, "_vecbridge", False):  # a tqdm already imported: every bar made disabled
        init = std.tqdm.__init__

        def quiet_init(self, *args, **kwargs):
            kwargs["disable"] = True
            init(self, *args, **kwargs)

        quiet_init._vecbridge = True  # type: ignore[attr-defined]
        std.tqdm.__init__ = quiet_init


def _json_showwarning(plain):
    """``warnings.showwarning`` of a serving process: one ``py.warnings`` record with the warning's text as ``msg``
    and its ``category`` and ``where`` (``file:line``) as fields, not the two lines of plain text Python writes to
    stderr. A warning shown to an explicit ``file`` goes to ``plain`` (the function it replaces), as before."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if file is not None:
            plain(message, category, filename, lineno, file, line)
            return
        logging.getLogger("py.warnings").warning(str(message), extra={"fields": {
            "category": getattr(category, "__name__", str(category)), "where": f"{filename}:{lineno}"}})

    show._vecbridge = True  # type: ignore[attr-defined]
    return show


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
