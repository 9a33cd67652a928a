"""Reading crafted or damaged map artifacts: every one is refused with a typed error, never read as another map.

Each case edits one field of a real artifact (npz: arrays plus the JSON header in ``__meta__``) the way a
truncated copy, a hand edit or an attacker would, and reads it back through :func:`align.map_from_bytes`,
the reader the registry, the CLI and the workers share.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import align
from align.exceptions import InputError, SerializationError


def _parts(map_) -> tuple[dict, dict]:
    with np.load(io.BytesIO(map_.to_bytes("npz")), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return arrays, json.loads(arrays.pop("__meta__").tobytes())


def _npz(arrays: dict, header) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays, __meta__=np.frombuffer(json.dumps(header).encode(), np.uint8))
    return buf.getvalue()


@pytest.fixture(scope="module")
def maps():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 6)).astype(np.float32)
    Y = (X @ np.linalg.qr(rng.normal(size=(6, 6)))[0] + 0.1 * rng.normal(size=(60, 6))).astype(np.float32)
    linear = align.fit_ridge(X, Y)
    cluster = align.fit_migration(X, Y, method="cluster", n_clusters=2, random_state=0)
    return {"linear": linear, "cluster": cluster, "chain": align.MapChain([linear, linear])}


def _edit_array(name, value):
    return lambda a, h: a.__setitem__(name, value(a[name]) if callable(value) else value)


def _edit_header(*path, value):
    def edit(a, h):
        for key in path[:-1]:
            h = h[key]
        h[path[-1]] = value
    return edit


# (map kind, edit of (arrays, header), error, what the message names); before the fix each of these raised a
# raw ValueError / TypeError / AttributeError, or loaded silently as a different map
CASES = {
    "W of strings": ("linear", _edit_array("W", lambda W: W.astype(str)), InputError, "real numbers"),
    "complex W": ("linear", _edit_array("W", lambda W: W.astype(complex) + 1j), InputError, "real numbers"),
    "NaN bias": ("linear", _edit_array("bias", lambda b: np.full_like(b, np.nan)), InputError, "bias"),
    "bias of strings": ("linear", _edit_array("bias", lambda b: b.astype(str)), InputError, "bias"),
    "header a list": ("linear", None, SerializationError, "JSON object"),
    "format_version a string": ("linear", _edit_header("format_version", value="abc"), SerializationError,
                                "format_version"),
    "format_version null": ("linear", _edit_header("format_version", value=None), SerializationError,
                            "format_version"),
    "frame dim a string": ("linear", _edit_header("source_frame", "dim", value="x"), InputError, "dim"),
    "frame n_fit a string": ("linear", _edit_header("source_frame", "n_fit", value="x"), SerializationError,
                             "n_fit|int"),
    "unit_in the string 'false'": ("linear", _edit_header("source_frame", "unit_in", value="false"),
                                   SerializationError, "unit_in"),
    "frame a list": ("linear", _edit_header("target_frame", value=[1, 2]), SerializationError, "frame"),
    "centred frame without its mean": ("linear", lambda a, h: a.pop("source_mean"), SerializationError, "mean"),
    "metadata a list": ("linear", _edit_header("metadata", value=[1]), SerializationError, "metadata"),
    "cluster temperature a string": ("cluster", _edit_header("temperature", value="warm"), SerializationError,
                                     "temperature|float"),
    "cluster blend a string": ("cluster", _edit_header("blend", value="x"), InputError, "blend"),
    "cluster blend a huge int": ("cluster", _edit_header("blend", value=10**30), InputError, "blend"),
    "cluster blend a fraction": ("cluster", _edit_header("blend", value=2.7), InputError, "blend"),
    "cluster W complex": ("cluster", _edit_array("W", lambda W: W.astype(complex)), InputError, "real numbers"),
    "chain n_steps fewer than stored": ("chain", _edit_header("n_steps", value=1), SerializationError, "n_steps"),
    "chain n_steps a string": ("chain", _edit_header("n_steps", value="2"), SerializationError, "n_steps"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_damaged_artifact_is_refused_with_a_typed_error(maps, case):
    kind, edit, error, names = CASES[case]
    arrays, header = _parts(maps[kind])
    if edit is None:
        blob = _npz(arrays, [1, 2])
    else:
        edit(arrays, header)
        blob = _npz(arrays, header)
    with pytest.raises(error, match=names):
        align.map_from_bytes(blob)


def test_untouched_parts_still_read_back(maps):
    """The checks refuse only what the writer never produces: every kind round-trips bit for bit."""
    X = np.random.default_rng(1).normal(size=(5, 6)).astype(np.float32)
    for m in maps.values():
        for fmt in ("npz", "safetensors"):
            back = align.map_from_bytes(m.to_bytes(fmt))
            np.testing.assert_array_equal(back.apply(X), m.apply(X))


@pytest.mark.parametrize("blob", [b"", b"PK\x03\x04" + b"\0" * 40, b"\x08" + b"\0" * 7 + b"{}", b"x" * 200])
def test_garbage_bytes_are_a_serialization_error(blob):
    with pytest.raises(SerializationError):
        align.map_from_bytes(blob)


def test_bytes_of_no_artifact_format_say_so_plainly():
    """``map_from_bytes(b'garbage')`` said "cannot read map artifact: Expecting value: line 1 column 1 (char 0)"
    (the JSON parser's complaint about a safetensors header that was never there); bytes of neither format, and a
    safetensors file without vecbridge's header, now say what they are not."""
    from safetensors.numpy import save

    for blob in (b"garbage", b"", b"{\"W\": [1]}", b"\x08" + b"\0" * 7 + b"{}"):
        with pytest.raises(SerializationError, match=r"^not a vecbridge map artifact: neither npz \(a zip\) nor "
                                                     r"safetensors \(\d+ bytes starting b"):
            align.map_from_bytes(blob)
    with pytest.raises(SerializationError, match="^not a vecbridge map artifact: a safetensors file without"):
        align.map_from_bytes(save({"W": np.eye(3, dtype=np.float32)}))
    with pytest.raises(SerializationError, match="^not a vecbridge ClusterMap artifact: neither npz"):
        align.ClusterMap.from_bytes(b"garbage")


def test_pickled_arrays_are_never_loaded(maps):
    arrays, header = _parts(maps["linear"])
    arrays["W"] = np.array([{"__reduce__": "os.system"}], dtype=object)
    with pytest.raises(SerializationError, match="pickle"):
        align.map_from_bytes(_npz(arrays, header))



_STEER_EDITS = {  # (artifact kind, array, edit); before the fix: raw ValueError, or read silently as another steer
    "P1 of strings": ("steer", "P1", lambda a: np.full(a.shape, "x")),
    "P1 complex": ("steer", "P1", lambda a: a.astype(complex) + 1j),
    "P2 of objects": ("steer", "P2", lambda a: a.astype(object)),
    "v of strings": ("shift", "v", lambda a: np.full(a.shape, "x")),
    "v complex": ("shift", "v", lambda a: a.astype(complex) + 1j),
    "v 2-D": ("shift", "v", lambda a: np.stack([a, a])),
}


@pytest.mark.parametrize("case", list(_STEER_EDITS))
def test_damaged_steer_artifact_is_refused_with_a_typed_error(case):
    from align.steer import MeanShift, Steer

    kind, name, edit = _STEER_EDITS[case]
    cls = Steer if kind == "steer" else MeanShift
    obj = Steer(np.ones((4, 2)), np.ones((4, 2))) if kind == "steer" else MeanShift(np.ones(4))
    with np.load(io.BytesIO(obj.to_bytes()), allow_pickle=True) as z:
        arrays = {k: z[k] for k in z.files}
    header = json.loads(arrays.pop("__meta__").tobytes())
    arrays[name] = edit(arrays[name])
    with pytest.raises((InputError, SerializationError)):
        cls.from_bytes(_npz(arrays, header))
    assert np.array_equal(cls.from_bytes(obj.to_bytes()).to_bytes(), obj.to_bytes())


@pytest.mark.parametrize("blob", [b"garbage", b"", b"\x80\x04K\x01."])
def test_steer_garbage_says_what_it_is_not(blob):
    """``Steer.from_bytes(b'garbage')`` said numpy's "This file contains pickled (object) data ... allow_pickle=",
    which reads as advice to load it unsafely; bytes that are not a zip now say so and name the artifact kind."""
    from align.steer import MeanShift, Steer

    for cls in (Steer, MeanShift):
        with pytest.raises(SerializationError, match=rf"^not a vecbridge {cls.__name__} artifact: not an npz "
                                                     r"\(a zip\) archive \(\d+ bytes starting b") as info:
            cls.from_bytes(blob)
        assert "pickle" not in str(info.value)


def _st_parts(blob: bytes) -> tuple[dict, bytes]:
    n = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8 : 8 + n]), blob[8 + n :]


