"""One large client call sent in several batches goes through the same map and steer versions from first to last.

``Client.search`` splits a query set that passes the service's limits into batches (``test_client_batches``).
Each search resolves its path of maps (and its steers) from the registry, so before, a deploy that moved an
alias between two batches sent the first batches through one map version and the rest through another, mixed
silently in one answer whose ``maps`` named only the first. Now the batches after the first name the versions
the first answer used (``map``: one ``name:version``, or a list for a path of several maps; ``steers`` by
version). ``Client.embed(texts, model, target_space=)`` had the same gap and is pinned the same way (its batches
send the ``map`` path the first ``/v1/embeddings`` answer's ``maps`` named). Here a real server runs with tiny
limits, and a second client moves the alias over HTTP right after the first batch's answer arrives (a transport
that runs the move between the two requests). Tests marked ``both_clients`` run ``AsyncClient`` too (the same
batching code: ``service.client_core``).
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from _clients import CLIENTS, both_clients
from _servers import seeded_uvicorn

from align import LinearMap, Steer, fit_procrustes
from service.client import Client
from service.client_wire import OVERHEAD
from service.registry import open_registry

WKEY = "wkey-456"
N, BATCH = 200, 40  # 5 batches
MODEL = "all-MiniLM-L6-v2"  # installed with the test extras; loaded from disk, no download
TEXTS = [f"definition {i}: a {w} that is {i % 7} times as {a} as the last one" for i, (w, a) in
         enumerate(zip(["dog", "river", "idea", "engine", "song"] * 40, ["large", "calm", "old", "bright"] * 50))]


def _rotation(seed: int, d: int = 384) -> np.ndarray:
    """An orthogonal (d, d) float32 matrix: v1 of a text map is R, v2 is -R (never the same vectors)."""
    return np.linalg.qr(np.random.default_rng(100 + seed).standard_normal((d, d)))[0].astype(np.float32)


class _MoveOnce:
    """``move()`` once: after the first answer of a route ending in ``route`` has arrived, before the next
    request; ``calls`` counts that route's requests."""

    def arm(self, move, route: str) -> None:
        self.move, self.route, self.calls = move, route, 0

    def answered(self, request: httpx.Request) -> None:
        if request.url.path.endswith(self.route):
            self.calls += 1
            if self.calls == 1:
                self.move()


class MoveAfterFirst(_MoveOnce, httpx.HTTPTransport):
    """The network, and :class:`_MoveOnce`."""

    def __init__(self, move, route: str = "/search") -> None:
        super().__init__()
        self.arm(move, route)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        response.read()
        self.answered(request)
        return response


