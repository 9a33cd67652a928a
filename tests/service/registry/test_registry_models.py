"""The registry's records are defined once: rows decode by column name, records encode back to the
same columns, and the HTTP schemas are the records' fields."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from service.api.schemas import SpaceOut, SteerOut, VersionOut
from service.registry.db import Row
from service.registry.models import (SpaceInfo, SteerInfo, VersionInfo, columns, display_fields, from_row,
                                     to_columns)

_json = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                   max_size=3),
                     max_leaves=8)
_obj = st.dictionaries(st.text(max_size=6), _json, max_size=4)
_common = dict(name=st.text(min_size=1, max_size=10), version=st.integers(1, 2**31 - 1), method=st.text(max_size=10),
               params=_obj, random_state=st.none() | st.integers(-2**63, 2**63 - 1), data_hashes=_obj,
               package_version=st.text(max_size=8), created_at=st.text(max_size=30), metrics=_obj,
               artifact_sha256=st.text(max_size=64), artifact_path=st.text(max_size=20), aliases=st.just([]),
               deleted=st.booleans(), description=st.text(max_size=20), inputs=_obj)
versions = st.builds(VersionInfo, **_common, source_space=st.text(max_size=8), target_space=st.text(max_size=8),
                     source_dim=st.integers(1, 4096), target_dim=st.integers(1, 4096), tags=st.just({}),
                     report_path=st.none() | st.text(max_size=12),
                     artifact_format=st.sampled_from(["npz", "safetensors"]))
steers = st.builds(SteerInfo, **_common, space=st.text(max_size=8), dim=st.integers(1, 4096), rank=st.integers(0, 64),
                   lens=st.lists(_obj, max_size=3))


def _as_row(cls, rec) -> Row:
    """What the database hands back for ``rec``: its columns, shuffled into another order, by name."""
    cols = to_columns(cls, dataclasses.asdict(rec))
    order = sorted(cols)  # any order other than the record's: decoding must not depend on position
    return Row(tuple(cols[c] for c in order), {c: i for i, c in enumerate(order)})


@given(st.one_of(versions, steers))
def test_records_round_trip_through_their_columns(rec):
    cls = type(rec)
    assert set(to_columns(cls, dataclasses.asdict(rec))) == set(columns(cls))
    annotations = {"aliases": rec.aliases, **({"tags": rec.tags} if cls is VersionInfo else {})}
    assert from_row(cls, _as_row(cls, rec), **annotations) == rec


def test_rows_read_by_name_and_by_position():
    r = Row(("a", 3), {"name": 0, "version": 1})
    assert r["version"] == r[1] == 3 and dict(r) == {"name": "a", "version": 3} and tuple(r) == ("a", 3)


def test_schemas_are_the_records():
    for model, rec in ((VersionOut, VersionInfo), (SteerOut, SteerInfo), (SpaceOut, SpaceInfo)):
        assert tuple(model.model_fields) == display_fields(rec)
        required = {f.name for f in dataclasses.fields(rec)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        assert {n for n, f in model.model_fields.items() if f.is_required()} == required
    assert display_fields(VersionInfo)[:6] == ("name", "version", "source_space", "target_space", "source_dim",
                                               "target_dim")
