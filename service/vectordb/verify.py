"""Check a migration afterwards: does searching migrated vectors find what re-embedding would?

Two references for a sample of ``m`` rows:

- **texts exist** (stored with the rows): sample ids, read the migrated vectors ``Ŷ`` and the texts
  from the target collection, re-embed the texts with the new model (``embed``) to get ``Y``;
- **no texts**: a held-out paired sample ``(X, Y)`` (old-model and new-model vectors of the same
  items) and the map: ``Ŷ = map_.apply(X, output="raw")``.

Figures (cosine on raw unit rows):

- ``recall@k``: queries are the first ``n_queries`` rows of ``Y`` (new-model queries); overlap of
  the top-``k`` among the migrated sample ``Ŷ`` with the top-``k`` among the re-embedded ``Y``
  (``align.retention``; 1.0 = migration indistinguishable from re-embedding);
- ``partner_top1`` / ``partner_recall@k``: rank of ``ŷ_i`` for query ``y_i`` among all ``m`` ``Ŷ``;
- ``cos``: mean cosine between ``ŷ_i`` and ``y_i``;
- with texts, ``db_partner_recall@k``: the engine's own search over the **whole** target collection
  with ``y_i`` as the query finds row ``i`` in its top ``k`` (``db_candidates`` rows).

Memory: the sample (m × d) and blocked top-k (never m × m).

The figures above sample the **target** and judge the map; they cannot see a row the target lacks or a row
holding something else. With ``source`` (and the map), :func:`check_rows` compares the whole target against
the whole source: ids (``missing_rows``: in the source, not the target; ``extra_rows``: the other way) and,
for every row both hold, the stored vector ``t`` against ``y = map(x)`` of its source row:
``wrong_vectors`` counts rows with ``‖t − y‖ / ‖y‖ > tol`` (default 1e-3; float32 storage keeps ~1e-7), and
``wrong_fields`` rows whose text or any field differs from the source row's (a migration copies them as they are).
It reads both collections once (one source batch and its target rows at a time, plus both id lists).
A migration that kept its re-embedded rows (``keep_ids`` / ``keep_vectors``, :mod:`.keep`) wrote their given
vectors: given the same set, :func:`check_rows` expects those (``KeepSet.apply`` on the mapped batch, as the
migration wrote it) and counts them (``kept_checked``, ``kept_wrong`` among ``wrong_vectors``, ``keep_not_found``).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from align.exceptions import DimensionMismatchError, InputError
from align.validation import as_matrix, check_paired, check_random_state, check_rankable
from align.frames import unit_rows
from align.knn import knn
from align.metrics import ranks, retention

from .base import SpaceMismatchError, VectorStore
from .keep import keep_set
from .migrate import check_spaces, map_spaces, resolve_map

__all__ = ["verify_migration", "compare_to_reference", "check_rows"]

_SHOW = 10  # ids named per kind of fault
EMBED_BLOCK = 256  # texts re-embedded between two progress reports


def check_rows(store: VectorStore, source: str, target: str, map_, *, registry=None, batch_size: int = 2000,
               tol: float = 1e-3, source_space: str | None = None, space_option: str = "--source-space",
               keep_ids=None, keep_vectors=None, progress: Callable[[str, float], None] | None = None) -> dict:
    """Is ``target`` exactly ``map(source)``, row for row? See the module docs (``missing_rows``, ``extra_rows``,
    ``wrong_vectors`` with up to 10 ids each, ``max_rel_error``, ``rows_source``, ``rows_target``, ``space_check``).

    Refuses a map that cannot have made ``target`` from ``source`` before reading a row: another width at either end
    (DimensionMismatchError), or another space than ``source`` or ``target`` records (SpaceMismatchError, as
    :func:`~service.vectordb.migrate` refuses a map the wrong way round). A ``source`` that records no space (and no
    ``source_space``, the caller's word, declared by ``space_option``) has its first rows checked against the map's
    frames as a migration checks them (:func:`~service.vectordb.migrate.check_rows_space`): rows that look like the
    map's target side are refused; ``space_check`` says how the check went.

    ``keep_ids`` / ``keep_vectors`` (both or neither): the rows the migration kept as re-embedded and their
    vectors, checked as :func:`~service.vectordb.migrate` checks them; such a row is right when it holds its given
    vector (same ``tol``), every other row when it holds ``map(source row)``. Adds ``kept_checked`` (kept rows both
    collections hold), ``kept_wrong`` (of them, the wrong ones: counted in ``wrong_vectors`` too) and
    ``keep_not_found`` (ids of the set no source row has). ``progress("rows", fraction)``: before the target's ids
    are read, after, and before each source batch's work (a job's raises Cancelled there: a big check stopped by a
    cancel within one step; the fraction: source rows read over the target's rows, which a complete copy equals)."""
    map_src, map_tgt = map_spaces(map_, registry)
    m = resolve_map(map_, registry)
    d_t = store.dim(target)  # a missing target is named first: it is the collection checked
    d_s = store.dim(source)
    if d_s != m.source_dim:
        raise DimensionMismatchError(f"{source!r} holds {d_s}-d vectors, the map reads {m.source_dim}-d: give the "
                                     "migration's own map (and its source collection)")
    space_check = check_spaces(store, source, source_space, map_src or (m.metadata or {}).get("source_space"), m,
                               space_option)
    _check_target(store, target, m, map_tgt, d_t)
    if (keep_ids is None) != (keep_vectors is None):
        raise InputError("checking kept re-embedded rows needs both their ids (--keep-ids) and their new-model "
                         "vectors (--keep-vectors)")
    keep = None if keep_ids is None else keep_set(store, source, keep_ids, keep_vectors, m.target_dim)
    n_keep_found = n_kept = n_kept_wrong = 0
    report = progress if progress is not None else (lambda stage, fraction: None)
    report("rows", 0.0)  # a cancel asked so far stops before the target's ids are read (Milvus: a scan of them)
    ids_t = np.sort(store.ids(target))  # sorted here: engines page in their own order (UUIDs)
    report("rows", 0.0)  # ... and before the first source batch
    seen, missing, wrong, worst, n_missing, n_wrong = [], [], [], 0.0, 0, 0
    fields_wrong, n_fields_wrong = [], 0
    n_seen = 0  # the fraction counts against the target's rows, read already (a source count: another round trip)
    for b in store.scan(source, batch_size=batch_size, with_fields=True):
        # before the batch's work: a cancel asked during the last one stops here
        report("rows", min(n_seen / ids_t.shape[0], 1.0) if ids_t.shape[0] else 0.0)
        n_seen += len(b)
        seen.append(b.ids)
        kept = np.zeros(len(b), bool)
        if keep is not None:
            kept[keep.find(b.ids)[0]] = True
            n_keep_found += int(kept.sum())
        if ids_t.shape[0] and ids_t.dtype.kind == b.ids.dtype.kind:
            have = ids_t[np.minimum(np.searchsorted(ids_t, b.ids), ids_t.shape[0] - 1)] == b.ids
        else:  # an empty target, or ids of another kind (int vs UUID): none of these rows is there
            have = np.zeros(len(b), bool)
        n_missing += int((~have).sum())
        missing += b.ids[~have][: _SHOW - len(missing)].tolist()
        if not have.any():
            continue
        Y = m.apply(b.vectors[have], output="raw")
        if keep is not None:  # the kept rows' given vectors, as the migration wrote them
            Y, _ = keep.apply(b.ids[have], Y)
        t = store.fetch(target, b.ids[have], with_fields=True)
        T = t.vectors
        differ = _fields_differ(b, np.flatnonzero(have), t)  # texts and fields were never compared: PASS
        n_fields_wrong += int(differ.sum())
        fields_wrong += b.ids[have][differ][: _SHOW - len(fields_wrong)].tolist()
        err = np.linalg.norm(T - Y, axis=1) / np.maximum(np.linalg.norm(Y, axis=1), 1e-12)
        worst = max(worst, float(err.max()))
        bad = err > tol
        n_wrong += int(bad.sum())
        n_kept += int(kept[have].sum())
        n_kept_wrong += int((bad & kept[have]).sum())
        wrong += b.ids[have][bad][: _SHOW - len(wrong)].tolist()
    ids_s = np.concatenate(seen) if seen else np.empty(0, ids_t.dtype)
    extra = np.setdiff1d(ids_t, ids_s, assume_unique=True) if ids_t.dtype.kind == ids_s.dtype.kind or not ids_s.size \
        else ids_t
    out = {} if keep is None else {"kept_checked": n_kept, "kept_wrong": n_kept_wrong,
                                   "keep_not_found": len(keep) - n_keep_found}
    return {**out, "rows_source": int(ids_s.shape[0]), "rows_target": int(ids_t.shape[0]), "missing_rows": n_missing,
            "missing_ids": missing, "extra_rows": int(extra.shape[0]), "extra_ids": extra[:_SHOW].tolist(),
            "wrong_vectors": n_wrong, "wrong_ids": wrong, "max_rel_error": worst,
            "wrong_fields": n_fields_wrong, "wrong_fields_ids": fields_wrong, "space_check": space_check,
            "rows_ok": n_missing == 0 and n_wrong == 0 and n_fields_wrong == 0 and extra.shape[0] == 0}


def _check_target(store: VectorStore, target: str, m, map_tgt: str | None, d: int | None = None) -> None:
    """DimensionMismatchError / SpaceMismatchError when ``target`` holds rows of another width or records another
    space than the map ``m`` (whose target space is ``map_tgt``, else its metadata's) writes; ``d``: the target's
    width when the caller has read it (another round trip to the engine otherwise)."""
    d = store.dim(target) if d is None else d
    if d != m.target_dim:
        raise DimensionMismatchError(f"{target!r} holds {d}-d vectors, the map writes {m.target_dim}-d: give the "
                                     "migration's own map")
    map_tgt, recorded = map_tgt or (m.metadata or {}).get("target_space"), store.get_space(target)
    if map_tgt and recorded and map_tgt != recorded:  # same width, another model: not the map that made it
        raise SpaceMismatchError(f"{target!r} records space {recorded!r} but the map writes {map_tgt!r}: a map "
                                 "that did not make this collection; give the migration's own map")


def _same(a, b) -> bool:
    """Equal values, NaN equal to NaN (a float field holding NaN is copied as NaN)."""
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return True
    try:
        return bool(a == b)
    except (ValueError, TypeError):  # arrays: element-wise == has no single truth value
        return bool(np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True))


