"""The README's annotated tree of src/eaglekit names every module where it lives, and no module that is gone."""

import re
from pathlib import Path

import eaglekit

PACKAGE = Path(eaglekit.__file__).parent
README = PACKAGE.parents[1] / "README.md"


def listed_modules() -> set[str]:
    """`pkg/file.py` for every file the tree's lines name (`  pkg/` opens a package, `    a.py, b.py  ...` lists)."""
    text = README.read_text()
    block = text[text.index("src/eaglekit/\n") :]
    block = block[: block.index("```")]
    found, package = set(), ""
    for line in block.splitlines()[1:]:
        if m := re.match(r"^  (\w+)/", line):
            package = m[1] + "/"
            continue
        if m := re.match(r"^( +)([\w.]+\.py(?:, [\w.]+\.py)*)", line):
            top = len(m[1]) == 2  # a top-level module (2 spaces)
            found |= {("" if top else package) + name for name in m[2].split(", ")}
    return found


def test_the_readme_tree_lists_every_module():
    modules = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    listed = listed_modules() - {"__init__.py"}
    assert modules - listed == set(), "add these to the README's tree (Layout)"
    assert listed - modules == set(), "these are gone: take them out of the README's tree"
