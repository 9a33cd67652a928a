"""Benchmark: one big flat index searched over HTTP by a server on the CPU and by one on the GPU (issue 11).

Two real ``vecbridge serve`` processes share one data dir holding one flat index of ``--rows`` unit rows (the demo's
e5 rows repeated with noise, as ``bench_gpu.py`` builds them; not real text): one with the default
``search_device=cpu`` (FAISS), one with ``--search-device cuda`` (torch on the GPU, service/indexes/device.py).
Each round sends ``--calls`` searches (k=10, ``vectors_b64``) at batch 1 and 64 to each server in turn over one
keep-alive connection; the table gives the median ms per request of all rounds, the ratio, and whether the two
servers answered the same ids. Without a GPU the GPU column says why and the CPU figures stand alone.

Run: ``python benchmarks/bench_gpu_service.py [--rows 200000] [--out gpu_service.md]``
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_gpu
from bench_service import HDR, start_server

sys.path.insert(0, str(ROOT / "tests"))
from _servers import free_port, stop


def gpu_reason() -> str:
    """Why no GPU server runs here ('' when one can)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    return "" if torch.cuda.is_available() else f"torch {torch.__version__} sees no CUDA device"


def build(data: Path, rows: int) -> np.ndarray:
    """The data dir: space ``e5`` and flat index ``big`` of ``rows`` stand-in rows; returns 256 queries."""
    from service.indexes import IndexStore
    from service.registry import open_registry

    docs = bench_gpu.unit(bench_gpu.demo_map()[2])  # the demo's e5 rows
    X = bench_gpu.big_corpus(docs, rows)
    reg = open_registry(f"sqlite:///{data / 'registry.sqlite'}", data / "artifacts")
    reg.register_space("e5", X.shape[1])
    reg.close()
    IndexStore(data / "indexes").create("big", "e5", X, kind="flat")
    rng = np.random.default_rng(3)
    return bench_gpu.unit(X[rng.integers(0, rows, 256)] + 0.1 * rng.standard_normal((256, X.shape[1]),
                                                                                    dtype=np.float32))


def body(Q: np.ndarray) -> dict:
    return {"vectors_b64": base64.b64encode(np.ascontiguousarray(Q, "<f4").tobytes()).decode(), "dim": Q.shape[1],
            "k": 10}


def ids(answer: dict) -> list[list[int]]:
    return [[hit["id"] for hit in row] for row in answer["results"]]


def main(argv=None) -> int:
    import httpx

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--calls", type=int, default=30, help="requests per server, batch and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--blas-threads", type=int, default=1,
                    help="VECBRIDGE_BLAS_THREADS of both servers (0: FAISS on every core, the fair CPU column on a "
                         "many-core GPU host)")
    ap.add_argument("--out", type=Path, default=None, help="also write the report (markdown) here")
    args = ap.parse_args(argv)
    say = bench_gpu.Report()

    why = gpu_reason()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        t0 = time.perf_counter()
        Q = build(data, args.rows)
        say(f"# Search over HTTP: a server on the CPU beside one on the GPU ({time.strftime('%Y-%m-%d')})\n")
        say(f"- one flat index of {args.rows:,} x {Q.shape[1]} stand-in rows (built in {time.perf_counter() - t0:.0f}"
            f" s), k=10, vectors_b64, {args.rounds} rounds x {args.calls} calls per cell, {os.cpu_count()} CPUs,"
            f" VECBRIDGE_BLAS_THREADS={args.blas_threads}")
        servers = {}
        try:
            threads = {"VECBRIDGE_BLAS_THREADS": str(args.blas_threads)}
            for label, extra in (("cpu", threads), ("gpu", {**threads, "VECBRIDGE_SEARCH_DEVICE": "cuda"})):
                if label == "gpu" and why:
                    continue
                port = free_port()
                servers[label] = (start_server(data, port, extra_env=extra), f"http://127.0.0.1:{port}")
            say(f"- GPU server: {'`--search-device cuda`' if 'gpu' in servers else f'not run ({why})'}\n")
            say("| batch | CPU server p50 ms | GPU server p50 ms | CPU / GPU | same top-10 ids |")
            say("|---:|---:|---:|---:|---:|")
            with httpx.Client(headers=HDR, timeout=600) as c:
                for batch in (1, 64):
                    payload = body(Q[:batch])
                    answers = {k: c.post(f"{url}/v1/indexes/big/search", json=payload) for k, (_, url) in
                               servers.items()}  # the warm-up (the GPU copy is made here)
                    for k, r in answers.items():
                        assert r.status_code == 200, (k, r.status_code, r.text[:300])
                    times: dict[str, list[float]] = {k: [] for k in servers}
                    for _ in range(args.rounds):
                        for k, (_, url) in servers.items():
                            for _ in range(args.calls):
                                t = time.perf_counter()
                                c.post(f"{url}/v1/indexes/big/search", json=payload).raise_for_status()
                                times[k].append((time.perf_counter() - t) * 1e3)
                    cpu = statistics.median(times["cpu"])
                    gpu = statistics.median(times["gpu"]) if "gpu" in times else None
                    same = (f"{ids(answers['cpu'].json()) == ids(answers['gpu'].json())}" if gpu is not None
                            else "—")
                    say(f"| {batch} | {cpu:.2f} | {'—' if gpu is None else f'{gpu:.2f}'} | "
                        f"{'—' if gpu is None else f'{cpu / gpu:.1f}'} | {same} |")
        finally:
            for proc, _ in servers.values():
                stop(proc)
    say.write(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
