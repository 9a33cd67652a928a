"""``POST /v1/migrations``: a vector-database migration as a job of a real ``uvicorn`` server process, against a real
Milvus Lite server process (its own gRPC server, so this test and the service share it), over real HTTP.

Before, the HTTP API had no route for a migration (the console said so); a service deployed beside the database
could only be told to migrate by someone with a shell.
"""

from __future__ import annotations

import re
import time

import httpx
import numpy as np
import pytest
from _api_support import R, W, settings_for
from _jobs_support import wait_http_job
from _servers import seeded_uvicorn
from _vectordb_servers import milvus_url  # noqa: F401  (module-scoped server fixture)
from fastapi.testclient import TestClient

from service.api.vectordb_schemas import CollectionSearchResponse
from service.vectordb import open_store


def _store_url(milvus_http: str) -> str:
    return "milvus://" + milvus_http.split("://", 1)[1]


@pytest.fixture(scope="module")
def world(milvus_url, tmp_path_factory):  # noqa: F811
    """A service whose VECBRIDGE_VECTORDB_URL is the Milvus server, a 300-row collection ``h_src`` in space ``a``."""
    tmp = tmp_path_factory.mktemp("mighttp")
    url = _store_url(milvus_url)
    with seeded_uvicorn(tmp, {"VECBRIDGE_VECTORDB_URL": url}) as (base, (X, _, m)):
        with open_store(url) as s:
            for name in ("h_src", "h_dst", "h_dry", "h_cut", "h_taken", "h_ver", "h_cli", "h_list", "h_keep", "h_bad",
                         "h_kver"):
                s.drop(name)
            s.create("h_src", X.shape[1])
            s.set_space("h_src", "a")
            s.upsert("h_src", np.arange(300) * 3, X[:300], [f"t{i}" for i in range(300)],
                     {"n": list(range(300))})
            s.finalize("h_src")
        with httpx.Client(base_url=base, headers=W, timeout=60) as client:
            yield {"client": client, "url": url, "X": X[:300], "map": m, "data": tmp / "data", "base": base}


def _post(world, **body):
    return world["client"].post("/v1/migrations", json=body)


def test_a_migration_job_writes_the_target_and_switches_the_alias(world):
    r = _post(world, source="h_src", target="h_dst", map="a2b", alias="h_live", batch_size=64)
    assert r.status_code == 202 and r.headers["location"] == f"/v1/jobs/{r.json()['id']}", r.text
    assert r.json()["kind"] == "migration" and "h_src -> h_dst through a2b:1" in r.json()["description"]
    job = wait_http_job(world["client"], r.json()["id"])
    assert job["state"] == "succeeded", job
    rep = job["result"]["report"]
    assert rep["rows"] == 300 and rep["rows_this_run"] == 300 and rep["batches"] == 5
    assert rep["extra"]["fields"] == ["n", "text"] and rep["extra"]["space_check"] == "checked: a"
    assert job["progress"]["fraction"] == 1.0 and job["result"]["map"] == "a2b:1"
    assert job["result"]["checkpoint"] == str(world["data"] / "migrations" / "h_src-to-h_dst.json")
    with open_store(world["url"]) as s:
        assert s.resolve_alias("h_live") == "h_dst" and s.get_space("h_dst") == "b"
        b = s.fetch("h_live", np.arange(300) * 3, with_fields=True)
        np.testing.assert_allclose(b.vectors, world["map"].apply(world["X"], output="raw"), rtol=1e-5, atol=1e-5)
        assert b.texts[7] == "t7" and b.fields["n"][7] == 7
    again = wait_http_job(world["client"], _post(world, source="h_src", target="h_dst", map="a2b").json()["id"])
    assert again["state"] == "succeeded" and again["result"]["report"]["already_finished"]  # its checkpoint says so


