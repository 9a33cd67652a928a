"""The fixed work of one request (issue 11, the per-request floor).

A batch-1 search does ~0.2 ms of work; what every request did around it was several times that. Each test pins one
piece: what a search on the event loop reads from disk, how a large answer is serialised, what a request after the
first no longer looks up (its route, its metric series), and what an access-log line costs — with the behaviour
each piece must keep (a change by another process seen at the next request, the same bytes, the same counts, the
same log lines).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import pathlib
import time
from pathlib import Path

import numpy as np
import pytest
from _api_support import R, W, answered, served_world
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from align import fit_procrustes
from align.exceptions import InputError
from service.api import responses
from service.api.middleware import GuardMiddleware
from service.api.routers import indexes as index_routes
from service.api.state import InMemory
from service.logging import JsonFormatter
from service.registry import open_registry

SEARCH = "/v1/indexes/ix/search"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with served_world(tmp_path_factory.mktemp("floor")) as (client, app, data):
        app.state.vb.indexes.create("ix", "b", data["Y"][:300], dim=16)
        yield client, app, data


def body(X, **extra) -> bytes:
    return json.dumps({"vectors_b64": base64.b64encode(np.ascontiguousarray(X, np.float32).tobytes()).decode(),
                       "dim": int(X.shape[1]), "space": "a", "k": 10, **extra}).encode()


def post(c, content: bytes):
    return c.post(SEARCH, content=content, headers={**R, "content-type": "application/json"})


def test_a_search_on_the_loop_reads_the_registry_file_once_and_builds_no_path(world, monkeypatch):
    """The fast path's search (``search_call`` with ``InMemory``, as on the event loop) read the registry's change
    token twice (space, then path of maps: two ``stat`` + ``pread``) and built ``<index>/meta.json`` anew for its
    ``stat``: now one read of the token per request and one ``stat`` of each of the two files."""
    c, app, data = world
    state = app.state.vb
    q = body(data["X"][:1])
    first = post(c, q)
    assert first.status_code == 200, first.text
    idx = state.indexes.in_memory("ix")
    tokens, stats, joins = [], [], []
    real_stat, real_join = os.stat, pathlib.PurePath.__truediv__
    with monkeypatch.context() as m:
        m.setattr(state.registry, "change_token", lambda real=state.registry.change_token: tokens.append(1) or real())
        m.setattr(os, "stat", lambda p, *a, **k: stats.append(Path(os.fspath(p)).name) or real_stat(p, *a, **k))
        m.setattr(pathlib.PurePath, "__truediv__", lambda self, key: joins.append(key) or real_join(self, key))
        _, response = index_routes.search_call(state, state.settings, idx, q, resolver=InMemory(state), wait=False)
    assert response.body == first.content
    assert len(tokens) == 1, tokens
    assert sorted(stats) == sorted(["meta.json", Path(state.registry.db.path).name]), stats
    assert joins == []


def test_a_search_on_the_loop_still_sees_another_processs_alias_move_at_once(world):
    """Read once per request, the token is still read at every request: a map moved by another process (another
    Registry on the same file) is the one the very next search uses."""
    c, app, data = world
    state = app.state.vb
    q = body(data["X"][:1])
    before = post(c, q).json()["maps"]
    assert [m["version"] for m in before] == [1]
    other = open_registry(state.settings.resolved_registry_url(), state.settings.resolved_artifact_dir())
    try:
        v2 = other.register_version("a2b", fit_procrustes(data["X"][:300] * 2.0, data["Y"][:300]), source_space="a",
                                    target_space="b", method="procrustes", params={}, alias="prod")
    finally:
        other.close()
    try:
        assert [m["version"] for m in post(c, q).json()["maps"]] == [v2.version]
        assert [m["version"] for m in post(c, body(data["X"][:1], map="a2b@prod")).json()["maps"]] == [v2.version]
    finally:
        assert c.put("/v1/maps/a2b/aliases/prod", json={"version": 1}, headers=W).status_code == 200
    assert [m["version"] for m in post(c, q).json()["maps"]] == [1]


def test_a_64_query_answer_is_serialised_in_one_call_with_the_same_hits(world, monkeypatch):
    """The hits of a block of rows go through one orjson call (64 queries: blocks of 1, 4, 16 and 43 rows, 5 calls
    with the head, not 65), and they are the index's own top 10 of each mapped query."""
    c, app, data = world
    state = app.state.vb
    X = data["X"][:64]
    post(c, body(X))
    real = responses.orjson
    calls = []

    class Counting:  # orjson as service.api.responses sees it, its dumps counted
        def __getattr__(self, name):
            return getattr(real, name)

        def dumps(self, *a, **k):
            calls.append(1)
            return real.dumps(*a, **k)

    monkeypatch.setattr(responses, "orjson", Counting())
    r = post(c, body(X, include_payloads=False))
    with_payloads = post(c, body(X))
    monkeypatch.undo()
    assert r.status_code == 200, r.text
    assert len(calls) <= 2 * 5, len(calls)
    rows = with_payloads.json()["results"]  # the index has no payloads: null in each hit, and the same hits
    assert [[h.pop("payload") for h in row] for row in rows] == [[None] * 10] * 64 and rows == r.json()["results"]
    Q = state.translation("a", "b").map.apply(X, output="raw")
    S, I = state.indexes.get("ix").search(Q, 10)
    assert r.json()["results"] == [[{"id": i, "score": s} for i, s in zip(ri, rs) if i >= 0]
                                   for ri, rs in zip(I.tolist(), S.tolist())]


