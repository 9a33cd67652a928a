"""A space deleted while an index is built in it: before, the build committed into the deleted space (found by an
HTTP QA pass: DELETE /v1/spaces answered 200 during a 60,000-row HNSW build, the index then appeared in a space that
no longer existed, and a space re-created under the name with another width got a 64-d index in a 128-d space)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from service.errors import ConflictError
from service.indexes import IndexStore
from service.ops.indexes import RegistryResolver, create_index
from service.ops.maps import delete_space
from service.registry import NotFoundError, open_registry


@pytest.fixture
def world(tmp_path):
    reg = open_registry(f"sqlite:///{tmp_path / 'r.sqlite'}", tmp_path / "art")
    reg.register_space("sp", 8)
    yield reg, IndexStore(tmp_path / "indexes"), tmp_path
    reg.close()


def _rows(n=200):
    return np.random.default_rng(0).standard_normal((n, 8)).astype(np.float32)


def test_a_space_deleted_during_the_build_gets_no_index(world, monkeypatch):
    reg, store, tmp = world
    from service.indexes.space import SpaceIndex

    real = SpaceIndex.build

    def build_then_delete(*a, **kw):
        idx = real(*a, **kw)
        delete_space(reg, store, "sp")          # another request, while this build runs: nothing holds the space yet
        return idx
    monkeypatch.setattr(SpaceIndex, "build", staticmethod(build_then_delete))
    with pytest.raises(NotFoundError, match="sp"):
        create_index(RegistryResolver(reg), store, "ix", reg.get_space("sp"), _rows())
    assert store.spaces() == {} and not any((tmp / "indexes").glob(".create-*"))
    reg.register_space("sp", 16)                # re-created with another width: still nothing of the old one
    assert store.spaces() == {}


def test_a_space_re_created_with_another_width_during_the_build_refuses_the_index(world, monkeypatch):
    reg, store, _ = world
    from service.indexes.space import SpaceIndex

    real = SpaceIndex.build

    def build_then_swap(*a, **kw):
        idx = real(*a, **kw)
        delete_space(reg, store, "sp")
        reg.register_space("sp", 16)
        return idx
    monkeypatch.setattr(SpaceIndex, "build", staticmethod(build_then_swap))
    with pytest.raises(ConflictError, match="re-created as 16-d"):
        create_index(RegistryResolver(reg), store, "ix", reg.get_space("sp"), _rows())
    assert store.spaces() == {}


def test_a_delete_that_holds_the_store_lock_makes_the_commit_wait_and_then_refuse(world):
    """The other order: delete_space reads the indexes and deletes under the store lock, so a build finishing in
    that window waits for it and then sees the space gone (and a delete after the commit sees the index: 409)."""
    reg, store, _ = world
    errors: list[BaseException] = []
    with store.held_spaces() as spaces:
        assert spaces == {}
        t = threading.Thread(target=lambda: _create(reg, store, errors))
        t.start()
        t.join(timeout=1.0)
        assert t.is_alive()                     # built, waiting to commit
        reg.delete_space("sp", held_by=[])
    t.join(timeout=30)
    assert not t.is_alive() and len(errors) == 1 and isinstance(errors[0], NotFoundError)
    reg.register_space("sp", 8)
    create_index(RegistryResolver(reg), store, "ix", reg.get_space("sp"), _rows())
    with pytest.raises(ConflictError, match="index 'ix'"):
        delete_space(reg, store, "sp")


def _create(reg, store, errors):
    try:
        create_index(RegistryResolver(reg), store, "ix", reg.get_space("sp"), _rows())
    except BaseException as exc:  # noqa: BLE001 - handed to the test
        errors.append(exc)
