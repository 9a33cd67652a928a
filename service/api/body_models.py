"""The base of the request body models: an optional field sent as JSON ``null`` is the field left out.

Many JSON clients send ``null`` for "not given" (a dataclass or a pydantic model dumped with its None fields, a
JavaScript object with a property set to null). Such a body was a 422 wherever the field's type had no null:
``"k": null`` on a search, ``"output": null`` on a transform, ``"random_state": null`` on a fit. Now every model
of a request body takes ``null`` in an optional field as its default, and its schema in the OpenAPI document says
so: the field admits null (``anyOf: [..., {"type": "null"}]``, as pydantic writes ``X | None``). A required field
stays required: ``null`` there is refused as before. No optional field of a body means something by ``null`` other
than its default (``tests/service/api/test_null_as_absent.py`` calls each one both ways).

A model opts fields out with ``null_refused`` (their ``null`` is a 422 with ``null_refused_message``, and the
document does not call them nullable): where a client could read ``null`` as "clear the stored value" (a JSON merge
patch) but the service keeps it, as the fields an upsert of ``POST /v1/spaces`` updates. Taken as left out, such a
null answered 200 with nothing cleared.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

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
    """``json_schema_extra``: each property not in ``required`` (nor in the model's ``null_refused``) admits null."""
    required = set(schema.get("required", ())) | set(getattr(model, "null_refused", ()))
    props = schema.get("properties", {})
    for name, prop in props.items():
        if name not in required and not _admits_null(prop):
            outer = {k: prop.pop(k) for k in _OUTER if k in prop}
            props[name] = {"anyOf": [prop, {"type": "null"}], **outer}


class RequestModel(BaseModel):
    """A request body's model: ``null`` in an optional field is the field left out (see the module)."""

    model_config = ConfigDict(json_schema_extra=_nullable_optionals)
    #: optional fields whose null is refused (422: ``null_refused_message``), not taken as the field left out
    null_refused: ClassVar[frozenset[str]] = frozenset()
    null_refused_message: ClassVar[str] = (  # as the fields of an upsert (POST /v1/spaces) are
        'null is not a value here: leave the field out or send "" (on a record that exists, either keeps the stored '
        "value; there is no way to clear it)")

    @model_validator(mode="before")
    @classmethod
    def _null_is_left_out(cls, data: Any) -> Any:
        if not isinstance(data, dict) or None not in data.values():
            return data
        optional = {f.alias or n for n, f in cls.model_fields.items() if not f.is_required()}
        optional -= cls.null_refused
        return {k: v for k, v in data.items() if v is not None or k not in optional}

    @field_validator("*", mode="before")
    @classmethod
    def _refuse_null(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None and info.field_name in cls.null_refused:
            raise PydanticCustomError("null_refused", cls.null_refused_message)
        return value


class StrictRequestModel(RequestModel):
    """A :class:`RequestModel` that refuses fields it does not name (a misspelt option is a 422, not ignored)."""

    model_config = ConfigDict(extra="forbid")
