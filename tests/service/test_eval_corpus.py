"""`vecbridge eval --old-corpus` / POST /v1/maps/{ref}/evaluate's `old_corpus`: the labelled retention over the
whole corpus, as the plan forecasts it, and the gate on it. Over the held-out documents alone the retention is
higher (WordNet minilm→e5, 2,000 pairs: 0.825 over 1,000 documents, 0.544 over the corpus's 40,960) and a gate of
0.6 passed a migration the plan had forecast to keep about half."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

import align
from service.api import create_app
from service.io import write_vectors
from _api_support import R, settings_for
from _synthetic import heldout_labelled_task
from conftest import run_cli as run


_task = heldout_labelled_task


def _fitted(capsys, d, task):
    """The task's rows as files in ``d`` (old, new, q, qo, rel) and map "m" fitted on the first 300 pairs."""
    X, Y, Qn, Qo, rel = task
    for name, a in (("old", X), ("new", Y), ("q", Qn), ("qo", Qo)):
        write_vectors(d / f"{name}.npy", a)
    np.save(d / "rel.npy", rel)
    code, _, err = run(capsys, "--data-dir", d / "var", "fit", "--pairs", "--source", d / "old.npy",
                       "--target", d / "new.npy", "--rows", "0:300", "--method", "procrustes", "--name", "m",
                       "--quiet")
    assert code == 0, err
    return d


@pytest.fixture
def files(tmp_path, capsys):
    return _fitted(capsys, tmp_path, _task())


def _eval(capsys, d, *extra):
    return run(capsys, "--data-dir", d / "var", "eval", "--map", "m", "--source", d / "old.npy", "--target",
               d / "new.npy", "--rows", "-500:", "--queries", d / "q.npy", "--relevant", d / "rel.npy", *extra)


def test_eval_gates_on_the_corpus_wide_retention_when_given_the_old_corpus(capsys, files):
    d = files
    code, out, err = _eval(capsys, d, "--old-queries", d / "qo.npy", "--json")
    assert code == 0, err
    held = json.loads(out)["retrieval"]
    assert held["retention_scope"] == "held-out" and "corpus" not in held
    corpus = "--old-corpus", d / "old.npy", "--old-corpus-rows", "0:-500"
    code, out, err = _eval(capsys, d, "--old-queries", d / "qo.npy", *corpus, "--json")
    assert code == 0, err
    res = json.loads(out)
    r = res["retrieval"]
    X, Y, Qn, Qo, rel = _task()
    from service.registry import open_registry

    reg = open_registry(f"sqlite:///{d / 'var' / 'registry.sqlite'}", d / "var" / "artifacts")
    try:
        want = align.corpus_retention(reg.load_map("m"), X[-500:], Y[-500:], Qn, rel, Qo, X[:-500])
    finally:
        reg.close()
    assert r["corpus"]["retention"] == pytest.approx(want["retention"]) and r["corpus"]["n_documents"] == 5000
    assert res["retention"] == r["retention"] == pytest.approx(want["retention"]) and r["retention_scope"] == "corpus"
    assert r["retention_heldout"] == pytest.approx(held["retention"])
    assert r["retention"] < r["retention_heldout"] - 0.1  # 4,500 more rows compete in the migrated corpus
    gate = round((r["retention"] + r["retention_heldout"]) / 2, 3)  # between the two: the held-out figure passes it
    code, out, _ = _eval(capsys, d, "--old-queries", d / "qo.npy", "--min-retention", gate)
    assert code == 0 and "PASS" in out and "over the 500 held-out documents only" in out and "--old-corpus" in out
    code, out, _ = _eval(capsys, d, "--old-queries", d / "qo.npy", *corpus, "--min-retention", gate)
    assert code == 1, out
    assert f"FAIL: labelled R@10 retention (corpus-side, over the whole corpus) {r['retention']:.4f}" in out
    assert "over the whole corpus (5,000 documents: 500 held out + 4,500 --old-corpus rows mapped)" in out
    assert f"over the 500 held-out documents alone {r['retention_heldout']:.4f}" in out
    # recorded with what it is over
    code, _, err = _eval(capsys, d, "--old-queries", d / "qo.npy", *corpus, "--record")
    assert code == 0, err
    code, out, _ = run(capsys, "--data-dir", d / "var", "registry", "show", "m", "--json")
    tags = json.loads(out)["tags"]
    assert float(tags["eval.labelled_retention"]) == pytest.approx(r["retention"])
    assert tags["eval.labelled_retention_scope"].startswith("the whole corpus (5,000 documents")


