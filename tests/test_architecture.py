"""The import rules of ARCHITECTURE.md, checked on the source (AST, nothing imported).

Layers, arrows pointing down only::

    face   service.api (routers, app), service.cli, service.ui, service.vectordb.__main__, and the Python
           client (service.client, service.client_*: how users reach the service over HTTP)
    ops    service.ops            one module per use-case family, called by every face
    store  the rest of service    registry, indexes, jobs, encoders, lm, vectordb, distributed, io, ...
    align  align                  pure numerics

A face may import ops, stores and align; ops may import stores and align; stores may import
stores and align; align imports no service. Besides: no router imports another router, the CLI
imports no router, nothing outside align imports align's private names (``align._x``,
``from align.x import _y``) or calls a ``._apply``, inside align only a class calls its own ``_apply``, and no
module is longer than 650 lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 650
RANK = {"align": 0, "store": 1, "ops": 2, "face": 3}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _sources(*tops: str):
    for top in tops:
        for p in sorted((ROOT / top).rglob("*.py")):
            yield p, _module_name(p)


def layer(mod: str) -> str | None:
    if mod == "align" or mod.startswith("align."):
        return "align"
    if not (mod == "service" or mod.startswith("service.")):
        return None
    top = mod.split(".")[1] if "." in mod else ""
    if top in ("api", "cli", "ui") or top == "client" or top.startswith("client_") or mod == "service.vectordb.__main__":
        return "face"
    if mod.startswith("service.ops"):
        return "ops"
    return "store"


def _imports(path: Path, mod: str):
    """``(line, imported module, imported names)`` of every import in ``path`` (relative ones resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [a.name for a in node.names]
            yield node.lineno, target, names
            for n in names:  # "from . import x" / "from .routers import steers" import modules too
                yield node.lineno, f"{target}.{n}", []


def _edges():
    for path, mod in _sources("align", "service"):
        for line, target, names in _imports(path, mod):
            yield path, mod, line, target, names


def test_layers_point_down():
    bad = []
    for path, mod, line, target, _ in _edges():
        a, b = layer(mod), layer(target)
        if a and b and RANK[b] > RANK[a]:
            bad.append(f"{path.relative_to(ROOT)}:{line} ({a}) imports {target} ({b})")
    assert bad == [], "\n".join(bad)


def test_no_face_imports_a_router_of_another_face_or_a_sibling_router():
    bad = []
    for path, mod, line, target, _ in _edges():
        if not target.startswith("service.api.routers.") or target == "service.api.routers.__init__":
            continue
        if mod.startswith("service.api.routers.") and target.split(".")[:4] == mod.split(".")[:4]:
            continue  # a router's own module
        if mod.startswith("service.api.routers.") or not mod.startswith("service.api"):
            bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert bad == [], "\n".join(bad)


def test_no_private_align_names_outside_align():
    bad = []
    for path, mod in _sources("service", "benchmarks", "tests"):
        if path.name == Path(__file__).name:
            continue
        for line, target, names in _imports(path, mod):
            private_mod = target.startswith("align.") and any(p.startswith("_") and p != "__init__"
                                                              for p in target.split(".")[1:])
            private_name = target.startswith("align") and any(n.startswith("_") for n in names)
            if private_mod or private_name:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target} {names}")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "_apply":
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} calls ._apply")
    assert bad == [], "\n".join(bad)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_uses_another_modules_private_names():
    """align and service modules used each other's underscore names (``Frame._fit``, ``knn._knn``,
    ``migration._Problem``, ``io._parquet_file``...): what another module needs has a public spelling. Neither
    ``from .x import _y`` nor ``Imported._y`` / ``imported.Class._y`` (a class or module bound by an import of align
    or service, or an attribute of one); a package-private module (``align._artifacts``, ``service.cli._common``)
    is its package's, and ``x as _x`` is a public name bound locally."""
    bad = []
    for path, mod in _sources("align", "service"):
        ours: set[str] = set()  # names this module binds to align / service classes and modules
        for line, target, names in _imports(path, mod):
            if not (layer(target) and names):
                continue
            bad += [f"{path.relative_to(ROOT)}:{line} imports {target}.{n}" for n in names if _private(n)]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or layer(node.module or "")):
                ours.update(a.asname or a.name for a in node.names)
            elif isinstance(node, ast.Import):
                ours.update((a.asname or a.name).split(".")[0] for a in node.names if layer(a.name))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and _private(node.attr) and (root := _dotted(node.value)) \
                    and root.partition(".")[0] in ours:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} uses {root}.{node.attr}")
    assert bad == [], "\n".join(bad)


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` of a chain of names and attributes (``mod.Class``, ``mod``), None for anything else (a call, an
    index): ``mod.Class._x`` is another module's private name as much as ``Class._x``."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def test_align_calls_no_apply_but_its_own():
    """align's plan checks (``unpaired_share``, the curve's folds), metrics, fits and frames called ``._apply`` of
    maps and frames of other modules (a private method as a package protocol): they call the public
    ``apply(..., validate=False)``, the same unchecked path; ``_apply`` is each class's own (``self._apply``)."""
    bad = []
    for path, _ in _sources("align"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr == "_apply"
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} calls ._apply")
    assert bad == [], "\n".join(bad)


def test_align_imports_no_service():
    bad = [f"{p.relative_to(ROOT)}:{line} imports {t}" for p, mod, line, t, _ in _edges()
           if layer(mod) == "align" and layer(t) not in (None, "align")]
    assert bad == []


@pytest.mark.parametrize("top", ["align", "service"])
def test_no_module_over_the_limit(top):
    long = {str(p.relative_to(ROOT)): n for p, _ in _sources(top)
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, long


def test_the_checks_see_the_tree():
    """The walk finds the layers it polices (a moved package would otherwise pass every test silently)."""
    layers = {layer(m) for _, m in _sources("align", "service")}
    assert layers == {"align", "store", "ops", "face"}
    edges = list(_edges())
    assert any(layer(m) == "face" and layer(t) == "ops" for _, m, _, t, _ in edges)
    assert any(m == "service.api.errors" and t == "service.errors" for _, m, _, t, _ in edges)
