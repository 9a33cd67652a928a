"""`vecbridge eval` on held-out sets too small for a figure: recall@10 of at most 10 pairs is undefined (it was 1.0
for any map: every partner is in the top 10 of 10), shown as such, null in JSON, never recorded as a tag (an earlier
recorded figure is removed rather than left stale); one pair is refused (top-1 1.0 among one candidate)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import run_cli as run

from service.io import write_vectors
from service.registry import open_registry


@pytest.fixture
def fitted(tmp_path, capsys):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(700, 24)).astype(np.float32)
    Y = (X @ np.linalg.qr(rng.normal(size=(24, 24)))[0] + 0.3 * rng.normal(size=X.shape)).astype(np.float32)
    for name, rows in (("fit", slice(0, 600)), ("many", slice(600, 650)), ("few", slice(650, 658)),
                       ("one", slice(660, 661))):
        write_vectors(tmp_path / f"x_{name}.npy", X[rows])
        write_vectors(tmp_path / f"y_{name}.npy", Y[rows])
    d = ["--data-dir", tmp_path / "var"]
    code, _, err = run(capsys, *d, "fit", "--pairs", "--source", tmp_path / "x_fit.npy", "--target",
                       tmp_path / "y_fit.npy", "--method", "procrustes", "--name", "m", "--quiet")
    assert code == 0, err
    return tmp_path, d


def _eval(capsys, tmp_path, d, name, *extra):
    return run(capsys, *d, "eval", "--map", "m", "--source", tmp_path / f"x_{name}.npy", "--target",
               tmp_path / f"y_{name}.npy", *extra)


def _tags(tmp_path) -> dict:
    reg = open_registry(f"sqlite:///{tmp_path / 'var' / 'registry.sqlite'}", tmp_path / "var" / "artifacts")
    try:
        return dict(reg.resolve("m").tags or {})
    finally:
        reg.close()


def test_recall_at_10_of_a_handful_of_pairs_is_undefined_and_not_recorded(fitted, capsys):
    tmp_path, d = fitted
    code, _, err = _eval(capsys, tmp_path, d, "many", "--record")
    assert code == 0, err
    assert 0.0 <= float(_tags(tmp_path)["eval.recall@10"]) <= 1.0  # 50 pairs: a figure, recorded
    code, out, err = _eval(capsys, tmp_path, d, "few", "--json", "--record")
    assert code == 0, err
    res = json.loads(out)
    assert res["recall@10"] is None and res["n_candidates"] == 8 and 0.0 <= res["recall@1"] <= 1.0
    tags = _tags(tmp_path)
    assert "eval.recall@10" not in tags  # not "nan", and not the 50 pairs' figure left beside the 8 pairs' top-1
    assert tags["eval.n_candidates"] == "8" and "eval.top1" in tags
    import warnings

    from align.exceptions import VecbridgeWarning

    with warnings.catch_warnings(record=True) as escaped:  # they reached stderr as raw Python warnings, twice
        warnings.simplefilter("always")
        code, out, err = _eval(capsys, tmp_path, d, "few")
    assert code == 0, err
    assert "recall@10 undefined (at most 10 pairs)" in out
    assert not [w for w in escaped if issubclass(w.category, VecbridgeWarning)], [str(w.message) for w in escaped]


def test_one_pair_is_refused_with_a_message(fitted, capsys):
    tmp_path, d = fitted
    code, out, err = _eval(capsys, tmp_path, d, "one", "--min-top1", "0.5")
    assert code not in (0, 1)  # neither PASS nor FAIL: no figure to gate on
    assert "at least 2 distinct held-out pairs, got 1" in out + err


def test_a_fit_of_a_handful_of_pairs_does_not_warn_about_its_training_recall(tmp_path, capsys):
    """The fit's diagnostics rank the training pairs (train_recall@10): on 8 pairs that figure is undefined, kept as
    null, and not a warning of the fit's (evaluate's warning is for a caller that asked for the figure)."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(8, 6)).astype(np.float32)
    write_vectors(tmp_path / "x.npy", X)
    write_vectors(tmp_path / "y.npy", X @ np.linalg.qr(rng.normal(size=(6, 6)))[0].astype(np.float32))
    code, out, err = run(capsys, "--data-dir", tmp_path / "var", "fit", "--pairs", "--source", tmp_path / "x.npy",
                         "--target", tmp_path / "y.npy", "--method", "procrustes", "--name", "tiny", "--json")
    assert code in (0, 1), err  # 8 pairs may be flagged unreliable; either way the version is registered
    assert "recall@10 undefined" not in out + err
    reg = open_registry(f"sqlite:///{tmp_path / 'var' / 'registry.sqlite'}", tmp_path / "var" / "artifacts")
    try:
        metrics = reg.get_version("tiny", 1).metrics
    finally:
        reg.close()
    assert metrics["train_n_candidates"] == 8 and np.isnan(metrics["train_recall@10"])
    assert 0.0 <= metrics["train_recall@5"] <= 1.0


