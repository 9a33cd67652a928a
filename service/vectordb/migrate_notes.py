"""What a migration (:func:`service.vectordb.migrate`) says besides its figures: the warnings of its report, and the
refusal of a batch holding rows no map can place (:func:`check_vectors`)."""

from __future__ import annotations

import numpy as np

from align.exceptions import DegenerateInputError, NonFiniteError

__all__ = ["LOCAL_QDRANT_SLOW", "NORMS_DROPPED", "NULLS_DROPPED_BEFORE", "SOURCE_CHANGED", "SOURCE_CHANGED_SINCE",
           "check_vectors",
           "metric_notes"]


#: what a run resumed from a checkpoint of a release that dropped explicit nulls (no ``"nulls"`` key) says
NULLS_DROPPED_BEFORE = ("the rows up to id {last} were written by a vecbridge that dropped explicit nulls (a Qdrant "
                        "payload key or Milvus dynamic field holding null arrived absent); later rows keep them. For a "
                        "uniform target remove the checkpoint and run again with --overwrite")


#: what a run says when the source and the target differ in rows at the end (the source changed during the migration)
SOURCE_CHANGED = ("{source!r} now holds {n_src} rows and {target!r} {n_tgt}: rows written to (or deleted from) the "
                  "source during the migration at ids its scan had passed did not travel; `vecbridge verify --source "
                  "{source} --map ...` names them")


#: what a dry run on a Qdrant local-mode folder says (qdrant-client's embedded engine writes slowly; measured by a QA)
LOCAL_QDRANT_SLOW = ("Qdrant local mode (qdrant:///DIR) writes slowly: 20,000 rows took ~437 s to migrate (~20 s on "
                     "Milvus or pgvector), so the writes will dwarf this estimate; a Qdrant server is much faster")


#: what a migration of a collection that does not rank by cosine says (the map writes unit rows)
NORMS_DROPPED = ("{source!r} ranks by {ranks} ({metric}), which reads the rows' norms; the map writes unit rows, so "
                 "those norms are not carried: {target!r} ({target_metric}) ranks its rows as cosine would")
RANKS = {"ip": "inner product", "l2": "L2 distance"}


def metric_notes(source: str, target: str, src_metric: str, tgt_metric: str) -> list[str]:
    """The warning of a source whose ranking reads the norms the map drops (and of a target that ranks otherwise)."""
    if src_metric == "cosine":
        return []
    note = NORMS_DROPPED.format(source=source, ranks=RANKS.get(src_metric, "its own metric"), metric=src_metric,
                                target=target, target_metric=tgt_metric)
    if tgt_metric != src_metric:
        note += (f"; its metric is {tgt_metric}, not the source's {src_metric} (this engine adapter creates cosine "
                 "or ip collections): searches that name a metric must name cosine")
    return [note]


#: what a rerun of a finished migration says when the source holds another number of rows than the target now
SOURCE_CHANGED_SINCE = ("{source!r} holds {n_src} rows and {target!r} {n_tgt}: the source changed after this migration "
                        "finished (or during it), and the target does not have those changes")


def check_vectors(source: str, batch) -> None:
    """NonFiniteError naming the rows holding NaN, Inf or NULL; DegenerateInputError naming the all-zero rows."""
    bad = ~np.isfinite(batch.vectors).all(axis=1)
    if bad.any():  # the map's own check would say "X: 1 row(s)", not which rows of which collection
        raise NonFiniteError(f"{source!r}: {int(bad.sum())} stored vector(s) with NaN or Inf (or none: "
                             f"NULL), ids "
                             f"{batch.ids[bad][:10].tolist()}; fix or delete them, then run the same command "
                             "again to resume")
    zero = ~np.any(batch.vectors != 0, axis=1)
    if zero.any():  # the map gave them a made-up direction (its frame's mean), which then ranked like a real row
        raise DegenerateInputError(f"{source!r}: {int(zero.sum())} stored zero vector(s) (every value 0: a \"no "
                                   f"embedding\" placeholder?), ids {batch.ids[zero][:10].tolist()}; a zero vector "
                                   "has no direction, so no map can place it: embed or delete them, then run the "
                                   "same command again to resume")
