"""One fit job, shared by the CLI and the HTTP fit jobs: fit → diagnostics → report → register.

``run_fit`` fits with :mod:`align`, measures the map (paired: top-1 / mean rank / cosine on the
training pairs; unpaired: mutual nearest neighbours after mapping, the label-free signal), writes
the HTML report (:mod:`service.reports`) and registers the version with its lineage: sha256 of
the float32 bytes of every input, method and parameters, ``random_state``, package version.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np

import align
from align.validation import as_matrix
from align.exceptions import Cancelled, InputError
from align.frames import unit_rows

from .io import sha256_array
from .ops.migration import MIGRATION_METHODS, fit_migration_map
from .registry import Registry, VersionInfo
from .registry.names import check_alias, check_name, fs_safe
from .reports import render_report, write_report

__all__ = ["run_fit", "fit_map", "METHODS", "SUPERVISED"]

METHODS = ("minivec2vec", "procrustes", "ridge", "lowrank", "auto", "contrastive")
SUPERVISED = ("procrustes", "ridge", "lowrank", "auto", "contrastive")
_DIAG_SAMPLE = 4096
_PLOT_SAMPLE = 1500


def fit_map(X: np.ndarray, Y: np.ndarray, *, method: str, params: dict, paired: bool, seed_pairs=None,
            random_state=0, progress: Callable[[str, float], None] | None = None,
            ray_address: str | None = None, ray_shard_rows: int = 262144) -> align.LinearMap:
    """Fit a :class:`align.LinearMap` with ``method``; typed InputError for bad combinations.

    ``ray_address`` (``"local"`` or a cluster address) runs a supervised fit as a Ray map-reduce of
    sufficient statistics over row shards of ``ray_shard_rows`` (equal to the in-process fit), and
    an unsupervised / seeded minivec2vec fit with its row-block kernels as Ray tasks (the same map).
    """
    params = dict(params or {})
    if isinstance(ray_shard_rows, bool) or not isinstance(ray_shard_rows, int) or ray_shard_rows < 1:
        raise InputError(f"shard rows must be a positive integer, got {ray_shard_rows!r}")
    if method not in METHODS:
        raise InputError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    if method in SUPERVISED:
        if not paired:
            raise InputError(f"method {method!r} needs paired rows (--pairs); use minivec2vec for unpaired data")
        if seed_pairs is not None:
            raise InputError("seed pairs apply to minivec2vec only")
        if method in MIGRATION_METHODS:  # align.fit_migration: families chosen on held-out pairs
            if ray_address is not None:
                raise InputError(f"--ray runs procrustes, ridge and lowrank fits; {method} runs in-process")
            return fit_migration_map(X, Y, method=method, params=params, random_state=random_state)
        fn = {"procrustes": align.fit_procrustes, "ridge": align.fit_ridge, "lowrank": align.fit_lowrank}[method]
        if method == "lowrank" and "rank" not in params:
            raise InputError("lowrank needs a rank parameter (--param rank=N)")
        try:
            if ray_address is not None:
                from .distributed import fit_stats_ray

                shards = [(X[a : a + ray_shard_rows], Y[a : a + ray_shard_rows])
                          for a in range(0, X.shape[0], ray_shard_rows)]
                return fit_stats_ray(shards, method=method, address=None if ray_address == "local" else ray_address,
                                     **params)
            return fn(X, Y, **params)
        except TypeError as exc:
            raise InputError(f"bad parameter for {method}: {exc}") from None
    if "refine" in params and isinstance(params["refine"], list):
        params["refine"] = tuple(params["refine"])
    preset = params.pop("preset", "fast")
    cls = align.MiniVec2Vec
    if preset not in ("fast", "published", "none"):
        raise InputError(f"preset must be 'fast' (vecbridge's configuration), 'published' (the paper's defaults) "
                         f"or 'none' (constructor defaults), got {preset!r}")
    try:
        make = {"fast": cls.fast, "published": cls.published}.get(preset, cls)
        est = make(random_state=random_state, **params)
    except TypeError as exc:
        raise InputError(f"bad parameter for minivec2vec: {exc}") from None
    if ray_address is None:
        map_ = est.fit(X, Y, progress=progress, seed_pairs=seed_pairs).map_
    else:  # the kNN / CSLS rounds as Ray tasks over row blocks: the same map, bit for bit
        from .distributed import ray_executor, ray_session

        with ray_session(None if ray_address == "local" else ray_address) as ray:
            map_ = est.fit(X, Y, progress=progress, seed_pairs=seed_pairs, executor=ray_executor(ray)).map_
        map_.metadata.setdefault("diagnostics", {})["executor"] = "ray"
    map_.metadata.setdefault("params", {})["preset"] = preset  # lineage: which configuration the defaults came from
    return map_


def _subsample(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    return np.arange(n) if n <= k else np.sort(rng.choice(n, size=k, replace=False))


def _diagnose(map_: align.LinearMap, X, Y, paired: bool, rng) -> tuple[dict, dict, tuple]:
    """Metrics, cosine samples for the histogram, and PCA clouds."""
    metrics: dict = {}
    cosines: dict = {}
    if paired:
        idx = _subsample(X.shape[0], _DIAG_SAMPLE, rng)
        ev = align.evaluate(map_, X[idx], Y[idx], csls=False)
        metrics.update({f"train_{k}": v for k, v in ev.items() if k != "n_candidates"})
        metrics["train_n_candidates"] = ev["n_candidates"]
        Q = unit_rows(map_.apply(X[idx], output="linear", validate=False))
        D = unit_rows(map_.target_frame.apply(Y[idx], validate=False))
        cosines["true pairs"] = np.einsum("ij,ij->i", Q, D)
        pi, pj = idx, idx
    else:
        i_s = _subsample(X.shape[0], _DIAG_SAMPLE, rng)
        i_t = _subsample(Y.shape[0], _DIAG_SAMPLE, rng)
        Q = unit_rows(map_.apply(X[i_s], output="linear", validate=False))
        D = unit_rows(map_.target_frame.apply(Y[i_t], validate=False))
        iq, idd, score = align.mutual_nn(Q, D)
        S, _ = align.knn(Q, D, 1)
        metrics.update({"mnn_pairs": int(iq.size), "mnn_frac": float(iq.size / Q.shape[0]),
                        "mnn_mean_cos": float(score.mean()) if iq.size else 0.0,
                        "nn_mean_cos": float(S[:, 0].mean()), "diag_sample": int(Q.shape[0])})
        cosines["mutual nearest neighbours"] = score
        cosines["nearest neighbour of every mapped row"] = S[:, 0]
        pi, pj = i_s, i_t
    k_s = pi[_subsample(len(pi), _PLOT_SAMPLE, rng)]
    k_t = pj[_subsample(len(pj), _PLOT_SAMPLE, rng)] if not paired else k_s
    clouds = (map_.source_frame.apply(X[k_s], validate=False), map_.target_frame.apply(Y[k_t], validate=False),
              map_.apply(X[k_s], output="frame"), map_.target_frame.apply(Y[k_t], validate=False))
    return metrics, cosines, clouds


def _write_report(registry, name, report_dir, report_copy, summary, metrics, stage_times, diag, cosines, clouds,
                  paired) -> str:
    """Render and write the HTML report of one fit; its path relative to the registry's report dir."""
    html_text = render_report(title=f"vecbridge fit: {name}", summary=summary, metrics=metrics,
                              timings=stage_times, diagnostics=diag, cosines=cosines, clouds=clouds, paired=paired)
    rdir = Path(report_dir) if report_dir is not None else registry.report_dir
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    report_file = write_report(rdir / fs_safe(name) / f"{stamp}-{uuid.uuid4().hex[:8]}.html", html_text)
    if report_copy is not None:
        write_report(report_copy, html_text)
    try:
        return str(report_file.resolve().relative_to(registry.report_dir))
    except ValueError:
        return str(report_file.resolve())