def _st(header: dict, body: bytes) -> bytes:
    h = json.dumps(header).encode()
    return len(h).to_bytes(8, "little") + h + body


def _edit_tensor(name, **values):
    def edit(h, body):
        h[name].update(values)
        return h, body
    return edit


def _gap_before(h, body, name):
    """8 bytes nobody's inserted before tensor ``name``: the offsets still add up to the file's end."""
    begin = h[name]["data_offsets"][0]
    for info in h.values():
        if isinstance(info, dict) and "data_offsets" in info and info["data_offsets"][0] >= begin:
            info["data_offsets"] = [x + 8 for x in info["data_offsets"]]
    return h, body[:begin] + b"\0" * 8 + body[begin:]


# safetensors files are read by vecbridge's own reader (each tensor straight into its array, no copy of the whole
# file); each of these is one the safetensors library refuses as well, and so must the reader
_ST_EDITS = {
    "truncated": lambda h, body: (h, body[:-4]),
    "trailing bytes": lambda h, body: (h, body + b"\0" * 4),
    "a gap before W": lambda h, body: _gap_before(h, body, "W"),
    "W's shape larger than its bytes": _edit_tensor("W", shape=[6, 7]),
    "W's shape negative": _edit_tensor("W", shape=[-6, -6]),
    "W's shape a float": _edit_tensor("W", shape=[6.0, 6]),
    "W past the end": _edit_tensor("W", data_offsets=[0, 1 << 40]),
    "W an unknown dtype": _edit_tensor("W", dtype="BF16"),
    "two tensors on the same bytes": lambda h, body: ({**h, "W2": h["W"]}, body),
}


