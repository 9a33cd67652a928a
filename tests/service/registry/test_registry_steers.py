"""Steers in the registry: versions, lineage, aliases, integrity; SQLite and (when
VECBRIDGE_TEST_POSTGRES_URL is set) PostgreSQL."""

from __future__ import annotations


import numpy as np
import pytest

from align.steer import MeanShift, Steer, fit_mean_shift
from service.registry import (
    ConflictError,
    DeletedVersionError,
    IntegrityError,
    InvalidNameError,
    NotFoundError,
    SteerInfo,
    open_registry,
)


def _steer(seed: int, d: int = 12, r: int = 3) -> Steer:
    rng = np.random.default_rng(seed)
    return Steer(rng.normal(size=(d, r)), rng.normal(size=(d, r)), {"method": "lm-steer", "seed": seed})


def test_register_resolve_load_roundtrip(reg):
    s1, s2 = _steer(1), _steer(2)
    v1 = reg.register_steer("pos", s1, space="sp", params={"rank": 3}, random_state=7,
                            data_hashes={"X": "abc"}, metrics={"loss": 0.5}, alias="prod")
    v2 = reg.register_steer("pos", s2, space="sp", params={"rank": 3}, random_state=8)
    assert isinstance(v1, SteerInfo) and (v1.version, v2.version) == (1, 2)
    assert (v1.space, v1.dim, v1.rank, v1.method) == ("sp", 12, 3, "lm-steer")
    assert v1.params == {"rank": 3} and v1.random_state == 7 and v1.data_hashes == {"X": "abc"}
    assert v1.metrics == {"loss": 0.5} and len(v1.artifact_sha256) == 64 and v1.aliases == ["prod"]
    assert reg.get_space("sp").dim == 12  # space created from the steer
    assert reg.resolve_steer("pos").version == 1  # a bare name means prod while it is set (as for maps)
    assert reg.resolve_steer("pos@prod").version == 1
    assert reg.resolve_steer("pos:2").version == 2
    got = reg.load_steer("pos@prod")
    np.testing.assert_array_equal(got.P1, s1.P1)
    np.testing.assert_array_equal(got.P2, s1.P2)
    assert got.metadata["seed"] == 1
    listed = reg.list_steers()
    assert [x["name"] for x in listed] == ["pos"]
    assert listed[0]["latest_version"] == 2 and listed[0]["aliases"] == {"prod": 1}


def test_mean_shift_is_stored_with_rank_zero(reg):
    X = np.random.default_rng(0).normal(size=(20, 6))
    labels = np.array([1] * 10 + [-1] * 10)
    ms = fit_mean_shift(X, labels)
    info = reg.register_steer("shift", ms, space="six", params={"method": "mean-shift"})
    assert info.rank == 0 and info.method == "mean-shift"
    back = reg.load_steer("shift")
    assert isinstance(back, MeanShift)
    np.testing.assert_array_equal(back.v, ms.v)


def test_errors(reg):
    reg.register_steer("a", _steer(0), space="sp")
    with pytest.raises(NotFoundError):
        reg.resolve_steer("nope")
    with pytest.raises(NotFoundError):
        reg.resolve_steer("a:9")
    with pytest.raises(NotFoundError):
        reg.resolve_steer("a@missing")
    with pytest.raises(InvalidNameError):
        reg.register_steer("../evil", _steer(0), space="sp")
    with pytest.raises(InvalidNameError):
        reg.register_steer("ok", _steer(0), space="sp", alias="1")
    with pytest.raises(InvalidNameError):
        reg.register_steer("ok", np.eye(3), space="sp")
    with pytest.raises(ConflictError):  # a space's dim is fixed
        reg.register_steer("b", _steer(0, d=5), space="sp")
    reg.register_steer("c", _steer(0, d=5), space="five")
    with pytest.raises(ConflictError):  # a steer name is bound to its space
        reg.register_steer("a", _steer(0, d=5), space="five")
    reg.delete_steer_version("a", 1)
    with pytest.raises(DeletedVersionError):
        reg.resolve_steer("a:1")
    with pytest.raises(NotFoundError):
        reg.resolve_steer("a")  # no live versions
    with pytest.raises(ConflictError):
        reg.set_steer_alias("a", "prod", 1)


