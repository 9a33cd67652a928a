"""Migration planning shared by the CLI and HTTP: fit a migration map, plan before the fit, gate a map.

- :func:`fit_migration_map` — :func:`align.fit_migration` with service parameters (``params`` dict
  from ``--param`` / the JSON body); used by :func:`service.ops.maps.fit_map` for the methods
  ``auto``, ``contrastive`` and ``cluster``.
- :func:`plan` — :func:`align.plan_migration` on the old corpus and a paired probe.
- :func:`retention_gate` — held-out pairs → retrieval scores of a map and PASS/FAIL against a
  minimum retention. With labelled queries (``queries`` and the row of each one's ``relevant``
  document among the held-out pairs), **retention** is that of labelled retrieval,
  ``R@10(migrated) / R@10(native)`` over the held-out documents (:func:`align.labelled_retention`;
  corpus-side, or query-side with ``side="source"``): the figure a migration is judged by. Over the held-out
  documents alone it is higher than over the corpus a migration maps; with ``old_corpus`` (and ``old_queries``)
  it is over the whole corpus (:func:`align.corpus_retention`), the figure the labelled plan forecasts, and the
  gate reads that one.
  Without queries it is the proxy ``nn_retention@10`` (:func:`align.retrieval.nn_retention`):
  each native new-model row of the held-out pairs is a query whose relevant document is its
  native nearest other row; retention is the share of queries whose relevant document is still
  in the top 10 of the mapped old rows (native recall is 1 by construction, so this is the
  ratio migrated / native). ``plan`` scores the same statistic with mapped corpus rows as distractors, so the
  two do not compare; on labelled benchmarks it
  neither bounds nor tracks labelled retention across data sets
  (``benchmarks/results/plan_proxies_2026-12-01.md``), so gate on labelled queries when you have them.
- :func:`evaluate_map` — a registered map on held-out pairs: :func:`align.evaluate` (top-1, mean
  rank, cosine, recall@10, optional CSLS), the retention gate, PASS/FAIL against ``min_top1`` /
  ``min_retention``, optionally recorded as ``eval.*`` tags on the version.
"""

from __future__ import annotations

import json

import numpy as np

import align
from align.exceptions import DimensionMismatchError, InputError, PairCountError
from align.frames import unit_rows
from align.retrieval import CHANCE_LEVEL, chance_p_value, expected_hits
from align.validation import distinct_pairs

from ..indexes.csls import CSLS_WEIGHT
from ..progress import checkpoint, stoppable
from ..spaces import check_pair_spaces, check_rows, map_references

__all__ = ["MIGRATION_METHODS", "fit_migration_map", "check_semi_supervised", "plan", "retention_gate", "evaluate_map",
           "check_eval_spaces", "check_corpus_space", "proxy_chance", "top1_chance", "chance_verdict",
           "retention_scope", "RETENTION_KEY", "LABELLED_KEY", "EVAL_MAX_QUERIES"]

MIGRATION_METHODS = ("auto", "contrastive", "cluster")
#: pairs ranked by `eval` (CLI / HTTP) unless told otherwise: a seeded sample of this many above it, each still
#: ranked against every held-out row (SCALING.md: 100,000 pairs took 1,039 s in full, 68 s capped)
EVAL_MAX_QUERIES = 10_000
RETENTION_KEY = "nn_retention@10"
LABELLED_KEY = "labelled R@10 retention"


def fit_migration_map(X: np.ndarray, Y: np.ndarray, *, method: str, params: dict | None, random_state=0,
                      unpaired_source=None, unpaired_target=None, progress=None) -> align.LinearMap | align.ClusterMap:
    """Fit a migration map from paired rows ``X`` (K, d_s) → ``Y`` (K, d_t); typed errors on bad input.

    ``auto`` chooses among align's default candidates (:data:`align.migration.AUTO_CANDIDATES`, the
    per-cluster family included) unless ``params["candidates"]`` narrows them; ``cluster`` fits an
    :class:`align.ClusterMap`. The registry, paths, transforms and migrations take either kind.
    ``progress(stage, fraction)`` is called per stage and contrastive epoch (a job's cancel raises from it).
    """
    params = dict(params or {})
    check_semi_supervised(params, unpaired_source is not None and unpaired_target is not None)
    try:
        return align.fit_migration(X, Y, method=method, random_state=random_state, unpaired_source=unpaired_source,
                                   unpaired_target=unpaired_target, progress=progress, **params)
    except TypeError as exc:
        raise InputError(f"bad parameter for {method}: {exc}") from None


