"""On-disk format of one index: generations, meta, crash-safe write and read.

``root/<name>/meta.json`` names the current generation ``g``. A generation is a **snapshot**
(``index.<b>.faiss`` + ``payloads.<b>.json``, the whole index at generation ``b``) followed by a
**log** of the changes made since, one file per generation: ``delta.<g>.npz`` holds one add (ids,
the prepared rows, their payloads) or one delete (ids). The meta names the snapshot (``base``) and
the log (``log``: ``[[generation, rows], ...]``), so a reader loads the snapshot and replays the log
(:func:`read_generation`), and a process that already holds generation ``g' >= base`` of the same
snapshot replays only the deltas after ``g'`` (:func:`read_deltas`). A small add to an index of
millions of rows therefore writes the added rows, not the index, and other processes catch up by
reading them; a change that would make the log longer than :func:`log_fits` allows (a quarter of
the snapshot's rows, at least 1,024 rows, at most 64 files) writes a new snapshot instead, so the
log costs at most a constant factor per row over time.

Every file is written to a temporary name, fsynced and renamed first, and ``meta.json`` is
replaced atomically last (then the folder is fsynced), so a crash leaves the previous generation
readable. The files the two metas before the current one name are kept for readers that read an
older meta and are still loading (``recent_bases``); older ones are removed by the next writer.
Files are immutable once a meta names them, so readers need no lock. Nothing is pickled.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import faiss
import numpy as np

from align.exceptions import InputError

from ..limits import MAX_ID, check_dim, check_index_params
from ..storage import atomic_write, fsync_dir
from .errors import NewerFormatError, UnreadableGenerationError
from .kinds import METRICS, add_rows, add_seed, check_name, tombstone_slots
from .locking import stat_sig
from .room import read_with_room

__all__ = ["FORMAT", "FORMAT_VERSION", "LOAD_ATTEMPTS", "LOCK_FILE", "SEEDED_LOG", "STORE_LOCK", "Delta",
           "apply_delta", "check_meta", "collect_generations", "generation_files", "log_fits", "log_of", "log_rows",
           "missed", "not_read", "open_generation", "params_of", "read_current", "read_deltas", "read_generation",
           "read_meta", "seed_of_meta", "snapshot_wanted", "stored_params", "uid_of", "with_current",
           "write_generation"]

#: Index parameters used only while the index is built (IVF's k-means sample). The meta keeps them under ``build``,
#: apart from ``params``: releases before them check ``params`` strictly (unknown keys refused) and would refuse to
#: load an index that has one, so a rolling upgrade (old and new processes on one data dir) or a downgrade would lose
#: every new IVF index. ``params_of`` puts them back for display.
BUILD_ONLY_PARAMS = ("train_rows",)

FORMAT = "vecbridge.SpaceIndex"
FORMAT_VERSION = 3  # 3: snapshot + log (base, log, base_rows, recent_bases); 2: HNSW tombstones as slots
KEEP_OLD_GENERATIONS = 2  # the files of this many metas before the current one stay for readers still loading
LOG_MIN_ROWS = 1024  # the log may always hold this many rows ...
LOG_SHARE = 0.25  # ... or this share of the snapshot's rows, whichever is more
LOG_MAX_FILES = 64  # at most this many deltas to replay on load
LOG_MAX_HNSW_ADD = 8192  # a logged HNSW add inserts on one thread (kinds.add_rows): larger ones write a snapshot
_DELTA_KEYS = {"op", "ids", "rows", "payloads"}
#: meta.json's mark that the HNSW adds of its log were seeded with ``add_seed(random_state, generation)``: every
#: snapshot this release writes sets it (its log starts empty), and a logged add keeps it. Earlier releases seeded
#: them with the generation alone and write metas without it (they ignore a top-level key they do not know, and
#: drop it when they write), so a log of theirs is replayed with the generation, as it was written. (Not a mark in
#: each delta: every release refuses a delta with an array beyond :data:`_DELTA_KEYS` as damaged.)
SEEDED_LOG = "seeded_log"
SNAPSHOT_WANTED = "snapshot-wanted"  # root/<name>/snapshot-wanted: a reader met a damaged file (see read_generation)
LOAD_ATTEMPTS = 8
LOCK_FILE = ".lock"  # root/<name>/.lock: the cross-process writer lock of one index
STORE_LOCK = ".store.lock"  # root/.store.lock: create and drop
T = TypeVar("T")


def uid_of(meta: dict) -> str:
    """Identity of one index's life (a dropped and re-created index has another); older metas lack ``uid``."""
    return str(meta.get("uid") or f"created:{meta['created_at']!r}")


