"""``/metrics`` an operator can trust, against a real ``vecbridge serve`` (one process and ``--workers 2``).

Before: each worker of ``serve --workers N`` had its own registry, so a scrape answered with the counters of
whichever worker took the connection (40 requests read 23, 17, 23, ... between scrapes: Prometheus saw resets);
there were no process metrics (RSS); ``vecbridge_index_vectors`` kept the count of the process's own last write
after another process changed the index, and a dropped index's series stayed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from _api_support import R, W
from _servers import env_for, read_line, seed_registry, start, start_on_free_port, stop
from prometheus_client.parser import text_string_to_metric_families

SCRAPES = 24


def samples(text: str, name: str) -> list[tuple[dict, float]]:
    """``(labels, value)`` of every sample called ``name`` in an exposition ``text`` (parsed by prometheus_client)."""
    return [(s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name]


def value(text: str, name: str, **labels) -> float | None:
    """The sum of the samples ``name`` whose labels include ``labels`` (None when there is none)."""
    hits = [v for lab, v in samples(text, name) if all(lab.get(k) == w for k, w in labels.items())]
    return sum(hits) if hits else None


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "two-workers"])
def server(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"metrics-{request.param}")
    data = tmp / "data"
    seed_registry(data)

    def env_at(port: int) -> dict:
        return {k: v for k, v in env_for(data, port).items() if k != "PROMETHEUS_MULTIPROC_DIR"}

    proc, port = start_on_free_port(lambda port: (
        [sys.executable, "-m", "service.cli", "serve", "--workers", str(request.param)], env_at(port)),
        tmp / "server.log")
    env = env_at(port)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # every worker up: a few readyz over fresh connections
        if all(httpx.get(url + "/readyz", timeout=5).status_code == 200 for _ in range(4)):
            break
        time.sleep(0.2)
    try:
        yield {"url": url, "workers": request.param, "data": data, "proc": proc, "env": env}
    finally:
        stop(proc)


def scrape(url: str) -> str:
    """One scrape on a fresh connection (the kernel hands connections to any worker)."""
    r = httpx.get(url + "/metrics", headers=R, timeout=30)
    assert r.status_code == 200, r.text
    return r.text


def info_count(text: str) -> float:
    return value(text, "vecbridge_request_duration_seconds_count", route="/v1/info", status="200") or 0.0


def settled(url: str, read, want: float, timeout: float = 10.0) -> float:
    """Scrape until ``read(text) == want`` (at most ``timeout`` s); the last value read. A request is counted (and
    leaves ``vecbridge_requests_in_flight``) in ObserveMiddleware's ``finally``, after its answer was sent: the client
    can have the answer, and a scrape landing on the other worker can run, before the worker that answered counts it.
    A count that is wrong (per-worker registries, a leaked gauge) never reaches ``want`` and fails the caller."""
    deadline = time.monotonic() + timeout
    while (got := read(scrape(url))) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def test_request_counts_are_the_sum_over_workers_and_never_go_back(server):
    """N requests spread over the workers (8 clients, fresh connections): every scrape, whichever worker answers
    it, reads N; while more requests arrive, successive scrapes never read less than the one before."""
    url = server["url"]
    n = 60

    def info(_):
        return httpx.get(url + "/v1/info", headers=R, timeout=30).status_code

    with ThreadPoolExecutor(8) as ex:
        assert set(ex.map(info, range(n))) == {200}
        assert settled(url, info_count, n) == n  # the last answers' counts may trail their answers by a moment
        counts = list(ex.map(lambda _: info_count(scrape(url)), range(SCRAPES)))
    assert counts == [n] * SCRAPES, counts

    seen = []
    with ThreadPoolExecutor(4) as ex:
        more = [ex.submit(info, i) for i in range(40)]
        for _ in range(12):
            seen.append(info_count(scrape(url)))
        assert {f.result() for f in more} == {200}
    assert seen == sorted(seen), seen  # monotonic across scrapes landing on any worker
    assert settled(url, info_count, n + 40) == n + 40


def test_resident_memory_of_every_worker(server):
    """``process_resident_memory_bytes``: one process: one series (as every prometheus_client service); workers:
    one per live worker, labelled ``pid``, so ``sum()`` is the service's resident memory in both modes."""
    def pids(text: str) -> int:
        return len({lab.get("pid") for lab, _ in samples(text, "process_resident_memory_bytes")})

    # a worker's series appear once it is up: on a loaded machine (CI at load 14) the second took a while
    settled(server["url"], pids, server["workers"], timeout=60)
    text = scrape(server["url"])
    rss = samples(text, "process_resident_memory_bytes")
    cpu = samples(text, "process_cpu_seconds_total")
    if server["workers"] == 1:
        assert [lab for lab, _ in rss] == [{}] and len(cpu) == 1, rss
    else:
        assert len({lab["pid"] for lab, _ in rss}) == 2 and len(cpu) == 2, rss
    assert all(v > 10 * 2**20 for _, v in rss), rss  # a Python process with numpy and FAISS: tens of MB


