"""Bounded load test of a vecbridge service on loopback: transform and search throughput, latency, errors, RSS.

Loopback only (the target host must be 127.0.0.1 or localhost) and hard-capped: every phase stops
at ``--max-requests`` requests or ``--max-seconds`` seconds, whichever comes first. Without
``--url`` it starts its own ``vecbridge serve`` on a free port with a throw-away data dir.

    python benchmarks/load_test.py                         # defaults: 384-d, 20k index rows, 8 clients
    python benchmarks/load_test.py --max-seconds 10 --concurrency 4 --rows-per-request 64

Prints one markdown table (phase, requests, errors, req/s, rows/s, p50/p99 ms) and RSS before/after,
then the overload check: ``--overload-fits`` fit jobs sent at once against a small queue must get
202 or 429 (with Retry-After), never a timeout or a 5xx.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _jobs_support import wait_http_job as wait_job  # noqa: E402  (tests/: the tests' job and server helpers)
from _servers import free_port, rss_kib, wait_ready  # noqa: E402

HARD_MAX_REQUESTS = 100_000
HARD_MAX_SECONDS = 300.0
KEY = "loadtest-key"


def _b64(X: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(X, dtype="<f4").tobytes()).decode()


def check_loopback(url: str) -> None:
    host = urlsplit(url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit(f"load_test: refusing to load {host!r}: loopback only")


def start_server(data_dir: Path, *, max_queued_jobs: int = 2, max_batch: int = 4096) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "VECBRIDGE_DATA_DIR": str(data_dir), "VECBRIDGE_API_KEYS": json.dumps({KEY: ["read", "write"]}),
           "VECBRIDGE_DEMO_ON_EMPTY": "false", "VECBRIDGE_LOG_LEVEL": "WARNING", "VECBRIDGE_JOB_WORKERS": "1",
           "VECBRIDGE_MAX_QUEUED_JOBS": str(max_queued_jobs), "VECBRIDGE_MAX_BATCH": str(max_batch),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(["vecbridge", "--data-dir", str(data_dir), "serve", "--host", "127.0.0.1", "--port",
                             str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc=proc, timeout=120)
    except AssertionError:
        proc.kill()
        raise
    return proc, url


def planted(n: int, dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, dim)).astype(np.float32)
    Q, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    return X, (X @ Q).astype(np.float32)


def prepare(url: str, *, dim: int, index_rows: int, fit_rows: int = 2000, seed: int = 0) -> dict:
    """Spaces a, b; map ``a2b`` (Procrustes on a planted rotation); flat index ``ib`` of ``index_rows`` in b."""
    check_loopback(url)
    X, Y = planted(max(fit_rows, 1), dim, seed)
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as c:
        for s in ("a", "b"):
            r = c.post("/v1/spaces", json={"name": s, "dim": dim})
            assert r.status_code in (201, 409), r.text
        r = c.post("/v1/fits", json={"name": "a2b", "source_space": "a", "target_space": "b", "method": "procrustes",
                                     "paired": True, "alias": "prod",
                                     "source": {"vectors_b64": _b64(X), "dim": dim},
                                     "target": {"vectors_b64": _b64(Y), "dim": dim}})
        assert r.status_code in (200, 202), r.text
        j = wait_job(c, r.json()["id"], timeout=300)
        assert j["state"] == "succeeded", j
        rng = np.random.default_rng(seed + 1)
        D = rng.standard_normal((index_rows, dim)).astype(np.float32)
        r = c.post("/v1/indexes", json={"name": "ib", "space": "b", "kind": "flat",
                                        "vectors_b64": _b64(D[:2000]), "dim": dim})
        assert r.status_code == 201, r.text
        for s in range(2000, index_rows, 2000):
            r = c.post("/v1/indexes/ib/vectors", json={"vectors_b64": _b64(D[s:s + 2000]), "dim": dim})
            assert r.status_code == 200, r.text
    return {"X": X, "dim": dim}


def run_load(url: str, request: dict, *, concurrency: int = 8, max_requests: int = 2000,
             max_seconds: float = 10.0, rows: int = 1) -> dict:
    """Send ``request`` (method, path, kwargs) from ``concurrency`` clients until a cap; latency stats."""
    check_loopback(url)
    max_requests = min(int(max_requests), HARD_MAX_REQUESTS)
    max_seconds = min(float(max_seconds), HARD_MAX_SECONDS)
    lat: list[float] = []
    statuses: dict[int, int] = {}
    errors: list[str] = []
    lock = threading.Lock()
    sent = [0]
    t_end = time.monotonic() + max_seconds

    def client():
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as c:
            while time.monotonic() < t_end:
                with lock:
                    if sent[0] >= max_requests:
                        return
                    sent[0] += 1
                t0 = time.perf_counter()
                try:
                    r = c.request(request["method"], request["path"], **request.get("kw", {}))
                    code = r.status_code
                except httpx.HTTPError as exc:
                    code = 0
                    errors.append(type(exc).__name__)
                dt = time.perf_counter() - t0
                with lock:
                    lat.append(dt)
                    statuses[code] = statuses.get(code, 0) + 1

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as ex:
        for f in [ex.submit(client) for _ in range(concurrency)]:
            f.result()
    wall = time.perf_counter() - t0
    a = np.asarray(lat) * 1000 if lat else np.zeros(1)
    n = len(lat)
    bad = sum(v for k, v in statuses.items() if k != 200)
    return {"requests": n, "errors": bad, "error_rate": bad / max(n, 1), "seconds": wall, "rps": n / wall,
            "rows_per_s": n * rows / wall, "p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
            "max_ms": float(a.max()), "statuses": statuses, "transport_errors": errors[:5]}


def transform_request(X: np.ndarray, rows: int) -> dict:
    return {"method": "POST", "path": "/v1/maps/a2b@prod/transform",
            "kw": {"content": np.ascontiguousarray(X[:rows], "<f4").tobytes(),
                   "headers": {"content-type": "application/octet-stream"}}}


def search_request(X: np.ndarray, rows: int, k: int = 10) -> dict:
    """Cross-space search: queries in space a, mapped through a2b@prod into the index's space b."""
    return {"method": "POST", "path": "/v1/indexes/ib/search",
            "kw": {"json": {"vectors_b64": _b64(X[:rows]), "dim": X.shape[1], "space": "a", "k": k,
                            "include_payloads": False}}}


