"""Map use cases for every face: fit (validate → fit → diagnostics → report → register), spaces,
map summaries and reports. The sides of a fit and ``/v1/embeddings`` (texts into vectors) are
:mod:`service.ops.embeddings`; their names stay importable from here.

``run_fit`` fits with :mod:`align`, measures the map (paired: top-1 / mean rank / cosine on the
training pairs; unpaired: mutual nearest neighbours after mapping, the label-free signal), renders
the HTML report (:mod:`service.ops.fit_report`) and registers the version with its lineage: sha256 of
the float32 bytes of every input, method and parameters, ``random_state``, package version. The
report file is written only once the version is registered (its path recorded in the version),
so a refused registration (a conflict) leaves no report behind.
"""

from __future__ import annotations

import warnings
from datetime import datetime, timezone
from typing import Callable

import numpy as np

import align
from align.validation import as_matrix
from align.exceptions import DimensionMismatchError, InputError, VecbridgeWarning
from align.frames import unit_rows

from ..encoders import canonical_name
from ..io import sha256_array
from ..logging import get_logger
from ..progress import Progress, Stages
from ..registry import ConflictError, DeletedVersionError, NoReliableVersionError, NotFoundError, Registry, VersionInfo
from ..registry.elsewhere import refuse_elsewhere
from ..registry.entity import VERSION_TABLES, collected
from ..registry.names import check_alias, check_name, utf8_safe
from ..registry.quality import SPLIT, heldout_doubt
from ..registry.retry import until_registered
from ..reports import inner_timings
from ..spaces import check_fit_spaces
from .embeddings import FitSide, check_pairs, embed, embed_side, fit_side
from .fit_report import fit_report, write_fit_report
from .fit_stream import CLOSED_FORM  # the closed-form paired fits: cheap enough to cross-validate
from .plans import MIGRATION_METHODS, check_semi_supervised, fit_migration_map
from .unpaired import UNPAIRED, check_unpaired, check_unpaired_method

__all__ = ["run_fit", "fit_map", "unreliable_note", "METHODS", "SUPERVISED", "FitSide", "check_fit_request",
           "check_fit_params", "check_fit_rows", "fit_side", "check_pairs", "embed_side", "fit_sides", "create_space",
           "describe_map", "report_html", "embed"]

METHODS = ("minivec2vec", "procrustes", "ridge", "lowrank", "auto", "contrastive", "cluster")
SUPERVISED = ("procrustes", "ridge", "lowrank", "auto", "contrastive", "cluster")
_LOWRANK_NEEDS_RANK = "lowrank (align.fit_lowrank's rank-k map) needs a rank: params.rank (CLI: --param rank=N)"
_DIAG_SAMPLE = 4096
_PLOT_SAMPLE = 1500
log = get_logger("maps")  # the ``vecbridge`` tree: JSON lines under serve (``service.ops.maps`` printed plain text)


