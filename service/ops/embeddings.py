"""Texts into vectors for every face: the sides of a fit request (vectors, or texts embedded in the job) and
``POST /v1/embeddings`` (texts embedded with an installed encoder, optionally carried into another space).

A side is a matrix ``X`` (n, d) of its space's width, or n texts with an encoder; :func:`embed_side` turns the
texts into ``X = encoder.encode(texts)`` (n, d) float32. :func:`embed` returns ``X`` (n, d_model), or
``X H`` (n, d_target) with ``H`` the map (or composed path of maps) from the model's space into the target space:
the registry's path, or the one the request pins (``map_ref``, checked hop by hop as a search's is).
:func:`embed_file` (``vecbridge embed``) writes a text file's embeddings, chunk by chunk, by the step :func:`embed`
encodes with (:func:`encode_texts`): the same rows as ``POST /v1/embeddings`` without a ``target_space``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import align
from align.exceptions import DimensionMismatchError, EmptyInputError, InputError
from align.validation import as_matrix

from .. import encoders
from ..encoders import UnknownEncoderError, check_texts, space_encoder
from ..errors import ConflictError
from ..progress import Progress, silent
from ..registry import NotFoundError
from ..space_names import check_new_space
from ..spaces import SPACE_SAMPLE_ROWS, space_references

__all__ = ["FitSide", "check_new_rows", "check_new_side", "check_pairs", "count_cut", "embed", "embed_file",
           "embed_side", "encode_texts", "fit_side", "tokens_read"]


@dataclass
class FitSide:
    """One side of a fit request: vectors ``X`` (n, d), or ``texts`` embedded with ``encoder`` in the job.

    ``known``: the space is registered already; otherwise the job registers it from the data.
    """

    space: str
    label: str
    X: np.ndarray | None = None
    texts: list[str] | None = None
    encoder: str | None = None
    known: bool = False

    @property
    def rows(self) -> int:
        return int(self.X.shape[0]) if self.X is not None else len(self.texts)

    def describe(self) -> str:
        return f"{len(self.texts)} texts via {self.encoder}" if self.texts is not None else f"{self.rows} vectors"

def fit_side(registry, load_encoder: Callable, *, space: str, label: str, X: np.ndarray | None = None,
             texts: list[str] | None = None, encoder: str | None = None) -> FitSide:
    """Check one side against its space: vectors of the space's width, or texts with a known encoder
    (default: the space's, and another model is refused; an unknown one raises UnknownEncoderError now rather than
    in the job)."""
    try:
        info = registry.get_space(space)
    except NotFoundError:
        info = None
    if texts is not None:
        encoder = space_encoder(space, info.encoder if info else None, encoder)
        if not encoder:
            raise InputError(f"{label}: give an `encoder` for the texts (space {space!r} has none registered)")
        check_texts(texts, f"{label} texts")  # with the request, not in the job minutes later
        load_encoder(encoder)
        return FitSide(space, label, texts=list(texts), encoder=encoder, known=info is not None)
    if info is not None and X.shape[1] != info.dim:
        raise DimensionMismatchError(f"{label}: space {space!r} is {info.dim}-d, the vectors have {X.shape[1]} columns")
    return FitSide(space, label, X=X, known=info is not None)


def check_pairs(src: FitSide, tgt: FitSide, paired: bool) -> None:
    """A paired fit needs as many source rows as target rows (known at request time, texts or vectors)."""
    if not paired or src.rows == tgt.rows:
        return
    what = {True: "rows", False: "texts"}  # a texts side's rows are known before it is embedded
    raise align.PairCountError(f"paired fit: {src.rows} source {what[src.X is not None]}, {tgt.rows} target "
                               f"{what[tgt.X is not None]}")


def embed_side(registry, load_encoder: Callable, side: FitSide, progress: Progress | None = None,
               block: int = 256) -> np.ndarray:
    """The side's rows (n, d): its vectors, or its texts embedded in blocks of ``block``; registers the
    space from the data when it is new."""
    X = side.X
    if X is None:
        enc, say = load_encoder(side.encoder), progress or silent
        parts = []
        for s in range(0, len(side.texts), block):
            say(f"encode {side.label}", s / len(side.texts))
            parts.append(np.asarray(enc.encode(side.texts[s : s + block], kind="passage"), dtype=np.float32))
        X = as_matrix(np.vstack(parts), name=f"{side.label} embeddings")
    if not side.known:
        try:
            registry.get_space(side.space)
        except NotFoundError:
            check_new_side(registry, side, X)  # a misspelt space is refused before it is registered
            registry.register_space(side.space, int(X.shape[1]), encoder=side.encoder)
    return X


def check_new_side(registry, side: FitSide, X: np.ndarray | None = None, references: Callable | None = None) -> None:
    """A side whose space is not registered (``side.known`` False) refused when its rows (``X``, default its
    vectors; none: nothing to check yet) say the name is a misspelling of a registered space's
    (:func:`service.space_names.check_new_space`); ``references()`` default the registry's of the rows' width."""
    X = side.X if X is None else X
    if side.known or X is None:
        return
    check_new_rows(registry, side.space, X, references, name=f"the {side.label} rows", option=f"{side.label}_space")


def check_new_rows(registry, space: str, X: np.ndarray, references: Callable | None = None, *, name: str,
                   option: str, add: str = "", by: str = "a fit") -> None:
    """Rows ``X`` (n, d) that would register ``space`` when it is new: :func:`service.space_names.check_new_space`
    over ``registry``'s spaces and ``references()`` (default the registry's of the rows' width); ``name``,
    ``option``, ``add``, ``by`` as there. A fit's side (:func:`check_new_side`) and ``embed --space``'s rows."""
    check_new_space(space, X, registry.list_spaces(), references or (lambda: space_references(registry, X.shape[1])),
                    name=name, option=option, add=add, by=by)


def _translation(services, model: str, target_space: str, map_ref):
    """The translation of ``model``'s vectors into ``target_space``. The model's space is the one of the spaces it
    produces (``services.spaces_for_encoder``: those named like the model, then the others) from which ``map_ref``,
    or else the registry's path, leads there: the target itself when the model produces it; else the only one of
    the first group that has a way there, ConflictError when several of that group do (their maps differ: the
    client names one with ``map``); the first error met (404, or 422 for a pinned map that leads elsewhere) when
    none does."""
    groups = services.spaces_for_encoder(model)
    if not any(groups):
        raise UnknownEncoderError(
            f"no registered space is produced by {model!r}; register it (POST /v1/spaces) to translate")
    if not map_ref and any(target_space in group for group in groups):
        return services.translation(target_space, target_space, None)
    first_error = None
    for group in groups:
        found = []
        for space in group:
            try:
                found.append((space, services.translation(space, target_space, map_ref)))
            except (NotFoundError, InputError) as exc:
                first_error = first_error or exc
        if len(found) > 1:
            raise ConflictError(f"{model!r} produces {len(found)} registered spaces with a path to "
                                f"{target_space!r} ({', '.join(s for s, _ in found)}); name the map to use (`map`)")
        if found:
            return found[0][1]
    raise first_error


#: the words of a refusal for the HTTP face's ``truncate``: (the refusing setting, the remedy)
HTTP_TRUNCATE = ("truncate false", "send truncate true")
#: and for ``vecbridge embed --no-truncate``
CLI_TRUNCATE = ("--no-truncate", "drop --no-truncate")


def count_cut(enc, texts: Sequence[str], *, truncate: bool = True, what: str = "input", one: bool = False,
              name: Callable[[int], str] | None = None, words: tuple[str, str] = HTTP_TRUNCATE) -> int:
    """How many of ``texts`` encoder ``enc`` embeds from their first ``enc.max_tokens`` tokens only, the rest unread
    (MiniLM 256, mpnet 384 word pieces; e5 reads every text whole: 0). ``truncate=False``: InputError naming the
    first such text (``what[i]``; ``what`` itself with ``one``: the caller sent one string, not a list; ``name(i)``
    when given: the CLI names a file's row), its tokens and the limit, with ``details`` for a machine, instead of
    cutting it; ``words``: the face's setting that refuses and its remedy (:data:`HTTP_TRUNCATE`,
    :data:`CLI_TRUNCATE`).
    The count of ``vecbridge embed`` and ``POST /v1/embeddings``: a text too short in UTF-8 bytes to pass the limit
    is not tokenized, a longer one only as far as decides it (:meth:`~service.encoders.Encoder.too_long`), so the
    count costs about 1% of encoding short texts and a fraction of the tokenizing a long text's encoding does."""
    cut = enc.too_long(texts, exact_first=not truncate)
    if cut and not truncate:
        i, n, exact = cut[0]
        size = f"{n} tokens long" if exact else f"at least {n} tokens long (counted no further)"
        where, many = (what, "") if one else (f"{what}[{i}]", f" ({len(cut)} of {len(texts)} texts are)")
        where = name(i) if name is not None else where
        exc = InputError(f"{where} is {size}, more than the {enc.max_tokens} {enc.name} reads{many}; with "
                         f"{words[0]} a text is refused, not cut: split it, or {words[1]} to embed its first "
                         f"{enc.max_tokens} tokens")
        exc.details = [{"loc": ["body", what] if one else ["body", what, i], "type": "too_many_tokens",
                        "msg": f"{'' if exact else 'at least '}{n} tokens, more than {enc.max_tokens}",
                        "ctx": {"tokens": n, "exact": exact, "max_tokens": enc.max_tokens, "too_long": len(cut)}}]
        raise exc
    return len(cut)


