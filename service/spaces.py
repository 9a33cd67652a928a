"""Which embedding space rows come from, told by their mean direction: the one check of rows against a declared space.

Embedding models share a common direction among their rows (a mean of norm 0.25 for MiniLM, 0.90 for e5) that a
batch of the same model's rows points along and another model's does not (:meth:`align.Frame.mean_cosine`). A
space's reference mean (its "fingerprint") is the training mean of a frame fitted on its rows: a registered map's
``source_frame`` (its source space's rows) or ``target_frame`` (its target's), or, for an index, a sample of the
index's own rows. Measured on WordNet: 10 e5 rows against an e5 index's mean 0.986, MiniLM rows 0.050.

The rule (:func:`judge_rows`) is relative, as a migration's always was: rows of one narrow topic can score 0.09
against their own space's reference, as another model's rows do, so a low figure alone refuses nothing. Rows are
refused only when ANOTHER known space of the same width clearly recognises them: a cosine of at least
:data:`MISMATCH_MIN_COSINE` and :data:`MISMATCH_MARGIN` above the declared space's, for a batch that shares a
direction at all (:func:`shares_direction`); a space whose registered encoder is the declared space's is not
"another" (two spaces of one model: its rows are the same rows). A true mismatch scores ~0.94 against ~0.0 (WordNet,
MiniLM <-> e5); a narrow topic of a space scored 0.22 against a general reference of the same model and 0.19 against
its own, and isotropic rows 0.34 against 0.03 by chance: both pass "unchecked by rows", as rows neither side
recognises do. Fewer than :data:`align.frames.MEAN_CHECK_MIN_ROWS` rows tell nothing and are not checked, so
batch-1 requests never pay for it.

:func:`check_rows` is what ``vecbridge index add`` / ``index search`` (and their HTTP routes), ``transform`` and
``fit`` call; :func:`service.vectordb.migrate.check_rows_space` applies :func:`judge_rows` to a collection's first
rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import numpy as np

from align.exceptions import InputError, VecbridgeError
from align.frames import (
    MEAN_CHECK_MIN_NORM,
    MEAN_CHECK_MIN_ROWS,
    SAME_SPACE_CHECKED_COSINE,
    SAME_SPACE_MIN_COSINE,
    Frame,
    mean_sum,
    unit_rows,
)
from align.validation import as_matrix

__all__ = [
    "MISMATCH_MARGIN",
    "MISMATCH_MIN_COSINE",
    "SPACE_SAMPLE_ROWS",
    "Reference",
    "RowsCheck",
    "SpaceMismatchError",
    "Verdict",
    "check_fit_spaces",
    "check_pair_spaces",
    "check_rows",
    "index_frame",
    "judge_rows",
    "map_references",
    "shares_direction",
    "space_references",
]

#: rows looked at (the first ones): a collection's first rows, a file's first block; an index's rows sampled
SPACE_SAMPLE_ROWS = 1000
#: another space's reference refuses rows only from this cosine up (its own rows give 0.84-1.00, a narrow topic of a
#: related space or chance 0.2-0.35)
MISMATCH_MIN_COSINE = 0.5
#: ... and only this far above the declared space's figure (a true mismatch: ~0.94 against ~0.0)
MISMATCH_MARGIN = 0.3


class SpaceMismatchError(InputError):
    """Rows, a collection or a map in another embedding space than the one declared (e.g. a map the wrong way);
    ``looks_like``: the space rows look like, where :func:`check_rows` told it."""

    looks_like: str | None = None


@dataclass(frozen=True)
class Reference:
    """A space's reference mean: ``frame`` fitted on rows of ``space``; ``what`` names it in messages."""

    space: str | None
    frame: Frame
    what: str
    encoder: str | None = None  #: the space's registered encoder (None: not recorded)


@dataclass(frozen=True)
class Verdict:
    """What :func:`judge_rows` found: ``own`` the rows' cosine with the declared space's best reference (None:
    nothing to tell by), ``other`` the reference of another space that recognises them better (a mismatch) with its
    cosine ``other_cos``, ``seen`` every other reference's figure."""

    own: float | None
    other: Reference | None = None
    other_cos: float | None = None
    seen: list = field(default_factory=list)

    @property
    def checked(self) -> bool:
        return self.own is not None and self.own >= SAME_SPACE_CHECKED_COSINE

    @property
    def maybe_other_model(self) -> bool:
        """Recognised only as a related model's rows are (or one narrow topic of the space's own): between
        :data:`~align.frames.SAME_SPACE_MIN_COSINE` and :data:`~align.frames.SAME_SPACE_CHECKED_COSINE`."""
        return self.own is not None and SAME_SPACE_MIN_COSINE <= self.own < SAME_SPACE_CHECKED_COSINE


