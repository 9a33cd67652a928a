"""align.labelled_retention: labelled retrieval in a migrated vs a native index (the figure a CI gate reads)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import align
from align.exceptions import (DegenerateInputError, DimensionMismatchError, InputError, NonFiniteError,
                              PairCountError)
from align.frames import unit_rows
from align.retrieval import (CHANCE_LEVEL, MIN_NATIVE_HITS, chance_p_value, expected_hits, hubness, labelled_retrieval,
                             relevant_ranks, retention_interval)


def _corpus(n=400, d=16, q=120, seed=0, query_noise=0.6):
    """Clustered documents X (source model), Y = X R (target model, a planted rotation), and target-model
    queries near their relevant document (noise ``query_noise`` relative to the row norm)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(10, d)) * 2.0
    X = centres[rng.integers(0, 10, n)] + rng.normal(size=(n, d))
    R = np.linalg.qr(rng.normal(size=(d, d)))[0]
    Y = X @ R
    rel = rng.integers(0, n, q)
    Q = Y[rel] + query_noise * np.linalg.norm(Y[rel], axis=1, keepdims=True) * rng.normal(size=(q, d)) / np.sqrt(d)
    return X.astype(np.float32), Y.astype(np.float32), Q.astype(np.float32), rel, R


def _brute_ranks(Q, D, rel):
    """Independent reference: the full (q, n) cosine matrix, rank = 1 + documents strictly above the relevant one."""
    S = unit_rows(Q).astype(np.float64) @ unit_rows(D).astype(np.float64).T
    true = S[np.arange(len(rel)), rel]
    return 1 + (S > true[:, None] + 1e-6).sum(axis=1)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), noise=st.floats(0.05, 2.0))
def test_an_exact_map_keeps_every_metric_on_both_sides(seed, noise):
    X, Y, Q, rel, R = _corpus(seed=seed, query_noise=noise)
    fwd = align.LinearMap(R.astype(np.float32))          # x -> x R: exact source -> target
    res = align.labelled_retention(fwd, X, Y, Q, rel)
    assert res["side"] == "target" and res["n_queries"] == len(rel) and res["n_documents"] == len(X)
    # Y = X R in float64, the map's X R in float32: a near-tie may flip once in a while, nothing more
    tol = 2.0 / len(rel)
    for m, v in res["migrated"].items():
        assert v == pytest.approx(res["native"][m], abs=tol)
    back = align.LinearMap(R.T.astype(np.float32))       # query-side: target-model queries into the source index
    res = align.labelled_retention(back, Y, X, Q, rel, side="source")
    assert res["side"] == "source"
    assert res["migrated"] == pytest.approx(res["native"], abs=tol)
    assert res["retention"]["R@10"] == pytest.approx(1.0, abs=0.05)


def test_ranks_and_metrics_match_a_brute_force_reference():
    X, Y, Q, rel, _ = _corpus(seed=3)
    wrong = align.fit_procrustes(X[:30], Y[:30] + np.random.default_rng(1).normal(size=(30, 16)).astype(np.float32))
    res = align.labelled_retention(wrong, X, Y, Q, rel)
    for name, D in (("migrated", wrong.apply(X, output="raw")), ("native", Y)):
        r = _brute_ranks(Q, D, rel)
        np.testing.assert_array_equal(relevant_ranks(unit_rows(Q), unit_rows(D), rel, block=7), r)
        assert res[name]["R@1"] == pytest.approx(np.mean(r == 1))
        assert res[name]["R@10"] == pytest.approx(np.mean(r <= 10))
        assert res[name]["MRR"] == pytest.approx(np.mean(1.0 / r))
        assert res[name]["nDCG@10"] == pytest.approx(np.mean(np.where(r <= 10, 1 / np.log2(1 + r), 0.0)))
    assert res["retention"]["R@10"] == pytest.approx(res["migrated"]["R@10"] / res["native"]["R@10"])
    # query-side: a map source -> target moves source-model queries into the target index; native = source index
    Qs = X[rel] + 0.6 * np.random.default_rng(2).normal(size=(len(rel), 16)).astype(np.float32)
    res = align.labelled_retention(wrong, X, Y, Qs, rel, side="source")
    assert res["migrated"]["MRR"] == pytest.approx(np.mean(1.0 / _brute_ranks(wrong.apply(Qs, output="raw"), Y, rel)))
    assert res["native"]["MRR"] == pytest.approx(np.mean(1.0 / _brute_ranks(Qs, X, rel)))


