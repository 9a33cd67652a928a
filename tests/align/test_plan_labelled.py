"""align.plan_migration with labelled queries: its prediction tracks the measured labelled retention; bad input."""

from __future__ import annotations

import numpy as np
import pytest

import align
from _synthetic import nonlinear_corpus, queries_near
from align.exceptions import InputError, NonFiniteError, PairCountError, TooFewRowsError


def _task(seed=0, n=6000, d=32, q=150, probe=600):
    """Clustered old corpus X, a non-linear new model Y (tanh then rotation, noise), queries near their documents
    in each model; a probe of ``probe`` documents holding every query's relevant one."""
    rng = np.random.default_rng(seed)
    X, Y = nonlinear_corpus(rng, n, d, 60)
    rel = rng.choice(n, q, replace=False)
    Qn, Qo = queries_near(rng, X, Y, rel)
    others = rng.choice(np.setdiff1d(np.arange(n), rel), probe - q, replace=False)
    rows = np.sort(np.concatenate([rel, others]))
    return X, Y, Qn, Qo, rel, rows, np.searchsorted(rows, rel)


def test_labelled_plan_predicts_the_retention_eval_measures_after_the_fit():
    X, Y, Qn, Qo, rel, rows, prel = _task()
    plan = align.plan_migration(X, X[rows], Y[rows], queries=Qn, old_queries=Qo, relevant=prel,
                                target_ks=(100, 300), select_rows=False)
    assert plan["metric"].startswith("labelled R@10 retention") and plan["n_queries"] == 150
    assert plan["n_corpus"] == X.shape[0]                  # the whole corpus competes (probe texts counted once)
    assert any("labelled queries" in n for n in plan["notes"])
    # the R@10 behind the ratio: the old model's over the whole corpus is measured (keeping it), the migrated
    # index's is the retention times the native estimate, and the plan says when staying would do as well
    nat = plan["native"]
    assert nat["old_corpus"] == pytest.approx(_top10_hits(Qo, X, rel).mean())
    assert nat["new_probe"] == pytest.approx(_top10_hits(Qn, Y[rows], prel).mean())
    assert all(q["r10"] == pytest.approx(q["retention"] * nat["new_corpus_estimate"]) for q in plan["predicted"])
    stay = any("keeping the old model" in n for n in plan["notes"])
    assert stay == (plan["predicted"][-1]["r10"] <= nat["old_corpus"])
    proxy = align.plan_migration(X, X[rows], Y[rows], target_ks=(100, 300), select_rows=False)
    # after the fit: maps on K random pairs outside the probe, measured as `vecbridge eval --queries` does, over
    # the whole corpus with the same queries
    fit_rows = np.setdiff1d(np.arange(X.shape[0]), rows)
    rng = np.random.default_rng(1)
    for pred, pred_proxy in zip(plan["predicted"], proxy["predicted"]):
        idx = rng.choice(fit_rows, pred["k"], replace=False)
        fit = (align.fit_procrustes if pred["method"] == "procrustes" else
               lambda a, b: align.fit_ridge(a, b, alpha=1e-2))(X[idx], Y[idx])
        measured = align.labelled_retention(fit, X, Y, Qn, rel)["retention"]["R@10"]
        assert abs(pred["retention"] - measured) < 0.08, (pred, measured)
        assert pred["low"] <= measured <= pred["high"]
        # the proxy of the same probe is far off on this task; the labelled estimate is not
        assert abs(pred["retention"] - measured) < abs(pred_proxy["retention"] - measured)


