"""Flat indexes searched with torch on a device (``Settings.search_device``, service/indexes/device.py).

The same code runs on torch's CPU here (``DeviceRows("cpu")``) and on a GPU where one is seen (the tests marked
``cuda``, run on the lent GPU machine): every answer is checked against FAISS's own flat search of the same rows.
"""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import numpy as np
import pytest
from _api_support import R, W, settings_for
from _servers import ROOT, env_for, free_port, seed_registry, start, start_on_free_port, stop
from conftest import logged
from hypothesis import given, settings
from hypothesis import strategies as st

from service.indexes import IndexStore, SpaceIndex
from service.indexes import device as dev

torch = pytest.importorskip("torch")
CUDA = torch.cuda.is_available()
cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device (the GPU machine runs these)")


def rows(n: int, d: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


def faiss_search(idx: SpaceIndex, Q: np.ndarray, k: int):
    """FAISS's flat search of the index's rows (the CPU path, whatever the device)."""
    return idx.index.search(np.ascontiguousarray(idx._prepared(Q)), k)


def same_answer(got, idx: SpaceIndex, Q: np.ndarray, gap: float = 1e-5) -> None:
    """``got`` (S, I) is FAISS's answer for ``Q`` in ``idx``: scores within float32 rounding, ids equal wherever a
    score is not within ``gap`` of a neighbouring one, the first score left out too (a tie may swap between two
    BLAS, or across the k-th place)."""
    S, I = got
    k = S.shape[1]
    S0, I0 = faiss_search(idx, Q, k + 1)
    S0[I0 < 0] = -np.inf  # FAISS pads with -FLT_MAX, SpaceIndex.search with -inf
    assert S.dtype == np.float32 and I.dtype == np.int64 and S.shape == I.shape == (Q.shape[0], k)
    np.testing.assert_allclose(S, S0[:, :k], rtol=1e-5, atol=1e-5)
    assert ((I < 0) == (I0[:, :k] < 0)).all()  # k past the rows: FAISS's -1 padding
    close = np.abs(np.diff(S0, axis=1)) < gap  # (b, k): place j ties with place j + 1
    near = close.copy()
    near[:, 1:] |= close[:, :-1]
    assert (I[~near] == I0[:, :k][~near]).all()


def on_device(idx: SpaceIndex, device: str) -> SpaceIndex:
    idx._device = dev.DeviceRows(device)  # this index alone; the process's setting stays cpu
    return idx


RUN_DEVICE = os.environ.get("VECBRIDGE_TEST_SEARCH_DEVICE")  # conftest: the whole run's flat searches on it


@pytest.mark.skipif(bool(RUN_DEVICE), reason="this run searches on VECBRIDGE_TEST_SEARCH_DEVICE")
def test_off_by_default_and_faiss_answers():
    assert dev.search_device() == "cpu"
    assert dev.DeviceRows().search(None, 0, np.zeros((1, 4), np.float32), 1) is None


@pytest.mark.skipif(not RUN_DEVICE, reason="VECBRIDGE_TEST_SEARCH_DEVICE is not set (the GPU machine's run)")
def test_the_run_s_device_searches_every_flat_index():
    """The check that the index tests of this run went through the device: a plain SpaceIndex (no device of its
    own) answers from it."""
    idx = SpaceIndex.build("t", "s", rows(50, 8, 12), kind="flat")
    assert dev.search_device().startswith("cuda:" if RUN_DEVICE.startswith("cuda") else "cpu")
    assert idx._device.search(idx.index, idx._changes, rows(2, 8, 13), 3) is not None


def test_an_in_process_app_gives_back_the_device_it_found(tmp_path, monkeypatch):
    """An app's stop set the process's device to the CPU (FAISS) whatever it had found: in the GPU machine's run
    (``VECBRIDGE_TEST_SEARCH_DEVICE``) every index test after the first in-process app of its worker searched with
    FAISS, and the check above failed when it ran after one (``-n 0 test_newer_format.py test_device_search.py``).
    Now the stop puts back the device the process had before the start."""
    torch = pytest.importorskip("torch")
    from fastapi.testclient import TestClient

    from service.api import create_app

    monkeypatch.setattr(dev, "_device", torch.device("cpu"))  # the torch path, as VECBRIDGE_TEST_SEARCH_DEVICE does
    idx = SpaceIndex.build("t", "s", rows(50, 8, 12), kind="flat")
    with TestClient(create_app(settings_for(tmp_path))) as c:
        assert c.get("/healthz").status_code == 200
        assert idx._device.search(idx.index, idx._changes, rows(2, 8, 13), 3) is None  # its setting (cpu): FAISS
    assert idx._device.search(idx.index, idx._changes, rows(2, 8, 13), 3) is not None


def test_an_in_process_app_whose_start_fails_gives_back_the_device_too(tmp_path, monkeypatch):
    """The stop gave the device back, but a start that failed after choosing its own (a data dir it cannot open)
    left the process on the app's setting (the CPU: FAISS) for every later test of the worker; and it kept the
    app's BLAS thread limit for good, which made a later one-thread limit a no-op (CI's test_linalg failed after
    it). Both are given back."""
    torch = pytest.importorskip("torch")
    from fastapi.testclient import TestClient
    from threadpoolctl import threadpool_limits

    from align import linalg
    from service.api import create_app
    from service.api.state import AppState
    from service.threads import native_threads

    def fail(self):
        raise OSError("the data dir cannot be opened (test)")

    monkeypatch.setattr(dev, "_device", torch.device("cpu"))
    monkeypatch.setattr(AppState, "open", fail)
    idx = SpaceIndex.build("t", "s", rows(50, 8, 12), kind="flat")
    with threadpool_limits(limits=3, user_api="blas"):  # not 1: a one-thread limit that does nothing would show
        with pytest.raises(OSError, match="cannot be opened"), TestClient(create_app(settings_for(tmp_path))):
            pass
        with linalg.serial_blas():  # a limit the failed start kept made this a no-op
            assert all(n == 1 for n in native_threads()["blas"]), native_threads()
    assert idx._device.search(idx.index, idx._changes, rows(2, 8, 13), 3) is not None  # the device it found


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 300), d=st.integers(1, 40), b=st.integers(1, 20), k=st.integers(1, 400),
       seed=st.integers(0, 2**16), metric=st.sampled_from(["cosine", "ip"]))