def test_a_bad_steer_reference_is_worded_as_a_steer():
    """A bad steer reference (a search's ``steers``, /v1/steers/{ref}) was refused as a bad "map name"."""
    from service.registry.names import parse_ref

    for bad in ("a/../b", "a/../b@prod", "a/../b:1", "\x00"):
        with pytest.raises(InvalidNameError, match="^steer name"):
            parse_ref(bad, "steer")
    with pytest.raises(InvalidNameError, match="^map name"):
        parse_ref("a/../b")


def test_bad_references_name_the_steer(reg):
    reg.register_steer("a", _steer(0), space="sp")
    for bad in ("a/../b", "../x@prod", "\x00:1"):
        with pytest.raises(InvalidNameError, match="^steer name"):
            reg.resolve_steer(bad)


def test_alias_moves(reg):
    for seed in range(3):
        reg.register_steer("m", _steer(seed), space="sp")
    reg.set_steer_alias("m", "prod", 2)
    assert reg.resolve_steer("m@prod").version == 2
    reg.set_steer_alias("m", "prod", 3)
    assert reg.resolve_steer("m@prod").version == 3
    assert reg.get_steer("m", 2).aliases == []


def test_a_bare_name_means_prod_while_it_is_set_as_for_maps(reg):
    """A refit (v3) must not reach searches and applies that name the steer bare while ``prod`` pins v1 (a bare map
    name works so); the bare name follows ``prod`` when it moves, and falls back to the newest live version when
    ``prod`` is removed or its version deleted. Loading by the bare name reads the same version's artifact."""
    steers = [_steer(seed) for seed in range(3)]
    for s in steers:
        reg.register_steer("pinned", s, space="sp")
    reg.set_steer_alias("pinned", "prod", 1)
    assert reg.resolve_steer("pinned").version == 1
    np.testing.assert_array_equal(reg.load_steer("pinned").P1, steers[0].P1)
    reg.set_steer_alias("pinned", "prod", 2)
    assert reg.resolve_steer("pinned").version == 2
    np.testing.assert_array_equal(reg.load_steer("pinned").P1, steers[1].P1)
    reg.delete_steer_version("pinned", 2)
    assert reg.resolve_steer("pinned").version == 3  # prod's version deleted: the newest live one
    np.testing.assert_array_equal(reg.load_steer("pinned").P1, steers[2].P1)
    with pytest.raises(DeletedVersionError):
        reg.resolve_steer("pinned@prod")  # the alias itself still says what it points at


def test_versions_sharing_an_artifact_export_it_once_and_import_bit_exact(reg, tmp_path):
    """The same fit twice (same rows, same seed) stores one artifact for two versions; the bundle wrote it twice,
    so `registry export` printed zipfile's 'Duplicate name' UserWarning and the zip held duplicate entries."""
    import warnings
    import zipfile

    s = _steer(0)
    reg.register_steer("same", s, space="sp", alias="prod")
    reg.register_steer("same", Steer(s.P1, s.P2, dict(s.metadata)), space="sp")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bundle = reg.export(tmp_path / "b.zip")
    names = zipfile.ZipFile(bundle).namelist()
    assert len(names) == len(set(names))
    other = open_registry(f"sqlite:///{tmp_path}/other.sqlite", tmp_path / "other-artifacts")
    counts = other.import_(bundle)
    assert (counts["steers"], counts["steer_aliases"], counts["aliases"]) == (2, 1, 0)  # prod counted as a steer's
    for v in (1, 2):
        a, b = reg.get_steer("same", v), other.get_steer("same", v)
        assert a.artifact_sha256 == b.artifact_sha256 and a.aliases == b.aliases
        assert reg.store.get(a.artifact_path, a.artifact_sha256) == other.store.get(b.artifact_path, b.artifact_sha256)