class AsyncMoveAfterFirst(_MoveOnce, httpx.AsyncHTTPTransport):
    """The network for ``AsyncClient``, and :class:`_MoveOnce` (``move()`` itself blocks the loop meanwhile)."""

    def __init__(self, move, route: str = "/search") -> None:
        super().__init__()
        self.arm(move, route)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        await response.aread()
        self.answered(request)
        return response


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Spaces a, b (16-d) and c (16-d); a2b v1 the planted rotation (row i of X onto row i of Y) and v2 its negation
    (row i onto -Y[i]: never its own row); b2c v1 a rotation R and v2 its negation; steer ``flip`` in b: v1 W = 0,
    v2 W = -2 I (q -> -q). Indexes ``in-b`` (rows Y) and ``in-c`` (rows Y R)."""
    tmp = tmp_path_factory.mktemp("client-pins")
    limits = {"VECBRIDGE_MAX_BATCH": str(BATCH), "VECBRIDGE_MAX_BODY_BYTES": str(OVERHEAD + 24_000)}
    with seeded_uvicorn(tmp, limits) as (url, (X, Y, m)):
        data = tmp / "data"
        reg = open_registry(f"sqlite:///{(data / 'registry.sqlite').resolve()}", (data / "artifacts").resolve())
        try:
            reg.register_version("a2b", fit_procrustes(X, -Y), source_space="a", target_space="b", method="procrustes",
                                 params={})
            R, _ = np.linalg.qr(np.random.default_rng(7).standard_normal((16, 16)))
            reg.register_space("c", 16)
            for sign in (1, -1):
                reg.register_version("b2c", LinearMap(sign * R.astype(np.float32)), source_space="b", target_space="c",
                                     method="procrustes", params={})
            eye = np.eye(16, dtype=np.float32)
            reg.register_steer("flip", Steer(np.zeros((16, 1)), np.zeros((16, 1))), space="b")
            reg.register_steer("flip", Steer(-2 * eye, eye), space="b")
            reg.register_space("minilm", 384, encoder=MODEL)  # texts: minilm -> t1 -> t2, each map v1 = R, v2 = -R
            for hop, (src, dst) in enumerate((("minilm", "t1"), ("t1", "t2"))):
                reg.register_space(dst, 384)
                for sign in (1, -1):
                    reg.register_version(f"{src}2{dst}", LinearMap(sign * _rotation(hop)), source_space=src,
                                         target_space=dst, method="procrustes", params={})
        finally:
            reg.close()
        with Client(url, api_key=WKEY, batch_size=BATCH) as vb:
            for name, space, rows in (("in-b", "b", Y[:N]), ("in-c", "c", (Y[:N] @ R).astype(np.float32))):
                vb.create_index(name, space, rows[:BATCH])
                vb.add(name, rows[BATCH:])
        yield url, X[:N], Y[:N], m


def _top(answer: dict) -> list[int]:
    return [r[0]["id"] for r in answer["results"]]


def _maps(answer: dict) -> list[tuple[str, int]]:
    return [(m["name"], m["version"]) for m in answer["maps"]]


def _while_moving(url: str, move, method: str = "search", *args, kind: str = "sync", **kw):
    """``Client.<method>(*args, **kw)`` (``kind``: or ``AsyncClient``'s) in batches of BATCH rows, ``move()`` run
    between the first two."""
    route = {"search": "/search", "apply_steer": "/apply", "transform": "/transform", "embed": "/embeddings"}[method]
    transport = {"sync": MoveAfterFirst, "async": AsyncMoveAfterFirst}[kind](move, route)
    with CLIENTS[kind](url, api_key=WKEY, batch_size=BATCH, transport=transport) as vb:
        answer = getattr(vb, method)(*args, **kw)
    assert transport.calls == N // BATCH  # the call really went in 5 batches
    return answer


@both_clients
@pytest.mark.parametrize("named", [False, True], ids=["registry-path", "map-by-alias"])
def test_search_batches_keep_the_map_version_the_first_batch_used(world, named, client_kind):
    url, X, _, _ = world
    with Client(url, api_key=WKEY) as mover:
        mover.set_alias("a2b", "prod", 1)
        answer = _while_moving(url, lambda: mover.set_alias("a2b", "prod", 2), "search", "in-b", X, space="a", k=1,
                               kind=client_kind, **({"map": "a2b@prod"} if named else {}))
        assert _maps(answer) == [("a2b", 1)]
        assert _top(answer) == list(range(N))  # every query through v1 (v2 would send row i to -Y[i])
        after = mover.search("in-b", X[:3], space="a", k=1, **({"map": "a2b@prod"} if named else {}))
        assert _maps(after) == [("a2b", 2)] and _top(after) != [0, 1, 2]  # the alias did move meanwhile


def test_search_batches_keep_a_path_of_two_maps(world):
    url, X, _, _ = world
    with Client(url, api_key=WKEY) as mover:
        mover.set_alias("a2b", "prod", 1)
        mover.set_alias("b2c", "prod", 1)
        answer = _while_moving(url, lambda: mover.set_alias("b2c", "prod", 2), "search", "in-c", X, space="a", k=1)
        assert _maps(answer) == [("a2b", 1), ("b2c", 1)]
        assert _top(answer) == list(range(N))
        assert _maps(mover.search("in-c", X[:1], space="a", k=1)) == [("a2b", 1), ("b2c", 2)]

        # the pin itself, as a client of the route sends it: a path in order; one that does not lead there is a 422
        pinned = mover.search("in-c", X[:5], space="a", k=1, map=["a2b:1", "b2c:1"])
        assert _maps(pinned) == [("a2b", 1), ("b2c", 1)] and _top(pinned) == list(range(5))
        for wrong in (["b2c:1", "a2b:1"], ["a2b:1"], ["a2b:1", "b2c:1", "b2c:1"]):
            with pytest.raises(Exception) as err:
                mover.search("in-c", X[:1], space="a", map=wrong)
            assert err.value.status == 422 and "but the request needs a -> c" in err.value.message


def test_search_batches_keep_the_steer_version_the_first_batch_used(world):
    url, _, Y, _ = world
    with Client(url, api_key=WKEY) as mover:
        mover.set_steer_alias("flip", "prod", 1)
        answer = _while_moving(url, lambda: mover.set_steer_alias("flip", "prod", 2), "search", "in-b", Y, k=1,
                                      steers={"flip@prod": 1.0})
        assert [(s["name"], s["version"]) for s in answer["steers"]] == [("flip", 1)]
        assert _top(answer) == list(range(N))  # v1 leaves the queries as they are; v2 would negate them


def test_steer_apply_batches_keep_the_steer_version_the_first_batch_used(world):
    url, _, Y, _ = world
    with Client(url, api_key=WKEY) as mover:
        mover.set_steer_alias("flip", "prod", 1)
        out = _while_moving(url, lambda: mover.set_steer_alias("flip", "prod", 2), "apply_steer", "flip@prod", Y)
        np.testing.assert_allclose(out, Y, atol=1e-6)  # v1 (W = 0) for every row; v2 would give -Y


@both_clients
@pytest.mark.parametrize("binary", [True, False])
def test_transform_batches_keep_the_map_version_the_first_batch_used(world, binary, client_kind):
    url, X, _, m = world
    with Client(url, api_key=WKEY) as mover:
        mover.set_alias("a2b", "prod", 1)
        out, used = _while_moving(url, lambda: mover.set_alias("a2b", "prod", 2), "transform", "a2b@prod", X,
                                  binary=binary, kind=client_kind, with_versions=True)
        assert used == ["a2b:1"]  # the version every batch went through, to record beside the vectors
        assert mover.transform("a2b@prod", X[:2], binary=binary, with_versions=True)[1] == ["a2b:2"]
    np.testing.assert_allclose(out, m.apply(X, output="raw"), atol=1e-5)


@pytest.mark.parametrize("named", [False, True], ids=["registry-path", "map-by-alias"])
def test_embed_batches_keep_the_map_version_the_first_batch_used(world, named):
    url = world[0]
    with Client(url, api_key=WKEY) as mover:
        raw = mover.embed(TEXTS, MODEL)  # the model's own space: no map
        mover.set_alias("minilm2t1", "prod", 1)
        out = _while_moving(url, lambda: mover.set_alias("minilm2t1", "prod", 2), "embed", TEXTS, MODEL,
                            target_space="t1", **({"map": "minilm2t1@prod"} if named else {}))
        np.testing.assert_allclose(out, raw @ _rotation(0), atol=1e-4)  # every batch through v1 (v2 gives -raw R)
        after = mover.embed(TEXTS[:2], MODEL, target_space="t1", **({"map": "minilm2t1@prod"} if named else {}))
        np.testing.assert_allclose(after, -raw[:2] @ _rotation(0), atol=1e-4)  # the alias did move meanwhile


def test_embed_batches_keep_a_path_of_two_maps_and_the_answer_names_it(world):
    url = world[0]
    with Client(url, api_key=WKEY) as mover:
        raw = mover.embed(TEXTS, MODEL)
        mover.set_alias("minilm2t1", "prod", 1)
        mover.set_alias("t12t2", "prod", 1)
        out, used = _while_moving(url, lambda: mover.set_alias("t12t2", "prod", 2), "embed", TEXTS, MODEL,
                                  target_space="t2", with_versions=True)
        np.testing.assert_allclose(out, raw @ _rotation(0) @ _rotation(1), atol=1e-4)
        assert used == ["minilm2t1:1", "t12t2:1"]  # the path every batch went through
        assert mover.embed(TEXTS[:1], MODEL, with_versions=True)[1] == []  # the model's own space: no map

        # the route itself, as any client sends it: `maps` says which versions; `map` pins a path, checked hop by hop
        def post(**extra) -> httpx.Response:
            return httpx.post(f"{url}/v1/embeddings", headers={"Authorization": f"Bearer {WKEY}"}, timeout=60,
                              json={"input": TEXTS[:2], "model": MODEL, **extra})

        moved = post(target_space="t2").json()
        assert [(m["name"], m["version"]) for m in moved["maps"]] == [("minilm2t1", 1), ("t12t2", 2)]
        pinned = post(target_space="t2", map=["minilm2t1:1", "t12t2:1"])
        assert pinned.status_code == 200, pinned.text
        assert [(m["name"], m["version"]) for m in pinned.json()["maps"]] == [("minilm2t1", 1), ("t12t2", 1)]
        np.testing.assert_allclose([e["embedding"] for e in pinned.json()["data"]], out[:2], atol=1e-4)
        for wrong in (["t12t2:1", "minilm2t1:1"], ["minilm2t1:1"], "t12t2:1"):
            r = post(target_space="t2", map=wrong)
            assert r.status_code == 422 and "but the request needs minilm -> t2" in r.json()["error"]["message"], r.text
        r = post(map="minilm2t1:1")  # a map says how to reach target_space, which is missing
        assert r.status_code == 422 and "target_space" in r.json()["error"]["message"], r.text
