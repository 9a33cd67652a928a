"""The `vecbridge` command: fit → eval gate → transform → registry commands, exit codes, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import align
from service.io import read_vectors, sha256_array, write_vectors
from _servers import ROOT
from conftest import run_cli as run


@pytest.fixture
def data(tmp_path):
    """Paired synthetic embeddings: target = rotated source + noise, 16-d → 16-d, 900 rows."""
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(12, 16)) * 2
    X = centers[rng.integers(0, 12, 900)] + rng.normal(size=(900, 16))
    Q = np.linalg.qr(rng.normal(size=(16, 16)))[0]
    Y = X @ Q + 0.05 * rng.normal(size=X.shape)
    write_vectors(tmp_path / "src.npy", X)
    write_vectors(tmp_path / "tgt.fvecs", Y)
    return tmp_path


def fit_pairs(capsys, d, *extra):
    return run(capsys, "--data-dir", d / "var", "fit", "--pairs", "--source", d / "src.npy", "--target",
               d / "tgt.fvecs", "--rows", "0:600", "--method", "procrustes", "--name", "src->tgt", "--json",
               "--quiet", *extra)


def test_fit_eval_gate_and_lineage(capsys, data):
    code, out, err = fit_pairs(capsys, data, "--alias", "prod", "--tag", "owner=me")
    assert code == 0, err
    v = json.loads(out)
    assert v["version"] == 1 and v["aliases"] == ["prod"] and v["tags"] == {"owner": "me"}
    assert (v["source_space"], v["target_space"], v["method"]) == ("src", "tgt", "procrustes")
    assert v["data_hashes"]["source"] == sha256_array(read_vectors(data / "src.npy", rows="0:600"))
    assert v["inputs"]["source"]["rows"] == "0:600" and v["random_state"] == 0
    assert v["metrics"]["train_top1"] > 0.95
    report = (data / "var" / "reports").rglob("*.html")
    html = next(report).read_text()
    assert html.count("data:image/png;base64,") >= 3 and "src-&gt;tgt" in html
    assert v["report_file"].endswith(".html")

    gate = ["--data-dir", data / "var", "eval", "--map", "src->tgt@prod", "--source", data / "src.npy",
            "--target", data / "tgt.fvecs", "--rows", "600:900"]
    code, out, _ = run(capsys, *gate, "--min-top1", "0.9")
    assert code == 0 and "PASS" in out and "top-1" in out
    for bad in ("1.01", "-0.5", "nan"):  # a gate no top-1 can pass (or, NaN, fail honestly): refused, as over HTTP
        code, out, err = run(capsys, *gate, "--min-top1", bad)
        assert code == 2 and "PASS" not in out + err and "FAIL" not in out + err and "Traceback" not in err
    code, out, err = run(capsys, *gate, "--min-retention", "nan")
    assert code == 2 and "min_retention must be a number in [0, 1]" in err
    # the gate compares against the real number: an identity map fails it
    ident = align.LinearMap(np.eye(16))
    from service.registry import open_registry

    reg = open_registry(f"sqlite:///{(data / 'var' / 'registry.sqlite').resolve()}", data / "var" / "artifacts")
    reg.register_version("src->tgt", ident, source_space="src", target_space="tgt", method="identity", params={},
                         alias="candidate")
    code, out, _ = run(capsys, "--data-dir", data / "var", "eval", "--map", "src->tgt@candidate", "--source",
                       data / "src.npy", "--target", data / "tgt.fvecs", "--rows", "600:900", "--min-top1", "0.5",
                       "--json")
    res = json.loads(out)
    assert code == 1 and res["result"] == "FAIL" and res["n_candidates"] == 300


@pytest.mark.parametrize("out_name", ["out.npy", "out.fvecs", "out.parquet"])
def test_transform_streams_in_chunks(capsys, data, out_name):
    assert fit_pairs(capsys, data)[0] == 0
    code, out, err = run(capsys, "--data-dir", data / "var", "transform", "--map", "src->tgt:1", data / "src.npy",
                         data / out_name, "--chunk-rows", "7", "--quiet", "--json")
    assert code == 0, err
    assert json.loads(out)["rows"] == 900
    from service.registry import open_registry

    reg = open_registry(f"sqlite:///{(data / 'var' / 'registry.sqlite').resolve()}", data / "var" / "artifacts")
    expected = reg.load_map("src->tgt:1").apply(read_vectors(data / "src.npy"))
    np.testing.assert_allclose(read_vectors(data / out_name), expected, atol=1e-6)
    code, _, err = run(capsys, "--data-dir", data / "var", "transform", "--map", "src->tgt", data / "src.npy",
                       data / "o.npy", "--output", "raw", "--rows", "10:20", "--quiet")
    assert code == 0 and read_vectors(data / "o.npy").shape == (10, 16)


def test_a_key_or_column_the_input_format_has_no_use_for_is_refused(capsys, data):
    """``transform --map m x.npy o.npy --key foo`` (or ``--column``) ran, the option ignored without a word: a key
    meant for another file, or a file not the one meant. Refused as ``--encoder`` on a vector file is."""
    assert fit_pairs(capsys, data)[0] == 0
    write_vectors(data / "src.npz", read_vectors(data / "src.npy"))
    for inp, opt, fmt in (("src.npy", "--key", ".npz"), ("src.npy", "--column", ".parquet"),
                          ("src.npz", "--column", ".parquet")):
        code, _, err = run(capsys, "--data-dir", data / "var", "transform", "--map", "src->tgt", data / inp,
                           data / "o.npy", opt, "vectors", "--quiet")
        assert code == 2 and err == f"vecbridge: error: {inp} is not a {fmt} file; {opt} applies to {fmt} files only\n"
        assert not (data / "o.npy").exists()
    code, _, err = fit_pairs(capsys, data, "--target-key", "vectors")
    assert code == 2 and "tgt.fvecs is not a .npz file" in err, err
    code, _, err = run(capsys, "--data-dir", data / "var", "transform", "--map", "src->tgt", data / "src.npz",
                       data / "o.npy", "--key", "vectors", "--quiet")
    assert code == 0 and read_vectors(data / "o.npy").shape == (900, 16), err


def test_a_transform_refused_for_its_map_makes_no_output_folder(capsys, data):
    """The output's folder is checked (made) once the map is known: ``transform --map nosuch x.npy new/sub/o.npy``
    said "unknown map" and left ``new/sub/`` behind."""
    assert fit_pairs(capsys, data)[0] == 0
    code, _, err = run(capsys, "--data-dir", data / "var", "transform", "--map", "nosuch", data / "src.npy",
                       data / "new" / "sub" / "o.npy", "--quiet")
    assert code == 2 and "nosuch" in err and not (data / "new").exists(), err


def test_linear_output_is_documented_as_what_it_computes(capsys, data):
    """``--output linear`` said "x W only" (CLI) and "x W + b as is" (HTTP schema), but it is f_s(x) W + b: the
    source frame (unit rows, centred, unit rows) comes before W. Both texts now say so, and the rows are that."""
    from click.testing import CliRunner

    from service.api.schemas import TransformOptions
    from service.cli.maps import transform
    from service.registry import open_registry

    assert fit_pairs(capsys, data, "--method", "ridge")[0] == 0
    code, _, err = run(capsys, "--data-dir", data / "var", "transform", "--map", "src->tgt", data / "src.npy",
                       data / "lin.npy", "--output", "linear", "--quiet")
    assert code == 0, err
    m = open_registry(f"sqlite:///{(data / 'var' / 'registry.sqlite').resolve()}", data / "var" / "artifacts"
                      ).load_map("src->tgt")
    X = read_vectors(data / "src.npy")
    assert m.bias is not None and m.source_frame.mean is not None
    np.testing.assert_allclose(read_vectors(data / "lin.npy"), m.source_frame.apply(X) @ m.W + m.bias, atol=1e-5)
    helped = " ".join(CliRunner().invoke(transform, ["--help"], terminal_width=1000).output.split())
    schema = TransformOptions.model_json_schema()["properties"]["output"]["description"]
    for text in (helped, schema):
        assert "f_s(x) W + b" in text.replace("`", "") and "source frame" in text, text
        assert "x W only" not in text and "as is" not in text, text


def test_transform_embeds_texts_with_the_source_space_encoder_only(capsys, tmp_path):
    """`transform --encoder multilingual-e5-small` through a map from `minilm` (embedded by all-MiniLM-L6-v2) mapped
    e5 vectors as if they were MiniLM's (same width) and exit 0: rows that find nothing. Another model is refused
    now, as `index create` refuses it, and without --encoder the source space's own encoder embeds the texts
    (it was an error asking for one)."""
    from service.encoders import list_encoders
    from service.registry import open_registry

    pytest.importorskip("sentence_transformers")
    installed = {e["name"] for e in list_encoders() if e["installed"]}
    if not {"all-MiniLM-L6-v2", "multilingual-e5-small"} <= installed:
        pytest.skip("needs the all-MiniLM-L6-v2 and multilingual-e5-small encoders")
    var = tmp_path / "var"
    reg = open_registry(f"sqlite:///{var / 'registry.sqlite'}", var / "artifacts")
    reg.register_space("minilm", 384, encoder="all-MiniLM-L6-v2")
    reg.register_space("e5", 384, encoder="multilingual-e5-small")
    reg.register_version("m", align.LinearMap(np.eye(384)), source_space="minilm", target_space="e5",
                         method="identity", params={})
    (tmp_path / "t.txt").write_text("a cat sits on the mat\nstocks fell sharply\n")
    code, _, err = run(capsys, "--data-dir", var, "transform", "--map", "m", tmp_path / "t.txt", tmp_path / "o.npy",
                       "--encoder", "multilingual-e5-small", "--quiet")
    assert code == 2 and "embedded by 'all-MiniLM-L6-v2'" in err and not (tmp_path / "o.npy").exists()
    code, _, err = run(capsys, "--data-dir", var, "transform", "--map", "m", tmp_path / "t.txt", tmp_path / "o.npy",
                       "--quiet")
    assert code == 0, err
    code, _, err = run(capsys, "--data-dir", var, "transform", "--map", "m", tmp_path / "t.txt", tmp_path / "p.npy",
                       "--encoder", "minilm", "--quiet")  # the same model by its short name: accepted
    assert code == 0, err
    native = read_vectors(tmp_path / "t.txt", encoder="all-MiniLM-L6-v2")
    np.testing.assert_allclose(read_vectors(tmp_path / "o.npy"), native, atol=1e-5)
    np.testing.assert_allclose(read_vectors(tmp_path / "p.npy"), native, atol=1e-5)


def test_transform_reads_the_jsonl_text_field_it_is_given(capsys, tmp_path, monkeypatch):
    """`transform` had no --text-field (fit and every index command have one): a .jsonl whose texts are under
    another key than "text" could not be transformed at all ("line 1 has no string field 'text'")."""
    import service.encoders
    from service.registry import open_registry

    class Fake:  # a 4-d encoder: the text's length and its first letters, no model loaded
        dim = 4

        def encode(self, texts, kind="passage", batch_size=64):
            return np.array([[len(t), ord(t[0]), ord(t[1]), 1.0] for t in texts], np.float32)

    monkeypatch.setattr(service.encoders, "get_encoder", lambda name: Fake())
    var = tmp_path / "var"
    reg = open_registry(f"sqlite:///{var / 'registry.sqlite'}", var / "artifacts")
    reg.register_version("m", align.LinearMap(np.eye(4)), source_space="a", target_space="b", method="identity",
                         params={})
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"id": i, "body": t}) + "\n" for i, t in
                                              enumerate(["a cat", "stocks fell", "rain"])))
    args = ["--data-dir", var, "transform", "--map", "m", tmp_path / "t.jsonl", tmp_path / "o.npy", "--encoder",
            "all-MiniLM-L6-v2", "--chunk-rows", "2", "--quiet"]
    code, _, err = run(capsys, *args)
    assert code == 2 and "no string field 'text'" in err
    code, _, err = run(capsys, *args, "--text-field", "body")
    assert code == 0, err
    np.testing.assert_allclose(read_vectors(tmp_path / "o.npy"), Fake().encode(["a cat", "stocks fell", "rain"]),
                               atol=1e-4)


def test_fit_texts_with_another_model_than_the_space_is_refused_before_embedding(capsys, tmp_path):
    """`fit --source-encoder multilingual-e5-small --source-space minilm` (a space embedded by all-MiniLM-L6-v2, same
    width) embedded the texts with e5 and registered a map of space minilm fitted on e5 vectors. Refused now, before
    any text is embedded (no model is loaded: the encoders need not be installed)."""
    from service.registry import open_registry

    var = tmp_path / "var"
    reg = open_registry(f"sqlite:///{var / 'registry.sqlite'}", var / "artifacts")
    reg.register_space("minilm", 384, encoder="all-MiniLM-L6-v2")
    reg.close()
    (tmp_path / "t.txt").write_text("a cat sits on the mat\nstocks fell sharply\n")
    np.save(tmp_path / "y.npy", np.eye(2, 8, dtype=np.float32))
    code, _, err = run(capsys, "--data-dir", var, "fit", "--method", "procrustes", "--name", "m", "--source",
                       tmp_path / "t.txt", "--source-encoder", "multilingual-e5-small", "--source-space", "minilm",
                       "--target", tmp_path / "y.npy", "--quiet")
    assert code == 2 and "space 'minilm' is embedded by 'all-MiniLM-L6-v2'" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_steer_texts_take_the_space_encoder_and_refuse_another_model(capsys, tmp_path):
    """`steer apply --encoder e5` on a steer of space minilm (same width) steered e5 vectors as MiniLM ones and
    exited 0, and without --encoder it refused a text file ("name an encoder") though the space has one; `steer fit
    --encoder e5 --space minilm` fitted on e5 vectors. Now the space's encoder is the default and another model is
    refused (before anything is embedded); fit and apply read a .jsonl's --text-field. The real MiniLM embeds."""
    from align.steer import Steer
    from service.encoders import get_encoder
    from service.registry import open_registry

    minilm = get_encoder("all-MiniLM-L6-v2")
    var = tmp_path / "var"
    reg = open_registry(f"sqlite:///{var / 'registry.sqlite'}", var / "artifacts")
    reg.register_space("minilm", minilm.dim, encoder="all-MiniLM-L6-v2")
    reg.register_steer("shift", Steer(np.zeros((minilm.dim, 1)), np.zeros((minilm.dim, 1))), space="minilm")  # W = 0
    reg.close()
    texts = ["a cat", "stocks fell", "rain"]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps({"body": t}) + "\n" for t in texts))
    np.save(tmp_path / "y.npy", np.array([1, -1, 1]))
    apply = ["--data-dir", var, "steer", "apply", "--steer", "shift", tmp_path / "q.jsonl", tmp_path / "o.npy"]
    code, _, err = run(capsys, *apply, "--text-field", "body", "--encoder", "multilingual-e5-small")
    assert code == 2 and "space 'minilm' is embedded by 'all-MiniLM-L6-v2'" in err and not (tmp_path / "o.npy").exists()
    code, _, err = run(capsys, *apply, "--text-field", "body")
    assert code == 0, err
    np.testing.assert_allclose(read_vectors(tmp_path / "o.npy"), minilm.encode(texts, "query"), atol=1e-4)
    fit = ["--data-dir", var, "steer", "fit", "--space", "minilm", "--texts", tmp_path / "q.jsonl", "--labels",
           tmp_path / "y.npy", "--name", "s2", "--method", "mean-shift", "--quiet"]
    code, _, err = run(capsys, *fit, "--encoder", "multilingual-e5-small", "--text-field", "body")
    assert code == 2 and "space 'minilm' is embedded by 'all-MiniLM-L6-v2'" in err
    code, _, err = run(capsys, *fit)
    assert code == 2 and "no string field 'text'" in err


