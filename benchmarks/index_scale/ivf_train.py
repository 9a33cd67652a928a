"""IVF k-means sample size: training time, create time and recall@10 per ``train_rows = mult x nlist``.

    OMP_NUM_THREADS=1 python benchmarks/index_scale/ivf_train.py --rows 200000 --mults 32 64 128 256 --out r.json

Rows (``--rows`` of them, 384-d, unit length): real WordNet MiniLM rows mixed pairwise, ``a + w b + e`` with
``a, b`` drawn from 39,960 real rows, ``w ~ U(0, 0.5)`` and ``e ~ N(0, 0.01^2 I)``, then scaled to unit length, so
every row is distinct and keeps the real rows' topic structure. Queries: the other 1,000 real rows (never used
to make a row), so recall is measured on held-out points. Ground truth: exact top-10 by inner product
(``faiss.knn``). For each multiple the index is built as ``service.indexes.kinds.make_index`` builds it
(``nlist = default_nlist(n)``, ``nprobe = min(16, nlist)``, k-means seeded, sample ``rng.choice`` sorted; with
``--service`` through ``SpaceIndex.build(params={"train_rows": ..})`` itself), then every row is added and the
queries searched at the default ``nprobe``. Configurations run one after the other in one process (ratios carry
over, absolute seconds depend on the machine's load).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import faiss
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from service.limits import default_nlist

BASE = "/work/shared/data/wordnet/minilm.npy"


def make_rows(n: int, n_queries: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(X (n, 384), Q (n_queries, 384))`` float32 unit rows as the module notes describe."""
    base = np.load(BASE).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(base.shape[0])
    Q, pool = base[perm[:n_queries]], base[perm[n_queries:]]
    X = np.empty((n, base.shape[1]), np.float32)
    for s in range(0, n, 65536):
        m = min(65536, n - s)
        a, b = rng.integers(0, pool.shape[0], m), rng.integers(0, pool.shape[0], m)
        w = rng.uniform(0, 0.5, (m, 1)).astype(np.float32)
        block = pool[a] + w * pool[b] + rng.standard_normal((m, base.shape[1]), dtype=np.float32) * 0.01
        X[s:s + m] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return X, Q


def build_faiss(X: np.ndarray, nlist: int, train_rows: int, seed: int) -> tuple[faiss.IndexIVFFlat, dict]:
    """The IVF index ``make_index`` makes (unit rows: no scaling needed) trained on ``train_rows`` rows, then filled."""
    n, d = X.shape
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    T = X[np.sort(rng.choice(n, train_rows, replace=False))] if train_rows < n else X
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
    index.cp.seed = seed
    t1 = time.perf_counter()
    index.train(T)
    t2 = time.perf_counter()
    del T
    index.add_with_ids(X, np.arange(n, dtype=np.int64))
    t3 = time.perf_counter()
    return index, {"sample_s": round(t1 - t0, 2), "train_s": round(t2 - t1, 2), "add_s": round(t3 - t2, 2)}


def build_service(X: np.ndarray, nlist: int, train_rows: int, seed: int):
    from service.indexes import SpaceIndex

    t0 = time.perf_counter()
    idx = SpaceIndex.build("b", "s", X, more=[], kind="ivf", params={"nlist": nlist, "train_rows": train_rows},
                           random_state=seed)
    return idx.index, {"build_s": round(time.perf_counter() - t0, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--mults", type=int, nargs="+", default=[32, 64, 128, 256])
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--service", action="store_true", help="build through SpaceIndex.build (train_rows param)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    X, Q = make_rows(a.rows, a.queries, a.seed)
    nlist = default_nlist(a.rows)
    nprobe = min(16, nlist)
    t = time.perf_counter()
    _, I_exact = faiss.knn(Q, X, 10, metric=faiss.METRIC_INNER_PRODUCT)
    res = {"rows": a.rows, "nlist": nlist, "nprobe": nprobe, "queries": a.queries, "threads": faiss.omp_get_max_threads(),
           "exact_s": round(time.perf_counter() - t, 2), "runs": []}
    print(json.dumps({k: v for k, v in res.items() if k != "runs"}), flush=True)
    for mult in a.mults:
        train_rows = min(a.rows, mult * nlist)
        t = time.perf_counter()
        index, times = (build_service if a.service else build_faiss)(X, nlist, train_rows, a.seed)
        total = time.perf_counter() - t
        t = time.perf_counter()
        _, I = index.search(Q, 10, params=faiss.SearchParametersIVF(nprobe=nprobe))
        search_s = time.perf_counter() - t
        hits = sum(len(set(I[i]) & set(I_exact[i])) for i in range(Q.shape[0]))
        run = {"mult": mult, "train_rows": train_rows, **times, "create_s": round(total, 2),
               "search_s": round(search_s, 3), "recall@10": round(hits / (10 * Q.shape[0]), 4),
               "imbalance": round(index.invlists.imbalance_factor(), 3)}
        res["runs"].append(run)
        print(json.dumps(run), flush=True)
        del index
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
