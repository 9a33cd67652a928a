"""``vecbridge embed``: texts into vectors with an installed encoder (``vecbridge encoders``), written as a file,
through the same code as ``POST /v1/embeddings`` (:func:`service.ops.embeddings.embed_file`)."""

from __future__ import annotations

import click

from ._common import ROWS, Ctx, emit, json_opt, progress_bar, quiet_opt, warn

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
                   "when new, as `fit` registers its sides; one registered with another encoder or width, or with none "
                   "(bind one with `spaces add NAME --encoder`), is refused before anything is embedded; a new one "
                   "whose name is a near miss of a registered space's that recognises the vectors (a misspelling: "
                   "minlm for minilm) before anything is written.")
@click.option("--truncate/--no-truncate", default=True, show_default=True,
              help="--no-truncate: refuse a text longer than the encoder reads (MiniLM 256, mpnet 384 word pieces), "
                   "naming its row, its tokens and the limit, before anything is embedded or written, instead of "
                   "embedding its start (HTTP's `truncate: false`).")
@click.argument("texts", type=click.Path(dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@json_opt
@quiet_opt
@click.pass_obj
def embed_cmd(obj: Ctx, texts, out, encoder, kind, rows, text_field, chunk_rows, space, truncate, as_json, quiet):
    """Embed the texts of TEXTS (.txt one per line, .jsonl, .json a list of strings) into OUT (.npy, .fvecs or
    .parquet: float32 unit rows, row i embeds the i-th text), in chunks.

    Every selected text is checked (one without text is refused, naming its line) before the first is embedded;
    OUT appears complete or not at all. A long text is cut by MiniLM at 256 word pieces and by mpnet at 384 (the
    rest unread; a warning counts them, as --json's "truncated"; --no-truncate refuses it instead, exit 2); e5 reads
    all of it (512-token windows, averaged)."""
    from ..ops.embeddings import check_new_rows, embed_file  # the encoders' packages: imported when a command embeds
    from ..registry.names import check_name

    new_space = []  # the registry is opened once the encoder and the texts are good: a refusal leaves none made
    if space is not None:
        check_name(space, "space name")

    def ready(enc):  # before any text is embedded: a registered space of another encoder or width is refused
        new_space.extend((_check_space(obj, space, enc), enc.name))

    def rows_check(V):  # before any row is written: a new space misspelling a registered one is refused
        if new_space[0]:
            check_new_rows(obj.registry, space, V, name=f"the texts embedded by {new_space[1]}", option="--space",
                           add=f" --encoder {new_space[1]}", by="`embed --space`")

    progress, close = progress_bar(quiet=quiet, as_json=as_json)
    try:
        res = embed_file(texts, out, encoder=encoder, kind=kind, rows=rows, text_field=text_field,
                         chunk_rows=chunk_rows, progress=progress, truncate=truncate,
                         ready=None if space is None else ready, rows_check=None if space is None else rows_check)
    finally:
        close()
    if space is not None:
        if new_space[0]:
            obj.registry.register_space(space, res["dim"], encoder=res["encoder"])
        res["space"] = space
    if res["truncated"]:
        warn(f"{res['truncated']} of {res['rows']} texts are longer than {res['encoder']} reads ({res['max_tokens']} "
             f"tokens): each was embedded from its first {res['max_tokens']}, the rest unread")
    emit(res, as_json, f"wrote {res['rows']} rows ({res['dim']}-d, {res['kind']}) to {out} with {res['encoder']}"
         + (f" (space {space})" if space is not None else ""))


def _check_space(obj: Ctx, space: str, enc) -> bool:
    """Before any text is embedded: whether ``space`` is new (registered with the encoder ``enc`` once its vectors
    are written). A registered one must be of ``enc``'s width and record ``enc`` as its encoder: one of another
    encoder, or of none (vectors fitted from files: their model is unknown), is refused."""
    from align.exceptions import DimensionMismatchError, InputError

    from ..encoders import space_encoder
    from ..registry import NotFoundError

    try:
        info = obj.registry.get_space(space)
    except NotFoundError:
        return True
    if info.dim != enc.dim:
        raise DimensionMismatchError(f"space {space!r} is {info.dim}-d; {enc.name} embeds {enc.dim}-d")
    if not info.encoder:
        raise InputError(f"space {space!r} records no encoder; bind one with `vecbridge spaces add {space} --encoder "
                         f"{enc.name}` if {enc.name} embeds it")
    space_encoder(space, info.encoder, enc.name,
                  remedy=lambda model: f"embed them with --encoder {model}, or give another --space" if model
                  else "give another --space")
    return False
