"""Steers check their rows' space as ``transform`` and ``index add`` do (:func:`service.ops.steers.check_steer_rows`).

QA, on WordNet: with a map minilm -> e5 registered, ``steer apply --steer plant e5_rows.npy`` (a MiniLM steer on e5
rows), the steer transferred to e5 applied to MiniLM rows, ``steer apply --encoder all-MiniLM-L6-v2`` of texts for
a steer of e5 (a space with no registered encoder), ``steer fit --space minilm --vectors e5_rows.npy`` and
``steer lens --vectors e5_rows.npy`` all exited 0, and POST /v1/steers and /v1/steers/{ref}/apply answered
202 / 200, where ``transform`` refuses such rows (exit 2 / 422, naming the space they look like). Now each is
refused the same way, while the steer's own rows, and batches too small to tell, go on. Real MiniLM and e5
embeddings of the same WordNet definitions (``conftest.wordnet``).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from _api_support import KEYS, R, W
from conftest import run_cli

import align
from align.kmeans import kmeans


@pytest.fixture(scope="module")
def world(wordnet, wordnet_dir, tmp_path_factory):
    """A data dir with map minilm-e5 (procrustes, 3,000 pairs), steer ``topic`` (MiniLM, rows 3000:3600 labelled by
    one k-means topic, their texts named) and ``topic-e5`` (it, transferred); the arrays as ``.npy`` files."""
    tmp = tmp_path_factory.mktemp("steer_rows_space")
    files = {}
    for name in ("minilm", "e5"):
        files[name] = tmp / f"{name}.npy"
        np.save(files[name], np.asarray(wordnet[name][:3800], np.float32))
    mi = np.load(files["minilm"])
    U = align.frames.unit_rows(mi[3000:3600])
    C, _, _ = kmeans([U], 6, random_state=0, n_iter=15)
    topic = np.argmax(U @ C.T, axis=1)
    labels = np.where(topic == np.bincount(topic).argmax(), 1, -1)
    np.save(tmp / "labels.npy", labels)
    texts = json.loads((wordnet_dir / "texts.json").read_text())
    (tmp / "train.txt").write_text("\n".join(t.replace("\n", " ") for t in texts[3000:3600]) + "\n")
    (tmp / "queries.txt").write_text("\n".join(t.replace("\n", " ") for t in texts[3600:3700]) + "\n")
    np.save(tmp / "mi_train.npy", mi[3000:3600])
    np.save(tmp / "e5_train.npy", np.load(files["e5"])[3000:3600])
    data = tmp / "data"
    for args in (("fit", "--pairs", "--source", files["minilm"], "--target", files["e5"], "--rows", "0:3000",
                  "--method", "procrustes", "--name", "minilm-e5", "--source-space", "minilm", "--target-space",
                  "e5"),
                 ("steer", "fit", "--space", "minilm", "--vectors", tmp / "mi_train.npy", "--texts",
                  tmp / "train.txt", "--labels", tmp / "labels.npy", "--name", "topic"),
                 ("steer", "transfer", "--steer", "topic", "--map", "minilm-e5")):
        assert _main("--data-dir", data, *args, "--quiet" if args[0] == "fit" else "--json") == 0, args
    return {"data": data, "tmp": tmp, **files}


def _main(*args) -> int:
    from service.cli import main

    return main([str(a) for a in args])


def cli(capsys, world, *args):
    return run_cli(capsys, "--data-dir", world["data"], *args)


def test_steer_apply_refuses_rows_of_another_space(world, capsys, tmp_path):
    out = tmp_path / "out.npy"
    for steer, rows, looks, declared in (("topic", world["e5"], "e5", "minilm"),
                                         ("topic-e5", world["minilm"], "minilm", "e5")):
        code, _, err = cli(capsys, world, "steer", "apply", "--steer", steer, rows, out, "--rows", "3600:3800",
                           "--quiet")
        assert code == 2 and not out.exists(), err
        assert f"the rows of {rows.name} look like space {looks!r}, not {declared!r}" in err, err
        assert "steer them with a steer of" in err and "vecbridge steer transfer" in err, err
    for steer, rows in (("topic", world["minilm"]), ("topic-e5", world["e5"])):  # the steer's own space: as before
        code, _, err = cli(capsys, world, "steer", "apply", "--steer", steer, rows, out, "--rows", "3600:3800",
                           "--quiet")
        assert code == 0 and err == "" and np.load(out).shape == (200, 384), err
    code, _, err = cli(capsys, world, "steer", "apply", "--steer", "topic", world["e5"], out, "--rows", "0:3",
                       "--quiet")
    assert code == 0, err  # fewer than MEAN_CHECK_MIN_ROWS rows tell nothing: not checked


def test_steer_fit_and_lens_refuse_rows_of_another_space(world, capsys):
    tmp = world["tmp"]
    code, _, err = cli(capsys, world, "steer", "fit", "--space", "minilm", "--vectors", tmp / "e5_train.npy",
                       "--labels", tmp / "labels.npy", "--name", "wrongspace", "--quiet")
    assert code == 2 and "the rows look like space 'e5', not 'minilm'" in err, err
    assert "fit the steer in that space (--space / space e5)" in err, err
    code, out, _ = cli(capsys, world, "steer", "list", "--json")
    assert "wrongspace" not in out
    code, _, err = cli(capsys, world, "steer", "lens", "--steer", "topic", "--vectors", tmp / "e5_train.npy",
                       "--texts", tmp / "train.txt")
    assert code == 2 and "the rows of e5_train.npy look like space 'e5', not 'minilm'" in err, err
    code, out, err = cli(capsys, world, "steer", "lens", "--steer", "topic", "--vectors", tmp / "mi_train.npy",
                         "--texts", tmp / "train.txt")
    assert code == 0 and "direction 0" in out, err


def test_http_steer_fit_and_apply_refuse_rows_of_another_space(world):
    from fastapi.testclient import TestClient

    from service.api import create_app
    from service.config import Settings

    mi, e5 = np.load(world["minilm"]), np.load(world["e5"])
    labels = np.load(world["tmp"] / "labels.npy").tolist()
    app = create_app(Settings(data_dir=world["data"], api_keys=KEYS, demo_on_empty=False, log_level="WARNING",
                              max_batch=1000, max_body_bytes=8_000_000))
    with TestClient(app) as c:
        r = c.post("/v1/steers/topic/apply", headers=R, json={"vectors": e5[3600:3700].tolist(), "eps": 1.0})
        assert r.status_code == 422 and "look like space 'e5', not 'minilm'" in r.text, r.text
        r = c.post("/v1/steers/topic-e5/apply", headers=R, json={"vectors": mi[3600:3700].tolist(), "eps": 1.0})
        assert r.status_code == 422 and "look like space 'minilm', not 'e5'" in r.text, r.text
        for steer, rows in (("topic", mi[3600:3700]), ("topic-e5", e5[3600:3700]), ("topic", e5[3600:3601])):
            r = c.post(f"/v1/steers/{steer}/apply", headers=R, json={"vectors": rows.tolist(), "eps": 1.0})
            assert r.status_code == 200 and len(r.json()["vectors"]) == len(rows), r.text
        r = c.post("/v1/steers", headers=W, json={"name": "wrongspace", "space": "minilm", "labels": labels,
                                                  "vectors": e5[3000:3600].tolist()})
        assert r.status_code == 422 and "look like space 'e5', not 'minilm'" in r.text, r.text
        r = c.get("/v1/steers/wrongspace", headers=R)
        assert r.status_code == 404, r.text


def test_texts_embedded_by_another_model_than_a_spaces_are_refused(world, capsys, tmp_path):
    """e5 has no registered encoder here (the map was fitted on files), so ``--encoder`` is taken as given: texts
    embedded by MiniLM for a steer of e5 were steered and exited 0. Their first chunk is now checked."""
    pytest.importorskip("sentence_transformers")
    out = tmp_path / "out.npy"
    code, _, err = cli(capsys, world, "steer", "apply", "--steer", "topic-e5", "--encoder", "all-MiniLM-L6-v2",
                       world["tmp"] / "queries.txt", out, "--quiet")
    assert code == 2 and not out.exists(), err
    assert "the texts of queries.txt embedded by all-MiniLM-L6-v2 look like space 'minilm', not 'e5'" in err, err
    # chunks smaller than the check reads (a review: --chunk-rows 10 and 49 skipped it): read over several of them
    code, _, err = cli(capsys, world, "steer", "apply", "--steer", "topic-e5", "--encoder", "all-MiniLM-L6-v2",
                       world["tmp"] / "queries.txt", out, "--quiet", "--chunk-rows", "10")
    assert code == 2 and not out.exists() and "look like space 'minilm', not 'e5'" in err, err
    code, _, err = cli(capsys, world, "steer", "apply", "--steer", "topic", "--encoder", "all-MiniLM-L6-v2",
                       world["tmp"] / "queries.txt", out, "--quiet", "--chunk-rows", "10")
    assert code == 0 and np.load(out).shape == (100, 384), err
    out.unlink()
    code, _, err = cli(capsys, world, "steer", "apply", "--steer", "topic", "--encoder", "all-MiniLM-L6-v2",
                       world["tmp"] / "queries.txt", out, "--quiet")
    assert code == 0 and np.load(out).shape == (100, 384), err
