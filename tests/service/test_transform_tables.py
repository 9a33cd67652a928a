"""``vecbridge transform`` of a parquet table: the columns besides the vectors travel with their rows.

QA: a parquet of id (str), text (str), vec (fixed_size_list<float32>[384]) transformed into a parquet came out as
one column, ``vector``: the ids and payloads were gone, with exit 0 and no word. Now every other column is written
unchanged, row for row, and the vector column keeps its name; an output that cannot hold them says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli as run

import align
from service.distributed import transform_files_ray
from service.registry import Registry

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

WORDNET = Path("/work/shared/data/wordnet")
N, D = 2000, 384


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A data dir whose registry holds ``m`` (Procrustes MiniLM -> E5, WordNet rows 0:1500); MiniLM rows 2000:4000."""
    if not (WORDNET / "minilm.npy").exists():
        pytest.skip("the WordNet vectors are not here")
    var = tmp_path_factory.mktemp("tables") / "var"
    src, tgt = (np.load(WORDNET / f"{n}.npy", mmap_mode="r") for n in ("minilm", "e5"))
    reg = Registry(f"sqlite:///{var / 'registry.sqlite'}", var / "artifacts")
    m = align.fit_procrustes(np.asarray(src[:1500]), np.asarray(tgt[:1500]))
    reg.register_version("m", m, source_space="minilm", target_space="e5", method="procrustes", params={})
    reg.close()
    return var, m, np.ascontiguousarray(src[2000 : 2000 + N], dtype=np.float32)


def _table(X: np.ndarray, vectors=None) -> pa.Table:
    """Rows of ``X`` with columns of many types around them; the vectors in the middle."""
    n = len(X)
    rng = np.random.default_rng(0)
    vec = vectors if vectors is not None else pa.FixedSizeListArray.from_arrays(pa.array(X.reshape(-1)), X.shape[1])
    return pa.table({
        "id": [f"doc-{i}" for i in range(n)],
        "score": rng.normal(size=n),  # float64: compared bit for bit
        "vec": vec,
        "text": [f"definition {i} " * (i % 5) for i in range(n)],
        "n": pa.array([None if i % 7 == 0 else i for i in range(n)], pa.int32()),
        "tags": [["a", "b"][: i % 3] for i in range(n)],
        "at": pa.array(np.arange(n, dtype="int64") * 1000, pa.timestamp("ms", tz="UTC")),
        "meta": [{"k": i, "ok": i % 2 == 0} for i in range(n)],
    })


def _cli(capsys, var, *args):
    return run(capsys, "--data-dir", var, "transform", "--quiet", "--map", "m", *args)


@pytest.mark.parametrize("rows", [None, "650:1500"])
def test_a_parquet_table_keeps_every_column_row_for_row(capsys, tmp_path, world, rows):
    var, _, X = world
    t = _table(X)
    pq.write_table(t, tmp_path / "docs.parquet", row_group_size=700)  # 3 row groups; chunks of 512 cross them
    extra = ["--rows", rows] if rows else []
    code, _, err = _cli(capsys, var, tmp_path / "docs.parquet", tmp_path / "docs_e5.parquet", "--chunk-rows", "512",
                        *extra)
    assert code == 0 and err == "", err
    assert _cli(capsys, var, tmp_path / "docs.parquet", tmp_path / "ref.npy", *extra)[0] == 0
    got = pq.read_table(tmp_path / "docs_e5.parquet")
    lo, hi = (650, 1500) if rows else (0, N)
    want = t.slice(lo, hi - lo)
    assert got.schema.names == t.schema.names  # same columns, same order
    for f in t.schema:
        assert got.schema.field(f.name).type == (pa.list_(pa.float32(), D) if f.name == "vec" else f.type), f.name
        if f.name != "vec":
            assert got.column(f.name).equals(want.column(f.name)), f.name
    bits = [c.column("score").to_numpy().view(np.uint64) for c in (got, want)]
    assert np.array_equal(*bits)
    Y = np.stack(got.column("vec").to_numpy(zero_copy_only=False))
    np.testing.assert_array_equal(Y, np.load(tmp_path / "ref.npy"))  # the vectors as the .npy output has them
    assert pq.ParquetFile(tmp_path / "docs_e5.parquet").metadata.num_row_groups > 1  # written as streamed


@pytest.mark.parametrize("kind", ["list<float32>", "list<float16>", "large_list<float64>"])
def test_other_vector_types_come_out_as_fixed_size_float32_under_their_name(capsys, tmp_path, world, kind):
    var, _, X = world
    X = X[:300]
    flat = {"list<float32>": pa.float32(), "list<float16>": pa.float16(), "large_list<float64>": pa.float64()}[kind]
    values = pa.array(X.astype(flat.to_pandas_dtype()).reshape(-1), flat)
    offsets = np.arange(0, X.size + 1, D)
    vec = (pa.LargeListArray if kind.startswith("large") else pa.ListArray).from_arrays(offsets, values)
    t = _table(X, vectors=vec)
    pq.write_table(t, tmp_path / "in.parquet", row_group_size=128)
    assert _cli(capsys, var, tmp_path / "in.parquet", tmp_path / "out.parquet")[0] == 0
    assert _cli(capsys, var, tmp_path / "in.parquet", tmp_path / "ref.npy")[0] == 0
    got = pq.read_table(tmp_path / "out.parquet")
    assert got.schema.names == t.schema.names and got.schema.field("vec").type == pa.list_(pa.float32(), D)
    np.testing.assert_array_equal(np.stack(got.column("vec").to_numpy(zero_copy_only=False)),
                                  np.load(tmp_path / "ref.npy"))
    assert got.drop_columns(["vec"]).equals(t.drop_columns(["vec"]))


