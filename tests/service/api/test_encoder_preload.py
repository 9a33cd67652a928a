"""Encoders preloaded at start-up (``preload_encoders`` / ``vecbridge serve --preload-encoder``): /readyz waits for
them, /v1/info reports them, a typo fails the start-up, a failed load keeps the process not ready. Real servers, the
real all-MiniLM-L6-v2 from its wheel."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest
from _api_support import R
from _servers import ROOT, env_for, free_port, seed_registry, start, start_on_free_port, stop

pytest.importorskip("sentence_transformers")

MINILM = "all-MiniLM-L6-v2"


def test_serve_preloads_an_encoder_before_it_is_ready(tmp_path):
    """Before: the setting did not exist, /readyz was ready at once, and the first text request of the process loaded
    the encoder while it waited. Now /readyz says which encoders are still loading until each has embedded a text."""
    data = tmp_path / "data"
    seed_registry(data)
    proc, port = start_on_free_port(lambda port: ([sys.executable, "-m", "service.cli", "serve", "--preload-encoder",
                                                   "minilm"], env_for(data, port)), tmp_path / "server.log")
    url = f"http://127.0.0.1:{port}"
    try:
        ready = f'vecbridge_encoder_ready{{encoder="{MINILM}"}}'
        assert f"{ready} 0.0" in httpx.get(url + "/metrics", headers=R, timeout=10).text  # loading: pageable
        seen = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            r = httpx.get(url + "/readyz", timeout=10)
            seen.append((r.status_code, r.json()["checks"].get("encoders")))
            if r.status_code == 200:
                break
            time.sleep(0.05)
        assert seen[-1] == (200, {MINILM: "ready"}), seen[-3:]
        assert all(code == 503 and enc[MINILM] in ("pending", "loading") for code, enc in seen[:-1]), seen
        assert httpx.get(url + "/v1/info", headers=R, timeout=10).json()["encoders"] == {MINILM: "ready"}
        assert f"{ready} 1.0" in httpx.get(url + "/metrics", headers=R, timeout=10).text
        r = httpx.post(url + "/v1/embeddings", headers=R, json={"model": "minilm", "input": ["a small dog"]},
                       timeout=60)
        assert r.status_code == 200, r.text
        assert len(r.json()["data"][0]["embedding"]) == 384
    finally:
        stop(proc)
    logs = [json.loads(line) for line in (tmp_path / "server.log").read_text().splitlines() if line.startswith("{")]
    loaded = [rec for rec in logs if rec.get("msg") == "encoder preloaded"]
    assert len(loaded) == 1 and loaded[0]["encoder"] == MINILM and loaded[0]["seconds"] > 0, logs


@pytest.mark.parametrize("how", ["env", "option"])
def test_an_unknown_encoder_to_preload_stops_the_start_up_with_one_line(tmp_path, how):
    data = tmp_path / "data"
    seed_registry(data)
    port = free_port()
    env, args = env_for(data, port), ["--preload-encoder", "minilm", "--preload-encoder", "minilmm"]
    if how == "env":
        env, args = {**env, "VECBRIDGE_PRELOAD_ENCODERS": '["minilm", "minilmm"]'}, []
    out = subprocess.run([sys.executable, "-m", "service.cli", "serve", *args], cwd=ROOT, env=env,
                         capture_output=True, check=False, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stdout == "" and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "unknown encoder 'minilmm'; known: all-MiniLM-L6-v2" in out.stderr
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)


def test_a_failed_preload_is_reported_and_keeps_the_process_not_ready():
    from service.encoders import EncoderUnavailableError
    from service.ops.preload import EncoderPreload

    def load(name):
        raise EncoderUnavailableError(f"encoder {name!r} needs the package 'some-wheel': pip install some-wheel")

    p = EncoderPreload(["e5", "multilingual-e5-small"], load=load)  # one encoder, two names: loaded once
    assert p.names == ["multilingual-e5-small"] and p.status() == {"multilingual-e5-small": "pending"}
    assert not p.ready
    p.start()
    p.join(30)
    assert p.status() == {"multilingual-e5-small": "failed: EncoderUnavailableError: encoder "
                                                   "'multilingual-e5-small' needs the package 'some-wheel': pip "
                                                   "install some-wheel"}
    assert not p.ready
    assert EncoderPreload([]).ready and EncoderPreload([]).status() == {}