def test_labelled_plan_is_reproducible_and_its_interval_counts_the_queries():
    X, Y, Qn, Qo, _, rows, prel = _task(seed=2, n=3000, q=60, probe=300)
    kw = {"queries": Qn, "old_queries": Qo, "relevant": prel, "target_ks": (100,), "select_rows": False,
          "random_state": 4}
    a = align.plan_migration(X, X[rows], Y[rows], **kw)
    b = align.plan_migration(X, X[rows], Y[rows], **kw)
    assert a["predicted"] == b["predicted"] and a["curve"] == b["curve"]
    top = a["curve"][a["best_method"]][-1]
    lo, hi = top["query_interval"]
    assert lo <= top["mean"] <= hi and hi - lo > 0.05              # 60 queries: a wide interval
    p = a["predicted"][0]
    assert p["high"] - p["low"] >= hi - lo - 1e-9                  # the forecast interval holds it


@pytest.mark.parametrize("change, err, msg", [
    ({"old_queries": None}, InputError, "all three"),
    ({"relevant": None}, InputError, "all three"),
    ({"relevant": "short"}, PairCountError, "one probe row per query"),
    ({"relevant": "out"}, InputError, "must be in"),
    ({"relevant": "float"}, InputError, "integer"),
    ({"old_queries": "fewer"}, PairCountError, "same"),
    ({"queries": "nan"}, NonFiniteError, "queries"),
    ({"queries": "wide"}, Exception, "queries"),
    ({"old_queries": "zero"}, Exception, "old_queries"),
    ({"relevant": "all"}, TooFewRowsError, "relevant documents"),
])
def test_labelled_plan_bad_input_raises_typed_errors(change, err, msg):
    X, Y, Qn, Qo, _, rows, prel = _task(seed=3, n=800, q=40, probe=120)
    kw = {"queries": Qn, "old_queries": Qo, "relevant": prel}
    bad = {"short": prel[:-1], "out": np.r_[prel[:-1], 120], "float": prel.astype(float), "fewer": Qo[:-1],
           "nan": np.where(np.arange(Qn.shape[1]) == 0, np.nan, Qn), "wide": np.c_[Qn, Qn], "zero": Qo * 0,
           "all": np.arange(40) % 40}
    for key, value in change.items():
        kw[key] = bad[value] if isinstance(value, str) else value
    if change.get("relevant") == "all":  # every probe row relevant: nothing left to fit the curve on
        kw = {"queries": np.repeat(Qn, 3, 0), "old_queries": np.repeat(Qo, 3, 0), "relevant": np.arange(120)}
    with pytest.raises(err, match=msg):
        align.plan_migration(X, X[rows], Y[rows], select_rows=False, **kw)


def _prepared(X, Y, Qn, Qo, rows, prel, seed=0):
    from align.frames import unit_rows
    from align.plan import LabelledProbe

    lab = LabelledProbe(Qn, Qo, prel, X[rows], Y[rows])
    rng = np.random.default_rng(seed)
    val, _ = lab.split(rng, len(rows))
    lab.prepare(val, unit_rows(X), ~np.isin(np.arange(X.shape[0]), rows), rng)  # the corpus less the probe's rows
    return lab


def _top10_hits(Q, D, rel):
    from align.frames import unit_rows
    from align.knn import knn

    _, I = knn(unit_rows(Q), unit_rows(D), 10)
    return (I == rel[:, None]).any(axis=1)


def test_fall_curves_end_at_the_probe_hits_and_rise_as_fewer_distractors_compete():
    X, Y, Qn, Qo, _, rows, prel = _task(seed=5, n=3000, q=80, probe=400)
    lab = _prepared(X, Y, Qn, Qo, rows, prel)
    for P, Q, D in ((lab.nat_fall, Qn, Y[rows]), (lab.old_fall, Qo, X[rows])):
        assert P.shape == (80, 4) and ((P >= 0) & (P <= 1)).all()
        assert np.array_equal(P[:, -1] == 1.0, _top10_hits(Q, D, prel))   # fraction 1: the probe's own hits
        assert (np.diff(P, axis=1) <= 1e-12).all()                         # more distractors, never a better chance
    assert 0.25 <= lab.slope_ratio <= 4.0 and 0.0 <= lab.shrink <= 1.0


