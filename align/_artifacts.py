"""Artifact bytes shared by every stored object of :mod:`align` (maps, steers).

An ``.npz`` artifact is a zip of float arrays plus one ``uint8`` array ``__meta__`` holding a
UTF-8 JSON header; it is read with ``allow_pickle=False``. Files are written atomically
(temporary file, fsync, rename). No pickle anywhere.

A reader takes the artifact's bytes or a binary file open on them (:func:`read_file`): from a file each array is read
into its own buffer (a zip member through numpy's chunked reader, a safetensors tensor with ``readinto``), so loading
a map holds about its arrays once, never the whole file's bytes beside them (a 1.2 GB cluster map peaked at 2.25x).

An artifact holds what the object *is*, never how long fitting it took or where it ran: the header's metadata is
written without the wall-clock and executor entries vecbridge records of a fit (:func:`stable_metadata`), so two
fits with the same seed write the same bytes (one ``artifact_sha256``, one file in a content-addressed store). The
fitted object keeps them in memory (``metadata["diagnostics"]["timings"]``, a candidate's ``seconds``...); a
service records them with the fit (metrics, report). Older artifacts that hold them still load. Only vecbridge's own
records lose them: the :data:`VOLATILE_KEYS` anywhere in :data:`FIT_RECORDS` and a top-level ``fit_seconds``; a
user's own ``metadata["executor"]`` or ``{"clip": {"seconds": 30}}`` is written as it is (any depth was stripped,
and a loaded copy compared equal without them).
"""

from __future__ import annotations

import io
import json
import math
import os
import struct
import zipfile
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

import numpy as np

from .exceptions import NonFiniteError, SerializationError, VecbridgeError
from .validation import nonfinite_error

__all__ = ["META_KEY", "json_default", "pack_npz", "unpack_npz", "pack", "unpack", "save_atomic", "read_file",
           "check_header", "stored_fields", "StoredMap", "VOLATILE_KEYS", "FIT_RECORDS", "stable_metadata",
           "ValueObject", "same_value"]

META_KEY = "__meta__"
T = TypeVar("T")
#: metadata keys that vary between two runs of the same fit (wall-clock seconds, the executor that ran it):
#: kept in memory, not written into an artifact where vecbridge records a fit (:data:`FIT_RECORDS`; module docstring)
VOLATILE_KEYS = frozenset({"seconds", "fit_seconds", "timings", "executor", "worker_peak_rss_mb"})
#: the top-level metadata entries that are vecbridge's own records of a fit (MiniVec2Vec's diagnostics, with the
#: executor a service adds; fit_migration's candidate selection; the Sinkhorn refinement's rounds; a sharded fit's
#: ``distributed`` record, whose workers' peak memory varies run to run): the only places, besides a top-level
#: ``fit_seconds``, whose :data:`VOLATILE_KEYS` are left out of an artifact
FIT_RECORDS = frozenset({"diagnostics", "selection", "semi_supervised", "distributed"})
#: where vecbridge nests another object's metadata (an inverse's ``of``, a composition's or chain's ``parts``, a
#: composed steer's ``parts[i]["metadata"]``): read as metadata of its own
_NESTED = ("of", "parts", "metadata")


