"""Numbers in JSON request bodies: the types of their integer and real fields.

An integer field takes an integer as JSON writes it, and a whole-number float below 2**53 (``1.0``, ``25332.0``, up
to 2**53 - 1, JavaScript's ``Number.MAX_SAFE_INTEGER``) as the integer it is: the document says ``type: integer``,
which JSON Schema, generated clients and fuzzers read as any whole number, ``1.0`` too (the Python client's
``as_ints`` sends whole floats as ints). Refused (422, naming the value): a fraction (``1.5``, never rounded), a
whole float of magnitude 2**53 or more (it may already be an integer rounded on its way: 2**53 + 1 written as a float
is 2**53, and an id must not land on its neighbour), ``true`` and ``"4"`` (pydantic's lax ints took them as 1 and
4). An integer literal is exact at any size the field allows (``9007199254740993`` is that id).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, Strict

from ..limits import EXACT_FLOAT_INT, whole_int  # the one rule, index parameters' too

__all__ = ["EXACT_FLOAT_INT", "Count", "Flag", "Real", "count", "whole_int"]


def count(least: int | None = None, most: int | None = None) -> Any:
    """The type of an integer field in ``[least, most]``: give the bounds here, not in the field's ``Field()``, where
    the field may be null (``count(1, 9) | None``): pydantic cannot put a ``Field``'s bounds into an int read by a
    validator inside a union, checks them apart, and writes ``ge`` / ``le`` into the schema, keywords JSON Schema
    ignores (a generated client or a validator saw no bound); here they are the int's own: ``minimum`` / ``maximum``."""
    return Annotated[int, Strict(), Field(ge=least, le=most), BeforeValidator(whole_int)]


#: A count, id or seed in a JSON body (dims, k, ...): an integer, or a whole float below 2**53 (the module says why).
Count = count()
#: A real number in a JSON body: an integer or a float as JSON writes it (not `true`, not "nan").
Real = Annotated[float, Strict()]
#: A yes/no field in a JSON body: ``true`` or ``false`` only. pydantic's lax bool took ``0``, ``-0.0``, ``1`` and the
#: strings "1", "yes", "off" as booleans, where a number field refuses ``true``: strict both ways.
Flag = Annotated[bool, Strict()]
