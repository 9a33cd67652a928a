"""Unpaired rows are checked against their side's space as the pairs are, and one map's frame cannot become a
space's reference against the space's other maps (:func:`service.spaces.check_fit_spaces`, ``space_references``).

QA (WordNet): ``fit --pairs --source minilm.npy --target e5.npy --unpaired-source e5.npy ... --source-space minilm``
registered, exit 0, with no word: only the width of unpaired rows was checked. The map's source frame was then fitted
on e5 rows and, first by name, became space 'minilm''s reference: e5 rows went into a MiniLM index unrefused and real
MiniLM rows were warned "unchecked". POST /v1/fits with e5 rows as ``unpaired_source`` the same.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from _api_support import W, settings_for, vectors_b64
from _jobs_support import wait_http_job
from conftest import run_cli
from fastapi.testclient import TestClient

from service.api import create_app

PAIRS, REST = slice(0, 400), slice(400, 2400)


@pytest.fixture(scope="module")
def files(wordnet, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("unpaired_space")
    out = {}
    for name in ("minilm", "e5"):
        out[name] = tmp / f"{name}.npy"
        np.save(out[name], np.asarray(wordnet[name][:3000], np.float32))
    return out


def _fit(capsys, data, files, *args, name="mi-e5"):
    return run_cli(capsys, "--data-dir", data, "fit", "--pairs", "--source", files["minilm"], "--target", files["e5"],
                   "--rows", "0:400", "--method", "auto", "--param", 'candidates=["procrustes"]', "--name", name,
                   "--source-space", "minilm", "--target-space", "e5", "--quiet", *args)


def test_cli_fit_refuses_unpaired_rows_of_the_other_sides_model(capsys, tmp_path, files):
    """On a registry with no map yet: the fit's own sides tell the unpaired rows' model."""
    data = tmp_path / "var"
    code, _, err = _fit(capsys, data, files, "--unpaired-source", files["e5"], "--unpaired-source-rows", "400:2400")
    assert code == 2 and "the unpaired source rows look like space 'e5', not 'minilm'" in err, err
    assert "(this fit's target rows)" in err and "--unpaired-target / unpaired_target" in err, err
    code, _, err = _fit(capsys, data, files, "--unpaired-target", files["minilm"], "--unpaired-target-rows", "400:2400")
    assert code == 2 and "the unpaired target rows look like space 'minilm', not 'e5'" in err, err
    assert json.loads(run_cli(capsys, "--data-dir", data, "registry", "list", "--json")[1])["maps"] == []
    code, out, err = _fit(capsys, data, files, "--unpaired-source", files["minilm"], "--unpaired-source-rows",
                          "400:2400", "--unpaired-target", files["e5"], "--unpaired-target-rows", "400:2400")
    assert code == 0 and "registered mi-e5:1" in out and "unpaired" not in err, err


def test_http_fit_refuses_unpaired_rows_of_the_other_sides_model(tmp_path, wordnet):
    mi, e5 = (np.asarray(wordnet[n][:2400], np.float32) for n in ("minilm", "e5"))
    body = {"name": "mi-e5", "source_space": "minilm", "target_space": "e5", "method": "auto",
            "params": {"candidates": ["procrustes"]}, "source": vectors_b64(mi[PAIRS]),
            "target": vectors_b64(e5[PAIRS])}
    with TestClient(create_app(settings_for(tmp_path, max_batch=5000, max_body_bytes=20_000_000))) as c:
        for key, rows, message in (("unpaired_source", e5[REST], "the unpaired source rows look like space 'e5'"),
                                   ("unpaired_target", mi[REST], "the unpaired target rows look like space 'minilm'")):
            # refused with the request, as the CLI refuses them (they were a 202 and a failed job)
            r = c.post("/v1/fits", headers=W, json={**body, key: vectors_b64(rows)})
            assert r.status_code == 422 and message in r.json()["error"]["message"], r.text
        assert c.get("/v1/jobs", headers=W).json()["data"] == []
        assert c.get("/v1/maps", headers=W).json()["data"] == []
        r = c.post("/v1/fits", headers=W, json={**body, "unpaired_source": vectors_b64(mi[REST])})
        job = wait_http_job(c, r.json()["id"], headers=W)
        assert job["state"] == "succeeded", job
        # mi-e5:1 references both spaces now: sides swapped are a 422 with the request too, not a failed job
        jobs = c.get("/v1/jobs", headers=W).json()["data"]
        r = c.post("/v1/fits", headers=W, json={**body, "source": vectors_b64(e5[REST]),
                                                "target": vectors_b64(mi[REST])})
        assert r.status_code == 422 and "the files look swapped" in r.json()["error"]["message"], r.text
        r = c.post("/v1/fits", headers=W, json={**body, "unpaired_target": vectors_b64(mi[REST])})
        assert r.status_code == 422 and "the unpaired target rows look like space 'minilm'" in r.text, r.text
        assert c.get("/v1/jobs", headers=W).json()["data"] == jobs


def test_one_map_of_another_models_rows_is_not_a_spaces_reference(capsys, tmp_path, files):
    """A map fitted on e5 rows under space 'minilm' (first by name and by age, as in QA) and a MiniLM map beside it:
    the first one's 'minilm' side agrees with space 'e5''s references, not with the other 'minilm' one, so it is
    left out; e5 rows are refused from a MiniLM index again, and MiniLM rows pass without a warning."""
    data = tmp_path / "var"
    base = ("--data-dir", data, "fit", "--pairs", "--rows", "0:400", "--method", "procrustes", "--source-space",
            "minilm", "--target-space", "e5", "--quiet", "--target", files["e5"])
    code, _, err = run_cli(capsys, *base, "--source", files["e5"], "--name", "bad")  # nothing to tell it by yet
    assert code == 0, err
    code, _, err = run_cli(capsys, *base, "--source", files["minilm"], "--name", "good")
    assert code == 0, err
    idx = ("--data-dir", data, "index")
    code, _, err = run_cli(capsys, *idx, "create", "docs", "--space", "minilm", files["minilm"], "--rows", "400:1400",
                           "--quiet")
    assert code == 0 and "warning" not in err, err
    code, _, err = run_cli(capsys, *idx, "add", "docs", files["e5"], "--rows", "1400:1500", "--quiet")
    assert code == 2 and "look like space 'e5', not 'minilm'" in err, err
    code, out, err = run_cli(capsys, *idx, "add", "docs", files["minilm"], "--rows", "1500:1600", "--quiet")
    assert code == 0 and "added 100 rows" in out and err == "", err
