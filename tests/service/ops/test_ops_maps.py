"""service.ops.maps.run_fit: its stages, cancellation, and the report written only for a registered version."""

from __future__ import annotations

import numpy as np
import pytest

from align.exceptions import Cancelled
from service.ops.maps import run_fit
from service.progress import Stages
from service.registry import ConflictError, open_registry
from _api_support import planted


@pytest.fixture
def reg(tmp_path):
    return open_registry(f"sqlite:///{tmp_path}/reg.sqlite", tmp_path / "artifacts")


def _reports(reg) -> list:
    return sorted(p for p in reg.report_dir.rglob("*") if p.is_file()) if reg.report_dir.exists() else []


def _fit(reg, **kw):
    X, Y, _ = planted(200)
    args = dict(name="a2b", source=X, target=Y, method="procrustes", paired=True, source_space="a",
                target_space="b")
    return run_fit(reg, **{**args, **kw})


def test_stages_are_reported_in_order_and_timed(reg):
    seen = []
    v = _fit(reg, progress=lambda stage, f: seen.append((stage, f)))
    top = [s for s, _ in seen if not s.startswith(("fit: ", "report: "))]
    assert top == ["validate", "validate", "fit", "fit", "diagnostics", "diagnostics", "report", "report", "register"]
    assert all(0.0 <= f <= 1.0 for _, f in seen)
    assert set(v.metrics["timings"]) == {"validate + hash", "fit", "diagnostics", "report"}
    assert reg.report_file(v).read_text().startswith("<!doctype html>")
    assert _reports(reg) == [reg.report_file(v)]


def test_the_report_stage_reports_how_far_it_has_got(reg):
    """The report stage (the migration plan's probe fits and the figures: 7 of a 10 s fit) said ``report`` 0.0 until
    it ended, so a job showed no fraction and no ETA for most of its run. It now reports the plan's learning curve
    and the rendering, section by section, each with its fraction."""
    seen = []
    _fit(reg, progress=lambda stage, f: seen.append((stage, f)))
    inner = [(s, f) for s, f in seen if s.startswith("report: ")]
    assert [s for s, _ in seen].index("report") < [s for s, _ in seen].index(inner[0][0])
    curve = [f for s, f in inner if s == "report: migration plan: learning curve"]
    render = [f for s, f in inner if s == "report: render"]
    assert any(0.0 < f < 1.0 for f in curve) and curve == sorted(curve) and curve[-1] == 1.0
    assert len(render) == 8 and render == sorted(render) and render[0] == 0.0 and render[-1] == 1.0


@pytest.mark.parametrize("restarts", [1, 2])
def test_the_fitters_stages_have_one_name_in_progress_and_timings(reg, restarts):
    """The CLI bar and a job's timings.stages said ``fit: restart 0: refine1`` where the registry's metrics.timings
    and the report said ``fit: restart 0 icp`` (and ``fit: restart 0 ...`` of a single restart the progress never
    named): each of the fitter's stages now has the name ``refine`` gives it, the same in both."""
    seen = set()
    X, Y, _ = planted(200)
    v = run_fit(reg, name="a2b", source=X, target=Y, method="minivec2vec", paired=False, source_space="a",
                target_space="b", params={"n_restarts": restarts}, report=False,
                progress=lambda stage, f: seen.add(stage))
    runs = {k for k in v.metrics["timings"] if k.split(": ")[-1] in ("init", "icp", "self_learning", "criterion")}
    assert len(runs) == 4 * restarts, v.metrics["timings"]
    assert runs <= seen, (runs - seen, seen)
    assert all(("restart " in k) == (restarts > 1) for k in runs)


def test_a_conflicting_registration_leaves_no_report(reg, tmp_path):
    _fit(reg, report=False)  # a2b now connects a -> b
    copy = tmp_path / "copy.html"
    with pytest.raises(ConflictError):
        _fit(reg, source_space="c", target_space="d", report_copy=copy)
    assert _reports(reg) == [] and not copy.exists()
    assert [v.version for v in reg.list_versions("a2b", True)] == [1]


