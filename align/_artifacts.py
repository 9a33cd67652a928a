"""Artifact bytes shared by every stored object of :mod:`align` (maps, steers).

An ``.npz`` artifact is a zip of float arrays plus one ``uint8`` array ``__meta__`` holding a
UTF-8 JSON header; it is read with ``allow_pickle=False``. Files are written atomically
(temporary file, fsync, rename). No pickle anywhere.

An artifact holds what the object *is*, never how long fitting it took or where it ran: the header's metadata is
written without its wall-clock and executor entries (:data:`VOLATILE_KEYS`, at any depth), so two fits with the
same seed write the same bytes (one ``artifact_sha256``, one file in a content-addressed store). The fitted
object keeps them in memory (``metadata["diagnostics"]["timings"]``, a candidate's ``seconds``...); a service
records them with the fit (metrics, report). Older artifacts that hold them still load.
"""

from __future__ import annotations

import io
import json
import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .exceptions import SerializationError, VecbridgeError

__all__ = ["META_KEY", "json_default", "pack_npz", "unpack_npz", "pack", "unpack", "save_atomic", "read_bytes", "check_header",
           "stored_fields", "StoredMap", "VOLATILE_KEYS", "stable_metadata"]

META_KEY = "__meta__"
#: metadata keys that vary between two runs of the same fit (wall-clock seconds, the executor that ran it):
#: kept in memory, never written into an artifact (module docstring)
VOLATILE_KEYS = frozenset({"seconds", "fit_seconds", "timings", "executor"})


def json_default(obj):
    """``json.dumps`` hook for numpy scalars and arrays."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def stable_metadata(obj):
    """``obj`` (metadata: dicts, lists, values) without the :data:`VOLATILE_KEYS` of any dict in it, at any depth;
    a new object (``obj`` is not changed)."""
    if isinstance(obj, dict):
        return {k: stable_metadata(v) for k, v in obj.items() if k not in VOLATILE_KEYS}
    if isinstance(obj, (list, tuple)):
        return [stable_metadata(v) for v in obj]
    return obj


def header_text(header: dict) -> str:
    """The JSON of an artifact's header, its ``metadata`` without timings or executor (:func:`stable_metadata`);
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


def unpack_npz(data: bytes, what: str = "npz artifact") -> tuple[dict, dict]:
    """Inverse of :func:`pack_npz`: ``(arrays, header)``; SerializationError on anything else (bytes that are not a
    zip at all say so, instead of numpy's guess that they are pickled data)."""
    if bytes(data[:2]) != b"PK":
        raise SerializationError(f"not a vecbridge {what}: not an npz (a zip) archive "
                                 f"({len(data)} bytes starting {bytes(data[:8])!r})")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        header = json.loads(arrays.pop(META_KEY).tobytes().decode("utf-8"))
    except Exception as exc:
        raise SerializationError(f"cannot read {what}: {exc}") from None
    return arrays, _header_object(header)


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


def unpack(data: bytes, what: str = "artifact") -> tuple[dict, dict]:
    """Inverse of :func:`pack` (format detected from the bytes): ``(arrays, header)``; SerializationError otherwise."""
    try:
        if data[:2] == b"PK":  # zip container: npz
            return unpack_npz(data, what)
        n = int.from_bytes(data[:8], "little")
        if len(data) < 10 or 8 + n > len(data) or data[8:9] != b"{":  # safetensors: u64 length, then a JSON header
            raise SerializationError(f"not a vecbridge {what}: neither npz (a zip) nor safetensors "
                                     f"({len(data)} bytes starting {bytes(data[:8])!r})")
        from safetensors.numpy import load

        meta = (json.loads(data[8 : 8 + n].decode("utf-8")).get("__metadata__") or {}).get(META_KEY)
        if meta is None:
            raise SerializationError(f"not a vecbridge {what}: a safetensors file without vecbridge's "
                                     f"{META_KEY!r} metadata")
        return load(data), _header_object(json.loads(meta))
    except SerializationError:
        raise
    except Exception as exc:
        raise SerializationError(f"cannot read {what}: {exc}") from None


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


def read_bytes(path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise SerializationError(f"cannot read {path}: {exc}") from None


class StoredMap:
    """``from_bytes`` / ``save`` / ``load`` for a map class with ``to_bytes(format)`` and
    ``_from_arrays(arrays, header)`` (LinearMap, ClusterMap, MapChain: one implementation for all).

    A map caches the constants of its fused apply (``_fused``) on first use; assigning any attribute drops them,
    so ``m.W = W2`` takes effect (it applied the old W). An array changed in place gives undefined results (a
    ClusterMap applies its ``W`` in place but keeps ``mu_s W_j`` from the old one): assign new arrays."""

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)
        if name != "_fused":
            self.__dict__.pop("_fused", None)

    @classmethod
    def from_bytes(cls, data: bytes):
        """Read what :meth:`to_bytes` wrote (npz or safetensors, told apart by the bytes); SerializationError otherwise."""
        return cls._from_arrays(*unpack(data, f"{cls.__name__} artifact"))

    def save(self, path, format: str | None = None) -> Path:
        """Write atomically to ``path`` (format from the suffix unless given)."""
        path = Path(path)
        return save_atomic(path, self.to_bytes(format or ("safetensors" if path.suffix == ".safetensors" else "npz")))

    @classmethod
    def load(cls, path):
        """Read a map written by :meth:`save`."""
        return cls.from_bytes(read_bytes(path))
