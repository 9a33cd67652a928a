"""Benchmark: does ``eps`` mean the same after a steer is carried through a map (``align.transfer_steer``)?

Data as ``bench_steer.py`` (WordNet, labels from the lexicographer files; training rows ``[0, 16384)``,
corpus ``[16384, 32768)``, ``--queries`` held-out queries from ``[32768, 40960)``; without the shared set, a
sample embedded here with those ranges scaled, said so in the output); map: ``fit_procrustes``
on the paired training rows, in both directions (MiniLM -> e5 and e5 -> MiniLM). For each attribute the
default steer (``align.fit_steer``, rank-1 local discriminant) and an ``lm-steer`` steer of rank 16 are fitted
in the source space and carried to the target space.

Table 1 (the meaning of ``eps``): mean overlap@10 with the unsteered top-10 at ``eps`` = 0.25 / 0.5 / 1 for
the steer in its own space, the transfer, and the bare formula ``H^T W H`` (the same map without its frames).

Table 2 (the trade-off curve, MiniLM -> e5 only, the default steer): area between the steer's and e5's own mean-shift's
precision@10 curves, and the worst gap at overlap 0.95 ... 0.1 (``bench_steer.compare``), on the overlap
axis and on the nDCG@10 axis (reverse-dictionary queries; needs ``build_retrieval_sets.py``), for the bare
formula, the default transfer (two scalars on ``W``) and the exact first-order query side (the constant
``(mu_A - lam mu_B M^+) P1`` carried by ``g = mu_B / |mu_B|^2``), which ``align.transfer_steer`` does not use.

Run: ``OMP_NUM_THREADS=2 python benchmarks/bench_steer_transfer.py [--queries 500]``; writes
``benchmarks/results/steer_transfer_<date>.json`` (``_<date>_sample`` on a sample; ``--results DIR``: elsewhere)
and prints markdown.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import align  # noqa: E402
import bench_steer as bs  # noqa: E402
from align import LinearMap  # noqa: E402
from align.knn import knn  # noqa: E402
from align.steer import Steer, fit_mean_shift, fit_steer, transfer_steer  # noqa: E402

EPS = (0.25, 0.5, 1.0)
METHODS = ("local", "lm-steer")


def overlap(steer, Q, C, eps: float) -> float:
    _, I0 = knn(Q, C, bs.K)
    _, I1 = knn(steer.apply(Q, eps), C, bs.K)
    return float(np.mean([len(set(a) & set(b)) / bs.K for a, b in zip(I0.tolist(), I1.tolist())]))


def affine_query_side(steer: Steer, m) -> Steer:
    """The exact first-order query side (not used by ``transfer_steer``): ``lam M^+ P1 + g (a^T P1)``."""
    mu_a, mu_b = m.source_frame.mean.astype(np.float64), m.target_frame.mean.astype(np.float64)
    lam = np.sqrt((1 - mu_a @ mu_a) / (1 - mu_b @ mu_b))
    Mp = np.linalg.pinv(m.W.astype(np.float64))
    a = mu_a - lam * (Mp.T @ mu_b)
    P1 = lam * (Mp @ steer.P1) + np.outer(mu_b / (mu_b @ mu_b), a @ steer.P1)
    return Steer(P1, (Mp @ steer.P2) / lam)


def run(n_queries: int, seed: int = 0, data: dict | None = None, cache: Path = bs.SETS_CACHE) -> dict:
    data = data or bs.load_wordnet()
    texts, emb, TRAIN, CORPUS, HELD = data["texts"], data["emb"], data["train"], data["corpus"], data["held"]
    lex, pol = bs.synset_facts(texts)
    rng = np.random.default_rng(seed)
    n_queries = min(n_queries, HELD[1] - HELD[0])
    qidx = rng.choice(np.arange(*HELD), size=n_queries, replace=False)
    rd = bs.reverse_dictionary(n_queries, rng, texts, cache)
    tr, co, nco = slice(*TRAIN), slice(*CORPUS), slice(CORPUS[0], HELD[1])
    maps = {(s, t): align.fit_procrustes(emb[s][tr], emb[t][tr]) for s, t in (("minilm", "e5"), ("e5", "minilm"))}
    grid = np.concatenate([[0.0], np.geomspace(0.03, 100, 20)])
    out = {"setup": {"queries": n_queries, "seed": seed, "date": _dt.date.today().isoformat(), "eps": EPS},
           "meaning": [], "curves": []}
    if data["note"]:
        out["setup"]["data"] = data["note"]
    for a, b in bs.TASKS:
        lab = bs.task_labels(lex, pol, a, b)
        if not bs.has_both(lab[tr], f"{a} vs {b}"):
            continue
        for (s, t), m in maps.items():
            for method in METHODS:
                kw = {"method": "lm-steer", "rank": 16} if method == "lm-steer" else {}
                st_m = fit_steer(emb[s][tr], lab[tr], random_state=seed, **kw)
                moved_m, bare_m = transfer_steer(st_m, m), transfer_steer(st_m, LinearMap(m.W))
                row = {"attribute": a, "method": method, "from": s, "to": t,
                       **{k: moved_m.metadata[k] for k in ("spread_ratio", "gate_scale", "eps_scale")}}
                for name, st, space in (("own", st_m, s), ("transfer", moved_m, t), ("bare", bare_m, t)):
                    row[name] = [overlap(st, emb[space][qidx], emb[space][co], e) for e in EPS]
                out["meaning"].append(row)
                print(f"{a} {method} {s}->{t}: own {row['own']} transfer {row['transfer']} bare {row['bare']}",
                      file=sys.stderr, flush=True)
                if method == "local":
                    steer, moved, bare = st_m, moved_m, bare_m
            if s != "minilm":
                continue
            ms = fit_mean_shift(emb[t][tr], lab[tr])
            attr_c, attr_n = (lab[co] == 1).astype(np.float32), (lab[nco] == 1).astype(np.float32)
            for name, st in (("bare", bare), ("transfer", moved), ("affine query side", affine_query_side(steer, m))):
                steps = {"vecbridge": lambda C_, a_, st=st: (lambda Q_, e: knn(st.apply(Q_, e), C_, bs.K)),
                         "mean-shift": lambda C_, a_, ms=ms: bs.shift_step(C_, ms.v)}
                ov = bs.compare(bs.curves_for(steps, emb[t][qidx], emb[t][co], attr_c, grid, grid),
                                bs.LEVELS, "overlap")
                entry = {"attribute": a, "variant": name, "overlap_area": ov["area_vs_mean_shift"],
                         "overlap_worst_gap": ov["worst_gap"]}
                if rd is not None:
                    nd = bs.compare(bs.curves_for(steps, rd[t], emb[t][nco], attr_n, grid, grid,
                                                  rel=rd["doc"] - CORPUS[0]), bs.NDCG_LEVELS, "ndcg_kept")
                    entry.update(ndcg_area=nd["area_vs_mean_shift"], ndcg_worst_gap=nd["worst_gap"])
                out["curves"].append(entry)
    return out


def tables(res: dict) -> str:
    f = lambda v: " / ".join(f"{x:.2f}" for x in v)  # noqa: E731
    lines = [*([res["setup"]["data"], ""] if res["setup"].get("data") else []),
             f"Overlap@10 with the unsteered results at eps = {' / '.join(map(str, EPS))} "
             f"({res['setup']['queries']} queries)", "",
             "| attribute | steer | map | own space | transfer | bare H^T W H | lam | gamma |",
             "|---|---|---|---|---|---|---:|---:|"]
    for r in res["meaning"]:
        lines.append(f"| {r['attribute']} | {r.get('method', 'local')} | {r['from']} -> {r['to']} | {f(r['own'])} | "
                     f"{f(r['transfer'])} | "
                     f"{f(r['bare'])} | {r['spread_ratio']:.2f} | {r['gate_scale']:.2f} |")
    lines += ["", "Trade-off curve vs e5's own mean-shift (MiniLM -> e5): area / worst gap", "",
              "| attribute | variant | overlap axis | nDCG axis |", "|---|---|---|---|"]
    for c in res["curves"]:
        nd = f"{c['ndcg_area']:+.4f} / {c['ndcg_worst_gap']:+.4f}" if "ndcg_area" in c else "-"
        lines.append(f"| {c['attribute']} | {c['variant']} | {c['overlap_area']:+.4f} / {c['overlap_worst_gap']:+.4f} "
                     f"| {nd} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--stem", help="result file stem (default steer_transfer_<date>, a sample's _sample)")
    ap.add_argument("--results", type=Path, default=bs.RESULTS,
                    help="folder for the result files (default %(default)s)")
    ap.add_argument("--cache", type=Path, default=bs.SETS_CACHE, help="build_retrieval_sets.py's cache (nDCG queries)")
    ap.add_argument("--sample-rows", type=int, default=bs.wordnet_sample.DEFAULT_ROWS,
                    help="without the shared WordNet set: definitions in the sample embedded here")
    args = ap.parse_args(argv)
    data = bs.load_or_say(args.sample_rows)
    if data is None:
        return 0
    res = run(args.queries, data=data, cache=args.cache)
    stem = args.stem or f"steer_transfer_{res['setup']['date']}{'_sample' if res['setup'].get('data') else ''}"
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / f"{stem}.json").write_text(json.dumps(res, indent=1))
    print(tables(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