class _Rows:
    """Rows ``V`` (n, d) and their :func:`~align.frames.mean_sum` (one per ``unit_in``), made once for every frame
    that judges them (a check against its own and another space's frames summed the rows again for each frame).
    ``finite``: refuse NaN / Inf as :meth:`~align.frames.Frame.mean_cosine` does (False: the caller dropped them)."""

    __slots__ = ("V", "_sums")

    def __init__(self, V, name: str, *, finite: bool = True):
        self.V = as_matrix(V, name=name, finite=finite) if len(V) else np.asarray(V)
        self._sums: dict[bool, tuple[np.ndarray, int]] = {}

    def cosine(self, frame: Frame) -> float | None:
        """:meth:`~align.frames.Frame.mean_cosine` of the rows; None also for a frame of another width."""
        if frame.dim != self.V.shape[1] or frame.mean is None:
            return None
        if (unit := frame.unit_in) not in self._sums:
            self._sums[unit] = mean_sum(self.V, unit_in=unit)
        return frame.sum_cosine(*self._sums[unit])


def _cosine(frames: Sequence[Frame], rows: _Rows) -> float | None:
    return max((c for f in frames if (c := rows.cosine(f)) is not None), default=None)


def shares_direction(V: np.ndarray) -> bool:
    """Whether the rows ``V`` (n, d) share a direction beyond chance: the norm of the mean of their non-zero unit rows
    at least :data:`MEAN_CHECK_MIN_NORM` and above what ``n`` isotropic unit rows give by chance (``|m|^2 ~ chi2_d /
    (n d)``; the bound ``(d + 6 sqrt(2d)) / (n d)``, about ``1.2-1.6 / sqrt(n)`` for d 32-384, is passed by one
    isotropic batch in 500 at d=1, in 10,000 at d=8, in 180,000 at d=32). Isotropic
    rows (``~1/sqrt(n)``) have none, so their cosine with any reference is chance (0.34 at d=32 one batch in twenty);
    WordNet MiniLM batches of 50 rows have 0.25-0.29 (the bound there: 0.17; ``3 / sqrt(n)``, 0.42, would let
    another model's batches of MiniLM rows under ~150 pass unrefused), e5's 0.90."""
    U = unit_rows(np.asarray(V, np.float64))
    U = U[np.any(U != 0, axis=1)]
    n, d = U.shape
    if n == 0:
        return False
    norm = float(np.linalg.norm(U.mean(axis=0)))
    return norm >= MEAN_CHECK_MIN_NORM and norm * norm * n * d >= d + 6.0 * np.sqrt(2.0 * d)


def judge_rows(V: np.ndarray, own: Sequence[Frame], others: Sequence[Reference], *, name: str = "rows") -> Verdict:
    """The rule: the rows ``V`` (n, d; finite) against the declared space's reference frames ``own`` and other
    spaces' references ``others`` (those of another width are passed over). ``own`` recognises them
    (``>= SAME_SPACE_CHECKED_COSINE``): checked, the others are not read. Below, another space whose reference gives at
    least :data:`MISMATCH_MIN_COSINE` and :data:`MISMATCH_MARGIN` more than ``own``, for rows that share a direction
    (:func:`shares_direction`), is the mismatch; else nothing decided (a narrow topic, a related model, chance, a
    model none of them knows). ``own`` None (no reference, too few rows, no common direction): nothing decided."""
    rows = V if isinstance(V, _Rows) else _Rows(V, name)
    V = rows.V
    c_own = _cosine(own, rows) if len(V) else None
    if c_own is None or c_own >= SAME_SPACE_CHECKED_COSINE:
        return Verdict(c_own)
    seen = [(r, c) for r in others if (c := rows.cosine(r.frame)) is not None]
    best = max(seen, key=lambda rc: rc[1], default=None)
    if (best is not None and best[1] >= max(MISMATCH_MIN_COSINE, c_own + MISMATCH_MARGIN)
            and shares_direction(V)):
        return Verdict(c_own, best[0], best[1], seen)
    return Verdict(c_own, seen=seen)


