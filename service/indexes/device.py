"""Exact search of flat indexes on a torch device (a GPU): ``Settings.search_device``.

FAISS's own GPU build cannot serve every GPU: the PyPI ``faiss-gpu-cu12`` wheel carries kernels for compute
capability 8.0 only and aborts the process on a Hopper card (H100/H200; benchmarks/results/gpu_2026-12-04.md).
A flat index is one matrix product and a top-k, which torch runs on any card it supports, so the service keeps
FAISS as the index of record (files, adds, deletes, CPU searches of every kind) and, with ``search_device`` set
to ``cuda`` (or ``cuda:N``), searches **flat** indexes on that device:

    S = Q X^T          Q (b, d) prepared queries, X (n, d) the index's rows (unit rows for cosine), float32
    top-k of each row of S by score; slots -> ids through the index's id map

in blocks of queries so that ``b x n`` scores stay below :data:`BLOCK_SCORES` (1 GiB of float32). The result is
FAISS's: ``(S, I)`` with ``S`` (b, k) float32 and ``I`` (b, k) int64, missing results ``-FLT_MAX`` / ``-1``
when ``k`` exceeds the rows (``SpaceIndex.search`` then pads the scores with ``-inf``, as for any search).
Matrix products run in torch's default float32 (TF32 off unless the process turns it on): the same ids as FAISS
but for near-ties (scores within ~1e-6 may swap order).

The rows live on the device as a copy, made on the first search after a change (:class:`DeviceRows`, keyed by
the index object, its row count and the :class:`~service.indexes.space.SpaceIndex`'s change counter): a change
costs one upload (1M x 384 rows: 1.5 GB, ~0.1 s) on the next search, not per search. An index the card cannot
hold is searched by FAISS on the CPU (a warning says so). HNSW and IVF indexes (approximate by design) keep
searching on the CPU, as do CSLS hub estimates (``reconstruct``).
"""

from __future__ import annotations

import re
import threading

import faiss
import numpy as np

from align.exceptions import InputError

from ..logging import get_logger
from .kinds import slot_ids

__all__ = ["BLOCK_SCORES", "DeviceRows", "check_device", "device_in_use", "restore_device", "search_device",
           "use_device"]

BLOCK_SCORES = 1 << 28  # scores (float32) of one query block: b x n <= 2**28 (1 GiB)
_DEVICE_RE = re.compile(r"cpu|cuda(:\d{1,2})?")
_device = None  # torch.device of flat searches; None: FAISS on the CPU
_MISSING = np.float32(-np.finfo(np.float32).max)  # FAISS's score of a missing result (inner product)
_log = get_logger("indexes")


def check_device(name: str) -> str:
    """``name`` lower-cased when it is ``cpu``, ``cuda`` or ``cuda:N``; else ``ValueError`` naming the choices."""
    key = str(name).strip().lower()
    if not _DEVICE_RE.fullmatch(key):
        raise ValueError(f"search_device must be 'cpu', 'cuda' or 'cuda:N', got {name!r}")
    return key


def use_device(name: str, *, warm: bool = True) -> str:
    """Search flat indexes on ``name`` from now on in this process; returns the checked name.

    ``cpu``: FAISS (the default). ``cuda[:N]``: torch on that GPU; ``RuntimeError`` saying why when torch is
    not installed, sees no GPU or not that one: a server asked for a GPU refuses to start without it rather
    than serve slower than its operator planned. ``warm``: start the CUDA context and the matrix library now
    (a second or more), not in the first search, which may run on the event loop (a small search does).
    """
    global _device
    key = check_device(name)
    if key == "cpu":
        _device = None
        return "cpu"
    try:
        import torch
    except ImportError:
        raise RuntimeError(f"search_device={key!r} needs torch with CUDA (pip install torch); it is not "
                           "installed") from None
    if not torch.cuda.is_available():
        raise RuntimeError(f"search_device={key!r}: torch {torch.__version__} sees no CUDA device")
    device = torch.device(key)
    if (device.index or 0) >= torch.cuda.device_count():
        raise RuntimeError(f"search_device={key!r}: torch sees {torch.cuda.device_count()} CUDA device(s)")
    if warm:
        x = torch.ones((2, 2), device=device)
        torch.topk(x @ x.T, 1, dim=1).values.cpu()
    _device = device
    return key


