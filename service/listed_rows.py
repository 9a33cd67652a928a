"""Listed rows (``--rows rows.npy``: row indices, in the order listed) read from a vector file a chunk at a time, the
file opened and checked once: a ``.npy`` / ``.fvecs`` mapped, a ``.npz`` decoded once, a ``.parquet`` read a row
group at a time, only the row groups that hold a chunk's rows (:class:`RowGroups`, for its other columns too).

Each chunk read the whole file again before (``read_vectors`` per chunk): 200k listed rows of a ``.npz`` in chunks
of 1,000 took 23.6 s, not 1.85 s; a parquet's whole vector column (and, into a parquet, its other columns) was
read per chunk and held, so a parquet larger than memory could not be streamed by a rows file.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .arrow_lists import arrow_lists_to_matrix
from .io import (
    arrow_errors,
    fvecs_matrix,
    load_npy,
    npz_array,
    parquet_file,
    resolve_rows,
    select_rows,
)

__all__ = ["RowGroups", "listed_chunks"]


class RowGroups:
    """Rows of columns ``names`` of the parquet file ``f`` (read from ``path``), taken by index: :meth:`take` reads
    only the row groups that hold the rows asked for, and keeps those read last, up to ``hold_bytes`` of them (one
    at least): rows listed in file order read each row group once, and so do rows in any order of a file whose
    columns fit in ``hold_bytes``; a larger one is read again as its rows are asked for, never held whole."""

    def __init__(self, f, path: Path, names: list[str], *, hold_bytes: int = 256 << 20):
        from collections import OrderedDict

        md = f.metadata
        self.starts = np.cumsum([0] + [md.row_group(i).num_rows for i in range(md.num_row_groups)], dtype=np.int64)
        self._f, self._path, self._names, self._hold = f, path, names, hold_bytes
        self._held: OrderedDict[int, object] = OrderedDict()
        self.groups_read = 0  # row groups read so far (a benchmark's and a test's bound)

    def _group(self, g: int):
        if g in self._held:
            self._held.move_to_end(g)
            return self._held[g]
        with arrow_errors(self._path):
            t = self._f.read_row_group(g, columns=self._names)
        self.groups_read += 1
        self._held[g] = t
        while len(self._held) > 1 and sum(x.nbytes for x in self._held.values()) > self._hold:
            self._held.popitem(last=False)  # the least recently used first
        return t

    def take(self, idx: np.ndarray):
        """A ``pyarrow.Table`` of rows ``idx`` (checked, non-empty), in the order listed."""
        import pyarrow as pa

        g = np.searchsorted(self.starts, idx, side="right") - 1
        order = np.argsort(g, kind="stable")  # the rows grouped by row group, each group's in listed order
        parts = [self._group(int(k)).take(pa.array(idx[g == k] - self.starts[k])) for k in np.unique(g)]
        undo = np.empty_like(order)
        undo[order] = np.arange(order.size)
        with arrow_errors(self._path):
            return pa.concat_tables(parts).take(pa.array(undo))


def listed_chunks(path: Path, rows: np.ndarray, chunk_rows: int, suf: str, *, key: str | None = None,
                  column: str | None = None, key_option: str | None = "--key") -> Iterator[np.ndarray]:
    """Float32 blocks of rows ``rows`` (indices, in that order) of the vector file ``path`` (suffix ``suf``: .npy,
    .npz, .fvecs or .parquet), at most ``chunk_rows`` a block; every index is checked before the first block."""
    from align.validation import as_matrix

    if suf == ".parquet":
        f, col = parquet_file(path, column)
        resolve_rows(rows, f.metadata.num_rows, path)
        groups = RowGroups(f, path, [col])
        for s in range(0, rows.size, chunk_rows):
            table = groups.take(rows[s : s + chunk_rows])
            yield as_matrix(arrow_lists_to_matrix(table.column(col), path, rows[s : s + chunk_rows]),
                            name=path.name, rows_at=rows[s : s + chunk_rows])
        return
    M = load_npy(path, mmap_mode="c") if suf == ".npy" else npz_array(path, key, key_option) if suf == ".npz" else \
        fvecs_matrix(path)  # a .fvecs's rows checked here, once
    if M.ndim != 2:
        select_rows(M, None, path)  # raises the ShapeError for a 0-d / 1-d / 3-d array
    resolve_rows(rows, M.shape[0], path)
    for s in range(0, rows.size, chunk_rows):
        if suf != ".npz":  # a map afresh per chunk, so the pages read go with it (as START:STOP's chunks)
            M = load_npy(path, mmap_mode="c") if suf == ".npy" else fvecs_matrix(path, check_rows=False)
        yield select_rows(M, rows[s : s + chunk_rows], path)
