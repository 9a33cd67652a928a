"""Conflicting writes from many clients at once against one real ``vecbridge serve`` (and ``--workers 2``).

Each case starts ``CLIENTS`` threads behind a barrier, all writing the same thing in different ways. Where only
one write can stand, exactly one wins and every other client gets a 409 whose message says what clashed; where
the writes commute (alias moves, automatic ids), every one is acknowledged and the end state is one of them.
Never a 5xx. Afterwards ``vecbridge registry verify`` is clean and what the server answers agrees with what
the clients were told.
"""

from __future__ import annotations

import itertools
import subprocess
import threading

import numpy as np
import pytest

from .helpers import DIM, Server, W, fit_body, wait_job

CLIENTS = 6
ROUNDS = 3
_names = itertools.count()


@pytest.fixture(scope="module", params=[None, 2], ids=["one-process", "two-workers"])
def server(request, tmp_path_factory):
    data = tmp_path_factory.mktemp("conflicts") / "data"
    # one key fires CLIENTS fits at once here; the per-key share of the queue (half of it, with the two write keys
    # these servers have) is not what these tests are about: that key may fill the whole queue
    with Server(data, workers=request.param, log_path=data.parent / "server.log",
                env={"VECBRIDGE_MAX_QUEUED_JOBS_PER_KEY": "8"}) as srv:
        yield srv


def at_once(server: Server, fn, n: int = CLIENTS) -> list:
    """``fn(client, i)`` for i in 0..n-1 in ``n`` threads released together (each its own connection); the
    responses in order. A 5xx fails the test."""
    barrier = threading.Barrier(n)
    out: list = [None] * n
    errors: list = []

    def run(i):
        try:
            with server.client(W, timeout=60) as c:
                barrier.wait(30)
                out[i] = fn(c, i)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    for r in out:
        assert r.status_code < 500, f"{r.request.method} {r.request.url}: {r.status_code} {r.text[:400]}"
    return out


def one_winner(responses, ok: int, words: str) -> int:
    """Exactly one response is ``ok``; every other is a 409 whose message contains ``words``. The winner's index."""
    codes = [r.status_code for r in responses]
    assert codes.count(ok) == 1 and codes.count(409) == len(codes) - 1, codes
    for r in responses:
        if r.status_code == 409:
            msg = r.json()["error"]["message"]
            assert words in msg, msg
    return codes.index(ok)


