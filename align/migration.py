r"""Fit a migration map from paired rows: several families and objectives, chosen on held-out pairs.

A team re-embedding a corpus with a new model has ``K`` texts embedded by both models: ``X_src``
(K, d_s) old, ``Y_tgt`` (K, d_t) new, row ``i`` ↔ row ``i``. :func:`fit_migration` returns an
:class:`align.LinearMap` whose ``apply(X, output="raw")`` gives (n, d_t) unit rows comparable by
cosine with the new model's native (unit) embeddings. Both migration modes use it:

- corpus-side: ``fit_migration(X_old_pairs, Y_new_pairs)``, map the old corpus, search it with
  native new-model queries;
- query-side (Drift-Adapter): ``fit_migration(Y_new_pairs, X_old_pairs)``, map new-model queries
  and search the untouched old index. Dimensions may differ either way.

Families (``method``), all fitted on the same pairs, each side in its own frame (unit → centre →
unit, fitted on the pairs plus ``unpaired_source`` / ``unpaired_target``); every map predicts
framed target rows ``Y_f``, where shrinkage only changes norms, and ``apply(output="raw")`` adds
the target mean back:

- ``"procrustes"``: ``W = U Vᵀ`` of ``svd(X_fᵀ Y_f)`` in both centred frames (orthogonal; a global
  scale does not change cosines, so it is not a separate candidate).
- ``"ridge"``: affine ``unit(x_f W + b)``, ``W = (X_cᵀX_c + αI)⁻¹ X_cᵀ Y_c`` (about the pair
  means); ``α`` chosen on the held-out pairs from ``alphas`` (× K).
- ``"lowrank"``: Procrustes ``Q`` plus a rank-``r`` ridge fit of the residual ``Y_f - X_f Q``:
  ``W = Q + W_r``, ``b = b_r``.
- ``"contrastive"``: the linear ``W, b`` trained for retrieval with symmetric InfoNCE and hard
  negatives from the unpaired sets (:mod:`align.contrastive`), warm-started from the better of
  Procrustes and ridge and regularised toward it; the number of epochs is chosen on the
  held-out pairs.
- ``"auto"``: fits each of ``candidates`` on a training split (both frames fitted on it too, so the
  held-out rows shape nothing they are scored by), scores each on the held-out split
  with :func:`align.retrieval.pair_retrieval_scores` (``score`` = mean of corpus-side MRR,
  query-side MRR and neighbourhood overlap@10; the unpaired rows, up to 4,096 per side, compete
  as the rest of the corpus / index), refits the best on all pairs with the chosen
  hyper-parameters. Every candidate's scores travel in ``map.metadata["selection"]`` (``chosen``, and why in
  ``why_chosen``; a candidate's cosine is ``cos_raw``: of the raw output with the native target rows).

``semi_supervised="sinkhorn"`` then refines an orthogonal map with the unpaired rows
(:func:`align.semisup.sinkhorn_refine_map`; needs both unpaired sets): procrustes only; an affine family
``auto`` chooses over procrustes is left as fitted, ``metadata["semi_supervised"]["applied"]`` False with its
``why``. ``auto`` then leaves ``cluster`` out of its candidates (``selection["not_tried"]`` says so, and ``note``
where ``candidates`` were given). What it could never refine is an InputError: another ``method`` than
``procrustes`` or ``auto``, and ``candidates`` without procrustes (``["cluster"]``, ``["ridge", "contrastive"]``).

- ``"cluster"``: per-cluster local maps (:mod:`align.cluster`): k-means routing on the framed
  source rows (pairs + unpaired, ``random_state``), one affine map per cluster fitted as a ridge
  on the global ridge map's residuals there (shrinkage ``λ`` toward the global map, strong for
  clusters with few pairs), the ``blend`` nearest clusters mixed by a softmax of centroid cosine.
  Returns an :class:`align.ClusterMap` (same ``apply``/``save``/``load`` surface, not a
  ``LinearMap``: no ``compose``/``inverse``). ``n_clusters``, ``λ``, ``blend`` and ``τ`` are chosen
  on the held-out pairs. In ``auto`` it wins only when its held-out score beats the best linear
  family by ``cluster_margin`` (0.01): a linear map is simpler, faster and composable. ``W`` is
  ``k d_s d_t`` float32: counts over ``max_cluster_mib`` (256) are not tried (not even 2: ``auto``
  goes without the family), and a given ``n_clusters`` over it is an InputError.
"""

