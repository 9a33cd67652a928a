"""Hardening round 2 (issue 15): one request must never kill, hang or balloon the server.

Every test talks to a real ``vecbridge serve`` on loopback (a subprocess: a FAISS crash fails
the test instead of killing pytest) or, for the stores, runs the risky step in a subprocess.
One test per finding:

1. FAISS index parameters: every illegal value is a 422, the process stays up, and a persisted
   index with illegal parameters refuses to load with a clear error (no crash).
2. The key is checked before the body is read; bodies have per-route limits.
3. Search answers are bounded: ``k <= max_k``, ``queries x k <= max_hits`` (422 beyond).
6. Finite numbers that overflow float32: rows at 1e-25 .. 1e30 are found again; transforms and
   steers never return non-finite numbers (422 instead).
7. Client input that was a 500: unicode digits in versions and X-Vector-Dim, huge dims, deep
   nesting; after any 5xx the answer still has ``x-request-id`` and ``Connection: close``.
8. Ids: ids past 2**62 are refused, explicit ids from 2**61 too, so automatic ids never run out.
9. No lock per unknown index name; names with a trailing newline refused; ``/metrics`` open/key/off;
   tag and description sizes.
10. A body that stalls mid-way is a 408 after ``body_timeout_s`` and its connection is closed; a request head
    not complete within ``header_timeout_s`` closes the connection, and so does a client that stops reading an
    answer for ``send_timeout_s``.
11. Heavy synchronous requests (plans, evaluations) beyond ``max_heavy_requests`` at once are a 429.

``BAD_INPUT_COUNTS`` collects every status seen; the last test prints the matrix figures.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest
from _servers import start_on_free_port

from .helpers import DIM, R, W, Server, populate_data_dir

STATUS_COUNTS: dict[int, int] = {}


def _count(r: httpx.Response) -> httpx.Response:
    STATUS_COUNTS[r.status_code] = STATUS_COUNTS.get(r.status_code, 0) + 1
    return r


def _refused(r: httpx.Response, status: int = 422) -> None:
    _count(r)
    assert r.status_code == status, (r.status_code, r.text[:300])
    assert r.json()["error"]["status"] == status
    assert r.headers.get("x-request-id")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real ``vecbridge serve`` over a populated registry, an index ``ix`` (16-d, space b)."""
    d = tmp_path_factory.mktemp("harden") / "data"
    data = populate_data_dir(d)
    srv = Server(d, env={"VECBRIDGE_MAX_BODY_BYTES": str(8 * 1024 * 1024),
                         "VECBRIDGE_LIMITS__MAX_RESPONSE_BYTES": str(2_000_000),
                         "VECBRIDGE_LIMITS__BODY_BYTES_JSON": str(4 * 1024 * 1024),
                         "VECBRIDGE_MAX_BATCH": "100000"}).start()
    try:
        with srv.client(W) as c:
            r = c.post("/v1/indexes", json={"name": "ix", "space": "b", "vectors": data["Y"][:100].tolist()})
            assert r.status_code == 201, r.text
        yield srv, data
    finally:
        srv.stop()


def _alive(srv: Server) -> None:
    assert srv.proc.poll() is None, f"server died with {srv.proc.returncode}: {srv.log()[-1500:]}"
    assert httpx.get(srv.url + "/healthz", timeout=10).status_code == 200


# --- 1. FAISS parameters ------------------------------------------------------------------------
BAD_INDEX_BODIES = [
    {"kind": "hnsw", "params": {"M": 1}},
    {"kind": "hnsw", "params": {"M": 0}},
    {"kind": "hnsw", "params": {"M": -1}},
    {"kind": "hnsw", "params": {"M": 2**40}},
    {"kind": "hnsw", "params": {"M": "16"}},
    {"kind": "hnsw", "params": {"M": 16.5}},
    {"kind": "hnsw", "params": {"M": True}},
    {"kind": "hnsw", "params": {"M": None}},
    {"kind": "hnsw", "params": {"ef_construction": 0}},
    {"kind": "hnsw", "params": {"ef_search": -5}},
    {"kind": "hnsw", "params": {"efSearch": 10}},
    {"kind": "hnsw", "params": {"M": 1}, "vectors": None, "dim": 16},
    {"kind": "ivf", "params": {"nlist": 1000}},
    {"kind": "ivf", "params": {"nlist": 0}},
    {"kind": "ivf", "params": {"nlist": 4, "nprobe": 5}},
    {"kind": "ivf", "params": {"nprobe": 0}},
    {"kind": "flat", "params": {"M": 16}},
    {"kind": "flat", "random_state": -1},
    {"kind": "ivf", "random_state": -1},
    {"kind": "ivf", "random_state": 2**31},
    {"kind": "ivf", "random_state": 2**70},
    {"kind": "ivf", "params": {"random_state": -3}},
    {"kind": "hnsw", "params": {"M": [16]}},
    {"kind": "hnsw", "params": ["M", 16]},
    {"kind": "annoy"},
]