def _answer_row_by_row(head, idx, S, I, with_payloads, max_bytes, P=None) -> bytes:
    """The answer as it was written before blocks: one row at a time, stopping at the first row past ``max_bytes``."""
    parts = [responses.dumps(head)[:-1], b',"results":[']
    size = sum(map(len, parts))
    for r, (row_i, row_s) in enumerate(zip(I.tolist(), S.tolist())):
        hits = []
        for j, (i, sc) in enumerate(zip(row_i, row_s)):
            if i >= 0:
                hits.append({"id": i, "score": sc, **({"payload": P[r][j] if P is not None else idx.payloads.get(i)}
                                                      if with_payloads else {})})
        chunk = responses.dumps(hits)
        size += len(chunk) + 1
        if size > max_bytes:
            raise InputError(f"the answer passes {max_bytes} bytes (limits.max_response_bytes) at query {r}; "
                             f"send fewer queries, a smaller k, or include_payloads=false")
        parts += [b","] * bool(r) + [chunk]
    return b"".join(parts + [b"]}"])


class _Payloads:
    def __init__(self) -> None:
        self.payloads = {i: {"text": "x" * (i % 7), 3: i} for i in range(60)}


_PAYLOADS = _Payloads()  # an index's payloads (non-string keys too), as _search_body reads them


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(0, 700), k=st.integers(1, 30), with_payloads=st.booleans(), read_p=st.booleans(),
       nan=st.booleans(), cut=st.one_of(st.none(), st.floats(0.0, 1.05)), seed=st.integers(0, 2**16))
def test_the_answer_by_blocks_is_the_answer_row_by_row(n, k, with_payloads, read_p, nan, cut, seed):
    """Same bytes, and past ``max_response_bytes`` the same 422 naming the same first query, for any shape (blocks
    of 4,096 hits: rows past a block's end), ids missing (-1), NaN scores, and payloads (one row at a time)."""
    rng = np.random.default_rng(seed)
    I = rng.integers(-1, 60, (n, k))
    S = rng.standard_normal((n, k)).astype(np.float32)
    S[I < 0] = -np.inf
    if nan:
        S[rng.random((n, k)) < 0.1] = np.nan
    P = [[_PAYLOADS.payloads.get(i) for i in row] for row in I.tolist()] if with_payloads and read_p else None
    head = {"index": "ix", "k": k}
    full = len(_answer_row_by_row(head, _PAYLOADS, S, I, with_payloads, 1 << 40, P))
    limit = 1 << 40 if cut is None else max(1, int(full * cut))

    def outcome(fn):
        try:
            return fn(head, _PAYLOADS, S, I, with_payloads, limit, P)
        except InputError as exc:
            return str(exc)

    assert outcome(index_routes._search_body) == outcome(_answer_row_by_row)


def _guard(app) -> GuardMiddleware:
    layer = app.middleware_stack
    while not isinstance(layer, GuardMiddleware):
        layer = layer.app
    return layer


