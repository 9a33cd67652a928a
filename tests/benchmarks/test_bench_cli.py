"""The benchmark scripts' small promises: their tables' summaries, their command lines (a bad value is refused
with a message, --help prints the usage) and the files they leave behind."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


def test_align_table_shows_the_lowest_criterion_as_the_worst_seed(capsys):
    """The criterion is higher-is-better (MiniVec2Vec.criterion_), but the table summarised it as lower-is-better:
    its "worst seed" was the best one."""
    bench = load_benchmark("bench_align")
    rows = [{"seed": s, "criterion": c, "top1": t, "mean_rank": r}
            for s, c, t, r in ((0, 0.020, 0.9, 1.0), (1, 0.050, 0.5, 3.0))]
    bench.print_table("a:b", {"vecbridge": rows})
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("vecbridge"))
    assert "0.035±0.015 (w 0.020)" in line  # criterion: the lower seed
    assert "0.700±0.200 (w 0.500)" in line and "2.0±1.0 (w 3.0)" in line  # top-1 and mean rank, as before


@pytest.mark.parametrize("pairs", ["0", "-5"])
def test_fit_time_refuses_fewer_than_one_pair(pairs, tmp_path, capsys):
    """``--pairs -5`` sliced rows from the end (``X[:-5]``: nearly all of them) and ``--pairs 0`` failed inside
    the fit with a traceback; both are refused before any data is read, nothing written."""
    bench = load_benchmark("bench_fit_time")
    with pytest.raises(SystemExit) as e:
        bench.main(["--pairs", pairs, "--results", str(tmp_path)])
    assert e.value.code == 2
    assert f"--pairs must be at least 1, got {pairs}" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_backup_benchmark_names_the_default_the_cli_has():
    """bench_backup.py's docstring called hard links "the default"; ``vecbridge backup`` copies by default."""
    from click.testing import CliRunner

    from service.cli import cli

    help_text = CliRunner().invoke(cli, ["backup", "--help"]).output
    assert "[default: copy]" in help_text
    doc = " ".join(load_benchmark("bench_backup").__doc__.split())
    assert "``--copy`` (the default," in doc and "file system, the default" not in doc


def test_the_bench_cache_is_where_vecbridge_bench_cache_says(tmp_path):
    """build_retrieval_sets.py (and bench_steer.py, which reads its sets) kept ~/.cache/vecbridge-bench whatever
    ``$VECBRIDGE_BENCH_CACHE`` said, though the WordNet sample beside them honoured it."""
    code = ("import build_retrieval_sets as b, bench_steer as s, wordnet_sample as w; "
            "print(b.DEFAULT_CACHE, s.SETS_CACHE, w.DEFAULT_CACHE, sep='\\n')")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "benchmarks")]),
           "VECBRIDGE_BENCH_CACHE": str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == [str(tmp_path / "cache")] * 3


def test_service_benchmark_caches_the_shared_sets_map_in_the_bench_cache(tmp_path, monkeypatch):
    """bench_service.py cached the shared set's unsupervised map in benchmarks/results (a 600 KB file in the
    checkout); now in the bench cache, where a cached map is read back (a sample's: in its own folder)."""
    import align

    bench = load_benchmark("bench_service")
    ws = bench.wordnet_sample
    monkeypatch.setattr(ws, "DEFAULT_CACHE", tmp_path / "cache")
    shared, sample = tmp_path / "shared", tmp_path / "sample"
    for folder in (shared, sample):
        folder.mkdir()
    (sample / "sample.json").write_text("{}")
    assert bench.map_cache_path(shared) == tmp_path / "cache" / "service_minivec2vec_minilm_e5.npz"
    assert bench.map_cache_path(sample) == sample / "service_minivec2vec_minilm_e5.npz"
    rng = np.random.default_rng(0)
    A = rng.normal(size=(50, 8)).astype(np.float32)
    m = align.fit_procrustes(A, A)
    bench.map_cache_path(shared).parent.mkdir()
    m.save(bench.map_cache_path(shared))
    args = argparse.Namespace(quick=False, map=None, refit=False)
    got, label = bench.get_map(A, A, args, bench.map_cache_path(shared))
    assert label == "MiniVec2Vec (cached service_minivec2vec_minilm_e5.npz)"
    np.testing.assert_allclose(got.apply(A, output="raw"), m.apply(A, output="raw"))


