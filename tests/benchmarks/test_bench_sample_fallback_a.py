"""Without the shared WordNet set the benchmarks run on a sample embedded here (``benchmarks/wordnet_sample.py``)
and say so; they no longer stop with "nothing to benchmark". Each test runs one script in its quickest mode on a
200-row sample (built once for this module by the real encoders, a few seconds) and checks its table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
NOTE = ("data: a sample of 200 WordNet definitions embedded here (shared set absent); figures are not comparable "
        "with the committed tables")


@pytest.fixture(scope="module")
def tiny_sample(tmp_path_factory):
    """A 200-row sample folder (texts.json, minilm.npy, e5.npy, sample.json), or skip without wordnet-base."""
    ws = _wordnet_sample()
    try:
        return ws.build_sample(tmp_path_factory.mktemp("sample") / "wordnet-sample-200", rows=200, log=lambda *a: None)
    except ws.SampleUnavailable as e:
        pytest.skip(str(e))


def _wordnet_sample():
    """The ``wordnet_sample`` module the benchmarks import (one entry of sys.modules)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import wordnet_sample
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return wordnet_sample


@pytest.fixture
def on_sample(tiny_sample, monkeypatch, tmp_path):
    """The benchmarks (in this process and in the processes they start) read the 200-row sample as their data."""
    ws = _wordnet_sample()
    monkeypatch.setattr(ws, "SHARED", tiny_sample)
    monkeypatch.setattr(ws, "DEFAULT_CACHE", tmp_path / "cache")  # nothing else is built or read
    monkeypatch.setenv("VECBRIDGE_WORDNET_DIR", str(tiny_sample))
    monkeypatch.setenv("VECBRIDGE_BENCH_CACHE", str(tmp_path / "cache"))
    return tiny_sample


def test_the_sample_note_and_the_scaled_split(tiny_sample):
    ws = _wordnet_sample()
    assert ws.note(tiny_sample) == NOTE
    assert ws.split(40960) == (slice(0, 16384), slice(16384, 32768), slice(32768, 40960))
    assert ws.split(200) == (slice(0, 80), slice(80, 160), slice(160, 200))
    assert ws.tile(ws.load(tiny_sample, "minilm")[:3], 8).shape == (8, 384)


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """The temporary directory the benchmarks put their servers' data dirs in (``$TMPDIR``, ``tempfile``'s)."""
    folder = tmp_path / "scratch"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_cluster_service_benchmark_runs_on_a_sample(on_sample, tmp_path, scratch, capsys):
    """bench_cluster_service.py printed "nothing to benchmark" without the shared set; now it fits on the sample's
    first fifth and times transforms of its held-out rows (repeated to the largest batch) through a real server.
    Its server's data dir is removed afterwards (it stayed in $TMPDIR, ~10 MB a run)."""
    cluster = load_benchmark("bench_cluster_service")
    cluster.main(["--quick", "--results", str(tmp_path / "results")])
    out = capsys.readouterr().out
    assert list(scratch.iterdir()) == []
    assert NOTE in out and "nothing to benchmark" not in out
    assert "WordNet minilm -> e5 (384 -> 384), 40 pairs" in out
    for batch in cluster.BATCHES:
        assert f"\n| {batch} | " in out
    (md,) = (tmp_path / "results").glob("cluster_service_*_quick.md")
    assert NOTE in md.read_text()
    rows = json.loads(md.with_suffix(".json").read_text())["rows"]
    assert [r["batch"] for r in rows] == list(cluster.BATCHES)
    assert all(r["http_equals_inproc_maxabs"] < 1e-5 for r in rows)