def test_unequal_row_counts_are_said_as_fit_says_them_naming_the_files(fitted, capsys):
    """QA (session 55): eval of 50 source rows and 40 target rows said "X_src and Y_tgt must have the same number of
    rows (paired)", align's internal names; fit says "as many source rows as target rows". Now eval too, naming the
    files and rows read (HTTP: its fields)."""
    from _api_support import R, settings_for, vectors_b64
    from fastapi.testclient import TestClient

    from service.api import create_app

    tmp_path, d = fitted
    code, _, err = _eval(capsys, tmp_path, d, "many", "--target-rows", "0:40")
    assert code == 2 and err.strip() == ("vecbridge: error: eval needs as many source rows as target rows (held-out "
                                         "pairs: row i of each is one item), got 50 (x_many.npy) and 40 (y_many.npy "
                                         "rows 0:40)"), err
    np.save(tmp_path / "rows.npy", np.arange(30))
    code, _, err = _eval(capsys, tmp_path, d, "many", "--source-rows", tmp_path / "rows.npy")
    assert code == 2 and err.strip().endswith("got 30 (x_many.npy rows listed in rows.npy) and 50 (y_many.npy)"), err
    x, y = np.load(tmp_path / "x_many.npy"), np.load(tmp_path / "y_many.npy")
    with TestClient(create_app(settings_for(tmp_path / "svc", data_dir=tmp_path / "var"))) as c:
        r = c.post("/v1/maps/m/evaluate", headers=R, json={"source": vectors_b64(x), "target": vectors_b64(y[:40])})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["message"].startswith("eval needs as many source rows as target rows"), r.text
        assert r.json()["error"]["message"].endswith("got 50 (source) and 40 (target)"), r.text


def test_a_recorded_top1_at_chance_carries_its_chance_figure_and_ranks_no_path(fitted, capsys):
    """QA (session 55): ``eval --record`` without a gate stored a shuffled-pairs top-1 as ``eval.top1`` like a real
    one, and path choice ranked the version by it. It is still recorded, as measured, with ``eval.top1_chance_p``
    beside it (the chance a random map finds as many pairs); at chance a warning says so, path choice passes over it
    (the fit's own figure again) and the candidates' listing says why."""
    from service.registry.quality import judged, quality_words

    tmp_path, d = fitted
    rng = np.random.default_rng(1)
    y = np.load(tmp_path / "y_few.npy")
    write_vectors(tmp_path / "y_shuf.npy", y[rng.permutation(len(y))[::-1].copy()])
    write_vectors(tmp_path / "x_shuf.npy", np.load(tmp_path / "x_few.npy"))
    code, _, err = _eval(capsys, tmp_path, d, "many", "--record", "--quiet")
    assert code == 0 and "may be chance" not in err, err
    tags = _tags(tmp_path)
    assert float(tags["eval.top1_chance_p"]) < 0.01 and float(tags["eval.top1"]) > 0.5, tags
    reg = open_registry(f"sqlite:///{tmp_path / 'var' / 'registry.sqlite'}", tmp_path / "var" / "artifacts")
    try:
        assert judged(reg.resolve("m"))[2] == "eval"
    finally:
        reg.close()
    code, out, err = _eval(capsys, tmp_path, d, "shuf", "--record", "--json", "--quiet")
    assert code == 0, err
    assert "vecbridge: warning: the top-1 may be chance (" in err and "eval.top1_chance_p" in err, err
    res, tags = json.loads(out), _tags(tmp_path)
    assert tags["eval.top1"] == str(res["top1"]) and float(tags["eval.top1_chance_p"]) >= 0.01, tags
    assert float(tags["eval.top1_chance_p"]) == pytest.approx(res["top1_chance"]["chance_p"]), (tags, res)
    reg = open_registry(f"sqlite:///{tmp_path / 'var' / 'registry.sqlite'}", tmp_path / "var" / "artifacts")
    try:
        v = reg.resolve("m")
        assert judged(v)[2] == "fit", judged(v)  # the fit's own figure, not the one at chance
        assert "the recorded eval top-1" in quality_words(v) and "may be chance" in quality_words(v), quality_words(v)
    finally:
        reg.close()


def test_a_recorded_top1_at_chance_is_worded_of_the_figure_without_a_gate_and_of_the_pass_with_one(fitted, capsys):
    """QA (session 56): ``eval --record`` of a top-1 at chance without a gate warned "... so its pass says nothing",
    of a pass there was none of. Without a gate (or failing one) it is said of the figure; a gate of 0, which passes
    any top-1, keeps the pass's words."""
    tmp_path, d = fitted
    rng = np.random.default_rng(1)
    y = np.load(tmp_path / "y_few.npy")
    write_vectors(tmp_path / "y_shuf.npy", y[rng.permutation(len(y))[::-1].copy()])
    write_vectors(tmp_path / "x_shuf.npy", np.load(tmp_path / "x_few.npy"))
    code, out, err = _eval(capsys, tmp_path, d, "shuf", "--record", "--json", "--quiet")
    assert code == 0, err
    assert "the top-1 may be chance (" in err and "so the figure says nothing of the map)" in err, err
    assert "its pass says nothing" not in err, err
    code, out, err = _eval(capsys, tmp_path, d, "shuf", "--record", "--json", "--quiet", "--min-top1", "0")
    assert code == 0 and json.loads(out)["result"] == "PASS", err
    assert "the top-1 may be chance (" in err and "so its pass says nothing)" in err, err
