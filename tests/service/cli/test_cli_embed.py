"""``vecbridge embed``: texts into a vector file with an installed encoder, the code of ``POST /v1/embeddings``.

The README's migration walk-through said "re-embed those rows' texts with the new model" and gave no command; a
user of sentence-transformers or text-embeddings-inference expects one. Real encoders (MiniLM, the fastest; e5 for
its query / passage forms)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import run_cli as run
from service.io import read_vectors

TEXTS = ["a small domesticated carnivore", "a financial institution that accepts deposits",
         "the act of running quickly", "a building for worship", "frozen water"]


@pytest.fixture(scope="module")
def encoders():
    pytest.importorskip("sentence_transformers")
    from service.encoders import get_encoder, list_encoders

    installed = {e["name"] for e in list_encoders() if e["installed"]}
    if not {"all-MiniLM-L6-v2", "multilingual-e5-small"} <= installed:
        pytest.skip("needs the all-MiniLM-L6-v2 and multilingual-e5-small encoders")
    return {"minilm": get_encoder("minilm"), "e5": get_encoder("e5")}


@pytest.fixture
def texts(tmp_path):
    (tmp_path / "t.txt").write_text("".join(t + "\n" for t in TEXTS))
    (tmp_path / "t.json").write_text(json.dumps(TEXTS))
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"id": i, "body": t}) + "\n" for i, t in enumerate(TEXTS)))
    return tmp_path


def test_embed_writes_the_encoders_vectors_in_every_output_format(capsys, encoders, texts):
    want = encoders["minilm"].encode(TEXTS, "passage")
    for out in ("o.npy", "o.fvecs", "o.parquet"):
        code, stdout, err = run(capsys, "embed", "--encoder", "minilm", texts / "t.txt", texts / out, "--quiet")
        assert code == 0, err
        assert f"wrote 5 rows (384-d, passage) to {texts / out} with all-MiniLM-L6-v2" in stdout
        got = read_vectors(texts / out)
        assert got.shape == (5, 384)
        np.testing.assert_allclose(got, want, atol=1e-5)
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # unit rows


def test_embed_json_summary_and_jsonl_text_field(capsys, encoders, texts):
    args = ["embed", "--encoder", "all-MiniLM-L6-v2", texts / "t.jsonl", texts / "o.npy", "--chunk-rows", "2"]
    code, _, err = run(capsys, *args, "--quiet")
    assert code == 2 and "no string field 'text'" in err and not (texts / "o.npy").exists()
    code, out, err = run(capsys, *args, "--text-field", "body", "--json")
    assert code == 0, err
    assert json.loads(out) == {"encoder": "all-MiniLM-L6-v2", "kind": "passage", "rows": 5, "dim": 384,
                               "out": str(texts / "o.npy"), "truncated": 0, "max_tokens": 256}
    np.testing.assert_allclose(np.load(texts / "o.npy"), encoders["minilm"].encode(TEXTS, "passage"), atol=1e-5)


def test_embed_rows_a_range_or_a_rows_file_in_its_order(capsys, encoders, texts):
    """--rows as every command takes it: START:STOP (negative from the end), or the rows file `plan --rows-out`
    writes, read in the order listed: row i of OUT embeds the i-th listed text."""
    np.save(texts / "rows.npy", np.array([3, 0, 4], dtype=np.int64))
    code, _, err = run(capsys, "embed", "--encoder", "minilm", "--rows", texts / "rows.npy", texts / "t.json",
                       texts / "a.npy", "--quiet")
    assert code == 0, err
    want = encoders["minilm"].encode([TEXTS[3], TEXTS[0], TEXTS[4]], "passage")
    np.testing.assert_allclose(np.load(texts / "a.npy"), want, atol=1e-5)
    code, _, err = run(capsys, "embed", "--encoder", "minilm", "--rows", "-2:", texts / "t.json", texts / "b.npy",
                       "--quiet")
    assert code == 0, err
    np.testing.assert_allclose(np.load(texts / "b.npy"), encoders["minilm"].encode(TEXTS[-2:], "passage"), atol=1e-5)


def test_embed_kind_query_is_e5s_query_form(capsys, encoders, texts):
    """e5 embeds "query: TEXT" and "passage: TEXT" (queries in passage form retrieved worse on WordNet); --kind
    chooses, passage by default, as the e5 rows of the shared WordNet set were embedded."""
    for kind, out in (("query", "q.npy"), ("passage", "p.npy")):
        code, stdout, err = run(capsys, "embed", "--encoder", "e5", "--kind", kind, texts / "t.txt", texts / out,
                                "--quiet")
        assert code == 0, err
        assert f"(384-d, {kind})" in stdout
        np.testing.assert_allclose(np.load(texts / out), encoders["e5"].encode(TEXTS, kind), atol=1e-5)
    code, _, err = run(capsys, "embed", "--encoder", "e5", texts / "t.txt", texts / "d.npy", "--quiet")
    assert code == 0, err
    q, p = np.load(texts / "q.npy"), np.load(texts / "p.npy")
    np.testing.assert_array_equal(np.load(texts / "d.npy"), p)
    assert np.sum(q * p, axis=1).max() < 0.99  # the two forms are different vectors of the same texts


def test_embed_gives_what_post_v1_embeddings_gives(capsys, encoders, texts):
    """One code path: the CLI's rows are the HTTP route's, query form included."""
    from fastapi.testclient import TestClient

    from _api_support import R, settings_for
    from service.api import create_app

    code, _, err = run(capsys, "embed", "--encoder", "e5", "--kind", "query", texts / "t.txt", texts / "q.npy",
                       "--quiet")
    assert code == 0, err
    with TestClient(create_app(settings_for(texts))) as c:
        r = c.post("/v1/embeddings", headers=R, json={"model": "e5", "input": TEXTS, "input_type": "query"})
    assert r.status_code == 200, r.text
    http = np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
    np.testing.assert_allclose(np.load(texts / "q.npy"), http, atol=1e-6)


@pytest.mark.parametrize("args, message", [
    (["--encoder", "nope", "t.txt", "o.npy"], "unknown encoder 'nope'; known: all-MiniLM-L6-v2, multilingual-e5-small"),
    (["--encoder", "minilm", "empty.json", "o.npy"], "empty.json: no texts to embed"),
    (["--encoder", "minilm", "blank.txt", "o.npy"], "blank.txt: line 2 is blank"),
    (["--encoder", "minilm", "invisible.json", "o.npy"], "invisible.json: row 1 holds no text"),
    (["--encoder", "minilm", "--rows", "3:9", "t.txt", "o.npy"], "t.txt: rows 3:9 are outside the file's 5 rows"),
    (["--encoder", "minilm", "--rows", "far.npy", "t.txt", "o.npy"], "row index 7 is outside the file's 5 rows"),
    (["--encoder", "minilm", "v.npy", "o.npy"], "v.npy: embed reads texts (.txt, .jsonl, .json)"),
    (["--encoder", "minilm", "t.txt", "o.txt"], "o.txt: the output must be .npy, .fvecs, .parquet"),
    (["--encoder", "minilm", "--kind", "doc", "t.txt", "o.npy"], "'doc' is not one of 'passage', 'query'"),
    (["--encoder", "minilm", "t.txt", "t.txt"], "would replace the input"),
])
def test_embed_bad_input_is_one_line_and_exit_2(capsys, encoders, texts, monkeypatch, args, message):
    (texts / "empty.json").write_text("[]")
    (texts / "blank.txt").write_text("a cat\n\nrain\n")
    (texts / "invisible.json").write_text(json.dumps(["a cat", "\u200b "]))
    np.save(texts / "far.npy", np.array([0, 7], dtype=np.int64))
    np.save(texts / "v.npy", np.zeros((2, 384), np.float32))
    monkeypatch.chdir(texts)
    code, out, err = run(capsys, "embed", *args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("vecbridge: error: ") and message in err, (code, err)
    assert out == "" and not (texts / "o.npy").exists() and not (texts / "o.txt").exists()
    assert not [p for p in texts.iterdir() if ".part-" in p.name]  # no temporary output left


def test_embed_space_registers_the_encoder_and_refuses_another(capsys, encoders, texts):
    """--space as `index create` takes it: a new space is registered with the encoder (so a later text input of that
    space needs no --encoder); a space of another encoder or width is refused before anything is embedded."""
    from service.registry import open_registry

    var = texts / "var"
    code, out, err = run(capsys, "--data-dir", var, "embed", "--encoder", "minilm", "--space", "old", texts / "t.txt",
                         texts / "o.npy", "--quiet")
    assert code == 0 and "(space old)" in out, err
    reg = open_registry(f"sqlite:///{var / 'registry.sqlite'}", var / "artifacts")
    info = reg.get_space("old")
    assert (info.dim, info.encoder) == (384, "all-MiniLM-L6-v2")
    reg.register_space("wide", 768)
    for space, message in (("old", "space 'old' is embedded by 'all-MiniLM-L6-v2'; texts embedded by "
                                   "'multilingual-e5-small' would not be comparable with its vectors (embed them with "
                                   "--encoder all-MiniLM-L6-v2, or give another --space)"),  # not "omit the encoder"
                           ("wide", "space 'wide' is 768-d; multilingual-e5-small embeds 384-d")):
        code, out, err = run(capsys, "--data-dir", var, "embed", "--encoder", "e5", "--space", space,
                             texts / "t.txt", texts / "x.npy", "--quiet")
        assert code == 2 and message in err and not (texts / "x.npy").exists(), err
    assert reg.get_space("wide").encoder is None


def test_embed_space_compares_models_not_names(capsys, encoders, texts):
    """Review: a space registered through the Python Registry with the hub id of our MiniLM
    ('sentence-transformers/all-MiniLM-L6-v2') was "another model" than --encoder minilm, and the message suggested
    --encoder sentence-transformers/all-MiniLM-L6-v2, itself refused ("unknown encoder"). The hub id is MiniLM: it
    embeds; e5 is refused naming a name --encoder takes, which works. A model this release does not know is said so,
    with no --encoder hint."""
    from service.registry import open_registry

    var = texts / "var"
    reg = open_registry(f"sqlite:///{var / 'registry.sqlite'}", var / "artifacts")
    reg.register_space("theirs", 384, encoder="sentence-transformers/all-MiniLM-L6-v2")
    reg.register_space("odd", 384, encoder="BAAI/bge-small-en-v1.5")
    code, out, err = run(capsys, "--data-dir", var, "embed", "--encoder", "minilm", "--space", "theirs",
                         texts / "t.txt", texts / "o.npy", "--quiet")
    assert code == 0 and "(space theirs)" in out, err
    code, out, err = run(capsys, "--data-dir", var, "embed", "--encoder", "e5", "--space", "theirs",
                         texts / "t.txt", texts / "x.npy", "--quiet")
    assert code == 2 and not (texts / "x.npy").exists(), err
    assert ("space 'theirs' is embedded by 'all-MiniLM-L6-v2'; texts embedded by 'multilingual-e5-small' would not "
            "be comparable with its vectors (embed them with --encoder all-MiniLM-L6-v2, or give another --space)"
            ) in err
    code, out, err = run(capsys, "--data-dir", var, "embed", "--encoder", "minilm", "--space", "odd",
                         texts / "t.txt", texts / "x.npy", "--quiet")
    assert code == 2 and not (texts / "x.npy").exists(), err
    assert ("space 'odd' records the model 'BAAI/bge-small-en-v1.5', which this release cannot load: texts embedded "
            "by 'all-MiniLM-L6-v2' would not be comparable with its vectors (give another --space)") in err
    assert "--encoder BAAI" not in err


def test_embed_space_refuses_a_space_that_records_no_encoder(capsys, encoders, texts):
    """A space fitted from vector files records no encoder: `embed --space` bound the encoder given to it without a
    word (e5 texts then searched a MiniLM index). It is refused, naming the command that binds one; that command
    works as named."""
    from service.registry import open_registry

    var = texts / "var"
    reg = open_registry(f"sqlite:///{var / 'registry.sqlite'}", var / "artifacts")
    reg.register_space("minilm", 384)
    args = ["--data-dir", var, "embed", "--encoder", "e5", "--space", "minilm", texts / "t.txt", texts / "x.npy"]
    code, out, err = run(capsys, *args, "--quiet")
    assert code == 2 and out == "" and not (texts / "x.npy").exists(), err
    assert ("space 'minilm' records no encoder; bind one with `vecbridge spaces add minilm --encoder "
            "multilingual-e5-small` if multilingual-e5-small embeds it") in err
    assert reg.get_space("minilm").encoder is None
    code, _, err = run(capsys, "--data-dir", var, "spaces", "add", "minilm", "--encoder", "multilingual-e5-small")
    assert code == 0, err
    code, out, err = run(capsys, *args, "--json")
    assert code == 0, err
    assert json.loads(out)["space"] == "minilm" and reg.get_space("minilm").encoder == "multilingual-e5-small"


@pytest.mark.parametrize("args, message", [
    (["--encoder", "nope", "--space", "s", "t.txt", "o.npy"], "unknown encoder 'nope'"),
    (["--encoder", "minilm", "--space", "bad name!", "t.txt", "o.npy"], "space name"),
    (["--encoder", "minilm", "--space", "s", "empty.json", "o.npy"], "empty.json: no texts to embed"),
])
def test_embed_space_refused_input_makes_no_registry(capsys, encoders, texts, monkeypatch, args, message):
    """A failed `embed --space` (unknown encoder, bad space name, no texts) left an empty registry.sqlite and
    artifacts/ behind: the registry is opened only once the name, the encoder and the texts are good."""
    (texts / "empty.json").write_text("[]")
    monkeypatch.chdir(texts)
    code, _, err = run(capsys, "--data-dir", texts / "var", "embed", *args, "--quiet")
    assert code == 2 and message in err, err
    assert not (texts / "var").exists()


def test_embed_json_out_is_absolute(capsys, encoders, texts, monkeypatch):
    """As plan's rows_out: the path of the file written, usable from any directory."""
    monkeypatch.chdir(texts)
    code, out, err = run(capsys, "embed", "--encoder", "minilm", "t.txt", "rel.npy", "--json")
    assert code == 0, err
    assert json.loads(out)["out"] == str((texts / "rel.npy").resolve())