def test_an_export_of_named_steers_carries_them_and_their_space_only(reg, tmp_path):
    """`registry export --name STEER` failed with "unknown map(s)": a steer could not be exported alone. Names pick
    maps and steers; the bundle holds them and the spaces they use, nothing else; a name of neither is refused."""
    reg.register_steer("tone", _steer(0), space="sp", alias="prod")
    reg.register_steer("other", _steer(1), space="sp2")
    bundle = reg.export(tmp_path / "one.zip", ["tone"])
    fresh = open_registry(f"sqlite:///{tmp_path}/fresh.sqlite", tmp_path / "fresh-artifacts")
    counts = fresh.import_(bundle)
    assert (counts["steers"], counts["steer_aliases"]) == (1, 1)
    assert [s["name"] for s in fresh.list_steers()] == ["tone"] and fresh.resolve_steer("tone@prod").version == 1
    assert [s.name for s in fresh.list_spaces()] == ["sp"]
    np.testing.assert_array_equal(fresh.load_steer("tone").P1, reg.load_steer("tone").P1)
    with pytest.raises(NotFoundError, match="no map or steer named 'nope'"):
        reg.export(tmp_path / "two.zip", ["tone", "nope"])
    assert not (tmp_path / "two.zip").exists()


def test_tampered_artifact_is_an_integrity_error(reg):
    info = reg.register_steer("t", _steer(0), space="sp")
    path = reg.store.path(info.artifact_path)
    path.chmod(0o644)
    path.write_bytes(path.read_bytes()[:-7] + b"garbage")
    with pytest.raises(IntegrityError):
        reg.load_steer("t")
    assert reg.verify()["ok"] is False


def test_verify_counts_steer_artifacts_as_used(reg):
    reg.register_steer("v", _steer(0), space="sp")
    out = reg.verify()
    assert out["ok"] and out["orphan_artifacts"] == []


def test_concurrent_writers_get_distinct_versions(reg, registry_url, tmp_path, run_threads):
    def writer(seed):  # each thread its own Registry (own connections) on the same database
        r = open_registry(registry_url, tmp_path / "artifacts")
        try:
            return [r.register_steer("race", _steer(100 * seed + j), space="sp").version for j in range(4)]
        finally:
            r.close()

    versions = [v for vs in run_threads(writer, 3) for v in vs]
    assert sorted(versions) == list(range(1, 13))
    assert [s.version for s in reg.list_steer_versions("race")] == list(range(1, 13))


def test_maps_still_number_their_versions(reg):
    import align

    m = align.LinearMap(np.eye(4, dtype=np.float32))
    a = reg.register_version("x->y", m, source_space="x", target_space="y", method="procrustes", params={})
    b = reg.register_version("x->y", m, source_space="x", target_space="y", method="procrustes", params={})
    assert (a.version, b.version) == (1, 2)
    reg.register_steer("x-steer", _steer(0, d=4), space="x")
    assert reg.resolve("x->y").version == 2


def linear(seed):
    """An 8-d Procrustes map of a random linear relation (seed ``seed``)."""
    import align

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(64, 8))
    return align.fit_procrustes(X, X @ rng.normal(size=(8, 8)))


