"""Migration through the faces: `vecbridge fit --method auto`, `vecbridge plan`, `eval --min-retention`, POST /v1/plans."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.api import create_app
from service.io import write_vectors
from _api_support import R, settings_for
from conftest import run_cli as run
from conftest import run_cli_on_a_terminal


def _pairs(n=900, d_s=16, d_t=12, noise=0.05, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(12, d_s)) * 2
    X = centres[rng.integers(0, 12, n)] + rng.normal(size=(n, d_s))
    A = rng.normal(size=(d_s, d_t))
    Y = X @ A + noise * rng.normal(size=(n, d_t))
    return X.astype(np.float32), Y.astype(np.float32)


@pytest.fixture
def data(tmp_path):
    X, Y = _pairs()
    write_vectors(tmp_path / "old.npy", X)
    write_vectors(tmp_path / "new.npy", Y)
    write_vectors(tmp_path / "bad.npy", np.where(np.arange(12) == 0, np.nan, Y))
    return tmp_path


def test_fit_auto_registers_chosen_family_then_retention_gate(capsys, data):
    d = data
    code, out, err = run(capsys, "--data-dir", d / "var", "fit", "--pairs", "--source", d / "old.npy", "--target",
                         d / "new.npy", "--rows", "0:600", "--method", "auto", "--name", "old->new", "--json",
                         "--quiet", "--param", "candidates=[\"procrustes\", \"ridge\"]")
    assert code == 0, err
    v = json.loads(out)
    assert v["method"] == "auto" and v["metrics"]["selection"]["chosen"] == "ridge"  # the planted map is affine
    assert set(v["metrics"]["selection"]["candidates"]) == {"procrustes", "ridge"}
    common = ["--data-dir", d / "var", "eval", "--map", "old->new", "--source", d / "old.npy", "--target",
              d / "new.npy", "--rows", "600:900", "--json"]
    code, out, err = run(capsys, *common, "--min-retention", "0.5")
    res = json.loads(out)
    assert code == 0 and res["result"] == "PASS" and res["retention"] >= 0.5, err
    code, out, _ = run(capsys, *common, "--min-retention", "1.0")
    res = json.loads(out)
    assert (code == 1) == (res["retention"] < 1.0) and res["result"] == ("PASS" if code == 0 else "FAIL")


def test_plan_cli_table_json_and_rows_file(capsys, data):
    """``--json`` with ``--rows-out`` gave ``rows_to_embed`` as a count (900) where POST /v1/plans, the client and
    ``align.plan_migration`` give the indices under that key: one key, two types. It is the indices everywhere."""
    d = data
    args = ["--data-dir", d / "var", "plan", "--old", d / "old.npy", "--probe-source", d / "old.npy",
            "--probe-target", d / "new.npy", "--probe-rows", "0:300", "--random-state", "3"]
    code, out, err = run(capsys, *args)
    assert code == 0, err
    assert "alignability" in out and "recommended: method" in out
    table = out
    code, out, err = run(capsys, *args, "--json", "--rows-out", d / "rows.npy")
    assert code == 0, err
    plan = json.loads(out)
    assert all(f"{q['k']:>7}  {q['method']:>10}" in table for q in plan["predicted"])  # each K names its method
    rows = np.load(d / "rows.npy")
    assert rows.size == min(plan["recommended"]["k"], 900) == len(plan["rows_to_embed"])
    assert plan["rows_to_embed"] == rows.tolist() and plan["rows_out"] == str((d / "rows.npy").resolve())
    code, out, err = run(capsys, *args, "--json")
    assert code == 0 and json.loads(out)["rows_to_embed"] == rows.tolist(), err  # the same with or without the file
    X, Y = np.load(d / "old.npy"), np.load(d / "new.npy")
    with TestClient(create_app(settings_for(d / "http"))) as c:
        r = c.post("/v1/plans", json={"old": _b64(X), "probe_source": _b64(X[:300]), "probe_target": _b64(Y[:300]),
                                      "random_state": 3}, headers=R)
        assert r.status_code == 200 and r.json()["rows_to_embed"] == rows.tolist(), r.text  # HTTP's key, same rows
    assert 0.0 <= plan["alignability"] <= 1.0
    assert all(q["low"] <= q["retention"] <= q["high"] for q in plan["predicted"])


def _splitting_target(predicted: list[dict]) -> tuple[float, int, int]:
    """A target retention that the ``kept`` forecast reaches at a smaller K than ``retention`` does, and the K each
    recommendation should then be (the smallest whose forecast reaches it; the whole corpus always does)."""
    for q in predicted:
        t = (q["retention"] + q["kept"]["retention"]) / 2
        plain = min(p["k"] for p in predicted if p["retention"] >= t or p.get("whole_corpus"))
        keep = min(p["k"] for p in predicted if p["kept"]["retention"] >= t)
        if keep < plain:
            return t, plain, keep
    raise AssertionError(f"no target separates the two forecasts: {predicted}")


def test_plan_cli_keep_recommends_from_the_rows_kept_forecast_and_says_so(capsys, data):
    """Issue 16: `plan` recommended the K whose every-row-mapped retention reaches the target even for a migration
    that keeps its re-embedded rows (`transform --keep-rows`), whose 'rows kept' forecast reaches it at a smaller K
    on a small corpus. `--keep` reads that column, and both the table and --json say which forecast was read."""
    d = data
    args = ["--data-dir", d / "var", "plan", "--old", d / "old.npy", "--probe-source", d / "old.npy",
            "--probe-target", d / "new.npy", "--probe-rows", "0:300", "--random-state", "3"]
    code, out, err = run(capsys, *args, "--json")
    assert code == 0, err
    target, k_plain, k_keep = _splitting_target(json.loads(out)["predicted"])
    args += ["--target-retention", repr(target)]
    code, out, err = run(capsys, *args, "--json")
    assert code == 0, err
    assert json.loads(out)["recommended"]["k"] == k_plain and json.loads(out)["recommended"]["forecast"] == "retention"
    code, out, err = run(capsys, *args, "--keep", "--json", "--rows-out", d / "rows.npy")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["recommended"]["k"] == k_keep and plan["recommended"]["forecast"] == "kept"
    assert np.load(d / "rows.npy").size == k_keep  # the rows to re-embed are those of the kept K
    code, out, err = run(capsys, *args, "--keep")
    assert code == 0 and f"K = {k_keep} rows to re-embed (read from the rows kept forecast: --keep)" in out, err
    code, out, err = run(capsys, *args)
    assert code == 0 and f"K = {k_plain} rows to re-embed" in out and "rows kept forecast" not in out, err


def test_http_plan_keep_reads_the_kept_forecast_and_refuses_what_is_no_bool(tmp_path):
    X, Y = _pairs()
    base = {"old": _b64(X), "probe_source": _b64(X[:300]), "probe_target": _b64(Y[:300]), "random_state": 3}
    with TestClient(create_app(settings_for(tmp_path))) as c:
        r = c.post("/v1/plans", json=base, headers=R)
        assert r.status_code == 200, r.text
        target, k_plain, k_keep = _splitting_target(r.json()["predicted"])
        answers = {}
        for keep in (False, True):
            r = c.post("/v1/plans", json={**base, "target_retention": target, "keep": keep}, headers=R)
            assert r.status_code == 200, r.text
            answers[keep] = r.json()["recommended"]
        assert (answers[False]["k"], answers[False]["forecast"]) == (k_plain, "retention")
        assert (answers[True]["k"], answers[True]["forecast"]) == (k_keep, "kept")
        r = c.post("/v1/plans", json={**base, "keep": "sometimes"}, headers=R)  # a bool as pydantic reads one
        assert r.status_code == 422 and "keep" in r.text, r.text


def test_plan_shows_progress_on_stderr_unless_quiet_or_json(capsys, data):
    """A labelled plan over a 40,960-row corpus ran ~20 s without a sign of life; its learning curve and row
    selection now draw bars on stderr when it is a terminal (the plan itself unchanged); into a log (stderr not a
    terminal) nothing. ``--json`` output is the result alone, as with ``--quiet``."""
    d = data
    args = ["--data-dir", d / "var", "plan", "--old", d / "old.npy", "--probe-source", d / "old.npy",
            "--probe-target", d / "new.npy", "--probe-rows", "0:300"]
    code, out, err = run_cli_on_a_terminal(*args)
    assert code == 0 and "learning curve" in err and "rows to re-embed" in err, err
    code, logged_out, err = run(capsys, *args)
    assert code == 0 and err == "" and logged_out == out
    code, quiet_out, quiet_err = run(capsys, *args, "--quiet")
    assert code == 0 and quiet_err == "" and quiet_out == out
    code, json_out, json_err = run(capsys, *args, "--json")
    assert code == 0 and json_err == "" and json.loads(json_out)["recommended"]


def test_plan_rows_out_is_written_where_it_says_or_refused_up_front(capsys, data, monkeypatch):
    """np.save appended .npy to any other name, so the path printed was not the file written; the file is
    now written atomically (service.storage.atomic_write), and another suffix is refused before the plan."""
    import service.cli.maps as cli_maps

    d = data
    args = ["--data-dir", d / "var", "plan", "--old", d / "old.npy", "--probe-source", d / "old.npy",
            "--probe-target", d / "new.npy", "--probe-rows", "0:300"]
    for name in ("rows", "rows.txt"):
        code, out, err = run(capsys, *args, "--rows-out", d / name)
        assert code == 2 and "--rows-out" in err and "Traceback" not in err
        assert not list(d.glob("rows*"))
    written = []
    real = cli_maps.atomic_write
    monkeypatch.setattr(cli_maps, "atomic_write", lambda path, data: written.append(path) or real(path, data))
    code, out, err = run(capsys, *args, "--rows-out", d / "sub" / "rows.npy")
    assert code == 0, err
    assert [str(p) for p in written] == [str(d / "sub" / "rows.npy")] and f"written to {d / 'sub' / 'rows.npy'}" in out
    assert np.load(d / "sub" / "rows.npy").dtype == np.int64


def test_plan_rows_to_embed_index_the_old_file_itself_with_old_rows(capsys, data):
    """``--rows-out`` is documented as "int64 indices into --old", but with ``--old-rows 600:900`` it held
    indices into the 300 selected rows (0..299): re-embedding the rows it named re-embedded rows 0..299 of the
    corpus, the wrong documents, with no error. The rows of a plan over the selected rows are now numbered in
    the whole file (the same plan as over a file holding only those rows, each index plus 600), in
    ``--rows-out`` and in the JSON ``rows_to_embed`` alike."""
    d = data
    write_vectors(d / "tail.npy", np.load(d / "old.npy")[600:])
    args = ["--data-dir", d / "var", "plan", "--probe-source", d / "old.npy", "--probe-target", d / "new.npy",
            "--probe-rows", "0:300", "--quiet"]
    code, out, err = run(capsys, *args, "--old", d / "tail.npy", "--json")
    assert code == 0, err
    alone = json.loads(out)["rows_to_embed"]
    for spec in ("600:900", "-300:"):
        code, out, err = run(capsys, *args, "--old", d / "old.npy", "--old-rows", spec, "--json")
        assert code == 0, err
        assert json.loads(out)["rows_to_embed"] == [600 + i for i in alone]
    code, out, err = run(capsys, *args, "--old", d / "old.npy", "--old-rows", "600:", "--rows-out", d / "rows.npy")
    assert code == 0, err
    assert np.load(d / "rows.npy").tolist() == [600 + i for i in alone] and min(alone) < 300 <= 600


def _labelled(d, X, Y, rows, q=80, seed=0):
    """Queries near ``q`` of the probe rows ``rows`` in each model; their probe rows as relevant documents."""
    rng = np.random.default_rng(seed)
    rel = rng.choice(len(rows), q, replace=False)
    write_vectors(d / "q_new.npy", Y[rows][rel] + 0.5 * rng.normal(size=(q, Y.shape[1])).astype(np.float32))
    write_vectors(d / "q_old.npy", X[rows][rel] + 0.5 * rng.normal(size=(q, X.shape[1])).astype(np.float32))
    np.save(d / "relevant.npy", rel)
    return rel


def test_plan_cli_with_labelled_queries_predicts_their_retention_over_the_corpus(capsys, data):
    d = data
    X, Y = np.load(d / "old.npy"), np.load(d / "new.npy")
    _labelled(d, X, Y, np.arange(300))
    args = ["--data-dir", d / "var", "plan", "--old", d / "old.npy", "--probe-source", d / "old.npy",
            "--probe-target", d / "new.npy", "--probe-rows", "0:300", "--queries", d / "q_new.npy",
            "--old-queries", d / "q_old.npy", "--relevant", d / "relevant.npy"]
    code, out, err = run(capsys, *args)
    assert code == 0, err
    assert "labelled R@10 retention of the given queries" in out and "80 queries over 900 documents" in out
    code, out, err = run(capsys, *args, "--json")
    plan = json.loads(out)
    assert plan["n_queries"] == 80 and plan["metric"].startswith("labelled")
    assert all(q["low"] <= q["retention"] <= q["high"] for q in plan["predicted"])
    last = next(q for q in reversed(plan["predicted"]) if not q.get("whole_corpus"))
    code, out, err = run(capsys, *args, "--keep")  # the migrated R@10 shown is that of the rows kept
    assert code == 0 and f"migrated at K = {last['k']}: ~{last['kept']['r10']:.3f} (rows kept)" in out, err
    code, out, err = run(capsys, *args[:-4])  # --queries without --old-queries / --relevant
    assert code == 2 and "go together" in err
    code, out, err = run(capsys, *args[:-1], d / "q_new.npy")  # floats are not rows
    assert code == 2 and "relevant" in err


@pytest.mark.parametrize("args, message", [
    (["plan", "--old", "old.npy", "--probe-source", "old.npy", "--probe-target", "new.npy", "--probe-rows", "0:20"],
     "at least 50"),
    (["plan", "--old", "old.npy", "--probe-source", "old.npy", "--probe-target", "new.npy", "--probe-rows", "0:200",
      "--old-rows", "0:10"], None),
    (["plan", "--old", "new.npy", "--probe-source", "old.npy", "--probe-target", "new.npy", "--probe-rows", "0:200"],
     "--probe-source has 16 columns but --old has 12"),  # was "probe_src has 16 columns, X_old 12"

    (["fit", "--pairs", "--source", "old.npy", "--target", "bad.npy", "--rows", "0:100", "--method", "auto",
      "--name", "x", "--quiet"], "NaN"),
    (["fit", "--pairs", "--source", "old.npy", "--target", "new.npy", "--source-rows", "0:1", "--target-rows", "0:1",
      "--method", "auto", "--name", "x", "--quiet"], "at least"),
    (["fit", "--pairs", "--source", "old.npy", "--target", "new.npy", "--source-rows", "0:100",
      "--target-rows", "0:90", "--method", "auto", "--name", "x", "--quiet"], "rows"),
])
def test_bad_input_exit_2_one_line(capsys, data, args, message):
    code, out, err = run(capsys, "--data-dir", data / "var", *[data / a if str(a).endswith(".npy") else a
                                                               for a in args])
    if message is None:  # a small old corpus is fine: rows are capped by its size
        assert code == 0, err
        return
    assert code == 2, (out, err)
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("seed", ["-1", "2147483648"])
def test_cli_seed_out_of_range_is_a_usage_error(capsys, data, seed):
    # numpy refuses negative seeds with a bare ValueError and FAISS takes C ints: click's range check says so first
    code, _, err = run(capsys, "--data-dir", data / "var", "plan", "--old", data / "old.npy", "--probe-source",
                       data / "old.npy", "--probe-target", data / "new.npy", "--probe-rows", "0:200",
                       "--random-state", seed)
    assert code == 2 and f"'--random-state': {seed} is not in the range" in err and "internal error" not in err


def _b64(a):
    import base64

    return {"vectors_b64": base64.b64encode(np.ascontiguousarray(a, np.float32).tobytes()).decode(), "dim": a.shape[1]}


def test_http_plan_and_bad_probe(tmp_path):
    X, Y = _pairs(n=400)
    with TestClient(create_app(settings_for(tmp_path))) as c:
        r = c.post("/v1/plans", json={"old": _b64(X), "probe_source": {"vectors": X[:200].tolist()},
                                      "probe_target": _b64(Y[:200]), "random_state": 1}, headers=R)
        assert r.status_code == 200, r.text
        p = r.json()
        assert p["n_probe"] == 200 and p["recommended"]["k"] >= 1 and len(p["rows_to_embed"]) <= 400
        assert {q["method"] for q in p["predicted"]} <= set(p["fits"]) == {"procrustes", "ridge"}
        assert any("floor" in n for n in p["notes"])  # the user is told how to read the prediction
        # labelled queries over the probe: the prediction is of their retention; incomplete or bad ones are 422
        rng = np.random.default_rng(2)
        rel = rng.choice(200, 60, replace=False)
        lab = {"queries": _b64(Y[rel] + 0.5 * rng.normal(size=(60, Y.shape[1]))),
               "old_queries": _b64(X[rel] + 0.5 * rng.normal(size=(60, X.shape[1]))), "relevant": rel.tolist()}
        base = {"old": _b64(X), "probe_source": _b64(X[:200]), "probe_target": _b64(Y[:200])}
        r = c.post("/v1/plans", json={**base, **lab}, headers=R)
        assert r.status_code == 200, r.text
        assert r.json()["metric"].startswith("labelled") and r.json()["n_queries"] == 60
        for bad, msg in (({"old_queries": None}, "all three"), ({"relevant": [500] * 60}, "must be in"),
                         ({"relevant": rel[:-1].tolist()}, "one probe row per query"),
                         ({"queries": _b64(Y[:60, :5])}, "queries")):
            r = c.post("/v1/plans", json={**base, **lab, **bad}, headers=R)
            assert r.status_code == 422 and msg in r.text, (bad, r.text)
        r = c.post("/v1/plans", json={"old": _b64(X), "probe_source": _b64(X[:10]), "probe_target": _b64(Y[:10])},
                   headers=R)
        assert r.status_code == 422 and "at least 50" in r.text
        r = c.post("/v1/plans", json={"old": _b64(X), "probe_source": _b64(X[:100]), "probe_target": _b64(Y[:90])},
                   headers=R)
        assert r.status_code == 422 and "probe_source and probe_target must have the same number of rows" in r.text
        # the request's own field names, not align's parameters ("probe_src has 16 columns, X_old 12")
        r = c.post("/v1/plans", json={**base, "old": _b64(Y)}, headers=R)
        assert r.status_code == 422 and "probe_source has 16 columns but old has 12" in r.text, r.text
        r = c.post("/v1/plans", json={"old": _b64(X), "probe_source": _b64(X[:100]), "probe_target": _b64(Y[:100]),
                                      "target_retention": 2}, headers=R)
        assert r.status_code == 422
        for seed in (-1, 2**31):  # reaches numpy's / FAISS's seeding: a 422 naming it, not a 500
            r = c.post("/v1/plans", json={**base, "random_state": seed}, headers=R)
            assert r.status_code == 422 and "random_state" in r.text, r.text


def test_service_auto_picks_cluster_on_piecewise_pairs_and_the_cli_applies_it(tmp_path, capsys):
    """Piecewise-linear pairs (a map per source cluster): the service's `auto` chooses among align's default
    candidates, picks the per-cluster family, registers it, and `vecbridge transform` applies exactly it."""
    from align import ClusterMap
    from service.registry import open_registry

    rng = np.random.default_rng(0)
    centres = rng.normal(size=(6, 16)) * 3.0
    lab = rng.integers(0, 6, 1400)
    X = (centres[lab] + rng.normal(size=(1400, 16))).astype(np.float32)
    A = np.stack([np.linalg.qr(rng.normal(size=(16, 16)))[0] for _ in range(6)])
    Y = np.einsum("nd,nde->ne", X, A[lab]).astype(np.float32)
    write_vectors(tmp_path / "a.npy", X)
    write_vectors(tmp_path / "b.npy", Y)
    d = tmp_path / "data"
    code, out, err = run(capsys, "--data-dir", d, "fit", "--source", tmp_path / "a.npy", "--target",
                         tmp_path / "b.npy", "--rows", "0:1100", "--pairs", "--method", "auto", "--name", "pw",
                         "--json", "--quiet")
    assert code == 0, err
    v = json.loads(out)
    assert v["map_kind"] == "cluster" and v["n_clusters"] > 1
    assert v["metrics"]["selection"]["chosen"] == "cluster" and "ridge" in v["metrics"]["selection"]["candidates"]
    code, _, err = run(capsys, "--data-dir", d, "transform", "--map", "pw", tmp_path / "a.npy", tmp_path / "out.npy",
                       "--quiet")
    assert code == 0, err
    reg = open_registry(f"sqlite:///{d / 'registry.sqlite'}", d / "artifacts")
    try:
        m = reg.load_map("pw")
    finally:
        reg.close()
    assert isinstance(m, ClusterMap)
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), m.apply(X), atol=1e-6)
    code, out, err = run(capsys, "--data-dir", d, "eval", "--map", "pw", "--source", tmp_path / "a.npy", "--target",
                         tmp_path / "b.npy", "--rows", "1100:1400", "--min-retention", "0.5", "--json")
    assert code == 0 and json.loads(out)["result"] == "PASS", err
    code, out, err = run(capsys, "--data-dir", d, "fit", "--source", tmp_path / "a.npy", "--target",
                         tmp_path / "b.npy", "--pairs", "--method", "cluster", "--name", "pw", "--json", "--quiet")
    assert code == 0 and json.loads(out)["version"] == 2 and json.loads(out)["map_kind"] == "cluster", err


def _queries(Y, rows, noise=0.5, seed=1):
    """Target-model queries near their relevant documents ``Y[rows]``."""
    rng = np.random.default_rng(seed)
    return (Y[rows] + noise * rng.normal(size=(len(rows), Y.shape[1]))).astype(np.float32)


def test_eval_gates_on_labelled_queries_and_agrees_with_align(capsys, data):
    import align
    from service.registry import open_registry

    d = data
    X, Y = _pairs()
    rel = np.random.default_rng(2).integers(0, 300, 200)          # rows of the held-out pairs 600:900
    write_vectors(d / "q.npy", _queries(Y[600:900], rel))
    np.save(d / "rel.npy", rel)
    (d / "rel.txt").write_text("\n".join(map(str, rel)))
    code, _, err = run(capsys, "--data-dir", d / "var", "fit", "--pairs", "--source", d / "old.npy", "--target",
                       d / "new.npy", "--rows", "0:40", "--method", "procrustes", "--name", "few", "--quiet")
    assert code == 0, err
    common = ["--data-dir", d / "var", "eval", "--map", "few", "--source", d / "old.npy", "--target", d / "new.npy",
              "--rows", "600:900", "--queries", d / "q.npy"]
    code, out, err = run(capsys, *common, "--relevant", d / "rel.npy", "--json", "--min-retention", "0.01")
    assert code == 0, err
    res = json.loads(out)
    lab = res["retrieval"]["labelled"]
    reg = open_registry(f"sqlite:///{d / 'var' / 'registry.sqlite'}", d / "var" / "artifacts")
    try:
        m = reg.load_map("few")
    finally:
        reg.close()
    ref = align.labelled_retention(m, X[600:900], Y[600:900], _queries(Y[600:900], rel), rel)
    assert lab["migrated"] == ref["migrated"] and lab["native"] == ref["native"]
    assert res["retention"] == ref["retention"]["R@10"] < 1.0          # a Procrustes map of an affine pair loses some
    assert res["retrieval"]["retention_metric"].startswith("labelled R@10 retention")
    assert res["result"] == "PASS"
    # the text form and a gate just above the measured figure: exit 1, FAIL with the figure
    code, out, _ = run(capsys, *common, "--relevant", d / "rel.txt", "--min-retention", f"{res['retention'] + 0.01:.4f}")
    assert code == 1 and "FAIL: labelled R@10 retention (corpus-side)" in out and "labelled (200 queries" in out
    # --csls: the labelled retention and the gate are of the service's CSLS search (default weight 0.5)
    code, out, err = run(capsys, *common, "--relevant", d / "rel.npy", "--json", "--csls", "--min-retention", "0.01")
    assert code == 0, err
    got = json.loads(out)["retrieval"]
    want = align.labelled_retention(m, X[600:900], Y[600:900], _queries(Y[600:900], rel), rel, csls_weight=0.5)
    assert got["labelled"]["migrated"] == want["migrated"] and got["labelled"]["csls_weight"] == 0.5
    assert got["labelled_plain"]["migrated"] == ref["migrated"]
    assert got["retention"] == want["retention"]["R@10"] and "CSLS search w 0.5" in got["retention_metric"]
    code, out, err = run(capsys, *common, "--relevant", d / "rel.npy", "--csls", "--csls-weight", "1")
    assert code == 0 and "with CSLS search (w 1); plain cosine search" in out, err
    code, out, err = run(capsys, *common, "--relevant", d / "rel.npy", "--csls", "--csls-weight", "3")
    assert code == 2 and "csls-weight" in err


def test_eval_undefined_labelled_retention_is_said_not_gated_or_recorded_as_zero(capsys, data):
    """Queries none of which finds its relevant document natively: the retention is undefined (align gives None).
    It was shown and recorded as 0.0000 and gated as 0 (FAIL at 0.5, PASS at 0.0). Now it says undefined, records
    nothing (a stale figure is dropped) and a gate on it is exit 2 with the reason."""
    from service.registry import open_registry

    d = data
    X, Y = _pairs()
    rel = np.random.default_rng(2).integers(0, 300, 50)
    write_vectors(d / "q.npy", _queries(Y[600:900], rel))
    write_vectors(d / "q_far.npy", -Y[600:900][rel])       # each query's relevant document is its farthest
    write_vectors(d / "q_old.npy", X[600:900][rel])          # the old model's view: it finds them
    np.save(d / "rel.npy", rel)
    code, _, err = run(capsys, "--data-dir", d / "var", "fit", "--pairs", "--source", d / "old.npy", "--target",
                       d / "new.npy", "--rows", "0:40", "--method", "procrustes", "--name", "few", "--quiet")
    assert code == 0, err
    common = ["--data-dir", d / "var", "eval", "--map", "few", "--source", d / "old.npy", "--target", d / "new.npy",
              "--rows", "600:900", "--relevant", d / "rel.npy", "--old-queries", d / "q_old.npy"]

    def tags():
        reg = open_registry(f"sqlite:///{d / 'var' / 'registry.sqlite'}", d / "var" / "artifacts")
        try:
            return reg.resolve("few").tags or {}
        finally:
            reg.close()

    code, _, err = run(capsys, *common, "--queries", d / "q.npy", "--record")
    assert code == 0 and "eval.labelled_retention" in tags(), err
    code, out, err = run(capsys, *common, "--queries", d / "q_far.npy", "--record", "--json")
    res = json.loads(out)
    assert code == 0 and res["retrieval"]["labelled"]["native"]["R@10"] == 0.0, err
    assert res["retention"] is None and "eval.labelled_retention" not in tags()
    code, out, err = run(capsys, *common, "--queries", d / "q_far.npy")
    assert code == 0 and "retention R@10 undefined (no query finds its relevant document natively)" in out, err
    assert "(retention undefined (no query" in out and "0.0000)" not in out  # keeping the old model: no ratio either
    for gate in ("0.5", "0.0"):
        code, out, err = run(capsys, *common, "--queries", d / "q_far.npy", "--min-retention", gate)
        assert code == 2 and "undefined" in err and "cannot be decided" in err and "PASS" not in out, (gate, out)


def test_eval_says_the_migration_matches_the_old_model_on_a_tie(capsys, data):
    """Queries that are their relevant documents under both models: R@10 1.0 migrated and 1.0 keeping the old model.
    `beats_old` is migrated >= old, and the text said "the migration beats it" on that tie; it says "matches it"."""
    d = data
    X, Y = _pairs()
    rel = np.arange(0, 300, 10)
    write_vectors(d / "q_tie.npy", Y[600:900][rel])
    write_vectors(d / "q_tie_old.npy", X[600:900][rel])
    np.save(d / "rel_tie.npy", rel)
    code, _, err = run(capsys, "--data-dir", d / "var", "fit", "--pairs", "--source", d / "old.npy", "--target",
                       d / "new.npy", "--rows", "0:600", "--method", "ridge", "--name", "tie", "--quiet")
    assert code == 0, err
    common = ["--data-dir", d / "var", "eval", "--map", "tie", "--source", d / "old.npy", "--target", d / "new.npy",
              "--rows", "600:900", "--queries", d / "q_tie.npy", "--old-queries", d / "q_tie_old.npy",
              "--relevant", d / "rel_tie.npy"]
    code, out, err = run(capsys, *common, "--json")
    lab = json.loads(out)["retrieval"]["labelled"]
    assert code == 0 and lab["migrated"]["R@10"] == lab["old"]["R@10"] == 1.0 and lab["beats_old"], err
    code, out, err = run(capsys, *common)
    assert code == 0 and "the migration matches it" in out and "beats it" not in out, out


def test_eval_labelled_query_side_and_bad_input(capsys, data):
    d = data
    X, Y = _pairs()
    rel = np.arange(0, 300, 3)
    write_vectors(d / "qs.npy", _queries(Y[600:900], rel))   # new-model queries, for a map new -> old
    np.save(d / "rel.npy", rel)
    code, _, err = run(capsys, "--data-dir", d / "var", "fit", "--pairs", "--source", d / "new.npy", "--target",
                       d / "old.npy", "--rows", "0:600", "--method", "ridge", "--name", "back", "--quiet")
    assert code == 0, err
    common = ["--data-dir", d / "var", "eval", "--map", "back", "--source", d / "new.npy", "--target", d / "old.npy",
              "--rows", "600:900"]
    code, out, err = run(capsys, *common, "--queries", d / "qs.npy", "--relevant", d / "rel.npy", "--side", "source",
                         "--json")
    assert code == 0, err
    lab = json.loads(out)["retrieval"]["labelled"]
    assert lab["side"] == "source" and lab["n_queries"] == 100 and lab["retention"]["R@10"] > 0.5
    # one name for the side in the text and the gate line (the text said source-side, the gate query-side)
    code, out, err = run(capsys, *common, "--queries", d / "qs.npy", "--relevant", d / "rel.npy", "--side", "source",
                         "--min-retention", "0.0")
    assert code == 0 and "300 documents, query-side)" in out and "PASS: labelled R@10 retention (query-side)" in out
    assert "source-side" not in out and "target-side" not in out
    # bad input: a clear message and a non-zero exit, nothing registered or changed
    np.save(d / "short.npy", rel[:10])
    np.save(d / "far.npy", rel + 1000)
    np.save(d / "float.npy", rel.astype(np.float32))
    for extra, msg in ((["--queries", d / "qs.npy"], "go together"),
                       (["--old-queries", d / "qs.npy"], "baseline"),
                       (["--queries", d / "qs.npy", "--relevant", d / "short.npy", "--side", "source"], "10 relevant rows"),
                       (["--queries", d / "qs.npy", "--relevant", d / "far.npy", "--side", "source"], "must be in [0, 300)"),
                       (["--queries", d / "qs.npy", "--relevant", d / "float.npy", "--side", "source"], "integer"),
                       (["--queries", d / "qs.npy", "--relevant", d / "rel.npy", "--side", "target"], "columns"),
                       (["--queries", d / "bad.npy", "--relevant", d / "rel.npy", "--side", "source"], "NaN")):
        code, out, err = run(capsys, *common, *extra)
        assert code not in (0, 1) and msg in err, (extra, code, out, err)


def test_eval_queries_rows_select_the_relevant_rows_of_those_queries(capsys, data):
    """``--queries-rows`` selected rows of ``--queries`` (and ``--old-queries``) but not of ``--relevant``, the
    file with one row per query: ``--queries-rows 50:150`` with the relevant file of all 200 queries was exit 2
    ('rel.npy has 200 relevant rows for 100 queries'), so the option worked only with a relevant file cut by hand.
    Now such a file is cut by the same rows (the same figures as over the queries and relevant rows cut by hand);
    one with a row per selected query is taken as it is, and any other length names both counts."""
    d = data
    _, Y = _pairs()
    rel = np.random.default_rng(2).integers(0, 300, 200)
    Q = _queries(Y[600:900], rel)
    write_vectors(d / "q.npy", Q)
    write_vectors(d / "q_cut.npy", Q[50:150])
    np.save(d / "rel.npy", rel)
    np.save(d / "rel_cut.npy", rel[50:150])
    assert run(capsys, "--data-dir", d / "var", "fit", "--pairs", "--source", d / "old.npy", "--target",
               d / "new.npy", "--rows", "0:40", "--method", "procrustes", "--name", "few", "--quiet")[0] == 0
    common = ["--data-dir", d / "var", "eval", "--map", "few", "--source", d / "old.npy", "--target", d / "new.npy",
              "--rows", "600:900", "--json"]
    code, out, err = run(capsys, *common, "--queries", d / "q_cut.npy", "--relevant", d / "rel_cut.npy")
    assert code == 0, err
    want = json.loads(out)["retrieval"]["labelled"]
    assert want["n_queries"] == 100 and want["migrated"]["R@10"] > 0.3
    for relevant in ("rel.npy", "rel_cut.npy"):
        code, out, err = run(capsys, *common, "--queries", d / "q.npy", "--queries-rows", "50:150",
                             "--relevant", d / relevant)
        assert code == 0, (relevant, err)
        assert json.loads(out)["retrieval"]["labelled"] == want
    np.save(d / "rel_short.npy", rel[:37])
    code, _, err = run(capsys, *common, "--queries", d / "q.npy", "--queries-rows", "50:150",
                       "--relevant", d / "rel_short.npy")
    assert code == 2 and "37 relevant rows for 100 queries" in err and "200" in err, err


def test_http_evaluate_labelled_gate_over_real_http_agrees_with_the_cli(tmp_path, capsys):
    """POST /v1/maps/{ref}/evaluate on a uvicorn server: the same figures as `vecbridge eval --json`, a verdict in
    the body, and 4xx with a message for every bad part of the request (the server keeps answering)."""
    import httpx

    from _servers import serve_in_thread

    X, Y = _pairs()
    rel = np.random.default_rng(4).integers(0, 300, 150)
    Q = _queries(Y[600:900], rel)
    write_vectors(tmp_path / "old.npy", X)
    write_vectors(tmp_path / "new.npy", Y)
    write_vectors(tmp_path / "q.npy", Q)
    np.save(tmp_path / "rel.npy", rel)
    settings = settings_for(tmp_path / "svc")
    code, _, err = run(capsys, "--data-dir", settings.data_dir, "fit", "--pairs", "--source", tmp_path / "old.npy",
                       "--target", tmp_path / "new.npy", "--rows", "0:20", "--method", "procrustes", "--name", "m",
                       "--quiet")
    assert code == 0, err
    code, out, err = run(capsys, "--data-dir", settings.data_dir, "eval", "--map", "m", "--source",
                         tmp_path / "old.npy", "--target", tmp_path / "new.npy", "--rows", "600:900", "--queries",
                         tmp_path / "q.npy", "--relevant", tmp_path / "rel.npy", "--json")
    assert code == 0, err
    cli = json.loads(out)
    body = {"source": _b64(X[600:900]), "target": {"vectors": Y[600:900].tolist()}, "queries": _b64(Q),
            "relevant": rel.tolist(), "min_retention": round(cli["retention"] + 0.01, 4)}
    assert cli["retention"] < 0.98  # a Procrustes map of 20 pairs of an affine pair: the gate above it fails
    with serve_in_thread(create_app(settings)) as url, httpx.Client(base_url=url, headers=R, timeout=60) as c:
        r = c.post("/v1/maps/m/evaluate", json=body)
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["retrieval"]["labelled"]["migrated"] == pytest.approx(cli["retrieval"]["labelled"]["migrated"])
        assert got["retention"] == pytest.approx(cli["retention"]) and got["result"] == "FAIL"
        assert got["retrieval"]["retention_interval"] == pytest.approx(cli["retrieval"]["retention_interval"])
        lo, hi = got["retrieval"]["retention_interval"]
        assert lo <= got["retention"] <= hi
        assert got["retrieval"]["gate_within_interval"] is (lo <= body["min_retention"] <= hi)
        cs = c.post("/v1/maps/m/evaluate", json={**body, "csls": True}).json()["retrieval"]
        assert cs["labelled"]["csls_weight"] == 0.5 and cs["labelled_plain"]["migrated"] == \
            got["retrieval"]["labelled"]["migrated"]
        for bad in (2.5, "NaN", -1):
            r = c.post("/v1/maps/m/evaluate", json={**body, "csls": True, "csls_weight": bad})
            assert r.status_code == 422 and "csls_weight" in r.text
        ok = c.post("/v1/maps/m/evaluate", json={**body, "min_retention": 0.0})
        assert ok.status_code == 200 and ok.json()["result"] == "PASS"
        # the old model's view of the same queries: X-side vectors near the relevant rows' old embeddings
        Qo = X[600:900][rel] + 0.1 * np.random.default_rng(5).normal(size=(len(rel), 16)).astype(np.float32)
        lab = c.post("/v1/maps/m/evaluate", json={**body, "old_queries": _b64(Qo)}).json()["retrieval"]["labelled"]
        assert lab["beats_old"] is (lab["migrated"]["R@10"] >= lab["old"]["R@10"]) and lab["old"]["R@10"] > 0.5
        r = c.post("/v1/maps/m/evaluate", json={**body, "queries": None, "relevant": None, "old_queries": _b64(Qo)})
        assert r.status_code == 422 and "baseline" in r.text
        bad = [({"relevant": rel[:5].tolist()}, "relevant"), ({"relevant": (rel + 300).tolist()}, "[0, 300)"),
               ({"relevant": [10**30] * len(rel)}, "relevant"), ({"relevant": None}, "both"),
               ({"queries": _b64(np.full((len(rel), 12), np.nan, np.float32))}, "NaN"),
               ({"queries": _b64(X[:150])}, "columns"), ({"side": "sideways"}, "side"),
               ({"min_retention": 1.5}, "min_retention"), ({"target": _b64(Y[600:890])}, "rows"),
               # no query finds its relevant document natively: the retention is undefined, the gate undecidable
               ({"queries": _b64(-Y[600:900][rel]), "min_retention": 0.0}, "undefined"),
               # degenerate held-out rows: every row ties with its partner, which counted as a hit (a gate passed)
               ({"target": _b64(np.tile(Y[600:601], (300, 1)))}, "identical"),
               ({"source": _b64(np.zeros((300, 16), np.float32)), "queries": None, "relevant": None,
                 "min_retention": None, "min_top1": 0.9}, "all-zero")]
        for change, msg in bad:
            r = c.post("/v1/maps/m/evaluate", json={**body, **change})
            assert 400 <= r.status_code < 500 and msg in r.text, (change, r.status_code, r.text[:300])
        assert c.post("/v1/maps/nope/evaluate", json=body).status_code == 404
        assert c.get("/healthz").status_code == 200


def test_a_migration_stops_between_batches_on_sighup_as_on_sigterm():
    """``vecbridge migrate`` checkpoints the batch in flight on SIGINT / SIGTERM; SIGHUP (its ssh session dropped)
    went to the CLI's handler instead and stopped it at once, like a second Ctrl-C. Now SIGHUP asks for the same
    stop between batches; left ignored when ignored (``nohup``)."""
    import os
    import signal
    import time

    from service.ops.vectordb import _StopOnSignal

    before = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        with _StopOnSignal() as stop:
            os.kill(os.getpid(), signal.SIGHUP)
            deadline = time.monotonic() + 5
            while not stop.event.is_set() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert stop.event.is_set() and stop.signum == signal.SIGHUP  # the face exits 129 for it
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL  # put back
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        with _StopOnSignal():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)


def test_plan_says_what_its_forecast_is_of_and_when_its_proxy_exceeds_one_cli_and_http(capsys, tmp_path):
    """QA: at K >= 1,000 ``vecbridge plan`` printed "recommended: method auto" under a table of ridge forecasts, and
    POST /v1/plans answered ``{"method": "auto"}`` alone: auto may fit a cluster or contrastive map the interval is
    not of. Both now carry ``forecast_method`` and a note; the CLI's line says so. A curve point above 1 (the proxy's
    mapped distractors outrank native rows; here the new space has 16 dimensions the old one does not predict) gets
    a note too. Neither note appears when it does not apply."""
    from align.plan import AUTO_NOTE

    rng = np.random.default_rng(0)
    X = rng.normal(size=(5000, 16)) + rng.normal(size=(12, 16))[rng.integers(0, 12, 5000)] * 2
    Y = (X @ rng.normal(size=(16, 32)) + 0.3 * rng.normal(size=(5000, 32))).astype(np.float32)
    X = X.astype(np.float32)
    write_vectors(tmp_path / "old.npy", X)
    write_vectors(tmp_path / "new.npy", Y)
    args = ["--data-dir", tmp_path / "var", "plan", "--old", tmp_path / "old.npy", "--probe-source",
            tmp_path / "old.npy", "--probe-target", tmp_path / "new.npy", "--probe-rows", "0:300",
            "--target-retention", "0.99"]
    code, out, err = run(capsys, *args, "--json")
    assert code == 0, err
    plan = json.loads(out)
    rec = plan["recommended"]
    assert rec["method"] == "auto" and rec["k"] in (1000, 3000) and not rec["whole_corpus"]
    assert rec["forecast_method"] == next(q["method"] for q in plan["predicted"] if q["k"] == rec["k"])
    assert AUTO_NOTE.format(m=rec["forecast_method"], k=rec["k"]) in plan["notes"]
    assert sum("> 1" in n and "learning-curve point" in n for n in plan["notes"]) == 1
    code, out, err = run(capsys, *args, "--quiet")
    assert code == 0, err
    assert (f"recommended: method auto, K = {rec['k']} rows to re-embed; the forecast is of {rec['forecast_method']}, "
            f"not of auto (see the notes)") in out
    assert "note: a learning-curve point measured" in out
    with TestClient(create_app(settings_for(tmp_path / "srv"))) as c:
        r = c.post("/v1/plans", json={"old": _b64(X), "probe_source": _b64(X[:300]), "probe_target": _b64(Y[:300]),
                                      "target_retention": 0.99}, headers=R)
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["recommended"] == rec and got["notes"] == plan["notes"]
        X, Y = _pairs(n=1500, noise=0.3)  # the new space as wide as the old one predicts: the curve stays under 1
        small = c.post("/v1/plans", json={"old": _b64(X), "probe_source": _b64(X[:300]), "probe_target": _b64(Y[:300]),
                                          "target_retention": 0.5}, headers=R).json()
        assert max(q["mean"] for m in small["curve"].values() for q in m) <= 1.0
        assert small["recommended"]["method"] == small["recommended"]["forecast_method"] != "auto", small
        assert not any("(forecast_method)" in n or "learning-curve point" in n for n in small["notes"])
        schema = c.get("/openapi.json").json()["components"]["schemas"]["Recommendation"]
        assert "forecast_method" in schema["required"]


def test_eval_plan_and_readme_say_their_nn_retention_differ(capsys):
    """QA: ``eval --min-retention`` without queries gates on nn_retention@10 of the held-out pairs alone, while the
    plan's figure adds 8,192 mapped distractors from the old corpus and divides by a native search: two statistics
    under one name, and the README said both "fall back to nn_retention@10 on held-out pairs". Each now says how."""
    from pathlib import Path

    code, out, _ = run(capsys, "eval", "--help")
    assert code == 0 and ("without distractors: not the nn_retention@10 of `vecbridge plan`, a ratio to native search "
                          "with up to 8,192 mapped rows of the old corpus") in " ".join(out.split())
    code, out, _ = run(capsys, "plan", "--help")
    assert code == 0 and ("not the figure `vecbridge eval --min-retention` gates on without queries (the held-out "
                          "rows alone, no distractors)") in " ".join(out.split())
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    assert "The two compute it differently, so their figures do not compare: `eval`" in readme
    assert "stays in the top 10 of the mapped old rows. It knows nothing" not in readme


def test_plan_short_of_its_target_says_so_on_the_recommended_line_and_refuses_unpaired_rows(capsys, tmp_path):
    """QA of the migration walk-through: with no K that migrates reaching --target-retention the plan recommended
    "method auto, K = 10000" (kept forecast 0.767 for 0.95) with one note; and a probe with its rows shuffled got a
    plan ("alignability 0.002 < 0.4 ... use pairs") instead of a word about the row order. The line says re-embed
    every row, with the best migrating K and its forecast; --json and POST /v1/plans carry both; unpaired rows exit
    2 (422 over HTTP)."""
    X, Y = _pairs(noise=3.0)
    write_vectors(tmp_path / "old.npy", X)
    write_vectors(tmp_path / "new.npy", Y)
    write_vectors(tmp_path / "shuffled.npy", Y[np.random.default_rng(0).permutation(len(Y))])
    args = ["--data-dir", tmp_path / "var", "plan", "--old", tmp_path / "old.npy", "--probe-source",
            tmp_path / "old.npy", "--probe-rows", "0:300", "--target-retention", "0.99", "--keep"]
    code, out, err = run(capsys, *args, "--probe-target", tmp_path / "new.npy", "--json")
    assert code == 0, err
    rec = json.loads(out)["recommended"]
    assert rec["whole_corpus"] and rec["k"] == len(X) and rec["migration_reaches_target"] is False, rec
    best = rec["best_migrating"]
    assert best["retention"] < 0.99
    code, out, err = run(capsys, *args, "--probe-target", tmp_path / "new.npy")
    assert code == 0, err
    assert (f"recommended: re-embed every row (K = {len(X)}, the whole corpus) instead of migrating (read from the "
            f"rows kept forecast: --keep); no K that migrates is predicted to reach 0.99: the best, K = {best['k']}, "
            f"{best['retention']:.3f}") in out, out
    code, out, err = run(capsys, *args, "--probe-target", tmp_path / "shuffled.npy")
    assert code == 2 and "look unpaired" in err and "--probe-source and --probe-target" in err, (out, err)
    with TestClient(create_app(settings_for(tmp_path / "api"))) as c:
        r = c.post("/v1/plans", json={"old": _b64(X), "probe_source": _b64(X[:300]), "probe_target": _b64(Y[:300]),
                                      "target_retention": 0.99, "keep": True}, headers=R)
        assert r.status_code == 200, r.text
        assert r.json()["recommended"]["migration_reaches_target"] is False, r.json()["recommended"]
        assert r.json()["recommended"]["best_migrating"]["k"] < len(X)
        r = c.post("/v1/plans", json={"old": _b64(X), "probe_source": _b64(X[:300]),
                                      "probe_target": _b64(Y[np.random.default_rng(0).permutation(300)]),
                                      "keep": True}, headers=R)
        assert r.status_code == 422 and "look unpaired" in r.text, r.text


def test_a_whole_corpus_plan_lists_no_rows_and_rows_out_writes_every_one(capsys, tmp_path):
    """A whole-corpus recommendation listed every row of --old in rows_to_embed (1M rows: 7.9 MB of JSON over POST
    /v1/plans and --json). The JSON now says rows_to_embed_all with an empty list; --rows-out, local, still writes
    0..n-1 (with --old-rows, the rows of --old it names), and --k n gives the same."""
    X, Y = _pairs(noise=3.0)
    write_vectors(tmp_path / "old.npy", X)
    write_vectors(tmp_path / "new.npy", Y)
    args = ["--data-dir", tmp_path / "var", "plan", "--old", tmp_path / "old.npy", "--probe-source",
            tmp_path / "old.npy", "--probe-target", tmp_path / "new.npy", "--probe-rows", "0:300",
            "--target-retention", "0.99", "--json"]
    code, out, err = run(capsys, *args, "--rows-out", tmp_path / "rows.npy")
    assert code == 0, err
    res = json.loads(out)
    assert res["recommended"]["whole_corpus"] and res["rows_to_embed"] == [] and res["rows_to_embed_all"] is True
    assert np.load(tmp_path / "rows.npy").tolist() == list(range(len(X)))
    code, out, err = run(capsys, *args, "--old-rows", f"100:{len(X)}", "--rows-out", tmp_path / "part.npy")
    assert code == 0 and json.loads(out)["rows_to_embed"] == [], err
    assert np.load(tmp_path / "part.npy").tolist() == list(range(100, len(X)))
    code, out, err = run(capsys, *args[:-1], "--k", str(len(X)))
    assert code == 0 and f"rows to re-embed for --k {len(X)}: {len(X)} (every row of --old)" in out, (out, err)
    with TestClient(create_app(settings_for(tmp_path / "api"))) as c:
        r = c.post("/v1/plans", json={"old": _b64(X), "probe_source": _b64(X[:300]), "probe_target": _b64(Y[:300]),
                                      "target_retention": 0.99}, headers=R)
        assert r.status_code == 200 and r.json()["recommended"]["whole_corpus"], r.text
        assert r.json()["rows_to_embed"] == [] and r.json()["rows_to_embed_all"] is True