def test_a_poor_map_loses_retention_and_more_pairs_win_it_back():
    X, Y, Q, rel, _ = _corpus(n=1500, d=32, q=400, seed=5, query_noise=0.8)
    rng = np.random.default_rng(0)
    Yn = Y + 0.8 * rng.normal(size=Y.shape).astype(np.float32)   # the models disagree row by row
    few = align.labelled_retention(align.fit_ridge(X[:20], Yn[:20], alpha=1.0), X, Y, Q, rel)["retention"]["R@10"]
    many = align.labelled_retention(align.fit_ridge(X, Yn, alpha=1.0), X, Y, Q, rel)["retention"]["R@10"]
    assert few < 0.75 and many > 0.95


def test_ties_with_the_relevant_document_do_not_push_it_down():
    D = np.array([[1, 0], [1, 0], [0, 1]], np.float32)   # rows 0 and 1 are the same document twice
    Q = np.array([[1, 0.01]], np.float32)
    for rel in (0, 1):
        out = labelled_retrieval(unit_rows(Q), D, unit_rows(Q), D, np.array([rel]), k=1)
        assert out["native"]["R@1"] == 1.0


def test_an_exact_copy_of_the_relevant_document_does_not_push_it_down_at_real_dimensions():
    """relevant_ranks on 384-d documents where row 0 (every query's relevant one) has an exact copy at each
    position: the copy ties with it, so the rank equals the rank with the copy left out.

    Before, BLAS gave the two identical columns scores differing in the last bits, and the strict ``>`` put the
    copy above the relevant document for ~1 % of queries (R@1 / MRR of a corpus with duplicate texts too low),
    though the docstring says a tied document does not push it down (the 2-d test above never showed it)."""
    rng = np.random.default_rng(0)
    for n in range(2, 41):  # the copy overtook it in the last columns of a product (BLAS tail kernels)
        for j in range(1, n):
            D = unit_rows(rng.standard_normal((n, 384)).astype(np.float32))
            D[j] = D[0]
            Q = unit_rows(rng.standard_normal((5, 384)).astype(np.float32))
            S = Q.astype(np.float64) @ np.delete(D, j, axis=0).astype(np.float64).T
            want = 1 + (S > S[:, [0]]).sum(axis=1)  # no near-ties here: float64 orders them as float32 does
            np.testing.assert_array_equal(relevant_ranks(Q, D, np.zeros(5, np.int64)), want)


@pytest.mark.parametrize("kw, err", [
    (dict(relevant=np.arange(5)), PairCountError),                          # not one per query
    (dict(relevant=np.full(120, 400)), InputError),                         # out of range
    (dict(relevant=np.full(120, -1)), InputError),
    (dict(relevant=np.zeros(120, np.float32)), InputError),                 # not integers
    (dict(relevant=np.zeros((120, 1), np.int64)), PairCountError),
    (dict(queries=np.full((120, 16), np.nan, np.float32)), NonFiniteError),
    (dict(queries=np.zeros((120, 9), np.float32)), DimensionMismatchError),  # not the target's dimension
    (dict(side="both"), InputError),
    (dict(queries=np.zeros((120, 16), np.float32)), DegenerateInputError),   # would tie with everything: a "hit"
    (dict(k=0), InputError),
    (dict(k=True), InputError),
    (dict(Y_tgt=np.zeros((399, 16), np.float32)), PairCountError),
])
def test_bad_input_raises_typed_errors(kw, err):
    X, Y, Q, rel, R = _corpus()
    args = dict(X_src=X, Y_tgt=Y, queries=Q, relevant=rel)
    args.update(kw)
    with pytest.raises(err):
        align.labelled_retention(align.LinearMap(R.astype(np.float32)), **args)