class _CountedPattern:
    def __init__(self, regex, seen: list) -> None:
        self.regex, self.seen = regex, seen

    def match(self, path):
        self.seen.append(path)
        return self.regex.match(path)


def test_requests_after_the_first_reuse_their_route_match_and_metric_series(world, monkeypatch):
    """A path answered before is not matched against every route's pattern again (the search's is the 30th of 56),
    and the metric series of a request (latency, rows, map use) are not looked up again (~2 µs each, four per
    search): the counts still grow by one per request."""
    c, app, data = world
    metrics = app.state.vb.metrics
    q = body(data["X"][:1])
    assert post(c, q).status_code == 200
    before = answered(c, "/v1/indexes/{name}/search", 200)
    answered(c, "/v1/indexes/{name}/search", 200)  # /metrics' own series and match made
    looked, scans = [], []
    for metric in (metrics.request_duration, metrics.batch_rows, metrics.map_use, metrics.map_rows):
        monkeypatch.setattr(metric, "labels", lambda *v, real=metric.labels: looked.append(v) or real(*v))
    guard = _guard(app)
    monkeypatch.setattr(guard, "_table", [(_CountedPattern(rx, scans), *rest) for rx, *rest in guard._table])
    for _ in range(3):
        assert post(c, q).status_code == 200
    assert answered(c, "/v1/indexes/{name}/search", 200) == before + 3
    assert looked == [] and scans == []
    assert c.post("/v1/indexes/other/search", content=q, headers={**R, "content-type": "application/json"}
                  ).status_code == 404  # another path is matched (once), and answered as before
    assert scans


def test_remembered_routes_are_bounded(world):
    """Any client picks paths (the key is checked after the match): long ones are matched every time, and the paths
    remembered never pass 4,096."""
    _, app, _ = world
    guard = _guard(app)
    long = "/v1/indexes/" + "x" * 300 + "/search"
    route, need = guard._match({"path": long, "method": "POST"})
    assert route.path == "/v1/indexes/{name}/search" and need == "read"
    assert ("POST", long) not in guard._matched
    for i in range(5000):
        scope = {"path": f"/v1/indexes/n{i}/search", "method": "POST"}
        assert guard._match(scope)[0] is route and scope["vb_path_params"] == {"name": f"n{i}"}
        assert len(guard._matched) <= 4096
    assert guard._match({"path": "/no/such/route", "method": "GET"}) == (None, None)


def test_access_log_lines_are_the_same_json_with_one_strftime_per_second(monkeypatch):
    """The line is what ``json.dumps`` wrote (keys, order, spacing, redaction, ``default=str``); the timestamp's
    seconds are formatted once per second, not once per line."""
    fmt = JsonFormatter()
    rec = logging.LogRecord("vecbridge.access", logging.INFO, __file__, 1, "request", (), None)
    rec.fields = {"method": "POST", "route": "/v1/indexes/{name}/search", "status": 200, "duration_ms": 1.25,
                  "request_id": "abc", "api_key": "secret-value", "Authorization": "Bearer x", "where": Path("/p")}
    rec.created, rec.msecs = 1733400000.25, 250.0
    second = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(1733400000))
    expected = json.dumps({"ts": f"{second}.250Z", "level": "INFO", "logger": "vecbridge.access", "msg": "request",
                           "method": "POST", "route": "/v1/indexes/{name}/search", "status": 200, "duration_ms": 1.25,
                           "request_id": "abc", "api_key": "***", "Authorization": "***", "where": "/p"})
    calls = []
    real = time.strftime
    monkeypatch.setattr(time, "strftime", lambda *a: calls.append(a) or real(*a))
    assert [fmt.format(rec) for _ in range(100)] == [expected] * 100
    assert len(calls) <= 1
    rec.created += 1.0
    assert json.loads(fmt.format(rec))["ts"] == time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(1733400001)) + ".250Z"


