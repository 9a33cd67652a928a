"""A PostgreSQL registry as an operator runs it: several processes on one database, beside ``pg_dump`` and psql
sessions. Opening the registry must not lock its tables, a statement stuck behind another session's lock must end,
and a process must keep a bounded number of connections however many threads it runs."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import align
from service.registry import open_registry

pytestmark = pytest.mark.postgres
psycopg = pytest.importorskip("psycopg")


def _world(url: str, tmp_path):
    reg = open_registry(url, tmp_path / "artifacts")
    X = np.random.default_rng(0).standard_normal((40, 4)).astype(np.float32)
    reg.register_version("m", align.fit_procrustes(X, X), source_space="s", target_space="t", method="procrustes",
                         params={})
    return reg


def _in_thread(fn) -> tuple[threading.Thread, list]:
    out: list = []
    th = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    th.start()
    return th, out


def test_opening_the_registry_during_a_dump_neither_waits_nor_stalls_the_other_replicas(pg_url, tmp_path):
    # every open ran ALTER TABLE versions ADD COLUMN IF NOT EXISTS, which takes ACCESS EXCLUSIVE even when the
    # column exists: a replica, a worker or any CLI command started while pg_dump held its lock waited for the
    # whole dump, and its queued lock stopped every other replica's reads of versions meanwhile
    reg = _world(pg_url, tmp_path)
    dump = psycopg.connect(pg_url)  # what pg_dump does: one long transaction that has read the tables
    try:
        dump.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        dump.execute("SELECT count(*) FROM versions").fetchone()
        opener, opened = _in_thread(lambda: open_registry(pg_url, tmp_path / "artifacts"))
        opener.join(10)
        reader, read = _in_thread(lambda: reg.resolve("m").version)
        reader.join(10)
        assert opened and read == [1], "opening the registry waited for the dump, or made a replica wait"
        opened[0].close()
    finally:
        dump.rollback()
        dump.close()
        reg.close()


def test_a_registry_of_a_release_without_the_newer_columns_gets_them_on_open(pg_url, tmp_path):
    _world(pg_url, tmp_path).close()
    with psycopg.connect(pg_url, autocommit=True) as c:  # the tables as the release before map_kind made them
        c.execute("ALTER TABLE versions DROP COLUMN map_kind, DROP COLUMN n_clusters")
    reg = open_registry(pg_url, tmp_path / "artifacts")
    try:
        v = reg.get_version("m", 1)
        assert (v.map_kind, v.n_clusters) == ("linear", 0)
        assert type(reg.load_map("m:1")).__name__ == "LinearMap"
    finally:
        reg.close()
