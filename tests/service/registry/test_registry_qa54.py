"""Registry findings of a QA pass (session 54): notes and messages that said what was not so."""

from __future__ import annotations

import numpy as np
import pytest

import align
from service.registry import open_registry


def _rotation(seed: int, d: int = 8) -> align.LinearMap:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((64, d))
    Q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    return align.fit_procrustes(X, X @ Q)


def _register(reg, seed: int, top1: float | None = None, name: str = "a->b", **kw):
    metrics = {} if top1 is None else {"heldout_top1": top1, "heldout_n_candidates": 1000,
                                       "heldout_n_queries": 1000}
    return reg.register_version(name, _rotation(seed), source_space="a", target_space="b", method="procrustes",
                                params={}, metrics=metrics, **kw)


@pytest.fixture
def reg(tmp_path):
    r = open_registry(f"sqlite:///{tmp_path}/registry.sqlite", tmp_path / "artifacts")
    yield r
    r.close()


def test_the_worse_refit_note_does_not_say_an_alias_on_a_deleted_version_was_moved(reg):
    """After ``alias prod -> 2`` and ``delete 2``, a worse refit without --alias said "its 'prod' alias was moved to
    it" while prod still pointed at deleted 2 (the alias was set: that was all it looked at)."""
    _register(reg, 1, top1=0.9)
    _register(reg, 2, top1=0.9, alias="prod")
    reg.delete_version("a->b", 2)
    before = reg.resolve_bare("a->b")
    assert before.version == 1
    v3 = _register(reg, 3, top1=0.5)
    note = reg.default_change_note(before, v3)
    assert note.startswith("'a->b' now means a->b:3 (its 'prod' alias is on deleted a->b:2: its newest reliable "
                           "version; "), note
    assert "moved to it" not in note and reg.alias_version("a->b", "prod") == 2


def test_verify_lists_a_live_version_whose_fit_report_is_missing_as_a_warning(reg, tmp_path, capsys):
    """A version committed but its report never written (kill -9 between): ``GET .../report`` is a 404 "missing from
    the data dir" while ``registry verify`` said ok without a word of it. It is listed now, ok still true (the map
    serves), and the CLI warns; a deleted version's report is not looked for."""
    import json

    from conftest import run_cli

    written = reg.report_dir / "a_to_b" / "1.html"
    written.parent.mkdir(parents=True)
    written.write_text("<html></html>")
    _register(reg, 1, report_path="a_to_b/1.html")
    _register(reg, 2, report_path="a_to_b/2.html")  # never written
    _register(reg, 3, report_path="a_to_b/3.html")
    reg.delete_version("a->b", 3)
    checked = reg.verify()
    assert checked["ok"] and checked["missing_reports"] == [
        "a->b:2: its fit report is missing (GET .../report answers 404)"], checked
    code, out, err = run_cli(capsys, "--data-dir", tmp_path, "--registry-url", reg.url, "registry", "verify")
    assert code == 0 and json.loads(out)["missing_reports"] == checked["missing_reports"], out
    assert err == "vecbridge: warning: 1 map version(s) lack their fit report: a->b:2\n", err


def test_an_expected_version_of_an_unset_alias_does_not_say_someone_moved_it(reg):
    """``registry alias NAME staging 1 --expect 1`` on an alias that is not set said "... is not set ... (someone else
    moved it; read it again and decide)": nobody had moved it. The unset case is worded for itself."""
    from service.registry import AliasMovedError

    _register(reg, 1)
    with pytest.raises(AliasMovedError) as e:
        reg.set_alias("a->b", "staging", 1, expected=1)
    assert str(e.value) == ("map a->b@staging is not set, expected it to point at version 1: not moved (never set, "
                            "or someone removed it; to set it only while it is unset, expect version 0)")
    with pytest.raises(AliasMovedError, match="never set, or someone removed it"):
        reg.delete_alias("a->b", "staging", expected=1)


@pytest.mark.parametrize("key, value", [("eval.n_candidates", "0"), ("eval.n_candidates", "-5"),
                                        ("eval.n_candidates", "1.5"), ("eval.n_queries", "0"), ("eval.top1", "1.2"),
                                        ("eval.top1", "nan"), ("eval.top1", "high"), ("eval.recall@10", "-0.1")])
def test_an_eval_tag_that_path_choice_reads_is_checked_on_write(reg, tmp_path, capsys, key, value):
    """Hand-set ``eval.*`` tags (``registry tag NAME V eval.n_candidates 0``, or -5) decided ``registry path``: a top-1
    of "0 candidates" counted unscaled. They are refused (exit 2) unless they hold what ``eval --record`` writes."""
    from conftest import run_cli
    from service.registry import InvalidNameError

    _register(reg, 1, top1=0.5)
    with pytest.raises(InvalidNameError, match=f"tag '{key}' must be "):
        reg.set_tag("a->b", 1, key, value)
    code, _, err = run_cli(capsys, "--data-dir", tmp_path, "--registry-url", reg.url, "registry", "tag", "--", "a->b",
                           "1", key, value)
    assert code == 2 and "must be" in err, err
    assert key not in reg.get_version("a->b", 1).tags
    reg.set_tag("a->b", 1, "eval.top1", "0.999")  # what eval --record writes passes
    reg.set_tag("a->b", 1, "eval.n_candidates", "1000")


def test_an_eval_figure_of_fewer_than_2_candidates_stored_before_the_check_decides_nothing(reg):
    """A tag written before the check (``eval.top1 0.999`` on ``eval.n_candidates 0``) made a version of held-out
    top-1 0.5 the path over one of 0.9; its own fit figure counts now."""
    good = _register(reg, 1, top1=0.9)
    _register(reg, 2, top1=0.5, name="weak")
    with reg.db.tx(write=True) as t:
        for key, value in (("eval.top1", "0.999"), ("eval.n_candidates", "0")):
            t.q("INSERT INTO tags (name, version, key, value) VALUES (?, ?, ?, ?)", ("weak", 1, key, value))
    weak = reg.get_version("weak", 1)
    assert weak.tags["eval.n_candidates"] == "0"
    assert reg.quality_source(weak) == "fit"
    assert [v.ref for v in reg.find_path("a", "b")] == [good.ref]
