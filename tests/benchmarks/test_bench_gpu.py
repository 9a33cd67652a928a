"""benchmarks/bench_gpu.py on a machine without a GPU build of FAISS (CI): it says why FAISS has no GPU column,
and its CPU figures are those of the demo map (the GPU run of issue 11 is the same script on a GPU machine, where
torch fills the flat rows' GPU column with the service's own GPU search)."""

from __future__ import annotations

import numpy as np
from conftest import load_benchmark

bench = load_benchmark("bench_gpu")


def test_without_a_gpu_the_report_says_why_and_keeps_the_cpu_figures(tmp_path):
    import faiss

    import align

    out = tmp_path / "gpu.md"
    assert bench.main(["--rows", "0", "--repeat", "1", "--out", str(out)]) == 0
    text = out.read_text()
    n_gpu, why = bench.gpu_state(faiss)
    assert n_gpu == 0 and why and why in text  # faiss-cpu here: the columns are empty for a stated reason
    # the demo line's top-1 is the demo map's own figure, computed again here
    with np.load(bench.DEMO, allow_pickle=False) as z:
        A, B = z["minilm"].astype(np.float32), z["e5"].astype(np.float32)
    m = align.fit_procrustes(A[:500], B[:500])
    Q, D = bench.unit(m.apply(A[500:])), bench.unit(B)
    top1 = float(((Q @ D.T).argmax(axis=1) == np.arange(500, 1000)).mean())
    # no GPU: "CPU top-1 x"; torch sees one (the service's GPU search fills the column): "top-1 CPU x / GPU x"
    assert (f"CPU top-1 {top1:.3f}" in text or f"top-1 CPU {top1:.3f} / GPU {top1:.3f}" in text) and 0.5 < top1 <= 1.0
    assert text.count("| demo e5 | flat |") == 3 and "| 65536 |" in text


def test_the_stand_in_corpus_is_unit_rows_near_the_demo_rows():
    docs = bench.unit(np.random.default_rng(0).normal(size=(10, 8)))
    big = bench.big_corpus(docs, 25)
    assert big.shape == (25, 8) and np.allclose(np.linalg.norm(big, axis=1), 1, atol=1e-5)
    assert ((big * docs[np.arange(25) % 10]).sum(axis=1) > 0.9).all()  # each row stays near its source row
