"""Encoders loaded at start-up (``Settings.preload_encoders``), so no text request waits for one.

Without it, the first request of a process that sends ``texts`` loads its encoder (5-6 s for
all-MiniLM-L6-v2 on an idle 2-core machine, tens of seconds on a busy one) and waits that long. Like
text-embeddings-inference, which loads its model before it reports ready, a service given encoders to
preload loads them after it opens, one after another in one background thread, each followed by a first
embedding (some runtimes finish loading there), and ``/readyz`` stays "not ready" until every one has
done so: a load balancer sends it text requests only then.

- A name no encoder has stops the start-up with one line and exit 2, as any refused setting does (the
  setting's validator and ``serve --preload-encoder`` check it): a typo would otherwise show only at the first
  text request.
- A known encoder whose package is not installed, or whose load fails, is reported as ``failed: <why>``
  in ``/readyz`` (``checks.encoders``) and ``/v1/info`` (``encoders``), and keeps the process not ready:
  it was asked to serve that encoder and cannot.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

__all__ = ["EncoderPreload"]

_log = logging.getLogger("vecbridge.service")


class EncoderPreload:
    """The state of the encoders a process preloads: ``pending`` -> ``loading`` -> ``ready`` | ``failed: ...``.

    ``names``: encoder names or short aliases (``minilm``), validated and canonicalised here (an
    UnknownEncoderError names the known ones); repeats are loaded once. ``load(name)`` returns an encoder
    (default :func:`service.encoders.get_encoder`, the process-wide cache the routes use).
    """

    def __init__(self, names: Sequence[str], load: Callable | None = None,
                 on_status: Callable[[str, str], None] | None = None) -> None:
        self._status: dict[str, str] = {}
        self._on_status = on_status  # (name, status) at each change: the metrics' encoder gauge
        if names:
            from ..encoders import canonical_names, get_encoder

            self._status = dict.fromkeys(canonical_names(names), "pending")
            self._load = load or get_encoder
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        for name, status in self._status.items():
            self._said(name, status)

    @property
    def names(self) -> list[str]:
        return list(self._status)

    def status(self) -> dict[str, str]:
        """Encoder name -> ``pending``, ``loading``, ``ready`` or ``failed: <error>``."""
        with self._lock:
            return dict(self._status)

    @property
    def ready(self) -> bool:
        """Every encoder asked for has loaded (True when none was asked for)."""
        with self._lock:
            return all(s == "ready" for s in self._status.values())

    def start(self) -> None:
        """Load the encoders in a daemon thread (once; nothing to do without names)."""
        if not self._status or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="vecbridge-encoder-preload", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _set(self, name: str, status: str) -> None:
        with self._lock:
            self._status[name] = status
        self._said(name, status)

    def _said(self, name: str, status: str) -> None:
        if self._on_status is not None:
            self._on_status(name, status)

    def _run(self) -> None:
        for name in self.names:
            self._set(name, "loading")
            started = time.perf_counter()
            try:
                self._load(name).encode(["warm-up"], kind="query")
            except Exception as exc:  # noqa: BLE001 - reported by /readyz and the log, never raised in a thread
                self._set(name, f"failed: {type(exc).__name__}: {exc}")
                _log.error("encoder preload failed", extra={"fields": {"encoder": name, "error": str(exc)}})
                continue
            self._set(name, "ready")
            _log.info("encoder preloaded", extra={"fields": {"encoder": name,
                                                             "seconds": round(time.perf_counter() - started, 2)}})