def test_eval_old_corpus_needs_old_queries_and_a_corpus_side_plain_search(capsys, files):
    d = files
    corpus = "--old-corpus", d / "old.npy"
    code, _, err = _eval(capsys, d, *corpus)
    assert code == 2 and "give --old-queries" in err
    code, _, err = _eval(capsys, d, "--old-queries", d / "qo.npy", *corpus, "--csls")
    assert code == 2 and "plain cosine search" in err
    code, _, err = _eval(capsys, d, "--old-corpus-rows", "0:10")
    assert code == 2 and "give --old-corpus too" in err
    code, _, err = run(capsys, "--data-dir", d / "var", "eval", "--map", "m", "--source", d / "old.npy", "--target",
                       d / "new.npy", "--rows", "-500:", *corpus)
    assert code == 2 and "labelled queries" in err


def _b64(a):
    return {"vectors_b64": base64.b64encode(np.ascontiguousarray(a, np.float32).tobytes()).decode(), "dim": a.shape[1]}


def test_http_evaluate_takes_the_old_corpus(tmp_path, capsys):
    X, Y, Qn, Qo, rel = _task(n=2500)
    settings = settings_for(tmp_path)
    write_vectors(tmp_path / "old.npy", X)
    write_vectors(tmp_path / "new.npy", Y)
    code, _, err = run(capsys, "--data-dir", settings.data_dir, "fit", "--pairs", "--source", tmp_path / "old.npy",
                       "--target", tmp_path / "new.npy", "--rows", "0:300", "--method", "ridge", "--name", "m",
                       "--quiet")
    assert code == 0, err
    body = {"source": _b64(X[-500:]), "target": _b64(Y[-500:]), "queries": _b64(Qn), "relevant": rel.tolist(),
            "old_queries": _b64(Qo), "old_corpus": _b64(X[:-500]), "min_retention": 0.0}
    with TestClient(create_app(settings)) as c:
        r = c.post("/v1/maps/m/evaluate", json=body, headers=R)
        assert r.status_code == 200, r.text
        got = r.json()["retrieval"]
        assert got["retention_scope"] == "corpus" and got["corpus"]["n_documents"] == 2500
        assert got["retention"] == got["corpus"]["retention"] < got["retention_heldout"]
        r = c.post("/v1/maps/m/evaluate", json={**body, "old_queries": None}, headers=R)
        assert r.status_code == 422 and "old_queries" in r.text
        r = c.post("/v1/maps/m/evaluate", json={**body, "side": "source"}, headers=R)
        assert r.status_code == 422 and "corpus-side" in r.text



@pytest.fixture
def spaced(tmp_path, capsys):
    """The task's rows offset along a direction of each model's own (as real models' rows share one), so that the
    row check tells the two spaces apart; map "m" fitted from space "old" into space "new"."""
    X, Y, Qn, Qo, rel = _task()
    rng = np.random.default_rng(7)
    X, Qo = (A + 3.0 * rng.normal(size=X.shape[1]).astype(np.float32) for A in (X, Qo))
    Y, Qn = (A + 3.0 * rng.normal(size=Y.shape[1]).astype(np.float32) for A in (Y, Qn))
    return _fitted(capsys, tmp_path, (X, Y, Qn, Qo, rel)), (X, Y, Qn, Qo, rel)


