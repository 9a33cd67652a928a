r"""Retrieval scores of a migration map on held-out pairs (what a migrated index feels).

Held-out pair ``i`` is ``(x_i, y_i)``: the same text under the old and the new model. ``M`` (n, d)
are the mapped old rows, ``T`` (n, d) the native new rows, both unit, in the new model's raw
space (``map.apply(X, output="raw")`` and ``unit(Y)``). Three views, all blocked (FAISS or
numpy blocks through :func:`align.knn` / :func:`align.metrics.ranks`, never n × n):

- **corpus-side** (the migrated index): native query ``t_i`` ranks the mapped rows ``M``; the hit
  is ``m_i``. ``corpus_recall@k``, ``corpus_mrr``.
- **query-side** (Drift-Adapter): mapped query ``m_i`` ranks the native rows ``T``; the hit is ``t_i``.
  ``query_recall@k``, ``query_mrr``.
- **nn_retention@k**: native query ``t_i``, relevant = its native nearest other row ``t_j``;
  recall@k of ``m_j`` among the mapped rows (plus the mapped distractors) over the native recall
  — simulated labelled retention (:func:`nn_retention`).
- **neighbourhood overlap@k** (does not saturate on identical texts): for native query ``t_i``,
  the share of its native top-``k`` among ``T \ {t_i}`` that the mapped index ``M \ {m_i}``
  also returns in its top-``k`` (indices compared; the proxy of labelled retention: a
  relevant document that is near the query natively should stay near after the migration).

**Labelled retrieval** (:func:`labelled_retrieval`): real queries with one known relevant document
each, ranked in a migrated and in a native index of the same documents; R@1, R@k, nDCG@k, MRR and
their **retention** = migrated / native (what ``benchmarks/bench_migration.py`` reports and
``vecbridge eval --queries --relevant --min-retention`` gates on), with a paired bootstrap interval of
the R@k retention over the queries (:func:`retention_interval`: a few hundred labelled queries leave
it a few points wide, so a gate or goal inside it is not decided by them).

``score`` (used by ``fit_migration(method="auto")``) is the mean of ``corpus_mrr``,
``query_mrr`` and ``overlap@k``: the MRRs separate maps while recall@10 is saturated, the
overlap tracks what a user sees in the top-10.
"""

from __future__ import annotations

import numpy as np

from .blocks import rows_per_block
from .exceptions import InputError, PairCountError
from .knn import knn
from .metrics import INTERVAL_LEVEL, count_above, proportion_interval, ranks
from .validation import check_random_state

__all__ = ["pair_retrieval_scores", "neighbour_overlap", "overlap_without_self", "nn_retention", "nn_retention_hits",
           "relevant_ranks", "labelled_metrics", "labelled_retrieval", "retention_interval", "hubness",
           "chance_p_value", "expected_hits", "CHANCE_LEVEL", "MIN_NATIVE_HITS"]

INTERVAL_RESAMPLES = 2000  # bootstrap resamples behind it
#: a figure that a random ranking reaches at least this often says nothing: its gate can be neither passed nor failed
CHANCE_LEVEL = 0.01
#: a retention (migrated / native hits) over fewer native hits than this says nothing, whatever its ratio: 2 of 2
#: kept read 1.0 and decided a 0.9 gate. A rule on the counts, not on the bootstrap interval's width (the same hits
#: were refused or judged by the bootstrap's seed). 5, the binomial's usual floor for any normal reading of a share:
#: 6,000 draws of 50-200 queries at native R@10 0.3-0.9 never fall below it (their fewest: 12 hits; expected
#: refusals over all 6,000 about 0.0006)
MIN_NATIVE_HITS = 5


def chance_p_value(hits: int, trials: int, rate: float) -> float:
    """How often a random ranking scores at least ``hits`` of ``trials`` queries when each is a hit with probability
    ``rate`` (the binomial upper tail; ``rate`` of a top-k among n candidates: ``k / n``, at most 1)."""
    from scipy.stats import binom

    if int(hits) <= 0:
        return 1.0
    return float(binom.sf(int(hits) - 1, int(trials), min(1.0, max(0.0, float(rate)))))


