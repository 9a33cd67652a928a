"""``align.keep_native_rows``: a migration re-embeds some rows to fit its map; the migrated corpus can hold those rows'
own new-model vectors instead of mapped ones (WordNet minilm->e5: +0.01-0.07 retention at K = 1,000-3,000,
``benchmarks/bench_plan_extrapolation.py``). And the plan's ``kept`` forecast, the same migration's."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import align
from align.exceptions import (
    DegenerateInputError,
    DimensionMismatchError,
    InputError,
    NonFiniteError,
    PairCountError,
)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), d=st.integers(1, 6), k=st.integers(1, 40), seed=st.integers(0, 2**16),
       dtype=st.sampled_from([np.float32, np.float64, np.float16]))
def test_the_listed_rows_hold_the_given_vectors_and_every_other_row_is_untouched(n, d, k, seed, dtype):
    rng = np.random.default_rng(seed)
    migrated = rng.standard_normal((n, d)).astype(dtype)
    before = migrated.copy()
    rows = rng.permutation(n)[: min(k, n)]  # any order: Y_new follows rows' order
    Y = rng.standard_normal((rows.size, d)).astype(np.float32)
    out = align.keep_native_rows(migrated, rows, Y)
    assert out.shape == (n, d) and out.dtype == np.float32
    np.testing.assert_allclose(out[rows], Y / np.linalg.norm(Y, axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(align.keep_native_rows(migrated, rows, Y, unit=False)[rows], Y)  # as given
    rest = np.setdiff1d(np.arange(n), rows)
    np.testing.assert_array_equal(out[rest], before[rest].astype(np.float32))
    np.testing.assert_array_equal(migrated, before)  # copy=True (the default) never writes into the input


def test_copy_false_writes_into_a_float32_array_and_copy_true_leaves_a_memmap_alone(tmp_path):
    M = np.zeros((6, 3), np.float32)
    out = align.keep_native_rows(M, [5, 0], np.full((2, 3), 2.0), copy=False, unit=False)
    assert out is M and M[[0, 5]].sum() == 12 and M[1:5].sum() == 0
    np.save(tmp_path / "m.npy", np.zeros((6, 3), np.float32))
    mm = np.load(tmp_path / "m.npy", mmap_mode="r+")
    out = align.keep_native_rows(mm, [1], np.ones((1, 3)), unit=False)
    assert out[1].sum() == 3 and np.load(tmp_path / "m.npy").sum() == 0  # a view of the file is not written


def test_a_read_only_array_is_copied_even_with_copy_false():
    """Blocks that come back from Ray are read-only: ``transform --ray --keep-rows`` was "assignment destination is
    read-only", exit 3."""
    M = np.zeros((4, 2), np.float32)
    M.setflags(write=False)
    out = align.keep_native_rows(M, [2], np.array([[3.0, 4.0]]), copy=False)
    np.testing.assert_allclose(out[2], [0.6, 0.8], rtol=1e-6)
    assert not M.any()


def test_kept_rows_are_unit_rows_as_the_maps_raw_output_so_an_inner_product_ranks_them_alike():
    """A kept vector of length 20 beside unit mapped rows topped every inner-product search (a reviewer's 2,000-row
    run: 100 of 100 queries); as unit rows they rank as cosine ranks them."""
    rng = np.random.default_rng(0)
    D = rng.standard_normal((200, 8)).astype(np.float32)
    D /= np.linalg.norm(D, axis=1, keepdims=True)
    kept = align.keep_native_rows(D, np.arange(20), 20 * rng.standard_normal((20, 8)))
    np.testing.assert_allclose(np.linalg.norm(kept, axis=1), 1.0, rtol=1e-5)
    Q = D[100:150]
    np.testing.assert_array_equal(np.argmax(Q @ kept.T, axis=1), np.arange(100, 150))  # each finds itself
    with pytest.raises(DegenerateInputError, match="all-zero"):
        align.keep_native_rows(D, [0, 1], np.array([[0.0] * 8, [1.0] * 8]))


@pytest.mark.parametrize("rows, Y, err, match", [
    ([1, 1], np.ones((2, 3)), InputError, "more than once"),
    ([1, 6], np.ones((2, 3)), InputError, r"in \[0, 6\).*got \[1, 6\]"),
    ([-1, 2], np.ones((2, 3)), InputError, r"in \[0, 6\)"),
    ([1.0, 2.0], np.ones((2, 3)), InputError, "integer row indices"),
    ([True, False], np.ones((2, 3)), InputError, "integer row indices"),
    ([[1, 2]], np.ones((2, 3)), InputError, "1-d"),
    ([1], np.ones((2, 3)), PairCountError, "holds 2 rows but rows lists 1"),
    ([1, 2], np.ones((2, 4)), DimensionMismatchError, "4 columns but migrated has 3"),
    ([1, 2], np.array([[1, np.nan, 0], [0, 0, 1]]), NonFiniteError, "NaN"),
])
def test_bad_rows_or_vectors_are_typed_errors_and_change_nothing(rows, Y, err, match):
    M = np.zeros((6, 3), np.float32)
    with pytest.raises(err, match=match):
        align.keep_native_rows(M, rows, Y, copy=False)
    assert not M.any()


