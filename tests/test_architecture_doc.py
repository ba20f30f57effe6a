"""docs/architecture.md against the code: its import map is the code's, every file it names exists, every class and
function its step table names is defined in a file of that row, and the README links it on its first screen."""

from __future__ import annotations

import re

import pytest

from tools.commands.import_map import DOC, END, START, imports, mermaid
from tools.common import ROOT

TEXT = DOC.read_text()


def test_the_import_map_is_the_codes():
    drawn = TEXT.split(START, 1)[1].split(END, 1)[0].strip()
    assert drawn == mermaid(imports()), "the imports changed: python -m tools.commands.import_map --write"


def test_every_file_it_names_exists():
    named = set(re.findall(r"`((?:evolrl|tests|tools|docs|configs)/[\w/.]*)`", TEXT))
    assert len(named) > 30
    assert sorted(p for p in named if not (ROOT / p).exists()) == []


def step_rows() -> list[tuple[str, list[str], list[str]]]:
    """The step table's rows: its number, the files and the names."""
    table = TEXT.split("## One training step, file by file", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table.splitlines()]
    return [(r[0], re.findall(r"`([^`]+)`", r[2]), re.findall(r"`([^`]+)`", r[3]))
            for r in rows if len(r) == 4 and r[0].isdigit()]


def defines(text: str, name: str) -> bool:
    """Whether ``text`` (a module's source) defines ``name`` at its top (a class, a function or an assignment)."""
    return re.search(rf"^(class|def) {name}\b|^{name}\b\s*[:=]", text, re.M) is not None


def member_of(text: str, owner: str, member: str) -> bool:
    """Whether class ``owner`` in ``text`` defines ``member`` (a method, a property, a field, an assigned name)."""
    body = re.split(rf"^class {owner}\b", text, maxsplit=1, flags=re.M)
    if len(body) < 2:
        return False
    body = re.split(r"^\S", body[1].split("\n", 1)[-1], maxsplit=1, flags=re.M)[0]  # to the next top-level line
    return re.search(rf"^    (def {member}\b|{member}\b\s*[:=]|.*\b{member} = )", body, re.M) is not None


@pytest.mark.parametrize("row", step_rows(), ids=lambda row: row[0])
def test_each_name_in_the_step_table_is_defined_in_its_row(row):
    _, files, names = row
    sources = [(ROOT / f).read_text() for f in files]
    for name in names:
        owner, _, member = name.rpartition(".")
        found = any(member_of(s, owner, member) if owner else defines(s, name) for s in sources)
        assert found, f"{name} is in none of {files}"


def test_the_readme_links_it_before_the_set_up():
    first_screen = (ROOT / "README.md").read_text().split("\n## Set-up", 1)[0]
    assert "(docs/architecture.md)" in first_screen
