"""Every route's real answers (successes and typical errors) match the schema the OpenAPI document gives them.

The fuzz suite rarely reaches a 200 on routes that need existing names (``/v1/maps/{ref}``,
``/v1/jobs/{id}``, ...); here each route is called with valid data from a populated registry
and the body is checked by schemathesis against the documented schema for its status.
"""

from __future__ import annotations


import numpy as np
import pytest

schemathesis = pytest.importorskip("schemathesis")
from schemathesis.specs.openapi.checks import (content_type_conformance,  # noqa: E402
                                               response_schema_conformance)

from service.api import create_app  # noqa: E402
from _jobs_support import wait_job  # noqa: E402
from _api_support import W, planted, populate, settings_for  # noqa: E402

CHECKS = [content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    app = create_app(settings_for(tmp_path_factory.mktemp("oas")))
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)  # starts the lifespan
    state = app.state.vb
    populate(state.registry)
    _, Y, _ = planted(100)
    state.indexes.create("ix", "b", Y, dim=16)
    return schema


def assert_job_succeeds(schema, job_id: str) -> None:
    """Poll ``GET /v1/jobs/{job_id}`` (each answer checked against the schema) until the job ends; it must succeed."""
    job = wait_job(lambda jid: call(schema, "get", "/v1/jobs/{job_id}", expect=200,
                                    path_parameters={"job_id": jid}).json(), job_id)
    assert job["state"] == "succeeded", job


def call(schema, method: str, path: str, *, expect: int, path_parameters=None, query=None, body=None,
         headers=None):
    kw = {} if body is None else {"body": body, "media_type": "application/json"}
    case = schema[path][method].Case(path_parameters=path_parameters or {}, query=query,
                                     headers={**W, **(headers or {})}, **kw)
    r = case.call()
    assert r.status_code == expect, (method, path, r.status_code, r.text[:300])
    case.validate_response(r, checks=CHECKS)  # raises on an undocumented body or content type
    return r


def test_success_bodies_match_their_schema(world):
    s = world
    X, Y, _ = planted(64, seed=3)
    call(s, "get", "/healthz", expect=200)
    call(s, "get", "/readyz", expect=200)
    call(s, "get", "/v1/info", expect=200)
    call(s, "get", "/v1/spaces", expect=200)
    call(s, "get", "/v1/spaces/{name}", expect=200, path_parameters={"name": "a"})
    call(s, "post", "/v1/spaces", expect=201, body={"name": "d", "dim": 8})
    call(s, "get", "/v1/maps", expect=200)
    call(s, "get", "/v1/maps/{ref}", expect=200, path_parameters={"ref": "a2b@prod"})
    call(s, "get", "/v1/maps/{name}/versions", expect=200, path_parameters={"name": "a2b"})
    call(s, "get", "/v1/maps/{name}/versions/{version}", expect=200, path_parameters={"name": "a2b", "version": 1})
    call(s, "put", "/v1/maps/{name}/versions/{version}/tags/{key}", expect=200,
         path_parameters={"name": "a2b", "version": 1, "key": "owner"}, body={"value": "team-x"})
    call(s, "delete", "/v1/maps/{name}/versions/{version}/tags/{key}", expect=200,
         path_parameters={"name": "a2b", "version": 1, "key": "owner"})
    call(s, "put", "/v1/maps/{name}/aliases/{alias}", expect=200, path_parameters={"name": "a2b", "alias": "dev"},
         body={"version": 1})
    call(s, "post", "/v1/maps/{ref}/transform", expect=200, path_parameters={"ref": "a2b"},
         body={"vectors": X[:3].tolist()})
    call(s, "post", "/v1/maps/{ref}/transform", expect=200, path_parameters={"ref": "a2b"},
         body={"vectors": X[:3].tolist(), "encoding_format": "base64"})
    call(s, "get", "/v1/indexes", expect=200)
    call(s, "get", "/v1/indexes/{name}", expect=200, path_parameters={"name": "ix"})
    call(s, "post", "/v1/indexes", expect=201, body={"name": "ix2", "space": "a", "vectors": X.tolist()})
    call(s, "post", "/v1/indexes/{name}/vectors", expect=200, path_parameters={"name": "ix2"},
         body={"vectors": X[:4].tolist(), "payloads": [{"i": i} for i in range(4)]})
    call(s, "post", "/v1/indexes/{name}/search", expect=200, path_parameters={"name": "ix"},
         body={"vectors": X[:2].tolist(), "space": "a", "k": 3})
    call(s, "post", "/v1/indexes/{name}/delete", expect=200, path_parameters={"name": "ix2"}, body={"ids": [0, 1]})
    call(s, "get", "/v1/models", expect=200)
    call(s, "get", "/v1/models/{model_id}", expect=200, path_parameters={"model_id": "all-MiniLM-L6-v2"})
    body = {"name": "f", "source_space": "a", "target_space": "b", "method": "procrustes", "paired": True,
            "source": {"vectors": X.tolist()}, "target": {"vectors": Y.tolist()}}
    jid = call(s, "post", "/v1/fits", expect=202, body=body, headers={"Idempotency-Key": "k1"}).json()["id"]
    call(s, "post", "/v1/fits", expect=200, body=body, headers={"Idempotency-Key": "k1"})  # replay
    assert_job_succeeds(s, jid)
    call(s, "get", "/v1/jobs", expect=200)
    call(s, "delete", "/v1/jobs/{job_id}", expect=200, path_parameters={"job_id": jid})  # finished: final record
    call(s, "delete", "/v1/maps/{name}/versions/{version}", expect=200, path_parameters={"name": "f", "version": 1})
    # steers: fit job, list, get, apply, lens, steered search
    labels = np.where(Y[:, 0] > 0.5, 1, np.where(Y[:, 0] < -0.5, -1, 0)).tolist()
    steer_body = {"name": "st", "space": "b", "vectors": Y.tolist(), "labels": labels,
                  "items": [f"r{i}" for i in range(len(labels))],
                  "params": {"method": "lm-steer", "rank": 2, "max_iter": 5}}
    jid = call(s, "post", "/v1/steers", expect=202, body=steer_body).json()["id"]
    assert_job_succeeds(s, jid)
    call(s, "get", "/v1/steers", expect=200)
    call(s, "get", "/v1/steers/{ref}", expect=200, path_parameters={"ref": "st:1"})
    call(s, "get", "/v1/steers/{name}/versions", expect=200, path_parameters={"name": "st"})
    call(s, "get", "/v1/steers/{name}/versions", expect=404, path_parameters={"name": "nope"})
    call(s, "post", "/v1/steers/{ref}/apply", expect=200, path_parameters={"ref": "st"},
         body={"vectors": Y[:2].tolist(), "eps": 0.5})
    call(s, "get", "/v1/steers/{ref}/lens", expect=200, path_parameters={"ref": "st"}, query={"k": 2})
    call(s, "post", "/v1/indexes/{name}/search", expect=200, path_parameters={"name": "ix"},
         body={"vectors": X[:2].tolist(), "space": "a", "k": 3, "steers": {"st": 1.0}})
    call(s, "get", "/v1/steers/{ref}", expect=404, path_parameters={"ref": "nope"})
    call(s, "post", "/v1/steers/{ref}/apply", expect=422, path_parameters={"ref": "st"},
         body={"vectors": np.ones((1, 3)).tolist()})