def _recognised(rows: _Rows, others: Sequence[Reference]) -> bool:
    """Whether any of ``others`` could refuse the rows (:data:`MISMATCH_MIN_COSINE` or more)."""
    return any((c := rows.cosine(r.frame)) is not None and c >= MISMATCH_MIN_COSINE for r in others)


def _usable(frame: Frame) -> bool:
    """A mean that is the space's common direction, not noise: at least :data:`MEAN_CHECK_MIN_NORM` and three times
    the norm ``1/sqrt(n_fit)`` of the mean of as many random unit rows (frames of 100 isotropic rows have means of
    ~0.1 by chance, and told synthetic rows apart by it; ``n_fit`` 0: an artifact that does not record it)."""
    if frame.mean is None:
        return False
    mu = frame.mean.astype(np.float64)
    norm = math.sqrt(mu @ mu)
    return norm >= MEAN_CHECK_MIN_NORM and (frame.n_fit == 0 or norm >= 3.0 / np.sqrt(frame.n_fit))


def space_references(registry, dim: int | Collection[int]) -> dict[str, list[Reference]]:
    """``{space: [Reference]}``: the references of each space of width ``dim`` (or of any of the widths ``dim``
    holds: a space has one width, so the rows' own pick theirs) that a live map touches, the frame of the side of
    each such map in the space (its path version: the alias's, else the newest reliable one; maps with neither are
    passed over, as is a frame without a common direction), with the space's registered encoder; the oldest map's
    first. One artifact read per map at most: a fit asks for both its sides' widths in one call, not one call (and
    read) per side.

    A reference that disagrees with its space's others is left out (:func:`_agreeing`): the first map by name used
    to be the space's only reference, so one fit of another model's rows under a space's name (``bad`` before
    ``good``) made that model's rows pass as the space's and the space's own rows "unchecked"."""
    dims = set(dim) if isinstance(dim, Collection) else {int(dim)}
    out: dict[str, list[Reference]] = {}
    encoders = {s.name: s.encoder for s in registry.list_spaces() if s.dim in dims}
    maps = sorted(registry.list_maps(), key=lambda m: (str(m.get("created_at") or ""), m["name"]))
    for m in maps:
        version = m.get("path_version")
        if version is None:
            continue
        need = [side for side in ("source", "target") if m.get(f"{side}_dim") in dims and m.get(f"{side}_space")]
        if not need:
            continue
        try:
            map_ = registry.load_map(f"{m['name']}:{version}")
        except VecbridgeError:  # a damaged artifact: `registry verify` says so; no reference from it
            continue
        for side in need:
            frame = getattr(map_, f"{side}_frame")
            if frame.dim in dims and _usable(frame):
                space = m[f"{side}_space"]
                out.setdefault(space, []).append(Reference(space, frame, f"map {m['name']}:{version}'s {side} side",
                                                           encoders.get(space)))
    return _agreeing(out)


def _mean_cosines(refs: Sequence[Reference]) -> np.ndarray:
    """The cosines of the references' means, all pairs in one product: ``-inf`` where two are of other widths (or a
    reference with itself), so that a ``max`` over a row passes them over; ``-inf`` alone: nothing to compare."""
    C = np.full((len(refs), len(refs)), -np.inf)
    for dim in {r.frame.dim for r in refs}:
        at = np.array([i for i, r in enumerate(refs) if r.frame.dim == dim])
        U = np.stack([refs[i].frame.mean.astype(np.float64) for i in at])
        U /= np.linalg.norm(U, axis=1, keepdims=True)  # _usable: every norm at least MEAN_CHECK_MIN_NORM
        C[np.ix_(at, at)] = U @ U.T
    np.fill_diagonal(C, -np.inf)
    return C


