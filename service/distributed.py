"""Big offline jobs on Ray (optional extra ``ray``): map-reduce over shards, same answers as one machine.

Supervised fits
    Every fitter in :mod:`align.procrustes` needs only additive statistics, so a fit over shards
    is two map-reduce passes:

    1. frames: per shard ``n`` and :math:`\\sum_i \\mathrm{unit}(x_i)`, :math:`\\sum_i \\mathrm{unit}(y_i)`
       (float64) → each side's mean → :class:`align.Frame` (unit → centre → unit);
    2. statistics: per shard :class:`align.PairStats` of the framed rows, merged with ``+`` →
       ``procrustes_from_stats`` / ``ridge_from_stats`` / ``lowrank_from_stats``.

    The merge is exact (sums), so the result equals :func:`align.fit_procrustes` on the
    concatenated rows up to float summation order (max |ΔW| ~1e-7 measured on full-rank data).
    Where ``XᵀY`` is rank-deficient (constant columns: WordNet MiniLM has two) Procrustes' ``W`` is
    not unique on those directions and another summation order may pick another one there
    (|ΔW| 0.77 measured on 20,000 MiniLM→E5 pairs), with the same outputs on the data, bit for bit.

Unsupervised heavy steps
    align's kernels with :func:`ray_executor` as their block executor (:mod:`align.blocks`); this
    module only supplies execution — Ray tasks over row blocks, shared arrays as object refs — and
    copies no numerics: :func:`kmeans_ray` (:func:`align.kmeans.kmeans`, one task per shard and
    iteration), :func:`knn_ray` (:func:`align.knn.knn_blocks`, one task per database shard),
    :func:`refine_icp_ray` (:func:`align.refine.refine_icp`, its kNN blocks as tasks), and
    ``MiniVec2Vec.fit(executor=ray_executor(ray))``. Same seed, same bits as in-process.

Batch transform
    :func:`transform_files_ray`: one task per vector file, streamed in row blocks, written atomically
    (a parquet into a parquet with its other columns: :class:`service.tables.MappedWriter`).

Shards are ``(X, Y)`` pairs (arrays or ``.npy`` paths, opened memory-mapped in the worker),
:class:`Shard` objects (with a row range, so one big file splits without copying), or zero-argument
callables returning ``(X, Y)`` (generate or read in the worker; nothing travels). Without Ray,
``*_local`` twins run the very same shard functions in-process.

Ray (:mod:`service.ray_connect`, its names re-exported here): :func:`ray_session` connects to ``address``
(``"auto"``, ``"head:6379"``, ``"ray://head:10001"``) or starts a local instance (``num_cpus``); a session already
initialised by the caller is reused and left running. An address that does not answer within ``connect_timeout``
seconds, or Ray not being installed, is a :class:`RayUnavailableError` (HTTP 503, exit 2; a node lost: exit 75).
Nothing here is pickled to disk; the map travels to workers as its npz bytes.
"""

from __future__ import annotations

import resource
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from align.validation import as_matrix
from align.blocks import run_blocks, serial
from align.exceptions import DimensionMismatchError, EmptyInputError, InputError, PairCountError, VecbridgeError
from align.frames import Frame, frame_sum
from align.kmeans import kmeans
from align.knn import knn_blocks
from align.maps import LinearMap, map_from_bytes
from align.refine import refine_icp
from align.procrustes import PairStats, map_from_stats, pair_stats

from .io import VECTOR_SUFFIXES, check_not_input, count_rows, iter_chunks
from .ray_connect import CONNECT_TIMEOUT_S, RayUnavailableError, ray_log_level, ray_session  # re-exported
from .tables import MappedWriter

__all__ = [
    "Shard", "ray_session", "pair_stats_local", "pair_stats_ray", "fit_stats_local", "fit_stats_ray",
    "kmeans_local", "kmeans_ray", "knn_ray", "refine_icp_ray", "transform_files_ray", "peak_rss_mb",
    "RayUnavailableError", "CONNECT_TIMEOUT_S", "ray_log_level",
]

# --- shards ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shard:
    """Rows ``[start, stop)`` of ``x`` (and of ``y`` when paired); ``x``/``y``: array or ``.npy`` path."""

    x: object
    y: object = None
    start: int = 0
    stop: int | None = None


def _rows(src, start: int, stop: int | None) -> np.ndarray:
    if type(src).__name__ == "ObjectRef":  # arrays put in the Ray object store (refs nested in a Shard)
        import ray

        src = ray.get(src)
    if isinstance(src, (str, Path)):
        src = np.load(src, mmap_mode="r", allow_pickle=False)
    return np.asarray(src[start:stop])


