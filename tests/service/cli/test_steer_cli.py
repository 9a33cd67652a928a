"""`vecbridge steer fit|apply|alias|lens|transfer` as a user runs them (subprocesses), with exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def vb(*args, check_code: int | None = 0):
    p = subprocess.run([sys.executable, "-m", "service.cli", *map(str, args)], capture_output=True, text=True,
                       env=ENV, timeout=120)
    if check_code is not None:
        assert p.returncode == check_code, (args, p.returncode, p.stdout[-500:], p.stderr[-800:])
    return p


def planted(n=500, d=12, offset=3.0, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = np.where(X[:, 0] > 1.0, 1, np.where(X[:, 0] < -1.0, -1, 0))
    X[:, 1] += offset
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    return X.astype(np.float32), y


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    d = tmp_path_factory.mktemp("steer_cli")
    X, y = planted()
    np.save(d / "X.npy", X)
    np.save(d / "y.npy", y)
    (d / "y.txt").write_text("\n".join(str(int(v)) for v in y) + "\n")
    (d / "names.txt").write_text("\n".join(f"row{i}{'+' if v > 0 else '-' if v < 0 else ''}"
                                           for i, v in enumerate(y)) + "\n")
    out = vb("--data-dir", d / "var", "steer", "fit", "--space", "toy", "--vectors", d / "X.npy", "--texts",
             d / "names.txt", "--labels", d / "y.txt", "--name", "attr", "--rank", 3, "--method", "lm-steer",
             "--param", "max_iter=20",
             "--param", "n_candidates=500", "--random-state", 0, "--alias", "prod", "--json", "--quiet")
    return d, X, y, json.loads(out.stdout)


def test_fit_registers_with_lineage(fitted):
    d, X, y, info = fitted
    assert (info["name"], info["version"], info["rank"], info["space"]) == ("attr", 1, 3, "toy")
    assert info["aliases"] == ["prod"] and info["random_state"] == 0 and info["params"]["max_iter"] == 20
    assert info["data_hashes"]["n"] == len(y) and info["lens"]
    again = vb("--data-dir", d / "var", "steer", "fit", "--space", "toy", "--vectors", d / "X.npy", "--labels",
               d / "y.npy", "--name", "attr", "--method", "mean-shift", "--json", "--quiet")
    assert json.loads(again.stdout)["version"] == 2 and json.loads(again.stdout)["rank"] == 0


def test_method_given_as_a_param_is_used_and_a_conflict_is_refused(fitted):
    """`--param method=mean-shift` was silently replaced by --method's default: a local steer was registered."""
    d, _, _, _ = fitted
    out = vb("--data-dir", d / "var", "steer", "fit", "--space", "toy", "--vectors", d / "X.npy", "--labels",
             d / "y.npy", "--name", "viaparam", "--param", "method=mean-shift", "--json", "--quiet")
    assert json.loads(out.stdout)["method"] == "mean-shift"
    p = vb("--data-dir", d / "var", "steer", "fit", "--space", "toy", "--vectors", d / "X.npy", "--labels",
           d / "y.npy", "--name", "viaparam", "--method", "local", "--param", "method=mean-shift", "--quiet",
           check_code=2)
    assert "disagree" in p.stderr
    p = vb("--data-dir", d / "var", "steer", "fit", "--space", "toy", "--vectors", d / "X.npy", "--labels",
           d / "y.npy", "--name", "viaparam", "--param", "method=mean-shift", "--param", "method=local", "--quiet",
           check_code=2)  # the last one was used without a word
    assert "parameter 'method' is given twice; give each once" in p.stderr


