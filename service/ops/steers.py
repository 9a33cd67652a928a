"""Steer use cases for every face: fit and register, apply, lens, alias, delete, transfer, steered queries (the
eps checks and steered queries are :mod:`service.ops.steer_apply`'s, re-exported here).

The numerics are :mod:`align.steer` (``W = P1 P2^T`` steers, mean-shift baselines, transfer
through a map ``H^T W H``); the storage is :meth:`service.registry.Registry.register_steer`.
Here request-shaped inputs (rows or texts, labels, a params dict, a
:data:`service.progress.Progress`) become calls of both, parameters are checked once (typed
errors the faces map to status codes / exit codes), and lineage is recorded: sha256 of the rows
and labels, every effective parameter, and for a transfer the source steer and map versions.

Transfer carries a registered steer through a registered map ``x_B ≈ x_A M`` (``H^T W H`` with
``H = pinv(M)^T``, the map's centring frames folded in so that ``eps`` moves results as far in the new
space as in the old, :func:`align.transfer_steer`) and registers the result as the next version of
a steer in the map's target space.
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from align.exceptions import DimensionMismatchError, InputError, PairCountError
from align.steer import MeanShift, Steer, check_steer_options, fit_mean_shift, fit_steer, transfer_steer
from align.validation import as_matrix

from ..encoders import space_encoder
from ..io import is_text_path
from ..limits import MAX_SEED
from ..progress import Progress, silent
from ..registry import ConflictError, InvalidNameError, NotFoundError
from ..registry.models import dumps
from ..registry.names import MAX_NAME, check_alias, check_name
from ..registry.quality import heldout_doubt, reliable
from ..registry.retry import until_registered
from ..space_names import check_new_space
from ..spaces import MEAN_CHECK_MIN_ROWS, check_rows, space_references
from .steer_apply import apply_steer_job, check_steer_eps, check_summed_eps, steer_queries  # re-exported
from .transform import check_no_zero_rows, first_rows, rows_of_input, rows_through

__all__ = ["STEER_PARAMS", "STEER_METHOD_NAMES", "check_steer_params", "check_steer_fit", "fit_steer_job",
           "space_for_rows", "fit_and_register", "embed_and_register", "apply_steer_job", "check_steer_zero_rows",
           "steer_lens", "describe_lens",
           "set_steer_alias", "delete_steer_alias", "delete_steer_version", "bare_steer_ref", "transfer_and_register",
           "steer_queries", "check_steer_eps", "check_summed_eps", "steer_file", "steer_text_encoder",
           "check_steer_rows", "fit_verdict", "unreliable_steer_note", "alias_held_back", "STEER_MIN_HELDOUT_GAIN"]

# Accepted fit parameters and their defaults (the API schema can mirror this). The seed is no parameter: it is the
# fit's own `random_state` (every face has one, default 0).
STEER_PARAMS: dict = {"method": "local", "rank": 16, "temperature": 0.05, "weight_decay": 1e-3, "max_iter": 200,
                      "max_pairs": 2048, "n_candidates": 4096, "n_neighbors": None, "init_scale": 1e-2,
                      "n_queries": 4000, "ridge": 0.1, "opposite_weight": 0.0, "prior_weight": "auto", "n_folds": 2}
STEER_METHOD_NAMES = ("local", "lm-steer", "mean-shift")
#: the parameters each method reads (:func:`align.fit_steer`); one it does not read was stored and ignored
_METHOD_PARAMS = {"local": {"n_queries", "n_neighbors", "ridge", "opposite_weight", "prior_weight", "n_folds"},
                  "lm-steer": {"rank", "temperature", "weight_decay", "max_iter", "max_pairs", "n_candidates",
                               "n_neighbors", "init_scale"},
                  "mean-shift": set()}
_METRICS = ("loss_initial", "loss_final", "n_iter", "converged", "n_pos", "n_neg", "n_neutral", "n_pairs")
#: a steer whose own cross-validation leaves its held-out loss within this fraction of no steer's at every prior
#: weight does not separate its labels (WordNet plant vs animal, MiniLM, 5 seeds each of 300 / 1,000 / 3,000 / 8,000
#: rows: real labels 0.44-0.63, shuffled ones 1.001-1.11, every one flagged; before the held-out folds' labels were
#: kept out of the prior's line, shuffled ones scored 0.76-0.95 below 3,000 rows and passed:
#: ``benchmarks/results/steer_flag_2026-12-06.md``); flagged unreliable, as a map at chance is
STEER_MIN_HELDOUT_GAIN = 0.02
#: items stored at each end of a lens direction at fit time (:func:`fit_and_register`'s ``lens_k``)
LENS_K = 5


# --- fit ------------------------------------------------------------------------------------------
def check_steer_params(params: Mapping | None, random_state: int | None = 0, *, dim: int | None = None) -> dict:
    """Effective parameters (defaults filled, the seed ``random_state`` folded in: None is 0); unknown keys, method or
    a bad value (:func:`align.steer.check_steer_options`) raise InputError, and so does ``random_state`` among the
    params (the fit's own ``random_state`` is the seed: every face sends one, so a second one was refused or
    ignored), and any parameter the method does not read (``rank`` but for ``lm-steer``; any for ``mean-shift``).
    The effective parameters, stored with the version, are those the method reads (:data:`_METHOD_PARAMS`), the
    method and the seed. ``dim``, the rows' width when known, bounds ``lm-steer``'s rank."""
    params = dict(params or {})
    if "random_state" in params:
        raise InputError("random_state is not a steer parameter: give the seed as the fit's own random_state "
                         "(`--random-state` on the command line), not in params")
    unknown = set(params) - set(STEER_PARAMS)
    if unknown:
        raise InputError(f"unknown steer parameters: {sorted(unknown)}; known: {sorted(STEER_PARAMS)}")
    if params.get("method", "local") not in STEER_METHOD_NAMES:
        raise InputError(f"unknown steer method {params['method']!r}; use one of {list(STEER_METHOD_NAMES)}")
    method = params.get("method", "local")
    unused = sorted(set(params) - _METHOD_PARAMS[method] - {"method"})
    if unused:  # the fit ignored them: "rank 8" stored on a rank-1 local steer, temperature=-5 on a mean-shift
        what = ("no parameters but the method (v = mean of the +1 rows - mean of the -1 rows)"
                if method == "mean-shift" else f"only {sorted(_METHOD_PARAMS[method])}")
        raise InputError(f"a {method} steer takes {what}; drop {unused}"
                         + (" (rank: fit method lm-steer; a local steer is rank 1)" if "rank" in unused else ""))
    seed = 0 if random_state is None else random_state
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed <= MAX_SEED:
        raise InputError(f"random_state must be an integer in 0 .. {MAX_SEED}, got {seed!r}")
    # the parameters that take part in the fit (a local steer stored lm-steer's rank 16, temperature, max_iter ... as
    # if they had shaped it); a version stored before keeps its full dict, read as it was
    used = {"method", *_METHOD_PARAMS[method]}
    effective = {**{k: v for k, v in STEER_PARAMS.items() if k in used}, **params, "random_state": int(seed)}
    if method == "mean-shift":
        return effective
    # the values too, as the fit will check them (a 422, not a failed job)
    check_steer_options(**{k: v for k, v in _fit_args(effective).items() if k != "random_state"}, dim=dim)
    return effective


def _fit_args(params: dict) -> dict:
    """``params`` as :func:`align.fit_steer` takes them: ``prior_weight="inf"`` (JSON has no infinity; the
    parameters are stored as JSON) is ``float("inf")``, the mean-shift line."""
    return {**params, "prior_weight": float("inf")} if params.get("prior_weight") == "inf" else params


def check_steer_fit(registry, *, name: str, space: str, alias: str | None, params: Mapping | None,
                    random_state: int | None) -> None:
    """Refuse at request time what the fit would refuse later: bad names or parameters (422), a steer
    name that already lives in another space (409)."""
    check_name(name, "steer name")
    check_name(space, "space")
    if alias is not None:
        check_alias(alias)
    check_steer_params(params, random_state)
    check_steer_space(registry, name, space)


def check_steer_space(registry, name: str, space: str) -> None:
    """A steer name already bound to another space: the ConflictError ``register_steer`` would raise, raised
    before any work (and before its artifact is written: a refused registration left it behind)."""
    try:
        have = registry.list_steer_versions(name)
    except NotFoundError:
        return
    if have and have[0].space != space:
        raise ConflictError(f"steer {name!r} lives in space {have[0].space!r}, not {space!r}")


def space_for_rows(registry, load_encoder: Callable, space: str, *, texts: bool,
                   encoder: str | None = None) -> tuple[int | None, str | None]:
    """``(dim, encoder)`` for a fit's rows in ``space``: the space's width (None while it is new) and,
    for texts, the encoder that embeds them (the space's, which ``encoder`` must name when given: texts embedded by
    another model of the same width were fitted as the space's; else ``encoder``; loaded now so an unknown one is
    refused before any job starts)."""
    try:
        info = registry.get_space(space)
    except NotFoundError:
        info = None
    if texts:
        encoder = space_encoder(space, info.encoder if info else None, encoder)
        if not encoder:
            raise InputError(f"give an `encoder` for the texts (space {space!r} has none registered)")
        load_encoder(encoder)
    return (info.dim if info else None), (encoder if texts else None)


def fit_steer_job(X=None, labels=None, params: Mapping | None = None, progress: Progress | None = None, *,
                  texts: Sequence[str] | None = None, encoder: Callable | None = None,
                  space: str | None = None, random_state: int | None = 0) -> Steer | MeanShift:
    """Fit a steer (``params["method"]``: ``"local"`` default, ``"lm-steer"`` or ``"mean-shift"``).

    Parameters
    ----------
    X : array-like (n, d), optional — or ``texts`` with ``encoder`` (callable: list[str] -> (n, d))
    labels : (n,) in {-1, 0, +1}
    params : dict, keys of :data:`STEER_PARAMS` (unknown keys raise InputError)
    progress : Progress, optional   stages ``encode`` and ``fit``
    space : name of the embedding space, recorded in the metadata
    random_state : the seed (0 .. 2**31-1)
    """
    p = check_steer_params(params, random_state)
    say = progress or silent
    if labels is None:
        raise InputError("labels are required")
    if (X is None) == (texts is None):
        raise InputError("give exactly one of X (vectors) or texts (+ encoder)")
    if texts is not None:
        if encoder is None:
            raise InputError("texts need an encoder (callable: list[str] -> (n, d) array)")
        say("encode", 0.0)
        X = np.asarray(encoder(list(texts)), dtype=np.float32)
    method = p.pop("method")
    if method == "mean-shift":
        out = fit_mean_shift(X, labels)
    else:
        max_iter = 1 if method == "local" else int(p["max_iter"])
        out = fit_steer(X, labels, method=method, callback=lambda it, loss: say("fit", min(1.0, it / max_iter)),
                        **_fit_args(p))
    if space is not None:
        out.metadata["space"] = space
    if texts is not None:
        out.metadata["n_texts"] = len(texts)
    say("fit", 1.0)
    return out


def fit_verdict(metadata: Mapping) -> dict:
    """A fitted steer's verdict for its metrics, from its own held-out check (a local steer's cross-validation of its
    prior weight: ``prior_selection.heldout_loss_ratio``, held-out loss over no steer's per weight):
    ``heldout_loss_ratio`` (the best weight's) and ``reliable`` (False, with ``unreliable_reason``, when it is
    within :data:`STEER_MIN_HELDOUT_GAIN` of 1: labels the steer does not separate, e.g. shuffled ones). ``{}``
    where there is no such check (lm-steer, mean-shift, a fixed prior weight, too few rows per fold): not judged.
    Each held-out fold is scored by a steer made from the other folds alone, its prior's mean-shift line included
    (:func:`align.steer_local.shift_line`): that line read every row's labels before, and with few labelled rows
    shuffled labels scored 0.76-0.98 and passed (a review: 27 labelled of 1,638 rows, and 816 of 3,800); now they
    score about 1 or more at every size measured (300-8,000 rows). A rare attribute's real labels can be flagged
    too (WordNet adjective sentiment, 1-2% of rows labelled: 0.98-1.0), as the check cannot tell them from shuffled
    ones (``benchmarks/results/steer_flag_2026-12-06.md``)."""
    ratios = (metadata.get("prior_selection") or {}).get("heldout_loss_ratio")
    if not ratios:
        return {}
    best = float(min(ratios.values()))
    if best <= 1.0 - STEER_MIN_HELDOUT_GAIN:
        return {"heldout_loss_ratio": best, "reliable": True}
    return {"heldout_loss_ratio": best, "reliable": False, "unreliable_reason": (
        f"its own held-out check found no gain from its labels: held-out loss {best:.3f} of no steer's at its best "
        f"prior weight, above {1.0 - STEER_MIN_HELDOUT_GAIN:g} (shuffled labels give 1.00 or more; so can too few "
        f"labelled rows, a rare attribute: label more rows, or check it yourself, results at eps 0 vs eps)")}


def _transfer_verdict(s_info, m_info) -> dict:
    """A transferred steer's verdict: unreliable when carried through a map flagged unreliable (the registry's
    test, :func:`service.registry.quality.reliable`) or from a steer flagged so; ``map_reliable`` and the source's
    ``heldout_loss_ratio`` kept; ``reliable`` True only when both were judged good."""
    out = {"map_reliable": reliable(m_info.metrics, m_info.method),
           **{k: s_info.metrics[k] for k in ("heldout_loss_ratio",) if k in s_info.metrics}}
    if not out["map_reliable"]:
        why = (m_info.metrics.get("unreliable_reason") or heldout_doubt(m_info.metrics)
               or "its criterion is close to that of random maps")
        return {**out, "reliable": False, "unreliable_reason": f"carried through map {m_info.ref}, flagged "
                                                                f"unreliable ({why})"}
    if s_info.metrics.get("reliable") is False:
        return {**out, "reliable": False, "unreliable_reason": f"carried from steer {s_info.ref}, flagged unreliable "
                f"({s_info.metrics.get('unreliable_reason') or 'no reason recorded'})"}
    return {**out, "reliable": True} if s_info.metrics.get("reliable") is True else out


def _held_back(alias: str | None, verdict: dict) -> str | None:
    """The alias a new version takes: none when it is flagged unreliable (as a map fit's, ``--allow-unreliable`` or
    not: the alias stays where it was, and a bare name skips the version,
    :meth:`~service.registry.core.Registry.resolve_steer`; ``steer alias`` moves it by hand)."""
    return None if verdict.get("reliable") is False else alias


def alias_held_back(info, alias: str | None) -> str | None:
    """``alias`` when a registration asked for it and the new version ``info`` did not take it (flagged
    unreliable, :func:`_held_back`), else None: every face says so (CLI, the fit job's ``alias_held_back``)."""
    return alias if alias and alias not in (info.aliases or ()) else None


def unreliable_steer_note(info, held_back: str | None = None) -> str | None:
    """What every face says of a steer version flagged unreliable (None for any other); ``held_back``: the alias
    the registration asked for and did not move (:func:`alias_held_back`)."""
    if info.metrics.get("reliable") is not False:
        return None
    moved = [a for a in info.aliases or () if a]
    alias = (f"alias {held_back!r} not moved to it (move it by hand: `vecbridge steer alias {info.name} {held_back} "
             f"{info.version}`)" if held_back else
             f"alias {', '.join(map(repr, moved))} moved to it as asked" if moved else "")
    return (f"steer {info.ref} is flagged unreliable ({info.metrics.get('unreliable_reason') or 'no reason recorded'})"
            f": registered for inspection{', ' + alias if alias else ''}; a bare name does not use it"
            f"{' unless an alias it follows points at it' if moved else ''}; it may not move results toward its "
            f"labels")


def _sha(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


def fit_and_register(registry, *, name: str, space: str, X: np.ndarray, labels, params: dict | None = None,
                     random_state: int | None = None, alias: str | None = None, items: Sequence[str] | None = None,
                     description: str = "", inputs: dict | None = None, lens_k: int = LENS_K,
                     progress: Progress | None = None, encoder: str | None = None):
    """Fit a steer on ``X`` (n, d) with ``labels`` (n,) in {-1, 0, +1} and register it in ``space`` (created with
    the version when new, ``encoder`` recorded on it).

    ``items`` (n strings: the texts, or any names of the rows) make the stored lens name the
    extreme items of each direction. ``alias`` is not moved to a steer flagged unreliable
    (:func:`alias_held_back` says so). Returns the :class:`~service.registry.SteerInfo`.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.shape[0] != X.shape[0]:
        raise PairCountError(f"labels has shape {labels.shape}, but there are {X.shape[0]} rows")
    if items is not None and len(items) != X.shape[0]:
        raise PairCountError(f"{len(items)} items for {X.shape[0]} rows")
    p = check_steer_params(params, random_state)
    steer = fit_steer_job(X, labels, params, progress, space=space, random_state=random_state)
    say = progress or silent
    say("register", 1.0)
    verdict = fit_verdict(steer.metadata)
    hashes = {"X": _sha(X.astype(np.float32)), "labels": _sha(labels.astype(np.int64)), "n": int(X.shape[0])}
    lens = steer_lens(steer, X, items, k=lens_k)
    seen = {"latest": 0}  # the newest version of ``name`` before the last try (a version after it may be this fit's)

    metrics = {**{k: v for k, v in steer.metadata.items() if k in _METRICS}, **verdict}

    def register():
        seen["latest"] = _latest_version(registry, name)
        return registry.register_steer(
            name, steer, space=space, params=p, random_state=p["random_state"], data_hashes=hashes, metrics=metrics,
            alias=_held_back(alias, verdict), description=description, inputs={**(inputs or {}), "fit_id": fit_id},
            lens=lens, encoder=encoder)

    # this fit's version, if a try that failed was committed: a newer one of the same rows, labels, options and fit
    # figures (its losses, iterations). Rows and labels alone took a concurrent fit's of other options (another
    # job's seed or alias) for this one: its steer never registered, its alias never moved. A version that matches
    # every one is the same steer of the same request.
    fit_id = uuid.uuid4().hex  # this call's own: two jobs of the same rows, labels, seed and other aliases were one
    mine_key = _same_fit(hashes, p, metrics, description, fit_id)

    def found():
        mine = [v for v in _versions(registry, name) if v.version > seen["latest"]
                and _same_fit(v.data_hashes, v.params, v.metrics, v.description,
                              (v.inputs or {}).get("fit_id")) == mine_key]
        return mine[-1] if mine else None

    # the registry away for a moment (a PostgreSQL restart) failed the fit and threw the steer away: a map fit
    # waited for it (service.registry.retry); the same waits, look-ups and Idempotency-Key rule now
    return until_registered(register, say, what=f"steer {name!r}", found=found)


def _same_fit(hashes: dict, params: dict, metrics: dict, description: str | None, fit_id: str | None) -> str:
    """What tells one steer fit's registration from another's, as the registry's JSON writes it (a NaN loss compares
    equal to itself, a numpy scalar as the plain number stored): the rows, options and figures, and the fit's own id
    (``inputs["fit_id"]``), which alone tells apart two fits of one request (the same seed, other aliases)."""
    return dumps([hashes, params, {k: metrics.get(k) for k in (*_METRICS, "reliable", "unreliable_reason")},
                  description or "", fit_id])


def _versions(registry, name: str) -> list:
    """Every version of steer ``name`` (none for a name not registered yet)."""
    try:
        return registry.list_steer_versions(name)
    except NotFoundError:
        return []


def _latest_version(registry, name: str) -> int:
    """The newest version number of steer ``name``, deleted ones included (0: none yet)."""
    return max((v.version for v in _versions(registry, name)), default=0)


def embed_and_register(registry, load_encoder: Callable, *, space: str, X: np.ndarray | None = None,
                       texts: Sequence[str] | None = None, encoder: str | None = None, items=None,
                       inputs: dict | None = None, progress: Progress | None = None, references=None, warn=None,
                       **fit):
    """:func:`fit_and_register` on ``X``, or on ``texts`` embedded with ``encoder`` (passages); registers
    ``space`` from the data when it is new (with the version, so a fit that fails leaves none), and refuses rows
    of another width than a known space's, and rows (texts embedded by another encoder than the space's) that
    look like another space (:func:`check_steer_rows`; ``references``, ``warn`` as there)."""
    if X is None:
        (progress or silent)("encode", 0.0)
        enc = load_encoder(encoder)
        X = as_matrix(np.asarray(enc.encode(list(texts), kind="passage"), dtype=np.float32), name="embeddings")
        items = texts
    try:
        info = registry.get_space(space)
    except NotFoundError:
        info = None  # created with the version, in its transaction: a fit that fails leaves no space behind
    if info is not None and X.shape[1] != info.dim:
        raise DimensionMismatchError(f"space {space!r} is {info.dim}-d, the rows have {X.shape[1]}")
    if texts is None or info is None or not info.encoder:  # texts embedded by the space's own encoder are its rows
        check_steer_rows(registry, X, space, use="fit", references=references, warn=warn,
                         name="the rows" if texts is None else f"the texts embedded by {encoder}")
    inputs = {**(inputs or {}), "rows": int(X.shape[0]), **({"encoder": encoder} if encoder else {})}
    return fit_and_register(registry, space=space, X=X, items=items, inputs=inputs, progress=progress,
                            encoder=encoder, **fit)


# --- apply, lens (eps checks, composed steers and steered queries: .steer_apply) -------------------
def steer_text_encoder(registry, space: str, encoder: str | None) -> str:
    """The encoder for texts steered in ``space``: the space's registered one, which ``encoder`` must name when given
    (texts embedded by another model of the same width were steered as the space's and exited 0), else
    ``encoder``; InputError when neither is known."""
    enc = space_encoder(space, registry.get_space(space).encoder, encoder)
    if not enc:
        raise InputError(f"texts need --encoder (space {space!r} has none registered) or vectors")
    return enc


#: how rows of another space are steered, fitted on or ranked, for the refusal (``{other}``: the space they look like)
_ROWS_FIX = {
    "fit": "if they are rows of {{other}}, fit the steer in that space (--space / space {{other}})",
    "apply": "steer them with a steer of {{other}} (one fitted there, or {ref} carried there through a map from "
             "{space!r}: `vecbridge steer transfer` / POST /v1/steers/{ref}/transfer), or map them into {space!r} "
             "first (a map from {{other}})",
    "lens": "rank rows of {space!r} (texts embedded by the space's encoder, or their vectors in it)",
}


def check_steer_rows(registry, X, space: str, *, use: str, name: str, ref: str | None = None, references=None,
                     warn: Callable[[str], None] | None = None) -> None:
    """Rows ``X`` (n, d) fitted on, steered or ranked (``use``: ``"fit"``, ``"apply"``, ``"lens"``) in ``space``
    (steer ``ref``), checked as ``transform`` and ``index add`` check theirs (:func:`service.spaces.check_rows`
    against the references of every space of their width: ``references()``, default the registry's, asked only for
    ``MEAN_CHECK_MIN_ROWS`` rows or more): rows that another space clearly recognises are a SpaceMismatchError
    naming it (a minilm steer applied to e5 rows answered with no word). ``warn(note)``: rows references exist for
    but none recognises. A fit's new space misspelling a registered one: refused (:func:`check_new_space`)."""
    X = np.asarray(X)
    if X.ndim != 2:  # refused by shape where the rows are read
        return
    refs = references or (lambda: space_references(registry, X.shape[1]))
    if use == "fit":
        check_new_space(space, X, registry.list_spaces(), refs, name=name, option="--space / space")
    check_rows(X, space, refs, name=name, fix=_ROWS_FIX[use].format(ref=ref, space=space), warn=warn)


#: why a steer refuses an all-zero row (:func:`check_steer_zero_rows`), after transform's "a zero row has no direction"
ZERO_STEERED_ROW = ("and steering it answers zeros (a mean-shift steer: its shift alone), a vector of no row's "
                    "own (a transform and a search refuse zero rows too)")


def check_steer_zero_rows(Q: np.ndarray, name: str, first: int = 0, file_rows=None) -> None:
    """DegenerateInputError naming the all-zero rows of ``Q`` (:func:`service.ops.transform.check_no_zero_rows`, in
    its words): a steer answered them with zeros, or a mean-shift steer's shift (HTTP 200, exit 0), where a
    transform refuses them."""
    check_no_zero_rows(Q, name, first, file_rows=file_rows, why=ZERO_STEERED_ROW)


def steer_file(registry, ref: str, eps: float, inp, out, *, chunk_rows: int = 65536, rows=None,
               key: str | None = None, column: str | None = None, encoder: str | None = None,
               text_field: str = "text", progress: Progress | None = None,
               warn: Callable[[str], None] | None = None) -> dict:
    """Steer the rows of file ``inp`` with steer ``ref`` at ``eps`` into file ``out``: the path of ``vecbridge
    transform`` (:func:`service.ops.transform.rows_through`), so a parquet's other columns (ids, payloads) go along
    row for row, ``rows`` / ``chunk_rows`` / ``key`` / ``column`` read as there, and a text file is embedded as
    queries with the steer's space's encoder (:func:`steer_text_encoder`). Returns ``{"steer", "eps", "rows",
    "out", "dim", "note"}`` (``note``: the input's columns ``out`` cannot hold, else None).

    The rows are checked to be the steer's space's (:func:`check_steer_rows`, ``warn`` as there): a vector file's
    first rows before anything is read, texts embedded by another encoder than the space's registered one (a space
    with none) in their first chunk, before anything is written."""
    eps = check_steer_eps(eps)
    info = registry.resolve_steer(ref)
    s = registry.load_steer(info)

    def check(X, name):
        check_steer_rows(registry, X, info.space, use="apply", ref=info.ref, name=name, warn=warn)
    text = is_text_path(inp)
    if text:
        registered = registry.get_space(info.space).encoder
        encoder = steer_text_encoder(registry, info.space, encoder)
    elif (first := first_rows(inp, rows=rows, key=key, column=column)) is not None and first.shape[1] == info.dim:
        check(first, f"the rows of {Path(inp).name}")

    file_rows = rows_of_input(inp, rows, key=key, column=column, text_field=text_field)

    def nonzero(chunks):  # all-zero rows refused, numbered as rows of the input, before their chunk is written
        done = 0
        for Q in chunks:
            check_steer_zero_rows(Q, Path(inp).name, done, file_rows)
            done += Q.shape[0]
            yield Q

    def steered(chunks):
        # texts embedded by a model the space does not name: their first MEAN_CHECK_MIN_ROWS rows checked before
        # any is written, over as many chunks as that takes (the first chunk alone: --chunk-rows 49 skipped it)
        held, seen = [], 0
        for Q in nonzero(chunks):
            if text and not registered and held is not None:
                held.append(Q)
                seen += Q.shape[0]
                if seen < MEAN_CHECK_MIN_ROWS:
                    continue
                check(np.concatenate(held), f"the texts of {Path(inp).name} embedded by {encoder}")
                yield from (apply_steer_job(H, [(s, eps)]) for H in held)
                held = None
                continue
            yield apply_steer_job(Q, [(s, eps)])
        if held:  # fewer rows in all than the check reads: nothing to tell them by (it says so)
            check(np.concatenate(held), f"the texts of {Path(inp).name} embedded by {encoder}")
            yield from (apply_steer_job(H, [(s, eps)]) for H in held)
    res = rows_through(inp, out, steered,
                       source_dim=info.dim, target_dim=info.dim, expects=f"steer {info.ref} is", chunk_rows=chunk_rows,
                       rows=rows, key=key, column=column, encoder=encoder, kind="query", text_field=text_field,
                       progress=progress, stage="steer")
    return {"steer": info.ref, "eps": eps, **res}


def steer_lens(steer, X: np.ndarray, items: Sequence[str] | None, *, k: int = 5, n_directions: int = 4) -> list:
    """Lens of ``steer`` over rows ``X`` (n, d) named by ``items``: the items at both ends of each of the
    first ``n_directions`` singular directions, ``positive`` the end that ``eps > 0`` promotes for queries like
    the rows (:meth:`align.Steer.lens` with ``queries=X``); a mean shift's one direction ``v``
    (:meth:`align.MeanShift.lens`; it was ``[]``, and ``steer lens --texts`` said "pass --texts"); ``[]`` for
    unnamed rows."""
    if items is None:
        return []
    if len(items) != np.shape(X)[0]:
        raise PairCountError("texts and X must have the same number of rows")
    if isinstance(steer, MeanShift):
        return steer.lens(X, list(items), k=k)
    return steer.lens(X, list(items), k=k, n_directions=min(int(n_directions), steer.rank), queries=X)


def describe_lens(info, steer, *, k: int = 5, n_directions: int = 4, stored: bool = True) -> dict:
    """A registered steer's singular values and its stored lens (``k`` items per end, ``n_directions``). A ``k``
    above the items stored (:data:`LENS_K` at fit time) is an InputError saying how many are (``k=50`` answered the
    5 stored without a word), unless ``stored`` is False (the caller ranks items anew)."""
    have = max((len(d.get(end) or []) for d in info.lens for end in ("positive", "negative")), default=0)
    most = max(have, LENS_K)  # fewer than LENS_K stored: every item there was (k up to LENS_K answers them all)
    if stored and info.lens and k > most:
        raise InputError(f"steer {info.ref}'s lens stores {have} items at each end of a direction (ranked at fit "
                         f"time); ask for k <= {most}, or rank texts anew (`vecbridge steer lens --texts`)")
    sigma = steer.svd()[1].tolist() if isinstance(steer, Steer) else [float(np.linalg.norm(steer.v))]
    dirs = [{**d, "positive": d.get("positive", [])[:k], "negative": d.get("negative", [])[:k]}
            for d in info.lens[:n_directions]]
    return {"steer": info.ref, "space": info.space, "sigma": sigma, "directions": dirs}


# --- registry: alias, delete, transfer ------------------------------------------------------------
def set_steer_alias(registry, name: str, alias: str, version: int, *, expected=None):
    """Point ``name@alias`` at ``version`` (``expected``: compare-and-set); returns the SteerInfo of that version."""
    return registry.set_steer_alias(name, alias, int(version), expected=expected)


def delete_steer_alias(registry, name: str, alias: str, *, expected=None) -> None:
    """Remove ``name@alias`` (NotFoundError when it is not set; ``expected``: only while it points there)."""
    registry.delete_steer_alias(name, alias, expected=expected)


def delete_steer_version(registry, name: str, version: int):
    """Soft-delete one steer version (kept for lineage, no longer resolvable): ``(record, deleted before?, the first
    delete's time)``."""
    return registry.delete_steer_version_once(name, int(version))


def bare_steer_ref(registry, name: str) -> str | None:
    """``name:N``, the version a bare ``name`` resolves to now (its live ``prod`` version, else its newest live one
    not flagged unreliable, as a bare map name), or None when it means none (no live version, or only flagged
    ones): what a delete tells its caller (deleting the version ``prod`` points at hands the bare name to the newest
    live version, which nobody promoted)."""
    try:
        return registry.resolve_steer(name).ref
    except NotFoundError:  # NoReliableVersionError too: the name means no version
        return None


def transfer_and_register(registry, steer_ref: str, map_ref: str, *, name: str | None = None,
                          alias: str | None = None, description: str = "", load_map=None, load_steer=None):
    """Carry steer ``steer_ref`` through map ``map_ref`` and register it in the map's target space (``alias`` not
    moved to a steer flagged unreliable, as :func:`fit_and_register`).

    ``name`` defaults to ``{source steer's name}-{target space}`` (the source's own name is bound to its space:
    across spaces it always conflicted); a default over the 128-character name limit is an InvalidNameError asking
    for ``name``.
    ``load_map(ref) -> (VersionInfo, LinearMap)`` and ``load_steer(ref) -> (SteerInfo, Steer)``
    let a face reuse its caches; by default the registry loads them.
    """
    s_info, steer = (load_steer or (lambda r: _steer(registry, r)))(steer_ref)
    m_info, lmap = (load_map or (lambda r: _map(registry, r)))(map_ref)
    if not isinstance(steer, Steer):
        raise InputError(f"steer {s_info.ref} is a mean-shift baseline; only W = P1 P2^T steers transfer")
    if m_info.source_space != s_info.space:
        raise InputError(f"map {m_info.ref} goes from {m_info.source_space!r}, but steer {s_info.ref} "
                         f"lives in {s_info.space!r}")
    target = m_info.target_space
    if not name:  # None or "" (as before)
        name = f"{s_info.name}-{target}"
        if len(name) > MAX_NAME:
            raise InvalidNameError(f"the default name {name[:60] + '...'!r} has {len(name)} characters, over "
                                   f"{MAX_NAME}: give the transferred steer a name")
    check_name(name, "steer name")
    if alias is not None:
        check_alias(alias)
    check_steer_space(registry, name, target)
    moved = transfer_steer(steer, lmap)
    moved.metadata["space"] = target
    verdict = _transfer_verdict(s_info, m_info)
    return registry.register_steer(
        name, moved, space=target, params={"method": "transfer", "steer": s_info.ref, "map": m_info.ref},
        metrics={"approximate": bool(moved.metadata.get("approximate")),
                 "eps_scale": float(moved.metadata.get("eps_scale", 1.0)), **verdict},
        alias=_held_back(alias, verdict), description=description,
        inputs={"via": "transfer", "steer": s_info.ref, "map": m_info.ref},
        lens=[])


def _steer(registry, ref):
    info = registry.resolve_steer(ref)
    return info, registry.load_steer(info)


def _map(registry, ref):
    v = registry.resolve(ref)
    return v, registry.load_map(v)
