"""Vector wire formats: JSON lists, base64 float32, raw ``application/octet-stream``, ``.npy``.

Reading
-------
``application/json`` body, one of
    ``"vectors": [[...], ...]``                       (n, d) numbers
    ``"vectors_b64": "...", "dim": d``                little-endian float32, row-major, base64
``application/octet-stream`` body
    raw little-endian float32, row-major; ``d`` from the ``dim`` query parameter or the
    ``X-Vector-Dim`` header, else the route's own default (transform: the map's source dimension)
    (rows = bytes / 4d)
``application/x-npy`` (or ``application/npy``) body
    a ``.npy`` file, float16/32/64, 2-D; read with ``allow_pickle=False``

Every path ends in :func:`align.validation.as_matrix` (dtype, finiteness, shape, ``dim``),
so errors are the same typed errors whatever the format, and the batch limit
(``Settings.max_batch`` rows) raises :class:`PayloadTooLargeError` (413).
"""

from __future__ import annotations

import binascii
import io
import re
from typing import Any

import numpy as np
import pybase64

from align.validation import as_matrix
from align.exceptions import DimensionMismatchError, EmptyInputError, InputError, ShapeError

from ..limits import JSON_INT_RANGE, MAX_DIM, MAX_JSON_DEPTH, check_json_depth, json_type
from ..errors import PayloadTooLargeError, UnsupportedMediaTypeError
from ..io import npy_header
from .number_types import whole_int
from .responses import loads

__all__ = [
    "JSON", "OCTET", "NPY", "media_type", "prefers_json", "require_json", "parse_json", "vectors_from_json",
    "body_dim", "may_hold_bools",
    "vectors_from_binary",
    "b64_encode", "npy_bytes", "check_batch", "texts_instead", "validate", "validation_error", "check_query",
]

JSON = "application/json"
OCTET = "application/octet-stream"
NPY = "application/x-npy"
_NPY_TYPES = ("application/x-npy", "application/npy", "application/vnd.numpy")


def media_type(content_type: str | None) -> str:
    """Normalised media type of a ``Content-Type`` header (default JSON)."""
    mt = (content_type or JSON).split(";")[0].strip().lower()
    if mt in _NPY_TYPES:
        return NPY
    if mt in (JSON, OCTET):
        return mt
    raise UnsupportedMediaTypeError(
        f"Content-Type {mt!r} is not supported; use application/json, application/octet-stream or application/x-npy")


_QVALUE = re.compile(r"(?:0(?:\.[0-9]{0,3})?|1(?:\.0{0,3})?)")


def _ranges(accept: str):
    """``(type, subtype, q)`` of each media range of an ``Accept`` header (RFC 9110 12.5.1), lower case; a range
    with a malformed ``q`` or no ``/`` is left out (as if not sent)."""
    for item in accept.split(","):
        mt, *params = item.split(";")
        typ, slash, sub = mt.strip().lower().partition("/")
        q = 1.0
        for p in params:
            key, _, value = p.partition("=")
            if key.strip().lower() == "q":
                value = value.strip()
                q = float(value) if _QVALUE.fullmatch(value) else -1.0
                break  # what follows q are accept-ext parameters
        if slash and typ and sub and q >= 0:
            yield typ, sub.strip(), q


def _quality(ranges: list, names: tuple[str, ...]) -> float:
    """The q the most specific range matching one of ``names`` gives it (``type/sub`` over ``type/*`` over
    ``*/*``); 0 when none does."""
    best, q = -1, 0.0
    for typ, sub, rq in ranges:
        for name in names:
            t, s = name.split("/")
            rank = 2 if (typ, sub) == (t, s) else 1 if (typ, sub) == (t, "*") else 0 if typ == sub == "*" else -1
            if rank > best:
                best, q = rank, rq
    return q