def json_default(obj):
    """``json.dumps`` hook for numpy scalars and arrays."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def stable_metadata(meta):
    """An object's metadata as its artifact holds it: without a top-level ``fit_seconds`` nor the
    :data:`VOLATILE_KEYS` at any depth of its :data:`FIT_RECORDS`, the same for the metadata nested in it
    (``of``, ``parts``); everything else as it is (a user's own ``executor`` or ``seconds`` too). A new object
    (``meta`` is not changed)."""
    if isinstance(meta, (list, tuple)):
        return [stable_metadata(v) for v in meta]
    if not isinstance(meta, dict):
        return meta
    out = {}
    for k, v in meta.items():
        if k == "fit_seconds":
            continue
        out[k] = _without_volatile(v) if k in FIT_RECORDS else stable_metadata(v) if k in _NESTED else v
    return out


def _without_volatile(obj):
    """``obj`` without the :data:`VOLATILE_KEYS` of any dict in it, at any depth (a new object)."""
    if isinstance(obj, dict):
        return {k: _without_volatile(v) for k, v in obj.items() if k not in VOLATILE_KEYS}
    if isinstance(obj, (list, tuple)):
        return [_without_volatile(v) for v in obj]
    return obj


def header_text(header: dict) -> str:
    """The JSON of an artifact's header, its ``metadata`` without vecbridge's timings or executor
    (:func:`stable_metadata`);
    SerializationError when its metadata holds something JSON cannot (a raw TypeError from ``save``)."""
    if isinstance(header.get("metadata"), dict):
        header = {**header, "metadata": stable_metadata(header["metadata"])}
    try:
        return json.dumps(header, sort_keys=True, default=json_default)
    except (TypeError, ValueError) as exc:
        raise SerializationError(f"the map's metadata must be JSON (numbers, strings, lists, dicts): {exc}"
                                 ) from None


def pack_npz(arrays: dict, header: dict) -> bytes:
    """Arrays plus a JSON header as ``.npz`` bytes."""
    buf = io.BytesIO()
    np.savez(buf, **arrays, **{META_KEY: np.frombuffer(header_text(header).encode("utf-8"), dtype=np.uint8)})
    return buf.getvalue()


def _reader(data) -> tuple[BinaryIO, int, bytes]:
    """``(file, size, first 8 bytes)`` of ``data``: artifact bytes, or a binary file open on them (seekable)."""
    fh = io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview)) else data
    size = fh.seek(0, io.SEEK_END)
    fh.seek(0)
    start = fh.read(8)
    fh.seek(0)
    return fh, size, start


def unpack_npz(data, what: str = "npz artifact") -> tuple[dict, dict]:
    """Inverse of :func:`pack_npz` (``data``: bytes or a binary file, see the module docstring): ``(arrays, header)``;
    SerializationError on anything else (bytes that are not a zip at all say so, instead of numpy's guess that they
    are pickled data)."""
    fh, size, start = _reader(data)
    if start[:2] != b"PK":
        raise SerializationError(f"not a vecbridge {what}: not an npz (a zip) archive "
                                 f"({size} bytes starting {start!r})")
    try:
        with np.load(fh, allow_pickle=False) as z:
            _check_zip_extent(z.zip, fh, size)
            arrays = {k: z[k] for k in z.files}
        header = json.loads(arrays.pop(META_KEY).tobytes().decode("utf-8"))
    except Exception as exc:
        raise SerializationError(f"cannot read {what}: {exc}") from None
    return arrays, _header_object(header)


def _check_zip_extent(zf: zipfile.ZipFile, fh: BinaryIO, size: int) -> None:
    """ValueError (the caller's SerializationError) unless the zip directory ``zf`` read from ``fh`` (``size``
    bytes) accounts for the whole file: its end record closes the file (after its comment), its central directory
    ends at that record (at the zip64 end record before it, for an archive past 2 GiB: the offsets are that record's),
    and its first member starts at byte 0. zipfile reads the last end record it finds and takes whatever precedes the
    archive it describes as prepended data, so a chain artifact (which holds its steps' own npz artifacts) cut short
    anywhere after a step's end record read as that step, silently."""
    end = size - zipfile.sizeEndCentDir - len(zf.comment)
    fields = _record(fh, end, zipfile.structEndArchive, zipfile.stringEndArchive)
    ok = fields is not None and fields[7] == len(zf.comment)
    if ok:
        dir_end, dir_size, dir_offset = end, fields[5], fields[6]
        at = end - zipfile.sizeEndCentDir64Locator
        locator = _record(fh, at, zipfile.structEndArchive64Locator, zipfile.stringEndArchive64Locator)
        if locator is not None:  # zip64 (zipfile writes it once the directory starts past 2 GiB)
            dir_end = at - zipfile.sizeEndCentDir64
            rec = _record(fh, dir_end, zipfile.structEndArchive64, zipfile.stringEndArchive64)
            ok = rec is not None and locator[2] == dir_end
            dir_size, dir_offset = (rec[8], rec[9]) if ok else (0, -1)
        ok = ok and zf.start_dir == dir_offset and dir_offset + dir_size == dir_end
    if not ok or min((i.header_offset for i in zf.infolist()), default=0) != 0:
        raise ValueError(f"truncated or not one whole npz archive (its zip directory does not span the file's "
                         f"{size} bytes)")


def _record(fh: BinaryIO, at: int, fmt: str, signature: bytes) -> tuple | None:
    """The zip record of struct ``fmt`` at byte ``at`` of ``fh`` when it starts with ``signature``, else None."""
    width = struct.calcsize(fmt)
    if at < 0:
        return None
    fh.seek(at)
    raw = fh.read(width)
    fields = struct.unpack(fmt, raw) if len(raw) == width else None
    return fields if fields is not None and fields[0] == signature else None


def _header_object(header) -> dict:
    """``header`` itself when it is a JSON object; SerializationError otherwise (every reader calls ``.get`` on it)."""
    if not isinstance(header, dict):
        raise SerializationError(f"artifact header must be a JSON object, got {type(header).__name__}")
    return header


def pack(arrays: dict, header: dict, format: str = "npz") -> bytes:
    """Arrays plus a JSON header as ``"npz"`` or ``"safetensors"`` bytes (header in its string metadata)."""
    if format == "npz":
        return pack_npz(arrays, header)
    if format == "safetensors":
        from safetensors.numpy import save

        return save({k: np.ascontiguousarray(v) for k, v in arrays.items()}, metadata={META_KEY: header_text(header)})
    raise SerializationError(f"unknown format {format!r}; use 'npz' or 'safetensors'")


def unpack(data, what: str = "artifact") -> tuple[dict, dict]:
    """Inverse of :func:`pack` (format detected from the first bytes; ``data``: bytes or a binary file, see the module
    docstring): ``(arrays, header)``; SerializationError otherwise."""
    fh, size, start = _reader(data)
    try:
        if start[:2] == b"PK":  # zip container: npz
            return unpack_npz(fh, what)
        n = int.from_bytes(start, "little")
        fh.seek(8)
        if size < 10 or 8 + n > size or fh.read(1) != b"{":  # safetensors: u64 length, then a JSON header
            raise SerializationError(f"not a vecbridge {what}: neither npz (a zip) nor safetensors "
                                     f"({size} bytes starting {start!r})")
        return _unpack_safetensors(fh, size, n, what)
    except SerializationError:
        raise
    except Exception as exc:
        raise SerializationError(f"cannot read {what}: {exc}") from None


# safetensors' dtype names as numpy reads them (little-endian); BF16 and the FP8 kinds have no numpy dtype
_ST_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
              "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?"}
_ST_MAX_HEADER = 100_000_000  # the safetensors library refuses a larger header


def _unpack_safetensors(fh: BinaryIO, size: int, n: int, what: str) -> tuple[dict, dict]:
    """The arrays and vecbridge header of the safetensors file ``fh`` (``size`` bytes, a JSON header of ``n``), each
    tensor read into its own array. Checked as the safetensors library checks a file (its reader took the whole file
    as bytes): known dtypes, each tensor's bytes its shape times its item size, the tensors back to back from the
    header's end to the file's, none overlapping; anything else is SerializationError."""
    if n > _ST_MAX_HEADER:
        raise SerializationError(f"cannot read {what}: safetensors header of {n} bytes is over the limit")
    fh.seek(8)
    header = _header_object(json.loads(fh.read(n).decode("utf-8")))
    meta = (header.pop("__metadata__", None) or {}).get(META_KEY)
    if meta is None:
        raise SerializationError(f"not a vecbridge {what}: a safetensors file without vecbridge's "
                                 f"{META_KEY!r} metadata")
    tensors = []
    for name, info in header.items():
        if info.get("dtype") not in _ST_DTYPES:
            raise SerializationError(f"cannot read {what}: tensor {name!r} has dtype {info.get('dtype')!r}")
        dtype, shape, (begin, end) = np.dtype(_ST_DTYPES[info["dtype"]]), tuple(info["shape"]), info["data_offsets"]
        if not all(type(x) is int and x >= 0 for x in (*shape, begin, end)) or end > size - 8 - n or (
                math.prod(shape) * dtype.itemsize != end - begin):
            raise SerializationError(f"cannot read {what}: tensor {name!r}: shape {list(shape)} of {info['dtype']} "
                                     f"does not fill its bytes {[begin, end]} of the {size - 8 - n} after the header")
        tensors.append((begin, end, name, dtype, shape))
    arrays, at = {}, 0
    for begin, end, name, dtype, shape in sorted(tensors):
        if begin != at:
            raise SerializationError(f"cannot read {what}: tensor {name!r} starts at byte {begin}, not {at}")
        arr = np.empty(shape, dtype)
        fh.seek(8 + n + begin)
        _read_into(fh, memoryview(arr.reshape(-1).view(np.uint8)), f"{what}: tensor {name!r}")
        arrays[name], at = arr, end
    if 8 + n + at != size:
        raise SerializationError(f"cannot read {what}: its tensors end at byte {8 + n + at}, the file at {size}")
    return arrays, _header_object(json.loads(meta))


def _read_into(fh: BinaryIO, buf: memoryview, what: str) -> None:
    """Fill ``buf`` from ``fh``; SerializationError when the file ends first."""
    got = 0
    while got < len(buf):
        k = fh.readinto(buf[got:])
        if not k:
            raise SerializationError(f"cannot read {what}: the file ends {len(buf) - got} bytes early")
        got += k


def check_header(header: dict, fmt: str, version: int, kind: str) -> None:
    """SerializationError unless ``header`` names format ``fmt`` at a version this code reads (an integer
    ≤ ``version``) and its ``metadata``, if any, is a JSON object."""
    if header.get("format") != fmt:
        raise SerializationError(f"not a vecbridge {kind} artifact (format {header.get('format')!r})")
    stored = header.get("format_version", 0)
    if isinstance(stored, bool) or not isinstance(stored, int):
        raise SerializationError(f"{kind} artifact: format_version must be an integer, got {stored!r}")
    if stored > version:
        raise SerializationError(f"artifact format {stored} is newer than this vecbridge reads")
    if not isinstance(header.get("metadata", {}), dict):
        raise SerializationError(f"{kind} artifact: metadata must be a JSON object, got {header['metadata']!r:.80}")


@contextmanager
def stored_fields(kind: str):
    """Wrap the reading of an artifact's fields: a missing key or a value of the wrong type or form (``int("x")``,
    a string array where numbers belong, a list where an object belongs) is :class:`SerializationError` naming
    ``kind``, never a raw KeyError / ValueError / TypeError / AttributeError. Typed errors pass through (a
    constructor's InputError says which array is impossible)."""
    try:
        yield
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, VecbridgeError):
            raise
        what = f"missing field {exc}" if isinstance(exc, KeyError) else f"malformed field ({exc})"
        raise SerializationError(f"{kind} artifact: {what}") from None


def save_atomic(path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (a reader sees the old file or the new one)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def read_file(path, parse: Callable[[BinaryIO], T]) -> T:
    """``parse(file)`` of the file at ``path`` open for reading (a reader of bytes or a binary file: its arrays are
    read straight from the file); SerializationError when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            return parse(fh)
    except OSError as exc:
        raise SerializationError(f"cannot read {path}: {exc}") from None


def same_value(a, b) -> bool:
    """Whether two fields of a fitted object hold the same value: arrays of one shape and dtype with equal entries
    (NaN equal to NaN), metadata dicts whose artifact JSON is the same (:func:`header_text`: without vecbridge's
    timings, :func:`stable_metadata`, so a loaded copy equals what was saved), anything else by ``==``."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape and a.dtype == b.dtype
                and bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")))
    if isinstance(a, dict) and isinstance(b, dict):
        try:
            return header_text({"metadata": a}) == header_text({"metadata": b})
        except SerializationError:  # not JSON (set by hand): compared as it is
            return stable_metadata(a) == stable_metadata(b)
    return bool(a == b)


class ValueObject:
    """``==`` and a short ``repr`` for the fitted objects (maps, frames, steers).

    ``a == b``: the same class and every field (a dataclass's fields, else :attr:`_eq_fields`) the same value
    (:func:`same_value`), so ``Map.load(p) == m`` after ``m.save(p)``; the ``==`` a dataclass writes compared arrays
    with ``==`` and raised numpy's "truth value of an array is ambiguous". Not hashable (``hash`` raises TypeError):
    the objects can change (an attribute assigned, metadata being a dict) and a hash must not change with them.

    ``repr``: the class, the widths (``d_s -> d_t``, ``dim``, ``rank``), the class's :attr:`_repr_attrs` and a
    few metadata facts (:attr:`_REPR_META`); the dataclass one printed every array (13,739 characters for a map).
    """

    __hash__ = None
    _eq_fields: tuple[str, ...] = ()
    _repr_attrs: tuple[str, ...] = ()
    _REPR_META = ("method", "space", "source", "target", "n_pairs", "n_pos", "n_neg")

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        names = [f.name for f in fields(self)] if is_dataclass(self) else self._eq_fields
        return self is other or all(same_value(getattr(self, n), getattr(other, n)) for n in names)

    def __repr__(self) -> str:
        cls = type(self)
        parts = [f"{self.source_dim} -> {self.target_dim}"] if hasattr(self, "source_dim") else []
        parts += [f"{a}={getattr(self, a)!r}" for a in ("dim", "rank", *self._repr_attrs) if hasattr(self, a)]
        meta = getattr(self, "metadata", None)
        meta = meta if isinstance(meta, dict) else {}
        parts += [f"{k}={meta[k]!r}" for k in self._REPR_META if isinstance(meta.get(k), (str, int, float))]
        return f"{cls.__name__}({', '.join(parts)})"


class StoredMap(ValueObject):
    """``from_bytes`` / ``save`` / ``load`` for a map class with ``to_bytes(format)`` and
    ``from_artifact(arrays, header)``, the map of an unpacked artifact (LinearMap, ClusterMap, MapChain: one
    implementation for all).

    A map caches the constants of its fused apply (``_fused``) on first use; assigning any attribute drops them,
    so ``m.W = W2`` takes effect (it applied the old W), also while another thread builds them (:meth:`_keep_plan`).
    An array changed in place gives undefined results (a ClusterMap applies its ``W`` in place but keeps
    ``mu_s W_j`` from the old one): assign new arrays. The cache is no part of the map's state: pickle, copy and
    ``joblib.hash`` leave it out (an applied map pickled at twice its size and hashed as another map)."""

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)
        if name != "_fused":
            self.__dict__.pop("_fused", None)

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_fused", None)
        return state

    def _keep_plan(self, plan: dict, **used) -> dict:
        """Cache ``plan``, built from the attribute values ``used`` (read once, by name), unless an attribute was
        assigned meanwhile; returns ``plan`` (consistent with what it was built from) either way. Stored first and
        checked after: an assignment before the check is seen here, one after it drops the plan itself."""
        self.__dict__["_fused"] = plan
        if any(self.__dict__.get(name) is not value for name, value in used.items()) and (
                self.__dict__.get("_fused") is plan):
            self.__dict__.pop("_fused", None)
        return plan

    def _block_rows(self, batch_size: int) -> int:
        """Rows of the blocks :meth:`apply` takes at a time with ``batch_size`` (a piece of :meth:`_apply_pieces`
        is a whole number of them)."""
        return int(batch_size)

    def _apply_pieces(self, X: np.ndarray, block: int, *, batch_size: int, **kw) -> np.ndarray | None:
        """``self.apply(X, batch_size=batch_size, **kw)`` on pieces of ``X`` (an array :func:`as_matrix` would copy
        whole: :func:`align.validation.copies_whole`), each converted to float32 on its own: a float16 memmap of
        40,000 x 384 was copied whole (61 MB beside the output) whatever ``batch_size``. A piece is a whole number of
        the apply's blocks of ``block`` rows and at least ``batch_size`` rows, so every row meets the arithmetic it
        met in one call, and never one row alone (the one-row form gives other bits). None when ``X`` is one
        piece. NaN / Inf met in a piece is the NonFiniteError of ``X`` whole (every row counted, as one call)."""
        rows, n = -(-max(batch_size, block) // block) * block, X.shape[0]
        if n <= rows + 1:
            return None
        out, s = None, 0
        while s < n:
            e = s + rows if n - (s + rows) > 1 else n
            try:
                part = self.apply(X[s:e], batch_size=batch_size, **kw)
            except NonFiniteError as exc:  # "X: 1 row(s) ..." counted the piece's rows only
                if type(exc) is not NonFiniteError:  # an output that overflows float32: that piece's rows
                    raise
                raise nonfinite_error(X, kw.get("name", "X")) from None
            if out is None:
                out = np.empty((n, part.shape[1]), dtype=np.float32)
            out[s:e] = part
            s = e
        return out

    @classmethod
    def from_bytes(cls, data):
        """Read what :meth:`to_bytes` wrote (npz or safetensors, told apart by the bytes; ``data``: the bytes or a
        binary file open on them); SerializationError otherwise."""
        return cls.from_artifact(*unpack(data, f"{cls.__name__} artifact"))

    def save(self, path, format: str | None = None) -> Path:
        """Write atomically to ``path`` (format from the suffix unless given)."""
        path = Path(path)
        return save_atomic(path, self.to_bytes(format or ("safetensors" if path.suffix == ".safetensors" else "npz")))

    @classmethod
    def load(cls, path):
        """Read a map written by :meth:`save`, its arrays straight from the file."""
        return read_file(path, cls.from_bytes)
