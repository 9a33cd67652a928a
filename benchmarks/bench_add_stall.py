"""Search latency while one large batch is added to (or deleted from) the same index, over real HTTP (a uvicorn
server process).

    python benchmarks/bench_add_stall.py --kind hnsw --rows 200000 --add 20000 --cache /tmp/stall-cache
    python benchmarks/bench_add_stall.py --kind hnsw --rows 50000 --delete 6000 --cache /tmp/stall-cache-50k

An index of ``--rows`` x 384 rows (WordNet MiniLM rows repeated with N(0, 0.01) noise, as
``bench_index_writes.py``) is built once into ``--cache`` (reused by later runs: each run serves a copy, the
generation files hard-linked, as they are never changed in place). A server is started on the copy; one client
searches it with one query (k=10) in a loop, and after ``--before`` seconds another client adds ``--add`` rows in one
request (``vectors_b64``), or with ``--delete N`` deletes the ids 0..N-1 in one request (past 10 % of an HNSW
index's rows: the delete rebuilds the graph). Printed: the write's wall time, and the latencies of the searches
that started before the write and of those that started while it ran (count, p50, p99, max), plus the longest gap
between two answers.
The server runs with ``OMP_NUM_THREADS=1`` (what the tests use).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from _servers import env_for, free_port, start, stop
from bench_index_writes import rows

W = {"Authorization": "Bearer wkey-456", "Content-Type": "application/json"}


def build(cache: Path, kind: str, n: int) -> None:
    """The data dir ``cache``: space ``m`` (384-d) and index ``big`` of ``n`` rows of ``kind`` (once)."""
    if (cache / "indexes" / "big" / "meta.json").exists():
        return
    from service.indexes import IndexStore
    from service.registry import open_registry

    cache.mkdir(parents=True, exist_ok=True)
    reg = open_registry(f"sqlite:///{(cache / 'registry.sqlite').resolve()}", (cache / "artifacts").resolve())
    reg.register_space("m", 384)
    reg.close()
    X, _ = rows(n)
    t = time.perf_counter()
    IndexStore(cache / "indexes").create("big", "m", X, kind=kind, dim=384)
    print(f"built {kind} {n} x 384 in {time.perf_counter() - t:.1f} s", flush=True)


def copy(cache: Path, dest: Path) -> None:
    """``cache`` to ``dest``: index generation files hard-linked (immutable), the rest copied."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(cache, dest, copy_function=lambda s, d: (os.link if "/indexes/" in s else shutil.copy2)(s, d))


def stats(lat: list[float]) -> str:
    if not lat:
        return "none"
    a = np.array(lat) * 1e3
    return f"{a.size} searches, p50 {np.percentile(a, 50):.1f} ms, p99 {np.percentile(a, 99):.1f} ms, max {a.max():.1f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", default="hnsw", choices=("hnsw", "flat"))
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--add", type=int, default=20_000)
    ap.add_argument("--delete", type=int, default=0, help="delete this many rows instead of adding --add rows")
    ap.add_argument("--before", type=float, default=3.0, help="seconds of searches before the add")
    ap.add_argument("--cache", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=None, help="the served copy (default: CACHE.run)")
    a = ap.parse_args()
    build(a.cache, a.kind, a.rows)
    data = a.work or a.cache.with_name(a.cache.name + ".run")
    copy(a.cache, data)
    port = free_port()
    cmd = [sys.executable, "-m", "uvicorn", "--factory", "service.api:create_app", "--host", "127.0.0.1", "--port",
           str(port), "--no-access-log"]
    env = {**env_for(data, port), "PYTHONPATH": str(ROOT)}
    proc = start(cmd, env, port, data / "server.log")
    url = f"http://127.0.0.1:{port}"
    try:
        q = {"vectors": rows(1, seed=7)[0][:1].tolist(), "k": 10}
        with httpx.Client(timeout=600) as c:
            assert c.post(f"{url}/v1/indexes/big/search", json=q, headers=W).status_code == 200  # loaded
        if a.delete:
            what, route, body = f"delete of {a.delete} rows", "delete", json.dumps({"ids": list(range(a.delete))})
        else:
            X = rows(a.add, seed=11)[0] + 0.01
            what, route = f"add of {a.add} rows", "vectors"
            body = json.dumps({"vectors_b64": base64.b64encode(X.astype(np.float32).tobytes()).decode(), "dim": 384})
        done = threading.Event()
        lat: list[tuple[float, float]] = []  # (start, latency)

        def searcher() -> None:
            with httpx.Client(timeout=600) as c:
                while not done.is_set():
                    t = time.perf_counter()
                    r = c.post(f"{url}/v1/indexes/big/search", json=q, headers=W)
                    assert r.status_code == 200, r.text
                    lat.append((t, time.perf_counter() - t))

        th = threading.Thread(target=searcher)
        th.start()
        time.sleep(a.before)
        with httpx.Client(timeout=900) as c:
            t0 = time.perf_counter()
            r = c.post(f"{url}/v1/indexes/big/{route}", content=body, headers=W)
            t1 = time.perf_counter()
        time.sleep(1.0)
        done.set()
        th.join()
        assert r.status_code == 200, r.text[:300]
        before = [d for t, d in lat if t < t0]
        during = [d for t, d in lat if t0 <= t < t1]
        ends = sorted(t + d for t, d in lat if t + d >= t0 and t < t1)
        gap = max(np.diff([t0, *ends, t1])) if ends else t1 - t0
        print(f"{a.kind} {a.rows} x 384, {what}: {t1 - t0:.2f} s; count after {r.json()['count']}")
        print(f"  before the write: {stats(before)}")
        print(f"  during the write: {stats(during)}; longest time without an answer {gap * 1e3:.0f} ms")
    finally:
        stop(proc)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
