"""The labelled plan's forecast past its probe against retention measured by fitting there (issue 16).

WordNet reverse dictionary, minilm -> e5 (``build_retrieval_sets.py --sets wordnet --encoders minilm e5``). The
corpus to migrate is the set's held-out part (``--corpus heldout``: the 8,192 rows whose glosses the queries
look for, as in the QA that found the bias) or every document (``--corpus all``, 40,960 rows). Per plan seed:
``--queries`` labelled queries, a ``--probe``-pair probe of corpus rows holding their relevant documents
(topped up with other corpus rows), and ``align.plan_migration`` over the corpus with them.

Measured: for each K and method, ``align.fit_migration(method=...)`` (ridge: α chosen on held-out pairs, as a
user's fit does) on K random pairs of the fit pool (rows outside the held-out part), ``--fit-seeds`` draws;
the whole old corpus mapped and searched by the same queries (every query of the set whose document is in the
corpus); retention = R@10 over the mapped corpus / R@10 over the native new-model corpus. Each cell compares
the forecast at K with the measured retention of the method the plan names at K (mean over the draws).

``--baseline-tree DIR``: the same plans with another checkout's ``align`` (a subprocess), beside this tree's.

    OMP_NUM_THREADS=1 python benchmarks/bench_plan_extrapolation.py --seeds 0 1 2 --probe 1000 [--out stem]
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
RESULTS = ROOT / "benchmarks" / "results"
KS = (100, 300, 1000, 3000, 10000)


def load(cache: Path, corpus: str, fit_from: str = "corpus", tree: Path = ROOT) -> dict:
    sys.path.insert(0, str(tree / "benchmarks"))  # bench_migration puts its tree first on sys.path: its align
    import bench_migration as bm

    data = bm.pair_data("wordnet", "minilm", "e5", cache)
    if data is None:
        raise SystemExit(bm.missing_reason("wordnet", "minilm", "e5", cache))
    pool = data["pool"]
    rows = np.setdiff1d(np.arange(data["n_docs"]), pool) if corpus == "heldout" else np.arange(data["n_docs"])
    pos = np.full(data["n_docs"], -1)
    pos[rows] = np.arange(rows.size)
    ok = pos[data["relevant"]] >= 0
    # the measured maps' pairs: rows of the corpus itself (the plan forecasts maps fitted on rows of X_old), none
    # relevant to an evaluation query (a fitted pair's document is mapped next to its native vector); with
    # --fit-from pool: rows of the set's fit pool instead (other glosses, as bench_migration.py fits)
    fit = pool if fit_from == "pool" else rows[~np.isin(rows, data["relevant"][ok])]
    return {"Do": data["D_old"][rows].astype(np.float32), "Dn": data["D_new"][rows].astype(np.float32),
            "Po": data["D_old"][fit].astype(np.float32), "Pn": data["D_new"][fit].astype(np.float32),
            "Qo": data["Q_old"][ok].astype(np.float32), "Qn": data["Q_new"][ok].astype(np.float32),
            "rel": pos[data["relevant"][ok]]}


def plans(d: dict, seeds, probe: int, n_queries: int, **plan_kw) -> dict:
    """Per seed a labelled plan of the corpus (``plan_kw``: more of ``align.plan_migration``'s options, e.g.
    ``target_retention``, ``keep``): its forecasts, curve, recommendation and the queries it drew."""
    import align

    out = {}
    n = d["Do"].shape[0]
    for seed in seeds:
        rng = np.random.default_rng(seed + 1)
        qi = rng.choice(d["Qn"].shape[0], size=min(n_queries, d["Qn"].shape[0]), replace=False)
        need = np.unique(d["rel"][qi])
        fill = rng.choice(np.setdiff1d(np.arange(n), need), size=max(0, probe - need.size), replace=False)
        pr = np.sort(np.concatenate([need, fill]))
        plan = align.plan_migration(d["Do"], d["Do"][pr], d["Dn"][pr], random_state=seed, target_ks=KS,
                                    select_rows=False, queries=d["Qn"][qi], old_queries=d["Qo"][qi],
                                    relevant=np.searchsorted(pr, d["rel"][qi]), **plan_kw)
        out[str(seed)] = {"predicted": plan["predicted"], "curve": plan["curve"], "fits": plan["fits"],
                          "best": plan["best_method"], "top": plan["n_probe"] - plan["n_probe_holdout"],
                          "queries": qi.tolist(), "recommended": plan["recommended"]}
    return out


def r10(Q: np.ndarray, D: np.ndarray, rel: np.ndarray) -> np.ndarray:
    D = D / np.linalg.norm(D, axis=1, keepdims=True)
    S = Q @ D.T
    top = np.argpartition(-S, 10, axis=1)[:, :10]
    return (top == rel[:, None]).any(axis=1)


def retention(hits: str, native: str, qi=None) -> float:
    """R@10 over the mapped corpus / over the native one, of the queries ``qi`` (all: None), from hit strings."""
    h, n = np.frombuffer(hits.encode(), np.uint8) - 48, np.frombuffer(native.encode(), np.uint8) - 48
    return float(h.mean() / n.mean()) if qi is None else float(h[qi].mean() / n[qi].mean())


def measure(d: dict, fit_seeds, methods=("procrustes", "ridge")) -> dict:
    """Per-query R@10 hits (a "0"/"1" string) of the native new-model corpus (``native``), of each method's map
    fitted on K random rows relevant to no query with every row mapped (``method|K``: what the plan's curve is of,
    its fits hold every relevant document out), on K random rows of the whole corpus (``any|method|K``), and of the map
    fitted on the plan's own k-means++ rows (``align.select_rows_to_embed``, relevant documents not excluded), every
    row mapped (``workflow|method|K``, also for ``auto``: the README's workflow, plan rows -> fit -> transform),
    and the same with the re-embedded rows kept native (``kept|method|K``: ``align.keep_native_rows``)."""
    import align

    Qn = d["Qn"] / np.linalg.norm(d["Qn"], axis=1, keepdims=True)
    out = {"native": "".join("01"[int(h)] for h in r10(Qn, d["Dn"], d["rel"]))}
    n_pool = d["Po"].shape[0]
    for k in KS:
        if k > d["Po"].shape[0]:
            continue
        for m in methods:
            vals = []
            for s in fit_seeds:
                idx = np.random.default_rng(1000 + s).choice(n_pool, size=min(k, n_pool), replace=False)
                fm = align.fit_migration(d["Po"][idx], d["Pn"][idx], method=m, random_state=s)
                vals.append("".join("01"[int(h)] for h in r10(Qn, fm.apply(d["Do"], output="raw"), d["rel"])))
            out[f"{m}|{k}"] = vals
            anyrows = []  # random rows of the whole corpus: some are documents the queries look for, as in a migration
            for s in fit_seeds:
                idx = np.random.default_rng(2000 + s).choice(d["Do"].shape[0], size=k, replace=False)
                fm = align.fit_migration(d["Do"][idx], d["Dn"][idx], method=m, random_state=s)
                anyrows.append("".join("01"[int(h)] for h in r10(Qn, fm.apply(d["Do"], output="raw"), d["rel"])))
            out[f"any|{m}|{k}"] = anyrows
            rows = align.select_rows_to_embed(d["Do"], k, random_state=0) if k < d["Do"].shape[0] else None
            if rows is not None:  # the README's workflow: fit on the plan's rows, transform the whole corpus
                for name in (m, "auto") if m == methods[-1] else (m,):
                    M = align.fit_migration(d["Do"][rows], d["Dn"][rows], method=name, random_state=0)
                    mapped = M.apply(d["Do"], output="raw")
                    hits = r10(Qn, mapped, d["rel"])
                    out[f"workflow|{name}|{k}"] = ["".join("01"[int(h)] for h in hits)]
                    hits = r10(Qn, align.keep_native_rows(mapped, rows, d["Dn"][rows]), d["rel"])
                    out[f"kept|{name}|{k}"] = ["".join("01"[int(h)] for h in hits)]
            print(f"measured {m} K={k}: {[round(retention(v, out['native']), 3) for v in vals]}", file=sys.stderr,
                  flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--fit-seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--probe", type=int, nargs="+", default=[1000])
    ap.add_argument("--queries", type=int, default=600)
    ap.add_argument("--corpus", choices=("heldout", "all"), default="heldout")
    ap.add_argument("--fit-from", choices=("corpus", "pool"), default="corpus")
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("VECBRIDGE_BENCH_CACHE",
                                                                    Path.home() / ".cache" / "vecbridge-bench")))
    ap.add_argument("--measured", type=Path, help="a JSON of an earlier run: its measured cells are reused")
    ap.add_argument("--baseline-tree", type=Path)
    ap.add_argument("--out")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    d = load(a.cache, a.corpus, a.fit_from, a.child or ROOT)
    if a.child:
        print(json.dumps({str(p): plans(d, a.seeds, p, a.queries) for p in a.probe}))
        return 0
    trees = {"new": ROOT, **({"old": a.baseline_tree.resolve()} if a.baseline_tree else {})}
    result = {"args": {k: str(v) for k, v in vars(a).items()}, "plans": {}}
    for label, tree in trees.items():
        cmd = [sys.executable, __file__, "--child", str(tree), "--cache", str(a.cache), "--corpus", a.corpus,
               "--queries", str(a.queries), "--seeds", *map(str, a.seeds), "--probe", *map(str, a.probe)]
        out = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree, capture_output=True,
                             text=True, check=True).stdout
        result["plans"][label] = json.loads(out.strip().splitlines()[-1])
    sys.path.insert(0, str(ROOT))
    result["measured"] = (json.loads(a.measured.read_text())["measured"] if a.measured
                          else measure(d, a.fit_seeds))
    text = ("## Measured: maps of K random corpus rows relevant to no query, every row mapped, the plan's own "
            "queries\n\n"
            + table(result, trees) + "\n## The same, every query (the plan's are a sample of them)\n\n"
            + table(result, trees, every_query=True) + "\n## Measured as the README's workflow does: the map "
            "of the forecast's method fitted on the plan's k-means++ rows of the corpus (documents of some queries "
            "among them), every row mapped, the plan's own queries\n\n" + table(result, trees, prefix="workflow|")
            + "\n## The workflow keeping its re-embedded rows native (`align.keep_native_rows`) against the plan's "
            "`kept` forecast, the plan's own queries\n\n" + table(result, trees, prefix="kept|")
            + "\n" + rows_table(result["measured"]))
    print(text)
    if a.out:
        (RESULTS / f"{a.out}.json").write_text(json.dumps(result, indent=1))
        (RESULTS / f"{a.out}.md").write_text(text)
    return 0


def table(result: dict, trees, every_query: bool = False, prefix: str = "") -> str:
    """Forecast against measured per (probe, seed, K): measured of the plan's own queries (``every_query``: of all
    the set's queries whose documents are in the corpus); ``prefix`` ``"workflow|"``: the workflow's measure,
    ``"kept|"``: the workflow's with its rows kept native, against the forecast's ``kept``."""
    meas = result["measured"]
    head = ["probe", "seed", "K", "measured (method)"] + [f"{t}: forecast [interval] (error)" for t in trees]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    errs: dict = {t: {"in": [], "out": [], "covered": 0, "signed": []} for t in trees}
    for probe, by_seed in result["plans"]["new"].items():
        for seed in by_seed:
            for k in KS:
                cells, m_val = [], None
                for t in trees:
                    q = next((q for q in result["plans"][t][probe][seed]["predicted"] if q["k"] == k), None)
                    vals = meas.get(f"{prefix}{q['method']}|{k}") if q else None
                    if vals and prefix == "kept|":  # the forecast with the re-embedded rows kept native
                        q = {**q, **q["kept"]} if "kept" in q else None
                    if not vals or q is None:
                        cells.append("—")
                        continue
                    qi = None if every_query else result["plans"][t][probe][seed]["queries"]
                    m = float(np.mean([retention(v, meas["native"], qi) for v in vals]))
                    m_val = m_val or (m, q["method"])
                    err = q["retention"] - m
                    errs[t]["out" if q["extrapolated"] else "in"].append(abs(err))
                    errs[t]["covered"] += q["low"] <= m <= q["high"]
                    errs[t]["signed"].append(err)
                    cells.append(f"{q['retention']:.3f} [{q['low']:.3f}, {q['high']:.3f}] ({err:+.3f})"
                                 + (" x" if q["extrapolated"] else ""))
                if m_val:
                    lines.append(f"| {probe} | {seed} | {k:,} | {m_val[0]:.3f} ({m_val[1]}) | " + " | ".join(cells)
                                 + " |")
    lines.append("")
    lines.append("x: extrapolated (K past the pairs the probe's curve is fitted on)")
    for t, e in errs.items():
        every = e["in"] + e["out"]
        if every:
            lines.append(f"- {t}: {len(every)} cells, within ±0.05 in {sum(x <= 0.05 for x in every)} (in the probe "
                         f"{sum(x <= 0.05 for x in e['in'])}/{len(e['in'])}, extrapolated "
                         f"{sum(x <= 0.05 for x in e['out'])}/{len(e['out'])}), measured inside the interval in "
                         f"{e['covered']}, mean error {np.mean(e['signed']):+.3f}, mean |error| {np.mean(every):.3f}, "
                         f"largest {max(every):.3f}")
    return "\n".join(lines) + "\n"


def rows_table(meas: dict) -> str:
    """Measured retention of every query per K and method: K random rows relevant to no query (the curve's kind),
    K random rows of the whole corpus, the plan's k-means++ rows (two draws, two, one), those kept native; auto on
    the plan's rows, mapped and kept."""
    cols = ("{m}|{k}", "any|{m}|{k}", "workflow|{m}|{k}", "kept|{m}|{k}")
    lines = ["| K | " + " | ".join(f"{m}: {c}" for m in ("procrustes", "ridge")
                                   for c in ("random rows, no relevant doc", "random rows", "k-means++ rows",
                                             "k-means++ rows kept"))
             + " | auto: k-means++ rows | auto: kept |", "|" + "---|" * 11]
    for k in KS:
        cells = []
        for key in ([c.format(m=m, k=k) for m in ("procrustes", "ridge") for c in cols]
                    + [f"workflow|auto|{k}", f"kept|auto|{k}"]):
            v = meas.get(key)
            cells.append(f"{np.mean([retention(h, meas['native']) for h in v]):.3f}" if v else "—")
        lines.append(f"| {k:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
