"""Wall time of ``align.fit_migration`` per method on N paired rows, serial vs threaded decompositions.

    python benchmarks/bench_fit_time.py                      # 10,000 WordNet minilm -> e5 pairs, auto
    python benchmarks/bench_fit_time.py --methods auto ridge cluster --pairs 10000

The issue-16 goal is ``method="auto"`` on 10k pairs in <= 60 s on the 2-core development machine.
``align.linalg`` runs the d x d decompositions (eigh / svd / solve) with the BLAS at one thread;
the ``threaded`` rows undo that (the decompositions get every BLAS thread, as before) so the two
are compared side by side in one run, alternating, with the load average printed beside each row:
on a busy machine OpenBLAS's spinning threads are what the serial decompositions avoid. Same seed,
same chosen family in both variants (checked). Writes ``benchmarks/results/fit_time_<date>.{json,md}``.
Data: ``../shared/data/wordnet`` (rows [0, N) of ``minilm`` / ``e5``); a synthetic planted pair
(said so in the output) when it is absent.
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
import align  # noqa: E402
from align import linalg  # noqa: E402

WORDNET = Path(os.environ.get("VECBRIDGE_WORDNET_DIR", ROOT.parent / "shared" / "data" / "wordnet"))
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


def load_pairs(n: int) -> tuple[np.ndarray, np.ndarray, str]:
    if (WORDNET / "minilm.npy").exists():
        X = np.asarray(np.load(WORDNET / "minilm.npy", mmap_mode="r")[:n], np.float32)
        Y = np.asarray(np.load(WORDNET / "e5.npy", mmap_mode="r")[:n], np.float32)
        return X, Y, f"WordNet minilm -> e5, rows [0, {n})"
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 384)).astype(np.float32)
    Q = np.linalg.qr(rng.normal(size=(384, 384)))[0]
    Y = (X @ Q + 0.3 * rng.normal(size=X.shape)).astype(np.float32)
    return X, Y, f"SYNTHETIC planted rotation + noise, {n} rows (shared WordNet data absent)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=10000)
    ap.add_argument("--methods", nargs="+", default=["auto"])
    ap.add_argument("--rounds", type=int, default=1, help="alternating serial/threaded rounds per method")
    args = ap.parse_args()
    X, Y, data = load_pairs(args.pairs)
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
    out = {"date": str(date.today()), "data": data, "pairs": args.pairs, "cpus": os.cpu_count(),
           "python": platform.python_version(), "numpy": np.__version__, "rows": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"fit_time_{date.today()}"
    stem.with_suffix(".json").write_text(json.dumps(out, indent=1))
    lines = [f"# fit_migration wall time, {args.pairs} pairs ({data})", "",
             f"{os.cpu_count()} CPUs; serial = d x d decompositions at one BLAS thread (align.linalg), "
             "threaded = every BLAS thread; alternating; load = 1-min load average at the start of the fit.", "",
             "| method | round | variant | seconds | chosen | load |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['method']} | {r['round']} | {r['variant']} | {r['seconds']} | {r['chosen']} | {r['load_1min']} |"
              for r in rows]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
