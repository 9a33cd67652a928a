"""A labelled retention above 1 (the migrated index beats the native one on the queries; review, session 53): the
gate passes it as it passes 1, its bootstrap interval stays above 1 (not clipped to [0, 1]), and a note says why a
migration can read above 1 (it said nothing: "retention 1.53" beside a PASS)."""

from __future__ import annotations

import json

import numpy as np
from conftest import run_cli as run


def test_a_retention_above_1_passes_with_its_own_interval_and_a_note(tmp_path, capsys):
    rng = np.random.default_rng(0)
    n, d, q = 2600, 16, 200
    X = rng.normal(size=(n, d)).astype(np.float32)
    R = np.linalg.qr(rng.normal(size=(d, d)))[0].astype(np.float32)
    Y = (X @ R + 1.2 * rng.normal(size=(n, d))).astype(np.float32)   # the new model's own vectors: noisy
    rel = rng.choice(600, q, replace=False)
    Q = (X[2000:][rel] @ R + 0.5 * rng.normal(size=(q, d))).astype(np.float32)  # queries near the clean image
    for name, a in (("xfit", X[:2000]), ("yfit", Y[:2000]), ("x", X[2000:]), ("y", Y[2000:]), ("q", Q),
                    ("rel", rel)):
        np.save(tmp_path / f"{name}.npy", a)
    var = ("--data-dir", tmp_path / "var")
    code, _, err = run(capsys, *var, "fit", "--pairs", "--source", tmp_path / "xfit.npy", "--target",
                       tmp_path / "yfit.npy", "--method", "ridge", "--name", "m", "--quiet")
    assert code == 0, err
    ev = [*var, "eval", "--map", "m", "--source", tmp_path / "x.npy", "--target", tmp_path / "y.npy",
          "--queries", tmp_path / "q.npy", "--relevant", tmp_path / "rel.npy", "--min-retention", "0.95"]
    code, out, err = run(capsys, *ev, "--json")
    res = json.loads(out)
    r = res["retrieval"]
    assert code == 0 and res["result"] == "PASS" and r["retention"] > 1.3, (r["retention"], err)
    assert r["retention_interval"][0] > 1.0 and not r["gate_within_interval"], r["retention_interval"]
    above = [n for n in res["notes"] if "above 1" in n]
    assert len(above) == 1 and f"the native index of {r['labelled']['native_hits']}," in above[0], res["notes"]
    code, out, err = run(capsys, *ev)
    assert code == 0 and out.strip().splitlines()[-1].startswith("PASS: labelled R@10 retention"), out
    assert "warning: the labelled R@10 retention is 1." in err and "above 1" in err, err