def test_registry_commands(capsys, data, tmp_path):
    assert fit_pairs(capsys, data)[0] == 0
    assert fit_pairs(capsys, data, "--format", "npz")[0] == 0
    base = ["--data-dir", data / "var", "registry"]
    code, out, _ = run(capsys, *base, "list", "--json")
    listing = json.loads(out)
    (m,) = listing["maps"]
    assert m["latest_version"] == 2 and [v["version"] for v in m["versions"]] == [1, 2]
    assert m["versions"][1]["artifact_format"] == "npz" and m["versions"][0]["data_hashes"]["target"]
    assert {s["name"] for s in listing["spaces"]} == {"src", "tgt"}
    for cmd in (["alias", "src->tgt", "prod"], ["tag", "src->tgt"], ["delete", "src->tgt"]):
        huge = ["99999999999999999999", *(["k", "v"] if cmd[0] == "tag" else [])]  # past SQLite's 64 bits
        code, _, err = run(capsys, *base, *cmd, *huge)
        assert code == 2 and "must be an integer 1 .. 2147483647" in err and "internal" not in err
    assert run(capsys, *base, "alias", "src->tgt", "prod", "1")[0] == 0
    assert run(capsys, *base, "tag", "src->tgt", "1", "reviewed", "yes")[0] == 0
    code, out, _ = run(capsys, *base, "show", "src->tgt@prod", "--json")
    shown = json.loads(out)
    assert shown["version"] == 1 and shown["tags"] == {"reviewed": "yes"} and shown["aliases"] == ["prod"]
    assert run(capsys, *base, "delete", "src->tgt", "1")[0] == 0
    code, _, err = run(capsys, *base, "show", "src->tgt@prod")
    assert code == 2 and "deleted" in err and len(err.strip().splitlines()) == 1
    code, out, _ = run(capsys, *base, "list")
    assert "latest 2" in out and "versions 1/2" in out
    assert run(capsys, *base, "export", tmp_path / "b.zip")[0] == 0
    code, out, _ = run(capsys, "--data-dir", tmp_path / "other", "registry", "import", tmp_path / "b.zip", "--json")
    assert code == 0 and json.loads(out)["imported"] == 2
    code, out, _ = run(capsys, "--data-dir", tmp_path / "other", "registry", "verify")
    assert code == 0 and json.loads(out)["ok"]
    # --json, as every other command takes it, was "No such option" (exit 2) in a script passing it uniformly
    assert run(capsys, "--data-dir", tmp_path / "other", "registry", "verify", "--json") == (0, out, "")
    code, out, _ = run(capsys, "--data-dir", data / "var", "spaces", "--json")
    assert {s["name"]: s["dim"] for s in json.loads(out)} == {"src": 16, "tgt": 16}
    code, out, _ = run(capsys, *base, "path", "src", "tgt")
    assert code == 0 and "src->tgt:2" in out