def test_a_report_the_data_dir_cannot_take_is_logged_in_the_vecbridge_tree(reg, tmp_path):
    """The warning of a report that could not be written came from logger ``service.ops.maps``, outside the
    ``vecbridge`` tree that ``serve`` formats: plain text amid its JSON lines. Now a JSON line with its fields."""
    import io
    import json
    import logging

    from service.logging import JsonFormatter

    (tmp_path / "blocked").touch()  # a file where the report folder goes
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("vecbridge")
    root.addHandler(handler)
    try:
        v = _fit(reg, report_dir=tmp_path / "blocked")
    finally:
        root.removeHandler(handler)
    lines = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert [(d["logger"], d["level"], d["map"]) for d in lines] == [("vecbridge.maps", "WARNING", v.ref)], lines
    assert lines[0]["path"] == str(reg.report_file(v)) and "is a file, not a folder" in lines[0]["error"]


def test_a_report_the_data_dir_cannot_take_is_a_note_of_the_fit(reg, tmp_path):
    """An HTTP fit whose report could not be written (a subfolder of reports/ given to root, a full disk) "succeeded"
    with no word of it in its notes, and its report route then answered 404. The fit's notes (a job's result, the
    command line's ``vecbridge: note:`` lines) now say so and where; a fit whose report was written has no such note."""
    notes: list[str] = []
    v = _fit(reg, report_dir=tmp_path, notes=notes)
    assert not [n for n in notes if "fit report" in n] and reg.report_file(v).is_file()
    (tmp_path / "blocked").touch()  # a file where the report folder goes
    notes = []
    v = _fit(reg, report_dir=tmp_path / "blocked", notes=notes)
    said = [n for n in notes if "fit report" in n]
    assert len(said) == 1 and said[0].startswith(f"map {v.ref} is registered but its fit report could not be "
                                                 "written (") and str(reg.report_file(v)) in said[0], notes
    assert said[0].endswith("its report route answers 404") and not reg.report_file(v).exists()


@pytest.mark.parametrize("clash", [{"source_space": "c", "target_space": "d"},  # the name is bound to a -> b
                                   {"name": "c2b", "source_space": "a", "target_space": "e"}])  # a wider than space a
def test_what_registration_would_refuse_is_refused_before_the_fit(reg, monkeypatch, clash):
    """A name bound to other spaces, or a space of another width: refused before minutes of fitting, and no
    artifact lands in the store."""
    import service.ops.maps as ops_maps

    _fit(reg, report=False)
    stored = sorted(p.name for p in reg.store.root.rglob("*") if p.is_file())

    def no_fit(*a, **k):
        raise AssertionError("the fit ran")

    monkeypatch.setattr(ops_maps, "fit_map", no_fit)
    X, Y, _ = planted(200)
    if clash.get("name") == "c2b":
        X = np.hstack([X, X])  # 2 x the width of space a
    with pytest.raises(ConflictError, match="connects|-d, not"):
        _fit(reg, **{"source": X, "target": Y, **clash})
    assert sorted(p.name for p in reg.store.root.rglob("*") if p.is_file()) == stored


@pytest.mark.parametrize("stage", ["validate", "fit", "diagnostics", "report", "report: render"])
def test_a_cancel_before_registration_registers_and_writes_nothing(reg, stage):
    asked = {"now": False}

    def progress(s, f):
        if s == stage:
            asked["now"] = True

    with pytest.raises(Cancelled, match=stage):
        _fit(reg, progress=progress, should_cancel=lambda: asked["now"])
    assert _reports(reg) == []
    assert reg.list_maps() == []


def test_a_cancel_asked_once_registration_began_is_too_late(reg):
    """After the last cancellation point the fit completes: a version and its report, never half of one."""
    asked = {"now": False}
    v = _fit(reg, progress=lambda s, f: asked.update(now=asked["now"] or s == "register"),
             should_cancel=lambda: asked["now"])
    assert asked["now"] and _reports(reg) == [reg.report_file(v)]


def test_stages_helper_checks_cancel_at_every_report():
    calls = iter([False, True])
    st = Stages(lambda s, f: None, should_cancel=lambda: next(calls), what="job 7")
    with pytest.raises(Cancelled, match="job 7 cancelled during b"):
        with st.stage("a"):
            st.tick("b", 0.5)
    assert st.timings == {}  # the stage did not finish
    inner = []
    st = Stages(lambda s, f: inner.append((s, f)))
    st.sub("fit")("init", np.float32(0.5))
    assert inner == [("fit: init", 0.5)] and type(inner[0][1]) is float


