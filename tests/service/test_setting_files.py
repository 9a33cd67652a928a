"""Settings from files (``VECBRIDGE_<NAME>_FILE``, Docker / Kubernetes secrets) and API keys re-read from their file
while the service runs. Real ``vecbridge`` processes, a real SQLite registry, real HTTP with ``--workers 2``.
Before: no setting could come from a file (``VECBRIDGE_API_KEYS_FILE`` was an unknown setting, exit 2), so keys and
database passwords had to sit in the environment, and changing a key needed a restart of every process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from _servers import ROOT, env_for, seed_registry, start, start_on_free_port, stop
from conftest import logged, run_cli

from service.config import ConfigError, load_settings

OLD, NEW = "old-key-0123456789", "new-key-9876543210"


def write_keys(path: Path, keys) -> None:
    """Replace ``path`` whole (a new file renamed over it, as a secret update does)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(keys if isinstance(keys, str) else json.dumps(keys), encoding="utf-8")
    os.replace(tmp, path)


def status(url: str, key: str) -> int:
    return httpx.get(f"{url}/v1/maps", headers={"Authorization": f"Bearer {key}"}, timeout=30).status_code


def wait_for(url: str, key: str, code: int, *, tries: int = 40) -> list[int]:
    """Ask ``tries`` times (fresh connections: with --workers they reach either process) until ``code`` came
    back ``tries // 4`` times in a row; the answers seen."""
    seen = []
    for _ in range(tries * 4):
        seen.append(status(url, key))
        if seen[-(tries // 4):] == [code] * (tries // 4):
            return seen
        time.sleep(0.1)
    raise AssertionError(f"{key} never settled on {code}: {seen}")


def test_keys_rotate_in_every_worker_without_a_restart(tmp_path):
    """Keys from ``VECBRIDGE_API_KEYS_FILE`` under ``vecbridge serve --workers 2``: a new key works and a revoked one
    is refused within seconds of the file's change, in both workers; a broken file keeps the keys in force (logged);
    the file's path, not its keys, reaches the workers' environment."""
    data, keys = tmp_path / "data", tmp_path / "secrets" / "keys.json"
    seed_registry(data)
    keys.parent.mkdir()
    write_keys(keys, {OLD: ["read", "write"]})
    log = tmp_path / "serve.log"
    proc, port = start_on_free_port(lambda port: ([sys.executable, "-m", "service.cli", "serve", "--workers", "2"], {
        **{k: v for k, v in env_for(data, port).items() if k != "VECBRIDGE_API_KEYS"},
        "VECBRIDGE_API_KEYS_FILE": str(keys)}), log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(url, OLD, 200)
        assert status(url, NEW) == 401
        pids = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True,
                                               check=False).stdout.split()]
        environs = [Path(f"/proc/{p}/environ").read_bytes() for p in pids]
        assert any(b"VECBRIDGE_API_KEYS_FILE=" in e for e in environs), "no worker process found"
        assert not any(OLD.encode() in e for e in environs)  # the secret is not in any process's environment
        write_keys(keys, {NEW: ["read"]})
        wait_for(url, NEW, 200)
        wait_for(url, OLD, 401)
        write_keys(keys, '{"' + NEW + '": ["read"], ')  # cut short: not JSON
        time.sleep(1.5)
        assert {status(url, NEW) for _ in range(12)} == {200} and status(url, OLD) == 401
        write_keys(keys, {NEW: ["admin"]})  # JSON, but a scope that does not exist
        time.sleep(1.5)
        assert {status(url, NEW) for _ in range(12)} == {200}
    finally:
        stop(proc)
    text = log.read_text()
    assert "API keys reloaded" in text and "API keys file not reloaded" in text, text[-3000:]
    assert OLD not in text and NEW not in text  # keys are never logged


def cli(*args, env: dict) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("VECBRIDGE_")}
    return subprocess.run([sys.executable, "-m", "service.cli", *map(str, args)], cwd=ROOT, env={**base, **env},
                          capture_output=True, text=True, timeout=120, check=False)


