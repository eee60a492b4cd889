"""The package's import graph: no circles and no import from a lower layer into a higher one,
counting imports inside functions too (issue 29).

The layers, lowest first, are the pipeline of DESIGN.md: a module may import its own folder and
any folder below it, never one above. ``zoo`` (models) and ``data`` (shipped graphs) sit at the
bottom because they use nothing of remat's planner.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import networkx as nx

import remat

ROOT = Path(remat.__file__).parent
LAYERS = (
    "errors",
    "data",
    "zoo",
    "graph",
    "cost",
    "plans",
    "transforms",
    "solvers",
    "step",
    "capture",
    "lower",
    "api",
    "eager",
    "fit",
    "__init__",
    "bench",
    "cli",
)
"""Lowest first. ``__init__`` is the top-level package (``import remat``), which re-exports the
API; ``bench`` and ``cli`` may use it."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def imported(module: str, source: str, is_package: bool = False) -> set[str]:
    """Every remat module that ``module`` imports, at any depth of its code."""
    package = module if is_package else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [f"{target}.{alias.name}" for alias in node.names]
            found.update(name for name in names if name in MODULES)
            if not any(name in MODULES for name in names) and target in MODULES:
                found.add(target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in MODULES)
    found.discard(module)
    return found


def import_graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    graph.add_nodes_from(MODULES)
    for module, path in MODULES.items():
        targets = imported(module, path.read_text(), path.name == "__init__.py")
        graph.add_edges_from((module, target) for target in targets)
    return graph


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.index(parts[1] if len(parts) > 1 else "__init__")


def test_every_module_is_in_a_layer():
    folders = {module.split(".")[1] for module in MODULES if "." in module}
    assert folders <= set(LAYERS), f"place {sorted(folders - set(LAYERS))} in LAYERS"


def test_no_import_circles():
    circles = [sorted(c) for c in nx.strongly_connected_components(import_graph()) if len(c) > 1]
    assert circles == []


def test_no_upward_imports():
    upward = defaultdict(list)
    for a, b in import_graph().edges:
        if layer(b) > layer(a):
            upward[a].append(b)
    assert dict(upward) == {}


def test_the_check_sees_imports_inside_functions_and_relative_to_packages():
    source = "import torch\n\ndef f():\n    from .auto import solve\n    from ..plans import plan\n"
    assert imported("remat.solvers.search", source) == {"remat.solvers.auto", "remat.plans.plan"}
    assert imported("remat.solvers", "from .mincut import mincut\n", is_package=True) == {
        "remat.solvers.mincut.mincut"
    }