from __future__ import annotations

import time

import numpy as np

from .validation import (as_matrix, check_csls_weight, check_labelled_queries, check_not_collapsed, check_paired,
                         check_random_state, check_rankable, check_same_queries, collapsed, distinct_pairs,
                         pair_groups, seed_record)
from .chain import MapChain, check_map, check_map_documents
from .cluster import ClusterMap, cluster_grid
from .exceptions import DimensionMismatchError, InputError, TooFewRowsError
from .families import (Problem, cluster_candidate, cluster_parts, contrastive_candidate, contrastive_config,
                       lowrank_candidate, procrustes_candidate, ridge_candidate)
from .frames import unit_rows
from .holdout import check_holdout as _check_holdout
from .holdout import n_holdout as _n_holdout
from .holdout import scored_by as _scored
from .holdout import split as _split
from .maps import LinearMap
from .metrics import query_sample, undefined_recall
from .options import check_callable, check_migration_options, check_number
from .retrieval import hubness, labelled_metrics, labelled_retrieval, pair_retrieval_scores, ratios

__all__ = ["fit_migration", "check_options", "MIGRATION_METHODS", "AUTO_CANDIDATES", "LINEAR_CANDIDATES", "score_map",
           "labelled_retention"]

MIGRATION_METHODS = ("auto", "procrustes", "ridge", "lowrank", "contrastive", "cluster")
AUTO_CANDIDATES = ("procrustes", "ridge", "lowrank", "contrastive", "cluster")
LINEAR_CANDIDATES = ("procrustes", "ridge", "lowrank", "contrastive")  # those returning a LinearMap
DEFAULT_ALPHAS = (1e-3, 1e-2, 0.1, 0.3)  # ridge α / K
_REFIT_CONTRASTIVE_BELOW = 4000  # pairs; above, the selection run's best epoch is kept (half the fit time)
_OPTIONS = {"holdout", "candidates", "alphas", "alpha", "rank", "contrastive", "semi_supervised", "epochs",
            "temperature", "reg", "hard_negatives", "batch_size", "lr", "max_holdout", "sinkhorn",
            "n_clusters", "shrink", "blend", "cluster_temperature", "cluster_margin", "max_cluster_mib"}


def score_map(map_: LinearMap | ClusterMap | MapChain, X_src, Y_tgt, *, k: int = 10, max_queries: int | None = None,
              random_state=0) -> dict:
    """Held-out retrieval scores of ``map_`` (any map: LinearMap, ClusterMap, MapChain) on pairs ``X_src`` (n, d_s)
    → ``Y_tgt`` (n, d_t) (see :mod:`align.retrieval`).

    ``max_queries``: at most that many pairs act as queries (:func:`align.metrics.query_sample` with
    ``random_state``, the rows :func:`align.evaluate` draws with the same arguments), each against all n rows;
    ``None`` or ``>= n``: every pair (the exact figures). Sampled figures come with ``intervals``.
    ``nn_retention@k`` (``overlap@k``, ``score`` and the two ``recall@k``) are NaN on fewer than ``k + 2``
    (``k + 1``) distinct pairs, with a VecbridgeWarning below ``k + 1`` (:func:`align.metrics.undefined_recall`).
    Repeated pairs are scored once (:func:`align.validation.distinct_pairs`; ``n_repeated`` says how many rows
    repeated one, ``n_pairs`` counts the distinct ones).
    """
    check_map(map_, "score_map needs a map")  # None was an AttributeError
    k = check_number("k", k, 1, 1 << 31, whole=True)  # k=0 scored NaN, k=-1 keyed "corpus_recall@-1"
    X, Y = check_paired(X_src, Y_tgt, names=("X_src", "Y_tgt"), min_rows=2)
    if X.shape[1] != map_.source_dim or Y.shape[1] != map_.target_dim:
        raise DimensionMismatchError(
            f"map is {map_.source_dim}->{map_.target_dim}, pairs are {X.shape[1]}->{Y.shape[1]}")
    check_rankable(X, name="X_src")  # all-zero or constant targets tie with every partner: a useless map scored 1.0
    check_rankable(Y, name="Y_tgt")
    X, Y, repeated = distinct_pairs(X, Y)
    rows = query_sample(X.shape[0], max_queries, random_state)
    M = check_not_collapsed(map_.apply(X, output="raw", validate=False),
                            name="mapped X_src")  # else corpus-side recall 1.0
    out = {**pair_retrieval_scores(M, unit_rows(Y), k=k, rows=rows), "n_repeated": repeated}
    # @k needs k other rows besides the query (and its relevant one): on fewer the figures were of a smaller k under
    # the @k name (3 pairs: nn_retention@10 was @1); undefined instead, as on 2 pairs
    for name, need in ((f"nn_retention@{k}", k + 2), (f"overlap@{k}", k + 1), ("score", k + 1),
                       (f"corpus_recall@{k}", k + 1), (f"query_recall@{k}", k + 1)):
        if X.shape[0] < need:
            out[name] = float("nan")
            out.get("intervals", {}).pop(name, None)
    undefined_recall([k], X.shape[0], "score_map")  # recall@k as evaluate's: 8 random pairs scored recall@10 1.0
    return out


