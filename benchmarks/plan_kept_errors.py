"""Where the plan's `kept` forecast misses the kept workflow (issue 16): noise, bias, probe draw.

Reads a ``bench_plan_extrapolation.py`` JSON (its plans, ``new`` and with ``--baseline-tree`` ``old``, and its
measured ``kept|method|K`` hits) and prints per tree:

- (a) the measurement's noise: the bootstrap standard error of each cell's measured retention over the plan's
  queries, and how many of the cells a forecast equal to the population's retention would hold within ±0.05 by that
  noise alone (with and without the finite-population correction of a sample of the set's queries);
- (b) the forecast's bias: mean signed error (forecast - measured) and sd over the seeds per probe and K, inside the
  probe and extrapolated;
- (c) the probe draw: the plan's estimate of the native new-model R@10 (``r10 / retention``) over the measured one
  of its queries, which scales every forecast of that plan.

``--cache DIR``: also the share of the queries' native hits whose document is among the k-means++ rows (the ``s``
the forecast adds as ``K / n``) and the mapped rest's retention, k-means++ rows against random ones.

    python benchmarks/plan_kept_errors.py benchmarks/results/plan_kept_fit_2026-12-06.json [--cache DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_plan_extrapolation as bpe


def hits(s: str) -> np.ndarray:
    return np.frombuffer(s.encode(), np.uint8) - 48


def report(result: dict, tree: str, n_boot: int = 2000) -> list[str]:
    meas, nat = result["measured"], hits(result["measured"]["native"])
    rng = np.random.default_rng(0)
    ses, cells, denom = [], {}, []
    for probe, by_seed in result["plans"][tree].items():
        for seed, p in by_seed.items():
            qi = np.array(p["queries"])
            q1 = next(q for q in p["predicted"] if q["retention"] > 0 and not q.get("whole_corpus"))
            denom.append(f"{probe}/{seed} {q1['r10'] / q1['retention'] / nat[qi].mean():.3f}")
            boot = rng.integers(0, qi.size, (n_boot, qi.size))
            for q in p["predicted"]:
                key = f"kept|{q['method']}|{q['k']}"
                if key not in meas or "kept" not in q:
                    continue
                h, n = hits(meas[key][0])[qi], nat[qi]
                m = h.mean() / n.mean()
                ses.append(float((h[boot].mean(1) / n[boot].mean(1)).std()))
                cells.setdefault((int(probe), q["k"], q["extrapolated"]), []).append(q["kept"]["retention"] - m)
    n_q, n_set = qi.size, nat.size
    fpc = math.sqrt(1 - n_q / n_set)
    allow = sum(math.erf(0.05 / (s * math.sqrt(2))) for s in ses)
    allow_fpc = sum(math.erf(0.05 / (s * fpc * math.sqrt(2))) for s in ses)
    noise = (f"(a) {n_q} queries per plan of the set's {n_set}: bootstrap SE of the measured retention "
             f"{np.mean(ses):.3f} ({min(ses):.3f}-{max(ses):.3f}; {np.mean(ses) * fpc:.3f} with the finite-population "
             f"correction); a forecast equal to the population's retention would be within ±0.05 in {allow:.1f} of "
             f"{len(ses)} cells ({allow_fpc:.1f} corrected)")
    out = [f"### {tree}", "", noise, "",
           "| probe | K | region | mean signed error | sd over seeds | within ±0.05 |", "|---|---|---|---|---|---|"]
    for (probe, k, ext), e in sorted(cells.items()):
        e = np.array(e)
        out.append(f"| {probe} | {k:,} | {'extrapolated' if ext else 'in the probe'} | {e.mean():+.3f} | "
                   f"{e.std(ddof=1):.3f} | {(np.abs(e) <= 0.05).sum()}/{e.size} |")
    for name, ext in (("in the probe", False), ("extrapolated", True)):
        e = np.concatenate([v for (_, _, x), v in cells.items() if x == ext])
        out.append(f"- (b) {name}: mean signed error {e.mean():+.3f}, sd {e.std(ddof=1):.3f}, "
                   f"within ±0.05 {(np.abs(e) <= 0.05).sum()}/{e.size}")
    out.append("- (c) native R@10 estimate / measured, per probe/seed: " + ", ".join(denom))
    return out + [""]


def shares(result: dict, cache: Path) -> list[str]:
    import align

    d = bpe.load(cache, "heldout")
    meas, nat, rel, n = result["measured"], hits(result["measured"]["native"]), d["rel"], d["Do"].shape[0]
    head = ("| K | K / n | share of native hits among the k-means++ rows | kept rows' retention | rest: k-means++ map | "
            "rest: random-row map |")
    out = [head, "|---|---|---|---|---|---|"]
    for k in bpe.KS:
        if f"kept|ridge|{k}" not in meas:
            continue
        inside = np.isin(rel, align.select_rows_to_embed(d["Do"], k, random_state=0))
        kept, rand = hits(meas[f"kept|ridge|{k}"][0]), hits(meas[f"ridge|{k}"][0])
        out.append(f"| {k:,} | {k / n:.3f} | {(inside & (nat == 1)).sum() / nat.sum():.3f} | "
                   f"{kept[inside].sum() / max(1, nat[inside].sum()):.2f} | "
                   f"{kept[~inside].mean() / nat[~inside].mean():.3f} | "
                   f"{rand[~inside].mean() / nat[~inside].mean():.3f} |")
    return out + [""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("result", type=Path)
    ap.add_argument("--cache", type=Path)
    a = ap.parse_args(argv)
    result = json.loads(a.result.read_text())
    lines = [line for tree in result["plans"] for line in report(result, tree)]
    if a.cache:
        lines += shares(result, a.cache)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