def test_a_paired_fit_at_chance_is_flagged_unreliable_and_not_chosen_for_a_path(reg):
    # a ridge penalty so large that the map is constant: it used to register as an ordinary version and be
    # the path a -> b; now it carries the same flag as an unreliable unsupervised fit (alpha 1e12, the most a fit
    # takes: W is lost beside the target mean in float32; alpha 1e300 gave a W float32 stores as 0, which
    # LinearMap refuses)
    good = _fit(reg, name="good", method="ridge", params={"alpha": 1e-2}, alias="prod")
    assert good.metrics["reliable"] is True and good.metrics["train_top1"] > 0.9
    bad = _fit(reg, name="flat", method="ridge", params={"alpha": 1e12}, source_space="a", target_space="c")
    assert bad.metrics["reliable"] is False and "near chance" in bad.metrics["unreliable_reason"]
    assert bad.metrics["train_top1"] < 5.0 / bad.metrics["train_n_candidates"]
    assert [v.ref for v in reg.find_path("a", "b")] == [good.ref]
    with pytest.raises(Exception, match="unreliable"):
        reg.find_path("a", "c")


@pytest.mark.filterwarnings("ignore::align.exceptions.ConvergenceWarning")
def test_minivec2vec_on_pairs_at_chance_keeps_the_pairs_verdict_and_too_few_rows_are_not_judged(reg):
    """A paired minivec2vec fit whose map misses its own pairs (100 rows of noise: top-1 at chance) registered as
    reliable: MiniVec2Vec's own flag, judged on its training rows, overwrote the pairs' verdict. Unpaired, too
    few rows to hold any out were judged on the rows the map was refined on, where a wrong map passes."""
    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(100, 16)), rng.normal(size=(100, 16))
    notes: list[str] = []
    v = run_fit(reg, name="noise", source=X, target=Y, method="minivec2vec", paired=True, source_space="a",
                target_space="b", notes=notes)
    assert v.metrics["reliable"] is False and "near chance" in v.metrics["unreliable_reason"]
    assert any("minivec2vec fits without pairs" in n for n in notes), notes  # the pairs went unused silently
    notes = []  # seed pairs given: no note asking for them (it told the user to give the seed pairs they gave)
    run_fit(reg, name="noise", source=X, target=Y, method="minivec2vec", paired=True, source_space="a",
            target_space="b", seed_pairs=(np.arange(10), np.arange(10)), notes=notes)
    assert not any("seed pairs" in n for n in notes), notes
    u = run_fit(reg, name="noise2", source=X, target=Y, method="minivec2vec", paired=False, source_space="a",
                target_space="b")
    assert u.metrics["reliable"] is False and "too few rows" in u.metrics["unreliable_reason"]


def _rotated(seed: int, n: int, *, noise: float, d: int = 48):
    """``(X, Y, rng)``: ``n`` rows of ``d`` Gaussian columns and their planted rotation plus ``noise``."""
    rng = np.random.default_rng(seed)
    Q = np.linalg.qr(rng.normal(size=(d, d)))[0]
    X = rng.normal(size=(n, d)).astype(np.float32)
    return X, (X @ Q + noise * rng.normal(size=X.shape)).astype(np.float32), rng


def test_a_paired_fit_of_mispaired_rows_is_flagged_unreliable_by_its_held_out_top1(reg):
    # rows paired wrongly (a shuffle, an off-by-one): the map memorises its training pairs (WordNet minilm->e5, 4,000
    # shuffled pairs: training top-1 0.44, registered reliable) and is at chance on any other row; a refit without
    # `prod` then became what the bare name and the path a -> b meant (search partner top-1 0.0005 instead of 0.97)
    X, Y, rng = _rotated(5, 2000, noise=0.3)
    good = _fit(reg, name="m", source=X[:1000], target=Y[:1000])
    assert good.metrics["reliable"] is True
    for method, params in (("procrustes", {}), ("ridge", {"alpha": 1e-6})):
        bad = _fit(reg, name="m", method=method, params=params, source=X[:100], target=Y[:100][rng.permutation(100)])
        assert bad.metrics["reliable"] is False and "held-out pairs" in bad.metrics["unreliable_reason"], bad.metrics
    assert reg.resolve("m").ref == good.ref
    assert [v.ref for v in reg.find_path("a", "b")] == [good.ref]


