"""``vecbridge index``: the FAISS indexes of a data dir from the command line, on real files and real FAISS.

What a user of offline jobs needs: build from a file streamed in blocks (the same index as one built
from the whole array), add a batch as one generation (all rows or none), search from another space
through the registry's map path, delete, drop, compact before a downgrade; bad input is exit 2 with
nothing written; and a running ``vecbridge serve`` on the same data dir sees every CLI write.
"""

from __future__ import annotations

import json
import sys

import httpx
import numpy as np
import pytest
from _api_support import KEYS
from _servers import env_for, seed_registry, start_on_free_port, stop
from conftest import run_cli

from service.indexes import IndexNotFoundError, IndexStore, SpaceIndex
from service.indexes.persist import read_meta
from service.ops import index_files

RKEY = next(k for k, scopes in KEYS.items() if scopes == ["read"])


@pytest.fixture
def world(tmp_path):
    """A data dir with spaces a, b (16-d) and the map a2b (planted rotation), and the rows as files."""
    data = tmp_path / "var"
    X, Y, _ = seed_registry(data)
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", Y)
    return data, tmp_path, X, Y


def cli(capsys, data, *args):
    return run_cli(capsys, "--data-dir", data, "index", *args)


def test_create_search_from_another_space_add_delete_compact_drop(world, capsys):
    data, tmp, X, _ = world
    with open(tmp / "pl.jsonl", "w") as fh:
        fh.writelines(json.dumps({"row": i}) + "\n" for i in range(200))
    code, out, err = cli(capsys, data, "create", "docs", "--space", "b", tmp / "y.npy", "--rows", "0:200",
                         "--payloads", tmp / "pl.jsonl", "--quiet")
    assert code == 0, err
    assert out.startswith("created docs  b(16)  flat  cosine  200 rows  generation 1")
    code, out, _ = cli(capsys, data, "show", "docs", "--json")
    shown = json.loads(out)
    assert (shown["count"], shown["space"], shown["kind"], shown["generation"], shown["logged_deltas"]) == \
        (200, "b", "flat", 1, 0)
    code, out, _ = cli(capsys, data, "show", "docs")  # the same fields, one line each, as `registry show` prints
    lines = {k: v.strip() for k, _, v in (line.partition(" ") for line in out.strip().splitlines())}
    assert code == 0 and set(lines) == set(shown) and lines["count"] == "200" and lines["space"] == "b"
    assert json.loads(lines["params"]) == shown["params"]  # a dict shown as JSON

    # queries of space a go through the map a2b (as over HTTP): row i of X finds row i of Y
    np.save(tmp / "q.npy", X[:20])
    code, out, err = cli(capsys, data, "search", "docs", tmp / "q.npy", "--space", "a", "-k", "3", "--json",
                         "--payloads")
    assert code == 0, err
    ans = json.loads(out)
    assert ans["maps"] == [{"name": "a2b", "version": 1, "source_space": "a", "target_space": "b"}]
    assert [r[0]["id"] for r in ans["results"]] == list(range(20))
    assert [r[0]["payload"] for r in ans["results"]] == [{"row": i} for i in range(20)]
    code, out, _ = cli(capsys, data, "search", "docs", tmp / "q.npy", "--space", "a", "--k", "2",
                       "--out", tmp / "hits.npz")  # --k as the HTTP field is named (before: "did you mean --key?")
    assert code == 0 and "wrote the hits of 20 queries" in out
    with np.load(tmp / "hits.npz") as z:
        assert z["ids"].shape == (20, 2) and (z["ids"][:, 0] == np.arange(20)).all()

    code, out, err = cli(capsys, data, "add", "docs", tmp / "y.npy", "--rows", "200:300", "--quiet", "--json")
    assert code == 0, err
    added = json.loads(out)
    assert (added["added"], added["first_id"], added["last_id"], added["count"]) == (100, 200, 299, 300)
    code, out, _ = cli(capsys, data, "delete", "docs", "--id", "5", "--id", "6", "--id", "9999")
    assert code == 0 and "deleted 2 rows" in out
    assert json.loads(cli(capsys, data, "show", "docs", "--json")[1])["logged_deltas"] == 2  # small changes: deltas

    code, out, _ = cli(capsys, data, "compact", "--all")
    assert code == 0 and "docs: generation 4 is a snapshot (2 logged deltas folded in)" in out
    meta = read_meta(data / "indexes" / "docs")
    assert meta["base"] == meta["generation"] == 4 and meta["log"] == []
    assert "(already)" in cli(capsys, data, "compact", "docs")[1]  # nothing to fold: no new generation
    assert read_meta(data / "indexes" / "docs")["generation"] == 4

    assert cli(capsys, data, "drop", "docs")[0] == 2  # needs --yes
    assert cli(capsys, data, "drop", "docs", "--yes")[0] == 0
    code, _, err = cli(capsys, data, "show", "docs")
    assert code == 2 and "not found" in err


