"""Vector-database migrations as one operation for every face: move a stored collection through a map.

(Fitting and gating the map itself is :mod:`service.ops.plans`; this module runs it over a
Milvus / PostgreSQL / Qdrant collection.)

``vecbridge migrate`` / ``vecbridge verify`` and ``python -m service.vectordb migrate`` parse their
arguments, call :func:`run_migration` / :func:`checkpoint_status` / :func:`service.ops.verify.run_verify`, and render
the result; the work itself is :func:`service.vectordb.migrate` and
:func:`service.vectordb.verify_migration`.

Interruption: while :func:`run_migration` runs, the first SIGINT (Ctrl-C), SIGTERM or SIGHUP asks the
migration to stop after the batch in flight (written and checkpointed), which then raises
:class:`~service.vectordb.MigrationInterrupted` (faces exit 128 + the signal with one line: 130, 143, 129); a
second signal stops at once (KeyboardInterrupt) — still safe, the resumed run rewrites at most one batch.

The HTTP service also searches a collection with queries of another space (:func:`search_collection`, the
query-side migration) through one :class:`SharedStore`; :mod:`service.ops.verify` checks a migrated collection.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from align.exceptions import InputError, VecbridgeError

from ..config import DEFAULT_ARTIFACTS
from ..errors import SIGNAL_WORDS, NotFoundError, exit_code
from ..registry.db import sqlite_path
from ..registry.errors import IntegrityError
from ..urls import safe_url
from ..vectordb import (
    Checkpoint,
    CheckpointMismatchError,
    CollectionNotFoundError,
    FileCheckpoint,
    MigrationInterrupted,
    MigrationProgress,
    MigrationReport,
    SpaceMismatchError,
    VectorStore,
    migrate,
    open_store,
)
from ..vectordb.base import UnknownWidthError
from ..vectordb.holder import holder_gone
from ..vectordb.keep import read_keep_ids, resume_words
from ..vectordb.lost import lost_as_unavailable
from ..vectordb.migrate import is_artifact_path, map_source_dim
from .migration_checks import (HTTP_CKPT, check_index, check_map_space, check_map_width, check_names,
                               check_source_fields, compare_as_resolved, is_postgres_url, map_spaces, resume_options)

__all__ = [
    "SharedStore",
    "check_artifact_folder",
    "checkpoint_status",
    "configured_url",
    "default_checkpoint",
    "describe_collection",
    "kept_by_migration",
    "list_checkpoints",
    "needs_registry",
    "open_store_for",
    "progress_record",
    "read_keep",
    "run_migration",
    "search_collection",
    "search_rows",
]


def open_store_for(url: str, *, index: str | None = None, id_field: str | None = None,
                   vector_field: str | None = None, text_field: str | None = None, api_key: str | None = None,
                   ca_file=None, index_wait_s: float | None = None) -> VectorStore:
    """Open the store at ``url`` with the field names given (None: the engine's defaults).

    ``api_key`` / ``ca_file``: a secured server's key and the CA its TLS certificate is checked against
    (:func:`service.vectordb.open_store`; the faces pass the ``vectordb_api_key`` / ``vectordb_ca_file`` settings).

    ``index``: ``hnsw`` | ``ivfflat`` | ``none`` | ``like`` (the migration source's own index), built on a
    PostgreSQL target when it is finalised (Milvus and Qdrant targets take the source's own: a migration refuses
    another kind first, :func:`~service.ops.migration_checks.check_index`). ``index_wait_s``: a PostgreSQL store's
    longest wait for another session's lock on the table it indexes (the ``vectordb_index_wait_s`` setting).
    """
    kw = {k: v for k, v in (("id_field", id_field), ("vector_field", vector_field), ("text_field", text_field))
          if v is not None}
    if index is not None:
        if index not in ("hnsw", "ivfflat", "none", "like"):
            raise InputError(f"--index must be hnsw, ivfflat, none or like, got {index!r}")
        if url.startswith(("postgresql://", "postgres://")):  # other engines index on their own: ignored
            kw["index"] = None if index == "none" else index
    if index_wait_s is not None and url.startswith(("postgresql://", "postgres://")):
        kw["index_wait_s"] = index_wait_s
    if api_key:
        kw["api_key"] = api_key
    if ca_file is not None:
        kw["ca_file"] = ca_file
    return open_store(url, **kw)


def default_checkpoint(data_dir, source: str, target: str) -> Path:
    """Where a migration records its progress unless told: ``data_dir/migrations/<source>-to-<target>.json``."""
    return Path(data_dir) / "migrations" / f"{source}-to-{target}.json"


def kept_by_migration(data_dir, source: str, target: str) -> int | None:
    """The size of the keep set (``migrate --keep-ids``) the migration of ``source`` into ``target`` was given, as its
    default checkpoint records it (``keep_rows``): 0 when it kept none; None when there is no such checkpoint to tell
    (another ``--checkpoint`` file, ``target`` an alias) or it cannot be read."""
    try:
        state = FileCheckpoint(default_checkpoint(data_dir, source, target)).load()
    except (VecbridgeError, OSError):
        return None
    return None if state is None else int(state.get("keep_rows") or 0)


def needs_registry(map_ref) -> bool:
    """True when ``map_ref`` is a registry reference rather than an artifact file."""
    return not is_artifact_path(map_ref)


class _StopOnSignal:
    """First SIGINT/SIGTERM/SIGHUP sets ``event``; the second raises KeyboardInterrupt (main thread only; an ignored
    signal, as ``nohup`` leaves SIGHUP, stays ignored). During ``store``'s finalize (the index build) the first also
    cancels it (:meth:`~service.vectordb.base.VectorStore.interrupt`), or says the run stops once it ends."""

    def __init__(self, store=None):
        self.event = threading.Event()
        self.signum: int | None = None  # the first signal: a face exits 128 + it (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP)
        self.store = store
        self._old = {}

    def _handler(self, signum, frame):
        if self.event.is_set():
            raise KeyboardInterrupt
        self.signum = signum
        self.event.set()
        if self.store is not None and self.store.finalizing and not self.store.interrupt():
            with contextlib.suppress(OSError, ValueError):  # a closed or hung-up stderr: the stop still comes
                sys.stderr.write("vecbridge: stopping once the index build ends (Ctrl-C again to abort)\n")
                sys.stderr.flush()

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc):
        for sig, h in self._old.items():
            signal.signal(sig, h)


#: how often a migration with an outside stop (``run_migration``'s ``cancelled``) looks at it while its index builds
CANCEL_POLL_S = 0.2


class _CancelWatch:
    """While a migration runs, a thread polls ``cancelled`` (a server job's cancel) during the target's finalize (the
    index build: ~85% of a pgvector migration, with no batch to stop after) and cancels it (``store.interrupt()``),
    as the CLI's signal handler does; a job cancelled there ran the build to its end and then succeeded."""

    def __init__(self, store, cancelled: Callable[[], bool] | None):
        self.store, self.cancelled = store, cancelled
        self.done = threading.Event()
        self.thread: threading.Thread | None = None

    def _watch(self) -> None:
        while not self.done.wait(CANCEL_POLL_S):
            if self.store.finalizing and self.cancelled():  # again while it lasts: one asked as a statement began
                self.store.interrupt()  # (between two, or before the build's) found nothing to cancel

    def __enter__(self):
        if self.cancelled is not None:
            self.thread = threading.Thread(target=self._watch, name="migration-cancel", daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        if self.thread is not None:  # a daemon: one stuck in a cancel (5 s at most) is not waited for after that
            self.thread.join(CANCEL_POLL_S + 10)


def run_migration(*, store_url: str, source: str, target: str, map_ref, checkpoint, registry=None,
                  alias: str | None = None, batch_size: int = 2000, overwrite: bool = False, pause: float = 0.0,
                  index: str | None = None, id_field: str | None = None, vector_field: str | None = None,
                  text_field: str | None = None, source_space: str | None = None, target_space: str | None = None,
                  progress: Callable[[MigrationProgress], None] | None = None, api_key: str | None = None,
                  ca_file=None, dry_run: bool = False, space_option: str = "--source-space", keep_ids=None,
                  keep_vectors=None, cancelled: Callable[[], bool] | None = None, data_dir=None,
                  registry_url: str | None = None, artifact_dir=None,
                  index_wait_s: float | None = None) -> MigrationReport:
    """Migrate ``source`` into ``target`` through ``map_ref`` (artifact path or registry ref), resumably.

    ``checkpoint``: a JSON file path (run the same call again to resume). ``pause``: seconds to
    sleep after each batch (spares a busy database). ``dry_run``: every check, one batch read and mapped,
    nothing written (see :func:`service.vectordb.migrate`). ``space_option``: how the face declares
    ``source_space`` (``--source-space``, ``source_space`` over HTTP), for the space check's messages. Raises
    the typed errors of :func:`service.vectordb.migrate`, and MigrationInterrupted on the first Ctrl-C / SIGTERM /
    SIGHUP (its ``signum`` says which). ``keep_ids`` / ``keep_vectors``: the rows re-embedded to fit the map, kept
    with their own vectors (files, :func:`service.vectordb.keep.read_keep_ids` and a vector file; or arrays; see
    :func:`service.vectordb.migrate`). ``cancelled``: a stop asked from outside (a server job's cancel), polled
    after each batch as a signal is, and while the target's index builds (every :data:`CANCEL_POLL_S`), which it
    cancels as a signal does (:meth:`~service.vectordb.base.VectorStore.interrupt`): MigrationInterrupted.
    ``data_dir``, ``registry_url``, ``artifact_dir``: the registry's (the face's settings; ``registry_url`` None:
    the data dir's SQLite file; ``artifact_dir`` None: the data dir's ``artifacts``), recorded with the options a
    resume must give again (:func:`checkpoint_status`'s ``resume``; folders and a SQLite file made absolute, the data
    dir's own artifact folder as None, the registry URL without its password, never the store's URL or key). A
    refused resume (other options, another keep set) names CLI flags, or the HTTP request's fields when
    ``space_option`` is one (``source_space``). ``index_wait_s``: a PostgreSQL target's longest wait for another
    session's build of its index (the setting ``vectordb_index_wait_s``; None: 60 s), then IndexBuildBusyError
    (exit 75) naming its pid.
    """
    if pause < 0:
        raise InputError(f"pause must be >= 0, got {pause}")
    json_fields = not space_option.startswith("--")  # a refusal names the request's fields, else the CLI's flags
    check_names(source, target, json_fields=json_fields)
    check_index(store_url, index, json_fields=json_fields)
    # the keep set's files (the CLI's), absolute, for the resume command; its digest is what a resume is checked by
    keep_files = {k: str(Path(v).resolve()) for k, v in (("keep_ids", keep_ids), ("keep_vectors", keep_vectors))
                  if isinstance(v, (str, Path))}
    keep_ids, keep_vectors = read_keep(keep_ids, keep_vectors, "keeping re-embedded rows")
    fields = {"id_field": id_field, "vector_field": vector_field, "text_field": text_field}
    ckpt = FileCheckpoint(checkpoint, options={
        **resume_options(alias=alias, index=index, **fields, source_space=source_space, target_space=target_space),
        **_recorded_folders(data_dir, artifact_dir), "registry_url": _recorded_registry(registry_url), **keep_files},
        json_fields=json_fields)
    store = open_store_for(store_url, index=index or "like", **fields, api_key=api_key, ca_file=ca_file,
                           index_wait_s=index_wait_s)
    # what each option left unset means on this engine: `--index like` recorded, a resume without --index is no
    # change (the engine's defaults, not this store's fields: a field the resume gave compared equal to itself)
    compare_as_resolved(ckpt, store)

    def on_batch(p: MigrationProgress) -> None:
        if progress is not None:
            progress(p)
        if pause > 0:
            time.sleep(pause)

    stop = _StopOnSignal(store)

    def should_stop() -> bool:
        return stop.event.is_set() or (cancelled is not None and cancelled())

    try:  # the database gone mid-run: exit 75 (retry later), one line; was exit 3, "internal"
        with lost_as_unavailable(store, "nothing was written: run the same command again"):
            check_source_fields(store, source, fields, json_fields=json_fields)  # as a request checks it
            # named as the face names it (--map), before the lock and the checkpoint are taken; the space first: a
            # map the wrong way round between spaces of different widths is that, not a map for another model
            check_map_space(store, source, source_space, str(map_ref), *map_spaces(map_ref, registry),
                            json_fields=json_fields)
            check_map_width(store, source, map_ref, map_source_dim(map_ref, registry), json_fields=json_fields)
        with stop, _CancelWatch(store, cancelled), lost_as_unavailable(
                store, "every batch written so far is checkpointed: run the same command again to resume"):
            return migrate(store, source, target, map_ref, registry=registry, alias=alias, batch_size=batch_size,
                           checkpoint=ckpt, progress=on_batch, overwrite=overwrite, source_space=source_space,
                           target_space=target_space, should_stop=should_stop, dry_run=dry_run,
                           space_option=space_option, keep_ids=keep_ids, keep_vectors=keep_vectors,
                           keep_words=resume_words(space_option))
    except IntegrityError as exc:  # the map's file: say which folder was read, and how to name another
        if type(exc) is not IntegrityError or registry is None or not str(exc).startswith("artifact "):
            raise
        raise IntegrityError(f"{exc}; {_artifact_folder_hint(registry, cli=space_option.startswith('--'))}") from None
    except CheckpointMismatchError as exc:  # its words name the CLI's --checkpoint, which HTTP has no field for
        if space_option.startswith("--") or "--checkpoint" not in str(exc):
            raise
        raise CheckpointMismatchError(str(exc).replace("pass --checkpoint FILE for this one", HTTP_CKPT).replace(
            "pass --checkpoint)", f"{HTTP_CKPT})")) from None
    except MigrationInterrupted as exc:
        exc.signum = stop.signum  # which signal stopped it: SIGTERM exited 130 as Ctrl-C does, not 143
        raise
    finally:
        store.close()


def _recorded_folders(data_dir, artifact_dir) -> dict:
    """``data_dir`` and ``artifact_dir`` as a checkpoint records them (absolute). The data dir's own artifact folder
    is None (:func:`_artifact_dir_of` reads it so): a release before ``vecbridge --artifact-dir`` refused to resume
    a checkpoint naming any (replicas of two releases on one data dir during an upgrade; a run keeping re-embedded
    rows records its keep files, which such a release still compares)."""
    data, art = (None if v is None else Path(v).expanduser().resolve() for v in (data_dir, artifact_dir))
    own = data is not None and art == (data / DEFAULT_ARTIFACTS).resolve()
    return {"data_dir": data and str(data), "artifact_dir": None if own or art is None else str(art)}


def check_artifact_folder(folder, map_ref, registry_url: str | None, *,
                          option: str = "vecbridge --artifact-dir DIR") -> None:
    """NotFoundError (exit 2) before a migration through the registry ``map_ref`` opens the registry, when its
    artifact ``folder`` is missing: opening it made an empty one there (a moved folder's old place, by a stopped
    run's resume command), and the run failed as "artifact 59/59d8... is missing or unreadable", naming no folder.
    A SQLite registry (``registry_url``) that is missing too is left to its own refusal (it names the data dir)."""
    db = sqlite_path(registry_url) if registry_url else None
    if folder is None or not needs_registry(map_ref) or Path(folder).is_dir() or (db is not None and not db.exists()):
        return
    raise NotFoundError(f"the artifact folder {Path(folder).resolve()} does not exist, so map {map_ref!r} cannot be "
                        f"read from it (nothing was created there): name the folder that holds the registry's map "
                        f"files with {option} or VECBRIDGE_ARTIFACT_DIR (a resume command names the stopped run's; "
                        "give the new place if it moved)")


def _artifact_folder_hint(registry, *, cli: bool) -> str:
    """Which artifact folder a migration read its map from, and how to name another: a server's as its setting only
    (clients are not told its paths, as in :mod:`service.registry.elsewhere`)."""
    root = getattr(getattr(registry, "store", None), "root", None)
    if not cli or root is None:
        return "read from the server's artifact folder (its VECBRIDGE_ARTIFACT_DIR or `vecbridge --artifact-dir`)"
    return (f"read from the artifact folder {root}: name the one that holds the registry's map files with "
            "`vecbridge --artifact-dir DIR` or VECBRIDGE_ARTIFACT_DIR")


def _recorded_registry(url: str | None) -> str | None:
    """The registry URL a checkpoint records for its resume command: a SQLite file's made absolute (the command may
    run in another directory), any other as :func:`~service.urls.safe_url` shows it (never its password)."""
    if url is None:
        return None
    path = sqlite_path(url)
    return safe_url(url) if path is None else f"sqlite:///{path.resolve()}"


def read_keep(keep_ids, keep_vectors, what: str) -> tuple:
    """``(ids, vectors)`` of a keep set given as files (the CLI's: :func:`service.vectordb.keep.read_keep_ids` and a
    vector file) or arrays (the HTTP body's, taken as they are); ``(None, None)`` for none. InputError naming
    ``what`` needs them when only one is given."""
    if (keep_ids is None) != (keep_vectors is None):
        raise InputError(f"{what} needs both their ids (--keep-ids) and their new-model vectors (--keep-vectors)")
    if isinstance(keep_ids, (str, Path)):
        keep_ids = read_keep_ids(keep_ids)
    if isinstance(keep_vectors, (str, Path)):
        from ..io import read_vectors

        # check_keep names NaN rows
        keep_vectors = read_vectors(keep_vectors, encoder_option=None, key_option=None, finite=False)
    return keep_ids, keep_vectors


def stopped_by(exc: MigrationInterrupted) -> tuple[str, int]:
    """``(word, exit code)`` of a migration a signal stopped, as every command exits: ``terminated`` 143 (SIGTERM),
    ``hung up`` 129 (SIGHUP), else ``interrupted`` 130 (Ctrl-C, or a stop asked another way)."""
    signum = getattr(exc, "signum", None)
    word = SIGNAL_WORDS.get(signum, "interrupted")
    return word, (128 + signum if signum else exit_code(exc))


def checkpoint_status(checkpoint, store_url: str | None = None, *, store_in_command: bool = False) -> dict:
    """What a checkpoint says (a file's path, or a :class:`~service.vectordb.Checkpoint`: a ``PgCheckpoint``, whose
    run is judged by its advisory lock from any host): rows done of total, last id, finished, ``state`` (running,
    stopped, interrupted or finished), the rate of the last run (its rows over its own time, not the time between
    runs) and, while it runs, the ETA at that rate (None once stopped: nothing is moving). ``holder``: the process
    the run records as writing it (pid, host, start time); a run that recorded no stop but is gone (kill -9, an OOM
    kill: the lock it held is free, :func:`_judged`) is ``interrupted``, ``why`` saying so ("process N is gone"; it
    read "running" for ever), and ``resume`` is the command that resumes it with the options the run recorded (None
    once finished, or of a checkpoint no command resumes), ``resume_note`` what that command cannot say itself. The
    keep set it was given (``migrate --keep-ids``, ``keep``), which a resume must give again: ``keep_rows`` (0:
    none), ``kept`` (rows written with their own vectors so far; None without a set) and ``keep_digest`` (its first
    12 hex digits, as a refused resume names it; None without a set). ``engine``: the store's engine the run
    records (``milvus``, ``pgvector``, ``qdrant``; None in a checkpoint of a release that recorded none): on Milvus or
    Qdrant the command leaves out an ``--index`` an older release recorded there (refused now, and ignored then).
    ``store_url``: the store the run is on where the caller knows it (``--store``, the configured one; only its scheme
    is read), which tells that of a checkpoint without ``engine``; ``store_in_command``: the resume command names it
    (the CLI's ``--status``, given the store by ``--store`` or the environment, as :func:`~service.urls.safe_url`
    shows it: a password ``***``, the note saying how to give it), else ``STORE`` (HTTP: a server's endpoints stay
    hidden; the checkpoint records no store)."""
    ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else FileCheckpoint(checkpoint)
    file = isinstance(ckpt, FileCheckpoint)
    # a file's path made absolute: the resume command (and a path copied from the status) may be run elsewhere
    where = ckpt.path.resolve() if file else f"{getattr(ckpt, 'key', '?')} in {getattr(ckpt, 'table', 'its table')}"
    state = ckpt.load()
    if state is None:
        raise InputError(f"no checkpoint at {where} (nothing started, or another --checkpoint)")
    state, now, why = _judged(ckpt, state)
    done, total = int(state.get("done", 0)), int(state.get("total", 0))
    started, updated = state.get("run_started_at") or state.get("started_at"), state.get("updated_at")
    rows = done - int(state.get("run_done_at_start") or 0)  # a checkpoint of 0.x: the runs together, as before
    rate = rows / (updated - started) if started and updated and updated > started else None
    eta = max(total - done, 0) / rate if now == "running" and rate else None
    return {"checkpoint": str(where), "source": state.get("source"), "target": state.get("target"),
            "done": done, "total": total, "fraction": round(done / total, 4) if total else 1.0,
            "batches": int(state.get("batches", 0)), "last_id": state.get("last_id"),
            "finished": bool(state.get("finished")), "state": now, "fields": state.get("fields", []),
            "rows_per_s": None if rate is None else round(rate, 1), "eta_s": None if eta is None else round(eta, 1),
            "updated_at": updated or state.get("finished_at"), "holder": state.get("holder"), "why": why,
            "engine": state.get("engine"),
            "resume": None if state.get("finished") or not file else _resume_command(
                state, where, store_url, store_in_command),
            "resume_note": None if state.get("finished") else _resume_note(state, file, store_url, store_in_command),
            **_keep_status(state)}


def _state_word(state: dict) -> str:
    return "finished" if state.get("finished") else "stopped" if state.get("stopped_at") else "running"


def _judged(ckpt: Checkpoint, state: dict) -> tuple[dict, str, str | None]:
    """``(state, state word, why)`` of :func:`checkpoint_status`. A run that recorded no end is judged by the lock it
    holds (:func:`~service.vectordb.holder.holder_gone`): its pid was judged alone, so a live run in another pid
    namespace on this host name (a container of the same pod) read "interrupted (process N is gone)". Found gone,
    the checkpoint is read again: a run that ended meanwhile recorded its end, one that started meanwhile its
    holder."""
    holder = state.get("holder")
    if _state_word(state) != "running":
        return state, _state_word(state), None
    held = ckpt.lock_held()
    # a lock the database holds answers for every host: free there, the run is gone wherever it ran
    gone = (not held) if held is not None and ckpt.lock_seen_everywhere else holder_gone(holder, held)
    if gone:
        again = ckpt.load() or state
        if again.get("holder") != holder or _state_word(again) != "running":
            return again, _state_word(again), None
        return state, "interrupted", (f"process {holder['pid']} is gone" if isinstance(holder, dict) and "pid" in holder
                                      else "no run holds its lock")
    if gone is None and isinstance(holder, dict) and holder.get("host") != socket.gethostname():
        return state, "running", f"process {holder.get('pid')} on host {holder.get('host')}, not checked from here"
    return state, "running", None


#: the options of ``vecbridge migrate`` a run records (:func:`run_migration`) that a resume must give again: a
#: killed ``--alias docs`` run resumed by the command without it finished and never switched the alias
RESUME_OPTIONS = {"alias": "--alias", "index": "--index", "id_field": "--id-field", "vector_field": "--vector-field",
                  "text_field": "--text-field", "source_space": "--source-space", "target_space": "--target-space"}


def _artifact_dir_of(opts: dict) -> str | None:
    """The artifact folder a run's recorded options say it used: ``artifact_dir``, or its data dir's own folder
    where the key is there as None (:func:`_recorded_folders`); None when not recorded (a release before it)."""
    if opts.get("artifact_dir"):
        return str(opts["artifact_dir"])
    if "artifact_dir" in opts and opts.get("data_dir"):
        return str(Path(opts["data_dir"]) / DEFAULT_ARTIFACTS)
    return None


def _on_postgres(state: dict, store_url: str | None) -> bool | None:
    """Whether the run is on PostgreSQL: by the engine its checkpoint records, else (a checkpoint of a release that
    recorded none) by the scheme of ``store_url``, the caller's store; None when neither tells."""
    if state.get("engine"):
        return state["engine"] == "pgvector"
    return None if not store_url else is_postgres_url(store_url)


def _index_of(state: dict, store_url: str | None) -> str | None:
    """The ``--index`` a resume gives: the recorded one, none on a store known not to be PostgreSQL's."""
    index = (state.get("options") or {}).get("index")
    return None if _on_postgres(state, store_url) is False else index


def _resume_command(state: dict, checkpoint, store_url: str | None = None, store_in_command: bool = False) -> str:
    """The ``vecbridge migrate`` command that resumes the migration a checkpoint records (HTTP runs too: the
    CLI resumes their checkpoints), with the options the run recorded; the store is the one it ran on: ``store_url``
    with ``store_in_command`` (its password ``***``), else ``STORE`` (not recorded: its URL may hold a password; the
    CLI's ``--status`` printed that word where it had been given the store), a keep set the same files (absolute;
    ``IDS``, ``VECTORS`` where the run was given arrays, as over HTTP). The registry: the ``--data-dir``,
    ``--artifact-dir`` and ``--registry-url`` the run used (the URL as :func:`~service.urls.safe_url` shows it, its
    password ``***``: :func:`_resume_note` says how to give it)."""
    opts = state.get("options") or {}
    words = ["vecbridge", *(["--data-dir", str(opts["data_dir"])] if opts.get("data_dir") else []),
             *(["--artifact-dir", art] if (art := _artifact_dir_of(opts)) else []),
             *(["--registry-url", str(opts["registry_url"])] if opts.get("registry_url") else []), "migrate",
             "--store", safe_url(store_url) if store_in_command and store_url else "STORE",
             "--source", str(state.get("source")), "--target", str(state.get("target")),
             "--map", str(state.get("map") or "MAP"), "--checkpoint", str(checkpoint)]
    opts = {**opts, "index": _index_of(state, store_url)}
    words += [w for key, flag in RESUME_OPTIONS.items() if opts.get(key) is not None for w in (flag, str(opts[key]))]
    if state.get("keep_digest"):
        words += ["--keep-ids", str(opts.get("keep_ids") or "IDS"), "--keep-vectors",
                  str(opts.get("keep_vectors") or "VECTORS")]
    return shlex.join(words)


def _resume_note(state: dict, file: bool = True, store_url: str | None = None,
                 store_in_command: bool = False) -> str | None:
    """What the resume command cannot say itself: the registry URL's password, which no checkpoint records, and the
    store URL's where the command names it; an
    ``--index`` kind recorded where the store is not known (a PostgreSQL target's option); of a checkpoint not in a
    file (:class:`~service.vectordb.PgCheckpoint`), that no command resumes it."""
    if not file:
        return "no vecbridge command resumes it: call service.vectordb.migrate again with the same checkpoint"
    notes = []
    if "***" in str((state.get("options") or {}).get("registry_url") or ""):
        notes.append("the registry URL's password is not recorded (***): give it in the PGPASSWORD environment "
                     "variable and remove the :*** (or password=***) from --registry-url, or leave --registry-url "
                     "out and set VECBRIDGE_REGISTRY_URL (or VECBRIDGE_REGISTRY_URL_FILE) to the whole URL")
    if store_in_command and store_url and safe_url(store_url) != str(store_url):
        notes.append("the store URL's password is not shown (***): give the whole URL in --store, or leave --store "
                     "out and set VECBRIDGE_VECTORDB_URL to it")
    if (index := _index_of(state, store_url)) not in (None, "like") and _on_postgres(state, store_url) is None:
        notes.append(f"--index {index} is for a PostgreSQL STORE: on a Milvus or Qdrant one leave it out (the "
                     "target takes the source's own index)")
    return "; ".join(notes) or None


def _keep_status(state: dict) -> dict:
    """``keep_rows``, ``kept`` and ``keep_digest`` of :func:`checkpoint_status`, from checkpoint ``state``."""
    digest = state.get("keep_digest")
    if not digest:  # a checkpoint written without a keep set (or before keep sets were recorded)
        return {"keep_rows": 0, "kept": None, "keep_digest": None}
    return {"keep_rows": int(state.get("keep_rows") or 0), "kept": int(state.get("kept") or 0),
            "keep_digest": str(digest)[:12]}


def list_checkpoints(data_dir, store_url: str | None = None) -> list[dict]:
    """:func:`checkpoint_status` of every migration recorded under ``data_dir/migrations`` (the default checkpoints
    of CLI and HTTP runs alike), each with ``name`` (the file's stem); one that cannot be read says why.
    ``store_url``: the store they ran on, where known (:func:`checkpoint_status`)."""
    folder = Path(data_dir) / "migrations"
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            status = checkpoint_status(path, store_url)
        except (VecbridgeError, InputError, OSError, ValueError) as exc:  # a damaged file: listed, not a failure
            status = {"checkpoint": str(path.resolve()), "error": str(exc)}
        out.append({"name": path.stem, **status})
    return out


def progress_record(p: MigrationProgress) -> dict:
    """The JSON line both faces print per batch: ``done``, ``total``, ``last_id``, ``rows_per_s``, ``stage``
    (``"migrate"``; ``"index"`` once, as the target's index build begins)."""
    return {"done": p.done, "total": p.total, "last_id": p.last_id, "rows_per_s": round(p.rows_per_s, 1),
            "stage": p.stage}


def configured_url(settings) -> str:
    """The service's vector-database URL (``VECBRIDGE_VECTORDB_URL``); NotConfiguredError (503, no Retry-After)
    when none is configured."""
    from ..errors import NotConfiguredError

    if not settings.vectordb_url:
        raise NotConfiguredError("this service has no vector database configured: set VECBRIDGE_VECTORDB_URL "
                                 "(or run `vecbridge migrate --store URL` where the database is reachable)")
    return settings.vectordb_url


class SharedStore:
    """The service's vector database (``url``), opened on first use and shared by requests one call at a time
    (a psycopg connection is not for concurrent use, and one connection per request would cost a connect each).
    A call that fails for any reason but bad input closes it; the next call opens it again. One that lost the
    connection (the database restarted) is a VectorDBUnavailableError: 503 with ``Retry-After``, not a 500."""

    def __init__(self, url: str, *, api_key: str | None = None, ca_file=None):
        self.url, self._auth = url, {"api_key": api_key, "ca_file": ca_file}
        self._lock = threading.Lock()
        self._store: VectorStore | None = None

    def call(self, fn: Callable[[VectorStore], object]):
        """``fn(store)`` under the lock, on the open store."""
        with self._lock:
            if self._store is None:
                self._store = open_store(self.url, **self._auth)
            try:  # a lost connection is judged before the store is closed: psycopg's ``broken`` reads False after
                with lost_as_unavailable(self._store, "retry: the next request connects again"):
                    return fn(self._store)
            except (InputError, NotFoundError):  # the request's fault (a wrong dimension, a missing collection)
                raise  # the connection is fine: keep it
            except Exception:
                self._close()
                raise

    def _close(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            store.close()

    def close(self) -> None:
        with self._lock:
            self._close()


def search_rows(Q, metric: str):
    """Queries ``Q`` as an engine can rank them by ``metric``: the index path's rule (:func:`~service.indexes.kinds.
    prep_rows`): cosine takes unit rows, exact at any finite scale (an engine's own normalising lost 3e38 and 1e-42
    rows: scores 0, arbitrary ids) and refuses all-zero rows; inner product (and L2) refuses norms past 1e19
    (NotRepresentableError: scores would overflow float32, NaN hits dropped)."""
    from ..indexes.kinds import prep_rows

    return prep_rows(Q, "cosine" if metric == "cosine" else "ip", "queries", why=ZERO_COSINE)


#: why a cosine collection refuses an all-zero query (:func:`search_rows`, and before a map: :func:`search_collection`)
ZERO_COSINE = ("a cosine collection ranks rows by direction and a zero query has none (every row would score 0); send "
               "a nonzero query")


def describe_collection(store: VectorStore, name: str) -> dict:
    """``GET /v1/collections/{name}``: what a client needs to pick a map for it (the console's migration form: a map
    whose source space is the collection's): ``{"name", "space"`` (recorded; None when it records none)``, "dim",
    "count", "metric"}``. CollectionNotFoundError (404) for a name that is neither a collection nor an alias. An empty
    collection whose vector field declares no width (pgvector's ``vector`` without a size) has ``"dim"`` None and a
    ``"note"`` saying why: the route has nothing to fix (it answered 422 in the CLI's words, "--vector-field")."""
    if not store.exists(name) and store.resolve_alias(name) is None:
        raise CollectionNotFoundError(f"{store.engine}: no collection or alias {name!r}")
    out = {"name": name, "space": store.get_space(name)}
    try:
        out["dim"] = int(store.dim(name))
    except UnknownWidthError:
        out["dim"] = None
        out["note"] = (f"{name!r} has no rows and its vector field {store.vector_field!r} declares no width: the width "
                       f"is its first rows' (or the size the column is given)")
    return {**out, "count": int(store.count(name)), "metric": store.metric(name)}


def search_collection(store: VectorStore, resolver, collection: str, Q, *, space: str, map_ref=None, k: int = 10,
                      collection_space: str | None = None) -> dict:
    """Search ``collection`` (vectors of its recorded space, or ``collection_space`` when it records none; one that
    contradicts the record is a SpaceMismatchError) with queries ``Q`` (nq, d) of
    ``space``, mapped into the collection's raw space through the registry's path of maps (``map_ref`` pins one or a
    path). The query-side migration: the collection stays as it is. Returns ``collection_space``, ``maps`` (the
    versions used) and ``results``: per query, hits ``{"id", "score"}`` best first (ids as the store keeps them)."""
    from ..vectordb.base import id_key

    recorded = store.get_space(collection)
    if collection_space and recorded and collection_space != recorded:
        raise SpaceMismatchError(f"collection {collection!r} records space {recorded!r}, but collection_space says "
                                 f"{collection_space!r}: leave collection_space out (it names the space of a "
                                 "collection that records none), or search a collection of that space")
    cs = collection_space or recorded
    if cs is None:
        raise InputError(f"collection {collection!r} records no embedding space: give collection_space (the space "
                         "of its vectors), or record it (a migration does; VectorStore.set_space)")
    tr = resolver.translation(space, cs, map_ref)
    metric = store.metric(collection)
    if tr.map is not None:  # refused as an index search refuses it (service.ops.indexes.search): a map sent a zero
        # row to its offset, ranked as a real query (200, arbitrary hits)
        from align.validation import check_no_zero_rows

        from .indexes import ZERO_MAPPED

        check_no_zero_rows(Q, name="queries", why=ZERO_COSINE if metric == "cosine" else ZERO_MAPPED)
        Q = tr.map.apply(Q, output="raw")
    S, I = store.search(collection, search_rows(Q, metric), k)
    results = [[{"id": id_key(i), "score": float(s)} for i, s in zip(ri, rs) if s > float("-inf")]
               for ri, rs in zip(I.tolist(), S.tolist())]
    return {"collection": collection, "collection_space": cs, "space": space, "maps": tr.describe(),
            "results": results}
