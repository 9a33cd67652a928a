"""How good a map version looks for path choice, from the figures its record holds (:meth:`Registry.quality`).

- :func:`judged` — ``(kind, score, source, measured, pool)``: kind 2 a held-out top-1 put on a pool of 1,000
  candidates (:func:`align.metrics.top1_at`, given how many queries it was measured on, so a perfect score on a
  handful is not read as certainty; an ``eval --record`` figure first, else the fit's own), kind 1 a
  training top-1, kind 0 none; ``measured`` / ``pool``: the held-out figure as measured and its pool size.
- :func:`quality_words` — that figure in words, with the measured one beside it when the pool was small: put on
  1,000 from a pool of 20 (a 100-pair fit's held-out fifth) the independence model reads 0.84 as 0.0001 where
  0.41 was measured among 1,000, so the figure alone misled.
"""

from __future__ import annotations

from align.metrics import top1_at

__all__ = ["SMALL_POOL", "judged", "quality_words"]

#: pools below this many candidates extrapolate to 1,000 poorly: the words give the measured figure too
SMALL_POOL = 200


def judged(v) -> tuple[int, float, str, float | None, int]:
    """``(kind, score, source, measured top-1, pool)`` of a version's record (see the module docs)."""
    m, tags = v.metrics or {}, v.tags or {}
    for source, top1, pool, queries in (
            ("eval", tags.get("eval.top1"), tags.get("eval.n_candidates"), tags.get("eval.n_queries")),
            ("fit", m.get("heldout_top1"), m.get("heldout_n_candidates"), m.get("heldout_n_queries"))):
        try:  # tags are stored as text
            top1 = float(top1)
        except (TypeError, ValueError):
            continue
        if not 0.0 <= top1 <= 1.0:  # NaN or a hand-set tag out of range ranks nothing
            continue
        pool, queries = _count(pool), _count(queries)  # no query count (older records): the pool's, the fewest
        return 2, top1_at(top1, pool, n_queries=queries or None) if pool > 1 else top1, source, top1, pool
    if isinstance(m.get("train_top1"), (int, float)):
        return 1, float(m["train_top1"]), "train", None, 0
    return 0, 0.0, "none", None, 0


def _count(x) -> int:
    """A stored count (tags are text), 0 when absent or not a number."""
    try:
        return max(int(float(x)), 0)
    except (TypeError, ValueError, OverflowError):
        return 0


def quality_words(v) -> str:
    """E.g. ``"held-out top-1 on 1,000 candidates 0.973"``, or with a small pool ``"held-out top-1 0.840 among 20
    candidates (put on 1,000: 0.000, an estimate that small pools understate)"``; ``"training top-1 0.990"``;
    ``"no held-out figure"``."""
    kind, score, _, measured, pool = judged(v)
    if kind == 1:
        return f"training top-1 {score:.3f} (no held-out figure)"
    if kind == 0:
        return "no held-out figure"
    if 1 < pool < SMALL_POOL:
        return (f"held-out top-1 {measured:.3f} among {pool} candidates (put on 1,000: {score:.3f}, an estimate "
                "that small pools understate)")
    return f"held-out top-1 on 1,000 candidates {score:.3f}"
