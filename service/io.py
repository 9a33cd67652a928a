"""Reading and writing vector files; text inputs are embedded with a named encoder.

Formats (by suffix):

==============  ===============================================================================
``.npy``        one 2-D array; read through a memory map, so ``rows`` slices cost only those rows
``.npz``        ``key``, else the first array (an archive of several arrays of rows: refused, name one)
``.fvecs``      FAISS/TEXMEX: each row is ``int32 d`` then ``d`` float32; memory-mapped
``.parquet``    one list column (``column``, else the first list of floats, else of numbers), one row per vector
``.txt``        one text per line (a blank line is refused)      → embedded with ``encoder``
``.jsonl``      one JSON object per line, text in ``text_field``  → embedded with ``encoder``
``.json``       a list of strings                                → embedded with ``encoder``
==============  ===============================================================================

A text without text (empty, whitespace, only invisible characters) is refused as the file is read, naming its line
(.txt, .jsonl) or row (.json): :mod:`service.texts`. Every reader returns C-contiguous float32 ``(n, d)``.
Streaming: :func:`iter_chunks` yields blocks of rows and :class:`ChunkWriter` (:mod:`service.io_write`, re-exported
here with :func:`write_vectors`) writes ``.npy`` (preallocated), ``.fvecs`` or ``.parquet`` block by block, so
``vecbridge transform`` never holds a whole file.
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from align.exceptions import InputError

from .io_write import STREAM_SUFFIXES, ChunkWriter, remove_unfinished, write_vectors  # re-exported

__all__ = [
    "FormatError", "check_file", "check_not_input", "load_npy", "parse_rows", "resolve_rows", "rows_count",
    "read_vectors", "read_texts", "count_rows", "iter_chunks", "ChunkWriter",
    "write_vectors", "is_text_path", "sha256_array", "npy_header", "VECTOR_SUFFIXES", "STREAM_SUFFIXES",
    "TEXT_SUFFIXES",
]

VECTOR_SUFFIXES = (".npy", ".npz", ".fvecs", ".parquet")
TEXT_SUFFIXES = (".txt", ".jsonl", ".json")


class FormatError(InputError):
    """The file is missing, of an unsupported format, or malformed."""


def sha256_array(X: np.ndarray) -> str:
    """sha256 of the C-contiguous float32 bytes of ``X`` (content hash used in lineage)."""
    import hashlib

    h = hashlib.sha256()
    X = np.asarray(X)
    for s in range(0, max(X.shape[0], 1), 65536):
        h.update(np.ascontiguousarray(X[s : s + 65536], dtype=np.float32).tobytes())
    return h.hexdigest()


def parse_rows(spec: str | None) -> tuple[int | None, int | None] | None:
    """``"START:STOP"`` (either side may be empty; negatives count from the end) → ``(start, stop)``; row indices
    (a 1-d integer array, ``--rows rows.npy`` as the CLI reads it) or a parsed pair are returned as they are."""
    if isinstance(spec, (np.ndarray, tuple)):
        return spec
    if spec is None or spec == "":
        return None
    parts = str(spec).split(":")
    if len(parts) != 2:
        raise InputError(f"rows must look like START:STOP, got {spec!r}")
    try:
        start, stop = (int(p) if p.strip() else None for p in parts)
    except ValueError:
        raise InputError(f"rows must look like START:STOP with integers, got {spec!r}") from None
    return start, stop


def resolve_rows(rows, n: int, path, *, what: str | None = None) -> slice:
    """The slice of ``(start, stop)`` (None ends, negatives from the end) in ``n`` rows; InputError when empty. Row
    indices (1-d ints) come back as they are once checked; ``what`` (``--keep-rows``): the option an error blames."""
    name, src = Path(path).name, getattr(rows, "source", None)
    if rows is None:
        return slice(0, n)
    if isinstance(rows, np.ndarray):
        if rows.size and (rows.min() < 0 or rows.max() >= n):
            bad = int(rows.max() if rows.max() >= n else rows.min())
            if what is not None:
                raise InputError(f"{what}{f' ({Path(src).name})' if src else ''} lists row index {bad}, outside the "
                                 f"{n} rows of {name} (the file it takes rows of)")
            listed = f" (listed in {Path(src).name})" if src else ""
            raise InputError(f"{name}: row index {bad} is outside the file's {n} rows{listed}")
        return rows
    start, stop = rows
    start = 0 if start is None else (start + n if start < 0 else start)
    stop = n if stop is None else (stop + n if stop < 0 else stop)
    if not (0 <= start < stop <= n):
        spec = f"{rows[0] if rows[0] is not None else ''}:{rows[1] if rows[1] is not None else ''}"
        if what is not None:
            raise InputError(f"{what} {spec} is outside the {n} rows of {name} (the file it takes rows of) or empty")
        raise InputError(f"{name}: rows {spec} are outside the file's {n} rows or empty")
    return slice(start, stop)


def rows_count(sel) -> int:
    """How many rows :func:`resolve_rows`'s answer (a slice, or row indices) selects."""
    return int(sel.size) if isinstance(sel, np.ndarray) else sel.stop - sel.start


