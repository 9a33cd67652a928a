"""Where one batch-1 request's time goes (issue 11, "per-request floor").

    python benchmarks/profile_floor.py                # wall clock over TCP + in-process ASGI profile
    python benchmarks/profile_floor.py --tcp-only     # only the wall-clock table
    python benchmarks/profile_floor.py --profile transform_octet --top 40
    python benchmarks/profile_floor.py --batch 1024 --profile transform_octet   # a large binary transform

Two views of the same requests (transform JSON / octet-stream, search JSON with ``vectors_b64``,
``GET /healthz``, and the bare ASGI app of ``bare_asgi.py``):

1. wall clock over real TCP: a ``vecbridge serve`` process and the bare app under the same uvicorn
   (uvloop + httptools when installed), each timed with a keep-alive ``httpx.Client`` and with a raw
   ``http.client.HTTPConnection`` (no client-side framework cost), p50 of interleaved rounds;
2. in process: the app's ASGI callable driven directly on one event loop (no sockets, no HTTP
   parsing) under ``cProfile``, plus a stage breakdown timed with ``perf_counter`` around the parts.

Data: a Procrustes map minilm -> e5 (fitted on the first 4,000 rows) and a flat e5 index of the 8,192 held-out
WordNet rows (as bench_service.py). Without the shared set: a sample of ``--sample-rows`` definitions embedded here
(``wordnet_sample.py``), the rows scaled (``wordnet_sample.split``: the fit within the first 40 %, the index the last
20 %); the output says so.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import cProfile
import http.client
import io
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))
from _servers import free_port, stop  # noqa: E402
import wordnet_sample
from bench_service import HDR, KEY, start_server  # noqa: E402

OCTET = {**HDR, "content-type": "application/octet-stream"}


def load_data(rows: int = wordnet_sample.DEFAULT_ROWS) -> tuple[np.ndarray, np.ndarray, int, slice, str]:
    """``(minilm, e5, fit rows, held-out rows, note)`` of the shared WordNet set (or a sample of ``rows`` built
    here): the fit takes the first 4,000 rows (at most the unpaired source rows of ``wordnet_sample.split``), the
    index the held-out ones; ``note``: the sample line, or ``""``."""
    folder = wordnet_sample.wordnet_dir(("minilm", "e5"), rows=rows)
    A, B = wordnet_sample.load(folder, "minilm"), wordnet_sample.load(folder, "e5")
    source, _, held = wordnet_sample.split(len(A))
    return A, B, min(4000, source.stop), held, wordnet_sample.note(folder)


def seed(data: Path, rows: int = wordnet_sample.DEFAULT_ROWS):
    """Registry with spaces minilm/e5 and map ``bench``; returns (map, A_held, B_held)."""
    from align import fit_procrustes
    from service.registry import open_registry

    A, B, fit, HELD, note = load_data(rows)
    if note:
        print(f"# {note}")
    m = fit_procrustes(A[:fit], B[:fit])
    data.mkdir(parents=True, exist_ok=True)
    reg = open_registry(f"sqlite:///{(data / 'registry.sqlite').resolve()}", (data / "artifacts").resolve())
    reg.register_space("minilm", 384)
    reg.register_space("e5", 384)
    reg.register_version("bench", m, source_space="minilm", target_space="e5", method="procrustes", params={},
                         alias="prod")
    reg.close()
    return m, A[HELD], B[HELD]


def requests_for(x: np.ndarray) -> dict[str, tuple[str, str, bytes, dict]]:
    """name -> (method, path, body, headers) of each batch-1 request."""
    raw = x.tobytes()
    js = {**HDR, "content-type": "application/json"}
    return {
        "transform_json": ("POST", "/v1/maps/bench/transform", json.dumps({"vectors": x.tolist()}).encode(), js),
        "transform_octet": ("POST", "/v1/maps/bench/transform", raw, OCTET),
        "search_b64": ("POST", "/v1/indexes/bench-e5/search", json.dumps({
            "vectors_b64": base64.b64encode(raw).decode(), "dim": 384, "space": "minilm", "k": 10,
            "include_payloads": False}).encode(), js),
        "search_json": ("POST", "/v1/indexes/bench-e5/search", json.dumps({
            "vectors": x.tolist(), "space": "minilm", "k": 10, "include_payloads": False}).encode(), js),
        "healthz": ("GET", "/healthz", b"", {}),
    }


def create_index(port: int, B_held: np.ndarray) -> None:
    import httpx

    r = httpx.post(f"http://127.0.0.1:{port}/v1/indexes", headers=HDR, timeout=120, json={
        "name": "bench-e5", "space": "e5", "kind": "flat",
        "vectors_b64": base64.b64encode(np.ascontiguousarray(B_held).tobytes()).decode(), "dim": 384})
    assert r.status_code == 201, r.text


# --- 1. wall clock over TCP -------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads) so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tcp_table(port: int, bare_port: int, reqs: dict, *, rounds: int, per: int, pids: dict | None = None) -> dict:
    """p50 ms per (client, request), interleaved: ``rounds`` rounds of ``per`` calls of each cell; with
    ``pids`` ({port: pid}) also the server's CPU ms per request (robust to a busy machine: waiting is not CPU)."""
    import httpx

    cells = {"bare": ("POST", "/", reqs["transform_octet"][2], OCTET)} | reqs
    hx = {p: httpx.Client(base_url=f"http://127.0.0.1:{p}", timeout=60) for p in (port, bare_port)}
    hc = {p: http.client.HTTPConnection("127.0.0.1", p, timeout=60) for p in (port, bare_port)}

    def call_httpx(p, method, path, body, headers):
        r = hx[p].request(method, path, content=body or None, headers=headers)
        assert r.status_code == 200, (path, r.status_code, r.text[:200])

    def call_hc(p, method, path, body, headers):
        c = hc[p]
        c.request(method, path, body=body or None, headers=headers)
        r = c.getresponse()
        data = r.read()
        assert r.status == 200, (path, r.status, data[:200])

    times: dict = {}
    cpu: dict = {}
    for _ in range(rounds):
        for name, (method, path, body, headers) in cells.items():
            p = bare_port if name == "bare" else port
            for cname, fn in (("httpx", call_httpx), ("http.client", call_hc)):
                fn(p, method, path, body, headers)  # warm
                ts = times.setdefault((cname, name), [])
                c0 = cpu_seconds(pids[p]) if pids else 0.0
                for _ in range(per):
                    t0 = time.perf_counter()
                    fn(p, method, path, body, headers)
                    ts.append(time.perf_counter() - t0)
                if pids:
                    cpu.setdefault(name, []).append((cpu_seconds(pids[p]) - c0) / per)
    for c in hx.values():
        c.close()
    out = {}
    print("\n## Wall clock over TCP (p50 ms; interleaved rounds)")
    print(f"{'request':>18}  {'httpx':>8}  {'x bare':>7}  {'http.client':>11}  {'x bare':>7}  {'server CPU ms':>13}")
    for name in cells:
        row = {}
        for cname in ("httpx", "http.client"):
            row[cname] = float(np.median(times[(cname, name)]) * 1000)
        row["server_cpu"] = float(np.mean(cpu[name]) * 1000) if pids else float("nan")
        out[name] = row
    for name, row in out.items():
        print(f"{name:>18}  {row['httpx']:8.3f}  {row['httpx'] / out['bare']['httpx']:6.2f}x  "
              f"{row['http.client']:11.3f}  {row['http.client'] / out['bare']['http.client']:6.2f}x  "
              f"{row['server_cpu']:13.3f}")
    return out