def test_in_flight_requests_are_counted(server):
    """The scrape itself is a request being answered; nothing else runs (the previous test's last request may still
    be leaving the other worker's gauge: :func:`settled`)."""
    assert settled(server["url"], lambda text: value(text, "vecbridge_requests_in_flight"), 1) == 1


def _cli(server, *args) -> None:
    """``vecbridge --data-dir D ARGS``: another process writing the service's data dir."""
    subprocess.run([sys.executable, "-m", "service.cli", "--data-dir", str(server["data"]), *args],
                   env=server["env"], check=True, capture_output=True, timeout=120)


def test_index_gauges_follow_another_processs_writes_and_drops(server):
    """The CLI (another process) deletes rows of an index the service holds: once the service has caught up (the
    next search), the gauges give the new count and generation; the CLI drops it: its series leave the scrape."""
    url, name = server["url"], f"ix{server['workers']}"
    X = np.random.default_rng(0).standard_normal((20, 16)).astype(np.float32)
    q = {"vectors": X[:1].tolist(), "k": 3}
    r = httpx.post(url + "/v1/indexes", headers=W, json={"name": name, "space": "a", "vectors": X.tolist()}, timeout=60)
    assert r.status_code == 201, r.text
    for _ in range(4):  # every worker loads it (connections land on any worker)
        assert httpx.post(f"{url}/v1/indexes/{name}/search", headers=R, json=q, timeout=30).status_code == 200
    assert value(scrape(url), "vecbridge_index_vectors", index=name) == 20

    _cli(server, "index", "delete", name, "--id", "0", "--id", "1")
    _searched_by_every_worker(url, name, q)  # every worker catches up
    for _ in range(6):
        text = scrape(url)
        assert value(text, "vecbridge_index_vectors", index=name) == 18, text
        assert value(text, "vecbridge_index_generation", index=name) == 2
        assert value(text, "vecbridge_index_logged_deltas", index=name) == 1  # the delete was logged, not a snapshot
        assert value(text, "vecbridge_index_catchups_total", index=name, how="replay") >= 1
        assert value(text, "vecbridge_index_catchup_seconds_total", index=name, how="replay") > 0

    _cli(server, "index", "drop", name, "--yes")
    for _ in range(6):
        text = scrape(url)
        assert not [lab for fam in ("vecbridge_index_vectors", "vecbridge_index_catchups_total")
                    for lab, _ in samples(text, fam) if lab.get("index") == name], text


def _searched_by_every_worker(url: str, name: str, q: dict) -> None:
    """8 searches of index ``name`` over fresh connections from 4 threads (they land on every worker)."""
    with ThreadPoolExecutor(4) as ex:
        assert set(ex.map(lambda _: httpx.post(f"{url}/v1/indexes/{name}/search", headers=R, json=q,
                                              timeout=30).status_code, range(8))) == {200}


def test_index_gauges_never_show_a_dropped_index_under_a_recreated_name(server, tmp_path):
    """The CLI drops an index the workers hold and creates another under its name: no scrape shows the dropped
    index's numbers under it (before: 20 vectors, generation 2, until a request touched the name); once the workers
    load the new one (the next search), its own numbers."""
    url, name = server["url"], f"re{server['workers']}"
    X = np.random.default_rng(1).standard_normal((20, 16)).astype(np.float32)
    q = {"vectors": X[:1].tolist(), "k": 3}
    r = httpx.post(url + "/v1/indexes", headers=W, json={"name": name, "space": "a", "vectors": X.tolist()}, timeout=60)
    assert r.status_code == 201, r.text
    _cli(server, "index", "delete", name, "--id", "0")  # generation 2 in the workers, after their catch-up
    for _ in range(4):
        assert httpx.post(f"{url}/v1/indexes/{name}/search", headers=R, json=q, timeout=30).status_code == 200
    text = scrape(url)
    assert (value(text, "vecbridge_index_vectors", index=name), value(text, "vecbridge_index_generation",
                                                                       index=name)) == (19, 2), text

    np.save(tmp_path / "seven.npy", X[:7])
    _cli(server, "index", "drop", name, "--yes")
    _cli(server, "index", "create", name, str(tmp_path / "seven.npy"), "--space", "a", "--quiet")
    for _ in range(6):
        text = scrape(url)
        for fam, now in (("vecbridge_index_vectors", 7), ("vecbridge_index_generation", 1),
                         ("vecbridge_index_logged_deltas", 0)):
            assert value(text, fam, index=name) in (None, now), (fam, text)  # none yet, or the new index's
    _searched_by_every_worker(url, name, q)  # the workers load the new index
    for _ in range(6):
        text = scrape(url)
        assert value(text, "vecbridge_index_vectors", index=name) == 7, text
        assert value(text, "vecbridge_index_generation", index=name) == 1
    assert "vecbridge_index_life" not in text  # the filter's own gauge stays out of the scrape


