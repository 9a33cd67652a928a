"""``vecbridge lm steer-fit --quiet`` drew transformers' bars of the model load on stderr (QA, session 55: GGUF's
"Converting and de-quantizing GGUF tensors..." and "Loading weights"): the CLI draws none of its own with
``--quiet`` or ``--json`` or when stderr is not a terminal, and the load's are hidden the same way now."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformers.modeling_gguf_pytorch_utils as gguf  # noqa: E402
from _tiny_lm import tiny_lm  # noqa: E402
from transformers.utils import logging as tf_logging  # noqa: E402

POS = ["the film was good", "a great movie", "really great actors"]
NEG = ["the film was bad", "an awful movie", "really awful actors"]


@pytest.fixture()
def loading(tmp_path, monkeypatch):
    """The tiny LM behind ``service.cli.LM_PROVIDER``, drawing what a GGUF load draws as it loads."""
    import service.cli as C

    model, tok = tiny_lm()

    def provider():
        for _ in gguf.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."):
            pass
        for _ in tf_logging.tqdm(range(3), desc="Loading weights"):
            pass
        return model, tok

    monkeypatch.setattr(C, "LM_PROVIDER", provider)
    (tmp_path / "t.txt").write_text("\n".join(POS + NEG) + "\n")
    (tmp_path / "y.txt").write_text("\n".join(["1"] * 3 + ["-1"] * 3) + "\n")
    return C, tmp_path


@pytest.mark.parametrize("flag", ["--quiet", "--json"])
def test_steer_fit_quiet_or_json_draws_no_bars_of_the_model_load(loading, capsys, flag):
    C, tmp = loading
    bar = gguf.tqdm
    code = C.main(["--data-dir", str(tmp / "data"), "lm", "steer-fit", "--texts", str(tmp / "t.txt"), "--labels",
                   str(tmp / "y.txt"), "--name", "tone", "--rank", "2", "--steps", "3", flag])
    out, err = capsys.readouterr()
    assert code == 0 and "tone" in out, err
    assert err == "", err
    assert gguf.tqdm is bar and tf_logging.is_progress_bar_enabled()  # put back after the load


def test_the_load_bars_are_drawn_where_bars_are(loading, capsys, monkeypatch):
    """Not hidden for good: with stderr a terminal and no --quiet, the load draws its bars as before."""
    import service.cli.lm as L

    C, tmp = loading
    monkeypatch.setattr(L, "stderr_is_terminal", lambda: True)
    code = C.main(["--data-dir", str(tmp / "data"), "lm", "generate", "--prompt", "the film", "--max-new-tokens",
                   "2"])
    err = capsys.readouterr().err
    assert code == 0 and "Converting and de-quantizing GGUF tensors" in err and "Loading weights" in err, err