def test_dimensions_of_each_side_are_checked_against_the_map():
    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(200, 12)).astype(np.float32), rng.normal(size=(200, 8)).astype(np.float32)
    m = align.fit_ridge(X, Y, alpha=1.0)
    rel = np.arange(50)
    assert align.labelled_retention(m, X, Y, Y[:50], rel)["n_queries"] == 50
    assert align.labelled_retention(m, X, Y, X[:50], rel, side="source")["n_queries"] == 50
    with pytest.raises(DimensionMismatchError):
        align.labelled_retention(m, X, Y, X[:50], rel)             # source-model queries on the target side
    with pytest.raises(DimensionMismatchError):
        align.labelled_retention(m, Y, X, Y[:50], rel)             # documents the other way round


def test_old_queries_give_the_keep_the_old_model_baseline_on_each_side():
    X, Y, Q, rel, R = _corpus(seed=7)
    Qold = Q @ R.T                                   # the same queries under the source (old) model
    fwd = align.LinearMap(R.astype(np.float32))
    res = align.labelled_retention(fwd, X, Y, Q, rel, old_queries=Qold)
    # the old model is the new one rotated: keeping it is as good as native, the exact map as good as both
    assert res["old"] == pytest.approx(res["native"], abs=2.0 / len(rel))
    assert res["old_retention"]["R@10"] == pytest.approx(1.0, abs=0.05) and res["beats_old"] in (True, False)
    poor = align.fit_procrustes(X[:20], Y[:20] + np.random.default_rng(0).normal(size=(20, 16)).astype(np.float32))
    res = align.labelled_retention(poor, X, Y, Q, rel, old_queries=Qold)
    assert res["beats_old"] is False and res["migrated"]["R@10"] < res["old"]["R@10"]
    # query-side: map target -> source, queries in the target model, old model = the map's target (X here)
    back = align.LinearMap(R.T.astype(np.float32))
    res = align.labelled_retention(back, Y, X, Q, rel, side="source", old_queries=Qold)
    assert res["old"]["MRR"] == pytest.approx(np.mean(1.0 / _brute_ranks(Qold, X, rel)))
    with pytest.raises(PairCountError):
        align.labelled_retention(fwd, X, Y, Q, rel, old_queries=Qold[:5])
    with pytest.raises(DimensionMismatchError):
        align.labelled_retention(fwd, X, Y, Q, rel, old_queries=np.zeros((len(rel), 9), np.float32))
    with pytest.raises(NonFiniteError):
        align.labelled_retention(fwd, X, Y, Q, rel, old_queries=np.full_like(Qold, np.inf))
    with pytest.raises(DegenerateInputError):
        align.labelled_retention(fwd, X, Y, Q, rel, old_queries=np.where(np.arange(16) < 99, 0.0, Qold))


@pytest.mark.parametrize("scale", [1e-30, 1e-20, 1.0, 1e20, 1e30, 3e38])
def test_numeric_extremes_of_queries_and_documents_rank_like_unit_rows(scale):
    X, Y, Q, rel, R = _corpus(seed=11)
    m = align.LinearMap(R.astype(np.float32))
    ref = align.labelled_retention(m, X, Y, Q, rel, old_queries=Q @ R.T)
    big = np.float32(scale)
    Qs = (Q / np.abs(Q).max() * big).astype(np.float32)            # every entry within float32 range
    got = align.labelled_retention(m, X, Y, Qs, rel, old_queries=(Q @ R.T / np.abs(Q @ R.T).max() * big))
    for part in ("native", "migrated", "old"):
        assert got[part] == pytest.approx(ref[part], abs=2.0 / len(rel)), (scale, part)


