"""The base of the request body models: an optional field sent as JSON ``null`` is the field left out.

Many JSON clients send ``null`` for "not given" (a dataclass or a pydantic model dumped with its None fields, a
JavaScript object with a property set to null). Such a body was a 422 wherever the field's type had no null:
``"k": null`` on a search, ``"output": null`` on a transform, ``"random_state": null`` on a fit. Now every model
of a request body takes ``null`` in an optional field as its default, and its schema in the OpenAPI document says
so: the field admits null (``anyOf: [..., {"type": "null"}]``, as pydantic writes ``X | None``). A required field
stays required: ``null`` there is refused as before. No optional field of a body means something by ``null`` other
than its default (``tests/service/api/test_null_as_absent.py`` calls each one both ways).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

__all__ = ["RequestModel", "StrictRequestModel"]

_OUTER = ("title", "description", "default", "examples")  # stay beside the anyOf, as pydantic places them


def _admits_null(schema: dict) -> bool:
    kind = schema.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    if any(_admits_null(s) for s in (*schema.get("anyOf", ()), *schema.get("oneOf", ()))):
        return True
    # a schema that constrains nothing (Any) admits null too
    return not any(k in schema for k in ("type", "$ref", "anyOf", "oneOf", "allOf", "enum", "const"))


def _nullable_optionals(schema: dict[str, Any], model: type) -> None:
    """``json_schema_extra``: each property not in ``required`` admits null."""
    required = set(schema.get("required", ()))
    props = schema.get("properties", {})
    for name, prop in props.items():
        if name not in required and not _admits_null(prop):
            outer = {k: prop.pop(k) for k in _OUTER if k in prop}
            props[name] = {"anyOf": [prop, {"type": "null"}], **outer}


class RequestModel(BaseModel):
    """A request body's model: ``null`` in an optional field is the field left out (see the module)."""

    model_config = ConfigDict(json_schema_extra=_nullable_optionals)

    @model_validator(mode="before")
    @classmethod
    def _null_is_left_out(cls, data: Any) -> Any:
        if not isinstance(data, dict) or None not in data.values():
            return data
        optional = {f.alias or n for n, f in cls.model_fields.items() if not f.is_required()}
        return {k: v for k, v in data.items() if v is not None or k not in optional}


class StrictRequestModel(RequestModel):
    """A :class:`RequestModel` that refuses fields it does not name (a misspelt option is a 422, not ignored)."""

    model_config = ConfigDict(extra="forbid")
