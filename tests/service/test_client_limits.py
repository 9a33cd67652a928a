"""The Python client's batches obey every limit the service states in ``/v1/info``, not only ``max_batch`` and
``max_body_bytes``.

Before, ``Client`` cut a refused call by ``max_body_bytes`` alone. The service holds JSON bodies on bulk routes
to ``limits.body_bytes_json`` and texts to ``limits.body_bytes_texts`` (4 MiB by default, 16 times less than
``max_body_bytes``), and a search to ``limits.max_hits`` queries x k (100,000 by default, answered 422). So
``embed`` of 5 MB of texts, a 20,000-query search at k=10, or any JSON ``add`` / ``search`` over a lowered
``body_bytes_json`` raised the very 413 / 422 ("send smaller batches") that the client promises to spare its
user. And a call of hundreds of MB was sent whole once, only to be refused (307 MB for a 200k x 384 transform:
half of its 6.7 s on loopback) before the client looked at the limits. Now a call whose body passes 1 MiB, or
whose search passes 10,000 hits, reads the limits first (once per client), and every batch keeps within the
limit of its own body kind and within ``max_hits``. A real server runs here with small limits.
"""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from _clients import both_clients
from _servers import seeded_uvicorn

from service.client import APIConnectionError, Client, PayloadTooLargeError
from service.client_wire import OVERHEAD

WKEY, WONLY = "wkey-456", "wonly-789"
MAX_BODY, JSON_BODY, TEXTS_BODY, MAX_HITS = 2_000_000, OVERHEAD + 200_000, OVERHEAD + 20_000, 1_000
MODEL = "all-MiniLM-L6-v2"  # installed with the test extras; loaded from disk, no download


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    env = {"VECBRIDGE_MAX_BODY_BYTES": str(MAX_BODY),
           "VECBRIDGE_LIMITS": json.dumps({"body_bytes_json": JSON_BODY, "body_bytes_texts": TEXTS_BODY,
                                           "max_hits": MAX_HITS})}
    with seeded_uvicorn(tmp_path_factory.mktemp("client-limits"), env) as (url, (_, _, m)):
        yield url, m


class Recording(httpx.HTTPTransport):
    """The network; ``seen``: ``(method, path, status, body bytes)`` of every request."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str, int, int]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        self.seen.append((request.method, request.url.path, response.status_code, len(request.content)))
        return response


class AsyncRecording(httpx.AsyncHTTPTransport):
    """:class:`Recording` for ``AsyncClient``: ``seen`` holds ``(method, path, body bytes)`` of every request sent."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str, int]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.append((request.method, request.url.path, len(request.content)))
        return await super().handle_async_request(request)


def _rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 16)).astype(np.float32)


def test_json_adds_and_searches_keep_within_body_bytes_json(server):
    url, _ = server
    X, net = _rows(6000, 1), Recording()  # 6000 rows x 88 bytes of base64: 528 kB of JSON, under max_body_bytes
    with Client(url, api_key=WKEY, transport=net) as vb:
        vb.create_index("json-limit", "b")
        assert vb.add("json-limit", X)["ids"] == list(range(6000))
        hits = vb.search("json-limit", X, k=1)["results"]
    assert [h[0]["id"] for h in hits] == list(range(6000))
    bodies = [size for method, _, status, size in net.seen if method == "POST" and status == 200]
    assert len(bodies) >= 6 and max(bodies) <= JSON_BODY  # before: 413 (the client cut by max_body_bytes)


def test_embed_keeps_within_body_bytes_texts(server):
    url, _ = server
    texts = [f"text {i}: " + "a rather long sentence about rivers and engines " * 4 for i in range(500)]  # 103 kB
    net = Recording()
    with Client(url, api_key=WKEY, transport=net) as vb:
        E = vb.embed(texts, MODEL)
        one = vb.embed(texts[7:8], MODEL)
    assert E.shape == (500, 384)
    np.testing.assert_allclose(E[7:8], one, atol=1e-5)  # the batches are joined in order
    sent = [size for _, path, status, size in net.seen if path == "/v1/embeddings" and status == 200]
    assert max(sent) <= TEXTS_BODY and len(sent) >= 3  # before: 413 (the client cut by max_body_bytes)