def test_a_renumbering_import_keeps_a_transferred_steers_lineage(reg, tmp_path):
    """`registry import --renumber` gave the bundle's map a-b:2 the number 4 here (a-b:1 and a-b:2 here are other
    maps), but the steer transferred through it still named "a-b:2" in params.map and inputs.map: a map it never came
    through. Its source steer (renumbered too, and imported after it: "e5" sorts before "zzz") alike."""
    from service.ops.steers import transfer_and_register

    src = open_registry(f"sqlite:///{tmp_path}/src.sqlite", tmp_path / "src-artifacts")
    for seed in (0, 1):
        src.register_version("a-b", linear(seed), source_space="a", target_space="b", method="procrustes", params={})
        reg.register_version("a-b", linear(10 + seed), source_space="a", target_space="b", method="procrustes",
                             params={})
    src.register_steer("zzz", _steer(0, d=8, r=2), space="a")
    reg.register_steer("zzz", _steer(1, d=8, r=2), space="a")
    moved = transfer_and_register(src, "zzz", "a-b:2", name="e5")
    assert moved.params["map"] == moved.inputs["map"] == "a-b:2" and moved.inputs["steer"] == "zzz:1"
    bundle = src.export(tmp_path / "b.zip")

    assert reg.import_(bundle, on_conflict="renumber")["renumbered"] == 2
    got = reg.resolve_steer("e5")
    by_sha = {kind: {v.artifact_sha256: v.ref for v in versions} for kind, versions in (
        ("map", reg.list_versions("a-b")), ("steer", reg.list_steer_versions("zzz")))}
    want = {"map": by_sha["map"][src.get_version("a-b", 2).artifact_sha256],
            "steer": by_sha["steer"][src.get_steer("zzz", 1).artifact_sha256]}
    assert want == {"map": "a-b:4", "steer": "zzz:2"}
    assert {k: got.params[k] for k in want} == {k: got.inputs[k] for k in want} == want
    assert got.params["method"] == "transfer" and got.inputs["via"] == "transfer"
    again = reg.import_(bundle, on_conflict="renumber")
    assert (again["skipped"], again["renumbered"], again["steers"]) == (2, 0, 0)  # a no-op: the lineage stays
    assert {k: reg.resolve_steer("e5").params[k] for k in want} == want
    plain = open_registry(f"sqlite:///{tmp_path}/plain.sqlite", tmp_path / "plain-artifacts")  # nothing renumbered
    plain.import_(bundle)
    assert plain.resolve_steer("e5").params == moved.params and plain.resolve_steer("e5").inputs == moved.inputs


def test_a_transferred_steer_exported_alone_names_the_map_it_came_through_here(reg, tmp_path):
    """`registry export --name e5` (the transferred steer without its map and source steer) imported where a-b:2 is
    another map kept "a-b:2" in its lineage: a map it never came through (the one it did is a-b:3 here). The export
    records the artifact each reference named: the import names the version here with it, and where no version has
    it, keeps the reference with that artifact's sha256 beside it (``lineage_elsewhere``), never another map's."""
    from service.ops.steers import transfer_and_register

    src = open_registry(f"sqlite:///{tmp_path}/src.sqlite", tmp_path / "src-artifacts")
    for seed in (0, 1):
        src.register_version("a-b", linear(seed), source_space="a", target_space="b", method="procrustes", params={})
    src.register_steer("zzz", _steer(0, d=8, r=2), space="a")
    transfer_and_register(src, "zzz", "a-b:2", name="e5")
    reg.register_version("a-b", linear(10), source_space="a", target_space="b", method="procrustes", params={})
    reg.register_version("a-b", linear(11), source_space="a", target_space="b", method="procrustes", params={})
    reg.import_(src.export(tmp_path / "maps.zip", ["a-b"]), on_conflict="renumber")  # src's a-b:2 is a-b:4 here
    reg.register_steer("zzz", _steer(0, d=8, r=2), space="a")  # zzz:1 here: the same artifact as src's zzz:1
    counts = reg.import_(src.export(tmp_path / "alone.zip", ["e5"]))
    got = reg.resolve_steer("e5")
    assert reg.get_version("a-b", 4).artifact_sha256 == src.get_version("a-b", 2).artifact_sha256
    assert got.params["map"] == got.inputs["map"] == "a-b:4" and got.params["steer"] == got.inputs["steer"] == "zzz:1"
    assert "lineage_elsewhere" not in counts and "map_sha256" not in got.inputs
    bare = open_registry(f"sqlite:///{tmp_path}/bare.sqlite", tmp_path / "bare-artifacts")  # neither is here
    bare.register_version("a-b", linear(12), source_space="a", target_space="b", method="procrustes", params={})
    bare.register_version("a-b", linear(13), source_space="a", target_space="b", method="procrustes", params={})
    counts = bare.import_(tmp_path / "alone.zip")
    got = bare.resolve_steer("e5")
    assert counts["lineage_elsewhere"] == ["steer e5:1: map a-b:2", "steer e5:1: steer zzz:1"], counts
    sha = src.get_version("a-b", 2).artifact_sha256
    assert got.params["map"] == "a-b:2" and got.inputs["map_sha256"] == sha
    assert sha != bare.get_version("a-b", 2).artifact_sha256  # a-b:2 here is another map
    assert got.inputs["steer_sha256"] == src.get_steer("zzz", 1).artifact_sha256