def test_plan_and_evaluation_answers_match_their_schema(world):
    """Their 200 was documented as ``{}`` (anything); now PlanResponse and EvaluateResponse, which the answers of a
    labelled plan and a gated labelled evaluation must match."""
    s = world
    X, Y, _ = planted()  # the rows a2b was fitted on (populate)
    X, Y = X[:64], Y[:64]
    labelled = {"queries": {"vectors": Y[:6].tolist()}, "relevant": list(range(6))}
    r = call(s, "post", "/v1/plans", expect=200, body={
        "old": {"vectors": X.tolist()}, "probe_source": {"vectors": X.tolist()},
        "probe_target": {"vectors": Y.tolist()}, "old_queries": {"vectors": X[:6].tolist()}, **labelled})
    assert r.json()["recommended"]["k"] >= 1 and "native" in r.json()
    r = call(s, "post", "/v1/maps/{ref}/evaluate", expect=200, path_parameters={"ref": "a2b"}, body={
        "source": {"vectors": X.tolist()}, "target": {"vectors": Y.tolist()}, "min_retention": 0.5, "min_top1": 0.5,
        "max_queries": 20, **labelled})
    assert r.json()["result"] == "PASS" and "intervals" in r.json() and r.json()["retrieval"]["labelled"]


def test_error_bodies_match_their_schema(world):
    s = world
    wide = np.ones((1, 17)).tolist()
    for path, params in (("/v1/maps/{ref}", {"ref": "nope"}), ("/v1/spaces/{name}", {"name": "nope"}),
                         ("/v1/jobs/{job_id}", {"job_id": "nope"}), ("/v1/indexes/{name}", {"name": "nope"})):
        r = call(s, "get", path, expect=404, path_parameters=params)
        assert set(r.json()) == {"error"} and r.json()["error"]["status"] == 404
    call(s, "get", "/v1/maps/{name}/versions/{version}", expect=422,
         path_parameters={"name": "a2b", "version": 2**31})
    r = call(s, "post", "/v1/maps/{ref}/transform", expect=422, path_parameters={"ref": "a2b"}, body={"vectors": wide})
    assert r.json()["error"]["type"] == "DimensionMismatchError"
    call(s, "post", "/v1/spaces", expect=409, body={"name": "a", "dim": 3})
    call(s, "post", "/v1/indexes/{name}/search", expect=415, path_parameters={"name": "ix"}, body={"vectors": wide},
         headers={"Content-Type": "text/plain"})
    case = s["/v1/spaces"]["get"].Case()
    r = case.call()  # no key
    assert r.status_code == 401
    case.validate_response(r, checks=CHECKS)


def test_conditional_answers_match_their_schema(world):
    """The 304 of a read (no body, its ETag) and the 412 of an alias write (ErrorBody) are documented answers."""
    s = world
    for path, params in (("/v1/maps/{ref}/artifact", {"ref": "a2b:1"}),
                         ("/v1/maps/{name}/aliases/{alias}", {"name": "a2b", "alias": "prod"})):
        (etag,) = call(s, "get", path, expect=200, path_parameters=params).headers["etag"]  # schemathesis: lists
        r = call(s, "get", path, expect=304, path_parameters=params, headers={"If-None-Match": etag})
        assert r.headers["etag"] == [etag] and r.content == b""
    alias = {"name": "a2b", "alias": "prod"}
    call(s, "put", "/v1/maps/{name}/aliases/{alias}", expect=412, path_parameters=alias, body={"version": 1},
         headers={"If-Match": '"v99"'})
    call(s, "delete", "/v1/maps/{name}/aliases/{alias}", expect=412, path_parameters=alias,
         headers={"If-Match": '"v99"'})


def test_default_validation_error_doc_is_replaced(world):
    spec = world.raw_schema
    assert "HTTPValidationError" not in spec.get("components", {}).get("schemas", {})
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            for status, resp in op["responses"].items():
                if status.startswith("4"):
                    ref = resp["content"]["application/json"]["schema"]["$ref"]
                    assert ref.endswith("/ErrorBody"), (method, path, status, ref)