def test_rank_without_lm_steer_is_refused(fitted):
    """`steer fit --rank 8` (help: "Rank of W (default 16)") with the default method registered a rank-1 local steer
    and exit 0: the local method ignores the rank. Only lm-steer takes one; elsewhere it is a usage error."""
    d, _, _, _ = fitted
    for method in ("local", "mean-shift"):
        p = vb("--data-dir", d / "var", "steer", "fit", "--space", "toy", "--vectors", d / "X.npy", "--labels",
               d / "y.npy", "--name", "ranked", "--rank", 8, "--method", method, "--quiet", check_code=2)
        assert "drop ['rank'] (rank: fit method lm-steer" in p.stderr
    p = vb("--data-dir", d / "var", "steer", "fit", "--space", "toy", "--vectors", d / "X.npy", "--labels",
           d / "y.npy", "--name", "ranked", "--param", "rank=8", "--quiet", check_code=2)
    assert "is rank 1" in p.stderr
    out = vb("--data-dir", d / "var", "steer", "fit", "--space", "toy", "--vectors", d / "X.npy", "--labels",
             d / "y.npy", "--name", "ranked", "--json", "--quiet")
    assert json.loads(out.stdout)["rank"] == 1  # the default method, no --rank: as before


def test_a_seed_among_the_params_is_refused_naming_the_option(fitted):
    """``--param random_state=0`` was taken (it equalled --random-state's default) and any other value refused as
    disagreeing with it: the seed is --random-state, one way on every face."""
    d, _, _, _ = fitted
    for extra in (["--param", "random_state=0"], ["--param", "random_state=3", "--random-state", 3]):
        p = vb("--data-dir", d / "var", "steer", "fit", "--space", "toy", "--vectors", d / "X.npy", "--labels",
               d / "y.npy", "--name", "seeded", *extra, "--quiet", check_code=2)
        assert "not a steer parameter: give the seed as the fit's own random_state (`--random-state`" in p.stderr


def test_a_mean_shift_takes_no_parameters(fitted):
    """``--method mean-shift --param temperature=-5`` (or max_iter=-3) registered the steer with those values stored
    and unchecked, exit 0: a mean shift uses none of them. Refused now, as over HTTP."""
    d, _, _, _ = fitted
    for bad in ("temperature=-5", "max_iter=-3"):
        p = vb("--data-dir", d / "var", "steer", "fit", "--space", "toy", "--vectors", d / "X.npy", "--labels",
               d / "y.npy", "--name", "shifty", "--method", "mean-shift", "--param", bad, "--quiet", check_code=2)
        assert "a mean-shift steer takes no parameters but the method" in p.stderr and bad.split("=")[0] in p.stderr


def test_apply_eps_zero_identity_and_positive(fitted):
    d, X, _, _ = fitted
    vb("--data-dir", d / "var", "steer", "apply", "--steer", "attr@prod", "--eps", 0, d / "X.npy", d / "same.npy")
    np.testing.assert_array_equal(np.load(d / "same.npy"), X)
    p = vb("--data-dir", d / "var", "steer", "apply", "--steer", "attr:1", "--eps", 0.5, d / "X.npy", d / "s.npy",
           "--json")
    assert json.loads(p.stdout)["steer"] == "attr:1"
    from service.registry import open_registry

    reg = open_registry(f"sqlite:///{d / 'var' / 'registry.sqlite'}", d / "var" / "artifacts")
    try:
        np.testing.assert_allclose(np.load(d / "s.npy"), reg.load_steer("attr:1").apply(X, 0.5), atol=1e-6)
    finally:
        reg.close()


def test_lens_stored_and_over_texts(fitted):
    d, _, _, _ = fitted
    p = vb("--data-dir", d / "var", "steer", "lens", "--steer", "attr@prod", "-k", 2, "--json")
    out = json.loads(p.stdout)
    assert len(out["sigma"]) == 3 and len(out["directions"][0]["positive"]) == 2
    assert out["directions"][0]["positive"][0]["text"].startswith("row")
    p = vb("--data-dir", d / "var", "steer", "lens", "--steer", "attr:1", "--texts", d / "names.txt", "--vectors",
           d / "X.npy", "--directions", 1)
    assert "direction 0" in p.stdout and "row" in p.stdout


