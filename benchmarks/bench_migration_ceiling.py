"""How far can a map go? Three probes of the migration goals' ceiling, on the sets of ``bench_migration.py``.

Retention = R@10 of the migrated search / R@10 of native new-model search (one relevant document per query),
exact cosine search (FAISS flat), as in ``bench_migration.py``; random fit rows from the set's fit pool.

``--lemma-pairs`` (WordNet reverse dictionary, minilm → e5): the fit pairs are glosses (documents), the queries
    lemma lists, so a map fitted on glosses is applied to a kind of text it never saw. This probe adds *query-like*
    pairs: the lemma lists of 6,000 synsets whose gloss is in the fit pool (never an evaluation synset), embedded by
    both models (MiniLM plain, e5 with its ``query:`` form; cached beside the set as ``wordnet_qpairs/``), and fits
    ridge / Procrustes on gloss pairs, lemma pairs or both: query-side (e5 query → MiniLM index), corpus-side
    (MiniLM glosses → e5), and corpus-side with the links (MiniLM gloss → e5 query of its lemmas).
``--mlp``: a residual MLP (384 → 2048 → 384 beside a linear map, InfoNCE over in-batch negatives, temperature
    0.05, Adam 1e-3, 30 epochs) on every pair there is (the 32,768 gloss pairs + the 6,000 lemma pairs),
    query-side, against ridge on the same pairs: the most a map learnt from pairs has reached here.
``--knn-residual SET:OLD:NEW``: a map plus a local correction ``f(x) = m(x) + Σ_j softmax_j(cos(x, x_j)/τ)
    (y_j − m(x_j))`` over the ``k`` nearest fit rows (kernel regression of the map's residuals), both sides, for
    K in ``--ks``.

The WordNet set is the one ``build_retrieval_sets.py`` built in ``--cache``: without the shared set, over a sample
embedded here (its fit pool 80 % of the sample's rows, and at most as many lemma pairs as fit-pool synsets; the
output says so, and its figures are not comparable with the committed tables).

Usage (figures: ``benchmarks/results/migration_2026-12-03_ceiling.md``)::

    python benchmarks/bench_migration_ceiling.py --lemma-pairs --mlp
    python benchmarks/bench_migration_ceiling.py --cache ~/.cache/vecbridge-bench-bible6k \\
        --knn-residual bible:minilm:mpnet --ks 1000 3000
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_v, "2")

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import bench_migration as BM
import build_retrieval_sets as B

N_LEMMA_PAIRS = 6000


def lemma_pairs(cache: Path, n: int = N_LEMMA_PAIRS, seed: int = 123) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(minilm (n, 384), e5 query-form (n, 384), gloss row (n,))`` of ``n`` fit-pool synsets' lemma lists (of the
    ``wordnet`` set's corpus and fit pool; fewer when the pool has fewer synsets, as a sample's may)."""
    out = cache / "wordnet_qpairs"
    meta_path = out / "meta.json"
    spec = B.load_set("wordnet", cache)
    if not meta_path.is_file():
        where = {t: i for i, t in enumerate(spec["docs"])}
        fit = set(spec["fit_pool"])
        pool = [(", ".join(lem), where[d]) for _, lem, d in B.wordnet_synsets() if d in where and where[d] in fit]
        pick = np.sort(np.random.default_rng(seed).choice(len(pool), size=min(n, len(pool)), replace=False))
        out.mkdir(parents=True, exist_ok=True)
        meta = {"texts": [pool[i][0] for i in pick], "doc_rows": [pool[i][1] for i in pick], "seed": seed}
        if B.corpus_note(spec):  # the shared set's meta stays as it was
            meta["corpus"] = spec["corpus"]
        meta_path.write_text(json.dumps(meta))
    meta = json.loads(meta_path.read_text())
    if meta.get("corpus") != spec.get("corpus"):
        raise SystemExit(f"{meta_path} was made for another corpus than {cache}/wordnet/set.json's")
    E = {enc: B.embed_cached(enc, meta["texts"], "query", out / f"{enc}_q.npy", out / "parts").astype(np.float32)
         for enc in ("minilm", "e5")}
    return E["minilm"], E["e5"], np.asarray(meta["doc_rows"])


def ret(I: np.ndarray, rel: np.ndarray, native: float) -> float:
    return BM.retrieval_metrics(I, rel)["R@10"] / native


