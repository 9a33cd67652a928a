"""What the long offline commands write besides their result: ``--json`` is the result alone on stdout with
nothing on stderr (no progress bar), and the files they write are the user's to share as ``np.save`` would."""

from __future__ import annotations

import json
import os
import stat

import numpy as np
import pytest
from conftest import run_cli as run
from conftest import run_cli_on_a_terminal

from service.io import write_vectors


@pytest.fixture
def data(tmp_path):
    """16-d paired rows: target = rotated source + noise, 900 rows."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(900, 16))
    write_vectors(tmp_path / "src.npy", X)
    Q = np.linalg.qr(rng.normal(size=(16, 16)))[0]
    write_vectors(tmp_path / "tgt.npy", X @ Q + 0.05 * rng.normal(size=X.shape))
    return tmp_path


def test_json_is_the_result_alone_and_draws_no_progress(capsys, data):
    """``fit``, ``transform``, ``index create`` / ``add`` and ``plan`` with ``--json`` drew their progress bars on
    stderr all the same (``--quiet`` was needed too); a job runner that merges the two streams got bar frames around
    the JSON. Now ``--json`` is as quiet as ``--quiet``: stdout parses, stderr is empty."""
    var = ["--data-dir", data / "var"]
    commands = [
        ["fit", "--source", data / "src.npy", "--target", data / "tgt.npy", "--method", "procrustes", "--name", "m"],
        ["transform", "--map", "m", data / "src.npy", data / "out.npy"],
        ["index", "create", "docs", "--space", "tgt", data / "tgt.npy"],
        ["index", "add", "docs", data / "out.npy"],
        ["plan", "--old", data / "src.npy", "--probe-source", data / "src.npy", "--probe-target", data / "tgt.npy",
         "--probe-rows", "0:300"],
    ]
    for args in commands:
        code, out, err = run(capsys, *var, *args, "--json")
        assert code == 0, (args[0], err)
        assert isinstance(json.loads(out), dict) and err == "", (args[0], err)


def test_an_output_path_that_cannot_be_written_is_refused_before_the_work(capsys, data):
    """``fit --report PATH`` into a folder that could not be written (here a file stands where its folder would be;
    a read-only or immutable folder alike) fitted, registered the version, then failed: exit 2 with
    ``[Errno 17] File exists: 'src.npy'``, so the user, told it failed, fitted again and got version 2.
    ``plan --rows-out`` and ``index search --out`` computed everything first, then failed the same way. Now each
    path is checked first: exit 2, one line naming the option and the path, nothing registered or written."""
    bad = data / "src.npy" / "r"
    var = ["--data-dir", data / "var"]
    fit = ["fit", "--source", data / "src.npy", "--target", data / "tgt.npy", "--method", "procrustes"]
    code, _, err = run(capsys, *var, *fit, "--name", "m", "--report", bad.with_suffix(".html"))
    assert code == 2 and err.startswith("vecbridge: error: --report ") and len(err.splitlines()) == 1, err
    assert json.loads(run(capsys, *var, "registry", "list", "--json")[1])["maps"] == []

    code, _, err = run(capsys, *var, "plan", "--old", data / "src.npy", "--probe-source", data / "src.npy",
                       "--probe-target", data / "tgt.npy", "--probe-rows", "0:300", "--quiet",
                       "--rows-out", bad.with_suffix(".npy"))
    assert code == 2 and err.startswith("vecbridge: error: --rows-out ") and len(err.splitlines()) == 1, err

    assert run(capsys, *var, *fit, "--name", "m", "--quiet")[0] == 0
    assert run(capsys, *var, "index", "create", "docs", "--space", "tgt", data / "tgt.npy", "--quiet")[0] == 0
    code, _, err = run(capsys, *var, "index", "search", "docs", data / "tgt.npy", "--out", bad.with_suffix(".jsonl"))
    assert code == 2 and err.startswith("vecbridge: error: --out ") and len(err.splitlines()) == 1, err
    # transform's OUT: the error was ``[Errno 17] File exists: '.../src.npy'``, naming an input and not the output
    for out in (bad.with_suffix(".npy"), bad / "deeper" / "o.fvecs"):
        code, _, err = run(capsys, *var, "transform", "--map", "m", data / "src.npy", out, "--quiet")
        assert code == 2 and len(err.splitlines()) == 1, err
        assert err == f"vecbridge: error: the output {out}: cannot be written ({data / 'src.npy'} is a file, not a " \
                      "folder)\n", err
    assert sorted(p.name for p in data.iterdir()) == ["src.npy", "tgt.npy", "var"]
    # steer apply read (texts: embedded) and steered its input first, and only then found OUT unwritable; the
    # steer is unknown here, so an error about OUT shows that OUT is checked before anything else
    for out, start in ((data / "o.txt", "OUT "), (bad.with_suffix(".npy"), "OUT ")):
        code, _, err = run(capsys, *var, "steer", "apply", "--steer", "nosuch", data / "src.npy", out)
        assert code == 2 and err.startswith(f"vecbridge: error: {start}") and len(err.splitlines()) == 1, err


def test_an_output_path_that_names_an_input_file_is_refused_and_the_input_kept(capsys, data):
    """An output path naming one of the command's own input files replaced that input with the result, exit 0:
    ``plan --rows-out`` equal to ``--old`` turned the corpus into an int64 row list, ``fit --report`` equal to
    ``--source`` turned the source vectors into HTML, ``index search --out`` equal to QUERIES replaced the
    queries by their hits, and ``transform`` / ``steer apply`` with OUT = INP (directly or through a symbolic link
    to it) replaced the input with the mapped rows (with ``--rows``, all the rows not selected were lost too).
    Now each is exit 2 with one line naming the option, before any work, and the input is byte for byte kept."""
    var = ["--data-dir", data / "var"]
    src, tgt = data / "src.npy", data / "tgt.npy"
    np.savez(data / "queries.npz", q=np.load(src)[:5])
    before = {p: p.read_bytes() for p in (src, tgt, data / "queries.npz")}
    (data / "link.npy").symlink_to(src)
    fit = ["fit", "--source", src, "--target", tgt, "--method", "procrustes"]
    code, _, err = run(capsys, *var, *fit, "--name", "m", "--report", tgt)
    assert code == 2 and err.startswith("vecbridge: error: --report ") and len(err.splitlines()) == 1, err
    assert json.loads(run(capsys, *var, "registry", "list", "--json")[1])["maps"] == []
    assert run(capsys, *var, *fit, "--name", "m", "--quiet")[0] == 0
    assert run(capsys, *var, "index", "create", "docs", "--space", "tgt", tgt, "--quiet")[0] == 0
    np.save(data / "labels.npy", np.where(np.load(src)[:, 0] > 0, 1, -1))
    assert run(capsys, *var, "steer", "fit", "--space", "src", "--vectors", src, "--labels", data / "labels.npy",
               "--name", "s", "--quiet")[0] == 0
    cases = [
        ("--rows-out ", ["plan", "--old", src, "--probe-source", src, "--probe-target", tgt, "--probe-rows", "0:300",
                         "--quiet", "--rows-out", src]),
        ("--out ", ["index", "search", "docs", data / "queries.npz", "--out", data / "." / "queries.npz"]),
        ("the output ", ["transform", "--map", "m", src, src, "--rows", "0:10", "--quiet"]),
        ("the output ", ["transform", "--map", "m", data / "link.npy", src, "--quiet"]),
        ("OUT ", ["steer", "apply", "--steer", "s", src, src]),
    ]
    for start, args in cases:
        code, _, err = run(capsys, *var, *args)
        assert code == 2 and err.startswith(f"vecbridge: error: {start}") and len(err.splitlines()) == 1, (args, err)
        assert "would replace the input" in err, err
    assert {p: p.read_bytes() for p in before} == before


@pytest.mark.parametrize("suffix", [".npy", ".fvecs", ".parquet"])
def test_a_transform_output_has_the_mode_any_file_of_the_user_gets(capsys, data, suffix):
    """``transform``'s output was created 0600 whatever the umask (its temporary file's mode, kept by the rename),
    where ``np.save``, ``plan --rows-out`` and every other tool give 0644 under the usual umask 022: the service
    account or teammate meant to read the migrated vectors got 'Permission denied'."""
    var = ["--data-dir", data / "var"]
    assert run(capsys, *var, "fit", "--source", data / "src.npy", "--target", data / "tgt.npy", "--method",
               "procrustes", "--name", "m", "--quiet")[0] == 0
    old = os.umask(0o022)
    try:
        assert run(capsys, *var, "transform", "--map", "m", data / "src.npy", data / f"out{suffix}", "--quiet")[0] == 0
        np.save(data / "np.npy", np.zeros(3))
    finally:
        os.umask(old)
    mode = stat.S_IMODE((data / f"out{suffix}").stat().st_mode)
    assert mode == stat.S_IMODE((data / "np.npy").stat().st_mode) == 0o644


def test_every_file_format_a_help_text_names_is_one_the_commands_read():
    """``eval --queries`` promised ``.npy/.npz/.safetensors/.parquet/...``; a ``.safetensors`` file was refused
    ("unsupported format .safetensors"). Every ``.suffix`` a help text names is one the file readers know."""
    import re

    import click

    from service.cli import cli
    from service.io import TEXT_SUFFIXES, VECTOR_SUFFIXES

    ctx, named = click.Context(cli), {}

    def walk(cmd, path):
        for text in [cmd.help or ""] + [getattr(p, "help", None) or "" for p in cmd.params]:
            for suffix in re.findall(r"(?<![\w.])\.[a-z][a-z0-9]{1,11}\b", text):
                named.setdefault(suffix, path)
        for name in cmd.list_commands(ctx) if isinstance(cmd, click.Group) else ():
            walk(cmd.get_command(ctx, name), f"{path} {name}")

    walk(cli, "vecbridge")
    assert ".npy" in named and ".parquet" in named
    assert {s: p for s, p in named.items() if s not in (*VECTOR_SUFFIXES, *TEXT_SUFFIXES)} == {}


def test_a_data_dir_with_no_registry_is_named_and_never_created(capsys, data):
    """A mistyped ``--data-dir`` made a new empty registry there: ``registry list`` said "(no maps)" and
    ``transform --map m`` "unknown map" about the wrong place, and the empty folder stayed behind. Now only the
    commands that create a registry make one; a list lists nothing and says there is no registry (stderr, not with
    ``--json``); every other command is one line naming the path, exit 2."""
    typo = data / "vra"
    for args in (["registry", "list"], ["steer", "list"], ["spaces"]):
        rc, out, err = run(capsys, "--data-dir", str(typo), *args)
        assert rc == 0 and out.startswith("(no ") and f"no registry at {typo / 'registry.sqlite'} yet" in err, err
        rc, out, err = run(capsys, "--data-dir", str(typo), *args, "--json")
        assert rc == 0 and err == "" and json.loads(out) in ([], {"maps": [], "spaces": []}, {"steers": []}), out
    reads = (["transform", "--map", "m", str(data / "src.npy"), str(data / "out.npy")],
             ["registry", "show", "m"], ["registry", "verify"], ["registry", "alias", "m", "prod", "1"],
             ["eval", "--map", "m", "--source", str(data / "src.npy"), "--target", str(data / "tgt.npy")],
             ["steer", "show", "s"])
    for args in reads:
        rc, out, err = run(capsys, "--data-dir", str(typo), *args)
        assert rc == 2 and err.startswith(f"vecbridge: error: no registry at {typo / 'registry.sqlite'}"), (args, err)
        assert len(err.splitlines()) == 1, err
    assert not typo.exists() and not (data / "out.npy").exists()
    rc, out, err = run(capsys, "--data-dir", str(typo), "fit", "--source", str(data / "src.npy"), "--target",
                       str(data / "tgt.npy"), "--method", "procrustes", "--name", "m", "--quiet")
    assert rc == 0 and (typo / "registry.sqlite").is_file(), err
    rc, out, err = run(capsys, "--data-dir", str(typo), "registry", "list")
    assert rc == 0 and out.startswith("m  ") and err == "", (out, err)


def test_deleting_the_version_an_alias_points_at_says_what_changes(capsys, data):
    """`registry delete m 1` with prod -> 1 printed only "deleted m:1": m@prod stopped resolving and a bare `m`
    moved to version 2, silently, and `registry verify` listed nothing. Now the delete warns (stderr) and verify
    lists the alias under aliases_on_deleted (legal: not a failure)."""
    fit = ["fit", "--source", str(data / "src.npy"), "--target", str(data / "tgt.npy"), "--method", "procrustes",
           "--name", "m", "--quiet"]
    var = ["--data-dir", str(data / "var")]
    assert run(capsys, *var, *fit)[0] == 0 and run(capsys, *var, *fit)[0] == 0
    assert run(capsys, *var, "registry", "alias", "m", "prod", "1")[0] == 0
    rc, out, err = run(capsys, *var, "registry", "delete", "m", "1")
    assert rc == 0 and out == "deleted m:1\n", out
    assert err.startswith("vecbridge: warning: alias(es) prod still point at m:1, so m@prod no longer resolve and a "
                          "bare 'm' is now m:2;"), err
    rc, out, err = run(capsys, *var, "registry", "verify")
    res = json.loads(out)
    assert rc == 0 and res["ok"] and res["aliases_on_deleted"] == ["m@prod -> 1"], res
    assert "aliases prod->1(deleted)" in run(capsys, *var, "registry", "list")[1]
    rc, out, err = run(capsys, *var, "registry", "delete", "m", "2")  # no alias on it: no warning
    assert rc == 0 and err == "", err


def test_removing_what_is_not_there_says_so(capsys, data):
    """`registry tag m 1 nokey --delete` said "deleted tag nokey", exit 0; `registry alias nope prod --delete` said
    "map 'nope' has no alias 'prod'" for a map that does not exist."""
    var = ["--data-dir", str(data / "var")]
    assert run(capsys, *var, "fit", "--source", str(data / "src.npy"), "--target", str(data / "tgt.npy"),
               "--method", "procrustes", "--name", "m", "--quiet")[0] == 0
    rc, out, err = run(capsys, *var, "registry", "tag", "m", "1", "nokey", "--delete")
    assert rc == 2 and out == "" and "m:1 has no tag 'nokey'; its tags: none (nothing deleted)" in err, (out, err)
    assert run(capsys, *var, "registry", "tag", "m", "1", "owner", "me")[0] == 0
    assert run(capsys, *var, "registry", "tag", "m", "1", "owner", "--delete")[1] == "deleted tag owner of m:1\n"
    rc, out, err = run(capsys, *var, "registry", "alias", "nope", "prod", "--delete")
    assert rc == 2 and "unknown map 'nope'" in err, err


@pytest.mark.parametrize("group", ["registry", "steer"])
def test_an_alias_named_as_the_help_writes_it_name_at_alias_is_accepted(capsys, data, group):
    """The help says "Point NAME@ALIAS at VERSION", but `registry alias m@prod 1` failed with "give a VERSION (or
    --delete)": 1 was taken for the ALIAS. NAME@ALIAS [VERSION] is now the same command as NAME ALIAS [VERSION]."""
    var = ["--data-dir", str(data / "var")]
    if group == "registry":
        fit = ["fit", "--source", str(data / "src.npy"), "--target", str(data / "tgt.npy"), "--method", "procrustes",
               "--name", "m", "--quiet"]
    else:
        np.save(data / "labels.npy", np.where(np.load(data / "src.npy")[:, 0] > 0, 1, -1))
        fit = ["steer", "fit", "--vectors", str(data / "src.npy"), "--labels", str(data / "labels.npy"), "--name",
               "m", "--space", "s", "--quiet"]
    assert run(capsys, *var, *fit)[0] == 0 and run(capsys, *var, *fit)[0] == 0
    rc, out, err = run(capsys, *var, group, "alias", "m@prod", "2")
    assert rc == 0 and out == "m@prod -> 2\n", (out, err)
    rc, out, err = run(capsys, *var, group, "alias", "m@prod", "1", "--expect", "2")
    assert rc == 0 and out == "m@prod -> 1\n", (out, err)
    assert "NAME@ALIAS at VERSION" in run(capsys, *var, group, "alias", "--help")[1]
    rc, out, err = run(capsys, *var, group, "alias", "m@prod", "1", "2")  # an alias named twice: which one?
    assert rc == 2 and "m@prod names the alias already" in err, err
    rc, out, err = run(capsys, *var, group, "alias", "m")
    assert rc == 2 and "give the ALIAS: NAME ALIAS VERSION or NAME@ALIAS VERSION" in err, err
    rc, out, err = run(capsys, *var, group, "alias", "m@prod", "--delete", "--expect", "1")
    assert rc == 0 and out == "deleted alias m@prod\n", (out, err)


