"""Searches go on while a large batch is added to an HNSW index, and never see part of it.

Before, ``SpaceIndex.add`` inserted every row into the graph under the write side of the index's lock, so each
search of the index waited for the whole insertion: one 20,000-row add to a 200,000 x 384 HNSW index over HTTP
(``benchmarks/bench_add_stall.py``) answered no search for 2.8 s. Now the rows go in chunks (the write side per
chunk) and stay hidden until the add is persisted. What must hold, checked here with real FAISS and real files:

* a search issued while the add runs answers before the add ends (the add still in progress: the generation
  is the old one), and sees none of its rows; every answer sees all of the add's rows or none;
* after the add, every row is found with its payload, also by a process that loads the index;
* an add that fails part-way (the snapshot cut short by a file-size limit, as by a full disk; a block of a
  streamed file whose ids clash) shows no row, before or after, and the index loads with the old content;
* the lock lets the readers that waited for a writer in before that writer's next chunk.

"Progress" is observed by events (the graph's storage grew, the thread is alive, the generation), never by timing.
"""

from __future__ import annotations

import errno
import sys
import threading
import time
from contextlib import contextmanager
from typing import NamedTuple

import faiss
import numpy as np
import pytest
from _servers import file_size_limit

from service.indexes import IndexConflictError, IndexStore, RWLock

DIM, OLD, NEW = 64, 3000, 20_000  # 20,000 rows of 64-d: 5 chunks of 4,096 (kinds.hnsw_chunk)


