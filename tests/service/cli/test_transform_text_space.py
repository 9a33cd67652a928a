"""`vecbridge transform` of a text file checks the rows its encoder made against the map's sides, as it checks
vectors (a wrong --encoder was mapped silently: exit 0, rows that find nothing)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from service.io import read_vectors
from conftest import run_cli as run


def test_texts_embedded_by_the_target_model_are_refused_naming_the_encoder(capsys, tmp_path, wordnet_dir):
    """A minilm -> e5 procrustes map (spaces from .npy fits: no encoder recorded) and 60 WordNet glosses: with
    ``--encoder e5`` the texts became e5 rows, which the map took for minilm rows and wrote (top-1 0.00 against e5's
    own vectors); the same rows given as vectors were refused exit 2. Now refused alike, naming --encoder, before
    anything is written; ``--encoder minilm`` maps them as the vector file of the same rows maps."""
    from service.encoders import list_encoders

    installed = {e["name"] for e in list_encoders() if e["installed"]}
    if not {"all-MiniLM-L6-v2", "multilingual-e5-small"} <= installed:
        pytest.skip("needs the all-MiniLM-L6-v2 and multilingual-e5-small encoders")
    texts_file = wordnet_dir / "texts.json"
    if not texts_file.exists():
        pytest.skip("no WordNet texts beside the vectors")
    texts = json.loads(texts_file.read_text())[3000:3060]
    var = tmp_path / "var"
    code, _, err = run(capsys, "--data-dir", var, "fit", "--pairs", "--source", wordnet_dir / "minilm.npy",
                       "--target", wordnet_dir / "e5.npy", "--rows", "0:3000", "--method", "procrustes", "--name",
                       "m", "--quiet")
    assert code == 0, err
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    code, _, err = run(capsys, "--data-dir", var, "transform", "--map", "m", tmp_path / "in.txt", tmp_path / "o.npy",
                       "--encoder", "e5", "--quiet")
    assert code == 2 and "look like space 'e5', not 'minilm'" in err and "--encoder" in err, err
    assert not (tmp_path / "o.npy").exists()
    code, _, err = run(capsys, "--data-dir", var, "transform", "--map", "m", tmp_path / "in.txt", tmp_path / "o.npy",
                       "--encoder", "minilm", "--chunk-rows", "16", "--quiet")  # the check spans small chunks
    assert code == 0, err
    np.save(tmp_path / "x.npy", np.load(wordnet_dir / "minilm.npy", mmap_mode="r")[3000:3060].astype(np.float32))
    code, _, err = run(capsys, "--data-dir", var, "transform", "--map", "m", tmp_path / "x.npy", tmp_path / "v.npy",
                       "--quiet")
    assert code == 0, err
    np.testing.assert_allclose(read_vectors(tmp_path / "o.npy"), read_vectors(tmp_path / "v.npy"), atol=2e-2)
