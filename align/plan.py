r"""Before the fit: which rows to re-embed, how alignable two spaces are, what K buys.

- :func:`select_rows_to_embed` — coverage sampling of the old corpus: k-means++ seeding
  (D² sampling, Arthur & Vassilvitskii 2007) on unit rows picks rows spread over the corpus,
  so the K re-embedded pairs cover its regions; ``"random"`` is the baseline.
- :func:`knn_overlap` — alignability: for a paired probe ``(A, B)`` (p rows each, same texts),
  the mean share of each row's ``k`` nearest probe rows that the two models agree on: raw by default
  (it grows as the probe shrinks), beyond the ``k / (p - 1)`` of chance with ``beyond_chance=True``.
  Beyond chance, the unsupervised path has only worked above ~0.4 (minilm↔paraphrase-L3 0.46;
  minilm↔e5 0.33; glove↔minilm 0.25); :func:`plan_migration` (and the CLI / HTTP plan) reports that
  figure for k = 10 as ``alignability`` and the raw one as ``knn_overlap``.
- :func:`plan_migration` — alignability, a learning curve of the held-out score of
  :func:`align.fit_migration` on probe subsamples, extrapolated to larger K with an interval,
  the recommended method and K, and the rows to re-embed. With labelled queries over the probe
  (:class:`LabelledProbe`) the curve is of labelled retrieval retention estimated for the whole corpus.
"""

from __future__ import annotations

import numpy as np

from .coverage import distinct_rows_to_embed, select_rows_to_embed
from .validation import (as_matrix, check_labelled_queries, check_paired, check_random_state, check_rankable,
                         check_same_queries, pair_groups)
from .exceptions import InputError, TooFewRowsError
from .families import Problem, procrustes_candidate, ridge_candidate
from .frames import Frame, unit_rows
from .knn import knn, knn_blocks
from .learning_curve import curve_fit, fit_learning_curve, forecast, forecast_per_k, kept_forecast, query_bootstrap
from .options import check_callable, check_flag, check_number
from .plan_checks import (UNPAIRED_MIN_PROBE, best_migrating, check_curve_informative, check_pairs_beyond_chance,
                          check_queries_find_relevant, same_up_to_rotation, short_of_target, unpaired_note,
                          unpaired_share)
from .retrieval import overlap_without_self, relevant_ranks

__all__ = ["select_rows_to_embed", "knn_overlap", "plan_migration", "fit_learning_curve", "forecast", "forecast_per_k",
           "MIN_PROBE", "LabelledProbe"]

MIN_PROBE = 50


def knn_overlap(A, B, *, k: int = 10, beyond_chance: bool = False) -> float:
    """Mean overlap of the ``k`` nearest neighbours (self excluded) of paired rows in two spaces.

    ``A`` (p, d_a) and ``B`` (p, d_b) embed the same p texts. 1.0: the two models order every
    neighbourhood alike; about ``c = k / (p - 1)``: unrelated (two random k-subsets of the p - 1 other
    rows share that share on average).

    ``beyond_chance=True`` gives ``(overlap - c) / (1 - c)`` instead: 0 for unrelated spaces and 1 for
    identical neighbourhoods at any probe size. The raw overlap grows as the probe shrinks (WordNet
    minilm↔e5: 0.33 on 1,000 probe pairs, 0.42 on 100, 0.49 on 50), so only this figure can be held to
    a fixed bar (minilm↔e5: 0.33-0.36 from 50 to 1,000 pairs; minilm↔paraphrase-L3: 0.46-0.47).
    """
    check_number("k", k, 1, 1 << 31, whole=True)
    check_flag("beyond_chance", beyond_chance)
    A, B = check_paired(A, B, names=("A", "B"))  # its arguments (they were called probe_src / probe_tgt)
    n = A.shape[0]
    if n < k + 2:  # was "probe_src: a paired fit needs at least 52 rows", not saying k was the cause
        raise TooFewRowsError(f"knn_overlap: k={k} needs at least k + 2 = {k + 2} paired rows in A and B (each row's "
                              f"{k} nearest others, and chance k / (rows - 1) below 1), got {n}; "
                              + (f"lower k to at most {n - 2} or give more rows" if n >= 3 else "give more rows"))
    check_rankable(A, name="A")  # all-zero or constant rows: every neighbourhood a tie, overlap 1.0
    check_rankable(B, name="B")
    Za = Frame.fit(A, validate=False).apply(A, validate=False)
    Zb = Frame.fit(B, validate=False).apply(B, validate=False)
    overlap = overlap_without_self(knn(Za, Za, k + 1)[1], knn(Zb, Zb, k + 1)[1], k)
    return _beyond_chance(overlap, k, A.shape[0]) if beyond_chance else overlap


def _beyond_chance(overlap: float, k: int, p: int) -> float:
    """``(overlap - c) / (1 - c)`` with ``c = k / (p - 1)``, the kNN@k overlap of unrelated spaces on p rows."""
    chance = k / (p - 1)
    return float((overlap - chance) / (1.0 - chance))


#: alignability (:func:`knn_overlap` beyond chance) below which unsupervised alignment is not expected to work
ALIGNABLE = 0.4


DEFAULT_TARGET_KS = (100, 300, 1000, 3000, 10000)