def test_fit_auto_says_which_family_it_chose(capsys, data):
    """`fit --method auto` printed "..., auto, fit 1.2s)": the family held-out pairs chose was only in the JSON."""
    rc, out, err = run(capsys, "--data-dir", str(data / "var"), "fit", "--source", str(data / "src.npy"), "--target",
                       str(data / "tgt.npy"), "--method", "auto", "--name", "m")
    chosen = json.loads(run(capsys, "--data-dir", str(data / "var"), "registry", "show", "m", "--json")[1])[
        "metrics"]["selection"]["chosen"]
    assert rc == 0 and f", auto -> {chosen}, fit " in out, (out, err)


# a process whose stderr is closed (``vecbridge ... 2>&-``): Python starts it with ``sys.stderr`` None, as here
_NO_STDERR = """
import json, os, sys
os.close(2)
sys.stderr = None
from service.cli import main
print(json.dumps([main(args) for args in json.loads(sys.argv[1])]))
"""


def test_a_command_started_with_stderr_closed_runs_without_progress_bars(data):
    """With stderr closed (``2>&-``, as a daemon or cron job may start it) ``fit``, ``transform``, ``index create``
    and ``backup`` drew their progress bars on ``sys.stderr``, None there: exit 3 (``'NoneType' object has no
    attribute 'write'``) and nothing written. Now there is no bar and the command runs."""
    import subprocess
    import sys

    from _servers import ROOT

    var = str(data / "var")
    commands = [
        ["fit", "--source", data / "src.npy", "--target", data / "tgt.npy", "--method", "procrustes", "--name", "m"],
        ["transform", "--map", "m", data / "src.npy", data / "out.npy"],
        ["index", "create", "docs", "--space", "tgt", data / "tgt.npy"],
        ["backup", data / "bk"],
    ]
    argv = json.dumps([["--data-dir", var, *map(str, args)] for args in commands])
    p = subprocess.run([sys.executable, "-c", _NO_STDERR, argv], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, check=False)
    assert p.returncode == 0 and json.loads(p.stdout.splitlines()[-1]) == [0, 0, 0, 0], p.stdout
    assert "registered m:1" in p.stdout and (data / "out.npy").is_file() and (data / "bk" / "registry.sqlite").is_file()