def embed(services, model: str, texts: list[str], *, kind: str = "passage", target_space: str | None = None,
          dimensions: int | None = None, map_ref: str | Sequence[str] | None = None, truncate: bool = True,
          one: bool = False):
    """Embed ``texts`` with encoder ``model``, optionally translated into ``target_space``.

    ``services``: the service's encoder and map caches (``encoder(name)``, ``spaces_for_encoder(name)``,
    ``translation(source_space, target_space, map_ref)``, as :class:`service.api.state.AppState` has them).
    ``map_ref``: the map, or path of maps in order, to use instead of the registry's path (a client sending one
    text set in several requests names the versions the first answer used); checked hop by hop as a search's
    (:func:`service.ops.indexes.translation`): one that does not lead from the model's space to ``target_space``
    is an InputError. The path is resolved before any encoding (an unknown space or missing path is a 404 at
    once). ``dimensions`` is accepted only when it equals the output width (these models do not truncate).
    ``truncate``, ``one`` (``texts`` is the one string sent): see :func:`count_cut` (checked before any encoding).
    Returns ``(X (n, d) float32, translation or None, texts cut, tokens)``; the translation's ``versions`` are the
    maps used; ``tokens``: :func:`tokens_read` of the texts.
    """
    if map_ref and not target_space:
        raise InputError("`map` names the path into `target_space`; give `target_space` too")
    tr = _translation(services, model, target_space, map_ref) if target_space else None
    enc = services.encoder(model)
    if dimensions is not None:  # checked before encoding: the output width is known from the path
        if target_space is None and dimensions != enc.dim:
            raise InputError(f"dimensions={dimensions} is not supported: {model} produces {enc.dim}-d "
                             f"vectors and cannot be truncated; omit `dimensions` or pass {enc.dim}")
        width = enc.dim if tr is None or tr.map is None else int(tr.map.target_dim)
        if target_space is not None and dimensions != width:
            raise InputError(f"dimensions={dimensions} is not supported: space {target_space!r} is "
                             f"{width}-d; omit `dimensions` or pass {width}")
    cut = count_cut(enc, texts, truncate=truncate, one=one)
    X = encode_texts(enc, texts, kind=kind)
    if tr is not None and tr.map is not None:
        X = tr.map.apply(X, output="raw", validate=False)
    return X, tr, cut, tokens_read(enc, texts, kind=kind)