@pytest.mark.parametrize("case", list(_ST_EDITS))
def test_damaged_safetensors_artifact_is_refused(maps, case, tmp_path):
    header, body = _st_parts(maps["linear"].to_bytes("safetensors"))
    blob = _st(*_ST_EDITS[case](header, body))
    with pytest.raises(SerializationError):
        align.map_from_bytes(blob)
    (tmp_path / "m.safetensors").write_bytes(blob)
    with pytest.raises(SerializationError):
        align.load_map(tmp_path / "m.safetensors")


@pytest.mark.parametrize("fmt", ["npz", "safetensors"])
def test_a_damaged_map_file_is_refused(maps, fmt, tmp_path):
    """A map read straight from its file (``load_map``, the registry) refuses what its bytes would: a file cut short
    (at its start, its middle, its last 30 bytes), and (npz: zip members carry a CRC) a changed byte of W."""
    for kind in ("linear", "cluster"):
        m, path = maps[kind], tmp_path / f"m.{fmt}"
        blob = m.to_bytes(fmt)
        for cut in (10, len(blob) // 2, len(blob) - 30):
            path.write_bytes(blob[:cut])
            with pytest.raises(SerializationError):
                align.load_map(path)
        if fmt == "npz":
            at = blob.index(m.W.tobytes()[:16])
            path.write_bytes(blob[:at] + bytes([blob[at] ^ 1]) + blob[at + 1 :])
            with pytest.raises(SerializationError, match="CRC"):
                align.load_map(path)


# A chain's npz artifact holds its steps' own npz artifacts (stored, not compressed). zipfile reads the LAST end
# record it finds and takes whatever precedes the archive that record describes as prepended data, so a chain file
# cut anywhere after a step's end record loaded as that step alone (a 6 -> 6 map where a 6 -> 6 -> 6 chain was
# stored, and a cluster map's routing lost): silently, through load_map, MapChain.load and map_from_bytes alike.
def _chain(maps, fmt: str) -> tuple[bytes, list[int]]:
    """A linear -> cluster chain's artifact and where each step's own artifact ends inside it (npz: the cuts that
    leave a whole archive at the end of the file)."""
    chain = align.MapChain([maps["linear"], maps["cluster"]])
    blob = chain.to_bytes(fmt)
    ends = [blob.index(s.to_bytes(fmt)) + len(s.to_bytes(fmt)) for s in chain.steps] if fmt == "npz" else []
    return blob, ends


@settings(max_examples=150, deadline=None)
@given(cut=st.floats(0, 1, exclude_max=True), fmt=st.sampled_from(["npz", "safetensors"]))
def test_a_chain_cut_short_anywhere_is_refused_not_read_as_a_step(maps, cut, fmt):
    blob, _ = _chain(maps, fmt)
    with pytest.raises(SerializationError):
        align.map_from_bytes(blob[: max(1, int(cut * len(blob)))])


@pytest.mark.parametrize("fmt", ["npz", "safetensors"])
def test_a_chain_file_cut_at_a_steps_end_is_refused(maps, fmt, tmp_path):
    """The cuts that leave a step's whole archive last in the file (and a byte either side) through every reader of a
    file; the whole file still loads as the chain."""
    blob, ends = _chain(maps, fmt)
    path = tmp_path / f"c.{fmt}"
    for cut in [c + d for c in ends for d in (-1, 0, 1)] + [len(blob) // 2, len(blob) - 1]:
        path.write_bytes(blob[:cut])
        for read in (align.load_map, align.MapChain.load, lambda p: align.map_from_bytes(p.read_bytes())):
            with pytest.raises(SerializationError):
                read(path)
    path.write_bytes(blob)
    assert [align.map_kind(s) for s in align.load_map(path).steps] == ["linear", "cluster"]


@pytest.mark.parametrize("edit", [lambda b: b + b"\0" * 7, lambda b: b + b, lambda b: b[:-1]],
                         ids=["bytes after", "an archive before", "last byte cut"])
def test_an_npz_artifact_that_is_not_one_whole_archive_is_refused(maps, edit):
    """Every npz reader (maps of each kind, steers) refuses an archive whose zip directory does not span the file:
    zipfile took bytes before or after it as none of its business."""
    from align.steer import MeanShift, Steer

    for obj, read in [(m, align.map_from_bytes) for m in maps.values()] + [
            (Steer(np.ones((4, 2)), np.ones((4, 2))), Steer.from_bytes), (MeanShift(np.ones(4)), MeanShift.from_bytes)]:
        blob = obj.to_bytes("npz") if read is align.map_from_bytes else obj.to_bytes()
        with pytest.raises(SerializationError, match="npz archive|zip"):
            read(edit(blob))
        read(blob)


def test_an_npz_past_zip64s_threshold_loads_and_cut_short_is_refused(maps, monkeypatch):
    """zipfile writes a zip64 end record once the directory starts past 2 GiB (``ZIP64_LIMIT``, lowered here so a
    small map takes that form): the whole-archive check read its directory from the plain end record and refused a
    2-4 GiB cluster map the code had just written."""
    import zipfile

    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 64)
    for m in maps.values():
        blob = m.to_bytes("npz")
        assert zipfile.stringEndArchive64 in blob  # the zip64 form
        assert align.map_kind(align.map_from_bytes(blob)) == align.map_kind(m)
        for cut in (len(blob) - 1, len(blob) - 30, len(blob) // 2):
            with pytest.raises(SerializationError):
                align.map_from_bytes(blob[:cut])
        with pytest.raises(SerializationError):
            align.map_from_bytes(blob + b"\0" * 5)


def test_artifacts_an_older_release_stored_still_load():
    """The artifacts of the upgrade fixture (a data dir written by release a9b56d8) pass the whole-archive check."""
    from pathlib import Path

    from align.steer import Steer

    data = Path(__file__).resolve().parents[1] / "fixtures" / "upgrade_a9b56d8" / "data"
    files = sorted(data.glob("artifacts/*/*"))
    assert {f.suffix for f in files} == {".npz", ".safetensors"}
    for f in files:
        obj = Steer.load(f) if f.suffix == ".npz" else align.load_map(f)
        assert obj.to_bytes() if f.suffix == ".npz" else obj.W.size
