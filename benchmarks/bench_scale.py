"""Sufficient-statistics Procrustes fit on generated rows: one process vs Ray (local), time and peak memory.

    python benchmarks/bench_scale.py                       # 1,000,000 x 384, shards of 50,000
    python benchmarks/bench_scale.py --rows 200000 --ray-cpus 2 4

Rows are generated **inside** each shard task from a per-shard seed (x ~ N(0, I), y = x Q + 0.1 ε,
Q a fixed random rotation), in chunks of ``--chunk`` rows, so no process ever holds more than one
shard; the single-process run generates the very same shards one after the other. Both runs do
the full fit (frames: two passes; statistics; SVD), each in a fresh subprocess so that peak RSS
(``ru_maxrss``) belongs to that run alone. For Ray: the driver's peak and the largest worker peak.
Prints a markdown table and max|ΔW| between the runs, and the recovery error of the planted Q.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from functools import partial

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _rotation(dim: int, seed: int) -> np.ndarray:
    return np.linalg.qr(np.random.default_rng(seed).normal(size=(dim, dim)))[0].astype(np.float32)


def gen_shard(index: int, rows: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Shard ``index``: X (rows, dim) float32 and Y = X Q + noise, generated from ``seed + 1 + index``."""
    Q = _rotation(dim, seed)
    rng = np.random.default_rng(seed + 1 + index)
    X = rng.standard_normal((rows, dim), dtype=np.float32)
    Y = X @ Q
    Y += 0.1 * rng.standard_normal((rows, dim), dtype=np.float32)
    return X, Y


def run_one(mode: str, rows: int, dim: int, shard_rows: int, chunk: int, cpus: int, seed: int) -> dict:
    from service import distributed as D

    n_shards = -(-rows // shard_rows)
    sizes = [min(shard_rows, rows - i * shard_rows) for i in range(n_shards)]
    shards = [partial(gen_shard, i, sizes[i], dim, seed) for i in range(n_shards)]
    t0 = time.perf_counter()
    if mode == "single":
        m = D.fit_stats_local(shards, chunk_size=chunk)
        worker_peak = None
    else:
        import ray

        t_init = time.perf_counter()
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False)
        init_s = time.perf_counter() - t_init
        t0 = time.perf_counter()
        m = D.fit_stats_ray(shards, chunk_size=chunk)
        worker_peak = m.metadata["distributed"]["worker_peak_rss_mb"]
    secs = time.perf_counter() - t0
    Q = _rotation(dim, seed)
    out = {"mode": mode if mode == "single" else f"ray local {cpus} CPU", "rows": rows, "dim": dim,
           "shards": n_shards, "seconds": secs, "driver_peak_mb": D.peak_rss_mb(), "worker_peak_mb": worker_peak,
           "rows_per_s": rows / secs, "W_err_vs_planted": float(np.abs(m.W - Q).max()), "W": m.W.tolist()}
    if mode != "single":
        out["ray_init_s"] = init_s
        import ray

        ray.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--shard-rows", type=int, default=50_000)
    ap.add_argument("--chunk", type=int, default=16_384, help="rows per statistics update inside a shard")
    ap.add_argument("--ray-cpus", type=int, nargs="*", default=[2])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run one mode, print JSON
    args = ap.parse_args()
    if args.one:
        mode, cpus = args.one.split(":")
        print(json.dumps(run_one(mode, args.rows, args.dim, args.shard_rows, args.chunk, int(cpus), args.seed)))
        return
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONPATH": ROOT}
    results = []
    for spec in ["single:1", *[f"ray:{c}" for c in args.ray_cpus]]:
        cmd = [sys.executable, __file__, "--one", spec, "--rows", str(args.rows), "--dim", str(args.dim),
               "--shard-rows", str(args.shard_rows), "--chunk", str(args.chunk), "--seed", str(args.seed)]
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
        if res.returncode != 0:
            sys.exit(f"{spec} failed:\n{res.stderr[-3000:]}")
        results.append(json.loads(res.stdout.strip().splitlines()[-1]))
    W0 = np.asarray(results[0]["W"])
    print(f"\nSufficient-statistics Procrustes fit, {args.rows:,} x {args.dim} generated pairs "
          f"({results[0]['shards']} shards of {args.shard_rows:,}; chunk {args.chunk:,}; "
          f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']}; {os.cpu_count()} cores on this machine)\n")
    print("| run | seconds | rows/s | driver peak RSS (MiB) | largest worker peak RSS (MiB) | max abs dW vs single | "
          "max abs (W - planted Q) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        dW = float(np.abs(np.asarray(r["W"]) - W0).max())
        wp = "-" if r["worker_peak_mb"] is None else f"{r['worker_peak_mb']:.0f}"
        extra = f" (+{r['ray_init_s']:.1f} s ray.init)" if "ray_init_s" in r else ""
        print(f"| {r['mode']} | {r['seconds']:.1f}{extra} | {r['rows_per_s']:,.0f} | {r['driver_peak_mb']:.0f} | {wp} | "
              f"{dW:.1e} | {r['W_err_vs_planted']:.1e} |")


if __name__ == "__main__":
    main()