def test_a_killed_worker_leaves_its_counts_but_not_its_gauges(server):
    """A worker killed without its clean-up (the OOM killer): uvicorn starts another; the requests it answered stay
    in the counters (no reset), its memory and in-flight requests leave the scrape."""
    if server["workers"] == 1:
        pytest.skip("workers only")
    url = server["url"]
    before = info_count(scrape(url))
    pids = {lab["pid"] for lab, _ in samples(scrape(url), "process_resident_memory_bytes")}
    victim = min(pids)
    os.kill(int(victim), signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            now = {lab["pid"] for lab, _ in samples(scrape(url), "process_resident_memory_bytes")}
        except httpx.HTTPError:  # the connection landed on the dying worker
            now = pids
        if victim not in now and len(now) == 2:
            break
        time.sleep(0.3)
    assert victim not in now and len(now) == 2, (victim, now)
    for _ in range(SCRAPES // 2):
        text = scrape(url)
        assert info_count(text) == before
        # the scrape before this one may still be in the other worker's gauge (it leaves it after its answer);
        # the killed worker's in-flight request never leaves it: that one fails here
        assert settled(url, lambda t: value(t, "vecbridge_requests_in_flight"), 1, timeout=5) == 1


def test_a_metrics_folder_left_by_a_killed_service_is_removed_by_the_next_start(tmp_path, monkeypatch):
    """``serve --workers N`` shares metrics through a private temporary folder, removed when the service stops; a
    parent killed with -9 (the OOM killer) left it in /tmp for good, one per kill. The next start removes each one
    whose owner is dead, and keeps a live service's."""
    import tempfile
    from pathlib import Path

    from service.api.app import _metrics_folder
    from service.metrics import MULTIPROC_ENV

    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    env = {k: v for k, v in os.environ.items() if k != MULTIPROC_ENV}
    serve = ("import os, sys, tempfile; tempfile.tempdir = sys.argv[1]\n"
             "from service.api.app import _metrics_folder\n"
             "with _metrics_folder() as path:\n"
             "    print(path, flush=True)\n"
             "    {}\n")
    killed = subprocess.run([sys.executable, "-c", serve.format("os.kill(os.getpid(), 9)"), str(tmp_path)], env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    dead = Path(killed.stdout.strip())
    assert killed.returncode == -9 and dead.is_dir() and (dead / ".owner").exists(), killed.stderr
    live = subprocess.Popen([sys.executable, "-c", serve.format("sys.stdin.read()"), str(tmp_path)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        alive = Path(read_line(live).strip())
        with _metrics_folder() as mine:
            assert not dead.exists()  # its owner is gone
            assert alive.is_dir() and Path(mine).is_dir()  # a running service's folder stays
        assert not Path(mine).exists()
    finally:
        live.communicate("", timeout=60)
    assert not alive.exists()  # it removed its own on the way out


def test_a_dead_workers_files_another_scrape_removes_first_are_no_error(tmp_path, monkeypatch):
    """Just after a worker was killed, both workers' scrapes found it dead and removed its gauge files: the one
    that came second raised FileNotFoundError in prometheus_client's ``mark_process_dead`` and the scrape answered
    500 (seen once in CI). The other scrape's removal is simulated between this one's glob and its remove."""
    import glob

    from service import metrics

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    dead = child.pid  # no longer running
    (tmp_path / f"gauge_livesum_{dead}.db").write_bytes(b"")
    real = glob.glob

    def racing(pattern, *args, **kwargs):
        found = real(pattern, *args, **kwargs)
        if pattern.endswith(f"_{dead}.db"):  # the other worker's scrape removes them first
            for f in found:
                os.remove(f)
        return found

    monkeypatch.setattr(glob, "glob", racing)
    assert metrics._live_workers(str(tmp_path)) == []
    assert list(tmp_path.iterdir()) == []


def test_using_many_versions_of_a_map_adds_no_series_per_version(server):
    """The map counters were labelled {map, version}: 4 series (two counters and their ``_created``) for every
    version a request used, never dropped, soft-deleted ones included; a nightly refit grew the scrape without
    bound (300 versions: +1,200 series, +82 KB a scrape). They are labelled by map alone; the version is in each
    answer."""
    url, name, versions, rows = server["url"], f"many{server['workers']}", 30, 3
    _register(server, name, versions)

    body = {"vectors": np.ones((rows, 16)).tolist()}  # not zero rows: a transform refuses those
    for v in range(1, versions + 1):
        r = httpx.post(f"{url}/v1/maps/{name}:{v}/transform", headers=R, json=body, timeout=30)
        assert r.status_code == 200 and r.json()["version"] == v, r.text
    assert settled(url, lambda text: value(text, "vecbridge_map_use_total", map=name), versions) == versions
    text = scrape(url)
    assert value(text, "vecbridge_map_rows_total", map=name) == versions * rows
    assert len(_map_series(text, name)) <= 4, _map_series(text, name)  # 2 counters, their _created (workers: none)
    assert not [lab for lab in _map_series(text, name) if "version" in lab], _map_series(text, name)


def _register(server, name: str, versions: int) -> None:
    """``versions`` versions of map ``name`` (a -> b, 16 dims), registered by this process (another than the
    service's)."""
    from align import fit_procrustes
    from service.registry import open_registry

    data = server["data"]
    reg = open_registry(f"sqlite:///{(data / 'registry.sqlite').resolve()}", (data / "artifacts").resolve())
    try:
        rng = np.random.default_rng(1)
        for _ in range(versions):
            X, Y = rng.standard_normal((40, 16)), rng.standard_normal((40, 16))
            reg.register_version(name, fit_procrustes(X, Y), source_space="a", target_space="b", method="procrustes",
                                 params={})
    finally:
        reg.close()


def _map_series(text: str, name: str) -> list[dict]:
    """The labels of every map-counter sample of map ``name`` in a scrape."""
    names = ("vecbridge_map_use_total", "vecbridge_map_rows_total", "vecbridge_map_use_created",
             "vecbridge_map_rows_created")
    return [lab for fam in names for lab, _ in samples(text, fam) if lab.get("map") == name]


def test_the_counters_of_a_map_whose_versions_are_all_deleted_leave_the_scrape(server):
    """QA soak: the map counters kept every name ever used, deleted ones too: 92 short-lived maps grew a scrape from
    43 to 922 series (6.7 KB to 82 KB), for good. One process forgets a name whose last live version it deletes over
    HTTP; a map with a live version left keeps its counts; a name registered again is counted again. Not forgotten
    (documented): names deleted by another process, and every name under --workers N (the files keep keys); a scrape
    never asks the registry (a locked one held a scrape 60 s)."""
    if server["workers"] != 1:
        pytest.skip("--workers N: prometheus_client's files cannot forget a key (service.metrics says so)")
    url = server["url"]
    gone, kept = "gone1", "kept1"
    for name in (gone, kept):
        _register(server, name, 2)
    body = {"vectors": np.ones((3, 16)).tolist()}  # not zero rows: a transform refuses those
    for name in (gone, kept):
        for v in (1, 2):
            r = httpx.post(f"{url}/v1/maps/{name}:{v}/transform", headers=R, json=body, timeout=30)
            assert r.status_code == 200, r.text
    assert settled(url, lambda text: value(text, "vecbridge_map_use_total", map=gone), 2) == 2
    assert httpx.delete(f"{url}/v1/maps/{gone}/versions/1", headers=W, timeout=30).status_code == 200
    assert len(_map_series(scrape(url), gone)) == 4  # version 2 is live: kept
    assert httpx.delete(f"{url}/v1/maps/{gone}/versions/2", headers=W, timeout=30).status_code == 200
    assert httpx.delete(f"{url}/v1/maps/{kept}/versions/1", headers=W, timeout=30).status_code == 200
    text = scrape(url)
    assert _map_series(text, gone) == [], _map_series(text, gone)  # before: 4 series, for good
    assert value(text, "vecbridge_map_use_total", map=kept) == 2  # version 2 is live
    assert value(text, "vecbridge_map_rows_total", map=kept) == 6

    _register(server, gone, 1)  # version 3
    r = httpx.post(f"{url}/v1/maps/{gone}/transform", headers=R, json=body, timeout=30)
    assert r.status_code == 200 and r.json()["version"] == 3, r.text
    assert settled(url, lambda text: value(text, "vecbridge_map_use_total", map=gone), 1) == 1
