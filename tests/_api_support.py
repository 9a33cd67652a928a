"""Helpers shared by the service tests (no tests here): a small world of spaces, maps and keys.

Spaces ``a`` (16-d), ``b`` (16-d), ``c`` (12-d); maps ``a2b`` (Procrustes on a planted rotation)
and ``b2c`` (ridge, 16 -> 12), so ``a -> c`` needs a composed path.
"""

from __future__ import annotations

import base64
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from align import fit_procrustes, fit_ridge
from service.config import Settings

KEYS = {"rkey-123": ["read"], "wkey-456": ["read", "write"], "wonly-789": ["write"]}
R = {"Authorization": "Bearer rkey-123"}
W = {"Authorization": "Bearer wkey-456"}
WONLY = {"Authorization": "Bearer wonly-789"}


def settings_for(tmp_path, **kw) -> Settings:
    base = dict(data_dir=tmp_path / "data", api_keys=KEYS, demo_on_empty=False, log_level="WARNING")
    base.update(kw)
    return Settings(**base)


def vectors_b64(X: np.ndarray) -> dict:
    """The JSON fields of rows ``X`` sent as base64 float32: ``{"vectors_b64": ..., "dim": ...}``."""
    X = np.ascontiguousarray(X, dtype="<f4")
    return {"vectors_b64": base64.b64encode(X.tobytes()).decode(), "dim": int(X.shape[1])}


def planted(n: int = 600, seed: int = 0):
    """X (n, 16) in space a; Y = X Q (space b, planted rotation); Z = Y M (space c, 12-d)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 16)).astype(np.float32)
    Q, _ = np.linalg.qr(rng.standard_normal((16, 16)))
    Y = (X @ Q).astype(np.float32)
    M = rng.standard_normal((16, 12)).astype(np.float32)
    Z = (Y @ M).astype(np.float32)
    return X, Y, Z


@contextmanager
def served_world(tmp_path, **kw):
    """``(client, app, populate(...))`` of an app on ``tmp_path`` with room for batch-1000 requests, open."""
    from fastapi.testclient import TestClient

    from service.api import create_app

    app = create_app(settings_for(tmp_path, **{"max_batch": 1000, "max_body_bytes": 2_000_000, **kw}))
    with TestClient(app) as client:
        yield client, app, populate(app.state.vb.registry)


def populate(registry, n: int = 600, seed: int = 0):
    """Register spaces a, b, c and maps a2b, b2c; return the data and fitted maps."""
    X, Y, Z = planted(n, seed)
    registry.register_space("a", 16)
    registry.register_space("b", 16)
    registry.register_space("c", 12)
    m_ab = fit_procrustes(X, Y)
    m_bc = fit_ridge(Y, Z, alpha=1e-3)
    registry.register_version("a2b", m_ab, source_space="a", target_space="b", method="procrustes", params={},
                              alias="prod")
    registry.register_version("b2c", m_bc, source_space="b", target_space="c", method="ridge",
                              params={"alpha": 1e-3})
    return {"X": X, "Y": Y, "Z": Z, "a2b": m_ab, "b2c": m_bc}


def answered(client, route: str, status: int | str) -> int:
    """Requests of ``route`` (its template, e.g. ``/v1/plans``) answered with ``status``, from the service's
    ``/metrics`` (``client``: an httpx client of that service; the read key)."""
    lines = client.get("/metrics", headers=R).text.splitlines()
    return sum(int(float(m.rsplit(" ", 1)[1])) for m in lines if m.startswith(
        "vecbridge_request_duration_seconds_count") and f'route="{route}"' in m and f'status="{status}"' in m)


def assert_nonfinite_refused(client, url: str, X: np.ndarray) -> None:
    """POST to transform ``url`` the rows ``X`` (n, d) with one NaN or ±Inf — in the first, a middle or the last row,
    or in a batch of one — as octet-stream, ``.npy`` and JSON ``vectors_b64`` bodies (read key): each must be
    answered 422 ``NonFiniteError`` naming ``vectors`` and one row."""
    import base64
    import io

    n, d = X.shape
    for bad, row in ((np.nan, n - 1), (np.inf, 0), (-np.inf, n // 2), (np.nan, None)):
        Z = np.array(X[:1] if row is None else X, np.float32)
        Z[0 if row is None else row, d // 2] = bad
        npy = io.BytesIO()
        np.save(npy, Z)
        for kind, kw in (
                ("octet", {"content": Z.tobytes(), "headers": {**R, "content-type": "application/octet-stream"}}),
                ("npy", {"content": npy.getvalue(), "headers": {**R, "content-type": "application/x-npy"}}),
                ("b64", {"json": {"vectors_b64": base64.b64encode(Z.tobytes()).decode(), "dim": d}, "headers": R})):
            what = f"{bad} in row {row} of {len(Z)} ({kind})"
            r = client.post(url, **kw)
            assert r.status_code == 422, (what, r.text)
            err = r.json()["error"]
            assert err["type"] == "NonFiniteError" and err["message"].startswith("vectors: 1 row(s)"), (what, err)


def post_and_leave(base: str, gate, head: str, headers: dict, body: bytes, *, waits: int = 1200) -> float:
    """Send ``head`` (``POST /path HTTP/1.1``), ``headers`` and ``body`` on a socket of its own, wait until the work
    holds one of ``gate``'s compute threads (``gate.limiter``), then half a second more, and close the socket (the
    client leaves mid-work); returns ``time.monotonic()`` when it closed. AssertionError if the work never started."""
    lines = "".join(f"{k}: {v}\r\n" for k, v in {"Host": "x", **headers, "Content-Length": len(body)}.items())
    with socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1]))) as s:
        s.sendall(f"{head}\r\n{lines}\r\n".encode() + body)
        for _ in range(waits):
            if gate.limiter.borrowed_tokens == 1:
                break
            time.sleep(0.01)
        assert gate.limiter.borrowed_tokens == 1, f"{head}: the work never started on the compute threads"
        time.sleep(0.5)
    return time.monotonic()


def walk_pages(fetch: Callable[[str | None], dict], cursor: str | None = None,
               max_pages: int = 1000) -> Iterator[dict]:
    """Each page ``fetch(cursor)`` answers, from ``cursor`` on (None: the first page), following its ``"next"``
    until that is None. A cursor given twice (a walk that makes no progress) or more than ``max_pages`` pages is an
    AssertionError, never an endless walk."""
    seen = set()
    for _ in range(max_pages):
        page = fetch(cursor)
        yield page
        if (cursor := page["next"]) is None:
            return
        assert cursor not in seen, f"the cursor {cursor!r} came twice: the walk goes round"
        seen.add(cursor)
    raise AssertionError(f"more than {max_pages} pages")