def expected_hits(trials: int, rate: float) -> str:
    """``trials * rate`` as words print it: 2 significant digits below 1 (0.0033, never "0.0"), else one decimal."""
    x = int(trials) * min(1.0, max(0.0, float(rate)))
    return f"{x:.2g}" if x < 1 else f"{x:.1f}"


def _undecided(h_nat: int, q: int, n: int, k: int) -> str | None:
    """Why the R@k retention of ``h_nat`` native hits among ``q`` queries over ``n`` documents cannot decide a gate
    (None: it can); of the counts alone. At chance (a query-side map evaluated corpus-side, or query files given the
    wrong way round: native R@10 10 of 2,999, retention 2.0 in 0.2-7.0, a PASS), or fewer than
    :data:`MIN_NATIVE_HITS` native hits."""
    if h_nat == 0:
        return f"it is undefined: no query finds its relevant document in the native top {k}"
    p = chance_p_value(h_nat, q, k / n)
    if p >= CHANCE_LEVEL:
        return (f"the native R@{k} ({h_nat} of {q} queries) is no better than a random ranking of the {n} documents "
                f"gives ({expected_hits(q, k / n)} hits expected; as many or more {p:.0%} of the time)")
    if h_nat < MIN_NATIVE_HITS:
        return (f"it is a ratio over {h_nat} native hit{'s' if h_nat > 1 else ''} of {q} queries, fewer than the "
                f"{MIN_NATIVE_HITS} a retention needs to say anything")
    return None


def overlap_without_self(Ia: np.ndarray, Ib: np.ndarray, k: int, ids=None) -> float:
    """Mean ``|top-k(a) ∩ top-k(b)| / k`` of two (q, ≥ k+1) neighbour lists, row ``ids[i]`` (default ``i``) dropped
    from row ``i``'s lists (the query's own row)."""
    ids = np.arange(Ia.shape[0]) if ids is None else ids
    total = 0.0
    for i in range(Ia.shape[0]):
        a = Ia[i][Ia[i] != ids[i]][:k]
        b = Ib[i][Ib[i] != ids[i]][:k]
        total += np.intersect1d(a, b).size / k
    return float(total / Ia.shape[0])


def _hits(T: np.ndarray, C: np.ndarray, rel: np.ndarray, k: int, ids: np.ndarray) -> np.ndarray:
    """Whether ``rel[i]`` is among the top-``k`` rows of ``C`` for query ``T[i]`` (q, d), its own row ``ids[i]``
    skipped; (q,) bool."""
    _, I = knn(T, C, k + 1)
    return np.array([rel[i] in I[i][I[i] != ids[i]][:k] for i in range(T.shape[0])])


def _queries(T: np.ndarray, rows) -> tuple[np.ndarray, np.ndarray]:
    """The query rows of ``T`` (n, d) and their ids: all of them (``rows`` None), or ``T[rows]`` and ``rows``."""
    return (T, np.arange(T.shape[0])) if rows is None else (T[rows], np.asarray(rows, dtype=np.int64))


def nn_retention(T: np.ndarray, M: np.ndarray, k: int = 10, *, extra_M: np.ndarray | None = None,
                 rows=None) -> float:
    r"""Simulated labelled retention: recall@k of a mapped index over recall@k of the native one.

    Native query ``t_i`` (row of ``T`` (n, d)), relevant document: its native nearest other row
    ``t_j``. Mapped index: ``M \ {m_i}`` plus ``extra_M`` (p, d), the rest of the mapped corpus;
    native index: ``T \ {t_i}`` plus the same ``extra_M`` standing in for the rest of the native
    corpus (its native vectors are not known). Returns hits(mapped) / hits(native). Without
    ``extra_M`` the native recall is 1 and this is the mapped recall alone; distractors make the
    figure depend on corpus size as labelled retrieval does (measured on the WordNet reverse
    dictionary, minilm→e5 ridge: 8,192 distractors give 0.32 / 0.62 for a labelled 0.28 / 0.51
    at K = 300 / 2,000; without distractors 0.55 / 0.72).

    With ``extra_M`` it can exceed 1, and is then no retention: the stand-in distractors are mapped rows, which
    compete on even terms with the mapped relevant rows but can outrank native rows more than the corpus's native
    vectors would, so the native recall is understated (WordNet minilm→paraphrase-L3, ridge from 10,000 pairs, 500
    queries, 8,192 distractors: 1.06-1.23, native recall 0.23-0.27 against the mapped distractors and 0.42-0.47
    against the same rows' native vectors, the ratio then 0.61-0.69). :func:`align.plan_migration` says so in a
    note when a point of its learning curve exceeds 1.

    ``rows`` (q,): only these native rows are queries (a sample, :func:`align.metrics.query_sample`); their
    relevant rows and the candidates are still all of ``T`` / ``M``. Cost ``q · n · d`` per search.
    """
    hits = nn_retention_hits(T, M, k, extra_M=extra_M, rows=rows)
    if hits is None:
        return float("nan")
    mapped, native = hits
    return float(mapped.sum() / max(native.sum(), 1))


