"""Dense decompositions of small (d × d) matrices with the BLAS held to one thread.

Why: numpy's OpenBLAS spins its worker threads between the many small BLAS calls a LAPACK
routine makes. On a machine whose cores are also busy with something else (another fit, a
server, CI), a 385 × 385 ``eigh`` then took 0.8–2.4 s with two BLAS threads against 0.03–0.05 s
with one (measured on the 2-core development machine at load 3); quiet, one thread is as fast
at these sizes. The GEMMs over many rows keep every thread; only the decompositions go serial.

:func:`serial_blas` is reference-counted under a lock, so concurrent callers (fit jobs in
threads) cannot leave the process at one thread: the first entry lowers the limit, the last
exit restores what was there. The limit reaches the BLAS builds with their own thread pool
(numpy's and scipy's OpenBLAS: these run the decompositions); an OpenMP-built BLAS (FAISS's)
follows the calling thread's OpenMP setting instead.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import numpy as np

_lock = threading.Lock()
_depth = 0
_saved = None


def _blas_controller():
    """A controller of the libraries loaded *now* (~1 ms: a library loaded later, e.g. with torch, is seen)."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        return None
    return ThreadpoolController()


@contextmanager
def serial_blas():
    """Run the block with the BLAS limited to one thread (process-wide, reference-counted)."""
    global _depth, _saved
    with _lock:
        if _depth == 0:
            ctl = _blas_controller()
            _saved = None if ctl is None else ctl.limit(limits=1, user_api="blas")
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved is not None:
                _saved.restore_original_limits()
                _saved = None


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
