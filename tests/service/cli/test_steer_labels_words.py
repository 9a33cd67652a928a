"""What a -1 label does, said per steer method where labels are asked for (QA, session 55): the default local steer
scored -1 rows as 0 rows (``opposite_weight`` 0), in no help text nor the README, while ``--labels`` said only
"-1 / 0 / +1", POST /v1/steers "-1 opposite" and ``--eps`` "negative reverses". Each claim of the words is checked
here against the fit."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from align.steer import fit_mean_shift, fit_steer
from service.cli import cli

README = Path(__file__).resolve().parents[3] / "README.md"


def _words(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("#", " "))


def test_the_words_say_what_minus_one_does_for_each_method_as_the_fits_do_it():
    steer_fit = _words(CliRunner().invoke(cli, ["steer", "fit", "--help"], terminal_width=200).output)
    readme = _words(README.read_text())
    for words in (steer_fit, readme):
        assert "scores -1 rows as" in words and "0 rows" in words, words
        assert "uses them only for the mean-shift line its prior shrinks toward" in words
        assert "opposite_weight=B > 0 also pushes them down" in words and "prior_weight=0 leaves them unused" in words
        assert "lm-steer trains them as the opposite" in words
        assert "mean-shift steers along mean(+1" in words
    apply = _words(CliRunner().invoke(cli, ["steer", "apply", "--help"], terminal_width=200).output)
    assert "negative reverses: away from the +1 attribute" in apply, apply
    lm = _words(CliRunner().invoke(cli, ["lm", "steer-fit", "--help"], terminal_width=200).output)
    assert "-1 its opposite" in lm and "0 not used" in lm, lm
    # and what they say is what the fits do
    rng = np.random.default_rng(0)
    X = (rng.normal(size=(600, 16)) + 2.0).astype(np.float32)  # a common component, as sentence embeddings have
    score = X[:, 0] - X[:, 1]
    order = np.argsort(-score)
    a, b = np.zeros(600, int), np.zeros(600, int)
    a[order[:60]] = b[order[:60]] = 1
    a[order[-60:]] = -1  # the opposite end ...
    b[rng.choice(order[60:], 60, replace=False)] = -1  # ... or any other rows
    local = {"method": "local", "random_state": 0}
    # local, prior_weight=0: -1 rows unused (any rows may carry the label: the same steer)
    np.testing.assert_array_equal(fit_steer(X, a, prior_weight=0.0, **local).W,
                                  fit_steer(X, b, prior_weight=0.0, **local).W)
    # the default prior: they shape its mean-shift line only; opposite_weight > 0 uses them as targets
    plain = fit_steer(X, a, prior_weight=1.0, **local).W
    assert not np.array_equal(plain, fit_steer(X, b, prior_weight=1.0, **local).W)
    assert not np.allclose(plain, fit_steer(X, a, prior_weight=1.0, opposite_weight=1.0, **local).W)
    # lm-steer: trained as the opposite (which rows carry -1 changes the steer)
    lm = {"method": "lm-steer", "rank": 2, "max_iter": 20, "random_state": 0}
    assert not np.allclose(fit_steer(X, a, **lm).W, fit_steer(X, b, **lm).W)
    # mean-shift: the line mean(+1) - mean(-1)
    np.testing.assert_allclose(fit_mean_shift(X, a).v, X[a == 1].mean(0) - X[a == -1].mean(0), rtol=1e-5, atol=1e-6)
