"""The operating system's refusals, for real: eaglekit as a subprocess, a prompts file any user may
read, and a small disk (a tmpfs in a user and mount namespace of its own) for tests/*/test_errors_os.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "src"), os.environ.get("PYTHONPATH", "")]),
}


EAGLEKIT = [sys.executable, "-m", "eaglekit"]


def unshare_works(*flags: str) -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", *flags, "true"], capture_output=True).returncode == 0


def in_small_disk(script: str, mount: Path) -> None:
    """Run a shell script with a tmpfs mounted at `mount` (a mount namespace of its own)."""
    if not unshare_works("-rm"):
        pytest.skip("no user and mount namespace to mount a small disk in")
    mount.mkdir(parents=True, exist_ok=True)
    subprocess.run(["unshare", "-rm", "sh", "-c", script], check=True, env=ENV, timeout=240)


def prompts_file(folder: Path, n: int = 3) -> Path:
    path = folder / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "turns": [f"Say {i} things."]}) + "\n" for i in range(n)))
    path.chmod(0o644)
    return path
