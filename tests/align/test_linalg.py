"""align.linalg: decompositions with the BLAS held to one thread, and the limit always restored."""

import os
import threading

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from align import linalg


def _blas_threads():
    """Thread counts of the BLAS builds with their own pool (numpy's, scipy's); an OpenMP-built one
    (FAISS's) follows the calling thread's OpenMP setting, not this limit."""
    return sorted(i["num_threads"] for i in threadpool_info()
                  if i["user_api"] == "blas" and i.get("threading_layer") != "openmp")


def test_serial_blas_limits_inside_and_restores_after():
    before = _blas_threads()
    if not before:
        pytest.skip("no BLAS library visible to threadpoolctl")
    with linalg.serial_blas():
        assert all(n == 1 for n in _blas_threads())
        with linalg.serial_blas():  # nested
            assert all(n == 1 for n in _blas_threads())
        assert all(n == 1 for n in _blas_threads())  # still inside the outer block
    assert _blas_threads() == before


def test_concurrent_callers_cannot_leave_the_process_serial():
    """Overlapping entries and exits from many threads: the last exit restores the original limit."""
    before = _blas_threads()
    errors = []
    start = threading.Barrier(8)

    def worker(seed):
        rng = np.random.default_rng(seed)
        S = rng.normal(size=(40, 40))
        S = S @ S.T
        try:
            start.wait(timeout=60)  # a thread that never came breaks the barrier (reported below), no hang
            for _ in range(30):
                w, V = linalg.eigh(S)
                np.testing.assert_allclose((V * w) @ V.T, S, atol=1e-8)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not [t for t in threads if t.is_alive()], "a worker still runs after 120 s"
    assert not errors
    assert _blas_threads() == before


def test_wrappers_give_numpys_answers():
    rng = np.random.default_rng(0)
    M = rng.normal(size=(30, 20))
    S = M.T @ M
    U, s, Vt = linalg.svd(M)
    np.testing.assert_allclose((U * s) @ Vt, M, atol=1e-10)
    np.testing.assert_allclose(linalg.eigh(S)[0], np.linalg.eigh(S)[0], atol=1e-10)
    B = rng.normal(size=(20, 3))
    np.testing.assert_allclose(S @ linalg.solve(S, B), B, atol=1e-8)
    np.testing.assert_allclose(linalg.lstsq(M, M @ B), B, atol=1e-8)
    np.testing.assert_allclose(linalg.pinv(M) @ M, np.eye(20), atol=1e-8)
    Q, R = linalg.qr(M)
    np.testing.assert_allclose(Q @ R, M, atol=1e-10)


def test_overlapping_holders_apply_the_smallest_limit_and_release_in_any_order():
    """One mechanism holds the process's BLAS count (a server's limit and a decomposition's one thread
    overlap): the smallest active limit applies; releasing in any order ends at the original counts."""
    before = _blas_threads()
    if not before:
        pytest.skip("no BLAS library visible to threadpoolctl")
    a = linalg.limit_blas(2)
    under_a = _blas_threads()
    assert all(n <= 2 for n in under_a)
    with linalg.serial_blas():
        assert all(n == 1 for n in _blas_threads())
    assert _blas_threads() == under_a  # the decomposition's exit gives back the server's limit, not the original
    b = linalg.limit_blas(1)
    linalg.release_blas(a)  # the older, larger holder leaves first
    assert all(n == 1 for n in _blas_threads())
    linalg.release_blas(b)
    linalg.release_blas(b)  # a second release of a token changes nothing
    assert _blas_threads() == before
    with pytest.raises(ValueError):
        linalg.limit_blas(0)


_LATE_BLAS = """
import json
import numpy as np  # numpy's OpenBLAS, loaded first
from threadpoolctl import threadpool_info
from align import linalg

def counts():
    return {i["filepath"]: i["num_threads"] for i in threadpool_info()
            if i["user_api"] == "blas" and i.get("threading_layer") != "openmp"}

before = counts()
server = linalg.limit_blas(1)  # a serving process's limit, held for good
import scipy.linalg  # scipy's own OpenBLAS, loaded after the limit
loaded = counts()
late = sorted(set(loaded) - set(before))
with linalg.serial_blas():  # a decomposition: the late library runs at one thread too
    inside = counts()
linalg.release_blas(server)
print(json.dumps({"late": late, "loaded": loaded, "inside": inside, "after": counts()}))
"""


def test_a_blas_loaded_while_a_limit_holds_is_limited_too_and_given_back_its_count():
    """A BLAS library loaded after the first holder's limit (scipy.linalg's own OpenBLAS, torch's) ran at its
    default count inside every later ``serial_blas`` while the first holder stayed: the limit was in force already,
    so nothing was applied again. Each library runs at the limit, and gets its own count back when the last
    holder leaves (its default: ``OPENBLAS_NUM_THREADS=3`` in this child, capped by OpenBLAS at the cores)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "OPENBLAS_NUM_THREADS": "3", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", _LATE_BLAS], capture_output=True, text=True, timeout=120, env=env,
                          check=True)
    seen = json.loads(done.stdout)
    if not any(seen["loaded"][lib] > 1 for lib in seen["late"]):
        pytest.skip("scipy.linalg loaded no BLAS library of its own that runs more than one thread here")
    assert all(n == 1 for n in seen["inside"].values()), seen
    assert all(seen["after"][lib] == seen["loaded"][lib] for lib in seen["late"]), seen