def check_file(path: Path) -> None:
    """FormatError unless ``path`` is an existing regular file (never blocks on a FIFO or device)."""
    if not path.exists():
        raise FormatError(f"no such file: {path}")
    if path.is_dir():
        raise FormatError(f"{path} is a directory, not a file")
    if not path.is_file():  # a FIFO, socket or device would block or never end: refuse, do not hang
        raise FormatError(f"{path} is not a regular file (FIFO, socket or device); give a file on disk")


def check_not_input(out, what: str, *inputs) -> None:
    """InputError when writing ``out`` (a new file renamed over its name) would replace one of ``inputs`` (paths,
    None skipped): the same name, or the file an input names through a symbolic link. An output is written whole
    before it replaces its name, so a typo'd or in-place output path replaced the input file with the result (a
    corpus with a plan's row list, a source file with a fit's HTML report)."""
    dest = Path(os.path.realpath(Path(out).parent)) / Path(out).name
    for inp in inputs:
        if inp is None:
            continue
        p = Path(inp)
        if dest in (Path(os.path.realpath(p.parent)) / p.name, Path(os.path.realpath(p))):
            raise InputError(f"{what} {out} is the input file {inp}: writing it would replace the input; "
                             f"name another file")


def is_text_path(path) -> bool:
    return Path(path).suffix.lower() in TEXT_SUFFIXES


# --- raw matrices (lazy where possible) --------------------------------------------------------

def load_npy(path: Path, mmap_mode: str = "r") -> np.ndarray:
    """A memory map of a ``.npy`` (read-only; ``"c"``: copy-on-write, writes stay private to this process);
    FormatError for a truncated file, an object dtype or a bad header."""
    try:
        with open(path, "rb") as fh:
            magic = fh.read(6)
    except OSError as exc:
        raise FormatError(f"{path.name}: cannot read .npy ({exc})") from None
    if magic != b"\x93NUMPY":  # numpy took any other bytes for a pickle and advised loading it "unsafely"
        raise FormatError(f"{path.name}: not a .npy file (no NumPy header); save arrays with numpy.save")
    try:
        return np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
    except (ValueError, OSError, EOFError, SyntaxError, OverflowError) as exc:  # header, size, dtype
        if "pickle" in str(exc) or "Python objects" in str(exc):
            raise FormatError(f"{path.name}: holds Python objects; vecbridge reads arrays of numbers only (and never "
                              "unpickles a file)") from None
        raise FormatError(f"{path.name}: cannot read .npy ({exc})") from None


def fvecs_matrix(path: Path, *, check_rows: bool = True) -> np.ndarray:
    size = path.stat().st_size
    if size < 4 or size % 4:
        raise FormatError(f"{path.name}: empty or truncated .fvecs file ({size} bytes, not a multiple of 4)")
    raw = np.memmap(path, dtype="<i4", mode="r")
    d = int(raw[0])
    if d <= 0 or size % (4 * (d + 1)):
        raise FormatError(f"{path.name}: not a valid .fvecs file (first row says d={d}, size {size} bytes)")
    mat = raw.reshape(-1, d + 1)
    if check_rows and not (mat[:, 0] == d).all():  # a pass over the whole file: once per read, not per chunk
        raise FormatError(f"{path.name}: rows of different dimensions in .fvecs")
    return mat.view("<f4")[:, 1:]


