"""The language model behind ``/v1/lm`` can be neither stalled nor killed by one client: requests waiting for
the busy model hold no worker thread (other routes keep answering) and their queue is bounded (429); prompts
and texts are bounded in tokens (the limits table and the model's context); a fit holds the model only for
its forward pass, and is cancellable there. Served by uvicorn in this process, with the tiny random Llama
(64-token context, hidden size 16) of the LM tests."""

from __future__ import annotations

import threading
import time

import httpx
import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from _api_support import R, W, answered, settings_for
from _jobs_support import wait_http_job
from _servers import serve_in_thread
from _tiny_lm import tiny_lm

from align.steer import Steer
from service.api import create_app
from service.limits import Limits

POS = ["the film was good", "a great movie and lovely music", "the story was happy and fine"]
NEG = ["the film was bad", "an awful movie and sad music", "the story was poor and dull"]
FIT = {"name": "fitted", "texts": POS + NEG, "labels": [1] * 3 + [-1] * 3, "rank": 2, "eps": 1.0, "lr": 0.05}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model, tok = tiny_lm()
    limits = Limits(lm_max_waiting=3, lm_max_tokens=40, lm_max_new_tokens=20, lm_max_fit_texts=8)
    app = create_app(settings_for(tmp_path_factory.mktemp("lm_limits"), limits=limits))
    app.state.lm_provider = lambda: (model, tok)
    rng = np.random.default_rng(0)
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as c:
        app.state.vb.registry.register_steer("tone", Steer(rng.normal(size=(16, 1)), rng.normal(size=(16, 1))),
                                             space="lm.tiny-llama")
        assert c.post("/v1/lm/generate", headers=R, json={"prompt": "the film", "max_new_tokens": 2}).status_code == 200
        yield {"c": c, "app": app, "base": base}


def wait(c, jid, timeout=120.0):
    return wait_http_job(c, jid, timeout=timeout, headers=R)


def _generate_in_threads(base, n, out):
    def one():
        try:
            r = httpx.post(base + "/v1/lm/generate", headers=R, json={"prompt": "the film", "max_new_tokens": 2},
                           timeout=60)
            out.append(r.status_code)
        except httpx.HTTPError as exc:
            out.append(type(exc).__name__)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
        time.sleep(0.02)
    return threads


def _until_metrics(c, running: int, waiting: int, timeout: float = 30.0) -> None:
    """Wait until /metrics says ``running`` generates hold the model's turn and ``waiting`` wait behind them (a
    loaded machine may take seconds to get the threads' requests in)."""
    want = (f"\nvecbridge_lm_requests_running {running:.1f}\n", f"\nvecbridge_lm_requests_waiting {waiting:.1f}\n")
    t0 = time.monotonic()
    while not all(w in (text := c.get("/metrics", headers=R).text) for w in want):
        assert time.monotonic() - t0 < timeout, [ln for ln in text.splitlines() if "lm_requests_" in ln]
        time.sleep(0.025)


def test_requests_waiting_for_a_busy_model_hold_no_worker_thread(served, tmp_path):
    """45 generate requests behind a busy model (its lock held, as a fit's forward pass holds it): before, each
    held one of the 40 shared worker threads and /readyz, /v1/jobs... stalled until the model was free."""
    model, tok = tiny_lm()
    app = create_app(settings_for(tmp_path, limits=Limits(lm_max_waiting=100)))
    app.state.lm_provider = lambda: (model, tok)
    with serve_in_thread(app) as base:
        assert httpx.post(base + "/v1/lm/generate", headers=R, json={"prompt": "the film", "max_new_tokens": 2},
                          timeout=30).status_code == 200
        lock = app.state.lm.lock
        out: list = []
        lock.acquire()
        try:
            threads = _generate_in_threads(base, 45, out)
            _until_metrics(httpx.Client(base_url=base, timeout=30), 1, 44)
            for path in ("/readyz", "/v1/jobs", "/v1/steers"):
                r = httpx.get(base + path, headers=R, timeout=5)
                assert r.status_code == 200, (path, r.text)
        finally:
            lock.release()
        for t in threads:
            t.join(60)
        assert out == [200] * 45


