"""Concurrency: several clients fit, transform, search and move aliases at once against two
uvicorn worker processes sharing one registry (SQLite, and PostgreSQL when
``VECBRIDGE_TEST_POSTGRES_URL`` is set).

Guarantees checked afterwards on the registry itself:

* no lost version: every accepted fit registered exactly one version (its source-data sha256
  appears exactly once), and no duplicated one (versions of each map are 1..N, N = accepted fits);
* transforms during the writes always answer 200 with the in-process result of the version they name;
* searches never see a half-built index: the index grows by whole batches only (every search
  returns a multiple of the batch size) and the count never goes down;
* alias moves all succeed and the alias ends on one of the versions it was moved to.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait

import httpx
import numpy as np
import pytest

from align import fit_procrustes
from service.indexes import IndexStore
from service.io import sha256_array
from service.registry import open_registry

from .helpers import DIM, R, W, Server, fit_body, planted

FITS_PER_CLIENT = 5
FIT_CLIENTS = 2
OPS = 30  # per transform / search / alias client
BATCH = 8
RETRY_FOR_S = 300  # a fit still answered 429 after this long fails the test, naming the last answer
CLIENTS_FOR_S = 600  # all clients together


def _prepare(data, registry_url):
    reg = open_registry(registry_url, data / "artifacts")
    X, Y, _ = planted()
    reg.register_space("a", DIM)
    reg.register_space("b", DIM)
    maps = {1: fit_procrustes(X, Y), 2: fit_procrustes(X[:100], Y[:100])}
    for v in (1, 2):
        reg.register_version("base", maps[v], source_space="a", target_space="b", method="procrustes", params={})
    reg.close()
    IndexStore(data / "indexes").create("cx", "b", Y[:BATCH * 4], dim=DIM)
    return X, maps


def _run(tmp_path, registry_url):
    data = tmp_path / "data"
    X, maps = _prepare(data, registry_url)
    env = {"VECBRIDGE_REGISTRY_URL": registry_url, "VECBRIDGE_JOB_WORKERS": "1", "VECBRIDGE_MAX_QUEUED_JOBS": "8",
           "VECBRIDGE_LIMITS__MAX_K": "10000"}  # the searcher counts every row with one k=10,000 search
    problems: list[str] = []
    submitted: dict[str, list[str]] = {}  # map name -> source sha256 of each accepted fit
    lock = threading.Lock()
    with Server(data, workers=2, env=env, log_path=tmp_path / "server.log") as server:

        def fitter(k):
            with server.client(W) as c:
                for i in range(FITS_PER_CLIENT):
                    name = f"conc-{i % 2}"
                    body = fit_body(name, n=48, seed=k * 100 + i)
                    deadline = time.monotonic() + RETRY_FOR_S
                    while True:
                        r = c.post("/v1/fits", json=body)
                        if r.status_code != 429:
                            break
                        assert time.monotonic() < deadline, f"fit still 429 after {RETRY_FOR_S} s: {r.text[:200]}"
                        time.sleep(0.2)
                    if r.status_code != 202:
                        problems.append(f"fit {r.status_code} {r.text[:200]}")
                        continue
                    sha = sha256_array(np.asarray(body["source"]["vectors"], np.float32))
                    with lock:
                        submitted.setdefault(name, []).append(sha)

        def transformer():
            with server.client(R) as c:
                for i in range(OPS):
                    ref = f"base:{1 + i % 2}"
                    r = c.post(f"/v1/maps/{ref}/transform", json={"vectors": X[:3].tolist()})
                    if r.status_code != 200:
                        problems.append(f"transform {r.status_code} {r.text[:200]}")
                        continue
                    want = maps[1 + i % 2].apply(X[:3], output="raw")
                    if not np.allclose(np.array(r.json()["vectors"]), want, atol=1e-5):
                        problems.append(f"transform {ref}: wrong numbers")

        def searcher():
            last = 0
            with server.client(R) as c:
                for _ in range(OPS):
                    r = c.post("/v1/indexes/cx/search", json={"vectors": X[:1].tolist(), "space": "a",
                                                              "k": 10_000, "exact": True})
                    if r.status_code != 200:
                        problems.append(f"search {r.status_code} {r.text[:200]}")
                        continue
                    n = len(r.json()["results"][0])
                    if n % BATCH:
                        problems.append(f"search saw {n} rows: a partial batch")

        def adder():
            rng = np.random.default_rng(7)
            with server.client(W) as c:
                for _ in range(OPS // 3):
                    r = c.post("/v1/indexes/cx/vectors",
                               json={"vectors": rng.standard_normal((BATCH, DIM)).astype(np.float32).tolist()})
                    if r.status_code != 200:
                        problems.append(f"index add {r.status_code} {r.text[:200]}")

        def aliaser():
            with server.client(W) as c:
                for i in range(OPS):
                    r = c.put("/v1/maps/base/aliases/prod", json={"version": 1 + i % 2})
                    if r.status_code != 200:
                        problems.append(f"alias {r.status_code} {r.text[:200]}")

        jobs = [*(lambda k=k: fitter(k) for k in range(FIT_CLIENTS)), transformer, transformer, searcher, searcher,
                adder, aliaser]
        with ThreadPoolExecutor(len(jobs)) as ex:
            futures = [ex.submit(j) for j in jobs]
            running = wait(futures, timeout=CLIENTS_FOR_S).not_done
            assert not running, f"{len(running)} of {len(jobs)} clients still running after {CLIENTS_FOR_S} s"
            for f in futures:
                f.result()
        expected = sum(len(v) for v in submitted.values())
        reg = open_registry(registry_url, data / "artifacts")
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                got = sum(len(reg.list_versions(n)) for n in submitted if _exists(reg, n))
                if got >= expected:
                    break
                time.sleep(0.3)
            time.sleep(0.5)  # anything extra (a duplicate) would land now
            return reg_state(reg, submitted), problems, submitted
        finally:
            reg.close()


def _exists(reg, name) -> bool:
    return any(m["name"] == name for m in reg.list_maps())


def reg_state(reg, submitted):
    out = {}
    for name in submitted:
        vs = reg.list_versions(name) if _exists(reg, name) else []
        out[name] = [(v.version, v.data_hashes.get("source")) for v in vs]
    out["__alias__"] = reg.resolve("base@prod").version
    out["__verify__"] = reg.verify()
    return out


def _check(state, problems, submitted):
    assert not problems, problems[:10]
    assert state["__verify__"]["ok"], state["__verify__"]
    assert state["__alias__"] in (1, 2)
    for name, shas in submitted.items():
        versions = state[name]
        assert [v for v, _ in versions] == list(range(1, len(shas) + 1)), f"{name}: lost or duplicated versions"
        assert sorted(h for _, h in versions) == sorted(shas), f"{name}: a fit is missing or registered twice"
    print(f"\nconcurrency: {sum(len(s) for s in submitted.values())} fits -> as many versions, "
          f"{2 * OPS} transforms, {2 * OPS} searches, {OPS // 3} index batches, {OPS} alias moves; 0 errors")


def test_two_workers_sqlite(tmp_path):
    url = f"sqlite:///{tmp_path / 'data' / 'registry.sqlite'}"
    (tmp_path / "data").mkdir()
    _check(*_run(tmp_path, url))


@pytest.mark.postgres
def test_two_workers_postgres(tmp_path, pg_url):
    (tmp_path / "data").mkdir()
    _check(*_run(tmp_path, pg_url))


def test_two_workers_keep_every_acknowledged_index_row(tmp_path):
    data = tmp_path / "data"
    _prepare(data, f"sqlite:///{data / 'registry.sqlite'}")
    acked = BATCH * 4
    rng = np.random.default_rng(3)
    with Server(data, workers=2, log_path=tmp_path / "server.log") as server:
        for _ in range(12):  # a fresh connection each time, so both workers take writes
            r = httpx.post(server.url + "/v1/indexes/cx/vectors", headers=W, timeout=30,
                           json={"vectors": rng.standard_normal((BATCH, DIM)).astype(np.float32).tolist()})
            assert r.status_code == 200, r.text
            acked += BATCH
    with Server(data, log_path=tmp_path / "server2.log") as server:
        count = httpx.get(server.url + "/v1/indexes/cx", headers=R, timeout=30).json()["count"]
    assert count == acked, f"{acked - count} acknowledged rows lost"
