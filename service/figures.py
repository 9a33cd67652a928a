"""How a fit's recorded figures are labelled wherever they are shown (the fit's own line, its report, ``registry
show``; the console's JavaScript says the same in ``VB.trainCosLabel``).

``train_cos`` is the mean cosine of the fit's own training pairs in the target's frame (as eval's ``cos``): centred
unless the fit was made with ``center=false``;
``train_cos_raw``, recorded beside it since it was added, that of the raw output with the native target rows (as
eval's ``cos_raw``). A version recorded before ``train_cos_raw`` has ``train_cos`` alone. An ``auto`` fit's
candidates' cosines (``metrics["selection"]["candidates"]``) are of the raw output: named ``cos_raw`` now, ``cos``
in records written before (:func:`labelled_selection` shows those under the new name).
"""

from __future__ import annotations

import math

__all__ = ["train_cos_note", "train_cos_text", "labelled_selection", "centred", "TRAINING_PAIRS", "RAW_FRAME"]

#: what the ``train_*`` figures are measured on, where a figure is shown outside the fit's own headline
TRAINING_PAIRS = "on the pairs the map was fitted on (optimistic; held out: heldout_top1, eval)"


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


#: a fit with ``center=false`` (procrustes, ridge, lowrank; sharded ones too): its frames centre nothing, so
#: ``train_cos`` is of the raw output (``train_cos_raw`` the same figure) and "centred" would be false
RAW_FRAME = "(raw frame: fitted with center=false)"


def centred(params) -> bool:
    """Whether a version's frames centre the rows: all but a fit with ``center`` false in its ``params`` (a record
    without the parameter is centred, its default; the migration methods always centre)."""
    return not (isinstance(params, dict) and params.get("center") is False)


def train_cos_note(metrics: dict, params: dict | None = None) -> str:
    """``(centred; raw 0.9403)``; ``(centred)`` for a version recorded without the raw figure; :data:`RAW_FRAME`
    where ``params`` say ``center`` false. Four decimals wherever it is shown (the fit's line, report, registry
    show; the console's ``VB.trainCosLabel`` says the same)."""
    if not centred(params):
        return RAW_FRAME
    raw = metrics.get("train_cos_raw")
    return f"(centred; raw {raw:.4f})" if _finite(raw) else "(centred)"


def train_cos_text(metrics: dict, params: dict | None = None) -> str | None:
    """``0.7347 (centred; raw 0.9403)``: ``train_cos`` as the fit's headline shows it; None without one (unpaired
    fits; NaN)."""
    cos = metrics.get("train_cos")
    return f"{cos:.4f} {train_cos_note(metrics, params)}" if _finite(cos) else None


def labelled_selection(sel):
    """An auto fit's selection record with each candidate's raw-output cosine under ``cos_raw``: a record written
    before the name (``cos``, the same raw figure) is shown as a new one; anything else as it is."""
    if not isinstance(sel, dict) or not isinstance(sel.get("candidates"), dict):
        return sel
    cands = {name: ({("cos_raw" if k == "cos" and "cos_raw" not in c else k): v for k, v in c.items()}
                    if isinstance(c, dict) else c) for name, c in sel["candidates"].items()}
    return {**sel, "candidates": cands}
