"""``vecbridge transform``: the rows of a file mapped into another file, chunk by chunk (files may exceed memory).

A ``.parquet`` input written to a ``.parquet`` output keeps its other columns, row for row
(:class:`service.tables.MappedWriter`); into ``.npy`` / ``.fvecs`` only the vectors go, and the result's ``note``
names the columns left behind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

from align.coverage import keep_native_rows
from align.exceptions import DegenerateInputError, DimensionMismatchError, EmptyInputError, InputError

from ..encoders import space_encoder
from ..io import (
    check_not_input,
    count_rows,
    is_text_path,
    iter_chunks,
    parse_rows,
    read_vectors,
    resolve_rows,
    rows_count,
)
from ..progress import Progress, silent
from ..spaces import SPACE_SAMPLE_ROWS, check_rows, map_references
from ..storage import check_writable
from ..tables import MappedWriter
from ..vectordb.keep import check_keep

__all__ = ["check_direction", "check_direction_rows", "check_no_zero_rows", "first_rows", "rows_of_input",
           "rows_through", "transform_file"]


def transform_file(registry, ref: str, inp, out, *, chunk_rows: int = 65536, output: str = "raw", rows=None,
                   key: str | None = None, column: str | None = None, encoder: str | None = None,
                   ray_address: str | None = None, progress: Progress | None = None, text_field: str = "text",
                   warn: Callable[[str], None] | None = None, keep_rows=None, keep_vectors=None) -> dict:
    """Map the rows of file ``inp`` with map ``ref`` into file ``out`` chunk by chunk (files may exceed memory).

    ``rows`` ``"START:STOP"``; ``key`` / ``column`` name the .npz array / Parquet column; ``encoder`` embeds a text
    file first (``text_field``: the field of a ``.jsonl`` holding the text); ``output`` as :meth:`align.LinearMap.apply`
    (any kind of map); ``ray_address`` (``"local"`` or a cluster) streams the chunks through Ray workers, same output.
    A parquet's other columns go along into a parquet ``out`` (:class:`~service.tables.MappedWriter`).
    ``progress`` reports ``("transform", rows done / rows)``. Returns ``{"map", "rows", "out", "dim", "output",
    "note"}``; ``note``: the input's columns ``out`` cannot hold (a .parquet's into .npy / .fvecs), else None.

    ``keep_rows`` (rows of ``inp``, as ``rows``: ``"START:STOP"`` or indices) and ``keep_vectors`` (a vector file of
    their new-model vectors, in that order: the pairs the map was fitted on) write those rows' own vectors instead of
    their mapped ones (:func:`align.keep_native_rows`; ``output="raw"`` only); the rows of ``keep_rows`` outside
    ``rows`` are not written. The result then holds ``kept``, the rows written native.

    Vectors are checked first as a migration checks a collection (:func:`check_direction`): rows that look like the
    map's TARGET space (a map the wrong way round) are a SpaceMismatchError before anything is written; ``warn(note)``
    gets rows that neither side recognises.
    """
    check_not_input(out, "the output", inp, *(() if keep_vectors is None else (keep_vectors,)))  # before the registry
    if (keep_rows is None) != (keep_vectors is None):
        raise InputError("keeping re-embedded rows needs both their rows (--keep-rows) and their new-model vectors "
                         "(--keep-vectors)")
    if keep_rows is not None and output != "raw":
        raise InputError(f"keeping re-embedded rows needs output 'raw' (their vectors are the new model's own, "
                         f"which output {output!r} does not hold)")
    v = registry.resolve(ref)
    m = registry.load_map(v)
    kept = None if keep_rows is None else _kept_rows(inp, rows, keep_rows, keep_vectors, m.target_dim, key=key,
                                                     column=column, text_field=text_field)
    texts = is_text_path(inp)
    if texts:  # the source space's encoder, or None (reading the texts then says to name one)
        encoder = space_encoder(v.source_space, registry.get_space(v.source_space).encoder, encoder)
    else:  # texts: their first embedded rows are checked as they come (embedding them twice would cost)
        check_direction(v, m, inp, rows=rows, key=key, column=column, warn=warn)

    file_rows = rows_of_input(inp, rows, key=key, column=column, text_field=text_field)

    def mapped(chunks):
        name, skip = Path(inp).name, None if kept is None else kept[0]
        if texts:  # another model's vectors of the same width (--encoder e5 for a minilm map) mapped silently
            chunks = _direction_checked(chunks, v, m, name=f"the rows of {name} embedded by {encoder!r}", warn=warn,
                                        fix=f"the wrong --encoder? Embed the texts with the model that made "
                                            f"space {v.source_space!r}'s vectors; or, if they are meant as "
                                            f"{{other}} rows, map them with a map from {{other}}")
        if ray_address is None:  # zero rows told after the apply's NaN check, as HTTP tells them
            return _no_zero_rows(chunks, name, skip, file_rows, lambda chunk: m.apply(chunk, output=output))
        chunks = _no_zero_rows(chunks, name, skip, file_rows)
        from ..distributed import apply_stream_ray  # Ray: imported only when asked for

        return apply_stream_ray(m, chunks, output=output, address=None if ray_address == "local" else ray_address)

    def through(chunks):
        if kept is None:
            yield from mapped(chunks)
            return
        pos, Y_keep = kept  # output positions of the kept rows, ascending, and their vectors
        done = 0
        for block in mapped(chunks):
            lo, hi = np.searchsorted(pos, [done, done + block.shape[0]])
            if hi > lo:
                block = keep_native_rows(block, pos[lo:hi] - done, Y_keep[lo:hi], copy=False)
            done += block.shape[0]
            yield block

    res = rows_through(inp, out, through, source_dim=m.source_dim, target_dim=m.target_dim, expects=f"{v.ref} expects",
                       chunk_rows=chunk_rows, rows=rows, key=key, column=column, encoder=encoder,
                       text_field=text_field, progress=progress)
    return {"map": v.ref, "rows": res["rows"], "out": res["out"], "dim": res["dim"], "output": output,
            "note": res["note"], **({} if kept is None else {"kept": int(kept[0].size)})}


#: why a transform refuses an all-zero row (:func:`check_no_zero_rows`)
ZERO_MAPPED_ROW = ("and the map would send it to its offset, a made-up vector ranked like a real one (a search "
                   "through a map and a migration refuse it too)")


def check_no_zero_rows(X: np.ndarray, name: str, first: int = 0, skip: np.ndarray | None = None, *,
                       file_rows: Callable[[np.ndarray], np.ndarray] | None = None, why: str = ZERO_MAPPED_ROW) -> None:
    """DegenerateInputError naming the all-zero rows of ``X`` (n, d) (numbered from ``first``; those in ``skip``, rows
    written native, let through). A zero row has no direction: a map sent it to its offset (the image of the frame's
    origin), a made-up vector that then ranked like a real one, where a search through a map and a migration refuse
    it. ``LinearMap.apply`` keeps that image (the library's defined value); the transform, HTTP and CLI, refuses.
    ``file_rows``: ``X`` is a chunk of the rows read from a file (those before it: ``first``), and the rows of that
    file these numbers are (``--rows`` selects some): the message names those, counted over the rows read so far.
    ``why``: what the row would have become (a steer's refusal says its own)."""
    zero = ~np.logical_or.reduce(X != 0, axis=1)  # NaN is not zero (the apply names it)
    if X.shape[0] and zero.any():
        at = np.flatnonzero(zero) + first
        at = at if skip is None else at[~np.isin(at, skip)]
        if at.size:
            where = f"{at.size} all-zero row(s) (row "
            if file_rows is not None:
                at = file_rows(at)
                where = f"{at.size} all-zero row(s) in the first {first + X.shape[0]} rows read (input row "
            shown = ", ".join(map(str, at[:10].tolist())) + (", ..." if at.size > 10 else "")
            raise DegenerateInputError(f"{name}: {where}{shown}); a zero row has no direction, {why}: drop such "
                                       f"rows or embed them")


def rows_of_input(inp, rows, *, key: str | None = None, column: str | None = None,
                  text_field: str = "text") -> Callable[[np.ndarray], np.ndarray]:
    """``file_rows`` of :func:`check_no_zero_rows`: places among the rows read of ``inp`` -> rows of the input
    (``rows``, ``--rows``, selects some; only to tell)."""
    def file_rows(at: np.ndarray) -> np.ndarray:
        if rows is None:
            return at
        sel = resolve_rows(parse_rows(rows), count_rows(inp, key=key, column=column, text_field=text_field), inp)
        return at + sel.start if isinstance(sel, slice) else np.asarray(sel)[at]
    return file_rows


def _no_zero_rows(chunks: Iterable[np.ndarray], name: str, skip: np.ndarray | None,
                  file_rows: Callable[[np.ndarray], np.ndarray],
                  apply: Callable[[np.ndarray], np.ndarray] | None = None) -> Iterator[np.ndarray]:
    """``chunks`` (``apply``: each mapped by it), each checked by :func:`check_no_zero_rows` (rows numbered across
    chunks, named as rows of the input by ``file_rows``) before it is yielded."""
    done = 0
    for chunk in chunks:
        out = chunk if apply is None else apply(chunk)
        check_no_zero_rows(chunk, name, done, skip, file_rows=file_rows)
        done += chunk.shape[0]
        yield out


def _direction_checked(chunks: Iterable[np.ndarray], v, m, *, name: str, fix: str,
                       warn: Callable[[str], None] | None = None) -> Iterator[np.ndarray]:
    """``chunks`` as they come, the first :data:`~service.spaces.SPACE_SAMPLE_ROWS` rows (or all there are) checked
    by :func:`check_direction_rows` (with ``fix``) before the first chunk is yielded: nothing written before."""
    held, n = [], 0
    it = iter(chunks)
    for chunk in it:
        held.append(chunk)
        n += chunk.shape[0]
        if n >= SPACE_SAMPLE_ROWS:
            break
    if held and held[0].ndim == 2 and held[0].shape[1] == m.source_dim:  # another width: refused when read
        check_direction_rows(v, m, np.concatenate(held)[:SPACE_SAMPLE_ROWS], name=name, how="", warn=warn, fix=fix)
    yield from held
    yield from it


def _kept_rows(inp, rows, keep_rows, keep_vectors, dim: int, *, key=None, column=None, text_field: str = "text"
               ) -> tuple[np.ndarray, np.ndarray]:
    """``(pos, Y)``: the output positions (ascending) of the rows ``keep_rows`` of ``inp`` that ``rows`` selects and
    their vectors from ``keep_vectors`` (one ``dim``-d row per listed row, in ``keep_rows``' order), checked."""
    total = count_rows(inp, key=key, column=column, text_field=text_field)
    want = resolve_rows(parse_rows(keep_rows), total, inp, what="--keep-rows")
    want = np.arange(want.start, want.stop) if isinstance(want, slice) else np.asarray(want, dtype=np.int64)
    # the migration's checker (a zero vector was refused only when its chunk came, the output half written)
    Y = read_vectors(keep_vectors, encoder_option=None, key_option=None, finite=False)  # check_keep names NaN rows
    want, Y = check_keep(want, Y, dim,
                         vectors_name=f"the keep vectors ({Path(keep_vectors).name})",
                         ids_name="the keep rows (--keep-rows)", id_word="input row")
    sel = resolve_rows(parse_rows(rows), total, inp)
    if isinstance(sel, slice):
        pos, inside = want - sel.start, (want >= sel.start) & (want < sel.stop)
    else:  # rows listed: each kept row's place in that list, if it is there
        order = np.argsort(sel, kind="stable")
        at = np.minimum(np.searchsorted(sel[order], want), sel.size - 1)
        inside = sel[order][at] == want
        pos = order[at]
    pos, Y = pos[inside], Y[inside]
    by = np.argsort(pos, kind="stable")
    return pos[by], Y[by]


def first_rows(inp, *, rows=None, key: str | None = None, column: str | None = None) -> np.ndarray | None:
    """The first :data:`~service.spaces.SPACE_SAMPLE_ROWS` rows of vectors file ``inp`` (``rows``, ``key``,
    ``column`` as :func:`~service.io.iter_chunks`), what the rows checks read; None for none."""
    chunks = iter_chunks(inp, chunk_rows=SPACE_SAMPLE_ROWS, rows=rows, key=key, column=column)
    try:
        return next(chunks, None)
    finally:
        chunks.close()


def check_direction(v, m, inp, *, rows=None, key: str | None = None, column: str | None = None,
                    warn: Callable[[str], None] | None = None) -> None:
    """The first :data:`~service.spaces.SPACE_SAMPLE_ROWS` rows of vectors file ``inp`` against map ``m``'s two
    frames (``v``: its VersionInfo), as :func:`service.vectordb.migrate.check_rows_space` checks a collection: rows
    that look like its target side are a SpaceMismatchError (:func:`check_direction_rows`). Nothing for a map
    within one space, or rows of another width (refused by width when read)."""
    if v.source_space == v.target_space:
        return
    first = first_rows(inp, rows=rows, key=key, column=column)
    if first is None or first.ndim != 2 or first.shape[1] != m.source_dim:
        return
    check_direction_rows(v, m, first, name=f"the rows of {Path(inp).name}", how="vecbridge transform --map MAP",
                         warn=warn)


def check_direction_rows(v, m, X: np.ndarray, *, name: str, how: str,
                         warn: Callable[[str], None] | None = None, fix: str | None = None) -> None:
    """Rows ``X`` (n, source dim) against map ``m``'s two frames (``v``: its VersionInfo; :func:`check_rows` with
    :func:`map_references`, built only for ``MEAN_CHECK_MIN_ROWS`` rows or more): rows that look like its target
    side are a SpaceMismatchError whose fix names ``how`` a map is applied (``fix``: another fix, ``{other}`` the
    space the rows look like). Nothing for a map within one space."""
    if v.source_space == v.target_space:
        return
    check_rows(X, v.source_space, lambda: map_references(v, m), name=name, warn=warn,
               fix=fix or f"a map the wrong way round? Map them with a map from {{other}} ({how}: {v.ref} reads "
                   f"{v.source_space!r} rows); or, if they are {v.source_space!r} rows, {v.ref} itself was "
                   f"fitted on swapped files (its sides, read from the rows it was fitted on, hold the other "
                   f"way round): fit it again")


def rows_through(inp, out, through: Callable[[Iterator[np.ndarray]], Iterable[np.ndarray]], *, source_dim: int,
                 target_dim: int, expects: str, chunk_rows: int = 65536, rows=None, key: str | None = None,
                 column: str | None = None, encoder: str | None = None, kind: str = "passage",
                 text_field: str = "text", progress: Progress | None = None, stage: str = "transform") -> dict:
    """The rows of file ``inp`` (``rows`` ``"START:STOP"``; ``key`` / ``column``: the .npz array / Parquet column;
    a text file embedded with ``encoder`` as ``kind``) read ``chunk_rows`` at a time, checked ``source_dim``-d
    (else DimensionMismatchError "... has N-d rows; {expects} D-d"), passed through ``through`` (chunks in, blocks
    of ``target_dim``-d rows out, in order) and written to ``out`` with a parquet's other columns
    (:class:`~service.tables.MappedWriter`). The one path of ``vecbridge transform`` and ``vecbridge steer apply``.
    ``progress`` reports ``(stage, rows done / rows)``. Returns ``{"rows", "out", "dim", "note"}``.
    """
    check_not_input(out, "the output", inp)  # the input replaced by its own mapped rows (or some of them)
    check_writable(out, "the output")  # a read-only folder: the error named the writer's hidden temporary file
    total = count_rows(inp, key=key, column=column, text_field=text_field)
    r = parse_rows(rows)  # "START:STOP", or row indices (``--rows rows.npy``)
    if r is not None:
        total = rows_count(resolve_rows(r, total, inp))
    if total == 0:
        raise EmptyInputError(f"{Path(inp).name}: no rows to {stage}")
    say = progress or silent

    def checked():
        for chunk in iter_chunks(inp, chunk_rows=chunk_rows, rows=r, key=key, column=column, encoder=encoder,
                                 kind=kind, text_field=text_field):
            if chunk.shape[1] != source_dim:
                raise DimensionMismatchError(f"{Path(inp).name} has {chunk.shape[1]}-d rows; {expects} "
                                             f"{source_dim}-d")
            yield chunk

    done = 0
    say(stage, 0.0)
    with MappedWriter(inp, out, dim=target_dim, n_rows=total, column=column, rows=r, batch_rows=chunk_rows) as w:
        for Y in through(checked()):
            w.write(Y)
            done += Y.shape[0]
            say(stage, done / total)
    return {"rows": total, "out": str(out), "dim": target_dim, "note": w.note}
