"""Crash safety and multi-process concurrency of registry writes (SQLite and PostgreSQL).

A writer subprocess is stopped with SIGKILL at each step of the write path (the registry calls
``service.registry.core.FAULT_HOOK`` with the step's name); the registry must then hold either
the old state or the new one, and accept new writes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import align
from service.registry import NotFoundError, open_registry

WRITER = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np
    import align
    from service.registry import core, open_registry

    url, art, stop_at, marker, seed, count, go = sys.argv[1:8]

    def hook(point):
        if point == stop_at:
            open(marker, "w").write(point)
            time.sleep(600)  # killed here

    core.FAULT_HOOK = hook
    reg = open_registry(url, art)
    while go != "-" and not os.path.exists(go):
        time.sleep(0.005)
    got = []
    for i in range(int(count)):
        rng = np.random.default_rng(int(seed) * 1000 + i)
        m = align.LinearMap(rng.normal(size=(8, 8)))
        v = reg.register_version("a->b", m, source_space="a", target_space="b", method="custom",
                                 params={"i": i}, random_state=int(seed), alias="prod")
        got.append(v.version)
    print(json.dumps(got))
""")

POINTS_BEFORE_COMMIT = ["artifact_tmp_written", "artifact_renamed", "version_allocated", "version_inserted"]


def start_writer(url, art, stop_at="-", marker="-", seed=1, count=1, go="-"):
    return subprocess.Popen([sys.executable, "-c", WRITER, url, str(art), stop_at, str(marker), str(seed),
                             str(count), str(go)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def assert_consistent(reg):
    report = reg.verify()
    assert report["ok"], report
    for v in reg.list_versions("a->b"):
        reg.load_map(v.ref)  # every recorded version loads and matches its sha256


@pytest.mark.parametrize("point", [*POINTS_BEFORE_COMMIT, "committed"])
def test_kill_9_during_register_leaves_old_or_new_state(registry_url, tmp_path, point):
    art = tmp_path / "artifacts"
    reg = open_registry(registry_url, art)
    v1 = reg.register_version("a->b", align.LinearMap(np.eye(8)), source_space="a", target_space="b",
                              method="identity", params={}, alias="prod")
    marker = tmp_path / "reached"
    proc = start_writer(registry_url, art, stop_at=point, marker=marker)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "writer never reached the kill point"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    fresh = open_registry(registry_url, art)  # a new process would see exactly this
    versions = [v.version for v in fresh.list_versions("a->b")]
    if point in POINTS_BEFORE_COMMIT:
        assert versions == [1]
        assert fresh.resolve("a->b@prod").artifact_sha256 == v1.artifact_sha256
    else:
        assert versions == [1, 2]
        assert fresh.resolve("a->b@prod").version == 2
    assert_consistent(fresh)
    # no lock is left behind: the next writer proceeds and gets the next number
    nxt = fresh.register_version("a->b", align.LinearMap(2 * np.eye(8)), source_space="a", target_space="b",
                                 method="identity", params={})
    assert nxt.version == versions[-1] + 1
    # the writer killed between writing and renaming its artifact left one temporary file: verify counts it
    # and --sweep removes it (it matched nothing before: the sweep looked for '*.part', not atomic_write's names)
    assert fresh.verify()["tmp_files"] == (1 if point == "artifact_tmp_written" else 0)
    live = art / "tmp" / ".live.npz.tmp-1-2-abcd"  # a writer still at work (young file): never swept
    live.write_bytes(b"partial")
    fresh.verify(sweep=True)
    assert fresh.verify()["tmp_files"] == (2 if point == "artifact_tmp_written" else 1)  # too young to sweep yet
    old = time.time() - 3600
    for f in (art / "tmp").iterdir():
        if f != live:
            os.utime(f, (old, old))
    fresh.verify(sweep=True)
    assert list((art / "tmp").iterdir()) == [live] and fresh.verify()["tmp_files"] == 1


def test_concurrent_writers_get_distinct_numbers(registry_url, tmp_path):
    art = tmp_path / "artifacts"
    open_registry(registry_url, art)  # create the schema once
    go = tmp_path / "go"
    n_proc, per_proc = 3, 6
    procs = [start_writer(registry_url, art, seed=s + 1, count=per_proc, go=go) for s in range(n_proc)]
    time.sleep(0.5)
    go.write_text("go")
    results = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    all_numbers = [n for r in results for n in r]
    assert sorted(all_numbers) == list(range(1, n_proc * per_proc + 1))  # distinct, none lost
    for r in results:
        assert r == sorted(r)  # each writer sees increasing numbers
    reg = open_registry(registry_url, art)
    versions = reg.list_versions("a->b")
    assert [v.version for v in versions] == list(range(1, n_proc * per_proc + 1))
    assert {(v.random_state, v.params["i"]) for v in versions} == {
        (s + 1, i) for s in range(n_proc) for i in range(per_proc)}
    assert reg.resolve("a->b@prod").version in all_numbers
    assert_consistent(reg)
    with pytest.raises(NotFoundError):
        reg.resolve("a->b:99")