# --- the retention interval -------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), q=st.integers(20, 2_000), p_nat=st.floats(0.3, 1.0), keep=st.floats(0.3, 1.0))
def test_retention_interval_holds_the_observed_retention_and_repeats_with_its_seed(seed, q, p_nat, keep):
    rng = np.random.default_rng(seed)
    nat = rng.random(q) < p_nat
    mig = nat & (rng.random(q) < keep) | (~nat & (rng.random(q) < 0.1))
    if not nat.any():
        assert retention_interval(mig, nat) is None
        return
    lo, hi = retention_interval(mig, nat, random_state=seed)
    point = mig.sum() / nat.sum()
    assert lo <= point + 1e-12 and point - 1e-12 <= hi
    assert retention_interval(mig, nat, random_state=seed) == [lo, hi]
    lo50, hi50 = retention_interval(mig, nat, level=0.5, random_state=seed)
    assert lo <= lo50 + 1e-12 and hi50 <= hi + 1e-12                  # a lower level is a narrower interval


def test_retention_interval_is_a_point_when_both_indexes_hit_the_same_queries():
    hits = np.arange(300) % 3 > 0
    assert retention_interval(hits, hits) == [1.0, 1.0]


def test_retention_interval_covers_the_true_retention_about_as_often_as_its_level():
    """400 samples of 600 queries from a population whose retention is 0.95 (native hits 0.9 of queries,
    the migrated index keeps 0.95 of those): a 95 % interval should hold 0.95 in about 95 % of them."""
    rng = np.random.default_rng(7)
    covered, widths = 0, []
    for _ in range(400):
        nat = rng.random(600) < 0.9
        mig = nat & (rng.random(600) < 0.95)
        lo, hi = retention_interval(mig, nat, random_state=int(rng.integers(1 << 30)))
        covered += lo <= 0.95 <= hi
        widths.append(hi - lo)
    assert 0.90 <= covered / 400 <= 0.99
    assert 0.02 < float(np.median(widths)) < 0.06                       # ~±2 points at 600 queries


def test_retention_interval_narrows_with_more_queries():
    rng = np.random.default_rng(3)
    width = {}
    for q in (200, 20_000):
        nat = rng.random(q) < 0.8
        mig = nat & (rng.random(q) < 0.9)
        lo, hi = retention_interval(mig, nat)
        width[q] = hi - lo
    assert width[20_000] < width[200] / 5


@pytest.mark.parametrize("kw, err", [
    ({"hits_migrated": np.ones(3, bool), "hits_native": np.ones(4, bool)}, PairCountError),
    ({"hits_migrated": np.ones(0, bool), "hits_native": np.ones(0, bool)}, PairCountError),
    ({"level": 1.0}, InputError), ({"level": 0.0}, InputError), ({"level": float("nan")}, InputError),
    ({"level": "0.9"}, InputError), ({"level": True}, InputError),
    ({"n_resamples": 10}, InputError), ({"n_resamples": True}, InputError), ({"n_resamples": 1000.0}, InputError),
    ({"random_state": "seed"}, InputError),
])
def test_retention_interval_bad_input_raises_typed_errors(kw, err):
    args = {"hits_migrated": np.ones(5, bool), "hits_native": np.ones(5, bool), **kw}
    with pytest.raises(err):
        retention_interval(args.pop("hits_migrated"), args.pop("hits_native"), **args)


def test_labelled_retention_reports_the_interval_of_its_recall_retention():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((400, 16))
    Y = X @ np.linalg.qr(rng.standard_normal((16, 16)))[0] + 0.8 * rng.standard_normal((400, 16))
    m = align.fit_procrustes(X[:200], Y[:200])
    rel = np.arange(200, 400)
    Q = Y[rel] + 0.5 * rng.standard_normal((200, 16))
    out = align.labelled_retention(m, X, Y, Q, rel)
    lo, hi = out["retention_interval"]["R@10"]
    assert out["interval_level"] == 0.95
    assert lo <= out["retention"]["R@10"] <= hi and hi - lo > 0.01
    assert align.labelled_retention(m, X, Y, Q, rel, random_state=1)["retention_interval"]["R@10"] != [lo, hi]