def test_index_parameters_are_refused_before_faiss(server):
    srv, data = server
    Y = data["Y"][:60].tolist()
    with srv.client(W) as c:
        for i, extra in enumerate(BAD_INDEX_BODIES):
            body = {"name": f"bad{i}", "space": "b", "vectors": Y, **extra}
            if body.get("vectors") is None:
                body.pop("vectors")
            _refused(c.post("/v1/indexes", json=body))
            _alive(srv)
        # legal neighbours of the bad values work, and adding to them works
        for i, (kind, params) in enumerate([("hnsw", {"M": 2}), ("hnsw", {"M": 256, "ef_search": 1}),
                                             ("ivf", {"nlist": 60, "nprobe": 60})]):
            r = _count(c.post("/v1/indexes", json={"name": f"ok{i}", "space": "b", "vectors": Y, "kind": kind,
                                                   "params": params}))
            assert r.status_code == 201, r.text
            assert _count(c.post(f"/v1/indexes/ok{i}/vectors", json={"vectors": Y[:3]})).status_code == 200
            hits = c.post(f"/v1/indexes/ok{i}/search", json={"vectors": Y[:1], "k": 1, "exact": True}).json()
            assert hits["results"][0][0]["score"] > 0.99
    _alive(srv)


_LOAD_BAD_INDEX = r"""
import json, sys
from pathlib import Path
from service.indexes import IndexStore, IndexNotFoundError
store = IndexStore(Path(sys.argv[1]))
try:
    store.get(sys.argv[2])
except IndexNotFoundError as exc:
    print("REFUSED", exc)
    sys.exit(0)
print("LOADED")
sys.exit(1)
"""


@pytest.mark.parametrize("params", [{"M": 1, "ef_construction": 80, "ef_search": 64},
                                    {"M": 0, "ef_construction": 80, "ef_search": 64},
                                    {"M": "x", "ef_construction": 80, "ef_search": 64}])
def test_persisted_bad_index_refuses_to_load(tmp_path, params):
    """An index whose meta names parameters FAISS would crash on is refused at load, in a subprocess."""
    from service.indexes import IndexStore

    store = IndexStore(tmp_path / "ix")
    X = np.random.default_rng(0).standard_normal((30, 8)).astype(np.float32)
    store.create("h", "s", X, kind="hnsw")
    meta_path = tmp_path / "ix" / "h" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["params"] = {**params, "random_state": 0}
    meta_path.write_text(json.dumps(meta))
    p = subprocess.run([sys.executable, "-c", _LOAD_BAD_INDEX, str(tmp_path / "ix"), "h"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr[-2000:])
    assert "REFUSED" in p.stdout and "index parameter M" in p.stdout


# --- 2. key before body, per-route body limits ---------------------------------------------------
def test_key_is_checked_before_the_body_is_read(server):
    srv, _ = server
    big = b'{"name": "x", "dim": 3, "description": "' + b"a" * (6 * 1024 * 1024) + b'"}'
    routes = [("POST", "/v1/spaces"), ("POST", "/v1/embeddings"), ("POST", "/v1/indexes/ix/delete"),
              ("PUT", "/v1/maps/a2b/aliases/x"), ("PUT", "/v1/maps/a2b/versions/1/tags/t"),
              ("POST", "/v1/indexes/ix/search"), ("POST", "/v1/maps/a2b/transform")]
    rss0 = srv.rss_kib()
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        for method, path in routes:
            t0 = time.perf_counter()
            r = c.request(method, path, content=big, headers={"content-type": "application/json"})
            _refused(r, 401)
            assert time.perf_counter() - t0 < 5
            # a read key on a write route: 403, also before the body
            if path in ("/v1/spaces", "/v1/indexes/ix/delete"):
                _refused(c.request(method, path, content=big, headers={**R, "content-type": "application/json"}), 403)
        # with the right key, the small routes refuse a 6 MB body by size (413), not after parsing it
        for method, path in routes[:5]:
            _refused(c.request(method, path, content=big, headers={**W, "content-type": "application/json"}), 413)
    assert srv.rss_kib() - rss0 < 64 * 1024, "refused bodies must not be buffered"
    # bulk routes: JSON up to limits.body_bytes_json (4 MB here), binary bodies up to max_body_bytes (8 MB)
    X = np.ones((80_000, DIM), np.float32)  # 5.1 MB
    with srv.client(R) as c:
        _refused(c.post("/v1/maps/a2b/transform", json={"vectors_b64": base64.b64encode(X.tobytes()).decode(),
                                                        "dim": DIM}), 413)
        r = _count(c.post("/v1/maps/a2b/transform?encoding_format=base64", content=X.tobytes(),
                          headers={"content-type": "application/octet-stream"}))
        assert r.status_code == 200 and len(r.content) == X.nbytes
    _alive(srv)


def test_a_body_refused_by_size_is_read_only_from_a_keyed_client_that_sends_it(server):
    """A body over its route's limit (but one ``max_body_bytes`` takes) is read before the 413 so that a client
    still sending reads the answer, not a reset -- but only on a route whose key was checked, and not when the
    client waits for ``100 Continue``: reading then asked curl for its 20 MB body, and an unmatched path (no key)
    made the server read up to max_body_bytes for anyone. Both now answer the 413 at once, body unread."""
    import socket

    srv, _ = server
    n = 6 * 1024 * 1024  # over body_bytes_json (4 MB), under max_body_bytes (8 MB)
    for path, extra in (("/v1/nothing-here", b""), ("/v1/spaces", b"Expect: 100-continue\r\n"),
                        ("/v1/nothing-here", b"Expect: 100-continue\r\n")):
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Authorization: Bearer " + W["Authorization"].split()[1].encode() + b"\r\n" + extra
                      + f"Content-Length: {n}\r\n\r\n".encode())  # headers only: the body never comes
            t0 = time.perf_counter()
            first = _answer(s).split(b"\r\n", 1)[0]
            assert first.startswith(b"HTTP/1.1 413"), (path, extra, first)  # not "100 Continue", not a wait
            assert time.perf_counter() - t0 < 5, (path, extra)
    _alive(srv)


