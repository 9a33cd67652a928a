"""The plan without queries by probe size (issue 16): 250 / 500 / 1,000 probe pairs against the corpus-wide figure.

WordNet shared set (``shared/data/wordnet``): the old corpus is rows ``0:-4000`` of the old model's file (the
plan's ``--old-rows 0:-4000``), each probe ``p`` random rows of the last 4,000 (seeded), ``align.plan_migration``
with ``random_state`` = the seed. The corpus-wide figure is the plan's statistic where every row's new-model vector
is known: maps (``fit_migration``, ridge and procrustes) of K random rows of ``0:-4000``, two draws, the whole
40,960-row corpus mapped; each new-model row of 2,000 random rows of the last 4,000 a query whose relevant document
is its nearest other new-model row of the whole corpus, kept when it is in the top 10 of the mapped corpus (native
recall 1 by construction). ``--tree DIR``: the plans of another checkout's ``align`` (a subprocess), beside this one.

    OMP_NUM_THREADS=1 python benchmarks/bench_plan_probe_size.py --pair glove minilm [--tree OLD] [--out stem]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WORDNET = Path(os.environ.get("VECBRIDGE_WORDNET_DIR", ROOT.parent / "shared" / "data" / "wordnet"))
KS, PROBES = (100, 300, 1000, 3000, 10000), (250, 500, 1000)


def plans(old: str, new: str, seeds) -> list[dict]:
    import align

    S, T = np.load(WORDNET / f"{old}.npy"), np.load(WORDNET / f"{new}.npy")
    n, out = S.shape[0], []
    for seed in seeds:
        for p in PROBES:
            rows = np.sort(np.random.default_rng(seed).choice(np.arange(n - 4000, n), p, replace=False))
            pl = align.plan_migration(S[:-4000], S[rows], T[rows], random_state=seed, select_rows=False, target_ks=KS)
            out.append({"seed": seed, "p": p, "predicted": pl["predicted"]})
    return out


def corpus_wide(old: str, new: str) -> dict:
    import align
    from align.frames import unit_rows
    from align.knn import knn

    S, T = np.load(WORDNET / f"{old}.npy"), np.load(WORDNET / f"{new}.npy")
    n, Tu = S.shape[0], unit_rows(T)
    q = np.sort(np.random.default_rng(0).choice(np.arange(n - 4000, n), 2000, replace=False))
    _, I = knn(Tu[q], Tu, 2)
    rel = np.where(I[:, 0] == q, I[:, 1], I[:, 0])
    out = {}
    for k in KS:
        for m in ("ridge", "procrustes"):
            kept = []
            for draw in (0, 1):
                rows = np.sort(np.random.default_rng(100 + draw).choice(n - 4000, k, replace=False))
                M = unit_rows(align.fit_migration(S[rows], T[rows], method=m, random_state=draw).apply(S, output="raw"))
                top = knn(Tu[q], M, 11)[1]
                kept.append(np.mean([rel[i] in [j for j in top[i] if j != q[i]][:10] for i in range(q.size)]))
            out[f"{m}|{k}"] = float(np.mean(kept))
    return out


def table(res: dict) -> str:
    trees = list(res["plans"])
    head = ["K"] + [f"{t}: {p} pairs" for t in trees for p in PROBES] + ["corpus-wide (1,000-pair method)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in KS:
        cells = []
        for t in trees:
            for p in PROBES:
                qs = [next(q for q in r["predicted"] if q["k"] == k) for r in res["plans"][t] if r["p"] == p]
                cells.append("<br>".join(f"{q['retention']:.2f} [{q['low']:.2f}, {q['high']:.2f}]" for q in qs))
        ref = next(q for q in res["plans"][trees[0]] if q["p"] == 1000)["predicted"]
        m = next(q["method"] for q in ref if q["k"] == k)
        lines.append(f"| {k:,} | " + " | ".join(cells) + f" | {res['truth'][f'{m}|{k}']:.3f} ({m}) |")
    for t in trees:
        for p in PROBES[:-1]:
            hold = truth = cells = 0
            for r in (r for r in res["plans"][t] if r["p"] == p):
                big = next(b for b in res["plans"][t] if b["p"] == 1000 and b["seed"] == r["seed"])
                for q, b in zip(r["predicted"], big["predicted"]):
                    cells += 1
                    hold += q["low"] <= b["retention"] <= q["high"]
                    truth += q["low"] <= res["truth"][f"{b['method']}|{q['k']}"] <= q["high"]
            lines.append(f"\n- {t}, {p} pairs: the interval holds the 1,000-pair forecast in {hold}/{cells} cells, "
                         f"the corpus-wide figure in {truth}/{cells}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", nargs=2, default=["glove", "minilm"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--tree", type=Path, help="another checkout whose plans go beside this one's (as old)")
    ap.add_argument("--out")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(plans(*a.pair, a.seeds)))
        return 0
    res = {"pair": a.pair, "plans": {}}
    trees = {**({"old": a.tree} if a.tree else {}), "new": ROOT}
    for label, tree in trees.items():
        cmd = [sys.executable, __file__, "--child", "--pair", *a.pair, "--seeds", *map(str, a.seeds)]
        out = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree, capture_output=True,
                             text=True, check=True).stdout
        res["plans"][label] = json.loads(out.strip().splitlines()[-1])
    sys.path.insert(0, str(ROOT))
    res["truth"] = corpus_wide(*a.pair)
    text = table(res)
    print(text)
    if a.out:
        (ROOT / "benchmarks" / "results" / f"{a.out}.json").write_text(json.dumps(res, indent=1))
        (ROOT / "benchmarks" / "results" / f"{a.out}.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
