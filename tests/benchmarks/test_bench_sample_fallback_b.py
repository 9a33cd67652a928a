"""Without the shared WordNet set the benchmarks run on a sample embedded here (``benchmarks/wordnet_sample.py``)
and say so: the retrieval sets, the migration benchmarks, the steer benchmarks and the floor profile.

One sample of ``ROWS`` definitions (minilm + e5) and one ``wordnet`` retrieval set over it are built per module in a
temporary cache; each test points ``wordnet_sample`` at that cache and at an absent shared set. A sample is the first
rows of one seeded shuffle, so when the default cache holds a larger sample already (the 4,096 rows benchmarks use),
the small one is its first ``ROWS`` rows, copied (not embedded again)."""

from __future__ import annotations

import json
from datetime import date

import numpy as np
import pytest
from conftest import load_benchmark

builder = load_benchmark("build_retrieval_sets")
migration = load_benchmark("bench_migration")
ws = builder.wordnet_sample  # the module every benchmark imports by name (sys.modules["wordnet_sample"])

ROWS = 300  # pool: rows [0, 240), held-out [240, 300)
if not (ws.DEBIAN_WORDNET / "data.noun").is_file():
    pytest.skip("Debian's wordnet-base is not installed (the sample's texts)", allow_module_level=True)


def _point_at(mp: pytest.MonkeyPatch, root) -> None:
    """``wordnet_sample`` without the shared set, its samples cached under ``root``."""
    mp.setattr(ws, "SHARED", root / "no-shared-set")
    mp.setattr(ws, "DEFAULT_CACHE", root / "samples")


def _seed_from_cached_sample(folder) -> None:
    """The first ``ROWS`` rows of the default cache's sample (same seed and recipe), when it is there."""
    big = ws.DEFAULT_CACHE / f"wordnet-sample-{ws.DEFAULT_ROWS}"
    meta = json.loads((big / "sample.json").read_text()) if (big / "sample.json").is_file() else {}
    if meta.get("seed") != 0 or not all((big / f).is_file() for f in ("texts.json", "minilm.npy", "e5.npy")):
        return
    folder.mkdir(parents=True)
    (folder / "texts.json").write_text(json.dumps(json.loads((big / "texts.json").read_text())[:ROWS]))
    for name in ("minilm", "e5"):
        np.save(folder / f"{name}.npy", np.load(big / f"{name}.npy", mmap_mode="r")[:ROWS])


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """``(root, sets cache)``: a ``ROWS``-row sample in ``root/samples`` and the ``wordnet`` set built over it."""
    root = tmp_path_factory.mktemp("wn")
    _seed_from_cached_sample(root / "samples" / f"wordnet-sample-{ROWS}")
    with pytest.MonkeyPatch.context() as mp:
        _point_at(mp, root)
        builder.build(["wordnet"], ["minilm", "e5"], root / "sets", embed=True, wordnet_queries=2000, bible_verses=0,
                      bible_queries=0, seed=0, sample_rows=ROWS)
    return root, root / "sets"


@pytest.fixture
def on_sample(sample, monkeypatch):
    root, cache = sample
    _point_at(monkeypatch, root)
    return cache


NOTE = f"data: a sample of {ROWS} WordNet definitions embedded here (shared set absent)"