def device_in_use():
    """The process's device as it is now (a ``torch.device``, or ``None``: FAISS), for :func:`restore_device`."""
    return _device


def restore_device(device) -> None:
    """Put back a device :func:`device_in_use` returned (no check, no warm-up: it was in use before)."""
    global _device
    _device = device


def search_device() -> str:
    """The device flat indexes are searched on: ``cpu`` or e.g. ``cuda:0 (NVIDIA H200)``."""
    if _device is None or _device.type != "cuda":
        return "cpu" if _device is None else str(_device)
    import torch

    index = _device.index if _device.index is not None else torch.cuda.current_device()
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"


class DeviceRows:
    """A flat index's rows on a torch device, searched exactly by inner product (module notes).

    ``device``: a torch device for this object alone (tests: ``"cpu"`` runs the same code on torch's CPU);
    default the process's :func:`use_device` one, and :meth:`search` answers ``None`` when that is off.
    """

    def __init__(self, device=None) -> None:
        self._own = device
        self._key: tuple | None = None
        self._rows = None  # torch (n, d) float32 on the device
        self._ids: np.ndarray | None = None  # (n,) int64: the id of each slot
        self._lock = threading.Lock()  # one upload at a time; searches share the uploaded copy
        self._too_big: tuple | None = None  # the key whose copy did not fit on the device (FAISS answers it)

    def device(self):
        if self._own is None:
            return _device
        import torch

        return torch.device(self._own)

    def _upload(self, index, key: tuple, device):
        """The device copy of ``index``'s rows for ``key`` (made now when the one held is older)."""
        with self._lock:
            if self._key != key:  # (the rows and their key are set and cleared together)
                import torch

                self._rows = None  # the old copy's memory is free before the new one is made
                flat = faiss.downcast_index(index.index)
                n, d = int(flat.ntotal), int(flat.d)
                xb = faiss.rev_swig_ptr(flat.get_xb(), n * d).reshape(n, d) if n else np.zeros((0, d), np.float32)
                # straight from FAISS's buffer to the device (no host copy of 1.5 GB); copy=True: never a view of it
                self._rows = torch.from_numpy(xb).to(device, copy=True)
                self._ids, self._key = slot_ids(index).copy(), key
            return self._rows, self._ids

    def search(self, index, version: int, Q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Top-``k`` of prepared queries ``Q`` (b, d) in ``index`` (``IndexIDMap2(IndexFlatIP)``) on the device:
        ``(S, I)`` as FAISS gives them, or ``None`` when no device is in use. ``version`` changes whenever the
        index's rows do (the caller holds its read lock, so they do not change meanwhile).

        Out of device memory (an index larger than the card holds beside the others): ``None`` as well, so FAISS
        answers on the CPU, with one warning per version of the index; the next change tries the device again.
        """
        device = self.device()
        if device is None:
            return None
        key = (id(index), int(index.ntotal), int(version))
        if key == self._too_big:
            return None
        import torch

        try:
            return self._search(index, key, device, Q, k)
        except torch.OutOfMemoryError as exc:
            with self._lock:
                self._rows = self._key = None
                self._too_big = key
            _log.warning("flat index searched on the CPU: out of device memory", extra={"fields": {
                "rows": int(index.ntotal), "dim": int(index.d), "device": str(device), "error": str(exc)[:200]}})
            return None

    def _search(self, index, key: tuple, device, Q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        import torch

        rows, ids = self._upload(index, key, device)
        n, b = rows.shape[0], Q.shape[0]
        S = np.full((b, k), _MISSING, np.float32)
        I = np.full((b, k), -1, np.int64)
        kk = min(k, n)
        if kk == 0 or b == 0:
            return S, I
        if Q.shape[1] != rows.shape[1]:
            raise InputError(f"queries have {Q.shape[1]} columns, the index {rows.shape[1]}")
        step = max(1, BLOCK_SCORES // n)
        with torch.no_grad():
            for s in range(0, b, step):
                q = torch.from_numpy(np.ascontiguousarray(Q[s:s + step], np.float32)).to(device)
                top = torch.topk(q @ rows.T, kk, dim=1, largest=True, sorted=True)
                S[s:s + step, :kk] = top.values.cpu().numpy()
                I[s:s + step, :kk] = ids[top.indices.cpu().numpy()]
        return S, I