def probe_lemma_pairs(data: dict, cache: Path, native: float) -> list[str]:
    Do, Dn, Qn, rel, pool = data["D_old"], data["D_new"], data["Q_new"], data["relevant"], data["pool"]
    Po, Pn, prow = lemma_pairs(cache)
    rng = np.random.default_rng(0)
    dperm, qperm = rng.permutation(pool), rng.permutation(len(Po))
    rows = ["| gloss pairs | lemma pairs | method | query-side | corpus-side | corpus-side, linked |",
            "|---:|---:|---|---:|---:|---:|"]
    done = set()
    for kd, kq in [(300, 0), (0, 300), (150, 150), (2000, 0), (0, 2000), (1000, 1000), (2000, 2000), (0, 6000)]:
        di, qi = dperm[:kd], qperm[:kq]  # a sample's pool may hold fewer: the rows say how many were used
        kd, kq = len(di), len(qi)
        if (kd, kq) in done:
            continue
        done.add((kd, kq))
        for method in ("procrustes", "ridge"):
            mq = BM.fit_one(method, np.vstack([Dn[di], Pn[qi]]), np.vstack([Do[di], Po[qi]]), None, None, 0)
            mc = BM.fit_one(method, np.vstack([Do[di], Po[qi]]), np.vstack([Dn[di], Pn[qi]]), None, None, 0)
            ml = BM.fit_one(method, np.vstack([Do[di], Do[prow[qi]]]), np.vstack([Dn[di], Pn[qi]]), None, None, 0)
            rq = ret(BM.search(mq.apply(Qn, output="raw"), Do, 100), rel, native)
            rc = ret(BM.search(Qn, mc.apply(Do, output="raw"), 100), rel, native)
            rl = ret(BM.search(Qn, ml.apply(Do, output="raw"), 100), rel, native)
            rows.append(f"| {kd} | {kq} | {method} | {rq:.3f} | {rc:.3f} | {rl:.3f} |")
            print(rows[-1], flush=True)
    return rows


def probe_mlp(data: dict, cache: Path, native: float, epochs: int = 30, seed: int = 0) -> list[str]:
    import torch

    torch.manual_seed(seed)
    Do, Dn, Qn, rel, pool = data["D_old"], data["D_new"], data["Q_new"], data["relevant"], data["pool"]
    Po, Pn, _ = lemma_pairs(cache)
    X, Y = np.vstack([Dn[pool], Pn]), np.vstack([Do[pool], Po])
    rows = [f"| map (query-side, all {len(X):,} pairs) | epochs | retention R@10 | fit s |", "|---|---:|---:|---:|"]
    t = time.time()
    m = BM.fit_one("ridge", X, Y, None, None, seed)
    r = ret(BM.search(m.apply(Qn, output="raw"), Do, 100), rel, native)
    rows.append(f"| ridge (λ on held-out pairs) | — | {r:.3f} | {time.time() - t:.1f} |")
    print(rows[-1], flush=True)
    d_in, d_out = X.shape[1], Y.shape[1]
    lin = torch.nn.Linear(d_in, d_out)
    net = torch.nn.Sequential(torch.nn.Linear(d_in, 2048), torch.nn.GELU(), torch.nn.Linear(2048, d_out))
    opt = torch.optim.Adam([*lin.parameters(), *net.parameters()], lr=1e-3)
    Xt, Yt, Qt = (torch.tensor(BM.unit(A)) for A in (X, Y, Qn))
    t = time.time()
    for ep in range(1, epochs + 1):
        for b in torch.randperm(len(Xt)).split(256):
            out = torch.nn.functional.normalize(lin(Xt[b]) + net(Xt[b]), dim=1)
            loss = torch.nn.functional.cross_entropy(out @ Yt[b].T / 0.05, torch.arange(len(b)))
            opt.zero_grad()
            loss.backward()
            opt.step()
        if ep % 5 == 0:
            with torch.no_grad():
                q = (lin(Qt) + net(Qt)).numpy()
            rows.append(f"| residual MLP, InfoNCE | {ep} | {ret(BM.search(q, Do, 100), rel, native):.3f} "
                        f"| {time.time() - t:.0f} |")
            print(rows[-1], flush=True)
    return rows