@pytest.mark.parametrize("map_ref", [None, "a2b@prod"])
def test_a_search_in_blocks_keeps_the_map_version_the_first_block_used(world, map_ref):
    """``index search`` cuts a large query file in blocks of ``max_hits // k`` queries. Each block resolved the map
    path anew, so a deploy moving ``a2b@prod`` meanwhile sent the later blocks through another version (reported
    as the first block's), and steers likewise. Now every block goes through the versions the first used
    (``search_parts``)."""
    from align import Steer, fit_procrustes
    from service.limits import DEFAULT_LIMITS
    from service.ops import indexes as index_ops
    from service.registry import open_registry

    data, _, X, Y = world
    reg = open_registry(f"sqlite:///{data / 'registry.sqlite'}", data / "artifacts")
    try:
        reg.register_version("a2b", fit_procrustes(X, -Y), source_space="a", target_space="b", method="procrustes",
                             params={})  # v2 sends row i of X to -Y[i]: never its own row
        reg.set_alias("a2b", "prod", 1)
        eye = np.eye(16, dtype=np.float32)  # steer v1: W = 0 (no change); v2: W = -2 I (q -> -q)
        for P1, P2 in ((np.zeros((16, 1)), np.zeros((16, 1))), (-2 * eye, eye)):
            reg.register_steer("flip", Steer(P1, P2), space="b")
        reg.set_steer_alias("flip", "prod", 1)
        idx = IndexStore(data / "indexes").create("blocks", "b", Y[:200], dim=16)
        resolver = index_ops.RegistryResolver(reg)

        def parts():  # the query file's blocks; a deploy moves the aliases between the first two
            yield {"Q": X[:100]}
            reg.set_alias("a2b", "prod", 2)
            reg.set_steer_alias("flip", "prod", 2)
            yield {"Q": X[100:200]}

        found = list(index_ops.search_parts(resolver, idx, parts(), space="a", map_ref=map_ref, k=1,
                                            steers={"flip@prod": 1.0}, limits=DEFAULT_LIMITS))
        assert [[v.version for v in f.translation.versions] for f in found] == [[1], [1]]
        assert [[s["version"] for s in f.steers] for f in found] == [[1], [1]]
        assert np.concatenate([f.I[:, 0] for f in found]).tolist() == list(range(200))
        now = index_ops.search(resolver, idx, X[:1], space="a", map_ref=map_ref, k=1, limits=DEFAULT_LIMITS)
        assert [v.version for v in now.translation.versions] == [2]  # the alias did move
    finally:
        reg.close()


def test_a_file_streamed_in_blocks_gives_the_index_built_from_the_whole_array(world, capsys, monkeypatch):
    """Blocks of 64 rows (the file read block by block, never whole): the same ids, rows and answers as an
    index built in memory from the whole array; a multi-block add is ONE generation."""
    data, tmp, _, _ = world
    rng = np.random.default_rng(1)
    big = rng.standard_normal((1000, 16)).astype(np.float32)
    np.save(tmp / "big.npy", big)
    np.save(tmp / "ids.npy", np.arange(10_000, 10_700))
    monkeypatch.setattr(index_files, "CHUNK_ROWS", 64)
    code, _, err = cli(capsys, data, "create", "big", "--space", "b", tmp / "big.npy", "--rows", "0:700",
                       "--ids", tmp / "ids.npy", "--kind", "hnsw", "--param", "M=16", "--quiet")
    assert code == 0, err
    ref = SpaceIndex.build("ref", "b", big[:700], ids=np.arange(10_000, 10_700), kind="hnsw", params={"M": 16})
    idx = IndexStore(data / "indexes").get("big")
    Q = rng.standard_normal((50, 16)).astype(np.float32)
    for a, b in zip(idx.search(Q, 10), ref.search(Q, 10)):
        np.testing.assert_array_equal(a, b)

    code, out, err = cli(capsys, data, "add", "big", tmp / "big.npy", "--rows", "700:1000", "--json", "--quiet")
    assert code == 0, err
    assert json.loads(out)["generation"] == 2 and json.loads(out)["count"] == 1000  # 5 blocks, one generation
    assert (json.loads(out)["first_id"], json.loads(out)["last_id"]) == (10_700, 10_999)


def test_ivf_trains_on_a_sample_of_the_whole_file_not_its_first_block(world, capsys, monkeypatch):
    data, tmp, _, _ = world
    rng = np.random.default_rng(2)
    # the first rows are one cluster, the rest another: k-means on the first block alone would miss half the data
    A = np.vstack([rng.normal(5, 1, (600, 16)), rng.normal(-5, 1, (1400, 16))]).astype(np.float32)
    np.save(tmp / "a.npy", A)
    monkeypatch.setattr(index_files, "CHUNK_ROWS", 256)
    code, _, err = cli(capsys, data, "create", "iv", "--space", "b", tmp / "a.npy", "--kind", "ivf",
                       "--param", "nlist=8", "--param", "nprobe=1", "--quiet")
    assert code == 0, err
    idx = IndexStore(data / "indexes").get("iv")
    assert idx.count == 2000 and idx.params["nlist"] == 8
    centroids = idx.index.quantizer.reconstruct_n(0, 8)
    assert (centroids[:, 0] > 0).any() and (centroids[:, 0] < 0).any()  # lists on both clusters


