"""Settings as an operator writes them: ``VECBRIDGE_*`` variables, and the container's own command line.

A variable that names no setting, or holds a value its setting refuses, stops start-up with one line naming
it (exit 2) -- never a default used in silence, a traceback, or a key echoed to the logs.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from _servers import free_port, start_on_free_port, stop

from service.config import ConfigError, Settings, load_settings, unknown_variables

ROOT = Path(__file__).resolve().parents[2]
SECRET = "sk-live-7f3e9a1c"


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("VECBRIDGE_")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **extra)
    return env


@pytest.fixture
def clean_env(monkeypatch):
    for k in list(os.environ):
        if k.upper().startswith("VECBRIDGE_"):
            monkeypatch.delenv(k)
    return monkeypatch


@pytest.mark.parametrize("name, value, says", [
    ("VECBRIDGE_PROT", "9000", "VECBRIDGE_PORT?"),                    # a typo: the port stayed 8000
    ("VECBRIDGE_API_KEY", "abc", "VECBRIDGE_API_KEYS?"),             # singular: auth used the local key instead
    ("VECBRIDGE_LIMITS__MAX_KK", "5", "VECBRIDGE_LIMITS__MAX_K?"),   # nested typo
    ("VECBRIDGE_PORT__X", "1", "unknown setting VECBRIDGE_PORT__X"),  # nested under a plain field
    ("vecbridge_datadir", "/srv", "VECBRIDGE_DATA_DIR?"),            # any case, as pydantic reads them
])
def test_a_variable_that_names_no_setting_is_refused(clean_env, name, value, says):
    clean_env.setenv(name, value)
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert name in str(err.value) and says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["VECBRIDGE_WORDNET_DIR", "VECBRIDGE_BENCH_CACHE", "VECBRIDGE_RUN_SLOW"])
def test_the_tests_and_benchmarks_own_variables_are_not_settings(clean_env, name):
    """VECBRIDGE_BENCH_CACHE (where the WordNet sample is cached, benchmarks/wordnet_sample.py) stopped every server
    the test suite started with it set: "unknown setting"."""
    clean_env.setenv(name, "/tmp/x")
    assert load_settings().port == Settings().port and unknown_variables(os.environ) == []


@pytest.mark.parametrize("name, value, says", [
    ("VECBRIDGE_PORT", "abc", "valid integer"),
    ("VECBRIDGE_API_KEYS", "{" + f'"{SECRET}": ["read"],' + "}", "not valid JSON"),  # was exit 3 "internal error"
    ("VECBRIDGE_CORS_ORIGINS", "https://app.example", "not valid JSON"),
    ("VECBRIDGE_CORS_ORIGINS", '["app.example"]', "give an origin as a browser sends it"),  # matched no request
    ("VECBRIDGE_ALLOWED_HOSTS", '["localhost:18206"]', "without a port"),  # matched no request: every one a 400
    ("VECBRIDGE_ALLOWED_HOSTS", '["*."]', "names no domain"),  # became "*": any host was answered
    ("VECBRIDGE_API_KEYS", json.dumps({SECRET: "read"}), "valid list"),  # named VECBRIDGE_API_KEYS__<the key>
    ("VECBRIDGE_API_KEYS", json.dumps({SECRET: ["reed"]}), "'read' and/or 'write'"),  # a key that could do nothing
    ("VECBRIDGE_API_KEYS", json.dumps({SECRET: []}), "'read' and/or 'write'"),
    ("VECBRIDGE_API_KEYS", json.dumps({" " + SECRET: ["read"]}), "white space"),  # no header can send it
    # accepted, then every request with it was a 401: a header carries ASCII only
    ("VECBRIDGE_API_KEYS", json.dumps({SECRET + "é": ["read"]}, ensure_ascii=False), "not printable ASCII"),
    ("VECBRIDGE_API_KEYS", json.dumps({SECRET + "\x7f": ["read"]}), "not printable ASCII"),
    ("VECBRIDGE_LOG_LEVEL", "LOUD", "DEBUG, INFO"),  # was exit 3 "Unknown level" after printing the key's file
    # accepted, then `serve` failed its start-up with a traceback (exit 3) quoting the password; the CLI printed it
    ("VECBRIDGE_REGISTRY_URL", f"mysql://admin:{SECRET}@db/vb", "unsupported registry URL (scheme 'mysql'"),
    # a typo: /readyz said ready and every migration or collection search was a 503
    ("VECBRIDGE_VECTORDB_URL", f"qdrnat://{SECRET}@db:6333", "unknown vector-database URL scheme 'qdrnat'"),
    ("VECBRIDGE_JOB_WORKERS", "0", "greater than or equal to 1"),  # silently ran 1 worker
    ("VECBRIDGE_MAX_QUEUED_JOBS", "-1", "greater than or equal to 0"),
    ("VECBRIDGE_JOB_HISTORY", "10", "greater than or equal to 100"),
    ("VECBRIDGE_COMPUTE_MAX_WAITING", "-1", "greater than or equal to 0"),
    # an OpenMP team of 20000 threads on 2 cores: an HNSW add of 3000 rows took 31 s instead of 0.3 s
    ("VECBRIDGE_BLAS_THREADS", "20000", "less than or equal to 256"),
    ("VECBRIDGE_MAX_BATCH", "0", "greater than or equal to 1"),
    # PostgreSQL counts whole ms: it became statement_timeout=0, no limit at all
    ("VECBRIDGE_REGISTRY_STATEMENT_TIMEOUT_S", "0.0004", "at least 0.001 (1 ms)"),
    ("VECBRIDGE_LIMITS", json.dumps({"max_kk": 5}), "VECBRIDGE_LIMITS__MAX_KK"),  # ignored inside the JSON too
    # limits the checks read from constants: another value was accepted, shown in /v1/info, and had no effect
    ("VECBRIDGE_LIMITS__MAX_DIM", "1024", "fixed at 65536"),
    ("VECBRIDGE_LIMITS__MAX_NAME", "64", "fixed at 128"),
    ("VECBRIDGE_LIMITS__MAX_DESCRIPTION", "100", "fixed at 4096"),
    ("VECBRIDGE_LIMITS__MAX_TAG_BYTES", "100", "fixed at 16384"),
    ("VECBRIDGE_LIMITS__MAX_JSON_DEPTH", "4", "fixed at 32"),
])
def test_a_bad_value_is_one_line_naming_the_variable_and_never_the_key(clean_env, name, value, says):
    clean_env.setenv(name, value)
    with pytest.raises(ConfigError) as err:
        load_settings()
    msg = str(err.value)
    assert msg.startswith(f"setting {name.split('__')[0]}") and says in msg and "\n" not in msg, msg
    assert SECRET not in msg and SECRET.upper() not in msg


def test_an_empty_variable_counts_as_unset(clean_env, tmp_path):
    # VECBRIDGE_ARTIFACT_DIR= (an env file, or compose's ${UNSET}) was Path(""): artifacts went to the cwd
    clean_env.setenv("VECBRIDGE_DATA_DIR", str(tmp_path))
    clean_env.setenv("VECBRIDGE_ARTIFACT_DIR", "")
    clean_env.setenv("VECBRIDGE_PORT", "")
    s = load_settings()
    assert s.resolved_artifact_dir() == (tmp_path / "artifacts").resolve() and s.port == 8000


def test_an_empty_data_dir_option_counts_as_unset_and_a_bad_registry_url_option_is_named(clean_env, tmp_path,
                                                                                          capsys):
    """``--data-dir ''`` was the current directory (``click.Path`` reads '' as '.'), a registry made or read there,
    while an empty ``VECBRIDGE_DATA_DIR`` counts as unset; now the option does too. ``--registry-url ''`` (or any
    URL the setting refuses) named ``VECBRIDGE_REGISTRY_URL``, which was not set, and "scheme 'none'"."""
    from conftest import run_cli

    from service.cli.serve import serve

    clean_env.chdir(tmp_path)
    clean_env.setenv("VECBRIDGE_DATA_DIR", str(tmp_path / "env-dir"))
    code, out, err = run_cli(capsys, "--data-dir", "", "registry", "list")
    assert code == 0 and f"no registry at {tmp_path / 'env-dir' / 'registry.sqlite'} yet" in err, err
    data_dir = next(p for p in serve.params if p.name == "data_dir")  # serve's own option reads it alike
    assert data_dir.type.convert("", data_dir, None) is None
    for url, says in (("", "--registry-url: empty registry URL: use sqlite:///path"),
                      (f"mysql://admin:{SECRET}@db/vb", "--registry-url: unsupported registry URL (scheme 'mysql'")):
        code, out, err = run_cli(capsys, "--registry-url", url, "registry", "list")
        assert code == 2 and err.startswith(f"vecbridge: error: {says}") and SECRET not in err, err
        assert "VECBRIDGE_REGISTRY_URL" not in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "registry.sqlite").exists()


def test_good_values_and_the_non_settings_pass(clean_env):
    clean_env.setenv("VECBRIDGE_API_KEYS", json.dumps({SECRET: ["read", "write"]}))
    clean_env.setenv("VECBRIDGE_LIMITS__MAX_K", "500")
    clean_env.setenv("VECBRIDGE_LOG_LEVEL", "warning")
    clean_env.setenv("VECBRIDGE_TEST_POSTGRES_URL", "postgresql://x")  # the test suite's own variables
    clean_env.setenv("VECBRIDGE_RAY_OWNER", "123")  # service.distributed marks its Ray processes with it
    s = load_settings()
    assert s.limits.max_k == 500 and s.log_level == "WARNING" and s.api_keys == {SECRET: ["read", "write"]}
    assert unknown_variables(os.environ) == []


def test_worker_settings_round_trip_through_the_environment(clean_env, tmp_path):
    # serve --workers N hands its settings to the workers as variables: every one must be a known setting
    s = Settings(data_dir=tmp_path, api_keys={SECRET: ["read"]}, log_level="debug", cors_origins=["https://a.example"],
                 allowed_hosts=["vecbridge"], limits={"max_k": 7})
    for k, v in s.to_env().items():
        clean_env.setenv(k, v)
    assert load_settings() == s


def _serve(cmd: list[str], env: dict, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=False, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_vecbridge_serve_with_a_typo_exits_2_with_one_line(tmp_path):
    r = _serve([sys.executable, "-m", "service.cli", "serve", "--data-dir", str(tmp_path)],
               _clean_env(VECBRIDGE_PROT="9000", VECBRIDGE_API_KEYS=json.dumps({SECRET: ["read"]})))
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "VECBRIDGE_PROT" in r.stderr
    assert "Traceback" not in r.stderr and SECRET not in r.stderr + r.stdout


@pytest.mark.parametrize("how", ["variable", "option"])
def test_an_unsupported_registry_url_is_one_line_without_its_password(tmp_path, how):
    url = f"mysql://admin:{SECRET}@db/vb"
    cmd = [sys.executable, "-m", "service.cli", "serve", "--data-dir", str(tmp_path)]
    env = _clean_env(VECBRIDGE_DEMO_ON_EMPTY="false", VECBRIDGE_AUTH_DISABLED="true")
    if how == "option":
        cmd += ["--registry-url", url]
    else:
        env["VECBRIDGE_REGISTRY_URL"] = url
    r = _serve(cmd, env)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "unsupported registry URL" in r.stderr
    assert "Traceback" not in r.stderr and SECRET not in r.stderr + r.stdout


@pytest.mark.parametrize("url, extra, says", [
    # every migration and verify job failed "give the password in the URL or PGPASSWORD", a 422 InputError
    (f"postgresql://vb:{SECRET}@db/vb", {"VECBRIDGE_VECTORDB_API_KEY": "k3y-" + SECRET[::-1]}, "no API key or CA file"),
    (f"postgresql://vb:{SECRET}@db/vb", {"VECBRIDGE_VECTORDB_CA_FILE": "/etc/ca.pem"}, "no API key or CA file"),
    # every collection search was a 422 "a URL takes no user or password"
    (f"qdrant+https://user:{SECRET}@db:6333", {}, "takes no user or password"),
    (f"qdrant+https://{SECRET}@db:6333", {}, "takes no user or password"),
    ("qdrant://db:6333", {"VECBRIDGE_VECTORDB_CA_FILE": "/etc/ca.pem"}, "a CA file is for TLS"),
    (f"milvus+https://u:{SECRET}@db:19530", {"VECBRIDGE_VECTORDB_API_KEY": "k3y-" + SECRET[::-1]}, "not both"),
    # libpq read "...@db" after the first "@" as the host, and quoted it
    (f"postgresql://vb:{SECRET}@x@db/vb", {}, "%40"),
    # a CA file that is not there (or holds no certificate): every migration and search failed, a 422 InputError
    ("qdrant+https://db:6333", {"VECBRIDGE_VECTORDB_CA_FILE": "/nonexistent/ca.pem"}, "CA file /nonexistent/ca.pem"),
    ("milvus+https://db:19530", {"VECBRIDGE_VECTORDB_CA_FILE": str(ROOT / "pyproject.toml")}, "no PEM certificate"),
], ids=["pg-key", "pg-ca", "qdrant-password", "qdrant-user", "qdrant-ca-no-tls", "milvus-both", "pg-raw-at",
        "qdrant-ca-missing", "milvus-ca-not-pem"])
def test_a_vector_database_setting_that_cannot_work_stops_serve_at_start(tmp_path, url, extra, says):
    """Checked by the code that opens the store (service.vectordb.check_store_url) when the settings load: the
    service started, /readyz said ready, and then every migration or collection search blamed the client (422)."""
    env = _clean_env(VECBRIDGE_DEMO_ON_EMPTY="false", VECBRIDGE_AUTH_DISABLED="true", VECBRIDGE_VECTORDB_URL=url,
                     **extra)
    r = _serve([sys.executable, "-m", "service.cli", "serve", "--data-dir", str(tmp_path), "--port",
                str(free_port())], env, timeout=90)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "setting VECBRIDGE_VECTORDB_URL" in r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert SECRET not in r.stderr + r.stdout and SECRET[::-1] not in r.stderr + r.stdout


def test_vector_database_settings_that_go_together_are_accepted(clean_env, tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    for url, kw in (("qdrant+https://db:6333", {"vectordb_api_key": SECRET, "vectordb_ca_file": ca}),
                    ("milvus+https://db:19530", {"vectordb_api_key": SECRET}),
                    (f"milvus+https://u:{SECRET}@db:19530", {}), (f"postgresql://vb:{SECRET}@db/vb", {}),
                    ("postgresql://vb:p%40ss@db/vb", {}), (f"qdrant://{tmp_path}/q", {}),
                    # a host ending in .db (a Kubernetes service in namespace db) is a server, not a file
                    ("milvus://milvus.db", {}), ("qdrant://qdrant.db", {}), ("milvus+https://milvus.db", {})):
        assert load_settings(vectordb_url=url, **kw).vectordb_url == url


def _dockerfile() -> tuple[list[str], list[str], dict]:
    """The runtime stage's ``CMD``, the ``HEALTHCHECK`` command and its ``ENV`` variables."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    runtime = text[text.rindex("FROM "):]
    cmd = health = None
    env: dict[str, str] = {}
    for line in runtime.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word == "CMD":
            cmd = json.loads(rest)
        elif word == "HEALTHCHECK":
            health = json.loads(rest[rest.index("CMD") + 3:])
        elif word == "ENV":
            env.update(kv.split("=", 1) for kv in shlex.split(rest))
    return cmd, health, env


