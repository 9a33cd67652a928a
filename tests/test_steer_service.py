"""service.steering: the thin job functions the registry / API / CLI call."""

from __future__ import annotations

import numpy as np
import pytest

from align import LinearMap
from align.exceptions import InputError
from align.steer import MeanShift, Steer
from service.steering import apply_steer_job, fit_steer_job, lens_job, transfer_steer_job


def data(n=300, d=8, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = np.where(X[:, 0] > 1, 1, np.where(X[:, 0] < -1, -1, 0))
    X[:, 1] += 3
    return (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32), y


def test_fit_job_vectors_with_progress():
    X, y = data()
    seen = []
    s = fit_steer_job(X, y, {"method": "lm-steer", "rank": 2, "max_iter": 10}, lambda f, m: seen.append(f),
                      space="toy")
    assert isinstance(s, Steer) and s.rank == 2 and s.metadata["space"] == "toy"
    assert seen[-1] == 1.0 and all(0.0 <= f <= 1.0 for f in seen) and seen == sorted(seen)
    seen.clear()
    s = fit_steer_job(X, y, {}, lambda f, m: seen.append(f), space="toy")     # default: local discriminant
    assert s.rank == 1 and s.metadata["method"] == "local-discriminant" and seen[-1] == 1.0


def test_fit_job_texts_with_encoder_and_mean_shift():
    X, y = data()
    texts = [f"t{i}" for i in range(len(X))]
    lookup = dict(zip(texts, X))
    s = fit_steer_job(None, y, {"method": "mean-shift"}, texts=texts, encoder=lambda ts: np.stack([lookup[t] for t in ts]))
    assert isinstance(s, MeanShift) and s.metadata["n_texts"] == len(texts)


def test_fit_job_errors():
    X, y = data()
    with pytest.raises(InputError):
        fit_steer_job(X, y, {"rnak": 2})
    with pytest.raises(InputError):
        fit_steer_job(X, y, {"method": "magic"})
    with pytest.raises(InputError):
        fit_steer_job(None, y, texts=["a"])  # no encoder
    with pytest.raises(InputError):
        fit_steer_job(X, None)


def test_apply_transfer_lens_jobs():
    X, y = data()
    s = fit_steer_job(X, y, {"method": "lm-steer", "rank": 2, "max_iter": 10})
    ms = fit_steer_job(X, y, {"method": "mean-shift"})
    Q = X[:5]
    np.testing.assert_allclose(apply_steer_job(Q, [(s, 1.0), (ms, 0.5)]), ms.apply(s.apply(Q, 1.0), 0.5), atol=1e-6)
    assert np.array_equal(apply_steer_job(Q, [(s, 0.0)]), Q)
    R = np.linalg.qr(np.random.default_rng(0).normal(size=(8, 8)))[0]
    t = transfer_steer_job(s, LinearMap(R), target_space="other")
    assert t.metadata["space"] == "other" and t.metadata["method"] == "transfer"
    lens = lens_job(s, X, [str(i) for i in range(len(X))], k=3)
    assert len(lens) == 2 and len(lens[0]["positive"]) == 3
