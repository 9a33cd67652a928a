"""Rows of another model are refused wherever they enter, not only by ``migrate`` (:mod:`service.spaces`).

QA, on WordNet: ``vecbridge index add docs-e5 minilm.npy`` (an e5 index, MiniLM rows) answered "added";
``index search docs-e5 minilm.npy`` with no ``--space`` answered hits scored 0.07-0.14 with unrelated ids;
``transform --map minilm-e5@prod e5.npy`` (the map's TARGET side as input) wrote its output; and ``fit`` with the two
files swapped registered an e5 -> minilm map as minilm -> e5. All exit 0, and over HTTP the add and search were 200.
Each is now refused (exit 2 / 422) naming the space the rows look like, while rows of the declared space, and rows
of one narrow topic of it, pass. Real MiniLM and e5 embeddings of the same WordNet definitions (the shared set, or
the sample the tests embed when it is absent: ``conftest.wordnet``).
"""

from __future__ import annotations

import numpy as np
import pytest
from _api_support import KEYS, R, W
from conftest import run_cli

import align
from align.kmeans import kmeans
from service.spaces import SpaceMismatchError, check_rows

FIT, IDX, NEW = slice(0, 3000), slice(0, 1000), slice(3000, 3400)


@pytest.fixture(scope="module")
def world(wordnet, tmp_path_factory):
    """A data dir with map minilm-e5 (procrustes on 3,000 pairs, alias prod) and index docs-e5 (1,000 e5 rows),
    made by the CLI; the arrays as float32 ``.npy`` files beside it; and the MiniLM rows of a narrow topic."""
    tmp = tmp_path_factory.mktemp("rows_space")
    files = {}
    for name in ("minilm", "e5"):
        arr = np.asarray(wordnet[name][:3400], np.float32)
        files[name] = tmp / f"{name}.npy"
        np.save(files[name], arr)
    data = tmp / "data"
    code = run_cli_plain("--data-dir", data, "fit", "--pairs", "--source", files["minilm"], "--target", files["e5"],
                         "--rows", "0:3000", "--method", "procrustes", "--name", "minilm-e5", "--alias", "prod",
                         "--quiet")
    assert code == 0
    assert run_cli_plain("--data-dir", data, "index", "create", "docs-e5", "--space", "e5", files["e5"],
                         "--rows", "0:1000", "--quiet") == 0
    assert run_cli_plain("--data-dir", data, "index", "create", "docs-mi", "--space", "minilm", files["minilm"],
                         "--rows", "0:1000", "--quiet") == 0
    mi = np.load(files["minilm"])
    U = align.frames.unit_rows(mi[:3000])
    C, _, _ = kmeans([U], 20, random_state=0, n_iter=15)
    labels = np.argmax(U @ C.T, axis=1)
    frame = _map(data).source_frame
    topics = [np.flatnonzero(labels == c) for c in range(20) if (labels == c).sum() >= 60]
    narrow = mi[min(topics, key=lambda t: frame.mean_cosine(mi[t]))]  # the topic the minilm frame knows least
    np.save(tmp / "narrow.npy", narrow)
    return {"data": data, "tmp": tmp, **files, "narrow": tmp / "narrow.npy", "narrow_cos": frame.mean_cosine(narrow)}


def _map(data):
    from service.registry import open_registry

    reg = open_registry(f"sqlite:///{data}/registry.sqlite", data / "artifacts")
    try:
        return reg.load_map("minilm-e5@prod")
    finally:
        reg.close()


def run_cli_plain(*args) -> int:
    from service.cli import main

    return main([str(a) for a in args])


def cli(capsys, world, *args):
    return run_cli(capsys, "--data-dir", world["data"], *args)


def test_index_add_refuses_another_models_rows_and_takes_its_own(world, capsys):
    code, _, err = cli(capsys, world, "index", "add", "docs-e5", world["minilm"], "--rows", "3000:3100")
    assert code == 2, err
    assert "look like space 'minilm', not 'e5'" in err and "vecbridge transform" in err, err
    code, out, err = cli(capsys, world, "index", "show", "docs-e5", "--json")
    assert '"count": 1000' in out  # nothing written
    code, out, err = cli(capsys, world, "index", "add", "docs-e5", world["e5"], "--rows", "3000:3100")
    assert code == 0 and "added 100 rows" in out and err == "", err
    code, out, err = cli(capsys, world, "index", "add", "docs-mi", world["narrow"])  # one topic of its own space
    assert code == 0 and "added" in out, err
    assert err.count("vecbridge: warning:") <= 1, err
    code, _, err = cli(capsys, world, "index", "add", "docs-mi", world["e5"], "--rows", "3100:3200")
    assert code == 2 and "look like space 'e5', not 'minilm'" in err, err


def test_index_search_without_space_refuses_another_models_queries(world, capsys):
    code, out, err = cli(capsys, world, "index", "search", "docs-e5", world["minilm"], "--rows", "0:100", "-k", "3")
    assert code == 2 and out == "", out
    assert "the queries look like space 'minilm', not 'e5'" in err and "--space minilm" in err, err
    code, out, err = cli(capsys, world, "index", "search", "docs-e5", world["minilm"], "--rows", "0:100", "-k", "1",
                         "--space", "minilm", "--json")
    assert code == 0, err
    import json

    hits = json.loads(out)["results"]
    assert sum(h[0]["id"] == i for i, h in enumerate(hits)) >= 90  # through the map, row i finds e5 row i
    code, out, err = cli(capsys, world, "index", "search", "docs-e5", world["e5"], "--rows", "0:100", "-k", "1")
    assert code == 0 and err == "", err
    code, out, err = cli(capsys, world, "index", "search", "docs-mi", world["narrow"], "-k", "1")
    assert code == 0, err
    code, out, err = cli(capsys, world, "index", "search", "docs-e5", world["minilm"], "--rows", "0:3", "-k", "1")
    assert code == 0  # fewer than MEAN_CHECK_MIN_ROWS queries tell nothing: not checked


