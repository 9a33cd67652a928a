"""Both Python clients behind one blocking face, so that one test body checks ``Client`` and ``AsyncClient``
(no tests here).

``CLIENTS["async"]`` is the real :class:`service.client.AsyncClient` (real ``httpx.AsyncClient``, real
sockets); each coroutine method is run to completion on a private event loop, one call at a time, so the sync
client's tests read the same for it. A test marked :data:`both_clients` runs once per client; its fixtures
``client_kind`` / ``client_cls`` (tests/conftest.py) say which.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from typing import Self

import httpx
import pytest

from service.client import AsyncClient, Client


class BlockingAsyncClient:
    """An :class:`AsyncClient` whose coroutine methods block until done (``AsyncClient``'s arguments; an
    ``httpx.HTTPTransport`` is not one: pass an ``httpx.AsyncHTTPTransport``)."""

    def __init__(self, *args, **kw) -> None:
        self._loop = asyncio.new_event_loop()
        self.client = AsyncClient(*args, **kw)

    def __getattr__(self, name):
        attr = getattr(self.client, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        @functools.wraps(attr)
        def blocking(*args, **kw):
            return self._loop.run_until_complete(attr(*args, **kw))

        return blocking

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if not self._loop.is_closed():
            self._loop.run_until_complete(self.client.close())
            self._loop.close()


CLIENTS = {"sync": Client, "async": BlockingAsyncClient}
CLIENT_KINDS = list(CLIENTS)
TRANSPORTS = {"sync": httpx.HTTPTransport, "async": httpx.AsyncHTTPTransport}
both_clients = pytest.mark.parametrize("client_kind", CLIENT_KINDS, indirect=True)