def test_native_estimate_is_exact_when_the_new_model_is_the_old_one():
    # same vectors on both sides: equal falls, slope ratio 1, and the scaled probe recall is the old model's
    # own whole-corpus R@10, which is measured
    X, _, _, Qo, rel, rows, prel = _task(seed=6, n=5000, q=120, probe=500)
    lab = _prepared(X, X, Qo, Qo, rows, prel)
    assert lab.slope_ratio == pytest.approx(1.0)
    assert lab.native_estimate() == pytest.approx(_top10_hits(Qo, X, rel).mean())


@pytest.mark.parametrize("old_noise, stay", [(0.8, True), (3.0, False)])
def test_labelled_plan_says_when_keeping_the_old_model_is_predicted_to_do_as_well(old_noise, stay):
    # the same new model and probe; only how well the old model's own queries find their documents changes
    X, Y, Qn, _, rel, rows, prel = _task()
    Qo = (X[rel] + old_noise * np.random.default_rng(0).normal(size=(rel.size, X.shape[1]))).astype(np.float32)
    plan = align.plan_migration(X, X[rows], Y[rows], queries=Qn, old_queries=Qo, relevant=prel,
                                target_ks=(100, 300), select_rows=False)
    note = [n for n in plan["notes"] if n.startswith("keeping the old model")]
    assert bool(note) == stay
    assert (plan["predicted"][-1]["r10"] <= plan["native"]["old_corpus"]) == stay


def test_a_labelled_retention_above_1_is_no_forecast_the_plan_is_the_proxys_and_says_why():
    """Precise new-model queries, noisy old-model ones: the old model's R@10 falls far from the probe to the corpus,
    so the native estimate is too low and the measured retention rises above 1 (0.89 -> 1.10). The curve, fitted
    with r_inf <= 1, read that as falling: 1.000 at every K, "did not rise", the smallest K recommended (as on
    WordNet minilm->e5: ratios 0.55 -> 1.72). Now the plan is the one without the queries, with a note why."""
    X, Y, Qn, Qo, rel, rows, prel = _task()
    rng = np.random.default_rng(9)
    Qn = (Y[rel] + 0.1 * rng.normal(size=Qn.shape)).astype(np.float32)
    Qo = (X[rel] + 2.0 * rng.normal(size=Qo.shape)).astype(np.float32)
    kw = {"target_ks": (100, 300, 3000), "select_rows": False, "random_state": 0}
    plan = align.plan_migration(X, X[rows], Y[rows], queries=Qn, old_queries=Qo, relevant=prel, **kw)
    proxy = align.plan_migration(X, X[rows], Y[rows], **kw)
    assert plan["predicted"] == proxy["predicted"] and plan["recommended"] == proxy["recommended"]
    assert all(q["retention"] < 1.0 for q in plan["predicted"])    # was 1.000 at every K, K = 100 recommended
    lab = plan.pop("labelled")
    top = max((q for c in lab["curve"].values() for q in c), key=lambda q: q["mean"])
    assert lab["consistent"] is False and lab["n_queries"] == 150 and top["mean"] > 1.0
    assert lab["native"]["new_corpus_estimate"] < lab["native"]["new_probe"]
    note = [n for n in plan["notes"] if "inconsistent" in n]
    assert len(note) == 1 and f"reached {top['mean'] * lab['native']['new_corpus_estimate']:.3f}" in note[0]
    assert not any("did not rise" in n for n in plan["notes"])
    assert {**plan, "notes": [n for n in plan["notes"] if n not in note]} == proxy   # the proxy's plan, as it is
    assert plan["metric"].startswith("nn_retention@10") and "native" not in plan


