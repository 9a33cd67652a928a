"""Vectors on the wire, and requests too large for one call split into the service's limits.

Used by :class:`service.client.Client`. Matrices travel as little-endian float32 (raw bytes, or base64
inside JSON); :func:`matrix` refuses what cannot be sent before a byte goes out.

The service refuses a body over its limit (``max_body_bytes``; JSON and texts have lower ones in
``limits``) or more rows than ``max_batch`` (413), and a search of more than ``limits.max_hits``
queries x k (422); its ``/v1/info`` says them all (``limits``). A client call with more rows (a
million vectors to transform or add) is sent as consecutive batches that each fit, and the answers
are put back together in order. :func:`spans` cuts ``0..n`` greedily: batch ``j`` holds rows
``[a_j, a_{j+1})`` with at most ``max_rows`` rows and ``overhead + sum(row_bytes[a_j:a_{j+1}]) <= max_bytes``
(a row that alone does not fit gets a batch of its own: the service answers it as it would have).
"""

from __future__ import annotations

import json
import math
import numbers
import uuid
from collections.abc import Sequence
from typing import NamedTuple
from urllib.parse import quote

import numpy as np
import pybase64

from align.exceptions import InputError, NotRepresentableError, ShapeError
from align.validation import check_no_underflow

__all__ = ["HEADROOM", "OVERHEAD", "Artifact", "Base64Text", "alias_if_match", "as_count", "as_flag", "as_ints",
           "as_list", "as_real", "as_seconds",
           "as_version", "b64", "b64_bytes", "b64_row_bytes", "b64_text", "clean", "cut",
           "dumps", "float32_rows", "json_sizes", "labelled", "matrix", "new_key", "pinned", "rows", "seg", "side",
           "spans"]


class Artifact(NamedTuple):
    """A map artifact from :meth:`service.client.Client.artifact`: ``data`` (None when the ``etag`` the caller
    sent still matches: 304, nothing downloaded), its ``etag`` (send it next time) and the ``version`` the
    reference named."""

    data: bytes | None
    etag: str | None
    version: int | None


def alias_if_match(version: int | None) -> dict:
    """The ``If-Match`` header of an alias write that holds only while the alias points at ``version`` (the
    alias's ETag is ``"v<N>"``); no header for None."""
    return {} if version is None else {"If-Match": f'"v{as_version(version, "expected")}"'}


def as_version(v, name: str = "version") -> int:
    """``v`` as a version number: an int (numpy's too) or a string of one (``"2"``); :class:`InputError` for
    anything else before a request goes out (``int()`` sent 2.7 as version 2 and True as 1)."""
    if isinstance(v, bool) or not isinstance(v, (numbers.Integral, str)):
        raise InputError(f"{name} must be an integer version number such as 2, got {v!r} ({type(v).__name__})")
    try:
        return int(v)
    except ValueError:
        raise InputError(f"{name} must be an integer version number such as 2, got {v!r}") from None


def as_seconds(v, name: str, *, zero: bool = False, inf: bool = False) -> float:
    """``v`` as seconds: a real number > 0 (>= 0 with ``zero``; also infinity with ``inf``); :class:`InputError`
    for NaN, a negative or anything else, before anything is sent (a NaN or negative poll busy-looped)."""
    ok = isinstance(v, numbers.Real) and not isinstance(v, bool) and (v >= 0 if zero else v > 0)  # False for NaN
    if not ok or not (inf or math.isfinite(v)):
        raise InputError(f"{name} must be a number of seconds {'>= 0' if zero else '> 0'}"
                         f"{'' if inf else ' and finite (None: no limit)'}, got {v!r}")
    return float(v)


def as_real(v, name: str) -> float:
    """``v`` as a finite real number; :class:`InputError` for a bool (``float()`` sent True as 1.0, where the service
    refuses a bool), a string, NaN or infinity, before anything is sent."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real) or not math.isfinite(v):
        raise InputError(f"{name} must be a finite number, got {v!r} ({type(v).__name__})")
    return float(v)


def as_count(v, name: str, least: int) -> int:
    """``v`` as an integer >= ``least``; :class:`InputError` otherwise."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < least:
        raise InputError(f"{name} must be an integer >= {least}, got {v!r}")
    return int(v)


def as_flag(v, name: str) -> bool:
    """``v`` as a flag: a bool (numpy's too); :class:`InputError` for anything else before a request goes out
    (``bool()`` sent ``"false"`` and ``"no"`` as true, where the service and :mod:`align` refuse them)."""
    if not isinstance(v, (bool, np.bool_)):
        raise InputError(f"{name} must be True or False, got {v!r} ({type(v).__name__})")
    return bool(v)


