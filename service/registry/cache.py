"""The registry's cache of loaded artifacts (maps, steers, maps composed along a path), bounded by their bytes.

It was bounded by a count alone (64 entries): 64 maps of 4,096 x 4,096 float32 are 4.3 GB (8.6 GB once applied),
cluster maps more, and no setting changed it. Each entry is now sized by the numpy arrays it holds
(:func:`held_bytes`) and the cache keeps at most ``max_bytes`` of them (``Settings.map_cache_mb`` in a server) as
well as at most ``size`` entries. Measuring the 64 entries again on a miss takes ~1.5 ms (16-d maps, 2 cores).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

__all__ = ["LRUCache", "held_bytes"]

_SCALARS = (int, float, complex, str, bytes, bool, type(None))


def held_bytes(value, _seen: set[int] | None = None, _depth: int = 0) -> int:
    """Bytes of the numpy arrays ``value`` holds: itself, its attributes and the items of its lists, tuples and
    dicts, 6 levels deep (a chain's maps, their frames, a linear map's fused apply plan); each array once."""
    seen = set() if _seen is None else _seen
    if isinstance(value, _SCALARS) or _depth > 6 or id(value) in seen:
        return 0
    seen.add(id(value))
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, dict):
        items = list(value.values())
    elif isinstance(value, (list, tuple)):
        items = list(value)
    elif hasattr(value, "__dict__"):
        items = list(vars(value).values())
    else:
        return 0
    return _plan_bytes(value) + sum(held_bytes(item, seen, _depth + 1) for item in items)


def _plan_bytes(value) -> int:
    """Bytes a map will build at its first apply and not hold yet: its fused plan (``planned_bytes()``: a linear map's,
    about its ``W`` again; a cluster map's, ``2 k d_t`` floats and its routing, its ``W`` used in place; a chain's
    are its maps').
    Counted up front: measured only once built, two maps whose ``W`` fit the budget together evicted each other at
    every miss once applied (each then read from disk again), and cluster maps (counted without it until then) held
    twice the budget while requests only hit."""
    planned = None if isinstance(value, type) else getattr(value, "planned_bytes", None)
    return int(planned()) if callable(planned) else 0


class LRUCache:
    """A thread-safe least-recently-used cache of loaded artifacts (immutable: keyed by sha256), bounded by
    ``size`` entries and ``max_bytes`` bytes of arrays (:func:`held_bytes`; None: by count only).

    A value larger than ``max_bytes`` on its own is returned (the request is served) but not kept, so each use
    reads it again: raise the budget for such maps. A map's fused apply plan, made at its first apply, is counted
    when the map is stored (``planned_bytes``); other arrays a value builds after it was stored are counted, and
    the bounds kept, when the next value is stored
    (every entry is measured again then, outside the lock) and by :meth:`stats`. A composed path holds the maps
    it was made of, which may be entries of their own: they are counted in each (the sum can only overstate what
    is held).
    """

    def __init__(self, size: int, max_bytes: int | None = None):
        self.size = size
        self.max_bytes = max_bytes
        self._items: OrderedDict = OrderedDict()  # key -> [value, bytes]
        self._bytes = 0
        self._lock = threading.Lock()

    def peek(self, key):
        """The value cached under ``key`` (now the most recently used), or None; never computes one."""
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key][0]
        return None

    def get(self, key, make: Callable[[], object]):
        """The value cached under ``key``, else ``make()`` (computed outside the lock) remembered if it fits."""
        if (hit := self.peek(key)) is not None:  # values are artifacts, never None
            return hit
        return self.put(key, make())

    def put(self, key, value):
        """Remember ``value`` under ``key`` if it fits, in place of any value there; returns ``value``."""
        n = held_bytes(value)
        if self.max_bytes is not None and n > self.max_bytes:
            return value
        self._remeasure()
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:  # another thread stored it meanwhile
                self._bytes -= old[1]
            self._items[key] = [value, n]
            self._bytes += n
            self._trim()
        return value

    def _trim(self) -> None:
        """Drop the least recently used entries while over a bound (the lock held)."""
        while len(self._items) > self.size or (self.max_bytes is not None and self._bytes > self.max_bytes):
            self._bytes -= self._items.popitem(last=False)[1][1]

    def _remeasure(self) -> None:
        """Size every entry again (what their values built since they were stored), then keep to the bounds."""
        with self._lock:
            entries = list(self._items.items())
        sizes = {key: held_bytes(entry[0]) for key, entry in entries}
        with self._lock:
            for key, n in sizes.items():
                entry = self._items.get(key)
                if entry is not None:
                    self._bytes += n - entry[1]
                    entry[1] = n
            self._trim()

    def stats(self) -> dict:
        """``entries``, ``max_entries``, ``bytes`` (measured now) and ``max_bytes`` (None: no byte bound)."""
        self._remeasure()
        with self._lock:
            return {"entries": len(self._items), "max_entries": self.size, "bytes": self._bytes,
                    "max_bytes": self.max_bytes}