# --- labelled retention under CSLS search -----------------------------------------------------------------

def test_hubness_is_the_mean_of_the_k_nearest_other_rows():
    rng = np.random.default_rng(4)
    D = unit_rows(rng.standard_normal((60, 8)))
    S = D @ D.T
    np.fill_diagonal(S, -np.inf)
    ref = np.sort(S, axis=1)[:, ::-1][:, :5].mean(axis=1)
    np.testing.assert_allclose(hubness(D, 5), ref, atol=1e-5)
    D2 = np.vstack([D, D[:1]])                   # a duplicate row: its twin counts, itself does not
    assert hubness(D2, 3)[0] == pytest.approx(np.sort(D2[1:] @ D2[0])[::-1][:3].mean(), abs=1e-5)
    assert hubness(D[:1], 5).tolist() == [0.0]


@pytest.mark.parametrize("side", ["target", "source"])
def test_csls_labelled_retention_ranks_by_the_csls_score_and_weight_zero_is_plain(side):
    rng = np.random.default_rng(5)
    X = rng.standard_normal((300, 12))
    Y = np.tanh(X) @ np.linalg.qr(rng.standard_normal((12, 12)))[0] + 0.3 * rng.standard_normal((300, 12))
    m = align.fit_ridge(X[:150], Y[:150], alpha=1e-2) if side == "target" else align.fit_ridge(Y[:150], X[:150],
                                                                                                  alpha=1e-2)
    rel = rng.choice(300, 80, replace=False)
    Q = (Y if side == "target" else X)[rel] + 0.6 * rng.standard_normal((80, 12))
    Xs, Yt = (X, Y) if side == "target" else (Y, X)
    plain = align.labelled_retention(m, Xs, Yt, Q, rel, side=side)
    zero = align.labelled_retention(m, Xs, Yt, Q, rel, side=side, csls_weight=0.0)
    assert zero["retention"] == plain["retention"] and zero["csls_weight"] == 0.0 and plain["csls_weight"] is None
    got = align.labelled_retention(m, Xs, Yt, Q, rel, side=side, csls_weight=1.0, csls_k=5)
    # brute force: the migrated index ranked by cos(q, d) - r(d) / 2, r(d) over the migrated documents
    if side == "target":
        Qm, Dm = unit_rows(Q), unit_rows(m.apply(Xs, output="raw"))
    else:
        Qm, Dm = unit_rows(m.apply(Q, output="raw")), unit_rows(Yt)
    DD = Dm @ Dm.T
    np.fill_diagonal(DD, -np.inf)
    r_d = np.sort(DD, axis=1)[:, ::-1][:, :5].mean(axis=1)
    C = Qm @ Dm.T - 0.5 * r_d[None, :]
    ranks_ref = 1 + (C > C[np.arange(80), rel][:, None]).sum(axis=1)
    assert got["migrated"]["R@10"] == pytest.approx(float((ranks_ref <= 10).mean()))
    assert got["migrated"]["MRR"] == pytest.approx(float((1.0 / ranks_ref).mean()), rel=1e-5)
    assert got["native"] == plain["native"]                      # the reference stays plain re-embedding


@pytest.mark.parametrize("bad", [{"csls_weight": -0.1}, {"csls_weight": 2.5}, {"csls_weight": float("nan")},
                                 {"csls_weight": True}, {"csls_weight": "0.5"}, {"csls_k": 0}, {"csls_k": 1001},
                                 {"csls_k": 2.5}])
