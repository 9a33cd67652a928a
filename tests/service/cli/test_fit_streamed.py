"""`vecbridge fit --pairs` of a closed-form family (procrustes, ridge, lowrank) from two float32 .npy files is
streamed from them (:mod:`service.ops.fit_stream`): it read both files whole and ran every stage on those rows (300,000
x 384 pairs: 1.9 GB peak RSS here, 0.9 GB streamed). Streamed, the registered version is the in-memory fit's, bit for
bit: the map, every metric but the timings, the lineage's hashes; a bad row is named as the whole read names it. The
in-memory fit is the same command on float64 copies of the files (not streamed: their rows are converted)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import run_cli as run
from service.ops.fit_stream import pair_files
from service.registry import open_registry

N, D = 140_000, 24  # three shards of 65,536 rows


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """Planted pairs (a tenth of them twice: repeated pairs are grouped by the stream's digests) as float32 and
    float64 files of the same values."""
    path = tmp_path_factory.mktemp("pairs")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, D)).astype(np.float32)
    Y = (X @ np.linalg.qr(rng.normal(size=(D, D)))[0] + 0.7 * rng.normal(size=X.shape)).astype(np.float32)
    X[-N // 10 :], Y[-N // 10 :] = X[: N // 10], Y[: N // 10]
    S = rng.normal(size=(60, 48)).astype(np.float32)  # a fold's 48 training pairs are no more than the width
    T = (S @ np.linalg.qr(rng.normal(size=(48, 48)))[0] + 0.5 * rng.normal(size=S.shape)).astype(np.float32)
    for name, A in (("x", X), ("y", Y), ("sx", S), ("sy", T)):
        np.save(path / f"{name}.npy", A)
        np.save(path / f"{name}64.npy", A.astype(np.float64))
    return path


def _fit(capsys, monkeypatch, pairs, var, x, y, *args):
    """`fit` into data dir ``var``: ``(exit code, --json answer or stderr, files read whole)``."""
    import service.cli._common as common

    whole = []
    real = common.read_vectors
    monkeypatch.setattr(common, "read_vectors", lambda path, **kw: whole.append(str(path)) or real(path, **kw))
    code, out, err = run(capsys, "--data-dir", var, "fit", "--pairs", "--source", pairs / x, "--target", pairs / y,
                         "--name", "m", "--source-space", "a", "--target-space", "b", "--json", "--quiet", *args)
    return code, (json.loads(out) if code == 0 else err), whole


@pytest.mark.parametrize("x, args", [("x", ["--method", "procrustes"]),
                                     ("x", ["--method", "ridge", "--param", "alpha=0.5", "--rows", "7:-11"]),
                                     ("x", ["--method", "lowrank", "--param", "rank=8", "--random-state", "4"]),
                                     ("sx", ["--method", "ridge", "--param", "alpha=0.001"])],
                         ids=["procrustes", "ridge rows", "lowrank", "ridge small folds"])
def test_a_streamed_fit_registers_the_in_memory_fit_bit_for_bit(capsys, monkeypatch, tmp_path, pairs, x, args):
    y = x.replace("x", "y")
    code, streamed, whole = _fit(capsys, monkeypatch, pairs, tmp_path / "s", f"{x}.npy", f"{y}.npy", *args)
    assert code == 0 and whole == [], (streamed, whole)  # neither file read whole
    code, memory, whole = _fit(capsys, monkeypatch, pairs, tmp_path / "m", f"{x}64.npy", f"{y}64.npy", *args)
    assert code == 0 and len(whole) == 2, (memory, whole)
    for v in (streamed, memory):
        v["metrics"].pop("timings")
    assert streamed["metrics"] == memory["metrics"] and streamed["data_hashes"] == memory["data_hashes"]
    assert streamed["metrics"]["heldout_n_queries"] >= 60 and "heldout_top1" in streamed["metrics"]
    assert streamed["params"] == memory["params"] and streamed["inputs"]["n_source"] == memory["inputs"]["n_source"]
    maps = [open_registry(f"sqlite:///{tmp_path / v / 'registry.sqlite'}", tmp_path / v / "artifacts").load_map("m:1")
            for v in ("s", "m")]
    for attr in ("W", "bias"):
        a, b = (getattr(m, attr) for m in maps)
        assert (a is None and b is None) or np.array_equal(a, b), attr
    for side in ("source_frame", "target_frame"):
        a, b = (getattr(m, side) for m in maps)
        assert np.array_equal(a.mean, b.mean) and a.n_fit == b.n_fit


def test_a_bad_row_is_named_by_its_row_of_the_file_as_a_whole_read_names_it(capsys, monkeypatch, tmp_path, pairs):
    """The stream checks every row as it hashes it (in blocks): a NaN in the second block is refused before any fit,
    in the words of the whole read, which counted and named it by its row of the file."""
    for name, dtype in (("x", np.float32), ("x64", np.float64)):
        X = np.load(pairs / f"{name}.npy").astype(dtype)
        X[70_001, 3] = np.nan
        np.save(tmp_path / f"{name}.npy", X)
    (tmp_path / "y.npy").symlink_to(pairs / "y.npy")
    (tmp_path / "y64.npy").symlink_to(pairs / "y64.npy")
    errs, spaces_checked = [], []
    import service.ops.maps as maps

    real = maps.check_fit_spaces
    monkeypatch.setattr(maps, "check_fit_spaces", lambda *a, **kw: spaces_checked.append(1) or real(*a, **kw))
    for x, y in (("x.npy", "y.npy"), ("x64.npy", "y64.npy")):
        code, err, whole = _fit(capsys, monkeypatch, tmp_path, tmp_path / f"var-{x}", x, y, "--method", "procrustes")
        assert code == 2 and "70001" in err and len(whole) == (0 if x == "x.npy" else 1), (err, whole)
        errs.append(err.replace(x, "X"))
    assert errs[0] == errs[1], errs
    assert spaces_checked == []  # a review's find: the stream judged the spaces (e.g. "swapped") before the NaN


def test_what_streams_and_what_is_read_whole(tmp_path, pairs):
    """Streamed: a paired procrustes / ridge / lowrank fit in this process, centred frames, two 2-D float32 .npy
    files of as many rows (START:STOP rows or none), at least as many as the source is wide. Anything else is read
    whole, as before (and refused there when it is wrong)."""
    np.save(tmp_path / "few.npy", np.zeros((10, 24), np.float32))

    def opts(**kw):
        base = {"source": pairs / "x.npy", "target": pairs / "y.npy", "rows": None}
        base.update(kw)
        for side in ("source", "target"):
            for key in ("rows", "encoder", "key", "column"):
                base.setdefault(f"{side}_{key}", None)
        return base

    def streams(o=None, method="procrustes", params=None, paired=True, ray=None):
        return pair_files(o or opts(), method=method, params=params or {}, paired=paired, ray_address=ray)

    got = streams(opts(rows="10:-10"))
    assert got is not None and got.n == N - 20 and got.X.shape == (N - 20, D)
    assert streams(method="lowrank", params={"rank": 4}) is not None
    assert streams(params={"center": True, "chunk_size": 1000}) is not None
    for case in (streams(method="auto"), streams(method="minivec2vec", paired=False), streams(paired=False),
                 streams(ray="local"), streams(params={"center": False}), streams(params={"alpah": 1}),
                 streams(method="lowrank"), streams(method="ridge", params={"alpha": -1}),
                 streams(opts(source=pairs / "x64.npy")), streams(opts(target=pairs / "y64.npy")),
                 streams(opts(source_rows=np.arange(100))), streams(opts(source_rows="0:100")),
                 streams(opts(rows="a:b")),
                 streams(opts(source=tmp_path / "few.npy", target=tmp_path / "few.npy")),
                 streams(opts(source=tmp_path / "missing.npy")), streams(opts(source_encoder="minilm"))):
        assert case is None


def test_the_rows_a_stream_reads_are_the_files_rows(pairs):
    """The stages that read samples (diagnostics, the report's plan, the held-out rows) read them from the file:
    any order, repeats, runs, the ends of a --rows range."""
    got = pair_files({"source": pairs / "x.npy", "target": pairs / "y.npy", "rows": "5:-5",
                      **{f"{s}_{k}": None for s in ("source", "target") for k in ("rows", "encoder", "key", "column")}},
                     method="procrustes", params={}, paired=True, ray_address=None)
    X = np.load(pairs / "x.npy")[5:-5]
    rng = np.random.default_rng(1)
    for rows in (rng.choice(N - 10, 3000, replace=False), np.r_[0:40, 50, 50, 3, N - 11], np.arange(60_000, 70_000),
                 np.array([], dtype=np.int64)):
        out = got.source[rows]
        assert out.dtype == np.float32 and out.flags.c_contiguous and np.array_equal(out, X[rows])
    assert np.array_equal(got.source[10:20], X[10:20])
    with pytest.raises(IndexError):
        got.source[np.array([N - 10])]


def _stream(pairs, x="x", y="y", method="procrustes", params=None):
    unset = {f"{s}_{k}": None for s in ("source", "target") for k in ("rows", "encoder", "key", "column")}
    return pair_files({"source": pairs / f"{x}.npy", "target": pairs / f"{y}.npy", "rows": None, **unset},
                      method=method, params=params or {}, paired=True, ray_address=None)


@pytest.mark.parametrize("method, params", [("procrustes", {}), ("ridge", {"alpha": 0.01}),
                                            ("lowrank", {"rank": 5, "alpha": 0.1})])
def test_a_fold_fitted_from_the_files_is_the_fit_of_its_rows_bit_for_bit(pairs, method, params):
    """A cross-validation fold's map, fitted from the files (rows read in 65,536-row shards, or in memory when they
    are fewer than the source is wide, where align solves the dual system on the rows it holds), is
    ``align.fit_<method>`` of those rows, bit for bit: the held-out top-1 is the in-memory fit's."""
    import align

    fit = {"procrustes": align.fit_procrustes, "ridge": align.fit_ridge, "lowrank": align.fit_lowrank}[method]
    rng = np.random.default_rng(2)
    for x, y, rows in (("sx", "sy", np.arange(0, 40)), ("sx", "sy", np.arange(3, 60)),
                       ("x", "y", np.sort(rng.choice(N, 70_000, replace=False)))):
        X, Y = np.load(pairs / f"{x}.npy"), np.load(pairs / f"{y}.npy")
        got, want = _stream(pairs, x, y, method, params).fit(method, params, rows), fit(X[rows], Y[rows], **params)
        assert np.array_equal(got.W, want.W) and got.metadata == want.metadata, (x, rows.size)
        assert (got.bias is None and want.bias is None) or np.array_equal(got.bias, want.bias)
