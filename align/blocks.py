"""Block executors: how align's row-block kernels run (in this process, or on a cluster).

The heavy kernels (:func:`align.knn` and everything built on it — CSLS, mutual neighbours, the
pseudo-targets, ICP and self-learning rounds of :class:`align.MiniVec2Vec` — and
:func:`align.kmeans.lloyd`) split their rows into **fixed blocks** and compute each block with a
module-level function. An *executor* decides only where those calls run::

    executor(fn, arg_lists) -> [fn(*args) for args in arg_lists]   # same order

The block split never depends on the executor and the per-block results are combined in the
same order, so every executor — :func:`serial` (the default), a thread pool, Ray tasks
(``service.distributed.ray_executor``) — gives bit-for-bit the same result. align never imports
an execution engine: the caller passes one in, explicitly (``executor=``) or for a whole fit
(:func:`executing`, which kernels called inside read as their default).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Callable, Iterable, Sequence

__all__ = ["Executor", "serial", "thread_pool", "executing", "current", "run_blocks", "takes_executor",
           "SCORE_BLOCK_BYTES", "rows_per_block"]

#: the most bytes one block of scores (query rows x every candidate) may hold: 32 MiB, i.e. 8,192 query rows
#: against 1,024 candidates, 8 against a million
SCORE_BLOCK_BYTES = 32 << 20

Executor = Callable[[Callable, Sequence[tuple]], list]

_CURRENT: contextvars.ContextVar[Executor | None] = contextvars.ContextVar("align_executor", default=None)


def serial(fn: Callable, arg_lists: Sequence[tuple]) -> list:
    """Run the blocks one after the other in this process."""
    return [fn(*a) for a in arg_lists]


def thread_pool(workers: int = 2) -> Executor:
    """An executor running the blocks on ``workers`` threads of this process (results in block order).

    The kNN blocks run FAISS at one OpenMP thread each (bit-stable scores), so one process uses one
    core for them; FAISS releases the GIL, so ``workers`` threads use that many cores, like as many
    Ray workers without Ray (bit-identical to :func:`serial`). Memory: ``workers`` blocks' score
    matrices at once. ``workers`` must be >= 1.
    """
    from concurrent.futures import ThreadPoolExecutor

    from .exceptions import InputError

    if int(workers) < 1:
        raise InputError(f"workers must be >= 1, got {workers}")

    def run(fn: Callable, arg_lists: Sequence[tuple]) -> list:
        if len(arg_lists) <= 1 or workers == 1:
            return serial(fn, arg_lists)
        with ThreadPoolExecutor(max_workers=min(int(workers), len(arg_lists))) as pool:
            return list(pool.map(lambda a: fn(*a), arg_lists))

    return run


def current() -> Executor:
    """The executor set by :func:`executing` in this context, else :func:`serial`."""
    return _CURRENT.get() or serial


@contextlib.contextmanager
def executing(executor: Executor | None):
    """Within the block, kernels without an explicit ``executor=`` use ``executor`` (None: no change)."""
    if executor is None:
        yield
        return
    token = _CURRENT.set(executor)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def rows_per_block(cols: int, limit: int, *, budget: int = SCORE_BLOCK_BYTES, itemsize: int = 4) -> int:
    """Rows of a ``rows x cols`` block of ``itemsize``-byte scores that fit ``budget`` bytes: between 1 and ``limit``.

    A kernel that scores a block of queries against *all* ``cols`` candidates holds ``rows * cols * itemsize``
    bytes; a fixed row count (2,048) made that 8 GB at a million candidates. Depends only on the shapes, so
    the split (and the result) is the same on every executor.
    """
    return max(1, min(int(limit), int(budget) // max(1, int(cols) * int(itemsize))))


def run_blocks(fn: Callable, arg_lists: Iterable[tuple], executor: Executor | None = None) -> list:
    """``fn(*args)`` for every args tuple, through ``executor`` (default: :func:`current`)."""
    return list((executor or current())(fn, list(arg_lists)))


def takes_executor(fn: Callable) -> Callable:
    """Decorator for a kernel with an ``executor=None`` keyword: its whole body runs under :func:`executing`,
    so every block kernel it calls (kNN, CSLS, pseudo-targets) uses that executor."""
    @functools.wraps(fn)
    def wrapper(*args, **kw):
        with executing(kw.get("executor")):
            return fn(*args, **kw)

    return wrapper
