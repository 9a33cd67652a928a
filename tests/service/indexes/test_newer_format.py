"""An index a newer vecbridge wrote, met by a process of this one still serving it (a rolling upgrade).

``read_meta`` refuses a ``format_version`` beyond :data:`FORMAT_VERSION` ("upgrade every process of this data
dir"), but a process that held the index in memory took that as a damaged generation: it kept answering
searches from the generation it held, with 200s, for as long as it ran (the newer release never writes a
generation it could read), so rows the newer process added were missing and rows it deleted came back. Now
every request of that index is a 503 naming the newer format (also in a process started later, where it was a
404), and ``/readyz`` lists it.
"""

from __future__ import annotations

import json
import os
import time

import httpx
import numpy as np
import pytest
from _api_support import W, settings_for
from _servers import serve_in_thread

from service.api import create_app
from service.errors import http_status
from service.indexes import IndexStore
from service.indexes.errors import NewerFormatError
from service.indexes.persist import FORMAT_VERSION


def _newer_release_writes(folder) -> None:
    """What a newer release's write leaves for this one: the next generation in a format it does not know."""
    meta = json.loads((folder / "meta.json").read_text())
    meta.update(format_version=FORMAT_VERSION + 1, generation=meta["generation"] + 1)
    tmp = folder / ".meta.next"
    tmp.write_text(json.dumps(meta))
    stamp = time.time_ns() + 10**9
    os.utime(tmp, ns=(stamp, stamp))
    os.replace(tmp, folder / "meta.json")


def test_a_serving_process_refuses_an_index_a_newer_release_wrote(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((50, 8)).astype(np.float32)
    app = create_app(settings_for(tmp_path))
    with serve_in_thread(app) as url, httpx.Client(base_url=url, headers=W, timeout=30) as http:
        assert http.post("/v1/spaces", json={"name": "s", "dim": 8}).status_code == 201
        r = http.post("/v1/indexes", json={"name": "docs", "space": "s", "vectors": X.tolist(), "kind": "flat"})
        assert r.status_code == 201, r.text
        search = {"vectors": X[:2].tolist(), "k": 3}
        assert http.post("/v1/indexes/docs/search", json=search).status_code == 200  # in memory now
        _newer_release_writes(tmp_path / "data" / "indexes" / "docs")
        for _ in range(2):  # every request, not only the first
            for method, path, body in (("POST", "/v1/indexes/docs/search", search), ("GET", "/v1/indexes/docs", None),
                                       ("POST", "/v1/indexes/docs/vectors", {"vectors": X[:1].tolist()})):
                r = http.request(method, path, json=body)
                assert r.status_code == 503, (path, r.status_code, r.text)
                msg = r.json()["error"]["message"]
                assert "newer vecbridge" in msg and "upgrade every process" in msg, msg
        errors = http.get("/readyz").json()["checks"]["indexes"]["errors"]
        assert "newer vecbridge" in errors["docs"]
    fresh = IndexStore(tmp_path / "data" / "indexes")  # a process of this release started now: the same 503
    with pytest.raises(NewerFormatError, match="upgrade every process") as exc:
        fresh.get("docs")
    assert http_status(exc.value) == 503
    assert fresh.load_all() == 0 and "newer vecbridge" in fresh.load_errors["docs"]
