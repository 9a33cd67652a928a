"""Strict, all-or-nothing bundle import (issue 15, finding 5; steers in bundles: issue 13, item 6).

A bundle is checked as if it had come over HTTP: each tampered bundle below must be refused
with a typed registry error naming what is wrong, and leave the importing registry exactly as it
was (snapshot before == after) — including when the bad part comes after good ones.
"""

from __future__ import annotations

import json
import shutil
import tracemalloc
import zipfile

import numpy as np
import pytest

import align
from service.cli import main
from service.registry import open_registry
from service.registry.errors import (
    ConflictError,
    IntegrityError,
    InvalidNameError,
    RegistryError,
)
from service.registry.store import sha256_bytes

from .helpers import snapshot


def _steer_snapshot(reg) -> list:
    return [(s["name"], [v.to_dict() for v in reg.list_steer_versions(s["name"])]) for s in reg.list_steers()]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A registry with two maps (aliases, a tag) and a rank-2 steer plus a mean-shift, exported as a folder."""
    d = tmp_path_factory.mktemp("bundle")
    reg = open_registry(f"sqlite:///{d / 'src.sqlite'}", d / "src-art")
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 8)).astype(np.float32)
    Q = np.linalg.qr(rng.standard_normal((8, 8)))[0]
    reg.register_version("a->b", align.fit_procrustes(X, X @ Q), source_space="a", target_space="b",
                         method="procrustes", params={}, alias="prod", tags={"k": "v"})
    reg.register_version("b->a", align.fit_procrustes(X @ Q, X), source_space="b", target_space="a",
                         method="procrustes", params={})
    labels = np.where(X[:, 0] > 0, 1, -1)
    steer = align.fit_steer(X, labels, rank=2, random_state=0)
    reg.register_steer("pos", steer, space="a", alias="prod", lens=steer.lens(X, [f"r{i}" for i in range(60)], k=3))
    reg.register_steer("pos", align.MeanShift(X[labels > 0].mean(0) - X[labels < 0].mean(0)), space="a")
    folder = reg.export(d / "good")
    reg.close()
    return d, folder


@pytest.fixture
def target(tmp_path):
    reg = open_registry(f"sqlite:///{tmp_path / 'dst.sqlite'}", tmp_path / "dst-art")
    reg.register_space("other", 4)
    yield reg
    reg.close()


def _copy(source, tmp_path, name="b"):
    dst = tmp_path / name
    shutil.copytree(source[1], dst)
    return dst


def _edit(folder, fn):
    p = folder / "manifest.json"
    m = json.loads(p.read_text())
    fn(m)
    p.write_text(json.dumps(m))
    return folder


def _refused(reg, bundle, exc=RegistryError, match=None):
    before, steers = snapshot(reg), _steer_snapshot(reg)
    with pytest.raises(exc, match=match):
        reg.import_(bundle)
    assert snapshot(reg) == before and _steer_snapshot(reg) == steers, "a refused import changed the registry"


def test_round_trip_carries_maps_and_steers(source, target):
    counts = target.import_(source[1])
    assert counts == {"imported": 2, "skipped": 0, "renumbered": 0, "aliases": 1, "steers": 2, "steer_aliases": 1}
    src = open_registry(f"sqlite:///{source[0] / 'src.sqlite'}", source[0] / "src-art")
    q = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)
    np.testing.assert_array_equal(target.load_steer("pos@prod").apply(q, 1.0), src.load_steer("pos@prod").apply(q, 1.0))
    np.testing.assert_array_equal(target.load_steer("pos:2").apply(q, 1.0), src.load_steer("pos:2").apply(q, 1.0))
    np.testing.assert_array_equal(target.load_map("a->b@prod").apply(q), src.load_map("a->b@prod").apply(q))
    assert target.get_steer("pos", 1).lens == src.get_steer("pos", 1).lens and len(target.get_steer("pos", 1).lens) == 1
    assert target.import_(source[1])["skipped"] == 2  # idempotent
    # creation times travel too (the names' and spaces' were the import's own time)
    assert [(m["name"], m["created_at"]) for m in target.list_maps()] == [
        (m["name"], m["created_at"]) for m in src.list_maps()]
    assert [(m["name"], m["created_at"]) for m in target.list_steers()] == [
        (m["name"], m["created_at"]) for m in src.list_steers()]
    assert {s.name: s.created_at for s in src.list_spaces()}.items() <= {
        s.name: s.created_at for s in target.list_spaces()}.items()
    src.close()


BAD_MANIFESTS = [
    ("space-dotdot", lambda m: m["spaces"][0].update(name="../x"), InvalidNameError),
    ("space-nul", lambda m: m["spaces"][0].update(name="a\x00b"), InvalidNameError),
    ("space-negative-dim", lambda m: m["spaces"][0].update(dim=-5), IntegrityError),
    ("space-dim-2^70", lambda m: m["spaces"][0].update(dim=2**70), IntegrityError),
    ("version-20M", lambda m: m["maps"][0]["versions"][0].update(version=20_000_000), IntegrityError),
    ("version-string", lambda m: m["maps"][0]["versions"][0].update(version="1"), IntegrityError),
    ("map-name-slash", lambda m: m["maps"][1].update(name="x/../y"), InvalidNameError),
    ("version-dim-lies", lambda m: m["maps"][1]["versions"][0].update(source_dim=9), IntegrityError),
    ("entry-leaves-bundle", lambda m: m["maps"][1]["versions"][0].update(bundle_artifact="../../etc/passwd"),
     InvalidNameError),
    ("alias-to-missing-version", lambda m: m["maps"][0].update(aliases={"prod": 7}), IntegrityError),
    ("steer-rank-above-dim", lambda m: m["steers"][0]["versions"][0].update(rank=99), IntegrityError),
    # imported fine before, then every lens read of the steer was a 500 (TypeError in describe_lens)
    ("steer-lens-not-objects", lambda m: m["steers"][0]["versions"][0].update(lens=[1]), IntegrityError),
    ("steer-lens-end-not-list", lambda m: m["steers"][0]["versions"][0].update(lens=[{"positive": 5}]),
     IntegrityError),
    # imported fine, then `steer lens` of the steer was an internal error (KeyError 'direction' / 'index')
    ("steer-lens-direction-without-keys", lambda m: m["steers"][0]["versions"][0].update(lens=[{"positive": [{}]}]),
     IntegrityError),
    ("steer-lens-item-without-index", lambda m: m["steers"][0]["versions"][0]["lens"][0]["positive"][0].pop("index"),
     IntegrityError),
    ("steer-lens-text-not-string", lambda m: m["steers"][0]["versions"][0]["lens"][0]["negative"][0].update(text=5),
     IntegrityError),
    ("steer-lens-sigma-string", lambda m: m["steers"][0]["versions"][0]["lens"][0].update(sigma="1"), IntegrityError),
    ("description-5MB", lambda m: m["maps"][1]["versions"][0].update(description="x" * 5_000_000), IntegrityError),
    ("nan-metric", lambda m: m["maps"][1]["versions"][0].update(metrics={"x": float("nan")}), IntegrityError),
    ("not-a-bundle", lambda m: m.update(format="zip"), IntegrityError),
    # bool("false") is True: imported as deleted; a version number past a gap: `registry verify` failed ever after
    ("deleted-as-string", lambda m: m["maps"][1]["versions"][0].update(deleted="false"), IntegrityError),
    ("version-gap", lambda m: m["maps"][1]["versions"][-1].update(version=5), IntegrityError),
    # what HTTP refuses in a body: imported fine, then listings, searches and reads of the version failed (item below)
    ("metric-10^400", lambda m: m["maps"][0]["versions"][0]["metrics"].update(heldout_top1=10**400), IntegrityError),
    ("params-2^70", lambda m: m["maps"][0]["versions"][0].update(params={"x": 2**70}), IntegrityError),
    ("params-nested-500", lambda m: m["maps"][0]["versions"][0].update(params={"x": json.loads("[" * 500 + "]" * 500)}),
     IntegrityError),
    ("inputs-nested-32", lambda m: m["maps"][0]["versions"][0].update(inputs={"x": json.loads("[" * 31 + "]" * 31)}),
     IntegrityError),
    ("data-hashes-negative-2^64", lambda m: m["maps"][1]["versions"][0].update(data_hashes={"x": [-(2**64)]}),
     IntegrityError),
    ("steer-lens-index-2^64", lambda m: m["steers"][0]["versions"][0]["lens"][0]["positive"][0].update(index=2**64),
     IntegrityError),
]


@pytest.mark.parametrize("case,edit,exc", BAD_MANIFESTS, ids=[c[0] for c in BAD_MANIFESTS])
def test_bad_manifest_is_refused_and_changes_nothing(source, target, tmp_path, case, edit, exc):
    _refused(target, _edit(_copy(source, tmp_path), edit), exc)


def test_garbage_artifact_with_matching_sha_is_refused_at_import(source, target, tmp_path):
    b = _copy(source, tmp_path)
    garbage = b"PK\x03\x04 not a map at all" * 10

    def edit(m):
        v = m["maps"][1]["versions"][0]
        (b / v["bundle_artifact"]).write_bytes(garbage)
        v["artifact_sha256"] = sha256_bytes(garbage)

    _refused(target, _edit(b, edit), IntegrityError, "cannot be read")


def test_second_map_with_bad_sha_imports_nothing(source, target, tmp_path):
    b = _edit(_copy(source, tmp_path), lambda m: m["maps"][1]["versions"][0].update(artifact_sha256="0" * 64))
    _refused(target, b, IntegrityError, "sha256")
    assert not target.list_maps()


def test_symlink_in_a_folder_bundle_is_refused(source, target, tmp_path):
    b = _copy(source, tmp_path)
    secret = tmp_path / "secret.safetensors"
    rel = json.loads((b / "manifest.json").read_text())["maps"][1]["versions"][0]["bundle_artifact"]
    shutil.copy(b / rel, secret)  # same bytes: only the link itself is wrong
    (b / rel).unlink()
    (b / rel).symlink_to(secret)
    _refused(target, b, IntegrityError, "symbolic link")


def test_zip_expansion_is_bounded(source, target, tmp_path):
    """A 256 MB entry of zeros compresses to ~250 kB; the manifest's dims allow ~1 MB: refused before decoding."""
    z = tmp_path / "bomb.zip"
    m = json.loads((source[1] / "manifest.json").read_text())
    rel = m["maps"][1]["versions"][0]["bundle_artifact"]
    with zipfile.ZipFile(z, "w", zipfile.ZIP_DEFLATED) as zf:
        for p in sorted(source[1].rglob("*")):
            r = p.relative_to(source[1]).as_posix()
            if p.is_file() and r != rel:
                zf.write(p, r)
        with zf.open(rel, "w", force_zip64=True) as fh:
            block = bytes(1 << 20)
            for _ in range(256):
                fh.write(block)
    assert z.stat().st_size < 5_000_000
    tracemalloc.start()
    try:
        _refused(target, z, IntegrityError, "expands to")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024 * 1024, f"import allocated {peak / 2**20:.0f} MiB for a refused bomb"


