"""An optional field of a request body sent as JSON ``null`` is the field left out: its default.

Many JSON clients send ``null`` for "not given" (a dataclass or a pydantic model dumped with its None fields, a
JavaScript object with a property set to null). ``POST /v1/maps/{ref}/transform`` with ``{"vectors_b64": ...,
"dim": null}`` was a 422 "vectors_b64 needs dim" (left out: the map's width), and ``"k": null``, ``"output":
null``, ``"random_state": null``... were 422s too, while the OpenAPI document said nothing of null. Each route of
the vector bodies (``vectors`` / ``vectors_b64`` + ``dim``) is called here with each optional field of its model
null, and must answer as it does without the field; the document marks every optional field nullable. The
exceptions, a model's ``null_refused`` (the fields an upsert of ``POST /v1/spaces`` keeps and cannot clear), are a
422 saying so: taken as left out, a merge patch's ``"description": null`` answered 200 with nothing cleared."""

from __future__ import annotations

import base64
import itertools

import numpy as np
import pytest
from _api_support import R, W, served_world
from _jobs_support import wait_http_job
from _synthetic import planted_attribute

from service.api.schemas import (
    EvaluateRequest,
    FitRequest,
    IndexAdd,
    IndexCreate,
    PlanRequest,
    SearchRequest,
    SpaceCreate,
    SteerApplyRequest,
    SteerFitRequest,
    TransformJSON,
)

_names = itertools.count()
_KEPT = ("description", "passage_prefix", "query_prefix")  # SpaceCreate's: an upsert keeps them, clears none


def _b64(X: np.ndarray) -> dict:
    return {"vectors_b64": base64.b64encode(np.ascontiguousarray(X, "<f4").tobytes()).decode(), "dim": X.shape[1]}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with served_world(tmp_path_factory.mktemp("null"), max_queued_jobs=256, max_queued_jobs_per_key=256,
                      max_body_bytes=8_000_000) as (c, app, d):
        app.state.vb.indexes.create("ix", "b", d["Y"][:100], dim=16)
        S, labels, _ = planted_attribute(200, 16, n_queries=1)
        r = c.post("/v1/steers", headers=W, json={"name": "st", "space": "a", **_b64(S), "labels": labels.tolist()})
        assert r.status_code == 202, r.text
        assert wait_http_job(c, r.json()["id"], headers=R)["state"] == "succeeded"
        yield c, d, S, labels


def _routes(d, S, labels):
    """``(route, body model, a valid body with only its required fields (a fresh one per call), status)``."""
    X, Y = d["X"], d["Y"]
    return [
        ("/v1/maps/a2b/transform", TransformJSON, lambda: _b64(X[:3]), 200),
        ("/v1/indexes/ix/search", SearchRequest, lambda: _b64(Y[:2]), 200),
        ("/v1/indexes/ix/vectors", IndexAdd, lambda: _b64(Y[:2]), 200),
        ("/v1/indexes", IndexCreate, lambda: {"name": f"n{next(_names)}", "space": "b", **_b64(Y[:20])}, 201),
        ("/v1/maps/a2b/evaluate", EvaluateRequest, lambda: {"source": _b64(X[:100]), "target": _b64(Y[:100])}, 200),
        ("/v1/plans", PlanRequest,
         lambda: {"old": _b64(X[:300]), "probe_source": _b64(X[300:400]), "probe_target": _b64(Y[300:400])}, 200),
        ("/v1/fits", FitRequest, lambda: {"name": f"f{next(_names)}", "source_space": "a", "target_space": "b",
                                          "source": _b64(X[:200]), "target": _b64(Y[:200]), "method": "procrustes"},
         202),
        ("/v1/steers", SteerFitRequest, lambda: {"name": f"s{next(_names)}", "space": "a", **_b64(S),
                                                 "labels": labels.tolist()}, 202),
        ("/v1/steers/st/apply", SteerApplyRequest, lambda: _b64(S[:2]), 200),
        ("/v1/spaces", SpaceCreate, lambda: {"name": f"p{next(_names)}", "dim": 4}, 201),
    ]


def _optional(model) -> list[str]:
    return [name for name, field in model.model_fields.items()
            if not field.is_required() and name not in getattr(model, "null_refused", ())]


def test_dim_null_beside_vectors_b64_is_dim_left_out(world):
    c, d, _, _ = world
    X = d["X"][:3]
    body = _b64(X)
    without = c.post("/v1/maps/a2b/transform", headers=R, json={"vectors_b64": body["vectors_b64"]})
    r = c.post("/v1/maps/a2b/transform", headers=R, json={**body, "dim": None})
    assert without.status_code == 200 and r.status_code == 200, r.text
    assert r.json() == without.json()
    # a fit side has no other width to take: null is refused as left out is, naming what to send
    side = {**body, "dim": None}
    r = c.post("/v1/fits", headers=W, json={"name": "nd", "source_space": "a", "target_space": "b", "source": side,
                                            "target": _b64(d["Y"][:3])})
    assert r.status_code == 422 and 'needs "dim"' in r.json()["error"]["message"], r.text


