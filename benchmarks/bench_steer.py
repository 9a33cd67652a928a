"""Benchmark: embedding steers on WordNet — the whole precision / relevance-kept Pareto curve.

Data (offline): ``shared/data/wordnet`` texts + embeddings (minilm, e5) — without it, a sample of
``--sample-rows`` definitions embedded here (``wordnet_sample.py``; every row range below scaled to its n
rows, ``wordnet_sample.split``; the output says so); labels from the Debian
``wordnet-base`` data files: each text is mapped back to its synset, which gives its
lexicographer file (``lex_filenum``) and its lemmas.

Attributes (``+1`` wanted, ``-1`` opposite, ``0`` everything else):

* ``noun.plant`` vs ``noun.animal``, ``noun.person`` vs ``noun.artifact``, ``noun.act`` vs
  ``noun.state`` (lexicographer files);
* adjective sentiment: adjective synsets (``adj.*``) whose lemmas carry a positive (``+1``) or
  negative (``-1``) score in the AFINN word list (PyPI ``afinn``), any lemma decides by the sum.

Split: training pool = rows ``[0, 16384)`` (labels used for fitting), corpus = rows
``[16384, 32768)`` (labels used only to score), queries = ``--queries`` random held-out rows of
``[32768, 40960)`` (any category: a user's ordinary queries).

Methods, each swept over ``eps`` (a geometric grid, until the results saturate):

* ``vecbridge`` — ``align.fit_steer`` default (local-discriminant rank-1 ``W``);
* ``mean-shift`` — ``q + eps |q| (mean(X+) - mean(X-))``;
* ``probe`` — logistic regression (attribute vs rest) normal ``w``: ``q + eps |q| w / |w| |v_ms|``;
* ``oracle`` — filter by label: score ``q.c + eps * 1[c has the attribute]`` (uses corpus labels).

Metrics per point: precision@10 of the attribute and overlap@10 with the unsteered top-10.
Relevance against a known answer (when ``benchmarks/build_retrieval_sets.py`` has built its
``wordnet`` reverse-dictionary set in ``--cache``, default ``$VECBRIDGE_BENCH_CACHE`` or
``~/.cache/vecbridge-bench``, over the same
corpus): a second query set of
``--queries`` synset lemma queries (e.g. ``"domestic dog, Canis familiaris"``) whose gloss lies in
the held-out rows, corpus = rows ``[16384, 40960)``; nDCG@10 of the query's own gloss (one relevant
document: ``1 / log2(rank + 1)`` when it is in the top 10) and precision@10 of the attribute along
the same eps sweeps; summary: precision at nDCG@10 kept >= 90 / 80 / 70 / 50 % of the unsteered
nDCG, and the area between the vecbridge and mean-shift curves on that axis.
Summary per curve: precision interpolated at overlap 0.9 … 0.1, and the area between the
vecbridge and mean-shift curves over overlap in [0.05, 1] (positive: vecbridge above).
Transfer: the minilm steer carried to e5 through an orthogonal Procrustes map fitted on the
paired training rows, against e5's own mean-shift.

Run: ``OMP_NUM_THREADS=2 python benchmarks/bench_steer.py [--queries 600]``; writes
``benchmarks/results/steer_pareto_<date>.json`` / ``.png`` (``_<date>_sample`` on a sample; ``--results DIR``:
elsewhere) and prints markdown tables.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import wordnet_sample

import align  # noqa: E402
from align.knn import knn  # noqa: E402
from align.steer import fit_mean_shift, fit_steer, transfer_steer  # noqa: E402

WN_DICT = Path("/usr/share/wordnet")
SETS_CACHE = wordnet_sample.DEFAULT_CACHE  # build_retrieval_sets.py's default --cache
RESULTS = ROOT / "benchmarks" / "results"

# WordNet 3.0 lexicographer files, in lex_filenum order (the ``lexnames`` file).
LEXNAMES = (
    "adj.all adj.pert adv.all noun.Tops noun.act noun.animal noun.artifact noun.attribute noun.body "
    "noun.cognition noun.communication noun.event noun.feeling noun.food noun.group noun.location "
    "noun.motive noun.object noun.person noun.phenomenon noun.plant noun.possession noun.process "
    "noun.quantity noun.relation noun.shape noun.state noun.substance noun.time verb.body verb.change "
    "verb.cognition verb.communication verb.competition verb.consumption verb.contact verb.creation "
    "verb.emotion verb.motion verb.perception verb.possession verb.social verb.stative verb.weather adj.ppl"
).split()

TASKS = [("noun.plant", "noun.animal"), ("noun.person", "noun.artifact"), ("noun.act", "noun.state"),
         ("adj:positive", "adj:negative")]
LEVELS = [0.95, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]
NDCG_LEVELS = [0.95, 0.9, 0.8, 0.7, 0.5, 0.3]
K = 10


def load_wordnet(rows: int = wordnet_sample.DEFAULT_ROWS) -> dict:
    """The shared WordNet set (or a sample of ``rows`` built here): ``texts``, ``emb`` (minilm, e5 float32),
    ``train`` / ``corpus`` / ``held`` row ranges (``wordnet_sample.split``: [0, 16384) / [16384, 32768) /
    [32768, 40960) of the shared set) and ``note`` (the sample line, or ``""``)."""
    folder = wordnet_sample.wordnet_dir(("minilm", "e5"), rows=rows)
    texts = json.loads((folder / "texts.json").read_text())
    train, corpus, held = ((r.start, r.stop) for r in wordnet_sample.split(len(texts)))
    return {"texts": texts, "emb": {name: wordnet_sample.load(folder, name) for name in ("minilm", "e5")},
            "train": train, "corpus": corpus, "held": held, "note": wordnet_sample.note(folder)}


def has_both(labels: np.ndarray, what: str) -> bool:
    """Whether the training labels hold both sides of the attribute (a small sample may lack one): else say so."""
    if (labels == 1).any() and (labels == -1).any():
        return True
    print(f"{what}: the training rows hold {int((labels == 1).sum())} / {int((labels == -1).sum())} rows of the two "
          "sides; skipped", file=sys.stderr, flush=True)
    return False


def synset_facts(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per text: lexicographer file and AFINN polarity of its lemmas (``''`` / 0 when unknown or ambiguous)."""
    from afinn import Afinn

    scorer = Afinn()
    found: dict[str, set] = {}
    for pos in ("noun", "verb", "adj", "adv"):
        with open(WN_DICT / f"data.{pos}", encoding="latin-1") as fh:
            for line in fh:
                if line.startswith("  "):
                    continue
                head, _, gloss = line.partition(" | ")
                f = head.split()
                words = [f[4 + 2 * i].split("(")[0].replace("_", " ") for i in range(int(f[3], 16))]
                pol = int(np.sign(sum(scorer.score(w) for w in words)))
                found.setdefault(gloss.split('; "')[0].strip(), set()).add((LEXNAMES[int(f[1])], pol))
    lex, pol = [], []
    for t in texts:
        hit = found.get(t, set())
        lex.append(next(iter(hit))[0] if len(hit) == 1 else "")
        pol.append(next(iter(hit))[1] if len(hit) == 1 else 0)
    return np.array(lex), np.array(pol)