@pytest.mark.parametrize("space", ["a", "b"])
def test_a_search_checks_the_query_values_for_nan_once(world, monkeypatch, space):
    """The values of a query were checked for NaN/Inf twice per request: once decoded, then again by the index (on
    the map's output, which the map has already checked). Now the request path passes ``finite=True`` down: one
    pass, mapped (``a``) or not (``b``), the same answer; a NaN query is still a 422 naming the rows."""
    from service.api import codec
    from service.indexes import space as space_mod
    from service.ops import indexes as index_ops

    c, app, data = world
    state = app.state.vb
    X = data["X"][:1] if space == "a" else data["Y"][300:301]
    q = body(X, space=space)
    first = post(c, q)
    assert first.status_code == 200, first.text
    passes = []
    for mod in (codec, space_mod, index_ops):
        real = mod.as_matrix
        monkeypatch.setattr(mod, "as_matrix", lambda *a, real=real, **k: passes.append(k.get("finite", True))
                            or real(*a, **k))
    idx = state.indexes.in_memory("ix")
    _, response = index_routes.search_call(state, state.settings, idx, q, resolver=InMemory(state), wait=False)
    assert response.body == first.content
    assert passes.count(True) == 1, passes
    monkeypatch.undo()
    bad = post(c, body(np.full_like(X, np.nan), space=space))
    assert bad.status_code == 422 and "1 row(s) contain NaN or Inf" in bad.json()["error"]["message"]


def test_the_index_still_checks_queries_nobody_vouched_for(world):
    """``finite`` defaults to False: a caller of ``SpaceIndex.search`` or ``ops.search`` without it (the CLI, a
    steered query) gets the NaN/Inf check."""
    from align.exceptions import NonFiniteError

    _, app, data = world
    idx = app.state.vb.indexes.get("ix")
    Q = data["Y"][:2].copy()
    Q[1, 3] = np.inf
    with pytest.raises(NonFiniteError, match="1 row"):
        idx.search(Q, 3)


def test_a_search_body_of_plain_fields_is_not_walked_for_depth(world, monkeypatch):
    """Every field of a search body (``k``, ``space``, a base64 string) went through the iterative depth / integer
    walk (~0.4 µs each, a tenth of the JSON parse); only nested fields and out-of-range integers need it, and those
    are still refused as before."""
    from service.api import codec

    c, _, data = world
    walked = []
    real = codec.check_json_depth
    monkeypatch.setattr(codec, "check_json_depth", lambda v, *a: walked.append(v) or real(v, *a))
    assert post(c, body(data["X"][:1], include_payloads=False, csls=False)).status_code == 200
    assert walked == []
    r = post(c, body(data["X"][:1], steers={}, tag=2**64))
    assert r.status_code == 422 and "does not fit in 64 bits" in r.json()["error"]["message"]
    assert {} in walked and 2**64 in walked
    assert post(c, body(data["X"][:1], k=2**64 - 1)).status_code == 422  # in range: pydantic's limit says no


def test_one_query_skips_the_wide_norm_pass_but_not_its_limits(monkeypatch):
    """``metric="ip"`` checks query norms against 1e19 (overflow of ``q·x``) with exact float64 norms (~10 µs for one
    row); one query far below it is let through on its float32 squared norm, and one at or past it, or NaN, still
    takes the exact check (and a one-row all-zero query is still refused for cosine, -0.0 included)."""
    from align.exceptions import DegenerateInputError, NotRepresentableError
    from service.indexes import kinds

    calls = []
    real = kinds.row_norms
    monkeypatch.setattr(kinds, "row_norms", lambda X: calls.append(1) or real(X))
    q = np.full((1, 16), 0.25, np.float32)
    assert kinds.prep_rows(q, "ip", "queries") is q and calls == []
    for scale in (1e17, 5e18, 2e19, 1e30):  # the norm of the row; 5e18: under the limit, checked exactly
        big = np.full((1, 16), scale / 4, np.float32)
        if scale > 1e19:
            with pytest.raises(NotRepresentableError, match="1 row"):
                kinds.prep_rows(big, "ip", "queries")
        else:
            assert kinds.prep_rows(big, "ip", "queries") is big
    assert len(calls) == 3
    with pytest.raises(DegenerateInputError, match="1 all-zero row"):
        kinds.prep_rows(np.full((1, 16), -0.0, np.float32), "cosine", "queries")