def npy_header(fh) -> tuple:
    """``(shape, dtype)`` the ``.npy`` header at ``fh``'s position claims (``fh`` left after it), nothing decoded."""
    from numpy.lib import format as npf

    major, _ = npf.read_magic(fh)
    shape, _, dtype = (npf.read_array_header_1_0 if major == 1 else npf.read_array_header_2_0)(fh)
    return shape, dtype


def npz_array(path: Path, key: str | None, key_option: str | None = "--key") -> np.ndarray:
    """One array of a ``.npz``: ``key``, else the first, unless the archive holds more than one array of rows (2-D):
    which is meant is then not guessed (``np.savez('pairs.npz', minilm=M, e5=E)`` given as both the source and the
    target of a fit took ``minilm`` for both, registered as minilm -> e5); the error names the arrays and
    ``key_option``, the option that names one (None: the input has none). Headers are checked against the member's
    size before anything is decoded, so a corrupt archive, an object dtype or a shape larger than the data is a
    FormatError, never an allocation."""
    import zipfile
    import zlib

    def header(zf, name: str) -> tuple:
        with zf.open(zf.getinfo(name + ".npy")) as fh:
            return npy_header(fh)

    try:
        with zipfile.ZipFile(path) as zf:
            files = [n[:-4] for n in zf.namelist() if n.endswith(".npy")]
            if not files:
                raise FormatError(f"{path.name}: the .npz holds no arrays")
            if key is None and len(files) > 1 and len(rows := [f for f in files if len(header(zf, f)[0]) == 2]) > 1:
                raise FormatError(f"{path.name}: the .npz holds {len(rows)} arrays of rows ({', '.join(rows)}): "
                                  + (f"name the one to read with {key_option}" if key_option else
                                     "this input reads one array; save the one meant on its own (numpy.save, a .npy)"))
            key = files[0] if key is None else key
            if key not in files:
                raise FormatError(f"{path.name}: no array {key!r} (has {', '.join(files)})")
            shape, dtype = header(zf, key)
            size = zf.getinfo(key + ".npy").file_size
            if dtype.hasobject:
                raise FormatError(f"{path.name}: array {key!r} holds Python objects; need numbers")
            if len(shape) != 2:  # ids saved before the vectors: "expected a 2-D array" named neither array nor --key
                raise FormatError(f"{path.name}: array {key!r} has shape {shape}, not (n_rows, dim) vectors; "
                                  + (f"name the array of vectors with {key_option}" if key_option else
                                     "save the array of vectors on its own (numpy.save, a .npy)")
                                  + f" (arrays: {', '.join(files)})")
            need = int(np.prod(shape, dtype=object)) * dtype.itemsize
            if need > size:
                raise FormatError(f"{path.name}: array {key!r} claims shape {shape} ({need} bytes) "
                                  f"but holds {size} bytes (truncated or corrupt)")
        with np.load(path, allow_pickle=False) as z:
            return z[key]
    except FormatError:
        raise
    except (ValueError, OSError, EOFError, KeyError, SyntaxError, zipfile.BadZipFile, zlib.error) as exc:
        raise FormatError(f"{path.name}: cannot read .npz ({type(exc).__name__}: {exc})") from None


def parquet_file(path: Path, column: str | None):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:  # no pre-buffering: it read every row group of an iteration ahead (the whole file held in Arrow's pool)
        f = pq.ParquetFile(path, pre_buffer=False)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types
        raise FormatError(f"{path.name}: cannot read parquet ({exc})") from None
    schema = f.schema_arrow
    if column is None:  # the first list of floats, else of numbers: a list<string> (tags, say) is skipped
        lists = [fld.name for fld in schema if (pa.types.is_list(fld.type) or pa.types.is_large_list(fld.type)
                                                or pa.types.is_fixed_size_list(fld.type))
                 and (pa.types.is_floating(fld.type.value_type) or pa.types.is_integer(fld.type.value_type))]
        if not lists:
            raise FormatError(f"{path.name}: no list column of vectors (columns: "
                              f"{', '.join(f'{fld.name} {fld.type}' for fld in schema)})")
        floats = [n for n in lists if pa.types.is_floating(schema.field(n).type.value_type)]
        column = (floats or lists)[0]  # a token_ids list<int64> before the embeddings was taken for the vectors
    if column not in schema.names:
        raise FormatError(f"{path.name}: no column {column!r} (columns: {', '.join(schema.names)})")
    return f, column