def test_verify_does_not_build_the_range_of_versions(target):
    """A version number of 20,000,000 in the database (imported by an older vecbridge): verify reports a gap."""
    target.register_version("a->b", align.fit_procrustes(np.eye(8, dtype=np.float32) + 1, np.eye(8, dtype=np.float32)),
                            source_space="a", target_space="b", method="procrustes", params={})
    target._write(lambda t: (t.q("UPDATE versions SET version = 20000000 WHERE name = 'a->b'"),
                             t.q("UPDATE maps SET last_version = 20000000 WHERE name = 'a->b'")))
    tracemalloc.start()
    try:
        rep = target.verify()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rep["version_gaps"] == ["a->b"] and not rep["ok"]
    assert peak < 32 * 1024 * 1024, f"verify allocated {peak / 2**20:.0f} MiB"


def test_cli_import_of_a_bad_bundle_exits_2_with_one_line(source, tmp_path, capsys):
    b = _edit(_copy(source, tmp_path), lambda m: m["spaces"][0].update(dim=-5))
    rc = main(["--data-dir", str(tmp_path / "var"), "registry", "import", str(b)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "dim" in err[0], err


def test_cli_import_conflict_names_the_cli_flag(source, tmp_path, capsys):
    """A colliding import told CLI users to "use on_conflict='renumber'", a Python argument: the command's flag is
    --renumber (which then imports it)."""
    var = tmp_path / "var"
    reg = open_registry(f"sqlite:///{var / 'registry.sqlite'}", var / "artifacts")
    reg.register_steer("pos", align.MeanShift(np.ones(8)), space="a")
    reg.close()
    assert main(["--data-dir", str(var), "registry", "import", str(source[1])]) == 2
    err = capsys.readouterr().err
    assert "steer pos:1 exists here" in err and "registry import --renumber" in err, err
    assert main(["--data-dir", str(var), "registry", "import", "--renumber", str(source[1])]) == 0


def _reported(d, name: str, maps: dict):
    """A registry in ``d`` with maps ``{name: (X, Y)}``, each with a fit report file; exported to ``d/name``."""
    reg = open_registry(f"sqlite:///{d / 'r.sqlite'}", d / "art")
    for m, (X, Y) in maps.items():
        (reg.report_dir / m).mkdir(parents=True, exist_ok=True)
        (reg.report_dir / m / "r.html").write_text(f"<html>report of {m}</html>")
        reg.register_version(m, align.fit_procrustes(X, Y), source_space="a", target_space="b", method="procrustes",
                             params={}, report_path=f"{m}/r.html")
    out = reg.export(d / name)
    reg.close()
    return out


def test_a_failed_import_never_removes_a_report_another_import_committed(tmp_path, monkeypatch):
    """Bundles X and Y share m1:1 (same artifact and report); X also holds an m2:1 that conflicts here. X wrote the
    report file first, Y found it there and committed m1:1 pointing at it, then X failed and removed 'its' file:
    m1:1's report was gone and verify said ok. Reports are now written per import, inside its transaction; and a
    version an import skips gets no report file."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((40, 8)).astype(np.float32)
    Q = np.linalg.qr(rng.standard_normal((8, 8)))[0]
    bx = _reported(tmp_path / "x", "bx", {"m1": (X, X @ Q), "m2": (X, X @ Q.T)})
    by = _reported(tmp_path / "y", "by", {"m1": (X, X @ Q)})
    reg = open_registry(f"sqlite:///{tmp_path / 'dst.sqlite'}", tmp_path / "dst-art")
    reg.register_version("m2", align.fit_procrustes(X, X @ Q), source_space="a", target_space="b",
                         method="procrustes", params={})  # another artifact: X's m2:1 conflicts with it
    other = open_registry(f"sqlite:///{tmp_path / 'dst.sqlite'}", tmp_path / "dst-art")
    real_write = type(reg)._write

    def y_commits_first(self, fn, *a, **kw):  # Y imports through another handle while X is between its steps
        if self is reg and not getattr(self, "_y_done", False):
            self._y_done = True
            other.import_(by)
        return real_write(self, fn, *a, **kw)

    monkeypatch.setattr(type(reg), "_write", y_commits_first)
    with pytest.raises(RegistryError, match="m2:1 exists here"):
        reg.import_(bx)
    monkeypatch.setattr(type(reg), "_write", real_write)
    v = reg.get_version("m1", 1)
    assert v.report_path and reg.report_file(v).read_text() == "<html>report of m1</html>"
    assert reg.import_(by) == {"imported": 0, "skipped": 1, "renumbered": 0, "aliases": 0}  # skipped: no new file
    assert sorted(p.name for p in (reg.report_dir / "m1").iterdir()) == [reg.report_file(v).name]
    assert not (reg.report_dir / "m2").exists() or not any((reg.report_dir / "m2").iterdir())
    other.close()
    reg.close()


def test_a_failed_import_removes_the_artifacts_it_stored_and_no_other(source, target):
    """A bundle whose space conflicts here (its space a is 8-d, here 4-d) was refused (exit 2) but left each artifact
    it had stored before its transaction failed: orphans no row names. It removes those now; an artifact that was
    there before stays, and while another writer is between storing an artifact and committing (the store's pin
    held) a failed import removes nothing, since that artifact could be the other writer's."""
    folder = source[1]
    v = json.loads((folder / "manifest.json").read_text())["maps"][0]["versions"][0]
    data = (folder / v["bundle_artifact"]).read_bytes()
    there = target.store.put(data, "npz" if data[:2] == b"PK" else "safetensors")[1]
    target.register_space("a", 4)
    before = target.store.all_relpaths()
    _refused(target, folder, ConflictError, match="4-d")
    assert target.store.all_relpaths() == before and there in before
    assert target.verify()["orphan_artifacts"] == [there]
    with target.store.pinned():  # another writer's artifact may be among this import's: nothing is removed
        _refused(target, folder, ConflictError, match="4-d")
    assert len(target.store.all_relpaths() - before) == 3  # the bundle's other artifacts (2 maps, 2 steers)


def test_zip_bundles_named_twice_or_written_over_are_refused(source, target, tmp_path):
    """A zip with two manifest.json entries imported silently (the hidden last one won); `export b.zip` replaced an
    existing file where a folder export refuses a non-empty folder; `export b.ZIP` wrote a folder named b.ZIP."""
    d, folder = source
    before = snapshot(target)
    dup = tmp_path / "dup.zip"
    with zipfile.ZipFile(dup, "w") as z:
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                z.write(p, p.relative_to(folder).as_posix())
        with pytest.warns(UserWarning, match="Duplicate name"):
            z.writestr("manifest.json", json.dumps({"format": "vecbridge-bundle", "maps": []}))
    with pytest.raises(IntegrityError, match="entries named twice .manifest.json"):
        target.import_(dup)
    assert snapshot(target) == before
    src = open_registry(f"sqlite:///{d / 'src.sqlite'}", d / "src-art")
    try:
        z = src.export(tmp_path / "b.zip")
        stamp = z.stat().st_mtime_ns
        with pytest.raises(RegistryError, match="exists"):
            src.export(tmp_path / "b.zip")
        assert z.stat().st_mtime_ns == stamp
        upper = src.export(tmp_path / "c.ZIP")
        assert upper.is_file() and zipfile.is_zipfile(upper)
    finally:
        src.close()


def test_the_stored_format_is_the_artifacts_not_the_manifests_file_name(target, tmp_path):
    """A manifest naming an npz file for safetensors bytes: stored as .npz and shown as artifact_format npz."""
    src = open_registry(f"sqlite:///{tmp_path / 's.sqlite'}", tmp_path / "s-art")
    rng = np.random.default_rng(0)
    X = rng.standard_normal((30, 4)).astype(np.float32)
    src.register_version("st", align.fit_procrustes(X, X[:, ::-1]), source_space="p", target_space="q",
                         method="procrustes", params={}, artifact_format="safetensors")
    b = src.export(tmp_path / "st")
    src.close()
    man = json.loads((b / "manifest.json").read_text())
    v = man["maps"][0]["versions"][0]
    assert v["artifact_path"].endswith(".safetensors")
    v["artifact_path"] = v["artifact_path"][: -len(".safetensors")] + ".npz"
    (b / "manifest.json").write_text(json.dumps(man))
    target.import_(b)
    got = target.get_version("st", 1)
    assert got.artifact_format == "safetensors" and got.artifact_path.endswith(".safetensors"), got
    np.testing.assert_array_equal(target.load_map("st:1").W, align.fit_procrustes(X, X[:, ::-1]).W)


def test_json_http_refuses_is_refused_naming_the_version_and_field(source, tmp_path, capsys):
    """A manifest's free JSON is held to HTTP's rules (integers within 64 bits, nesting of at most 31 levels under the
    body's, finite numbers); the one-line refusal (exit 2) names the map, version and field. Nesting of 31 levels,
    what HTTP takes, still imports."""
    var = tmp_path / "var"
    b = _edit(_copy(source, tmp_path), lambda m: m["maps"][0]["versions"][0]["metrics"].update(heldout_top1=10**400))
    assert main(["--data-dir", str(var), "registry", "import", str(b)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "map 'a->b' version 1 metrics" in err[0] and "64 bits" in err[0], err
    b = _edit(_copy(source, tmp_path, "c"), lambda m: m["maps"][1]["versions"][0].update(params={"x": [[[]]] * 3}))
    b = _edit(b, lambda m: m["maps"][0]["versions"][0].update(inputs={"x": json.loads("[" * 30 + "]" * 30)}))
    assert main(["--data-dir", str(var), "registry", "import", str(b)]) == 0, capsys.readouterr().err


def test_a_manifest_integer_of_5000_digits_is_not_json(source, tmp_path, capsys):
    """Python refuses to read an integer literal of more than 4,300 digits (ValueError): that was exit 3, "internal
    error: ValueError: Exceeds the limit (4300 digits)"."""
    b = _copy(source, tmp_path)
    p = b / "manifest.json"
    p.write_text(p.read_text().replace('"format_version": 1', '"format_version": 1, "x": ' + "9" * 5000, 1))
    assert main(["--data-dir", str(tmp_path / "var"), "registry", "import", str(b)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bundle manifest is not JSON" in err[0], err


def _legacy(var, metrics: dict, params: dict):
    """A data dir whose map a->b (spaces a, b) has versions 1 and 2; version 1's stored metrics and params are set in
    the database as a bundle import before its checks (or an older PostgreSQL peer) could leave them."""
    reg = open_registry(f"sqlite:///{var / 'registry.sqlite'}", var / "artifacts")
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 8)).astype(np.float32)
    good = {"heldout_top1": 0.9, "heldout_n_candidates": 200, "heldout_n_queries": 200}
    for _ in range(2):
        reg.register_version("a->b", align.fit_procrustes(X, X[:, ::-1]), source_space="a", target_space="b",
                             method="procrustes", params={}, metrics=good)
    reg._write(lambda t: t.q("UPDATE versions SET metrics = ?, params = ? WHERE name = 'a->b' AND version = 1",
                             (json.dumps({**good, **metrics}), json.dumps(params))))
    return reg


DEEP = json.loads("[" * 500 + "]" * 500)
LEGACY = [("metric-10^400", {"heldout_top1": 10**400, "train_top1": 10**400}, {}),
          ("params-2^70", {}, {"x": 2**70, "y": [-(2**64)]}),
          ("params-nested-500", {}, {"x": DEEP})]


@pytest.mark.parametrize("case,metrics,params", LEGACY, ids=[c[0] for c in LEGACY])
def test_a_stored_record_http_would_refuse_still_lists_searches_shows_and_exports(tmp_path, capsys, case, metrics,
                                                                                  params):
    """Such a record, stored before imports were checked: `registry list`, GET /v1/maps and the path choice of every
    search from a to b failed (OverflowError from the metric, exit 3 / 500); GET of the version and `registry show`
    (orjson refuses an integer past 64 bits; RecursionError) too; DELETE of it answered 500 after deleting it; and
    `registry export`, which writes deleted versions too, failed for ever. The metric now counts as missing; the
    integer is shown as its digits and the nesting past 31 levels as its JSON text, so an export imports again."""
    var = tmp_path / "var"
    reg = _legacy(var, metrics, params)
    assert reg.list_maps()[0]["path_version"] == 2 and [v.version for v in reg.find_path("a", "b")] == [2]
    reg.delete_version("a->b", 2)
    assert reg.list_maps()[0]["path_version"] == 1 and [v.version for v in reg.find_path("a", "b")] == [1]
    shown = reg.get_version("a->b", 1).to_dict()
    reg.close()
    import orjson

    orjson.loads(orjson.dumps(shown))  # what every HTTP answer does with it
    if case == "params-2^70":
        assert shown["params"] == {"x": str(2**70), "y": [str(-(2**64))]}
    if case == "metric-10^400":
        assert shown["metrics"]["heldout_top1"] == str(10**400)
    for argv in (["registry", "list"], ["registry", "show", "a->b:1"], ["registry", "export", str(tmp_path / "b.zip")],
                 ["--data-dir", str(tmp_path / "again"), "registry", "import", str(tmp_path / "b.zip")]):
        argv = argv if argv[0] == "--data-dir" else ["--data-dir", str(var), *argv]
        assert main(argv) == 0, (argv, capsys.readouterr().err)

    from fastapi.testclient import TestClient

    from service.api import create_app

    from .helpers import W, settings_for

    with TestClient(create_app(settings_for(tmp_path, data_dir=var)), raise_server_exceptions=False) as c:
        for url in ("/v1/maps", "/v1/maps/a->b", "/v1/maps/a->b/versions", "/v1/maps/a->b/versions/1"):
            r = c.get(url, headers=W)
            assert r.status_code == 200, (url, r.text)
        r = c.delete("/v1/maps/a->b/versions/1", headers=W)
        assert r.status_code == 200 and r.json()["deleted"] and r.json()["bare_ref"] is None, r.text


def test_a_stored_field_too_deep_to_parse_is_a_typed_error(tmp_path):
    """Nesting past what the JSON parser's stack reads cannot be shown at all: an IntegrityError naming the version
    (exit 2), not an internal RecursionError."""
    reg = _legacy(tmp_path / "var", {}, {})
    reg._write(lambda t: t.q("UPDATE versions SET params = ? WHERE name = 'a->b' AND version = 1",
                             ('{"x": ' + "[" * 100_000 + "]" * 100_000 + "}",)))
    with pytest.raises(IntegrityError, match="a->b:1: a stored JSON field cannot be read"):
        reg.get_version("a->b", 1)
    assert reg.get_version("a->b", 2).params == {}
    reg.close()


def test_only_a_record_nested_that_deep_is_walked_not_one_with_many_brackets(tmp_path, monkeypatch):
    """The bracket count sent every steer read whose lens had rank >= 3 (many brackets side by side, 4 levels) through
    the walk that rebuilds the value: 3-4x the read of the field. The walk is now for a value nested 32 deep only
    (brackets inside strings count for nothing); what it rewrites is as before."""
    from service.registry import models

    walked = []
    real = models._showable
    monkeypatch.setattr(models, "_showable", lambda v, depth=1: walked.append(v) or real(v, depth))
    reg = open_registry(f"sqlite:///{tmp_path / 'registry.sqlite'}", tmp_path / "artifacts")
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 8)).astype(np.float32)
    steer = align.fit_steer(X, np.where(X[:, 0] > 0, 1, -1), rank=8, method="lm-steer", random_state=0)
    lens = steer.lens(X, [f"row [{i}] {{" + "[" * 40 for i in range(200)], k=5)
    text = json.dumps(lens)
    assert text.count("[") + text.count("{") > 1000 and len(lens) == 8
    s = reg.register_steer("st", steer, space="s", lens=lens)
    nested = {"x": json.loads("[" * 30 + "]" * 30), "y": [{"z": json.loads("[" * 28 + "]" * 28)}]}  # 31 levels
    deep = {"x": json.loads("[" * 31 + "]" * 31)}  # 32: the innermost list is written as its JSON text
    reg.register_version("m", align.fit_procrustes(X, X), source_space="s", target_space="t", method="procrustes",
                         params=nested)
    reg._write(lambda t: t.q("UPDATE versions SET metrics = ? WHERE name = 'm'", (json.dumps(deep),)))
    walked.clear()
    assert reg.get_steer("st", s.version).lens == lens and walked == []
    assert reg.get_version("m", 1).params == nested and walked[0] == deep  # metrics only (then its recursion)
    shown = reg.get_version("m", 1).metrics
    assert shown == real(deep) != deep and json.dumps(shown).count('"[]"') == 1
    reg.close()


def test_an_alias_kept_here_unlike_the_bundles_is_listed_not_silent(source, tmp_path, capsys):
    """A replica synced by re-importing its primary's bundle kept its own ``prod`` (an import never moves an alias),
    and said ``aliases=0`` and nothing else: searches there went on using the old version while the primary's had
    moved. Every alias kept elsewhere than the bundle's is listed (``aliases_kept``; the CLI warns, naming the
    command that moves it); one that agrees with the bundle is not."""
    var = tmp_path / "var"
    reg = open_registry(f"sqlite:///{var / 'registry.sqlite'}", var / "artifacts")
    reg.import_(source[1])
    X = np.random.default_rng(5).standard_normal((40, 8)).astype(np.float32)
    reg.register_version("a->b", align.fit_procrustes(X, X[:, ::-1]), source_space="a", target_space="b",
                         method="procrustes", params={})
    reg.set_alias("a->b", "prod", 2)
    reg.set_steer_alias("pos", "prod", 2)
    counts = reg.import_(source[1])
    assert counts["aliases_kept"] == ["map a->b@prod -> 2 here, 1 in the bundle",
                                      "steer pos@prod -> 2 here, 1 in the bundle"], counts
    assert reg.resolve("a->b@prod").version == 2 and reg.resolve_steer("pos@prod").version == 2  # still never moved
    reg.set_alias("a->b", "prod", 1)
    reg.set_steer_alias("pos", "prod", 1)
    assert "aliases_kept" not in reg.import_(source[1])
    reg.set_alias("a->b", "prod", 2)
    reg.close()
    assert main(["--data-dir", str(var), "registry", "import", str(source[1])]) == 0
    err = capsys.readouterr().err
    assert "a->b@prod -> 2 here, 1 in the bundle" in err and "vecbridge registry alias NAME ALIAS VERSION" in err, err


def test_a_newer_or_truncated_bundle_says_what_it_is_and_what_to_do(source, target, tmp_path, capsys):
    """A bundle of a newer format said only "format_version 2 is not supported" (not that it is newer, nor which
    release wrote it), and a zip bundle cut short in its copy said "neither a zip bundle nor a bundle folder", as for
    any other file: each now says what it is and what to do, still refused with nothing changed."""
    newer = _edit(_copy(source, tmp_path), lambda m: m.update(format_version=2, package_version="9.9.0"))
    _refused(target, newer, IntegrityError, match=r"format_version 2 is newer .* written by vecbridge 9\.9\.0")
    _refused(target, _edit(_copy(source, tmp_path, "odd"), lambda m: m.update(format_version="x")), IntegrityError,
             match="'x' is not one vecbridge writes")
    whole = shutil.make_archive(str(tmp_path / "z"), "zip", source[1])  # the folder bundle as a zip
    cut = tmp_path / "cut.zip"
    cut.write_bytes(open(whole, "rb").read()[:-200])
    _refused(target, cut, IntegrityError, match="cut.zip is a damaged or truncated zip")
    (tmp_path / "text.zip").write_text("not a zip")
    _refused(target, tmp_path / "text.zip", IntegrityError, match="neither a zip bundle nor a bundle folder")
    assert main(["--data-dir", str(tmp_path / "var"), "registry", "import", str(cut)]) == 2
    assert "truncated" in capsys.readouterr().err


def test_an_import_sets_no_alias_on_a_version_deleted_here(source, tmp_path):
    """Where a->b:1 was deleted here and its prod alias removed, importing a bundle that has prod on its (live) a->b:1
    set prod on the deleted version: an alias `registry alias` refuses to write, so a->b@prod failed (deleted) and
    `registry list` showed prod->1(deleted), with "aliases=1". It is not set, and said so; an alias here on it stays."""
    var = tmp_path / "var"
    reg = open_registry(f"sqlite:///{var / 'registry.sqlite'}", var / "artifacts")
    reg.import_(source[1])
    reg.delete_version("a->b", 1)
    reg.delete_alias("a->b", "prod")
    counts = reg.import_(source[1])
    assert counts["deleted_here"] == ["map a->b:1"] and counts["aliases"] == 0, counts
    assert counts["aliases_kept"] == ["map a->b@prod not set: 1 in the bundle, deleted here"], counts
    assert "prod" not in {a for v in reg.list_versions("a->b") for a in v.aliases}
    with pytest.raises(RegistryError):
        reg.set_alias("a->b", "prod", 1)  # what the import now agrees with
    other = open_registry(f"sqlite:///{tmp_path / 'o.sqlite'}", tmp_path / "o-art")
    other.import_(source[1])
    other.delete_version("a->b", 1)  # its prod stays on it (lineage): kept, not listed
    counts = other.import_(source[1])
    assert "aliases_kept" not in counts and other.get_version("a->b", 1).aliases == ["prod"], counts
    reg.close()
    other.close()
