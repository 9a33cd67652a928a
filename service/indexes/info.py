"""What an index answers about itself (:class:`IndexInfo`: ``GET /v1/indexes/{name}``, ``vecbridge index show``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["IndexInfo"]


@dataclass
class IndexInfo:
    """An index: its space, row width, kind, metric, live rows, FAISS parameters, times (epoch s), description.

    The API's ``IndexOut`` schema is derived from these fields.
    """

    name: str
    space: str
    dim: int
    kind: str
    metric: str
    count: int
    params: dict[str, Any]
    created_at: float
    updated_at: float
    description: str = ""
    generation: int = field(default=0, metadata={
        "doc": "The generation on disk this answer comes from (0: never persisted); it grows with every write."})
    logged_deltas: int = field(default=0, metadata={
        "doc": "Changes logged since that generation's snapshot (0: it is a snapshot); a snapshot is written once "
               "the log passes a quarter of the snapshot's rows (at least 1,024) or 64 deltas."})

    def to_dict(self) -> dict:
        return dict(self.__dict__)