def fit_map(X: np.ndarray, Y: np.ndarray, *, method: str, params: dict, paired: bool, seed_pairs=None,
            random_state=0, progress: Progress | None = None,
            ray_address: str | None = None, ray_shard_rows: int = 262144,
            threads: int = 1, unpaired: dict | None = None, stream=None) -> align.LinearMap | align.ClusterMap:
    """Fit a map with ``method``: an :class:`align.LinearMap`, or an :class:`align.ClusterMap` from ``cluster``
    (or ``auto`` when the per-cluster family wins on held-out pairs); typed InputError for bad combinations.

    ``ray_address`` (``"local"`` or a cluster address) runs a supervised fit as a Ray map-reduce of
    sufficient statistics over row shards of ``ray_shard_rows`` (equal to the in-process fit), and
    an unsupervised / seeded minivec2vec fit with its row-block kernels as Ray tasks (the same map).
    ``threads`` > 1 runs those row-block kernels on that many threads of this process instead
    (:func:`align.blocks.thread_pool`; the same map, bit for bit). ``unpaired``: ``{"unpaired_source": U, ...}``
    for a migration method (:mod:`service.ops.unpaired`). ``stream``: ``X`` / ``Y`` are the memory maps of
    :class:`~service.ops.fit_stream.PairFiles`, a closed-form fit streamed from its files (the same map).
    """
    params = dict(params or {})
    unpaired = dict(unpaired or {})
    check_unpaired_method(method, sorted(unpaired))
    for what, value in (("threads", threads), ("shard rows", ray_shard_rows)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{what} must be a positive integer, got {value!r}")
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
            return fit_migration_map(X, Y, method=method, params=params, random_state=random_state,
                                     progress=progress, **unpaired)
        fn = CLOSED_FORM[method]
        if method == "lowrank" and "rank" not in params:
            raise InputError(_LOWRANK_NEEDS_RANK)
        try:
            if ray_address is not None:
                from ..distributed import fit_stats_ray

                shards = [(X[a : a + ray_shard_rows], Y[a : a + ray_shard_rows])
                          for a in range(0, X.shape[0], ray_shard_rows)]
                return fit_stats_ray(shards, method=method, address=None if ray_address == "local" else ray_address,
                                     **params)
            return fn(X, Y, **params) if stream is None else stream.fit(method, params)
        except TypeError as exc:
            raise InputError(f"bad parameter for {method}: {exc}") from None
    est = _minivec2vec(params, random_state)
    if ray_address is None:
        from align.blocks import thread_pool

        executor = thread_pool(threads) if threads > 1 else None
        map_ = est.fit(X, Y, progress=progress, seed_pairs=seed_pairs, executor=executor).map_
        if executor is not None:
            map_.metadata.setdefault("diagnostics", {})["executor"] = f"threads:{threads}"
    else:  # the kNN / CSLS rounds as Ray tasks over row blocks: the same map, bit for bit
        from ..distributed import ray_executor, ray_session

        with ray_session(None if ray_address == "local" else ray_address) as ray:
            map_ = est.fit(X, Y, progress=progress, seed_pairs=seed_pairs, executor=ray_executor(ray)).map_
        map_.metadata.setdefault("diagnostics", {})["executor"] = "ray"
    # lineage: which configuration the defaults came from
    map_.metadata.setdefault("params", {})["preset"] = params.get("preset", "fast")
    return map_


def _subsample(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    return np.arange(n) if n <= k else np.sort(rng.choice(n, size=k, replace=False))


def _paired_verdict(top1: float, n: int) -> dict:
    """A paired fit that does not find its own training pairs is broken (e.g. a ridge penalty so large that the
    map is constant): ``reliable`` is False when top-1 over the ``n`` candidates is below
    ``min(5 / n, (1 + 1 / n) / 2)`` (chance: 1 / n); the same flag as MiniVec2Vec's, so such a version is kept
    for inspection but never chosen for a path. A supervised fit is judged on held-out pairs too."""
    chance = 1.0 / max(n, 1)
    if top1 >= min(5.0 * chance, (1.0 + chance) / 2.0):
        return {"reliable": True}
    return {"reliable": False, "unreliable_reason": f"top-1 on its own training pairs {top1:.4f} is near chance "
                                                    f"({chance:.4f} among {n})"}


def _heldout_verdict(held: dict) -> dict:
    """Whether a supervised fit's held-out top-1 (:func:`_heldout_top1`) beats chance (a map of mispaired rows
    memorises them and is at chance on any other row; a bar of twice chance called 6 in 10 auto fits of 100
    shuffled pairs reliable): :func:`service.registry.quality.heldout_doubt`, the test path choice applies to
    every record. Too few pairs to hold any out are not judged: unreliable, saying why."""
    if not held:
        return {"reliable": False, "unreliable_reason": "too few pairs to judge: a paired fit is judged on held-out "
                "pairs, and none were held out (at least 10 pairs, 20 for contrastive or cluster); give more pairs"}
    doubt = heldout_doubt(held)
    return {"reliable": True} if doubt is None else {"reliable": False, "unreliable_reason": doubt}


def _heldout_top1(map_, X, Y, method: str, params: dict, random_state, stream=None) -> dict:
    """The held-out top-1 that path choice ranks maps by (:meth:`Registry.quality`), not the training top-1,
    which rewards a map that memorises its pairs (on WordNet minilm→e5 a ridge map of 1,000 pairs scored 1.000 on
    its training pairs and 0.931 held out, and was chosen over a Procrustes map of 2,000 pairs: 0.9985 / 0.972).
    A migration fit's own held-out split (the chosen family's query-side top-1), else 5-fold cross-validation of
    a closed-form fit (:func:`align.cross_val_top1`: the same pool, a fifth of the pairs up to 1,000; ``stream``:
    its folds fitted from the files); ``{}`` when neither applies (fewer than 10 pairs; a migration fit too small to
    hold pairs out)."""
    sel = map_.metadata.get("selection") or {}
    chosen = (sel.get("candidates") or {}).get(sel.get("chosen")) or {}
    if isinstance(chosen.get("query_recall@1"), (int, float)):
        return {"heldout_top1": float(chosen["query_recall@1"]), "heldout_n_candidates": int(sel["n_holdout"]),
                "heldout_n_queries": int(sel["n_holdout"]), "heldout_n_compared": int(sel.get("n_compared", 1)),
                "heldout_source": SPLIT}
    if method not in CLOSED_FORM or X.shape[0] < 10:
        return {}
    fn = CLOSED_FORM[method]
    try:
        cv = (align.cross_val_top1(X, Y, lambda a, b: fn(a, b, **params), random_state=random_state or 0)
              if stream is None else
              align.cross_val_top1(X, Y, lambda rows: stream.fit(method, params, rows), random_state=random_state or 0,
                                   groups=stream.groups(), fit_rows=True))
    except align.exceptions.VecbridgeError:  # a fold the family cannot fit (e.g. no signal in it)
        return {}
    return {"heldout_top1": cv["top1"], "heldout_n_candidates": cv["n_candidates"], "heldout_n_queries": cv["n_rows"],
            "heldout_n_compared": 1, "heldout_source": f"{cv['folds']}-fold cross-validation"}


def _diagnose(map_: align.LinearMap, X, Y, paired: bool, rng) -> tuple[dict, dict, tuple]:
    """Metrics, cosine samples for the histogram, and PCA clouds."""
    metrics: dict = {}
    cosines: dict = {}
    if paired:
        idx = _subsample(X.shape[0], _DIAG_SAMPLE, rng)
        with warnings.catch_warnings():  # a fit of at most 10 pairs: train_recall@10 is NaN, not a fit's warning
            warnings.simplefilter("ignore", VecbridgeWarning)
            ev = align.evaluate(map_, X[idx], Y[idx], csls=False)
        metrics.update({f"train_{k}": v for k, v in ev.items() if k != "n_candidates"})
        # train_cos is of the target's centred frame; the raw output's, as eval's and a selection's cos_raw
        raw = unit_rows(map_.apply(X[idx], output="raw", validate=False))
        metrics["train_cos_raw"] = float(np.mean(np.einsum("ij,ij->i", raw, unit_rows(Y[idx]))))
        metrics["train_n_candidates"] = ev["n_candidates"]
        metrics.update(_paired_verdict(float(ev["top1"]), int(ev["n_candidates"])))
        Q = unit_rows(map_.apply(X[idx], output="linear", validate=False))
        D = unit_rows(map_.target_frame.apply(Y[idx], validate=False))
        cosines["training pairs"] = np.einsum("ij,ij->i", Q, D)
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


def run_fit(registry: Registry, *, name: str, source, target, method: str, params: dict | None = None,
            source_space: str, target_space: str, paired: bool, seed_pairs=None, random_state: int | None = 0,
            alias: str | None = None, progress: Progress | None = None, report_dir=None,
            should_cancel: Callable[[], bool] | None = None, description: str = "", tags: dict | None = None,
            inputs: dict | None = None, artifact_format: str | None = None,
            report_copy=None, ray_address: str | None = None, report: bool = True, threads: int = 1,
            ray_shard_rows: int = 262144, notes: list[str] | None = None, unpaired_source=None,
            unpaired_target=None, stream=None) -> VersionInfo:
    """Fit, diagnose, report and register one map version.

    Parameters
    ----------
    registry : Registry
    name : str                   map name (``minilm->e5``)
    source : array (n, d_s); target : array (m, d_t)   raw embeddings (paired: n == m, row i ↔ row i)
    method : one of :data:`METHODS`
    params : dict                keyword arguments of the align fitter / estimator
    paired : bool                rows are paired (supervised methods need it)
    seed_pairs : (i_src, i_tgt) or None      known pairs for seeded minivec2vec
    progress : Progress, optional  ``(stage, fraction)``: validate, fit (and "fit: <stage>"), diagnostics, report
                                 (and "report: <stage>"), register
    report_dir : path, optional  default ``registry.report_dir``
    should_cancel : callable() -> bool, optional; checked at every progress tick → align.exceptions.Cancelled (nothing registered)
    inputs : dict, optional      descriptions of the inputs (files, rows, encoders) kept in lineage
    report_copy : path, optional an extra copy of the HTML report
    ray_address : str, optional  ``"local"`` or a Ray address: supervised fits as a map-reduce (see fit_map)
    threads : int  threads for an unpaired / seeded minivec2vec fit's row-block kernels (see fit_map)
    report : bool                write the HTML report (default; one that fails to render is logged and noted, and
                                 the map is registered without it); ``False`` skips it (``report_path`` None)
    ray_shard_rows : int         rows per Ray task (default 262,144; see SCALING.md for when Ray pays off)
    notes : list, optional       gets what the user should know about the registration
                                 (:meth:`Registry.default_change_note`; an ``alias`` not moved, below)
    unpaired_source : array (k, d_s); unpaired_target : array (l, d_t), optional   more rows of one model beside
                                 the pairs (:mod:`service.ops.unpaired`; the migration methods only)
    stream : PairFiles, optional  ``source`` / ``target`` are its memory maps: checked and hashed by its scan, fitted
                                 and cross-validated from its files (:mod:`service.ops.fit_stream`), never read whole

    An ``alias`` is not moved to a fit flagged unreliable (``metrics["reliable"]`` False): a pinned alias wins
    over the "never chosen for a path" rule, so a failed refit with ``--alias prod`` replaced the production map
    for every search. The version is registered either way; ``notes`` says where the alias still points.

    Returns
    -------
    VersionInfo of the new version (``report_path`` set when ``report``; the file is written after registration).
    """
    check_name(name, "map name")
    check_name(source_space, "source space")
    check_name(target_space, "target space")
    if alias is not None:
        check_alias(alias)
    _check_map_spaces(registry, name, source_space, target_space)  # what registration would refuse: before the fit
    _check_artifact_folder(registry, name)
    params = dict(params or {})
    inputs = utf8_safe(inputs or {})  # file names as recorded: the report and every JSON answer are UTF-8
    check_unpaired_method(method, [k for k, U in zip(UNPAIRED, (unpaired_source, unpaired_target)) if U is not None])
    st = Stages(progress, should_cancel, what=f"fit of {name!r}")
    if paired and method == "minivec2vec" and seed_pairs is None and notes is not None:  # it was silent about it
        notes.append("minivec2vec fits without pairs: the rows' pairing only judges the map here; to fit from known "
                     "pairs use a paired method, or give a few as seed pairs")

    with st.stage("validate", timing="validate + hash"):
        X = as_matrix(source, name="source") if stream is None else source  # a stream's: checked as scanned
        Y = as_matrix(target, name="target") if stream is None else target
        if stream is not None:  # its bad rows named first, as a whole read names them (the space checks come after)
            stream.scan()
        if paired and X.shape[0] != Y.shape[0]:
            raise align.PairCountError(f"paired fit needs as many source rows as target rows, got {X.shape[0]} "
                                       f"and {Y.shape[0]}")
        for space, M in ((source_space, X), (target_space, Y)):
            try:
                have = registry.get_space(space).dim
            except NotFoundError:
                continue
            if have != M.shape[1]:
                raise ConflictError(f"space {space!r} is {have}-d, not {M.shape[1]}-d")
        rest = check_unpaired((X.shape[1], Y.shape[1]), unpaired_source=unpaired_source,
                              unpaired_target=unpaired_target)
        # swapped files, and unpaired rows of the other side's model (they make the side's frame): refused here
        for note in check_fit_spaces(registry, X, Y, source_space, target_space, unpaired=rest):
            warnings.warn(note, VecbridgeWarning, stacklevel=2)
        hashes = ({"source": sha256_array(X), "target": sha256_array(Y)} if stream is None else stream.scan()["hashes"])
        hashes.update({k: sha256_array(U) for k, U in rest.items()})
        if seed_pairs is not None:
            i_s, i_t = (np.asarray(a).reshape(-1) for a in seed_pairs)
            hashes["seed_pairs"] = sha256_array(np.stack([i_s, i_t], axis=1).astype(np.float32))

    with st.stage("fit"):
        map_ = fit_map(X, Y, method=method, params=params, paired=paired, seed_pairs=seed_pairs,
                       random_state=random_state, progress=st.sub("fit"), ray_address=ray_address, threads=threads,
                       ray_shard_rows=ray_shard_rows, unpaired=rest, stream=stream)

    Xs, Ys = (X, Y) if stream is None else stream.readers()  # the stages below read samples (a stream: from files)
    with st.stage("diagnostics"):
        rng = np.random.default_rng(0 if random_state is None else random_state)
        metrics, cosines, clouds = _diagnose(map_, Xs, Ys, paired, rng)
        if paired:
            held = _heldout_top1(map_, Xs, Ys, method, params, random_state, stream)
            metrics.update(held)
            if metrics.get("reliable") is not False and method in SUPERVISED:  # minivec2vec never saw the pairs
                metrics.update(_heldout_verdict(held))
        diag = map_.metadata.get("diagnostics") or {}
        signals = _fit_signals(map_.metadata, diag)
        if metrics.get("reliable") is False:  # the pairs' verdict stands (MiniVec2Vec's "reliable" overwrote it)
            signals.pop("reliable", None)
        elif signals.get("reliable") is False and not (diag.get("verdict_rows") or {}).get("held_out", True):
            signals["unreliable_reason"] = "too few rows to hold any out and judge the map"
        metrics.update(signals)
        effective = dict(map_.metadata.get("params") or {})  # every parameter, defaults included
        effective.update(params)
        if "n_clusters" in (map_.metadata.get("params") or {}):  # the count used (a given one may have been capped)
            effective["n_clusters"] = map_.metadata["params"]["n_clusters"]
        effective.pop("random_state", None)  # recorded on its own

    if notes is not None and (metrics.get("selection") or {}).get("note"):  # e.g. n_clusters capped
        notes.append(metrics["selection"]["note"])
    if notes is not None and (metrics.get("semi_supervised") or {}).get("applied") is False:  # it was silent
        fitted = (metrics.get("selection") or {}).get("chosen") or method
        notes.append(f"semi_supervised={params.get('semi_supervised')} was not applied: "
                     f"{metrics['semi_supervised'].get('why')}; the map is the {fitted} fit, unrefined (to refine, "
                     f"fit procrustes: params candidates=[\"procrustes\"])")
    held_back = alias if metrics.get("reliable") is False else None
    alias = None if held_back else alias
    html_text = report_file = report_rel = None
    with st.stage("report"):  # rendered now, written once the version is registered (no orphan on a conflict)
        if report:
            summary = {"map": name, "spaces": f"{source_space} ({X.shape[1]}-d) -> {target_space} ({Y.shape[1]}-d)",
                       "method": method, "paired": paired, "rows": f"source {X.shape[0]}, target {Y.shape[0]}"
                       + "".join(f", {k.replace('_', ' ')} {U.shape[0]}" for k, U in rest.items()),
                       "params": effective, "random_state": random_state, "data sha256": hashes,
                       "inputs": inputs or {},
                       "alias": f"{held_back} (not moved: the fit is unreliable)" if held_back else alias or "",
                       "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
            html_text, report_file, report_rel = fit_report(
                registry, name, Xs, Ys, summary=summary, metrics=metrics, timings={**st.timings, **inner_timings(diag)},
                diag=diag, cosines=cosines, clouds=clouds, paired=paired, rng=rng, report_dir=report_dir,
                notes=notes, progress=st.sub("report"))

    st.tick("register", 0.0)  # the last cancellation point: once registered, the fit has happened
    # the fitter's own stage seconds too ("fit: icp"...): the artifact leaves them out (same fit, same bytes)
    metrics["timings"] = {k: round(v, 4) for k, v in {**st.timings, **inner_timings(diag)}.items()}
    if isinstance(map_.metadata.get("distributed"), dict):  # a sharded fit's record, its workers' peak memory too
        metrics["distributed"] = dict(map_.metadata["distributed"])
    # a space the fit creates from texts records their encoder (a later text transform then needs no --encoder)
    encoders = {space: canonical_name(side["encoder"]) for key, space in (("source", source_space),
                                                                          ("target", target_space))
                if isinstance(side := (inputs or {}).get(key), dict) and side.get("encoder")}

    seen: dict = {}  # what the bare name meant before the try that registered (a try runs only if none had)

    def register():
        seen["before"] = registry.resolve_bare(name)
        return seen["before"], registry.register_version(
            name, map_, source_space=source_space, target_space=target_space, method=method, params=effective,
            random_state=random_state, data_hashes=hashes, metrics=metrics, description=description, tags=tags,
            alias=alias, report_path=report_rel, artifact_format=artifact_format, encoders=encoders,
            inputs={**(inputs or {}), "n_source": X.shape[0], "n_target": Y.shape[0], "paired": paired,
                    **{f"n_{k}": U.shape[0] for k, U in rest.items()}})

    def found():  # this fit's version, if a try that failed was committed (its stage timings are its own)
        try:
            mine = [v for v in registry.list_versions(name) if v.data_hashes == hashes
                    and v.metrics.get("timings") == metrics["timings"]]
        except NotFoundError:
            return None
        return (seen.get("before"), mine[-1]) if mine else None  # its note as a normal registration's

    # a registry unreachable for seconds (a PostgreSQL restart) failed a fit of minutes: the map was thrown away
    before, version = until_registered(register, st.tick, what=f"map {name!r}", found=found)
    missing = write_fit_report(version, report_file, report_copy, html_text) if html_text is not None else None
    if missing and notes is not None:
        notes.append(missing)
    note = registry.default_change_note(before, version)
    if held_back:
        try:
            where = f"still points at {name}:{registry.alias_version(name, held_back)}"
        except NotFoundError:
            where = "was not created"
        note = (f"alias {held_back!r} {where}, not moved to {version.ref}: the fit is flagged unreliable (move it by "
                f"hand if you mean to: `vecbridge registry alias {name} {held_back} {version.version}`)")
    elif metrics.get("reliable") is False:  # every face says so (over HTTP the job succeeds: the map is registered)
        note = unreliable_note(version)
    if note and notes is not None:
        notes.append(note)
    return version


def _fit_signals(meta: dict, diag: dict) -> dict:
    """The fit's own quality signals worth keeping with the metrics (selection, criterion, reliability)."""
    out: dict = {}
    if meta.get("selection"):  # fit_migration: held-out scores of every candidate family
        out["selection"] = meta["selection"]
    if "criterion" in meta:
        out["criterion"] = float(meta["criterion"])
    if isinstance(diag.get("criteria"), list):
        out["criteria"] = [float(c) for c in diag["criteria"]]
    for key in ("null_criterion", "reliable"):  # label-free failure flag of MiniVec2Vec
        if key in diag:
            out[key] = diag[key] if isinstance(diag[key], bool) else float(diag[key])
    semi = meta.get("semi_supervised")
    if isinstance(semi, dict):  # whether the refinement asked for ran: its record was in the artifact alone
        out["semi_supervised"] = {k: semi[k] for k in ("applied", "why", "method") if k in semi}
    if diag.get("executor"):  # where the kernels ran (threads:2, ray): kept here, not in the artifact
        out["executor"] = str(diag["executor"])
    return out


def unreliable_note(version: VersionInfo) -> str:
    """The note of a fit registered unreliable (the CLI, which says so in its own words and exit code, drops it)."""
    why = version.metrics.get("unreliable_reason") or "its criterion is close to that of random maps"
    return f"{version.ref} is flagged unreliable ({why}): kept for inspection, never chosen for a path"


# --- fit requests (a face's body → checked sides → a fit job) ------------------------------------
def check_fit_request(registry, *, name: str, method: str, paired: bool, source_space: str, target_space: str,
                      alias: str | None, params: dict | None = None, random_state=0, unpaired=()) -> None:
    """Refuse at request time what the fit job would refuse later (422 / 409, not a failed job).

    Names and alias go through the registry's own validators; a map name already bound to other
    spaces is the ConflictError ``register_version`` would raise; ``params`` get :func:`check_fit_params`;
    ``unpaired``: the unpaired sets given (their keys, :mod:`service.ops.unpaired`).
    """
    check_name(name, "map name")
    check_name(source_space, "source space")
    check_name(target_space, "target space")
    if alias is not None:
        check_alias(alias)
    _check_map_spaces(registry, name, source_space, target_space)
    _check_artifact_folder(registry, name)
    _check_method(method, paired)
    check_unpaired_method(method, list(unpaired))
    check_fit_params(method, params, random_state, unpaired=len(set(unpaired)) == 2)


def _check_map_spaces(registry, name: str, source_space: str, target_space: str) -> None:
    """A map name already bound to other spaces: the ConflictError ``register_version`` would raise after the fit."""
    try:
        v = registry.get_version(name, 1)  # one row; every version of a map shares its spaces
    except NotFoundError:
        try:  # an unknown map, or one whose numbering does not start at 1 (imported)
            vs = registry.list_versions(name, True)
        except NotFoundError:
            vs = []
        v = vs[0] if vs else None
    if v is not None and (v.source_space, v.target_space) != (source_space, target_space):
        raise ConflictError(f"map {name!r} connects {v.source_space} -> {v.target_space}, not "
                            f"{source_space} -> {target_space}; choose another map name")


def _check_artifact_folder(registry, name: str) -> None:
    """A data dir whose artifact folder is not the registry's: the ArtifactsElsewhereError registration would raise
    after the fit (a fit of minutes thrown away), raised before it reads a row."""
    refuse_elsewhere(registry.db, registry.store, VERSION_TABLES, f"map {name!r} was not fitted")


def _minivec2vec(params: dict, random_state) -> align.MiniVec2Vec:
    """The estimator of a minivec2vec fit: ``params["preset"]`` (``fast`` default, ``published``, ``none``) plus
    the other params as constructor arguments; an unknown one is an InputError."""
    params = dict(params)
    if "refine" in params and isinstance(params["refine"], list):
        params["refine"] = tuple(params["refine"])
    preset = params.pop("preset", "fast")
    cls = align.MiniVec2Vec
    if preset not in ("fast", "published", "none"):
        raise InputError(f"preset must be 'fast' (vecbridge's configuration), 'published' (the paper's defaults) "
                         f"or 'none' (constructor defaults), got {preset!r}")
    try:
        make = {"fast": cls.fast, "published": cls.published}.get(preset, cls)
        return make(random_state=random_state, **params)
    except TypeError as exc:
        raise InputError(f"bad parameter for minivec2vec: {exc}") from None


def check_fit_params(method: str, params: dict | None, random_state=0, unpaired: bool = False) -> None:
    """The parameter checks a fit makes before it reads a row, made when the fit is requested: ``align``'s
    own for the migration methods (:func:`align.migration.check_options`) and minivec2vec
    (:meth:`align.MiniVec2Vec.check_params`), and for the closed-form fits
    (:func:`align.procrustes.check_closed_form_params`: names and values). :func:`check_fit_rows` makes the
    checks that need the row counts. ``unpaired``: both unpaired sets are given (``semi_supervised`` needs them)."""
    params = dict(params or {})
    if method in MIGRATION_METHODS:
        align.migration.check_options(method, params)
        check_semi_supervised(params, unpaired)
    elif method == "minivec2vec":
        _minivec2vec(params, random_state).check_params()
    elif method in CLOSED_FORM:
        if method == "lowrank" and "rank" not in params:
            raise InputError(_LOWRANK_NEEDS_RANK)
        align.procrustes.check_closed_form_params(method, params)  # values too: alpha=-1 was a failed job


def check_fit_rows(method: str, params: dict | None, src: FitSide, tgt: FitSide, *, seed_pairs=None,
                   random_state=0) -> None:
    """The checks a fit makes of its row counts and widths, made when the fit is requested (they were failed
    jobs): seed pairs with a paired method, too few rows (2 pairs; 4 for ``auto``; minivec2vec's k-means anchors
    and Refine-2 clusters), more clusters than pairs, a lowrank rank above the narrower side's width."""
    params = dict(params or {})
    if method in SUPERVISED and seed_pairs:  # an empty list is none (as the job reads it)
        raise InputError("seed pairs apply to minivec2vec only")
    n = min(src.rows, tgt.rows)
    dims = (src.X.shape[1], tgt.X.shape[1]) if src.X is not None and tgt.X is not None else None
    if method in MIGRATION_METHODS:
        align.migration.check_options(method, params, n_pairs=n, dims=dims)
    elif method in CLOSED_FORM:
        if n < 2:
            raise align.TooFewRowsError(f"a paired fit needs at least 2 pairs, got {n}")
        align.procrustes.check_closed_form_params(method, params, dims=dims)
    elif method == "minivec2vec":
        _minivec2vec(params, random_state).check_rows(src.rows, tgt.rows, seeded=len(seed_pairs or ()) >= 2)


def _check_method(method: str, paired: bool) -> None:
    if method not in METHODS:
        raise InputError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    if method in SUPERVISED and not paired:
        raise InputError(f"method {method!r} needs paired rows (\"paired\": true); use minivec2vec for unpaired sets")


def fit_sides(registry, load_encoder: Callable, src: FitSide, tgt: FitSide, *, progress: Progress | None = None,
              seed_pairs=None, inputs: dict | None = None, **fit) -> VersionInfo:
    """Embed what needs embedding, then :func:`run_fit` (``fit``: its other keyword arguments).

    ``seed_pairs``: ``[[i_src, i_tgt], ...]`` rows known to match (seeded minivec2vec).
    """
    Xs = embed_side(registry, load_encoder, src, progress)
    Xt = embed_side(registry, load_encoder, tgt, progress)
    seed = None
    if seed_pairs:
        pairs = np.asarray(seed_pairs, dtype=np.int64).reshape(-1, 2)
        seed = (pairs[:, 0], pairs[:, 1])  # (source rows, target rows), as align.MiniVec2Vec takes them
    return run_fit(registry, source=Xs, target=Xt, source_space=src.space, target_space=tgt.space, seed_pairs=seed,
                   progress=progress, inputs={**(inputs or {}), "source": src.describe(), "target": tgt.describe()},
                   **fit)


# --- spaces, maps, reports -----------------------------------------------------------------------
def create_space(registry, load_encoder: Callable, *, name: str, dim: int | None = None, encoder: str | None = None,
                 **details):
    """Register space ``name``: ``dim`` given, or taken from ``encoder`` (both given: they must agree).

    ``details``: ``query_prefix``, ``passage_prefix``, ``description``. Returns ``(SpaceInfo, created)``.
    """
    if encoder:
        enc = load_encoder(encoder)
        if dim is not None and dim != enc.dim:
            raise DimensionMismatchError(f"encoder {encoder!r} produces {enc.dim}-d vectors, not {dim}")
        dim = enc.dim
    if dim is None:
        raise InputError("give `dim`, or an `encoder` to take it from")
    try:
        have = registry.get_space(name)
    except NotFoundError:
        have = None
    if have is not None:  # the encoder was replaced without a word: the space's texts then embedded by another model
        for what, old, new in (("encoder", have.encoder, encoder), ("query_prefix", have.query_prefix,
                                                                    details.get("query_prefix")),
                               ("passage_prefix", have.passage_prefix, details.get("passage_prefix"))):
            if old and new and (canonical_name(old) != canonical_name(new) if what == "encoder" else old != new):
                raise ConflictError(f"space {name!r} has {what} {old!r}: texts embedded with {new!r} would not be "
                                    f"comparable with the vectors its maps and indexes hold; register a new space")
    return registry.upsert_space(name, dim, encoder=encoder, **details)


def delete_space(registry, indexes, name: str):
    """Remove space ``name`` from the registry while nothing uses it: maps, steers (:meth:`Registry.delete_space`)
    or an index of ``indexes`` (an IndexStore); ConflictError naming all of them. Returns the SpaceInfo it was."""
    registry.get_space(name)  # unknown: NotFoundError before the indexes are looked at
    with indexes.held_spaces() as spaces:  # meta.json only; no index commits into the space meanwhile
        held = [f"index {ix!r}" for ix, space in spaces.items() if space == name]
        return registry.delete_space(name, held_by=held)


def describe_map(registry, resolve: Callable, ref: str) -> dict:
    """The map's summary (as in ``list_maps``) and the version ``ref`` resolves to (``resolved``); a bare name whose
    live versions are all flagged unreliable shows the newest (:meth:`~service.registry.Registry.inspect`)."""
    try:
        v = resolve(ref)
    except NoReliableVersionError:  # shown, not used (the console reads a map so after moving an alias)
        v = registry.inspect(ref)
    summary = next(iter(registry.list_maps(name=v.name)), {})
    return {**summary, "resolved": v.to_dict()}


def report_html(registry, name: str, version: int) -> bytes:
    """The HTML fit report of ``name:version``; NotFoundError when it has none or the file is gone (DeletedVersionError
    when ``registry gc`` removed it)."""
    v = registry.get_version(name, version)
    path = registry.report_file(v)
    if path is None:
        raise NotFoundError(f"map {v.ref} has no fit report (registered without one)")
    if v.collected_at:  # `registry gc` removed it: "missing from the data dir" sent operators looking for a fault
        raise DeletedVersionError(f"map {v.ref} was deleted{collected(v)}: its fit report is gone")
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise NotFoundError(f"the fit report of map {v.ref} is missing from the data dir") from None
