"""select_rows_to_embed on a corpus with copies (one text stored twice): a copy of a chosen row is the same vector,
so it is never picked again; with fewer distinct rows than asked for, one row of each comes back with a warning.
It used to fill up with copies silently (5 distinct rows of 100, k = 10: 10 indices, 5 vectors)."""

import warnings

import numpy as np
import pytest

import align
from align.exceptions import VecbridgeWarning


def _copies(distinct: int, times: int, d: int = 16, seed: int = 0) -> np.ndarray:
    return np.tile(np.random.default_rng(seed).standard_normal((distinct, d)), (times, 1))


def _n_vectors(X, idx) -> int:
    return len(np.unique(X[idx], axis=0))


@pytest.mark.parametrize("method", ["kmeans++", "random"])
def test_fewer_distinct_rows_than_k_gives_one_of_each_with_a_warning(method):
    X = _copies(5, 20)
    with pytest.warns(VecbridgeWarning, match="5 distinct rows of 100 .* fewer than the 10 asked for"):
        idx = align.select_rows_to_embed(X, 10, method=method)
    assert len(idx) == 5 and _n_vectors(X, idx) == 5
    assert np.all(np.diff(idx) > 0)  # sorted, no index twice


@pytest.mark.parametrize("method", ["kmeans++", "random"])
@pytest.mark.parametrize("d", [16, 200])  # 200: D² sampling on the top 64 principal axes
def test_copies_are_never_picked_twice_when_enough_rows_are_distinct(method, d):
    rng = np.random.default_rng(1)
    X = np.vstack([rng.standard_normal((60, d)), _copies(3, 40, d, seed=2)])  # 63 distinct rows of 180
    rng.shuffle(X)
    with warnings.catch_warnings():
        warnings.simplefilter("error", VecbridgeWarning)
        for k in (10, 40, 63):
            idx = align.select_rows_to_embed(X, k, method=method, random_state=k)
            assert len(idx) == k and _n_vectors(X, idx) == k, (k, method)
            again = align.select_rows_to_embed(X, k, method=method, random_state=k)
            np.testing.assert_array_equal(idx, again)  # same seed, same rows
    with pytest.warns(VecbridgeWarning, match="63 distinct rows of 180"):
        assert len(align.select_rows_to_embed(X, 64, method=method)) == 63



def test_a_plan_over_a_corpus_of_copies_says_why_it_returns_fewer_rows():
    """plan(k=100) over 40 distinct rows x 10 copies gave 40 rows_to_embed with no word in its notes (the warning only
    reached a server's stderr): the notes now say it, and no VecbridgeWarning is left for the caller to route."""
    rng = np.random.default_rng(3)
    old = _copies(40, 10, d=16, seed=3)
    P = rng.standard_normal((200, 16))
    Q = P @ np.linalg.qr(rng.standard_normal((16, 16)))[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", VecbridgeWarning)
        res = align.plan_migration(old, P, Q, rows_k=100)
    assert len(res["rows_to_embed"]) == 40 and _n_vectors(old, res["rows_to_embed"]) == 40
    assert any("rows_to_embed holds 40 rows, not 100" in n and "copies" in n for n in res["notes"]), res["notes"]