def test_a_selected_fit_of_shuffled_pairs_is_never_reliable_and_takes_no_alias(reg):
    # auto / contrastive / cluster were judged on one held-out split against twice chance, by the figure of the best
    # of ~25 maps chosen on that split: 6 of 10 auto fits of 100 shuffled WordNet pairs were reliable and took prod
    X, Y, rng = _rotated(7, 1100, noise=0.3)
    good = _fit(reg, name="m", method="auto", source=X[:100], target=Y[:100], alias="prod")
    assert good.metrics["reliable"] is True and good.metrics["heldout_n_compared"] > 10
    start = 100
    for i, method in enumerate(("auto",) * 4 + ("contrastive", "cluster")):
        rows = slice(start, start := start + (100 if method == "auto" else 300))
        bad = _fit(reg, name="m", method=method, source=X[rows], random_state=i, alias="prod",
                   target=Y[rows][rng.permutation(rows.stop - rows.start)])
        assert bad.metrics["reliable"] is False and "could be chance" in bad.metrics["unreliable_reason"], bad.metrics
    assert reg.alias_version("m", "prod") == good.version and [v.ref for v in reg.find_path("a", "b")] == [good.ref]


@pytest.mark.parametrize("method, k", [("procrustes", 2), ("ridge", 3), ("ridge", 5), ("procrustes", 9),
                                       ("auto", 5), ("auto", 12), ("contrastive", 19)])
def test_a_paired_fit_of_too_few_pairs_to_judge_is_unreliable_and_says_why(reg, method, k):
    # 2, 3 or 5 pairs found each other among 2-5 candidates (train top-1 1.0 among 2) and were called reliable
    X, Y, _ = _rotated(8, k, noise=0.3)
    notes: list[str] = []
    v = _fit(reg, method=method, source=X, target=Y, alias="prod", notes=notes)
    assert v.metrics["reliable"] is False and v.metrics["unreliable_reason"].startswith("too few pairs to judge")
    assert "give more pairs" in v.metrics["unreliable_reason"] and "alias 'prod' was not created" in notes[0]


def test_path_choice_ranks_paired_fits_by_held_out_top1_not_by_memorised_training_pairs(reg):
    # a ridge map of few pairs in many dimensions finds every one of its training pairs (train top-1 1.0) and
    # fewer held-out ones; it used to win the path over a Procrustes map of more pairs by that training figure
    X, Y, _ = _rotated(3, 3200, noise=1.2)
    good = _fit(reg, name="procrustes-2000", source=X[:2000], target=Y[:2000])
    over = _fit(reg, name="ridge-120", method="ridge", params={"alpha": 1e-6}, source=X[2000:2120],
                target=Y[2000:2120])
    assert over.metrics["train_top1"] > good.metrics["train_top1"]  # the figure that used to decide
    assert good.metrics["heldout_source"] == "5-fold cross-validation"
    assert good.metrics["heldout_n_candidates"] == 400 and over.metrics["heldout_n_candidates"] == 24
    truth = {}
    for v in (good, over):  # held out among the same 1,000 rows neither map saw
        m = reg.load_map(v.ref)
        Z = m.apply(X[2200:3200], output="linear")
        D = m.target_frame.apply(Y[2200:3200])
        S = (Z / np.linalg.norm(Z, axis=1, keepdims=True)) @ (D / np.linalg.norm(D, axis=1, keepdims=True)).T
        truth[v.ref] = float((S.argmax(axis=1) == np.arange(1000)).mean())
    assert truth[good.ref] > truth[over.ref] + 0.05, truth
    assert reg.quality(good) > reg.quality(over)
    assert [v.ref for v in reg.find_path("a", "b")] == [good.ref]


def test_an_alias_is_not_moved_to_an_unreliable_fit(reg):
    """`fit --alias prod` of a failed refit (shuffled pairs: flagged unreliable, exit 1) moved prod to it, and a
    pinned alias wins over "never chosen for a path": every search then went through a map at chance. The
    version is still registered; prod stays, and the note says where it points."""
    X, Y, _ = planted(400)
    good = _fit(reg, source=X, target=Y, alias="prod")
    notes: list[str] = []
    bad = _fit(reg, source=X, target=np.random.default_rng(1).permutation(Y), alias="prod", notes=notes)
    assert bad.metrics["reliable"] is False and good.metrics.get("reliable") is not False
    assert reg.alias_version("a2b", "prod") == good.version == 1
    assert [v.ref for v in reg.find_path("a", "b")] == [good.ref] and reg.resolve("a2b").version == 1
    assert notes == [f"alias 'prod' still points at a2b:1, not moved to {bad.ref}: the fit is flagged unreliable "
                     f"(move it by hand if you mean to: `vecbridge registry alias a2b prod {bad.version}`)"]
    assert "prod (not moved: the fit is unreliable)" in reg.report_file(bad).read_text()
    notes.clear()
    _fit(reg, name="c2d", source=X, target=np.random.default_rng(2).permutation(Y), source_space="c",
         target_space="d", alias="prod", notes=notes)
    assert notes and "alias 'prod' was not created" in notes[0]