def _same(left, nulled, route: str) -> bool:
    if left.status_code != nulled.status_code:
        return False
    if left.status_code >= 400:
        return left.json()["error"]["message"] == nulled.json()["error"]["message"]
    return not route.endswith(("transform", "search", "apply")) or left.json() == nulled.json()


def test_every_optional_field_sent_as_null_answers_as_left_out(world):
    c, d, S, labels = world
    wrong, served = [], 0
    for route, model, body, status in _routes(d, S, labels):
        fields = _optional(model)
        assert fields, route
        assert c.post(route, headers=W, json=body()).status_code == status, route
        for name in fields:
            left = c.post(route, headers=W, json={k: v for k, v in body().items() if k != name})
            nulled = c.post(route, headers=W, json={**body(), name: None})
            served += left.status_code == status
            if not _same(left, nulled, route):
                wrong.append(f"{route} {name}: left out {left.status_code}, null {nulled.status_code} "
                             f"{nulled.text[:200]}")
    assert served > 40 and not wrong, "\n".join(wrong)


def test_texts_beside_null_vectors_are_texts(world):
    """``texts`` with ``"vectors": null`` was "give either vectors or texts, not both"."""
    c, _, _, _ = world
    left = c.post("/v1/indexes/ix/search", headers=R, json={"texts": ["x"]})
    r = c.post("/v1/indexes/ix/search", headers=R, json={"texts": ["x"], "vectors": None, "vectors_b64": None})
    # the space has no encoder: refused for that, as without the nulls
    assert r.status_code == left.status_code == 404 and r.json() == left.json(), r.text


def _request_schemas(doc):
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            schema = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if schema is not None:
                yield f"{method.upper()} {path}", schema


def _admits_null(prop: dict) -> bool:
    return prop.get("type") == "null" or any(_admits_null(p) for p in prop.get("anyOf", ()))


def test_the_document_marks_every_optional_body_field_nullable(world):
    c, _, _, _ = world
    doc = c.get("/openapi.json").json()
    seen, missing, refused = 0, [], {}
    kept = {"SpaceCreate": _KEPT}

    def walk(where, schema, model=None):
        nonlocal seen
        if "$ref" in schema:
            model = schema["$ref"].rsplit("/", 1)[1]
            schema = doc["components"]["schemas"][model]
        for name, prop in schema.get("properties", {}).items():
            if name in kept.get(model, ()):
                refused[f"{where}: {name}"] = _admits_null(prop)
            elif name not in schema.get("required", ()):
                seen += 1
                if not _admits_null(prop):
                    missing.append(f"{where}: {name}")
            for sub in (prop, *prop.get("anyOf", ())):
                if "$ref" in sub:
                    walk(f"{where}.{name}", sub)

    for where, schema in _request_schemas(doc):
        walk(where, schema)
    assert seen > 100 and not missing, missing
    # the fields whose null is refused are not called nullable
    assert len(refused) == 3 and not any(refused.values()), refused


@pytest.mark.parametrize("field", _KEPT)
def test_a_space_upserts_null_is_refused_not_taken_as_nothing_to_change(world, field):
    """A JSON merge patch clears a field with null; the upsert keeps what it is not given and clears nothing, so
    ``"description": null`` answered 200 with the stored value kept: the client believed it cleared."""
    c, _, _, _ = world
    assert field in SpaceCreate.null_refused
    name = f"keep{field}"
    r = c.post("/v1/spaces", headers=W, json={"name": name, "dim": 4, field: "kept: "})
    assert r.status_code == 201 and r.json()[field] == "kept: ", r.text
    r = c.post("/v1/spaces", headers=W, json={"name": name, "dim": 4, field: None})
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["details"][0]["loc"] == ["body", field] and err["details"][0]["type"] == "null_refused", err
    assert 'send ""' in err["message"] and "no way to clear it" in err["message"] and field in err["message"], err
    assert c.get(f"/v1/spaces/{name}", headers=R).json()[field] == "kept: "
    # on a new space too (was a 422 before null meant "left out"; the document never called it nullable then)
    r = c.post("/v1/spaces", headers=W, json={"name": f"new{field}", "dim": 4, field: None})
    assert r.status_code == 422 and c.get(f"/v1/spaces/new{field}", headers=R).status_code == 404, r.text
    # what the message offers: "" (and the field left out) keeps the stored value
    for body in ({field: ""}, {}):
        r = c.post("/v1/spaces", headers=W, json={"name": name, "dim": 4, **body})
        assert r.status_code == 200 and r.json()[field] == "kept: ", r.text


def test_a_space_upserts_encoder_null_is_no_encoder_as_before(world):
    """``encoder`` was nullable before null meant "left out" (none on a new space); kept, its description says an
    existing space keeps its own."""
    c, _, _, _ = world
    r = c.post("/v1/spaces", headers=W, json={"name": "enc-null", "dim": 4, "encoder": None})
    assert r.status_code == 201 and r.json()["encoder"] is None, r.text
    doc = c.get("/openapi.json").json()["components"]["schemas"]["SpaceCreate"]["properties"]["encoder"]
    assert _admits_null(doc) and "cannot be cleared" in doc["description"], doc
