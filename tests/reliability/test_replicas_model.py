"""Two replicas on one data dir, checked by a model: a hypothesis state machine drives two real servers over
real HTTP — ``vecbridge serve`` and ``uvicorn --workers 2`` (so the second replica is two processes itself) — on
one data dir (its SQLite registry, or one PostgreSQL database; one artifact store, one ``indexes/`` folder), with
a random interleaving of writes through either replica, and after every step compares what BOTH answer with a
plain Python model of the registry and the indexes.

Steps: fit a small paired map (procrustes on planted rotations: reliable; ridge with ``alpha=1e6``: flagged
unreliable, the map is constant), set / move / delete the ``prod`` alias, delete a version, create / drop an
index (a dropped name is sometimes created again), add rows (automatic ids, explicit ids, ids that clash: 409),
delete rows. And the same write through both replicas at once: two fits of one map (versions N+1 and N+2),
two ``prod`` moves (both 200, one stands), a ``prod`` move against a delete of its version (200 or a 409 naming
the deleted version), two removals of ``prod`` (one 204, one 404), overlapping row deletes (each live id counted
once), a drop against an add (200 or 404, gone afterwards), the same new id (one 200, one 409).

Invariants, in each replica, after each step:

* ``name:N`` answers version N while it is live, 404 once deleted;
* ``name@prod`` answers the version the model's alias names, 404 when unset or pointing at a deleted version;
* a bare ``name`` answers the same version in both: the live ``prod`` version, else the newest live version not
  flagged unreliable, else the newest live one; 404 when none is live; and a search from the map's source
  space goes through the path version (``prod``, else the newest reliable one; none: a 4xx);
* the same reference gives the same numbers in both replicas;
* an exact search with every acknowledged row as a query finds exactly the live ids (each row first for itself,
  cosine 1): no acknowledged add missing, no deleted id back; a dropped index is 404 in both;
* no 5xx anywhere.

The default run is a few short examples (about 15 s per registry backend on the 2-core CI box);
``pytest -m slow`` runs longer ones.
"""

from __future__ import annotations

import base64
import itertools
import os
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from .helpers import DIM, Server, W, fit_body, wait_job

PROCS = (0, 1)
_example = itertools.count()
STATS = {"examples": 0, "steps": 0, "requests": 0}


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def replicas(request, tmp_path_factory):
    """Two replicas on one data dir: ``vecbridge serve`` and ``uvicorn --workers 2`` (so process 1 is itself two
    workers that requests land on at random); the data dir's SQLite registry, or one PostgreSQL database."""
    data = tmp_path_factory.mktemp("replicas") / "data"
    env, drop = {}, None
    if request.param == "postgresql":
        env["VECBRIDGE_REGISTRY_URL"], drop = _pg_database()
    servers = []
    try:
        for i, workers in zip(PROCS, (None, 2)):
            servers.append(Server(data, workers=workers, env=env, log_path=data.parent / f"server{i}.log").start())
        clients = [s.client(W, timeout=60) for s in servers]
        yield servers, clients
        for c in clients:
            c.close()
    finally:
        for s in servers:
            s.stop()
        if drop is not None:
            drop()