def overload(url: str, *, n_fits: int = 12, dim: int = 64, rows: int = 3000) -> dict:
    """Send ``n_fits`` fit jobs at once: each must get 202/429 quickly (never a timeout or 5xx).

    The jobs are ``auto`` fits (held-out comparison of the map families: ~2 s for 4,000 x 64 on one core),
    so the one worker is still busy when the later uploads arrive and the queue fills. A Procrustes fit of
    the same rows takes ~20 ms, less than an upload, so on a fast machine every job finished before the
    next arrived and none was refused.
    """
    check_loopback(url)
    X, Y = planted(rows, dim, 5)
    body = {"source_space": "oa", "target_space": "ob", "method": "auto", "paired": True,
            "source": {"vectors_b64": _b64(X), "dim": dim}, "target": {"vectors_b64": _b64(Y), "dim": dim}}

    def one(i):
        t0 = time.perf_counter()
        try:
            r = httpx.post(url + "/v1/fits", json={**body, "name": f"over-{i}"}, timeout=30,
                           headers={"Authorization": f"Bearer {KEY}"})
            return r.status_code, r.headers.get("retry-after"), time.perf_counter() - t0, r.json().get("id")
        except httpx.HTTPError as exc:
            return type(exc).__name__, None, time.perf_counter() - t0, None

    with ThreadPoolExecutor(n_fits) as ex:
        res = list(ex.map(one, range(n_fits)))
    codes: dict = {}
    for code, *_ in res:
        codes[code] = codes.get(code, 0) + 1
    return {"sent": n_fits, "statuses": codes, "retry_after_on_429": all(ra for c, ra, _, _ in res if c == 429),
            "max_response_s": max(t for *_, t, _ in res), "accepted_jobs": [j for c, _, _, j in res if c == 202]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=None, help="A running service on loopback (default: start one).")
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--index-rows", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-requests", type=int, default=5000)
    ap.add_argument("--max-seconds", type=float, default=20.0)
    ap.add_argument("--rows-per-request", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--overload-fits", type=int, default=12)
    ap.add_argument("--json", dest="json_out", default=None, help="Also write the figures here.")
    a = ap.parse_args(argv)
    tmp = None
    proc = None
    url = a.url
    if url is None:
        tmp = Path(tempfile.mkdtemp(prefix="vb-load-"))
        proc, url = start_server(tmp / "data")
    check_loopback(url)
    out = {"dim": a.dim, "index_rows": a.index_rows, "concurrency": a.concurrency, "phases": []}
    try:
        world = prepare(url, dim=a.dim, index_rows=a.index_rows)
        rss0 = rss_kib(proc.pid) if proc else 0
        print(f"| phase | rows/req | requests | errors | req/s | rows/s | p50 ms | p99 ms |")
        print(f"|---|---|---|---|---|---|---|---|")
        for rows in a.rows_per_request:
            for name, req in (("transform (octet-stream)", transform_request(world["X"], rows)),
                              ("search a->b, k=10", search_request(world["X"], rows))):
                s = run_load(url, req, concurrency=a.concurrency, max_requests=a.max_requests,
                             max_seconds=a.max_seconds, rows=rows)
                out["phases"].append({"phase": name, "rows": rows, **s})
                print(f"| {name} | {rows} | {s['requests']} | {s['errors']} | {s['rps']:.0f} | {s['rows_per_s']:.0f} "
                      f"| {s['p50_ms']:.1f} | {s['p99_ms']:.1f} |", flush=True)
        rss1 = rss_kib(proc.pid) if proc else 0
        out["rss_kib"] = {"before": rss0, "after": rss1}
        print(f"\nRSS before {rss0 / 1024:.0f} MiB, after {rss1 / 1024:.0f} MiB")
        ov = overload(url, n_fits=a.overload_fits)
        out["overload"] = {k: v for k, v in ov.items() if k != "accepted_jobs"}
        print(f"overload: {ov['sent']} fits at once -> {ov['statuses']}, Retry-After on every 429: "
              f"{ov['retry_after_on_429']}, slowest answer {ov['max_response_s']:.2f}s")
        if a.json_out:
            Path(a.json_out).write_text(json.dumps(out, indent=2, default=str))
    finally:
        if proc is not None:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=30)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
