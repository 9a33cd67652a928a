"""The plan's learning curve: a saturating curve of retention against K fitted to the probe's points, and the
forecast it gives per K with an interval (:func:`align.plan.plan_migration` makes the points)."""

from __future__ import annotations

import numpy as np

__all__ = ["fit_learning_curve", "forecast", "forecast_per_k", "kept_forecast", "curve_fit"]


def fit_learning_curve(ks: np.ndarray, vals: np.ndarray) -> tuple[float, float, float, float]:
    """Least-squares saturating curve ``r(K) = r_inf - c K^(-beta)`` (``beta`` on a grid, ``r_inf ≤ 1``).

    Where the free fit puts ``r_inf`` above 1 the constrained optimum has ``r_inf = 1`` and
    ``c = Σ (1 - v) K^-β / Σ K^-2β`` (``c`` refitted, not kept from the free fit).
    Returns ``(r_inf, c, beta, residual std)``.
    """
    best = None
    for beta in np.linspace(0.1, 1.5, 29):
        A = np.stack([np.ones_like(ks, dtype=float), -ks ** (-beta)], axis=1)
        coef, *_ = np.linalg.lstsq(A, vals, rcond=None)
        if coef[0] > 1.0:
            kb = ks ** (-beta)
            coef = np.array([1.0, float(((1.0 - vals) * kb).sum() / (kb * kb).sum())])
        res = vals - A @ coef
        sse = float((res**2).sum())
        if best is None or sse < best[0]:
            best = (sse, float(coef[0]), float(coef[1]), float(beta))
    sse, r_inf, c, beta = best
    return r_inf, c, beta, float(np.sqrt(sse / max(1, len(vals) - 3)))


def curve_fit(points: list[dict], labelled: bool) -> dict:
    """One method's forecast (the dict :func:`forecast` reads) from its learning-curve ``points``: the curve of
    :func:`fit_learning_curve` and a spread, the mean over the subsets' spreads plus, with labelled queries, a
    quarter of the query interval at the largest K (the forecast interval is ± 2 x their sum)."""
    kk = np.array([q["k"] for q in points], dtype=float)
    r_inf, c, beta, sd = fit_learning_curve(kk, np.array([q["mean"] for q in points]))
    spread = float(np.mean([q["spread"] for q in points]))
    if labelled:
        lo, hi = points[-1]["query_interval"]
        spread += float(hi - lo) / 4.0 if np.isfinite(hi - lo) else 0.0
    return {"r_inf": r_inf, "c": c, "beta": beta, "residual_std": sd, "spread": spread}


def forecast(fit: dict, ks) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The plan's forecast at pair counts ``ks``: ``(retention, low, high)`` arrays, all clipped to [0, 1].

    ``fit`` is a plan's ``"fit"``: ``retention = r_inf - c K^-beta`` and the interval
    ``retention ± 2 (residual_std + spread)``.
    """
    k = np.asarray(ks, dtype=float)
    r = np.clip(fit["r_inf"] - fit["c"] * k ** (-fit["beta"]), 0.0, 1.0)
    half = 2.0 * (fit["residual_std"] + fit["spread"])
    return r, np.clip(r - half, 0.0, 1.0), np.clip(r + half, 0.0, 1.0)


def forecast_per_k(fits: dict, best: str, ks, top: int, dim: int = 0) -> list[dict]:
    """Per K of ``ks``: ``{"k", "method", "retention", "low", "high", "extrapolated"}`` from the forecast
    (:func:`forecast`) of one method of ``fits`` (method -> its curve's dict). Up to ``top`` (the probe's largest
    K) the method whose curve is higher at K: on the labelled benchmarks ridge's regularisation won at
    K = 100 where Procrustes won at the probe's largest K, by 0.13-0.29 of retention. Beyond ``top``, ``best``
    (the best measured at ``top``): comparing two extrapolations would pick the noisier curve. A curve that did
    not rise over the probe (``c <= 0``: flat, e.g. every point 0 when the probe's K are far below the dimension,
    or falling) says nothing of larger K: beyond ``top`` its interval runs to 1 (it was ``[0, 0]``). Nor does a
    probe whose largest K is below ``dim`` (the old space's dimension): a map from fewer pairs than dimensions is
    underdetermined and its curve changes shape past K ≈ dim (WordNet minilm→e5, 384-d: a 200-pair probe forecast
    0.38 [0.29, 0.47] at K = 3,000 where a 1,000-pair probe forecast 0.62 [0.38, 0.86]); there too the interval
    beyond ``top`` runs to 1 and only its lower end is read."""
    out = []
    for K in ks:
        m = best if K > top else max(fits, key=lambda name: float(forecast(fits[name], [K])[0][0]))
        r, low, high = forecast(fits[m], [K])
        flat = K > top and (not fits[m]["c"] > 0 or top < dim)
        out.append({"k": int(K), "method": m, "retention": float(r[0]), "low": float(low[0]),
                    "high": 1.0 if flat else float(high[0]), "extrapolated": bool(K > top)})
    return out


def kept_forecast(q: dict, n: int) -> dict:
    """Forecast ``q`` (a :func:`forecast_per_k` row) for a migration that keeps its ``K`` re-embedded rows' own
    new-model vectors in the corpus of ``n`` rows (:func:`align.keep_native_rows`): ``{"share", "retention", "low",
    "high"}``.

    The curve is of maps whose fit pairs hold none of the queries' documents. A migration re-embeds K rows of its
    own corpus: a share ``s = min(K, n) / n`` of the queries (their documents spread as the rows are) have their
    document among them, which, kept native, they find as the new model does (retention 1; measured 0.95-1.10 on
    WordNet minilm→e5), while the others get ``r``: ``s + (1 - s) r``, for the retention and both interval ends.
    """
    s = min(float(q["k"]), float(n)) / float(n)
    return {"share": s, **{key: float(s + (1.0 - s) * q[key]) for key in ("retention", "low", "high")}}
