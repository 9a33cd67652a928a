"""align.corpus_retention: labelled retention over the whole corpus a migration maps, the figure the labelled plan
forecasts; the held-out documents alone (align.labelled_retention) leave out every other row that competes."""

from __future__ import annotations

import numpy as np
import pytest

import align
from _synthetic import heldout_labelled_task
from align.exceptions import DimensionMismatchError, EmptyInputError, PairCountError


def _task(seed=0, n=5000, held=500):
    """:func:`heldout_labelled_task` (the last ``held`` rows held out) and ``held``."""
    return (*heldout_labelled_task(seed, n, held=held), held)


def _unit(A):
    return A / np.linalg.norm(A, axis=1, keepdims=True)


def _hits(Q, D, rel):
    return (np.argsort(-(_unit(Q) @ _unit(D).T), axis=1)[:, :10] == rel[:, None]).any(axis=1)


def test_corpus_retention_counts_the_mapped_corpus_the_held_out_figure_leaves_out():
    X, Y, Qn, Qo, rel, held = _task()
    n = X.shape[0]
    m = align.fit_migration(X[:300], Y[:300], method="procrustes")
    out = align.corpus_retention(m, X[-held:], Y[-held:], Qn, rel, Qo, X[:-held])
    alone = align.labelled_retention(m, X[-held:], Y[-held:], Qn, rel)["retention"]["R@10"]
    # the migrated R@10 is exact: the queries over the mapped held-out documents and the mapped rest of the corpus
    mapped = m.apply(X, output="raw")
    assert out["migrated_r10"] == pytest.approx(_hits(Qn, mapped, n - held + rel).mean())
    assert out["n_documents"] == n and out["n_heldout"] == held and out["n_duplicates"] == 0
    # the native R@10 over the corpus is estimated: the held-out one scaled as the old model's falls
    assert out["old_r10_corpus"] == pytest.approx(_hits(Qo, X, n - held + rel).mean())
    assert out["native_r10_heldout"] == pytest.approx(_hits(Qn, Y[-held:], rel).mean())
    assert out["retention"] == pytest.approx(out["migrated_r10"] / out["native_r10"])
    lo, hi = out["retention_interval"]
    assert lo <= out["retention"] <= hi
    # 4,500 more rows competing: well below the held-out figure, which a gate read as the migration's
    assert out["retention"] < alone - 0.1
    # and near the truth, the native R@10 over the whole corpus being known here (every row has both vectors)
    truth = out["migrated_r10"] / _hits(Qn, Y, n - held + rel).mean()
    assert out["retention"] == pytest.approx(truth, abs=0.1)


def test_corpus_rows_repeating_a_held_out_document_are_that_document_not_a_distractor():
    X, Y, Qn, Qo, rel, held = _task(seed=1, n=3000)
    m = align.fit_migration(X[:300], Y[:300], method="ridge")
    rest = align.corpus_retention(m, X[-held:], Y[-held:], Qn, rel, Qo, X[:-held])
    whole = align.corpus_retention(m, X[-held:], Y[-held:], Qn, rel, Qo, X)  # the held-out rows inside the corpus
    assert whole["n_duplicates"] == held and whole["n_corpus_rows"] == X.shape[0]
    assert whole["n_documents"] == rest["n_documents"] == X.shape[0]
    assert whole["retention"] == pytest.approx(rest["retention"])


def test_one_model_on_both_sides_keeps_everything_over_the_corpus():
    """The same model on both sides and a map that changes nothing: the migrated index is the native one, and the
    native estimate (the old model's fall, the new one falling alike) is exact."""
    X, _, _, Qo, rel, held = _task(seed=2, n=3000)
    m = align.fit_migration(X, X, method="procrustes")
    out = align.corpus_retention(m, X[-held:], X[-held:], Qo, rel, Qo, X[:-held])
    assert out["slope_ratio"] == pytest.approx(1.0)
    assert out["native_r10"] == pytest.approx(out["old_r10_corpus"])
    assert out["retention"] == pytest.approx(1.0, abs=0.02)


def test_corpus_retention_bad_input_is_typed():
    X, Y, Qn, Qo, rel, held = _task(seed=3, n=2000)
    m = align.fit_migration(X[:300], Y[:300], method="procrustes")
    with pytest.raises(DimensionMismatchError):
        align.corpus_retention(m, X[-held:], Y[-held:], Qn, rel, Qo, X[:-held, :8])
    with pytest.raises(PairCountError):
        align.corpus_retention(m, X[-held:], Y[-held:], Qn, rel, Qo[:10], X[:-held])


def test_corpus_rows_are_mapped_as_transform_maps_them():
    """A map fitted with normalize=False maps a row's length too: the corpus rows were mapped unit-normalised and
    the held-out documents as given, and the figure (0.91) was not the migrated index's (0.47)."""
    X, Y, Qn, Qo, rel, held = _task()
    n = X.shape[0]
    X = (X * np.random.default_rng(5).uniform(0.2, 5.0, size=(n, 1))).astype(np.float32)
    m = align.fit_procrustes(X[:300], Y[:300], normalize=False)
    out = align.corpus_retention(m, X[-held:], Y[-held:], Qn, rel, Qo, X[:-held])
    mapped = m.apply(X, output="raw")  # every row as transform maps it
    assert out["migrated_r10"] == pytest.approx(_hits(Qn, mapped, n - held + rel).mean())
    assert out["n_duplicates"] == 0


def test_a_corpus_of_the_held_out_documents_alone_is_refused():
    """Every corpus row repeats a held-out document: no corpus is left, and the figure ("over the whole corpus",
    0 rows of it mapped) was the held-out one."""
    X, Y, Qn, Qo, rel, held = _task(seed=3, n=2000)
    m = align.fit_migration(X[:300], Y[:300], method="procrustes")
    with pytest.raises(EmptyInputError, match="no row of X_corpus is left to map: all 500 repeat"):
        align.corpus_retention(m, X[-held:], Y[-held:], Qn, rel, Qo, X[-held:])
    with pytest.raises(EmptyInputError, match="no row of the corpus rows is left to map"):
        align.corpus_retention(m, X[-held:], Y[-held:], Qn, rel, Qo, X[-held:], corpus_name="the corpus rows")
    out = align.corpus_retention(m, X[-held:], Y[-held:], Qn, rel, Qo, X[-held - 1:])  # one row besides: measured
    assert out["n_documents"] == held + 1 and out["n_duplicates"] == held
