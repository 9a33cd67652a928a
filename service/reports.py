"""HTML report of one fit: what people look at instead of logs.

Headline numbers (held-out figures first; training ones are memorised), then sections: summary (name, spaces,
method, parameters, lineage, metrics), an ``auto`` fit's candidates with their held-out scores, stage timings, the
selection criterion across restarts and the per-iteration histories found in
``map_.metadata["diagnostics"]``, a histogram of cosines of mapped pairs (its training pairs when
paired; mutual nearest neighbours after mapping otherwise), a 2-D PCA projection of both
clouds before and after mapping, and for paired fits the migration plan of
:func:`align.plan_migration` computed from a probe of the fit's own pairs (alignability, the
retention proxy's learning curve, its forecast per K, this fit's K marked). Plots are matplotlib (Agg) PNGs embedded as base64, so the
report is one self-contained file.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from align.plan import forecast

from .figures import labelled_selection, train_cos_note
from .storage import atomic_write

__all__ = ["render_report", "write_report", "inner_timings", "pca_2d", "REPORT_CSS"]


def _mpl():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    _mpl().close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def pca_2d(A: np.ndarray, basis_from: np.ndarray | None = None) -> np.ndarray:
    """Project rows of ``A`` (n, d) on the top-2 principal axes of ``basis_from`` (default ``A``) → (n, 2).

    With fewer than two axes (a 1-d space, or one basis row) the missing column is zeros: a strip along the first axis.
    """
    B = np.asarray(A if basis_from is None else basis_from, dtype=np.float64)
    mu = B.mean(axis=0)
    if min(B.shape) > _PCA_FULL_SVD:  # the two top axes by Lanczos (ARPACK, fixed start: the same plot every time):
        # the full SVD of the 3,000 x 3,072 rows of a 3072-d fit took 19 s, twice per report
        from scipy.sparse.linalg import svds

        # a fixed random start: a constant one lies in the null space of (B - mu)(B - mu)ᵀ (its columns sum to 0)
        v0 = np.random.default_rng(0).standard_normal(min(B.shape))
        _, sv, Vt = svds(B - mu, k=2, v0=v0, solver="arpack")
        Vt = Vt[np.argsort(sv)[::-1]]
    else:
        _, _, Vt = np.linalg.svd(B - mu, full_matrices=False)
    return _pad((np.asarray(A, np.float64) - mu) @ Vt[:2].T, 2)


#: Above this many rows and columns the PCA panel takes its two axes by Lanczos, not a full SVD.
_PCA_FULL_SVD = 256


def _pad(A: np.ndarray, d: int) -> np.ndarray:
    return A if A.shape[1] == d else np.hstack([A, np.zeros((A.shape[0], d - A.shape[1]), A.dtype)])


def _timings_plot(timings: dict) -> str:
    return _png(_timings_figure(timings))


def _timings_figure(timings: dict):
    """The stages' seconds (which add up to the run), then one panel per stage with parts (``"fit: icp"`` is a part
    of ``fit``) breaking it down: one chart of both drew ``fit`` beside its own parts, twice the run time."""
    top: dict[str, float] = {}
    parts: dict[str, dict[str, float]] = {}
    for name, v in timings.items():
        parent, _, part = str(name).partition(": ")
        if part and parent in timings:
            parts.setdefault(parent, {})[part] = float(v)
        else:
            top[str(name)] = float(v)
    panels = [("stage timings", top)] + [(f"within {p} ({top[p]:.2f}s)", d) for p, d in parts.items() if p in top]
    plt = _mpl()
    sizes = [len(d) for _, d in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 0.45 * sum(sizes) + 1.0 * len(panels)), squeeze=False,
                             gridspec_kw={"height_ratios": sizes})
    for ax, (title, d), colour in zip(axes[:, 0], panels, ["#4c72b0"] + ["#8fa9d6"] * len(parts)):
        names, vals = list(d), list(d.values())
        ax.barh(names[::-1], vals[::-1], color=colour)
        for i, v in enumerate(vals[::-1]):
            ax.text(v, i, f" {v:.2f}s", va="center", fontsize=8)
        ax.set_title(title, fontsize=10)
    axes[-1, 0].set_xlabel("seconds")
    fig.tight_layout()
    return fig


def _series_from_diagnostics(diag: dict) -> list[tuple[str, list[float]]]:
    """Numeric series worth plotting: lists of numbers, and numeric fields of lists of dicts (the first 8 items of
    a list, and the chosen restart's ``runs[<chosen_restart>]``), the chosen restart's series first."""
    out = []
    mine = f"runs[{diag.get('chosen_restart')}]"

    def walk(prefix, obj, depth):
        if depth > 4:
            return
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{prefix}{k}" if not prefix else f"{prefix}.{k}", v, depth + 1)
        elif isinstance(obj, list) and obj:
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in obj):
                if len(obj) >= 2:
                    out.append((prefix, [float(v) for v in obj]))
            elif all(isinstance(v, dict) for v in obj):
                rows = [v for v in obj if not isinstance(v.get("round"), str)]
                keys = [k for k in rows[0] if k != "round" and all(
                    isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool) for r in rows)] if rows else []
                if len(rows) >= 2:
                    out.extend((f"{prefix}.{k}", [float(r[k]) for r in rows]) for k in keys)
                for i, v in enumerate(obj):
                    if i < 8 or f"{prefix}[{i}]" == mine:
                        walk(f"{prefix}[{i}]", v, depth + 1)

    walk("", diag, 0)
    skip = ("timings", "seconds", "n_iter", "time")
    found = [(n, s) for n, s in out if not any(w in n for w in skip)]
    return sorted(found, key=lambda ns: not ns[0].startswith(mine + "."))  # stable: the chosen restart's first


def _criterion_plots(diag: dict) -> list[tuple[str, str]]:
    plt = _mpl()
    plots = []
    crits = diag.get("criteria")
    if isinstance(crits, list) and crits:
        chosen = diag.get("chosen_restart")
        fig, ax = plt.subplots(figsize=(7, 3))
        colors = ["#dd8452" if i == chosen else "#4c72b0" for i in range(len(crits))]
        ax.bar(range(len(crits)), crits, color=colors)
        ax.set_xticks(range(len(crits)))
        ax.set_xlabel("restart")
        ax.set_ylabel("unsupervised criterion")
        ax.set_title("selection criterion across restarts (orange: chosen)")
        plots.append(("Selection criterion across restarts", _png(fig)))
    series = _series_from_diagnostics({k: v for k, v in diag.items() if k != "criteria"})
    if series:
        plots.append(("Refinement iterations", _png(_iterations_figure(series, diag.get("chosen_restart")))))
    return plots


def _iterations_figure(series: list[tuple[str, list[float]]], chosen, cap: int = 12):
    """Up to ``cap`` series (the chosen restart's come first), one subplot each; the title says when some were cut."""
    plt = _mpl()
    shown = series[:cap]
    rows = (len(shown) + 1) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(10, 2.6 * rows + 0.4), squeeze=False)
    for ax, (name, s) in zip(axes.ravel(), shown):
        ax.plot(range(1, len(s) + 1), s, marker="." if len(s) < 40 else None)
        ax.set_title(f"{name} (chosen)" if name.startswith(f"runs[{chosen}].") else name, fontsize=9)
        ax.set_xlabel("iteration", fontsize=8)
        ax.set_ylabel(name.rsplit(".", 1)[-1], fontsize=8)
    for ax in axes.ravel()[len(shown):]:
        ax.axis("off")
    if len(series) > cap:
        fig.suptitle(f"{cap} of {len(series)} series shown (the chosen restart's first; the rest cut)", fontsize=10)
    fig.tight_layout()
    return fig


def _plan_figure(plan: dict, k_fit: int | None):
    """The plan's measured proxy per method and K (error bars: spread over subsets), the forecast and its interval
    at the table's K (``plan["predicted"]``, the very numbers the table shows: beyond the probe a flat or
    underdetermined curve's interval runs to 1 there) and each method's fitted curve ``r(K) = r_inf - c K^-beta``
    (dotted), on a log K axis; ``k_fit`` marked."""
    plt = _mpl()
    fig, ax = plt.subplots(figsize=(7, 3.4))
    colour = {}  # each method's fitted curve in its points' colour (both curves were dotted black: which was which?)
    for method, pts in plan["curve"].items():
        ks = [q["k"] for q in pts]
        bars = ax.errorbar(ks, [q["mean"] for q in pts], yerr=[q["spread"] for q in pts], marker="o", ms=4,
                           capsize=2, lw=1, label=f"measured on the probe: {method}")
        colour[method] = bars[0].get_color()
    pred = plan["predicted"]
    ks = [q["k"] for q in pred]
    k_max = max(ks + [k_fit or 1])
    k_min = min(min(q["k"] for q in pts) for pts in plan["curve"].values())
    grid = np.geomspace(max(2, k_min), k_max, 60)
    ax.plot(ks, [q["retention"] for q in pred], color="#444", lw=1.2, marker="s", ms=3,
            label=f"forecast (the table's; beyond the probe: {plan['best_method']})")
    ax.fill_between(ks, [q["low"] for q in pred], [q["high"] for q in pred], color="#999", alpha=0.25,
                    label="interval (the table's)")
    for method, other in plan["fits"].items():  # within the probe's K each K takes the higher curve
        ax.plot(grid, forecast(other, grid)[0], color=colour.get(method, "#444"), lw=1, ls=":",
                label=f"fitted curve ({method})")
    if k_fit:
        ax.axvline(k_fit, color="#c44e52", lw=1, ls="--", label=f"this fit: K = {k_fit}")
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("pairs K")
    ax.set_ylabel(f"proxy among {_distractors(plan)}", fontsize=8)
    ax.set_title("retention proxy vs pairs, this fit's rows as the corpus (not vecbridge plan's figure)", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    return fig


def _distractors(plan: dict) -> str:
    """``"4,096 of the fit's rows"``: what the report's proxy is scored among (older plans: no count)."""
    n = plan.get("n_distractors")
    return "the fit's rows" if n is None else f"{n:,} of the fit's rows"


#: why the report's figure is not the plan's: the same statistic over another corpus
NOT_PLAN = ("The proxy (nn_retention@10 of the probe's held-out half) is scored here among {d}, mapped, standing in "
            "for the corpus: <code>vecbridge plan</code> scores it among up to 8,192 rows of your corpus, and it falls "
            "as that corpus grows, so the two figures cannot be compared (for one map the plan's is usually lower). "
            "Neither is the labelled retention <code>vecbridge eval --queries</code> measures.")


def _beyond_fit(plan: dict, q: dict, k_fit: int | None) -> str:
    """What the report's verdict owes a K ``q["k"]`` above the fit's own ``k_fit`` pairs: that it is more pairs
    than this map had (a forecast of refitting with that many, not of this map) and this map's own forecast. The
    plan's table runs to 10,000 pairs whatever the fit's K, so a fit of 600 pairs read "the best, K = 10000"."""
    if not k_fit or q["k"] <= k_fit:
        return ""
    own = next((p for p in plan["predicted"] if p["k"] == k_fit), None)
    this = "" if own is None else (f"; this map, from {k_fit} pairs, is forecast {own['retention']:.3f} "
                                   f"[{own['low']:.3f}, {own['high']:.3f}]")
    beyond = any(p["k"] == q["k"] and p["extrapolated"] for p in plan["predicted"])
    extra = " (extrapolated beyond the probe)" if beyond else ""
    return (f" K = {q['k']} is more pairs than this fit had ({k_fit}): a forecast{extra} for a map fitted again "
            f"with that many, not of this one{this}.")


def _plan_section(plan: dict, k_fit: int | None) -> str:
    rows = "".join(
        f"<tr><td>{q['k']}</td><td>{html.escape(q['method'])}</td>"
        f"<td>{q['retention']:.3f}</td><td>[{q['low']:.3f}, {q['high']:.3f}]</td>"
        f"<td>{'extrapolated' if q['extrapolated'] else ''}{' (this fit)' if q['k'] == k_fit else ''}</td></tr>"
        for q in plan["predicted"])
    rec = plan["recommended"]
    of = rec.get("forecast_method", rec["method"])  # "auto" at K >= 1,000: the forecast is of a closed-form method
    of = (f" The forecast is of {html.escape(str(of))}, not of {html.escape(str(rec['method']))}: see the notes."
          if of != rec["method"] else "")
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in plan["notes"])
    best = rec.get("best_migrating")  # none reaches the target: the plan's verdict, never "K = 10000" of 4,096 pairs
    verdict = (f"recommended: method {html.escape(str(rec['method']))}, K = {rec['k']} (target proxy retention "
               f"{plan['target_retention']:g}; the notes say when no K reaches it).{of}{_beyond_fit(plan, rec, k_fit)}"
               if best is None else
               f"no K is predicted to reach the target proxy retention {plan['target_retention']:g}: the best, K = "
               f"{best['k']} (method {html.escape(str(best['method']))}), is forecast {best['retention']:.3f} "
               f"[{best['low']:.3f}, {best['high']:.3f}].{_beyond_fit(plan, best, k_fit)} Re-embedding the whole "
               f"corpus with the new model is the only choice predicted to reach it (<code>vecbridge plan</code> with "
               f"the corpus sets the choices side by side).")
    return (f"<h2>Migration plan (from a probe of these pairs)</h2>"
            f"<p>{NOT_PLAN.format(d=html.escape(_distractors(plan)))}</p>"
            f"<p>alignability (kNN@10 overlap of the two spaces on {plan['n_probe']} probe pairs): "
            f"<b>{plan['alignability']:.3f}</b> beyond chance (raw {plan['knn_overlap']:.3f}) — "
            f"unsupervised alignment "
            f"{'possible' if plan['unsupervised_feasible'] else 'not expected to work (below ~0.4)'}; "
            f"{verdict}</p>"
            f"<table><tr><th>K</th><th>method</th><th>proxy retention among {html.escape(_distractors(plan))}</th>"
            f"<th>interval</th><th></th></tr>{rows}</table>"
            f"<img alt='retention proxy vs pairs' src='data:image/png;base64,{_png(_plan_figure(plan, k_fit))}'>"
            f"<ul>{notes}</ul>")


def _hist_plot(cosines: dict[str, np.ndarray], paired: bool = False) -> str:
    plt = _mpl()
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for label, c in cosines.items():
        if c is not None and len(c):
            ax.hist(np.asarray(c), bins=50, range=(-0.2, 1.0), alpha=0.6,
                    label=f"{label} (n={len(c)}, mean {np.mean(c):.3f})")
    ax.set_xlabel("cosine in the target frame")
    ax.set_ylabel("count")
    ax.legend(fontsize=8)
    ax.set_title(HIST_TITLE[paired])
    return _png(fig)


#: the histogram's title: a paired fit's are its own training pairs (held-out ones: eval), not held-out figures
HIST_TITLE = {True: "cosines of the training pairs after mapping (the pairs it was fitted on: optimistic)",
              False: "cosines of mapped pairs"}


def _pca_figure(src_before, tgt_before, src_after, tgt_after, paired: bool):
    plt = _mpl()
    d = max(src_before.shape[1], tgt_before.shape[1])
    sb, tb = _pad(src_before, d), _pad(tgt_before, d)
    both = np.vstack([sb, tb])
    P_sb, P_tb = pca_2d(sb, both), pca_2d(tb, both)
    P_sa, P_ta = pca_2d(src_after, tgt_after), pca_2d(tgt_after)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    for ax, (ps, pt), title in ((axes[0], (P_sb, P_tb), "before mapping (own frames, shared PCA)"),
                                (axes[1], (P_sa, P_ta), "after mapping (target frame, target PCA)")):
        if paired:
            m = min(60, ps.shape[0])
            for i in range(m):
                ax.plot([ps[i, 0], pt[i, 0]], [ps[i, 1], pt[i, 1]], color="grey", lw=0.4, alpha=0.5)
        ax.scatter(pt[:, 0], pt[:, 1], s=4, alpha=0.45, label="target", color="#dd8452")
        ax.scatter(ps[:, 0], ps[:, 1], s=4, alpha=0.45, label="source", color="#4c72b0")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("principal axis 1", fontsize=8)
        ax.set_ylabel("principal axis 2", fontsize=8)
        ax.legend(fontsize=8, markerscale=3)
    fig.tight_layout()
    return fig


def _table(d: dict, nested: tuple[str, ...] = ()) -> str:
    """A key/value table; the dicts under the keys in ``nested`` as tables of their own in their cell (the
    summary's ``params``: as one JSON cell it was cut at 400 characters, "re…", hiding most of them)."""
    rows = []
    for k, v in d.items():
        if k in nested and isinstance(v, dict) and v:
            rows.append(f"<tr><th>{html.escape(str(k))}</th><td>{_table(v)}</td></tr>")
            continue
        if isinstance(v, float):
            v = f"{v:.4g}" if math.isfinite(v) else "undefined"  # recall@10 of at most 10 pairs
        elif isinstance(v, (dict, list)):
            if isinstance(v, dict):  # the short facts first (auto's "chosen"), so the cut below drops nested detail
                keys = sorted(v, key=lambda key: (isinstance(v[key], (dict, list)), str(key)))
                v = "{" + ", ".join(f"{json.dumps(str(key), ensure_ascii=False)}: "
                                    f"{json.dumps(v[key], sort_keys=True, default=str, ensure_ascii=False)}"
                                    for key in keys) + "}"
            else:  # names as written (café.npy, not caf\u00e9.npy); the cell is HTML-escaped below
                v = json.dumps(v, sort_keys=True, default=str, ensure_ascii=False)
            if len(v) > 400:
                v = v[:400] + "…"
        rows.append(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>")
    return "<table>" + "".join(rows) + "</table>"


_SELECTION_COLS = ("score", "corpus_mrr", "query_mrr", "overlap@10", "corpus_recall@1", "query_recall@1",
                   "nn_retention@10", "cos_raw", "seconds")  # cos_raw: of the raw output (train_cos is centred)


def _cell(v) -> str:
    return f"{v:.4g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else "–"


def _selection_section(sel: dict) -> str:
    """An ``auto`` fit's candidates as a table (held-out scores, best first, the chosen one marked) and a bar chart
    of their scores: the metrics table's JSON of them was cut at 400 characters, mid-candidate."""
    cand = {m: c for m, c in sel["candidates"].items() if isinstance(c, dict)}
    cols = [c for c in _SELECTION_COLS if any(isinstance(v.get(c), (int, float)) for v in cand.values())]
    order = sorted(cand, key=lambda m: -float(cand[m].get("score") or 0.0))
    rows = "".join(f"<tr><td>{html.escape(m)}</td>" + "".join(f"<td>{_cell(cand[m].get(c))}</td>" for c in cols)
                   + f"<td>{'chosen' if m == sel.get('chosen') else ''}</td></tr>" for m in order)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    facts = ", ".join(f"{k} {sel[k]}" for k in ("n_holdout", "n_train") if k in sel)
    out = (f"<h2>Method selection (held-out pairs)</h2><p>{html.escape(str(sel.get('metric', '')))}"
           f"{'; ' + facts if facts else ''}; chosen: <b>{html.escape(str(sel.get('chosen')))}</b></p>"
           + (f"<p>Note: {html.escape(str(sel['note']))}</p>" if sel.get("note") else "") +
           f"<table><tr><th>method</th>{head}<th></th></tr>{rows}</table>")
    if "score" in cols:
        plt = _mpl()
        fig, ax = plt.subplots(figsize=(7, 0.35 * len(order) + 1.0))
        ax.barh(order[::-1], [float(cand[m].get("score") or 0.0) for m in order[::-1]],
                color=["#dd8452" if m == sel.get("chosen") else "#4c72b0" for m in order[::-1]])
        ax.set_xlabel("held-out score")
        ax.set_title("candidates' held-out score (orange: chosen)", fontsize=10)
        out += f"<img alt='candidates held-out score' src='data:image/png;base64,{_png(fig)}'>"
    return out


def _headline(metrics: dict) -> dict:
    """Up to 8 numbers for the top of the report: held-out figures first, training ones (memorised) last,
    counts left to the metrics table."""
    nums = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v) and not k.startswith(("heldout_n_", "train_n_"))
            and k != "train_cos_raw"}  # NaN: undefined (few pairs); the raw cosine: in train_cos's label
    return dict(sorted(nums.items(), key=lambda kv: (not kv[0].startswith("heldout_"), kv[0].startswith("train_")))[:8])


