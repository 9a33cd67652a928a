"""A pgvector table's vector index as vecbridge builds it and searches it.

- :func:`search_operator` — the distance operator a search orders by: the one its index's operator class serves
  (``<->`` for ``vector_l2_ops``, ``<#>`` for ``vector_ip_ops``, ``<=>`` for ``vector_cosine_ops``) where that
  ranks as the table's metric does, else the metric's own. pgvector walks an index only for its own operator: a
  cosine target that kept its L2 source's ``vector_l2_ops`` index (so the source's ``<->`` queries keep it after
  the alias switch) was searched with ``<=>``, an exact scan of every row. On unit rows (what a map writes) L2 and
  inner product rank as cosine does; the score stays the metric's own.
"""

from __future__ import annotations

from .pg_schema import DISTANCE_OPS

__all__ = ["METRIC_OPS", "search_operator"]

#: each metric's own distance operator
METRIC_OPS = {"cosine": "<=>", "ip": "<#>", **DISTANCE_OPS}
#: an operator class (less its vector type) -> the operator its index serves
_OPCLASS_OPS = {"cosine_ops": "<=>", "ip_ops": "<#>", "l2_ops": "<->", "l1_ops": "<+>"}
#: the operator classes whose order is a metric's own on unit rows (L1 is not cosine's)
_RANKS_AS = {"cosine": ("cosine_ops", "l2_ops", "ip_ops"), "ip": ("ip_ops",), "l2": ("l2_ops",), "l1": ("l1_ops",)}


def search_operator(metric: str, opclass: str | None) -> str:
    """The operator a search of a table of ``metric`` orders by, its vector index being of ``opclass`` (less its
    vector type, as :func:`~service.vectordb.pg_schema.plain_opclass` gives it; None: no index)."""
    if opclass in _RANKS_AS.get(metric, ()):
        return _OPCLASS_OPS[opclass]
    return METRIC_OPS.get(metric, "<=>")
