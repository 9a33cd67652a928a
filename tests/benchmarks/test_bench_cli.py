"""The benchmark scripts' small promises: their tables' summaries, their command lines (a bad value is refused
with a message, --help prints the usage) and the files they leave behind."""

from __future__ import annotations

import pytest
from conftest import load_benchmark


def test_align_table_shows_the_lowest_criterion_as_the_worst_seed(capsys):
    """The criterion is higher-is-better (MiniVec2Vec.criterion_), but the table summarised it as lower-is-better:
    its "worst seed" was the best one."""
    bench = load_benchmark("bench_align")
    rows = [{"seed": s, "criterion": c, "top1": t, "mean_rank": r}
            for s, c, t, r in ((0, 0.020, 0.9, 1.0), (1, 0.050, 0.5, 3.0))]
    bench.print_table("a:b", {"vecbridge": rows})
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("vecbridge"))
    assert "0.035±0.015 (w 0.020)" in line  # criterion: the lower seed
    assert "0.700±0.200 (w 0.500)" in line and "2.0±1.0 (w 3.0)" in line  # top-1 and mean rank, as before


@pytest.mark.parametrize("pairs", ["0", "-5"])
def test_fit_time_refuses_fewer_than_one_pair(pairs, tmp_path, capsys):
    """``--pairs -5`` sliced rows from the end (``X[:-5]``: nearly all of them) and ``--pairs 0`` failed inside
    the fit with a traceback; both are refused before any data is read, nothing written."""
    bench = load_benchmark("bench_fit_time")
    with pytest.raises(SystemExit) as e:
        bench.main(["--pairs", pairs, "--results", str(tmp_path)])
    assert e.value.code == 2
    assert f"--pairs must be at least 1, got {pairs}" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_backup_benchmark_names_the_default_the_cli_has():
    """bench_backup.py's docstring called hard links "the default"; ``vecbridge backup`` copies by default."""
    from click.testing import CliRunner

    from service.cli import cli

    help_text = CliRunner().invoke(cli, ["backup", "--help"]).output
    assert "[default: copy]" in help_text
    doc = " ".join(load_benchmark("bench_backup").__doc__.split())
    assert "``--copy`` (the default," in doc and "file system, the default" not in doc
