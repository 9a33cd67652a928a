"""A collection that records no space (LangChain's, LlamaIndex's, one made by hand) through a map the wrong way round.

QA: a pgvector table of MiniLM rows with no vecbridge space comment migrated through ``e5-minilm`` (reversed):
"space unchecked", exit 0, ``verify`` PASS, and MiniLM queries found nothing (recall@10 0.0). The first rows are
now checked against the map's source frame (``Frame.mean_cosine``) and such a map is refused before the target or
the checkpoint exists. Real rows: the 1,000 WordNet definitions shipped in ``service/data/demo_wordnet.npz``
(MiniLM and e5 embeddings of the same texts); PostgreSQL + pgvector and Qdrant local mode
(``tests/_vectordb_servers.py``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _vectordb_servers import pg_url, small_migration  # noqa: F401  (module-scoped fixture)
from conftest import run_cli

import align
from align.kmeans import kmeans
from service.vectordb import (
    MigrationInterrupted,
    SpaceMismatchError,
    migrate,
    open_store,
)
from service.vectordb.checkpoint import FileCheckpoint

DEMO = Path(__file__).resolve().parents[3] / "service" / "data" / "demo_wordnet.npz"
NAMES = ("sr_src", "sr_dst", "sr_narrow")


@pytest.fixture(scope="module")
def wordnet():
    """``(MiniLM rows 0:500, map minilm -> e5, map e5 -> minilm)``, the maps fitted on rows 500:1000."""
    with np.load(DEMO, allow_pickle=False) as z:
        mi, e5 = z["minilm"].astype(np.float32), z["e5"].astype(np.float32)
    ok = align.fit_procrustes(mi[500:], e5[500:])
    ok.metadata.update(source_space="minilm", target_space="e5")
    rev = align.fit_procrustes(e5[500:], mi[500:])
    rev.metadata.update(source_space="e5", target_space="minilm")
    return mi[:500], ok, rev


@pytest.fixture(params=["pgvector", "qdrant"])
def store(request, tmp_path):
    pytest.importorskip("qdrant_client" if request.param == "qdrant" else "pgvector")
    s = open_store(request.getfixturevalue("pg_url") if request.param == "pgvector" else f"qdrant://{tmp_path}/q")
    for n in NAMES:
        s.drop(n)
    yield s
    for n in NAMES:
        s.drop(n)
    s.close()


def _source(store, X, name="sr_src"):
    store.create(name, X.shape[1])  # records no space, as a collection vecbridge did not make
    store.upsert(name, np.arange(len(X)), X, [f"t{i}" for i in range(len(X))])
    assert store.get_space(name) is None


def test_a_map_the_wrong_way_round_is_refused_before_anything_is_written(store, wordnet, tmp_path):
    X, ok, rev = wordnet
    _source(store, X)
    ck = tmp_path / "ck.json"
    for dry_run in (True, False):
        with pytest.raises(SpaceMismatchError, match=r"rows of 'sr_src' do not look like space 'e5' the map reads: "
                                                     r"their mean direction has cosine 0\.0\d.*source_space e5"):
            migrate(store, "sr_src", "sr_dst", rev, checkpoint=FileCheckpoint(ck), dry_run=dry_run)
    assert not store.exists("sr_dst") and not ck.exists()
    rep = migrate(store, "sr_src", "sr_dst", ok, checkpoint=FileCheckpoint(ck), batch_size=200)
    assert rep.rows == 500 and store.get_space("sr_dst") == "e5"
    assert rep.extra["space_check"].startswith("checked by rows: mean direction cosine 0.9"), rep.extra
    assert rep.extra["space_check"].endswith("with the map's source 'minilm'")


def test_a_source_of_one_topic_passes_with_the_right_map(store, wordnet):
    """One k-means cluster of five (~80-120 rows of one topic) leans away from the map's mean: 0.55-0.81 here,
    above the 0.5 that "checked" needs, while the reversed map scores at most 0.07 on each."""
    X, ok, rev = wordnet
    U = align.frames.unit_rows(X)
    C, _, _ = kmeans([U], 5, random_state=0, n_iter=15)
    labels = np.argmax(U @ C.T, axis=1)
    topics = [np.flatnonzero(labels == c) for c in range(5) if (labels == c).sum() >= 60]
    narrow = X[min(topics, key=lambda t: ok.source_frame.mean_cosine(X[t]))]  # the one furthest from the mean
    _source(store, narrow, "sr_narrow")
    rep = migrate(store, "sr_narrow", "sr_dst", ok, dry_run=True)
    assert rep.extra["space_check"].startswith("checked by rows: mean direction cosine 0."), rep.extra
    with pytest.raises(SpaceMismatchError):
        migrate(store, "sr_narrow", "sr_dst", rev, dry_run=True)


@pytest.fixture(scope="module")
def narrow_topic():
    """``(rows, map minilm -> e5, map e5 -> minilm)``: the MiniLM rows of the k-means cluster (of 100, over 20,000
    shared WordNet definitions) that the map's source frame recognises least (cosine 0.19, below the threshold: a
    LlamaIndex table of sequential ids whose first 1,000 rows are one or two documents), maps fitted on 8,000 others."""
    from conftest import WORDNET

    if not all((WORDNET / f"{n}.npy").exists() for n in ("minilm", "e5")):
        pytest.skip("the shared WordNet set (minilm, e5) is not here")
    mi, e5 = (np.load(WORDNET / f"{n}.npy", mmap_mode="r")[:28000].astype(np.float32) for n in ("minilm", "e5"))
    ok, rev = align.fit_procrustes(mi[20000:], e5[20000:]), align.fit_procrustes(e5[20000:], mi[20000:])
    ok.metadata.update(source_space="minilm", target_space="e5")
    rev.metadata.update(source_space="e5", target_space="minilm")
    U = align.frames.unit_rows(mi[:20000])
    C, _, _ = kmeans([U], 100, random_state=0, n_iter=15)
    labels = np.argmax(U @ C.T, axis=1)
    topics = [np.flatnonzero(labels == c) for c in range(100) if (labels == c).sum() >= 100]
    rows = mi[min(topics, key=lambda t: ok.source_frame.mean_cosine(mi[t]))]
    assert ok.source_frame.mean_cosine(rows) < align.frames.SAME_SPACE_MIN_COSINE  # what the old check refused
    return rows, ok, rev


def test_a_narrow_topic_with_the_right_map_is_migrated_with_a_warning_not_refused(store, narrow_topic, tmp_path):
    """The check refused it ("a map the wrong way round?") though the map was the right one: rows of one narrow
    topic score low against their own space's frame, as rows of another model do. The map's target frame does not
    recognise them either, so they pass, "unchecked by rows" in the report; the reversed map stays refused on the
    broad rows (the test above), and on these rows passes unchecked too (neither side recognises them)."""
    X, ok, rev = narrow_topic
    _source(store, X, "sr_narrow")
    rep = migrate(store, "sr_narrow", "sr_dst", ok, checkpoint=FileCheckpoint(tmp_path / "ck.json"))
    assert rep.rows == len(X) and store.get_space("sr_dst") == "e5"
    check = rep.extra["space_check"]
    assert check.startswith("unchecked by rows: mean direction cosine 0.1"), check
    assert "with the map's source 'minilm' and 0.0" in check and "source_space minilm declares" in check, check
    assert check.endswith("'sr_narrow' records no space and no source_space was given (the map reads 'minilm')")
    assert migrate(store, "sr_narrow", "sr_x", rev, dry_run=True).extra["space_check"].startswith("unchecked by rows")


def test_the_refusal_names_the_callers_way_to_declare_the_space(wordnet, tmp_path):
    """Over HTTP (POST /v1/migrations, whose job fails with the message) the field is source_space, not the CLI's
    --source-space; a narrow topic's report says so too."""
    pytest.importorskip("qdrant_client")
    X, _, rev = wordnet
    url = f"qdrant://{tmp_path}/q"
    with open_store(url) as s:
        _source(s, X)
    from service.ops.vectordb import run_migration

    rev.save(tmp_path / "rev.npz")
    with pytest.raises(SpaceMismatchError, match=r"cosine 0\.0\d with the map's training rows but 0\.9\d with those "
                                                 r"of its target side.*say so with source_space e5$"):
        run_migration(store_url=url, source="sr_src", target="sr_dst", map_ref=str(tmp_path / "rev.npz"),
                      checkpoint=tmp_path / "ck.json", space_option="source_space", dry_run=True)


