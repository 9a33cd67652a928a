"""Python client overhead: ``service.client.Client.transform`` beside the raw httpx requests it wraps.

    python benchmarks/bench_client.py [--dim 384] [--batches 64,1024,8192] [--seconds 1.5] [--add-rows 100000]

A real uvicorn process on loopback serves a Procrustes map between two random ``dim``-d spaces
(temp data dir). Per batch size the paths take turns for ``--seconds`` each and the best time per
call is kept; all paths run in the same process, interleaved, so the ratios (to raw
httpx octet-stream) are what to read, not the absolute figures of a shared machine. Prints a
table; writes nothing. ``--add-rows N``: also ``Client.add`` of N rows into a new flat index (JSON ``vectors_b64``
bodies, as the client sends them), best of 3, rows/s.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def best_interleaved(paths: dict, seconds: float) -> dict[str, float]:
    """Best time per call of each path, the paths taking turns (a load spike hits them all alike)."""
    for fn in paths.values():
        fn()
    times = {k: float("inf") for k in paths}
    t_end, rounds = time.perf_counter() + seconds * len(paths), 0
    while time.perf_counter() < t_end or rounds < 3:
        for k, fn in paths.items():
            t0 = time.perf_counter()
            fn()
            times[k] = min(times[k], time.perf_counter() - t0)
        rounds += 1
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--batches", default="64,1024,8192")
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--add-rows", type=int, default=0, help="also time Client.add of this many rows (0: no)")
    args = ap.parse_args()

    from align import fit_procrustes
    from service.client import Client
    from service.registry import open_registry
    from _servers import env_for, free_port, start, stop

    rng = np.random.default_rng(0)
    d = args.dim
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        X = rng.standard_normal((4096, d)).astype(np.float32)
        Q, _ = np.linalg.qr(rng.standard_normal((d, d)))
        reg = open_registry(f"sqlite:///{data / 'registry.sqlite'}", data / "artifacts")
        reg.register_space("a", d)
        reg.register_space("b", d)
        reg.register_version("m", fit_procrustes(X, (X @ Q).astype(np.float32)), source_space="a",
                             target_space="b", method="procrustes", params={})
        reg.close()
        port = free_port()
        env = {**env_for(data, port), "VECBRIDGE_LOG_LEVEL": "WARNING"}
        proc = start([sys.executable, "-m", "uvicorn", "--factory", "service.api:create_app", "--host", "127.0.0.1",
                      "--port", str(port), "--no-access-log"], env, port, Path(tmp) / "server.log")
        base, key = f"http://127.0.0.1:{port}", "rkey-123"
        rows = []
        try:
            with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=120) as raw, \
                    Client(base, api_key=key, timeout=120) as vb:
                for n in (int(b) for b in args.batches.split(",")):
                    B = rng.standard_normal((n, d)).astype(np.float32)
                    body, rows_json = B.tobytes(), {"vectors": B.tolist()}
                    paths = {
                        "httpx octet-stream": lambda: np.frombuffer(raw.post(
                            "/v1/maps/m/transform", content=body,
                            headers={"content-type": "application/octet-stream"}).content, "<f4"),
                        "Client.transform (binary)": lambda: vb.transform("m", B),
                        "Client.transform (binary=False)": lambda: vb.transform("m", B, binary=False),
                    }
                    if n <= 1024:  # JSON number lists: seconds per call beyond that
                        paths["httpx JSON number lists"] = lambda: np.asarray(raw.post(
                            "/v1/maps/m/transform", json=rows_json).json()["vectors"], np.float32)
                    times = best_interleaved(paths, args.seconds)
                    ref = times["httpx octet-stream"]
                    rows += [(n, k, n / t, t * 1e3, ref / t) for k, t in times.items()]
            if args.add_rows:
                add_best = bench_add(base, args.add_rows, d, rng)
        finally:
            stop(proc)
    print(f"Client overhead, {d}-d float32 rows, best call, paths interleaved ({args.seconds:g} s each) "
          f"({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})")
    print(f"| {'batch':>5} | {'path':<32} | {'vectors/s':>10} | {'ms/call':>8} | {'vs raw octet':>12} |")
    print(f"|{'-' * 7}|{'-' * 34}|{'-' * 12}|{'-' * 10}|{'-' * 14}|")
    for n, k, vps, ms, rel in rows:
        print(f"| {n:>5} | {k:<32} | {vps:>10,.0f} | {ms:>8.2f} | {rel:>11.2f}x |")
    if args.add_rows:
        print(f"\nClient.add of {args.add_rows:,} x {d} rows into a new flat index: best of 3 {add_best:.3f} s, "
              f"{args.add_rows / add_best:,.0f} rows/s")


def bench_add(base: str, n: int, d: int, rng) -> float:
    """Best seconds of three ``Client.add`` calls of ``n`` random rows, each into a new flat index of space ``a``."""
    from service.client import Client

    X = rng.standard_normal((n, d)).astype(np.float32)
    best = float("inf")
    with Client(base, api_key="wkey-456", timeout=600) as vb:
        for i in range(3):
            vb.create_index(f"add{i}", space="a", kind="flat")
            t0 = time.perf_counter()
            assert vb.add(f"add{i}", X)["count"] == n
            best = min(best, time.perf_counter() - t0)
    return best


if __name__ == "__main__":
    main()
