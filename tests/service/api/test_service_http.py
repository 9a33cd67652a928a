"""The service as a real process: uvicorn (and ``vecbridge serve``) on a free port, talked to with httpx."""

from __future__ import annotations

import io
import shutil
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from _servers import env_for, seed_registry, start, start_on_free_port, stop
from _api_support import KEYS, R, W

ROOT = Path(__file__).resolve().parents[3]


def exercise(base: str, X: np.ndarray, Y: np.ndarray, m) -> None:
    with httpx.Client(base_url=base, timeout=30.0) as c:
        assert c.get("/readyz").json()["status"] == "ready"
        maps = c.get("/v1/maps", headers=R).json()["data"]
        assert maps[0]["name"] == "a2b" and maps[0]["source_dim"] == 16 and maps[0]["target_dim"] == 16
        # JSON contract
        r = c.post("/v1/maps/a2b/transform", headers=R, json={"vectors": X[:3].tolist()})
        body = r.json()
        assert r.status_code == 200 and body["map"] == "a2b" and body["version"] == 1
        np.testing.assert_allclose(np.array(body["vectors"]), m.apply(X[:3], output="raw"), atol=1e-6)
        # binary fast path
        r = c.post("/v1/maps/a2b/transform", headers={**R, "content-type": "application/octet-stream"},
                   content=X.tobytes())
        np.testing.assert_allclose(np.frombuffer(r.content, "<f4").reshape(X.shape), m.apply(X, output="raw"),
                                   atol=1e-6)
        buf = io.BytesIO()
        np.save(buf, X[:4])
        r = c.post("/v1/maps/a2b/transform", headers={**R, "content-type": "application/x-npy"}, content=buf.getvalue())
        assert np.load(io.BytesIO(r.content)).shape == (4, 16)
        # errors
        assert c.post("/v1/maps/zzz/transform", headers=R, json={"vectors": [[0.0] * 16]}).status_code == 404
        assert c.post("/v1/maps/a2b/transform", headers=R, json={"vectors": [[0.0] * 3]}).status_code == 422
        assert c.post("/v1/maps/a2b/transform", json={"vectors": [[0.0] * 16]}).status_code == 401
        # an index, cross-model search, persisted
        r = c.post("/v1/indexes", headers=W, json={"name": "ib", "space": "b", "vectors": Y.tolist()})
        assert r.status_code == 201
        r = c.post("/v1/indexes/ib/search", headers=R, json={"vectors": X[:10].tolist(), "space": "a", "k": 1})
        assert [row[0]["id"] for row in r.json()["results"]] == list(range(10))
        assert "vecbridge_request_duration_seconds" in c.get("/metrics", headers=R).text
        assert c.get("/docs").status_code == 200


def test_uvicorn_subprocess(tmp_path):
    data = tmp_path / "data"
    X, Y, m = seed_registry(data)
    log = tmp_path / "server.log"

    def command(port: int) -> list[str]:
        return [sys.executable, "-m", "uvicorn", "--factory", "service.api:create_app", "--host", "127.0.0.1",
                "--port", str(port), "--no-access-log"]

    proc, port = start_on_free_port(lambda port: (command(port), env_for(data, port)), log)
    try:
        exercise(f"http://127.0.0.1:{port}", X, Y, m)
    finally:
        stop(proc)
    text = log.read_text()
    assert '"route": "/v1/maps/{ref}/transform"' in text  # structured access log
    for key in KEYS:
        assert key not in text  # keys never logged
    assert (data / "indexes" / "ib" / "meta.json").exists()
    # restart on the same data dir: the index is loaded again
    proc = start(command(port), env_for(data, port), port, log)  # the same port
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30.0) as c:
            assert c.get("/v1/indexes/ib", headers=R).json()["count"] == len(Y)
    finally:
        stop(proc)


@pytest.mark.skipif(shutil.which("vecbridge") is None, reason="vecbridge console script not installed")
def test_vecbridge_serve_command(tmp_path):
    data = tmp_path / "data"
    X, Y, m = seed_registry(data)
    proc, port = start_on_free_port(lambda port: (  # --data-dir must win over the environment's
        ["vecbridge", "serve", "--data-dir", str(data), "--host", "127.0.0.1", "--port", str(port)],
        env_for(tmp_path / "elsewhere", port)), tmp_path / "serve.log")
    try:
        exercise(f"http://127.0.0.1:{port}", X, Y, m)
    finally:
        stop(proc)
