"""Alignment benchmark on the shared WordNet embeddings (ALGORITHMS.md §4, CONTEXT split).

Split (fixed): source training rows [0, 16384) of the SOURCE file, target training rows
[16384, 32768) of the TARGET file (different texts: no true pairs in training), held-out pairs
[32768, 40960) of both files (8,192 pairs, the candidate pool).

Methods, side by side, per pair and seed:
  identity      W = I in each side's own frame (only when dims match)
  supervised    orthogonal Procrustes on the 16,384 TRUE pairs [0, 16384) of both files (ceiling)
  published     MiniVec2Vec.published(): the faithful published procedure (the peer). ~10 min a
                run: only run with --peer; results are stored as JSON under benchmarks/results/
                and read back into every later table.
  vecbridge     MiniVec2Vec.fast(random_state=seed) (or --preset NAME, --params JSON overrides)

Columns: top-1, mean rank, mean cosine, CSLS top-1 (k=10), the unsupervised criterion (computed
without labels), fit seconds, peak-memory increase of the fitting process (ru_maxrss delta; each
fit runs in a fresh process). Summaries: mean ± std and the worst seed.

Usage::

    python benchmarks/bench_align.py                       # all pairs, seeds 0..4, vecbridge + baselines
    python benchmarks/bench_align.py --pairs minilm:e5 --seeds 0 1
    python benchmarks/bench_align.py --peer --pairs minilm:e5 --seeds 0 1   # run + store the peer
    python benchmarks/bench_align.py --semi --pairs minilm:e5 --seeds 0     # seed-pair sweep

Without the shared set, a sample of 4,096 WordNet definitions embedded here (``wordnet_sample.py``) is used, the
split scaled to its rows (0.4 / 0.4 / 0.2); pairs with glove or paraphrase_l3 are skipped (no encoder here) and
the stored peer results (shared set) are neither shown nor written.

Environment: OMP_NUM_THREADS / MKL / OPENBLAS default to 1 (shared machine).
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse
import json
import multiprocessing as mp
import platform
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import wordnet_sample

RESULTS = HERE / "results"
DEFAULT_PAIRS = ("minilm:e5", "e5:minilm", "glove:minilm", "minilm:paraphrase_l3")
SEMI_KS = (0, 10, 30, 100, 300, 1000)


def load(data: Path, name: str) -> np.ndarray:
    return np.load(Path(data) / f"{name}.npy", mmap_mode="r")


def split(data: Path, src: str, tgt: str):
    """Return (X_train (16384, d_s), Y_train (16384, d_t), X_held (8192, d_s), Y_held (8192, d_t)) float32.

    Sizes for the shared set's 40,960 rows; 0.4 / 0.4 / 0.2 of a sample's rows (``wordnet_sample.split``)."""
    A, B = load(data, src), load(data, tgt)
    s, t, h = wordnet_sample.split(A.shape[0])
    f = lambda a: np.ascontiguousarray(a, dtype=np.float32)  # noqa: E731
    return f(A[s]), f(B[t]), f(A[h]), f(B[h])


def _maxrss_mb() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 1024.0 if sys.platform != "darwin" else r / 2**20


# --- one fit, in a fresh process ------------------------------------------------------------------

def _run_one(job: dict) -> dict:
    """Fit one method on one pair/seed and evaluate it (runs in a child process)."""
    import align
    from align.maps import LinearMap
    from align.minivec2vec import MiniVec2Vec
    from align.procrustes import fit_frames

    warnings.simplefilter("ignore")
    src, tgt, seed, method, data = job["src"], job["tgt"], job["seed"], job["method"], Path(job["data"])
    X, Y, Xh, Yh = split(data, src, tgt)
    src_train, tgt_train, _ = wordnet_sample.split(load(data, src).shape[0])
    base_rss = _maxrss_mb()
    t0 = time.perf_counter()
    criterion, extra = None, {}
    if method == "identity":
        fs, ft = fit_frames(X, Y)
        m = LinearMap(np.eye(X.shape[1], dtype=np.float32), None, fs, ft, {"method": "identity"})
    elif method == "supervised":
        A, B = load(data, src), load(data, tgt)
        m = align.fit_procrustes(np.asarray(A[src_train], np.float32), np.asarray(B[src_train], np.float32))
    elif method in ("published", "vecbridge", "semi"):
        preset = MiniVec2Vec.published if method == "published" else getattr(MiniVec2Vec, job.get("preset", "fast"))
        est = preset(random_state=seed, **job.get("params", {}))
        seed_pairs = None
        k = int(job.get("k", 0))
        if method == "semi" and k > 0:
            # CONTEXT convention: k target-training texts, embedded by the source encoder too
            rng = np.random.default_rng(10_000 + seed)
            j = np.sort(rng.choice(Y.shape[0], size=k, replace=False))
            extra_rows = np.asarray(load(data, src)[tgt_train][j], np.float32)
            seed_pairs = (X.shape[0] + np.arange(k), j)
            X = np.concatenate([X, extra_rows])
        est.fit(X, Y, seed_pairs=seed_pairs)
        m = est.map_
        criterion = est.criterion_
        extra = {"criteria": est.criteria_, "chosen_restart": est.best_restart_,
                 "criterion_details": est.criterion_details_, "timings": est.diagnostics_["timings"],
                 "null_criterion": getattr(est, "null_criterion_", None), "reliable": getattr(est, "reliable_", None)}
    else:
        raise ValueError(method)
    seconds = time.perf_counter() - t0
    peak = _maxrss_mb() - base_rss
    ev = align.evaluate(m, Xh, Yh)
    out = {"pair": f"{src}:{tgt}", "method": method, "seed": seed, "top1": ev["top1"], "mean_rank": ev["mean_rank"],
           "cos": ev["cos"], "csls_top1": ev["csls_top1"], "csls_mean_rank": ev["csls_mean_rank"],
           "n_candidates": ev["n_candidates"], "criterion": criterion, "seconds": seconds,
           "peak_rss_delta_mb": peak, **extra}
    if criterion is not None:
        # v1 (before commit 943aa23): mutual_frac * mutual_cos; v2: mutual_frac * mutual_csls
        out["criterion_def"] = "v2: mutual_frac * mutual_csls" if "mutual_csls" in extra["criterion_details"] \
            else "v1: mutual_frac * mutual_cos"
    if method == "semi":
        out["k"] = int(job.get("k", 0))
    return out


def run_isolated(job: dict) -> dict:
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(_run_one, (job,))


# --- peer results on disk -------------------------------------------------------------------------

def _peer_path(pair: str, seed: int) -> Path:
    src, tgt = pair.split(":")
    return RESULTS / f"published_{src}_to_{tgt}_seed{seed}.json"


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                              text=True, timeout=10).stdout.strip()
    except Exception:
        return "unknown"


def _env() -> dict:
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "host_cpus": os.cpu_count(), "python": platform.python_version(),
            "omp_threads": os.environ.get("OMP_NUM_THREADS"), "git": _git_commit(),
            "load_avg_at_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def store_peer(res: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    p = _peer_path(res["pair"], res["seed"])
    p.write_text(json.dumps({**res, "env": _env()}, indent=1, default=float))
    return p


def load_peer(pair: str) -> list[dict]:
    src, tgt = pair.split(":")
    return [json.loads(p.read_text()) for p in sorted(RESULTS.glob(f"published_{src}_to_{tgt}_seed*.json"))]


# --- table ----------------------------------------------------------------------------------------

COLS = (("top1", "top-1", "{:.3f}", max), ("mean_rank", "mean rank", "{:.1f}", min), ("cos", "cos", "{:.3f}", max),
        ("csls_top1", "CSLS top-1", "{:.3f}", max), ("criterion", "criterion", "{:.3f}", max),
        ("seconds", "fit s", "{:.1f}", min), ("peak_rss_delta_mb", "peak MB", "{:.0f}", min))


def _summ(rows: list[dict], key: str, fmt: str, best) -> str:
    vals = [r[key] for r in rows if r.get(key) is not None]
    if not vals:
        return "-"
    if len(vals) == 1:
        return fmt.format(vals[0])
    worst = min if best is max else max
    return f"{fmt.format(np.mean(vals))}±{fmt.format(np.std(vals))} (w {fmt.format(worst(vals))})"


def print_table(pair: str, groups: dict[str, list[dict]], note: str = "") -> None:
    n = next((r["n_candidates"] for rows in groups.values() for r in rows if r.get("n_candidates")), 8192)
    print(f"\n== {pair}  (candidates: {n} held-out pairs; mean±std (worst seed) over seeds) ==")
    if note:
        print(f"  {note}")
    head = ["method", "seeds"] + [c[1] for c in COLS]
    lines = [head]
    for name, rows in groups.items():
        if not rows:
            continue
        seeds = ",".join(str(r["seed"]) for r in rows)
        lines.append([name, seeds] + [_summ(rows, k, f, b) for k, _, f, b in COLS])
    widths = [max(len(str(l[i])) for l in lines) for i in range(len(head))]
    for l in lines:
        print("  ".join(str(c).ljust(w) for c, w in zip(l, widths)))
    for name, rows in groups.items():
        if name in ("vecbridge", "published") and rows and rows[0].get("criterion") is not None:
            print(f"  {name} per seed: " + "; ".join(
                f"seed {r['seed']}: top1 {r['top1']:.3f} crit {r['criterion']:.3f}"
                + (f" (random maps {r['null_criterion']:.3f}, reliable={r['reliable']})"
                   if r.get("null_criterion") is not None else "") for r in rows))


# --- main -----------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", nargs="+", default=list(DEFAULT_PAIRS), help="src:tgt names of files in the data dir")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    ap.add_argument("--peer", action="store_true", help="run the published procedure and store its results")
    ap.add_argument("--semi", action="store_true", help="semi-supervised sweep over seed-pair counts")
    ap.add_argument("--ks", nargs="+", type=int, default=list(SEMI_KS), help="seed-pair counts for --semi")
    ap.add_argument("--params", default="{}", help="JSON dict of MiniVec2Vec parameters for the vecbridge runs")
    ap.add_argument("--preset", default="fast", help="MiniVec2Vec classmethod giving the vecbridge configuration")
    ap.add_argument("--skip-baselines", action="store_true")
    ap.add_argument("--out", default=None, help="write all rows of this run to this JSON file")
    args = ap.parse_args(argv)

    try:
        data = wordnet_sample.wordnet_dir()
    except wordnet_sample.SampleUnavailable as e:
        print(f"SKIP: no WordNet embeddings: {e}")
        return 0
    sample, note = wordnet_sample.is_sample(data), wordnet_sample.note(data)
    if note:
        print(note)
    params = json.loads(args.params)
    all_rows = []
    for pair in args.pairs:
        src, tgt = pair.split(":")
        if not (data / f"{src}.npy").exists() or not (data / f"{tgt}.npy").exists():
            print(f"SKIP {pair}: " + ("no encoder for it here (a sample holds "
                                      f"{', '.join(wordnet_sample.SAMPLE_ENCODERS)})" if sample else "file missing"))
            continue
        if args.peer:
            for seed in args.seeds:
                res = run_isolated({"src": src, "tgt": tgt, "seed": seed, "method": "published", "data": str(data)})
                where = "not stored (a sample)" if sample else store_peer(res)
                print(f"peer {pair} seed {seed}: top1 {res['top1']:.4f} mean rank {res['mean_rank']:.1f} "
                      f"{res['seconds']:.0f}s -> {where}", flush=True)
                all_rows.append(res)
            continue
        if args.semi:
            rows = []
            for k in args.ks:
                for seed in args.seeds:
                    r = run_isolated({"src": src, "tgt": tgt, "seed": seed, "method": "semi", "k": k, "params": params,
                                      "preset": args.preset, "data": str(data)})
                    rows.append(r)
                    print(f"semi {pair} k={k} seed {seed}: top1 {r['top1']:.3f} csls {r['csls_top1']:.3f} "
                          f"crit {r['criterion']:.3f} {r['seconds']:.1f}s", flush=True)
            all_rows += rows
            print_table(pair + " semi-supervised", {f"k={k}": [r for r in rows if r["k"] == k] for k in args.ks}, note)
            continue
        groups: dict[str, list[dict]] = {}
        if not args.skip_baselines:
            d_s, d_t = load(data, src).shape[1], load(data, tgt).shape[1]
            job = {"src": src, "tgt": tgt, "seed": 0, "data": str(data)}
            if d_s == d_t:
                groups["identity"] = [run_isolated({**job, "method": "identity"})]
            groups["supervised"] = [run_isolated({**job, "method": "supervised"})]
        peer = [] if sample else load_peer(pair)  # stored results are for the shared set
        groups["published"] = [r for r in peer if r["seed"] in args.seeds] or peer
        groups["vecbridge"] = []
        for seed in args.seeds:
            r = run_isolated({"src": src, "tgt": tgt, "seed": seed, "method": "vecbridge", "params": params,
                              "preset": args.preset, "data": str(data)})
            groups["vecbridge"].append(r)
            print(f"vecbridge {pair} seed {seed}: top1 {r['top1']:.3f} crit {r['criterion']:.3f} "
                  f"{r['seconds']:.1f}s", flush=True)
        for rows in groups.values():
            all_rows += rows
        print_table(pair, groups, note)
        if not groups["published"]:
            print("  (published: " + ("stored results are for the shared set, not shown on a sample)" if sample
                                      else "no stored results; run with --peer)"))
    print("\nlargest blocks: knn via FAISS IndexFlatIP (exact) over all training rows, queries in blocks of 16,384;"
          " relative representations (n, 600) float32 = 39 MB at n=16,384; no n x n matrix.")
    if args.out:
        Path(args.out).write_text(json.dumps({"env": _env(), "rows": all_rows}, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
