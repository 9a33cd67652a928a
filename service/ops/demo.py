"""A demo registered on an empty data directory, so ``/docs`` is usable seconds after start.

What it does (as a background job; ``/readyz`` and ``/v1/info`` report ``demo``:
``preparing`` → ``ready`` or ``failed``, see :func:`demo_status`):

1. Reads the package data ``service/data/demo_wordnet.npz`` (built by
   ``scripts/build_demo_data.py``): 1,000 WordNet definitions and their vectors from two real
   encoders, ``all-MiniLM-L6-v2`` (space ``minilm``) and ``multilingual-e5-small`` (space ``e5``).
   Nothing is embedded at start-up; the encoders load only when a request sends texts.
2. Registers both spaces (with their encoder when it is installed, so text requests work).
3. Fits ``minilm -> e5`` **supervised** (orthogonal Procrustes) on 800 of the known pairs,
   measures top-1 retrieval on the other 200 (held out; chance is 1/200) and registers it as
   ``demo-minilm-e5`` with alias ``prod`` and the tag ``demo_top1`` (no HTML report: rendering
   it would take longer than the rest of the demo). An unsupervised fit on so few
   texts lands at chance (RESEARCH notes), so the demo does not pretend: the version's
   description says how it was fitted.
4. Builds the FAISS index ``demo-e5`` of all 1,000 e5 vectors with each text as payload, so
   ``POST /v1/indexes/demo-e5/search {"texts": ["..."], "space": "minilm"}`` is a cross-model
   search out of the box (the first text request loads the MiniLM encoder).

Skip it with ``Settings.demo_on_empty=False`` (``VECBRIDGE_DEMO_ON_EMPTY=false``); tests do.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..logging import get_logger
from ..progress import Progress, silent
from ..storage import atomic_write, take_abandoned

__all__ = ["maybe_start_demo", "run_demo", "load_demo_data", "demo_status", "DEMO_MAP", "DEMO_INDEX",
           "DEMO_DATA"]

_log = get_logger("demo")

DEMO_MAP = "demo-minilm-e5"
DEMO_INDEX = "demo-e5"
DEMO_DATA = Path(__file__).resolve().parents[1] / "data" / "demo_wordnet.npz"
SOURCE = ("minilm", "all-MiniLM-L6-v2")
TARGET = ("e5", "multilingual-e5-small")
N_HELD_OUT = 200
#: in the data dir: ``preparing`` / ``ready`` / ``failed``, written by the process building the demo
STATUS_FILE = ".demo.status"

#: job state -> what /readyz and /v1/info say about the demo
_STATUS = {"queued": "preparing", "running": "preparing", "succeeded": "ready", "failed": "failed",
           "cancelled": "failed"}


def load_demo_data(path: Path = DEMO_DATA) -> tuple[list[str], np.ndarray, np.ndarray, dict]:
    """``(texts, minilm (n, 384), e5 (n, 384), meta)`` from the packaged demo file (float32 unit rows)."""
    with np.load(path, allow_pickle=False) as z:
        texts = [str(t) for t in z["texts"]]
        meta = json.loads(z["meta"].tobytes().decode())
        return texts, z["minilm"].astype(np.float32), z["e5"].astype(np.float32), meta


def demo_status(state) -> str | None:
    """``None`` (no demo this run), ``preparing``, ``ready`` or ``failed``: the same in every worker process.

    The process building the demo answers from its job; a sibling (``--workers N``, or a replica on the data dir)
    that found ``.demo.lock`` held at its start answers from ``.demo.status``, which the builder writes (a small
    file read, no job store query). Before, such a sibling answered None while the builder said ``ready``."""
    if getattr(state, "demo_job_id", None):
        try:
            # on the event loop (/readyz): this process's record as it stands, no wait for the job store's lock
            return _STATUS.get(state.jobs.get(state.demo_job_id, adopt=False).state, "preparing")
        except LookupError:
            return "failed"
    if getattr(state, "demo_elsewhere", False):  # another process held .demo.lock at our start: its demo
        return _shared_status(state)
    return None


def _shared_status(state) -> str | None:
    """What the process holding ``.demo.lock`` says in ``.demo.status``: ``ready`` / ``failed``; ``preparing`` while
    it holds the lock (deciding, or building); ``failed`` if it stopped while building; None if it built nothing."""
    data_dir = Path(state.settings.data_dir)
    try:
        word = (data_dir / STATUS_FILE).read_text().strip()
    except OSError:
        word = ""
    if word in ("ready", "failed"):
        return word
    if (fd := take_abandoned(data_dir / ".demo.lock")) is None:  # held (checked only while nothing is settled)
        return "preparing"
    os.close(fd)
    if word == "preparing":
        return "failed"  # the builder stopped before it finished
    state.demo_elsewhere = False  # it decided on no demo (the data dir was not empty): settled
    return None


def run_demo(state, progress: Progress = silent, *, random_state: int = 0) -> dict:
    """Register the demo spaces, map and index in ``state`` (an :class:`service.api.state.AppState`)."""
    from align import evaluate

    from ..encoders import list_encoders
    from .maps import run_fit
    from ..registry import NotFoundError

    reg = state.registry
    progress("load demo data", 0.0)
    texts, Xs, Xt, meta = load_demo_data()
    installed = {e["name"] for e in list_encoders() if e.get("installed")}
    for space, enc_name in (SOURCE, TARGET):
        try:
            reg.get_space(space)
        except NotFoundError:
            has_enc = enc_name in installed
            reg.register_space(space, Xs.shape[1], encoder=enc_name if has_enc else None,
                               description=f"demo: {enc_name}" + ("" if has_enc else " (encoder not installed)"))
    perm = np.random.default_rng(random_state).permutation(len(texts))
    fit_rows, held = np.sort(perm[N_HELD_OUT:]), np.sort(perm[:N_HELD_OUT])
    v = run_fit(reg, name=DEMO_MAP, source=Xs[fit_rows], target=Xt[fit_rows], method="procrustes", params={},
                source_space=SOURCE[0], target_space=TARGET[0], paired=True, random_state=random_state,
                alias="prod", progress=progress, report=False,
                inputs={"corpus": meta.get("corpus"), "n_pairs": len(fit_rows)},
                description=f"demo: orthogonal Procrustes on {len(fit_rows)} known pairs of WordNet definitions "
                            f"(packaged vectors); top-1 on {len(held)} held-out pairs in the demo_top1 tag")
    top1 = float(evaluate(reg.load_map(v), Xs[held], Xt[held], ks=(1,), csls=False)["top1"])
    reg.set_tag(DEMO_MAP, v.version, "demo_top1", round(top1, 4))
    progress("index", 0.0)
    state.indexes.create(DEMO_INDEX, TARGET[0], Xt, payloads=[{"text": t} for t in texts],
                         description=f"demo: {len(texts)} WordNet definitions embedded by {TARGET[1]}")
    result = {"n_texts": len(texts), "version": v.version, "heldout_top1": top1, "n_heldout": len(held)}
    _log.info("demo registered", extra={"fields": result})
    return result


def _demo_lock(data_dir: Path):
    """An exclusive lock on ``data_dir/.demo.lock`` (None if another process holds it), with ``.demo.status``
    cleared: an earlier run's status is not this run's."""
    import fcntl

    data_dir.mkdir(parents=True, exist_ok=True)
    fh = open(data_dir / ".demo.lock", "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        return None
    _write_status(data_dir, "")
    return fh


def _write_status(data_dir: Path, word: str) -> None:
    atomic_write(data_dir / STATUS_FILE, word)


def maybe_start_demo(state) -> str | None:
    """Queue the demo job when the registry has no maps and there are no indexes; returns the job id.

    With several worker processes on one data dir, the first to take ``.demo.lock`` decides and, when it builds
    the demo, holds the lock for its lifetime (``state.demo_lock``, closed by ``AppState.close``) and writes
    ``.demo.status``; the others (``state.demo_elsewhere``) report the status that file gives.
    """
    data_dir = Path(state.settings.data_dir)
    lock = None
    try:
        lock = _demo_lock(data_dir)
        if lock is None:
            state.demo_elsewhere = True
            return None
        if state.registry.list_maps(limit=1) or state.indexes.names():
            lock.close()
            return None
        if not DEMO_DATA.exists():
            _log.warning("demo skipped: package data missing", extra={"fields": {"path": str(DEMO_DATA)}})
            lock.close()
            return None
        _write_status(data_dir, "preparing")
    except Exception as exc:  # noqa: BLE001 - the demo must never stop the service
        _log.warning("demo skipped", extra={"fields": {"error": f"{type(exc).__name__}: {exc}"}})
        if lock is not None:
            lock.close()
        return None

    def work(ctx):
        # one BLAS thread: the demo's small SVDs run ~30x slower when OpenBLAS threads fight a busy machine
        from threadpoolctl import threadpool_limits

        done = "failed"
        try:
            with threadpool_limits(limits=1, user_api="blas"):
                result = run_demo(state, ctx.progress)
            done = "ready"
            return result
        finally:
            _write_status(data_dir, done)

    state.demo_lock = lock  # held while this process runs: a sibling starting later still reads .demo.status
    try:
        job, _ = state.jobs.submit(work, kind="demo",
                                   description="register the demo spaces, map and index (packaged vectors)")
    except BaseException:
        _write_status(data_dir, "failed")
        raise
    return job.id
