"""``vecbridge transform``: the rows of a file mapped into another file, chunk by chunk (files may exceed memory).

A ``.parquet`` input written to a ``.parquet`` output keeps its other columns, row for row
(:class:`service.tables.MappedWriter`); into ``.npy`` / ``.fvecs`` only the vectors go, and the result's ``note``
names the columns left behind.
"""

from __future__ import annotations

from pathlib import Path

from align.exceptions import DimensionMismatchError, EmptyInputError

from ..encoders import space_encoder
from ..io import (
    check_not_input,
    count_rows,
    is_text_path,
    iter_chunks,
    parse_rows,
    resolve_rows,
)
from ..progress import Progress, silent
from ..storage import check_writable
from ..tables import MappedWriter

__all__ = ["transform_file"]


def transform_file(registry, ref: str, inp, out, *, chunk_rows: int = 65536, output: str = "raw", rows=None,
                   key: str | None = None, column: str | None = None, encoder: str | None = None,
                   ray_address: str | None = None, progress: Progress | None = None, text_field: str = "text") -> dict:
    """Map the rows of file ``inp`` with map ``ref`` into file ``out`` chunk by chunk (files may exceed memory).

    ``rows`` ``"START:STOP"``; ``key`` / ``column`` name the .npz array / Parquet column; ``encoder`` embeds a text
    file first (``text_field``: the field of a ``.jsonl`` holding the text); ``output`` as :meth:`align.LinearMap.apply`
    (any kind of map); ``ray_address`` (``"local"`` or a cluster) streams the chunks through Ray workers, same output.
    A parquet's other columns go along into a parquet ``out`` (:class:`~service.tables.MappedWriter`).
    ``progress`` reports ``("transform", rows done / rows)``. Returns ``{"map", "rows", "out", "dim", "output",
    "note"}``; ``note``: the input's columns ``out`` cannot hold (a .parquet's into .npy / .fvecs), else None.
    """
    check_not_input(out, "the output", inp)  # the input replaced by its own mapped rows (or some of them)
    v = registry.resolve(ref)
    m = registry.load_map(v)
    check_writable(out, "the output")  # a read-only folder: the error named the writer's hidden temporary file
    if is_text_path(inp):  # the source space's encoder, or None (reading the texts then says to name one)
        encoder = space_encoder(v.source_space, registry.get_space(v.source_space).encoder, encoder)
    total = count_rows(inp, key=key, column=column, text_field=text_field)
    r = parse_rows(rows)
    if r is not None:
        sl = resolve_rows(r, total, inp)
        total = sl.stop - sl.start
    if total == 0:
        raise EmptyInputError(f"{Path(inp).name}: no rows to transform")
    say = progress or silent

    def checked():
        for chunk in iter_chunks(inp, chunk_rows=chunk_rows, rows=r, key=key, column=column, encoder=encoder,
                                 text_field=text_field):
            if chunk.shape[1] != m.source_dim:
                raise DimensionMismatchError(f"{Path(inp).name} has {chunk.shape[1]}-d rows; {v.ref} expects "
                                             f"{m.source_dim}-d")
            yield chunk

    if ray_address is None:
        mapped = (m.apply(chunk, output=output) for chunk in checked())
    else:
        from ..distributed import apply_stream_ray  # Ray: imported only when asked for

        mapped = apply_stream_ray(m, checked(), output=output, address=None if ray_address == "local" else ray_address)
    done = 0
    say("transform", 0.0)
    with MappedWriter(inp, out, dim=m.target_dim, n_rows=total, column=column, rows=r, batch_rows=chunk_rows) as w:
        for Y in mapped:
            w.write(Y)
            done += Y.shape[0]
            say("transform", done / total)
    return {"map": v.ref, "rows": total, "out": str(out), "dim": m.target_dim, "output": output, "note": w.note}
