"""How good a map version looks for path choice, from the figures its record holds (:meth:`Registry.quality`).

- :func:`judged` — ``(kind, score, source, measured, pool)``: kind 2 a held-out top-1 put on a pool of 1,000
  candidates (:func:`align.metrics.top1_at`, given how many queries it was measured on, so a perfect score on a
  handful is not read as certainty; an ``eval --record`` figure first unless it may be chance,
  :func:`eval_at_chance`, else the fit's own), kind 1 a
  training top-1 (a figure outside [0, 1], NaN included, is none: paths multiply scores, and a NaN or
  negative one made the best chain depend on the order chains were compared in), kind 0 none;
  ``measured`` / ``pool``: the held-out figure as measured and its pool size.
- :func:`reliable` — the fit's verdict, with its held-out hits judged again (:func:`heldout_doubt`): a record
  written before that test (2026-12-05) kept "reliable" for a map of shuffled pairs, and stayed a path.
- :func:`quality_words` — that figure in words, with the measured one beside it when the pool was small: put on
  1,000 from a pool of 20 (a 100-pair fit's held-out fifth) the independence model reads 0.84 as 0.0001 where
  0.41 was measured among 1,000, so the figure alone misled.
"""

from __future__ import annotations

from functools import lru_cache

from align.metrics import top1_at

__all__ = ["CHANCE_LEVEL", "SMALL_POOL", "SPLIT", "eval_at_chance", "heldout_doubt", "judged", "quality_words",
           "reliable", "span"]

#: the chance a map at chance passes :func:`heldout_doubt` (after the correction for the maps compared)
CHANCE_LEVEL = 1e-3
#: ``heldout_source`` of a fit judged on one held-out split (its queries are its candidates)
SPLIT = "held-out split of the fit"

#: pools below this many candidates extrapolate to 1,000 poorly: the words give the measured figure too
SMALL_POOL = 200


def judged(v) -> tuple[int, float, str, float | None, int]:
    """``(kind, score, source, measured top-1, pool)`` of a version's record (see the module docs)."""
    m, tags = v.metrics or {}, v.tags or {}
    for source, top1, pool, queries in (
            ("eval", tags.get("eval.top1"), tags.get("eval.n_candidates"), tags.get("eval.n_queries")),
            ("fit", m.get("heldout_top1"), m.get("heldout_n_candidates"), m.get("heldout_n_queries"))):
        if source == "eval" and pool is not None and _count(pool) < 2:  # set by hand before tags were checked: the
            continue  # top-1 of "0 candidates" counted unscaled (0.999 put on none beat every measured figure)
        if source == "eval" and eval_at_chance(v):  # a map of shuffled pairs ranked as a real one: the fit's figure
            continue  # (whose own chance test flags such a fit) or none
        top1 = _share(top1)  # tags are stored as text
        if top1 is None:  # NaN or a hand-set tag out of range ranks nothing
            continue
        pool, queries = _count(pool), _count(queries)  # no query count (older records): the pool's, the fewest
        return 2, top1_at(top1, pool, n_queries=queries or None) if pool > 1 else top1, source, top1, pool
    train = m.get("train_top1")
    if isinstance(train, (int, float)) and _share(train) is not None:  # NaN or out of range: no figure, as above
        return 1, float(train), "train", None, 0
    return 0, 0.0, "none", None, 0


def eval_at_chance(v) -> str | None:
    """Why a version's recorded ``eval.top1`` says nothing (its ``eval.top1_chance_p``, the chance a random map
    finds as many pairs, is at :data:`align.retrieval.CHANCE_LEVEL` or above), else None (a record before that tag
    included): :func:`judged` then passes over it."""
    from align.retrieval import CHANCE_LEVEL as AT_CHANCE

    tags = v.tags or {}
    p, top1 = _share(tags.get("eval.top1_chance_p")), _share(tags.get("eval.top1"))
    if p is None or top1 is None or p < AT_CHANCE:
        return None
    return (f"the recorded eval top-1 {top1:.3f} among {_count(tags.get('eval.n_candidates')):,} candidates may be "
            f"chance (a random map finds as many {p:.0%} of the time): not ranked by")


def _share(x) -> float | None:
    """A stored top-1 as a float in [0, 1]; None for anything else: absent, not a number, NaN, out of range, or an
    integer too large for a float (a metric of 10**400, imported from a bundle before imports were checked, was an
    OverflowError in every listing and in every search's path choice)."""
    try:
        x = float(x)
    except (TypeError, ValueError, OverflowError):
        return None
    return x if 0.0 <= x <= 1.0 else None


def _count(x) -> int:
    """A stored count (tags are text), 0 when absent or not a number."""
    try:
        return max(int(float(x)), 0)
    except (TypeError, ValueError, OverflowError):
        return 0