#: commands that print no result worth parsing (one confirmation line) or serve: no --json (yet)
NO_JSON = {"serve", "index drop", "registry alias", "registry delete", "registry export", "registry tag", "spaces add",
           "spaces delete", "steer alias", "steer delete"}


def test_every_command_that_prints_a_result_takes_json():
    """`registry verify` prints JSON but refused --json (exit 2), which a script passing it to every command hit.
    Each command takes --json but those in NO_JSON, and those are the gaps there are."""
    import click

    from service.cli import cli

    ctx = click.Context(cli)
    without = set()

    def walk(cmd, path):
        if isinstance(cmd, click.Group):  # `spaces --json` lists; `spaces add ... --json` is the subcommand's
            for n in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, n), [*path, n])
        elif "--json" not in {o for p in cmd.params for o in getattr(p, "opts", [])}:
            without.add(" ".join(path))

    for name in cli.list_commands(ctx):
        walk(cli.get_command(ctx, name), [name])
    assert without == NO_JSON


def test_a_version_argument_takes_ascii_digits_only(capsys, data):
    """VERSION arguments were ``type=int``, which reads '1_0' as 10 and '２' (fullwidth) as 2: `registry delete m
    1_0` deleted m:10 and `registry alias m prod 1_1` moved prod to 11. Now they are read as references' ``:N`` is
    (ASCII digits only; exit 2 naming the argument), and nothing changes."""
    for _ in range(2):
        assert fit_pairs(capsys, data)[0] == 0
    base = ["--data-dir", data / "var"]
    for args in (["registry", "delete", "src->tgt", "1_0"], ["registry", "delete", "src->tgt", "\uff12"],
                 ["registry", "tag", "src->tgt", "1_0", "k", "v"], ["registry", "alias", "src->tgt", "prod", "1_1"],
                 ["registry", "alias", "src->tgt", "prod", "1", "--expect", "+0"], ["steer", "delete", "s", "1_0"],
                 ["steer", "alias", "s", "prod", "\uff12"]):
        code, _, err = run(capsys, *base, *args)
        assert code == 2 and "must be an integer" in err and "in ASCII digits" in err, (args, err)
    code, out, _ = run(capsys, *base, "registry", "list", "--json")
    (m,) = json.loads(out)["maps"]
    assert m["n_live_versions"] == 2 and m["aliases"] == {} and not any(v["tags"] for v in m["versions"]), m
    assert run(capsys, *base, "registry", "delete", "src->tgt", "2")[0] == 0