def task_labels(lex: np.ndarray, pol: np.ndarray, a: str, b: str) -> np.ndarray:
    if a.startswith("adj:"):
        adj = np.char.startswith(lex.astype(str), "adj.")
        return np.where(adj & (pol > 0), 1, np.where(adj & (pol < 0), -1, 0))
    return np.where(lex == a, 1, np.where(lex == b, -1, 0))


def sweep(step, Q: np.ndarray, C: np.ndarray, attr: np.ndarray, I0: np.ndarray, grid,
          rel: np.ndarray | None = None) -> list[dict]:
    """Precision@10 of the attribute, overlap@10 (and nDCG@10 of ``rel``, the relevant corpus row of each
    query, when given) along ``eps``; ``step(Q, eps) -> (D, I)``."""
    rows = []
    for e in grid:
        _, I = step(Q, e)
        overlap = float(np.mean([len(set(x) & set(y)) / K for x, y in zip(I, I0)]))
        rows.append({"eps": float(e), "precision": float(attr[I].mean()), "overlap": overlap})
        if rel is not None:
            hit = I == rel[:, None]
            rows[-1]["ndcg"] = float(np.mean(np.where(hit.any(1), 1.0 / np.log2(hit.argmax(1) + 2.0), 0.0)))
        if overlap < 0.02 and len(rows) > 3 and rows[-1]["precision"] <= rows[-2]["precision"] + 1e-3:
            break
    if rel is not None:
        for r in rows:
            r["ndcg_kept"] = r["ndcg"] / max(rows[0]["ndcg"], 1e-12)
    return rows


