"""`vecbridge eval` and POST /v1/maps/{ref}/evaluate on large held-out sets: at most `--max-queries` / `max_queries`
pairs (default 10,000, a seeded sample) are ranked, each against every held-out row, with the sample size and 95 %
intervals in the answer; under the cap the figures are those of every pair."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from _api_support import R, settings_for
from conftest import run_cli as run

from service.io import write_vectors


@pytest.fixture(scope="module")
def wn(tmp_path_factory, wordnet):
    """WordNet MiniLM / e5 rows 0:14,000 (fewer in the fallback sample: ``d.n``) as files and a Procrustes map
    minilm-e5 from rows 0:2,000."""
    d = tmp_path_factory.mktemp("evalsample")
    n = min(14000, len(wordnet["minilm"]))  # the `n` fixture
    write_vectors(d / "minilm.npy", np.asarray(wordnet["minilm"][:n], np.float32))
    write_vectors(d / "e5.npy", np.asarray(wordnet["e5"][:n], np.float32))
    from service.cli import main

    assert main(["--data-dir", str(d / "var"), "fit", "--pairs", "--source", str(d / "minilm.npy"), "--target",
                 str(d / "e5.npy"), "--rows", "0:2000", "--method", "procrustes", "--name", "minilm-e5",
                 "--quiet"]) == 0
    return d


@pytest.fixture(scope="module")
def n(wordnet):
    """Rows in ``wn``'s files: 14,000, or all of the fallback sample's when the shared set is absent."""
    return min(14000, len(wordnet["minilm"]))


def _eval(capsys, d, rows, *extra):
    code, out, err = run(capsys, "--data-dir", d / "var", "eval", "--map", "minilm-e5", "--source", d / "minilm.npy",
                         "--target", d / "e5.npy", "--rows", rows, *extra)
    return code, out, err


def test_cli_eval_under_the_cap_is_the_full_evaluation(capsys, wn, n):
    rows, m = f"2000:{min(5000, n)}", min(5000, n) - 2000
    code, out, err = _eval(capsys, wn, rows, "--json")
    assert code == 0, err
    full = json.loads(out)
    code, out, err = _eval(capsys, wn, rows, "--json", "--max-queries", str(m), "--random-state", "5")
    assert code == 0, err
    assert json.loads(out) == full and full["n_queries"] == full["n_candidates"] == m
    assert "intervals" not in full and "intervals" not in full["retrieval"]
    code, out, _ = _eval(capsys, wn, rows)
    assert code == 0 and "sampled" not in out


def test_cli_eval_ranks_a_seeded_sample_against_every_row(capsys, wn, n):
    rows, m = f"2000:{min(8000, n)}", min(8000, n) - 2000        # 6,000 held-out pairs (2,096 in the sample)
    q = 1500 if m >= 3000 else m // 2
    code, out, err = _eval(capsys, wn, rows, "--json", "--max-queries", str(m))
    assert code == 0, err
    full = json.loads(out)
    runs = []
    for seed in ("1", "1", "2"):
        code, out, err = _eval(capsys, wn, rows, "--json", "--max-queries", str(q), "--random-state", seed)
        assert code == 0, err
        runs.append(json.loads(out))
    a, b, c = runs
    assert a == b and a != c                                       # reproducible with its seed
    assert (a["n_queries"], a["n_candidates"], a["retrieval"]["n_queries"]) == (q, m, q)
    assert a["cos"] == full["cos"]                                 # not a rank: every pair
    for name, value in (("top1", full["top1"]), ("recall@10", full["recall@10"])):
        lo, hi = a["intervals"][name]
        assert lo <= value <= hi and lo <= a[name] <= hi and hi - lo < 0.06, (name, lo, value, hi)
    assert set(a["retrieval"]["intervals"]) >= {"corpus_recall@10", "query_recall@1", "nn_retention@10"}
    code, out, _ = _eval(capsys, wn, rows, "--max-queries", str(q), "--random-state", "1", "--min-top1", "0.5")
    assert code == 0 and f"sampled: {q} of {m} pairs ranked" in out and "top1 " in out and "PASS" in out


def test_cli_eval_caps_large_sets_by_default(capsys, wn, n):
    """12,000 held-out pairs: 10,000 of them ranked (against all 12,000) unless --max-queries says otherwise."""
    if n < 14000:
        pytest.skip(f"needs 12,000 held-out pairs (over the 10,000 default cap); the WordNet sample holds {n} rows")
    code, out, err = _eval(capsys, wn, "2000:14000", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert (res["n_queries"], res["n_candidates"]) == (10000, 12000) and "top1" in res["intervals"]


@pytest.mark.parametrize("bad", ["0", "-5", "2.5", "many"])
def test_cli_eval_refuses_a_bad_max_queries(capsys, wn, bad):
    code, out, err = _eval(capsys, wn, "2000:2100", "--max-queries", bad)
    assert code == 2 and "Invalid value for '--max-queries'" in err and "Traceback" not in err and "top-1" not in out


def _b64(a):
    return {"vectors_b64": base64.b64encode(np.ascontiguousarray(a, np.float32).tobytes()).decode(), "dim": a.shape[1]}


def test_http_evaluate_takes_max_queries_and_answers_as_the_cli(tmp_path, capsys, wordnet):
    import httpx
    from _servers import serve_in_thread

    from service.api import create_app

    X, Y = (np.asarray(wordnet[k][:5000], np.float32) for k in ("minilm", "e5"))
    m = len(X) - 2000                                              # 3,000 held-out pairs (2,096 in the sample)
    write_vectors(tmp_path / "x.npy", X)
    write_vectors(tmp_path / "y.npy", Y)
    settings = settings_for(tmp_path / "svc")
    code, _, err = run(capsys, "--data-dir", settings.data_dir, "fit", "--pairs", "--source", tmp_path / "x.npy",
                       "--target", tmp_path / "y.npy", "--rows", "0:2000", "--method", "procrustes", "--name", "m",
                       "--quiet")
    assert code == 0, err
    code, out, err = run(capsys, "--data-dir", settings.data_dir, "eval", "--map", "m", "--source", tmp_path / "x.npy",
                         "--target", tmp_path / "y.npy", "--rows", f"2000:{len(X)}", "--max-queries", "800",
                         "--random-state", "9", "--json")
    assert code == 0, err
    cli = json.loads(out)
    body = {"source": _b64(X[2000:]), "target": _b64(Y[2000:])}
    with serve_in_thread(create_app(settings)) as url, httpx.Client(base_url=url, headers=R, timeout=120) as c:
        r = c.post("/v1/maps/m/evaluate", json={**body, "max_queries": 800, "random_state": 9})
        assert r.status_code == 200, r.text
        got = r.json()
        assert (got["n_queries"], got["n_candidates"]) == (800, m)
        for key in ("top1", "mean_rank", "recall@10"):
            assert got[key] == pytest.approx(cli[key]), key
        for iv, want in ((got["intervals"], cli["intervals"]), (got["retrieval"]["intervals"],
                                                                cli["retrieval"]["intervals"])):
            assert iv.keys() == want.keys() and all(iv[k] == pytest.approx(want[k]) for k in iv)
        from service.client import Client

        with Client(url, api_key=R["Authorization"].split()[1]) as vb:   # the Python client sends the same fields
            again = vb.evaluate("m", X[2000:], Y[2000:], max_queries=800, random_state=9)
        assert again["intervals"] == got["intervals"] and again["n_queries"] == 800
        under = c.post("/v1/maps/m/evaluate", json=body).json()            # under the default cap
        assert under["n_queries"] == m and "intervals" not in under
        for bad in (0, -1, 2.5, "800", True):
            r = c.post("/v1/maps/m/evaluate", json={**body, "max_queries": bad})
            assert r.status_code == 422 and "max_queries" in r.text, (bad, r.status_code, r.text[:200])
        null = c.post("/v1/maps/m/evaluate", json={**body, "max_queries": None}).json()  # null: the field left out
        assert null["n_queries"] == m and "intervals" not in null
        assert c.get("/healthz").status_code == 200


def test_cli_eval_record_stores_the_sample_size_and_interval(capsys, wn, n):
    """`eval --record` of a sampled evaluation used to store its top-1 as if every pair had been ranked."""
    m = min(8000, n) - 2000
    q = 1500 if m >= 3000 else m // 2
    def tags():
        code, out, err = run(capsys, "--data-dir", wn / "var", "registry", "show", "minilm-e5", "--json")
        assert code == 0, err
        return json.loads(out)["tags"]

    code, out, err = _eval(capsys, wn, f"2000:{2000 + m}", "--json", "--max-queries", str(q), "--random-state", "3",
                           "--record")
    assert code == 0, err
    res, t = json.loads(out), tags()
    assert (float(t["eval.top1"]), t["eval.n_queries"], t["eval.n_candidates"]) == (res["top1"], str(q), str(m))
    lo, hi = json.loads(t["eval.top1_interval"])
    assert [lo, hi] == res["intervals"]["top1"] and lo < res["top1"] < hi
    code, out, err = _eval(capsys, wn, "2000:4000", "--json", "--record")  # every pair: no interval kept
    assert code == 0, err
    t = tags()
    assert (t["eval.n_queries"], t["eval.n_candidates"]) == ("2000", "2000") and "eval.top1_interval" not in t


def test_cli_eval_gate_scores_repeated_pairs_once(capsys, wn, tmp_path):
    """The nn_retention@10 gate on held-out pairs with a copy of a tenth of them: the copy was each pair's nearest
    native row, found through the map by memory, and lifted the proxy past the gate (0.742 FAIL read 0.781 PASS)."""
    X, Y = np.load(wn / "minilm.npy")[2000:3000], np.load(wn / "e5.npy")[2000:3000]
    write_vectors(tmp_path / "m.npy", np.concatenate([X, X[:100]]))
    write_vectors(tmp_path / "e.npy", np.concatenate([Y, Y[:100]]))
    code, out, err = _eval(capsys, wn, "2000:3000", "--json")
    assert code == 0, err
    once = json.loads(out)
    code, out, err = run(capsys, "--data-dir", wn / "var", "eval", "--map", "minilm-e5", "--source", tmp_path / "m.npy",
                         "--target", tmp_path / "e.npy", "--json", "--min-retention", f"{once['retention'] + 1e-9}")
    assert code == 1, err  # the distinct pairs' figure, just below the gate
    dup = json.loads(out)
    assert dup["retrieval"]["nn_retention@10"] == once["retrieval"]["nn_retention@10"]
    assert (dup["n_repeated"], dup["retrieval"]["n_repeated"], dup["n_candidates"]) == (100, 100, 1000)
    assert dup["cos_raw"] == once["cos_raw"] and dup["top1"] == once["top1"]
    code, out, _ = run(capsys, "--data-dir", wn / "var", "eval", "--map", "minilm-e5", "--source", tmp_path / "m.npy",
                       "--target", tmp_path / "e.npy")
    assert code == 0 and "(candidates 1000; 100 repeated pairs scored once)" in out
