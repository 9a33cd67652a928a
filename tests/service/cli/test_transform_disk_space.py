"""A `.npy` output's size is known before the work: a disk without room for it is refused before any row is read
(a 1.5 GB transform ran 4.8 s before "no space left" where the file system does not reserve space: fallocate
unsupported, as on ZFS)."""

from __future__ import annotations

import errno
import os
import shutil
from collections import namedtuple

import numpy as np

import align
from conftest import run_cli as run


def test_a_npy_output_without_room_is_refused_before_the_work(capsys, tmp_path, monkeypatch):
    import service.ops.transform
    from service.registry import open_registry

    var = tmp_path / "var"
    open_registry(f"sqlite:///{var / 'registry.sqlite'}", var / "artifacts").register_version(
        "m", align.LinearMap(np.eye(8)), source_space="a", target_space="a", method="identity", params={})
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((5000, 8)).astype(np.float32))
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(1 << 30, (1 << 30) - 100_000, 100_000))  # < 160,128

    def unsupported(fd, offset, length):  # a file system that cannot reserve space (ZFS): writes fail late
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    read, real = [], service.ops.transform.iter_chunks

    def counted(*a, **k):  # the rows read for the work (the check's sample too)
        for chunk in real(*a, **k):
            read.append(chunk.shape[0])
            yield chunk

    monkeypatch.setattr(service.ops.transform, "iter_chunks", counted)
    code, _, err = run(capsys, "--data-dir", var, "transform", "--map", "m", tmp_path / "x.npy", tmp_path / "o.npy",
                       "--quiet")
    assert code == 2 and "no space left on the device holding" in err and "o.npy" in err, err
    assert not (tmp_path / "o.npy").exists() and not list(tmp_path.glob("*.part-*"))
    assert read == [], "rows were read before the output's room was checked"
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(1 << 30, 0, 1 << 30))  # room: written as before
    code, _, err = run(capsys, "--data-dir", var, "transform", "--map", "m", tmp_path / "x.npy", tmp_path / "o.npy",
                       "--quiet")
    assert code == 0 and np.load(tmp_path / "o.npy").shape == (5000, 8), err
    assert sum(read) == 5000  # the count above would have seen rows read
