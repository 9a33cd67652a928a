"""A server loads its indexes in the background: it answers at once, ``/readyz`` counts the indexes still loading,
and a request for one of them meanwhile is answered (loading it, or waiting for the loader's load of it).

Before, the app's start-up read every index before uvicorn answered anything: a data dir with large indexes (a
1M x 384 flat index is 1.5 GB, seconds to minutes from a cold or network disk) kept even ``/healthz`` silent that
long, and a liveness probe killed the process in a loop. Here one index's payload file is a named pipe, so its load
waits, deterministically, until the test writes the bytes into it: a slow disk, held as long as the test needs. The
server is a real ``uvicorn`` process over real FAISS indexes.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import threading
import time
from contextlib import contextmanager

import httpx
import numpy as np
from _api_support import R
from _servers import env_for, seed_registry, start_on_free_port, stop

from service.indexes import IndexStore


def _held(path) -> bytes:
    """Turn the file ``path`` into a named pipe (a read of it waits for a writer); its bytes, to write later."""
    content = path.read_bytes()
    path.unlink()
    os.mkfifo(path)
    return content


def _threads(pid: int) -> int:
    return int(next(ln for ln in open(f"/proc/{pid}/status") if ln.startswith("Threads:")).split()[1])


def _open_writer(fifo, timeout: float = 30.0) -> int:
    """The write end of ``fifo`` (blocking writes), once a reader (the server's load) has it open."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.set_blocking(fd, True)
            return fd
        except OSError as exc:
            if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _readyz(url: str, until, timeout: float = 30.0) -> tuple[int, dict]:
    """Poll /readyz until ``until(status, body)``; its last answer."""
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(url + "/readyz", timeout=10)
        if until(r.status_code, r.json()) or time.monotonic() > deadline:
            return r.status_code, r.json()
        time.sleep(0.05)


def _top1(r: httpx.Response) -> list[int]:
    assert r.status_code == 200, r.text
    return [hits[0]["id"] for hits in r.json()["results"]]


def _metric(url: str, line: str) -> float:
    text = httpx.get(url + "/metrics", headers=R, timeout=10).text
    return float(next(s for s in text.splitlines() if s.startswith(line + " ")).split()[-1])


@contextmanager
def _server_with_slow_index(tmp_path, more=None):
    """A real server over spaces a, b (16-d, map a2b: Y = X Q) and the index 'slow' (Y's 300 rows, with payloads)
    whose payload file is a named pipe: its load waits until ``release()`` writes the file into it. ``more(store,
    Y)`` creates the other indexes first. Yields ``(url, X, Y, release, pid)``; on the way out the server is stopped
    (a load the test did not release let go first); its log is ``tmp_path / "server.log"``."""
    data = tmp_path / "data"
    X, Y, _ = seed_registry(data)
    store = IndexStore(data / "indexes")
    if more is not None:
        more(store, Y)
    store.create("slow", "b", Y, kind="flat", payloads=[{"i": i} for i in range(len(Y))])
    fifo = data / "indexes" / "slow" / "payloads.1.json"
    payload_bytes = _held(fifo)
    released: list[bool] = []

    def release() -> None:
        fd = _open_writer(fifo)
        try:
            os.write(fd, payload_bytes)
        finally:
            os.close(fd)
        released.append(True)

    proc, port = start_on_free_port(lambda port: (
        [sys.executable, "-m", "uvicorn", "--factory", "service.api:create_app", "--host", "127.0.0.1", "--port",
         str(port), "--no-access-log"], env_for(data, port)), tmp_path / "server.log")  # back once /healthz answers
    url = f"http://127.0.0.1:{port}"
    try:
        yield url, X, Y, release, proc.pid
    finally:
        if not released and proc.poll() is None:
            try:  # let a load still waiting on the pipe go, so the server can stop
                os.close(_open_writer(fifo, timeout=0.5))
            except OSError:
                pass
        stop(proc)


def _log_records(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "server.log").read_text().splitlines() if line.startswith("{")]


