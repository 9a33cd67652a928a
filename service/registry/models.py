"""Records returned by the registry: :class:`SpaceInfo`, and the version records :class:`VersionInfo` (maps)
and :class:`SteerInfo` (steers), both built on :class:`Record`.

These dataclasses are the single definition of what a record holds: the registry decodes database
rows into them by column name (:func:`from_row`), encodes them back into columns (:func:`to_columns`),
and the HTTP API derives its response schemas from them (``service.api.schemas``). A field without
a default is required in the API schema; JSON-typed fields (``dict`` / ``list``) are stored as JSON
text (read back showable: :func:`_json_in`); ``aliases`` and ``tags`` live in their own tables.
"""

from __future__ import annotations

import json
import typing
from dataclasses import asdict, dataclass, field, fields
from functools import cache
from typing import Any

from ..limits import JSON_INT_RANGE, MAX_JSON_DEPTH
from .errors import IntegrityError

__all__ = ["SpaceInfo", "Record", "VersionInfo", "SteerInfo", "display_fields", "columns", "from_row", "to_columns",
           "dumps", "json_default"]

_NOT_COLUMNS = ("aliases", "tags")  # annotations kept in tables of their own


@dataclass(frozen=True)
class SpaceInfo:
    """A named embedding space: its dimension and, optionally, the encoder that produces it."""

    name: str
    dim: int
    encoder: str | None = None
    query_prefix: str = ""
    passage_prefix: str = ""
    description: str = ""
    created_at: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(kw_only=True)
class Record:
    """What every immutable, numbered version in the registry holds, whatever its artifact.

    ``aliases`` (and, for maps, ``tags``) are the mutable annotations current at read time;
    ``deleted`` marks a soft-deleted version; ``collected_at`` one whose files ``registry gc`` removed (the table's
    ``deleted_at``, when it was deleted, is gc's alone: an import dates it anew). ``artifact_path`` is relative to
    the registry's artifact folder; ``artifact_sha256`` is verified on every read.
    """

    name: str
    version: int
    method: str
    params: dict[str, Any]
    random_state: int | None = None
    data_hashes: dict[str, Any]
    package_version: str
    created_at: str
    metrics: dict[str, Any]
    artifact_sha256: str
    artifact_path: str
    aliases: list[str]
    deleted: bool
    description: str
    inputs: dict[str, Any]
    collected_at: str | None = field(default=None, metadata={
        "doc": "When `vecbridge registry gc` removed the deleted version's files (its artifact, unless a version "
               "not collected shares it, and its report); null before. The record stays, for lineage."})

    @property
    def ref(self) -> str:
        """``name:version``: a reference that always resolves to this version."""
        return f"{self.name}:{self.version}"

    def to_dict(self) -> dict:
        """The record as JSON-ready values, keys in :func:`display_fields` order."""
        d = asdict(self)
        return {k: d[k] for k in display_fields(type(self))}


@dataclass(kw_only=True)
class VersionInfo(Record):
    """One immutable version of a map (``source_space`` -> ``target_space``) with its lineage.

    ``map_kind`` says which family the artifact holds: ``"linear"`` (:class:`align.LinearMap`, one
    affine map) or ``"cluster"`` (:class:`align.ClusterMap`, ``n_clusters`` blended local maps).
    """

    source_space: str
    target_space: str
    source_dim: int
    target_dim: int
    tags: dict[str, str] = field(metadata={"doc": "Tags: key -> text. A value set as another JSON value is stored, "
                                                  "and read back, as its compact JSON text (1 -> \"1\")."})
    report_path: str | None = None
    artifact_format: str
    map_kind: str = field(default="linear", metadata={
        "doc": "linear (align.LinearMap: one affine map) or cluster (align.ClusterMap: per-cluster maps blended "
               "per row; operations that need one matrix, such as steer transfer, refuse it)."})
    n_clusters: int = field(default=0, metadata={"doc": "Clusters of a cluster map; 0 for a linear map."})


@dataclass(kw_only=True)
class SteerInfo(Record):
    """One immutable version of a steer (``align.Steer`` or ``align.MeanShift``) in one space.

    ``lens`` holds the lens computed at fit time over the fitting items (directions with their
    extreme items), or ``[]`` when there were none to name.
    """

    space: str
    dim: int
    rank: int = field(metadata={"doc": "0 for a mean-shift baseline."})
    lens: list[dict[str, Any]]


@cache
def display_fields(cls) -> tuple[str, ...]:
    """Field names in the order records are shown: ``name``, ``version``, the kind's own fields, the rest."""
    own = [f.name for f in fields(cls)]
    base = [f.name for f in fields(Record)] if issubclass(cls, Record) else own
    return (*base[:2], *(n for n in own if n not in base), *base[2:])