def test_ray_benchmark_runs_on_a_sample_and_skips_the_fit(on_sample, tmp_path, monkeypatch, capsys):
    """bench_ray.py printed "nothing to benchmark" without the shared set; now the kNN round runs on the sample
    (repeated and perturbed), and the fit workload (paraphrase_l3: no encoder here) is skipped with a line."""
    pytest.importorskip("ray")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the script sets both for its Ray workers: restored after the test
    monkeypatch.setenv("VECBRIDGE_RAY_OWNER", str(os.getpid()))
    ray_bench = load_benchmark("bench_ray")
    out_json = tmp_path / "ray.json"
    assert ray_bench.main(["--rows", "2000", "--only", "knn", "fit", "--out", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "fit workload skipped: no paraphrase-MiniLM-L3 encoder here" in out
    assert NOTE in out and "nothing to benchmark" not in out
    assert "kNN round, in-process " in out
    assert "kNN round, Ray 2 workers" in out and "identical: True" in out
    report = json.loads(out_json.read_text())
    assert report["env"]["workloads"] == ["knn"] and NOTE in report["env"]["data"]
    assert report["knn"]["identical"] is True


def test_fit_time_benchmark_runs_on_a_sample(on_sample, tmp_path, capsys):
    """The pair count defaults to the shared set's fraction (10,000 of 40,960) of the sample's rows."""
    fit_time = load_benchmark("bench_fit_time")
    assert fit_time.main(["--methods", "procrustes", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "serial and threaded chose the same family in every round." in out  # checked, as the docstring says
    assert "# fit_migration wall time, 49 pairs (WordNet sample (200 rows) minilm -> e5, rows [0, 49))" in out
    assert NOTE in out
    assert "| procrustes | 0 | serial |" in out and "| procrustes | 0 | threaded |" in out
    (md,) = tmp_path.glob("fit_time_*.md")
    assert NOTE in md.read_text()


def test_index_writes_benchmark_reads_the_sample(on_sample, capsys):
    """bench_index_writes.py used random rows without the shared set; now the sample's MiniLM rows, said so."""
    bench = load_benchmark("bench_index_writes")
    bench.main(["--flat", "500", "--hnsw", "0", "--ivf", "0", "--adds", "2", "--deletes", "1"])
    out = capsys.readouterr().out
    assert NOTE in out
    assert "| flat | 500 (WordNet sample (200) MiniLM x3 with noise) | log |" in out
    assert "| flat | 500 (WordNet sample (200) MiniLM x3 with noise) | snapshot each change |" in out


def test_query_apply_benchmark_runs_on_a_sample(on_sample, capsys):
    """The fit / held-out rows (3,000 / 200 of 3,200) keep a 4:1 split when the sample is smaller."""
    bench = load_benchmark("bench_query_apply")
    assert bench.main(["--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "(WordNet MiniLM -> e5, a sample of 200, 384 -> 384" in out and NOTE in out
    for case in ("GEMV x @ W (reference)", "procrustes apply (raw)", "ridge apply (raw)", "cluster apply (raw)"):
        assert f"| {case} | " in out


def test_align_benchmark_runs_on_a_sample_and_skips_the_glove_pair(on_sample, tmp_path):
    """The split is 0.4 / 0.4 / 0.2 of the sample's rows; a pair with glove is skipped (no encoder here)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_align.py"), "--pairs", "minilm:e5",
                        "glove:minilm", "--seeds", "0", "--out", str(tmp_path / "a.json")],
                       capture_output=True, text=True, env=env, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "== minilm:e5  (candidates: 40 held-out pairs;" in p.stdout
    assert NOTE in p.stdout
    assert "SKIP glove:minilm: no encoder for it here (a sample holds minilm, e5)" in p.stdout
    assert "(published: stored results are for the shared set, not shown on a sample)" in p.stdout
    rows = json.loads((tmp_path / "a.json").read_text())["rows"]
    assert {r["method"] for r in rows} == {"identity", "supervised", "vecbridge"}
    assert all(r["n_candidates"] == 40 for r in rows)


def test_seeded_rounds_benchmark_runs_on_a_sample(on_sample):
    """bench_seeded_rounds.py: the table of held-out top-1 / CSLS top-1 (round score) per round, here from the
    supervised start only (the seeded fit needs more rows than 80), on the sample's scaled split."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_seeded_rounds.py"), "--k", "10", "--rounds",
                        "2", "--starts", "supervised", "--configs", '[{"eps": 0.1}, {"eps": 0.2, "k": 5}]'],
                       capture_output=True, text=True, env=env, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    assert NOTE in p.stdout
    rows = [ln for ln in p.stdout.splitlines() if ln.startswith("| supervised |")]
    assert len(rows) == 2, p.stdout
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")][2:]  # round 0, round 1, round 2
        assert len(cells) == 3
        for c in cells:
            top1, csls = (float(x) for x in c.split(" (")[0].split(" / "))
            assert 0.0 <= top1 <= 1.0 and 0.0 <= csls <= 1.0
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_seeded_rounds.py"), "--k", "1000"],
                         capture_output=True, text=True, env=env, timeout=300, check=False)
    assert bad.returncode == 2 and "--k must be in [2, 80]" in bad.stderr, bad.stderr[-500:]


def test_collection_search_benchmark_reads_the_sample(on_sample, monkeypatch, capsys):
    """bench_collection_search.py imported ``WORDNET`` from bench_service (gone: ImportError) and used random
    vectors without the shared set; now the sample's held-out rows, repeated to ``--rows``, said so."""
    bench = load_benchmark("bench_collection_search")
    fit_B, fit_A, coll, Q, what = bench.data(300, on_sample)
    ws = _wordnet_sample()
    minilm, e5 = ws.load(on_sample, "minilm"), ws.load(on_sample, "e5")
    assert fit_A.shape == fit_B.shape == (80, 384) and coll.shape == (300, 384) and Q.shape == (256, 384)
    np.testing.assert_array_equal(fit_B, e5[:80])
    np.testing.assert_array_equal(coll[:40], minilm[160:200])  # the held-out rows [160, 200), repeated
    np.testing.assert_array_equal(coll[40:80], minilm[160:200])
    np.testing.assert_array_equal(Q[:40], e5[160:200])
    assert what == "WordNet vectors (minilm collection, e5 queries)"
    monkeypatch.setattr(bench, "engines", lambda tmp: [])  # the engines' rows are not this test's
    assert bench.main(["--rows", "300", "--rounds", "1"]) == 0
    assert NOTE in capsys.readouterr().out


def test_blas_threads_benchmark_removes_its_data_dir_unless_kept(on_sample, tmp_path, scratch, capsys):
    """bench_blas_threads.py left ``$TMPDIR/vb-blas-bench-<pid>`` (registry, index, logs) behind after each run;
    now it is removed, and ``--keep`` keeps it (for debugging) and says where."""
    bench = load_benchmark("bench_blas_threads")
    bench.main(["--rounds", "1", "--per", "1", "--results", str(tmp_path / "results")])
    assert "| search batch 64 | " in capsys.readouterr().out
    assert list(scratch.iterdir()) == []
    bench.main(["--rounds", "1", "--per", "1", "--results", str(tmp_path / "results"), "--keep"])
    (kept,) = scratch.iterdir()
    assert kept.name.startswith("vb-blas-bench-") and (kept / "registry.sqlite").is_file()
    assert f"data dir kept: {kept}" in capsys.readouterr().out