def test_a_dry_run_job_writes_nothing(world):
    job = wait_http_job(world["client"], _post(world, source="h_src", target="h_dry", map="a2b", alias="h_dry_live",
                                               dry_run=True, batch_size=100).json()["id"])
    assert job["state"] == "succeeded", job
    x = job["result"]["report"]["extra"]
    assert x["dry_run"] and x["start"] == "create" and x["rows_to_write"] == 300 and x["sample_rows"] == 100
    with open_store(world["url"]) as s:
        assert not s.exists("h_dry") and s.resolve_alias("h_dry_live") is None
    assert not (world["data"] / "migrations" / "h_src-to-h_dry.json").exists()


def test_a_cancelled_migration_resumes_from_its_checkpoint(world):
    c = world["client"]
    r = _post(world, source="h_src", target="h_cut", map="a2b", batch_size=20, pause=0.2)
    jid = r.json()["id"]
    deadline = time.monotonic() + 60
    while True:  # until at least one batch is written: the stage alone was reached before the first batch was,
        j = c.get(f"/v1/jobs/{jid}").json()  # and a cancel then left 0 rows (a CI run under load)
        if j["progress"]["stage"] == "migrate" and j["progress"]["fraction"] > 0:
            break
        assert time.monotonic() < deadline and j["state"] in ("queued", "running"), j
        time.sleep(0.02)
    assert c.delete(f"/v1/jobs/{jid}").status_code in (200, 202)
    job = wait_http_job(c, jid)
    assert job["state"] == "cancelled", job
    done = round(job["progress"]["fraction"] * 300)
    assert 0 < done < 300
    job = wait_http_job(c, _post(world, source="h_src", target="h_cut", map="a2b", batch_size=100).json()["id"])
    rep = job["result"]["report"]
    assert job["state"] == "succeeded" and rep["resumed_from"] is not None, job
    assert rep["rows"] == 300 and 0 < rep["rows_this_run"] < 300  # the rest only


def test_a_migration_job_keeps_the_re_embedded_rows_own_vectors(world):
    """``keep``: the rows re-embedded to fit the map are written with their given vectors, the others mapped; an
    id no source row has is counted in the report, not refused."""
    m, rows = world["map"], np.array([4, 0, 150, 299])
    Y = np.random.default_rng(7).normal(size=(5, m.target_dim)).astype(np.float32)
    Y /= np.linalg.norm(Y, axis=1, keepdims=True)
    keep = {"ids": [int(i) * 3 for i in rows] + [1], "vectors": Y.tolist()}  # 1: no id of h_src (0, 3, 6, ...)
    job = wait_http_job(world["client"], _post(world, source="h_src", target="h_keep", map="a2b", batch_size=64,
                                               keep=keep).json()["id"])
    assert job["state"] == "succeeded", job
    rep = job["result"]["report"]
    assert rep["rows"] == 300 and rep["kept"] == 4 and rep["keep_not_found"] == 1
    row = {d["name"]: d for d in world["client"].get("/v1/migrations").json()["data"]}["h_src-to-h_keep"]
    assert row["keep_rows"] == 5 and row["kept"] == 4 and re.fullmatch("[0-9a-f]{12}", row["keep_digest"]), row
    with open_store(world["url"]) as s:
        got = s.fetch("h_keep", np.arange(300) * 3).vectors
    np.testing.assert_allclose(got[rows], Y[:4], rtol=0, atol=1e-6)
    others = np.setdiff1d(np.arange(300), rows)
    np.testing.assert_allclose(got[others], m.apply(world["X"], output="raw")[others], rtol=1e-5, atol=1e-5)
    assert not np.allclose(m.apply(world["X"][rows], output="raw"), Y[:4], atol=1e-2)


