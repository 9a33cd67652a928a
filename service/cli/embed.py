"""``vecbridge embed``: texts into vectors with an installed encoder (``vecbridge encoders``), written as a file,
through the same code as ``POST /v1/embeddings`` (:func:`service.ops.embeddings.embed_file`)."""

from __future__ import annotations

import click

from ._common import ROWS, emit, json_opt, progress_bar, quiet_opt

__all__ = ["embed_cmd"]


@click.command("embed")
@click.option("--encoder", required=True, metavar="NAME",
              help="The encoder (`vecbridge encoders`; short names minilm, e5, mpnet).")
@click.option("--kind", type=click.Choice(["passage", "query"]), default="passage", show_default=True,
              help="What the texts are: documents (passage) or search queries (query). e5 embeds them as "
                   "\"passage: TEXT\" / \"query: TEXT\"; the other encoders embed both alike.")
@click.option("--rows", type=ROWS, default=None,
              help="START:STOP texts of TEXTS (negative counts from the end), or a file of row indices (the .npy "
                   "`plan --rows-out` writes; .json or text): those texts, in that order; OUT row i is the i-th.")
@click.option("--text-field", default="text", show_default=True, help="JSONL field holding the text.")
@click.option("--chunk-rows", type=click.IntRange(1), default=1024, show_default=True,
              help="Texts embedded and written at a time.")
@click.argument("texts", type=click.Path(dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@json_opt
@quiet_opt
def embed_cmd(texts, out, encoder, kind, rows, text_field, chunk_rows, as_json, quiet):
    """Embed the texts of TEXTS (.txt one per line, .jsonl, .json a list of strings) into OUT (.npy, .fvecs or
    .parquet: float32 unit rows, row i embeds the i-th text), in chunks.

    Every selected text is checked (one without text is refused, naming its line) before the first is embedded;
    OUT appears complete or not at all."""
    from ..ops.embeddings import embed_file  # the encoders' packages: imported when a command embeds

    progress, close = progress_bar(quiet=quiet, as_json=as_json)
    try:
        res = embed_file(texts, out, encoder=encoder, kind=kind, rows=rows, text_field=text_field,
                         chunk_rows=chunk_rows, progress=progress)
    finally:
        close()
    emit(res, as_json, f"wrote {res['rows']} rows ({res['dim']}-d, {res['kind']}) to {out} with {res['encoder']}")