def nn_retention_hits(T: np.ndarray, M: np.ndarray, k: int = 10, *, extra_M: np.ndarray | None = None,
                      rows=None) -> tuple[np.ndarray, np.ndarray] | None:
    """Per query of :func:`nn_retention` (same arguments): ``(mapped, native)``, whether its relevant row is in
    the mapped index's top ``k`` and in the native one's, (q,) bool each (native all True without ``extra_M``);
    :func:`nn_retention` is ``mapped.sum() / max(native.sum(), 1)``. None where it is undefined (fewer than 3
    rows). Per query, so that a resample of the queries can be scored again (the plan's query bootstrap)."""
    n = T.shape[0]
    k = min(k, n - 2)
    if k < 1:
        return None
    Tq, ids = _queries(T, rows)
    _, In = knn(Tq, T, 2)
    rel = np.where(In[:, 0] == ids, In[:, 1], In[:, 0])
    if extra_M is None or not len(extra_M):
        return _hits(Tq, M, rel, k, ids), np.ones(Tq.shape[0], dtype=bool)
    E = np.ascontiguousarray(extra_M, dtype=np.float32)
    return _hits(Tq, np.concatenate([M, E]), rel, k, ids), _hits(Tq, np.concatenate([T, E]), rel, k, ids)


def neighbour_overlap(Q: np.ndarray, A: np.ndarray, B: np.ndarray, k: int = 10, *, rows=None) -> float:
    """Mean share of the top-``k`` of query ``Q[i]`` in ``B`` (row ``i`` excluded) also in its top-``k`` in ``A`` (row ``i`` excluded).

    Q (n, d), A (n, d), B (n, d) unit rows; ``B`` is the reference (native) set. ``rows`` (q,): only these rows
    of ``Q`` are queries (each still searches all of ``A`` and ``B``).
    """
    k = min(k, Q.shape[0] - 1)
    if k < 1:
        return float("nan")
    Qq, ids = _queries(Q, rows)
    return overlap_without_self(knn(Qq, A, k + 1)[1], knn(Qq, B, k + 1)[1], k, ids)


def _beaten_by(Q: np.ndarray, true: np.ndarray, E: np.ndarray, block: int = 1024) -> np.ndarray:
    """For each query ``Q[i]`` (n, d), how many rows of ``E`` (m, d) score above ``true[i]`` (n,) beyond ``TIE_TOL``;
    blocked (at most ``block`` queries and :data:`align.blocks.SCORE_BLOCK_BYTES` of scores at a time)."""
    out = np.zeros(Q.shape[0], dtype=np.int64)
    step = rows_per_block(E.shape[0], block)
    for s in range(0, Q.shape[0], step):
        out[s : s + step] = count_above(Q[s : s + step] @ E.T, true[s : s + step])
    return out