def run_fit(registry: Registry, *, name: str, source, target, method: str, params: dict | None = None,
            source_space: str, target_space: str, paired: bool, seed_pairs=None, random_state: int | None = 0,
            alias: str | None = None, progress: Callable[[str, float], None] | None = None, report_dir=None,
            should_cancel: Callable[[], bool] | None = None, description: str = "", tags: dict | None = None,
            inputs: dict | None = None, artifact_format: str | None = None,
            report_copy=None, ray_address: str | None = None, report: bool = True,
            ray_shard_rows: int = 262144) -> VersionInfo:
    """Fit, diagnose, report and register one map version.

    Parameters
    ----------
    registry : Registry
    name : str                   map name (``minilm->e5``)
    source : array (n, d_s); target : array (m, d_t)   raw embeddings (paired: n == m, row i ↔ row i)
    method : {"minivec2vec", "procrustes", "ridge", "lowrank"}
    params : dict                keyword arguments of the align fitter / estimator
    paired : bool                rows are paired (supervised methods need it)
    seed_pairs : (i_src, i_tgt) or None      known pairs for seeded minivec2vec
    progress : callable(stage, fraction), optional
    report_dir : path, optional  default ``registry.report_dir``
    should_cancel : callable() -> bool, optional; checked at every progress tick → align.exceptions.Cancelled (nothing registered)
    inputs : dict, optional      descriptions of the inputs (files, rows, encoders) kept in lineage
    report_copy : path, optional an extra copy of the HTML report
    ray_address : str, optional  ``"local"`` or a Ray address: supervised fits as a map-reduce (see fit_map)
    report : bool                write the HTML report (default); ``False`` skips it (``report_path`` None)
    ray_shard_rows : int         rows per Ray task (default 262,144; see SCALING.md for when Ray pays off)

    Returns
    -------
    VersionInfo of the new version (``report_path`` set).
    """
    check_name(name, "map name")
    check_name(source_space, "source space")
    check_name(target_space, "target space")
    if alias is not None:
        check_alias(alias)
    params = dict(params or {})
    timings: dict[str, float] = {}
    user_progress = progress or (lambda stage, frac: None)

    def tick(stage: str, frac: float) -> None:
        if should_cancel is not None and should_cancel():
            raise Cancelled(f"fit of {name!r} cancelled during {stage}")
        user_progress(stage, float(frac))

    t0 = time.perf_counter()
    tick("validate", 0.0)
    X = as_matrix(source, name="source")
    Y = as_matrix(target, name="target")
    if paired and X.shape[0] != Y.shape[0]:
        raise align.PairCountError(f"paired fit needs as many source rows as target rows, got {X.shape[0]} and "
                                   f"{Y.shape[0]}")
    hashes = {"source": sha256_array(X), "target": sha256_array(Y)}
    if seed_pairs is not None:
        i_s, i_t = (np.asarray(a).reshape(-1) for a in seed_pairs)
        hashes["seed_pairs"] = sha256_array(np.stack([i_s, i_t], axis=1).astype(np.float32))
    timings["validate + hash"] = time.perf_counter() - t0
    tick("validate", 1.0)

    t0 = time.perf_counter()
    tick("fit", 0.0)
    map_ = fit_map(X, Y, method=method, params=params, paired=paired, seed_pairs=seed_pairs,
                   random_state=random_state, progress=lambda stage, f: tick(f"fit: {stage}", f),
                   ray_address=ray_address, ray_shard_rows=ray_shard_rows)
    timings["fit"] = time.perf_counter() - t0
    tick("fit", 1.0)

    t0 = time.perf_counter()
    tick("diagnostics", 0.0)
    rng = np.random.default_rng(0 if random_state is None else random_state)
    metrics, cosines, clouds = _diagnose(map_, X, Y, paired, rng)
    diag = map_.metadata.get("diagnostics") or {}
    if map_.metadata.get("selection"):  # fit_migration: held-out scores of every candidate family
        metrics["selection"] = map_.metadata["selection"]
    if "criterion" in map_.metadata:
        metrics["criterion"] = float(map_.metadata["criterion"])
    if isinstance(diag.get("criteria"), list):
        metrics["criteria"] = [float(c) for c in diag["criteria"]]
    for key in ("null_criterion", "reliable"):  # label-free failure flag of MiniVec2Vec
        if key in diag:
            metrics[key] = diag[key] if isinstance(diag[key], bool) else float(diag[key])
    effective = dict(map_.metadata.get("params") or {})  # every parameter, defaults included
    effective.update(params)
    effective.pop("random_state", None)  # recorded on its own
    inner = (diag.get("timings") or {})
    timings["diagnostics"] = time.perf_counter() - t0
    tick("diagnostics", 1.0)

    tick("report", 0.0)
    t0 = time.perf_counter()
    stage_times = dict(timings)
    for k, v in inner.items():
        if isinstance(v, (int, float)) and k != "total":
            stage_times[f"fit: {k}"] = float(v)
    for r, rt in enumerate(inner.get("restarts") or []):
        if isinstance(rt, dict):
            for k, v in rt.items():
                if isinstance(v, (int, float)):
                    stage_times[f"fit: restart {r} {k}"] = float(v)
    n_src, n_tgt = X.shape[0], Y.shape[0]
    summary = {"map": name, "spaces": f"{source_space} ({X.shape[1]}-d) -> {target_space} ({Y.shape[1]}-d)",
               "method": method, "paired": paired, "rows": f"source {n_src}, target {n_tgt}",
               "params": effective, "random_state": random_state, "data sha256": hashes, "inputs": inputs or {},
               "alias": alias or "", "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    report_rel = _write_report(registry, name, report_dir, report_copy, summary, metrics, stage_times, diag,
                               cosines, clouds, paired) if report else None
    timings["report"] = time.perf_counter() - t0
    tick("report", 1.0)

    tick("register", 0.0)
    metrics["timings"] = {k: round(v, 4) for k, v in timings.items()}
    version = registry.register_version(
        name, map_, source_space=source_space, target_space=target_space, method=method, params=effective,
        random_state=random_state, data_hashes=hashes, metrics=metrics, description=description, tags=tags,
        alias=alias, report_path=report_rel, inputs={**(inputs or {}), "n_source": n_src, "n_target": n_tgt,
                                                     "paired": paired}, artifact_format=artifact_format)
    tick("register", 1.0)
    return version
