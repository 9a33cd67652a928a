"""The CLI package (service/cli/): every command in the table resolves, and a command loads only its own module.

``service.cli.COMMANDS`` maps each command to ``module:attribute``; the group imports a module when
its command runs, so a registry command never pays for torch (the LM) or FastAPI (the server).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click

from service.cli import COMMANDS, cli, main

ROOT = Path(__file__).resolve().parents[3]


def test_every_command_in_the_table_resolves_and_is_listed(capsys):
    ctx = click.Context(cli)
    for name in COMMANDS:
        cmd = cli.get_command(ctx, name)
        assert isinstance(cmd, click.Command) and cmd.name == name, name
    assert main(["--help"]) == 0
    listed = capsys.readouterr().out
    assert all(f"  {name} " in listed for name in COMMANDS), listed


def test_a_registry_command_imports_neither_torch_nor_fastapi(tmp_path):
    probe = ("import json, sys; from service.cli import main; rc = main(sys.argv[1:]); "
             "print(json.dumps({'rc': rc, 'loaded': sorted(m for m in ('torch', 'fastapi', 'service.api', "
             "'service.cli.lm', 'service.cli.maps') if m in sys.modules)}))")
    p = subprocess.run([sys.executable, "-c", probe, "--data-dir", str(tmp_path / "var"), "registry", "list"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out == {"rc": 0, "loaded": []}, out


def test_a_port_out_of_range_or_a_bad_setting_is_refused_before_anything_starts(tmp_path, capsys, monkeypatch):
    """uvicorn bound --port 70000 to 70000 mod 65536 (and announced :70000); a bad VECBRIDGE_* variable was an
    'internal error' with pydantic's multi-line report. Both: one line, exit 2, no server."""
    d = ["--data-dir", str(tmp_path / "var")]
    assert main([*d, "serve", "--port", "70000"]) == 2
    assert "70000 is not in the range" in capsys.readouterr().err
    monkeypatch.setenv("VECBRIDGE_PORT", "70000")
    assert main([*d, "serve"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vecbridge: error: setting VECBRIDGE_PORT") and len(err.strip().splitlines()) == 1
    monkeypatch.delenv("VECBRIDGE_PORT")
    monkeypatch.setenv("VECBRIDGE_MALLOC_KEEP_MB", "-5")
    assert main([*d, "registry", "list"]) == 2
    assert "VECBRIDGE_MALLOC_KEEP_MB" in capsys.readouterr().err


def test_spaces_delete_removes_an_unused_space_and_names_what_holds_one(tmp_path, capsys):
    """`vecbridge spaces delete`: exit 0 for an unused space, exit 2 with one line naming the index in a used one
    (nothing removed), exit 1-or-2 with a message for an unknown one."""
    import numpy as np
    from conftest import run_cli

    d = ["--data-dir", str(tmp_path / "var")]
    vecs = tmp_path / "v.npy"
    np.save(vecs, np.random.default_rng(0).normal(size=(20, 4)).astype(np.float32))
    for name in ("typo", "kept"):
        assert run_cli(capsys, *d, "spaces", "add", name, "--dim", "4")[0] == 0
    assert run_cli(capsys, *d, "index", "create", "ix", "--space", "kept", str(vecs), "--quiet")[0] == 0
    rc, out, _ = run_cli(capsys, *d, "spaces", "delete", "typo")
    assert rc == 0 and out.strip() == "space typo (4-d) deleted"
    rc, _, err = run_cli(capsys, *d, "spaces", "delete", "kept")
    assert rc == 2 and "space 'kept' is used by index 'ix' (" in err and len(err.strip().splitlines()) == 1
    rc, _, err = run_cli(capsys, *d, "spaces", "delete", "typo")
    assert rc != 0 and "unknown space 'typo'" in err
    rc, out, _ = run_cli(capsys, *d, "spaces", "--json")
    assert [s["name"] for s in json.loads(out)] == ["kept"]


def test_an_index_that_cannot_be_loaded_still_holds_its_space(tmp_path, capsys):
    """`spaces delete` reads each index's meta.json, not its vectors: an index whose generation is damaged (it
    would not load) still keeps its space, and the refusal names it."""
    import numpy as np
    from conftest import run_cli

    d = ["--data-dir", str(tmp_path / "var")]
    vecs = tmp_path / "v.npy"
    np.save(vecs, np.random.default_rng(0).normal(size=(20, 4)).astype(np.float32))
    assert run_cli(capsys, *d, "spaces", "add", "kept", "--dim", "4")[0] == 0
    assert run_cli(capsys, *d, "index", "create", "ix", "--space", "kept", str(vecs), "--quiet")[0] == 0
    damaged = [f for f in (tmp_path / "var" / "indexes" / "ix").iterdir() if f.is_file() and f.name != "meta.json"
               and f.suffix in (".faiss", ".npz", ".json")]
    assert damaged
    for f in damaged:
        f.write_bytes(b"not an index")
    assert run_cli(capsys, *d, "index", "search", "ix", str(vecs), "--k", "1")[0] != 0  # it cannot be loaded
    rc, _, err = run_cli(capsys, *d, "spaces", "delete", "kept")
    assert rc == 2 and "space 'kept' is used by index 'ix' (" in err
