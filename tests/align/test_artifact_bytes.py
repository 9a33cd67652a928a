"""The same fit writes the same artifact bytes: wall-clock seconds and the executor stay out of the artifact.

Two fits with one seed gave bit-identical arrays but different bytes (another ``artifact_sha256``, ETag and file in
the content-addressed store) because the header recorded each candidate's ``seconds``, ``fit_seconds``,
MiniVec2Vec's ``diagnostics.timings`` and per-round ``seconds``. The fitted object keeps them in memory.
"""

from __future__ import annotations

import io
import json
import warnings

import numpy as np
import pytest

import align

_RNG = np.random.default_rng(1)
X = _RNG.normal(size=(120, 16)).astype(np.float32)
Y = (X @ np.linalg.qr(_RNG.normal(size=(16, 16)))[0] + 0.1 * _RNG.normal(size=(120, 16))).astype(np.float32)
SEEDS = (np.arange(10), np.arange(10))

#: family -> fit(seed); each draws on its seed except the closed forms
FAMILIES = {
    "procrustes": lambda s: align.fit_procrustes(X, Y),
    "ridge": lambda s: align.fit_ridge(X, Y),
    "lowrank": lambda s: align.fit_lowrank(X, Y, rank=4),
    "auto": lambda s: align.fit_migration(X, Y, method="auto", random_state=s),
    "contrastive": lambda s: align.fit_migration(X, Y, method="contrastive", random_state=s, epochs=3),
    "cluster": lambda s: align.fit_migration(X, Y, method="cluster", random_state=s),
    "semisup": lambda s: align.fit_migration(X[:60], Y[:60], method="procrustes", unpaired_source=X[60:],
                                             unpaired_target=Y[60:], semi_supervised="sinkhorn", random_state=s),
    "minivec2vec": lambda s: align.MiniVec2Vec(random_state=s, n_restarts=1).fit(X, Y).map_,
    "minivec2vec seeded": lambda s: align.MiniVec2Vec(random_state=s, n_restarts=1).fit(X, Y, seed_pairs=SEEDS).map_,
}
RANDOM = {"auto", "contrastive", "cluster", "semisup", "minivec2vec", "minivec2vec seeded"}


def _fit(family: str, seed: int):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unreliable verdicts of a small problem: not what is tested here
        return FAMILIES[family](seed)


def _header(data: bytes) -> dict:
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return json.loads(z["__meta__"].tobytes().decode("utf-8"))


def _keys(obj) -> set:
    if isinstance(obj, dict):
        return set(obj) | set().union(*(_keys(v) for v in obj.values()))
    if isinstance(obj, list):
        return set().union(*(_keys(v) for v in obj))
    return set()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_two_fits_with_one_seed_write_the_same_bytes(family, tmp_path):
    a, b = _fit(family, 0), _fit(family, 0)
    for fmt in ("npz", "safetensors"):
        assert a.to_bytes(fmt) == b.to_bytes(fmt), f"{family}: same seed, other {fmt} bytes"
    assert a.save(tmp_path / "a.npz").read_bytes() == b.save(tmp_path / "b.npz").read_bytes()
    assert not _keys(_header(a.to_bytes())) & {"seconds", "fit_seconds", "timings", "executor"}
    back = align.map_from_bytes(a.to_bytes())
    assert back.to_bytes() == a.to_bytes()  # a stored map written again: the same bytes
    if family in RANDOM:
        c = _fit(family, 1)
        assert c.to_bytes() != a.to_bytes(), f"{family}: another seed, the same bytes"


def test_the_fitted_object_keeps_its_timings_in_memory():
    auto = _fit("auto", 0)
    cands = auto.metadata["selection"]["candidates"]
    assert all(c["seconds"] >= 0 for c in cands.values()) and auto.metadata["fit_seconds"] >= 0
    mv = _fit("minivec2vec", 0)
    assert mv.metadata["diagnostics"]["timings"]["total"] > 0
    assert "seconds" in mv.metadata["diagnostics"]["runs"][0]["history"]["self_learning"][0]
    assert "timings" not in align.map_from_bytes(mv.to_bytes()).metadata["diagnostics"]


def test_an_artifact_written_with_timings_still_loads():
    """Artifacts before this change hold the seconds and the executor: they load, with them."""
    m = _fit("procrustes", 0)
    meta = {**m.metadata, "fit_seconds": 0.25, "diagnostics": {"timings": {"total": 1.5}, "executor": "threads:2"}}
    header = {"format": "vecbridge.LinearMap", "format_version": 1, "source_frame": m.source_frame.to_meta(),
              "target_frame": m.target_frame.to_meta(), "metadata": meta}
    buf = io.BytesIO()
    arrays = {"W": m.W, **({"source_mean": m.source_frame.mean} if m.source_frame.mean is not None else {}),
              **({"target_mean": m.target_frame.mean} if m.target_frame.mean is not None else {})}
    np.savez(buf, **arrays, __meta__=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8))
    old = align.map_from_bytes(buf.getvalue())
    assert old.metadata["diagnostics"] == {"timings": {"total": 1.5}, "executor": "threads:2"}
    np.testing.assert_array_equal(old.W, m.W)
    again = _header(old.to_bytes())["metadata"]  # written again: without them, as a fit writes it today
    assert again["diagnostics"] == {} and "fit_seconds" not in again


def test_a_users_own_keys_of_those_names_are_written_as_they_are(tmp_path):
    """Only vecbridge's own fit records lose their seconds and executor: a user's ``executor``, ``timings`` or a
    ``{"clip": {"seconds": 30}}`` of their own were dropped on save at any depth, and the loaded map still compared
    equal to the one saved."""
    own = {"executor": "alice@lab", "timings": "nightly", "provenance": {"clip": {"seconds": 30}, "fit_seconds": 2}}
    for family in ("procrustes", "auto", "minivec2vec"):
        m = _fit(family, 0)
        m.metadata.update(own)
        for fmt in ("npz", "safetensors"):
            back = type(m).load(m.save(tmp_path / f"m.{fmt}"))
            assert {k: back.metadata[k] for k in own} == own, f"{family} {fmt}"
            assert back == m
        assert not _keys(_header(m.to_bytes())["metadata"].get("diagnostics", {})) & {"timings", "executor"}
        other = type(m).from_bytes(m.to_bytes())
        other.metadata["provenance"] = {"clip": {"seconds": 31}, "fit_seconds": 2}
        assert other != m  # a user's value that differs makes another map


@pytest.mark.parametrize("family", ["auto", "minivec2vec"])
def test_maps_made_of_fitted_maps_write_the_same_bytes(family):
    """An inverse, a composition and a chain nest their maps' metadata (``of``, ``parts``): the fit's seconds in it
    stay out of their artifacts too."""
    a, b = _fit(family, 0), _fit(family, 0)
    assert a.inverse().to_bytes() == b.inverse().to_bytes()
    assert align.MapChain([a, a.inverse()]).to_bytes() == align.MapChain([b, b.inverse()]).to_bytes()
    if isinstance(a, align.LinearMap):
        assert a.compose(a.inverse()).to_bytes() == b.compose(b.inverse()).to_bytes()
