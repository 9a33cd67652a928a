"""Steering jobs for the registry / HTTP / CLI wiring: thin functions over :mod:`align.steer`.

Nothing here re-implements numerics; it turns request-shaped inputs (texts or vectors, labels,
a params dict, a progress callback) into calls of ``align.fit_steer`` and friends, and checks
params once so the API can map errors to status codes.

``progress(fraction, message)`` follows the jobs convention: fraction in [0, 1].
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from align.exceptions import InputError, PairCountError
from align.steer import MeanShift, Steer, apply_steers, fit_mean_shift, fit_steer, transfer_steer

__all__ = ["STEER_PARAMS", "STEER_METHOD_NAMES", "fit_steer_job", "apply_steer_job", "transfer_steer_job", "lens_job"]

# Accepted fit parameters and their defaults (the API schema can mirror this).
STEER_PARAMS: dict = {"method": "local", "rank": 16, "temperature": 0.05, "weight_decay": 1e-3, "max_iter": 200,
                      "max_pairs": 2048, "n_candidates": 4096, "n_neighbors": None, "init_scale": 1e-2,
                      "n_queries": 4000, "ridge": 0.1, "opposite_weight": 0.0, "random_state": 0}
STEER_METHOD_NAMES = ("local", "lm-steer", "mean-shift")

Progress = Callable[[float, str], None]


def _vectors(X, texts, encoder, progress: Progress | None):
    if (X is None) == (texts is None):
        raise InputError("give exactly one of X (vectors) or texts (+ encoder)")
    if texts is None:
        return X
    if encoder is None:
        raise InputError("texts need an encoder (callable: list[str] -> (n, d) array)")
    if progress is not None:
        progress(0.0, f"encoding {len(texts)} texts")
    return np.asarray(encoder(list(texts)), dtype=np.float32)


def fit_steer_job(X=None, labels=None, params: Mapping | None = None, progress: Progress | None = None, *,
                  texts: Sequence[str] | None = None, encoder: Callable | None = None,
                  space: str | None = None) -> Steer | MeanShift:
    """Fit a steer (``params["method"]``: ``"local"`` default, ``"lm-steer"`` or ``"mean-shift"``).

    Parameters
    ----------
    X : array-like (n, d), optional — or ``texts`` with ``encoder``
    labels : (n,) in {-1, 0, +1}
    params : dict, keys of :data:`STEER_PARAMS` (unknown keys raise InputError)
    progress : callable ``(fraction, message)``, optional
    space : name of the embedding space, recorded in the metadata
    """
    p = dict(STEER_PARAMS)
    unknown = set(params or {}) - set(p)
    if unknown:
        raise InputError(f"unknown steer parameters: {sorted(unknown)}")
    p.update(params or {})
    if labels is None:
        raise InputError("labels are required")
    X = _vectors(X, texts, encoder, progress)
    method = p.pop("method")
    if method == "mean-shift":
        out = fit_mean_shift(X, labels)
    elif method in ("local", "lm-steer"):
        max_iter = 1 if method == "local" else int(p["max_iter"])

        def cb(it, loss):
            if progress is not None:
                progress(min(1.0, it / max_iter), f"iteration {it}/{max_iter}, loss {loss:.4f}")

        out = fit_steer(X, labels, method=method, callback=cb, **p)
    else:
        raise InputError(f"unknown steer method {method!r}; use one of {list(STEER_METHOD_NAMES)}")
    if space is not None:
        out.metadata["space"] = space
    if texts is not None:
        out.metadata["n_texts"] = len(texts)
    if progress is not None:
        progress(1.0, "done")
    return out


def apply_steer_job(Q, steers: Sequence[tuple[Steer | MeanShift, float]]) -> np.ndarray:
    """Steer queries ``Q`` (n, d) with several ``(steer, eps)`` pairs (linear steers composed exactly;
    mean-shift baselines added afterwards)."""
    linear = [(s, e) for s, e in steers if isinstance(s, Steer)]
    shifts = [(s, e) for s, e in steers if isinstance(s, MeanShift)]
    if len(linear) + len(shifts) != len(steers):
        raise InputError("steers must be (Steer or MeanShift, eps) pairs")
    out = apply_steers(Q, linear) if linear else np.array(Q, dtype=np.float32)
    for s, e in shifts:
        out = s.apply(out, e)
    return out


def transfer_steer_job(steer: Steer, linear_map, *, target_space: str | None = None) -> Steer:
    """Carry ``steer`` through a registered map (``H^T W H``); records lineage in the metadata."""
    out = transfer_steer(steer, linear_map)
    if target_space is not None:
        out.metadata["space"] = target_space
    return out


def lens_job(steer: Steer, X, texts: Sequence[str] | None = None, *, k: int = 5,
             n_directions: int | None = 4) -> list[dict]:
    """Lens of a steer over corpus rows ``X`` (n, d) with optional texts."""
    if texts is not None and len(texts) != np.shape(X)[0]:
        raise PairCountError("texts and X must have the same number of rows")
    nd = None if n_directions is None else min(int(n_directions), steer.rank)
    return steer.lens(X, texts, k=k, n_directions=nd)
