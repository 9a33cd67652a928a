"""A file's NaN / Inf, float32 overflow and a parquet's null or ragged rows are named by the file's own row numbers,
and counted only as far as they were read ("big.npy: 1 row(s) contain NaN or Inf" named no row, and its count was
the failing chunk's, said as if it were the file's)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from align.exceptions import NonFiniteError
from service.io import FormatError, iter_chunks, read_vectors
from conftest import run_cli as run


def _rows(n=5000, d=8):
    return np.random.default_rng(0).standard_normal((n, d)).astype(np.float32)


def _error(path, **kw) -> str:
    with pytest.raises((NonFiniteError, FormatError)) as e:
        for _ in iter_chunks(path, **kw):
            pass
    return str(e.value)


def test_nan_rows_are_named_as_rows_of_the_file_and_counted_as_read(tmp_path):
    X = _rows()
    X[[1700, 1701, 4999], 3] = np.nan
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "listed.npy", np.array([4999, 10, 1700]))
    said = "x.npy: at least 2 row(s) contain NaN or Inf (input rows 1700, 1701)"
    assert _error(tmp_path / "x.npy", chunk_rows=1000) == said
    assert _error(tmp_path / "x.npy", chunk_rows=1000, rows="1500:5000") == said  # numbered in the file, not --rows
    assert _error(tmp_path / "x.npy", rows=np.array([4999, 10, 1700])) == \
        "x.npy: at least 2 row(s) contain NaN or Inf (input rows 4999, 1700)"  # listed rows: their own numbers
    with pytest.raises(NonFiniteError, match=r"^x\.npy: at least 1 row\(s\) contain NaN or Inf \(input row 1701\)$"):
        read_vectors(tmp_path / "x.npy", rows="1701:1702")


def test_float32_overflow_names_the_first_rows_and_claims_no_total(tmp_path):
    np.save(tmp_path / "w.npy", _rows().astype(np.float64) * 1e39)  # every row overflows float32
    said = _error(tmp_path / "w.npy", chunk_rows=1000, rows="2000:5000")
    assert said == ("w.npy: at least 1000 row(s) hold values beyond float32's range (±3.4e38) (input rows 2000, "
                    "2001, 2002, 2003, 2004, 2005, 2006, 2007, 2008, 2009, ...); scale them down"), said


def test_parquet_null_ragged_and_holed_rows_are_named(tmp_path):
    X = _rows(3000)
    lists = [list(map(float, r)) for r in X]
    for name, row, change in (("null", 2100, None), ("ragged", 2500, lists[2500][:3]),
                              ("holed", 2222, lists[2222][:5] + [None] + lists[2222][6:])):
        vals = list(lists)
        vals[row] = change
        pq.write_table(pa.table({"vector": pa.array(vals, type=pa.list_(pa.float32()))}), tmp_path / f"{name}.parquet",
                       row_group_size=1000)
    assert _error(tmp_path / "null.parquet", chunk_rows=1000).endswith("null rows (the first: row 2100)")
    assert _error(tmp_path / "null.parquet", rows=np.array([5, 2100])).endswith("null rows (the first: row 2100)")
    assert _error(tmp_path / "ragged.parquet", chunk_rows=1000).endswith(
        "vectors of different lengths in the list column (row 2500 has 3 values, row 2000 8)")
    assert "the first in row 2222; at least 1" in _error(tmp_path / "holed.parquet", chunk_rows=1000)
    with pytest.raises(FormatError, match=r"the first: row 2100\)"):
        read_vectors(tmp_path / "null.parquet", rows="2000:2200")


def test_transform_names_the_input_row(capsys, tmp_path):
    """Through the CLI: the row the QA found unnamed (a NaN deep in a file read in chunks)."""
    import align
    from service.registry import open_registry

    X = _rows(3000)
    X[2345, 0] = np.inf
    np.save(tmp_path / "x.npy", X)
    var = tmp_path / "var"
    open_registry(f"sqlite:///{var / 'registry.sqlite'}", var / "artifacts").register_version(
        "m", align.LinearMap(np.eye(8)), source_space="a", target_space="a", method="identity", params={})
    code, _, err = run(capsys, "--data-dir", var, "transform", "--map", "m", tmp_path / "x.npy", tmp_path / "o.npy",
                       "--chunk-rows", "1000", "--quiet")
    assert code == 2 and "at least 1 row(s) contain NaN or Inf (input row 2345)" in err, err
    assert not (tmp_path / "o.npy").exists()
