"""The OpenAPI document as a document: every ``$ref`` in it resolves, it is a valid OpenAPI 3.1 document and each of
its schemas a valid JSON Schema (2020-12)."""

from __future__ import annotations

import pytest
from _api_support import settings_for
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from service.api import create_app
from service.registry.errors import InvalidNameError
from service.registry.names import (
    ALIAS_PATTERN,
    MAX_ALIAS,
    MAX_NAME,
    MAX_REF,
    NAME_PATTERN,
    REF_PATTERN,
    check_alias,
    check_name,
    parse_ref,
)


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    return create_app(settings_for(tmp_path_factory.mktemp("doc"))).openapi()


def _walk(node, where=""):
    """``(where, key, value)`` of every entry of every object in ``node``."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield where, k, v
            yield from _walk(v, f"{where}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{where}/{i}")


def _resolve(doc, ref: str):
    assert ref.startswith("#/"), ref
    node = doc
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def test_every_ref_resolves_from_the_root(doc):
    """``#/$defs/FitSide`` and ``#/$defs/_Vectors`` (POST /v1/fits, /v1/plans, /v1/maps/{ref}/evaluate) pointed at
    nothing: the ``$defs`` sat inside each operation's request schema, and a ``$ref`` resolves from the root."""
    refs = [(where, v) for where, k, v in _walk(doc) if k == "$ref"]
    assert len(refs) > 100
    broken = []
    for where, ref in refs:
        try:
            _resolve(doc, ref)
        except (KeyError, IndexError, TypeError, AssertionError):
            broken.append((where, ref))
    assert not broken, broken
    assert not [where for where, k, _ in _walk(doc.get("paths")) if k == "$defs"]


def test_the_request_schemas_parts_are_components(doc):
    body = doc["paths"]["/v1/fits"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["source"] == {"$ref": "#/components/schemas/FitSide"}
    assert "_Vectors" in doc["components"]["schemas"]


def _schemas(doc):
    """Every Schema Object of the document: components, parameters, request and response bodies."""
    yield from doc["components"]["schemas"].items()
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for p in op.get("parameters", []):
                yield f"{method} {path} {p['name']}", p["schema"]
            for status, media in [("body", op.get("requestBody", {}))] + list(op["responses"].items()):
                for mt, entry in media.get("content", {}).items():
                    if "schema" in entry:
                        yield f"{method} {path} {status} {mt}", entry["schema"]


def test_the_document_is_valid_openapi_3_1(doc):
    jsonschema = pytest.importorskip("jsonschema")
    definitions = pytest.importorskip("schemathesis.specs.openapi.definitions")  # OpenAPI's own schema of 3.1
    errors = sorted(jsonschema.Draft202012Validator(definitions.OPENAPI_31).iter_errors(doc), key=str)
    assert not errors, [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:5]]
    n = 0
    for where, schema in _schemas(doc):
        jsonschema.Draft202012Validator.check_schema(schema)  # raises SchemaError naming the keyword
        n += 1
    assert n > 100


def test_every_request_example_is_valid_by_the_document(doc):
    """Each example body validates against its operation's schema, its ``$ref`` resolved in this document (as a
    client generator or a validator reads it): with the ``$defs`` left inside the operations, every schema that used
    one failed to resolve."""
    jsonschema = pytest.importorskip("jsonschema")
    referencing = pytest.importorskip("referencing")
    from referencing.jsonschema import DRAFT202012

    registry = referencing.Registry().with_resource("urn:vecbridge", DRAFT202012.create_resource(doc))
    checked = 0
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            media = op.get("requestBody", {}).get("content", {}).get("application/json")
            if not media:
                continue
            pointer = "/".join(p.replace("~", "~0").replace("/", "~1")
                               for p in ("paths", path, method, "requestBody", "content", "application/json", "schema"))
            validator = jsonschema.Draft202012Validator({"$ref": f"urn:vecbridge#/{pointer}"}, registry=registry)
            for name, example in media.get("examples", {}).items():
                errors = [e.message for e in validator.iter_errors(example["value"])]
                assert not errors, (method, path, name, errors[:3])
                checked += 1
    assert checked >= 25


# --- the name rules and limits the document declares ------------------------------------------------------------
_EDGES = ["a", "a..b", ".a", "-a", "_a", "a.", "a-", "a->b", "->", "a>", "a-->b", "a.->b", "9", "a b", "a/b", "",
          "a\n", "\na", "a" * MAX_NAME, "a" * (MAX_NAME + 1), "a@prod", "a@_x", "a@1x", "a@p..q", "a:1", "a:0",
          "a:12345678901", "a:2147483647", "a:2147483648", "a:4294967296", "a:9999999999", "a:0000000001", "a:00",
          "a:01", "a:02147483647", "a:1@p", "a@p:1", "a..b@p", "x" * MAX_NAME + "@" + "p" * MAX_ALIAS]
