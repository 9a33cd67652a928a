"""Malformed input files on the command line (issue 15, finding 10).

Each file below used to end in exit 3 ("internal error") or, for a FIFO, hang ``fit`` and
``transform`` forever. Every one must now exit 2 with one line naming the file, for both
commands, without touching the registry.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from numpy.lib import format as npf

import align
from service.cli import main

rng = np.random.default_rng(0)
GOOD = rng.standard_normal((40, 8)).astype(np.float32)


def _npy_header_only(shape) -> bytes:
    b = io.BytesIO()
    npf.write_array_header_1_0(b, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return b.getvalue() + b"\0" * 64


def _make_files(d):
    import pyarrow as pa
    import pyarrow.parquet as pq

    np.save(d / "good.npy", GOOD)
    np.save(d / "object.npy", np.array([[1, "a"]], dtype=object), allow_pickle=True)
    whole = (d / "good.npy").read_bytes()
    (d / "truncated.npy").write_bytes(whole[: len(whole) - 40])
    (d / "huge_shape.npy").write_bytes(_npy_header_only((10**13, 8)))
    blk = np.empty((5, 9), "<f4")
    blk[:, 1:] = GOOD[:5]
    blk.view("<i4")[:, 0] = 8
    (d / "truncated.fvecs").write_bytes(blk.tobytes()[:-6])
    (d / "ragged.fvecs").write_bytes(blk.tobytes()[:-8])  # whole words, partial last row
    pq.write_table(pa.table({"v": pa.array([["a", "b"], ["c", "d"]])}), d / "strings.parquet")
    pq.write_table(pa.table({"v": pa.array([[[1.0], [2.0]], [[3.0], [4.0]]])}), d / "nested.parquet")
    np.savez(d / "good.npz", x=GOOD)
    z = (d / "good.npz").read_bytes()
    (d / "corrupt.npz").write_bytes(z[: len(z) // 2])
    with zipfile.ZipFile(d / "huge_shape.npz", "w") as zf:
        zf.writestr("x.npy", _npy_header_only((10**9, 384)))
    np.save(d / "scalar.npy", np.array(1.0))  # 0-d: count_rows read shape[0] (IndexError, exit 3)
    np.savez(d / "scalar.npz", x=np.array(1.0))
    (d / "deep.json").write_text("[" * 5000 + "]" * 5000)  # json.loads: RecursionError (exit 3)
    (d / "deep.jsonl").write_text("[" * 5000 + "]" * 5000 + "\n")
    with zipfile.ZipFile(d / "object.npz", "w") as zf:
        b = io.BytesIO()
        npf.write_array(b, np.array([1, "a"], dtype=object), allow_pickle=True)
        zf.writestr("x.npy", b.getvalue())


BAD = ["object.npy", "truncated.npy", "huge_shape.npy", "truncated.fvecs", "ragged.fvecs", "strings.parquet",
       "nested.parquet", "corrupt.npz", "huge_shape.npz", "object.npz", "scalar.npy", "scalar.npz", "deep.json",
       "deep.jsonl"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("files")
    _make_files(d)
    data = d / "var"
    from service.registry import open_registry

    reg = open_registry(f"sqlite:///{data / 'registry.sqlite'}", data / "artifacts")
    reg.register_version("p->q", align.fit_procrustes(GOOD, GOOD[:, ::-1].copy()), source_space="p",
                         target_space="q", method="procrustes", params={})
    reg.close()
    return d, data


def _run(capsys, data, *args) -> tuple[int, str]:
    rc = main(["--data-dir", str(data), *[str(a) for a in args]])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("name", BAD)
def test_malformed_file_exits_2_with_one_line_naming_it(world, capsys, name):
    d, data = world
    for args in (["fit", "--quiet", "--pairs", "--method", "procrustes", "--name", "bad", "--source-space", "p",
                  "--target-space", "q", "--source", d / name, "--target", d / "good.npy"],
                 ["transform", "--quiet", "--map", "p->q", d / name, d / "out.npy"]):
        rc, err = _run(capsys, data, *args)
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        assert rc == 2, f"{args[0]} {name}: exit {rc}: {err[-400:]}"
        assert len(lines) == 1 and name in lines[0] and "internal error" not in lines[0], err
    assert not (d / "out.npy").exists()


def test_good_files_still_read(world, capsys):
    d, data = world
    for name in ("good.npy", "good.npz"):
        rc, err = _run(capsys, data, "transform", "--quiet", "--map", "p->q", d / name, d / f"out_{name}.npy")
        assert rc == 0, err
        np.testing.assert_allclose(np.load(d / f"out_{name}.npy").shape, GOOD.shape)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_fifo_input_is_refused_not_waited_on(world):
    """A real process: with the old code it blocked in open() forever (the timeout would fire)."""
    d, data = world
    fifo = d / "pipe.npy"
    os.mkfifo(fifo)
    for args in (["fit", "--quiet", "--pairs", "--method", "procrustes", "--name", "bad", "--source", fifo,
                  "--target", d / "good.npy"],
                 ["transform", "--quiet", "--map", "p->q", fifo, d / "out.npy"]):
        p = subprocess.run([sys.executable, "-m", "service.cli", "--data-dir", str(data), *map(str, args)],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 2, p.stderr[-500:]
        assert "not a regular file" in p.stderr and "Traceback" not in p.stderr


def test_index_commands_refuse_bad_files_and_ids(world, capsys):
    """``vecbridge index``: a 0-d array, an id past int64, JSON nested too deep (ids, --param) are exit 2 with one
    line (were exit 3: IndexError, OverflowError, RecursionError); an ids file with ``true`` is refused (it was
    read as id 1)."""
    d, data = world
    (d / "bools.json").write_text("[0, true]")
    assert _run(capsys, data, "index", "create", "ix", "--space", "p", d / "good.npy", "--quiet")[0] == 0
    for args in (["index", "create", "ix0", "--space", "p", d / "scalar.npy", "--quiet"],
                 ["index", "add", "ix", d / "scalar.npz", "--quiet"],
                 ["index", "search", "ix", d / "scalar.npy"],
                 ["index", "search", "ix", d / "deep.jsonl"],
                 ["index", "delete", "ix", "--id", str(2**63)],
                 ["index", "delete", "ix", "--id", str(2**62)],
                 ["index", "delete", "ix", "--ids", d / "deep.json"],
                 ["index", "delete", "ix", "--ids", d / "bools.json"],  # [0, true] deleted ids 0 and 1
                 ["index", "create", "ix1", "--space", "p", d / "good.npy", "--kind", "hnsw", "--quiet",
                  "--param", "M=" + "[" * 5000 + "]" * 5000]):
        rc, err = _run(capsys, data, *args)
        assert rc == 2, f"{args}: exit {rc}: {err[-400:]}"
        assert "internal error" not in err and "Traceback" not in err, err
    # an empty ids file: exit 2 beside numpy's "loadtxt: input contained no data" warning (text), or "ids must be a
    # flat list of integers, got shape (0,) dtype float64" (`[]`); now one line saying the file holds no ids
    for name, text in (("none.txt", ""), ("none.json", "[]")):
        (d / name).write_text(text)
        for args in (["index", "delete", "ix", "--ids", d / name], ["index", "add", "ix", d / "good.npy", "--ids",
                                                                      d / name, "--quiet"]):
            rc, err = _run(capsys, data, *args)
            assert rc == 2 and err == f"vecbridge: error: {name}: holds no ids\n", (args, err)
    assert main(["--data-dir", str(data), "index", "show", "ix", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["count"] == GOOD.shape[0]  # nothing refused changed the index


@pytest.mark.parametrize("line", ["NaN", "Infinity", "[" * 300 + "]" * 300, '{"id": 123456789012345678901234567890}',
                                  "[-9223372036854775809]"], ids=["nan", "inf", "deep", "int128", "below-int64"])
def test_index_payload_files_follow_the_http_rules(world, capsys, line):
    """A payloads file: NaN / Infinity are not JSON (an HTTP body cannot carry them; over HTTP they came back as
    null), nesting is bounded as over HTTP (a 300-deep payload made every HTTP search that hit its row a 500), and
    so are integers: one past 64 bits made every such search a 500 too (orjson cannot write it)."""
    d, data = world
    f = d / "payloads.jsonl"
    f.write_text(line + "\n" + "1\n" * (GOOD.shape[0] - 1))
    rc, err = _run(capsys, data, "index", "create", "pl", "--space", "p", d / "good.npy", "--payloads", f, "--quiet")
    assert rc == 2 and "payloads.jsonl: line 1" in err and "internal error" not in err, err
    f.write_text("[" * 30 + "]" * 30 + "\n" + "1\n" * (GOOD.shape[0] - 1))  # as deep as HTTP allows
    rc, err = _run(capsys, data, "index", "create", "pl_ok", "--space", "p", d / "good.npy", "--payloads", f,
                   "--quiet")
    assert rc == 0, err
    assert _run(capsys, data, "index", "drop", "pl_ok", "--yes")[0] == 0


def test_index_payload_file_with_a_byte_order_mark(world, capsys):
    """A payloads file saved with a UTF-8 byte-order mark (Notepad, PowerShell's Out-File) was refused: line 1 "is
    not JSON (Unexpected UTF-8 BOM)"; the mark is the file's encoding, not part of the first value."""
    d, data = world
    f = d / "bom_payloads.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps({"i": i}) + "\r\n" for i in range(GOOD.shape[0])).encode())
    rc, err = _run(capsys, data, "index", "create", "pl_bom", "--space", "p", d / "good.npy", "--payloads", f,
                   "--quiet")
    assert rc == 0, err
    assert main(["--data-dir", str(data), "index", "search", "pl_bom", str(d / "good.npy"), "--rows", "0:1", "-k", "1",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["results"][0][0]["payload"] == {"i": 0}
    assert _run(capsys, data, "index", "drop", "pl_bom", "--yes")[0] == 0


def test_id_label_and_seed_files_with_a_byte_order_mark_or_an_upper_case_suffix(world, capsys, tmp_path):
    """``--ids``, ``--seed-pairs`` and ``--labels`` files saved with a UTF-8 byte-order mark (Notepad, PowerShell)
    were refused ("'\\ufeff1' is not an integer", "Unexpected UTF-8 BOM") while text inputs take it; and
    ``--labels LAB.NPY`` was read as text. Now the mark is skipped and the suffix read in any case."""
    from service.cli._common import read_ids, read_labels, read_seed_pairs

    bom = b"\xef\xbb\xbf"
    for name, text in (("ids.txt", "3 4\n5"), ("ids.json", "[3, 4, 5]")):
        (tmp_path / name).write_bytes(bom + text.encode())
        assert read_ids(str(tmp_path / name)).tolist() == [3, 4, 5]
    for name, text in (("seeds.txt", "0 1\r\n2 3\r\n"), ("seeds.json", "[[0, 1], [2, 3]]")):
        (tmp_path / name).write_bytes(bom + text.encode())
        assert [a.tolist() for a in read_seed_pairs(str(tmp_path / name))] == [[0, 2], [1, 3]]
    (tmp_path / "labels.txt").write_bytes(bom + b"1\n-1\n0\n")
    assert read_labels(str(tmp_path / "labels.txt"), 3).tolist() == [1, -1, 0]
    with open(tmp_path / "LAB.NPY", "wb") as f:
        np.save(f, np.array([1, -1, 0]))
    assert read_labels(str(tmp_path / "LAB.NPY"), 3).tolist() == [1, -1, 0]
    d, data = world
    assert _run(capsys, data, "index", "create", "bom_ids", "--space", "p", d / "good.npy", "--quiet")[0] == 0
    rc, err = _run(capsys, data, "index", "delete", "bom_ids", "--ids", tmp_path / "ids.json")
    assert rc == 0, err
    assert main(["--data-dir", str(data), "index", "show", "bom_ids", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["count"] == GOOD.shape[0] - 3
    assert _run(capsys, data, "index", "drop", "bom_ids", "--yes")[0] == 0