def prefers_json(accept: str | None, binary: str) -> bool:
    """Whether a binary (``binary``: :data:`OCTET` or :data:`NPY`) request's ``Accept`` ranks JSON above its own
    type, by the q-values of RFC 9110 12.5.1: ``application/octet-stream, application/json;q=0.5`` and
    ``application/json;q=0`` answer binary (a substring test answered JSON), ``application/json`` and
    ``application/json, */*;q=0.1`` JSON. A tie (``*/*``, both listed at one q), no header, or a header that
    accepts neither (``text/html``: as before, no 406) answers the request's own binary type."""
    if not accept:
        return False
    ranges = list(_ranges(accept))
    names = _NPY_TYPES if binary == NPY else (binary,)
    return _quality(ranges, (JSON,)) > _quality(ranges, names)


def require_json(content_type: str | None) -> None:
    """Refuse (415) a body that is not ``application/json`` (a missing header counts as JSON).

    The one check shared by every route that reads a JSON body itself (transform reads binary
    bodies too and uses :func:`media_type`).
    """
    mt = (content_type or JSON).split(";")[0].strip().lower()
    if mt != JSON:
        raise UnsupportedMediaTypeError(f"Content-Type {mt!r} is not supported here; send application/json")


def parse_json(body: bytes, *, untyped: bool = False, reads_binary: bool = False) -> dict:
    """The JSON object of ``body``; ``untyped``: the request sent no ``Content-Type`` to a route that reads binary
    bodies too (the transform), and the message of a body that is not JSON says JSON was assumed (raw float32 sent
    without the header read "str is not valid UTF-8: surrogates not allowed", no word of the header).
    ``reads_binary``: the route reads binary bodies too, and a body sent as JSON that does not start like JSON is
    told the binary type (it read "str is not valid UTF-8" alone)."""
    try:
        obj = loads(body) if body else {}
    except Exception as exc:
        if untyped:
            raise InputError(f"body is not valid JSON ({exc}): without a Content-Type the body is read as JSON; "
                             f"send binary vectors with Content-Type: {OCTET} (raw float32) or {NPY}") from None
        if reads_binary and not _looks_like_json(body) and not body.startswith(_BOMS):
            raise InputError(f"body is not valid JSON: {exc}; for raw float32 rows send Content-Type: {OCTET} "
                             "with ?dim=N") from None
        raise InputError(f"body is not valid JSON: {_not_utf8(body) or exc}") from None
    if not isinstance(obj, dict):
        raise InputError(f"body must be a JSON object, got {json_type(obj)}")
    if _check_depth(obj):
        _check_int_range(body)
    if _key_ends(body) != _keys(obj):  # a key given twice (or the count cannot tell): parsed again to name it
        _refuse_repeated_keys(body)
    return obj


_BOMS = (b"\xff\xfe", b"\xfe\xff", b"\xef\xbb\xbf")  # byte order marks: UTF-16 LE, BE, UTF-8


def _not_utf8(body: bytes) -> str | None:
    """Why ``body`` is not UTF-8 JSON text, where that is why it could not be parsed (orjson said "str is not valid
    UTF-8: surrogates not allowed" of a UTF-16 body, no word of the encoding); None when it is UTF-8."""
    head, start = body[:2], b"{[ \t\r\n"
    if head in _BOMS[:2] or (len(head) == 2 and (head[1] == 0 and head[0] in start
                                                                     or head[0] == 0 and head[1] in start)):
        return "the body must be UTF-8 JSON (RFC 8259), and this one looks like UTF-16: encode it as UTF-8"
    if body.startswith(b"\xef\xbb\xbf"):
        return "the body starts with a byte order mark (EF BB BF), which JSON does not allow: send UTF-8 without it"
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"the body must be UTF-8 JSON, and byte {exc.start} (0x{body[exc.start]:02x}) is not UTF-8"
    return None


