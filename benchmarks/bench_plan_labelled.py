"""The labelled plan's forecast against the retention measured after the fit, over several plan seeds (issue 16).

For each encoder pair, ``align.plan_migration`` gets a seeded sample of the set's labelled queries (new- and
old-model vectors) and a 1,000-pair probe holding their relevant documents, exactly as
``bench_migration.py --plan-queries`` builds it (``bench_migration.plan_prediction``); each seed draws another
query sample and probe. Its forecast at K = 100 / 300 / 1,000 / 3,000 is compared with the corpus-side R@10
retention that ``bench_migration.py`` measured for the method that forecast names (one for every K in plans
before 2026-12-03; random rows, all of the set's queries), read from that run's JSON (``--measured``, default:
the committed ``migration_2026-12-01_plan_labelled*.json``). ``--queries N``: N labelled queries per plan instead
of 300 (WordNet) / 200 (Bible).

``--baseline-tree DIR`` runs the same plans with another checkout's ``align`` (a subprocess per tree), so an
estimator change is judged on the same cells. Sets come from ``build_retrieval_sets.py`` (``--cache``).

A set built from ``wordnet_sample.py``'s sample (no shared set) is compared only with a ``--measured`` run of the
same data (``bench_migration.py --plan-queries N`` on that cache records it in its pair's ``data``); against the
committed runs (the shared set) its pairs are skipped with a line that says so.

    OMP_NUM_THREADS=1 python benchmarks/bench_plan_labelled.py --seeds 0 1 2 [--baseline-tree ../old] [--out stem]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAIRS = {"wordnet:minilm:e5": 300, "wordnet:minilm:mpnet": 300, "bible:minilm:mpnet": 200, "bible:minilm:e5": 200}
MEASURED = ("migration_2026-12-01_plan_labelled.json", "migration_2026-12-01_plan_labelled_wordnet.json")
KS = (100, 300, 1000, 3000)


def predict(tree: Path, seeds: list[int], cache: Path, probe: int, queries: int = 0) -> dict:
    """``{"pair|seed": {"method", "predicted": {K: retention}, "methods": {K: method}}}`` with the ``align`` and
    ``bench_migration`` of checkout ``tree``; ``queries``: labelled queries per plan (0: each pair's count in ``PAIRS``)."""
    sys.path.insert(0, str(tree / "benchmarks"))
    import bench_migration as bm  # puts ``tree`` first on sys.path: its align

    assert Path(bm.align.__file__).resolve().is_relative_to(tree.resolve()), bm.align.__file__

    out = {}
    for pair, n_queries in PAIRS.items():
        data = bm.pair_data(*pair.split(":"), cache)
        if data is None:
            continue
        for seed in seeds:
            plan = bm.plan_prediction(data, probe, seed, queries or n_queries)
            out[f"{pair}|{seed}"] = {"method": plan["best_method"], "data": data["note"],
                                     "predicted": {str(p["k"]): p["retention"] for p in plan["predicted"]},
                                     # the method of each K's forecast (one for all before the plans chose per K)
                                     "methods": {str(p["k"]): p.get("method", plan["best_method"])
                                                 for p in plan["predicted"]}}
    return out


def measured(files: list[Path], data: dict | None = None) -> dict:
    """``{"pair|method|K": corpus-side R@10 retention, random rows}`` from bench_migration JSON files; ``data``
    (a dict) gets each pair's data note (``""``: the shared set, or a set that is not WordNet)."""
    out = {}
    for f in files:
        for pair, res in json.loads(f.read_text())["pairs"].items():
            if data is not None:
                data[pair] = res.get("data", "")
            for key, cell in res["cells"].items():
                rows, k, mode, method = key.split("|")
                if rows == "random" and mode == "corpus":
                    out[f"{pair}|{method}|{k}"] = cell["ret_R@10"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--probe", type=int, default=1000)
    ap.add_argument("--queries", type=int, default=0,
                    help="labelled queries per plan (default: 300 WordNet, 200 Bible; at most the set's)")
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("VECBRIDGE_BENCH_CACHE",
                                                                    Path.home() / ".cache" / "vecbridge-bench")))
    ap.add_argument("--measured", type=Path, nargs="+", default=[RESULTS / m for m in MEASURED])
    ap.add_argument("--baseline-tree", type=Path, help="another checkout: its align makes the same plans")
    ap.add_argument("--out", help="results stem under benchmarks/results (default: print only)")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(predict(a.child, a.seeds, a.cache, a.probe, a.queries)))
        return 0
    trees = {"this tree": ROOT, **({"baseline": a.baseline_tree.resolve()} if a.baseline_tree else {})}
    plans = {}
    for label, tree in trees.items():
        env = {**os.environ, "PYTHONPATH": str(tree)}
        cmd = [sys.executable, __file__, "--child", str(tree), "--probe", str(a.probe), "--cache", str(a.cache),
               "--queries", str(a.queries), "--seeds", *map(str, a.seeds)]
        out = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=True).stdout
        plans[label] = json.loads(out.strip().splitlines()[-1])
    measured_on: dict = {}
    truth = measured(a.measured, measured_on)
    notes = sorted({p["data"] for p in plans["this tree"].values() if p.get("data")})
    for pair in sorted({key.split("|")[0] for key in plans["this tree"]}):
        planned_on = next(p.get("data", "") for k, p in plans["this tree"].items() if k.startswith(f"{pair}|"))
        if pair in measured_on and measured_on[pair] != planned_on:
            print(f"{pair}: planned on {planned_on or 'the shared set'}, measured on "
                  f"{measured_on[pair] or 'the shared set'}: not compared (give --measured a bench_migration.py "
                  "run of the same data)")
            truth = {k: v for k, v in truth.items() if not k.startswith(f"{pair}|")}
    head = ["pair", "seed", "K"] + [x for t in trees for x in (f"{t}: measured (its method at K)",
                                                                  f"{t}: forecast (error)")]
    lines = [*[f"{n}" for n in notes], *([""] if notes else []), "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    errors: dict = {t: [] for t in trees}
    for key in plans["this tree"]:
        pair, seed = key.split("|")
        for k in KS:
            cells = []
            for t in trees:
                p = plans[t].get(key)
                method = p["methods"].get(str(k)) if p else None  # none past the corpus: the plan says "re-embed"
                m = truth.get(f"{pair}|{method}|{k}") if p else None
                if m is None or str(k) not in p["predicted"]:
                    cells = None
                    break
                err = p["predicted"][str(k)] - m
                errors[t].append(abs(err))
                cells.append((m, method, p["predicted"][str(k)], err))
            if cells:
                lines.append(f"| {pair} | {seed} | {k:,} | "
                             + " | ".join(f"{c[0]:.3f} ({c[1]}) | {c[2]:.3f} ({c[3]:+.3f})" for c in cells) + " |")
    lines.append("")
    for t, e in errors.items():
        if e:
            lines.append(f"- {t}: {len(e)} cells, within ±0.05 in {sum(x <= 0.05 for x in e)}, mean |error| "
                         f"{sum(e) / len(e):.3f}, largest {max(e):.3f}")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        (RESULTS / f"{a.out}.json").write_text(json.dumps({"plans": plans, "measured": truth}, indent=1))
        (RESULTS / f"{a.out}.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
