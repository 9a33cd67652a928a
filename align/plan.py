r"""Before the fit: which rows to re-embed, how alignable two spaces are, what K buys.

- :func:`select_rows_to_embed` — coverage sampling of the old corpus: k-means++ seeding
  (D² sampling, Arthur & Vassilvitskii 2007) on unit rows picks rows spread over the corpus,
  so the K re-embedded pairs cover its regions; ``"random"`` is the baseline.
- :func:`knn_overlap` — alignability: for a paired probe ``(A, B)`` (p rows each, same texts),
  the mean share of each row's ``k`` nearest probe rows that the two models agree on. The
  unsupervised path has only worked above ~0.4 (minilm↔paraphrase-L3 0.445; minilm↔e5 0.31).
- :func:`plan_migration` — alignability, a learning curve of the held-out score of
  :func:`align.fit_migration` on probe subsamples, extrapolated to larger K with an interval,
  the recommended method and K, and the rows to re-embed.
"""

from __future__ import annotations

import numpy as np

from ._validation import as_matrix, check_paired, check_random_state
from .exceptions import InputError, TooFewRowsError
from .frames import Frame, unit_rows
from .knn import knn
from .retrieval import overlap_without_self

__all__ = ["select_rows_to_embed", "knn_overlap", "plan_migration", "MIN_PROBE"]

MIN_PROBE = 50


def _d2_sample(Z: np.ndarray, k: int, rng: np.random.Generator, *, rounds: int = 32, block: int = 8192) -> np.ndarray:
    """k-means++ style seeding in ``rounds`` batches: ``k`` distinct row indices of ``Z`` (n, d).

    Each round draws ``ceil(k / rounds)`` new rows without replacement with probability ∝ the
    squared distance to the nearest row chosen so far (D² sampling, k-means|| style batches so
    the distance update is one GEMM per round); the first row is uniform. O(n k d), memory O(n).
    """
    n = Z.shape[0]
    per = max(1, int(np.ceil(k / rounds)))
    sq = np.einsum("ij,ij->i", Z, Z)
    d2 = np.full(n, np.inf)
    chosen = [int(rng.integers(n))]
    new = np.array(chosen)
    while True:
        C = Z[new]
        csq = np.einsum("ij,ij->i", C, C)
        for s in range(0, n, block):
            part = sq[s : s + block, None] - 2.0 * (Z[s : s + block] @ C.T) + csq[None, :]
            np.minimum(d2[s : s + block], np.maximum(part.min(axis=1), 0.0), out=d2[s : s + block])
        d2[np.asarray(chosen)] = 0.0
        want = min(per, k - len(chosen))
        if want <= 0:
            break
        positive = int((d2 > 0).sum())
        if positive < want:  # fewer distinct rows than k: fill with unchosen rows at random
            rest = np.setdiff1d(np.arange(n), np.asarray(chosen))
            chosen.extend(rng.choice(rest, size=k - len(chosen), replace=False).tolist())
            break
        new = rng.choice(n, size=want, replace=False, p=d2 / d2.sum())
        chosen.extend(new.tolist())
    return np.asarray(chosen[:k], dtype=np.int64)


def select_rows_to_embed(X_old, k: int, *, method: str = "kmeans++", random_state=0) -> np.ndarray:
    """Indices (k,) of the rows of ``X_old`` (n, d) to re-embed with the new model, sorted.

    ``method="kmeans++"``: D² sampling on the unit rows (cosine geometry; coverage of the corpus);
    ``"random"``: uniform without replacement. Same ``random_state`` → same rows.
    """
    X = as_matrix(X_old, name="X_old")
    if not 1 <= int(k) <= X.shape[0]:
        raise TooFewRowsError(f"cannot select {k} rows out of {X.shape[0]}")
    rng = check_random_state(random_state)
    if method == "random":
        return np.sort(rng.choice(X.shape[0], size=int(k), replace=False))
    if method != "kmeans++":
        raise InputError(f"method must be 'kmeans++' or 'random', got {method!r}")
    return np.sort(_d2_sample(unit_rows(X), int(k), rng))


def knn_overlap(A, B, *, k: int = 10) -> float:
    """Mean overlap of the ``k`` nearest neighbours (self excluded) of paired rows in two spaces.

    ``A`` (p, d_a) and ``B`` (p, d_b) embed the same p texts. 1.0: the two models order every
    neighbourhood alike; k/p: unrelated.
    """
    A, B = check_paired(A, B, names=("probe_src", "probe_tgt"), min_rows=k + 2)
    Za, Zb = Frame._fit(A)._apply(A), Frame._fit(B)._apply(B)
    return overlap_without_self(knn(Za, Za, k + 1)[1], knn(Zb, Zb, k + 1)[1], k)