def test_the_container_command_refuses_a_bad_variable_in_one_line(tmp_path):
    # the image ran `python -c "from service.api import serve; serve()"`: a pydantic traceback, exit 1
    cmd, _, image_env = _dockerfile()
    env = _clean_env(**{k: v for k, v in image_env.items() if k.startswith("VECBRIDGE_")})
    env.update(VECBRIDGE_DATA_DIR=str(tmp_path), VECBRIDGE_PORT="eighty")
    r = _serve(cmd, env)
    assert r.returncode == 2 and "VECBRIDGE_PORT" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


def test_the_container_command_serves_and_its_healthcheck_passes_on_a_changed_port(tmp_path):
    # the HEALTHCHECK probed port 8000 whatever VECBRIDGE_PORT said: `docker run -e VECBRIDGE_PORT=9000` was
    # "unhealthy" for ever
    cmd, health, image_env = _dockerfile()

    def env_at(port: int) -> dict:
        env = _clean_env(**{k: v for k, v in image_env.items() if k.startswith("VECBRIDGE_")})
        env.update(VECBRIDGE_DATA_DIR=str(tmp_path), VECBRIDGE_PORT=str(port), VECBRIDGE_HOST="127.0.0.1",
                   VECBRIDGE_API_KEYS=json.dumps({SECRET: ["read"]}), VECBRIDGE_DEMO_ON_EMPTY="false")
        return env

    proc, port = start_on_free_port(lambda port: (cmd, env_at(port)), tmp_path / "log")  # once /healthz answers
    env = env_at(port)
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/v1/info", headers={"Authorization": f"Bearer {SECRET}"},
                         timeout=30).status_code == 200
        assert _serve(health, env, timeout=30).returncode == 0
    finally:
        stop(proc)


