"""The package's shape: packages import each other without cycles, and modules stay small."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "evolrl"


def package_of(path: Path) -> str:
    """The top-level part of ``evolrl`` a file belongs to: its package, or the module itself."""
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def imported_parts(path: Path) -> set[str]:
    """The top-level parts of ``evolrl`` a file imports, at module level or inside functions."""
    parts = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        parts |= {name.split(".")[1] for name in names if name.startswith("evolrl.")}
    return parts


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        part = package_of(path)
        if part in ("__init__", "__main__"):
            continue
        graph.setdefault(part, set()).update(imported_parts(path) - {part})
    return graph


def test_the_package_level_import_graph_is_acyclic():
    graph = package_graph()
    assert {"training", "logprobs", "rewards", "algorithms", "data", "rollout"} <= graph.keys()
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as err:
        raise AssertionError(f"a cycle between packages: {' -> '.join(err.args[1])}") from err
    assert order.index("logprobs") < order.index("training")


def test_a_cycle_is_found():
    """The check above can fail: a graph with a cycle raises."""
    graph = package_graph() | {"algorithms": {"training"}}
    try:
        list(TopologicalSorter(graph).static_order())
    except CycleError:
        return
    raise AssertionError("no cycle found in a graph with one")


def test_the_pure_packages_import_neither_lightning_nor_vllm():
    for part in ("algorithms", "rewards", "metrics"):
        for path in (PACKAGE / part).rglob("*.py"):
            tree = ast.parse(path.read_text())
            names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
            names |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
            assert not {n for n in names if n.split(".")[0] in ("lightning", "vllm")}, path


def test_no_module_is_over_250_lines():
    """A module a newcomer reads in one sitting. Kept: code that outgrows it splits along a seam of its own, not into
    a neighbour that happens to have room (the update's step totals sit in ``update.py``, their one user)."""
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 250}
    assert not long, long


def test_every_training_module_is_read_by_the_package():
    """``training/`` is the Lightning side: each of its modules is imported by another module of the package (the
    step's parts by the module, ``export`` by the command line), none parked there.

    This replaces a count of its files, which said nothing true about the design and had begun to move code out of
    the package it belongs to (the reward's hooks to the top level)."""
    imported = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("evolrl.training."):
                imported.add(node.module.split(".")[2])
    modules = {p.stem for p in (PACKAGE / "training").glob("*.py")} - {"__init__"}
    assert modules <= imported, modules - imported
