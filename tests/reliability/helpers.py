"""Shared helpers of the reliability suite (no tests here).

* keys and headers (a read key, a read+write key, a write-only key);
* a small world of spaces and maps, including a soft-deleted version and an alias left
  pointing at it (the registry allows that: the alias was set before the delete);
* :func:`snapshot` of the whole registry, to show that a refused request changed nothing;
* :class:`Server`: a real ``vecbridge serve`` (or multi-worker uvicorn) subprocess on a free
  loopback port, with ``kill -9``, restart and RSS.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from _jobs_support import wait_http_job as wait_job  # noqa: F401  (the reliability tests import it from here)
from _servers import PortTaken, free_port, on_a_free_port, rss_kib, wait_ready
from align import fit_procrustes, fit_ridge
from service.config import Settings

KEYS = {"rel-read-5f1c": ["read"], "rel-write-9a2e": ["read", "write"], "rel-wonly-77d0": ["write"]}
READ_KEY, WRITE_KEY, WONLY_KEY = "rel-read-5f1c", "rel-write-9a2e", "rel-wonly-77d0"
R = {"Authorization": f"Bearer {READ_KEY}"}
W = {"Authorization": f"Bearer {WRITE_KEY}"}
WONLY = {"Authorization": f"Bearer {WONLY_KEY}"}
DIM = 16


def settings_for(tmp_path: Path, **kw) -> Settings:
    base = dict(data_dir=Path(tmp_path) / "data", api_keys=KEYS, demo_on_empty=False, log_level="WARNING")
    base.update(kw)
    return Settings(**base)


def planted(n: int = 400, seed: int = 0):
    """X (n, 16) in space a; Y = X Q in space b (planted rotation); Z = Y M in space c (12-d)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, DIM)).astype(np.float32)
    Q, _ = np.linalg.qr(rng.standard_normal((DIM, DIM)))
    Y = (X @ Q).astype(np.float32)
    Z = (Y @ rng.standard_normal((DIM, 12))).astype(np.float32)
    return X, Y, Z


def populate(registry, seed: int = 0) -> dict:
    """Spaces a, b (16-d), c (12-d); a2b:1 (prod), a2b:2 (deleted, alias ``stale`` on it), b2c:1."""
    X, Y, Z = planted(seed=seed)
    for name, dim in (("a", DIM), ("b", DIM), ("c", 12)):
        registry.register_space(name, dim)
    m_ab = fit_procrustes(X, Y)
    registry.register_version("a2b", m_ab, source_space="a", target_space="b", method="procrustes", params={},
                              alias="prod")
    registry.register_version("a2b", fit_procrustes(X[:200], Y[:200]), source_space="a", target_space="b",
                              method="procrustes", params={}, alias="stale")
    registry.delete_version("a2b", 2)
    registry.register_version("b2c", fit_ridge(Y, Z, alpha=1e-3), source_space="b", target_space="c",
                              method="ridge", params={"alpha": 1e-3})
    return {"X": X, "Y": Y, "Z": Z, "a2b": m_ab}


def populate_data_dir(data_dir: Path) -> dict:
    """:func:`populate` the registry of a service data folder, plus a mean-shift steer ``shift`` (space b, fitted
    on 40 rows of Y), before a server starts on it; the registry is closed again. Returns the data."""
    from align import fit_mean_shift
    from service.registry import open_registry

    s = Settings(data_dir=data_dir)
    reg = open_registry(s.resolved_registry_url(), s.resolved_artifact_dir())
    try:
        data = populate(reg)
        reg.register_steer("shift", fit_mean_shift(data["Y"][:40], [1] * 20 + [-1] * 20), space="b")
    finally:
        reg.close()
    return data


def snapshot(registry) -> dict:
    """Everything the registry holds (spaces, maps, every version with aliases and tags)."""
    maps = registry.list_maps()
    return {"spaces": [s.to_dict() for s in registry.list_spaces()], "maps": maps,
            "versions": {m["name"]: [v.to_dict() for v in registry.list_versions(m["name"])] for m in maps}}


