"""Native thread pools of a serving process: the BLAS (numpy's and FAISS's OpenBLAS) and FAISS's OpenMP.

A server's parallelism is across requests (the thread pool, ``--workers``). Left at their defaults,
OpenBLAS and OpenMP give every small product a team of spinning threads; when the host's cores are
busy (a fit job, a vector database beside it, CI), a team member that is not scheduled stalls the
call: measured on the 2-core development machine at load 3, ``map.apply`` of 8 rows took 16 ms p50
with two BLAS threads and 0.16 ms with one, and a 1-query FAISS search through BLAS 324 ms against
6 ms; over HTTP at load 1-2, batch-64 transforms 6.7x and 1-query searches 4.0x slower at the p50. So ``vecbridge serve`` runs them at ``Settings.blas_threads`` (default 1; 0 leaves the
libraries' defaults). ``benchmarks/bench_blas_threads.py`` measures both side by side.

:func:`limit_native_threads` is reference-counted: apps started and stopped in one process (tests)
restore the original limits when the last one stops. The BLAS count itself is held through
:func:`align.linalg.limit_blas`, the one place that changes it (so a decomposition's one-thread
limit and this one overlap correctly).
"""

from __future__ import annotations

import threading

from align import linalg

_lock = threading.Lock()
_depth = 0
_restore = None
_active = 0  # the limit in force (0: none)
_tls = threading.local()


def _faiss_omp():
    try:
        import faiss
    except ImportError:  # pragma: no cover - faiss-cpu is a dependency
        return None
    return faiss


def limit_native_threads(n: int) -> None:
    """Limit the BLAS and FAISS's OpenMP to ``n`` threads until :func:`release_native_threads` (``n`` = 0: no-op)."""
    global _depth, _restore, _active
    if n <= 0:
        return
    with _lock:
        _depth += 1
        if _depth > 1:
            return
        faiss = _faiss_omp()  # loaded first, so threadpoolctl also sees the OpenBLAS FAISS brings
        before = faiss.omp_get_max_threads() if faiss is not None else None
        limits = linalg.limit_blas(n)  # the one holder of the process's BLAS count (align.linalg)
        if faiss is not None:
            faiss.omp_set_num_threads(n)
        _restore = (limits, before)
        _active = n


def pin_thread() -> None:
    """Apply the limit to FAISS's OpenMP in the calling thread (once per thread; ~0.1 µs after that).

    The BLAS limit is process-wide, but OpenMP keeps its thread count per thread: a request served in
    a worker thread of the pool would otherwise search (and run FAISS's OpenMP BLAS) with the default.
    """
    n = _active
    if n and getattr(_tls, "n", 0) != n:
        faiss = _faiss_omp()
        if faiss is not None:
            faiss.omp_set_num_threads(n)
        _tls.n = n


def release_native_threads(n: int) -> None:
    """Undo one :func:`limit_native_threads` call; the last one restores the original limits."""
    global _depth, _restore, _active
    if n <= 0:
        return
    with _lock:
        _depth = max(0, _depth - 1)
        if _depth or _restore is None:
            return
        limits, before = _restore
        _restore, _active = None, 0
        linalg.release_blas(limits)
        faiss = _faiss_omp()
        if faiss is not None and before is not None:
            faiss.omp_set_num_threads(before)


def native_threads() -> dict:
    """What the calling thread runs with now: ``{"blas": [threads per BLAS library], "faiss_omp": n}``.

    (FAISS's OpenMP-built BLAS follows the calling thread's OpenMP setting; see :func:`pin_thread`.)
    """
    from threadpoolctl import threadpool_info

    faiss = _faiss_omp()
    return {"blas": [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"],
            "faiss_omp": faiss.omp_get_max_threads() if faiss is not None else None}
