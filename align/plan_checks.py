"""What a migration plan checks of its probe and its curve before it recommends anything
(:func:`align.plan.plan_migration` calls these).

- :func:`check_pairs_beyond_chance` — a probe whose rows are not the same texts (one file shuffled, another
  ``--probe-rows``) has a kNN overlap at chance: refused, naming the row order, where the plan used to say
  "alignability 0.002 < 0.4 ... use pairs" to a user who was using pairs.
- :func:`check_queries_find_relevant` — labelled queries none of which finds its relevant probe row with one of
  the models: their retention is a ratio over 0 (every curve point NaN), refused naming the queries and
  ``relevant``, where the plan used to call the probe too small.
- :func:`check_curve_informative` — a learning curve with less than one held-out hit per fit on average (every
  point 0, or a stray hit: a probe far too small for the space) forecasts nothing: refused with the probe size
  that would, where the plan used to recommend re-embedding every row from it.
- :func:`short_of_target` — no migrating K reaches the target: the note that says so and sets the three choices
  side by side (re-embed every row, migrate at the best K with its forecast, keep the old model);
  :func:`best_migrating` that best K (also of a plan of a corpus sample, a fit report's).
- :func:`same_up_to_rotation` — identical neighbourhoods (alignability ~1): the note that the spaces are the same
  up to a rotation.
- :func:`unpaired_share` / :func:`unpaired_note` — a probe partly out of step (some pairs not one text) passes the
  chance check and was planned as if fine, its forecast far below its pairs' own: the note estimates the share.
"""

from __future__ import annotations

import numpy as np

from .exceptions import DegenerateInputError, InputError, TooFewRowsError
from .frames import unit_rows
from .validation import check_random_state

#: one-sided z of the probe's kNN overlap above chance under which its pairs are read as unpaired. WordNet rows
#: 32,768+, one side shuffled (five draws each): z -2.4..2.4 on 1,000 pairs, -1.0..0.9 on 50 (the rows are not
#: independent, so the spread runs above 1); paired: glove->minilm 16 / 247, minilm->e5 15 / 324,
#: minilm->paraphrase-L3 22 / 456 on 50 / 1,000 pairs
PAIRED_Z = 6.0
#: alignability (beyond chance) from which two probes' neighbourhoods count as the same
SAME_SPACE = 0.99
#: :func:`unpaired_share` from which a probe of at least UNPAIRED_MIN_PROBE pairs gets :func:`unpaired_note`. WordNet,
#: all 12 directed pairs of minilm / e5 / paraphrase-L3 / glove, probes of 200, 300, 500 and 1,000 pairs (4
#: contiguous and 8 random row sets each): clean ones read at most 11.3 % (minilm->glove, 200 pairs; 100 more random
#: 200-pair minilm->glove probes up to 14.3 %, one of them 11-15 % over 30 row orders), those into the 384-d models
#: at most 1.7 %; a quarter of the pairs shuffled 17.7-43 % (142 of 144 at 20 % or more), half 44-69 %. On 50 pairs
#: (maps of 25) clean e5->glove read up to 36 % in an earlier estimate, so probes under 200 are not judged
UNPAIRED_SHARE = 0.2
UNPAIRED_MIN_PROBE = 200
#: :func:`unpaired_share`'s parts (maps of 4/5 of the pairs) and the random splits it averages
UNPAIRED_FOLDS = 5
UNPAIRED_SPLITS = 3


def overlap_z(raw_overlap: float, p: int, k: int = 10) -> float:
    """How many standard errors the mean kNN@k overlap ``raw_overlap`` of ``p`` paired rows lies above chance.

    Unpaired, each row's overlap count is hypergeometric (its ``k`` neighbours among the ``N = p - 1`` others
    against another ``k`` of them): mean ``k² / N``, variance ``k (k / N) (1 - k / N) (N - k) / (N - 1)``; the mean
    share over ``p`` rows has standard error ``sqrt(var / p) / k`` (rows taken as independent)."""
    n = p - 1
    mean = k / n
    var = k * (k / n) * (1.0 - k / n) * (n - k) / max(n - 1, 1)
    se = np.sqrt(var / p) / k
    return float((raw_overlap - mean) / se) if se > 0 else float("inf")