def test_wordnet_set_on_a_sample_scales_its_splits_and_records_its_corpus(on_sample, tmp_path, monkeypatch):
    spec = builder.load_set("wordnet", on_sample)
    assert len(spec["docs"]) == ROWS and spec["fit_pool"] == list(range(240))
    assert spec["queries"] and all(240 <= d < ROWS for d in spec["query_doc"])
    assert spec["rows"]["mpnet"] == [*range(30), *range(240, ROWS)]  # the first 10 % and the held-out
    assert spec["corpus"] == {"sample": True, "dir": str(ws.DEFAULT_CACHE / f"wordnet-sample-{ROWS}"), "rows": ROWS}
    assert spec["docs"] == json.loads((ws.DEFAULT_CACHE / f"wordnet-sample-{ROWS}" / "texts.json").read_text())
    rows, D, qrows, Q = builder.load_embeddings("wordnet", "e5", on_sample)
    assert list(rows) == list(range(ROWS)) and D.shape == (ROWS, 384) and len(qrows) == len(Q) == len(spec["queries"])
    np.testing.assert_array_equal(D, ws.load(ws.DEFAULT_CACHE / f"wordnet-sample-{ROWS}", "e5"))
    # the shared set appears: the cached sample set is refused, not extended, and left as it was
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "texts.json").write_text(json.dumps(["a", "b"]))
    for name in ("minilm", "e5"):
        np.save(shared / f"{name}.npy", np.zeros((2, 384), np.float16))
    monkeypatch.setattr(ws, "SHARED", shared)
    before = (on_sample / "wordnet" / "set.json").read_text()
    with pytest.raises(SystemExit, match="was built from a sample of 300 definitions .* now is the shared set"):
        builder.build(["wordnet"], ["minilm"], on_sample, embed=True, wordnet_queries=2000, bible_verses=0,
                      bible_queries=0, seed=0, sample_rows=ROWS)
    assert (on_sample / "wordnet" / "set.json").read_text() == before
    assert builder.wordnet_rows(40960) == {"corpus": 40960, "pool": 32768, "heldout": (32768, 40960),
                                           "mpnet": ((0, 4096), (32768, 40960))}  # the shared set's, as before
    assert builder.wordnet_rows(40960, small=True) == {"corpus": 1280, "pool": 768, "heldout": (768, 1280),
                                                       "mpnet": ((0, 1280),)}


def test_migration_benchmark_runs_on_a_sample_and_never_resumes_other_data(on_sample, tmp_path, capsys):
    args = ["--pairs", "wordnet:minilm:e5", "--cache", str(on_sample), "--ks", "50", "100", "--methods", "procrustes",
            "ridge", "--samplings", "random", "--no-plan", "--out", str(tmp_path / "m")]
    assert migration.main(args) == 0
    out = capsys.readouterr().out
    assert f"### wordnet:minilm:e5  ({ROWS} docs" in out and "fit pool 240)" in out
    assert NOTE in out and "| corpus | ridge | random |" in out and "| query | procrustes | random | 100 |" in out
    res = json.loads((tmp_path / "m.json").read_text())["pairs"]["wordnet:minilm:e5"]
    assert res["data"].startswith(NOTE) and res["n_docs"] == ROWS
    # cells measured on the shared set (no "data") are never resumed as the sample's
    shared = {"pairs": {"wordnet:minilm:e5": {k: v for k, v in res.items() if k != "data"}}, "env": {"seed": 0}}
    (tmp_path / "s.json").write_text(json.dumps(shared))
    with pytest.raises(SystemExit, match="measured on other data"):
        migration.main([*args[:-1], str(tmp_path / "s")])
    # --results: the default stem, marked as a sample's, in that folder (it could only be benchmarks/results)
    assert migration.main([*args[:-2], "--results", str(tmp_path / "r")]) == 0
    stem = f"migration_{date.today()}_sample"
    assert {p.name for p in (tmp_path / "r").iterdir()} == {f"{stem}.json", f"{stem}.md"}


def test_plan_proxies_run_on_a_sample(on_sample, capsys):
    proxies = load_benchmark("bench_plan_proxies")
    assert proxies.main(["--pairs", "wordnet:minilm:e5", "--ks", "50", "--probe", "30", "--cache", str(on_sample)]) == 0
    out = capsys.readouterr().out
    for method in ("procrustes", "ridge"):
        assert f"| wordnet:minilm:e5 | {ROWS} | 50 | {method} |" in out
    assert NOTE in out


def test_migration_ceiling_runs_on_a_sample(on_sample, capsys):
    ceiling = load_benchmark("bench_migration_ceiling")
    assert ceiling.main(["--cache", str(on_sample), "--lemma-pairs"]) == 0
    out = capsys.readouterr().out
    assert NOTE in out
    meta = json.loads((on_sample / "wordnet_qpairs" / "meta.json").read_text())
    n = len(meta["texts"])
    assert 0 < n < ceiling.N_LEMMA_PAIRS and all(r < 240 for r in meta["doc_rows"])  # fit-pool synsets only
    assert "| 240 | 0 | ridge |" in out and f"| 0 | {n} | ridge |" in out  # lemma pairs: as many as there are