def test_a_k_above_the_stored_lens_is_refused_unless_texts_are_ranked_anew(fitted):
    """`steer lens -k 20` answered the 5 items stored at fit time as if they were the 20 asked for; now exit 2 saying
    how many are stored, while --texts ranks as many as asked."""
    d, _, _, _ = fitted
    p = vb("--data-dir", d / "var", "steer", "lens", "--steer", "attr@prod", "-k", 20, check_code=2)
    assert "lens stores 5 items at each end of a direction" in p.stderr and "k <= 5" in p.stderr, p.stderr
    p = vb("--data-dir", d / "var", "steer", "lens", "--steer", "attr@prod", "-k", 20, "--texts", d / "names.txt",
           "--vectors", d / "X.npy", "--json")
    assert len(json.loads(p.stdout)["directions"][0]["positive"]) == 20


def test_a_mean_shift_has_a_lens_of_its_one_direction(fitted):
    """A mean-shift steer's lens was empty, stored or over ``--texts`` (which then printed "no named items: ... pass
    --texts here" to a user who had). Its one direction is ``v`` = mean(+1 rows) - mean(-1 rows): the rows at its
    positive end are the +1-labelled ones, at its negative end the -1 ones, stored at fit time and over --texts."""
    d, _, _, _ = fitted
    vb("--data-dir", d / "var", "steer", "fit", "--space", "toy", "--vectors", d / "X.npy", "--texts",
       d / "names.txt", "--labels", d / "y.txt", "--name", "shift", "--method", "mean-shift", "--quiet")
    stored = json.loads(vb("--data-dir", d / "var", "steer", "lens", "--steer", "shift", "-k", 5, "--json").stdout)
    p = vb("--data-dir", d / "var", "steer", "lens", "--steer", "shift", "-k", 10, "--texts", d / "names.txt",
           "--vectors", d / "X.npy", "--json")
    for out in (stored, json.loads(p.stdout)):
        [direction] = out["directions"]
        assert direction["sigma"] == pytest.approx(out["sigma"][0])
        assert all(it["text"].endswith("+") for it in direction["positive"]), direction["positive"]
        assert all(it["text"].endswith("-") for it in direction["negative"]), direction["negative"]
    text = vb("--data-dir", d / "var", "steer", "lens", "--steer", "shift", "--texts", d / "names.txt", "--vectors",
              d / "X.npy").stdout
    assert "direction 0" in text and "no named items" not in text


def test_list_show_and_delete_as_over_http(fitted, tmp_path):
    """The CLI had no way to list, show or delete steers (HTTP had GET /v1/steers, GET /v1/steers/{ref} and DELETE
    /v1/steers/{name}/versions/{v}): `steer list`, `steer show`, `steer delete` now, on the same registry calls."""
    d, X, _, _ = fitted
    var = ["--data-dir", tmp_path / "var"]
    assert vb(*var, "steer", "list").stdout == "(no steers)\n"
    for _ in range(2):
        vb(*var, "steer", "fit", "--space", "toy", "--vectors", d / "X.npy", "--labels", d / "y.txt", "--name", "s",
           "--method", "mean-shift", "--quiet")
    vb(*var, "steer", "alias", "s", "prod", "1")
    listed = json.loads(vb(*var, "steer", "list", "--json").stdout)["steers"]
    assert [(s["name"], s["space"], s["dim"], s["latest_version"], s["aliases"]) for s in listed] == [
        ("s", "toy", X.shape[1], 2, {"prod": 1})]
    assert [v["version"] for v in listed[0]["versions"]] == [1, 2]
    assert vb(*var, "steer", "list").stdout == (f"s  toy({X.shape[1]})  latest 2  versions 2/2  aliases prod->1  "
                                                 "bare 1\n")
    assert json.loads(vb(*var, "steer", "show", "s", "--json").stdout)["version"] == 1  # the prod alias
    assert "method           mean-shift" in vb(*var, "steer", "show", "s:2").stdout
    assert vb(*var, "steer", "delete", "s", 2).stdout == "deleted steer s:2\n"
    assert json.loads(vb(*var, "steer", "show", "s:2", "--json").stdout)["deleted"] is True  # kept for lineage
    for args in (["show", "s@nosuch"], ["show", "nosuch"], ["delete", "nosuch", 1], ["delete", "s", 9]):
        p = vb(*var, "steer", *args, check_code=2)
        assert p.stderr.startswith("vecbridge: error: ") and len(p.stderr.splitlines()) == 1, (args, p.stderr)
    p = vb(*var, "steer", "delete", "s", 1)  # prod's version: said, and what a bare `s` means now (nothing)
    assert "alias(es) prod still point at steer s:1" in p.stderr and "'s' has no live version left" in p.stderr
    assert vb(*var, "steer", "list").stdout == (f"s  toy({X.shape[1]})  latest -  versions 0/2  aliases "
                                                 "prod->1(deleted)  bare -\n")  # it no longer resolves: said


