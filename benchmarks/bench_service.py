"""Service benchmark: in-process apply vs GEMM, HTTP transform JSON vs binary, HTTP search vs raw FAISS,
and cross-model retrieval quality on the shared WordNet set — side by side, in one run.

    python benchmarks/bench_service.py                 # everything (fits the unsupervised map once, cached)
    python benchmarks/bench_service.py --quick         # speed sections only, Procrustes map, no quality
    python benchmarks/bench_service.py --map FILE.npz  # use a saved LinearMap for the quality section
    python benchmarks/bench_service.py --quick --floor-only --baseline-tree ../old-checkout
        # the per-request floor only, this tree and another checkout served side by side (before/after)

Data: ``../shared/data/wordnet/{minilm,e5,texts}`` (ALGORITHMS.md §4 split). The unsupervised map
minilm -> e5 is fitted with ``align.MiniVec2Vec`` (defaults, random_state=0) on the unpaired
training rows (minilm [0, 16384), e5 [16384, 32768)) and cached in the bench cache
(``$VECBRIDGE_BENCH_CACHE``, default ``~/.cache/vecbridge-bench``) as ``service_minivec2vec_minilm_e5.npz``.
The index holds the held-out e5 rows [32768, 40960) (8,192); queries are the same texts embedded by minilm, mapped
through the service (``output="raw"``). Without the shared set: a sample of 4,096 definitions embedded here
(``wordnet_sample.py``), the split scaled to its rows (0.4 / 0.4 / 0.2), its unsupervised map cached in the
sample's folder, and the speed sections' batches (up to 8,192) made of its held-out rows repeated; said so.

Goals (issue 11): HTTP batch-1 transform and search <= 2x the bare-ASGI floor (``bare_asgi.py`` on
the same uvicorn stack); binary transform at 1024 >= 0.6x in-process; search at batch 64 <= 1.15x
raw FAISS; in-process apply >= 0.9x GEMM at 1024 and 8192; demo usable <= 10 s after launch. The batch-1 search
cells run on the flat index (a scan of 8,192 rows: ~0.9 of the floor's time on its own) and on the same rows in
HNSW (the service's defaults), whose search does almost no work: the route's own cost without the scan.
Also: throughput of ``vecbridge serve --workers 1`` vs ``2``. Results go to a dated file
``benchmarks/results/bench_service_<date>[_quick].json``.
Raw FAISS here = in-process ``map.apply`` + ``IndexFlatIP.search`` on the same vectors (the
work the service does, without HTTP); the server is a real uvicorn process on localhost. The in-process
cells a server's are compared with (raw FAISS, the batch-1 work, octet 1,024's in-process apply) run with the
native thread pools at the server's count (``blas_threads``, default 1: ``service/threads.py``), whatever
``OMP_NUM_THREADS`` this process has: left at two threads on a busy 2-core machine, the raw batch-64 search
took 66 ms against the server's 4 ms.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from _servers import free_port, stop  # noqa: E402  (tests/_servers.py: the tests' server helpers)

sys.path.insert(0, str(ROOT / "benchmarks"))
import wordnet_sample

RESULTS = ROOT / "benchmarks" / "results"
MAP_CACHE_NAME = "service_minivec2vec_minilm_e5.npz"
KEY = "bench-key"
HDR = {"Authorization": f"Bearer {KEY}"}


# --- helpers ------------------------------------------------------------------------------------
def timeit(fn, *, min_time: float = 1.0, min_reps: int = 5, max_reps: int = 2000) -> np.ndarray:
    """Per-call seconds of ``fn()`` over at least ``min_time`` seconds (after one warm-up)."""
    fn()
    out = []
    t_end = time.perf_counter() + min_time
    while (len(out) < min_reps or time.perf_counter() < t_end) and len(out) < max_reps:
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return np.asarray(out)


def pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q) * 1000)


def table(title: str, header: list[str], rows: list[list]) -> str:
    widths = [max([len(str(h)), *(len(f"{r[i]}") for r in rows)]) for i, h in enumerate(header)]
    line = "  ".join(str(h).rjust(w) for h, w in zip(header, widths))
    out = [f"\n## {title}", line, "-" * len(line)]
    out += ["  ".join(f"{c}".rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out)



def load_data(folder: Path):
    return wordnet_sample.load(folder, "minilm"), wordnet_sample.load(folder, "e5")


def map_cache_path(folder: Path) -> Path:
    """Where the unsupervised map of ``folder``'s data is cached: the bench cache (``$VECBRIDGE_BENCH_CACHE``,
    default ``~/.cache/vecbridge-bench``) for the shared set, a sample's own folder for a sample."""
    return (folder if wordnet_sample.is_sample(folder) else wordnet_sample.DEFAULT_CACHE) / MAP_CACHE_NAME


