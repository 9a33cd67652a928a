"""Upgrading in place: a data dir written by the previous release (a9b56d8), opened by this one.

``tests/fixtures/upgrade_a9b56d8`` holds a data dir that release wrote through its own HTTP service and CLI
(spaces, maps with versions, aliases, tags and a deleted version, a finished and a failed fit job, an embedding
steer with an alias, flat / HNSW / IVF indexes with payloads after adds, deletes and re-adds), the bundle it
exported, and what it answered (``expected.json``); ``make_fixture.py`` beside them made all three. Here the
current code serves a copy of that data dir on a real uvicorn server and must answer the same (artifacts bit for
bit; transforms, steers and search scores to float32 rounding, since BLAS and FAISS pick their kernels by the CPU
they run on, so the last bit of a product moves between machines; search ids and payloads, listings and the job
list exactly), then write on it
(index rows, a map version, aliases) and read its own writes back after a restart, leaving the index folders
in the current format with the old generations collected.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from _servers import serve_in_thread
from conftest import run_cli

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "upgrade_a9b56d8"
INDEXED = ("docs-flat", "docs-hnsw", "docs-ivf")


def _maker():
    spec = importlib.util.spec_from_file_location("make_fixture", FIXTURE / "make_fixture.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


MK = _maker()
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
QUERIES = dict(np.load(FIXTURE / "queries.npz"))


@pytest.fixture
def old_data(tmp_path) -> Path:
    """A copy of the data dir the previous release wrote (the fixture stays untouched)."""
    data = tmp_path / "data"
    shutil.copytree(FIXTURE / "data", data)
    return data


@contextmanager
def served(data: Path):
    """A :class:`service.client.Client` on the current service over ``data`` (real uvicorn, the fixture's key)."""
    from service.api import create_app
    from service.client import Client
    from service.config import Settings

    settings = Settings(data_dir=data, api_keys={MK.KEY: ["read", "write"]}, demo_on_empty=False,
                        log_level="WARNING")
    with serve_in_thread(create_app(settings)) as url, Client(url, api_key=MK.KEY, max_retries=0) as vb:
        yield vb


def _rows(b64: str, like: np.ndarray) -> np.ndarray:
    import base64

    return np.frombuffer(base64.b64decode(b64), "<f4").reshape(like.shape[0], -1)


# Float32 products of the fixture's small sizes (d <= 24) agree to a few units in the last place across CPUs;
# a wrong map, steer or index is off by orders of magnitude more.
RTOL, ATOL = 1e-5, 1e-6
ARRAYS = ("transforms", "steer_apply")  # answers held as base64 float32 arrays


def _same(got, want, where: str = "") -> None:
    """Assert ``got == want`` as JSON, floats within RTOL / ATOL (the path of the first difference in the message)."""
    if isinstance(want, dict):
        # a field this release adds to an answer (a search's `note` when some query got fewer than k hits) is new,
        # not a changed answer; every field the previous release gave must be there and the same
        assert isinstance(got, dict) and got.keys() - ({"note"} - want.keys()) == want.keys(), (where, got, want)
        for k in want:
            _same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (where, got, want)
        for i, (g, w) in enumerate(zip(got, want)):
            _same(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        assert isinstance(got, (int, float)) and abs(got - want) <= ATOL + RTOL * abs(want), (where, got, want)
    else:
        assert got == want and type(got) is type(want), (where, got, want)


def _close(got: np.ndarray, b64: str, what: str) -> None:
    """``got`` equals the float32 rows the old release answered (base64), to float32 rounding."""
    np.testing.assert_allclose(got, _rows(b64, got), rtol=RTOL, atol=ATOL, err_msg=what)


def _records(versions: list[dict]) -> list[dict]:
    """Version records as the old release answered them: without ``report_path``, and ``collected_at`` (new) only
    when set."""
    return [{k: v for k, v in r.items() if k != "report_path" and (k, v) != ("collected_at", None)} for r in versions]


def test_every_read_answers_what_the_previous_release_answered(old_data):
    with served(old_data) as vb:
        got = MK.answers(vb, QUERIES)
    # index records gained fields in this release (what the old one answered is kept, value for value)
    new = [r for r in [*got["indexes"], *got["index_info"].values()] if r]
    assert all(r.pop("generation") >= 1 and r.pop("logged_deltas") == 0 for r in new)
    # and map / steer summaries: the aliases left on a deleted version (none in the old data)
    assert all(r.pop("aliases_on_deleted") == [] for r in [*got["maps"], *got["steers"]])
    # and steer summaries: the flagged versions (none in the old data) and what a bare name applies (prod, else
    # the newest)
    assert all(r.pop("unreliable_versions") == [] for r in got["steers"])
    assert [r.pop("bare_version") for r in got["steers"]] == [r["aliases"].get("prod", r["latest_version"])
                                                              for r in got["steers"]]
    # and version records: when `registry gc` removed a deleted one's files (none has run: its deleted version is whole)
    assert all(v.pop("collected_at") is None for vs in got["versions"].values() for v in vs)
    # so did job records: the running stage's clock, none for a finished job
    assert all(j["progress"].pop("stage_elapsed_seconds") is None and j["progress"].pop("stage_eta_seconds") is None
               for j in got["jobs"])
    # and their place in the order jobs were made: the old rows numbered in their created_at order
    by_seq = sorted(got["jobs"], key=lambda j: j.pop("seq"))
    assert by_seq == sorted(got["jobs"], key=lambda j: j["timings"]["created_at"]) and len(by_seq) >= 2
    expected = {k: v for k, v in EXPECTED.items() if k != "written_by"}
    for key, value in expected.items():  # one key at a time: a failure names the part that changed
        if key in ARRAYS:
            assert got[key].keys() == value.keys(), key
            for ref, b64 in value.items():
                _close(_rows(got[key][ref], QUERIES["e524"]), b64, f"{key} {ref}")
        else:
            _same(got[key], value, key)
    assert {j["state"] for j in got["jobs"]} == {"succeeded", "failed"}
    assert [i["count"] for i in got["indexes"]] == [151, 151, 151, 0]


def test_writes_on_old_data_persist_and_leave_the_current_format(old_data):
    rng = np.random.default_rng(0)
    Q = QUERIES["e524"]
    with served(old_data) as vb:
        for name in INDEXED:
            vb.add(name, Q[:2], ids=[9000, 9001], payloads=[{"new": 1}, {"new": 2}])
            assert vb.delete_ids(name, [1020, 9001])["deleted"] == 2
            vb.add(name, Q[2:3], ids=[1020], payloads=[{"re": True}])
        vb.add("glove-empty", QUERIES["glove16"], ids=list(range(8)))
        vb.add("docs-flat", rng.standard_normal((1100, 24)).astype(np.float32))  # past the log: a snapshot
        space_of = {name: QUERIES[space] for name, (space, *_) in MK.INDEXES.items()}
        before = {name: vb.search(name, rows, k=5) for name, rows in space_of.items()}
        X = rng.standard_normal((300, 24)).astype(np.float32)
        R, _ = np.linalg.qr(rng.standard_normal((24, 24)))
        job = vb.fit("mini-e5", "mini24", "e524", X, (X @ R).astype(np.float32), method="procrustes")
        assert vb.wait(job["id"], timeout=300)["result"]["version"]["version"] == 4
        vb.set_alias("mini-e5", "canary", 4)
        vb.delete_alias("e5-glove", "stable")
        vb.set_steer_alias("formal", "prod", 2)
    with served(old_data) as vb:  # a new process: reads what the first one wrote
        for name, answer in before.items():
            assert vb.search(name, space_of[name], k=5)["results"] == answer["results"], name
        counts = {i["name"]: i["count"] for i in vb.list_indexes()}
        assert counts == {"docs-flat": 1252, "docs-hnsw": 152, "docs-ivf": 152, "glove-empty": 8}
        for name in INDEXED:
            hits = vb.search(name, Q[:3], k=3, exact=True)["results"]
            assert {"id": 9000, "payload": {"new": 1}} in [{"id": h["id"], "payload": h["payload"]} for h in hits[0]]
            assert 9001 not in {h["id"] for q in hits for h in q}
            assert {"id": 1020, "payload": {"re": True}} in [{"id": h["id"], "payload": h["payload"]} for h in hits[2]]
        maps = {m["name"]: m for m in vb.list_maps()}
        assert maps["mini-e5"]["aliases"] == {"canary": 4, "prod": 1} and maps["mini-e5"]["path_version"] == 1
        assert maps["e5-glove"]["aliases"] == {}
        assert [s["aliases"] for s in vb.list_steers()] == [{"prod": 2}]
        Y = vb.transform("mini-e5:1", QUERIES["mini24"])
        _close(Y, EXPECTED["transforms"]["mini-e5:1"], "mini-e5:1")
    for name in (*INDEXED, "glove-empty"):
        folder = old_data / "indexes" / name
        meta = json.loads((folder / "meta.json").read_text())
        assert meta["format_version"] == 3, name
        oldest = min(meta["recent_bases"])
        files = sorted(p.name for p in folder.iterdir() if p.name.count(".") == 2)
        assert all(int(f.split(".")[1]) >= oldest for f in files), (name, files)  # old generations collected
        assert f"index.{meta['base']}.faiss" in files and all(f"delta.{g}.npz" in files for g, _ in meta["log"])


def test_the_way_back_leaves_snapshots_the_previous_release_reads(old_data, capsys):
    """RELIABILITY.md's way back to a9b56d8 (``vecbridge index compact --all``): that release reads
    ``index.<generation>.faiss`` and ``payloads.<generation>.json`` of the generation ``meta.json`` names, so each
    newest generation must be a snapshot (after the current release logged changes to it, it was a delta the old
    one could not load)."""
    from service.indexes.space import SpaceIndex

    with served(old_data) as vb:
        for name in INDEXED:
            vb.add(name, QUERIES["e524"][:1], ids=[9000])
    assert all(json.loads((old_data / "indexes" / n / "meta.json").read_text())["log"] for n in INDEXED)
    code, _, err = run_cli(capsys, "--data-dir", old_data, "index", "compact", "--all")
    assert code == 0, err
    for name in MK.INDEXES:
        folder = old_data / "indexes" / name
        meta = json.loads((folder / "meta.json").read_text())
        g = meta["generation"]
        assert meta.get("log", []) == [] and (folder / f"index.{g}.faiss").exists()
        assert (folder / f"payloads.{g}.json").exists()
        assert SpaceIndex.load(folder).count == (152 if name in INDEXED else 0)


def test_the_cli_reads_old_data_and_the_old_bundle(old_data, tmp_path, capsys):
    code, _, err = run_cli(capsys, "--data-dir", old_data, "registry", "verify")
    assert code == 0, err
    np.save(tmp_path / "q.npy", QUERIES["mini24"])
    code, _, err = run_cli(capsys, "--data-dir", old_data, "transform", "--map", "mini-e5@prod", "--quiet",
                           tmp_path / "q.npy", tmp_path / "y.npy")
    assert code == 0, err
    Y = np.load(tmp_path / "y.npy")
    _close(Y, EXPECTED["transforms"]["mini-e5@prod"], "mini-e5@prod")

    fresh = tmp_path / "fresh"
    code, _, err = run_cli(capsys, "--data-dir", fresh, "registry", "import", FIXTURE / "bundle.zip")
    assert code == 0, err
    with served(fresh) as vb:
        for ref in ("mini-e5:1", "mini-e5@canary", "e5-glove:1"):
            got = vb.transform(ref, QUERIES[vb.get_map(ref)["source_space"]])
            _close(got, EXPECTED["transforms"][ref], ref)
        for name, versions in EXPECTED["versions"].items():  # an import files the reports under new names
            assert _records(vb.list_versions(name)) == _records(versions), name
