"""Synthetic clustered data with a planted orthogonal map (shared by the alignment tests).

A Gaussian mixture with distinct cluster sizes, centres and anisotropic spreads in ``d``
dimensions; the target side draws *different* samples from the same mixture and maps them by
``Q`` (d, d_t) with orthonormal rows, plus small noise.
"""

from __future__ import annotations

import numpy as np


def mixture(d: int = 16, k: int = 12, seed: int = 0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, d)) * 2.5
    shapes = [rng.normal(size=(d, d)) * (0.15 + 0.05 * i) / np.sqrt(d) for i in range(k)]
    weights = np.arange(1, k + 1, dtype=float)
    weights /= weights.sum()
    return centres, shapes, weights


def draw(mix, n: int, seed: int) -> np.ndarray:
    centres, shapes, weights = mix
    rng = np.random.default_rng(seed)
    lab = rng.choice(len(weights), size=n, p=weights)
    Z = rng.normal(size=(n, centres.shape[1]))
    out = centres[lab].copy()
    for c in range(len(weights)):
        m = lab == c
        out[m] += Z[m] @ shapes[c]
    return out.astype(np.float32)


def planted(d: int = 16, d_t: int | None = None, n: int = 1500, noise: float = 0.01, seed: int = 0):
    """Return ``X (n, d), Y (n, d_t), Q (d, d_t), Xh, Yh`` with Y = X' Q + noise (X' other samples)."""
    d_t = d if d_t is None else d_t
    mix = mixture(d, seed=seed)
    rng = np.random.default_rng(seed + 100)
    Q = np.linalg.qr(rng.normal(size=(d_t, d_t)))[0][:d, :]  # (d, d_t), orthonormal rows
    X = draw(mix, n, seed + 1)
    Y = draw(mix, n, seed + 2) @ Q + noise * rng.normal(size=(n, d_t))
    Xh = draw(mix, 400, seed + 3)
    Yh = Xh @ Q
    return X, Y.astype(np.float32), Q, Xh, Yh.astype(np.float32)


def planted_attribute(n: int, d: int, *, n_queries: int, offset: float = 3.0, seed: int = 0):
    """Steer data: unit rows (n, d) with a common offset on coordinate 1 (like sentence embeddings),
    labels +1 / -1 where coordinate 0 is above 1 / below -1 (0 between), and unit queries (n_queries, d)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    labels = np.zeros(n, dtype=int)
    labels[X[:, 0] > 1.0] = 1
    labels[X[:, 0] < -1.0] = -1
    X[:, 1] += offset
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    Q = rng.normal(size=(n_queries, d))
    Q[:, 1] += offset
    Q /= np.linalg.norm(Q, axis=1, keepdims=True)
    return X.astype(np.float32), labels, Q.astype(np.float32)


def nonlinear_corpus(rng, n: int, d: int, clusters: int):
    """A clustered old corpus ``X (n, d)`` (``clusters`` centres) and a non-linear new model of it, ``Y`` (tanh then a
    rotation, noise): what a linear map cannot carry over whole (the labelled-retention tests). Draws from ``rng``."""
    C = rng.normal(size=(clusters, d)) * 2
    X = (C[rng.integers(0, clusters, n)] + rng.normal(size=(n, d))).astype(np.float32)
    R = np.linalg.qr(rng.normal(size=(d, d)))[0]
    Y = (np.tanh(X / 2) @ R + 0.3 * rng.normal(size=(n, d))).astype(np.float32)
    return X, Y


def queries_near(rng, X, Y, docs):
    """A query near each of the documents ``docs`` (rows of the corpus) in each model: ``(new_queries, old_queries)``,
    drawn from ``rng``."""
    shape = (len(docs), X.shape[1])
    Qn = (Y[docs] + 0.8 * rng.normal(size=shape)).astype(np.float32)
    Qo = (X[docs] + 0.8 * rng.normal(size=shape)).astype(np.float32)
    return Qn, Qo


def heldout_labelled_task(seed: int = 0, n: int = 5000, d: int = 32, q: int = 150, held: int = 500):
    """Old corpus X, a non-linear new model Y (:func:`nonlinear_corpus`, 50 clusters), queries near their documents
    in each model; the last ``held`` rows are the held-out documents, every query's relevant one among them (``rel``:
    its index there). ``(X, Y, new_queries, old_queries, rel)``."""
    rng = np.random.default_rng(seed)
    X, Y = nonlinear_corpus(rng, n, d, 50)
    rel = rng.choice(held, q, replace=False)
    Qn, Qo = queries_near(rng, X, Y, n - held + rel)
    return X, Y, Qn, Qo, rel