#: the end of an object key: its closing quote, then the colon (JSON's white space between); inside a string such a
#: quote is escaped (``\"``) and may follow, so the matches are never fewer than the keys
_KEY_END = re.compile(rb'"[ \t\n\r]*:')


def _vector_stretches(body: bytes):
    """``(key, start, stop)`` of each ``"vectors"`` key of ``body``: where its text starts, where its value starts
    (past the colon) and the next quote (or the end). From its key to the next quote there is no string and so no
    key; that stretch is found by ``bytes.find`` (a memchr, ~3 % of orjson's parse of 150 MB of numbers, where
    :data:`_KEY_END`'s scan took ~15 %)."""
    at, end = 0, len(body)
    while at < end:
        v = body.find(b'"vectors"', at)
        if v < 0:
            return
        key = _KEY_END.match(body, v + 8)
        if key is None:  # the word as a string value: go on past it
            at = v + 8
            continue
        nxt = body.find(b'"', key.end())
        at = end if nxt < 0 else nxt
        yield v, key.end(), at


def _key_ends(body: bytes) -> int:
    """The matches of :data:`_KEY_END` in ``body``, without looking inside a ``vectors`` value
    (:func:`_vector_stretches`)."""
    count, at = 0, 0
    for v, _, stop in _vector_stretches(body):
        count += len(_KEY_END.findall(body, at, v + 8)) + 1
        at = stop
    return count + len(_KEY_END.findall(body, at))


_WS = re.compile(rb"[ \t\n\r]*")


def _without_vectors(body: bytes) -> bytes:
    """``body`` with the value of each ``vectors`` key written ``0``: the same objects with the same keys, for
    :func:`_refuse_repeated_keys` to parse without reading the rows again (json.loads of a 63 MB add took 2 s and
    100 MB). A value is cut where its stretch (:func:`_vector_stretches`: no string, so no key) holds no ``{`` up
    to its first ``}``: the value ends before that ``}`` (its object's end) or, where the stretch holds none, before
    the comma that comes ahead of the next key. Any other value (one holding an empty object) is kept whole."""
    parts, at, mv = [], 0, memoryview(body)
    for _, start, stop in _vector_stretches(body):
        first = _WS.match(body, start, stop).end()
        close = body.find(b"}", first, stop)
        close = stop if close < 0 else close
        if first == close or body.find(b"{", first, close) >= 0:
            continue  # a string value (nothing before the quote), or an object among the rows: kept
        parts += (mv[at:first], b"0," if close == stop else b"0")
        at = close
    return b"".join((*parts, mv[at:])) if parts else body


def _keys(value: Any) -> int:
    """The keys of the JSON objects in a parsed ``value``, at most: ``vectors`` and the lists whose first item is no
    list or object are not looked into (a 1 M-id list costs nothing); what is left out only makes the count short
    of :func:`_key_ends`, and the body is then parsed again, without its vectors (:func:`_refuse_repeated_keys`)."""
    kind = type(value)
    if kind is dict:
        return len(value) + sum(_keys(v) for k, v in value.items() if k != "vectors" and type(v) in (dict, list))
    if kind is list and value and type(value[0]) in (dict, list):
        return sum(_keys(v) for v in value if type(v) in (dict, list))
    return 0


def _refuse_repeated_keys(body: bytes) -> None:
    """InputError naming a key that one JSON object of ``body`` gives twice: orjson keeps the last (``{"k": 3,
    "k": 7}`` searched with k=7), RFC 8259 leaves it undefined, and a client meant one of them. The body is parsed
    again without its vectors (:func:`_without_vectors`), the numbers left unread."""
    import json

    def pairs(items: list) -> dict:
        seen: set = set()
        for key, _ in items:
            if key in seen:
                raise InputError(f"body: the key {key[:80]!r} appears twice in one JSON object (which one counts is "
                                 "not defined: send it once)")
            seen.add(key)
        return dict(items)

    _reparse(json.loads, _without_vectors(body), object_pairs_hook=pairs, parse_int=_zero, parse_float=_zero)


