"""Public numerics driven with hostile and extreme input: typed errors with clear messages, never a raw
numpy / Python exception, never a result that looks fine but is not."""

from __future__ import annotations

import numpy as np
import pytest

import align
from align.exceptions import InputError, NotRepresentableError


@pytest.fixture(scope="module")
def pairs():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 6)).astype(np.float32)
    Y = (X @ np.linalg.qr(rng.normal(size=(6, 6)))[0] + 0.5 * rng.normal(size=(60, 6))).astype(np.float32)
    return X, Y


@pytest.mark.parametrize("call", [
    lambda X, Y: align.fit_migration(X, Y, method="lowrank", rank=10**30),
    lambda X, Y: align.fit_migration(X, Y, method="ridge", alpha=10**400),
    lambda X, Y: align.fit_ridge(X, Y, chunk_size=10**30),
    lambda X, Y: align.fit_lowrank(X, Y, rank=-10**30),
], ids=["rank", "alpha", "chunk_size", "negative rank"])
def test_python_ints_past_int64_are_an_input_error(pairs, call):
    """JSON and Python ints have no bound; np.isfinite refused them with a raw TypeError."""
    with pytest.raises(InputError, match="must be"):
        call(*pairs)


def test_evaluate_refuses_csls_k_zero_instead_of_scoring_any_map_perfect(pairs):
    """csls_k=0 made r_q, r_d means of nothing (NaN): no score beat the partner's, csls_top1 was 1.0 for a map
    whose top-1 is far below."""
    X, Y = pairs
    m = align.fit_procrustes(X[:30], Y[:30])
    assert align.evaluate(m, X[30:], Y[30:])["csls_top1"] < 1.0
    with pytest.raises(InputError, match="csls_k"):
        align.evaluate(m, X[30:], Y[30:], csls_k=0)
    assert "csls_top1" not in align.evaluate(m, X[30:], Y[30:], csls=False, csls_k=0)  # unused without CSLS


@pytest.mark.parametrize("call, name", [
    (lambda X, Y: align.csls_knn(X, Y, k=2, csls_k=0), "csls_k"),  # NaN scores with arbitrary ids
    (lambda X, Y: align.csls_knn(X, Y, k=2, csls_k=-1), "csls_k"),  # FAISS: negative dimensions
    (lambda X, Y: align.mutual_nn(X, Y, csls_k=-1), "csls_k"),
    (lambda X, Y: align.knn(X, Y, k=2.5), "k"),  # read as 2
    (lambda X, Y: align.knn(X, Y, k=2, block_size=0), "block_size"),  # ZeroDivisionError
    (lambda X, Y: align.knn(X, Y, k=2, block_size=float("nan")), "block_size"),
    (lambda X, Y: align.evaluate(align.fit_procrustes(X, Y), X, Y, block_size=0), "block_size"),
    (lambda X, Y: align.evaluate(align.fit_procrustes(X, Y), X, Y, ks=(0,)), "ks"),  # recall@0 reported as 0.0
    (lambda X, Y: align.evaluate(align.fit_procrustes(X, Y), X, Y, ks=5), "ks"),  # TypeError: not iterable
    (lambda X, Y: align.cross_val_top1(X, Y, align.fit_procrustes, folds=0), "folds"),  # np.array_split ValueError
    (lambda X, Y: align.cross_val_top1(X, Y, align.fit_procrustes, folds=1), "folds"),  # "no rows" for the fit
    (lambda X, Y: align.retention(np.zeros(3, int), np.zeros(3, int)), "n, k"),  # IndexError
    (lambda X, Y: align.retention(np.zeros((3, 2), int), np.zeros((3, 3), int)), "n, k"),  # scored as if k=3
], ids=["csls_k 0", "csls_k -1", "mutual csls_k -1", "k 2.5", "block 0", "block nan", "evaluate block 0",
        "ks 0", "ks int", "folds 0", "folds 1", "retention 1-D", "retention shapes differ"])
def test_search_and_metric_parameters_are_checked(pairs, call, name):
    with pytest.raises(InputError, match=name):
        call(*pairs)


