"""What hiding a database URL's password costs on a hostile URL: many ``@`` (and ``?``, ``'``) in its user part.

    python benchmarks/bench_redact.py                 # 1,000 to 16,000 repeats of each shape
    python benchmarks/bench_redact.py --repeat 5

Times :func:`service.urls.safe_url` and :func:`service.urls.redact` (of a message quoting the URL, best of
``--repeat``) as the URL grows: each should grow about linearly (redact looked for every tail after each ``@``:
``"postgresql://x:y/" + "a@?b" * 16000 + "="`` took 13 s), and checks no drawn piece is left in the message.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from service.urls import redact, safe_url

#: a URL's shape for ``n``: its user part repeats a piece ``n`` times
SHAPES = {"a@?b": lambda n: "postgresql://x:y/" + "a@?b" * n + "=",
          "i@ (distinct)": lambda n: "postgresql://x:" + "".join(f"p{i}@" for i in range(n)) + "db/vb",
          "'i' (quoted)": lambda n: "postgresql://x:" + "".join(f"'q{i}'" for i in range(n)) + "@db/vb"}


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    print("| shape | repeats | URL chars | safe_url (s) | redact (s) |\n|---|---|---|---|---|")
    for name, shape in SHAPES.items():
        for n in (1000, 4000, 16000):
            url = shape(n)
            message = f"could not connect with {url}: {url[::-1]}"
            assert "p1@" not in redact(message, url) and "'q1'" not in redact(message, url)
            t_safe = best_of(lambda u=url: safe_url(u), a.repeat)
            t_redact = best_of(lambda u=url, m=message: redact(m, u), a.repeat)
            print(f"| {name} | {n:,} | {len(url):,} | {t_safe:.4f} | {t_redact:.4f} |")


if __name__ == "__main__":
    main()
