"""The linter is part of the tests: `ruff check` (rules in pyproject.toml) passes on the whole tree."""

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing():
    try:
        from ruff.__main__ import find_ruff_bin
    except ImportError:
        pytest.fail("ruff is not installed: pip install -e '.[test]'")
    proc = subprocess.run([find_ruff_bin(), "check", "src", "tests", "scripts"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
