"""Benchmark: does a local steer's reliability flag tell real labels from shuffled ones, at every size?

A local steer (``align.fit_steer`` default) is judged by its own cross-validation of the prior weight
(``prior_selection.heldout_loss_ratio``; :func:`service.ops.steers.fit_verdict` flags it unreliable above
``1 - STEER_MIN_HELDOUT_GAIN``). This fits, on real WordNet rows (``shared/data/wordnet``, labels as
``bench_steer.py`` derives them: lexicographer files), ``--seeds`` random draws of ``n`` training rows for each
``n`` in ``--sizes``, once with the real labels and once with the same labels shuffled among the drawn rows,
and prints per size the best held-out loss ratio (mean, min-max over seeds) and how many fits were flagged.

Run: ``OMP_NUM_THREADS=1 python benchmarks/bench_steer_flag.py [--space minilm] [--task noun.plant,noun.animal]
[--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import wordnet_sample
from bench_steer import synset_facts, task_labels

from align.exceptions import DegenerateInputError
from align.steer import fit_steer
from service.ops.steers import fit_verdict


def run(space: str, task: tuple[str, str], sizes, seeds) -> list[dict]:
    folder = wordnet_sample.wordnet_dir((space,))
    texts = json.loads((folder / "texts.json").read_text())
    emb = wordnet_sample.load(folder, space)
    train = wordnet_sample.split(len(texts))[0]
    lex, pol = synset_facts(texts)
    labels_all = task_labels(lex, pol, *task)
    out = []
    for n in sizes:
        for seed in seeds:
            rng = np.random.default_rng(seed)
            rows = np.sort(rng.choice(np.arange(train.start, train.stop), size=n, replace=False))
            X, y = np.ascontiguousarray(emb[rows], np.float32), labels_all[rows]
            for kind, lab in (("real", y), ("shuffled", rng.permutation(y))):
                t0 = time.time()
                try:
                    verdict = fit_verdict(fit_steer(X, lab, random_state=seed).metadata)
                except DegenerateInputError as e:  # a draw without one side (rare attributes on few rows)
                    verdict = {"refused": str(e).split(";")[0]}
                out.append({"n": n, "seed": seed, "labels": kind, "n_pos": int((lab == 1).sum()),
                            "n_neg": int((lab == -1).sum()), "ratio": verdict.get("heldout_loss_ratio"),
                            "flagged": verdict.get("reliable") is False, "refused": verdict.get("refused"),
                            "seconds": round(time.time() - t0, 2)})
                print(json.dumps(out[-1]), flush=True)
    return out


def table(rows: list[dict]) -> str:
    lines = ["| rows | +1 / -1 rows (mean) | labels | ratio mean | ratio min-max | flagged |",
             "|---|---|---|---|---|---|"]
    for n in sorted({r["n"] for r in rows}):
        for kind in ("real", "shuffled"):
            got = [r for r in rows if r["n"] == n and r["labels"] == kind]
            ratios = [r["ratio"] for r in got if r["ratio"] is not None]
            pos = np.mean([r["n_pos"] for r in got])
            neg = np.mean([r["n_neg"] for r in got])
            span = f"{min(ratios):.3f}-{max(ratios):.3f}" if ratios else "not judged"
            mean = f"{np.mean(ratios):.3f}" if ratios else "-"
            refused = sum(r.get("refused") is not None for r in got)
            lines.append(f"| {n} | {pos:.0f} / {neg:.0f} | {kind} | {mean} | {span} | "
                         f"{sum(r['flagged'] for r in got)}/{len(got) - refused}"
                         + (f" ({refused} refused: one side absent)" if refused else "") + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", default="minilm")
    ap.add_argument("--task", default="noun.plant,noun.animal")
    ap.add_argument("--sizes", default="300,1000,3000,8000")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None, help="write the rows here as well")
    a = ap.parse_args(argv)
    rows = run(a.space, tuple(a.task.split(",")), [int(s) for s in a.sizes.split(",")], range(a.seeds))
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
