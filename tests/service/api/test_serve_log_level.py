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
