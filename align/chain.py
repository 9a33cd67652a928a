"""MapChain: maps applied one after another (A→B, B→C, ... as one A→…→Z map), for any kind of map.

Two :class:`~align.LinearMap` s fold into one matrix (:meth:`LinearMap.compose`); a
:class:`~align.ClusterMap` does not (its routing depends on the row), so a path through one is
applied step by step: every step but the last writes ``output="raw"`` — vectors like the middle
model's own, which is what the next map was fitted on — and the last writes the requested
``output``. As for a composed linear map, ``"frame"`` is the last map's target frame, ``"raw"``
its raw target space and ``"linear"`` its affine output before normalisation; the source frame is
the first map's.

:func:`require_linear` is the one check for operations that need a matrix (``W``, a bias, a
pseudo-inverse): they raise InputError for a ClusterMap or a chain rather than misreading its arrays.

Artifacts: ``.npz`` / ``.safetensors`` holding every step's own artifact bytes (``uint8`` arrays) and a
JSON header (``format = "vecbridge.MapChain"``); :func:`align.map_from_bytes` reads them. No pickle.
"""

from __future__ import annotations

import inspect
import math

import numpy as np

from ._artifacts import StoredMap, check_header, pack, stored_fields
from .exceptions import DimensionMismatchError, InputError, SerializationError
from .options import check_batch_size
from .validation import as_matrix, check_paired, check_rankable, copies_whole

__all__ = ["MapChain", "require_linear", "check_map", "map_kind", "FORMAT"]

FORMAT = "vecbridge.MapChain"
FORMAT_VERSION = 1


def map_kind(map_) -> str:
    """``"linear"``, ``"cluster"`` or ``"chain"``: what kind of map ``map_`` is (``map_kind`` attribute)."""
    return str(getattr(map_, "map_kind", "linear"))


def check_map(obj, what: str):
    """``obj`` when it is a map of any kind (LinearMap, ClusterMap, MapChain: ``apply(X, output=, validate=)``, both
    widths and a target frame, what the chains and the metrics use), else InputError starting with ``what``."""
    if not (all(hasattr(obj, a) for a in ("apply", "source_dim", "target_dim", "target_frame"))
            and _takes_keywords(obj.apply, ("output", "validate"))):
        raise InputError(f"{what} (LinearMap, ClusterMap, MapChain), got {type(obj).__name__}")
    return obj



def check_map_documents(map_, X_src, Y_tgt, what: str) -> tuple[np.ndarray, np.ndarray]:
    """The checks of a retention measure's inputs: ``map_`` a map (:func:`check_map`, InputError starting
    ``"{what} needs a map"``), ``X_src`` (n, d_s) / ``Y_tgt`` (n, d_t) paired, finite, rankable rows of the map's two
    widths (DimensionMismatchError otherwise). Returns them as float matrices ``(X, Y)``."""
    check_map(map_, f"{what} needs a map")  # None was an AttributeError
    X, Y = check_paired(X_src, Y_tgt, names=("X_src", "Y_tgt"), min_rows=1)
    check_rankable(X, name="X_src")
    check_rankable(Y, name="Y_tgt")
    if X.shape[1] != map_.source_dim or Y.shape[1] != map_.target_dim:
        raise DimensionMismatchError(
            f"map is {map_.source_dim}->{map_.target_dim}, documents are {X.shape[1]}->{Y.shape[1]}")
    return X, Y

