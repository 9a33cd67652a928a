"""Shared fixtures: the WordNet benchmark data when present, a small fallback otherwise."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

WORDNET = Path(os.environ.get("VECBRIDGE_WORDNET_DIR", Path(__file__).resolve().parents[1].parent / "shared" / "data" / "wordnet"))


def wordnet_available() -> bool:
    return (WORDNET / "minilm.npy").exists() and (WORDNET / "e5.npy").exists()


@pytest.fixture(scope="session")
def wordnet():
    """dict name -> float32 array (40960, d) of the shared WordNet embeddings, or skip."""
    if not wordnet_available():
        pytest.skip("shared WordNet embeddings not present")
    out = {}
    for name in ("minilm", "e5", "paraphrase_l3", "glove"):
        p = WORDNET / f"{name}.npy"
        if p.exists():
            out[name] = np.load(p, mmap_mode="r")
    return out


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.slow`` tests are opt-in: ``pytest -m slow`` or ``VECBRIDGE_RUN_SLOW=1``."""
    if "slow" in (config.getoption("-m") or "") or os.environ.get("VECBRIDGE_RUN_SLOW"):
        return
    skip = pytest.mark.skip(reason="opt-in: pytest -m slow (or VECBRIDGE_RUN_SLOW=1)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