def check_semi_supervised(params: dict | None, unpaired: bool) -> None:
    """``semi_supervised`` refines a map with unpaired rows of both models: without both sets it was accepted, never
    ran, and the registry recorded it as a parameter of the map; an InputError instead."""
    if (params or {}).get("semi_supervised") and not unpaired:
        raise InputError("semi_supervised refines a map with unpaired rows of both models, and this fit is not given "
                         "both (it would never run): give unpaired rows of each (CLI --unpaired-source and "
                         "--unpaired-target; HTTP unpaired_source and unpaired_target), or drop the parameter")


def plan(X_old: np.ndarray, probe_src: np.ndarray, probe_tgt: np.ndarray, *, random_state=0,
         target_retention: float = 0.95, queries=None, old_queries=None, relevant=None, progress=None,
         names: tuple[str, str, str] = ("old", "probe_source", "probe_target"), k: int | None = None,
         k_name: str = "k", keep: bool = False) -> dict:
    """The plan of :func:`align.plan_migration` (JSON-safe dict); with labelled ``queries`` (new model),
    ``old_queries`` (the same, old model) and ``relevant`` (probe rows), of their labelled retention.
    ``progress(stage, fraction)`` follows its learning curve and row selection. ``names``: what the errors call
    the three sets (default: the HTTP fields; the CLI passes its options). ``k`` (called ``k_name`` in errors):
    ``rows_to_embed`` holds the rows to re-embed for that budget (also ``rows_k``) instead of the recommended K's,
    drawn as the plan draws its own (the recommended K as ``k`` gives the plan's own rows; every row of ``X_old``,
    the whole corpus's or ``k`` = its size, is ``rows_to_embed_all`` with ``rows_to_embed`` empty, not listed);
    more than the rows of ``X_old`` is refused before the plan runs. ``keep``: the migration keeps its re-embedded
    rows' own new-model vectors, so the recommendation reads each K's ``kept`` forecast (``recommended.forecast``
    says which it read). Work that can be stopped (:func:`service.progress.run_stoppable`: an HTTP client that
    left) stops at the next report."""
    n_old = np.shape(X_old)[0] if np.ndim(X_old) == 2 else None
    if isinstance(k, (int, np.integer)) and not isinstance(k, bool) and n_old is not None and k > n_old:
        raise InputError(f"{k_name} {k} is more rows than {names[0]} holds ({n_old}): the rows to re-embed are "
                         f"rows of {names[0]}; give {k_name} at most {n_old}")
    res = align.plan_migration(X_old, probe_src, probe_tgt, random_state=random_state,
                               target_retention=target_retention, queries=queries, old_queries=old_queries,
                               relevant=None if relevant is None else np.asarray(relevant),
                               progress=stoppable(progress), names=names, rows_k=k, keep=keep)
    if k is not None:
        res["rows_k"] = int(k)
    return res