def test_a_server_answers_while_a_slow_index_loads_and_serves_it_once_loaded(tmp_path):
    later_rows = np.random.default_rng(7).standard_normal((4000, 16)).astype(np.float32)

    def more(store, Y):
        store.create("small", "b", Y[:20], kind="flat")
        store.create("broken", "b", Y[:30], kind="flat")
        store.create("later", "b", later_rows, kind="flat")  # the largest: loaded last (smallest first)
        (store.root / "broken" / "index.1.faiss").write_bytes(b"not a FAISS file")  # a damaged index

    # before: nothing answered until every index was read (here: never, the pipe holds the load)
    with _server_with_slow_index(tmp_path, more) as (url, X, Y, release, _pid):
        # the loader holds 'slow' (waiting on the disk); 'later' waits its turn; 'broken' failed as it did before
        code, body = _readyz(url, lambda _code, b: b["checks"]["indexes"].get("failed") == 1
                             and b["checks"]["indexes"].get("loaded") == 1)
        ix = body["checks"]["indexes"]
        assert code == 503 and body["status"] == "not ready", body
        assert (ix["loaded"], ix["loading"], ix["failed"]) == (1, 2, 1), ix
        assert "RuntimeError" in ix["errors"]["broken"] and "not recognized" in ix["errors"]["broken"], ix
        assert _metric(url, "vecbridge_indexes_loading") == 2
        assert _metric(url, 'vecbridge_index_vectors{index="small"}') == 20

        c = httpx.Client(base_url=url, headers=R, timeout=60)
        info = c.get("/v1/info", timeout=10)
        assert info.json().get("counts", {}).get("indexes") == 3, info.text  # loaded + loading, without waiting
        assert _top1(c.post("/v1/indexes/small/search", json={"vectors": Y[:5].tolist(), "k": 3})) == [0, 1, 2, 3, 4]
        # not loaded yet: the request loads it itself (the loader is busy with 'slow')
        assert _top1(c.post("/v1/indexes/later/search", json={"vectors": later_rows[:5].tolist(), "k": 3})) == [
            0, 1, 2, 3, 4]
        broken = c.get("/v1/indexes/broken")
        assert broken.status_code == 404 and "is there but could not be loaded" in broken.json()["error"]["message"], (
            broken.text)  # it read "not found (it could not be loaded ...)"
        ix = _readyz(url, lambda _code, _b: True)[1]["checks"]["indexes"]
        assert (ix["loaded"], ix["loading"], ix["failed"]) == (2, 1, 1), ix

        # a search from another space and a listing while 'slow' is still on its way: they wait for it, no error
        answers: dict = {}
        asks = {"search": lambda: c.post("/v1/indexes/slow/search",
                                         json={"vectors": X[:20].tolist(), "space": "a", "k": 3}),
                "list": lambda: c.get("/v1/indexes")}
        threads = [threading.Thread(target=lambda k=k: answers.setdefault(k, asks[k]()), daemon=True) for k in asks]
        for th in threads:
            th.start()
        time.sleep(1.0)
        assert answers == {}, answers  # waiting for the disk, not failing
        assert httpx.get(url + "/healthz", timeout=5).status_code == 200

        release()
        for th in threads:
            th.join(60)
        assert _top1(answers["search"]) == list(range(20))
        assert answers["search"].json()["results"][3][0]["payload"] == {"i": 3}
        assert answers["list"].status_code == 200, answers["list"].text
        assert [i["name"] for i in answers["list"].json()["data"]] == ["later", "slow", "small"]

        code, body = _readyz(url, lambda code, _b: code == 200)
        assert code == 200 and body["status"] == "ready", body
        ix = body["checks"]["indexes"]
        assert (ix["loaded"], ix["loading"], ix["failed"], list(ix["errors"])) == (3, 0, 1, ["broken"]), ix
        assert _metric(url, "vecbridge_indexes_loading") == 0
        assert _metric(url, 'vecbridge_index_vectors{index="slow"}') == 300
        assert _metric(url, 'vecbridge_index_vectors{index="later"}') == 4000
    records = _log_records(tmp_path)
    loads = sorted(r["index"] for r in records if r.get("msg") == "index loaded")
    assert loads == ["later", "slow", "small"], loads  # each read once: by the loader or by the request that came first
    done = [r for r in records if r.get("msg") == "indexes loaded"]
    assert len(done) == 1 and (done[0]["loaded"], done[0]["failed"]) == (3, 1), done


