"""Texts sent for a space that records no encoder (one `fit --target-space e5` made): the refusal names the command
that binds one. QA: README's "Or do not migrate" collection search with ``"space": "e5"`` answered 404 "space 'e5' has
no encoder registered ... send vectors", and neither it nor README said how to register the model."""

from __future__ import annotations

import pytest

from service.ops.indexes import space_encoder
from service.registry import open_registry


def test_the_refusal_names_the_command_and_route_that_register_the_spaces_encoder(tmp_path):
    reg = open_registry(f"sqlite:///{tmp_path / 'registry.sqlite'}", tmp_path / "artifacts")
    try:
        reg.upsert_space("e5", 384)  # as a fit with --target-space e5 registers it
        with pytest.raises(Exception, match="has no encoder registered") as got:
            space_encoder(reg, "e5", lambda name: pytest.fail(f"no encoder to load, got {name}"))
        msg = str(got.value)
        assert "`vecbridge spaces add e5 --encoder NAME`" in msg and "POST /v1/spaces" in msg, msg
        assert getattr(got.value, "kind", None) == "not_found", got.value
    finally:
        reg.close()