def _label(key: str, metrics: dict, params=None) -> str:
    """A headline figure's label: train_cos is of the target's centred frame, beside which an auto fit's selection
    shows raw cosines (cos_raw; unlabelled, 0.73 beside 0.94 read as a contradiction); the raw one is named with it,
    as eval does ("cos 0.6908 (centred; raw 0.9403)") and :mod:`service.figures` everywhere (``params``: a
    ``center=false`` fit's is of the raw frame, and says so)."""
    if key == "heldout_top1" and isinstance(metrics.get("heldout_n_candidates"), (int, float)):
        return f"heldout_top1 (among {int(metrics['heldout_n_candidates']):,} candidates)"  # it falls as they grow
    return f"train_cos {train_cos_note(metrics, params)}" if key == "train_cos" else key


# The report's one <style> block, the same in every report: the console, whose policy allows no inline style,
# allows exactly this block by its hash (service.ui.pages.CONSOLE_CSP) in the frame that shows a report.
REPORT_CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;font-size:.85em}th{text-align:left;padding:2px 12px 2px 0;color:#555;vertical-align:top}
td{padding:2px 0;font-family:ui-monospace,monospace;word-break:break-all}img{max-width:100%}
.metric{display:inline-block;margin:0 1.5em .6em 0}.metric b{font-size:1.4em;display:block}"""


def inner_timings(diag: dict) -> dict[str, float]:
    """The fitter's own stage seconds (``diagnostics.timings``), named as its progress names them: ``fit: <stage>``,
    ``fit: restart <r>: <stage>`` when it ran more than one restart (these were ``fit: restart 0 icp`` while the
    progress said ``fit: refine1``)."""
    inner = diag.get("timings") or {}
    out = {f"fit: {k}": float(v) for k, v in inner.items() if isinstance(v, (int, float)) and k != "total"}
    runs = inner.get("restarts") or []
    for r, rt in enumerate(runs):
        if isinstance(rt, dict):
            at = f"restart {r}: " if len(runs) > 1 else ""
            out.update({f"fit: {at}{k}": float(v) for k, v in rt.items() if isinstance(v, (int, float))})
    return out


def render_report(*, title: str, summary: dict, metrics: dict, timings: dict, diagnostics: dict | None,
                  cosines: dict[str, np.ndarray], clouds: tuple | None, paired: bool, plan: dict | None = None,
                  k_fit: int | None = None, plan_note: str | None = None,
                  progress: Callable[[float], None] | None = None) -> str:
    """Build the report HTML.

    Parameters
    ----------
    summary : dict            lineage facts shown as a table
    metrics : dict            numbers shown prominently
    timings : dict            stage name -> seconds
    diagnostics : dict        ``map_.metadata["diagnostics"]`` (criterion across restarts/iterations)
    cosines : dict            label -> cosines (k,) of mapped pairs, for the histogram
    clouds : (src_before (n, d_s), tgt_before (m, d_t), src_after (n, d_t), tgt_after (m, d_t)) or None
    plan : dict               :func:`align.plan_migration`'s answer (paired fits), with ``k_fit`` the fit's pairs
    plan_note : str           why there is no plan section (shown instead), e.g. too few pairs
    progress : callable(fraction), optional   called as each section (a figure, most of them) is done
    """
    steps, done = 7, [0]

    def step() -> None:  # the sections below, in turn (one without content costs nothing)
        done[0] += 1
        if progress is not None:
            progress(done[0] / steps)

    if progress is not None:
        progress(0.0)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{REPORT_CSS}</style></head><body><h1>{html.escape(title)}</h1>"]
    if metrics.get("reliable") is False:  # the fit's own verdict, first: not a row deep in the metrics table
        reason = metrics.get("unreliable_reason") or (
            f"criterion {metrics['criterion']:.4g} is close to that of random maps ({metrics['null_criterion']:.4g})"
            if isinstance(metrics.get("criterion"), float) and isinstance(metrics.get("null_criterion"), float)
            else "criterion close to random maps")
        parts.append(f"<h2>UNRELIABLE fit: {html.escape(str(reason))}</h2><p><b>This version is kept for inspection "
                     f"but never chosen for a path; its map is probably wrong.</b></p>")
    params = summary.get("params")  # a center=false fit's train_cos is of the raw frame
    parts.append("<div>" + "".join(f"<span class='metric'>{html.escape(_label(k, metrics, params))}<b>{v:.4g}</b>"
                                   "</span>"
                                   for k, v in _headline(metrics).items()) + "</div>")
    sel = labelled_selection(metrics.get("selection"))  # a record before cos_raw: its raw `cos` under that name
    candidates = isinstance(sel, dict) and isinstance(sel.get("candidates"), dict)
    table = {**metrics, "selection": {k: v for k, v in sel.items() if k != "candidates"}} if candidates else metrics
    parts.append("<h2>Summary and lineage</h2>" + _table(summary, nested=("params",)))
    parts.append("<h2>Metrics</h2>" + _table(table))
    step()
    if candidates:  # the candidates' held-out scores: a table of their own, not a cut JSON cell
        parts.append(_selection_section(sel))
    step()
    if timings:
        parts.append(f"<h2>Stage timings</h2><img alt='stage timings' src='data:image/png;base64,{_timings_plot(timings)}'>")
    step()
    for heading, png in _criterion_plots(diagnostics or {}):
        parts.append(f"<h2>{html.escape(heading)}</h2><img alt='{html.escape(heading)}' src='data:image/png;base64,{png}'>")
    step()
    if any(c is not None and len(c) for c in cosines.values()):
        parts.append(f"<h2>Cosines of mapped pairs{' (the training pairs)' if paired else ''}</h2><img alt='cosine "
                     f"histogram' src='data:image/png;base64,{_hist_plot(cosines, paired)}'>")
    step()
    if clouds is not None:
        parts.append(f"<h2>2-D projection of both clouds</h2><img alt='PCA projection' "
                     f"src='data:image/png;base64,{_png(_pca_figure(*clouds, paired=paired))}'>")
    step()
    if plan is not None:
        parts.append(_plan_section(plan, k_fit))
    elif plan_note:
        parts.append(f"<h2>Migration plan</h2><p>{html.escape(plan_note)}</p>")
    step()
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(path, text: str) -> Path:
    """Write ``text`` atomically to ``path`` (:func:`service.storage.atomic_write`: temp file, fsync, rename).

    ``registry gc`` removes a map's folder of reports once it emptied it: a folder removed between its creation here
    and the temporary file's is made again (a few times), not a report lost."""
    for attempt in range(5):
        try:
            return atomic_write(path, text)
        except FileNotFoundError:
            if attempt == 4 or Path(path).parent.exists():
                raise
