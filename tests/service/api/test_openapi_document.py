"""The OpenAPI document as a document: every ``$ref`` in it resolves, it is a valid OpenAPI 3.1 document and each of
its schemas a valid JSON Schema (2020-12)."""

from __future__ import annotations

import pytest
from _api_support import settings_for

from service.api import create_app


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