def test_large_bodies_are_decoded_and_encoded_in_blocks(monkeypatch):
    """Blocked base64 / JSON helpers (they let the event loop run) give the same bytes and the same refusals."""
    from service.api import codec
    from service.api.responses import dumps, dumps_blocks

    X = np.random.default_rng(0).standard_normal((20_000, 64)).astype(np.float32)
    monkeypatch.setattr(codec, "_B64_BLOCK", 1 << 16)  # 5 MB of rows: ~100 blocks
    text = codec.b64_encode(X)
    assert text == base64.b64encode(X.tobytes()).decode()
    assert np.array_equal(codec._b64_matrix(text, 64, name="vectors"), X)
    with pytest.raises(Exception, match="not valid base64"):  # a bad character in a later block
        codec._b64_matrix(text[:300_001] + "*" + text[300_002:], 64, name="vectors")
    content = {"map": "m", "vectors": X, "shape": [20_000, 64]}
    assert dumps_blocks(content) == dumps(content)
    rows = X.tolist()
    assert np.array_equal(codec.vectors_from_json({"vectors": rows}, dim=64, max_batch=10**6), X)
    rows[9000] = ["1.5"] * 64  # strings stay refused, also past the first block
    with pytest.raises(Exception, match="numeric"):
        codec.vectors_from_json({"vectors": rows}, dim=64, max_batch=10**6)
    rows[9000] = [1.0] * 63
    with pytest.raises(Exception):
        codec.vectors_from_json({"vectors": rows}, dim=64, max_batch=10**6)


# --- 3. bounded answers --------------------------------------------------------------------------
def test_search_answer_is_bounded(server):
    srv, data = server
    Y = data["Y"]
    with srv.client(R) as c:
        _refused(c.post("/v1/indexes/ix/search", json={"vectors": Y[:1].tolist(), "k": 1001}))
        _refused(c.post("/v1/indexes/ix/search", json={"vectors": Y[:10].tolist(), "k": 10_001}))
        q = np.tile(Y[:1], (400, 1))  # 400 x 1000 = 400,000 hits > max_hits
        _refused(c.post("/v1/indexes/ix/search", json={"vectors": q.tolist(), "k": 1000}))
        ok = _count(c.post("/v1/indexes/ix/search", json={"vectors": q[:100].tolist(), "k": 1000}))
        assert ok.status_code == 200 and len(ok.json()["results"]) == 100
    with srv.client(W) as c:  # payloads make hits large: the answer's bytes are capped too (2 MB here)
        r = _count(c.post("/v1/indexes", json={"name": "fat", "space": "b", "vectors": Y[:100].tolist(),
                                               "payloads": ["p" * 10_000] * 100}))
        assert r.status_code == 201
        _refused(c.post("/v1/indexes/fat/search", json={"vectors": Y[:20].tolist(), "k": 100}))
        r = _count(c.post("/v1/indexes/fat/search", json={"vectors": Y[:20].tolist(), "k": 100,
                                                           "include_payloads": False}))
        assert r.status_code == 200 and len(r.content) < 2_000_000
    _alive(srv)


# --- 6. float32 extremes -------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [1e-25, 1e-12, 1e18, 1e20, 1e30])
def test_extreme_rows_are_findable_or_refused(server, scale):
    srv, data = server
    Y = data["Y"][200:210]
    rows = (Y * np.float32(scale)).astype(np.float32)
    name = f"ext{int(np.log10(scale)) + 40}"
    with srv.client(W) as c:
        r = _count(c.post("/v1/indexes", json={"name": name, "space": "b", "vectors": data["Y"][:50].tolist()}))
        assert r.status_code == 201
        r = _count(c.post(f"/v1/indexes/{name}/vectors", json={"vectors": rows.tolist()}))
        assert r.status_code == 200, r.text
        ids = r.json()["ids"]
        # every acknowledged row is found again, by its unscaled and its scaled self
        for q in (Y, rows):
            hits = _count(c.post(f"/v1/indexes/{name}/search", json={"vectors": q.tolist(), "k": 1})).json()
            assert [h[0]["id"] for h in hits["results"]] == ids
            assert all(0.99 < h[0]["score"] <= 1.0001 for h in hits["results"])
        # ip metric: rows that overflow q.x are refused, not stored unfindable
        r = _count(c.post("/v1/indexes", json={"name": name + "ip", "space": "b", "metric": "ip",
                                               "vectors": rows.tolist()}))
        if scale > 1e19:
            _refused(r)
        else:
            assert r.status_code == 201