@contextmanager
def arrow_errors(path: Path):
    """Turn pyarrow's decode errors (a corrupt page, a truncated file) into FormatError."""
    import pyarrow as pa

    try:
        yield
    except (pa.ArrowException, OSError) as exc:
        raise FormatError(f"{path.name}: cannot read parquet ({exc})") from None


def _n_rows(M: np.ndarray, path: Path) -> int:
    """Rows of an array read from ``path``; a 0-d array (no rows at all) raises as_matrix's ShapeError."""
    if M.ndim == 0:
        from align.validation import as_matrix

        as_matrix(M, name=path.name)
    return int(M.shape[0])


def _suffix(path: Path, key: str | None = None, column: str | None = None) -> str:
    """``path``'s suffix once it is a file to read; a ``key`` / ``column`` its format has no use for is refused (it
    was ignored without a word: ``transform x.npy o.npy --key foo`` read x.npy)."""
    check_file(path)
    suf = path.suffix.lower()
    for opt, value, fmt in (("--key", key, ".npz"), ("--column", column, ".parquet")):
        if value is not None and suf != fmt:
            raise InputError(f"{path.name} is not a {fmt} file; {opt} applies to {fmt} files only")
    return suf


def count_rows(path, *, key: str | None = None, column: str | None = None, text_field: str = "text",
               key_option: str | None = "--key") -> int:
    """Number of rows (vectors, or texts) in a file without loading its data; ``key_option``: as
    :func:`read_vectors`'s."""
    path = Path(path)
    suf = _suffix(path, key, column)
    if suf == ".npy":
        return _n_rows(load_npy(path), path)
    if suf == ".fvecs":
        return int(fvecs_matrix(path).shape[0])
    if suf == ".npz":
        return _n_rows(npz_array(path, key, key_option), path)
    if suf == ".parquet":
        return int(parquet_file(path, column)[0].metadata.num_rows)
    if suf in TEXT_SUFFIXES:
        return len(read_texts(path, text_field=text_field, check_text=False))  # counted, not read: not checked
    raise FormatError(f"{path.name}: unsupported format {suf or '(none)'}; use {', '.join(VECTOR_SUFFIXES + TEXT_SUFFIXES)}")


def read_texts(path, *, rows=None, text_field: str = "text", check_text: bool = True) -> list[str]:
    """Texts ``rows`` from ``.txt`` (one per line), ``.jsonl`` (``text_field``) or ``.json`` (list of strings); each
    checked as it is read, before any is embedded (:func:`service.texts.texts_of`; ``check_text=False``: a reader
    that keeps invisible characters, an LM's tokenizer, is given texts of only those too)."""
    from .texts import texts_of  # it reads FormatError from here

    path = Path(path)
    check_file(path)
    return texts_of(path, text_field, rows=parse_rows(rows) if isinstance(rows, str) else rows, check_text=check_text)