def test_deleting_the_prod_version_says_what_the_bare_name_means_now(tmp_path, fitted):
    """`steer alias plant prod 2; steer delete plant 2` left bare `plant` resolving to plant:3 (another method), which
    nobody promoted, and the warning said only that plant@prod no longer resolves; it now says what `plant` means,
    as `registry delete` does for a map."""
    d = fitted[0]
    var = ["--data-dir", tmp_path / "var"]
    for method in ("mean-shift", "mean-shift", "local"):
        vb(*var, "steer", "fit", "--space", "toy", "--vectors", d / "X.npy", "--labels", d / "y.txt", "--name",
           "plant", "--method", method, "--quiet")
    vb(*var, "steer", "alias", "plant", "prod", 2)
    p = vb(*var, "steer", "delete", "plant", 2)
    assert "plant@prod no longer resolve and a bare 'plant' is now plant:3;" in p.stderr
    assert json.loads(vb(*var, "steer", "show", "plant", "--json").stdout)["version"] == 3


def test_lens_counts_out_of_range_are_refused_as_over_http(fitted):
    """``-k -3`` sliced the stored items to all but the last three (and ``--directions -1`` likewise), exit 0;
    GET /v1/steers/{ref}/lens takes k in 1..100 and n_directions in 1..1024."""
    d = fitted[0]
    for opt, bad in (("-k", -3), ("-k", 0), ("-k", 101), ("--directions", -1), ("--directions", 0)):
        p = vb("--data-dir", d / "var", "steer", "lens", "--steer", "attr@prod", opt, bad, check_code=2)
        assert "is not in the range" in p.stderr and "Traceback" not in p.stderr


def test_exit_codes(fitted):
    d, _, _, _ = fitted
    base = ["--data-dir", d / "var", "steer"]
    p = vb(*base, "apply", "--steer", "nope", d / "X.npy", d / "o.npy", check_code=2)
    assert p.stderr.startswith("vecbridge: error:") and "Traceback" not in p.stderr
    vb(*base, "apply", "--steer", "attr:7", d / "X.npy", d / "o.npy", check_code=2)
    np.save(d / "wide.npy", np.ones((3, 5), dtype=np.float32))
    vb(*base, "apply", "--steer", "attr", d / "wide.npy", d / "o.npy", check_code=2)
    (d / "bad.txt").write_text("1\n2\n")
    vb(*base, "fit", "--space", "toy", "--vectors", d / "X.npy", "--labels", d / "bad.txt", "--name", "b",
       "--quiet", check_code=2)
    vb(*base, "fit", "--space", "toy", "--vectors", d / "X.npy", "--labels", d / "y.npy", "--name", "../x",
       "--quiet", check_code=2)
    vb(*base, "fit", "--space", "toy", "--labels", d / "y.npy", "--name", "c", "--quiet", check_code=2)
    vb(*base, "lens", "--steer", "missing", check_code=2)


def test_a_name_of_another_space_is_refused_before_the_fit_and_leaves_no_space(fitted):
    """`steer fit` of a name that lives in another space fitted the steer first (minutes for lm-steer) and only
    then failed, leaving the new space registered (as every failed fit did); now refused at once, as over HTTP."""
    d, _, _, _ = fitted
    base = ["--data-dir", d / "var"]
    p = vb(*base, "steer", "fit", "--space", "elsewhere", "--vectors", d / "X.npy", "--labels", d / "y.npy",
           "--name", "attr", "--method", "lm-steer", "--rank", 3, "--param", "max_iter=20", check_code=2)
    assert "lives in space 'toy'" in p.stderr and "fit " not in p.stderr  # no progress bar: no fit ran
    vb(*base, "steer", "fit", "--space", "typo", "--vectors", d / "X.npy", "--labels", d / "y.npy", "--name", "n",
       "--param", "rnak=2", "--quiet", check_code=2)
    spaces = vb(*base, "spaces").stdout
    assert "elsewhere" not in spaces and "typo" not in spaces and "toy" in spaces


