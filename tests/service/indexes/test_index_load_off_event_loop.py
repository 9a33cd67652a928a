"""Catching up with a generation another process wrote happens off the event loop.

When another process (``--workers 2``, or a second server on the data dir) has written an index, the
next request for it in this process loads the new generation: it reads the whole FAISS file (~0.2 s for
160k x 384 rows, seconds for larger ones). Before, the index routes (get, add, delete, and a search too
large for the fast path) and the routes that list every index (``/v1/indexes``, ``/readyz``, ``/v1/info``)
did that on the event loop, so every other request of the process, ``/healthz`` included, waited for the
read. Here the new generation's FAISS file is a named pipe, so the load waits, deterministically, until the
test writes the file's bytes into it: meanwhile ``/healthz`` must answer, and afterwards the request must
see the new generation.
"""

from __future__ import annotations

import errno
import os
import threading
import time

import httpx
import numpy as np
import pytest
from _api_support import KEYS, R, W, settings_for
from _servers import serve_in_thread

from service.api import create_app
from service.indexes import IndexStore

DIM = 8
N = 20


def _rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def _wait_for_reader(fifo, timeout: float = 30.0) -> int:
    """Open the write end of ``fifo`` once a reader has it open (the server's load is then waiting on it)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


REQUESTS = {
    "get": lambda c: c.get("/v1/indexes/ix"),
    "add": lambda c: c.post("/v1/indexes/ix/vectors", json={"vectors": _rows(2, 9).tolist()}),
    "delete": lambda c: c.post("/v1/indexes/ix/delete", json={"ids": [0]}),
    # past the fast path's JSON bound (256 KiB): the route itself
    "search": lambda c: c.post("/v1/indexes/ix/search", json={"vectors": _rows(3000, 5).tolist(), "k": 1}),
    "list": lambda c: c.get("/v1/indexes"),
    "readyz": lambda c: c.get("/readyz"),  # what an orchestrator polls every few seconds
    "info": lambda c: c.get("/v1/info"),
}


@pytest.mark.parametrize("route", sorted(REQUESTS))
def test_loading_a_newer_generation_leaves_the_event_loop_free(route, tmp_path):
    app = create_app(settings_for(tmp_path, api_keys=KEYS, max_batch=5000, max_body_bytes=4_000_000))
    with serve_in_thread(app) as url:
        c = httpx.Client(base_url=url, headers=W, timeout=60)
        assert c.post("/v1/spaces", json={"name": "s", "dim": DIM}).status_code == 201
        assert c.post("/v1/indexes", json={"name": "ix", "space": "s", "vectors": _rows(N, 0).tolist()}
                      ).status_code == 201
        # another writer (its own store: a process of its own would do the same) commits generation 2
        other = IndexStore(tmp_path / "data" / "indexes")
        idx = other.get("ix")
        idx.add(_rows(1, 1))
        path = idx.path / f"delta.{idx.generation}.npz"  # a small add is logged: the new generation's one file
        content = path.read_bytes()
        path.unlink()
        os.mkfifo(path)

        answer: dict = {}
        th = threading.Thread(target=lambda: answer.setdefault("r", REQUESTS[route](c)), daemon=True)
        th.start()
        fd = _wait_for_reader(path)
        try:
            try:
                health = httpx.get(url + "/healthz", timeout=10)
            except httpx.TimeoutException:
                pytest.fail(f"/healthz did not answer while {route} loaded a generation: the event loop is blocked")
            assert health.status_code == 200
            assert th.is_alive(), "the request finished without reading the new generation"
        finally:
            os.set_blocking(fd, True)
            os.write(fd, content)
            os.close(fd)
        th.join(60)
        r = answer["r"]
        assert r.status_code == 200, r.text
        count = httpx.get(url + "/v1/indexes/ix", headers=R).json()["count"]
        assert count == {"add": N + 3, "delete": N}.get(route, N + 1)