def get_map(A, B, args, map_cache: Path):
    """The map of the quality section. ``map_cache``: where the unsupervised map is cached (a sample's own folder)."""
    from align import LinearMap, fit_procrustes

    train_s, train_t, _ = wordnet_sample.split(A.shape[0])
    if args.quick:
        m = fit_procrustes(A[train_s][:4000], B[train_s][:4000])
        return m, f"procrustes on {min(4000, train_s.stop):,} pairs (--quick: speed sections only)"
    if args.map:
        return LinearMap.load(args.map), f"loaded from {args.map}"
    if map_cache.exists() and not args.refit:
        return LinearMap.load(map_cache), f"MiniVec2Vec (cached {map_cache.name})"
    try:
        from align import MiniVec2Vec
    except ImportError:
        from align.minivec2vec import MiniVec2Vec
    t0 = time.perf_counter()
    m = MiniVec2Vec(random_state=0).fit(A[train_s], B[train_t]).map_
    secs = time.perf_counter() - t0
    m.metadata.setdefault("bench", {})["fit_seconds"] = secs
    map_cache.parent.mkdir(parents=True, exist_ok=True)
    m.save(map_cache)
    return m, f"MiniVec2Vec defaults, unsupervised on the training split, fitted in {secs:.0f} s"


def start_server(data_dir: Path, port: int, *, workers: int = 1, demo: bool = False, bare: bool = False,
                 wait_ready: bool = True, root: Path = ROOT, extra_env: dict | None = None) -> subprocess.Popen:
    """A real server on localhost: ``vecbridge serve`` (``--workers``), or the bare ASGI floor app.

    ``root``: the source tree the server runs from (another checkout: the before of a before/after);
    ``extra_env``: more settings (e.g. ``VECBRIDGE_VECTORDB_URL``)."""
    import httpx

    env = {k: v for k, v in os.environ.items() if not k.startswith("VECBRIDGE_")}
    env.update({"VECBRIDGE_DATA_DIR": str(data_dir), "VECBRIDGE_API_KEYS": json.dumps({KEY: ["read", "write"]}),
                "VECBRIDGE_DEMO_ON_EMPTY": "true" if demo else "false", "VECBRIDGE_LOG_LEVEL": "WARNING",
                "PYTHONPATH": os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])]),
                **(extra_env or {})})  # after the tree: packages a machine keeps elsewhere (the GPU machine's wheels)
    if bare:
        from service.config import Settings
        from service.memory import heap_env

        # the C heap kept as `vecbridge serve` keeps it (its default malloc_keep_mb): otherwise every 1.5 MB
        # echo would fault its buffers in anew and the floor would sit above the server it bounds
        env.update(heap_env(Settings.model_fields["malloc_keep_mb"].default))
        cmd = [sys.executable, "-m", "uvicorn", "--app-dir", str(ROOT / "benchmarks"), "bare_asgi:app", "--host",
               "127.0.0.1", "--port", str(port), "--no-access-log", "--log-level", "warning"]
    else:
        cmd = [sys.executable, "-c", "import sys; from service.cli import main; sys.exit(main())", "serve",
               "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)]
    proc = subprocess.Popen(cmd, cwd=root, env=env)
    if not wait_ready:
        return proc
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                time.sleep(0.5 if workers > 1 else 0)  # let every worker come up
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server did not start")


@contextlib.contextmanager
def server_threads():
    """The BLAS and FAISS's OpenMP at the thread count a server from :func:`start_server` runs them with (the
    default ``blas_threads``: that function passes no ``VECBRIDGE_*`` setting through), so in-process baselines
    and the server's cells are timed on equal footing. Yields the count (0: the libraries' defaults)."""
    from service.config import Settings
    from service.threads import limit_native_threads, release_native_threads

    n = Settings.model_fields["blas_threads"].default
    limit_native_threads(n)
    try:
        yield n
    finally:
        release_native_threads(n)


# --- sections -----------------------------------------------------------------------------------
def bench_inprocess(m, X, report):
    """Batch 1 (a query: GEMV vs the one-row path of ``apply``), 1,024 and 8,192 rows."""
    rows = []
    for n in (1, 1024, 8192):
        Xb = np.ascontiguousarray(X[:n])
        W = m.W
        fns = {"gemm": lambda: Xb @ W, **{o: (lambda o=o: m.apply(Xb, output=o)) for o in ("linear", "frame", "raw")}}
        # interleaved, best of: on a shared machine the minimum of alternating runs is the fairest ratio
        best = {k: np.inf for k in fns}
        t_end = time.perf_counter() + 4.0
        reps = 0
        while reps < 10 or (time.perf_counter() < t_end and reps < (4000 if n == 1 else 400)):
            for k, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                best[k] = min(best[k], time.perf_counter() - t0)
            reps += 1
        for k in fns:
            rows.append([n, k, f"{n / best[k]:,.0f}", f"{best['gemm'] / best[k]:.2f}"])
        report[f"inprocess_{n}"] = {k: n / v for k, v in best.items()}
    print(table("In-process LinearMap.apply vs numpy GEMM (vectors/s; interleaved best of)",
                ["batch", "path", "vectors/s", "vs GEMM"], rows))


def p50_ms(fn, min_time=2.0) -> float:
    return pct(timeit(fn, min_time=min_time, max_reps=5000), 50)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid``, all threads (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_floor(bare, servers: dict, A_held, report, *, rounds: int = 8, per: int = 60):
    """Batch-1 latency of each route as a multiple of the bare ASGI app on the same server stack.

    ``servers``: label -> (httpx client, pid), e.g. this tree and a baseline checkout. Cells are
    interleaved (``rounds`` rounds of ``per`` calls each), so machine load hits every cell alike; p50
    over all calls, and the server's CPU time per request (waiting on a busy machine is not CPU).
    """
    x = np.ascontiguousarray(A_held[:1])
    raw = x.tobytes()
    octet = {**HDR, "content-type": "application/octet-stream"}
    js = {**HDR, "content-type": "application/json"}
    b64 = base64.b64encode(raw).decode()
    # JSON bodies encoded once, like the octet body: the client's own json.dumps of 384 floats per call is
    # not a cost of the server
    t_json = json.dumps({"vectors": x.tolist()}).encode()
    s_b64 = json.dumps({"vectors_b64": b64, "dim": 384, "space": "minilm", "k": 10, "include_payloads": False}).encode()
    s_json = json.dumps({"vectors": x.tolist(), "space": "minilm", "k": 10, "include_payloads": False}).encode()
    routes = {
        "GET /healthz": lambda c: c.get("/healthz"),
        "transform octet-stream": lambda c: c.post("/v1/maps/bench/transform", content=raw, headers=octet),
        "transform JSON": lambda c: c.post("/v1/maps/bench/transform", content=t_json, headers=js),
        "search (vectors_b64, k=10)": lambda c: c.post("/v1/indexes/bench-e5/search", content=s_b64, headers=js),
        "search (JSON vectors, k=10)": lambda c: c.post("/v1/indexes/bench-e5/search", content=s_json, headers=js),
        "search HNSW (vectors_b64, k=10)": lambda c: c.post("/v1/indexes/bench-e5-hnsw/search", content=s_b64,
                                                            headers=js),
    }
    cells = {("bare ASGI (floor)", ""): (bare[0], bare[1], lambda c: c.post("/", content=raw, headers=octet))}
    for label, (client, pid) in servers.items():
        for name, fn in routes.items():
            cells[(name, label)] = (client, pid, fn)
    times = {k: [] for k in cells}
    cpu = {k: [] for k in cells}
    for _ in range(rounds):
        for key, (client, pid, fn) in cells.items():
            r = fn(client)
            assert r.status_code == 200, (key, r.text[:200])
            c0 = _cpu_seconds(pid)
            for _ in range(per):
                t0 = time.perf_counter()
                fn(client)
                times[key].append(time.perf_counter() - t0)
            cpu[key].append((_cpu_seconds(pid) - c0) / per)
    res = {k: (float(np.median(v) * 1000), float(np.mean(cpu[k]) * 1000)) for k, v in times.items()}
    floor = res[("bare ASGI (floor)", "")][0]
    rows = [[name, label, f"{p50:.3f}", f"{p50 / floor:.2f}x", f"{c:.3f}"] for (name, label), (p50, c) in res.items()]
    report["floor_batch1"] = {f"{name} [{label}]" if label else name: {"p50_ms": p50, "vs_floor": p50 / floor,
                                                                       "server_cpu_ms": c}
                              for (name, label), (p50, c) in res.items()}
    report["floor_batch1"]["_meta"] = {"rounds": rounds, "per": per, "load_avg": os.getloadavg()}
    print(table(f"Batch-1 latency vs the bare-ASGI floor (p50 of {rounds} interleaved rounds x {per} calls, keep-alive "
                f"httpx client; server CPU per request from /proc; load avg {os.getloadavg()[0]:.1f})",
                ["route", "server", "p50 ms", "vs floor", "server CPU ms"], rows))


def bench_floor_work(m_transform, m_search, A_held, B_held, report):
    """The work inside the batch-1 cells, in process (p50): what no server can save. Search's is most of it."""
    import faiss

    from align.frames import unit_rows

    index = faiss.IndexFlatIP(B_held.shape[1])
    index.add(unit_rows(B_held))
    hnsw = faiss.IndexHNSWFlat(B_held.shape[1], 32, faiss.METRIC_INNER_PRODUCT)  # the service's defaults
    hnsw.hnsw.efConstruction, hnsw.hnsw.efSearch = 80, 64
    hnsw.add(unit_rows(B_held))
    x = np.ascontiguousarray(A_held[:1])
    with server_threads():
        work = {"transform: map.apply, batch 1": p50_ms(lambda: m_transform.apply(x, output="raw"), 1.0),
                "search: map.apply + FAISS flat k=10, batch 1": p50_ms(
                    lambda: index.search(m_search.apply(x, output="raw"), 10), 1.0),
                "search: map.apply + FAISS HNSW k=10, batch 1": p50_ms(
                    lambda: hnsw.search(m_search.apply(x, output="raw"), 10), 1.0)}
    fl = report["floor_batch1"]
    floor = fl["bare ASGI (floor)"]["p50_ms"]
    cell = {"transform: map.apply, batch 1": "transform octet-stream [new]",
            "search: map.apply + FAISS flat k=10, batch 1": "search (vectors_b64, k=10) [new]",
            "search: map.apply + FAISS HNSW k=10, batch 1": "search HNSW (vectors_b64, k=10) [new]"}
    rows = [[k, f"{v:.3f}", f"{(fl[cell[k]]['p50_ms'] - v) / floor:.2f}x"] for k, v in work.items()]
    report["floor_work"] = {k: {"p50_ms": v, "route_minus_work_vs_floor": (fl[cell[k]]["p50_ms"] - v) / floor}
                            for k, v in work.items()}
    print(table(f"Work inside the batch-1 cells (in process, p50; {B_held.shape[0]:,}-row flat index)",
                ["work", "p50 ms", "(route - work) / floor"], rows))


def bench_octet_1024(servers: dict, m, X, report, *, rounds: int = 6, per: int = 10, bare=None):
    """Binary transform of 1,024 rows per server vs in-process ``apply``, interleaved best-of.

    Two clients per server: ``httpx`` (the headline, what most Python callers use) and the standard
    library's ``http.client`` (the least client-side cost: what the server itself allows); plus the
    server's CPU per request (user + system, /proc). ``bare`` (client, pid): the bare app's ``/echo``,
    which sends the same bytes back with no work — the floor of each client, and with it the best
    ratio any server could reach with that client: ``in-process / (in-process + echo)``."""
    import http.client

    Xb = np.ascontiguousarray(X[:1024])
    raw = Xb.tobytes()
    octet = {**HDR, "content-type": "application/octet-stream"}
    fns, pids = {"in-process": lambda: m.apply(Xb, output="raw")}, {}
    targets = [(label, client, pid, "/v1/maps/bench/transform") for label, (client, pid) in servers.items()]
    if bare is not None:
        targets.append(("bare echo (floor)", bare[0], bare[1], "/echo"))
    for label, client, pid, path in targets:
        conn = http.client.HTTPConnection("127.0.0.1", client.base_url.port, timeout=120)

        def via_http_client(conn=conn, path=path):
            conn.request("POST", path, body=raw, headers=octet)
            r = conn.getresponse()
            data = r.read()
            assert r.status == 200 and len(data) == len(raw), (r.status, data[:200])
            return np.frombuffer(data, "<f4")

        fns[label] = lambda c=client, path=path: np.frombuffer(c.post(path, content=raw, headers=octet).content, "<f4")
        fns[f"{label} (http.client)"] = via_http_client
        pids[label] = pids[f"{label} (http.client)"] = pid
    best = {k: np.inf for k in fns}
    cpu: dict = {k: [] for k in pids}
    for _ in range(rounds):
        for k, fn in fns.items():
            with server_threads() if k == "in-process" else contextlib.nullcontext():
                fn()
                c0 = _cpu_seconds(pids[k]) if k in pids else 0.0
                for _ in range(per):
                    t0 = time.perf_counter()
                    fn()
                    best[k] = min(best[k], time.perf_counter() - t0)
            if k in pids:
                cpu[k].append((_cpu_seconds(pids[k]) - c0) / per)
    cpu_ms = {k: float(np.mean(v) * 1000) for k, v in cpu.items()}
    rows = [[k, f"{v * 1000:.3f}", f"{1024 / v:,.0f}", f"{best['in-process'] / v:.2f}",
             f"{cpu_ms[k]:.2f}" if k in cpu_ms else ""] for k, v in best.items()]
    report["octet_1024"] = {k: {"best_ms": v * 1000, "vs_inprocess": best["in-process"] / v,
                                "server_cpu_ms": cpu_ms.get(k)} for k, v in best.items()}
    print(table("Binary transform, batch 1,024: HTTP octet-stream vs in-process apply (interleaved, best of)",
                ["path", "ms", "vectors/s", "vs in-process", "server CPU ms"], rows))
    if bare is not None:
        t = best["in-process"]
        bound = {c: t / (t + best[f"bare echo (floor){s}"])
                 for c, s in (("httpx", ""), ("http.client", " (http.client)"))}
        report["octet_1024"]["_best_possible"] = bound
        print("best ratio any server could reach (in-process / (in-process + echo)): "
              + ", ".join(f"{c} {v:.2f}" for c, v in bound.items()))


def _load(port: int, body_fn, seconds: float, clients: int) -> float:
    """Requests/s of ``clients`` threads, each with its own keep-alive client, for ``seconds``."""
    import threading

    import httpx

    counts = [0] * clients
    stop_at = time.perf_counter() + seconds

    def worker(i):
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            while time.perf_counter() < stop_at:
                r = body_fn(c)
                assert r.status_code == 200, r.text
                counts[i] += 1

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def bench_workers(data: Path, A_held, report, clients: int = 8, seconds: float = 6.0):
    """Throughput (requests/s) of 1 vs 2 server processes (``vecbridge serve --workers N``)."""
    x = np.ascontiguousarray(A_held[:1])
    xb = np.ascontiguousarray(A_held[:64])
    octet = {**HDR, "content-type": "application/octet-stream"}
    loads = {
        "transform batch 1 (octet)": lambda c: c.post("/v1/maps/bench/transform", content=x.tobytes(), headers=octet),
        "search batch 1": lambda c: c.post("/v1/indexes/bench-e5/search", headers=HDR, json={
            "vectors_b64": base64.b64encode(x.tobytes()).decode(), "dim": 384, "space": "minilm", "k": 10,
            "include_payloads": False}),
        "search batch 64": lambda c: c.post("/v1/indexes/bench-e5/search", headers=HDR, json={
            "vectors_b64": base64.b64encode(xb.tobytes()).decode(), "dim": 384, "space": "minilm", "k": 10,
            "include_payloads": False}),
    }
    res: dict = {}
    for w in (1, 2):
        port = free_port()
        proc = start_server(data, port, workers=w)
        try:
            for name, fn in loads.items():
                res.setdefault(name, {})[w] = _load(port, fn, seconds, clients)
        finally:
            stop(proc, timeout=30)
    rows = [[name, f"{r[1]:,.0f}", f"{r[2]:,.0f}", f"{r[2] / r[1]:.2f}x"] for name, r in res.items()]
    report["workers"] = {name: {"1": r[1], "2": r[2]} for name, r in res.items()}
    report["workers_clients"] = clients
    print(table(f"Throughput, vecbridge serve --workers 1 vs 2 ({clients} concurrent keep-alive clients, "
                f"{seconds:.0f} s each; {os.cpu_count()} cores)", ["load", "1 worker req/s", "2 workers req/s",
                                                                     "2 / 1"], rows))


def bench_first_minute(report):
    """Seconds from launching ``vecbridge serve`` on an empty data dir to a working demo search."""
    import httpx

    from service.ops.demo import DEMO_INDEX, load_demo_data

    _, Xs, _, _ = load_demo_data()
    body = {"vectors_b64": base64.b64encode(np.ascontiguousarray(Xs[:1]).tobytes()).decode(), "dim": 384,
            "space": "minilm", "k": 5}
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        t0 = time.perf_counter()
        proc = start_server(Path(tmp) / "data", port, demo=True, wait_ready=False)
        t_ready = t_usable = None
        states = []
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as c:
                while time.perf_counter() - t0 < 300 and t_usable is None:
                    try:
                        r = c.get("/readyz")
                        if r.status_code == 200:
                            t_ready = t_ready or time.perf_counter() - t0
                            demo = r.json()["checks"].get("demo")
                            if not states or states[-1][1] != demo:
                                states.append((round(time.perf_counter() - t0, 2), demo))
                            if demo == "ready":
                                s = c.post(f"/v1/indexes/{DEMO_INDEX}/search", json=body, headers=HDR)
                                if s.status_code == 200:
                                    t_usable = time.perf_counter() - t0
                    except httpx.HTTPError:
                        pass
                    time.sleep(0.05)
        finally:
            stop(proc, timeout=30)
    report["first_minute"] = {"ready_s": t_ready, "demo_usable_s": t_usable, "demo_states": states}
    print(table("First minute: vecbridge serve on an empty data dir (demo on)", ["event", "seconds after launch"], [
        ["/readyz 200", f"{t_ready:.2f}" if t_ready else "never"],
        *[[f"readyz checks.demo = {st}", f"{t:.2f}"] for t, st in states],
        ["demo search (minilm vector -> demo-e5) 200", f"{t_usable:.2f}" if t_usable else "never"]]))


def bench_transform(client, m, X, report):
    rows = []
    for n in (1, 64, 1024):
        Xb = np.ascontiguousarray(X[:n])
        inproc = np.min(timeit(lambda: m.apply(Xb, output="raw")))
        body_json = {"vectors": Xb.tolist()}
        body_b64 = {"vectors_b64": base64.b64encode(Xb.tobytes()).decode(), "dim": Xb.shape[1],
                    "encoding_format": "base64"}
        raw = Xb.tobytes()

        def js():
            r = client.post("/v1/maps/bench/transform", json=body_json, headers=HDR)
            np.asarray(r.json()["vectors"], np.float32)

        def b64():
            r = client.post("/v1/maps/bench/transform", json=body_b64, headers=HDR)
            np.frombuffer(base64.b64decode(r.json()["vectors_b64"]), "<f4")

        def octet():
            r = client.post("/v1/maps/bench/transform", content=raw,
                            headers={**HDR, "content-type": "application/octet-stream"})
            np.frombuffer(r.content, "<f4")

        res = {"in-process": inproc}
        for name, fn in (("json", js), ("json+base64", b64), ("octet-stream", octet)):
            res[name] = np.min(timeit(fn, min_time=1.5))
        for k, v in res.items():
            rows.append([n, k, f"{n / v:,.0f}", f"{v * 1000:.3f}", f"{inproc / v:.3f}"])
        report[f"transform_{n}"] = {k: n / v for k, v in res.items()}
    print(table("HTTP transform vs in-process (best of >= 1.5 s per cell)", ["batch", "path", "vectors/s", "ms",
                                                                     "vs in-process"], rows))


def bench_search(client, m, A_held, B_held, report, k=10):
    import faiss

    from align.frames import unit_rows

    index = faiss.IndexFlatIP(B_held.shape[1])
    index.add(unit_rows(B_held))
    rows = []
    rng = np.random.default_rng(0)
    for n in (1, 64):
        starts = rng.integers(0, A_held.shape[0] - n, 200)
        batches = [np.ascontiguousarray(A_held[s : s + n]) for s in starts]
        bodies = [{"vectors_b64": base64.b64encode(b.tobytes()).decode(), "dim": b.shape[1], "space": "minilm",
                   "k": k, "include_payloads": False} for b in batches]
        it = {"i": 0}

        def raw():
            b = batches[it["i"] % len(batches)]
            it["i"] += 1
            index.search(m.apply(b, output="raw"), k)

        def http():
            body = bodies[it["i"] % len(bodies)]
            it["i"] += 1
            r = client.post("/v1/indexes/bench-e5/search", json=body, headers=HDR)
            assert r.status_code == 200, r.text

        with server_threads() as threads:  # the server's thread count, not this process's OMP_NUM_THREADS
            t_raw = timeit(raw, min_time=2.0)
        t_http = timeit(http, min_time=2.0)
        for name, t in (("raw FAISS (map + search)", t_raw), ("HTTP search", t_http)):
            rows.append([n, name, f"{pct(t, 50):.2f}", f"{pct(t, 99):.2f}", f"{n / np.median(t):,.0f}"])
        ratio = float(np.median(t_http) / np.median(t_raw))
        best = float(np.min(t_http) / np.min(t_raw))
        rows.append([n, "HTTP / raw (median; best)", f"{ratio:.2f}x", f"{best:.2f}x", ""])
        report[f"search_{n}"] = {"raw_p50_ms": pct(t_raw, 50), "raw_p99_ms": pct(t_raw, 99),
                                 "http_p50_ms": pct(t_http, 50), "http_p99_ms": pct(t_http, 99), "ratio": ratio,
                                 "ratio_best": best, "raw_native_threads": threads}
    print(table(f"Cross-model search minilm -> e5 index of {B_held.shape[0]:,} (k={k}, flat; raw at the server's "
                f"{threads or 'default'} native thread(s))",
                ["batch", "path", "p50 ms", "p99 ms", "queries/s"], rows))


def quality(client, A_held, B_held, report, label):
    from align.frames import unit_rows

    n = A_held.shape[0]
    import faiss

    native_index = faiss.IndexFlatIP(B_held.shape[1])
    native_index.add(unit_rows(B_held))
    _, I_native = native_index.search(unit_rows(B_held), 10)  # native e5 neighbours of each text
    rows = []
    for csls in (False, True):
        I = np.empty((n, 10), np.int64)
        for s in range(0, n, 1024):
            b = np.ascontiguousarray(A_held[s : s + 1024])
            r = client.post("/v1/indexes/bench-e5/search", headers=HDR, json={
                "vectors_b64": base64.b64encode(b.tobytes()).decode(), "dim": b.shape[1], "space": "minilm",
                "k": 10, "csls": csls, "include_payloads": False})
            I[s : s + len(b)] = [[h["id"] for h in row] for row in r.json()["results"]]
        own = np.arange(n)[:, None]
        r1 = float((I[:, :1] == own).any(1).mean())
        r10 = float((I == own).any(1).mean())
        overlap = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(I.tolist(), I_native.tolist())]))
        name = "mapped + CSLS" if csls else "mapped (cosine)"
        rows.append([name, f"{r1:.4f}", f"{r10:.4f}", f"{overlap:.4f}"])
        report[f"quality_{'csls' if csls else 'cos'}"] = {"recall@1": r1, "recall@10": r10, "overlap@10": overlap}
    rows.append(["native e5 (reference)", "1.0000", "1.0000", "1.0000"])
    print(table(f"Cross-model retrieval quality on WordNet held-out ({n:,} texts; map: {label})",
                ["queries", "recall@1", "recall@10", "overlap@10 vs native"], rows))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--map", type=Path)
    ap.add_argument("--refit", action="store_true")
    ap.add_argument("--no-workers", action="store_true", help="skip the 1 vs 2 workers throughput table")
    ap.add_argument("--floor-only", action="store_true",
                    help="only the per-request floor: batch-1 routes vs the bare app, and octet batch 1024")
    ap.add_argument("--baseline-tree", type=Path,
                    help="another checkout (e.g. the commit before a change) served beside this one, same data, "
                         "cells interleaved: before/after in one run")
    ap.add_argument("--rounds", type=int, default=8, help="interleaved rounds of the floor table")
    ap.add_argument("--out", help="results file name (default bench_service_<date>[_quick].json)")
    args = ap.parse_args(argv)
    try:
        folder = wordnet_sample.wordnet_dir()
    except wordnet_sample.SampleUnavailable as e:
        print(f"no WordNet data ({e}); nothing to benchmark")
        return 0
    import httpx

    from align import fit_procrustes
    from service.registry import open_registry

    A, B = load_data(folder)
    train_s, _, held = wordnet_sample.split(A.shape[0])
    A_held, B_held = A[held], B[held]
    # the speed sections' batches (up to 8,192 rows): a sample's held-out rows, repeated
    A_speed = wordnet_sample.tile(A_held, 8192)
    note = wordnet_sample.note(folder)
    report: dict = {"env": {"python": platform.python_version(), "cpus": os.cpu_count(),
                            "omp_threads": os.environ.get("OMP_NUM_THREADS", "default"),
                            "load_avg": os.getloadavg()[0], "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                            **({"note": note} if note else {})}}
    print(f"# vecbridge service benchmark  ({report['env']})")
    if note:
        print(note)
    if not args.floor_only:
        bench_first_minute(report)
    m_speed = fit_procrustes(A[train_s][:4000], B[train_s][:4000])
    if not args.floor_only:
        bench_inprocess(m_speed, A_speed, report)

    m, label = get_map(A, B, args, map_cache_path(folder))
    report["map"] = label
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        reg = open_registry(f"sqlite:///{(data / 'registry.sqlite').resolve()}", (data / "artifacts").resolve())
        reg.register_space("minilm", 384)
        reg.register_space("e5", 384)
        reg.register_version("bench", m_speed, source_space="minilm", target_space="e5", method="procrustes",
                             params={})
        reg.register_version("minilm2e5", m, source_space="minilm", target_space="e5", method="minivec2vec",
                             params={}, alias="prod")
        reg.close()
        port, bare_port, base_port = free_port(), free_port(), free_port()
        proc = start_server(data, port)
        bare_proc = start_server(data, bare_port, bare=True)
        base_proc = None
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client, \
                    httpx.Client(base_url=f"http://127.0.0.1:{bare_port}", timeout=120) as bare, \
                    httpx.Client(base_url=f"http://127.0.0.1:{base_port}", timeout=120) as base:
                if not args.floor_only:
                    bench_transform(client, m_speed, A_speed, report)
                r = client.post("/v1/indexes", headers=HDR, json={
                    "name": "bench-e5", "space": "e5", "kind": "flat",
                    "vectors_b64": base64.b64encode(np.ascontiguousarray(B_held).tobytes()).decode(), "dim": 384})
                assert r.status_code == 201, r.text
                r = client.post("/v1/indexes", headers=HDR, json={  # the same rows in HNSW: a scan-free search
                    "name": "bench-e5-hnsw", "space": "e5", "kind": "hnsw",
                    "vectors_b64": base64.b64encode(np.ascontiguousarray(B_held).tobytes()).decode(), "dim": 384})
                assert r.status_code == 201, r.text
                servers = {"new": (client, proc.pid)}
                if args.baseline_tree:
                    base_proc = start_server(data, base_port, root=args.baseline_tree.resolve())
                    servers["baseline"] = (base, base_proc.pid)
                    report["baseline_tree"] = str(args.baseline_tree)
                bench_floor((bare, bare_proc.pid), servers, A_speed, report, rounds=args.rounds)
                bench_floor_work(m_speed, m, A_speed, B_held, report)
                bench_octet_1024(servers, m_speed, A_speed, report, bare=(bare, bare_proc.pid))
                if not args.floor_only:
                    bench_search(client, m, A_speed, B_held, report)
                    if not args.quick:
                        quality(client, A_held, B_held, report, label)
        finally:
            stop(proc, timeout=30)
            stop(bare_proc)
            if base_proc is not None:
                stop(base_proc, timeout=30)
        if not args.no_workers and not args.floor_only:
            bench_workers(data, A_speed, report)

    fl = report["floor_batch1"]
    o1k = report["octet_1024"]
    g = {
        "HTTP batch-1 transform (octet) / floor": (fl["transform octet-stream [new]"]["vs_floor"], "<= 2.0",
                                                   lambda v: v <= 2),
        "HTTP batch-1 transform (JSON) / floor": (fl["transform JSON [new]"]["vs_floor"], "<= 2.0", lambda v: v <= 2),
        "HTTP batch-1 search (vectors_b64) / floor": (fl["search (vectors_b64, k=10) [new]"]["vs_floor"], "<= 2.0",
                                                      lambda v: v <= 2),
        "  the same on an HNSW index (no scan)": (fl["search HNSW (vectors_b64, k=10) [new]"]["vs_floor"], "<= 2.0",
                                                  lambda v: v <= 2),
        "binary HTTP transform / in-process, batch 1024": (o1k["new"]["vs_inprocess"], ">= 0.60", lambda v: v >= 0.6),
        "  the same, http.client as the client": (o1k["new (http.client)"]["vs_inprocess"], ">= 0.60",
                                                  lambda v: v >= 0.6),
    }
    if not args.floor_only:
        g.update({
            "HTTP search / raw FAISS time, batch 64": (report["search_64"]["ratio"], "<= 1.15", lambda v: v <= 1.15),
            "in-process apply (raw) / GEMM, batch 1024":
                (report["inprocess_1024"]["raw"] / report["inprocess_1024"]["gemm"], ">= 0.90", lambda v: v >= 0.9),
            "in-process apply (raw) / GEMM, batch 8192":
                (report["inprocess_8192"]["raw"] / report["inprocess_8192"]["gemm"], ">= 0.90", lambda v: v >= 0.9),
            "demo usable after launch (s)": (report["first_minute"]["demo_usable_s"] or float("inf"), "<= 10",
                                             lambda v: v <= 10),
        })
    print(table("Goals (issue 11)", ["goal", "measured", "target", "met"],
                [[k, f"{v:.2f}", t, ok(v)] for k, (v, t, ok) in g.items()]))
    if note:
        print(note)
    report["goals"] = {k: {"measured": v, "target": t, "met": bool(ok(v))} for k, (v, t, ok) in g.items()}
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / (args.out or f"bench_service_{time.strftime('%Y-%m-%d')}{'_quick' if args.quick else ''}.json")
    out.write_text(json.dumps(report, indent=2, default=float))
    print(f"\nwritten {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