def _as_shard(s) -> Shard | Callable:
    if isinstance(s, Shard) or callable(s):
        return s
    if isinstance(s, tuple) and len(s) == 2:
        return Shard(s[0], s[1])
    if isinstance(s, (str, Path, np.ndarray)):
        return Shard(s)
    raise InputError(f"a shard is (X, Y), a Shard, a path/array or a callable; got {type(s).__name__}")


def _open_pair(s) -> tuple[np.ndarray, np.ndarray]:
    if callable(s) and not isinstance(s, Shard):
        X, Y = s()
    else:
        if s.y is None:
            raise InputError("a paired fit needs shards with both x and y")
        X, Y = _rows(s.x, s.start, s.stop), _rows(s.y, s.start, s.stop)
    X = as_matrix(X, name="shard X")
    Y = as_matrix(Y, name="shard Y")
    if X.shape[0] != Y.shape[0]:
        raise PairCountError(f"shard has {X.shape[0]} X rows and {Y.shape[0]} Y rows")
    return X, Y


def _open_single(s) -> np.ndarray:
    if callable(s) and not isinstance(s, Shard):
        out = s()
        return as_matrix(out[0] if isinstance(out, tuple) else out, name="shard")
    return as_matrix(_rows(s.x, s.start, s.stop), name="shard")


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (MiB; Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# --- per-shard work (the "map" side; plain functions, run locally or as Ray tasks) ---------------

def _frame_sums(shard, unit_in: bool, chunk: int) -> tuple[int, np.ndarray, np.ndarray, float]:
    X, Y = _open_pair(shard)
    return (int(X.shape[0]), frame_sum(X, unit_in=unit_in, block=chunk), frame_sum(Y, unit_in=unit_in, block=chunk),
            peak_rss_mb())


def _pair_dims(shard) -> tuple[int, int]:
    X, Y = _open_pair(shard)
    return int(X.shape[1]), int(Y.shape[1])


def _shard_stats(shard, frames: tuple[Frame, Frame], chunk: int) -> tuple[PairStats, float]:
    X, Y = _open_pair(shard)
    return pair_stats(X, Y, frames, chunk_size=chunk), peak_rss_mb()


def _frames_from_sums(parts, normalize: bool) -> tuple[Frame, Frame]:
    """Each side's frame from the shards' ``(n, Σ unit x, Σ unit y)``: the sums add up exactly."""
    n = sum(p[0] for p in parts)
    if n == 0:
        raise EmptyInputError("the shards hold no rows")
    d_s, d_t = parts[0][1].shape[0], parts[0][2].shape[0]
    if any(p[1].shape[0] != d_s or p[2].shape[0] != d_t for p in parts):
        raise DimensionMismatchError("shards disagree on dimensions")
    return (Frame.from_sum(d_s, n, sum(p[1] for p in parts), unit_in=normalize, unit_out=normalize),
            Frame.from_sum(d_t, n, sum(p[2] for p in parts), unit_in=normalize, unit_out=normalize))


# --- Ray plumbing (sessions, their addresses and tokens: service.ray_connect) -------------------

def _executor(ray):
    """The block executor for ``ray`` (:func:`ray_executor`), or in-process when None."""
    return serial if ray is None else ray_executor(ray)


def _shared(shards, ray) -> list:
    """``shards`` as :class:`Shard`/callables, their in-memory arrays put in Ray's object store once."""
    shards = [_as_shard(s) for s in shards]
    if ray is None:
        return shards

    def put(a):
        return ray.put(a) if isinstance(a, np.ndarray) else a

    return [Shard(put(s.x), put(s.y), s.start, s.stop) if isinstance(s, Shard) else s for s in shards]


def ray_executor(ray, *, num_cpus: float = 1, put_bytes: int = 1 << 20):
    """A block executor (:mod:`align.blocks`) that runs every block as a Ray task.

    Arrays of ``put_bytes`` or more are put in the object store once and shared by the tasks as
    object refs: the whole database of a kNN round goes to each worker once, not once per block,
    and an array passed again in a later call (the target rows of every ICP iteration) is not put
    again. A ref is dropped when its array is garbage-collected, so rows that change every round
    do not pile up in the store. Results come back in block order, so align's kernels give the
    same bits as in-process.
    """
    remotes: dict = {}
    refs: dict[int, object] = {}  # id(array) -> ObjectRef, for arrays still alive

    def share(a):
        if not (isinstance(a, np.ndarray) and a.nbytes >= put_bytes):
            return a
        ref = refs.get(id(a))
        if ref is None:
            ref = refs[id(a)] = ray.put(a)
            weakref.finalize(a, refs.pop, id(a), None)  # the id may be reused once a is gone
        return ref

    def run(fn, arg_lists):
        task = remotes.get(fn)
        if task is None:
            task = remotes[fn] = ray.remote(num_cpus=num_cpus)(fn)
        return _get(ray, [task.remote(*[share(a) for a in args]) for args in arg_lists])

    return run


def _get(ray, refs):
    """``ray.get(refs)``; a task's own error (ours: typed) is raised as itself, not as Ray's wrapper whose
    message is the task's name and pid, and a worker or node lost past Ray's retries is RayUnavailableError."""
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as exc:
        if isinstance(getattr(exc, "cause", None), VecbridgeError):
            raise exc.cause from exc
        raise
    except ray.exceptions.RayError as exc:  # WorkerCrashedError, NodeDiedError, ObjectLostError, ...
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RayUnavailableError(f"a Ray worker or node was lost past Ray's retries ({type(exc).__name__}): "
                                  f"{why}", retry_after=5) from exc  # another node may take it: exit 75


# --- supervised fits -----------------------------------------------------------------------------

def _pair_stats(shards, center, normalize, chunk_size, ray) -> tuple[tuple[Frame, Frame], PairStats, dict]:
    shards = _shared(shards, ray)  # arrays go to the object store once, not once per pass
    if not shards:
        raise EmptyInputError("no shards")
    run = _executor(ray)
    sums = []
    if center:
        sums = run_blocks(_frame_sums, [(s, normalize, chunk_size) for s in shards], run)
        frames = _frames_from_sums(sums, normalize)
    else:  # only the dimensions are needed
        d_s, d_t = run_blocks(_pair_dims, [(shards[0],)], run)[0]
        frames = (Frame(d_s, None, unit_in=normalize, unit_out=normalize),
                  Frame(d_t, None, unit_in=normalize, unit_out=normalize))
    parts = run_blocks(_shard_stats, [(s, frames, chunk_size) for s in shards], run)
    stats = PairStats.zeros(frames[0].dim, frames[1].dim)
    for st, _ in parts:
        stats = stats + st
    peaks = [p[3] for p in sums] + [p[1] for p in parts]
    info = {"n_shards": len(shards), "worker_peak_rss_mb": max(peaks) if peaks else 0.0}
    return frames, stats, info


def pair_stats_local(shards: Sequence, *, center: bool = True, normalize: bool = True,
                     chunk_size: int = 65536) -> tuple[tuple[Frame, Frame], PairStats]:
    """Frames and merged :class:`PairStats` over ``shards``, shard by shard in this process."""
    frames, stats, _ = _pair_stats(shards, center, normalize, chunk_size, None)
    return frames, stats


def pair_stats_ray(shards: Sequence, *, center: bool = True, normalize: bool = True, chunk_size: int = 65536,
                   address: str | None = None, num_cpus: int | None = None) -> tuple[tuple[Frame, Frame], PairStats]:
    """As :func:`pair_stats_local`, one Ray task per shard and pass."""
    with ray_session(address, num_cpus=num_cpus) as ray:
        frames, stats, _ = _pair_stats(shards, center, normalize, chunk_size, ray)
    return frames, stats


def fit_stats_local(shards: Sequence, *, method: str = "procrustes", center: bool = True, normalize: bool = True,
                    chunk_size: int = 65536, **params) -> LinearMap:
    """A supervised map from sharded pairs, in this process (reference for :func:`fit_stats_ray`)."""
    frames, stats, info = _pair_stats(shards, center, normalize, chunk_size, None)
    m = map_from_stats(stats, frames, method, center=center, normalize=normalize, **params)
    m.metadata["distributed"] = {"engine": "local", **info}
    return m


def fit_stats_ray(shards: Sequence, *, method: str = "procrustes", center: bool = True, normalize: bool = True,
                  chunk_size: int = 65536, address: str | None = None, num_cpus: int | None = None,
                  **params) -> LinearMap:
    """Supervised map (``procrustes`` [scale], ``ridge`` [alpha, fit_intercept], ``lowrank`` [rank, ...])
    fitted as a Ray map-reduce of sufficient statistics over ``shards``.

    Parameters
    ----------
    shards : list
        ``(X_i, Y_i)`` pairs of arrays or ``.npy`` paths (rows paired within a shard), :class:`Shard`
        row ranges, or callables returning ``(X_i, Y_i)``; X (n_i, d_s), Y (n_i, d_t).
    address : str, optional
        Ray cluster address; default: the running session, or a new local one (``num_cpus``).

    Returns
    -------
    LinearMap equal to ``align.fit_<method>(concat X, concat Y, ...)`` up to summation order.
    """
    with ray_session(address, num_cpus=num_cpus) as ray:
        frames, stats, info = _pair_stats(shards, center, normalize, chunk_size, ray)
        info["engine"] = "ray"
        info["ray_cpus"] = float(ray.cluster_resources().get("CPU", 0))
    m = map_from_stats(stats, frames, method, center=center, normalize=normalize, **params)
    m.metadata["distributed"] = info
    return m


# --- unsupervised heavy steps: align's kernels, with shards as their blocks -------------------------

def kmeans_local(shards: Sequence, k: int, *, init=None, n_iter: int = 50, tol: float = 0.0,
                 random_state=None) -> tuple[np.ndarray, float, int]:
    """Lloyd k-means over sharded rows in this process: ``(centroids (k, d), inertia, iterations)``."""
    return kmeans(_shared(shards, None), k, init=init, n_iter=n_iter, tol=tol, random_state=random_state,
                  open_block=_open_single)


def kmeans_ray(shards: Sequence, k: int, *, init=None, n_iter: int = 50, tol: float = 0.0, random_state=None,
               address: str | None = None, num_cpus: int | None = None) -> tuple[np.ndarray, float, int]:
    """:func:`align.kmeans.kmeans` with each iteration's assignment step as one Ray task per shard.

    .. math::  c_j \\leftarrow \\frac{\\sum_{x \\in S_j} x}{|S_j|},\\quad S_j = \\{x : j = \\arg\\min_l \\|x - c_l\\|^2\\}

    The per-shard partial sums and counts are added in shard order, so the result is the same
    bits as :func:`kmeans_local` from the same ``init`` (rows drawn with ``random_state`` when
    not given). Stops after ``n_iter`` iterations or when the squared centroid shift is ``<= tol``.
    """
    with ray_session(address, num_cpus=num_cpus) as ray:
        return kmeans(_shared(shards, ray), k, init=init, n_iter=n_iter, tol=tol, random_state=random_state,
                      open_block=_open_single, executor=ray_executor(ray))


def knn_ray(Q, db_shards: Sequence, k: int = 10, *, address: str | None = None,
            num_cpus: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top-``k`` of ``Q`` (nq, d) over a database split in shards (global row ids).

    :func:`align.knn.knn_blocks` with one Ray task per shard (each runs :func:`align.knn`, FAISS
    when installed); the merge keeps the best ``k`` of the ``k × n_shards`` candidates — the same
    set as one search over the concatenation (ties broken towards the lower global index).
    """
    with ray_session(address, num_cpus=num_cpus) as ray:
        return knn_blocks(Q, _shared(db_shards, ray), k, open_block=_open_single, executor=ray_executor(ray))


def refine_icp_ray(W, Xs, target_shards: Sequence, *, iters: int = 100, sample: int = 1000, k: int = 50,
                   alpha: float = 0.5, random_state=None, address: str | None = None,
                   num_cpus: int | None = None) -> tuple[np.ndarray, list]:
    """The published ICP-average refinement, :func:`align.refine.refine_icp`, with its kNN blocks as Ray tasks.

    ``Xs`` (n, d_s) framed source rows; ``target_shards``: framed target rows (arrays, files or
    ``Shard``s), read into one array here and shared with the workers through the object store
    once. Returns ``(W, history)``, bit-for-bit those of ``refine_icp`` with the same seed.
    """
    Xs = as_matrix(Xs, name="Xs")
    Yt = np.concatenate([_open_single(_as_shard(s)) for s in target_shards])
    with ray_session(address, num_cpus=num_cpus) as ray:
        return refine_icp(W, Xs, Yt, iters=iters, sample=sample, k=k, alpha=alpha, random_state=random_state,
                          executor=ray_executor(ray))


def _apply_chunk(map_bytes: bytes, X: np.ndarray, output: str) -> np.ndarray:
    return map_from_bytes(map_bytes).apply(X, output=output)


def apply_stream_ray(map_, chunks: Iterable[np.ndarray], *, output: str = "raw",
                     address: str | None = None, window: int = 4) -> Iterable[np.ndarray]:
    """Stream ``chunks`` through Ray workers: yields ``map_.apply(chunk, output=output)`` in input order.

    At most ``window`` chunks are in flight (memory: ``window`` chunks in and out), so a file
    larger than memory streams through the cluster; the map goes to the object store once.
    """
    from collections import deque

    with ray_session(address) as ray:
        task = ray.remote(num_cpus=1)(_apply_chunk)
        blob = ray.put(map_.to_bytes("npz"))
        pending: deque = deque()
        for chunk in chunks:
            pending.append(task.remote(blob, np.ascontiguousarray(chunk, dtype=np.float32), output))
            if len(pending) >= window:
                yield _get(ray, pending.popleft())
        while pending:
            yield _get(ray, pending.popleft())


# --- batch transform of sharded files --------------------------------------------------------------

def _transform_file(map_bytes: bytes, src: str, dst: str, output: str, batch_size: int) -> dict:
    m = map_from_bytes(map_bytes)
    # read as ``vecbridge transform`` reads it (np.load of a .npz crashed on its NpzFile)
    n = count_rows(src, key_option=None)
    with MappedWriter(src, dst, dim=m.target_dim, n_rows=n, batch_rows=batch_size) as w:  # renamed into place
        for X in iter_chunks(src, chunk_rows=batch_size, key_option=None):  # or removed on an error
            if X.shape[1] != m.source_dim:
                raise DimensionMismatchError(f"{src}: expected (n, {m.source_dim}), got {X.shape[1]}-d rows")
            w.write(m.apply(X, output=output))
    return {"input": src, "output": dst, "rows": n, "peak_rss_mb": peak_rss_mb(), "note": w.note}


def transform_files_ray(map_, inputs: Sequence, out_dir, *, output: str = "raw", batch_size: int = 65536,
                        suffix: str = ".mapped.npy", registry=None, address: str | None = None,
                        num_cpus: int | None = None, use_ray: bool = True) -> list[dict]:
    """Apply ``map_`` to every vector file in ``inputs`` (one task per file), writing ``out_dir/<stem><suffix>``.

    ``map_``: a map of any kind (LinearMap, ClusterMap, MapChain), artifact path or registry ref. Files are read as
    ``vecbridge transform`` reads them (:func:`service.io.iter_chunks`: ``.npy`` / ``.fvecs`` memory-mapped, a
    ``.npz``'s one array read whole (several arrays of rows: refused), a ``.parquet``'s first list column). Each
    task streams its file in blocks of ``batch_size`` rows (memory: one block in, one block out) and renames a
    finished temporary file into place, so a crashed job leaves no half-written output. ``use_ray=False`` runs the
    same tasks in this process. Returns one dict per file (input, output, rows, note: a parquet's columns an .npy
    output left out; ``.parquet`` keeps them). Inputs writing one output (``a/part.npy``, ``b/part.npy``), or an
    output that is an input: InputError first.
    """
    from service.vectordb.migrate import resolve_map

    m = resolve_map(map_, registry)
    if output not in ("frame", "raw", "linear"):
        raise InputError(f"output must be 'frame', 'raw' or 'linear', got {output!r}")
    out_dir = Path(out_dir)
    paths = [Path(p) for p in inputs]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise InputError(f"input files not found: {missing[:5]}")
    other = [str(p) for p in paths if p.suffix.lower() not in VECTOR_SUFFIXES]
    if other:
        raise InputError(f"not vector files: {other[:5]}; give {', '.join(VECTOR_SUFFIXES)} files (texts: embed "
                         f"them with vecbridge transform)")
    jobs = [(str(p.resolve()), str((out_dir / p.stem).resolve()) + suffix) for p in paths]
    first: dict[str, Path] = {}
    for (_, dst), p in zip(jobs, paths):  # a/part.npy and b/part.npy: one's output overwrote the other's
        if first.setdefault(dst, p) is not p:
            raise InputError(f"{first[dst]} and {p} would both be written to {dst}: give inputs of distinct file "
                             f"names, or transform them into different folders")
        check_not_input(dst, "the output", *paths)  # suffix=".npy" into the input's folder replaced the input
    out_dir.mkdir(parents=True, exist_ok=True)
    blob = m.to_bytes("npz")
    if not use_ray:
        return run_blocks(_transform_file, [(blob, a, b, output, int(batch_size)) for a, b in jobs], serial)
    with ray_session(address, num_cpus=num_cpus) as ray:
        ref = ray.put(blob)
        return run_blocks(_transform_file, [(ref, a, b, output, int(batch_size)) for a, b in jobs],
                          ray_executor(ray))