def knn_residual(m, Xs: np.ndarray, Ys: np.ndarray, k: int, tau: float):
    """``X ↦ unit(m(X)) + Σ_j w_j (unit(y_j) − unit(m(x_j)))`` over X's ``k`` nearest fit rows ``x_j`` by cosine,
    ``w = softmax(cos / tau)`` (queries in blocks of 1,024: a (1024, K) score block at a time)."""
    Xu, R = BM.unit(Xs), BM.unit(Ys) - BM.unit(m.apply(Xs, output="raw"))

    def f(X):
        out = BM.unit(m.apply(X, output="raw"))
        for s in range(0, X.shape[0], 1024):
            S = BM.unit(X[s : s + 1024]) @ Xu.T
            top = np.argpartition(-S, k - 1, axis=1)[:, :k]
            z = np.take_along_axis(S, top, 1) / tau
            w = np.exp(z - z.max(1, keepdims=True))
            w /= w.sum(1, keepdims=True)
            out[s : s + 1024] += np.einsum("qk,qkd->qd", w, R[top])
        return out
    return f


def probe_knn_residual(data: dict, native: float, ks) -> list[str]:
    Do, Dn, Qn, rel, pool = data["D_old"], data["D_new"], data["Q_new"], data["relevant"], data["pool"]
    settings = ((10, 0.05), (10, 0.1), (30, 0.05))
    head = " | ".join(f"k={k}, τ={t}: query / corpus" for k, t in settings)
    rows = [f"| K | method | plain: query / corpus | {head} |", "|---:|---|---|" + "---|" * len(settings)]
    rng = np.random.default_rng(0)
    for K in ks:
        idx = pool if K >= len(pool) else pool[np.sort(rng.choice(len(pool), size=K, replace=False))]
        for method in ("procrustes", "ridge", "fm:contrastive"):
            mq = BM.fit_one(method, Dn[idx], Do[idx], None, None, 0)
            mc = BM.fit_one(method, Do[idx], Dn[idx], None, None, 0)
            rq = ret(BM.search(mq.apply(Qn, output="raw"), Do, 100), rel, native)
            cells = [f"{rq:.3f} / {ret(BM.search(Qn, mc.apply(Do, output='raw'), 100), rel, native):.3f}"]
            for k, tau in settings:
                fq, fc = knn_residual(mq, Dn[idx], Do[idx], k, tau), knn_residual(mc, Do[idx], Dn[idx], k, tau)
                cells.append(f"{ret(BM.search(fq(Qn), Do, 100), rel, native):.3f} / "
                             f"{ret(BM.search(Qn, fc(Do), 100), rel, native):.3f}")
            rows.append(f"| {len(idx)} | {method} | " + " | ".join(cells) + " |")
            print(rows[-1], flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, default=B.DEFAULT_CACHE)
    ap.add_argument("--lemma-pairs", action="store_true")
    ap.add_argument("--mlp", action="store_true")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--knn-residual", metavar="SET:OLD:NEW", default=None)
    ap.add_argument("--ks", type=int, nargs="+", default=[1000, 3000])
    a = ap.parse_args(argv)
    out: list[str] = []
    if a.lemma_pairs or a.mlp:
        data = BM.pair_data("wordnet", "minilm", "e5", a.cache)
        if data is None:
            raise SystemExit(f"wordnet:minilm:e5: {BM.missing_reason('wordnet', 'minilm', 'e5', a.cache)}")
        native = BM.retrieval_metrics(BM.search(data["Q_new"], data["D_new"], 100), data["relevant"])["R@10"]
        print(f"wordnet:minilm:e5: native new R@10 {native:.3f}", flush=True)
        if data["note"]:
            print(data["note"], flush=True)
            out += ["", data["note"]]
        if a.lemma_pairs:
            out += ["", "### Lemma pairs (wordnet:minilm:e5, retention of R@10)", ""]
            out += probe_lemma_pairs(data, a.cache, native)
        if a.mlp:
            out += ["", "### All pairs, linear vs residual MLP (wordnet:minilm:e5)", ""]
            out += probe_mlp(data, a.cache, native, a.epochs)
    if a.knn_residual:
        set_name, old, new = a.knn_residual.split(":")
        data = BM.pair_data(set_name, old, new, a.cache)
        if data is None:
            raise SystemExit(f"{a.knn_residual}: {BM.missing_reason(set_name, old, new, a.cache)}")
        native = BM.retrieval_metrics(BM.search(data["Q_new"], data["D_new"], 100), data["relevant"])["R@10"]
        if data["note"]:
            out += ["", data["note"]]
        out += ["", (f"### kNN residual correction ({a.knn_residual}, {data['n_docs']} docs, {data['n_queries']} "
                     f"queries, native new R@10 {native:.3f}; retention of R@10)"), ""]
        out += probe_knn_residual(data, native, a.ks)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
