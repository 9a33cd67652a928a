"""`vecbridge fit --ray`: the Ray map-reduce fit registers the same map as the in-process fit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray")


def _vecbridge(data_dir: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "service.cli", "--data-dir", str(data_dir), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def test_fit_with_ray_equals_in_process_fit(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(3000, 16)).astype(np.float32)
    Q = np.linalg.qr(rng.normal(size=(16, 16)))[0]
    Y = (X @ Q + 0.1 * rng.normal(size=X.shape)).astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", Y)
    common = ["fit", "--pairs", "--source", str(tmp_path / "x.npy"), "--target", str(tmp_path / "y.npy"),
              "--method", "procrustes", "--quiet", "--json"]
    local = _vecbridge(tmp_path / "var", *common, "--name", "plain")
    assert local.returncode == 0, local.stderr
    distributed = _vecbridge(tmp_path / "var", *common, "--name", "viaray", "--ray")
    assert distributed.returncode == 0, distributed.stderr

    from service.registry import open_registry

    reg = open_registry(f"sqlite:///{tmp_path / 'var' / 'registry.sqlite'}", tmp_path / "var" / "artifacts")
    a, b = reg.load_map("plain"), reg.load_map("viaray")
    assert np.abs(a.W - b.W).max() < 1e-5
    assert b.metadata.get("distributed", {}).get("engine") == "ray"
    assert json.loads(distributed.stdout)


def test_minivec2vec_with_ray_registers_the_in_process_map(tmp_path):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(700, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", X[rng.permutation(700)] @ np.linalg.qr(rng.normal(size=(8, 8)))[0].astype(np.float32))
    common = ["fit", "--unpaired", "--source", str(tmp_path / "x.npy"), "--target", str(tmp_path / "y.npy"),
              "--method", "minivec2vec", "--param", "n_anchor_runs=2", "--param", "refine1_iters=3",
              "--param", "n_clusters=8", "--quiet"]
    local = _vecbridge(tmp_path / "var", *common, "--name", "plain")
    assert local.returncode == 0, local.stderr
    distributed = _vecbridge(tmp_path / "var", *common, "--name", "viaray", "--ray")
    assert distributed.returncode == 0, distributed.stderr
    assert "Traceback" not in distributed.stderr

    from service.registry import open_registry

    reg = open_registry(f"sqlite:///{tmp_path / 'var' / 'registry.sqlite'}", tmp_path / "var" / "artifacts")
    a, b = reg.load_map("plain"), reg.load_map("viaray")
    np.testing.assert_array_equal(a.W, b.W)
    assert b.metadata["diagnostics"]["executor"] == "ray"
