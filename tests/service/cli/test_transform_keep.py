"""``vecbridge transform --keep-rows ROWS --keep-vectors NEW``: the rows a migration re-embedded to fit its map are
written with their own new-model vectors, every other row mapped; with ``--rows`` (a range or a listed file) each
kept row lands where its input row does, and kept rows outside the selection are not written. Bad input: exit 2
with a message, and no output file."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import run_cli as run

import align
from service.registry import Registry

N, D = 900, 16


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A data dir with map ``m`` (ridge, a planted rotation plus noise, 24 -> 16) and its files."""
    rng = np.random.default_rng(0)
    root = tmp_path_factory.mktemp("keep")
    X = rng.standard_normal((N, 24)).astype(np.float32)
    Y = (X @ rng.standard_normal((24, D)) + 0.5 * rng.standard_normal((N, D))).astype(np.float32)
    reg = Registry(f"sqlite:///{root / 'var' / 'registry.sqlite'}", root / "var" / "artifacts")
    reg.register_version("m", align.fit_ridge(X[:600], Y[:600]), source_space="old", target_space="new",
                         method="ridge", params={})
    reg.close()
    rows = np.array([899, 3, 450, 10, 0])  # any order: the vectors follow it
    np.save(root / "old.npy", X)
    np.save(root / "rows.npy", rows)
    np.save(root / "new_pairs.npy", Y[rows])
    return root, X, Y / np.linalg.norm(Y, axis=1, keepdims=True), rows  # kept rows are written as unit rows


def _cli(capsys, root, out, *args):
    return run(capsys, "--data-dir", root / "var", "transform", "--quiet", "--map", "m", root / "old.npy", out, *args)