def test_a_registry_url_from_a_file_is_used_and_bad_files_are_one_line(tmp_path):
    """``VECBRIDGE_REGISTRY_URL_FILE`` (a URL that would carry a password) is the registry the CLI opens; a missing
    file, a setting given twice, a keys file that is not JSON or holds a bad scope are exit 2 with one line that
    names the variable and never the secret."""
    data = tmp_path / "data"
    seed_registry(data)
    url = tmp_path / "registry-url"
    url.write_text(f"sqlite:///{data / 'registry.sqlite'}\n")  # as `echo URL > file` writes it
    r = cli("--data-dir", tmp_path / "elsewhere", "registry", "list", "--json", env={"VECBRIDGE_REGISTRY_URL_FILE":
                                                                                     str(url)})
    assert r.returncode == 0, r.stderr
    assert "a2b" in r.stdout
    secret = tmp_path / "keys.json"
    cases = {
        "missing": ({"VECBRIDGE_API_KEYS_FILE": str(tmp_path / "nope")}, "VECBRIDGE_API_KEYS_FILE: cannot read"),
        "twice": ({"VECBRIDGE_API_KEYS_FILE": str(secret), "VECBRIDGE_API_KEYS": "{}"}, "both set"),
        # in another case (pydantic reads any): the file won and the variable was ignored in silence
        "twice, lower case": ({"VECBRIDGE_API_KEYS_FILE": str(secret), "vecbridge_api_keys": "{}"}, "both set"),
        "not json": ({"VECBRIDGE_API_KEYS_FILE": str(secret)}, "is not valid JSON"),
        "bad scope": ({"VECBRIDGE_API_KEYS_FILE": str(secret)}, "VECBRIDGE_API_KEYS_FILE: key 1 has scopes"),
        "not ascii": ({"VECBRIDGE_API_KEYS_FILE": str(secret)}, "key 1 holds a character that is not printable ASCII"),
        "unknown": ({"VECBRIDGE_PORTT_FILE": str(secret)}, "unknown setting VECBRIDGE_PORTT_FILE"),
    }
    for what, (env, message) in cases.items():
        secret.write_text({"not json": '{"s3cret-value-xyz": [', "not ascii": '{"s3cret-value-xyzé": ["read"]}'}.get(
            what, '{"s3cret-value-xyz": ["admin"]}'), encoding="utf-8")
        r = cli("--data-dir", data, "registry", "list", env=env)
        assert r.returncode == 2 and message in r.stderr, (what, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "s3cret" not in r.stderr, (what, r.stderr)


def test_file_settings_parse_as_their_variables_do(tmp_path, monkeypatch):
    """Lists and objects are JSON, numbers and paths are text with the trailing newline dropped, and a
    command-line option (an override) wins over the file."""
    for k in list(os.environ):
        if k.startswith("VECBRIDGE_"):
            monkeypatch.delenv(k)
    files = {"port": "8123\n", "allowed_hosts": '["vecbridge", "*.internal"]', "data_dir": f"{tmp_path}/d \n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        monkeypatch.setenv(f"VECBRIDGE_{name.upper()}_FILE", str(tmp_path / name))
    s = load_settings()
    assert (s.port, s.allowed_hosts, s.data_dir) == (8123, ["vecbridge", "*.internal"], tmp_path / "d")
    assert load_settings(port=9000).port == 9000
    assert s.to_env()["VECBRIDGE_PORT_FILE"] == str(tmp_path / "port") and "VECBRIDGE_PORT" not in s.to_env()
    (tmp_path / "port").write_text("eighty")
    with pytest.raises(ConfigError, match="VECBRIDGE_PORT_FILE") as err:
        load_settings()
    assert "eighty" not in str(err.value)


def _settings_from_keys_file(tmp_path, monkeypatch, keys_json):
    """``(keys file, settings)``: settings read from the environment with only ``VECBRIDGE_API_KEYS_FILE`` set."""
    for k in list(os.environ):
        if k.startswith("VECBRIDGE_"):
            monkeypatch.delenv(k)
    keys = tmp_path / "keys.json"
    write_keys(keys, keys_json)
    monkeypatch.setenv("VECBRIDGE_API_KEYS_FILE", str(keys))
    return keys, load_settings()


def test_a_keys_file_changed_before_the_first_request_is_the_one_in_force(tmp_path, monkeypatch):
    """The settings read the keys file at start; the file changed before the first authenticated request (workers
    start for seconds). Before: the first request recorded the changed file as the one already read, so the old
    keys stayed in force until the file changed again (a revoked key kept working)."""
    from service.api.keyfile import current_keys

    keys, settings = _settings_from_keys_file(tmp_path, monkeypatch, {OLD: ["read"]})
    assert settings.api_keys == {OLD: ["read"]}
    write_keys(keys, {NEW: ["read", "write"]})
    assert current_keys(settings) == {NEW: ["read", "write"]}


def test_a_reloaded_keys_file_with_a_key_no_header_can_send_keeps_the_old_keys(tmp_path, monkeypatch):
    """A key with a character that is not printable ASCII could never authenticate: the reload refuses the file as
    it refuses any other bad one (the keys read before stay in use, an error is logged without the key)."""
    from service.api.keyfile import current_keys

    keys, settings = _settings_from_keys_file(tmp_path, monkeypatch, {OLD: ["read"]})
    write_keys(keys, json.dumps({NEW + "é": ["read", "write"]}, ensure_ascii=False))
    with logged("vecbridge.auth", "ERROR") as records:
        assert current_keys(settings) == {OLD: ["read"]}
    text = "\n".join(r.getMessage() for r in records)
    assert "API keys file not reloaded" in text and "not printable ASCII" in text
    assert NEW not in text


def test_a_command_line_option_wins_over_a_file_in_the_workers_too(tmp_path, monkeypatch, capsys):
    """``serve --workers 2 --registry-url B`` with ``VECBRIDGE_REGISTRY_URL_FILE`` naming A: the parent took B, but its
    settings still said the URL came from the file, so the workers were handed ``VECBRIDGE_REGISTRY_URL_FILE`` and
    served registry A -- fits and aliases went to another database than the one asked for, in silence."""
    import service.api
    from service.api.app import _pass_to_workers

    for k in list(os.environ):
        if k.upper().startswith("VECBRIDGE_"):
            monkeypatch.delenv(k)
    (tmp_path / "url").write_text(f"sqlite:///{tmp_path / 'file.sqlite'}\n")
    option = f"sqlite:///{tmp_path / 'option.sqlite'}"
    monkeypatch.setenv("VECBRIDGE_REGISTRY_URL_FILE", str(tmp_path / "url"))
    monkeypatch.setenv("VECBRIDGE_AUTH_DISABLED", "true")
    got = {}
    monkeypatch.setattr(service.api, "serve", lambda settings, workers: got.update(settings=settings, workers=workers))
    code, _, err = run_cli(capsys, "--data-dir", tmp_path, "serve", "--registry-url", option, "--workers", "2")
    assert code == 0 and got["workers"] == 2 and got["settings"].registry_url == option, err
    before = dict(os.environ)
    try:
        _pass_to_workers(got["settings"])  # what serve(workers=2) does before starting them
        worker = load_settings()  # what each worker reads
    finally:
        os.environ.clear()
        os.environ.update(before)
    assert worker.registry_url == option