@pytest.mark.parametrize("labelled", [True, False])
def test_each_forecast_is_of_the_method_its_curve_favours_at_that_k(labelled):
    """Each forecast names its method and is that method's curve at K: within the probe's K the higher curve,
    beyond it the best at the probe's largest K; the recommended method is the one of the recommended K (below
    1,000)."""
    from align.plan import forecast

    X, Y, Qn, Qo, _, rows, prel = _task(seed=3, n=4000, q=100, probe=500)
    kw = {"queries": Qn, "old_queries": Qo, "relevant": prel} if labelled else {}
    plan = align.plan_migration(X, X[rows], Y[rows], target_ks=(30, 60, 120, 240, 2000), select_rows=False,
                                target_retention=0.5, **kw)
    assert set(plan["fits"]) == {"procrustes", "ridge"} and plan["fit"] == plan["fits"][plan["best_method"]]
    for q in plan["predicted"]:
        assert q["retention"] == pytest.approx(float(forecast(plan["fits"][q["method"]], [q["k"]])[0][0]))
        assert q["extrapolated"] == (q["k"] > plan["curve"][plan["best_method"]][-1]["k"])
        if q["extrapolated"]:
            assert q["method"] == plan["best_method"]
    rec = plan["recommended"]
    at = next(q for q in plan["predicted"] if q["k"] == rec["k"])
    assert rec["method"] == (at["method"] if rec["k"] < 1000 else "auto")


def test_per_k_forecast_takes_the_higher_curve_inside_the_probe_and_the_best_beyond():
    """Curves that cross at K = 400 (ridge 0.7 - K^-1/2 higher below, Procrustes 0.9 - 5 K^-1/2 above), probe up to
    K = 500: ridge at 100, Procrustes at 450; beyond the probe the best measured at 500 whichever extrapolates
    higher."""
    from align.plan import forecast_per_k

    flat = {"residual_std": 0.0, "spread": 0.0}
    fits = {"ridge": {"r_inf": 0.7, "c": 1.0, "beta": 0.5, **flat},
            "procrustes": {"r_inf": 0.9, "c": 5.0, "beta": 0.5, **flat}}
    got = forecast_per_k(fits, "procrustes", (100, 450, 3000), top=500)
    assert [q["method"] for q in got] == ["ridge", "procrustes", "procrustes"]
    assert [q["extrapolated"] for q in got] == [False, False, True]
    assert got[0]["retention"] == pytest.approx(0.6) and got[1]["retention"] == pytest.approx(0.9 - 5 / 450 ** 0.5)
    # the best at the probe's largest K decides beyond it, though the other curve extrapolates higher there
    assert forecast_per_k(fits, "ridge", (3000,), top=500)[0]["method"] == "ridge"


def test_plan_of_a_probe_with_repeated_pairs_is_the_plan_of_its_distinct_pairs():
    """A probe holding each pair twice: half the held-out rows had their copy among the curve's fitting pairs and
    were found by memory, and each row's copy was its nearest neighbour in both models, so the prediction rose from
    0.2 to 0.65 at K = 100 and alignability passed the unsupervised bar (0.35 -> 0.41). The plan is of the distinct
    pairs now, says how many repeated, and renumbers labelled queries' relevant rows among them."""
    X, Y, Qn, Qo, _, rows, prel = _task(seed=1, n=3000, q=60, probe=300)
    kw = dict(target_ks=(100, 300), select_rows=False, random_state=0)
    once = align.plan_migration(X, X[rows], Y[rows], **kw)
    twice = align.plan_migration(X, np.repeat(X[rows], 2, 0), np.repeat(Y[rows], 2, 0), **kw)
    assert twice["predicted"] == once["predicted"] and twice["alignability"] == once["alignability"]
    assert twice["n_probe"] == 300 and twice["n_probe_repeated"] == 300 and once["n_probe_repeated"] == 0
    assert any("repeat another pair" in n for n in twice["notes"])
    lab = dict(queries=Qn, old_queries=Qo, **kw)
    a = align.plan_migration(X, X[rows], Y[rows], relevant=prel, **lab)
    b = align.plan_migration(X, np.repeat(X[rows], 2, 0), np.repeat(Y[rows], 2, 0), relevant=2 * prel + 1, **lab)
    assert b["predicted"] == a["predicted"] and b["native"] == a["native"]
    with pytest.raises(TooFewRowsError, match="distinct"):
        align.plan_migration(X, np.repeat(X[rows[:40]], 3, 0), np.repeat(Y[rows[:40]], 3, 0), **kw)