@pytest.mark.parametrize("select, expect", [
    (None, np.arange(N)),
    ("5:460", np.arange(5, 460)),
    ("listed", np.array([450, 7, 899, 2])),
])
def test_kept_rows_hold_their_own_vectors_wherever_the_selection_puts_them(capsys, tmp_path, world, select, expect):
    root, _, Y, rows = world
    extra = []
    if select == "listed":
        np.save(tmp_path / "sel.npy", expect)
        extra = ["--rows", tmp_path / "sel.npy"]
    elif select:
        extra = ["--rows", select]
    code, out, err = _cli(capsys, root, tmp_path / "plain.npy", *extra, "--chunk-rows", "100")
    assert code == 0, err
    code, out, err = _cli(capsys, root, tmp_path / "kept.npy", *extra, "--chunk-rows", "100", "--json",
                          "--keep-rows", root / "rows.npy", "--keep-vectors", root / "new_pairs.npy")
    assert code == 0, err
    plain, kept = np.load(tmp_path / "plain.npy"), np.load(tmp_path / "kept.npy")
    native = np.isin(expect, rows)
    assert json.loads(out)["kept"] == int(native.sum()) > 0
    np.testing.assert_allclose(kept[native], Y[expect[native]], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(kept[~native], plain[~native])
    assert not np.allclose(plain[native], Y[expect[native]], atol=1e-3)  # the map alone did not give them


def test_a_parquet_keeps_its_other_columns_and_the_text_says_how_many_were_kept(capsys, tmp_path, world):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    root, X, Y, rows = world
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(N)],
                             "vec": pa.FixedSizeListArray.from_arrays(pa.array(X.reshape(-1)), X.shape[1])}),
                   tmp_path / "docs.parquet")
    code, out, err = run(capsys, "--data-dir", root / "var", "transform", "--quiet", "--map", "m",
                         tmp_path / "docs.parquet", tmp_path / "docs_new.parquet", "--keep-rows", root / "rows.npy",
                         "--keep-vectors", root / "new_pairs.npy")
    assert code == 0, err
    assert "5 of them re-embedded, kept as given" in out
    got = pq.read_table(tmp_path / "docs_new.parquet")
    assert got.column("id").to_pylist() == [f"d{i}" for i in range(N)]
    np.testing.assert_allclose(np.stack(got.column("vec").to_numpy(zero_copy_only=False))[rows], Y[rows],
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("args, match", [
    (["--keep-rows", "{root}/rows.npy"], "needs both their rows"),
    (["--keep-vectors", "{root}/new_pairs.npy"], "needs both their rows"),
    (["--keep-rows", "0:4", "--keep-vectors", "{root}/new_pairs.npy"],
     r"\(new_pairs.npy\) hold 5 rows but the keep rows \(--keep-rows\) list 4"),
    (["--keep-rows", "{root}/rows.npy", "--keep-vectors", "{root}/old.npy"], "hold 900 rows but"),
    (["--keep-rows", "0:5", "--keep-vectors", "{tmp}/wide.npy"], "24-d rows; the map's target .* is 16-d"),
    (["--keep-rows", "{root}/rows.npy", "--keep-vectors", "{root}/new_pairs.npy", "--output", "frame"],
     "needs output 'raw'"),
    # a bad keep row blamed the corpus ("old.npy: row index 900 is outside the file's 900 rows"): the option now
    (["--keep-rows", "898:903", "--keep-vectors", "{root}/new_pairs.npy"], "--keep-rows 898:903 is outside the 900 "
                                                                           "rows of old.npy"),
    (["--keep-rows", "{tmp}/far.npy", "--keep-vectors", "{root}/new_pairs.npy"],
     r"--keep-rows \(far.npy\) lists row index 900, outside the 900 rows of old.npy"),
    (["--keep-rows", "{root}/rows.npy", "--keep-vectors", "{out}"], "the output"),
    # the keep file's first row is input row 899, the last chunk's: was refused only when that chunk came, as
    # "Y_new holds 1 all-zero row(s) (e.g. row 0)", a row of neither file, eight chunks already written
    (["--keep-rows", "{root}/rows.npy", "--keep-vectors", "{tmp}/zero.npy"],
     r"\(zero.npy\) hold 1 all-zero row\(s\) \(input rows \[899\], at row\(s\) \[0\] of the vectors\)"),
    (["--keep-rows", "{root}/rows.npy", "--keep-vectors", "{tmp}/nan.npy"],  # was "nan.npy: 1 row(s) contain NaN"
     r"\(nan.npy\) hold 1 row\(s\) with NaN or Inf \(input rows \[450\], at row\(s\) \[2\] of the vectors\)"),
])
def test_bad_keep_options_exit_2_with_a_message_and_write_nothing(capsys, tmp_path, world, args, match):
    root, X, Y, rows = world
    np.save(tmp_path / "wide.npy", X[:5])
    np.save(tmp_path / "far.npy", np.array([3, 900]))
    for name, row, value in (("zero", 0, 0.0), ("nan", 2, np.nan)):
        bad = Y[rows].copy()
        bad[row] = value
        np.save(tmp_path / f"{name}.npy", bad)
    out = tmp_path / "out.npy"
    args = [a.format(root=root, tmp=tmp_path, out=out) for a in args]
    code, _, err = _cli(capsys, root, out, *args, "--chunk-rows", "100")
    assert code == 2 and err.startswith("vecbridge: error:"), err
    assert re.search(match, err), err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # nor a temporary


def test_an_all_zero_row_is_refused_by_its_row_unless_it_is_kept_native(capsys, tmp_path, world):
    """A zero row was mapped to the map's offset, a made-up vector (``POST /v1/maps/{ref}/transform`` and a
    migration refuse such rows): exit 2 naming the row, counted across chunks, and no output; a kept row is
    written native, so a zero there is no one's problem."""
    root, X, _, _ = world
    zero = X.copy()
    zero[[250, 3]] = 0
    np.save(tmp_path / "zero.npy", zero)
    out = tmp_path / "out.npy"
    code, _, err = run(capsys, "--data-dir", root / "var", "transform", "--quiet", "--map", "m",
                       tmp_path / "zero.npy", out, "--chunk-rows", "100")
    assert code == 2 and "zero.npy: 1 all-zero row(s) in the first 100 rows read (input row 3); a zero row has no " \
        "direction" in err, err
    assert not out.exists()
    code, _, err = run(capsys, "--data-dir", root / "var", "transform", "--quiet", "--map", "m",
                       tmp_path / "zero.npy", out, "--chunk-rows", "100", "--keep-rows", root / "rows.npy",
                       "--keep-vectors", root / "new_pairs.npy")
    # row 3 is kept: its own vector is written
    assert code == 2 and "1 all-zero row(s) in the first 300 rows read (input row 250)" in err, err
    assert not out.exists()  # the third chunk's row: two chunks were written, and the output is not left behind
    zero[250] = X[250]
    np.save(tmp_path / "zero.npy", zero)
    code, _, err = run(capsys, "--data-dir", root / "var", "transform", "--quiet", "--map", "m",
                       tmp_path / "zero.npy", out, "--chunk-rows", "100", "--keep-rows", root / "rows.npy",
                       "--keep-vectors", root / "new_pairs.npy")
    assert code == 0 and np.load(out).shape == (N, D), err


def test_an_all_zero_row_is_named_by_its_row_of_the_input_whatever_rows_selects(capsys, tmp_path, world):
    """With ``--rows`` the zero row was numbered within the selection (``--rows 400:700``: input row 450 was called
    "row 50"; a listed [600, 7, 450]: "row 0, 2"), and counted within its chunk alone."""
    root, X, _, _ = world
    zero = X.copy()
    zero[[450, 600]] = 0
    np.save(tmp_path / "zero.npy", zero)
    np.save(tmp_path / "sel.npy", np.array([600, 7, 450]))
    out = tmp_path / "out.npy"
    for rows, said in (("400:700", "1 all-zero row(s) in the first 100 rows read (input row 450)"),
                       (tmp_path / "sel.npy", "2 all-zero row(s) in the first 3 rows read (input row 600, 450)")):
        code, _, err = run(capsys, "--data-dir", root / "var", "transform", "--quiet", "--map", "m",
                           tmp_path / "zero.npy", out, "--rows", rows, "--chunk-rows", "100")
        assert code == 2 and f"zero.npy: {said}; a zero row" in err, err
        assert not out.exists()


def test_a_bad_keep_set_is_refused_before_a_row_is_mapped_or_written(tmp_path, world):
    """An all-zero keep vector for input row 899 was refused when its chunk came, after chunks 0-7 were mapped and
    written to the output's temporary file (progress said 89%); now the set is checked whole first, as a migration
    checks its keep set, and nothing is read, mapped or written."""
    from align.exceptions import DegenerateInputError
    from service.ops.transform import transform_file

    root, _, Y, rows = world
    bad = Y[rows].copy()
    bad[0] = 0.0
    np.save(tmp_path / "zero.npy", bad)
    said = []
    reg = Registry(f"sqlite:///{root / 'var' / 'registry.sqlite'}", root / "var" / "artifacts")
    try:
        with pytest.raises(DegenerateInputError, match=r"input rows \[899\]"):
            transform_file(reg, "m", root / "old.npy", tmp_path / "out.npy", chunk_rows=100,
                           keep_rows=rows, keep_vectors=tmp_path / "zero.npy",
                           progress=lambda stage, f: said.append(f))
    finally:
        reg.close()
    assert said == []  # not even the 0% of a start
    assert sorted(p.name for p in tmp_path.iterdir()) == ["zero.npy"]
