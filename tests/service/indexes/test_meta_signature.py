"""Two stores on one ``indexes/`` folder tell a new generation from the one they hold by ``stat_sig`` of
``meta.json`` (device, inode, size, mtime). The docstring's premise, "a new meta has a new inode", does not hold:
every generation replaces ``meta.json`` by a rename, the old inode is freed, and ext4 hands it out again two
generations later (measured: 98 of 100 times). Then only the mtime tells the generations apart, and before
Linux 6.13 file timestamps advance once per timer tick (1-10 ms): two adds through one process within a tick,
with a meta of the same size, leave the other process's signature equal, so it keeps serving the old generation
and its next write starts from it, overwriting the rows the first process acknowledged.

This kernel stamps files finely, so the test stands in for the coarse clock: when the inode and size come back, it
sets the new meta's mtime to the one the reader holds (``os.utime``), as such a kernel would have stamped it. Real
files, real FAISS, two stores (what two processes hold).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from service.indexes import IndexStore
from service.indexes.locking import stat_sig

DIM = 8


def _rows(rng, n=1):
    return rng.standard_normal((n, DIM)).astype(np.float32)


@pytest.mark.xfail(strict=True, reason="service/indexes/space.py SpaceIndex.refresh/_sync trust stat_sig of meta.json, "
                                       "whose inode is reused; fix: keep the adopted meta's file open (its inode cannot "
                                       "be handed out again) or compare the meta's generation and uid")
def test_a_reused_meta_inode_does_not_hide_a_generation(tmp_path):
    rng = np.random.default_rng(0)
    a, b = IndexStore(tmp_path), IndexStore(tmp_path)
    a.create("ix", "b", _rows(rng, 2), ids=[0, 1], kind="flat")
    b.load_all()
    acked = {0, 1}
    meta = tmp_path / "ix" / "meta.json"
    for _ in range(200):  # until a meta comes back with the reader's inode and size (a few tries on ext4)
        held = b.get("ix")._meta_sig
        for _ in range(2):
            acked.update(int(i) for i in a.get("ix").add(_rows(rng)))
        now = stat_sig(meta)
        if now[:3] == held[:3]:
            os.utime(meta, ns=(held[3], held[3]))  # the stamp a coarse clock gives both metas
            break
    else:
        pytest.skip("this file system did not reuse the meta's inode")
    assert b.get("ix").count == len(acked), "the reader kept serving an older generation"
    acked.update(int(i) for i in b.get("ix").add(_rows(rng), ids=[10_000]))
    fresh = IndexStore(tmp_path)
    fresh.load_all()
    assert set(fresh.get("ix")._live_ids().tolist()) == acked, "acknowledged rows were overwritten"
