"""Response classes: JSON through orjson (numpy arrays serialised natively) when installed."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from starlette.responses import JSONResponse

from ..registry.models import json_default as _default
from ..registry.names import utf8_safe

try:  # orjson turns float32 arrays into JSON ~10x faster than json + tolist()
    import orjson

    _OPTS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS

    def dumps(obj: Any) -> bytes:
        try:
            return orjson.dumps(obj, option=_OPTS, default=_default)
        except orjson.JSONEncodeError as exc:  # a lone surrogate: orjson writes UTF-8 only, and a record stored
            if "surrogates" not in str(exc):  # before utf8_safe (a file name that is not UTF-8) was a 500 for good
                raise
            return orjson.dumps(utf8_safe(obj), option=_OPTS, default=lambda o: utf8_safe(_default(o)))

    def dumps_plain(obj: Any) -> bytes:
        """:func:`dumps` of JSON's own types only (str keys; str, int, float, bool, None, lists, dicts): the same
        bytes, without the options others need, ~2x faster on many small dicts (a search's hits)."""
        return orjson.dumps(obj)

    loads = orjson.loads
except ImportError:  # pragma: no cover - orjson is in the service extra
    orjson = None

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, default=_default, separators=(",", ":")).encode()

    dumps_plain = dumps
    loads = json.loads

__all__ = ["FastJSONResponse", "dumps", "dumps_blocks", "dumps_plain", "loads"]


class FastJSONResponse(JSONResponse):
    """JSON through :func:`dumps`. A ``JSONResponse`` subclass, so FastAPI documents a route's
    ``response_model`` as its body schema (for any other ``Response`` class it writes ``string``)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        if isinstance(content, dict) and any(isinstance(v, np.ndarray) and v.size > _BLOCK_VALUES
                                             for v in content.values()):
            return dumps_blocks(content)
        return dumps(content)


_BLOCK_VALUES = 1 << 18  # numbers per serialised block: a few ms each, so other threads get the GIL between


def dumps_blocks(content: dict) -> bytes:
    """:func:`dumps` of a dict whose large 2-D arrays are written a block of rows at a time.

    Same bytes as ``dumps(content)``; orjson holds the GIL for a whole call, so one 40 MB array
    would stall the event loop (``/healthz``) for the whole serialisation — block by block, the
    interpreter can switch threads between blocks.
    """
    parts = []
    for key, value in content.items():
        if isinstance(value, np.ndarray) and value.ndim == 2 and value.size > _BLOCK_VALUES:
            rows = max(1, _BLOCK_VALUES // max(1, value.shape[1]))
            blocks = [dumps(value[s : s + rows])[1:-1] for s in range(0, value.shape[0], rows)]
            parts.append(dumps(str(key)) + b":[" + b",".join(blocks) + b"]")
        else:
            parts.append(dumps(str(key)) + b":" + dumps(value))
    return b"{" + b",".join(parts) + b"}"