def _agreeing(refs: dict[str, list[Reference]]) -> dict[str, list[Reference]]:
    """``refs`` without the references that look like another space's, by :func:`judge_rows`'s rule applied to their
    means: recognised by no other reference of their own space (below ``SAME_SPACE_CHECKED_COSINE``) and by another
    space's at least :data:`MISMATCH_MIN_COSINE` and :data:`MISMATCH_MARGIN` above (a map fitted on e5 rows declared
    'minilm' beside a MiniLM map: 0.06 against 0.99). A space's lone reference is kept: nothing to tell it by.
    Every pair's cosine in one matrix product (:func:`_mean_cosines`): a cosine per pair in Python made each fit
    request's check quadratic in the registered maps (113 maps: 50,850 pairs, 0.2 s of the request)."""
    flat = [r for rs in refs.values() for r in rs]
    if not flat:
        return {space: [] for space in refs}
    C = _mean_cosines(flat)
    spaces = np.array([space for space, rs in refs.items() for _ in rs], dtype=object)
    encoders = np.array([r.encoder for r in flat], dtype=object)
    kept: dict[str, list[Reference]] = {}
    for space, rs in refs.items():
        encoder = next((r.encoder for r in rs if r.encoder), None)
        mine = spaces == space
        others = ~mine & ((encoders != encoder) if encoder else True)
        rows = C[mine]
        own = rows[:, mine].max(axis=1, initial=-np.inf)
        other = rows[:, others].max(axis=1, initial=-np.inf)
        drop = ((own > -np.inf) & (other > -np.inf) & (own < SAME_SPACE_CHECKED_COSINE)
                & (other >= np.maximum(MISMATCH_MIN_COSINE, own + MISMATCH_MARGIN)))
        kept[space] = [r for r, d in zip(rs, drop) if not d]
    return kept


def index_frame(idx, rows: int = SPACE_SAMPLE_ROWS, *, wait: bool = True) -> Frame | None:
    """A frame fitted on up to ``rows`` of index ``idx``'s own rows (evenly spaced among its live ids), None when it
    holds fewer than :data:`MEAN_CHECK_MIN_ROWS`. O(live ids + rows x dim). ``wait=False`` (the event loop's fast
    path): :class:`~service.indexes.locking.WouldBlock` instead of waiting for a writer of the index."""
    from .indexes.kinds import live_ids

    with idx.lock.read(blocking=wait):
        ids = live_ids(idx.index, idx.kind, idx.tombstones)
        if len(ids) < MEAN_CHECK_MIN_ROWS:
            return None
        pick = np.sort(ids)[np.linspace(0, len(ids) - 1, min(rows, len(ids))).astype(np.int64)]
        X = np.vstack([idx.index.reconstruct(int(i)) for i in pick]).astype(np.float32)
    frame = Frame.fit(X, name=f"index {idx.name!r} rows")
    return frame if _usable(frame) else None


@dataclass(frozen=True)
class RowsCheck:
    """``state``: ``"checked"`` (the declared space's reference recognises the rows), ``"weak"`` (it recognises them
    only weakly, :data:`~align.frames.SAME_SPACE_MIN_COSINE` to :data:`~align.frames.SAME_SPACE_CHECKED_COSINE`: one
    narrow topic of the space's own, or a related model's rows; no warning, too common for the first), ``"undecided"``
    (references exist but none recognises them: one narrow topic, or another model; :attr:`warning` says so) or
    ``"unknown"`` (nothing to tell by: too few rows, no reference of the space); ``note`` says how it went."""

    state: str
    note: str
    cosine: float | None = None  #: the rows' cosine with the declared space's reference (None: nothing to tell by)

    @property
    def warning(self) -> str | None:
        return self.note if self.state == "undecided" else None


def check_rows(V, space: str, references: dict[str, list[Reference]] | Callable[[], dict], *, name: str = "the rows",
               fix: str = "", own_extra: Callable[[], Frame | None] | None = None,
               warn: Callable[[str], None] | None = None) -> RowsCheck:
    """The rows ``V`` (n, d) declared of ``space`` against ``references`` (:func:`space_references`, or a callable
    giving them: not called for fewer than :data:`MEAN_CHECK_MIN_ROWS` rows); only the first
    :data:`SPACE_SAMPLE_ROWS` finite rows are read. Raises :class:`SpaceMismatchError` when another space's
    reference recognises them (:func:`judge_rows`), naming that space, the figures and ``fix`` (how the caller
    declares or changes the space). ``own_extra()``: another reference of ``space`` (an index's own rows), fitted
    only when the registry's alone would refuse or cannot tell. References of a space whose encoder is
    ``space``'s (both recorded) are not another space's: the same model's rows. ``warn(note)``: called with the
    check's :attr:`~RowsCheck.warning` when it has one (references exist but none recognises the rows: they go on)
    — the callers' "warn, do not refuse" in one place."""
    found = _check_rows(V, space, references, name=name, fix=fix, own_extra=own_extra)
    if found.warning and warn is not None:
        warn(found.warning)
    return found


