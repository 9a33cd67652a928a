"""Held-out evaluation on a sample of query rows (`max_queries`): every row stays a candidate, the figures of a
sample carry a 95 % interval, and at or under the cap the figures are those of every row."""

from __future__ import annotations

import numpy as np
import pytest

import align
from align.exceptions import InputError
from align.frames import unit_rows
from align.metrics import proportion_interval, query_sample, ranks


@pytest.fixture(scope="module")
def held(wordnet):
    """A MiniLM -> e5 Procrustes map from 2,000 WordNet pairs and up to 5,000 held-out pairs (rows 2,000:7,000 of
    the shared set; 2,096 rows of the 4,096-row sample conftest embeds when it is absent)."""
    X = np.asarray(wordnet["minilm"][:7000], np.float32)
    Y = np.asarray(wordnet["e5"][:7000], np.float32)
    return align.fit_procrustes(X[:2000], Y[:2000]), X[2000:], Y[2000:]


def test_under_the_cap_the_figures_are_those_of_every_row(held):
    m, X, Y = held
    full = align.evaluate(m, X, Y)                                             # with CSLS (align's default)
    assert align.evaluate(m, X, Y, max_queries=X.shape[0], random_state=7) == full
    assert align.evaluate(m, X, Y, csls=False, max_queries=10**9) == align.evaluate(m, X, Y, csls=False)
    assert align.score_map(m, X, Y, max_queries=X.shape[0]) == align.score_map(m, X, Y)
    assert full["n_queries"] == full["n_candidates"] == X.shape[0] and "intervals" not in full


def test_a_sample_of_queries_is_ranked_against_every_row_and_is_reproducible(held):
    m, X, Y = held
    full, full_s = align.evaluate(m, X, Y), align.score_map(m, X, Y)
    ev = align.evaluate(m, X, Y, max_queries=1000, random_state=3)
    sc = align.score_map(m, X, Y, max_queries=1000, random_state=3)
    assert (ev["n_queries"], ev["n_candidates"], sc["n_queries"], sc["n_pairs"]) == (1000, X.shape[0], 1000, X.shape[0])
    assert ev == align.evaluate(m, X, Y, max_queries=1000, random_state=3)          # same seed, same figures
    assert sc == align.score_map(m, X, Y, max_queries=1000, random_state=3)
    other = align.evaluate(m, X, Y, csls=False, max_queries=1000, random_state=4)    # another sample
    assert other["mean_rank"] != ev["mean_rank"]
    assert ev["cos"] == full["cos"] and sc["cos"] == full_s["cos"]                   # not a rank: all pairs
    # each sampled query's rank is its rank in the full evaluation: the pool is every row, not the sample
    rows = query_sample(X.shape[0], 1000, 3)
    Q, D = unit_rows(m.apply(X, output="linear")), unit_rows(m.target_frame.apply(Y))
    np.testing.assert_array_equal(ranks(Q[rows], D, cols=rows), ranks(Q, D)[rows])
    assert ev["top1"] == float((ranks(Q, D)[rows] == 1).mean())
    # the interval of top-1 and recall@10 contains the figure of every row (how often in general: the next test)
    assert ev["interval_level"] == sc["interval_level"] == 0.95
    for name in ("top1", "recall@10"):
        lo, hi = ev["intervals"][name]
        assert lo <= full[name] <= hi and lo <= ev[name] <= hi, (name, lo, full[name], hi)
    # every sampled share carries the interval of its own hits
    for name, value in [(n, ev[n]) for n in ("top1", "recall@1", "recall@5", "recall@10", "csls_top1")] + \
            [(n, sc[n]) for n in ("corpus_recall@1", "corpus_recall@10", "query_recall@1", "query_recall@10",
                                  "nn_retention@10")]:
        iv = ev["intervals"].get(name) or sc["intervals"][name]
        assert iv == proportion_interval(round(value * 1000), 1000, X.shape[0]), name


def test_the_interval_covers_the_full_figure_at_its_level(held):
    """Over 200 seeded samples of 400 of 5,000 real rows (2,096 on the sample), the 95 % interval of top-1 and recall@10 held the
    figure of every row in about 95 % of them (finite-population Wilson: no binomial overstatement)."""
    m, X, Y = held
    r = ranks(unit_rows(m.apply(X, output="linear")), unit_rows(m.target_frame.apply(Y)))
    for cut in (1, 10):
        truth = float((r <= cut).mean())
        covered = []
        for seed in range(200):
            s = r[query_sample(r.size, 400, seed)]
            lo, hi = proportion_interval(int((s <= cut).sum()), s.size, r.size)
            covered.append(lo <= truth <= hi)
        assert 0.90 <= np.mean(covered) <= 0.995, (cut, np.mean(covered))


def test_interval_arithmetic():
    assert proportion_interval(30, 100, 100) == [0.3, 0.3]                 # every row: exact
    lo, hi = proportion_interval(9500, 10000, 10**9)                       # binomial limit: ~ +-0.0043
    assert lo == pytest.approx(0.9456, abs=1e-4) and hi == pytest.approx(0.9541, abs=1e-4)
    wide, narrow = proportion_interval(50, 100, 10**6), proportion_interval(50, 100, 200)
    assert narrow[1] - narrow[0] < wide[1] - wide[0]                       # half the population: narrower
    assert proportion_interval(0, 50, 1000)[0] == 0.0 and proportion_interval(50, 50, 1000)[1] == 1.0


@pytest.mark.parametrize("bad", [0, -5, 2.5, True, "100", float("nan")])
def test_bad_max_queries_is_a_typed_error(held, bad):
    m, X, Y = held
    with pytest.raises(InputError, match="max_queries"):
        align.evaluate(m, X[:50], Y[:50], max_queries=bad)
    with pytest.raises(InputError, match="max_queries"):
        align.score_map(m, X[:50], Y[:50], max_queries=bad)
    with pytest.raises(InputError, match="random_state"):
        align.evaluate(m, X[:50], Y[:50], max_queries=10, random_state=-1)


def test_repeated_held_out_pairs_are_scored_once(held):
    """A copy of a held-out pair is its own nearest native row: nn_retention@10 found it through the map by memory
    (WordNet minilm->e5, 1,000 pairs plus a copy of 100 of them: 0.742 read 0.781; all twice: 0.995), and the copy
    of another pair pushed ranks down. Both scores are of the distinct pairs."""
    m, X, Y = held
    X, Y = X[:1000], Y[:1000]
    Xd, Yd = np.concatenate([X, X[:100]]), np.concatenate([Y, Y[:100]])
    once, dup = align.score_map(m, X, Y), align.score_map(m, Xd, Yd)
    assert dup.pop("n_repeated") == 100 and once.pop("n_repeated") == 0
    assert dup == once and dup["n_pairs"] == 1000
    ev_once, ev_dup = align.evaluate(m, X, Y), align.evaluate(m, np.concatenate([X, X]), np.concatenate([Y, Y]))
    assert ev_dup.pop("n_repeated") == 1000 and ev_once.pop("n_repeated") == 0
    assert ev_dup == ev_once and ev_dup["n_candidates"] == 1000
