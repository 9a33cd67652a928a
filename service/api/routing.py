"""How the routers' routes are built: :class:`CodecRoute`, the route class of the routers whose routes take a
pydantic body model (spaces, aliases, tags, index deletes, embeddings, steer transfers); :func:`with_head`, the HEAD
twin of every GET route.

FastAPI reads and parses such a body itself, before any dependency runs: with ``json.loads``, which
takes ``NaN``, ``Infinity`` and lone surrogates (``"\\ud800"``) that no other route accepts and that
fail later, deep in the service (orjson, SQLite, the tokenizer: a 500), and it turns any error raised
while the body is read into a 400 "There was an error parsing the body", hiding the 413 of the body
limit (:class:`~service.api.middleware.GuardMiddleware`) for a chunked body. :class:`CodecRoute`
parses these bodies with :func:`~service.api.codec.parse_json`, the parser of every other JSON route,
and answers the service's own errors raised while reading the body as themselves.
"""

from __future__ import annotations

import copy

from fastapi import APIRouter
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import Request

from align.exceptions import VecbridgeError

from .codec import parse_json

__all__ = ["CodecRoute", "with_head"]


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


def with_head(router: APIRouter) -> APIRouter:
    """``router``, with a ``HEAD`` route beside each of its ``GET`` routes that has none (once: the routers are
    module singletons and an app is built per test); returned for ``include_router``.

    FastAPI adds no HEAD to a GET route, so ``HEAD`` of an artifact, a record or ``/v1/info`` was a 405 (allow: GET)
    where RFC 9110 9.1 asks every general-purpose server for HEAD, and caches and monitors probe ETags with it. The
    twin is the GET route itself (same endpoint, dependencies and key scope, so the guard checks the key alike, and
    the same status and headers: ``Content-Length``, ``ETag``, a 304 on ``If-None-Match``); the server sends no body
    for a HEAD. It stays out of the OpenAPI document (one operation per GET, not two); a 405's ``Allow`` names it.
    """
    have = {r.path for r in router.routes if isinstance(r, APIRoute) and "HEAD" in r.methods}
    for route in list(router.routes):
        if isinstance(route, APIRoute) and "GET" in route.methods and route.path not in have:
            head = copy.copy(route)  # shares the endpoint, dependant and handler: only the method differs
            head.methods, head.include_in_schema = {"HEAD"}, False
            router.routes.append(head)
            have.add(route.path)
    return router

