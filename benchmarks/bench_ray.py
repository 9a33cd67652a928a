"""Ray vs one process on >= 1M rows: the kernels of the unsupervised fit, and a streamed transform.

Data: the 40,960 shared WordNet minilm / e5 rows (``../shared/data/wordnet``) **repeated** 25x
to 1,024,000 rows and **perturbed** (seeded Gaussian noise, sigma 0.01, rows renormalised) — not
1M distinct texts; said in the output. Each workload runs in-process and on Ray: a local Ray
instance with N CPUs started by this script (``service.distributed.ray_session``, watched and shut
down after), or with ``--address`` a cluster you started (``ray start --head --num-cpus N``; it is
left running — this script never stops Ray processes it did not start). Every Ray result is
compared bit for bit with the in-process one (align's kernels, Ray only supplies execution):

1. kNN round (the kernel of MiniVec2Vec's ICP / self-learning / pseudo-target rounds): top-10 of
   all mapped source rows among 4,096 target rows, ``align.knn`` in fixed row blocks,
   serial executor vs ``service.distributed.ray_executor``; also in-process held to one thread (BLAS
   and FAISS's OpenMP, as one Ray worker runs), the per-process baseline for "2 workers vs 1".
   (``align.knn`` already runs FAISS at one OpenMP thread for bit-stable scores, so both in-process
   rows are one-thread runs: their difference is run-to-run noise.)
2. k-means over 4 row shards (``align.kmeans.kmeans``; ``kmeans_local`` vs ``kmeans_ray``), k=64,
   5 Lloyd iterations from a seeded start.
3. ICP-average refinement (``align.refine.refine_icp`` vs ``refine_icp_ray``), 1,000 sampled
   rows per iteration against the 40,960 real e5 rows: one kNN block per iteration, so Ray adds
   only overhead here — measured to say how much.
4. ``vecbridge transform`` of the ``.npy`` file of all rows, in-process vs ``--ray [ADDRESS]`` (without
   ``--address`` the command starts its own local Ray: its start-up is in the time). The outputs
   agree to float32 rounding, bit for bit only when both sides run OpenBLAS with the same number
   of threads (a Ray worker runs one; run with ``OMP_NUM_THREADS=1`` to compare bits): OpenBLAS's
   GEMM rounds differently with its thread count.
5. A whole unsupervised fit, end to end: ``MiniVec2Vec.fast`` (the CLI's default preset) from the
   1M MiniLM rows to 1M paraphrase-MiniLM-L3 rows (the pair where unsupervised alignment works;
   target rows shuffled, so no row order is shared), in-process vs ``fit(executor=ray_executor)``;
   the two maps compared bit for bit and scored by top-1 on 4,096 real pairs (the fit saw
   no pairs; their perturbed copies were among its unpaired rows). The fit
   works on ``fit_sample`` (50,000) rows per side after fitting the frames and drawing the
   held-out rows from all rows, so its all-row rounds cost the same as at 50k.

Reports wall time, rows/s and the peak RSS of the driver process (workers hold one block each).

Without the shared set: a sample of 4,096 definitions embedded here (``wordnet_sample.py``), repeated 25x by
default (102,400 rows), said in the output; workload 5 is skipped (no paraphrase-MiniLM-L3 encoder here).

    python benchmarks/bench_ray.py [--rows 1024000] [--workers 2] [--address HOST:PORT] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
import wordnet_sample

RESULTS = ROOT / "benchmarks" / "results"


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def big(folder: Path, name: str, rows: int, seed: int) -> np.ndarray:
    base = wordnet_sample.load(folder, name)
    rng = np.random.default_rng(seed)
    out = np.empty((rows, base.shape[1]), np.float32)
    for s in range(0, rows, 65536):
        n = min(65536, rows - s)
        blk = base[(np.arange(s, s + n)) % base.shape[0]] + rng.normal(scale=0.01, size=(n, base.shape[1]))
        out[s : s + n] = blk / np.linalg.norm(blk, axis=1, keepdims=True)
    return out


WORKLOADS = ("knn", "kernels", "transform", "fit")


def fit_rows(args, ray, rows: list, report: dict, folder: Path) -> None:
    """Workload 5: the whole unsupervised fit on ``args.rows`` rows per side, in-process vs Ray."""
    import align
    from service.distributed import ray_executor

    X = big(folder, "minilm", args.rows, 0)
    Y = big(folder, "paraphrase_l3", args.rows, 2)[np.random.default_rng(3).permutation(args.rows)]
    res = {}
    for label, ex in (("in-process", None), (f"Ray {args.workers} workers", ray_executor(ray))):
        t0 = time.perf_counter()
        est = align.MiniVec2Vec.fast(random_state=0).fit(X, Y, executor=ex)
        res[label] = (time.perf_counter() - t0, est)
    (tl, a), (tr, b) = res.values()
    same = bool(np.array_equal(a.map_.W, b.map_.W))
    n = wordnet_sample.rows_of(folder)
    held = np.arange(n - n // 10, n)  # real rows, not perturbed copies: the last 4,096 of 40,960
    top1 = align.evaluate(a.map_, wordnet_sample.load(folder, "minilm")[held],
                          wordnet_sample.load(folder, "paraphrase_l3")[held], csls=False)["top1"]
    label = f"MiniVec2Vec.fast fit, {args.rows:,} x {args.rows:,} rows"
    rows += [[f"{label}, in-process", f"{tl:.1f}", f"{args.rows / tl:,.0f}", f"{rss_mb():,.0f}",
              f"top-1 {top1:.3f}, reliable {a.reliable_}"],
             [f"{label}, Ray {args.workers} workers", f"{tr:.1f}", f"{args.rows / tr:,.0f}", f"{rss_mb():,.0f}",
              f"{tl / tr:.2f}x, identical: {same}"]]
    report["fit"] = {"local_s": tl, "ray_s": tr, "speedup": tl / tr, "identical": same, "top1_real_held_out": top1,
                     "reliable": a.reliable_, "fit_rows": a.diagnostics_["fit_rows"],
                     "timings_local": a.diagnostics_["timings"], "timings_ray": b.diagnostics_["timings"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=None, help="default: the WordNet rows x25 (1,024,000)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--db", type=int, default=4096)
    ap.add_argument("--icp-iters", type=int, default=10)
    ap.add_argument("--address", help="a running Ray cluster (default: a local Ray with --workers CPUs)")
    ap.add_argument("--only", nargs="+", choices=WORKLOADS, default=list(WORKLOADS),
                    help="run these workloads only (default: all)")
    ap.add_argument("--out", help="JSON report path (default benchmarks/results/bench_ray_DATE.json)")
    args = ap.parse_args(argv)
    try:
        folder = wordnet_sample.wordnet_dir()
    except wordnet_sample.SampleUnavailable as e:
        print(f"no WordNet data ({e}); nothing to benchmark")
        return 0
    total, note = wordnet_sample.rows_of(folder), wordnet_sample.note(folder)
    args.rows = args.rows or 25 * total
    no_fit = not (folder / "paraphrase_l3.npy").is_file()
    if "fit" in args.only and no_fit:
        print("fit workload skipped: " + ("no paraphrase-MiniLM-L3 encoder here (a sample holds minilm, e5)"
                                          if wordnet_sample.is_sample(folder) else f"no paraphrase_l3.npy in {folder}"))
        args.only = [w for w in args.only if w != "fit"]
    if not args.only:
        return 0
    import align
    from service.distributed import ray_executor

    fit_data = "" if no_fit else " (fit: minilm/paraphrase_l3)"
    report = {"env": {"cpus": os.cpu_count(), "load_avg": os.getloadavg()[0], "date": time.strftime("%Y-%m-%d %H:%M"),
                      "rows": args.rows, "workers": args.workers,
                      "data": f"WordNet minilm/e5{fit_data} rows repeated to {args.rows:,} and "
                              "perturbed (sigma 0.01)" + (f"; {note}" if note else ""), "workloads": list(args.only)}}
    print(f"# Ray vs one process  {report['env']}")
    X = big(folder, "minilm", args.rows, 0)
    Y = big(folder, "e5", args.db, 1)
    m = align.fit_procrustes(wordnet_sample.load(folder, "minilm")[:4000], wordnet_sample.load(folder, "e5")[:4000])
    Q = m.apply(X, output="raw") if "knn" in args.only else None
    rows = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    os.environ["PYTHONPATH"] = str(ROOT)  # a local Ray's workers import this tree
    from service.distributed import ray_session

    with ray_session(args.address, num_cpus=args.workers) as ray:

        if "knn" in args.only:
            # 1. kNN round
            t0 = time.perf_counter()
            S0, I0 = align.knn(Q, Y, 10)
            t_local = time.perf_counter() - t0
            rss_local = rss_mb()
            # the same in one process held to one thread (BLAS and FAISS's OpenMP), as one Ray worker runs
            from service.threads import limit_native_threads, pin_thread, release_native_threads

            limit_native_threads(1)
            pin_thread()
            try:
                t0 = time.perf_counter()
                align.knn(Q, Y, 10)
                t_one = time.perf_counter() - t0
            finally:
                release_native_threads(1)
            ex = ray_executor(ray)
            align.knn(Q[:20000], Y, 10, executor=ex)  # warm the workers
            t0 = time.perf_counter()
            S1, I1 = align.knn(Q, Y, 10, executor=ex)
            t_ray = time.perf_counter() - t0
            same = bool(np.array_equal(I0, I1) and np.array_equal(S0, S1))
            rows += [["kNN round, in-process", f"{t_local:.1f}", f"{args.rows / t_local:,.0f}", f"{rss_local:,.0f}", ""],
                     ["kNN round, in-process at 1 thread", f"{t_one:.1f}", f"{args.rows / t_one:,.0f}", "", ""],
                     [f"kNN round, Ray {args.workers} workers", f"{t_ray:.1f}", f"{args.rows / t_ray:,.0f}",
                      f"{rss_mb():,.0f}", f"{t_local / t_ray:.2f}x, identical: {same}"]]
            report["knn"] = {"local_s": t_local, "local_one_thread_s": t_one, "ray_s": t_ray, "speedup": t_local / t_ray,
                             "speedup_vs_one_thread": t_one / t_ray, "identical": same}
            rows[-1][-1] += f"; {t_one / t_ray:.2f}x vs 1 thread"
            del S0, I0, S1, I1, Q
        if "kernels" in args.only:
            # 2. k-means over row shards; 3. ICP refinement
            from align.refine import refine_icp
            from service import distributed as D

            shards = [X[a : a + -(-args.rows // 4)] for a in range(0, args.rows, -(-args.rows // 4))]
            Xs = m.source_frame.apply(X[: min(args.rows, 200_000)])
            Yt = m.target_frame.apply(wordnet_sample.load(folder, "e5"))
            W0 = np.asarray(m.W, dtype=np.float64)
            kernels = [("k-means k=64, 5 iterations, 4 shards", args.rows,
                        lambda: D.kmeans_local(shards, 64, n_iter=5, random_state=0),
                        lambda: D.kmeans_ray(shards, 64, n_iter=5, random_state=0)),
                       (f"ICP refinement, {args.icp_iters} x 1,000 rows vs {total:,}", args.icp_iters * 1000,
                        lambda: refine_icp(W0, Xs, Yt, iters=args.icp_iters, sample=1000, k=50, random_state=0),
                        lambda: D.refine_icp_ray(W0, Xs, [Yt], iters=args.icp_iters, sample=1000, k=50, random_state=0))]
            for label, n, local, remote in kernels:
                t0 = time.perf_counter()
                a = local()
                tl = time.perf_counter() - t0
                t0 = time.perf_counter()
                b = remote()
                tr = time.perf_counter() - t0
                same = bool(np.array_equal(a[0], b[0]) and np.array_equal(np.asarray(a[1]), np.asarray(b[1])))
                rows += [[f"{label}, in-process", f"{tl:.1f}", f"{n / tl:,.0f}", f"{rss_mb():,.0f}", ""],
                         [f"{label}, Ray {args.workers} workers", f"{tr:.1f}", f"{n / tr:,.0f}", f"{rss_mb():,.0f}",
                          f"{tl / tr:.2f}x, identical: {same}"]]
                report[label] = {"local_s": tl, "ray_s": tr, "speedup": tl / tr, "identical": same}
        if "fit" in args.only:  # 5. the whole unsupervised fit
            fit_rows(args, ray, rows, report, folder)
    if "transform" in args.only:
        # 4. transform of a file, each command in its own process
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            np.save(tmp / "x.npy", X)
            from service.registry import open_registry

            reg = open_registry(f"sqlite:///{tmp / 'var' / 'registry.sqlite'}", tmp / "var" / "artifacts")
            reg.register_space("minilm", 384)
            reg.register_space("e5", 384)
            reg.register_version("m", m, source_space="minilm", target_space="e5", method="procrustes", params={})
            reg.close()
            base = [sys.executable, "-c", "import sys; from service.cli import main; sys.exit(main())",
                    "--data-dir", str(tmp / "var"), "transform", "--map", "m", str(tmp / "x.npy")]
            res = {}
            ray_opt = ["--ray", args.address] if args.address else ["--ray"]
            for label, extra, out in (("in-process", [], "a.npy"), (f"Ray {args.workers} workers", ray_opt, "b.npy")):
                t0 = time.perf_counter()
                p = subprocess.run(["/usr/bin/time", "-f", "%M", *base, str(tmp / out), "--output", "raw", "--quiet",
                                    "--chunk-rows", "65536", *extra], capture_output=True, text=True, env=env)
                dt = time.perf_counter() - t0
                if p.returncode != 0:
                    print(p.stderr[-3000:])
                    return 1
                peak = float(p.stderr.strip().splitlines()[-1]) / 1024
                res[label] = (dt, peak)
            a_out, b_out = np.load(tmp / "a.npy"), np.load(tmp / "b.npy")
            same_t = bool(np.array_equal(a_out, b_out))
            diff_t = float(np.abs(a_out - b_out).max())  # GEMM bits follow OpenBLAS's thread count (see below)
            del a_out, b_out
            (tl, pl), (tr, pr) = res.values()
            rows += [["vecbridge transform, in-process", f"{tl:.1f}", f"{args.rows / tl:,.0f}", f"{pl:,.0f}", ""],
                     [f"vecbridge transform --ray, {args.workers} workers", f"{tr:.1f}", f"{args.rows / tr:,.0f}",
                      f"{pr:,.0f}", f"{tl / tr:.2f}x, identical: {same_t}" + ("" if same_t else f" (max |diff| {diff_t:.1e})")]]
            report["transform"] = {"local_s": tl, "ray_s": tr, "speedup": tl / tr, "identical": same_t,
                                   "max_abs_diff": diff_t,
                                   "peak_rss_mb": {"local": pl, "ray_driver": pr}}
    if note:
        print(note)
    hdr = ["workload", "wall s", "rows/s", "driver peak RSS MB", "speed-up vs in-process"]
    w = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(hdr)]
    print("  ".join(h.rjust(x) for h, x in zip(hdr, w)))
    for r in rows:
        print("  ".join(c.rjust(x) for c, x in zip(r, w)))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = Path(args.out) if args.out else RESULTS / f"bench_ray_{time.strftime('%Y-%m-%d')}.json"
    out.write_text(json.dumps(report, indent=2))
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