def tokens_read(enc, texts: Sequence[str], *, kind: str = "passage") -> int:
    """The tokens (word pieces, specials included) encoder ``enc`` reads of ``texts`` as ``kind``: ``usage``'s
    ``prompt_tokens`` of ``POST /v1/embeddings``, as text-embeddings-inference counts them (the tokens embedded: a
    text cut at the model's limit counts that many, tokenized no further than its start). An encoder without a
    count (:meth:`~service.encoders.Encoder.tokens_read` None) is counted in whitespace-separated words."""
    read = getattr(enc, "tokens_read", None)
    counts = read(texts, kind) if read is not None else None
    return int(sum(counts)) if counts is not None else sum(len(t.split()) for t in texts)


def encode_texts(enc, texts: list[str], *, kind: str = "passage") -> np.ndarray:
    """``texts`` embedded by the loaded encoder ``enc`` as ``kind``: float32 (n, dim), the step :func:`embed`
    (``POST /v1/embeddings``) and :func:`embed_file` (``vecbridge embed``) share."""
    return np.asarray(enc.encode(texts, kind=kind), dtype=np.float32)


def embed_file(inp, out, *, encoder: str, kind: str = "passage", rows=None, text_field: str = "text",
               chunk_rows: int = 1024, progress: Progress | None = None,
               ready: Callable[[object], None] | None = None, truncate: bool = True,
               rows_check: Callable[[np.ndarray], None] | None = None) -> dict:
    """Embed the texts of file ``inp`` (.txt one per line, .jsonl ``text_field``, .json a list of strings; ``rows``
    ``"START:STOP"`` or row indices, in that order) with ``encoder`` as ``kind`` (``passage`` or ``query``: e5's
    prefixes) into ``out`` (.npy, .fvecs, .parquet: float32 unit rows, row i = the i-th text selected),
    ``chunk_rows`` texts at a time through :func:`encode_texts`, as ``POST /v1/embeddings`` encodes. The encoder is
    loaded and every selected text checked before anything is embedded; ``out`` appears complete or not at all.
    ``progress`` reports ``("embed", texts done / texts)``; ``ready(encoder)``, called once the encoder is loaded and
    the texts checked, before anything is embedded or written, may refuse by raising (``embed --space``'s registry
    check: a bad input leaves no registry made for nothing). Returns ``{"encoder", "kind", "rows", "dim", "out",
    "truncated", "max_tokens"}``: ``out`` absolute; ``truncated`` texts longer than the encoder's ``max_tokens``
    (None: it reads every text whole) were embedded from their start only. ``truncate=False`` (``--no-truncate``,
    HTTP's ``truncate: false``): such a text is refused (:func:`count_cut`, its file row named) before ``ready`` and
    before anything is embedded or written. ``rows_check(V)``: called with the first :data:`SPACE_SAMPLE_ROWS` rows
    (the rows a space check reads; all of them when fewer) once embedded, before any is written; it may refuse by
    raising (``embed --space``'s misspelt new space), and ``out`` is then not written."""
    from ..io import STREAM_SUFFIXES, TEXT_SUFFIXES, FormatError, check_not_input, is_text_path, read_texts
    from ..storage import check_writable
    from ..tables import MappedWriter

    check_not_input(out, "the output", inp)
    check_writable(out, "the output")
    if Path(out).suffix.lower() not in STREAM_SUFFIXES:  # before the encoder loads (seconds), as the writer says
        raise FormatError(f"{Path(out).name}: the output must be {', '.join(STREAM_SUFFIXES)}")
    if kind not in ("passage", "query"):
        raise InputError(f"kind must be 'passage' or 'query', got {kind!r}")
    if not is_text_path(inp):
        raise InputError(f"{Path(inp).name}: embed reads texts ({', '.join(TEXT_SUFFIXES)}); vectors are embedded "
                         f"already")
    # the one loader, looked up when called (a test replaces it): an unknown encoder (naming the known ones) or one
    # not installed is refused before any reading
    enc = encoders.get_encoder(encoder)
    texts = read_texts(inp, rows=rows, text_field=text_field)  # each checked: one without text is refused here
    if not texts:
        raise EmptyInputError(f"{Path(inp).name}: no texts to embed")
    if not truncate:
        count_cut(enc, texts, truncate=False, words=CLI_TRUNCATE,
                  name=lambda i: f"{Path(inp).name}: {_file_row(inp, rows, i, text_field)}")
    if ready is not None:
        ready(enc)
    say = progress or silent
    say("embed", 0.0)
    cut = 0
    held: list[np.ndarray] | None = None if rows_check is None else []  # chunks not written until rows_check passed
    with MappedWriter(inp, out, dim=enc.dim, n_rows=len(texts), batch_rows=chunk_rows) as w:
        for s in range(0, len(texts), chunk_rows):
            X = encode_texts(enc, texts[s : s + chunk_rows], kind=kind)
            if truncate:  # else every text was counted above, none over the limit
                cut += count_cut(enc, texts[s : s + chunk_rows])
            if held is not None:
                held.append(X)
                X = None
                if s + chunk_rows >= len(texts) or sum(map(len, held)) >= SPACE_SAMPLE_ROWS:
                    X, held = np.vstack(held), None
                    rows_check(X[:SPACE_SAMPLE_ROWS])
            if X is not None:
                w.write(X)
            say("embed", min(1.0, (s + chunk_rows) / len(texts)))
    return {"encoder": enc.name, "kind": kind, "rows": len(texts), "dim": enc.dim, "out": str(Path(out).resolve()),
            "truncated": cut, "max_tokens": enc.max_tokens}


def _file_row(inp, rows, i: int, text_field: str) -> str:
    """The row of text file ``inp`` (as ``--rows`` counts them) that the ``i``-th text ``rows`` selects is, named
    (a .txt's line too): a refusal names the file's row, not the text's place in the selection."""
    from ..io import count_rows, parse_rows, resolve_rows

    rows = parse_rows(rows)
    if isinstance(rows, np.ndarray):
        row = int(rows[i])
    elif rows is None or rows[0] is None or rows[0] >= 0:
        row = (0 if rows is None else rows[0] or 0) + i
    else:  # counted from the end: the file's rows counted (a refusal's cost only)
        row = resolve_rows(rows, count_rows(inp, text_field=text_field), inp).start + i
    return f"row {row}" + (f" (line {row + 1})" if Path(inp).suffix.lower() == ".txt" else "")
