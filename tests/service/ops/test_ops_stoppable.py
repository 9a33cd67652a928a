"""Plans and evaluations stop at their checkpoints when the work is told to (``service.progress.run_stoppable``: the
HTTP face sets it for a request whose client disconnected); without it (CLI, library, jobs) they run as before.

Before, nothing in them could stop: a plan or evaluation whose client had left ran to its end on the compute gate's
thread, for nobody (tests/service/api/test_heavy_gate.py shows the same for text embeddings over real HTTP)."""

from __future__ import annotations

import numpy as np
import pytest
from _api_support import planted

from align import fit_procrustes
from service.ops.plans import evaluate_map, plan
from service.progress import Abandoned, checkpoint, run_stoppable
from service.registry import open_registry


def _after(n: int):
    """A ``should_stop`` that turns true at its ``n``-th call; ``calls[0]`` counts them."""
    calls = [0]

    def should_stop() -> bool:
        calls[0] += 1
        return calls[0] >= n

    return should_stop, calls


def _plan_data():
    rng = np.random.default_rng(0)
    old = rng.standard_normal((2000, 16)).astype(np.float32)
    a = rng.standard_normal((300, 16)).astype(np.float32)
    return old, a, a @ rng.standard_normal((16, 16)).astype(np.float32)


def test_a_plan_told_to_stop_stops_at_its_next_progress_report():
    should_stop, calls = _after(3)
    with pytest.raises(Abandoned):
        run_stoppable(should_stop, lambda: plan(*_plan_data()))
    assert calls[0] == 3  # it stopped at the report that first saw the stop, not at the end
    seen = []
    out = run_stoppable(lambda: False, lambda: plan(*_plan_data(), progress=lambda s, f: seen.append(s)))
    assert out["recommended"] and "learning curve" in seen  # never told: the same plan, its progress still reported
    assert plan(*_plan_data())["recommended"] == out["recommended"]  # without run_stoppable (CLI, library)


def test_an_evaluation_told_to_stop_stops_between_its_steps(tmp_path):
    reg = open_registry(f"sqlite:///{tmp_path}/reg.sqlite", tmp_path / "artifacts")
    X, Y, _ = planted(400)
    reg.register_space("a", 16)
    reg.register_space("b", 16)
    reg.register_version("a2b", fit_procrustes(X, Y), source_space="a", target_space="b", method="procrustes",
                         params={})
    q, rel = Y[:40] + 0.01, np.arange(40)
    with pytest.raises(Abandoned):
        run_stoppable(lambda: True, lambda: evaluate_map(reg, "a2b", X, Y, queries=q, relevant=rel))
    should_stop, calls = _after(10**9)
    res = run_stoppable(should_stop, lambda: evaluate_map(reg, "a2b", X, Y, queries=q, relevant=rel, csls=True))
    assert calls[0] >= 3 and res["top1"] > 0.9  # checked between its steps, and a full answer when never told
    assert evaluate_map(reg, "a2b", X, Y)["top1"] == res["top1"]


def test_a_checkpoint_outside_stoppable_work_does_nothing():
    checkpoint()  # the CLI, jobs and the library: no should_stop set
    assert run_stoppable(lambda: False, lambda: 7) == 7
    with pytest.raises(Abandoned):
        run_stoppable(lambda: True, checkpoint)
    checkpoint()  # reset after the call: the thread's next work is not stopped by the last one's flag