def test_fit_time_reports_a_round_whose_variants_chose_different_families():
    """The docstring said the serial and threaded fits' chosen family was checked to be the same; nothing compared
    them. ``main`` prints these lines, writes them under the table and exits 1 when there are any."""
    bench = load_benchmark("bench_fit_time")
    rows = [{"method": "auto", "round": r, "variant": v, "chosen": c}
            for r, v, c in ((0, "serial", "ridge"), (0, "threaded", "ridge"),
                            (1, "serial", "ridge"), (1, "threaded", "cluster"))]
    assert bench.mismatches(rows) == ["MISMATCH: auto round 1: serial chose ridge, threaded chose cluster"]
    assert bench.mismatches(rows[:2]) == []


def _script(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=300, check=False,
                          cwd=ROOT)


@pytest.mark.parametrize(("args", "usage"), [
    (["benchmarks/peak_memory.py", "--help"], "usage: peak_memory.py COMMAND [ARGS ...]"),
    (["benchmarks/index_scale/mkdata.py", "--help"], "usage: mkdata.py [-h] n out"),
    (["benchmarks/index_scale/stage.py", "--help"], "usage: stage.py [-h] data {get,load,deltas,search} name"),
])
def test_small_benchmark_scripts_print_their_usage(args, usage):
    """``--help`` ran ``--help`` as the command (peak_memory: FileNotFoundError) or read it as an argument
    (mkdata: ValueError from int("--help"); stage: IndexError)."""
    p = _script(*args)
    assert p.returncode == 0 and p.stdout.startswith(usage), p.stdout + p.stderr[-2000:]


@pytest.mark.parametrize(("args", "message"), [
    (["benchmarks/peak_memory.py"], "give the command to run"),
    (["benchmarks/peak_memory.py", "no-such-command-here"], "cannot run 'no-such-command-here'"),
    (["benchmarks/index_scale/mkdata.py", "0", "rows.npy"], "n must be at least 1, got 0"),
    (["benchmarks/index_scale/stage.py", "dd", "deltas", "f1m"], "deltas takes 2 arguments after NAME, got 0"),
    (["benchmarks/bench_seeded_rounds.py", "--rounds", "0"], "--rounds must be at least 1, got 0"),
])
def test_small_benchmark_scripts_refuse_bad_arguments_with_a_message(args, message):
    """No arguments (peak_memory: IndexError), a missing command or a bad count: exit 2 with a usage line, no
    traceback (bench_seeded_rounds --rounds 0 printed a table header with a column no row filled)."""
    p = _script(*args)
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr, p.stdout + p.stderr[-2000:]
    assert "usage:" in p.stderr