def test_embed_removes_a_killed_embeds_temporary_output(capsys, encoders, texts):
    """A `kill -9` mid-embed leaves a hidden full-size ``.OUT.part-PID-HEX``; the next write of OUT removes it (no
    live writer holds its lock), as transform's writer does."""
    left = texts / ".o.npy.part-999999-0123abcd"
    left.write_bytes(b"\0" * 4096)
    code, _, err = run(capsys, "embed", "--encoder", "minilm", texts / "t.txt", texts / "o.npy", "--quiet")
    assert code == 0, err
    assert not left.exists() and not [p for p in texts.iterdir() if ".part-" in p.name]


def test_embed_counts_the_texts_minilm_cuts(capsys, encoders, texts):
    """MiniLM reads a text's first 256 word pieces and drops the rest without a word (a long document embedded as
    its opening); embed counts them in a warning and in --json. e5's engine reads a long text whole (windows)."""
    long = " ".join(["the quick brown fox jumps over the lazy dog"] * 40)  # ~360 word pieces
    (texts / "long.json").write_text(json.dumps([long, "a cat", long + " and a volcano"]))
    code, out, err = run(capsys, "embed", "--encoder", "minilm", texts / "long.json", texts / "m.npy", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert (res["truncated"], res["max_tokens"]) == (2, 256)
    assert "warning: 2 of 3 texts are longer than all-MiniLM-L6-v2 reads (256 tokens)" in err
    m = np.load(texts / "m.npy")
    assert float(m[0] @ m[2]) > 0.9999  # what the cut dropped changed nothing
    code, out, err = run(capsys, "embed", "--encoder", "e5", texts / "long.json", texts / "e.npy", "--json")
    assert code == 0 and "warning" not in err, err
    assert (json.loads(out)["truncated"], json.loads(out)["max_tokens"]) == (0, None)
    e = np.load(texts / "e.npy")
    assert float(e[0] @ e[2]) < 0.9999  # e5 read the end too


def test_embed_no_truncate_refuses_a_text_the_model_would_cut(capsys, encoders, texts):
    """HTTP's ``truncate: false`` had no CLI twin: `embed` cut a long text (with a warning) whatever the caller
    needed. ``--no-truncate`` refuses the first such text with the HTTP words, naming its row of the file (as --rows
    counts: not its place in the selection; a .txt's line too), before anything is embedded, written or registered;
    exit 2. Texts the model reads whole pass, and e5 (no limit) refuses none."""
    long = " ".join(["the quick brown fox jumps over the lazy dog"] * 40)  # 362 MiniLM tokens
    (texts / "long.json").write_text(json.dumps(["a cat", long, long + " and a volcano"]))
    (texts / "long.txt").write_text(f"a cat\n{long}\n")
    np.save(texts / "rows.npy", np.array([2, 0], dtype=np.int64))
    tail = ("is 362 tokens long, more than the 256 all-MiniLM-L6-v2 reads (2 of 3 texts are); with --no-truncate a "
            "text is refused, not cut: split it, or drop --no-truncate to embed its first 256 tokens")
    var = texts / "var"
    for args, where in ((["long.json"], f"long.json: row 1 {tail}"),
                        (["--rows", "1:3", "long.json"], "long.json: row 1 is 362 tokens long"),
                        (["--rows", "-1:", "long.json"], "long.json: row 2 is 365 tokens long"),
                        (["--rows", texts / "rows.npy", "long.json"], "long.json: row 2 is 365 tokens long"),
                        (["long.txt"], "long.txt: row 1 (line 2) is 362 tokens long")):
        *opts, name = args
        code, out, err = run(capsys, "--data-dir", var, "embed", "--encoder", "minilm", "--no-truncate", "--space",
                             "s", *opts, texts / name, texts / "o.npy", "--quiet")
        assert code == 2 and out == "" and where in err, (args, err)
        assert not (texts / "o.npy").exists() and not var.exists()  # nothing embedded, written or registered
    code, out, err = run(capsys, "embed", "--encoder", "minilm", "--no-truncate", "--rows", "0:1", texts / "long.json",
                         texts / "o.npy", "--json")
    assert code == 0 and json.loads(out)["truncated"] == 0 and "warning" not in err, err
    code, out, err = run(capsys, "embed", "--encoder", "e5", "--no-truncate", texts / "long.json", texts / "e.npy",
                         "--json")
    assert code == 0 and json.loads(out)["rows"] == 3, err
    code, out, err = run(capsys, "embed", "--encoder", "minilm", "--truncate", texts / "long.json", texts / "m.npy",
                         "--json")
    assert code == 0 and json.loads(out)["truncated"] == 2, err  # the default, as before


def test_embed_file_rows_check_sees_the_first_sample_rows_before_any_is_written(tmp_path, monkeypatch):
    """``embed --space``'s misspelt-space check reads the rows a space check reads (the first ``SPACE_SAMPLE_ROWS``)
    before any is written: chunks are held until then, OUT is the same rows in order, and a refusal writes none."""
    from align.exceptions import InputError
    from service import encoders
    from service.ops.embeddings import embed_file
    from service.spaces import SPACE_SAMPLE_ROWS

    n = SPACE_SAMPLE_ROWS + 700
    rows = np.random.default_rng(0).standard_normal((n, 8)).astype(np.float32)

    class Fake:  # row i embeds text "t{i}"
        name, dim, max_tokens = "fake", 8, None

        def encode(self, texts, kind):
            return rows[[int(t[1:]) for t in texts]]

        def too_long(self, texts, exact_first=False):
            return []

    monkeypatch.setattr(encoders, "get_encoder", lambda name: Fake())
    (tmp_path / "t.json").write_text(json.dumps([f"t{i}" for i in range(n)]))
    seen = []
    for chunk in (300, 64, n + 1):
        res = embed_file(tmp_path / "t.json", tmp_path / "o.npy", encoder="fake", chunk_rows=chunk,
                         rows_check=lambda V: seen.append(V.copy()))
        assert res["rows"] == n and len(seen) == 1, chunk
        np.testing.assert_array_equal(seen.pop(), rows[:SPACE_SAMPLE_ROWS])
        np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), rows)
    embed_file(tmp_path / "t.json", tmp_path / "few.npy", encoder="fake", rows="0:30", chunk_rows=7,
               rows_check=seen.append)
    np.testing.assert_array_equal(seen.pop(), rows[:30])  # fewer than the sample: all of them, once

    def refuse(V):
        raise InputError("no")

    with pytest.raises(InputError):
        embed_file(tmp_path / "t.json", tmp_path / "x.npy", encoder="fake", chunk_rows=300, rows_check=refuse)
    assert not (tmp_path / "x.npy").exists() and not [p for p in tmp_path.iterdir() if ".part-" in p.name]