def verify(server: Server) -> None:
    p = subprocess.run(["vecbridge", "--data-dir", str(server.data_dir), "registry", "verify"], check=False,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


def rows(seed: int, n: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def test_same_explicit_id_added_by_many_clients(server):
    with server.client(W) as c:
        c.post("/v1/spaces", json={"name": "b", "dim": DIM})
        name = f"ids{next(_names)}"
        assert c.post("/v1/indexes", json={"name": name, "space": "b", "vectors": rows(0, 2).tolist()}).status_code \
            == 201
    for rnd in range(ROUNDS):
        the_id = 100 + rnd
        got = at_once(server, lambda c, i, rnd=rnd, the_id=the_id: c.post(f"/v1/indexes/{name}/vectors", json={
            "vectors": rows(1000 * rnd + i).tolist(), "ids": [the_id], "payloads": [{"client": i}]}))
        win = one_winner(got, 200, "already in index")
        with server.client(W) as c:
            r = c.post(f"/v1/indexes/{name}/search", json={"vectors": rows(1000 * rnd + win).tolist(), "k": 20,
                                                           "exact": True, "include_payloads": True})
            hits = r.json()["results"][0]
            assert [h["id"] for h in hits].count(the_id) == 1, hits
            assert hits[0]["id"] == the_id and hits[0]["payload"] == {"client": win}, hits[:2]
            assert c.get(f"/v1/indexes/{name}").json()["count"] == 2 + rnd + 1


def test_automatic_ids_from_many_clients_never_collide(server):
    name = f"auto{next(_names)}"
    with server.client(W) as c:
        c.post("/v1/spaces", json={"name": "b", "dim": DIM})
        assert c.post("/v1/indexes", json={"name": name, "space": "b", "vectors": rows(0, 2).tolist()}).status_code \
            == 201
    got = at_once(server, lambda c, i: c.post(f"/v1/indexes/{name}/vectors", json={"vectors": rows(i, 3).tolist()}))
    assert all(r.status_code == 200 for r in got), [r.text for r in got]
    ids = [i for r in got for i in r.json()["ids"]]
    assert len(set(ids)) == len(ids) == 3 * CLIENTS and not set(ids) & {0, 1}, ids
    with server.client(W) as c:
        assert c.get(f"/v1/indexes/{name}").json()["count"] == 2 + 3 * CLIENTS


def test_same_index_created_by_many_clients(server):
    with server.client(W) as c:
        c.post("/v1/spaces", json={"name": "b", "dim": DIM})
    name = f"made{next(_names)}"
    got = at_once(server, lambda c, i: c.post("/v1/indexes", json={"name": name, "space": "b",
                                                                   "vectors": rows(i, 1 + i).tolist()}))
    win = one_winner(got, 201, "already exists")
    with server.client(W) as c:
        assert c.get(f"/v1/indexes/{name}").json()["count"] == 1 + win


def test_same_space_with_different_dims(server):
    name = f"sp{next(_names)}"
    got = at_once(server, lambda c, i: c.post("/v1/spaces", json={"name": name, "dim": 4 + i}))
    win = one_winner(got, 201, f"space {name!r} is")
    with server.client(W) as c:
        assert c.get(f"/v1/spaces/{name}").json()["dim"] == 4 + win
    verify(server)


def test_same_space_registered_by_many_clients_is_created_once(server):
    """POST /v1/spaces is an upsert: 201 for the one request that created the space, 200 for every other (it
    found the space and set its description), decided in each write's transaction, whichever process answers."""
    name = f"up{next(_names)}"
    got = at_once(server, lambda c, i: c.post("/v1/spaces", json={"name": name, "dim": 4, "description": f"d{i}"}))
    codes = sorted(r.status_code for r in got)
    assert codes == [200] * (CLIENTS - 1) + [201], codes
    assert len({r.json()["created_at"] for r in got}) == 1, [r.text for r in got]
    verify(server)


def _fitted(server: Server, name: str, n: int, src: str = "a", alias: str | None = None) -> list[int]:
    with server.client(W) as c:
        out = []
        for k in range(n):
            body = fit_body(name, n=32, seed=k, src=src, tgt="b", **({"alias": alias} if alias else {}))
            r = c.post("/v1/fits", json=body)
            assert r.status_code == 202, r.text
            job = wait_job(c, r.json()["id"])
            assert job["state"] == "succeeded", job
            out.append(job["result"]["version"]["version"])
        return out


def test_alias_moved_by_many_clients(server):
    name = f"al{next(_names)}"
    versions = _fitted(server, name, CLIENTS)
    for _ in range(ROUNDS):
        got = at_once(server, lambda c, i: c.put(f"/v1/maps/{name}/aliases/prod", json={"version": versions[i]}))
        assert all(r.status_code == 200 for r in got), [r.text for r in got]
        with server.client(W) as c:
            final = c.get(f"/v1/maps/{name}").json()["aliases"]["prod"]
            assert final in versions
            assert c.post(f"/v1/maps/{name}/transform", json={"vectors": rows(0).tolist()}).json()["version"] == final
    verify(server)


def test_alias_moved_onto_a_version_being_deleted(server):
    """Half the clients point ``prod`` at version 2, half delete version 2: either the move came first (200;
    the alias now names a deleted version: 404 on resolve) or the delete did (409 naming the deleted version)."""
    name = f"ad{next(_names)}"
    _fitted(server, name, 2, alias="prod")
    with server.client(W) as c:
        assert c.put(f"/v1/maps/{name}/aliases/prod", json={"version": 1}).status_code == 200

    def act(c, i):
        if i % 2:
            return c.delete(f"/v1/maps/{name}/versions/2")
        return c.put(f"/v1/maps/{name}/aliases/prod", json={"version": 2})

    got = at_once(server, act)
    moves = [r for i, r in enumerate(got) if i % 2 == 0]
    assert all(r.status_code == 200 for i, r in enumerate(got) if i % 2), [r.text for r in got]
    assert all(r.status_code in (200, 409) for r in moves), [r.text for r in moves]
    for r in moves:
        if r.status_code == 409:
            assert "deleted version 2" in r.json()["error"]["message"], r.text
    with server.client(W) as c:
        prod = c.get(f"/v1/maps/{name}").json()["aliases"]["prod"]
        resolved = c.post(f"/v1/maps/{name}@prod/transform", json={"vectors": rows(0).tolist()})
        if any(r.status_code == 200 for r in moves):
            assert prod == 2 and resolved.status_code == 404, resolved.text
        else:
            assert prod == 1 and resolved.json()["version"] == 1
    verify(server)


def test_fits_of_one_name_from_different_spaces(server):
    """Concurrent first fits of one map name from different source spaces: one binds the name, the others fail
    with a conflict naming the spaces; versions are 1..N of the winning space only."""
    name = f"bind{next(_names)}"
    got = at_once(server, lambda c, i: c.post("/v1/fits", json=fit_body(name, n=32, seed=i, src=f"s{i % 2}",
                                                                          tgt="b")))
    jobs = []
    with server.client(W) as c:
        for r in got:
            if r.status_code == 409:  # the name was bound by the time this request was checked
                assert "goes" in r.json()["error"]["message"] or "map" in r.json()["error"]["message"], r.text
                continue
            assert r.status_code == 202, r.text
            jobs.append(wait_job(c, r.json()["id"]))
        ok = [j for j in jobs if j["state"] == "succeeded"]
        spaces = {j["result"]["version"]["source_space"] for j in ok}
        assert len(spaces) == 1, spaces
        for j in jobs:
            if j["state"] != "succeeded":
                assert j["state"] == "failed" and j["error"]["type"] == "ConflictError", j
        vs = c.get(f"/v1/maps/{name}/versions").json()["data"]
        assert [v["version"] for v in vs] == list(range(1, len(ok) + 1))
    verify(server)


def test_one_idempotency_key_with_different_bodies(server):
    name = f"idem{next(_names)}"
    got = at_once(server, lambda c, i: c.post("/v1/fits", json=fit_body(name, n=32, seed=i, src="a", tgt="b"),
                                              headers={"Idempotency-Key": f"key-{name}"}))
    win = one_winner(got, 202, "Idempotency-Key")
    with server.client(W) as c:
        job = wait_job(c, got[win].json()["id"])
        assert job["state"] == "succeeded", job
        assert [v["version"] for v in c.get(f"/v1/maps/{name}/versions").json()["data"]] == [1]