def _pg_database():
    """A fresh database on the test PostgreSQL server: ``(url, drop)``; skip without one."""
    url = os.environ.get("VECBRIDGE_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("VECBRIDGE_TEST_POSTGRES_URL is not set (eval \"$(bash .ci/start_postgres.sh)\")")
    import psycopg

    name = f"vb_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')

    def drop():
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return url.rsplit("/", 1)[0] + "/" + name, drop


def both(fns) -> list:
    """``fns[0]()`` and ``fns[1]()`` at once (threads released together); their results in order."""
    barrier = threading.Barrier(len(fns))
    with ThreadPoolExecutor(len(fns)) as ex:
        futures = [ex.submit(lambda f=f: (barrier.wait(30), f())[1]) for f in fns]
        return [f.result() for f in futures]


class Replicas(RuleBasedStateMachine):
    """The model: maps ``{name: {"src": space, "versions": {v: {"deleted", "reliable"}}, "prod": v | None}}``,
    indexes ``{name: {id: row}}``; every request goes to a process the strategy picks."""

    clients: ClassVar[list[httpx.Client]] = []
    servers: ClassVar[list[Server]] = []

    def __init__(self) -> None:
        super().__init__()
        ex = next(_example)
        self.prefix = f"x{ex}"
        self.maps: dict[str, dict] = {}
        self.indexes: dict[str, dict[int, np.ndarray]] = {}
        self.rng = np.random.default_rng(ex)
        self.fits = self.created = 0
        self.dropped: set[str] = set()
        STATS["examples"] += 1
        self.space = {s: f"{self.prefix}{s}" for s in "abc"}  # spaces of this example only: paths see its maps
        for s in self.space.values():
            r = self.clients[ex % 2].post("/v1/spaces", json={"name": s, "dim": DIM})
            assert r.status_code == 201, r.text

    # --- plumbing -----------------------------------------------------------------------------
    def call(self, p: int, method: str, path: str, **kw) -> httpx.Response:
        STATS["requests"] += 1
        r = self.clients[p].request(method, path, **kw)
        assert self.servers[p].proc.poll() is None, f"process {p} died on {method} {path}"
        assert r.status_code < 500, f"process {p}: {method} {path} -> {r.status_code} {r.text[:400]}"
        return r

    def map_names(self) -> list[str]:
        return sorted(self.maps)

    def live(self, name: str) -> list[int]:
        return sorted(v for v, s in self.maps[name]["versions"].items() if not s["deleted"])

    def prod_live(self, name: str) -> int | None:
        m = self.maps[name]
        v = m["prod"]
        return v if v is not None and not m["versions"][v]["deleted"] else None

    def path_version(self, name: str) -> int | None:
        """What a search from the map's source space goes through: live prod, else newest live reliable."""
        pinned = self.prod_live(name)
        if pinned is not None:
            return pinned
        rel = [v for v in self.live(name) if self.maps[name]["versions"][v]["reliable"]]
        return rel[-1] if rel else None

    def bare_version(self, name: str) -> int | None:
        """What a bare name resolves to: the path version, else the newest live one (named: inspected)."""
        v = self.path_version(name)
        live = self.live(name)
        return v if v is not None else (live[-1] if live else None)

    # --- maps ---------------------------------------------------------------------------------
    @precondition(lambda self: self.fits < 8)
    @rule(p=st.sampled_from(PROCS), which=st.integers(0, 1), reliable=st.booleans(), prod=st.booleans())
    def fit(self, p, which, reliable, prod):
        name, src = f"{self.prefix}m{which}", self.space["ac"[which]]
        self.fits += 1
        kw = {} if reliable else {"method": "ridge", "params": {"alpha": 1e6}}
        if prod:
            kw["alias"] = "prod"
        body = fit_body(name, n=64, seed=int(self.rng.integers(1 << 30)), src=src, tgt=self.space["b"], **kw)
        r = self.call(p, "POST", "/v1/fits", json=body)
        assert r.status_code == 202, r.text
        job = wait_job(self.clients[p], r.json()["id"])
        assert job["state"] == "succeeded", job
        got = job["result"]["version"]
        m = self.maps.setdefault(name, {"src": src, "versions": {}, "prod": None})
        want = max(m["versions"], default=0) + 1
        assert got["version"] == want, f"{name}: fit registered version {got['version']}, the model says {want}"
        assert (got["metrics"].get("reliable") is not False) == reliable, got["metrics"]
        m["versions"][want] = {"deleted": False, "reliable": reliable}
        if prod and reliable:  # an unreliable fit does not take the alias (the job's notes say where it stays)
            m["prod"] = want
        elif prod:
            assert any("not moved" in n for n in job["result"]["notes"]), job["result"]

    @precondition(lambda self: self.maps)
    @rule(p=st.sampled_from(PROCS), data=st.data())
    def set_prod(self, p, data):
        name = data.draw(st.sampled_from(self.map_names()))
        m = self.maps[name]
        v = data.draw(st.sampled_from(sorted(m["versions"])))
        r = self.call(p, "PUT", f"/v1/maps/{name}/aliases/prod", json={"version": v})
        if m["versions"][v]["deleted"]:
            assert r.status_code == 409, r.text
            assert "deleted" in r.json()["error"]["message"]
        else:
            assert r.status_code == 200, r.text
            assert r.json()["version"] == v and "prod" in r.json()["aliases"]
            m["prod"] = v

    @precondition(lambda self: self.maps)
    @rule(p=st.sampled_from(PROCS), data=st.data())
    def delete_prod(self, p, data):
        name = data.draw(st.sampled_from(self.map_names()))
        r = self.call(p, "DELETE", f"/v1/maps/{name}/aliases/prod")
        assert r.status_code == (404 if self.maps[name]["prod"] is None else 204), r.text
        self.maps[name]["prod"] = None

    @precondition(lambda self: self.maps)
    @rule(p=st.sampled_from(PROCS), data=st.data())
    def delete_version(self, p, data):
        name = data.draw(st.sampled_from(self.map_names()))
        v = data.draw(st.sampled_from(sorted(self.maps[name]["versions"])))
        r = self.call(p, "DELETE", f"/v1/maps/{name}/versions/{v}")
        assert r.status_code == 200, r.text
        assert r.json()["deleted"] is True
        self.maps[name]["versions"][v]["deleted"] = True

    # --- indexes ------------------------------------------------------------------------------
    def rows(self, n: int) -> np.ndarray:
        return self.rng.standard_normal((n, DIM)).astype(np.float32)

    @precondition(lambda self: len(self.indexes) < 2)
    @rule(p=st.sampled_from(PROCS), n=st.integers(1, 4), data=st.data())
    def create_index(self, p, n, data):
        fresh = f"{self.prefix}i{self.created}"  # or the name of a dropped one: another index, same name
        name = data.draw(st.sampled_from([fresh, *sorted(self.dropped)]))
        self.created += 1
        self.dropped.discard(name)
        X = self.rows(n)
        r = self.call(p, "POST", "/v1/indexes", json={"name": name, "space": self.space["b"], "vectors": X.tolist(),
                                                      "kind": "flat"})
        assert r.status_code == 201, r.text
        self.indexes[name] = {i: X[i] for i in range(n)}

    @precondition(lambda self: self.indexes)
    @rule(p=st.sampled_from(PROCS), data=st.data(), n=st.integers(1, 3), how=st.sampled_from(["auto", "new", "clash"]))
    def add_rows(self, p, data, n, how):
        name = data.draw(st.sampled_from(sorted(self.indexes)))
        rows = self.indexes[name]
        X = self.rows(n)
        body: dict = {"vectors": X.tolist()}
        if how != "auto":
            ids = [int(i) for i in data.draw(st.lists(st.integers(0, 40), min_size=n, max_size=n, unique=True))]
            if how == "clash" and rows:  # one stored id among new ones (a repeat inside one request is a 409 too)
                taken = data.draw(st.sampled_from(sorted(rows)))
                ids = [taken, *[i for i in ids if i != taken]][:n]
            body["ids"] = ids
        r = self.call(p, "POST", f"/v1/indexes/{name}/vectors", json=body)
        if how != "auto" and set(body["ids"]) & set(rows):
            assert r.status_code == 409, r.text
            assert "already in index" in r.json()["error"]["message"]
            return
        assert r.status_code == 200, r.text
        ids = r.json()["ids"]
        if how != "auto":
            assert ids == body["ids"]
        assert not set(ids) & set(rows), f"automatic ids {ids} reuse live ids"
        rows.update({int(i): X[j] for j, i in enumerate(ids)})
        assert r.json()["count"] == len(rows)

    @precondition(lambda self: self.indexes)
    @rule(p=st.sampled_from(PROCS), data=st.data())
    def delete_rows(self, p, data):
        name = data.draw(st.sampled_from(sorted(self.indexes)))
        rows = self.indexes[name]
        ids = data.draw(st.lists(st.sampled_from(sorted(rows) + [41, 42]), min_size=1, max_size=3, unique=True))
        r = self.call(p, "POST", f"/v1/indexes/{name}/delete", json={"ids": ids})
        assert r.status_code == 200, r.text
        assert r.json()["deleted"] == len(set(ids) & set(rows)), (r.json(), ids, sorted(rows))
        for i in ids:
            rows.pop(i, None)

    @precondition(lambda self: self.indexes)
    @rule(p=st.sampled_from(PROCS), data=st.data())
    def drop_index(self, p, data):
        name = data.draw(st.sampled_from(sorted(self.indexes)))
        r = self.call(p, "DELETE", f"/v1/indexes/{name}")
        assert r.status_code == 204, r.text
        del self.indexes[name]
        self.dropped.add(name)
        for q in PROCS:
            assert self.call(q, "GET", f"/v1/indexes/{name}").status_code == 404

    # --- the same write through both processes at once ----------------------------------------
    @precondition(lambda self: self.fits < 8)
    @rule(which=st.integers(0, 1))
    def race_fits(self, which):
        """Both processes fit the same map at once: two new versions, numbered N+1 and N+2, none lost."""
        name, src = f"{self.prefix}m{which}", self.space["ac"[which]]
        self.fits += 2
        bodies = [fit_body(name, n=64, seed=int(self.rng.integers(1 << 30)), src=src, tgt=self.space["b"])
                  for _ in PROCS]
        got = both([lambda p=p: self.call(p, "POST", "/v1/fits", json=bodies[p]) for p in PROCS])
        jobs = [wait_job(self.clients[p], r.json()["id"]) for p, r in zip(PROCS, got)]
        assert all(j["state"] == "succeeded" for j in jobs), jobs
        m = self.maps.setdefault(name, {"src": src, "versions": {}, "prod": None})
        base = max(m["versions"], default=0)
        assert sorted(j["result"]["version"]["version"] for j in jobs) == [base + 1, base + 2], jobs
        for v in (base + 1, base + 2):
            m["versions"][v] = {"deleted": False, "reliable": True}

    @precondition(lambda self: self.maps)
    @rule(data=st.data())
    def race_prod(self, data):
        """Both processes move ``prod`` at once (to live versions): both acknowledged, one of them stands."""
        name = data.draw(st.sampled_from(self.map_names()))
        live = self.live(name)
        if not live:
            return
        vs = [data.draw(st.sampled_from(live)) for _ in PROCS]
        got = both([lambda p=p: self.call(p, "PUT", f"/v1/maps/{name}/aliases/prod", json={"version": vs[p]})
                    for p in PROCS])
        assert [r.status_code for r in got] == [200, 200], [r.text for r in got]
        now = self.call(0, "GET", f"/v1/maps/{name}").json()["aliases"].get("prod")
        assert now in vs, (now, vs)
        self.maps[name]["prod"] = now

    @precondition(lambda self: self.maps)
    @rule(data=st.data())
    def race_prod_and_delete(self, data):
        """One process points ``prod`` at version v while the other deletes v: either order is fine, but the
        answers must say which happened (200 then deleted: the alias names a deleted version; or 409)."""
        name = data.draw(st.sampled_from(self.map_names()))
        m = self.maps[name]
        v = data.draw(st.sampled_from(sorted(m["versions"])))
        p = data.draw(st.sampled_from(PROCS))
        move, delete = both([lambda: self.call(p, "PUT", f"/v1/maps/{name}/aliases/prod", json={"version": v}),
                             lambda: self.call(1 - p, "DELETE", f"/v1/maps/{name}/versions/{v}")])
        assert delete.status_code == 200, delete.text
        if move.status_code == 200:
            m["prod"] = v
        else:
            assert move.status_code == 409 and "deleted" in move.json()["error"]["message"], move.text
        m["versions"][v]["deleted"] = True

    @precondition(lambda self: self.maps)
    @rule(data=st.data())
    def race_delete_prod(self, data):
        """Both processes remove ``prod`` at once: one 204 when it was set, the other 404 (it is gone)."""
        name = data.draw(st.sampled_from(self.map_names()))
        got = both([lambda p=p: self.call(p, "DELETE", f"/v1/maps/{name}/aliases/prod") for p in PROCS])
        want = [204, 404] if self.maps[name]["prod"] is not None else [404, 404]
        assert sorted(r.status_code for r in got) == want, [(r.status_code, r.text) for r in got]
        self.maps[name]["prod"] = None

    @precondition(lambda self: self.indexes)
    @rule(data=st.data())
    def race_delete_rows(self, data):
        """Both processes delete overlapping ids at once: every live id is counted deleted exactly once."""
        name = data.draw(st.sampled_from(sorted(self.indexes)))
        rows = self.indexes[name]
        pool = sorted(rows) + [41]
        sets = [data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique=True)) for _ in PROCS]
        got = both([lambda p=p: self.call(p, "POST", f"/v1/indexes/{name}/delete", json={"ids": sets[p]})
                    for p in PROCS])
        assert all(r.status_code == 200 for r in got), [r.text for r in got]
        gone = (set(sets[0]) | set(sets[1])) & set(rows)
        assert sum(r.json()["deleted"] for r in got) == len(gone), ([r.json() for r in got], sets, sorted(rows))
        for i in gone:
            del rows[i]

    @precondition(lambda self: self.indexes)
    @rule(data=st.data(), p=st.sampled_from(PROCS))
    def race_drop_and_write(self, data, p):
        """One process drops an index while the other adds rows to it: the add is acknowledged before the drop
        (200) or finds it gone (404); either way the index is gone from both afterwards."""
        name = data.draw(st.sampled_from(sorted(self.indexes)))
        X = self.rows(1)
        drop, add = both([lambda: self.call(p, "DELETE", f"/v1/indexes/{name}"),
                          lambda: self.call(1 - p, "POST", f"/v1/indexes/{name}/vectors",
                                            json={"vectors": X.tolist()})])
        assert drop.status_code == 204, drop.text
        assert add.status_code in (200, 404), add.text
        del self.indexes[name]
        self.dropped.add(name)
        for q in PROCS:
            assert self.call(q, "GET", f"/v1/indexes/{name}").status_code == 404

    @precondition(lambda self: self.indexes)
    @rule(data=st.data())
    def race_same_id(self, data):
        """Both processes add the same new explicit id at once: one 200, one 409; the winner's row is stored."""
        name = data.draw(st.sampled_from(sorted(self.indexes)))
        rows = self.indexes[name]
        new = [i for i in range(41) if i not in rows]
        the_id = data.draw(st.sampled_from(new))
        X = self.rows(2)
        got = both([lambda p=p: self.call(p, "POST", f"/v1/indexes/{name}/vectors",
                                          json={"vectors": X[p:p + 1].tolist(), "ids": [the_id]}) for p in PROCS])
        codes = sorted(r.status_code for r in got)
        assert codes == [200, 409], [r.text for r in got]
        win = [r.status_code for r in got].index(200)
        assert "already in index" in got[1 - win].json()["error"]["message"], got[1 - win].text
        rows[the_id] = X[win]

    # --- invariants ---------------------------------------------------------------------------
    @invariant()
    def count_steps(self):
        STATS["steps"] += 1

    def transform(self, p: int, ref: str, Q: np.ndarray) -> tuple[int, int | None, np.ndarray | None]:
        r = self.call(p, "POST", f"/v1/maps/{ref}/transform", json={"vectors": Q.tolist(),
                                                                    "encoding_format": "base64"})
        if r.status_code != 200:
            assert r.status_code == 404, f"process {p} {ref}: {r.status_code} {r.text}"
            return r.status_code, None, None
        b = r.json()
        return 200, b["version"], np.frombuffer(base64.b64decode(b["vectors_b64"]), "<f4").reshape(b["shape"])

    @invariant()
    def references_agree(self):
        Q = np.random.default_rng(1).standard_normal((2, DIM)).astype(np.float32)
        for name, m in self.maps.items():
            refs = {f"{name}:{v}": (None if s["deleted"] else v) for v, s in m["versions"].items()}
            refs[f"{name}@prod"] = self.prod_live(name)
            refs[name] = self.bare_version(name)
            for ref, want in refs.items():
                got = [self.transform(p, ref, Q) for p in PROCS]
                for p, (status, version, _) in zip(PROCS, got):
                    assert (version if status == 200 else None) == want, \
                        f"process {p}: {ref} answered {status} version {version}; the model says {want}"
                if want is not None:
                    np.testing.assert_array_equal(got[0][2], got[1][2], err_msg=f"{ref}: processes differ")

    @invariant()
    def indexes_agree(self):
        for name, rows in self.indexes.items():
            live = sorted(rows)
            for p in PROCS:
                info = self.call(p, "GET", f"/v1/indexes/{name}")
                assert info.status_code == 200, info.text
                assert info.json()["count"] == len(live), f"process {p} {name}: count {info.json()['count']}, " \
                                                          f"model {len(live)}"
                if not live:
                    continue
                Q = np.stack([rows[i] for i in live])
                r = self.call(p, "POST", f"/v1/indexes/{name}/search",
                              json={"vectors": Q.tolist(), "k": len(live) + 2, "exact": True})
                assert r.status_code == 200, r.text
                for i, hits in zip(live, r.json()["results"]):
                    ids = [h["id"] for h in hits]
                    assert sorted(ids) == live, f"process {p} {name}: search saw {sorted(ids)}, live {live}"
                    assert ids[0] == i and hits[0]["score"] > 0.999, f"process {p} {name}: row {i} -> {hits[:2]}"

    @invariant()
    def searches_use_the_path_version(self):
        if not self.indexes:
            return
        name = min(self.indexes)
        Q = np.random.default_rng(2).standard_normal((1, DIM)).astype(np.float32)
        for mname in self.map_names():
            src = self.maps[mname]["src"]  # the only map from its space: path choice has one candidate
            want = self.path_version(mname)
            for p in PROCS:
                r = self.call(p, "POST", f"/v1/indexes/{name}/search", json={"vectors": Q.tolist(), "space": src,
                                                                             "k": 1})
                if want is None:
                    assert r.status_code in (404, 422), f"process {p}: search from {src}: {r.status_code} {r.text}"
                else:
                    assert r.status_code == 200, r.text
                    used = [(u["name"], u["version"]) for u in r.json()["maps"]]
                    assert used == [(mname, want)], f"process {p}: search from {src} used {used}, model {want}"


def _run(servers, clients, examples: int, steps: int, derandomize: bool = True) -> None:
    Replicas.servers, Replicas.clients = servers, clients
    run_state_machine_as_test(Replicas, settings=settings(
        max_examples=examples, stateful_step_count=steps, deadline=None, database=None, derandomize=derandomize,
        suppress_health_check=list(HealthCheck)))
    print(f"\nreplicas model: {STATS['examples']} examples, {STATS['steps']} checks of the invariants, "
          f"{STATS['requests']} requests, 0 disagreements")


def test_two_replicas_agree_with_the_model(replicas):
    _run(*replicas, examples=3, steps=12)


@pytest.mark.slow
def test_two_replicas_agree_with_the_model_long(replicas):
    _run(*replicas, examples=30, steps=40, derandomize=False)  # new interleavings on every run