def _fields_differ(src, rows: np.ndarray, tgt) -> np.ndarray:
    """(len(rows),) bool: whether target row j (``tgt``, fetched for ``src.ids[rows]``) holds another text or
    field value than source row ``rows[j]``; a field one side lacks counts as None there."""
    out = np.zeros(rows.shape[0], bool)
    if src.texts is not None or tgt.texts is not None:
        s_txt, t_txt = src.texts or [None] * len(src), tgt.texts or [None] * rows.shape[0]
        out |= np.array([not _same(s_txt[i], t_txt[j]) for j, i in enumerate(rows)], bool)
    s_f, t_f = src.fields or {}, tgt.fields or {}
    for key in set(s_f) | set(t_f):
        a, b = s_f.get(key), t_f.get(key)
        out |= np.array([not _same(None if a is None else a[i], None if b is None else b[j])
                         for j, i in enumerate(rows)], bool)
    return out


def compare_to_reference(Y_ref, Y_hat, *, n_queries: int = 200, k: int = 10) -> dict:
    """Recall@k of searching ``Y_hat`` (m, d) instead of ``Y_ref`` (m, d), rows paired; see module docs."""
    Y_ref, Y_hat = check_paired(Y_ref, Y_hat, names=("Y_ref", "Y_hat"), min_rows=2)
    check_rankable(Y_ref, name="Y_ref")
    check_rankable(Y_hat, name="Y_hat")
    if Y_ref.shape[1] != Y_hat.shape[1]:
        raise InputError(f"reference is {Y_ref.shape[1]}-d, migrated vectors {Y_hat.shape[1]}-d")
    R, H = unit_rows(Y_ref), unit_rows(Y_hat)
    asked, k = int(k), min(int(k), R.shape[0])
    Q = R[: min(int(n_queries), R.shape[0])]
    _, I_ref = knn(Q, R, k)
    _, I_hat = knn(Q, H, k)
    r = ranks(R, H)
    lowered = (f"k lowered from {asked} to {k}: the sample holds only {k} rows (recall@{k} is what a --min-recall "
               "gate reads)")
    notes = [lowered] if k < asked else []  # it was lowered without a word
    return {"n_sample": int(R.shape[0]), "n_queries": int(Q.shape[0]), "k": k, "notes": notes,
            f"recall@{k}": retention(I_hat, I_ref), "partner_top1": float((r == 1).mean()),
            f"partner_recall@{k}": float((r <= k).mean()), "cos": float(np.einsum("ij,ij->i", R, H).mean())}


