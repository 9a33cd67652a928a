"""Texts read from ``.txt`` / ``.jsonl`` / ``.json`` files (:func:`service.io.read_texts` is the entry point).

Every selected text (``--rows``; the whole file without) is checked once, as the file is read and before anything
is embedded: one without text (:func:`service.encoders.has_text`: empty, whitespace, or only invisible characters)
is refused naming the file and where it is in it (a .txt or .jsonl line, a .json row). Texts outside the selection
are not (a corpus sharded by ``--rows`` failed for a text of another shard), nor texts read for a reader that keeps
invisible characters (an LM's tokenizer: ``check_text=False``). The check was the encoder's, per embedding batch:
"texts[24] is empty" for row 280 of a file (its index in a 256-text batch, counted from ``--rows``' start), raised
only once the batches before it were embedded.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .encoders import has_text
from .io import TEXT_SUFFIXES, FormatError, resolve_rows

__all__ = ["texts_of"]

_NO_TEXT = "holds no text (empty, whitespace, or only invisible characters such as NUL or U+200B)"


def texts_of(path: Path, text_field: str = "text", *, rows=None, check_text: bool = True) -> list[str]:
    """The texts ``rows`` (``(start, stop)``, :func:`~service.io.resolve_rows`; None: all) of file ``path`` (suffix
    .txt, .jsonl or .json); FormatError naming the file otherwise. ``check_text``: refuse a selected text without
    text (encoders embed all of those as one vector), named by its line or row in the file, not in the selection."""
    suf = path.suffix.lower()
    try:
        # utf-8-sig: a byte-order mark (Notepad, PowerShell) is no part of the first text; lines end at \n, \r\n or
        # \r only (read_text translates them): str.splitlines also split at U+2028, U+0085, \v, \f, \x1c-\x1e,
        # which a text (or a JSON string written with ensure_ascii=False) may hold: one line became several texts
        if suf == ".txt":
            texts = path.read_text(encoding="utf-8-sig").split("\n")
            while texts and not texts[-1].strip():  # the file's last newline (and blank lines after the last text)
                texts.pop()
            # a blank line inside was skipped without a word: every later text paired with the row before its own
            blank = next((i for i, t in enumerate(texts) if not t.strip()), None)
            if blank is not None:
                raise FormatError(f"{path.name}: line {blank + 1} is blank; a .txt file holds one text per line, "
                                  f"row i = line i + 1 (remove the line, or write .jsonl)")
            where = lambda i: f"line {i + 1}"
        elif suf == ".jsonl":
            texts, lines = [], []  # the file's line of each text (blank lines are skipped)
            for i, ln in enumerate(path.read_text(encoding="utf-8-sig").split("\n")):
                if not ln.strip():
                    continue
                try:
                    obj = json.loads(ln)
                except json.JSONDecodeError as exc:  # its own "line 1 column 5" named no line of the file
                    raise FormatError(f"{path.name}: line {i + 1} is not JSON ({exc.msg} at column {exc.colno})"
                                      ) from None
                if isinstance(obj, str):
                    texts.append(obj)
                elif isinstance(obj, dict) and isinstance(obj.get(text_field), str):
                    texts.append(obj[text_field])
                else:
                    raise FormatError(f"{path.name}: line {i + 1} has no string field {text_field!r}")
                lines.append(i + 1)
            where = lambda i: f"line {lines[i]} (row {i})"
        elif suf == ".json":
            texts = json.loads(path.read_text(encoding="utf-8-sig"))
            if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
                raise FormatError(f"{path.name}: expected a JSON list of strings")
            where = lambda i: f"row {i}"  # item i of the list
        else:
            raise FormatError(f"{path.name}: not a text file ({', '.join(TEXT_SUFFIXES)})")
        for i, t in enumerate(texts):  # JSON's "\ud800" decodes to a lone surrogate, which no encoder can take
            t.encode("utf-8")
    except UnicodeEncodeError:
        raise FormatError(f"{path.name}: text {i} holds a lone surrogate (an escape like \\ud800 with no pair): "
                          f"not a character; fix the file") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:  # RecursionError: nested too deep
        raise FormatError(f"{path.name}: cannot parse ({exc})") from None
    sl = resolve_rows(rows, len(texts), path)
    # every text without text embeds as the same vector
    picked = sl.tolist() if isinstance(sl, np.ndarray) else range(sl.start, sl.stop)  # listed rows, or a range
    bad = next((i for i in picked if not has_text(texts[i])), None) if check_text else None
    if bad is not None:
        raise FormatError(f"{path.name}: {where(bad)} {_NO_TEXT}; every text must have text")
    return [texts[i] for i in picked] if isinstance(sl, np.ndarray) else texts[sl]