def _json_in(v):
    """A JSON field as stored, made showable: what HTTP never takes in (an integer beyond 64 bits, nesting deeper
    than ``MAX_JSON_DEPTH - 1``) and a bundle import took before it was checked made every read of the version fail
    (orjson refuses such an integer; a copy nested 500 deep was a RecursionError): :func:`_showable` rewrites it.
    The usual record is decoded as before, unwalked (listings decode many): only a long integer literal or a value
    nested that deep (:func:`_deep`, past a bracket count) leads to the walk (the bracket count alone led a steer's
    lens of rank >= 3 to it, its many brackets side by side: 3-4x the read)."""
    if not isinstance(v, (str, bytes)):  # a driver that decodes JSON itself
        return _showable(v)
    if isinstance(v, bytes):
        v = v.decode(json.detect_encoding(v), "surrogatepass")
    try:
        value = _decode(v)
    except OverflowError:  # only _int_of raises it: a float literal past a float's range is read as inf
        return _showable(json.loads(v))
    return _showable(value) if v.count("[") + v.count("{") >= MAX_JSON_DEPTH and _deep(value) else value


_CONTAINERS = frozenset((dict, list))  # what JSON decodes to (a set: the fastest test of the three tried)


def _deep(value) -> bool:
    """Whether ``value`` (decoded JSON) holds a container ``MAX_JSON_DEPTH`` levels down (what :func:`_showable`
    rewrites): one level of containers at a time, stopping there; builds nothing but the lists of containers (a
    rank-8 steer lens: ~16 us; the walk that rebuilt it ~75 us)."""
    level = [value] if type(value) in _CONTAINERS else []
    for _ in range(MAX_JSON_DEPTH - 1):
        level = [x for c in level for x in (c.values() if type(c) is dict else c) if type(x) in _CONTAINERS]
        if not level:
            return False
    return True


def _int_of(literal: str) -> int:
    """An integer literal as an int; OverflowError from 20 characters on: perhaps outside JSON_INT_RANGE
    (``-(2**63)`` has 20)."""
    if len(literal) >= 20:
        raise OverflowError(literal[:40])
    return int(literal)


_decode = json.JSONDecoder(parse_int=_int_of).decode


def _showable(v, depth: int = 1):
    """``v`` with each integer outside :data:`~service.limits.JSON_INT_RANGE` written as its digits (a string), and
    each container deeper than ``MAX_JSON_DEPTH - 1`` levels written as its JSON text: lossless, and what an export
    of it then writes imports again. Recursion is bounded by the depth."""
    if type(v) is int:
        return v if JSON_INT_RANGE[0] <= v <= JSON_INT_RANGE[1] else str(v)
    if not isinstance(v, (dict, list)):
        return v
    if depth >= MAX_JSON_DEPTH:
        try:
            return json.dumps(v, separators=(",", ":"))
        except (RecursionError, ValueError):
            return f"<JSON nested deeper than {MAX_JSON_DEPTH - 1} levels>"
    if isinstance(v, dict):
        return {k: _showable(x, depth + 1) for k, x in v.items()}
    return [_showable(x, depth + 1) for x in v]


def _optint(v):
    return None if v is None else int(v)


@cache
def _codecs(cls) -> tuple[tuple[str, str, object], ...]:
    """``(column, how, decode)`` per stored field: ``json`` text, ``int``, ``bool`` or as is (decode None)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in fields(cls):
        if f.name in _NOT_COLUMNS:
            continue
        t = hints[f.name]
        origin = typing.get_origin(t) or t
        how = ("json" if origin in (dict, list) else "bool" if t is bool else "int" if t is int
               else "optint" if t == (int | None) else "")
        out.append((f.name, how, {"json": _json_in, "bool": bool, "int": int, "optint": _optint}.get(how)))
    return tuple(out)


def columns(cls) -> tuple[str, ...]:
    """The database columns of ``cls``'s table that hold its fields."""
    return tuple(c for c, _, _ in _codecs(cls))


def from_row(cls, row, **annotations):
    """Decode a database row (``keys()`` and values in that order, like ``sqlite3.Row``) into a ``cls`` record."""
    values = dict(zip(row.keys(), row))
    try:
        kw = {col: values[col] if decode is None else decode(values[col]) for col, _, decode in _codecs(cls)}
    except (RecursionError, ValueError) as exc:  # text that is no JSON, or nested past the parser's stack
        raise IntegrityError(f"{values.get('name')}:{values.get('version')}: a stored JSON field cannot be read "
                             f"({type(exc).__name__}: {str(exc)[:80]})") from None
    return cls(**kw, **annotations)


def to_columns(cls, values: dict) -> dict:
    """Column values of ``cls``'s table from field values (JSON fields dumped, booleans as 0/1)."""
    out = {}
    for col, how, _ in _codecs(cls):
        if col not in values:
            continue
        v = values[col]
        out[col] = dumps(v) if how == "json" else int(v) if how == "bool" else v
    return out


def dumps(obj) -> str:
    """Canonical JSON text (sorted keys; numpy scalars/arrays and paths converted)."""
    return json.dumps(obj, sort_keys=True, default=json_default)


def json_default(obj):
    """``default=`` for JSON encoders: numpy scalars and arrays, paths and sets (sorted) as plain JSON."""
    from pathlib import Path

    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, set):
        return sorted(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")

