"""Serving with the native thread pools at one thread vs the libraries' defaults, side by side.

    python benchmarks/bench_blas_threads.py            # 12 interleaved rounds
    python benchmarks/bench_blas_threads.py --rounds 4

Two real servers (``vecbridge serve`` entry point, one worker each) on one data dir: ``blas_threads=1``
(the default, service/threads.py) and ``blas_threads=0`` (OpenBLAS / OpenMP at their defaults: every
core). Neither gets ``OMP_NUM_THREADS``. Cells — binary transform (octet-stream) at batch 1 / 8 / 64 /
1,024 and search (``vectors_b64``, k = 10, flat e5 index of 8,192 rows through the map) at batch 1 / 64 —
are interleaved: each round sends ``--per`` requests per cell to one server then the other, so load hits
both alike. p50 and p99 per cell over all rounds, and the ratio default / one-thread (> 1: one thread is
faster). The machine's 1-minute load average is printed at the start and end: the difference shows when
the cores are busy with something else (spinning thread teams then wait for descheduled members).
Writes ``benchmarks/results/blas_threads_<date>.{json,md}`` (``--results DIR``: elsewhere). Data:
``../shared/data/wordnet`` rows; without it a sample of 4,096 definitions embedded here (``wordnet_sample.py``),
the row ranges scaled to its size, said so; a synthetic planted pair, said so, when neither can be had.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import wordnet_sample
from _api_support import R, W  # noqa: E402
from _servers import env_for, free_port, scratch_dir, start, stop  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
TRANSFORM_BATCHES = (1, 8, 64, 1024)
SEARCH_BATCHES = (1, 64)


def load_data():
    """``(X, Y, corpus, held, name, note)``: fit pairs [0, n/10), e5 corpus [n/5, 2n/5), held-out minilm rows
    [4n/5, 4n/5 + n/20) — 4,096 / 8,192 / 2,048 rows of the shared set's 40,960; held tiled to a batch of 1,024."""
    try:
        folder = wordnet_sample.wordnet_dir()
    except wordnet_sample.SampleUnavailable as e:
        print(f"no WordNet data ({e}): a synthetic planted pair instead")
    else:
        src, tgt = wordnet_sample.load(folder, "minilm"), wordnet_sample.load(folder, "e5")
        n = src.shape[0]
        s, _, h = wordnet_sample.split(n)
        name = f"WordNet sample ({n:,} rows)" if wordnet_sample.is_sample(folder) else "WordNet"
        return (src[: n // 10], tgt[: n // 10], tgt[s.stop // 2 : s.stop],
                wordnet_sample.tile(src[h.start : h.start + n // 20], max(TRANSFORM_BATCHES)), name,
                wordnet_sample.note(folder))
    rng = np.random.default_rng(0)
    Q = np.linalg.qr(rng.normal(size=(384, 384)))[0]
    X = rng.normal(size=(16384, 384)).astype(np.float32)
    Y = (X @ Q).astype(np.float32)
    return X[:4096], Y[:4096], Y[8192:], X[14336:], "SYNTHETIC planted rotation (WordNet data absent)", ""


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--per", type=int, default=20, help="requests per cell per round (batch 1,024: a quarter)")
    ap.add_argument("--results", type=Path, default=RESULTS, help="folder for the .json / .md (default %(default)s)")
    ap.add_argument("--keep", action="store_true", help="keep the servers' data dir (registry, logs) for debugging")
    args = ap.parse_args(argv)
    with scratch_dir("vb-blas-bench-", args.keep) as data:
        run(args, data)


def run(args, data: Path) -> None:
    """Serve one data dir from two servers, time the cells interleaved, write the results."""
    import httpx

    import align
    from service.registry import open_registry

    X, Y, corpus, held, data_name, note = load_data()
    reg = open_registry(f"sqlite:///{data / 'registry.sqlite'}", data / "artifacts")
    reg.register_space("minilm", 384)
    reg.register_space("e5", 384)
    reg.register_version("m", align.fit_procrustes(X, Y), source_space="minilm", target_space="e5",
                         method="procrustes", params={})
    reg.close()
    servers, clients = {}, {}
    load_start = os.getloadavg()[0]
    try:
        for label, setting in (("one thread", "1"), ("default", "0")):
            port = free_port()
            env = env_for(data, port)
            for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
                env.pop(var, None)
            env["VECBRIDGE_BLAS_THREADS"] = setting
            env["VECBRIDGE_LOG_LEVEL"] = "WARNING"
            servers[label] = start([sys.executable, "-c", "from service.cli import main; main()", "serve"], env, port,
                                   data / f"server-{setting}.log")
            clients[label] = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120)
        first = clients["one thread"]
        r = first.post("/v1/indexes", headers=W, json={
            "name": "docs", "space": "e5", "kind": "flat", "dim": 384,
            "vectors_b64": base64.b64encode(np.ascontiguousarray(corpus).tobytes()).decode()})
        assert r.status_code == 201, r.text
        for c in clients.values():  # the second server opens the index from the shared data dir
            assert c.get("/v1/indexes/docs", headers=R).status_code == 200

        octet = {**R, "content-type": "application/octet-stream"}
        cells = {}
        for b in TRANSFORM_BATCHES:
            body = np.ascontiguousarray(held[:b]).tobytes()
            cells[f"transform batch {b}"] = (b, lambda c, body=body: c.post("/v1/maps/m/transform", content=body,
                                                                             headers=octet))
        for b in SEARCH_BATCHES:
            body = json.dumps({"vectors_b64": base64.b64encode(np.ascontiguousarray(held[:b]).tobytes()).decode(),
                               "dim": 384, "space": "minilm", "k": 10, "include_payloads": False}).encode()
            cells[f"search batch {b}"] = (b, lambda c, body=body: c.post(
                "/v1/indexes/docs/search", content=body, headers={**R, "content-type": "application/json"}))
        times = {(cell, label): [] for cell in cells for label in clients}
        for _, fn in cells.values():  # warm both
            for c in clients.values():
                assert fn(c).status_code == 200
        for rnd in range(args.rounds):
            for cell, (b, fn) in cells.items():
                n = max(2, args.per // 4) if b >= 1024 else args.per
                for label, c in (clients.items() if rnd % 2 == 0 else reversed(clients.items())):
                    for _ in range(n):
                        t = time.perf_counter()
                        r = fn(c)
                        times[(cell, label)].append(time.perf_counter() - t)
                        assert r.status_code == 200, r.text
    finally:
        for c in clients.values():
            c.close()
        for p in servers.values():
            stop(p, timeout=30)
    load_end = os.getloadavg()[0]
    rows = []
    for cell in cells:
        one, dflt = (np.array(times[(cell, lab)]) * 1e3 for lab in ("one thread", "default"))
        rows.append({"cell": cell, "one_p50_ms": float(np.median(one)), "one_p99_ms": float(np.percentile(one, 99)),
                     "default_p50_ms": float(np.median(dflt)), "default_p99_ms": float(np.percentile(dflt, 99)),
                     "n": int(one.size)})
    out = {"date": str(date.today()), "data": data_name, "cpus": os.cpu_count(), "python": platform.python_version(),
           "load_1min_start_end": [load_start, load_end], "rounds": args.rounds, "rows": rows}
    lines = [f"# Serving at blas_threads=1 vs the libraries' defaults ({out['date']})", "",
             f"{data_name}: Procrustes map minilm -> e5, flat e5 index of {len(corpus):,} rows, k = 10; two servers, "
             f"one worker each, no OMP_NUM_THREADS; {args.rounds} interleaved rounds; {os.cpu_count()} CPUs, load "
             f"{load_start:.2f} -> {load_end:.2f}.", *([note] if note else []), "",
             "| cell | 1 thread p50 ms | default p50 ms | p50 default/1 | 1 thread p99 ms | default p99 ms | "
             "p99 default/1 |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['cell']} | {r['one_p50_ms']:.2f} | {r['default_p50_ms']:.2f} | "
                     f"{r['default_p50_ms'] / r['one_p50_ms']:.2f} | {r['one_p99_ms']:.2f} | {r['default_p99_ms']:.2f} | "
                     f"{r['default_p99_ms'] / r['one_p99_ms']:.2f} |")
    text = "\n".join(lines)
    print(text)
    args.results.mkdir(parents=True, exist_ok=True)
    stem = args.results / f"blas_threads_{out['date']}"
    stem.with_suffix(".json").write_text(json.dumps(out, indent=1))
    stem.with_suffix(".md").write_text(text + "\n")


if __name__ == "__main__":
    main()