def _zero(_: str) -> int:
    return 0


def _reparse(loads, text: bytes, **kw) -> Any:
    """``loads(text, **kw)``: the standard library's parser, read where orjson (which parsed ``text`` first) cannot
    tell a repeated key or a whole number; its failures are the client's InputError, not a 500. It stops at ~1000
    levels of nesting where orjson allows 1024 (deeper than any field is taken: vectors are 2, others
    ``MAX_JSON_DEPTH``)."""
    try:
        return loads(text, **kw)
    except InputError:
        raise
    except RecursionError:
        raise InputError(f"body: JSON nested too deep to read (vectors are a list of rows: 2 levels; any other field "
                         f"at most {MAX_JSON_DEPTH})") from None
    except ValueError as exc:
        raise InputError(f"body could not be read: {str(exc)[:200]}") from None


def _looks_like_json(body: bytes) -> bool:
    """Whether ``body`` starts as a JSON object or array does (after white space)."""
    return body[:64].lstrip()[:1] in (b"{", b"[")


def _json_sent_as(body: bytes) -> str:
    """The hint a binary body's refusal adds when the body is JSON (it read "body holds 1935 bytes, not a whole
    number of rows of 384 float32" alone)."""
    return f"; it looks like JSON: send Content-Type: {JSON}" if _looks_like_json(body) else ""


def _check_int_range(body: bytes) -> None:
    """InputError naming the body field that writes an integer outside 64 bits
    (:func:`~service.limits.check_int_literal`; orjson parsed it as a float that lost its last digits: a payload id
    123456789012345678901234567890 came back as 1.2345678901234568e+29). ``1e20`` is a float and is kept. Called
    only when a parsed value looks like one, so the usual body is read once; the second read keeps integers whole
    and :func:`_check_depth` names the field."""
    import json

    _check_depth(_reparse(json.loads, body, parse_float=_zero))


_INT_LO, _INT_HI = JSON_INT_RANGE


def _check_depth(obj: dict) -> bool:
    """Refuse bodies nested deeper than ``MAX_JSON_DEPTH`` (payloads, params; storing them would recurse), and
    integers past 64 bits; whether a field holds a float that may be one (:func:`~service.limits.check_json_depth`).

    ``vectors`` of the body or of a fit side are skipped (numpy reads them as a 2-D array or refuses);
    walking 25 M numbers in Python would cost a second.
    """
    lossy = False
    for key, value in obj.items():
        kind = type(value)  # a leaf with nothing to check (most of a search body) skips the walk: ~0.4 µs each
        if key == "vectors" or kind is str or kind is bool or value is None or (
                kind is int and _INT_LO <= value <= _INT_HI):
            continue
        if isinstance(value, dict) and key in ("source", "target"):
            lossy |= _check_depth(value)
        else:
            lossy |= check_json_depth(value, MAX_JSON_DEPTH - 1, f"body field {key!r}")
    return lossy


def check_batch(n: int, max_batch: int) -> None:
    if n > max_batch:
        raise PayloadTooLargeError(
            f"batch of {n} rows exceeds the limit of {max_batch} rows per request; split it into smaller batches")


def texts_instead(obj: dict, texts: list[str] | None, max_batch: int) -> bool:
    """Whether the body ``obj`` sends ``texts`` instead of vectors; refuses both at once, an empty
    list (422) and more than ``max_batch`` texts (413)."""
    if texts is None:
        return False
    if any(obj.get(k) is not None for k in VECTOR_KEYS):  # "vectors": null is no vectors
        raise InputError("give either vectors or texts, not both")
    if not texts:
        raise InputError("texts must not be empty")
    check_batch(len(texts), max_batch)
    return True