def pair_retrieval_scores(M: np.ndarray, T: np.ndarray, *, k: int = 10, extra_M: np.ndarray | None = None,
                          extra_T: np.ndarray | None = None, retention: bool = True, rows=None) -> dict:
    """Corpus-side and query-side recall@1/@k and MRR, neighbourhood overlap@k and ``score``.

    ``M`` (n, d) mapped old rows and ``T`` (n, d) native new rows, unit, paired by row.
    ``extra_M`` (p, d): more mapped old rows (the rest of a migrated corpus) that compete in the
    corpus-side ranking; ``extra_T`` (q, d): more native rows competing in the query-side ranking.
    A distractor scoring exactly as high as the partner (a duplicate text) does not count.
    ``retention=False`` skips ``nn_retention@k`` (the costliest view; not part of ``score``).
    ``rows`` (s,): only these pairs are queries (:func:`align.metrics.query_sample`), every row stays a candidate:
    ``s · n · d`` work per view instead of ``n² · d``; ``n_queries`` says how many, and ``intervals`` holds the
    :func:`align.metrics.proportion_interval` of each recall (and of ``nn_retention@k`` without ``extra_M``,
    where it is a share of queries). ``cos`` is over all n pairs either way.
    """
    M = np.ascontiguousarray(M, dtype=np.float32)
    T = np.ascontiguousarray(T, dtype=np.float32)
    Mq, _ = _queries(M, rows)
    Tq, _ = _queries(T, rows)
    rc = ranks(Tq, M, cols=rows)
    rq = ranks(Mq, T, cols=rows)
    true = np.einsum("ij,ij->i", Mq, Tq)
    if extra_M is not None and len(extra_M):
        rc = rc + _beaten_by(Tq, true, np.ascontiguousarray(extra_M, dtype=np.float32))
    if extra_T is not None and len(extra_T):
        rq = rq + _beaten_by(Mq, true, np.ascontiguousarray(extra_T, dtype=np.float32))
    out = {"n_pairs": int(M.shape[0]), "n_distractors": [0 if extra_M is None else int(len(extra_M)),
                                                          0 if extra_T is None else int(len(extra_T))],
           "n_queries": int(rc.size),
           "corpus_recall@1": float((rc == 1).mean()), f"corpus_recall@{k}": float((rc <= k).mean()),
           "corpus_mrr": float((1.0 / rc).mean()),
           "query_recall@1": float((rq == 1).mean()), f"query_recall@{k}": float((rq <= k).mean()),
           "query_mrr": float((1.0 / rq).mean()),
           f"overlap@{k}": neighbour_overlap(T, M, T, k, rows=rows),
           "cos": float(np.einsum("ij,ij->i", M, T).mean())}
    if retention:
        out[f"nn_retention@{k}"] = nn_retention(T, M, k, extra_M=extra_M, rows=rows)
    out["score"] = float((out["corpus_mrr"] + out["query_mrr"] + out[f"overlap@{k}"]) / 3.0)
    if rows is not None:
        n, s = int(M.shape[0]), int(rc.size)
        iv = {f"{side}_recall@{cut}": proportion_interval(int((r <= cut).sum()), s, n)
              for side, r in (("corpus", rc), ("query", rq)) for cut in (1, k)}
        if retention and (extra_M is None or not len(extra_M)) and np.isfinite(out[f"nn_retention@{k}"]):
            iv[f"nn_retention@{k}"] = proportion_interval(round(out[f"nn_retention@{k}"] * s), s, n)
        out["interval_level"] = INTERVAL_LEVEL
        out["intervals"] = iv
    return out


def relevant_ranks(Q: np.ndarray, D: np.ndarray, relevant: np.ndarray, *, block: int = 1024) -> np.ndarray:
    """1-based rank (q,) of ``D[relevant[i]]`` among all rows of ``D`` (n, d) for query ``Q[i]`` (q, d).

    Inner products (cosine on unit rows), computed in blocks of at most ``block`` queries and
    :data:`align.blocks.SCORE_BLOCK_BYTES` of scores (never q × n at once); a document tied with the
    relevant one does not push it down (rank = 1 + rows scoring strictly higher). Strict, unlike the pair ranks
    (:data:`~align.metrics.TIE_TOL`): this rank is what a search of the corpus returns, which orders a document
    scoring 1e-7 above the relevant one first (the labelled gate must give the migration benchmark's figure).
    A row identical to the relevant one (a duplicate document) ties with it exactly: BLAS gives two identical
    columns scores that differ in the last bits, which put the copy first for about 1 % of queries at d = 384.
    """
    out = np.empty(Q.shape[0], dtype=np.int64)
    step = rows_per_block(D.shape[0], block)
    # rows by the (64-bit) hash of their bytes: identical rows share a group (~70 ms per 40k rows, 8 bytes a row)
    group = np.unique(np.fromiter((hash(row.tobytes()) for row in D), np.int64, D.shape[0]), return_inverse=True)[1]
    dup = np.bincount(group)[group] > 1  # rows with an identical copy
    for s in range(0, Q.shape[0], step):
        S = Q[s : s + step] @ D.T
        rel = relevant[s : s + step]
        true = S[np.arange(S.shape[0]), rel]
        above = S > true[:, None]
        if dup.any():
            above &= group[None, :] != group[rel][:, None]
        out[s : s + step] = 1 + above.sum(axis=1)
    return out


