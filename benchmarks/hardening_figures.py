"""Worst requests against a real ``vecbridge serve`` on loopback: RSS growth vs body size, and
``/healthz`` latency while each one runs (issue 15 goals: growth ≲ 4x the body, /healthz < 100 ms).

    python benchmarks/hardening_figures.py                 # 384-d, 20k-row index, default limits
    python benchmarks/hardening_figures.py --dim 128 --index-rows 5000

For each request: status, body MB, answer MB, seconds, peak RSS growth above the RSS just before
(sampled every 2 ms from /proc), growth / body, and /healthz p50 / max from a probe every 20 ms
while the request runs. One table, one run, one machine (idle /healthz first, for the ratio).
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

_spec = importlib.util.spec_from_file_location("vb_load_test", Path(__file__).with_name("load_test.py"))
load_test = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(load_test)
KEY = load_test.KEY
W = {"Authorization": f"Bearer {KEY}"}


_PROBE = r"""
import sys, threading, time, httpx
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
lat = []
with httpx.Client(base_url=sys.argv[1], timeout=30) as c:
    c.get("/healthz")
    print("ready", flush=True)
    while not stop.is_set():
        t0 = time.perf_counter()
        c.get("/healthz")
        lat.append(time.perf_counter() - t0)
        time.sleep(0.02)
