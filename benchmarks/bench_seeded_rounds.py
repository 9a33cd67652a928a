"""Seeded mode (issue 16): where does the Sinkhorn finish lead, round by round, and from which start?

Same split and seeds as ``bench_align.py --semi`` (source training rows [0, 16384) of minilm plus the k seed
texts, target training rows [16384, 32768) of e5, held-out pairs [32768, 40960)). Two starts:

- ``seeded``: ``MiniVec2Vec.fast(random_state=seed, seeded_finish=False)`` fitted on the k seeds + unpaired rows
  (the map the default finish starts from);
- ``supervised``: orthogonal Procrustes on the 16,384 true pairs [0, 16384), in the same frames (the ceiling).

From each, ``align.semisup.sinkhorn_polish`` runs one round at a time (``tol=0``) with each configuration given;
after the rounds listed the held-out top-1 / CSLS top-1 and the round's own score (``mean_score``, what the
refinement raises) are printed. Output: one markdown table on stdout.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_seeded_rounds.py --seed 0 --k 100 \\
        --configs '[{"eps": 0.1}, {"eps": 0.05}, {"eps": 0.1, "seed_share": 0.2}]' --rounds 10

Without the shared set (``../shared/data/wordnet``) it runs on the WordNet sample (``wordnet_sample.py``), the
split scaled to its rows as ``bench_align.py`` scales it; its figures are not comparable with the shared set's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_align
import wordnet_sample

import align
from align.frames import Frame
from align.maps import LinearMap
from align.minivec2vec import MiniVec2Vec
from align.semisup import sinkhorn_polish

SHOWN = (1, 2, 3, 6, 10, 15, 20, 30)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--configs", default='[{"eps": 0.1}]', help="JSON list of sinkhorn_polish options")
    ap.add_argument("--starts", nargs="+", default=["seeded", "supervised"])
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    warnings.simplefilter("ignore")
    try:
        data = wordnet_sample.wordnet_dir()
    except wordnet_sample.SampleUnavailable as e:
        print(f"SKIP: no WordNet embeddings: {e}")
        return
    if wordnet_sample.note(data):
        print(wordnet_sample.note(data) + "\n")
    X, Y, Xh, Yh = bench_align.split(data, "minilm", "e5")
    A, B = bench_align.load(data, "minilm"), bench_align.load(data, "e5")
    src_train, tgt_train, _ = wordnet_sample.split(A.shape[0])
    rng = np.random.default_rng(10_000 + args.seed)  # bench_align's seed texts
    if not 2 <= args.k <= Y.shape[0]:
        ap.error(f"--k must be in [2, {Y.shape[0]}] (the target training rows)")
    j = np.sort(rng.choice(Y.shape[0], size=args.k, replace=False))
    seed_pairs = (X.shape[0] + np.arange(args.k), j)
    X = np.concatenate([X, np.asarray(A[tgt_train][j], np.float32)])
    fs, ft = Frame.fit(X), Frame.fit(Y)
    Xs, Yt = fs.apply(X), ft.apply(Y)
    seeds = (Xs[seed_pairs[0]], Yt[seed_pairs[1]])

    def held_out(W) -> tuple[float, float]:
        e = align.evaluate(LinearMap(np.asarray(W, np.float32), None, fs, ft, {}), Xh, Yh)
        return e["top1"], e["csls_top1"]

    starts = {}
    if "seeded" in args.starts:
        t0 = time.perf_counter()
        est = MiniVec2Vec.fast(random_state=args.seed, seeded_finish=False).fit(X, Y, seed_pairs=seed_pairs)
        starts["seeded"] = (est.map_.W, time.perf_counter() - t0)
    if "supervised" in args.starts:
        Yp = ft.apply(np.asarray(B[src_train], np.float32))
        U, _, Vt = np.linalg.svd(Xs[: Yp.shape[0]].astype(np.float64).T @ Yp.astype(np.float64))
        starts["supervised"] = (U @ Vt, 0.0)
    shown = [r for r in SHOWN if r <= args.rounds] + ([args.rounds] if args.rounds not in SHOWN else [])
    print(f"minilm -> e5, k = {args.k} seeds, seed {args.seed}; cells: held-out top-1 / CSLS top-1 (round score)\n")
    print("| start | options | round 0 | " + " | ".join(f"round {r}" for r in shown) + " |")
    print("|---|---|---|" + "---|" * len(shown))
    for start, (W0, fit_s) in starts.items():
        for cfg in json.loads(args.configs):
            opts = {"seed_share": args.k / (Xs.shape[0] + args.k), **cfg}
            W, cells = np.asarray(W0, np.float64), []
            t0 = time.perf_counter()
            for r in range(1, args.rounds + 1):
                W, hist = sinkhorn_polish(W, Xs, Yt, rounds=1, seed_pairs=seeds, tol=0.0, **opts)
                if r in shown:
                    t1, c1 = held_out(W)
                    cells.append(f"{t1:.3f} / {c1:.3f} ({hist[0]['mean_score']:.4f})")
            t1, c1 = held_out(W0)
            print(f"| {start} | {json.dumps(cfg)} | {t1:.3f} / {c1:.3f} | " + " | ".join(cells) + " |", flush=True)
            print(f"<!-- {start}: fit {fit_s:.0f} s, rounds {time.perf_counter() - t0:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