def test_transform_and_steer_never_return_non_finite(server):
    srv, data = server
    X = data["X"][:4]
    with srv.client(W) as c:
        for scale in (1e-30, 1e20, 3e38):
            rows = np.clip(X / np.abs(X).max() * scale, -3.4e38, 3.4e38).astype(np.float32)
            r = _count(c.post("/v1/maps/a2b/transform", json={"vectors": rows.tolist()}))
            assert r.status_code == 200, r.text
            out = np.asarray(r.json()["vectors"], dtype=np.float64)
            ref = np.asarray(c.post("/v1/maps/a2b/transform", json={"vectors": X.tolist()}).json()["vectors"])
            assert np.isfinite(out).all() and np.allclose(out, ref, atol=1e-4)
            # binary answers too
            r = _count(c.post("/v1/maps/a2b/transform", content=rows.tobytes(),
                              headers={"content-type": "application/octet-stream"}))
            assert r.status_code == 200 and np.isfinite(np.frombuffer(r.content, "<f4")).all()
        # a steer strength that overflows float32: 422, not scores of 0 with arbitrary ids
        Y = data["Y"][:3]
        _refused(c.post("/v1/steers/shift/apply", json={"vectors": Y.tolist(), "eps": 1e30 * 1e10}))
        r = _count(c.post("/v1/indexes/ix/search", json={"vectors": Y.tolist(), "k": 3, "steers": {"shift": 1e30}}))
        assert r.status_code in (200, 422), r.text
        if r.status_code == 200:  # finite: the steered direction is searched exactly
            assert all(len(h) == 3 and all(np.isfinite(x["score"]) for x in h) for h in r.json()["results"])
        _refused(c.post("/v1/indexes/ix/search", json={"vectors": Y.tolist(), "k": 3, "steers": {"shift": 3e38}}))
        # huge finite queries rank like their unit versions
        big = (Y * np.float32(1e25)).astype(np.float32)
        a = c.post("/v1/indexes/ix/search", json={"vectors": big.tolist(), "k": 5}).json()["results"]
        b = c.post("/v1/indexes/ix/search", json={"vectors": Y.tolist(), "k": 5}).json()["results"]
        assert [[h["id"] for h in row] for row in a] == [[h["id"] for h in row] for row in b]
    _alive(srv)


# --- 7. client input that was a 500 --------------------------------------------------------------
def test_strict_numbers_and_shapes(server):
    srv, _ = server
    one = np.zeros((1, DIM), np.float32).tobytes()
    octet = {"content-type": "application/octet-stream"}
    with srv.client(W) as c:
        for ref in ("a2b:²", "a2b:２", "a2b:٣", "a2b:1 ", "a2b:" + "9" * 40, "a2b:0"):
            _refused(c.get(f"/v1/maps/{ref}"))
            _refused(c.post(f"/v1/maps/{ref}/transform", json={"vectors": [[0.0] * DIM]}))
        for hdr in ("²", "２", "1" * 5000, "-16", "16.0", "0", str(2**70)):
            _refused(c.post("/v1/maps/a2b/transform", content=one, headers={**octet, "X-Vector-Dim": hdr.encode()}))
        for q in ("1e30", str(10**30), "0", "-1", "²"):
            _refused(c.post(f"/v1/maps/a2b/transform?dim={q}", content=b"", headers=octet))
        _refused(c.post("/v1/maps/a2b/transform", content=b"", headers=octet))
        _refused(c.post("/v1/spaces", json={"name": "huge", "dim": 2**70}))
        _refused(c.post("/v1/spaces", json={"name": "huge", "dim": 2**62}))
        _refused(c.post("/v1/indexes", json={"name": "huge", "space": "b", "dim": 2**62}))
        _refused(c.post("/v1/indexes", json={"name": "huge", "space": "b", "vectors_b64": "AAAA", "dim": 2**62}))
        deep = "[" * 1000 + "1" + "]" * 1000
        row = json.dumps([[0.5] * DIM])
        for path, body in (("/v1/indexes", f'{{"name": "deep", "space": "b", "vectors": {row}, "payloads": [{deep}]}}'),
                           ("/v1/indexes/ix/vectors", f'{{"vectors": {row}, "payloads": [{{"a": {deep}}}]}}'),
                           ("/v1/maps/a2b/versions/1/tags/deep", f'{{"value": {deep}}}'),
                           ("/v1/spaces", f'{{"name": "deep", "dim": 3, "description": {deep}}}')):
            method = "PUT" if "/tags/" in path else "POST"
            r = _count(c.request(method, path, content=body, headers={"content-type": "application/json"}))
            assert 400 <= r.status_code < 500, (path, r.status_code, r.text[:200])
        nested = {"value": json.loads("[" * 40 + "]" * 40)}
        _refused(c.put("/v1/maps/a2b/versions/1/tags/deep", json=nested))
        # counts are JSON integers (4.0 is 4, not 4.5): `true` was read as 1 (one result, silently), "4" as 4
        q = {"vectors": [[0.5] * DIM]}
        for extra in ({"k": True}, {"k": "4"}, {"k": 4.5}, {"csls": True, "csls_k": True}, {"nprobe": "2"},
                      {"ef_search": False}, {"dim": True}):
            _refused(c.post("/v1/indexes/ix/search", json={**q, **extra}))
        _refused(c.post("/v1/spaces", json={"name": "booldim", "dim": True}))
        _refused(c.put("/v1/maps/a2b/aliases/boolv", json={"version": True}))
        # and reals are JSON numbers: "nan" and "inf" were read as NaN and Inf, true as 1.0
        for extra in ({"csls": True, "csls_weight": "nan"}, {"csls": True, "csls_weight": True},
                      {"steers": {"shift": "inf"}}, {"steers": {"shift": True}}):
            _refused(c.post("/v1/indexes/ix/search", json={**q, **extra}))
        for eps in ("nan", "-inf", True):
            _refused(c.post("/v1/steers/shift/apply", json={"vectors": [[0.5] * DIM], "eps": eps}))
        r = c.post("/v1/steers/shift/apply", json={"vectors": [[0.5] * DIM], "eps": 1})
        assert r.status_code == 200, r.text[:300]  # an integer is a real number
        _refused(c.post("/v1/indexes", json={"name": "boolseed", "space": "b", "kind": "ivf", "random_state": True,
                                             "vectors": [[0.5] * DIM] * 8}))
        _refused(c.post("/v1/maps/a2b/transform", json={"vectors": [[0.0] * DIM], "dim": str(DIM)}))
        r = c.post("/v1/indexes/ix/search", json={**q, "k": 4})
        assert r.status_code == 200 and len(r.json()["results"][0]) == 4, r.text[:300]
    _alive(srv)