def test_source_space_overrides_the_rows_and_a_resume_without_it_is_checked_again(store, wordnet, tmp_path):
    """--source-space is the user's word (checked against the map's, not the rows); a rerun that drops it is
    checked by rows again, and refused with the checkpoint as it was."""
    X, _, rev = wordnet
    _source(store, X)
    ck = FileCheckpoint(tmp_path / "ck.json")
    stop = iter([True])
    with pytest.raises(MigrationInterrupted):
        migrate(store, "sr_src", "sr_dst", rev, checkpoint=ck, batch_size=100, source_space="e5",
                should_stop=lambda: next(stop))
    before = ck.load()
    assert before["done"] == 100
    with pytest.raises(SpaceMismatchError, match="say so with source_space e5"):  # migrate()'s parameter
        migrate(store, "sr_src", "sr_dst", rev, checkpoint=ck, batch_size=100)
    assert ck.load()["done"] == 100 and store.count("sr_dst") == 100
    rep = migrate(store, "sr_src", "sr_dst", rev, checkpoint=ck, batch_size=100, source_space="e5")
    assert rep.rows == 500 and rep.extra["space_check"] == "checked against source_space: e5"


def test_the_cli_refuses_in_one_line_and_warns_when_rows_cannot_tell(wordnet, tmp_path, capsys):
    pytest.importorskip("qdrant_client")
    X, ok, rev = wordnet
    url = f"qdrant://{tmp_path}/q"
    with open_store(url) as s:
        _source(s, X)
        Xs, m = small_migration()  # isotropic rows and a map fitted on such: no common direction to compare
        _source(s, Xs, "sr_narrow")
    ok.save(tmp_path / "ok.npz"), rev.save(tmp_path / "rev.npz")
    args = ("--data-dir", tmp_path / "data", "migrate", "--store", url, "--quiet")
    rc, out, err = run_cli(capsys, *args, "--source", "sr_src", "--target", "sr_dst", "--map", tmp_path / "rev.npz")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--source-space e5" in err and not out, (out, err)
    rc, out, err = run_cli(capsys, *args, "--source", "sr_src", "--target", "sr_dst", "--map", tmp_path / "ok.npz")
    assert rc == 0 and "space checked by rows: mean direction cosine 0.9" in out and not err, (out, err)
    m.save(tmp_path / "m.npz")
    rc, out, err = run_cli(capsys, *args, "--source", "sr_narrow", "--target", "sr_iso", "--map", tmp_path / "m.npz")
    assert rc == 0 and err.startswith("vecbridge: warning: space unchecked: neither the collection nor the map"), err
    assert "share no common direction" in err


