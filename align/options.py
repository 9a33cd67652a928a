"""Checks of the keyword options that reach the numerics (typed errors, not ``int(nan)`` or ``float('x')``).

One place for the rule every option follows: a real number (never ``bool``), finite, inside its legal range,
whole where it counts something. :func:`check_number` is that rule; :func:`check_migration_options` applies
it to every option of :func:`align.fit_migration` before any work starts.
"""

from __future__ import annotations

import numpy as np

from .exceptions import InputError

__all__ = ["check_flag", "check_migration_options", "check_number"]


def check_number(name: str, value, lo: float, hi: float, *, whole: bool = False, lo_open: bool = False,
                 hi_open: bool = False):
    """``value`` as ``int`` (``whole``: an int type, since counts reach ``range()``) or ``float`` when it is a
    finite real number in ``[lo, hi]``
    (open at ``lo`` / ``hi`` with ``lo_open`` / ``hi_open``), else :class:`InputError` naming ``name`` and the range."""
    integer = isinstance(value, (int, np.integer))  # always finite; np.isfinite refuses Python ints past int64
    ok = (not isinstance(value, (bool, np.bool_)) and (integer or isinstance(value, (float, np.floating)))
          and (integer or bool(np.isfinite(value))) and (not whole or integer)
          and (lo < value if lo_open else lo <= value) and (value < hi if hi_open else value <= hi))
    if not ok:
        raise InputError(f"{name} must be {'an integer' if whole else 'a number'} in {'(' if lo_open else '['}"
                         f"{_bound(lo)}, {_bound(hi)}{')' if hi_open else ']'}, got {value!r}")
    return int(value) if whole else float(value)


def _bound(x) -> str:
    """A bound as the message shows it: an int in full (``1 << 20`` read "1.04858e+06"), a float as ``:g``."""
    return str(x) if isinstance(x, (int, np.integer)) else f"{x:g}"


def check_batch_size(batch_size) -> int:
    """``batch_size`` when it is an int >= 1, else :class:`InputError`: ``range(0, n, -1)`` is empty, so a
    negative one returned the rows unmapped (a steer's queries unsteered), and 0 or 1.5 were raw numpy errors."""
    if type(batch_size) is int and batch_size >= 1:  # the hot path: one type check
        return batch_size
    return check_number("batch_size", batch_size, 1, float("inf"), whole=True)


def check_callable(name: str, value, *, optional: bool = True):
    """``value`` when it is callable (or None with ``optional``), else :class:`InputError`: a progress callback
    given as a string failed deep in the fit with a raw TypeError."""
    if (value is None and optional) or callable(value):
        return value
    raise InputError(f"{name} must be a callable{' or None' if optional else ''}, got {type(value).__name__}")


def check_flag(name: str, value) -> bool:
    """``value`` when it is a bool (numpy's too), else :class:`InputError`: ``scale="false"`` is truthy."""
    if not isinstance(value, (bool, np.bool_)):
        raise InputError(f"{name} must be true or false, got {value!r}")
    return bool(value)


#: the most ridge penalties ``alphas`` may list (the default grid has 4)
MAX_ALPHAS = 1000
#: option: (lo, hi, whole, lo_open). Ridge α is per pair (× K); the cluster margin is a score difference.
_SCALARS = {"alpha": (0.0, 1e6, False, False), "rank": (1, 1 << 20, True, False),
            "shrink": (0.0, 1e9, False, True), "blend": (1, 1 << 20, True, False),
            "cluster_temperature": (1e-6, 1e3, False, False), "cluster_margin": (-1.0, 1.0, False, False),
            "max_cluster_mib": (0.0, 1 << 30, False, True)}
#: the Sinkhorn refinement's own options (:func:`align.semisup.sinkhorn_polish`), same form.
_SINKHORN = {"rounds": (1, 100, True, False), "eps": (0.0, 10.0, False, True), "k": (1, 1000, True, False),
             "whiten": (0.0, 2.0, False, False), "seed_share": (0.0, 1.0, False, False),
             "iters": (1, 10_000, True, False), "tol": (0.0, 1e3, False, False)}


def check_migration_options(options: dict) -> dict:
    """``options`` with ``candidates`` as a tuple of distinct names in the order given (a string is one name or a
    comma-separated list, as a CLI ``--param candidates=ridge,cluster`` sends it); every other option is checked,
    not changed. The contrastive ones and ``n_clusters`` / ``holdout`` / ``max_holdout`` keep their own checks next to
    their use."""
    out = dict(options)
    for key, (lo, hi, whole, lo_open) in _SCALARS.items():
        if key in out:
            check_number(key, out[key], lo, hi, whole=whole, lo_open=lo_open)
    if "alphas" in out:
        a = out["alphas"]
        if not isinstance(a, (list, tuple, np.ndarray)) or len(a) == 0:
            raise InputError(f"alphas must be a non-empty list of numbers >= 0, got {a!r}")
        if len(a) > MAX_ALPHAS:  # each is a ridge fit scored on the held-out pairs: 100,000 ran for hours
            raise InputError(f"alphas: at most {MAX_ALPHAS} values (each is a ridge fit scored on the held-out "
                             f"pairs), got {len(a)}")
        for x in a:
            check_number("each of alphas", x, 0.0, 1e6)
    if "candidates" in out:
        c = out["candidates"]
        if isinstance(c, str):
            c = [s.strip() for s in c.split(",") if s.strip()]
        if not isinstance(c, (list, tuple)) or not all(isinstance(s, str) for s in c):
            raise InputError(f"candidates must be a list of method names, got {c!r}")
        out["candidates"] = tuple(dict.fromkeys(c))  # a name repeated is the family once (order kept): ["cluster",
        # "cluster"] passed as more than cluster alone, and its refusals keyed on ("cluster",) let it through
    for key in ("contrastive", "sinkhorn"):
        if out.get(key) is not None and not isinstance(out[key], dict):
            raise InputError(f"{key} must be a dict of options, got {out[key]!r}")
    if out.get("semi_supervised") not in (None, False, "sinkhorn"):
        raise InputError(f"semi_supervised must be None or 'sinkhorn', got {out['semi_supervised']!r}")
    unknown = set(out.get("sinkhorn") or {}) - set(_SINKHORN)
    if unknown:
        raise InputError(f"unknown sinkhorn option(s) {sorted(unknown)}; known: {sorted(_SINKHORN)}")
    for key, value in (out.get("sinkhorn") or {}).items():
        lo, hi, whole, lo_open = _SINKHORN[key]
        check_number(f"sinkhorn option {key}", value, lo, hi, whole=whole, lo_open=lo_open)
    return out
