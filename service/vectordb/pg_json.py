"""json / jsonb values of a pgvector table's extra columns, read and written back as they were.

A migration copies a ``json`` value's exact text (key order, spacing, repeated keys), tells the JSON value ``null``
(:data:`JSON_NULL`) from SQL NULL (``None``), and writes each back through the column's own dumper.
"""

from __future__ import annotations

from .base import Sentinel

__all__ = ["JSON_ARRAY_OIDS", "JSON_NULL", "JSON_OIDS", "JsonDict", "JsonList", "json_cursor", "json_out"]

JSON_OIDS = (114, 3802)  # json, jsonb
JSON_ARRAY_OIDS = (199, 3807)  # json[], jsonb[]


class JsonDict(dict):
    """A ``json`` / ``jsonb`` object read from PostgreSQL: a dict, with its exact text in ``json_text`` (written back as
    it is: a ``json`` value keeps its key order, spacing and repeated keys)."""

    json_text: str = ""


class JsonList(list):
    """A ``json`` / ``jsonb`` array read from PostgreSQL: a list, with its exact text in ``json_text``."""

    json_text: str = ""


#: In a field read from a ``json`` / ``jsonb`` column, the JSON value ``null``; ``None`` is SQL NULL (no value). Read as
#: None, a migration wrote SQL NULL for it, and a filter ``col IS NULL`` / ``col = 'null'`` then found other rows.
JSON_NULL = Sentinel("JSON_NULL")


def _load_json(data):
    """A json / jsonb value as read: a :class:`JsonDict` / :class:`JsonList` keeping its text, :data:`JSON_NULL`, or
    the scalar."""
    import json

    text = data if isinstance(data, str) else bytes(data).decode()
    v = json.loads(text)
    if v is None:
        return JSON_NULL
    if isinstance(v, (dict, list)):
        v = (JsonDict if isinstance(v, dict) else JsonList)(v)
        v.json_text = text
    return v


def json_cursor(conn):
    """A binary cursor that reads json / jsonb values with :func:`_load_json` (plain ``json.loads`` made a JSON null
    SQL NULL on the way back, and a ``json`` text lost its repeated keys)."""
    from psycopg.types.json import set_json_loads

    cur = conn.cursor(binary=True)
    set_json_loads(_load_json, cur)
    return cur


def json_out(v, array: bool = False):
    """A json / jsonb field value as COPY writes it: one read here as the text it was (:data:`JSON_NULL`: ``null``),
    anything else as JSON (``array``: a json[] / jsonb[] value, each element so)."""
    from psycopg.types.json import Jsonb

    if array and isinstance(v, list):
        return [json_out(x) for x in v]
    if isinstance(v, (JsonDict, JsonList)) and v.json_text:
        return Jsonb(v.json_text, dumps=str)  # Jsonb or Json alike: the column's dumper (by oid) takes the text
    if v is JSON_NULL:
        return Jsonb(None)
    return v
