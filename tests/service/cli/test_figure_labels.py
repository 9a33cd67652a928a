"""A fit's figures are shown labelled wherever they are shown: ``registry show`` printed ``train_cos`` bare in the
metrics JSON (neither its frame, the target's centred one, nor that it is of the training pairs), and an auto fit's
candidates' raw-output cosines as a bare ``cos``. Records written before the labels still show, and truthfully."""

from __future__ import annotations

import json
import re
import sqlite3

import numpy as np
import pytest
from conftest import run_cli as run

import align
from align.frames import unit_rows
from service.io import write_vectors
from service.reports import render_report


@pytest.fixture
def data(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 16)).astype(np.float32)
    Y = X @ rng.normal(size=(16, 12)) + rng.normal(size=(300, 12))
    Y = (Y + 4.0 * np.abs(Y).mean()).astype(np.float32)  # a common offset: raw and centred cosines differ
    write_vectors(tmp_path / "x.npy", X)
    write_vectors(tmp_path / "y.npy", Y)
    return tmp_path, X, Y


def _fit(capsys, d, *args):
    code, out, err = run(capsys, "--data-dir", d / "var", "fit", "--source", d / "x.npy", "--target", d / "y.npy",
                         "--name", "x-y", "--quiet", *args)
    assert code == 0, err
    return out


def _show(capsys, d) -> str:
    code, out, err = run(capsys, "--data-dir", d / "var", "registry", "show", "x-y")
    assert code == 0, err
    return out


def _rewrite_metrics(d, edit) -> None:
    """Make version 1 a record written before the labels: ``edit(metrics)`` as an older vecbridge stored it."""
    with sqlite3.connect(d / "var" / "registry.sqlite") as c:
        m = json.loads(c.execute("SELECT metrics FROM versions WHERE name = 'x-y' AND version = 1").fetchone()[0])
        edit(m)
        c.execute("UPDATE versions SET metrics = ? WHERE name = 'x-y' AND version = 1", (json.dumps(m),))


def test_registry_show_labels_train_cos_as_the_fit_does(capsys, data):
    d, X, Y = data
    fit_line = _fit(capsys, d, "--method", "procrustes")
    m = align.fit_procrustes(X, Y)  # what the CLI fits from these pairs
    centred = align.evaluate(m, X, Y)["cos"]
    raw = float(np.mean(np.sum(unit_rows(m.apply(X, output="raw")) * unit_rows(Y), 1)))
    assert abs(raw - centred) > 0.05, (raw, centred)
    label = f"{centred:.4f} (centred; raw {raw:.4f})"
    assert f"train_cos={label}" in fit_line
    out = _show(capsys, d)
    line = re.search(r"^train_cos +(.*)$", out, re.M)
    assert line and line.group(1).startswith(label) and "pairs the map was fitted on (optimistic" in line.group(1)
    assert out.index("\nmetrics ") < line.start() < out.index("\nartifact_sha256 ")  # under the metrics it labels


def test_an_older_version_without_the_raw_figure_says_only_what_it_knows(capsys, data):
    d, _, _ = data
    _fit(capsys, d, "--method", "procrustes")
    kept = {}
    _rewrite_metrics(d, lambda m: kept.update(cos=m["train_cos"], raw=m.pop("train_cos_raw")))
    out = _show(capsys, d)
    assert re.search(rf"^train_cos +{kept['cos']:.4f} \(centred\) on the pairs", out, re.M), out
    assert f"{kept['raw']:.4f}" not in out and "raw" not in re.search(r"^train_cos .*$", out, re.M).group(0)


def test_an_unpaired_fit_has_no_train_cos_line(capsys, data):
    d, _, _ = data
    _fit(capsys, d, "--method", "procrustes")
    _rewrite_metrics(d, lambda m: [m.pop(k) for k in list(m) if k.startswith("train_")])
    assert not re.search(r"^train_cos", _show(capsys, d), re.M)


