"""The refusals a notebook user meets first say how to fix the input: a 1-D query (one vector), a pandas column of
vectors (dtype object), 0/1 labels for a steer (0 is neutral there, -1 the negative label)."""

import numpy as np
import pytest

import align
from align.exceptions import DegenerateInputError, InputError, ShapeError


@pytest.fixture(scope="module")
def rows():
    return np.random.default_rng(0).standard_normal((100, 8))


def test_one_vector_is_told_to_reshape(rows):
    m = align.fit_procrustes(rows, rows)
    with pytest.raises(ShapeError, match=r"got 1-D shape \(8,\); one vector is one row: x.reshape\(1, -1\)"):
        m.apply(rows[0])
    np.testing.assert_array_equal(m.apply(rows[0].reshape(1, -1)), m.apply(rows[:1]))  # the fix it names works
    with pytest.raises(ShapeError) as info:
        m.apply(rows[None])  # 3-D: no reshape hint
    assert "reshape" not in str(info.value)


def test_a_column_of_vectors_is_told_to_stack(rows):
    m = align.fit_procrustes(rows, rows)
    column = np.empty(len(rows), dtype=object)
    column[:] = list(rows)  # what np.asarray(df["emb"]) gives for a DataFrame column of arrays
    with pytest.raises(InputError, match=r"got dtype object; a column of vectors .* np.stack\(column\)"):
        m.apply(column)
    np.testing.assert_array_equal(m.apply(np.stack(column)), m.apply(rows))
    with pytest.raises(InputError) as info:
        m.apply(np.array(["a", "b"], dtype=object)[:, None])  # strings: no stacking hint
    assert "np.stack" not in str(info.value)


def test_zero_one_labels_are_told_zero_is_neutral(rows):
    labels = np.arange(100) % 2
    with pytest.raises(DegenerateInputError, match=r"0 negative, 50 neutral \(0 is neutral, -1 the negative label: "
                                                   r"0/1 labels become \+1/-1 with 2 \* labels - 1\)"):
        align.fit_steer(rows, labels)
    assert isinstance(align.fit_mean_shift(rows, 2 * labels - 1), align.MeanShift)
    with pytest.raises(DegenerateInputError) as info:
        align.fit_steer(rows, np.ones(100, int))  # no 0 labels: nothing about neutral
    assert "neutral" not in str(info.value)
