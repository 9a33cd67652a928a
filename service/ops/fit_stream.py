"""A paired closed-form fit (procrustes, ridge, lowrank) from two float32 ``.npy`` files, streamed: ``vecbridge fit
--pairs`` read both files whole and ran every stage on those rows (300,000 x 384 pairs: 1.9-2.3 GB peak RSS, where
the library's streamed fit of the same files took 1.1 GB).

:func:`pair_files` gives the two files as memory maps that nothing reads whole, and three passes read them in
blocks of :data:`SHARD_ROWS` rows, each block through a map of its own (its pages let go with it):

- :meth:`PairFiles.scan`: every row checked (finite, named by its row of the file, as a whole read names it) and
  hashed, the lineage's sha256 of each side (:func:`service.io.sha256_array`'s, the same digests) and a digest of
  each row, whose repeats are the repeated pairs (:func:`align.validation.pair_groups` of the digests);
- :meth:`PairFiles.fit`: the library's streamed fit, :func:`service.distributed.pair_stats_local` over file shards
  and :func:`align.procrustes.map_from_stats`: in blocks of 65,536 rows, as ``align.fit_procrustes`` & co. sum the
  whole rows, so the same map, bit for bit (with the default ``chunk_size``).

The diagnostics, the report's migration plan and the spaces check read samples of the maps; the held-out top-1
(:func:`align.cross_val_top1` with the groups found and ``fit_rows``) fits each fold from the files too and reads
its held-out rows only: the same folds, the same figure. Other inputs (texts, other formats or dtypes, a rows file,
``--ray``, the other families) are read whole as before.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from align.exceptions import InputError
from align.procrustes import check_closed_form_params, fit_lowrank, fit_procrustes, fit_ridge, map_from_stats
from align.validation import pair_groups

from ..distributed import pair_stats_local
from ..io import FormatError, iter_chunks, load_npy, parse_rows, resolve_rows

__all__ = ["CLOSED_FORM", "STREAM_METHODS", "SHARD_ROWS", "PairFiles", "pair_files"]

#: the closed-form families, fitted from additive statistics (:mod:`align.procrustes`): their fit functions
CLOSED_FORM = {"procrustes": fit_procrustes, "ridge": fit_ridge, "lowrank": fit_lowrank}
#: the families a fit streams from its files
STREAM_METHODS = tuple(CLOSED_FORM)
#: rows a block: ``align.fit_procrustes``'s own (its frame sums and pair statistics go by 65,536 rows)
SHARD_ROWS = 65536


@dataclass
class _Side:
    path: Path
    start: int  # the file row of row 0
    offset: int  # the bytes before row 0 of the file (its .npy header)
    X: np.ndarray  # the rows, memory-mapped (copy-on-write)

    @property
    def shape(self) -> tuple[int, int]:
        return self.X.shape

    def block(self, a: int, b: int) -> np.ndarray:
        """Rows ``[a, b)`` through a map of their own (a view of it: the pages go with it)."""
        return load_npy(self.path, mmap_mode="c")[self.start + a : self.start + b]

    def take(self, rows) -> np.ndarray:
        """Rows ``rows`` (indices, any order), read from the file into a new float32 array: only the copy is held
        (gathered through a map, far more was: each page fault maps the 64 kB around it, so 20,000 rows of 300,000
        mapped the whole file). A read per run of rows less than 8 kB apart (at most 8 MB)."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        n, d = self.X.shape
        if not rows.size:
            return np.empty((0, d), dtype=np.float32)
        if rows.min() < 0 or rows.max() >= n:
            raise IndexError(f"row {int(rows.max() if rows.max() >= n else rows.min())} outside {n} rows")
        order = np.argsort(rows, kind="stable")
        srt, out, width = rows[order], np.empty((rows.size, d), dtype=np.float32), d * 4
        gap, span = max(1, (8 << 10) // width), max(1, (8 << 20) // width)
        step = np.diff(srt)
        cuts = np.flatnonzero((step > gap) | (np.diff(srt // span) != 0)) + 1
        spare = None  # one buffer for the runs read with rows between
        with open(self.path, "rb", buffering=0) as fh:
            for a, b in zip(np.r_[0, cuts], np.r_[cuts, srt.size]):
                lo, hi = int(srt[a]), int(srt[b - 1]) + 1
                whole = bool(np.all(step[a : b - 1] == 1))  # consecutive rows, each once: read in place
                if not whole and spare is None:
                    spare = np.empty((span, d), dtype=np.float32)
                buf = out[a:b] if whole else spare[: hi - lo]
                view = memoryview(buf).cast("B")
                if os.preadv(fh.fileno(), [view], self.offset + (self.start + lo) * width) != len(view):
                    raise FormatError(f"{self.path.name}: the file was cut short while it was read")
                if not whole:
                    out[a:b] = buf[srt[a:b] - lo]
        if srt.size > 1 and np.any(order[1:] < order[:-1]):
            back = np.empty_like(out)
            back[order] = out
            out = back
        return out

    def __getitem__(self, index) -> np.ndarray:
        """``X[index]`` read from the file (:meth:`take`): what the diagnostics, the report's plan and the held-out
        rows of the cross-validation read, samples only."""
        if isinstance(index, slice):
            index = np.arange(self.X.shape[0])[index]
        return self.take(index)


@dataclass
class PairFiles:
    """Paired rows of two float32 ``.npy`` files (``X`` / ``Y``: their memory maps, (n, d) each) read in blocks."""

    source: _Side
    target: _Side
    rows_given: tuple = (None, None)
    _scan: dict | None = field(default=None, repr=False)

    @property
    def X(self) -> np.ndarray:
        return self.source.X

    @property
    def Y(self) -> np.ndarray:
        return self.target.X

    @property
    def n(self) -> int:
        return int(self.X.shape[0])

    def scan(self) -> dict:
        """One pass over both files (once; later calls return it): every row checked as a whole read checks it
        (:func:`service.io.iter_chunks`), ``{"hashes": {"source", "target"}, "groups"}``: the sha256 of each side's
        float32 bytes (:func:`service.io.sha256_array`'s) and the repeated pairs, :func:`align.validation.pair_groups`
        of each row's 128-bit BLAKE2b digest (bitwise-equal rows; a collision would join two pairs in one group)."""
        if self._scan is None:
            sha = {"source": hashlib.sha256(), "target": hashlib.sha256()}
            digests: dict[str, list[np.ndarray]] = {"source": [], "target": []}  # (rows, 16) uint8 per block
            sides = {"source": self.source, "target": self.target}
            chunks = {k: iter_chunks(s.path, chunk_rows=SHARD_ROWS, rows=self.rows_given[i], encoder_option=None)
                      for i, (k, s) in enumerate(sides.items())}
            for XY in zip(chunks["source"], chunks["target"]):
                for key, A in zip(("source", "target"), XY):
                    A = np.ascontiguousarray(A, dtype=np.float32)
                    raw, width = memoryview(A).cast("B"), A.shape[1] * 4
                    sha[key].update(raw)
                    block = b"".join(hashlib.blake2b(raw[i * width : (i + 1) * width], digest_size=16).digest()
                                     for i in range(A.shape[0]))
                    digests[key].append(np.frombuffer(block, dtype=np.uint8).reshape(-1, 16))
            D = {k: np.concatenate(v) if v else np.zeros((0, 16), np.uint8) for k, v in digests.items()}
            self._scan = {"hashes": {k: h.hexdigest() for k, h in sha.items()},
                          "groups": pair_groups(D["source"], D["target"])}
        return self._scan

    def groups(self) -> tuple[np.ndarray, np.ndarray | None]:
        """``(first, group)`` of the pairs for :func:`align.cross_val_top1` (``(arange(n), None)``: all distinct)."""
        found = self.scan()["groups"]
        return (np.arange(self.n), None) if found is None else found

    def shards(self, rows: np.ndarray | None = None) -> list:
        """The pairs (or the pairs ``rows``, sorted indices) as :data:`SHARD_ROWS`-row shards of
        :func:`service.distributed.pair_stats_local`: each reads its rows when called, through maps of its own."""
        if rows is None:
            return [lambda a=a: (self.source.block(a, min(a + SHARD_ROWS, self.n)),
                                 self.target.block(a, min(a + SHARD_ROWS, self.n)))
                    for a in range(0, self.n, SHARD_ROWS)]
        return [lambda part=rows[a : a + SHARD_ROWS]: (self.source.take(part), self.target.take(part))
                for a in range(0, rows.size, SHARD_ROWS)]

    def readers(self) -> tuple[_Side, _Side]:
        """The sides as rows read from the files when indexed (``X[rows]``, ``X.shape``), for the stages that read
        samples: the maps, indexed, held every page within 64 kB of a row read until the fit ended."""
        return self.source, self.target

    def fit(self, method: str, params: dict, rows: np.ndarray | None = None):
        """The ``method`` map (:data:`STREAM_METHODS`; ``params`` as ``align.fit_<method>`` takes them) of the pairs,
        or of the pairs ``rows``: the library's streamed fit over :meth:`shards`. Fewer ``rows`` than the source is
        wide (a small cross-validation fold) are fitted in memory, as before: ``align.fit_<method>`` solves the dual
        system on rows it holds, which merged statistics no longer hold."""
        if rows is not None and rows.size < self.X.shape[1]:
            return CLOSED_FORM[method](self.source.take(rows), self.target.take(rows), **params)
        params = dict(params)
        normalize = params.pop("normalize", True)
        params.pop("center", None)  # True: pair_files streams no other
        chunk = params.pop("chunk_size", SHARD_ROWS)
        frames, stats = pair_stats_local(self.shards(rows), center=True, normalize=normalize, chunk_size=chunk)
        return map_from_stats(stats, frames, method, center=True, normalize=normalize, **params)


def pair_files(o: dict, *, method: str, params: dict, paired: bool, ray_address: str | None) -> PairFiles | None:
    """The fit's inputs (the CLI's :func:`~service.cli._common.input_opts` values ``o``) as :class:`PairFiles` when
    they stream: a paired fit of a :data:`STREAM_METHODS` family in this process (no ``--ray``: its tasks are given
    the driver's rows, a cluster's workers may not see the files) with centred frames (``center`` true, the
    default), from two 2-D float32 C-order ``.npy`` files (no encoder, ``--rows`` START:STOP or none) of as many
    rows, at least as many as the source is wide (fewer: the fit solves the dual system on rows it holds). Else
    None: the inputs are read whole (a file that cannot be read, or a bad parameter, too: that fit then names
    it)."""
    if not paired or method not in STREAM_METHODS or ray_address is not None or params.get("center", True) is not True:
        return None
    try:  # a bad parameter: refused by the whole read's fit, in its words
        check_closed_form_params(method, params)
    except InputError:
        return None
    sides = []
    for side in ("source", "target"):
        path, rows = Path(o[side]), o["rows"] if o[f"{side}_rows"] is None else o[f"{side}_rows"]
        if (o[f"{side}_encoder"] or o[f"{side}_key"] or o[f"{side}_column"] or path.suffix.lower() != ".npy"
                or not path.is_file()):  # a FIFO: opened, it waited for a writer (the whole read refuses it)
            return None
        try:
            rows = parse_rows(rows) if isinstance(rows, str) else rows
            if not (rows is None or isinstance(rows, tuple)):  # row indices: read as listed
                return None
            M = load_npy(path, mmap_mode="c")
            if M.ndim != 2 or M.dtype != np.float32 or not M.flags.c_contiguous:
                return None
            sl = resolve_rows(rows, M.shape[0], path)
        except Exception:  # noqa: BLE001 - the whole read says what is wrong with it, as before
            return None
        sides.append((_Side(path, sl.start, int(M.offset), M[sl]), rows))
    (src, src_rows), (tgt, tgt_rows) = sides
    if src.X.shape[0] != tgt.X.shape[0] or src.X.shape[0] < max(2, src.X.shape[1]):
        return None
    return PairFiles(src, tgt, (src_rows, tgt_rows))
