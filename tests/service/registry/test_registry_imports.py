"""The registry's modules import one another one way only: no cycle, not even through imports
written inside functions (those hide a cycle from a plain ``import``), and each module imports
first in a fresh interpreter."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PKG = ROOT / "service" / "registry"


def _graph() -> dict[str, set[str]]:
    """Module -> sibling modules it imports anywhere in its body (``from .x import``, ``from . import x``)."""
    mods = {p.stem for p in PKG.glob("*.py")}
    out = {}
    for m in mods:
        deps = set()
        for node in ast.walk(ast.parse((PKG / f"{m}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("service.registry."):
                deps.add(node.module.split(".")[2])
        out[m] = deps & mods
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done

    def visit(m, path):
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return path + [m, d]
            if d not in state and (c := visit(d, path + [m])):
                return c
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (c := visit(m, [])):
            return c
    return None


def test_registry_modules_import_one_way():
    g = {m: d for m, d in _graph().items() if m != "__init__"}
    assert _cycle(g) is None, f"import cycle in service/registry: {' -> '.join(_cycle(g))}"
    assert {m for m, d in g.items() if "core" in d} == set(), "only the package's __init__ may import core"


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_each_registry_module_imports_first_in_a_fresh_interpreter():
    code = "; ".join(f"subprocess.run([sys.executable, '-c', 'import service.registry.{p.stem}'], check=True)"
                     for p in sorted(PKG.glob("*.py")) if p.stem != "__init__")
    subprocess.run([sys.executable, "-c", f"import subprocess, sys; {code}"], check=True, cwd=ROOT)
