"""Every request body in the OpenAPI document carries examples, every example is a valid body, and the
toy examples run top to bottom on an empty service, as a reader of /docs would run them."""

from __future__ import annotations

import re

import numpy as np
import pytest
from _api_support import W, settings_for
from _jobs_support import http_job, wait_job
from fastapi.testclient import TestClient

from service.api import create_app
from service.api.routers.lm import LMAnalyzeRequest, LMFitRequest, LMGenerateRequest
from service.api.schemas import (
    AliasSet,
    EmbeddingsRequest,
    EvaluateRequest,
    FitRequest,
    IndexAdd,
    IndexCreate,
    IndexDelete,
    PlanRequest,
    SearchRequest,
    SpaceCreate,
    SteerApplyRequest,
    SteerFitRequest,
    SteerTransferRequest,
    TagSet,
    TransformJSON,
)
from service.api.vectordb_schemas import (
    CollectionSearchRequest,
    MigrationRequest,
    VerificationRequest,
)

MODELS = {
    ("post", "/v1/spaces"): SpaceCreate, ("put", "/v1/maps/{name}/aliases/{alias}"): AliasSet,
    ("put", "/v1/maps/{name}/versions/{version}/tags/{key}"): TagSet,
    ("post", "/v1/maps/{ref}/transform"): TransformJSON, ("post", "/v1/indexes"): IndexCreate,
    ("post", "/v1/indexes/{name}/vectors"): IndexAdd, ("post", "/v1/indexes/{name}/delete"): IndexDelete,
    ("post", "/v1/indexes/{name}/search"): SearchRequest, ("post", "/v1/fits"): FitRequest,
    ("post", "/v1/embeddings"): EmbeddingsRequest, ("post", "/v1/steers"): SteerFitRequest,
    ("post", "/v1/steers/{ref}/apply"): SteerApplyRequest, ("post", "/v1/lm/steers"): LMFitRequest,
    ("put", "/v1/steers/{name}/aliases/{alias}"): AliasSet, ("post", "/v1/steers/{ref}/transfer"): SteerTransferRequest,
    ("post", "/v1/collections/{name}/search"): CollectionSearchRequest, ("post", "/v1/migrations"): MigrationRequest, ("post", "/v1/verifications"): VerificationRequest, ("post", "/v1/plans"): PlanRequest, ("post", "/v1/maps/{ref}/evaluate"): EvaluateRequest, ("post", "/v1/lm/generate"): LMGenerateRequest, ("post", "/v1/lm/analyze"): LMAnalyzeRequest,
}

# The toy walk-through, in order: method, path, example name (the route template is the OpenAPI path the
# path matches, so the walk also checks that every path it sends is one the document declares).
WALK = """
POST /v1/spaces                             toy
POST /v1/fits                               toy
PUT /v1/maps/toy-a2b/aliases/prod           prod
PUT /v1/maps/toy-a2b/versions/1/tags/owner  owner
POST /v1/maps/toy-a2b@prod/transform        toy
POST /v1/maps/toy-a2b@prod/transform        base64
POST /v1/maps/toy-a2b@prod/evaluate         labelled
POST /v1/indexes                            toy
POST /v1/indexes/toy-b-docs/vectors         toy
POST /v1/indexes/toy-b-docs/search          toy
POST /v1/indexes/toy-b-docs/delete          toy
POST /v1/steers                             toy
POST /v1/steers/toy-up/apply                toy
POST /v1/fits                               inverse
POST /v1/steers/toy-up/transfer             toy
POST /v1/plans                              b64
"""


def walk_steps(doc) -> list[tuple[str, str, str, str]]:
    """``(method, route template, path, example name)`` for each line of :data:`WALK`."""
    routes = {re.compile("^" + re.sub(r"\\{[^/]+\\}", "[^/]+", re.escape(r)) + "$"): r for r in doc["paths"]}
    steps = []
    for line in WALK.strip().splitlines():
        method, path, name = line.split()
        matched = [r for rx, r in routes.items() if rx.match(path)]
        assert len(matched) == 1, f"{path} matches {matched} in the OpenAPI document"
        steps.append((method.lower(), matched[0], path, name))
    return steps