def read_vectors(path, *, rows=None, key: str | None = None, column: str | None = None,
                 encoder: str | None = None, kind: str = "passage", text_field: str = "text",
                 batch_size: int = 64, progress: Callable[[float], None] | None = None,
                 encoder_option: str | None = "--encoder", finite: bool = True,
                 key_option: str | None = "--key") -> np.ndarray:
    """Read rows ``[start, stop)`` of a vector file, or embed a text file with ``encoder``.

    Returns float32 ``(n, d)``, C-contiguous and writable by the caller. Raises FormatError / InputError on bad
    input. Rows of a float32 ``.npy`` are not copied: they are mapped copy-on-write (pages come from the page
    cache as they are read; a write changes this process's copy, never the file), so reading 1M x 384 rows
    costs no 1.5 GB of private memory (the file must not be truncated while the rows are in use).
    ``encoder_option``: the option that names the encoder of a text file (None: the input takes vectors only).
    ``finite=False``: rows of a vector file with NaN / Inf are left for the caller to refuse (a keep set names them).
    ``key_option``: the option that names a ``.npz``'s array (None: the input has none), named by the error of an
    archive of several arrays of rows read without ``key``.
    """
    from align.validation import as_matrix

    path = Path(path)
    suf = _suffix(path, key, column)
    if isinstance(rows, str):
        rows = parse_rows(rows)
    if suf in TEXT_SUFFIXES:
        _need_encoder(path, encoder, encoder_option)
        return _embed(path, read_texts(path, rows=rows, text_field=text_field), encoder, kind, batch_size, progress)
    if encoder:
        raise InputError(f"{path.name} already holds vectors; --encoder applies to text files only")
    if suf == ".npy":
        M = load_npy(path, mmap_mode="c")
    elif suf == ".npz":
        M = npz_array(path, key, key_option)
    elif suf == ".fvecs":
        M = fvecs_matrix(path)
    elif suf == ".parquet":
        f, col = parquet_file(path, column)
        n = f.metadata.num_rows
        sl = resolve_rows(rows, n, path)
        from .arrow_lists import arrow_lists_to_matrix

        with arrow_errors(path):
            table = f.read(columns=[col])
            table = table.take(sl) if isinstance(sl, np.ndarray) else table.slice(sl.start, sl.stop - sl.start)
        return as_matrix(arrow_lists_to_matrix(table.column(col), path, sl if isinstance(sl, np.ndarray) else sl.start),
                         name=path.name, finite=finite, rows_at=sl if isinstance(sl, np.ndarray) else sl.start)
    else:
        raise FormatError(f"{path.name}: unsupported format {suf or '(none)'}; "
                          f"use {', '.join(VECTOR_SUFFIXES + TEXT_SUFFIXES)}")
    return select_rows(M, resolve_rows(rows, M.shape[0], path) if M.ndim == 2 else None, path, finite=finite)


def _need_encoder(path: Path, encoder: str | None, option: str | None = "--encoder") -> None:
    """InputError for a text file with no encoder, naming the ``option`` that gives one (None: the input takes
    vectors only). It said "name an encoder to embed them", and a newcomer looked for how."""
    if encoder:
        return
    if option is None:
        raise InputError(f"{path.name} holds texts; this input takes vectors ({', '.join(VECTOR_SUFFIXES)})")
    raise InputError(f"{path.name} holds texts: give {option} to embed them (e.g. {option} all-MiniLM-L6-v2)")


def _embed(path: Path, texts: list[str], encoder: str, kind: str, batch_size: int = 64,
           progress: Callable[[float], None] | None = None) -> np.ndarray:
    """``texts`` (read from ``path``) embedded with ``encoder``: checked float32 ``(n, dim)``."""
    from align.validation import as_matrix

    from .encoders import get_encoder

    enc = get_encoder(encoder)
    parts = []
    for s in range(0, len(texts), batch_size * 4):
        parts.append(enc.encode(texts[s : s + batch_size * 4], kind=kind, batch_size=batch_size))
        if progress:
            progress(min(1.0, (s + batch_size * 4) / len(texts)))
    X = np.vstack(parts) if parts else np.zeros((0, enc.dim), np.float32)
    return as_matrix(X, name=path.name)


def select_rows(M: np.ndarray, sl: slice | None, path: Path, *, finite: bool = True) -> np.ndarray:
    """Rows ``sl`` of a matrix ``M`` read from ``path`` as checked float32 (n, d); ``sl`` None: ``M`` is not 2-D.

    Any dtype but real numbers (``as_matrix``'s; booleans too) raises there, before a row is selected. A bool file
    took that branch too and came back whole: ``--rows`` ignored, and each streamed chunk the whole file again."""
    from align.validation import as_matrix

    if sl is None or M.dtype.kind not in "biuf":
        return as_matrix(M, name=path.name, finite=finite)  # raises the ShapeError / InputError (non-numeric, complex)
    part = M[sl]
    if isinstance(M, np.memmap) and M.mode != "c":  # a read-only map (.fvecs): a private, writable copy
        part = np.array(part, dtype=np.float32)
    # float32 rows stay as they are (mapped, or from .npz); NaN / overflow named by the file's row numbers
    return as_matrix(part, name=path.name, finite=finite, rows_at=(sl.start or 0) if isinstance(sl, slice) else sl)


