"""Wall time of ``align.fit_migration`` per method on N paired rows, serial vs threaded decompositions.

    python benchmarks/bench_fit_time.py                      # 10,000 WordNet minilm -> e5 pairs, auto
    python benchmarks/bench_fit_time.py --methods auto ridge cluster --pairs 10000

The issue-16 goal is ``method="auto"`` on 10k pairs in <= 60 s on the 2-core development machine.
``align.linalg`` runs the d x d decompositions (eigh / svd / solve) with the BLAS at one thread;
the ``threaded`` rows undo that (the decompositions get every BLAS thread, as before) so the two
are compared side by side in one run, alternating, with the load average printed beside each row:
on a busy machine OpenBLAS's spinning threads are what the serial decompositions avoid. Same seed; the
chosen family must be the same in both variants: a round where it differs is printed and written as a MISMATCH
line and the script exits 1. Writes ``benchmarks/results/fit_time_<date>.{json,md}``
(``--results DIR``: elsewhere). Data: ``../shared/data/wordnet`` (rows [0, N) of ``minilm`` / ``e5``); without
it a sample of 4,096 definitions embedded here (``wordnet_sample.py``; N defaults to the same fraction of its
rows as 10,000 of 40,960, and is at most its rows), said so; a synthetic planted pair (said so in the output)
when neither can be had.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import wordnet_sample

import align  # noqa: E402
from align import linalg  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


@contextlib.contextmanager
def threaded_decompositions():
    """The decompositions with every BLAS thread (``align.linalg.serial_blas`` made a no-op)."""
    real = linalg.serial_blas
    linalg.serial_blas = contextlib.nullcontext
    try:
        yield
    finally:
        linalg.serial_blas = real


def load_pairs(n: int | None) -> tuple[np.ndarray, np.ndarray, str, str]:
    """``(X, Y, data, note)``: rows [0, n) (``None``: 10,000 of the shared set's 40,960, the same fraction of a
    sample's rows; at most the rows there are)."""
    try:
        folder = wordnet_sample.wordnet_dir()
    except wordnet_sample.SampleUnavailable as e:
        print(f"no WordNet data ({e}): a synthetic planted pair instead")
    else:
        total = wordnet_sample.rows_of(folder)
        n = min(total, round(10000 * total / wordnet_sample.SHARED_ROWS) if n is None else n)
        X = wordnet_sample.load(folder, "minilm")[:n]
        Y = wordnet_sample.load(folder, "e5")[:n]
        kind = f"WordNet sample ({total:,} rows)" if wordnet_sample.is_sample(folder) else "WordNet"
        return X, Y, f"{kind} minilm -> e5, rows [0, {n})", wordnet_sample.note(folder)
    n = 10000 if n is None else n
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 384)).astype(np.float32)
    Q = np.linalg.qr(rng.normal(size=(384, 384)))[0]
    Y = (X @ Q + 0.3 * rng.normal(size=X.shape)).astype(np.float32)
    return X, Y, f"SYNTHETIC planted rotation + noise, {n} rows (shared WordNet data absent)", ""


def mismatches(rows: list[dict]) -> list[str]:
    """One line per (method, round) whose serial and threaded fits chose different families."""
    chosen = {(r["method"], r["round"], r["variant"]): r["chosen"] for r in rows}
    return [f"MISMATCH: {m} round {k}: serial chose {c}, threaded chose {chosen.get((m, k, 'threaded'))}"
            for (m, k, v), c in chosen.items() if v == "serial" and chosen.get((m, k, "threaded")) != c]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=None, help="default 10,000 (a sample: the same fraction of it)")
    ap.add_argument("--methods", nargs="+", default=["auto"])
    ap.add_argument("--rounds", type=int, default=1, help="alternating serial/threaded rounds per method")
    ap.add_argument("--results", type=Path, default=RESULTS, help="folder for the .json / .md (default %(default)s)")
    args = ap.parse_args(argv)
    if args.pairs is not None and args.pairs < 1:
        ap.error(f"--pairs must be at least 1, got {args.pairs}")
    X, Y, data, note = load_pairs(args.pairs)
    args.pairs = X.shape[0]
    if note:
        print(note)
    rows = []
    for method in args.methods:
        for r in range(args.rounds):
            for variant in ("serial", "threaded"):
                ctx = threaded_decompositions() if variant == "threaded" else contextlib.nullcontext()
                load = os.getloadavg()[0]
                t = time.perf_counter()
                with ctx:
                    m = align.fit_migration(X, Y, method=method, random_state=0)
                secs = time.perf_counter() - t
                chosen = m.metadata.get("method")
                rows.append({"method": method, "round": r, "variant": variant, "seconds": round(secs, 1),
                             "chosen": chosen, "load_1min": round(load, 2)})
                print(f"{method:12s} round {r} {variant:9s} {secs:7.1f} s  chosen {chosen}  load {load:.2f}",
                      flush=True)
    out = {"date": str(date.today()), "data": data, **({"note": note} if note else {}), "pairs": args.pairs,
           "cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__, "rows": rows}
    args.results.mkdir(parents=True, exist_ok=True)
    stem = args.results / f"fit_time_{date.today()}"
    stem.with_suffix(".json").write_text(json.dumps(out, indent=1))
    lines = [f"# fit_migration wall time, {args.pairs} pairs ({data})", "",
             f"{os.cpu_count()} CPUs; serial = d x d decompositions at one BLAS thread (align.linalg), "
             "threaded = every BLAS thread; alternating; load = 1-min load average at the start of the fit.",
             *([note] if note else []), "",
             "| method | round | variant | seconds | chosen | load |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['method']} | {r['round']} | {r['variant']} | {r['seconds']} | {r['chosen']} | {r['load_1min']} |"
              for r in rows]
    bad = mismatches(rows)
    lines += ["", *(bad or ["serial and threaded chose the same family in every round."])]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