def reverse_dictionary(n_queries: int, rng: np.random.Generator, texts: list[str] | None = None,
                       cache: Path = SETS_CACHE):
    """Lemma queries with their own gloss (``build_retrieval_sets.py``'s ``wordnet`` set) or None; None also when
    the set's corpus is not ``texts`` (built from the shared set while this run has a sample, or the reverse)."""
    folder = Path(cache) / "wordnet"
    if not (folder / "set.json").is_file():
        return None
    meta = json.loads((folder / "set.json").read_text())
    if texts is not None and meta["docs"] != texts:
        print(f"{folder}/set.json was built from another corpus than this run's: no nDCG (build the set of this "
              "data under another --cache: build_retrieval_sets.py --sets wordnet --cache DIR)", file=sys.stderr)
        return None
    pick = np.sort(rng.choice(len(meta["queries"]), size=min(n_queries, len(meta["queries"])), replace=False))
    return {"texts": [meta["queries"][i] for i in pick], "doc": np.array(meta["query_doc"])[pick],
            **{name: np.load(folder / f"{name}_queries.npy")[pick].astype(np.float32) for name in ("minilm", "e5")}}


def at_level(rows: list[dict], level: float, axis: str = "overlap") -> float:
    """Best precision reachable while keeping at least ``level`` of ``axis`` (overlap, or nDCG kept;
    upper envelope, interpolated)."""
    ov = np.array([r[axis] for r in rows])
    p = np.array([r["precision"] for r in rows])
    order = np.argsort(-ov, kind="stable")
    ov, p = ov[order], np.maximum.accumulate(p[order])
    if level < ov[-1]:
        return float(p[-1])
    return float(np.interp(level, ov[::-1], p[::-1]))


def area_between(a: list[dict], b: list[dict], lo: float = 0.05, axis: str = "overlap") -> float:
    grid = np.linspace(lo, 1.0, 96)
    return float(np.mean([at_level(a, g, axis) - at_level(b, g, axis) for g in grid]) * (1.0 - lo))


def monotone_until_saturation(rows: list[dict], tol: float = 0.005) -> bool:
    p = [r["precision"] for r in rows]
    peak = int(np.argmax(p))
    return all(y >= x - tol for x, y in zip(p[: peak + 1], p[1 : peak + 1]))


def shift_step(C, v):
    return lambda Q, e: knn(Q + e * np.linalg.norm(Q, axis=1, keepdims=True) * v[None, :], C, K)


def oracle_step(C, attr, block: int = 256):
    def step(Q, e):
        I = np.empty((Q.shape[0], K), dtype=np.int64)
        for s in range(0, Q.shape[0], block):
            S = Q[s : s + block] @ C.T + e * attr[None, :]
            part = np.argpartition(-S, K, axis=1)[:, :K]
            I[s : s + block] = np.take_along_axis(part, np.argsort(-np.take_along_axis(S, part, 1), 1), 1)
        return None, I
    return step


def curves_for(steps: dict, Q: np.ndarray, C: np.ndarray, attr: np.ndarray, grid, ograd,
               rel: np.ndarray | None = None) -> dict:
    """One eps sweep per method; ``steps[name](C, attr) -> step`` (see :func:`sweep`)."""
    _, I0 = knn(Q, C, K)
    return {m: sweep(make(C, attr), Q, C, attr, I0, ograd if m == "oracle" else grid, rel) for m, make in steps.items()}


def compare(curves: dict, levels, axis: str) -> dict:
    """Summary of one set of curves on one relevance axis (``overlap`` or ``ndcg_kept``)."""
    summary = {m: {str(lv): at_level(r, lv, axis) for lv in levels} for m, r in curves.items()}
    return {"at": summary, "area_vs_mean_shift": area_between(curves["vecbridge"], curves["mean-shift"], axis=axis),
            "dominates_mean_shift": bool(all(summary["vecbridge"][str(lv)] >= summary["mean-shift"][str(lv)] - 1e-9
                                             for lv in levels)),
            "worst_gap": float(min(summary["vecbridge"][str(lv)] - summary["mean-shift"][str(lv)] for lv in levels))}