@pytest.mark.parametrize("call", [
    lambda X, Y: align.fit_procrustes(X.astype(np.float64) * 1e-300, Y),  # was "XᵀY is zero: no signal"
    lambda X, Y: align.fit_procrustes(X, Y, center=False, normalize=False).apply(X.astype(np.float64) * 1e-300),
    lambda X, Y: align.knn(X.astype(np.float64) * 1e-300, Y),
], ids=["fit", "apply", "knn"])
def test_float64_rows_that_vanish_in_float32_are_refused(pairs, call):
    """Rows of 1e-300 are not zero, but every value underflows to 0 in float32: they were read as all-zero rows
    (one fixed output for every such row, a fit 'without signal') instead of being refused."""
    with pytest.raises(NotRepresentableError, match="all-zero"):
        call(*pairs)


def test_float64_input_that_float32_holds_maps_as_float32_does(pairs):
    """Tiny but representable rows (subnormal float32 included) still map, and float64 input equals float32 input."""
    X, Y = pairs
    m = align.fit_procrustes(X, Y)
    np.testing.assert_array_equal(m.apply(X.astype(np.float64)), m.apply(X))
    assert np.isfinite(m.apply(X.astype(np.float64) * 1e-40)).all()
    np.testing.assert_array_equal(align.fit_procrustes(X.astype(np.float64), Y.astype(np.float64)).W, m.W)


def test_minivec2vec_fits_one_dimensional_spaces():
    """The polish's whitening took np.cov of one column, a 0-D array: a raw numpy LinAlgError for dim 1."""
    X = np.random.default_rng(0).normal(size=(300, 1)).astype(np.float32)
    np.testing.assert_allclose(align.MiniVec2Vec.fast(random_state=0).fit(X, -X).map_.W, [[-1.0]], atol=1e-5)


@pytest.mark.parametrize("batch_size", [float("nan"), "a", 0, -5, 2.5, True])
@pytest.mark.parametrize("kind", ["linear", "cluster", "chain"])
def test_apply_batch_size_is_checked(pairs, kind, batch_size):
    """NaN or a string was a raw ValueError, 0 or -5 silently read as 1, 2.5 as 2."""
    X, Y = pairs
    m = align.fit_procrustes(X, Y)
    if kind == "cluster":
        m = align.fit_migration(X, Y, method="cluster", random_state=0)
    elif kind == "chain":
        m = align.MapChain([m, align.fit_procrustes(Y, X)])
    assert np.allclose(m.apply(X, batch_size=np.int64(7)), m.apply(X), atol=1e-6)
    with pytest.raises(InputError, match="batch_size must be an integer"):
        m.apply(X, batch_size=batch_size)


@pytest.mark.parametrize("search", [
    lambda Q, D: align.knn(Q, D, 2, use_faiss=True),
    lambda Q, D: align.knn(Q, D, 2, use_faiss=False),
    lambda Q, D: align.csls_knn(Q, D, 2, csls_k=1),
    lambda Q, D: align.mutual_nn(Q, D),
    lambda Q, D: align.mutual_nn(Q, D, csls_k=1),
])
def test_search_scores_past_float32_are_refused_not_ranked(search):
    """Finite rows whose inner products overflow float32: FAISS ranked row 0 (score Inf) above row 1, the true best
    (3e38 against 1.5e38), numpy returned a NaN score and CSLS NaN everywhere; now NotRepresentableError."""
    from align.exceptions import NotRepresentableError

    Q = np.array([[3e38, -3e38]], np.float32)
    D = np.array([[2.0, 1.5], [1.0, 0.0]], np.float32)
    with pytest.raises(NotRepresentableError):
        search(Q, D)
    S, I = align.knn(Q * 1e-30, D, 2)
    assert I[0].tolist() == [1, 0] and np.isfinite(S).all()


@pytest.mark.parametrize("batch_size", [-1, 0, 1.5, np.nan, "2"])
def test_a_bad_batch_size_is_refused_by_every_apply(batch_size):
    """``range(0, n, -1)`` is empty: a steer with batch_size=-1 returned the queries unsteered (LinearMap.apply
    refused it; the steers did not). Every apply now takes one check."""
    s = align.Steer(np.eye(4)[:, :1], np.ones((4, 1)))
    Q = np.eye(4, dtype=np.float32)
    m = align.LinearMap(np.eye(4))
    for call in (lambda: s.apply(Q, 1.0, batch_size=batch_size),
                 lambda: align.apply_steers(Q, [(s, 1.0)], batch_size=batch_size),
                 lambda: m.apply(Q, batch_size=batch_size)):
        with pytest.raises(InputError, match="batch_size"):
            call()
    np.testing.assert_array_equal(s.apply(Q, 1.0, batch_size=1)[0], [2, 1, 1, 1])  # steered in blocks of one