def quality_words(v, converted: bool = True) -> str:
    """E.g. ``"held-out top-1 on 1,000 candidates 0.973"``, or with a small pool ``"held-out top-1 0.840 among 20
    candidates (put on 1,000: 0.000, an estimate that small pools understate)"``; ``"training top-1 0.990"``;
    ``"no held-out figure"``. ``converted=False``: a figure measured among fewer than 1,000 candidates as measured
    alone (``"held-out top-1 0.840 among 20 candidates"``), for a sentence that compares it (:func:`span`)."""
    words = _quality_words(v, converted)
    return words if (why := eval_at_chance(v)) is None else f"{words}; {why}"


def _quality_words(v, converted: bool) -> str:
    kind, score, _, measured, pool = judged(v)
    if kind == 1:
        return f"training top-1 {score:.3f} (no held-out figure)"
    if kind == 0:
        return "no held-out figure"
    if not converted and 1 < pool < 1000:
        return f"held-out top-1 {measured:.3f} among {pool:,} candidates"
    if 1 < pool < SMALL_POOL:
        return (f"held-out top-1 {measured:.3f} among {pool} candidates (put on 1,000: {score:.3f}, an estimate "
                "that small pools understate)")
    return f"held-out top-1 on 1,000 candidates {score:.3f}"


def span(v) -> tuple[float, float]:
    """Where a version's held-out top-1 lies on 1,000 candidates (kind 2 of :func:`judged`): ``(low, high)``. Measured
    among fewer, it is at most the measured figure (more candidates only lower it) and at least :func:`judged`'s
    score, the independence model's (queries of unequal difficulty lose fewer hits as the pool grows; by Jensen's
    inequality that model's figure is the lowest). WordNet minilm→e5: 0.78 among 100 candidates was put on 1,000 at
    0.089 and measured there at 0.559, so the score alone is no figure to call a version worse by. Measured among
    1,000 or more: the figure itself, both ends."""
    kind, score, _, measured, pool = judged(v)
    if kind != 2 or pool <= 1 or pool >= 1000 or measured is None:
        return score, score
    return score, max(score, measured)


def heldout_doubt(metrics: dict) -> str | None:
    """Why a paired fit's held-out top-1 could be chance, or None (it beats chance, or there is no such figure).

    At chance each of ``n_q`` held-out queries finds its partner among ``n_c`` with probability ``1 / n_c``: the
    hits are in doubt when that many or more have probability above :data:`CHANCE_LEVEL` / ``m``, ``m`` the maps
    compared on those rows (``heldout_n_compared``: the chosen one is the best of ``m``; 1 in older records). Too
    few pairs for even finding all of them to beat chance is a doubt too."""
    top1, n_c = _share(metrics.get("heldout_top1")), _count(metrics.get("heldout_n_candidates"))
    n_q, m = _count(metrics.get("heldout_n_queries")) or n_c, max(_count(metrics.get("heldout_n_compared")), 1)
    if top1 is None or n_c < 2 or n_q < 1:
        return None
    hits = round(top1 * n_q)
    if m * _at_chance(n_q - 1, n_q, n_c) > CHANCE_LEVEL:
        return (f"too few pairs to judge: finding all {n_q} held-out pairs among {n_c} could be chance for the "
                f"best of {m} maps compared on them; give more pairs")
    if m * _at_chance(hits - 1, n_q, n_c) > CHANCE_LEVEL:
        return (f"top-1 on held-out pairs {top1:.4f} ({hits} of {n_q} among {n_c}) could be chance for the best "
                f"of {m} maps compared on them")
    return None


@lru_cache(maxsize=4096)
def _at_chance(k: int, n_q: int, n_c: int) -> float:
    """The chance of more than ``k`` hits among ``n_q`` queries at chance (each ``1 / n_c``): ``binom.sf``, remembered
    (~0.2 ms a call; a list of maps judges every live version, most of them with the same few counts)."""
    from scipy.stats import binom

    return float(binom.sf(k, n_q, 1.0 / n_c))


def reliable(metrics: dict | None, method: str | None) -> bool:
    """False when the fit flagged the version unreliable, or when its held-out pairs do not beat chance
    (:func:`heldout_doubt`; not for ``minivec2vec``, which never fits on its pairs). Never True for a version the
    fit flagged; nor for an older record without its query count unless it was judged on one split."""
    metrics = metrics or {}
    if metrics.get("reliable") is False:
        return False
    if metrics.get("heldout_n_queries") is None and metrics.get("heldout_source") != SPLIT:
        return True  # an older cross-validated record: its queries (every pair, not one fold's pool) were not kept
    return method == "minivec2vec" or heldout_doubt(metrics) is None
