"""Run a command and print its peak memory: ``python benchmarks/peak_memory.py vecbridge transform ...``.

Samples ``/proc/<pid>/status`` every 20 ms and prints one JSON line on stderr: exit code, wall seconds, and
the peaks of VmHWM (what ``/usr/bin/time -v`` calls max RSS), RssAnon (private memory: what the process
really holds) and RssFile (mapped file pages: page cache, reclaimable) in MiB. Linux only.
"""

from __future__ import annotations

import argparse
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
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0].split(":")[0],
                                 usage="%(prog)s COMMAND [ARGS ...]")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, with its arguments")
    command = ap.parse_args(argv).command
    if not command:
        ap.error("give the command to run, e.g. peak_memory.py vecbridge transform ...")
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(command)
    except OSError as e:
        ap.error(f"cannot run {command[0]!r}: {e.strerror}")
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