#: The prediction is a proxy scored without the user's queries (their relevant documents' margins are
#: unknown). On the labelled benchmarks (WordNet reverse dictionary minilm→e5 and →mpnet, Bible
#: WEB→KJV minilm→e5; benchmarks/results/migration_2026-11-30.md, migration_2026-12-01_bible.md,
#: migration_2026-12-01_mpnet.md) the measured retention was at or above it in 13 of 14 (pair, K) cells,
#: by up to 0.30, and 0.008 below in one. That is a property of reading the statistic at small K and
#: extrapolating, not a bound: for one and the same map the statistic neither bounds nor tracks labelled
#: retention across data sets (benchmarks/results/plan_proxies_2026-12-01.md: equal probe statistics,
#: measured 0.45 on one set and 0.87 on another), because retention depends on the queries.
FLOOR_NOTE = ("predicted retention is nn_retention@10 on the probe, a proxy without your queries; on labelled "
              "benchmarks the measured retention came out at or above it (by up to 0.3), but it is no bound: read "
              "it as a rough floor and gate the fitted map on labelled queries "
              "(vecbridge eval --queries --relevant --min-retention)")


#: At K >= 1,000 the plan recommends ``auto``, but its forecast is of the closed-form method of the probe's curve.
#: WordNet, a 16,384-row corpus, K = 10,000 (QA of plan_migration): glove->minilm from 500 probe pairs forecast
#: procrustes 0.211 [0.149, 0.272] where auto chose a cluster map measuring 0.69 on that statistic, minilm->e5
#: from 1,000 forecast ridge 0.687 [0.427, 0.948] where cluster measured 1.10; once (glove->minilm from 200 pairs)
#: auto's contrastive map measured 0.21, under its forecast 0.277 [0.226, 0.328].
AUTO_NOTE = ("the forecast and its interval at K = {k} are of {m} (forecast_method), a closed-form map; the "
             "recommended method, auto, may choose a contrastive or cluster map at this K, which usually measures "
             "above that interval (not always): read it as a floor for auto, not a prediction of what auto fits")
#: The interval (probe scatter, subset spread, query sample) leaves out extrapolating the curve, whose maps never fit a
#: held-out text. WordNet minilm->e5, 8,192 rows, 600 queries, 1,000/2,000-pair probes (results/plan_extrapolation_
#: 2026-12-06.md): extrapolated forecasts -0.08..+0.07 from maps of random rows relevant to no query, -0.13..-0.01 from
#: maps of the plan's own rows (some relevant: random corpus rows kept 0.03-0.06 more at K = 1,000-3,000).
EXTRAPOLATED_NOTE = ("the forecasts past the {top} pairs the curve is fitted on (of the probe's {p}, the rest held "
                     "out; extrapolated: "
                     "K = {ks}) extend the probe's learning curve, and their intervals hold the scatter of its points, "
                     "not the error of that extrapolation. Like every forecast they are of maps whose fit pairs hold "
                     "none of the held-out texts, while the rows you re-embed from the corpus hold some documents your "
                     "queries look for, which the map then finds (WordNet minilm->e5, K = 1,000-3,000: the plan's own "
                     "rows mapped measured up to 0.13 above the forecast); 'kept' forecasts the migration that keeps "
                     "those rows' own vectors (transform --keep-rows; within 0.05 of it in 39 of 48 cells there): "
                     "read them as rough and gate the fitted map")
#: nn_retention's native side searches the native rows among mapped rows of the old corpus (their native vectors are
#: unknown). WordNet minilm->paraphrase-L3, ridge from 10,000 pairs: 1.06-1.23, where native recall against those
#: mapped distractors was 0.23-0.27 and against the same rows' native vectors 0.42-0.47 (the ratio then 0.61-0.69).
OVER_ONE_NOTE = ("a learning-curve point measured {r:.2f} > 1 ({m}, K = {k}): the mapped rows competed better than "
                 "the native ones against the same distractors, mapped rows of the old corpus that stand in for its "
                 "unknown native vectors in the native pool and can outrank native rows more than those would; the "
                 "native recall is understated, so such points run above what native distractors would give (no "
                 "floor there) and the forecast is clipped to 1: gate on labelled queries")


LABELLED_NOTE = ("predicted retention is of your labelled queries, estimated for the whole corpus: migrated R@10 over "
                 "the whole mapped corpus (exact) over native R@10 over the probe documents scaled by how the old "
                 "model's R@10 of the same queries falls from the probe to the whole corpus, adjusted by how fast "
                 "the new model's R@10 falls relative to the old one's inside the probe; the interval adds the "
                 "query sample's own uncertainty")


#: a corpus row at least this close (cosine) to a probe or held-out row repeats it: it is that text, no distractor
DUPLICATE_COS = 0.9999