def test_ivf_train_rows_is_set_shown_and_checked_on_create(world, capsys, monkeypatch):
    """``--param train_rows=N``: the rows IVF's k-means trains on (default 64 x nlist), recorded in the index's params
    and shown; nonsense is exit 2 with a message and nothing written. Before: an unknown parameter, and k-means ran
    on every row up to 256 x nlist."""
    data, tmp, _, _ = world
    A = np.random.default_rng(4).standard_normal((2000, 16)).astype(np.float32)
    np.save(tmp / "a.npy", A)
    monkeypatch.setattr(index_files, "CHUNK_ROWS", 256)  # the sample is drawn from the whole file in a pass
    code, out, err = cli(capsys, data, "create", "iv", "--space", "b", tmp / "a.npy", "--kind", "ivf",
                         "--param", "nlist=8", "--param", "train_rows=300", "--quiet")
    assert code == 0, err
    assert "nlist=8,nprobe=8,random_state=0,train_rows=300" in out
    assert json.loads(cli(capsys, data, "show", "iv", "--json")[1])["params"]["train_rows"] == 300
    code, out, err = cli(capsys, data, "create", "iv2", "--space", "b", tmp / "a.npy", "--kind", "ivf",
                         "--param", "nlist=8", "--quiet", "--json", "--random-state", "9")
    assert code == 0, err
    assert json.loads(out)["params"]["train_rows"] == 512  # 64 x nlist
    # the same sample and k-means as a create from the rows in memory (HTTP's path), seed for seed
    mem = SpaceIndex.build("m", "b", A, kind="ivf", params={"nlist": 8}, random_state=9)
    made = IndexStore(data / "indexes").get("iv2")  # held: the quantizer is FAISS's pointer into its index
    assert np.array_equal(made.index.quantizer.reconstruct_n(0, 8), mem.index.quantizer.reconstruct_n(0, 8))
    for value, message in (("4", "train_rows=4 is below nlist=8"), ("abc", "train_rows must be an integer"),
                           ("2049", "exceeds 256 x nlist = 2048"), ("1.5", "train_rows must be an integer")):
        code, _, err = cli(capsys, data, "create", "bad", "--space", "b", tmp / "a.npy", "--kind", "ivf",
                           "--param", "nlist=8", "--param", f"train_rows={value}", "--quiet")
        assert code == 2 and message in err, (value, err)
    # a seed as a parameter was stored as random_state=0 (the --random-state default) without a word: now it is the
    # seed when --random-state is not given (as `index show` reports it, in params), and two seeds that differ exit 2
    code, _, err = cli(capsys, data, "create", "bad", "--space", "b", tmp / "a.npy", "--kind", "ivf",
                       "--param", "nlist=8", "--param", "random_state=9", "--random-state", "1", "--quiet")
    assert code == 2 and "differs from the index's random_state (1)" in err and "`--random-state`" in err, err
    assert not (data / "indexes" / "bad").exists()
    code, out, err = cli(capsys, data, "create", "seeded", "--space", "b", tmp / "a.npy", "--kind", "ivf",
                         "--param", "nlist=8", "--param", "random_state=9", "--json")
    assert code == 0 and json.loads(out)["params"]["random_state"] == 9, err
    # a whole float is the int, as for every integer parameter (it reached NumPy as 3.0: internal error, exit 3)
    code, out, err = cli(capsys, data, "create", "seeded2", "--space", "b", tmp / "a.npy", "--kind", "ivf",
                         "--param", "nlist=8", "--param", "random_state=3.0", "--json")
    assert code == 0 and json.loads(out)["params"]["random_state"] == 3, err
    assert not (data / "indexes" / "bad").exists()


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_npz_scores_are_minus_inf_wherever_ids_are_minus_1(world, capsys, kind):
    """``--out FILE.npz`` with ``k`` above the rows: a plain search padded the scores with FAISS's -FLT_MAX
    (-3.4e38), a CSLS one with -inf. Now -inf both ways, as ``--help`` says."""
    data, tmp, _, Y = world
    code, _, err = cli(capsys, data, "create", "few", "--space", "b", tmp / "y.npy", "--rows", "0:5", "--kind", kind,
                       *(["--param", "nlist=1"] if kind == "ivf" else []), "--quiet")
    assert code == 0, err
    np.save(tmp / "q.npy", Y[:3])
    for extra in ([], ["--csls"]):
        code, _, err = cli(capsys, data, "search", "few", tmp / "q.npy", "-k", "8", "--out", tmp / "h.npz", *extra)
        assert code == 0, err
        with np.load(tmp / "h.npz") as z:
            ids, scores = z["ids"], z["scores"]
        assert ((ids >= 0).sum(axis=1) == 5).all(), extra
        assert np.isneginf(scores[ids < 0]).all() and np.isfinite(scores[ids >= 0]).all(), (extra, scores[:, -1])
    assert "ids are -1 and scores -inf" in " ".join(cli(capsys, data, "search", "--help")[1].split())


