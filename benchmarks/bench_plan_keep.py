"""The plan's recommended K with and without ``keep`` (issue 16), and whether the kept workflow reaches its target.

The plans of ``bench_plan_extrapolation.py`` (WordNet reverse dictionary minilm -> e5, the 8,192 held-out glosses
as the corpus, ``--queries`` labelled queries and a ``--probe``-pair probe per seed), made once per target retention
with ``keep=False`` (the recommendation reads each K's ``retention``) and once with ``keep=True`` (it reads
``kept``, the forecast for a migration that keeps its re-embedded rows' own new-model vectors). The measured side is
the ``kept|method|K`` cells of an earlier ``bench_plan_extrapolation.py`` run (``--measured``, default
``results/plan_kept_2026-12-06.json``): the map fitted on k-means++ rows of the corpus, every other row mapped, the
re-embedded rows kept native (``align.keep_native_rows``), R@10 of the plan's own queries over the native R@10. A
recommended K of the whole corpus re-embeds every row: retention 1 by definition, nothing measured.

    OMP_NUM_THREADS=1 python benchmarks/bench_plan_keep.py --cache DIR [--targets 0.5 0.6 0.7] [--out stem]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_plan_extrapolation as bpe

RESULTS = bpe.RESULTS


def recommendations(d: dict, seeds, probes, n_queries: int, targets) -> dict:
    """``{probe: {seed: {target: {"plain": recommended, "keep": recommended, "predicted": ..., "queries": ...}}}}``;
    the two plans of a (probe, seed) are checked to forecast alike (``keep`` changes only the recommendation)."""
    out: dict = {}
    for probe in probes:
        for t in targets:
            plain = bpe.plans(d, seeds, probe, n_queries, target_retention=t)
            kept = bpe.plans(d, seeds, probe, n_queries, target_retention=t, keep=True)
            for seed in plain:
                if plain[seed]["predicted"] != kept[seed]["predicted"]:
                    raise SystemExit(f"probe {probe} seed {seed}: keep changed the forecast, not only the "
                                     f"recommendation")
                cell = out.setdefault(str(probe), {}).setdefault(seed, {})
                cell[str(t)] = {"plain": plain[seed]["recommended"], "keep": kept[seed]["recommended"]}
                cell["predicted"], cell["queries"] = plain[seed]["predicted"], plain[seed]["queries"]
            print(f"planned probe {probe} target {t}", file=sys.stderr, flush=True)
    return out


def measured_kept(meas: dict, method: str, k: int, queries, whole: bool) -> float | None:
    """The kept workflow's measured retention at ``k`` (of ``method``'s map), the plan's own ``queries``; 1.0 for the
    whole corpus re-embedded; None where the run measured no such cell."""
    if whole:
        return 1.0
    vals = meas.get(f"kept|{method}|{k}")
    return float(np.mean([bpe.retention(v, meas["native"], queries) for v in vals])) if vals else None


def smallest_reaching(meas: dict, cell: dict, t: float) -> int:
    """The smallest K of the plan's rows whose kept workflow (the map of that row's method) measured at least ``t``:
    what a recommendation with hindsight would be (the whole corpus when no measured K reaches it)."""
    for q in cell["predicted"]:
        m = measured_kept(meas, q["method"], q["k"], cell["queries"], bool(q.get("whole_corpus")))
        if m is not None and m >= t:
            return q["k"]
    return cell["predicted"][-1]["k"]


def _k(rec: dict) -> str:
    return f"{rec['k']:,}" + (" (whole)" if rec["whole_corpus"] else "")


def table(rec: dict, meas: dict, targets) -> str:
    """Per target, probe and seed: the recommended K of each plan, the kept workflow measured at each (the map of
    the forecast's method; ``auto``, the recommended method from K = 1,000, beside it) and the smallest K at which it
    measured the target; a summary per target."""
    lines = [("| target | probe | seed | K (reads retention) | K (keep: reads kept) | kept forecast at K (keep) | "
              "kept workflow measured at K (keep): forecast method / auto | reaches | kept workflow at K (retention) | "
              "smallest K measured to reach |"), "|" + "---|" * 10]
    out = []
    for t in targets:
        s = {"plans": 0, "smaller": 0, "saved": [], "migrated": 0, "reach": 0, "auto": 0, "reach_auto": 0,
             "right_keep": 0, "right_plain": 0}
        for probe, by_seed in rec.items():
            for seed, cell in by_seed.items():
                plain, keep = cell[str(t)]["plain"], cell[str(t)]["keep"]
                q = next(q for q in cell["predicted"] if q["k"] == keep["k"])  # the whole corpus: its own row
                m_keep = measured_kept(meas, keep["forecast_method"], keep["k"], cell["queries"], keep["whole_corpus"])
                m_auto = (measured_kept(meas, "auto", keep["k"], cell["queries"], False)
                          if keep["method"] == "auto" and not keep["whole_corpus"] else None)
                m_plain = measured_kept(meas, plain["forecast_method"], plain["k"], cell["queries"],
                                        plain["whole_corpus"])
                best = smallest_reaching(meas, cell, t)
                s["plans"] += 1
                s["smaller"] += keep["k"] < plain["k"]
                s["saved"].append(plain["k"] - keep["k"])
                s["right_keep"] += keep["k"] == best
                s["right_plain"] += plain["k"] == best
                if not keep["whole_corpus"] and m_keep is not None:  # the whole corpus reaches any target
                    s["migrated"] += 1
                    s["reach"] += m_keep >= t
                if m_auto is not None:
                    s["auto"] += 1
                    s["reach_auto"] += m_auto >= t
                if keep["whole_corpus"]:
                    measured, reach = "1 (all re-embedded)", "yes"
                elif m_keep is None:
                    measured, reach = "—", "—"
                else:
                    measured = f"{m_keep:.3f} ({keep['forecast_method']})" + ("" if m_auto is None else
                                                                            f" / {m_auto:.3f}")
                    reach = "yes" if m_keep >= t else f"no ({m_keep - t:+.3f})"
                    reach += "" if m_auto is None else (", auto yes" if m_auto >= t else f", auto {m_auto - t:+.3f}")
                lines.append(f"| {t:g} | {probe} | {seed} | {_k(plain)} | {_k(keep)} | {q['kept']['retention']:.3f} | "
                             f"{measured} | {reach} | "
                             + ("—" if m_plain is None else "1 (all re-embedded)" if plain["whole_corpus"]
                                else f"{m_plain:.3f}") + f" | {best:,} |")
        out.append(f"- target {t:g}: keep recommended a smaller K in {s['smaller']} of {s['plans']} plans (mean "
                   f"{np.mean(s['saved']):,.0f} fewer rows, at most {max(s['saved']):,}); where it recommended "
                   f"migrating ({s['migrated']} plans) the kept workflow measured the target in {s['reach']} "
                   f"(auto's map {s['reach_auto']} of {s['auto']}); the recommended K was the smallest measured to "
                   f"reach it in {s['right_keep']} of {s['plans']} with keep, {s['right_plain']} without")
    return "\n".join(lines + [""] + out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    ap.add_argument("--probe", type=int, nargs="+", default=[1000, 2000])
    ap.add_argument("--queries", type=int, default=600)
    ap.add_argument("--targets", type=float, nargs="+", default=[0.5, 0.6, 0.7, 0.75, 0.8, 0.95])
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("VECBRIDGE_BENCH_CACHE",
                                                                    Path.home() / ".cache" / "vecbridge-bench")))
    ap.add_argument("--measured", type=Path, default=RESULTS / "plan_kept_2026-12-06.json",
                    help="a bench_plan_extrapolation.py JSON of the same --seeds / --probe / --queries: its kept cells")
    ap.add_argument("--plans", type=Path, help="a JSON this script wrote (--out): its recommendations are reused")
    ap.add_argument("--out", help="write the table to results/OUT.md and the recommendations to results/OUT.json")
    a = ap.parse_args(argv)
    if a.plans:
        rec = json.loads(a.plans.read_text())["recommendations"]
    else:
        rec = recommendations(bpe.load(a.cache, "heldout"), a.seeds, a.probe, a.queries, a.targets)
    text = table(rec, json.loads(a.measured.read_text())["measured"], a.targets)
    print(text)
    if a.out:
        (RESULTS / f"{a.out}.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()},
                                                          "recommendations": rec}, indent=1))
        (RESULTS / f"{a.out}.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
