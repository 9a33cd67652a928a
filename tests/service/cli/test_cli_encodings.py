"""Text that is not UTF-8 on the way in (a file name's undecodable bytes) and output encodings that are not UTF-8 on
the way out: the CLI, the registry and the HTTP answers keep working, with the odd characters escaped."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import numpy as np
import pytest
from _api_support import R, settings_for
from _servers import ROOT
from conftest import run_cli as run

BAD = os.fsdecode(b"bad\xff\xfe.npy")  # what the CLI gets from argv for $'bad\xff\xfe.npy' (surrogate escapes)
SHOWN = "bad\\xff\\xfe.npy"  # how a record names it now


@pytest.fixture
def files(tmp_path):
    """16-d paired rows (target = rotated source) in ``tgt.npy`` and in a source file named BAD; ±1 / 0 labels."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 16)).astype(np.float32)
    np.save(tmp_path / BAD, X)
    np.save(tmp_path / "tgt.npy", (X @ np.linalg.qr(rng.standard_normal((16, 16)))[0]).astype(np.float32))
    labels = np.zeros(300)
    labels[:50], labels[50:100] = 1, -1
    np.save(tmp_path / "labels.npy", labels)
    return tmp_path


def _get(data_root, *routes):
    """``GET`` each route of the service over ``data_root / "data"`` (read key): ``[(status, json or text)]``."""
    from fastapi.testclient import TestClient

    from service.api import create_app

    with TestClient(create_app(settings_for(data_root))) as client:
        out = []
        for route in routes:
            r = client.get(route, headers=R)
            out.append((r.status_code, r.json() if r.status_code == 200 else r.text))
        return out


def _fits(capsys, d, source):
    """``fit`` of map nb and ``steer fit`` of steer st (mean-shift) from ``source``: their exit codes and stderr."""
    var = ["--data-dir", d / "data"]
    fit = run(capsys, *var, "fit", "--source", d / source, "--target", d / "tgt.npy", "--source-space", "a",
              "--target-space", "b", "--method", "procrustes", "--name", "nb", "--quiet", "--json")
    steer = run(capsys, *var, "steer", "fit", "--space", "a", "--vectors", d / source, "--labels", d / "labels.npy",
                "--method", "mean-shift", "--name", "st", "--quiet", "--json")
    return fit, steer


def test_an_input_file_name_that_is_not_utf8_is_recorded_escaped(capsys, files):
    """`fit --source $'bad\\xff\\xfe.npy'` registered the version, then failed writing its report (exit 3, "internal
    error: UnicodeEncodeError"), and `GET /v1/maps/nb` answered 500 from then on (orjson refuses the surrogate the
    record held); `steer fit --vectors` the same for `GET /v1/steers/st`. Now the name is recorded with its bytes as
    \\xNN escapes: exit 0, the report written, every answer 200."""
    (code, out, err), (s_code, s_out, s_err) = _fits(capsys, files, BAD)
    assert code == 0 and "Traceback" not in err, err
    v = json.loads(out)
    assert v["inputs"]["source"]["path"] == str(files / SHOWN)
    assert json.dumps(SHOWN)[1:-1] in (files / "data" / "reports" / v["report_path"]).read_text(encoding="utf-8")
    assert s_code == 0, s_err
    assert json.loads(s_out)["inputs"]["vectors"] == str(files / SHOWN)
    code, out, err = run(capsys, "--data-dir", files / "data", "registry", "show", "nb:1")
    assert code == 0 and json.dumps(SHOWN)[1:-1] in out, err  # inputs as JSON
    answers = _get(files, "/v1/maps/nb", "/v1/maps/nb/versions", "/v1/steers/st")
    assert [status for status, _ in answers] == [200, 200, 200], answers
    assert answers[0][1]["resolved"]["inputs"]["source"]["path"] == str(files / SHOWN)
    assert answers[2][1]["inputs"]["vectors"] == str(files / SHOWN)


def test_a_record_stored_with_a_lone_surrogate_is_answered(capsys, files, tmp_path):
    """A record an older version stored with a file name's surrogate escapes (before they were escaped on the way
    in) answered 500 for good; its answers now carry the name escaped."""
    (fit, _, err), (steer, _, s_err) = _fits(capsys, files, "tgt.npy")
    assert fit == 0 and steer == 0, err + s_err
    old = json.dumps({"via": "cli", "source": {"path": str(files / BAD)}, "half": "x\ud800"})  # as json.dumps stored it
    with sqlite3.connect(files / "data" / "registry.sqlite") as db:
        assert db.execute("UPDATE versions SET inputs = ?", (old,)).rowcount == 1
        assert db.execute("UPDATE steers SET inputs = ?", (old,)).rowcount == 1
    db.close()
    answers = _get(files, "/v1/maps/nb", "/v1/maps/nb/versions", "/v1/steers/st", "/v1/maps/nb/versions/1")
    assert [status for status, _ in answers] == [200] * 4, answers
    assert answers[0][1]["resolved"]["inputs"]["source"]["path"] == str(files / SHOWN)
    assert answers[2][1]["inputs"] == {"via": "cli", "source": {"path": str(files / SHOWN)}, "half": "x\\ud800"}


def _latin1(*args):
    env = {**os.environ, "PYTHONIOENCODING": "latin-1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "service.cli", *map(str, args)], capture_output=True, env=env,
                          check=False, timeout=120)


def test_an_output_encoding_that_is_not_utf8_escapes_what_it_cannot_write(capsys, files):
    """Under PYTHONIOENCODING=latin-1 (or cp1252, an ISO-8859 locale) `fit --help` (its "↔") and `registry show` of
    a description with an emoji were "internal error: UnicodeEncodeError", exit 3. Now what the encoding cannot
    hold is written as a backslash escape, the rest as it is."""
    p = _latin1("fit", "--help")
    assert p.returncode == 0 and b"row i \\u2194 row i" in p.stdout, p.stderr
    d = files / "data"
    code, _, err = run(capsys, "--data-dir", d, "fit", "--source", files / "tgt.npy", "--target", files / BAD,
                       "--source-space", "a", "--target-space", "b", "--method", "procrustes", "--name", "m",
                       "--description", "d\u00e9ploy\u00e9 \U0001f680", "--quiet")
    assert code == 0, err
    p = _latin1("--data-dir", d, "registry", "show", "m:1")
    assert p.returncode == 0, p.stderr
    assert "d\u00e9ploy\u00e9 \\U0001f680".encode("latin-1") in p.stdout  # é is latin-1: written as is


def test_registry_show_writes_tags_and_paths_as_they_are(capsys, files):
    """`registry show` printed a record's dicts as ASCII JSON: a tag 'owner=张' as "\\u5f20", an input 中.npy as
    "\\u4e2d.npy". Now they read as written (a file name that is not UTF-8 still with its \\xNN escapes)."""
    (files / "中.npy").write_bytes((files / BAD).read_bytes())
    d = files / "data"
    code, _, err = run(capsys, "--data-dir", d, "fit", "--source", files / "中.npy", "--target", files / "tgt.npy",
                       "--source-space", "a", "--target-space", "b", "--method", "procrustes", "--name", "m",
                       "--tag", "owner=张", "--quiet")
    assert code == 0, err
    code, out, err = run(capsys, "--data-dir", d, "registry", "show", "m:1")
    assert code == 0, err
    assert '"owner": "张"' in out and str(files / "中.npy") in out and "\\u" not in out, out