def test_bad_input_is_exit_2_and_writes_nothing(world, capsys, monkeypatch):
    data, tmp, X, _ = world
    np.save(tmp / "narrow.npy", X[:, :8])
    code, _, err = cli(capsys, data, "create", "n", "--space", "b", tmp / "narrow.npy", "--quiet")
    assert code == 2 and "8 columns" in err and "16-d" in err
    assert not (data / "indexes" / "n").exists()
    code, _, err = cli(capsys, data, "create", "n", "--space", "nope", tmp / "y.npy", "--quiet")
    assert code == 2 and "nope" in err

    assert cli(capsys, data, "create", "docs", "--space", "b", tmp / "y.npy", "--rows", "0:100", "--quiet")[0] == 0
    assert cli(capsys, data, "create", "docs", "--space", "b", tmp / "y.npy", "--quiet")[0] == 2  # exists
    code, _, err = cli(capsys, data, "add", "docs", tmp / "x.npy", "--space", "a", "--quiet")
    assert code == 2 and "holds space 'b'" in err
    code, _, err = cli(capsys, data, "add", "nope", tmp / "y.npy", "--quiet")
    assert code == 2 and "not found" in err

    # a payloads file one line short, over several blocks: nothing added, not even the first blocks
    monkeypatch.setattr(index_files, "CHUNK_ROWS", 32)
    with open(tmp / "short.jsonl", "w") as fh:
        fh.writelines("{}\n" for _ in range(99))
    code, _, err = cli(capsys, data, "add", "docs", tmp / "y.npy", "--rows", "100:200", "--payloads",
                       tmp / "short.jsonl", "--quiet")
    assert code == 2 and "99 lines for the 100 rows" in err
    code, _, err = cli(capsys, data, "add", "docs", tmp / "y.npy", "--rows", "100:200", "--ids", tmp / "narrow.npy")
    assert code == 2 and "ids" in err
    shown = json.loads(cli(capsys, data, "show", "docs", "--json")[1])
    assert (shown["count"], shown["generation"]) == (100, 1)

    # texts embedded by another model than the space's: refused before any model loads
    from service.registry import open_registry

    reg = open_registry(f"sqlite:///{data / 'registry.sqlite'}", data / "artifacts")
    reg.register_space("m", 384, encoder="all-MiniLM-L6-v2")
    reg.close()
    (tmp / "t.txt").write_text("one\ntwo\n")
    code, _, err = cli(capsys, data, "create", "t", "--space", "m", tmp / "t.txt", "--encoder", "e5", "--quiet")
    assert code == 2 and "would not be comparable" in err
    assert cli(capsys, data, "search", "docs", tmp / "y.npy", "--out", tmp / "h.csv")[0] == 2
    assert cli(capsys, data, "compact")[0] == 2  # NAME or --all
    code, _, err = cli(capsys, data, "search", "docs", tmp / "y.npy", "--steer", "s=much")
    assert code == 2 and "EPS must be a number" in err
    # a ref given twice kept the last value without a word (plant:1=1 then plant:1=-1 searched with -1)
    code, _, err = cli(capsys, data, "search", "docs", tmp / "y.npy", "--steer", "s:1=1", "--steer", "s:1=-1")
    assert code == 2 and "steer 's:1' is given twice; give each once" in err


def test_compact_all_exits_non_zero_when_an_index_fails(world, capsys):
    """RELIABILITY.md's step before a downgrade, `index compact --all`, printed the failure of an index whose file is
    gone (and --json listed it under "failed") but exited 0: click, run not standalone, returned the command's
    ``Exit(2)`` and ``main`` ignored it. A script then went on to the downgrade. Now the code is the exit status."""
    data, tmp, _, _ = world
    for name in ("bad", "good"):
        assert cli(capsys, data, "create", name, "--space", "b", tmp / "y.npy", "--rows", "0:50", "--quiet")[0] == 0
        assert cli(capsys, data, "add", name, tmp / "y.npy", "--rows", "50:60", "--quiet")[0] == 0
    (data / "indexes" / "bad" / "delta.2.npz").unlink()
    code, out, err = cli(capsys, data, "compact", "--all", "--json")
    assert code == 2, (out, err)
    ans = json.loads(out)
    assert set(ans["failed"]) == {"bad"} and [d["index"] for d in ans["compacted"]] == ["good"]
    assert "index 'bad'" in err
    code, out, err = cli(capsys, data, "compact", "--all")
    assert code == 2 and "good: generation 3 is a snapshot (already)" in out and "index 'bad'" in err


def test_create_if_not_exists_is_done_for_the_same_settings_and_a_conflict_naming_another(world, capsys):
    """A provisioning script run again failed on its `index create` (exit 2, "already exists"), and had no way to
    say "create unless it is there". --if-not-exists: exit 0 without reading FILE for the same settings; a conflict
    (exit 2) naming the setting when they differ, so a changed script is not taken for done."""
    data, tmp, _, _ = world
    code, out, err = cli(capsys, data, "create", "docs", "--space", "b", tmp / "y.npy", "--kind", "hnsw",
                         "--param", "M=16", "--if-not-exists", "--quiet", "--json")
    assert code == 0 and json.loads(out)["created"] is True, err
    before = json.loads(cli(capsys, data, "show", "docs", "--json")[1])
    gone = tmp / "no-such-file.npy"  # FILE is not read: the index is there
    for extra in ([], ["--kind", "hnsw"], ["--param", "M=16", "--param", "ef_search=64"], ["--random-state", "0"],
                  ["--kind", "auto", "--metric", "cosine"]):
        code, out, err = cli(capsys, data, "create", "docs", "--space", "b", gone, "--if-not-exists", *extra)
        assert (code, err) == (0, ""), (extra, code, err)
        assert out.startswith("index docs exists with the same settings, left as it is: docs  b(16)  hnsw  cosine")
        assert out.count("\n") == 1
    code, out, _ = cli(capsys, data, "create", "docs", "--space", "b", gone, "--if-not-exists", "--json")
    assert code == 0 and json.loads(out) == {**before, "created": False}
    assert json.loads(cli(capsys, data, "show", "docs", "--json")[1]) == before  # nothing written

    for extra, says in ((["--metric", "ip"], "metric 'cosine', not 'ip'"),
                        (["--kind", "flat"], "kind 'hnsw', not 'flat'"), (["--param", "M=32"], "M=16, not 32"),
                        (["--random-state", "7"], "random_state=0, not 7"),
                        (["--param", "random_state=7"], "random_state=0, not 7")):
        code, out, err = cli(capsys, data, "create", "docs", "--space", "b", gone, "--if-not-exists", *extra)
        assert code == 2 and out == "" and err.count("\n") == 1, (extra, code, err)
        assert f"index 'docs' already exists with other settings: {says}" in err, err
    code, _, err = cli(capsys, data, "create", "docs", "--space", "a", gone, "--if-not-exists", "--metric", "ip")
    assert code == 2 and "space 'b', not 'a'; metric 'cosine', not 'ip'" in err  # each setting that differs
    code, _, err = cli(capsys, data, "create", "docs", "--space", "b", tmp / "y.npy", "--kind", "hnsw", "--quiet")
    assert code == 2 and "already exists" in err  # without the flag: the conflict it always was
    assert json.loads(cli(capsys, data, "show", "docs", "--json")[1]) == before