def test_eval_refuses_an_old_corpus_of_the_new_model(capsys, spaced):
    """--old-corpus is mapped as old-model rows: the new model's file in its place (same width) was scored, and
    scored far higher (WordNet minilm->e5: 0.910 with e5's file, 0.587 with minilm's). The row check of the held-out
    pairs refuses it, naming the option (exit 2) or the field (422)."""
    d, (X, Y, Qn, Qo, rel) = spaced
    code, out, err = _eval(capsys, d, "--old-queries", d / "qo.npy", "--old-corpus", d / "new.npy",
                           "--old-corpus-rows", "0:-500", "--min-retention", "0.0")
    assert code == 2, out
    assert "the --old-corpus rows look like space 'new', not 'old'" in err and "PASS" not in out
    code, out, err = _eval(capsys, d, "--old-queries", d / "qo.npy", "--old-corpus", d / "old.npy",
                           "--old-corpus-rows", "0:-500", "--min-retention", "0.0")
    assert code == 0 and "PASS" in out, err  # the old model's own rows go on
    body = {"source": _b64(X[-500:]), "target": _b64(Y[-500:]), "queries": _b64(Qn), "relevant": rel.tolist(),
            "old_queries": _b64(Qo), "old_corpus": _b64(Y[:-500])}
    with TestClient(create_app(settings_for(d / "api", data_dir=d / "var"))) as c:
        r = c.post("/v1/maps/m/evaluate", json=body, headers=R)
        assert r.status_code == 422, r.text
        assert "the old_corpus rows look like space 'new'" in r.text
        r = c.post("/v1/maps/m/evaluate", json={**body, "old_corpus": _b64(X[:-500])}, headers=R)
        assert r.status_code == 200, r.text


def test_an_old_corpus_of_another_width_is_named_by_its_option_or_field(capsys, files):
    """A narrower file said "X_corpus: expected 32 columns, got 20" (align's parameter): the option / field now."""
    d = files
    X, Y, Qn, Qo, rel = _task()
    write_vectors(d / "narrow.npy", X[:-500, :20])
    code, out, err = _eval(capsys, d, "--old-queries", d / "qo.npy", "--old-corpus", d / "narrow.npy")
    assert code == 2, out
    assert "--old-corpus has 20 columns, but m:1 reads 32-wide rows" in err and "X_corpus" not in err
    body = {"source": _b64(X[-500:]), "target": _b64(Y[-500:]), "queries": _b64(Qn), "relevant": rel.tolist(),
            "old_queries": _b64(Qo), "old_corpus": _b64(X[:-500, :20])}
    with TestClient(create_app(settings_for(d / "api", data_dir=d / "var"))) as c:
        r = c.post("/v1/maps/m/evaluate", json=body, headers=R)
        assert r.status_code == 422, r.text
        assert "old_corpus has 20 columns" in r.text and "X_corpus" not in r.text


def test_an_old_corpus_of_the_held_out_documents_alone_is_refused(capsys, files):
    """--old-corpus-rows selecting just the held-out rows printed "0 rows of the old corpus mapped" and gated the
    held-out figure as "over the whole corpus"."""
    d = files
    code, out, err = _eval(capsys, d, "--old-queries", d / "qo.npy", "--old-corpus", d / "old.npy",
                           "--old-corpus-rows", "-500:", "--min-retention", "0.0")
    assert code == 2, out
    assert "no row of --old-corpus is left to map: all 500 repeat a held-out document" in err and "PASS" not in out
    X, Y, Qn, Qo, rel = _task()
    body = {"source": _b64(X[-500:]), "target": _b64(Y[-500:]), "queries": _b64(Qn), "relevant": rel.tolist(),
            "old_queries": _b64(Qo), "old_corpus": _b64(X[-500:])}
    with TestClient(create_app(settings_for(d / "api", data_dir=d / "var"))) as c:
        r = c.post("/v1/maps/m/evaluate", json=body, headers=R)
        assert r.status_code == 422, r.text
        assert "no row of old_corpus is left to map" in r.text