@pytest.mark.parametrize("Y", [np.zeros((40, 6)), np.ones((40, 6))], ids=["zero", "constant"])
def test_scores_and_overlaps_refuse_targets_that_cannot_be_ranked(pairs, Y):
    """A useless ridge map scored recall 1.0 on all-zero or constant targets (every row tied with its partner, and a
    tie counts as a hit); knn_overlap called such spaces perfectly alignable. Both now raise as evaluate does."""
    X = pairs[0][:40]
    m = align.fit_ridge(X, np.random.default_rng(1).normal(size=(40, 6)))
    with pytest.raises(align.DegenerateInputError):
        align.score_map(m, X, Y)
    with pytest.raises(align.DegenerateInputError):
        align.knn_overlap(Y[:, :4], Y, beyond_chance=True)
    with pytest.raises(align.DegenerateInputError):
        align.knn_overlap(X, Y)
    for k in (0, -1, True):
        with pytest.raises(InputError, match="k must be"):
            align.score_map(m, X, pairs[1][:40], k=k)
    assert 0.0 <= align.score_map(m, X, pairs[1][:40])["score"] < 1.0


def test_a_map_changed_after_its_first_apply_applies_the_change(pairs):
    """apply caches its fused constants: `m.W = -m.W` after a first apply kept giving the old outputs."""
    X, Y = pairs
    m = align.fit_procrustes(X, Y)
    before = m.apply(X[:5])
    m.W = -m.W
    fresh = align.LinearMap(m.W.copy(), m.bias, m.source_frame, m.target_frame)
    np.testing.assert_array_equal(m.apply(X[:5]), fresh.apply(X[:5]))
    assert not np.allclose(m.apply(X[:5]), before)


@pytest.mark.parametrize("fit", [
    lambda X, Y: align.fit_ridge(X, Y), lambda X, Y: align.fit_lowrank(X, Y, rank=2),
    lambda X, Y: align.fit_ridge(X, Y, fit_intercept=False),
], ids=["ridge", "lowrank", "ridge no intercept"])
@pytest.mark.parametrize("side", ["X", "Y"])
def test_ridge_and_lowrank_refuse_identical_rows_as_procrustes_does(pairs, fit, side):
    """All-identical rows on one side: ridge and low-rank returned a constant map (every row mapped to the bias)
    where fit_procrustes and fit_migration raised DegenerateInputError."""
    X, Y = pairs
    X, Y = (np.ones_like(X), Y) if side == "X" else (X, np.zeros_like(Y))
    with pytest.raises(align.DegenerateInputError, match="no signal"):
        fit(X, Y)


@pytest.mark.parametrize("fit", [
    lambda X, y: align.fit_steer(X, y), lambda X, y: align.fit_steer(X, y, method="lm-steer"),
    lambda X, y: align.fit_mean_shift(X, y),
], ids=["local", "lm-steer", "mean-shift"])
def test_steers_refuse_rows_with_no_direction(fit):
    """All rows identical: every steer method returned a zero (no-op) steer without a word."""
    y = np.array([1, -1] * 150)
    with pytest.raises(align.DegenerateInputError):
        fit(np.ones((300, 16)), y)


def test_csls_radii_given_by_the_caller_are_checked():
    """r_q of length 1 was broadcast to every query (wrong scores); other lengths were raw numpy errors."""
    rng = np.random.default_rng(0)
    Q, D = rng.normal(size=(5, 4)).astype(np.float32), rng.normal(size=(7, 4)).astype(np.float32)
    for r_q, r_d in ((np.zeros(1), None), (None, np.zeros(3)), (None, np.zeros((7, 1)))):
        with pytest.raises(align.ShapeError, match="r_"):
            align.csls_knn(Q, D, 2, r_q=r_q, r_d=r_d)
    with pytest.raises(align.NonFiniteError):
        align.csls_knn(Q, D, 2, r_q=np.full(5, np.nan))
    _, I = align.csls_knn(Q, D, 2, r_q=np.zeros(5), r_d=np.zeros(7))
    np.testing.assert_array_equal(I, align.knn(Q, D, 2)[1])  # zero radii: CSLS ranks as plain cosine


