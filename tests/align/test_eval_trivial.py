"""Held-out sets too small for a figure to tell maps apart: ``align.evaluate`` refuses fewer than 2 distinct pairs
(one pair scored top-1 and recall@k 1.0 for any map), and reports recall@k as NaN with a VecbridgeWarning when
``k`` is at least the number of candidates (8 random pairs scored recall@10 1.0), as ``score_map`` does for its
@k figures."""

import math
import warnings

import numpy as np
import pytest

import align
from align.exceptions import TooFewRowsError, VecbridgeWarning


@pytest.fixture(scope="module")
def useless_map():
    rng = np.random.default_rng(0)
    return align.fit_ridge(rng.standard_normal((300, 16)), rng.standard_normal((300, 16)))  # unrelated sides


def _pairs(n, seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 16)), rng.standard_normal((n, 16))


def test_one_pair_is_refused(useless_map):
    X, Y = _pairs(1)
    with pytest.raises(TooFewRowsError, match="at least 2 distinct held-out pairs, got 1"):
        align.evaluate(useless_map, X, Y)


@pytest.mark.parametrize("n", [2, 5, 8, 10])
def test_recall_at_k_of_k_or_fewer_candidates_is_nan_with_a_warning(useless_map, n):
    X, Y = _pairs(n)
    with pytest.warns(VecbridgeWarning, match=rf"recall@10 undefined \(NaN\) on {n} distinct pairs") as caught:
        ev = align.evaluate(useless_map, X, Y, ks=(1, 5, 10))
    assert len(caught) == 1
    assert math.isnan(ev["recall@10"]) and ev["n_candidates"] == n
    assert math.isnan(ev["recall@5"]) == (n <= 5)
    assert 0.0 <= ev["recall@1"] <= 1.0 and 0.0 <= ev["top1"] <= 1.0  # recall@1 needs 2 candidates: defined
    with pytest.warns(VecbridgeWarning, match="score_map: recall@10 undefined"):
        sm = align.score_map(useless_map, X, Y)
    assert math.isnan(sm["corpus_recall@10"]) and math.isnan(sm["query_recall@10"])
    assert not math.isnan(sm["query_recall@1"])


def test_enough_candidates_give_figures_and_no_warning(useless_map):
    X, Y = _pairs(11)
    with warnings.catch_warnings():
        warnings.simplefilter("error", VecbridgeWarning)
        ev = align.evaluate(useless_map, X, Y, max_queries=6)  # a sample: intervals of every defined figure
        sm = align.score_map(useless_map, X, Y)
    assert all(0.0 <= ev[f"recall@{k}"] <= 1.0 for k in (1, 5, 10))
    assert set(ev["intervals"]) == {"top1", "recall@1", "recall@5", "recall@10", "csls_top1"}
    assert 0.0 <= sm["corpus_recall@10"] <= 1.0 and 0.0 <= sm["query_recall@10"] <= 1.0


def test_a_sample_has_no_interval_for_an_undefined_recall(useless_map):
    X, Y = _pairs(8)
    with pytest.warns(VecbridgeWarning):
        ev = align.evaluate(useless_map, X, Y, max_queries=4, csls=False)
    assert ev["n_queries"] == 4 and math.isnan(ev["recall@10"])
    assert set(ev["intervals"]) == {"top1", "recall@1", "recall@5"}
