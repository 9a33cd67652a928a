"""Unpaired rows are checked against their side's space as the pairs are, and one map's frame cannot become a
space's reference against the space's other maps (:func:`service.spaces.check_fit_spaces`, ``space_references``).

QA (WordNet): ``fit --pairs --source minilm.npy --target e5.npy --unpaired-source e5.npy ... --source-space minilm``
registered, exit 0, with no word: only the width of unpaired rows was checked. The map's source frame was then fitted
on e5 rows and, first by name, became space 'minilm''s reference: e5 rows went into a MiniLM index unrefused and real
MiniLM rows were warned "unchecked". POST /v1/fits with e5 rows as ``unpaired_source`` the same.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_cli


@pytest.fixture(scope="module")
def files(wordnet, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("unpaired_space")
    out = {}
    for name in ("minilm", "e5"):
        out[name] = tmp / f"{name}.npy"
        np.save(out[name], np.asarray(wordnet[name][:3000], np.float32))
    return out


def test_one_map_of_another_models_rows_is_not_a_spaces_reference(capsys, tmp_path, files):
    """A map fitted on e5 rows under space 'minilm' (first by name and by age, as in QA) and a MiniLM map beside it:
    the first one's 'minilm' side agrees with space 'e5''s references, not with the other 'minilm' one, so it is
    left out; e5 rows are refused from a MiniLM index again, and MiniLM rows pass without a warning."""
    data = tmp_path / "var"
    base = ("--data-dir", data, "fit", "--pairs", "--rows", "0:400", "--method", "procrustes", "--source-space",
            "minilm", "--target-space", "e5", "--quiet", "--target", files["e5"])
    code, _, err = run_cli(capsys, *base, "--source", files["e5"], "--name", "bad")  # nothing to tell it by yet
    assert code == 0, err
    code, _, err = run_cli(capsys, *base, "--source", files["minilm"], "--name", "good")
    assert code == 0, err
    idx = ("--data-dir", data, "index")
    code, _, err = run_cli(capsys, *idx, "create", "docs", "--space", "minilm", files["minilm"], "--rows", "400:1400",
                           "--quiet")
    assert code == 0 and "warning" not in err, err
    code, _, err = run_cli(capsys, *idx, "add", "docs", files["e5"], "--rows", "1400:1500", "--quiet")
    assert code == 2 and "look like space 'e5', not 'minilm'" in err, err
    code, out, err = run_cli(capsys, *idx, "add", "docs", files["minilm"], "--rows", "1500:1600", "--quiet")
    assert code == 0 and "added 100 rows" in out and err == "", err
