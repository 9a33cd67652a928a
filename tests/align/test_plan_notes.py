"""The extrapolation note names the pairs the learning curve is fitted on: half the probe (the other half is held
out). It said "past the probe's 250 pairs" of a 500-pair probe."""

from __future__ import annotations

import numpy as np

import align


def test_the_extrapolation_note_names_the_fitting_half_of_the_probe():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 16))
    Y = X @ rng.normal(size=(16, 12)) + 0.3 * rng.normal(size=(2000, 12))
    res = align.plan_migration(X, X[:500], Y[:500], select_rows=False)
    note = next(n for n in res["notes"] if "extrapolated: K =" in n)
    assert "past the 250 pairs the curve is fitted on (half the probe's 500;" in note, note
    assert "hold none of the held-out texts" in note and "probe's 250" not in note