def test_a_bad_keep_set_is_refused_before_a_job_exists(world):
    d = world["map"].target_dim
    cases = [({"ids": [0, 3], "vectors": [[0.1] * d]}, "keep ids list 2"),
             ({"ids": [0], "vectors": [[0.1] * (d + 1)]}, f"map's target (the new model) is {d}-d"),
             ({"ids": [3, 3], "vectors": [[0.1] * d] * 2}, "more than once"),
             ({"ids": [0], "vectors": [[0.1] * d], "rows": [1]}, "rows"),
             ({"ids": [True], "vectors": [[0.1] * d]}, "ids")]
    for keep, word in cases:
        r = _post(world, source="h_src", target="h_bad", map="a2b", keep=keep)
        assert r.status_code == 422 and word in r.json()["error"]["message"], (keep, r.text)
    with open_store(world["url"]) as s:
        assert not s.exists("h_bad")


def test_refusals_before_and_inside_the_job(world):
    c = world["client"]
    cases = [({"source": "h_src", "target": "x1", "map": "nope"}, 404, "nope"),
             ({"source": "h src", "target": "x1", "map": "a2b"}, 422, "collection name"),
             ({"source": "h_src", "target": "x1", "map": "/etc/passwd.npz"}, 422, "no path separators"),
             ({"source": "h_src", "target": "x1", "map": "a2b", "batch_size": 0}, 422, "batch_size"),
             ({"source": "h_src", "target": "x1", "map": "a2b", "pause": 1e9}, 422, "pause"),
             ({"source": "h_src", "target": "x1", "map": "a2b", "store": "milvus://evil:1"}, 422, "store"),
             ({"source": "h_src", "target": "x1", "map": "a2b", "index": "flat"}, 422, "index"),
             # refused as the request comes (its job failed, or ran ignoring the option), naming the JSON field
             ({"source": "h_src", "target": "h_src", "map": "a2b"}, 422, "target 'h_src' is the source"),
             ({"source": "h_src", "target": "x1", "map": "a2b", "index": "hnsw"}, 422,
              "index 'hnsw' is for a PostgreSQL target; a milvus target is made with the source collection's own"),
             ({"source": "h_src", "target": "x1", "map": "a2b", "vector_field": "emb"}, 422,
              "source 'h_src' has no vector field 'emb'; it has fields id, vector"),
             ({"source": "h_src", "target": "x1", "map": "a2b", "id_field": "pk"}, 422,
              "source 'h_src' has no id field 'pk'; it has primary key 'id': fix id_field"),
             ({"source": "missing", "target": "x1", "map": "a2b"}, 404, "no collection")]
    for body, status, word in cases:
        r = c.post("/v1/migrations", json=body)
        assert r.status_code == status, (body, r.text)
        assert word is None or word in r.json()["error"]["message"], (body, r.text)
    assert c.post("/v1/migrations", json={"source": "h_src", "target": "x1", "map": "a2b"},
                  headers=R).status_code == 403  # a read-only key
    with open_store(world["url"]) as s:
        s.drop("h_taken")
        s.create("h_taken", 16)  # a collection no migration of this service made
    r = _post(world, source="h_src", target="h_taken", map="a2b")  # was a 202 whose job failed in the CLI's words
    assert r.status_code == 409 and "target 'h_taken' exists; send overwrite: true" in r.json()["error"]["message"]
    with open_store(world["url"]) as s:
        assert s.count("h_taken") == 0


def test_without_a_vector_database_the_route_says_so(tmp_path):
    from service.api import create_app

    with TestClient(create_app(settings_for(tmp_path))) as client:
        r = client.post("/v1/migrations", json={"source": "a", "target": "b", "map": "m"}, headers=W)
    assert r.status_code == 503 and "VECBRIDGE_VECTORDB_URL" in r.json()["error"]["message"]


def test_the_python_client_queues_and_follows_a_migration(world):
    from service.client import Client, NotFoundError

    with Client(world["base"], api_key=W["Authorization"].split()[1]) as vb:
        job = vb.wait(vb.migrate("h_src", "h_dry2", "a2b", dry_run=True, batch_size=50)["id"])
        assert job["result"]["report"]["extra"]["rows_to_write"] == 300
        with pytest.raises(NotFoundError):
            vb.migrate("h_src", "h_dry2", "no-such-map")
        vb.wait(vb.migrate("h_src", "h_cli", "a2b")["id"])
        assert vb.wait(vb.verify("h_cli", source="h_src", map="a2b")["id"])["result"]["verdict"] == "PASS"
        out = vb.search_collection("h_cli", world["X"][:4], space="a", k=1)  # h_cli records space b
        assert [h[0]["id"] for h in out["results"]] == [0, 3, 6, 9] and out["maps"][0]["name"] == "a2b"


