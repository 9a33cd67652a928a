"""Cluster maps through the service: transform µs/row of a ClusterMap vs a LinearMap, in-process and over HTTP.

    python benchmarks/bench_cluster_service.py            # WordNet minilm -> e5 (384 -> 384)
    python benchmarks/bench_cluster_service.py --quick    # fewer repeats

Both maps are fitted on the same 8,192 WordNet pairs (rows [0, 8192) of ``minilm`` / ``e5``):
``procrustes`` (one matrix) and ``cluster`` (``align.fit_migration(method="cluster")``, its own
selection of cluster count, shrinkage, blend). They are registered in one registry; a real uvicorn
server (``vecbridge serve`` entry point, one worker, ``OMP_NUM_THREADS=1``) answers binary
(``application/octet-stream``) transforms of held-out rows. Per batch size: median wall time per
request over the repeats, as µs per row, for in-process ``apply`` and HTTP, linear and cluster side
by side with the ratio cluster / linear. Writes ``benchmarks/results/cluster_service_<date>.{json,md}``
(``--results DIR``: elsewhere). Without the shared set: a sample of 4,096 definitions embedded here
(``wordnet_sample.py``), fitted on its first fifth (8,192 of 40,960 in the shared set), transforms of its
held-out rows [4n/5, n) repeated to the largest batch; said in the output.
"""

from __future__ import annotations

import argparse
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
from _servers import env_for, free_port, scratch_dir, start, stop  # noqa: E402
from _api_support import R  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
import wordnet_sample

RESULTS = ROOT / "benchmarks" / "results"
BATCHES = (1, 64, 1024, 8192)


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm (plans, caches, connection)
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--results", type=Path, default=RESULTS, help="folder for the .json / .md (default %(default)s)")
    ap.add_argument("--keep", action="store_true", help="keep the servers' data dir (registry, logs) for debugging")
    args = ap.parse_args(argv)
    try:
        folder = wordnet_sample.wordnet_dir()
    except wordnet_sample.SampleUnavailable as e:
        print(f"no WordNet data ({e}); nothing to benchmark")
        return
    with scratch_dir("vb-cluster-bench-", args.keep) as data:
        run(args, folder, data)


def run(args, folder: Path, data: Path) -> None:
    """Fit both maps, serve them from ``data``, time the batches, write the results."""
    note = wordnet_sample.note(folder)
    load_start = os.getloadavg()
    import httpx

    import align
    from service.registry import open_registry

    src, tgt = wordnet_sample.load(folder, "minilm"), wordnet_sample.load(folder, "e5")
    n = src.shape[0]
    X, Y = src[: n // 5], tgt[: n // 5]  # 8,192 pairs of the shared set's 40,960
    Q = wordnet_sample.tile(src[wordnet_sample.split(n)[2]], max(BATCHES))  # its held-out rows [32768, 40960)
    t = time.perf_counter()
    lin = align.fit_migration(X, Y, method="procrustes", random_state=0)
    t_lin = time.perf_counter() - t
    t = time.perf_counter()
    cm = align.fit_migration(X, Y, method="cluster", random_state=0)
    t_cm = time.perf_counter() - t
    reg = open_registry(f"sqlite:///{data / 'registry.sqlite'}", data / "artifacts")
    reg.register_version("lin", lin, source_space="minilm", target_space="e5", method="procrustes", params={})
    reg.register_version("cl", cm, source_space="minilm", target_space="e5", method="cluster", params={})
    reg.close()
    port = free_port()
    proc = start([sys.executable, "-c", "from service.api.app import serve; serve()"], env_for(data, port), port,
                 data / "server.log")
    repeats = 5 if args.quick else 15
    rows = []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={**R, "content-type":
                                                                        "application/octet-stream"}) as c:
            for b in BATCHES:
                x = Q[:b]
                row = {"batch": b}
                for name, m in (("linear", lin), ("cluster", cm)):
                    row[f"{name}_inproc_us"] = 1e6 * _median_seconds(lambda: m.apply(x), repeats) / b

                    def http(name=name):
                        r = c.post(f"/v1/maps/{'lin' if name == 'linear' else 'cl'}/transform", content=x.tobytes())
                        assert r.status_code == 200, r.text

                    row[f"{name}_http_us"] = 1e6 * _median_seconds(http, repeats) / b
                r = c.post("/v1/maps/cl/transform", content=x.tobytes())
                row["http_equals_inproc_maxabs"] = float(np.abs(np.frombuffer(r.content, "<f4").reshape(b, -1)
                                                                - cm.apply(x)).max())
                rows.append(row)
    finally:
        stop(proc)
    out = {"date": str(date.today()), "machine": platform.platform(), "cpus": os.cpu_count(),
           "loadavg_start_end": [load_start], "omp_threads": os.environ.get("OMP_NUM_THREADS"),
           "pairs": int(X.shape[0]), **({"note": note} if note else {}), "dims": [int(X.shape[1]), int(Y.shape[1])],
           "fit_seconds": {"procrustes": round(t_lin, 2), "cluster": round(t_cm, 2)},
           "cluster": {"n_clusters": cm.n_clusters, "blend": cm.blend, "temperature": cm.temperature},
           "repeats": repeats, "rows": rows}
    out["loadavg_start_end"].append(os.getloadavg())
    lines = [f"# Cluster vs linear map through the service ({out['date']})", "",
             *([note, ""] if note else []),
             f"WordNet minilm -> e5 (384 -> 384), {X.shape[0]:,} pairs; cluster map k={cm.n_clusters}, "
             f"blend={cm.blend}; "
             f"uvicorn 1 worker, OMP_NUM_THREADS={out['omp_threads']}, {out['cpus']} cores, load "
             f"{load_start[0]:.2f} -> {os.getloadavg()[0]:.2f}; median of {repeats}.", "",
             "| batch | linear in-proc µs/row | cluster in-proc µs/row | ratio | linear HTTP µs/row | "
             "cluster HTTP µs/row | ratio |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['linear_inproc_us']:.2f} | {r['cluster_inproc_us']:.2f} | "
                     f"{r['cluster_inproc_us'] / r['linear_inproc_us']:.2f} | {r['linear_http_us']:.2f} | "
                     f"{r['cluster_http_us']:.2f} | {r['cluster_http_us'] / r['linear_http_us']:.2f} |")
    text = "\n".join(lines)
    print(text)
    args.results.mkdir(parents=True, exist_ok=True)
    stem = args.results / f"cluster_service_{out['date']}{'_quick' if args.quick else ''}"
    stem.with_suffix(".json").write_text(json.dumps(out, indent=1))
    stem.with_suffix(".md").write_text(text + "\n")


if __name__ == "__main__":
    main()
