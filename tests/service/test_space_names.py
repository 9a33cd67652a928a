"""The name rule of a misspelt space (:mod:`service.space_names`): a near miss is a case / separator variant, or a
Damerau-Levenshtein distance of 1 for names of 4+ characters, 2 for 8+. A fine-tuned model's 'minilm-ft' and a test
fixture's 'new' beside 'new_pairs' are new spaces, not typos (the first try refused them by rows alone)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from align.frames import Frame
from service.space_names import MisspeltSpaceError, check_new_space, folded, name_distance, near_miss
from service.spaces import Reference


@pytest.mark.parametrize("new, known, expected", [
    ("minlm", "minilm", 1), ("minilm", "minlm", 1), ("mnilm", "minilm", 1), ("imnilm", "minilm", 1),
    ("MiniLM", "minilm", 0), ("mini-lm", "minilm", 0), ("mini_LM", "mini.lm", 0), ("E5", "e5", 0),
    ("e5-larg", "e5-large", 1), ("e5-lareg", "e5-large", 1), ("multilingual-e5", "multilingul-5e", 2),
    ("minilm-ft", "minilm", None), ("new", "new_pairs", None), ("new_pairs", "new", None), ("minilm", "minilm", None),
    ("e5x", "e5", None), ("e6", "e5", None), ("bert", "bart", 1), ("bge", "bga", None), ("minilm12", "minilm6", None),
    ("abcdefgh", "abcdefhgx", 2), ("abcdefg", "abcdeggx", None),
])
def test_near_miss_cases(new, known, expected):
    assert near_miss(new, known) == expected


_NAMES = st.text(alphabet="abcdefghxyz0123._-", min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(_NAMES, _NAMES)
def test_near_miss_is_symmetric_and_bounded_by_the_shorter_name(a, b):
    d = near_miss(a, b)
    assert d == near_miss(b, a)
    if d is not None:
        shorter = min(len(folded(a)), len(folded(b)))
        assert d == 0 or d <= (2 if shorter >= 8 else 1) and shorter >= 4
        assert d == name_distance(folded(a), folded(b))


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="abcdefgh", min_size=5, max_size=12), st.data())
def test_one_edit_of_a_name_of_five_or_more_is_a_near_miss(name, data):
    i = data.draw(st.integers(0, len(name) - 1))
    ch = data.draw(st.sampled_from("xyz"))  # a deletion leaves 4 or more characters: the rule's shorter name
    edits = [name[:i] + name[i + 1:], name[:i] + ch + name[i + 1:], name[:i] + ch + name[i:]]
    if i + 1 < len(name) and name[i] != name[i + 1]:
        edits.append(name[:i] + name[i + 1] + name[i] + name[i + 2:])  # two neighbours swapped
    for edit in edits:
        assert near_miss(edit, name) == 1, edit
        assert near_miss(edit.upper(), name.replace(name[0], name[0] + "-", 1)) == 1, edit


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="abcdefgh", min_size=1, max_size=7), st.text(alphabet="xyz", min_size=2, max_size=4))
def test_a_suffix_of_two_or_more_characters_on_a_short_name_is_no_near_miss(name, suffix):
    assert near_miss(f"{name}-{suffix}", name) is None  # 'minilm-ft' beside 'minilm'


class _Space:
    def __init__(self, name, dim):
        self.name, self.dim = name, dim


def test_check_new_space_needs_both_the_name_and_the_rows():
    """Rows a registered space's reference recognises, declared of a new space: refused only under a near miss of
    its name; a near miss whose rows it does not recognise, a registered name, or too few rows: passed."""
    rng = np.random.default_rng(0)
    mu = rng.normal(size=32)
    own = mu + rng.normal(scale=1.5, size=(400, 32))  # rows sharing a direction
    other = -mu + rng.normal(scale=1.5, size=(400, 32))
    refs = {"minilm": [Reference("minilm", Frame.fit(own[:300].astype(np.float32)), "minilm's map")]}
    registered = [_Space("minilm", 32), _Space("e5", 32)]
    rows = own[300:].astype(np.float32)
    with pytest.raises(MisspeltSpaceError, match=r"space 'minilm' \(name distance 1\)") as e:
        check_new_space("minlm", rows, registered, refs, option="--source-space")
    assert e.value.looks_like == "minilm" and "`vecbridge spaces add minlm --dim 32`" in str(e.value)
    check_new_space("minilm-ft", rows, registered, refs)  # a new model's name
    check_new_space("minlm", other[300:].astype(np.float32), registered, refs)  # rows it does not recognise
    check_new_space("minlm", rows, [*registered, _Space("minlm", 32)], refs)  # registered first, on purpose
    check_new_space("minlm", rows[:10], registered, refs)  # too few rows to tell
    check_new_space("minlm", rows, [_Space("minilm", 64)], refs)  # another width: not its rows