def body_dim(obj: dict, where: str = "dim") -> Any:
    """The ``dim`` a JSON body (or a fit side) ``obj`` gives, read as its integer fields are
    (:func:`~.number_types.whole_int`): ``16.0`` is 16 (it was taken from the raw JSON, so ``vectors_b64`` with
    ``"dim": 16.0`` was refused though the options model took it); None when absent. A fraction, NaN or a whole float
    of 2**53 or more is an InputError naming ``where``; any other non-int is left for the caller to refuse."""
    try:
        return whole_int(obj.get("dim"))
    except ValueError as exc:
        raise InputError(f"{where} {exc}") from None


def _b64_matrix(text: Any, dim: Any, *, name: str) -> np.ndarray:
    if not isinstance(text, str):
        raise InputError(f"{name}_b64 must be a base64 string of little-endian float32")
    try:
        raw = _b64decode_blocks(text)
    except (binascii.Error, ValueError) as exc:
        raise InputError(f"{name}_b64 is not valid base64: {exc}") from None
    if not isinstance(dim, int) or isinstance(dim, bool) or not 1 <= dim <= MAX_DIM:
        raise InputError(f"{name}_b64 needs \"dim\": the number of float32 columns per row (1 .. {MAX_DIM})")
    if len(raw) % (4 * dim):
        raise ShapeError(f"{name}_b64 holds {len(raw)} bytes, not a whole number of rows of {dim} float32")
    return np.frombuffer(raw, dtype="<f4").reshape(-1, dim)


def vectors_from_json(obj: dict, *, dim: int | None, max_batch: int, name: str = "vectors",
                      required: bool = True, finite: bool = True, bools: bool | bytes = True) -> np.ndarray | None:
    """Read ``obj[name]`` or ``obj[name + "_b64"]`` (+ ``obj["dim"]``) as float32 (n, d).

    ``finite=False`` leaves the NaN/Inf check to the caller (a map's ``apply(validate=True)`` makes it on the
    fly); every other check is made here. ``bools``: whether the JSON text ``obj`` was parsed from can hold a
    ``true`` / ``false`` (:func:`may_hold_bools` of the body); False skips the look for them among the rows. Or
    that JSON text itself, looked at only when the rows come as a list (base64 rows hold no booleans, and their
    text is full of the letters the look starts from: ~6 µs of a batch-1 search)."""
    has_list, has_b64 = name in obj and obj[name] is not None, f"{name}_b64" in obj and obj[f"{name}_b64"] is not None
    if has_list and has_b64:
        raise InputError(f"give either {name!r} or '{name}_b64', not both")
    if not (has_list or has_b64):
        if required:
            raise InputError(f"missing {name!r} (list of rows) or '{name}_b64' (base64 float32 with \"dim\")")
        return None
    claimed = body_dim(obj)  # 16.0 is 16
    if has_b64:
        arr = _b64_matrix(obj[f"{name}_b64"], claimed if claimed is not None else dim, name=name)  # null: left out
    else:
        arr = obj[name]
        if not isinstance(arr, list):
            raise InputError(f"{name} must be a list of rows (lists of numbers)")
        check_batch(len(arr), max_batch)
        if not arr:
            raise EmptyInputError(f"{name}: expected at least one row, got an empty list")
        if not isinstance(arr[0], list):
            raise ShapeError(f"{name}: expected a 2-D list of rows, got a flat list; wrap a single row as [[...]]")
        arr = _rows_in_blocks(arr, name, bools=bools if isinstance(bools, bool) else may_hold_bools(bools))
    X = as_matrix(arr, name=name, dim=dim, finite=finite)
    check_batch(X.shape[0], max_batch)
    if has_list and claimed is not None and claimed != X.shape[1]:  # it was ignored: say which one is wrong
        raise DimensionMismatchError(f"{name}: the rows have {X.shape[1]} columns, but dim={claimed} says otherwise")
    return X