print(" ".join(f"{x:.6f}" for x in lat))
"""


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _b64(X: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(X, dtype="<f4").tobytes()).decode()


def measure(url: str, pid: int, name: str, method: str, path: str, *, content, headers: dict) -> dict:
    """Run one request; sample RSS and probe /healthz while it runs."""
    body_mb = (len(content) if isinstance(content, (bytes, bytearray)) else content.size) / 2**20
    before = rss_mib(pid)
    peak = [before]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_mib(pid))
            time.sleep(0.002)

    # the prober is its own process: this one's GIL is busy sending the body
    prober = subprocess.Popen([sys.executable, "-c", _PROBE, url], stdout=subprocess.PIPE, stdin=subprocess.PIPE,
                              text=True)
    prober.stdout.readline()  # "ready"
    threads = [threading.Thread(target=sample)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    try:
        with httpx.Client(base_url=url, timeout=300) as c:
            body = content.stream() if hasattr(content, "stream") else content
            r = c.request(method, path, content=body, headers=headers)
            status, answer = r.status_code, len(r.content)
    except httpx.HTTPError as exc:  # a server that closes early on a refused upload
        status, answer = type(exc).__name__, 0
    wall = time.perf_counter() - t0
    time.sleep(0.05)
    done.set()
    for t in threads:
        t.join()
    out, _ = prober.communicate("stop\n", timeout=60)
    lat = [float(x) for x in out.split()]
    growth = peak[0] - before
    return {"request": name, "status": status, "body_mb": body_mb, "answer_mb": answer / 2**20, "seconds": wall,
            "rss_growth_mb": growth, "growth_per_body": growth / body_mb if body_mb else float("nan"),
            "healthz_p50_ms": 1000 * float(np.median(lat)) if lat else float("nan"),
            "healthz_max_ms": 1000 * max(lat) if lat else float("nan"), "probes": len(lat)}


class Chunked:
    """A body sent without Content-Length (chunked), so only the streaming limit can stop it."""

    def __init__(self, size: int, chunk: int = 1 << 20):
        self.size, self.chunk = size, chunk

    def stream(self):
        sent = 0
        piece = b" " * self.chunk
        while sent < self.size:
            yield piece
            sent += self.chunk


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--index-rows", type=int, default=20_000)
    args = ap.parse_args(argv)
    d = args.dim
    import os

    # the recommended setting for latency: JSON bodies up to 16 MiB (one JSON parse holds the GIL)
    os.environ.setdefault("VECBRIDGE_LIMITS__BODY_BYTES_JSON", str(16 * 2**20))
    tmp = Path(tempfile.mkdtemp(prefix="vb-harden-"))
    proc, url = load_test.start_server(tmp / "data", max_batch=65536)
    try:
        load_test.prepare(url, dim=d, index_rows=args.index_rows, fit_rows=2000)
        rng = np.random.default_rng(0)
        jh = {**W, "content-type": "application/json"}
        big = b'{"name": "x", "dim": 3, "description": "' + b"a" * (60 * 2**20) + b'"}'
        Xj = rng.standard_normal((8192, d)).astype(np.float32)
        Xb = rng.standard_normal((8_000, d)).astype(np.float32)
        Xo = rng.standard_normal((40_000, d)).astype(np.float32)
        Q = rng.standard_normal((100, d)).astype(np.float32)
        cases = [
            ("no key, 60 MB, POST /v1/spaces", "POST", "/v1/spaces", big, {"content-type": "application/json"}),
            ("no key, 60 MB chunked, POST /v1/spaces", "POST", "/v1/spaces", Chunked(60 * 2**20),
             {"content-type": "application/json"}),
            ("write key, 60 MB tag (small route)", "PUT", "/v1/maps/a2b/versions/1/tags/t", big, jh),
            ("transform, JSON numbers 2048 x d (16 MB: body_bytes_json)", "POST", "/v1/maps/a2b@prod/transform",
             json.dumps({"vectors": Xj[:2048].tolist()}).encode(), jh),
            ("transform, JSON numbers 8192 x d (62 MB)", "POST", "/v1/maps/a2b@prod/transform",
             json.dumps({"vectors": Xj.tolist()}).encode(), jh),
            ("transform, vectors_b64 8000 x d", "POST", "/v1/maps/a2b@prod/transform",
             json.dumps({"vectors_b64": _b64(Xb), "dim": d, "encoding_format": "base64"}).encode(), jh),
            ("transform, octet-stream 40000 x d", "POST", "/v1/maps/a2b@prod/transform", Xo.tobytes(),
             {**W, "content-type": "application/octet-stream"}),
            ("index add, vectors_b64 8000 x d", "POST", "/v1/indexes/ib/vectors",
             json.dumps({"vectors_b64": _b64(Xb), "dim": d}).encode(), jh),
            ("search, 100 queries x k=1000 (max_hits), exact", "POST", "/v1/indexes/ib/search",
             json.dumps({"vectors_b64": _b64(Q), "dim": d, "k": 1000, "exact": True}).encode(), jh),
            ("search, 1600 queries x k=10000 (issue 15)", "POST", "/v1/indexes/ib/search",
             json.dumps({"vectors_b64": _b64(np.tile(Q, (16, 1))), "dim": d, "k": 10_000}).encode(), jh),
        ]
        with httpx.Client(base_url=url, timeout=30) as c:
            idle = []
            for _ in range(50):
                t0 = time.perf_counter()
                c.get("/healthz")
                idle.append(time.perf_counter() - t0)
                time.sleep(0.01)
        rows = [measure(url, proc.pid, *case[:3], content=case[3], headers=case[4]) for case in cases]
        print(f"\n{d}-d, {args.index_rows}-row flat index; idle /healthz p50 {1000 * np.median(idle):.1f} ms, "
              f"max {1000 * max(idle):.1f} ms\n")
        print("| request | status | body MB | answer MB | s | RSS growth MB | growth / body | /healthz p50 ms | "
              "/healthz max ms |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['request']} | {r['status']} | {r['body_mb']:.1f} | {r['answer_mb']:.1f} | "
                  f"{r['seconds']:.2f} | "
                  f"{r['rss_growth_mb']:.0f} | {r['growth_per_body']:.2f} | {r['healthz_p50_ms']:.1f} | "
                  f"{r['healthz_max_ms']:.1f} |")
        print(f"\nserver alive after all: {proc.poll() is None}")
    finally:
        import os
        import signal

        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
