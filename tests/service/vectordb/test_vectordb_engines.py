"""Real engines: Milvus Lite (as its own gRPC server process) and PostgreSQL + pgvector (pgserver wheel).

Per engine, one module-scoped source collection of stored vectors (4,000 by default; the 20,000-row runs are
opt-in: ``pytest -m slow`` or ``VECBRIDGE_RUN_SLOW=1``, several minutes on a busy 2-core box): MiniLM rows of the
shared WordNet set with their texts (the sample the tests embed when it is absent, generated data when neither), and
one migration into the E5 space through a Procrustes map fitted on other rows. The migration runs as a
subprocess (``python -m service.vectordb migrate``), is killed with SIGKILL half-way, and is
resumed here; then ids, vectors, recall against re-embedded texts and cross-model queries are
checked. Figures are printed (``pytest -s``).

Servers: ``VECBRIDGE_TEST_MILVUS_URI`` (``http://host:port``) / ``VECBRIDGE_TEST_PGVECTOR_URL``
when set (``.ci/start_vectordbs.sh``), else started here (milvus-lite server, pgserver).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import align
from service.vectordb import FileCheckpoint, TranslatingSearcher, migrate, verify_migration

from _vectordb_servers import milvus_url, pg_url  # noqa: F401  (module-scoped server fixtures)

ROOT = Path(__file__).resolve().parents[3]
N = 20000


# --- data ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def corpus(tmp_path_factory, request):
    """Stored rows (minilm), their true e5 vectors, texts, a fitted minilm->e5 map saved to disk. The shared WordNet
    set: N rows stored, the map fitted on rows [20000, 32768); the sample the tests embed when it is absent: its
    4,096 rows stored, the map fitted on the first 2,000 of them (re-embedded rows of the corpus itself)."""
    try:
        folder = request.getfixturevalue("wordnet_dir")
    except pytest.skip.Exception:
        folder = None
    if folder is not None:
        mini = np.load(folder / "minilm.npy", mmap_mode="r")
        e5 = np.load(folder / "e5.npy", mmap_mode="r")
        texts = json.loads((folder / "texts.json").read_text())
        n = min(N, len(mini))
        X, Y = np.asarray(mini[:n], np.float32), np.asarray(e5[:n], np.float32)
        fit = slice(20000, 32768) if len(mini) >= 32768 else slice(0, 2000)
        Xf, Yf = np.asarray(mini[fit], np.float32), np.asarray(e5[fit], np.float32)
        texts = texts[:n]
        source = "wordnet minilm->e5" + ("" if n == N else f" (a sample of {len(mini)} definitions embedded here)")
    else:  # generated: a planted rotation plus noise, unit rows
        rng = np.random.default_rng(0)
        Q = np.linalg.qr(rng.normal(size=(384, 384)))[0]
        A = rng.normal(size=(N + 12768, 384)).astype(np.float32)
        B = A @ Q + 0.3 * rng.normal(size=A.shape)
        A /= np.linalg.norm(A, axis=1, keepdims=True)
        B = (B / np.linalg.norm(B, axis=1, keepdims=True)).astype(np.float32)
        X, Y, Xf, Yf = A[:N], B[:N], A[N:], B[N:]
        texts = [f"item {i}" for i in range(N)]
        source = "generated rotation+noise"
    map_ = align.fit_procrustes(Xf, Yf)
    path = tmp_path_factory.mktemp("maps") / "minilm_to_e5.npz"
    map_.save(path)
    lookup = {t: i for i, t in enumerate(texts)}

    def embed(ts):  # "re-embedding" = the new model's precomputed vectors of exactly these texts
        return Y[[lookup[t] for t in ts]]

    return {"X": X, "Y": Y, "texts": texts, "map": map_, "map_path": path, "embed": embed, "source": source}


# --- servers: milvus_url, pg_url (module-scoped) live in tests/_vectordb_servers.py -----------

def _open(engine: str, request):
    if engine == "milvus":
        from service.vectordb import MilvusStore

        url = request.getfixturevalue("milvus_url")
        return MilvusStore(url), "milvus://" + url.split("://", 1)[1]
    from service.vectordb import PgVectorStore

    url = request.getfixturevalue("pg_url")
    return PgVectorStore(url, index="ivfflat"), url


_SLOW = pytest.mark.slow


@pytest.fixture(scope="module", params=[pytest.param(("milvus", 4000), id="milvus-4k"), pytest.param(("pgvector", 4000), id="pgvector-4k"),
                                        pytest.param(("milvus", N), marks=_SLOW, id="milvus-20k"),
                                        pytest.param(("pgvector", N), marks=_SLOW, id="pgvector-20k")])
def engine(request, corpus):
    """(store, cli url, engine name, ids, n) with collection ``src_minilm`` holding the first n stored rows."""
    kind, n = request.param
    if n > 4000 and "slow" not in (request.config.getoption("-m") or "") and not os.environ.get("VECBRIDGE_RUN_SLOW"):
        pytest.skip("opt-in: pytest -m slow (20k rows per engine)")
    if n > corpus["X"].shape[0]:
        pytest.skip(f"{n} rows: the WordNet sample holds {corpus['X'].shape[0]}")
    store, url = _open(kind, request)
    for name in ("src_minilm", "dst_e5"):
        store.drop(name)
    store.create("src_minilm", corpus["X"].shape[1])
    ids = np.arange(n, dtype=np.int64) * 3 + 7  # sparse, non-zero-based ids
    for s in range(0, n, 2000):
        store.upsert("src_minilm", ids[s : min(s + 2000, n)], corpus["X"][s : min(s + 2000, n)],
                     corpus["texts"][s : min(s + 2000, n)])
    store.finalize("src_minilm")
    yield store, url, kind, ids, n
    for name in ("src_minilm", "dst_e5"):
        store.drop(name)
    store.close()


# --- the test --------------------------------------------------------------------------------

def test_migration_killed_halfway_resumes_then_cross_model_search(engine, corpus, tmp_path):
    store, url, name, ids, N = engine
    assert store.count("src_minilm") == N
    batch = str(N // 8)
    ckpt = tmp_path / "ckpt.json"
    cmd = [sys.executable, "-m", "service.vectordb", "migrate", "--store", url, "--source", "src_minilm",
           "--target", "dst_e5", "--map", str(corpus["map_path"]), "--checkpoint", str(ckpt), "--batch-size", batch,
           "--pause", "0.05", *(["--index", "ivfflat"] if url.startswith("postgres") else [])]  # Milvus refuses it
    child = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done_seen = 0
    try:
        for line in child.stdout:
            done_seen = json.loads(line).get("done", done_seen)
            if done_seen >= N // 2:
                os.kill(child.pid, signal.SIGKILL)
                break
    finally:
        child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr.read()[-2000:]
    state = json.loads(ckpt.read_text())
    assert not state["finished"] and N // 2 <= state["done"] < N
    assert 0 < store.count("dst_e5") < N

    seen = []
    rep = migrate(store, "src_minilm", "dst_e5", corpus["map"], alias="live_e5", batch_size=int(batch),
                  checkpoint=FileCheckpoint(ckpt), progress=lambda p: seen.append(p.done))
    assert rep.resumed_from == state["last_id"]
    assert rep.rows_this_run == N - state["done"]
    assert seen[-1] == N
    # no duplicate or missing ids
    got = store.ids("dst_e5")
    assert store.count("dst_e5") == N
    assert got.shape[0] == np.unique(got).shape[0] == N
    np.testing.assert_array_equal(np.sort(got), ids)
    # stored vectors are the map's raw output of the source rows (sample, any batch of either run)
    pick = np.random.default_rng(1).choice(N, 300, replace=False)
    b = store.fetch("dst_e5", ids[pick])
    np.testing.assert_allclose(b.vectors, corpus["map"].apply(corpus["X"][pick], output="raw"), atol=1e-5)
    assert b.texts == [corpus["texts"][i] for i in pick]
    assert store.resolve_alias("live_e5") == "dst_e5"

    # verification: migrated vectors vs re-embedded texts (new model)
    v = verify_migration(store, "live_e5", embed=corpus["embed"], n_sample=min(2000, N // 2), n_queries=200, db_queries=100,
                         random_state=0)
    # query across models, query side: old collection, new-model queries through the inverse map
    q = np.random.default_rng(2).choice(N, 100, replace=False)
    _, I_old = TranslatingSearcher(store, "src_minilm", corpus["map"].inverse()).search(corpus["Y"][q], 10)
    # native baseline: new-model queries against new-model vectors of the same rows (exact, numpy)
    _, I_nat = align.knn(corpus["Y"][q], corpus["Y"][:N], 10)
    native_partner = float((I_nat == q[:, None]).any(1).mean())
    query_side = float((I_old == ids[q][:, None]).any(1).mean())
    print(f"\n[{name}] {corpus['source']}, {N} rows: resumed after {state['done']} rows; "
          f"migrated: recall@10 vs re-embedded={v['recall@10']:.3f} partner top1={v['partner_top1']:.3f} "
          f"partner@10={v['partner_recall@10']:.3f} cos={v['cos']:.3f} | engine search partner@10 over {N}: "
          f"migrated={v['db_partner_recall@10']:.3f} query-side={query_side:.3f} native={native_partner:.3f}")
    assert v["mode"] == "reembed" and v["db_candidates"] == N
    # a broken map, mismatched ids or a wrong frame drive these towards 0 (identity top-1 is ~0.001)
    assert v["partner_recall@10"] > 0.9
    assert v["db_partner_recall@10"] > 0.8
    assert query_side > 0.8


def test_pgvector_checkpoint_table_alias_view_and_exact_search(pg_url, corpus):  # noqa: F811
    """Checkpoint kept in a PostgreSQL table; alias as a view; exact search (no index) matches numpy."""
    from service.vectordb import PgCheckpoint, PgVectorStore

    store = PgVectorStore(pg_url, index=None)
    for t in ("ck_src", "ck_dst"):
        store.drop(t)
    X = corpus["X"][:500]
    store.create("ck_src", X.shape[1])
    store.upsert("ck_src", np.arange(500), X)
    ck = PgCheckpoint(pg_url, "ck_src->ck_dst")
    ck.clear()

    def crash(p):
        if p.done >= 200:
            raise RuntimeError("crash after the checkpoint of row 199")
    with pytest.raises(RuntimeError):
        migrate(store, "ck_src", "ck_dst", corpus["map"], batch_size=100, checkpoint=ck, progress=crash)
    assert ck.load()["last_id"] == 199
    rep = migrate(store, "ck_src", "ck_dst", corpus["map"], batch_size=100, checkpoint=ck, alias="ck_live")
    assert rep.resumed_from == 199 and rep.rows == 500 and ck.load()["finished"]
    assert store.resolve_alias("ck_live") == "ck_dst" and store.dim("ck_live") == corpus["map"].target_dim
    Yhat = corpus["map"].apply(X, output="raw")
    S, I = store.search("ck_live", Yhat[:20], 5)
    S_ref, I_ref = align.knn(Yhat[:20], Yhat, 5)
    np.testing.assert_array_equal(I[:, 0], I_ref[:, 0])
    np.testing.assert_allclose(S, S_ref, atol=1e-5)
    ck.clear()
    ck.close()
    for t in ("ck_src", "ck_dst"):
        store.drop(t)
    store.close()