def _rows(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


@pytest.fixture
def hnsw(tmp_path):
    store = IndexStore(tmp_path)
    idx = store.create("h", "s", _rows(0, OLD), kind="hnsw", payloads=[{"old": i} for i in range(OLD)])
    return tmp_path, idx


class Answer(NamedTuple):
    count: int  # idx.count when the search was issued
    generation: int  # of the index when the answer came
    inserted: int  # rows of the add in the graph then
    seen: bool  # any row of the add among the hits
    whole: bool | None  # exact search: every query's top hit its own row of the add


@contextmanager
def _adding(idx, call):
    """``call()`` (an add) in a thread; yields ``(thread, outcome, storage)`` once it inserts rows into the graph
    (``storage``: the graph's rows, whose ``ntotal`` counts them)."""
    storage = faiss.downcast_index(idx.index.index).storage
    n0, outcome = storage.ntotal, {}

    def run():
        try:
            outcome["ids"] = call()
        except BaseException as exc:  # noqa: BLE001 - checked by the test
            outcome["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    while storage.ntotal == n0 and t.is_alive():
        time.sleep(0.0005)
    try:
        yield t, outcome, storage
    finally:
        t.join(120)
        assert not t.is_alive(), "the add still runs after 120 s"


def _search_while(idx, t, storage, Q, new_ids) -> list[Answer]:
    """Search ``Q`` (rows of the add; exact and approximate) until the thread ``t`` ends."""
    answers = []
    while t.is_alive():
        for exact in (True, False):
            count = idx.count
            _, I = idx.search(Q, 10, exact=exact)
            answers.append(Answer(count, idx.generation, storage.ntotal - OLD, bool(np.isin(I, new_ids).any()),
                                  bool((I[:, 0] == new_ids[:len(Q)]).all()) if exact else None))
    return answers


def _answered_during(answers: list[Answer], rows: int) -> None:
    """The first answer came while the add of ``rows`` rows was still inserting them, and saw none of them."""
    assert answers, "no search was answered while the add ran"
    assert answers[0].inserted < rows, "the first search waited for the whole insertion"
    assert not answers[0].seen and answers[0].count == OLD


def test_searches_answer_while_a_large_hnsw_add_runs_and_see_all_of_it_or_none(hnsw):
    root, idx = hnsw
    g0, X = idx.generation, _rows(1, NEW)
    new_ids = np.arange(OLD, OLD + NEW)
    with _adding(idx, lambda: idx.add(X, payloads=[{"new": j} for j in range(NEW)])) as (t, outcome, storage):
        answers = _search_while(idx, t, storage, X[:8], new_ids)
    assert "error" not in outcome, outcome
    _answered_during(answers, NEW)
    during = [a for a in answers if a.generation == g0]  # before the add was persisted
    assert all(a.count == OLD and not a.seen for a in during), "a search saw rows of the add in progress"
    assert all(a.seen == a.whole for a in answers if a.whole is not None), "a search saw part of the add"
    np.testing.assert_array_equal(outcome["ids"], new_ids)
    for got in (idx, IndexStore(root).get("h")):  # this process, and one that loads the index
        assert got.count == OLD + NEW and got.generation == g0 + 1
        _, I = got.search(X[::500], 1, exact=True)
        np.testing.assert_array_equal(I[:, 0], new_ids[::500])
        assert [got.payloads[int(i)] for i in I[:, 0]] == [{"new": j} for j in range(0, NEW, 500)]


def test_a_second_writer_waits_for_the_add_and_builds_on_it(hnsw):
    """Writers stay one at a time: a delete issued while the add inserts runs after it, and finds its rows."""
    root, idx = hnsw
    g0, X = idx.generation, _rows(4, NEW)
    with _adding(idx, lambda: idx.add(X)) as (_, outcome, _storage):
        deleted = idx.delete([0, OLD + 5])  # an old row and one of the add's: found, so after the add
    assert "error" not in outcome and deleted == 2 and idx.generation == g0 + 2
    assert IndexStore(root).get("h").count == idx.count == OLD + NEW - 2


def _unchanged(root, idx, X) -> None:
    """``idx`` (and a process loading the index) holds the old rows only: none of ``X`` is found."""
    for got in (idx, IndexStore(root).get("h")):
        assert got.count == OLD
        for exact in (True, False):
            _, I = got.search(X[:50], 10, exact=exact)
            assert ((I >= 0) & (I < OLD)).all(), "a row of the failed add is visible"
        assert got.payloads == {i: {"old": i} for i in range(OLD)}


def test_an_hnsw_add_whose_snapshot_cannot_be_written_shows_no_row_during_or_after(hnsw):
    root, idx = hnsw
    g0, X = idx.generation, _rows(2, NEW)  # more than a log takes: the add writes a snapshot
    limit = (root / "h" / f"index.{g0}.faiss").stat().st_size + 1024  # the old snapshot fits, the new one not
    add = lambda: idx.add(X, payloads=[{"new": j} for j in range(NEW)])
    with file_size_limit(limit), _adding(idx, add) as (t, outcome, storage):
        answers = _search_while(idx, t, storage, X[:8], np.arange(OLD, OLD + NEW))
    assert isinstance(outcome.get("error"), OSError) and outcome["error"].errno == errno.EFBIG, outcome
    _answered_during(answers, NEW)
    assert not any(a.seen for a in answers) and {a.count for a in answers} == {OLD}
    assert idx.generation == g0
    _unchanged(root, idx, X)
    assert not list((root / "h").glob(".*.tmp-*")), "a temporary file was left behind"
    ids = idx.add(X[:100])  # and the index takes writes again
    assert idx.count == OLD + 100 and idx.search(X[:1], 1, exact=True)[1][0, 0] == ids[0]


def test_a_streamed_hnsw_add_refused_at_a_later_block_shows_no_row(hnsw):
    root, idx = hnsw
    X = _rows(3, NEW)
    blocks = [(X[:NEW // 2], None, None), (X[NEW // 2:], np.arange(NEW // 2) + 5, None)]  # ids 5..: stored already
    with _adding(idx, lambda: idx.add_blocks(blocks)) as (t, outcome, storage):
        answers = _search_while(idx, t, storage, X[:8], np.arange(OLD, OLD + NEW // 2))
    assert isinstance(outcome.get("error"), IndexConflictError), outcome
    _answered_during(answers, NEW // 2)
    assert not any(a.seen for a in answers)
    _unchanged(root, idx, X)


def _waiting(t: threading.Thread) -> bool:
    """Whether the thread ``t`` is blocked in a ``threading.Condition.wait`` (its current stack)."""
    frame = sys._current_frames().get(t.ident)
    while frame is not None:
        if frame.f_code.co_name == "wait" and frame.f_code.co_filename == threading.__file__:
            return True
        frame = frame.f_back
    return False


def test_readers_waiting_for_a_writer_go_in_before_its_next_turn():
    """A writer that takes the lock again at once (an HNSW add, chunk by chunk) lets the readers that waited in
    first: before, it got the lock back before the woken readers, which then waited for all of its chunks."""
    lock, order = RWLock(), []

    def reader():
        with lock.read():
            order.append("read")

    with lock.write():
        t = threading.Thread(target=reader)
        t.start()
        deadline = time.monotonic() + 10
        while t.is_alive() and not _waiting(t):  # the reader waits for this writer (ended: it did not wait)
            assert time.monotonic() < deadline, "the reader neither waited for the writer nor ended within 10 s"
            time.sleep(0.0005)
        order.append("chunk 1")
    with lock.write():  # at once: the writer's next chunk
        order.append("chunk 2")
    t.join(30)
    assert not t.is_alive(), "the reader still waits 30 s after the writer's last chunk"
    assert order == ["chunk 1", "read", "chunk 2"]
