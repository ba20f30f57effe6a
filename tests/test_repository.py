"""What the repository promises about itself: docs cite commits only in provenance lines, every tool says what it is
for, tools stay a small share of the code, and the package holds no function that only tests or tools call."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
HEX = re.compile(r"\b[0-9a-f]{7,40}\b")
PROVENANCE = "Measured:"
"""The first word of a provenance line: the paragraph that names a figure's command, machine and commit."""


def commit_hashes(text: str) -> list[str]:
    """Tokens that read as abbreviated or full commit hashes: 7-40 hex characters with a digit and a letter (a word
    such as "decade" or a number such as "1234567" is neither)."""
    return [t for t in HEX.findall(text) if re.search(r"[0-9]", t) and re.search(r"[a-f]", t)]


def hashes_outside_provenance(text: str) -> list[str]:
    """The commit hashes of ``text`` (markdown) outside paragraphs that open with ``Measured:``."""
    return [h for paragraph in re.split(r"\n\s*\n", text) if not paragraph.lstrip().startswith(PROVENANCE)
            for h in commit_hashes(paragraph)]


def test_the_hash_check_finds_a_hash_in_prose_and_not_in_a_provenance_line():
    text = "The update got faster at 5b3ae82.\n\nMeasured: `python -m tools.bench.bench`, 2 cores,\ncommit 0f11577."
    assert hashes_outside_provenance(text) == ["5b3ae82"]
    assert hashes_outside_provenance("a decade, 1234567 steps, sha deadbeef") == []


@pytest.mark.parametrize("doc", sorted(p.relative_to(ROOT).as_posix() for p in [ROOT / "README.md",
                                                                                 *ROOT.glob("docs/*.md")]))
def test_docs_cite_commits_only_in_provenance_lines(doc):
    assert hashes_outside_provenance((ROOT / doc).read_text()) == [], (
        f"{doc}: a commit hash outside a paragraph that opens with {PROVENANCE!r}; move it into the provenance line "
        "of the table it belongs to, or into the doc's Measurement log as one")


def entry_points() -> list[str]:
    """The tools a user runs: ``python -m tools.<group>.<name>`` modules with a ``__main__`` block or package."""
    found = []
    for path in sorted((ROOT / "tools").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if path.name == "__main__.py":
            found.append(module.removesuffix(".__main__"))
        elif "__name__ == \"__main__\"" in path.read_text() and not (path.parent / "__main__.py").exists():
            found.append(module)
    return found


def test_every_tool_says_what_it_is_for():
    """``--help`` of each tool exits 0 and opens with the first line of the docstring of the module that holds its
    command (a package's ``__main__`` names that module in its own docstring)."""
    modules = entry_points()
    assert len(modules) >= 10
    runs = {m: subprocess.Popen([sys.executable, "-m", m, "--help"], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True) for m in modules}
    for module, run in runs.items():
        out, _ = run.communicate(timeout=300)
        assert run.returncode == 0, (module, out[-2000:])
        path = ROOT / Path(*module.split("."))
        if path.is_dir():
            path = path / re.search(r"``(\w+\.py)``", (path / "__main__.py").read_text()).group(1)
        doc = ast.get_docstring(ast.parse(path.with_suffix(".py").read_text())) or ""
        purpose = " ".join(doc.split()[:8])
        assert len(purpose.split()) == 8 and purpose in " ".join(out.split()), (module, purpose, out[:500])


def python_lines(root: Path) -> int:
    """Lines of the Python files under ``root``, as ``wc -l`` counts them."""
    return sum(len(path.read_text().splitlines()) for path in root.rglob("*.py"))


def test_tools_are_at_most_a_quarter_of_the_code():
    """The non-test code is the package and the tools; tests/ holds the test harnesses (``fsdp_ranks.py``)."""
    package, tools = python_lines(ROOT / "evolrl"), python_lines(ROOT / "tools")
    assert tools <= 0.25 * (package + tools), (
        f"tools/ holds {tools} of {package + tools} lines ({tools / (package + tools):.1%}): retire a one-off "
        "measurement whose result the docs hold, or fold a repeated piece into tools/common.py")


def package_functions_used_only_outside() -> list[str]:
    """Top-level functions of ``evolrl/`` whose name no module of the package uses (an ``__init__`` re-export does
    not count as a use)."""
    defined, used = {}, set()
    for path in (ROOT / "evolrl").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defined[node.name] = path.relative_to(ROOT).as_posix()
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                used.add(node.id)
            elif isinstance(node, ast.Attribute):
                used.add(node.attr)
            elif isinstance(node, ast.ImportFrom) and path.name != "__init__.py":
                used.update(alias.name for alias in node.names)
    return sorted(f"{file}: {name}" for name, file in defined.items() if name not in used)


def test_the_package_holds_no_function_only_tests_or_tools_call():
    assert package_functions_used_only_outside() == []
