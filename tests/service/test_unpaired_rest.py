"""The unpaired rest of a paired fit through the faces: ``vecbridge fit --unpaired-source / --unpaired-target`` and
``POST /v1/fits``'s ``unpaired_source`` / ``unpaired_target``.

README's Python fits with ``align.fit_migration(..., unpaired_source=X_old)``; neither the CLI nor HTTP passed them, so
the frames, held-out distractors, hard negatives and cluster routing of a CLI or HTTP fit never saw the old corpus,
and ``semi_supervised`` could not run there at all. Same seed, same rows: the CLI and HTTP artifact is the bytes of
the Python fit.
"""

from __future__ import annotations

import base64
import hashlib
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from _api_support import W, settings_for
from _jobs_support import wait_http_job
from conftest import run_cli as run
from fastapi.testclient import TestClient

import align
from service.api import create_app
from service.io import write_vectors


def _data(n=900, d_s=16, d_t=12, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(12, d_s)) * 2
    X = centres[rng.integers(0, 12, n)] + rng.normal(size=(n, d_s))
    Y = X @ rng.normal(size=(d_s, d_t)) + 0.3 * rng.normal(size=(n, d_t))
    return X.astype(np.float32), Y.astype(np.float32)


X, Y = _data()
PAIRS = slice(0, 200)
REST = np.arange(899, 199, -1)  # the old corpus past the pairs, listed backwards: a rows file's order is kept


@pytest.fixture
def d(tmp_path):
    write_vectors(tmp_path / "old.npy", X)
    write_vectors(tmp_path / "new.npy", Y)
    np.save(tmp_path / "rest.npy", REST)
    return tmp_path


