"""Migration benchmark on labelled retrieval: how much of native re-embedding quality a map keeps.

Sets and embeddings come from ``benchmarks/build_retrieval_sets.py`` (cached outside git). For a
set and an encoder pair old → new (e.g. ``wordnet:minilm:e5``), with ``K`` corpus rows embedded
by both models (the fit pairs, drawn from the set's fit pool, never the evaluation documents):

- **native-new**: new-model queries over the new-model corpus (full re-embedding; the reference);
  native-old: old queries over the old corpus (for context).
- **corpus-side**: a map fitted old → new on the K pairs maps the whole old corpus into the new
  space; native new-model queries search it. (All rows are mapped, also the K re-embedded ones,
  so the figure measures the map alone.)
- **query-side** (Drift-Adapter): a map fitted new → old on the same pairs maps new-model queries
  into the untouched old index.
- **both** (score fusion, no new fit): the corpus-side and query-side maps of the same K, method
  and rows; a document's score is ``½ cos(q_new, f(d_old)) + ½ cos(g(q_new), d_old)`` (the old index
  is kept beside the mapped corpus; two searches per query, here one exact fused ranking).

- **+csls<w>** (``--csls-weights``): the corpus-side or query-side migrated index searched as the service's
  ``csls`` search answers (``csls_weight`` w, csls_k 10, top 10 re-ranked among the top 40 by cosine); MRR
  is then MRR@10, and its retention is of native-new MRR@10. Retention stays of plain native-new search.

Metrics per query (one relevant document, rank ``r`` among FAISS top-100, exact inner product on
unit rows): R@1, R@10, nDCG@10 = ``1/log2(1 + r)`` for ``r ≤ 10``, MRR@100 = ``1/r`` for
``r ≤ 100``; averaged over queries. **retention = migrated / native-new** (of R@10 unless said), with the
95 % paired bootstrap interval of the R@10 retention over the queries (``align.retrieval.retention_interval``:
how far the figure could move on another sample of as many queries; 600 queries leave it about ±0.01-0.02).
``µs/row`` is the wall time of ``map.apply(·, output="raw")`` per row on the evaluation queries
(the per-query cost in query-side mode; corpus-side pays it once per document, offline), beside a
plain ``Q @ W`` GEMM on the same rows.

Methods: ``procrustes`` (``align.fit_procrustes``), ``ridge`` (``align.fit_ridge``, λ chosen on
20 % held-out pairs by mean cosine), and each ``align.fit_migration`` method (``fm:<name>``),
when align has it (``fm:cluster``: per-cluster local maps, an ``align.ClusterMap``; its GEMM
reference is one cluster's (d_s, d_t) matrix). ``--apply-speed K`` adds a table of apply time
against a plain GEMM for the ridge map and the cluster map at blend 1–3. Row choice: ``random`` or ``kmeans++`` (``align.select_rows_to_embed`` on the
old corpus's fit pool). ``align.plan_migration`` (when present) predicts the retention from a
probe; its prediction is recorded next to the measured figure.

Results: printed tables, ``benchmarks/results/migration_<date>.md`` and ``.json`` (``--results DIR``: elsewhere; a
rerun with the same date resumes: finished cells are read back, not refitted; a run with another ``--seed`` needs
its own ``--out``). A WordNet set built from ``wordnet_sample.py``'s sample (no shared set) is said so above its tables
and in its pair's ``data``; such a run's default stem is ``migration_<date>_sample``, and cells of the other data
are never resumed.

Usage::

    python benchmarks/bench_migration.py                                   # all sets/pairs available
    python benchmarks/bench_migration.py --pairs wordnet:minilm:e5 --ks 300 1000 --methods procrustes ridge
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_v, "2")

import argparse
import datetime as _dt
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import align  # noqa: E402
import wordnet_sample
from build_retrieval_sets import DEFAULT_CACHE, corpus_dir, corpus_note, load_embeddings, load_set  # noqa: E402

RESULTS = HERE / "results"


def _commit() -> str | None:
    import subprocess

    try:
        return subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


COMMIT = _commit()
DEFAULT_PAIRS = ("wordnet:minilm:e5", "bible:minilm:e5", "wordnet:minilm:mpnet", "bible:minilm:mpnet")
DEFAULT_KS = (50, 100, 300, 1000, 3000, 10000)
MODES = ("corpus", "query")  # fitted modes; "both" fuses their two maps
TOPK = 100
RIDGE_ALPHAS = (0.01, 0.1, 1.0, 10.0)


# --- metrics --------------------------------------------------------------------------------------------

def unit(X: np.ndarray) -> np.ndarray:
    X = np.ascontiguousarray(X, dtype=np.float32)
    return X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12)


def search(Q: np.ndarray, D: np.ndarray, k: int = TOPK) -> np.ndarray:
    """Indices (q, k) of the ``k`` highest inner products of unit rows, exact (FAISS flat index)."""
    import faiss

    index = faiss.IndexFlatIP(D.shape[1])
    index.add(unit(D))
    _, I = index.search(unit(Q), min(k, D.shape[0]))
    return I


def fused_search(Q1: np.ndarray, D1: np.ndarray, Q2: np.ndarray, D2: np.ndarray, k: int = TOPK,
                 weight: float = 0.5, block: int = 256) -> np.ndarray:
    """Top ``k`` (q, k) by ``w cos(Q1_i, D1_j) + (1 - w) cos(Q2_i, D2_j)``, exact, in blocks of ``block`` queries
    (row ``j`` of D1 and D2 is the same document; never a full q × n score matrix)."""
    Q1, D1, Q2, D2 = unit(Q1), unit(D1), unit(Q2), unit(D2)
    k = min(k, D1.shape[0])
    out = np.empty((Q1.shape[0], k), dtype=np.int64)
    for s in range(0, Q1.shape[0], block):
        S = weight * (Q1[s : s + block] @ D1.T)
        S += (1.0 - weight) * (Q2[s : s + block] @ D2.T)
        top = np.argpartition(-S, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(S, top, axis=1), axis=1, kind="stable")
        out[s : s + block] = np.take_along_axis(top, order, axis=1)
    return out


def csls_search_service(Q: np.ndarray, D, weight: float, k: int = 10, csls_k: int = 10) -> np.ndarray:
    """Top ``k`` ids (q, k) as the service's ``csls`` search answers them: an exact cosine index of ``D``
    (``service.indexes.SpaceIndex``, kind flat) re-ranked by ``2 cos - r(q) - weight r(d)`` among its top
    ``max(4k, k + csls_k)`` candidates (``service.indexes.csls``). ``D`` may be such an index already
    (:func:`flat_index`), which keeps its cache of ``r(d)`` across calls."""
    idx = D if not isinstance(D, np.ndarray) else flat_index(D)
    return idx.search(np.ascontiguousarray(Q, dtype=np.float32), k, csls_k=csls_k, csls_weight=weight)[1]


def flat_index(D: np.ndarray):
    """``service.indexes.SpaceIndex`` of ``D`` (n, d), exact cosine (kind flat)."""
    from service.indexes import SpaceIndex

    return SpaceIndex.build("bench", "bench", np.ascontiguousarray(D, dtype=np.float32), kind="flat")


def ranks_from_topk(I: np.ndarray, relevant: np.ndarray) -> np.ndarray:
    """1-based rank of ``relevant[i]`` in row ``I[i]``; ``inf`` when it is not among the retrieved."""
    hit = I == np.asarray(relevant).reshape(-1, 1)
    r = np.full(I.shape[0], np.inf)
    rows, cols = np.nonzero(hit)
    r[rows] = cols + 1
    return r


def retrieval_metrics(I: np.ndarray, relevant: np.ndarray) -> dict:
    """R@1, R@10, nDCG@10, MRR@k (k = I.shape[1]) with one relevant document per query."""
    r = ranks_from_topk(I, relevant)
    return {"R@1": float(np.mean(r <= 1)), "R@10": float(np.mean(r <= 10)),
            "nDCG@10": float(np.mean(np.where(r <= 10, 1.0 / np.log2(1.0 + np.minimum(r, 1e9)), 0.0))),
            "MRR": float(np.mean(np.where(np.isfinite(r), 1.0 / np.minimum(r, 1e18), 0.0)))}


def retention(migrated: dict, native: dict) -> dict:
    return {f"ret_{k}": (migrated[k] / native[k] if native[k] > 0 else float("nan"))
            for k in ("R@1", "R@10", "nDCG@10", "MRR")}


def retention_ci(I: np.ndarray, I_native: np.ndarray, relevant: np.ndarray) -> list[float] | None:
    """95 % paired bootstrap interval of the R@10 retention over the queries
    (``align.retrieval.retention_interval``) from the migrated and native top-k lists."""
    from align.retrieval import retention_interval

    return retention_interval(ranks_from_topk(I, relevant) <= 10, ranks_from_topk(I_native, relevant) <= 10)


# --- data -----------------------------------------------------------------------------------------------

def pair_data(set_name: str, old: str, new: str, cache: Path) -> dict | None:
    """Corpus, queries and fit pool restricted to what both encoders embedded; None when the set is not built
    or either encoder's embeddings (or the WordNet data they reuse) are absent. ``note``: the set's
    ``corpus_note`` (the sample line, or ``""``)."""
    if not (Path(cache) / set_name / "set.json").is_file():
        return None
    spec = load_set(set_name, cache)
    eo, en = load_embeddings(set_name, old, cache), load_embeddings(set_name, new, cache)
    if eo is None or en is None:
        return None
    rows_o, Do, qi_o, Qo = eo
    rows_n, Dn, qi_n, Qn = en
    common = np.intersect1d(rows_o, rows_n)
    pos_o = {int(r): i for i, r in enumerate(rows_o)}
    pos_n = {int(r): i for i, r in enumerate(rows_n)}
    Do = Do[[pos_o[int(r)] for r in common]]
    Dn = Dn[[pos_n[int(r)] for r in common]]
    doc_pos = {int(r): i for i, r in enumerate(common)}
    qdoc = np.asarray(spec["query_doc"])
    qo_pos = {int(q): i for i, q in enumerate(qi_o)}
    qn_pos = {int(q): i for i, q in enumerate(qi_n)}
    qs = [int(q) for q in qi_n if int(q) in qo_pos and int(qdoc[q]) in doc_pos]
    pool = np.asarray([doc_pos[int(r)] for r in spec["fit_pool"] if int(r) in doc_pos])
    return {"D_old": Do, "D_new": Dn, "Q_old": Qo[[qo_pos[q] for q in qs]], "Q_new": Qn[[qn_pos[q] for q in qs]],
            "relevant": np.asarray([doc_pos[int(qdoc[q])] for q in qs]), "pool": pool,
            "n_docs": int(len(common)), "n_queries": len(qs), "n_pool": int(len(pool)), "note": corpus_note(spec)}


def set_note(set_name: str, cache: Path) -> str:
    """``corpus_note`` of a cached set (``""`` when it is not built)."""
    path = Path(cache) / set_name / "set.json"
    return corpus_note(json.loads(path.read_text())) if path.is_file() else ""


def missing_reason(set_name: str, old: str, new: str, cache: Path) -> str:
    """Why :func:`pair_data` found nothing, and what to run."""
    build = f"run build_retrieval_sets.py --sets {set_name} --encoders {old} {new}"
    path = Path(cache) / set_name / "set.json"
    if set_name.startswith("wordnet") and path.is_file():
        where = corpus_dir(json.loads(path.read_text()))
        if not wordnet_sample.shared_available(shared=where):
            return (f"the set was built from the WordNet data in {where}, absent now: {build} under another --cache "
                    "(without the shared set it embeds a sample)")
    return f"embeddings missing ({build})"


# --- fitting --------------------------------------------------------------------------------------------

def fit_ridge_cv(X: np.ndarray, Y: np.ndarray, random_state: int = 0):
    """``align.fit_ridge`` with λ from ``RIDGE_ALPHAS`` chosen by mean held-out cosine (20 % of pairs)."""
    rng = np.random.default_rng(random_state)
    perm = rng.permutation(X.shape[0])
    n_val = max(2, X.shape[0] // 5)
    val, tr = perm[:n_val], perm[n_val:]
    best, best_cos = RIDGE_ALPHAS[0], -np.inf
    if len(tr) >= 2:
        for a in RIDGE_ALPHAS:
            m = align.fit_ridge(X[tr], Y[tr], alpha=a)
            c = float(np.mean(np.sum(m.apply(X[val], output="raw") * unit(Y[val]), axis=1)))
            if c > best_cos:
                best, best_cos = a, c
    m = align.fit_ridge(X, Y, alpha=best)
    m.metadata["alpha_chosen"] = best
    return m


def fit_one(method: str, X: np.ndarray, Y: np.ndarray, unpaired_source, unpaired_target, seed: int):
    if method == "procrustes":
        return align.fit_procrustes(X, Y)
    if method == "ridge":
        return fit_ridge_cv(X, Y, seed)
    if method.startswith("fm:"):
        return align.fit_migration(X, Y, method=method[3:], unpaired_source=unpaired_source,
                                   unpaired_target=unpaired_target, random_state=seed)
    raise SystemExit(f"unknown method {method!r}")


def available_methods() -> list[str]:
    out = ["procrustes", "ridge"]
    if hasattr(align, "fit_migration"):
        from align.migration import MIGRATION_METHODS

        out += [f"fm:{m}" for m in MIGRATION_METHODS]
    return out


def choose_rows(X_pool: np.ndarray, k: int, sampling: str, seed: int) -> np.ndarray:
    """Positions (k,) in the pool: uniform, or coverage (``align.select_rows_to_embed``)."""
    if sampling == "random":
        return np.sort(np.random.default_rng(seed).choice(X_pool.shape[0], size=k, replace=False))
    if not hasattr(align, "select_rows_to_embed"):
        raise SystemExit("coverage sampling needs align.select_rows_to_embed")
    return np.asarray(align.select_rows_to_embed(X_pool, k, method=sampling, random_state=seed))


def plain_W(m) -> np.ndarray:
    """The (d_s, d_t) matrix of a plain GEMM of the same shape as the map (one cluster's map for a ClusterMap)."""
    W = np.asarray(m.W, dtype=np.float32)
    return np.ascontiguousarray(W if W.ndim == 2 else W[0])


def time_apply(m, Q: np.ndarray, repeats: int = 3) -> tuple[float, float]:
    """(µs per row of ``m.apply(Q, output="raw")``, µs per row of a plain ``Q @ W``), best of ``repeats``."""
    Q = np.ascontiguousarray(Q, dtype=np.float32)
    W = plain_W(m)
    best_m = best_g = np.inf
    for _ in range(repeats):
        t = time.perf_counter()
        m.apply(Q, output="raw")
        best_m = min(best_m, time.perf_counter() - t)
        t = time.perf_counter()
        Q @ W
        best_g = min(best_g, time.perf_counter() - t)
    return 1e6 * best_m / len(Q), 1e6 * best_g / len(Q)


# --- one pair ---------------------------------------------------------------------------------------------

def run_pair(key: str, data: dict, *, ks, methods, samplings, seed: int, done: dict, save, log=print,
             csls_weights=()) -> dict:
    """Evaluate every (sampling, K, mode, method) cell of one pair; ``done`` holds finished cells.

    ``csls_weights``: also search each migrated index (corpus-side: the mapped corpus with native
    queries; query-side: the old corpus with mapped queries) as the service's ``csls`` search does
    with each ``csls_weight`` (:func:`csls_search_service`, top 10), as modes ``corpus+csls<w>`` /
    ``query+csls<w>``; their retention is still of plain native-new search (re-embedding), and
    ``native_new_csls`` records native-new searched the same way."""
    Do, Dn, Qo, Qn, rel = data["D_old"], data["D_new"], data["Q_old"], data["Q_new"], data["relevant"]
    I_native = search(Qn, Dn)
    native_new = retrieval_metrics(I_native, rel)
    native_new_10 = retrieval_metrics(I_native[:, :10], rel)  # csls cells rank 10: MRR@10 over native MRR@10
    native_old = retrieval_metrics(search(Qo, Do), rel)
    cells = done.setdefault("cells", {})
    done.update({"native_new": native_new, "native_old": native_old, "n_docs": data["n_docs"],
                 "n_queries": data["n_queries"], "n_pool": data["n_pool"]})
    old_index = flat_index(Do) if csls_weights else None  # query-side: one old index (and its r(d)) for every cell
    new_index = flat_index(Dn) if csls_weights else None  # native: one index, its r(d) shared by the weights
    for w in csls_weights:
        done.setdefault("native_new_csls", {})[f"{w:g}"] = retrieval_metrics(csls_search_service(Qn, new_index, w),
                                                                             rel)
    log(f"\n{key}: {data['n_docs']} docs, {data['n_queries']} queries, pool {data['n_pool']}; native-new "
        f"R@10 {native_new['R@10']:.3f} MRR {native_new['MRR']:.3f}; native-old R@10 {native_old['R@10']:.3f}")
    pool = data["pool"]
    for sampling in samplings:
        for k in ks:
            if k > len(pool):
                continue
            idx = None
            mapped: dict = {}  # method -> {"corpus": mapped old corpus, "query": mapped new queries}
            for mode in MODES:
                for method in methods:
                    cell = f"{sampling}|{k}|{mode}|{method}"
                    if cell in cells:
                        continue
                    if idx is None:
                        t = time.perf_counter()
                        idx = pool[choose_rows(Do[pool], k, sampling, seed)]
                        t_select = time.perf_counter() - t
                    if mode == "corpus":
                        X, Y, up_s, up_t = Do[idx], Dn[idx], Do, None
                    else:
                        X, Y, up_s, up_t = Dn[idx], Do[idx], None, Do
                    t = time.perf_counter()
                    try:
                        m = fit_one(method, X, Y, up_s, up_t, seed)
                    except Exception as exc:  # a method may refuse tiny K: record, go on
                        cells[cell] = {"error": f"{type(exc).__name__}: {exc}"}
                        log(f"  {cell}: {cells[cell]['error']}")
                        save()
                        continue
                    fit_s = time.perf_counter() - t
                    if mode == "corpus":
                        mapped[method] = {"corpus": m.apply(Do, output="raw")}
                        I = search(Qn, mapped[method]["corpus"])
                    else:
                        mapped.setdefault(method, {})["query"] = m.apply(Qn, output="raw")
                        I = search(mapped[method]["query"], Do)
                    met = retrieval_metrics(I, rel)
                    us, us_gemm = time_apply(m, Qn if mode == "query" else Do[: len(Qn)])
                    cells[cell] = {**met, **retention(met, native_new), "ret_R@10_ci": retention_ci(I, I_native, rel),
                                   "fit_s": fit_s, "select_s": t_select,
                                   "us_per_row": us, "us_per_row_gemm": us_gemm,
                                   "chosen": m.metadata.get("method"), "alpha": m.metadata.get("alpha_chosen"),
                                   "commit": COMMIT}
                    log(f"  {sampling:8s} K={k:<5d} {mode:6s} {method:16s} R@10 {met['R@10']:.3f} "
                        f"ret {cells[cell]['ret_R@10']:.3f}  fit {fit_s:6.1f}s  {us:5.2f} µs/row "
                        f"[{cells[cell]['chosen']}]")
                    save()
            for method, mp in mapped.items():  # each migrated index searched as the service's csls search does
                for mode, (Qs, Ds) in (("corpus", (Qn, mp.get("corpus"))), ("query", (mp.get("query"), old_index))):
                    todo = [w for w in csls_weights if f"{sampling}|{k}|{mode}+csls{w:g}|{method}" not in cells]
                    if not todo or Qs is None or Ds is None:
                        continue
                    Ds = flat_index(Ds) if isinstance(Ds, np.ndarray) else Ds  # one index (and r(d)) per weight
                    for w in todo:
                        cell = f"{sampling}|{k}|{mode}+csls{w:g}|{method}"
                        I = csls_search_service(Qs, Ds, w)
                        met = retrieval_metrics(I, rel)
                        plain = cells[f"{sampling}|{k}|{mode}|{method}"]
                        cells[cell] = {**met, **retention(met, native_new_10),
                                       "ret_R@10_ci": retention_ci(I, I_native, rel),
                                       "fit_s": plain["fit_s"], "select_s": plain["select_s"],
                                       "us_per_row": None, "us_per_row_gemm": None, "chosen": plain["chosen"],
                                       "alpha": plain.get("alpha"), "commit": COMMIT}
                        log(f"  {sampling:8s} K={k:<5d} {mode}+csls{w:g} {method:16s} R@10 {met['R@10']:.3f} "
                            f"ret {cells[cell]['ret_R@10']:.3f}")
                        save()
            for method, mp in mapped.items():  # both sides: the two maps of this K, scores fused
                cell = f"{sampling}|{k}|both|{method}"
                if cell in cells or len(mp) < 2:
                    continue
                I = fused_search(Qn, mp["corpus"], mp["query"], Do)
                met = retrieval_metrics(I, rel)
                q, c = cells[f"{sampling}|{k}|query|{method}"], cells[f"{sampling}|{k}|corpus|{method}"]
                cells[cell] = {**met, **retention(met, native_new), "ret_R@10_ci": retention_ci(I, I_native, rel),
                               "fit_s": q["fit_s"] + c["fit_s"],
                               "select_s": c["select_s"], "us_per_row": q["us_per_row"],
                               "us_per_row_gemm": q["us_per_row_gemm"], "chosen": f"{c['chosen']}+{q['chosen']}",
                               "alpha": None, "commit": COMMIT}
                log(f"  {sampling:8s} K={k:<5d} both   {method:16s} R@10 {met['R@10']:.3f} ret {cells[cell]['ret_R@10']:.3f}")
                save()
    return done


def apply_speed(data: dict, k: int, seed: int, rows: int = 8192, repeats: int = 7) -> dict:
    """µs per row of ``apply(output="raw")`` on ``rows`` old-corpus rows, best of ``repeats`` (interleaved):
    the ridge LinearMap and ``fm:cluster`` fitted on ``k`` random pairs (corpus-side) at blend 1, 2, 3,
    each beside a plain ``X @ W`` GEMM of the same shape; ratio = GEMM time / apply time (1 = as fast)."""
    Do, Dn, pool = data["D_old"], data["D_new"], data["pool"]
    idx = pool[choose_rows(Do[pool], k, "random", seed)]
    lin = fit_one("fm:ridge", Do[idx], Dn[idx], Do, None, seed)
    cm = fit_one("fm:cluster", Do[idx], Dn[idx], Do, None, seed)
    maps = {"ridge LinearMap": lin}
    for b in (1, 2, 3):
        maps[f"cluster blend={b}"] = align.ClusterMap(cm.centroids, cm.W, cm.bias, cm.source_frame, cm.target_frame,
                                                      blend=b, temperature=cm.temperature)
    X = np.ascontiguousarray(Do[:rows], dtype=np.float32)
    rows = X.shape[0]
    W = plain_W(lin)
    best = {name: np.inf for name in maps}
    best_g = np.inf
    for _ in range(repeats):
        for name, m in maps.items():
            t = time.perf_counter()
            m.apply(X, output="raw")
            best[name] = min(best[name], time.perf_counter() - t)
        t = time.perf_counter()
        X @ W
        best_g = min(best_g, time.perf_counter() - t)
    return {"k": k, "rows": rows, "n_clusters": cm.n_clusters, "chosen_blend": cm.blend,
            "gemm_us": 1e6 * best_g / rows,
            "maps": {name: {"us": 1e6 * t / rows, "ratio": best_g / t} for name, t in best.items()}}


# --- plan vs measured ---------------------------------------------------------------------------------------

def plan_prediction(data: dict, k_probe: int, seed: int, n_queries: int = 0) -> dict | None:
    """``align.plan_migration`` on the old fit pool plus a ``k_probe``-pair probe (when align has it).

    ``n_queries > 0``: the plan gets that many labelled queries (new and old model) drawn from the set's, the
    probe holds their relevant documents plus pool rows up to ``k_probe``, and the corpus is every document
    (the labelled prediction is for the whole corpus the benchmark measures). Kept: alignability, predicted
    retention per K (with its interval), the recommendation; not the row indices."""
    if not hasattr(align, "plan_migration"):
        return None
    pool = data["pool"]
    rng = np.random.default_rng(seed + 1)
    if n_queries:
        qi = rng.choice(data["n_queries"], size=min(n_queries, data["n_queries"]), replace=False)
        need = np.unique(data["relevant"][qi])
        fill = rng.choice(np.setdiff1d(pool, need), size=max(0, min(k_probe, len(pool)) - need.size), replace=False)
        probe = np.sort(np.concatenate([need, fill]))
        corpus, drop = data["D_old"], ("rows_to_embed",)  # the labelled curve is kept: its points are measurements
        labels = {"queries": data["Q_new"][qi], "old_queries": data["Q_old"][qi],
                  "relevant": np.searchsorted(probe, data["relevant"][qi])}
    else:
        probe = pool[rng.choice(len(pool), size=min(k_probe, len(pool)), replace=False)]
        corpus, drop, labels = data["D_old"][pool], ("rows_to_embed", "curve"), {}
    t = time.perf_counter()
    plan = align.plan_migration(corpus, data["D_old"][probe], data["D_new"][probe], random_state=seed, **labels)
    keep = {k: v for k, v in plan.items() if k not in drop}
    keep["plan_s"] = time.perf_counter() - t
    return keep


def plan_vs_measured(res: dict) -> list[str]:
    """Rows ``K | predicted [low, high] | measured corpus-side retention of R@10`` (random rows), with the gap to
    the plan's own method at that K (the one its forecast is of) and to the best measured method."""
    pred = res["plan"].get("predicted") or {}
    own = res["plan"].get("best_method")
    items = pred.items() if isinstance(pred, dict) else [(p.get("k"), p) for p in pred]
    lines = ["| K | predicted | interval | measured procrustes | measured ridge | |pred − plan's method| | "
             "best measured (any method) | |pred − best| |",
             "|---|---|---|---|---|---|---|---|"]
    for k, p in items:
        k = int(k)
        cell = lambda meth: res["cells"].get(f"random|{k}|corpus|{meth}", {}).get("ret_R@10")  # noqa: E731
        measured = [c.get("ret_R@10") for key, c in res["cells"].items()
                    if key.startswith(f"random|{k}|corpus|") and "ret_R@10" in c]
        best = max(measured) if measured else None
        r = p.get("retention") if isinstance(p, dict) else p
        lo, hi = (p.get("low"), p.get("high")) if isinstance(p, dict) else (None, None)
        gap = abs(r - best) if (r is not None and best is not None) else None
        meth = p.get("method", own) if isinstance(p, dict) else own  # each K's own method (plans since 2026-12-03)
        mine = cell(meth) if meth else None
        gap_own = abs(r - mine) if (r is not None and mine is not None) else None
        lines.append(f"| {k} | {fmt(r)} | [{fmt(lo)}, {fmt(hi)}] | {fmt(cell('procrustes'))} | {fmt(cell('ridge'))} | "
                     f"{fmt(gap_own)} ({meth or '—'}) | {fmt(best)} | {fmt(gap)} |")
    return lines


# --- tables ---------------------------------------------------------------------------------------------------

def fmt(x, nd=3) -> str:
    return "—" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:.{nd}f}"


