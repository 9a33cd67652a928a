"""The labelled gate on real parts: WordNet reverse-dictionary queries (Debian's wordnet-base) embedded by the real
MiniLM and e5 encoders, the shared gloss embeddings as documents (or the WordNet sample the tests embed when the
shared set is absent), a MiniLM -> e5 map fitted by the CLI.

The figure a user gates on must be the one the migration benchmark measures, and the gate must say when a
migration is worse than keeping the old model (on this task MiniLM alone beats a 2,000-pair map into e5)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import load_benchmark, run_cli as _run
from service.io import write_vectors

pytestmark = pytest.mark.skipif(not Path("/usr/share/wordnet/data.noun").is_file(),
                                reason="needs Debian's wordnet-base (the reverse-dictionary queries)")


@pytest.fixture(scope="module")
def task(tmp_path_factory, wordnet, wordnet_dir):
    """The shared set (or, absent, the sample the tests embed: the same steps on its 4,096 rows, held out the last
    820, so a corpus of those 820 glosses)."""
    from service.encoders import get_encoder

    builder = load_benchmark("build_retrieval_sets")
    spec = builder.build_wordnet(300, seed=0)          # queries whose gloss is held out: rows [32768, 40960)
    lo, hi = builder.wordnet_rows(len(spec["docs"]))["heldout"]
    rng = np.random.default_rng(0)
    gloss = np.asarray(spec["query_doc"])
    pool = np.setdiff1d(np.arange(lo, hi), gloss)
    others = rng.choice(pool, min(2700, len(pool)), replace=False)
    rows = np.unique(np.concatenate([gloss, others]))               # a 3,000-gloss corpus holding every answer
    relevant = np.searchsorted(rows, gloss)
    old, new = wordnet["minilm"], wordnet["e5"]
    d = tmp_path_factory.mktemp("labelled")
    write_vectors(d / "old_docs.npy", np.asarray(old[rows], np.float32))
    write_vectors(d / "new_docs.npy", np.asarray(new[rows], np.float32))
    write_vectors(d / "old_pairs.npy", np.asarray(old[:2000], np.float32))
    write_vectors(d / "new_pairs.npy", np.asarray(new[:2000], np.float32))
    write_vectors(d / "q_new.npy", get_encoder("e5").encode(spec["queries"], "query").astype(np.float32))
    write_vectors(d / "q_old.npy", get_encoder("minilm").encode(spec["queries"], "query").astype(np.float32))
    np.save(d / "relevant.npy", relevant)
    return d


def test_gate_on_real_queries_matches_the_benchmark_and_flags_a_migration_worse_than_staying(task, capsys):
    d = task
    code, _, err = _run(capsys, "--data-dir", d / "var", "fit", "--pairs", "--source", d / "old_pairs.npy", "--target",
                        d / "new_pairs.npy", "--method", "ridge", "--name", "minilm-e5", "--quiet")
    assert code == 0, err
    common = ["--data-dir", d / "var", "eval", "--map", "minilm-e5", "--source", d / "old_docs.npy", "--target",
              d / "new_docs.npy", "--queries", d / "q_new.npy", "--old-queries", d / "q_old.npy",
              "--relevant", d / "relevant.npy"]
    code, out, err = _run(capsys, *common, "--json")
    assert code == 0, err
    retrieval = json.loads(out)["retrieval"]
    lab = retrieval["labelled"]
    # the benchmark's own metric code (FAISS top-100, exact) on the same vectors gives the same native figures
    bench = load_benchmark("bench_migration")
    rel = np.load(d / "relevant.npy")
    native = bench.retrieval_metrics(bench.search(np.load(d / "q_new.npy"), np.load(d / "new_docs.npy")), rel)
    assert lab["native"]["R@10"] == pytest.approx(native["R@10"]) and lab["native"]["R@1"] == pytest.approx(native["R@1"])
    assert 0.4 < lab["native"]["R@10"] < 0.95 and 0.4 < lab["old"]["R@10"] < 0.95    # real, not trivial, retrieval
    assert 0.2 < lab["retention"]["R@10"] < 0.95                                      # a real map loses some
    assert lab["beats_old"] is (lab["migrated"]["R@10"] >= lab["old"]["R@10"])
    assert lab["beats_old"] is False        # measured: MiniLM alone beats a 2,000-pair ridge map into e5 here
    # 300 queries leave the retention a few points uncertain: the interval says so, and says when a gate is inside it
    lo, hi = retrieval["retention_interval"]
    assert retrieval["retention_interval"] == lab["retention_interval"]["R@10"]
    assert lo < lab["retention"]["R@10"] < hi and 0.02 < hi - lo < 0.25
    above = round(max(0.95, hi + 0.005), 4)             # 0.95 on the shared set (the sample's 820 glosses: higher)
    code, out, _ = _run(capsys, *common, "--min-retention", str(above))
    assert code == 1 and "does NOT beat it" in out and "FAIL: labelled R@10 retention (corpus-side)" in out
    assert "95% interval" in out and "cannot decide it" not in out                     # above the interval
    gate = round((lo + lab["retention"]["R@10"]) / 2, 4)                               # below the figure, inside
    code, out, _ = _run(capsys, *common, "--min-retention", str(gate))
    assert code == 0 and f"PASS: labelled R@10 retention (corpus-side) {lab['retention']['R@10']:.4f}" in out
    assert "the gate lies inside the interval: these queries cannot decide it" in out
