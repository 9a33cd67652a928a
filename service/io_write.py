"""Writing vector files: :class:`ChunkWriter` writes ``.npy`` (header, then rows appended; the whole file reserved
up front), ``.fvecs`` or ``.parquet`` block by block into a locked temporary renamed into place, so ``vecbridge
transform`` never holds a whole output nor leaves a half-written one under its name; :func:`write_vectors` writes a
whole matrix (``.npz`` too). Moved out of :mod:`service.io` (which re-exports every name) to give that module room.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import uuid
from glob import escape as glob_escape
from pathlib import Path

import numpy as np

from align.exceptions import InputError

from .storage import atomic_write, fsync_dir, hold, keep_mode, make_parent, take_abandoned, temp_name, writing

__all__ = ["ChunkWriter", "STREAM_SUFFIXES", "remove_unfinished", "write_vectors"]

STREAM_SUFFIXES = (".npy", ".fvecs", ".parquet")  # what ChunkWriter writes (an .npz cannot be written in chunks)
# the end of a ChunkWriter temporary's name, ``.<name>.part-<pid>-<8 hex>``: locked by its writer from creation.
# Releases up to 58ebe2e named it ``.<name>.part-<pid>`` and held no lock, so a live one of theirs looks abandoned
_PART_SUFFIX = re.compile(r"[0-9]+-[0-9a-f]{8}")


#: temporary outputs of this process's :class:`ChunkWriter` s not yet renamed into place or removed
_UNFINISHED: set[Path] = set()


def remove_unfinished() -> None:
    """Remove the temporary outputs this process has not finished (a command stopped by a signal, whose ``with``
    may not have been entered yet when the signal came)."""
    for tmp in list(_UNFINISHED):
        tmp.unlink(missing_ok=True)
        _UNFINISHED.discard(tmp)


class ChunkWriter:
    """Write ``n_rows × dim`` float32 rows block by block to ``.npy``, ``.fvecs`` or ``.parquet``.

    The data goes to a temporary file in the same folder, renamed into place by :meth:`close`
    (so a crashed transform never leaves a half-written output under the final name). The temporary file is
    ``flock``-ed while written (:func:`~service.storage.hold`): one left by a writer that was killed (``kill -9``, a
    node lost) is removed by the next writer of the same output; one still being written is kept, and so is one
    named as releases up to 58ebe2e name theirs (``.part-<pid>``: unlocked even while written, during a rolling
    upgrade).
    ``.npy`` needs ``n_rows`` up front (its header holds the shape; the whole file is reserved at once). Rows
    are appended to the file: the writer holds one chunk, never a map of the output. A ``.parquet`` holds the
    column ``vector``, or the fields of ``schema`` (its ``column``: the vectors; the others given to :meth:`write`).
    """

    def __init__(self, path, *, dim: int, n_rows: int | None = None, schema=None, column: str = "vector"):
        self.path = Path(path)
        self.suffix = self.path.suffix.lower()
        if self.suffix not in STREAM_SUFFIXES:
            from .io import FormatError  # (service.io imports this module)

            raise FormatError(f"{self.path.name}: streaming output must be .npy, .fvecs or .parquet")
        if self.suffix == ".npy" and n_rows is None:
            raise InputError("writing .npy in chunks needs the row count up front")
        self.dim, self.n_rows, self.written = int(dim), n_rows, 0
        self._schema, self._column = schema, column
        make_parent(self.path)  # as atomic_write does; else the error names self.tmp
        part = temp_name(self.path.name, ".part-")
        for left in self.path.parent.glob(f"{glob_escape(part)}*"):  # of dead writers: removed
            if not _PART_SUFFIX.fullmatch(left.name[len(part):]):  # an older release's writer (no lock): kept
                continue
            fd = take_abandoned(left)
            if fd is not None:
                left.unlink(missing_ok=True)
                os.close(fd)
        self.tmp = self.path.with_name(f"{part}{os.getpid()}-{uuid.uuid4().hex[:8]}")
        # listed before it exists: a Ctrl-C / SIGTERM between its creation and the ``with`` that would remove it (the
        # CLI's test signals as soon as the file appears) left it behind; the CLI removes what is listed as it stops
        _UNFINISHED.add(self.tmp)
        # locked from its creation: never taken for a dead writer's; 0666 less the umask, as open() makes the output
        self._held = hold(self.tmp, create=True, mode=0o666)
        try:
            with writing(self.path, self.tmp):  # a full disk's error names the output
                self._open(n_rows)
        except BaseException:
            self.tmp.unlink(missing_ok=True)
            _UNFINISHED.discard(self.tmp)
            os.close(self._held)
            raise

    def _open(self, n_rows: int | None) -> None:
        if self.suffix == ".npy":  # header, then rows appended: nothing of the output stays mapped in memory
            from numpy.lib import format as npformat

            need = 4 * n_rows * self.dim + 128  # the rows and a header: refused before the work that makes them
            if shutil.disk_usage(self.tmp.parent).free < need:  # (fallocate below checks too, where supported)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
            self._fh = open(self.tmp, "wb")  # noqa: SIM115 - held until close() / abort()
            try:
                npformat.write_array_header_1_0(self._fh, {"descr": npformat.dtype_to_descr(np.dtype("<f4")),
                                                           "fortran_order": False, "shape": (n_rows, self.dim)})
                if hasattr(os, "posix_fallocate"):  # reserve the whole file: a full disk fails here, not hours in
                    self._fh.flush()
                    os.posix_fallocate(self._fh.fileno(), 0, self._fh.tell() + 4 * n_rows * self.dim)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):  # a filesystem without it
                    self._fh.close()
                    raise
        elif self.suffix == ".fvecs":
            self._fh = open(self.tmp, "wb")  # noqa: SIM115 - held until close() / abort()
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            self._schema = self._schema or pa.schema([(self._column, pa.list_(pa.float32(), self.dim))])
            self._pq = pq.ParquetWriter(self.tmp, self._schema)

    def write(self, X: np.ndarray, others=None) -> None:
        """Append rows ``X``; ``others`` (.parquet): a pyarrow Table of the same rows' other columns, in order."""
        with writing(self.path, self.tmp):
            self._write(X, others)

    def _write(self, X: np.ndarray, others=None) -> None:
        X = np.ascontiguousarray(X, dtype=np.float32)
        if X.ndim != 2 or X.shape[1] != self.dim:
            raise InputError(f"chunk of shape {X.shape} does not match dim {self.dim}")
        n = X.shape[0]
        if self.suffix == ".npy":
            if self.written + n > self.n_rows:
                raise InputError("more rows than announced")
            self._fh.write(X.astype("<f4", copy=False).data)
        elif self.suffix == ".fvecs":
            block = np.empty((n, self.dim + 1), dtype="<f4")
            block[:, 1:] = X
            block.view("<i4")[:, 0] = self.dim
            self._fh.write(block.tobytes())
        else:
            import pyarrow as pa

            cols = [] if others is None else list(others.columns)
            cols.insert(self._schema.get_field_index(self._column), pa.chunked_array(
                [pa.FixedSizeListArray.from_arrays(pa.array(X.reshape(-1), pa.float32()), self.dim)]))
            self._pq.write_table(pa.Table.from_arrays(cols, schema=self._schema))
        self.written += n

    def close(self) -> Path:
        if self.suffix == ".npy" and self.written != self.n_rows:
            self.abort()  # no partial file left behind under the temporary name either
            raise InputError(f"wrote {self.written} rows, announced {self.n_rows}")
        try:  # a failure here (a full disk at the last flush) left the temporary file behind
            with writing(self.path, self.tmp):
                if self.suffix in (".npy", ".fvecs"):
                    self._fh.flush()
                    os.fsync(self._fh.fileno())
                    self._fh.close()
                else:
                    self._pq.close()
                    os.fsync(self._held)  # the file ParquetWriter wrote (it was renamed into place unsynced)
                keep_mode(self.tmp, self.path)
                os.replace(self.tmp, self.path)
        except BaseException:
            self.abort()
            raise
        _UNFINISHED.discard(self.tmp)
        os.close(self._held)
        fsync_dir(self.path.parent)  # the rename too: after a crash the output is the old file or the new one
        return self.path

    def abort(self) -> None:
        try:
            with contextlib.suppress(Exception):  # closing again after a failed close, or a full disk: the file goes
                if self.suffix in (".npy", ".fvecs"):
                    self._fh.close()
                elif self.suffix == ".parquet":
                    self._pq.close()
        finally:
            self.tmp.unlink(missing_ok=True)
            _UNFINISHED.discard(self.tmp)
            os.close(self._held)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_vectors(path, X, *, key: str = "vectors") -> Path:
    """Write a whole matrix to ``.npy``, ``.npz`` (under ``key``), ``.fvecs`` or ``.parquet``."""
    path = Path(path)
    X = np.ascontiguousarray(X, dtype=np.float32)
    if path.suffix.lower() == ".npz":
        def save(tmp: Path) -> None:
            with open(tmp, "wb") as fh:  # a file object: np.savez would append .npz to the temporary name
                np.savez(fh, **{key: X})

        return atomic_write(path, save)  # never half an archive under the final name
    with ChunkWriter(path, dim=X.shape[1], n_rows=X.shape[0]) as w:
        w.write(X)
    return path
