"""``vecbridge embed``: texts into vectors with an installed encoder (``vecbridge encoders``), written as a file,
through the same code as ``POST /v1/embeddings`` (:func:`service.ops.embeddings.embed_file`)."""

from __future__ import annotations

import click

from ._common import ROWS, Ctx, check_text_encoder, emit, json_opt, progress_bar, quiet_opt

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
@click.option("--space", default=None, metavar="NAME",
              help="The registered space the vectors are of (as `index create --space`): registered with --encoder "
                   "when new, as `fit` registers its sides; one registered with another encoder or width is refused "
                   "before anything is embedded.")
@click.argument("texts", type=click.Path(dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@json_opt
@quiet_opt
@click.pass_obj
def embed_cmd(obj: Ctx, texts, out, encoder, kind, rows, text_field, chunk_rows, space, as_json, quiet):
    """Embed the texts of TEXTS (.txt one per line, .jsonl, .json a list of strings) into OUT (.npy, .fvecs or
    .parquet: float32 unit rows, row i embeds the i-th text), in chunks.

    Every selected text is checked (one without text is refused, naming its line) before the first is embedded;
    OUT appears complete or not at all."""
    from ..ops.embeddings import embed_file  # the encoders' packages: imported when a command embeds

    if space is not None:
        _check_space(obj.registry, texts, space, encoder)
    progress, close = progress_bar(quiet=quiet, as_json=as_json)
    try:
        res = embed_file(texts, out, encoder=encoder, kind=kind, rows=rows, text_field=text_field,
                         chunk_rows=chunk_rows, progress=progress)
    finally:
        close()
    if space is not None:
        obj.registry.register_space(space, res["dim"], encoder=res["encoder"])
        res["space"] = space
    emit(res, as_json, f"wrote {res['rows']} rows ({res['dim']}-d, {res['kind']}) to {out} with {res['encoder']}"
         + (f" (space {space})" if space is not None else ""))


def _check_space(registry, texts: str, space: str, encoder: str) -> None:
    """Before any text is embedded: a registered ``space`` of another encoder (:func:`check_text_encoder`) or of
    another width than ``encoder``'s is refused; a new one's name is checked as registering it will."""
    from align.exceptions import DimensionMismatchError

    from ..encoders import ENCODERS, canonical_name
    from ..registry import NotFoundError
    from ..registry.names import check_name

    check_name(space, "space name")
    check_text_encoder(registry, texts, space, encoder)
    try:
        info = registry.get_space(space)
    except NotFoundError:
        return
    dim = ENCODERS[canonical_name(encoder)][0]
    if info.dim != dim:
        raise DimensionMismatchError(f"space {space!r} is {info.dim}-d; {canonical_name(encoder)} embeds {dim}-d")