def labelled_retention(map_, X_src, Y_tgt, queries, relevant, *, side: str = "target", k: int = 10,
                       old_queries=None, random_state=0, csls_weight=None, csls_k: int = 10) -> dict:
    r"""Retention of labelled retrieval on a held-out corpus embedded by both models (a CI gate's figure).

    ``X_src`` (n, d_s) / ``Y_tgt`` (n, d_t): n documents under the map's source and target model, row
    by row; ``relevant`` (q,) int: the row of each query's one relevant document.

    - ``side="target"`` (corpus-side migration: an old index mapped into the new space): ``queries``
      (q, d_t) are new-model queries; migrated index = ``map(X_src)``, native index = ``Y_tgt``.
    - ``side="source"`` (query-side, Drift-Adapter: a map fitted new → old serves new-model queries
      from the untouched old index): ``queries`` (q, d_s) are source-model queries; migrated =
      ``map(queries)`` against ``Y_tgt``, native = ``queries`` against ``X_src``.

    ``old_queries`` (q, ·): the same queries under the old model (the source model for
    ``side="target"``, the target model for ``side="source"``) adds the baseline a migration has to
    beat, keeping the old model: ``old`` (its metrics over the old documents), ``old_retention``
    (old / native-new per metric) and ``beats_old`` (migrated R@k >= old R@k).

    Returns :func:`align.retrieval.labelled_retrieval`'s dict plus ``side``; ``retention["R@{k}"]``
    is the figure ``bench_migration.py`` reports, ``retention_interval["R@{k}"]`` its 95 % bootstrap
    interval over the queries (seeded by ``random_state``).

    ``csls_weight`` w (in [0, 2]): the migrated index is searched by CSLS as the service's ``csls`` search
    ranks, ``cos(q, d) - (w / 2) r(d)`` with ``r(d)`` the mean cosine of ``d`` to its ``csls_k`` nearest
    other documents of that index (:func:`align.retrieval.hubness`), here exactly over all documents (the
    service re-ranks its top ``max(4k, k + csls_k)`` by cosine; measured on Bible and WordNet minilm→mpnet maps
    from 1,000 pairs the two R@10 retentions were within ±0.002 at w = 0.5, up to 0.012 apart at w = 1); the
    native index stays plain cosine (the re-embedding it is compared with).

    Typed errors: mismatched rows or dimensions, NaN/Inf, an all-zero query, ``relevant`` not integers in
    ``[0, n)`` or not one per query, an unknown ``side``, ``csls_weight`` / ``csls_k`` out of range.
    """
    X, Y = check_map_documents(map_, X_src, Y_tgt, "labelled_retention")
    if side not in ("target", "source"):
        raise InputError(f"side must be 'target' (corpus-side) or 'source' (query-side), got {side!r}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise InputError(f"k must be a positive integer, got {k!r}")
    Q, rel = check_labelled_queries(queries, relevant, X.shape[0],
                                    dim=map_.target_dim if side == "target" else map_.source_dim)
    if csls_weight is not None:
        csls_weight = check_csls_weight(csls_weight)
    if isinstance(csls_k, bool) or not isinstance(csls_k, (int, np.integer)) or not 1 <= csls_k <= 1000:
        raise InputError(f"csls_k must be an integer between 1 and 1000, got {csls_k!r}")
    if side == "target":
        Qm = Qn = unit_rows(Q)
        # one vector for every document tied each with the relevant one: retention 1.0 for a map that says nothing
        Dm, Dn = check_not_collapsed(unit_rows(map_.apply(X, output="raw")), name="mapped documents"), unit_rows(Y)
    else:
        Qm, Dm, Qn, Dn = unit_rows(map_.apply(Q, output="raw")), unit_rows(Y), unit_rows(Q), unit_rows(X)
    pen = None if csls_weight is None else 0.5 * csls_weight * hubness(Dm, int(csls_k))
    out = labelled_retrieval(Qm, Dm, Qn, Dn, rel, k=int(k), random_state=random_state, doc_penalty=pen)
    out["side"] = side
    out["csls_weight"] = csls_weight
    if old_queries is not None:
        old_docs = X if side == "target" else Y
        Qo = check_same_queries(old_queries, Q.shape[0], dim=old_docs.shape[1])
        old = labelled_metrics(unit_rows(Qo), unit_rows(old_docs), rel, k=int(k))
        out["old"] = old
        out["old_retention"] = ratios(old, out["native"])
        out["beats_old"] = bool(out["migrated"][f"R@{int(k)}"] >= old[f"R@{int(k)}"])
    return out


def _select_cluster(P: Problem, tr, val, ridge: LinearMap, alpha: float, opts: dict, rng) -> tuple[dict, dict]:
    """Best (n_clusters, λ) on the held-out pairs at the first (blend, τ), then the best (blend, τ) for it.

    Returns (its scores, its settings). Two stages keep the held-out scorings to
    ``|counts| |λ| + |blends| - 1`` rather than the product."""
    counts, shrinks, blends, _ = cluster_grid(opts, len(tr), dims=(P.X.shape[1], P.Y.shape[1]))
    best = None
    for k in counts:
        C, res = cluster_parts(P, tr, k, ridge, rng)
        for lam in shrinks:
            m = cluster_candidate(P, C, res, lam, *blends[0], alpha)
            s = _score(P, m, val)
            if best is None or s["score"] > best[0]["score"]:
                best = (s, m, C, res, {"n_clusters": k, "shrink": lam, "blend": blends[0][0],
                                       "temperature": blends[0][1], "alpha": alpha})
    s, m, C, res, setting = best
    for blend, tau in blends[1:]:
        m2 = cluster_candidate(P, C, res, setting["shrink"], blend, tau, alpha)
        s2 = _score(P, m2, val)
        if s2["score"] > s["score"]:
            s, m, setting = s2, m2, {**setting, "blend": blend, "temperature": tau}
    scores = _score(P, m, val, retention=True, again=True)
    return {**scores, **{k: v for k, v in setting.items() if k != "alpha"}}, setting


#: the lead of each refusal of semi_supervised with auto (align.semisup.sinkhorn_refine_map): what it refines; the
#: affine map it leaves as fitted is the note of a fit that goes ahead (procrustes among the candidates), not this
_SEMI_REFINES = "semi_supervised refines an orthogonal Procrustes map only, and auto tries no cluster map with it:"


def check_options(method: str, options: dict, n_pairs: int | None = None,
                  dims: tuple[int, int] | None = None) -> dict:
    """Every check :func:`fit_migration` makes before it reads a row: the method, unknown options, each option's
    type and range (:func:`align.options.check_migration_options`, the contrastive and cluster ones, holdout);
    with ``n_pairs`` (K, when known) its checks of K too: at least 2 pairs, 4 for ``auto``, a ``holdout`` that
    leaves 2 to fit, no more clusters than pairs; with ``dims`` (d_s, d_t) a ``rank`` given above the narrower
    side (it was cut to it silently and recorded as given). A service calls it when a fit is requested, so a bad
    option is refused then, not by a failed job. Returns the options with ``candidates`` as a tuple."""
    unknown = set(options) - _OPTIONS
    if unknown:
        raise InputError(f"unknown option(s) {sorted(unknown)}; known: {sorted(_OPTIONS)}")
    if method not in MIGRATION_METHODS:
        raise InputError(f"unknown method {method!r}; choose from {', '.join(MIGRATION_METHODS)}")
    options = check_migration_options(options)
    candidates = tuple(options.get("candidates", AUTO_CANDIDATES))
    bad = [c for c in candidates if c not in AUTO_CANDIDATES]
    if bad or not candidates:
        raise InputError(f"candidates must be a non-empty subset of {AUTO_CANDIDATES}, got {list(candidates)}")
    only = method == "cluster" or candidates == ("cluster",)  # over the map budget is an error, not a family skipped
    if "cluster" in candidates or method == "cluster":  # types and ranges (against the pairs: checked with them)
        cluster_grid(options, 1 << 62, dims=dims, required=only)
    if (method == "auto" and "contrastive" in candidates) or method == "contrastive":
        contrastive_config(options)
    if options.get("semi_supervised") and method not in ("auto", "procrustes"):  # ridge, lowrank: never refined
        raise InputError(f"semi_supervised refinement needs an orthogonal map (procrustes); it cannot follow "
                         f"method={method!r}")
    if options.get("semi_supervised") and method == "auto" and set(candidates) == {"cluster"}:  # procrustes was fit
        raise InputError(_SEMI_REFINES + " candidates=['cluster'] leave auto nothing to fit: give candidates with "
                         "procrustes, or drop semi_supervised")
    if options.get("semi_supervised") and method == "auto" and "procrustes" not in candidates:  # as cluster alone
        raise InputError(_SEMI_REFINES + f" candidates={list(candidates)} hold no procrustes, so auto would choose a "
                         "map it never refines: add procrustes to them, or drop semi_supervised")
    _check_holdout(options.get("holdout", 0.2), options.get("max_holdout", 1000))
    if dims is not None and "rank" in options and options["rank"] > min(dims):
        raise InputError(f"rank must be in [1, {min(dims)}] (the narrower side is {min(dims)}-d), "
                         f"got {options['rank']}")
    if n_pairs is not None:
        if n_pairs < 2:
            raise TooFewRowsError(f"a paired fit needs at least 2 pairs, got {n_pairs}")
        if method == "auto" or n_pairs >= 20:  # fit_migration holds pairs out
            _n_holdout(n_pairs, options.get("holdout", 0.2), options.get("max_holdout", 1000), what=_scored(method))
        if "cluster" in candidates or method == "cluster":
            cluster_grid(options, n_pairs, dims=dims, strict=True, required=only)
    return options


def _score(P: Problem, m: LinearMap, val, *, retention: bool = False, again: bool = False) -> dict:
    """Held-out scores; the unpaired rows (a sample) compete as the rest of the corpus / index. Each map scored
    counts in ``P.n_scored`` (``again``: a map scored before): the best of that many is chosen on these rows."""
    P.n_scored += 0 if again else 1
    extra_M = None if P.Us_sample is None else m.apply(P.Us_sample, output="raw", validate=False)
    M = m.apply(P.X[val], output="raw", validate=False)
    out = pair_retrieval_scores(M, P.T[val], extra_M=extra_M, extra_T=P.Ut_sample, retention=retention)
    if collapsed(M):  # every held-out row mapped to one vector: each corpus-side rank tied with all, counted a hit
        out.update({key: 0.0 for key in out if key.startswith("corpus_")}, score=0.0, collapsed=True)
    return out


def _select(P: Problem, tr, val, candidates, opts, rng) -> tuple[str, dict, dict, str]:
    """Fit every candidate on ``tr``, score on ``val``; returns (best name, its settings, all scores, why it)."""
    scores: dict = {}
    settings: dict = {}
    t0 = time.perf_counter()
    proc = procrustes_candidate(P, tr, opts)
    scores["procrustes"] = {**_score(P, proc, val, retention=True), "seconds": time.perf_counter() - t0}
    settings["procrustes"] = {}
    t0 = time.perf_counter()
    alphas = [opts["alpha"]] if "alpha" in opts else list(opts.get("alphas", DEFAULT_ALPHAS))
    if not set(candidates) & {"ridge", "lowrank", "contrastive", "cluster"}:  # the readers of the ridge grid's fits
        alphas = []  # procrustes alone: the grid's 4 fits were made and scored for no one
    best_r = None
    for i, a in enumerate(alphas):
        P.report("select: ridge", i / len(alphas))  # progress, and where a cancel stops the grid
        m = ridge_candidate(P, tr, float(a))
        s = _score(P, m, val)
        if best_r is None or s["score"] > best_r[1]["score"]:
            best_r = (m, s, float(a))
    ridge, s_r, alpha = best_r or (None, None, None)
    if "ridge" in candidates:
        s_r = _score(P, ridge, val, retention=True, again=True)
        scores["ridge"] = {**s_r, "alpha": alpha, "seconds": time.perf_counter() - t0}
        settings["ridge"] = {"alpha": alpha}
    if "lowrank" in candidates:
        t0 = time.perf_counter()
        rank = int(opts.get("rank", 32))
        m = lowrank_candidate(P, tr, rank, alpha, proc)
        scores["lowrank"] = {**_score(P, m, val, retention=True), "rank": rank, "seconds": time.perf_counter() - t0}
        settings["lowrank"] = {"rank": rank, "alpha": alpha}
    if "contrastive" in candidates:
        t0 = time.perf_counter()
        warm_name = "ridge" if s_r["score"] >= scores["procrustes"]["score"] else "procrustes"
        warm = ridge if warm_name == "ridge" else proc
        cfg = contrastive_config(opts)
        per_epoch: list = []

        kept: dict = {}

        def cb(epoch, W, b):
            P.report("select: contrastive", (epoch + 1) / cfg.epochs)
            m = P.linear(W, b, {})
            per_epoch.append(_score(P, m, val))
            if per_epoch[-1]["score"] >= max(s["score"] for s in per_epoch):
                kept["Wb"] = (W.astype(np.float64), b.astype(np.float64))

        fitted = contrastive_candidate(P, tr, cfg, warm, rng, callback=cb)
        best_e = int(np.argmax([s["score"] for s in per_epoch]))
        fitted = P.linear(*kept["Wb"], fitted.metadata)
        fitted.metadata["params"]["epochs"] = best_e + 1
        per_epoch[best_e] = _score(P, fitted, val, retention=True, again=True)
        scores["contrastive"] = {**per_epoch[best_e], "epochs": best_e + 1, "warm_start": warm_name,
                                 "score_per_epoch": [round(s["score"], 4) for s in per_epoch],
                                 "seconds": time.perf_counter() - t0}
        settings["contrastive"] = {"epochs": best_e + 1, "warm_start": warm_name, "alpha": alpha,
                                   "trained": fitted if len(tr) + len(val) >= _REFIT_CONTRASTIVE_BELOW else None}
    if "cluster" in candidates:
        t0 = time.perf_counter()
        scores["cluster"], settings["cluster"] = _select_cluster(P, tr, val, ridge, alpha, opts, rng)
        scores["cluster"]["seconds"] = time.perf_counter() - t0
    if "procrustes" not in candidates:
        scores.pop("procrustes")
    best = max(scores, key=lambda k: scores[k]["score"])
    why = "the only candidate fitted" if len(scores) == 1 else f"the best held-out score of {len(scores)} candidates"
    linear = [k for k in scores if k != "cluster"]
    if best == "cluster" and linear:  # a linear map unless the local maps are clearly better
        best_lin = max(linear, key=lambda k: scores[k]["score"])
        margin = float(opts.get("cluster_margin", 0.01))
        if scores["cluster"]["score"] < scores[best_lin]["score"] + margin:
            best = best_lin
            why = (f"the best linear family: cluster's held-out score {scores['cluster']['score']:.4g} does not beat "
                   f"{best_lin}'s {scores[best_lin]['score']:.4g} by cluster_margin {margin:g}")
    return best, settings[best], scores, why


def _candidate_record(scores: dict) -> dict:
    """A candidate's held-out scores as ``selection["candidates"]`` records them, floats rounded. Its cosine is of
    the raw output with the native target rows (what a transform returns), named ``cos_raw`` as the fit's
    ``train_cos_raw`` and eval's ``cos_raw`` (a bare ``cos`` is of the target's centred frame there: records before
    this name held the same raw figure as ``cos``)."""
    return {("cos_raw" if k == "cos" else k): (round(v, 5) if isinstance(v, float) else v) for k, v in scores.items()}


def _fit_final(P: Problem, name: str, setting: dict, opts: dict, rng) -> LinearMap:
    idx = np.arange(P.X.shape[0])
    if name == "procrustes":
        return procrustes_candidate(P, idx, opts)
    alpha = float(setting.get("alpha", opts.get("alpha", 1e-2)))
    if name == "ridge":
        return ridge_candidate(P, idx, alpha)
    if name == "lowrank":
        rank = int(setting.get("rank", opts.get("rank", 32)))
        return lowrank_candidate(P, idx, rank, alpha, procrustes_candidate(P, idx, opts))
    if name == "cluster":
        if not setting:  # no selection (fewer than 20 pairs): fewest clusters, strong shrinkage, first blend
            counts, shrinks, blends, _ = cluster_grid(opts, len(idx), dims=(P.X.shape[1], P.Y.shape[1]))
            setting = {"n_clusters": counts[0], "shrink": shrinks[-1], "blend": blends[0][0], "temperature": blends[0][1]}
        C, res = cluster_parts(P, idx, int(setting["n_clusters"]), ridge_candidate(P, idx, alpha), rng)
        return cluster_candidate(P, C, res, float(setting["shrink"]), int(setting["blend"]),
                                 float(setting["temperature"]), alpha)
    if setting.get("trained") is not None:  # many pairs: keep the best epoch of the selection run (80 % of the pairs)
        m = setting["trained"]
        m.metadata["params"]["refit_on_all_pairs"] = False
        return m
    cfg = contrastive_config(opts)
    if "epochs" in setting:
        cfg.epochs = int(setting["epochs"])
    ridge_warm = setting.get("warm_start", "ridge") == "ridge"
    warm = ridge_candidate(P, idx, alpha) if ridge_warm else procrustes_candidate(P, idx, opts)
    return contrastive_candidate(P, idx, cfg, warm, rng,
                        callback=lambda epoch, W, b: P.report("final fit: contrastive", (epoch + 1) / cfg.epochs))


def fit_migration(X_src, Y_tgt, *, method: str = "auto", unpaired_source=None, unpaired_target=None,
                  random_state=0, progress=None, **options) -> LinearMap | ClusterMap:
    """Fit a map from old-model rows to new-model rows for retrieval (see the module docstring).

    Parameters
    ----------
    X_src : array (K, d_s)      old-model embeddings of K texts (raw; any norm)
    Y_tgt : array (K, d_t)      new-model embeddings of the same texts, row i ↔ row i
    method : {"auto", "procrustes", "ridge", "lowrank", "contrastive", "cluster"}
    unpaired_source : array (n, d_s), optional   more old-model rows (e.g. the whole old corpus):
        the source frame and hard negatives come from them
    unpaired_target : array (m, d_t), optional   more new-model rows (e.g. queries): target frame
        and hard negatives
    random_state : int or Generator   split, batch order (same seed → same map)
    progress : callable(stage: str, fraction: float), optional   called at each stage and contrastive epoch;
        an exception it raises (e.g. :class:`~align.exceptions.Cancelled`) stops the fit
    **options : holdout (0.2), max_holdout (1000), candidates (auto), alphas / alpha (ridge α / K),
        rank (32), contrastive options (epochs, temperature, reg, hard_negatives, batch_size, lr),
        semi_supervised (None or "sinkhorn"); cluster: n_clusters, shrink (λ), blend, cluster_temperature
        (each fixes its axis of the held-out grid), cluster_margin (0.01, auto only), max_cluster_mib (256: no
        cluster count whose W is larger; ``selection["cluster_budget"]`` says what auto left out).

    Returns
    -------
    LinearMap (ClusterMap for ``"cluster"``) with ``metadata["method"]`` the chosen family and ``metadata["selection"]`` the
    held-out scores of every candidate (``auto``) or of the one method (when K ≥ 20); its ``note`` says when a given
    ``n_clusters`` was capped at the training pairs of that split (``metadata["params"]`` has the count used).

    Raises
    ------
    TooFewRowsError (K < 2; auto with K < 4; n_clusters > K), PairCountError, NonFiniteError, DimensionMismatchError,
    InputError (unknown method or option; n_clusters over max_cluster_mib).
    """
    check_callable("progress", progress)
    X, Y = check_paired(X_src, Y_tgt, names=("X_src", "Y_tgt"), min_rows=2)
    options = check_options(method, options, dims=(X.shape[1], Y.shape[1]))
    Us = None if unpaired_source is None else as_matrix(unpaired_source, name="unpaired_source", dim=X.shape[1])
    Ut = None if unpaired_target is None else as_matrix(unpaired_target, name="unpaired_target", dim=Y.shape[1])
    rng = check_random_state(random_state)
    t_start = time.perf_counter()
    P = Problem(X, Y, Us, Ut)
    if progress is not None:
        P.report = progress
    n = X.shape[0]
    candidates = tuple(options.get("candidates", AUTO_CANDIDATES))
    budget: dict = {}
    if "cluster" in candidates or method == "cluster":  # more clusters than pairs fails before any fit
        counts, _, _, budget = cluster_grid(options, n, dims=(X.shape[1], Y.shape[1]), strict=True,
                                            required=method == "cluster" or candidates == ("cluster",))
        if not counts:  # auto: not even 2 clusters within max_cluster_mib
            candidates, budget = tuple(c for c in candidates if c != "cluster"), {**budget, "skipped": True}
    left_out: dict = {}
    if options.get("semi_supervised") and "cluster" in candidates and method == "auto":  # it refines procrustes
        candidates = tuple(c for c in candidates if c != "cluster")  # cluster alone: refused by check_options
        left_out["cluster"] = "semi_supervised refines an orthogonal Procrustes map only; a cluster map cannot be " \
                              "refined"
    if method == "auto" and not candidates:  # each family asked for was left out (check_options refuses these first)
        why = left_out.get("cluster") or "not even 2 clusters fit max_cluster_mib"
        raise InputError(f"auto has no candidate left to fit: candidates=['cluster'], and {why}")
    selection: dict = {}
    if method == "auto" or n >= 20:
        groups = pair_groups(X, Y)
        tr, val = _split(n, options.get("holdout", 0.2), options.get("max_holdout", 1000), rng, groups,
                         _scored(method))
        cands = candidates if method == "auto" else (method,)
        # candidates are fitted and scored in frames of the training pairs: frames of all K pairs were shaped by the
        # held-out rows too (K=100 WordNet pairs: held-out top-1 0.80 recorded, 0.60 in training frames)
        S = Problem(X, Y, Us, Ut, frame_rows=tr)
        S.report = P.report
        S.distractors(rng)
        S.report("select", 0.0)
        name, setting, scores, why = _select(S, tr, val, cands, options, rng)  # one candidate unless auto
        selection = {"metric": "score = mean(corpus_mrr, query_mrr, overlap@10) on held-out pairs",
                     "n_train": int(tr.size), "n_holdout": int(val.size), "chosen": name,
                     "why_chosen": why if method == "auto" else f"method={method!r} was asked for",
                     "n_compared": S.n_scored, "repeated_pairs": 0 if groups is None else int(n - groups[0].size),
                     "refit_on_all_pairs": setting.get("trained") is None,
                     "candidates": {k: _candidate_record(v) for k, v in scores.items()},
                     **({"cluster_budget": budget} if budget and method in ("auto", "cluster") else {}),
                     **({"not_tried": left_out} if left_out else {})}
        if left_out and "candidates" in options:  # named ones not all fitted: a note (default auto: not_tried only)
            selection["note"] = "; ".join(f"{k} not tried: {v}" for k, v in left_out.items())
        if name == "cluster" and options.get("n_clusters", 0) > tr.size:  # the chosen map's count was capped: say so
            selection["note"] = (f"n_clusters={options['n_clusters']} capped at {tr.size}: the count is chosen on "
                                 f"the {tr.size} training pairs ({val.size} of {n} held out to score the fit), and "
                                 f"each cluster needs a pair")
        del S  # its copies of the unpaired rows, before the final fit makes its own
    else:
        name, setting = method, {}
    P.report("final fit", 0.0)
    map_ = _fit_final(P, name, setting, options, rng)
    if options.get("semi_supervised"):
        from .semisup import sinkhorn_refine_map

        map_ = sinkhorn_refine_map(P, map_, **dict(options.get("sinkhorn") or {}))
    map_.metadata.update({"n_pairs": int(n), "requested_method": method, "selection": selection,
                          "n_unpaired_source": 0 if Us is None else int(Us.shape[0]),
                          "n_unpaired_target": 0 if Ut is None else int(Ut.shape[0]),
                          "random_state": seed_record(random_state),
                          "fit_seconds": round(time.perf_counter() - t_start, 3)})
    return map_
