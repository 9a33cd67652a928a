"""The name rules as OpenAPI types: path parameters and body fields that name a space, map, steer, alias, map
reference or index declare the pattern and length the service holds them to.

The patterns come from the checks themselves (:mod:`service.registry.names`, :data:`service.indexes.kinds.NAME_RE`),
so the document cannot drift from them. They describe; the checks still decide (their messages say what is wrong):
a name breaking them is a 422 where it is created, a 404 where it is looked up.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Path
from pydantic import Field, WithJsonSchema

from ..indexes.kinds import NAME_RE
from ..limits import MAX_PATH_MAPS
from ..registry import names as rules

__all__ = ["AliasName", "AliasPath", "IndexName", "IndexNamePath", "MapPath", "Name", "NamePath", "Ref",
           "RefPath"]

_NAME = {"type": "string", "minLength": 1, "maxLength": rules.MAX_NAME, "pattern": rules.NAME_PATTERN,
         "description": f"A name: ASCII letters, digits, '.', '_', '-' and '->', at most {rules.MAX_NAME} "
                        "characters, not starting with '.' or '-', no '..'."}
_ALIAS = {"type": "string", "minLength": 1, "maxLength": rules.MAX_ALIAS, "pattern": rules.ALIAS_PATTERN,
          "description": f"An alias: an ASCII letter or '_', then letters, digits, '.', '_', '-' (no '..'), at most "
                         f"{rules.MAX_ALIAS} characters."}
_REF = {"type": "string", "minLength": 1, "maxLength": rules.MAX_REF, "pattern": rules.REF_PATTERN,
        "description": "A reference: `name`, `name@alias` or `name:N`."}
_INDEX = {"type": "string", "pattern": f"^(?:{NAME_RE.pattern})$",
          "description": "An index name: an ASCII letter or digit, then letters, digits, '.', '_', '-' (the pattern "
                         "bounds its length)."}

Name = Annotated[str, WithJsonSchema(_NAME)]
AliasName = Annotated[str, WithJsonSchema(_ALIAS)]
Ref = Annotated[str, WithJsonSchema(_REF)]
IndexName = Annotated[str, WithJsonSchema(_INDEX)]
#: A pinned map (``name``, ``name@alias``, ``name:N``) or a path of them in order (a list, at most MAX_PATH_MAPS):
#: what a search's or an embedding's ``map`` takes; ``service.ops.indexes.translation`` checks it hop by hop.
# "" was taken as no map (the registry's path) where [] was a 422
MapPath = Annotated[Ref, Field(min_length=1)] | Annotated[list[Ref], Field(min_length=1, max_length=MAX_PATH_MAPS)]

NamePath = Annotated[str, Path(), WithJsonSchema(_NAME)]
AliasPath = Annotated[str, Path(), WithJsonSchema(_ALIAS)]
RefPath = Annotated[str, Path(), WithJsonSchema(_REF)]
IndexNamePath = Annotated[str, Path(), WithJsonSchema(_INDEX)]
