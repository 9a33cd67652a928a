"""`vecbridge serve` with no keys configured: a local key file, and where it is said; nothing open."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from _servers import children, read_line

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
        first, curl = read_line(proc, pipe=proc.stderr), read_line(proc, pipe=proc.stderr).strip()
        key_file = tmp_path / "var é" / "local-key"
        assert str(key_file) in first and key_file.read_text().strip() not in first  # the path, never the key
        assert curl.startswith("curl -H ")  # run by a shell as printed, printf in curl's place
        said = subprocess.run(["bash", "-c", "printf '%s\\n' " + curl.removeprefix("curl ")], capture_output=True,
                              text=True, timeout=30, check=False)
        assert said.stdout.splitlines()[1] == f"Authorization: Bearer {key_file.read_text().strip()}", said
        base = f"http://127.0.0.1:{port}"
        wait_healthy(base, timeout=60, proc=proc)
        key = key_file.read_text().strip()
        for headers in ({}, {"Authorization": "Bearer not-the-key"}, {"Authorization": "Basic x"}):
            for _ in range(2):  # with workers: each says it (a worker reads the key file itself)
                r = httpx.get(base + "/v1/info", headers=headers)
                said = r.json()["error"]["message"]  # "send 'Authorization: Bearer <key>'" and not where the key is
                assert r.status_code == 401 and f"key is in the file {key_file}" in said and key not in said, said
        page = httpx.get(base + "/ui/registry").text  # the console's 401 box said "keys come from VECBRIDGE_API_KEYS"
        assert f'<code id="key-file">{key_file}</code>' in page and key not in page
        for _ in range(4):  # with workers: answered by either
            r = httpx.get(base + "/v1/info", headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200
        pids = [proc.pid, *children(proc.pid)]
        assert len(pids) >= 1 + (workers if workers > 1 else 0)  # uvicorn's supervisor starts the workers
        assert not [p for p in pids if key.encode() in _environ(p)]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_configured_keys_send_no_one_to_a_key_file(tmp_path):
    """With keys configured (or read from a keys file) there is no local key: the 401 and the console name none."""
    from fastapi.testclient import TestClient

    from service.api import create_app

    s = Settings(data_dir=tmp_path / "var", demo_on_empty=False, api_keys={"k" * 40: ["read"]})
    assert ensure_local_key(s)[0].local_key_file is None
    with TestClient(create_app(s)) as c:
        said = c.get("/v1/info").json()["error"]["message"]
        page = c.get("/ui/registry").text
    assert said == "missing API key: send the header 'Authorization: Bearer <key>'"
    assert "key-file" not in page and "keys come\n      from <code>VECBRIDGE_API_KEYS</code>" in page


def test_serve_behind_a_prefix_prints_the_console_under_it(tmp_path):
    """``serve --root-path /vb`` printed the console as http://HOST:PORT/ui, which redirects to /vb/ui/... that only
    the proxy serves (a 404 there): the line names the console under the prefix, through the proxy; the curl line
    (the server's own address, which answers the stripped paths) still works as printed."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VECBRIDGE_")}
    env.update(PYTHONPATH=str(ROOT), VECBRIDGE_DEMO_ON_EMPTY="false")
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--data-dir", str(tmp_path / "var"),
                             "--port", str(port), "--root-path", "/vb"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        lines = [read_line(proc, pipe=proc.stderr) for _ in range(3)]
        console = lines[2].strip()
        assert console.startswith("console: ") and "<your proxy>/vb/ui " in console, lines
        assert f"127.0.0.1:{port}/ui" not in console, lines
        base = f"http://127.0.0.1:{port}"
        assert lines[1].strip().endswith(f"{base}/v1/info"), lines
        wait_healthy(base, timeout=60, proc=proc)
        key = (tmp_path / "var" / "local-key").read_text().strip()
        assert httpx.get(base + "/v1/info", headers={"Authorization": f"Bearer {key}"}).status_code == 200
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
        (tmp_path / "var" / "local-key").chmod(0o600)  # private, as a key file must be (write_text: the umask's)
        with pytest.raises(ConfigError, match="holds no usable key"):
            ensure_local_key(s)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VECBRIDGE_")}
    env.update(PYTHONPATH=str(ROOT), VECBRIDGE_DEMO_ON_EMPTY="false")
    r = subprocess.run([sys.executable, "-m", "service.cli", "serve", "--data-dir", str(tmp_path / "var"), "--port",
                        str(free_port())], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and "holds no usable key" in r.stderr and "internal error" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


KEY = "0123456789abcdef0123456789abcdef0123"


def _serve(data: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VECBRIDGE_")}
    env.update(PYTHONPATH=str(ROOT), VECBRIDGE_DEMO_ON_EMPTY="false")
    return subprocess.run([sys.executable, "-m", "service.cli", "serve", "--data-dir", str(data), "--port",
                           str(free_port())], env=env, capture_output=True, text=True, timeout=90, check=False)


def _key_file(data: Path, mode: int = 0o600) -> Path:
    data.mkdir(parents=True)
    (data / "local-key").write_text(KEY + "\n")
    (data / "local-key").chmod(mode)
    return data / "local-key"


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o606, 0o664], ids=lambda m: f"{m:04o}")
def test_a_local_key_others_may_read_or_write_is_refused_at_start(tmp_path, mode):
    """A 0644 local-key was used as it was while the start-up line said "mode 0600"; now one that other users may
    read or write is refused as sshd refuses such a private key: one line naming the file and the chmod that fixes
    it, exit 2."""
    key_file = _key_file(tmp_path / "var", mode)
    r = _serve(tmp_path / "var")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"{key_file} is open to other users (mode {mode:04o})" in r.stderr, r.stderr
    assert f"chmod 600 {key_file}" in r.stderr and KEY not in r.stderr + r.stdout
    assert stat.S_IMODE(key_file.stat().st_mode) == mode  # left as it was: its owner decides


@pytest.mark.parametrize("target", ["elsewhere", "missing"])
def test_a_local_key_that_is_a_symbolic_link_is_refused_at_start(tmp_path, target):
    """A link was followed wherever it pointed (a key outside the data dir, any file), and a dangling one was
    "vecbridge: error: [Errno 17] File exists"."""
    elsewhere = _key_file(tmp_path / "elsewhere")
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "local-key").symlink_to(elsewhere if target == "elsewhere" else tmp_path / "missing")
    r = _serve(tmp_path / "var")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"{tmp_path / 'var' / 'local-key'} is a symbolic link" in r.stderr and "Errno" not in r.stderr, r.stderr
    assert not (tmp_path / "missing").exists()  # nothing made through the link


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_local_key_of_another_user_is_refused_at_start(tmp_path):
    key_file = _key_file(tmp_path / "var")
    os.chown(key_file, 65534, -1)
    r = _serve(tmp_path / "var")
    assert r.returncode == 2 and f"{key_file} belongs to another user (uid 65534" in r.stderr, r.stderr


def test_the_start_up_line_says_the_key_file_s_own_mode(tmp_path):
    """It said "mode 0600" whatever the file's mode; a stricter 0400 is used and said."""
    key_file = _key_file(tmp_path / "var", 0o400)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VECBRIDGE_")}
    env.update(PYTHONPATH=str(ROOT), VECBRIDGE_DEMO_ON_EMPTY="false")
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--data-dir", str(tmp_path / "var"),
                             "--port", str(free_port())], env=env, stderr=subprocess.PIPE, text=True)
    try:
        first = read_line(proc, pipe=proc.stderr)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert f"key is in {key_file} (mode 0400, kept across restarts)" in first, first


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


@pytest.mark.parametrize("mode", [0o640, 0o620, 0o660], ids=lambda m: f"{m:04o}")
def test_a_local_key_open_to_its_group_only_is_made_private_and_used(tmp_path, mode):
    """Kubernetes' fsGroup adds group bits to every file of a volume at each mount: a refusal of such a key stopped
    every later start of the pod. Group bits alone are taken away (0600) with a warning, and the key is used."""
    from service.api.keyfile import read_local_key

    key_file = _key_file(tmp_path / "var", mode)
    assert read_local_key(key_file) == KEY
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
