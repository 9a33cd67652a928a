r"""Labelled retention over a whole corpus, after the fit: what :func:`align.plan_migration` forecasts.

:func:`align.labelled_retention` scores a map's labelled queries over the held-out documents alone. A migrated
index holds the whole corpus, and every other row of it competes with a query's relevant document: on the WordNet
reverse dictionary (minilm→e5, a 2,000-pair map, 500 queries) the retention was 0.825 over the 1,000 held-out
documents and 0.544 over all 40,960 (each row mapped, against e5's own vectors of all of them). The plan forecasts
the corpus-wide figure, so a gate on the held-out one passed a migration it forecast to keep about half.

:func:`corpus_retention` measures the corpus-wide figure the way the plan estimates it (the same
:class:`align.plan.LabelledProbe`, the held-out documents in the role of the probe's held-out half): the migrated
R@10 of the queries over the mapped held-out documents plus the rest of the old corpus, mapped, is exact; the
native R@10 over the whole corpus needs every row re-embedded, so it is the native R@10 over the held-out
documents scaled by how the old model's R@10 of the same queries falls from them to the whole corpus, adjusted by
how fast the new model's falls relative to the old one's among the held-out documents (a slope ratio shrunk toward
1). That needs the queries under the old model too.
"""

from __future__ import annotations

import numpy as np

from .chain import check_map_documents
from .exceptions import EmptyInputError
from .frames import unit_rows
from .knn import knn
from .plan import DUPLICATE_COS, LabelledProbe
from .validation import as_matrix, check_random_state

__all__ = ["corpus_retention"]


def corpus_retention(map_, X_src, Y_tgt, queries, relevant, old_queries, X_corpus, *, random_state=0,
                     corpus_name: str = "X_corpus") -> dict:
    r"""R@10 retention of labelled queries over the whole corpus a corpus-side migration maps.

    ``X_src`` / ``Y_tgt`` (n, d_s) / (n, d_t): the held-out documents under the old (source) and the new
    (target) model, row by row; ``queries`` (q, d_t) new-model and ``old_queries`` (q, d_s) old-model vectors of
    the same queries; ``relevant`` (q,): each one's held-out row; ``X_corpus`` (m, d_s): the old model's vectors
    of the rest of the corpus (rows that repeat a held-out document, cosine >= 0.9999, are left out: that
    document is already there; when that leaves none, EmptyInputError: the figure would be the held-out one, not a
    corpus's). ``corpus_name``: what the caller calls ``X_corpus``, in its errors. See the module docs for the
    estimate.

    Returns ``{"retention", "retention_interval" ([lo, hi], 95 % over resamples of the queries), "migrated_r10"
    (exact), "native_r10" (estimated), "native_r10_heldout", "old_r10_heldout", "old_r10_corpus", "slope_ratio",
    "shrink", "n_documents" (held-out + corpus rows searched), "n_heldout", "n_corpus_rows", "n_duplicates",
    "n_queries"}``; ``retention`` is None (and the interval too) when the native estimate is undefined (no query
    finds its document among the held-out ones with one of the models).
    """
    X, Y = check_map_documents(map_, X_src, Y_tgt, "corpus_retention")
    C = as_matrix(X_corpus, name=corpus_name, dim=X.shape[1])
    lab = LabelledProbe(queries, old_queries, relevant, X, Y, rows="held-out document")
    rng = check_random_state(random_state)
    corpus = unit_rows(C)
    dup = knn(corpus, unit_rows(X), 1)[0][:, 0] >= DUPLICATE_COS
    if dup.all():  # "over the whole corpus" of the held-out documents alone, which the corpus only repeats
        raise EmptyInputError(f"no row of {corpus_name} is left to map: all {C.shape[0]:,} repeat a held-out "
                              f"document (cosine >= {DUPLICATE_COS}), so the retention would be over the "
                              f"{X.shape[0]:,} held-out documents alone, not the corpus; give the old model's vectors "
                              f"of the rest of the corpus (the held-out rows may stay in it), or leave {corpus_name} "
                              f"out for the held-out figure")
    val = np.arange(X.shape[0])
    lab.prepare(val, corpus, ~dup, rng)
    r = lab.estimate(map_, X, C, ~dup)  # the rows as given, mapped as transform maps them (and the held-out ones)
    native = lab.native_estimate()  # NaN, or 0, exactly where r is NaN
    migrated = float(lab.last_hits.mean())
    ok = bool(np.isfinite(r))
    interval = [float(v) for v in lab.interval(rng)] if ok else None
    return {"retention": r if ok else None, "retention_interval": interval,
            "migrated_r10": migrated, "native_r10": float(native) if ok else None,
            "native_r10_heldout": float(lab.nat_fall[:, -1].mean()),
            "old_r10_heldout": float(lab.old_fall[:, -1].mean()), "old_r10_corpus": float(lab.old_full.mean()),
            "slope_ratio": lab.slope_ratio, "shrink": lab.shrink,
            "n_documents": int(X.shape[0] + (~dup).sum()), "n_heldout": int(X.shape[0]),
            "n_corpus_rows": int(C.shape[0]), "n_duplicates": int(dup.sum()), "n_queries": int(lab.Q.shape[0])}