def fmt_interval(iv) -> str:
    """``[lo, hi]`` to 3 decimals; ``—`` for cells measured before intervals were recorded (or undefined)."""
    return "—" if not iv else f"[{iv[0]:.3f}, {iv[1]:.3f}]"


def tables(results: dict) -> str:
    out = []
    for key, res in results["pairs"].items():
        nn, no = res["native_new"], res["native_old"]
        out.append(f"\n### {key}  ({res['n_docs']} docs, {res['n_queries']} queries, fit pool {res['n_pool']})\n")
        if res.get("data"):
            out.append(f"{res['data']}\n")
        out.append("| reference | R@1 | R@10 | nDCG@10 | MRR@100 |\n|---|---|---|---|---|")
        out.append(f"| native new | {fmt(nn['R@1'])} | {fmt(nn['R@10'])} | {fmt(nn['nDCG@10'])} | {fmt(nn['MRR'])} |")
        out.append(f"| native old | {fmt(no['R@1'])} | {fmt(no['R@10'])} | {fmt(no['nDCG@10'])} | {fmt(no['MRR'])} |")
        for w, m in (res.get("native_new_csls") or {}).items():
            out.append(f"| native new, csls_weight {w} (top 10) | {fmt(m['R@1'])} | {fmt(m['R@10'])} | "
                       f"{fmt(m['nDCG@10'])} | {fmt(m['MRR'])} |")
        cells = res["cells"]
        ks = sorted({int(c.split("|")[1]) for c in cells})
        combos = []
        for c in cells:
            s, _, mode, meth = c.split("|")
            if (mode, meth, s) not in combos:
                combos.append((mode, meth, s))
        combos.sort()
        keep = fmt(retention(no, nn)["ret_R@10"])
        out.append(f"\nRetention of R@10 (migrated / native-new) by K pairs (keeping the old model: {keep}; a "
                   f"migration below that is worse than not migrating):\n")
        out.append("| mode | method | rows | " + " | ".join(f"K={k}" for k in ks) + " |")
        out.append("|---|---|---|" + "---|" * len(ks))
        for mode, meth, s in combos:
            vals = [cells.get(f"{s}|{k}|{mode}|{meth}", {}).get("ret_R@10") for k in ks]
            out.append(f"| {mode} | {meth} | {s} | " + " | ".join(fmt(v) for v in vals) + " |")
        out.append("\nAll metrics (retention = of native-new; µs/row: map.apply raw vs plain GEMM):\n")
        out.append("| mode | method | rows | K | R@1 | R@10 | nDCG@10 | MRR | ret R@10 | 95% interval | ret nDCG | ret MRR |"
                   " fit s | µs/row | GEMM µs/row | chosen |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for mode, meth, s in combos:
            for k in ks:
                c = cells.get(f"{s}|{k}|{mode}|{meth}")
                if not c:
                    continue
                if "error" in c:
                    out.append(f"| {mode} | {meth} | {s} | {k} | error: {c['error'][:60]} |" + " |" * 11)
                    continue
                out.append(f"| {mode} | {meth} | {s} | {k} | {fmt(c['R@1'])} | {fmt(c['R@10'])} | {fmt(c['nDCG@10'])} | "
                           f"{fmt(c['MRR'])} | {fmt(c['ret_R@10'])} | {fmt_interval(c.get('ret_R@10_ci'))} | "
                           f"{fmt(c['ret_nDCG@10'])} | {fmt(c['ret_MRR'])} | "
                           f"{fmt(c['fit_s'], 1)} | {fmt(c['us_per_row'], 2)} | {fmt(c['us_per_row_gemm'], 2)} | "
                           f"{c.get('chosen') or ''} |")
        if res.get("apply_speed"):
            sp = res["apply_speed"]
            out.append(f"\nApply speed (`output=\"raw\"`, {sp['rows']} rows, best of 7, interleaved; maps fitted on "
                       f"K={sp['k']} corpus-side pairs, {sp['n_clusters']} clusters, chosen blend {sp['chosen_blend']}); "
                       f"plain GEMM {fmt(sp['gemm_us'], 2)} µs/row:\n")
            out.append("| map | µs/row | GEMM time / apply time |\n|---|---|---|")
            for name, v in sp["maps"].items():
                out.append(f"| {name} | {fmt(v['us'], 2)} | {fmt(v['ratio'], 2)} |")
        if res.get("plan"):
            pl = res["plan"]
            lab = f", {pl['plan_queries']} labelled queries ({pl.get('metric')})" if pl.get("plan_queries") else ""
            out.append(f"\nPlan before the fit (`align.plan_migration`, probe {pl.get('probe_pairs')} pairs from the fit "
                       f"pool{lab}): alignability {fmt(pl.get('alignability'))}, recommended {pl.get('recommended')}. "
                       "Predicted retention vs measured corpus-side retention of R@10 (random rows):\n")
            out.extend(plan_vs_measured(res))
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", nargs="+", default=list(DEFAULT_PAIRS), help="set:old:new")
    ap.add_argument("--ks", nargs="+", type=int, default=list(DEFAULT_KS))
    ap.add_argument("--methods", nargs="+", default=None, help="default: all available")
    ap.add_argument("--samplings", nargs="+", default=["random", "kmeans++"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--probe", type=int, default=500, help="pairs in the plan probe")
    ap.add_argument("--no-plan", action="store_true", help="skip align.plan_migration")
    ap.add_argument("--plan-queries", type=int, default=0, metavar="N",
                    help="give the plan N labelled queries (its probe then holds their relevant documents)")
    ap.add_argument("--apply-speed", type=int, default=0, metavar="K",
                    help="also time apply of the ridge and cluster maps fitted on K pairs against a plain GEMM")
    ap.add_argument("--out", type=str, default=None, help="result stem (default migration_<date>, a sample's _sample)")
    ap.add_argument("--results", type=Path, default=RESULTS, help="folder for the result files (default %(default)s)")
    ap.add_argument("--csls-weights", nargs="*", type=float, default=[],
                    help="also search the migrated indexes as the service's csls search does, with these csls_weight")
    a = ap.parse_args(argv)
    methods = a.methods or available_methods()
    sample = any(set_note(key.split(":")[0], a.cache) for key in a.pairs)
    stem = a.out or f"migration_{_dt.date.today().isoformat()}{'_sample' if sample else ''}"
    a.results.mkdir(parents=True, exist_ok=True)
    jpath, mpath = a.results / f"{stem}.json", a.results / f"{stem}.md"
    results = json.loads(jpath.read_text()) if jpath.is_file() else {"pairs": {}}
    before = results.get("env") or {}
    if results["pairs"] and "seed" in before and before["seed"] != a.seed:  # resuming reuses every finished cell
        raise SystemExit(f"{jpath} holds cells made with --seed {before['seed']} (this run: --seed {a.seed}); "
                         "resuming would report them as this seed's: give this run its own --out")
    results["env"] = {"python": platform.python_version(), "machine": platform.machine(), "seed": a.seed,
                      "threads": os.environ.get("OMP_NUM_THREADS"), "cache": str(a.cache)}

    def save():
        tmp = jpath.with_suffix(".tmp")
        tmp.write_text(json.dumps(results, indent=1, default=float))
        os.replace(tmp, jpath)

    measured = []
    for key in a.pairs:
        set_name, old, new = key.split(":")
        data = pair_data(set_name, old, new, a.cache)
        if data is None:
            print(f"{key}: {missing_reason(set_name, old, new, a.cache)}; skipped")
            continue
        measured.append(key)
        res = results["pairs"].setdefault(key, {})
        note = data.get("note", "")
        if res.get("cells") and res.get("data", "") != note:  # resuming would mix two corpora
            raise SystemExit(f"{jpath} holds {key} cells measured on other data ({res.get('data') or 'the shared set'}"
                             f"; this run: {note or 'the shared set'}): give this run its own --out")
        if note:
            res["data"] = note
            print(f"{key}: {note}")
        run_pair(key, data, ks=a.ks, methods=methods, samplings=a.samplings, seed=a.seed, done=res, save=save,
                 csls_weights=a.csls_weights)
        if a.apply_speed and "apply_speed" not in res and hasattr(align, "ClusterMap"):
            res["apply_speed"] = apply_speed(data, min(a.apply_speed, data["n_pool"]), a.seed)
            save()
        if "plan" not in res and not a.no_plan:
            plan = plan_prediction(data, a.probe, a.seed, a.plan_queries)
            if plan is not None:
                res["plan"] = {"probe_pairs": a.probe, "plan_queries": a.plan_queries, **plan}
        save()
    if not measured:  # every pair skipped: nothing to report, and an older report of today stays as it was
        print(f"nothing measured: every pair was skipped (reasons above); {mpath} and {jpath} not written")
        return 1
    text = ("# Migration benchmark: labelled retrieval retention\n\nMade by `benchmarks/bench_migration.py` "
            f"({_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC); sets from "
            "`benchmarks/build_retrieval_sets.py`. See the script docstring for definitions.\n" + tables(results))
    mpath.write_text(text + "\n")
    print(tables(results))
    print(f"\nwrote {mpath} and {jpath}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