def test_verify_against_the_source_checks_its_rows_space_as_migrate_does(store, wordnet):
    """``verify --source`` compared the rows through any map of the right widths: a MiniLM source recording no space,
    migrated through the reversed map (the user said ``--source-space e5``), verified PASS through that map, where
    ``migrate`` refuses it. ``check_rows`` now checks the source's first rows with migrate's own check."""
    from service.vectordb import check_rows

    X, ok, rev = wordnet
    _source(store, X)
    migrate(store, "sr_src", "sr_dst", rev, batch_size=250, source_space="e5")  # the user's word: not checked by rows
    with pytest.raises(SpaceMismatchError, match=r"rows of 'sr_src' do not look like space 'e5' the map reads: "
                                                 r"their mean direction has cosine 0\.0\d.*--source-space e5$"):
        check_rows(store, "sr_src", "sr_dst", rev)
    out = check_rows(store, "sr_src", "sr_dst", rev, source_space="e5")  # said again: the user's word, as migrate
    assert out["rows_ok"] and out["space_check"] == "checked against --source-space: e5", out
    with pytest.raises(SpaceMismatchError, match="say so with source_space e5$"):
        check_rows(store, "sr_src", "sr_dst", rev, space_option="source_space")
    store.drop("sr_dst")
    migrate(store, "sr_src", "sr_dst", ok, batch_size=250)
    out = check_rows(store, "sr_src", "sr_dst", ok)
    assert out["rows_ok"] and out["space_check"].startswith("checked by rows: mean direction cosine 0.9"), out


