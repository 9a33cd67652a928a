"""Indexes from files (offline faces: ``vecbridge index``): rows streamed block by block, never a whole file twice.

A file of ``n`` rows (any format :mod:`service.io` reads) is read in blocks of at most
:data:`CHUNK_ROWS` rows (texts: :data:`TEXT_CHUNK`, embedded with the space's encoder in its
passage form and stored as payloads ``{"text": ...}`` as over HTTP). Memory of a create: the index
itself plus one block (plus, for IVF, the k-means training sample of ``train_rows`` rows, by default ``64 nlist``,
then 8 bytes a row: its list).

- :func:`create_from_file` builds the index in memory from every block and persists it once
  (:meth:`service.indexes.IndexStore.create`): the name appears, complete, or not at all.
  ``kind="auto"`` chooses by ``n`` (the whole file, not one block); IVF trains on a seeded sample
  of the whole file (one extra pass over it; for texts, one extra embedding pass), and a vectors file is read
  once more to find each row's list before any is added, so that each list is allocated once at its size
  (:func:`service.indexes.kinds.plan_lists`; texts are not embedded a third time: their lists grow by doubling).
- :func:`check_same_settings` is ``vecbridge index create --if-not-exists``: an existing index counts as the
  one asked for when its settings are the command's, else a conflict naming each that differs.
- :func:`add_from_file` adds all blocks as one generation (:meth:`SpaceIndex.add_blocks`; a file of
  one block: :meth:`SpaceIndex.add`, a logged delta when it fits): all rows or none. The file is read,
  embedded and checked before the index's writer lock is taken (other writers are not held by a slow
  disk or encoder); memory: the index plus the file's ``n x dim`` float32 rows until they are added.

A file whose rows have another width than the index's space, texts embedded by another encoder
than the space's, or a ``space`` that is not the index's, is refused before anything is written; so are vectors
given with no ``space`` whose first block looks like another space's (:func:`service.spaces.check_rows`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from itertools import chain
from typing import Any

import numpy as np

from align.exceptions import DimensionMismatchError, InputError

from ..encoders import get_encoder, space_encoder
from ..indexes import IndexConflictError, IndexStore, SpaceIndex, choose_kind
from ..indexes.kinds import ids_array
from ..io import (
    count_rows,
    is_text_path,
    iter_chunks,
    parse_rows,
    read_texts,
    resolve_rows,
    rows_count,
)
from ..limits import check_index_params, ivf_training
from .indexes import Resolver, check_rows_space, space_still_there

__all__ = ["CHUNK_ROWS", "TEXT_CHUNK", "FileRows", "add_from_file", "check_same_settings", "count", "create_from_file",
           "passage_encoder"]

CHUNK_ROWS = 65536  # vectors per block (96 MiB of 384-d float32)
TEXT_CHUNK = 1024  # texts per block (embedded per block: the progress bar moves per block)


@dataclass
class FileRows:
    """Where the rows come from: a file, its ``rows`` ("START:STOP", or row indices: those rows in that order, which
    ids and payloads follow), ``.npz`` ``key``, parquet ``column``,
    JSONL ``text_field``, the ``encoder`` named for texts (default: the space's) and whether texts are kept as
    payloads."""

    path: str
    rows: str | np.ndarray | None = None
    key: str | None = None
    column: str | None = None
    text_field: str = "text"
    encoder: str | None = None
    store_texts: bool = True

    @property
    def texts(self) -> bool:
        return is_text_path(self.path)


def count(src: FileRows) -> int:
    """Rows of ``src`` selected by ``src.rows`` (FormatError / InputError for a bad file or range)."""
    n = count_rows(src.path, key=src.key, column=src.column, text_field=src.text_field)
    m = rows_count(resolve_rows(parse_rows(src.rows), n, src.path))  # a rows file: its rows (a slice was indexed)
    if m <= 0:
        raise InputError(f"{src.path} holds no rows")
    return m


def passage_encoder(resolver: Resolver, space: str, dim: int, encoder: str | None):
    """The encoder that embeds texts for ``space`` (``dim`` wide): the space's; ``encoder`` must name the same
    model (InputError: another model's vectors would be searched as if they were the space's), or is used for
    a space without a registered one (its width must be ``dim``)."""
    info = resolver.get_space(space)
    space_encoder(space, info.encoder, encoder)
    if info.encoder or not encoder:
        return resolver.encoder_for_space(space)[0]  # UnknownEncoderError when the space has none
    enc = get_encoder(encoder)
    if enc.dim != dim:
        raise DimensionMismatchError(f"encoder {encoder!r} makes {enc.dim}-d vectors; space {space!r} is {dim}-d")
    return enc


def _blocks(src: FileRows, dim: int, space: str, encoder, *, ids: np.ndarray | None, payloads, n: int,
            progress: Callable[[float], None]) -> Iterator[tuple[np.ndarray, Any, Any]]:
    """``(X (m, dim), ids (m,) or None, payloads (m values) or None)`` per block of ``src`` (``n`` rows in all)."""
    if src.texts:
        texts = read_texts(src.path, rows=parse_rows(src.rows), text_field=src.text_field)
        parts = ((np.asarray(encoder.encode(texts[s:s + TEXT_CHUNK], kind="passage"), np.float32),
                  texts[s:s + TEXT_CHUNK]) for s in range(0, len(texts), TEXT_CHUNK))
    else:
        parts = ((X, None) for X in iter_chunks(src.path, chunk_rows=CHUNK_ROWS, rows=src.rows, key=src.key,
                                                column=src.column))
    done = 0
    for X, texts_m in parts:
        m = X.shape[0]
        if X.ndim != 2 or X.shape[1] != dim:
            raise DimensionMismatchError(f"{src.path}: rows have {X.shape[-1]} columns; space {space!r} is {dim}-d")
        pl = _take(payloads, m, done, n) if payloads is not None else (
            [{"text": t} for t in texts_m] if texts_m is not None and src.store_texts else None)
        yield X, (ids[done:done + m] if ids is not None else None), pl
        done += m
        progress(done / max(n, 1))
    if payloads is not None and next(payloads, _END) is not _END:
        raise InputError(f"the payloads file has more lines than the {n} rows of {src.path}")


_END = object()


def _take(payloads: Iterator, m: int, done: int, n: int) -> list:
    out = [p for _, p in zip(range(m), payloads)]
    if len(out) < m:
        raise InputError(f"the payloads file has {done + len(out)} lines for the {n} rows of the vectors file")
    return out


def _check_ids(ids, n: int):
    return None if ids is None else ids_array(ids, n, explicit=True)


def _train_sample(src: FileRows, dim: int, space: str, encoder, n: int, rows: int, random_state: int,
                  progress: Callable[[float], None]) -> np.ndarray:
    """A seeded sample of ``rows`` of the ``n`` rows of ``src`` (IVF's k-means), gathered in one pass into one
    (rows, dim) float32 array (no list of pieces joined at the end: that held the sample twice)."""
    keep = np.sort(np.random.default_rng(random_state).choice(n, rows, replace=False)) if rows < n else None
    out, pos, filled = np.empty((rows, dim), np.float32), 0, 0
    for X, _, _ in _blocks(src, dim, space, encoder, ids=None, payloads=None, n=n, progress=progress):
        part = X if keep is None else X[keep[(keep >= pos) & (keep < pos + X.shape[0])] - pos]
        out[filled:filled + part.shape[0]] = part
        filled += part.shape[0]
        pos += X.shape[0]
    if filled != rows:
        raise InputError(f"{src.path} changed while it was read ({filled} of {rows} sample rows found)")
    return out


def _rows_again(src: FileRows, dim: int, space: str, n: int, progress: Callable[[float], None]) -> Iterator[np.ndarray]:
    """The rows ``X (m, dim)`` of every block of a vectors file ``src``, read once more, as :func:`_blocks` gives
    them."""
    return (X for X, _, _ in _blocks(src, dim, space, None, ids=None, payloads=None, n=n, progress=progress))


def create_from_file(resolver: Resolver, store: IndexStore, name: str, space, src: FileRows, *, ids=None,
                     payloads: Iterator | None = None, kind: str = "auto", metric: str = "cosine",
                     params: dict | None = None, random_state: int = 0, description: str = "",
                     progress: Callable[[str, float], None] = lambda stage, f: None) -> SpaceIndex:
    """Create index ``name`` in ``space`` (a SpaceInfo) from every row of ``src`` (see the module notes);
    ``ids`` (n,) and ``payloads`` (an iterator of n JSON values) optional."""
    n = count(src)
    ids = _check_ids(ids, n)
    encoder = passage_encoder(resolver, space.name, space.dim, src.encoder) if src.texts else None
    kind = choose_kind(n) if kind == "auto" else kind
    params = dict(params or {})
    train = None
    if kind == "ivf" and n > CHUNK_ROWS:
        params = check_index_params(kind, params, n_rows=n, dim=space.dim, random_state=random_state)  # before a pass
        params["nlist"], rows = ivf_training(n, params)
        # drawn when the index is made and freed once k-means is done: not held while the rows are added
        train = partial(_train_sample, src, space.dim, space.name, encoder, n, rows, random_state,
                        lambda f: progress("sample (k-means)", f))
    again = None
    if kind == "ivf" and not src.texts:  # each IVF list sized once from a pass over the file (texts: not embedded)
        again = partial(_rows_again, src, space.dim, space.name, n, lambda f: progress("lists (IVF)", f))
    blocks = _blocks(src, space.dim, space.name, encoder, ids=ids, payloads=payloads, n=n,
                     progress=lambda f: progress("add", f))
    X, ids0, pl0 = next(blocks)
    return store.create(name, space.name, X, ids=ids0, payloads=pl0, more=blocks, train=train, dim=space.dim,
                        rows=n, kind=kind, metric=metric, params=params, random_state=random_state,
                        description=description, again=again, before_commit=space_still_there(resolver, space))


def check_same_settings(idx: SpaceIndex, *, space: str, kind: str = "auto", metric: str = "cosine",
                        params: dict | None = None, random_state: int | None = None) -> None:
    """Nothing when the existing index ``idx`` has the settings a create would give it: ``space``, ``metric``,
    ``kind`` and each of ``params`` (checked as a create checks them) and ``random_state``; what the caller leaves
    to its default matches any (``kind="auto"``: chosen by the rows; a parameter not given; ``random_state=None``).
    Else :class:`IndexConflictError` naming each setting that differs (a re-run of a provisioning script with
    other settings must not pass for done)."""
    differ = [f"{what} {have!r}, not {want!r}" for what, have, want in (
        ("space", idx.space, space), ("metric", idx.metric, metric),
        ("kind", idx.kind, idx.kind if kind == "auto" else kind)) if have != want]
    if not any(d.startswith("kind") for d in differ):  # another kind's parameters: the kind says it
        checked = check_index_params(idx.kind, {k: v for k, v in (params or {}).items() if k != "random_state"})
        if random_state is not None:
            checked["random_state"] = random_state
        have = {"random_state": 0, **idx.params}  # an index from before seeds were kept was built with 0
        differ += [f"{k}={have.get(k)}, not {v}" for k, v in checked.items() if have.get(k) != v]
    if differ:
        raise IndexConflictError(f"index {idx.name!r} already exists with other settings: {'; '.join(differ)} "
                                 f"(--if-not-exists accepts only the same ones; drop it or choose another name)")


def add_from_file(resolver: Resolver, idx: SpaceIndex, src: FileRows, *, ids=None, payloads: Iterator | None = None,
                  space: str | None = None, progress: Callable[[str, float], None] = lambda stage, f: None,
                  warn: Callable[[str], None] | None = None) -> np.ndarray:
    """Add every row of ``src`` to ``idx`` as one generation; returns the ids. ``space``: the rows' space, which
    must be the index's (rows of another space are refused, not mapped). Vectors with no ``space`` are taken for
    the index's: their first block is checked (:func:`~service.ops.indexes.check_rows_space`, with ``resolver``'s
    references; ``warn`` as there) and rows that look like another space's are refused before anything is
    written."""
    if space is not None and space != idx.space:
        raise InputError(f"index {idx.name!r} holds space {idx.space!r}; rows of space {space!r} would not be "
                         f"comparable with it (map them first: vecbridge transform)")
    n = count(src)
    ids = _check_ids(ids, n)
    encoder = passage_encoder(resolver, idx.space, idx.dim, src.encoder) if src.texts else None
    blocks = _blocks(src, idx.dim, idx.space, encoder, ids=ids, payloads=payloads, n=n,
                     progress=lambda f: progress("add", f))
    if space is None and not src.texts:  # texts are embedded by the space's encoder; --space SPACE declared them
        first = next(blocks)
        check_rows_space(resolver, idx, first[0], f"the rows of {src.path}",
                         f"map them into {idx.space!r} first (vecbridge transform --map MAP, a map from {{other}}), "
                         f"or add them to an index of space {{other}}; --space {idx.space} declares them "
                         f"{idx.space!r} rows", warn)
        blocks = chain([first], blocks)
    if n <= (TEXT_CHUNK if src.texts else CHUNK_ROWS):
        X, ids_m, pl = next(blocks)
        for _ in blocks:  # the payloads file's length check
            pass
        return idx.add(X, ids=ids_m, payloads=pl)
    return idx.add_blocks(blocks)
