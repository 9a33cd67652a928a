"""benchmarks/wordnet_sample.py: the shared WordNet set when present, else a sample embedded here by the real
encoders in the same layout (the fallback the tests and benchmarks use when ../shared/data/wordnet is absent)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from conftest import load_benchmark

ws = load_benchmark("wordnet_sample")
pytestmark = pytest.mark.skipif(not (ws.DEBIAN_WORDNET / "data.noun").is_file(), reason="wordnet-base not installed")


def test_sample_texts_are_distinct_definitions_reproducible_by_seed():
    a, b, c = ws.sample_texts(50, seed=0), ws.sample_texts(50, seed=0), ws.sample_texts(50, seed=1)
    assert a == b and a != c and len(set(a)) == 50
    assert all(len(t.split()) >= 4 and '; "' not in t for t in a)
    defs = set(ws.definitions())
    assert set(a) <= defs and len(defs) > 100_000
    with pytest.raises(ValueError, match="rows must be"):
        ws.sample_texts(0)


def test_a_sample_has_the_shared_layout_and_each_row_embeds_its_text(tmp_path):
    from service.encoders import get_encoder

    logs = []
    d = ws.wordnet_dir(("minilm", "e5"), rows=12, cache=tmp_path, shared=tmp_path / "absent", log=logs.append)
    assert d == tmp_path / "wordnet-sample-12" and ws.is_sample(d) and not ws.shared_available(shared=d / "none")
    assert any("not found" in line for line in logs) and any("embedding 12 definitions" in line for line in logs)
    texts = json.loads((d / "texts.json").read_text())
    assert texts == ws.sample_texts(12)
    for name, encoder in ws.SAMPLE_ENCODERS.items():
        E = np.load(d / f"{name}.npy")
        assert E.dtype == np.float16 and E.shape == (12, 384)
        np.testing.assert_allclose(np.linalg.norm(E.astype(np.float32), axis=1), 1.0, atol=2e-3)
        ref = get_encoder(encoder).encode(texts, "passage")
        assert ((E.astype(np.float32) * ref).sum(1) > 0.999).all(), name   # row i is text i, passage form
    meta = json.loads((d / "sample.json").read_text())
    assert meta["rows"] == 12 and set(meta["encoders"]) == {"minilm", "e5"}
    # cached: a second call embeds nothing; a missing file is rebuilt alone
    stamp = os.stat(d / "minilm.npy").st_mtime_ns
    (d / "e5.npy").unlink()
    logs.clear()
    assert ws.wordnet_dir(rows=12, cache=tmp_path, shared=tmp_path / "absent", log=logs.append) == d
    want = f"wordnet sample: embedding 12 definitions with multilingual-e5-small into {d / 'e5.npy'}"
    assert [line for line in logs if "embedding" in line] == [want]
    assert os.stat(d / "minilm.npy").st_mtime_ns == stamp and (d / "e5.npy").is_file()
    assert not [p for p in d.iterdir() if ".part-" in p.name]               # no temporary files left


def test_the_shared_set_is_used_as_is_when_present_and_a_sample_cannot_hold_glove(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "texts.json").write_text(json.dumps(["a b c d"]))
    for name in ("minilm", "e5"):
        np.save(shared / f"{name}.npy", np.ones((1, 384), np.float16))
    assert ws.wordnet_dir(shared=shared, cache=tmp_path / "cache") == shared and not ws.is_sample(shared)
    assert not (tmp_path / "cache").exists()                                  # nothing embedded
    with pytest.raises(ws.SampleUnavailable, match="glove"):
        ws.wordnet_dir(("minilm", "glove"), rows=4, shared=shared, cache=tmp_path / "cache", log=lambda m: None)
    with pytest.raises(ws.SampleUnavailable, match="wordnet-base"):
        ws.build_sample(tmp_path / "s", 4, wordnet_dir=tmp_path / "no-wordnet")