def _rows_in_blocks(rows: list, name: str, block: int = 4096, *, bools: bool = True):
    """A JSON list of rows as one array, converted a block of rows at a time (float32; one block: as numpy reads it).

    ``np.asarray`` of a 3 M-number list holds the GIL for its whole run; block by block, other
    threads (the event loop) run in between. A JSON ``true`` / ``false`` among the numbers is refused (numpy read it
    as 1.0 / 0.0: ``[[true, 0.1]]`` was answered 200; the OpenAPI says number). Anything else that is not a list of
    equal-length number rows is handed back as is, for :func:`as_matrix` to explain. ``bools`` False (the body
    holds no ``true`` / ``false``: :func:`may_hold_bools`) skips that look: it reads the values of every row holding
    a 0 or a 1, nearly every row of ReLU, sparse or integer embeddings (twice the time of the read itself).
    """
    if not all(isinstance(r, list) for r in rows[:1]) or (len(rows) <= block and not bools):
        return rows  # one block and nothing to refuse: as_matrix reads it at once
    width = len(rows[0])
    out = None if len(rows) <= block else np.empty((len(rows), width), np.float32)
    for s in range(0, len(rows), block):
        try:
            part = np.asarray(rows[s : s + block])  # dtype inferred: strings or objects are not numbers
        except (TypeError, ValueError):
            return rows
        if part.shape != (min(block, len(rows) - s), width) or part.dtype.kind not in "fiub":
            return rows
        if bools:
            _refuse_bools(rows, part, s, name)
        if out is None:
            return part  # as_matrix checks it as it did the list (float64 beyond float32's range, say)
        out[s : s + block] = part
    return out


def may_hold_bools(body: bytes) -> bool:
    """Whether the JSON text ``body`` can hold a ``true`` or ``false`` (False: it surely holds neither).

    Looked for by the ``u`` of ``true`` and the ``l`` of ``false``, letters no JSON number holds: ``bytes.find`` of
    one byte is a memchr (~0.1 ms for 8 MB of numbers, where ``b"true" in body`` took ~5 ms). A body with more
    than a few dozen of them (texts, payloads) is searched for the words themselves."""
    for word, at in ((b"true", 2), (b"false", 2)):
        letter, i = word[at : at + 1], body.find(word[at : at + 1])
        for _ in range(64):
            if i < 0:
                break
            if i >= at and body.startswith(word, i - at):
                return True
            i = body.find(letter, i + 1)
        else:
            if word in body:
                return True
    return False


def _refuse_bools(rows: list, part: np.ndarray, start: int, name: str) -> None:
    """InputError when a row of ``rows[start : start + len(part)]`` (read by numpy as ``part``) holds a JSON boolean.
    Only rows holding a 0 or a 1 can (numpy read a boolean as one): their values' types are looked at, no others'."""
    maybe = np.arange(len(part)) if part.dtype.kind == "b" else np.flatnonzero(((part == 0) | (part == 1)).any(axis=1))
    for i in maybe:
        if bool in map(type, rows[start + i]):
            raise InputError(f"{name}: row {start + i} holds a JSON boolean (true / false) where a number belongs; "
                             f"send numbers (0 and 1, if that is meant)")