def test_the_same_top_k_as_faiss(n, d, b, k, seed, metric):
    """Any shape, ``k`` above the rows too (-inf / -1 padding), both metrics, explicit sparse ids."""
    ids = np.random.default_rng(seed).choice(10**12, n, replace=False)
    idx = on_device(SpaceIndex.build("t", "s", rows(n, d, seed), ids=ids, kind="flat", metric=metric), "cpu")
    Q = rows(b, d, seed + 1)
    got = idx.search(Q, k)
    same_answer(got, idx, Q)
    assert set(got[1][got[1] >= 0].tolist()) <= set(ids.tolist())


def test_query_blocks_give_the_same_answer(monkeypatch):
    idx = on_device(SpaceIndex.build("t", "s", rows(500, 16, 0), kind="flat"), "cpu")
    Q = rows(37, 16, 1)
    whole = idx.search(Q, 7)
    monkeypatch.setattr(dev, "BLOCK_SCORES", 1200)  # 2 queries per block of 500 rows
    np.testing.assert_array_equal(idx.search(Q, 7)[1], whole[1])


def test_adds_deletes_and_other_processes_writes_reach_the_device_copy(tmp_path):
    """The copy is made again after every change: an add is found, a delete gone, a generation written by another
    process (another SpaceIndex on the same folder) searched after its refresh."""
    X = rows(200, 8, 2)
    idx = on_device(IndexStore(tmp_path).create("t", "s", X, kind="flat"), "cpu")
    other = SpaceIndex.load(tmp_path / "t")
    assert idx.search(X[:3], 1)[1][:, 0].tolist() == [0, 1, 2]
    new = idx.add(rows(5, 8, 3) * 10)
    assert idx.search(rows(5, 8, 3), 1)[1][:, 0].tolist() == new.tolist()
    idx.delete([0, 1])
    top = idx.search(X[:2], 3)[1]
    assert not np.isin(top, [0, 1]).any()
    same_answer(idx.search(X, 10), idx, X)
    n = idx.count
    idx.delete([2])
    back = idx.add(X[2:3])  # as many rows as before, one of them another row: the copy is made again all the same
    assert idx.count == n and idx.search(X[2:3], 1)[1][0, 0] == back[0] != 2
    far = other.add(-X[:1])  # another process's writer: a new generation on disk
    assert idx.search(-X[:1], 1)[1][0, 0] == far[0]  # search refreshes first, then the copy follows