def _narrow_space(data, X, Y):
    """Space c (8-d) and the map c2b (c -> b) beside the world's a, b: queries of another width than b's."""
    from align import fit_ridge
    from service.registry import open_registry

    reg = open_registry(f"sqlite:///{data / 'registry.sqlite'}", data / "artifacts")
    try:
        reg.register_space("c", 8)
        reg.register_version("c2b", fit_ridge(X[:, :8], Y, alpha=1e-3), source_space="c", target_space="b",
                             method="ridge", params={})
    finally:
        reg.close()


def test_queries_of_another_width_through_a_map_are_exit_2_as_over_http(world, capsys):
    """A search through a map applied it unchecked: 16-d rows declared as the 8-d space c reached the GEMM and the CLI
    ended in ``internal error: ValueError: matmul ...``, where HTTP answered 422. The search op checks the width."""
    data, tmp, X, Y = world
    _narrow_space(data, X, Y)
    assert cli(capsys, data, "create", "docs", "--space", "b", tmp / "y.npy", "--quiet")[0] == 0
    code, _, err = cli(capsys, data, "search", "docs", tmp / "y.npy", "--rows", "0:2", "--space", "c", "-k", "3")
    assert code == 2 and "vectors: expected 8 columns, got 16" in err and "internal error" not in err, err
    np.save(tmp / "c.npy", X[:2, :8])
    assert cli(capsys, data, "search", "docs", tmp / "c.npy", "--space", "c", "-k", "3")[0] == 0


def test_an_all_zero_query_is_refused_through_a_map_as_without_one(world, capsys):
    """A zero query to a cosine index is refused (no direction), but through a map it was searched: the affine map
    sent it to its offset, which found confident hits (CLI and HTTP alike). The search op now refuses it before
    the map, with the unmapped path's message; an inner-product index, which ranks a zero query unmapped with
    scores 0, refuses it through a map too."""
    from _api_support import settings_for
    from fastapi.testclient import TestClient

    from service.api import create_app

    data, tmp, _, _ = world
    assert cli(capsys, data, "create", "docs", "--space", "b", tmp / "y.npy", "--quiet")[0] == 0
    assert cli(capsys, data, "create", "dot", "--space", "b", tmp / "y.npy", "--metric", "ip", "--quiet")[0] == 0
    zero = np.zeros((2, 16), np.float32)
    np.save(tmp / "zero.npy", zero)
    said = "queries: 2 all-zero row(s); a cosine index needs a direction"
    plain, mapped = (cli(capsys, data, "search", "docs", tmp / "zero.npy", *space) for space in ([], ["--space", "a"]))
    assert plain[0] == mapped[0] == 2 and said in plain[2] and mapped[2] == plain[2], mapped
    code, _, err = cli(capsys, data, "search", "dot", tmp / "zero.npy", "--space", "a")
    assert code == 2 and "queries: 2 all-zero row(s); a zero query has no direction" in err, err
    assert cli(capsys, data, "search", "dot", tmp / "zero.npy")[0] == 0  # unmapped: scored 0, as before
    with TestClient(create_app(settings_for(tmp, data_dir=data))) as c:
        for body in ({"vectors": zero.tolist()}, {"vectors": zero.tolist(), "space": "a"}):
            r = c.post("/v1/indexes/docs/search", headers={"Authorization": f"Bearer {RKEY}"}, json=body)
            assert r.status_code == 422 and said in r.json()["error"]["message"], r.text


def test_a_pinned_map_that_does_not_lead_is_said_alike_and_repeated_maps_pin_a_path(world, capsys):
    """HTTP checked the rows' width against the index's space before the pinned map: 8-d rows of space c sent with
    ``map: c2b:1`` and no ``space`` were blamed on their width, where the CLI said where the map goes. And the
    CLI's ``--map`` kept only the last of several, where HTTP takes a path: ``--map a2c --map c2b`` went c -> b."""
    from _api_support import settings_for
    from fastapi.testclient import TestClient

    from align import fit_ridge
    from service.api import create_app
    from service.registry import open_registry

    data, tmp, X, Y = world
    _narrow_space(data, X, Y)
    reg = open_registry(f"sqlite:///{data / 'registry.sqlite'}", data / "artifacts")
    try:
        reg.register_version("a2c", fit_ridge(X, X[:, :8], alpha=1e-3), source_space="a", target_space="c",
                             method="ridge", params={})
    finally:
        reg.close()
    assert cli(capsys, data, "create", "docs", "--space", "b", tmp / "y.npy", "--quiet")[0] == 0
    np.save(tmp / "c.npy", X[:5, :8])
    said = "map c2b:1 goes c -> b, but the request needs b -> b"
    code, _, err = cli(capsys, data, "search", "docs", tmp / "c.npy", "--map", "c2b:1")
    assert code == 2 and said in err, err
    with TestClient(create_app(settings_for(tmp, data_dir=data))) as c:
        r = c.post("/v1/indexes/docs/search", headers={"Authorization": f"Bearer {RKEY}"},
                   json={"vectors": X[:5, :8].tolist(), "map": ["c2b:1"]})
        assert r.status_code == 422 and said in r.json()["error"]["message"], r.text
    code, out, err = cli(capsys, data, "search", "docs", tmp / "x.npy", "--rows", "0:5", "--space", "a",
                         "--map", "a2c", "--map", "c2b", "-k", "1", "--json")
    assert code == 0, err
    assert [(m["name"], m["version"]) for m in json.loads(out)["maps"]] == [("a2c", 1), ("c2b", 1)]