def test_a_json_transform_without_query_options_makes_one_options_model(world, monkeypatch):
    """A JSON transform with no query options validated an empty query model and then copied the body's model into
    a merged one (~10 us of a batch-1 JSON transform): it now makes the body's alone. With a query option the two are
    still merged, and still refused when they disagree."""
    from service.api.routers import maps as map_routes
    from service.api.schemas import TransformOptions

    c, _, data = world
    made: list[dict] = []
    real = map_routes.validate
    monkeypatch.setattr(map_routes, "validate", lambda model, obj, *a: (
        made.append(dict(obj)) if model is TransformOptions else None) or real(model, obj, *a))
    copies: list[dict] = []
    real_copy = TransformOptions.model_copy
    monkeypatch.setattr(TransformOptions, "model_copy", lambda self, **k: copies.append(k) or real_copy(self, **k))
    rows = data["X"][:2].tolist()
    url = "/v1/maps/a2b/transform"
    plain = c.post(url, headers=R, json={"vectors": rows, "output": "frame"})
    assert plain.status_code == 200, plain.text
    assert made == [{"output": "frame"}] and copies == []  # the body's options, once; no merge
    monkeypatch.undo()
    queried = c.post(url + "?output=frame", headers=R, json={"vectors": rows})
    assert queried.status_code == 200 and queried.content == plain.content
    assert c.post(url + "?output=frame", headers=R, json={"vectors": rows, "output": "raw"}).status_code == 422


def test_a_request_reads_its_settings_without_pydantic_attribute_errors(world, monkeypatch):
    """``Settings.files`` (read by every key check: a keys file?) was ``self._files``, a private attribute: the plain
    lookup fails first, so each read made, formatted and caught an AttributeError (~6 µs) before pydantic's
    ``__getattr__`` found it. Both private attributes are read from pydantic's own dict now, the same values."""
    from service.config import Settings

    c, app, data = world
    misses = []
    real = Settings.__getattr__
    monkeypatch.setattr(Settings, "__getattr__", lambda self, name: misses.append(name) or real(self, name))
    assert post(c, body(data["X"][:1])).status_code == 200
    assert misses == []
    s = Settings(api_keys={"k": ["read"]})
    assert s.files == {} and s.local_key_file is None
    s._files, s._local_key_file = {"api_keys": "/run/keys.json"}, Path("/data/local-key")
    assert s.files == {"api_keys": "/run/keys.json"} and s.local_key_file == Path("/data/local-key")
    assert s.model_copy().files == {"api_keys": "/run/keys.json"}


def test_request_ids_are_random_version_4_uuids():
    """A request without ``X-Request-ID`` gets a random version-4 UUID as 32 hex digits, as ``uuid.uuid4().hex``
    gave, made without the ``UUID`` object (~4 µs of every request): every bit but the six fixed ones varies."""
    import uuid

    from service.api.middleware import new_request_id

    ids = [new_request_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for rid in ids:
        u = uuid.UUID(hex=rid)
        assert u.hex == rid and u.version == 4 and u.variant == uuid.RFC_4122
    ones, zeros = 0, 0
    for rid in ids:
        ones |= int(rid, 16)
        zeros |= ~int(rid, 16) & ((1 << 128) - 1)
    fixed = (0xF000 << 64) | (0xC000 << 48)
    assert ones & ~fixed == zeros & ~fixed == ((1 << 128) - 1) & ~fixed


def test_a_body_that_has_arrived_is_read_without_a_timer(world, monkeypatch):
    """The guard's read of a body message armed ``asyncio.timeout(body_timeout_s)`` (a timer made and cancelled,
    ~15 µs) around every ``receive()``, though a small body comes with its request's head: a search or transform
    whose body is there makes no timer now (one that must wait for its body is still bounded:
    ``tests/reliability/test_hardening.py``, ``test_bounded_waits.py``)."""
    import asyncio

    c, _, data = world
    made = []
    real = asyncio.timeout
    monkeypatch.setattr(asyncio, "timeout", lambda s: made.append(s) or real(s))
    x = np.ascontiguousarray(data["X"][:1], np.float32)
    assert post(c, body(x)).status_code == 200
    assert c.post("/v1/maps/a2b/transform", content=x.tobytes(),
                  headers={**R, "content-type": "application/octet-stream"}).status_code == 200
    assert made == []