def test_an_output_without_room_for_the_other_columns_says_so_once(capsys, tmp_path, world):
    var, _, X = world
    pq.write_table(_table(X[:100]), tmp_path / "docs.parquet")
    for suffix in (".npy", ".fvecs"):
        code, out, err = _cli(capsys, var, tmp_path / "docs.parquet", tmp_path / f"out{suffix}")
        assert code == 0 and err.count("\n") == 1 and err.startswith("vecbridge: note: "), err
        for name in ("id", "score", "text", "n", "tags", "at", "meta"):
            assert name in err
    code, out, err = _cli(capsys, var, tmp_path / "docs.parquet", tmp_path / "j.npy", "--json")
    assert code == 0 and err == "" and "id, score, text" in json.loads(out)["note"]  # --json: in the result
    pq.write_table(pa.table({"emb": pa.FixedSizeListArray.from_arrays(pa.array(X[:100].reshape(-1)), D)}),
                   tmp_path / "bare.parquet")
    code, out, err = _cli(capsys, var, tmp_path / "bare.parquet", tmp_path / "bare.npy")
    assert code == 0 and err == ""  # nothing left behind: nothing said
    code, out, err = _cli(capsys, var, tmp_path / "bare.parquet", tmp_path / "bare_e5.parquet")
    assert code == 0 and pq.read_schema(tmp_path / "bare_e5.parquet").names == ["emb"]
    np.save(tmp_path / "x.npy", X[:100])  # a matrix has one name for its column
    assert _cli(capsys, var, tmp_path / "x.npy", tmp_path / "x.parquet")[0] == 0
    assert pq.read_schema(tmp_path / "x.parquet").names == ["vector"]


def test_transform_files_keep_the_columns_of_a_parquet(tmp_path, world):
    _, m, X = world
    t = _table(X[:500])
    pq.write_table(t, tmp_path / "part.parquet", row_group_size=200)
    [res] = transform_files_ray(m, [tmp_path / "part.parquet"], tmp_path / "out", suffix=".e5.parquet",
                                batch_size=128, use_ray=False)
    got = pq.read_table(res["output"])
    assert res["note"] is None and got.drop_columns(["vec"]).equals(t.drop_columns(["vec"]))
    np.testing.assert_allclose(np.stack(got.column("vec").to_numpy(zero_copy_only=False)), m.apply(X[:500]),
                               rtol=1e-6, atol=1e-6)
    [res] = transform_files_ray(m, [tmp_path / "part.parquet"], tmp_path / "out", use_ray=False)  # .mapped.npy
    assert "id, score, text" in res["note"] and np.load(res["output"]).shape == (500, D)


def test_the_other_columns_are_streamed_a_batch_at_a_time(tmp_path):
    """The payloads are read as the vectors are, in batches: Arrow holds about a row group, never the file."""
    from service.io import iter_chunks
    from service.tables import MappedWriter

    n, d, group = 16_384, 8, 256  # 64 MiB of payloads in 64 row groups of 1 MiB
    rng = np.random.default_rng(0)
    blob = rng.bytes(4096)
    p = tmp_path / "in.parquet"
    with pq.ParquetWriter(p, pa.schema([("payload", pa.binary()), ("vec", pa.list_(pa.float32(), d)),
                                        ("row", pa.int64())])) as w:
        for s in range(0, n, group):
            X = rng.standard_normal((group, d), dtype=np.float32)
            w.write_table(pa.table({"payload": [blob[i % 64:] + s.to_bytes(8, "little") for i in range(group)],
                                    "vec": pa.FixedSizeListArray.from_arrays(pa.array(X.reshape(-1)), d),
                                    "row": np.arange(s, s + group)}))
    base, most = pa.total_allocated_bytes(), 0
    with MappedWriter(p, tmp_path / "out.parquet", dim=d, n_rows=n, batch_rows=1000) as w:
        for X in iter_chunks(p, chunk_rows=1000):
            w.write(2 * X)
            most = max(most, pa.total_allocated_bytes() - base)
    assert most < 12 * 2**20, f"Arrow held {most / 2**20:.0f} MiB while streaming a 64 MiB file"
    f = pq.ParquetFile(tmp_path / "out.parquet")
    assert f.metadata.num_rows == n and f.schema_arrow.names == ["payload", "vec", "row"]
    for a, b in zip(pq.ParquetFile(p).iter_batches(4096), f.iter_batches(4096)):
        assert a.column(0).equals(b.column(0)) and a.column(2).equals(b.column(2))
        np.testing.assert_array_equal(np.stack(b.column(1).to_numpy(zero_copy_only=False)),
                                      2 * np.stack(a.column(1).to_numpy(zero_copy_only=False)))
