"""Loading one index never waits for the load of another.

The store let one thread load a name at a time through 64 striped locks (``hash(name) % 64``): two names on
one stripe (1 in 64 per pair, by the process's hash seed) shared a lock, so a request for a small index could
wait for the whole load of a large one on the same stripe (a clean CI run's background-load test hit it: its
search of a 4,000-row index timed out behind a load held on a pipe). Now each name has its own lock while some
thread wants it. Here the slow index's payload file is a named pipe, so its load waits until the test writes it,
and the other name is picked to share the old stripe with it in this process.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from service.indexes import IndexStore


def test_a_load_held_on_the_disk_does_not_hold_another_name(tmp_path):
    rows = np.random.default_rng(0).standard_normal((40, 8)).astype(np.float32)
    other = next(f"other{i}" for i in range(10_000) if hash(f"other{i}") % 64 == hash("slow") % 64)
    writer = IndexStore(tmp_path)
    writer.create("slow", "s", rows, kind="flat", payloads=[{"i": i} for i in range(len(rows))])
    writer.create(other, "s", rows[:10], kind="flat")
    fifo = tmp_path / "slow" / "payloads.1.json"
    payload_bytes = fifo.read_bytes()
    fifo.unlink()
    os.mkfifo(fifo)

    store = IndexStore(tmp_path)  # a fresh process's store: nothing in memory yet
    got: dict = {}
    slow = threading.Thread(target=lambda: got.setdefault("slow", store.get("slow")), daemon=True)
    slow.start()
    fd = None
    try:
        fd = os.open(fifo, os.O_WRONLY)  # returns once the load has the pipe open (and waits on it)
        fast = threading.Thread(target=lambda: got.setdefault(other, store.get(other)), daemon=True)
        fast.start()
        fast.join(20)
        assert other in got and got[other].count == 10, "the other index waited for the slow one's load"
        assert "slow" not in got
        os.write(fd, payload_bytes)
    finally:
        if fd is not None:
            os.close(fd)
    slow.join(20)
    assert got["slow"].count == 40
    assert not store._load_locks  # no lock left behind once nobody loads