def _python(method="auto", seed=3, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return align.fit_migration(X[PAIRS], Y[PAIRS], method=method, random_state=seed, **kw)


def _fit(capsys, d, *args, method="auto", name="old->new"):
    return run(capsys, "--data-dir", d / "var", "fit", "--pairs", "--source", d / "old.npy", "--target",
               d / "new.npy", "--rows", "0:200", "--method", method, "--name", name, "--random-state", "3", "--json",
               "--quiet", "--allow-unreliable", *args)


@pytest.mark.parametrize("method, extra", [("auto", {}), ("contrastive", {"epochs": 3})])
def test_cli_fit_takes_the_unpaired_rest_and_fits_the_python_map(capsys, d, method, extra):
    params = [a for k, v in extra.items() for a in ("--param", f"{k}={json.dumps(v)}")]
    code, out, err = _fit(capsys, d, "--unpaired-source", d / "old.npy", "--unpaired-source-rows", d / "rest.npy",
                          "--unpaired-target", d / "new.npy", "--unpaired-target-rows", "600:900", *params,
                          method=method)
    assert code == 0, err
    v = json.loads(out)
    want = _python(method, unpaired_source=X[REST], unpaired_target=Y[600:900], **extra)
    assert Path(v["artifact_file"]).read_bytes() == want.to_bytes("safetensors")  # same seed and rows: the same bytes
    assert want.to_bytes() != _python(method, **extra).to_bytes()  # and the rest changed the map
    assert v["inputs"]["unpaired_source"] == {"path": str((d / "old.npy").resolve()),
                                              "rows": f"{(d / 'rest.npy').resolve()} (700 rows, sha256 "
                                                      f"{hashlib.sha256(REST.astype(np.int64).tobytes()).hexdigest()})",
                                              "shape": [700, 16]}
    assert v["inputs"]["unpaired_target"]["rows"] == "600:900" and v["inputs"]["unpaired_target"]["shape"] == [300, 12]
    assert v["inputs"]["n_unpaired_source"] == 700 and set(v["data_hashes"]) >= {"unpaired_source", "unpaired_target"}


def test_cli_semi_supervised_runs_with_both_unpaired_sets(capsys, d):
    code, out, err = _fit(capsys, d, "--unpaired-source", d / "old.npy", "--unpaired-source-rows", "200:900",
                          "--unpaired-target", d / "new.npy", "--unpaired-target-rows", "200:900",
                          "--param", "semi_supervised=sinkhorn", "--param", 'candidates=["procrustes"]')
    assert code == 0, err
    m = align.load_map(json.loads(out)["artifact_file"])
    assert m.metadata["semi_supervised"]["applied"] is True  # it ran: without both sets it was refused
    assert m.metadata["n_unpaired_target"] == 700
    assert json.loads(out)["metrics"]["semi_supervised"]["applied"] is True and "not applied" not in err


BOTH = ("--unpaired-source", "{d}/old.npy", "--unpaired-source-rows", "200:900", "--unpaired-target", "{d}/new.npy",
        "--unpaired-target-rows", "200:900", "--param", "semi_supervised=sinkhorn")


def test_semi_supervised_that_cannot_refine_the_chosen_map_says_so(capsys, d, tmp_path):
    """auto chose an affine map over procrustes (ridge: these targets are a general linear map of the sources), which
    the Sinkhorn refinement returns unchanged: the fit recorded "semi_supervised": "sinkhorn" in its params and said
    nothing (applied=False in the artifact only). The CLI notes it, the version's metrics record it, the HTTP job's
    notes say it; what it could never refine is refused (method contrastive, candidates without procrustes)."""
    code, out, err = _fit(capsys, d, *(a.format(d=d) for a in BOTH), "--param", 'candidates=["procrustes", "ridge"]')
    assert code == 0, err
    v = json.loads(out)
    semi = v["metrics"]["semi_supervised"]
    assert semi["applied"] is False and "ridge map is affine" in semi["why"], semi
    assert "vecbridge: note: semi_supervised=sinkhorn was not applied: it refines an orthogonal map" in err, err
    assert "the map is the ridge fit, unrefined" in err
    code, _, err = _fit(capsys, d, *(a.format(d=d) for a in BOTH), "--param", "epochs=1", method="contrastive",
                        name="c")
    assert code == 2 and "cannot follow method='contrastive'" in err, err
    code, _, err = _fit(capsys, d, *(a.format(d=d) for a in BOTH), "--param", 'candidates=["ridge"]', name="r")
    assert code == 2 and "candidates=['ridge'] hold no procrustes" in err, err
    # README: on the CLI and over HTTP the method is auto alone (procrustes there is the closed-form fit)
    code, _, err = _fit(capsys, d, *(a.format(d=d) for a in BOTH), method="procrustes", name="p")
    assert code == 2 and "apply to --method auto, contrastive, cluster" in err, err
    body = {"name": "old->new", "source_space": "old", "target_space": "new", "method": "auto", "random_state": 3,
            "paired": True, "source": _b64(X[PAIRS]), "target": _b64(Y[PAIRS]), "unpaired_source": _b64(X[200:]),
            "unpaired_target": _b64(Y[200:]), "params": {"semi_supervised": "sinkhorn", "candidates": ["ridge"]}}
    with TestClient(create_app(settings_for(tmp_path / "http", max_body_bytes=4_000_000))) as c:
        r = c.post("/v1/fits", headers=W, json=body)  # ridge alone: nothing it refines, refused before a job
        assert r.status_code == 422 and "candidates=['ridge'] hold no procrustes" in r.text, r.text
        procrustes = {**body, "method": "procrustes", "params": {"semi_supervised": "sinkhorn"}}
        r = c.post("/v1/fits", headers=W, json=procrustes)
        assert r.status_code == 422 and "apply to method auto, contrastive, cluster" in r.text, r.text
        body["params"]["candidates"] = ["procrustes", "ridge"]
        r = c.post("/v1/fits", headers=W, json=body)
        assert r.status_code == 202, r.text
        job = wait_http_job(c, r.json()["id"], headers=W)
    assert job["state"] == "succeeded", job
    assert any(n.startswith("semi_supervised=sinkhorn was not applied") for n in job["result"]["notes"]), job
    assert job["result"]["version"]["metrics"]["semi_supervised"]["applied"] is False


def test_http_auto_over_cluster_alone_with_semi_supervised_is_refused_and_cluster_left_out_is_noted(tmp_path):
    """auto with candidates ["cluster"] and semi_supervised fitted procrustes without a word; with other candidates
    beside it, cluster was dropped silently. The first is a 422 before any job, the second a note of the job."""
    body = {"name": "old->new", "source_space": "old", "target_space": "new", "method": "auto", "random_state": 3,
            "paired": True, "source": _b64(X[PAIRS]), "target": _b64(Y[PAIRS]), "unpaired_source": _b64(X[200:]),
            "unpaired_target": _b64(Y[200:]), "params": {"semi_supervised": "sinkhorn", "candidates": ["cluster"]}}
    with TestClient(create_app(settings_for(tmp_path, max_body_bytes=4_000_000))) as c:
        r = c.post("/v1/fits", headers=W, json=body)
        assert r.status_code == 422 and "candidates=['cluster']" in r.json()["error"]["message"], r.text
        body["params"]["candidates"] = ["procrustes", "cluster"]
        r = c.post("/v1/fits", headers=W, json=body)
        assert r.status_code == 202, r.text
        job = wait_http_job(c, r.json()["id"], headers=W)
    assert job["state"] == "succeeded", job
    sel = job["result"]["version"]["metrics"]["selection"]
    assert sel["chosen"] == "procrustes" and "cluster" in sel["not_tried"] and sel["why_chosen"], sel
    assert any(n.startswith("cluster not tried: semi_supervised") for n in job["result"]["notes"]), job


@pytest.mark.parametrize("params, message", [
    ({"semi_supervised": "sinkhorn", "candidates": ["cluster", "cluster"]}, "candidates=['cluster']"),
    ({"semi_supervised": "sinkhorn", "candidates": "cluster,cluster"}, "candidates=['cluster']"),
    ({"candidates": ["cluster", "cluster"], "max_cluster_mib": 0.0001}, "max_cluster_mib"),
])
def test_http_cluster_named_twice_is_cluster_alone_refused_before_a_job(tmp_path, params, message):
    """`["cluster", "cluster"]` with semi_supervised (or a budget too small for 2 clusters) was queued and failed as
    "internal error: ValueError: max() arg is an empty sequence"; it is the 422 of cluster alone, and no job."""
    body = {"name": "old->new", "source_space": "old", "target_space": "new", "method": "auto", "random_state": 3,
            "paired": True, "source": _b64(X[PAIRS]), "target": _b64(Y[PAIRS]), "unpaired_source": _b64(X[200:]),
            "unpaired_target": _b64(Y[200:]), "params": params}
    with TestClient(create_app(settings_for(tmp_path, max_body_bytes=4_000_000))) as c:
        r = c.post("/v1/fits", headers=W, json=body)
        assert r.status_code == 422 and message in r.json()["error"]["message"], r.text
        assert c.get("/v1/jobs", headers=W).json()["data"] == []


def test_http_default_auto_with_semi_supervised_has_no_cluster_note(tmp_path):
    """Every default auto fit with semi_supervised carried the job note "cluster not tried": it is for candidates
    named; the version's selection.not_tried records it always."""
    body = {"name": "old->new", "source_space": "old", "target_space": "new", "method": "auto", "random_state": 3,
            "paired": True, "source": _b64(X[PAIRS]), "target": _b64(Y[PAIRS]), "unpaired_source": _b64(X[200:]),
            "unpaired_target": _b64(Y[200:]), "params": {"semi_supervised": "sinkhorn"}}
    with TestClient(create_app(settings_for(tmp_path, max_body_bytes=4_000_000))) as c:
        r = c.post("/v1/fits", headers=W, json=body)
        assert r.status_code == 202, r.text
        job = wait_http_job(c, r.json()["id"], headers=W)
    assert job["state"] == "succeeded", job
    assert not any("cluster not tried" in n for n in job["result"]["notes"]), job["result"]["notes"]
    assert "cluster" in job["result"]["version"]["metrics"]["selection"]["not_tried"]


@pytest.mark.parametrize("args, method, message", [
    (["--unpaired-source", "{d}/old.npy"], "procrustes", "apply to --method auto, contrastive, cluster"),
    (["--unpaired-target", "{d}/new.npy"], "minivec2vec", "minivec2vec fits from two unpaired sets already"),
    (["--unpaired-source", "{d}/new.npy"], "auto", "--unpaired-source new.npy: rows of 12 columns, but the source"),
    (["--unpaired-target", "{d}/old.npy"], "cluster", "--unpaired-target old.npy: rows of 16 columns"),
    (["--unpaired-source", "{d}/nan.npy"], "auto", "NaN"),
    (["--unpaired-target-rows", "0:5"], "auto", "give --unpaired-target FILE too"),
    (["--unpaired-source", "{d}/old.npy", "--unpaired-source-rows", "0:5000"], "auto", "5000"),
    (["--unpaired-source", "{d}/words.txt"], "auto", "holds texts; this input takes vectors"),
])
def test_cli_refuses_unpaired_sets_it_cannot_use_in_one_line(capsys, d, args, method, message):
    bad = X[:50].copy()
    bad[7, 3] = np.nan
    write_vectors(d / "nan.npy", bad)
    (d / "words.txt").write_text("a\nb\n")
    code, _, err = _fit(capsys, d, *(a.format(d=d) for a in args), method=method)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not (d / "var" / "registry.sqlite").exists() or "old->new" not in run(
        capsys, "--data-dir", d / "var", "registry", "list", "--json")[1]


def _b64(a):
    return {"vectors_b64": base64.b64encode(np.ascontiguousarray(a, np.float32).tobytes()).decode(), "dim": a.shape[1]}


def test_http_fit_takes_the_unpaired_rest_and_refuses_what_it_cannot_use(tmp_path):
    body = {"name": "old->new", "source_space": "old", "target_space": "new", "method": "auto", "random_state": 3,
            "source": _b64(X[PAIRS]), "target": _b64(Y[PAIRS]), "unpaired_source": _b64(X[REST]),
            "unpaired_target": {"vectors": Y[600:900].tolist()}}
    inf = Y[:20].copy()
    inf[2, 2] = np.inf
    with TestClient(create_app(settings_for(tmp_path, max_batch=1000, max_body_bytes=4_000_000))) as c:
        for change, message in (({"method": "ridge"}, "apply to method auto, contrastive, cluster"),
                                ({"unpaired_source": _b64(Y[:20])}, "unpaired_source.vectors: rows of 12 columns"),
                                ({"unpaired_target": _b64(inf)}, "unpaired_target.vectors: 1 row(s) contain NaN"),
                                ({"unpaired_target": {**_b64(Y[:5]), "texts": ["a"]}}, "no other field"),
                                ({"unpaired_source": [[1.0]]}, "unpaired_source")):
            r = c.post("/v1/fits", headers=W, json={**body, **change})
            assert r.status_code == 422 and message in r.json()["error"]["message"], (change, r.text)
        r = c.post("/v1/fits", headers=W, json=body)
        assert r.status_code == 202, r.text
        job = wait_http_job(c, r.json()["id"], headers=W)
        assert job["state"] == "succeeded", job
        ref = job["result"]["ref"]
        v = c.get(f"/v1/maps/{ref}", headers=W).json()["resolved"]
        assert v["inputs"]["unpaired_source"] == "700 vectors" and v["inputs"]["n_unpaired_target"] == 300
        data = c.get(f"/v1/maps/{ref}/artifact", headers=W)
    want = _python("auto", unpaired_source=X[REST], unpaired_target=Y[600:900])
    assert data.status_code == 200 and data.content == want.to_bytes("safetensors")