def as_ints(values, name: str, *, width: int | None = None) -> list | None:
    """``values`` (a sequence or a numpy integer array; rows of ``width`` with ``width``, e.g. pairs) as a list of
    Python ints for a request body; None stays None. :class:`InputError` before anything is sent for a bool or a
    number that is not a whole one (1.0 is sent as 1): ``int()`` sent True as 1 and 0.5 as 0 (labels [0.5, -0.5]
    went as [0, 0] and fitted a steer from nothing)."""
    if values is None:
        return None
    try:
        items = list(values.tolist() if isinstance(values, np.ndarray) else values)
    except TypeError:
        raise InputError(f"{name} must be a list of integers, got {type(values).__name__}") from None
    if width is not None:
        out = [as_ints(row, f"{name}[{i}]") for i, row in enumerate(items)]
        bad = next((i for i, row in enumerate(out) if len(row) != width), None)
        if bad is not None:
            raise InputError(f"{name}[{bad}] must be {width} integers, got {len(out[bad])}")
        return out
    for i, v in enumerate(items):  # a whole float (np.sign's 1.0) is the integer it holds, as align reads labels
        whole = isinstance(v, numbers.Integral) or (isinstance(v, numbers.Real) and float(v).is_integer())
        if isinstance(v, (bool, np.bool_)) or not whole:
            raise InputError(f"{name}[{i}] must be an integer, got {v!r} ({type(v).__name__}): a bool or a fraction "
                             "would be sent as another number")
    return [int(v) for v in items]


def seg(part) -> str:
    """One path segment: a name, reference or id percent-encoded, so that it cannot reach another route.

    ``/`` and the dot segments ``.`` / ``..`` (which the URL resolves away) are no name the service has; they
    raise :class:`InputError` before anything is sent.
    """
    s = str(part)
    if s in ("", ".", "..") or "/" in s:
        raise InputError(f"{s!r} is not a name, reference or id (no '/', not empty, '.' or '..')")
    return quote(s, safe="@:")


def matrix(X, name: str = "vectors") -> np.ndarray:
    """``X`` as C-contiguous little-endian float32 (n, d); a 1-D row becomes (1, d).

    Refused here, before a byte is sent: another ndim (:class:`ShapeError`), what is not real numbers
    (:class:`InputError`: dtype kind other than int / uint / float: strings, objects, datetimes; booleans, a mask
    passed by mistake, ``X.astype(np.float32)`` sends 0/1 on purpose; a masked array with masked entries; the cast
    would drop a complex value's imaginary part with a mere warning, where the service refuses complex input), and
    finite float64 values float32 cannot hold, e.g. 1e39
    (:class:`NotRepresentableError`: the cast would send Inf, and the service would call finite input NaN/Inf),
    and non-zero float64 rows whose every value is below float32's smallest, e.g. 1e-46 (they would arrive as
    all-zero rows: :class:`NotRepresentableError`, as the service and ``LinearMap.apply`` say).
    NaN / Inf in ``X`` itself are the service's to refuse (422 :class:`ValidationError`).
    """
    try:
        src = np.asarray(X)  # a torch tensor that requires grad raised a bare RuntimeError here
    except Exception as e:  # noqa: BLE001 - as as_matrix: whatever numpy cannot read is no array of numbers
        raise InputError(f"{name}: cannot be read as a numeric array ({e})") from None
    if src.dtype.kind == "b":  # a mask (X > 0) passed by mistake, far more often than 0/1 vectors
        raise InputError(f"{name}: a boolean array (dtype bool, a mask?) is not vectors; to pass 0/1 on purpose, "
                         f"convert it: X.astype(np.float32)")
    if src.dtype.kind == "c":
        raise InputError(f"{name}: complex values are not supported (the imaginary part would be dropped)")
    if src.dtype.kind not in "iuf":  # strings, objects, datetimes were cast and sent (astype reads "1.5" and dates)
        raise InputError(f"{name}: expected an array of numbers, got dtype {src.dtype}")
    if np.ma.isMaskedArray(X) and np.ma.getmaskarray(X).any():  # asarray dropped the mask: hidden values sent
        raise InputError(f"{name}: a masked array with masked entries; their hidden values would be read as "
                         f"numbers (fill them, X.filled(...), or drop those rows)")
    with np.errstate(over="ignore"):
        A = src.astype("<f4", copy=False)
    if A.ndim == 1:
        A = A[None, :]
    if A.ndim != 2:
        raise ShapeError(f"{name}: expected a 2-D array (n, d), got shape {A.shape}")
    # max and min are Inf / NaN when any value is (their difference overflowed past ±1.7e38: a spurious warning)
    if src.dtype.kind == "f" and src.dtype.itemsize > 4 and A.size and not np.isfinite([A.max(), A.min()]).all():
        lost = ~np.isfinite(A).all(axis=1) & np.isfinite(src.reshape(A.shape)).all(axis=1)
        if lost.any():
            raise NotRepresentableError(f"{name}: {int(lost.sum())} finite row(s) (first: row "
                                        f"{int(np.flatnonzero(lost)[0])}) hold values beyond float32's range "
                                        f"(|x| > 3.4e38); scale them")
    check_no_underflow(src.reshape(A.shape), A, name)  # as the service's .npy path and LinearMap.apply
    return np.ascontiguousarray(A)