def run(n_queries: int, seed: int = 0, data: dict | None = None, cache: Path = SETS_CACHE) -> dict:
    from sklearn.linear_model import LogisticRegression

    data = data or load_wordnet()
    texts, emb, TRAIN, CORPUS, HELD = data["texts"], data["emb"], data["train"], data["corpus"], data["held"]
    lex, pol = synset_facts(texts)
    rng = np.random.default_rng(seed)
    n_queries = min(n_queries, HELD[1] - HELD[0])
    qidx = rng.choice(np.arange(*HELD), size=n_queries, replace=False)
    rd = reverse_dictionary(n_queries, rng, texts, cache)
    tr, co, nco = slice(*TRAIN), slice(*CORPUS), slice(CORPUS[0], HELD[1])
    pmap = align.fit_procrustes(emb["minilm"][tr], emb["e5"][tr])
    grid = np.concatenate([[0.0], np.geomspace(0.03, 100, 20)])
    ograd = np.concatenate([[0.0], np.geomspace(0.003, 1, 16)])
    out = {"setup": {"queries": n_queries, "k": K, "train_rows": TRAIN, "corpus_rows": CORPUS,
                     "query_rows": HELD, "seed": seed, "date": _dt.date.today().isoformat(),
                     "map": f"fit_procrustes minilm->e5 on paired rows [{TRAIN[0]},{TRAIN[1]}) (supervised)",
                     "ndcg_queries": None if rd is None else len(rd["doc"]),
                     "ndcg_corpus_rows": [CORPUS[0], HELD[1]]}, "tasks": []}
    if data["note"]:
        out["setup"]["data"] = data["note"]
    for a, b in TASKS:
        labels_all = task_labels(lex, pol, a, b)
        labels = labels_all[tr]
        if not has_both(labels, f"{a} vs {b}"):
            continue
        attr_c = (labels_all[co] == 1).astype(np.float32)
        task = {"A": a, "B": b, "n_A": int((labels == 1).sum()), "n_B": int((labels == -1).sum()),
                "corpus_rate_A": float(attr_c.mean()), "curves": {}}
        steers = {}
        for space in ("minilm", "e5", "e5 (transfer from minilm)"):
            base_space = space.split()[0]
            X, Q, C = emb[base_space][tr], emb[base_space][qidx], emb[base_space][co]
            ms = fit_mean_shift(X, labels)
            t0 = time.time()
            if space == "e5 (transfer from minilm)":
                st = transfer_steer(steers["minilm"], pmap)
            else:
                st = fit_steer(X, labels, random_state=seed)
                steers[space] = st
            fit_s = time.time() - t0
            steps = {"vecbridge": lambda C_, a_, st=st: (lambda Q_, e: knn(st.apply(Q_, e), C_, K)),
                     "mean-shift": lambda C_, a_, ms=ms: shift_step(C_, ms.v)}
            if "transfer" not in space:
                probe = LogisticRegression(C=1.0, max_iter=500).fit(X, labels == 1)
                w = (probe.coef_[0] / np.linalg.norm(probe.coef_[0]) * np.linalg.norm(ms.v)).astype(np.float32)
                steps["probe"] = lambda C_, a_, w=w: shift_step(C_, w)
                steps["oracle"] = oracle_step
            curves = curves_for(steps, Q, C, attr_c, grid, ograd)
            summ = compare(curves, LEVELS, "overlap")
            entry = task["curves"][space] = {
                "fit_seconds": round(fit_s, 2), "rows": curves, "at_overlap": summ["at"],
                "area_vs_mean_shift": summ["area_vs_mean_shift"], "dominates_mean_shift": summ["dominates_mean_shift"],
                "worst_gap": summ["worst_gap"],
                "strictly_above_at_0.5": bool(summ["at"]["vecbridge"]["0.5"] > summ["at"]["mean-shift"]["0.5"]),
                "monotone": bool(monotone_until_saturation(curves["vecbridge"])),
                "identity_at_0": bool(np.array_equal(st.apply(Q, 0.0), Q)),
                "prior_weight": st.metadata.get("prior_weight", st.metadata.get("of", {}).get("prior_weight"))}
            if rd is not None:
                attr_n = (labels_all[nco] == 1).astype(np.float32)
                nc = curves_for(steps, rd[base_space], emb[base_space][nco], attr_n, grid, ograd,
                                rel=rd["doc"] - CORPUS[0])
                entry["ndcg"] = {"unsteered": nc["vecbridge"][0]["ndcg"], "rows": nc, **compare(nc, NDCG_LEVELS, "ndcg_kept")}
            print(f"{a} / {space}: vecbridge@0.5 {summ['at']['vecbridge']['0.5']:.3f} "
                  f"mean-shift@0.5 {summ['at']['mean-shift']['0.5']:.3f} worst gap {summ['worst_gap']:+.4f} "
                  f"t={entry['prior_weight']}", file=sys.stderr, flush=True)
        out["tasks"].append(task)
    return out