def test_alias_set_move_and_delete(fitted):
    """Steer aliases had no CLI command (only --alias at fit time); `steer alias` sets, moves and removes one."""
    d, _, _, _ = fitted
    base = ["--data-dir", d / "var", "steer"]
    vb(*base, "fit", "--space", "toy", "--vectors", d / "X.npy", "--labels", d / "y.npy", "--name", "al",
       "--random-state", 1, "--quiet")
    vb(*base, "fit", "--space", "toy", "--vectors", d / "X.npy", "--labels", d / "y.npy", "--name", "al",
       "--random-state", 2, "--quiet")
    assert vb(*base, "alias", "al", "stable", 1).stdout.strip() == "al@stable -> 1"
    np.save(d / "q1.npy", np.load(d / "X.npy")[:2])
    assert "al:1" in vb(*base, "apply", "--steer", "al@stable", d / "q1.npy", d / "o1.npy").stdout
    vb(*base, "alias", "al", "stable", 2)
    assert "al:2" in vb(*base, "apply", "--steer", "al@stable", d / "q1.npy", d / "o1.npy").stdout
    vb(*base, "alias", "al", "stable", "--delete")
    p = vb(*base, "apply", "--steer", "al@stable", d / "q1.npy", d / "o1.npy", check_code=2)
    assert "no alias 'stable'" in p.stderr and "Traceback" not in p.stderr
    for bad in (["al", "stable", "--delete"], ["al", "stable", 9], ["nope", "stable", 1], ["al", "1x", 1]):
        p = vb(*base, "alias", *bad, check_code=2)
        assert p.stderr.startswith("vecbridge: error:") and "Traceback" not in p.stderr, bad
    vb(*base, "alias", "al", "stable", check_code=2)  # no VERSION: a usage error


def test_transfer_through_a_map_registers_in_the_target_space(fitted):
    """The steer carried through a registered map lands in the map's target space as the library carries it
    (frames folded in: eps scale recorded), and bad references exit 2 with a message."""
    from align import fit_procrustes, transfer_steer
    from service.registry import open_registry

    d, X, _, _ = fitted
    base = ["--data-dir", d / "var"]
    R = np.linalg.qr(np.random.default_rng(5).normal(size=(X.shape[1], X.shape[1])))[0]
    Y = (X @ R + 0.4).astype(np.float32)  # another space: rotated, and crowded around a common direction
    Y /= np.linalg.norm(Y, axis=1, keepdims=True)
    np.save(d / "Y.npy", Y)
    vb(*base, "fit", "--pairs", "--source", d / "X.npy", "--target", d / "Y.npy", "--source-space", "toy",
       "--target-space", "toy2", "--method", "procrustes", "--name", "toy2toy2", "--quiet")
    p = vb(*base, "steer", "transfer", "--steer", "attr:1", "--map", "toy2toy2", "--name", "attr2", "--alias", "moved",
           "--json")
    info = json.loads(p.stdout)
    assert (info["name"], info["space"], info["rank"], info["aliases"]) == ("attr2", "toy2", 3, ["moved"])
    assert info["params"] == {"method": "transfer", "steer": "attr:1", "map": "toy2toy2:1"}
    reg = open_registry(f"sqlite:///{d / 'var' / 'registry.sqlite'}", d / "var" / "artifacts")
    try:
        want = transfer_steer(reg.load_steer("attr:1"), reg.load_map(reg.resolve("toy2toy2")))
        got = reg.load_steer("attr2@moved")
        assert info["metrics"]["eps_scale"] == pytest.approx(want.metadata["eps_scale"]) != 1.0
    finally:
        reg.close()
    np.testing.assert_allclose(got.W, want.W, atol=1e-6)
    text = vb(*base, "steer", "transfer", "--steer", "attr:1", "--map", "toy2toy2", "--name", "attr2").stdout
    assert "registered steer attr2:2 in space toy2 (carried from attr:1 through toy2toy2:1" in text
    for bad in (["--steer", "nope", "--map", "toy2toy2", "--name", "x"], ["--steer", "attr:1", "--map", "nope"],
                ["--steer", "attr:2", "--map", "toy2toy2", "--name", "x"],  # a mean-shift baseline does not transfer
                ["--steer", "attr2@moved", "--map", "toy2toy2", "--name", "x"],  # the map does not start in toy2
                ["--steer", "attr:1", "--map", "toy2toy2", "--name", "attr"]):  # "attr" lives in toy, not toy2
        p = vb(*base, "steer", "transfer", *bad, check_code=2)
        assert p.stderr.startswith("vecbridge: error:") and "Traceback" not in p.stderr
    # no --name: STEER-TARGETSPACE (the steer's own name, bound to toy, always failed with exit 2)
    text = vb(*base, "steer", "transfer", "--steer", "attr:1", "--map", "toy2toy2").stdout
    assert text.startswith("registered steer attr-toy2:1 in space toy2")


