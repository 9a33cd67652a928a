"""A serving process runs the BLAS and FAISS's OpenMP at ``blas_threads`` (default 1), and gives it back."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
from fastapi.testclient import TestClient

from _api_support import R
from _servers import ROOT, env_for, start, start_on_free_port, stop
from service.api.app import create_app
from service.config import Settings

_DEFAULTS = ("import json, numpy, faiss; from service.threads import native_threads; "
             "print(json.dumps(native_threads()))")


def _serve_info(tmp_path, setting: str | None, extra_env: dict | None = None) -> tuple[dict, dict, dict]:
    def env_at(port: int) -> dict:
        env = env_for(tmp_path / "data", port)
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env.pop(var, None)  # the libraries' own defaults, as a plain `vecbridge serve` gets them
        if setting is not None:
            env["VECBRIDGE_BLAS_THREADS"] = setting
        env.update(extra_env or {})
        return env

    proc, port = start_on_free_port(lambda port: (
        [sys.executable, "-c", "from service.cli import main; main()", "serve", "--port", str(port)], env_at(port)),
        tmp_path / f"serve-{setting}.log")
    env = env_at(port)
    try:
        info = httpx.get(f"http://127.0.0.1:{port}/v1/info", headers=R, timeout=30).json()
    finally:
        stop(proc)
    defaults = json.loads(subprocess.run([sys.executable, "-c", _DEFAULTS], env=env, cwd=ROOT, check=True,
                                         capture_output=True, text=True, timeout=120).stdout)
    return info["native_threads"], defaults, info


def test_serve_runs_native_thread_pools_at_one_by_default(tmp_path):
    threads, _, info = _serve_info(tmp_path, None)
    assert threads["setting"] == 1
    if sys.platform.startswith("linux") and os.confstr("CS_GNU_LIBC_VERSION"):  # glibc: freed request heap kept
        assert info["heap"] == {"setting_mb": 64, "applied": {"trim_threshold": 64 << 20, "mmap_threshold": 32 << 20}}
    assert threads["blas"] and all(n == 1 for n in threads["blas"])  # numpy's OpenBLAS and FAISS's
    assert threads["faiss_omp"] == 1


def test_blas_threads_zero_leaves_the_library_defaults(tmp_path):
    threads, defaults, info = _serve_info(tmp_path, "0", {"VECBRIDGE_MALLOC_KEEP_MB": "0"})
    assert info["heap"] == {"setting_mb": 0, "applied": None}  # and glibc's own heap thresholds
    assert threads["setting"] == 0
    assert max(threads["blas"]) == max(defaults["blas"]) and threads["faiss_omp"] == defaults["faiss_omp"]


# The two checks below run in a fresh interpreter: earlier tests in this process load other native
# libraries (torch, transformers) whose thread settings the limits would otherwise be judged beside.
_IN_PROCESS_APPS = """
import json, sys, threading
from pathlib import Path
from threadpoolctl import threadpool_info
from fastapi.testclient import TestClient
from service.api.app import create_app
from service.config import Settings
from service.threads import limit_native_threads, native_threads, pin_thread, release_native_threads

def process_wide():  # BLAS builds with their own pool; an OpenMP-built one follows the calling thread
    return [i["num_threads"] for i in threadpool_info()
            if i["user_api"] == "blas" and i.get("threading_layer") != "openmp"]

out = {"before": process_wide()}
s = Settings(data_dir=Path(sys.argv[1]) / "d", demo_on_empty=False, auth_disabled=True, blas_threads=1)
with TestClient(create_app(s)) as c1:
    c1.get("/healthz")
    with TestClient(create_app(s.model_copy(update={"data_dir": Path(sys.argv[1]) / "e"}))) as c2:
        c2.get("/healthz")
        out["both"] = process_wide()
    out["first"] = process_wide()
out["after"] = process_wide()

seen = {}
def probe(name, pin):
    if pin:
        pin_thread()
    seen[name] = native_threads()
out["default_omp"] = native_threads()["faiss_omp"]
limit_native_threads(1)
for name, pin in (("pinned", True), ("unpinned", False)):
    t = threading.Thread(target=probe, args=(name, pin))
    t.start()
    t.join()
release_native_threads(1)
out["seen"] = seen
print(json.dumps(out))
"""


def _fresh_process(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VECBRIDGE_")}
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run([sys.executable, "-c", _IN_PROCESS_APPS, str(tmp_path)], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_in_process_apps_limit_while_running_and_restore_when_the_last_one_stops(tmp_path):
    out = _fresh_process(tmp_path)
    assert out["both"] and all(n == 1 for n in out["both"])
    assert all(n == 1 for n in out["first"])  # the first app still runs
    assert out["after"] == out["before"]
    # OpenMP keeps its thread count per thread: a worker thread sees the limit once pinned (what index
    # searches do first); an unpinned thread keeps the library default
    assert out["seen"]["pinned"]["faiss_omp"] == 1 and all(n == 1 for n in out["seen"]["pinned"]["blas"])
    assert out["seen"]["unpinned"]["faiss_omp"] == out["default_omp"]


def test_start_up_objects_are_frozen_out_of_the_collector(tmp_path):
    """After start-up the long-lived objects sit in the permanent generation (a full collection then
    walks only what requests create); stopping the app gives them back."""
    import gc

    s = Settings(data_dir=tmp_path / "d", demo_on_empty=False, auth_disabled=True)
    with TestClient(create_app(s)) as c:
        assert c.get("/healthz").status_code == 200
        assert gc.get_freeze_count() > 10_000
    assert gc.get_freeze_count() == 0