def test_a_home_folder_tilde_is_expanded_in_data_dir_and_a_sqlite_url(clean_env, tmp_path, capsys):
    """`--data-dir=~/vb` (no shell expands a `~` after '='), `VECBRIDGE_DATA_DIR=~/vb` from an env file and
    `sqlite:///~/reg.sqlite` made a folder named '~' in the current directory; now they are the home folder's, as
    pip and git read them."""
    from conftest import run_cli

    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    clean_env.chdir(work)
    clean_env.setenv("HOME", str(home))
    code, _, err = run_cli(capsys, "--data-dir=~/vb", "registry", "list")
    assert code == 0 and f"no registry at {home / 'vb' / 'registry.sqlite'} yet" in err, err
    clean_env.setenv("VECBRIDGE_DATA_DIR", "~/env-vb")
    clean_env.setenv("VECBRIDGE_ARTIFACT_DIR", "~/art")
    clean_env.setenv("VECBRIDGE_VECTORDB_CA_FILE", "~/ca.pem")  # was read as the relative path '~/ca.pem'
    s = load_settings()
    assert s.data_dir == home / "env-vb" and s.resolved_artifact_dir() == home / "art"
    assert s.vectordb_ca_file == home / "ca.pem"
    clean_env.delenv("VECBRIDGE_VECTORDB_CA_FILE")
    code, _, err = run_cli(capsys, "--registry-url", "sqlite:///~/reg.sqlite", "registry", "list")
    assert code == 0 and f"no registry at {home / 'reg.sqlite'} yet" in err, err
    assert not (work / "~").exists()
