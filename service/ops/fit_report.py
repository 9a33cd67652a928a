"""A fit's HTML report (:func:`service.ops.maps.run_fit`'s ``report`` stage): its migration plan, its rendering
with progress, the path the registry records, and writing it once the version is registered.

The report stage is often the longest part of a supervised fit (the plan's probe fits, the figures): its
``progress`` reports ``migration plan: <stage>`` (the plan's learning curve) and ``render`` (one step a section),
each with its fraction, so a job's stage and ETA and the CLI's bar move through it.
"""

from __future__ import annotations

import uuid
import warnings
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

import align
from align.exceptions import Cancelled, InputError, VecbridgeWarning

from ..logging import get_logger
from ..progress import Progress
from ..registry import VersionInfo
from ..registry.names import fs_safe
from ..reports import render_report, write_report

__all__ = ["PLAN_DISTRACTORS", "fit_report", "report_plan", "write_fit_report"]

PLAN_PROBE, PLAN_DISTRACTORS, PLAN_MAX_DIM = 500, 4096, 1024
log = get_logger("maps")  # the name run_fit's report lines always had


def fit_report(registry, name: str, X: np.ndarray, Y: np.ndarray, *, summary: dict, metrics: dict, timings: dict,
               diag: dict, cosines: dict, clouds, paired: bool, rng, report_dir=None, notes: list[str] | None = None,
               progress: Progress | None = None) -> tuple[str | None, Path | None, str | None]:
    """``(html, file, path the registry records)`` of a fit's report, or three Nones when rendering it failed (logged
    and added to ``notes``: a report is a by-product, the map is registered without one). A cancel raised by
    ``progress`` stops the fit as in every other stage."""
    tick = progress or (lambda stage, fraction: None)
    try:
        plan, plan_note = (report_plan(X, Y, rng, lambda s, f: tick(f"migration plan: {s}", f)) if paired
                           else (None, None))
        html_text = render_report(title=f"vecbridge fit: {name}", summary=summary, metrics=metrics, timings=timings,
                                  diagnostics=diag, cosines=cosines, clouds=clouds, paired=paired, plan=plan,
                                  k_fit=X.shape[0], plan_note=plan_note, progress=lambda f: tick("render", f))
        return (html_text, *_report_paths(registry, name, report_dir))
    except Cancelled:
        raise
    except Exception as exc:  # noqa: BLE001 - a report is a by-product: a failed render must not lose the map
        why = f"{type(exc).__name__}: {exc}"
        log.warning("map %r is registered without a fit report: rendering it failed (%s)", name, why)
        if notes is not None:
            notes.append(f"no fit report: rendering it failed ({why}); the map is registered without one")
        return None, None, None


def report_plan(X: np.ndarray, Y: np.ndarray, rng, progress: Progress | None = None) -> tuple[dict | None, str | None]:
    """The fit report's migration plan: :func:`align.plan_migration` with a probe of up to 500 of the fit's pairs
    and up to 4,096 of its source rows as the old corpus (~2-4 s on 384-d rows), forecast up to the fit's K;
    ``progress(stage, fraction)`` follows its learning curve.

    Returns ``(plan, None)``, or ``(None, why)`` when the pairs are too few or degenerate for a probe, or the
    rows wider than 1,024 (the plan's ~20 closed-form fits cost O(d^3) each: ~30 s at 1,536-d here, more
    than most fits themselves; ``vecbridge plan`` computes it on demand).
    """
    from align.plan import DEFAULT_TARGET_KS, MIN_PROBE

    n, d = X.shape[0], max(X.shape[1], Y.shape[1])
    if n < 2 * MIN_PROBE:
        return None, f"not computed: {n} pairs; the plan needs a probe of at least {MIN_PROBE} pairs beside them"
    if d > PLAN_MAX_DIM:
        return None, (f"not computed: {d}-d rows (the plan's closed-form fits would cost more than this fit above "
                      f"{PLAN_MAX_DIM}-d); run vecbridge plan with a probe to see it")
    probe = np.sort(rng.permutation(n)[: min(PLAN_PROBE, n)])
    old = np.sort(rng.permutation(n)[: min(PLAN_DISTRACTORS, n)])
    try:
        plan = align.plan_migration(X[old], X[probe], Y[probe], random_state=rng,
                                    target_ks=sorted({*DEFAULT_TARGET_KS, n}), distractors=PLAN_DISTRACTORS,
                                    select_rows=False, old_is_sample=True, progress=progress)
    except InputError as exc:
        return None, f"not computed: {exc}"
    return plan, None


def _report_paths(registry, name: str, report_dir) -> tuple[Path, str]:
    """Where this fit's HTML report goes, and the path the registry records (relative to its report dir)."""
    rdir = Path(report_dir) if report_dir is not None else registry.report_dir
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    path = (rdir / fs_safe(name) / f"{stamp}-{uuid.uuid4().hex[:8]}.html").resolve()
    try:
        return path, str(path.relative_to(registry.report_dir))
    except ValueError:
        return path, str(path)


def write_fit_report(version: VersionInfo, path: Path, copy, html_text: str) -> str | None:
    """Write a registered version's report (atomic, fsynced) and the optional extra copy.

    The version already records ``path``: a crash or a full disk here leaves a version whose report
    route answers 404 ("missing from the data dir"), never a report without a version. Returns None, or the note
    saying the report could not be written (an HTTP fit's job notes carry it: its job "succeeded" with no word of
    it). A copy that cannot be written is a VecbridgeWarning naming it (the version stays registered).
    """
    missing = None
    try:
        write_report(path, html_text)
    except OSError as exc:
        log.warning("map %s is registered but its fit report could not be written to %s: %s", version.ref, path, exc,
                    extra={"fields": {"map": version.ref, "path": str(path), "error": str(exc)}})
        missing = (f"map {version.ref} is registered but its fit report could not be written "
                   f"({exc.strerror or exc}: {path}): its report route answers 404")
    if copy is not None:  # a full disk here failed the command (exit 2) with the version registered: a retry refitted
        try:
            write_report(copy, html_text)
        except OSError as exc:
            warnings.warn(f"the report copy {copy} could not be written ({exc.strerror or exc}); map {version.ref} "
                          f"is registered all the same", VecbridgeWarning, stacklevel=2)
    return missing