def has_ndcg(res: dict) -> bool:
    """Whether some curve of ``res`` was measured against the reverse-dictionary set (its nDCG figure has data)."""
    return any("ndcg" in c for task in res["tasks"] for c in task["curves"].values())


def panel_title(task: dict, space: str, c: dict, axis: str) -> str:
    """A panel's title: its area vs mean-shift on ``axis``, or that it has no nDCG curve (never a made-up area)."""
    n = c["area_vs_mean_shift"] if axis == "overlap" else c.get("ndcg", {}).get("area_vs_mean_shift")
    return f"{task['A']} vs {task['B']}\n{space} " + ("(no nDCG data)" if n is None else f"(area {n:+.3f})")


def figure(res: dict, path: Path, axis: str = "overlap") -> None:
    """Grid of Pareto curves (rows: attributes, columns: spaces); ``axis`` overlap or ndcg_kept."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spaces = list(res["tasks"][0]["curves"])
    fig, axes = plt.subplots(len(res["tasks"]), len(spaces), figsize=(4.2 * len(spaces), 3.3 * len(res["tasks"])),
                             squeeze=False)
    style = {"vecbridge": ("C0", "-"), "mean-shift": ("C1", "--"), "probe": ("C2", "-."), "oracle": ("0.5", ":")}
    for i, task in enumerate(res["tasks"]):
        for j, space in enumerate(spaces):
            ax = axes[i][j]
            c = task["curves"][space]
            for name, rows in (c["rows"] if axis == "overlap" else c.get("ndcg", {}).get("rows", {})).items():
                ov = [r[axis] for r in rows]
                p = [r["precision"] for r in rows]
                colour, ls = style[name]
                ax.plot(ov, p, ls, color=colour, marker=".", ms=3, label=name)
            ax.set_xlim(1.02, 0)
            ax.set_title(panel_title(task, space, c, axis), fontsize=8)
            ax.set_xlabel("overlap@10 with unsteered" if axis == "overlap" else "nDCG@10 kept (share of unsteered)",
                          fontsize=7)
            ax.set_ylabel("attribute precision@10", fontsize=7)
            ax.grid(alpha=0.3)
            if i == 0 and j == 0:
                ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def tables(res: dict, png_name: str, ndcg_png: str) -> str:
    lines = [*([res["setup"]["data"], ""] if res["setup"].get("data") else []), f"![Pareto curves]({png_name})", "",
             "Precision@10 of the attribute at a given overlap@10 with the unsteered results "
             "(upper envelope of each eps sweep, interpolated); area = mean difference vecbridge - mean-shift "
             "over overlap [0.05, 1] x 0.95; worst gap = min over overlap 0.95 ... 0.1 of vecbridge - mean-shift.", ""]
    show = ["0.9", "0.8", "0.7", "0.5", "0.3", "0.2", "0.1"]
    lines.append("| attribute | space | method | " + " | ".join(f"@{s}" for s in show) + " |")
    lines.append("|---|---|---|" + "---:|" * len(show))
    for task in res["tasks"]:
        for space, c in task["curves"].items():
            for m, summ in c["at_overlap"].items():
                lines.append(f"| {task['A']} vs {task['B']} | {space} | {m} | "
                             + " | ".join(f"{summ[s]:.3f}" for s in show) + " |")
    lines += ["", "| attribute | space | n+ / n- (train) | corpus rate | prior t | area vs mean-shift | worst gap | "
              "dominates | strictly above @0.5 | monotone in eps | eps=0 identity | fit s |",
              "|---|---|---|---:|---:|---:|---:|---|---|---|---|---:|"]
    for task in res["tasks"]:
        for space, c in task["curves"].items():
            lines.append(f"| {task['A']} vs {task['B']} | {space} | {task['n_A']} / {task['n_B']} | "
                         f"{task['corpus_rate_A']:.3f} | {c['prior_weight']} | {c['area_vs_mean_shift']:+.4f} | "
                         f"{c['worst_gap']:+.4f} | {c['dominates_mean_shift']} | "
                         f"{c['strictly_above_at_0.5']} | {c['monotone']} | {c['identity_at_0']} | {c['fit_seconds']} |")
    nd = [(t, sp, c["ndcg"]) for t in res["tasks"] for sp, c in t["curves"].items() if "ndcg" in c]
    if not nd:
        return "\n".join(lines + ["", "nDCG: the reverse-dictionary set was not built (benchmarks/build_retrieval_sets.py)."])
    kept = ["0.95", "0.9", "0.8", "0.7", "0.5", "0.3"]
    lines += ["", "### Relevance against the query's own document (nDCG@10)", "", f"![nDCG Pareto curves]({ndcg_png})", "",
              f"{res['setup']['ndcg_queries']} reverse-dictionary queries (a synset's lemmas; relevant document = its "
              f"gloss, one per query) over corpus rows {res['setup']['ndcg_corpus_rows']}. Precision@10 of the attribute "
              "reachable while nDCG@10 stays at or above the given share of the unsteered nDCG@10 (upper envelope); "
              "area and worst gap as above on this axis.", "",
              "| attribute | space | unsteered nDCG@10 | method | " + " | ".join(f"kept {k}" for k in kept) + " |",
              "|---|---|---:|---|" + "---:|" * len(kept)]
    for task, space, n in nd:
        for m, summ in n["at"].items():
            lines.append(f"| {task['A']} vs {task['B']} | {space} | {n['unsteered']:.3f} | {m} | "
                         + " | ".join(f"{summ[k]:.3f}" for k in kept) + " |")
    lines += ["", "| attribute | space | area vs mean-shift (nDCG axis) | worst gap | dominates |", "|---|---|---:|---:|---|"]
    for task, space, n in nd:
        lines.append(f"| {task['A']} vs {task['B']} | {space} | {n['area_vs_mean_shift']:+.4f} | {n['worst_gap']:+.4f} | "
                     f"{n['dominates_mean_shift']} |")
    return "\n".join(lines)


def load_or_say(rows: int) -> dict | None:
    """:func:`load_wordnet`, or None after saying what is missing (Debian's wordnet-base; the shared set and what a
    sample needs)."""
    if not WN_DICT.exists():
        print(f"needs Debian's wordnet-base ({WN_DICT} missing: apt-get install wordnet-base); nothing to benchmark")
        return None
    try:
        data = load_wordnet(rows)
    except wordnet_sample.SampleUnavailable as exc:
        print(f"{exc}; nothing to benchmark")
        return None
    if data["note"]:
        print(data["note"], flush=True)
    return data


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queries", type=int, default=600)
    ap.add_argument("--stem", help="result file stem (default steer_pareto_<date>, a sample's _sample)")
    ap.add_argument("--results", type=Path, default=RESULTS, help="folder for the result files (default %(default)s)")
    ap.add_argument("--from-json", help="redraw the figures and tables of an earlier run's JSON")
    ap.add_argument("--cache", type=Path, default=SETS_CACHE, help="build_retrieval_sets.py's cache (nDCG queries)")
    ap.add_argument("--sample-rows", type=int, default=wordnet_sample.DEFAULT_ROWS,
                    help="without the shared WordNet set: definitions in the sample embedded here")
    args = ap.parse_args(argv)
    data = None if args.from_json else load_or_say(args.sample_rows)
    if data is None and not args.from_json:
        return 0
    args.results.mkdir(parents=True, exist_ok=True)
    res = json.loads(Path(args.from_json).read_text()) if args.from_json else run(args.queries, data=data,
                                                                                  cache=args.cache)
    if not res["tasks"]:
        print("no attribute has both of its sides among the training rows of this data; nothing to plot")
        return 0
    stem = args.stem or f"steer_pareto_{res['setup']['date']}{'_sample' if res['setup'].get('data') else ''}"
    (args.results / f"{stem}.json").write_text(json.dumps(res, indent=1))
    figure(res, args.results / f"{stem}.png")
    if has_ndcg(res):  # without the reverse-dictionary set its panels would be empty
        figure(res, args.results / f"{stem}_ndcg.png", axis="ndcg_kept")
    print(tables(res, f"{stem}.png", f"{stem}_ndcg.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
