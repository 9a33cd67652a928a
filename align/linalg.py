"""Dense decompositions of small (d × d) matrices with the BLAS held to one thread.

Why: numpy's OpenBLAS spins its worker threads between the many small BLAS calls a LAPACK
routine makes. On a machine whose cores are also busy with something else (another fit, a
server, CI), a 385 × 385 ``eigh`` then took 0.8–2.4 s with two BLAS threads against 0.03–0.05 s
with one (measured on the 2-core development machine at load 3); quiet, one thread is as fast
at these sizes. The GEMMs over many rows keep every thread; only the decompositions go serial.

:func:`limit_blas` / :func:`release_blas` are the one place the process's BLAS thread count is
changed: every holder (:func:`serial_blas` here, a serving process's ``blas_threads`` in
``service.threads``) registers its limit under a lock, the smallest active one applies, and the
original counts come back when the last holder leaves, so concurrent callers (fit jobs in
threads, a server) cannot leave the process at another holder's count. The limit reaches the BLAS builds with their own thread pool
(numpy's and scipy's OpenBLAS: these run the decompositions); an OpenMP-built BLAS (FAISS's)
follows the calling thread's OpenMP setting instead.
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager

import numpy as np

_lock = threading.Lock()
_limits: dict[int, int] = {}  # token -> thread count asked for; the BLAS runs at the smallest
_next_token = 0
_effective = 0  # the limit in force (0: none)
_saved: list = []  # threadpoolctl's records of the counts before a limit, one per set of libraries first seen
_covered: set[str] = set()  # the BLAS libraries (paths) a record in _saved holds the original count of
_modules_seen = 0  # len(sys.modules) when the libraries were last looked for


def _blas_controller():
    """A controller of the libraries loaded *now* (~1 ms: a library loaded later, e.g. with torch, is seen)."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        return None
    return ThreadpoolController()


def _apply_locked() -> None:
    """Make the BLAS run at ``min`` of the active limits, or restore the original counts when none is left.

    A limit already in force is applied again when modules were imported since it was (a BLAS loaded later, with
    scipy.linalg or torch, ran at its default count under a holder's one thread). Each record that first saw a
    library is kept and they are restored newest first, so every library gets back the count it had before."""
    global _effective, _modules_seen
    want = min(_limits.values()) if _limits else 0
    if want == _effective and (want == 0 or len(sys.modules) == _modules_seen):
        return
    if want == 0:
        for limiter in reversed(_saved):
            limiter.restore_original_limits()
        _saved.clear()
        _covered.clear()
    else:
        ctl = _blas_controller()
        if ctl is not None:
            libs = {info["filepath"] for info in ctl.select(user_api="blas").info()}
            limited = ctl.limit(limits=want, user_api="blas")
            if libs - _covered:  # a record of counts no earlier one holds: the first limit, or a library new since
                _saved.append(limited)
                _covered.update(libs)
    _effective, _modules_seen = want, len(sys.modules)


def limit_blas(n: int) -> int:
    """Hold the BLAS (the builds with their own thread pool) to at most ``n`` threads until
    :func:`release_blas` of the returned token. Process-wide: several holders may overlap (a serving
    process's limit, a decomposition's one thread); the smallest active limit applies, and the
    original counts come back when the last one is released."""
    global _next_token
    if int(n) < 1:
        raise ValueError(f"a BLAS thread limit must be >= 1, got {n}")
    with _lock:
        _next_token += 1
        _limits[_next_token] = int(n)
        _apply_locked()
        return _next_token


def release_blas(token: int) -> None:
    """Give back the limit :func:`limit_blas` returned ``token`` for (unknown tokens: nothing)."""
    with _lock:
        if _limits.pop(token, None) is not None:
            _apply_locked()


@contextmanager
def serial_blas():
    """Run the block with the BLAS limited to one thread (process-wide; overlapping holders: see :func:`limit_blas`)."""
    token = limit_blas(1)
    try:
        yield
    finally:
        release_blas(token)


def eigh(S: np.ndarray):
    """``np.linalg.eigh`` of a symmetric ``S`` (d, d) with one BLAS thread: (eigenvalues ascending, vectors)."""
    with serial_blas():
        return np.linalg.eigh(S)


def svd(M: np.ndarray, full_matrices: bool = False):
    """``np.linalg.svd`` of ``M`` (m, n) with one BLAS thread: ``U, s, Vt``."""
    with serial_blas():
        return np.linalg.svd(M, full_matrices=full_matrices)


def solve(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``np.linalg.solve(A, B)`` for a square ``A`` (d, d) with one BLAS thread."""
    with serial_blas():
        return np.linalg.solve(A, B)


def lstsq(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Least-squares solution of ``A X = B`` with one BLAS thread (the solution only)."""
    with serial_blas():
        return np.linalg.lstsq(A, B, rcond=None)[0]


def pinv(M: np.ndarray, rcond: float = 1e-15) -> np.ndarray:
    """Moore–Penrose pseudo-inverse of ``M`` with one BLAS thread."""
    with serial_blas():
        return np.linalg.pinv(M, rcond=rcond)


def qr(M: np.ndarray):
    """Reduced QR of ``M`` (m, n) with one BLAS thread: ``Q, R``."""
    with serial_blas():
        return np.linalg.qr(M)
