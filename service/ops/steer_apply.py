"""Steered queries, for every face and for the searches and generations that take steers: each ``eps`` checked,
the eps of refs to one steer version summed and bounded, linear steers composed exactly (``Q (I + sum_i eps_i W_i)``)
and mean-shift baselines added after. Split from :mod:`service.ops.steers` (fit, register, files, lens, transfer),
which re-exports every name here."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from align.exceptions import InputError
from align.options import check_number
from align.steer import MeanShift, Steer, apply_steers

from ..limits import MAX_STEER_EPS

__all__ = ["check_steer_eps", "check_summed_eps", "apply_steer_job", "steer_queries"]


def check_steer_eps(eps, what: str = "eps") -> float:
    """``eps`` as a float in [-:data:`~service.limits.MAX_STEER_EPS`, :data:`~service.limits.MAX_STEER_EPS`], else
    InputError naming ``what``: 1e30 was applied, answering vectors of 1e29 (no longer the query, only the steer's
    direction) whose squares overflow float32."""
    return check_number(what, eps, -MAX_STEER_EPS, MAX_STEER_EPS)


def check_summed_eps(named: Sequence[tuple[str, float, object]], bound: float = MAX_STEER_EPS) -> None:
    """``named``: ``(ref, eps, SteerInfo)`` of each steer a request composes. Refs that resolve to one version
    (``tone``, ``tone@prod``, ``tone:1``, ``tone:01``) compose as that steer at the sum of their eps (the steers add
    up, ``sum_i eps_i W_i``): the sum is bounded by ``bound`` as one eps is, else InputError naming the refs. Each
    eps alone was checked, so ``{"tone": 1000, "tone@prod": 1000}`` steered at 2000. Summed rather than refused:
    a search's batches pin their refs to ``name:version`` and sum the eps of refs to one version, so a refusal
    would turn away, in the first batch, what later batches send as one steer."""
    by_version: dict[tuple[str, int], list[tuple[str, float]]] = {}
    for ref, eps, info in named:
        by_version.setdefault((info.name, info.version), []).append((ref, float(eps)))
    for (name, version), refs in by_version.items():
        total = sum(e for _, e in refs)
        if len(refs) > 1 and not abs(total) <= bound:
            raise InputError(f"steers {', '.join(repr(r) for r, _ in refs)} are all {name}:{version}, composed at "
                             f"the sum of their eps ({total!r}): it must be in [-{bound:g}, {bound:g}], as one eps")


def apply_steer_job(Q, steers: Sequence[tuple[Steer | MeanShift, float]]) -> np.ndarray:
    """Steer queries ``Q`` (n, d) with several ``(steer, eps)`` pairs (linear steers composed exactly;
    mean-shift baselines added afterwards); each eps within :func:`check_steer_eps`."""
    steers = [(s, check_steer_eps(e)) for s, e in steers]
    linear = [(s, e) for s, e in steers if isinstance(s, Steer)]
    shifts = [(s, e) for s, e in steers if isinstance(s, MeanShift)]
    if len(linear) + len(shifts) != len(steers):
        raise InputError("steers must be (Steer or MeanShift, eps) pairs")
    out = apply_steers(Q, linear) if linear else np.array(Q, dtype=np.float32)
    for s, e in shifts:
        out = s.apply(out, e)
    return out


def steer_queries(Q, steers: dict[str, float], space: str, *, load_steer) -> tuple:
    """Queries ``Q`` (n, d) of ``space`` steered by ``{ref: eps}``: ``Q (I + sum_i eps_i W_i)`` (composed by summation).

    ``load_steer(ref) -> (SteerInfo, Steer | MeanShift)`` (a face's cache). Returns the steered
    queries and the versions used (``[{"name", "version", "eps"}]``); a steer of another space, or refs to one
    version whose eps sum past the bound (:func:`check_summed_eps`), is an InputError. No steers: ``Q`` unchanged.
    """
    if not steers:
        return Q, []
    for ref, eps in steers.items():  # before any steer is loaded
        check_steer_eps(eps, f"the eps of steer {ref!r}")
    pairs, used, named = [], [], []
    for ref, eps in steers.items():
        info, steer = load_steer(ref)
        if info.space != space:
            raise InputError(f"steer {info.ref} lives in space {info.space!r}, but the index's space is {space!r}")
        pairs.append((steer, float(eps)))
        used.append({"name": info.name, "version": info.version, "eps": float(eps)})
        named.append((ref, float(eps), info))
    check_summed_eps(named)
    return apply_steer_job(Q, pairs), used
