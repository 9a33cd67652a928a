"""The rows a vector-database migration re-embedded, kept as they are: :class:`KeepSet`.

A migration re-embeds K rows of its collection with the new model to fit its map; the migrated collection should
hold those rows' OWN new-model vectors rather than the map's approximation of them (a query looking for one of them
then finds it as the new model does; WordNet minilm→e5: +0.01-0.03 retention of the whole corpus at K = 1,000,
+0.03-0.09 at 3,000, see :func:`align.keep_native_rows`). In a database the rows are named by their ids: a keep set
is K ids and their K new-model vectors; :func:`service.vectordb.migrate` maps each batch, then writes the given
vector for every row whose id is in the set; :func:`service.vectordb.check_rows` (``vecbridge verify --source``)
takes the same set, and expects those vectors in those rows.

Ids: integers, or strings (UUIDs, keys). A string that is a UUID is compared in its canonical form (lower case,
hyphens), as PostgreSQL's ``uuid`` and Qdrant return them, on both sides; the set's ids are read as the source
collection keys its rows (a file of decimal integers for a ``text`` id column compares as those strings; a string
id for an integer-keyed collection must be a decimal integer).

Memory: the whole set is held in memory (K ids and K × d_B float32, plus a sorted copy of the ids): fine for K up
to about 1e6 (a 1,024-d set of 1e6 rows is 4 GB).
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from pathlib import Path

import numpy as np

from align.coverage import keep_native_rows
from align.exceptions import (
    DegenerateInputError,
    DimensionMismatchError,
    InputError,
    NonFiniteError,
    PairCountError,
)

from .base import CheckpointMismatchError, VectorStore, as_ids

__all__ = ["KEEP_WORDS", "KeepSet", "check_keep", "check_keep_resume", "keep_set", "read_keep_ids",
           "resume_words"]

_INT = re.compile(r"[+-]?[0-9]+")


def _canon(s: str) -> str:
    """A string id as compared: a UUID in its canonical form, any other string as it is."""
    try:
        return str(uuid.UUID(s))
    except ValueError:
        return s


class KeepSet:
    """K ids (sorted, as compared: :func:`keep_set` makes one) and their new-model vectors (K, d), in that order."""

    def __init__(self, keys: np.ndarray, vectors: np.ndarray):
        self.keys, self.vectors = keys, vectors
        h = hashlib.sha256(f"keep:{keys.dtype.kind}:{keys.size}:{vectors.shape[1]}:".encode())
        h.update(json.dumps(keys.tolist()).encode() if keys.dtype.kind == "U" else keys.astype("<i8").tobytes())
        h.update(np.ascontiguousarray(vectors, "<f4").tobytes())
        #: sha256 of the ids and vectors (in id order: the same set listed in another order has the same digest)
        self.digest = h.hexdigest()

    def __len__(self) -> int:
        return int(self.keys.size)

    def find(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, at)``: the positions in ``ids`` of the rows whose id is in the set, and where in the set each of
        those ids is (both empty when none is)."""
        none = np.empty(0, np.intp)
        if not self.keys.size or not len(ids):
            return none, none
        if ids.dtype.kind == "U" or ids.dtype == object:
            if self.keys.dtype.kind != "U":
                return none, none
            ids = np.array([_canon(str(i)) for i in ids])
        elif self.keys.dtype.kind == "U":
            return none, none
        at = np.minimum(np.searchsorted(self.keys, ids), self.keys.size - 1)
        hit = self.keys[at] == ids
        return np.flatnonzero(hit), at[hit]

    def apply(self, ids: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, int]:
        """``(Y, n)``: the mapped batch ``Y`` of rows ``ids`` with the set's vector in every row whose id is in the
        set (:func:`align.keep_native_rows`, in place), and how many those were."""
        rows, at = self.find(ids)
        if not rows.size:
            return Y, 0
        return keep_native_rows(Y, rows, self.vectors[at], copy=False), int(rows.size)