@pytest.fixture(scope="module")
def app_client(tmp_path_factory):
    app = create_app(settings_for(tmp_path_factory.mktemp("examples")))
    with TestClient(app) as c:
        yield c, app.openapi()


def _examples(doc, method, route):
    return doc["paths"][route][method]["requestBody"]["content"]["application/json"].get("examples", {})


def test_every_body_has_valid_examples(app_client):
    _, doc = app_client
    with_body = {(m, p) for p, ops in doc["paths"].items() for m, op in ops.items() if "requestBody" in op}
    assert with_body == set(MODELS), "a route with a body has no model here: add its examples and its model"
    for (method, route), model in MODELS.items():
        ex = _examples(doc, method, route)
        assert ex, f"{method.upper()} {route} has no request example"
        for name, e in ex.items():
            assert e["summary"], (route, name)
            model.model_validate(e["value"])  # raises on an invalid example


def test_toy_examples_run_in_order(app_client):
    c, doc = app_client
    answers = {}
    for method, route, path, name in walk_steps(doc):
        body = _examples(doc, method, route)[name]["value"]
        r = c.request(method.upper(), path, json=body, headers=W)
        assert r.status_code < 300, f"{method.upper()} {path} ({name}): {r.status_code} {r.text[:300]}"
        if r.status_code == 202:
            job = wait_job(http_job(c, W), r.json()["id"], timeout=30.0)
            assert job["state"] == "succeeded", job
        answers[(route, name)] = r.json() if r.content else None
    # the toy map recovers the planted pairwise swap, so the answers are the swapped rows
    got = np.array(answers[("/v1/maps/{ref}/transform", "toy")]["vectors"])
    np.testing.assert_allclose(got, [[0, 1, 0, 0], [0.8, 0.6, 0, 0]], atol=1e-4)
    ev = answers[("/v1/maps/{ref}/evaluate", "labelled")]
    assert ev["retrieval"]["labelled"]["retention"]["R@1"] == 1.0  # the swap is exact
    assert "result" not in ev and "random ranking" in ev["retrieval"]["labelled"]["undecided"]  # 2 of 8: no gate
    hits = answers[("/v1/indexes/{name}/search", "toy")]["results"]
    assert [row[0]["id"] for row in hits] == [1, 3]  # toy-a e1 -> toy-b row 1, e3 -> row 3
    # the transfer example named a map toy-b2c@prod the walk-through never made (a 404): it goes through toy-b2a
    moved = answers[("/v1/steers/{ref}/transfer", "toy")]
    assert (moved["name"], moved["space"]) == ("toy-up-a", "toy-a")
    # the toy map's 8 pairs are too few to judge it, so the steer carried through it is flagged and prod not moved
    assert moved["metrics"]["reliable"] is False and moved["aliases"] == [], moved


def test_the_fit_from_texts_example_runs(app_client):
    """The `texts` example of POST /v1/fits was an unsupervised fit of two texts per side: its job always failed
    (TooFewRowsError: k-means anchors need 20 rows). It is a paired fit of the same texts embedded by each space's
    encoder now, and runs after the `encoder` space example, as /docs shows them."""
    from service.encoders import list_encoders

    pytest.importorskip("sentence_transformers")
    installed = {e["name"] for e in list_encoders() if e["installed"]}
    if not {"all-MiniLM-L6-v2", "multilingual-e5-small"} <= installed:
        pytest.skip("the example embeds with all-MiniLM-L6-v2 and multilingual-e5-small")
    c, doc = app_client
    space = _examples(doc, "post", "/v1/spaces")["encoder"]["value"]
    assert c.post("/v1/spaces", json=space, headers=W).status_code < 300
    assert c.post("/v1/spaces", json={"name": "e5", "encoder": "multilingual-e5-small"}, headers=W).status_code < 300
    r = c.post("/v1/fits", json=_examples(doc, "post", "/v1/fits")["texts"]["value"], headers=W)
    assert r.status_code == 202, r.text
    job = wait_job(http_job(c, W), r.json()["id"], timeout=300.0)
    assert job["state"] == "succeeded", job
    metrics = job["result"]["version"]["metrics"]
    # 8 pairs are too few to hold any out and judge the map (they were called reliable by finding each other)
    assert metrics["reliable"] is False and metrics["unreliable_reason"].startswith("too few pairs to judge")