class Base64Text(str):
    """Base64 text made here (:func:`b64`, :func:`b64_text`): only ``A-Z a-z 0-9 + / =``, which JSON carries
    unescaped, so :func:`dumps` copies it into the body as it is instead of scanning it (~2 ms per MB)."""

    __slots__ = ()


def b64_text(raw) -> Base64Text:
    """Standard base64 of the bytes-like ``raw`` (pybase64: SIMD, ~0.1 ms per MB)."""
    return Base64Text(pybase64.b64encode_as_string(raw))


def b64_bytes(text: str | bytes) -> bytes:
    """The bytes of strict base64 ``text`` (only the alphabet, padding only at the end); binascii.Error (a
    ValueError) otherwise."""
    return pybase64.b64decode(text, validate=True)


def b64(X, name: str = "vectors") -> dict:
    """``{"vectors_b64": ..., "dim": d}``: the JSON fields of a matrix as base64 float32."""
    A = matrix(X, name)
    # a 1-D view: memoryview cannot cast a (0, d) or (n, 0) array to bytes; an empty one is the service's to refuse
    return {"vectors_b64": b64_text(memoryview(A.reshape(-1)).cast("B")), "dim": int(A.shape[1])}


def float32_rows(raw: bytes, shape) -> np.ndarray:
    """Little-endian float32 bytes as a writeable (n, d) array (``frombuffer`` alone is read-only: an in-place
    ``Y /= norms`` would fail); ValueError when the byte count does not match ``shape``."""
    return np.frombuffer(bytearray(raw), dtype="<f4").reshape(tuple(int(v) for v in shape))


def rows(body: dict) -> np.ndarray:
    """The vectors of a JSON answer (``vectors`` or ``vectors_b64`` with ``shape``) as float32 (n, d)."""
    if body.get("vectors_b64") is not None:
        return float32_rows(b64_bytes(body["vectors_b64"]), body["shape"])
    return np.asarray(body["vectors"], dtype=np.float32)


def _plain(x):
    """``json.dumps``'s ``default``: numpy scalars and arrays as the Python numbers and lists they hold (ids
    from ``np.arange``, a ``np.float32`` in a payload); anything else is refused as ``json`` would."""
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"{type(x).__name__} is not JSON serializable")


def dumps(body) -> bytes:
    """The JSON bytes of a request body; :class:`InputError` for what JSON cannot carry (NaN, objects).

    :class:`Base64Text` values in (nested) objects are copied in unscanned; everything else is ``json.dumps``'s."""
    try:
        return _text(body).encode()
    except (TypeError, ValueError) as e:
        raise InputError(f"request body: {e}") from None


def _text(obj) -> str:
    if type(obj) is Base64Text:
        return f'"{obj}"'
    if isinstance(obj, dict) and _holds_base64(obj):  # each key as json writes it, e.g. 1 -> "1"
        return "{" + ",".join(f"{_json({k: 0})[1:-2]}{_text(v)}" for k, v in obj.items()) + "}"
    return _json(obj)


def _json(obj) -> str:
    return json.dumps(obj, default=_plain, allow_nan=False, separators=(",", ":"))


def _holds_base64(obj: dict) -> bool:
    return any(type(v) is Base64Text or (isinstance(v, dict) and _holds_base64(v)) for v in obj.values())


# --- splitting --------------------------------------------------------------------------------------
OVERHEAD = 64 * 1024  # bytes of a body beside its rows (options, names, JSON punctuation)
HEADROOM = 0.95  # share of max_body_bytes a batch may fill


