"""service.ops.steers: the steer use cases the API and the CLI call (fit, apply, lens, transfer)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from align import LinearMap
from align.exceptions import InputError, PairCountError
from align.steer import MeanShift, Steer
from service.ops.steers import (apply_steer_job, check_steer_params, embed_and_register, fit_steer_job, steer_lens,
                                 transfer_and_register)
from service.registry import ConflictError, InvalidNameError, open_registry

from _synthetic import planted_attribute


def data(n=300, d=8, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = np.where(X[:, 0] > 1, 1, np.where(X[:, 0] < -1, -1, 0))
    X[:, 1] += 3
    return (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32), y


def test_fit_job_vectors_with_progress():
    X, y = data()
    seen = []
    s = fit_steer_job(X, y, {"method": "lm-steer", "rank": 2, "max_iter": 10}, lambda st, f: seen.append((st, f)),
                      space="toy")
    assert isinstance(s, Steer) and s.rank == 2 and s.metadata["space"] == "toy"
    fr = [f for _, f in seen]
    assert {st for st, _ in seen} == {"fit"} and fr[-1] == 1.0 and all(0.0 <= f <= 1.0 for f in fr) and fr == sorted(fr)
    seen.clear()
    s = fit_steer_job(X, y, {}, lambda st, f: seen.append(f), space="toy")     # default: local discriminant
    assert s.rank == 1 and s.metadata["method"] == "local-discriminant" and seen[-1] == 1.0


def test_fit_job_texts_with_encoder_and_mean_shift():
    X, y = data()
    texts = [f"t{i}" for i in range(len(X))]
    lookup = dict(zip(texts, X))
    seen = []
    s = fit_steer_job(None, y, {"method": "mean-shift"}, lambda st, f: seen.append(st), texts=texts,
                      encoder=lambda ts: np.stack([lookup[t] for t in ts]))
    assert isinstance(s, MeanShift) and s.metadata["n_texts"] == len(texts) and seen == ["encode", "fit"]


def test_fit_job_errors():
    X, y = data()
    with pytest.raises(InputError):
        fit_steer_job(X, y, {"rnak": 2})
    with pytest.raises(InputError):
        fit_steer_job(X, y, {"method": "magic"})
    with pytest.raises(InputError):
        fit_steer_job(None, y, texts=["a"])  # no encoder
    with pytest.raises(InputError):
        fit_steer_job(X, None)


def test_apply_and_lens():
    X, y = data()
    s = fit_steer_job(X, y, {"method": "lm-steer", "rank": 2, "max_iter": 10})
    ms = fit_steer_job(X, y, {"method": "mean-shift"})
    Q = X[:5]
    np.testing.assert_allclose(apply_steer_job(Q, [(s, 1.0), (ms, 0.5)]), ms.apply(s.apply(Q, 1.0), 0.5), atol=1e-6)
    assert np.array_equal(apply_steer_job(Q, [(s, 0.0)]), Q)
    names = [str(i) for i in range(len(X))]
    lens = steer_lens(s, X, names, k=3)  # n_directions 4 capped at the rank
    assert len(lens) == 2 and len(lens[0]["positive"]) == 3
    assert steer_lens(s, X, None) == [] and steer_lens(ms, X, None) == []
    [shift] = steer_lens(ms, X, names, k=3)  # its one direction v: the rows ranked by c.v / |v|
    score = X @ (ms.v / np.linalg.norm(ms.v))
    assert [it["index"] for it in shift["positive"]] == np.argsort(-score)[:3].tolist()
    assert [it["index"] for it in shift["negative"]] == np.argsort(score)[:3].tolist()
    assert shift["sigma"] == pytest.approx(np.linalg.norm(ms.v))
    with pytest.raises(PairCountError):
        steer_lens(s, X, names[:-1])


def _steer_and_map(tmp_path, target: str, seed: int):
    """A registry with the steer ``pos`` fitted in space ``a`` and a rotation map ``a2<target>``: ``(registry, the
    steer's info, the fitted steer, X, y)``."""
    X, y = data()
    reg = open_registry(f"sqlite:///{tmp_path}/r.sqlite", tmp_path / "artifacts")
    s = fit_steer_job(X, y, {"method": "lm-steer", "rank": 2, "max_iter": 10})
    src = reg.register_steer("pos", s, space="a", params={}, lens=[])
    R = np.linalg.qr(np.random.default_rng(seed).normal(size=(8, 8)))[0].astype(np.float32)
    reg.register_version(f"a2{target}", LinearMap(R), source_space="a", target_space=target, method="procrustes",
                         params={})
    return reg, src, s, X, y


def test_transfer_registers_in_the_maps_target_space(tmp_path):
    reg, src, _, X, y = _steer_and_map(tmp_path, "b", 0)
    moved = transfer_and_register(reg, src.ref, "a2b", name="pos-b")
    t = reg.load_steer(moved)
    assert moved.space == "b" and t.metadata["space"] == "b" and t.metadata["method"] == "transfer"
    assert moved.inputs == {"via": "transfer", "steer": src.ref, "map": "a2b:1"}
    with pytest.raises(InputError, match="goes from"):
        transfer_and_register(reg, moved.ref, "a2b")  # the steer lives in b, the map starts in a
    ms = reg.register_steer("shift", fit_steer_job(X, y, {"method": "mean-shift"}), space="a", params={}, lens=[])
    with pytest.raises(InputError, match="mean-shift"):
        transfer_and_register(reg, ms.ref, "a2b")
    # a name that lives in another space: refused before the transfer's artifact is written (it was left behind
    # as an orphan file, one per refused request)
    R2 = np.linalg.qr(np.random.default_rng(1).normal(size=(8, 8)))[0].astype(np.float32)
    reg.register_version("a2c", LinearMap(R2), source_space="a", target_space="c", method="procrustes", params={})
    before = reg.store.all_relpaths()
    with pytest.raises(ConflictError, match="steer 'pos' lives in space 'a', not 'c'"):
        transfer_and_register(reg, src.ref, "a2c", name="pos")
    assert reg.store.all_relpaths() == before and reg.verify()["orphan_artifacts"] == []


def test_transfer_without_a_name_registers_source_dash_target(tmp_path):
    """The default name was the source steer's own, which is bound to the source space: every transfer across
    spaces without ``name`` failed with ConflictError ("steer 'pos' lives in space 'a', not 'c'"). It is now
    ``{name}-{target space}``; one over the 128-character limit asks for a name."""
    reg, src, s, _, _ = _steer_and_map(tmp_path, "c", 1)
    moved = transfer_and_register(reg, src.ref, "a2c")
    assert (moved.name, moved.space, moved.version) == ("pos-c", "c", 1)
    assert transfer_and_register(reg, src.ref, "a2c").ref == "pos-c:2"  # again: a new version of the same name
    long = reg.register_steer("x" * 127, s, space="a", params={}, lens=[])
    with pytest.raises(InvalidNameError, match="has 129 characters, over 128: give the transferred steer a name"):
        transfer_and_register(reg, long.ref, "a2c")
    assert transfer_and_register(reg, long.ref, "a2c", name="short").name == "short"


def test_a_failed_steer_fit_leaves_no_space_behind(tmp_path):
    """embed_and_register registered a new space before the fit: a bad parameter, labels without both signs or a
    name that lives in another space failed the fit but left the space registered for good (a typo in --space, or
    a wrong-width file's dim fixed on the space, so the right rows were then refused). The space now comes with
    the version, in its transaction, and still records the encoder of texts."""
    X, y = data()
    reg = open_registry(f"sqlite:///{tmp_path}/r.sqlite", tmp_path / "artifacts")
    reg.register_steer("pos", fit_steer_job(X, y, {"method": "mean-shift"}), space="a")
    with pytest.raises(InputError, match="unknown steer parameters"):
        embed_and_register(reg, None, space="typo", X=X, name="b", labels=y, params={"rnak": 2})
    with pytest.raises(InputError, match="both"):
        embed_and_register(reg, None, space="wide", X=np.ones((4, 5), np.float32), name="b", labels=[0, 0, 0, 0])
    with pytest.raises(ConflictError, match="lives in space 'a'"):
        embed_and_register(reg, None, space="elsewhere", X=X, name="pos", labels=y, params={"method": "mean-shift"})
    assert [s.name for s in reg.list_spaces()] == ["a"]

    class Enc:
        def encode(self, texts, kind):
            return X[[int(t[1:]) for t in texts]]

    v = embed_and_register(reg, lambda name: Enc(), space="t", texts=[f"t{i}" for i in range(len(X))], encoder="toy",
                           name="c", labels=y, params={"method": "mean-shift"})
    assert v.space == "t" and reg.get_space("t").encoder == "toy" and reg.get_space("t").dim == X.shape[1]


@pytest.mark.parametrize("sign", [1, -1])
def test_the_lens_lists_what_the_steer_promotes_on_its_positive_end(sign):
    """The lens stored with a fitted steer names, on ``positive``, the items that ``eps > 0`` pushes up for the
    corpus's queries. The singular pair's sign is free; signed by ``u.v >= 0`` alone, one of an attribute and its
    reverse showed the *demoted* items as positive (a 'plant' steer of WordNet listed fish dishes)."""
    X, labels, Q = planted_attribute(1500, 24, n_queries=200, seed=3)
    labels = sign * labels
    s = fit_steer_job(X, labels, {"method": "local"})
    names = [str(i) for i in range(len(X))]
    top = steer_lens(s, X, names, k=10)[0]
    assert np.mean([labels[it["index"]] for it in top["positive"]]) > 0.5
    assert np.mean([labels[it["index"]] for it in top["negative"]]) < 0.5
    # and that end is what the steer does: steered queries' top-10 gain the positive end's attribute
    base, steered = (np.argsort(-(q @ X.T), axis=1)[:, :10] for q in (Q, apply_steer_job(Q, [(s, 1.0)])))
    assert (labels[steered] == 1).mean() > (labels[base] == 1).mean() + 0.2


def test_the_seed_is_the_fits_own_random_state_never_a_parameter():
    """``params.random_state`` was refused on every face unless it equalled 0 (each face always sends its own seed,
    default 0; the branch taking it "when the caller gives none" was never reached), with a message naming
    ``--random-state`` over HTTP too. It is now refused whatever its value, null too, naming the fit's own
    ``random_state``, which is checked (0 .. 2**31-1) and used."""
    assert check_steer_params({}, 5)["random_state"] == 5
    assert check_steer_params({})["random_state"] == check_steer_params({}, None)["random_state"] == 0
    for value in (0, 5, None):
        with pytest.raises(InputError, match="random_state is not a steer parameter: give the seed as the fit's own"):
            check_steer_params({"random_state": value}, 5)
    for bad in (-1, 2**80, 1.5, "3", True):
        with pytest.raises(InputError, match="random_state"):
            check_steer_params({}, bad)
    X, y = data()
    a, b = (fit_steer_job(X, y, {"method": "lm-steer", "rank": 2, "max_iter": 5}, random_state=r) for r in (1, 2))
    assert not np.array_equal(a.P1, b.P1)


def test_a_mean_shift_takes_no_parameters():
    """Mean-shift fits skipped every check (``temperature=-5``, ``max_iter=-3`` stored as given) and stored every
    default of the other methods as its parameters; it uses none."""
    assert check_steer_params({"method": "mean-shift"}, 3) == {"method": "mean-shift", "random_state": 3}
    for bad in ({"temperature": -5}, {"max_iter": -3}, {"n_queries": 10}):
        with pytest.raises(InputError, match=f"takes no parameters but the method .*drop \\['{next(iter(bad))}'\\]"):
            check_steer_params({"method": "mean-shift", **bad})


def test_lm_steer_rank_is_bounded_by_the_known_width():
    with pytest.raises(InputError, match="rank"):
        check_steer_params({"method": "lm-steer", "rank": 17}, dim=16)
    assert check_steer_params({"method": "lm-steer", "rank": 16}, dim=16)["rank"] == 16
    for method in ("local", "mean-shift"):  # stored, then ignored by the fit
        with pytest.raises(InputError, match=rf"a {method} steer takes .*drop \['rank'\] \(rank: fit method lm-steer"):
            check_steer_params({"method": method, "rank": 8})
    with pytest.raises(InputError, match="is rank 1"):
        check_steer_params({"rank": 8})  # local, the default
    # each method's own parameters only: lm-steer's temperature / max_iter were stored on a local steer, unused
    for method, bad in (("local", "temperature"), ("local", "max_iter"), ("lm-steer", "ridge")):
        with pytest.raises(InputError, match=rf"a {method} steer takes only .*drop \['{bad}'\]"):
            check_steer_params({"method": method, bad: 1})
    assert check_steer_params({"method": "local", "n_neighbors": 20, "ridge": 0.2})["n_neighbors"] == 20


def test_the_local_steers_prior_weight_and_folds_are_parameters(tmp_path):
    """``prior_weight`` (the weight of the mean-shift line; ``"inf"`` by name, JSON having no infinity) and ``n_folds``
    (of its cross-validation) reach align.fit_steer and are stored with the version. Before: "unknown steer
    parameters", though align.fit_steer takes both."""
    from align import fit_steer
    from service.ops.steers import fit_and_register

    X, y = data()
    line = fit_steer_job(X, y, {"prior_weight": "inf"})
    ref = fit_steer(X, y, prior_weight=float("inf"), random_state=0)
    np.testing.assert_allclose(line.apply(X[:5], 1.0), ref.apply(X[:5], 1.0), atol=1e-6)
    assert line.metadata["prior_weight"] == "inf"
    assert fit_steer_job(X, y, {"prior_weight": 0.0}).metadata["prior_weight"] == 0.0
    folds = fit_steer_job(X, y, {"n_folds": 3}).metadata["prior_selection"]
    assert folds["folds"] == 3
    for bad in ({"prior_weight": -1}, {"prior_weight": "infinite"}, {"n_folds": -1}, {"n_folds": 1.5}):
        with pytest.raises(InputError):
            check_steer_params(bad)
    reg = open_registry(f"sqlite:///{tmp_path}/r.sqlite", tmp_path / "art")
    try:
        v = fit_and_register(reg, name="s", space="toy", X=X, labels=y, params={"prior_weight": "inf", "n_folds": 3})
        assert v.params["prior_weight"] == "inf" and v.params["n_folds"] == 3
        assert reg.get_steer(v.name, v.version).params == v.params
    finally:
        reg.close()


def test_a_stored_steer_lists_only_the_parameters_its_fit_used(tmp_path):
    """A local steer was stored with every default of STEER_PARAMS: lm-steer's rank 16, temperature, max_iter,
    max_pairs ... as if they had shaped it (and an lm-steer with the local ridge, n_folds ...). Now a version stores
    its method's own parameters, the method and the seed. A version stored before, with the full dict, still
    resolves, loads, applies and shows its parameters as stored."""
    from service.ops.steers import fit_and_register

    X, y = data()
    own = {"local": {"n_queries", "n_neighbors", "ridge", "opposite_weight", "prior_weight", "n_folds"},
           "lm-steer": {"rank", "temperature", "weight_decay", "max_iter", "max_pairs", "n_candidates",
                        "n_neighbors", "init_scale"}, "mean-shift": set()}
    reg = open_registry(f"sqlite:///{tmp_path}/r.sqlite", tmp_path / "art")
    try:
        for method, extra in (("local", {"ridge": 0.2}), ("lm-steer", {"rank": 2, "max_iter": 5}),
                              ("mean-shift", {})):
            v = fit_and_register(reg, name=f"new-{method}", space="toy", X=X, labels=y, random_state=3,
                                 params={"method": method, **extra})
            stored = reg.get_steer(v.name, v.version).params
            assert set(stored) == own[method] | {"method", "random_state"}, (method, sorted(stored))
            assert stored["method"] == method and stored["random_state"] == 3
            assert all(stored[k] == val for k, val in extra.items())
        # a version as an older release stored it: every default, the other method's too
        legacy = {"method": "local", "rank": 16, "temperature": 0.05, "weight_decay": 1e-3, "max_iter": 200,
                  "max_pairs": 2048, "n_candidates": 4096, "n_neighbors": None, "init_scale": 1e-2,
                  "n_queries": 4000, "ridge": 0.1, "opposite_weight": 0.0, "prior_weight": "auto", "n_folds": 2,
                  "random_state": 0}
        old = fit_steer_job(X, y, {}, space="toy")
        reg.register_steer("old", old, space="toy", params=legacy, random_state=0)
        got = reg.resolve_steer("old")
        assert got.params == legacy and [s.params for s in reg.list_steer_versions("old")] == [legacy]
        np.testing.assert_allclose(apply_steer_job(X[:4], [(reg.load_steer(got), 1.0)]), old.apply(X[:4], 1.0),
                                   atol=1e-6)
        assert fit_and_register(reg, name="old", space="toy", X=X, labels=y).params.keys() == own["local"] | {
            "method", "random_state"}  # a refit of it stores the new way beside it
    finally:
        reg.close()


def test_an_embedding_steer_is_refused_before_the_language_model_loads(tmp_path):
    """/v1/lm/generate with a steer of an embedding space answered 422 only after loading the LM (47 s on a cold
    server): its space, which no language model's is, is now read first; the loader is never called."""
    pytest.importorskip("transformers")
    from _tiny_lm import tiny_lm

    from service.ops import lm as lm_ops

    X, y = data()
    reg = open_registry(f"sqlite:///{tmp_path}/r.sqlite", tmp_path / "artifacts")
    reg.register_steer("pos", fit_steer_job(X, y, {"method": "lm-steer", "rank": 2, "max_iter": 10}), space="a",
                       params={}, lens=[])
    loads = []

    def load():
        loads.append(1)
        return lm_ops.open_lm(tiny_lm)
    for call in (lambda: lm_ops.generate(reg, load, "the film", {"pos": 1.0}),
                 lambda: lm_ops.analyze(reg, load, "the film", "pos")):
        with pytest.raises(InputError, match="steer pos:1 lives in space 'a', an embedding space"):
            call()
    assert loads == []
    # named twice past the summed bound too: the space, the decisive fault, is named first (the sum was)
    with pytest.raises(InputError, match="steer pos:1 lives in space 'a', an embedding space"):
        lm_ops.generate(reg, load, "the film", {"pos": 800.0, "pos:1": 800.0})
    assert loads == []


def test_the_summed_eps_refusal_prints_the_sum_exactly(tmp_path):
    """``{total:g}`` printed 500 + 500.0000001 as "(1000)", a sum that reads as within the bound it broke."""
    from service.ops.steers import check_summed_eps

    X, y = data()
    reg = open_registry(f"sqlite:///{tmp_path}/r.sqlite", tmp_path / "artifacts")
    try:
        reg.register_steer("pos", fit_steer_job(X, y, {"method": "lm-steer", "rank": 2, "max_iter": 10}), space="a",
                           params={}, lens=[])
        info = reg.resolve_steer("pos")
        exact = re.escape(f"sum of their eps ({500.0 + 500.0000001!r}): it must be in [-1000, 1000]")
        with pytest.raises(InputError, match=exact):  # 1000.0000001000001, the float sum
            check_summed_eps([("pos", 500.0, info), ("pos:1", 500.0000001, info)], 1000.0)
        check_summed_eps([("pos", 500.0, info), ("pos:1", 500.0, info)], 1000.0)  # at the bound: taken
    finally:
        reg.close()