def _takes_keywords(fn, names) -> bool:
    """Whether ``fn`` can be called with each of ``names`` as a keyword (the metrics call ``apply(X, output=,
    validate=False)``: a look-alike without ``validate`` failed there with a raw TypeError)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # not a callable, or one with no signature to read
        return False
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return True
    return all(n in params and params[n].kind in (inspect.Parameter.KEYWORD_ONLY,
                                                   inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names)


def require_linear(map_, purpose: str):
    """``map_`` itself when it is a single linear map (one matrix ``W``), else InputError naming ``purpose``."""
    kind = map_kind(map_)
    if kind != "linear" or np.asarray(getattr(map_, "W", np.empty((0, 0)))).ndim != 2:
        what = {"cluster": "a per-cluster map (ClusterMap: one matrix per cluster, blended per row)",
                "chain": "a chain of maps applied in sequence"}.get(kind, f"a {kind} map")
        raise InputError(f"{purpose} needs a single linear map (one matrix W); this is {what}. "
                         "Fit a linear map (method procrustes, ridge or lowrank) for this")
    return map_


class NonLinearAlgebra:
    """``inverse`` / ``compose`` of a map with no single matrix (ClusterMap, MapChain): the InputError of
    :func:`require_linear` (calling them was a raw AttributeError)."""

    def inverse(self):
        """Not defined: InputError (only a :class:`~align.LinearMap` has one matrix to invert)."""
        require_linear(self, "inverse")

    def compose(self, other):
        """Not defined: InputError; ``align.MapChain([self, other])`` applies any maps in sequence."""
        try:
            require_linear(self, "compose")
        except InputError as exc:
            raise InputError(f"{exc}, or chain any maps with align.MapChain([first, second])") from None


class MapChain(NonLinearAlgebra, StoredMap):
    """The maps ``steps[0]``, ``steps[1]``, ... applied in sequence (each step's target dim is the next's source).

    Parameters
    ----------
    steps : sequence of maps with ``apply(X, output=, validate=)``, ``source_dim``, ``target_dim``
        (LinearMap, ClusterMap, MapChain — nested chains are flattened); at least one.
    metadata : dict, optional
    """

    map_kind = "chain"
    _eq_fields = ("steps", "metadata")  # == by value (ValueObject): a loaded copy is equal, not only the object

    def __init__(self, steps, metadata: dict | None = None):
        flat = []
        for s in steps:
            flat.extend(s.steps if isinstance(s, MapChain) else [s])
        if not flat:
            raise InputError("a chain needs at least one map")
        for s in flat:  # a string or an array was an AttributeError on .target_dim
            check_map(s, "a chain's steps are maps")
        for a, b in zip(flat, flat[1:]):
            if a.target_dim != b.source_dim:
                raise DimensionMismatchError(
                    f"cannot chain: a map outputs {a.target_dim}-d, the next expects {b.source_dim}-d")
        self.steps = tuple(flat)
        self.metadata = dict(metadata) if metadata is not None else {
            "method": "chain", "kinds": [map_kind(s) for s in flat], "parts": [getattr(s, "metadata", {}) for s in flat]}

    @property
    def source_dim(self) -> int:
        return int(self.steps[0].source_dim)

    @property
    def target_dim(self) -> int:
        return int(self.steps[-1].target_dim)

    @property
    def source_frame(self):
        """The first step's source frame (what ``output="frame"`` and the metrics read the input in)."""
        return self.steps[0].source_frame

    @property
    def target_frame(self):
        """The last step's target frame (the frame of ``output="frame"``; the metrics rank targets in it)."""
        return self.steps[-1].target_frame

    def __len__(self) -> int:
        return len(self.steps)

    def __repr__(self) -> str:
        return f"MapChain({' -> '.join(f'{map_kind(s)}({s.source_dim}->{s.target_dim})' for s in self.steps)})"

    def apply(self, X, *, output: str = "raw", batch_size: int = 65536, validate: bool = True,
              name: str = "X") -> np.ndarray:
        """Map raw source rows ``X`` (n, d_s) to (n, d_t) float32: raw vectors between steps, ``output`` at the end
        (``output``, ``validate`` and ``name`` as in :meth:`LinearMap.apply`). An array goes through every step a
        piece of ``batch_size`` rows (or more: whole blocks of every step) at a time (:meth:`StoredMap._apply_pieces`),
        a float16 memmap converted a piece at a time: it was converted to float32 whole before the first step, and
        each step's output between two steps was the whole input's size."""
        if output not in ("frame", "raw", "linear"):
            raise InputError(f"output must be 'frame', 'raw' or 'linear', got {output!r}")
        if (validate and copies_whole(X)) or (len(self.steps) > 1 and isinstance(X, np.ndarray) and X.ndim == 2
                                              and not np.ma.isMaskedArray(X)):
            batch_size = check_batch_size(batch_size)
            out = self._apply_pieces(X, self._block_rows(batch_size), output=output, batch_size=batch_size,
                                     validate=validate, name=name)
            if out is not None:
                return out
        if validate:
            X = as_matrix(X, name=name, dim=self.source_dim)
        last = len(self.steps) - 1
        for i, step in enumerate(self.steps):
            X = step.apply(X, output=output if i == last else "raw", batch_size=batch_size, validate=False)
        return X

    __call__ = apply

    def _block_rows(self, batch_size: int) -> int:
        """Rows that are a whole number of every step's blocks (their least common multiple): a piece of that many
        rows meets the arithmetic of one call in each step."""
        return math.lcm(*(s._block_rows(batch_size) if hasattr(s, "_block_rows") else int(batch_size)
                          for s in self.steps))

    # --- (de)serialisation ----------------------------------------------------------------
    def to_bytes(self, format: str = "npz") -> bytes:
        """``"npz"`` or ``"safetensors"`` bytes: each step's artifact (same format) as a ``uint8`` array."""
        arrays = {f"step{i}": np.frombuffer(s.to_bytes(format), dtype=np.uint8) for i, s in enumerate(self.steps)}
        header = {"format": FORMAT, "format_version": FORMAT_VERSION, "n_steps": len(self.steps),
                  "metadata": self.metadata}
        return pack(arrays, header, format)

    @classmethod
    def from_artifact(cls, arrays: dict, header: dict) -> "MapChain":
        """The chain of an unpacked artifact's ``arrays`` and ``header`` (as :meth:`LinearMap.from_artifact`)."""
        from .maps import map_from_bytes

        check_header(header, FORMAT, FORMAT_VERSION, "MapChain")
        with stored_fields("MapChain"):
            n = header["n_steps"]
            names = [f"step{i}" for i in range(n)] if type(n) is int and 1 <= n <= len(arrays) else None
            if names is None or set(names) != set(arrays):  # a step more or less than the header says: another map
                raise SerializationError(f"chain artifact: n_steps={n!r} but it holds the arrays {sorted(arrays)}")
            steps = [map_from_bytes(np.asarray(arrays[name], dtype=np.uint8).tobytes()) for name in names]
            return cls(steps, header.get("metadata"))