def test_requests_waiting_for_a_slow_load_hold_no_pool_thread(tmp_path):
    """Requests for an index the start-up is still loading wait on the event loop, not in the thread pool.

    Before, each one held one of the pool's 40 threads for the whole load: 60 clients retrying a large index
    while it loaded (minutes from a slow disk) left no thread for any other route, so a plain GET of an index
    already loaded waited for the slow one's load. Here the load is held on a pipe while 60 requests for it wait;
    a GET of another index must answer meanwhile, and the 60 once the pipe is written.
    """
    with _server_with_slow_index(tmp_path, lambda store, Y: store.create("small", "b", Y[:20], kind="flat")) as (
            url, _X, Y, release, _pid):
        _readyz(url, lambda _code, b: b["checks"]["indexes"].get("loaded") == 1)  # 'small' in, 'slow' held

        answers: list = []
        asks = [lambda: httpx.post(url + "/v1/indexes/slow/search", headers=R, timeout=60,
                                   json={"vectors": Y[:2].tolist(), "k": 1}),
                lambda: httpx.get(url + "/v1/indexes/slow", headers=R, timeout=60),
                lambda: httpx.get(url + "/v1/indexes", headers=R, timeout=60)]
        threads = [threading.Thread(target=lambda i=i: answers.append(asks[i % 3]()), daemon=True) for i in range(60)]
        for th in threads:
            th.start()
        time.sleep(2.0)  # every one of them has reached the server and waits
        assert answers == [], [a.text for a in answers]
        r = httpx.get(url + "/v1/indexes/small", headers=R, timeout=10)  # a pool thread: there must be one free
        assert r.status_code == 200 and r.json()["count"] == 20, r.text

        release()
        for th in threads:
            th.join(60)
        assert len(answers) == 60 and all(a.status_code == 200 for a in answers), [a.text for a in answers][:3]
        assert sorted({a.json().get("count", 0) for a in answers if "count" in a.json()}) == [300]


def test_a_burst_of_requests_for_an_index_not_reached_yet_takes_one_thread(tmp_path):
    """60 requests at once for an index the start-up has not reached yet (the loader is held on 'slow'): one pool
    thread loads it for all of them (here: waits on its pipe); the others wait on the event loop. Before, every
    request that came before the first one's load began took a thread of its own to wait for it."""
    queued: dict = {}

    def more(store, Y):
        store.create("small", "b", Y[:20], kind="flat")
        rows = np.random.default_rng(3).standard_normal((2000, 16)).astype(np.float32)  # larger: after 'slow'
        store.create("queued", "b", rows, kind="flat", payloads=[{"q": i} for i in range(2000)])
        queued["fifo"] = store.root / "queued" / "payloads.1.json"
        queued["bytes"] = _held(queued["fifo"])

    with _server_with_slow_index(tmp_path, more) as (url, _X, Y, release, pid):
        _readyz(url, lambda _code, b: b["checks"]["indexes"].get("loaded") == 1)  # 'small' in, 'slow' held
        assert httpx.get(url + "/v1/indexes/small", headers=R, timeout=10).status_code == 200
        before = _threads(pid)
        answers: list = []
        go = threading.Barrier(60)

        def ask():
            with httpx.Client(headers=R, timeout=60) as c:
                c.get(url + "/healthz")  # connected: the 60 requests below leave together
                go.wait()
                answers.append(c.post(url + "/v1/indexes/queued/search", json={"vectors": Y[:1].tolist(), "k": 1}))

        threads = [threading.Thread(target=ask, daemon=True) for _ in range(60)]
        fd = None
        try:
            for th in threads:
                th.start()
            fd = _open_writer(queued["fifo"])  # one load of 'queued' has the pipe open and waits on it
            time.sleep(1.0)  # every request has reached the server
            during = _threads(pid)
            assert answers == [], [a.text for a in answers]
            assert during - before <= 3, (before, during)  # one loading thread (and the pool's spares)
            assert httpx.get(url + "/v1/indexes/small", headers=R, timeout=10).status_code == 200
            os.write(fd, queued["bytes"])
        finally:
            if fd is not None:
                os.close(fd)
        for th in threads:
            th.join(60)
        assert len(answers) == 60 and all(a.status_code == 200 for a in answers), [a.text for a in answers][:3]
        release()
    loads = [r["index"] for r in _log_records(tmp_path) if r.get("msg") == "index loaded"]
    assert sorted(loads) == ["queued", "slow", "small"], loads  # 'queued' read once