_TEXT = (st.text(alphabet="aZ09._->@: \n/", max_size=12) | st.sampled_from(_EDGES)
         | st.integers(0, 10**11).map(lambda n: f"a:{n}"))


def _declares(schema):
    """Whether an ECMA-262 validator (jsonschema_rs: ``$`` is the end of the text, as in a browser) takes a string."""
    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    return jsonschema_rs.validator_for(schema).is_valid


def _accepts(check, text) -> bool:
    try:
        check(text)
        return True
    except InvalidNameError:
        return False


@hsettings(max_examples=300, deadline=None)
@given(text=_TEXT)
def test_the_declared_name_patterns_are_the_checks(text):
    """The patterns of /openapi.json are built from the expressions check_name / check_alias / parse_ref use; a
    validator reading the document takes exactly the names they take. Before, the reference pattern's version was
    any 1-10 digits: `name:0` and `name:9999999999` were declared valid and answered 422."""
    def schema(pattern, n):
        return {"type": "string", "minLength": 1, "maxLength": n, "pattern": pattern}

    assert _declares(schema(NAME_PATTERN, MAX_NAME))(text) == _accepts(check_name, text), text
    assert _declares(schema(ALIAS_PATTERN, MAX_ALIAS))(text) == _accepts(check_alias, text), text
    assert _declares(schema(REF_PATTERN, MAX_REF))(text) == _accepts(parse_ref, text), text


def _param(doc, path, method, name):
    return next(p["schema"] for p in doc["paths"][path][method]["parameters"] if p["name"] == name)


def test_names_declare_their_rules(doc):
    for path, method, param, pattern in (("/v1/spaces/{name}", "get", "name", NAME_PATTERN),
                                         ("/v1/maps/{ref}/transform", "post", "ref", REF_PATTERN),
                                         ("/v1/maps/{name}/aliases/{alias}", "put", "alias", ALIAS_PATTERN),
                                         ("/v1/steers/{ref}/transfer", "post", "ref", REF_PATTERN),
                                         ("/v1/maps/{ref}/evaluate", "post", "ref", REF_PATTERN)):
        assert _param(doc, path, method, param)["pattern"] == pattern, (path, param)
    assert _param(doc, "/v1/indexes/{name}", "get", "name")["pattern"].startswith("^(?:[A-Za-z0-9]")
    space = doc["components"]["schemas"]["SpaceCreate"]["properties"]["name"]
    assert space["pattern"] == NAME_PATTERN and space["maxLength"] == MAX_NAME
    fit = doc["paths"]["/v1/fits"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]
    assert fit["target_space"]["pattern"] == NAME_PATTERN
    assert fit["alias"]["anyOf"][0]["pattern"] == ALIAS_PATTERN


def test_the_transform_options_declare_their_values(doc):
    assert _param(doc, "/v1/maps/{ref}/transform", "post", "output")["enum"] == ["frame", "raw", "linear"]
    assert _param(doc, "/v1/maps/{ref}/transform", "post", "encoding_format")["enum"] == ["float", "base64"]


def _k(doc, path):
    """The schema of a search's ``k`` beside its null (an optional field: null is the default)."""
    k = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]["k"]
    return next(s for s in k["anyOf"] if s.get("type") == "integer")


def test_the_declared_k_is_the_configured_limit(doc, tmp_path):
    """``k`` said ``maximum: 10000`` while the service refuses more than ``limits.max_k`` (default 1000)."""
    from _api_support import R, populate
    from fastapi.testclient import TestClient

    for path in ("/v1/indexes/{name}/search", "/v1/collections/{name}/search"):
        assert _k(doc, path)["maximum"] == 1000 and "x-limit" not in _k(doc, path)
    app = create_app(settings_for(tmp_path, limits={"max_k": 7}))
    with TestClient(app) as c:
        data = populate(app.state.vb.registry)
        app.state.vb.indexes.create("ix", "b", data["Y"][:50], dim=16)
        assert _k(c.get("/openapi.json").json(), "/v1/indexes/{name}/search")["maximum"] == 7
        for k, status in ((7, 200), (8, 422)):
            r = c.post("/v1/indexes/ix/search", json={"vectors": data["Y"][:1].tolist(), "k": k}, headers=R)
            assert r.status_code == status, (k, r.text)


