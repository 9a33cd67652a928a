"""``random_state`` takes a legacy ``np.random.RandomState`` as scikit-learn code passes one (it was an InputError):
a seed is drawn from it, so the same state gives the same result and the state moves on, as sklearn consumes it."""

import numpy as np
import pytest

import align
from align.exceptions import InputError


def test_a_random_state_object_is_accepted_and_consumed():
    X = np.random.default_rng(0).standard_normal((300, 8))
    a = align.select_rows_to_embed(X, 10, random_state=np.random.RandomState(0))
    b = align.select_rows_to_embed(X, 10, random_state=np.random.RandomState(0))
    np.testing.assert_array_equal(a, b)  # same state, same rows
    rs = np.random.RandomState(0)
    first = align.select_rows_to_embed(X, 10, random_state=rs)
    second = align.select_rows_to_embed(X, 10, random_state=rs)
    np.testing.assert_array_equal(first, a)
    assert not np.array_equal(first, second)  # the state was drawn from: the next call differs, as in sklearn


def test_a_fit_with_one_records_no_seed():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 8))
    m = align.fit_migration(X, X @ np.linalg.qr(rng.standard_normal((8, 8)))[0], method="procrustes",
                            random_state=np.random.RandomState(3))
    assert m.metadata["random_state"] == "generator"  # a state, not a seed to record


@pytest.mark.parametrize("bad", [-1, 1.5, "0", True, np.random.PCG64(0)])
def test_anything_else_is_refused_naming_what_is_accepted(bad):
    with pytest.raises(InputError, match="an int >= 0, a numpy Generator .* or a np.random.RandomState"):
        align.select_rows_to_embed(np.eye(20), 3, random_state=bad)


def test_checks_made_before_a_draw_do_not_consume_the_state():
    """check_params (a service checks a request before the fit) and evaluate's unused query sample drew from a
    RandomState: check_params() then fit() gave another map than fit() alone."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((120, 8))
    Y = X @ np.linalg.qr(rng.standard_normal((8, 8)))[0]
    rs = np.random.RandomState(5)
    align.MiniVec2Vec(random_state=rs).check_params()
    align.evaluate(align.fit_procrustes(X, Y), X, Y, random_state=rs)  # no max_queries: no sample drawn
    after_checks = rs.randint(0, 2**31 - 1)
    assert after_checks == np.random.RandomState(5).randint(0, 2**31 - 1)  # nothing was drawn before it
