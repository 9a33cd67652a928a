"""Small writes to a large index: the log (a delta per change) against a whole snapshot per change.

    python benchmarks/bench_index_writes.py                      # flat 40,960 / hnsw 60,000 / ivf 200,000 rows
    python benchmarks/bench_index_writes.py --out benchmarks/results/index_writes_2026-12-02.md

For each kind, one index is built from the WordNet MiniLM rows (``../shared/data/wordnet/minilm.npy``;
repeated with small noise past 40,960 rows, said in the table; without the shared set, the MiniLM rows of a
sample of 4,096 definitions embedded here (``wordnet_sample.py``), said so; random rows when neither can be had),
then ``--adds`` adds of ``--batch`` rows and ``--deletes`` deletes of ``--batch`` ids are made twice, side by
side in one run: with the log (what vecbridge does) and with every change written as a whole snapshot (the
format before the log: ``persist.LOG_MAX_FILES = 0``). Per change: the writer's wall time (p50), the
bytes it wrote, and the time a second store on the same directory (what another process or replica does
on its next request) takes to catch up (p50). Prints a markdown table with the ratios.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import wordnet_sample

from service.indexes import IndexStore, persist


@functools.cache
def wordnet() -> Path | None:
    """The WordNet folder holding ``minilm.npy`` (the shared set, else a sample built here), or None."""
    try:
        return wordnet_sample.wordnet_dir(("minilm",))
    except wordnet_sample.SampleUnavailable as e:
        print(f"no WordNet rows ({e}): random rows instead")
        return None


def data_note() -> str:
    """The sample note (``wordnet_sample.note``) when the rows come from a sample, else empty."""
    return wordnet_sample.note(wordnet()) if wordnet() is not None else ""


def rows(n: int, seed: int = 0) -> tuple[np.ndarray, str]:
    """``n`` x 384 float32 rows: WordNet MiniLM rows, repeated with N(0, 0.01) noise past the file's length."""
    rng = np.random.default_rng(seed)
    if wordnet() is not None:
        base = wordnet_sample.load(wordnet(), "minilm")
        reps = -(-n // base.shape[0])
        X = np.concatenate([base + (0.01 * rng.standard_normal(base.shape, dtype=np.float32) if r else 0)
                            for r in range(reps)])[:n]
        name = f"WordNet sample ({base.shape[0]:,}) MiniLM" if wordnet_sample.is_sample(wordnet()) else "WordNet MiniLM"
        src = name + (f" x{reps} with noise" if reps > 1 else "")
    else:
        X, src = rng.standard_normal((n, 384), dtype=np.float32), "random"
    return X, src


def _written(path: Path, before: dict[str, int]) -> int:
    """Bytes of the files under ``path`` that are new or changed since ``before`` (name -> mtime_ns)."""
    total = 0
    for p in path.iterdir():
        st = p.stat()
        if before.get(p.name) != st.st_mtime_ns:
            total += st.st_size
    return total


def _mtimes(path: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in path.iterdir()}


def run(kind: str, n: int, params: dict, adds: int, deletes: int, batch: int, logged: bool) -> dict:
    X, src = rows(n + adds * batch)
    root = Path(tempfile.mkdtemp(prefix=f"bench-ix-{kind}-"))
    saved = persist.LOG_MAX_FILES
    persist.LOG_MAX_FILES = saved if logged else 0
    try:
        writer = IndexStore(root)
        t0 = time.perf_counter()
        idx = writer.create("docs", "s", X[:n], kind=kind, params=dict(params))
        build_s = time.perf_counter() - t0
        reader = IndexStore(root)
        reader.get("docs")
        path = root / "docs"
        write_ms, bytes_w, catch_ms = [], [], []
        rng = np.random.default_rng(1)
        for i in range(adds + deletes):
            before = _mtimes(path)
            t0 = time.perf_counter()
            if i < adds:
                idx.add(X[n + i * batch:n + (i + 1) * batch])
            else:
                idx.delete(rng.choice(n, batch, replace=False).tolist())
            write_ms.append(1e3 * (time.perf_counter() - t0))
            bytes_w.append(_written(path, before))
            t0 = time.perf_counter()
            got = reader.get("docs")
            catch_ms.append(1e3 * (time.perf_counter() - t0))
            assert got.generation == idx.generation and got.count == idx.count
        return {"kind": kind, "rows": n, "src": src, "mode": "log" if logged else "snapshot each change",
                "build_s": build_s, "write_ms": float(np.median(write_ms)), "bytes": float(np.median(bytes_w)),
                "catch_ms": float(np.median(catch_ms)), "disk": sum(p.stat().st_size for p in path.iterdir())}
    finally:
        persist.LOG_MAX_FILES = saved
        shutil.rmtree(root, ignore_errors=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flat", type=int, default=40_960)
    ap.add_argument("--hnsw", type=int, default=60_000)
    ap.add_argument("--ivf", type=int, default=200_000)
    ap.add_argument("--adds", type=int, default=8)
    ap.add_argument("--deletes", type=int, default=4)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--out", default=None, help="also write the table to this markdown file")
    a = ap.parse_args(argv)
    cases = [("flat", a.flat, {}), ("hnsw", a.hnsw, {"M": 16, "ef_construction": 40}), ("ivf", a.ivf, {"nlist": 256})]
    head = (f"Small changes to a large index ({a.adds} adds then {a.deletes} deletes of {a.batch} rows each; "
            f"p50 per change; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')})")
    columns = ("| kind | rows (source) | mode | write p50 ms | bytes written p50 | other store catches up p50 ms | "
               "files on disk MB |")
    lines = [head, *([data_note()] if data_note() else []), "", columns, "|---|---|---|---:|---:|---:|---:|"]
    ratios = []
    for kind, n, params in cases:
        if n <= 0:
            continue
        res = [run(kind, n, params, a.adds, a.deletes, a.batch, logged) for logged in (False, True)]
        for r in res:
            lines.append(f"| {kind} | {r['rows']:,} ({r['src']}) | {r['mode']} | {r['write_ms']:.1f} | "
                         f"{r['bytes']:,.0f} | {r['catch_ms']:.1f} | {r['disk'] / 2**20:.1f} |")
        old, new = res
        ratios.append(f"- {kind}: write {old['write_ms'] / new['write_ms']:.0f}x faster, "
                      f"{old['bytes'] / max(new['bytes'], 1):.0f}x fewer bytes, catch-up "
                      f"{old['catch_ms'] / max(new['catch_ms'], 1e-3):.0f}x faster with the log")
        print("\n".join(lines[-2:]), flush=True)
    text = "\n".join(lines + [""] + ratios) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(f"# Index writes: log vs snapshot per change\n\n`python {' '.join(sys.argv)}`\n\n"
                               + text)


if __name__ == "__main__":
    main()
