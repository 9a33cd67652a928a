"""benchmarks/bench_gpu_service.py without a GPU (CI): the CPU server's column is measured over real HTTP, the GPU
column says why it is empty (the GPU machine runs the same script with both servers: benchmarks/gpu_check.sh)."""

from __future__ import annotations

import pytest
from conftest import load_benchmark

bench = load_benchmark("bench_gpu_service")


def test_without_a_gpu_the_cpu_server_is_measured_and_the_gpu_column_says_why(tmp_path):
    why = bench.gpu_reason()
    if not why:
        pytest.skip("a CUDA device is present: the GPU machine's run covers both servers")
    out = tmp_path / "svc.md"
    assert bench.main(["--rows", "2000", "--calls", "2", "--rounds", "1", "--out", str(out)]) == 0
    text = out.read_text()
    assert f"GPU server: not run ({why})" in text and "2,000 x 384 stand-in rows" in text
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith(("| 1 |", "| 64 |"))]
    assert [r[0].strip() for r in rows] == ["1", "64"]
    assert all(float(r[1]) > 0 and r[2].strip() == "—" for r in rows), rows
