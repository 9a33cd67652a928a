"""Response classes: JSON through orjson (numpy arrays serialised natively) when installed."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from starlette.responses import JSONResponse

try:  # orjson turns float32 arrays into JSON ~10x faster than json + tolist()
    import orjson

    _OPTS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj, option=_OPTS, default=_default)

    loads = orjson.loads
except ImportError:  # pragma: no cover - orjson is in the service extra
    orjson = None

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, default=_default, separators=(",", ":")).encode()

    loads = json.loads

__all__ = ["FastJSONResponse", "dumps", "loads"]


def _default(obj):
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, set):
        return sorted(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


class FastJSONResponse(JSONResponse):
    """JSON through :func:`dumps`. A ``JSONResponse`` subclass, so FastAPI documents a route's
    ``response_model`` as its body schema (for any other ``Response`` class it writes ``string``)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content)