def test_retention_of_no_rows_is_an_error_not_nan():
    with pytest.raises(align.ShapeError):
        align.retention(np.zeros((0, 10), int), np.zeros((0, 10), int))


def test_sinkhorn_refinement_takes_a_single_unpaired_row(pairs):
    """np.cov of one row is NaN, and the whitening's eigh raised a raw LinAlgError."""
    X, Y = pairs
    m = align.fit_migration(X, Y, method="procrustes", semi_supervised="sinkhorn", unpaired_source=X[:1],
                            unpaired_target=Y[:1])
    assert np.isfinite(m.apply(X[:3])).all()


def test_chains_work_with_the_metrics_and_bad_steps_are_named(pairs):
    """load_map can return a MapChain: evaluate / score_map / cross_val_top1 raised AttributeError on it;
    compose with a ClusterMap or a chain was a raw broadcast / AttributeError, a string step an AttributeError."""
    X, Y = pairs
    a, b = align.fit_procrustes(X, Y), align.fit_procrustes(Y, X)
    chain = align.MapChain([a, b])
    direct = align.evaluate(align.fit_procrustes(X, X), X, X)["top1"]
    assert align.evaluate(chain, X, X)["top1"] == pytest.approx(direct, abs=0.05)
    assert 0 < align.score_map(chain, X, X)["score"] <= 1
    assert 0 < align.cross_val_top1(X, Y, lambda x, y: align.MapChain([align.fit_procrustes(x, y)]))["top1"] <= 1
    with pytest.raises(InputError, match="fit must return a map"):
        align.cross_val_top1(X, Y, lambda x, y: None)
    with pytest.raises(InputError, match="fit must be a callable"):
        align.cross_val_top1(X, Y, "procrustes")
    for other in (align.fit_migration(X, Y, method="cluster", random_state=0), chain):
        with pytest.raises(InputError, match="compose takes a LinearMap"):
            a.compose(other)
    with pytest.raises(InputError, match="a chain's steps are maps"):
        align.MapChain([a, "x"])


def test_maps_without_one_matrix_refuse_inverse_and_compose_with_a_typed_error(pairs):
    """``MapChain`` and ``ClusterMap`` have no ``inverse`` / ``compose``: calling them was a raw AttributeError
    ("'MapChain' object has no attribute 'inverse'"), which no face turns into a 4xx / exit 2. They are now the
    InputError of ``require_linear``, as for every other operation that needs one matrix."""
    X, Y = pairs
    a = align.fit_procrustes(X, Y)
    for m, what in ((align.MapChain([a, align.fit_procrustes(Y, X)]), "a chain of maps"),
                    (align.fit_migration(X, Y, method="cluster", random_state=0), "a per-cluster map")):
        with pytest.raises(InputError, match=f"^inverse needs a single linear map \\(one matrix W\\); this is {what}"):
            m.inverse()
        with pytest.raises(InputError, match=f"^compose needs a single linear map.*{what}.*align.MapChain"):
            m.compose(a)
    assert isinstance(a.compose(a.inverse()), align.LinearMap)  # a LinearMap keeps both


def test_transfer_takes_a_bare_matrix_and_names_what_it_cannot(pairs):
    """The docstring offers a bare matrix: it was an AttributeError on .W; a MeanShift an AttributeError on P1;
    rcond "x" a numpy UFuncTypeError, NaN and -1 taken."""
    X, _ = pairs
    Xu = X / np.linalg.norm(X, axis=1, keepdims=True)
    y = np.where(Xu[:, 0] > 0, 1, -1)
    s = align.fit_steer(Xu, y, random_state=0)
    Q = np.linalg.qr(np.random.default_rng(3).normal(size=(6, 6)))[0]
    t = align.transfer_steer(s, Q)
    np.testing.assert_allclose(t.W, Q.T @ s.W @ Q, atol=1e-5)  # an orthogonal M: W_B = M^T W_A M
    with pytest.raises(InputError, match="only W = P1 P2"):
        align.transfer_steer(align.fit_mean_shift(Xu, y), Q)
    for rcond in ("x", np.nan, -1):
        with pytest.raises(InputError, match="rcond"):
            align.transfer_steer(s, Q, rcond=rcond)


