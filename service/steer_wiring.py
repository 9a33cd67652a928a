"""Fit-and-register for steers: the one path the HTTP job and the CLI share.

Thin over :func:`service.steering.fit_steer_job` (numerics) and
:meth:`service.registry.Registry.register_steer` (storage): hashes the inputs for lineage,
computes the lens over the fitting items when they can be named (texts, or ``items`` labels
given with vectors), and records every effective parameter.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Sequence

import numpy as np

from align.exceptions import InputError, PairCountError
from align.steer import Steer

from .steering import STEER_METHOD_NAMES, STEER_PARAMS, fit_steer_job, lens_job

__all__ = ["fit_and_register", "check_steer_params", "steer_lens"]


def check_steer_params(params: dict | None, random_state: int | None = None) -> dict:
    """Effective parameters (defaults filled, ``random_state`` folded in); unknown keys raise InputError."""
    params = dict(params or {})
    unknown = set(params) - set(STEER_PARAMS)
    if unknown:
        raise InputError(f"unknown steer parameters: {sorted(unknown)}; known: {sorted(STEER_PARAMS)}")
    if params.get("method", "local") not in STEER_METHOD_NAMES:
        raise InputError(f"unknown steer method {params['method']!r}; use one of {list(STEER_METHOD_NAMES)}")
    if random_state is not None:
        params["random_state"] = int(random_state)
    return {**STEER_PARAMS, **params}


def _sha(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


def steer_lens(steer, X: np.ndarray, items: Sequence[str] | None, *, k: int = 5, n_directions: int = 4) -> list:
    """Lens over the fitting rows when they have names; ``[]`` for a mean shift or unnamed rows."""
    if not isinstance(steer, Steer) or items is None:
        return []
    return lens_job(steer, X, list(items), k=k, n_directions=n_directions)


def fit_and_register(registry, *, name: str, space: str, X: np.ndarray, labels, params: dict | None = None,
                     random_state: int | None = None, alias: str | None = None, items: Sequence[str] | None = None,
                     description: str = "", inputs: dict | None = None, lens_k: int = 5,
                     progress: Callable[[str, float], None] | None = None):
    """Fit a steer on ``X`` (n, d) with ``labels`` (n,) in {-1, 0, +1} and register it in ``space``.

    ``items`` (n strings: the texts, or any names of the rows) make the stored lens name the
    extreme items of each direction. Returns the :class:`~service.registry.SteerInfo`.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.shape[0] != X.shape[0]:
        raise PairCountError(f"labels has shape {labels.shape}, but there are {X.shape[0]} rows")
    if items is not None and len(items) != X.shape[0]:
        raise PairCountError(f"{len(items)} items for {X.shape[0]} rows")
    p = check_steer_params(params, random_state)

    def cb(frac, _msg):
        if progress is not None:
            progress("fit", frac)

    steer = fit_steer_job(X, labels, p, cb, space=space)
    if progress is not None:
        progress("register", 1.0)
    metrics = {k: v for k, v in steer.metadata.items()
               if k in ("loss_initial", "loss_final", "n_iter", "converged", "n_pos", "n_neg", "n_neutral", "n_pairs")}
    return registry.register_steer(
        name, steer, space=space, params=p, random_state=p["random_state"],
        data_hashes={"X": _sha(X.astype(np.float32)), "labels": _sha(labels.astype(np.int64)), "n": int(X.shape[0])},
        metrics=metrics, alias=alias, description=description, inputs=inputs or {},
        lens=steer_lens(steer, X, items, k=lens_k))
