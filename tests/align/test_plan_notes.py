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
    assert "past the 250 pairs the curve is fitted on (of the probe's 500, the rest held out;" in note, note
    assert "hold none of the held-out texts" in note and "probe's 250" not in note


def test_with_labelled_queries_the_note_counts_the_pairs_left_after_their_documents():
    """Labelled, every relevant probe row is held out: 300 of 500 leave 200 to fit on, and the note said "half the
    probe's 500" beside them."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(3000, 16))
    Y = X @ rng.normal(size=(16, 12)) + 0.3 * rng.normal(size=(3000, 12))
    rel = np.arange(300)
    res = align.plan_migration(X, X[:500], Y[:500], select_rows=False, relevant=rel,
                               queries=Y[rel] + 0.5 * rng.normal(size=(300, 12)),
                               old_queries=X[rel] + 0.5 * rng.normal(size=(300, 16)))
    note = next(n for n in res["notes"] if "extrapolated: K =" in n)
    assert "past the 200 pairs the curve is fitted on (of the probe's 500, the rest held out;" in note, note
