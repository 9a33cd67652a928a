"""POST /v1/lm/generate and /v1/lm/analyze check what needs no model before they load it: the first request on a
fresh server loaded the language model (47 s for SmolLM2) and only then failed on a bad field (a temperature too
small to sample with, an unknown or embedding steer, an eps out of range), and every bad request waited for its
turn at the model behind the request loading it. The first fit, whose job loads the model, refuses with the
request what the registry tells (a steer name it cannot fit). Served by uvicorn in this process, with the tiny
random Llama (hidden size 16) of the LM tests, its provider counting its calls."""

from __future__ import annotations

import threading

import httpx
import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from _api_support import R, W, settings_for
from _jobs_support import wait_http_job
from _servers import serve_in_thread
from _tiny_lm import held_tiny_lm, tiny_lm

from align.steer import Steer
from service.api import create_app
from service.limits import Limits

SPACE = "lm.tiny-llama"

BAD = [  # (path, body, status, words of the message)
    ("/v1/lm/generate", {"prompt": "the film", "temperature": 1e-300}, 422, "temperature"),
    ("/v1/lm/generate", {"prompt": "the film", "steers": {"nope": 1.0}}, 404, "unknown steer 'nope'"),
    ("/v1/lm/generate", {"prompt": "the film", "steers": {"emb": 1.0}}, 422, "an embedding space"),
    ("/v1/lm/generate", {"prompt": "the film", "steers": {"tone": 1e9}}, 422, "the eps of steer 'tone'"),
    ("/v1/lm/generate", {"prompt": "the film", "steers": {"tone": 600.0, "tone:1": 600.0}}, 422, "tone"),
    ("/v1/lm/generate", {"prompt": "the film", "max_new_tokens": 21}, 422, "limits.lm_max_new_tokens"),
    ("/v1/lm/analyze", {"text": "the film was good", "steer": "nope"}, 404, "unknown steer 'nope'"),
    ("/v1/lm/analyze", {"text": "the film was good", "steer": "emb"}, 422, "an embedding space"),
]


def _app(tmp_path, provider):
    app = create_app(settings_for(tmp_path, limits=Limits(lm_max_new_tokens=20)))
    app.state.lm_provider = provider
    return app


def _steers(app) -> None:
    """An LM steer of the tiny model's width in its space, and an embedding steer (the app serving)."""
    rng = np.random.default_rng(0)
    reg = app.state.vb.registry
    reg.register_steer("tone", Steer(rng.normal(size=(16, 1)), rng.normal(size=(16, 1))), space=SPACE)
    reg.register_steer("emb", Steer(rng.normal(size=(8, 1)), rng.normal(size=(8, 1))), space="e8")


def test_bad_generate_and_analyze_requests_are_refused_without_loading_the_model(tmp_path):
    model, tok = tiny_lm()
    calls: list = []

    def provider():
        calls.append(1)
        return model, tok

    app = _app(tmp_path, provider)
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=60) as c:
        _steers(app)
        for path, body, status, says in BAD:
            r = c.post(path, headers=R, json=body)
            assert r.status_code == status and says in r.json()["error"]["message"], (body, r.text)
            assert calls == [], f"{body}: the model was loaded for a request refused without it"
        r = c.post("/v1/lm/generate", headers=R, json={"prompt": "the film", "steers": {"tone": 1.0},
                                                        "max_new_tokens": 2})
        assert r.status_code == 200 and calls == [1], r.text
        for path, body, status, says in BAD:  # loaded: the same answers, the model's space named
            r = c.post(path, headers=R, json=body)
            assert r.status_code == status and says in r.json()["error"]["message"], (body, r.text)
        assert SPACE in c.post("/v1/lm/analyze", headers=R, json=BAD[-1][1]).json()["error"]["message"]
        assert calls == [1]


def test_a_bad_request_is_refused_while_the_first_request_loads_the_model(tmp_path):
    """The first generate holds the model's turn while the model loads: a bad request behind it is answered at
    once, not after the load (the provider is released only after the bad requests' answers, or after 60 s when
    they wait for it)."""
    slow, loading, release = held_tiny_lm(120)
    app = _app(tmp_path, slow)
    out: list = []
    timer = threading.Timer(60, release.set)  # the old code's bad requests wait for the load: end it then
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=120) as c:
        _steers(app)
        first = threading.Thread(target=lambda: out.append(c.post("/v1/lm/generate", headers=R, json={
            "prompt": "the film", "max_new_tokens": 2}).status_code))
        first.start()
        timer.start()
        try:
            assert loading.wait(60)
            for path, body, status, says in BAD[:4] + BAD[-2:]:
                r = c.post(path, headers=R, json=body)
                assert r.status_code == status and says in r.json()["error"]["message"], (body, r.text)
                assert not release.is_set(), f"{body}: answered only after the model loaded"
        finally:
            release.set()
            timer.cancel()
            first.join(120)
        assert out == [200]