def test_progress_bars_are_drawn_on_a_terminal_only(data):
    """With stderr into a pipe or a file (a cron job's or CI's log, ``2>&1 | cat > fit.log``) ``fit``,
    ``transform`` and ``backup`` drew their tqdm bars there all the same: ``\\r`` redraws and block characters in
    the log, the result line glued to the last bar. Now a bar is drawn only when stderr is a terminal: into a pipe
    stderr is empty; on a (pseudo-)terminal the bar is still there."""
    import subprocess
    import sys

    from _servers import ROOT

    var = ["--data-dir", str(data / "var")]
    fit = ["fit", "--source", str(data / "src.npy"), "--target", str(data / "tgt.npy"), "--method", "procrustes"]
    commands = [[*fit, "--name", "m"], ["transform", "--map", "m", str(data / "src.npy"), str(data / "out.npy")],
                ["backup", str(data / "bk")]]
    for args in commands:
        p = subprocess.run([sys.executable, "-m", "service.cli", *var, *args], cwd=ROOT, capture_output=True,
                           text=True, timeout=300, check=False)
        assert p.returncode == 0 and p.stderr == "", (args[0], p.stderr)
    code, out, err = run_cli_on_a_terminal(*var, *fit, "--name", "m2")
    assert code == 0 and "registered m2:1" in out, (out, err)
    assert "\r" in err and "%" in err and "fit" in err, err