def test_csls_labelled_retention_bad_parameters(bad):
    rng = np.random.default_rng(6)
    X = rng.standard_normal((50, 6))
    m = align.fit_procrustes(X, X)
    with pytest.raises(InputError, match="csls"):
        align.labelled_retention(m, X, X, X[:5], np.arange(5), **{"csls_weight": 0.5, **bad})


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 300), block=st.integers(1, 700), seed=st.integers(0, 2**16))
def test_a_duplicate_of_the_true_partner_never_pushes_it_down(n, block, seed):
    """Pair rank kernels (metrics.ranks, the distractors of pair_retrieval_scores) on a pool where every candidate
    has an exact duplicate: each query ranks its partner first, at any block size. (relevant_ranks stays strict:
    it is the rank a search of the corpus returns.)

    Before, BLAS gave two identical columns of one product scores differing in the last bits (and the
    distractor count compared against a separate dot product), so with 1,000 rows ~20 true partners got rank 2
    ("a distractor scoring exactly as high as the partner does not count" was not true)."""
    from align.metrics import ranks
    from align.retrieval import pair_retrieval_scores

    D = np.random.default_rng(seed).standard_normal((n, 384)).astype(np.float32)
    D /= np.linalg.norm(D, axis=1, keepdims=True)
    pool = np.concatenate([D, D])
    assert (ranks(pool, pool, block_size=block) == 1).all()
    got = pair_retrieval_scores(D, D, extra_M=D, extra_T=D, retention=False)
    assert got["corpus_recall@1"] == got["query_recall@1"] == 1.0


def test_a_map_that_sends_every_row_to_one_vector_is_not_scored_perfect():
    """A constant map (W = 0 with a bias) or a zero map ties every candidate with the true one, and a tie counts as a
    hit: labelled_retention gave retention 1.0 (the CI gate passed), evaluate top-1 1.0 for W = 0, score_map a
    corpus-side recall@1 of 1.0, and fit_migration chose a ridge α that collapsed the map on weakly related pairs.
    Now the gate figures refuse such a map (DegenerateInputError) and the selection scores it 0."""
    from align.exceptions import DegenerateInputError

    rng = np.random.default_rng(0)
    n, d = 200, 12
    X = rng.normal(size=(n, d)).astype(np.float32)
    Y = (X @ np.linalg.qr(rng.normal(size=(d, d)))[0]).astype(np.float32)
    Q, rel = (Y[:30] + 0.3 * rng.normal(size=(30, d))).astype(np.float32), np.arange(30)
    for m in (align.LinearMap(np.zeros((d, d)), bias=np.ones(d)), align.LinearMap(np.zeros((d, d)))):
        with pytest.raises(DegenerateInputError):
            align.labelled_retention(m, X, Y, Q, rel)
        with pytest.raises(DegenerateInputError):
            align.score_map(m, X, Y)
    with pytest.raises(DegenerateInputError):
        align.evaluate(align.LinearMap(np.zeros((d, d))), X, Y)
    with pytest.raises(DegenerateInputError):
        align.cross_val_top1(X, Y, lambda a, b: align.LinearMap(np.zeros((d, d))))
    good = align.fit_ridge(X, Y)
    assert align.labelled_retention(good, X, Y, Q, rel)["retention"]["R@10"] == 1.0
    Xu = rng.normal(size=(300, 32)).astype(np.float32)
    Yu = rng.normal(size=(300, 32)).astype(np.float32) + 1.0  # unrelated pairs: no map scores well
    m = align.fit_migration(Xu, Yu, method="ridge", alphas=[1e-2, 1e6], random_state=0)
    ridge = m.metadata["selection"]["candidates"]["ridge"]
    assert ridge["alpha"] == 1e-2, ridge  # α = 1e6 maps every row to one vector (spread ~1e-7)
    out = m.apply(Xu[:50])
    assert np.abs(out - out[0]).max() > 1e-3