def retention_gate(map_, X: np.ndarray, Y: np.ndarray, *, min_retention: float | None, queries=None,
                   relevant=None, side: str = "target", old_queries=None, csls_weight: float | None = None,
                   max_queries: int | None = None, random_state=0, old_corpus=None,
                   old_corpus_name: str = "old_corpus") -> dict:
    """Scores of ``map_`` on held-out pairs and, with ``min_retention``, ``passed`` / ``result``.

    ``queries`` (q, d) with ``relevant`` (q,) rows of ``X``/``Y``: ``labelled`` holds
    :func:`align.labelled_retention` and ``retention`` / ``retention_metric`` its R@10 retention; otherwise they are
    the ``nn_retention@10`` proxy. A labelled retention is None (undefined) when no query finds its relevant
    document natively, the proxy NaN on fewer than 12 distinct pairs; a gate on either raises InputError (it can be
    neither passed nor failed), as does a gate above 0 on a figure at chance (:func:`_undecided`); ``proxy`` is
    :func:`proxy_chance` of the proxy, gate or not. ``old_queries``
    (the same queries under the old model) adds the keep-the-old-model baseline (``labelled["old"]``,
    ``["beats_old"]``). Labelled retention also gives ``retention_interval`` (its 95 % bootstrap interval over the
    queries) and, with a gate, ``gate_within_interval``: the verdict follows the measured retention, but when the
    gate lies inside the interval these queries cannot tell the two apart (more labelled queries would).
    ``csls_weight``: the migrated index is searched by CSLS with that weight (as the service's ``csls`` search);
    ``labelled`` and the gate are then of that search, ``labelled_plain`` keeps plain cosine search. ``max_queries``
    / ``random_state``: the pair scores rank a sample of the pairs against all of them (:func:`align.score_map`);
    labelled queries are always all used (``random_state`` seeds their bootstrap).

    ``old_corpus`` (m, d_s): the old model's vectors of the rest of the corpus (corpus-side, with ``old_queries``):
    ``corpus`` holds :func:`align.corpus_retention`, the retention over the held-out documents and those rows
    mapped (the figure :func:`plan` forecasts), and ``retention`` / ``retention_interval`` / the gate are of it
    (``retention_scope`` ``"corpus"``; ``retention_heldout`` keeps the held-out one). Without it the scope is
    ``"held-out"``: the held-out documents alone, which a migrated corpus's other rows do not compete with (WordNet
    minilm→e5, 2,000 pairs: 0.82 over 1,000 held-out documents, 0.55 over the 40,960 of the corpus). An old corpus
    with no row but the held-out documents' is an InputError naming ``old_corpus_name`` (what the caller calls it).
    """
    if (queries is None) != (relevant is None):
        raise InputError("labelled queries need both the queries and the row of each one's relevant document")
    if old_queries is not None and queries is None:
        raise InputError("old-model queries are the baseline of labelled queries: give the queries and relevant rows too")
    check_old_corpus(old_corpus, queries, old_queries, side, csls_weight)
    res = align.score_map(map_, X, Y, max_queries=max_queries, random_state=random_state)
    if queries is not None:
        checkpoint()  # between the long steps: work whose HTTP client left stops here (service.progress)
        lab = align.labelled_retention(map_, X, Y, queries, relevant, side=side, old_queries=old_queries,
                                       random_state=random_state)
        if csls_weight is not None:
            res["labelled_plain"] = lab
            checkpoint()
            lab = align.labelled_retention(map_, X, Y, queries, relevant, side=side, old_queries=old_queries,
                                           csls_weight=csls_weight, random_state=random_state)
        res["labelled"] = lab
        res["retention"] = lab["retention"]["R@10"]  # None: undefined, no query hits natively (not a retention of 0)
        res["retention_metric"] = (LABELLED_KEY + (" (query-side" if side == "source" else " (corpus-side")
                                   + (f", CSLS search w {csls_weight:g})" if csls_weight is not None else ")"))
        res["retention_interval"] = lab["retention_interval"]["R@10"]
        res["retention_scope"] = "held-out"
        if old_corpus is not None:
            checkpoint()
            res["corpus"] = align.corpus_retention(map_, X, Y, queries, relevant, old_queries, old_corpus,
                                                   random_state=random_state, corpus_name=old_corpus_name)
            res["retention_heldout"], res["retention_scope"] = res["retention"], "corpus"
            res["retention"] = res["corpus"]["retention"]
            res["retention_interval"] = res["corpus"]["retention_interval"]
            res["retention_metric"] = f"{LABELLED_KEY} (corpus-side, over the whole corpus)"
    else:
        res["retention"] = res[RETENTION_KEY]
        res["retention_metric"] = RETENTION_KEY
    res["proxy"] = proxy_chance(res)
    if min_retention is not None and (why := _undecided(res, min_retention)):  # neither a pass nor a fail: exit 2
        raise InputError(f"the retention gate cannot be decided on the {res['retention_metric']}: {why}; "
                         f"or evaluate without the retention gate")
    if min_retention is not None:
        res["min_retention"] = float(min_retention)
        res["passed"] = bool(res["retention"] >= min_retention)
        res["result"] = "PASS" if res["passed"] else "FAIL"
        iv = res.get("retention_interval")
        if iv is not None:  # a gate of 0 is decided by any defined figure, whatever the interval
            res["gate_within_interval"] = bool(0 < min_retention and iv[0] <= min_retention <= iv[1])
    return res