def test_5xx_keeps_request_id_and_closes_the_connection(tmp_path):
    """An unexpected error (here: the registry's database file replaced by garbage) is a 500 with
    ``x-request-id`` and ``Connection: close`` on real HTTP."""
    d = tmp_path / "data"
    app_code = r"""
import sys, uvicorn
from fastapi import APIRouter
from service.api import create_app
from service.config import Settings
from pathlib import Path
app = create_app(Settings(data_dir=Path(sys.argv[1]), auth_disabled=True, demo_on_empty=False, log_level="ERROR"))
boom = APIRouter()
@boom.get("/boom")
async def _boom():
    raise RuntimeError("unexpected")
@boom.get("/boom-sync")
def _boom_sync():
    raise KeyError("unexpected")
app.include_router(boom)
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="error")
"""
    proc, port = start_on_free_port(lambda port: ([sys.executable, "-c", app_code, str(d), str(port)],
                                                  dict(os.environ)), tmp_path / "server.log")  # /healthz answers
    try:
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, timeout=10) as c:
            for path in ("/boom", "/boom-sync"):
                r = c.get(path, headers={"x-request-id": "rid-123"})
                assert r.status_code == 500
                assert r.headers["x-request-id"] == "rid-123"
                assert r.headers["connection"] == "close"
                assert r.json()["error"]["message"] == "internal error (request id rid-123)"
                assert "Traceback" not in r.text
            assert c.get("/healthz").status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_client_that_goes_away_mid_body_is_no_server_error(server):
    """A client that closes the connection before its body is complete (fast path: small Content-Length; the
    route: a large one, or chunked) is a 499 in the metrics and logs no error, never a 500 with a traceback."""
    import socket

    srv, _ = server
    head = (f"POST /v1/maps/a2b/transform HTTP/1.1\r\nHost: x\r\nAuthorization: {W['Authorization']}\r\n"
            f"Content-Type: application/octet-stream\r\n")
    port = int(srv.url.rsplit(":", 1)[1])
    for framing in ("Content-Length: 1536\r\n", "Content-Length: 4000000\r\n", "Transfer-Encoding: chunked\r\n"):
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall((head + framing + "\r\n").encode() + (b"ff\r\n" if "chunked" in framing else b"") + b"\0" * 64)
            time.sleep(0.3)
    t0 = time.monotonic()
    with srv.client(R) as c:
        while True:  # the server notices a client gone on its own time (seconds on a loaded machine)
            counts = [line for line in c.get("/metrics").text.splitlines()
                      if line.startswith("vecbridge_request_duration_seconds_count") and "/transform" in line]
            if [line for line in counts if 'status="499"' in line] or time.monotonic() - t0 > 30:
                break
            time.sleep(0.05)
    assert not [line for line in counts if 'status="500"' in line], counts
    assert [line for line in counts if 'status="499"' in line], counts
    assert "request failed" not in srv.log()
    _alive(srv)


