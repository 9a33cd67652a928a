"""A flat index's rows are backed by 2 MiB pages (transparent huge pages, Linux 6.1+'s ``MADV_COLLAPSE``).

A batch-1 search reads every row: 8,192 x 384 rows are 12 MiB, 3,072 pages of 4 KiB, more than the TLB holds, and
the search walked the page table for most of them; whether FAISS's buffer had huge pages was chance. These tests
read ``/proc/self/smaps`` for the memory holding the rows after a build, an add and a load, and check that the
answers are those of the same rows in plain pages. Skipped where the kernel cannot collapse (checked on a buffer
of this test's own).
"""

from __future__ import annotations

import ctypes
import mmap
import sys

import faiss
import numpy as np
import pytest

from service.indexes import IndexStore, SpaceIndex

DIM = 384
HUGE = 2 << 20


def _huge_kib(lo: int, hi: int) -> int:
    """AnonHugePages (KiB) of the mappings overlapping ``[lo, hi)``."""
    total, inside = 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                a, b = (int(x, 16) for x in head.split("-"))
                inside = a < hi and lo < b
            elif inside and head == "AnonHugePages:":
                total += int(line.split()[1])
    return total


def _can_collapse() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    with mmap.mmap(-1, 2 * HUGE, flags=mmap.MAP_PRIVATE) as m:
        buf = np.frombuffer(m, np.uint8)
        buf[:] = 1
        base = buf.ctypes.data
        lo = -(-base // HUGE) * HUGE
        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        ok = madvise(lo, HUGE, 25) == 0 and _huge_kib(lo, lo + HUGE) >= HUGE // 1024
        del buf
    return ok


pytestmark = pytest.mark.skipif(not _can_collapse(), reason="no transparent huge pages (MADV_COLLAPSE) here")


def _rows_span(idx: SpaceIndex) -> tuple[int, int]:
    """The whole 2 MiB pages inside the buffer holding ``idx``'s rows."""
    codes = faiss.downcast_index(idx.index.index).codes
    ptr, size = int(codes.data()), int(codes.size())
    return -(-ptr // HUGE) * HUGE, (ptr + size) // HUGE * HUGE


def _assert_huge(idx: SpaceIndex) -> None:
    lo, hi = _rows_span(idx)
    assert hi - lo >= 4 * HUGE
    assert _huge_kib(lo, hi) >= (hi - lo) // 1024, "the rows are not in huge pages"


def _rows(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def test_build_add_and_load_back_the_rows_with_huge_pages(tmp_path):
    X = _rows(0, 8192)
    assert X.nbytes >= 12 * 2**20  # past room.HUGE_ROWS_MIN
    store = IndexStore(tmp_path)
    idx = store.create("big", "s", X, kind="flat")
    _assert_huge(idx)
    idx.add(_rows(1, 4096))  # grows (or moves) the buffer: the new part too
    _assert_huge(idx)
    loaded = SpaceIndex.load(idx.path)
    _assert_huge(loaded)

    Q = _rows(2, 3)
    plain = faiss.IndexFlatIP(DIM)
    rows = np.vstack([X, _rows(1, 4096)])
    plain.add(rows / np.linalg.norm(rows, axis=1, keepdims=True))
    S, I = loaded.search(Q, 10)
    S0, I0 = plain.search(Q / np.linalg.norm(Q, axis=1, keepdims=True), 10)
    np.testing.assert_array_equal(I, I0)  # ids count from 0 in order: slots
    np.testing.assert_allclose(S, S0, rtol=1e-5)

