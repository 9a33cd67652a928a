"""HTTP create / add near max_body_bytes (64 MiB) against a real uvicorn server: the server's RssAnon before, peak
(5 ms sampler) and after each request, and the wall time. DATA_DIR holds space m (384-d) and index f1m (1M flat)."""
import base64
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from _servers import env_for, free_port, stop

data = Path(sys.argv[1]).resolve()
port = free_port()
cmd = [sys.executable, "-m", "uvicorn", "--factory", "service.api:create_app", "--host", "127.0.0.1", "--port",
       str(port), "--no-access-log"]
env = env_for(data, port)
env["PYTHONPATH"] = os.environ["PYTHONPATH"]
log = open("server.log", "wb")  # noqa: SIM115 - the server's output for as long as it runs
proc = subprocess.Popen(cmd, cwd=os.environ["PYTHONPATH"], env=env, stdout=log, stderr=subprocess.STDOUT)
W = {"Authorization": "Bearer wkey-456"}
url = f"http://127.0.0.1:{port}"
for _ in range(600):
    try:
        if httpx.get(url + "/healthz").status_code == 200: break
    except httpx.TransportError:
        pass
    time.sleep(0.2)
def rss():
    with open(f"/proc/{proc.pid}/status") as fh:
        for line in fh:
            if line.startswith("RssAnon"):
                return int(line.split()[1]) // 1024
peak = [0]; run = [True]
def sampler():
    while run[0]:
        peak[0] = max(peak[0], rss()); time.sleep(0.005)
threading.Thread(target=sampler, daemon=True).start()
rng = np.random.default_rng(3)
base = np.load("/work/shared/data/wordnet/minilm.npy").astype(np.float32)
def rows(n):
    return base[rng.integers(0, base.shape[0], n)] + rng.standard_normal((n, 384), dtype=np.float32) * 0.02
res = []
def req(what, path, body):
    blob = json.dumps(body).encode()
    time.sleep(0.3); before = rss(); peak[0] = before; t = time.perf_counter()
    r = httpx.post(url + path, content=blob, headers={**W, "Content-Type": "application/json"}, timeout=600)
    dt = time.perf_counter() - t; time.sleep(0.3)
    res.append({"what": what, "status": r.status_code, "body_MiB": round(len(blob) / 2**20, 1), "s": round(dt, 2),
                "rss_before": before, "peak": peak[0], "after": rss()})
    print(res[-1], flush=True)
X = rows(31000)
b64 = {"vectors_b64": base64.b64encode(X.tobytes()).decode(), "dim": 384}
req("create flat b64 31k", "/v1/indexes", {"name": "h1", "space": "m", "kind": "flat", **b64})
req("add b64 31k", "/v1/indexes/h1/vectors", b64)
Xj = np.round(rows(7500), 6)
req("add json 7.5k", "/v1/indexes/h1/vectors", {"vectors": Xj.tolist()})
req("create ivf b64 31k", "/v1/indexes", {"name": "h2", "space": "m", "kind": "ivf", **b64})
req("add 10 rows to f1m (first write after load)", "/v1/indexes/f1m/vectors", {"vectors": rows(10).tolist()})
req("add 10 rows to f1m again", "/v1/indexes/f1m/vectors", {"vectors": rows(10).tolist()})
req("add b64 31k to f1m", "/v1/indexes/f1m/vectors", b64)
run[0] = False
stop(proc)
log.close()
with open(sys.argv[2], "w") as fh:
    json.dump(res, fh, indent=1)
