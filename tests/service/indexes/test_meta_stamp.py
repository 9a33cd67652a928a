"""A new index generation is noticed by every process, also when the file system reuses ``meta.json``'s inode.

Processes tell generations apart by ``stat_sig(meta.json)`` (device, inode, size, mtime). ext4 hands a freed
inode out again (the meta's, two generations later), and before Linux 6.13 file times advance once per timer
tick: two quick writes with metas of one size could repeat a signature, so another process kept serving the
older generation, and its next write started from it and overwrote acknowledged rows (found by the
concurrency audit: ext4 handed the meta's inode out again 98 times in 100, two generations later). Now each
meta carries an explicit modification time past the previous one's, and a writer reads the meta itself instead
of trusting the signature.
"""

from __future__ import annotations

import numpy as np

from service.indexes import IndexStore, persist
from service.indexes.locking import stat_sig


def _rows(seed: int, n: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 8)).astype(np.float32)


def test_every_meta_gets_a_later_stamp_even_from_a_clock_that_stands_still(tmp_path, monkeypatch):
    monkeypatch.setattr(persist.time, "time_ns", lambda: 1_700_000_000_000_000_000)  # a coarse clock: one tick
    writer, reader = IndexStore(tmp_path), IndexStore(tmp_path)
    idx = writer.create("ix", "s", _rows(0, 2))
    stamps = [stat_sig(tmp_path / "ix" / "meta.json")[3]]
    for i in range(5):
        idx.add(_rows(i + 1))
        stamps.append(stat_sig(tmp_path / "ix" / "meta.json")[3])
        assert reader.get("ix").count == idx.count  # the reader notices every generation
    assert stamps == sorted(set(stamps)) and stamps[-1] - stamps[0] == 5


def test_a_writer_whose_signature_repeats_still_builds_on_the_newest_generation(tmp_path):
    a, b = IndexStore(tmp_path), IndexStore(tmp_path)
    a.create("ix", "s", _rows(0, 2), ids=[0, 1])
    b.get("ix")
    acked = {0, 1} | {int(i) for i in a.get("ix").add(_rows(1, 3))}
    stale = b._indexes["ix"]
    stale._meta_sig = stat_sig(tmp_path / "ix" / "meta.json")  # what a repeated signature makes b believe
    acked |= {int(i) for i in stale.add(_rows(2), ids=[10_000])}
    assert set(IndexStore(tmp_path).get("ix")._live_ids().tolist()) == acked, "acknowledged rows were overwritten"
