"""``service.client.Client`` / ``AsyncClient`` across processes, copies, closes and event loops, against the real
service (uvicorn on loopback, the data dir of ``_servers.seed_registry``: spaces ``a``, ``b``, map ``a2b``)."""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import multiprocessing as mp
import pickle
import subprocess
import sys
import threading
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from _servers import seeded_uvicorn

from service.client import (
    APIConnectionError,
    AsyncClient,
    Client,
    ClientClosedError,
    EventLoopError,
)

WKEY = "wkey-456"  # test_api_support.KEYS
ROOT = Path(__file__).resolve().parents[2]
# The parent of the fork test: a fresh Python process (no thread but its own), as a user's script is. Forked from the
# test worker itself, ``fork()`` could block for good (reproduced): when a thread an earlier test left running is
# inside a BLAS call, OpenBLAS's fork handler in the parent waits on its thread pool without end (grpc's handlers,
# loaded by the Ray tests, wait too); the six children then waited at the barrier for ever. A likely cause of a CI
# run that stopped at 99% with this file's five tests unreported. Every wait here has a limit.
_FORK_PARENT = """
import json, multiprocessing as mp, sys
import numpy as np
from service.client import Client

url, key, X = sys.argv[1], sys.argv[2], np.asarray(json.loads(sys.argv[3]), dtype=np.float32)
INHERITED = {}


def in_child(i):
    vb, Y, barrier = INHERITED["vb"], INHERITED["Y"], INHERITED["barrier"]
    barrier.wait(60)  # all six at once
    seen = []
    for _ in range(10):
        try:
            seen.append("ok" if np.allclose(vb.transform("a2b", X[i:i + 1]), Y[i:i + 1], atol=1e-6) else "wrong")
        except Exception as e:  # what a child saw, for the test's assertion
            seen.append(f"{type(e).__name__}: {e}"[:200])
    return seen


with Client(url, api_key=key) as vb:
    Y = vb.transform("a2b", X)  # the parent's keep-alive connection, pooled when the children fork
    ctx = mp.get_context("fork")
    INHERITED.update(vb=vb, Y=Y, barrier=ctx.Barrier(6))
    with ctx.Pool(6) as pool:
        seen = [s for child in pool.map_async(in_child, range(6)).get(timeout=120) for s in child]
    seen.append("ok" if np.allclose(vb.transform("a2b", X), Y, atol=1e-6) else "wrong")  # the parent's own
print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with seeded_uvicorn(tmp_path_factory.mktemp("client_processes")) as (url, (X, _, _)):
        yield url, X


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="no fork on this platform")
def test_forked_children_do_not_share_the_parents_connection(server):
    """QA: a Client used in the parent, then in the children of a ``fork`` pool: every process sent on the one
    pooled socket the parent had opened, so answers went to the wrong child (another row's vectors) and requests
    interleaved into a 400 "not valid HTTP/1.1". Each child opens its own connection now."""
    url, X = server
    cmd = [sys.executable, "-c", _FORK_PARENT, url, WKEY, json.dumps(X[:6].tolist())]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == ["ok"] * 61  # six children ten times each, then the parent's own connection


def _transform(vb: Client, X: np.ndarray) -> np.ndarray:
    return vb.transform("a2b", X)


def test_a_client_pickles_and_copies_with_its_settings_and_a_connection_of_its_own(server):
    """QA: ``pickle.dumps(vb)`` / ``copy.deepcopy(vb)`` raised ``TypeError: cannot pickle '_thread.RLock'``, so a
    client could not go to a ``spawn`` process pool, nor be in an object ``sklearn.clone`` copies; ``copy.copy``
    shared the original's connections (closing the copy closed the original). The copy holds the key too."""
    url, X = server
    with Client(url, api_key=WKEY, max_retries=1, batch_size=3, page_size=7, headers={"X-Team": "t1"}) as vb:
        want = vb.transform("a2b", X[:5])
        for twin in (pickle.loads(pickle.dumps(vb)), copy.deepcopy(vb), copy.copy(vb)):
            assert type(twin) is Client and twin._http is not vb._http
            assert (twin.max_retries, twin.batch_size, twin.page_size) == (1, 3, 7)
            assert twin._http.headers["X-Team"] == "t1"
            with twin:
                assert np.allclose(twin.transform("a2b", X[:5]), want, atol=1e-6)  # the key came along: a 401 else
        assert np.allclose(vb.transform("a2b", X[:5]), want, atol=1e-6)  # closing the copies left it open
        with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
            assert np.allclose(pool.submit(_transform, vb, X[:5]).result(timeout=120), want, atol=1e-6)
        shipped = pickle.loads(pickle.dumps(functools.partial(vb.transform, "a2b")))  # sklearn's FunctionTransformer
        assert np.allclose(shipped(X[:5]), want, atol=1e-6)
        shipped.func.__self__.close()

    async def main():
        async with AsyncClient(url, api_key=WKEY) as a, copy.deepcopy(a) as b:
            assert np.allclose(await b.transform("a2b", X[:5]), want, atol=1e-6)

    asyncio.run(main())


def test_a_closed_client_fails_at_once_without_retrying(server):
    """QA: a call on a closed client was retried as "no answer": "no answer from ... (... not sent, this client was
    closed (open a new one)) after 3 tries", after 1.5 s of backoff; ``wait`` went on polling it until its timeout.
    One try, one message, a :class:`ClientClosedError` (still an APIConnectionError)."""
    url, X = server
    vb = Client(url, api_key=WKEY, max_retries=5)
    vb.close()
    for call in (lambda: vb.transform("a2b", X[:2]), lambda: vb.list_maps(), lambda: vb.wait("j1", timeout=5.0)):
        with pytest.raises(ClientClosedError) as closed:
            call()
        assert isinstance(closed.value, APIConnectionError)
        assert "this client was closed (open a new one)" in str(closed.value)
        assert "tries" not in str(closed.value) and "no answer" not in str(closed.value)


def test_an_async_client_serves_a_second_asyncio_run(server):
    """QA: an AsyncClient made at module level and used in one ``asyncio.run``, then in another, raised a bare
    ``RuntimeError('Event loop is closed')``: its pooled connection belonged to the first loop. It opens new
    connections in the new loop now."""
    url, X = server
    a = AsyncClient(url, api_key=WKEY)

    async def go():
        return await a.transform("a2b", X[:3])

    first = asyncio.run(go())
    assert np.allclose(asyncio.run(go()), first, atol=1e-6)
    asyncio.run(a.close())


def test_an_async_client_refuses_a_second_loop_while_its_own_still_runs(server):
    """One AsyncClient used from two running loops (two threads) shared connections between them; the second
    loop's call is a typed :class:`EventLoopError` saying to open one AsyncClient per loop, and the first loop's
    calls go on."""
    url, X = server
    a = AsyncClient(url, api_key=WKEY)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        first = asyncio.run_coroutine_threadsafe(a.transform("a2b", X[:3]), loop).result(timeout=60)

        async def elsewhere():
            return await a.transform("a2b", X[:3])

        with pytest.raises(EventLoopError, match="open one AsyncClient inside each running loop"):
            asyncio.run(elsewhere())
        again = asyncio.run_coroutine_threadsafe(a.transform("a2b", X[:3]), loop).result(timeout=60)
        assert np.allclose(again, first, atol=1e-6)
        asyncio.run_coroutine_threadsafe(a.close(), loop).result(timeout=60)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=60)
        loop.close()
