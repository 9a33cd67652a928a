"""The plan's learning curve: a saturating curve of retention against K fitted to the probe's points, and the
forecast it gives per K with an interval (:func:`align.plan.plan_migration` makes the points)."""

from __future__ import annotations

import numpy as np

__all__ = ["curve_fit", "fit_learning_curve", "fit_learning_curves", "forecast", "forecast_per_k", "kept_forecast",
           "query_bootstrap"]

BETAS = np.linspace(0.1, 1.5, 29)


def fit_learning_curve(ks: np.ndarray, vals: np.ndarray) -> tuple[float, float, float, float]:
    """Least-squares saturating curve ``r(K) = r_inf - c K^(-beta)`` (``beta`` on a grid, ``r_inf ≤ 1``).

    Where the free fit puts ``r_inf`` above 1 the constrained optimum has ``r_inf = 1`` and
    ``c = Σ (1 - v) K^-β / Σ K^-2β`` (``c`` refitted, not kept from the free fit).
    Returns ``(r_inf, c, beta, residual std)``.
    """
    r_inf, c, beta, sse = fit_learning_curves(np.asarray(ks, dtype=float), np.asarray(vals, dtype=float)[None, :])
    return float(r_inf[0]), float(c[0]), float(beta[0]), float(np.sqrt(sse[0] / max(1, len(vals) - 3)))


def fit_learning_curves(ks: np.ndarray, V: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`fit_learning_curve` of each row of ``V`` (b, len(ks)) at once: ``(r_inf, c, beta, sse)``, (b,) each
    (the first ``beta`` of the grid with the least squared error, as the loop of one curve chose it). A row with a
    point not finite has no curve: NaN, all four (no ``beta`` bettered the initial error there, and it read as a
    confident curve of 0 with error inf, and so did every other row of ``V``)."""
    bad = ~np.isfinite(V).all(axis=1)
    V = np.where(bad[:, None], 0.0, V)  # fitted apart: one row's NaN made lstsq's solution NaN for every row
    best = np.full(V.shape[0], np.inf)
    out = [np.zeros(V.shape[0]) for _ in range(3)]
    for beta in BETAS:
        kb = ks ** (-beta)
        A = np.stack([np.ones_like(ks, dtype=float), -kb], axis=1)
        coef = np.linalg.lstsq(A, V.T, rcond=None)[0]  # (2, b)
        over = coef[0] > 1.0
        coef[0, over] = 1.0
        coef[1, over] = ((1.0 - V[over]) @ kb) / (kb @ kb)
        sse = ((V - (A @ coef).T) ** 2).sum(axis=1)
        better = sse < best
        best[better] = sse[better]
        out[0][better], out[1][better], out[2][better] = coef[0, better], coef[1, better], beta
    for a in (*out, best):
        a[bad] = np.nan
    return out[0], out[1], out[2], best


def query_bootstrap(ks: list[int], hits: list[list[tuple[np.ndarray, np.ndarray]]], target_ks, rng,
                    n_boot: int = 200) -> np.ndarray:
    """Forecasts of a learning curve refitted to its points scored again on resamples of the held-out queries:
    (n_boot, len(target_ks)) retentions.

    ``hits[i]``: per map fitted at ``ks[i]`` (its repeats), :func:`align.retrieval.nn_retention_hits` of the same
    held-out queries, whose point is the mean over the maps of ``mapped.sum() / max(native.sum(), 1)``. Each
    resample draws the queries with replacement (``rng``; the same draw for every point, which share them) and
    refits the curve: the forecasts spread as far as the points' query sample leaves them, and further the further
    they extrapolate (the interval of the residual scatter alone is as wide at K = 10,000 as inside the probe)."""
    q = hits[0][0][0].size
    W = np.stack([np.bincount(rng.integers(0, q, q), minlength=q) for _ in range(n_boot)]).astype(float)
    V = np.stack([np.mean([(W @ m) / np.maximum(W @ n, 1.0) for m, n in maps], axis=0) for maps in hits], axis=1)
    r_inf, c, beta, _ = fit_learning_curves(np.asarray(ks, dtype=float), V)
    K = np.asarray(target_ks, dtype=float)
    return np.clip(r_inf[:, None] - c[:, None] * K[None, :] ** (-beta[:, None]), 0.0, 1.0)


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


def forecast_per_k(fits: dict, best: str, ks, top: int, dim: int = 0, boot: dict | None = None) -> list[dict]:
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
    beyond ``top`` runs to 1 and only its lower end is read.

    ``boot`` (method -> (n, len(ks)) forecasts of :func:`query_bootstrap`): each interval also holds the central
    95 % of that method's resampled forecasts at K (the union of the two). Without queries the plan's curve points
    are scored on the probe's held-out half, a few hundred queries at most: from 250 probe pairs (125 held out)
    WordNet glove→minilm forecast 0.167 [0.130, 0.205] at K = 1,000, where 1,000 pairs forecast 0.250 and the
    corpus-wide figure was 0.254; the residual scatter of five points said nothing of the query sample."""
    out = []
    for i, K in enumerate(ks):
        m = best if K > top else max(fits, key=lambda name: float(forecast(fits[name], [K])[0][0]))
        r, low, high = forecast(fits[m], [K])
        lo, hi = float(low[0]), float(high[0])
        if boot is not None and m in boot:
            b_lo, b_hi = np.percentile(boot[m][:, i], [2.5, 97.5])
            lo, hi = min(lo, float(b_lo)), max(hi, float(b_hi))
        flat = K > top and (not fits[m]["c"] > 0 or top < dim)
        out.append({"k": int(K), "method": m, "retention": float(r[0]), "low": lo,
                    "high": 1.0 if flat else hi, "extrapolated": bool(K > top)})
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
