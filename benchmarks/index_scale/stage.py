"""Run one stage of the index-scale benchmark in this process; prints JSON (seconds, RssAnon MiB now and peak by a
2 ms sampler) per step. Usage: stage.py DATA_DIR STAGE NAME [ARGS]"""
import argparse
import json
import threading
import time
from pathlib import Path

import numpy as np

ap = argparse.ArgumentParser(description=__doc__.split(";")[0])
ap.add_argument("data", type=Path, help="the data dir (its indexes/ folder)")
ap.add_argument("stage", choices=("get", "load", "deltas", "search"),
                help="get: open NAME; load: load_all; deltas NAME PER N: N logged adds of PER rows; "
                     "search NAME ROWS [JSON]: search the first ROWS WordNet rows (JSON: search options)")
ap.add_argument("name", help="the index name")
ap.add_argument("args", nargs="*", help="the stage's arguments (deltas: PER N; search: ROWS [JSON])")
opts = ap.parse_args()
arity = {"get": (0, 0), "load": (0, 0), "deltas": (2, 2), "search": (1, 2)}[opts.stage]
if not arity[0] <= len(opts.args) <= arity[1]:
    ap.error(f"{opts.stage} takes {'-'.join(map(str, sorted(set(arity))))} arguments after NAME, "
             f"got {len(opts.args)}")

from service.indexes import IndexStore  # after the usage check: --help needs no service


def rss():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("RssAnon"):
                return int(line.split()[1]) // 1024
peak = [0]
def sampler():
    while True:
        peak[0] = max(peak[0], rss()); time.sleep(0.002)
threading.Thread(target=sampler, daemon=True).start()
out = []
def step(what, fn):
    peak[0] = rss(); t = time.perf_counter(); r = fn(); dt = time.perf_counter() - t
    time.sleep(0.01)
    out.append({"step": what, "s": round(dt, 3), "rss_after": rss(), "peak": max(peak[0], rss())}); return r

data, stage, name = opts.data, opts.stage, opts.name
store = IndexStore(data / "indexes")
if stage == "get":
    idx = step("get", lambda: store.get(name)); out.append({"count": idx.count, "deltas": idx.logged_deltas})
elif stage == "load":
    step("load_all", store.load_all)
    idx = store.get(name); out.append({"count": idx.count, "deltas": idx.logged_deltas, "gen": idx.generation})
elif stage == "deltas":  # 64 logged adds of ADD rows each (HTTP-sized adds), then one more small add
    idx = step("load", lambda: store.get(name))
    per, nd = (int(a) for a in opts.args)
    base = np.load("/work/shared/data/wordnet/minilm.npy").astype(np.float32)
    rng = np.random.default_rng(1)
    for i in range(nd):
        X = base[rng.integers(0, base.shape[0], per)] + rng.standard_normal((per, 384), dtype=np.float32) * 0.02
        step(f"add{i}", lambda X=X: idx.add(X))
    out.append({"count": idx.count, "deltas": idx.logged_deltas, "gen": idx.generation})
elif stage == "search":
    idx = step("load", lambda: store.get(name))
    Q = np.load("/work/shared/data/wordnet/minilm.npy")[:int(opts.args[0])].astype(np.float32)
    kw = json.loads(opts.args[1]) if len(opts.args) > 1 else {}
    step("search", lambda: idx.search(Q, 10, **kw))
    step("search_again", lambda: idx.search(Q, 10, **kw))
    out.append({"hub_cache": len(idx._hubs)})
print(json.dumps(out))
