"""HTTP conditional requests (RFC 9110 8.8.3, 13) against real servers and registries.

There was no ``ETag`` anywhere: a worker caching map artifacts downloaded every one again to learn whether it
had changed, and a deploy script could only guard an alias move with the body's ``expected_version`` (and a
removal not at all). Now reads carry strong ETags (artifact: sha256 + format, known before the artifact is
read; JSON records and the report: a hash of the body; an alias: ``"v<N>"``) and ``If-None-Match`` answers 304;
alias writes take ``If-Match`` / ``If-None-Match: *`` as the registry's compare-and-set, 412 when it does not
hold — one winner among racing clients on two server processes sharing SQLite, and PostgreSQL.
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager

import httpx
import numpy as np
import pytest
from _api_support import W, settings_for
from _servers import env_for, serve_in_thread, start_on_free_port, stop

from align import Steer, fit_procrustes, map_from_bytes
from service.client import Client, ConflictError, PreconditionFailedError
from service.registry import open_registry


def _world(data, url: str | None = None) -> None:
    """Spaces a, b; map a2b versions 1..3 (3 = a copy of 1's map: the same artifact); steer pos 1..2; a report."""
    data.mkdir(parents=True, exist_ok=True)
    reg = open_registry(url or f"sqlite:///{(data / 'registry.sqlite').resolve()}", (data / "artifacts").resolve())
    rng = np.random.default_rng(0)
    X = rng.standard_normal((64, 16)).astype(np.float32)
    maps = [fit_procrustes(X, X @ np.linalg.qr(rng.standard_normal((16, 16)))[0]) for _ in range(2)]
    report = data / "report.html"
    report.write_text("<html><body>fit report</body></html>")
    for m in (maps[0], maps[1], maps[0]):
        reg.register_version("a2b", m, source_space="a", target_space="b", method="procrustes", params={},
                             report_path=str(report))
    for _ in range(2):
        reg.register_steer("pos", Steer(rng.normal(size=(16, 2)), rng.normal(size=(16, 2)), {}), space="a", params={})
    reg.close()


@pytest.fixture
def served(tmp_path):
    from service.api import create_app

    _world(tmp_path / "data")
    with serve_in_thread(create_app(settings_for(tmp_path))) as url, httpx.Client(base_url=url, headers=W) as c:
        yield c, url, tmp_path / "data"


def test_an_artifact_is_not_downloaded_again_while_its_etag_matches(served):
    c, _, _ = served
    sha = c.get("/v1/maps/a2b/versions/1").json()["artifact_sha256"]
    r = c.get("/v1/maps/a2b:1/artifact")
    assert r.status_code == 200 and r.headers["etag"] == f'"{sha}.safetensors"'
    assert r.headers["cache-control"] == "private, max-age=31536000, immutable"  # name:N never changes
    for held in (r.headers["etag"], f"W/{r.headers['etag']}", f'"nope", {r.headers["etag"]}', "*"):
        again = c.get("/v1/maps/a2b:1/artifact", headers={"If-None-Match": held})
        assert again.status_code == 304 and again.content == b"", held
        assert again.headers["etag"] == r.headers["etag"] and again.headers["x-map-version"] == "1"
    assert c.get("/v1/maps/a2b:1/artifact", headers={"If-None-Match": '"other"'}).content == r.content
    npz = c.get("/v1/maps/a2b:1/artifact", params={"format": "npz"})
    assert npz.headers["etag"] == f'"{sha}.npz"' and c.get(npz.url).content == npz.content  # same bytes each time
    assert c.get(npz.url, headers={"If-None-Match": r.headers["etag"]}).status_code == 200  # another format
    # an alias or a bare name moves: revalidate each time; the copy of version 1 (version 3) has its ETag
    c.put("/v1/maps/a2b/aliases/prod", json={"version": 2})
    prod = c.get("/v1/maps/a2b@prod/artifact")
    assert prod.headers["cache-control"] == "private, no-cache" and prod.headers["etag"] != r.headers["etag"]
    c.put("/v1/maps/a2b/aliases/prod", json={"version": 3})
    moved = c.get("/v1/maps/a2b@prod/artifact", headers={"If-None-Match": r.headers["etag"]})
    assert moved.status_code == 304 and moved.headers["x-map-version"] == "3"
    assert c.get("/v1/maps/a2b@prod/artifact", headers={"If-None-Match": prod.headers["etag"]}).status_code == 200


def test_a_head_of_an_artifact_served_before_builds_no_body(served, monkeypatch):
    """HEAD ran the whole download and dropped the body: the artifact loaded and serialised (a 4096 x 4096 map:
    64 MiB and 70-90 ms) for headers only, each time a cache or monitor probed it. Now a HEAD of an artifact
    served before (the ETag fixes its bytes) answers the GET's status and headers, Content-Length included,
    without serialising it; one never served is built once, as before."""
    from align import LinearMap

    c, _, _ = served
    built = []
    real = LinearMap.to_bytes
    monkeypatch.setattr(LinearMap, "to_bytes", lambda self, *a, **k: built.append(a) or real(self, *a, **k))
    same = ("content-type", "content-length", "etag", "cache-control", "content-disposition", "x-map",
            "x-map-version")
    get = c.get("/v1/maps/a2b:1/artifact")
    assert get.status_code == 200 and len(built) == 1
    head = c.head("/v1/maps/a2b:1/artifact")
    assert head.status_code == 200 and head.content == b"" and len(built) == 1  # before: 2, serialised for nothing
    assert [head.headers.get(h) for h in same] == [get.headers.get(h) for h in same]
    assert int(head.headers["content-length"]) == len(get.content)
    copy = c.head("/v1/maps/a2b:3/artifact")  # version 3: version 1's artifact, its own file name
    assert copy.headers["content-disposition"] == 'attachment; filename="a2b-3.safetensors"' and len(built) == 1
    assert copy.headers["content-length"] == get.headers["content-length"]
    npz = c.head("/v1/maps/a2b:1/artifact", params={"format": "npz"})  # never served in this format: built once
    assert npz.status_code == 200 and len(built) == 2
    assert c.head(npz.url).headers["content-length"] == npz.headers["content-length"] and len(built) == 2
    assert int(npz.headers["content-length"]) == len(c.get(npz.url).content)
    hit = c.head("/v1/maps/a2b:1/artifact", headers={"If-None-Match": get.headers["etag"]})
    assert hit.status_code == 304 and hit.headers["etag"] == get.headers["etag"]


def test_a_head_answers_what_the_get_would_once_the_file_is_gone(tmp_path, monkeypatch):
    """A HEAD of an artifact served before answered from its remembered length: once its file was removed or
    truncated, and the map too large to stay in memory (over ``map_cache_mb``), the HEAD said 200 with the old
    Content-Length while the GET failed (500, integrity). Now the remembered length holds only while the GET would
    still answer: the map in memory, or its file there with the size it had (one stat); else the HEAD takes the
    GET's path and fails alike. While the file is intact, the HEAD still builds no body."""
    from align import LinearMap
    from service.api import create_app

    data = tmp_path / "data"
    data.mkdir()
    reg = open_registry(f"sqlite:///{data / 'registry.sqlite'}", data / "artifacts")
    rng = np.random.default_rng(0)
    W_ = np.linalg.qr(rng.standard_normal((600, 600)))[0].astype(np.float32)  # 1.4 MB: over a 1 MiB map cache
    reg.register_version("big", LinearMap(W_), source_space="a", target_space="b", method="procrustes", params={})
    stored = reg.store.path(reg.resolve("big:1").artifact_path)
    reg.close()
    built = []
    real = LinearMap.to_bytes
    monkeypatch.setattr(LinearMap, "to_bytes", lambda self, *a, **k: built.append(a) or real(self, *a, **k))
    with serve_in_thread(create_app(settings_for(tmp_path, map_cache_mb=1))) as url, \
            httpx.Client(base_url=url, headers=W) as c:
        path = "/v1/maps/big:1/artifact"
        get = c.get(path)
        head = c.head(path)
        assert (get.status_code, head.status_code, len(built)) == (200, 200, 1)  # intact: no body built for the HEAD
        size = head.headers["content-length"]
        assert size == str(len(get.content))
        whole = stored.read_bytes()
        # truncated, or removed (the registry's only file: one lost file, too few missing to say the folder is
        # another replica's, see service/registry/elsewhere.py): both the integrity error (500) they always were
        for damage in (lambda: stored.write_bytes(whole[:-1]), stored.unlink):
            damage()
            head, get = c.head(path), c.get(path)
            assert head.status_code == get.status_code == 500, (head.status_code, get.status_code)
            assert head.content == b"" and get.json()["error"]["type"] == "IntegrityError"
        stored.write_bytes(whole)  # put back: answered from the remembered length again
        assert [c.head(path).status_code, c.get(path).status_code] == [200, 200]
        n = len(built)
        assert c.head(path).headers["content-length"] == size and len(built) == n


def test_a_head_remembers_no_size_of_a_file_it_did_not_read(tmp_path):
    """A GET served from the map in memory recorded the file's size as it was then, unchecked: a file truncated
    while the map was in memory was remembered as the good one, and once the map left memory the HEAD said 200
    where the GET said 500. Now only a load that read the file (and checked its sha256) records its size, and a
    later checked size replaces an unchecked entry."""
    from align import LinearMap
    from service.api import create_app

    data = tmp_path / "data"
    data.mkdir()
    reg = open_registry(f"sqlite:///{data / 'registry.sqlite'}", data / "artifacts")
    W_ = np.linalg.qr(np.random.default_rng(0).standard_normal((64, 64)))[0].astype(np.float32)
    reg.register_version("m", LinearMap(W_), source_space="a", target_space="b", method="procrustes", params={})
    stored = reg.store.path(reg.resolve("m:1").artifact_path)
    reg.close()
    app = create_app(settings_for(tmp_path))
    with serve_in_thread(app) as url, httpx.Client(base_url=url, headers=W) as c:
        path = "/v1/maps/m:1/artifact"
        assert c.get(path).status_code == 200  # read from the file: the map is now in memory
        whole = stored.read_bytes()
        stored.write_bytes(whole[:-10])  # damaged while the map is in memory
        assert c.get(path + "?format=npz").status_code == 200  # from memory: the file is not read
        app.state.vb.registry._maps.cache._items.clear()  # the map leaves memory
        head, get = c.head(path + "?format=npz"), c.get(path + "?format=npz")
        assert head.status_code == get.status_code == 500, (head.status_code, get.status_code)
        stored.write_bytes(whole)
        get = c.get(path + "?format=npz")  # read and checked: its size is remembered now
        app.state.vb.registry._maps.cache._items.clear()
        head = c.head(path + "?format=npz")
        assert (get.status_code, head.status_code) == (200, 200)
        assert head.headers["content-length"] == str(len(get.content))


def test_a_304_reads_no_artifact(tmp_path):
    """The artifact file is gone: a download fails (500, integrity), but a client holding the current ETag gets
    its 304 from the registry record alone (a fresh server: nothing in its memory)."""
    from service.api import create_app

    _world(tmp_path / "data")
    reg = open_registry(f"sqlite:///{tmp_path / 'data' / 'registry.sqlite'}", tmp_path / "data" / "artifacts")
    v = reg.resolve("a2b:2")
    (reg.store.root / v.artifact_path).unlink()
    reg.close()
    with serve_in_thread(create_app(settings_for(tmp_path))) as url:
        r = httpx.get(f"{url}/v1/maps/a2b:2/artifact", headers={**W, "If-None-Match": f'"{v.artifact_sha256}.npz"'},
                      params={"format": "npz"})
        assert r.status_code == 304, r.text
        assert httpx.get(f"{url}/v1/maps/a2b:2/artifact", headers=W).status_code == 500


@pytest.mark.parametrize("path", ["/v1/maps/a2b@prod", "/v1/maps/a2b/versions/1", "/v1/steers/pos:1",
                                  "/v1/maps/a2b/versions/1/report"])
def test_records_and_the_report_carry_an_etag_of_their_body(served, path):
    c, _, _ = served
    c.put("/v1/maps/a2b/aliases/prod", json={"version": 1})
    r = c.get(path)
    assert r.status_code == 200 and r.headers["etag"].startswith('"') and r.headers["cache-control"] == \
        "private, no-cache"
    assert c.get(path).headers["etag"] == r.headers["etag"]
    hit = c.get(path, headers={"If-None-Match": f'W/"x", {r.headers["etag"]}'})
    assert hit.status_code == 304 and hit.content == b"" and hit.headers["etag"] == r.headers["etag"]
    if "steers" in path:
        c.put("/v1/steers/pos/aliases/prod", json={"version": 1})  # the record lists its aliases
    elif "report" not in path:
        c.put("/v1/maps/a2b/versions/1/tags/owner", json={"value": "x"})
    else:
        return  # a report never changes
    changed = c.get(path, headers={"If-None-Match": r.headers["etag"]})
    assert changed.status_code == 200 and changed.headers["etag"] != r.headers["etag"]


@pytest.mark.parametrize("kind", ["maps", "steers"])
def test_alias_writes_hold_only_while_if_match_does(served, kind):
    c, _, _ = served
    name = "a2b" if kind == "maps" else "pos"
    alias = f"/v1/{kind}/{name}/aliases/prod"
    assert c.get(alias).status_code == 404
    r = c.put(alias, json={"version": 1}, headers={"If-Match": '"v1"'})  # not set: If-Match cannot hold
    assert r.status_code == 412 and "is not set" in r.json()["error"]["message"]
    assert c.delete(alias, headers={"If-Match": "*"}).status_code == 412
    r = c.put(alias, json={"version": 1}, headers={"If-None-Match": "*"})  # create only
    assert r.status_code == 200 and r.headers["etag"] == '"v1"' and r.json()["version"] == 1
    r = c.put(alias, json={"version": 2}, headers={"If-None-Match": "*"})
    assert r.status_code == 412 and r.json()["error"]["type"] == "PreconditionFailedError"
    assert 'points at version 1 (ETag "v1")' in r.json()["error"]["message"]
    got = c.get(alias)
    assert got.json() == {"name": name, "alias": "prod", "version": 1} and got.headers["etag"] == '"v1"'
    assert c.get(alias, headers={"If-None-Match": '"v1"'}).status_code == 304
    for stale in ('"v2"', 'W/"v1"', '"1"', '"v99999999999"', "garbage"):  # W/: If-Match compares strongly
        assert c.put(alias, json={"version": 2}, headers={"If-Match": stale}).status_code == 412, stale
        assert c.delete(alias, headers={"If-Match": stale}).status_code == 412, stale
    assert c.get(alias).json()["version"] == 1  # nothing moved
    r = c.put(alias, json={"version": 2}, headers={"If-Match": got.headers["etag"]})
    assert r.status_code == 200 and r.headers["etag"] == '"v2"'
    r = c.put(alias, json={"version": 1}, headers={"If-Match": '"v7", "v2"'})
    assert r.status_code == 200 and r.headers["etag"] == '"v1"'
    assert c.put(alias, json={"version": 2}, headers={"If-Match": "*"}).headers["etag"] == '"v2"'
    for bad in ({"If-Match": '"v2"', "If-None-Match": "*"}, {"If-None-Match": '"v2"'}):
        assert c.put(alias, json={"version": 1}, headers=bad).status_code == 422
    r = c.put(alias, json={"version": 1, "expected_version": 2}, headers={"If-Match": '"v2"'})
    assert r.status_code == 422 and "not both" in r.json()["error"]["message"]
    assert c.put(alias, json={"version": 1, "expected_version": 1}).status_code == 409  # the body's CAS: 409
    assert c.put(f"/v1/{kind}/nope/aliases/prod", json={"version": 1}, headers={"If-Match": "*"}).status_code == 404
    assert c.put(alias, json={"version": 9}, headers={"If-Match": '"v2"'}).status_code == 404
    assert c.delete(f"/v1/{kind}/nope/aliases/prod", headers={"If-Match": '"v2"'}).status_code == 404
    assert c.delete(alias, headers={"If-Match": '"v2"'}).status_code == 204
    assert c.get(alias).status_code == 404 and c.delete(alias).status_code == 404


def test_a_web_page_of_an_allowed_origin_can_read_the_etag(tmp_path):
    """With CORS on, a browser hid ``ETag`` from the page's script (not a CORS-safelisted header), so a web client
    could not send it back in ``If-Match`` / ``If-None-Match``; it is exposed now. So are the headers that say which
    map version answered a transform (``X-Map``, ``X-Map-Version``), a binary answer's ``X-Shape`` and the
    ``X-Request-ID`` to quote in a report (before: hidden, only ``ETag`` was exposed)."""
    from service.api import create_app

    _world(tmp_path / "data")
    origin = {"Origin": "https://app.example"}
    with serve_in_thread(create_app(settings_for(tmp_path, cors_origins=["https://app.example"]))) as url:
        httpx.put(f"{url}/v1/maps/a2b/aliases/prod", json={"version": 1}, headers=W)
        r = httpx.get(f"{url}/v1/maps/a2b/aliases/prod", headers={**W, **origin})
        assert "etag" in r.headers["access-control-expose-headers"].lower() and r.headers["etag"] == '"v1"'
        r = httpx.post(f"{url}/v1/maps/a2b@prod/transform", content=np.ones((2, 16), np.float32).tobytes(),
                       headers={**W, **origin, "Content-Type": "application/octet-stream", "X-Vector-Dim": "16"})
        assert r.status_code == 200, r.text
        exposed = {h.strip().lower() for h in r.headers["access-control-expose-headers"].split(",")}
        for h in ("x-map", "x-map-version", "x-shape", "x-request-id", "retry-after", "etag"):
            assert h in exposed, (h, exposed)
            assert h in ("retry-after", "etag") or h in r.headers, h


def test_the_client_caches_an_artifact_by_etag_and_guards_a_removal(served):
    _, url, _ = served
    with Client(url, api_key="wkey-456") as vb:
        a = vb.artifact("a2b:1")
        assert a.data and a.version == 1 and a.etag.endswith('.safetensors"')
        m = map_from_bytes(a.data)
        assert vb.artifact("a2b:1", etag=a.etag) == (None, a.etag, 1)  # not modified: nothing downloaded
        assert vb.artifact("a2b:2", etag=a.etag).data != a.data
        assert vb.download_artifact("a2b:1") == a.data and m.source_dim == 16
        vb.set_alias("a2b", "prod", 2)
        with pytest.raises(PreconditionFailedError) as err:
            vb.delete_alias("a2b", "prod", expected=1)
        assert isinstance(err.value, ConflictError) and err.value.status == 412
        vb.delete_alias("a2b", "prod", expected=2)
        assert "prod" not in vb.get_map("a2b")["aliases"]


@contextmanager
def _replicas(tmp_path, url: str):
    """Two ``uvicorn`` processes (replicas, ports of their own) over one data dir and registry ``url``."""
    data = tmp_path / "data"
    _world(data, url)
    procs, urls = [], []
    try:
        for i in range(2):
            proc, port = start_on_free_port(lambda port: (
                [sys.executable, "-m", "uvicorn", "--factory", "service.api:create_app", "--host", "127.0.0.1",
                 "--port", str(port), "--no-access-log"], {**env_for(data, port), "VECBRIDGE_REGISTRY_URL": url}),
                tmp_path / f"r{i}.log")
            procs.append(proc)
            urls.append(f"http://127.0.0.1:{port}")
        yield urls
    finally:
        for p in procs:
            stop(p)


def _race(urls, headers_of, versions=(1, 2, 3), n: int = 8):
    """``n`` clients (alternating replicas) behind a barrier, client i moving a2b@prod to ``versions[i % len]``
    with ``headers_of(i)``; their responses in order."""
    barrier, out = threading.Barrier(n), [None] * n

    def run(i):
        with httpx.Client(base_url=urls[i % 2], headers=W, timeout=60) as c:
            barrier.wait(30)
            out[i] = c.put("/v1/maps/a2b/aliases/prod", json={"version": versions[i % len(versions)]},
                           headers=headers_of(i))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_racing_if_match_writes_on_two_replicas_have_one_winner(tmp_path, request, backend):
    url = f"sqlite:///{tmp_path / 'data' / 'registry.sqlite'}" if backend == "sqlite" else \
        request.getfixturevalue("pg_url")
    with _replicas(tmp_path, url) as urls:
        assert httpx.put(f"{urls[0]}/v1/maps/a2b/aliases/prod", json={"version": 3}, headers=W).status_code == 200
        for rnd in range(3):
            held = httpx.get(f"{urls[rnd % 2]}/v1/maps/a2b/aliases/prod", headers=W).headers["etag"]
            others = [v for v in (1, 2, 3) if f'"v{v}"' != held]  # a move onto the held version would keep it
            got = _race(urls, lambda i, held=held: {"If-Match": held}, others)
            codes = [r.status_code for r in got]
            assert codes.count(200) == 1 and codes.count(412) == len(codes) - 1, [r.text for r in got]
            winner = got[codes.index(200)]
            for u in urls:  # both replicas see the winner's move
                assert httpx.get(f"{u}/v1/maps/a2b/aliases/prod", headers=W).headers["etag"] == \
                    winner.headers["etag"]
        got = _race(urls, lambda i: {"If-Match": '"v1", "v2", "v3"'} if i % 2 else {"If-None-Match": "*"})
        assert all(r.status_code == (200 if i % 2 else 412) for i, r in enumerate(got)), [r.text for r in got]


def test_the_probes_answer_head_over_real_http(served):
    """Load balancers and monitors probe with HEAD: /healthz and /readyz answered 405 (allow: GET). Now the GET's
    status and headers with no body, over a real uvicorn server; the OpenAPI document is unchanged (GET only)."""
    import http.client
    from urllib.parse import urlsplit

    c, url, _ = served
    u = urlsplit(url)
    for path in ("/healthz", "/readyz"):
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        try:
            conn.request("HEAD", path)
            r = conn.getresponse()
            assert r.status == 200 and r.read() == b"" and r.getheader("content-type") == "application/json", path
        finally:
            conn.close()
        assert set(c.get("/openapi.json").json()["paths"][path]) == {"get"}


def _raw_head(url: str, path: str, headers: dict) -> tuple[int, dict, bytes]:
    """(status, headers, what followed the head on the connection) of ``HEAD path`` over real HTTP."""
    import socket
    from urllib.parse import urlsplit

    u = urlsplit(url)
    with socket.create_connection((u.hostname, u.port), timeout=10) as sock:
        lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        sock.sendall(f"HEAD {path} HTTP/1.1\r\nHost: {u.hostname}\r\n{lines}Connection: close\r\n\r\n".encode())
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head, _, rest = raw.partition(b"\r\n\r\n")
    status_line, *fields = head.decode("latin-1").split("\r\n")
    return int(status_line.split()[1]), {k.lower(): v for k, v in (f.split(": ", 1) for f in fields)}, rest


def test_head_of_an_artifact_answers_its_etag_and_length_over_real_http(served):
    """HEAD of the artifact (and of every other GET route) was a 405 (allow: GET), though the README sells ETags to
    caches, which probe with HEAD. Now: the GET's status and headers (Content-Length, ETag) and not one body byte,
    over a real uvicorn server; 304 on a matching If-None-Match; 401 without a key."""
    c, url, _ = served
    got = c.get("/v1/maps/a2b:1/artifact")
    for path in ("/v1/maps/a2b:1/artifact", "/v1/maps/a2b:1/artifact?format=npz", "/v1/maps/a2b/versions/1",
                 "/v1/maps/a2b", "/v1/steers/pos", "/v1/info", "/ui/registry"):
        get = c.get(path)
        status, headers, rest = _raw_head(url, path, W)
        assert (status, rest) == (get.status_code, b"") and status == 200, (path, status, rest[:100])
        for h in ("content-length", "content-type", "etag", "cache-control", "x-map-version"):
            if h != "content-length" or path != "/v1/info":  # /v1/info's uptime changes its length
                assert headers.get(h) == get.headers.get(h), (path, h)
    status, headers, rest = _raw_head(url, "/v1/maps/a2b:1/artifact", {**W, "If-None-Match": got.headers["etag"]})
    assert (status, headers["etag"], rest) == (304, got.headers["etag"], b"")
    status, headers, rest = _raw_head(url, "/v1/maps/a2b:1/artifact", {})
    assert status == 401 and "www-authenticate" in headers and rest == b""


def test_tag_writes_hold_only_while_if_match_does(served):
    """``PUT .../tags/{key}`` with an ``If-Match`` that did not hold wrote anyway (200), though the version has a
    strong ETag and alias writes honour theirs (RFC 9110 13.1.1). Now a tag write or removal under ``If-Match`` is
    a 412 (nothing written) unless the version's ETag is listed (``*``: it exists), and its answer carries the new
    ETag; the document declares the header and the 412."""
    c, _, _ = served
    version, tag = "/v1/maps/a2b/versions/1", "/v1/maps/a2b/versions/1/tags/owner"
    first = c.get(version)
    e1 = first.headers["etag"]
    for stale in ('"nope"', f"W/{e1}", e1.strip('"'), "garbage"):  # W/: If-Match compares strongly
        for r in (c.put(tag, json={"value": "x"}, headers={"If-Match": stale}),
                  c.delete(tag, headers={"If-Match": stale})):
            assert r.status_code == 412, (stale, r.status_code, r.text)
            assert r.json()["error"]["type"] == "PreconditionFailedError" and e1 in r.json()["error"]["message"]
    assert c.get(version).json() == first.json()  # nothing written
    r = c.put(tag, json={"value": "search"}, headers={"If-Match": f'"other", {e1}'})
    assert r.status_code == 200 and r.json()["tags"] == {"owner": "search"}
    e2 = r.headers["etag"]
    assert e2 != e1 and c.get(version).headers["etag"] == e2  # the ETag a GET answers now
    r = c.put(tag, json={"value": "ranking"}, headers={"If-Match": e1})  # a write its client did not see
    assert r.status_code == 412 and c.get(version).json()["tags"] == {"owner": "search"}
    assert c.delete(tag, headers={"If-Match": e1}).status_code == 412
    r = c.delete(tag, headers={"If-Match": e2})
    assert r.status_code == 200 and r.json()["tags"] == {} and r.headers["etag"] == c.get(version).headers["etag"]
    assert c.put(tag, json={"value": 1}, headers={"If-Match": "*"}).status_code == 200
    assert c.delete(tag).status_code == 200 and c.put(tag, json={"value": 2}).status_code == 200  # as before
    assert c.put("/v1/maps/a2b/versions/9/tags/owner", json={"value": 1}, headers={"If-Match": "*"}).status_code == 404
    doc = c.get("/openapi.json").json()
    for method in ("put", "delete"):
        op = doc["paths"]["/v1/maps/{name}/versions/{version}/tags/{key}"][method]
        assert "412" in op["responses"] and "ETag" in op["responses"]["200"]["headers"], method
        assert [p for p in op["parameters"] if p["in"] == "header" and p["name"].lower() == "if-match"], method



@pytest.mark.parametrize("kind", ["maps", "steers"])
def test_an_alias_write_reads_every_if_match_line(served, kind):
    """RFC 9110 5.3: a field sent on several lines is one comma-separated list, but the routes were handed only its
    first line: ``If-Match: "v7"`` then ``If-Match: "v1"`` was a 412 on an alias at v1 (and on a tag write whose
    version's ETag was on the second line), and ``If-None-Match`` of two lines a full 200 where the second matched.
    Every line counts now, for alias writes, tag writes and reads."""
    c, _, _ = served
    name = "a2b" if kind == "maps" else "pos"
    alias = f"/v1/{kind}/{name}/aliases/prod"
    assert c.put(alias, json={"version": 1}, headers={"If-None-Match": "*"}).status_code == 200
    r = c.put(alias, json={"version": 2}, headers=[("If-Match", '"v7"'), ("If-Match", '"v1"')])
    assert r.status_code == 200 and r.headers["etag"] == '"v2"', r.text
    r = c.put(alias, json={"version": 1}, headers=[("If-Match", '"v7"'), ("If-Match", '"v1"')])  # neither holds
    assert r.status_code == 412 and 'If-Match: "v7", "v1" does not hold' in r.json()["error"]["message"], r.text
    assert c.get(alias, headers=[("If-None-Match", '"v7"'), ("If-None-Match", '"v2"')]).status_code == 304
    assert c.delete(alias, headers=[("If-Match", '"v7"'), ("If-Match", '"v2"')]).status_code == 204


def test_a_tag_write_reads_every_if_match_line(served):
    """As above for tag writes: the version's ETag on the second ``If-Match`` line was a 412."""
    c, _, _ = served
    version, tag = "/v1/maps/a2b/versions/1", "/v1/maps/a2b/versions/1/tags/owner"
    e1 = c.get(version).headers["etag"]
    r = c.put(tag, json={"value": "search"}, headers=[("If-Match", '"other"'), ("If-Match", e1)])
    assert r.status_code == 200 and r.json()["tags"] == {"owner": "search"}, r.text
    e2 = r.headers["etag"]
    r = c.delete(tag, headers=[("If-Match", e1), ("If-Match", '"other"')])  # e1 is stale now: neither holds
    assert r.status_code == 412 and c.get(version).json()["tags"] == {"owner": "search"}
    r = c.delete(tag, headers=[("If-Match", '"other"'), ("If-Match", e2)])
    assert r.status_code == 200 and r.json()["tags"] == {}, r.text
