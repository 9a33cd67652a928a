"""Ray jobs equal their single-machine counterparts (one local Ray session, 2 CPUs, for the module)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import align
from align.exceptions import (
    DimensionMismatchError,
    EmptyInputError,
    InputError,
    PairCountError,
)
from align.kmeans import kmeans
from align.knn import knn_blocks
from align.refine import refine_icp
from service import distributed as D


@pytest.fixture(scope="module")
def ray_local():
    """A fresh local Ray of this module's own: ``address="local"`` never joins a cluster an earlier test left
    recorded, and token authentication is off explicitly (Ray turns it on by itself when a token file exists, as
    the token test of test_cli_ray.py can leave one; a CI run then saw the raylet fail to register)."""
    ray = pytest.importorskip("ray")
    before = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    try:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        yield ray
        ray.shutdown()
    finally:
        if before is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = before


def _planted(n=3000, d_s=32, d_t=24, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d_s)).astype(np.float32)
    Q = np.linalg.qr(rng.normal(size=(d_s, d_s)))[0][:, :d_t]
    Y = (X @ Q + 0.1 * rng.normal(size=(n, d_t))).astype(np.float32)
    return X, Y


def _split(n, cuts):
    edges = [0, *sorted(set(cuts)), n]
    return [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]


# --- supervised: map-reduce of sufficient statistics ---------------------------------------------

def _sharded_files(tmp_path, X, Y, cuts):
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", Y)
    return [D.Shard(str(tmp_path / "x.npy"), str(tmp_path / "y.npy"), a, b) for a, b in _split(X.shape[0], cuts)]


def test_ray_fit_equals_single_machine_fit_on_sharded_files(ray_local, tmp_path):
    """Full-rank 384-d pairs: W is unique, so the Ray map-reduce must reproduce it to < 1e-5."""
    X, Y = _planted(12000, 384, 384, seed=1)
    shards = _sharded_files(tmp_path, X, Y, [1000, 4500, 4501, 9000])  # uneven, one shard of a single row
    ref = align.fit_procrustes(X, Y)
    got = D.fit_stats_ray(shards)
    diff = float(np.abs(got.W - ref.W).max())
    print(f"\nRay ({len(shards)} shards, 384-d) vs single machine: max|dW| = {diff:.2e}")
    assert diff < 1e-5
    np.testing.assert_allclose(got.source_frame.mean, ref.source_frame.mean, atol=1e-6)
    np.testing.assert_allclose(got.target_frame.mean, ref.target_frame.mean, atol=1e-6)
    assert got.metadata["n_pairs"] == X.shape[0] and got.metadata["distributed"]["n_shards"] == len(shards)
    assert got.metadata["distributed"]["ray_cpus"] == 2


def test_ray_fit_on_wordnet_maps_like_single_machine(ray_local, tmp_path, wordnet):
    """MiniLM->E5 (WordNet): XᵀY has 3 zero singular values, so W is not unique in those directions
    (even a row permutation moves the single-machine W by ~0.7); the maps must agree on the data."""
    n = len(wordnet["minilm"])
    fit, held = (12000, 32768) if n >= 34768 else (n - 1000, n - 1000)  # the fallback sample: 3,096 + 1,000 rows
    X = np.asarray(wordnet["minilm"][:fit], np.float32)
    Y = np.asarray(wordnet["e5"][:fit], np.float32)
    shards = _sharded_files(tmp_path, X, Y, [s * fit // 12000 for s in (1000, 4500, 9000)])
    ref = align.fit_procrustes(X, Y)
    got = D.fit_stats_ray(shards)
    Xh = np.asarray(wordnet["minilm"][held:held + 2000], np.float32)
    diff = float(np.abs(got.apply(Xh) - ref.apply(Xh)).max())
    print(f"\nRay vs single machine on WordNet minilm->e5: max|d mapped held-out rows| = {diff:.2e}")
    assert diff < 1e-5


def test_ray_ridge_lowrank_scale_and_in_memory_and_callable_shards(ray_local):
    X, Y = _planted(4000, 20, 12, seed=3)
    parts = [(X[a:b], Y[a:b]) for a, b in _split(4000, [700, 2500])]
    gens = [lambda a=a, b=b: (X[a:b], Y[a:b]) for a, b in _split(4000, [1999])]
    for shards in (parts, gens):
        r = D.fit_stats_ray(shards, method="ridge", alpha=0.5)
        ref = align.fit_ridge(X, Y, alpha=0.5)
        assert np.abs(r.W - ref.W).max() < 1e-5 and np.abs(r.bias - ref.bias).max() < 1e-5
        assert r.metadata["params"] == ref.metadata["params"]  # one solver (align.map_from_stats) for both
    lr = D.fit_stats_ray(parts, method="lowrank", rank=5)
    ref = align.fit_lowrank(X, Y, rank=5)
    assert np.abs(lr.W - ref.W).max() < 1e-5
    sc = D.fit_stats_ray(parts, scale=True, center=False, normalize=False)
    ref = align.fit_procrustes(X, Y, scale=True, center=False, normalize=False)
    assert np.abs(sc.W - ref.W).max() < 1e-5 and abs(sc.metadata["scale"] - ref.metadata["scale"]) < 1e-6


@settings(max_examples=25, deadline=None)
@given(n=st.integers(8, 300), cuts=st.lists(st.integers(1, 299), max_size=5), seed=st.integers(0, 2**16))
def test_sharded_stats_equal_one_pass_for_any_split(n, cuts, seed):
    X, Y = _planted(n, 6, 5, seed=seed)
    shards = [(X[a:b], Y[a:b]) for a, b in _split(n, [c for c in cuts if c < n])]
    got = D.fit_stats_local(shards)
    ref = align.fit_procrustes(X, Y)
    assert np.abs(got.W - ref.W).max() < 1e-4
    (fs, ft), stats = D.pair_stats_local(shards)
    assert stats.n == n and fs.n_fit == n


def test_a_sharded_fit_writes_the_same_bytes_whatever_its_workers_peak_memory():
    """Two same-seed sharded fits differ only in ``metadata["distributed"]["worker_peak_rss_mb"]`` (the workers'
    peak memory, another on every run), and that gave them different artifact bytes: another sha256 and file in the
    content-addressed store for one map. The fitted object keeps it in memory."""
    X, Y = _planted(200, 6, 5)
    shards = [(X[:120], Y[:120]), (X[120:], Y[120:])]
    a, b = D.fit_stats_local(shards), D.fit_stats_local(shards)
    b.metadata["distributed"]["worker_peak_rss_mb"] = a.metadata["distributed"]["worker_peak_rss_mb"] + 17.0
    assert a.to_bytes() == b.to_bytes()
    assert "worker_peak_rss_mb" in b.metadata["distributed"]
    again = align.LinearMap.from_bytes(b.to_bytes())
    assert again.metadata["distributed"]["n_shards"] == 2 and "worker_peak_rss_mb" not in again.metadata["distributed"]


def test_bad_shards_raise_typed_errors(ray_local):
    X, Y = _planted(100, 6, 5)
    with pytest.raises(EmptyInputError):
        D.fit_stats_local([])
    with pytest.raises(PairCountError):
        D.fit_stats_local([(X, Y[:50])])
    with pytest.raises(DimensionMismatchError):
        D.fit_stats_local([(X, Y), (X[:, :4], Y)])
    with pytest.raises(DimensionMismatchError):  # raised inside a Ray task, re-raised with its type
        D.fit_stats_ray([(X, Y), (X, Y[:, :3])])
    with pytest.raises(InputError):
        D.fit_stats_local([(X, Y)], method="nope")
    with pytest.raises(InputError):  # the in-process fitters refuse unknown parameters, and so do shards
        D.fit_stats_local([(X, Y)], method="ridge", scale=True)
    with pytest.raises(InputError):
        D.fit_stats_local([(X, Y)], method="lowrank")
    with pytest.raises(InputError):
        D.fit_stats_local(["not-a-shard-type", 3])


# --- unsupervised heavy steps --------------------------------------------------------------------

def test_kmeans_ray_equals_local_lloyd_and_sklearn(ray_local):
    from sklearn.cluster import KMeans

    rng = np.random.default_rng(5)
    centers = rng.normal(scale=4.0, size=(6, 8))
    X = (centers[rng.integers(0, 6, 3000)] + rng.normal(size=(3000, 8))).astype(np.float32)
    shards = [X[a:b] for a, b in _split(3000, [800, 1700])]
    init = X[rng.choice(3000, 6, replace=False)]
    C_ray, inertia_ray, it_ray = D.kmeans_ray(shards, 6, init=init, n_iter=30)
    C_loc, inertia_loc, it_loc = D.kmeans_local(shards, 6, init=init, n_iter=30)
    np.testing.assert_array_equal(C_ray, C_loc)
    assert it_ray == it_loc and inertia_ray == inertia_loc
    km = KMeans(6, init=init, n_init=1, algorithm="lloyd", max_iter=30, tol=0.0).fit(X)
    np.testing.assert_allclose(C_ray, km.cluster_centers_, atol=1e-3)
    assert abs(inertia_ray - km.inertia_) / km.inertia_ < 1e-3


def test_kmeans_ray_seeded_on_file_shards_is_bit_for_bit_in_process(ray_local, tmp_path):
    """No init: both draw the start from the seed; shards are row ranges of one .npy opened in the tasks."""
    rng = np.random.default_rng(14)
    X = (rng.normal(scale=4.0, size=(8, 10))[rng.integers(0, 8, 4000)] + rng.normal(size=(4000, 10))).astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    shards = [D.Shard(str(tmp_path / "x.npy"), None, a, b) for a, b in _split(4000, [1000, 2600])]
    got = D.kmeans_ray(shards, 8, n_iter=25, random_state=3)
    ref = D.kmeans_local(shards, 8, n_iter=25, random_state=3)
    np.testing.assert_array_equal(got[0], ref[0])
    assert got[1:] == ref[1:]
    in_memory = kmeans([X[a:b] for a, b in _split(4000, [1000, 2600])], 8, n_iter=25, random_state=3)
    np.testing.assert_array_equal(got[0], in_memory[0])  # files or arrays: the same kernel, the same bits
    assert not np.array_equal(got[0], D.kmeans_local(shards, 8, n_iter=25, random_state=4)[0])


def test_knn_ray_equals_one_search(ray_local):
    rng = np.random.default_rng(6)
    Db = align.frames.unit_rows(rng.normal(size=(2500, 16)).astype(np.float32))
    Q = align.frames.unit_rows(rng.normal(size=(40, 16)).astype(np.float32))
    shards = [Db[a:b] for a, b in _split(2500, [3, 900, 2000])]
    S, I = D.knn_ray(Q, shards, 7)
    S_ref, I_ref = align.knn(Q, Db, 7)
    np.testing.assert_array_equal(I, I_ref)
    np.testing.assert_allclose(S, S_ref, atol=1e-6)
    S_loc, I_loc = knn_blocks(Q, shards, 7)  # align's kernel in-process: the same bits as on Ray
    np.testing.assert_array_equal(I, I_loc)
    np.testing.assert_array_equal(S, S_loc)
    with pytest.raises(DimensionMismatchError):  # raised in a task, re-raised with its type
        D.knn_ray(Q, [Db, Db[:, :8]], 3)


def test_refine_icp_ray_equals_refine_icp(ray_local):
    X, Y = _planted(1500, 16, 16, seed=7)
    Xs = align.frames.unit_rows(X)
    Yt = align.frames.unit_rows(Y)
    W0 = np.linalg.qr(np.random.default_rng(8).normal(size=(16, 16)))[0] * 0.3 + np.eye(16) * 0.7
    W_ref, h_ref = refine_icp(W0, Xs, Yt, iters=4, sample=300, k=10, random_state=11)
    W_ray, h_ray = D.refine_icp_ray(W0, Xs, [Yt[a:b] for a, b in _split(1500, [500, 1100])], iters=4, sample=300, k=10,
                                    random_state=11)
    np.testing.assert_array_equal(W_ray, W_ref)  # align's kernel with Ray tasks: the same bits
    np.testing.assert_array_equal(h_ray, h_ref)


@pytest.mark.filterwarnings("ignore::align.exceptions.ConvergenceWarning")
def test_minivec2vec_on_ray_is_bit_for_bit_the_in_process_fit(ray_local):
    import ray

    X, Y = _planted(900, 16, 16, seed=12)
    Y = Y[np.random.default_rng(13).permutation(900)]  # unpaired
    kw = dict(random_state=4, n_anchor_runs=2, qap_restarts=2, refine1_iters=3, self_learning_rounds=2,
              n_clusters=10, anchor_sample=900)
    a = align.MiniVec2Vec(**kw).fit(X, Y)
    b = align.MiniVec2Vec(**kw).fit(X, Y, executor=D.ray_executor(ray))
    np.testing.assert_array_equal(a.map_.W, b.map_.W)
    assert a.criterion_ == b.criterion_



@pytest.mark.parametrize("engine", ["local", "ray"])
def test_bad_kmeans_and_refine_inputs_are_typed_errors_before_the_kernels(request, engine):
    """Session 16: a NaN in ``init`` gave k-means centroids with no error; an ``init`` or a shard of another width
    and a ``W`` of the wrong shape were numpy's ``ValueError`` from inside a task (an internal error), and a NaN
    ``alpha`` returned a NaN ``W`` from one ICP iteration."""
    from align.exceptions import NonFiniteError

    if engine == "ray":
        request.getfixturevalue("ray_local")
    km = D.kmeans_ray if engine == "ray" else D.kmeans_local
    rng = np.random.default_rng(12)
    X = rng.normal(size=(600, 8)).astype(np.float32)
    nan_init = X[:4].copy()
    nan_init[1, 2] = np.nan
    with pytest.raises(NonFiniteError, match="init"):
        km([X], 4, init=nan_init, n_iter=3)
    with pytest.raises(DimensionMismatchError):
        km([X], 4, init=X[:4, :5], n_iter=3)
    with pytest.raises(DimensionMismatchError):
        km([X, X[:, :5]], 4, n_iter=3, random_state=0)
    bad_rows = X.copy()
    bad_rows[500] = np.inf
    with pytest.raises(NonFiniteError):  # align's kernel on raw arrays (no opener to validate them)
        kmeans([X[:300], bad_rows[300:]], 4, n_iter=3, random_state=0,
               executor=D.ray_executor(request.getfixturevalue("ray_local")) if engine == "ray" else None)
    Xs, Yt = align.frames.unit_rows(X), align.frames.unit_rows(X[::-1].copy())
    icp = (lambda W, **kw: D.refine_icp_ray(W, Xs, [Yt], iters=1, sample=100, k=5, random_state=0, **kw)) \
        if engine == "ray" else (lambda W, **kw: refine_icp(W, Xs, Yt, iters=1, sample=100, k=5, random_state=0, **kw))
    with pytest.raises(DimensionMismatchError):
        icp(np.eye(5))
    bad_w = np.eye(8)
    bad_w[0, 0] = np.nan
    with pytest.raises(NonFiniteError, match="W"):
        icp(bad_w)
    with pytest.raises(InputError, match="alpha"):
        icp(np.eye(8), alpha=float("nan"))


# --- batch transform of sharded files ------------------------------------------------------------

def test_transform_files_ray(ray_local, tmp_path):
    X, Y = _planted(900, 12, 10, seed=9)
    m = align.fit_procrustes(X, Y)
    files = []
    for i, (a, b) in enumerate(_split(900, [300, 310])):
        files.append(tmp_path / f"part{i}.npy")
        np.save(files[-1], X[a:b])
    m.save(tmp_path / "m.npz")
    out = D.transform_files_ray(str(tmp_path / "m.npz"), files, tmp_path / "out", batch_size=64)
    assert [r["rows"] for r in out] == [300, 10, 590]
    got = np.concatenate([np.load(r["output"]) for r in out])
    np.testing.assert_allclose(got, m.apply(X, output="raw"), atol=1e-6)
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]  # no temporary leftovers
    local = D.transform_files_ray(m, files[:1], tmp_path / "out2", output="frame", use_ray=False)
    np.testing.assert_allclose(np.load(local[0]["output"]), m.apply(X[:300], output="frame"), atol=1e-6)
    with pytest.raises(DimensionMismatchError):
        D.transform_files_ray(m.inverse(), files[:1], tmp_path / "out3", use_ray=False)
    with pytest.raises(InputError):
        D.transform_files_ray(m, [tmp_path / "missing.npy"], tmp_path / "out4")


def test_ray_transforms_keep_the_other_columns_of_a_parquet_table(ray_local, tmp_path):
    """``vecbridge transform --ray`` and ``transform_files_ray`` of a parquet into a parquet wrote the vectors alone,
    as one ``vector`` column; the ids now travel with their rows on Ray too, the vector column keeps its name."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from service.ops.transform import transform_file
    from service.registry import Registry

    X, Y = _planted(300, 8, 8, seed=3)
    m = align.fit_procrustes(X, Y)
    t = pa.table({"id": [f"row-{i}" for i in range(300)], "emb": pa.FixedSizeListArray.from_arrays(X.reshape(-1), 8)})
    pq.write_table(t, tmp_path / "t.parquet", row_group_size=64)
    reg = Registry(f"sqlite:///{tmp_path / 'reg.sqlite'}", tmp_path / "artifacts")
    reg.register_version("m", m, source_space="a", target_space="b", method="procrustes", params={})
    res = transform_file(reg, "m", tmp_path / "t.parquet", tmp_path / "r.parquet", chunk_rows=50, ray_address="local")
    [files] = D.transform_files_ray(m, [tmp_path / "t.parquet"], tmp_path / "out", suffix=".m.parquet", batch_size=50)
    reg.close()
    for out in (res["out"], files["output"]):
        got = pq.read_table(out)
        assert got.schema.names == ["id", "emb"] and got.column("id").equals(t.column("id"))
        np.testing.assert_allclose(np.stack(got.column("emb").to_numpy(zero_copy_only=False)), m.apply(X),
                                   atol=1e-6)