def _planted(n=3000, d=24, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(np.float32)
    W = np.linalg.qr(rng.standard_normal((d, d)))[0]
    return X, (X @ W + 0.8 * rng.standard_normal((n, d))).astype(np.float32)


def test_the_plan_forecasts_kept_rows_as_the_share_of_queries_whose_document_was_re_embedded():
    X, Y = _planted()
    plan = align.plan_migration(X, X[:600], Y[:600], target_ks=(100, 1000, 2999, 5000), select_rows=False)
    n = X.shape[0]
    for q in plan["predicted"]:
        kept, s = q["kept"], min(q["k"], n) / n
        assert kept["share"] == pytest.approx(s)
        for key in ("retention", "low", "high"):
            assert kept[key] == pytest.approx(s + (1 - s) * q[key])
            assert q[key] - 1e-12 <= kept[key] <= 1.0
    assert plan["predicted"][-1]["whole_corpus"] and plan["predicted"][-1]["kept"]["retention"] == 1.0
    assert plan["predicted"][0]["kept"]["retention"] < plan["predicted"][1]["kept"]["retention"]


def test_a_plan_of_a_sample_of_unknown_size_forecasts_no_kept_rows():
    X, Y = _planted(n=1200)
    plan = align.plan_migration(X, X[:600], Y[:600], target_ks=(100, 1000), select_rows=False, old_is_sample=True)
    assert all("kept" not in q for q in plan["predicted"])


def _reads(keep: bool):
    """The forecast a plan's recommendation reads per K: ``kept`` with ``keep``, else the row itself."""
    return (lambda q: q["kept"]) if keep else (lambda q: q)


@settings(max_examples=12, deadline=None)
@given(n=st.integers(400, 3000), noise=st.floats(0.1, 1.5), target=st.floats(0.05, 1.0), seed=st.integers(0, 2**16),
       ks=st.lists(st.sampled_from([60, 100, 300, 1000, 2000, 5000]), min_size=1, max_size=4, unique=True))
def test_keep_never_recommends_more_rows_and_each_recommendation_reaches_its_own_forecast(n, noise, target, seed, ks):
    """Issue 16: the recommendation read the every-row-mapped ``retention`` even for a migration that keeps its
    re-embedded rows, whose ``kept`` forecast (never lower) reaches a target at a smaller K on a small corpus. With
    ``keep`` it reads ``kept``: the same forecasts, a K no larger, and each the smallest K whose own forecast reaches
    the target (the whole corpus, with the best migrating K and a note, when none that migrates does)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 16)).astype(np.float32)
    Y = (X @ np.linalg.qr(rng.standard_normal((16, 16)))[0] + noise * rng.standard_normal((n, 16))).astype(np.float32)
    kw = {"random_state": seed, "target_retention": target, "target_ks": tuple(ks), "select_rows": False}
    plans = {keep: align.plan_migration(X, X[:200], Y[:200], keep=keep, **kw) for keep in (False, True)}
    assert plans[True]["predicted"] == plans[False]["predicted"]  # keep changes what is read, not the forecast
    assert plans[True]["recommended"]["k"] <= plans[False]["recommended"]["k"]
    for keep, plan in plans.items():
        rec, read = plan["recommended"], _reads(keep)
        assert rec["forecast"] == ("kept" if keep else "retention")
        reached = [q["k"] for q in plan["predicted"] if read(q)["retention"] >= target and not q.get("whole_corpus")]
        if reached:
            row = next(q for q in plan["predicted"] if q["k"] == rec["k"])
            assert rec["k"] == min(reached) and read(row)["retention"] >= target and rec["migration_reaches_target"]
        else:  # none that migrates reaches it: the whole corpus, the best migrating K beside it (it was the largest K)
            assert rec["whole_corpus"] and rec["k"] == n and not rec["migration_reaches_target"], rec
            migrating = [q for q in plan["predicted"] if not q.get("whole_corpus")]
            if migrating:
                assert rec["best_migrating"]["retention"] >= max(read(q)["retention"] for q in migrating) - 1e-3
                assert any(f"reach retention {target:g}" in note for note in plan["notes"])


def test_keep_recommends_the_smaller_k_whose_kept_forecast_reaches_the_target():
    """A 1,500-row corpus: at K = 1,000 the every-row-mapped forecast stays under a target that the kept one (2/3 of
    the queries' documents re-embedded) passes; without keep the plan said re-embed the whole corpus."""
    X, Y = _planted(n=1500, d=16)
    kw = {"target_ks": (100, 300, 1000, 3000), "select_rows": False}
    at = {q["k"]: q for q in align.plan_migration(X, X[:300], Y[:300], **kw)["predicted"]}
    target = (at[1000]["retention"] + at[1000]["kept"]["retention"]) / 2  # between the two forecasts at K = 1,000
    assert at[300]["kept"]["retention"] < target and at[100]["kept"]["retention"] < target  # the data allow the case
    plain = align.plan_migration(X, X[:300], Y[:300], target_retention=target, **kw)
    kept = align.plan_migration(X, X[:300], Y[:300], target_retention=target, keep=True, **kw)
    assert plain["recommended"]["k"] == 1500 and plain["recommended"]["whole_corpus"]
    rec = kept["recommended"]
    assert (rec["k"], rec["whole_corpus"], rec["forecast"], rec["method"]) == (1000, False, "kept", "auto")
    assert plain["recommended"]["forecast"] == "retention"
    assert not any("whole old corpus" in note for note in kept["notes"])


@pytest.mark.parametrize("kw, match", [({"keep": "yes"}, "keep must be true or false"),
                                       ({"keep": True, "old_is_sample": True}, "old_is_sample")])
def test_keep_refuses_a_non_flag_and_a_sample_of_unknown_size(kw, match):
    X, Y = _planted(n=600)
    with pytest.raises(InputError, match=match):
        align.plan_migration(X, X[:200], Y[:200], select_rows=False, **kw)
