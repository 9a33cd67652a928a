"""Integer options of the CLI that reach FAISS or another native call have the bound the HTTP API gives the same
field, read from one constant: ``index search --nprobe`` had none (HTTP: 65536), ``lm steer-fit --rank`` /
``--steps`` took any integer (HTTP: 1024 / 20000; a mistyped --steps trained on for days), and the others repeated
HTTP's number as a copy (``--csls-k``, ``verify --k``, ``lm generate --max-new-tokens``)."""

from __future__ import annotations

import click
import numpy as np
import pytest
from _servers import seed_registry
from conftest import run_cli

from service.api.routers.lm import LMFitRequest, LMGenerateRequest
from service.api.schemas import SearchOptions
from service.api.vectordb_schemas import VerificationRequest
from service.cli import cli as root
from service.limits import MAX_CSLS_K, MAX_EF_SEARCH, MAX_NPROBE, MAX_VERIFY_K
from service.ops import lm as lm_ops

#: (CLI command path, option name, HTTP request model, its field, the shared bound)
PAIRS = [(("index", "search"), "nprobe", SearchOptions, "nprobe", MAX_NPROBE),
         (("index", "search"), "ef_search", SearchOptions, "ef_search", MAX_EF_SEARCH),
         (("index", "search"), "csls_k", SearchOptions, "csls_k", MAX_CSLS_K),
         (("verify",), "k", VerificationRequest, "k", MAX_VERIFY_K),
         (("lm", "steer-fit"), "rank", LMFitRequest, "rank", lm_ops.MAX_FIT_RANK),
         (("lm", "steer-fit"), "steps", LMFitRequest, "steps", lm_ops.MAX_FIT_STEPS),
         (("lm", "generate"), "max_new_tokens", LMGenerateRequest, "max_new_tokens", None)]


def _maximum(schema: dict):
    """The ``maximum`` of a JSON Schema property (an integer, or an integer or null)."""
    if "maximum" in schema:
        return schema["maximum"]
    return next(m for m in (_maximum(s) for s in schema.get("anyOf", [])) if m is not None)


@pytest.mark.parametrize(("path", "option", "model", "field", "bound"), PAIRS,
                         ids=[f"{' '.join(p[0])} {p[1]}" for p in PAIRS])
def test_each_cli_option_has_the_http_fields_bound(path, option, model, field, bound):
    cmd = root
    for name in path:  # a lazy group: its commands load when asked
        cmd = cmd.get_command(click.Context(cmd), name)
    param = next(p for p in cmd.params if p.name == option)
    http = _maximum(model.model_json_schema()["properties"][field])
    assert isinstance(param.type, click.IntRange) and param.type.min == 1, (option, param.type)
    assert param.type.max == http and (bound is None or http == bound), (option, param.type.max, http, bound)


def test_nprobe_past_the_http_bound_is_exit_2_naming_the_flag_before_a_search(tmp_path, capsys):
    """``--nprobe 65537`` on an IVF index (nlist 8) was refused by the search, in the HTTP field's words, as a value
    above nlist; past the bound it is the flag's own refusal, before the index is read. Within it, nlist still
    bounds it (the index's check)."""
    data = tmp_path / "var"
    _, Y, _ = seed_registry(data)
    A = np.random.default_rng(0).standard_normal((600, 16)).astype(np.float32)
    np.save(tmp_path / "a.npy", A)
    np.save(tmp_path / "q.npy", Y[:2])
    code, _, err = run_cli(capsys, "--data-dir", data, "index", "create", "iv", "--space", "b", tmp_path / "a.npy",
                           "--kind", "ivf", "--param", "nlist=8", "--quiet")
    assert code == 0, err
    search = ["--data-dir", data, "index", "search", "iv", tmp_path / "q.npy", "--space", "b", "-k", "3", "--nprobe"]
    for value in ("65537", str(2**70)):
        code, _, err = run_cli(capsys, *search, value)
        assert code == 2 and "--nprobe" in err and "65536" in err and "nlist" not in err, err
    code, _, err = run_cli(capsys, *search, "9")
    assert code == 2 and "nprobe must be between 1 and nlist=8, got 9" in err, err
    assert run_cli(capsys, *search, "8")[0] == 0


@pytest.mark.parametrize(("flag", "value", "bound"), [("--steps", "20001", "20000"), ("--rank", "1025", "1024"),
                                                      ("--steps", "0", "1")])
def test_an_lm_steer_fit_out_of_the_http_bounds_is_exit_2_before_anything_is_read(tmp_path, capsys, flag, value,
                                                                                  bound):
    """Nothing is read or loaded: the files named do not even exist."""
    code, _, err = run_cli(capsys, "--data-dir", tmp_path / "var", "lm", "steer-fit", "--texts", tmp_path / "no.txt",
                           "--labels", tmp_path / "no.npy", "--name", "tone", flag, value)
    assert code == 2 and flag in err and bound in err and "no.txt" not in err, err


def test_the_python_fit_has_the_same_bounds():
    """:func:`service.ops.lm.check_fit`, which both faces call, refuses what the HTTP schema refuses (a caller of
    the Python function had no upper bound either)."""
    from align.exceptions import InputError

    spec = {"name": "tone", "texts": ["good", "bad"], "labels": [1, -1]}
    lm_ops.check_fit(lm_ops.LMFit(**spec, steps=lm_ops.MAX_FIT_STEPS, rank=lm_ops.MAX_FIT_RANK))
    with pytest.raises(InputError, match=r"steps must be an integer in \[1, 20000\], got 20001"):
        lm_ops.check_fit(lm_ops.LMFit(**spec, steps=20_001))
    with pytest.raises(InputError, match=r"rank must be an integer in \[1, 1024\], got 1025"):
        lm_ops.check_fit(lm_ops.LMFit(**spec, rank=1025))
    with pytest.raises(InputError, match="steps must be an integer"):
        lm_ops.check_fit(lm_ops.LMFit(**spec, steps=2.5))