def test_a_space_named_after_a_file_stem_is_a_valid_name(capsys, data, tmp_path):
    """Without --source-space / --target-space a space is named after the file's stem: `mini..lm.npy` was "source
    space 'mini..lm' is not allowed" and a 140-character stem "longer than 128 characters". Now the stem is made a
    valid name ('..' as '.', cut to 128)."""
    import shutil

    src, tgt = tmp_path / "mini..lm.npy", tmp_path / ("e" * 140 + ".npy")
    shutil.copy(data / "src.npy", src)
    np.save(tgt, read_vectors(data / "tgt.fvecs"))
    code, out, err = run(capsys, "--data-dir", tmp_path / "var", "fit", "--source", src, "--target", tgt, "--rows",
                         "0:600", "--method", "procrustes", "--name", "m", "--quiet", "--json")
    assert code == 0, err
    assert (json.loads(out)["source_space"], json.loads(out)["target_space"]) == ("mini.lm", "e" * 128)


def test_two_files_whose_stems_name_one_space_are_refused(capsys, data, tmp_path):
    """`fit --source old/embeddings.npy --target new/embeddings.npy` registered `embeddings -> embeddings` (both spaces
    defaulted to the stem), and `index search --space embeddings` then applied no map: wrong rows, no word. Stems
    with no letter or digit (`旧.npy`, `新.npy`) both became '_'. Now such a default is refused (exit 2, nothing
    registered) and says to name the spaces; named, or one file read twice, the fit goes through."""
    import shutil

    for a, b in (("old/embeddings.npy", "new/embeddings.npy"), ("旧.npy", "新.npy"), ("x/___.npy", "y/___.npy")):
        for rel, orig in ((a, "src.npy"), (b, "tgt.fvecs")):
            (tmp_path / rel).parent.mkdir(exist_ok=True)
            np.save(tmp_path / rel, read_vectors(data / orig))
    var = tmp_path / "var"
    base = ["--data-dir", var, "fit", "--rows", "0:600", "--method", "procrustes", "--name", "m", "--quiet", "--json"]
    for a, b, extra, said in [
            ("old/embeddings.npy", "new/embeddings.npy", [], "would both be space 'embeddings'"),
            ("old/embeddings.npy", "new/embeddings.npy", ["--source-space", "embeddings"], "would both be space"),
            ("旧.npy", "新.npy", [], "--source " + str(tmp_path / "旧.npy") + ": its file name makes no space name"),
            ("旧.npy", "新.npy", ["--source-space", "old"], "--target-space"),
            ("x/___.npy", "y/___.npy", [], "name the space with --source-space")]:
        code, out, err = run(capsys, *base, "--source", tmp_path / a, "--target", tmp_path / b, *extra)
        assert code == 2 and out == "" and said in err and "-space" in err, (a, extra, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert run(capsys, "--data-dir", var, "registry", "list", "--json")[1].count('"name"') == 0
    code, out, err = run(capsys, *base, "--source", tmp_path / "old/embeddings.npy", "--target",
                         tmp_path / "new/embeddings.npy", "--source-space", "old", "--target-space", "new")
    assert code == 0, err
    assert (json.loads(out)["source_space"], json.loads(out)["target_space"]) == ("old", "new")
    shutil.copy(data / "src.npy", tmp_path / "old" / "same.npy")  # one file, two row ranges: truly one space
    code, out, err = run(capsys, *base, "--source", tmp_path / "old/same.npy", "--target", tmp_path / "old/same.npy",
                         "--source-rows", "0:300", "--target-rows", "300:600", "--name", "within", "--allow-unreliable")
    assert code == 0, err
    assert (json.loads(out)["source_space"], json.loads(out)["target_space"]) == ("same", "same")


@pytest.mark.parametrize("args, message", [
    (["--source", "{d}/missing.npy"], "no such file"),
    (["--rows", "0:5000"], "outside"),
    (["--unpaired"], "needs paired rows"),
    (["--source-rows", "0:10", "--target-rows", "0:20"], "as many source rows"),
    (["--name", "../etc/passwd"], "not allowed"),
    (["--param", "bogus=1"], "bad parameter"),
    # accepted, and the fit failed late saying "scale the map"; the range read "[1, 1.04858e+06]"
    (["--method", "ridge", "--param", "alpha=1e308"], "alpha must be a number in [0, 1e+12], got 1e+308"),
    (["--method", "lowrank", "--param", "rank=2097152"], "rank must be an integer in [1, 1048576]"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, data, args, message):
    base = {"--source": str(data / "src.npy"), "--target": str(data / "tgt.fvecs"), "--method": "procrustes",
            "--name": "m"}
    args = [a.replace("{d}", str(data)) for a in args]
    for k in list(base):
        if k in args:
            base.pop(k)
    flat = [x for kv in base.items() for x in kv]
    code, out, err = run(capsys, "--data-dir", data / "var", "fit", "--quiet", *flat, *args)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err and "Traceback" not in err


def test_semi_supervised_is_refused_for_a_fit_of_pairs(capsys, data):
    # it needs unpaired rows of both models, which a fit of pairs without both never has: it was accepted, never ran,
    # and the registry recorded semi_supervised: sinkhorn while the map's metadata said applied False
    code, _, err = fit_pairs(capsys, data, "--param", 'semi_supervised="sinkhorn"', "--method", "auto")
    assert code == 2 and "is not given both" in err and "--unpaired-target" in err and "Traceback" not in err
    code, out, _ = run(capsys, "--data-dir", data / "var", "registry", "list", "--json")
    assert code == 0 and "src->tgt" not in out


def test_nan_input_and_unknown_map(capsys, data):
    X = read_vectors(data / "src.npy")
    X[3, 2] = np.nan
    write_vectors(data / "nan.npy", X)
    code, _, err = run(capsys, "--data-dir", data / "var", "fit", "--pairs", "--quiet", "--source", data / "nan.npy",
                       "--target", data / "tgt.fvecs", "--method", "ridge", "--name", "m")
    assert code == 2 and "NaN" in err
    code, _, err = run(capsys, "--data-dir", data / "var", "eval", "--map", "nope", "--source", data / "src.npy",
                       "--target", data / "tgt.fvecs")
    assert code == 2 and "unknown map" in err


def fit_unpaired_small(capsys, data, name: str, params: list[str], *extra):
    """``vecbridge fit --unpaired --method minivec2vec`` on rows 0:450 -> 450:900 with ``params`` (``--param`` each),
    ``--json --quiet --allow-unreliable``: a tiny configuration, so the plumbing is tested, not the map."""
    return run(capsys, "--data-dir", data / "var", "fit", "--unpaired", "--source", data / "src.npy", "--rows", "0:450",
               "--target", data / "tgt.fvecs", "--target-rows", "450:900", "--method", "minivec2vec", "--name", name,
               *extra, "--json", "--quiet", "--allow-unreliable", *[x for p in params for x in ("--param", p)])


def test_published_preset_is_selectable(capsys, data):
    small = ["preset=\"published\"", "n_anchor_runs=2", "anchor_sample=300", "qap_restarts=2", "refine1_iters=3",
             "refine1_sample=200", "refine2_clusters=20", "criterion_sample=300"]
    code, out, err = fit_unpaired_small(capsys, data, "p", small)
    assert code == 0, err
    v = json.loads(out)
    assert v["params"]["preset"] == "published" and v["params"]["qap_method"] == "2opt"
    code, _, err = run(capsys, "--data-dir", data / "var", "fit", "--unpaired", "--source", data / "src.npy",
                       "--target", data / "tgt.fvecs", "--method", "minivec2vec", "--name", "q",
                       "--param", "preset=\"bogus\"", "--quiet")
    assert code == 2 and "preset must be" in err


def test_unpaired_minivec2vec_with_small_parameters(capsys, data):
    small = ["n_anchor_runs=2", "anchor_sample=300", "qap_restarts=2", "refine1_iters=3", "refine1_sample=200",
             "self_learning_rounds=1", "criterion_sample=300", "n_restarts=2"]
    code, out, err = fit_unpaired_small(capsys, data, "u", small, "--random-state", "3")
    assert code == 0, err
    v = json.loads(out)
    assert v["method"] == "minivec2vec" and v["random_state"] == 3 and v["params"]["n_restarts"] == 2
    # the fast preset's settings are recorded too (lineage: every parameter, defaults included)
    assert v["params"]["qap_method"] == "faq+2opt" and v["params"]["preset"] == "fast"
    assert len(v["metrics"]["criteria"]) == 2 and 0 <= v["metrics"]["mnn_frac"] <= 1
    html = open(v["report_file"]).read()
    assert "Selection criterion across restarts" in html and "Refinement iterations" in html


def test_fit_sample_reaches_the_fit_and_is_checked(capsys, data):
    """``--param fit_sample=N`` caps the rows per side the unpaired fit works on (the lineage records it);
    a value the estimator refuses is exit 2 with its message, nothing registered."""
    small = ["n_anchor_runs=2", "anchor_sample=300", "qap_restarts=2", "refine1_iters=3", "refine1_sample=200",
             "self_learning_rounds=1", "criterion_sample=300", "n_restarts=1"]
    code, out, err = fit_unpaired_small(capsys, data, "capped", small + ["fit_sample=1000"])
    assert code == 0, err
    assert json.loads(out)["params"]["fit_sample"] == 1000
    code, out, err = fit_unpaired_small(capsys, data, "bad-cap", small + ["fit_sample=10"])
    assert code == 2 and "fit_sample must be None or an integer >= 1000" in err
    code, out, err = run(capsys, "--data-dir", data / "var", "registry", "list", "--json")
    assert code == 0 and [m["name"] for m in json.loads(out)["maps"]] == ["capped"]


def test_seed_pairs_need_minivec2vec(capsys, data):
    (data / "seeds.txt").write_text("0 0\n1 1\n")
    code, _, err = run(capsys, "--data-dir", data / "var", "fit", "--pairs", "--quiet", "--source", data / "src.npy",
                       "--target", data / "tgt.fvecs", "--method", "procrustes", "--name", "m", "--seed-pairs",
                       data / "seeds.txt")
    assert code == 2 and "minivec2vec" in err


def test_console_script_exit_codes(data, tmp_path):
    """The installed entry point, as CI calls it: no traceback, exit 2 on bad input."""
    p = subprocess.run([sys.executable, "-c", "import sys; from service.cli import main; sys.exit(main())",
                        "--data-dir", str(tmp_path / "v"), "eval", "--map", "x", "--source", str(data / "nope.npy"),
                        "--target", str(data / "tgt.fvecs")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.startswith("vecbridge: error:")
    p = subprocess.run([sys.executable, "-c", "import sys; from service.cli import main; sys.exit(main())",
                        "fit", "--bogus-flag"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr


@pytest.mark.parametrize("args, message, command", [
    (["eval", "--min-retention", "x"], "Invalid value for '--min-retention': 'x' is not a valid float range.",
     "vecbridge eval"),
    (["index", "drop", "docs"], "dropping 'docs' removes every row; add --yes", "vecbridge index drop"),
    (["registry", "tag", "p", "1", "k"], "give a VALUE (or --delete)", "vecbridge registry tag"),
    (["fit", "--bogus-flag"], "No such option '--bogus-flag'.", "vecbridge fit"),
])
def test_a_usage_error_is_one_line_with_the_prefix(tmp_path, args, message, command):
    """click's usage errors, and the project's own ``click.UsageError``s, were four lines without the
    ``vecbridge: error:`` prefix (``Usage: vecbridge eval [OPTIONS]``, ``Try 'vecbridge eval --help' for help.``,
    a blank line, ``Error: ...``): a cron mail or a log grep saw the usage, not the error. Now one line, exit 2."""
    p = subprocess.run([sys.executable, "-m", "service.cli", "--data-dir", str(tmp_path / "v"), *args],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert p.returncode == 2 and p.stdout == "", p.stderr
    assert p.stderr == f"vecbridge: error: {message} (see '{command} --help')\n", p.stderr


def test_no_command_still_prints_the_help():
    """``vecbridge`` (or ``vecbridge index``) alone still prints the usage and commands, not an error line."""
    p = subprocess.run([sys.executable, "-m", "service.cli"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       check=False)
    assert p.returncode == 2 and p.stderr.startswith("Usage: vecbridge [OPTIONS] COMMAND") and "fit" in p.stderr


def test_output_whose_reader_went_away_exits_141_quietly(tmp_path):
    """``vecbridge index search ... | head -1`` under ``set -o pipefail``: the write after ``head`` ended raised
    EPIPE and click's handler exited 1, the code of an eval FAIL. Now 141 (128 + SIGPIPE, what a shell reports for
    a writer SIGPIPE killed), nothing on stderr; the command itself ran (here: the space is registered)."""
    var = str(tmp_path / "v")
    for args in (["spaces", "add", "s", "--dim", "4"], ["spaces"], ["registry", "list", "--json"]):
        child = subprocess.Popen([sys.executable, "-m", "service.cli", "--data-dir", var, *args], cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        child.stdout.close()  # the reader is gone before the first line is written
        err = child.stderr.read()
        assert child.wait(timeout=120) == 141 and err == "", (args, child.returncode, err)
    p = subprocess.run([sys.executable, "-m", "service.cli", "--data-dir", var, "spaces"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0 and p.stdout.startswith("s "), p.stdout + p.stderr


def test_help_and_error_lines_whose_reader_went_away_exit_141_too(tmp_path):
    """Review: ``vecbridge --help | true`` exited 1 (click's EPIPE exit, before any command ran), and an error line
    written to a stderr whose reader went away escaped as a BrokenPipeError traceback (exit 1)."""
    var = str(tmp_path / "v")
    for args, closed in ((["--help"], "stdout"), (["registry", "show", "nosuch"], "stderr")):
        child = subprocess.Popen([sys.executable, "-m", "service.cli", "--data-dir", var, *args], cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        getattr(child, closed).close()
        other = (child.stderr if closed == "stdout" else child.stdout).read()
        assert child.wait(timeout=120) == 141 and "Traceback" not in other, (args, child.returncode, other)


def test_errors_read_one_line_with_click_8_1_too(tmp_path):
    """pyproject allows click 8.1, which has no NoArgsIsHelpError: naming it in an ``except`` turned every error
    (a usage error, an unknown map) into an AttributeError traceback. Run with that class removed, as on 8.1."""
    code = ("import sys, click.exceptions as e; del e.NoArgsIsHelpError; from service.cli import main; "
            f"sys.exit(main(['--data-dir', {str(tmp_path / 'v')!r}, *sys.argv[1:]]))")
    for args, says in ((["--bogus"], "No such option"), (["registry", "show", "nosuch"], "no registry at")):
        p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                           cwd=ROOT, check=False)
        assert p.returncode == 2 and says in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_json_output_is_valid_json_when_a_figure_is_undefined(capsys, data):
    """`eval --json` on two pairs printed bare NaN for the figures undefined on so few rows (retention,
    nn_retention@10): not JSON, rejected by strict parsers and jq. Now null."""
    code, _, err = fit_pairs(capsys, data)
    assert code == 0, err
    code, out, err = run(capsys, "--data-dir", data / "var", "eval", "--map", "src->tgt", "--source",
                         data / "src.npy", "--target", data / "tgt.fvecs", "--rows", "600:602", "--json")
    assert code == 0, err
    assert "NaN" not in out and "Infinity" not in out
    res = json.loads(out, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert res["retention"] is None and res["top1"] >= 0


def test_the_at_10_proxies_are_undefined_on_fewer_than_12_pairs_and_not_gated(capsys, data):
    """On 3 held-out pairs nn_retention@10 / overlap@10 were computed at k = 1 / 2 under the @10 name ("@10 0.6667")
    and gated. Now they are undefined below 12 / 11 distinct pairs and a gate on the proxy there is exit 2."""
    code, _, err = fit_pairs(capsys, data)
    assert code == 0, err
    common = ["--data-dir", data / "var", "eval", "--map", "src->tgt", "--source", data / "src.npy", "--target",
              data / "tgt.fvecs"]
    code, out, err = run(capsys, *common, "--rows", "600:603", "--json")
    res = json.loads(out)
    assert code == 0 and res["retrieval"]["nn_retention@10"] is None and res["retrieval"]["overlap@10"] is None, err
    code, out, err = run(capsys, *common, "--rows", "600:603")
    assert code == 0 and "nn_retention@10 undefined (fewer than 12 pairs)" in out, err
    assert "overlap@10 undefined (fewer than 11 pairs)" in out
    code, out, err = run(capsys, *common, "--rows", "600:611", "--min-retention", "0.5")
    assert code == 2 and "at least 12 distinct held-out pairs" in err and "got 11" in err, (out, err)
    code, out, err = run(capsys, *common, "--rows", "600:612", "--json")
    assert code == 0 and json.loads(out)["retrieval"]["nn_retention@10"] >= 0, err
    # defined on 12, but a random map keeps each row in a random top 10 of 11 (10/11): no gate above 0 is decided;
    # a gate of 0, which no figure fails, passes, saying the figure tells nothing of the map
    code, out, err = run(capsys, *common, "--rows", "600:612", "--min-retention", "0.01")
    assert code == 2 and "a random map keeps as many" in err, (out, err)
    code, out, err = run(capsys, *common, "--rows", "600:612", "--min-retention", "0.0")
    assert code == 0 and "PASS" in out and "says nothing of the map" in out + err, (out, err)


def test_a_space_a_fit_creates_from_texts_records_their_encoder(capsys, tmp_path, monkeypatch):
    """`fit --source t.txt --source-encoder all-MiniLM-L6-v2` made the space with no encoder (`spaces` said
    encoder=-), so a later text `transform` asked for --encoder though its help says the space's is the default."""
    import service.encoders

    class Fake:  # a 4-d encoder without a model: the text's length and letters
        dim = 4

        def encode(self, texts, kind="passage", batch_size=64):
            return np.array([[len(t), ord(t[0]), ord(t[-1]), 1.0] for t in texts], np.float32)

    monkeypatch.setattr(service.encoders, "get_encoder", lambda name: Fake())
    words = [f"{a}{b} text {i}" for i, (a, b) in enumerate(zip("abcdefghijklmnopqrst", "zyxwvutsrqponmlkjihg"))]
    (tmp_path / "t.txt").write_text("\n".join(words) + "\n")
    np.save(tmp_path / "y.npy", Fake().encode(words) @ np.linalg.qr(np.random.default_rng(0).normal(size=(4, 4)))[0])
    var = tmp_path / "var"
    code, _, err = run(capsys, "--data-dir", var, "fit", "--method", "procrustes", "--name", "m", "--source",
                       tmp_path / "t.txt", "--source-encoder", "minilm", "--source-space", "words", "--target",
                       tmp_path / "y.npy", "--target-space", "vecs", "--quiet")
    assert code in (0, 1), err
    code, out, _ = run(capsys, "--data-dir", var, "spaces", "--json")
    got = {s["name"]: s["encoder"] for s in json.loads(out)}
    assert got == {"words": "all-MiniLM-L6-v2", "vecs": None}, got
    code, _, err = run(capsys, "--data-dir", var, "transform", "--map", "m:1", tmp_path / "t.txt", tmp_path / "o.npy",
                       "--quiet")  # no --encoder: the space's own
    assert code == 0 and read_vectors(tmp_path / "o.npy").shape == (20, 4), err


def test_json_output_of_a_text_transform_has_nothing_on_stderr(tmp_path):
    """`transform --json` of texts (a fresh process loads MiniLM) left transformers' "Loading weights 103/103" bar
    on stderr, where the README promises a --json result is the whole output, nothing on either stream."""
    pytest.importorskip("sentence_transformers")
    from service.registry import open_registry

    var = tmp_path / "var"
    reg = open_registry(f"sqlite:///{var / 'registry.sqlite'}", var / "artifacts")
    reg.register_space("minilm", 384, encoder="all-MiniLM-L6-v2")
    reg.register_space("other", 384)
    reg.register_version("m", align.LinearMap(np.eye(384, dtype=np.float32)), source_space="minilm",
                         target_space="other", method="procrustes", params={})
    reg.close()
    (tmp_path / "t.txt").write_text("a dog\na cat\n")
    p = subprocess.run([sys.executable, "-c", "import sys; from service.cli import main; sys.exit(main())",
                        "--data-dir", str(var), "transform", "--map", "m", str(tmp_path / "t.txt"),
                        str(tmp_path / "out.npy"), "--encoder", "minilm", "--json"],
                       capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr
    assert p.stderr == "" and json.loads(p.stdout), p.stderr[-500:]


def test_fit_tags_are_stored_as_typed(capsys, data):
    """`fit --tag` parsed each value as JSON and stored Python's str() of it: f=1.50 became "1.5", flag=true "True",
    a JSON object its Python repr; `registry tag` and HTTP store the text given."""
    code, out, err = run(capsys, "--data-dir", data / "var", "fit", "--pairs", "--quiet", "--source", data / "src.npy",
                         "--target", data / "tgt.fvecs", "--method", "procrustes", "--name", "tagged", "--json",
                         "--tag", "f=1.50", "--tag", "flag=true", "--tag", 'meta={"a": 1}', "--tag", "id=8e10")
    assert code == 0, err
    assert json.loads(out)["tags"] == {"f": "1.50", "flag": "true", "meta": '{"a": 1}', "id": "8e10"}


def test_text_inputs_embed_with_the_spaces_models(tmp_path, capsys):
    """`eval` embedded text files with whatever encoders it was given: swapped (e5 for the map's MiniLM side) it ran
    and printed top-1 0.003. `fit` and `eval` also asked for an encoder the registered space already names."""
    pytest.importorskip("sentence_transformers")
    from service.ops.demo import load_demo_data
    from service.registry import open_registry

    texts, _, _, _ = load_demo_data()
    (tmp_path / "t.txt").write_text("\n".join(texts[:120]) + "\n")
    var = tmp_path / "var"
    reg = open_registry(f"sqlite:///{var / 'registry.sqlite'}", var / "artifacts")
    reg.register_space("minilm", 384, encoder="all-MiniLM-L6-v2")
    reg.register_space("e5", 384, encoder="multilingual-e5-small")
    reg.close()
    code, _, err = run(capsys, "--data-dir", var, "fit", "--pairs", "--source", tmp_path / "t.txt", "--target",
                       tmp_path / "t.txt", "--source-space", "minilm", "--target-space", "e5", "--rows", "0:100",
                       "--method", "procrustes", "--name", "m2e", "--quiet")  # no encoder named: the spaces'
    assert code == 0, err
    ev = ["--data-dir", var, "eval", "--map", "m2e", "--source", tmp_path / "t.txt", "--target", tmp_path / "t.txt",
          "--rows", "100:120", "--json"]
    code, out, err = run(capsys, *ev)
    assert code == 0 and json.loads(out)["top1"] > 0.5, err
    code, _, err = run(capsys, *ev, "--source-encoder", "e5", "--target-encoder", "minilm")
    assert code == 2 and "space 'minilm' is embedded by 'all-MiniLM-L6-v2'" in err


@pytest.mark.parametrize("blocked", ["var/artifacts", "var/artifacts/tmp"])
def test_fit_with_a_file_where_the_artifact_folder_goes_names_it(capsys, data, blocked):
    """A file at DATA_DIR/artifacts made `fit` print "error: [Errno 17] File exists: .../artifacts" (the same for
    the reports folder names it): the message says which folder could not be made and why, exit 2 (I/O)."""
    (data / blocked).parent.mkdir(parents=True, exist_ok=True)
    (data / blocked).write_text("not a folder")
    code, out, err = fit_pairs(capsys, data)
    assert code == 2 and out == "", (code, out, err)
    assert "Errno" not in err and "Traceback" not in err, err
    assert f"{data / blocked} is a file, not a folder" in err and "artifact folder" in err, err


def test_an_artifact_folder_this_user_cannot_make_is_named_not_a_bare_errno(tmp_path):
    """Opening a registry whose artifact folder lies under a folder this user cannot write raised a bare
    PermissionError ("[Errno 13] Permission denied: '...'", naming neither the setting nor why): it is an
    InputError (exit 2) naming the artifact folder and where it may not write. Root writes anywhere, so the child
    runs as the image's user (uid 10001) under setpriv."""
    import os
    import shutil
    import tempfile

    as_user = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv")
        as_user = ["setpriv", "--reuid=10001", "--regid=10001", "--clear-groups"]
    base = tempfile.mkdtemp(prefix="vb-art-")  # world-readable (pytest's tmp is 0700)
    try:
        os.chmod(base, 0o777)
        locked = os.path.join(base, "locked")
        os.mkdir(locked, 0o555)
        os.chmod(locked, 0o555)
        env = {k: v for k, v in os.environ.items() if not k.startswith("VECBRIDGE_")} | {"HOME": base}
        opens = ("import sys; from service.registry import open_registry; from align.exceptions import InputError\n"
                 "try:\n    open_registry(f'sqlite:///{sys.argv[1]}/registry.sqlite', sys.argv[2])\n"
                 "except InputError as e:\n    print(e); sys.exit(2)")
        r = subprocess.run([*as_user, sys.executable, "-c", opens, base, os.path.join(locked, "artifacts")], env=env,
                           cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
        assert r.returncode == 2 and "Errno" not in r.stdout and "Traceback" not in r.stderr, (r.stdout, r.stderr)
        assert f"artifact folder {locked}/artifacts cannot be made: this user may not write in {locked}" in r.stdout
    finally:
        os.chmod(os.path.join(base, "locked"), 0o755)
        shutil.rmtree(base)
