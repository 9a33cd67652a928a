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
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from align.validation import as_matrix, check_paired, check_random_state, check_rankable
from align.exceptions import InputError
from align.frames import unit_rows
from align.knn import knn
from align.metrics import ranks, retention

from .base import VectorStore
from .migrate import resolve_map

__all__ = ["verify_migration", "compare_to_reference"]


def compare_to_reference(Y_ref, Y_hat, *, n_queries: int = 200, k: int = 10) -> dict:
    """Recall@k of searching ``Y_hat`` (m, d) instead of ``Y_ref`` (m, d), rows paired; see module docs."""
    Y_ref, Y_hat = check_paired(Y_ref, Y_hat, names=("Y_ref", "Y_hat"), min_rows=2)
    check_rankable(Y_ref, name="Y_ref")
    check_rankable(Y_hat, name="Y_hat")
    if Y_ref.shape[1] != Y_hat.shape[1]:
        raise InputError(f"reference is {Y_ref.shape[1]}-d, migrated vectors {Y_hat.shape[1]}-d")
    R, H = unit_rows(Y_ref), unit_rows(Y_hat)
    k = min(int(k), R.shape[0])
    Q = R[: min(int(n_queries), R.shape[0])]
    _, I_ref = knn(Q, R, k)
    _, I_hat = knn(Q, H, k)
    r = ranks(R, H)
    return {"n_sample": int(R.shape[0]), "n_queries": int(Q.shape[0]), "k": k,
            f"recall@{k}": retention(I_hat, I_ref), "partner_top1": float((r == 1).mean()),
            f"partner_recall@{k}": float((r <= k).mean()), "cos": float(np.einsum("ij,ij->i", R, H).mean())}


def verify_migration(store: VectorStore, target: str, *, embed: Callable | None = None, heldout=None, map_=None,
                     registry=None, n_sample: int = 2000, n_queries: int = 200, db_queries: int = 200, k: int = 10,
                     random_state=0) -> dict:
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

    Returns
    -------
    dict of figures plus ``mode`` ("reembed" or "heldout").
    """
    rng = check_random_state(random_state)
    if embed is not None:
        ids = store.ids(target)
        if ids.shape[0] < 2:
            raise InputError(f"{target!r} has fewer than 2 rows")
        sample = np.sort(rng.choice(ids, size=min(int(n_sample), ids.shape[0]), replace=False))
        batch = store.fetch(target, sample)
        if batch.texts is None or any(t is None for t in batch.texts):
            raise InputError(f"rows of {target!r} carry no texts; verify with heldout=(X, Y) and map_ instead")
        Y_ref = as_matrix(embed(list(batch.texts)), name="embed(texts)", dim=batch.vectors.shape[1])
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
    m = resolve_map(map_, registry)
    X, Y = check_paired(*heldout, names=("heldout X", "heldout Y"), min_rows=2)
    take = rng.permutation(X.shape[0])[: min(int(n_sample), X.shape[0])]
    out = compare_to_reference(Y[take], m.apply(X[take], output="raw"), n_queries=n_queries, k=k)
    out["mode"] = "heldout"
    return out
