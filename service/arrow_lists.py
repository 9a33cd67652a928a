"""A parquet's list column of vectors as an (n, d) array, its null and ragged rows named by the file's row numbers
(moved out of
:mod:`service.io`, which imports it where it reads a parquet, to keep that module within its size)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .io import FormatError

__all__ = ["arrow_lists_to_matrix"]


def arrow_lists_to_matrix(arr, path: Path, rows_at: int | np.ndarray = 0) -> np.ndarray:
    """The list column ``arr`` of ``path`` as an (n, d) array; a null or ragged row is a FormatError naming the first
    such row as a row of the file (``rows_at``: the file row of ``arr``'s first row, or of each of its rows)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def row(i: int) -> str:
        return f"row {int(i + rows_at) if isinstance(rows_at, (int, np.integer)) else int(np.asarray(rows_at)[i])}"

    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    vt = getattr(arr.type, "value_type", None)
    if vt is None or not (pa.types.is_floating(vt) or pa.types.is_integer(vt)):
        raise FormatError(f"{path.name}: the vector column is {arr.type}; need a list of numbers per row")
    if arr.null_count:
        first = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
        raise FormatError(f"{path.name}: the vector column has null rows (the first: {row(first)})")
    n = len(arr)
    if n == 0:
        return np.zeros((0, 0), np.float32)
    values = arr.flatten()
    if values.null_count:  # to_numpy made them NaN: the error then named "X", not the file
        first = int(pc.list_parent_indices(arr).to_numpy()[np.flatnonzero(values.is_null().to_numpy(
            zero_copy_only=False))[0]])
        raise FormatError(f"{path.name}: the vector column has null values inside its vectors (the first in "
                          f"{row(first)}; at least {values.null_count}: rows are checked as they are read)")
    flat = values.to_numpy(zero_copy_only=False)
    if pa.types.is_fixed_size_list(arr.type):
        d = arr.type.list_size
    else:
        offs = arr.offsets.to_numpy()
        lens = np.diff(offs)
        if (lens != lens[0]).any():
            first = int(np.flatnonzero(lens != lens[0])[0])
            raise FormatError(f"{path.name}: vectors of different lengths in the list column ({row(first)} has "
                              f"{int(lens[first])} values, {row(0)} {int(lens[0])})")
        d = int(lens[0])
    return flat.reshape(n, d)
