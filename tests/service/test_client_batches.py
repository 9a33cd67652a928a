"""The Python client splits calls larger than the service's limits (``service.client_wire.spans``).

Before, ``Client.transform`` / ``add`` / ``search`` / ``apply_steer`` / ``embed`` sent every row in one request:
a million 384-d rows is 1.5 GB, far over the default ``max_body_bytes`` (64 MiB) and ``max_batch`` (65,536), so
a user got a 413 and had to write the batching loop. Now the client reads the limits from ``/v1/info`` after
the first 413 (or takes ``batch_size``) and sends batches that fit, joining the answers in order. Here a real
server runs with tiny limits (40 rows, 24 kB bodies) so that a few hundred 16-d rows need many batches. Tests
marked ``both_clients`` run ``AsyncClient`` too.
"""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
from _clients import both_clients
from _servers import seeded_uvicorn
from hypothesis import given
from hypothesis import strategies as st

from service.client import Client, ConflictError, PayloadTooLargeError, ValidationError
from service.client_wire import OVERHEAD, spans

WKEY = "wkey-456"
MAX_BATCH, MAX_BODY = 40, OVERHEAD + 24_000
MODEL = "all-MiniLM-L6-v2"  # installed with the test extras; loaded from disk, no download


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    limits = {"VECBRIDGE_MAX_BATCH": str(MAX_BATCH), "VECBRIDGE_MAX_BODY_BYTES": str(MAX_BODY)}
    with seeded_uvicorn(tmp_path_factory.mktemp("client-batches"), limits) as (url, (X, _, m)):
        yield url, X, m


def _rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 16)).astype(np.float32)


@both_clients
@pytest.mark.parametrize("binary", [True, False])
def test_a_transform_over_the_limits_is_sent_in_batches_and_joined_in_order(server, binary, client_cls):
    url, _, m = server
    X = _rows(1000)
    with client_cls(url, api_key=WKEY) as vb:
        with pytest.raises(PayloadTooLargeError):  # what a user got before: one request, refused
            vb.request("POST", "/v1/maps/a2b/transform", content=X.tobytes(),
                       headers={"Content-Type": "application/octet-stream", "X-Vector-Dim": "16"})
        Y = vb.transform("a2b", X, binary=binary)
        assert (vb._limits["max_batch"], vb._limits["max_body_bytes"]) == (MAX_BATCH, MAX_BODY)  # read after the 413
    np.testing.assert_allclose(Y, m.apply(X, output="raw"), atol=1e-5)


def test_adds_and_searches_in_batches_keep_every_row_payload_and_order(server):
    url, _, _ = server
    X = _rows(300, 1)
    payloads = [{"row": i, "text": "x" * (i % 50)} if i % 3 else None for i in range(300)]
    with Client(url, api_key=WKEY, batch_size=35) as vb:  # batch_size: split from the start
        vb.create_index("batched", "a", X[:5])
        got = vb.add("batched", X[5:], payloads=payloads[5:])
        assert got["ids"] == list(range(5, 300)) and got["count"] == 300
        res = vb.search("batched", X, k=1, include_payloads=True)["results"]
    assert [r[0]["id"] for r in res] == list(range(300))  # each row finds itself, answers in query order
    assert [r[0].get("payload") for r in res[5:]] == payloads[5:]


@both_clients
def test_an_error_in_a_later_batch_says_which_rows_were_added(server, client_cls, client_kind):
    url, _, _ = server
    X, name = _rows(100, 2), f"partial-{client_kind}"
    with client_cls(url, api_key=WKEY, batch_size=40) as vb:
        vb.create_index(name, "a", X[:1], ids=[1050])
        with pytest.raises(ConflictError) as err:  # id 1050 is in the second batch (rows 40..79)
            vb.add(name, X, ids=list(range(1000, 1100)))
        assert err.value.added_ids == list(range(1000, 1040))
        assert vb.get_index(name)["count"] == 41  # the first batch, and nothing of the refused one


@both_clients
def test_an_error_in_a_later_batch_names_the_row_of_the_callers_input(server, client_cls, client_kind):
    """The service counts rows from its batch's first: texts[37] blank in 60 texts sent 10 at a time was reported
    as "input[7] is empty" (and an add that failed part-way did not say that rows were added)."""
    url, _, _ = server
    texts = [f"a note about item {i}" for i in range(60)]
    texts[37] = "   "
    space, name = f"words-{client_kind}", f"words-{client_kind}"
    with client_cls(url, api_key=WKEY, batch_size=10) as vb:
        vb.create_space(space, 384, encoder=MODEL)
        vb.create_index(name, space)
        for call in (lambda: vb.embed(texts, MODEL), lambda: vb.search(name, texts=texts, k=1),
                     lambda: vb.add(name, texts=texts)):
            with pytest.raises(ValidationError) as err:
                call()
            assert "rows 30-39 of the call's input; row 7 of the batch is row 37 of the input" in str(err.value)
            assert "row 37" in err.value.message and str(err.value).endswith("]")  # the request id stays last
        assert err.value.added_ids == list(range(30)) and "30 rows of the earlier batches were added" in str(err.value)
        assert vb.get_index(name)["count"] == 30


def test_a_row_count_mismatch_is_still_the_services_to_refuse(server):
    url, _, _ = server
    with Client(url, api_key=WKEY, batch_size=10) as vb:
        vb.create_index("mismatch", "a", _rows(2, 3))
        with pytest.raises(Exception) as err:  # 30 rows, 29 ids: never sent as batches that silently drop ids
            vb.add("mismatch", _rows(30, 4), ids=list(range(100, 129)))
        assert err.value.status == 422 and vb.get_index("mismatch")["count"] == 2


