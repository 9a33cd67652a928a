"""The name suggestion of a not-found error (:func:`service.errors.did_you_mean`) over many known names.

    python benchmarks/bench_did_you_mean.py                # 100,000 names
    python benchmarks/bench_did_you_mean.py --names 1000000

Times, per unknown name, difflib's own loop over every name (what ``did_you_mean`` ran before) and
``did_you_mean`` now (best of ``--repeat``), on numbered names (``map-000123``: every name the same length, the
worst case for difflib's length test) and random ones, and checks that both suggest the same name.
"""

from __future__ import annotations

import argparse
import difflib
import os
import random
import string
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from service.errors import did_you_mean


def best_of(fn, repeat: int) -> tuple[float, object]:
    out, times = None, []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--names", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    rng = random.Random(0)
    sets = {"numbered": [f"map-{i:06d}" for i in range(a.names)],
            "random": ["".join(rng.choices(string.ascii_lowercase + "-", k=rng.randint(5, 20)))
                       for _ in range(a.names)]}
    print("| names | set | unknown name | difflib loop (s) | did_you_mean (s) | suggestion |\n"
          "|---|---|---|---|---|---|")
    for kind, names in sets.items():
        for word in ("map-000123x", "minilm-e6", names[a.names // 2][:-1] + "~"):
            t_old, old = best_of(lambda w=word, n=names: difflib.get_close_matches(w, n, n=1, cutoff=0.75), a.repeat)
            t_new, new = best_of(lambda w=word, n=names: did_you_mean(w, n, show=str), a.repeat)
            assert new == (f" (did you mean {old[0]}?)" if old else ""), (word, old, new)
            print(f"| {a.names:,} | {kind} | {word} | {t_old:.3f} | {t_new:.3f} | {old[0] if old else '-'} |")


if __name__ == "__main__":
    main()