def test_add_blocks_that_fail_part_way_leave_the_index_as_persisted(tmp_path):
    """An add of several blocks whose third block is bad: the first two are not kept in memory either (the
    index answers as persisted), and nothing is written."""
    rng = np.random.default_rng(3)
    idx = SpaceIndex.build("u", "s", rng.standard_normal((50, 8)), path=tmp_path / "u")
    idx.save()
    blocks = [(rng.standard_normal((10, 8)), None, None), (rng.standard_normal((10, 8)), None, None),
              (rng.standard_normal((10, 7)), None, None)]
    with pytest.raises(Exception, match="7"):
        idx.add_blocks(iter(blocks))
    assert (idx.count, idx.generation, idx.next_id) == (50, 1, 50)
    again = SpaceIndex.load(tmp_path / "u")
    assert again.count == 50 and again.generation == 1


def test_another_writer_is_not_held_while_a_multi_block_add_reads_its_file(world, monkeypatch):
    """``index add`` of a file of several blocks held the index's writer lock from its first block read to the save,
    so every other writer of the index (an HTTP add, another CLI job) waited for the whole read of the file (8.7 s
    for a 439 MB .npy read cold). Now the blocks are read, checked and prepared first and the lock is held only to
    add and save them: an add made while the file is read is done at once, and both are kept."""
    import threading

    data, tmp, _, Y = world
    monkeypatch.setattr(index_files, "CHUNK_ROWS", 64)
    big = np.random.default_rng(5).standard_normal((300, 16)).astype(np.float32)
    np.save(tmp / "big.npy", big)
    idx = IndexStore(data / "indexes").create("busy", "b", Y[:10], dim=16)
    other = IndexStore(data / "indexes").get("busy")  # another writer: its own store and lock descriptor
    writer, during = threading.Thread(target=other.add, args=(Y[10:11],)), []

    def add_while_reading(stage, fraction):  # called as each block of the file has been read
        if not during:
            writer.start()
            writer.join(timeout=5)
            during.append(not writer.is_alive())

    ids = index_files.add_from_file(None, idx, index_files.FileRows(str(tmp / "big.npy")), progress=add_while_reading)
    writer.join(60)
    assert not writer.is_alive(), "the other writer's add still runs after 60 s"
    assert during == [True]  # the other writer's add finished while the file was being read
    assert ids.tolist() == list(range(11, 311))  # automatic ids drawn under the lock, after the other add's id 10
    again = IndexStore(data / "indexes").get("busy")
    assert again.count == 311 and again.has_ids(np.arange(311)).all()
    np.testing.assert_array_equal(again.search(big[:5], 1)[1][:, 0], np.arange(11, 16))

    # ids already in the index are refused under the lock (checked against the newest generation), nothing kept
    with pytest.raises(Exception, match="already in index"):
        index_files.add_from_file(None, again, index_files.FileRows(str(tmp / "big.npy")), ids=np.arange(310, 610))
    assert IndexStore(data / "indexes").get("busy").count == 311 and again.count == 311


def test_a_running_server_sees_every_cli_write(world, capsys):
    data, tmp, X, Y = world
    proc, port = start_on_free_port(lambda port: (
        [sys.executable, "-m", "uvicorn", "--factory", "service.api:create_app", "--host", "127.0.0.1",
         "--port", str(port), "--no-access-log"], env_for(data, port)), tmp / "server.log")
    base, h = f"http://127.0.0.1:{port}/v1/indexes", {"Authorization": f"Bearer {RKEY}"}
    try:
        assert cli(capsys, data, "create", "live", "--space", "b", tmp / "y.npy", "--rows", "0:150",
                   "--quiet")[0] == 0
        assert httpx.get(f"{base}/live", headers=h).json()["count"] == 150
        np.save(tmp / "q.npy", X[:5])
        http = httpx.post(f"{base}/live/search", headers=h,
                          json={"vectors": X[:5].tolist(), "space": "a", "k": 4})
        code, out, _ = cli(capsys, data, "search", "live", tmp / "q.npy", "--space", "a", "-k", "4", "--json")
        assert code == 0 and json.loads(out) == http.json()  # the same answer, head and hits (payloads by default)
        assert cli(capsys, data, "add", "live", tmp / "y.npy", "--rows", "150:300", "--quiet")[0] == 0
        assert httpx.get(f"{base}/live", headers=h).json()["count"] == 300
        assert cli(capsys, data, "delete", "live", "--id", "0")[0] == 0
        assert cli(capsys, data, "compact", "live")[0] == 0
        hit = httpx.post(f"{base}/live/search", headers=h, json={"vectors": Y[:1].tolist(), "k": 1}).json()
        assert hit["results"][0][0]["id"] != 0
        assert httpx.get(f"{base}/live", headers=h).json()["count"] == 299
        assert cli(capsys, data, "drop", "live", "--yes")[0] == 0
        assert httpx.get(f"{base}/live", headers=h).status_code == 404
    finally:
        stop(proc)