def _answer(s) -> bytes:
    """Everything the server sends on socket ``s`` until it closes the connection (10 s at most)."""
    s.settimeout(10)
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def test_a_stalled_request_is_refused_and_frees_the_connection(tmp_path):
    """A client that stops sending its body mid-way gets a 408 after ``body_timeout_s`` of silence and the server
    closes the connection (before: it was held, with the bytes buffered so far, until the client went away): the
    fast path's own body read, a route's, and a chunked body. A slow but steady body (a message every 0.4 s
    under a 1.5 s timeout, 2 s in all) is answered as usual: the bound is on silence, not on the whole upload."""
    import socket

    data = populate_data_dir(tmp_path / "data")
    srv = Server(tmp_path / "data", env={"VECBRIDGE_BODY_TIMEOUT_S": "1.5", "VECBRIDGE_HEADER_TIMEOUT_S": "1.5",
                                         "VECBRIDGE_SEND_TIMEOUT_S": "1.5",
                                         "VECBRIDGE_BODY_MIN_RATE_BYTES_S": "64"}).start()
    port = int(srv.url.rsplit(":", 1)[1])
    auth = f"Authorization: {W['Authorization']}\r\n"
    stalls = [("POST /v1/maps/a2b/transform", "application/octet-stream", "Content-Length: 1536\r\n", b"\0" * 64),
              ("POST /v1/indexes", "application/json", "Content-Length: 100000\r\n", b'{"name": "ix2", '),
              ("POST /v1/maps/a2b/transform", "application/octet-stream", "Transfer-Encoding: chunked\r\n",
               b"600\r\n" + b"\0" * 64)]
    try:
        for line, ctype, framing, part in stalls:
            with socket.create_connection(("127.0.0.1", port)) as s:
                t0 = time.monotonic()
                s.sendall(f"{line} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: {ctype}\r\n{framing}\r\n".encode()
                          + part)
                answer = _answer(s)
                waited = time.monotonic() - t0
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408"), (line, framing, answer[:300])
            assert b"connection: close" in head.lower(), head
            err = json.loads(body)["error"]
            assert err["type"] == "RequestTimeoutError" and err["status"] == 408, err
            assert "body_timeout_s" in err["message"], err
            assert 1.4 < waited < 8, (line, framing, waited)
        x = np.ascontiguousarray(data["X"][:4], dtype="<f4").tobytes()
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(f"POST /v1/maps/a2b/transform HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: "
                      f"application/octet-stream\r\nContent-Length: {len(x)}\r\nConnection: close\r\n\r\n".encode())
            for i in range(0, len(x), len(x) // 5 + 1):
                time.sleep(0.4)
                s.sendall(x[i:i + len(x) // 5 + 1])
            head = _answer(s).partition(b"\r\n\r\n")[0]
        assert head.startswith(b"HTTP/1.1 200"), head
        with srv.client(R) as c:
            metrics = c.get("/metrics").text
        assert [m for m in metrics.splitlines() if m.startswith("vecbridge_request_duration_seconds_count")
                and 'status="408"' in m], metrics[-2000:]
        assert "request failed" not in srv.log()
        # the request head has its own deadline (header_timeout_s, SlowClientProtocol): a connection that sends
        # nothing, a head sent a byte at a time, and the next head on a kept-alive connection; these were held
        # for ever, before any key check
        get = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        for first, then in ((b"", b""), (b"G", b"ET /healthz HTTP/1.1\r\nHo"), (get, b"GET /hea")):
            with socket.create_connection(("127.0.0.1", port)) as s:
                t0 = time.monotonic()
                s.sendall(first)
                time.sleep(0.5)
                s.sendall(then)
                answer = _answer(s)
                waited = time.monotonic() - t0
            assert answer.count(b"HTTP/1.1 200") == (1 if first == get else 0), answer[:300]
            assert 1.4 < waited < 8, (first, then, waited)
        with socket.create_connection(("127.0.0.1", port)) as s:  # a head that takes a while but comes whole
            for part in (b"GET /healthz HTTP/1.1\r\n", b"Host: x\r\n", b"Connection: close\r\n\r\n"):
                s.sendall(part)
                time.sleep(0.3)
            assert _answer(s).startswith(b"HTTP/1.1 200")
        # a head's size is bounded (httptools kept 200 MB of headers, and the memory): past 1 MiB, 431 and close
        with socket.create_connection(("127.0.0.1", port)) as s:
            try:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (3 << 20) + b"\r\n\r\n")
                answer = _answer(s)
            except (ConnectionResetError, BrokenPipeError):  # closed while the rest was still being sent
                answer = b""
        assert not answer.startswith(b"HTTP/1.1 200") and (not answer or answer.startswith(b"HTTP/1.1 431")), answer
        with socket.create_connection(("127.0.0.1", port)) as s:  # 60 KB of headers (big cookies) are fine
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nCookie: " + b"c" * 60_000 + b"\r\nConnection: close"
                      b"\r\n\r\n")
            assert _answer(s).startswith(b"HTTP/1.1 200")
        # a client that stops reading an answer larger than the connection's buffers (12 MB of JSON) is dropped
        # after send_timeout_s and the unsent part freed; it was waited for, for ever, the answer held in memory
        rows = np.random.default_rng(0).standard_normal((65536, DIM)).astype("<f4").tobytes()
        head = (f"POST /v1/maps/a2b/transform HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/octet-stream"
                f"\r\nAccept: application/json\r\nContent-Length: {len(rows)}\r\n\r\n").encode()
        with srv.client(R) as c:
            whole = len(c.post("/v1/maps/a2b/transform", content=rows,
                               headers={"content-type": "application/octet-stream", "accept": "application/json"}
                               ).content)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", port))
            s.sendall(head + rows)
            time.sleep(5)  # not reading
            try:
                got = len(_answer(s))
            except ConnectionResetError:
                got = 0
        assert got < whole, (got, whole)
        _alive(srv)
    finally:
        srv.stop()


def test_a_trickled_body_is_cut_and_connections_are_bounded(tmp_path):
    """A body sent a byte just inside each ``body_timeout_s`` was never cut (the timeout measured silence only):
    20,000 such connections took every file descriptor and /healthz failed. Once a body has been sent for
    ``body_timeout_s``, an average rate below ``body_min_rate_bytes_s`` is a 408 and the connection closed (the
    route's read and the drain of a body over a route's limit); beyond ``max_connections`` (uvicorn's
    ``limit_concurrency``) a request is a 503, and the service answers again once connections close."""
    import socket

    populate_data_dir(tmp_path / "data")
    srv = Server(tmp_path / "data", env={"VECBRIDGE_BODY_TIMEOUT_S": "1", "VECBRIDGE_BODY_MIN_RATE_BYTES_S": "1000",
                                         "VECBRIDGE_MAX_CONNECTIONS": "12"}).start()
    port = int(srv.url.rsplit(":", 1)[1])
    auth = f"Authorization: {W['Authorization']}\r\n"
    try:
        for line, ctype, size in (("POST /v1/maps/a2b/transform", "application/octet-stream", 1536),
                                  ("POST /v1/indexes", "application/json", 100_000),
                                  ("POST /v1/spaces", "application/json", 1 << 20)):  # over its limit: drained
            with socket.create_connection(("127.0.0.1", port)) as s:
                t0 = time.monotonic()
                s.sendall(f"{line} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: {ctype}\r\n"
                          f"Content-Length: {size}\r\n\r\n".encode())
                s.settimeout(0.3)
                answer = b""
                while time.monotonic() - t0 < 6:  # a byte every 0.3 s: never silent for body_timeout_s
                    try:
                        s.sendall(b"{")
                        chunk = s.recv(65536)
                    except TimeoutError:
                        continue
                    except (BrokenPipeError, ConnectionResetError):
                        break
                    answer += chunk
                    if not chunk:
                        break
                waited = time.monotonic() - t0
            head, _, body = answer.partition(b"\r\n\r\n")
            assert waited < 4, (line, waited, answer[:300])  # cut after ~1 s; before: held for ever
            if size == 1 << 20:  # the 413 is sent once the drain gives up
                assert head.startswith(b"HTTP/1.1 413"), answer[:300]
                continue
            assert head.startswith(b"HTTP/1.1 408") and b"connection: close" in head.lower(), answer[:300]
            err = json.loads(body)["error"]
            assert err["type"] == "RequestTimeoutError" and "body_min_rate_bytes_s" in err["message"], err
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(12)]
        try:
            time.sleep(0.3)
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                assert _answer(s).startswith(b"HTTP/1.1 503")
        finally:
            for s in held:
                s.close()
        time.sleep(0.3)
        _alive(srv)
    finally:
        srv.stop()