def hubness(D: np.ndarray, k: int = 10) -> np.ndarray:
    """``r(d)`` (n,): mean inner product of each row of ``D`` (n, d), unit, with its ``k`` nearest *other* rows
    (exact, blocked :func:`align.knn`); the document term of CSLS. Zeros when ``D`` has a single row."""
    n = D.shape[0]
    kk = min(int(k), n - 1)
    if kk < 1:
        return np.zeros(n, dtype=np.float32)
    S, I = knn(D, D, kk + 1)
    drop = I == np.arange(n)[:, None]
    drop[~drop.any(axis=1), -1] = True  # a row tied with its duplicate: leave out the last instead of itself
    return np.where(drop, 0.0, S).sum(axis=1).astype(np.float32) / kk


def labelled_metrics(Q: np.ndarray, D: np.ndarray, relevant: np.ndarray, *, k: int = 10) -> dict:
    """R@1, R@k, nDCG@k (one relevant document: ``1 / log2(1 + r)`` for ``r <= k``) and MRR of queries ``Q``
    (q, d) over documents ``D`` (n, d), unit rows, ``relevant`` (q,) int; ranks by :func:`relevant_ranks`."""
    return _rank_metrics(relevant_ranks(Q, D, np.asarray(relevant, dtype=np.int64)), k)


def _rank_metrics(r: np.ndarray, k: int) -> dict:
    """The metrics of :func:`labelled_metrics` from the relevant documents' ranks ``r`` (q,), 1 = first."""
    return {"R@1": float((r == 1).mean()), f"R@{k}": float((r <= k).mean()),
            f"nDCG@{k}": float(np.where(r <= k, 1.0 / np.log2(1.0 + r), 0.0).mean()), "MRR": float((1.0 / r).mean())}


def retention_interval(hits_migrated, hits_native, *, level: float = INTERVAL_LEVEL,
                       n_resamples: int = INTERVAL_RESAMPLES, random_state=0) -> list[float] | None:
    r"""Paired bootstrap interval of a recall retention ``sum(hits_migrated) / sum(hits_native)``.

    ``hits_migrated`` / ``hits_native`` (q,) bool: whether query ``i`` finds its relevant document in
    the migrated / the native index. Resampling the q queries with replacement only moves the counts
    of the four kinds of query (hit in both, only migrated, only native, neither), so each resample is
    one multinomial draw of those four counts with the observed shares, and the retention of a
    resample is ``(n_both + n_mig) / (n_both + n_nat)``; the interval is the ``(1 ± level) / 2``
    percentiles of ``n_resamples`` of them (resamples with no native hit are left out). ``None`` when
    no query hits natively (the retention is undefined). Cost: O(q + n_resamples), no q × n_resamples
    index array. Seeded by ``random_state``: the same hits give the same interval.
    """
    m = np.asarray(hits_migrated, dtype=bool).ravel()
    n = np.asarray(hits_native, dtype=bool).ravel()
    if m.shape != n.shape or m.size == 0:
        raise PairCountError(f"hits must be two non-empty arrays of one flag per query, got {m.shape} and {n.shape}")
    if isinstance(level, bool) or not isinstance(level, (int, float, np.floating)) or not 0.0 < float(level) < 1.0:
        raise InputError(f"level must be in (0, 1), got {level!r}")
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < 100:
        raise InputError(f"n_resamples must be an integer >= 100, got {n_resamples!r}")
    if not n.any():
        return None
    counts = np.array([(m & n).sum(), (m & ~n).sum(), (~m & n).sum(), (~m & ~n).sum()], dtype=np.float64)
    draws = check_random_state(random_state).multinomial(m.size, counts / m.size, size=int(n_resamples))
    den = draws[:, 0] + draws[:, 2]
    ok = den > 0
    ratio = (draws[ok, 0] + draws[ok, 1]) / den[ok]
    tail = 50.0 * (1.0 - float(level))
    lo, hi = np.percentile(ratio, [tail, 100.0 - tail])
    return [float(lo), float(hi)]