def test_texts_are_embedded_with_the_space_encoder_and_kept_as_payloads(tmp_path, capsys):
    """A text file (the real MiniLM wheel): passages in, queries by text out, texts back as payloads."""
    pytest.importorskip("sentence_transformers")
    from service.registry import open_registry

    data = tmp_path / "var"
    data.mkdir()
    reg = open_registry(f"sqlite:///{data / 'registry.sqlite'}", data / "artifacts")
    reg.register_space("minilm", 384, encoder="all-MiniLM-L6-v2")
    reg.close()
    docs = ["a cat sat on the mat", "stock markets fell sharply", "the recipe needs two eggs"]
    (tmp_path / "d.txt").write_text("\n".join(docs) + "\n")
    (tmp_path / "q.jsonl").write_text(json.dumps({"text": "shares dropped on Wall Street"}) + "\n")
    assert cli(capsys, data, "create", "tx", "--space", "minilm", tmp_path / "d.txt", "--quiet")[0] == 0
    code, out, err = cli(capsys, data, "search", "tx", tmp_path / "q.jsonl", "--rows", "0:1", "-k", "1", "--json",
                         "--payloads")
    assert code == 0, err
    assert json.loads(out)["results"][0][0] == {**json.loads(out)["results"][0][0], "id": 1,
                                                "payload": {"text": docs[1]}}


def test_an_ids_text_file_may_lay_its_ids_out_as_it_likes(capsys, tmp_path):
    """`--ids` reads "whitespace-separated integers", but '5 6 7\\n8 9 ...' was "the number of columns changed from
    3 to 7" and '1 2\\n3 4' "must be a flat list"; '1_0' read as 10; seeds.NPY was parsed as text."""
    from align.exceptions import InputError
    from service.cli._common import read_ids, read_seed_pairs

    (tmp_path / "a.txt").write_text("5 6 7\n8 9 10 11 12 13 14\n")
    (tmp_path / "b.txt").write_text("1 2\n3 4\n")
    assert read_ids(str(tmp_path / "a.txt")).tolist() == list(range(5, 15))
    assert read_ids(str(tmp_path / "b.txt")).tolist() == [1, 2, 3, 4]
    for bad in ("1_0 2", "1.5", "99999999999999999999999"):
        (tmp_path / "c.txt").write_text(bad)
        with pytest.raises(InputError, match="c.txt: cannot read ids"):
            read_ids(str(tmp_path / "c.txt"))
    np.save(tmp_path / "s.npy", np.array([[0, 1], [2, 3]]))
    (tmp_path / "s.npy").rename(tmp_path / "s.NPY")
    assert [a.tolist() for a in read_seed_pairs(str(tmp_path / "s.NPY"))] == [[0, 2], [1, 3]]