def retention_scope(r: dict) -> str:
    """What a labelled retention (``r``: :func:`retention_gate`'s) is over, in words: ``"the whole corpus (40,960
    documents: 1,000 held out, 39,960 rows of the old corpus mapped; native R@10 estimated)"`` or ``"the 1,000 held-out
    documents only"``."""
    c = r.get("corpus")
    if c is None:
        return f"the {r['labelled']['n_documents']:,} held-out documents only"
    dup = f", {c['n_duplicates']:,} repeating a held-out one left out" if c["n_duplicates"] else ""
    return (f"the whole corpus ({c['n_documents']:,} documents: {c['n_heldout']:,} held out, "
            f"{c['n_documents'] - c['n_heldout']:,} rows of the old corpus mapped{dup}; native R@10 estimated)")


def check_old_corpus(old_corpus, queries, old_queries, side: str, csls_weight,
                     names: tuple[str, ...] = ("old_corpus", "queries", "relevant", "old_queries", "side", "csls")
                     ) -> None:
    """What the corpus-wide retention needs (:func:`retention_gate`'s ``old_corpus``): labelled queries under both
    models, a corpus-side map and plain search; an InputError naming what is missing otherwise (``names``: what the
    caller calls the old corpus, queries, relevant rows, old queries, side and CSLS: its options or JSON fields)."""
    if old_corpus is None:
        return
    oc, q, rel, oq, sd, cs = names
    why = (f"{oc} is for labelled queries: give {q} and {rel}" if queries is None else
           f"the retention over {oc} divides by the new model's R@10 over the whole corpus, estimated from how the "
           f"old model's R@10 of the same queries falls from the held-out documents to the corpus: give {oq}, the "
           f"queries under the old model" if old_queries is None else
           f"{oc} is mapped into the new space by a corpus-side map ({sd} target); a query-side map leaves the old "
           f"index as it is, so the held-out figure is the one to gate on" if side != "target" else
           f"the retention over {oc} is of plain cosine search; evaluate {cs} search without {oc}"
           if csls_weight is not None else None)
    if why:
        raise InputError(why)


def _undecided(res: dict, gate: float) -> str | None:
    """Why ``res`` (of :func:`retention_gate`) can neither pass nor fail the retention gate ``gate``; None when it
    can. The figure is judged, not the gate. Labelled: :func:`align.labelled_retention`'s ``undecided`` (native
    R@10 none or at chance, or fewer native hits than :data:`align.retrieval.MIN_NATIVE_HITS`: a query-side map
    evaluated corpus-side PASSed on native R@10 10 of 2,999 at retention 2.0). Proxy: :func:`proxy_chance`'s, for a
    pass only (a FAIL of a map at chance stands: a map no better than a random one fails the gate it fails, and more
    pairs would not lift it). An undefined figure decides no gate; a gate of 0 (which no figure can fail, as a CI
    tool's threshold of 0 is met by any measurement) passes any defined one, at chance or not: refusing it (exit 2)
    made a gate that cannot fail fail a pipeline, and ``undecided`` still says the figure tells nothing."""
    if "labelled" in res:
        why = res["labelled"]["undecided"]
        if res.get("retention_scope") == "corpus" and res["retention"] is None and not why:
            why = ("its corpus-wide figure is undefined: no query finds its relevant document among the held-out ones "
                   "with the old model, so the new model's R@10 over the corpus cannot be estimated")
        if gate <= 0 and res["retention"] is not None:
            return None
        return why and (f"{why}; give labelled queries and documents of one model each, scored on the side the map "
                        f'serves (corpus-side, or query-side: --side source, "side": "source" over HTTP), or more '
                        f"of them")
    why = res["proxy"]["undecided"]
    if not np.isfinite(res["retention"]):
        return why
    if why and res["retention"] >= gate > 0:
        return f"{why}; give more held-out pairs"
    return None