def test_transform_refuses_rows_of_the_maps_target_side(world, capsys, tmp_path):
    out = tmp_path / "out.npy"
    code, _, err = cli(capsys, world, "transform", "--map", "minilm-e5@prod", world["e5"], out, "--rows", "0:500",
                       "--quiet")
    assert code == 2 and not out.exists(), err
    assert "look like space 'e5', not 'minilm'" in err and "wrong way round" in err, err
    for rows in (world["minilm"], world["narrow"]):
        code, _, err = cli(capsys, world, "transform", "--map", "minilm-e5@prod", rows, out, "--quiet")
        assert code == 0 and out.exists(), err
        assert err.count("vecbridge: warning:") <= 1, err


def test_fit_refuses_swapped_files_and_a_side_of_another_space(world, capsys):
    base = ("fit", "--pairs", "--method", "procrustes", "--source-space", "minilm", "--target-space", "e5",
            "--rows", "3000:3400", "--quiet", "--name")
    code, _, err = cli(capsys, world, *base, "minilm-e5", "--source", world["e5"], "--target", world["minilm"])
    assert code == 2 and "the files look swapped" in err, err
    code, _, err = cli(capsys, world, *base, "e5-e5x", "--source", world["e5"], "--target", world["e5"],
                       "--source-space", "minilm2", "--target-space", "e5")
    assert code == 0, err  # a space no map touches yet: nothing to tell it by
    code, _, err = cli(capsys, world, *base, "mi-e5b", "--source", world["e5"], "--target", world["e5"])
    assert code == 2 and "the source rows look like space 'e5', not 'minilm'" in err, err
    assert "--source-space / source_space e5" in err, err
    code, out, err = cli(capsys, world, "registry", "list", "--json")
    assert "mi-e5b" not in out
    code, out, err = cli(capsys, world, *base, "minilm-e5", "--source", world["minilm"], "--target", world["e5"])
    assert code == 0 and "registered minilm-e5:2" in out, err


def test_http_index_add_and_search_refuse_another_models_rows(world):
    """The routes as the CLI: a 422 naming the space; rows of the index's space, and a batch of one, as before."""
    from fastapi.testclient import TestClient

    from service.api import create_app
    from service.config import Settings

    mi, e5 = np.load(world["minilm"]), np.load(world["e5"])
    app = create_app(Settings(data_dir=world["data"], api_keys=KEYS, demo_on_empty=False, log_level="WARNING",
                              max_batch=1000, max_body_bytes=4_000_000))
    with TestClient(app) as c:
        r = c.post("/v1/indexes/docs-e5/vectors", headers=W, json={"vectors": mi[3200:3300].tolist()})
        assert r.status_code == 422 and "look like space 'minilm', not 'e5'" in r.text, r.text
        r = c.post("/v1/indexes/docs-e5/search", headers=R, json={"vectors": mi[:64].tolist(), "k": 1})
        assert r.status_code == 422 and 'say so with space minilm' in r.text, r.text
        r = c.post("/v1/indexes/docs-e5/search", headers=R, json={"vectors": mi[:64].tolist(), "k": 1,
                                                                  "space": "minilm"})
        assert r.status_code == 200, r.text
        for rows in (mi[:1], e5[:64]):  # batch-1: unchecked (its fast path untouched); e5 rows: checked, pass
            r = c.post("/v1/indexes/docs-e5/search", headers=R, json={"vectors": rows.tolist(), "k": 1})
            assert r.status_code == 200, r.text
        r = c.post("/v1/indexes/docs-e5/vectors", headers=W, json={"vectors": e5[3300:3400].tolist()})
        assert r.status_code == 200, r.text
        r = c.post("/v1/indexes/docs-mi/vectors", headers=W, json={"vectors": np.load(world["narrow"]).tolist()})
        assert r.status_code == 200, r.text


def test_an_index_of_a_space_no_map_touches_is_told_by_its_own_rows(world):
    """docs-e5's rows stand for e5 when the registry has no reference of e5 (here: only minilm's), so MiniLM rows
    are still refused; with no reference at all they are unchecked, not refused."""
    from service.indexes import IndexStore
    from service.spaces import index_frame

    mi = np.load(world["minilm"])
    idx = IndexStore(world["data"] / "indexes").get("docs-e5")
    from service.spaces import Reference

    m = _map(world["data"])

    only_minilm = {"minilm": [Reference("minilm", m.source_frame, "map minilm-e5's source side")]}
    with pytest.raises(SpaceMismatchError, match="look like space 'minilm', not 'e5'"):
        check_rows(mi[:200], "e5", only_minilm, own_extra=lambda: index_frame(idx))
    assert check_rows(mi[:200], "e5", only_minilm).state == "unknown"  # nothing of e5 to compare with
    assert check_rows(mi[:200], "e5", {}).state == "unknown"
    assert check_rows(mi[:20], "e5", only_minilm, own_extra=lambda: index_frame(idx)).state == "unknown"  # too few