@pytest.mark.parametrize("path, method", [
    ("/v1/maps/{ref}/transform", "post"), ("/v1/indexes/{name}/search", "post"), ("/v1/indexes", "post"),
    ("/v1/indexes/{name}/vectors", "post"), ("/v1/embeddings", "post"), ("/v1/steers/{ref}/apply", "post"),
    ("/v1/plans", "post"), ("/v1/maps/{ref}/evaluate", "post")])
def test_the_routes_of_the_compute_gate_declare_its_429(doc, path, method):
    """A heavy call past ``compute_max_waiting`` waiting is a 429 on every route whose work runs on the compute
    gate's threads (``HeavyGate.run`` / ``hop``); the transform, search, index writes, embeddings and steer apply
    answered it undeclared."""
    assert "429" in doc["paths"][path][method]["responses"], sorted(doc["paths"][path][method]["responses"])


@pytest.mark.parametrize("root", ["", "/vb"])
def test_the_document_is_encoded_once_and_carries_an_etag(tmp_path, monkeypatch, root):
    """GET /openapi.json encoded the whole document (~240 KB) again for every request (FastAPI's route: 2-8 ms each,
    and /docs loads it every time) and carried no ETag, so a browser fetched it whole each time. Now its bytes (those
    FastAPI sent) are encoded once per root path, with an ETag (If-None-Match: 304, no body); under a root path the
    document still names it in `servers` (so its ETag differs); a HEAD answers the GET's headers."""
    import json

    from fastapi.testclient import TestClient
    from starlette.responses import JSONResponse

    encoded = []
    real = json.dumps
    monkeypatch.setattr(json, "dumps", lambda obj, *a, **k: (
        isinstance(obj, dict) and "openapi" in obj and encoded.append(1)) or real(obj, *a, **k))
    app = create_app(settings_for(tmp_path, root_path=root))
    with TestClient(app) as c:
        url = f"{root}/openapi.json"
        first, again = c.get(url), c.get(url)
        assert first.status_code == again.status_code == 200 and len(encoded) == 1  # before: once per request
        etag = first.headers["etag"]
        assert again.content == first.content and again.headers["etag"] == etag
        assert first.headers["cache-control"] == "no-cache"
        hit = c.get(url, headers={"If-None-Match": etag})
        assert hit.status_code == 304 and hit.content == b"" and hit.headers["etag"] == etag
        assert c.get(url, headers={"If-None-Match": '"other"'}).content == first.content
        head = c.head(url)
        assert head.status_code == 200 and head.content == b""
        assert [head.headers.get(h) for h in ("etag", "content-length", "content-type")] == \
            [first.headers.get(h) for h in ("etag", "content-length", "content-type")]
        assert len(encoded) == 1
        expected = {**app.openapi(), **({"servers": [{"url": root}]} if root else {})}
        assert first.content == JSONResponse(expected).body  # FastAPI's bytes, the prefix in servers


def test_binary_answers_declare_bytes(doc):
    """The map artifact and the transform's octet-stream and .npy answers were declared as bare media types (no
    schema), so a generated client could not tell they are bytes (some read them as text, some dropped them). Each
    answer's media type now has a schema, and every binary one is a string of format binary, as the request bodies
    already were."""
    binary = []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for status, answer in op.get("responses", {}).items():
                for media, body in answer.get("content", {}).items():
                    assert "schema" in body, (method, path, status, media)
                    if media in ("application/octet-stream", "application/x-npy"):
                        assert {k: body["schema"].get(k) for k in ("type", "format")} == \
                            {"type": "string", "format": "binary"}, (method, path, media)
                        binary.append((method, path, media))
    assert sorted(binary) == [("get", "/v1/maps/{ref}/artifact", "application/octet-stream"),
                              ("post", "/v1/maps/{ref}/transform", "application/octet-stream"),
                              ("post", "/v1/maps/{ref}/transform", "application/x-npy")]


def test_no_operation_repeats_a_tag_and_operation_ids_are_unique(doc):
    """``GET /v1/info`` said ``"tags": ["ops", "ops"]`` (its route repeated the tag of its router), and
    openapi-generator wrote the operation twice, once as ``infoV1InfoGet_1``. Each operation names a tag once, and
    no two operations share an ``operationId`` (a generator names a method by it)."""
    ids = []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert op.get("tags") and len(op["tags"]) == len(set(op["tags"])), (method, path, op.get("tags"))
            ids.append(op["operationId"])
    assert doc["paths"]["/v1/info"]["get"]["tags"] == ["ops"]
    assert len(ids) == len(set(ids)) > 50, sorted(i for i in ids if ids.count(i) > 1)