def verify_migration(store: VectorStore, target: str, *, embed: Callable | None = None, heldout=None, map_=None,
                     registry=None, n_sample: int = 2000, n_queries: int = 200, db_queries: int = 200, k: int = 10,
                     random_state=0, progress: Callable[[str, float], None] | None = None) -> dict:
    """Verify a migrated collection against re-embedded texts (``embed``) or a held-out paired sample.

    Parameters
    ----------
    store, target : the engine and the migrated collection (or alias).
    embed : callable ``list[str] -> array (m, d_B)``, optional
        The new model. Used when given; the sampled rows must carry texts.
    heldout : tuple ``(X (m, d_A), Y (m, d_B))``, optional
        Old- and new-model vectors of the same items, with ``map_`` (a map of any kind, path or ref).
    n_sample, n_queries, db_queries, k : sizes (see module docs).
    random_state : seed for the id sample.
    progress : ``progress(stage, fraction)``, optional
        Called at each stage (``sample`` before and after the ids are read, ``embed`` per block of
        :data:`EMBED_BLOCK` texts, ``search``); a job's raises Cancelled, so a cancel stops the check within one
        step.

    Returns
    -------
    dict of figures plus ``mode`` ("reembed" or "heldout").
    """
    rng = check_random_state(random_state)
    report = progress if progress is not None else (lambda stage, fraction: None)
    if embed is not None:
        report("sample", 0.0)
        ids = store.ids(target)
        if ids.shape[0] < 2:
            raise InputError(f"{target!r} has fewer than 2 rows")
        sample = np.sort(rng.choice(ids, size=min(int(n_sample), ids.shape[0]), replace=False))
        report("sample", 0.5)  # the ids read (a scan of them on Milvus): a cancel asked meanwhile stops here
        batch = store.fetch(target, sample)
        if batch.texts is None or any(t is None for t in batch.texts):
            raise InputError(f"rows of {target!r} carry no texts; verify with heldout=(X, Y) and map_ instead")
        texts, parts = list(batch.texts), []
        for s in range(0, len(texts), EMBED_BLOCK):  # in blocks: progress and a cancel between them
            report("embed", s / len(texts))
            parts.append(as_matrix(embed(texts[s:s + EMBED_BLOCK]), name="embed(texts)", dim=batch.vectors.shape[1]))
        Y_ref = np.concatenate(parts)
        report("search", 0.0)
        out = compare_to_reference(Y_ref, batch.vectors, n_queries=n_queries, k=k)
        nq = min(int(db_queries), sample.shape[0])
        _, I = store.search(target, Y_ref[:nq], k)
        out[f"db_partner_recall@{k}"] = float((I == sample[:nq, None]).any(axis=1).mean())
        out["db_queries"] = int(nq)
        out["db_candidates"] = int(ids.shape[0])
        out["mode"] = "reembed"
        return out
    if heldout is None or map_ is None:
        raise InputError("give embed= (rows with texts) or heldout=(X, Y) with map_=")
    _, map_tgt = map_spaces(map_, registry)
    m = resolve_map(map_, registry)
    _check_target(store, target, m, map_tgt)  # the held-out figures judge the map: the collection must be its output
    if store.count(target) == 0:
        raise InputError(f"{target!r} holds no rows: nothing was migrated into it")
    X, Y = check_paired(*heldout, names=("heldout X", "heldout Y"), min_rows=2)
    take = rng.permutation(X.shape[0])[: min(int(n_sample), X.shape[0])]
    out = compare_to_reference(Y[take], m.apply(X[take], output="raw"), n_queries=n_queries, k=k)
    out["mode"] = "heldout"
    return out