def test_every_command_that_draws_progress_takes_quiet(capsys, data):
    """``vecbridge eval ... --quiet`` was "No such option '--quiet'" (exit 2) while fit, plan, transform and migrate
    took it, so a script passing --quiet to each step of the walk-through stopped at the gate. eval embeds text
    inputs as fit does and now draws the same bar, which --quiet (or --json) turns off; and every command whose
    code draws a progress bar takes --quiet."""
    import inspect

    import click

    from service.cli import cli

    def commands(group, path=()):
        ctx = click.Context(group)
        for name in group.list_commands(ctx):  # the lazy group imports each command when asked for it
            cmd = group.get_command(ctx, name)
            if isinstance(cmd, click.Group):
                yield from commands(cmd, (*path, name))
            else:
                yield (*path, name), cmd

    cmds = dict(commands(cli))
    assert ("eval",) in cmds and len(cmds) > 20
    drawing = [p for p, c in cmds.items() if "progress_bar(" in inspect.getsource(c.callback)
               or "_MigrationProgress(" in inspect.getsource(c.callback)]
    assert ("eval",) in drawing and ("fit",) in drawing
    missing = [" ".join(p) for p in drawing if "--quiet" not in {o for prm in cmds[p].params for o in prm.opts}]
    assert missing == []
    var = ["--data-dir", data / "var"]
    assert run(capsys, *var, "fit", "--source", data / "src.npy", "--target", data / "tgt.npy", "--rows", "0:600",
               "--method", "procrustes", "--name", "m", "--quiet")[0] == 0
    code, out, err = run(capsys, *var, "eval", "--map", "m", "--source", data / "src.npy", "--target",
                         data / "tgt.npy", "--rows", "600:900", "--min-top1", "0.5", "--quiet")
    assert code == 0 and "PASS" in out and err == "", err
