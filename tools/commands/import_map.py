"""Draw the package's import map: which part of ``evolrl/`` imports which, as a mermaid diagram.

    python -m tools.commands.import_map            # print the diagram
    python -m tools.commands.import_map --write    # put it into docs/architecture.md, between its two markers

A part is a package of ``evolrl/`` or a module at its top; an arrow ``A --> B`` says that a file of A imports B, at
module level or inside a function, as ``tests/test_layout.py`` reads imports. An arrow that a longer way already
implies is left out, so each part stands below everything it imports. ``tests/test_architecture_doc.py`` fails when
docs/architecture.md's diagram is not this command's output for the code as it stands.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

from tools.common import ROOT

PACKAGE = ROOT / "evolrl"
DOC = ROOT / "docs" / "architecture.md"
START, END = "<!-- import map: python -m tools.commands.import_map --write -->", "<!-- end of the import map -->"


def imports() -> dict[str, set[str]]:
    """Each part of ``evolrl`` (``__init__`` and ``__main__`` aside) and the other parts its files import."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        part = path.relative_to(PACKAGE).parts[0]
        if part in ("__init__.py", "__main__.py"):
            continue
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                module = node.module or ""
                names |= {f"evolrl.{a.name}" for a in node.names} if module == "evolrl" else {module}
            elif isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
        used = {name.split(".")[1] for name in names if name.startswith("evolrl.")}
        graph.setdefault(part, set()).update(used - {part.removesuffix(".py")})
    return {part: {p for p in graph if p.removesuffix(".py") in used} for part, used in graph.items()}


def below(graph: dict[str, set[str]], part: str) -> set[str]:
    """The parts ``part`` imports, directly or through others."""
    seen, todo = set(), list(graph[part])
    while todo:
        if (p := todo.pop()) not in seen:
            seen.add(p)
            todo += graph[p]
    return seen


def reduced(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` without the arrows a longer way implies (its transitive reduction; the graph has no cycle)."""
    return {a: {b for b in bs if not any(b in below(graph, c) for c in bs - {b})} for a, bs in graph.items()}


def mermaid(graph: dict[str, set[str]]) -> str:
    """The diagram, top floor first (a package as ``name/``, a module as ``name.py``), then what each part imports."""
    # More parts below it first: a part that imports another has every part below that one below it too.
    order = sorted(graph, key=lambda p: (-len(below(graph, p)), p))
    short = {part: part.removesuffix(".py") for part in graph}
    label = {part: part if part.endswith(".py") else part + "/" for part in graph}
    lines = ["```mermaid", "flowchart TD"]
    lines += [f'  {short[p]}["{label[p]}"]' for p in order]
    lines += [f"  {short[a]} --> {short[b]}" for a in order for b in sorted(reduced(graph)[a], key=order.index)]
    lines += ["```", "", "| part | every part it imports |", "|---|---|"]
    lines += [f"| `{label[p]}` | {', '.join(f'`{label[q]}`' for q in sorted(graph[p], key=order.index)) or '-'} |"
              for p in order]
    return "\n".join(lines)


def written(doc: str, diagram: str) -> str:
    """``doc`` with ``diagram`` between its two markers."""
    head, rest = doc.split(START, 1)
    return f"{head}{START}\n\n{diagram}\n\n{END}{rest.split(END, 1)[1]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write it into {DOC.relative_to(ROOT)}")
    diagram = mermaid(imports())
    if parser.parse_args().write:
        DOC.write_text(written(DOC.read_text(), diagram))
    else:
        print(diagram)


if __name__ == "__main__":
    main()
