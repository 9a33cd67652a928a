"""Keyset pagination (service.api.pagination): pages cover the list once, in order, even as it changes."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from align.exceptions import InputError
from _api_support import walk_pages

from service.api.pagination import PageParams, decode_cursor, encode_cursor, keyset_page, paginate

keys = st.one_of(st.text(max_size=12), st.integers(-10**6, 10**6),
                 st.tuples(st.floats(0, 2e9, allow_nan=False), st.text(max_size=6)))


def walk(items, key, limit, between=None):
    out = []

    def fetch(cursor):
        nonlocal items
        if between and cursor is not None:  # between two pages
            items = between(items, out)
        return paginate(items, key, PageParams(limit=limit, cursor=cursor))

    for page in walk_pages(fetch):
        assert limit is None or len(page["data"]) <= limit
        out += page["data"]
    return out


@given(st.data(), st.integers(1, 7))
def test_pages_cover_the_sorted_list_once(data, limit):
    kind = data.draw(st.sampled_from(["text", "int", "tuple"]))
    strat = {"text": st.text(max_size=12), "int": st.integers(-10**6, 10**6),
             "tuple": st.tuples(st.floats(0, 2e9, allow_nan=False), st.text(max_size=6))}[kind]
    ks = data.draw(st.lists(strat, unique=True, max_size=30))
    items = [{"k": k} for k in ks]
    assert walk(items, lambda d: d["k"], limit) == sorted(items, key=lambda d: d["k"])
    assert walk(items, lambda d: d["k"], None) == sorted(items, key=lambda d: d["k"])


@given(st.lists(st.integers(0, 1000), unique=True, min_size=1, max_size=40), st.integers(1, 5))
def test_deleting_sent_items_between_pages_skips_nothing(ks, limit):
    """Unlike offset paging, deleting rows already sent does not shift unsent rows out of reach."""
    items = [{"k": k} for k in ks]
    sent = walk(items, lambda d: d["k"], limit, between=lambda it, out: [d for d in it if d not in out])
    assert sent == sorted(items, key=lambda d: d["k"])


@given(keys)
def test_cursor_round_trip(k):
    assert decode_cursor(encode_cursor(k)) == k


@pytest.mark.parametrize("bad", ["%%%", "bm90IGpzb24", encode_cursor({"a": 1})])
def test_bad_cursor_is_an_input_error(bad):
    with pytest.raises(InputError):
        paginate([{"k": 1}, {"k": 2}], lambda d: d["k"], PageParams(limit=1, cursor=bad))


@given(st.lists(st.text("aAb0-._>", min_size=1, max_size=4), unique=True, max_size=12),
       st.one_of(st.none(), st.integers(1, 5)),
       st.one_of(st.none(), st.builds(encode_cursor, st.one_of(
           st.text("aAb0-._>", max_size=4), st.none(), st.integers(-9, 9), st.lists(st.integers(-9, 9), max_size=2)))))
def test_keyset_page_answers_as_paginate(names, limit, cursor):
    """A route that picks its page first (keyset_page: GET /v1/maps, /v1/steers) answers what paginate did over the
    whole list: the same items, cursors and refusals (a foreign cursor is refused, the empty list's too)."""
    items = [{"name": n} for n in names]
    loads = []

    def load_page(after, n):
        loads.append(n)
        rest = sorted((it for it in items if after is None or it["name"] > after), key=lambda d: d["name"])
        return rest if n is None else rest[:n]

    page = PageParams(limit=limit, cursor=cursor)
    try:
        want = paginate(items, lambda d: d["name"], page, cursor_type=str)
    except InputError as exc:
        with pytest.raises(InputError, match=str(exc)[:20]):
            keyset_page(load_page, page)
        return
    assert keyset_page(load_page, page) == want
    if cursor is None or isinstance(decode_cursor(cursor), str):  # never more than the page, and one to tell `next`
        assert loads == [None if limit is None else limit + 1]
