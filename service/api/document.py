"""The finishing pass of the OpenAPI document (``/openapi.json``), run once when it is first built.

FastAPI writes each operation from its route; what no single route knows is added here, from the document
and the service's settings:

* each operation's body limit, in its description (``body_limit``: the limit the guard enforces);
* the ``$defs`` of the request schemas that routes read themselves (:func:`service.api.openapi.json_body`),
  moved into ``components.schemas``, where their ``$ref`` (``#/components/schemas/...``) point: left inside an
  operation, ``#/$defs/...`` resolved from the document's root and found nothing.
"""

from __future__ import annotations

from typing import Any

from .middleware import body_limit

__all__ = ["finish_document", "hoist_defs"]

_NO_BODY = ("get", "head", "delete")


def _takes_body(method: str) -> bool:
    return method.lower() not in _NO_BODY


def hoist_defs(spec: dict) -> None:
    """Move every ``$defs`` found under ``spec["paths"]`` into ``components.schemas`` (ValueError when a name is
    taken by another schema: two models of one name would then share one entry)."""
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for name, schema in node.pop("$defs", {}).items():
                walk(schema)
                if schemas.setdefault(name, schema) != schema:
                    raise ValueError(f"OpenAPI component {name!r} is defined twice, differently")
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(spec.get("paths", {}))


def finish_document(spec: dict, settings) -> dict:
    """``spec`` (FastAPI's document) finished in place, as described in this module's docstring."""
    for path, ops in spec.get("paths", {}).items():
        for method, op in ops.items():
            if not isinstance(op, dict):
                continue
            if _takes_body(method):
                n, setting = body_limit(settings, method.upper(), path)
                nb, setting_b = body_limit(settings, method.upper(), path, "application/octet-stream")
                text = f"\n\nBody limit: {n} bytes (`{setting.split(';')[0]}`)"
                if nb != n:
                    text += f"; binary bodies {nb} bytes (`{setting_b}`)"
                op["description"] = (op.get("description") or "") + text + "."
    hoist_defs(spec)
    return spec