def test_the_worse_refit_note_says_when_the_prod_alias_was_moved(reg):
    """The note on a refit that looks worse said "no 'prod' alias" when --alias prod had just moved it."""
    X, Y, _ = planted(1000)
    Y = Y + 0.6 * np.random.default_rng(5).standard_normal(Y.shape).astype(np.float32)
    _fit(reg, source=X, target=Y, alias="prod", method="ridge")
    notes: list[str] = []
    few = _fit(reg, source=X[:20], target=Y[:20], alias="prod", method="ridge", notes=notes)  # held-out ~0
    assert reg.alias_version("a2b", "prod") == few.version
    assert notes and "its 'prod' alias was moved to it" in notes[0] and "no 'prod' alias" not in notes[0], notes


def test_a_report_that_fails_to_render_leaves_the_map_registered_with_a_note(tmp_path):
    """Rendering the report (matplotlib, the plan) ran before registration with no error handling: a broken
    matplotlib made ``vecbridge fit`` exit 3 "internal error: ImportError" and the fitted map was lost. The report is a
    by-product: the map is now registered without one, and the failure is logged and noted."""
    import subprocess
    import sys

    from _servers import ROOT, env_for

    shim = tmp_path / "shim" / "matplotlib"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('this matplotlib is broken')\n")
    X, Y, _ = planted(200)
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", Y)
    env = {**env_for(tmp_path / "data", 8000), "PYTHONPATH": f"{shim.parent}:{ROOT}:{ROOT / 'tests'}"}
    fit = subprocess.run([sys.executable, "-m", "service.cli", "fit", "--pairs", "--source", str(tmp_path / "x.npy"),
                          "--target", str(tmp_path / "y.npy"), "--method", "procrustes", "--name", "nompl",
                          "--source-space", "a", "--target-space", "b"], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=False)
    assert fit.returncode == 0, fit.stderr
    assert "no fit report: rendering it failed (ImportError: this matplotlib is broken)" in fit.stderr
    reg = open_registry(f"sqlite:///{tmp_path / 'data' / 'registry.sqlite'}", tmp_path / "data" / "artifacts")
    try:
        v = reg.resolve("nompl:1")
        assert v.report_path is None and reg.report_file(v) is None
    finally:
        reg.close()


@pytest.mark.parametrize("method, paired, first, second", [
    ("auto", True, {}, {}),
    ("minivec2vec", False, {"threads": 1}, {"threads": 2}),  # `fit --help`: "the same map for any count"
])
def test_the_same_fit_twice_registers_one_artifact(reg, tmp_path, method, paired, first, second):
    """Same seed, same arrays: one artifact sha256, one file; the seconds and the executor are in the metrics
    (the artifact recorded them, so every refit was another artifact and a bundle's dedup never matched)."""
    X, Y, _ = planted(200)
    kw = {"name": "a2b", "source": X, "target": Y, "method": method, "paired": paired, "source_space": "a",
          "target_space": "b", "params": {"n_restarts": 1} if method == "minivec2vec" else {}, "report": False}
    v1, v2 = run_fit(reg, **kw, **first), run_fit(reg, **kw, **second)
    assert v1.artifact_sha256 == v2.artifact_sha256
    assert v1.artifact_path == v2.artifact_path
    assert len([p for p in (tmp_path / "artifacts").rglob("*") if p.is_file()]) == 1
    assert v2.metrics["timings"]["fit"] > 0
    if method == "minivec2vec":
        assert v2.metrics["executor"] == "threads:2" and "executor" not in v1.metrics
        assert {"fit: init", "fit: icp", "fit: criterion"} <= set(v2.metrics["timings"])  # the fitter's own stages
    else:
        assert all(c["seconds"] >= 0 for c in v2.metrics["selection"]["candidates"].values())