def check_pairs_beyond_chance(raw_overlap: float, p: int, names: tuple[str, str], k: int = 10) -> None:
    """Refuse a probe whose kNN@k overlap is within :data:`PAIRED_Z` standard errors of chance: its row ``i`` of
    each side does not look like one text (a plan of it forecast ~0 at every K and recommended re-embedding every
    row; ``fit`` on the same pairs flags the map UNRELIABLE)."""
    z = overlap_z(raw_overlap, p, k)
    if z < PAIRED_Z:
        chance = k / (p - 1)
        raise DegenerateInputError(
            f"the probe's pairs look unpaired: the kNN@{k} overlap of {names[0]} and {names[1]} on {p} pairs is "
            f"{raw_overlap:.4f}, where rows in no relation give {chance:.4f} (alignability "
            f"{(raw_overlap - chance) / (1 - chance):.3f}, {z:.1f} standard errors above chance, under {PAIRED_Z:g}), "
            f"so row i of one does not look like the same text as row i of the other. Check that both hold the same "
            f"texts in the same order (the same rows of each file); if they do, the two models share no structure "
            f"a map could learn. A fit on these pairs would be flagged unreliable (its top-1 could be chance)")


def check_queries_find_relevant(new_r10: float, old_r10: float, n_queries: int) -> None:
    """Refuse labelled queries whose R@10 over the probe is 0 with the new model (``new_r10``) or the old one
    (``old_r10``): the native estimate their retention is a ratio over is then 0 and every curve point NaN, which
    the plan reported as a probe too small to forecast ("averages nan ... give a probe of at least 200 pairs")
    although the cause is the queries or their relevant rows."""
    none = [m for m, r in (("the new model (queries)", new_r10), ("the old model (old_queries)", old_r10)) if r == 0]
    if not none:
        return
    raise InputError(
        f"none of the {n_queries} labelled queries finds its relevant probe row among its top 10 with "
        f"{' or with '.join(none)} (R@10 over the probe: new {new_r10:.3f}, old {old_r10:.3f}), so their retention, "
        f"a ratio over that R@10, is undefined and there is nothing to forecast. The cause is the queries or "
        f"relevant, not the probe's size: check that relevant[i] is the probe row (0-based, in the probe's order) of "
        f"query i's document, that queries and old_queries hold the same queries in relevant's order, and that each "
        f"is of the model its side says")


def check_curve_informative(curve: dict, n_heldout: int, top: int, dim: int, p: int, labelled: bool = False) -> None:
    """Refuse a learning curve that averages less than one held-out hit per fit over all its points: a 50-pair
    WordNet minilm->e5 probe measured 0 at every point on a 40,960-row corpus and a stray hit or two among 25
    held-out pairs on smaller ones (0.02 on average), where 1,000 pairs measured 0.29 at K = 100. Such a curve
    carries no forecast, and the plan recommended re-embedding every row from it. ``labelled``: the curve is of
    ``n_heldout`` labelled queries, not held-out pairs."""
    points = [q["mean"] for qs in curve.values() for q in qs]
    mean = float(np.nanmean(points)) if np.isfinite(points).any() else 0.0
    if mean >= 1.0 / n_heldout:
        return
    need = max(200, 2 * dim)
    why = (f"its maps of up to {top} pairs, fewer than the old space's {dim} dimensions, are underdetermined"
           if top < dim else f"its maps of up to {top} pairs found almost no held-out row's neighbours")
    raise TooFewRowsError(
        f"the probe is too small to forecast: its learning curve averages {mean:.3f} over its {len(points)} points "
        f"(at most {np.nanmax(points + [0.0]):.3f}), less than one hit per fit among its {n_heldout} "
        f"{'labelled queries' if labelled else 'held-out pairs'} (K up to "
        f"{top}): {why}, so the curve says nothing of any K and no K is recommended. Give a probe of at least "
        f"{need} pairs (the plan fits its maps on half of them; {p} given)")


def best_migrating(predicted: list[dict], read) -> dict:
    """The best of the K that migrate when none reaches the target: the highest forecast ``read(q)``, the smallest
    K among equals (to 3 decimals)."""
    return max(predicted, key=lambda q: (round(read(q)["retention"], 3), -q["k"]))