def vectors_from_binary(body: bytes, mt: str, *, dim: int | None, max_batch: int, finite: bool = True) -> np.ndarray:
    """Read an octet-stream or ``.npy`` body as float32 (n, d); ``finite`` as in :func:`vectors_from_json`.

    ``dim``: the row width the caller settled on (the transform route: ``?dim=``, ``X-Vector-Dim``, else the map's
    source dimension); an octet-stream body with ``dim`` None is an InputError."""
    if mt == NPY:
        # numpy takes any other bytes for a pickle, and advises loading it "unsafely" (.npz: refused below)
        if not body.startswith((b"\x93NUMPY", b"PK\x03\x04")):
            raise InputError("body is not a .npy file (no NumPy header); send one array of numbers saved with "
                             "numpy.save, or raw float32 as application/octet-stream" + _json_sent_as(body))
        _check_npy_header(body, max_batch)  # before np.load allocates what the header claims
        try:
            arr = np.load(io.BytesIO(body), allow_pickle=False)
        except Exception as exc:
            if "pickle" in str(exc) or "Python objects" in str(exc):  # an object array (as service.io.load_npy)
                raise InputError("body holds Python objects (an object array); the service reads arrays of numbers "
                                 "only and never unpickles a body: send a float16/32/64 array, e.g. numpy.save of "
                                 "X.astype('float32')") from None
            raise InputError(f"body is not a readable .npy array: {exc}") from None
        if not isinstance(arr, np.ndarray):  # a .npz archive (np.load answers an NpzFile): not one array
            arr.close()
            raise InputError("body is a .npz archive, not a .npy array; send one array saved with numpy.save")
        if arr.ndim == 1 and dim is not None:  # one row; 768 values were reshaped into 2 rows of 384
            if arr.size != dim:
                raise ShapeError(f"vectors: a 1-D .npy array of {arr.size} values is one row, not {dim} wide; "
                                 f"send a 2-D (n_rows, {dim}) array")
            arr = arr.reshape(1, dim)
    else:
        if dim is None:
            raise InputError("application/octet-stream needs the row width: ?dim=D or header X-Vector-Dim: D")
        if not 1 <= dim <= MAX_DIM:
            raise InputError(f"dim must be between 1 and {MAX_DIM}, got {dim}")
        if not body:
            raise EmptyInputError("vectors: the body is empty; send n*dim*4 bytes of float32")
        if len(body) % (4 * dim):
            raise ShapeError(f"body holds {len(body)} bytes, not a whole number of rows of {dim} float32 (4 bytes "
                             f"each){_json_sent_as(body)}")
        arr = np.frombuffer(body, dtype="<f4").reshape(-1, dim)
    X = as_matrix(arr, name="vectors", dim=dim, finite=finite)
    check_batch(X.shape[0], max_batch)
    return X


def _check_npy_header(body: bytes, max_batch: int) -> None:
    """The shape and dtype a ``.npy`` body's header claims against the bytes after it, before ``np.load`` allocates
    the array: a header claiming (10**7, 10**6) float32 made the server try to allocate "140. TiB" and answer numpy's
    words. Too few or too many bytes: ShapeError (422) naming both figures; more rows than ``max_batch``: 413. A
    header that does not parse, or an object dtype, is left to ``np.load`` (its refusals say so)."""
    f = io.BytesIO(body)
    try:
        shape, dtype = npy_header(f)
    except Exception:  # noqa: BLE001 - np.load reads it again and says what is wrong
        return
    if dtype.hasobject or not all(isinstance(n, int) and n >= 0 for n in shape):
        return
    need, have = int(np.prod(shape, dtype=object)) * dtype.itemsize, len(body) - f.tell()
    if need != have:
        raise ShapeError(f"the .npy header claims a {' x '.join(map(str, shape)) or 'scalar'} array of {dtype} "
                         f"({need} bytes), but the body holds {have} bytes after its header; send the whole array "
                         f"numpy.save wrote")
    if len(shape) == 2:
        check_batch(shape[0], max_batch)


_B64_BLOCK = 16 << 20  # characters (a multiple of 4) / 12 << 20 bytes per call: ~1-2 ms holding the GIL (pybase64)


def _b64decode_blocks(text: str) -> bytes:
    """``base64.b64decode(text, validate=True)`` a block at a time (other threads run in between), by pybase64
    (SIMD: ~0.1 ms per MB here, where CPython's ``base64`` took ~3 ms: its ``validate`` is a regular expression
    over the whole text, then a scalar decode). Strict: only the alphabet, padding only at the end."""
    if len(text) <= _B64_BLOCK:
        return pybase64.b64decode(text, validate=True)
    if len(text) % 4:
        raise ValueError("base64 text length is not a multiple of 4")
    return b"".join(pybase64.b64decode(text[i : i + _B64_BLOCK], validate=True)
                    for i in range(0, len(text), _B64_BLOCK))


