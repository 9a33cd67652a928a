"""``vecbridge lm steer-fit --quiet`` drew transformers' bars of the model load on stderr (QA, session 55: GGUF's
"Converting and de-quantizing GGUF tensors..." and "Loading weights"): the CLI draws none of its own with
``--quiet`` or ``--json`` or when stderr is not a terminal, and the load's are hidden the same way now, and put
back exactly as they were after it.

What is asserted is what the CLI controls: the state of transformers' progress-bar switch and of the GGUF module's
``tqdm`` while the (stand-in) load runs, and that both, and huggingface_hub's bar states the switch rewrites, are
as before afterwards. The switch is process-wide (an encoder load in another test of the same worker turns it off
for good): each test sets it itself and puts it back, and no test reads a bar text transformers would draw."""

from __future__ import annotations

import importlib
import warnings

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformers.modeling_gguf_pytorch_utils as gguf  # noqa: E402
from _tiny_lm import tiny_lm  # noqa: E402
from transformers.utils import logging as tf_logging  # noqa: E402

POS = ["the film was good", "a great movie", "really great actors"]
NEG = ["the film was bad", "an awful movie", "really awful actors"]
CONVERTING = "Converting and de-quantizing GGUF tensors..."
HUB = importlib.import_module("huggingface_hub.utils.tqdm").progress_bar_states  # group -> on


def _switch(on: bool) -> None:
    with warnings.catch_warnings():  # huggingface_hub warns where HF_HUB_DISABLE_PROGRESS_BARS overrides it
        warnings.simplefilter("ignore")
        (tf_logging.enable_progress_bar if on else tf_logging.disable_progress_bar)()


@pytest.fixture()
def bars_switch():
    """``set(on)``: transformers' bar switch as this test wants it, and huggingface_hub's states with a group entry
    of their own (which a plain enable_progress_bar() would drop); everything as it was after the test."""
    was_on, hub_was = tf_logging.is_progress_bar_enabled(), dict(HUB)

    def set_(on: bool) -> dict:
        _switch(on)
        HUB["vecbridge-test.group"] = False
        return dict(HUB)

    yield set_
    _switch(was_on)
    HUB.clear()
    HUB.update(hub_was)


@pytest.fixture()
def loading(tmp_path, monkeypatch):
    """The tiny LM behind ``service.cli.LM_PROVIDER``, drawing what a GGUF load draws as it loads (through the GGUF
    module's tqdm and transformers' switched one) and noting the state of both while it loads."""
    import service.cli as C

    model, tok = tiny_lm()
    seen: dict = {}

    def provider():
        seen.update(switch=tf_logging.is_progress_bar_enabled(), gguf_tqdm=gguf.tqdm)
        for _ in gguf.tqdm(range(3), desc=CONVERTING):
            pass
        for _ in tf_logging.tqdm(range(3), desc="Loading weights"):
            pass
        return model, tok

    monkeypatch.setattr(C, "LM_PROVIDER", provider)
    (tmp_path / "t.txt").write_text("\n".join(POS + NEG) + "\n")
    (tmp_path / "y.txt").write_text("\n".join(["1"] * 3 + ["-1"] * 3) + "\n")
    return C, tmp_path, seen


def _fit(tmp) -> list[str]:
    return ["lm", "steer-fit", "--texts", str(tmp / "t.txt"), "--labels", str(tmp / "y.txt"), "--name", "tone",
            "--rank", "2", "--steps", "3"]


@pytest.mark.parametrize(("command", "flags", "terminal", "on"), [
    ("fit", ["--quiet"], True, True), ("fit", ["--json"], True, True), ("fit", [], False, True),
    ("generate", ["--json"], True, True), ("fit", ["--quiet"], True, False)],
    ids=["fit-quiet", "fit-json", "fit-not-a-terminal", "generate-json", "fit-quiet-switch-off"])
def test_no_bars_of_the_model_load_where_the_cli_draws_none_and_all_put_back_after(
        loading, bars_switch, capsys, monkeypatch, command, flags, terminal, on):
    import service.cli.lm as L

    C, tmp, seen = loading
    monkeypatch.setattr(L, "stderr_is_terminal", lambda: terminal, raising=False)
    hub_before, bar = bars_switch(on), gguf.tqdm
    args = _fit(tmp) if command == "fit" else ["lm", "generate", "--prompt", "the film", "--max-new-tokens", "2"]
    code = C.main(["--data-dir", str(tmp / "data"), *args, *flags])
    out, err = capsys.readouterr()
    assert code == 0 and out, err
    assert seen["switch"] is False and seen["gguf_tqdm"] is not bar, seen  # hidden while it loaded
    assert seen["gguf_tqdm"].keywords == {"disable": True}, seen
    assert err == "", err  # the provider drew both bars: neither reached stderr
    # put back as it was: the switch (on or off), the GGUF module's tqdm, huggingface_hub's states entry for entry
    assert tf_logging.is_progress_bar_enabled() is on and gguf.tqdm is bar and dict(HUB) == hub_before, dict(HUB)


def test_the_load_bars_are_left_as_they_are_where_the_cli_draws_bars(loading, bars_switch, capsys, monkeypatch):
    """Not hidden for good: after a ``--json`` run hid them, a run in the same process with stderr a terminal and no
    --quiet / --json finds the switch and the GGUF module's tqdm as they were, and its load draws its bars."""
    import service.cli.lm as L

    C, tmp, seen = loading
    monkeypatch.setattr(L, "stderr_is_terminal", lambda: True, raising=False)
    hub_before, bar = bars_switch(True), gguf.tqdm
    during = []
    for flags in (["--json"], []):
        code = C.main(["--data-dir", str(tmp / "data"), "lm", "generate", "--prompt", "the film",
                       "--max-new-tokens", "2", *flags])
        assert code == 0, capsys.readouterr().err
        during.append((seen["switch"], seen["gguf_tqdm"] is bar))
    assert during == [(False, False), (True, True)], during
    assert tf_logging.is_progress_bar_enabled() and gguf.tqdm is bar and dict(HUB) == hub_before, dict(HUB)