def test_integer_fields_take_the_whole_numbers_their_schema_declares(doc, tmp_path):
    """The document says ``type: integer``, which JSON Schema (and so generated clients and fuzzers) reads as any whole
    number, ``1.0`` too, but ``{"dim": 1.0}`` was a 422 "Input should be a valid integer" (``random_state: 25332.0``,
    ``k: 337.0`` too): integer fields take a whole float as the integer it is. A fraction is refused naming it (never
    rounded), and so is a whole float past 2**53 (it may already be another integer, rounded: an id must not land on
    its neighbour), ``true`` and ``"4"``. The bounds stay in the schema as ``minimum`` / ``maximum``: pydantic wrote
    the bounds of a nullable field read through a validator as ``ge`` / ``le``, keywords JSON Schema ignores."""
    from _api_support import W, populate
    from fastapi.testclient import TestClient

    nowhere = [(where, k) for where, k, _ in _walk(doc) if k in ("ge", "le", "gt", "lt") and "/properties/" in where]
    assert not nowhere, nowhere[:5]
    dim = doc["components"]["schemas"]["SpaceCreate"]["properties"]["dim"]["anyOf"][0]
    assert (dim["type"], dim["minimum"], dim["maximum"]) == ("integer", 1, 65536)
    app = create_app(settings_for(tmp_path))
    with TestClient(app) as c:
        data = populate(app.state.vb.registry)
        r = c.post("/v1/spaces", json={"name": "whole", "dim": 4.0}, headers=W)
        assert r.status_code == 201 and r.json()["dim"] == 4, r.text
        rows = data["Y"][:6].tolist()
        r = c.post("/v1/indexes", headers=W, json={"name": "ix", "space": "b", "vectors": rows, "random_state": 25332.0,
                                                   "ids": [10.0, 11.0, 12.0, 13.0, 14.0, 15.0]})
        assert r.status_code == 201 and r.json()["params"]["random_state"] == 25332, r.text
        r = c.post("/v1/indexes/ix/search", json={"vectors": rows[:1], "k": 3.0}, headers=W)
        assert r.status_code == 200 and [h["id"] for h in r.json()["results"][0]][:1] == [10], r.text
        assert len(r.json()["results"][0]) == 3
        for body, says in (({"name": "x", "dim": 1.5}, "must be an integer, got 1.5"),
                           ({"name": "x", "dim": True}, "valid integer"), ({"name": "x", "dim": "4"}, "valid integer"),
                           ({"name": "x", "dim": 0.0}, "greater than or equal to 1")):
            r = c.post("/v1/spaces", json=body, headers=W)
            assert r.status_code == 422 and says in r.json()["error"]["message"], (body, r.text)
        r = c.post("/v1/indexes/ix/delete", json={"ids": [float(2**60)]}, headers=W)
        assert r.status_code == 422 and "2**53" in r.json()["error"]["message"], r.text
        assert c.post("/v1/indexes/ix/search", json={"vectors": rows[:1], "k": 2.5}, headers=W).status_code == 422
        assert c.get("/v1/indexes/ix", headers=W).json()["count"] == 6


def test_tags_are_declared_as_the_text_they_are(doc, tmp_path):
    """A tag's value is stored as text (``{"value": 1}`` reads back ``"1"``), but the request said "Any JSON value"
    and ``VersionOut.tags`` was ``additionalProperties: true``, so a generated client typed tags as anything. The
    answer's tags are declared strings, and the request's value says how it is stored; real answers match."""
    jsonschema = pytest.importorskip("jsonschema")
    from _api_support import W, populate
    from fastapi.testclient import TestClient

    tags = doc["components"]["schemas"]["VersionOut"]["properties"]["tags"]
    assert tags["type"] == "object" and tags["additionalProperties"] == {"type": "string"}, tags
    value = doc["components"]["schemas"]["TagSet"]["properties"]["value"]
    assert "stored as text" in value["description"].lower() and "Any JSON value" not in str(value)
    schema = {**tags, "$schema": "https://json-schema.org/draft/2020-12/schema"}
    app = create_app(settings_for(tmp_path))
    with TestClient(app) as c:
        populate(app.state.vb.registry)
        cases = ((1, "1"), (True, "true"), ({"a": [1, 2]}, '{"a":[1,2]}'), ("team", "team"), (None, "null"))
        for sent, stored in cases:
            r = c.put("/v1/maps/a2b/versions/1/tags/k", json={"value": sent}, headers=W)
            assert r.status_code == 200 and r.json()["tags"]["k"] == stored, (sent, r.text)
            jsonschema.validate(r.json()["tags"], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"k": 1}, schema)