def test_transform_files_refuses_inputs_that_would_write_one_output(tmp_path):
    """``sh/a/part.npy`` and ``sh/b/part.npy`` both went to ``out/part.mapped.npy``: the second result silently
    replaced the first (its rows lost). Now an InputError naming both, before anything is written."""
    X, Y = _planted(60, 8, 8, seed=11)
    m = align.fit_procrustes(X, Y)
    for sub, rows in (("a", X[:40]), ("b", X[40:])):
        (tmp_path / "sh" / sub).mkdir(parents=True)
        np.save(tmp_path / "sh" / sub / "part.npy", rows)
    with pytest.raises(InputError, match=r"sh/a/part.npy and .*sh/b/part.npy would both be written to .*part.mapped"):
        D.transform_files_ray(m, [tmp_path / "sh/a/part.npy", tmp_path / "sh/b/part.npy"], tmp_path / "out",
                              use_ray=False)
    assert not (tmp_path / "out").exists()


def test_transform_files_never_write_over_an_input(tmp_path):
    """``suffix=".npy"`` into the input's own folder replaced ``q.npy`` with its mapped rows (the CLI refuses this
    through check_not_input; the helper did not). Now the same InputError, and the input is untouched."""
    X, Y = _planted(60, 8, 8, seed=12)
    m = align.fit_procrustes(X, Y)
    np.save(tmp_path / "q.npy", X)
    np.save(tmp_path / "q.m.npy", X[:5])  # a glob of the folder that took in an earlier run's output
    for inputs, suffix, hit in (([tmp_path / "q.npy"], ".npy", "q.npy"),  # its own output
                                ([tmp_path / "q.npy", tmp_path / "q.m.npy"], ".m.npy", "q.m.npy")):  # another's
        with pytest.raises(InputError, match=f"is the input file .*/{hit}"):
            D.transform_files_ray(m, inputs, tmp_path, suffix=suffix, use_ray=False)
    np.testing.assert_array_equal(np.load(tmp_path / "q.npy"), X)
    np.testing.assert_array_equal(np.load(tmp_path / "q.m.npy"), X[:5])