@pytest.mark.parametrize("pad", [0, 100_000])
def test_a_request_whose_client_left_while_it_waited_does_not_run_the_model(served, pad):
    """A generate queued behind a busy model whose client gave up (a timeout) still ran the model once its turn
    came, for nobody; it now gives its turn up (499 in the metrics) and the model goes to the next request.
    A body of over 64 KiB (``pad`` spaces of JSON) arriving in one read leaves uvicorn not reading the socket (its
    flow control) until the app asks for a message again: a check when the turn came did not see the client
    leave and ran the model for it (a 200); listening while it waits does."""
    import socket

    c, app = served["c"], served["app"]
    port = int(served["base"].rsplit(":", 1)[1])

    def generates(status: str) -> int:
        return answered(c, "/v1/lm/generate", status)

    before_499, before_200 = generates("499"), generates("200")
    body = b'{"prompt": "the film", "max_new_tokens": 2}' + b" " * pad
    lock = app.state.lm.lock
    out: list = []
    lock.acquire()
    try:
        first = _generate_in_threads(served["base"], 1, out)  # takes the model's turn, waits for its lock
        _until_metrics(c, 1, 0)
        with socket.create_connection(("127.0.0.1", port)) as s:  # queued behind it, then gone
            s.sendall(f"POST /v1/lm/generate HTTP/1.1\r\nHost: x\r\nAuthorization: {R['Authorization']}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode())
            time.sleep(0.2)  # the server waits for the body: the whole of it arrives in one read
            s.sendall(body)
            _until_metrics(c, 1, 1)  # queued, then the client goes
    finally:
        lock.release()
    for t in first:
        t.join(60)
    assert out == [200]
    for _ in range(100):
        if generates("499") > before_499:
            break
        time.sleep(0.05)
    assert generates("499") == before_499 + 1
    assert generates("200") == before_200 + 1  # the first request only: the model ran once


def test_clients_that_left_the_queue_give_their_places_up_at_once(served):
    """Three generates queued behind a busy model (limits.lm_max_waiting=3) whose clients gave up kept their places
    until their turn came: /metrics said 3 waiting and the next client, alone in the queue, was refused 429. Each
    now leaves the queue when its client does (499) and the next client is served."""
    import socket

    c, app = served["c"], served["app"]
    port = int(served["base"].rsplit(":", 1)[1])
    gone_before = answered(c, "/v1/lm/generate", "499")
    body = b'{"prompt": "the film", "max_new_tokens": 2}'
    head = (f"POST /v1/lm/generate HTTP/1.1\r\nHost: x\r\nAuthorization: {R['Authorization']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    lock = app.state.lm.lock
    out: list = []
    lock.acquire()
    try:
        threads = _generate_in_threads(served["base"], 1, out)  # takes the model's turn, waits for its lock
        _until_metrics(c, 1, 0)
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        for s in socks:
            s.sendall(head + body)
        _until_metrics(c, 1, 3)
        for s in socks:  # the three clients give up (a timeout) while the model is still busy
            s.close()
        t0 = time.monotonic()
        while answered(c, "/v1/lm/generate", "499") < gone_before + 3 and time.monotonic() - t0 < 30:
            time.sleep(0.025)
        threads += _generate_in_threads(served["base"], 1, out)  # a live client: room in the queue
        t0 = time.monotonic()
        while len(out) < 1 and "\nvecbridge_lm_requests_waiting 1.0\n" not in c.get("/metrics", headers=R).text:
            assert time.monotonic() - t0 < 30, "the live client neither queued nor was answered"
            time.sleep(0.025)
        text = c.get("/metrics", headers=R).text
    finally:
        lock.release()
    for t in threads:
        t.join(60)
    assert sorted(out) == [200, 200]  # was [200, 429]: the live client refused
    assert "\nvecbridge_lm_requests_waiting 1.0\n" in text  # the live client only (was 3: those that left)
    assert answered(c, "/v1/lm/generate", "499") == gone_before + 3


def test_a_full_model_queue_is_429(served):
    """One request runs (waiting for the model), three wait (limits.lm_max_waiting=3): the next is refused at once."""
    c, app = served["c"], served["app"]
    out: list = []
    lock = app.state.lm.lock
    lock.acquire()
    try:
        threads = _generate_in_threads(served["base"], 4, out)
        _until_metrics(c, 1, 3)
        t0 = time.time()
        # a request that could run (an unknown steer is a 404 at once: checked before the queue)
        r = c.post("/v1/lm/analyze", headers=R, json={"text": "the film was good", "steer": "tone"})
        assert r.status_code == 429, r.text
        assert time.time() - t0 < 5 and r.headers["Retry-After"]
        assert "limits.lm_max_waiting" in r.json()["error"]["message"]
        text = c.get("/metrics", headers=R).text  # saturation an operator can page on: the queue and its 429s
        assert "\nvecbridge_lm_requests_waiting 3.0\n" in text
        assert "\nvecbridge_lm_requests_running 1.0\n" in text  # the one holding the model's turn
        assert 'route="/v1/lm/analyze",status="429"} 1.0' in text
    finally:
        lock.release()
    for t in threads:
        t.join(60)
    assert out == [200] * 4
    text = c.get("/metrics", headers=R).text
    assert "\nvecbridge_lm_requests_waiting 0.0\n" in text and "\nvecbridge_lm_requests_running 0.0\n" in text
    assert c.post("/v1/lm/generate", headers=R, json={"prompt": "the film", "max_new_tokens": 2}).status_code == 200


@pytest.mark.parametrize("path,body,says", [
    ("/v1/lm/generate", {"prompt": "the film " * 21, "max_new_tokens": 2}, "limits.lm_max_tokens"),  # 42 > 40
    ("/v1/lm/generate", {"prompt": "the film", "max_new_tokens": 21}, "limits.lm_max_new_tokens"),
    ("/v1/lm/analyze", {"text": "the film was good " * 11, "steer": "tone"}, "limits.lm_max_tokens"),  # 44
    ("/v1/lm/generate", {"prompt": "   \n "}, "no tokens"),  # the word-level tokenizer reads no token (was a 500)
])
def test_prompts_and_texts_are_bounded_in_tokens(served, path, body, says):
    r = served["c"].post(path, headers=R, json=body)
    assert r.status_code == 422, r.text
    assert says in r.json()["error"]["message"]


def test_a_prompt_beyond_the_model_context_is_422(tmp_path):
    """Past its context (64 positions for the tiny Llama) a model computes on positions it never saw, in time and
    memory growing with the square of the length: refused, even when the token limit is higher."""
    model, tok = tiny_lm()
    app = create_app(settings_for(tmp_path, limits=Limits(lm_max_tokens=1000)))
    app.state.lm_provider = lambda: (model, tok)
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as c:
        r = c.post("/v1/lm/generate", headers=R, json={"prompt": "the film " * 30, "max_new_tokens": 5})  # 65
        assert r.status_code == 422 and "64-token context" in r.json()["error"]["message"], r.text
        ok = c.post("/v1/lm/generate", headers=R, json={"prompt": "the film " * 29, "max_new_tokens": 5})  # 63
        assert ok.status_code == 200, ok.text
        rng = np.random.default_rng(0)
        app.state.vb.registry.register_steer("z", Steer(rng.normal(size=(16, 1)), rng.normal(size=(16, 1))),
                                             space="lm.tiny-llama")
        r = c.post("/v1/lm/analyze", headers=R, json={"text": "the film " * 40, "steer": "z"})
        assert r.status_code == 422 and "context" in r.json()["error"]["message"], r.text


def test_embedding_steers_in_the_lm_space_are_refused_with_a_reason(tmp_path):
    """POST /v1/steers may fit an embedding steer into the space ``lm.<model>``. An 8-d one made /v1/lm/analyze a 500
    (8-d factors times 16-d hidden states), a mean shift was refused as living "in space 'lm.tiny-llama', not the
    language model's 'lm.tiny-llama'", and an LM fit into the 8-d space trained, then failed its job."""
    from align.steer import MeanShift

    model, tok = tiny_lm()
    app = create_app(settings_for(tmp_path))
    app.state.lm_provider = lambda: (model, tok)
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as c:
        reg = app.state.vb.registry
        rng = np.random.default_rng(0)
        reg.register_steer("e8", Steer(rng.normal(size=(8, 1)), rng.normal(size=(8, 1))), space="lm.tiny-llama")
        for path, body in (("/v1/lm/analyze", {"text": "the film was good", "steer": "e8"}),
                           ("/v1/lm/generate", {"prompt": "the film", "steers": {"e8": 1.0}})):
            r = c.post(path, headers=R, json=body)
            assert r.status_code == 422 and "8-d" in r.json()["error"]["message"], (path, r.text)
        r = c.post("/v1/lm/steers", headers=W, json={**FIT, "steps": 3})
        assert r.status_code == 409 and "8-d" in r.json()["error"]["message"], r.text
    app = create_app(settings_for(tmp_path / "ms"))
    app.state.lm_provider = lambda: (model, tok)
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as c:
        app.state.vb.registry.register_steer("ms", MeanShift(np.ones(16)), space="lm.tiny-llama")
        r = c.post("/v1/lm/analyze", headers=R, json={"text": "the film was good", "steer": "ms"})
        assert r.status_code == 422 and "mean-shift" in r.json()["error"]["message"], r.text


def test_lm_fit_bounds_are_checked_before_the_job(served):
    c = served["c"]
    r = c.post("/v1/lm/steers", headers=W, json={**FIT, "texts": POS * 3 + NEG * 3, "labels": [1] * 9 + [-1] * 9})
    assert r.status_code == 413 and "limits.lm_max_fit_texts" in r.json()["error"]["message"], r.text
    r = c.post("/v1/lm/steers", headers=W, json={**FIT, "rank": 17})  # the hidden size is 16
    assert r.status_code == 422 and "hidden size" in r.json()["error"]["message"], r.text
    # blank texts were accepted (202) and the job failed in the tokenizer: "every text must be a non-empty string"
    r = c.post("/v1/lm/steers", headers=W, json={**FIT, "texts": ["  "] + FIT["texts"][1:]})
    assert r.status_code == 422 and "non-empty" in r.json()["error"]["message"], r.text


def test_analyze_with_an_overflowing_eps_is_422_not_null_scores(served):
    c = served["c"]
    job = wait(c, c.post("/v1/lm/steers", headers=W, json={**FIT, "name": "ev", "steps": 5}).json()["id"])
    assert job["state"] == "succeeded", job
    r = c.post("/v1/lm/analyze", headers=R, json={"text": "the film was good", "steer": "ev", "eps": 1e308})
    assert r.status_code == 422 and "eps" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_generate_with_an_overflowing_eps_is_422_not_a_crash(served, temperature):
    """eps = 1e38 is finite and the composed factors fit float32, but the steered logits overflow: sampling failed
    in torch.multinomial (a 500) and greedy decoding answered 200 with words picked among Inf/NaN logits."""
    c = served["c"]
    r = c.post("/v1/lm/generate", headers=R, json={"prompt": "the film", "steers": {"tone": 1e38},
                                                   "temperature": temperature, "max_new_tokens": 3})
    assert r.status_code == 422 and "eps" in r.json()["error"]["message"], r.text
    r = c.post("/v1/lm/generate", headers=R, json={"prompt": "the film", "steers": {"tone": 1.0}, "max_new_tokens": 2})
    assert r.status_code == 200, r.text  # the model is left unhooked


def test_generate_runs_while_a_fit_trains(served):
    """The training steps never run the model: a generate answers during a long fit instead of after it."""
    c = served["c"]
    jid = c.post("/v1/lm/steers", headers=W, json={**FIT, "name": "long", "steps": 20_000}).json()["id"]
    try:
        t0 = time.time()
        while c.get(f"/v1/jobs/{jid}", headers=R).json()["progress"]["stage"] != "train":
            assert time.time() - t0 < 30
            time.sleep(0.05)
        t0 = time.time()
        r = c.post("/v1/lm/generate", headers=R, json={"prompt": "the film", "max_new_tokens": 2}, timeout=10)
        assert r.status_code == 200 and time.time() - t0 < 10
        assert c.get(f"/v1/jobs/{jid}", headers=R).json()["state"] == "running"
    finally:
        c.delete(f"/v1/jobs/{jid}", headers=W)
    assert wait(c, jid)["state"] == "cancelled"


def test_a_fit_cancelled_while_waiting_for_the_model_stops_before_its_forward_pass(served):
    c, app = served["c"], served["app"]
    lock = app.state.lm.lock
    lock.acquire()
    try:
        jid = c.post("/v1/lm/steers", headers=W, json={**FIT, "name": "cx", "steps": 5}).json()["id"]
        t0 = time.monotonic()  # the job runs and waits for the model's turn
        while c.get(f"/v1/jobs/{jid}", headers=R).json()["progress"]["stage"] != "encode":
            assert time.monotonic() - t0 < 30
            time.sleep(0.025)
        time.sleep(0.2)  # past the stage's record write, to the lock (a cancel seen at that write is a 200, as fine)
        assert c.delete(f"/v1/jobs/{jid}", headers=W).status_code in (200, 202)
    finally:
        lock.release()
    job = wait(c, jid)
    assert job["state"] == "cancelled" and "during encode" in job["error"]["message"], job


def test_the_default_max_new_tokens_follows_a_lower_limit(served):
    r = served["c"].post("/v1/lm/generate", headers=R, json={"prompt": "the film", "temperature": 0})
    assert r.status_code == 200 and len(r.json()["text"].split()) <= 20, r.text
