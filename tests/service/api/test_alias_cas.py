"""Compare-and-set alias moves over HTTP, the Python client and the CLI, for maps and steers.

``PUT .../aliases/{alias}`` was last-writer-wins: two deploy tools moving ``prod`` both got 200, and one silently
undid the other's move. With ``expected_version`` the move happens only while the alias points there (0: only
while it is not set), else 409 naming where it points; ``vecbridge ... alias --expect N`` exits 2 with the same
message. Real server (uvicorn in a thread), real SQLite registry.
"""

from __future__ import annotations

import numpy as np
import pytest
from _api_support import settings_for
from _servers import serve_in_thread
from conftest import run_cli

from align import Steer
from service.client import Client, ConflictError, ValidationError
from service.registry import open_registry


@pytest.fixture
def served(tmp_path):
    from _servers import seed_registry

    from service.api import create_app

    data = tmp_path / "data"
    seed_registry(data)
    reg = open_registry(f"sqlite:///{(data / 'registry.sqlite').resolve()}", (data / "artifacts").resolve())
    reg.register_version("a2b", reg.load_map(reg.resolve("a2b:1")), source_space="a", target_space="b",
                         method="procrustes", params={})  # version 2
    rng = np.random.default_rng(1)
    for _ in range(2):
        reg.register_steer("pos", Steer(rng.normal(size=(16, 2)), rng.normal(size=(16, 2)), {}), space="a",
                           params={})
    reg.close()
    with serve_in_thread(create_app(settings_for(tmp_path, data_dir=data))) as url, \
            Client(url, api_key="wkey-456") as vb:
        yield vb, data


@pytest.mark.parametrize("kind", ["map", "steer"])
def test_an_alias_moves_only_from_the_version_the_caller_saw(served, kind):
    vb, _ = served
    name, set_alias, get = ("a2b", vb.set_alias, vb.get_map) if kind == "map" else \
        ("pos", vb.set_steer_alias, vb.get_steer)
    set_alias(name, "prod", 1, expected=0)  # create: only while unset
    with pytest.raises(ConflictError, match="points at version 1, expected it not to be set"):
        set_alias(name, "prod", 2, expected=0)
    with pytest.raises(ConflictError, match="points at version 1, expected it to point at version 2"):
        set_alias(name, "prod", 2, expected=2)
    set_alias(name, "prod", 2, expected=1)
    with pytest.raises(ConflictError) as err:  # a second tool that also saw version 1: refused, nothing undone
        set_alias(name, "prod", 1, expected=1)
    assert err.value.status == 409 and "not moved" in err.value.message
    ref = get(f"{name}@prod")
    assert (ref.get("resolved") or ref)["version"] == 2
    with pytest.raises(ValidationError):
        set_alias(name, "prod", 1, expected=-1)
    set_alias(name, "prod", 1)  # without expected: last writer wins, as before
    ref = get(f"{name}@prod")
    assert (ref.get("resolved") or ref)["version"] == 1


def test_the_cli_expect_option_exits_2_with_the_message(served, capsys):
    _, data = served
    d = ["--data-dir", data]
    code, out, _ = run_cli(capsys, *d, "registry", "alias", "a2b", "prod", "2", "--expect", "0")
    assert code == 0 and "a2b@prod -> 2" in out
    code, _, err = run_cli(capsys, *d, "registry", "alias", "a2b", "prod", "1", "--expect", "1")
    assert code == 2 and "points at version 2, expected it to point at version 1" in err
    code, _, err = run_cli(capsys, *d, "steer", "alias", "pos", "prod", "2", "--expect", "3")
    assert code == 2 and "is not set, expected it to point at version 3" in err


def test_the_cli_expect_option_guards_a_removal(served, capsys):
    """``... alias NAME ALIAS --delete --expect N`` removed the alias wherever it pointed (``--expect`` was read only
    for moves). Now the removal holds only while it points at N, else exit 2 naming where it points."""
    _, data = served
    d = ["--data-dir", data]
    assert run_cli(capsys, *d, "registry", "alias", "a2b", "prod", "2")[0] == 0
    code, _, err = run_cli(capsys, *d, "registry", "alias", "a2b", "prod", "--delete", "--expect", "1")
    assert code == 2 and "points at version 2, expected it to point at version 1: not removed" in err
    assert run_cli(capsys, *d, "registry", "show", "a2b@prod")[0] == 0  # still there
    code, _, err = run_cli(capsys, *d, "steer", "alias", "pos", "prod", "--delete", "--expect", "0")
    assert code == 2 and "--expect 0" in err
    assert run_cli(capsys, *d, "registry", "alias", "a2b", "prod", "--delete", "--expect", "2")[0] == 0
    assert run_cli(capsys, *d, "registry", "show", "a2b@prod")[0] != 0


def test_a_version_given_with_delete_guards_the_removal(served, capsys):
    """``registry alias a2b prod 1 --delete`` ignored the 1 and removed prod while it pointed at 2. The VERSION is now
    the removal's guard, as ``--expect`` is; both at once must agree."""
    _, data = served
    d = ["--data-dir", data]
    assert run_cli(capsys, *d, "registry", "alias", "a2b", "prod", "2")[0] == 0
    code, _, err = run_cli(capsys, *d, "registry", "alias", "a2b", "prod", "1", "--delete")
    assert code == 2 and "points at version 2, expected it to point at version 1: not removed" in err
    assert run_cli(capsys, *d, "registry", "show", "a2b@prod")[0] == 0
    code, _, err = run_cli(capsys, *d, "registry", "alias", "a2b", "prod", "2", "--delete", "--expect", "1")
    assert code == 2 and "give one of them" in err
    assert run_cli(capsys, *d, "registry", "alias", "a2b", "prod", "2", "--delete")[0] == 0
    assert run_cli(capsys, *d, "registry", "show", "a2b@prod")[0] != 0
