"""A dry run on a Qdrant local-mode folder says its writes are slow (QA: 20,000 rows took 437 s to migrate there, ~20 s
on Milvus or pgvector; the estimate counted reads and mapping only, "writes come on top")."""

from __future__ import annotations

import numpy as np
import pytest
from _vectordb_servers import small_migration

from service.vectordb import migrate, open_store

pytest.importorskip("qdrant_client")


def test_a_dry_run_on_a_local_qdrant_folder_warns_that_its_writes_are_slow(tmp_path):
    X, m = small_migration()
    with open_store(f"qdrant://{tmp_path}/q") as s:
        s.create("lq_src", X.shape[1])
        s.upsert("lq_src", np.arange(len(X)), X)
        rep = migrate(s, "lq_src", "lq_dst", m, dry_run=True)
        slow = [w for w in rep.extra["warnings"] if "Qdrant local mode" in w]
        assert len(slow) == 1 and "writes slowly" in slow[0] and "Qdrant server" in slow[0], rep.extra["warnings"]
        assert not any("Qdrant local mode" in w for w in migrate(s, "lq_src", "lq_dst", m).extra["warnings"])
