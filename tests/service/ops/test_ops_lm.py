"""service/ops/lm.py: one LM loader (once per holder, even under concurrent first requests) and one
LM-Steer fit that both faces call — the CLI and HTTP register the same steer for the same data."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from fastapi.testclient import TestClient  # noqa: E402

from align.exceptions import InputError  # noqa: E402
from service.api import create_app  # noqa: E402
from service.errors import exit_code, http_status  # noqa: E402
from service.lm.model import LMUnavailableError  # noqa: E402
from service.ops import lm as ops  # noqa: E402
from _tiny_lm import tiny_lm  # noqa: E402
from _api_support import W, settings_for  # noqa: E402

POS = ["the film was good", "a great movie and lovely music", "really great actors", "a very good plot"]
NEG = ["the film was bad", "an awful movie and sad music", "really awful actors", "a very dull plot"]


@pytest.fixture(scope="module")
def model_tok():
    return tiny_lm()


def test_concurrent_first_uses_load_the_model_once(model_tok):
    calls = []

    def slow_provider():
        calls.append(threading.get_ident())
        time.sleep(0.2)  # a slow load: every thread arrives while it runs
        return model_tok

    holder = SimpleNamespace(lm=None)
    got = [None] * 6
    threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, ops.get_lm(holder, slow_provider)))
               for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(calls) == 1 and all(g is got[0] for g in got)
    assert got[0].name == "tiny-llama" and got[0].space == "lm.tiny-llama"
    holder.lm = None  # forgotten: the next use loads again
    assert ops.get_lm(holder, slow_provider) is not got[0] and len(calls) == 2


@pytest.mark.parametrize("exc", [ImportError("No module named 'gguf'"), LMUnavailableError("SmolLM2 GGUF not found")])
def test_a_missing_model_is_unavailable_for_every_face(exc):
    def provider():
        raise exc

    with pytest.raises(LMUnavailableError) as info:
        ops.get_lm(SimpleNamespace(lm=None), provider)
    assert str(info.value).startswith("no language model:") and str(exc) in str(info.value)
    assert (http_status(info.value), exit_code(info.value)) == (503, 2)


def test_cli_and_http_register_the_same_steer(model_tok, tmp_path, monkeypatch, capsys):
    import service.cli as C

    fit = {"rank": 2, "eps": 1.0, "steps": 30, "lr": 0.05, "random_state": 3}
    app = create_app(settings_for(tmp_path / "http"))
    app.state.lm_provider = lambda: model_tok
    with TestClient(app) as c:
        r = c.post("/v1/lm/steers", headers=W, json={"name": "tone", "texts": POS + NEG, "labels": [1] * 4 + [-1] * 4,
                                                     **fit})
        assert r.status_code == 202, r.text
        deadline = time.monotonic() + 300  # a count of polls (30 s) is short on a loaded machine
        while True:
            job = c.get(f"/v1/jobs/{r.json()['id']}", headers=W).json()
            if job["state"] not in ("queued", "running") or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert job["state"] == "succeeded", job
        http_reg = app.state.vb.registry
        http_info = http_reg.resolve_steer("tone")
        http_W = http_reg.load_steer(http_info).W

    monkeypatch.setattr(C, "LM_PROVIDER", lambda: model_tok)
    (tmp_path / "t.txt").write_text("\n".join(POS + NEG) + "\n")
    (tmp_path / "y.txt").write_text("\n".join(["1"] * 4 + ["-1"] * 4) + "\n")
    args = [f"--{k.replace('_', '-')}={v}" for k, v in fit.items()]
    assert C.main(["--data-dir", str(tmp_path / "cli"), "lm", "steer-fit", "--texts", str(tmp_path / "t.txt"),
                   "--labels", str(tmp_path / "y.txt"), "--name", "tone", "--quiet", *args]) == 0, capsys.readouterr()
    from service.registry import open_registry

    cli_reg = open_registry(f"sqlite:///{tmp_path / 'cli' / 'registry.sqlite'}", tmp_path / "cli" / "artifacts")
    cli_info = cli_reg.resolve_steer("tone")
    np.testing.assert_array_equal(cli_reg.load_steer(cli_info).W, http_W)
    assert cli_info.data_hashes == http_info.data_hashes and cli_info.metrics == http_info.metrics
    assert (cli_info.space, cli_info.params) == (http_info.space, http_info.params)
    assert (cli_info.inputs["via"], http_info.inputs["via"]) == ("cli", "http")
    assert [d["positive"] for d in cli_info.lens] == [d["positive"] for d in http_info.lens]


class _Counting:
    """A tokenizer that counts its calls (texts tokenised for checks)."""

    def __init__(self, tok):
        self.tok, self.calls = tok, 0

    def __call__(self, text, **kwargs):
        self.calls += 1
        return self.tok(text, **kwargs)


def test_a_text_checked_before_its_turn_is_counted_once_and_without_the_model_lock(model_tok):
    model, tok = model_tok
    counting = _Counting(tok)
    lm = ops.LM(model, tok, "tiny-llama", check_tokenizer=counting)
    with lm.lock:  # a running generation holds the model: the check tokenizer does not wait for it
        assert ops.check_length_now(lm, "the film", "prompt", 40, 2) is lm
        with pytest.raises(InputError, match="no tokens"):
            ops.check_length_now(lm, "  ", "prompt", 40)
        with pytest.raises(InputError, match="at least 2"):
            ops.check_length_now(lm, "film", "text", 40, min_tokens=2)
    assert counting.calls == 3
    out = ops.generate(None, lm, "the film", {}, max_new_tokens=2, temperature=0, checked=lm)
    assert out["text"] and counting.calls == 3  # checked already: not counted again
    ops.generate(None, lm, "the film", {}, max_new_tokens=2, temperature=0)
    assert counting.calls == 4


def test_without_a_check_tokenizer_the_text_is_counted_in_its_turn(model_tok):
    model, tok = model_tok
    lm = ops.LM(model, tok, "tiny-llama")  # a tokenizer that could not be copied: no check tokenizer
    assert ops.check_length_now(lm, "  ", "prompt", 40) is None  # cannot count now without the model's lock
    for prompt, says in (("  ", "no tokens"), ("the film " * 21, "limits.lm_max_tokens")):
        with pytest.raises(InputError, match=says):
            ops.generate(None, lm, prompt, {}, max_new_tokens=2, temperature=0, max_tokens=40)