def proxy_chance(res: dict) -> dict:
    """How the ``nn_retention@10`` proxy of ``res`` (:func:`align.score_map`'s) compares with a random map's:
    ``kept`` of ``n_queries`` rows, ``candidates`` per query, ``chance_p`` (how often a random map keeps as many:
    with n held-out pairs each relevant row is one of n - 1 candidates, in a random top 10 with probability
    10 / (n - 1)) and ``undecided``, why its pass says nothing (undefined below 12 pairs; ``chance_p`` at least
    :data:`align.retrieval.CHANCE_LEVEL`: a map given its files the wrong way round PASSed 0.6 on 12-20 pairs; a
    perfect map is judged from 15 pairs on, a random map keeping all 15 0.6 % of the time), else None: what
    ``labelled`` carries for the labelled retention (``chance_p``, ``undecided``), so that a proxy at chance is
    flagged in the JSON without a gate too. It can still FAIL a gate above it."""
    n, q, r = res["n_pairs"], res["n_queries"], res[RETENTION_KEY]
    if not np.isfinite(r):
        return {"kept": None, "n_queries": q, "candidates": max(n - 1, 0), "chance_p": None,
                "undecided": f"it is undefined: it needs at least 12 distinct held-out pairs (a query, its nearest "
                             f"other row and 10 more), got {n}; give more held-out pairs"}
    rate, hits = min(1.0, 10 / (n - 1)), round(r * q)
    p, why = chance_verdict(hits, q, rate, verbs=("kept", "keeps"),
                            odds=f"with {n} held-out pairs each relevant row is one of {n - 1} candidates, in a random "
                                 f"top 10")
    return {"kept": hits, "n_queries": q, "candidates": n - 1, "chance_p": p, "undecided": why}


def top1_chance(res: dict) -> dict:
    """How the top-1 of ``res`` (:func:`align.evaluate`'s) compares with a random map's, as :func:`proxy_chance` for
    the proxy: ``hits`` of ``n_queries`` rows, ``candidates`` per row, ``chance_p`` (how often a random map, which
    ranks a row's own target first one time in ``candidates``, finds as many) and ``undecided``, why its pass says
    nothing (``chance_p`` at least :data:`align.retrieval.CHANCE_LEVEL`: a map of shuffled pairs, held-out top-1
    0.01, PASSed ``--min-top1 0.9`` on 3 pairs in 2 of 12 tries), else None."""
    n, q = int(res["n_candidates"]), int(res["n_queries"])
    hits = round(float(res["top1"]) * q)
    p, why = chance_verdict(hits, q, 1.0 / max(n, 1), verbs=("matched", "matches"),
                            odds=f"with {n} held-out pairs each mapped row's own target is one of {n} candidates, "
                                 f"ranked first by a random map")
    return {"hits": hits, "n_queries": q, "candidates": n, "chance_p": p, "undecided": why}


def chance_verdict(hits: int, q: int, rate: float, *, verbs: tuple[str, str], odds: str) -> tuple[float, str | None]:
    """The one chance rule of the eval gates (:func:`proxy_chance`, :func:`top1_chance`): ``(p, why)``, ``p`` how
    often a random map scores ``hits`` of ``q`` rows or more when each row scores with probability ``rate``, ``why``
    (None when ``p`` is below :data:`align.retrieval.CHANCE_LEVEL`) the words of a pass that says nothing: ``verbs``
    its past and present ("kept", "keeps"), ``odds`` what ``rate`` is the odds of."""
    p = chance_p_value(hits, q, rate)
    why = None if p < CHANCE_LEVEL else (
        f"it {verbs[0]} {hits} of {q} rows, and {odds} {rate:.0%} of the time ({expected_hits(q, rate)} rows "
        f"expected): a random map {verbs[1]} as many {p:.0%} of the time, {PASS_SAYS_NOTHING}")
    return p, why


#: how :func:`chance_verdict`'s words end: of a gate's pass (a record without one words it :func:`said_of_figure`)
PASS_SAYS_NOTHING = "so its pass says nothing"


def _said_of_figure(why: str) -> str:
    """:func:`chance_verdict`'s ``why`` for a figure no gate passed (``eval --record`` without one, or a FAIL): its
    "so its pass says nothing" said of the figure, there being no pass to speak of."""
    return f"{why.removesuffix(PASS_SAYS_NOTHING)}so the figure says nothing of the map"


def _above_native(r: dict) -> list[str]:
    """The note of a labelled retention above 1 (the migrated index beats the native one on these queries): a gate
    passes it as it passes 1, and the interval is the bootstrap's own (above 1 too, never clipped), but a reader
    of "retention 1.5" is owed why a copy can beat the original."""
    lab = r.get("labelled")
    held = r.get("retention_heldout", r["retention"])
    corpus = r.get("corpus") or {}
    over = ([] if lab is None or lab["undecided"] or corpus.get("retention") is None or corpus["retention"] <= 1.0
            else [f"the corpus-wide labelled R@10 retention is {corpus['retention']:.3f}, above 1: the migrated "
                  f"index's R@10 over the corpus, {corpus['migrated_r10']:.3f} (exact), exceeds the new model's own "
                  f"as estimated from the held-out documents ({corpus['native_r10']:.3f}); that estimate is too low "
                  f"or the map beats the new model on these queries, and the figure cannot tell which"])
    if lab is None or held is None or held <= 1.0 or lab["undecided"]:  # at chance: noise
        return over
    q = lab["n_queries"]
    mig, nat = round(lab["migrated"]["R@10"] * q), lab["native_hits"]
    return over + [f"the labelled R@10 retention is {held:.3f}, above 1: the migrated index finds the relevant "
            f"document of {mig} of the {q} queries in its top 10, the native index of {nat}, so on these queries "
            f"the map's output lies nearer them than the new model's own document vectors do. A gate passes it as "
            f"it passes 1 (nothing is lost); a migration seldom gains, so check that the queries are of the model "
            f"the side expects (--side / side target: the new model's; source: the old model's)"]