def b64_encode(X: np.ndarray) -> str:
    """Base64 of little-endian float32, row-major; encoded a block at a time (other threads run in between)."""
    raw = memoryview(np.ascontiguousarray(X, dtype="<f4")).cast("B")
    step = _B64_BLOCK // 4 * 3
    return "".join(pybase64.b64encode_as_string(raw[i : i + step]) for i in range(0, len(raw), step))


def npy_bytes(X: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(X, dtype="<f4"), allow_pickle=False)
    return buf.getvalue()


VECTOR_KEYS = ("vectors", "vectors_b64")  # the body keys :func:`vectors_from_json` reads


def options_of(obj: dict) -> dict:
    """The JSON body ``obj`` without its vectors: what a route's options model validates."""
    return {k: v for k, v in obj.items() if k not in VECTOR_KEYS}


def parse_options(body: bytes, model) -> tuple[dict, Any]:
    """``(obj, opts)``: the JSON body and its options validated by ``model`` (vectors left to
    :func:`vectors_from_json`)."""
    obj = parse_json(body)
    return obj, validate(model, options_of(obj))


def parse_rows(body: bytes, model, max_batch: int, dim) -> tuple[Any, np.ndarray | None]:
    """``(opts, X)``: the body's options validated by ``model`` and its vectors (n, ``dim(opts)``), or X None when
    the body sends ``texts`` instead (``dim`` is then not called)."""
    obj, opts = parse_options(body, model)
    if texts_instead(obj, opts.texts, max_batch):
        return opts, None
    return opts, vectors_from_json(obj, dim=dim(opts), max_batch=max_batch, bools=body)


def validate(model, obj: dict, where: str = "body"):
    """``model.model_validate(obj)`` with pydantic's errors turned into one InputError (422) carrying ``details``
    (``where``: the part of the request ``obj`` came from, first in each ``loc``)."""
    from pydantic import ValidationError

    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        raise validation_error([{**e, "loc": (where, *e["loc"])} for e in exc.errors()]) from None


def check_query(params, allowed: tuple[str, ...]) -> None:
    """The InputError (422, :func:`validation_error`) of a query string ``params`` (``(key, value)`` pairs) that
    names a parameter the route does not take (a misspelt ``?ouptut=frame`` was ignored: the default answered) or
    gives one more than once (``?dim=128&dim=384``: the last one won)."""
    problems: dict[str, dict] = {}
    seen = set()
    for key, _ in params:
        if key not in allowed:
            takes = ", ".join(allowed) if allowed else "none: its options go in the JSON body"
            problems[key] = {"loc": ["query", key], "type": "extra_forbidden",
                             "msg": f"unknown query parameter (this route takes {takes})"}
        elif key in seen:
            problems[key] = {"loc": ["query", key], "type": "repeated", "msg": "given more than once; send it once"}
        seen.add(key)
    if problems:
        raise validation_error(list(problems.values()))


def validation_error(errors: list[dict]) -> InputError:
    """The one InputError (422) of a request that failed validation, whoever validated it (a route's own
    :func:`validate`, or FastAPI for a body model or a query parameter: ``service.api.errors``): the message names
    every problem, and ``details`` lists them (``loc``: ``["body" | "query" | ..., field, ...]``, ``msg``, ``type``).
    Both were once told apart by the error's type (``RequestValidationError`` with details from FastAPI,
    ``InputError`` without from the routes that read their own body)."""
    problems = []
    for err in errors:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        problems.append(f"{loc or 'body'}: {err.get('msg')}")
    exc = InputError("invalid request: " + "; ".join(problems))
    exc.details = [{"loc": list(e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")} for e in errors]
    return exc
