"""`vecbridge serve --log-level` (it wins over VECBRIDGE_LOG_LEVEL), and a failed job's log line naming what the job
was (the map's name) and the request that submitted it (QA 4801: the level was settable only through the variable,
and "job failed" gave a job id alone)."""

from __future__ import annotations

import json
import sys
import time

import httpx
import numpy as np
from _api_support import W
from _servers import env_for, start_on_free_port, stop


def _lines(log) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def test_the_log_level_option_wins_over_the_variable_and_a_failed_job_names_its_map_and_request(tmp_path):
    log = tmp_path / "server.log"
    proc, port = start_on_free_port(lambda port: ([sys.executable, "-m", "service.cli", "serve", "--log-level",
                                                   "warning"], {**env_for(tmp_path / "data", port),
                                                                "VECBRIDGE_LOG_LEVEL": "DEBUG"}), log)
    url = f"http://127.0.0.1:{port}"
    try:
        X = np.zeros((64, 4))  # rows with no signal: the fit job fails in its fit stage (DegenerateInputError)
        r = httpx.post(f"{url}/v1/fits", headers=W, timeout=30, json={
            "name": "no-signal", "source_space": "a", "target_space": "b", "method": "procrustes", "paired": True,
            "source": {"vectors": X.tolist()}, "target": {"vectors": X.tolist()}})
        assert r.status_code == 202, r.text
        rid, job_id = r.headers["x-request-id"], r.json()["id"]
        deadline = time.monotonic() + 60
        while (job := httpx.get(f"{url}/v1/jobs/{job_id}", headers=W, timeout=30).json())["state"] != "failed":
            assert time.monotonic() < deadline and job["state"] in ("queued", "running"), job
            time.sleep(0.1)
    finally:
        stop(proc)
    lines = _lines(log)
    assert lines and all(r["level"] in ("WARNING", "ERROR", "CRITICAL") for r in lines), {r["level"] for r in lines}
    failed = [r for r in lines if r["msg"] == "job failed"]
    assert len(failed) == 1, lines
    fields = failed[0]
    assert fields["job_id"] == job_id and "no-signal" in fields["what"] and fields["request_id"] == rid, fields


_SERVING = """
import os, sys, warnings
import tqdm.std
before = warnings.showwarning, vars(tqdm.std.tqdm)["__init__"]
import service.api.app, service.cli, service.logging  # what tests import: no process-wide change at an import
assert (warnings.showwarning, vars(tqdm.std.tqdm)["__init__"]) == before and "TQDM_DISABLE" not in os.environ
from service.logging import configure_logging
configure_logging("INFO", server=SERVER)
from align.exceptions import VecbridgeWarning
from sklearn.exceptions import ConvergenceWarning
from tqdm import tqdm
from tqdm.auto import tqdm as auto_tqdm
warnings.warn("rows unchecked", VecbridgeWarning)
warnings.warn("did not converge", ConvergenceWarning)
for bar in (tqdm(range(3), file=sys.stderr), auto_tqdm(range(3), desc="Converting", file=sys.stderr)):
    for _ in bar:
        pass
"""


def test_a_serving_processes_warnings_are_json_lines_and_it_draws_no_progress_bars(tmp_path):
    """QA: the server log is JSON lines, but Python warnings (VecbridgeWarning, scikit-learn's ConvergenceWarning)
    came as Python's plain two-line text and the LM loader's tqdm bars were drawn into it. A serving process logs
    each warning as one JSON record (logger py.warnings, its category and where) and draws no bar; the CLI (not
    serving) keeps its bars. Each in a process of its own: the change is process-wide, made by serve alone."""
    import subprocess

    def stderr_of(server: bool) -> str:
        env = {k: v for k, v in env_for(tmp_path / "data", 0).items()  # no server: no port
               if not k.startswith("TQDM_") and k != "PYTHONWARNINGS"}
        out = subprocess.run([sys.executable, "-c", _SERVING.replace("SERVER", str(server))], env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stderr

    lines = stderr_of(True).splitlines()
    assert lines and all(line.startswith("{") for line in lines), lines
    records = [json.loads(line) for line in lines]
    assert [(r["logger"], r["level"], r["msg"], r["category"]) for r in records] == [
        ("py.warnings", "WARNING", "rows unchecked", "VecbridgeWarning"),
        ("py.warnings", "WARNING", "did not converge", "ConvergenceWarning")], records
    assert all(r["where"].startswith("<string>:") for r in records), records
    plain = stderr_of(False)
    assert "rows unchecked" in plain and "3/3" in plain and "Converting" in plain, plain  # the CLI's: as before