def test_plan_labelled_compares_a_sample_only_with_a_run_of_the_same_data(on_sample, tmp_path, capsys):
    labelled = load_benchmark("bench_plan_labelled")
    args = ["--seeds", "0", "--probe", "100", "--queries", "20", "--cache", str(on_sample)]
    assert labelled.main(args) == 0  # against the committed runs: measured on the shared set
    out = capsys.readouterr().out
    assert "wordnet:minilm:e5: planned on " + NOTE in out and "not compared" in out
    assert "| wordnet:minilm:e5 | 0 |" not in out
    assert migration.main(["--pairs", "wordnet:minilm:e5", "--cache", str(on_sample), "--ks", "100", "--samplings",
                           "random", "--no-plan", "--out", str(tmp_path / "m")]) == 0
    capsys.readouterr()
    assert labelled.main([*args, "--measured", str(tmp_path / "m.json")]) == 0
    out = capsys.readouterr().out
    assert NOTE in out and "not compared" not in out and "| wordnet:minilm:e5 | 0 | 100 |" in out


@pytest.mark.parametrize("name", ["bench_steer", "bench_steer_transfer"])
def test_steer_benchmarks_run_on_a_sample(name, on_sample, tmp_path, capsys, monkeypatch):
    bench = load_benchmark(name)
    monkeypatch.setattr(getattr(bench, "bs", bench), "TASKS", [("noun.person", "noun.artifact")])  # one: quicker
    assert bench.main(["--queries", "20", "--sample-rows", str(ROWS), "--cache", str(on_sample),
                       "--results", str(tmp_path / "r")]) == 0
    out = capsys.readouterr()
    assert NOTE in out.out
    (path,) = (tmp_path / "r").glob("*.json")  # --results: not benchmarks/results; a sample's stem says so
    stem = "steer_pareto" if name == "bench_steer" else "steer_transfer"
    res = json.loads(path.read_text())
    assert path.name == f"{stem}_{res['setup']['date']}_sample.json"
    assert res["setup"]["data"].startswith(NOTE) and res["setup"]["queries"] == 20
    if name == "bench_steer":
        assert res["setup"]["train_rows"] == [0, 120] and res["setup"]["ndcg_corpus_rows"] == [120, ROWS]
        assert "| noun.person vs noun.artifact | minilm | vecbridge |" in out.out
        assert "### Relevance against the query's own document (nDCG@10)" in out.out  # the sample's own set
    else:
        assert "| noun.person | local | minilm -> e5 |" in out.out


def test_steer_benchmark_skips_ndcg_with_a_set_of_another_corpus(on_sample, tmp_path, capsys, monkeypatch):
    """A reverse-dictionary set built from the shared set (the default cache's) indexes another corpus."""
    other = tmp_path / "sets" / "wordnet"
    other.mkdir(parents=True)
    spec = json.loads((on_sample / "wordnet" / "set.json").read_text())
    (other / "set.json").write_text(json.dumps({**spec, "docs": spec["docs"][::-1]}))
    steer = load_benchmark("bench_steer")
    monkeypatch.setattr(steer, "TASKS", [("noun.person", "noun.artifact")])
    assert steer.main(["--queries", "20", "--sample-rows", str(ROWS), "--cache", str(tmp_path / "sets"),
                       "--stem", str(tmp_path / "s")]) == 0
    out = capsys.readouterr()
    assert "was built from another corpus than this run's: no nDCG" in out.err
    assert "nDCG: the reverse-dictionary set was not built" in out.out


def test_profile_floor_reads_a_sample(on_sample):
    floor = load_benchmark("profile_floor")
    A, B, fit, held, note = floor.load_data(ROWS)
    assert A.shape == B.shape == (ROWS, 384) and A.dtype == np.float32
    assert fit == 120 and held == slice(240, ROWS) and note.startswith(NOTE)