def _verify(world, **body) -> dict:
    r = world["client"].post("/v1/verifications", json=body)
    assert r.status_code == 202, r.text
    return wait_http_job(world["client"], r.json()["id"], timeout=300)


def test_a_verification_job_checks_every_row_and_names_the_wrong_ones(world):
    job = wait_http_job(world["client"], _post(world, source="h_src", target="h_ver", map="a2b").json()["id"])
    assert job["state"] == "succeeded", job
    job = _verify(world, collection="h_ver", source="h_src", map="a2b")
    assert job["kind"] == "verify" and job["state"] == "succeeded", job
    assert "rows" in job["timings"]["stages"], job  # its progress per source batch (a cancel stops it there)
    out = job["result"]
    assert out["verdict"] == "PASS" and out["rows_ok"] and out["rows_source"] == out["rows_target"] == 300
    with open_store(world["url"]) as s:
        s.upsert("h_ver", [6], world["map"].apply(world["X"][5:6], output="raw"))  # row 2's id holds another vector
    out = _verify(world, collection="h_ver", source="h_src", map="a2b")["result"]
    # its checkpoint (the default file) records no kept rows: the FAIL offers no such reason
    assert out["verdict"] == "FAIL" and out["wrong_ids"] == [6] and out["fails"] == ["rows differ from the source's"]
    assert out["space_check"] == "checked: a", out


def test_a_verification_job_checks_the_kept_rows_against_the_migrations_keep_set(world):
    """``keep`` in the verification body: the rows a migration kept are checked against their given vectors (the job
    said FAIL, 4 wrong vectors, for a migration that did what it was asked); without it the FAIL says what those rows
    may be; a bad set is a 422 before a job exists."""
    rows = np.array([4, 0, 150, 299])
    Y = np.random.default_rng(8).normal(size=(4, world["map"].target_dim)).astype(np.float32)
    Y /= np.linalg.norm(Y, axis=1, keepdims=True)
    keep = {"ids": [int(i) * 3 for i in rows], "vectors": Y.tolist()}
    job = wait_http_job(world["client"], _post(world, source="h_src", target="h_kver", map="a2b", batch_size=64,
                                               keep=keep).json()["id"])
    assert job["state"] == "succeeded" and job["result"]["report"]["kept"] == 4, job
    out = _verify(world, collection="h_kver", source="h_src", map="a2b", keep=keep)["result"]
    assert out["verdict"] == "PASS" and out["rows_ok"] and out["wrong_vectors"] == 0, out
    assert out["kept_checked"] == 4 and out["kept_wrong"] == 0 and out["keep_not_found"] == 0
    out = _verify(world, collection="h_kver", source="h_src", map="a2b")["result"]
    assert out["verdict"] == "FAIL" and out["wrong_vectors"] == 4 and sorted(out["wrong_ids"]) == [0, 12, 450, 897]
    assert any(f.startswith("4 wrong vector(s): its checkpoint records a keep set of 4 re-embedded rows")
               and "`keep` over HTTP" in f for f in out["fails"]), out["fails"]
    other = {"ids": keep["ids"], "vectors": Y[::-1].tolist()}  # the same ids, each with another row's vector
    out = _verify(world, collection="h_kver", source="h_src", map="a2b", keep=other)["result"]
    assert out["verdict"] == "FAIL" and out["kept_wrong"] == 4 and out["wrong_vectors"] == 4, out
    for body, word in [({"keep": {"ids": [0, 3], "vectors": [Y[0].tolist()]}}, "keep ids list 2"),
                       ({"keep": {"ids": [0], "vectors": [[0.1] * (Y.shape[1] + 1)]}}, f"is {Y.shape[1]}-d"),
                       ({"keep": {"ids": [3, 3], "vectors": Y[:2].tolist()}}, "more than once")]:
        r = world["client"].post("/v1/verifications", json={"collection": "h_kver", "source": "h_src",
                                                             "map": "a2b", **body})
        assert r.status_code == 422 and word in r.json()["error"]["message"], (body, r.text)


