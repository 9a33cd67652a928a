"""A misspelt space: the one refusal of a fit or steer fit that would create a space whose name is a near miss of a
registered space's name AND whose rows that space's reference recognises as its own.

QA (session 55): POST /v1/fits with ``source_space: "minlm"`` for MiniLM rows created space 'minlm' (spaces are
created on first use); a map then used it, so it could never be deleted, and later checks advised the typo. Both
signs are needed: rows alone are no typo (a fine-tuned model, 'minilm-ft', gives rows of cosine 0.96 with minilm's,
and test fixtures fit synthetic rows under names like 'new' beside 'new_pairs'), and a name alone is none either
(rows no space recognises are a new model's). A fit from a space into itself is not this check's business.

:func:`near_miss` is the name rule, :func:`check_new_space` the check (rows by :func:`service.spaces.check_rows`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from align.frames import MEAN_CHECK_MIN_ROWS

from .spaces import Reference, SpaceMismatchError, check_rows

__all__ = ["MisspeltSpaceError", "check_new_space", "folded", "name_distance", "near_miss"]

#: what a name may hold besides letters and digits (:func:`service.registry.names.check_name`): ignored by the rule
SEPARATORS = frozenset("._->")


class MisspeltSpaceError(SpaceMismatchError):
    """A space a fit would create is most likely a misspelling of ``looks_like`` (422 / exit 2)."""


def folded(name: str) -> str:
    """``name`` as the rule compares it: case folded, separators ('.', '_', '-', '>') dropped."""
    return "".join(ch for ch in name.casefold() if ch not in SEPARATORS)


def name_distance(a: str, b: str) -> int:
    """The Damerau-Levenshtein distance (optimal string alignment) of ``a`` and ``b``: the fewest insertions,
    deletions, substitutions and swaps of two adjacent characters that make one the other."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[len(b)]


def near_miss(new: str, known: str) -> int | None:
    """The distance of ``new`` from ``known`` when it is a near miss of it, else None: 0 when they differ only in
    case or separators (``MiniLM``, ``mini-lm`` for ``minilm``), else the :func:`name_distance` of their
    :func:`folded` forms when it is 1 and the shorter of them has 4 characters or more, or 2 and it has 8 or more.
    ``minlm`` is 1 from ``minilm``; ``minilm-ft`` (2) and ``new`` beside ``new_pairs`` (5) are no near misses, and a
    name is none of itself."""
    if new == known:
        return None
    a, b = folded(new), folded(known)
    if a == b:
        return 0
    shorter = min(len(a), len(b))
    allowed = 2 if shorter >= 8 else 1 if shorter >= 4 else 0
    if not allowed or abs(len(a) - len(b)) > allowed:
        return None
    d = name_distance(a, b)
    return d if d <= allowed else None


def check_new_space(space: str, V, registered: Iterable, references: dict[str, list[Reference]] | Callable[[], dict],
                    *, name: str = "the rows", option: str = "the space's name", add: str = "",
                    by: str = "a fit") -> None:
    """Rows ``V`` (n, d) that a fit or steer fit would register as the new space ``space``: refused
    (:class:`MisspeltSpaceError`) when ``space`` is a :func:`near_miss` of a registered space's name of their width
    and :func:`~service.spaces.check_rows` finds them that space's rows ("checked": its reference recognises them,
    ``references`` as there). ``registered``: the registry's spaces (SpaceInfo: ``name``, ``dim``); a registered
    ``space`` passes (registering it first is how rows of a new model near a known name go in), as do fewer than
    :data:`~align.frames.MEAN_CHECK_MIN_ROWS` rows. ``option``: how the caller's user names the space; ``add``: more
    options of the ``spaces add`` the refusal advises (``embed --space``: the encoder, which that path needs); ``by``:
    what would create the space (``embed --space`` said "a fit would create it")."""
    spaces = {s.name: s.dim for s in registered}
    V = np.asarray(V)
    if space in spaces or V.ndim != 2 or V.shape[0] < MEAN_CHECK_MIN_ROWS:
        return
    near = sorted((d, s) for s, dim in spaces.items() if dim == V.shape[1] and (d := near_miss(space, s)) is not None)
    for d, other in near:
        try:
            found = check_rows(V, other, references, name=name)
        except SpaceMismatchError:  # rows of a third space: not ``other``'s (the caller's own check says the rest)
            continue
        if found.state != "checked":
            continue
        same = ": only case or separators differ" if d == 0 else ""
        err = MisspeltSpaceError(
            f"space {space!r} is not registered ({by} would create it), but its name is a near miss of the registered "
            f"space {other!r} (name distance {d}{same}) and {other!r}'s reference recognises {name} as its own (mean "
            f"direction cosine {found.cosine:.2f}; rows of a space give about 0.9 with its own): a misspelling? Use "
            f"{other!r} ({option}); if they are rows of a new space (another or a fine-tuned model), register "
            f"{space!r} first: `vecbridge spaces add {space} --dim {V.shape[1]}{add}` / POST /v1/spaces")
        err.looks_like = other
        raise err