def test_apply_refuses_an_eps_past_the_bound_before_reading_its_input(fitted):
    """``steer apply --eps 1e30`` wrote rows of ~1e29 (exit 0), as HTTP answered them; the bound of every face now
    (MAX_STEER_EPS), said in one line before IN is read (a missing file is not what is reported)."""
    d = fitted[0]
    for eps in ("1e30", "-1000.5"):
        p = vb("--data-dir", d / "var", "steer", "apply", "--steer", "attr", "--eps", eps, d / "absent.npy",
               d / "bounded.npy", check_code=2)
        assert "eps must be a number in [-1000, 1000]" in p.stderr and "Traceback" not in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1 and not (d / "bounded.npy").exists()


def test_apply_keeps_a_parquets_other_columns_as_transform_does(fitted):
    """QA: ``steer apply --steer st --eps 0.5 in.parquet out.parquet`` (columns id, vector, cat) wrote the vector
    column only: the ids and every other column were gone, exit 0, no word (read_vectors / write_vectors). It goes
    the way of ``vecbridge transform`` now: the other columns row for row, --rows and --chunk-rows as there, and a
    note naming the columns a .npy output cannot hold."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    d, X, _, _ = fitted
    n = len(X)
    pq.write_table(pa.table({"id": [f"doc-{i}" for i in range(n)],
                             "vector": pa.FixedSizeListArray.from_arrays(pa.array(X.reshape(-1)), X.shape[1]),
                             "cat": [i % 3 for i in range(n)]}), d / "in.parquet")
    from service.registry import open_registry

    reg = open_registry(f"sqlite:///{d / 'var' / 'registry.sqlite'}", d / "var" / "artifacts")
    try:
        want = reg.load_steer("attr:1").apply(X, 0.5)
    finally:
        reg.close()
    vb("--data-dir", d / "var", "steer", "apply", "--steer", "attr:1", "--eps", 0.5, d / "in.parquet",
       d / "out.parquet", "--rows", "10:250", "--chunk-rows", 7, "--quiet")
    t = pq.read_table(d / "out.parquet")
    assert t.column_names == ["id", "vector", "cat"]
    assert t.column("id").to_pylist() == [f"doc-{i}" for i in range(10, 250)]
    assert t.column("cat").to_pylist() == [i % 3 for i in range(10, 250)]
    np.testing.assert_allclose(np.array(t.column("vector").to_pylist(), np.float32), want[10:250], atol=1e-6)
    p = vb("--data-dir", d / "var", "steer", "apply", "--steer", "attr:1", "--eps", 0.5, d / "in.parquet",
           d / "out.npy", "--quiet")
    assert "other columns (id, cat) are not written" in p.stderr
    np.testing.assert_allclose(np.load(d / "out.npy"), want, atol=1e-6)
