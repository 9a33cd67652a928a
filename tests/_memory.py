"""Peak memory of one call, as numpy allocates it (tracemalloc sees numpy's buffers): the memory-bound tests."""

from __future__ import annotations

import tracemalloc

MiB = 1 << 20


def peak(fn, *args, **kw):
    """``(result, peak bytes allocated during fn(*args, **kw))``."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        out = fn(*args, **kw)
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