def wait_healthy(url: str, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    """Poll ``url/healthz`` until it answers 200 (AssertionError on timeout, or when ``proc`` exits first)."""
    wait_ready(url, proc=proc, path="/healthz", timeout=timeout)


class Server:
    """A real service process on 127.0.0.1.

    ``workers=None``: ``vecbridge --data-dir D serve`` (the CLI). ``workers=N``: ``uvicorn
    service.api:create_app --factory --workers N`` (settings from the environment).
    """

    def __init__(self, data_dir: Path, *, workers: int | None = None, env: dict | None = None,
                 log_path: Path | None = None):
        self.data_dir = Path(data_dir)
        self.workers = workers
        self.extra_env = dict(env or {})
        self.log_path = Path(log_path) if log_path else self.data_dir.parent / "server.log"
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict:
        env = dict(os.environ)
        env.update({"VECBRIDGE_DATA_DIR": str(self.data_dir), "VECBRIDGE_API_KEYS": json.dumps(KEYS),
                    "VECBRIDGE_DEMO_ON_EMPTY": "false", "VECBRIDGE_LOG_LEVEL": "WARNING",
                    "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        env.update(self.extra_env)
        return env

    def start(self, timeout: float = 90.0) -> "Server":
        """Start the server on a :func:`free_port` (another one, up to :data:`PORT_TRIES` in all, where another
        process took it before the server bound it) and return once it is ready."""
        return on_a_free_port(lambda: self._start(timeout))

    def _start(self, timeout: float) -> "Server":
        self.port = free_port()
        if self.workers is None:
            cmd = ["vecbridge", "--data-dir", str(self.data_dir), "serve", "--host", "127.0.0.1", "--port",
                   str(self.port)]
        else:
            cmd = [sys.executable, "-m", "uvicorn", "service.api:create_app", "--factory", "--host", "127.0.0.1",
                   "--port", str(self.port), "--workers", str(self.workers), "--log-level", "warning"]
        if getattr(self, "_log", None):
            self._log.close()  # a previous start's (a restart, or a start whose port was taken)
        self._log = open(self.log_path, "ab")
        since = self._log.tell()  # this start's lines, after those of earlier starts
        self.proc = subprocess.Popen(cmd, env=self.env(), stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if b"[Errno 98]" in self.log_path.read_bytes()[since:]:  # EADDRINUSE: taken since free_port looked
                    raise PortTaken(f"port {self.port} was taken before the server bound it")
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log()[-2000:]}")
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    if self.workers is None or self._all_workers_ready():
                        return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.kill9()
        raise RuntimeError(f"server not ready after {timeout}s: {self.log()[-2000:]}")

    def _all_workers_ready(self) -> bool:
        # every worker must answer; a few readyz calls spread over the accept queue
        try:
            return all(httpx.get(self.url + "/readyz", timeout=2).status_code == 200 for _ in range(4))
        except httpx.HTTPError:
            return False

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def kill9(self) -> None:
        """SIGKILL the whole process group (server and its workers), no clean-up at all."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill9()
        if getattr(self, "_log", None):
            self._log.close()

    def rss_kib(self) -> int:
        return rss_kib(self.proc.pid) if self.proc else 0

    def client(self, headers: dict | None = None, timeout: float = 30.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=headers or {}, timeout=timeout)

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def fit_body(name: str, n: int = 64, seed: int = 0, dim: int = DIM, *, src="a", tgt="b", **kw) -> dict:
    """A small paired Procrustes fit request (rows from a planted rotation)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, dim)).astype(np.float32)
    Q, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    Y = (X @ Q).astype(np.float32)
    body = {"name": name, "source_space": src, "target_space": tgt, "method": "procrustes", "paired": True,
            "source": {"vectors": X.tolist()}, "target": {"vectors": Y.tolist()}}
    body.update(kw)
    return body