def iter_chunks(path, *, chunk_rows: int = 65536, rows=None, key: str | None = None, column: str | None = None,
                encoder: str | None = None, kind: str = "passage", text_field: str = "text",
                encoder_option: str | None = "--encoder", key_option: str | None = "--key") -> Iterator[np.ndarray]:
    """Yield float32 blocks of at most ``chunk_rows`` rows; only one block is held at a time. ``encoder_option``: the
    option that names the encoder of a text file (None: the input takes vectors only), for the error without one;
    ``key_option`` as :func:`read_vectors`'s."""
    path = Path(path)
    suf = _suffix(path, key, column)
    if isinstance(rows, str):
        rows = parse_rows(rows)
    if chunk_rows < 1:
        raise InputError("chunk_rows must be >= 1")
    if isinstance(rows, np.ndarray) and suf in VECTOR_SUFFIXES and not encoder:  # the file read once, not per chunk
        from .listed_rows import listed_chunks

        yield from listed_chunks(path, rows, chunk_rows, suf, key=key, column=column, key_option=key_option)
        return
    if suf == ".parquet" and not encoder:
        from align.validation import as_matrix

        from .arrow_lists import arrow_lists_to_matrix

        f, col = parquet_file(path, column)
        sl = resolve_rows(rows, f.metadata.num_rows, path)
        pos = 0
        with arrow_errors(path):
            # capped at the rows read: pyarrow takes a C long (--chunk-rows 99999999999999999999 was an OverflowError)
            for batch in f.iter_batches(batch_size=max(1, min(chunk_rows, sl.stop)), columns=[col]):
                lo, hi = max(sl.start, pos), min(sl.stop, pos + batch.num_rows)
                if lo < hi:  # checked as every other reader's rows (NaN, float32 overflow: named by file)
                    yield as_matrix(arrow_lists_to_matrix(batch.column(0).slice(lo - pos, hi - lo), path, lo),
                                    name=path.name, rows_at=lo)
                pos += batch.num_rows
                if pos >= sl.stop:
                    break
        return
    if suf in (".npy", ".fvecs") and not encoder:  # checked once (a .fvecs was re-read whole per chunk); each
        # chunk maps the file afresh, so the pages read are let go with it (one map held them all: RSS = file size)
        M = load_npy(path, mmap_mode="c") if suf == ".npy" else fvecs_matrix(path)
        if M.ndim != 2:
            select_rows(M, None, path)  # raises the ShapeError for a 0-d / 1-d / 3-d array
        sl = resolve_rows(rows, M.shape[0], path)
        del M
        for s in range(sl.start, sl.stop, chunk_rows):
            M = load_npy(path, mmap_mode="c") if suf == ".npy" else fvecs_matrix(path, check_rows=False)
            yield select_rows(M, slice(s, min(s + chunk_rows, sl.stop)), path)
            del M
        return
    if suf in TEXT_SUFFIXES:  # read and parsed once (each chunk read the whole file again: time ~ size squared)
        _need_encoder(path, encoder, encoder_option)
        texts = read_texts(path, rows=rows, text_field=text_field)
        for s in range(0, len(texts), chunk_rows):
            yield _embed(path, texts[s : s + chunk_rows], encoder, kind)
        return
    X = read_vectors(path, rows=rows, key=key, column=column, encoder=encoder, key_option=key_option)  # .npz: whole
    for s in range(0, X.shape[0], chunk_rows):
        yield X[s : s + chunk_rows]


def json_finite(obj):
    """``obj`` with every NaN or infinite float replaced by None: JSON has no such numbers (``json.dumps`` writes
    bare ``NaN``, which strict parsers and ``jq`` reject); dicts, lists and tuples walked."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_finite(v) for v in obj]
    return obj