def short_of_target(predicted: list[dict], read, target: float, n_old: int, kept_rows: str,
                    old_r10: float | None) -> tuple[dict, str]:
    """When no K that migrates reaches ``target`` (``read(q)``: the forecast a K is judged by): the best of them
    (the highest forecast, the smallest K among equals) and the note that sets the choices side by side."""
    best = best_migrating(predicted, read)
    f = read(best)
    stay = (f"; or keep the old model: nothing to re-embed (its R@10 of your queries over the corpus: {old_r10:.3f})"
            if old_r10 is not None else "; or keep the old model: nothing to re-embed, and none of the new model's "
            "gains")
    return best, (f"no K that migrates is predicted to reach retention {target:g}{kept_rows}: the best, K = "
                  f"{best['k']:,} ({best['k'] / n_old:.0%} of the corpus), is forecast {f['retention']:.3f} "
                  f"[{f['low']:.3f}, {f['high']:.3f}]. The choices, by cost: re-embed every row ({n_old:,}; the "
                  f"recommendation: the only one predicted to reach {target:g}); migrate with K = {best['k']:,} and "
                  f"accept about {f['retention']:.2f}{stay}")


def same_up_to_rotation(alignability: float, d_src: int, d_tgt: int) -> str | None:
    """The note for a probe whose two sides order every neighbourhood alike (identical or rotated spaces)."""
    if alignability < SAME_SPACE:
        return None
    if d_src == d_tgt:
        return (f"alignability {alignability:.3f}: the two spaces order every neighbourhood alike, as the same space "
                f"up to a rotation does (or the same model): an orthogonal map from at least {d_src} pairs (method "
                f"procrustes, one per dimension) or an unsupervised one recovers it; the curve's smaller K say only "
                f"that fewer pairs than dimensions underdetermine it")
    return (f"alignability {alignability:.3f}: the two spaces order every neighbourhood alike ({d_src}-d and "
            f"{d_tgt}-d): a linear map from at least {d_src} pairs should recover the relation")


def unpaired_share(fit, A, B, *, random_state=0, folds: int = UNPAIRED_FOLDS, splits: int = UNPAIRED_SPLITS) -> float:
    """Estimated share of the probe's pairs ``(A[i], B[i])`` (p, ·) that are not one text: the rows are split into
    ``folds`` parts at random (``random_state``); a map ``fit(rows)`` fitted on the other parts ranks each row's
    partner among all ``p`` rows of ``B``. A real pair's partner ranks near the top, an unpaired one's anywhere (its
    rank uniform), so twice the share of ranks in the lower half estimates the unpaired share (Storey's pi0 at
    lambda = 1/2), averaged over ``splits`` draws of the parts. Maps of 4/5 of the pairs (not of the fixed even or
    odd half: a weak map, minilm->glove on 100 pairs, ranked real partners low on clean probes, 10-21 % by row order)
    and the average keep a clean probe's reading low. Cost: ``folds * splits`` fits and ``splits p² d``."""
    rng = check_random_state(random_state)
    p = A.shape[0]
    T = unit_rows(B)
    lower = 0
    for _ in range(splits):
        for test in np.array_split(rng.permutation(p), folds):
            Z = unit_rows(fit(np.setdiff1d(np.arange(p), test)).apply(A[test], output="raw", validate=False))
            S = Z @ T.T
            above = (S > S[np.arange(test.size), test][:, None]).sum(axis=1)  # candidates ranked above the partner
            lower += int((above / max(p - 1, 1) > 0.5).sum())
    return float(min(1.0, 2.0 * lower / (p * splits)))


def unpaired_note(share: float, p: int) -> str | None:
    """The note of a probe of ``p`` pairs whose :func:`unpaired_share` is ``share``; None below
    :data:`UNPAIRED_SHARE` or :data:`UNPAIRED_MIN_PROBE`."""
    if p < UNPAIRED_MIN_PROBE or share < UNPAIRED_SHARE:
        return None
    return (f"about {share:.0%} of the probe's {p} pairs look unpaired: maps fitted on the rest of the probe rank "
            f"their partner in the lower half of the candidates, as they would a random row (clean WordNet probes "
            f"of 200-1,000 pairs, 12 model pairs, read at most 15 %, 11-15 % where the map is weak, minilm->glove "
            f"on 200; with a quarter of their pairs shuffled 18-43 %, half 44-69 %). If some probe rows are not the "
            f"same text under both models (one file out of step from some row on, a bad merge), the curve and the "
            f"forecast are of the damaged probe, far below what its right pairs give (minilm->e5, 1,000 pairs, half "
            f"shuffled: 0.058 at K = 1,000 in [0.017, 0.100], against 0.411 from the same pairs unshuffled): check "
            f"the probe's rows; if they are right, the two models disagree on those texts")