def test_hand_built_frames_are_stored_as_fitted_ones(pairs):
    """A list mean passed the check and failed at the first apply; a float64 mean stayed float64, so save -> load
    changed the outputs (by 6e-8)."""
    X, _ = pairs
    f = align.Frame(6, mean=[0.1, 0.2, 0.3, 0.0, 0.0, 1e-9])
    assert f.mean.dtype == np.float32
    m = align.LinearMap(np.eye(6), source_frame=f)
    assert np.array_equal(m.apply(X), align.LinearMap.from_bytes(m.to_bytes("npz")).apply(X))
    with pytest.raises(InputError, match="finite in float32"):
        align.Frame(2, mean=[1e39, 0.0])


@pytest.mark.parametrize(("call", "named"), [
    (lambda X, Y: align.fit_migration(X, Y, method="procrustes", progress="bar"), "progress"),
    (lambda X, Y: align.plan_migration(X, X[:55], Y[:55], progress=1), "progress"),
    (lambda X, Y: align.MiniVec2Vec(random_state=0).fit(X, Y, progress="bar"), "progress"),
    (lambda X, Y: align.fit_steer(X, np.where(X[:, 0] > 0, 1, -1), callback="cb"), "callback"),
    (lambda X, Y: align.fit_steer(X, np.where(X[:, 0] > 0, 1, -1), method="lm-steer", tol=np.nan), "tol"),
    (lambda X, Y: align.fit_steer(X, np.where(X[:, 0] > 0, 1, -1), method="lm-steer", tol=-1), "tol"),
    (lambda X, Y: align.knn(X, Y, 2, use_faiss="no"), "use_faiss"),
    (lambda X, Y: align.knn_overlap(X, Y, beyond_chance="no"), "beyond_chance"),
    (lambda X, Y: align.plan_migration(X, X[:55], Y[:55], select_rows="no"), "select_rows"),
    (lambda X, Y: align.Steer(np.eye(6)[:, :1], np.ones((6, 1))).apply(X, "1"), "eps"),
    (lambda X, Y: align.Steer(np.eye(6)[:, :1], np.ones((6, 1))).apply(X, True), "eps"),
    (lambda X, Y: align.fit_migration(X, Y, method="cluster", cluster_temperature=5e-324), "cluster_temperature"),
], ids=["progress", "plan progress", "minivec2vec progress", "callback", "tol nan", "tol negative", "use_faiss",
        "beyond_chance", "select_rows", "eps string", "eps bool", "denormal temperature"])
def test_parameters_of_the_wrong_kind_are_input_errors(pairs, call, named):
    """Each was accepted (a truthy string, a denormal that made every routing weight NaN) or failed deep inside with
    a raw TypeError / scipy error."""
    with pytest.raises(InputError, match=named):
        call(*pairs)


def test_cluster_maps_metadata_scaling_and_seeds_refuse_bad_values_by_name(pairs):
    """ClusterMap(blend=nan) was a raw ValueError and blend=2.7 was cut to 2; metadata JSON cannot hold was a raw
    TypeError from save; Steer.scaled(1e300) blamed the stored steer; evaluate took random_state=-1 unless it
    sampled."""
    X, Y = pairs
    cm = align.fit_migration(X, Y, method="cluster", random_state=0)
    for blend in (np.nan, 2.7, 0):
        with pytest.raises(InputError, match="blend"):
            align.ClusterMap(cm.centroids, cm.W, cm.bias, cm.source_frame, cm.target_frame, blend=blend)
    m = align.fit_procrustes(X, Y)
    m.metadata["when"] = object()
    with pytest.raises(align.SerializationError, match="metadata must be JSON"):
        m.to_bytes()
    with pytest.raises(NotRepresentableError, match="scaled by"):
        align.Steer(np.eye(6)[:, :1] * 1e36, np.ones((6, 1))).scaled(1000.0)  # |eps| <= 1000 (check_eps)
    with pytest.raises(InputError, match="random_state"):
        align.evaluate(align.fit_procrustes(X, Y), X, Y, random_state=-1)