def test_chance_p_value_is_the_binomial_upper_tail():
    from math import comb

    for hits, q, rate in ((0, 50, 0.1), (2, 600, 10 / 2999), (7, 30, 0.05), (30, 30, 0.9), (5, 20, 1.0)):
        brute = sum(comb(q, i) * rate ** i * (1 - rate) ** (q - i) for i in range(hits, q + 1))
        assert chance_p_value(hits, q, rate) == pytest.approx(min(1.0, brute), rel=1e-9, abs=1e-12)
    # the hits a random ranking expects, as the reason prints them: 5 queries over 2,999 documents were "0.0"
    assert [expected_hits(q, r) for q, r in ((5, 10 / 2999), (600, 10 / 2999), (12, 1.2))] == ["0.017", "2.0", "12.0"]


def test_a_native_figure_at_chance_or_on_too_few_hits_decides_no_gate():
    """Queries of another model than the native documents (a query-side map evaluated corpus-side) hit at chance: a
    retention 2.0 on 2 native hits of 600 PASSed a 0.6 gate. ``undecided`` now says why; the right queries leave it
    None. Queries that hit natively far above chance but only a few times leave a ratio that says nothing."""
    X, Y, Q, rel, R = _corpus(n=400, q=120, seed=5, query_noise=0.3)
    fwd = align.LinearMap(R.astype(np.float32))
    good = align.labelled_retention(fwd, X, Y, Q, rel)
    assert good["undecided"] is None and good["native_hits"] > 60 and good["chance_p"] < 1e-12
    other = np.random.default_rng(9).normal(size=Q.shape).astype(np.float32)   # queries that belong to nothing here
    bad = align.labelled_retention(fwd, X, Y, other, rel)
    assert bad["native_hits"] == round(bad["native"]["R@10"] * len(rel))
    assert bad["chance_p"] >= CHANCE_LEVEL and "no better than a random ranking" in bad["undecided"]
    # 6 queries, 3 of which hit natively (10 of 400 at random: 0.15 expected): far above chance, but a ratio of 3
    rng = np.random.default_rng(2)
    few = np.concatenate([Y[rel[:3]], rng.normal(size=(3, 16)).astype(np.float32)])
    noisy = align.LinearMap(R.astype(np.float32) + 0.5 * rng.normal(size=(16, 16)).astype(np.float32))
    res = align.labelled_retention(noisy, X, Y, few, rel[:6])
    assert res["chance_p"] < CHANCE_LEVEL and res["native_hits"] == 3 < MIN_NATIVE_HITS
    assert "fewer than the 5" in res["undecided"]


def test_few_native_hits_are_undecided_by_their_count_not_by_the_bootstrap_seed():
    """The interval-width rule (width >= 1 decides nothing) judged the same hits by the bootstrap's seed ([0.5, 1.5]
    refused for seeds 0-7, judged for 8) and let 3 of 3 kept ([1, 1]) decide a 0.9 gate. Now the native hits are
    counted: below MIN_NATIVE_HITS undecided at every seed, from it on decided at every seed."""
    X, Y, _, rel, R = _corpus(n=400, q=120, seed=5, query_noise=0.3)
    exact = align.LinearMap(R.astype(np.float32))
    for hits in (2, 3, MIN_NATIVE_HITS - 1, MIN_NATIVE_HITS, MIN_NATIVE_HITS + 3):   # 2 of 4 is above chance
        Q = np.concatenate([Y[rel[:hits]], -Y[rel[hits:hits + 2]]])     # 2 queries whose document is the farthest
        seen = {}
        for seed in range(12):
            res = align.labelled_retention(exact, X, Y, Q, rel[:hits + 2], random_state=seed)
            assert res["native_hits"] == hits and res["retention"]["R@10"] == 1.0 and res["chance_p"] < CHANCE_LEVEL
            seen[seed] = res["undecided"]
        assert len(set(seen.values())) == 1, (hits, seen)          # the same counts, the same answer at every seed
        assert (seen[0] is None) is (hits >= MIN_NATIVE_HITS), (hits, seen[0])