def test_service_benchmark_times_its_in_process_baselines_at_the_servers_thread_count():
    """bench_service.py timed its raw FAISS baseline with this process's native thread pools (every core without
    OMP_NUM_THREADS) while its server runs them at ``blas_threads`` (1): on a busy machine the raw batch-64 search
    took 66 ms against the server's 4 ms, and "HTTP search <= 1.15x raw FAISS" measured the thread teams, not
    HTTP. Its in-process cells now run at the server's count, and the process's own counts come back after."""
    code = """
import faiss, threadpoolctl
import bench_service as bs
from service.config import Settings

def counts():
    blas = sorted({p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"})
    return faiss.omp_get_max_threads(), blas

before = counts()
with bs.server_threads() as n:
    inside = counts()
print(before, n, inside, counts(), Settings.model_fields["blas_threads"].default, sep=";")
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "benchmarks")]), "OMP_NUM_THREADS": "2",
           "OPENBLAS_NUM_THREADS": "2"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    before, n, inside, after, default = p.stdout.strip().splitlines()[-1].split(";")
    assert before == after == "(2, [2])" and n == default == "1"
    assert inside == "(1, [1])"


def test_steer_benchmark_draws_no_ndcg_figure_without_ndcg_data(tmp_path, capsys):
    """Without the reverse-dictionary set bench_steer.py still drew ``<stem>_ndcg.png``: 12 empty panels titled
    "area +0.000", which reads as a measured zero. Now that figure is drawn only when some curve has nDCG data,
    and a panel without it says so instead of an area."""
    steer = load_benchmark("bench_steer")
    res = json.loads((ROOT / "benchmarks" / "results" / "steer_pareto_2026-12-01.json").read_text())
    for task in res["tasks"]:  # as a run without the reverse-dictionary set writes it
        for c in task["curves"].values():
            del c["ndcg"]
    run = tmp_path / "run.json"
    run.write_text(json.dumps(res))
    tmp_path = tmp_path / "r"
    assert steer.main(["--from-json", str(run), "--results", str(tmp_path), "--stem", "s"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json", "s.png"]
    assert "nDCG: the reverse-dictionary set was not built" in capsys.readouterr().out
    task = {"A": "noun.person", "B": "noun.artifact"}
    curve = {"area_vs_mean_shift": 0.25, "ndcg": {"area_vs_mean_shift": -0.125}}
    assert steer.panel_title(task, "e5", curve, "ndcg_kept").endswith("e5 (area -0.125)")
    assert steer.panel_title(task, "e5", {"area_vs_mean_shift": 0.25}, "ndcg_kept").endswith("e5 (no nDCG data)")
    assert steer.panel_title(task, "e5", {"area_vs_mean_shift": 0.25}, "overlap").endswith("e5 (area +0.250)")


def test_plan_keep_table_judges_each_recommendation_by_the_kept_workflow_measured_there():
    """bench_plan_keep.py: a recommended K is judged by the kept workflow's measured retention at that K (the whole
    corpus by definition 1), and the smallest K measured to reach the target is the hindsight answer it is held to."""
    bench = load_benchmark("bench_plan_keep")
    meas = {"native": "1111", "kept|ridge|1000": ["1100"], "kept|ridge|3000": ["1110"], "kept|auto|3000": ["1111"]}
    rec = {"whole": {"k": 8192, "whole_corpus": True, "method": "auto", "forecast_method": "ridge"},
           "3000": {"k": 3000, "whole_corpus": False, "method": "auto", "forecast_method": "ridge"},
           "1000": {"k": 1000, "whole_corpus": False, "method": "auto", "forecast_method": "ridge"}}
    predicted = [{"k": 1000, "method": "ridge", "kept": {"retention": 0.6}},
                 {"k": 3000, "method": "ridge", "kept": {"retention": 0.8}},
                 {"k": 8192, "method": "ridge", "whole_corpus": True, "kept": {"retention": 1.0}}]
    cell = {"queries": [0, 1, 2, 3], "predicted": predicted,
            "0.7": {"plain": rec["whole"], "keep": rec["3000"]}, "0.8": {"plain": rec["whole"], "keep": rec["3000"]}}
    text = bench.table({"1000": {"0": cell}}, meas, [0.7, 0.8])
    assert "| 0.7 | 1000 | 0 | 8,192 (whole) | 3,000 | 0.800 | 0.750 (ridge) / 1.000 | yes, auto yes | " \
           "1 (all re-embedded) | 3,000 |" in text
    assert "| 0.8 | 1000 | 0 | 8,192 (whole) | 3,000 | 0.800 | 0.750 (ridge) / 1.000 | no (-0.050), auto yes | " \
           "1 (all re-embedded) | 8,192 |" in text
    assert "target 0.7: keep recommended a smaller K in 1 of 1 plans" in text
    assert "measured the target in 1 (auto's map 1 of 1); the recommended K was the smallest measured to reach it " \
           "in 1 of 1 with keep, 0 without" in text
    assert "target 0.8" in text and "measured the target in 0 (auto's map 1 of 1)" in text
