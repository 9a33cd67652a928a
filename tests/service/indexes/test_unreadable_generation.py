"""A newer generation another process wrote that this one cannot read (a file cut short by a failing disk, a
copy gone wrong) was a 500 on every request of the index in every other process, though each held a whole,
older generation in memory. They now keep serving it, say why in /readyz (``indexes.errors``), log it once,
and catch up as soon as a readable generation lands."""

from __future__ import annotations

import numpy as np
import pytest

from service.errors import http_status
from service.indexes import IndexStore
from service.indexes.errors import UnreadableGenerationError


def test_an_unreadable_newer_generation_keeps_the_older_one_served(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 16)).astype(np.float32)
    writer, reader = IndexStore(tmp_path), IndexStore(tmp_path)  # two processes of one data dir
    writer.create("docs", "s", X[:200])
    before = reader.get("docs")
    gen, count = before.generation, before.count
    _, I_before = before.search(X[:5], 3, exact=True)
    writer.get("docs").add(X[200:250])
    newest = tmp_path / "docs" / "delta.2.npz"  # the add is logged: generation 2's one new file
    newest.write_bytes(newest.read_bytes()[:100])  # cut short
    for _ in range(3):  # every request: the older generation, whole, without re-reading the bad file
        idx = reader.get("docs")
        assert idx is before and idx.generation == gen and idx.count == count
        np.testing.assert_array_equal(idx.search(X[:5], 3, exact=True)[1], I_before)
    assert "docs" in reader.load_errors and "could not be read" in reader.load_errors["docs"]
    with pytest.raises(UnreadableGenerationError):  # a write from the older generation would drop the newer rows
        reader.get("docs").add(X[:1])
    assert http_status(UnreadableGenerationError("x")) == 503
    # the writer moves on: the reader asked for a snapshot, which heals every process (the log after the
    # damaged delta could not be replayed)
    assert (tmp_path / "docs" / "snapshot-wanted").exists()
    writer.get("docs").add(X[250:])
    idx = reader.get("docs")
    assert idx.count == 300 and idx.generation > gen + 1
    assert "docs" not in reader.load_errors
    assert not (tmp_path / "docs" / "snapshot-wanted").exists()
    assert IndexStore(tmp_path).get("docs").count == 300  # a process starting now reads it too