class LabelledProbe:
    r"""Labelled queries over a probe, for :func:`plan_migration`: a retention estimate for the whole corpus.

    ``queries`` (q, d_t) new-model and ``old_queries`` (q, d_s) old-model vectors of the same q queries;
    ``relevant`` (q,) the probe row of each one's relevant document. For a map ``f`` fitted on other probe
    rows, with ``V`` the held-out probe rows (every relevant one among them) and ``E`` the rest of the old
    corpus (rows duplicating a probe text left out):

    .. math::  \hat r(f) = \frac{R@10(Q \to f(A_V) \cup f(E))}{\hat R_{new}},
               \qquad \hat R_{new} = R@10(Q \to B) \left(\frac{R@10(Q_o \to A \cup E')}{R@10(Q_o \to A)}\right)^{s}

    The numerator is what the migrated index gives these queries (exact). The native new-model R@10
    over the whole corpus is unknown without re-embedding it: its value over all p probe documents is
    scaled by the old model's fall from the probe to the whole corpus (``E'``: the corpus less the
    probe's texts; both measured), raised to ``s``, how fast the new model's R@10 falls relative to the
    old one's *inside* the probe. ``s`` is the ratio of the slopes of ``log R@10`` against ``log n``
    over random fractions ``n / p`` of the probe's distractors (1/8 … 1; a query with ``c`` probe rows
    above its relevant one hits at fraction ``f`` with probability ``P(Binomial(c, f) ≤ 9)``, so no
    sampling is needed), shrunk toward 1 by its bootstrap variance over the queries:
    ``s = 1 + (s_0 - 1) max(0, 1 - var / (s_0 - 1)²)``. On the labelled benchmarks ``s = 1`` (the old
    model's fall as it is) left the native R@10 0.04-0.09 low on WordNet minilm→mpnet, whose R@10 falls
    more slowly than MiniLM's, and the slope ratio alone was noisy on minilm→e5 (whose falls match);
    shrunk, the mean error was 0.017 / 0.022 on the two (0.061 / 0.007 with ``s = 1``).
    """

    FRACTIONS = np.array([0.125, 0.25, 0.5, 1.0])

    def __init__(self, queries, old_queries, relevant, A: np.ndarray, B: np.ndarray, rows: str = "probe"):
        Q, self.rel = check_labelled_queries(queries, relevant, A.shape[0], dim=B.shape[1], rows=rows)
        self.Q = unit_rows(Q)
        self.Qo = unit_rows(check_same_queries(old_queries, Q.shape[0], dim=A.shape[1]))
        self.A, self.B = A, B

    def split(self, rng: np.random.Generator, p: int) -> tuple[np.ndarray, np.ndarray]:
        """``(val, pool)``: held-out probe rows (every relevant one, topped up at random to half the probe)
        and the rest, the rows the curve's maps are fitted on."""
        need = np.unique(self.rel)
        if p - need.size < 2 * MIN_PROBE // 5:
            raise TooFewRowsError(f"{need.size} of the {p} probe rows are relevant documents: at least "
                                  f"{2 * MIN_PROBE // 5} others are needed to fit the curve's maps")
        rest = rng.permutation(np.setdiff1d(np.arange(p), need))
        top_up = max(0, p // 2 - need.size)
        return np.sort(np.concatenate([need, rest[:top_up]])), np.sort(rest[top_up:])

    def prepare(self, val: np.ndarray, corpus: np.ndarray, keep: np.ndarray, rng: np.random.Generator,
                n_boot: int = 200) -> None:
        """The map-free parts: each model's fall curve over the whole probe, the old model's R@10 over the
        probe and the rows ``keep`` of ``corpus`` (unit rows; ``keep``: all but the probe's texts), searched block
        by block (no copy of the corpus), the shrunk slope ratio ``s``."""
        self.local = np.searchsorted(val, self.rel)
        A_all = unit_rows(self.A)
        self.nat_fall = _fall(self.Q, unit_rows(self.B), self.rel, self.FRACTIONS)
        self.old_fall = _fall(self.Qo, A_all, self.rel, self.FRACTIONS)
        starts, rows = _kept_blocks(corpus, keep)
        _, I = knn_blocks(self.Qo, [None, *starts], 10, open_block=lambda b: A_all if b is None else rows(b))
        self.old_full = (I == self.rel[:, None]).any(axis=1)
        q = self.Q.shape[0]
        s0 = self._slope_ratio(slice(None))
        boot = np.array([self._slope_ratio(rng.integers(0, q, q)) for _ in range(n_boot)])
        var = float(np.var(boot[np.isfinite(boot)])) if np.isfinite(boot).any() else np.inf
        self.shrink = float(max(0.0, 1.0 - var / max((s0 - 1.0) ** 2, 1e-12))) if np.isfinite(s0) else 0.0
        self.slope_ratio = float(1.0 + (s0 - 1.0) * self.shrink) if np.isfinite(s0) else 1.0

    def _slope_ratio(self, idx) -> float:
        """Slope of log R@10 vs log n, new model over old model, for the queries ``idx``."""
        x = np.log(self.FRACTIONS)
        new = np.log(np.clip(self.nat_fall[idx].mean(axis=0), 1e-3, 1.0))
        old = np.log(np.clip(self.old_fall[idx].mean(axis=0), 1e-3, 1.0))
        so = np.polyfit(x, old, 1)[0]
        return float(np.clip(np.polyfit(x, new, 1)[0] / so, 0.25, 4.0)) if so < 0 else float("nan")

    def estimate(self, fitted, val_rows: np.ndarray, corpus: np.ndarray, keep: np.ndarray) -> float:
        r""":math:`\hat r` for the map ``fitted`` of the held-out probe rows and the rows ``keep`` of ``corpus``; its
        per-query hits are kept for :meth:`interval`. The corpus is mapped and searched block by block (no
        mapped copy of it: the search is the same as over the concatenation)."""
        starts, rows = _kept_blocks(corpus, keep)

        def mapped(b) -> np.ndarray:
            return unit_rows(fitted.apply(val_rows if b is None else rows(b), output="raw", validate=False))

        _, I = knn_blocks(self.Q, [None, *starts], 10, open_block=mapped)
        self.last_hits = (I == self.local[:, None]).any(axis=1)
        return self._ratio(self.last_hits, slice(None))

    def native_estimate(self, idx=slice(None)) -> float:
        """:math:`\\hat R_{new}`, the native new-model R@10 of the queries ``idx`` over the whole corpus."""
        nat, o_s, o_f = self.nat_fall[idx, -1].mean(), self.old_fall[idx, -1].mean(), self.old_full[idx].mean()
        if nat == 0 or o_s == 0:
            return float("nan")
        return float(nat * (o_f / o_s) ** self.slope_ratio)

    def _ratio(self, mig: np.ndarray, idx) -> float:
        r""":math:`\hat r` of the queries ``idx`` (all, or a resample) from migrated hits ``mig``."""
        den = self.native_estimate(idx)
        return float(mig[idx].mean() / den) if np.isfinite(den) and den > 0 else float("nan")

    def interval(self, rng: np.random.Generator, level: float = 0.95, n: int = 500) -> tuple[float, float]:
        """Percentile interval of the last estimate over ``n`` resamples of the queries."""
        q = self.Q.shape[0]
        vals = np.array([self._ratio(self.last_hits, rng.integers(0, q, q)) for _ in range(n)])
        vals = vals[np.isfinite(vals)]
        tail = 50.0 * (1.0 - level)
        lo, hi = np.percentile(vals, [tail, 100.0 - tail]) if vals.size else (np.nan, np.nan)
        return float(lo), float(hi)


def _fall(Q: np.ndarray, D: np.ndarray, rel: np.ndarray, fractions: np.ndarray, k: int = 10) -> np.ndarray:
    """(q, len(fractions)): the probability that row ``rel[i]`` of ``D`` is in query ``i``'s top ``k`` when
    only a random fraction ``f`` of the other rows competes: ``P(Binomial(c_i, f) < k)``, with ``c_i`` the
    rows scoring above it (:func:`align.retrieval.relevant_ranks` - 1: blocked, ties do not count)."""
    from scipy.stats import binom

    c = relevant_ranks(Q, D, rel) - 1
    return binom.cdf(k - 1, c[:, None], fractions[None, :])


def _kept_blocks(corpus: np.ndarray, keep: np.ndarray, block: int = 4096):
    """The first rows of the blocks of ``corpus`` holding a row that ``keep`` (bool) keeps, and the function giving
    one block's kept rows: a search over them with :func:`knn_blocks` holds one block at a time, not a copy."""
    starts = [s for s in range(0, corpus.shape[0], block) if keep[s : s + block].any()]
    return starts, lambda s: corpus[s : s + block][keep[s : s + block]]


def last_migrated(predicted: list[dict]) -> dict:
    """The forecast at the largest K that still migrates (not the row re-embedding the whole corpus, if another)."""
    return next((q for q in reversed(predicted) if not q.get("whole_corpus")), predicted[-1])


def _inconsistent_labelled(curve: dict, native: dict, over: dict, n_queries: int, plan: dict) -> dict:
    """``plan`` (the plan without the labelled queries) with their curve and R@10 under ``labelled`` and a note
    why it is not of them: retention above 1 at ``over`` (the highest curve point). The migrated index's measured
    R@10 then exceeds the native estimate, which is too low (or the map beats the new model there): a curve fitted
    with r_inf <= 1 read it as falling, forecast 1.000 at every K and recommended the smallest (WordNet minilm->e5,
    an 8,000-row corpus: ratios 0.55 -> 1.72 over a native estimate of 0.103, where e5's is 0.237)."""
    r10 = over["mean"] * native["new_corpus_estimate"]
    note = (f"your labelled queries' estimate is inconsistent, so the forecast and the recommendation are of the "
            f"nn_retention@10 proxy instead: the migrated index's R@10 of them over the corpus, measured, reached "
            f"{r10:.3f} (K = {over['k']}), above the new model's own estimated from the probe "
            f"({native['new_corpus_estimate']:.3f}; retention {over['mean']:.2f} > 1). That estimate is too low (the "
            f"new model's R@10 falls less from the probe to the corpus than the old model's fall, scaled by the slope "
            f"ratio {native['slope_ratio']:.2f}, says) or the map beats the new model on these queries; the plan "
            f"cannot tell which: measure after the fit (vecbridge eval --queries --relevant)")
    return {**plan, "notes": [plan["notes"][0], note, *plan["notes"][1:]],
            "labelled": {"consistent": False, "n_queries": n_queries, "curve": curve, "native": native}}


def _child(rng: np.random.Generator) -> np.random.Generator:
    """An independent generator from ``rng`` that leaves ``rng``'s own draws as they were (a bit generator without
    a seed sequence to spawn from gives its next draw as the seed)."""
    try:
        return rng.spawn(1)[0]
    except TypeError:
        return np.random.default_rng(int(rng.integers(2**63)))


def _check_plan_options(target_retention, target_ks, repeats, distractors) -> tuple[int, ...]:
    """The plan's numeric options, checked (typed errors instead of a NaN forecast or a bare ``max()`` error);
    returns ``target_ks`` as a sorted tuple of distinct ints."""
    try:
        ok = 0.0 < float(target_retention) <= 1.0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise InputError(f"target_retention must be in (0, 1], got {target_retention!r}")
    ks = np.asarray(target_ks if np.ndim(target_ks) else [target_ks])
    if ks.size == 0 or ks.dtype.kind not in "iu" or (ks < 2).any():
        raise InputError(f"target_ks must be one or more integer pair counts >= 2, got {target_ks!r}")
    check_number("repeats", repeats, 1, 1 << 31, whole=True)
    check_number("distractors", distractors, 1, 1 << 62, whole=True)
    return tuple(sorted({int(k) for k in ks}))


def plan_migration(X_old, probe_src, probe_tgt, *, random_state=0, target_retention: float = 0.95,
                   target_ks=DEFAULT_TARGET_KS, repeats: int = 2, methods=("procrustes", "ridge"),
                   distractors: int = 8192, select_rows: bool = True, queries=None, old_queries=None,
                   relevant=None, old_is_sample: bool = False, progress=None, rows_k=None, keep: bool = False,
                   names: tuple[str, str, str] = ("X_old", "probe_src", "probe_tgt")) -> dict:
    r"""A plan before the fit, from the old corpus and a small paired probe.

    Parameters
    ----------
    X_old : (n, d_s) the old corpus (all rows to be migrated).
    probe_src : (p, d_s), probe_tgt : (p, d_t) the same p texts under the old and the new model
        (p ≥ 50; 200–1,000 recommended).
    target_retention : the retention the recommended K should reach.
    target_ks : the K values to predict for.
    queries, old_queries, relevant : optional labelled queries (:class:`LabelledProbe`): new-model
        (q, d_t) and old-model (q, d_s) vectors of the same queries and the probe row of each one's
        relevant document. With them the curve's statistic is their labelled R@10 retention estimated
        for the whole ``X_old`` (all of it: ``distractors`` does not apply), the one
        ``vecbridge eval --queries --old-corpus`` (:func:`align.corpus_retention`) measures after the fit, instead
        of the ``nn_retention`` proxy (over the held-out documents alone, ``eval`` without ``--old-corpus``, the
        retention is higher: fewer rows compete).
    old_is_sample : ``X_old`` is a sample of a corpus of unknown size (a fit report's plan, made from the fit's
        own rows): no K then counts as re-embedding the whole corpus (see 3.).
    progress : callable(stage: str, fraction: float), optional
        called as the learning curve's fits complete (``"learning curve"``) and around the row selection
        (``"rows to re-embed"``); a labelled plan over a 40,960-row corpus takes tens of seconds.
    names : what the error messages call ``X_old``, ``probe_src`` and ``probe_tgt`` (a caller's own names for them,
        e.g. its command-line options or JSON fields).
    rows_k : ``rows_to_embed`` for this many rows (a budget, 1 to n) instead of the recommended K, drawn where and
        as the plan draws its own: the recommended K given as ``rows_k`` gives the plan's own rows (n: every row,
        unlisted, as the whole corpus's).
    keep : the migration keeps its K re-embedded rows' own new-model vectors (``transform --keep-rows``,
        ``migrate --keep-ids``, :func:`align.keep_native_rows`): the recommendation (3.) reads each K's ``kept``
        forecast instead of ``retention``, never a larger K (``kept`` ≥ ``retention``). Not with ``old_is_sample``.

    Method
    ------
    1. Alignability: :func:`knn_overlap` of the probe beyond chance (unsupervised alignment has only
       worked above ``ALIGNABLE`` = 0.4; the raw overlap is ``knn_overlap`` in the result).
    2. Learning curve: half the probe is held out; for K in a geometric grid up to the other half,
       ``repeats`` random K-subsets fit each of ``methods`` (the closed-form families: seconds)
       and score ``nn_retention@10`` (:func:`align.retrieval.nn_retention`: native query,
       relevant = its native nearest neighbour, recall@10 among the mapped rows over the native
       recall, with up to ``distractors`` mapped rows of ``X_old`` competing) on the held-out
       half. ``r(K) = r_inf - c K^(-beta)`` is fitted to each method's means, with an interval of
       ± 2 × (residual std + spread across repeats), clipped to [0, 1], and without labelled queries widened to
       hold the central 95 % of the forecasts of curves refitted to the points scored on resamples of the held-out
       queries (:func:`~align.learning_curve.query_bootstrap`: a small probe's few held-out queries leave its
       points, and its extrapolation, loose); each K's forecast is of one method
       (:func:`forecast_per_k`: within the probe's K the higher curve there, beyond it the best method at
       the largest probe K, extrapolated).
    3. Recommendation: the smallest K of ``target_ks`` whose prediction (``kept`` with ``keep``) reaches
       ``target_retention``, that K's method (``"contrastive"``-capable ``"auto"``
       when K ≥ 1,000; ``forecast_method`` is the closed-form method the forecast is of, and a note says that
       ``auto`` may fit another family, which the interval does not forecast: see :data:`AUTO_NOTE`), and
       ``select_rows_to_embed`` (k-means++) rows of ``X_old`` for that K. When no K that migrates reaches it,
       re-embedding every row is the only choice predicted to: the recommended K is the corpus size,
       ``whole_corpus`` says so (nothing is fitted: ``method`` / ``forecast_method`` are the best migrating
       K's), ``migration_reaches_target`` is False, ``best_migrating`` holds the best K with
       its forecast, and a note sets the choices side by side (re-embed every row, migrate at that K, keep the old
       model; :func:`align.plan_checks.short_of_target`). It had recommended the largest K, forecast far below
       the target, and said only "the largest is recommended". With ``old_is_sample`` (no corpus size) the
       largest K is recommended, ``migration_reaches_target`` is False with ``best_migrating``, and a
       note says none reaches. The target K of at least the corpus size are one
       forecast row at the corpus size, retention 1 with ``whole_corpus``.
    0. Refusals before any recommendation: a probe whose pairs look unpaired (its kNN@10 overlap within
       :data:`align.plan_checks.PAIRED_Z` standard errors of chance: DegenerateInputError), and a curve with less
       than one held-out hit per fit on average over its points (a probe too small for the space:
       TooFewRowsError, naming the probe size that would do); labelled queries none of which finds its relevant
       probe row with one of the models (the ratio is undefined: InputError naming which). Identical
       neighbourhoods (alignability ≥ 0.99)
       add a note that the spaces are the same up to a rotation.
    4. With labelled queries whose measured retention exceeds 1 at some curve point (the migrated index's R@10,
       exact, above the native estimate), that estimate is inconsistent: the plan is the one without them (the
       proxy's forecast and recommendation), with their ``labelled`` curve and ``native`` R@10 and a note why.

    Returns a JSON-safe dict: ``alignability`` (beyond chance), ``unsupervised_feasible``, ``knn_overlap`` (raw),
    ``n_distractors`` (the mapped rows of ``X_old`` competing in each curve point's search: the figure falls as they
    grow, so curves of different counts do not compare),
    ``probe_unpaired_share`` (:func:`align.plan_checks.unpaired_share`, None below 200 pairs; a note from 20 %),
    ``curve`` (per K and method the mean and spread), ``fits`` (per method its curve, :func:`forecast`'s input;
    ``fit``: the one of ``best_method``, the best at the largest probe K), ``predicted`` (per target K: method,
    retention, low, high, extrapolated; with labelled queries also ``r10``, the migrated index's predicted R@10 of
    them; unless ``old_is_sample``, ``kept``: the same for a migration that keeps its K re-embedded rows' own
    vectors in the corpus, :func:`align.keep_native_rows`, see :func:`~align.learning_curve.kept_forecast`), with
    labelled queries ``native`` (R@10 of the queries: ``new_probe``, ``old_probe``, ``old_corpus`` measured, ``new_corpus_estimate`` and the ``slope_ratio`` / ``shrink`` behind it; a note says when keeping the
    old model is predicted to do as well; ``labelled`` instead when their estimate is inconsistent, see 4.),
    ``recommended`` (``method``, ``forecast_method``, ``k``, ``whole_corpus``, ``forecast``: the forecast it read,
    ``"retention"`` or with ``keep`` ``"kept"``), ``rows_to_embed`` (indices; empty
    with ``select_rows=False``, for callers such as a fit report that only want the forecast, and when the rows are
    every row of ``X_old``: ``rows_to_embed_all`` True, the rows ``0..n-1`` unlisted), ``notes``.
    """
    n_old, n_src, n_tgt = names
    Xo = as_matrix(X_old, name=n_old)
    check_callable("progress", progress)
    check_flag("select_rows", select_rows)
    if check_flag("keep", keep) and old_is_sample:
        raise InputError("keep reads the forecast for a migration that keeps its re-embedded rows, the share K / n of "
                         "a corpus of n rows; a plan of a sample (old_is_sample) has no n and no such forecast")
    rows_k = None if rows_k is None else check_number("rows_k", rows_k, 1, Xo.shape[0], whole=True)  # before the work
    A, B = check_paired(probe_src, probe_tgt, names=(n_src, n_tgt), min_rows=1)
    # a repeated pair split across the curve's fitting and held-out halves is found by memory, and its copy is its
    # own nearest neighbour in the alignability count: the plan is of the distinct pairs
    groups, n_given = pair_groups(A, B), A.shape[0]
    if groups is not None:
        A, B = A[groups[0]], B[groups[0]]
        if relevant is not None and queries is not None:  # the relevant probe rows, renumbered among the distinct
            relevant = groups[1][check_labelled_queries(queries, relevant, n_given, dim=B.shape[1], rows="probe")[1]]
    if A.shape[0] < MIN_PROBE:
        distinct = "" if groups is None else f" distinct ones ({n_given} rows, {n_given - A.shape[0]} repeated)"
        raise TooFewRowsError(f"the probe needs at least {MIN_PROBE} pairs (200-1,000 recommended), got {A.shape[0]}"
                              f"{distinct}")
    check_rankable(A, name=n_src)  # an all-zero or constant side has no neighbourhoods to forecast from
    check_rankable(B, name=n_tgt)
    raw_overlap = knn_overlap(A, B)
    check_pairs_beyond_chance(raw_overlap, A.shape[0], (n_src, n_tgt))  # shuffled rows: not a plan of ~0 everywhere
    if A.shape[1] != Xo.shape[1]:
        from .exceptions import DimensionMismatchError

        raise DimensionMismatchError(f"{n_src} has {A.shape[1]} columns but {n_old} has {Xo.shape[1]}: both are "
                                     f"the old model's vectors (the probe's and the corpus's), so their widths must "
                                     f"agree")
    unknown = [m for m in methods if m not in ("procrustes", "ridge")]
    if unknown or not methods:
        raise InputError(f"plan methods must be one or more of 'procrustes', 'ridge', got {list(methods)}")
    target_ks = _check_plan_options(target_retention, target_ks, repeats, distractors)
    given = [x is not None for x in (queries, old_queries, relevant)]
    if any(given) and not all(given):
        raise InputError("labelled queries need all three: queries, old_queries (the same queries under the old "
                         "model) and relevant (each one's probe row)")
    lab = LabelledProbe(queries, old_queries, relevant, A, B) if all(given) else None
    rng = check_random_state(random_state)
    p = A.shape[0]
    if lab is None:
        perm = rng.permutation(p)
        val, pool = np.sort(perm[: p // 2]), perm[p // 2 :]
        rows = np.sort(rng.permutation(Xo.shape[0])[:distractors])
    else:
        val, pool = lab.split(rng, p)
        rows = slice(None)  # the whole corpus: a view, not a copy
    P = Problem(A, B, Xo, None)
    # its splits from a child of rng (spawned, not drawn: every other draw of the plan is as it was)
    unpaired = (unpaired_share(lambda idx: ridge_candidate(P, idx, 1e-2), A, B, random_state=_child(rng))
                if p >= UNPAIRED_MIN_PROBE else None)
    T_val = unit_rows(B[val])
    extra = unit_rows(Xo[rows])  # mapped as A[val] is: each candidate's frame is unit_in, no normalize=False
    S_dup, I_dup = knn(extra, unit_rows(A), 1)  # the probe's own texts inside the corpus are not distractors
    dup = S_dup[:, 0] >= DUPLICATE_COS
    if lab is not None:
        lab.prepare(val, extra, ~dup, rng)
        check_queries_find_relevant(float(lab.nat_fall[:, -1].mean()), float(lab.old_fall[:, -1].mean()),
                                    int(lab.Q.shape[0]))  # else every curve point is a ratio over 0
    others = ~(dup & np.isin(I_dup[:, 0], val))  # the maps' distractors: all but the held-out texts
    if lab is None and not others.all():  # a sample of the corpus (the labelled estimate searches it with others)
        extra = extra[others]
    top = pool.size
    # labelled: the curve from top / 8 up (the steep start below it says little about the K a migration uses,
    # and its spread across subsets would dominate the interval)
    start = min(20, top) if lab is None else max(min(20, top), top // 8)
    ks = sorted({int(k) for k in np.unique(np.geomspace(start, top, num=5).astype(int)) if k >= 4})
    from .retrieval import nn_retention_hits

    curve: dict = {m: [] for m in methods}
    hits: dict = {m: [] for m in methods}  # per method and K, each map's per-query hits (the query bootstrap's)
    report = progress or (lambda stage, fraction: None)
    n_fits, done = len(methods) * sum(repeats if k < top else 1 for k in ks), 0
    report("learning curve", 0.0)
    for k in ks:
        for m in methods:
            vals, maps = [], []
            for r in range(repeats if k < top else 1):
                idx = np.sort(rng.permutation(pool)[:k]) if k < top else np.sort(pool)
                fitted = procrustes_candidate(P, idx, {}) if m == "procrustes" else ridge_candidate(P, idx, 1e-2)
                if lab is None:  # nn_retention, per query
                    maps.append(nn_retention_hits(T_val, fitted.apply(A[val], output="raw", validate=False),
                                                  extra_M=fitted.apply(extra, output="raw", validate=False)))
                    vals.append(float(maps[-1][0].sum() / max(maps[-1][1].sum(), 1)))
                else:
                    vals.append(lab.estimate(fitted, A[val], extra, others))
                done += 1
                report("learning curve", done / n_fits)
            curve[m].append({"k": k, "mean": float(np.mean(vals)), "spread": float(np.std(vals))})
            if lab is None:  # the labelled estimate keeps its own per-query hits
                hits[m].append(maps)
            if lab is not None and k == top:  # the query sample's own uncertainty, at the largest K
                lo, hi = lab.interval(rng)
                curve[m][-1]["query_interval"] = [lo, hi]
    native = None
    if lab is not None:  # the R@10 behind the ratio: what the user's queries get natively, and by staying
        r_new = lab.native_estimate()
        native = {"new_probe": float(lab.nat_fall[:, -1].mean()), "old_probe": float(lab.old_fall[:, -1].mean()),
                  "old_corpus": float(lab.old_full.mean()), "new_corpus_estimate": r_new,
                  "slope_ratio": lab.slope_ratio, "shrink": lab.shrink}
        over = max((q for m in methods for q in curve[m]), key=lambda q: q["mean"])
        if over["mean"] > 1.0:  # the curve, fitted with r_inf <= 1, read it as falling: 1.000 at every K
            return _inconsistent_labelled(curve, native, over, int(lab.Q.shape[0]), plan_migration(
                X_old, probe_src, probe_tgt, random_state=random_state, target_retention=target_retention,
                target_ks=target_ks, repeats=repeats, methods=methods, distractors=distractors,
                select_rows=select_rows, old_is_sample=old_is_sample, progress=progress, names=names, rows_k=rows_k,
                keep=keep))
    check_curve_informative(curve, val.size if lab is None else int(lab.Q.shape[0]), top, A.shape[1], p,
                            labelled=lab is not None)
    fits = {m: curve_fit(curve[m], lab is not None) for m in methods}
    best = max(methods, key=lambda m: curve[m][-1]["mean"])  # at the probe's largest K
    # without queries the points are scored on the probe's held-out half: their query sample, resampled, spreads the
    # forecast (the more the further it extrapolates); a child of rng, so the plan's other draws are as they were
    brng = _child(rng)
    boot = None if lab is not None else {m: query_bootstrap(ks, hits[m], target_ks, brng) for m in methods}
    predicted = forecast_per_k(fits, best, target_ks, top, dim=A.shape[1], boot=boot)
    # K >= n_old re-embeds the whole corpus: every row native, no map to lose anything (one row, retention 1)
    n_old = float("inf") if old_is_sample else Xo.shape[0]
    if predicted[-1]["k"] >= n_old:
        whole = {**next(q for q in predicted if q["k"] >= n_old), "k": int(n_old), "retention": 1.0, "low": 1.0,
                 "high": 1.0, "extrapolated": False, "whole_corpus": True}
        predicted = [q for q in predicted if q["k"] < n_old] + [whole]
    for q in predicted if not old_is_sample else ():  # with the re-embedded rows kept native (a corpus of n_old)
        q["kept"] = kept_forecast(q, n_old)
    if native is not None:
        for q in predicted:  # the migrated index's own R@10, to set against keeping the old model
            q["r10"] = float(q["retention"] * r_new) if np.isfinite(r_new) else float("nan")
            if "kept" in q:
                q["kept"]["r10"] = float(q["kept"]["retention"] * r_new) if np.isfinite(r_new) else float("nan")
    read = (lambda q: q["kept"]) if keep else (lambda q: q)  # the forecast the recommendation reads
    migrating = [q for q in predicted if not q.get("whole_corpus")]
    reach = [q for q in migrating if read(q)["retention"] >= target_retention]
    kept_rows = " with its re-embedded rows kept (the kept forecast)" if keep else ""
    short = None  # none that migrates reaches it: re-embedding every row does, the best K and the old model beside
    if not reach and migrating and not old_is_sample:
        short = short_of_target(migrating, read, target_retention, int(n_old), kept_rows,
                                None if native is None else native["old_corpus"])
    best_mig = short[0] if short else best_migrating(migrating, read) if not reach and migrating else None
    if reach:
        rec = min(reach, key=lambda q: q["k"])
    elif old_is_sample:
        rec = max(predicted, key=lambda q: q["k"])
    else:  # the whole corpus (its method: the best migrating K's, as the whole-corpus forecast row's)
        rec = {**(short[0] if short else predicted[-1]), "k": int(n_old)}
    k_rec = int(min(rec["k"], n_old))
    k_rows = min(k_rec, Xo.shape[0])
    overlap = _beyond_chance(raw_overlap, 10, p)
    notes = [FLOOR_NOTE if lab is None else LABELLED_NOTE]
    if short is not None:
        notes.append(short[1])
    elif not reach and old_is_sample:  # a sample of a corpus of unknown size (a fit report): no whole corpus
        notes.append(f"no K in {list(target_ks)} is predicted to reach retention {target_retention}{kept_rows}: "
                     f"re-embedding the whole corpus is the only choice predicted to (this plan's rows are a sample "
                     f"of it, so it cannot size it); the recommendation is the largest K, and the best K is given "
                     f"beside it")
    elif k_rec == n_old:  # every target K re-embeds the whole corpus
        notes.append(f"the recommended K is the whole old corpus ({n_old} rows): every K of {list(target_ks)} is at "
                     f"least its size, so re-embed every row with the new model instead of migrating")
    rotation = same_up_to_rotation(overlap, A.shape[1], B.shape[1])
    if rotation:
        notes.append(rotation)
    if overlap < ALIGNABLE:
        notes.append(f"alignability {overlap:.3f} < {ALIGNABLE}: unsupervised alignment is not expected to work; "
                     f"use pairs")
    if any(q["extrapolated"] for q in predicted) and not fits[best]["c"] > 0:
        notes.append(f"the {best} learning curve did not rise over the probe's K (up to {top} pairs): it cannot "
                     f"forecast larger K, whose intervals run to 1; a larger probe (200-1,000 pairs) can")
    elif any(q["extrapolated"] for q in predicted) and top < A.shape[1]:
        notes.append(f"the probe's maps are fitted from at most {top} pairs, fewer than the old space's {A.shape[1]} "
                     f"dimensions: the learning curve changes shape past K ≈ {A.shape[1]}, so beyond {top} pairs "
                     f"only the forecast's lower end holds (intervals run to 1); a probe of at least {2 * A.shape[1]} "
                     f"pairs forecasts there")
    extrapolated = [q["k"] for q in predicted if q["extrapolated"]]
    if extrapolated:
        notes.append(EXTRAPOLATED_NOTE.format(top=top, p=p, ks=", ".join(f"{k:,}" for k in extrapolated)))
    last = last_migrated(predicted)
    if native is not None and np.isfinite(read(last)["r10"]) and read(last)["r10"] <= native["old_corpus"]:
        notes.append(f"keeping the old model is predicted to be at least as good: its R@10 of these queries over the "
                     f"corpus is {native['old_corpus']:.3f}, the migrated index's{kept_rows} {read(last)['r10']:.3f} "
                     f"at K = {last['k']} (native new model: {native['new_corpus_estimate']:.3f})")
    if k_rec >= 1000 and k_rec != n_old:  # "auto" below: the forecast is not of what it fits
        notes.append(AUTO_NOTE.format(m=rec["method"], k=k_rec))
    peak = max(((m, q) for m in methods for q in curve[m]), key=lambda mq: mq[1]["mean"])
    if lab is None and peak[1]["mean"] > 1.0:  # the proxy above 1: see OVER_ONE_NOTE (labelled: see 4.)
        notes.append(OVER_ONE_NOTE.format(r=peak[1]["mean"], m=peak[0], k=peak[1]["k"]))
    if unpaired is not None and (note := unpaired_note(unpaired, p)):
        notes.append(note)
    if groups is not None:
        notes.append(f"{n_given - p} of the {n_given} probe pairs repeat another pair: the plan is of the {p} distinct "
                     f"ones")
    report("rows to re-embed", 0.0)
    # every row (the whole corpus, or rows_k = its size): not listed (a 1M-row corpus made 7.9 MB of JSON), nor
    # picked by k-means++ over the whole corpus; rows_to_embed_all says so
    every = select_rows and (rows_k or k_rows) == Xo.shape[0]
    chosen = (distinct_rows_to_embed(Xo, rows_k or k_rows, random_state=rng)[0].tolist()
              if select_rows and not every else [])
    if select_rows and not every and len(chosen) < (rows_k or k_rows):  # copies in the corpus: said here
        notes.append(f"rows_to_embed holds {len(chosen)} rows, not {rows_k or k_rows}: the old corpus has only "
                     f"{len(chosen)} distinct rows (the others are copies; re-embedding a copy adds no pair)")
    report("rows to re-embed", 1.0)
    return {
        "alignability": overlap, "unsupervised_feasible": bool(overlap >= ALIGNABLE), "knn_overlap": raw_overlap,
        "n_probe": int(p), "n_probe_repeated": int(n_given - p), "n_probe_holdout": int(val.size),
        "n_distractors": int(extra.shape[0] if lab is None else others.sum()),
        "probe_unpaired_share": unpaired,
        "metric": ("nn_retention@10 (simulated labelled retention) on held-out probe" if lab is None else
                   "labelled R@10 retention of the given queries, estimated for the whole corpus"),
        **({} if lab is None else {"n_queries": int(lab.Q.shape[0]), "n_corpus": int(others.sum() + val.size),
                                   "native": native}),
        "curve": curve, "best_method": best, "fit": fits[best], "fits": fits,
        "predicted": predicted, "target_retention": float(target_retention),
        "recommended": {"method": "auto" if k_rec >= 1000 else rec["method"], "forecast_method": rec["method"],
                        "k": k_rec, "whole_corpus": bool(k_rec == n_old),
                        "forecast": "kept" if keep else "retention", "migration_reaches_target": bool(reach),
                        **({} if best_mig is None else {"best_migrating": {
                            "k": best_mig["k"], "method": "auto" if best_mig["k"] >= 1000 else best_mig["method"],
                            **{key: read(best_mig)[key] for key in ("retention", "low", "high")}}})},
        "rows_to_embed": chosen, "rows_to_embed_all": bool(every),
        "notes": notes,
    }