@pytest.mark.parametrize("not_a_map", [None, "minilm-e5", np.eye(6)], ids=["None", "str", "array"])
def test_the_metrics_refuse_what_is_not_a_map(pairs, not_a_map):
    """evaluate, score_map and labelled_retention took any object and failed with a raw AttributeError
    ('NoneType' object has no attribute 'source_dim'); cross_val_top1 and MapChain already said what they need."""
    X, Y = pairs
    for call in (lambda: align.evaluate(not_a_map, X, Y),
                 lambda: align.migration.score_map(not_a_map, X, Y),
                 lambda: align.migration.labelled_retention(not_a_map, X, Y, Y[:3], [0, 1, 2])):
        with pytest.raises(InputError, match=r"needs a map \(LinearMap, ClusterMap, MapChain\)"):
            call()


def test_a_map_look_alike_whose_apply_takes_no_validate_is_refused_typed(pairs):
    """Review: check_map asked for an ``apply`` but not for its ``validate`` keyword, which evaluate, score_map and
    MapChain then pass: a look-alike with ``apply(X, output=)`` failed with a raw TypeError, not the InputError
    naming what a map needs."""
    X, Y = pairs
    real = align.fit_procrustes(X, Y)

    class LookAlike:
        source_dim, target_dim, target_frame = real.source_dim, real.target_dim, real.target_frame

        def apply(self, X, *, output="raw", batch_size=65536):
            return real.apply(X, output=output, batch_size=batch_size)

    for call in (lambda: align.evaluate(LookAlike(), X, Y), lambda: align.migration.score_map(LookAlike(), X, Y)):
        with pytest.raises(InputError, match=r"needs a map \(LinearMap, ClusterMap, MapChain\)"):
            call()
    with pytest.raises(InputError, match="a chain's steps are maps"):
        align.MapChain([real, LookAlike()])
    assert align.evaluate(align.MapChain([real]), X, Y)["top1"] == align.evaluate(real, X, Y)["top1"]


def test_a_boolean_matrix_or_a_masked_one_is_refused_not_read_as_numbers(pairs):
    """QA: ``m.apply(X > 0)`` mapped the mask as rows of 0/1, and a masked array's hidden values were mapped (the
    mask dropped without a word). Both are InputErrors; X.astype(np.float32) passes 0/1 on purpose."""
    X, Y = pairs
    m = align.fit_procrustes(X, Y)
    with pytest.raises(InputError, match=r"boolean array .*X\.astype\(np\.float32\)"):
        m.apply(X > 0)
    with pytest.raises(InputError, match="boolean array"):
        align.fit_procrustes(X > 0, Y)
    with pytest.raises(InputError, match="masked entries"):
        m.apply(np.ma.masked_array(X, mask=np.abs(X) > 2.5))
    assert m.apply((X > 0).astype(np.float32)).shape == Y.shape
    np.testing.assert_array_equal(m.apply(np.ma.masked_array(X)), m.apply(X))


def _tiny():
    return align.LinearMap(np.eye(384) * 1e-30)


@pytest.mark.parametrize("make", [lambda: _tiny().compose(_tiny()),
                                  lambda: align.LinearMap(np.full((4, 3), 1e-50))])
def test_a_map_whose_w_vanishes_in_float32_is_refused(make):
    """A product of two tiny maps, or a ridge with alpha=1e50, came back with W all zeros after the float32 cast: a
    constant map, silently. Every construction passes LinearMap.__post_init__, which now refuses it; a ridge alpha
    past 1e12 is refused before the fit (it was accepted, and the fit failed late advising to "scale the map")."""
    with pytest.raises(NotRepresentableError, match="would be stored as 0"):
        make()
    assert not align.LinearMap(np.zeros((4, 3))).W.any()  # a W that is zero as given stays the caller's choice
    with pytest.raises(InputError, match=r"alpha must be a number in \[0, 1e\+12\], got 1e\+50"):
        align.fit_ridge(*_pairs_for_ridge(), alpha=1e50)


def _pairs_for_ridge():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(500, 32))
    return X, X @ rng.normal(size=(32, 32))