def _check_rows(V, space: str, references, *, name: str, fix: str, own_extra) -> RowsCheck:
    """:func:`check_rows` but for its ``warn``."""
    V = np.asarray(V)[:SPACE_SAMPLE_ROWS]
    if V.ndim != 2 or V.shape[0] < MEAN_CHECK_MIN_ROWS:
        return RowsCheck("unknown", f"unchecked: fewer than {MEAN_CHECK_MIN_ROWS} rows to tell their space by")
    finite = np.isfinite(V).all(axis=1)  # NaN rows are refused by name where they are read
    rows = _Rows(V if finite.all() else V[finite], name, finite=False)  # no copy of rows all finite
    refs = references() if callable(references) else references
    own = [r.frame for r in refs.get(space, []) if _usable(r.frame)]
    encoder = next((r.encoder for r in refs.get(space, []) if r.encoder), None)
    others = [r for s, rs in sorted(refs.items()) if s != space for r in rs
              if _usable(r.frame) and not (encoder and r.encoder == encoder)]
    verdict = judge_rows(rows, own, others, name=name)
    if own_extra is not None and (verdict.other is not None or verdict.own is None and _recognised(rows, others)):
        extra = own_extra()  # only where a refusal is in question: a search of 64 queries does not pay for it
        if extra is not None:
            own = [*own, extra]
            verdict = judge_rows(rows, own, others, name=name)
    if verdict.checked:
        return RowsCheck("checked", f"checked by rows: mean direction cosine {verdict.own:.2f} with space "
                                    f"{space!r}'s reference", verdict.own)
    if verdict.other is not None:
        err = SpaceMismatchError(
            f"{name} look like space {verdict.other.space!r}, not {space!r}: their mean direction has cosine "
            f"{verdict.other_cos:.2f} with {verdict.other.space!r} ({verdict.other.what}) but {verdict.own:.2f} with "
            f"{space!r} (rows of a space give about 0.9 with its own)"
            + (f"; {fix.format(other=verdict.other.space)}" if fix else ""))
        err.looks_like = verdict.other.space
        raise err
    if verdict.own is None:
        return RowsCheck("unknown", f"unchecked: no reference of space {space!r} to compare {name} with (no map "
                                    f"from or into it)" if not own else
                                    f"unchecked: {name} share no common direction to compare")
    figures = ", ".join(f"{c:.2f} with {r.space!r}" for r, c in verdict.seen)
    if verdict.maybe_other_model:  # "weak": no warning line (a review: one narrow topic of the space's own scores
        # here in 12-73 % of batches of 1,000-50 rows, so a warning would fire on most topical batches); migrations
        # say "unchecked ... may be from another model" in their report (check_rows_space), once per run
        return RowsCheck("weak", f"{name} are recognised only weakly: mean direction cosine {verdict.own:.2f} with "
                                 f"space {space!r}'s reference" + (f" ({figures})" if figures else "") + ", where a "
                                 f"mixed batch of the space's rows gives ~0.9 and one narrow topic of them 0.17-0.78 "
                                 f"(below {SAME_SPACE_CHECKED_COSINE}: one topic, or a related model's rows, which "
                                 f"score 0.25-0.39)", verdict.own)
    return RowsCheck("undecided", f"{name} are unchecked by rows: mean direction cosine {verdict.own:.2f} with "
                                  f"space {space!r}'s reference" + (f" ({figures})" if figures else "")
                                  + f", below {SAME_SPACE_MIN_COSINE}: rows of one narrow topic, or of a model the "
                                  f"registry does not know", verdict.own)


def map_references(v, map_) -> dict[str, list[Reference]]:
    """``{space: [Reference]}`` of one map's two sides: ``map_``'s source and target frames under ``v``'s (its
    VersionInfo) source and target spaces; what ``transform`` and ``eval`` check rows against (no registry read)."""
    return {space: [Reference(space, frame, f"map {v.ref}'s {side} side")]
            for side, space, frame in (("source", v.source_space, map_.source_frame),
                                       ("target", v.target_space, map_.target_frame))}


