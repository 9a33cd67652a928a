"""A file's vectors mapped into an output, the other columns of a table travelling with their rows.

:class:`MappedWriter` writes blocks of mapped rows to ``.npy``, ``.fvecs`` or ``.parquet`` (a
:class:`~service.io.ChunkWriter`). From a ``.parquet`` input into a ``.parquet`` output every other column goes
along, unchanged (names, order, types, values) and row for row, ``--rows`` included: read in batches as the vectors
are, never the whole file. The vector column keeps its name and position; it holds the mapped rows, so it is always
``fixed_size_list<float32>[d_t]`` (a ``list<float>``, float16 or float64 input column too). ``.npy`` and ``.fvecs``
hold vectors only: the columns they cannot hold are named in :attr:`MappedWriter.note`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .io import (
    ChunkWriter,
    FormatError,
    arrow_errors,
    parquet_file,
    parse_rows,
    resolve_rows,
)

__all__ = ["MappedWriter"]


class MappedWriter:
    """Write the mapped rows of ``inp`` (rows ``rows`` of it; parquet ``column``: the vectors) to ``out``:
    :meth:`write` takes blocks of ``dim``-d rows in input order, ``n_rows`` in all; ``batch_rows``: the rows of the
    other columns read at a time. A context manager, as ChunkWriter (renamed into place, or removed on an error)."""

    def __init__(self, inp, out, *, dim: int, n_rows: int | None = None, column: str | None = None, rows=None,
                 batch_rows: int = 65536):
        inp, out = Path(inp), Path(out)
        self.note: str | None = None  # the input's columns the output cannot hold, in words
        self._inp, self._others, self._held = inp, None, None
        schema, name = None, "vector"
        if inp.suffix.lower() == ".parquet":
            import pyarrow as pa

            f, name = parquet_file(inp, column)
            fields = f.schema_arrow
            others = [n for n in fields.names if n != name]
            if out.suffix.lower() == ".parquet":
                at = fields.get_field_index(name)
                schema = fields.set(at, pa.field(name, pa.list_(pa.float32(), int(dim)), fields.field(at).nullable))
                if others:
                    sl = resolve_rows(parse_rows(rows) if isinstance(rows, str) else rows, f.metadata.num_rows, inp)
                    self._others = _batches(f, inp, others, sl, max(1, int(batch_rows)))
            elif others:
                self.note = (f"{out.name} holds the vectors only: {inp.name}'s other columns ({', '.join(others)}) "
                             f"are not written (a .parquet output keeps them)")
        self._w = ChunkWriter(out, dim=dim, n_rows=n_rows, schema=schema, column=name)

    def write(self, Y: np.ndarray) -> None:
        """Append the mapped rows ``Y``, with the same rows of the input's other columns."""
        self._w.write(Y, None if self._others is None else self._take(len(Y)))

    def _take(self, n: int):
        import pyarrow as pa

        held = self._held
        while held is None or held.num_rows < n:
            batch = next(self._others, None)
            if batch is None:
                raise FormatError(f"{self._inp.name}: its other columns end before its vectors")
            more = pa.Table.from_batches([batch])
            held = more if held is None else pa.concat_tables([held, more])
        self._held = held.slice(n)
        return held.slice(0, n)

    def close(self) -> Path:
        return self._w.close()

    def abort(self) -> None:
        self._w.abort()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self._w.__exit__(exc_type, exc, tb)


def _batches(f, path: Path, names: list[str], sl: slice, batch_rows: int):
    """Record batches of columns ``names`` of the parquet file ``f`` for rows ``sl``, read a batch at a time (listed
    rows, an index array: taken in the order listed from the row groups that hold them, as their vectors are; the
    columns of the whole file were read and held)."""
    if isinstance(sl, np.ndarray):
        from .listed_rows import RowGroups

        groups = RowGroups(f, path, names)
        for s in range(0, sl.size, batch_rows):
            yield from groups.take(sl[s : s + batch_rows]).to_batches()
        return
    pos = 0
    with arrow_errors(path):
        for batch in f.iter_batches(batch_size=max(1, min(batch_rows, sl.stop)), columns=names):
            lo, hi = max(sl.start, pos), min(sl.stop, pos + batch.num_rows)
            if lo < hi:
                yield batch.slice(lo - pos, hi - lo)
            pos += batch.num_rows
            if pos >= sl.stop:
                break
