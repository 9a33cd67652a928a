"""`vecbridge serve` with no keys configured: a local key file, and where it is said; nothing open."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from reliability.helpers import free_port, wait_healthy
from service.api.app import ensure_local_key
from service.config import Settings

ROOT = Path(__file__).resolve().parents[3]


def test_local_key_is_made_once_private_and_reused(tmp_path):
    s = Settings(data_dir=tmp_path / "var", demo_on_empty=False)
    s1, path = ensure_local_key(s)
    assert path == tmp_path / "var" / "local-key" and stat.S_IMODE(path.stat().st_mode) == 0o600
    (key, scopes), = s1.api_keys.items()
    assert len(key) == 64 and scopes == ["read", "write"]
    s2, _ = ensure_local_key(s)
    assert s2.api_keys == s1.api_keys  # kept across restarts
    for other in (s.model_copy(update={"api_keys": {"k" * 40: ["read"]}}), s.model_copy(update={"auth_disabled": True}),
                  s.model_copy(update={"local_key": False})):
        assert ensure_local_key(other)[1] is None


def _environ(pid: int) -> bytes:
    return Path(f"/proc/{pid}/environ").read_bytes()


def _children(pid: int) -> list[int]:
    return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_without_keys_prints_where_the_key_is_and_answers_with_it(tmp_path, workers):
    """One process or ``--workers 2``: the key is in its file, said where, and never put in a process's environment
    (with workers it was passed on as VECBRIDGE_API_KEYS, readable in every worker's /proc/PID/environ and inherited
    by whatever they start). The curl line printed works as pasted, in a data dir whose path has a space (it was
    not quoted: `$(cat var é/local-key)` read two files that are not there)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VECBRIDGE_")}
    env.update(PYTHONPATH=str(ROOT), VECBRIDGE_DEMO_ON_EMPTY="false")
    proc = subprocess.Popen([sys.executable, "-c", "from service.cli import main; main()", "serve", "--data-dir",
                             str(tmp_path / "var é"), "--port", str(port), "--workers", str(workers)], env=env,
                            stderr=subprocess.PIPE, text=True)
    try:
        first, curl = proc.stderr.readline(), proc.stderr.readline().strip()
        key_file = tmp_path / "var é" / "local-key"
        assert str(key_file) in first and key_file.read_text().strip() not in first  # the path, never the key
        assert curl.startswith("curl -H ")  # run by a shell as printed, printf in curl's place
        said = subprocess.run(["bash", "-c", "printf '%s\\n' " + curl.removeprefix("curl ")], capture_output=True,
                              text=True, timeout=30, check=False)
        assert said.stdout.splitlines()[1] == f"Authorization: Bearer {key_file.read_text().strip()}", said
        base = f"http://127.0.0.1:{port}"
        wait_healthy(base, timeout=60, proc=proc)
        assert httpx.get(base + "/v1/info").status_code == 401
        key = key_file.read_text().strip()
        for _ in range(4):  # with workers: answered by either
            r = httpx.get(base + "/v1/info", headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200
        pids = [proc.pid, *_children(proc.pid)]
        assert len(pids) >= 1 + (workers if workers > 1 else 0)  # uvicorn's supervisor starts the workers
        assert not [p for p in pids if key.encode() in _environ(p)]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_an_unusable_local_key_file_is_one_line_and_exit_2(tmp_path):
    """A truncated ``local-key`` (or a folder of that name) was ``internal error: RuntimeError`` and exit 3, as if the
    service were broken; a key with a space in it was accepted and no Authorization header could send it."""
    from service.config import ConfigError

    s = Settings(data_dir=tmp_path / "var", demo_on_empty=False)
    (tmp_path / "var").mkdir()
    for content in ("short\n", "k" * 20 + " " + "k" * 20 + "\n"):
        (tmp_path / "var" / "local-key").write_text(content)
        with pytest.raises(ConfigError, match="holds no usable key"):
            ensure_local_key(s)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VECBRIDGE_")}
    env.update(PYTHONPATH=str(ROOT), VECBRIDGE_DEMO_ON_EMPTY="false")
    r = subprocess.run([sys.executable, "-m", "service.cli", "serve", "--data-dir", str(tmp_path / "var"), "--port",
                        str(free_port())], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and "holds no usable key" in r.stderr and "internal error" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("keys", [{}, {"k" * 40: ["read"]}])
def test_auth_disabled_beside_configured_keys_is_said_at_start(tmp_path, capsys, keys):
    """auth_disabled with API keys configured: the keys are not checked; the start says so instead of looking
    guarded (and an explicit auth_disabled without keys says nothing more)."""
    import json

    from fastapi.testclient import TestClient

    from service.api import create_app

    s = Settings(data_dir=tmp_path / "var", demo_on_empty=False, auth_disabled=True, api_keys=keys)
    with TestClient(create_app(s), base_url="http://localhost") as c:  # auth off: loopback Host names only
        assert c.get("/v1/maps").status_code == 200  # open: no key sent
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    warned = [r for r in lines if "API keys are ignored" in r["msg"]]
    assert [(r["level"], r.get("ignored")) for r in warned] == ([("WARNING", 1)] if keys else [])