def test_the_first_fit_refuses_a_steer_name_it_cannot_fit_without_loading_the_model(tmp_path):
    """Before the model is loaded, POST /v1/lm/steers answered 202 for a steer name bound to an embedding space, or
    to an LM space narrower than the rank asked, and its job loaded the model only to fail: both are told by the
    registry, so they are refused with the request (no job, no load)."""
    model, tok = tiny_lm()
    calls: list = []

    def provider():
        calls.append(1)
        return model, tok

    fit = {"texts": ["the film was good", "a great movie", "the film was bad", "an awful movie"],
           "labels": [1, 1, -1, -1], "steps": 2}
    app = _app(tmp_path, provider)
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=60) as c:
        _steers(app)
        for body, status, says in (({"name": "emb"}, 409, "steer 'emb' lives in space 'e8', an embedding space"),
                                   ({"name": "tone", "rank": 17}, 422, "rank must be in [1, 16]")):
            r = c.post("/v1/lm/steers", headers=W, json={**fit, **body})
            assert r.status_code == status and says in r.json()["error"]["message"], r.text
            assert c.get("/v1/jobs", headers=W).json()["data"] == [] and calls == []
        r = c.post("/v1/lm/steers", headers=W, json={**fit, "name": "tone", "rank": 2})  # fits: its job loads
        assert r.status_code == 202, r.text
        job = wait_http_job(c, r.json()["id"], headers=W)
        assert job["state"] == "succeeded" and job["result"]["ref"] == "tone:2" and calls == [1], job


TOKENS_BAD = [  # refusals that need the token counts: (path, body, words of the message)
    ("/v1/lm/generate", {"prompt": "   \n "}, "no tokens"),
    ("/v1/lm/generate", {"prompt": "the film " * 21, "max_new_tokens": 2}, "limits.lm_max_tokens"),  # 42 > 40
    ("/v1/lm/generate", {"prompt": "the film " * 19 + "the", "max_new_tokens": 30}, "64-token context"),  # 39 + 30
    ("/v1/lm/analyze", {"text": "the film was good " * 11, "steer": "tone"}, "limits.lm_max_tokens"),  # 44
    ("/v1/lm/analyze", {"text": "film", "steer": "tone"}, "at least 2"),  # one token: no evidence
]


def test_token_counts_are_refused_while_a_generation_holds_the_model(tmp_path):
    """With the model loaded, a request refused for its token counts (an empty prompt, one over
    limits.lm_max_tokens or the model's context, an analyze text of one token) waited in the model's queue behind
    the running generation and got its 422 only when that ended: the check tokenizer counts them before the queue.
    The running generate waits on the model's lock (as behind a fit's forward pass); the lock is released only
    after the bad requests' answers, or after 60 s when they wait for it."""
    model, tok = tiny_lm()
    app = create_app(settings_for(tmp_path, limits=Limits(lm_max_new_tokens=30, lm_max_tokens=40)))
    app.state.lm_provider = lambda: (model, tok)
    out: list = []
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=120) as c:
        _steers(app)
        assert c.post("/v1/lm/generate", headers=R, json={"prompt": "the film", "max_new_tokens": 2}).status_code == 200
        lock = app.state.lm.lock
        lock.acquire()
        released = threading.Event()

        def release():
            if not released.is_set():
                released.set()
                lock.release()

        timer = threading.Timer(60, release)  # the old code's refusals wait for the running generate: end it then
        running = threading.Thread(target=lambda: out.append(c.post("/v1/lm/generate", headers=R, json={
            "prompt": "the film", "max_new_tokens": 2}).status_code))
        try:
            running.start()
            timer.start()
            for _ in range(1200):  # the running generate holds the model's turn (waiting for its lock)
                if "\nvecbridge_lm_requests_running 1.0\n" in c.get("/metrics", headers=R).text:
                    break
                threading.Event().wait(0.025)
            else:
                raise AssertionError("the generate never took the model's turn")
            for path, body, says in TOKENS_BAD:
                r = c.post(path, headers=R, json=body)
                assert r.status_code == 422 and says in r.json()["error"]["message"], (body, r.text)
                assert not released.is_set(), f"{body}: answered only after the running generate"
        finally:
            timer.cancel()
            release()
            running.join(120)
        assert out == [200]
        for path, body, says in TOKENS_BAD:  # the model free: the same answers
            r = c.post(path, headers=R, json=body)
            assert r.status_code == 422 and says in r.json()["error"]["message"], (body, r.text)