def check_pair_spaces(X: np.ndarray, Y: np.ndarray, source_space: str, target_space: str,
                      references: dict[str, list[Reference]] | Callable[[], dict], *, fix: dict[str, str],
                      swapped: str, after: str = "") -> list[str]:
    """Source rows ``X`` against ``source_space`` and target rows ``Y`` against ``target_space`` (:func:`check_rows`
    with ``references``, a dict or a callable called once at most). Both looking like the other side's space: the
    files look swapped (SpaceMismatchError saying so, ``swapped`` what that would do, ``after`` closing it); one side
    looking like another
    space: that side's error, with ``fix[side]``. Returns the warnings of sides references exist for but that none
    recognises. The rule of ``fit`` and ``eval``."""
    errors, notes, refs = {}, [], {}

    def once() -> dict:  # both sides' references from one call, made once (by the first side of 50+ rows)
        if not refs:
            refs["all"] = references() if callable(references) else references
        return refs["all"]
    for side, M, space in (("source", X, source_space), ("target", Y, target_space)):
        try:
            check_rows(M, space, once, name=f"the {side} rows", fix=fix[side], warn=notes.append)
        except SpaceMismatchError as e:
            errors[side] = e
    if {"source", "target"} <= errors.keys() and (errors["source"].looks_like, errors["target"].looks_like) == (
            target_space, source_space):
        err = SpaceMismatchError(
            f"the files look swapped: the source rows look like space {target_space!r} and the target rows like "
            f"{source_space!r} ({swapped}); give the {source_space!r} rows as the source and the {target_space!r} "
            f"ones as the target{'; ' + after if after else ''}. {errors['source']}")
        err.looks_like = target_space
        raise err
    for e in errors.values():
        raise e
    return notes


def check_fit_spaces(registry, X: np.ndarray, Y: np.ndarray, source_space: str, target_space: str,
                     unpaired: dict | None = None) -> list[str]:
    """A fit's source rows ``X`` against ``source_space`` and target rows ``Y`` against ``target_space``
    (:func:`check_pair_spaces` with the registry's references, both sides' widths read in one call), then its
    ``unpaired`` sets (``{"unpaired_source": U, "unpaired_target": V}``, either or none) by the same rule
    (:func:`check_rows`) against their side's space, with this fit's own sides as references too: rows of the
    other side's model given as ``--unpaired-source`` were fitted into the source frame, which then served as the
    space's reference. Returns the warnings of sides references exist for but that none recognises. A side whose
    space the fit would create, a misspelling of a registered one by name and rows, is refused first
    (:func:`service.space_names.check_new_space`)."""
    from .space_names import check_new_space  # it builds on this module's check_rows

    got: dict = {}

    def refs() -> dict:  # both sides' widths in one call, made once
        if not got:
            got["all"] = space_references(registry, {X.shape[1], Y.shape[1]})
        return got["all"]
    registered = registry.list_spaces()
    for side, M, space in (("source", X, source_space), ("target", Y, target_space)):
        check_new_space(space, M, registered, refs, name=f"the {side} rows",
                        option=f"--{side}-space / {side}_space")
    notes = check_pair_spaces(
        X, Y, source_space, target_space, refs,
        fix={side: f"if they are rows of {{other}}, say so ({option} {{other}}), or swap the files"
             for side, option in (("source", "--source-space / source_space"),
                                  ("target", "--target-space / target_space"))},
        swapped=f"a map fitted on them would go {target_space} -> {source_space} under the name of "
                f"{source_space} -> {target_space}")
    sides = {"source": (X, source_space), "target": (Y, target_space)}

    def with_sides() -> dict:  # the registry's and this fit's own (a first fit has only its own), made once
        if "sides" not in got:
            got["sides"] = {s: list(rs) for s, rs in refs().items()}
            for side, (M, space) in sides.items():
                got["sides"].setdefault(space, []).append(Reference(space, Frame.fit(M, name=side),
                                                                    f"this fit's {side} rows"))
        return got["sides"]
    for key, U in (unpaired or {}).items():
        side = key.split("_", 1)[1]
        M, space = sides[side]
        other = "target" if side == "source" else "source"
        check_rows(U, space, with_sides, name=f"the unpaired {side} rows",
                   fix=f"unpaired {side} rows are more rows of the {side} model beside the pairs: give {space!r} "
                       f"rows as --unpaired-{side} / unpaired_{side} (rows of the {other} model, "
                       f"{sides[other][1]!r}, go in --unpaired-{other} / unpaired_{other})",
                   own_extra=lambda M=M, side=side: Frame.fit(M, name=side), warn=notes.append)
    return notes
