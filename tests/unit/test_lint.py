"""The linter is part of the tests: `ruff check` (rules in pyproject.toml) passes on the whole tree, and
`ruff format --check` finds nothing to rewrite (run `ruff format src tests scripts` before committing)."""

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def ruff(*args: str) -> subprocess.CompletedProcess:
    try:
        from ruff.__main__ import find_ruff_bin
    except ImportError:
        pytest.fail("ruff is not installed: pip install -e '.[test]'")
    return subprocess.run(
        [find_ruff_bin(), *args, "src", "tests", "scripts"], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_ruff_finds_nothing():
    proc = ruff("check")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_ruff_format_rewrites_nothing():
    proc = ruff("format", "--check")
    assert proc.returncode == 0, "run `ruff format src tests scripts`:\n" + proc.stdout[-6000:] + proc.stderr[-2000:]


def test_paths_named_by_shell_scripts_exist():
    """A file moved in the tree must not leave a shell script pointing at its old place: CI's install
    scripts run nowhere else, so a stale path there fails CI only (stop 45 moved the test helpers)."""
    import re

    scripts = [REPO / ".ci" / "run", *sorted((REPO / "scripts").rglob("*.sh"))]
    pattern = re.compile(r"(?<![\w.-])((?:tests|scripts|src)(?:/[\w.-]+)+)")
    missing = []
    for script in scripts:
        for line_no, line in enumerate(script.read_text().splitlines(), 1):
            for path in pattern.findall(line):
                path = path.rstrip(".")
                if path.endswith("_"):  # a name's prefix in prose, e.g. scripts/install_*.sh
                    continue
                if not (REPO / path).exists():
                    missing.append(f"{script.relative_to(REPO)}:{line_no}: {path}")
    assert not missing, "paths named in shell scripts that do not exist:\n" + "\n".join(missing)
