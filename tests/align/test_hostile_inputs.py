"""Public numerics driven with hostile and extreme input: typed errors with clear messages, never a raw
numpy / Python exception, never a result that looks fine but is not."""

from __future__ import annotations

import numpy as np
import pytest

import align
from align.exceptions import InputError


@pytest.fixture(scope="module")
def pairs():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 6)).astype(np.float32)
    Y = (X @ np.linalg.qr(rng.normal(size=(6, 6)))[0] + 0.5 * rng.normal(size=(60, 6))).astype(np.float32)
    return X, Y


@pytest.mark.parametrize("call", [
    lambda X, Y: align.fit_migration(X, Y, method="lowrank", rank=10**30),
    lambda X, Y: align.fit_migration(X, Y, method="ridge", alpha=10**400),
    lambda X, Y: align.fit_ridge(X, Y, chunk_size=10**30),
    lambda X, Y: align.fit_lowrank(X, Y, rank=-10**30),
], ids=["rank", "alpha", "chunk_size", "negative rank"])
def test_python_ints_past_int64_are_an_input_error(pairs, call):
    """JSON and Python ints have no bound; np.isfinite refused them with a raw TypeError."""
    with pytest.raises(InputError, match="must be"):
        call(*pairs)