def gate_zero_note(r: dict, record: bool = False) -> list[str]:
    """The note of a gate of 0 on a figure that decides no other gate (``r``: :func:`retention_gate`'s, ``undecided``
    set): it passes, as a gate of 0 passes any defined figure, and the figure says nothing of the map. The one
    statement the CLI prints under its PASS and the HTTP answer's ``notes`` carry (the CLI printed "passes no gate"
    and "the gate lies inside the interval" around the PASS)."""
    if r.get("min_retention") != 0:
        return []
    lab = r.get("labelled")
    why = (lab if lab is not None else r["proxy"])["undecided"]
    if not why:
        return []
    kept = (" (not recorded: an earlier eval.labelled_retention is removed, the eval.* tags are this run's)"
            if record and lab is not None else "")
    return [f"a gate of 0 passes any retention; this one says nothing of the map{kept}: {why}"]


def check_eval_spaces(v, m, X: np.ndarray, Y: np.ndarray) -> list[str]:
    """Held-out source rows ``X`` and target rows ``Y`` against map ``m``'s two frames (``v``: its VersionInfo), by
    the rule of ``fit`` and ``transform`` (:func:`service.spaces.check_pair_spaces`): files swapped, or a side that
    looks like the other side's space, are a SpaceMismatchError (a swapped pair scored top-1 0.003 with no word of
    why); returns the notes of rows neither side recognises. Nothing for a map within one space."""
    if v.source_space == v.target_space:
        return []
    src, tgt = v.source_space, v.target_space
    return check_pair_spaces(
        X, Y, src, tgt, map_references(v, m),
        fix={"source": f"a map the wrong way round? {v.ref} reads {src!r} rows: evaluate a map from {{other}}, or "
                       f"give {src!r} rows as the source",
             "target": f"{v.ref} writes {tgt!r} rows: give {tgt!r} rows as the target"},
        swapped=f"{v.ref} maps {src!r} rows onto {tgt!r} ones: scored this way round, every figure would be of rows "
                f"it does not read",
        after=f"or, if these are the right files, {v.ref} itself was fitted on swapped files (its sides, read from "
              f"the rows it was fitted on, hold the other way round: a fit on a registry with no references yet "
              f"could not tell): fit it again with the files in this order")


def check_corpus_space(v, m, C, name: str = "old_corpus") -> list[str]:
    """The old corpus ``C`` (``name``: what the caller calls it, ``--old-corpus`` or ``old_corpus``) against map
    ``m``'s source side (``v``: its VersionInfo) by the row check of the held-out pairs (:func:`check_eval_spaces`):
    rows that look like the target space are a SpaceMismatchError. The corpus-wide retention maps them as old-model
    rows, and the new model's own vectors given instead scored far above the old corpus's (WordNet minilm->e5, 2,000
    pairs: 0.910 PASS with e5's file, 0.587 with minilm's); a width other than the map's source width is a
    DimensionMismatchError naming ``name``. Returns the note of rows neither side recognises."""
    if np.ndim(C) == 2 and np.shape(C)[1] != m.source_dim:  # align's own words named its parameter, X_corpus
        raise DimensionMismatchError(f"{name} has {np.shape(C)[1]} columns, but {v.ref} reads {m.source_dim}-wide "
                                     f"rows of space {v.source_space!r}: give the old model's vectors of the corpus")
    if v.source_space == v.target_space:
        return []
    notes: list[str] = []
    src = v.source_space
    check_rows(C, src, map_references(v, m), name=f"the {name} rows", warn=notes.append,
               fix=f"{name} is the old model's corpus: {v.ref} reads {src!r} rows, so give the {src!r} vectors of "
                   f"the corpus, not the new model's")
    return notes


