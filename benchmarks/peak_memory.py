"""Run a command and print its peak memory: ``python benchmarks/peak_memory.py vecbridge transform ...``.

Samples ``/proc/<pid>/status`` every 20 ms and prints one JSON line on stderr: exit code, wall seconds, and
the peaks of VmHWM (what ``/usr/bin/time -v`` calls max RSS), RssAnon (private memory: what the process
really holds) and RssFile (mapped file pages: page cache, reclaimable) in MiB. Linux only.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time


def _status(pid: int) -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key in ("VmHWM", "RssAnon", "RssFile"):
                    out[key] = int(value.split()[0]) // 1024
    except OSError:  # the process has just ended
        pass
    return out


def main(argv: list[str]) -> int:
    t0 = time.monotonic()
    proc = subprocess.Popen(argv)
    peak: dict[str, int] = {}
    while proc.poll() is None:
        for key, value in _status(proc.pid).items():
            peak[key] = max(peak.get(key, 0), value)
        time.sleep(0.02)
    print(json.dumps({"rc": proc.returncode, "wall_s": round(time.monotonic() - t0, 1),
                      **{f"{k}_MiB": v for k, v in peak.items()}}), file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
