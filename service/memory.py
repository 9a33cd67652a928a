"""The C heap of a serving process: keep freed request buffers instead of handing them back per request.

A 1,024-row binary transform moves ~1.5 MB in and ~1.5 MB out and allocates a few buffers of that
size (the joined body, the output, the fused apply's block). glibc's ``malloc`` serves them from the
heap once its dynamic mmap threshold has risen, but gives the top of the heap back to the kernel
(``brk``) whenever more than its trim threshold (twice that threshold, ~3 MB) lies free — which
happens at the end of every such request. The next request grows the heap again and touches every
page anew: about a thousand page faults, measured at 1.5-2 ms of system CPU per request on the
development machine (server CPU per 1,024-row transform 5.5 ms -> 4.1 ms with the heap kept; a
bare echo of the same bytes 2.4 ms -> 0.6 ms; ``benchmarks/bench_service.py``).

:func:`keep_heap` raises the trim threshold to ``Settings.malloc_keep_mb`` and fixes the mmap
threshold (glibc's ``mallopt``; the same as the ``MALLOC_TRIM_THRESHOLD_`` / ``MALLOC_MMAP_THRESHOLD_``
environment variables, which only act at process start). The price is up to that much freed memory
kept per malloc arena, so it also caps the arenas at :data:`MAX_ARENAS` (glibc makes up to eight per core, one for
each thread that met a locked one: 16 on 2 cores, each keeping its freed memory), and :func:`trim_after` gives the
freed heap back after a request that moved more than :data:`TRIM_AFTER_BYTES` (a flood of 60 MB JSON transforms left
an idle process at 1.6-2.3 GB, from 0.85 GB). A no-op (returns None) on a C library without ``mallopt`` (musl, macOS).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

from align.exceptions import InputError

__all__ = ["keep_heap", "heap_settings", "heap_env", "trim_heap", "trim_after", "trim_count", "MAX_KEEP_MB",
           "MMAP_MAX_BYTES", "MAX_ARENAS", "TRIM_AFTER_BYTES"]

M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MAX_ARENAS = 4  # with keep_heap: each arena keeps up to its trim threshold of freed memory
TRIM_AFTER_BYTES = 16 << 20  # trim_after: a request that moved more (body in + answer out) is followed by a trim
MAX_KEEP_MB = 1024  # mallopt's value is a C int: 2 GiB would wrap
MMAP_MAX_BYTES = 32 * 1024 * 1024  # glibc refuses an mmap threshold above this on 64-bit (HEAP_MAX_SIZE / 2)

_lock = threading.Lock()
_applied: dict | None = None


def _glibc_fn(name: str):
    """The C library's function ``name`` when the library is glibc, else None (musl has ``mallopt`` /
    ``malloc_trim`` as stubs that ignore their arguments; macOS has neither)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = getattr(libc, name)
        libc.gnu_get_libc_version  # glibc only
    except (OSError, AttributeError):
        return None
    return fn


def _mallopt():
    fn = _glibc_fn("mallopt")
    if fn is not None:
        fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn


_malloc_trim = None


def trim_heap() -> None:
    """glibc's ``malloc_trim(0)``: give the pages of freed heap memory back to the system (a no-op elsewhere)."""
    global _malloc_trim, _trims
    _trims += 1
    if _malloc_trim is None:
        _malloc_trim = _glibc_fn("malloc_trim") or False
    if _malloc_trim:
        _malloc_trim(0)


_trims = 0
_trimming = threading.Lock()


def trim_count() -> int:
    """How many times :func:`trim_heap` ran in this process."""
    return _trims


def trim_after(moved: int) -> bool:
    """After a request that moved ``moved`` bytes: over :data:`TRIM_AFTER_BYTES`, :func:`trim_heap` in a thread of its
    own (it can take milliseconds on a large heap: not on the event loop), unless one is already running. Returns
    whether one was started."""
    if moved <= TRIM_AFTER_BYTES or not _trimming.acquire(blocking=False):
        return False

    def run() -> None:
        try:
            trim_heap()
        finally:
            _trimming.release()

    threading.Thread(target=run, name="vecbridge-trim-heap", daemon=True).start()
    return True


def _thresholds(keep_mb: int) -> tuple[int, int]:
    """``(trim threshold, mmap threshold)`` in bytes for ``keep_mb`` MiB kept."""
    keep = int(keep_mb) * 1024 * 1024
    return keep, min(keep, MMAP_MAX_BYTES)


def heap_env(keep_mb: int) -> dict[str, str]:
    """The same settings as glibc environment variables, for a process started from here (read at its start):
    ``{"MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_"}``; empty for ``0``."""
    if keep_mb <= 0:
        return {}
    keep, mmap = _thresholds(keep_mb)
    return {"MALLOC_TRIM_THRESHOLD_": str(keep), "MALLOC_MMAP_THRESHOLD_": str(mmap)}


def keep_heap(keep_mb: int) -> dict | None:
    """Keep up to ``keep_mb`` MiB of freed heap per arena, in at most :data:`MAX_ARENAS` arenas (``0``: leave glibc's
    defaults).

    Allocations of at least ``min(keep_mb MiB, 32 MiB)`` still get their own mapping (and go back to
    the kernel when freed). Process-wide and not undone (glibc has no getter to restore from); calling
    it again with the same value is a no-op. Returns what was set, or None where nothing was.
    """
    global _applied
    if keep_mb <= 0:
        return None
    if keep_mb > MAX_KEEP_MB:
        raise InputError(f"keep_mb must be at most {MAX_KEEP_MB} (mallopt takes a C int), got {keep_mb}")
    keep, mmap = _thresholds(keep_mb)
    with _lock:
        if _applied is not None and _applied["trim_threshold"] == keep:
            return dict(_applied)
        fn = _mallopt()
        if fn is None:
            return None
        if not (fn(M_TRIM_THRESHOLD, keep) and fn(M_MMAP_THRESHOLD, mmap)):
            return None
        fn(M_ARENA_MAX, MAX_ARENAS)  # best effort: arenas made before stay
        _applied = {"trim_threshold": keep, "mmap_threshold": mmap}
        return dict(_applied)


def heap_settings() -> dict | None:
    """What :func:`keep_heap` set in this process (``{"trim_threshold", "mmap_threshold"}`` in bytes), or None."""
    with _lock:
        return dict(_applied) if _applied is not None else None
