"""Carrying a steer through a map into another space (:func:`transfer_steer`, re-exported by :mod:`align.steer`).

``W_B = Hᵀ W_A H`` (the LM-Steer paper's form) with the map's centring frames folded in as two scalars, so that
``eps`` moves results about as far in the new space as in the old (the function's docstring has the math and the
figures; ``benchmarks/bench_steer_transfer.py`` measures it).
"""

from __future__ import annotations

import numpy as np

from . import linalg
from .exceptions import DimensionMismatchError, InputError

__all__ = ["transfer_steer"]


def _frame_mean(frame) -> np.ndarray | None:
    """The mean of unit rows of a unit-in, centring frame (float64), else None."""
    mean = getattr(frame, "mean", None)
    if frame is None or mean is None or not getattr(frame, "unit_in", False):
        return None
    return np.asarray(mean, dtype=np.float64)


def _spread(mu: np.ndarray | None) -> float:
    """Typical ``|x - mu|`` of a raw unit row: ``E[x·mu] = |mu|^2`` over the frame's rows, so
    ``E|x - mu|^2 = 1 - |mu|^2``; 1 without centring."""
    return 1.0 if mu is None else float(np.sqrt(max(1.0 - float(mu @ mu), 1e-12)))


def _rms_gate(mu: np.ndarray, P1: np.ndarray) -> float:
    """RMS of the query side ``q P1`` (r,) over a space's typical rows ``q = mu + rho f``, ``f`` a unit
    direction taken as isotropic (``E[f fᵀ] = I / d``): ``sqrt(|mu P1|^2 + rho^2 |P1|_F^2 / d)``."""
    return float(np.sqrt(float(np.sum((mu @ P1) ** 2)) + _spread(mu) ** 2 * float(np.sum(P1 * P1)) / mu.size))