def test_the_verify_command_refuses_a_reversed_map_in_one_line_and_warns_when_rows_cannot_tell(wordnet, tmp_path,
                                                                                                 capsys):
    pytest.importorskip("qdrant_client")
    X, _, rev = wordnet
    url = f"qdrant://{tmp_path}/q"
    with open_store(url) as s:
        _source(s, X)
        migrate(s, "sr_src", "sr_dst", rev, batch_size=250, source_space="e5")
        Xs, m = small_migration()  # isotropic rows and a map fitted on such: the rows cannot tell
        _source(s, Xs, "sr_narrow")
        migrate(s, "sr_narrow", "sr_iso", m, batch_size=100)
    rev.save(tmp_path / "rev.npz"), m.save(tmp_path / "m.npz")
    args = ("--data-dir", tmp_path / "data", "verify", "--store", url)
    rev_args = (*args, "--collection", "sr_dst", "--source", "sr_src", "--map", tmp_path / "rev.npz")
    rc, out, err = run_cli(capsys, *rev_args)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "a map the wrong way round?" in err, (out, err)
    assert err.strip().endswith("say so with --source-space e5") and not out, (out, err)
    rc, out, err = run_cli(capsys, *rev_args, "--source-space", "e5")
    assert rc == 0 and "PASS" in out and "space checked against --source-space: e5" in out and not err, (out, err)
    rc, out, err = run_cli(capsys, *args, "--collection", "sr_iso", "--source", "sr_narrow", "--map",
                           tmp_path / "m.npz")
    assert rc == 0 and "PASS" in out, (out, err)
    assert err.startswith("vecbridge: warning: space unchecked: neither the collection nor the map"), err
    rc, out, err = run_cli(capsys, *args, "--collection", "sr_dst", "--heldout-source", tmp_path / "rev.npz",
                           "--heldout-target", tmp_path / "rev.npz", "--map", tmp_path / "rev.npz",
                           "--source-space", "e5")
    assert rc == 2 and "--source-space declares the space of the source collection's rows" in err, err


@pytest.fixture(scope="module")
def related_model():
    """``(paraphrase-L3 rows, MiniLM rows, map minilm -> e5)``: 1,000 rows each of the shared WordNet set, none of
    them the map's 8,000 training rows (the MiniLM rows: a disjoint subset of the same model's)."""
    from conftest import WORDNET

    if not all((WORDNET / f"{n}.npy").exists() for n in ("minilm", "e5", "paraphrase_l3")):
        pytest.skip("the shared WordNet set (minilm, e5, paraphrase_l3) is not here")
    mi, e5, para = (np.load(WORDNET / f"{n}.npy", mmap_mode="r") for n in ("minilm", "e5", "paraphrase_l3"))
    ok = align.fit_procrustes(np.asarray(mi[:8000], np.float32), np.asarray(e5[:8000], np.float32))
    ok.metadata.update(source_space="minilm", target_space="e5")
    return np.asarray(para[30000:31000], np.float32), np.asarray(mi[20000:21000], np.float32), ok


def test_rows_of_a_related_model_are_not_reported_checked(store, related_model, tmp_path):
    """QA: a table of paraphrase-L3 rows (no recorded space) migrated through minilm-e5 with exit 0 and "space
    checked by rows: mean direction cosine 0.37 with the map's source 'minilm'"; e5 queries then found their own row
    17 % of the time (93 % with MiniLM rows). A related model's rows score 0.25-0.39 against MiniLM's mean, same-space
    rows 0.81 or more: such rows are "unchecked by rows: ... may be from another model"; MiniLM rows of another subset
    stay "checked"."""
    para, mi, ok = related_model
    _source(store, para, "sr_narrow")
    check = migrate(store, "sr_narrow", "sr_dst", ok, dry_run=True).extra["space_check"]
    assert check.startswith("unchecked by rows: the rows may be from another model: mean direction cosine 0.3"), check
    assert "rows of that space give ~0.9" in check and "source_space minilm declares" in check, check
    _source(store, mi)
    check = migrate(store, "sr_src", "sr_dst", ok, dry_run=True).extra["space_check"]
    assert check.startswith("checked by rows: mean direction cosine 0.9"), check
