"""service.memory.keep_heap: a serving process keeps freed request buffers instead of faulting them in again."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from _servers import ROOT

glibc = pytest.mark.skipif(not (sys.platform.startswith("linux") and os.confstr("CS_GNU_LIBC_VERSION")),
                           reason="mallopt thresholds are glibc's")

# A request's life in miniature: a few ~1.5 MB buffers (joined body, output, block buffer) allocated,
# written and freed together, 40 times; minor page faults counted over the last 30.
_REQUESTS = """
import json, resource, sys
import numpy as np
from service.memory import keep_heap, heap_settings
applied = keep_heap(int(sys.argv[1]))
def request():
    bufs = [np.ones(1024 * 384, np.float32) for _ in range(3)]
    return float(sum(b[::4096].sum() for b in bufs))
for _ in range(10):
    request()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(30):
    request()
print(json.dumps({"faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before,
                  "applied": applied, "settings": heap_settings()}))
"""


def _run(keep_mb: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", _REQUESTS, str(keep_mb)], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


@glibc
def test_kept_heap_stops_page_faults_of_repeated_large_buffers():
    default, kept = _run(0), _run(64)
    assert default["applied"] is None and default["settings"] is None
    assert kept["applied"] == kept["settings"] == {"trim_threshold": 64 << 20, "mmap_threshold": 32 << 20}
    pages = 3 * 1024 * 384 * 4 // 4096  # pages of one request's buffers
    assert default["faults"] > 10 * pages  # glibc's defaults: the heap top goes back to the kernel each time
    assert kept["faults"] < pages  # kept: the same pages serve every request


@glibc
def test_keep_heap_is_idempotent_and_caps_the_mmap_threshold():
    code = ("import json; from service.memory import keep_heap, heap_settings; "
            "a = keep_heap(1024); b = keep_heap(1024); c = keep_heap(0); "
            "print(json.dumps([a, b, c, heap_settings()]))")
    a, b, c, now = json.loads(subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True,
                                             capture_output=True, text=True).stdout)
    assert a == b == now == {"trim_threshold": 1024 << 20, "mmap_threshold": 32 << 20}
    assert c is None  # 0 changes nothing (and does not forget what was set)


def test_keep_heap_refuses_what_a_c_int_cannot_hold():
    from service.memory import MAX_KEEP_MB, keep_heap

    with pytest.raises(ValueError, match="at most 1024"):
        keep_heap(MAX_KEEP_MB + 1)


def test_settings_bound_the_kept_heap():
    from pydantic import ValidationError

    from service.config import Settings

    assert Settings(malloc_keep_mb=0).malloc_keep_mb == 0
    for bad in (-1, 1025):
        with pytest.raises(ValidationError):
            Settings(malloc_keep_mb=bad)


@glibc
def test_heap_env_names_what_keep_heap_sets():
    """For a process started from here (the benchmark's bare server): the same two thresholds as environment
    variables glibc reads at start-up."""
    from service.memory import heap_env

    code = ("import json; from service.memory import keep_heap, heap_env; "
            "print(json.dumps([keep_heap(64), heap_env(64), heap_env(1024)]))")
    applied, env, big = json.loads(subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True,
                                                  capture_output=True, text=True).stdout)
    assert env == {"MALLOC_TRIM_THRESHOLD_": str(applied["trim_threshold"]),
                   "MALLOC_MMAP_THRESHOLD_": str(applied["mmap_threshold"])}
    assert big == {"MALLOC_TRIM_THRESHOLD_": str(1024 << 20), "MALLOC_MMAP_THRESHOLD_": str(32 << 20)}
    assert heap_env(0) == {}
