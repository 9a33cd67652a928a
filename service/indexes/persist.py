"""On-disk format of one index: generations, meta, crash-safe write and read.

``root/<name>/meta.json`` names the current generation; ``index.<gen>.faiss`` and
``payloads.<gen>.json`` are written to temporary names, fsynced and renamed first, and
``meta.json`` is replaced atomically last (then the folder is fsynced), so a crash leaves the
previous generation readable. The two generations before the current one are kept for readers
that read an older meta and are still loading; older ones are removed by the next writer.
Generation files are immutable once a meta names them, so readers need no lock. Nothing is
pickled.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import faiss

from align.exceptions import InputError

from ..limits import MAX_ID, check_dim, check_index_params
from ..storage import atomic_write, fsync_dir
from .kinds import METRICS, check_name, tombstone_slots
from .locking import stat_sig

__all__ = ["FORMAT", "LOCK_FILE", "STORE_LOCK", "LOAD_ATTEMPTS", "uid_of", "read_meta", "read_generation",
           "read_current", "check_meta", "write_generation", "collect_generations"]

FORMAT = "vecbridge.SpaceIndex"
KEEP_OLD_GENERATIONS = 2  # kept for readers that read an older meta and are still loading
LOAD_ATTEMPTS = 8
LOCK_FILE = ".lock"  # root/<name>/.lock: the cross-process writer lock of one index
STORE_LOCK = ".store.lock"  # root/.store.lock: create and drop


def uid_of(meta: dict) -> str:
    """Identity of one index's life (a dropped and re-created index has another); older metas lack ``uid``."""
    return str(meta.get("uid") or f"created:{meta['created_at']!r}")


def read_meta(path: Path) -> dict:
    meta = json.loads((path / "meta.json").read_text())
    if meta.get("format") != FORMAT:
        raise InputError(f"{path} is not a vecbridge index")
    return meta


def read_generation(path: Path, meta: dict) -> tuple[Any, dict[int, Any]]:
    """The FAISS index and payloads of the generation ``meta`` names.

    Raises ``FileNotFoundError`` when the generation was already garbage-collected (a newer
    meta exists: read it again). Both files are opened before either is read, so a removal
    during the read does not matter.
    """
    gen = int(meta["generation"])
    with open(path / f"index.{gen}.faiss", "rb") as fi, open(path / f"payloads.{gen}.json", "rb") as fp:
        index = faiss.read_index(faiss.PyCallbackIOReader(fi.read))
        payloads = {int(i): p for i, p in json.loads(fp.read())}
    return index, payloads


def read_current(path: Path) -> tuple[dict, Any, dict[int, Any], tuple | None]:
    """``(meta, index, payloads, meta_sig)`` of the generation ``path/meta.json`` names, checked.

    Retries when a writer moves on meanwhile (the generation read was collected).
    """
    for _ in range(LOAD_ATTEMPTS):
        sig = stat_sig(path / "meta.json")
        meta = read_meta(path)
        try:
            index, payloads = read_generation(path, meta)
        except FileNotFoundError:
            continue
        check_meta(path, meta, index)
        return meta, index, payloads, sig
    raise RuntimeError(f"index at {path}: generations changed faster than they could be read")


def check_meta(path: Path, meta: dict, index) -> None:
    """Refuse a persisted index whose parameters FAISS would crash on (written by an older version, or edited).

    The same rules as at creation (:func:`service.limits.check_index_params`); raises InputError.
    """
    try:
        check_name(meta["name"])
        if meta["metric"] not in METRICS:
            raise InputError(f"metric {meta['metric']!r} is not one of {METRICS}")
        dim = check_dim(meta["dim"])
        params = dict(meta["params"])
        check_index_params(meta["kind"], params, dim=dim, random_state=params.pop("random_state", 0))
        if int(index.d) != dim:
            raise InputError(f"the FAISS file holds {index.d}-d rows, the meta says {dim}")
        next_id = int(meta.get("next_id", 0))
        if not 0 <= next_id <= MAX_ID:
            raise InputError(f"next_id {next_id} is outside 0..2**62")
        tombstone_slots(index, meta["kind"], meta)
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"index at {path} refused: {exc}") from None


def _write_json(path: Path, obj) -> None:
    atomic_write(path, json.dumps(obj))


def _write_index_file(index, tmp: Path) -> None:
    """Serialise ``index`` into ``tmp`` through Python's file I/O.

    A failed write or close is then an ``OSError`` with its errno (ENOSPC, EROFS, EFBIG: a storage
    error, 503) like every other write of the data dir. FAISS's own path writer raises a bare
    ``RuntimeError`` (500) when a write fails and only prints when the final flush at close fails,
    so a file cut short by a full disk or a file-size limit would have been committed as a generation
    that no process can read again.
    """
    with open(tmp, "wb") as fh:
        faiss.write_index(index, faiss.PyCallbackIOWriter(fh.write))


def write_generation(path: Path, index, payloads: dict[int, Any], meta: dict) -> tuple | None:
    """Persist generation ``meta["generation"]`` under ``path``; returns the new meta's :func:`stat_sig`.

    Caller holds the index's writer lock. Data files first, ``meta.json`` last (the commit
    point), then the folder is fsynced.
    """
    path.mkdir(parents=True, exist_ok=True)
    gen = int(meta["generation"])
    for stale in path.glob(".*.tmp-*"):  # left by a writer that died; the caller holds the writer lock
        stale.unlink(missing_ok=True)
    atomic_write(path / f"index.{gen}.faiss", lambda tmp: _write_index_file(index, tmp))
    _write_json(path / f"payloads.{gen}.json", [[i, p] for i, p in payloads.items()])
    _write_json(path / "meta.json", meta)  # the commit point
    fsync_dir(path)
    return stat_sig(path / "meta.json")


def collect_generations(path: Path, gen: int) -> None:
    """Remove generation files older than ``gen - KEEP_OLD_GENERATIONS``."""
    for old in path.glob("*.*.*"):
        parts = old.name.split(".")
        if len(parts) == 3 and parts[1].isdigit() and int(parts[1]) < gen - KEEP_OLD_GENERATIONS:
            old.unlink(missing_ok=True)