def read_keep_ids(path) -> np.ndarray:
    """A keep-ids file: ``.npy`` (K,) of integers (or of strings), ``.json`` a list of integers or strings, else
    text with one id per line, each line stripped, read as a string: :func:`keep_set` reads it as an integer for a
    collection keyed by integers, and keeps it as written for a text id column ("007" stays "007"; read as integers
    first, it became "7" and never matched)."""
    from ..io import check_file, load_npy

    p = Path(path)
    check_file(p)
    suffix = p.suffix.lower()
    try:
        if suffix == ".npy":
            arr = np.asarray(load_npy(p))
        elif suffix == ".json":
            obj = json.loads(p.read_text(encoding="utf-8-sig"))
            if not isinstance(obj, list) or any(isinstance(x, bool) or not isinstance(x, (int, str)) for x in obj):
                raise ValueError("expected a JSON list of integer or string ids")
            if any(isinstance(x, str) for x in obj) and not all(isinstance(x, str) for x in obj):
                raise ValueError("the list mixes integer and string ids")
            arr = np.array(obj, dtype=str if obj and isinstance(obj[0], str) else np.int64)
        else:
            lines = [w.strip() for w in p.read_text(encoding="utf-8-sig").splitlines() if w.strip()]
            arr = np.array(lines, dtype=str)
    except (ValueError, OverflowError, UnicodeDecodeError, RecursionError) as exc:
        raise InputError(f"{p.name}: cannot read the ids of the re-embedded rows ({exc})") from None
    if arr.dtype.kind == "S":
        arr = arr.astype(str)
    if arr.ndim != 1 or not (arr.dtype.kind in "iuU" or arr.size == 0):
        raise InputError(f"{p.name}: the ids of the re-embedded rows must be a flat list of integers or strings, got "
                         f"shape {arr.shape} dtype {arr.dtype}")
    return arr if arr.dtype.kind == "U" else arr.astype(np.int64)


def _source_id_kind(store: VectorStore, source: str) -> str | None:
    """``"int"`` or ``"str"``: how ``source`` keys its rows (its first row's id); None for an empty collection."""
    scan = store.scan(source, batch_size=1, with_texts=False)
    try:
        batch = next(scan, None)
    finally:
        scan.close()
    if batch is None or not len(batch.ids):
        return None
    return "str" if batch.ids.dtype.kind in "UO" else "int"


def check_keep(ids, vectors, dim: int, *, vectors_name: str = "the keep vectors", ids_name: str = "the keep ids",
               id_word: str = "id") -> tuple[np.ndarray, np.ndarray]:
    """``(ids, vectors)`` of a keep set checked as far as it can be without its collection, before anything is
    written: one ``dim``-d finite, non-zero vector per id (in the ids' order; float32), integer or string ids
    (:func:`~service.vectordb.base.as_ids`), none listed twice. The one check of a migration's set (ids) and of
    ``vecbridge transform --keep-rows`` (ids: rows of its input); the messages call the two ``vectors_name`` and
    ``ids_name`` (both read as plural) and an id ``id_word``, and name the bad rows by id and by their row of the
    vectors."""
    vec = np.asarray(vectors)
    if vec.ndim != 2 or vec.dtype.kind not in "fiu":
        raise InputError(f"the re-embedded rows' vectors must be a 2-D array of numbers, got shape {vec.shape} "
                         f"dtype {vec.dtype}")
    arr = np.asarray(ids)
    if arr.dtype.kind == "U" or (arr.dtype == object and arr.size and all(isinstance(x, str) for x in arr.tolist())):
        arr = arr.astype(str)
    arr = as_ids(arr)
    if arr.shape[0] != vec.shape[0]:
        raise PairCountError(f"{vectors_name} hold {vec.shape[0]} rows but {ids_name} list {arr.shape[0]}: one "
                             f"new-model vector per re-embedded row, in the order {ids_name} list them")
    if vec.shape[1] != dim:
        raise DimensionMismatchError(f"{vectors_name} have {vec.shape[1]}-d rows; the map's target (the new "
                                     f"model) is {dim}-d")
    vec = np.ascontiguousarray(vec, dtype=np.float32)

    def which(mask: np.ndarray) -> str:
        at = np.flatnonzero(mask)[:10]
        return f"{id_word}s {arr[at].tolist()}, at row(s) {at.tolist()} of the vectors"

    bad = ~np.isfinite(vec).all(axis=1)
    if bad.any():
        raise NonFiniteError(f"{vectors_name} hold {int(bad.sum())} row(s) with NaN or Inf ({which(bad)}): a kept "
                             "row is written as given")
    zero = ~vec.any(axis=1)  # refused here, before anything is written (align.keep_native_rows, a batch later: mid-run)
    if zero.any():
        raise DegenerateInputError(f"{vectors_name} hold {int(zero.sum())} all-zero row(s) ({which(zero)}): a zero "
                                   "vector has no direction to keep")
    _no_twice(arr, ids_name, id_word)
    return arr, vec


