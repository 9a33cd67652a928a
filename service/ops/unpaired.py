"""The unpaired rest of a paired fit, for every face: more rows of one model beside the pairs (the whole old corpus,
new-model queries), :func:`align.fit_migration`'s ``unpaired_source`` / ``unpaired_target``.

They shape the side's frame (unit, centre, unit), compete as the rest of the corpus in the held-out selection, give
the contrastive fit its hard negatives and the cluster family its routing, and (both given) let
``semi_supervised="sinkhorn"`` refine the map. Only the migration methods (``auto``, ``contrastive``, ``cluster``:
:func:`align.fit_migration`) use them; the service's ``procrustes`` / ``ridge`` / ``lowrank`` are closed-form fits of
the pairs alone and minivec2vec fits unpaired sets of its own, so those refuse them rather than drop them silently.
"""

from __future__ import annotations

import numpy as np

from align.exceptions import DimensionMismatchError, InputError
from align.validation import as_matrix

from .plans import MIGRATION_METHODS

__all__ = ["UNPAIRED", "check_unpaired", "check_unpaired_method"]

#: the keys (``run_fit`` / the HTTP body / the fitted map's lineage) of the two unpaired sets
UNPAIRED = ("unpaired_source", "unpaired_target")


def check_unpaired_method(method: str, given: list[str], *, method_label: str = "method") -> None:
    """InputError when ``given`` (the names the user gave them by: ``--unpaired-source``, ``unpaired_target``...)
    is not empty and ``method`` cannot use unpaired rows."""
    if not given or method in MIGRATION_METHODS:
        return
    if method == "minivec2vec":
        why = "minivec2vec fits from two unpaired sets already: give all the rows as the source and the target"
    else:
        why = (f"{method} here is a closed-form fit of the pairs alone; {method_label} auto (narrowed to one family "
               f"with the parameter candidates, e.g. candidates=[\"procrustes\"]) fits its frames with them")
    raise InputError(f"{' and '.join(given)}: the unpaired rows apply to {method_label} "
                     f"{', '.join(MIGRATION_METHODS)} (align.fit_migration); {why}")


def check_unpaired(widths: tuple[int, int], names: dict[str, str] | None = None, **unpaired) -> dict:
    """The given unpaired sets (``unpaired_source=``, ``unpaired_target=``; None: not given) as checked float32
    matrices, keyed as given: each of its side's width (``widths``: the source's and the target's; the same model's
    rows), finite, at least one row. ``names``: what the errors call each (default: its key)."""
    out = {}
    for key, width, side in zip(UNPAIRED, widths, ("source", "target")):
        U = unpaired.pop(key, None)
        if U is None:
            continue
        name = (names or {}).get(key, key)
        if isinstance(U, np.ndarray) and U.ndim == 2 and U.shape[1] != width:
            raise DimensionMismatchError(f"{name}: rows of {U.shape[1]} columns, but the {side} rows have "
                                         f"{width}: unpaired {side} rows come from the {side} model")
        out[key] = as_matrix(U, name=name, dim=int(width))
    if unpaired:
        raise TypeError(f"unknown unpaired set(s) {sorted(unpaired)}")
    return out
