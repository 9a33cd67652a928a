"""Benchmark: does a local steer's reliability flag tell real labels from shuffled ones, at every size?

A local steer (``align.fit_steer`` default) is judged by its own cross-validation of the prior weight
(``prior_selection.heldout_loss_ratio``; :func:`service.ops.steers.fit_verdict` flags it unreliable above
``1 - STEER_MIN_HELDOUT_GAIN``). This fits, on real WordNet rows (``shared/data/wordnet``, labels as
``bench_steer.py`` derives them: lexicographer files), ``--seeds`` random draws of ``n`` training rows for each
``n`` in ``--sizes``, once with the real labels and once with the same labels shuffled among the drawn rows,
and prints per size the best held-out loss ratio (mean, min-max over seeds) and how many fits were flagged.

Run: ``OMP_NUM_THREADS=1 python benchmarks/bench_steer_flag.py [--space minilm] [--task noun.plant,noun.animal]
[--json out.json]``.

Before / after (``benchmarks/results/steer_flag_2026-12-06.md``): the "before" columns are this script run with
the code of the commit before the honest held-out check (``git worktree add /tmp/before da9f48c~1``, then
``--code /tmp/before --json before.json``: ``align`` and ``service`` imported from that checkout, the data and
labels from this one), passed to the "after" run as ``--before before.json``. Without ``--before`` the table has
this run's columns only, and its first line names the code the fits ran.

``--lift`` adds a held-out retrieval-lift column: the steer applied at eps 2 to held-out queries (rows
[32768, 33268) of the sample), the label's precision@10 among held-out corpus rows [16384, 32768) minus that at
eps 0, mean over seeds (a measurement for judging a criterion; it does not change the flag).
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

LIFT_EPS = 2.0
LIFT_CORPUS, LIFT_QUERIES = slice(16384, 32768), slice(32768, 33268)


def _load(code: Path | None):
    """``align`` / ``service`` from ``code`` (another checkout: the "before" columns) or this one; imported before
    bench_steer, whose own ``import align`` then finds them loaded."""
    if code is not None:
        sys.path.insert(0, str(Path(code).resolve()))
    import align.steer
    import service.ops.steers
    return align.steer.fit_steer, service.ops.steers.fit_verdict


def _lift(steer, emb, labels_all) -> float:
    """Label precision@10 gain, eps LIFT_EPS vs 0, of held-out queries over held-out corpus rows."""
    from align.knn import knn

    C = np.ascontiguousarray(emb[LIFT_CORPUS], np.float32)
    attr = labels_all[LIFT_CORPUS] == 1
    Q = np.ascontiguousarray(emb[LIFT_QUERIES], np.float32)
    prec = [float(attr[knn(np.asarray(steer.apply(Q, eps), np.float32), C, 10)[1]].mean()) for eps in (0, LIFT_EPS)]
    return prec[1] - prec[0]


def run(space: str, task: tuple[str, str], sizes, seeds, *, code: Path | None = None, lift: bool = False
        ) -> list[dict]:
    fit_steer, fit_verdict = _load(code)
    import wordnet_sample
    from bench_steer import synset_facts, task_labels

    from align.exceptions import DegenerateInputError

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
                gain = None
                try:
                    steer = fit_steer(X, lab, random_state=seed)
                    verdict = fit_verdict(steer.metadata)
                    gain = round(_lift(steer, emb, labels_all), 4) if lift else None
                except DegenerateInputError as e:  # a draw without one side (rare attributes on few rows)
                    verdict = {"refused": str(e).split(";")[0]}
                out.append({"n": n, "seed": seed, "labels": kind, "n_pos": int((lab == 1).sum()),
                            "n_neg": int((lab == -1).sum()), "ratio": verdict.get("heldout_loss_ratio"),
                            "flagged": verdict.get("reliable") is False, "refused": verdict.get("refused"),
                            **({"lift": gain} if lift else {}),
                            "seconds": round(time.time() - t0, 2)})
                print(json.dumps(out[-1]), flush=True)
    return out


def _cells(got: list[dict]) -> tuple[str, str]:
    """'mean (min-max)' of the ratios and 'flagged/judged' of one size and kind."""
    ratios = [r["ratio"] for r in got if r["ratio"] is not None]
    refused = sum(r.get("refused") is not None for r in got)
    ratio = f"{np.mean(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})" if ratios else "not judged"
    return ratio, (f"{sum(r['flagged'] for r in got)}/{len(got) - refused}"
                   + (f" ({refused} refused: one side absent)" if refused else ""))


def table(rows: list[dict], before: list[dict] | None = None) -> str:
    """One line per size and kind: this run's ratio and flags, after ``before``'s (another code's run) if given,
    and the retrieval lift when measured."""
    lift = any("lift" in r for r in rows)
    head = ["rows", "+1 / -1 rows (mean)", "labels"]
    head += ["before: ratio mean (min-max)", "before flagged", "after: ratio mean (min-max)", "after flagged"] \
        if before is not None else ["ratio mean (min-max)", "flagged"]
    head += [f"lift p@10 eps {LIFT_EPS:g} vs 0 (mean, min-max)"] if lift else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n in sorted({r["n"] for r in rows}):
        for kind in ("real", "shuffled"):
            got = [r for r in rows if r["n"] == n and r["labels"] == kind]
            cells = [str(n), f"{np.mean([r['n_pos'] for r in got]):.0f} / {np.mean([r['n_neg'] for r in got]):.0f}",
                     kind]
            if before is not None:
                cells += _cells([r for r in before if r["n"] == n and r["labels"] == kind])
            cells += _cells(got)
            if lift:
                gains = [r["lift"] for r in got if r.get("lift") is not None]
                cells.append(f"{np.mean(gains):+.3f} ({min(gains):+.3f}-{max(gains):+.3f})" if gains else "-")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", default="minilm")
    ap.add_argument("--task", default="noun.plant,noun.animal")
    ap.add_argument("--sizes", default="300,1000,3000,8000")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None, help="write the rows here as well")
    ap.add_argument("--code", type=Path, default=None,
                    help="import align and service from this checkout (e.g. a worktree of an older commit)")
    ap.add_argument("--before", type=Path, default=None,
                    help="rows (--json) of a --code run, shown as the before columns beside this run's")
    ap.add_argument("--lift", action="store_true", help="add the held-out retrieval-lift column (see above)")
    a = ap.parse_args(argv)
    rows = run(a.space, tuple(a.task.split(",")), [int(s) for s in a.sizes.split(",")], range(a.seeds),
               code=a.code, lift=a.lift)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    import align
    print(f"fits by align from {Path(align.__file__).resolve().parents[1]}"
          + (f"; before: {a.before}" if a.before else ""))
    print(table(rows, json.loads(a.before.read_text()) if a.before else None))


if __name__ == "__main__":
    main()