# --- 2. in process -----------------------------------------------------------------------------------
class Driver:
    """Call an ASGI app directly: one request = a scope, one body message, collected response messages."""

    def __init__(self, app, loop) -> None:
        self.app, self.loop = app, loop

    async def call(self, method, path, body, headers):
        path, _, qs = path.partition("?")
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": qs.encode(),
                 "root_path": "", "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]
                 + [(b"content-length", str(len(body)).encode()), (b"host", b"127.0.0.1")],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "state": {}}
        sent = False
        out = []

        async def receive():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.sleep(3600)

        async def send(msg):
            out.append(msg)

        await self.app(scope, receive, send)
        assert out[0]["status"] == 200, (path, out)
        return out


def inprocess(data: Path, reqs: dict, *, profile: list[str], top: int, n: int) -> dict:
    import uvloop

    from service.api import create_app
    from service.config import Settings

    s = Settings(data_dir=data, api_keys={KEY: ["read", "write"]}, demo_on_empty=False, log_level="WARNING")
    app = create_app(s)
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    drv = Driver(app, loop)

    async def run():
        async with app.router.lifespan_context(app):
            res = {}
            for name, (method, path, body, headers) in reqs.items():
                for _ in range(50):
                    await drv.call(method, path, body, headers)
                ts = []
                for _ in range(n):
                    t0 = time.perf_counter()
                    await drv.call(method, path, body, headers)
                    ts.append(time.perf_counter() - t0)
                res[name] = float(np.median(ts) * 1000)
            bare = __import__("bare_asgi").app
            bd = Driver(bare, loop)
            ts = []
            for _ in range(n):
                t0 = time.perf_counter()
                await bd.call("POST", "/", b"x" * 1536, {})
                ts.append(time.perf_counter() - t0)
            res["bare"] = float(np.median(ts) * 1000)
            print("\n## In process (ASGI callable on one uvloop, no sockets; p50 ms)")
            for k, v in res.items():
                print(f"{k:>18}  {v:.3f}")
            for name in profile:
                method, path, body, headers = reqs[name]
                pr = cProfile.Profile()
                pr.enable()
                for _ in range(n):
                    await drv.call(method, path, body, headers)
                pr.disable()
                buf = io.StringIO()
                st = pstats.Stats(pr, stream=buf)
                st.sort_stats("cumulative").print_stats(top)
                st.sort_stats("tottime").print_stats(top)
                print(f"\n## cProfile of {n} x {name} (cumulative, then own time)\n{buf.getvalue()}")
            return res

    return loop.run_until_complete(run())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tcp-only", action="store_true")
    ap.add_argument("--no-tcp", action="store_true")
    ap.add_argument("--profile", nargs="*", default=["transform_json", "transform_octet", "search_b64"])
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("-n", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--per", type=int, default=100)
    ap.add_argument("--batch", type=int, default=1, help="rows per request (1: the batch-1 floor)")
    ap.add_argument("--sample-rows", type=int, default=wordnet_sample.DEFAULT_ROWS,
                    help="without the shared WordNet set: definitions in the sample embedded here")
    args = ap.parse_args(argv)
    print(f"# load average {os.getloadavg()}, {os.cpu_count()} cpus, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'default')}")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        m, A_held, B_held = seed(data, args.sample_rows)
        x = np.ascontiguousarray(A_held[:args.batch])
        if len(x) < args.batch:
            print(f"# --batch {args.batch}: the data holds {len(x)} held-out rows; batches of {len(x)}")
        reqs = requests_for(x)
        if args.batch > 1:  # only the binary transform; the work itself beside it: the map's apply, in process
            reqs = {"transform_octet": reqs["transform_octet"]}
            ts = []
            for _ in range(max(args.n, 20)):
                t0 = time.perf_counter()
                m.apply(x)
                ts.append(time.perf_counter() - t0)
            print(f"# map.apply of {len(x)} rows in process: p50 {np.median(ts) * 1000:.3f} ms")
        if not args.no_tcp:
            port, bare_port = free_port(), free_port()
            proc = start_server(data, port)
            bare = start_server(data, bare_port, bare=True)
            try:
                create_index(port, B_held)
                tcp_table(port, bare_port, reqs, rounds=args.rounds, per=args.per,
                          pids={port: proc.pid, bare_port: bare.pid})
            finally:
                stop(proc, timeout=30)
                stop(bare)
        else:
            import httpx  # noqa: F401

            port = free_port()
            proc = start_server(data, port)
            try:
                create_index(port, B_held)
            finally:
                stop(proc, timeout=30)
        if not args.tcp_only:
            inprocess(data, reqs, profile=args.profile, top=args.top, n=args.n)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
