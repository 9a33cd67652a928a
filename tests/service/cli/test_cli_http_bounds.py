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
from service.api.vectordb_schemas import MigrationRequest, VerificationRequest
from service.cli import cli as root
from service.limits import (MAX_CSLS_K, MAX_EF_SEARCH, MAX_LENS_DIRECTIONS, MAX_LENS_K, MAX_MIGRATE_BATCH,
                            MAX_MIGRATE_PAUSE, MAX_NPROBE, MAX_VERIFY_K, MAX_VERIFY_QUERIES, MAX_VERIFY_SAMPLE)
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


#: (CLI command path, option name, its lower bound, HTTP request model, its field, the shared bound): options whose
#: bound differed from HTTP's (migrate --batch-size 1,000,000 vs 100,000; --pause none vs 60; verify --n-sample /
#: --queries none vs 100,000 / 10,000)
BOUNDED = [(("migrate",), "batch_size", 1, MigrationRequest, "batch_size", MAX_MIGRATE_BATCH),
           (("migrate",), "pause", 0, MigrationRequest, "pause", MAX_MIGRATE_PAUSE),
           (("verify",), "n_sample", 2, VerificationRequest, "n_sample", MAX_VERIFY_SAMPLE),
           (("verify",), "n_queries", 1, VerificationRequest, "queries", MAX_VERIFY_QUERIES)]


def _param(path, option):
    cmd = root
    for name in path:  # a lazy group: its commands load when asked
        cmd = cmd.get_command(click.Context(cmd), name)
    return next(p for p in cmd.params if p.name == option)


@pytest.mark.parametrize(("path", "option", "low", "model", "field", "bound"), BOUNDED,
                         ids=[f"{' '.join(p[0])} {p[1]}" for p in BOUNDED])
def test_migrate_and_verify_options_have_the_http_fields_bounds(path, option, low, model, field, bound):
    param = _param(path, option)
    schema = model.model_json_schema()["properties"][field]
    schema = next((s for s in schema.get("anyOf", []) if "maximum" in s), schema)  # "or null"
    assert (param.type.min, param.type.max) == (low, bound), (option, param.type)
    assert (schema["minimum"], schema["maximum"]) == (low, bound), (field, schema)


def test_steer_lens_options_have_the_http_querys_bounds(tmp_path):
    """``steer lens -k`` / ``--directions`` and ``GET /v1/steers/{ref}/lens`` (``k``, ``n_directions``) repeated
    the numbers 100 / 1024 as literals: one constant each now."""
    from _api_support import settings_for

    from service.api import create_app

    spec = create_app(settings_for(tmp_path)).openapi()["paths"]["/v1/steers/{ref}/lens"]["get"]
    query = {p["name"]: p["schema"] for p in spec["parameters"] if p["in"] == "query"}
    for option, field, bound in (("k", "k", MAX_LENS_K), ("directions", "n_directions", MAX_LENS_DIRECTIONS)):
        param = _param(("steer", "lens"), option)
        assert (param.type.min, param.type.max) == (1, bound), (option, param.type)
        assert (query[field]["minimum"], query[field]["maximum"]) == (1, bound), (field, query[field])


def test_a_batch_size_past_the_http_bound_is_exit_2_naming_the_flag(tmp_path, capsys):
    code, _, err = run_cli(capsys, "--data-dir", tmp_path / "var", "migrate", "--store", f"qdrant://{tmp_path}/qd",
                           "--source", "a", "--target", "b", "--map", "m", "--batch-size", str(MAX_MIGRATE_BATCH + 1))
    assert code == 2 and "--batch-size" in err and f"1<=x<={MAX_MIGRATE_BATCH}" in err, err
