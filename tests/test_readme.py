"""The README's walk-through runs as written: every ```bash block after ``<!-- readme-test -->``
is executed by bash (``set -e``) in a scratch copy of the layout (the repository beside ``shared/``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]


def readme_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"<!-- readme-test -->\s*```bash\n(.*?)```", text, flags=re.S)


def test_readme_marks_its_walk_through():
    blocks = readme_blocks()
    assert blocks and all("vecbridge" in b for b in blocks)


@pytest.mark.parametrize("i", range(len(readme_blocks())))
def test_readme_block_runs_as_written(tmp_path, i, wordnet_dir):
    """The shared WordNet set, or the sample the tests embed when it is absent, stands at ../shared/data/wordnet."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (tmp_path / "shared" / "data").mkdir(parents=True)
    os.symlink(wordnet_dir, tmp_path / "shared" / "data" / "wordnet")
    vecbridge = shutil.which("vecbridge") or f"{sys.executable} -c 'from service.cli import main; main()'"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    script = f"set -euo pipefail\nvecbridge() {{ {vecbridge} \"$@\"; }}\n" + readme_blocks()[i]
    r = subprocess.run(["bash", "-c", script], cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"README block {i} failed (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert "PASS" in r.stdout and "minilm-e5:1" in r.stdout
    assert (repo / "migrated.npy").exists()


def test_migration_walk_through_names_e5s_query_and_passage_prefixes():
    """The walk-through told users to embed their own queries for the new model (e5) without its "query: " /
    "passage: " convention; queries embedded in passage form measured retention 0.686 instead of 0.772 on WordNet and
    still passed the 0.6 gate, so nothing flagged the worse migration."""
    text = (ROOT / "README.md").read_text()
    walk = text[text.index("## Migrating a corpus to a new model"):]
    walk = walk[:walk.index("vecbridge eval --map minilm-e5@prod")]
    assert '"query: "' in walk and '"passage: "' in walk
