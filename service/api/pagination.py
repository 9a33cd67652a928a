"""Keyset pagination for the list routes: ``?limit=N&cursor=C`` in, ``{"data": [...], "next": C'}`` out.

A list route sorts its items by a key that is unique and never changes for an item (a name, a
version number, a job's ``seq``); the cursor is that key of the last item sent,
packed as opaque URL-safe base64 JSON. The next page holds the items whose key is greater, so
items created or deleted between two requests never shift the others: no item is sent twice
or skipped (unlike ``offset``), and ``next`` is ``null`` on the last page.

Without ``limit`` a route answers every item in one page (``next`` null), as before pagination
existed, so older clients keep working.

A route whose items are costly to build (a map's summary judges its versions) picks the page first: its
``load_page(after, n)`` answers only the items after the cursor's name, at most ``n`` (:func:`keyset_page`).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any

import orjson
from fastapi import Depends, Query
from starlette.concurrency import run_in_threadpool

from align.exceptions import InputError

from .deps import ReadScope, StateDep
from .responses import FastJSONResponse

__all__ = ["PageParams", "Page", "paginate", "paged", "keyset_page", "list_route", "encode_cursor", "decode_cursor",
           "MAX_LIMIT"]

MAX_LIMIT = 10_000


def encode_cursor(key: Any) -> str:
    """The opaque cursor for a sort key (a JSON value: str, int, float or a list of them)."""
    return base64.urlsafe_b64encode(orjson.dumps(key)).decode("ascii").rstrip("=")


def decode_cursor(cursor: str) -> Any:
    """The sort key packed in ``cursor``; :class:`~align.exceptions.InputError` (422) when it is not one."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        key = orjson.loads(raw)
    except (binascii.Error, ValueError, orjson.JSONDecodeError):
        raise InputError(f"cursor {cursor[:40]!r} is not a cursor this service issued; "
                         f"send the `next` value of the previous page") from None
    return tuple(key) if isinstance(key, list) else key


class PageParams:
    """The ``limit`` / ``cursor`` query parameters shared by every list route."""

    def __init__(self, limit: int | None = None, cursor: str | None = None):
        self.limit = limit
        self.cursor = cursor


async def page_params(limit: int | None = Query(None, ge=1, le=MAX_LIMIT,
                                                description="Items per page; omit for every item in one page."),
                      cursor: str | None = Query(None, max_length=2048,
                                                 description="The `next` value of the previous page.")) -> PageParams:
    """The dependency (``async``: a class dependency would cost a thread-pool hop per request)."""
    return PageParams(limit, cursor)


Page = Annotated[PageParams, Depends(page_params)]


def paginate(items: Sequence[Any], key: Callable[[Any], Any], page: PageParams, descending: bool = False, *,
             cursor_type: type | None = None) -> dict:
    """One page of ``items`` (any order; sorted here by ``key``, ``descending`` for the greatest key first) as
    ``{"data": [...], "next": cursor | None}``.

    ``key(item)`` must be unique per item and comparable with the keys of the other items
    (and with the decoded cursor: a str, int, float or a tuple of them). ``cursor_type``: the type every key has
    (``str`` for a list by name): a cursor of another is refused even when the list is empty (it answered 200
    there, where a list with items answered 422).
    """
    ordered = sorted(items, key=key, reverse=descending)
    if page.cursor is not None:
        after = decode_cursor(page.cursor)
        _check_type(after, cursor_type)
        try:
            ordered = [it for it in ordered if (key(it) < after if descending else key(it) > after)]
        except TypeError:
            raise InputError(_FOREIGN) from None
    return _first(ordered, page.limit, key)


def _first(ordered: list, limit: int | None, key: Callable[[Any], Any]) -> dict:
    """The page of the first ``limit`` of ``ordered`` (None: all), its ``next`` cursor the last one's ``key`` when
    more follow."""
    if limit is None or len(ordered) <= limit:
        return {"data": ordered, "next": None}
    data = ordered[:limit]
    return {"data": data, "next": encode_cursor(key(data[-1]))}


_FOREIGN = "cursor does not belong to this list; send the `next` value of the previous page"


def _check_type(after: Any, cursor_type: type | None) -> None:
    """InputError (:data:`_FOREIGN`) for a decoded cursor that is not a ``cursor_type`` (None: not checked here)."""
    if cursor_type is not None and (not isinstance(after, cursor_type) or isinstance(after, bool)):
        raise InputError(_FOREIGN)


def keyset_page(load_page: Callable[[str | None, int | None], Sequence[dict]], page: PageParams) -> dict:
    """:func:`paginate` by name of a list whose ``load_page(after, n)`` answers its items in name order (as Python
    sorts), only those whose name is greater than ``after`` (None: from the first), at most ``n`` (None: all):
    the page is chosen before its items are built. The same answers as :func:`paginate` with ``cursor_type=str``,
    a foreign cursor's refusal included (an empty list's too)."""
    after = None if page.cursor is None else decode_cursor(page.cursor)
    if page.cursor is not None:
        _check_type(after, str)
    items = list(load_page(after, None if page.limit is None else page.limit + 1))
    return _first(items, page.limit, lambda d: d["name"])


async def paged(load: Callable[[], Sequence[dict]], page: PageParams, key: Callable[[Any], Any] | None = None):
    """The JSON answer of a list route: ``load()`` (run off the event loop), one page of it by ``key``
    (default: the item's ``name``, and a cursor must be a name's)."""
    return FastJSONResponse(paginate(await run_in_threadpool(load), key or (lambda d: d["name"]), page,
                                     cursor_type=None if key else str))


def list_route(router, path: str, *, name: str, summary: str, response_model,
               load: Callable[[Any], Sequence[dict]] | None = None,
               load_page: Callable[[Any, str | None, int | None], Sequence[dict]] | None = None,
               ready: Callable[[Any], Awaitable[None]] | None = None):
    """Register ``GET path`` (read scope) answering one page, by name, of ``load(state)`` (the app state; run off
    the event loop), or of ``load_page(state, after, n)`` (:func:`keyset_page`), after ``await ready(state)`` when
    given. ``name`` is the endpoint's name, hence its OpenAPI operationId."""

    async def endpoint(state: StateDep, page: Page):
        if ready is not None:
            await ready(state)
        if load_page is not None:
            return FastJSONResponse(await run_in_threadpool(
                keyset_page, lambda after, n: load_page(state, after, n), page))
        return await paged(lambda: load(state), page)

    endpoint.__name__ = endpoint.__qualname__ = name
    router.get(path, dependencies=[ReadScope], summary=summary, response_model=response_model)(endpoint)