def test_an_auto_fits_candidate_cosines_are_cos_raw_in_new_and_old_records(capsys, data):
    d, _, _ = data
    _fit(capsys, d, "--method", "auto", "--param", 'candidates=["procrustes","ridge"]')
    code, out, _ = run(capsys, "--data-dir", d / "var", "registry", "show", "x-y", "--json")
    sel = json.loads(out)["metrics"]["selection"]
    assert all("cos_raw" in c and "cos" not in c for c in sel["candidates"].values())
    shown = json.loads(re.search(r"^metrics +(.*)$", _show(capsys, d), re.M).group(1))["selection"]
    assert shown["candidates"] == sel["candidates"]
    # a record from before the name: its candidates' raw cosine was `cos`; it loads and shows as cos_raw
    def rename(m):
        for c in m["selection"]["candidates"].values():
            c["cos"] = c.pop("cos_raw")

    _rewrite_metrics(d, rename)
    code, out, _ = run(capsys, "--data-dir", d / "var", "registry", "show", "x-y", "--json")
    assert code == 0 and all("cos" in c for c in json.loads(out)["metrics"]["selection"]["candidates"].values())
    old = json.loads(re.search(r"^metrics +(.*)$", _show(capsys, d), re.M).group(1))["selection"]
    assert old["candidates"] == sel["candidates"]


@pytest.mark.parametrize("key", ["cos_raw", "cos"])
def test_the_reports_selection_table_shows_the_raw_cosine_labelled_for_old_records_too(key):
    sel = {"metric": "score", "chosen": "ridge", "n_train": 80, "n_holdout": 20,
           "candidates": {"procrustes": {"score": 0.5, key: 0.81234}, "ridge": {"score": 0.7, key: 0.93456}}}
    html = render_report(title="t", summary={"map": "a2b"}, metrics={"selection": sel, "train_cos": 0.5,
                                                                      "train_cos_raw": 0.75},
                         timings={}, diagnostics=None, cosines={}, clouds=None, paired=True)
    section = html[html.index("Method selection"):]
    assert "<th>cos_raw</th>" in section and "<td>0.9346</td>" in section and "<th>cos</th>" not in section
    assert "train_cos (centred; raw 0.7500)<b>0.5</b>" in html  # four decimals, as the fit's line and registry show


@pytest.mark.parametrize("cands", ['["cluster"]', '["cluster","cluster"]'])
def test_auto_restricted_to_cluster_with_semi_supervised_is_refused_before_a_fit(capsys, data, cands):
    """It fitted procrustes and registered it as asked-for auto over cluster, without a word; cluster named twice
    was an internal error (exit 3, "max() arg is an empty sequence"). Both are a refusal, exit 2."""
    d, X, Y = data
    write_vectors(d / "us.npy", X[::-1].copy())
    write_vectors(d / "ut.npy", Y[::-1].copy())
    code, out, err = run(capsys, "--data-dir", d / "var", "fit", "--source", d / "x.npy", "--target", d / "y.npy",
                         "--name", "x-y", "--quiet", "--method", "auto", "--param", f"candidates={cands}",
                         "--param", "semi_supervised=sinkhorn", "--unpaired-source", d / "us.npy",
                         "--unpaired-target", d / "ut.npy")
    assert code == 2 and "candidates=['cluster']" in err and "semi_supervised" in err, (code, out, err)
    assert "registered" not in out and "internal error" not in err


@pytest.mark.parametrize("method", ["procrustes", "ridge", "lowrank"])
def test_a_fit_with_center_false_is_not_labelled_centred(capsys, data, method):
    """With ``--param center=false`` nothing is centred: train_cos is the raw output's (train_cos_raw the same
    figure), and the fit's line, registry show and the report said "(centred; raw X)" of it."""
    d, _, _ = data
    rank = ["--param", "rank=4"] if method == "lowrank" else []
    line = _fit(capsys, d, "--method", method, "--param", "center=false", *rank)
    code, out, _ = run(capsys, "--data-dir", d / "var", "registry", "show", "x-y", "--json")
    v = json.loads(out)
    assert v["params"]["center"] is False and v["metrics"]["train_cos"] == pytest.approx(v["metrics"]["train_cos_raw"],
                                                                                           abs=1e-6)
    want = f"train_cos={v['metrics']['train_cos']:.4f} (raw frame: fitted with center=false)"
    assert want in line and "centred" not in line, line
    shown = re.search(r"^train_cos +(.*)$", _show(capsys, d), re.M).group(1)
    assert shown.startswith(f"{v['metrics']['train_cos']:.4f} (raw frame: fitted with center=false)"), shown
    report = (d / "var" / "reports" / v["report_path"]).read_text()
    assert "train_cos (raw frame: fitted with center=false)<b>" in report and "train_cos (centred" not in report
    _fit(capsys, d, "--method", method, *rank)  # the default centres, and says so
    assert "(centred; raw " in re.search(r"^train_cos +(.*)$", _show(capsys, d), re.M).group(1)