def test_search_out_holds_one_block_of_hits_not_every_query(world, capsys, monkeypatch):
    """``--out FILE.npz`` kept every block's payloads and built a hit dict per hit of every query (~300 bytes each:
    1.3 GB for a 49 MB npz) though the file holds ids and scores only; ``.jsonl`` built every query's hits before
    writing any. Now ``.npz`` holds the (n, k) arrays alone and ``.jsonl`` is written block by block."""
    import tracemalloc

    data, tmp, _, Y = world
    with open(tmp / "pl.jsonl", "w") as fh:
        fh.writelines(json.dumps({"row": i, "text": "x" * 40}) + "\n" for i in range(200))
    assert cli(capsys, data, "create", "docs", "--space", "b", tmp / "y.npy", "--rows", "0:200",
               "--payloads", tmp / "pl.jsonl", "--quiet")[0] == 0
    n, k = 5000, 20
    np.save(tmp / "q.npy", np.tile(Y[:200], (n // 200, 1)))
    monkeypatch.setenv("VECBRIDGE_LIMITS__MAX_HITS", "4000")  # blocks of 200 queries
    for name in ("h.npz", "h.jsonl"):
        tracemalloc.start()
        try:
            code, out, err = cli(capsys, data, "search", "docs", tmp / "q.npy", "-k", k, "--out", tmp / name)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert code == 0 and f"wrote the hits of {n} queries" in out, err
        assert peak < n * k * 12 * 2 + 8 * 2**20, (name, peak)  # all hits as dicts: ~30 MB
    with np.load(tmp / "h.npz") as z:
        ids, scores = z["ids"], z["scores"]
    assert ids.shape == scores.shape == (n, k) and (ids[:, 0] == np.tile(np.arange(200), n // 200)).all()
    with open(tmp / "h.jsonl") as fh:
        head, *lines = [json.loads(line) for line in fh]
    assert head["index"] == "docs" and [d["query"] for d in lines] == list(range(n))
    assert [[h["id"] for h in d["hits"]] for d in lines] == ids.tolist()
    assert lines[201]["hits"][0]["payload"] == {"row": 1, "text": "x" * 40}


def test_an_unknown_index_names_the_cli_listing_and_a_close_name(world, capsys):
    """`index search docs-e6` said "GET /v1/indexes lists the existing ones" on the command line, with no word of
    the close name; it names `vecbridge index list` and suggests `docs-e5`. A second `index create` said "already
    exists" alone: it names --if-not-exists. Over HTTP the 404 keeps GET /v1/indexes."""
    data, tmp, _, _ = world
    code, _, err = cli(capsys, data, "create", "docs-e5", "--space", "b", tmp / "y.npy", "--rows", "0:50", "--quiet")
    assert code == 0, err
    for args in (["search", "docs-e6", tmp / "y.npy"], ["show", "docs-e6"], ["drop", "docs-e6", "--yes"]):
        code, _, err = cli(capsys, data, *args)
        assert code == 2 and "index 'docs-e6' not found (no such index) (did you mean 'docs-e5'?)" in err, err
        assert "`vecbridge index list` lists the existing ones" in err and "GET /v1" not in err, err
    code, _, err = cli(capsys, data, "create", "docs-e5", "--space", "b", tmp / "y.npy", "--rows", "0:50", "--quiet")
    assert code == 2 and "index 'docs-e5' already exists; with --if-not-exists" in err, err
    code, _, err = cli(capsys, data, "create", "docs-e5", "--space", "b", tmp / "y.npy", "--rows", "0:50", "--quiet",
                       "--if-not-exists")
    assert code == 0, err
    with pytest.raises(IndexNotFoundError) as e:
        IndexStore(data / "indexes").get("docs-e6")
    assert str(e.value).endswith("(did you mean 'docs-e5'?); GET /v1/indexes lists the existing ones"), str(e.value)


def test_a_text_file_without_its_encoder_names_the_option(world, capsys):
    """`fit --pairs --source texts.json` said "texts.json holds texts: name an encoder to embed them": which flag
    was left to guess. It names the command's option (--source-encoder here; --encoder by default: test_io), and
    an input that takes vectors only says so."""
    data, tmp, _, _ = world
    (tmp / "texts.json").write_text(json.dumps([f"text {i}" for i in range(40)]))
    code, _, err = run_cli(capsys, "--data-dir", data, "fit", "--pairs", "--source", tmp / "texts.json", "--target",
                           tmp / "y.npy", "--rows", "0:40", "--name", "t2y", "--method", "procrustes", "--quiet")
    assert code == 2 and "texts.json holds texts: give --source-encoder to embed them" in err, err
    code, _, err = run_cli(capsys, "--data-dir", data, "plan", "--old", tmp / "texts.json", "--probe-source",
                           tmp / "x.npy", "--probe-target", tmp / "y.npy", "--probe-rows", "0:100")
    assert code == 2 and "texts.json holds texts; this input takes vectors (.npy" in err, err



def test_index_add_of_vectors_needs_no_registry_server(world, capsys, monkeypatch):
    """Review: ``index add ix few.npy`` opened the registry before reading the rows, so with the registry server down
    (``VECBRIDGE_REGISTRY_URL`` refusing connections) 10 rows were exit 75, where vectors never needed a registry.
    Now it is opened only for the rows check (50 rows or more), and a registry not answering leaves them unchecked:
    90 rows went in unchecked without a word; a warning now says so (10 rows are never checked: none)."""
    import socket

    data, tmp, _, Y = world
    code, _, err = cli(capsys, data, "create", "docs", "--space", "b", tmp / "y.npy", "--rows", "0:200", "--quiet")
    assert code == 0, err
    np.save(tmp / "few.npy", Y[200:210])
    np.save(tmp / "many.npy", Y[210:300])
    with socket.socket() as closed:  # bound, never listening: connections to it are refused at once
        closed.bind(("127.0.0.1", 0))
        monkeypatch.setenv("VECBRIDGE_REGISTRY_URL", f"postgresql://vb:pw@127.0.0.1:{closed.getsockname()[1]}/vb")
        code, out, err = cli(capsys, data, "add", "docs", tmp / "few.npy")
        assert code == 0 and "added 10 rows" in out and "warning" not in err, err
        code, out, err = cli(capsys, data, "add", "docs", tmp / "many.npy")
        assert code == 0 and "added 90 rows" in out, err
        assert err.startswith("vecbridge: warning: the rows of ") and "are unchecked by rows: the registry did not " \
            "answer (cannot connect" in err and "taken as 'b' rows" in err and len(err.splitlines()) == 1, err
        code, out, _ = cli(capsys, data, "show", "docs", "--json")
        assert json.loads(out)["count"] == 300


def test_a_search_option_the_index_kind_has_no_use_for_is_exit_2_naming_the_flag(world, capsys):
    """``--ef-search`` on a flat index (and ``--nprobe``) was dropped silently; as over HTTP, it is exit 2 naming the
    flag and the index's kind, and the search runs without it."""
    data, tmp, _, _ = world
    assert cli(capsys, data, "create", "docs", "--space", "b", tmp / "y.npy", "--rows", "0:100", "--quiet")[0] == 0
    for flag in ("--ef-search", "--nprobe"):
        code, _, err = cli(capsys, data, "search", "docs", tmp / "y.npy", "--rows", "0:2", "-k", "3", flag, "8")
        assert code == 2 and f"{flag} is an" in err and "index 'docs' is flat" in err and f"leave {flag} out" in err, \
            err
    assert cli(capsys, data, "search", "docs", tmp / "y.npy", "--rows", "0:2", "-k", "3")[0] == 0


def test_ef_search_has_the_http_bound_and_its_refusal_names_the_flag(world, capsys):
    """``--ef-search`` took up to 100000 (the search's own check) while HTTP stops at 32768, as README says, and its
    refusal named ``ef_search``, not the flag. One bound, 32768: past it exit 2 naming --ef-search before anything
    is searched; at it the search runs. The Python API's search has the same bound."""
    from align.exceptions import InputError

    data, tmp, _, _ = world
    assert cli(capsys, data, "create", "docs", "--space", "b", tmp / "y.npy", "--rows", "0:100", "--kind", "hnsw",
               "--quiet")[0] == 0
    search = ["search", "docs", tmp / "y.npy", "--rows", "0:2", "-k", "3", "--ef-search"]
    code, _, err = cli(capsys, data, *search, "32769")
    assert code == 2 and "--ef-search" in err and "32768" in err and "ef_search" not in err, err
    assert cli(capsys, data, *search, "32768")[0] == 0
    idx = IndexStore(data / "indexes").get("docs")
    with pytest.raises(InputError, match="ef_search must be between 1 and 32768, got 40000"):
        idx.search(np.load(tmp / "y.npy")[:2], 3, ef_search=40000)
