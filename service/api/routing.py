"""The route class of the routers whose routes take a pydantic body model (spaces, aliases, tags, index
deletes, embeddings, steer transfers).

FastAPI reads and parses such a body itself, before any dependency runs: with ``json.loads``, which
takes ``NaN``, ``Infinity`` and lone surrogates (``"\\ud800"``) that no other route accepts and that
fail later, deep in the service (orjson, SQLite, the tokenizer: a 500), and it turns any error raised
while the body is read into a 400 "There was an error parsing the body", hiding the 413 of the body
limit (:class:`~service.api.middleware.GuardMiddleware`) for a chunked body. :class:`CodecRoute`
parses these bodies with :func:`~service.api.codec.parse_json`, the parser of every other JSON route,
and answers the service's own errors raised while reading the body as themselves.
"""

from __future__ import annotations

from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import Request

from align.exceptions import VecbridgeError

from .codec import parse_json

__all__ = ["CodecRoute"]


class _CodecRequest(Request):
    async def json(self):
        if not hasattr(self, "_json"):
            self._json = parse_json(await self.body())
        return self._json


class CodecRoute(APIRoute):
    """An ``APIRoute`` whose JSON body is parsed by the codec (InputError: 422) and whose body-reading errors
    that are the service's own (PayloadTooLargeError: 413, InputError) reach the error handler unchanged."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def route_handler(request: Request):
            try:
                return await handler(_CodecRequest(request.scope, request.receive))
            except HTTPException as exc:
                if isinstance(exc.__cause__, VecbridgeError):  # FastAPI's 400 around an error of ours
                    raise exc.__cause__ from None
                raise

        return route_handler
