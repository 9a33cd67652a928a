"""``service.ops.indexes.search`` called as a library (the CLI and jobs check their rows first; HTTP decodes and
checks them, then says so with ``finite=True``): a NaN query through a map is named as NaN, not as an overflow."""

from __future__ import annotations

import numpy as np
import pytest

import align
from align.exceptions import NonFiniteError
from service.indexes import IndexStore
from service.limits import DEFAULT_LIMITS
from service.ops.indexes import RegistryResolver, create_index, search
from service.registry import open_registry


def test_a_nan_query_through_a_map_is_called_nan(tmp_path):
    rng = np.random.default_rng(0)
    A = rng.standard_normal((300, 8)).astype(np.float32)
    B = A[:, ::-1].copy()
    reg = open_registry(f"sqlite:///{tmp_path / 'r.sqlite'}", tmp_path / "art")
    try:
        reg.register_space("a", 8)
        reg.register_space("b", 8)
        reg.register_version("a2b", align.fit_procrustes(A, B), source_space="a", target_space="b",
                             method="procrustes", params={}, alias="prod")
        resolver = RegistryResolver(reg)
        idx = create_index(resolver, IndexStore(tmp_path / "indexes"), "ix", reg.get_space("b"), B)
        Q = A[:3].copy()
        found = search(resolver, idx, Q, space="a", k=1, limits=DEFAULT_LIMITS)
        assert found.I[:, 0].tolist() == [0, 1, 2]  # the map leads each row to its own partner
        Q[1, 2] = np.nan
        with pytest.raises(NonFiniteError, match=r"^queries: 1 row\(s\) contain NaN or Inf"):  # was: "overflow"
            search(resolver, idx, Q, space="a", k=1, limits=DEFAULT_LIMITS)
    finally:
        reg.close()