def log_of(meta: dict) -> tuple[int, list[tuple[int, int]]]:
    """``(base, log)`` of a meta: the snapshot's generation and ``[(generation, rows), ...]`` after it.

    Metas before format 3 name a snapshot only (``base == generation``, empty log). ``InputError`` when
    the log does not lead from the snapshot to the meta's generation in increasing steps.
    """
    try:
        gen = int(meta["generation"])
        if "base" not in meta:
            return gen, []
        base, log = int(meta["base"]), [(int(g), int(n)) for g, n in meta["log"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"meta.json: bad generation, base or log ({exc})") from None
    gens = [base] + [g for g, _ in log]
    if any(b <= a for a, b in itertools.pairwise(gens)) or gens[-1] != gen or any(n < 0 for _, n in log):
        raise InputError(f"meta.json: log {log} after snapshot {base} does not lead to generation {gen}")
    return base, log


def log_rows(base_rows: int) -> int:
    """Rows the log of a snapshot of ``base_rows`` rows may hold in all: ``max(1024, base_rows / 4)``."""
    return max(LOG_MIN_ROWS, int(LOG_SHARE * base_rows))


def log_fits(log: list[tuple[int, int]], base_rows: int, kind: str, rows: int) -> bool:
    """Whether a change of ``rows`` rows may go to the log (else the writer writes a snapshot)."""
    if len(log) >= LOG_MAX_FILES or (kind == "hnsw" and rows > LOG_MAX_HNSW_ADD):
        return False
    return sum(n for _, n in log) + rows <= log_rows(base_rows)


@dataclass
class Delta:
    """One logged change: ``op`` "add" (``ids`` (n,) int64, ``rows`` (n, d) float32 prepared, ``payloads``
    ``{id: JSON}``) or "delete" (``ids``); ``generation`` is the one it made."""

    generation: int
    op: str
    ids: np.ndarray
    rows: np.ndarray | None = None
    payloads: dict[int, Any] | None = None


def _write_npz(tmp: Path, arrays: dict) -> None:
    with open(tmp, "wb") as fh:
        np.savez(fh, **arrays)


def write_delta(path: Path, delta: Delta) -> None:
    """Write ``delta.<generation>.npz`` (plain arrays: the payloads as UTF-8 JSON bytes; nothing pickled)."""
    arrays: dict[str, np.ndarray] = {"op": np.array(delta.op), "ids": np.asarray(delta.ids, np.int64)}
    if delta.rows is not None:
        arrays["rows"] = np.asarray(delta.rows, np.float32)
    if delta.payloads:
        blob = json.dumps([[i, p] for i, p in delta.payloads.items()]).encode("utf-8")
        arrays["payloads"] = np.frombuffer(blob, np.uint8)
    atomic_write(path / f"delta.{delta.generation}.npz", lambda tmp: _write_npz(tmp, arrays))


def read_delta(path: Path, gen: int, rows: int, dim: int, fh: BinaryIO | None = None) -> Delta:
    """Read and check ``delta.<gen>.npz`` (``rows`` ids, ``dim``-wide rows); ``InputError`` when it is damaged.

    ``fh``: the file, opened already (it is read here). Raises ``FileNotFoundError`` when it was already
    collected (a newer snapshot exists: read the meta again).
    """
    if fh is None:
        with open(path / f"delta.{gen}.npz", "rb") as own:
            data = own.read()
    else:
        data = fh.read()
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            if not set(z.files) <= _DELTA_KEYS or not {"op", "ids"} <= set(z.files):
                raise ValueError(f"unexpected arrays {sorted(z.files)}")
            arrays = {k: z[k] for k in z.files}
        op, ids = str(arrays["op"]), arrays["ids"]
        if op not in ("add", "delete") or ids.dtype != np.int64 or ids.shape != (rows,):
            raise ValueError(f"op {op!r}, ids {ids.dtype} {ids.shape} where the meta says {rows} rows")
        if ids.size and not (0 <= ids.min() and ids.max() < MAX_ID):
            raise ValueError("ids outside 0..2**62 - 1")
        out = Delta(gen, op, ids)
        if op == "add":
            X = arrays.get("rows")
            if X is None or X.dtype != np.float32 or X.shape != (rows, dim) or not np.isfinite(X).all():
                raise ValueError(f"rows must be finite float32 ({rows}, {dim})")
            out.rows = X
            blob = arrays.get("payloads")
            pairs = json.loads(blob.tobytes().decode("utf-8")) if blob is not None else []
            out.payloads = {int(i): p for i, p in pairs}
            if not set(out.payloads) <= set(ids.tolist()):
                raise ValueError("payloads of ids the delta does not add")
    except (OSError, ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}/delta.{gen}.npz is damaged: {exc}") from None
    return out


def apply_delta(index, kind: str, payloads: dict[int, Any], delta: Delta, random_state: int = 0) -> None:
    """Replay ``delta`` onto ``index`` and ``payloads`` (in place); ``random_state``: :func:`seed_of_meta` of the
    meta whose log holds it (an HNSW add is reseeded with :func:`~.kinds.add_seed` of it, as the writer was). HNSW
    deletes change only the tombstones, which the meta lists; the other kinds remove the rows."""
    if delta.op == "add":
        add_rows(index, kind, np.ascontiguousarray(delta.rows), delta.ids,
                 seed=add_seed(random_state, delta.generation))
        payloads.update(delta.payloads or {})
        return
    if kind != "hnsw" and delta.ids.size:
        index.remove_ids(delta.ids)
    for i in delta.ids.tolist():
        payloads.pop(i, None)


def read_deltas(path: Path, meta: dict, after: int) -> list[Delta]:
    """The deltas ``meta``'s log holds after generation ``after``, read and checked (nothing applied yet)."""
    _, log = log_of(meta)
    with _reading(path):
        return [read_delta(path, g, n, int(meta["dim"])) for g, n in log if g > after]


@contextmanager
def _reading(path: Path) -> Iterator[None]:
    """Mark the index :data:`SNAPSHOT_WANTED` when a read fails on a damaged file (not a collected one).

    A damaged delta (a failing disk, a copy gone wrong) would keep every later generation of the same
    snapshot unreadable to every process but the writer, which holds the rows in memory; the marker makes
    the next write a snapshot (:func:`snapshot_wanted`), which heals them all.
    """
    try:
        yield
    except FileNotFoundError:
        raise
    except Exception:
        try:
            (path / SNAPSHOT_WANTED).touch()
        except OSError:  # a read-only copy: nothing to ask
            pass
        raise


def snapshot_wanted(path: Path) -> bool:
    """Whether a reader asked for a snapshot (one ``stat``)."""
    return (path / SNAPSHOT_WANTED).exists()


def read_meta(path: Path) -> dict:
    meta = json.loads((path / "meta.json").read_text())
    if meta.get("format") != FORMAT:
        raise InputError(f"{path} is not a vecbridge index")
    if not isinstance(meta.get("format_version", 1), int) or meta.get("format_version", 1) > FORMAT_VERSION:
        raise NewerFormatError(f"{path} was written by a newer vecbridge (index format "
                               f"{meta.get('format_version')!r}; this one reads up to {FORMAT_VERSION}): upgrade "
                               f"every process of this data dir")
    return meta


def generation_files(meta: dict) -> list[str]:
    """Names of the files the generation ``meta`` names: its log's deltas, then the snapshot's index and payloads.

    Immutable once a meta names them (each written to a temporary name and renamed, never changed in
    place): a copy may share them (hard links) and still hold that generation when writers move on.
    """
    base, log = log_of(meta)
    return [f"delta.{g}.npz" for g, _ in log] + [f"index.{base}.faiss", f"payloads.{base}.json"]


@contextmanager
def open_generation(path: Path, meta: dict) -> Iterator[dict[str, BinaryIO]]:
    """Every file of the generation ``meta`` names (:func:`generation_files`), opened before any is read.

    A writer's garbage collection after this does not matter (the open files stay readable); one that came
    before raises ``FileNotFoundError`` here: a newer meta exists, read it again (:func:`with_current`).
    """
    with ExitStack() as files:
        yield {name: files.enter_context(open(path / name, "rb")) for name in generation_files(meta)}


def read_generation(path: Path, meta: dict) -> tuple[Any, dict[int, Any]]:
    """The FAISS index and payloads of the generation ``meta`` names: its snapshot with its log replayed.

    Raises ``FileNotFoundError`` when a file was already garbage-collected (a newer meta exists:
    read it again). Every file is opened before any is read (:func:`open_generation`).
    """
    with open_generation(path, meta) as files:
        return _read_open(path, meta, files)


def _read_open(path: Path, meta: dict, files: dict[str, BinaryIO]) -> tuple[Any, dict[int, Any]]:
    """Read the generation ``meta`` names from its open ``files``. The deltas are read (and checked) one at a
    time after the snapshot, each replayed before the next is read: a log of 64 holds up to a quarter of the
    snapshot's rows, which reading them all first kept in memory beside the snapshot. A snapshot is read with room
    for :func:`log_rows` more rows (:mod:`.room`; IVF: each list for its share), so neither this replay nor the
    adds a writer logs after it copy the rows FAISS holds."""
    base, log = log_of(meta)
    with _reading(path):
        index = read_with_room(files[f"index.{base}.faiss"], meta["kind"], log_rows)
        payloads = {int(i): p for i, p in json.loads(files[f"payloads.{base}.json"].read())}
    for g, n in log:
        fh = files[f"delta.{g}.npz"]
        with _reading(path):
            delta = read_delta(path, g, n, int(meta["dim"]), fh)
        apply_delta(index, meta["kind"], payloads, delta, seed_of_meta(meta))
        fh.close()
    return index, payloads


def with_current(path: Path, fn: Callable[[dict, dict[str, BinaryIO]], T]) -> tuple[tuple | None, dict, T]:
    """``(meta_sig, meta, fn(meta, files))`` for the generation ``path/meta.json`` names, ``files`` its open files.

    The one read protocol of readers that need no lock (a load, a backup): read the meta, open every file it
    names (:func:`open_generation`), and read the meta again when a writer collected one meanwhile, up to
    :data:`LOAD_ATTEMPTS` times. ``FileNotFoundError`` when ``meta.json`` itself is gone (the index was dropped).
    """
    misses: set = set()
    for _ in range(LOAD_ATTEMPTS):
        sig = stat_sig(path / "meta.json")
        meta = read_meta(path)
        try:
            with open_generation(path, meta) as files:
                return sig, meta, fn(meta, files)
        except FileNotFoundError as exc:
            misses.add(missed(path, sig, exc))
    raise not_read(path, misses)


def missed(path: Path, sig: tuple | None, exc: FileNotFoundError) -> tuple:
    """What one failed read of the generation whose ``meta.json`` had :func:`stat_sig` ``sig`` tells
    :func:`not_read`: ``(sig, meta.json's signature now, the missing file's name)``."""
    return sig, stat_sig(path / "meta.json"), Path(exc.filename or "?").name


def not_read(path: Path, misses: set) -> Exception:
    """The error of :data:`LOAD_ATTEMPTS` reads of index ``path`` that each missed a file (:func:`missed`).

    A writer collects only the files of metas two generations back, so a file missing at every try while one
    ``meta.json`` (one signature: every meta has its own) named it is gone, not collected under a reader:
    :class:`UnreadableGenerationError` naming it (exit 2, 503). It read "generations changed faster than they could
    be read" (an internal error, exit 3 from ``vecbridge backup``). Different metas: a writer outran the reader."""
    if len(misses) == 1:
        (sig, now, name), = misses
        if sig is not None and sig == now:
            return UnreadableGenerationError(
                f"index {path.name!r}: its file {name} is missing (meta.json names it; {path / name}): restore "
                f"the index from a backup, or `vecbridge index drop {path.name}` and create it again")
    return RuntimeError(f"index at {path}: generations changed faster than they could be read")


def read_current(path: Path) -> tuple[dict, Any, dict[int, Any], tuple | None]:
    """``(meta, index, payloads, meta_sig)`` of the generation ``path/meta.json`` names, checked.

    Retries when a writer moves on meanwhile (the generation read was collected).
    """
    sig, meta, (index, payloads) = with_current(path, lambda m, files: _read_open(path, m, files))
    check_meta(path, meta, index)
    return meta, index, payloads, sig


def stored_params(params: dict) -> dict:
    """The meta fields holding ``params``: ``{"params": ..., "build": ...}`` (``build`` only when some are
    :data:`BUILD_ONLY_PARAMS`)."""
    build = {k: v for k, v in params.items() if k in BUILD_ONLY_PARAMS}
    return {"params": {k: v for k, v in params.items() if k not in BUILD_ONLY_PARAMS}, **({"build": build} if build
                                                                                           else {})}


def seed_of_meta(meta: dict) -> int:
    """The seed the HNSW adds of ``meta``'s log were written with (:func:`~.kinds.add_seed` of it): the meta's
    ``params.random_state`` when it has :data:`SEEDED_LOG`, else 0 (an earlier release's log: ``add_seed(0, g)`` is
    the generation ``g``). A bad one counts as 0 here: the deltas are replayed before :func:`check_meta`, which
    refuses it."""
    params = meta.get("params") if meta.get(SEEDED_LOG) is True else None
    seed = params.get("random_state", 0) if isinstance(params, dict) else 0
    return seed if type(seed) is int else 0


def params_of(meta: dict) -> dict:
    """An index's parameters as given at creation: the meta's ``params`` with its ``build`` ones."""
    return {**meta["params"], **(meta.get("build") or {})}


def check_meta(path: Path, meta: dict, index) -> None:
    """Refuse a persisted index whose parameters FAISS would crash on (written by an older version, or edited).

    The same rules as at creation (:func:`service.limits.check_index_params`); raises InputError.
    """
    try:
        check_name(meta["name"])
        if meta["metric"] not in METRICS:
            raise InputError(f"metric {meta['metric']!r} is not one of {METRICS}")
        dim = check_dim(meta["dim"])
        params = params_of(meta)
        check_index_params(meta["kind"], params, dim=dim, random_state=params.pop("random_state", 0))
        if int(index.d) != dim:
            raise InputError(f"the FAISS file holds {index.d}-d rows, the meta says {dim}")
        next_id = int(meta.get("next_id", 0))
        if not 0 <= next_id <= MAX_ID:
            raise InputError(f"next_id {next_id} is outside 0..2**62")
        log_of(meta)
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


def _write_meta(path: Path, meta: dict) -> None:
    """Replace ``meta.json`` atomically, stamped with a modification time no earlier meta of this index had.

    Other processes notice a new generation by :func:`stat_sig` (device, inode, size, mtime). Every meta is a
    new file renamed over the old one, but the file system hands the freed inode out again (ext4: two
    generations later), and before Linux 6.13 file times advance once per timer tick (1-10 ms): two quick
    writes with metas of one size could leave a signature unchanged, and another process on the older
    generation. An explicit stamp of ``max(now, previous + 1 ns)`` (stored exactly, whatever the clock's
    granularity; the caller holds the writer lock) makes every meta's signature new.
    """
    before = stat_sig(path / "meta.json")
    stamp = time.time_ns() if before is None else max(time.time_ns(), before[3] + 1)

    def write(tmp: Path) -> None:
        tmp.write_bytes(json.dumps(meta).encode("utf-8"))
        os.utime(tmp, ns=(stamp, stamp))

    atomic_write(path / "meta.json", write)


def write_generation(path: Path, index, payloads: dict[int, Any], meta: dict, delta: Delta | None = None
                     ) -> tuple | None:
    """Persist generation ``meta["generation"]`` under ``path``; returns the new meta's :func:`stat_sig`.

    With ``delta`` only ``delta.<g>.npz`` is written (``meta``'s log ends with it); without, a snapshot of
    ``index`` and ``payloads`` (``meta``'s base is ``g``). Caller holds the index's writer lock. Data files
    first, ``meta.json`` last (the commit point), then the folder is fsynced.
    """
    path.mkdir(parents=True, exist_ok=True)
    gen = int(meta["generation"])
    for stale in path.glob(".*.tmp-*"):  # left by a writer that died; the caller holds the writer lock
        stale.unlink(missing_ok=True)
    if delta is not None:
        write_delta(path, delta)
    else:
        atomic_write(path / f"index.{gen}.faiss", lambda tmp: _write_index_file(index, tmp))
        _write_json(path / f"payloads.{gen}.json", [[i, p] for i, p in payloads.items()])
    _write_meta(path, meta)  # the commit point
    fsync_dir(path)
    if delta is None:
        (path / SNAPSHOT_WANTED).unlink(missing_ok=True)  # asked before this snapshot: answered
    return stat_sig(path / "meta.json")


def collect_generations(path: Path, meta: dict) -> None:
    """Remove the files no meta among ``meta`` and the :data:`KEEP_OLD_GENERATIONS` before it names.

    Those metas replay logs after their snapshots, the oldest of which is ``min(meta["recent_bases"])``:
    snapshots before it and deltas up to it are not needed. Nor is a snapshot none of them is based on, nor a
    delta past ``meta``'s generation: files of a generation a writer wrote and never committed (killed before its
    meta: a ``vecbridge index compact`` or a snapshot-sized add, a whole copy of the index each), which no meta
    names and none will (the caller holds the writer lock; a later snapshot of that number overwrites them).
    """
    bases = {int(b) for b in meta.get("recent_bases") or [log_of(meta)[0]]}
    oldest, gen = min(bases), int(meta["generation"])
    for old in path.glob("*.*.*"):
        parts = old.name.split(".")
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        n = int(parts[1])
        if n < oldest or (parts[0] == "delta" and (n <= oldest or n > gen)) or (
                parts[0] in ("index", "payloads") and n not in bases):
            old.unlink(missing_ok=True)