def test_a_verification_job_checks_the_source_space_as_a_migration_does(world):
    """``source_space`` reaches the job's space check (a field the request refused before), named as HTTP names it."""
    job = _verify(world, collection="h_src", source="h_src", map="a2b", source_space="b")
    assert job["state"] == "failed", job
    assert "'h_src' records space 'a' but source_space says 'b'" in job["error"]["message"], job


def test_a_verification_job_reembeds_stored_texts_with_an_installed_encoder(world):
    pytest.importorskip("sentence_transformers")
    texts = [f"a short note about topic number {i}, {w}" for i, w in enumerate(["rivers", "music", "stocks", "cats",
                                                                              "rain", "chess", "bread", "trains"] * 5)]
    r = world["client"].post("/v1/embeddings", json={"input": texts, "model": "all-MiniLM-L6-v2"})
    if r.status_code == 503:
        pytest.skip(r.json()["error"]["message"])
    V = np.asarray([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
    with open_store(world["url"]) as s:
        for name, rows in (("h_txt", V), ("h_shuf", V[np.random.default_rng(0).permutation(len(V))])):
            s.drop(name)
            s.create(name, V.shape[1])
            s.upsert(name, np.arange(len(V)), rows, texts)
            s.finalize(name)
    good = _verify(world, collection="h_txt", encoder="minilm", n_sample=40, queries=40, min_recall=0.9)["result"]
    assert good["verdict"] == "PASS" and good["partner_top1"] == 1.0 and good["recall@10"] > 0.99, good
    bad = _verify(world, collection="h_shuf", encoder="minilm", n_sample=40, queries=40, min_recall=0.9)["result"]
    assert bad["verdict"] == "FAIL" and bad["partner_top1"] < 0.2 and bad["fails"] == ["recall@10 below 0.9"], bad


def test_verification_refusals(world):
    c = world["client"]
    for body, status, word in [({"collection": "h_src"}, 422, "give encoder"),
                               ({"collection": "h_src", "source": "h_src"}, 422, "source and map go together"),
                               ({"collection": "h_src", "encoder": "no-such-model"}, 404, "unknown encoder"),
                               ({"collection": "h_src", "source": "h_src", "map": "a2b", "min_recall": 0.5}, 422,
                                "min_recall gates"),
                               ({"collection": "h_src", "encoder": "minilm", "n_sample": 1}, 422, "n_sample"),
                               ({"collection": "h_src", "encoder": "minilm", "source_space": "a"}, 422,
                                "source_space declares the space of the source collection's rows"),
                               ({"collection": "h_src", "source": "h_src", "map": "nope"}, 404, "nope")]:
        r = c.post("/v1/verifications", json=body)
        assert r.status_code == status and word in r.json()["error"]["message"], (body, r.text)


def test_a_collection_is_searched_with_queries_of_another_space(world):
    """The query-side migration over HTTP: a collection of space b searched with space-a queries through a2b."""
    from service.vectordb import migrate

    c, X, m = world["client"], world["X"], world["map"]
    with open_store(world["url"]) as s:
        s.drop("hs_b")
        migrate(s, "h_src", "hs_b", m, batch_size=100, target_space="b")  # vectors of space b, recorded
        s.drop("hs_bare")
        s.create("hs_bare", 16)  # records no space
        s.upsert("hs_bare", np.arange(20), m.apply(X[:20], output="raw"))
    r = c.post("/v1/collections/hs_b/search", json={"vectors": X[:10].tolist(), "space": "a", "k": 3})
    assert r.status_code == 200, r.text
    out = r.json()
    CollectionSearchResponse.model_validate(out)  # the answer's schema in /openapi.json (it was `{}`)
    assert out["collection_space"] == "b" and [v["name"] + f":{v['version']}" for v in out["maps"]] == ["a2b:1"]
    assert [hits[0]["id"] for hits in out["results"]] == [3 * i for i in range(10)]  # each row finds itself
    assert all(len(h) == 3 and h[0]["score"] > 0.99 for h in out["results"])
    same = c.post("/v1/collections/h_src/search", json={"vectors": X[:5].tolist(), "space": "a", "k": 1}).json()
    assert same["maps"] == [] and [h[0]["id"] for h in same["results"]] == [0, 3, 6, 9, 12]  # no map needed
    r = c.post("/v1/collections/hs_bare/search", json={"vectors": X[:2].tolist(), "space": "a", "k": 1})
    assert r.status_code == 422 and "records no embedding space" in r.json()["error"]["message"]
    r = c.post("/v1/collections/hs_bare/search", json={"vectors": X[:2].tolist(), "space": "a", "k": 1,
                                                        "collection_space": "b"})
    assert [h[0]["id"] for h in r.json()["results"]] == [0, 1]
    r = c.post("/v1/collections/h_src/search", json={"vectors": X[:1].tolist(), "space": "b"})
    assert r.status_code == 404, r.text  # no map b -> a in the registry
    for body, status, word in [({"vectors": X[:1, :8].tolist(), "space": "a"}, 422, "16"),
                               ({"vectors": X[:1].tolist(), "space": "a", "k": 100_000}, 422, "k"),
                               ({"vectors": X[:1].tolist()}, 422, "space")]:
        r = c.post("/v1/collections/hs_b/search", json=body)
        assert r.status_code == status and word in r.json()["error"]["message"], (body, r.text)
    r = c.post("/v1/collections/nope/search", json={"vectors": X[:1].tolist(), "space": "a"})
    assert r.status_code == 404 and "nope" in r.json()["error"]["message"]
    after = c.post("/v1/collections/hs_b/search", json={"vectors": X[:1].tolist(), "space": "a", "k": 1})
    assert after.status_code == 200  # the shared connection survived the refusals


def test_the_migrations_list_shows_every_checkpoint_of_the_data_dir(world, tmp_path):
    c = world["client"]
    wait_http_job(c, _post(world, source="h_src", target="h_list", map="a2b", batch_size=100).json()["id"])
    damaged = world["data"] / "migrations" / "x-to-y.json"
    damaged.write_text("{not json")  # a damaged file is listed with its error, not the list's failure
    r = c.get("/v1/migrations")
    assert r.status_code == 200, r.text
    by_name = {d["name"]: d for d in r.json()["data"]}
    row = by_name["h_src-to-h_list"]
    assert row["finished"] and row["done"] == row["total"] == 300 and row["fraction"] == 1.0
    assert row["source"] == "h_src" and row["target"] == "h_list" and row["last_id"] == 897
    assert row["keep_rows"] == 0 and row["kept"] is None and row["keep_digest"] is None  # no keep set
    assert "not JSON" in by_name["x-to-y"]["error"] and by_name["x-to-y"].get("done") is None
    page = c.get("/v1/migrations", params={"limit": 1}).json()
    assert len(page["data"]) == 1 and page["next"]
    damaged.unlink()


def test_the_shared_connection_survives_a_requests_own_errors_and_is_reopened_after_others(tmp_path):
    pytest.importorskip("qdrant_client")
    from service.ops.vectordb import SharedStore
    from service.vectordb import CollectionNotFoundError

    shared = SharedStore(f"qdrant://{tmp_path}/q")
    first = shared.call(lambda store: store)
    with pytest.raises(CollectionNotFoundError):  # a 404 of the request: the connection is fine
        shared.call(lambda store: store.dim("nope"))
    assert shared.call(lambda store: store) is first

    def broken(store):
        raise RuntimeError("the database went away")

    with pytest.raises(RuntimeError):
        shared.call(broken)
    assert shared.call(lambda store: store) is not first  # closed after it, opened again for the next call
    shared.close()


def test_a_local_qdrant_serves_collection_searches_and_jobs_of_one_service(tmp_path):
    """With a local-mode Qdrant folder as the service's database (``qdrant:///dir``, no server to run), the
    collection search held the folder's lock and every migration or verification job after it failed ("open in
    another client", session 21's clear error). The service's stores of the folder now share one client: the
    search, the migration job, a verification job and the search of the target all work, one after another."""
    pytest.importorskip("qdrant_client")
    url = f"qdrant://{tmp_path / 'qd'}"
    with seeded_uvicorn(tmp_path, {"VECBRIDGE_VECTORDB_URL": url}) as (base, (X, _, _m)):
        with open_store(url) as s:  # before the service opens the folder (it does so on first use)
            s.create("q_src", X.shape[1])
            s.set_space("q_src", "a")
            s.upsert("q_src", np.arange(40), X[:40])
        with httpx.Client(base_url=base, headers=W, timeout=60) as c:
            r = c.post("/v1/collections/q_src/search", json={"vectors": X[:3].tolist(), "space": "a", "k": 1})
            assert r.status_code == 200 and [h[0]["id"] for h in r.json()["results"]] == [0, 1, 2], r.text
            job = wait_http_job(c, c.post("/v1/migrations", json={"source": "q_src", "target": "q_dst", "map": "a2b",
                                                                   "batch_size": 16}).json()["id"])
            assert job["state"] == "succeeded" and job["result"]["report"]["rows"] == 40, job
            job = wait_http_job(c, c.post("/v1/verifications", json={"collection": "q_dst", "source": "q_src",
                                                                      "map": "a2b"}).json()["id"])
            assert job["state"] == "succeeded" and job["result"]["verdict"] == "PASS", job
            r = c.post("/v1/collections/q_dst/search", json={"vectors": X[5:8].tolist(), "space": "a", "k": 1})
            assert r.status_code == 200 and [h[0]["id"] for h in r.json()["results"]] == [5, 6, 7], r.text


def _extreme_queries_are_ranked_as_the_metric_says_or_refused(c, url, X):
    """Queries at the edges of float32 against a cosine and an inner-product collection, checked against numpy.
    The route sent queries to the engine as given: Milvus answered a 3e38 or 1e-42 query on a cosine collection
    with arbitrary ids scored 0, and a 1e30 query on an ip collection with no hits (NaN scores dropped); both
    engines answered an all-zero query with arbitrary ids scored 0."""
    P = X * np.linspace(0.5, 3.0, len(X))[:, None].astype(np.float32)  # norms an ip collection ranks by
    with open_store(url) as s:
        for name, metric, rows in (("z_cos", "cosine", X), ("z_ip", "ip", P)):
            s.drop(name)
            s.create(name, X.shape[1], metric=metric)
            s.set_space(name, "a")
            s.upsert(name, np.arange(len(rows)), rows)
            s.finalize(name)
    d = X.shape[1]
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    want = np.argsort(-(U @ np.ones(d)), kind="stable")[:3].tolist()  # the direction of every 3e38 / 1e-42 query
    for scale in (3e38, 1e-42):
        r = c.post("/v1/collections/z_cos/search", json={"vectors": [[scale] * d], "space": "a", "k": 3})
        assert r.status_code == 200, (scale, r.text)
        hits = r.json()["results"][0]
        assert [h["id"] for h in hits] == want, scale
        np.testing.assert_allclose([h["score"] for h in hits], (U @ np.ones(d) / np.sqrt(d))[want], atol=1e-4)
    r = c.post("/v1/collections/z_cos/search", json={"vectors": [[0.0] * d], "space": "a", "k": 3})
    assert r.status_code == 422 and "all-zero" in r.json()["error"]["message"], r.text
    r = c.post("/v1/collections/z_ip/search", json={"vectors": [[1e30] * d], "space": "a", "k": 3})
    assert r.status_code == 422 and "1e+19" in r.json()["error"]["message"], r.text
    q = 1e3 * X[7]  # a finite ip query keeps its scale: scores are inner products with the stored norms
    r = c.post("/v1/collections/z_ip/search", json={"vectors": [q.tolist()], "space": "a", "k": 3})
    assert r.status_code == 200, r.text
    ip = P @ q
    assert [h["id"] for h in r.json()["results"][0]] == np.argsort(-ip, kind="stable")[:3].tolist()
    np.testing.assert_allclose(r.json()["results"][0][0]["score"], ip.max(), rtol=1e-4)


def test_a_milvus_collection_search_ranks_or_refuses_queries_at_any_scale(world):
    _extreme_queries_are_ranked_as_the_metric_says_or_refused(world["client"], world["url"], world["X"][:40])


def test_a_qdrant_collection_search_ranks_or_refuses_queries_at_any_scale(tmp_path):
    pytest.importorskip("qdrant_client")
    url = f"qdrant://{tmp_path / 'qd'}"
    with (seeded_uvicorn(tmp_path, {"VECBRIDGE_VECTORDB_URL": url}) as (base, (X, _, _m)),
          httpx.Client(base_url=base, headers=W, timeout=60) as c):
        _extreme_queries_are_ranked_as_the_metric_says_or_refused(c, url, X[:40])


def test_a_collection_space_contradicting_the_recorded_space_is_refused_naming_both(world):
    """``collection_space`` names the space of a collection that records none; ``h_src`` records ``a``. Space-b
    queries with ``collection_space: "b"`` were searched against its space-a vectors as they were (200, no map, hits
    of another model's space); a value that agrees with the record, or none, still works."""
    c, Yb = world["client"], world["map"].apply(world["X"][:2], output="raw")
    r = c.post("/v1/collections/h_src/search", json={"vectors": Yb.tolist(), "space": "b", "collection_space": "b",
                                                      "k": 1})
    assert r.status_code == 422, r.text
    msg = r.json()["error"]["message"]
    assert "records space 'a'" in msg and "collection_space says 'b'" in msg
    r = c.post("/v1/collections/h_src/search", json={"vectors": world["X"][:2].tolist(), "space": "a",
                                                      "collection_space": "a", "k": 1})
    assert r.status_code == 200 and [h[0]["id"] for h in r.json()["results"]] == [0, 3], r.text


def test_a_migration_request_while_the_store_is_down_is_a_503_with_retry_after_and_no_job(tmp_path):
    """The configured store not answering (Qdrant on a closed port): the request's check met the failed connect,
    let it pass, answered 202, and the job failed moments later on the same connect (VectorDBUnavailableError),
    told to a client polling it only. It is a 503 with ``Retry-After`` before a job exists, saying nothing was
    queued; the CLI exits 75 (retry later), as it did."""
    from _servers import free_port, seed_registry

    from service.api.app import create_app
    from service.cli import main

    pytest.importorskip("qdrant_client")
    seed_registry(tmp_path / "data")
    url = f"qdrant://127.0.0.1:{free_port()}"
    with TestClient(create_app(settings_for(tmp_path, vectordb_url=url))) as c:
        r = c.post("/v1/migrations", json={"source": "src", "target": "dst", "map": "a2b"}, headers=W)
        jobs = c.get("/v1/jobs", headers=W).json()["data"]
    assert r.status_code == 503 and r.json()["error"]["type"] == "VectorDBUnavailableError", r.text
    assert r.headers["retry-after"] == "5" and "no migration was queued" in r.json()["error"]["message"], r.text
    assert jobs == [], jobs
    assert main(["--data-dir", str(tmp_path / "data"), "migrate", "--store", url, "--source", "src", "--target",
                 "dst", "--map", "a2b", "--quiet"]) == 75