def evaluate_map(registry, ref: str, X: np.ndarray, Y: np.ndarray, *, csls: bool = False,
                 min_top1: float | None = None, min_retention: float | None = None, record: bool = False,
                 queries=None, relevant=None, side: str = "target", old_queries=None,
                 csls_weight: float = CSLS_WEIGHT, max_queries: int | None = EVAL_MAX_QUERIES,
                 random_state=0, old_corpus=None, sides: tuple[str, str] = ("source", "target"),
                 old_corpus_name: str = "old_corpus") -> dict:
    """Scores of the registered map ``ref`` on held-out pairs ``X`` (n, d_s) <-> ``Y`` (n, d_t); ``sides``: what the
    error of unequal row counts calls the two (the CLI: files and rows; HTTP: its fields), said as a fit says it.

    Keys: those of :func:`align.evaluate` (its ``cos`` is in the target's centred frame), ``cos_raw`` (the
    mean cosine of the map's raw output, what ``transform`` writes, with the native target rows),
    ``retrieval`` (:func:`retention_gate`), ``retention``, ``map`` (the resolved ref), ``top1_chance``
    (:func:`top1_chance`) and, when a gate is given, ``min_top1`` / ``min_retention`` and ``result`` (``"PASS"``
    only when every given gate passes). A ``min_top1`` above 0 that a top-1 at chance would pass is an InputError,
    as the retention gate's is (a FAIL stands).
    ``record`` stores top-1, mean rank, cosine, recall@10, the candidate count and the rows ranked
    (``n_queries``) as tags ``eval.*`` on the version (they rank paths), the top-1's ``chance_p``
    (:func:`top1_chance`) as ``eval.top1_chance_p`` (at :data:`align.retrieval.CHANCE_LEVEL` or above, path choice
    does not rank by that top-1, and a note says so), with ``eval.top1_interval`` when a sample
    was ranked (JSON ``[low, high]``; tags are text), and with labelled ``queries`` / ``relevant`` (see
    :func:`retention_gate`) the labelled retention as ``eval.labelled_retention``: none when it decides no gate
    (``retrieval.labelled.undecided``: undefined, at chance or on too few native hits; a retention 2.0 at chance
    replaced a good earlier one), and an earlier one is then dropped, as the other ``eval.*`` tags are this run's.
    With ``csls``, labelled retention is of CSLS search with ``csls_weight`` (the service's default 0.5) and the
    plain one is kept as ``retrieval.labelled_plain``. ``old_corpus``: the old model's vectors of the rest of the
    corpus, for the corpus-wide labelled retention (:func:`retention_gate`), which the gate and ``retention`` are then
    of; ``record`` stores it as ``eval.labelled_retention`` with ``eval.labelled_retention_scope`` saying over what.
    ``old_corpus_name``: what the caller calls it (``--old-corpus``), in the errors about it.

    Pair figures rank each mapped row against all ``n`` target rows: ``n² d`` work. Above ``max_queries``
    (default :data:`EVAL_MAX_QUERIES`; ``None``: no cap) a sample of that many rows, drawn with
    ``random_state``, is ranked (still against all ``n``): ``n_queries`` says how many, ``intervals`` (in the
    result and in ``retrieval``) the 95 % interval of each share (top-1, recall@k, nn_retention@10) that the
    sample leaves. Up to the cap the figures are those of every row, as before the cap existed.

    The rows are checked first against the map's two sides (:func:`check_eval_spaces`, and ``old_corpus`` against
    its source side, :func:`check_corpus_space`): pairs given the wrong way round are refused, not scored;
    ``notes`` holds what that check could not tell, and why a labelled retention is above 1.
    """
    for what, gate in (("min_top1", min_top1), ("min_retention", min_retention)):
        if gate is not None and not 0.0 <= gate <= 1.0:  # NaN too: a gate no figure can pass or fail honestly
            raise InputError(f"{what} must be a number in [0, 1], got {gate}")
    if np.ndim(X) == 2 and np.ndim(Y) == 2 and np.shape(X)[0] != np.shape(Y)[0]:  # align named X_src and Y_tgt
        raise PairCountError(f"eval needs as many source rows as target rows (held-out pairs: row i of each is one "
                             f"item), got {np.shape(X)[0]} ({sides[0]}) and {np.shape(Y)[0]} ({sides[1]})")
    v = registry.resolve(ref)
    m = registry.load_map(v)
    notes = check_eval_spaces(v, m, X, Y)
    if old_corpus is not None:
        notes += check_corpus_space(v, m, old_corpus, old_corpus_name)
    res = align.evaluate(m, X, Y, csls=csls, max_queries=max_queries, random_state=random_state)
    res["top1_chance"] = top1_chance(res)
    if min_top1 is not None and (why := res["top1_chance"]["undecided"]) and res["top1"] >= min_top1 > 0:
        raise InputError(f"the top-1 gate cannot be decided: {why}; give more held-out pairs, or evaluate without "
                         f"the top-1 gate")  # a FAIL stands (more pairs would not lift it); a gate of 0 passes any
    checkpoint()  # between the long steps: work whose HTTP client left stops here (service.progress)
    # ``cos`` is of the target's centred frame; ``cos_raw`` of what transform writes against native target rows
    Xd, Yd, _ = distinct_pairs(X, Y)  # of the distinct pairs, as every figure (a repeated pair once)
    res["cos_raw"] = float(np.mean(np.einsum("ij,ij->i", unit_rows(m.apply(Xd, output="raw", validate=False)),
                                             unit_rows(Yd))))
    checkpoint()
    res["retrieval"] = retention_gate(m, X, Y, min_retention=min_retention, queries=queries, relevant=relevant,
                                      side=side, old_queries=old_queries, csls_weight=csls_weight if csls else None,
                                      max_queries=max_queries, random_state=random_state, old_corpus=old_corpus,
                                      old_corpus_name=old_corpus_name)
    res["retention"] = res["retrieval"]["retention"]
    res["map"] = v.ref
    res["notes"] = notes + _above_native(res["retrieval"]) + gate_zero_note(res["retrieval"], record)
    passed = None
    if min_top1 is not None:
        passed = res["top1"] >= min_top1
        res["min_top1"] = min_top1
    if min_retention is not None:
        passed = (passed is not False) and res["retrieval"]["passed"]
        res["min_retention"] = min_retention
    if passed is not None:
        res["result"] = "PASS" if passed else "FAIL"
    if record:
        # the top-1's chance figure beside it: path choice passes over a top-1 at chance (a map of shuffled pairs
        # was recorded, listed and ranked like a real one); the figures are still recorded, as measured
        figures = {k: res[k] for k in ("top1", "mean_rank", "cos", "recall@10", "n_candidates", "n_queries")}
        figures["top1_chance_p"] = res["top1_chance"]["chance_p"] if np.isfinite(res["top1"]) else float("nan")
        for k, x in figures.items():
            if np.isfinite(x):
                registry.set_tag(v.name, v.version, f"eval.{k}", x)
            elif f"eval.{k}" in (v.tags or {}):  # recall@10 of at most 10 pairs is undefined: not "nan", nor stale
                registry.delete_tag(v.name, v.version, f"eval.{k}", missing_ok=True)
        if why := res["top1_chance"]["undecided"]:  # of a pass only when a top-1 gate passed it (a gate of 0 can)
            why = why if min_top1 is not None and res["top1"] >= min_top1 else _said_of_figure(why)
            res["notes"].append(f"the top-1 may be chance ({why}): it is recorded with eval.top1_chance_p beside "
                                f"it, and path choice does not rank this version by it")
        if "intervals" in res:  # a sample's top-1: with its interval, or it reads as exact
            registry.set_tag(v.name, v.version, "eval.top1_interval", json.dumps(list(res["intervals"]["top1"])))
        elif "eval.top1_interval" in (v.tags or {}):  # every pair ranked now: an earlier sample's interval is stale
            registry.delete_tag(v.name, v.version, "eval.top1_interval", missing_ok=True)
        lab = res["retrieval"].get("labelled")
        if lab is not None and not lab["undecided"] and res["retention"] is not None:
            registry.set_tag(v.name, v.version, "eval.labelled_retention", res["retention"])
            registry.set_tag(v.name, v.version, "eval.labelled_retention_scope", retention_scope(res["retrieval"]))
        elif lab is not None:  # undefined or at chance now: stale (the other eval.* are of this run)
            for tag in ("eval.labelled_retention", "eval.labelled_retention_scope"):
                if tag in (v.tags or {}):
                    registry.delete_tag(v.name, v.version, tag, missing_ok=True)
    return res
