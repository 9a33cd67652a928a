"""The benchmarks without their data: the README says they say so and stop (or skip the pair), never a traceback
that loses the rest of the run."""

from __future__ import annotations

import json

import numpy as np
from conftest import load_benchmark

bench = load_benchmark("bench_migration")
proxies = load_benchmark("bench_plan_proxies")


def _wordnet_cache(root):
    """A built ``wordnet`` set (two docs, one query) whose document vectors come from the shared WordNet data."""
    folder = root / "wordnet"
    folder.mkdir(parents=True)
    (folder / "set.json").write_text(json.dumps({
        "name": "wordnet", "docs": ["a", "b"], "queries": ["qa"], "query_doc": [0], "query_ids": ["n:1"],
        "fit_pool": [0, 1], "rows": {"minilm": [0, 1], "e5": [0, 1]}, "provenance": "test"}))
    for enc in ("minilm", "e5"):
        np.save(folder / f"{enc}_queries.npy", np.ones((1, 4), np.float16))
    return root


def test_migration_skips_a_wordnet_pair_built_from_the_shared_data_when_it_is_absent(tmp_path, monkeypatch, capsys):
    """Without ``shared/data/wordnet`` the wordnet pairs crashed the whole run (FileNotFoundError from np.load in
    ``load_embeddings``), so the other pairs never ran; now a set built from the shared set is skipped with a message
    that says how to build one from a sample (tests/benchmarks/test_bench_sample_fallback_b.py runs that)."""
    cache = _wordnet_cache(tmp_path / "cache")
    monkeypatch.setattr(bench.wordnet_sample, "SHARED", tmp_path / "absent")
    assert bench.pair_data("wordnet", "minilm", "e5", cache) is None
    assert bench.main(["--pairs", "wordnet:minilm:e5", "--cache", str(cache), "--no-plan",
                       "--out", str(tmp_path / "m")]) == 1  # nothing measured (next test)
    out = capsys.readouterr().out
    assert f"wordnet:minilm:e5: the set was built from the WordNet data in {tmp_path / 'absent'}, absent now" in out
    assert "under another --cache (without the shared set it embeds a sample); skipped" in out


def test_migration_with_every_pair_skipped_says_nothing_was_measured_and_writes_nothing(tmp_path, capsys):
    """With no retrieval set built, every pair was skipped, yet the run printed "wrote X.md and X.json" (the .json
    was never written), wrote an empty report over today's .md and exited 0. Now it says nothing was measured,
    leaves both files as they were and exits 1."""
    results = tmp_path / "results"
    results.mkdir()
    (results / "m.md").write_text("an earlier report\n")
    assert bench.main(["--pairs", "bible:minilm:e5", "--cache", str(tmp_path / "no-sets"), "--no-plan",
                       "--results", str(results), "--out", "m"]) == 1
    out = capsys.readouterr().out
    assert "bible:minilm:e5: " in out and "; skipped" in out
    assert "nothing measured: every pair was skipped" in out and "wrote" not in out
    assert sorted(p.name for p in results.iterdir()) == ["m.md"]
    assert (results / "m.md").read_text() == "an earlier report\n"


def test_plan_proxies_skip_a_set_that_was_never_built_and_still_print_the_table(tmp_path, capsys):
    """The default pairs include ``wordnet-small``, which ``build_retrieval_sets.py`` builds only on request: a
    missing set.json raised SystemExit after the other pairs had run, and their table was never printed."""
    assert bench.pair_data("wordnet-small", "minilm", "e5", tmp_path) is None
    assert proxies.main(["--pairs", "wordnet-small:minilm:e5", "--ks", "100", "--cache", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert "embeddings not cached, skipped" in out.err
    assert "| pair | docs | K | method | measured |" in out.out


def test_steer_benchmark_says_so_and_stops_without_wordnet_base(tmp_path, monkeypatch, capsys):
    """bench_steer.py read ``texts.json`` unconditionally (FileNotFoundError). Without the shared set it now runs on
    a sample (test_bench_sample_fallback_b.py); without Debian's wordnet-base (its labels) it says so and stops."""
    steer = load_benchmark("bench_steer")
    monkeypatch.setattr(steer, "WN_DICT", tmp_path / "no-wordnet-base")
    monkeypatch.setattr(steer, "RESULTS", tmp_path / "results")
    assert steer.main(["--queries", "10"]) == 0
    assert "needs Debian's wordnet-base" in capsys.readouterr().out
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())
