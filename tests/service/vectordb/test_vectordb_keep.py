"""``vecbridge migrate --keep-ids IDS --keep-vectors NEW``: the rows a migration re-embedded to fit its map are
written with their own new-model vectors, every other row as a migration without them writes it; on PostgreSQL +
pgvector (integer ids, a .npy of ids) and Qdrant's local engine (UUID ids, a .json list in upper case or a text file,
one per line). Ids no source row has are counted, not refused. The checkpoint records the keep set: a resume with
the same files gives the uninterrupted run's target, one with other files is refused. Bad input: exit 2 with a
message, no target and no checkpoint (dry run too)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from _vectordb_servers import pg_url, small_migration, uuids  # noqa: F401  (module-scoped server fixture)
from conftest import run_cli

from service.vectordb import FileCheckpoint, MigrationInterrupted, migrate, open_store

N = 200
KEEP = np.array([150, 3, 77, 31, 199, 0, 64])  # rows re-embedded (any order: the vectors follow it)


def _unit(A):
    return (A / np.linalg.norm(A, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(params=["pgvector", "qdrant"])
def world(request, tmp_path):
    """A source collection ``k_src`` of N rows (24-d), the map (24 -> 16) as an artifact, and keep files: the ids of
    KEEP plus one id the source does not have, their new-model vectors (unit rows, 16-d)."""
    X, m = small_migration()
    m.save(tmp_path / "m.npz")
    if request.param == "pgvector":
        pytest.importorskip("psycopg")
        url = request.getfixturevalue("pg_url")
        ids = (np.arange(N) * 5 + 3).tolist()
        ghost = 7  # 7 is no id of the source (3, 8, 13, ...)
    else:
        pytest.importorskip("qdrant_client")
        url = f"qdrant://{tmp_path / 'qd'}"
        ids, ghost = uuids(N), uuids(1, seed=5)[0]
    s = open_store(url)
    for name in ("k_src", "k_plain", "k_kept", "k_other"):
        s.drop(name)
    s.create("k_src", X.shape[1])
    s.upsert("k_src", ids, X, [f"text {i}" for i in range(N)])
    s.close()
    keep_ids = [ids[i] for i in KEEP] + [ghost]
    Y = _unit(np.random.default_rng(3).normal(size=(len(keep_ids), 16)))
    if request.param == "pgvector":
        np.save(tmp_path / "keep_ids.npy", np.array(keep_ids))
        ids_file = tmp_path / "keep_ids.npy"
    else:  # a .json list, in upper case: a UUID is compared in its canonical form
        ids_file = tmp_path / "keep_ids.json"
        ids_file.write_text(json.dumps([i.upper() for i in keep_ids]))
    np.save(tmp_path / "keep_vectors.npy", Y)
    yield {"url": url, "ids": ids, "X": X, "m": m, "Y": Y, "keep_ids": keep_ids, "ids_file": ids_file,
           "vectors": tmp_path / "keep_vectors.npy", "dir": tmp_path, "engine": request.param}
    if request.param == "pgvector":
        s = open_store(url)
        for name in ("k_src", "k_plain", "k_kept", "k_other"):
            s.drop(name)
        s.close()


def _migrate(capsys, w, target, *args):
    return run_cli(capsys, "--data-dir", w["dir"] / "var", "migrate", "--store", w["url"], "--source", "k_src",
                   "--target", target, "--map", w["dir"] / "m.npz", "--batch-size", "30", "--quiet",
                   "--checkpoint", w["dir"] / f"{target}.json", *args)


def _vectors(w, target) -> np.ndarray:
    s = open_store(w["url"])
    try:
        return s.fetch(target, w["ids"]).vectors
    finally:
        s.close()


def _exists(w, target) -> bool:
    s = open_store(w["url"])
    try:
        return s.exists(target)
    finally:
        s.close()


def test_kept_rows_hold_their_own_vectors_and_the_others_are_as_without_them(capsys, world):
    w = world
    code, _, err = _migrate(capsys, w, "k_plain")
    assert code == 0, err
    code, out, _ = _migrate(capsys, w, "k_plain", "--status", "--json")
    assert code == 0 and json.loads(out)["keep_rows"] == 0 and json.loads(out)["keep_digest"] is None, out
    code, out, _ = _migrate(capsys, w, "k_plain", "--status")
    assert code == 0 and "finished" in out and "keep" not in out, out
    code, out, err = _migrate(capsys, w, "k_kept", "--keep-ids", w["ids_file"], "--keep-vectors", w["vectors"],
                              "--json")
    assert code == 0, err
    rep = json.loads(out.strip().splitlines()[-1])
    assert rep["kept"] == len(KEEP) and rep["keep_not_found"] == 1 and rep["rows"] == N
    plain, kept = _vectors(w, "k_plain"), _vectors(w, "k_kept")
    native = np.isin(np.arange(N), KEEP)
    np.testing.assert_allclose(kept[KEEP], w["Y"][:len(KEEP)], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(kept[~native], plain[~native])
    assert not np.allclose(plain[KEEP], w["Y"][:len(KEEP)], atol=1e-2)  # the map alone did not give them
    code, out, err = _migrate(capsys, w, "k_kept", "--keep-ids", w["ids_file"], "--keep-vectors", w["vectors"])
    assert code == 0, err  # already finished: the text line says what the run kept
    assert f"{len(KEEP)} re-embedded rows kept as given (1 of the keep ids not in k_src)" in out


def test_a_resume_with_the_same_keep_files_gives_the_uninterrupted_target_and_other_files_are_refused(capsys, world):
    w = world
    code, _, err = _migrate(capsys, w, "k_kept", "--keep-ids", w["ids_file"], "--keep-vectors", w["vectors"])
    assert code == 0, err
    whole = _vectors(w, "k_kept")
    ids_arr = np.array(w["keep_ids"], dtype=object)
    s, calls = open_store(w["url"]), {"n": 0}

    def stop():
        calls["n"] += 1
        return calls["n"] == 3  # after 90 rows: kept rows 0, 3, 31, 64, 77 written; 150, 199 not yet

    try:
        with pytest.raises(MigrationInterrupted):
            migrate(s, "k_src", "k_other", w["dir"] / "m.npz", batch_size=30, should_stop=stop,
                    checkpoint=FileCheckpoint(w["dir"] / "k_other.json"), keep_ids=ids_arr.tolist(),
                    keep_vectors=w["Y"])
        assert s.count("k_other") == 90
    finally:
        s.close()
    # --status said nothing of the keep set: a person resuming learnt of it only from the refusal below
    code, out, err = _migrate(capsys, w, "k_other", "--status", "--json")
    st = json.loads(out)
    assert code == 0 and st["keep_rows"] == len(KEEP) + 1 and 0 < st["kept"] < len(KEEP), st  # Qdrant: UUID order
    code, out, err = _migrate(capsys, w, "k_other", "--status")
    assert code == 0 and (f"; keeping 8 re-embedded rows as given (keep set digest {st['keep_digest']}, {st['kept']} "
                          "written so far): resume with the same --keep-ids/--keep-vectors") in out, out
    other = w["dir"] / "other.npy"
    np.save(other, w["Y"][::-1].copy())  # the same ids with each other's vectors: another keep set
    code, _, err = _migrate(capsys, w, "k_other", "--keep-ids", w["ids_file"], "--keep-vectors", other)
    assert code == 2 and "checkpoint was written keeping 8 re-embedded rows" in err, err
    assert f"(digest {st['keep_digest']})" in err  # the status names the digest the refusal names
    assert "--keep-ids / --keep-vectors" in err
    code, _, err = _migrate(capsys, w, "k_other")  # and without any
    assert code == 2 and "this run keeps none" in err, err
    code, out, err = _migrate(capsys, w, "k_other", "--keep-ids", w["ids_file"], "--keep-vectors", w["vectors"],
                              "--json")
    assert code == 0, err
    rep = json.loads(out.strip().splitlines()[-1])
    assert rep["resumed_from"] is not None and rep["rows_this_run"] == N - 90
    assert rep["kept"] == len(KEEP) and rep["keep_not_found"] == 1  # over both runs
    np.testing.assert_array_equal(_vectors(w, "k_other"), whole)


def test_ids_one_per_line_are_read_as_the_collection_keys_them(capsys, world):
    w = world
    lines = w["dir"] / "keep_ids.txt"
    lines.write_text("\n".join(str(i) for i in w["keep_ids"]) + "\n")
    code, out, err = _migrate(capsys, w, "k_kept", "--keep-ids", lines, "--keep-vectors", w["vectors"], "--json")
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["kept"] == len(KEEP)
    np.testing.assert_allclose(_vectors(w, "k_kept")[KEEP], w["Y"][:len(KEEP)], rtol=0, atol=1e-6)


@pytest.mark.parametrize("case, match", [
    ("ids only", "needs both their ids"),
    ("vectors only", "needs both their ids"),
    ("count", "hold 7 rows but the keep ids list 8"),
    ("width", "24-d rows; the map's target .* is 16-d"),
    ("nan", "1 row\\(s\\) (contain|with) NaN or Inf"),
    ("duplicate", "list 1 id\\(s\\) more than once"),
    ("dry run", "hold 7 rows but the keep ids list 8"),
    ("zero", "1 all-zero row\\(s\\)"),  # was refused a batch later, mid-run, the target half written
])
def test_bad_keep_input_exits_2_with_a_message_and_creates_nothing(capsys, world, case, match):
    w = world
    d, Y = w["dir"], w["Y"]
    ids_file, vectors = w["ids_file"], w["vectors"]
    if case in ("count", "dry run"):
        np.save(d / "bad.npy", Y[:-1])
        vectors = d / "bad.npy"
    elif case == "width":
        np.save(d / "bad.npy", np.ones((len(Y), 24), np.float32))
        vectors = d / "bad.npy"
    elif case == "nan":
        bad = Y.copy()
        bad[2, 5] = np.nan
        np.save(d / "bad.npy", bad)
        vectors = d / "bad.npy"
    elif case == "zero":
        bad = Y.copy()
        bad[6] = 0.0  # the last kept row of the source: its batch comes after others are written
        np.save(d / "bad.npy", bad)
        vectors = d / "bad.npy"
    elif case == "duplicate":
        dup = list(w["keep_ids"])
        dup[1] = dup[4]
        ids_file = d / "dup.json"
        ids_file.write_text(json.dumps(dup))
    args = {"ids only": ["--keep-ids", ids_file], "vectors only": ["--keep-vectors", vectors]}.get(
        case, ["--keep-ids", ids_file, "--keep-vectors", vectors])
    code, _, err = _migrate(capsys, w, "k_kept", *args, *(["--dry-run"] if case == "dry run" else []))
    assert code == 2 and err.startswith("vecbridge: error:"), err
    assert re.search(match, err), err
    assert not _exists(w, "k_kept") and not (d / "k_kept.json").exists()


def test_a_dry_run_says_how_many_rows_it_would_keep(capsys, world):
    w = world
    code, out, err = _migrate(capsys, w, "k_kept", "--keep-ids", w["ids_file"], "--keep-vectors", w["vectors"],
                              "--dry-run")
    assert code == 0, err
    assert "keeping the own vectors of 8 re-embedded rows" in out
    assert not _exists(w, "k_kept")


def test_python_m_service_vectordb_takes_the_same_keep_files(capsys, world):
    from service.vectordb.__main__ import main

    w = world
    capsys.readouterr()
    code = main(["migrate", "--store", w["url"], "--source", "k_src", "--target", "k_kept", "--map",
                 str(w["dir"] / "m.npz"), "--checkpoint", str(w["dir"] / "pm.json"), "--batch-size", "50",
                 "--keep-ids", str(w["ids_file"]), "--keep-vectors", str(w["vectors"])])
    out, err = capsys.readouterr()
    assert code == 0, err
    rep = json.loads(out.strip().splitlines()[-1])["report"]
    assert rep["kept"] == len(KEEP) and rep["keep_not_found"] == 1
    np.testing.assert_allclose(_vectors(w, "k_kept")[KEEP], w["Y"][:len(KEEP)], rtol=0, atol=1e-6)
    code = main(["migrate", "--store", w["url"], "--source", "k_src", "--target", "k_other", "--map",
                 str(w["dir"] / "m.npz"), "--checkpoint", str(w["dir"] / "po.json"), "--keep-ids", str(w["ids_file"])])
    assert code == 2 and "needs both their ids" in capsys.readouterr().err
    assert not _exists(w, "k_other")


# --- verify --source after a migration that kept its rows: --keep-ids / --keep-vectors ---------------------------
def _verify(capsys, w, target, *args):
    return run_cli(capsys, "--data-dir", w["dir"] / "var", "verify", "--store", w["url"], "--collection", target,
                   "--source", "k_src", "--map", w["dir"] / "m.npz", *args)


def test_verify_passes_a_kept_migration_given_its_keep_files_and_fails_it_without_them_saying_why(capsys, world):
    """verify --source compared every row with map(source row), so the K rows a migration kept were K wrong vectors:
    FAIL (exit 1) on the documented workflow. With the same keep files they are checked against their given
    vectors; without them the FAIL says what those rows may be."""
    w = world
    code, _, err = _migrate(capsys, w, "k_kept", "--keep-ids", w["ids_file"], "--keep-vectors", w["vectors"])
    assert code == 0, err
    code, out, err = _verify(capsys, w, "k_kept", "--keep-ids", w["ids_file"], "--keep-vectors", w["vectors"],
                             "--json")
    assert code == 0, err
    rep = json.loads(out)
    assert rep["verdict"] == "PASS" and rep["rows_ok"] and rep["wrong_vectors"] == 0, rep
    assert rep["kept_checked"] == len(KEEP) and rep["kept_wrong"] == 0 and rep["keep_not_found"] == 1
    assert rep["max_rel_error"] < 1e-5
    code, out, err = _verify(capsys, w, "k_kept", "--keep-ids", w["ids_file"], "--keep-vectors", w["vectors"])
    assert code == 0, err
    assert (f"{len(KEEP)} kept rows checked against their given vectors (0 wrong; 1 of the keep ids not in k_src)"
            in out and out.rstrip().endswith("PASS")), out
    code, out, err = _verify(capsys, w, "k_kept", "--json")  # without the keep files: those rows are not map(x)
    assert code == 1, err
    rep = json.loads(out)
    assert rep["verdict"] == "FAIL" and rep["wrong_vectors"] == len(KEEP) and "kept_checked" not in rep
    assert sorted(rep["wrong_ids"], key=str) == sorted((w["ids"][i] for i in KEEP), key=str)
    assert any(f"{len(KEEP)} wrong vector(s): may be re-embedded rows the migration kept (migrate --keep-ids)" in f
               and "--keep-ids/--keep-vectors" in f for f in rep["fails"]), rep["fails"]  # its --checkpoint: unknown
    # a migration into its default checkpoint: the FAIL says how many rows that one kept, or nothing when none
    code, _, err = run_cli(capsys, "--data-dir", w["dir"] / "var", "migrate", "--store", w["url"], "--source", "k_src",
                           "--target", "k_other", "--map", w["dir"] / "m.npz", "--quiet", "--keep-ids", w["ids_file"],
                           "--keep-vectors", w["vectors"])
    assert code == 0, err
    code, out, err = _verify(capsys, w, "k_other")
    assert code == 1 and (f"{len(KEEP)} wrong vector(s): its checkpoint records a keep set of {len(KEEP) + 1} "
                          "re-embedded rows (migrate --keep-ids)" in out), out
    code, _, err = run_cli(capsys, "--data-dir", w["dir"] / "var", "migrate", "--store", w["url"], "--source", "k_src",
                           "--target", "k_plain", "--map", w["dir"] / "m.npz", "--quiet")
    assert code == 0, err
    v6 = _vectors(w, "k_plain")[6:7]
    s = open_store(w["url"])
    try:
        s.upsert("k_plain", [w["ids"][5]], v6, ["text 5"])  # row 5 holds row 6's vector
    finally:
        s.close()
    code, out, err = _verify(capsys, w, "k_plain")
    assert code == 1 and "wrong vector(s)" not in out and out.rstrip().endswith("FAIL: rows differ from the source's")


def test_verify_with_keep_files_fails_a_kept_row_that_holds_another_vector(capsys, world):
    """A kept row is right only when it holds its given vector: one altered after the migration is a wrong vector
    (and a kept one), and a target migrated without the keep set fails every kept row."""
    w = world
    code, _, err = _migrate(capsys, w, "k_kept", "--keep-ids", w["ids_file"], "--keep-vectors", w["vectors"])
    assert code == 0, err
    victim = w["ids"][KEEP[2]]
    s = open_store(w["url"])
    try:
        row = s.fetch("k_kept", [victim], with_fields=True)
        v = row.vectors.copy()
        v[0, :3] += 0.05  # a small change: relative error ~0.05, far past the 1e-3 tolerance
        s.upsert("k_kept", row.ids, v, row.texts, row.fields)
    finally:
        s.close()
    keep = ["--keep-ids", w["ids_file"], "--keep-vectors", w["vectors"]]
    code, out, err = _verify(capsys, w, "k_kept", *keep, "--json")
    assert code == 1, err
    rep = json.loads(out)
    assert rep["verdict"] == "FAIL" and rep["wrong_vectors"] == 1 and rep["kept_wrong"] == 1, rep
    assert rep["wrong_ids"] == [victim] and rep["kept_checked"] == len(KEEP)
    assert not any("may be re-embedded rows" in f for f in rep["fails"]), rep["fails"]
    code, _, err = _migrate(capsys, w, "k_plain")  # every row mapped: the kept rows do not hold their vectors
    assert code == 0, err
    code, out, err = _verify(capsys, w, "k_plain", *keep, "--json")
    assert code == 1, err
    rep = json.loads(out)
    assert rep["wrong_vectors"] == len(KEEP) and rep["kept_wrong"] == len(KEEP), rep


@pytest.mark.parametrize("case, match", [
    ("ids only", "needs both their ids"),
    ("count", "hold 7 rows but the keep ids list 8"),
    ("width", "24-d rows; the map's target .* is 16-d"),
    ("no source", "give them with --source and --map"),
    ("ids of another kind", "keys its rows by integers"),
])
def test_verify_refuses_bad_keep_input_with_exit_2_and_a_message(capsys, world, case, match):
    w = world
    if case == "ids of another kind" and w["engine"] == "qdrant":
        pytest.skip("string ids: any string may name a row of a UUID-keyed collection (none found is no error)")
    code, _, err = _migrate(capsys, w, "k_kept", "--keep-ids", w["ids_file"], "--keep-vectors", w["vectors"])
    assert code == 0, err
    d, ids_file, vectors = w["dir"], w["ids_file"], w["vectors"]
    if case == "count":
        np.save(d / "bad.npy", w["Y"][:-1])
        vectors = d / "bad.npy"
    elif case == "width":
        np.save(d / "bad.npy", np.ones((len(w["Y"]), 24), np.float32))
        vectors = d / "bad.npy"
    elif case == "ids of another kind":  # pgvector's table keys rows by integers
        ids_file = d / "other.json"
        ids_file.write_text(json.dumps([f"row-{i}" for i in range(len(w["Y"]))]))
    args = ["--keep-ids", ids_file] if case == "ids only" else ["--keep-ids", ids_file, "--keep-vectors", vectors]
    if case == "no source":
        code, _, err = run_cli(capsys, "--data-dir", d / "var", "verify", "--store", w["url"], "--collection",
                               "k_kept", "--encoder", "minilm", *args)
    else:
        code, _, err = _verify(capsys, w, "k_kept", *args)
    assert code == 2 and err.startswith("vecbridge: error:"), err
    assert re.search(match, err), err


class _FirstWriteFails:
    """A real store whose first write into ``target`` raises as a lost connection does (the exit-75 path: the
    checkpoint is saved on the way out, the batch not recorded as done)."""

    def __init__(self, store, target: str):
        self._store, self._target, self.failed = store, target, False

    def __getattr__(self, name):
        return getattr(self._store, name)

    def upsert(self, name, *args, **kw):
        if name == self._target and not self.failed:
            self.failed = True
            raise ConnectionError("the database went away")
        return self._store.upsert(name, *args, **kw)


def test_a_failed_write_then_a_resume_counts_each_kept_row_once(world):
    """The kept rows of a batch were counted before its write: a failed write saved that count, and the resume,
    which writes the batch again, counted them again (kept 10 of 6, keep_not_found clamped to 0)."""
    w = world
    ck = FileCheckpoint(w["dir"] / "fail.json")
    s = open_store(w["url"])
    try:
        with pytest.raises(ConnectionError):
            migrate(_FirstWriteFails(s, "k_kept"), "k_src", "k_kept", w["m"], batch_size=30, checkpoint=ck,
                    keep_ids=w["keep_ids"], keep_vectors=w["Y"])
        rep = migrate(s, "k_src", "k_kept", w["m"], batch_size=30, checkpoint=ck, keep_ids=w["keep_ids"],
                      keep_vectors=w["Y"])
    finally:
        s.close()
    assert (rep.kept, rep.keep_not_found) == (len(KEEP), 1)
    np.testing.assert_allclose(_vectors(w, "k_kept")[KEEP], w["Y"][:len(KEEP)], rtol=0, atol=1e-6)
