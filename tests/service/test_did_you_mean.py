"""The one name suggestion (:func:`service.errors.did_you_mean`) at any number of names.

It ran difflib over every known name: at 100,000 names about a second (scored one by one: ``quick_ratio`` on each,
the full ratio on every name that passed it), and some callers build their error inside a registry transaction.
Beyond a thousand names the characters each name shares with the unknown one are counted for all names at once, and
the full ratio is computed for the best bounds only; the answer is difflib's, ties included.
"""

from __future__ import annotations

import difflib
import random
import string

import pytest

from service.errors import did_you_mean


def _names(rng: random.Random, alphabet: str, n: int) -> list[str]:
    return ["".join(rng.choices(alphabet, k=rng.randint(0, 14))) for _ in range(n)]


def _typo(rng: random.Random, name: str, alphabet: str) -> str:
    chars = list(name)
    if chars and rng.random() < 0.7:
        chars[rng.randrange(len(chars))] = rng.choice(alphabet)
    return "".join(chars)


@pytest.mark.parametrize("alphabet", ["abc-", "abcdef_", string.ascii_lowercase + "-éλ0123456789"])
@pytest.mark.parametrize("n", [40, 3000])
def test_the_suggestion_is_difflibs_at_any_size(alphabet, n):
    # small alphabets make many ties and near-ties: the greatest name of the best ratio must win, as in difflib
    rng = random.Random(f"{alphabet}{n}")
    names = _names(rng, alphabet, n)
    words = [_typo(rng, w, alphabet) for w in rng.sample(names, 30)] + _names(rng, alphabet, 10) + ["", "x" * 300]
    for word in words:
        for cutoff in (0.6, 0.75):
            close = difflib.get_close_matches(word, names, n=1, cutoff=cutoff)
            want = f" (did you mean {close[0]!r}?)" if close else ""
            assert did_you_mean(word, names, cutoff=cutoff, show=repr) == want, (word, cutoff)


def test_a_hundred_thousand_names_are_not_scored_one_by_one(monkeypatch):
    # not a timing (benchmarks/bench_did_you_mean.py has it): the work, counted. difflib scored every name
    calls = {"quick_ratio": 0, "ratio": 0}
    for method in calls:
        real = getattr(difflib.SequenceMatcher, method)

        def counted(self, _real=real, _method=method):
            calls[_method] += 1
            return _real(self)
        monkeypatch.setattr(difflib.SequenceMatcher, method, counted)
    names = [f"map-{i:06d}" for i in range(100_000)]
    assert did_you_mean("map-000123x", names) == " (did you mean 'map-000123'?)"
    assert did_you_mean("minilm-e6", names) == ""
    assert calls["quick_ratio"] == 0 and calls["ratio"] <= 100, calls