def test_heavy_synchronous_requests_beyond_the_limit_are_a_429_not_a_pileup(tmp_path):
    """Plans and evaluations compute for seconds in the thread pool: unbounded, 45 concurrent plans held it and
    starved the event loop (/healthz 8 s, measured). Beyond ``max_heavy_requests`` running at once they are a 429
    with Retry-After; a slot is given back however its request ends (a 422 too)."""
    populate_data_dir(tmp_path / "data")
    srv = Server(tmp_path / "data", env={"VECBRIDGE_MAX_HEAVY_REQUESTS": "1"}).start()
    rng = np.random.default_rng(0)
    old = rng.standard_normal((6000, DIM)).astype(np.float32)
    new = old @ np.linalg.qr(rng.standard_normal((DIM, DIM)))[0].astype(np.float32)
    body = {"old": {"vectors": old.tolist()}, "probe_source": {"vectors": old[:400].tolist()},
            "probe_target": {"vectors": new[:400].tolist()}}
    try:
        with srv.client(R) as c:
            _refused(c.post("/v1/plans", json={**body, "probe_source": {"vectors": old[:400, :3].tolist()}}))
            answers: list = []
            raw = json.dumps(body).encode()
            start = threading.Barrier(8)

            def plan():
                with srv.client(R) as own:
                    start.wait(timeout=60)  # all at once: each plan computes for ~0.1-1 s
                    answers.append(own.post("/v1/plans", content=raw, headers={"content-type": "application/json"}))

            threads = [threading.Thread(target=plan) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert not [t for t in threads if t.is_alive()], "a plan still runs after 120 s"
            codes = sorted(r.status_code for r in answers)
            assert codes[0] == 200 and set(codes) == {200, 429}, codes
            busy = next(r for r in answers if r.status_code == 429)
            _refused(busy, 429)
            assert busy.headers.get("retry-after") and "max_heavy_requests=1" in busy.json()["error"]["message"]
            assert c.post("/v1/plans", json=body).status_code == 200  # every slot was given back
        _alive(srv)
    finally:
        srv.stop()


# --- 8. ids --------------------------------------------------------------------------------------
def test_ids_never_overflow(server):
    srv, data = server
    row = data["Y"][:1].tolist()
    with srv.client(W) as c:
        assert _count(c.post("/v1/indexes", json={"name": "ids", "space": "b", "vectors": row})).status_code == 201
        for bad in (2**63 - 1, 2**63, 2**64, 2**62, -1):
            _refused(c.post("/v1/indexes/ids/vectors", json={"vectors": row, "ids": [bad]}))
            r = _count(c.post("/v1/indexes/ids/delete", json={"ids": [bad]}))
            assert r.status_code == 422
        # explicit ids stop at 2**61 (the automatic ids' room); an id up to 2**62 - 1 is still one to delete
        _refused(c.post("/v1/indexes/ids/vectors", json={"vectors": row, "ids": [2**61]}))
        assert _count(c.post("/v1/indexes/ids/delete", json={"ids": [2**62 - 1]})).status_code == 200
        r = _count(c.post("/v1/indexes/ids/vectors", json={"vectors": row, "ids": [2**61 - 1]}))
        assert r.status_code == 200
        r = _count(c.post("/v1/indexes/ids/vectors", json={"vectors": row}))
        assert r.status_code == 200 and r.json()["ids"] == [2**61], r.text  # one past the largest id ever held
        assert _count(c.post("/v1/indexes/ids/vectors", json={"vectors": row, "ids": [7]})).status_code == 200
    srv.stop()
    srv.start()
    with srv.client(W) as c:
        assert c.get("/v1/indexes/ids").json()["count"] == 4
        r = _count(c.post("/v1/indexes/ids/vectors", json={"vectors": row}))
        assert r.status_code == 200 and r.json()["ids"] == [2**61 + 1], r.text
    _alive(srv)


# --- 9. smaller ----------------------------------------------------------------------------------
def test_unknown_index_names_hold_no_memory(tmp_path):
    from service.indexes import IndexNotFoundError, IndexStore

    store = IndexStore(tmp_path)
    store.load_all()
    for i in range(20_000):
        with pytest.raises(IndexNotFoundError):
            store.get(f"nope-{i}")
    assert not store._load_locks and not store._indexes and not store._failed


def test_names_sizes_and_metrics_access(server, tmp_path):
    srv, data = server
    with srv.client(W) as c:
        _refused(c.post("/v1/indexes", json={"name": "nl\n", "space": "b", "vectors": data["Y"][:2].tolist()}))
        _refused(c.get("/v1/indexes/ix%0A"), 404)
        _refused(c.post("/v1/spaces", json={"name": "nl\n", "dim": 3}))
        _refused(c.post("/v1/spaces", json={"name": "desc", "dim": 3, "description": "x" * 5000}))
        _refused(c.put("/v1/maps/a2b/versions/1/tags/big", json={"value": "x" * 20_000}))
        _refused(c.put("/v1/maps/a2b/versions/1/tags/big", json={"value": "x" * 5_000_000}), 413)
        assert _count(c.put("/v1/maps/a2b/versions/1/tags/ok", json={"value": "x" * 1000})).status_code == 200
        _refused(c.post("/v1/indexes", json={"name": "d", "space": "b", "dim": 16, "description": "x" * 5000}))
        # metrics: a read key by default
        assert httpx.get(srv.url + "/metrics").status_code == 401
        assert c.get("/metrics").status_code == 200
    for access, anonymous in (("open", 200), ("off", 404)):
        with Server(tmp_path / access, env={"VECBRIDGE_METRICS_ACCESS": access}) as s2:
            assert httpx.get(s2.url + "/metrics").status_code == anonymous
            assert httpx.get(s2.url + "/metrics", headers=R).status_code == anonymous
    _alive(srv)


def test_healthz_answers_while_a_heavy_request_runs(server):
    """The heaviest allowed search (max_hits, JSON built off the loop) does not stall /healthz."""
    srv, data = server
    Y = data["Y"]
    q = np.tile(Y[:1], (100, 1)).tolist()
    lat: list[float] = []
    codes: list[int] = []
    probing, done = threading.Event(), threading.Event()

    def heavy():
        probing.wait(10)  # the searches start once /healthz is being probed (they can take less than one probe)
        with srv.client(R, timeout=60) as c:
            for _ in range(3):
                codes.append(c.post("/v1/indexes/ix/search", json={"vectors": q, "k": 1000, "exact": True}).status_code)
        done.set()

    t = threading.Thread(target=heavy)
    t.start()
    with httpx.Client(base_url=srv.url, timeout=10) as c:
        while not done.is_set() and t.is_alive():  # ended without done: its searches raised (codes below)
            t0 = time.perf_counter()
            assert c.get("/healthz").status_code == 200
            lat.append(time.perf_counter() - t0)
            probing.set()
            time.sleep(0.01)
    t.join(30)
    assert not t.is_alive() and len(codes) == 3, codes
    print(f"\n/healthz during heavy search: {len(lat)} probes, p50 {np.median(lat) * 1000:.1f} ms, "
          f"max {max(lat) * 1000:.1f} ms")
    assert codes == [200, 200, 200] and lat


def test_zz_matrix_figures(server):
    srv, _ = server
    _alive(srv)
    print(f"\nhardening matrix: {sum(STATUS_COUNTS.values())} requests, statuses {dict(sorted(STATUS_COUNTS.items()))}")
    assert STATUS_COUNTS and not any(s >= 500 for s in STATUS_COUNTS)


def test_guard_matches_routes_behind_a_root_path(tmp_path):
    """Behind a proxy prefix the key check and the body class still find the route (no 64 KiB cap on bulk)."""
    from fastapi.testclient import TestClient

    from service.api import create_app

    from .helpers import settings_for

    app = create_app(settings_for(tmp_path))
    with TestClient(app, root_path="/api") as c:
        assert c.post("/api/v1/spaces", json={"name": "p", "dim": 4}).status_code == 401
        r = c.post("/api/v1/maps/nope/transform", content=b"\0" * 200_000,
                   headers={**R, "content-type": "application/octet-stream"})
        assert r.status_code == 404, r.text  # the bulk limit applied: the map lookup answered


@pytest.mark.parametrize("bad", ["ix\n", "ix\n\n", "\nix", "ix\r", "ix\x00"])
def test_every_name_check_refuses_trailing_newlines(bad):
    """Each face's name rule is a full match (a ``$`` anchor lets ``"name\\n"`` through)."""
    from service.indexes import check_name as index_name
    from service.registry.names import check_alias, check_name
    from service.vectordb.base import check_name as collection_name

    for check in (index_name, check_name, check_alias, collection_name):
        with pytest.raises(ValueError):
            check(bad)


def test_a_long_bad_name_is_quoted_cut_to_40_characters_with_its_length(world, tmp_path, capsys):
    """An invalid index (or collection) name was repeated whole: POST /v1/indexes {"name": "x" * 10000 + "!"} was a
    10 KB 422 answer, and the CLI printed the same line. Map, space and alias names were cut to 40 characters already
    (now with their length too); every name check now does so."""
    from service.cli import main
    from service.indexes import check_name as index_name
    from service.registry.names import check_alias, check_name
    from service.vectordb.base import check_name as collection_name

    for check in (index_name, check_name, check_alias, collection_name):
        with pytest.raises(ValueError) as e:
            check("x" * 10_000 + "!")
        assert len(str(e.value)) < 240 and "'" + "x" * 40 + "'... (10001 characters)" in str(e.value), str(e.value)
    client, _, data = world
    r = client.post("/v1/indexes", headers=W, json={"name": "x" * 10_000 + "!", "space": "b", "vectors": [[0.0] * DIM]})
    assert r.status_code == 422 and len(r.content) < 400 and "(10001 characters)" in r.text, r.text[:300]
    np.save(tmp_path / "v.npy", data["Y"][:3])
    main(["--data-dir", str(tmp_path / "var"), "spaces", "add", "b", "--dim", str(DIM)])
    capsys.readouterr()
    assert main(["--data-dir", str(tmp_path / "var"), "index", "create", "x" * 10_000 + "!", str(tmp_path / "v.npy"),
                 "--space", "b"]) == 2
    err = capsys.readouterr().err
    assert len(err) < 300 and "(10001 characters)" in err, err[:300]