def transfer_steer(steer, linear_map, *, rcond: float = 1e-6):
    """Carry a steer from space A to space B through a map ``x_B ≈ x_A M`` (``M = map.W``, (d_A, d_B)).

    Without centring frames (or with a bare matrix):

    .. math::  W_B = H^\\top W_A H, \\qquad H = (M^{+})^\\top \\in \\mathbb R^{d_A \\times d_B}

    so ``P1_B = M^+ P1``, ``P2_B = M^+ P2`` and the rank is kept. When ``x_B = x_A M`` holds exactly
    and ``M`` has full row rank (``d_A <= d_B``), ``q_B^T W_B c_B = q_A^T W_A c_A`` for every pair.
    For an orthogonal square ``M``, ``M^+ = M^T`` and ``q_B (I + eps W_B) = (q_B M^T)(I + eps W_A) M``:
    map back, steer, map. For ``d_A > d_B`` it is the least-squares version.

    **Centring frames** (a map fitted by vecbridge: unit rows, means ``mu_A``, ``mu_B`` of unit rows) make
    the bare formula move results by a different amount per ``eps`` in B than in A, often by a large
    factor; two scalars restore the meaning of ``eps`` (the trade-off curve over ``eps`` is the bare one):

    * item side, ``P2_B = M^+ P2 / lam``: the frames relate the rows' centred parts,
      ``x_B - mu_B ≈ (x_A - mu_A) M / lam`` with ``lam = rho_A / rho_B`` and ``rho = sqrt(1 - |mu|^2)`` the
      typical ``|x - mu|`` of a space; within one query's results the candidates' score differences shrink
      by ``lam^2`` (two centred factors, ``q`` and ``c``) and the boost's by ``lam`` (one, ``P2·c``);
    * query side, ``P1_B = gamma M^+ P1`` with ``gamma = g_A(P1) / g_B(M^+ P1)``, ``g`` the RMS of the
      query factor ``q P1`` over a space's typical rows ``q = mu + rho f`` (``f`` taken as isotropic):
      ``g(P) = sqrt(|mu P|^2 + rho^2 |P|_F^2 / d)``. ``M`` is fitted on the centred parts, so where it sends
      the mean direction, and with it the mean part of the gate, is arbitrary; for the default rank-1 steer the
      mean part dominates (``q·u ≈ 1``), for an ``lm-steer`` rank-16 steer the centred part does.

    Measured on WordNet (plant vs animal, 500 queries; ``benchmarks/results/steer_transfer_2026-12-06.md``),
    overlap@10 with the unsteered results at ``eps`` = 0.25 / 0.5 / 1, default rank-1 steer: MiniLM -> e5
    0.88 / 0.77 / 0.46 against 0.92 / 0.82 / 0.50 for the steer in MiniLM (bare 0.79 / 0.53 / 0.08;
    ``lam = 2.2``, ``gamma = 1.21``); e5 -> MiniLM 0.91 / 0.82 / 0.55 against 0.90 / 0.77 / 0.43 in e5 (bare
    1.00 / 0.99 / 0.98: ``gamma = 11.7``); an ``lm-steer`` rank-16 steer MiniLM -> e5 0.44 / 0.15 / 0.02
    against 0.53 / 0.23 / 0.05 (bare 0.17 / 0.03 / 0.01). Over four attributes and both directions the default
    steer's transfer is off by 0.13 on average at ``eps = 1`` (at most 0.20: somewhat strong into e5, weak into
    MiniLM), the bare formula by 0.44.
    The exact first-order query side, ``lam q_B M^+ P1 + (mu_A - lam mu_B M^+) P1`` with the constant carried
    by ``g = mu_B / |mu_B|^2``, reproduces A's per-query gates but changed the curve: overlap-axis area vs
    mean-shift up to +0.017 higher, nDCG-axis area up to 0.031 lower on four attributes (nDCG: the run of
    2026-12-01); not used.
    Without centring on both sides, ``lam = gamma = 1`` (exact maps keep equal scores).

    **A fitted map** (both frames) is carried by its polar factor ``U V^T`` (``M = U S V^T``) in place of ``M``:
    ``H = ((U V^T)^+)^T = U V^T``. A ridge or low-rank fit shrinks ``M`` in the directions its pairs say little
    about; ``M^+`` blew those up, so a steer carried by a ridge map from 4,000 WordNet pairs (MiniLM -> e5,
    plant vs person) replaced every result at eps = 0.25 (overlap@10 with the unsteered results 0.002, against
    0.74 in MiniLM, before the ``eps`` calibration of 2026-12-06). By its polar factor, with the current
    calibration: 0.89 / 0.76 / 0.42 at eps = 0.25 / 0.5 / 1 against 0.92 / 0.82 / 0.50 in MiniLM; a Procrustes
    map, its own polar factor, 0.89 / 0.78 / 0.47 (last paragraph of the results file above). A bare matrix
    keeps ``M^+`` (the exact-map identity above).

    Notes
    -----
    Uses the map's linear part and frame means; the bias, the affine part of the query side and the rows'
    own spread around ``rho`` are not folded in, so with a centring map the transfer is approximate
    (recorded in the metadata, with ``spread_ratio = lam``, ``gate_scale = gamma`` and
    ``eps_scale = gamma / lam``, the factor on ``W``).
    """
    from .chain import require_linear
    from .options import check_number
    from .steer import Steer
    from .validation import as_real_array

    if not isinstance(steer, Steer):  # a MeanShift (or anything else) was an AttributeError on P1
        raise InputError(f"only W = P1 P2^T steers transfer through a map, got {type(steer).__name__}")
    rcond = check_number("rcond", rcond, 0.0, 1.0)
    if isinstance(linear_map, np.ndarray) or not hasattr(linear_map, "W"):  # a bare matrix, as documented
        M = as_real_array(linear_map, name="map matrix", ndim=2).astype(np.float64)
    else:
        M = np.asarray(require_linear(linear_map, "carrying a steer through a map (W_B = H^T W_A H)").W,
                       dtype=np.float64)
    if M.shape[0] != steer.dim:
        raise DimensionMismatchError(
            f"map expects {M.shape[0]}-d source rows, the steer lives in {steer.dim}-d")
    frames = [getattr(linear_map, "source_frame", None), getattr(linear_map, "target_frame", None)]
    mu_a, mu_b = (_frame_mean(f) for f in frames)
    fitted = mu_a is not None and mu_b is not None
    if fitted:  # the map's polar factor U V^T: its rotation, without a regularised fit's shrinkage (see Notes)
        U, _, Vt = linalg.svd(M, full_matrices=False)
        Mp = (U @ Vt).T
    else:
        Mp = linalg.pinv(M, rcond=rcond)  # (d_B, d_A)
    P1 = Mp @ steer.P1.astype(np.float64)
    P2 = Mp @ steer.P2.astype(np.float64)
    lam, gamma = 1.0, 1.0
    if fitted:
        lam = _spread(mu_a) / _spread(mu_b)  # rho_A / rho_B
        g_a = _rms_gate(mu_a, steer.P1.astype(np.float64))
        g_b = _rms_gate(mu_b, P1)
        if g_a > 0 and g_b > 1e-6 * g_a:
            gamma = g_a / g_b
    P1 = P1 * gamma
    P2 = P2 / lam
    centred = any(f is not None and getattr(f, "mean", None) is not None for f in frames)
    has_bias = getattr(linear_map, "bias", None) is not None
    meta = {"method": "transfer", "form": "P1_B = gamma H P1, P2_B = H P2 / lam; H = "
                                          + ("(U V^T)^T, M = U S V^T" if fitted else "M+"),
            "source_dim": int(M.shape[0]), "target_dim": int(M.shape[1]), "approximate": bool(centred or has_bias),
            "eps_scale": gamma / lam, "gate_scale": gamma, "spread_ratio": lam, "of": steer.metadata,
            "map": getattr(linear_map, "metadata", {})}
    return Steer(P1, P2, meta)