@given(n=st.integers(0, 500), rows=st.integers(1, 64), budget=st.integers(1, 5000),
       sizes=st.lists(st.integers(0, 900), min_size=1, max_size=40))
def test_spans_cover_every_row_once_in_order_within_the_limits(n, rows, budget, sizes):
    per_row = np.resize(np.asarray(sizes, np.int64), n)
    max_bytes = int((OVERHEAD + budget) / 0.95) + 1
    parts = spans(n, per_row, max_rows=rows, max_bytes=max_bytes)
    assert [i for p in parts for i in range(n)[p]] == list(range(n))
    for p in parts:
        assert 1 <= p.stop - p.start <= rows or n == 0
        assert p.stop - p.start == 1 or per_row[p].sum() <= budget  # a row alone over the budget goes alone


class _StopAtThirdAdd:
    """A real transport (real sockets to the real server) at which the caller stops at the third request that adds
    rows: a Ctrl-C (``KeyboardInterrupt``) for ``Client``, a cancelled task for ``AsyncClient``; before it is sent,
    or (``answered``) once the server has answered it: that batch is added, the caller never reads so."""

    def __init__(self, stop: BaseException, answered: bool = False):
        self.adds, self.stop, self.answered = 0, stop, answered

    def check(self, request, answered: bool) -> None:
        if request.method == "POST" and request.url.path.endswith("/vectors"):
            self.adds += not answered
            if self.adds == 3 and answered == self.answered:
                raise self.stop


class _SyncStop(_StopAtThirdAdd, httpx.HTTPTransport):
    def __init__(self, stop, answered=False):
        _StopAtThirdAdd.__init__(self, stop, answered)
        httpx.HTTPTransport.__init__(self)

    def handle_request(self, request):
        self.check(request, False)
        response = super().handle_request(request)
        response.read()
        self.check(request, True)
        return response


class _AsyncStop(_StopAtThirdAdd, httpx.AsyncHTTPTransport):
    def __init__(self, stop, answered=False):
        _StopAtThirdAdd.__init__(self, stop, answered)
        httpx.AsyncHTTPTransport.__init__(self)

    async def handle_async_request(self, request):
        self.check(request, False)
        response = await super().handle_async_request(request)
        await response.aread()
        self.check(request, True)
        return response


@both_clients
def test_an_add_stopped_between_batches_says_which_rows_were_added(server, client_cls, client_kind):
    """A Ctrl-C (or, from asyncio, a cancel) between the batches of an ``add`` lost which rows were in: only an API
    error carried ``added_ids``. The KeyboardInterrupt / CancelledError is raised on with them, and a resume with
    the other rows completes the index."""
    url, _, _ = server
    X, name = _rows(100, 3), f"stopped-{client_kind}"
    stop, transport = ((KeyboardInterrupt(), _SyncStop) if client_kind == "sync" else
                       (asyncio.CancelledError(), _AsyncStop))
    with client_cls(url, api_key=WKEY, batch_size=30, transport=transport(stop)) as vb:
        vb.create_index(name, "a", X[:1], ids=[0])
        with pytest.raises(type(stop)) as err:
            vb.add(name, X[1:], ids=list(range(1, 100)))
        assert err.value is stop and err.value.added_ids == list(range(1, 61)), getattr(err.value, "added_ids", None)
        assert vb.get_index(name)["count"] == 61
        rest = [i for i in range(1, 100) if i not in set(err.value.added_ids)]
    with client_cls(url, api_key=WKEY, batch_size=30) as vb:
        assert vb.add(name, X[rest], ids=rest)["ids"] == rest and vb.get_index(name)["count"] == 100


@both_clients
def test_an_add_stopped_while_its_answer_was_read_says_that_batch_may_be_in(server, client_cls, client_kind):
    """A Ctrl-C (a cancel) that lands once the server has added a batch, while its answer is read: the note said
    "the rest were not" added, and the server holds them; it was written into the exception's text as " (60 rows
    ...)" (a bare KeyboardInterrupt has none). The exception keeps its own text and args, carries ``added_ids``
    (the batches answered) and a note naming the batch in flight, which may be added: here it is."""
    url, _, _ = server
    X, name = _rows(100, 4), f"inflight-{client_kind}"
    stop, transport = ((KeyboardInterrupt(), _SyncStop) if client_kind == "sync" else
                       (asyncio.CancelledError(), _AsyncStop))
    with client_cls(url, api_key=WKEY, batch_size=30, transport=transport(stop, answered=True)) as vb:
        vb.create_index(name, "a", X[:1], ids=[0])
        with pytest.raises(type(stop)) as err:
            vb.add(name, X[1:], ids=list(range(1, 100)))
        assert err.value is stop and err.value.args == () and str(err.value) == "", err.value.args
        assert err.value.added_ids == list(range(1, 61))
        notes = getattr(err.value, "__notes__", [])
        assert len(notes) == 1 and "60 rows of the earlier batches were added" in notes[0], notes
        assert "the batch in flight (its rows from row 60 of the call's input) may have been added" in notes[0], notes
        assert "the rest were not" not in notes[0]
        assert vb.get_index(name)["count"] == 91  # it was: adding rows 60-89 again would be a 409
