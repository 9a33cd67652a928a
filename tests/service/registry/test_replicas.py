"""Replicas (issue 7): two service processes sharing one PostgreSQL registry and one artifact store.

Versions registered and aliases moved through one replica are served by the other at once, with
the same answers: what references resolve to is re-read whenever the registry's generation moves
(every write bumps it), and loaded maps are cached only under their artifact sha256, which never
changes.

Needs ``VECBRIDGE_TEST_POSTGRES_URL`` (``eval "$(bash .ci/start_postgres.sh)"``); skipped without.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from _servers import free_port, stop, wait_ready
from _api_support import KEYS, W, planted

PG_URL = os.environ.get("VECBRIDGE_TEST_POSTGRES_URL")
pytestmark = pytest.mark.skipif(not PG_URL, reason="VECBRIDGE_TEST_POSTGRES_URL is not set "
                                                   "(eval \"$(bash .ci/start_postgres.sh)\")")
ROOT = Path(__file__).resolve().parents[3]


class Replica:
    """``uvicorn service.api:create_app --factory`` on a free port; own data dir, shared registry/artifacts."""

    def __init__(self, tmp: Path, label: str, registry_url: str, artifact_dir: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"{label}.log"
        env = {**os.environ, "VECBRIDGE_DATA_DIR": str(tmp / label), "VECBRIDGE_REGISTRY_URL": registry_url,
               "VECBRIDGE_ARTIFACT_DIR": str(artifact_dir), "VECBRIDGE_API_KEYS": json.dumps(KEYS),
               "VECBRIDGE_DEMO_ON_EMPTY": "false", "VECBRIDGE_LOG_LEVEL": "WARNING", "OMP_NUM_THREADS": "1"}
        self._fh = open(self.log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "service.api:create_app", "--factory", "--host", "127.0.0.1",
             "--port", str(self.port), "--log-level", "warning"], cwd=ROOT, env=env, stdout=self._fh,
            stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 60.0) -> None:
        wait_ready(self.url, proc=self.proc, timeout=timeout, log=self.log)

    def stop(self) -> None:
        stop(self.proc, timeout=20)
        self._fh.close()


def _fit(c: httpx.Client, X, Y, **kw) -> dict:
    body = {"name": "a2b", "source_space": "a", "target_space": "b", "method": "procrustes", "paired": True,
            "source": {"vectors": X.tolist()}, "target": {"vectors": Y.tolist()}, **kw}
    r = c.post("/v1/fits", json=body)
    assert r.status_code == 202, r.text
    jid = r.json()["id"]
    for _ in range(1200):
        j = c.get(f"/v1/jobs/{jid}").json()
        if j["state"] not in ("queued", "running"):
            break
        time.sleep(0.05)
    assert j["state"] == "succeeded", j
    return j["result"]["version"]


def _transform(c: httpx.Client, ref: str, Q: np.ndarray) -> tuple[int, np.ndarray]:
    r = c.post(f"/v1/maps/{ref}/transform", json={"vectors": Q.tolist(), "encoding_format": "base64"})
    assert r.status_code == 200, r.text
    body = r.json()
    import base64

    return body["version"], np.frombuffer(base64.b64decode(body["vectors_b64"]), "<f4").reshape(body["shape"])


def test_two_replicas_share_versions_and_aliases(tmp_path, pg_url):
    art = tmp_path / "artifacts"
    a, b = Replica(tmp_path, "ra", pg_url, art), Replica(tmp_path, "rb", pg_url, art)
    try:
        a.wait_ready()
        b.wait_ready()
        X, Y, _ = planted(200, seed=1)
        X2, Y2, _ = planted(200, seed=2)  # another rotation: version 2 answers differently
        Q = planted(5, seed=9)[0]
        with httpx.Client(base_url=a.url, headers=W, timeout=30) as ca, \
                httpx.Client(base_url=b.url, headers=W, timeout=30) as cb:
            for name in ("a", "b"):
                assert ca.post("/v1/spaces", json={"name": name, "dim": 16}).status_code == 201
            assert [s["name"] for s in cb.get("/v1/spaces").json()["data"]] == ["a", "b"]

            v1 = _fit(ca, X, Y, alias="prod")  # registered through A
            va, ya = _transform(ca, "a2b@prod", Q)
            vb, yb = _transform(cb, "a2b@prod", Q)  # served by B, which never saw the fit
            assert va == vb == v1["version"] == 1
            np.testing.assert_array_equal(ya, yb)

            assert _transform(cb, "a2b", Q)[0] == 1  # a bare name: the prod version (B resolves and caches it)
            v2 = _fit(ca, X2, Y2)  # a new version through A, no restart of B
            assert v2["version"] == 2
            vb2, yb2 = _transform(cb, "a2b:2", Q)  # served by B at once
            _, ya2 = _transform(ca, "a2b:2", Q)
            assert vb2 == 2 and not np.allclose(yb2, yb)
            np.testing.assert_array_equal(ya2, yb2)
            assert _transform(cb, "a2b@prod", Q)[0] == 1  # B has v1 cached under prod; the alias did not move
            assert _transform(cb, "a2b", Q)[0] == 1  # nor did the bare name: the refit is not live yet

            assert ca.put("/v1/maps/a2b/aliases/prod", json={"version": 2}).status_code == 200  # move on A
            vb3, yb3 = _transform(cb, "a2b@prod", Q)  # seen by B at once
            assert vb3 == 2 and _transform(cb, "a2b", Q)[0] == 2
            np.testing.assert_array_equal(yb3, ya2)
            assert cb.get("/v1/maps/a2b").json()["aliases"] == {"prod": 2}

            assert cb.put("/v1/maps/a2b/aliases/prod", json={"version": 1}).status_code == 200  # and back, on B
            assert _transform(ca, "a2b@prod", Q)[0] == 1
            assert cb.put("/v1/maps/a2b/aliases/canary", json={"version": 2}).status_code == 200  # new alias
            assert _transform(ca, "a2b@canary", Q)[0] == 2

            assert cb.delete("/v1/maps/a2b/versions/2").status_code == 200  # soft delete on B
            assert ca.post("/v1/maps/a2b:2/transform", json={"vectors": Q.tolist()}).status_code == 404
            assert _transform(ca, "a2b", Q)[0] == 1  # latest live version again, on A
    finally:
        a.stop()
        b.stop()