def b64_row_bytes(dim: int) -> int:
    """Bytes of one float32 row of width ``dim`` in base64 (4/3 of its ``4 dim`` bytes, padded)."""
    return 4 * -(-4 * int(dim) // 3)


def json_sizes(items: Sequence | None, n: int) -> np.ndarray:
    """Bytes each of ``items`` (ids, payloads, texts) adds to a JSON body, as (n,) int64 (zeros for ``None``)."""
    if items is None:
        return np.zeros(n, np.int64)
    return np.fromiter((len(json.dumps(x, separators=(",", ":"), default=_sized)) + 1 for x in items), np.int64, n)


def _sized(x):
    """The ``default`` of :func:`json_sizes`: what :func:`dumps` writes for ``x`` (:func:`_plain`); ``str(x)`` for
    what it refuses (it raises later, naming it). ``str`` of a numpy array over 1,000 values is cut to ``[... ]``:
    a payload of 2,000 floats was sized 88 bytes for its 39,223, and the batch it went in was a 413."""
    try:
        return _plain(x)
    except TypeError:
        return str(x)


def spans(n: int, row_bytes, *, max_rows: int | None, max_bytes: int | None) -> list[slice]:
    """Consecutive slices covering ``0..n``: each at most ``max_rows`` rows and ``max_bytes`` bytes.

    ``row_bytes``: one int (every row costs the same) or (n,) ints. ``None`` limits: one slice.
    """
    if n <= 0:
        return [slice(0, n)]
    rows_cap = max(1, int(max_rows)) if max_rows else n
    if not max_bytes:
        return [slice(a, min(a + rows_cap, n)) for a in range(0, n, rows_cap)]
    budget = max(1, int(max_bytes * HEADROOM) - OVERHEAD)
    if np.isscalar(row_bytes):
        per = max(1, min(rows_cap, budget // max(1, int(row_bytes))))
        return [slice(a, min(a + per, n)) for a in range(0, n, per)]
    cost = np.cumsum(np.asarray(row_bytes, np.int64))
    out, a = [], 0
    while a < n:
        before = cost[a - 1] if a else 0
        b = int(np.searchsorted(cost, before + budget, side="right"))  # rows a..b-1 fit the budget
        b = min(max(b, a + 1), a + rows_cap, n)
        out.append(slice(a, b))
        a = b
    return out


def pinned(answer: dict) -> dict:
    """The ``map`` and ``steers`` fields of a search body that name the very versions ``answer`` used.

    Sent with the later batches of one query set: an alias moved (or a version registered) meanwhile would
    otherwise carry some queries through other maps or steers than the rest, mixed silently in one answer.
    ``map``: ``"name:version"``, or a list of them for a path of several maps (none when the answer used no map);
    ``steers``: ``{"name:version": eps}``, the eps of two refs to one version summed (``sum eps_i W_i`` alike).
    """
    out: dict = {}
    path = [f"{m['name']}:{m['version']}" for m in answer.get("maps") or []]
    if path:
        out["map"] = path[0] if len(path) == 1 else path
    for s in answer.get("steers") or []:
        ref = f"{s['name']}:{s['version']}"
        out.setdefault("steers", {})[ref] = out.get("steers", {}).get(ref, 0.0) + float(s["eps"])
    return out


# --- request bodies ------------------------------------------------------------------------------
#: the yes/no fields of the request bodies (the service takes JSON true / false only there): :func:`clean` sends
#: them as bools, numpy's too, and refuses anything else before the request (``exact=1`` was a 422 after the trip)
FLAG_FIELDS = frozenset({"csls", "exact", "include_payloads", "store_texts", "paired", "overwrite", "dry_run",
                         "truncate"})


def clean(d: dict) -> dict:
    """``d`` without its None values; its :data:`FLAG_FIELDS` as bools (:func:`as_flag`)."""
    return {k: as_flag(v, k) if k in FLAG_FIELDS else v for k, v in d.items() if v is not None}


def new_key() -> str:
    """A fresh ``Idempotency-Key``: a retried submission (after a reset or a 429) returns the job the first one
    made instead of queueing a second fit."""
    return f"vbc-{uuid.uuid4().hex}"


def labelled(queries, old_queries, relevant) -> dict:
    """The optional labelled-query fields of a plan or evaluation body."""
    out = {} if queries is None else {"queries": b64(queries, "queries")}
    if old_queries is not None:
        out["old_queries"] = b64(old_queries, "old_queries")
    if relevant is not None:
        out["relevant"] = as_ints(relevant, "relevant")
    return out


def as_list(x) -> list | None:
    """``x`` as a list; one ``str`` is one item (a list of its characters would be a row per character)."""
    return None if x is None else [x] if isinstance(x, str) else list(x)


def cut(x: list | None, part: slice, n: int) -> list | None:
    """Rows ``part`` of a per-row list of ``n`` rows (the whole list when its length is not ``n``: the service
    judges that)."""
    return x if x is None or len(x) != n else x[part]


def side(x, encoder: str | None) -> dict:
    """One side of a fit body: texts (with the encoder) or base64 float32 vectors."""
    if isinstance(x, (list, tuple)) and x and all(isinstance(t, str) for t in x):
        return clean({"texts": list(x), "encoder": encoder})
    return b64(x)