def test_an_index_the_device_cannot_hold_is_searched_by_faiss_until_it_changes(monkeypatch):
    """Out of device memory (injected: this machine's device is torch's CPU): FAISS answers, one warning, no new
    upload for the same rows; after a change the device is tried again."""
    X = rows(100, 8, 14)
    idx = on_device(SpaceIndex.build("t", "s", X, kind="flat"), "cpu")
    real, tries = dev.DeviceRows._upload, []

    def full(self, *args):
        tries.append(args[0].ntotal)
        if len(tries) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return real(self, *args)

    monkeypatch.setattr(dev.DeviceRows, "_upload", full)
    with logged("vecbridge.indexes") as seen:
        for _ in range(3):
            same_answer(idx.search(X[:5], 4), idx, X[:5])
    assert tries == [100] and [r.getMessage() for r in seen] == ["flat index searched on the CPU: out of device memory"]
    idx.add(rows(3, 8, 15))
    same_answer(idx.search(X[:5], 4), idx, X[:5])
    assert tries == [100, 103]  # a new version: on the device again


def test_csls_reranking_runs_through_the_device_search():
    X = rows(300, 12, 4)
    a = on_device(SpaceIndex.build("t", "s", X, kind="flat"), "cpu")
    b = SpaceIndex.build("t", "s", X, kind="flat")  # FAISS
    Q = rows(9, 12, 5)
    S, I = a.search(Q, 5, csls_k=10)
    S0, I0 = b.search(Q, 5, csls_k=10)
    np.testing.assert_allclose(S, S0, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(I, I0)


def test_hnsw_and_ivf_stay_with_faiss():
    idx = on_device(SpaceIndex.build("t", "s", rows(300, 8, 6), kind="hnsw"), "cpu")
    idx._device.search = None  # would raise if called
    assert idx.search(rows(2, 8, 7), 3)[1].shape == (2, 3)


@pytest.mark.parametrize("bad", ["gpu", "cuda:", "cuda:x", "CUDA:123", "", "cpu0"])
def test_device_names_are_checked(bad):
    with pytest.raises(ValueError, match="'cpu', 'cuda' or 'cuda:N'"):
        dev.check_device(bad)
    assert dev.check_device(" CUDA:1 ") == "cuda:1"


@pytest.mark.skipif(CUDA or bool(RUN_DEVICE), reason="a CUDA device is present")
def test_a_gpu_asked_for_and_missing_is_one_line_and_exit_2(tmp_path):
    with pytest.raises(RuntimeError, match="sees no CUDA device"):
        dev.use_device("cuda")
    assert dev.search_device() == "cpu"
    for args, env, why in ((["--search-device", "cuda"], {}, "sees no CUDA device"),
                           (["--search-device", "tpu"], {}, "--search-device: search_device must be"),
                           ([], {"VECBRIDGE_SEARCH_DEVICE": "gpu"}, "search_device must be")):
        env = {**env_for(tmp_path, free_port()), **env}
        r = subprocess.run([sys.executable, "-m", "service.cli", "serve", *args], cwd=ROOT, env=env, check=False,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
        assert why in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


@pytest.mark.skipif(CUDA or bool(RUN_DEVICE), reason="a CUDA device is present")
def test_index_search_takes_the_device_too_and_refuses_a_missing_gpu_in_one_line(tmp_path, capsys, monkeypatch):
    from conftest import run_cli

    d = ["--data-dir", str(tmp_path / "var")]
    X = rows(30, 4, 16)
    np.save(tmp_path / "x.npy", X)
    assert run_cli(capsys, *d, "spaces", "add", "s", "--dim", "4")[0] == 0
    assert run_cli(capsys, *d, "index", "create", "ix", "--space", "s", str(tmp_path / "x.npy"), "--quiet")[0] == 0
    search = [*d, "index", "search", "ix", str(tmp_path / "x.npy"), "-k", "1", "--json"]
    for extra, env, source in ((["--search-device", "cuda"], None, "--search-device: "),
                               ([], "cuda:1", "VECBRIDGE_SEARCH_DEVICE: ")):
        if env:
            monkeypatch.setenv("VECBRIDGE_SEARCH_DEVICE", env)
        rc, out, err = run_cli(capsys, *search, *extra)
        assert rc == 2 and err.count("\n") == 1 and source in err and "sees no CUDA device" in err, err
        assert out == "" and dev.search_device() == "cpu"
    rc, out, _ = run_cli(capsys, *search, "--search-device", "cpu")  # the option wins over the variable
    assert rc == 0 and '"id": 29' in out


@cuda
def test_on_the_gpu_the_same_answers_as_faiss():
    X = rows(20_000, 384, 8)
    idx = on_device(SpaceIndex.build("t", "s", X, kind="flat"), "cuda")
    for b, k in ((1, 10), (64, 10), (1024, 100), (3, 9_999)):
        Q = rows(b, 384, 9 + b)
        same_answer(idx.search(Q, k), idx, Q)
    idx.add(rows(10, 384, 10))
    idx.delete([5, 6])
    Q = rows(50, 384, 11)
    same_answer(idx.search(Q, 10), idx, Q)


@cuda
def test_a_server_on_the_gpu_answers_as_faiss(tmp_path):
    """``vecbridge serve --search-device cuda``: /v1/info names the GPU; a cross-model search over HTTP gives the
    ids FAISS gives for the mapped queries."""
    data = tmp_path / "data"
    X, Y, m = seed_registry(data)
    proc, port = start_on_free_port(lambda port: ([sys.executable, "-m", "service.cli", "serve", "--search-device",
                                                   "cuda"], env_for(data, port)), tmp_path / "server.log")
    url = f"http://127.0.0.1:{port}"
    try:
        info = httpx.get(url + "/v1/info", headers=R, timeout=30).json()
        assert info["search_device"].startswith("cuda:0 ("), info
        r = httpx.post(url + "/v1/indexes", headers=W, json={"name": "ib", "space": "b", "vectors": Y.tolist()},
                       timeout=60)
        assert r.status_code == 201, r.text
        r = httpx.post(url + "/v1/indexes/ib/search", headers=R, timeout=60,
                       json={"vectors": X[:50].tolist(), "space": "a", "k": 5})
        assert r.status_code == 200, r.text
        got = np.array([[hit["id"] for hit in row] for row in r.json()["results"]])
    finally:
        stop(proc)
    ref = SpaceIndex.build("ref", "b", Y, kind="flat")
    want = ref.search(m.apply(X[:50]), 5)[1]
    assert (got[:, 0] == want[:, 0]).all() and (got[:, 0] == np.arange(50)).mean() > 0.9