def test_transform_files_read_every_vector_format_as_the_cli_does(tmp_path):
    """A ``.npz`` input crashed the task with ``AttributeError: 'NpzFile' object has no attribute 'ndim'`` (np.load
    of an archive, then ``.ndim``). Files are now read through service.io, as ``vecbridge transform`` reads them."""
    from service.io import write_vectors

    X, Y = _planted(90, 8, 6, seed=13)
    m = align.fit_procrustes(X, Y)
    files = [write_vectors(tmp_path / f"in{i}{suf}", X[30 * i : 30 * i + 30])
             for i, suf in enumerate((".npz", ".fvecs", ".parquet"))]
    out = D.transform_files_ray(m, files, tmp_path / "out", batch_size=7, use_ray=False)
    assert [Path(r["output"]).name for r in out] == ["in0.mapped.npy", "in1.mapped.npy", "in2.mapped.npy"]
    np.testing.assert_allclose(np.concatenate([np.load(r["output"]) for r in out]), m.apply(X), atol=1e-6)
    (tmp_path / "t.txt").write_text("a text\n")
    with pytest.raises(InputError, match=r"not vector files: .*t.txt"):
        D.transform_files_ray(m, [tmp_path / "t.txt"], tmp_path / "out2", use_ray=False)


@pytest.mark.parametrize("use_ray", [False, True])
def test_transform_files_leave_no_half_written_file_when_a_block_fails(request, tmp_path, use_ray):
    """Session 16: a NaN in a file's second block failed the task after its first block was written, and the
    half-written ``.<name>.tmp-<pid>.npy`` stayed in the output folder (the same on Ray and in-process)."""
    if use_ray:
        request.getfixturevalue("ray_local")
    X, Y = _planted(300, 8, 8, seed=10)
    m = align.fit_procrustes(X, Y)
    bad = X.copy()
    bad[250, 3] = np.nan  # the third block of 100 rows
    np.save(tmp_path / "bad.npy", bad)
    with pytest.raises(InputError, match="NaN|finite"):
        D.transform_files_ray(m, [tmp_path / "bad.npy"], tmp_path / "out", batch_size=100, use_ray=use_ray)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == []


def test_task_errors_come_back_as_themselves_and_a_lost_worker_as_unavailable(ray_local):
    """Session 16: an error raised in a task came back as Ray's wrapper, whose first line (all the CLI prints) is
    ``ray::_db_block_topk() (pid=…, ip=…)`` in colour codes; a worker that died past Ray's retries was
    ``internal error: WorkerCrashedError`` (exit 3, the code for a bug)."""
    import os

    from service.errors import exit_code, kind_of

    Db = np.random.default_rng(13).normal(size=(200, 16)).astype(np.float32)
    with pytest.raises(DimensionMismatchError) as info:
        D.knn_ray(Db[:3], [Db, Db[:, :8]], 3)
    assert type(info.value) is DimensionMismatchError and "ray::" not in str(info.value), str(info.value)[:200]
    assert "columns" in str(info.value).splitlines()[0]

    def crash(_):  # the worker process dies (as under the OOM killer); Ray retries it 3 times, then gives up
        os._exit(1)

    with pytest.raises(D.RayUnavailableError, match="worker") as info:
        D.ray_executor(ray_local)(crash, [(1,)])
    assert kind_of(info.value) == "unavailable" and exit_code(info.value) == 75  # lost past retries: retry later