def test_a_search_over_max_hits_goes_in_batches_within_it(server):
    url, _ = server
    X, net = _rows(2000, 2), Recording()  # 2000 queries x k=6 = 12,000 hits: over 10,000, the limits are read first
    with Client(url, api_key=WKEY, transport=net) as vb:
        vb.create_index("hits-limit", "b", X)
        res = vb.search("hits-limit", X, k=np.int64(6))["results"]  # a numpy int (k from an array) batches too
    assert len(res) == 2000 and [r[0]["id"] for r in res] == list(range(2000))  # before: 422 (limits.max_hits)
    searches = [s for m, p, s, _ in net.seen if p.endswith("/search")]
    assert len(searches) == -(-2000 // (MAX_HITS // 6)) and set(searches) == {200}


def test_a_large_call_reads_the_limits_before_sending_anything_too_large(server):
    url, m = server
    X, net = _rows(40_000, 3), Recording()  # 2.56 MB of float32: over max_body_bytes
    with Client(url, api_key=WKEY, transport=net) as vb:
        Y = vb.transform("a2b", X)
    np.testing.assert_allclose(Y, m.apply(X, output="raw"), atol=1e-5)
    assert net.seen[0][:2] == ("GET", "/v1/info")  # before: the whole 2.56 MB first, answered 413
    assert {s for _, _, s, _ in net.seen} == {200} and max(b for *_, b in net.seen) <= MAX_BODY


def test_a_key_that_cannot_read_the_limits_still_gets_the_413(server):
    url, _ = server
    with Client(url, api_key=WONLY) as vb, pytest.raises(PayloadTooLargeError, match="body_bytes_json"):
        vb.add("json-limit", _rows(20_000, 4))  # /v1/info needs `read`: the service's own refusal, not a 403


def test_deleting_many_ids_goes_in_batches_within_body_bytes_texts(server):
    url, _ = server
    net = Recording()
    with Client(url, api_key=WKEY, transport=net) as vb:
        vb.create_index("deletes", "b")
        vb.add("deletes", _rows(16_000, 5), ids=range(100_000, 116_000))
        got = vb.delete_ids("deletes", range(100_000, 115_000))  # 105 kB of ids: before, one request and a 413
        assert got == {"index": "deletes", "deleted": 15_000, "count": 1_000}
        assert [h[0]["id"] for h in vb.search("deletes", _rows(16_000, 5)[-3:], k=1)["results"]] == [115_997, 115_998,
                                                                                                      115_999]
    assert max(b for _, p, s, b in net.seen if p.endswith("/delete") and s == 200) <= TEXTS_BODY


def test_a_search_over_a_small_max_hits_and_numpy_payloads_fit_their_batches(server):
    """max_hits (1,000 here) below the client's 10,000 read-first threshold: 200 queries x k=10 was a 422, never
    split (with batch_size set too, which skipped reading the limits). Numpy arrays in payloads were sized by
    str() (cut to "[... ]" past 1,000 values): an add that fits in batches went as one body, a 413."""
    url, _ = server
    X = _rows(200, 5)
    for kw in ({}, {"batch_size": 150}):
        net = Recording()
        with Client(url, api_key=WKEY, transport=net, **kw) as vb:
            if not kw:
                vb.create_index("small-hits", "b", X)
            res = vb.search("small-hits", X, k=10)["results"]
        assert [r[0]["id"] for r in res] == list(range(200)), kw
        assert {s for m, p, s, _ in net.seen if p.endswith("/search")} <= {200, 422}
        assert max(b for m, p, s, b in net.seen if p.endswith("/search") and s == 200) > 0
    big = [{"emb": np.random.default_rng(i).standard_normal(2000).astype(np.float32)} for i in range(120)]
    with Client(url, api_key=WKEY) as vb:  # ~39 kB of JSON each: 4.7 MB in all, over max_body_bytes
        vb.create_index("np-payloads", "b")
        assert len(vb.add("np-payloads", _rows(120, 6), payloads=big)["ids"]) == 120


@both_clients
def test_a_body_over_the_limits_is_a_413_for_both_clients_and_sent_at_most_once(server, client_cls, client_kind):
    """The service answers a body over its limit at once and closes the connection: AsyncClient, still sending,
    saw a reset and raised APIConnectionError ("no answer ... after 3 tries") after uploading a fit three times
    (Idempotency-Key: retried), where Client raised the 413. Now a body over max_body_bytes is refused before it is
    sent, and the service reads a body up to max_body_bytes before it answers a route's lower limit."""
    url, _ = server
    X = _rows(40_000, 7)  # 2 x 40,000 x 88 bytes of base64: 7 MB, over max_body_bytes
    net = (Recording if client_kind == "sync" else AsyncRecording)()
    with client_cls(url, api_key=WKEY, transport=net) as vb:
        # a fit is one body: "send smaller batches" could not help it
        with pytest.raises(PayloadTooLargeError, match=f"limit of {MAX_BODY} bytes .*not split into batches: run "
                                                       "it with `vecbridge fit` on files"):
            vb.fit("too-big", "a", "b", X, X, method="procrustes")
        with pytest.raises(PayloadTooLargeError, match="body_bytes_json"):  # 880 kB: over body_bytes_json only
            vb.create_index("too-big", "b", X[:10_000])
    assert [p for m, p, *_ in net.seen if m == "POST"] == ["/v1/indexes"]  # the fit was never sent
    net = (Recording if client_kind == "sync" else AsyncRecording)()
    with (client_cls(url, api_key=WONLY, transport=net) as vb,  # may not read /v1/info: the limit is unknown
          pytest.raises((PayloadTooLargeError, APIConnectionError), match="body_bytes_json|max_body_bytes")):
        vb.fit("too-big", "a", "b", X, X, method="procrustes")
    assert [p for m, p, *_ in net.seen if m == "POST"] == ["/v1/fits"]  # before: three times from AsyncClient
