"""``vecbridge backup`` of a data dir under writes: time, bytes, and what the writers felt.

    python benchmarks/bench_backup.py                     # a 200,000-row flat index (384-d) + a registry
    python benchmarks/bench_backup.py --rows 50000 --out benchmarks/results/backup_<date>.md

Builds a data dir (spaces a, b; the map a2b with ``--versions`` versions; the index ``docs`` of ``--rows`` rows
of 384-d, WordNet MiniLM rows repeated with noise as in ``bench_index_writes``: those of a sample embedded here
when the shared set is absent, said so), starts a writer process that
adds 16 rows to ``docs`` and registers a new a2b version every 8 adds, in a loop, timing each write, and takes
two backups while it runs: ``--link`` (hard links, DEST on the same file system) and ``--copy`` (the default,
as ``vecbridge backup --help`` says). Prints one
table: seconds, files, bytes in the backup, bytes copied, how long the SQLite copies held their read lock, and
the writer's index adds and registry writes (count, p50, max) inside each backup's window against outside.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from bench_index_writes import data_note, rows

from align import fit_procrustes
from service.config import Settings
from service.indexes import IndexStore
from service.ops.backup import backup_data_dir
from service.registry import open_registry

WRITER = """
import json, sys, time
from pathlib import Path
import numpy as np
sys.path.insert(0, sys.argv[3])
from align import fit_procrustes
from service.indexes import IndexStore
from service.registry import open_registry

data, log = Path(sys.argv[1]), open(sys.argv[2], "a", buffering=1)
idx = IndexStore(data / "indexes").get("docs")
reg = open_registry(f"sqlite:///{data / 'registry.sqlite'}", data / "artifacts")
rng = np.random.default_rng(1)
X = rng.standard_normal((256, 16)).astype(np.float32)
k = 0
while not (data.parent / "stop").exists():
    t0 = time.time()
    idx.add(rng.standard_normal((16, idx.dim)).astype(np.float32))
    log.write(json.dumps({"op": "index", "start": t0, "s": time.time() - t0}) + "\\n")
    k += 1
    if k % 8 == 0:
        Q, _ = np.linalg.qr(rng.standard_normal((16, 16)))
        t0 = time.time()
        reg.register_version("a2b", fit_procrustes(X, (X @ Q).astype(np.float32)), source_space="a",
                             target_space="b", method="procrustes", params={}, alias="prod")
        log.write(json.dumps({"op": "registry", "start": t0, "s": time.time() - t0}) + "\\n")
    time.sleep(0.01)
"""


def build(data: Path, n: int, versions: int) -> None:
    reg = open_registry(f"sqlite:///{data / 'registry.sqlite'}", data / "artifacts")
    reg.register_space("a", 16)
    reg.register_space("b", 16)
    X = np.random.default_rng(0).standard_normal((256, 16)).astype(np.float32)
    for v in range(versions):
        Q, _ = np.linalg.qr(np.random.default_rng(v).standard_normal((16, 16)))
        reg.register_version("a2b", fit_procrustes(X, (X @ Q).astype(np.float32)), source_space="a",
                             target_space="b", method="procrustes", params={}, alias="prod")
    reg.close()
    R, _ = rows(n)
    IndexStore(data / "indexes").create("docs", "minilm", R, kind="flat")


def stats(ops: list[dict], op: str, windows: list[tuple[float, float]], inside: bool) -> str:
    s = [o["s"] for o in ops if o["op"] == op
         and any(a <= o["start"] <= b or a <= o["start"] + o["s"] <= b for a, b in windows) == inside]
    if not s:
        return "-"
    return f"{len(s)}: p50 {1000 * np.median(s):.1f} ms, max {1000 * max(s):.0f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--versions", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-backup-"))
    data = tmp / "var"
    try:
        t0 = time.perf_counter()
        build(data, args.rows, args.versions)
        print(f"built {args.rows} rows + {args.versions} versions in {time.perf_counter() - t0:.1f}s", flush=True)
        log = tmp / "writer.jsonl"
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(data), str(log), str(ROOT)])
        time.sleep(5)
        runs, windows = [], []
        for label, link in (("--link: hard links (same file system)", True), ("--copy (the default)", False)):
            a = time.time()
            out = backup_data_dir(Settings(data_dir=data), tmp / f"b-{int(link)}", link=link)
            windows.append((a, time.time()))
            runs.append((label, out))
            time.sleep(3)
        (tmp / "stop").touch()
        writer.wait(120)
        ops = [json.loads(line) for line in log.read_text().splitlines()]
        head = (f"Backup of a data dir with a {args.rows:,}-row 384-d flat index and {args.versions} map versions, "
                f"a writer adding 16 rows every ~10 ms and a version every 8 adds (`{' '.join(sys.argv[1:])}`)")
        lines = [head, *([data_note()] if data_note() else []), "",
                 "| backup | seconds | files | bytes in backup | bytes copied | SQLite copies |",
                 "|---|---:|---:|---:|---:|---:|"]
        for label, out in runs:
            lines.append(f"| {label} | {out['seconds']:.2f} | {out['files']} | {out['bytes'] / 2**20:,.1f} MiB | "
                         f"{out['copied_bytes'] / 2**20:,.1f} MiB | {1000 * out['sqlite_copy_s']:.1f} ms |")
        lines += ["", "| writer op | during the backups | outside |", "|---|---|---|"]
        for op in ("index", "registry"):
            lines.append(f"| {op} write | {stats(ops, op, windows, True)} | {stats(ops, op, windows, False)} |")
        text = "\n".join(lines)
        print(text)
        if args.out:
            args.out.write_text(text + "\n")
    finally:
        (tmp / "stop").touch()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
