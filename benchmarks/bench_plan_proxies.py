"""Can a paired probe predict labelled retention? Probe statistics of one map beside its measured retention.

``align.plan_migration`` predicts the corpus-side retention of R@10 (migrated / native-new, as
``bench_migration.py`` measures it on labelled queries) from the old corpus and a small paired
probe only: it has no queries. This script asks whether ANY probe statistic can do that within
±0.05 across data sets, without extrapolation: for each pair and K, one map is fitted on K random
fit-pool pairs, its labelled retention is measured on the set's queries, and the statistics below
are computed for the SAME map on a probe of 250 other fit-pool pairs (``p`` rows) with up to
8,192 mapped corpus rows as distractors:

- ``nn_new``: ``align.retrieval.nn_retention`` (what the plan scores): query ``t_i`` (new-model
  probe row), relevant = its nearest new-model probe row; mapped index = mapped probe + mapped
  distractors, native index = native probe + the same mapped distractors;
- ``nn_old``: the same with relevance taken from the old model's nearest neighbour;
- ``id@10`` / ``id@1`` / ``id MRR``: query ``t_i``, relevant = the mapped row of the same text among
  mapped probe rows and distractors (native recall is 1 by construction);
- ``cos``: mean cosine of a mapped probe row with its native row.

A usable predictor would be one monotone function of a statistic that matches ``measured`` on every
set. A WordNet set built from ``wordnet_sample.py``'s sample (no shared set) is said so under the table. Usage::

    python benchmarks/bench_plan_proxies.py                     # the pairs whose embeddings are cached
    python benchmarks/bench_plan_proxies.py --pairs bible:minilm:e5 --ks 100 300
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_v, "2")

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import align  # noqa: E402
from align.knn import knn  # noqa: E402
from align.retrieval import nn_retention  # noqa: E402
from bench_migration import fit_ridge_cv, pair_data, ranks_from_topk, search, set_note, unit  # noqa: E402
from build_retrieval_sets import DEFAULT_CACHE  # noqa: E402

PAIRS = ("wordnet:minilm:e5", "bible:minilm:e5", "wordnet:minilm:mpnet", "wordnet-small:minilm:mpnet",
         "wordnet-small:minilm:e5")
STATS = ("nn_new", "nn_old", "id@10", "id@1", "id MRR", "cos")


def recall10(Q: np.ndarray, D: np.ndarray, relevant: np.ndarray) -> float:
    return float(np.mean(ranks_from_topk(search(Q, D, 10), relevant) <= 10))


def probe_stats(A: np.ndarray, B: np.ndarray, fitted, E: np.ndarray, k: int = 10) -> dict:
    """The statistics of the module docstring for probe ``(A, B)`` (p rows each) and distractors ``E`` (old rows)."""
    M, T = unit(fitted.apply(A, output="raw")), unit(B)
    Em = unit(fitted.apply(E, output="raw"))
    n = T.shape[0]
    own = np.arange(n)
    _, Io = knn(unit(A), unit(A), 2)
    nn_old = np.where(Io[:, 0] == own, Io[:, 1], Io[:, 0])
    MC, TC = np.concatenate([M, Em]), np.concatenate([T, Em])

    def hits(C: np.ndarray, rel: np.ndarray) -> int:
        _, I = knn(T, C, k + 1)
        return int(sum(rel[i] in I[i][I[i] != i][:k] for i in range(n)))

    true = np.einsum("ij,ij->i", T, M)
    beaten = np.zeros(n, dtype=np.int64)  # mapped rows scoring above the row's own mapped text
    for s in range(0, MC.shape[0], 4096):
        beaten += (T @ MC[s : s + 4096].T > true[:, None]).sum(axis=1)
    return {"nn_new": nn_retention(T, M, k, extra_M=Em), "nn_old": hits(MC, nn_old) / max(1, hits(TC, nn_old)),
            "id@10": float(np.mean(beaten < k)), "id@1": float(np.mean(beaten == 0)),
            "id MRR": float(np.mean(1.0 / (1.0 + beaten))), "cos": float(true.mean())}


def run(pairs, ks, probe: int, seed: int, cache: Path) -> list[dict]:
    rows = []
    for pair in pairs:
        set_name, old, new = pair.split(":")
        d = pair_data(set_name, old, new, cache)
        if d is None:
            print(f"{pair}: embeddings not cached, skipped", file=sys.stderr)
            continue
        rng = np.random.default_rng(seed)
        pool = rng.permutation(d["pool"])
        n_probe = min(probe, len(pool) // 3)
        held, fit_pool = pool[:n_probe], pool[n_probe:]
        E = np.sort(rng.permutation(np.setdiff1d(np.arange(d["n_docs"]), held))[:8192])
        native = recall10(d["Q_new"], d["D_new"], d["relevant"])
        for K in ks:
            if K > len(fit_pool):
                continue
            tr = np.sort(rng.permutation(fit_pool)[:K])
            for method in ("procrustes", "ridge"):
                X, Y = d["D_old"][tr], d["D_new"][tr]
                fitted = align.fit_procrustes(X, Y) if method == "procrustes" else fit_ridge_cv(X, Y, seed)
                measured = recall10(d["Q_new"], unit(fitted.apply(d["D_old"], output="raw")), d["relevant"]) / native
                row = {"pair": pair, "n_docs": d["n_docs"], "K": K, "method": method, "measured": measured,
                       **probe_stats(d["D_old"][held], d["D_new"][held], fitted, d["D_old"][E])}
                rows.append(row)
                print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                      flush=True)
    return rows


def markdown(rows: list[dict], argv: list[str], note: str = "") -> str:
    out = [f"# Probe statistics vs labelled retention ({_dt.date.today().isoformat()})", "",
           f"`python benchmarks/bench_plan_proxies.py {' '.join(argv)}` — definitions in the script docstring.", "",
           *([note, ""] if note else []),
           "| pair | docs | K | method | measured | " + " | ".join(STATS) + " |",
           "|---|---|---|---|---|" + "---|" * len(STATS)]
    for r in rows:
        out.append(f"| {r['pair']} | {r['n_docs']} | {r['K']} | {r['method']} | {r['measured']:.3f} | "
                   + " | ".join(f"{r[s]:.3f}" for s in STATS) + " |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", nargs="+", default=list(PAIRS))
    ap.add_argument("--ks", nargs="+", type=int, default=[100, 300, 1000, 3000, 10000])
    ap.add_argument("--probe", type=int, default=250)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--out", default=None, help="result stem under benchmarks/results (default: print only)")
    a = ap.parse_args(argv)
    rows = run(a.pairs, a.ks, a.probe, a.seed, a.cache)
    note = "; ".join(sorted({set_note(r["pair"].split(":")[0], a.cache) for r in rows} - {""}))
    md = markdown(rows, argv, note)
    print(md)
    if a.out:
        (HERE / "results" / f"{a.out}.md").write_text(md)
        (HERE / "results" / f"{a.out}.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
