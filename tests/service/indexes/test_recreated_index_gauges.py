"""Two requests holding an index that another process dropped and created again under its name.

Each found the old one gone, forgot it and told the metrics it was dropped; the second "dropped" could come after
the first had loaded the new index, and removed the new index's gauges (a full test run under load scraped no
``vecbridge_index_vectors`` for it). Only the request that forgot the old index tells of the drop now.
"""

from __future__ import annotations

import threading

import numpy as np

from service.indexes import IndexStore


class _Seen:
    """An observer recording what the store tells it."""

    def __init__(self):
        self.calls: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def index_changed(self, idx):
        with self.lock:
            self.calls.append(("changed", idx.name))

    def index_caught_up(self, name, how, seconds):
        pass

    def index_dropped(self, name):
        with self.lock:
            self.calls.append(("dropped", name))


def test_a_recreated_index_is_told_dropped_once_by_racing_requests(tmp_path):
    X = np.random.default_rng(0).standard_normal((20, 8)).astype(np.float32)
    seen = _Seen()
    served, other = IndexStore(tmp_path, observer=seen), IndexStore(tmp_path)
    served.create("docs", "a", X)
    old = served.get("docs")
    other.delete("docs")  # another process drops it and creates it again
    other.create("docs", "a", X[:7])
    both = threading.Barrier(2)
    real = old.refresh

    def refresh():  # both requests hold the old index before either finds it gone
        both.wait(30)
        return real()

    old.refresh = refresh
    got = []
    threads = [threading.Thread(target=lambda: got.append(served.get("docs").count)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == [7, 7]
    assert seen.calls.count(("dropped", "docs")) == 1, seen.calls
    assert seen.calls[-1] == ("changed", "docs"), seen.calls  # the new index's numbers stand
