"""A rows file (``--rows rows.npy``) on the streamed path reads its file once, not once per chunk: each chunk
called ``read_vectors`` on the whole file (a ``.npz`` decoded again per chunk: 200k rows in chunks of 1,000 took
23.6 s, not 1.85 s; a parquet's whole vector column, and into a parquet all its other columns, read per chunk and
held). The reads are counted here (the real readers, wrapped), not timed; the rows must stay the ones listed, in
the order listed."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run_cli as run

from service.io import iter_chunks, write_vectors

N, D = 900, 8


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(N, D)).astype(np.float32)
    write_vectors(tmp_path / "x.npy", X)
    write_vectors(tmp_path / "x.npz", X)
    write_vectors(tmp_path / "x.fvecs", X)
    pq.write_table(pa.table({"id": np.arange(N) * 10, "vector": X.tolist(), "tag": [f"t{i}" for i in range(N)]}),
                   tmp_path / "x.parquet", row_group_size=100)
    return tmp_path, X


def _rows():
    rng = np.random.default_rng(2)
    return {"sorted": np.sort(rng.choice(N, 400, replace=False)), "shuffled": rng.permutation(N)[:500],
            "descending": np.arange(N - 1, 0, -3)}


@pytest.mark.parametrize("order", ["sorted", "shuffled", "descending"])
@pytest.mark.parametrize("suffix", [".npy", ".npz", ".fvecs", ".parquet"])
def test_listed_rows_come_back_as_listed(files, suffix, order):
    d, X = files
    rows = _rows()[order]
    got = np.vstack(list(iter_chunks(d / f"x{suffix}", chunk_rows=37, rows=rows)))
    np.testing.assert_array_equal(got, X[rows])


def _count_reads(monkeypatch):
    """Rows the parquet reader returns, and .npz archives np.load opens, from here on (the real calls, counted)."""
    seen = {"parquet_rows": 0, "npz_loads": 0}
    for name in ("read", "read_row_group", "read_row_groups"):
        real = getattr(pq.ParquetFile, name)

        def counted(self, *a, _real=real, **k):
            t = _real(self, *a, **k)
            seen["parquet_rows"] += t.num_rows
            return t
        monkeypatch.setattr(pq.ParquetFile, name, counted)
    real_iter = pq.ParquetFile.iter_batches

    def counted_iter(self, *a, **k):
        for b in real_iter(self, *a, **k):
            seen["parquet_rows"] += b.num_rows
            yield b
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", counted_iter)
    real_load = np.load

    def counted_load(file, *a, **k):
        seen["npz_loads"] += str(file).endswith(".npz")
        return real_load(file, *a, **k)
    monkeypatch.setattr(np, "load", counted_load)
    return seen


def _with_map(capsys, d, order: str):
    """The rows file of ``order`` saved as ``d/rows.npy``, and a data dir holding map ``m`` (ridge, x -> x)."""
    rows = _rows()[order]
    np.save(d / "rows.npy", rows)
    var = ["--data-dir", d / "var"]
    assert run(capsys, *var, "fit", "--source", d / "x.npy", "--target", d / "x.npy", "--method", "ridge", "--name",
               "m", "--quiet")[0] == 0
    return rows, var


def test_a_rows_file_reads_the_file_once_not_per_chunk(capsys, files, monkeypatch):
    d, _ = files
    rows, var = _with_map(capsys, d, "sorted")
    seen = _count_reads(monkeypatch)
    code, _, err = run(capsys, *var, "transform", "--map", "m", "--rows", d / "rows.npy", d / "x.npz", d / "o.npy",
                       "--quiet", "--chunk-rows", "20")
    assert code == 0, err
    assert seen["npz_loads"] <= 2, seen  # its rows counted, then decoded once (was: once more per chunk, 21 in all)
    code, _, err = run(capsys, *var, "transform", "--map", "m", "--rows", d / "rows.npy", d / "x.parquet",
                       d / "o.parquet", "--quiet", "--chunk-rows", "20")
    assert code == 0, err
    # rows in file order: each row group read once for the vectors and once for the other columns (was: the whole
    # vector column per chunk, and every other column of the whole file)
    assert seen["parquet_rows"] <= 2 * N, seen
    t = pq.read_table(d / "o.parquet")
    assert t.column("id").to_pylist() == (rows * 10).tolist()
    assert t.column("tag").to_pylist() == [f"t{i}" for i in rows]
    np.testing.assert_allclose(np.asarray(t.column("vector").to_pylist()), np.load(d / "o.npy"), atol=1e-6)


def test_shuffled_rows_into_a_parquet_keep_their_other_columns(capsys, files):
    d, _ = files
    rows, var = _with_map(capsys, d, "shuffled")
    code, _, err = run(capsys, *var, "transform", "--map", "m", "--rows", d / "rows.npy", d / "x.parquet",
                       d / "o.parquet", "--quiet", "--chunk-rows", "33")
    assert code == 0, err
    t = pq.read_table(d / "o.parquet")
    assert t.column("id").to_pylist() == (rows * 10).tolist()
    assert t.column("tag").to_pylist() == [f"t{i}" for i in rows]
    code, _, err = run(capsys, *var, "transform", "--map", "m", "--rows", d / "rows.npy", d / "x.npy", d / "o.npy",
                       "--quiet")
    assert code == 0, err
    np.testing.assert_allclose(np.asarray(t.column("vector").to_pylist()), np.load(d / "o.npy"), atol=1e-5)


def test_row_groups_past_the_memory_held_are_read_again_not_held(files):
    from service.listed_rows import RowGroups

    d, _ = files
    f = pq.ParquetFile(d / "x.parquet")
    rows = _rows()["shuffled"]
    few = RowGroups(f, d / "x.parquet", ["id"], hold_bytes=1)  # one row group held at a time
    got = np.concatenate([few.take(rows[s : s + 50]).column("id").to_numpy() for s in range(0, rows.size, 50)])
    assert got.tolist() == (rows * 10).tolist() and few.groups_read > 9
    many = RowGroups(f, d / "x.parquet", ["id"])  # the whole file fits: each of its 9 row groups read once
    got = np.concatenate([many.take(rows[s : s + 50]).column("id").to_numpy() for s in range(0, rows.size, 50)])
    assert got.tolist() == (rows * 10).tolist() and many.groups_read == 9
