"""Benchmark: the cost of mapping ONE query (batch 1), per map family, beside a plain GEMV.

Query-side migration (Drift-Adapter) and every batch-1 transform or search over HTTP pay
``map.apply(x)`` for a single row; its published anchor is "< 10 µs per query". Maps are fitted on
WordNet MiniLM -> e5 (3,000 pairs; the shared data, else a sample of 4,096 definitions embedded here by
``wordnet_sample.py``, said so, or a synthetic planted pair when neither can be had); 200 different held-out
rows are applied one at a time, p50 per call, best of ``--rounds`` rounds.

``--baseline-tree DIR`` runs the same measurement in another checkout (a subprocess with its
``align``), interleaved round by round, and prints both side by side with the ratio: speed is
compared within one run, since the machine is shared.

Run: ``OMP_NUM_THREADS=1 python benchmarks/bench_query_apply.py [--baseline-tree ../old] [--out name]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import wordnet_sample

RESULTS = ROOT / "benchmarks" / "results"


def wordnet(log=print) -> Path | None:
    """The WordNet folder (the shared set, else a sample built here), or None when neither can be had."""
    try:
        return wordnet_sample.wordnet_dir(log=log)
    except wordnet_sample.SampleUnavailable as e:
        log(f"no WordNet data ({e}): a synthetic planted pair instead")
        return None


def data() -> tuple[np.ndarray, np.ndarray]:
    """``(A, B)`` (3,200, 384) float32 (at most a sample's rows): WordNet MiniLM / e5 rows, or a synthetic planted
    rotation without them."""
    folder = wordnet(log=lambda *a: None)  # the parent process built a sample, if one is needed, and said so
    if folder is not None:
        return wordnet_sample.load(folder, "minilm")[:3200], wordnet_sample.load(folder, "e5")[:3200]
    rng = np.random.default_rng(0)
    A = rng.normal(size=(3200, 384)).astype(np.float32) + 0.3
    Q = np.linalg.qr(rng.normal(size=(384, 384)))[0]
    return A, (A @ Q + 0.2 * rng.normal(size=A.shape)).astype(np.float32)


def measure(rounds: int) -> dict:
    """p50 µs per single-row call for each case, best of ``rounds`` (this process's ``align``)."""
    import align
    from align.frames import unit_rows

    A, B = data()
    held = min(200, A.shape[0] // 5)  # 3,000 fit pairs and 200 held-out rows of 3,200; 4:1 in a smaller sample
    fit = A.shape[0] - held
    maps = {k: align.fit_migration(A[:fit], B[:fit], method=k, random_state=0)
            for k in ("procrustes", "ridge", "cluster")}
    X = np.ascontiguousarray(A[fit:])
    W = np.ascontiguousarray(maps["procrustes"].W, dtype=np.float32)
    cases = {"GEMV x @ W (reference)": lambda x: x @ W,
             **{f"{k} apply (raw)": (lambda x, m=m: m.apply(x)) for k, m in maps.items()},
             "procrustes apply (frame)": lambda x: maps["procrustes"].apply(x, output="frame"),
             "unit_rows (the index's query normalisation)": unit_rows}
    best = {}
    for _ in range(rounds):
        for name, fn in cases.items():
            ts = []
            for i in range(2000):
                x = X[i % held : i % held + 1]
                t0 = time.perf_counter()
                fn(x)
                ts.append(time.perf_counter() - t0)
            best[name] = min(best.get(name, np.inf), float(np.median(ts) * 1e6))
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline-tree", type=Path, help="another checkout, measured interleaved")
    ap.add_argument("--out", help="results stem under benchmarks/results (default: print only)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(measure(a.rounds)))
        return 0
    folder = wordnet()
    trees = {"this tree": ROOT, **({"baseline": a.baseline_tree.resolve()} if a.baseline_tree else {})}
    runs: dict = {t: [] for t in trees}
    for _ in range(a.rounds):  # one round per tree in turn: both see the same machine load
        for label, tree in trees.items():
            env = {**os.environ, "PYTHONPATH": str(tree)}
            out = subprocess.run([sys.executable, __file__, "--child", "--rounds", "1"], env=env, cwd=tree,
                                 capture_output=True, text=True, check=True).stdout
            runs[label].append(json.loads(out.strip().splitlines()[-1]))
    res = {t: {k: min(r[k] for r in rs) for k in rs[0]} for t, rs in runs.items()}
    head = ["case", "this tree µs"] + (["baseline µs", "baseline / this"] if a.baseline_tree else [])
    source = "synthetic planted rotation" if folder is None else "WordNet MiniLM -> e5" + (
        f", a sample of {wordnet_sample.rows_of(folder):,}" if wordnet_sample.is_sample(folder) else "")
    note = "" if folder is None else wordnet_sample.note(folder)
    title = (f"Single-row apply, p50 per call, best of {a.rounds} interleaved rounds ({source}, 384 -> 384, "
             f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, load {os.getloadavg()[0]:.1f})")
    lines = [title, *([note] if note else []), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k, v in res["this tree"].items():
        row = [k, f"{v:.1f}"]
        if a.baseline_tree:
            b = res["baseline"][k]
            row += [f"{b:.1f}", f"{b / v:.2f}x"]
        lines.append("| " + " | ".join(row) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"{a.out}.json").write_text(json.dumps({"rounds": runs, "best": res}, indent=1))
        (RESULTS / f"{a.out}.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