@pytest.mark.parametrize("side", ["probe_src", "probe_tgt"])
@pytest.mark.parametrize("rows", ["one", "all"])
def test_a_probe_with_all_zero_rows_is_refused_as_fit_refuses_it(side, rows):
    """An all-zero probe row has no direction: the plan gave a forecast from it (an all-zero source side: retention
    0.02-0.03 and alignability ~0) where `vecbridge fit` on the same pairs exits 2 (its evaluation, `align.evaluate`,
    refuses them). Now both refuse it, naming the side."""
    from align.exceptions import DegenerateInputError

    X, Y, *_, prows, _ = _task(seed=2, n=2000, q=40, probe=200)
    A, B = X[prows].copy(), Y[prows].copy()
    (A if side == "probe_src" else B)[:1 if rows == "one" else None] = 0
    with pytest.raises(DegenerateInputError, match=f"{side}: {1 if rows == 'one' else 200} all-zero"):
        align.plan_migration(X, A, B, target_ks=(100,), select_rows=False)
    with pytest.raises(DegenerateInputError, match="all-zero"):
        align.evaluate(align.fit_migration(X[:300], Y[:300], method="ridge"), A, B)


def test_labelled_plan_holds_no_copies_of_the_corpus():
    """``plan_migration(queries=...)`` copied the old corpus (a fancy index of every row, its unit rows, two masked
    copies) and at each curve point mapped, concatenated and normalised all of it: ~4.4x its bytes at the peak, for
    corpora of millions of rows. Now its unit rows once, masks and maps one block at a time: ~1.8x."""
    import tracemalloc

    import scipy.stats  # noqa: F401 -- imported by the plan on first use: its modules are no part of the peak

    X, Y, Qn, Qo, _, rows, prel = _task(seed=0, n=20000, d=64, q=100, probe=400)
    kw = {"queries": Qn, "old_queries": Qo, "relevant": prel, "target_ks": (100, 300), "select_rows": False,
          "repeats": 1}
    tracemalloc.start()
    try:
        plan = align.plan_migration(X, X[rows], Y[rows], **kw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert plan["n_corpus"] == X.shape[0] and peak < 2.5 * X.nbytes, peak / X.nbytes


def test_an_extrapolated_forecast_says_its_interval_leaves_out_the_extrapolation():
    """QA (WordNet minilm->e5, 1,000-pair probe, 600 labelled queries): K = 1,000 forecast 0.513 [0.423, 0.603] and
    K = 3,000 0.601 [0.511, 0.691], measured 0.62-0.67 and 0.73-0.78: outside intervals marked only
    `extrapolated`, which read as covering the forecast's error. The plan now says, for the K past the probe, that
    the interval holds the probe's scatter and not the extrapolation's error; a plan within the probe does not."""
    X, Y, Qn, Qo, _, rows, prel = _task()
    plan = align.plan_migration(X, X[rows], Y[rows], queries=Qn, old_queries=Qo, relevant=prel,
                                target_ks=(100, 1000, 3000), select_rows=False)
    past = [q["k"] for q in plan["predicted"] if q["extrapolated"]]
    assert past == [1000, 3000]
    said = [n for n in plan["notes"] if "not the error of that extrapolation" in n]
    assert len(said) == 1 and "K = 1,000, 3,000" in said[0], plan["notes"]
    inside = align.plan_migration(X, X[rows], Y[rows], target_ks=(100,), select_rows=False)
    assert not any(q["extrapolated"] for q in inside["predicted"])
    assert not any("extrapolation" in n for n in inside["notes"])
