"""Trace RssAnon (MiB) through `vecbridge index create` stages, in process (a sampler thread records the max per
stage)."""
import sys
import threading
import time

from service.indexes import persist
from service.indexes import space as sp


def rss():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("RssAnon"):
                return int(line.split()[1]) // 1024
stage = ["import"]; peaks = {}
def sampler():
    while True:
        s = stage[0]; peaks[s] = max(peaks.get(s, 0), rss()); time.sleep(0.002)
threading.Thread(target=sampler, daemon=True).start()
orig_add = sp.SpaceIndex._add
count = [0]
def _add(self, X, *a, **k):
    stage[0] = f"add{count[0]:02d}"; count[0] += 1
    return orig_add(self, X, *a, **k)
sp.SpaceIndex._add = _add
orig_wg = persist.write_generation
def wg(*a, **k):
    stage[0] = "save"; r = orig_wg(*a, **k); stage[0] = "after-save"; return r
sp.write_generation = wg
from service.cli import main

try:
    main(sys.argv[1:])
except SystemExit:
    pass
time.sleep(0.05)
print({k: v for k, v in peaks.items()}, file=sys.stderr)