def _no_twice(ids: np.ndarray, ids_name: str = "the keep ids", id_word: str = "id") -> np.ndarray:
    """The order that sorts ``ids``; InputError naming an id listed more than once."""
    order = np.argsort(ids, kind="stable")
    keys = ids[order]
    dup = keys[1:][keys[1:] == keys[:-1]]
    if dup.size:
        raise InputError(f"{ids_name} list {dup.size} {id_word}(s) more than once (e.g. {dup[0].item()!r}): each "
                         "re-embedded row has one new-model vector")
    return order


def keep_set(store: VectorStore, source: str, ids, vectors, dim: int) -> KeepSet:
    """The keep set of a migration of ``source`` into ``dim``-d vectors, checked before anything is written
    (:func:`check_keep`), its ids read as ``source`` keys its rows (the module says how)."""
    arr, vec = check_keep(ids, vectors, dim)
    kind = _source_id_kind(store, source)
    if arr.dtype.kind == "U":
        if kind == "int":
            bad_ids = [s for s in arr.tolist() if not _INT.fullmatch(s.strip())]
            if bad_ids:
                raise InputError(f"{source!r} keys its rows by integers, but the keep ids hold "
                                 f"{len(bad_ids)} that are not (e.g. {bad_ids[0][:80]!r})")
            arr = np.array([int(s) for s in arr.tolist()], dtype=np.int64)
        else:
            arr = np.array([_canon(s) for s in arr.tolist()], dtype=str)
    elif kind == "str":  # integer ids (.npy, .json) for a text / varchar id column
        arr = arr.astype(str)
    order = _no_twice(arr)  # again: two spellings of one UUID, "+5" and "5"
    return KeepSet(arr[order], vec[order])


#: how each face names the keep set and the run, for :func:`check_keep_resume`'s refusal: the Python API's parameters
#: (:func:`service.vectordb.migrate`'s default), the CLI's flags, the HTTP request's field (``resume_words``)
KEEP_WORDS = {"python": ("keep_ids / keep_vectors", "this call"), "cli": ("--keep-ids / --keep-vectors", "this run"),
              "http": ("`keep`", "this request")}


def resume_words(space_option: str) -> tuple[str, str]:
    """:data:`KEEP_WORDS` of the face of :func:`service.ops.vectordb.run_migration` that declares a space with
    ``space_option`` (``--source-space``: the CLI; ``source_space``: HTTP), as the checkpoint's own refusal tells the
    faces apart."""
    return KEEP_WORDS["cli" if space_option.startswith("--") else "http"]


def check_keep_resume(state: dict | None, keep: KeepSet | None, option: str = KEEP_WORDS["python"][0],
                      this: str = KEEP_WORDS["python"][1]) -> None:
    """CheckpointMismatchError when ``state`` (a checkpoint) was written with another keep set than ``keep`` (or with
    one, and this run keeps none, or the other way round): a resumed target would mix two sets. The message names
    the set as the caller gives it (``option``: the Python API's parameters, the CLI's flags, or the HTTP request's
    field) and the run ``this`` (:data:`KEEP_WORDS`): over HTTP it named the CLI's flags, which a request never
    sends."""
    if state is None:
        return
    was, now = state.get("keep_digest"), None if keep is None else keep.digest
    if was == now:
        return
    before = (f"keeping {state.get('keep_rows')} re-embedded rows (digest {was[:12]})" if was
              else "keeping no re-embedded rows")
    after = f"keeps {len(keep)} (digest {now[:12]})" if keep is not None else "keeps none"
    raise CheckpointMismatchError(
        f"the checkpoint was written {before}; {this} {after}: a resumed target would hold two sets. Give the same "
        f"{option} (ids and vectors) to resume, or remove the checkpoint to start over")