def labelled_retrieval(Q_migrated: np.ndarray, D_migrated: np.ndarray, Q_native: np.ndarray, D_native: np.ndarray,
                       relevant: np.ndarray, *, k: int = 10, random_state=0, doc_penalty=None) -> dict:
    """Labelled retrieval in a migrated and a native index, and the retention of each metric.

    ``D_migrated`` / ``D_native`` (n, ·): the same n documents, row by row, as the migrated index
    holds them and as the new model embeds them natively; ``Q_migrated`` / ``Q_native`` (q, ·): the
    same q queries as each index is searched with (corpus-side migration: the native queries both
    times; query-side: the mapped queries against the old index, the native ones against the
    new-model documents). ``relevant`` (q,) int: the row of each query's one relevant document.
    All rows unit. Returns ``{"migrated": {...}, "native": {...}, "retention": {...},
    "retention_interval": {"R@k": [lo, hi] or None}, "interval_level", "n_queries", "n_documents", "k",
    "native_hits", "chance_p", "undecided"}``; a retention whose native figure is 0 is ``None``. ``chance_p``:
    how often a random ranking (top k of n: ``k / n`` per query, :func:`chance_p_value`) has ``native_hits`` or
    more; ``undecided``: why the R@k retention can decide no gate (native hits none or at chance, p >=
    :data:`CHANCE_LEVEL`; fewer than :data:`MIN_NATIVE_HITS`), else None: a rule on the counts, so the same hits
    are decided the same way whatever ``random_state``. The interval
    (:func:`retention_interval`, seeded by
    ``random_state``) says how far the R@k retention could move on another sample of as many queries.
    ``doc_penalty`` (n,): the migrated index ranks by ``q·d - doc_penalty[d]`` (CSLS search:
    ``(w / 2) r(d)``, :func:`hubness`), exactly over all documents; the native one by ``q·d``.
    """
    rel = np.asarray(relevant, dtype=np.int64)
    if doc_penalty is not None:  # q·d - p(d) as one inner product: [q, 1] · [d, -p(d)]
        Q_migrated = np.hstack([Q_migrated, np.ones((Q_migrated.shape[0], 1), Q_migrated.dtype)])
        D_migrated = np.hstack([D_migrated, -np.asarray(doc_penalty, D_migrated.dtype).reshape(-1, 1)])
    r_mig = relevant_ranks(Q_migrated, D_migrated, rel)
    r_nat = relevant_ranks(Q_native, D_native, rel)
    mig, nat = _rank_metrics(r_mig, k), _rank_metrics(r_nat, k)
    interval = retention_interval(r_mig <= k, r_nat <= k, random_state=random_state)
    q, n, h_nat = int(np.size(relevant)), int(D_native.shape[0]), int((r_nat <= k).sum())
    return {"migrated": mig, "native": nat, "retention": ratios(mig, nat),
            "retention_interval": {f"R@{k}": interval}, "interval_level": INTERVAL_LEVEL,
            "n_queries": q, "n_documents": n, "k": int(k), "native_hits": h_nat,
            "chance_p": chance_p_value(h_nat, q, k / n), "undecided": _undecided(h_nat, q, n, int(k))}


def ratios(part: dict, whole: dict) -> dict:
    """``part[m] / whole[m]`` per metric; ``None`` where ``whole[m]`` is 0."""
    return {m: (part[m] / whole[m] if whole[m] > 0 else None) for m in part}
