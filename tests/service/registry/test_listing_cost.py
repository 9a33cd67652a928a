"""A page of maps (HTTP, the registry, describe_map, a bundle of named maps) costs the same few SQL statements
however many maps the registry holds: each used to load and judge every map (a query or three per map and per
version), so QA measured GET /v1/maps?limit=10 at 1 s and walking every page at 70 s for 5,000 maps."""

from __future__ import annotations

import numpy as np
import pytest
from _api_support import walk_pages

import align
from service.registry import open_registry
from service.registry.db import SQLiteDB
from service.registry.quality import SPLIT

GOOD = {"heldout_top1": 0.95, "heldout_n_candidates": 200, "heldout_n_queries": 200, "heldout_source": SPLIT,
        "reliable": True}
CHANCE = {**GOOD, "heldout_top1": 0.01}


@pytest.fixture
def statements(monkeypatch):
    """Every SQL statement any registry connection opened from now on runs (SQLite's trace callback)."""
    seen: list[str] = []
    connect = SQLiteDB._connect

    def traced(self):
        c = connect(self)
        c.set_trace_callback(seen.append)
        return c

    monkeypatch.setattr(SQLiteDB, "_connect", traced)
    return seen


def grow(reg, start: int, stop: int) -> None:
    """Maps m{start} .. m{stop - 1}: three versions each (one judged chance, one deleted, an alias on it)."""
    rng = np.random.default_rng(start)
    for i in range(start, stop):
        for j, metrics in enumerate((GOOD, CHANCE, GOOD)):
            q, _ = np.linalg.qr(rng.standard_normal((8, 8)))
            reg.register_version(f"m{i:03d}", align.LinearMap(q.astype(np.float32)), source_space="a",
                                 target_space="b", method="procrustes", params={}, metrics=metrics,
                                 alias="prod" if j == 0 else None)
        reg.delete_version(f"m{i:03d}", 1)


def cost(seen: list[str], fn) -> int:
    before = len(seen)
    fn()
    return len(seen) - before


def test_a_page_of_maps_costs_the_same_statements_at_any_size(tmp_path, statements):
    reg = open_registry(f"sqlite:///{tmp_path / 'r.sqlite'}", tmp_path / "artifacts")
    grow(reg, 0, 12)
    calls = {"page": lambda: reg.list_maps(after="m003", limit=4), "one": lambda: reg.list_maps(name="m005"),
             "first": lambda: reg.list_maps(limit=1), "every": lambda: reg.list_maps()}
    small = {k: cost(statements, f) for k, f in calls.items()}
    page = reg.list_maps(after="m003", limit=4)
    grow(reg, 12, 36)
    big = {k: cost(statements, f) for k, f in calls.items()}
    assert big == small and max(big.values()) <= 6, (small, big)
    assert reg.list_maps(after="m003", limit=4) == page == reg.list_maps()[4:8]
    assert [m["name"] for m in page] == ["m004", "m005", "m006", "m007"]
    assert page[0]["unreliable_versions"] == [2] and page[0]["path_version"] == 3  # prod is on deleted 1
    assert page[0]["aliases_on_deleted"] == ["prod"] and page[0]["n_live_versions"] == 2


def test_http_map_pages_and_a_map_cost_the_same_at_any_size(tmp_path, statements):
    from fastapi.testclient import TestClient

    from service.api import create_app
    from service.config import Settings

    app = create_app(Settings(data_dir=tmp_path / "data", api_keys={"k": ["read"]}, demo_on_empty=False,
                              log_level="WARNING"))
    h = {"Authorization": "Bearer k"}
    with TestClient(app) as client:
        reg = app.state.vb.registry
        grow(reg, 0, 10)

        def walk():
            pages = walk_pages(lambda cursor: client.get("/v1/maps?limit=3" + (f"&cursor={cursor}" if cursor else ""),
                                                         headers=h).json())
            return [m["name"] for page in pages for m in page["data"]]

        calls = {"page": lambda: client.get("/v1/maps?limit=3", headers=h).raise_for_status(),
                 "map": lambda: client.get("/v1/maps/m004", headers=h).raise_for_status()}
        small = {k: cost(statements, f) for k, f in calls.items()}
        walk_small = cost(statements, walk)
        grow(reg, 10, 40)
        big = {k: cost(statements, f) for k, f in calls.items()}
        assert big == small, (small, big)
        # every page of 3 costs what one did: 14 pages of 40 maps cost 14 times one page (it was 40 x 14 maps)
        assert cost(statements, walk) / walk_small <= 14 / 4 + 0.5
        assert walk() == [m["name"] for m in client.get("/v1/maps", headers=h).json()["data"]]
        one = client.get("/v1/maps/m004", headers=h).json()
        assert {k: v for k, v in one.items() if k != "resolved"} == reg.list_maps()[4]


def test_exporting_named_maps_reads_only_those(tmp_path, statements):
    from service.registry.bundle import export_bundle

    reg = open_registry(f"sqlite:///{tmp_path / 'r.sqlite'}", tmp_path / "artifacts")
    grow(reg, 0, 4)
    small = cost(statements, lambda: export_bundle(reg, tmp_path / "one.zip", ["m002", "m001", "m002"]))
    grow(reg, 4, 20)
    big = cost(statements, lambda: export_bundle(reg, tmp_path / "two.zip", ["m002", "m001"]))
    assert big == small, (small, big)
